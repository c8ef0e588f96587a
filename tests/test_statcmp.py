"""The C loop of the no-op check (buildtool/_statcmp.c): the same answers as noop._compare_py.

The module is compiled here from the source tree with the interpreter's own compiler
settings (the tests import ``buildtool`` from the checkout, where a regular install leaves
no compiled module); where no compiler or no Python headers are found, these tests skip.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from array import array
from collections.abc import Callable
from pathlib import Path

import pytest

from buildtool import noop

SOURCE = Path(noop.__file__).with_name("_statcmp.c")


def _compiler() -> list[str] | None:
    ld = sysconfig.get_config_var("LDSHARED")
    include = sysconfig.get_paths()["include"]
    if not ld or not shutil.which(shlex.split(ld)[0]) or not os.path.exists(os.path.join(include, "Python.h")):
        return None
    return [*shlex.split(ld), *shlex.split(sysconfig.get_config_var("CCSHARED") or ""), f"-I{include}"]


@pytest.fixture(scope="module")
def changed(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[int]]:
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler or Python headers: the C loop is not built here")
    out = tmp_path_factory.mktemp("statcmp") / f"_statcmp{sysconfig.get_config_var('EXT_SUFFIX')}"
    flags = ["-O2", "-Wall", "-Wextra", "-Werror"]
    proc = subprocess.run([*cc, *flags, str(SOURCE), "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    spec = importlib.util.spec_from_file_location("buildtool._statcmp", out)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.changed


def _packed(rows: list[list[int] | None], skew: int = 4) -> list[memoryview]:
    """The columns as a snapshot holds them once read back (noop.check): cast from where
    the body ends, ``skew`` bytes past an 8-byte boundary."""
    cols = noop._columns(rows)
    m = len(rows)
    data = b"\0" * skew + b"".join(array("q", c).tobytes() for c in cols)
    packed = memoryview(data)[skew:].cast("q")
    return [packed[i * m : (i + 1) * m] for i in range(4)]


def _row(path: Path) -> list[int] | None:
    try:
        return noop.stat_row(os.stat(path))
    except OSError:
        return None


SURROGATE = os.fsdecode(b"bad\xffname.txt")  # a name that is not UTF-8: os.stat encodes it back


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, list[str], list[list[int] | None], set[str]]:
    """A directory, its files' rows as a build recorded them, then changes made to some of
    them: (root, paths, rows, the paths that must be found changed)."""
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    names = ["same", "grown", "touched", "replaced", "chmod", "gone", "racy", "sub/ünïcode", "sub/ünïcode2"]
    off_by_one = ["size-off", "mtime-off", "ino-off", "ctime-off"]  # untouched; one stored column is not
    names += off_by_one
    for name in names:
        (root / name).write_text(f"{name}\n")
    (root / SURROGATE).write_text("x\n")
    os.symlink("same", root / "link")
    os.symlink("grown", root / "relink")
    os.symlink("nowhere", root / "dangling")
    paths = [*names, SURROGATE, "link", "relink", "dangling", "still-missing", "appeared", "sub", str(root / "same")]
    rows = [_row(root / p) for p in paths]
    rows[paths.index("racy")] = [-1, 0, 0, 0]  # the RACY sentinel size: matches no file
    for column, name in enumerate(off_by_one):
        row = rows[paths.index(name)]
        assert row is not None
        row[column] += 1
    time.sleep(0.05)  # past the kernel's coarse clock tick: a change now gets a new ctime
    with open(root / "grown", "a") as f:
        f.write("more\n")
    st = os.stat(root / "touched")
    os.utime(root / "touched", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    old = os.stat(root / "replaced")
    (root / "replaced.tmp").write_text("replaced\n")  # same size and mtime, another inode
    os.utime(root / "replaced.tmp", ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(root / "replaced.tmp", root / "replaced")
    os.chmod(root / "chmod", 0o600)
    (root / "gone").unlink()
    (root / "sub/ünïcode2").write_text("edited, longer\n")
    os.unlink(root / "relink")
    os.symlink("same", root / "relink")
    (root / "appeared").write_text("new\n")
    expected = {"grown", "touched", "replaced", "chmod", "gone", "racy", "sub/ünïcode2", "relink", "appeared"}
    expected.update(off_by_one)
    return root, paths, rows, expected


def test_the_c_loop_finds_exactly_what_the_python_loop_finds(
    changed: Callable[..., list[int]], tree: tuple[Path, list[str], list[list[int] | None], set[str]]
) -> None:
    root, paths, rows, expected = tree
    cols = _packed(rows)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        n = len(paths)
        want = noop._compare_py(fd, paths, cols, 0, 0, n)
        assert {paths[k] for k in want} == expected
        assert changed(fd, paths, 0, n, 0, *cols, noop.MISSING) == want
        assert changed(fd, paths, 0, n, 0, *_packed(rows, skew=0), noop.MISSING) == want
        for threads in (-1, 0, 2, 3, 7, n, 10_000):  # (out of 1..MAX_THREADS, or more than paths: clamped)
            assert changed(fd, paths, 0, n, 0, *cols, noop.MISSING, threads) == want
        for a, b in [(0, 0), (0, 5), (3, 9), (7, n), (n, n)]:
            assert changed(fd, paths, a, b, 0, *cols, noop.MISSING) == noop._compare_py(fd, paths, cols, 0, a, b)
            assert changed(fd, paths, a, b, 0, *cols, noop.MISSING, 4) == noop._compare_py(fd, paths, cols, 0, a, b)
        # rows ``lo`` on in the columns (a snapshot's ``files``, then sources and outputs)
        pad = _packed([[0, 0, 0, 0]] * 3 + rows)
        for threads in (1, 3):
            got = changed(fd, paths, 2, n, 3, *pad, noop.MISSING, threads)
            assert got == noop._compare_py(fd, paths, pad, 3, 2, n)
    finally:
        os.close(fd)


def test_every_thread_finds_the_changes_in_its_share(changed: Callable[..., list[int]], tmp_path: Path) -> None:
    """Thousands of files, one changed in every stretch of seven and at both ends: however
    many threads share the loop (each takes the next few hundred positions left), the
    answer is the one thread's, in order, and each of those files is in it."""
    n = 3000
    paths = [f"d{i % 3}/f{i}" for i in range(n)]
    for d in range(3):
        (tmp_path / f"d{d}").mkdir()
    for p in paths:
        (tmp_path / p).write_text(p)
    rows = [_row(tmp_path / p) for p in paths]
    edits = sorted({0, n - 1, *range(3, n, 7)})
    time.sleep(0.05)  # past the coarse clock tick: an edit now gets a new ctime
    for k in edits:
        if k % 2:
            (tmp_path / paths[k]).unlink()
        else:
            (tmp_path / paths[k]).write_text("edited")
    cols = _packed(rows)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for threads in (1, 2, 3, 5, 16):
            assert changed(fd, paths, 0, n, 0, *cols, noop.MISSING, threads) == edits, threads
        assert changed(fd, paths, 100, 2600, 0, *cols, noop.MISSING, 4) == [k for k in edits if 100 <= k < 2600]
    finally:
        os.close(fd)


def test_a_no_op_check_on_threads_gives_the_one_loops_verdict(
    changed: Callable[..., list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """noop.write() -> noop.check() with the C loop and a thread per few paths: sources and
    outputs are checked in one threaded pass and sorted back into the verdict, which is the
    Python loop's."""
    root, state = tmp_path / "ws", tmp_path / "state"
    (root / "src").mkdir(parents=True)
    (root / "out").mkdir()
    state.mkdir()
    srcs = [f"src/{i}" for i in range(1300)]
    outs = [f"out/{i}" for i in range(700)]
    for p in [*srcs, *outs]:
        (root / p).write_text(p)
    time.sleep(0.06)  # past the racy window
    assert noop.write(str(state), str(root), {"mode": "build"}, [], [], [], srcs, outs, None)
    (root / srcs[0]).write_text("edited source")
    (root / srcs[1200]).write_text("edited source, far from the first")
    (root / outs[-1]).unlink()
    (root / outs[0]).write_text("tampered output")
    calls: list[int] = []

    def counted(*args: object) -> list[int]:
        calls.append(int(args[-1]))  # type: ignore[call-overload]
        return changed(*args)

    def verdict(fast: object) -> list[str] | None:
        monkeypatch.setattr(noop, "_fast", fast)
        v = noop.check(str(state), str(root), {"mode": "build"})
        return None if v is None else v.changed

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3}, raising=False)
    assert verdict(None) == verdict(counted) == [srcs[0], srcs[1200], outs[0], outs[-1]]
    assert calls == [4]  # one pass over the 2,000 sources and outputs, on as many threads as CPUs
    (root / srcs[1250]).unlink()  # a missing source: the full path reports it
    assert verdict(None) is None and verdict(counted) is None


def test_the_threads_are_one_per_share_of_paths_and_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(32)), raising=False)
    assert noop._threads(0) == noop._threads(2 * noop.PER_THREAD - 1) == 1
    assert noop._threads(2 * noop.PER_THREAD) == 2
    assert noop._threads(5 * noop.PER_THREAD + 1) == 5
    assert noop._threads(10**9) == noop.MAX_THREADS
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {3}, raising=False)
    assert noop._threads(10**9) == 1  # this process may run on one CPU only


def test_compare_takes_the_c_loop_for_snapshot_columns(
    changed: Callable[..., list[int]],
    tree: tuple[Path, list[str], list[list[int] | None], set[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, paths, rows, expected = tree
    calls: list[int] = []

    def counted(*args: object) -> list[int]:
        calls.append(1)
        return changed(*args)

    monkeypatch.setattr(noop, "_fast", counted)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert len(paths) < noop.C_LOOP_MIN  # a few paths: the Python loop (importing the C one costs more)
        found = noop._compare(fd, paths, _packed(rows), 0, 0, len(paths))
        assert {paths[k] for k in found} == expected and calls == []
        monkeypatch.setattr(noop, "C_LOOP_MIN", len(paths))
        assert noop._compare(fd, paths, _packed(rows), 0, 0, len(paths)) == found and calls == [1]
        lists = noop._columns(rows)  # plain lists (the files' own rows): the Python loop
        assert noop._compare(fd, paths, lists, 0, 0, len(paths)) == found and calls == [1]
    finally:
        os.close(fd)


def test_the_c_loop_refuses_what_it_cannot_read(changed: Callable[..., list[int]], tmp_path: Path) -> None:
    cols = _packed([None, None])
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(ValueError, match="int64"):
            changed(fd, ["a", "b"], 0, 2, 0, *cols[:3], memoryview(b"\0" * 16), noop.MISSING)
        with pytest.raises(ValueError, match="int64"):
            changed(fd, ["a", "b"], 0, 2, 1, *cols, noop.MISSING)  # rows 1..2 of 2
        with pytest.raises(ValueError, match="out of range"):
            changed(fd, ["a", "b"], 1, 3, 0, *cols, noop.MISSING)
        with pytest.raises(ValueError, match="out of range"):
            changed(fd, ["a", "b"], 0, 1, sys.maxsize, *cols, noop.MISSING)  # lo + b past the largest size
        with pytest.raises(TypeError):
            changed(fd, [b"a", "b"], 0, 2, 0, *cols, noop.MISSING)
        assert changed(fd, ["a", "b"], 0, 2, 0, *cols, noop.MISSING) == []  # both still missing
        # no file has a NUL in its name: one that was missing still is, one that was not is gone
        assert changed(fd, ["a\0b", "b"], 0, 2, 0, *cols, noop.MISSING) == []
        assert changed(fd, ["a\0b", "b"], 0, 2, 0, *_packed([[1, 2, 3, 4], None]), noop.MISSING) == [0]
    finally:
        os.close(fd)


def test_the_installed_buildtool_has_the_c_loop_where_it_can_be_built(
    changed: Callable[..., list[int]], tmp_path: Path
) -> None:
    """The install compiled it (the fixture just did, with the same compiler): the no-op
    check of the installed command runs in C.  Run outside the checkout, whose
    ``buildtool`` a regular install does not compile into."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", "import buildtool.noop as n; print(n._accelerator() is not None)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.stdout.strip() == "True", proc.stderr


def test_a_module_compiled_into_the_checkout_is_not_older_than_its_source() -> None:
    """An editable install (``pip install -e .``) compiles the module next to its source
    once and never again: after an edit of ``_statcmp.c``, the commands and tests would run
    the old loop.  Run ``pip install -e .`` again."""
    compiled = list(SOURCE.parent.glob("_statcmp*.so"))
    if not compiled:
        pytest.skip("no module compiled into the checkout (not an editable install)")
    for built in compiled:
        assert built.stat().st_mtime >= SOURCE.stat().st_mtime, f"{built} is older than {SOURCE}: pip install -e ."


def test_a_module_compiled_for_other_arguments_is_not_used(
    changed: Callable[..., list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An editable install keeps the module it compiled before ``_statcmp.c`` changed: one
    whose API is not noop's is left alone (the Python loop runs) instead of being called
    with arguments it does not take."""
    import types

    assert getattr(changed.__self__, "API", None) == noop.STATCMP_API  # (its module: the source's, just compiled)
    old = types.ModuleType("buildtool._statcmp")
    old.changed = changed  # type: ignore[attr-defined]  # (API 1 had no constant)
    monkeypatch.setitem(sys.modules, "buildtool._statcmp", old)
    monkeypatch.setattr(noop, "_fast", noop._UNLOADED)
    assert noop._accelerator() is None
    old.API = noop.STATCMP_API  # type: ignore[attr-defined]
    monkeypatch.setattr(noop, "_fast", noop._UNLOADED)
    assert noop._accelerator() is changed
