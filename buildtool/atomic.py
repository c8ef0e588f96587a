"""Atomic file writes: a temp file in the same directory, then ``os.replace``.

Readers see the old content or the new one, never a torn file, even after ``kill -9``.
On failure the temp file is removed and the error (an ``OSError``) is raised.
"""

from __future__ import annotations

import os
from _thread import get_ident  # not threading's: the no-op path does not import threading


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
