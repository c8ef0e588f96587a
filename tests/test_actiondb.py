"""actiondb: the action cache's SQLite file under concurrency and damage (real files, real processes)."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import cache_verify as cv
import pytest
from conftest import immutable

from buildtool import actiondb
from buildtool.actiondb import ActionDB, ActionDBError


class Calls:
    def __init__(self) -> None:
        self.warned: list[str] = []
        self.unusable: list[str] = []

    def db(self, d: Path) -> ActionDB:
        return ActionDB(str(d), self.warned.append, self.unusable.append)


def used_of(d: Path, key: str) -> int:
    """When the entry was last stored or hit, as the database says (not as ``rows`` does)."""
    with contextlib.closing(sqlite3.connect(d / actiondb.FILENAME)) as c:
        stored = c.execute("SELECT used FROM actions WHERE key = ?", (key,)).fetchone()[0]
        hit = c.execute("SELECT used FROM hits WHERE key = ?", (key,)).fetchone()
        return max(stored, hit[0] if hit else 0)


def test_roundtrip_and_hits_refresh_recency_at_flush(tmp_path: Path) -> None:
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.get("k") is None
    assert db.put("k", b'{"v":1}') and db.put("other", b"x")
    assert db.get("k") == b'{"v":1}'
    stored = used_of(tmp_path, "k")
    assert used_of(tmp_path, "k") == stored  # a hit alone writes nothing...
    db.flush()
    assert used_of(tmp_path, "k") > stored  # ...until the flush at the end of the build
    assert dict((k, u) for k, u, _ in db.rows())["k"] == used_of(tmp_path, "k")
    assert db.put("k", b'{"v":2}')  # stored again: its hit stays, the later time counts
    assert dict((k, u) for k, u, _ in db.rows())["k"] == used_of(tmp_path, "k")
    assert db.remove(["k"]) and db.get("k") is None
    assert [r[0] for r in db.rows()] == ["other"]
    db.close()
    assert calls.warned == calls.unusable == []
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        assert c.execute("SELECT count(*) FROM hits").fetchone()[0] == 0  # removed with its entry


WRITER = """
import sys
from buildtool.actiondb import ActionDB
db = ActionDB(sys.argv[1], print, print)
for i in range(300):
    assert db.put(f"{sys.argv[2]}-{i}", b"entry" * 50), "store refused"
db.close()
"""


def test_concurrent_writers_in_separate_processes_lose_nothing(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), name], stdout=subprocess.PIPE, text=True)
             for name in ("a", "b", "c")]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and out == "", out
    keys = {k for k, _, _ in Calls().db(tmp_path).rows()}
    assert keys == {f"{n}-{i}" for n in "abc" for i in range(300)}


FIRST_READER = """
import sys, time
from buildtool.actiondb import ActionDB
db = ActionDB(sys.argv[1], print, print)
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all of them at once
assert db.get("k") is None
db.close()
"""


def test_first_builds_opening_a_new_shared_cache_at_once_read_it_without_a_warning(tmp_path: Path) -> None:
    """Switching a new database to WAL needs it alone, and SQLite applies no busy timeout
    to that: of two first builds on a new shared cache, one said "busy" and missed."""
    import time

    for round_ in range(4):
        d = tmp_path / f"c{round_}"
        d.mkdir()
        at = str(time.time() + 1.0)
        procs = [subprocess.Popen([sys.executable, "-c", FIRST_READER, str(d), at], stdout=subprocess.PIPE,
                                  text=True) for _ in range(6)]
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0 and out == "", out


def test_a_database_held_busy_is_a_miss_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls()
    assert calls.db(tmp_path).put("k", b"old")
    monkeypatch.setattr(actiondb, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(tmp_path / actiondb.FILENAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another build in the middle of a long write
    try:
        db = calls.db(tmp_path)
        assert db.put("k2", b"new") is False
        t0 = time.monotonic()
        assert db.put("k3", b"new") is False
        assert time.monotonic() - t0 < 0.15, "a build waited out the busy timeout on every store"
        assert len(calls.warned) == 1 and "busy" in calls.warned[0]
        assert calls.unusable == []
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert db.put("k2", b"new")  # once free, it works again


def _held_from_readers(tmp_path: Path) -> sqlite3.Connection:
    """A database with one entry ("k"), held by another connection in exclusive locking
    mode, which keeps even WAL readers out (another build's, or a sqlite3 shell's)."""
    db0 = Calls().db(tmp_path)
    assert db0.put("k", b"old")
    db0.close()
    holder = sqlite3.connect(tmp_path / actiondb.FILENAME, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO hits VALUES ('x', 1)")
    return holder


def test_a_database_held_from_readers_too_is_waited_for_once_not_at_each_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A holder in exclusive locking mode keeps even WAL readers out: each lookup waited the
    whole busy timeout again (six trivial targets took 110 s), as only stores gave up at once."""
    calls = Calls()
    monkeypatch.setattr(actiondb, "BUSY_TIMEOUT_S", 0.3)
    holder = _held_from_readers(tmp_path)
    try:
        db = calls.db(tmp_path)
        t0 = time.monotonic()
        assert db.get("k") is None  # (a miss)
        assert time.monotonic() - t0 >= 0.25, "the first lookup did not wait for the holder at all"
        for _ in range(3):
            t0 = time.monotonic()
            assert db.get("k") is None
            assert time.monotonic() - t0 < 0.2, "a later lookup waited out the busy timeout again"
        assert len(calls.warned) == 1 and "busy" in calls.warned[0], calls.warned
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert db.get("k") == b"old"  # once free, it works again


def test_lanes_looking_up_at_once_in_a_held_database_wait_once_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight lanes at once: the one that waited out the timeout marked the database busy
    only after letting go of the lock, so the next lane opened with the full wait again."""
    import threading

    calls = Calls()
    monkeypatch.setattr(actiondb, "BUSY_TIMEOUT_S", 1.0)
    holder = _held_from_readers(tmp_path)
    try:
        db = calls.db(tmp_path)
        got: list[bytes | None] = []
        lanes = [threading.Thread(target=lambda: got.append(db.get("k"))) for _ in range(8)]
        t0 = time.monotonic()
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()
        assert got == [None] * 8
        assert time.monotonic() - t0 < 1.8, "the lanes waited out the busy timeout more than once"
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_version_1_database_is_upgraded_in_place_keeping_its_entries(tmp_path: Path) -> None:
    """Version 1 kept rows in the key's b-tree (WITHOUT ROWID); version 2 is a rowid table
    with the same columns: the upgrade copies the rows, so the cache keeps its entries."""
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        c.execute("CREATE TABLE actions (key TEXT PRIMARY KEY, entry BLOB NOT NULL, used INTEGER NOT NULL) "
                  "WITHOUT ROWID")
        c.executemany("INSERT INTO actions VALUES (?, ?, ?)", [("k1", b"e1", 11), ("k2", b"e2" * 900, 22)])
        c.execute("PRAGMA user_version = 1")
        c.commit()
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.get("k1") == b"e1" and db.get("k2") == b"e2" * 900
    assert db.put("k3", b"e3") and db.get("k3") == b"e3"
    assert sorted((k, u) for k, u, _ in db.rows() if k != "k3") == [("k1", 11), ("k2", 22)]
    db.close()
    assert calls.warned == [] and calls.unusable == []
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == actiondb.SCHEMA_VERSION == 3
        (sql,) = c.execute("SELECT sql FROM sqlite_master WHERE name = 'actions'").fetchone()
        assert "WITHOUT ROWID" not in sql.upper()
        assert sorted(r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")) == \
            ["actions", "hits"]


def test_hits_of_entries_deleted_meanwhile_are_not_kept(tmp_path: Path) -> None:
    calls = Calls()
    build, gc = calls.db(tmp_path), calls.db(tmp_path)
    assert build.put("damaged", b"x") and build.put("evicted", b"y") and build.put("kept", b"z")
    assert build.get("damaged") and build.get("evicted") and build.get("kept")
    assert build.remove(["damaged"])  # found corrupt by this build: its hit is dropped too
    assert gc.remove(["evicted"])  # evicted by another process's GC before this build's flush
    build.flush()

    def hits() -> list[str]:
        with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
            return sorted(k for (k,) in c.execute("SELECT key FROM hits"))

    assert hits() == ["evicted", "kept"]
    assert gc.drop_stray_hits()
    assert hits() == ["kept"]
    assert [k for k, _, _ in gc.rows()] == ["kept"]
    build.close()
    gc.close()
    assert calls.warned == calls.unusable == []


def test_durations_are_noted_written_at_the_flush_and_looked_up_by_label(tmp_path: Path) -> None:
    """The critical-path weights of a build without a record of its own (a fresh checkout,
    after `clean`) come from here; a database without the table answers none."""
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.put("k", b"x")
    assert db.durations(["//:a"]) == {}  # (no table yet: made by the first write)
    labels = [f"//p:t{i}" for i in range(1200)]  # (more than one query's worth)
    db.note_durations((lab, i / 10) for i, lab in enumerate(labels))
    db.note_durations([("//p:t3", 7.5)])  # the last noted wins
    assert db.durations(["//p:t3"]) == {}  # (not written before the flush)
    db.flush()
    other = calls.db(tmp_path)  # another build, another connection
    got = other.durations([*labels, "//:unknown"])
    assert len(got) == 1200 and got["//p:t3"] == 7.5 and got["//p:t1199"] == 119.9
    other.close()
    db.close()
    # `plan` reads them without a connection that may write (upgrade, reset, WAL switch)
    assert actiondb.read_durations(str(tmp_path), ["//p:t3", "//:x"]) == {"//p:t3": 7.5}
    assert actiondb.read_durations(str(tmp_path / "none"), ["//p:t3"]) == {}
    assert calls.warned == calls.unusable == []


def test_a_durations_table_of_another_shape_never_costs_the_cache(tmp_path: Path) -> None:
    """The table only weighs the schedule: one a later buildtool made with other columns
    made the read mark the database unusable (caching off for the build), the flush lose
    its hits, and GC's sweep fail so that nothing was evicted."""
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.put("k", b"x") and db.put("gone", b"y")
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        c.execute("CREATE TABLE durations (label TEXT PRIMARY KEY, secs REAL) WITHOUT ROWID")
        c.commit()
    assert db.durations(["//:a"]) == {}
    assert db.get("k") == b"x" and db.readable
    db.note_durations([("//:a", 1.0)])
    db.flush()
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        assert [k for (k,) in c.execute("SELECT key FROM hits")] == ["k"]  # (the hit was written)
    assert db.readable
    assert db.remove(["gone"]) and db.drop_stray_hits()
    assert [k for k, _, _ in db.rows()] == ["k"]
    db.close()
    assert calls.warned == calls.unusable == []


def test_gc_drops_the_durations_older_than_every_entry_left(tmp_path: Path) -> None:
    calls = Calls()
    db = calls.db(tmp_path)
    db.note_durations([("//:old", 1.0)])
    db.flush()
    time.sleep(0.01)
    assert db.put("k", b"x")
    db.note_durations([("//:new", 2.0)])
    db.flush()
    assert db.drop_stray_hits()
    assert db.durations(["//:old", "//:new"]) == {"//:new": 2.0}
    assert db.remove(["k"]) and db.drop_stray_hits()  # (no entry left: nothing to date them by)
    assert db.durations(["//:new"]) == {"//:new": 2.0}
    db.close()


def test_descriptions_are_noted_written_at_the_flush_kept_per_label_and_trimmed_by_gc(tmp_path: Path) -> None:
    """The last action stored for each label (key, description), from every workspace:
    what a miss without a record of its own is compared with.  Another shape of the table
    answers nothing and costs the cache nothing."""
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.described_labels() == frozenset() and db.description("//:a") is None  # (no table yet)
    db.note_descriptions([("//:old", "k0", '{"cmd": "x"}')])
    db.flush()
    assert db.put("k3", b"x") and db.put("k2", b"y")
    db.note_descriptions([("//:a", "k1", '{"cmd": "one"}'), ("//:b", "k2", '{"cmd": "b"}')])
    db.note_descriptions([("//:a", "k3", '{"cmd": "two"}')])  # the last noted wins
    assert db.description("//:a") is None  # (not written before the flush)
    db.flush()
    other = calls.db(tmp_path)
    assert other.described_labels() == {"//:old", "//:a", "//:b"}
    assert other.description("//:a") == ("k3", '{"cmd": "two"}') and other.description("//:c") is None
    other.close()
    assert db.drop_stray_hits()  # (a description whose entry is gone goes with it: GC's size counts them)
    assert db.described_labels() == {"//:a", "//:b"}
    assert db.remove(["k2"]) and db.described_labels() == {"//:a"}  # (evicted, or damaged)
    db.close()
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        c.execute("DROP TABLE descriptions")
        c.execute("CREATE TABLE descriptions (label TEXT PRIMARY KEY, what TEXT)")
        c.commit()
    db = calls.db(tmp_path)
    assert db.described_labels() == frozenset() and db.description("//:a") is None and db.get("k3") == b"x"
    db.note_descriptions([("//:a", "k4", "{}")])
    db.flush()
    assert db.readable and db.drop_stray_hits()
    db.close()
    assert calls.warned == calls.unusable == []


def test_a_version_2_database_gains_the_hits_table_keeping_its_entries(tmp_path: Path) -> None:
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        c.execute("CREATE TABLE actions (key TEXT PRIMARY KEY, entry BLOB NOT NULL, used INTEGER NOT NULL)")
        c.executemany("INSERT INTO actions VALUES (?, ?, ?)", [("k1", b"e1", 11), ("k2", b"e2", 22)])
        c.execute("PRAGMA user_version = 2")
        c.commit()
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.get("k1") == b"e1"
    db.flush()
    used = {k: u for k, u, _ in db.rows()}
    assert used["k2"] == 22 and used["k1"] > 10**18  # the hit, in ns since the epoch
    db.close()
    assert calls.warned == [] and calls.unusable == []
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 3


@pytest.mark.parametrize("side", ["-wal", "-shm"])
def test_a_directory_in_place_of_the_log_or_shared_memory_file_is_removed(tmp_path: Path, side: str) -> None:
    """A restored tarball's damage: SQLite could not open the database (-wal) or only to
    read it (-shm) on every build, and `cache gc`/`stats` failed.  The entries stay."""
    db = Calls().db(tmp_path)
    assert db.put("old", b"entry")
    db.close()
    place = tmp_path / (actiondb.FILENAME + side)
    place.mkdir()
    (place / "x").write_text("x")
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.get("old") == b"entry" and db.put("new", b"v") and db.get("new") == b"v"
    db.close()
    assert calls.warned == [f"the cache database's actions.db{side} was a directory; removed it"], calls.warned
    assert calls.unusable == [] and not place.is_dir()


@pytest.mark.parametrize("damage", ["garbage", "directory", "other-version"])
def test_a_damaged_database_is_started_afresh(tmp_path: Path, damage: str) -> None:
    path = tmp_path / actiondb.FILENAME
    if damage == "garbage":
        path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    elif damage == "directory":
        path.mkdir()
        (path / "x").write_text("x")
    else:
        with contextlib.closing(sqlite3.connect(path)) as c:
            c.execute("PRAGMA user_version = 7")
    with pytest.raises(ActionDBError):
        Calls().db(tmp_path).rows()  # GC must stop, not see an empty cache
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.get("k") is None
    assert len(calls.warned) == 1 and "starting it afresh" in calls.warned[0]
    assert db.put("k", b"v") and db.get("k") == b"v"
    assert calls.unusable == []


def test_an_unopenable_database_turns_caching_off(tmp_path: Path) -> None:
    calls = Calls()
    db = calls.db(tmp_path / "no" / "such" / "dir")
    assert db.get("k") is None
    assert db.put("k", b"v") is False
    assert len(calls.unusable) == 1 and "unusable" in calls.unusable[0]


def test_an_entry_stored_as_text_or_a_number_reads_as_bytes_not_a_crash(tmp_path: Path) -> None:
    """A row whose type byte was flipped to TEXT (SQLite's integrity check still says ok),
    or that another tool wrote as text, raised TypeError out of every build that looked it
    up, and out of `cache stats` and `cache gc`."""
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.put("k", b'{"v":1}') and db.put("n", b"x")
    db.close()
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        c.execute("UPDATE actions SET entry = CAST(entry AS TEXT) WHERE key = 'k'")
        c.execute("UPDATE actions SET entry = 42 WHERE key = 'n'")
        c.commit()
    db = calls.db(tmp_path)
    assert db.get("k") == b'{"v":1}'
    assert db.get("n") == b"42"  # (not an entry: the cache's parser calls it corrupt, a miss)
    assert sorted((k, e) for k, _, e in db.rows()) == [("k", b'{"v":1}'), ("n", b"42")]
    assert calls.unusable == []


def test_an_entry_found_under_another_key_starts_the_database_afresh(tmp_path: Path) -> None:
    """A damaged key index handed out one action's entry for another's key (the restored
    output was the other action's, with exit 0 and no word): the cache keeps the key in
    the entry and checks it."""
    from buildtool.cache import ActionEntry, Cache, CachedOutput

    calls = Calls()
    cache = Cache(str(tmp_path / "c"), calls.warned.append)
    for key, digest in (("a" * 64, "1" * 64), ("b" * 64, "2" * 64)):
        cv.put_now(cache, key, ActionEntry((CachedOutput("o", digest, 0o644),), 0.1, None, None, {}))
    cache.actions.close()
    db_path = Path(cache.dir) / actiondb.FILENAME
    with contextlib.closing(sqlite3.connect(db_path)) as c:  # what the damaged index did: b's row holds a's entry
        c.execute(f"UPDATE actions SET entry = (SELECT entry FROM actions WHERE key = '{'a' * 64}') "
                  f"WHERE key = '{'b' * 64}'")
        c.commit()
    cache = Cache(str(tmp_path / "c"), calls.warned.append)
    assert cache.get_action("b" * 64) is None
    assert any("is damaged (the entry looked up under bbbbbbbbbbbb is aaaaaaaaaaaa's)" in w for w in calls.warned), \
        calls.warned
    assert cache.get_action("a" * 64) is None  # started afresh: nothing of it is trusted


def test_a_read_only_database_still_answers_after_a_store_is_refused(tmp_path: Path) -> None:
    """A database file this build may not write (another user's shared cache, read by a PR
    job; here an immutable file): the first store is refused with one warning, and every
    later lookup still hits (it missed from then on, so which targets a build restored
    depended on the order they ran in)."""
    db = Calls().db(tmp_path)
    assert db.put("k", b"entry")
    db.close()
    path = tmp_path / actiondb.FILENAME
    with immutable(path):
        calls = Calls()
        db = calls.db(tmp_path)
        assert db.get("k") == b"entry"
        assert db.put("k2", b"new") is False
        assert db.put("k3", b"new") is False
        assert len(calls.unusable) == 1 and "refused a store" in calls.unusable[0], calls.unusable
        assert db.get("k") == b"entry" and db.get("k2") is None
        db.close()
        assert len(calls.unusable) == 1 and calls.warned == [], (calls.unusable, calls.warned)


def test_a_full_disk_stops_stores_not_lookups(tmp_path: Path) -> None:
    """SQLITE_FULL on a store: nothing more is stored (one warning), what is there is still
    read (a full disk made every later lookup of the build miss)."""
    import os
    import shutil

    where = tmp_path / "small"
    where.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount") or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        calls = Calls()
        db = calls.db(where)
        assert db.put("first", b"kept")
        stored = 0
        while db.put(f"k{stored}", os.urandom(4000)):
            stored += 1
            assert stored < 1000, "the 200k filesystem never filled"
        assert len(calls.unusable) == 1 and "refused a store" in calls.unusable[0], calls.unusable
        assert db.put("more", b"x") is False and len(calls.unusable) == 1
        assert db.get("first") == b"kept"
        db.close()
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_damaged_name_in_the_schema_is_damage_not_a_crash(tmp_path: Path) -> None:
    """One flipped bit in a table name of the schema: SQLite's error message quotes the
    name, which is then not UTF-8, and sqlite3 raised UnicodeDecodeError: every target
    failed as an internal error, in every build, until the file was deleted by hand."""
    db = Calls().db(tmp_path)
    assert db.put("k", b"entry")
    db.close()
    path = tmp_path / actiondb.FILENAME
    with contextlib.closing(sqlite3.connect(path)) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    at = data.find(b"tablehitshits")
    assert at > 0
    data[at + 6] ^= 0x80  # the 'i' of the second "hits"
    path.write_bytes(bytes(data))
    calls = Calls()
    db = calls.db(tmp_path)
    db.get("k")  # whatever it answers, nothing is raised
    assert db.put("k2", b"new")
    assert any("damaged" in w for w in calls.warned), calls.warned
    assert db.get("k2") == b"new"


def test_a_database_in_a_directory_it_may_not_write_is_read_as_an_immutable_file(tmp_path: Path) -> None:
    """A cache saved after `cache gc` (no -wal, no -shm) on a read-only mount: SQLite cannot
    make the -shm file a WAL database needs, "unable to open database file", and caching
    was off for the build (every target ran).  The file alone is every entry then."""
    where = tmp_path / "v"
    where.mkdir()
    db = Calls().db(where)
    assert db.put("k", b"entry")
    db.close()
    assert not (where / (actiondb.FILENAME + "-wal")).exists()
    with immutable(where):
        calls = Calls()
        db = calls.db(where)
        assert db.get("k") == b"entry" and db.get("k2") is None
        assert db.put("k2", b"new") is False
        assert len(calls.unusable) == 1 and "refused a store" in calls.unusable[0], calls.unusable
        assert db.get("k") == b"entry"
        db.close()
    assert calls.warned == [], calls.warned


def test_another_user_s_cache_is_read_as_an_immutable_file(tmp_path: Path) -> None:
    """A cache dir owned by another user (755), after its owner's `cache gc`: SQLite said
    "attempt to write a readonly database" (it cannot make the -shm) and caching was off."""
    import os
    import shutil
    import sys
    import tempfile

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to read the cache as another user")
    where = Path(tempfile.mkdtemp(prefix="bt-other-user-", dir="/tmp"))  # (tmp_path's parents are 0700)
    try:
        where.chmod(0o755)
        db = Calls().db(where)
        assert db.put("k", b"entry")
        db.close()
        probe = ("import sys\nfrom buildtool import actiondb\nw, u = [], []\n"
                 f"db = actiondb.ActionDB({str(where)!r}, w.append, u.append)\n"
                 "print(db.get('k'), db.put('k2', b'x'), db.get('k'), len(w), ['refused a store' in m for m in u])\n")
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
        if subprocess.run([*as_nobody, "import buildtool"], capture_output=True).returncode:
            pytest.skip("this Python or buildtool is not readable by another user here")
        out = subprocess.run([*as_nobody, probe], capture_output=True, text=True, check=True).stdout
        assert out.strip() == "b'entry' False b'entry' 0 [True]", out
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_read_only_database_changed_under_its_reader_is_a_miss_not_started_afresh(tmp_path: Path) -> None:
    """Its owner's build writes it meanwhile: SQLite's "malformed" was taken for damage,
    "starting it afresh" said (and on a read-only mount, nothing could be deleted)."""
    where = tmp_path / "v"
    where.mkdir()
    db = Calls().db(where)
    assert db.put_many([(f"k{i}", b"e" * 3000) for i in range(50)])
    db.close()
    path = where / actiondb.FILENAME
    with immutable(where):
        calls = Calls()
        db = calls.db(where)
        assert db.get("k1") == b"e" * 3000
        size = path.stat().st_size
        with open(path, "r+b") as f:  # (the owner's checkpoint, as seen mid-way by a reader)
            f.seek(4096)
            f.write(b"\xff" * (size - 4096))
        assert [db.get(f"k{i}") for i in range(2, 50)] == [None] * 48
        db.close()
    assert len(calls.warned) == 1 and "changed while it was read" in calls.warned[0], calls.warned
    assert calls.unusable == [] and path.stat().st_size == size


def test_a_transaction_whose_step_fails_leaves_nothing_of_its_earlier_steps(tmp_path: Path) -> None:
    # (remove(): the entries deleted and their hits not, or half a batch of stores, kept)
    from buildtool.actiondb import ActionDB

    c = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    c.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    with pytest.raises(sqlite3.Error):
        ActionDB._in_transaction(c, [("INSERT INTO t VALUES (?)", [("a",)]), ("INSERT INTO nowhere VALUES (1)", None)])
    assert c.execute("SELECT count(*) FROM t").fetchone() == (0,)
    c.close()


def test_close_writes_the_hits_and_durations_noted_since_the_last_flush(tmp_path: Path) -> None:
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.put("k", b'{"v":1}')
    stored = used_of(tmp_path, "k")
    time.sleep(0.01)
    assert db.get("k") is not None
    db.note_durations([("//:t", 2.5)])
    db.close()
    assert used_of(tmp_path, "k") > stored  # (else GC took the entry for unused since it was stored)
    assert calls.db(tmp_path).durations(["//:t"]) == {"//:t": 2.5}


def test_a_database_path_that_is_a_symbolic_link_is_not_written_through(tmp_path: Path) -> None:
    # Planted by another user of a shared cache: SQLite would make its tables in the file the
    # link leads to.  The link is replaced by a database of the cache's own (reliability.md).
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / actiondb.FILENAME).symlink_to(victim)
    calls = Calls()
    db = calls.db(tmp_path / "v")
    assert db.put("k", b"x")
    db.close()
    assert victim.read_text() == "keep me\n"
    assert not (tmp_path / "v" / actiondb.FILENAME).is_symlink()


def test_an_entry_with_a_null_key_leaves_the_eviction_of_descriptions_working(tmp_path: Path) -> None:
    """`key NOT IN (SELECT key FROM actions)` is never true once another tool put a NULL key
    in actions (a TEXT PRIMARY KEY allows one): evicted entries' descriptions and hits stayed."""
    calls = Calls()
    db = calls.db(tmp_path)
    assert db.put("k1", b"x") and db.put("k2", b"y")
    db.note_descriptions([("//:a", "k1", "{}"), ("//:b", "k2", "{}")])
    db.flush()
    db.close()
    with contextlib.closing(sqlite3.connect(tmp_path / actiondb.FILENAME)) as c:
        c.execute("INSERT INTO actions (key, entry, used) VALUES (NULL, x'00', 0)")
        c.commit()
    db = calls.db(tmp_path)
    assert db.remove(["k2"]) and db.described_labels() == {"//:a"}
    db.close()


def test_an_entry_stored_again_adds_only_what_it_grew_by(tmp_path: Path) -> None:
    """`build -B` stores the same keys again: each time their whole size went into the cache's
    running size counter (six runs: 458 KB counted, 78 KB there), so GC scanned for nothing."""
    db = Calls().db(tmp_path)
    assert db.put_many([("a", b"x" * 1000), ("b", b"y" * 500)]) == 1500
    assert db.put_many([("a", b"x" * 1000), ("b", b"y" * 500)]) == 1  # (stored: never 0)
    assert db.put_many([("a", b"x" * 1200), ("c", b"z" * 10)]) == 210
    assert db.get("a") == b"x" * 1200 and db.get("c") == b"z" * 10
