"""Executor: runs one action's command as a subprocess in its own process group.

The child gets exactly the environment it is given (plus a fresh per-action TMPDIR and
HOME), ``/bin/sh -e -c`` (``bash -e -o pipefail`` when the command has a pipe and
``/bin/sh`` cannot do pipefail), stdin from /dev/null and captured stdout/stderr (not for
the ``console`` pool).  ``cancel_all`` terminates every running process group (SIGTERM,
then SIGKILL after a grace period).  The cache layer in front of it lives in runner.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

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
        self._lock = threading.Lock()
        self.cancelled = False
        # Called with the pgid of each command started in its own session (orphans.py).
        self.on_spawn: Callable[[int], None] | None = None
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
        """Run to completion.  ``capture`` is a path prefix for the stdout/stderr files
        (reused per worker lane: no pipes and no poll loop); None lets the child use the
        terminal (the ``console`` pool).  ``direct``: the same command as ``argv``'s shell
        line, started without the shell (simplecmd.py); if it cannot be started, ``argv``
        runs instead, so the shell reports the problem."""
        start = time.monotonic()
        if self.cancelled:
            return ProcessResult(-signal.SIGTERM, b"", b"cancelled before start\n", False, 0.0)
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
            with self._lock:
                self._procs[proc.pid] = proc
            if self.on_spawn is not None and capture is not None:
                self.on_spawn(proc.pid)
            if self.cancelled:
                self._kill(proc)
            timed_out = False
            try:
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    self._kill(proc)
                    proc.wait()
            finally:
                with self._lock:
                    self._procs.pop(proc.pid, None)
            out = _read_all(out_fd) if out_fd is not None else b""
            err = _read_all(err_fd) if err_fd is not None else b""
        finally:
            for fd in (out_fd, err_fd):
                if fd is not None:
                    os.close(fd)
        return ProcessResult(proc.returncode, out, err, timed_out, time.monotonic() - start)

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
