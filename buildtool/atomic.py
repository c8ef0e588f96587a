"""Atomic file writes: a temp file in the same directory, then ``os.replace``.

Readers see the old content or the new one, never a torn file, even after ``kill -9``.
On failure the temp file is removed and the error (an ``OSError``) is raised.
"""

from __future__ import annotations

import errno
import os
import time
from _thread import get_ident  # not threading's: the no-op path does not import threading

TYPE_CHECKING = False  # not typing's: the no-op path imports this module
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


_WRITTEN: set[str] = set()  # real paths of the reports this process wrote (never an earlier run's)
_USER_UMASK: list[int] = []  # the umask buildtool was started with, once the commands' 022 is set


def umask_for_commands() -> None:
    """Set the process's umask to 022, for the commands (outputs get the same modes
    whoever builds), keeping the one buildtool was started with (``share_bits``)."""
    prev = os.umask(0o022)
    if not _USER_UMASK:
        _USER_UMASK.append(prev)


def share_bits() -> int:
    """The permission bits the user's umask grants and 022 takes away (umask 002: group
    write): what a file or directory buildtool makes in the cache gets back, so that a cache
    a team shares (a setgid group directory) stays writable to the group."""
    if not _USER_UMASK:  # (before umask_for_commands: the process's is still the user's; read once)
        u = os.umask(0o022)
        os.umask(u)
        _USER_UMASK.append(u)
    return 0o022 & ~_USER_UMASK[0]


def share(path_or_fd: str | int) -> None:
    """Give a directory or writable file buildtool just made in the cache the
    ``share_bits`` (best effort: only its owner can; a read-only blob stays read-only)."""
    bits = share_bits()
    if not bits:
        return
    import stat

    try:
        st = os.fstat(path_or_fd) if isinstance(path_or_fd, int) else os.lstat(path_or_fd)
        if st.st_mode & bits == bits or st.st_uid != os.geteuid() or stat.S_ISLNK(st.st_mode):
            return  # (a link: chmod would change what it leads to)
        if not (stat.S_ISDIR(st.st_mode) or st.st_mode & 0o200):
            return
        mode = stat.S_IMODE(st.st_mode) | bits  # (a setgid bit stays)
        if isinstance(path_or_fd, int):
            os.fchmod(path_or_fd, mode)
        else:
            os.chmod(path_or_fd, mode)
    except OSError:
        pass


def wrote_report(path: str) -> None:
    """This run wrote (or opened, --events) the report at ``path``: drop_stale_reports
    leaves it."""
    _WRITTEN.add(os.path.realpath(path))


def write_report(path: str, data: bytes | str | Iterable[bytes]) -> None:
    """Write a file the user named (``--junit``, ``--profile``): atomically, as
    ``write_atomic``, into the file a symlink there points to (the link stays); but into an
    open descriptor's file (``/dev/stdout``, ``/dev/fd/3``, even redirected to a log) at its
    end, at this process's own offset for its stdout and stderr, and straight into a pipe
    or device: a rename would replace those.  ``data`` may come in chunks (a large report,
    made as it is written)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    _write_report(path, raw)
    wrote_report(path)


def _write_report(path: str, raw: bytes | Iterable[bytes]) -> None:
    import stat
    import sys

    try:
        st = os.stat(path)  # (through links: /dev/stdout -> /proc/self/fd/1 -> a pipe or a file)
    except FileNotFoundError:  # nothing there yet, or a link to nothing yet
        real = os.path.realpath(path)
        os.makedirs(os.path.dirname(real), exist_ok=True)  # (CI names reports/junit.xml in a fresh checkout)
        _drop_dead_temps(real)
        write_atomic(real, raw)
        return
    fd = _own_stream(st)
    if fd is not None:
        stream = sys.stdout if fd == 1 else sys.stderr
        if stream is not None:
            stream.flush()  # (what was printed first comes first)
        for chunk in [raw] if isinstance(raw, bytes) else raw:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        return
    if stat.S_ISREG(st.st_mode) and not _through_a_descriptor(path):
        _drop_dead_temps(os.path.realpath(path))
        write_atomic(os.path.realpath(path), raw)
        return
    with open(path, "ab" if stat.S_ISREG(st.st_mode) else "wb") as f:
        f.writelines([raw] if isinstance(raw, bytes) else raw)


def _drop_dead_temps(path: str) -> None:
    """Remove the temp files of ``path`` (``<name>.tmp.<pid>.<thread>``) that a process no
    longer running left: a CI job SIGKILLed while its JUnit file was written left a cut
    report beside it, which an upload of the report directory then carried.  Not one written
    to in the last DEAD_TEMP_AGE_S: its pid is this PID namespace's, and a build in another
    (a container, another host over NFS) may be writing it now."""
    head, name = os.path.split(path)
    prefix = f"{name}.tmp."
    try:
        names = [n for n in os.listdir(head or ".") if n.startswith(prefix)]
    except OSError:
        return
    for n in names:
        pid, dot, thread = n[len(prefix):].partition(".")
        if not (dot and pid.isdigit() and pid.isascii() and thread.isdigit() and thread.isascii()):
            continue
        try:
            os.kill(int(pid), 0)
            continue  # (running: a build writing it now, or another process with that pid)
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):
            continue
        try:
            if time.time() - os.lstat(os.path.join(head, n)).st_mtime > DEAD_TEMP_AGE_S:
                os.unlink(os.path.join(head, n))
        except OSError:
            pass


DEAD_TEMP_AGE_S = 60.0


def _own_stream(st: os.stat_result) -> int | None:
    """1 or 2 if the file of ``st`` is this process's stdout or stderr, else None."""
    for fd in (1, 2):
        try:
            if os.path.samestat(st, os.fstat(fd)):
                return fd
        except OSError:
            continue
    return None


REPORT_MARKERS = {"--junit": b"<testsuite", "--profile": b'"traceEvents"', "--events": b'"schema"'}


def _earlier_report(path: str, marker: bytes) -> bool | None:
    """What is at ``path``, for a report about to replace it: None if nothing a report
    could destroy (no file, an empty one, a pipe or device, this process's own stdout or
    stderr), True if an earlier report of the kind ``marker`` shows in its first 4 kB,
    False for any other file (a source, an output, a log)."""
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or _through_a_descriptor(path) or _own_stream(st):
            return None
        with open(path, "rb") as f:
            return marker in f.read(4096)
    except OSError:
        return None


def replaceable(path: str, flag: str) -> bool:
    """Whether the report of ``flag`` may be written at ``path`` (see ``_earlier_report``):
    not over a file that holds something else."""
    return _earlier_report(path, REPORT_MARKERS[flag]) is not False


def remove_stale_report(path: str, flag: str) -> bool:
    """After ``write_report`` failed: remove the report of that kind an earlier run left at
    ``path`` (through a link: the file it points to), so that it cannot pass for this
    run's (a CI step shows whatever JUnit file it finds); never any other file.  True if
    one was removed."""
    if not _earlier_report(path, REPORT_MARKERS[flag]):
        return False
    try:
        os.unlink(os.path.realpath(path))
        return True
    except OSError:
        return False


REPORTS_HEADER = b"# buildtool reports v1\n"


def _reports_path(state_dir: str) -> str:
    return os.path.join(state_dir, "reports")


def written_reports(state_dir: str) -> dict[str, list[int]]:
    """``<state>/reports``: the real path of each report this workspace's builds wrote ->
    [inode, size, mtime_ns] as written; empty if missing, of another version or corrupt."""
    import json

    from buildtool.workspace import open_regular, remove_if_not_a_file

    try:
        with open_regular(_reports_path(state_dir)) as f:  # (a named pipe there: not a wait for a writer)
            data = f.read()
        if not data.startswith(REPORTS_HEADER):
            return {}
        got = json.loads(data[len(REPORTS_HEADER) :])
    except FileNotFoundError:
        return {}
    except OSError:
        remove_if_not_a_file(_reports_path(state_dir))
        return {}
    except ValueError:
        return {}
    if not isinstance(got, dict):
        return {}
    return {k: v for k, v in got.items() if isinstance(v, list) and len(v) == 3}


def _stat_triple(path: str) -> list[int] | None:
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns] if stat.S_ISREG(st.st_mode) else None


def remember_reports(state_dir: str) -> None:
    """Add the regular files this process wrote as reports to ``<state>/reports`` (and
    drop the entries whose file has changed or gone since): what ``drop_stale_reports`` may
    remove.  Best effort: a ledger that cannot be written leaves a report in place."""
    if not _WRITTEN:
        return
    import json

    known = {p: v for p, v in written_reports(state_dir).items() if _stat_triple(p) == v}
    for p in _WRITTEN:
        row = _stat_triple(p)
        if row is not None:
            known[p] = row
    try:
        write_atomic(_reports_path(state_dir), REPORTS_HEADER + json.dumps(known, sort_keys=True).encode())
    except OSError:
        pass


def drop_stale_reports(asked: Any, state_dir: str | None, spare: Any = (), ours_too: bool = False) -> None:
    """A request refused before anything ran (exit 2, a watch cycle's ERROR) writes no
    report: remove the one of each kind ``asked`` for (its ``junit``, ``events`` and
    ``profile`` attributes: parsed arguments, a BuildRequest) that an earlier run left, or
    a CI step that shows the JUnit file it finds would show the last run's green results.
    Only a file this workspace's builds wrote as a report and nobody changed since (its
    inode, size and mtime in ``<state>/reports``; none without a workspace): a report
    committed as a source, checked out by git, stays.  Not at the paths of the flags in
    ``spare`` either (the error's ``flags``, when it was their paths that were refused),
    nor where this process wrote one (an interrupt after the reports were written), unless
    ``ours_too`` (watch mode, where those are an earlier cycle's)."""
    ledger = written_reports(state_dir) if state_dir is not None else {}
    for flag, name in (("--junit", "junit"), ("--events", "events"), ("--profile", "profile")):
        path = getattr(asked, name, None)
        if not path or flag in spare:
            continue
        real = os.path.realpath(path)
        if (ours_too or real not in _WRITTEN) and real in ledger and _stat_triple(real) == ledger[real]:
            remove_stale_report(path, flag)


def _through_a_descriptor(path: str) -> bool:
    """Does ``path`` or a link on its way name an open descriptor (``/proc/*/fd/N``,
    ``/dev/fd/N``), whose file is someone's open stream rather than a file to replace?"""
    import re

    fd_path = re.compile(r"/(proc/[^/]+|dev)/fd/\d+")
    p = os.path.abspath(path)
    for _ in range(40):  # (the kernel's limit on links followed)
        if fd_path.fullmatch(p):
            return True
        try:
            target = os.readlink(p)
        except OSError:
            return False
        p = os.path.normpath(os.path.join(os.path.dirname(p), target))
    return False


NAME_MAX = 255  # bytes in one file name, on every filesystem Linux has
# Ends the temp file a restore writes beside its output when the state dir is on another
# file system (cache.Cache._restore_tmp): never a source (loader), removed before the output's
# command runs (runner) when a kill -9 left it.
RESTORE_TMP_SUFFIX = ".buildtool-tmp"


def temp_path(path: str, suffix: str) -> str:
    """The name of a temp file beside ``path`` (to be renamed over it): ``path`` + ``suffix``,
    unless that name is longer than NAME_MAX bytes (while ``path``'s own name may fit: a
    test log named after a long target, an output restored from the cache); then
    ``path``'s name is cut and ``~`` and 16 hex digits of its hash put before ``suffix``.
    Either way the same name for the same ``path`` and ``suffix`` (a fixed suffix: the
    temp file a killed build left is the one the next write of ``path`` replaces) and
    different ones for different paths."""
    head, name = os.path.split(path)
    raw = os.fsencode(name)
    if len(raw) + len(os.fsencode(suffix)) <= NAME_MAX:
        return path + suffix
    import hashlib  # (only for a name this long)

    tag = "~" + hashlib.blake2b(raw, digest_size=8).hexdigest()
    keep = max(NAME_MAX - len(os.fsencode(suffix)) - len(tag), 0)
    return os.path.join(head, os.fsdecode(raw[:keep]) + tag + suffix)  # (a cut UTF-8 character stays its bytes)


def write_atomic(
    path: str, data: bytes | str | Iterable[bytes], *, errors: str = "strict", tmp_dir: str | None = None,
) -> None:
    """Replace ``path`` with ``data`` (str is encoded as UTF-8 with ``errors``; chunks are
    written as they come); the temp file is ``<path>.tmp.<pid>.<thread id>``, cut as
    ``temp_path`` says for a long name, or in ``tmp_dir`` (on the same filesystem; the state
    dir's tmp/, which the next build empties: a kill -9 between the write and the rename
    leaves nothing beside ``path``)."""
    raw = data.encode("utf-8", errors) if isinstance(data, str) else data
    if tmp_dir is not None and not isinstance(raw, bytes):
        raw = b"".join(raw)  # (written again beside ``path`` if tmp_dir is on another filesystem)
    if tmp_dir is not None:
        try:
            os.makedirs(tmp_dir, exist_ok=True)
        except OSError:
            tmp_dir = None
    tmp = temp_path(path, f".tmp.{os.getpid()}.{get_ident()}") if tmp_dir is None \
        else os.path.join(tmp_dir, f"atomic.{os.getpid()}.{get_ident()}")
    try:
        with open(tmp, "wb") as f:
            f.writelines([raw] if isinstance(raw, bytes) else raw)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if tmp_dir is not None and isinstance(e, OSError) and e.errno == errno.EXDEV:
            write_atomic(path, raw)  # (another filesystem after all: beside it)
            return
        raise


def remove_path(path: str) -> None:
    """Whatever is at ``path`` gone, a file or link (unlinked, never followed), or a
    directory with all it holds; errors ignored (what cannot be removed stays).  A build's
    tmp/ and an emptied TMPDIR (files and empty directories) go without importing shutil
    (~4 ms); anything deeper through ``shutil.rmtree``, which walks by descriptor (a
    directory swapped for a link meanwhile is not followed), and, for a tree ~1,000 levels
    deep (a command's, in its TMPDIR or an output's place: 3.11's rmtree recurses once a
    level), ``rm -rf``."""
    try:
        os.unlink(path)
        return
    except IsADirectoryError:  # (a directory itself: a link to one was unlinked)
        pass
    except OSError:
        return
    try:
        with os.scandir(path) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    os.rmdir(e.path)
                else:
                    os.unlink(e.path)
        os.rmdir(path)
        return
    except FileNotFoundError:
        return
    except OSError:  # (not empty below the first level, or not ours to remove)
        pass
    import shutil

    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        import subprocess

        try:
            subprocess.run(["rm", "-rf", "--", path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
        except OSError:  # (no rm on PATH: what cannot be removed stays)
            pass


def make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)`` without its recursion (one call a missing
    level: an output 1,000 directories down was a RecursionError); raises what mkdir
    raises, and FileExistsError for a non-directory in the way."""
    missing = []
    d = path
    while not os.path.isdir(d):
        missing.append(d)
        up = os.path.dirname(d)
        if up == d:
            break
        d = up
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
