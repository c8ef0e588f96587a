"""Cache GC: keeps the shared cache under a size cap by LRU eviction, and reports its stats.

Files it owns under ``<cache>/v1/`` (spec: docs/formats.md#cache-gc):

    gc.lock   flock: *shared* while a build stores one action (its blobs, then its entry),
              *exclusive* while GC deletes, so GC never removes a blob that an entry being
              written is about to point at
    size      a running byte counter: builds add what they stored (``size.lock`` serialises
              the update), so the end-of-build check is one small read, not a scan
    stats     JSON lines, one per build: ran / restored / up_to_date counts, bytes added

Eviction: action entries are sorted by mtime (touched on every hit), the least recently
used are deleted first, and a blob is deleted once no surviving entry references it.
Blobs referenced by no entry at all (left by a killed build) and temp files older than an
hour are garbage.  A build whose restore loses a race with GC sees a missing blob, which
is a miss: it reruns the command.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import threading
import time

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

SIZE_HEADER = "# buildtool cache-size v1\n"
STATS_VERSION = 1
LOW_WATER = 0.9  # automatic GC evicts down to this fraction of the cap
TMP_MAX_AGE_S = 3600.0
STATS_MAX_BYTES = 64 * 1024
STATS_KEEP_LINES = 200
RECENT_BUILDS = 20
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$"  # compiled on use: builds never parse a size


def parse_size(v: Any) -> int:
    """``500M``, ``2G``, ``1.5GiB``, ``4096`` or an int -> bytes; ValueError otherwise."""
    if isinstance(v, bool):
        raise ValueError(v)
    if isinstance(v, int):
        if v < 0:
            raise ValueError(v)
        return v
    if not isinstance(v, str):
        raise ValueError(v)
    m = re.match(_SIZE_RE, v, re.IGNORECASE)
    if not m:
        raise ValueError(v)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class StoreGuard:
    """The shared side of ``gc.lock``, counted across the worker threads of one build
    (flock locks belong to an open file, so one fd is shared and locked 0->1, unlocked 1->0)."""

    def __init__(self, v1_dir: str) -> None:
        self.path = os.path.join(v1_dir, "gc.lock")
        self._mu = threading.Lock()
        self._count = 0
        self._fd: int | None = None

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._mu:
            if self._count == 0:
                try:
                    if self._fd is None:
                        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                    fcntl.flock(self._fd, fcntl.LOCK_SH)
                except OSError:
                    pass  # a read-only cache: nothing will be written anyway
            self._count += 1
        try:
            yield
        finally:
            with self._mu:
                self._count -= 1
                if self._count == 0 and self._fd is not None:
                    with contextlib.suppress(OSError):
                        fcntl.flock(self._fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def _exclusive(path: str, timeout_s: float) -> Iterator[bool]:
    """Hold an exclusive flock on ``path``; yields False if not obtained within the timeout."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.05)
            except OSError:
                yield False
                return
        yield True
    finally:
        os.close(fd)


# -- the running size counter -------------------------------------------------------------
def read_counter(v1_dir: str) -> int | None:
    try:
        with open(os.path.join(v1_dir, "size"), encoding="utf-8") as f:
            if f.readline() != SIZE_HEADER:
                return None
            n = json.loads(f.read())["bytes"]
            return n if isinstance(n, int) and n >= 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def start_counter(v1_dir: str) -> None:
    """A cache dir just made is empty: its size counter starts at 0, so the end of the
    first build adds what it stored instead of scanning everything it stored."""
    _write_counter(v1_dir, 0)


def _write_counter(v1_dir: str, n: int) -> None:
    path = os.path.join(v1_dir, "size")
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(SIZE_HEADER + json.dumps({"bytes": max(n, 0)}) + "\n")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


# -- scanning and eviction ----------------------------------------------------------------
class Scan:
    """What a walk of the cache found: action entries, blobs, their sizes, corrupt entries."""

    __slots__ = ("blob_bytes", "blobs", "corrupt", "entries", "entry_bytes")

    def __init__(self) -> None:
        self.entries: list[tuple[float, str, int, tuple[str, ...]]] = []  # mtime, path, size, refs
        self.blobs: dict[str, int] = {}  # digest -> size
        self.entry_bytes = 0
        self.blob_bytes = 0
        self.corrupt: list[str] = []

    @property
    def total(self) -> int:
        return self.entry_bytes + self.blob_bytes


def _refs_of(raw: bytes) -> tuple[str, ...] | None:
    try:
        obj = json.loads(raw)
        refs = [o[1] for o in obj["outputs"]]
        refs += [d for d in (obj.get("stdout"), obj.get("stderr")) if d]
        if not all(isinstance(d, str) for d in refs):
            return None
        kept = obj.get("inline") or {}  # contents inside the entry: no blob to keep alive
        return tuple(d for d in refs if d not in kept)
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def scan(v1_dir: str) -> Scan:
    s = Scan()
    for sub in ("ac", "cas"):
        base = os.path.join(v1_dir, sub)
        try:
            shards = os.listdir(base)
        except OSError:
            continue
        for shard in shards:
            d = os.path.join(base, shard)
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for name in names:
                p = os.path.join(d, name)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if sub == "cas":
                    s.blobs[name] = st.st_size
                    s.blob_bytes += st.st_size
                    continue
                try:
                    with open(p, "rb") as f:
                        refs = _refs_of(f.read())
                except OSError:
                    refs = None
                if refs is None:
                    s.corrupt.append(p)
                    continue
                s.entries.append((st.st_mtime, p, st.st_size, refs))
                s.entry_bytes += st.st_size
    return s


class GcResult:
    """What a collection did: bytes before and after, and what it deleted."""

    __slots__ = ("after", "before", "blobs_deleted", "entries_evicted", "garbage_blobs", "tmp_deleted")

    def __init__(self, before: int, after: int) -> None:
        self.before = before
        self.after = after
        self.entries_evicted = 0
        self.blobs_deleted = 0
        self.garbage_blobs = 0
        self.tmp_deleted = 0


def _unlink(p: str) -> bool:
    try:
        os.unlink(p)
        return True
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        import shutil

        shutil.rmtree(p, ignore_errors=True)
        return True
    except OSError:
        return False


def collect(v1_dir: str, target: int | None) -> GcResult:
    """Evict LRU entries until the cache holds at most ``target`` bytes (None: only garbage).
    The caller holds ``gc.lock`` exclusively."""
    s = scan(v1_dir)
    res = GcResult(before=s.total, after=s.total)
    now = time.time()
    tmp_dir = os.path.join(v1_dir, "tmp")
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp_dir):
            p = os.path.join(tmp_dir, name)
            with contextlib.suppress(OSError):
                if now - os.lstat(p).st_mtime > TMP_MAX_AGE_S and _unlink(p):
                    res.tmp_deleted += 1
    for p in s.corrupt:
        _unlink(p)
    refcount: dict[str, int] = {}
    for _, _, _, refs in s.entries:
        for d in set(refs):
            refcount[d] = refcount.get(d, 0) + 1
    total = s.total

    def drop_blob(d: str) -> None:
        nonlocal total
        size = s.blobs.pop(d, None)
        if size is not None and _unlink(os.path.join(v1_dir, "cas", d[:2], d)):
            total -= size
            res.blobs_deleted += 1

    # Blobs no entry references: a build killed between its blobs and its entry.
    for d in [d for d in s.blobs if d not in refcount]:
        drop_blob(d)
        res.garbage_blobs += 1
    if target is not None and total > target:
        for _, p, size, refs in sorted(s.entries):
            if total <= target:
                break
            if not _unlink(p):
                continue
            total -= size
            res.entries_evicted += 1
            for d in set(refs):
                refcount[d] -= 1
                if refcount[d] == 0:
                    drop_blob(d)
    res.after = total
    _write_counter(v1_dir, total)
    return res


def gc(cache_dir: str, max_size: int | None, timeout_s: float = 60.0) -> GcResult | None:
    """``buildtool cache gc``: None if the cache stayed busy for ``timeout_s``."""
    v1 = os.path.join(cache_dir, "v1")
    if not os.path.isdir(v1):
        return GcResult(0, 0)
    with _exclusive(os.path.join(v1, "gc.lock"), timeout_s) as got:
        if not got:
            return None
        return collect(v1, max_size)


# -- end-of-build hook --------------------------------------------------------------------
def after_build(cache: Any, max_size: int | None, outcomes: Iterable[Any], warn: Callable[[str], None]) -> None:
    """End of a build: append its stats line, add what it stored to the size counter, and
    evict down to ``LOW_WATER * max_size`` if the counter is over the cap.  Never raises:
    cache trouble is a warning.  ``cache`` is a cache.Cache, ``outcomes`` outcome.Outcomes."""
    from buildtool.outcome import Reason, Status

    added, cache.bytes_added = cache.bytes_added, 0  # watch mode reuses the Cache
    if not cache.writable:
        return
    counts = {"ran": 0, "restored": 0, "adopted": 0, "up_to_date": 0, "failed": 0}
    for o in outcomes:
        if o.status is Status.RAN:
            counts["ran"] += 1
        elif o.status is Status.RESTORED:
            counts["restored"] += 1
        elif o.status is Status.UP_TO_DATE and o.reason is Reason.ADOPTED:
            counts["adopted"] += 1
        elif o.status is Status.UP_TO_DATE and o.reason is not Reason.GROUP:
            counts["up_to_date"] += 1
        elif o.status is Status.FAILED:
            counts["failed"] += 1
    v1 = cache.dir
    try:
        _append_stats(v1, {"v": STATS_VERSION, "t": round(time.time(), 3), "bytes_added": added, **counts})
        with _exclusive(os.path.join(v1, "size.lock"), 5.0) as got:
            if not got:
                return
            n = read_counter(v1)
            if n is None:  # first build with this cache, or a damaged counter: one scan
                n = scan(v1).total
            else:
                n += added
            _write_counter(v1, n)
            _trim_stats(v1)
        if max_size is not None and n > max_size:
            with _exclusive(os.path.join(v1, "gc.lock"), 2.0) as got:
                if not got:
                    warn("the cache is over its max_size but busy; eviction postponed to a later build")
                    return
                collect(v1, int(max_size * LOW_WATER))
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC):
            warn(f"cache maintenance failed ({e.strerror}); continuing")


def _append_stats(v1_dir: str, obj: dict[str, Any]) -> None:
    line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    fd = os.open(os.path.join(v1_dir, "stats"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line)  # one write of a short line: O_APPEND keeps concurrent builds' lines whole
    finally:
        os.close(fd)


def _trim_stats(v1_dir: str) -> None:
    path = os.path.join(v1_dir, "stats")
    try:
        if os.path.getsize(path) <= STATS_MAX_BYTES:
            return
        with open(path, "rb") as f:
            lines = f.read().splitlines(keepends=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.writelines(lines[-STATS_KEEP_LINES:])
        os.replace(tmp, path)
    except OSError:
        pass


def recent_builds(v1_dir: str, n: int = RECENT_BUILDS) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        with open(os.path.join(v1_dir, "stats"), "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for ln in lines[-n:]:
        try:
            obj = json.loads(ln)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("v") == STATS_VERSION:
            out.append(obj)
    return out


def stats_report(cache_dir: str, max_size: int | None) -> str:
    v1 = os.path.join(cache_dir, "v1")
    s = scan(v1)
    builds = recent_builds(v1)
    ran = sum(int(b.get("ran", 0)) for b in builds)
    hits = sum(int(b.get("restored", 0)) + int(b.get("adopted", 0)) for b in builds)
    lines = [
        f"cache dir:   {cache_dir}",
        f"entries:     {len(s.entries)}",
        f"blobs:       {len(s.blobs)}",
        f"bytes:       {s.total} ({human(s.total)})",
        f"max size:    {'none' if max_size is None else f'{max_size} ({human(max_size)})'}",
    ]
    if builds:
        rate = f"{100.0 * hits / (hits + ran):.1f}%" if hits + ran else "n/a (nothing needed to run)"
        lines.append(f"hit rate:    {rate} over the last {len(builds)} builds ({hits} restored, {ran} ran)")
    else:
        lines.append("hit rate:    n/a (no builds recorded yet)")
    return "\n".join(lines)
