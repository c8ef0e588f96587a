"""Loader: evaluating a BUILD.py leaves the process as it found it, and its stand-ins for
``open``/``io.open_code``/``os.stat`` never get in the way of the imports it makes."""

from __future__ import annotations

import _io
import builtins
import io
import os
import subprocess
import sys
from importlib._bootstrap_external import FileLoader  # (what importlib's loaders read files with)
from pathlib import Path

import pytest
from conftest import Workspace as TempWorkspace

from buildtool.errors import BuildfileError
from buildtool.loader import Loader
from buildtool.workspace import Workspace


def _workspace(tmp_path: Path, build_py: str) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "buildtool.toml").write_text("")
    (ws / "BUILD.py").write_text(build_py)
    return ws


@pytest.mark.parametrize("build_py", [
    "raise RuntimeError('no')\n",
    "import os\nos.stat('nowhere')\n",
    "open('nowhere.txt')\n",
    "import runpy\nrunpy.run_path('nowhere.py')\n",
    "import importlib.util\nspec = importlib.util.spec_from_file_location('m', 'nowhere.pyc')\n"
    "spec.loader.get_data('nowhere.pyc')\n",
], ids=["raises", "stat", "open", "open_code", "get_data"])
def test_an_evaluation_that_raises_puts_everything_back(tmp_path: Path, build_py: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ws = _workspace(tmp_path, build_py)
    monkeypatch.chdir(ws)
    before = (builtins.open, io.open, io.open_code, _io.open_code, os.stat, os.lstat, os.listdir, os.scandir,
              sys.stdout, list(sys.meta_path), sys.dont_write_bytecode, FileLoader.get_data)
    with pytest.raises(BuildfileError, match=r"evaluating BUILD\.py raised"):
        Loader(Workspace(str(ws), "", ())).load("")
    after = (builtins.open, io.open, io.open_code, _io.open_code, os.stat, os.lstat, os.listdir, os.scandir,
             sys.stdout, list(sys.meta_path), sys.dont_write_bytecode, FileLoader.get_data)
    assert after == before


def test_a_process_started_by_a_buildfile_is_noted_with_subprocess_imported_before(tmp_path: Path) -> None:
    """subprocess keeps its own reference to fork_exec, taken at its import: imported before
    any evaluation (by watchdog, in watch mode; by this test run here), a BUILD.py's
    subprocess.run went unnoticed and the snapshot vouched for what git rev-parse said.
    And the stand-ins are all gone afterwards (an import during the evaluation took one
    for good: every later command of the build counted as the BUILD.py's)."""
    import _posixsubprocess

    assert "subprocess" in sys.modules
    ws = _workspace(tmp_path, "import subprocess\nsubprocess.run(['true'], check=True)\n")
    loader = Loader(Workspace(str(ws), "", ()))
    loader.load("")
    assert loader.spawned == "BUILD.py"
    assert subprocess._fork_exec is _posixsubprocess.fork_exec  # type: ignore[attr-defined]
    (tmp_path / "q").mkdir()
    quiet = Loader(Workspace(str(_workspace(tmp_path / "q", "import subprocess\n")), "", ()))
    quiet.load("")
    assert quiet.spawned is None
    # First imported by the BUILD.py (a fresh interpreter: here it was imported long ago),
    # subprocess took the stand-in for good, and every command of the build counted.
    ws = tmp_path / "q" / "ws"  # (its BUILD.py imports subprocess, and calls nothing)
    script = ("import sys\nassert 'subprocess' not in sys.modules\n"
              "from buildtool.loader import Loader\nfrom buildtool.workspace import Workspace\n"
              f"Loader(Workspace({str(ws)!r}, '', ())).load('')\n"
              "import subprocess, _posixsubprocess\nassert subprocess._fork_exec is _posixsubprocess.fork_exec\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr


def test_a_compiled_module_imported_before_importlib_util_is(tmp_path: Path) -> None:
    """The ``io.open_code`` stand-in maps a ``__pycache__`` file to its source without an
    import of its own: one made there, while ``importlib.util`` was not loaded yet (a
    regular install; an editable one's finder loads it at start-up), read importlib's own
    compiled files through the stand-in again and failed the BUILD.py's import.  So this
    runs buildtool in an interpreter started without site (no .pth hooks) that has
    checked ``importlib.util`` is not loaded."""
    import py_compile

    import blake3

    import buildtool

    ws = _workspace(tmp_path, "from tools import defs\n"
                              "genrule(name='t', outs=['t.txt'], cmd='echo ' + defs.V + ' > $@')\n")
    (ws / "tools").mkdir()
    (ws / "tools" / "defs.py").write_text("V = 'compiled'\n")
    py_compile.compile(str(ws / "tools" / "defs.py"), doraise=True)  # (the import reads this .pyc)
    paths = [os.path.dirname(os.path.dirname(m.__file__)) for m in (buildtool, blake3)]
    script = (f"import sys\nsys.path[:0] = {paths!r}\n"
              "from buildtool.cli import main\n"
              "assert 'importlib.util' not in sys.modules, 'loaded at start-up: this test would prove nothing'\n"
              f"sys.exit(main(['-C', {str(ws)!r}, 'build']))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUILDTOOL_", "PYTHON"))}
    env.update(BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    p = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env, timeout=120,
                       check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (ws / "t.txt").read_text() == "compiled\n"


def test_glob_exclude_leaves_out_what_its_patterns_match_and_only_that(workspace: TempWorkspace) -> None:
    """``glob(include, exclude=...)`` as Bazel's: a file an exclude pattern matches is not a
    source (not in $(SRCS), and editing it reruns nothing), whether the pattern names a
    directory's tree, a file, or a ``*`` name, which stays in one directory (``*.bak.txt``
    leaves ``notes/n.bak.txt`` in).  A glob ignoring ``exclude`` would put drafts and
    backups into what the target makes (a release archive, a docs bundle) and rerun it on
    every edit of them."""
    for rel in ("a.txt", "b.bak.txt", "drafts/d.txt", "drafts/deep/e.txt", "notes/n.txt", "notes/n.bak.txt",
                "notes/skip.txt"):
        workspace.write(f"doc/{rel}", rel + "\n")
    workspace.build_file("doc", """
        genrule(name="all", outs=["all.out"], cmd="echo $(SRCS) > $@",
                srcs=glob(["**/*.txt"], exclude=["drafts/**", "*.bak.txt", "notes/skip.txt"]))
        """)
    r = workspace.build("//doc:all")
    assert r.rc == 0 and r.ran == {"//doc:all"}, r.output
    assert workspace.read("doc/all.out") == "a.txt notes/n.bak.txt notes/n.txt\n"
    for rel in ("b.bak.txt", "drafts/d.txt", "drafts/deep/e.txt", "notes/skip.txt"):
        workspace.write(f"doc/{rel}", "edited\n")
        r = workspace.build("//doc:all")
        assert r.rc == 0 and r.status("//doc:all") == "up_to_date", (rel, r.output)
    workspace.write("doc/notes/n.bak.txt", "edited\n")  # (included: an edit reruns it)
    assert workspace.build("//doc:all").ran == {"//doc:all"}


def test_a_loader_keeps_no_earlier_loader_alive_through_the_contexts_it_takes_over(tmp_path: Path) -> None:
    """Watch mode's next loader takes over the contexts of the packages no edit touched
    (watch.py, graph_source); a context's glob was the bound method of the loader that
    made it, so each loader kept the one before alive, with all it held: ~40 KB a cycle
    that re-evaluated another package than the last, for good."""
    import gc
    import weakref

    (tmp_path / "buildtool.toml").write_text("")
    pkgs = [f"p{i}" for i in range(3)]
    for p in pkgs:
        (tmp_path / p).mkdir()
        (tmp_path / p / "a.txt").write_text("a\n")
        (tmp_path / p / "BUILD.py").write_text('genrule(name="t", srcs=glob(["*.txt"]), outs=["o"], '
                                               'cmd="cat $(SRCS) > $@")\n')
    ws = Workspace(str(tmp_path), "", ())
    old = Loader(ws)
    for p in pkgs:
        old.load(p)
    gone: list[weakref.ref[Loader]] = []
    for i in range(9):  # each package in turn, as watch does on an edit of its BUILD.py
        dirty = pkgs[i % 3]
        new = Loader(ws)
        for p, decls in old._packages.items():
            if p != dirty:
                new._packages[p] = decls
                new._contexts[p] = old._contexts[p]
        assert new.load(dirty)["t"].attrs["srcs"] == ["a.txt"]
        gone.append(weakref.ref(old))
        old = new
    gc.collect()
    assert [r() is None for r in gone] == [True] * 9
