"""Staging directory: where a build creates new files that it then renames or links into the workspace.

Why not create them in place: on ext4 without a journal (the machines we benchmark on),
the inode allocator steps over every inode freed in the last minutes before it hands one
out, so creating a file in the block group of files just deleted (``rm -rf out``, a clean
build, W2 and W6 in docs/benchmarks.md) costs 0.1-0.9 ms instead of ~0.02 ms.  This
process's staging directory is a new subdirectory of the state dir's ``tmp/``, which is
marked as a top of unrelated directories (``chattr +T``): ext2/3/4's Orlov allocator
places such a subdirectory, and the inodes of the files created in it, in a block group
of its own.  A rename or a hard link into place does not move the inode.

Used by cache restores (temp file + rename) and by commands started without a shell,
whose ``>`` file is created here and linked into place (executor.py).  A build killed
mid-way leaves its strays in the state dir, never among the sources.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time

FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long) on 64-bit Linux
FS_IOC_SETFLAGS = 0x40086602  # _IOW('f', 2, long)
FS_TOPDIR_FL = 0x00020000


class Stage:
    """This process's staging directory under ``parent``, made on first use; thread-safe."""

    def __init__(self, parent: str) -> None:
        self.parent = parent
        self._dir: str | None = None
        self._usable: dict[str, bool] = {}  # destination dir -> on the staging dir's filesystem
        self._mu = threading.Lock()
        self._count = 0

    def dir_for(self, dest_dir: str) -> str | None:
        """The staging directory, when it is on the filesystem of the existing directory
        ``dest_dir`` (memoised per path); None when it is not, or cannot be made."""
        usable = self._usable.get(dest_dir)
        if usable is None:
            try:
                stage = self._make()
                usable = os.stat(stage).st_dev == os.stat(dest_dir).st_dev
            except OSError:
                usable = False
            self._usable[dest_dir] = usable
        return self._dir if usable else None

    def new_name(self, stage: str) -> str:
        """A path in ``stage`` that no other call of this process returns."""
        with self._mu:
            self._count += 1
            n = self._count
        return os.path.join(stage, str(n))

    def forget(self) -> None:
        """A directory memoised here was removed (the state dir's tmp/ goes after each build)."""
        with self._mu:
            self._dir = None
            self._usable.clear()

    def _make(self) -> str:
        with self._mu:
            if self._dir is None:
                os.makedirs(self.parent, exist_ok=True)
                mark_topdir(self.parent)
                stage = os.path.join(self.parent, f"stage.{os.getpid()}.{time.monotonic_ns()}")
                os.mkdir(stage)  # a new name each time: ext4 starts its search from the name's hash
                self._dir = stage
            return self._dir


def mark_topdir(path: str) -> None:
    """Set ``FS_TOPDIR_FL`` on the directory ``path`` (what ``chattr +T`` does): ext2/3/4's
    Orlov allocator then spreads its new subdirectories over block groups.  Best effort:
    on other filesystems the ioctl fails and nothing changes."""
    if not sys.platform.startswith("linux"):
        return  # the ioctl numbers above are Linux's
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        buf = bytearray(8)  # the kernel reads and writes an int; room for a long
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        flags = int.from_bytes(buf[:4], sys.byteorder)
        if not flags & FS_TOPDIR_FL:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, (flags | FS_TOPDIR_FL).to_bytes(4, sys.byteorder) + bytes(4))
    except OSError:
        pass
    finally:
        os.close(fd)
