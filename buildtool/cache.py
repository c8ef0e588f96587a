"""Cache: the shared on-disk content-addressed blob store and action cache.

Layout under the cache dir (shared by every workspace of the user)::

    v2/cas/<d[:2]>/<digest>     blob = file content, named by its BLAKE3 digest
    v2/actions.db               action entries (JSON) by action key, in SQLite (actiondb.py);
                                outputs and streams of up to INLINE_MAX bytes are kept
                                inside the entry, not as blobs
    v2/tmp/                     temp files, renamed into place

Blob writes go to a temp file then ``os.replace``; a blob whose content does not match
its name is a miss (and is removed); an entry that is corrupt, of another version, or
names a path outside the workspace is a miss.  Trouble never fails a build: it warns
and turns caching off or degrades to a miss.  Spec: docs/formats.md#cache-dir
"""

from __future__ import annotations

import binascii
import contextlib
import errno
import fcntl
import json
import os
import posixpath
import stat
import threading
import time

from buildtool.actiondb import ActionDB
from buildtool.atomic import RESTORE_TMP_SUFFIX, make_dirs, remove_path, share, temp_path, write_atomic
from buildtool.cache_gc import StoreGuard, start_counter
from buildtool.digest import hash_bytes, hash_file
from buildtool.keys import compact_loads
from buildtool.workspace import CACHEDIR_SIGNATURE, CACHEDIR_TAG

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from buildtool.staging import Stage

LAYOUT = "v2"  # the directory of this layout inside the cache dir; other layouts live beside it
FORMAT_VERSION = 1  # of an action entry
FICLONE = 0x40049409
SMALL_BLOB = 1 << 20  # restored from one in-memory read (verified from the bytes); larger ones stream
COPY_CHUNK = 8 * 1024 * 1024
# Contents of at most this many bytes are kept inside the action entry (base64), as REAPI's
# inlined outputs: a small action costs one file in the cache instead of one per output
# plus the entry, and file creation is the dearest part of storing it.
INLINE_MAX = 4096
# Action entries stored by a build are written to the database this many at a time, in one
# transaction (and at the end of the build): a commit per entry was ~40 us of the scheduling
# thread per target.  A build killed before a write loses at most these entries: their
# targets' outputs are in the workspace and its record; a later restore of them misses.
QUEUE_MAX = 64
COUNT_EVERY_S = 2.0  # a build adds what it stored to the cache's size counter this often (Cache._added)
COUNT_EVERY_BYTES = 1 << 20  # ... or once it stored this much since the last time,
COUNT_MIN_GAP_S = 0.25  # ... and this long after the last time (a 1 GiB store: not 1,000 counter writes)
QUEUE_MAX_AGE_S = 0.5  # ... or this long after the first of them: a GC waits for them meanwhile
INLINE_TOTAL_MAX = 64 * 1024  # per entry; what does not fit is stored as blobs
_loads = compact_loads()  # json.loads of an action entry (a 10,000-target restore reads 10,000)


class CachedOutput:
    """One output of a cached action; never changed once made, equal to one with the same fields."""

    __slots__ = ("digest", "mode", "path")

    def __init__(self, path: str, digest: str, mode: int) -> None:
        self.path = path  # workspace-relative
        self.digest = digest
        self.mode = mode  # 0o644 or 0o755

    def _fields(self) -> tuple[str, str, int]:
        return self.path, self.digest, self.mode

    def __eq__(self, other: object) -> bool:
        return self._fields() == other._fields() if type(other) is CachedOutput else NotImplemented

    def __hash__(self) -> int:
        return hash(self._fields())


class ActionEntry:
    """A cached successful action: its outputs and captured output streams; never changed
    once made, equal to one with the same fields."""

    __slots__ = ("duration", "inline", "outputs", "stderr", "stdout")

    def __init__(
        self,
        outputs: tuple[CachedOutput, ...],
        duration: float,
        stdout: str | None,
        stderr: str | None,
        inline: dict[str, bytes] | None = None,
    ) -> None:
        self.outputs = outputs
        self.duration = duration
        self.stdout = stdout  # blob digest of captured stdout
        self.stderr = stderr
        self.inline = inline or {}  # digest -> content kept inside the entry (INLINE_MAX)

    def _fields(self) -> tuple[object, ...]:
        return self.outputs, self.duration, self.stdout, self.stderr, frozenset(self.inline.items())

    def __eq__(self, other: object) -> bool:
        return self._fields() == other._fields() if type(other) is ActionEntry else NotImplemented

    def __hash__(self) -> int:
        return hash(self._fields())


_HEX = frozenset("0123456789abcdef")


def is_digest(d: object) -> bool:
    """Whether ``d`` is a BLAKE3 digest as the cache writes one: 64 lowercase hex digits."""
    return isinstance(d, str) and len(d) == 64 and _HEX.issuperset(d)


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


def _own_name(name: str) -> bool:
    """A name buildtool puts in a cache dir: its layouts (v2, and older ones) and the tag."""
    return name == CACHEDIR_TAG or (name[:1] == "v" and name[1:].isdigit())


_TAG_TEXT = (CACHEDIR_SIGNATURE + b"\n# This file is a cache directory tag created by buildtool.\n"
             b"# For information about cache directory tags, see https://bford.info/cachedir/\n")


def _tag(directory: str) -> None:
    """Mark the cache dir as a cache (CACHEDIR.TAG): backup tools skip it, and a cache kept
    inside a workspace stays out of its glob() results and of //... (workspace.py).  A
    cache dir that holds anything besides buildtool's own files (a package or workspace
    named as the cache dir, a user's folder of other things: ``cache_dir = ".."``) is not
    tagged, which would hide them: its ``v2/`` is (and a tag an older buildtool wrote there
    moves to ``v2/``; a tag of anyone else's is left as it is).  A cache dir that cannot be
    written keeps what it has."""
    top = os.path.join(directory, CACHEDIR_TAG)
    try:
        with os.scandir(directory) as entries:
            foreign = any(not _own_name(e.name) for e in entries)
    except OSError:
        return
    if os.path.lexists(top):
        if not foreign or not _ours(top):
            return
        try:
            os.unlink(top)
        except OSError:
            return
    if foreign:
        directory = os.path.join(directory, LAYOUT)
    tag = os.path.join(directory, CACHEDIR_TAG)
    if os.path.isdir(directory) and not os.path.lexists(tag):
        try:
            write_atomic(tag, _TAG_TEXT)
        except OSError:
            pass


def _ours(tag: str) -> bool:
    """Is ``tag`` the CACHEDIR.TAG buildtool writes, byte for byte?"""
    try:  # (not a link, and a named pipe must not block)
        fd = os.open(tag, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(_TAG_TEXT) + 1) == _TAG_TEXT
    except OSError:
        return False
    finally:
        os.close(fd)


class Cache:
    """Blob store + action cache in one directory; thread-safe for parallel workers."""

    def __init__(self, directory: str, warn: Callable[[str], None], restore_mode: str = "copy") -> None:
        self.dir = os.path.join(directory, LAYOUT)
        self._warn = warn
        self.restore_mode = restore_mode
        self.writable = True
        self._reflink = True
        self._said_unreadable = False
        self._made: set[str] = set()  # directories known to exist (cleared when one vanishes)
        self.damage_said = False  # a blob that did not match its digest was warned about (runner: no second word)
        self.bytes_added = 0  # stored by this process: feeds cache_gc's running size counter
        self.bytes_counted = 0  # of which already added to that counter during the build (_added)
        self._counted_at = 0.0  # (monotonic: the first MiB stored is counted at once)
        self._count_mu = threading.Lock()
        # Set by the session: restores create their temp files in the state dir (staging.py).
        self.stage: Stage | None = None
        self._guard = StoreGuard(self.dir, warn)
        self.actions = ActionDB(self.dir, warn, self._disable)
        # key -> (entry, the digests of its blobs in cas/), stored but not yet written (QUEUE_MAX)
        self._queued: dict[str, tuple[bytes, tuple[str, ...]]] = {}
        self._queue_held = False  # the queue holds the store guard (from its first entry to its write)
        self._queue_timerless = False  # its timer's thread was refused: each entry is written at once
        self._queue_mu = threading.Lock()
        self._write_mu = threading.Lock()  # one write of the queue at a time; flush and forget wait for it
        try:
            new = not os.path.isdir(self.dir)
            for sub in ("cas", "tmp", "mf"):  # (mf/, the depfile targets' manifests: made when first used)
                d = os.path.join(self.dir, sub)
                if not new and os.path.isfile(d) and not os.path.islink(d):
                    os.unlink(d)  # a file where the cache's own layout has a directory: the cache's to replace
                    # (not a link: one to a disk not mounted now is the user's set-up, left alone)
                    warn(f"cache: {d} was not a directory; replaced it with one")
                if sub != "mf":
                    os.makedirs(d, exist_ok=True)
            if new:
                for d in (directory, self.dir, os.path.join(self.dir, "cas"), os.path.join(self.dir, "tmp")):
                    share(d)  # (made after the commands' umask was set, in a later watch cycle: the team's too)
                start_counter(self.dir)
        except OSError as e:
            where = f" at {e.filename}" if e.filename else ""
            db = os.path.join(self.dir, "actions.db")  # (a read-only cache that has one is still read)
            self._disable(f"cache dir {directory} is not usable ({e.strerror}{where})",
                          reads_too=not (os.path.isfile(db) and os.access(db, os.R_OK)))
        _tag(directory)

    def _disable(self, why: str, reads_too: bool = False) -> None:
        """Store nothing more this build, said once; ``reads_too``: nothing will be found in
        it either (its layout could not be made, and it holds no readable database)."""
        if self.writable:
            self.writable = False
            off = "caching is off" if reads_too or not self.actions.readable else "nothing is stored in the cache"
            self._warn(f"{why}; {off} for the rest of this build")

    def _blob_path(self, digest: str) -> str:
        return os.path.join(self.dir, "cas", digest[:2], digest)

    def _mkdir(self, d: str) -> None:
        if d not in self._made:
            try:
                make_dirs(d)  # (an output's directory may be 1,000 levels deep: os.makedirs recurses)
            except FileExistsError:
                # A file where a shard of cas/ goes (damage, a hand): every store into it
                # failed, on every build; the cache's own layout is the cache's to repair.
                if os.path.islink(d) and d.startswith(self.dir + os.sep):  # (a dangling one said "File exists")
                    raise OSError(errno.ELOOP, "a symbolic link where the cache keeps a directory", d) from None
                if os.path.dirname(d) != os.path.join(self.dir, "cas"):
                    raise
                try:
                    os.unlink(d)
                    self._warn(f"cache: {d} was not a directory; replaced it with one")
                except (FileNotFoundError, IsADirectoryError):
                    pass  # (another build repaired it first)
                make_dirs(d)
            if d.startswith(self.dir + os.sep):  # (a shard of cas/: the team's too, if the umask shares)
                if os.path.islink(d):  # (planted: blobs would be written, and modes changed, where it leads)
                    raise OSError(errno.ELOOP, "a symbolic link where the cache keeps a directory", d)
                share(d)
            self._made.add(d)

    def _mkparent(self, path: str) -> None:
        self._mkdir(os.path.dirname(path))

    def _forget_dirs(self) -> None:
        """A memoised directory was removed (the state dir's tmp/ goes after each build)."""
        self._made.clear()
        if self.stage is not None:
            self.stage.forget()

    def storing(self) -> contextlib.AbstractContextManager[bool]:
        """Hold while one action's blobs and then its entry are written: GC waits for it.
        False (store nothing) while a running GC keeps the cache (cache_gc.StoreGuard)."""
        return self._guard.shared()

    def _added(self, n: int) -> None:
        with self._count_mu:
            self.bytes_added += n
            since = time.monotonic() - self._counted_at
            due = since >= COUNT_EVERY_S or \
                (since >= COUNT_MIN_GAP_S and self.bytes_added - self.bytes_counted >= COUNT_EVERY_BYTES)
        if due:
            self.count_stored()

    def count_stored(self) -> None:
        """Add what this build stored so far to the cache's running size counter (as a build
        ends, and before: every COUNT_EVERY_S, or every COUNT_EVERY_BYTES at most every
        COUNT_MIN_GAP_S; a build killed before its end left its blobs uncounted, and the
        cache grew past its max_size for good); skipped while another build updates the
        counter, or when there is none (the end scans)."""
        from buildtool.cache_gc import add_to_counter

        with self._count_mu:
            n, self._counted_at = self.bytes_added - self.bytes_counted, time.monotonic()
            self.bytes_counted += n
        if n and not add_to_counter(self.dir, n):
            with self._count_mu:
                self.bytes_counted -= n  # (left for the next try, or the end of the build)

    def _tmp(self) -> str:
        return os.path.join(self.dir, "tmp", f"{os.getpid()}.{time.monotonic_ns()}.{id(object())}")

    # -- action entries --------------------------------------------------------------
    def get_action(self, key: str) -> ActionEntry | None:
        with self._queue_mu:
            queued = self._queued.get(key)
        # (a hit in the database is remembered as recent use, for LRU eviction)
        raw = queued[0] if queued is not None else self.actions.get(key)
        if raw is None:
            return None
        try:
            obj = _loads(raw)
            if obj.get("v") != FORMAT_VERSION:
                raise ValueError("version")
            if obj.get("key", key) != key:  # (entries written before the key was kept have none)
                other = str(obj["key"])
                n = 12 if other[:12] != key[:12] else max(len(key), len(other))  # (a prefix alike hid which)
                self.actions.damaged(f"the entry looked up under {key[:n]} is {other[:n]}'s")
                return None
            outs = []
            for p, d, m in obj["outputs"]:
                if not safe_rel_path(p):
                    self._warn(f"cache entry {key[:12]} names a path outside the workspace ({p!r}); deleting it")
                    self.actions.remove([key])  # (kept, it was warned about twice a build, every build)
                    return None
                # (a digest names a blob's file: anything but 64 hex digits could name another path)
                if not is_digest(d) or type(m) is not int or m not in (0o644, 0o755):
                    raise ValueError("output")
                outs.append(CachedOutput(p, d, m))
            inline = {}
            for d, text in (obj.get("inline") or {}).items():
                if not is_digest(d) or not isinstance(text, str):
                    raise ValueError("inline")
                inline[d] = binascii.a2b_base64(text)  # binascii.Error is a ValueError
            streams = obj.get("stdout"), obj.get("stderr")
            if not all(d is None or d == "" or is_digest(d) for d in streams):
                raise ValueError("stdout/stderr")
            duration = float(obj["duration"])  # (an int too large for a float: OverflowError)
            if not 0 <= duration < float("inf"):  # NaN and Infinity went on into the record and plans
                raise ValueError("duration")
            entry = ActionEntry(tuple(outs), duration, streams[0], streams[1], inline)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError):
            self._warn(f"cache entry {key[:12]} is corrupt or of another version; treating it as a miss")
            self.actions.remove([key])
            return None
        return entry

    def put_action(self, key: str, entry: ActionEntry) -> None:
        """Store ``entry`` under ``key``: queued, written with the next QUEUE_MAX or at
        ``write_queued``; looked up from the queue meanwhile."""
        if not self.writable:
            return
        raw = self.encode_entry(key, entry)
        blobs = {o.digest for o in entry.outputs} | {d for d in (entry.stdout, entry.stderr) if d}
        with self._queue_mu:
            if not self._queue_held:  # the first of a batch: until it is written, a GC would find
                # its blobs (written already) named by no entry, and delete them as a killed build's
                if not self._guard.acquire():  # (held already by the caller's store: no wait)
                    return  # (a GC holds the cache: not stored, said once, as for one store)
                self._queue_held = True
                timer = threading.Timer(QUEUE_MAX_AGE_S, self.write_queued)
                timer.daemon = True
                try:
                    timer.start()
                except RuntimeError:  # (no thread for the timer: a limit on threads) written now, one by one
                    self._queue_timerless = True
            self._queued[key] = (raw, tuple(d for d in blobs if d not in entry.inline))
            full = len(self._queued) >= QUEUE_MAX or self._queue_timerless
        if full:
            self.write_queued()

    @staticmethod
    def encode_entry(key: str, entry: ActionEntry) -> bytes:
        """The database's bytes of ``entry`` (docs/formats.md#cache-dir)."""
        obj = {
            "v": FORMAT_VERSION,
            "key": key,  # checked on reading: a damaged index must not hand out another action's entry
            "outputs": [[o.path, o.digest, o.mode] for o in entry.outputs],
            "duration": round(entry.duration, 4),
            "stdout": entry.stdout,
            "stderr": entry.stderr,
        }
        if entry.inline:
            obj["inline"] = {d: binascii.b2a_base64(b, newline=False).decode() for d, b in entry.inline.items()}
        return json.dumps(obj, separators=(",", ":")).encode()

    def write_queued(self) -> None:
        """Write the queued entries in one transaction and let go of the store guard, which
        the queue held since its first entry (no GC deleted their blobs meanwhile); only
        those whose blobs are all still there (removed by hand: an entry must never point
        at a blob that is not there).  Written even when storing stopped since (a full
        disk): their blobs were stored before it."""
        with self._write_mu:  # (the timer's write in progress: a flush returned before it was done)
            with self._queue_mu:
                batch, self._queued = self._queued, {}
                held, self._queue_held = self._queue_held, False
            if not held:
                return
            stored = 0
            try:
                if batch:
                    rows = [(k, raw) for k, (raw, blobs) in batch.items()
                            if all(os.path.exists(self._blob_path(d)) for d in blobs)]
                    stored = self.actions.put_many(rows)
            finally:
                self._guard.release()
            if stored:
                self._added(stored)

    def forget_action(self, key: str) -> None:
        """Delete the entry of ``key`` (a test that failed with it: its earlier pass must not
        answer another checkout sharing this cache); trouble is a warning, as ever."""
        with self._write_mu:  # (not between a write's taking its batch and writing it: it came back)
            with self._queue_mu:
                self._queued.pop(key, None)  # (the guard stays the queue's until write_queued, empty or not)
            self.actions.remove([key])

    def close(self) -> None:
        """Write what is queued, close the database and the lock file (watch mode makes a
        new Cache each cycle: each left its gc.lock descriptor open)."""
        self.flush()
        self.actions.close()
        self._guard.close()

    def flush(self) -> None:
        """End of a build: write the entries still queued, then record which entries were hit
        (recency for GC), and the durations noted."""
        self.write_queued()
        self.actions.flush()

    def note_durations(self, durations: Iterable[tuple[str, float]]) -> None:
        """How long these targets' commands took (label, seconds): the weights of a build
        that has no record of them (actiondb's durations table), stored at ``flush``."""
        if self.writable:
            self.actions.note_durations(durations)

    def durations(self, labels: Iterable[str]) -> dict[str, float]:
        """The durations the cache holds for these labels (noted by any workspace using it)."""
        return self.actions.durations(labels) if self.actions.readable else {}

    def note_descriptions(self, described: Iterable[tuple[str, str, str]]) -> None:
        """The actions these targets stored (label, key, description JSON): what a later
        miss with no record of its own is compared with (actiondb's descriptions table).
        Their bytes count as stored (cache_gc's running size: GC weighs them too; a row
        replaced is counted again, on the safe side)."""
        if self.writable:
            rows = list(described)
            self.actions.note_descriptions(rows)
            self._added(sum(len(lab) + len(d) for lab, _, d in rows))

    def described_labels(self) -> frozenset[str]:
        return self.actions.described_labels() if self.actions.readable else frozenset()

    def description(self, label: str) -> tuple[str, str] | None:
        """(key, description JSON) of the last action stored for ``label`` by any workspace."""
        return self.actions.description(label) if self.actions.readable else None

    # -- blobs -----------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        """Is the blob there for a restore to read?  (One this user cannot read, mode 000,
        is not: a store replaces it, where its targets reran on every build.)"""
        return os.access(self._blob_path(digest), os.R_OK)

    def lost_blobs(self, entry: ActionEntry) -> bool:
        """Whether a blob ``entry`` names (not inline) is not in ``cas/``."""
        return any(o.digest not in entry.inline and not os.path.lexists(self._blob_path(o.digest))
                   for o in entry.outputs)

    def blobs_smaller_than(self, entry: ActionEntry, limit: int) -> bool:
        """True if every output blob of ``entry`` is present and under ``limit`` bytes
        (cheap enough to restore on the scheduler's thread)."""
        for o in entry.outputs:
            if o.digest in entry.inline:
                continue
            try:
                if os.stat(self._blob_path(o.digest)).st_size >= limit:
                    return False
            except OSError:
                return False
        return True

    def put_bytes(self, data: bytes, digest: str) -> bool:
        """Store ``data`` under its digest; whether the blob is in the cache now."""
        if not self.writable:
            return False
        return self.has_blob(digest) or self._write_atomic(self._blob_path(digest), data, mode=0o444, blob=True)

    def put_file(self, src: str, digest: str) -> bool:
        """Store a file's content under its (already computed) digest; whether the blob is
        in the cache now (an entry must never point at a blob that could not be written)."""
        if not self.writable:
            return False
        dest = self._blob_path(digest)
        if self.has_blob(digest):
            return True
        tmp = self._tmp()
        try:
            self._mkparent(dest)
            fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
            try:
                st = self._write_new(tmp, dest, 0o444, lambda out: self._clone_or_copy(fd, out))
            finally:
                os.close(fd)
            self._added(st.st_size)
            return True
        except OSError as e:
            remove_path(tmp)
            if _kept_unreadable(e, dest):
                return True
            self.write_failed(e, dest)
            return False

    @staticmethod
    def read_small(path: str) -> bytes | None:
        """The content of a file of at most INLINE_MAX bytes (to keep inside an action
        entry); None if it is larger or unreadable."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.read(fd, INLINE_MAX + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if len(data) <= INLINE_MAX else None

    def stream(self, entry: ActionEntry, digest: str | None) -> bytes | None:
        """A captured stdout/stderr of ``entry`` (inline or a blob): b"" when the action
        printed nothing, None when its blob is missing or damaged."""
        if not digest:
            return b""
        data = entry.inline.get(digest)
        if data is not None:
            return data if hash_bytes(data) == digest else None
        return self.read_blob(digest)

    def _open_blob(self, digest: str) -> tuple[int, str] | None:
        """(descriptor, path) of the blob of ``digest``, or None: not there (not stored, or
        evicted by GC meanwhile), not a file (a symbolic link, a socket: removed, said), or
        not readable by this user (said once a build)."""
        path = self._blob_path(digest)
        try:
            return os.open(path, BLOB_OPEN), path
        except OSError as e:
            if e.errno in NOT_A_FILE:  # (a link is never restored as one)
                self._warn(f"cache blob {digest[:12]} is not a file; removing it")
                remove_path(path)
            elif e.errno in (errno.EACCES, errno.EPERM) and not self._said_unreadable:
                self._said_unreadable = True  # (a shared cache with others' modes)
                self._warn(f"cache blob {path} cannot be read ({e.strerror}); its targets rerun "
                           "(another user's cache entries?)")
            return None

    def read_blob(self, digest: str) -> bytes | None:
        opened = self._open_blob(digest)
        if opened is None:
            return None
        fd, path = opened
        try:
            st = os.fstat(fd)
            data = _read_fd(fd, st.st_size) if stat.S_ISREG(st.st_mode) else None
        except OSError:
            return None
        finally:
            os.close(fd)
        if data is None:
            self._warn(f"cache blob {digest[:12]} is not a file; removing it")
            remove_path(path)
            return None
        if hash_bytes(data) != digest:
            self._warn(f"cache blob {digest[:12]} is corrupt; removing it")
            remove_path(path)
            return None
        return data

    def restore(self, digest: str, dest: str, mode: int, inline: bytes | None = None) -> os.stat_result | None:
        """Copy (or reflink / hardlink) a verified blob to ``dest``: the restored file's stat
        (taken after the rename, for the stat cache), or None on a miss.  ``inline``: the
        content kept in the action entry, written instead of a blob's.  CannotPlace: the
        cache was fine, ``dest`` could not be written (a read-only directory, a name too long)."""
        if inline is not None:
            if hash_bytes(inline) != digest:
                self.damage_said = True
                self._warn(f"cache entry content {digest[:12]} for {dest} does not match its digest; rerunning")
                return None
            return self._place(dest, mode, None, lambda out: _write_all(out, inline))
        opened = self._open_blob(digest)
        if opened is None:
            return None
        src, blob = opened
        try:
            return self._restore_from(src, blob, digest, dest, mode)
        finally:
            os.close(src)

    def _restore_from(self, src: int, blob: str, digest: str, dest: str, mode: int) -> os.stat_result | None:
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):
                actual = "not a file"
            else:
                # A small blob is read once: verified from these bytes and written from them.
                # A large one is hashed, then reflinked or copied, in bounded memory.
                data = _read_fd(src, st.st_size) if st.st_size < SMALL_BLOB else None
                actual = hash_bytes(data) if data is not None else hash_file(blob)
        except OSError:
            return None
        if actual != digest:
            self.damage_said = True
            self._warn(f"cache blob {digest[:12]} for {dest} does not match its digest; removing it and rerunning")
            remove_path(blob)
            return None

        def fill(out: int) -> None:
            if data is not None:
                _write_all(out, data)
            else:
                self._clone_or_copy(src, out)

        link = blob if self.restore_mode == "hardlink" and mode == 0o644 and self._blob_mode_kept(src, st) else None
        return self._place(dest, mode, link, fill)

    def _blob_mode_kept(self, src: int, st: os.stat_result) -> bool:
        """Was the blob read-only and not executable, as stored (0444), when it was opened
        (``st``)?  A ``chmod`` of a hardlinked output is one of its blob: the blob's mode is
        put back (else every later restore links the wrong mode, in every workspace); False
        (copy instead) if it cannot be.  (A chmod by another process after ``st`` was taken
        is seen by the next build, which finds the output's mode wrong and restores it.)"""
        if stat.S_IMODE(st.st_mode) == 0o444:
            return True
        try:
            os.fchmod(src, 0o444)
            return True
        except OSError:
            return False

    def _place(
        self, dest: str, mode: int, link: str | None, fill: Callable[[int], None]
    ) -> os.stat_result | None:
        """Put verified content at ``dest`` by temp file + rename: a hard link to ``link``
        where one can be made, else a new file that ``fill`` writes."""
        for retry in (False, True):
            tmp = None
            try:
                tmp = self._restore_tmp(dest)
                if link is not None and _link(link, tmp):
                    os.replace(tmp, dest)
                    return os.stat(dest)
                return self._write_new(tmp, dest, mode, fill)
            except OSError as e:
                if tmp is not None:
                    remove_path(tmp)
                if isinstance(e, FileNotFoundError) and not retry:
                    self._forget_dirs()  # a directory memoised as existing was removed: make it again
                    continue
                raise CannotPlace(e.strerror or str(e), e.errno) from None
        return None

    def _restore_tmp(self, dest: str) -> str:
        """A temp path on ``dest``'s filesystem, after making ``dest``'s directory: in this
        process's staging dir when that is on the same filesystem (new files are made
        faster there, and a build killed mid-restore leaves no stray file among the
        sources), else beside ``dest``."""
        ddir = os.path.dirname(dest)
        self._mkdir(ddir)
        stage = self.stage
        if stage is not None and (where := stage.dir_for(ddir)) is not None:
            return stage.new_name(where)
        return temp_path(dest, RESTORE_TMP_SUFFIX)

    # -- helpers ---------------------------------------------------------------------
    def _clone_or_copy(self, src: int, dest: int) -> None:
        """Give the empty file ``dest`` all of ``src``: a reflink where the filesystem can."""
        if self._reflink:
            try:
                fcntl.ioctl(dest, FICLONE, src)
                return
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                    raise
                self._reflink = False  # EOPNOTSUPP, EXDEV, EINVAL, ENOTTY: no reflinks here
        _copy_fd(src, dest)

    @staticmethod
    def _write_new(tmp: str, dest: str, mode: int, fill: Callable[[int], None]) -> os.stat_result:
        """Create ``tmp`` with ``mode``, ``fill`` it and rename it to ``dest``: the one
        atomic write of every blob, entry and restore.  Returns the stat after the rename
        (which changes the ctime that the stat cache compares)."""
        fd = _create(tmp, mode)
        try:
            fill(fd)
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)  # the umask took bits off
            os.replace(tmp, dest)
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _write_atomic(self, dest: str, data: bytes, mode: int = 0o644, blob: bool = False) -> bool:
        tmp = self._tmp()
        try:
            self._mkparent(dest)
            self._write_new(tmp, dest, mode, lambda fd: _write_all(fd, data))
            self._added(len(data))
            return True
        except OSError as e:
            remove_path(tmp)
            if blob and _kept_unreadable(e, dest):
                return True
            self.write_failed(e, dest)
            return False

    def write_failed(self, e: OSError, dest: str) -> None:
        """A write into the cache failed: a full disk or a cache this build may not write
        stores nothing more (one warning), anything else is that write's warning."""
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ELOOP):
            where = e.filename if e.errno in (errno.EACCES, errno.EPERM, errno.ELOOP) and e.filename else None
            self._disable(f"cannot write to the cache ({e.strerror}{f': {where}' if where else ''})")
        elif e.errno == errno.ENOENT and not os.path.isdir(os.path.join(self.dir, "tmp")):
            # (made with the layout: gone, every later write would fail alike)
            self._disable(f"the cache directory {self.dir} was removed during the build")
        else:
            where = e.filename if isinstance(e.filename, str) else dest
            self._warn(f"cache write failed ({e.strerror}: {where}); that action is not cached")



# How a blob is opened: a named pipe put in the cache must not block the build (it would
# wait for a writer, past Ctrl-C), and a symbolic link is no blob (hardlink mode would
# restore the link itself).  The descriptor's fstat then says whether it is a regular file.
BLOB_OPEN = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
NOT_A_FILE = (errno.ELOOP, errno.ENXIO, errno.EISDIR)  # what opening a link, a socket, a directory gives


def _kept_unreadable(e: OSError, dest: str) -> bool:
    """A blob this user cannot read (another's, mode 600) that it may not replace either: it
    stays, as the entry naming it may (others read it; here it is a miss), and the build
    goes on storing -- the refusal must not turn the cache off for the rest of the build."""
    return e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and os.path.lexists(dest)


# Raw descriptors, not io.open: for the small files of a cache, io's extra fstat, ioctl and
# lseeks per open cost more than the read itself.
def _create(path: str, mode: int) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        return os.open(path, flags, mode)
    except FileExistsError:  # a temp file left by a killed build
        os.unlink(path)
        return os.open(path, flags, mode)


def _read_fd(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes from ``fd`` (fewer only at end of file)."""
    data = os.read(fd, size)
    while len(data) < size and (more := os.read(fd, size - len(data))):
        data += more
    return data


class CannotPlace(Exception):
    """A cache hit whose content could not be put at its destination (the reason, and the
    errno): not the cache's fault, so no damaged entry."""

    def __init__(self, why: str, errno: int | None) -> None:
        super().__init__(why)
        self.errno = errno


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_fd(src: int, dest: int) -> None:
    """All of ``src`` (from offset 0) appended to ``dest``, in bounded memory."""
    offset = 0
    try:
        while n := os.sendfile(dest, src, offset, COPY_CHUNK):
            offset += n
        return
    except OSError as e:
        if offset or e.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP):
            raise
    while chunk := os.pread(src, COPY_CHUNK, offset):  # no sendfile between these files
        _write_all(dest, chunk)
        offset += len(chunk)


def _link(blob: str, tmp: str) -> bool:
    """Hardlink ``tmp`` to ``blob``; False where a link cannot be made (EXDEV, EMLINK, EPERM)."""
    try:
        os.link(blob, tmp)
        return True
    except OSError:
        return False
