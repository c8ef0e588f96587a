"""Action database: the shared cache's action entries, kept in one SQLite file.

One row per action key: the entry (the JSON object of docs/formats.md#cache-dir) and when
it was stored (``used``, unix time in ns); a second, narrow table holds when it was last
hit.  Recency for GC's LRU eviction is the later of the two.  One
database instead of one file per entry, because creating a file is the dearest part of
storing a small action: on the ext4 of the machines we measure, 150-700 us of kernel time
per new file, against a write-ahead-log append for a row.  Blobs stay files in ``cas/``.

WAL mode, so readers never wait for a writer; writers of concurrent builds queue behind a
busy timeout.  Hits are remembered in memory and written in one transaction by ``flush``
at the end of a build, so a restore-heavy build does not write per hit; into a table of
their own, because updating a column of the entries' rows rewrote every page that holds
one (10,000 hits: ~75 ms, against ~20 ms for the narrow table).

Trouble never fails a build.  A busy database is a miss (or a skipped store) with a
warning; one that refuses a store as full or read-only stores nothing more but still
answers lookups, and an unopenable one turns caching off for the build (both through
``on_unusable``; ``readable`` tells them apart); a damaged database file, or one of
another schema version (but 1 and 2, which are upgraded in place), is deleted and started
afresh (a cache only loses entries).
GC, which must never mistake an unreadable database for an empty one, gets
``ActionDBError`` instead (``rows``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable, Iterable
    from typing import Any

FILENAME = "actions.db"
SCHEMA_VERSION = 3
# Version 1 kept the rows in the primary key's b-tree (WITHOUT ROWID): with entries of
# ~0.5-4 KiB, interior pages hold a handful of keys, so a lookup read 5-6 pages and
# overflow chains.  Version 2 is a rowid table: the key index is dense (a miss reads 2-3
# small pages), the entry one more (docs/formats.md has the measurements).  Version 3
# adds the hits table; versions 1 and 2 are upgraded in place, keeping their entries.
_CREATE = "CREATE TABLE {name} (key TEXT PRIMARY KEY, entry BLOB NOT NULL, used INTEGER NOT NULL)"
_CREATE_HITS = "CREATE TABLE IF NOT EXISTS hits (key TEXT PRIMARY KEY, used INTEGER NOT NULL) WITHOUT ROWID"
# How long each target's command last took, by label, from every workspace using the
# cache: the critical-path weights of a build with no record of its own (a fresh CI
# checkout, after `clean`).  Added to version 3 without a version change, made by the first
# write: a buildtool that does not know it leaves it alone, and a lookup finds none.
_CREATE_DURATIONS = ("CREATE TABLE IF NOT EXISTS durations (label TEXT PRIMARY KEY, seconds REAL NOT NULL, "
                     "used INTEGER NOT NULL) WITHOUT ROWID")
# The description (docs/formats.md, the build record's "desc") of each label's last stored
# action, from every workspace using the cache: what `--explain` compares a miss with when
# this workspace has no record of the target (a fresh CI checkout: "env var PATH changed"
# rather than only "no cache entry").  Advisory, as durations: added to version 3 by the
# first write; a row goes with the entry of its key, and GC weighs the two together.
_CREATE_DESCRIPTIONS = ("CREATE TABLE IF NOT EXISTS descriptions (label TEXT PRIMARY KEY, key TEXT NOT NULL, "
                        "desc TEXT NOT NULL, used INTEGER NOT NULL)")
# The descriptions whose entry is gone (NOT EXISTS: a NULL key another tool put in actions
# made NOT IN delete nothing).
_GONE_DESCRIPTIONS = ("DELETE FROM descriptions WHERE NOT EXISTS "
                      "(SELECT 1 FROM actions a WHERE a.key = descriptions.key)")
_LOOKUP_CHUNK = 500  # labels per query (SQLite allows 999 parameters in older builds)
BUSY_TIMEOUT_S = 10.0
IMPATIENT_MS = 20  # the busy timeout of a build that has already waited out BUSY_TIMEOUT_S once
_TRANSIENT = ("SQLITE_BUSY", "SQLITE_LOCKED")
_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_FORMAT", "SQLITE_SCHEMA", "SQLITE_MISMATCH")


def _wal(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode (kept in the file: done once per cache).  The switch
    needs the file to itself, and SQLite does not apply the busy timeout to it: two first
    builds on a new shared cache met there, and one of them read nothing from the cache."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")  # (a read-only file stays as it is: no error)
            return
        except _sqlite().OperationalError as e:
            if getattr(e, "sqlite_errorname", "") not in _TRANSIENT or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


class ActionDBError(OSError):
    """The action database could not be read (for GC: stop rather than guess)."""


class _OtherVersion(Exception):
    """The file holds a database of another schema version."""


class ActionDB:
    """key -> entry bytes, shared by every thread of one build (one connection, one lock)."""

    def __init__(self, directory: str, warn: Callable[[str], None], on_unusable: Callable[[str], None]) -> None:
        self.path = os.path.join(directory, FILENAME)
        self._warn = warn
        self._on_unusable = on_unusable
        self._conn: sqlite3.Connection | None = None
        self._mu = threading.Lock()
        self._touched: set[str] = set()
        self._timed: dict[str, float] = {}  # label -> seconds, to write at the next flush
        self._described: dict[str, tuple[str, str]] = {}  # label -> (key, description JSON), likewise
        self._unusable = False
        self._no_stores = False  # a store was refused (read-only or full): lookups go on
        self._immutable = False  # read as an immutable file (_frozen_file): damage is a writer's, never reset
        self._reset_done = False
        self._busy_warned = False
        self._was_busy = False  # busy for a whole BUSY_TIMEOUT_S once: _impatient_locked

    # -- entries -------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The entry stored under ``key``, or None (also on any trouble: a miss)."""

        def read(c: sqlite3.Connection) -> bytes | None:
            # (CAST: a row whose type byte was flipped to TEXT, or written as text by another
            # tool, reads as the same bytes; the entry's parser then judges them)
            row = c.execute("SELECT CAST(entry AS BLOB) FROM actions WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            self._touched.add(key)
            return bytes(row[0] or b"")

        return self._guarded("read", read, None)

    def put(self, key: str, entry: bytes) -> bool:
        """Store (or replace) the entry of ``key``; False if it could not be stored."""
        return self.put_many([(key, entry)]) > 0

    def put_many(self, rows: list[tuple[str, bytes]]) -> int:
        """Store (or replace) these (key, entry) rows in one transaction; the bytes they
        add to the database, at least 1 (0: none stored, when they could not be).  An entry
        stored again (`build -B`) adds what it grew by: counted whole each time, the cache's
        running size grew past the real one by the entry's size a run (cache_gc's scans)."""
        if not rows:
            return 0
        now = time.time_ns()

        def write(c: sqlite3.Connection) -> int:
            keys = [k for k, _ in rows]
            before = 0
            for i in range(0, len(keys), 500):  # (SQLite's limit on parameters: 999 in old builds)
                chunk = keys[i:i + 500]
                before += sum(n for (n,) in c.execute(
                    f"SELECT length(entry) FROM actions WHERE key IN ({','.join('?' * len(chunk))})", chunk))
            self._in_transaction(c, [("INSERT OR REPLACE INTO actions VALUES (?, ?, ?)",
                                      [(k, e, now) for k, e in rows])])
            self._touched.difference_update(k for k, _ in rows)
            return max(1, sum(len(e) for _, e in rows) - before)  # (stored: never 0, even of empty entries)

        return int(self._guarded("store into", write, 0))  # type: ignore[call-overload]

    def remove(self, keys: Iterable[str]) -> bool:
        """Delete these entries (damaged ones; GC's evictions); False if they could not be."""
        doomed = [(k,) for k in keys]
        if not doomed:
            return True
        with self._mu:  # a hit on an entry deleted since is not written at the flush
            self._touched.difference_update(k for (k,) in doomed)
        steps = [("DELETE FROM actions WHERE key = ?", doomed), ("DELETE FROM hits WHERE key = ?", doomed)]
        done = bool(self._guarded("delete from", lambda c: self._in_transaction(c, steps) or True, False))
        if done:  # (their descriptions go with them: GC's --max-size counts the database)
            # One pass over the table, each key looked up in actions': descriptions has no
            # index on its key, and a DELETE per doomed key scanned it each time (20,000
            # evictions: 80 s, in the gc at the end of an ordinary build).
            gone = [(_CREATE_DESCRIPTIONS, None), (_GONE_DESCRIPTIONS, None)]
            self._advisory(lambda c: self._in_transaction(c, gone), None)
        return done

    def drop_stray_hits(self) -> bool:
        """Delete the hits of entries that are gone (GC's sweep): a build that hit an entry
        which another process's GC evicted before the build's flush wrote a hit for it; and
        the durations noted before the oldest entry left was stored or hit (labels no build
        has run since the entries of their time were evicted)."""
        sql = "DELETE FROM hits WHERE NOT EXISTS (SELECT 1 FROM actions a WHERE a.key = hits.key)"
        done = bool(self._guarded("delete from", lambda c: self._in_transaction(c, [(sql, None)]) or True, False))
        old = ("DELETE FROM durations WHERE used < (SELECT min(max(a.used, coalesce(h.used, 0))) FROM actions a "
               "LEFT JOIN hits h ON h.key = a.key)")
        self._advisory(lambda c: self._in_transaction(c, [(_CREATE_DURATIONS, None), (old, None)]), None)
        # A description goes with its entry (they are larger than durations: kept, 1,500 of
        # them held a 300K cache at 1.2 MB): a miss is then compared with what is still there.
        gone = [(_CREATE_DESCRIPTIONS, None), (_GONE_DESCRIPTIONS, None)]
        self._advisory(lambda c: self._in_transaction(c, gone), None)
        return done

    def flush(self) -> None:
        """Write when the entries hit since the last flush were hit (one transaction), then
        the durations noted since (another: trouble there never costs the hits)."""
        with self._mu:
            touched, self._touched = self._touched, set()
            timed, self._timed = self._timed, {}
            described, self._described = self._described, {}
        now = time.time_ns()
        if touched:
            steps: list[tuple[str, list[tuple[object, ...]] | None]] = [
                ("INSERT OR REPLACE INTO hits VALUES (?, ?)", [(k, now) for k in touched])]
            self._guarded("update", lambda c: self._in_transaction(c, steps), None)
        if timed:
            rows = [(lab, d, now) for lab, d in timed.items()]
            self._advisory(lambda c: self._in_transaction(c, [
                (_CREATE_DURATIONS, None), ("INSERT OR REPLACE INTO durations VALUES (?, ?, ?)", rows)]), None)
        if described:
            kept = [(lab, k, d, now) for lab, (k, d) in described.items()]
            self._advisory(lambda c: self._in_transaction(c, [
                (_CREATE_DESCRIPTIONS, None), ("INSERT OR REPLACE INTO descriptions VALUES (?, ?, ?, ?)", kept)]), None)

    # -- durations -------------------------------------------------------------------------
    def note_durations(self, durations: Iterable[tuple[str, float]]) -> None:
        """Remember how long these targets' commands took (label, seconds), written at the
        next ``flush``."""
        with self._mu:
            self._timed.update(durations)

    def durations(self, labels: Iterable[str]) -> dict[str, float]:
        """The last duration the cache holds for each of these labels that it has one for
        (none on any trouble)."""
        wanted = list(labels)
        if not wanted or not os.path.exists(self.path):
            return {}
        return self._advisory(lambda c: _durations_in(c, wanted), {}, writes=False)

    # -- descriptions ----------------------------------------------------------------------
    def note_descriptions(self, described: Iterable[tuple[str, str, str]]) -> None:
        """Remember the action each of these targets stored last (label, key, description
        JSON), written at the next ``flush``."""
        with self._mu:
            self._described.update((lab, (k, d)) for lab, k, d in described)

    def described_labels(self) -> frozenset[str]:
        """The labels the descriptions table holds (none on any trouble)."""
        if not os.path.exists(self.path):
            return frozenset()
        return self._advisory(_described_labels, frozenset(), writes=False)

    def description_sizes(self) -> dict[str, int]:
        """Bytes of the descriptions kept for each entry's key (GC weighs an entry with its
        description: the table is in the database file the size cap counts)."""
        if not os.path.exists(self.path):
            return {}

        def sizes(c: sqlite3.Connection) -> dict[str, int]:
            if not _has_table(c, "descriptions"):
                return {}
            return {k: n + len(lab) for k, n, lab in c.execute("SELECT key, length(desc), label FROM descriptions")
                    if isinstance(n, int) and isinstance(lab, str)}

        return self._advisory(sizes, {}, writes=False)

    def description(self, label: str) -> tuple[str, str] | None:
        """(key, description JSON) of the last action stored for ``label``, if any."""
        def one(c: sqlite3.Connection) -> tuple[str, str] | None:
            row = c.execute("SELECT key, desc FROM descriptions WHERE label = ?", (label,)).fetchone()
            return (row[0], row[1]) if row and isinstance(row[0], str) and isinstance(row[1], str) else None

        return self._advisory(one, None, writes=False)

    def _advisory(self, fn: Callable[[sqlite3.Connection], Any], default: Any, writes: bool = True) -> Any:
        """``fn(connection)`` for the durations table, which only weighs the schedule: any
        trouble with it (busy, a table of another shape that a later buildtool made) is
        ``default``, never the cache's trouble; a database otherwise unusable stays so."""
        if self._unusable or (writes and self._no_stores):
            return default
        try:
            with self._mu:
                try:
                    return fn(self._connection())
                except Exception as e:
                    if getattr(e, "sqlite_errorname", "") in _TRANSIENT:
                        self._impatient_locked()
                    raise
        except Exception:  # sqlite3.Error, _OtherVersion: the entries' own calls say those
            return default

    def _impatient_locked(self) -> None:
        """(``_mu`` held) The database stayed busy for a whole BUSY_TIMEOUT_S: from now on a
        store or a lookup that finds it busy gives up at once (each would wait it again,
        holding the lock every lane's lookups wait for: a database held by another process
        for a minute made each target of the build wait 10 s, one after another)."""
        self._was_busy = True  # (a connection not opened yet: opening it found the database busy)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.execute(f"PRAGMA busy_timeout = {IMPATIENT_MS}")

    def rows(self) -> list[tuple[str, int, bytes]]:
        """Every (key, used, entry), ``used`` the later of its store and its last hit, for GC
        and ``cache stats``; ActionDBError if unreadable (an unreadable database must never
        look empty to GC)."""
        if not os.path.exists(self.path):
            return []
        sql = ("SELECT a.key, max(a.used, coalesce(h.used, 0)), CAST(a.entry AS BLOB) FROM actions a "
               "LEFT JOIN hits h ON h.key = a.key")
        try:
            with self._mu:
                c = self._connection()
                return [(k, u, bytes(e or b"")) for k, u, e in c.execute(sql)]
        except Exception as e:  # sqlite3.Error, OSError, _OtherVersion
            how = "cannot be written" if "readonly" in str(e) else "is unreadable"  # (a read of a -wal writes)
            raise ActionDBError(f"the cache database {self.path} {how} ({_describe(e)})") from None

    def compact(self, min_free: int = 64 << 10) -> int:
        """Give the free pages of evicted entries back to the file system (GC: an eviction
        frees pages inside the file, which never shrank: `cache gc --max-size 200K` left a
        3 MB database): VACUUM when at least ``min_free`` bytes and a quarter of the file
        are free.  The bytes given back; 0 (untouched) on any trouble, a busy reader too."""
        if self._unusable or not os.path.exists(self.path):
            return 0
        try:
            with self._mu:
                c = self._connection()
                pages = c.execute("PRAGMA page_count").fetchone()[0]  # (the file as the WAL has it too)
                page = c.execute("PRAGMA page_size").fetchone()[0]
                free = c.execute("PRAGMA freelist_count").fetchone()[0] * page
                if free < min_free or free * 4 < pages * page:
                    return 0
                before = _on_disk(self.path)
                c.execute(f"PRAGMA busy_timeout = {IMPATIENT_MS * 50}")  # (a reader holding on: left for later)
                try:
                    c.execute("VACUUM")
                    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # (the WAL holds the new pages until then)
                finally:
                    c.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                return max(0, before - _on_disk(self.path))  # (a reader holding the WAL: nothing yet)
        except Exception:  # sqlite3.Error, OSError, _OtherVersion: only space not given back
            return 0

    def close(self) -> None:
        self.flush()
        with self._mu:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- the connection ----------------------------------------------------------------------
    @staticmethod
    def _in_transaction(c: sqlite3.Connection, steps: list[tuple[str, list[tuple[object, ...]] | None]]) -> None:
        """Each (sql, rows) for every row, or once when rows is None, in one transaction."""
        c.execute("BEGIN IMMEDIATE")
        try:
            for sql, rows in steps:
                if rows is None:  # (executemany takes no CREATE)
                    c.execute(sql)
                else:
                    c.executemany(sql, rows)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            if os.path.islink(self.path):  # (planted: SQLite would write its tables into the file it leads to)
                raise _sqlite().DatabaseError("it is a symbolic link, not the cache's own file")
            for side in (self.path + "-wal", self.path + "-shm"):
                if os.path.isdir(side) and not os.path.islink(side):  # (a restored tarball's damage: SQLite
                    import shutil  # could not open the database, or only to read it, on every build)

                    shutil.rmtree(side, ignore_errors=True)
                    if not os.path.lexists(side):  # (a cache this build may not write: said as unusable)
                        self._warn(f"the cache database's {os.path.basename(side)} was a directory; removed it")
            wait_s = IMPATIENT_MS / 1000 if self._was_busy else BUSY_TIMEOUT_S
            conn = _sqlite().connect(self.path, timeout=wait_s, isolation_level=None, check_same_thread=False)
            from buildtool.atomic import share

            share(self.path)  # (SQLite gives its -wal and -shm the database's mode: a team's, if shared)
            try:
                try:
                    version = conn.execute("PRAGMA user_version").fetchone()[0]
                    if version not in (0, 1, 2, SCHEMA_VERSION):
                        raise _OtherVersion(version)
                    _wal(conn)
                    conn.execute("PRAGMA synchronous = NORMAL")  # WAL: no fsync per commit; a crash loses no older rows
                except _sqlite().OperationalError as e:
                    if not self._frozen_file(e):
                        raise
                    conn.close()
                    conn = self._immutable_connection()
                    self._conn = conn
                    return conn
                if version != SCHEMA_VERSION:
                    _create_or_upgrade(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _frozen_file(self, e: BaseException) -> bool:
        """Whether ``e`` (from opening it) is SQLite failing to open a WAL database it may not
        write beside: a cache on a read-only mount, or another user's, whose ``-shm`` file it
        cannot make.  Only when the log holds nothing (``cache gc`` leaves it so; a writer at
        work keeps one), so that the file alone is every entry.  A writer may start later (the
        owner's build): what it changes under the reader is a miss (``_guarded``), and an
        entry found is still checked (its key, its blobs' digests)."""
        if getattr(e, "sqlite_errorname", "") not in ("SQLITE_CANTOPEN", "SQLITE_READONLY_DIRECTORY") \
                or not os.path.isfile(self.path):  # (a mount read-only to all; a directory of another user's)
            return False
        directory = os.path.dirname(self.path) or "."
        try:
            wal = os.stat(self.path + "-wal").st_size
        except FileNotFoundError:
            wal = 0
        except OSError:
            return False
        return wal == 0 and not os.access(directory, os.W_OK)

    def _immutable_connection(self) -> sqlite3.Connection:
        """The database read as an immutable file (no locks, no ``-shm``), for lookups only:
        stores are refused as a read-only file's are (``_no_stores``, said once)."""
        import pathlib

        uri = pathlib.Path(self.path).absolute().as_uri() + "?immutable=1"
        self._immutable = True  # (from here: whatever goes wrong, nothing is reset)
        conn = _sqlite().connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:  # (no upgrade in place here: read as another version's)
                raise _OtherVersion(version)
        except BaseException:
            conn.close()
            raise
        return conn

    def _guarded(self, what: str, fn: Callable[[sqlite3.Connection], object], default: object) -> object:
        """``fn(connection)`` under the lock; on trouble, the warning or reset it calls for
        and ``default``."""
        sqlite3 = _sqlite()
        if self._unusable or (self._no_stores and what != "read"):
            return default
        for attempt in (1, 2):
            try:
                with self._mu:
                    try:
                        return fn(self._connection())
                    except sqlite3.Error as e:
                        if getattr(e, "sqlite_errorname", "") in _TRANSIENT:
                            self._impatient_locked()  # (before another lane opens with the full wait)
                        raise
            except (sqlite3.Error, _OtherVersion, UnicodeDecodeError) as e:
                name = getattr(e, "sqlite_errorname", "")
                if name in _TRANSIENT:
                    if not self._busy_warned:
                        self._busy_warned = True
                        self._warn(f"the cache database is busy (another build holds it); could not {what} it, "
                                   "treating that as a miss")
                    return default
                # (UnicodeDecodeError: sqlite3 decoding an error message that quotes a damaged name)
                damaged = name in _DAMAGED or isinstance(e, UnicodeDecodeError) \
                    or (name == "SQLITE_CANTOPEN" and os.path.isdir(self.path)) or os.path.islink(self.path)
                if self._immutable and damaged:  # (its owner writing it meanwhile: nothing to start afresh)
                    if not self._busy_warned:
                        self._busy_warned = True
                        self._warn(f"the cache database {self.path}, read as a file this build may not write, "
                                   f"changed while it was read ({_describe(e)}); treating that as a miss")
                    return default
                if (isinstance(e, _OtherVersion) or damaged) and attempt == 1 and not self._reset_done \
                        and not self._immutable:
                    why = "of another version" if isinstance(e, _OtherVersion) else "damaged"
                    self._warn(f"the cache database {self.path} is {why} ({_describe(e)}); starting it afresh")
                    self._reset()
                    continue
                if name.startswith("SQLITE_READONLY") and what == "update":
                    return default  # (when entries were hit, not worth a word: nothing was to be stored)
                if (name.startswith("SQLITE_READONLY") or name == "SQLITE_FULL") and what != "read":
                    self._no_stores = True  # (a file this build may not write, or a full disk)
                    self._on_unusable(f"the cache database {self.path} refused a store ({_describe(e)}); "
                                      "its entries are still used")
                    return default
                self._unusable = True
                self._on_unusable(f"the cache database {self.path} is unusable ({_describe(e)})")
                return default
        return default

    @property
    def readable(self) -> bool:
        """Whether lookups still go to the database (false once it is unusable)."""
        return not self._unusable

    def damaged(self, why: str) -> None:
        """The caller found the database inconsistent where SQLite did not (an entry filed
        under another action's key: a damaged index): start it afresh, as for SQLite's
        own damage reports (once a build; a second time, caching is off)."""
        if self._unusable:
            return
        if not self._reset_done:
            self._warn(f"the cache database {self.path} is damaged ({why}); starting it afresh")
            self._reset()
        else:
            self._unusable = True
            self._on_unusable(f"the cache database {self.path} is unusable ({why})")

    def _reset(self) -> None:
        """Delete a damaged database (and its WAL and shared-memory files) and reconnect anew."""
        self._reset_done = True
        with self._mu:
            if self._conn is not None:
                try:
                    self._conn.close()
                except Exception:
                    pass
                self._conn = None
            for suffix in ("", "-wal", "-shm", "-journal"):
                try:
                    os.unlink(self.path + suffix)
                except IsADirectoryError:
                    import shutil

                    shutil.rmtree(self.path + suffix, ignore_errors=True)
                except OSError:
                    pass


def _on_disk(path: str) -> int:
    """The database file and its write-ahead log, in bytes."""
    total = 0
    for p in (path, path + "-wal"):
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    return total


def _durations_in(c: sqlite3.Connection, labels: list[str]) -> dict[str, float]:
    """The durations table's seconds for those of ``labels`` it has (none: no table)."""
    if not _has_table(c, "durations"):
        return {}
    found: dict[str, float] = {}
    for i in range(0, len(labels), _LOOKUP_CHUNK):
        chunk = labels[i:i + _LOOKUP_CHUNK]
        sql = f"SELECT label, seconds FROM durations WHERE label IN ({','.join('?' * len(chunk))})"
        for label, seconds in c.execute(sql, chunk):
            if isinstance(seconds, (int, float)) and seconds >= 0:
                found[label] = float(seconds)
    return found


def _has_table(c: sqlite3.Connection, name: str) -> bool:
    """Does the database hold the (advisory) table ``name``?  The first write makes one."""
    return c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def _described_labels(c: sqlite3.Connection) -> frozenset[str]:
    if not _has_table(c, "descriptions"):
        return frozenset()
    return frozenset(label for (label,) in c.execute("SELECT label FROM descriptions"))


def read_durations(directory: str, labels: list[str]) -> dict[str, float]:
    """The durations the database in ``directory`` holds for ``labels``, read without
    writing anything (``plan``: no upgrade, no reset, no WAL switch); none on any trouble."""
    import pathlib

    path = os.path.join(directory, FILENAME)
    if not labels or not os.path.isfile(path):
        return {}
    try:
        conn = _sqlite().connect(pathlib.Path(path).absolute().as_uri() + "?mode=ro", uri=True, timeout=1.0)
    except Exception:
        return {}
    try:
        return _durations_in(conn, labels)
    except Exception:  # (busy, damaged, another shape: a guess for the schedule, not worth a word)
        return {}
    finally:
        conn.close()


def _sqlite() -> Any:
    """The sqlite3 module's C part, which holds everything used here (``connect`` and the
    exceptions): the ``sqlite3`` package around it registers datetime adapters on import,
    ~2.5 ms of every build that looks up an action, for nothing buildtool stores."""
    try:
        import _sqlite3

        return _sqlite3
    except ImportError:  # an interpreter laid out otherwise
        import sqlite3

        return sqlite3


def _create_or_upgrade(conn: sqlite3.Connection) -> None:
    """Create the tables in a new database, or bring a version 1 or 2 database to version 3
    in one transaction, keeping its entries: version 1's table is copied into a rowid table
    with the same columns, and the hits table is added.  Another build may get there
    first: the version is read again under the write lock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            conn.execute(_CREATE.format(name="IF NOT EXISTS actions"))
        elif version == 1:
            conn.execute(_CREATE.format(name="actions_v2"))
            conn.execute("INSERT INTO actions_v2 (key, entry, used) SELECT key, entry, used FROM actions")
            conn.execute("DROP TABLE actions")
            conn.execute("ALTER TABLE actions_v2 RENAME TO actions")
        elif version not in (2, SCHEMA_VERSION):
            raise _OtherVersion(version)
        conn.execute(_CREATE_HITS)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _describe(e: BaseException) -> str:
    if isinstance(e, _OtherVersion):
        return f"schema version {e.args[0]}, this buildtool reads {SCHEMA_VERSION}"
    return str(e) or type(e).__name__
