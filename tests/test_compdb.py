"""compdb: ``buildtool graph --format compdb`` writes clang's JSON compilation database of
the compile targets; each entry, run as it says, compiles its source with the real compiler."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import Workspace

from buildtool.compdb import command_words

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def test_a_simple_command_is_split_as_the_shell_would_and_pwd_is_its_directory() -> None:
    words = command_words("cc -fdebug-prefix-map=\"$PWD\"=. -DNAME='a b' -c 'x y.c' -o _objs/x.o", "/w/p")
    assert words == ["cc", "-fdebug-prefix-map=/w/p=.", "-DNAME=a b", "-c", "x y.c", "-o", "_objs/x.o"]
    assert command_words("cc -I${PWD}/inc -c a.c", "/w") == ["cc", "-I/w/inc", "-c", "a.c"]
    assert command_words("cc -DA=a#b -c x.c", "/w") == ["cc", "-DA=a#b", "-c", "x.c"]  # ('#' mid-word: no comment)
    assert command_words("cc -c \\\nx.c", "/w") == ["cc", "-c", "x.c"]  # (a backslash-newline joins lines)
    assert command_words("cc '-DA=a\nb' -c x.c", "/w") == ["cc", "-DA=a\nb", "-c", "x.c"]  # (a quoted newline)


@pytest.mark.parametrize("cmd", [
    "cc -c a.c -o a.o && printf '%s:\\n' a.o > a.d",  # (the cc macros' assembly: no depfile from cc)
    "cc -c a.c; true", "cc -c a.c | tee log", "cc -c a.c > log", "(cc -c a.c)", "cc -c 'a.c", "",
    "cc -c f.c -o f.o\nrm -f stale.tmp", "# a comment\ncc -c a.c", "CCACHE_DIR=/c cc -c a.c",
    "cc -c a.c # a comment after it",
])
def test_more_than_one_simple_command_has_no_entry(cmd: str) -> None:
    assert command_words(cmd, "/w") is None


def test_a_quoted_operator_inside_a_word_is_part_of_the_word() -> None:
    assert command_words("cc '-DSEP=a;b' -c a.c", "/w") == ["cc", "-DSEP=a;b", "-c", "a.c"]


@needs_cc
def test_the_database_holds_every_compile_the_patterns_need_and_each_entry_compiles(workspace: Workspace) -> None:
    workspace.build_file("lib", """
from buildtool.cc import cc_library
cc_library(name="shapes", srcs=["square.c", "sub dir/circle.c"], includes=["include"], defines=["SIDE=3"],
           copts=["-g", "-O1"])
genrule(name="made", srcs=["square.c"], outs=["made.o"], depfile="made.d",
        cmd="cc -Iinclude -DSIDE=2 -MD -MF made.d -c square.c -o $@ && echo done")
""")
    workspace.build_file("app", """
from buildtool.cc import cc_binary
cc_binary(name="app", srcs=["main.c"], deps=["//lib:shapes"])
genrule(name="notes", srcs=["main.c"], outs=["notes.txt"], cmd="wc -l main.c > $@")
""")
    workspace.write("lib/include/square.h", "int square_area(void);\n")
    workspace.write("lib/square.c", '#include "square.h"\nint square_area(void) { return SIDE * SIDE; }\n')
    workspace.write("lib/sub dir/circle.c", "int circle_area(void) { return 12; }\n")
    workspace.write("app/main.c", "int square_area(void);\nint main(void) { return square_area() != 9; }\n")

    rc, out, err = workspace.run("graph", "--format", "compdb", "//app:app")
    assert rc == 0, err
    db = json.loads(out)
    root = workspace.root.resolve()
    by_file = {Path(e["file"]).relative_to(root).as_posix(): e for e in db}
    # The binary's own compile and its library's two; not the hand-written genrule with `&&`
    # (not needed by //app:app either), not a command without a depfile.
    assert sorted(by_file) == ["app/main.c", "lib/square.c", "lib/sub dir/circle.c"]
    square = by_file["lib/square.c"]
    assert square["directory"] == str(root / "lib")
    assert f"-fdebug-prefix-map={root / 'lib'}=." in square["arguments"]
    assert "-DSIDE=3" in square["arguments"] and "-Iinclude" in square["arguments"]
    assert square["output"] == str(root / "lib/_objs/shapes/square.o")
    for e in db:  # each runs as a build would (its directories made): the object appears
        Path(e["output"]).parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(e["arguments"], cwd=e["directory"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (e, done.stderr)
        assert Path(e["output"]).stat().st_size > 0

    # Nothing was built or recorded by it; the build then makes the same objects.
    assert not (workspace.root / "app/app").exists()
    rc, out, err = workspace.run("build", "//app:app")
    assert rc == 0, err
    assert subprocess.run([str(workspace.root / "app/app")], timeout=30).returncode == 0

    rc, out, err = workspace.run("graph", "--format", "compdb", "//lib:made")
    assert rc == 0, err
    assert json.loads(out) == []


@needs_cc
def test_a_compile_whose_header_maker_also_makes_a_c_file_has_its_own_source(workspace: Workspace) -> None:
    """hdr_deps naming a target that makes parser.c and parser.h (bison's layout): main.c's
    compile has two C sources among its inputs, and had no entry."""
    workspace.build_file("", """
from buildtool.cc import cc_binary
genrule(name="parser", outs=["parser.c", "parser.h"],
        cmd="echo 'int parse(void) { return 0; }' > parser.c && echo 'int parse(void);' > parser.h")
cc_binary(name="app", srcs=["main.c", ":parser"], hdr_deps=[":parser"])
""")
    workspace.write("main.c", '#include "parser.h"\nint main(void) { return parse(); }\n')
    rc, out, err = workspace.run("graph", "--format", "compdb", "//:app")
    assert rc == 0, err
    files = sorted(Path(e["file"]).name for e in json.loads(out))
    assert files == ["main.c"], out  # (the generated parser.c's compile is a script: left out, as documented)


def test_an_entry_is_a_one_source_compile_with_a_depfile_and_names_its_object(workspace: Workspace) -> None:
    """cc.md: one entry per compile.  A copy of a .c file (no depfile) is none, nor a
    command given two sources; the entry's output is the object, wherever it is in outs."""
    workspace.build_file("", """
genrule(name="copy", srcs=["a.c"], outs=["b.c"], cmd="cp a.c b.c")
genrule(name="both", srcs=["a.c", "c.c"], outs=["both.o", "both.d"], depfile="both.d",
        cmd="cc -MD -MF both.d -c a.c c.c -o both.o")
genrule(name="one", srcs=["a.c"], outs=["a.d", "a.o"], depfile="a.d", cmd="cc -MD -MF a.d -c a.c -o a.o")
""")
    for name in ("a.c", "c.c"):
        workspace.write(name, "int x;\n")
    rc, out, err = workspace.run("graph", "--format", "compdb")
    assert rc == 0, err
    got = json.loads(out)
    assert [(Path(e["file"]).name, Path(e["output"]).name) for e in got] == [("a.c", "a.o")], out


def test_a_workspace_without_compiles_has_an_empty_database(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="g", srcs=[], outs=["o.txt"], cmd="echo hi > $@")\n')
    rc, out, err = workspace.run("graph", "--format", "compdb")
    assert rc == 0, err
    assert json.loads(out) == []
