"""Cache size: ``buildtool cache gc --max-size``, the ``max_size`` setting, ``cache stats``,
and GC running while a build restores from the same cache."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cache_verify import layout_dir, verify_cache
from conftest import BUILDTOOL, BuildRun, Workspace, _clean_env, immutable

from buildtool.cache_gc import parse_size, read_counter, scan

KIB = 1024


def sized_targets(ws: Workspace, sizes: dict[str, int]) -> None:
    """One genrule per name writing ``size`` deterministic bytes (distinct per target)."""
    lines = [
        f'genrule(name="{n}", outs=["{n}.bin"], cmd="{{ printf {n}; head -c {size} /dev/zero; }} > $@")'
        for n, size in sizes.items()
    ]
    ws.build_file("", "\n".join(lines) + "\n")


def cache_bytes(cache: Path) -> int:
    return scan(str(layout_dir(cache))).total


def test_parse_size() -> None:
    assert parse_size("500M") == 500 << 20
    assert parse_size("2G") == 2 << 30
    assert parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert parse_size("4096") == 4096
    assert parse_size(10) == 10
    for bad in ("", "-1", "12X", "M", True, 1.5, -3, -1):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_gc_evicts_least_recently_used_and_keeps_referenced_blobs(workspace: Workspace) -> None:
    sized_targets(workspace, {"a": 300 * KIB, "b": 300 * KIB, "c": 300 * KIB})
    assert workspace.build().rc == 0
    time.sleep(0.05)
    # A hit on //:a makes it the most recently used entry.
    (workspace.root / "a.bin").unlink()
    r = workspace.build()
    assert r.status("//:a") == "restored"
    before = cache_bytes(workspace.cache)
    assert before >= 900 * KIB
    rc, out, err = workspace.run("cache", "gc", "--max-size", "400K")
    assert rc == 0, err
    assert "evicted 2 entries" in out
    assert cache_bytes(workspace.cache) <= 400 * KIB
    # The scan reset the size counter to what is on disk.
    assert read_counter(str(layout_dir(workspace.cache))) == cache_bytes(workspace.cache)
    counts = verify_cache(workspace.cache)  # survivors point at existing, intact blobs
    assert counts == {"entries": 1, "blobs": 1}
    # The survivor is //:a: deleting every output restores a, reruns b and c.
    for n in "abc":
        (workspace.root / f"{n}.bin").unlink()
    r = workspace.build()
    assert r.status("//:a") == "restored"
    assert r.status("//:b") == r.status("//:c") == "ran"


def test_gc_removes_unreferenced_blobs_and_old_temp_files(workspace: Workspace) -> None:
    sized_targets(workspace, {"a": 10 * KIB})
    assert workspace.build().rc == 0
    v_dir = layout_dir(workspace.cache)
    orphan = v_dir / "cas" / "ab" / ("ab" + "0" * 62)  # as a build killed between blob and entry leaves
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"x")
    stale = v_dir / "tmp" / "123.456.789"
    stale.write_bytes(b"half a blob")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = v_dir / "tmp" / "123.456.790"
    fresh.write_bytes(b"being written right now")
    rc, _, _ = workspace.run("cache", "gc")
    assert rc == 0
    assert not orphan.exists() and not stale.exists() and fresh.exists()
    assert verify_cache(workspace.cache) == {"entries": 1, "blobs": 1}


def test_gc_deletes_entries_it_cannot_read(workspace: Workspace) -> None:
    # A damaged entry (a miss for every build) is no entry: gc deletes it, and keeps the rest.
    import sqlite3

    sized_targets(workspace, {"a": 10 * KIB})
    assert workspace.build().rc == 0
    db = layout_dir(workspace.cache) / "actions.db"
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        c.execute("INSERT INTO actions VALUES (?, ?, ?)", ("f" * 64, b"{not json", time.time_ns()))
    rc, _, err = workspace.run("cache", "gc")
    assert rc == 0, err
    with contextlib.closing(sqlite3.connect(db)) as c:
        keys = [k for (k,) in c.execute("SELECT key FROM actions")]
    assert len(keys) == 1 and "f" * 64 not in keys
    assert verify_cache(workspace.cache) == {"entries": 1, "blobs": 1}


def test_gc_keeps_a_blob_that_a_surviving_entry_shares(workspace: Workspace) -> None:
    # x and y make the same 200K (one blob, two entries); x is stored first, y and z (300K)
    # later.  Evicting x leaves the blob to y; z goes to get under the cap.
    workspace.build_file("", "".join(
        f'genrule(name="{n}", outs=["{n}.bin"], cmd="{c} > $@")\n'
        for n, c in (("x", "head -c 204800 /dev/zero"), ("y", "head -c 204800 /dev/zero"),
                     ("z", "{ printf z; head -c 307200 /dev/zero; }"))))
    assert workspace.build("//:x").rc == 0
    time.sleep(0.05)
    assert workspace.build("//:y", "//:z").rc == 0
    rc, out, err = workspace.run("cache", "gc", "--max-size", "250K")
    assert rc == 0 and "evicted 2 entries" in out, out + err
    assert verify_cache(workspace.cache) == {"entries": 1, "blobs": 1}
    for n in "xyz":
        (workspace.root / f"{n}.bin").unlink()
    r = workspace.build()
    assert (r.status("//:x"), r.status("//:y"), r.status("//:z")) == ("ran", "restored", "ran"), r.output


def test_gc_keeps_entries_whose_contents_are_inline(workspace: Workspace) -> None:
    sized_targets(workspace, {"small": 100, "big": 10 * KIB})  # inside its entry / a blob
    assert workspace.build().rc == 0
    assert verify_cache(workspace.cache) == {"entries": 2, "blobs": 1}
    assert sorted(len(refs) for *_, refs in scan(str(layout_dir(workspace.cache))).entries) == [0, 1]
    rc, _, _ = workspace.run("cache", "gc")
    assert rc == 0
    assert verify_cache(workspace.cache) == {"entries": 2, "blobs": 1}
    for n in ("small", "big"):
        (workspace.root / f"{n}.bin").unlink()
    r = workspace.build()
    assert r.status("//:small") == r.status("//:big") == "restored"


def test_max_size_is_refused_in_a_workspace_config(workspace: Workspace) -> None:
    sized_targets(workspace, {"a": 10})
    (workspace.root / "buildtool.toml").write_text('# the cache\njobs = 2\nmax_size = "1G"\n')
    rc, _, err = workspace.run("build")
    assert rc == 2
    assert "buildtool.toml:3: max_size cannot be set by a workspace" in err, err


def test_bad_max_size_is_a_config_error(workspace: Workspace) -> None:
    sized_targets(workspace, {"a": 10})
    rc, _, err = workspace.run("build", env_extra={"BUILDTOOL_MAX_CACHE_SIZE": "lots"})
    assert rc == 2 and "max_size must be a size" in err
    rc, _, err = workspace.run("cache", "gc", "--max-size", "12X")
    assert rc == 2 and "--max-size" in err


def test_max_size_from_user_config_keeps_the_cache_under_the_cap(workspace: Workspace) -> None:
    cfg = workspace.home / "config" / "buildtool" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text('max_size = "700K"\n')
    names = [f"t{i}" for i in range(8)]
    sized_targets(workspace, dict.fromkeys(names, 200 * KIB))
    r = workspace.build("-j", "2")
    assert r.rc == 0, r.output
    assert cache_bytes(workspace.cache) <= 700 * KIB
    verify_cache(workspace.cache)
    # The running counter matches what is on disk after the eviction scan.
    assert read_counter(str(layout_dir(workspace.cache))) == cache_bytes(workspace.cache)
    # The env var overrides the user config.
    for n in names:
        (workspace.root / f"{n}.bin").unlink()
    r = workspace.build("-j", "2", env_extra={"BUILDTOOL_MAX_CACHE_SIZE": "300K"})
    assert r.rc == 0
    assert cache_bytes(workspace.cache) <= 300 * KIB
    verify_cache(workspace.cache)
    for n in names:
        assert (workspace.root / f"{n}.bin").stat().st_size == 200 * KIB + len(n)


def test_automatic_eviction_goes_down_to_the_low_water_mark(workspace: Workspace) -> None:
    # 8 x 170K over a 700K cap: down to 90% of it (3 entries), not just under the cap (4),
    # or nearly every build that stores anything evicts again.
    from buildtool.cache_gc import LOW_WATER

    cfg = workspace.home / "config" / "buildtool" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text('max_size = "700K"\n')
    sized_targets(workspace, {f"t{i}": 170 * KIB for i in range(8)})
    assert workspace.build().rc == 0
    assert cache_bytes(workspace.cache) <= LOW_WATER * 700 * KIB


class _Stored:
    """What cache_gc.after_build reads of the build's Cache: its dir and what it stored."""

    writable = True

    def __init__(self, where: Path, added: int = 0, counted: int = 0) -> None:
        self.dir = str(where)
        self.bytes_added, self.bytes_counted = added, counted

    def flush(self) -> None:
        pass


def test_the_end_of_a_build_adds_only_what_it_did_not_count_already(tmp_path: Path) -> None:
    # A long build adds what it stored to the counter every few seconds (bytes_counted): the
    # end adds the rest, not all of it again (a counter running ahead evicted for nothing).
    from buildtool.cache_gc import _write_counter, after_build

    _write_counter(str(tmp_path), 1060)  # (1000 before the build, and the 60 counted during it)
    after_build(_Stored(tmp_path, 100, 60), None, [], lambda msg: pytest.fail(msg))
    assert read_counter(str(tmp_path)) == 1100


def test_a_build_s_stats_line_counts_no_group_as_up_to_date(tmp_path: Path) -> None:
    from buildtool.cache_gc import after_build, recent_builds
    from buildtool.outcome import Outcome, Reason, Status

    outcomes = [Outcome(Status.UP_TO_DATE, Reason.UP_TO_DATE, ""), Outcome(Status.UP_TO_DATE, Reason.GROUP, ""),
                Outcome(Status.RAN, Reason.NEW, "")]
    after_build(_Stored(tmp_path), None, outcomes, lambda msg: pytest.fail(msg))
    [line] = recent_builds(str(tmp_path))
    assert (line["up_to_date"], line["ran"]) == (1, 1)


def test_a_full_disk_at_the_end_of_a_build_is_no_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No room for the stats line: the cache is full, which the build said when it stored (or
    # not, for a cache that is read only here): not "cache maintenance failed" once more.
    import errno

    from buildtool import cache_gc

    def full(*_a: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_gc, "_append_stats", full)
    cache_gc.after_build(_Stored(tmp_path, 10), None, [], lambda msg: pytest.fail(msg))


def test_a_size_counter_that_is_no_byte_count_is_none(tmp_path: Path) -> None:
    # (None: the next build scans the cache anew; a negative count held eviction off for good)
    from buildtool.cache_gc import SIZE_HEADER

    for body in ('{"bytes": -5}', '{"bytes": "12"}', '{"bytes": 1.5}'):
        (tmp_path / "size").write_text(SIZE_HEADER + body + "\n")
        assert read_counter(str(tmp_path)) is None, body
    (tmp_path / "size").write_text(SIZE_HEADER + '{"bytes": 12}\n')
    assert read_counter(str(tmp_path)) == 12


def test_what_a_killed_build_stored_is_counted_and_evicted_by_the_next(workspace: Workspace) -> None:
    """The counter was added to only at a build's end: builds killed midway (CI cancels)
    left everything they stored uncounted, and a cache capped at 5M held 81M for good."""
    workspace.write("s.txt", "0\n")
    workspace.build_file("", 'for i in range(40):\n'
                             '    genrule(name=f"r{i}", srcs=["s.txt"], outs=[f"r{i}.out"], '
                             'cmd=f"head -c 1000000 /dev/urandom > r{i}.out; sleep 0.2")\n'
                             'genrule(name="small", outs=["small.txt"], cmd="echo > $@")\n')
    env = {**_clean_env(workspace.cache, workspace.home), "BUILDTOOL_MAX_CACHE_SIZE": "5M"}
    assert workspace.build("//:small", env_extra={"BUILDTOOL_MAX_CACHE_SIZE": "5M"}).rc == 0
    v_dir = str(layout_dir(workspace.cache))
    at_start = read_counter(v_dir)
    assert at_start is not None and at_start < 100 * KIB
    build = subprocess.Popen([BUILDTOOL, "build", "-j", "2"], cwd=workspace.root, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while (read_counter(v_dir) or 0) < at_start + 5_500_000 and build.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert build.poll() is None, "the build ended before its stores were counted"
        assert (read_counter(v_dir) or 0) >= at_start + 5_500_000, "nothing was counted during the build"
    finally:
        build.kill()
        build.wait()
    assert cache_bytes(workspace.cache) > 5 << 20  # (over the cap: the killed build evicted nothing)
    (workspace.root / "small.txt").unlink()
    assert workspace.build("//:small", env_extra={"BUILDTOOL_MAX_CACHE_SIZE": "5M"}).rc == 0
    assert cache_bytes(workspace.cache) <= 5 << 20
    verify_cache(workspace.cache)


def test_the_cap_after_a_build_counts_the_descriptions_it_stored(workspace: Workspace) -> None:
    """A build's descriptions (the cache's explanation of misses) were weighed by GC's scan
    but not added to the running counter: with max_size set, 600 targets with a long
    command left a 300K cache at twice its cap, evicting nothing."""
    workspace.build_file("", f'for i in range(600):\n'
                             f'    genrule(name=f"t{{i}}", outs=[f"o/t{{i}}.txt"], '
                             f'cmd=f"echo {{i}} {"z" * 400} > /dev/null; echo {{i}} > $@")\n')
    r = workspace.build("-j", "2", env_extra={"BUILDTOOL_MAX_CACHE_SIZE": "300K"})
    assert r.rc == 0, r.output
    assert cache_bytes(workspace.cache) <= 300 * KIB, cache_bytes(workspace.cache)


def test_cache_stats_reports_entries_bytes_and_hit_rate(workspace: Workspace) -> None:
    sized_targets(workspace, {"a": 1000, "b": 2000})
    assert workspace.build().rc == 0  # 2 ran
    (workspace.root / "a.bin").unlink()
    (workspace.root / "b.bin").unlink()
    assert workspace.build().rc == 0  # 2 restored
    rc, out, _ = workspace.run("cache", "stats")
    assert rc == 0
    assert "entries:     2" in out
    total = cache_bytes(workspace.cache)
    assert f"bytes:       {total} " in out and total >= 3000
    assert "hit rate:    50.0% over the last 2 builds (2 restored, 0 adopted, 2 ran)" in out
    shutil.rmtree(workspace.root / ".buildtool")  # a fresh checkout's state: its outputs are the entries'
    assert workspace.build().rc == 0  # 2 adopted (it said "restored" of them)
    rc, out, _ = workspace.run("cache", "stats")
    assert rc == 0 and "66.7% over the last 3 builds (2 restored, 2 adopted, 2 ran)" in out, out
    # Lines of the right version with counts of the wrong type or size (planted, damaged): a
    # traceback (OverflowError, ValueError); skipped now, as a line of another version is.
    with open(layout_dir(workspace.cache) / "stats", "a") as f:
        f.write('{"v":1,"t":1,"ran":1e400}\n{"v":1,"t":1,"ran":"abc"}\n{"v":1,"t":1,"restored":-5}\n')
    rc, out, err = workspace.run("cache", "stats")
    assert rc == 0 and "66.7% over the last 3 builds" in out and "Traceback" not in err, out + err
    # A directory in the file's place: every build warned "cache maintenance failed (Is a
    # directory)", naming nothing, and none repaired it; it goes as a named pipe there does.
    stats = layout_dir(workspace.cache) / "stats"
    stats.unlink()
    stats.mkdir()
    (workspace.root / "a.bin").unlink()
    r = workspace.build()
    assert r.rc == 0 and "warning" not in r.stderr and not stats.is_dir(), r.output
    assert workspace.build("--no-wait").rc == 0
    rc, out, _ = workspace.run("cache", "stats")
    assert rc == 0 and "over the last 1 build (" in out and "note:" not in out, out
    # An older buildtool's layout beside this one's: never counted, read nor removed: said.
    (workspace.cache / "v1" / "ac").mkdir(parents=True)
    (workspace.cache / "v1" / "ac" / "e").write_bytes(b"x" * 2048)
    rc, out, _ = workspace.run("cache", "stats")
    assert rc == 0 and f"note:        {workspace.cache / 'v1'} (2.0 KiB) is another buildtool's layout" in out, out


@pytest.mark.parametrize("command", ["stats", "gc"])
def test_a_cache_dir_that_does_not_exist_is_said_and_not_made(
    tmp_path: Path, workspace: Workspace, command: str,
) -> None:
    """A mistyped --cache-dir read as an empty cache, without a word."""
    typo = tmp_path / "typo"
    rc, out, err = workspace.run("cache", command, "--cache-dir", str(typo))
    assert rc == 0 and f"note: there is no cache at {typo}" in err and not typo.exists(), out + err
    rc, out, err = workspace.run("cache", command, "--cache-dir", str(workspace.root))  # a directory, no cache
    assert rc == 0 and f"note: there is no cache at {workspace.root}" in err, out + err
    assert not (workspace.root / "v2").exists()


def test_cache_commands_work_outside_a_workspace(tmp_path: Path, workspace: Workspace) -> None:
    sized_targets(workspace, {"a": 1000})
    assert workspace.build().rc == 0
    outside = tmp_path / "nowhere"
    outside.mkdir()
    rc, out, _ = workspace.run("cache", "stats", cwd=outside)
    assert rc == 0 and "entries:     1" in out


def test_gc_while_a_build_restores_never_breaks_the_build(workspace: Workspace) -> None:
    n = 40
    sized_targets(workspace, {f"t{i}": 64 * KIB + i for i in range(n)})
    assert workspace.build("-j", "2").rc == 0
    expected = {f"t{i}.bin": (workspace.root / f"t{i}.bin").read_bytes() for i in range(n)}
    for rounds in range(3):
        for i in range(n):
            (workspace.root / f"t{i}.bin").unlink()
        env = _clean_env(workspace.cache, workspace.home)
        build = subprocess.Popen([BUILDTOOL, "build", "-j", "2"], cwd=workspace.root, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        gcs = 0
        deadline = time.monotonic() + 60
        while build.poll() is None and time.monotonic() < deadline:
            subprocess.run([BUILDTOOL, "cache", "gc", "--max-size", "0"], cwd=workspace.root, env=env,
                           capture_output=True, timeout=60, check=False)
            gcs += 1
        out, err = build.communicate(timeout=60)
        assert build.returncode == 0, (rounds, out, err)
        assert gcs >= 1
        for rel, data in expected.items():
            assert (workspace.root / rel).read_bytes() == data, rel
        verify_cache(workspace.cache)


def test_gc_and_stats_on_an_unreadable_database_say_so_in_one_line(workspace: Workspace) -> None:
    """GC must stop rather than take an unreadable database for an empty one; it said so
    with a traceback. A lock it cannot take at all is not 'busy: try again'."""
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="echo > $@")\n')
    assert workspace.build().rc == 0
    v2 = workspace.cache / "v2"
    for f in v2.glob("actions.db*"):
        f.unlink()
    (v2 / "actions.db").write_bytes(b"not a database, not even close" * 300)
    blobs = sorted(p.name for p in (v2 / "cas").rglob("*") if p.is_file())
    for command in ("stats", "gc"):
        rc, out, err = workspace.run("cache", command)
        assert rc == 1, (command, out, err)
        assert f"buildtool: error: cache {command}: the cache database" in err and "is unreadable" in err, err
        assert "Traceback" not in err, err
    assert sorted(p.name for p in (v2 / "cas").rglob("*") if p.is_file()) == blobs  # GC kept every blob
    (v2 / "actions.db").unlink()
    (v2 / "gc.lock").unlink(missing_ok=True)
    (v2 / "gc.lock").mkdir()
    rc, out, err = workspace.run("cache", "gc")  # (a directory in the lock's place: damaged, replaced)
    assert rc == 0 and "stayed busy" not in err and "Traceback" not in err, err
    assert (v2 / "gc.lock").is_file()


def _holding(lock: Path, how: str, seconds: float) -> subprocess.Popen[str]:
    """A real process holding an flock (``LOCK_EX`` or ``LOCK_SH``) on ``lock`` for
    ``seconds``, once it holds it."""
    holder = subprocess.Popen(
        ["python3", "-c", "import fcntl, os, time\n"
         f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.{how})\n"
         f"print('held', flush=True)\ntime.sleep({seconds})\n"],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_a_build_does_not_hang_on_a_gc_that_holds_the_cache(workspace: Workspace) -> None:
    """A stopped (or slow) `cache gc` holding gc.lock: the build waited on it for good, on
    the scheduler's thread, where Ctrl-C could not stop it.  It now waits a moment, says
    so, and builds without storing: the result is right, and the cache a miss."""
    sized_targets(workspace, {"a": 100, "b": 200})
    assert workspace.build("//:a").rc == 0  # the cache's layout exists
    lock = layout_dir(workspace.cache) / "gc.lock"
    holder = _holding(lock, "LOCK_EX", 120)  # as a gc does
    try:
        started = time.monotonic()
        r = workspace.build("//:b")
        assert r.rc == 0 and time.monotonic() - started < 30, r.output
        assert r.stderr.count(f"a cache gc holds {lock}; results are not stored until it is done") == 1, r.stderr
        assert workspace.read("b.bin").startswith("b")
    finally:
        holder.kill()
        holder.wait()
    (workspace.root / "b.bin").unlink()
    r = workspace.build("//:b")  # not stored then: it runs again (and is stored now)
    assert r.rc == 0 and r.status("//:b") == "ran" and "cache gc holds" not in r.stderr, r.output


def test_cache_gc_says_it_waits_for_builds_storing_into_the_cache(workspace: Workspace) -> None:
    """It waited up to a minute for a build holding gc.lock without a word."""
    sized_targets(workspace, {"a": 100})
    assert workspace.build("//:a").rc == 0
    holder = _holding(layout_dir(workspace.cache) / "gc.lock", "LOCK_SH", 1.5)  # a build storing, for a moment
    try:
        rc, out, err = workspace.run("cache", "gc")
    finally:
        holder.kill()
        holder.wait()
    assert rc == 0 and "cache gc: " in out, out + err
    assert err.count(f"cache gc: waiting for the builds storing into {workspace.cache} to finish") == 1, err
    rc, out, err = workspace.run("cache", "gc")
    assert rc == 0 and "waiting" not in err, err


def test_gc_on_a_database_that_refuses_frees_the_blobs_and_says_so(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """On a disk so full that SQLite's journal cannot grow, `cache gc --max-size` evicted
    nothing, printed "evicted 0 entries" and exited 0: when gc is run.  The blobs of the
    entries it chose go all the same (each a miss later), and it says so, exit 1."""
    from buildtool import cli
    from buildtool.actiondb import ActionDB

    sized_targets(workspace, {"a": 300 * KIB, "b": 300 * KIB, "c": 300 * KIB})
    assert workspace.build().rc == 0
    before = cache_bytes(workspace.cache)
    monkeypatch.setattr(ActionDB, "remove", lambda self, keys: not list(keys))  # (as a full disk refuses)
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(workspace.cache))
    rc = cli.main(["-C", str(workspace.root), "cache", "gc", "--max-size", "400K"])
    out, err = capsys.readouterr()
    assert rc == 1 and "entries chosen for eviction stay, their blobs deleted" in err, out + err
    assert cache_bytes(workspace.cache) < before - 500 * KIB, (before, cache_bytes(workspace.cache))
    # The entries that stayed are counted: a counter short of them let the cache grow past its cap.
    assert read_counter(str(layout_dir(workspace.cache))) == cache_bytes(workspace.cache)
    monkeypatch.undo()
    for n in "abc":  # (what lost its blob is a miss: the command runs)
        (workspace.root / f"{n}.bin").unlink()
    r = workspace.build()
    assert r.rc == 0 and len(r.with_status("ran")) == 2 and len(r.with_status("restored")) == 1, r.output


def test_gc_on_a_database_it_may_not_write_says_sqlite_s_reason(workspace: Workspace) -> None:
    """A cache another user owns: gc said "(a full disk?)" and that the blobs were deleted,
    when the database was read-only and (a shard it may not change) none was."""
    sized_targets(workspace, {"a": 300 * KIB, "b": 300 * KIB, "c": 300 * KIB})
    assert workspace.build().rc == 0
    db = layout_dir(workspace.cache) / "actions.db"
    with immutable(db):
        rc, out, err = workspace.run("cache", "gc", "--max-size", "400K")
    assert rc == 1, out + err
    assert "the cache's database could not be changed (" in err and "readonly database" in err, err
    assert "full disk" not in err and "entries chosen for eviction stay" in err, err


def test_gc_counts_the_blobs_it_could_not_delete_and_says_so(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Blobs in another user's shard (or root's, after `sudo -E buildtool build`): `cache gc`
    said "36.5 MiB -> 0 B", exit 0, and wrote 0 into the size counter with every blob in
    place (a max_size cap then undercounted).  (The refusal is faked: root may delete
    anything, and the tests run as root.)"""
    from buildtool import cache_gc, cli

    sized_targets(workspace, {"a": 300 * KIB, "b": 300 * KIB, "c": 300 * KIB})
    assert workspace.build().rc == 0
    real_unlink = os.unlink

    def refuse(p: str, *a: object, **k: object) -> None:
        if "/cas/" in str(p):
            raise PermissionError(13, "Permission denied", str(p))
        real_unlink(p, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(cache_gc.os, "unlink", refuse)
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(workspace.cache))
    rc = cli.main(["-C", str(workspace.root), "cache", "gc", "--max-size", "400K"])
    out, err = capsys.readouterr()
    monkeypatch.undo()
    assert rc == 1 and "blob(s) could not be deleted (first: " in err and "Permission denied" in err, out + err
    on_disk = cache_bytes(workspace.cache)
    assert on_disk >= 900 * KIB and read_counter(str(layout_dir(workspace.cache))) >= 900 * KIB, (
        on_disk, read_counter(str(layout_dir(workspace.cache))))
    # Shards it may not change (as a user who is not root sees them): no entry is evicted in
    # vain (each build after one over max_size evicted more, freeing nothing).
    assert workspace.build().rc == 0  # (the entries again)
    real_access = os.access
    monkeypatch.setattr(cache_gc.os, "access", lambda p, m, **k: "/cas/" not in str(p) and real_access(p, m, **k))
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(workspace.cache))
    rc = cli.main(["-C", str(workspace.root), "cache", "gc", "--max-size", "400K"])
    out, err = capsys.readouterr()
    monkeypatch.undo()
    assert rc == 0 and "evicted 0 entries" in out, out + err


def test_links_planted_in_the_cache_lead_gc_and_builds_nowhere_outside_it(workspace: Workspace, tmp_path: Path) -> None:
    """A team's (group-writable) or a restored cache: `v2/tmp` linked to another directory
    had gc empty it, a `cas/pr` link had gc delete that directory's `pr*` entries, a linked
    shard received blobs (and a chmod), and a linked actions.db got the cache's tables."""
    import sqlite3

    sized_targets(workspace, {"a": 3 * KIB, "b": 3 * KIB})
    assert workspace.build().rc == 0
    v2 = layout_dir(workspace.cache)
    victim = tmp_path / "victim"
    (victim / "projects").mkdir(parents=True)
    (victim / "prices.csv").write_text("1\n")
    (victim / "notes.txt").write_text("n\n")
    old = time.time() - 7 * 86400
    for p in (victim / "prices.csv", victim / "notes.txt", victim / "projects"):
        os.utime(p, (old, old))
    shutil.rmtree(v2 / "tmp")
    os.symlink(victim, v2 / "tmp")
    os.symlink(victim, v2 / "cas" / "pr")
    other_db = tmp_path / "other.db"
    sqlite3.connect(other_db).execute("CREATE TABLE mine (x)").connection.commit()
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            (v2 / ("actions.db" + suffix)).unlink()
    os.symlink(other_db, v2 / "actions.db")
    rc, out, err = workspace.run("cache", "gc", "--max-size", "0")
    assert rc in (0, 1), out + err
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt", "prices.csv", "projects"], err
    assert [r[0] for r in sqlite3.connect(other_db).execute("SELECT name FROM sqlite_master")] == ["mine"]
    # A build storing into a linked shard: storing is off, said with the path; nothing lands there.
    for shard in [p for p in (v2 / "cas").iterdir() if p.is_dir() and not p.is_symlink()]:
        shutil.rmtree(shard)
        os.symlink(victim, shard)
    for n in "ab":
        workspace.path(f"{n}.bin").unlink()
    sized_targets(workspace, {"a": 3 * KIB + 1, "b": 3 * KIB + 1})
    r = workspace.build()
    assert r.rc == 0, r.output
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt", "prices.csv", "projects"], r.output
    assert oct(victim.stat().st_mode & 0o777) == oct(0o755)
    # The linked database was refused on every build, caching off for good: it is replaced
    # by a file of the cache's own once (reliability.md), the file it led to untouched.
    assert "actions.db is damaged (it is a symbolic link" in r.output, r.output
    assert (v2 / "actions.db").is_file() and not (v2 / "actions.db").is_symlink()
    assert [r[0] for r in sqlite3.connect(other_db).execute("SELECT name FROM sqlite_master")] == ["mine"]


def test_what_a_build_stored_before_the_cache_turned_off_is_counted(workspace: Workspace) -> None:
    """A build that stored 10 MB and then hit a full disk (the cache turned off for it)
    skipped the counter: the cache stayed over max_size with a counter of 0 (a review of a
    full disk)."""
    import types

    from buildtool.cache_gc import after_build

    sized_targets(workspace, {"a": 300 * KIB})
    assert workspace.build().rc == 0
    v2 = str(layout_dir(workspace.cache))
    before = read_counter(v2)
    assert before is not None
    cache = types.SimpleNamespace(bytes_added=123_456, bytes_counted=0, writable=False, dir=v2, flush=lambda: None)
    after_build(cache, None, [], lambda msg: None)
    assert read_counter(v2) == before + 123_456


def test_gc_gives_the_database_s_free_pages_back(workspace: Workspace) -> None:
    """Evicting rows freed pages inside actions.db, which never shrank: `cache gc --max-size
    200K` reported 199.8 KiB of a directory of 3 MB (the database alone)."""
    workspace.write("v.txt", "1\n")
    workspace.build_file("", 'V = open("v.txt").read().strip()\n'
                             'for i in range(1500):\n'
                             '    genrule(name=f"g{i}", outs=[f"o/{i}"], cmd=f"echo {V} {i} > $@")\n')
    for v in "123":
        workspace.write("v.txt", v + "\n")
        assert workspace.build("-j", "4").rc == 0
    db = layout_dir(workspace.cache) / "actions.db"
    assert db.stat().st_size > 1_500_000, db.stat().st_size
    rc, out, err = workspace.run("cache", "gc", "--max-size", "300K")
    assert rc == 0 and "; the database gave back " in out, out + err
    on_disk = sum(p.stat().st_size for p in layout_dir(workspace.cache).rglob("*") if p.is_file())
    assert on_disk < 900_000, on_disk  # (300K of entries and the database's own overhead; it was ~2 MB)


def test_of_entries_used_at_the_same_time_gc_evicts_the_one_large_enough_first(workspace: Workspace) -> None:
    """A build stores its entries in batches, each with one `used` time: ties were broken by
    key, so many small entries went before the one large blob that alone was over the cap
    (the next checkout reran 18 targets instead of 2)."""
    r = _gc_one_batch_then_build(workspace, {"big": 600 * KIB, **{f"s{i}": 4 * KIB for i in range(8)}}, "300K", 1)
    assert r.status("//:big") == "ran" and all(r.status(f"//:s{i}") == "restored" for i in range(8)), r.output


def _gc_one_batch_then_build(workspace: Workspace, sizes: dict[str, int], cap: str, evicted: int) -> BuildRun:
    """Build targets of these output sizes, mark every entry used at one moment (one batch
    for gc), `cache gc --max-size cap` (evicting ``evicted`` entries), delete the outputs and
    build again: what ran was evicted."""
    import sqlite3

    sized_targets(workspace, sizes)
    assert workspace.build().rc == 0
    with sqlite3.connect(layout_dir(workspace.cache) / "actions.db") as db:
        db.execute("UPDATE actions SET used = 1")
        db.execute("DELETE FROM hits")
    rc, out, err = workspace.run("cache", "gc", "--max-size", cap)
    assert rc == 0 and f"evicted {evicted} entries" in out, out + err
    for p in workspace.root.glob("*.bin"):
        p.unlink()
    return workspace.build()


def test_of_entries_used_at_the_same_time_none_enough_alone_gc_evicts_the_largest_first(
        workspace: Workspace) -> None:
    # 100K, 200K, 300K stored at one moment; a cap of 180K: the 300K entry, then the 200K
    # one, is enough; smallest first went through all three (the 100K entry lost for nothing).
    r = _gc_one_batch_then_build(workspace, {"a": 100 * KIB, "b": 200 * KIB, "c": 300 * KIB}, "180K", 2)
    assert (r.status("//:a"), r.status("//:b"), r.status("//:c")) == ("restored", "ran", "ran"), r.output


def test_of_entries_used_at_the_same_time_gc_evicts_the_smallest_that_is_enough(workspace: Workspace) -> None:
    """Largest first alone threw away a 2 MB entry (likely the costliest target) where one
    of 200 KB brought the cache under the cap."""
    import sqlite3

    sized_targets(workspace, {"big": 2048 * KIB, **{f"s{i}": 200 * KIB for i in range(4)}})
    assert workspace.build().rc == 0
    with sqlite3.connect(layout_dir(workspace.cache) / "actions.db") as db:
        db.execute("UPDATE actions SET used = 1")
        db.execute("DELETE FROM hits")
    cap = cache_bytes(workspace.cache) - 150 * KIB
    rc, out, err = workspace.run("cache", "gc", "--max-size", str(cap))
    assert rc == 0 and "evicted 1 entries" in out, out + err
    for p in workspace.root.glob("*.bin"):
        p.unlink()
    r = workspace.build()
    assert r.status("//:big") == "restored" and sum(r.status(f"//:s{i}") == "ran" for i in range(4)) == 1, r.output


def test_a_build_after_a_killed_one_counts_the_cache_anew(workspace: Workspace) -> None:
    """A killed build loses what it stored since its last count, and the losses of many
    added up (a cache 5.7x its cap with a counter near 0): the next build in that workspace
    scans the cache instead of adding to the counter."""
    from buildtool import orphans

    sized_targets(workspace, {f"t{i}": 1_000_000 for i in range(6)} | {"small": 10})
    assert workspace.build().rc == 0  # (no cap yet: everything stays)
    v_dir = str(layout_dir(workspace.cache))
    (layout_dir(workspace.cache) / "size").write_text('# buildtool cache-size v1\n{"bytes": 1000}\n')  # uncounted
    dead = subprocess.Popen(["true"])
    dead.wait()
    (workspace.root / ".buildtool" / "children").write_text(f"{orphans.HEADER_PREFIX}{dead.pid} since=1\n")
    (workspace.root / "small.bin").unlink()
    r = workspace.build("//:small", env_extra={"BUILDTOOL_MAX_CACHE_SIZE": "5M"})
    assert r.rc == 0, r.output
    assert cache_bytes(workspace.cache) <= 5 << 20
    assert read_counter(v_dir) == cache_bytes(workspace.cache)
    verify_cache(workspace.cache)


def test_gc_keeps_the_blobs_of_a_command_s_captured_output(workspace: Workspace) -> None:
    """An entry's stdout and stderr are blobs it references, as its outputs are: taken for
    garbage, every cached log went (a cached test's replayed output too)."""
    workspace.build_file("", 'genrule(name="t", outs=["o"], cmd="seq 1 30000; seq 1 20000 >&2; echo x > $@")\n')
    assert workspace.build().rc == 0
    before = verify_cache(workspace.cache)
    assert before["blobs"] == 2, before  # (the output is inline; stdout and stderr are not)
    rc, out, err = workspace.run("cache", "gc")
    assert rc == 0 and verify_cache(workspace.cache) == before, out + err


def test_gc_never_deletes_through_a_shard_that_is_a_link(workspace: Workspace, tmp_path: Path) -> None:
    """A shard directory replaced by a link (a team's cache, a restored one): its blob-named
    files are another directory's, never gc's to delete."""
    sized_targets(workspace, {"a": 3 * KIB})
    assert workspace.build().rc == 0
    cas = layout_dir(workspace.cache) / "cas"
    shard = next(f"{i:02x}" for i in range(256) if not (cas / f"{i:02x}").exists())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    theirs = elsewhere / (shard + "0" * 62)
    theirs.write_bytes(b"not the cache's\n")
    os.symlink(elsewhere, cas / shard)
    rc, out, err = workspace.run("cache", "gc", "--max-size", "0")
    assert rc in (0, 1) and theirs.read_bytes() == b"not the cache's\n", out + err


def test_an_entry_naming_one_blob_twice_frees_it_when_evicted(workspace: Workspace) -> None:
    """Two outputs with the same content: one blob, referenced twice by one entry.  Counted
    twice, evicting the entry left it behind (and gc evicted more entries than needed)."""
    workspace.build_file("", 'genrule(name="t", outs=["a", "b"], cmd="head -c 102400 /dev/zero > a; cp a b")\n')
    assert workspace.build().rc == 0
    assert verify_cache(workspace.cache) == {"entries": 1, "blobs": 1}
    rc, out, err = workspace.run("cache", "gc", "--max-size", "0")
    assert rc == 0 and verify_cache(workspace.cache) == {"entries": 0, "blobs": 0}, out + err


def test_gc_stops_evicting_once_the_cache_is_exactly_at_the_cap(workspace: Workspace) -> None:
    sized_targets(workspace, {"x": 40 * KIB})
    assert workspace.build().rc == 0
    time.sleep(0.05)
    sized_targets(workspace, {"x": 40 * KIB, "y": 50 * KIB})
    assert workspace.build("//:y").rc == 0
    s = scan(str(layout_dir(workspace.cache)))
    oldest = min(s.entries)
    cap = s.total - oldest[2] - sum(s.blobs[d] for d in set(oldest[3]))  # (what evicting x alone leaves)
    rc, out, err = workspace.run("cache", "gc", "--max-size", str(cap))
    assert rc == 0 and "evicted 1 entr" in out, out + err
    assert verify_cache(workspace.cache)["entries"] == 1


def test_a_link_planted_at_the_stats_file_is_not_written_through(tmp_path: Path) -> None:
    # A shared, group-writable cache: a link at v2/stats had every build append its line
    # to the file it led to, anywhere the builder may write.
    from buildtool.cache_gc import after_build, recent_builds

    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("VICTIM\n")
    (tmp_path / "stats").symlink_to(victim)
    after_build(_Stored(tmp_path), None, [], lambda msg: pytest.fail(msg))
    assert victim.read_text() == "VICTIM\n"
    assert not (tmp_path / "stats").is_symlink()
    after_build(_Stored(tmp_path), None, [], lambda msg: pytest.fail(msg))  # the next build's line: a file of its own
    assert len(recent_builds(str(tmp_path))) == 1 and victim.read_text() == "VICTIM\n"


def test_a_directory_at_a_lock_file_of_the_cache_is_replaced(tmp_path: Path) -> None:
    # size.lock as a directory: "cache maintenance failed ... (Is a directory)" twice a
    # build, for good.
    from buildtool.cache_gc import _write_counter, after_build

    _write_counter(str(tmp_path), 1060)
    (tmp_path / "size.lock").mkdir()
    warned: list[str] = []
    after_build(_Stored(tmp_path, 100, 60), None, [], warned.append)
    assert warned == [] and (tmp_path / "size.lock").is_file()
    assert read_counter(str(tmp_path)) == 1100


def test_the_stats_file_is_trimmed(tmp_path) -> None:
    from buildtool import cache_gc
    p = tmp_path / "stats"
    p.write_text("".join(f'{{"v":1,"t":{i},"bytes_added":0}}\n' for i in range(5000)))
    cache_gc._trim_stats(str(tmp_path))
    assert len(p.read_text().splitlines()) == cache_gc.STATS_KEEP_LINES


def test_gc_never_scans_through_a_cas_that_is_a_link(tmp_path) -> None:
    from buildtool import cache_gc
    other = tmp_path / "elsewhere" / "ab"
    other.mkdir(parents=True)
    (other / ("ab" + "0" * 62)).write_bytes(b"x" * 10)
    v = tmp_path / "v2"
    v.mkdir()
    os.symlink(tmp_path / "elsewhere", v / "cas")
    assert cache_gc.scan(str(v)).blobs == {}
    cache_gc.collect(str(v), None)
    assert (other / ("ab" + "0" * 62)).exists()


def test_after_one_wait_for_gc_a_store_does_not_wait_again(tmp_path) -> None:
    import fcntl

    # A 500-action build beside a long `cache gc` waited 2 s a store (~1000 s).
    from buildtool import cache_gc
    fd = os.open(tmp_path / "gc.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    g = cache_gc.StoreGuard(str(tmp_path))
    assert g.acquire() is False
    t0 = time.monotonic()
    assert g.acquire() is False
    assert time.monotonic() - t0 < 0.5
    os.close(fd)


def test_gc_evicts_no_entry_whose_blobs_it_may_not_delete(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    # Shards another user made (a team's cache, this user without write access to them):
    # evicting their entries frees nothing, and each build evicted more useful ones in vain.
    # (os.access stands for the permissions a test run as root cannot have.)
    from buildtool import cache_gc

    sized_targets(workspace, {"a": 300 * KIB, "b": 300 * KIB})
    assert workspace.build().rc == 0
    v_dir = str(layout_dir(workspace.cache))
    real_access = os.access
    monkeypatch.setattr(cache_gc.os, "access", lambda p, mode: False if "/cas/" in str(p) else real_access(p, mode))
    res = cache_gc.collect(v_dir, 100 * KIB)
    assert res.entries_evicted == 0 and verify_cache(workspace.cache)["entries"] == 2
