"""The shared on-disk cache: corruption and hostile entries degrade to a miss, never to
a wrong output."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path

import cache_verify as cv
import pytest
from conftest import BuildRun, Workspace

from buildtool import cache as cache_mod
from buildtool.cache import ActionEntry, Cache, CachedOutput, safe_rel_path
from buildtool.digest import hash_bytes
from buildtool.staging import Stage

BUILD = """
genrule(name="gen", srcs=["in.txt"], outs=["gen.out"], cmd="cat $< > $@ && echo built >> $@")
genrule(name="use", srcs=[":gen"], outs=["use.out"], cmd="tr a-z A-Z < $< > $@")
"""


# Inputs whose outputs are kept inside the action entry (small) or stored as blobs (large).
SIZES = {"inline": "hello\n", "blob": "hello\n" * 1000}


def setup_built(ws: Workspace, text: str = SIZES["inline"]) -> BuildRun:
    ws.write("in.txt", text)
    ws.build_file("", BUILD)
    r = ws.build()
    assert r.rc == 0, r.output
    assert r.ran == {"//:gen", "//:use"}
    return r


def blob_path(ws: Workspace, digest: str) -> Path:
    return cv.blob_path(ws.cache, digest)


def overwrite(p: Path, data: bytes) -> None:
    os.chmod(p, 0o644)
    p.write_bytes(data)


def tamper(ws: Workspace, key: str, digest: str, data: bytes) -> None:
    """Replace the stored content of ``digest`` (inside ``key``'s entry or its blob) with ``data``."""
    obj = cv.entry(ws.cache, key)
    if digest in obj.get("inline", {}):
        obj["inline"][digest] = base64.b64encode(data).decode()
        cv.write_entry(ws.cache, key, json.dumps(obj).encode())
    else:
        overwrite(blob_path(ws, digest), data)


@pytest.mark.parametrize("size", SIZES)
def test_outputs_are_stored_in_the_cache(workspace: Workspace, size: str) -> None:
    r = setup_built(workspace, SIZES[size])
    key = r.by_label["//:gen"]["key"]
    entry = cv.entry(workspace.cache, key)
    [[path, digest, mode]] = entry["outputs"]
    want = (SIZES[size] + "built\n").encode()
    assert path == "gen.out" and mode == 0o644
    assert digest == hash_bytes(want)
    assert cv.stored(workspace.cache, key, digest) == want
    # Small contents live in the entry alone; large ones as a blob alone.
    assert (digest in entry.get("inline", {})) == (size == "inline")
    assert blob_path(workspace, digest).exists() == (size == "blob")


@pytest.mark.parametrize("umask", [0o002, 0o022])
def test_a_group_sharing_umask_keeps_what_the_cache_makes_writable_to_the_group(
    workspace: Workspace, tmp_path: Path, umask: int,
) -> None:
    """The commands' umask (022) made the cache's shards, database and lock files 0755/0644
    whatever the user's: in a team's setgid cache the next user could not store, and the
    -wal another user's build made then locked the database's owner out.  Outputs keep
    022's modes either way."""
    import subprocess
    import sys

    from conftest import BUILDTOOL, _clean_env

    workspace.write("in.txt", "x\n")
    workspace.build_file("", 'genrule(name="a", srcs=["in.txt"], outs=["a.out"], cmd="cp $< $@")\n')
    cache = tmp_path / "team-cache"
    p = subprocess.run([BUILDTOOL, "build"], cwd=workspace.root, env=_clean_env(cache, tmp_path / "home"),
                       capture_output=True, text=True, preexec_fn=lambda: os.umask(umask), check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    v2 = cache / "v2"
    made = [cache, v2, v2 / "cas", v2 / "tmp", v2 / "actions.db", *(d for d in (v2 / "cas").iterdir() if d.is_dir()),
            *(f for f in v2.iterdir() if f.name.endswith(".lock"))]
    assert len(made) >= 7, made
    for f in made:
        writable = bool(f.stat().st_mode & 0o020)
        assert writable is (umask == 0o002), (f, oct(f.stat().st_mode), sys.platform)
    assert oct(workspace.path("a.out").stat().st_mode & 0o777) == oct(0o644)


@pytest.mark.parametrize("size", SIZES)
def test_corrupted_blob_is_detected_and_the_target_reruns(workspace: Workspace, size: str) -> None:
    r = setup_built(workspace, SIZES[size])
    key = r.by_label["//:gen"]["key"]
    digest = cv.entry(workspace.cache, key)["outputs"][0][1]
    want = (SIZES[size] + "built\n").encode()
    tamper(workspace, key, digest, want.upper())  # same size, wrong content
    (workspace.root / "gen.out").unlink()
    r2 = workspace.build()
    assert r2.rc == 0, r2.output
    assert r2.status("//:gen") == "ran"
    assert r2.by_label["//:gen"]["reason_code"] == "cache_corrupt"
    assert "no longer has" not in r2.stderr, r2.stderr  # (the blob's own warning says it all)
    assert workspace.path("gen.out").read_bytes() == want
    assert r2.status("//:use") == "up_to_date"  # early cutoff: same bytes again
    assert "corrupt" in r2.stderr or "does not match" in r2.stderr
    # The rerun repaired the cache: a later restore works and is correct.
    (workspace.root / "gen.out").unlink()
    r3 = workspace.build()
    assert r3.status("//:gen") == "restored"
    assert workspace.path("gen.out").read_bytes() == want


@pytest.mark.parametrize("size", SIZES)
def test_truncated_blob_is_never_restored(workspace: Workspace, size: str) -> None:
    r = setup_built(workspace, SIZES[size])
    key = r.by_label["//:use"]["key"]
    tamper(workspace, key, cv.entry(workspace.cache, key)["outputs"][0][1], b"")
    (workspace.root / "use.out").unlink()
    r2 = workspace.build()
    assert r2.status("//:use") == "ran"
    assert workspace.read("use.out") == (SIZES[size] + "built\n").upper()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda obj: b"{ this is not json",
        lambda obj: json.dumps({**obj, "v": 999}).encode(),
        lambda obj: json.dumps({**obj, "outputs": "nope"}).encode(),
        lambda obj: json.dumps({k: v for k, v in obj.items() if k != "duration"}).encode(),
        lambda obj: json.dumps({**obj, "duration": 10 ** 400}).encode(),  # (OverflowError: a traceback)
        lambda obj: json.dumps({**obj, "duration": float("nan")}).encode(),  # (NaN went into the record)
        lambda obj: json.dumps({**obj, "duration": float("inf")}).encode(),
        lambda obj: json.dumps({**obj, "duration": -1}).encode(),
    ],
    ids=["garbage", "other-version", "bad-outputs", "missing-field", "huge-duration", "nan-duration",
         "infinite-duration", "negative-duration"],
)
def test_corrupt_or_foreign_action_entry_is_a_miss_with_a_warning(
    workspace: Workspace, mutate: Callable[[dict], bytes]
) -> None:
    import copy

    r = setup_built(workspace)
    key = r.by_label["//:gen"]["key"]
    good = cv.entry(workspace.cache, key)
    cv.write_entry(workspace.cache, key, mutate(copy.deepcopy(good)))
    (workspace.root / "gen.out").unlink()
    rc, _, err = workspace.run("explain")  # (a lookup, nothing run: the entry is deleted, not kept)
    assert rc == 0 and "corrupt or of another version" in err and key not in cv.entries(workspace.cache), err
    with contextlib.closing(sqlite3.connect(cv.db_path(workspace.cache))) as c, c:  # (back, as damaged)
        c.execute("INSERT INTO actions VALUES (?, ?, 0)", (key, mutate(copy.deepcopy(good))))
    r2 = workspace.build()
    assert r2.rc == 0, r2.output
    assert r2.status("//:gen") == "ran"
    assert "warning" in r2.stderr and "corrupt or of another version" in r2.stderr
    assert workspace.read("gen.out") == "hello\nbuilt\n"


@pytest.mark.parametrize("mode", [0o777, 0o4755, 0], ids=["world-writable", "setuid", "no-permissions"])
def test_an_action_entry_with_an_output_mode_buildtool_never_stores_is_refused(workspace: Workspace, mode: int) -> None:
    """Outputs are stored as 0644 or 0755 only.  An entry naming 0777 (or setuid 04755, or 0)
    -- hand-edited, or written by another tool into a shared cache -- was restored with that
    mode: a world-writable or setuid file in the user's tree, or one no one could read,
    reported as "restored".  It is a corrupt entry: a miss with a warning, the command runs."""
    r = setup_built(workspace)
    key = r.by_label["//:gen"]["key"]
    obj = cv.entry(workspace.cache, key)
    obj["outputs"][0][2] = mode
    cv.write_entry(workspace.cache, key, json.dumps(obj).encode())
    (workspace.root / "gen.out").unlink()
    r2 = workspace.build()
    assert r2.rc == 0, r2.output
    assert r2.status("//:gen") == "ran", r2.output
    assert "warning" in r2.stderr and "corrupt or of another version" in r2.stderr, r2.stderr
    assert stat.S_IMODE(workspace.path("gen.out").stat().st_mode) == 0o644
    assert workspace.read("gen.out") == "hello\nbuilt\n"


@pytest.mark.parametrize("evil", ["../escaped.out", "ABS", "a/../../escaped.out", ".buildtool/record"])
def test_action_entry_naming_a_path_outside_the_workspace_is_refused(
    workspace: Workspace, evil: str, tmp_path: Path
) -> None:
    if evil == "ABS":
        evil = str(tmp_path / "abs.out")
    r = setup_built(workspace)
    key = r.by_label["//:gen"]["key"]
    obj = cv.entry(workspace.cache, key)
    obj["outputs"] = [[evil, obj["outputs"][0][1], 0o644], *obj["outputs"]]
    cv.write_entry(workspace.cache, key, json.dumps(obj).encode())
    (workspace.root / "gen.out").unlink()
    r2 = workspace.build()
    assert r2.rc == 0, r2.output
    assert r2.status("//:gen") == "ran"
    assert "warning" in r2.stderr
    assert not (workspace.root.parent / "escaped.out").exists()
    assert not (tmp_path / "abs.out").exists()
    assert workspace.read("gen.out") == "hello\nbuilt\n"


def test_cache_entry_listing_other_outputs_is_ignored(workspace: Workspace) -> None:
    r = setup_built(workspace)
    key = r.by_label["//:gen"]["key"]
    obj = cv.entry(workspace.cache, key)
    obj["outputs"][0][0] = "other.out"
    cv.write_entry(workspace.cache, key, json.dumps(obj).encode())
    (workspace.root / "gen.out").unlink()
    r2 = workspace.build()
    assert r2.status("//:gen") == "ran"
    assert not workspace.exists("other.out")


def test_failed_actions_are_not_cached(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="t", outs=["o"], cmd="echo partial > $@; exit 3")\n')
    r = workspace.build()
    assert r.rc == 1
    assert not workspace.exists("o")  # partial output deleted
    assert cv.entries(workspace.cache) == {}
    r2 = workspace.build()
    assert r2.status("//:t") == "failed"  # reran, not restored


def test_unwritable_cache_dir_degrades_to_no_cache(workspace: Workspace, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache dir should be")
    workspace.write("in.txt", "x\n")
    workspace.build_file("", BUILD)
    r = workspace.build(cache=blocker)
    assert r.rc == 0, r.output
    assert "caching is off for the rest of this build" in r.stderr, r.stderr  # (not "nothing is stored":
    assert workspace.read("use.out") == "X\nBUILT\n"  # nothing is found in it either)


# -- unit level -----------------------------------------------------------------------


def test_safe_rel_path() -> None:
    assert safe_rel_path("a/b.txt")
    for bad in ("", "/abs", "../x", "a/../../x", "a/./b", "a//b", "..", ".buildtool/x", "a\0b", 3, None):
        assert not safe_rel_path(bad), bad


def test_blob_roundtrip_and_corruption_removes_the_blob(tmp_path: Path) -> None:
    warned: list[str] = []
    c = Cache(str(tmp_path / "c"), warned.append)
    d = hash_bytes(b"payload")
    c.put_bytes(b"payload", d)
    assert c.read_blob(d) == b"payload"
    blob = Path(c._blob_path(d))
    assert not os.stat(blob).st_mode & 0o222  # read-only blobs
    overwrite(blob, b"PAYLOAD")
    assert c.read_blob(d) is None
    assert not blob.exists()
    assert warned


def test_a_cache_dir_removed_during_the_build_is_one_warning_not_one_per_action(tmp_path: Path) -> None:
    """`rm -rf` of the cache dir under a build: every store after it failed alike, each
    action warned; now the first failure says it once and the cache stores nothing more."""
    warned: list[str] = []
    c = Cache(str(tmp_path / "c"), warned.append)
    assert c.put_bytes(b"first", hash_bytes(b"first"))
    shutil.rmtree(tmp_path / "c")
    for i in range(5):
        data = f"payload {i}".encode()
        assert not c.put_bytes(data, hash_bytes(data))
    assert len(warned) == 1 and "was removed during the build; nothing is stored" in warned[0], warned


def test_restore_verifies_and_sets_mode(tmp_path: Path) -> None:
    c = Cache(str(tmp_path / "c"), lambda m: None)
    d = hash_bytes(b"#!/bin/sh\n")
    c.put_bytes(b"#!/bin/sh\n", d)
    dest = tmp_path / "ws" / "sub" / "tool.sh"
    assert c.restore(d, str(dest), 0o755)
    assert dest.read_bytes() == b"#!/bin/sh\n"
    assert dest.stat().st_mode & 0o777 == 0o755
    overwrite(Path(c._blob_path(d)), b"#!/bin/XX\n")
    dest.unlink()
    assert not c.restore(d, str(dest), 0o755)
    assert not dest.exists()


def test_action_entry_roundtrip(tmp_path: Path) -> None:
    c = Cache(str(tmp_path / "c"), lambda m: None)
    e = ActionEntry((CachedOutput("p/o", "a" * 64, 0o755),), 1.5, None, "b" * 64)
    c.put_action("k" * 64, e)
    assert c.get_action("k" * 64) == e
    assert c.get_action("z" * 64) is None


def test_inline_contents_roundtrip_restore_and_verify(tmp_path: Path) -> None:
    warned: list[str] = []
    c = Cache(str(tmp_path / "c"), warned.append)
    out, err = b"\x00binary\xff output\n", b"a warning\n"
    d_out, d_err = hash_bytes(out), hash_bytes(err)
    e = ActionEntry((CachedOutput("p/o", d_out, 0o755),), 0.5, None, d_err, {d_out: out, d_err: err})
    c.put_action("k" * 64, e)
    assert list((cv.layout_dir(tmp_path / "c") / "cas").rglob("*")) == []  # nothing stored as a blob
    got = c.get_action("k" * 64)
    assert got == e
    assert c.stream(got, d_err) == err
    dest = tmp_path / "ws" / "p" / "o"
    assert c.restore(d_out, str(dest), 0o755, got.inline[d_out])
    assert dest.read_bytes() == out and dest.stat().st_mode & 0o777 == 0o755
    # Content that does not hash to its digest is never written; the stream reads as lost.
    bad = ActionEntry(e.outputs, 0.5, None, d_err, {d_out: out.upper(), d_err: b"forged\n"})
    dest.unlink()
    assert c.restore(d_out, str(dest), 0o755, bad.inline[d_out]) is None
    assert not dest.exists() and any("does not match" in w for w in warned)
    assert c.stream(bad, d_err) is None  # (lost: a test's cached pass then runs again)
    assert c.stream(bad, None) == b""  # (no stream at all: nothing was printed)


@pytest.mark.parametrize("inline", [{"x": "AAAA"}, {"a" * 64: 3}, {"a" * 64: "not base64!"}, ["a" * 64]])
def test_malformed_inline_contents_make_the_entry_a_miss(tmp_path: Path, inline: object) -> None:
    warned: list[str] = []
    c = Cache(str(tmp_path / "c"), warned.append)
    cv.put_now(c, "k" * 64, ActionEntry((CachedOutput("o", "a" * 64, 0o644),), 1.0, None, None))
    obj = {**cv.entry(tmp_path / "c", "k" * 64), "inline": inline}
    cv.write_entry(tmp_path / "c", "k" * 64, json.dumps(obj).encode())
    assert c.get_action("k" * 64) is None
    assert any("corrupt" in w for w in warned)


def _restore_cache(tmp_path: Path, data: bytes, **kw: str) -> tuple[Cache, str, list[str]]:
    warned: list[str] = []
    c = Cache(str(tmp_path / "c"), warned.append, **kw)
    c.stage = Stage(str(tmp_path / "ws" / ".buildtool" / "tmp"))
    d = hash_bytes(data)
    c.put_bytes(data, d)
    return c, d, warned


@pytest.mark.parametrize("small_limit", [1 << 20, 0], ids=["in-memory", "streamed"])
def test_corrupt_blob_is_a_miss_that_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_limit: int
) -> None:
    monkeypatch.setattr(cache_mod, "SMALL_BLOB", small_limit)
    c, d, warned = _restore_cache(tmp_path, b"good bytes\n")
    overwrite(Path(c._blob_path(d)), b"evil bytes\n")
    dest = tmp_path / "ws" / "out" / "f.txt"
    assert c.restore(d, str(dest), 0o644) is None
    assert not dest.exists()
    assert not Path(c._blob_path(d)).exists()
    assert any(f"for {dest} does not match its digest" in w for w in warned), warned  # (it named no output)
    assert not (tmp_path / "ws" / "out").exists()  # verified before anything was made


@pytest.mark.parametrize("small_limit", [1 << 20, 0], ids=["in-memory", "streamed"])
def test_restore_content_mode_and_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_limit: int) -> None:
    monkeypatch.setattr(cache_mod, "SMALL_BLOB", small_limit)
    monkeypatch.setattr(cache_mod, "COPY_CHUNK", 7)  # several rounds of the streamed copy
    data = bytes(range(256)) * 3
    c, d, warned = _restore_cache(tmp_path, data)
    old = os.umask(0o077)  # a restrictive umask still gives the recorded modes
    try:
        for mode in (0o644, 0o755):
            dest = tmp_path / "ws" / "new" / "dir" / f"f{mode:o}"  # directories made as needed
            st = c.restore(d, str(dest), mode)
            assert st is not None
            assert dest.read_bytes() == data
            assert dest.stat().st_mode & 0o777 == mode
            now = os.stat(dest)  # the returned stat is the final one: the stat cache can trust it
            assert (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (
                now.st_ino,
                now.st_size,
                now.st_mtime_ns,
                now.st_ctime_ns,
            )
    finally:
        os.umask(old)
    assert Path(c._blob_path(d)).read_bytes() == data
    assert not warned
    (stage,) = os.listdir(tmp_path / "ws" / ".buildtool" / "tmp")  # this process's staging dir
    assert os.listdir(tmp_path / "ws" / ".buildtool" / "tmp" / stage) == []  # every temp file renamed


def test_restores_stage_in_a_new_subdirectory_spread_by_the_allocator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restored files are made in a per-process directory under the state dir's tmp/ (its
    parent's "top of unrelated directories" flag: test_staging.py), so their inodes are not
    allocated among those of outputs deleted just before."""
    c, d, warned = _restore_cache(tmp_path, b"staged\n")
    tmp = tmp_path / "ws" / ".buildtool" / "tmp"
    seen = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(src)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    for i in range(3):
        assert c.restore(d, str(tmp_path / "ws" / "out" / f"{i}.txt"), 0o644)
    monkeypatch.undo()
    (stage,) = os.listdir(tmp)
    assert stage.startswith(f"stage.{os.getpid()}.")
    assert [os.path.dirname(s) for s in seen] == [str(tmp / stage)] * 3
    assert not warned


def test_restore_works_where_the_directory_flag_cannot_be_set(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as where:
        c, d, warned = _restore_cache(Path(where), b"on tmpfs\n")
        dest = Path(where) / "ws" / "out" / "f.txt"
        assert c.restore(d, str(dest), 0o644)
        assert dest.read_bytes() == b"on tmpfs\n"
        assert not warned


def test_editing_a_restored_copy_leaves_the_blob_intact(tmp_path: Path) -> None:
    c, d, _ = _restore_cache(tmp_path, b"v1\n")
    dest = tmp_path / "ws" / "f.txt"
    assert c.restore(d, str(dest), 0o644)
    with open(dest, "r+b") as f:  # in place, same inode
        f.write(b"v2\n")
    assert c.read_blob(d) == b"v1\n"


def test_restore_survives_directories_removed_since_the_last_restore(tmp_path: Path) -> None:
    """The state dir's tmp/ goes after every build while watch mode keeps the Cache; an
    output directory may be deleted by hand: the memoised directories are made again."""
    import shutil

    c, d, warned = _restore_cache(tmp_path, b"x\n")
    dest = tmp_path / "ws" / "out" / "f.txt"
    assert c.restore(d, str(dest), 0o644)
    shutil.rmtree(tmp_path / "ws" / ".buildtool")
    shutil.rmtree(tmp_path / "ws" / "out")
    assert c.restore(d, str(dest), 0o644)
    assert dest.read_bytes() == b"x\n"
    assert not warned


def test_restore_beside_dest_replaces_a_stale_temp_file(tmp_path: Path) -> None:
    c, d, warned = _restore_cache(tmp_path, b"fresh\n")
    c.stage = None  # as when the state dir is on another filesystem
    dest = tmp_path / "ws" / "f.txt"
    dest.parent.mkdir(parents=True)
    Path(f"{dest}.buildtool-tmp").write_bytes(b"left by a killed build")
    assert c.restore(d, str(dest), 0o644)
    assert dest.read_bytes() == b"fresh\n"
    assert not Path(f"{dest}.buildtool-tmp").exists()
    assert not warned


def test_restore_beside_dest_of_an_output_with_the_longest_name(tmp_path: Path) -> None:
    """An output named with 255 bytes (NAME_MAX) is restored too: its temp file beside it
    gets a cut name, which still ends in .buildtool-tmp and is the same each time (the
    one a killed build left is replaced, not left to pile up)."""
    c, d, warned = _restore_cache(tmp_path, b"fresh\n")
    c.stage = None  # as when the state dir is on another filesystem
    dest = tmp_path / "ws" / ("\u00e9" * 127 + "x")  # 255 bytes; a cut may fall inside a character
    dest.parent.mkdir(parents=True)
    stale = Path(c._restore_tmp(str(dest)))
    assert stale.parent == dest.parent and stale.name.endswith(".buildtool-tmp")
    assert len(os.fsencode(stale.name)) <= 255
    stale.write_bytes(b"left by a killed build")
    assert c.restore(d, str(dest), 0o644)
    assert dest.read_bytes() == b"fresh\n"
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name], "a temp file was left"
    assert not warned


def test_hardlink_mode_links_plain_outputs_and_copies_executables(tmp_path: Path) -> None:
    c, d, _ = _restore_cache(tmp_path, b"shared\n", restore_mode="hardlink")
    plain, tool = tmp_path / "ws" / "a", tmp_path / "ws" / "b"
    assert c.restore(d, str(plain), 0o644)
    assert c.restore(d, str(tool), 0o755)
    blob = os.stat(c._blob_path(d))
    assert os.stat(plain).st_ino == blob.st_ino
    assert os.stat(tool).st_ino != blob.st_ino and os.stat(tool).st_mode & 0o777 == 0o755


@pytest.mark.parametrize("changed", [0o555, 0o644])
def test_hardlink_mode_puts_back_the_mode_a_chmod_of_a_linked_output_gave_its_blob(
    tmp_path: Path, changed: int,
) -> None:
    """A chmod of a hardlinked output is one of its blob: every later restore linked an
    executable (or writable) file, in every workspace sharing the cache, and a build
    never settled ("gained its executable bit", restored, again)."""
    c, d, _ = _restore_cache(tmp_path, b"shared\n", restore_mode="hardlink")
    first, second = tmp_path / "ws" / "a", tmp_path / "ws2" / "a"
    assert c.restore(d, str(first), 0o644)
    os.chmod(first, changed)
    assert c.restore(d, str(second), 0o644)
    blob = os.stat(c._blob_path(d))
    assert os.stat(second).st_ino == blob.st_ino and blob.st_mode & 0o777 == 0o444
    assert os.stat(first).st_mode & 0o777 == 0o444  # (the same file)


def test_restore_of_a_missing_blob_is_a_quiet_miss(tmp_path: Path) -> None:
    warned: list[str] = []
    c = Cache(str(tmp_path / "c"), warned.append)
    assert c.restore("0" * 64, str(tmp_path / "ws" / "f"), 0o644) is None
    assert not warned and not (tmp_path / "ws").exists()


def test_put_file_stores_a_read_only_verified_copy(tmp_path: Path) -> None:
    c = Cache(str(tmp_path / "c"), lambda m: None)
    src = tmp_path / "out.bin"
    src.write_bytes(b"z" * 100_000)
    d = hash_bytes(src.read_bytes())
    c.put_file(str(src), d)
    blob = Path(c._blob_path(d))
    assert blob.read_bytes() == src.read_bytes()
    assert blob.stat().st_mode & 0o777 == 0o444
    assert c.bytes_added == 100_000


def test_an_entry_naming_a_path_outside_the_workspace_is_refused_once_and_deleted(tmp_path: Path) -> None:
    warned: list[str] = []
    cache = Cache(str(tmp_path / "c"), warned.append)
    cv.put_now(cache, "k" * 64, ActionEntry((CachedOutput("../big.out", "1" * 64, 0o644),), 0.1, None, None, {}))
    assert cache.get_action("k" * 64) is None
    assert cache.get_action("k" * 64) is None  # gone: not warned about again
    assert [w for w in warned if "names a path outside the workspace ('../big.out'); deleting it" in w] == warned
    assert len(warned) == 1


def test_the_cache_dir_is_tagged_as_a_cache_and_a_tag_there_is_left_as_it_is(tmp_path: Path) -> None:
    """CACHEDIR.TAG marks the cache dir for backup tools and for glob() in a workspace that
    holds it (docs/formats.md); a file of that name already there is the user's."""
    from buildtool.workspace import CACHEDIR_SIGNATURE, is_cache_tag

    Cache(str(tmp_path / "c"), lambda _: None)
    assert (tmp_path / "c" / "CACHEDIR.TAG").read_bytes().startswith(CACHEDIR_SIGNATURE + b"\n")
    assert is_cache_tag(str(tmp_path / "c" / "CACHEDIR.TAG"))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "CACHEDIR.TAG").write_text("mine\n")
    Cache(str(tmp_path / "d"), lambda _: None)
    assert (tmp_path / "d" / "CACHEDIR.TAG").read_text() == "mine\n"
    assert not is_cache_tag(str(tmp_path / "d" / "CACHEDIR.TAG"))
    (tmp_path / "pkg").mkdir()  # a package named as the cache dir: its v2/ is tagged, not its BUILD.py's dir
    (tmp_path / "pkg" / "BUILD.py").write_text("")
    Cache(str(tmp_path / "pkg"), lambda _: None)
    assert not (tmp_path / "pkg" / "CACHEDIR.TAG").exists()
    assert is_cache_tag(str(tmp_path / "pkg" / cache_mod.LAYOUT / "CACHEDIR.TAG"))
    # A user's folder of other things named as the cache dir (`cache_dir = ".."`): tagged,
    # `tar --exclude-caches`, borg and restic left the user's files out of every backup.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("my work\n")
    Cache(str(tmp_path / "mine"), lambda _: None)
    assert not (tmp_path / "mine" / "CACHEDIR.TAG").exists()
    assert is_cache_tag(str(tmp_path / "mine" / cache_mod.LAYOUT / "CACHEDIR.TAG"))
    (tmp_path / "old" / cache_mod.LAYOUT).mkdir(parents=True)  # a cache of an older buildtool: its own
    Cache(str(tmp_path / "old"), lambda _: None)
    assert is_cache_tag(str(tmp_path / "old" / "CACHEDIR.TAG"))
    # A folder an older buildtool tagged at the top: the tag moves to v2/ (one of the user's own stays).
    (tmp_path / "old" / "thesis.txt").write_text("my work\n")
    Cache(str(tmp_path / "old"), lambda _: None)
    assert not (tmp_path / "old" / "CACHEDIR.TAG").exists()
    assert is_cache_tag(str(tmp_path / "old" / cache_mod.LAYOUT / "CACHEDIR.TAG"))
    (tmp_path / "d" / "thesis.txt").write_text("my work\n")
    Cache(str(tmp_path / "d"), lambda _: None)
    assert (tmp_path / "d" / "CACHEDIR.TAG").read_text() == "mine\n"


@pytest.mark.parametrize("sub", ["tmp", "cas", "mf"])
def test_a_file_where_the_cache_layout_has_a_directory_is_replaced(tmp_path: Path, sub: str) -> None:
    """v2/tmp as a regular file turned caching off for good, with a message naming only the
    cache dir; a directory in place of actions.db was already repaired.  (v2/mf as a file:
    two warnings for each depfile target's manifest, on every build.)"""
    warnings: list[str] = []
    cache_mod.Cache(str(tmp_path / "c"), warnings.append)
    layout = tmp_path / "c" / cache_mod.LAYOUT
    if sub == "cas":
        import shutil

        shutil.rmtree(layout / "cas")
    elif sub == "tmp":
        (layout / sub).rmdir()
    (layout / sub).write_text("x")
    c = cache_mod.Cache(str(tmp_path / "c"), warnings.append)
    assert c.writable and ((layout / sub).is_dir() if sub != "mf" else not (layout / sub).exists()), warnings
    assert warnings == [f"cache: {layout / sub} was not a directory; replaced it with one"]


def test_a_file_where_a_shard_of_cas_goes_is_replaced(tmp_path: Path) -> None:
    """A file in place of cas/<xx>: every store into that shard failed ("File exists"), on
    every build, and `cache gc` did not repair it."""
    warnings: list[str] = []
    c = cache_mod.Cache(str(tmp_path / "c"), warnings.append)
    data = b"blob in a damaged shard\n"
    digest = hash_bytes(data)
    shard = tmp_path / "c" / cache_mod.LAYOUT / "cas" / digest[:2]
    shard.write_text("x")
    assert c.put_bytes(data, digest)
    assert c.read_blob(digest) == data and shard.is_dir()
    assert warnings == [f"cache: {shard} was not a directory; replaced it with one"]


def test_a_dangling_link_in_the_cache_layout_is_left_alone(tmp_path: Path) -> None:
    """v2/cas linked to a disk that is not mounted now: caching is off for this build, with
    the path named; replacing the link would have moved the blobs to the local disk."""
    warnings: list[str] = []
    cache_mod.Cache(str(tmp_path / "c"), warnings.append)
    cas = tmp_path / "c" / cache_mod.LAYOUT / "cas"
    cas.rmdir()
    cas.symlink_to(tmp_path / "unmounted" / "cas")
    c = cache_mod.Cache(str(tmp_path / "c"), warnings.append)
    assert not c.writable and cas.is_symlink()
    assert len(warnings) == 1 and f"not usable (File exists at {cas})" in warnings[0], warnings


VICTIM = "../../../../../../../../victim/"  # padded below to 64 characters: a "digest" that is a path


@pytest.mark.parametrize("field", ["output", "stdout", "stderr", "inline", "mode-float", "nested"])
def test_an_entry_whose_digest_is_not_hex_is_a_miss_that_touches_no_other_path(tmp_path: Path, field: str) -> None:
    """A digest names a blob's file: an entry with "../../victim/" as a digest made the
    restore check, then delete, a file or directory outside the cache; a float mode, a
    list as stdout or JSON nested 100,000 deep failed every build as an internal error."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "file.txt").write_text("precious\n")
    bad = (VICTIM + "/" * 64)[:64]
    warned: list[str] = []
    root = tmp_path / "a" / "b" / "c" / "d"  # deep enough for the ../ to reach tmp_path
    c = Cache(str(root), warned.append)
    good = hash_bytes(b"x")
    cv.put_now(c, "k" * 64, ActionEntry((CachedOutput("o", good, 0o644),), 1.0, None, None))
    obj = cv.entry(root, "k" * 64)
    raw = None
    if field == "output":
        obj["outputs"][0][1] = bad
    elif field in ("stdout", "stderr"):
        obj[field] = bad
    elif field == "inline":
        obj["inline"] = {bad: "eA=="}
    elif field == "mode-float":
        obj["outputs"][0][2] = 420.0
    else:
        raw = b'{"v":1,"outputs":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cv.write_entry(root, "k" * 64, raw if raw is not None else json.dumps(obj).encode())
    assert c.get_action("k" * 64) is None
    assert any("corrupt" in w for w in warned), warned
    assert (victim / "file.txt").read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_named_pipe_or_socket_in_place_of_a_blob_is_removed_not_waited_for(tmp_path: Path, kind: str) -> None:
    """open() of a FIFO waits for a writer: the build hung, past Ctrl-C and SIGTERM; a
    socket (ENXIO) was a silent miss on every build, never removed."""
    import socket

    for read in ("restore", "read_blob"):
        c, d, warned = _restore_cache(tmp_path / read, b"bytes\n" * 1000)
        blob = Path(c._blob_path(d))
        blob.unlink()
        if kind == "fifo":
            os.mkfifo(blob)
        else:
            here = os.getcwd()
            os.chdir(blob.parent)  # (a socket's path is limited to 108 bytes)
            try:
                sock = socket.socket(socket.AF_UNIX)
                sock.bind(blob.name)
                sock.close()
            finally:
                os.chdir(here)
        if read == "restore":
            assert c.restore(d, str(tmp_path / read / "ws" / "f"), 0o644) is None
        else:
            assert c.read_blob(d) is None
        assert not blob.exists() and any("removing it" in w for w in warned), (read, warned)


def test_a_symbolic_link_in_place_of_a_blob_is_never_restored_as_one(tmp_path: Path) -> None:
    """Hardlink mode linked the symbolic link itself into the workspace: the output was a
    link out of it, and every later build exit 2."""
    c, d, warned = _restore_cache(tmp_path, b"shared\n", restore_mode="hardlink")
    blob = Path(c._blob_path(d))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"shared\n")
    blob.unlink()
    blob.symlink_to(elsewhere)
    dest = tmp_path / "ws" / "a"
    assert c.restore(d, str(dest), 0o644) is None
    assert not dest.is_symlink() and not os.path.lexists(blob)
    assert any("not a file" in w for w in warned), warned


def test_a_blob_that_cannot_be_written_leaves_the_action_without_an_entry(workspace: Workspace) -> None:
    """A dangling link where the blob's shard directory belongs (EEXIST, not a full disk; a
    file there is replaced now): the blob was not written but the entry was, pointing at
    nothing ("the cache entry was damaged" on every later build)."""
    workspace.write("in.txt", "big\n" * 5000)
    workspace.build_file("", 'genrule(name="g", srcs=["in.txt"], outs=["g.out"], cmd="cp $< $@")')
    digest = hash_bytes(("big\n" * 5000).encode())
    shard = workspace.cache / "v2" / "cas" / digest[:2]
    shard.parent.mkdir(parents=True, exist_ok=True)
    shard.symlink_to(workspace.cache / "elsewhere")
    r = workspace.build()
    said = "a symbolic link where the cache keeps a directory"
    assert r.rc == 0 and said in r.stderr and str(shard) in r.stderr, r.output
    shard.unlink()
    os.unlink(workspace.path("g.out"))
    fresh = workspace.build("--explain")
    assert fresh.rc == 0 and fresh.status("//:g") == "ran" and "damaged" not in fresh.output, fresh.output


def test_a_blob_this_user_may_not_read_is_a_miss_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared cache holding another user's mode-000 blob: every build reran its targets
    and never said why.  (Root reads anything: the refusal is simulated at os.open.)"""
    c, d, warned = _restore_cache(tmp_path, b"theirs\n" * 1000)
    real_open = os.open

    def refusing(path: str, *a: object, **kw: object) -> int:
        if "/cas/" in str(path):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(cache_mod.os, "open", refusing)
    for _ in range(2):
        assert c.restore(d, str(tmp_path / "ws" / "f"), 0o644) is None
    assert len(warned) == 1 and "cannot be read (Permission denied)" in warned[0], warned


def test_a_blob_this_user_may_not_read_is_replaced_by_the_next_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A blob of this user's made mode 000: the target reran on every build, as the store
    saw the file there and kept it.  (Root reads anything: the mode is simulated.)"""
    data = b"mine\n" * 1000
    c, d, _ = _restore_cache(tmp_path, data)
    blob = c._blob_path(d)
    os.chmod(blob, 0)
    real_access = os.access
    monkeypatch.setattr(cache_mod.os, "access", lambda p, m: stat.S_IMODE(os.stat(p).st_mode) & 0o444 != 0
                        if p == blob and os.path.exists(p) else real_access(p, m))
    assert not c.has_blob(d)
    src = tmp_path / "src"
    src.write_bytes(data)
    assert c.put_file(str(src), d)
    assert c.has_blob(d) and stat.S_IMODE(os.stat(blob).st_mode) == 0o444 and Path(blob).read_bytes() == data


@pytest.mark.parametrize("how", ["file", "bytes"])
def test_an_unreadable_blob_this_user_may_not_replace_leaves_the_cache_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:
    """Another user's mode-600 blob in a shard this user may not write: the failed
    replacement turned the cache off for the rest of the build (every later target
    reran), where the blob used to be taken as there.  (Root writes anywhere: simulated.)"""
    data = b"theirs\n" * 1000
    c, d, warned = _restore_cache(tmp_path, data)
    blob = c._blob_path(d)
    real_access, real_create = os.access, cache_mod._create
    monkeypatch.setattr(cache_mod.os, "access", lambda p, m: False if p == blob else real_access(p, m))

    def refusing(path: str, mode: int) -> int:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(cache_mod, "_create", refusing)
    src = tmp_path / "src"
    src.write_bytes(data)
    assert (c.put_file(str(src), d) if how == "file" else c.put_bytes(data, d))
    assert c.writable and warned == [], warned
    monkeypatch.setattr(cache_mod, "_create", real_create)
    other = b"another blob\n" * 500
    assert c.put_bytes(other, hash_bytes(other)) and c.read_blob(hash_bytes(other)) == other


def test_stored_entries_are_written_in_batches_and_never_one_whose_blob_is_gone(tmp_path: Path) -> None:
    """An entry per commit was ~40 us of the scheduling thread per target.  Queued entries
    answer lookups at once; a batch is written at QUEUE_MAX and at the flush, without an
    entry whose blob a GC of another process deleted meanwhile (it found no entry naming it)."""
    from buildtool.cache import QUEUE_MAX

    c = Cache(str(tmp_path / "c"), lambda _: None)
    data = b"a blob too large to go inline\n" * 200
    d = hash_bytes(data)
    assert c.put_bytes(data, d)
    added = c.bytes_added
    c.put_action("a" * 64, ActionEntry((CachedOutput("o", d, 0o644),), 1.0, None, None))
    c.put_action("b" * 64, ActionEntry((CachedOutput("p", d, 0o644),), 1.0, None, None))
    assert cv.entries(tmp_path / "c") == {} and c.get_action("a" * 64) is not None
    c.forget_action("b" * 64)  # (a test that then failed: its pass must not be written either)
    os.unlink(c._blob_path(d))  # what that GC did
    c.put_action("c" * 64, ActionEntry((), 1.0, None, None))
    c.flush()
    assert set(cv.entries(tmp_path / "c")) == {"c" * 64}
    assert c.bytes_added == added + len(cv.entries(tmp_path / "c")["c" * 64])
    for i in range(QUEUE_MAX):
        c.put_action(f"{i:064x}", ActionEntry((), 1.0, None, None))
    assert len(cv.entries(tmp_path / "c")) == 1 + QUEUE_MAX  # (written without a flush)


def test_entries_queued_before_a_full_disk_stops_the_stores_are_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob refused with ENOSPC stops storing for the rest of the build; the entries queued
    before it (their blobs all written) were dropped with it: a build with one output too
    large for the disk cached nothing, every time, and left the blobs named by no entry."""
    import errno

    warned: list[str] = []
    c = Cache(str(tmp_path / "c"), warned.append)
    data = b"a blob too large to go inline\n" * 200
    d = hash_bytes(data)
    assert c.put_bytes(data, d)
    c.put_action("a" * 64, ActionEntry((CachedOutput("o", d, 0o644),), 1.0, None, None))

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Cache, "_write_new", full)
    big = b"another one\n" * 400
    assert not c.put_bytes(big, hash_bytes(big))
    assert not c.writable and len(warned) == 1 and "nothing is stored in the cache" in warned[0], warned
    c.put_action("b" * 64, ActionEntry((CachedOutput("p", hash_bytes(big), 0o644),), 1.0, None, None))
    c.flush()
    assert set(cv.entries(tmp_path / "c")) == {"a" * 64}


def test_a_gc_waits_for_queued_entries_and_never_deletes_their_blobs(tmp_path: Path) -> None:
    """Queued entries' blobs are in cas/ with no entry naming them yet: a `cache gc` then
    deleted them as a killed build's garbage, and the entries were dropped unwritten (30 gc
    runs during a 200-target build left 8 entries).  The queue holds the store guard from
    its first entry until it is written (at most QUEUE_MAX_AGE_S): the gc waits."""
    from buildtool import cache_gc
    from buildtool.cache import QUEUE_MAX_AGE_S

    c = Cache(str(tmp_path / "c"), lambda _: None)
    data = b"a blob too large to go inline\n" * 200
    d = hash_bytes(data)
    with c.storing() as free:  # (as the runner stores: blobs, then the entry, under the guard)
        assert free and c.put_bytes(data, d)
        c.put_action("a" * 64, ActionEntry((CachedOutput("o", d, 0o644),), 1.0, None, None))
    assert cache_gc.gc(str(tmp_path / "c"), None, timeout_s=0.1) is None  # (busy: the queue holds it)
    time.sleep(QUEUE_MAX_AGE_S + 0.5)  # (written by then without a flush)
    res = cache_gc.gc(str(tmp_path / "c"), None, timeout_s=5)
    assert res is not None and res.garbage_blobs == 0, res
    assert set(cv.entries(tmp_path / "c")) == {"a" * 64} and os.path.exists(c._blob_path(d))


def test_a_flush_waits_for_the_timer_s_write_in_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 0.5 s timer took the batch and was writing it when the build's flush found the
    queue empty and returned: the size counter missed its bytes, and a process exiting then
    could lose the batch."""
    from buildtool.actiondb import ActionDB
    from buildtool.cache import QUEUE_MAX_AGE_S

    slow_put = ActionDB.put_many

    def put_many(self: ActionDB, rows: list[tuple[str, bytes]]) -> int:
        time.sleep(0.4)
        return slow_put(self, rows)

    monkeypatch.setattr(ActionDB, "put_many", put_many)
    c = Cache(str(tmp_path / "c"), lambda _: None)
    c.put_action("a" * 64, ActionEntry((), 1.0, None, None))
    time.sleep(QUEUE_MAX_AGE_S + 0.1)  # (the timer is inside its write now)
    c.flush()
    assert set(cv.entries(tmp_path / "c")) == {"a" * 64} and c.bytes_added > 0


def test_a_blob_whose_copy_fails_midway_leaves_nothing_under_its_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """put_file writes a temp file and renames it: a copy cut short (a full disk after some
    bytes) must not leave a partial blob under the digest, which the next store would take
    for the whole one (every entry naming it a miss, a corrupt blob, from then on)."""
    import errno

    src = tmp_path / "out.bin"
    src.write_bytes(b"0123456789" * 1000)
    d = hash_bytes(src.read_bytes())
    c = Cache(str(tmp_path / "c"), lambda m: None)

    def cut_short(self: Cache, fd: int, out: int) -> None:
        os.write(out, b"01234")
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Cache, "_clone_or_copy", cut_short)
    assert not c.put_file(str(src), d)
    assert not c.has_blob(d)
    monkeypatch.undo()
    c2 = Cache(str(tmp_path / "c"), lambda m: None)
    assert c2.put_file(str(src), d) and c2.read_blob(d) == src.read_bytes()


def test_a_cache_whose_blobs_are_gone_says_so_once(workspace: Workspace) -> None:
    """A CI cache restored in part (cas/ empty): every target ran, and only --explain said why."""
    big = "x" * 200_000
    workspace.build_file("", "\n".join(
        f'genrule(name="g{i}", outs=["g{i}.out"], cmd="printf {big[:50]}{i} > $@; head -c 100000 /dev/zero >> $@")'
        for i in range(3)))
    assert workspace.build().rc == 0
    for shard in (cv.layout_dir(workspace.cache) / "cas").iterdir():
        shutil.rmtree(shard)
    for i in range(3):
        (workspace.root / f"g{i}.out").unlink()
    r = workspace.build()
    assert r.rc == 0 and r.with_status("ran") == {"//:g0", "//:g1", "//:g2"}, r.output
    assert r.stderr.count("its cache entry names blobs the cache no longer has") == 1, r.stderr
    assert {r.by_label[f"//:g{i}"]["reason_code"] for i in range(3)} == {"cache_corrupt"}


def test_an_entry_whose_queue_timer_cannot_start_is_written_at_once(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a limit on threads the queue's timer could not start: the store failed with a
    warning and its entry was lost.  Written at once then."""
    import threading

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    c = Cache(str(tmp_path / "c"), lambda _: None)
    data = b"a blob too large to go inline\n" * 200
    d = hash_bytes(data)
    with c.storing() as free:
        assert free and c.put_bytes(data, d)
        c.put_action("a" * 64, ActionEntry((CachedOutput("o", d, 0o644),), 1.0, None, None))
    assert set(cv.entries(tmp_path / "c")) == {"a" * 64}
