"""Digests and the persistent stat cache, including git's racily-clean rule."""

from __future__ import annotations

import json
import os
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


def test_large_files_hash_the_same_via_mmap(tmp_path: Path) -> None:
    data = os.urandom(1024) * (digest_mod.LARGE_FILE // 1024 + 3)
    p = tmp_path / "big"
    p.write_bytes(data)
    assert hash_file(str(p)) == blake3.blake3(data).hexdigest()


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
    assert digest_mod._racy(whole, whole, whole + SECOND)
    assert not digest_mod._racy(whole, whole, whole + 3 * SECOND)
    # Fine-grained timestamps: a much shorter window.
    fine = whole + 123_456_789
    assert digest_mod._racy(fine, fine, fine + 1_000_000)
    assert not digest_mod._racy(fine, fine, fine + SECOND)
    # ctime newer than mtime counts (chmod, utime back...).
    assert digest_mod._racy(fine - 10 * SECOND, fine, fine + 1_000_000)


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
    assert db.read_bytes().startswith(whole) and db.read_bytes().count(b"\n") == 3  # one journal line
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
    assert db.read_bytes().count(b"\n") == 2  # header + the whole map again
    assert sorted(StatCache(str(tmp_path), str(db), warned.append).entries) == ["a", "b", "c"]
    # The file removed under a live stat cache (buildtool clean in watch mode): written whole.
    db.unlink()
    sc.forget("b")
    sc.save()
    assert sorted(StatCache(str(tmp_path), str(db), warned.append).entries) == ["a", "c"]
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


def test_a_v1_stat_cache_is_read_quietly_and_rewritten_as_v2(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    db = tmp_path / "stat-cache"
    warned: list[str] = []
    sc = StatCache(str(tmp_path), str(db), warned.append)
    sc.digest("f")
    entries = dict(sc.entries)
    db.write_text(digest_mod.HEADER_V1 + json.dumps(entries))
    sc = StatCache(str(tmp_path), str(db), warned.append)
    assert sc.entries == entries and not warned
    (tmp_path / "g").write_text("y")
    sc.digest("g")
    sc.save()
    assert db.read_text().startswith(digest_mod.HEADER)  # rewritten whole, not appended to v1
    assert set(StatCache(str(tmp_path), str(db), warned.append).entries) == {"f", "g"} and not warned
