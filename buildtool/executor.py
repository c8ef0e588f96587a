"""Executor: runs one action's command as a subprocess in its own process group.

The child gets exactly the environment it is given (plus a fresh per-action TMPDIR and
HOME), ``/bin/sh -e -c`` (``bash -e -o pipefail`` when the command has a pipe and
``/bin/sh`` cannot do pipefail), stdin from /dev/null and captured stdout/stderr (not for
the ``console`` pool).  ``run`` blocks until the command ends (a worker thread); ``start``
returns a ``Running`` whose pidfd an event loop can watch (the scheduler's own thread).
``cancel_all`` terminates every running process group (SIGTERM, then SIGKILL after a grace
period).  The cache layer in front of it lives in runner.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from buildtool.orphans import boot_clock

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable

    from buildtool.simplecmd import SimpleCommand

MAX_ARG = 100_000  # longer commands go through a script file (MAX_ARG_STRLEN is 128 KiB)
KILL_GRACE_S = 2.0

PYRULE_MAIN = (
    "import importlib, json, sys\n"
    "mod, _, fn = sys.argv[1].partition(':')\n"
    "f = getattr(importlib.import_module(mod), fn)\n"
    "f(srcs=json.loads(sys.argv[2]), outs=json.loads(sys.argv[3]), **json.loads(sys.argv[4]))\n"
)


class ProcessResult:
    """How one command ended, with its captured output."""

    __slots__ = ("duration", "exit_code", "stderr", "stdout", "timed_out")

    def __init__(self, exit_code: int, stdout: bytes, stderr: bytes, timed_out: bool, duration: float) -> None:
        self.exit_code = exit_code  # negative: killed by that signal
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.duration = duration


class Running:
    """A started command: wait for it here (``wait``), or let an event loop watch its
    ``pidfd`` and call ``expire`` at its ``deadline`` and ``finish`` once it exited."""

    __slots__ = ("_err_fd", "_executor", "_out_fd", "deadline", "proc", "start", "timed_out")

    def __init__(
        self,
        executor: SubprocessExecutor,
        proc: subprocess.Popen[bytes] | None,
        out_fd: int | None,
        err_fd: int | None,
        start: float,
        deadline: float | None,
    ) -> None:
        self._executor = executor
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
            timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.expire()
                self.proc.wait()
            except BaseException:
                self._release()
                raise
        return self.finish()

    def finish(self, ended: float | None = None) -> ProcessResult:
        """Reap the ended process, read what it printed, free its files.  ``ended``: when
        it was seen to have exited (time.monotonic), if that was before this call."""
        proc = self.proc
        if proc is None:
            return ProcessResult(-signal.SIGTERM, b"", b"cancelled before start\n", False, 0.0)
        try:
            proc.wait()  # reaps it; returns at once when it has exited
            out = _read_all(self._out_fd) if self._out_fd is not None else b""
            err = _read_all(self._err_fd) if self._err_fd is not None else b""
        finally:
            self._release()
        end = ended if ended is not None else time.monotonic()
        return ProcessResult(proc.returncode, out, err, self.timed_out, end - self.start)

    def _release(self) -> None:
        if self.proc is not None:
            with self._executor._lock:
                self._executor._procs.pop(self.proc.pid, None)
        for fd in (self._out_fd, self._err_fd):
            if fd is not None:
                os.close(fd)
        self._out_fd = self._err_fd = None


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
    if "|" in cmd and not SH_PIPEFAIL and BASH:
        return "bash"
    return "sh"


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


class SubprocessExecutor:
    """Starts commands in new sessions and can kill them all."""

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        # Re-entrant: cancel_all runs in a signal handler on the scheduler's thread, which
        # may be holding it (start, finish) when the signal arrives.
        self._lock = threading.RLock()
        self.cancelled = False
        # Called with the pgid of each command started in its own session and the boot
        # clock read before it was started (orphans.py).
        self.on_spawn: Callable[[int, float | None], None] | None = None
        # (program, PATH) -> its path, for commands started without a shell: found once,
        # not by a failed exec per PATH entry before it on every start (as sh's hash).
        self._programs: dict[tuple[str, str, str], str | None] = {}

    def run(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        timeout: float | None = None,
        capture: str | None = None,
        direct: SimpleCommand | None = None,
    ) -> ProcessResult:
        """Run to completion (``start`` then ``Running.wait``)."""
        return self.start(argv, cwd, env, timeout, capture, direct).wait()

    def start(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        timeout: float | None = None,
        capture: str | None = None,
        direct: SimpleCommand | None = None,
    ) -> Running:
        """Start the command and return at once.  ``capture`` is a path prefix for the
        stdout/stderr files (reused per worker lane: no pipes and no poll loop); None lets
        the child use the terminal (the ``console`` pool).  ``direct``: the same command as
        ``argv``'s shell line, started without the shell (simplecmd.py); if it cannot be
        started, ``argv`` runs instead, so the shell reports the problem.  OSError: the
        command could not be started at all."""
        start = time.monotonic()
        if self.cancelled:
            return Running(self, None, None, None, start, None)
        booted = boot_clock() if self.on_spawn is not None else None
        out_fd = err_fd = None
        if capture is not None:
            flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            out_fd = os.open(capture + ".out", flags, 0o600)
            err_fd = os.open(capture + ".err", flags, 0o600)
        try:
            proc = None
            if direct is not None:
                program = self._find_program(direct.argv[0], env.get("PATH", os.defpath), cwd)
                if program is not None:
                    proc = _start_direct(direct, program, cwd, env, out_fd, err_fd, capture is not None)
            if proc is None:
                proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out_fd,
                    stderr=err_fd,
                    start_new_session=capture is not None,
                    close_fds=True,
                )
        except BaseException:
            for fd in (out_fd, err_fd):
                if fd is not None:
                    os.close(fd)
            raise
        with self._lock:
            self._procs[proc.pid] = proc
        if self.on_spawn is not None and capture is not None:
            self.on_spawn(proc.pid, booted)
        if self.cancelled:
            self._kill(proc)
        return Running(self, proc, out_fd, err_fd, start, None if timeout is None else start + timeout)

    def _find_program(self, name: str, path: str, cwd: str) -> str | None:
        """``which`` for a command in ``cwd``, memoised for the build."""
        key = (name, path, cwd if any(not d.startswith("/") for d in path.split(os.pathsep)) else "")
        found = self._programs.get(key, "")
        if found == "":
            found = self._programs[key] = which(name, path, cwd)
        return found

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return

        def hard_kill() -> None:
            time.sleep(KILL_GRACE_S)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        threading.Thread(target=hard_kill, daemon=True).start()

    def cancel_all(self) -> None:
        self.cancelled = True
        with self._lock:
            procs = list(self._procs.values())
        for p in procs:
            self._kill(p)

    def kill_remaining(self) -> None:
        """SIGKILL whatever is still alive (used right before exiting)."""
        with self._lock:
            procs = list(self._procs.values())
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _start_direct(
    cmd: SimpleCommand,
    program: str,
    cwd: str,
    env: dict[str, str],
    out_fd: int | None,
    err_fd: int | None,
    session: bool,
) -> subprocess.Popen[bytes] | None:
    """Start a simple command without a shell; None when it cannot be started that way.

    The child sees what the shell would have given it: ``PWD`` set to its directory (sh
    exports it), stdout to the ``>`` file opened as sh opens it (created 0666 less the
    umask, truncated), relative to ``cwd``."""
    if "PWD" in env:
        return None  # sh keeps or resets a given PWD by rules not worth copying
    redirect = None
    if cmd.stdout_path is not None:
        try:
            redirect = os.open(
                os.path.join(cwd, cmd.stdout_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666
            )
        except OSError:
            return None
    try:
        return subprocess.Popen(
            cmd.argv,
            executable=program,
            cwd=cwd,
            env={**env, "PWD": os.path.normpath(cwd)},
            stdin=subprocess.DEVNULL,
            stdout=redirect if redirect is not None else out_fd,
            stderr=err_fd,
            start_new_session=session,
            close_fds=True,
        )
    except OSError:
        return None  # not found, not executable, no #! line...: the shell says so, or runs it
    finally:
        if redirect is not None:
            os.close(redirect)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    if size == 0:
        return b""
    return os.pread(fd, size, 0)
