"""Lock: one buildtool at a time per workspace (an flock on ``.buildtool/lock``, and one on
a lock file of this user's in ``/tmp/buildtool-<uid>/`` named after the workspace root).

The kernel releases the lock when the process dies, even by ``kill -9``, so a crash
never leaves a stale lock.  The holder's pid is written into the file for the message.
The second lock is what holds when the state directory is deleted under a running build
(``rm -rf .buildtool``): a second build would make a new lock file, lock it, and run beside
the first, the two writing the same outputs (a workspace directory moved or replaced
under a running build, or a process with a private /tmp, is beyond it).  It is outside the
workspace: the root
directory's own flock made a command of the root package that locks its directory
(``flock . cmd``) wait for the build forever, and the marker ``buildtool.toml`` may be a
link shared by several workspaces, or be replaced by an editor.  Its name is the root
directory's device and inode (not a path: one workspace reached through two paths, or two
through one path in different mount namespaces), its place fixed by the user id (not by
the environment, which differs between a terminal, cron and an IDE).  It is taken second,
after the file's (whose holder the waiting message names), and let go of first, so that
two builds never wait on each other in opposite orders; the holder removes it then.  Two
users building one workspace each have their own (the lock file alone orders them).
"""

from __future__ import annotations

import fcntl
import os
import time

from buildtool.workspace import private_tmp_dir

TYPE_CHECKING = False  # the no-op path takes this lock: no typing, no collections.abc, no errors.py
if TYPE_CHECKING:
    from collections.abc import Callable


class WorkspaceLock:
    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, "lock")
        self.root = os.path.dirname(os.path.abspath(state_dir))
        self.fd: int | None = None
        self.second_fd: int | None = None
        self.second_path: str | None = None
        self._before_wait: Callable[[], object] | None = None

    def acquire(
        self, wait: bool, say: Callable[[str], None], remake: Callable[[], object] | None = None,
        before_wait: Callable[[], object] | None = None,
    ) -> None:
        """Take the lock (``wait``: blocking, saying who holds it).  A lock file deleted or
        replaced while this process waited for it (``buildtool clean`` deletes the state)
        locks nothing: the file now at the path is locked instead, after ``remake`` (default:
        make the directory) puts the state directory back.  ``before_wait`` is called once,
        when the lock is busy, before waiting (or failing, not ``wait``): what it raises is
        raised without the wait."""
        self._before_wait = before_wait
        while not self._acquire_once(wait, say):
            if remake is not None:
                remake()
            else:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)

    def _acquire_once(self, wait: bool, say: Callable[[str], None]) -> bool:
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(self.path, flags, 0o644)
            except IsADirectoryError:  # something made a directory there: the lock file is buildtool's
                import shutil

                say(f"warning: {self.path} was a directory; replaced it with the lock file")
                shutil.rmtree(self.path, ignore_errors=True)
                fd = os.open(self.path, flags, 0o644)
            except OSError as e:  # a link there: never followed (the pid written into the file it led
                import errno  # to emptied a source, or any file the user may write; errno: not on

                if e.errno != errno.ELOOP:  # the monitored no-op's path)
                    raise
                try:  # (another buildtool may be replacing it too: then it is a file, or gone, by now)
                    where = os.readlink(self.path)
                    os.unlink(self.path)
                except OSError:
                    pass
                else:
                    say(f"warning: {self.path} was a symbolic link (to {where!r}); replaced it with the lock file, "
                        "leaving what it led to as it was")
                fd = os.open(self.path, flags, 0o644)
        except OSError as e:  # a read-only workspace, a full disk, no permission
            from buildtool.errors import UserError

            msg = f"cannot take the workspace lock {self.path}: {e.strerror} (buildtool keeps its state there)"
            raise UserError(msg) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                for _ in range(5):  # a holder that just took the lock writes its pid after it
                    if holder:
                        break
                    time.sleep(0.01)
                    holder = _read_pid(fd)
                who = f"pid {holder}" if holder else "unknown pid"
                if self._before_wait is not None:  # (--no-wait too: a typo is exit 2, not "busy")
                    check, self._before_wait = self._before_wait, None
                    check()
                if not wait:
                    from buildtool.errors import LockBusy

                    msg = f"another buildtool ({who}) is running on this workspace (--no-wait given)"
                    raise LockBusy(msg) from None
                say(f"waiting for another buildtool ({who}) on this workspace")
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)  # (never a lock held by a descriptor nobody has: the next acquire would wait on it)
            raise
        if not _still_at(fd, self.path):
            os.close(fd)
            return False
        try:  # the pid is only for the waiting message: a full disk must not fail (or leak) the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        try:
            self.second_path = second_lock_path(self.root)
            self.second_fd = _lock_second(self.second_path, wait, say) if self.second_path else None
        except BaseException:
            _let_go(fd)
            raise
        self.fd = fd
        return True

    def release(self) -> None:
        if self.second_fd is not None:  # (first: a waiter woken by the file finds it free)
            path = self.second_path  # (as locked: the root may be gone or replaced by now)
            if path is not None and _still_at(self.second_fd, path):
                try:  # (no file left per workspace; a waiter on it locks the next one)
                    os.unlink(path)
                except OSError:
                    pass
            os.close(self.second_fd)  # (closing the last descriptor releases its flock)
            self.second_fd = None
        if self.fd is not None:
            _let_go(self.fd)
            self.fd = None


def _let_go(fd: int) -> None:
    """Empty the lock file (no pid of a build that is gone), unlock and close it."""
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def second_lock_path(root: str) -> str | None:
    """This user's lock file for the workspace at ``root``: ``/tmp/buildtool-<uid>/``
    (made 0700, and used only if it is this user's own directory), named after the root
    directory's device and inode; None where there is no such place."""
    d = private_tmp_dir()
    try:
        at = os.stat(root)
    except OSError:
        return None
    return None if d is None else os.path.join(d, f"{at.st_dev:x}-{at.st_ino:x}.lock")


def _lock_second(path: str, wait: bool, say: Callable[[str], None]) -> int | None:
    """The descriptor of the second lock at ``path``; None where it cannot be made or
    locked (a file system without flock: the lock file's alone then).  Busy means a build
    whose lock file was deleted under it still runs."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            why = "its .buildtool/lock was deleted while it ran"
            if not wait:
                from buildtool.errors import LockBusy

                raise LockBusy(f"another buildtool is running on this workspace ({why}; --no-wait given)") from None
            say(f"waiting for another buildtool on this workspace ({why})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # no flock on this file system
            os.close(fd)
            return None
    except BaseException:
        os.close(fd)
        raise
    if not _still_at(fd, path):  # the holder let go of it and removed it: this one locks nothing
        os.close(fd)
        return _lock_second(path, wait, say)
    return fd


def _still_at(fd: int, path: str) -> bool:
    """Is the file open as ``fd`` the one at ``path`` (not deleted or replaced since)?"""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_pid(fd: int) -> int | None:
    try:
        data = os.pread(fd, 32, 0).strip()
        return int(data) if data else None
    except (OSError, ValueError):
        return None
