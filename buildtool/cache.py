"""Cache: the shared on-disk content-addressed blob store and action cache.

Layout under the cache dir (shared by every workspace of the user)::

    v1/cas/<d[:2]>/<digest>     blob = file content, named by its BLAKE3 digest
    v1/ac/<k[:2]>/<key>         action entry (JSON) for an action key
    v1/tmp/                     temp files, renamed into place

Writes go to a temp file then ``os.replace``; a blob whose content does not match its
name is a miss (and is removed); an entry that is corrupt, of another version, or
names a path outside the workspace is a miss.  Trouble never fails a build: it warns
and turns caching off or degrades to a miss.  Spec: docs/formats.md#cache
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import posixpath
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from buildtool.cache_gc import StoreGuard
from buildtool.digest import hash_file

FORMAT_VERSION = 1
FICLONE = 0x40049409


@dataclass(frozen=True, slots=True)
class CachedOutput:
    path: str  # workspace-relative
    digest: str
    mode: int  # 0o644 or 0o755


@dataclass(frozen=True, slots=True)
class ActionEntry:
    """A cached successful action: its outputs and captured output streams."""

    outputs: tuple[CachedOutput, ...]
    duration: float
    stdout: str | None  # blob digest of captured stdout
    stderr: str | None


def safe_rel_path(p: Any) -> bool:
    """True for a normalised, relative path that stays inside the workspace."""
    return (
        isinstance(p, str)
        and p != ""
        and not p.startswith("/")
        and "\0" not in p
        and posixpath.normpath(p) == p
        and not p.startswith("../")
        and p != ".."
        and not p.startswith(".buildtool/")
    )


class Cache:
    """Blob store + action cache in one directory; thread-safe for parallel workers."""

    def __init__(self, directory: str, warn: Callable[[str], None], restore_mode: str = "copy") -> None:
        self.dir = os.path.join(directory, f"v{FORMAT_VERSION}")
        self._warn = warn
        self.restore_mode = restore_mode
        self.writable = True
        self._reflink = True
        self._made: set[str] = set()
        self.bytes_added = 0  # stored by this process: feeds cache_gc's running size counter
        self._count_mu = threading.Lock()
        self.restore_tmp_dir: str | None = None  # set by the session: restores stage in the state dir
        self._guard = StoreGuard(self.dir)
        try:
            for sub in ("cas", "ac", "tmp"):
                os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        except OSError as e:
            self._disable(f"cache dir {directory} is not usable ({e.strerror})")

    def _disable(self, why: str) -> None:
        if self.writable:
            self.writable = False
            self._warn(f"{why}; caching is off for this build")

    def _blob_path(self, digest: str) -> str:
        return os.path.join(self.dir, "cas", digest[:2], digest)

    def _ac_path(self, key: str) -> str:
        return os.path.join(self.dir, "ac", key[:2], key)

    def _mkparent(self, path: str) -> None:
        d = os.path.dirname(path)
        if d not in self._made:
            os.makedirs(d, exist_ok=True)
            self._made.add(d)

    def storing(self) -> contextlib.AbstractContextManager[None]:
        """Hold while one action's blobs and then its entry are written: GC waits for it."""
        return self._guard.shared()

    def _added(self, n: int) -> None:
        with self._count_mu:
            self.bytes_added += n

    def _tmp(self) -> str:
        return os.path.join(self.dir, "tmp", f"{os.getpid()}.{time.monotonic_ns()}.{id(object())}")

    # -- action entries --------------------------------------------------------------
    def get_action(self, key: str) -> ActionEntry | None:
        path = self._ac_path(key)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._warn(f"cache entry {key[:12]} unreadable ({e.strerror}); treating it as a miss")
            return None
        try:
            obj = json.loads(raw)
            if obj.get("v") != FORMAT_VERSION:
                raise ValueError("version")
            outs = []
            for p, d, m in obj["outputs"]:
                if not safe_rel_path(p):
                    self._warn(f"cache entry {key[:12]} names a path outside the workspace ({p!r}); ignoring it")
                    return None
                if not isinstance(d, str) or len(d) != 64 or m not in (0o644, 0o755):
                    raise ValueError("output")
                outs.append(CachedOutput(p, d, m))
            entry = ActionEntry(tuple(outs), float(obj["duration"]), obj.get("stdout"), obj.get("stderr"))
        except (ValueError, KeyError, TypeError):
            self._warn(f"cache entry {key[:12]} is corrupt or of another version; treating it as a miss")
            self._remove(path)
            return None
        try:
            os.utime(path)  # recency for LRU eviction
        except OSError:
            pass
        return entry

    def put_action(self, key: str, entry: ActionEntry) -> None:
        if not self.writable:
            return
        obj = {
            "v": FORMAT_VERSION,
            "outputs": [[o.path, o.digest, o.mode] for o in entry.outputs],
            "duration": round(entry.duration, 4),
            "stdout": entry.stdout,
            "stderr": entry.stderr,
        }
        self._write_atomic(self._ac_path(key), json.dumps(obj, separators=(",", ":")).encode())

    # -- blobs -----------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return os.path.exists(self._blob_path(digest))

    def put_bytes(self, data: bytes, digest: str) -> None:
        if self.writable and not self.has_blob(digest):
            self._write_atomic(self._blob_path(digest), data, mode=0o444)

    def put_file(self, src: str, digest: str) -> None:
        """Store a file's content under its (already computed) digest."""
        if not self.writable:
            return
        dest = self._blob_path(digest)
        if os.path.exists(dest):
            return
        tmp = self._tmp()
        try:
            self._mkparent(dest)
            self._clone_or_copy(src, tmp)
            os.chmod(tmp, 0o444)
            size = os.stat(tmp).st_size
            os.replace(tmp, dest)
            self._added(size)
        except OSError as e:
            self._remove(tmp)
            self._write_failed(e)

    def read_blob(self, digest: str) -> bytes | None:
        path = self._blob_path(digest)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        from buildtool.digest import hash_bytes

        if hash_bytes(data) != digest:
            self._warn(f"cache blob {digest[:12]} is corrupt; removing it")
            self._remove(path)
            return None
        return data

    def restore(self, digest: str, dest: str, mode: int) -> bool:
        """Copy (or reflink / hardlink) a verified blob to ``dest``; False on a miss."""
        blob = self._blob_path(digest)
        try:
            actual = hash_file(blob)
        except OSError:
            return False
        if actual != digest:
            self._warn(f"cache blob {digest[:12]} does not match its digest; removing it and rerunning")
            self._remove(blob)
            return False
        tmp = f"{dest}.buildtool-tmp"
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = self._restore_tmp(dest)
            self._remove(tmp)
            if self.restore_mode == "hardlink" and mode == 0o644:
                try:
                    os.link(blob, tmp)
                except OSError:
                    self._clone_or_copy(blob, tmp)
                    os.chmod(tmp, mode)
            else:
                self._clone_or_copy(blob, tmp)
                os.chmod(tmp, mode)
            os.replace(tmp, dest)
        except OSError as e:
            self._remove(tmp)
            self._warn(f"could not restore {dest} from the cache ({e.strerror}); rerunning")
            return False
        return True

    def _restore_tmp(self, dest: str) -> str:
        """Stage restores in the state dir (same filesystem), so a build killed mid-restore
        leaves no stray file among the sources; else beside ``dest``."""
        d = self.restore_tmp_dir
        if d is not None:
            try:
                os.makedirs(d, exist_ok=True)
                if os.stat(d).st_dev == os.stat(os.path.dirname(dest)).st_dev:
                    return os.path.join(d, f"restore.{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}")
            except OSError:
                pass
        return f"{dest}.buildtool-tmp"

    # -- helpers ---------------------------------------------------------------------
    def _clone_or_copy(self, src: str, dest: str) -> None:
        if self._reflink:
            try:
                with open(src, "rb") as fs, open(dest, "wb") as fd:
                    fcntl.ioctl(fd.fileno(), FICLONE, fs.fileno())
                return
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                    raise
                self._reflink = False  # EOPNOTSUPP, EXDEV, EINVAL, ENOTTY: no reflinks here
        shutil.copyfile(src, dest)

    def _write_atomic(self, dest: str, data: bytes, mode: int = 0o644) -> None:
        tmp = self._tmp()
        try:
            self._mkparent(dest)
            with open(tmp, "wb") as f:
                f.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, dest)
            self._added(len(data))
        except OSError as e:
            self._remove(tmp)
            self._write_failed(e)

    def _write_failed(self, e: OSError) -> None:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
            self._disable(f"cannot write to the cache ({e.strerror})")
        else:
            self._warn(f"cache write failed ({e.strerror}); continuing without it")

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass
