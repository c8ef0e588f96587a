"""Cache GC: keeps the shared cache under a size cap by LRU eviction, and reports its stats.

Files it owns under ``<cache>/v2/`` (spec: docs/formats.md#cache-gc-files--cachev2-cache_gcpy):

    gc.lock   flock: *shared* while a build stores one action (its blobs, then its entry),
              *exclusive* while GC deletes, so GC never removes a blob that an entry being
              written is about to point at
    size      a running byte counter: builds add what they stored, at their end and every
              few seconds before (``size.lock`` serialises the update), so the end-of-build
              check is one small read, not a scan
    stats     JSON lines, one per build: ran / restored / up_to_date counts, bytes added

Eviction: action entries are sorted by their ``used`` time (stored, or hit by a build:
actiondb.py), the least recently used are deleted first (of those used at the same time,
the smallest that alone is enough, else the one freeing the most bytes), and a blob is deleted once no
surviving entry references it.  An action database that cannot be read stops GC: it
must never take every blob for unreferenced.
Blobs referenced by no entry at all (left by a killed build) and temp files older than an
hour are garbage.  A build whose restore loses a race with GC sees a missing blob, which
is a miss: it reruns the command.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import threading
import time

from buildtool.atomic import share
from buildtool.workspace import open_regular, remove_if_not_a_file

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

    from buildtool.actiondb import ActionDB

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


STORE_WAIT_S = 2.0  # how long a store waits for a running gc before the build stores nothing


class StoreGuard:
    """The shared side of ``gc.lock``, counted across the worker threads of one build
    (flock locks belong to an open file, so one fd is shared and locked 0->1, unlocked 1->0).

    While a gc holds the lock (a large or stopped ``cache gc``), a store waits at most
    ``STORE_WAIT_S`` and then yields False: the result is not stored (cache trouble is a
    miss, never a hang: the wait ran on the scheduler's thread, where no signal could stop
    it).  After one such wait, stores only try the lock until it is free again."""

    def __init__(self, v_dir: str, warn: Callable[[str], None] | None = None) -> None:
        self.path = os.path.join(v_dir, "gc.lock")
        self._warn = warn
        self._mu = threading.Lock()
        self._count = 0
        self._fd: int | None = None
        self._busy = False  # the last attempt found a gc holding the lock

    @contextlib.contextmanager
    def shared(self) -> Iterator[bool]:
        """Yields True while the lock is held (or cannot be had at all: a read-only cache,
        where nothing is written anyway), False if a gc kept it for the whole wait."""
        if not self.acquire():
            yield False
            return
        try:
            yield True
        finally:
            self.release()

    def acquire(self) -> bool:
        """One more holder (``shared`` without the block: the cache's queue of entries to
        write holds it from its first entry until they are written); False if a gc kept
        the lock for the whole wait (then nothing is held)."""
        with self._mu:
            held = self._count > 0 or self._take()
            if held:
                self._count += 1
            return held

    def close(self) -> None:
        """Let go of the lock file (nothing held: a holder still counted keeps it open)."""
        with self._mu:
            if self._count == 0 and self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None

    def release(self) -> None:
        with self._mu:
            self._count -= 1
            if self._count == 0 and self._fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _take(self) -> bool:
        try:
            if self._fd is None:
                self._fd = _lock_fd(self.path)
        except OSError:
            return True  # a read-only cache: nothing will be written anyway
        deadline = time.monotonic() + (0.0 if self._busy else STORE_WAIT_S)
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                if not self._busy and self._warn is not None:
                    self._warn(f"cache: a cache gc holds {self.path}; results are not stored until it is done")
                self._busy = True
                return False
            except OSError:
                return True  # (as a read-only cache)
            if self._busy and self._warn is not None:
                self._warn("cache: the cache gc is done; storing results again")
            self._busy = False
            return True


def _lock_fd(path: str) -> int:
    """A descriptor of the lock file ``path`` (made if missing, with the team's bits when
    the umask shares: ``atomic.share``); read-only where another user's file is not
    writable to this one: flock needs no write access."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except IsADirectoryError:  # (damaged: every build warned "cache maintenance failed", twice)
        remove_if_not_a_file(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    share(fd)
    return fd


@contextlib.contextmanager
def _exclusive(path: str, timeout_s: float, waiting: Callable[[], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive flock on ``path``; yields False if not obtained within the timeout
    (busy); ``waiting`` is called once if it has to wait.  A lock file that cannot be
    opened or locked at all (a read-only cache, a directory in its place) raises the
    OSError: retrying would not help, and "busy" misled."""
    fd = _lock_fd(path)
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
                if waiting is not None:
                    waiting()
                    waiting = None
                time.sleep(0.05)
        yield True
    finally:
        os.close(fd)


# -- the running size counter -------------------------------------------------------------
def read_counter(v_dir: str) -> int | None:
    try:
        with open_regular(os.path.join(v_dir, "size"), "r", encoding="utf-8") as f:
            if f.readline() != SIZE_HEADER:
                return None
            n = json.loads(f.read())["bytes"]
            return n if isinstance(n, int) and n >= 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def add_to_counter(v_dir: str, n: int) -> bool:
    """Add ``n`` bytes to the running counter during a build (Cache.count_stored); False
    (nothing added) if another build holds ``size.lock`` or there is no counter to add to
    (the end of the build scans then)."""
    try:
        with _exclusive(os.path.join(v_dir, "size.lock"), 0.0) as got:
            total = read_counter(v_dir) if got else None
            if total is None:
                return False
            _write_counter(v_dir, total + n)
            return True
    except OSError:
        return False


def start_counter(v_dir: str) -> None:
    """A cache dir just made is empty: its size counter starts at 0, so the end of the
    first build adds what it stored instead of scanning everything it stored."""
    _write_counter(v_dir, 0)


def _write_counter(v_dir: str, n: int) -> None:
    path = os.path.join(v_dir, "size")
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(SIZE_HEADER + json.dumps({"bytes": max(n, 0)}) + "\n")
        os.replace(tmp, path)
    except OSError:  # (a full disk): no counter at all, so the next reader scans, not a stale one
        for p in (tmp, path):
            with contextlib.suppress(OSError):
                os.unlink(p)


# -- scanning and eviction ----------------------------------------------------------------
class Scan:
    """What a walk of the cache found: action entries, blobs, their sizes, corrupt entries."""

    __slots__ = ("blob_bytes", "blobs", "corrupt", "entries", "entry_bytes")

    def __init__(self) -> None:
        self.entries: list[tuple[int, str, int, tuple[str, ...]]] = []  # used, key, size, refs
        self.blobs: dict[str, int] = {}  # digest -> size
        self.entry_bytes = 0
        self.blob_bytes = 0
        self.corrupt: list[str] = []  # keys of entries that do not parse

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
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def _actions(v_dir: str, refused: list[str] | None = None) -> ActionDB:
    """The action database, quietly (``refused``: gets why it refused a change, if it did)."""
    from buildtool.actiondb import ActionDB

    return ActionDB(v_dir, lambda _msg: None, refused.append if refused is not None else lambda _msg: None)


_SHARD = re.compile("[0-9a-f]{2}")
_BLOB = re.compile("[0-9a-f]{64}")


def scan(v_dir: str, actions: ActionDB | None = None) -> Scan:
    """Entries (from the action database) and blobs; ActionDBError (an OSError) if the
    database cannot be read, so that no blob is ever taken for unreferenced by mistake."""
    s = Scan()
    db = actions or _actions(v_dir)
    try:
        rows = db.rows()
        described = db.description_sizes()  # (an entry's description is evicted with it: weighed with it)
    finally:
        if actions is None:
            db.close()
    for key, used, raw in rows:
        refs = _refs_of(raw)
        if refs is None:
            s.corrupt.append(key)
            continue
        size = len(raw) + described.get(key, 0)
        s.entries.append((used, key, size, refs))
        s.entry_bytes += size
    base = os.path.join(v_dir, "cas")
    try:  # (never through a link: what gc deletes must be the cache's own; one planted in a
        # team's or a restored cache led it to empty another directory)
        shards = [] if os.path.islink(base) else os.listdir(base)
    except OSError:
        shards = []
    for shard in shards:
        d = os.path.join(base, shard)
        if not _SHARD.fullmatch(shard) or os.path.islink(d):
            continue
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if not name.startswith(shard) or not _BLOB.match(name):  # (a digest, or a temp file named after one)
                continue
            try:
                size = os.lstat(os.path.join(d, name)).st_size
            except OSError:
                continue
            s.blobs[name] = size
            s.blob_bytes += size
    return s


class GcResult:
    """What a collection did: bytes before and after, and what it deleted."""

    __slots__ = ("after", "before", "blobs_deleted", "blobs_kept", "db_refused", "db_shrunk", "entries_evicted",
                 "entries_kept", "garbage_blobs", "tmp_deleted", "undeletable")

    def __init__(self, before: int, after: int) -> None:
        self.before = before
        self.after = after
        self.entries_evicted = 0
        self.entries_kept = 0  # evicted but left in a database that refused to change: their blobs went
        self.blobs_deleted = 0
        self.garbage_blobs = 0
        self.tmp_deleted = 0
        self.db_shrunk = 0  # bytes the action database gave back (evicted entries' free pages)
        self.blobs_kept = 0  # blobs to delete that could not be (another user's shard, say): still counted
        self.undeletable = ""  # the first of those, and why
        self.db_refused = ""  # why the database refused to drop the entries_kept (SQLite's words)


def _unlink(p: str, failed: list[str] | None = None) -> bool:
    """Delete ``p``; False if it was not there or could not be deleted (``failed`` gets
    the path and why, for the latter)."""
    try:
        os.unlink(p)
        return True
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        import shutil

        shutil.rmtree(p, ignore_errors=True)
        return True
    except OSError as e:
        if failed is not None:
            failed.append(f"{p}: {e.strerror}")
        return False


def collect(v_dir: str, target: int | None) -> GcResult:
    """Evict LRU entries until the cache holds at most ``target`` bytes (None: only garbage).
    The caller holds ``gc.lock`` exclusively."""
    refused: list[str] = []
    db = _actions(v_dir, refused)
    try:
        res = _collect(v_dir, target, db)
    finally:
        db.close()
    if res.entries_kept and refused:
        res.db_refused = refused[0]
    return res


def _collect(v_dir: str, target: int | None, db: ActionDB) -> GcResult:
    s = scan(v_dir, db)
    res = GcResult(before=s.total, after=s.total)
    now = time.time()
    tmp_dir = os.path.join(v_dir, "tmp")
    with contextlib.suppress(OSError):
        for name in ([] if os.path.islink(tmp_dir) else os.listdir(tmp_dir)):  # (a planted link: not ours)
            p = os.path.join(tmp_dir, name)
            with contextlib.suppress(OSError):
                if now - os.lstat(p).st_mtime > TMP_MAX_AGE_S and _unlink(p):
                    res.tmp_deleted += 1
    db.remove(s.corrupt)
    db.drop_stray_hits()
    refcount: dict[str, int] = {}
    for _, _, _, refs in s.entries:
        for d in set(refs):
            refcount[d] = refcount.get(d, 0) + 1
    total = s.total

    failed: list[str] = []

    def drop_blob(d: str) -> int:
        """Delete blob ``d``; the bytes that freed (none when it could not be deleted: it
        still takes its room, and is counted so)."""
        size = s.blobs.pop(d, None)
        if size is None:
            return 0
        if _unlink(os.path.join(v_dir, "cas", d[:2], d), failed):
            res.blobs_deleted += 1
            return size
        if failed and not res.undeletable:
            res.undeletable = failed[0]
        res.blobs_kept += len(failed)
        failed.clear()
        return 0

    # Blobs no entry references: a build killed between its blobs and its entry.
    for d in [d for d in s.blobs if d not in refcount]:
        total -= drop_blob(d)
        res.garbage_blobs += 1
    if target is not None and total > target:
        entry_bytes = 0  # (what the evicted entries themselves take, in the database)
        evicted: list[str] = []
        unreferenced: list[str] = []
        # Least recently used first.  Of entries used at the same moment (one build stores
        # its entries in batches, each with one time), the smallest that alone brings the
        # cache under the cap, else the one freeing the most bytes: by key, 33 small test
        # passes went before the one large blob that alone was over the cap, and by size
        # alone a 2 MB entry went where one of 200 KB was enough.
        def frees(e: tuple[int, str, int, tuple[str, ...]]) -> int:
            return e[2] + sum(s.blobs.get(d, 0) for d in set(e[3]) if refcount.get(d) == 1)

        def lru_order() -> Iterator[tuple[int, str, int, tuple[str, ...]]]:
            by_time: dict[int, list[tuple[int, str, int, tuple[str, ...]]]] = {}
            for e in s.entries:
                by_time.setdefault(e[0], []).append(e)
            for used in sorted(by_time):
                group = sorted(by_time[used], key=lambda e: (frees(e), e[1]))  # (sizes as the group began)
                sizes = [frees(e) for e in group]
                while group:
                    i = bisect.bisect_left(sizes, total - target) if total > target else 0
                    i = i if i < len(group) else len(group) - 1  # (none frees enough alone: the largest)
                    sizes.pop(i)
                    yield group.pop(i)

        shards: dict[str, bool] = {}

        def deletable(d: str) -> bool:  # (a shard this user may not change: another's, root's)
            shard = d[:2]
            if shard not in shards:
                shards[shard] = os.access(os.path.join(v_dir, "cas", shard), os.W_OK | os.X_OK)
            return shards[shard]

        for _, key, size, refs in lru_order():
            if total <= target:
                break
            if not all(deletable(d) for d in set(refs) if refcount.get(d) == 1 and d in s.blobs):
                continue  # (evicting it frees nothing: each build would evict more and more in vain)
            evicted.append(key)
            total -= size
            entry_bytes += size
            for d in set(refs):
                refcount[d] -= 1
                if refcount[d] == 0:
                    unreferenced.append(d)
                    total -= s.blobs.get(d, 0)
        # Entries first: a blob is only deleted once nothing points at it; a database that
        # refuses (a disk so full its journal cannot grow: when gc is run) keeps its entries,
        # whose blobs go all the same (a missing blob is a miss), and the caller says so.
        if db.remove(evicted):
            res.entries_evicted = len(evicted)
        else:
            res.entries_kept = len(evicted)
            total += entry_bytes
        for d in unreferenced:
            size = s.blobs.get(d, 0)
            kept = res.blobs_kept
            drop_blob(d)
            if res.blobs_kept > kept:
                total += size  # (counted as freed above: it is still there)
    res.db_shrunk = db.compact()  # (the evicted entries' pages, given back to the file system)
    res.after = total
    _write_counter(v_dir, total)
    return res


def _layout_dir(cache_dir: str) -> str:
    from buildtool.cache import LAYOUT

    return os.path.join(cache_dir, LAYOUT)


def gc(cache_dir: str, max_size: int | None, timeout_s: float = 60.0,
       waiting: Callable[[], None] | None = None) -> GcResult | None:
    """``buildtool cache gc``: None if the cache stayed busy for ``timeout_s``; ``waiting``
    is called once if builds storing into it make it wait."""
    v_dir = _layout_dir(cache_dir)
    if not os.path.isdir(v_dir):
        return GcResult(0, 0)
    with _exclusive(os.path.join(v_dir, "gc.lock"), timeout_s, waiting) as got:
        if not got:
            return None
        return collect(v_dir, max_size)


# -- end-of-build hook --------------------------------------------------------------------
def after_build(
    cache: Any, max_size: int | None, outcomes: Iterable[Any], warn: Callable[[str], None], rescan: bool = False,
) -> None:
    """End of a build: append its stats line, add what it stored to the size counter, and
    evict down to ``LOW_WATER * max_size`` if the counter is over the cap.  Never raises:
    cache trouble is a warning.  ``cache`` is a cache.Cache, ``outcomes`` outcome.Outcomes.
    ``rescan``: a build killed in this workspace before this one left what it stored since
    its last count uncounted (killed builds' losses added up: a cache 5.7x its cap, its
    counter near 0): the counter is made anew by a scan."""
    from buildtool.outcome import Reason, Status

    cache.flush()  # (first: it writes the entries still queued, which count as added)
    added, counted = cache.bytes_added, cache.bytes_counted  # (counted: added to the counter already)
    cache.bytes_added = cache.bytes_counted = 0  # watch mode reuses the Cache
    if not cache.writable and not added:  # (what it stored before it could not store more still counts)
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
    v_dir = cache.dir
    try:
        _append_stats(v_dir, {"v": STATS_VERSION, "t": round(time.time(), 3), "bytes_added": added, **counts})
        with _exclusive(os.path.join(v_dir, "size.lock"), 5.0) as got:
            if not got:
                return
            n = None if rescan and max_size is not None else read_counter(v_dir)
            if n is None:  # first build with this cache, a damaged counter, a killed build's: one scan
                n = scan(v_dir).total
            else:
                n += added - counted
            _write_counter(v_dir, n)
            _trim_stats(v_dir)
        if max_size is not None and n > max_size:
            with _exclusive(os.path.join(v_dir, "gc.lock"), 2.0) as got:
                if not got:
                    warn("the cache is over its max_size but busy; eviction postponed to a later build")
                    return
                res = collect(v_dir, int(max_size * LOW_WATER))
                if res.entries_kept:  # (a full disk: the database could not change)
                    warn(f"the cache's database could not be changed: {res.entries_kept} entries over max_size "
                         "stay, their blobs deleted (each a miss)")
                if res.blobs_kept:
                    warn(f"{res.blobs_kept} cache blob(s) could not be deleted (first: {res.undeletable}); the "
                         "cache stays over its max_size")
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC):
            where = f" on {e.filename}" if e.filename else ""  # (a directory where `stats` goes: which)
            warn(f"cache maintenance failed{where} ({e.strerror or e}); continuing")


def _append_stats(v_dir: str, obj: dict[str, Any]) -> None:
    line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    path = os.path.join(v_dir, "stats")
    # (O_NONBLOCK: a named pipe there is ENXIO, not a wait for a reader; it is removed, and
    # the next build's line starts a new file.  O_NOFOLLOW: a link planted in a shared cache
    # had each build append to the file it led to, anywhere; the link is removed.)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW,
                     0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            os.unlink(path)
            return
        if e.errno not in (errno.ENXIO, errno.EISDIR):  # (a directory there: every build warned, none repaired it)
            raise
        remove_if_not_a_file(path)
        return
    share(fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            remove_if_not_a_file(path)
            return
        os.write(fd, line)  # one write of a short line: O_APPEND keeps concurrent builds' lines whole
    finally:
        os.close(fd)


def _trim_stats(v_dir: str) -> None:
    path = os.path.join(v_dir, "stats")
    try:
        if os.path.getsize(path) <= STATS_MAX_BYTES:
            return
        with open_regular(path) as f:
            lines = f.read().splitlines(keepends=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.writelines(lines[-STATS_KEEP_LINES:])
        os.replace(tmp, path)
    except OSError:
        pass


def recent_builds(v_dir: str, n: int = RECENT_BUILDS) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        with open_regular(os.path.join(v_dir, "stats")) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for ln in lines[-n:]:
        try:
            obj = json.loads(ln)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("v") == STATS_VERSION and all(
                type(v) is int and 0 <= v < 1 << 62 for k, v in obj.items() if k not in ("v", "t")):
            out.append(obj)  # (a count of another type or size: a damaged or planted line, skipped)
    return out


def stats_report(cache_dir: str, max_size: int | None) -> str:
    v_dir = _layout_dir(cache_dir)
    s = scan(v_dir)
    builds = recent_builds(v_dir)
    ran = sum(int(b.get("ran", 0)) for b in builds)
    restored = sum(int(b.get("restored", 0)) for b in builds)
    adopted = sum(int(b.get("adopted", 0)) for b in builds)  # outputs already there: a hit, nothing copied
    hits = restored + adopted
    lines = [
        f"cache dir:   {cache_dir}",
        f"entries:     {len(s.entries)}",
        f"blobs:       {len(s.blobs)}",
        f"bytes:       {s.total} ({human(s.total)})",
        f"max size:    {'none' if max_size is None else f'{max_size} ({human(max_size)})'}",
    ]
    if builds:
        rate = f"{100.0 * hits / (hits + ran):.1f}%" if hits + ran else "n/a (nothing needed to run)"
        n = len(builds)
        lines.append(f"hit rate:    {rate} over the last {n} build{'s' if n != 1 else ''} ({restored} restored, "
                     f"{adopted} adopted, {ran} ran)")
    else:
        lines.append("hit rate:    n/a (no builds recorded yet)")
    for other in _other_layouts(cache_dir):
        where = os.path.join(cache_dir, other)
        lines.append(f"note:        {where} ({human(_tree_size(where))}) is another buildtool's layout: this one "
                     f"never reads it, counts it nor removes it ('rm -r' it once no buildtool of that layout uses it)")
    return "\n".join(lines)


def _tree_size(top: str) -> int:
    """The bytes of the files under ``top`` (as ``du --apparent-size``; unreadable parts left out)."""
    total = 0
    for d, _, files in os.walk(top):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return total


def _other_layouts(cache_dir: str) -> list[str]:
    """The layout directories (``v<N>``) beside this buildtool's in ``cache_dir``."""
    from buildtool.cache import LAYOUT

    try:
        names = os.listdir(cache_dir)
    except OSError:
        return []
    return sorted(n for n in names if n != LAYOUT and n[:1] == "v" and n[1:].isdigit()
                  and os.path.isdir(os.path.join(cache_dir, n)))
