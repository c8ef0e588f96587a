"""``buildtool query`` and ``buildtool graph``."""

from __future__ import annotations

import json

from conftest import Workspace


def _ws(ws: Workspace) -> None:
    ws.write("lib/src.txt", "x\n")
    ws.build_file("lib", """
genrule(name="gen", srcs=["src.txt"], outs=["gen.h"], cmd="cp $< $@")
genrule(name="lib", srcs=[":gen"], outs=["lib.a", "lib.idx"], cmd="cp $< lib.a; cp $< lib.idx")
""")
    ws.build_file("app", """
genrule(name="app", deps=["//lib"], outs=["app.bin"], cmd="cat ../lib/lib.a > $@")
test(name="app_test", deps=[":app"], cmd="true")
genrule(name="other", outs=["o.txt"], cmd="echo > $@")
genrule(name="deploy", deps=[":app"], outs=["d.txt"], cmd="echo > $@", manual=True)
""")


def _q(ws: Workspace, expr: str) -> list[str]:
    rc, out, err = ws.run("query", expr)
    assert rc == 0, err
    return out.split()


def test_deps_rdeps_outputs(workspace: Workspace) -> None:
    _ws(workspace)
    assert sorted(_q(workspace, "deps(//app:app)")) == ["//app:app", "//lib:gen", "//lib:lib"]
    assert sorted(_q(workspace, "rdeps(//..., //lib:gen)")) == ["//app:app", "//app:app_test", "//lib:gen", "//lib:lib"]
    # manual targets are outside the //... universe unless named
    assert "//app:deploy" in _q(workspace, "rdeps(//app:deploy, //lib:gen)")
    assert _q(workspace, "outputs(//app:app)") == ["app/app.bin", "lib/gen.h", "lib/lib.a", "lib/lib.idx"]
    assert sorted(_q(workspace, "//app:all")) == ["//app:app", "//app:app_test", "//app:other"]
    assert not workspace.exists("app/app.bin")  # nothing was built
    # Several patterns in one argument: their union, as the bare form takes them (it was
    # "bad label '//app:other //lib:gen'").
    assert sorted(_q(workspace, "deps(//app:other //lib:gen)")) == ["//app:other", "//lib:gen"]
    assert sorted(_q(workspace, "rdeps(//app:app //app:other, //lib:gen)")) == ["//app:app", "//lib:gen", "//lib:lib"]
    # Within the universe's closure, TARGET too (as Bazel's): both printed targets outside it.
    assert _q(workspace, "rdeps(//app:other, //lib:gen)") == []
    assert sorted(_q(workspace, "rdeps(//lib:lib, //...)")) == ["//lib:gen", "//lib:lib"]


def test_rdeps_refuses_the_file_labels_srcs_refuses_saying_why(workspace: Workspace) -> None:
    """A file of a plain directory named as a package, a subpackage's file named through its
    parent, a missing file below a package: srcs refuses them (exit 2), query printed
    readers, or said the label was badly formed."""
    workspace.build_file("lib", 'genrule(name="l", srcs=["nonpkg/d.txt"], outs=["l.out"], cmd="cat $(SRCS) > $@")\n')
    workspace.build_file("lib/sub", 'genrule(name="u", srcs=["s.txt"], outs=["u.out"], cmd="cat $(SRCS) > $@")\n')
    workspace.write("lib/nonpkg/d.txt", "d\n")
    workspace.write("lib/sub/s.txt", "s\n")
    for label, said in [("//lib/nonpkg:d.txt", "no package //lib/nonpkg"),
                        ("//lib:sub/s.txt", "is in package //lib/sub, not //lib: refer to it as '//lib/sub:s.txt'"),
                        ("//lib:nonpkg/missing.txt", "names no target and there is no file lib/nonpkg/missing.txt")]:
        rc, out, err = workspace.run("query", f"rdeps(//..., {label})")
        assert rc == 2 and out == "" and said in err, (label, out, err)
    assert _q(workspace, "rdeps(//..., //lib:nonpkg/d.txt)") == ["//lib:l"]
    assert _q(workspace, "rdeps(//..., //lib/sub:s.txt)") == ["//lib/sub:u"]


def test_rdeps_of_a_source_file_are_the_targets_that_read_it(workspace: Workspace) -> None:
    """"Which tests cover core.py?": rdeps(//..., //lib:src/core.py) was "bad label", though
    srcs takes that label."""
    _ws(workspace)
    workspace.write("lib/sub/deep.txt", "d\n")
    workspace.build_file("lib", 'genrule(name="gen", srcs=["src.txt", "sub/deep.txt"], outs=["gen.h"], '
                                'cmd="cat $(SRCS) > $@")\n'
                                'genrule(name="lib", srcs=[":gen"], outs=["lib.a", "lib.idx"], '
                                'cmd="cp $< lib.a; cp $< lib.idx")\n')
    want = ["//app:app", "//app:app_test", "//lib:gen", "//lib:lib"]
    assert sorted(_q(workspace, "rdeps(//..., //lib:src.txt)")) == want
    assert sorted(_q(workspace, "rdeps(//..., //lib:sub/deep.txt)")) == want
    assert _q(workspace, "rdeps(//app:other, //lib:src.txt)") == []  # (no target of that universe reads it)
    # ... which is said: an empty answer read as "no target reads it, safe to edit", while a
    # test may read it undeclared (untracked).
    rc, out, err = workspace.run("query", "rdeps(//app:other, //lib:src.txt)")
    assert rc == 0 and out == "" and "no target of //app:other reads lib/src.txt: it is in no target's srcs" in err, err
    rc, out, err = workspace.run("query", "rdeps(//..., //lib:src.txt)")
    assert rc == 0 and "no target" not in err, err
    # A pyrule's module (and one it imports) is read by it, though in no srcs.
    workspace.write("tools/__init__.py", "")
    workspace.write("tools/h.py", "X = 1\n")
    workspace.write("tools/mk.py", "from tools import h\ndef run(srcs, outs):\n    open(outs[0], 'w').write('x')\n")
    workspace.build_file("gen", 'pyrule(name="p", fn="tools.mk:run", outs=["p.txt"])\n')
    assert _q(workspace, "rdeps(//..., //:tools/h.py)") == ["//gen:p"]
    rc, _, err = workspace.run("query", "rdeps(//..., //lib:nothere.txt)")
    assert rc == 2 and "nothere.txt" in err, err


def test_rdeps_of_an_output_are_what_reads_it_and_a_path_gets_its_label(workspace: Workspace) -> None:
    """A built output's label answered nothing (exit 0: "nothing uses it") where before the
    build it was an error naming its target; now, before and after, the targets that read
    it (its maker's dependents; a depfile naming it) and theirs.  A path typed as Make takes
    it (``lib/src.txt``) got only "a label must start with '//'"."""
    _ws(workspace)
    workspace.build_file("use", """
        genrule(name="use", srcs=["main.c"], outs=["use.o"], depfile="use.d",
                cmd="cat main.c ../lib/gen.h > $@; echo 'use.o: main.c ../lib/gen.h' > use.d")
        genrule(name="top", srcs=[":use"], outs=["top.txt"], cmd="cp $< $@")
    """)
    workspace.write("use/main.c", "m\n")
    readers = ["//app:app", "//app:app_test", "//lib:lib"]
    assert sorted(_q(workspace, "rdeps(//..., //lib:gen.h)")) == readers  # (before any build)
    assert workspace.build("//app:app").rc == 0 and workspace.build("//use:top").rc == 0
    assert workspace.exists("lib/gen.h")
    # (the depfile named it: use reads it, though it lists neither the file nor its maker)
    assert sorted(_q(workspace, "rdeps(//..., //lib:gen.h)")) == sorted([*readers, "//use:top", "//use:use"])
    assert _q(workspace, "rdeps(//..., //lib:lib.idx)") == ["//app:app", "//app:app_test"]
    rc, _, err = workspace.run("query", "rdeps(//..., lib/src.txt)")
    assert rc == 2 and "'lib/src.txt' is a file path, not a label: did you mean '//lib:src.txt'?" in err, err
    rc, _, err = workspace.run("query", "rdeps(//..., src.txt)", cwd=workspace.root / "lib")
    assert rc == 2 and "did you mean '//lib:src.txt'?" in err, err
    rc, _, err = workspace.run("query", "rdeps(//..., gen.h)", cwd=workspace.root / "lib")
    assert rc == 2 and "did you mean '//lib:gen.h'?" in err, err
    rc, _, err = workspace.run("query", "rdeps(//..., nothere.txt)")
    assert rc == 2 and "a label must start with '//' or ':'" in err, err
    assert sorted(_q(workspace, "rdeps(//..., //lib:src.txt)")) == ["//app:app", "//app:app_test", "//lib:gen",
                                                                  "//lib:lib"]


def test_rdeps_of_a_file_label_typed_without_slashes_is_taken_from_the_working_directory(
        workspace: Workspace) -> None:
    """`rdeps(//..., core:c.txt)` from lib/ is //lib/core:c.txt, as patterns take it."""
    workspace.build_file("lib/core", 'genrule(name="c", outs=["c.txt"], cmd="echo > $@")\n'
                                     'genrule(name="u", srcs=[":c"], outs=["u.txt"], cmd="cat $< > $@")\n')
    lib = workspace.root / "lib"
    rc, out, err = workspace.run("query", "rdeps(//..., core:c.txt)", cwd=lib)
    rc2, out2, err2 = workspace.run("query", "rdeps(//..., //lib/core:c.txt)", cwd=lib)
    assert rc == rc2 == 0 and out == out2 and "//lib/core:u" in out, (out, err, out2, err2)


def test_a_recursive_pattern_takes_its_package_and_those_below_only(workspace: Workspace) -> None:
    """The packages of ``//a/b/...`` are a slice of the sorted package list (a scan of every
    package per pattern was quadratic in patterns x packages): not a/b-c nor a/bz, which
    sort beside them, nor a/b's parent."""
    for pkg in ("a", "a/b", "a/b-c", "a/b/x", "a/b/x/y", "a/bz", "ab", "b"):  # (ab: a prefix, no subpackage)
        workspace.build_file(pkg, 'genrule(name="t", outs=["t.txt"], cmd="echo > $@")\n')
    assert _q(workspace, "//a/b/...") == ["//a/b:t", "//a/b/x:t", "//a/b/x/y:t"]
    assert _q(workspace, "//a/...") == ["//a:t", "//a/b:t", "//a/b-c:t", "//a/b/x:t", "//a/b/x/y:t", "//a/bz:t"]
    assert len(_q(workspace, "//...")) == 8
    workspace.write("c/d/e/BUILD.py", 'genrule(name="t", outs=["t.txt"], cmd="echo > $@")\n')
    assert _q(workspace, "//c/...") == ["//c/d/e:t"]  # (c is no package: those below it still are)


def test_a_label_with_a_comma_goes_in_quotes(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="a,b", outs=["o"], cmd="echo > $@")\n'
                             'genrule(name="c", srcs=[":a,b"], outs=["c.out"], cmd="cat $< > $@")')
    assert _q(workspace, 'deps("//:a,b")') == ["//:a,b"]
    assert sorted(_q(workspace, "rdeps(//..., '//:a,b')")) == ["//:a,b", "//:c"]
    rc, _, err = workspace.run("query", "deps(//:a,b)")
    assert rc == 2 and 'goes in quotes: deps("//:a,b")' in err, err
    # Quoted and bare patterns in one argument (refused as two arguments), a quote left
    # open (said as "takes 1 argument, got 2").
    assert sorted(_q(workspace, 'outputs(//:c "//:a,b")')) == ["c.out", "o"]
    rc, _, err = workspace.run("query", 'deps("//:a,b)')
    assert rc == 2 and 'a " is left open' in err, err


def test_bad_queries_exit_2(workspace: Workspace) -> None:
    _ws(workspace)
    for expr, word in (("deps(//app:nope)", "//app:nope"), ("frob(//...)", "frob"), ("rdeps(//...)", "rdeps"),
                       ("deps(", "unbalanced parentheses (1 '(' and 0 ')')"),
                       ("deps(//app:greet))", "unbalanced"), ("deps(deps(//app:greet))", "do not nest"),
                       ("deps(//app:greet) deps(//app:greet)", "one function a query"),  # (was "do not nest")
                       ("x deps(//...)", "expected deps(PATTERN)"),
                       ("deps(//app:greet,)", "argument 2 is empty"), ("rdeps(, //app:greet)", "argument 1 is empty")):
        rc, _, err = workspace.run("query", expr)
        assert rc == 2, (expr, err)
        assert word in err, (expr, err)


def test_graph_dot_and_json(workspace: Workspace) -> None:
    _ws(workspace)
    rc, out, err = workspace.run("graph", "//app:app")
    assert rc == 0, err
    assert out.startswith("digraph") and '"//app:app" -> "//lib:lib";' in out and '"//lib:lib" -> "//lib:gen";' in out
    rc, out, err = workspace.run("graph", "--format", "json")
    data = json.loads(out)
    by = {t["label"]: t for t in data["targets"]}
    assert by["//app:app_test"]["kind"] == "test" and by["//app:app_test"]["deps"] == ["//app:app"]
    assert by["//lib:lib"]["outs"] == ["lib/lib.a", "lib/lib.idx"]
    assert "//app:deploy" not in by


def test_graph_dot_gives_a_non_utf8_package_and_one_named_like_its_escape_two_nodes(workspace: Workspace) -> None:
    """Both were "//bad\\\\xff:g": Graphviz merged the two packages into one node."""
    import os

    for raw in (b"bad\xff", b"bad\\xff"):
        d = os.path.join(os.fsencode(workspace.root), raw)
        os.mkdir(d)
        with open(os.path.join(d, b"BUILD.py"), "w") as f:
            f.write('genrule(name="g", outs=["o"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("graph")
    nodes = [ln for ln in out.splitlines() if ln.startswith('  "//bad')]
    assert rc == 0 and len(set(nodes)) == 2, out + err


def test_graph_dot_writes_a_non_ascii_label_as_it_is(workspace: Workspace) -> None:
    """JSON's quoting wrote //caf\\u00e9:n, which Graphviz shows as such (DOT has no \\u)."""
    workspace.build_file("caf\u00e9", 'genrule(name="n", outs=["n"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("graph")
    assert rc == 0 and '  "//caf\u00e9:n";' in out and "\\u00e9" not in out, out + err
    for command in (["graph"], ["query", "//..."]):  # UTF-8 whatever the locale's encoding (print()'s)
        rc, out, err = workspace.run(*command, env_extra={"PYTHONIOENCODING": "ascii"})
        assert rc == 0 and "//caf\u00e9:n" in out and "Traceback" not in err, out + err


def test_inputs_lists_what_the_targets_read_with_their_last_depfile_s_headers(workspace: Workspace) -> None:
    """`ninja -t deps` shows the headers a compile's depfile recorded; `deps()` printed the
    target alone and no query showed them."""
    workspace.build_file("lib", """
        genrule(name="gen", outs=["gen.h"], cmd="echo g > $@")
        genrule(name="o", srcs=["a.c"], deps=[":gen"], outs=["a.o", "a.d"], depfile="a.d",
                cmd="cat a.c gen.h extra.h > a.o && echo 'a.o: a.c gen.h extra.h /usr/include/stdio.h' > a.d")
    """)
    workspace.write("lib/a.c", "a\n")
    workspace.write("lib/extra.h", "e\n")
    rc, out, err = workspace.run("query", "inputs(//lib:o)")
    assert rc == 0 and out.split() == ["lib/a.c", "lib/gen.h"] and "no build record here (//lib:o)" in err, (out, err)
    assert workspace.build("//lib:o").rc == 0
    rc, out, err = workspace.run("query", "inputs(//lib:o)")
    assert rc == 0 and out.split() == ["lib/a.c", "lib/extra.h", "lib/gen.h"] and err == "", (out, err)


def test_kind_and_tests_select_targets_as_bazel_s_do(workspace: Workspace) -> None:
    """A Bazel user's `query 'kind(test, //...)'` and `tests(//...)` were exit 2."""
    _ws(workspace)
    workspace.build_file("suite", """
test(name="t1", cmd="true")
group(name="inner", deps=[":t1", "//app:app_test"])
group(name="all_tests", deps=[":inner", "//app:other"])
""")
    assert _q(workspace, "kind(test, //...)") == ["//app:app_test", "//suite:t1"]
    assert _q(workspace, "kind('^gen', //lib/... //app:other)") == ["//lib:gen", "//lib:lib", "//app:other"]
    assert _q(workspace, "kind(group, //suite:all)") == ["//suite:inner", "//suite:all_tests"]
    # tests(): the tests matched, and those a group holds through its groups (a test suite)
    assert _q(workspace, "tests(//suite:all_tests)") == ["//suite:t1", "//app:app_test"]
    assert _q(workspace, "tests(//lib/...)") == []
    # Nested as Bazel users write it: of deps(), rdeps(), or each other.
    assert sorted(_q(workspace, "kind(test, deps(//suite:all_tests))")) == ["//app:app_test", "//suite:t1"]
    assert sorted(_q(workspace, "kind(genrule, deps(//app:app))")) == ["//app:app", "//lib:gen", "//lib:lib"]
    assert _q(workspace, "tests(rdeps(//app/..., //lib:gen))") == ["//app:app_test"]
    assert _q(workspace, "kind('(gen|test)', tests(//suite:all_tests))") == ["//suite:t1", "//app:app_test"]
    for expr, word in (("kind(test)", "kind() takes 2 arguments"), ("kind([, //...)", "not a regular expression"),
                       ("tests(//nope/...)", "//nope"), ("kind(test, outputs(//app:app))", "gives files"),
                       ("kind(deps(//app:app))", "kind() takes 2 arguments"),
                       ("deps(kind(test, //...))", "do not nest"),
                       ("kind(test, deps(//app:nope))", "//app:nope")):
        rc, _, err = workspace.run("query", expr)
        assert rc == 2 and word in err, (expr, err)


def test_a_path_typed_in_a_non_package_directory_gets_the_right_label(workspace: Workspace) -> None:
    workspace.build_file("lib", 'genrule(name="g", srcs=["sub/deep.txt"], outs=["o"], cmd="cat $(SRCS) > $@")\n')
    workspace.write("lib/sub/deep.txt", "x\n")
    rc, _, err = workspace.run("query", "rdeps(//..., lib/sub/deep.txt)")
    assert rc == 2 and "did you mean '//lib:sub/deep.txt'" in err, err
