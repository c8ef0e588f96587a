"""Lock: one buildtool at a time per workspace (an flock on ``.buildtool/lock``).

The kernel releases the lock when the process dies, even by ``kill -9``, so a crash
never leaves a stale lock.  The holder's pid is written into the file for the message.
"""

from __future__ import annotations

import fcntl
import os

from buildtool.errors import BuildtoolError

TYPE_CHECKING = False  # the no-op path takes this lock: no typing, no collections.abc
if TYPE_CHECKING:
    from collections.abc import Callable


class LockBusy(BuildtoolError):
    """Another buildtool holds the workspace and ``--no-wait`` was given (exit 1)."""

    exit_code = 1


class WorkspaceLock:
    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, "lock")
        self.fd: int | None = None

    def acquire(self, wait: bool, say: Callable[[str], None]) -> None:
        try:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except IsADirectoryError:  # something made a directory there: the lock file is buildtool's
                import shutil

                say(f"warning: {self.path} was a directory; replaced it with the lock file")
                shutil.rmtree(self.path, ignore_errors=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a read-only workspace, a full disk, no permission
            from buildtool.errors import UserError

            msg = f"cannot take the workspace lock {self.path}: {e.strerror} (buildtool keeps its state there)"
            raise UserError(msg) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                who = f"pid {holder}" if holder else "unknown pid"
                if not wait:
                    msg = f"another buildtool ({who}) is running on this workspace (--no-wait given)"
                    raise LockBusy(msg) from None
                say(f"waiting for another buildtool ({who}) on this workspace")
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)  # (never a lock held by a descriptor nobody has: the next acquire would wait on it)
            raise
        try:  # the pid is only for the waiting message: a full disk must not fail (or leak) the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _read_pid(fd: int) -> int | None:
    try:
        data = os.pread(fd, 32, 0).strip()
        return int(data) if data else None
    except (OSError, ValueError):
        return None
