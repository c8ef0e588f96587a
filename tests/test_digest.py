"""Digests and the persistent stat cache, including git's racily-clean rule."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest
from conftest import Workspace

from buildtool import digest as digest_mod
from buildtool.digest import StatCache, hash_bytes, hash_file

SECOND = 1_000_000_000


def test_hash_file_is_blake3_of_content(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"hello\n")
    assert hash_file(str(p)) == blake3.blake3(b"hello\n").hexdigest() == hash_bytes(b"hello\n")


def test_what_is_not_a_file_is_named(tmp_path: Path) -> None:
    """A source replaced by a directory during a build was called "a named pipe, device
    or socket"."""
    import re

    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "p")
    for name, what in (("d", "not a regular file (a directory)"), ("p", "not a regular file (a named pipe)")):
        with pytest.raises(OSError, match=re.escape(what)):
            hash_file(str(tmp_path / name))


def test_large_files_hash_the_same_via_mmap(tmp_path: Path) -> None:
    data = os.urandom(1024) * (digest_mod.LARGE_FILE // 1024 + 3)
    p = tmp_path / "big"
    p.write_bytes(data)
    assert hash_file(str(p)) == blake3.blake3(data).hexdigest()


# --- large files: mmap windows under a read lease -----------------------------------------

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="read leases (F_SETLEASE) are Linux's")
MiB = 1 << 20


def _leased(path: Path) -> tuple[int, os.stat_result | None, str]:
    """What _hash_leased makes of a file: (bytes fed, stat under the lease, digest fed)."""
    h = blake3.blake3()
    fd = os.open(path, os.O_RDONLY)
    try:
        done, st = digest_mod._hash_leased(fd, h)
    finally:
        os.close(fd)
    return done, st, h.hexdigest()


def _holds_lease(path: Path) -> bool:
    ino = f":{os.stat(path).st_ino} "
    with open("/proc/locks") as f:
        return any("LEASE" in line and ino in line for line in f)


@linux_only
@pytest.mark.parametrize("extra", [-1, 0, 1, MiB - 1, MiB, MiB + 4097])
def test_large_file_digest_around_window_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: int
) -> None:
    monkeypatch.setattr(digest_mod, "WINDOW", MiB)  # 4-6 windows, not one
    data = os.urandom(digest_mod.LARGE_FILE + extra)
    p = tmp_path / "big"
    p.write_bytes(data)
    want = blake3.blake3(data).hexdigest()
    assert hash_file(str(p)) == want
    if len(data) >= digest_mod.LARGE_FILE:
        done, st, got = _leased(p)
        assert (done, got) == (len(data), want)  # every byte through the mapping
        assert st is not None and st.st_size == len(data)
    assert not _holds_lease(p)


@linux_only
def test_large_file_one_byte_past_the_real_window(tmp_path: Path) -> None:
    data = os.urandom(digest_mod.WINDOW + 1)  # random throughout: a window hashed twice would show
    p = tmp_path / "big"
    p.write_bytes(data)
    want = blake3.blake3(data).hexdigest()
    assert hash_file(str(p)) == want
    assert _leased(p)[::2] == (len(data), want)


@linux_only
def test_file_open_for_writing_elsewhere_is_read_not_mapped(tmp_path: Path) -> None:
    data = os.urandom(digest_mod.LARGE_FILE + 123)
    p = tmp_path / "big"
    p.write_bytes(data)
    writer = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys; fd = os.open({str(p)!r}, os.O_WRONLY); print(1, flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "1\n"
        assert _leased(p) == (0, None, blake3.blake3().hexdigest())  # lease refused (EAGAIN)
        assert hash_file(str(p)) == blake3.blake3(data).hexdigest()
    finally:
        writer.communicate("", timeout=30)
    assert _leased(p)[0] == len(data)  # the writer gone: mapped again


@linux_only
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to chown and drop CAP_LEASE")
def test_file_we_neither_own_nor_may_lease_is_read(tmp_path: Path) -> None:
    data = os.urandom(digest_mod.LARGE_FILE + 5)
    p = tmp_path / "big"
    p.write_bytes(data)
    os.chown(p, 65534, 65534)
    os.chmod(p, 0o644)
    tmp_path.chmod(0o755)
    script = (
        "import os, sys, blake3\n"
        "from buildtool import digest\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "print(digest._hash_leased(fd, blake3.blake3())[0], digest.hash_file(sys.argv[1]))\n"
    )
    p_run = subprocess.run(
        ["setpriv", "--bounding-set", "-lease", "--inh-caps", "-lease", sys.executable, "-c", script, str(p)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p_run.returncode == 0, p_run.stderr
    assert p_run.stdout.split() == ["0", blake3.blake3(data).hexdigest()]  # EACCES: read instead


def test_a_kernel_that_revokes_leases_quickly_gets_no_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(digest_mod.LARGE_FILE)
    p = tmp_path / "big"
    p.write_bytes(data)
    monkeypatch.setattr(digest_mod, "_lease_break_ok", False)
    assert _leased(p) == (0, None, blake3.blake3().hexdigest())
    assert hash_file(str(p)) == blake3.blake3(data).hexdigest()
    monkeypatch.setattr(digest_mod, "_lease_break_ok", None)  # read again from /proc
    try:
        with open("/proc/sys/fs/lease-break-time") as f:
            expected = int(f.read()) >= digest_mod.MIN_LEASE_BREAK_S
    except OSError:
        expected = False
    assert digest_mod._lease_break_time_ok() is expected


@linux_only
def test_lease_is_released_after_hashing(tmp_path: Path) -> None:
    p = tmp_path / "big"
    p.write_bytes(os.urandom(digest_mod.LARGE_FILE))
    hash_file(str(p))
    assert not _holds_lease(p)
    # O_NONBLOCK: a leased file would fail with EWOULDBLOCK instead of making us wait.
    code = f"import os; os.close(os.open({str(p)!r}, os.O_WRONLY | os.O_NONBLOCK)); print('opened')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)
    assert (r.returncode, r.stdout) == (0, "opened\n"), r.stderr


# A hasher process whose n-th hash update (one mmap window) first waits until a writer is
# blocked on our lease (/proc/locks shows it BREAKING), then HOLD_S longer, and whose m-th
# update first sleeps LINGER_S; it reports the digest, what the stat cache remembered, and
# the kind of buffer each update got.
HOLD_S = 0.5
LINGER_S = 3.0
_HASHER = """
import os, sys, time
import blake3
from buildtool import digest

root, name, window, pause_at, linger_at = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
digest.WINDOW = window
ino = ":%d " % os.stat(os.path.join(root, name)).st_ino
real = blake3.blake3
kinds = []
seen = []

def breaking():
    with open("/proc/locks") as f:
        return any("LEASE" in line and "BREAKING" in line and ino in line for line in f)

class Pausing:
    AUTO = real.AUTO
    def __init__(self, *args, **kwargs):
        self._h = real(*args, **kwargs)
    def update(self, data):
        kinds.append(type(data).__name__)
        if len(kinds) == pause_at:
            print("hashing", flush=True)
            deadline = time.monotonic() + 20
            while not breaking() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(breaking())
            time.sleep(HOLD_S)
        if len(kinds) == linger_at:
            time.sleep(LINGER_S)
        self._h.update(data)
        return self
    def hexdigest(self):
        return self._h.hexdigest()

digest.blake3 = type(sys)("pausing_blake3")
digest.blake3.blake3 = Pausing
sc = digest.StatCache(root, None, print)
d = sc.digest(name)
e = sc.entries.get(name)
print(d, e[5] if e else None, e[0] if e else None, seen == [True], ",".join(kinds), flush=True)
""".replace("HOLD_S", repr(HOLD_S)).replace("LINGER_S", repr(LINGER_S))

WRITERS = {
    "open O_TRUNC": "fd = os.open(path, os.O_WRONLY | os.O_TRUNC); os.write(fd, b'new'); os.close(fd)",
    "truncate(2)": "os.truncate(path, 3)",
    "open O_WRONLY": "os.close(os.open(path, os.O_WRONLY))",  # breaks the lease, changes nothing
}


def _writer_arrives_while_hashing(
    tmp_path: Path, data: bytes, window: int, pause_at: int, writer: str, linger_at: int = 0
) -> tuple[dict[str, object], float]:
    """Run _HASHER on ``data`` and, during its ``pause_at``-th window, the writer in another
    process; return the hasher's report and how long the writer's call was blocked."""
    p = tmp_path / "big"
    p.write_bytes(data)
    hasher = subprocess.Popen(
        [sys.executable, "-c", _HASHER, str(tmp_path), "big", str(window), str(pause_at), str(linger_at)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert hasher.stdout is not None and hasher.stdout.readline() == "hashing\n"
        code = (
            f"import os, time; path = {str(p)!r}; t = time.monotonic(); {WRITERS[writer]}; print(time.monotonic() - t)"
        )
        w = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
        out, err = hasher.communicate(timeout=60)
    finally:
        if hasher.poll() is None:
            hasher.kill()
            hasher.wait()
    # A lease break signalled with SIGIO, or a mapped page truncated away (SIGBUS), kills it.
    assert hasher.returncode == 0, f"hasher died: {hasher.returncode} {err}"
    assert w.returncode == 0, w.stderr
    d, remembered, size, saw_break, kinds = out.split()
    report = {"digest": d, "remembered": remembered, "size": size, "saw_break": saw_break, "kinds": kinds}
    return report, float(w.stdout)


@linux_only
@pytest.mark.parametrize("writer", ["open O_TRUNC", "truncate(2)"])
def test_writer_during_the_last_window_waits_and_cannot_kill_us(tmp_path: Path, writer: str) -> None:
    data = os.urandom(3 * 2 * MiB)
    r, waited = _writer_arrives_while_hashing(tmp_path, data, 2 * MiB, 3, writer)
    want = blake3.blake3(data).hexdigest()
    assert r["saw_break"] == "True"  # the writer was blocked by our lease...
    assert HOLD_S * 0.8 <= waited < 20  # ...until we released it, not lease-break-time (45 s)
    assert r["kinds"] == "mmap,mmap,mmap"
    # The digest is of what we mapped, and the stat it is remembered with is that file's.
    assert r["digest"] == r["remembered"] == want and r["size"] == str(len(data))
    assert (tmp_path / "big").read_bytes()[:3] in (b"new", data[:3])
    assert (tmp_path / "big").stat().st_size == 3


@linux_only
def test_writer_mid_file_gets_in_after_one_window_and_the_rest_is_read(tmp_path: Path) -> None:
    data = os.urandom(3 * 2 * MiB)
    r, waited = _writer_arrives_while_hashing(tmp_path, data, 2 * MiB, 1, "open O_WRONLY", linger_at=2)
    assert r["saw_break"] == "True"
    # Let in once window 1 is hashed, not after the slow rest (LINGER_S) nor at close.
    assert HOLD_S * 0.8 <= waited < HOLD_S + LINGER_S / 2
    assert r["kinds"] == "mmap,memoryview"  # lease given up after window 1, the rest read
    want = blake3.blake3(data).hexdigest()
    assert r["digest"] == r["remembered"] == want


@linux_only
def test_truncation_mid_file_never_kills_us_nor_leaves_a_wrong_digest(tmp_path: Path) -> None:
    data = os.urandom(3 * 2 * MiB)
    r, waited = _writer_arrives_while_hashing(tmp_path, data, 2 * MiB, 1, "truncate(2)")
    assert r["saw_break"] == "True" and HOLD_S * 0.8 <= waited < 20
    assert r["kinds"].split(",")[0] == "mmap" and "mmap" not in r["kinds"].split(",")[1:]
    # Remembered only if the whole file was read before the truncation, and then rightly.
    if r["remembered"] != "None":
        assert r["remembered"] == r["digest"] == blake3.blake3(data).hexdigest()
        assert r["size"] == str(len(data))


def _age(p: Path, seconds: float) -> None:
    """Give a file an mtime in the past (ctime stays 'now', which is what git sees too)."""
    t = time.time_ns() - int(seconds * SECOND)
    os.utime(p, ns=(t, t))


def test_stat_cache_avoids_rehashing_unchanged_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "src.txt"
    p.write_text("content\n")
    sc = StatCache(str(tmp_path), None, lambda m: None)
    d1 = sc.digest("src.txt")
    # Pretend time moved on well past the racy window, so the entry is trustworthy.
    sc.entries["src.txt"][4] += 10 * SECOND
    calls: list[str] = []
    real = digest_mod._hash_fd
    monkeypatch.setattr(digest_mod, "_hash_fd", lambda path: calls.append(path) or real(path))
    assert sc.digest("src.txt") == d1
    assert calls == []  # served from the stat cache
    p.write_text("changed!\n")
    assert sc.digest("src.txt") == hash_bytes(b"changed!\n")
    assert len(calls) == 1


def test_racily_clean_file_is_rehashed_even_if_stat_is_identical(tmp_path: Path) -> None:
    """The file is modified within the timestamp granularity of its hashing, so its stat
    data may not change (simulated by presenting the *old* stat): it must be rehashed."""
    p = tmp_path / "racy.txt"
    p.write_bytes(b"AAAA")
    sc = StatCache(str(tmp_path), None, lambda m: None)
    st_old = os.stat(p)
    assert sc.digest("racy.txt", st_old) == hash_bytes(b"AAAA")
    # Same size, mtime put back: only the content differs.
    p.write_bytes(b"BBBB")
    os.utime(p, ns=(st_old.st_atime_ns, st_old.st_mtime_ns))
    assert sc.lookup("racy.txt", st_old) is None  # entry is racy: not trusted
    assert sc.digest("racy.txt", st_old) == hash_bytes(b"BBBB")


def test_same_racy_scenario_but_hashed_long_after_the_write_is_trusted(tmp_path: Path) -> None:
    """Control for the test above: the stat cache really does vouch for old-enough files."""
    p = tmp_path / "old.txt"
    p.write_bytes(b"AAAA")
    sc = StatCache(str(tmp_path), None, lambda m: None)
    st = os.stat(p)
    d = sc.digest("old.txt", st)
    e = sc.entries["old.txt"]
    e[4] = max(e[1], e[3]) + 5 * SECOND  # hashed 5 s after the last change
    assert sc.lookup("old.txt", st) == d


def test_rewrite_same_size_and_same_mtime_right_after_hashing_is_detected(tmp_path: Path) -> None:
    p = tmp_path / "f.txt"
    p.write_bytes(b"version-1")
    sc = StatCache(str(tmp_path), None, lambda m: None)
    before = os.stat(p)
    assert sc.digest("f.txt") == hash_bytes(b"version-1")
    p.write_bytes(b"version-2")
    os.utime(p, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(p)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert sc.digest("f.txt") == hash_bytes(b"version-2")


def test_coarse_timestamps_use_a_wider_racy_window() -> None:
    whole = 1_700_000_000 * SECOND
    # Whole-second mtime/ctime: anything hashed within 2 s is racy.
    assert digest_mod.racy(whole, whole, whole + SECOND)
    assert not digest_mod.racy(whole, whole, whole + 3 * SECOND)
    # Fine-grained timestamps: a much shorter window.
    fine = whole + 123_456_789
    assert digest_mod.racy(fine, fine, fine + 1_000_000)
    assert not digest_mod.racy(fine, fine, fine + SECOND)
    # ctime newer than mtime counts (chmod, utime back...).
    assert digest_mod.racy(fine - 10 * SECOND, fine, fine + 1_000_000)


def test_stat_cache_persists_and_detects_inode_change(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_text("one")
    _age(p, 100)
    db = str(tmp_path / "stat-cache")
    sc = StatCache(str(tmp_path), db, lambda m: None)
    d = sc.digest("f")
    sc.entries["f"][4] = max(sc.entries["f"][1], sc.entries["f"][3]) + 5 * SECOND
    sc.dirty = True
    sc.save()
    sc2 = StatCache(str(tmp_path), db, lambda m: None)
    assert sc2.lookup("f", os.stat(p)) == d
    # Replace the file by another one with identical size and mtime: the inode differs.
    st = os.stat(p)
    tmp = tmp_path / "f.new"
    tmp.write_text("two")
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, p)
    assert sc2.lookup("f", os.stat(p)) is None
    assert sc2.digest("f") == hash_bytes(b"two")


def test_stat_cache_appends_small_changes_and_survives_a_torn_or_missing_file(tmp_path: Path) -> None:
    for name in "abc":
        (tmp_path / name).write_text(name)
    db = tmp_path / "stat-cache"
    warned: list[str] = []
    sc = StatCache(str(tmp_path), str(db), warned.append)
    sc.digest("a")
    sc.digest("b")
    sc.save()
    whole = db.read_bytes()
    sc = StatCache(str(tmp_path), str(db), warned.append)
    sc.forget("a")
    sc.digest("c")
    sc.save()
    assert db.read_bytes().startswith(whole) and _journal_lines(db) == 1
    sc = StatCache(str(tmp_path), str(db), warned.append)
    assert sorted(sc.entries) == ["b", "c"]
    assert sc.entries["c"][5] == hash_bytes(b"c")
    # A build killed while appending leaves a torn line: ignored, and the next save rewrites.
    with open(db, "ab") as f:
        f.write(b'{"a":[1,2')
    sc = StatCache(str(tmp_path), str(db), warned.append)
    assert sorted(sc.entries) == ["b", "c"] and not warned
    sc.digest("a")
    sc.save()
    assert _journal_lines(db) == 0  # the whole map again
    assert sorted(StatCache(str(tmp_path), str(db), warned.append).entries) == ["a", "b", "c"]
    # The file removed under a live stat cache (buildtool clean in watch mode): written whole.
    db.unlink()
    sc.forget("b")
    sc.save()
    assert sorted(StatCache(str(tmp_path), str(db), warned.append).entries) == ["a", "c"]
    # A link put in its place under a live stat cache: never appended through, replaced.
    elsewhere = tmp_path / "elsewhere"
    os.replace(db, elsewhere)
    before = elsewhere.read_bytes()
    db.symlink_to(elsewhere)
    sc.digest("b")
    sc.save()
    assert elsewhere.read_bytes() == before and not db.is_symlink()
    assert sorted(StatCache(str(tmp_path), str(db), warned.append).entries) == ["a", "b", "c"]
    assert not warned


def test_corrupt_stat_cache_is_discarded_with_a_warning(tmp_path: Path) -> None:
    db = tmp_path / "stat-cache"
    db.write_text(digest_mod.HEADER + "{not json")
    got: list[str] = []
    sc = StatCache(str(tmp_path), str(db), got.append)
    assert sc.entries == {}
    assert got and "corrupt" in got[0]


def test_same_size_same_mtime_edit_between_builds_reruns(workspace: Workspace) -> None:
    """End to end: rewrite a source with the same size and put its mtime back right after
    a build hashed it; the next build still sees the change."""
    src = workspace.write("in.txt", "aaaa\n")
    workspace.build_file("", 'genrule(name="t", srcs=["in.txt"], outs=["out.txt"], cmd="cat $< > $@")\n')
    r = workspace.build()
    assert r.rc == 0, r.output
    st = os.stat(src)
    src.write_text("bbbb\n")
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = workspace.build()
    assert r.rc == 0, r.output
    assert r.status("//:t") == "ran"
    assert workspace.read("out.txt") == "bbbb\n"
    # And a third build with nothing changed is a no-op.
    r = workspace.build()
    assert r.status("//:t") == "up_to_date"


def _journal_lines(db: Path) -> int:
    """How many journal lines follow the map section of a v3 stat cache file."""
    data = db.read_bytes()
    assert data.startswith(digest_mod.HEADER.encode())
    _, at = digest_mod._decode_map(data, len(digest_mod.HEADER))
    return data[at:].count(b"\n")


@pytest.mark.parametrize("old", ["v1", "v2"])
def test_an_older_stat_cache_is_read_quietly_and_rewritten_as_v3(tmp_path: Path, old: str) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "h").write_text("z")
    db = tmp_path / "stat-cache"
    warned: list[str] = []
    sc = StatCache(str(tmp_path), str(db), warned.append)
    sc.digest("f")
    sc.digest("h")
    entries = dict(sc.entries)
    if old == "v1":
        db.write_text(digest_mod.HEADER_V1 + json.dumps(entries))
    else:  # the map, then a journal line that forgets h
        db.write_text(digest_mod.HEADER_V2 + json.dumps(entries) + "\n" + json.dumps({"h": None}) + "\n")
        del entries["h"]
    sc = StatCache(str(tmp_path), str(db), warned.append)
    assert sc.entries == entries and not warned
    (tmp_path / "g").write_text("y")
    sc.digest("g")
    sc.save()
    assert _journal_lines(db) == 0  # rewritten whole as v3, not appended to the JSON map
    assert set(StatCache(str(tmp_path), str(db), warned.append).entries) == {*entries, "g"} and not warned


def test_stat_cache_columns_round_trip_every_entry(tmp_path: Path) -> None:
    """What the columns cannot hold (a remote digest, an inode past 2**64) goes to a JSON
    line; odd names and pre-1970 mtimes round-trip; entries are built on demand.  (An entry
    of another shape is not one: such a line is discarded as corrupt, below.)"""
    db = tmp_path / "stat-cache"
    blake = hash_bytes(b"x")
    want = {
        "plain.txt": [3, 1_700_000_000_123_456_789, 42, 1_700_000_000_223_456_789, 1_700_000_001_000_000_000, blake],
        "old\nname \udcff.c": [0, -5 * SECOND, 2**64 - 1, 7, 8, blake],  # newline, non-UTF-8 byte
        "remote.o": [1, 2, 3, 4, 5, "remote:sha256:" + "ab" * 32 + ":1"],
        "huge-ino": [1, 2, 2**64, 4, 5, blake],
    }
    sc = StatCache(str(tmp_path), str(db), lambda m: None)
    for rel, e in want.items():
        sc.entries[rel] = list(e)
    sc.dirty = True
    sc.save()
    warned: list[str] = []
    back = StatCache(str(tmp_path), str(db), warned.append)
    assert not warned
    assert back.entries._over == {"remote.o": want["remote.o"], "huge-ino": want["huge-ino"]}
    assert len(back.entries) == 4 and set(back.entries) == set(want)
    assert back.entries["plain.txt"] == want["plain.txt"]
    assert "old\nname \udcff.c" in back.entries and dict(back.entries) == want
    assert "missing" not in back.entries and back.entries.get("missing") is None
    back.entries.pop("plain.txt")
    assert "plain.txt" not in back.entries and len(back.entries) == 3
    with open(db, "a") as f:  # (lookup indexed it: an IndexError in every build until `clean`)
        f.write('{"short":[1,2,3]}\n{"plain.txt":null}\n')
    warned.clear()
    assert len(StatCache(str(tmp_path), str(db), warned.append).entries) == 0
    assert warned == [f"stat cache {db} has a corrupt line; discarding it"], warned


def test_stat_cache_written_in_the_other_byte_order_is_read(tmp_path: Path) -> None:
    """A cache copied from a machine of the other byte order: its columns are swapped."""
    from array import array

    f = tmp_path / "f"
    f.write_text("f")
    db = tmp_path / "stat-cache"
    sc = StatCache(str(tmp_path), str(db), lambda m: None)
    sc.digest("f")
    sc.save()
    entries, _ = digest_mod._decode_map(db.read_bytes(), len(digest_mod.HEADER))
    other = "big" if sys.byteorder == "little" else "little"
    meta = json.dumps({"n": 1, "paths": 2, "order": other}, separators=(",", ":")).encode()
    cols = []
    for code, v in zip(digest_mod.COLUMNS, entries["f"][:5], strict=True):
        col = array(code, [v])
        col.byteswap()
        cols.append(col.tobytes())
    db.write_bytes(digest_mod.HEADER.encode() + meta + b"\n" + b"f\0" + b"".join(cols)
                   + bytes.fromhex(entries["f"][5]) + b"\n")
    warned: list[str] = []
    assert dict(StatCache(str(tmp_path), str(db), warned.append).entries) == {"f": entries["f"]} and not warned


def test_truncated_stat_cache_map_is_discarded_with_a_warning(tmp_path: Path) -> None:
    for name in "ab":
        (tmp_path / name).write_text(name)
    db = tmp_path / "stat-cache"
    sc = StatCache(str(tmp_path), str(db), lambda m: None)
    sc.digest("a")
    sc.digest("b")
    sc.save()
    whole = db.read_bytes()
    for cut in (len(whole) - 1, len(whole) - 40, len(digest_mod.HEADER) + 10):
        db.write_bytes(whole[:cut])
        warned: list[str] = []
        assert len(StatCache(str(tmp_path), str(db), warned.append).entries) == 0
        assert warned and "corrupt" in warned[0]


def test_a_sparse_file_on_tmpfs_is_hashed_without_filling_its_holes() -> None:
    """Hashed through a shared mapping, every hole of a sparse file on tmpfs got a page:
    a 100 MB sparse source on a 20 MB tmpfs killed the build with SIGBUS and was left
    taking the whole tmpfs; with room, it silently took its size in RAM."""
    shm = "/dev/shm"
    try:
        with open("/proc/mounts") as f:
            on_tmpfs = any(line.split()[1:3] == [shm, "tmpfs"] for line in f)
    except OSError:
        on_tmpfs = False
    if not on_tmpfs or not os.access(shm, os.W_OK):
        pytest.skip("no writable tmpfs at /dev/shm")
    path = os.path.join(shm, f"buildtool-sparse-{os.getpid()}")
    try:
        with open(path, "wb") as f:
            f.truncate(8 * 1024 * 1024)  # (above LARGE_FILE: the threaded path)
        assert os.stat(path).st_blocks == 0
        assert hash_file(path) == blake3.blake3(bytes(8 * 1024 * 1024)).hexdigest()
        assert os.stat(path).st_blocks == 0, "hashing gave the holes pages"
    finally:
        os.unlink(path)


def test_the_stat_cache_journal_is_compacted_rather_than_growing_with_every_build(tmp_path: Path) -> None:
    """Each build appends one journal line with the entries it changed; past a quarter of
    the map (64 entries at least) the file is written whole again.  Without that, a file
    edited between every two builds grew the stat cache by a line per build, for ever, and
    every build read and replayed all of them."""
    for name in "abcd":
        (tmp_path / name).write_text(name)
    db = tmp_path / "stat-cache"
    sc = StatCache(str(tmp_path), str(db), lambda m: None)
    for name in "abcd":
        sc.digest(name)
    sc.save()
    most = 0
    for build in range(150):  # one edited file, hashed again by each build
        (tmp_path / "a").write_text(f"a{build}")
        sc = StatCache(str(tmp_path), str(db), lambda m: None)
        sc.digest("a")
        sc.save()
        most = max(most, _journal_lines(db))
    assert 1 < most <= 64 and _journal_lines(db) < 64
    sc = StatCache(str(tmp_path), str(db), lambda m: None)
    assert sorted(sc.entries) == ["a", "b", "c", "d"] and sc.entries["a"][5] == hash_bytes(b"a149")


def test_a_file_dated_in_the_future_is_not_hashed_again_by_every_build(tmp_path: Path) -> None:
    """An mtime in the future (a tarball from a machine whose clock is ahead, `touch -d
    2030`) says nothing of when the file changed; its ctime, set at the utime, does.  Taken
    as the newest time, the mtime kept the file "racily clean" until that date: every
    build hashed it again (a large generated file: seconds per build)."""
    p = tmp_path / "vendored.txt"
    p.write_text("from a tarball\n")
    future = time.time_ns() + 5 * 365 * 86400 * SECOND
    os.utime(p, ns=(future, future))
    time.sleep(0.1)  # (the ctime the utime set: out of the racy window)
    db = str(tmp_path / "stat-cache")
    sc = StatCache(str(tmp_path), db, lambda m: None)
    d = sc.digest("vendored.txt")
    sc.save()
    sc = StatCache(str(tmp_path), db, lambda m: None)  # the next build
    assert sc.lookup("vendored.txt", os.stat(p)) == d
    # An edit is still seen.
    p.write_text("edited\n")
    assert sc.lookup("vendored.txt", os.stat(p)) is None
    assert sc.digest("vendored.txt") == hash_bytes(b"edited\n")


def test_a_large_file_is_hashed_on_one_thread_when_blake3_cannot_start_its_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a limit on threads, blake3's pool panics (a PanicException, a BaseException):
    a source of 4 MiB or more failed as "internal error", and the no-op snapshot's graph
    sum ended a build that had said OK in a traceback.  One thread is used then."""
    from buildtool import digest, noop

    class PanicException(BaseException):  # (pyo3's, by name)
        pass

    real = blake3.blake3

    def hasher(*args: object, max_threads: int = 1, **kwargs: object) -> object:
        h = real(*args, **kwargs)  # type: ignore[arg-type]
        if max_threads == 1:
            return h

        class Refusing:
            def update(self, *a: object) -> None:
                raise PanicException("The global thread pool has not been initialized")

            def update_mmap(self, *a: object) -> None:
                raise PanicException("The global thread pool has not been initialized")

        return Refusing()

    hasher.AUTO = real.AUTO  # type: ignore[attr-defined]
    data = os.urandom(digest.LARGE_FILE + 5)
    (tmp_path / "big").write_bytes(data)
    monkeypatch.setattr(digest.blake3, "blake3", hasher)
    monkeypatch.setattr(digest, "_threads", real.AUTO)
    assert digest.hash_file(str(tmp_path / "big")) == real(data).hexdigest()
    assert digest._threads == 1
    assert noop._graph_sum(b"graph", b"k" * 32) == real(b"graph", key=b"k" * 32).hexdigest().encode()
