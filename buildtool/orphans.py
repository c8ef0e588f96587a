"""Orphans: commands a killed buildtool left running, found and killed by the next build.

Every command runs in its own session (a console-pool one in its own process group of
buildtool's session), so a buildtool killed by ``kill -9`` cannot take its children with
it; they keep running and may still be writing outputs.  The build holding the workspace
lock therefore records each command's process group id and the window of boot-clock ticks
in which it was started (read from the clock around the spawn: reading /proc/PID/stat of a
child that is still in its exec blocks for ~0.5 ms, on the path of every command) in
``.buildtool/children`` (one line per spawn, appended).  The next build, once it holds the
lock, SIGKILLs every recorded group that is still alive — checking that its leader's start
time (/proc) lies in the recorded window, so a recycled pid is never hit — and waits
(bounded) until none of their processes can run any more, before it touches a single output.

A pid is known only once the child exists, and recording it may first wait milliseconds for
the GIL: a kill in between leaves a command nobody recorded.  Such a command is still found
(``_lane_leaders``): its ``TMPDIR`` is its build's lane directory,
``<state>/tmp/<buildtool pid>-<lane>`` (``lane_dir``), its stdout or stderr that lane's
capture (a memory file named, before the command starts, in the lane's marker file
``<lane dir>.capture``; or, where there are no memory files, the file
``<lane dir>.capture.out``/``.err``), it leads its own session and it started after the
build did (the header's ``since``); the next build kills those groups too.

A cleanly ending build (success, failure, Ctrl-C) has already killed its children and
removes the file.
Spec: docs/formats.md#children--buildtoolchildren-orphanspy, docs/reliability.md
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from buildtool.workspace import open_regular, remove_if_not_a_file

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

HEADER_PREFIX = "# buildtool children v2 pid="
MARK_PREFIX = b"capture v1"  # a lane's marker: "capture v1 <dev> <ino> <dev> <ino>" (stdout, stderr)
MARK_SIZE = 128  # rewritten in place, padded with spaces; all spaces: no command on the lane
OUTS_SUFFIX = ".outs"  # "<lane>.capture.outs": the outputs of the command running on the lane (Tracker.writing)
V1_PREFIX = "# buildtool children v1 pid="  # "<pgid> <start>": still read (a killed older build)
WAIT_S = 5.0
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _path(state_dir: str) -> str:
    return os.path.join(state_dir, "children")


def left_by_a_killed_build(state_dir: str) -> bool:
    """Is there a children list, which a build deletes as it ends: one was killed here
    (``reap`` then ends what it left running)?"""
    return os.path.lexists(_path(state_dir))


def being_written_when_killed(state_dir: str) -> list[str]:
    """What the commands of a build killed here were writing (``Tracker.writing``), read
    without changing anything (a dry run, ``explain``: the next real build reaps); none when
    there is no list or its holder still runs."""
    try:
        with open_regular(_path(state_dir)) as f:
            header = f.read(4096).split(b"\n")[0].decode("utf-8", "replace")
    except OSError:
        return []
    if not header.startswith(HEADER_PREFIX):
        return []
    holder, _, since = header[len(HEADER_PREFIX):].partition(" since=")
    if not (holder.isdigit() and since.isdigit()):
        return []
    live = _stat_of(holder)
    if live is not None and live[2] <= int(since) + 1:
        return []  # (its build still runs)
    return _being_written(state_dir, int(holder))


def _spare_path(state_dir: str) -> str | None:
    """Where a copy of the list's header (``pid=... since=...``) is kept outside the
    workspace, beside the second lock (``/tmp/buildtool-<uid>/<dev>-<ino>.children``): a
    ``kill -9`` followed by ``rm -rf .buildtool`` or ``git clean -ffdx`` (a cancelled CI job,
    then the checkout step) takes the list with the state, and the orphans went on writing
    into the next build's outputs.  None where there is no such place."""
    from buildtool.lock import second_lock_path

    lock = second_lock_path(os.path.dirname(os.path.abspath(state_dir)))
    return None if lock is None else lock.removesuffix(".lock") + ".children"


def _lanes_of(state_dir: str, pid: int) -> str:
    return os.path.join(state_dir, "tmp", f"{pid}-")


def lane_dir(state_dir: str, pid: int, lane: int) -> str:
    """TMPDIR and HOME of the commands buildtool ``pid`` runs on worker lane ``lane``."""
    return f"{_lanes_of(state_dir, pid)}{lane}"


def capture_of(lane: str) -> str:
    """The path of lane directory ``lane``'s capture marker, and the prefix of the files
    that capture the output of the commands run in lane
    directory ``lane`` (the executor appends ``.out`` and ``.err``)."""
    return f"{lane}.capture"


def _lane_files(state_dir: str, holder: int) -> list[tuple[str, str]]:
    """(path, what follows the lane's number: ``.capture``, ``.capture.out``, ...) of the
    files beside ``holder``'s lane directories in the state's ``tmp/``."""
    lanes = _lanes_of(state_dir, holder)
    tmp, head = os.path.dirname(lanes), os.path.basename(lanes)
    try:
        names = os.listdir(tmp)
    except OSError:
        return []
    out = []
    for name in names:
        lane, dot, rest = name.removeprefix(head).partition(".")
        if name.startswith(head) and lane.isdigit() and dot:
            out.append((os.path.join(tmp, name), dot + rest))
    return out


def _capture_files(state_dir: str, holder: int) -> set[tuple[int, int]]:
    """(device, inode) of what captured the output of the commands ``holder``'s lanes were
    running: the memory files their markers (``<lane>.capture``) name, and the files
    ``<lane>.capture.out`` and ``.err`` (where there were no memory files)."""
    marker = capture_of("")
    suffixes = (marker + ".out", marker + ".err")
    out: set[tuple[int, int]] = set()
    for path, kind in _lane_files(state_dir, holder):
        if kind == marker:
            out |= _marked(path)
        elif kind in suffixes:
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.add((st.st_dev, st.st_ino))
    return out


def _being_written(state_dir: str, holder: int) -> list[str]:
    """The outputs ``holder``'s lanes named as being written when it died (``Tracker.writing``)."""
    kind = capture_of("") + OUTS_SUFFIX
    out: list[str] = []
    for path, k in _lane_files(state_dir, holder):
        if k == kind:
            try:
                with open_regular(path) as f:
                    data = f.read(1 << 24)
            except OSError:
                continue
            out.extend(p for p in data.decode("utf-8", "surrogateescape").split("\0") if p)
    return out


def _marked(path: str) -> set[tuple[int, int]]:
    """The (device, inode) pairs a lane's marker file names (none: no command was running
    on the lane, or the file is not a marker)."""
    try:
        with open(path, "rb") as f:
            fields = f.read(MARK_SIZE).split()
    except OSError:
        return set()
    head = MARK_PREFIX.split()
    if fields[: len(head)] != head or len(fields) != len(head) + 4:
        return set()
    try:
        dev1, ino1, dev2, ino2 = (int(x) for x in fields[len(head) :])
    except ValueError:
        return set()
    return {(dev1, ino1), (dev2, ino2)}


def _writes_to(pid: str, files: set[tuple[int, int]]) -> bool:
    """Whether the process's stdout or stderr is one of ``files``: what a command gets (a
    shell that redirects one of them for itself keeps the other), and what a daemon it
    started gives up for its own log."""
    for fd in (1, 2):
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in files:
            return True
    return False


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:  # a raw descriptor: this runs once per command started
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    try:
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def boot_clock() -> float | None:
    """Seconds since boot on the clock of /proc/PID/stat's start times (CLOCK_BOOTTIME)."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return None


class Tracker:
    """Appends ``<pgid> <first tick> <last tick>`` for every command this build starts."""

    _FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK  # (a pipe: ENXIO)

    def __init__(self, state_dir: str) -> None:
        self.path = _path(state_dir)
        self._fd: int | None = None
        self._lines: list[bytes] = []  # what the file holds: written again if it is deleted
        self._mu = threading.Lock()  # spawns come from the scheduler's thread and worker threads
        self._marks: dict[str, int] = {}  # a lane's capture prefix -> its marker file, open
        self._sizes: dict[str, int] = {}  # an exact record's file -> the length it holds
        self._spare = _spare_path(state_dir)
        try:
            fd = os.open(self.path, self._FLAGS, 0o644)
            booted = boot_clock()
            since = f" since={int(booted * _TICKS) - 1}" if booted is not None else ""  # before any spawn
            self._lines.append(f"{HEADER_PREFIX}{os.getpid()}{since}\n".encode())
            os.write(fd, self._lines[0])
            self._fd = fd
        except OSError:
            pass  # no tracking: the next build cannot reap, but nothing else changes
        if self._fd is not None and self._spare is not None:
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
                spare = os.open(self._spare, flags, 0o600)
                try:
                    os.write(spare, self._lines[0])
                finally:
                    os.close(spare)
            except OSError:
                self._spare = None

    def add(self, pgid: int, started_after: float | None = None) -> None:
        """``pgid`` was started after ``started_after`` (``boot_clock()`` read before the
        spawn) and before now; without it, its start time is read from /proc."""
        if self._fd is None:
            return
        now = boot_clock() if started_after is not None else None
        if started_after is not None and now is not None:
            # The kernel truncates to ticks; one tick of slack on each side.
            lo, hi = int(started_after * _TICKS) - 1, int(now * _TICKS) + 1
        else:
            lo = hi = start_time(pgid) or 0
        line = f"{pgid} {lo} {hi}\n".encode()
        with self._mu, contextlib.suppress(OSError):
            if self._fd is None:  # (closed meanwhile)
                return
            self._lines.append(line)
            if os.fstat(self._fd).st_nlink == 0:
                self._write_again()
            else:
                os.write(self._fd, line)

    def capturing(self, lane: str, out_fd: int, err_fd: int) -> None:
        """A command is about to start on the lane whose capture prefix is ``lane``
        (``capture_of``), its stdout and stderr the memory files ``out_fd`` and ``err_fd``:
        named in the lane's marker file before the child exists, so that a kill before its
        pid is recorded still leaves it findable (``_lane_leaders``).  Best effort."""
        if self._fd is None:
            return
        try:
            a, b = os.fstat(out_fd), os.fstat(err_fd)
        except OSError:
            return
        self._mark(lane, b"%s %d %d %d %d" % (MARK_PREFIX, a.st_dev, a.st_ino, b.st_dev, b.st_ino))

    def writing(self, lane: str, outs: Sequence[str]) -> None:
        """The outputs the command about to start on ``lane`` writes, in ``<lane>.outs``
        (NUL-separated, emptied when it ends): a ``kill -9`` of buildtool leaves them half
        written (the next build's ``reap`` kills the command), and that build deletes them
        (``reap``'s ``cut_short``) rather than take them for files a user edited."""
        if self._fd is not None and outs:
            self._mark(lane + OUTS_SUFFIX, "\0".join(outs).encode("utf-8", "surrogateescape"), exact=True)

    def captured(self, lane: str) -> None:
        """The command on ``lane`` has ended: its marker names nothing (a daemon it started
        that still holds its output files is left alone, as a cleanly ending build leaves it)."""
        if lane in self._marks:
            self._mark(lane, b"")
        if lane + OUTS_SUFFIX in self._marks:
            self._mark(lane + OUTS_SUFFIX, b"", exact=True)

    def _mark(self, lane: str, record: bytes, exact: bool = False) -> None:
        with self._mu, contextlib.suppress(OSError):  # (under the lock: close() may not free fd meanwhile)
            if self._fd is None:  # (closed meanwhile)
                return
            fd = self._marks.get(lane)
            if fd is None:  # (never through a link: a record is written at its start)
                fd = os.open(lane, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
                self._marks[lane] = fd
                self._sizes[lane] = -1  # (what it held before: unknown)
            if exact:  # (its length is the record's: ended by truncation, not padding)
                held, self._sizes[lane] = self._sizes.get(lane, -1), -1  # (unknown until both calls succeed)
                if record:
                    os.pwrite(fd, record, 0)
                if held != 0:  # (over an empty file, a record needs no truncation and an empty one
                    os.ftruncate(fd, len(record))  # nothing: one call a command each way)
                self._sizes[lane] = len(record)
            else:
                os.pwrite(fd, record.ljust(MARK_SIZE), 0)

    def _write_again(self) -> None:
        """The file was deleted under the build (``rm -rf .buildtool``, ``git clean -xfd``):
        lines appended to it went nowhere the next build looks, and a kill -9 then left
        orphans writing beside that build.  Written again whole, at its path."""
        assert self._fd is not None
        marks, self._marks = self._marks, {}  # gone with it: opened again at their paths
        for mark in marks.values():
            with contextlib.suppress(OSError):
                os.close(mark)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, self._FLAGS, 0o644)
        os.close(self._fd)
        self._fd = fd
        os.write(fd, b"".join(self._lines))

    def close(self) -> None:
        """Every child is dead or killed: forget them."""
        with self._mu:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
            marks, self._marks = self._marks, {}
        for fd in marks.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        if self._spare is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._spare)


def _stat_of(pid: str) -> tuple[int, int, int] | None:
    """(process group, session, start time in ticks) of a live (not zombie) process; None
    when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2 :].split()
        return None if fields[0] in (b"Z", b"X") else (int(fields[2]), int(fields[3]), int(fields[19]))
    except (OSError, ValueError, IndexError):
        return None


def live_groups(pgids: set[int] | dict[int, float]) -> set[int] | None:
    """Which of these process groups still have a live (not zombie) process; None when
    /proc cannot be read."""
    out: set[int] = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if name.isdigit():
            got = _stat_of(name)
            if got is not None and got[0] in pgids:
                out.add(got[0])
    return out


def sweep_sessions(sids: set[int], own: Iterable[int] = ()) -> int:
    """SIGKILL what is left in the sessions ``sids`` led by commands this build started and
    reaped: processes a command moved into a process group of their own (bash's ``set -m``,
    ``Popen(process_group=0)``), which the kill of the command's group missed (that
    group, whose id is the session's, is left to it: its members get their grace).  Called
    when a command killed by a timeout or Ctrl-C is reaped, and at the end of the build for
    those never reaped; a command that ends normally leaves them running, as it leaves a
    daemon (reading every process's stat costs ~17 us each: a few ms of every build
    otherwise).  A session
    whose id is again a live process's pid is somebody else's now (a reaped leader's pid
    taken by a new session; while any process is in a session, its id is not reused), and
    is left alone, unless the build has yet to reap it (``own``: killed, not waited for).
    One pass over /proc; the number of processes killed."""
    if not sids:
        return 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    found: list[tuple[int, int]] = []
    leaders: set[int] = set()
    for name in names:
        if name.isdigit():
            got = _stat_of(name)
            if got is not None and got[1] in sids:
                pid = int(name)
                if pid == got[1]:
                    leaders.add(pid)
                elif got[0] != got[1]:  # (the command's own group is its kill's, with its grace period)
                    found.append((pid, got[1]))
    leaders.difference_update(own)
    killed = 0
    for pid, sid in found:
        if sid not in leaders:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def _lane_leaders(state_dir: str, holder: int, since: int, lost: bool = False) -> set[int]:
    """Pids of live processes that lead their own session (as every command a build starts
    outside the console pool does), were started at or after tick ``since``, and whose
    environment has ``BUILDTOOL_LANE`` (or ``TMPDIR``, ``HOME``) in one of ``holder``'s lane
    directories and whose stdout or stderr is what one of those lanes was capturing into
    (``_capture_files``): the commands that build started, recorded or not. The start time
    excludes a process that an earlier build with the same pid left running; the session
    rule, a console-pool command, which leads a process group in the session of whoever
    started buildtool (recorded all the same); the capture rule, a daemon a command started
    (it inherits TMPDIR, leads a session of its own and would have outlived a build that
    ended cleanly). (A command whose pid went unrecorded and whose own process has exited,
    leaving children, is not found.) Only this user's processes can be read, and that is all
    a build starts. ``lost``: the state directory went with its lane markers (the list's
    spare copy named ``holder``): no capture rule, so such a daemon goes too."""
    lanes = _lanes_of(state_dir, holder)
    # (BUILDTOOL_LANE, which every command gets; TMPDIR or HOME: a build of an older buildtool's)
    # (the environment holds the path's bytes: a non-UTF-8 workspace path is no str.encode())
    needles = [b"\0" + v.encode() + b"=" + os.fsencode(lanes) for v in ("BUILDTOOL_LANE", "TMPDIR", "HOME")]
    out: set[int] = set()
    captures = _capture_files(state_dir, holder)
    try:
        names = os.listdir("/proc") if captures or lost else []
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = b"\0" + f.read()
        except OSError:
            continue
        if not any(_in_a_lane(env, needle) for needle in needles):
            continue
        got = _stat_of(name)
        if got is not None and got[0] == got[1] == int(name) and got[2] >= since \
                and (lost or _writes_to(name, captures)):
            out.add(got[0])
    return out


def _in_a_lane(env: bytes, needle: bytes) -> bool:
    """Does ``env`` (NUL-separated, a NUL first) set the variable of ``needle`` to a lane
    directory (the needle's prefix, then the lane's number)?"""
    at = env.find(needle)
    if at < 0:
        return False
    end = env.find(b"\0", at + 1)
    return env[at + len(needle) : end if end >= 0 else None].isdigit()


def reap(
    state_dir: str, warn: Callable[[str], None], wait_s: float = WAIT_S, cut_short: list[str] | None = None,
) -> int:
    """Kill what the previous holder of the lock left running; the number of groups killed.
    Call only while holding the workspace lock.  Where the list is gone or damaged, its
    spare copy outside the workspace (``_spare_path``) still names the killed build: its
    commands are found by their lane directories alone (``_lane_leaders``).  ``cut_short``:
    filled with the outputs (workspace-relative) of the commands the killed build was
    running (``Tracker.writing``), whatever they left: half-written files to delete."""
    path, spare = _path(state_dir), _spare_path(state_dir)
    try:
        killed = _reap(state_dir, path, _spare_header(spare), warn, wait_s, cut_short)
    finally:
        if spare is not None:
            with contextlib.suppress(OSError):
                os.unlink(spare)
    return killed


def _spare_header(spare: str | None) -> bytes | None:
    """The header line the spare copy holds (None: none, or not a header)."""
    if spare is None:
        return None
    try:
        with open_regular(spare) as f:
            line = f.read(4096).split(b"\n")[0]
    except OSError:
        return None
    return line if line.startswith(HEADER_PREFIX.encode()) else None


def _reap(
    state_dir: str, path: str, spare: bytes | None, warn: Callable[[str], None], wait_s: float,
    cut_short: list[str] | None,
) -> int:
    lost = False  # the list is gone (or unreadable): the spare copy's header stands in for it
    there = True  # (a file there, but no list in it: said so, not "went with the state directory")
    try:
        with open_regular(path) as f:  # (a named pipe there: not a wait for a writer)
            lines = f.read().splitlines()
    except FileNotFoundError:
        lines, there = [], False
    except OSError as e:
        if spare is None:
            warn(f"cannot read {path} ({e.strerror}); commands of a killed build may still be running")
        remove_if_not_a_file(path)  # (a directory, a named pipe: the Tracker could never write it)
        if os.path.isfile(path) and not os.path.islink(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
        lines = []
    header = lines[0].decode("utf-8", "replace") if lines else ""
    prefix = next((p for p in (HEADER_PREFIX, V1_PREFIX) if header.startswith(p)), None)
    if prefix is None:
        if lines and spare is None:
            warn(f"{path} has an unknown format; discarding it")
        with contextlib.suppress(OSError):
            os.unlink(path)
        if spare is None:
            return 0
        lines, lost, prefix = [spare], True, HEADER_PREFIX
        header = spare.decode("utf-8", "replace")
    holder, _, since = header[len(prefix) :].partition(" since=")
    # (_stat_of: a killed build left a zombie, its parent gone and pid 1 slow to reap it,
    # was taken for a running one: the list was dropped and its commands survived)
    if holder.isdigit() and since.isdigit() and (live := _stat_of(holder)) is not None \
            and live[2] <= int(since) + 1:
        # The build that wrote the file still runs, started before its first command: the
        # file came with a copy of a running workspace's state (``cp -a`` during a watch).
        # Those commands are that build's own, not orphans.  (A recycled pid started later.)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return 0
    fields = 3 if prefix == HEADER_PREFIX else 2
    targets: set[int] = set()
    for ln in lines[1:]:
        try:
            parts = [int(x) for x in ln.split()]
        except ValueError:
            continue  # a torn last line
        if len(parts) != fields:
            continue
        pgid, lo, hi = parts[0], parts[1], parts[-1]
        if pgid <= 1:
            continue
        now = start_time(pgid)
        if now is not None and lo and not lo <= now <= hi:
            continue  # the leader's pid was recycled: its group is long gone
        targets.add(pgid)
    if holder.isdigit() and since.isdigit():  # (a header without it: an older buildtool's)
        targets |= _lane_leaders(state_dir, int(holder), int(since), lost)
    if cut_short is not None and holder.isdigit():
        cut_short.extend(_being_written(state_dir, int(holder)))
    killed = 0
    for pgid in targets:
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    if killed:
        how = "was damaged" if there else "went with the state directory"
        gone = f" (its list of them {how}: found by their BUILDTOOL_LANE)" if lost else ""
        warn(f"killed {killed} command(s) left running by a previous buildtool (pid {holder}) that did not exit "
             f"cleanly{gone}; their targets will run again")
        deadline = time.monotonic() + wait_s
        while live_groups(targets) and time.monotonic() < deadline:
            time.sleep(0.02)
    with contextlib.suppress(OSError):
        os.unlink(path)
    return killed
