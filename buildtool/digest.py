"""Digests: BLAKE3 content hashes of files, with a persistent stat cache.

The stat cache maps a workspace-relative path to ``(size, mtime_ns, ino, ctime_ns,
hashed_at_ns, digest)``.  An entry is reused only when the file's stat matches and the
entry is not *racily clean*: a file whose ctime/mtime is within the timestamp granularity
of the moment it was hashed may have changed again unnoticed (as git's racy-git rule), so
it is rehashed.

Large files are hashed by several threads, through ``mmap`` windows while this process holds
a Linux read lease on the file (no other process can open it for writing or truncate it
until the lease is released, so a mapped page cannot vanish and raise SIGBUS), else (and
for a file with holes, whose pages a mapping would make on tmpfs) by reading fixed-size
chunks into a buffer.

Spec: docs/formats.md#stat-cache--buildtoolstat-cache
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import signal
import sys
import time
from array import array
from collections.abc import Callable, Iterator, MutableMapping

import blake3

from buildtool.atomic import write_atomic
from buildtool.workspace import blake3_refused_threads, file_kind, open_regular, remove_if_not_a_file

FORMAT_VERSION = 3
HEADER = f"# buildtool stat-cache v{FORMAT_VERSION}\n"
HEADER_V2 = "# buildtool stat-cache v2\n"  # the map as one JSON line, then journal lines: read, rewritten as v3
HEADER_V1 = "# buildtool stat-cache v1\n"  # the JSON map alone: read, rewritten as v3
LARGE_FILE = 4 * 1024 * 1024  # several threads (and a lease + mmap, or chunks) from this size
CHUNK = 4 * 1024 * 1024  # the read buffer of large files hashed without a lease (8 MiB: ~8% slower)
WINDOW = 128 * 1024 * 1024  # the largest part of a leased file mapped at once: bounds our RSS
MIN_LEASE_BREAK_S = 10  # a kernel that revokes a lease sooner than this: read, never map
FINE_WINDOW_NS = 50_000_000  # ns-resolution filesystems: coarse kernel clock ticks are < 10 ms
COARSE_WINDOW_NS = 2_000_000_000  # filesystems with whole-second timestamps

Entry = list  # [size, mtime_ns, ino, ctime_ns, hashed_at_ns, digest]

# A recorded output digest "remote:<sha256|blake3>:<hex>:<size>" names a file that was left in
# the remote executor's CAS (--remote-download toplevel/minimal; docs/remote.md).  It stands
# in for the BLAKE3 digest in the keys of dependents; remote/action.py parses it.
REMOTE_MARK = "remote:"


def is_remote(digest: str | None) -> bool:
    return digest is not None and digest.startswith(REMOTE_MARK)


def _entry_ok(e: object) -> bool:
    """Is ``e`` a stat cache entry as written: [size, mtime_ns, ino, ctime_ns, hashed_at, digest]?"""
    return (isinstance(e, list) and len(e) == 6 and isinstance(e[5], str)
            and all(type(v) is int for v in e[:5]))


def hash_bytes(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def hash_file(path: str) -> str:
    """BLAKE3 of a file's content; bounded-memory chunks + threads for large files."""
    return _hash_fd(path)[0]


def _hash_fd(path: str) -> tuple[str, os.stat_result]:
    """(digest, fstat after reading) of a file.  Plain descriptors, not ``open()``: a
    buffered file object costs an isatty ioctl, two lseeks and an fstat more per file,
    and a clean build hashes every input and output."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # (a named pipe must not block the open)
    try:
        st0 = os.fstat(fd)
        if (st0.st_mode & 0o170000) != 0o100000:  # a directory (replaced a file since), a pipe...: no content
            raise OSError(22, f"not a regular file ({file_kind(st0.st_mode)})", path)
        size = st0.st_size
        if size < LARGE_FILE:
            h = blake3.blake3(os.read(fd, size + 1))
            while chunk := os.read(fd, 1 << 16):  # grew while being read
                h.update(chunk)
            return h.hexdigest(), os.fstat(fd)
        global _threads
        try:
            return _hash_large(fd, size, st0, _threads)
        except BaseException as e:
            if _threads == 1 or not blake3_refused_threads(e):
                raise
            _threads = 1  # (for the rest of the process: a pool refused once is not tried again)
            os.lseek(fd, 0, os.SEEK_SET)
            return _hash_large(fd, size, st0, 1)
    finally:
        os.close(fd)


_threads: int = blake3.blake3.AUTO  # BLAKE3's threads for a large file; 1 once a thread was refused


def _hash_large(fd: int, size: int, st0: os.stat_result, threads: int) -> tuple[str, os.stat_result]:
    """_hash_fd's large file (from offset 0) on ``threads`` threads."""
    h = blake3.blake3(max_threads=threads)
    # A file with holes is read, not mapped: on tmpfs a hole read through a shared
    # mapping gets a page of its own (a sparse source made to take its whole size in
    # RAM) and, the tmpfs full, SIGBUS killed the build.
    sparse = st0.st_blocks * 512 < size and _has_hole(fd, size)
    done, st = _hash_leased(fd, h) if not sparse else (0, None)
    if st is not None:
        return h.hexdigest(), st
    # No lease, or a writer came after `done` bytes: read the rest in fixed-size chunks
    # (bounded memory for a file of any size), one copy per byte more than a mapping.
    os.lseek(fd, done, os.SEEK_SET)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while n := os.readv(fd, [buf]):
        h.update(view[:n])
    return h.hexdigest(), os.fstat(fd)


def _has_hole(fd: int, size: int) -> bool:
    """Does the file have a hole before ``size`` (SEEK_HOLE)?  Fewer blocks than bytes alone
    is also a compressed file (ZFS, btrfs) or a FUSE one that counts none, which mmap reads
    as well as ever; a file system without SEEK_HOLE says its end."""
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) < size
    except (OSError, AttributeError):
        return False
    finally:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError:
            pass


def _hash_leased(fd: int, h: blake3.blake3) -> tuple[int, os.stat_result | None]:
    """Feed ``h`` the file behind ``fd`` through mmap windows while holding a read lease.

    Returns (bytes fed, fstat taken under the lease once every byte was fed); (0, None) when
    no lease can be had: the file is open for writing somewhere (EAGAIN), we neither own it
    nor have CAP_LEASE (EACCES), the filesystem has no leases (NFS, FUSE: EINVAL), or the
    kernel would revoke a lease too soon.  While the lease is held, a process that opens the
    file for writing or truncates it waits, so no mapped page can disappear (SIGBUS).  The
    kernel tells a lease holder about such a writer with a signal, SIGIO by default, which
    would kill us: the descriptor is set to send SIGURG instead, ignored unless handled.
    After each window the lease is checked; if a writer is waiting, the lease is released at
    once and the caller reads the rest, so a writer waits one window at most.
    """
    if not _lease_break_time_ok():
        return 0, None
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)  # before the lease: a break can come at once
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        return 0, None
    done = 0
    try:
        size = os.fstat(fd).st_size  # fixed while the lease is held
        while done < size:
            n = min(WINDOW, size - done)
            with mmap.mmap(fd, n, access=mmap.ACCESS_READ, offset=done) as m:
                h.update(m)
            done += n
            if done < size and fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK:
                return done, None  # being broken (F_UNLCK): let the writer in
        return done, os.fstat(fd)  # still leased: the stat of exactly what was hashed
    except OSError:  # no mmap on this filesystem, or no address space left: read the rest
        return done, None
    finally:
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        except OSError:  # already revoked by the kernel
            pass


_lease_break_ok: bool | None = None


def _lease_break_time_ok() -> bool:
    """Whether this kernel waits long enough for a lease holder (``lease-break-time``, 45 s
    by default) that a window is hashed long before the lease could be revoked."""
    global _lease_break_ok
    if _lease_break_ok is None:
        try:
            with open("/proc/sys/fs/lease-break-time", "rb") as f:
                _lease_break_ok = int(f.read()) >= MIN_LEASE_BREAK_S and hasattr(fcntl, "F_SETSIG")
        except (OSError, ValueError):  # not Linux
            _lease_break_ok = False
    return _lease_break_ok


COLUMNS = "qqQqq"  # array type codes of size, mtime_ns, ino, ctime_ns, hashed_at_ns (8 bytes each)
DIGEST_BYTES = 32


class StatEntries(MutableMapping):  # type: ignore[type-arg]
    """path -> Entry, read from the stat cache's columns on first use.

    A one-changed build of a 10,000-target workspace asks for a handful of entries; turning
    all 20,000 into lists was ~40 ms of its start-up (JSON in format v2).  Loading now only
    maps each path to its row; an entry is built from the columns when it is asked for and
    kept (so it can be updated in place, as a dict's list would be)."""

    __slots__ = ("_cols", "_digests", "_index", "_over")

    def __init__(
        self, index: dict[str, int] | None = None, cols: list[array] | None = None, digests: bytes = b""  # type: ignore[type-arg]
    ) -> None:
        self._index = index if index is not None else {}  # path -> row in the columns
        self._cols = cols if cols is not None else []
        self._digests = digests
        self._over: dict[str, Entry | None] = {}  # entries built, set or removed (None) since loading

    def get(self, rel: str, default: Entry | None = None) -> Entry | None:  # type: ignore[override]
        over = self._over
        if rel in over:
            e = over[rel]
            return default if e is None else e
        i = self._index.get(rel)
        if i is None:
            return default
        e = over[rel] = self._row(i)
        return e

    def _row(self, i: int) -> Entry:
        at = i * DIGEST_BYTES
        return [c[i] for c in self._cols] + [self._digests[at : at + DIGEST_BYTES].hex()]

    def __getitem__(self, rel: str) -> Entry:
        e = self.get(rel)
        if e is None:
            raise KeyError(rel)
        return e

    def __contains__(self, rel: object) -> bool:
        over = self._over
        if rel in over:
            return over[rel] is not None  # type: ignore[index]
        return rel in self._index

    def __setitem__(self, rel: str, e: Entry) -> None:
        self._over[rel] = e

    def __delitem__(self, rel: str) -> None:
        if rel not in self:
            raise KeyError(rel)
        self._over[rel] = None

    def pop(self, rel: str, default: Entry | None = None) -> Entry | None:  # type: ignore[override]
        e = self.get(rel)
        if e is None:
            return default
        self._over[rel] = None
        return e

    def __iter__(self) -> Iterator[str]:
        over = self._over
        for rel in self._index:
            if rel not in over:
                yield rel
        for rel, e in over.items():
            if e is not None:
                yield rel

    def __len__(self) -> int:
        n = len(self._index)
        for rel, e in self._over.items():
            if rel in self._index:
                n -= e is None
            else:
                n += e is not None
        return n

    def rows(self) -> Iterator[tuple[str, Entry]]:
        """Every entry, without keeping those built from the columns (for a rewrite)."""
        over = self._over
        for rel, i in self._index.items():
            if rel not in over:
                yield rel, self._row(i)
        for rel, e in over.items():
            if e is not None:
                yield rel, e


def _encode_map(entries: StatEntries) -> bytes:
    """The map section of format v3 and, for entries the columns cannot hold (a digest that
    is not BLAKE3 hex, a value out of range: none in practice), one JSON journal line."""
    names: list[str] = []
    rows: list[Entry] = []
    odd: dict[str, Entry] = {}
    for rel, e in entries.rows():
        if type(e) is list and len(e) == 6 and type(e[5]) is str and len(e[5]) == 2 * DIGEST_BYTES:
            names.append(rel)
            rows.append(e)
        else:
            odd[rel] = e
    try:
        cols, digests = _pack(rows)
    except (OverflowError, TypeError, ValueError):  # one bad row: sort them out one by one
        packable = [_packable(e) for e in rows]
        odd.update((rel, e) for rel, e, ok in zip(names, rows, packable, strict=True) if not ok)
        names = [rel for rel, ok in zip(names, packable, strict=True) if ok]
        cols, digests = _pack([e for e, ok in zip(rows, packable, strict=True) if ok])
    paths = "".join([rel + "\0" for rel in names]).encode("utf-8", "surrogatepass")
    meta = json.dumps({"n": len(names), "paths": len(paths), "order": sys.byteorder}, separators=(",", ":"))
    parts = [HEADER.encode(), meta.encode(), b"\n", paths, *(c.tobytes() for c in cols), digests, b"\n"]
    if odd:
        parts.append(json.dumps(odd, separators=(",", ":")).encode("utf-8", "surrogatepass") + b"\n")
    return b"".join(parts)


def _pack(rows: list[Entry]) -> tuple[list[array], bytes]:  # type: ignore[type-arg]
    """The columns and the digest bytes of ``rows``; OverflowError, TypeError or ValueError
    if one of them does not fit."""
    cols = [array(code, [e[k] for e in rows]) for k, code in enumerate(COLUMNS)]
    digests = bytes.fromhex("".join([e[5] for e in rows]))
    if len(digests) != DIGEST_BYTES * len(rows):
        raise ValueError("a digest of another length")
    return cols, digests


def _packable(e: Entry) -> bool:
    try:
        _pack([e])
        return True
    except (OverflowError, TypeError, ValueError):
        return False


def _decode_map(data: bytes, start: int) -> tuple[StatEntries, int]:
    """The entries of a v3 map section at ``start``, and where its journal lines begin.
    ValueError: the section is damaged."""
    nl = data.index(b"\n", start)
    meta = json.loads(data[start:nl])
    n, plen, order = meta["n"], meta["paths"], meta["order"]
    if type(n) is not int or type(plen) is not int or n < 0 or plen < 0 or order not in ("little", "big"):
        raise ValueError
    pos = nl + 1
    names = data[pos : pos + plen].decode("utf-8", "surrogatepass").split("\0")
    if len(names) != n + 1 or names[-1] != "":
        raise ValueError
    pos += plen
    cols = []
    for code in COLUMNS:
        col = array(code)
        col.frombytes(data[pos : pos + col.itemsize * n])
        if len(col) != n:
            raise ValueError
        if order != sys.byteorder:
            col.byteswap()
        cols.append(col)
        pos += col.itemsize * n
    digests = data[pos : pos + DIGEST_BYTES * n]
    pos += DIGEST_BYTES * n
    if len(digests) != DIGEST_BYTES * n or data[pos : pos + 1] != b"\n":
        raise ValueError
    del names[-1]
    return StatEntries(dict(zip(names, range(n), strict=True)), cols, digests), pos + 1


class StatCache:
    """path -> digest memo keyed on stat data; safe against racily clean files.

    On disk (format v3): a header, the whole map as columns (paths, then one array per stat
    field, then the raw digests; read with a few slices, entries built on demand), then
    journal lines that each hold the entries changed by one later build as JSON (``null``:
    forgotten).  A build that changed a few entries appends one line instead of rewriting
    the map; the file is rewritten (temp file + rename) when the journal grows past a
    quarter of the map.
    """

    def __init__(self, root: str, path: str | None, warn: Callable[[str], None]) -> None:
        self.root = root
        self.path = path
        self.entries = StatEntries()
        # path -> the entry the current build relied on: for an input, the first one it was
        # handed (a later edit and rehash during the build must not hide that the build used
        # the earlier content); for a file the build wrote (``produced``), the last.  The
        # no-op snapshot signs files against these (noop.write's ``seen``).
        self.used: dict[str, Entry] = {}
        self.dirty = False
        self._changed: set[str] = set()  # paths remembered or forgotten since the last save
        self._journal = -1  # journal entries on disk after the map; -1: nothing appendable on disk
        self._warn = warn
        if path:
            self._load(path)

    def _load(self, path: str) -> None:
        try:
            with open_regular(path) as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as e:
            self._warn(f"stat cache {path} unreadable ({e.strerror}); rehashing files")
            remove_if_not_a_file(path)  # (a directory could never be replaced by save())
            return
        nl = data.find(b"\n")
        head = data[: nl + 1]
        old = head in (HEADER_V1.encode(), HEADER_V2.encode())  # JSON map: read, rewritten whole on save
        if head != HEADER.encode() and not old:
            self._warn(f"stat cache {path} has an unknown format; discarding it")
            return
        try:
            if old:
                body = data[nl + 1 :]
                base, *journal = [body] if head == HEADER_V1.encode() else body.split(b"\n")
                mapped = json.loads(base)
                if not isinstance(mapped, dict) or not all(map(_entry_ok, mapped.values())):
                    raise ValueError
                entries = StatEntries()
                entries.update(mapped)
            else:
                entries, at = _decode_map(data, nl + 1)
                journal = data[at:].split(b"\n")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            self._warn(f"stat cache {path} is corrupt; discarding it")
            return
        n = 0
        for i, line in enumerate(journal):
            if not line:
                continue
            try:
                changes = json.loads(line)
                if not isinstance(changes, dict) or not all(e is None or _entry_ok(e) for e in changes.values()):
                    raise ValueError  # (a line of another shape: as a damaged one, not a crash of every build)
            except ValueError:
                if i < len(journal) - 1:  # only a torn last line is expected (a killed build)
                    self._warn(f"stat cache {path} has a corrupt line; discarding it")
                    return
                break  # a torn tail: the next save rewrites the file whole (_journal stays -1)
            for rel, e in changes.items():
                if e is None:
                    entries.pop(rel, None)
                else:
                    entries[rel] = e
            n += len(changes)
        else:
            if not old:
                self._journal = n
        self.entries = entries

    def save(self) -> None:
        if not self.path or not self.dirty:
            return
        changed = self._changed
        try:  # json.dumps uses the C encoder: ~10x faster than json.dump to a file
            if self._journal >= 0 and self._journal + len(changed) <= max(len(self.entries) // 4, 64):
                line = json.dumps({p: self.entries.get(p) for p in changed}, separators=(",", ":")) + "\n"
                try:  # no O_CREAT: a file removed meanwhile (buildtool clean) is written whole below
                    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
                except OSError as e:  # (a link put there: written whole, by a rename over it)
                    import errno  # (not on the monitored no-op's path)

                    if e.errno not in (errno.ENOENT, errno.ELOOP):
                        raise
                    self._journal = -1
                    return self.save()
                try:
                    os.write(fd, line.encode("utf-8", "surrogatepass"))
                finally:
                    os.close(fd)
                self._journal += len(changed)
            else:
                write_atomic(self.path, _encode_map(self.entries))
                self._journal = 0
            self.dirty = False
            changed.clear()
        except OSError as e:
            self._warn(f"could not save the stat cache ({e.strerror})")

    def begin_build(self) -> None:
        """A build starts (watch mode keeps one StatCache for many): nothing used yet."""
        self.used = {}

    def lookup(self, rel: str, st: os.stat_result, produced: bool = False) -> str | None:
        """The cached digest if ``st`` matches a trustworthy entry, else None.  A digest
        handed out counts as used by the build (``produced``: of a file it wrote)."""
        e = self.entries.get(rel)
        if e is None:
            return None
        if e[0] != st.st_size or e[1] != st.st_mtime_ns or e[2] != st.st_ino or e[3] != st.st_ctime_ns:
            return None
        if racy(e[1], e[3], e[4]):
            return None
        if produced:
            self.used[rel] = e
        else:
            self.used.setdefault(rel, e)
        return e[5]

    def remember(self, rel: str, st: os.stat_result, digest: str, hashed_at: int, produced: bool = False) -> None:
        """Record ``digest`` for ``rel`` at stat ``st``; the build uses it (``produced``: it
        wrote the file, so this entry replaces any it used before)."""
        e = self.entries[rel] = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, hashed_at, digest]
        if produced:
            self.used[rel] = e
        else:
            self.used.setdefault(rel, e)
        self._changed.add(rel)
        self.dirty = True

    def forget(self, rel: str) -> None:
        """``rel`` is deleted (an output about to be written again): no entry, none used."""
        self.used.pop(rel, None)
        if self.entries.pop(rel, None) is not None:
            self._changed.add(rel)
            self.dirty = True

    def digest(self, rel: str, st: os.stat_result | None = None, produced: bool = False) -> str:
        """Digest of a workspace file, hashing only when the stat cache cannot vouch
        (``produced``: a file the build just wrote, see ``remember``)."""
        full = os.path.join(self.root, rel)
        if st is None:
            st = os.stat(full)
        d = self.lookup(rel, st, produced)
        if d is not None:
            return d
        hashed_at = time.time_ns()
        d, st2 = _hash_fd(full)  # st2: the file as it was once read (a replaced file keeps the old inode's)
        if (st2.st_size, st2.st_mtime_ns, st2.st_ino, st2.st_ctime_ns) == (
            st.st_size,
            st.st_mtime_ns,
            st.st_ino,
            st.st_ctime_ns,
        ):
            self.remember(rel, st, d, hashed_at, produced)
        return d


def last_change(mtime_ns: int, ctime_ns: int, now_ns: int) -> int:
    """When a file last changed, as far as its stat tells at ``now_ns``: its newest time, but
    the ctime alone when the mtime is later than now (set by hand: ``racy``)."""
    return ctime_ns if mtime_ns > now_ns else max(mtime_ns, ctime_ns)


def racy(mtime_ns: int, ctime_ns: int, hashed_at_ns: int) -> bool:
    """Was the file changed so shortly before ``hashed_at_ns`` that a rewrite in the same
    clock tick (same size) would leave its stat as it is?  Then the stat proves nothing.
    An mtime later than ``hashed_at_ns`` was set by hand (``touch -d 2030``, a tarball
    from a machine whose clock is ahead) and says nothing of when the file changed: any
    write moves both times to the present, so the ctime, which the kernel sets at every
    change (an mtime set included), decides alone; taking the mtime kept such a file
    "racy" until that date (re-hashed by every build; a BUILD.py: never a no-op)."""
    newest = last_change(mtime_ns, ctime_ns, hashed_at_ns)
    coarse = mtime_ns % 1_000_000_000 == 0 and ctime_ns % 1_000_000_000 == 0
    window = COARSE_WINDOW_NS if coarse else FINE_WINDOW_NS
    return newest + window > hashed_at_ns
