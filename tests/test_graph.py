"""Graph validation: every invalid buildfile is rejected before anything runs, with exit 2
and a message naming the file (and line) or the label."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Workspace, slot_file

from buildtool.graph import Graph, Target


def expect_invalid(ws: Workspace, *args: str) -> str:
    """Build, expect exit 2 with nothing run; return stderr."""
    marker = ws.root / "ran-marker"
    rc, out, err = ws.run("build", *args)
    assert rc == 2, (rc, out, err)
    assert "error" in err
    assert not marker.exists(), "a command ran although the graph is invalid"
    return err




def test_cycle_is_shown_as_a_path(workspace: Workspace) -> None:
    workspace.build_file(
        "a",
        """
        genrule(name="x", srcs=["//b:y"], outs=["x.out"], cmd="touch ../ran-marker; cat $(SRCS) > $@")
        """,
    )
    workspace.build_file(
        "b",
        """
        genrule(name="start", outs=["s.out"], cmd="touch ../ran-marker; echo > $@")
        genrule(name="y", deps=["//a:x", ":start"], outs=["y.out"], cmd="touch ../ran-marker; echo > $@")
        """,
    )
    err = expect_invalid(workspace, "//a:x")
    assert "//a:x -> //b:y -> //a:x" in err
    assert re.search(r"(a|b)/BUILD\.py:\d+", err)


def test_self_cycle(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="me", deps=[":me"], outs=["o"], cmd="echo > $@")\n')
    err = expect_invalid(workspace)
    assert "//:me -> //:me" in err


def test_longer_cycle_reached_from_a_non_member(workspace: Workspace) -> None:
    workspace.build_file(
        "",
        """
        genrule(name="top", deps=[":p"], outs=["top"], cmd="echo > $@")
        genrule(name="p", deps=[":q"], outs=["p"], cmd="echo > $@")
        genrule(name="q", deps=[":r"], outs=["q"], cmd="echo > $@")
        genrule(name="r", deps=[":p"], outs=["r"], cmd="echo > $@")
        """,
    )
    err = expect_invalid(workspace, "//:top")
    assert "//:p -> //:q -> //:r -> //:p" in err
    assert "//:top ->" not in err


def test_unknown_label_in_deps_with_did_you_mean(workspace: Workspace) -> None:
    workspace.build_file(
        "lib",
        """
        genrule(name="parser", outs=["p.out"], cmd="echo > $@")
        """,
    )
    workspace.build_file(
        "app",
        """
        genrule(name="app", deps=["//lib:parsr"], outs=["a.out"], cmd="echo > $@")
        """,
    )
    err = expect_invalid(workspace, "//app")
    assert "app/BUILD.py:1" in err
    assert "//lib:parsr" in err
    assert "did you mean //lib:parser?" in err


def test_unknown_target_on_command_line_with_did_you_mean(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="hello", outs=["o"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//:helo")
    assert "'//:helo'" in err
    assert "did you mean //:hello?" in err


@pytest.mark.parametrize(
    ("written", "hint"),
    [
        ("//lib:core", "did you mean //lib/core:core?"),  # a ':' for a '/'
        ("//lb:core", "did you mean //lib/core?"),  # a typo in the package of package and name
        ("//lib/cre:core", "did you mean //lib/core?"),
        ("//lib/core/core", "did you mean //lib/core:core?"),  # a '/' for a ':'
        ("//LIB/Core:core", "did you mean //lib/core?"),  # the case alone (difflib found nothing alike)
    ],
)
def test_a_missing_package_gets_the_closest_one(workspace: Workspace, written: str, hint: str) -> None:
    workspace.build_file("lib/core", 'genrule(name="core", outs=["c"], cmd="touch ../../ran-marker; echo > $@")\n')
    err = expect_invalid(workspace, written)
    assert f"there is no {written[2:].partition(':')[0]}/BUILD.py; {hint}" in err
    workspace.build_file("app", f'genrule(name="app", deps=["{written}"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app")
    assert f"app/BUILD.py:1: //app:app: deps refers to '{written}' but there is no package" in err and hint in err


def test_a_moved_package_is_suggested_by_its_directory_name(workspace: Workspace) -> None:
    """After `mv pkgs/p20 pkgs/group/p20`, //pkgs/p20 is closest by spelling to //pkgs/p42."""
    for pkg in ("pkgs/p42", "pkgs/group/p20"):
        workspace.build_file(pkg, 'genrule(name="x", outs=["c"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//pkgs/p20:x")
    assert "there is no pkgs/p20/BUILD.py; did you mean //pkgs/group/p20:x?" in err, err
    err = expect_invalid(workspace, "//pkgs/p20:nope")  # (a name the package there lacks: not offered)
    assert "there is no pkgs/p20/BUILD.py; did you mean the package //pkgs/group/p20?" in err, err
    err = expect_invalid(workspace, "//pkgs/p20:all")  # (a pattern, and a file of the package, are kept)
    assert "did you mean //pkgs/group/p20:all?" in err, err
    workspace.write("pkgs/group/p20/a.txt", "a\n")
    rc, _, err = workspace.run("query", "rdeps(//..., //pkgs/p20:a.txt)")
    assert rc == 2 and "did you mean //pkgs/group/p20:a.txt?" in err, err


@pytest.mark.parametrize("attr", ["srcs", "deps"])
def test_a_label_written_without_its_slashes_gets_them_suggested(workspace: Workspace, attr: str) -> None:
    workspace.build_file("lib", 'genrule(name="core", outs=["c"], cmd="touch ../ran-marker; echo > $@")\n')
    workspace.build_file("app", f'genrule(name="app", {attr}=["lib:core"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app")
    assert "app/BUILD.py:1: " in err and "did you mean '//lib:core'?" in err
    workspace.build_file("app", f'genrule(name="app", {attr}=["nowhere:x"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app")
    assert "app/BUILD.py:1: " in err and "'nowhere:x'" in err and "did you mean" not in err


def test_a_relative_package_pattern_without_slashes_is_taken_from_the_working_directory(
        workspace: Workspace) -> None:
    """`buildtool build core:all` from lib/ is //lib/core:all, as Bazel reads it (it was
    refused with a hint)."""
    workspace.build_file("lib/core", 'genrule(name="c", outs=["c"], cmd="echo $$PWD >> ../../ran-marker; echo > $@")\n')
    for written in ("core:all", "core:c"):
        rc, out, err = workspace.run("build", "-B", written, cwd=workspace.root / "lib")
        assert rc == 0 and "//lib/core:c" in out, out + err
    assert workspace.read("ran-marker").splitlines() == [str(workspace.root / "lib" / "core")] * 2


def test_a_bare_name_gets_only_the_readings_that_exist(workspace: Workspace) -> None:
    """`deps=["core"]` beside a target core means ':core', not a package found by fuzzy
    matching; typed on the command line, a bare name is the package below the working
    directory when there is one (Bazel's reading), else offered as the target it can be,
    and nothing when it is neither."""
    workspace.build_file("lib/core", 'genrule(name="core", outs=["c"], cmd="touch ../../ran-marker; echo > $@")\n')
    workspace.build_file("app", 'genrule(name="core", outs=["k"], cmd="echo > $@")\n'
                                'genrule(name="app", deps=["core"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app:app")
    assert "got 'core'; did you mean ':core'?" in err and "lib/core" not in err, err
    workspace.build_file("util", 'genrule(name="util", outs=["u"], cmd="echo > $@")\n')
    workspace.build_file("app", 'genrule(name="app", deps=["util"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app:app")  # (no target util here, a package //util: that one)
    assert "got 'util'; did you mean '//util'?" in err, err
    workspace.build_file("app", 'genrule(name="app", deps=[":util"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app:app")  # (the hint above followed the wrong way: it said nothing)
    assert "package //app has no target named 'util'; did you mean '//util'?" in err, err
    workspace.build_file("x", 'genrule(name="y", outs=["y"], cmd="echo > $@")\n')  # (no //x:x: '//x' led nowhere)
    workspace.build_file("app", 'genrule(name="app", deps=["x"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app:app")
    assert "got 'x'; did you mean a target of the package //x: '//x:y'?" in err, err
    workspace.build_file("app", 'genrule(name="app", deps=["//x"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app:app")
    assert "package //x has no target named 'x' ('//x' is short for '//x:x'; its targets: y)" in err, err
    workspace.build_file("x", "genrule(\n")  # (its BUILD.py broken: the error was x's, not app's)
    workspace.build_file("app", 'genrule(name="app", deps=[":x"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app:app")
    assert "app/BUILD.py:1" in err and "has no target named 'x'" in err and "did you mean" not in err, err
    workspace.build_file("app/x", "genrule(\n")  # (a subpackage x, broken: the ':'-for-'/' hint loaded it)
    err = expect_invalid(workspace, "//app:app")
    assert "app/BUILD.py:1" in err and "syntax error" not in err, err
    (workspace.root / "app" / "x" / "BUILD.py").unlink()
    workspace.build_file("x", "")  # (no targets: "did you mean a target of the package //x: ?")
    err = expect_invalid(workspace, "//app:app")
    assert "has no target named 'x'" in err and "did you mean" not in err, err
    workspace.build_file("app", 'genrule(name="app", deps=["lib:core"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app:app")
    assert "did you mean '//lib/core:core'?" in err, err
    rc, _, err = workspace.run("build", "lib", cwd=workspace.root / "lib")
    assert rc == 2 and "got 'lib')" in err and "did you mean" not in err, err
    rc, out, err = workspace.run("build", "core", cwd=workspace.root / "lib")  # (Bazel's reading: //lib/core:core)
    assert rc == 0 and "//lib/core:core" in out + err, out + err
    rc, out, err = workspace.run("query", "deps(core)", cwd=workspace.root / "lib")
    assert rc == 0 and out.split() == ["//lib/core:core"], out + err
    rc, _, err = workspace.run("build", "cor", cwd=workspace.root / "lib")  # (no package: the error stands)
    assert rc == 2 and "got 'cor')" in err, err
    workspace.build_file("lib/core", 'genrule(name="core", outs=["c"],'
                                     ' cmd="printf \'#!/bin/sh\\necho ran core\\n\' > $@; chmod +x $@")\n')
    rc, out, err = workspace.run("run", "core", cwd=workspace.root / "lib")  # (run takes it as build does)
    assert rc == 0 and out == "ran core\n", out + err
    # A target of that name here and none in the package below: both readings offered.
    workspace.build_file("lib", 'genrule(name="util", outs=["u"], cmd="touch $@")\n')
    workspace.build_file("lib/util", 'genrule(name="u1", outs=["u1"], cmd="touch $@")\n')
    rc, _, err = workspace.run("build", "util", cwd=workspace.root / "lib")
    assert rc == 2 and "did you mean ':util' (a target of the package here) or '//lib/util:all'" in err, err


@pytest.mark.parametrize(("typed", "hint"), [
    ("obj/main.o", "no package //obj/main.o for 'obj/main.o': there is no obj/main.o/BUILD.py; did you mean "
                   "'//:main.o' (the target that makes that file; labels name targets)?"),
    ("lib:core", "unknown target 'lib:core': package //lib has no target named 'core'; did you mean //lib/core:core?"),
    ("obj/none.o", "no package //obj/none.o for 'obj/none.o': there is no obj/none.o/BUILD.py"),
    # An output beside the BUILD.py, as `make x` names it: no hint came (no '/' in it).
    ("x.txt", "a label must start with '//' or ':' (got 'x.txt'); did you mean '//:x.txt.gen' (the target that "
              "makes it; patterns name targets, not files)?"),
])
def test_a_pattern_typed_without_slashes_gets_what_it_can_mean(
    workspace: Workspace, typed: str, hint: str | None,
) -> None:
    workspace.build_file("lib/core", 'genrule(name="core", outs=["c"], cmd="touch ../../ran-marker; echo > $@")\n')
    workspace.build_file("lib", 'genrule(name="other", outs=["x"], cmd="echo > $@")\n')
    workspace.build_file("", 'genrule(name="main.o", outs=["obj/main.o"], cmd="echo > $@")\n'
                             'genrule(name="x.txt.gen", outs=["x.txt"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, typed)
    assert hint in err and ("did you mean" in hint or "did you mean" not in err), err
    err = expect_invalid(workspace, "//lib:core")  # lib is a package, without that target
    assert "package //lib has no target named 'core'; did you mean //lib/core:core?" in err, err
    err = expect_invalid(workspace, "//lib:x")  # a file label of an output: its target
    assert "no target named 'x'; did you mean '//lib:other' (the target that makes that file" in err, err


@pytest.mark.parametrize(("typed", "hint"), [
    ("core/", "did you mean '//lib/core' (package //lib/core's target 'core')?"),
    ("../app:app", "did you mean '//app:app'?"),
    ("../app", "did you mean '//app' (package //app's target 'app')?"),
    ("{root}/lib/l.txt", "did you mean '//lib:l' (the target that makes it"),
    ("{root}/app/", "did you mean '//app' (package //app's target 'app')?"),
    # a package without a target of its own name: //net would be //net:net, unknown
    ("../net", "did you mean '//net:all' (package //net's targets)?"),
    ("../../x.txt", None),  # (it evaluated a BUILD.py above the workspace, and offered '//..:o')
])
def test_a_pattern_typed_in_a_subdirectory_gets_the_readings_that_exist(
    workspace: Workspace, typed: str, hint: str | None,
) -> None:
    """From lib/, `core:core` got a bare "must start with '//'" (the label parser's hint was
    dropped), `core/`, `../app` and absolute paths no hint at all."""
    workspace.build_file("lib", 'genrule(name="l", outs=["l.txt"], cmd="touch ../ran-marker; echo > $@")\n')
    workspace.build_file("lib/core", 'genrule(name="core", outs=["c"], cmd="echo > $@")\n')
    workspace.build_file("app", 'genrule(name="app", outs=["a"], cmd="echo > $@")\n')
    workspace.build_file("net", 'genrule(name="libnet.a", outs=["n"], cmd="echo > $@")\n')
    outside = workspace.root.parent / "BUILD.py"  # above the workspace: never evaluated
    outside.write_text('genrule(name="o", outs=["x.txt"], cmd="echo > $@")\nprint("EVALUATED")\n')
    typed = typed.format(root=workspace.root)
    rc, out, err = workspace.run("build", typed, cwd=workspace.root / "lib")
    assert rc == 2 and f"a label must start with '//' or ':' (got {typed!r})" in err, err
    assert (hint in err) if hint else ("did you mean" not in err), err
    assert "EVALUATED" not in out + err


@pytest.mark.parametrize(("typed", "hint"), [
    ("//lib:x.c", "package //lib has no target named 'x.c' (lib/x.c is a source file: labels to build name targets)"),
    ("//lib/x.c", "there is no lib/x.c/BUILD.py (lib/x.c is a source file: labels to build name targets)"),
    ("//lib/l.txt", "there is no lib/l.txt/BUILD.py; did you mean '//lib:l' (the target that makes that file"),
])
def test_a_file_typed_as_a_label_is_called_a_file(workspace: Workspace, typed: str, hint: str) -> None:
    """`//lib/x.c` was offered the unrelated //lib/core; `//lib:x.c` said nothing of the file."""
    workspace.write("lib/x.c", "int x;\n")
    workspace.build_file("lib", 'genrule(name="l", outs=["l.txt"], cmd="touch ../ran-marker; echo > $@")\n')
    workspace.build_file("lib/core", 'genrule(name="core", outs=["c"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, typed)
    assert hint in err and "lib/core" not in err, err
    workspace.build_file("app", 'genrule(name="app", deps=["//lib:x.c"], outs=["a"], cmd="echo > $@")\n')
    err = expect_invalid(workspace, "//app")  # in deps, the way out is srcs
    assert "no target named 'x.c' (lib/x.c is a source file: a file goes in srcs)" in err, err


def test_dot_patterns_from_a_subdirectory(workspace: Workspace) -> None:
    """`./...` and `../...` from lib/ were "bad pattern" (lib/. is no package name)."""
    workspace.build_file("lib", 'genrule(name="l", outs=["l.txt"], cmd="echo > $@")\n')
    workspace.build_file("app", 'genrule(name="app", outs=["a"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("build", "./...", cwd=workspace.root / "lib")
    assert rc == 0 and workspace.exists("lib/l.txt") and not workspace.exists("app/a"), out + err
    rc, out, err = workspace.run("build", "../...", cwd=workspace.root / "lib")
    assert rc == 0 and workspace.exists("app/a"), out + err
    rc, _, err = workspace.run("build", "../../...", cwd=workspace.root / "lib")
    assert rc == 2 and "bad pattern '../../...': it leads out of the workspace" in err, err


def test_dep_on_missing_package(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="t", deps=["//nope:x"], outs=["o"], cmd="echo > $@")\n')
    err = expect_invalid(workspace)
    assert "BUILD.py:1" in err and "//nope" in err


def test_missing_source_file(workspace: Workspace) -> None:
    workspace.build_file(
        "pkg",
        """
        genrule(name="fine", outs=["f"], cmd="touch ../ran-marker; echo > $@")
        genrule(name="t", srcs=["missing.txt"], outs=["o"], cmd="cat $< > $@")
        """,
    )
    err = expect_invalid(workspace, "//pkg:all")
    assert "pkg/BUILD.py:2" in err
    assert "pkg/missing.txt" in err
    assert "//pkg:t" in err


def test_source_that_is_a_directory(workspace: Workspace) -> None:
    (workspace.root / "adir").mkdir()
    workspace.build_file("", 'genrule(name="t", srcs=["adir"], outs=["o"], cmd="echo > $@")\n')
    err = expect_invalid(workspace)
    assert "adir" in err and "directory" in err


@pytest.mark.parametrize(("make", "what"), [
    (lambda p: p.mkdir(), "a directory"), (lambda p: os.mkfifo(p), "a named pipe"),
    (lambda p: p.symlink_to("nowhere"), "a symlink to nothing")])
def test_a_label_to_another_package_s_path_that_is_no_file_says_what_it_is(
        workspace: Workspace, make: Any, what: str) -> None:
    """A chaos run replaced src/s21.txt, used as //src:s21.txt, by a directory: the error
    spoke only of an unknown target."""
    workspace.build_file("src", 'genrule(name="s", outs=["s.out"], cmd="echo > $@")\n')
    make(workspace.root / "src" / "x.txt")
    workspace.build_file("", 'genrule(name="t", srcs=["//src:x.txt"], outs=["o"], cmd="cat $< > $@")\n')
    err = expect_invalid(workspace)
    assert f"package //src has no target named 'x.txt' (src/x.txt is {what}, not a file: a source must be one)" \
        in err, err


def test_duplicate_outputs_across_targets(workspace: Workspace) -> None:
    workspace.build_file(
        "",
        """
        genrule(name="one", outs=["same.out"], cmd="echo 1 > $@")
        genrule(name="two", outs=["same.out"], cmd="echo 2 > $@")
        """,
    )
    err = expect_invalid(workspace)
    assert "same.out" in err
    assert "//:one" in err and "//:two" in err
    assert "BUILD.py:" in err


@pytest.mark.parametrize(("outs", "said"), [
    ('["y", "z", "y"]', "outs lists the same file twice: 'y'"),
    ('["sub/y", "./sub/y"]', "outs lists the same file twice: 'sub/y' and './sub/y' (both 'sub/y')"),
])
def test_an_output_listed_twice_is_named(workspace: Workspace, outs: str, said: str) -> None:
    """The error named the line but not the file."""
    workspace.build_file("", f'genrule(name="a", outs={outs}, cmd="touch $(OUTS)")\n')
    err = expect_invalid(workspace)
    assert f"BUILD.py:1: //:a: {said}" in err, err  # (the target: a macro's loop declares many on one line)


def test_duplicate_outputs_even_when_only_one_is_requested(workspace: Workspace) -> None:
    workspace.build_file(
        "",
        """
        genrule(name="one", outs=["same.out"], cmd="echo 1 > $@")
        genrule(name="two", outs=["same.out"], cmd="echo 2 > $@")
        """,
    )
    err = expect_invalid(workspace, "//:one")
    assert "same.out" in err


@pytest.mark.parametrize("requested", ["//:a", "//:b", "//..."])
def test_an_output_inside_another_output_even_when_only_one_is_requested(workspace: Workspace, requested: str) -> None:
    """``x`` of one target and ``x/y`` of another: building either alone left the other one
    failing later (a file where its directory must be, or the other way round)."""
    workspace.build_file(
        "",
        """
        genrule(name="a", outs=["x"], cmd="echo a > $@")
        genrule(name="b", outs=["x/y"], cmd="echo b > $@")
        """,
    )
    err = expect_invalid(workspace, requested)
    assert "BUILD.py:2: output 'x/y' of //:b is inside 'x', an output of //:a" in err, err


def test_output_equal_to_a_source_of_the_same_target(workspace: Workspace) -> None:
    workspace.write("a.txt", "a\n")
    workspace.build_file("", 'genrule(name="t", srcs=["a.txt"], outs=["a.txt"], cmd="cat $< > $@")\n')
    err = expect_invalid(workspace)
    assert "BUILD.py:1: 'a.txt' is both an output and a source of //:t: a target cannot read what it writes" in err


def test_output_used_as_a_plain_source_file_by_another_target(workspace: Workspace) -> None:
    workspace.write("gen.out", "stale\n")
    workspace.build_file(
        "",
        """
        genrule(name="gen", outs=["gen.out"], cmd="echo > $@")
        genrule(name="use", srcs=["gen.out"], outs=["use.out"], cmd="cat $< > $@")
        """,
    )
    err = expect_invalid(workspace, "//:gen", "//:use")
    assert "gen.out" in err and "//:gen" in err and "//:use" in err


@pytest.mark.parametrize(
    ("attr", "value", "needle"),
    [
        ("srcs", "../escape.txt", ".."),
        ("srcs", "/etc/passwd", "absolute"),
        ("outs", "../escape.out", ".."),
        ("outs", "/tmp/escape.out", "absolute"),
        ("outs", "a/../../escape.out", ".."),
    ],
)
def test_paths_escaping_the_package(workspace: Workspace, attr: str, value: str, needle: str) -> None:
    workspace.write("escape.txt", "x\n")
    other = "outs=['o']" if attr == "srcs" else "srcs=[]"
    workspace.build_file("pkg", f'genrule(name="t", {attr}=[{value!r}], {other}, cmd="echo > $(OUTS)")\n')
    err = expect_invalid(workspace, "//pkg:t")
    assert "pkg/BUILD.py:1" in err
    assert value in err
    assert needle in err
    assert not (workspace.root / "escape.out").exists()


def test_output_inside_the_state_dir(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="t", outs=[".buildtool/record"], cmd="echo > $@")\n')
    err = expect_invalid(workspace)
    assert "BUILD.py:1" in err and ".buildtool/record" in err and "state" in err


def test_unknown_attribute_names_the_allowed_ones(workspace: Workspace) -> None:
    workspace.build_file(
        "pkg",
        """
        genrule(name="ok", outs=["ok"], cmd="echo > $@")

        genrule(name="t", outs=["o"], cmd="echo > $@", sources=["x"])
        """,
    )
    err = expect_invalid(workspace, "//pkg:ok")
    assert "pkg/BUILD.py:3" in err
    assert "'sources'" in err
    for allowed in ("srcs", "outs", "deps", "priority", "manual", "pool", "env", "cmd"):
        assert allowed in err


def test_missing_required_attribute(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="t", outs=["o"])\n')
    err = expect_invalid(workspace)
    assert "BUILD.py:1" in err and "'cmd'" in err


@pytest.mark.parametrize(
    ("attr", "value"),
    [("priority", '"high"'), ("manual", '"yes"'), ("pool", "3"), ("srcs", '"a.txt"'), ("env", '{"X": 1}')],
)
def test_bad_attribute_types(workspace: Workspace, attr: str, value: str) -> None:
    workspace.write("a.txt", "")
    workspace.build_file("", f'genrule(name="t", outs=["o"], cmd="echo > $@", {attr}={value})\n')
    err = expect_invalid(workspace, "//:t")
    assert "BUILD.py:1" in err and attr in err


@pytest.mark.parametrize("value", ["0", "-1", 'float("nan")', "True", '"10"'])
def test_a_timeout_must_be_a_positive_number(workspace: Workspace, value: str) -> None:
    workspace.build_file("", f'test(name="t", cmd="true", timeout={value})\n')
    err = expect_invalid(workspace, "//:t")
    assert "BUILD.py:1" in err and "attribute 'timeout' must be a positive number of seconds" in err


@pytest.mark.parametrize("value", ["10**12", 'float("inf")', "10**400"])
def test_a_timeout_above_the_largest_never_fires(workspace: Workspace, value: str) -> None:
    """The user guide: any positive number; one above 10^8 s (about 3 years) counts as 10^8."""
    workspace.build_file("", f'test(name="t", cmd="true", timeout={value})\n')
    rc, out, err = workspace.run("test", "//:t")
    assert rc == 0 and "PASSED" in out, (rc, out, err)


def test_syntax_error_shows_file_and_line(workspace: Workspace) -> None:
    workspace.build_file(
        "pkg",
        """
        genrule(name="ok", outs=["ok"], cmd="echo > $@")
        genrule(name="t", outs=["o"] cmd="echo > $@")
        """,
    )
    err = expect_invalid(workspace, "//pkg:ok")
    assert "pkg/BUILD.py:2" in err
    assert "syntax" in err.lower()


def test_exception_in_buildfile_shows_file_and_line(workspace: Workspace) -> None:
    workspace.build_file(
        "pkg",
        """
        genrule(name="ok", outs=["ok"], cmd="echo > $@")
        x = {}["nope"]
        """,
    )
    err = expect_invalid(workspace, "//pkg:ok")
    assert "pkg/BUILD.py:2" in err
    assert "KeyError" in err


def test_error_in_a_macro_points_at_the_macro(workspace: Workspace) -> None:
    workspace.write("tools/__init__.py", "")
    workspace.write(
        "tools/defs.py",
        "from buildtool.dsl import genrule\n\n\ndef bad(name):\n    genrule(name=name, outs=['o'], cmd='x', bogus=1)\n",
    )
    workspace.build_file("", "from tools.defs import bad\nbad('t')\n")
    err = expect_invalid(workspace)
    assert "'bogus'" in err
    assert "BUILD.py:2" in err or "tools/defs.py:5" in err


def test_target_defined_twice(workspace: Workspace) -> None:
    workspace.build_file(
        "",
        """
        genrule(name="t", outs=["a"], cmd="echo > $@")
        genrule(name="t", outs=["b"], cmd="echo > $@")
        """,
    )
    err = expect_invalid(workspace)
    assert "BUILD.py:2" in err and "BUILD.py:1" in err


def test_valid_graph_builds(workspace: Workspace) -> None:
    """Control for the tests above: the same shapes, valid, do build (exit 0)."""
    workspace.write("a.txt", "a\n")
    workspace.build_file(
        "",
        """
        genrule(name="gen", srcs=["a.txt"], outs=["gen.out"], cmd="cat $< > $@")
        genrule(name="use", srcs=[":gen"], outs=["use.out"], cmd="cat $< > $@")
        """,
    )
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("use.out") == "a\n"


def test_a_long_cycle_is_shown_by_its_ends(workspace: Workspace) -> None:
    workspace.build_file("", "\n".join(
        f'genrule(name="t{i}", deps=[":t{(i + 1) % 300}"], outs=["o{i}"], cmd="echo > $@")' for i in range(300)))
    err = expect_invalid(workspace, "//:t0")
    assert "dependency cycle: //:t0 -> //:t1 -> " in err and "... 281 more ..." in err, err
    assert err.rstrip().endswith("//:t298 -> //:t299 -> //:t0"), err
    assert len(err) < 1000, len(err)


def test_a_file_label_may_name_a_file_below_its_package(workspace: Workspace) -> None:
    """As in Bazel: //lib:include/calc.h is lib/include/calc.h (a target's name has no '/',
    a file's may); an edit to it reruns the user."""
    workspace.write("lib/include/calc.h", "one\n")
    workspace.build_file("lib", 'genrule(name="l", outs=["l.txt", "gen/x.h"], cmd="touch l.txt gen/x.h")\n')
    workspace.build_file("app", 'genrule(name="a", srcs=["//lib:include/calc.h"], outs=["a.txt"], cmd="cat $< > $@")\n')
    rc, out, err = workspace.run("build", "//app:a")
    assert rc == 0 and workspace.read("app/a.txt") == "one\n", out + err
    workspace.write("lib/include/calc.h", "two\n")
    rc, out, err = workspace.run("build", "//app:a")
    assert rc == 0 and workspace.read("app/a.txt") == "two\n", out + err
    rc, out, err = workspace.run("query", "deps(//app:a)")
    assert rc == 0 and out.split() == ["//app:a"], out + err


@pytest.mark.parametrize(("src", "needle"), [
    ("//lib:sub/y.h", "srcs entry '//lib:sub/y.h' is in package //lib/sub, not //lib: refer to it as '//lib/sub:y.h'"),
    ("//lib:include/nope.h", "srcs refers to '//lib:include/nope.h', but there is no file lib/include/nope.h"),
    ("//lib:gen/x.h", "srcs refers to '//lib:gen/x.h', an output of //lib:l: refer to '//lib:l' instead"),
    ("//lib:l.txt", "srcs refers to '//lib:l.txt', an output of //lib:l: refer to '//lib:l' instead"),
    ("//lib:include/../x.h", "srcs: bad label '//lib:include/../x.h'"),
    ("//:.buildtool/record", "srcs path '.buildtool/record' is inside buildtool's state directory"),
])
def test_bad_file_labels_say_what_they_name(workspace: Workspace, src: str, needle: str) -> None:
    """An output named by a file label is refused also once it exists on disk, and also when
    its target is outside the build (a stale copy was taken as a source)."""
    workspace.build_file("", "")
    workspace.write("lib/include/calc.h", "")
    workspace.write("lib/sub/y.h", "")
    workspace.build_file("lib/sub", 'genrule(name="s", outs=["s.txt"], cmd="touch $@")\n')
    workspace.build_file("lib", 'genrule(name="l", outs=["l.txt", "gen/x.h"], cmd="touch l.txt gen/x.h")\n')
    workspace.build_file("app", f'genrule(name="a", srcs=["{src}"], outs=["a.txt"], cmd="touch $@")\n')
    assert workspace.run("build", "//lib:l")[0] == 0  # (.buildtool/record exists)
    err = expect_invalid(workspace, "//app:a")
    assert f"app/BUILD.py:1: //app:a: {needle}" in err, err


@pytest.mark.parametrize("attrs", ['srcs=["r.pdf.buildtool-tmp"], outs=["u.txt"]',
                                   'srcs=["//:r.pdf.buildtool-tmp"], outs=["u.txt"]',
                                   'outs=["r", "r.buildtool-tmp"]'])
def test_a_name_ending_in_buildtools_temp_suffix_is_refused(workspace: Workspace, attrs: str) -> None:
    """A build deletes <output>.buildtool-tmp before the output's command runs (a restore a
    kill cut short leaves it): a source of that name beside an output was silently deleted."""
    workspace.write("r.pdf.buildtool-tmp", "precious\n")
    workspace.build_file("", f'genrule(name="u", {attrs}, cmd="touch $(OUTS)")\n'
                             'genrule(name="g", outs=["r.pdf"], cmd="touch $@")\n')
    err = expect_invalid(workspace)
    assert "BUILD.py:1: //:u: " in err and "ends in .buildtool-tmp, the suffix of buildtool's own temp" in err, err
    assert workspace.read("r.pdf.buildtool-tmp") == "precious\n"


def test_an_output_named_as_a_source_is_refused_while_its_producer_is_outside_the_build(
    workspace: Workspace,
) -> None:
    """r1's srcs name g's output by path (or by a file label, with outs written './gen/x');
    built alone with a copy of g's output on disk, that stale copy was taken as a source and
    r1 stayed up to date when g's command changed.  Nor may g be built while r1 takes its
    output for a source: g would write over what r1 calls hand-written."""
    workspace.build_file("p2", 'genrule(name="g", outs=["./gen/o.txt"], cmd="echo G1 > gen/o.txt")\n'
                               'genrule(name="r1", srcs=["gen/o.txt"], outs=["r1.txt"], cmd="cat $< > $@")\n'
                               'genrule(name="r2", srcs=[":gen/o.txt"], outs=["r2.txt"], cmd="cat $< > $@")\n'
                               'genrule(name="me", srcs=[":m/x"], outs=["m/x"], cmd="touch $@")\n')
    workspace.write("p2/gen/o.txt", "G0\n")
    err = expect_invalid(workspace, "//p2:g")
    assert ("p2/BUILD.py:2: srcs entry 'gen/o.txt' of //p2:r1 is an output of //p2:g (declared at p2/BUILD.py:1): "
            "building //p2:g would overwrite that source") in err, err
    assert workspace.read("p2/gen/o.txt") == "G0\n"
    err = expect_invalid(workspace, "//p2:r1")
    assert ("p2/BUILD.py:2: srcs entry 'gen/o.txt' of //p2:r1 is an output of //p2:g (declared at p2/BUILD.py:1): "
            "refer to '//p2:g' instead, or rename that output if this is a source file") in err, err
    err = expect_invalid(workspace, "//p2:r2")
    assert "p2/BUILD.py:3: //p2:r2: srcs refers to ':gen/o.txt', an output of //p2:g: refer to '//p2:g' instead" \
        in err, err
    err = expect_invalid(workspace, "//p2:me")
    assert "'p2/m/x' is both an output and a source of //p2:me: a target cannot read what it writes" in err, err


def test_building_a_writer_alone_never_overwrites_a_source_another_target_reads(workspace: Workspace) -> None:
    """b declares the hand-written in.txt, which a reads, as its output: building b alone
    overwrote it (the check ran only when a was in the build).  Refused before anything runs;
    the package's other targets still build."""
    workspace.write("in.txt", "precious\n")
    workspace.build_file("", 'genrule(name="a", srcs=["in.txt"], outs=["a.txt"], cmd="cp $< $@")\n'
                             'genrule(name="b", outs=["in.txt"], cmd="echo clobbered > $@ && touch ran-marker")\n'
                             'genrule(name="c", outs=["c.txt"], cmd="echo c > $@")\n')
    err = expect_invalid(workspace, "//:b")
    assert ("BUILD.py:1: srcs entry 'in.txt' of //:a is an output of //:b (declared at BUILD.py:2): building //:b "
            "would overwrite") in err, err
    assert workspace.read("in.txt") == "precious\n"
    assert workspace.run("build", "//:c")[0] == 0
    for spelling in (":in.txt", "//:in.txt", "./in.txt"):  # a file label was let through
        workspace.build_file("", f'genrule(name="a", srcs=["{spelling}"], outs=["a.txt"], cmd="cp $< $@")\n'
                                 'genrule(name="b", outs=["in.txt"], cmd="echo clobbered > $@ && touch ran-marker")\n')
        err = expect_invalid(workspace, "//:b")
        assert (f"srcs entry '{spelling}' of //:a is an output of //:b (declared at BUILD.py:2): building //:b "
                "would overwrite") in err, err
        assert workspace.read("in.txt") == "precious\n"
    # An unrelated glob() that also finds in.txt took it for an output copy and let it through.
    workspace.build_file("", 'genrule(name="a", srcs=["in.txt"], outs=["a.out"], cmd="cp $< $@")\n'
                             'genrule(name="b", outs=["in.txt"], cmd="echo clobbered > $@ && touch ran-marker")\n'
                             'genrule(name="c", srcs=glob(["*.txt"]), outs=["c.out"], cmd="cat $(SRCS) > $@")\n')
    err = expect_invalid(workspace, "//:b")
    assert "building //:b would overwrite that source; refer to '//:b' instead" in err, err
    assert workspace.read("in.txt") == "precious\n"


def test_an_output_in_srcs_that_a_glob_took_in_place_is_left_out_with_a_warning(workspace: Workspace) -> None:
    """gen.txt, left over on disk, is returned by the package's glob(): an output found in
    place is no source.  An entry written by hand (or a glob result made anew, str(p): the
    two cannot be told apart) was dropped silently, so c never read the real output; it is
    still left out (refusing it broke packages that copy glob results), but said."""
    workspace.write("in.txt", "hello\n")
    workspace.write("gen.txt", "stale from make\n")
    workspace.build_file("", """
        genrule(name="docs", srcs=glob(["*.txt"]), outs=["docs.out"], cmd="cat $(SRCS) > $@")
        genrule(name="a", srcs=["in.txt"], outs=["gen.txt"], cmd="tr a-z A-Z < $< > $@")
        genrule(name="c", srcs=["gen.txt", "in.txt"], outs=["c.out"], cmd="cat $(SRCS) > $@")
        genrule(name="d", srcs=[str(p) for p in glob(["*.txt"])], outs=["d.out"], cmd="cat $(SRCS) > $@")
        """)
    rc, out, err = workspace.run("build", "//:docs", "//:c", "//:d")
    assert rc == 0, out + err
    assert ("warning: BUILD.py:3: //:c's srcs entry 'gen.txt' is an output of //:a (a glob() of this package "
            "found a copy of it on disk)") in err, err
    assert "BUILD.py:1" not in err, err  # the glob's own result: no word
    assert workspace.read("docs.out") == workspace.read("c.out") == workspace.read("d.out") == "hello\n"


def test_a_file_label_works_in_location_and_is_refused_in_deps(workspace: Workspace) -> None:
    workspace.write("lib/include/calc.h", "x\n")
    workspace.build_file("lib", 'genrule(name="l", outs=["l.txt"], cmd="touch $@")\n')
    workspace.build_file("app", 'genrule(name="a", srcs=["//lib:include/calc.h"], outs=["a.txt"],\n'
                                '        cmd="cat $(location //lib:include/calc.h) > $@")\n')
    rc, out, err = workspace.run("build", "//app:a")
    assert rc == 0 and workspace.read("app/a.txt") == "x\n", out + err
    workspace.build_file("app", 'genrule(name="a", deps=["//lib:include/calc.h"], outs=["a.txt"], cmd="touch $@")\n')
    err = expect_invalid(workspace, "//app:a")
    assert "deps entry '//lib:include/calc.h' names a file; deps name targets (a file goes in srcs)" in err, err


def test_patterns_name_targets_and_get_the_one_meant(workspace: Workspace) -> None:
    """A file label as a pattern gets the target that makes the file; a name in the wrong
    case gets the target spelled right."""
    workspace.build_file("", 'genrule(name="x", outs=["obj/x.out"], cmd="touch $@")\n')
    err = expect_invalid(workspace, "//:obj/x.out")
    assert "did you mean '//:x' (the target that makes it; patterns name targets, not files)?" in err, err
    err = expect_invalid(workspace, ":X")
    assert "package // has no target named 'X'; did you mean //:x?" in err, err


def test_a_source_that_links_to_another_targets_output_is_refused(workspace: Workspace) -> None:
    """alias.txt -> g.out: no edge from //p:g to //p:u, so u could read g.out before g made
    it (or while g rewrote it), and an edit of g's input left u stale with "OK"."""
    workspace.write("p/a.txt", "a\n")
    os.symlink("g.out", workspace.root / "p" / "alias.txt")
    workspace.build_file("p", 'genrule(name="g", srcs=["a.txt"], outs=["g.out"], cmd="touch ../ran-marker; cp $< $@")\n'
                              'genrule(name="u", srcs=["alias.txt"], outs=["u.out"], cmd="cp $< $@")\n')
    (workspace.root / "p" / "g.out").write_text("old\n")
    err = expect_invalid(workspace)
    assert "p/BUILD.py:2: source 'p/alias.txt' of //p:u is a symbolic link to 'p/g.out', an output of //p:g: " \
           "refer to '//p:g' instead" in err, err
    # Built alone too (//p:g not in the build): it was "up to date" with the old g.out.
    workspace.write("q/BUILD.py", 'genrule(name="v", srcs=["link.txt"], outs=["v.out"], cmd="cp $< $@")\n')
    os.symlink("../p/g.out", workspace.root / "q" / "link.txt")
    for alone in ("//p:u", "//q:v"):
        err = expect_invalid(workspace, alone)
        assert "is a symbolic link to 'p/g.out', an output of //p:g: refer to '//p:g' instead" in err, (alone, err)


def test_a_link_to_an_output_is_said_so_before_it_is_built_and_left_out_by_glob(workspace: Workspace) -> None:
    """latest.txt -> out/gen.txt: listed in srcs before gen.txt was made, it was "a symlink
    to nothing"; taken by glob(["*.txt"]), the first build passed (a dangling link is no
    file) and the second, with nothing changed, was exit 2.  glob() leaves it out, as it
    leaves out outputs; named by hand, it is refused the same way made or not."""
    workspace.write("s.txt", "s\n")
    os.symlink("out/gen.txt", workspace.root / "latest.txt")
    workspace.build_file("", 'genrule(name="gen", srcs=["s.txt"], outs=["out/gen.txt"], cmd="cat $< > $@")\n'
                             'genrule(name="all", srcs=glob(["*.txt"]), outs=["all.out"], cmd="cat $(SRCS) > $@")\n')
    for _ in range(2):
        r = workspace.build()
        assert r.rc == 0 and workspace.read("all.out") == "s\n", r.output
    # A rule per globbed file: the link (once its output is recorded) is not in glob()'s list
    # at all ("$< needs exactly one input" on the second build, when only srcs dropped it).
    workspace.build_file("", 'genrule(name="gen", srcs=["s.txt"], outs=["out/gen.txt"], cmd="cat $< > $@")\n'
                             'for f in glob(["*.txt"]):\n'
                             '    genrule(name="c_" + f[:-4], srcs=[f], outs=["copies/" + f], cmd="cp $< $@")\n')
    for _ in range(2):
        r = workspace.build()
        assert r.rc == 0 and not workspace.path("copies/latest.txt").exists(), r.output
    workspace.build_file("q", 'genrule(name="u", srcs=["alias.txt"], outs=["u.out"], cmd="cp $< $@")\n')
    os.symlink("../out/never.txt", workspace.root / "q" / "alias.txt")
    workspace.build_file("", 'genrule(name="gen", srcs=["s.txt"], outs=["out/gen.txt", "out/never.txt"], '
                             'cmd="cat $< > out/gen.txt; cp $< out/never.txt")\n')
    err = expect_invalid(workspace, "//q:u")
    assert "q/BUILD.py:1: source 'q/alias.txt' of //q:u is a symbolic link to 'out/never.txt', an output of " \
           "//:gen: refer to '//:gen' instead" in err, err


def test_an_output_through_a_symlinked_dir_onto_a_source_of_its_package_is_refused_built_alone(
    workspace: Workspace,
) -> None:
    """gen -> src: `build //p:t` alone wrote gen/b.txt over the source src/b.txt of //p:u
    (the checked-in file lost), where `build //...` said exit 2."""
    workspace.write("p/src/b.txt", "precious source\n")
    os.symlink("src", workspace.root / "p" / "gen")
    workspace.build_file("p", 'genrule(name="t", outs=["gen/b.txt"], cmd="touch ../ran-marker; echo G > $@")\n'
                              'genrule(name="u", srcs=["src/b.txt"], outs=["u.out"], cmd="cat $< > $@")\n')
    for pattern in ("//p:t", "//..."):
        err = expect_invalid(workspace, pattern)
        assert "output 'p/gen/b.txt' of //p:t is the source 'p/src/b.txt' of //p:u (through a symlinked directory)" \
            in err, (pattern, err)
        assert workspace.read("p/src/b.txt") == "precious source\n"
    workspace.build_file("p", 'genrule(name="t", outs=["gen/b.txt"], cmd="touch ../ran-marker; echo G > $@")\n'
                              'genrule(name="u", srcs=["//p:src/b.txt"], outs=["u.out"], cmd="cat $< > $@")\n')
    err = expect_invalid(workspace, "//p:t")  # (named by its file label: overwritten all the same)
    assert "of //p:t is the source 'p/src/b.txt' of //p:u" in err, err
    # Matched by a glob(): a source all the same (through the link it is no output's path).
    workspace.build_file("p", 'genrule(name="t", outs=["gen/b.txt"], cmd="touch ../ran-marker; echo G > $@")\n'
                              'genrule(name="u", srcs=glob(["src/*.txt"]), outs=["u.out"], cmd="cat $(SRCS) > $@")\n')
    err = expect_invalid(workspace, "//p:t")
    assert "of //p:t is the source 'p/src/b.txt' of //p:u" in err, err
    assert workspace.read("p/src/b.txt") == "precious source\n"


def test_a_source_link_that_cannot_be_followed_says_why(workspace: Workspace) -> None:
    os.symlink("loop.txt", workspace.root / "loop.txt")
    workspace.build_file("", 'genrule(name="u", srcs=["loop.txt"], outs=["u.out"], cmd="cp $< $@")\n')
    err = expect_invalid(workspace)
    assert "source 'loop.txt' is a symlink that cannot be followed (Too many levels of symbolic links)" in err, err


def test_an_output_under_a_dangling_link_says_so(workspace: Workspace) -> None:
    os.symlink("/nonexistent-dir-of-buildtool-tests", workspace.root / "gen")
    workspace.build_file("", 'genrule(name="g", outs=["gen/x.txt"], cmd="touch ran-marker; echo > $@")\n')
    err = expect_invalid(workspace)
    assert "needs the directory 'gen', which is a symbolic link to '/nonexistent-dir-of-buildtool-tests', " \
           "which does not exist" in err, err


def test_a_package_named_through_a_symlinked_directory_says_so(workspace: Workspace) -> None:
    workspace.build_file("real", 'genrule(name="l", outs=["l.out"], cmd="touch ../ran-marker; echo > $@")\n')
    os.symlink("real", workspace.root / "lnpkg")
    err = expect_invalid(workspace, "//lnpkg:l")
    assert "no package //lnpkg for '//lnpkg:l': lnpkg/BUILD.py is reached through a symbolic link" in err, err


@pytest.mark.parametrize("kwargs", ['{"srcs": 1}', '{"outs": []}', '{1: 2}', '{"d": {1: "a"}}',
                                    '{"l": [{"x": {None: 1}}]}'])
def test_pyrule_kwargs_that_cannot_be_keyword_arguments_are_exit_2(workspace: Workspace, kwargs: str) -> None:
    """{"srcs": ...} failed at run time ("multiple values for keyword argument"); {1: 2}
    reached the function as the keyword "1"."""
    workspace.write("mk.py", "def run(srcs, outs, **kw):\n    open(outs[0], 'w').write('x')\n")
    workspace.build_file("", f'pyrule(name="p", fn="mk:run", outs=["o.txt"], kwargs={kwargs})\n'
                             'genrule(name="m", outs=["m"], cmd="touch ran-marker; echo > $@")\n')
    err = expect_invalid(workspace)
    if kwargs.count("{") == 1:
        assert "BUILD.py:1: //:p: kwargs key" in err and "cannot be a keyword argument of fn" in err, err
    else:  # (nested: reached fn as a string key, {"d": {"1": "a"}})
        assert "BUILD.py:1: //:p: kwargs holds a dict key" in err and "JSON has string keys only" in err, err


@pytest.mark.parametrize("given", ['env={"PYTHONPATH": "/x"}', 'pass_env=["PYTHONPATH"]',
                                   'env={"PYTHONDONTWRITEBYTECODE": ""}', 'env={"BUILDTOOL_PYRULE_MODULES": "/x"}'])
def test_a_pyrule_cannot_be_given_the_python_variables_the_runner_sets(workspace: Workspace, given: str) -> None:
    """env={"PYTHONPATH": ...} was replaced without a word (and changed the key, not the run)."""
    workspace.write("mk.py", "def run(srcs, outs):\n    open(outs[0], 'w').write('x')\n")
    workspace.build_file("", f'pyrule(name="p", fn="mk:run", outs=["o.txt"], {given})\n'
                             'genrule(name="m", outs=["m"], cmd="touch ran-marker; echo > $@")\n')
    err = expect_invalid(workspace)
    assert "BUILD.py:1:" in err and "is set by buildtool" in err and "so env and pass_env cannot give it" in err, err


@pytest.mark.parametrize("given", ['env={"BUILDTOOL_LANE": "/x"}', 'pass_env=["BUILDTOOL_LANE"]'])
def test_no_target_can_be_given_the_lane_variable_every_command_gets(workspace: Workspace, given: str) -> None:
    workspace.build_file("", f'genrule(name="g", outs=["o.txt"], cmd="echo > $@", {given})\n'
                             'genrule(name="m", outs=["m"], cmd="touch ran-marker; echo > $@")\n')
    err = expect_invalid(workspace)
    name = given.split('"')[1]
    assert "BUILD.py:1:" in err and f"{name} is set by buildtool" in err, err


@pytest.mark.parametrize("how", ["flag", "config", "env"])
@pytest.mark.parametrize("name", ["BUILDTOOL_LANE"])
def test_action_env_cannot_give_a_variable_buildtool_sets(workspace: Workspace, how: str, name: str) -> None:
    """--action-env BUILDTOOL_LANE=x went into every key (each value a rerun of everything
    and other cache entries) while every command got the lane directory all the same."""
    workspace.build_file("", 'genrule(name="m", outs=["m"], cmd="touch ran-marker; echo > $@")\n')
    args, env = ["build"], None
    if how == "flag":
        args += ["--action-env", f"{name}=x"]
    elif how == "config":
        workspace.write("buildtool.toml", f'action_env = ["{name}=x"]\n')
    else:
        env = {"BUILDTOOL_ACTION_ENV": name}
    rc, _, err = workspace.run(*args, env_extra=env)
    assert rc == 2 and f"{name} is set by buildtool" in err and not workspace.exists("ran-marker"), err


def test_a_build_pattern_that_matches_only_tests_says_so(workspace: Workspace) -> None:
    workspace.build_file("", 'test(name="t", cmd="touch ran-marker")\n')
    err = expect_invalid(workspace)
    assert "pattern '//...' matches no targets to build (1 test target(s) only: `buildtool test //...` runs them)" \
        in err, err


def test_a_pattern_that_matches_only_manual_targets_says_so(workspace: Workspace) -> None:
    """It said "matches no targets" of a package whose every target is manual."""
    workspace.build_file("p", 'genrule(name="m", outs=["m"], cmd="touch ../ran-marker; echo > $@", manual=True)\n'
                              'genrule(name="a", outs=["a"], cmd="touch ../ran-marker; echo > $@", always=True)\n')
    err = expect_invalid(workspace, "//p:all")
    assert "pattern '//p:all' matches no targets (2 manual or always=True target(s) left out: a wildcard skips " \
        "them, a label names one)" in err, err


def test_pyrule_kwargs_keys_any_string_reach_fn_through_kw(workspace: Workspace) -> None:
    """A key that is no identifier ("content-type") is fine for fn(**kw); only srcs/outs
    and non-strings are refused."""
    workspace.write("mk.py", "def run(srcs, outs, **kw):\n    open(outs[0], 'w').write(repr(sorted(kw)))\n")
    workspace.build_file("", 'pyrule(name="p", fn="mk:run", outs=["o.txt"], kwargs={"content-type": "x"})\n')
    rc, out, err = workspace.run("build")
    assert rc == 0 and workspace.read("o.txt") == "['content-type']", out + err


def test_pyrule_kwargs_reach_fn_in_the_order_written_and_a_reorder_reruns_it(workspace: Workspace) -> None:
    """Dicts reached fn with their keys sorted (the key and the payload were
    json.dumps(sort_keys=True)): a code generator's dataclass fields came out as email, id,
    name, and reordering the dict reran nothing."""
    workspace.write("mk.py", "def run(srcs, outs, fields):\n    open(outs[0], 'w').write(','.join(fields))\n")
    workspace.build_file("", 'pyrule(name="p", fn="mk:run", outs=["o.txt"], '
                             'kwargs={"fields": {"id": 1, "name": 2, "email": 3}})\n')
    assert workspace.build().rc == 0 and workspace.read("o.txt") == "id,name,email"
    workspace.build_file("", 'pyrule(name="p", fn="mk:run", outs=["o.txt"], '
                             'kwargs={"fields": {"name": 2, "id": 1, "email": 3}})\n')
    r = workspace.build()
    assert r.rc == 0 and r.status("//:p") == "ran" and workspace.read("o.txt") == "name,id,email", r.output


def test_pyrule_kwargs_that_json_cannot_hold_are_named_by_their_path(workspace: Workspace) -> None:
    """A TOML date three levels down: "must be JSON-serialisable" named no value to look at."""
    workspace.write("mk.py", "def run(srcs, outs, **kw):\n    pass\n")
    workspace.build_file("", 'import datetime\n'
                             'pyrule(name="p", fn="mk:run", outs=["o.txt"], '
                             'kwargs={"models": [{"name": "m", "when": datetime.date(2024, 1, 1)}]})\n'
                             'genrule(name="m", outs=["m"], cmd="touch ran-marker; echo > $@")\n')
    err = expect_invalid(workspace)
    assert "kwargs['models'][0]['when'] is a date (datetime.date(2024, 1, 1))" in err, err


def test_a_relative_label_in_a_package_buildtool_does_not_load_is_an_error_not_the_next_package(
    workspace: Workspace,
) -> None:
    """From an ignored vendor/lib (or one under a CACHEDIR.TAG), `build :all` built the
    root package's targets, exit 0, and `build :vl` said the root had no target vl."""
    workspace.build_file("", 'genrule(name="top", outs=["top.txt"], cmd="touch ran-marker; echo > $@")\n')
    workspace.build_file("vendor/lib", 'genrule(name="vl", outs=["vl.txt"], cmd="echo > $@")\n')
    workspace.write(".buildtoolignore", "vendor\n")
    here = workspace.root / "vendor" / "lib"
    for label in (":all", ":vl"):
        rc, out, err = workspace.run("build", label, cwd=here)
        assert rc == 2 and f"no package //vendor/lib for {label!r} (the working directory's): vendor/lib is " \
            "left out by .buildtoolignore" in err, out + err
    workspace.write(".buildtoolignore", "")
    workspace.write("vendor/CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n")
    rc, out, err = workspace.run("build", ":all", cwd=here)
    assert rc == 2 and "vendor/ holds a CACHEDIR.TAG" in err, out + err
    assert not workspace.exists("ran-marker") and not workspace.exists("top.txt")
    rc, out, err = workspace.run("build", "//:top", cwd=here)  # (an absolute label from there is fine)
    assert rc == 0, out + err


def test_a_subtracted_pattern_says_patterns_do_not_subtract(workspace: Workspace) -> None:
    workspace.build_file("lib", 'genrule(name="l", outs=["l"], cmd="touch ../ran-marker; echo > $@")\n')
    err = expect_invalid(workspace, "--", "//...", "-//lib/...")
    assert "bad pattern '-//lib/...': a pattern cannot subtract targets (Bazel's '-//x/...')" in err, err


def test_keep_going_says_every_buildfile_that_cannot_be_evaluated(workspace: Workspace) -> None:
    """`build -k //...` named the first broken BUILD.py only (a macro renamed: one package
    fixed per run); Bazel's --keep_going lists them all.  Nothing runs either way."""
    workspace.build_file("a", 'genrule(name="a", outs=["a"], cmd="touch ../ran-marker; echo > $@")\n')
    workspace.build_file("b", 'genrule(name="b", outs=["b"], cmd="true", bogus=1)\n')
    workspace.build_file("c", 'genrul(name="c", outs=["c"], cmd="true")\n')
    err = expect_invalid(workspace, "-k", "//...")
    assert "b/BUILD.py:1" in err and "c/BUILD.py:1" in err, err
    assert "(2 errors in the patterns and the BUILD.py files they load; nothing was built)" in err, err
    assert err.count("buildtool: error:") == 2, err
    err = expect_invalid(workspace, "//...")  # (without -k: the first, as before)
    assert err.count("buildtool: error:") == 1 and "b/BUILD.py:1" in err, err
    # Each once, however many patterns reach it; later errors join them, not replace them.
    workspace.build_file("d", 'genrule(name="d", outs=["d"], cmd="true", manual="yes")\n')
    err = expect_invalid(workspace, "-k", "//b:all", "//...", "//...", "//nope/...", "//a:zz")
    for said in ("b/BUILD.py:1", "c/BUILD.py:1", "d/BUILD.py:1", "'//nope/...' matches no package",
                 "unknown target '//a:zz'"):
        assert err.count(said) == 1, (said, err)
    assert "(5 errors in the patterns" in err, err


def test_realpath_memo_resolves_as_os_path_realpath(tmp_path: Path) -> None:
    """graph._realpath resolves each directory once (realpath lstats every component of
    every path: 1,000 nested packages' outputs took 12 s); it must agree with realpath on
    links at any depth, relative and absolute, chained, dangling and looping."""
    from buildtool.graph import _realpath

    root = tmp_path / "ws"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "elsewhere" / "x").mkdir(parents=True)
    os.symlink("../elsewhere", root / "a" / "up")  # relative, out of its directory
    os.symlink(root / "a" / "b", root / "abs")  # absolute
    os.symlink("up", root / "a" / "chain")  # a link to a link
    os.symlink("nowhere", root / "a" / "dangling")
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    memo = {str(root): os.path.realpath(root)}
    for rel in ("a/b/c", "a/up/x", "abs/c", "a/chain/x", "a/dangling", "loop1", "a", "a/b", "a/up"):
        p = os.path.join(str(root), rel)
        assert _realpath(p, memo) == os.path.realpath(p), rel


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", ""])
def test_an_env_name_that_is_no_variable_name_is_refused(workspace: Workspace, name: str) -> None:
    """A name no shell can read ($1X is $1 then X) would silently never reach the command."""
    workspace.build_file("", f'genrule(name="g", outs=["g"], cmd="echo > $@", env={{"{name}": "v"}})\n')
    err = expect_invalid(workspace)
    assert f"BUILD.py:1: //:g: env variable name {name!r} is not a valid name" in err, err


def test_keep_going_names_every_missing_source_and_unknown_target(workspace: Workspace) -> None:
    """-k listed BUILD.py evaluation errors all, but only the first missing source or unknown
    label (Bazel's --keep_going lists every one): a fix-one-rerun loop per file."""
    workspace.build_file("a", 'genrule(name="x", srcs=["nope.c"], outs=["x.o"], cmd="cp $< $@")\n')
    workspace.build_file("b", 'genrule(name="y", srcs=["nope2.c"], outs=["y.o"], cmd="cp $< $@")\n')
    err = expect_invalid(workspace, "//...", "-k")
    assert "//a:x: source file 'a/nope.c' does not exist" in err and \
        "//b:y: source file 'b/nope2.c' does not exist" in err and "(2 sources missing or unusable" in err, err
    err = expect_invalid(workspace, "//...")  # (without -k: the first)
    assert err.count("does not exist") == 1, err
    workspace.build_file("a", 'genrule(name="x", srcs=[":nox"], outs=["x.o"], cmd="cp $< $@")\n')
    workspace.build_file("b", 'genrule(name="y", srcs=["//a:noy"], outs=["y.o"], cmd="cp $< $@")\n')
    err = expect_invalid(workspace, "//...", "-k")
    assert "no target named 'nox'" in err and "no target named 'noy'" in err and "(2 errors in the targets" in err, err


def test_the_target_is_named_also_when_a_longer_label_is_in_the_message(workspace: Workspace) -> None:
    """The label was left out when it appeared in the message as part of another one
    ("did you mean //:lib_test?" holds "//:lib"): which target of a loop failed?"""
    workspace.build_file("", 'for n in ["lib", "lib_test"]:\n'
                             '    genrule(name=n, srcs=[":lib_tst"] if n == "lib" else [], outs=[n + ".txt"], '
                             'cmd="echo > $@")\n')
    err = expect_invalid(workspace)
    assert "BUILD.py:2: //:lib: srcs refers to an unknown target ':lib_tst'" in err, err


def _nested_groups(ws: Workspace, n: int) -> None:
    ws.write("s.txt", "s\n")
    ws.build_file("", f"""
N = {n}
for i in range(N):
    genrule(name=f"l{{i}}", srcs=["s.txt"], outs=[f"out/{{i}}.txt"], cmd=f"echo {{i}} > $@")
    group(name=f"g{{i}}", deps=([f":g{{i-1}}"] if i else []) + [f":l{{i}}"])
genrule(name="top", srcs=[f":g{{N-1}}"], outs=["top.txt"], cmd="cat $(SRCS) > $@")
group(name="a", deps=[":b", ":c"])
group(name="b", deps=[":l1"])
group(name="c", deps=[":l1", ":l0", ":g1"])
genrule(name="diamond", srcs=[":a", "s.txt"], outs=["d.txt"], cmd="cat $(SRCS) > $@")
""")


def test_nested_groups_are_flattened_for_their_readers_in_linear_space(workspace: Workspace) -> None:
    """Each group kept its whole closure's files: a chain of nested groups was quadratic in
    time, memory and the pickled graph (8,000 groups: 3.3 s and 161 MB).  Readers still get
    every member's file once, in declaration order, through groups within groups."""
    _nested_groups(workspace, 150)
    assert workspace.build("//:top", "//:diamond").rc == 0
    assert workspace.read("top.txt") == "".join(f"{i}\n" for i in range(150))
    assert workspace.read("d.txt") == "1\n0\ns\n"
    time.sleep(0.1)  # (past the racy window: the next build leaves a snapshot with its graph)
    assert workspace.build("//:top", "//:diamond").rc == 0
    small = slot_file(workspace.root / ".buildtool", "graph").stat().st_size
    shutil.rmtree(workspace.root / ".buildtool")
    _nested_groups(workspace, 600)
    assert workspace.build("//:top", "//:diamond").rc == 0
    assert workspace.read("top.txt") == "".join(f"{i}\n" for i in range(600))
    time.sleep(0.1)
    assert workspace.build("//:top", "//:diamond").rc == 0
    large = slot_file(workspace.root / ".buildtool", "graph").stat().st_size
    assert large < 6 * small, (small, large)  # (4x the targets; quadratic was 16x)


@pytest.mark.parametrize(("files", "build", "needle"), [
    ({}, 'genrule(name="a", srcs=["in.txt"], outs=["a.o"], cmd="cp $< $@", depfile="BUILD.py")',
     "depfile 'BUILD.py' of //:a is a BUILD.py file"),
    ({".git/config": "[core]\n"}, 'genrule(name="a", outs=["a.o"], cmd="touch $@", depfile=".git/config")',
     "depfile '.git/config' of //:a is inside .git/"),
    ({}, 'genrule(name="a", outs=["a.o"], cmd="touch $@", depfile="buildtool.toml")',
     "depfile 'buildtool.toml' of //:a is the workspace's buildtool.toml"),
    ({"data.txt": "keep me\n"},
     'genrule(name="a", outs=["a.o"], cmd="touch $@", depfile="data.txt")\n'
     'genrule(name="b", srcs=["data.txt"], outs=["b.o"], cmd="cp $< $@")',
     "depfile 'data.txt' of //:a is a source of //:b"),
    ({}, 'genrule(name="a", outs=["a.o"], cmd="touch $@", depfile="x.d")\n'
         'genrule(name="b", outs=["x.d"], cmd="touch $@")',
     "depfile 'x.d' of //:a is an output of //:b"),
    ({}, 'genrule(name="a", outs=["a.o"], cmd="touch $@", depfile="x.d")\n'
         'genrule(name="b", outs=["b.o"], cmd="touch $@", depfile="x.d")',
     "depfile 'x.d' of //:a is the depfile of //:b"),
    ({"sub/BUILD.py": ""}, 'genrule(name="a", outs=["a.o"], cmd="touch $@", depfile="sub/a.d")',
     "depfile 'sub/a.d' of //:a is in package //sub, not //"),
])
def test_a_depfile_that_is_anything_but_the_commands_own_file_is_refused(
    workspace: Workspace, files: dict[str, str], build: str, needle: str,
) -> None:
    """A depfile is deleted before its command runs, and after it: ``depfile="BUILD.py"``
    deleted the BUILD.py (and a source of another target, .git/config) with a failed
    build as the only sign.  Refused as an output would be, before anything runs; the file
    is still there."""
    workspace.write("in.txt", "in\n")
    for rel, text in files.items():
        workspace.write(rel, text)
    workspace.build_file("", build + "\n")
    before = {p: workspace.path(p).read_bytes() for p in [*files, "BUILD.py"]}
    err = expect_invalid(workspace, "//:a")
    assert needle in err and "BUILD.py:1:" in err, err
    assert {p: workspace.path(p).read_bytes() for p in before} == before


def test_a_module_that_declares_targets_as_it_is_imported_is_refused(workspace: Workspace) -> None:
    """A module is imported once per build: a genrule() at its top level went to whichever
    package imported it first (`build //...` built //p:ver alone, `build //q:ver //p:ver`
    said //p:ver was unknown, and watch lost it after a re-evaluation).  Exit 2 at the
    module's line; the same declaration in a function each BUILD.py calls works."""
    workspace.write("tools/__init__.py", "")
    workspace.write("tools/common.py", 'from buildtool.dsl import genrule\n'
                                       'genrule(name="ver", outs=["ver.txt"], cmd="echo 1 > $@")\n')
    for pkg in ("p", "q"):
        workspace.build_file(pkg, "import tools.common\n")
    for args in (("build", "//..."), ("query", "//...")):
        rc, out, err = workspace.run(*args)
        assert rc == 2 and "tools/common.py:2: genrule() called while tools/common.py is imported (by //" in err, \
            out + err
    workspace.write("tools/common.py", 'from buildtool.dsl import genrule\n\n'
                                       'def ver():\n    genrule(name="ver", outs=["ver.txt"], cmd="echo 1 > $@")\n')
    for pkg in ("p", "q"):
        workspace.build_file(pkg, "import tools.common\ntools.common.ver()\n")
    rc, out, err = workspace.run("query", "//...")
    assert rc == 0 and out.split() == ["//p:ver", "//q:ver"], out + err
    # A file each BUILD.py runs (runpy.run_path, exec) is no import: each package gets its own
    # targets, as Make's include (the first version of the check refused them too: a review).
    workspace.write("common/targets.py", 'genrule(name="v2", outs=["v2.txt"], cmd="echo v > $@")\n')
    workspace.build_file("p", "import os, runpy\nrunpy.run_path(os.path.join(os.path.dirname(__file__), '..', "
                              "'common', 'targets.py'), init_globals={'genrule': genrule})\n")
    workspace.build_file("q", "import os\np = os.path.join(os.path.dirname(__file__), '..', 'common', 'targets.py')\n"
                              "exec(compile(open(p).read(), p, 'exec'))\n")
    rc, out, err = workspace.run("query", "//...")
    assert rc == 0 and out.split() == ["//p:v2", "//q:v2"], out + err


@pytest.mark.parametrize("arg", ["3", "''", "'A=B'"])
def test_getenv_of_no_variable_name_is_an_error_at_its_line(workspace: Workspace, arg: str) -> None:
    """`getenv(3)` was a raw "TypeError: str expected, not int" (the bad-input audit)."""
    workspace.build_file("", f'x = getenv({arg})\ngenrule(name="g", outs=["g"], cmd="touch $@")\n')
    err = expect_invalid(workspace)
    assert "BUILD.py:1: getenv() takes a variable name" in err and "TypeError" not in err, err


def _graph_of(deps: list[list[int]], inputs: list[tuple[str, ...]] | None = None) -> Graph:
    """A Graph of genrules ``//:t<i>`` (each making ``t<i>``) with these dependencies, made
    without a loader."""
    targets = tuple(Target(i, f"//:t{i}", "genrule", "", "true", (), tuple(d), (f"t{i}",), (), (), (), 0, False,
                           None, None, None, None, "BUILD.py:1") for i, d in enumerate(deps))
    dependents = tuple(tuple(j for j, d in enumerate(deps) if i in d) for i in range(len(deps)))
    return Graph(targets, {t.label: t.id for t in targets}, tuple(range(len(deps))), dependents,
                 tuple(inputs) if inputs is not None else tuple(() for _ in deps))


def test_topo_order_lists_each_target_once_after_all_of_its_dependencies() -> None:
    g = _graph_of([[], [0], [0], [1, 2], []])
    assert g.topo_order() == [0, 4, 1, 2, 3]
    # A depfile's edge (1 reads what 4 makes) holds 1 back until 4 is done too.
    assert g.topo_order({1: [4]}) == [0, 4, 2, 1, 3]


def test_a_test_s_closure_inputs_reach_every_level_below_it() -> None:
    # 2 reads t1, made by 1 from t0, made by 0 from a.in: a wrapper that reads a file two
    # levels down finds it (in a remote worker's input root too).
    g = _graph_of([[], [0], [1]], [("a.in",), ("t0",), ("t1",)])
    assert g.closure_inputs(2) == ["t1", "a.in", "t0"]


def test_an_env_string_of_exactly_the_kernel_s_limit_is_refused_one_byte_less_runs(workspace: Workspace) -> None:
    # NAME=value and its NUL must fit MAX_ARG_STRLEN (131,072): NAME=value of 131,072 bytes
    # does not (execve: "Argument list too long"); of 131,071 it does.
    rule = 'genrule(name="e", outs=["e.txt"], env={{"BIG": "x" * {n}}}, cmd="printenv BIG | wc -c > $@")\n'
    workspace.build_file("", rule.format(n=128 * 1024 - 4))
    err = expect_invalid(workspace)
    assert "env value of BIG is 131,072 bytes with its name" in err, err
    workspace.build_file("", rule.format(n=128 * 1024 - 5))
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("e.txt").strip() == str(128 * 1024 - 5 + 1)


@pytest.mark.parametrize(("decl", "said"), [
    # True is an int to Python: priority=True is not priority 1, flaky=True not one rerun.
    ('genrule(name="g", outs=["g.out"], cmd="echo > $@", priority=True)',
     "attribute 'priority' must be an int from -1,000,000,000 to 1,000,000,000 (got True)"),
    ('test(name="t", cmd="true", flaky=True)\ngenrule(name="g", deps=[":t"], outs=["g.out"], cmd="true")',
     "attribute 'flaky' must be a whole number of reruns"),
    # Bazel's external-repository label, in tools= out of habit.
    ('genrule(name="g", outs=["g.out"], cmd="gcc -v > $@", tools=["@rules_cc//cc:gcc"])',
     "tools entry '@rules_cc//cc:gcc' is a label; tools names programs found on PATH"),
])
def test_attributes_of_the_wrong_kind_are_refused(workspace: Workspace, decl: str, said: str) -> None:
    workspace.build_file("", decl + "\n")
    err = expect_invalid(workspace)
    assert said in err, err


def test_a_link_at_an_output_path_into_a_sibling_with_the_workspace_s_name_as_prefix_is_refused(
        workspace: Workspace) -> None:
    # /x/ws-other/ starts with "/x/ws" but is outside /x/ws: the command would write there.
    other = Path(f"{workspace.root}-other")
    other.mkdir()
    (other / "o.txt").write_text("theirs\n")
    (workspace.root / "o.txt").symlink_to(other / "o.txt")
    workspace.build_file("", 'genrule(name="g", outs=["o.txt"], cmd="touch ran-marker; echo ours > $@")\n')
    err = expect_invalid(workspace)
    assert "is a symbolic link to" in err and "outside the workspace" in err, err
    assert (other / "o.txt").read_text() == "theirs\n"


def test_an_output_s_directory_linked_into_a_sibling_with_the_workspace_s_name_as_prefix_is_refused(
        workspace: Workspace) -> None:
    other = Path(f"{workspace.root}-other")
    other.mkdir()
    (workspace.root / "gen").symlink_to(other)
    workspace.build_file("", 'genrule(name="g", outs=["gen/o.txt"], cmd="touch ran-marker; echo > $@")\n')
    err = expect_invalid(workspace)
    assert "output 'gen/o.txt' of //:g resolves (through a symlink) outside the workspace" in err, err
    assert not (other / "o.txt").exists()


def test_a_package_typed_twice_over_is_offered_with_its_target_name(workspace: Workspace) -> None:
    """From lib/, `lib/core:c` (a path from the root, typed as relative) is //lib/lib/core:c;
    the hint named the moved-package reading without the target: //lib/core."""
    workspace.build_file("lib/core", 'genrule(name="c", outs=["c"], cmd="echo > $@")\n')
    rc, _, err = workspace.run("build", "lib/core:c", cwd=workspace.root / "lib")
    assert rc == 2 and "did you mean //lib/core:c?" in err, err


def test_a_near_miss_package_is_offered_the_one_it_begins_before_a_later_tie(workspace: Workspace) -> None:
    """`//libs/pkg0` among pkg00..pkg39 offered //libs/pkg30 (difflib's tie-break: the
    greatest string), where pkg00 is as close and begins with what was typed."""
    for i in range(40):
        workspace.build_file(f"libs/pkg{i:02d}", 'genrule(name="t", outs=["o"], cmd="echo > $@")\n')
    rc, _, err = workspace.run("build", "//libs/pkg0:t")
    assert rc == 2 and "did you mean //libs/pkg00?" in err, err


def test_a_bad_label_that_starts_like_the_target_s_own_still_names_the_target(workspace: Workspace) -> None:
    # The error of //:a said "BUILD.py:1: deps: bad label '//:a b'": the check for the
    # target's label in the message took '//:a b' for it, and left out the prefix.
    workspace.build_file("", 'genrule(name="a", deps=["//:a b"], outs=["o"], cmd="touch $@")\n')
    err = expect_invalid(workspace)
    assert "BUILD.py:1: //:a: deps: bad label '//:a b'" in err, err
    workspace.build_file("", 'genrule(name="a", deps=["//:b //:a"], outs=["o"], cmd="touch $@")\n')
    err = expect_invalid(workspace)  # (the label at the end of the quoted text: not the target named either)
    assert "BUILD.py:1: //:a: deps: bad label '//:b //:a'" in err, err
