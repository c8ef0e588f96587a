"""Executor: runs one action's command as a subprocess in its own process group.

The child gets exactly the environment it is given (plus a fresh per-action TMPDIR and
HOME), ``/bin/sh -e -c`` (``bash -e -o pipefail`` when the command has a pipe and
``/bin/sh`` cannot do pipefail), stdin from /dev/null and stdout/stderr captured in memory
files of its own (not for the ``console`` pool, whose commands keep the terminal).  ``run`` blocks
until the command ends (a worker thread); ``start`` returns a ``Running`` whose pidfd an
event loop can watch (the scheduler's own thread).  ``cancel_all`` terminates every running
process group (SIGTERM, then SIGKILL after a grace period).  The cache layer in front of it
lives in runner.py.

A simple command (simplecmd.py) that runs in this process's working directory starts
through ``os.posix_spawn`` (glibc's vfork-like clone), the others through
``subprocess.Popen``; both give the child the same descriptors, signal dispositions,
session and environment (docs/architecture.md#spawning).
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import threading
import time
import weakref

from buildtool.orphans import boot_clock, live_groups, sweep_sessions

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Iterable, Sequence

    from buildtool.orphans import Tracker
    from buildtool.simplecmd import SimpleCommand
    from buildtool.staging import Stage

MAX_ARG = 100_000  # longer commands go through a script file (MAX_ARG_STRLEN is 128 KiB)


def arg_size(s: str) -> int:
    """The bytes ``s`` takes as an argument (the kernel's limit counts bytes: 45,000 "€" are
    135,000 of them)."""
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogateescape"))
KILL_GRACE_S = 2.0

PYRULE_MAIN = (
    "import sys\n"
    # -c puts the working directory (the package) first on sys.path: its modules would
    # shadow the workspace root's (PYTHONPATH) that the key tracks, and the stdlib's.
    "if sys.path and sys.path[0] == '':\n    del sys.path[0]\n"
    # The runner's own imports come from the standard library: a workspace json.py or
    # types.py (the root is on PYTHONPATH) broke every pyrule, imported or not.
    "import os\n"
    "p = sys.path[:]\n"
    "w = {os.path.abspath(e) for e in os.environ.get('PYTHONPATH', '').split(os.pathsep) if e}\n"
    "sys.path[:] = [e for e in p if e not in w]\n"
    "import importlib, json\n"
    "sys.path[:] = p\n"
    "mod, _, fn = sys.argv[1].partition(':')\n"
    # srcs, outs and kwargs as JSON texts: three arguments, or one '@FILE' holding the three
    # when they are too long for the command line (the runner's choice, MAX_ARG)
    "a = sys.argv[2:] if len(sys.argv) > 3 else json.load(open(sys.argv[2][1:], encoding='utf-8'))\n"
    "m = os.environ.get('BUILDTOOL_PYRULE_MODULES')\n"
    # The files it opens to read (a template beside the generator), for the runner to compare
    # with its srcs: an audit hook, so open() of any kind (io, pathlib) is seen.  Advisory.
    # Those it also opened to write (a scratch file it reads back) are no inputs.
    "rd, wr, on = set(), set(), [True]\n"
    "def h(ev, x):\n"
    "    if ev == 'open' and on[0] and isinstance(x[0], str) and isinstance(x[1], str):\n"
    "        (wr if set(x[1]) & set('wax+') else rd).add(os.path.abspath(x[0]))\n"
    "if m:\n"
    "    sys.addaudithook(h)\n"
    # A module missing here is said with the interpreter that looked for it (buildtool's own,
    # not the project's venv); a value returned while outputs are missing, as a likely cause.
    # (Not for a name of the workspace's own: a typo there is no package to install.)
    "o, d = json.loads(a[1]), os.getcwd()\n"
    "try:\n"
    "    v = getattr(importlib.import_module(mod), fn)(srcs=json.loads(a[0]), outs=o, **json.loads(a[2]))\n"
    "except ModuleNotFoundError as e:\n"
    "    t = (e.name or '').partition('.')[0]\n"
    "    if t and not any(os.path.exists(os.path.join(x, t)) or os.path.exists(os.path.join(x, t + '.py'))\n"
    "                     for x in w):\n"
    "        sys.stderr.write(f'buildtool: a pyrule runs under {sys.executable}, which has no module {e.name!r} '\n"
    "                         '(nor has the workspace): install it there, or run your own python in a genrule\\n')\n"
    "    raise\n"
    "on[0] = False\n"
    "if v is not None and not all(os.path.exists(os.path.join(d, x)) for x in o):\n"
    "    sys.stderr.write(f'buildtool: {sys.argv[1]} returned a value ({type(v).__name__}) and left an output '\n"
    "                     'unwritten: what it returns is dropped; write each path in outs\\n')\n"
    # The workspace modules it imported, for the runner to compare with the ones its key
    # holds (one reached through a sys.path entry the function added is not keyed).  Not
    # those of an environment inside the workspace (a .venv): installed, not sources.  Only
    # plain modules, their __file__ read from their __dict__: a lazy module's proxy would
    # run its import (importlib.util.LazyLoader).  Advisory: no trouble here fails the rule.
    "try:\n"
    "    r = sorted(w)[0] + os.sep if m and w else None\n"
    "    ex = tuple(os.path.abspath(e) + os.sep for e in {sys.prefix, sys.base_prefix, sys.exec_prefix})\n"
    "    fs = {os.path.abspath(x.__dict__.get('__file__') or '') for x in list(sys.modules.values())\n"
    "          if type(x) is type(sys)} if r else ()\n"
    "    def ours(f):  # (a file of the workspace, not of an environment installed in it)\n"
    "        return bool(r) and f.startswith(r) and not f.startswith(ex) \\\n"
    "            and not {'site-packages', 'dist-packages', '__pypackages__'} & set(f.split(os.sep))\n"
    "    fs = sorted(f for f in fs if ours(f) and f.endswith('.py'))\n"
    "    rd = sorted(f for f in set(rd) - wr if ours(f) and not f.endswith(('.py', '.pyc')))\n"
    "    if r:\n"
    "        open(m, 'w', encoding='utf-8', errors='surrogateescape').write(''.join(f + '\\n' for f in fs)\n"
    "                                                                     + ''.join('<' + f + '\\n' for f in rd))\n"
    "except Exception:\n"
    "    pass\n"
)


def pyrule_texts(pkg: str, inputs: Iterable[str], outs: Iterable[str], kwargs_json: str | None) -> list[str]:
    """A pyrule's srcs, outs (relative to its package) and kwargs as the JSON texts
    PYRULE_MAIN takes (here and on a remote worker)."""
    import json

    from buildtool.workspace import pkg_relative

    rel = [pkg_relative(p, pkg) for p in inputs]
    rel_outs = [pkg_relative(p, pkg) for p in outs]
    return [json.dumps(rel), json.dumps(rel_outs), kwargs_json or "{}"]


class ProcessResult:
    """How one command ended, with its captured output."""

    __slots__ = ("duration", "exit_code", "interrupted", "stderr", "stdout", "timed_out")

    def __init__(
        self, exit_code: int, stdout: bytes, stderr: bytes, timed_out: bool, duration: float,
        interrupted: bool = False,
    ) -> None:
        self.exit_code = exit_code  # negative: killed by that signal
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.duration = duration
        # Sent SIGTERM by cancel_all (Ctrl-C, SIGTERM, a watch cycle cancelled) while it ran:
        # cut short, whatever its exit status says (a trap that exits 0 left half its work).
        self.interrupted = interrupted


class Running:
    """A started command: wait for it here (``wait``), or let an event loop watch its
    ``pidfd`` and call ``expire`` at its ``deadline`` and ``finish`` once it exited."""

    __slots__ = ("_capture", "_err_fd", "_executor", "_on_disk", "_out_fd", "deadline", "proc", "start", "timed_out")

    def __init__(
        self,
        executor: SubprocessExecutor,
        proc: Child | None,
        out_fd: int | None,
        err_fd: int | None,
        start: float,
        deadline: float | None,
        capture: str | None = None,
        on_disk: bool = False,
    ) -> None:
        self._executor = executor
        self._capture = capture  # captured: it leads a session of its own (else only a process group)
        self._on_disk = on_disk  # captured in files at ``capture``.out/.err (no memfds here)
        self.proc = proc  # None: cancelled before it started
        self._out_fd = out_fd
        self._err_fd = err_fd
        self.start = start
        self.deadline = deadline  # time.monotonic() value, or None
        self.timed_out = False

    def pidfd(self) -> int | None:
        """A new file descriptor that polls readable once the process has exited (Linux
        pidfd_open); None when it already ended or the system has no pidfds."""
        if self.proc is None:
            return None
        try:
            return os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            return None

    def expire(self) -> None:
        """The deadline passed: kill the command (it ends as timed out)."""
        if self.proc is not None and not self.timed_out:
            self.timed_out = True
            self.deadline = None
            self._executor._kill(self.proc)

    def wait(self) -> ProcessResult:
        """Block until the command ends (killing it at its deadline), then ``finish``."""
        if self.proc is not None:
            try:
                if self.deadline is not None and not self.proc.ended_by(self.deadline):
                    self.expire()
                _exited(self.proc.pid)
            except BaseException:  # not waited for: nothing may outlive the build (kill_remaining
                self._executor._kill(self.proc, interrupt=True)  # no longer sees a released one)
                self._release()
                raise
        return self.finish()

    def finish(self, ended: float | None = None) -> ProcessResult:
        """Reap the ended process, read what it printed, free its files.  ``ended``: when
        it was seen to have exited (time.monotonic), if that was before this call."""
        proc = self.proc
        if proc is None:
            return ProcessResult(-signal.SIGTERM, b"", b"cancelled before start\n", False, 0.0, True)
        try:
            if proc.returncode is None:
                with self._executor._lock:
                    in_grace = proc.pid in self._executor._terminated
                if not in_grace:  # (sent SIGTERM, by a timeout or Ctrl-C: its grace period runs on)
                    # What it left running in its group (`cmd &`) ends with it, as in Bazel: a
                    # background writer would go on into the lane's TMPDIR, used by the next
                    # command.  Before the reaping, while the group's id (its pid) cannot be
                    # anybody else's.  (A daemon in a session of its own is left.)
                    _killpg(proc.pid, signal.SIGKILL)
            proc.wait()  # reaps it; returns at once when it has exited
            with self._executor._lock:
                # A timeout: its session swept now (a test's server in a group of its own
                # goes too, before a retry).  Ctrl-C (cancel_all) of a build whose owner calls
                # kill_remaining at its end (sweep_at_end): left to that one pass over /proc
                # for all of them (a pass per command made stopping 500 of them take 4 s, and
                # grow with every process on the machine).  A remote worker's lease: now.
                killed = proc.pid in self._executor._killed and not (
                    self._executor.cancelled and self._executor.sweep_at_end)
                if killed:
                    self._executor._killed.discard(proc.pid)
            if killed:
                sweep_sessions({proc.pid})
            out = _read_all(self._out_fd) if self._out_fd is not None else b""
            err = _read_all(self._err_fd) if self._err_fd is not None else b""
        finally:
            self._release()
        end = ended if ended is not None else time.monotonic()
        with self._executor._lock:
            interrupted = proc.pid in self._executor._interrupted
            self._executor._interrupted.discard(proc.pid)
        return ProcessResult(proc.returncode, out, err, self.timed_out, end - self.start, interrupted)

    def _release(self) -> None:
        if self.proc is not None:
            with self._executor._lock:
                self._executor._procs.pop(self.proc.pid, None)
        for fd in (self._out_fd, self._err_fd):
            if fd is not None:
                os.close(fd)
        if self._out_fd is not None and self._capture is not None:
            # Whatever still holds them (a daemon it started, a group in its grace period)
            # writes on into these files, unlinked: never into the lane's next command's.
            self._executor._captures_done(self._capture, self._on_disk)
        self._out_fd = self._err_fd = None


def _exited(pid: int) -> None:
    """Block until child ``pid`` has exited, leaving it to be reaped."""
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            return
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped already
            return


def _sh_has_pipefail() -> bool:
    real = os.path.basename(os.path.realpath("/bin/sh"))
    return real in ("bash", "zsh", "ksh", "ksh93", "mksh", "yash", "busybox")


def which(name: str, path: str, base: str = "") -> str | None:
    """The file the shell runs for ``name``: the first executable regular file ``name`` in
    the directories of ``path``, relative ones taken from ``base`` (the command's working
    directory); ``name`` itself when it has a slash.  ``shutil.which`` without importing
    shutil (~4 ms of every build)."""
    if "/" in name:
        return name
    for d in path.split(os.pathsep) if path else ():
        candidate = os.path.join(base, d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


_PIDFDS: list[bool] = []


def pidfds_work() -> bool:
    """Can this process wait for its children through pidfds (Linux >= 5.3)?  Asked once."""
    if not _PIDFDS:
        try:
            os.close(os.pidfd_open(os.getpid()))
            _PIDFDS.append(True)
        except (AttributeError, OSError):
            _PIDFDS.append(False)
    return _PIDFDS[0]


SH_PIPEFAIL = _sh_has_pipefail()
BASH = which("bash", os.environ.get("PATH", os.defpath)) or ""


def shell_for(cmd: str) -> str:
    """The shell that runs ``cmd``: ``sh``, or ``bash`` for a command with a pipe when
    /bin/sh cannot do pipefail.  The name (not the path) is part of the action key."""
    if not SH_PIPEFAIL and BASH and has_pipe(cmd):
        return "bash"
    return "sh"


def has_pipe(cmd: str) -> bool:
    """Whether ``cmd`` may hold a pipeline: a ``|`` that is not ``||`` and not inside
    single quotes or escaped (``sed 's|a|b|'`` has none, and ran under bash, ~1 ms more a
    command, for a pipefail it did not need).  Anything less plain counts as one: a ``|``
    in double quotes, double quotes holding a ``'``, ``$(`` or ``${`` (whose own quoting is
    not followed), a quote left open, and any ``|`` at all in a command with a comment, a
    here-document (whose text is not shell syntax: an apostrophe there opens no quote) or a
    backquote (whose text is read twice, ``\\'`` becoming a plain ``'``)."""
    if "|" not in cmd:
        return False
    if "#" in cmd or "<<" in cmd or "`" in cmd:  # (a backquote's text is read again: its quotes too)
        return True
    import re  # (imported already by the time a command is keyed; here, not at every no-op's start)

    special = re.compile(r"[\\\"'|$`]")  # (re caches it; a 64 KB command went one character at a time: 4 ms)
    i, n, double = 0, len(cmd), False
    while i < n:
        m = special.search(cmd, i)
        if m is None:
            break
        i = m.start()
        c = cmd[i]
        if c == "\\":
            i += 2
            continue
        if double:
            if c == '"':
                double = False
            elif c in "|'`" or (c == "$" and cmd.startswith(("$(", "${"), i)):
                return True  # (a '$(...)' in double quotes has quotes of its own: not followed)
        elif c == '"':
            double = True
        elif c == "'":
            end = cmd.find("'", i + 1)
            if end < 0:
                return True
            i = end + 1
            continue
        elif c == "|":
            if not cmd.startswith("||", i):
                return True
            i += 1
        i += 1  # (outside double quotes a '$' or '`' is nothing here: passed over)
    return False


def shell_argv(shell: str, cmd_or_script: str, is_script: bool) -> list[str]:
    if shell == "bash":
        argv = [BASH, "-e", "-o", "pipefail"]
    else:
        argv = ["/bin/sh", "-e"]
        if SH_PIPEFAIL:
            argv += ["-o", "pipefail"]
    if is_script:
        return [*argv, cmd_or_script]
    return [*argv, "-c", cmd_or_script]


class Spawned:
    """A child started by ``os.posix_spawn``: the part of a Popen that Running uses."""

    __slots__ = ("pid", "returncode")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        """Reap it (blocking); its exit status, or minus the signal that killed it."""
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): as Popen, status 0
                self.returncode = 0
        return self.returncode

    def ended_by(self, deadline: float) -> bool:
        """Wait, without reaping it, until it exits (True) or ``deadline`` (time.monotonic)
        passes (False)."""
        return _ended_by(self.pid, deadline)


def _ended_by(pid: int, deadline: float) -> bool:
    """Wait, without reaping child ``pid``, until it exits (True) or ``deadline``
    (time.monotonic) passes (False): on a pidfd where there are pidfds, else by polling."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds here, out of descriptors...
        return _polled_until(pid, deadline)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            # (in ms, at most an hour at a time: poll() refuses more than 2**31-1 ms)
            if poller.poll(min(3_600_000, int(left * 1000) + 1) if left > 0 else 0):
                return True
            if left <= 0:
                return False
    finally:
        os.close(fd)


def _polled_until(pid: int, deadline: float) -> bool:
    delay = 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(2 * delay, 0.05)


class Popened:
    """A child started by ``subprocess.Popen``, with Spawned's interface."""

    __slots__ = ("_popen", "pid")

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def wait(self) -> int:
        return self._popen.wait()

    def ended_by(self, deadline: float) -> bool:
        return _ended_by(self.pid, deadline)  # (not Popen.wait: that reaps it)


if TYPE_CHECKING:
    Child = Spawned | Popened
# Reset to their defaults in every child, as Popen's restore_signals does: Python ignores them.
_DEFAULT_IN_CHILD = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ", "SIGXFZ") if hasattr(signal, n))
# Blocked in a console-pool command (inherited from the starting thread's mask): it is a
# background job of the terminal, and these would stop it until its timeout when it writes
# under `stty tostop` (then the write goes through) or reads /dev/tty (then the read fails).
_TTY_STOPS = (signal.SIGTTIN, signal.SIGTTOU)
_DEVNULL: list[int] = []
_NO_SETSID: list[bool] = []  # this libc's posix_spawn cannot start a new session


def _devnull() -> int:
    """A read-only descriptor of /dev/null, opened once per process (the children's stdin)."""
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    return _DEVNULL[0]


def _inherited_fds() -> tuple[int, ...]:
    """Descriptors above 2 that a child would inherit (from whoever started buildtool: a
    make jobserver, a CI runner's leak): posix_spawn closes them in the child, as Popen's
    close_fds=True does.  buildtool's own descriptors are all close-on-exec."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return ()
    fds = []
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    fds.append(fd)
            except OSError:
                pass  # the listing's own descriptor, closed by now
    return tuple(sorted(fds))


_LIVE: weakref.WeakSet[SubprocessExecutor] = weakref.WeakSet()  # (kill_everything_now)


def kill_everything_now() -> None:
    """SIGKILL the process group of every command this process's executors started that may
    still run (errors.count_stop_signal's quick exit: without it they ran on as orphans).
    Lock-free, from a signal handler: a thread may hold an executor's lock."""
    for ex in list(_LIVE):
        for pgid in [*list(ex._procs), *list(ex._terminated)]:
            _killpg(pgid, signal.SIGKILL)


class SubprocessExecutor:
    """Starts commands in new sessions (a ``console``-pool one in a new process group of
    buildtool's session: it keeps the terminal) and can kill them all."""

    def __init__(self) -> None:
        self._procs: dict[int, Child] = {}
        self._sessions: set[int] = set()  # the sessions the commands started led (orphans.sweep_sessions)
        self._killed: set[int] = set()  # of those, the ones sent SIGTERM (a timeout, Ctrl-C): swept when reaped
        # Process groups sent SIGTERM whose SIGKILL is still to come (a leader that exits on
        # SIGTERM leaves members that ignore it, and the grace thread dies with the process).
        self._terminated: dict[int, float] = {}  # pgid -> when its grace period ends (monotonic)
        self._interrupted: set[int] = set()  # pids sent SIGTERM by cancel_all (ProcessResult.interrupted)
        # Re-entrant: cancel_all runs in a signal handler on the scheduler's thread, which
        # may be holding it (start, finish) when the signal arrives.
        self._lock = threading.RLock()
        self.cancelled = False
        _LIVE.add(self)
        # The owner calls kill_remaining when the build ends (Session.build): the sessions of
        # commands cut short by cancel_all are swept there, in one pass.
        self.sweep_at_end = False
        # Told the pgid of each command started (each leads a process group) and the boot
        # clock read before it was started, and which memfds capture a command's output
        # while it runs (orphans.py: what the next build kills if this one is killed).
        self.tracker: Tracker | None = None
        # (program, PATH) -> its path, for commands started without a shell: found once,
        # not by a failed exec per PATH entry before it on every start (as sh's hash).
        self._programs: dict[tuple[str, str, str], str | None] = {}
        # For posix_spawn, which cannot change the child's directory: whether a command
        # directory is this process's working directory (memoised per path string), and the
        # descriptors the child must not inherit.  None: posix_spawn is not used.
        self._spawn: tuple[dict[str, bool], tuple[int, ...], tuple[int, int]] | None = None
        self._spawn_checked = False
        # Where the ``>`` file of a command started without a shell is created before it is
        # linked into place (staging.py); None: in place.  Directories whose new files get
        # something from the directory (setgid group, default ACL) are never staged for.
        self.stage: Stage | None = None
        self._inherits: dict[str, bool] = {}

    def run(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        timeout: float | None = None,
        capture: str | None = None,
        direct: SimpleCommand | None = None,
        merge_stderr: bool = False,
    ) -> ProcessResult:
        """Run to completion (``start`` then ``Running.wait``)."""
        return self.start(argv, cwd, env, timeout, capture, direct, merge_stderr).wait()

    def start(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        timeout: float | None = None,
        capture: str | None = None,
        direct: SimpleCommand | None = None,
        merge_stderr: bool = False,
        outs: Sequence[str] = (),
    ) -> Running:
        """Start the command and return at once.  ``capture``: its stdout and stderr go to
        new memory files (``_new_captures``; files at this path prefix where there are
        none), read when it ends: no pipes and no poll loop; None lets the child use the
        terminal (the ``console`` pool), in a process group of its own.  ``direct``: the
        same command as ``argv``'s shell line, started without the shell (simplecmd.py); if
        it cannot be started, ``argv`` runs instead, so the shell reports the problem.
        ``merge_stderr``: a captured command's stderr goes where its stdout goes, one
        stream in the order it was written (a test's log, as ``2>&1``); its stderr capture
        stays empty.  ``outs``: the workspace-relative outputs it writes, named in its lane's
        record while it runs (``orphans.Tracker.writing``).  OSError: the command could not
        be started at all."""
        start = time.monotonic()
        if self.cancelled:
            return Running(self, None, None, None, start, None)
        tracker = self.tracker
        booted = boot_clock() if tracker is not None else None
        out_fd = err_fd = None
        on_disk = False
        if capture is not None:
            out_fd, err_fd, on_disk = _new_captures(capture)
            if tracker is not None:
                if not on_disk:
                    tracker.capturing(capture, out_fd, err_fd)  # before the child exists
                tracker.writing(capture, outs)
        child_err = out_fd if merge_stderr and capture is not None else err_fd
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _TTY_STOPS) if capture is None else None
        try:
            proc = None
            if direct is not None:
                program = self._find_program(direct.argv[0], env.get("PATH", os.defpath), cwd)
                if program is not None:
                    spawn = self._spawn_closing(cwd)
                    proc = _start_direct(
                        direct, program, cwd, env, out_fd, child_err, capture is not None, spawn, self._create
                    )
            if proc is None:
                import subprocess

                proc = Popened(
                    subprocess.Popen(
                        argv,
                        cwd=cwd,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out_fd,
                        stderr=child_err,
                        start_new_session=capture is not None,
                        process_group=None if capture is not None else 0,
                        close_fds=True,
                    )
                )
        except BaseException:
            for fd in (out_fd, err_fd):
                if fd is not None:
                    os.close(fd)
            if capture is not None:
                self._captures_done(capture, on_disk)
            raise
        finally:
            if mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        with self._lock:
            self._procs[proc.pid] = proc
            if capture is not None:  # (a console-pool command is in buildtool's own session)
                self._sessions.add(proc.pid)
        if tracker is not None:
            tracker.add(proc.pid, booted)
        if self.cancelled:
            self._kill(proc, interrupt=True)
        deadline = None if timeout is None else start + timeout
        return Running(self, proc, out_fd, err_fd, start, deadline, capture, on_disk)

    def _captures_done(self, capture: str, on_disk: bool) -> None:
        """A command's captures (``_new_captures``) are closed: its files are unlinked, or
        its lane's marker stops naming its memory files."""
        if on_disk:
            _unlink_capture(capture)
        if self.tracker is not None:
            self.tracker.captured(capture)

    def _spawn_closing(self, cwd: str) -> tuple[int, ...] | None:
        """The descriptors to close in a child started by posix_spawn in ``cwd``; None when
        the child must start through Popen (``cwd`` is not this process's working
        directory, or this system lacks pidfds or posix_spawn)."""
        if not self._spawn_checked:
            self._spawn_checked = True
            if hasattr(os, "posix_spawn") and hasattr(os, "POSIX_SPAWN_DUP2") and pidfds_work():
                try:
                    here = os.stat(".")
                    self._spawn = ({}, _inherited_fds(), (here.st_dev, here.st_ino))
                except OSError:
                    pass
        if self._spawn is None:
            return None
        same, closing, here_id = self._spawn
        ok = same.get(cwd)
        if ok is None:
            try:
                st = os.stat(cwd)
                ok = same[cwd] = (st.st_dev, st.st_ino) == here_id
            except OSError:
                ok = False
        return closing if ok else None

    def _create(self, path: str) -> int:
        """Open ``path`` as sh opens a ``>`` file (created 0666 less the umask, truncated):
        a file that does not exist yet is made in the staging dir and hard-linked into
        place, where the filesystem allocates its inode faster (staging.py)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fd = self._staged(path, flags)
        return fd if fd is not None else os.open(path, flags, 0o666)

    def _staged(self, path: str, flags: int) -> int | None:
        """``path`` made in the staging dir and linked into place, then opened by its own
        name; None when it is to be opened in place (no usable staging dir, an inheriting
        directory, or something already at ``path``: a file, a dangling link...).

        Opened anew by ``path``, not kept open by the staging name: inotify reports a write
        to the directory of the name the descriptor was opened by, and the file monitor
        watches the package, not the staging dir.  A daemon a command left holding its
        stdout changed the output after the build unseen, and the monitor vouched for it."""
        parent = os.path.dirname(path)
        stage = self.stage
        if stage is None or self._dir_inherits(parent) or (where := stage.dir_for(parent)) is None:
            return None
        tmp = stage.new_name(where)
        try:
            os.close(os.open(tmp, flags | os.O_EXCL, 0o666))
        except OSError:
            return None
        try:
            os.link(tmp, path)
        except OSError:
            return None
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        try:
            return os.open(path, flags & ~(os.O_CREAT | os.O_TRUNC))  # (empty: nothing to truncate)
        except OSError:
            return None  # (replaced meanwhile: opened in place, as sh would)

    def _dir_inherits(self, d: str) -> bool:
        """Does a file created in ``d`` take anything from it (the setgid bit's group, a
        default ACL)?  Then it is created in place.  Memoised per path."""
        found = self._inherits.get(d)
        if found is None:
            try:
                found = bool(os.stat(d).st_mode & stat.S_ISGID)
            except OSError:
                return True  # not there (yet): the open in place says what is wrong
            if not found:
                try:
                    os.getxattr(d, "system.posix_acl_default")
                    found = True
                except AttributeError:
                    pass  # no xattrs on this system: no default ACLs either
                except OSError as e:
                    found = e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)
            self._inherits[d] = found
        return found

    def _find_program(self, name: str, path: str, cwd: str) -> str | None:
        """``which`` for a command in ``cwd``, memoised for the build."""
        key = (name, path, cwd if any(not d.startswith("/") for d in path.split(os.pathsep)) else "")
        found = self._programs.get(key, "")
        if found == "":
            found = self._programs[key] = which(name, path, cwd)
        return found

    def _kill(self, proc: Child, interrupt: bool = False) -> None:
        """SIGTERM the command's process group (every command leads one, a console-pool
        command too), SIGKILL once the grace period is over.  ``interrupt`` (cancel_all):
        its result counts as cut short, unless it had exited before the signal."""
        ended = _ended(proc.pid)
        if not _killpg(proc.pid, signal.SIGTERM):
            return  # reaped already: nothing of its group is left to signal
        with self._lock:
            if interrupt and not ended:
                self._interrupted.add(proc.pid)
            self._terminated[proc.pid] = time.monotonic() + KILL_GRACE_S
            if proc.pid in self._sessions:
                self._killed.add(proc.pid)

        def hard_kill() -> None:
            time.sleep(KILL_GRACE_S)
            with self._lock:
                self._terminated.pop(proc.pid, None)
            _killpg(proc.pid, signal.SIGKILL)

        try:
            threading.Thread(target=hard_kill, daemon=True).start()
        except RuntimeError:  # (no thread to wait with: a limit on threads) no grace period, rather than none
            with self._lock:
                self._terminated.pop(proc.pid, None)
            _killpg(proc.pid, signal.SIGKILL)

    def cancel_all(self) -> None:
        self.cancelled = True
        with self._lock:
            procs = list(self._procs.values())
        for p in procs:
            self._kill(p, interrupt=True)

    def kill_remaining(self) -> None:
        """SIGKILL whatever is still alive (at the end of a build), and what is left of the
        groups sent SIGTERM once their grace period is over (waited for here: the thread
        that would do it dies with the process)."""
        with self._lock:
            live = [p.pid for p in self._procs.values()]
            grace = dict(self._terminated)
            self._terminated.clear()
            swept = self._killed & self._sessions
            self._sessions.clear()
            self._killed.clear()
        for pgid in live:
            _killpg(pgid, signal.SIGKILL)
        while grace:
            now = time.monotonic()
            alive = live_groups(grace)  # (not zombies a busy init has yet to reap)
            grace = {g: end for g, end in grace.items() if (g in alive if alive is not None else _killpg(g, 0))}
            for g in [g for g, end in grace.items() if end <= now]:
                _killpg(g, signal.SIGKILL)
                del grace[g]
            if grace:
                time.sleep(0.02)
        sweep_sessions(swept, live)  # (a /proc pass, ~2 ms: not on every build's way out; see sweep_sessions)


def _ended(pid: int) -> bool:
    """Has child ``pid`` exited (reaped or not)?  Its process is left as it is."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


_NO_MEMFD: list[bool] = []  # memfd_create is missing or refused here: capture files instead


def _new_captures(prefix: str) -> tuple[int, int, bool]:
    """New descriptors for one command's stdout and stderr, open for reading and writing,
    and whether they are files on disk (``prefix.out``/``.err``, to unlink when it ends).

    Memory files (``memfd_create``) where the kernel has them: nothing on the workspace's
    filesystem is created and freed per command.  On ext4 without a journal, creating a
    file steps over every inode freed in the last minutes (staging.py), and two capture
    files per command freed as it ends made each new pair cost ~0.3-0.8 ms on the
    scheduler's thread within a thousand commands of a clean build.  What a command prints
    is held in memory until it is read, as Ninja's pipes hold it.  Never the descriptors
    an earlier command on the lane had: a daemon it started may still hold those."""
    if not _NO_MEMFD:
        name = os.path.basename(prefix)
        try:
            out = os.memfd_create(name + ".out", os.MFD_CLOEXEC)
        except AttributeError:
            _NO_MEMFD.append(True)
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                raise  # (a file could not be opened either)
            _NO_MEMFD.append(True)  # ENOSYS, or a sandbox's seccomp: EPERM
        else:
            try:
                return out, os.memfd_create(name + ".err", os.MFD_CLOEXEC), False
            except BaseException:
                os.close(out)
                raise
    out = _new_file(prefix + ".out")
    try:
        return out, _new_file(prefix + ".err"), True
    except BaseException:
        os.close(out)
        _unlink_capture(prefix)
        raise


def _new_file(path: str) -> int:
    """A new, empty file at ``path``, open for reading and writing: never the file an
    earlier command on the lane wrote to (a daemon it started may still hold that one).
    (~10-25 us more than truncating the old one when it is empty; less when it held
    output: ext4 flushes a file truncated to 0 and rewritten when it is closed.)"""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:  # (left by a command whose files were not released)
        os.unlink(path)
        return os.open(path, flags, 0o600)


def _unlink_capture(prefix: str) -> None:
    for suffix in (".out", ".err"):
        try:
            os.unlink(prefix + suffix)
        except OSError:
            pass


def _killpg(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _start_direct(
    cmd: SimpleCommand,
    program: str,
    cwd: str,
    env: dict[str, str],
    out_fd: int | None,
    err_fd: int | None,
    session: bool,
    spawn_closing: tuple[int, ...] | None,
    create: Callable[[str], int],
) -> Child | None:
    """Start a simple command without a shell; None when it cannot be started that way.

    The child sees what the shell would have given it: ``PWD`` set to its directory (sh
    exports it), stdout to the ``>`` file opened as sh opens it (created 0666 less the
    umask, truncated) by ``create``, relative to ``cwd``.  ``spawn_closing``: not None when ``cwd`` is
    this process's directory: posix_spawn starts it, closing those inherited descriptors."""
    if "PWD" in env:
        return None  # sh keeps or resets a given PWD by rules not worth copying
    redirect = None
    if cmd.stdout_path is not None:
        try:
            redirect = create(os.path.join(cwd, cmd.stdout_path))
        except OSError:
            return None
    stdout = redirect if redirect is not None else out_fd
    child_env = {**env, "PWD": os.path.normpath(cwd)}
    try:
        if spawn_closing is not None:
            spawned = _spawn(program, cmd.argv, child_env, stdout, err_fd, session, spawn_closing)
            if spawned is not None:
                return spawned
        import subprocess

        return Popened(
            subprocess.Popen(
                cmd.argv,
                executable=program,
                cwd=cwd,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=err_fd,
                start_new_session=session,
                process_group=None if session else 0,
                close_fds=True,
            )
        )
    except OSError:
        return None  # not found, not executable, no #! line...: the shell says so, or runs it
    finally:
        if redirect is not None:
            os.close(redirect)


def _spawn(
    program: str,
    argv: list[str],
    env: dict[str, str],
    stdout: int | None,
    stderr: int | None,
    session: bool,
    closing: tuple[int, ...],
) -> Spawned | None:
    """``os.posix_spawn`` in this process's directory, with Popen's set-up: stdin from
    /dev/null, stdout and stderr given (None: inherited), inherited descriptors closed,
    Python's ignored signals back to their defaults, a new session if asked (else a new
    process group in this one).  None when it cannot (a descriptor among 0-2 to move,
    which dup2 would not move)."""
    if _NO_SETSID and session:
        return None
    stdin = _devnull()
    if min(stdin, stdout if stdout is not None else 3, stderr if stderr is not None else 3) <= 2:
        return None  # buildtool started with 0, 1 or 2 closed: Popen handles that case
    actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, stdin, 0)]
    if stdout is not None:
        actions.append((os.POSIX_SPAWN_DUP2, stdout, 1))
    if stderr is not None:
        actions.append((os.POSIX_SPAWN_DUP2, stderr, 2))
    actions.extend((os.POSIX_SPAWN_CLOSE, fd) for fd in closing)
    try:
        # (setpgroup=None is not "unset" to CPython: a TypeError)
        group = {} if session else {"setpgroup": 0}
        pid = os.posix_spawn(program, argv, env, file_actions=actions, setsid=session, setsigdef=_DEFAULT_IN_CHILD,
                             **group)
    except NotImplementedError:  # no POSIX_SPAWN_SETSID in this libc: Popen from now on
        _NO_SETSID.append(True)
        return None
    return Spawned(pid)


TRUNCATED_NOTE = (b"[buildtool: this output was truncated while the command ran: it opened it again by name with"
                  b" `>` (`> /dev/stderr`, `> /dev/stdout`) and what it had written before is lost; write `>&2`"
                  b" or `>>` instead]\n")


def _read_all(fd: int) -> bytes:
    """What a capture holds, and a note when the command truncated it: the descriptor it
    was given (this one's open file) stands past the end of the file then."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0) if size else b""
    if os.lseek(fd, 0, os.SEEK_CUR) > size:
        data += (b"" if data.endswith(b"\n") or not data else b"\n") + TRUNCATED_NOTE
    return data
