"""Action keys: canonical, covering what the action sees, never the workspace's path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import Workspace
from hypothesis import given, settings
from hypothesis import strategies as st

from buildtool import keys


def desc(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "kind": "genrule", "pkg": "p", "cmd": "cat a > o", "shell": "/bin/sh",
        "env": {"PATH": "/usr/bin"}, "tools": {}, "inputs": {"p/a": "d1"}, "outs": ("p/o",),
    }
    base.update(over)
    return keys.action_description(**base)  # type: ignore[arg-type]


def test_key_is_deterministic_and_order_independent() -> None:
    a = desc(env={"A": "1", "B": "2"}, inputs={"p/a": "1", "p/b": "2"})
    b = desc(env={"B": "2", "A": "1"}, inputs={"p/b": "2", "p/a": "1"})
    assert keys.key_of(a) == keys.key_of(b)
    assert len(keys.key_of(a)) == 64


def test_key_covers_every_field() -> None:
    k0 = keys.key_of(desc())
    variants = [
        desc(kind="test"), desc(pkg="q"), desc(cmd="cat a >o"), desc(shell="/bin/bash"),
        desc(env={"PATH": "/bin"}), desc(env={"PATH": "/usr/bin", "X": ""}), desc(tools={"cc": "d"}),
        desc(inputs={"p/a": "d2"}), desc(inputs={"p/b": "d1"}), desc(outs=("p/o2",)),
        desc(extra={"fn": "m:f"}),
    ]
    got = {keys.key_of(v) for v in variants}
    assert k0 not in got
    assert len(got) == len(variants)


def test_the_key_format_version_and_python_s_micro_version_change_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants that left KEY_VERSION out of the description (an upgrade changing the format
    would rerun nothing) or Python's micro version out of a pyrule's identity (3.11.7 ->
    3.11.8: pyrules taken as up to date) survived every test."""
    import sys
    import types

    k0 = keys.key_of(desc())
    monkeypatch.setattr(keys, "KEY_VERSION", keys.KEY_VERSION + 1)
    assert keys.key_of(desc()) != k0
    before = keys.python_identity()
    v = sys.version_info
    monkeypatch.setattr(sys, "version_info", types.SimpleNamespace(major=v.major, minor=v.minor, micro=v.micro + 1))
    assert keys.python_identity() != before


BUILD_LIB = """
genrule(name="gen", srcs=["in.txt"], outs=["gen/out.h"], cmd="cat $(SRCS) > $@ && echo $$(echo generated) >> $@")
"""
BUILD_APP = """
genrule(
    name="app",
    srcs=["main.txt", "//lib:gen"],
    outs=["app.out"],
    env={"MODE": "release"},
    cmd="cat $(location main.txt) $(location //lib:gen) > $@ && echo $$MODE >> $@",
)
test(name="check", deps=[":app"], cmd="grep -q release app.out")
"""


def _make(ws: Workspace) -> None:
    ws.write("lib/in.txt", "lib input\n")
    ws.write("app/main.txt", "main\n")
    ws.build_file("lib", BUILD_LIB)
    ws.build_file("app", BUILD_APP)


def test_same_workspace_at_two_paths_gets_identical_keys(workspace: Workspace, tmp_path: Path) -> None:
    _make(workspace)
    first = workspace.build()
    assert first.rc == 0, first.output
    other_dir = tmp_path / "somewhere" / "much" / "deeper" / "with a space"
    other_dir.parent.mkdir(parents=True)
    copy = workspace.copy_to(other_dir, cache=tmp_path / "other-cache")
    second = copy.build()
    assert second.rc == 0, second.output
    # The copy really ran (separate cache), and got exactly the same keys.
    assert second.ran == {"//lib:gen", "//app:app"}
    k1 = {lab: e["key"] for lab, e in first.by_label.items()}
    k2 = {lab: e["key"] for lab, e in second.by_label.items()}
    assert k1 == k2
    assert len(set(k1.values())) == len(k1)
    # Test targets' keys too.
    t1, t2 = workspace.build(command="test"), copy.build(command="test")
    assert t1.rc == 0 and t2.rc == 0, (t1.output, t2.output)
    assert t1.by_label["//app:check"]["key"] == t2.by_label["//app:check"]["key"]


def test_keys_change_when_an_input_changes(workspace: Workspace) -> None:
    _make(workspace)
    first = workspace.build()
    workspace.write("lib/in.txt", "another input\n")
    second = workspace.build()
    assert second.rc == 0, second.output
    for lab in ("//lib:gen", "//app:app"):
        assert first.by_label[lab]["key"] != second.by_label[lab]["key"]
        assert second.status(lab) == "ran"


def test_caller_environment_does_not_leak_into_keys(workspace: Workspace) -> None:
    _make(workspace)
    first = workspace.build()
    second_ws_run = workspace.build(env_extra={"SOME_RANDOM_VAR": "x", "MODE": "debug"})
    assert second_ws_run.rc == 0
    assert {e["status"] for e in second_ws_run.events} == {"up_to_date"}
    assert {e["key"] for e in first.events} == {e["key"] for e in second_ws_run.events}


def test_pyrule_fn_problem_finds_what_the_run_would_miss(tmp_path: Path) -> None:
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "__init__.py").write_text("")
    (tmp_path / "gen" / "rules.py").write_text(
        "import os\nfrom json import dumps as make_json\n"
        "try:\n    import tomllib\nexcept ImportError:\n    def fallback(**kw): pass\n"
        "if os.name == 'posix':\n    def write(srcs, outs): pass\n"
        "copy = write\n"
    )
    (tmp_path / "lazy.py").write_text("def __getattr__(name):\n    return print\n")
    (tmp_path / "star.py").write_text("from os.path import *\n")
    # (names bound at run time: not found by reading, so not refused; a mutant refusing them survived)
    (tmp_path / "dyn.py").write_text("for n in ('a', 'b'):\n    globals()['make_' + n] = print\n")
    (tmp_path / "dyn2.py").write_text("import sys\nsetattr(sys.modules[__name__], 'make', print)\n")
    for ok in ("gen.rules:write", "gen.rules:copy", "gen.rules:make_json", "gen.rules:fallback",
               "gen.rules:tomllib", "lazy:anything", "star:join", "json:dump", "sys:exit", "dyn:make_a",
               "dyn2:make"):
        assert keys.pyrule_fn_problem(str(tmp_path), ok) is None, ok
    assert keys.pyrule_fn_problem(str(tmp_path), "gen.rules:nope") == \
        "gen/rules.py never binds 'nope' (no def, class, assignment or import of it; fn='gen.rules:nope')"
    missing = keys.pyrule_fn_problem(str(tmp_path), "gen.other:write")
    assert missing is not None and "module 'gen.other'" in missing and "gen/other.py" in missing
    assert "Python identifiers" in (keys.pyrule_fn_problem(str(tmp_path), "gen.rules:a-b") or "")
    (tmp_path / "broken.py").write_text("def write(srcs, outs):\n    return (\n")  # (the run failed, exit 1)
    said = keys.pyrule_fn_problem(str(tmp_path), "broken:write") or ""
    assert said.startswith("broken.py:2: syntax error: ") and "the module of fn='broken:write'" in said, said


_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text())
_TREE = st.recursive(_LEAF, lambda kids: st.one_of(st.lists(kids), st.dictionaries(st.text(), kids)), max_leaves=25)


@settings(max_examples=400)
@given(st.dictionaries(st.text(), _TREE))
def test_canonical_text_is_exactly_json_dumps(d: dict[str, object]) -> None:
    # Every key ever stored depends on this text: the encoder made once must write what
    # json.dumps writes, character for character.
    assert keys.canonical(d) == json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert keys.compact_json(False)(d) == json.dumps(d, separators=(",", ":"), ensure_ascii=False)


def test_canonical_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        keys.canonical({"a": object()})
    with pytest.raises(TypeError):
        keys.canonical({"a": {1: "x", "b": "y"}})  # keys that do not sort


def _loaded(fn: object, data: bytes) -> str:
    """What a JSON reader makes of ``data``, as comparable text (NaN is not equal to itself)."""
    try:
        return "ok:" + json.dumps(fn(data))  # type: ignore[operator]
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return "error:" + type(e).__name__


_loads = keys.compact_loads()


@settings(max_examples=400)
@given(_TREE, st.sampled_from(["", " ", "\n", "\ufeff"]), st.sampled_from(["", " ", "\n", "x", "}"]))
def test_compact_loads_reads_what_json_loads_reads(tree: object, head: str, tail: str) -> None:
    # The build record and the action entries are read through it: whatever json.loads
    # returns or refuses, it must too, with text around the value or not.
    data = (head + json.dumps(tree, separators=(",", ":"), ensure_ascii=False) + tail).encode("utf-8", "surrogatepass")
    assert _loaded(_loads, data) == _loaded(json.loads, data)


@given(st.binary(max_size=40))
def test_compact_loads_refuses_what_json_loads_refuses(data: bytes) -> None:
    assert _loaded(_loads, data) == _loaded(json.loads, data)


def test_compact_loads_reads_the_encodings_json_loads_detects() -> None:
    for enc in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "utf-8-sig"):
        for text, value in (('{"a":["é",1]}', {"a": ["é", 1]}), ('{"a":1}', {"a": 1}), ('"a"', "a")):
            data = text.encode(enc)  # (ASCII in UTF-16/32 without a BOM is valid UTF-8 too)
            assert _loads(data) == json.loads(data) == value, (enc, text)


def test_path_entries_inside_the_checkout_are_keyed_from_its_root(tmp_path: Path) -> None:
    repo = tmp_path / "clone"
    (repo / ".git").mkdir(parents=True)
    (repo / "ws" / "sub").mkdir(parents=True)
    root = str(repo / "ws" / "sub")
    assert keys.checkout_root(root) == str(repo)
    assert keys.checkout_root(str(tmp_path)) == str(tmp_path)  # no .git above: the workspace itself
    path = f"{repo}/.venv/bin:/usr/bin:{repo}:{repo}x/bin"
    keyed = keys.keyed_path(path, str(repo))
    assert keyed == f"$BUILDTOOL_CHECKOUT/.venv/bin:/usr/bin:$BUILDTOOL_CHECKOUT:{repo}x/bin"
    assert keys.real_path(keyed, str(repo)) == path
    assert keys.keyed_path("/usr/bin:/bin", str(repo)) == "/usr/bin:/bin"
    # Reached through a symlink to the checkout (a venv made in a linked directory): keyed
    # as its real path is, so the two spellings share keys; other entries stay as given.
    link = tmp_path / "link"
    link.symlink_to(repo)
    assert keys.keyed_path(f"{link}/.venv/bin:/usr/bin", str(repo)) == "$BUILDTOOL_CHECKOUT/.venv/bin:/usr/bin"


def test_a_git_worktree_or_submodule_whose_git_is_a_file_is_a_checkout_too(tmp_path: Path) -> None:
    # `git worktree add` and submodules write .git as a file ("gitdir: ..."): the checkout's
    # root is still there, so a second worktree's own .venv/bin keys as the first one's does.
    repo = tmp_path / "wt"
    (repo / "ws").mkdir(parents=True)
    (repo / ".git").write_text("gitdir: /elsewhere/.git/worktrees/wt\n")
    assert keys.checkout_root(str(repo / "ws")) == str(repo)


@pytest.mark.parametrize("base", ["/work/clone", "/"])
@pytest.mark.parametrize(("path", "keyed"), [
    ("/usr/bin:/bin:/usr/bin", "/usr/bin:/bin"),  # (a setup step put /usr/bin first again: it never wins)
    ("/usr/bin/:/bin//", "/usr/bin:/bin"),  # (a CI image's /bin/)
    ("/:/usr/bin:/", "/:/usr/bin"),
    ("::.:/bin:", ":.:/bin"),  # ("" is the working directory, as ".": kept, once)
    ("/bin:/bin/", "/bin"),
])
def test_a_path_entry_listed_again_or_with_a_trailing_slash_does_not_change_the_key(
    base: str, path: str, keyed: str,
) -> None:
    """Every target missed when a runner image's PATH had /bin/ for /bin, or /usr/bin twice:
    the same lookups, so the same key."""
    assert keys.keyed_path(path, base) == keyed


def test_two_clones_with_their_own_venv_on_path_share_the_cache(tmp_path: Path) -> None:
    """As the README sets up: a .venv in each clone, first on PATH. The commands still get
    their clone's real PATH (they find the tool there), and the second clone restores."""
    from conftest import run_buildtool

    runs = []
    for name in ("one", "two"):
        repo = tmp_path / name
        (repo / ".git").mkdir(parents=True)
        (repo / "proj").mkdir()
        (repo / "proj" / "buildtool.toml").write_text("")
        (repo / "proj" / "BUILD.py").write_text('genrule(name="hi", outs=["hi.txt"], cmd="hello-tool > $@")\n')
        tool = repo / ".venv" / "bin" / "hello-tool"
        tool.parent.mkdir(parents=True)
        tool.write_text("#!/bin/sh\necho hello\n")
        tool.chmod(0o755)
        env_path = f"{tool.parent}:{os.environ['PATH']}"
        rc, out, err = run_buildtool("build", cwd=repo / "proj", cache_dir=tmp_path / "cache", home=tmp_path / "h",
                                     env_extra={"PATH": env_path})
        assert rc == 0, out + err
        assert (repo / "proj" / "hi.txt").read_text() == "hello\n"
        runs.append(out)
    assert "1 ran" in runs[0] and "1 restored" in runs[1], runs


def test_a_module_is_parsed_once_while_it_is_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """150 pyrules of one module tree parsed it 150 times per build and per watch cycle
    (15 s); an edit is still seen."""
    import ast

    from buildtool import keys

    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "gen.py").write_text("from . import h\n")
    (tmp_path / "tools" / "h.py").write_text("X = 1\n")
    parsed: list[str] = []
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda src, name="<unknown>", *a, **k: (parsed.append(name), real(src, name))[1])
    for _ in range(150):
        assert keys.pyrule_module_files(str(tmp_path), "tools.gen:f") == [
            "tools/__init__.py", "tools/gen.py", "tools/h.py"]
    assert len(parsed) == 3, parsed
    (tmp_path / "tools" / "h.py").write_text("from tools import k\n")
    (tmp_path / "tools" / "k.py").write_text("")
    assert "tools/k.py" in keys.pyrule_module_files(str(tmp_path), "tools.gen:f")


def test_a_pyrule_s_module_is_the_package_python_imports_not_the_file_beside_it(tmp_path: Path) -> None:
    """With gen.py and gen/__init__.py both there, Python runs the package; the key hashed
    gen.py, so an edit of the package was no change (and a cache restored the old output)."""
    from buildtool import keys

    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "__init__.py").write_text("def run(srcs, outs): pass\n")
    (tmp_path / "gen.py").write_text("def run(srcs, outs): pass\n")
    absent: list[str] = []
    assert keys.pyrule_module_files(str(tmp_path), "gen:run", absent) == ["gen/__init__.py"]
    assert absent == []
    assert keys.pyrule_module_files(str(tmp_path), "nothere:run", absent) == []
    assert absent == ["nothere/__init__.py", "nothere.py"]


def test_a_package_that_would_shadow_a_pyrule_s_module_is_watched_and_a_sibling_import_counts(tmp_path: Path) -> None:
    """tools/consts.py found: a tools/consts/__init__.py made later is what Python imports,
    so the snapshot must watch it (it was a regraph that left the pyrule "unchanged").  And
    `sys.path.insert(0, os.path.dirname(__file__)); import helper` in tools/gen.py runs
    tools/helper.py, which the key left out (an edit of it was "up to date")."""
    from buildtool import keys

    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "consts.py").write_text("X = 1\n")
    (tmp_path / "tools" / "helper.py").write_text("Y = 2\n")
    (tmp_path / "tools" / "gen.py").write_text("import sys, os\nsys.path.insert(0, os.path.dirname(__file__))\n"
                                               "import helper\nfrom tools import consts\n")
    absent: list[str] = []
    got = keys.pyrule_module_files(str(tmp_path), "tools.gen:run", absent)
    assert got == ["tools/__init__.py", "tools/consts.py", "tools/gen.py", "tools/helper.py"], got
    assert "tools/consts/__init__.py" in absent and "tools/gen/__init__.py" in absent, absent
    assert "tools/helper/__init__.py" in absent and "helper.py" in absent, absent


def test_a_missing_module_of_a_namespace_package_the_workspace_shares_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ns/ in the workspace (no __init__.py) and another ns/ portion on buildtool's own
    path: fn="ns.missing:f" was accepted once the workspace root was no longer left on
    buildtool's sys.path (the pyrule then failed at run time)."""
    from buildtool.keys import pyrule_fn_problem

    root, other = tmp_path / "ws", tmp_path / "site"
    (root / "ns").mkdir(parents=True)
    (root / "ns" / "here.py").write_text("def f(srcs, outs):\n    pass\n")
    (other / "ns").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(other))
    assert pyrule_fn_problem(str(root), "ns.here:f") is None
    problem = pyrule_fn_problem(str(root), "ns.missing:f")
    assert problem is not None and "is not in the workspace" in problem, problem


def test_a_pyrule_module_importable_only_through_pythonpath_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With PYTHONPATH=src the check found mypkg.gen and passed; the action, which never
    gets PYTHONPATH, then failed with ModuleNotFoundError."""
    from buildtool.keys import pyrule_fn_problem

    root = tmp_path / "ws"
    (root / "src" / "mypkg").mkdir(parents=True)
    (root / "src" / "mypkg" / "__init__.py").write_text("")
    (root / "src" / "mypkg" / "gen.py").write_text("def make(srcs, outs):\n    pass\n")
    src = str(root / "src")
    monkeypatch.setenv("PYTHONPATH", src)
    monkeypatch.syspath_prepend(src)  # (as the interpreter put it there at start)
    problem = pyrule_fn_problem(str(root), "mypkg.gen:make")
    assert problem is not None and "is not in the workspace" in problem, problem


def test_a_pythonpath_entry_naming_the_interpreter_s_own_site_packages_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PYTHONPATH repeating site-packages (Nix, Spack, CI images) made a module the action
    finds through site "not importable" (a review)."""
    import site

    from buildtool.keys import pyrule_fn_problem

    monkeypatch.setenv("PYTHONPATH", site.getsitepackages()[0])
    assert pyrule_fn_problem(str(tmp_path), "pytest:main") is None  # (pytest: in this venv's site-packages)


def test_a_pyrule_s_parent_packages_count_and_a_same_size_edit_is_seen(tmp_path: Path) -> None:
    """A module that imports nothing of its package still runs its package's __init__.py
    (its import side effects); and an edit that keeps the file's size and inode (in place,
    `from tools import a` -> `... b`) is a new parse: the memo is keyed by mtime too."""
    from buildtool import keys

    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "gen.py").write_text("import os\n")
    assert keys.pyrule_module_files(str(tmp_path), "tools.gen:f") == ["tools/__init__.py", "tools/gen.py"]
    for name in ("a", "b"):
        (tmp_path / "tools" / f"{name}.py").write_text("")
    gen = tmp_path / "tools" / "gen.py"
    gen.write_text("from tools import a\n")
    assert "tools/a.py" in keys.pyrule_module_files(str(tmp_path), "tools.gen:f")
    st = gen.stat()
    with open(gen, "r+") as f:  # (in place: the same inode and size)
        f.write("from tools import b\n")
    os.utime(gen, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert gen.stat().st_ino == st.st_ino and gen.stat().st_size == st.st_size
    got = keys.pyrule_module_files(str(tmp_path), "tools.gen:f")
    assert "tools/b.py" in got and "tools/a.py" not in got, got
