"""Atomic file writes: a temp file in the same directory, then ``os.replace``.

Readers see the old content or the new one, never a torn file, even after ``kill -9``.
On failure the temp file is removed and the error (an ``OSError``) is raised.
"""

from __future__ import annotations

import os
from _thread import get_ident  # not threading's: the no-op path does not import threading


def write_report(path: str, data: bytes | str) -> None:
    """Write a file the user named (``--junit``, ``--profile``): atomically, as
    ``write_atomic``, into the file a symlink there points to (the link stays); but into
    this process's stdout or stderr (``/dev/stdout``, even redirected to a log file) at its
    own offset, and straight into a pipe or device: a rename would replace those."""
    import stat
    import sys

    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    try:
        st = os.stat(path)  # (through links: /dev/stdout -> /proc/self/fd/1 -> a pipe or a file)
    except FileNotFoundError:  # nothing there yet, or a link to nothing yet
        real = os.path.realpath(path)
        os.makedirs(os.path.dirname(real), exist_ok=True)  # (CI names reports/junit.xml in a fresh checkout)
        write_atomic(real, raw)
        return
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        try:
            same = os.path.samestat(st, os.fstat(fd))
        except OSError:
            continue
        if same:
            if stream is not None:
                stream.flush()  # (what was printed first comes first)
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            return
    real = os.path.realpath(path)
    if stat.S_ISREG(st.st_mode) and not real.startswith(("/proc/", "/dev/")):
        write_atomic(real, raw)
        return
    with open(path, "ab" if stat.S_ISREG(st.st_mode) else "wb") as f:  # (no truncation of a file under /proc)
        f.write(raw)


def write_atomic(path: str, data: bytes | str, *, errors: str = "strict") -> None:
    """Replace ``path`` with ``data`` (str is encoded as UTF-8 with ``errors``)."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", errors)
    tmp = f"{path}.tmp.{os.getpid()}.{get_ident()}"
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
