"""End to end: a tiny C project built with the cc macros and depfiles, with the real
compiler and the real ``buildtool`` command.  Editing a header reruns exactly the objects
that include it (and the link); a fresh checkout with the same cache and no state restores
everything; a changed header in such a checkout is never answered with a stale object."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Workspace, slot_file

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")

BUILD = """
from buildtool.cc import cc_binary, cc_library

cc_library(name="shapes", srcs=["square.c", "circle.c"], includes=["include"])
cc_binary(name="app", srcs=["main.c"], deps=[":shapes"], includes=["include"])
"""

SQUARE_H = "#define SQUARE_SIDE 3\nint square_area(void);\n"
CIRCLE_H = "#define CIRCLE_R 2\nint circle_area(void);\n"

OBJ_SQUARE = "//:shapes@square.c"
OBJ_CIRCLE = "//:shapes@circle.c"
OBJ_MAIN = "//:app@main.c"


def make_project(ws: Workspace) -> None:
    ws.build_file("", BUILD)
    ws.write("include/square.h", SQUARE_H)
    ws.write("include/circle.h", CIRCLE_H)
    ws.write("square.c", '#include "square.h"\nint square_area(void) { return SQUARE_SIDE * SQUARE_SIDE; }\n')
    ws.write("circle.c", '#include <stdlib.h>\n#include "circle.h"\n'
             "int circle_area(void) { return 3 * CIRCLE_R * CIRCLE_R; }\n")
    ws.write(
        "main.c",
        '#include <stdio.h>\nint square_area(void);\nint circle_area(void);\n'
        'int main(void) { printf("%d %d\\n", square_area(), circle_area()); return 0; }\n',
    )


def run_app(ws: Workspace) -> str:
    return subprocess.run([str(ws.path("app"))], capture_output=True, text=True, timeout=30, check=True).stdout


def edit(ws: Workspace, rel: str, text: str) -> None:
    ws.write(rel, text)


def record_entries(ws: Workspace) -> dict[str, dict]:
    """label -> last record entry, its description parsed (stored as JSON text, formats.md)."""
    lines = ws.read(".buildtool/record").splitlines()[1:]
    out: dict[str, dict] = {}
    for ln in lines:
        e = json.loads(ln)
        if isinstance(e.get("desc"), str):
            e["desc"] = json.loads(e["desc"])
        out[e["l"]] = e
    return out


def test_header_edit_reruns_exactly_its_objects_and_the_link(workspace: Workspace) -> None:
    ws = workspace
    make_project(ws)
    r = ws.build("-j", "2")
    assert r.rc == 0, r.output
    assert run_app(ws) == "9 12\n"
    assert {OBJ_SQUARE, OBJ_CIRCLE, OBJ_MAIN, "//:shapes.a", "//:app"} <= r.ran
    # The depfiles were read into the record and deleted: not outputs, not left behind.
    assert not list(ws.root.rglob("*.d"))
    rec = record_entries(ws)
    assert rec[OBJ_SQUARE]["desc"]["discovered"] == ["include/square.h"]
    assert rec[OBJ_CIRCLE]["desc"]["discovered"] == ["include/circle.h"]  # <stdlib.h> is outside
    assert rec[OBJ_MAIN]["desc"]["discovered"] == []
    assert [o[0] for o in rec[OBJ_SQUARE]["o"]] == ["_objs/shapes/square.o"]

    time.sleep(0.1)  # out of the racy window, so the no-op snapshot is written
    r = ws.build()
    assert r.rc == 0 and r.ran == set(), r.output
    assert slot_file(ws.root / ".buildtool", "noop").exists()

    edit(ws, "include/square.h", SQUARE_H.replace("3", "5"))
    r = ws.build("--explain")
    assert r.rc == 0, r.output
    assert r.ran == {OBJ_SQUARE, "//:shapes.a", "//:app"}, r.output
    assert r.status(OBJ_CIRCLE) == "up_to_date" and r.status(OBJ_MAIN) == "up_to_date"
    assert "include/square.h changed" in r.by_label[OBJ_SQUARE]["reason"]
    assert run_app(ws) == "25 12\n"

    # A dry run after another edit names the object that would run, and nothing else of the objects.
    edit(ws, "include/circle.h", CIRCLE_H.replace("2", "4"))
    rc, out, err = ws.run("build", "-n")
    assert rc == 0, out + err
    assert OBJ_CIRCLE in out and OBJ_SQUARE not in out and OBJ_MAIN not in out, out
    r = ws.build()
    assert r.ran == {OBJ_CIRCLE, "//:shapes.a", "//:app"}, r.output
    assert run_app(ws) == "25 48\n"

    # Adding an #include to a .c file (a declared input) records the new header too.
    edit(ws, "main.c", '#include "square.h"\n' + ws.read("main.c"))
    r = ws.build()
    # main.o comes out byte-identical (square.h only declares): early cutoff, no relink.
    assert r.ran == {OBJ_MAIN}, r.output
    assert record_entries(ws)[OBJ_MAIN]["desc"]["discovered"] == ["include/square.h"]
    edit(ws, "include/square.h", SQUARE_H.replace("3", "6"))
    r = ws.build()
    assert r.ran == {OBJ_SQUARE, OBJ_MAIN, "//:shapes.a", "//:app"}, r.output
    assert run_app(ws) == "36 48\n"


def test_rdeps_of_a_header_are_the_objects_whose_last_depfile_named_it_and_their_dependents(
    workspace: Workspace,
) -> None:
    """"What uses this header?": no BUILD.py lists it, the depfiles of the last build do
    (before any build, the answer is only what lists it: nothing, and a warning says the
    compiles have no depfile list yet; an empty answer read as "nothing uses it")."""
    make_project(workspace)
    rc, out, err = workspace.run("query", "rdeps(//..., //:include/square.h)")
    assert rc == 0 and out == "", (out, err)
    assert "have no build record here" in err and OBJ_SQUARE in err, err
    assert workspace.build("//:app").rc == 0
    rc, out, err = workspace.run("query", "rdeps(//..., //:include/square.h)")
    assert rc == 0 and err == "", err
    assert sorted(out.split()) == sorted(["//:app", OBJ_SQUARE, "//:shapes", "//:shapes.a"])


def test_a_fresh_checkout_s_compile_miss_names_the_header_that_changed(workspace: Workspace, tmp_path: Path) -> None:
    """With no record, a miss is compared with the cache's last description of the label,
    a final one (its headers too): the edited header was said to be "removed", each one."""
    make_project(workspace)
    assert workspace.build("//:app").rc == 0
    fresh = workspace.copy_to(tmp_path / "fresh")
    fresh.write("include/square.h", SQUARE_H.replace("3", "4"))
    rc, out, err = fresh.run("explain", OBJ_SQUARE)
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith(OBJ_SQUARE))
    assert re.search(r"differs: input include/square\.h changed \([0-9a-f]{8} -> [0-9a-f]{8}\)$", line), line
    assert "removed" not in line, line
    # The key it names is the one looked up (the primary key, whose variants hold the
    # headers), not a key no lookup used, which the build's events then contradicted.
    assert "no cache entry for its headers as they are now (primary key " in line, line
    assert "no cache entry for key" not in line, line


def test_fresh_checkout_restores_everything_and_never_a_stale_object(
    workspace: Workspace, tmp_path: Path
) -> None:
    ws = workspace
    make_project(ws)
    assert ws.build("-j", "2").rc == 0

    # Another checkout, same cache, no state: everything restored, zero commands.
    fresh = ws.copy_to(tmp_path / "fresh")
    for p in ("app", "libshapes.a", "_objs"):
        target = fresh.path(p)
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    r = fresh.build()
    assert r.rc == 0, r.output
    assert r.ran == set(), r.output
    assert {OBJ_SQUARE, OBJ_CIRCLE, OBJ_MAIN, "//:shapes.a", "//:app"} <= r.with_status("restored")
    assert run_app(fresh) == "9 12\n"
    # The restore recorded the discovered headers: a header edit there reruns just its object.
    edit(fresh, "include/circle.h", CIRCLE_H.replace("2", "3"))
    r = fresh.build()
    assert r.ran == {OBJ_CIRCLE, "//:shapes.a", "//:app"}, r.output
    assert run_app(fresh) == "9 27\n"

    # A third checkout whose header differs from everything cached: the object is compiled,
    # not restored from the entry of the same .c file with the old header.
    third = ws.copy_to(tmp_path / "third")
    shutil.rmtree(third.path("_objs"))
    edit(third, "include/square.h", SQUARE_H.replace("3", "7"))
    r = third.build()
    assert r.rc == 0, r.output
    assert r.status(OBJ_SQUARE) == "ran", r.output
    assert r.status(OBJ_CIRCLE) == "restored" and r.status(OBJ_MAIN) == "restored"
    assert run_app(third) == "49 12\n"

    # Back to the first header content in that checkout: restored again (two manifest variants).
    edit(third, "include/square.h", SQUARE_H)
    r = third.build()
    assert r.status(OBJ_SQUARE) == "restored", r.output
    assert r.ran == set(), r.output
    assert run_app(third) == "9 12\n"


def test_missing_or_malformed_depfile_fails_and_deletes_outputs(workspace: Workspace) -> None:
    ws = workspace
    ws.build_file(
        "",
        """
        genrule(name="nodep", outs=["a.o"], depfile="a.d", cmd="echo x > a.o")
        genrule(name="bad", outs=["b.o"], depfile="b.d", cmd="echo x > b.o; echo 'no colon here' > b.d")
        genrule(name="ok", srcs=["in.txt"], outs=["c.o"], depfile="sub/c.d",
                cmd="mkdir -p sub; cp in.txt c.o; printf 'c.o: in.txt extra.txt\\n' > sub/c.d")
        """,
    )
    ws.write("in.txt", "1")
    ws.write("extra.txt", "e1")
    r = ws.build("-k")
    assert r.rc == 1
    assert r.status("//:nodep") == "failed" and r.status("//:bad") == "failed"
    assert "did not write its depfile a.d" in r.output
    assert "depfile b.d is malformed" in r.output
    assert not ws.exists("a.o") and not ws.exists("b.o") and not ws.exists("b.d")
    # A genrule (not a compiler) may write a depfile too: extra.txt became an input.
    assert r.status("//:ok") == "ran" and not ws.exists("sub/c.d")
    r = ws.build("//:ok")
    assert r.ran == set()
    edit(ws, "extra.txt", "e2")
    r = ws.build("//:ok")
    assert r.ran == {"//:ok"}, r.output


def test_a_header_a_dependency_of_a_dependency_just_wrote_is_no_race(workspace: Workspace) -> None:
    """gen.h comes from //:gen, reached through //:mid: written a few ms before //:obj's
    command started, it looked "changed while the command ran", so //:obj was neither
    recorded nor cached and ran again on the next build ("never built").  A header edited
    by hand during a run still leaves the target dirty (test_header_edit_... above)."""
    ws = workspace

    def chain(gen: int, first: str = "") -> None:
        ws.build_file(
            "",
            f"""
            genrule(name="gen", outs=["gen.h"], cmd="echo '#define GEN {gen}' > $@")
            genrule(name="mid", deps=[":gen"], outs=["mid.txt"], cmd="echo mid > $@")
            genrule(name="obj", srcs=["main.c"], deps=[":mid"], outs=["main.o"], depfile="main.d",
                    cmd="{first}cat main.c gen.h > main.o; printf 'main.o: main.c gen.h\\n' > main.d")
            """,
        )

    chain(1)
    ws.write("main.c", "int main;\n")
    r = ws.build()
    assert r.rc == 0 and "changed while the command ran" not in r.output, r.output
    assert ws.build().ran == set()
    chain(2)
    r = ws.build()
    assert r.ran == {"//:gen", "//:mid", "//:obj"} and "GEN 2" in ws.read("main.o"), r.output
    chain(3, first="echo '#define GEN 99' > gen.h; ")  # changed during the run after all (by the command itself)
    r = ws.build()
    assert "input gen.h changed while the command ran" in r.output, r.output
    r = ws.build()
    assert "//:obj" in r.ran, r.output


def _header_maker_not_a_dependency(ws: Workspace, gen_cmd: str) -> None:
    """//:gen (``gen_cmd``, from val.txt) makes gen.h, which //:obj's depfile names though
    //:obj does not depend on //:gen; //:gen built once, alone."""
    ws.write("val.txt", "1\n")
    ws.write("main.c", "int main;\n")
    ws.build_file("", f"""
        genrule(name="gen", srcs=["val.txt"], outs=["gen.h"], cmd="{gen_cmd}")
        genrule(name="obj", srcs=["main.c"], outs=["main.o"], depfile="main.d",
                cmd="cat main.c gen.h > main.o; printf 'main.o: main.c gen.h\\\\n' > main.d")
    """)
    assert ws.build("//:gen").rc == 0


@pytest.mark.parametrize("path", ["incremental", "full"])
def test_a_generated_header_missing_from_the_dependencies_is_made_first_once_a_depfile_named_it(
        workspace: Workspace, path: str) -> None:
    """gen.h made by //:gen, which //:obj does not depend on (hdr_deps forgotten): after
    val.txt changed, the no-op snapshot's incremental build planned only //:gen and said
    OK over main.o compiled from the old gen.h; a full build raced the two (here: failed,
    every time). What the depfile named orders them now, as Make's .d files and Ninja's
    deps log do (the first build, with no depfile yet, still races: hdr_deps)."""
    ws = workspace
    _header_maker_not_a_dependency(ws, "sleep 0.3; echo GEN $$(cat val.txt) > $@")
    assert ws.build().rc == 0 and "GEN 1" in ws.read("main.o")
    time.sleep(0.1)  # (out of the snapshot's racy window)
    assert ws.build().ran == set()
    if path == "full":
        for snap in (ws.root / ".buildtool").iterdir():
            if snap.name.startswith("noop."):
                snap.unlink()
    edit(ws, "val.txt", "2\n")
    rc, out, err = ws.run("build", "-n")  # (it said //:obj was up to date)
    assert rc == 0 and "//:obj: would run: dependency //:gen would run" in out + err, out + err
    r = ws.build()
    assert r.rc == 0 and r.ran == {"//:gen", "//:obj"} and "changed while the command ran" not in r.output, r.output
    assert "GEN 2" in ws.read("main.o"), r.output
    assert re.search(r"critical path: [\d.]+s of [\d.]+s wall: //:gen [\d.]+s -> //:obj", r.output), r.output
    assert ws.build().ran == set()


def test_a_target_skipped_behind_a_failed_maker_of_a_header_its_depfile_named_names_it(
        workspace: Workspace) -> None:
    """What a depfile named orders the plan, but a skip behind it said "not run because a
    dependency failed" of a target with no dependency, naming none."""
    ws = workspace
    _header_maker_not_a_dependency(ws, "grep -qv bad val.txt && cp val.txt $@")
    assert ws.build().rc == 0
    edit(ws, "val.txt", "bad\n")
    r = ws.build("-k")
    assert r.rc == 1 and r.by_label["//:obj"]["reason"] == "not run because //:gen failed", r.by_label


def test_debug_objects_restored_in_another_checkout_do_not_name_the_first_one(
        make_workspace: Callable[..., Workspace]) -> None:
    """copts=["-g"]: the object's debug information named the directory it was compiled
    in, which the key leaves out, so a second checkout sharing the cache got objects whose
    gdb listed the first checkout's (edited) sources. Written as "." now, by the shell's
    $PWD (the keys stay the same in every checkout, and the cache still shares them)."""
    a = make_workspace("dbg-a")
    b = make_workspace("dbg-b", cache=a.cache)
    for ws in (a, b):
        ws.write("main.c", "int main(void) { return 0; }\n")
        ws.build_file("", 'from buildtool.cc import cc_binary\ncc_binary(name="app", srcs=["main.c"], copts=["-g"])\n')
    assert a.build().rc == 0
    r = b.build()
    assert r.rc == 0 and "//:app@main.c" in r.with_status("restored"), r.output
    for ws in (a, b):
        obj = (ws.root / "_objs" / "app" / "main.o").read_bytes()
        assert str(a.root).encode() not in obj and str(b.root).encode() not in obj, ws.root


def test_a_typo_in_cc_binary_deps_is_said_of_deps(workspace: Workspace) -> None:
    """The link's genrule took `deps` among its srcs: a typo said "srcs refers to an
    unknown target", of an attribute the user wrote right."""
    workspace.write("main.c", "int main(void) { return 0; }\n")
    workspace.build_file("", 'from buildtool.cc import cc_binary\ncc_binary(name="app", srcs=["main.c"], '
                             'deps=[":libx"])\n')
    rc, _, err = workspace.run("build")
    assert rc == 2 and "//:app: deps refers to an unknown target ':libx'" in err, err


def test_depfile_edges_that_would_close_a_cycle_are_left_out(workspace: Workspace) -> None:
    """//:a makes a.h and its depfile names b.h; //:b makes b.h and names a.h: the two plan
    edges made a cycle, and every build after failed both with "internal error: the
    scheduler never started it", even once the user had mended the depfiles."""
    ws = workspace
    ws.write("a.src", "1\n")
    ws.write("b.src", "1\n")
    ws.build_file("", """
        genrule(name="a", srcs=["a.src"], outs=["a.h"], depfile="a.d",
                cmd="cat a.src > a.h; printf 'a.h: b.h\\n' > a.d")
        genrule(name="b", srcs=["b.src"], outs=["b.h"], depfile="b.d",
                cmd="cat b.src > b.h; printf 'b.h: a.h\\n' > b.d")
    """)
    for _ in range(3):  # (each reads the other's header while it may be remade: they race, as before)
        r = ws.build()
        assert r.rc == 0 and "internal error" not in r.output and r.ran <= {"//:a", "//:b"}, r.output
    edit(ws, "a.src", "2\n")
    r = ws.build()
    assert r.rc == 0 and "internal error" not in r.output and ws.read("a.h") == "2\n", r.output


def test_a_compile_that_misses_a_generated_header_names_the_target_that_makes_it(workspace: Workspace) -> None:
    """A first build without hdr_deps: gcc's "fatal error: gen.h: No such file or directory"
    alone, where buildtool knows which target makes gen.h and that the object does not
    depend on it."""
    ws = workspace
    ws.write("main.c", '#include "gen.h"\nint main(void) { return VAL; }\n')
    ws.build_file("", """
        from buildtool.cc import cc_binary
        genrule(name="gen", outs=["gen.h"], cmd="sleep 0.5; echo '#define VAL 0' > $@")
        cc_binary(name="app", srcs=["main.c"])
    """)
    r = ws.build()
    assert r.rc == 1 and "(gen.h is made by //:gen, which //:app@main.c does not depend on: add it to hdr_deps" \
        in r.output, r.output


def test_depfile_attribute_is_validated(workspace: Workspace) -> None:
    ws = workspace
    ws.write("a.c", "")
    ws.build_file("", 'genrule(name="x", srcs=["a.c"], outs=["a.o"], depfile="../a.d", cmd="true")\n')
    rc, _, err = ws.run("build")
    assert rc == 2 and "BUILD.py:1" in err and "depfile" in err, err
    ws.build_file("", 'genrule(name="x", srcs=["a.c"], outs=["a.o"], depfile="a.c", cmd="true")\n')
    rc, _, err = ws.run("build")
    assert rc == 2 and "is also a source" in err, err
    ws.build_file("", 'test(name="x", srcs=["a.c"], depfile="a.d", cmd="true")\n')
    rc, _, err = ws.run("build")
    assert rc == 2 and "unknown attribute 'depfile'" in err, err


@pytest.mark.parametrize(("call", "needle"), [
    ('cc_library(name="x", srcs="a.c")', "cc_library(name='x'): srcs must be a list of strings (got 'a.c')"),
    ('cc_binary(name="x", srcs=["a.c"], copts="-O2")', "copts must be a list of strings"),
    ('cc_library(name="x", srcs=["a.c"], hdrs=["a.h"])',
     "unknown attribute 'hdrs' (headers go in srcs); cc_library() takes name, srcs, "),
    ('cc_library(name="x", srcs=["a.c"], include=["i"])', "unknown attribute 'include' (did you mean 'includes'?); "),
    ('cc_test(name="x", srcs=["a.c"], data="d")', "data must be a list of strings"),
    ('cc_binary(name="x", srcs=["a.c"], deps=["lib"])',  # (was "source file 'lib' does not exist")
     "deps entries must be labels ('//pkg:name' or ':name'), got 'lib'; did you mean ':lib'?"),
    # Keywords only, as the rules (a positional name was taken; the rest were not).
    ('cc_library("x", srcs=["a.c"])', "cc_library() takes keyword arguments only (got 1 positional: 'x'...)"),
])
def test_cc_macro_arguments_are_checked_at_the_call(workspace: Workspace, call: str, needle: str) -> None:
    """A string where a list goes was taken a character at a time (srcs="a.c": an empty
    library, exit 0), an unknown keyword reported as genrule()'s."""
    workspace.write("a.c", "int f(void) { return 1; }\n")
    workspace.build_file("", f"from buildtool.cc import cc_binary, cc_library, cc_test\n{call}\n")
    rc, _, err = workspace.run("build")
    assert rc == 2 and "BUILD.py:2: " in err and needle in err, err
    assert "raised" not in err, err  # (fail(): a rule's error, not an exception's)


def test_a_bare_dep_naming_a_package_offers_both_readings(workspace: Workspace) -> None:
    """deps=["util"] with a package //util offered only ':util', which (with no such target
    here) failed next as "package //app has no target named 'util'"."""
    workspace.write("app/a.c", "int main(void) { return 0; }\n")
    workspace.build_file("util", 'genrule(name="util", outs=["u"], cmd="echo > $@")\n')
    workspace.build_file("app", 'from buildtool.cc import cc_binary\n'
                                'cc_binary(name="a", srcs=["a.c"], deps=["util"])\n')
    rc, _, err = workspace.run("build", "//app:a")
    assert rc == 2 and "app/BUILD.py:2" in err, err
    assert "got 'util'; did you mean ':util' (a target of this package) or '//util' (the package)?" in err, err


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_cc_test_takes_hdr_deps_and_assembly_sources_build(workspace: Workspace) -> None:
    """cc_test builds like cc_binary (hdr_deps included); a .s source, which gcc does not
    preprocess and so writes no depfile for, still compiles."""
    workspace.write("f.s", "\t.globl f\nf:\n\tret\n")
    workspace.write("m.c", '#include "cfg.h"\nint f(void);\nint main(void){f();return X - 1;}\n')
    workspace.build_file("", 'from buildtool.cc import cc_library, cc_test\n'
                             'genrule(name="cfg", outs=["cfg.h"], cmd="echo \\"#define X 1\\" > $@")\n'
                             'cc_library(name="asm", srcs=["f.s"])\n'
                             'cc_test(name="t", srcs=["m.c"], deps=[":asm"], hdr_deps=[":cfg"])')
    r = workspace.build("//:t", command="test")
    assert r.rc == 0 and r.by_label["//:t"]["test"] == "passed", r.output


def test_a_missing_compiler_is_said_not_silently_skipped(workspace: Workspace) -> None:
    workspace.write("main.c", "int main(void) { return 0; }\n")
    workspace.build_file("", 'from buildtool.cc import cc_binary\ncc_binary(name="hello", srcs=["main.c"])\n'
                             'genrule(name="readme", outs=["R.txt"], cmd="echo hi > $@")\n')
    r = workspace.build(env_extra={"CC": "no-such-cc-xyz"})
    assert r.rc == 0 and r.ran == {"//:readme"}, r.output
    assert "C compiler 'no-such-cc-xyz' ($CC, or cc) not found on PATH" in r.stderr, r.stderr


def test_a_generated_source_is_compiled_from_its_label(workspace: Workspace) -> None:
    workspace.write("main.c", "int gen(void);\nint main(void) { return gen(); }\n")
    workspace.build_file("", 'from buildtool.cc import cc_binary\n'
                             'genrule(name="gen_c", outs=["gen.c"], cmd="echo \'int gen(void){return 3;}\' > $@")\n'
                             'genrule(name="gen_h", outs=["gen.h"], cmd="echo \'#define X 1\' > $@")\n'
                             'genrule(name="main", outs=["two.s"], '
                             'cmd="printf \'.globl two\\\\ntwo: ret\\\\n\' > $@")\n'
                             'cc_binary(name="app", srcs=["main.c", ":gen_c", ":main"])\n'
                             'cc_binary(name="bad", srcs=["main.c", ":gen_h"], manual=True)\n')
    r = workspace.build("//:app")  # (":main" beside "main.c": objects of their own)
    assert r.rc == 0 and {"//:app@~gen_c", "//:app@~main", "//:app@main.c"} <= r.ran, r.output
    assert subprocess.run([str(workspace.path("app"))]).returncode == 3
    r = workspace.build("//:bad")
    assert r.rc == 1 and ":gen_h makes 0 C, C++ or assembly sources (its outputs: gen.h ); a srcs label must " \
        "make exactly one" in r.output, r.output


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_a_generator_of_a_source_and_its_header_is_compiled_from_its_label(workspace: Workspace) -> None:
    """bison, flex, protoc-c: one target makes x.c and x.h.  Its label in srcs was
    "$(location :tab) must name exactly one file" (a $(location) the user never wrote), and
    every other spelling sent them back to the label."""
    workspace.write("tab.txt", "7\n")
    workspace.write("m.c", '#include "tab.h"\nint main(void) { return tab(); }\n')
    workspace.build_file("", """
        from buildtool.cc import cc_binary
        genrule(name="tab", srcs=["tab.txt"], outs=["gen/tab.c", "gen/tab.h"],
                cmd="printf 'int tab(void){return %s;}\\n' $$(cat tab.txt) > $(location gen/tab.c); "
                    "echo 'int tab(void);' > $(location gen/tab.h)")
        genrule(name="two", outs=["a b.c", "b.c"], cmd="touch $(OUTS)")
        cc_binary(name="m", srcs=["m.c", ":tab"], includes=["gen"], hdr_deps=[":tab"])
        cc_binary(name="bad", srcs=[":two"], manual=True)
        """)
    r = workspace.build("//:m")
    assert r.rc == 0, r.output
    assert subprocess.run([str(workspace.path("m"))]).returncode == 7
    workspace.write("tab.txt", "9\n")
    assert workspace.build("//:m").rc == 0
    assert subprocess.run([str(workspace.path("m"))]).returncode == 9
    r = workspace.build("//:bad")
    assert r.rc == 1 and ":two makes 2 C, C++ or assembly sources (its outputs: a b.c b.c ); " in r.output, r.output


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_sources_named_with_spaces_or_umlauts_compile_and_a_missing_header_is_an_error(
    workspace: Workspace,
) -> None:
    """A compile target's name comes from the source's path: characters no name may hold
    were an error about a name the user never wrote ('l@sub dir~f.c'). A header listed in
    srcs that does not exist was silently left out."""
    workspace.write("sub dir/f.c", "int f(void) { return 1; }\n")
    workspace.write("ü.c", "int g(void) { return 2; }\n")
    workspace.write("sub_dir/f.c", "int h(void) { return 3; }\n")  # the same name once the space is gone
    workspace.write("main.c", "int f(void); int g(void); int h(void);\n"
                              "int main(void) { return f() + g() + h() - 6; }\n")
    workspace.build_file("", 'from buildtool.cc import cc_binary, cc_library\n'
                             'cc_library(name="l", srcs=["sub dir/f.c", "ü.c", "sub_dir/f.c"])\n'
                             'cc_binary(name="m", srcs=["main.c"], deps=[":l"])\n')
    r = workspace.build()
    assert r.rc == 0, r.output
    assert subprocess.run([str(workspace.path("m"))]).returncode == 0
    assert len([lab for lab in r.ran if lab.startswith("//:l@")]) == 3, r.ran
    workspace.build_file("", 'from buildtool.cc import cc_library\ncc_library(name="l", srcs=["ü.c", "x.h"])\n')
    rc, _, err = workspace.run("build")
    assert rc == 2 and "BUILD.py:2" in err and "srcs entry 'x.h' does not exist" in err, err
    workspace.write("x.h", "/* here now */\n")
    assert workspace.build().rc == 0
    # Headers that are there but no glob would take: in an ignored directory, in a
    # subpackage, through a directory link, written as ./path.
    workspace.write(".buildtoolignore", "third_party/\n")
    workspace.write("third_party/big.h", "int big(void);\n")
    workspace.write("sub/s.h", "int s(void);\n")
    workspace.build_file("sub", 'genrule(name="s", outs=["o"], cmd="true")\n')
    workspace.write("common/q.h", "int q(void);\n")
    (workspace.root / "inc").symlink_to("common")
    workspace.build_file("", 'from buildtool.cc import cc_library\n'
                             'cc_library(name="l", srcs=["ü.c", "third_party/big.h", "sub/s.h", "inc/q.h", "./x.h"])\n')
    r = workspace.build("//:l")
    assert r.rc == 0, r.output


def test_a_header_made_by_a_target_that_is_not_a_dependency_is_warned_about(workspace: Workspace) -> None:
    """main.c includes ops.h, which //:gen makes, but //:main.o does not depend on //:gen:
    nothing orders the two (with -j2 the compile raced the header).  The build says so
    each time the target runs, and not once the dep is declared."""
    workspace.build_file("", """
        genrule(name="gen", outs=["ops.h"], cmd="echo '#define OPS 1' > $@")
        genrule(name="main.o", srcs=["main.c"], outs=["main.o"], depfile="main.d", tools=["cc"],
                cmd="cc -MD -MF main.d -c -o $@ main.c")
        """)
    workspace.write("main.c", '#include "ops.h"\nint f(void) { return OPS; }\n')
    assert workspace.run("build", "//:gen")[0] == 0
    rc, out, err = workspace.run("build", "-j1")
    warning = ("//:main.o: its depfile names ops.h, an output of //:gen, which is not among its dependencies; "
               "add //:gen to its deps")
    assert rc == 0 and warning in err, out + err
    workspace.write("main.c", '#include "ops.h"\nint f(void) { return OPS + 1; }\n')
    rc, out, err = workspace.run("build")
    assert rc == 0 and "ran //:main.o" in out and warning in err, out + err
    workspace.build_file("", workspace.read("BUILD.py").replace('srcs=["main.c"]', 'srcs=["main.c"], deps=[":gen"]'))
    rc, out, err = workspace.run("build")
    assert rc == 0 and "ran //:main.o" in out and "depfile names" not in err, out + err


def test_a_header_that_becomes_another_targets_output_is_warned_about(workspace: Workspace) -> None:
    """local.h was a source main.o's depfile named; then a genrule that is no dependency of
    main.o starts making it.  main.o's inputs were the same paths as before, so no warning
    came, and a later build compiled the header before the genrule remade it: OK, with a
    stale object."""
    workspace.write("local.h", "#define LV 1\n")
    workspace.write("main.c", '#include "local.h"\nint f(void) { return LV; }\n')
    rule = ('genrule(name="main.o", srcs=["main.c"], outs=["main.o"], depfile="main.d", tools=["cc"],\n'
            '        cmd="cc -MD -MF main.d -c -o $@ main.c")\n')
    workspace.build_file("", rule)
    assert workspace.run("build")[0] == 0
    workspace.write("local.in", "2\n")
    workspace.write("main.c", '#include "local.h"\nint f(void) { return LV + 1; }\n')  # (main.o runs either way)
    workspace.build_file("", rule + 'genrule(name="gen", srcs=["local.in"], outs=["local.h"], '
                                    'cmd="echo \'#define LV \'$$(cat $<) > $@")\n')
    rc, out, err = workspace.run("build", "-j1", "//:gen", "//:main.o")
    assert rc == 0 and "its depfile names local.h, an output of //:gen, which is not among its" in err, out + err


def test_sources_whose_names_hold_substitution_characters_compile(workspace: Workspace) -> None:
    """The cc macros put a source's path into the command as text: m$x.c lost its $x to
    substitution ("did not write its depfile"), x$@.c got $@ expanded, a).c and x$(y).c
    were exit 2 about a $(location) or $(y) the user never wrote."""
    names = ["m$x.c", "x$@.c", "a).c", "x$(y).c", "-dash.c"]  # (-dash.c: a compiler option, unless ./-dash.c)
    for i, n in enumerate(names):
        workspace.write(n, f"int f{i}(void) {{ return {i}; }}\n")
    workspace.write("main.c", "int main(void) { return 0; }\n")
    workspace.build_file("", "from buildtool.cc import cc_binary\n"
                             f"cc_binary(name='b', srcs={['main.c', *names]!r})\n")
    r = workspace.build()
    assert r.rc == 0, r.output
    workspace.write("m$x.c", "int f0(void) { return 7; }\n")
    r = workspace.build()
    assert r.rc == 0 and len(r.ran) == 2 and "//:b" in r.ran, (r.ran, r.output)
    assert next(iter(r.ran - {"//:b"})).startswith("//:b@m_x.c~"), r.ran  # (only m$x.c's object)


def test_a_cpp_binary_links_with_the_cpp_driver(workspace: Workspace) -> None:
    """The link ran `cc`, which leaves out the C++ standard library: undefined reference to
    __gxx_personality_v0 for any program using <iostream>."""
    import shutil

    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler here")
    workspace.write("hello.cpp", '#include <iostream>\nint main() { std::cout << "hi from c++" << std::endl; }\n')
    workspace.build_file("", 'from buildtool.cc import cc_binary\ncc_binary(name="hello", srcs=["hello.cpp"])\n')
    r = workspace.build()
    assert r.rc == 0, r.output
    import subprocess

    assert subprocess.run([str(workspace.root / "hello")], capture_output=True, text=True).stdout == "hi from c++\n"


def test_prebuilt_objects_and_archives_in_srcs_are_linked(workspace: Workspace) -> None:
    """A .a (or .o) in a binary's srcs was taken for a header and left out of the link
    without a word ("undefined reference", exit 1); a library archives a .o given to it."""
    ws = workspace
    ws.write("f.c", "int f(void) { return 7; }\n")
    ws.write("g.c", "int g(void) { return 5; }\n")
    for stem in ("f", "g"):
        subprocess.run(["cc", "-c", f"{stem}.c", "-o", f"{stem}.o"], cwd=ws.root, check=True, timeout=60)
    subprocess.run(["ar", "rcs", "libf.a", "f.o"], cwd=ws.root, check=True, timeout=60)
    ws.write("main.c", "int f(void); int g(void); int main(void) { return f() + g() == 12 ? 0 : 1; }\n")
    ws.build_file("", 'from buildtool.cc import cc_binary, cc_library\n'
                      'cc_library(name="gl", srcs=["g.o"])\n'
                      'cc_binary(name="b", srcs=["main.c", "libf.a"], deps=[":gl"])\n')
    r = ws.build()
    assert r.rc == 0, r.output
    assert subprocess.run([str(ws.root / "b")], timeout=30).returncode == 0
    ws.write("f.c", "int f(void) { return 8; }\n")  # a new archive relinks
    subprocess.run(["cc", "-c", "f.c", "-o", "f.o"], cwd=ws.root, check=True, timeout=60)
    os.unlink(ws.root / "libf.a")
    subprocess.run(["ar", "rcs", "libf.a", "f.o"], cwd=ws.root, check=True, timeout=60)
    r = ws.build()
    assert r.rc == 0 and "//:b" in r.ran, r.output
    assert subprocess.run([str(ws.root / "b")], timeout=30).returncode == 1


def test_an_archive_a_genrule_makes_is_linked_from_deps_and_its_label_in_srcs_says_so(workspace: Workspace) -> None:
    """cc.md said deps take cc_library labels; a generated archive's target goes there (its
    label in srcs is compiled, and the failure now names deps)."""
    ws = workspace
    ws.write("f.c", "int f(void) { return 7; }\n")
    ws.write("main.c", "int f(void); int main(void) { return f() == 7 ? 0 : 1; }\n")
    build = ('from buildtool.cc import cc_binary\n'
             'genrule(name="gen", srcs=["f.c"], outs=["libgen.a"], tools=["cc", "ar"], '
             'cmd="cc -c f.c -o $$TMPDIR/f.o && ar rcs $@ $$TMPDIR/f.o")\n'
             'cc_binary(name="b", srcs=["main.c"{}], deps=[{}])\n')
    ws.build_file("", build.format("", '":gen"'))
    r = ws.build()
    assert r.rc == 0, r.output
    assert subprocess.run([str(ws.root / "b")], timeout=30).returncode == 0
    ws.build_file("", build.format(', ":gen"', ""))
    r = ws.build()
    assert r.rc == 1 and ":gen makes 0 C, C++ or assembly sources" in r.output, r.output
    assert "an archive or object to link, in deps" in r.output, r.output


def test_a_prebuilt_archive_by_file_label_is_linked_and_a_shared_library_is_refused(workspace: Workspace) -> None:
    """A prebuilt library in another package (by its file label) went to the compile step
    ("not a C, C++ or assembly source").  A .so is exit 2: where the binary finds it at run
    time (its SONAME, an rpath) is for linkopts to say."""
    ws = workspace
    ws.write("tp/h.c", "int h(void) { return 3; }\n")
    ws.build_file("tp", "")
    subprocess.run(["cc", "-c", "h.c", "-o", "h.o"], cwd=ws.root / "tp", check=True, timeout=60)
    subprocess.run(["ar", "rcs", "libh.a", "h.o"], cwd=ws.root / "tp", check=True, timeout=60)
    ws.write("t.c", "int h(void); int main(void) { return h() == 3 ? 0 : 1; }\n")
    ws.build_file("", 'from buildtool.cc import cc_test\ncc_test(name="t", srcs=["t.c", "//tp:libh.a"])\n')
    r = ws.build("//...", command="test")
    assert r.rc == 0 and r.status("//:t") == "ran", r.output
    ws.write("libs/libk.so", "")
    for entry in ("libs/libk.so", "//tp:libk.so.1"):
        ws.build_file("", f'from buildtool.cc import cc_test\ncc_test(name="t", srcs=["t.c", "{entry}"])\n')
        rc, out, err = ws.run("test")
        assert rc == 2 and f"srcs entry '{entry}' is a shared library: link it through linkopts" in err, out + err


@pytest.mark.parametrize(("call", "needle"), [
    ('cc_binary(name="b", srcs=["main.c", "notes.txt"])', "srcs entry 'notes.txt' is not a file the macro knows"),
    ('cc_library(name="l", srcs=["main.c", "libz.a"])', "list it in the srcs of the cc_binary or cc_test"),
])
def test_a_srcs_entry_of_no_known_kind_is_an_error(workspace: Workspace, call: str, needle: str) -> None:
    """Anything that was not a C source was taken for a header and silently left out."""
    workspace.write("main.c", "int main(void) { return 0; }\n")
    workspace.write("notes.txt", "x\n")
    workspace.write("libz.a", "!<arch>\n")
    workspace.build_file("", f"from buildtool.cc import cc_binary, cc_library\n{call}\n")
    rc, out, err = workspace.run("build")
    assert rc == 2 and needle in err and "BUILD.py:2" in err, out + err


@pytest.mark.parametrize("entry", ["../up.h", "/usr/include/stdio.h", "//q:include/q.h"])
def test_a_header_in_srcs_is_checked_like_a_source(workspace: Workspace, entry: str) -> None:
    """Headers in srcs are skipped (depfiles find them), but one outside the package was
    taken silently, and a header's file label was compiled ('not a C source', exit 1)."""
    workspace.write("q/include/q.h", "int q(void);\n")
    workspace.build_file("q", "")
    workspace.write("main.c", "int main(void) { return 0; }\n")
    workspace.build_file("", f"from buildtool.cc import cc_binary\ncc_binary(name='b', srcs=['main.c', {entry!r}])\n")
    rc, out, err = workspace.run("build")
    if entry.startswith("//"):
        assert rc == 0, out + err
    else:
        assert rc == 2 and "must be a path inside the package" in err and "BUILD.py:2" in err, out + err


def test_a_depfile_entry_missing_at_run_time_is_tracked_until_it_appears(workspace: Workspace) -> None:
    """A depfile may list a file that is not there (gcc -MG's header still to be made, a
    file the command tried): it was dropped, so the file appearing later never reran the
    target, which stayed stale for good."""
    workspace.write("main.c", "main\n")
    workspace.build_file("", 'genrule(name="use", srcs=["main.c"], outs=["use.out"], depfile="use.d",\n'
                             '        cmd="cat main.c $$(ls extra.h 2>/dev/null) > $@; '
                             "printf 'use.out: main.c extra.h\\\\n' > use.d\")\n")
    assert workspace.build().rc == 0
    assert workspace.read("use.out") == "main\n"
    r = workspace.build()
    assert r.rc == 0 and r.status("//:use") == "up_to_date", r.output  # still missing: nothing changed
    os.unlink(workspace.path("use.out"))  # the cache still answers it (a missing file in its key)
    r = workspace.build()
    assert r.rc == 0 and r.status("//:use") == "restored", r.output
    workspace.write("extra.h", "extra\n")
    r = workspace.build()
    assert r.rc == 0 and r.status("//:use") == "ran", r.output
    assert workspace.read("use.out") == "main\nextra\n"


def test_a_compiler_installed_after_a_build_is_seen_by_the_next(workspace: Workspace, tmp_path: Path) -> None:
    """A reviewer: the macros ask `which` for the compiler, outside the workspace, which the
    no-op snapshot never saw: once installed, the cc targets stayed out ("nothing changed")."""
    real = shutil.which("cc") or shutil.which("gcc")
    if real is None:
        pytest.skip("no C compiler here")
    bin_dir = tmp_path / "later-bin"
    bin_dir.mkdir()
    env = {"CC": "rv2cc", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    workspace.write("main.c", "int main(void) { return 0; }\n")
    workspace.build_file("", 'from buildtool.cc import cc_binary\ncc_binary(name="hello", srcs=["main.c"])\n'
                             'genrule(name="other", outs=["o.txt"], cmd="echo o > $@")\n')
    time.sleep(0.1)
    rc, out, err = workspace.run("build", env_extra=env)
    assert rc == 0 and not workspace.exists("hello"), out + err
    (bin_dir / "rv2cc").symlink_to(real)
    rc, out, err = workspace.run("build", env_extra=env)  # (no --events: the snapshot's path)
    assert rc == 0 and workspace.exists("hello") and "nothing changed" not in out, out + err


def test_where_the_macros_looked_for_the_compiler_is_no_watch_and_no_error(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The candidates are snapshot files, not probes (watch mode watched every PATH
    directory for them); a relative PATH entry, from a working directory that was deleted
    (`-C`), is skipped, not a BUILD.py error (a reviewer's two findings)."""
    from conftest import BUILDTOOL, _clean_env

    from buildtool.loader import Loader
    from buildtool.workspace import Workspace as Ws

    workspace.write("main.c", "int main(void) { return 0; }\n")
    workspace.build_file("", 'from buildtool.cc import cc_binary\ncc_binary(name="hello", srcs=["main.c"])\n')
    monkeypatch.setenv("PATH", f"/nonexistent-bin:{os.environ['PATH']}")
    loader = Loader(Ws(str(workspace.root), "", ()))
    loader.load("")
    assert "/nonexistent-bin/cc" in loader.looked_for and not any(p.startswith("/") for p in loader.probes)
    gone = tmp_path / "gone"
    env = _clean_env(workspace.cache, workspace.home)
    env["PATH"] = ".:" + env["PATH"]
    r = subprocess.run(["sh", "-c", f'mkdir -p "{gone}" && cd "{gone}" && rmdir "{gone}" && '
                       f'"$0" -C "{workspace.root}" build', BUILDTOOL], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr


def test_an_include_written_with_a_double_slash_inside_the_package_path_compiles(workspace: Workspace) -> None:
    """`includes=["//app//inc"]` in package app: the path from the package, worked out
    without os.getcwd(), came out absolute (-I/inc)."""
    ws = workspace
    ws.write("app/inc/h.h", "#define V 3\n")
    ws.write("app/m.c", '#include "h.h"\nint main(void) { return V == 3 ? 0 : 1; }\n')
    ws.build_file("app", 'from buildtool.cc import cc_binary\n'
                         'cc_binary(name="m", srcs=["m.c"], includes=["//app//inc"])\n')
    r = ws.build()
    assert r.rc == 0, r.output


def test_a_binary_named_as_a_module_buildtool_imports_lazily_builds(workspace: Workspace) -> None:
    """Outputs a BUILD.py's own code looks for may not be made; the paths buildtool's own
    imports and compiler lookups try during an evaluation (zlib, shutil, bin/cc) are not
    such looks: a first version refused `cc_binary(name="zlib")` at the root."""
    ws = workspace
    ws.write("m.c", "int main(void) { return 0; }\n")
    ws.build_file("", 'from buildtool.cc import cc_binary\n'
                      'cc_binary(name="zlib", srcs=["m.c"])\ncc_binary(name="shutil", srcs=["m.c"])\n')
    rc, out, err = ws.run("build")  # (not ws.build(): --events imports what the evaluation's imports would try)
    assert rc == 0 and (ws.root / "zlib").exists() and (ws.root / "shutil").exists(), out + err
