"""Labels and patterns: parsing rules (unit) and how the CLI resolves them (end to end)."""

from __future__ import annotations

import pytest
from conftest import Workspace

from buildtool import labels
from buildtool.labels import LabelError, parse_label, parse_pattern


@pytest.mark.parametrize(
    ("text", "cur", "expected"),
    [
        ("//pkg/path:name", "", ("pkg/path", "name")),
        ("//pkg/path", "", ("pkg/path", "path")),
        ("//:root_target", "other", ("", "root_target")),
        (":x", "a/b", ("a/b", "x")),
        (":x", "", ("", "x")),
        ("//a:n.a-m_e+1=2,3@4~5", "", ("a", "n.a-m_e+1=2,3@4~5")),
    ],
)
def test_parse_label_forms(text: str, cur: str, expected: tuple[str, str]) -> None:
    assert parse_label(text, cur) == expected


@pytest.mark.parametrize(
    "text",
    [
        "pkg:name",  # neither // nor :
        "//",  # names no target
        "//a:",  # empty name
        "//a:b c",  # space not allowed
        "//a:b/c",  # slash not allowed in a name
        "//a/../b:c",  # .. component
        "//a//b:c",  # empty component
        "//a:..",
        ":",
        "//a:b$",
    ],
)
def test_parse_label_rejects(text: str) -> None:
    with pytest.raises(LabelError):
        parse_label(text, "")


def test_label_error_names_allowed_characters() -> None:
    with pytest.raises(LabelError) as e:
        parse_label("//a:b c", "")
    assert labels.ALLOWED_NAME_CHARS_TEXT in str(e.value)
    assert "'//a:b c'" in str(e.value)
    for bazel in ("//a:*", ":*"):  # (Bazel's form: ours is said)
        with pytest.raises(LabelError, match=r"every target of a package is ':all' \(//pkg:all\)"):
            parse_pattern(bazel, "")


@pytest.mark.parametrize(("text", "hint"), [("pkg:lib", "did you mean '//pkg:lib'?"), ("a/b", "did you mean '//a/b'?"),
                                             ("BUILD.py", None), ("/abs/x:y", None), ("@repo//x:y", None),
                                             ("-//lib:gen", None)])
def test_a_label_without_slashes_hints_at_the_absolute_one(text: str, hint: str | None) -> None:
    with pytest.raises(LabelError) as e:
        parse_label(text, "")
    assert (hint in str(e.value)) if hint else ("did you mean" not in str(e.value))
    if text.startswith("@"):
        assert "external repositories" in str(e.value)


@pytest.mark.parametrize(("text", "cwd", "needle"), [
    ("core", "lib/core", "(got 'core')"),  # the graph knows whether :core exists, and hints then
    ("//lib/.../", "", "ends with '/': write '//lib/...'"),
    ("//lib/core/", "", "ends with '/': write '//lib/core' (its target named 'core') or '//lib/core:NAME'"),
    ("//...:all", "", "'...' ends a pattern (//... or //pkg/...), it is no package name"),
    ("//a/.../b:c", "", "'...' ends a pattern"),
])
def test_hints_for_labels_typed_on_the_command_line(text: str, cwd: str, needle: str) -> None:
    """From lib/, `core:core` is //lib/core:core, not //core:core; `//lib/core/` was told to
    "write //:NAME for the root package"; `//...:all` looked for a package named '...'."""
    with pytest.raises(LabelError) as e:
        parse_pattern(text, cwd, cwd)
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize(("text", "cwd", "kind", "pkg", "name"), [
    ("core:core", "lib", "target", "lib/core", "core"), ("core:all", "lib", "package", "lib/core", ""),
    ("core/x", "lib", "target", "lib/core/x", "x"), ("a/b:c", "", "target", "a/b", "c"),
    ("core:core", "docs/notes", "target", "docs/notes/core", "core"),  # (a directory that is no package)
])
def test_a_label_without_its_slashes_is_taken_from_the_working_directory(
        text: str, cwd: str, kind: str, pkg: str, name: str) -> None:
    """As Bazel's command line takes `core:core` from lib/: //lib/core:core (it was
    refused with a "did you mean"); `sub/...` was taken so already."""
    p = parse_pattern(text, cwd, cwd)
    assert (p.kind, p.pkg, p.name, p.text) == (kind, pkg, name, text)


def test_label_str_and_split_round_trip() -> None:
    assert labels.label_str("", "x") == "//:x"
    assert labels.label_str("a/b", "x") == "//a/b:x"
    assert labels.split_label("//a/b:x") == ("a/b", "x")
    assert labels.split_label("//:x") == ("", "x")


@pytest.mark.parametrize(
    ("text", "cur", "kind", "pkg", "name"),
    [
        ("//...", "sub", "recursive", "", ""),
        ("...", "sub", "recursive", "sub", ""),
        ("//a/...", "", "recursive", "a", ""),
        ("b/...", "a", "recursive", "a/b", ""),
        ("//a:all", "", "package", "a", ""),
        (":all", "a", "package", "a", ""),
        ("//a:t", "", "target", "a", "t"),
        ("//a", "", "target", "a", "a"),
        ("//x/all", "", "target", "x/all", "all"),  # (a package named all, not //x:all)
        ("//x/all:all", "", "package", "x/all", ""),
    ],
)
def test_parse_pattern(text: str, cur: str, kind: str, pkg: str, name: str) -> None:
    p = parse_pattern(text, cur)
    assert (p.kind, p.pkg, p.name) == (kind, pkg, name)


def test_relative_recursive_patterns_start_at_the_working_directory() -> None:
    # Working directory lib/ (not a package; the nearest one is the root): as in Bazel,
    # `...` is //lib/..., not the whole workspace, while `:name` is the nearest package's.
    assert (parse_pattern("...", "", "lib").pkg, parse_pattern("a/...", "", "lib").pkg) == ("lib", "lib/a")
    assert parse_pattern(":t", "", "lib").pkg == ""
    assert parse_pattern("//...", "", "lib").pkg == ""
    # In a directory whose name is no label's (`my dir`), `./...` and `sub/...` are `...`'s
    # kin: the working directory's path need not be names (they were exit 2, `...` was not).
    got = [parse_pattern(t, "", "my dir").pkg for t in ("...", "./...", "sub/...")]
    assert got == ["my dir", "my dir", "my dir/sub"]
    assert parse_pattern("../...", "", "my dir/x").pkg == "my dir"
    with pytest.raises(LabelError, match=r"bad pattern 'a b/\.\.\.'"):
        parse_pattern("a b/...", "", "my dir")


def test_bad_recursive_pattern() -> None:
    with pytest.raises(LabelError):
        parse_pattern("//a/../b/...", "")


def test_a_relative_pattern_that_climbs_out_of_the_workspace_is_refused() -> None:
    # From a/, ../../x/... is x/... of the directory above the workspace (not just "..").
    with pytest.raises(LabelError, match="it leads out of the workspace"):
        parse_pattern("../../x/...", "", "a")
    assert parse_pattern("../x/...", "", "a").pkg == "x"


# -- end to end: how the CLI resolves labels and patterns -----------------------------


def _two_packages(ws: Workspace) -> None:
    ws.build_file("", 'genrule(name="top", outs=["top.out"], cmd="echo top > $@")\n')
    ws.build_file(
        "lib",
        """
        genrule(name="lib", outs=["lib.out"], cmd="echo lib > $@")
        genrule(name="extra", outs=["extra.out"], cmd="echo extra > $@")
        genrule(name="manual_one", outs=["manual.out"], cmd="echo m > $@", manual=True)
        """,
    )
    ws.build_file("lib/sub", 'genrule(name="deep", outs=["deep.out"], cmd="echo deep > $@")\n')


def test_pkg_shorthand_builds_target_named_after_last_component(workspace: Workspace) -> None:
    _two_packages(workspace)
    r = workspace.build("//lib")
    assert r.rc == 0, r.output
    assert set(r.by_label) == {"//lib:lib"}
    assert workspace.read("lib/lib.out") == "lib\n"
    assert not workspace.exists("lib/extra.out")


def test_relative_label_uses_the_enclosing_package_of_cwd(workspace: Workspace) -> None:
    _two_packages(workspace)
    (workspace.root / "lib" / "notapkg").mkdir()
    # Started in lib/notapkg (no BUILD.py): the nearest enclosing package is //lib.
    r = workspace.build(":extra", cwd=workspace.root / "lib" / "notapkg")
    assert r.rc == 0, r.output
    assert set(r.by_label) == {"//lib:extra"}


def test_wildcards_skip_manual_targets_but_naming_builds_them(workspace: Workspace) -> None:
    _two_packages(workspace)
    r = workspace.build("//...")
    assert r.rc == 0, r.output
    assert set(r.by_label) == {"//:top", "//lib:lib", "//lib:extra", "//lib/sub:deep"}
    r = workspace.build("//lib:all")
    assert set(r.by_label) == {"//lib:lib", "//lib:extra"}
    r = workspace.build("//lib/...")
    assert set(r.by_label) == {"//lib:lib", "//lib:extra", "//lib/sub:deep"}
    r = workspace.build("//lib:manual_one")
    assert r.rc == 0, r.output
    assert set(r.by_label) == {"//lib:manual_one"}
    assert workspace.read("lib/manual.out") == "m\n"


def test_no_pattern_means_everything(workspace: Workspace) -> None:
    _two_packages(workspace)
    r = workspace.build(cwd=workspace.root / "lib")
    assert r.rc == 0, r.output
    assert set(r.by_label) == {"//:top", "//lib:lib", "//lib:extra", "//lib/sub:deep"}


def test_pattern_matching_nothing_is_exit_2(workspace: Workspace) -> None:
    _two_packages(workspace)
    workspace.build_file("empty", "")
    rc, _, err = workspace.run("build", "//empty:all")
    assert rc == 2
    assert "//empty:all" in err


def test_an_ignored_package_is_said_to_be_ignored(workspace: Workspace) -> None:
    workspace.build_file("ign/p", 'genrule(name="y", outs=["y"], cmd="true")')
    workspace.write(".buildtoolignore", "ign\n")
    rc, _, err = workspace.run("build", "//ign/p:y")
    assert rc == 2 and "ign/p is left out by .buildtoolignore" in err, err  # (it said "there is no BUILD.py")
    rc, _, err = workspace.run("build", ":y", cwd=workspace.root / "ign" / "p")  # (it said "no package //")
    assert rc == 2 and "no package //ign/p for ':y' (the working directory's): ign/p is left out by " \
        ".buildtoolignore" in err, err
    # In a BUILD.py, and as a pattern: both said there was no package or no BUILD.py, no more.
    rc, _, err = workspace.run("build", "//ign/...")
    assert rc == 2 and "matches no package: ign is left out by .buildtoolignore" in err, err
    workspace.write(".buildtoolignore", "ign/p\n")
    rc, _, err = workspace.run("build", "//ign/...")
    assert rc == 2 and "that buildtool loads (.buildtoolignore leaves out ign/p)" in err, err
    workspace.build_file("", 'genrule(name="u", srcs=["//ign/p:y"], outs=["u"], cmd="true")')
    rc, _, err = workspace.run("build", "//:u")
    assert rc == 2 and "BUILD.py:1" in err and "no package //ign/p: ign/p is left out by .buildtoolignore" in err, err


def test_a_package_below_a_directory_an_ignore_pattern_matches_is_ignored_too(workspace: Workspace) -> None:
    """`*/fixtures` left //a:x's fixtures out of //..., but //a/fixtures/sub:x still built when
    named, and //a/fixtures/sub/... said there was no BUILD.py below it."""
    for d in ("a", "a/fixtures", "a/fixtures/sub"):
        workspace.build_file(d, 'genrule(name="x", outs=["x.out"], cmd="echo x > $@")\n')
    workspace.write(".buildtoolignore", "*/fixtures\n")
    rc, out, err = workspace.run("query", "//...")
    assert rc == 0 and out.split() == ["//a:x"], (out, err)
    rc, _, err = workspace.run("build", "//a/fixtures/sub:x")
    assert rc == 2 and "a/fixtures/sub is left out by .buildtoolignore" in err, err
    assert not workspace.exists("a/fixtures/sub/x.out")
    rc, _, err = workspace.run("build", "//a/fixtures/sub/...")
    assert rc == 2 and "a/fixtures/sub is left out by .buildtoolignore" in err, err


def test_an_ignored_name_with_a_leading_hash_or_space_is_written_with_a_bracket_class(workspace: Workspace) -> None:
    """As user-guide.md says: lines are stripped and `#` starts a comment, so `[#]draft`
    and `[ ]lead` name such directories."""
    for d in ("#draft", " lead", "kept"):
        workspace.build_file(d, 'genrule(name="x", outs=["x.out"], cmd="echo x > $@")\n')
    workspace.write(".buildtoolignore", "#draft\n lead\n")  # (a comment, and "lead")
    rc, out, err = workspace.run("query", "//...")
    assert rc == 0 and sorted(out.splitlines()) == ["// lead:x", "//#draft:x", "//kept:x"], (out, err)
    workspace.write(".buildtoolignore", "[#]draft\n[ ]lead\n")
    rc, out, err = workspace.run("query", "//...")
    assert rc == 0 and out.splitlines() == ["//kept:x"], (out, err)


def test_unknown_package_suggests_close_match(workspace: Workspace) -> None:
    _two_packages(workspace)
    rc, _, err = workspace.run("build", "//lbi:lib")
    assert rc == 2
    assert "did you mean //lib" in err


def test_malformed_label_on_command_line_is_exit_2(workspace: Workspace) -> None:
    _two_packages(workspace)
    rc, _, err = workspace.run("build", "//lib:bad name")
    assert rc == 2
    assert "bad name" in err


@pytest.mark.parametrize(("text", "cur", "expected"), [
    ("//lib:include/calc.h", "", ("lib", "include/calc.h")),
    (":include/calc.h", "lib", ("lib", "include/calc.h")),
    ("//:a/b/c", "x", ("", "a/b/c")),
    ("//lib:calc.h", "", None),  # no directory: parse_label's business
    ("//lib:include/../x.h", "", None),
    ("//lib:include//x.h", "", None),
    ("//lib:/x.h", "", None),
    ("//lib:x.h/", "", None),
    ("lib:include/x.h", "", None),
])
def test_file_label_names_a_file_below_its_package(text: str, cur: str, expected: tuple[str, str] | None) -> None:
    assert labels.file_label(text, cur) == expected
    if expected is not None:  # never a target's label
        with pytest.raises(labels.LabelError):
            labels.parse_label(text, cur)


@pytest.mark.parametrize("text", ["//./lib:x", "//lib/.:x", "//lib/..:x", "//a/./b:x"])
def test_a_dot_or_dot_dot_component_is_no_package(text: str) -> None:
    with pytest.raises(LabelError, match="package path must be names of"):
        parse_label(text, "")


def test_a_file_label_with_a_dot_component_is_no_file_label() -> None:
    assert labels.file_label(":./a.h", "lib") is None and labels.file_label("//lib:inc/../a.h", "") is None
    assert labels.file_label(":inc/a.h", "lib") == ("lib", "inc/a.h")


def test_the_root_alone_and_a_dash_pattern_are_refused_clearly() -> None:
    with pytest.raises(LabelError, match=r"names no target: write //:NAME for the root package"):
        parse_label("//", "")
    with pytest.raises(LabelError):  # (Bazel's exclusion, or an option: never the package -sub below here)
        parse_pattern("-sub:x", "", "lib")
