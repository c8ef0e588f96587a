"""Start-up cost: what a build imports.

A one-source-changed build spends about half its time importing modules, so the build
path stays clear of heavy stdlib modules (docs/benchmarks.md): each test runs a real
command in a fresh interpreter and fails if one of them comes back, e.g. through an
import at the top of a module.  Also: the small stand-ins for what those modules did
behave as the originals.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from buildtool import executor
from buildtool.atomic import remove_path
from buildtool.noop import WINDOW_NS
from buildtool.session import _median

# Each costs milliseconds of every build (inspect, pulled in by dataclasses, alone ~11 ms).
HEAVY = {"dataclasses", "inspect", "typing", "statistics", "shutil", "argparse", "uuid", "platform", "hashlib",
         "random", "tempfile", "ast", "difflib", "traceback", "tomllib", "pickletools", "copy"}
# What only the full path (BUILD.py evaluation) or a build that runs commands may add.
BUILD_ONLY = {"buildtool.session", "buildtool.runner", "subprocess"}
# What the no-op path does without (json would bring re and enum, array collections.abc,
# signal enum): it is Python's start-up plus a few milliseconds, and each of these is one or more of them.
NOOP_NEVER = {"json", "re", "enum", "array", "collections", "threading", "fnmatch", "pickle", "_pickle", "signal"}
# All that a no-op the file monitor vouches for may import (~14 ms in all, Python's start-up
# ~10 of them, each module ~0.2-0.4 ms): no errors.py, no atomic.py, no C stat loop (there
# is nothing to stat but files out of the monitor's sight), no daemon code, no binascii.
MONITORED_NOOP = {"__future__", "buildtool", "buildtool.cli", "buildtool.noop", "buildtool.lock", "fcntl",
                  "buildtool.workspace", "buildtool.monitor", "_socket", "gc", "marshal", "time"}

# Only what buildtool adds counts: the interpreter's start-up may already hold some of HEAVY
# (a site-packages .pth hook can import certifi -> importlib.resources -> tempfile, typing).
_REPORT = """
import sys
before = set(sys.modules)
from buildtool.cli import main
code = main(sys.argv[1:])
print("MODULES", " ".join(sorted(set(sys.modules) - before)))
"""


def _modules_of_build(ws: Path, cache: Path, *args: str, cwd: Path | None = None) -> set[str]:
    """The modules ``buildtool -C WS build ARGS`` loads (in a fresh interpreter, beyond its
    start-up), run in ``cwd`` (default: this process's directory, not the workspace)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDTOOL_")}
    env.update(BUILDTOOL_CACHE_DIR=str(cache), XDG_CONFIG_HOME=str(ws.parent / "config"), CI="1")
    p = subprocess.run([sys.executable, "-c", _REPORT, "-C", str(ws), "build", *args], capture_output=True, text=True,
                       env=env, timeout=120, check=False, cwd=cwd)
    assert p.returncode == 0, p.stdout + p.stderr
    last = p.stdout.splitlines()[-1]
    assert last.startswith("MODULES ")
    return set(last.split()[1:])


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    (w / "buildtool.toml").write_text("")
    for i in range(3):
        (w / f"{i}.txt").write_text(f"{i}\n")
    (w / "BUILD.py").write_text(
        'for i in range(3):\n'
        '    genrule(name=f"t{i}", srcs=[f"{i}.txt"], outs=[f"out/{i}.txt"], cmd="cp $< $@")\n'
        'genrule(name="all", srcs=[":t0", ":t1", ":t2"], outs=["all.txt"], cmd="cat $(SRCS) > $@")\n'
    )
    return w


def test_builds_import_no_heavy_module(ws: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    time.sleep(WINDOW_NS / 1e9 * 2)  # so that the snapshot can vouch for BUILD.py (not racily clean)
    full = _modules_of_build(ws, cache, "-j", "2")
    assert full >= BUILD_ONLY  # (it was a real build)
    assert not HEAVY & full, HEAVY & full
    _modules_of_build(ws, cache)  # the first build made out/, so only this one leaves a snapshot
    (ws / "1.txt").write_text("changed\n")
    incremental = _modules_of_build(ws, cache, "--cache-dir", str(cache))
    # The snapshot's graph, reused: unpickled, no BUILD.py evaluated; pickle's and sqlite3's C
    # parts only (noop.py, actiondb.py: their Python layers cost ~4 ms of every such build).
    assert "_pickle" in incremental, sorted(incremental)
    assert "buildtool.loader" not in incremental, sorted(incremental)
    assert not {"pickle", "sqlite3", "datetime"} & incremental, {"pickle", "sqlite3", "datetime"} & incremental
    assert not HEAVY & incremental, HEAVY & incremental
    assert "subprocess" in incremental  # commands outside buildtool's directory start through Popen
    (ws / "1.txt").write_text("changed again\n")
    at_root = _modules_of_build(ws, cache, "--cache-dir", str(cache), cwd=ws)
    assert "buildtool.runner" in at_root  # (commands ran)
    if executor.pidfds_work():  # ... and in it through posix_spawn (docs/architecture.md#spawning)
        assert "subprocess" not in at_root
    noop = set()
    for _ in range(3):  # a racily clean file without a recorded digest counts as changed once
        noop = _modules_of_build(ws, cache)
        if "buildtool.session" not in noop:
            break
    assert not (HEAVY | BUILD_ONLY | NOOP_NEVER) & noop, (HEAVY | BUILD_ONLY | NOOP_NEVER) & noop
    assert "buildtool.session" not in noop
    assert "buildtool.monitor" not in noop  # no monitor runs: its client is not even imported
    if sys.platform.startswith("linux"):  # a no-op vouched for by the file monitor: no more than that
        from buildtool import monitor

        monitor.start(str(ws), str(ws / ".buildtool"), 120.0)
        try:
            seen = [_modules_of_build(ws, cache) for _ in range(2)]  # the first arms the monitor's clock
            info = monitor.status(str(ws / ".buildtool"))
        finally:
            monitor.stop(str(ws / ".buildtool"))
        assert info is not None and info["vouched"] == 1, info
        assert "buildtool.monitor" in seen[1] and "socket" not in seen[1]
        assert seen[1] <= MONITORED_NOOP, sorted(seen[1] - MONITORED_NOOP)
        assert not (HEAVY | BUILD_ONLY | NOOP_NEVER) & seen[1], (HEAVY | BUILD_ONLY | NOOP_NEVER) & seen[1]


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=9))
def test_median_is_statistics_median(values: list[float]) -> None:
    assert _median(values) == statistics.median(values)


def test_which_is_shutil_which(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_exec, is_dir, real = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (not_exec, is_dir, real):
        d.mkdir()
    (not_exec / "bash").write_text("")
    (is_dir / "bash").mkdir()
    (real / "bash").write_text("#!/bin/sh\n")
    (real / "bash").chmod(0o755)
    for path in (os.pathsep.join(map(str, (not_exec, is_dir, real))), str(not_exec), "", os.environ.get("PATH", "")):
        assert executor.which("bash", path) == shutil.which("bash", path=path), path
    # Relative entries are the command's: looked up from its directory, not buildtool's.
    monkeypatch.chdir(tmp_path)
    assert executor.which("bash", f"a{os.pathsep}c", str(tmp_path)) == str(real / "bash")
    assert executor.which("bash", "c", "/nonexistent") is None


def test_remove_path_removes_what_a_build_leaves_in_its_tmp(tmp_path: Path) -> None:
    """The state dir's tmp/ at the end of a build (atomic.remove_path: no recursion, no shutil)."""
    tmp = tmp_path / "tmp"
    (tmp / "1-0").mkdir(parents=True)
    (tmp / "1-1").mkdir()
    (tmp / "1-0.capture.out").write_text("x")
    (tmp / "1-1.capture.err").symlink_to(tmp_path)
    remove_path(str(tmp))  # the usual case: emptied lane dirs and capture files
    assert not tmp.exists() and tmp_path.exists()
    (tmp / "1-0" / "deep").mkdir(parents=True)
    (tmp / "1-0" / "deep" / "f").write_text("x")
    (tmp / "staged").write_text("x")
    remove_path(str(tmp))  # what a command or a restore left
    assert not tmp.exists()
    remove_path(str(tmp))  # nothing there
