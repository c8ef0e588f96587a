"""The fixed substitution table of genrule/test commands (unit) and in real builds."""

from __future__ import annotations

import pytest
from conftest import Workspace

from buildtool.subst import SubstError, substitute

LOC = {
    "a.txt": ["a.txt"],
    ":gen": ["gen/one.h", "gen/two.h"],
    "//x:y": ["../x/y.out"],
    "my file.txt": ["my file.txt"],
    "paren(x).txt": ["paren(x).txt"],
    "a(b.txt": ["a(b.txt"],
    ":stamp": [],  # (a genrule without outs)
}


def sub(cmd: str, srcs: list[str] | None = None, outs: list[str] | None = None) -> str:
    def locations(x: str) -> list[str]:
        if x not in LOC:
            raise SubstError(f"{x} not listed")
        return LOC[x]

    return substitute(cmd, srcs if srcs is not None else ["a.txt", "b.txt"], outs if outs is not None else ["o.txt"],
                      locations)


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        ("cat $(SRCS) > $(OUTS)", "cat a.txt b.txt > o.txt"),
        ("cp $< $@", "cp only.txt o.txt"),
        ("cat $(location a.txt)", "cat a.txt"),
        ("cat $(location //x:y)", "cat ../x/y.out"),
        ("cat $(location paren(x).txt) >o", "cat 'paren(x).txt' >o"),  # (it stopped at the first ")")
        ("(cat $(location a.txt))", "(cat a.txt)"),
        # Parentheses that do not pair: the first ")" closes, the shell's own later ones stay.
        ("cat $(location a(b.txt) > o && (echo x) >> o", "cat 'a(b.txt' > o && (echo x) >> o"),
        ("cat $(location  a.txt )", "cat a.txt"),  # (spaces around the argument)
        ("ls $(locations :gen)", "ls gen/one.h gen/two.h"),
        ("echo $$ $$$$", "echo $ $$"),
        ("echo $$(date)", "echo $(date)"),
        ("echo $( SRCS )", "echo a.txt b.txt"),
        ("no dollar at all", "no dollar at all"),
    ],
)
def test_table(cmd: str, expected: str) -> None:
    srcs = ["only.txt"] if "$<" in cmd else None
    assert sub(cmd, srcs=srcs) == expected


@pytest.mark.parametrize("cmd", ["echo $HOME", "echo ${X}", "echo $1 $#", "echo ${X:-default}", "echo $", "a$ b"])
def test_other_dollars_reach_the_shell_unchanged(cmd: str) -> None:
    assert sub(cmd) == cmd


def test_names_with_spaces_and_quotes_are_shell_quoted() -> None:
    got = sub("cat $(SRCS) > $@", srcs=["my file.txt", "plain.txt", "it's"], outs=["out put"])
    assert got == "cat 'my file.txt' plain.txt 'it'\"'\"'s' > 'out put'"
    assert sub("cat $(location my file.txt)") == "cat 'my file.txt'"
    assert sub("cat $(OUTS)", outs=["a b", "c"]) == "cat 'a b' c"


def test_a_path_that_starts_with_a_dash_is_never_an_option() -> None:
    assert sub("cp $< $@", srcs=["-n.txt"], outs=["-r out"]) == "cp ./-n.txt './-r out'"
    assert sub("cat $(SRCS)", srcs=["a", "-b"]) == "cat a ./-b"


def test_a_dash_named_source_is_copied_for_real(workspace: Workspace) -> None:
    workspace.write("-n.txt", "dash\n")
    workspace.build_file("", 'genrule(name="t", srcs=["-n.txt"], outs=["-o"], cmd="cp $< $@")')
    r = workspace.build()
    assert r.rc == 0 and workspace.read("-o") == "dash\n", r.output


@pytest.mark.parametrize("cmd", ["echo $(FOO)", "echo $(date)", "echo $(shell ls)"])
def test_unknown_substitution_is_an_error_that_suggests_double_dollar(cmd: str) -> None:
    with pytest.raises(SubstError) as e:
        sub(cmd)
    assert "$$(" in str(e.value)


@pytest.mark.parametrize("cmd", ["echo $(location)", "echo $(location )", "echo $(locations  )"])
def test_location_without_its_argument_says_it_needs_one(cmd: str) -> None:
    with pytest.raises(SubstError, match=r"needs a label or a file, as in \$\(locations? :gen\)"):
        sub(cmd)


def test_unterminated_paren_is_an_error() -> None:
    with pytest.raises(SubstError) as e:
        sub("echo $(SRCS")
    assert "$$(" in str(e.value)
    assert sub("cat $(location a(b.txt) > $@") == "cat 'a(b.txt' > o.txt"  # (unpaired: the first ")")


@pytest.mark.parametrize(("srcs", "n"), [([], 0), (["a", "b"], 2)])
def test_single_input_needs_exactly_one(srcs: list[str], n: int) -> None:
    with pytest.raises(SubstError) as e:
        sub("cat $<", srcs=srcs)
    assert str(n) in str(e.value)


@pytest.mark.parametrize("outs", [[], ["a", "b"]])
def test_single_output_needs_exactly_one(outs: list[str]) -> None:
    with pytest.raises(SubstError):
        sub("touch $@", outs=outs)


def test_location_of_several_files_is_an_error() -> None:
    with pytest.raises(SubstError) as e:
        sub("cat $(location :gen)")
    assert "$(locations :gen)" in str(e.value)
    with pytest.raises(SubstError) as e:  # (none: an IndexError's traceback)
        sub("echo $(location :stamp)")
    assert str(e.value) == "$(location :stamp) must name exactly one file (got 0); use $(locations :stamp)"


# -- end to end -----------------------------------------------------------------------


def test_srcs_are_deduplicated_in_declared_order_and_relative_to_the_package(workspace: Workspace) -> None:
    workspace.build_file("other", 'genrule(name="gen", outs=["gen.out"], cmd="echo generated > $@")\n')
    workspace.write("pkg/a.txt", "A\n")
    workspace.write("pkg/b c.txt", "BC\n")
    workspace.build_file(
        "pkg",
        """
        genrule(
            name="t",
            srcs=["b c.txt", "a.txt", "//other:gen", "a.txt"],
            deps=["//other:gen"],
            outs=["sub/out.txt"],
            cmd="printf '%s\\\\n' $(SRCS) > $@ && cat $(SRCS) >> $@ && echo $(location //other:gen) >> $@",
        )
        """,
    )
    r = workspace.build("//pkg:t")
    assert r.rc == 0, r.output
    assert workspace.read("pkg/sub/out.txt").splitlines() == [
        "b c.txt", "a.txt", "../other/gen.out", "BC", "A", "generated", "../other/gen.out",
    ]


def test_shell_variables_and_double_dollar_reach_the_shell(workspace: Workspace) -> None:
    workspace.build_file(
        "",
        """
        genrule(name="t", outs=["o"], env={"X": "ex"},
                cmd="set -- one; echo ${X} $X $1 $$(echo sub) $$X > $@")
        """,
    )
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("o") == "ex ex one sub ex\n"


def test_unknown_substitution_in_buildfile_is_exit_2_naming_file_and_line(workspace: Workspace) -> None:
    workspace.build_file(
        "pkg",
        """
        genrule(name="ok", outs=["ok"], cmd="true > $@")
        genrule(name="bad", outs=["o"], cmd="echo $(FOO) > $@")
        """,
    )
    rc, _, err = workspace.run("build", "//pkg:bad")
    assert rc == 2
    assert "pkg/BUILD.py:2" in err
    assert "$(FOO)" in err
    assert "$$(" in err


def test_single_input_mismatch_in_buildfile_is_exit_2(workspace: Workspace) -> None:
    workspace.write("a", "")
    workspace.write("b", "")
    workspace.build_file("", 'genrule(name="t", srcs=["a", "b"], outs=["o"], cmd="cat $< > $@")\n')
    rc, _, err = workspace.run("build")
    assert rc == 2
    assert "BUILD.py:1" in err and "$<" in err


def test_one_output_of_a_multi_output_dependency_is_named_by_its_path(workspace: Workspace) -> None:
    """Make's `gen/errors.h gen/errors.c: ...`: $(location) of one of the two files, the
    dependency listed by label; a path that no listed target makes is still an error."""
    workspace.build_file("", """
        genrule(name="errors", outs=["gen/errors.h", "gen/errors.c"],
                cmd="echo '#define E 1' > gen/errors.h && echo 'int e;' > gen/errors.c")
        genrule(name="use", srcs=[":errors"], outs=["use.txt"], cmd="cat $(location gen/errors.c) > $@")
    """)
    r = workspace.build("//:use")
    assert r.rc == 0, r.output
    assert workspace.read("use.txt") == "int e;\n"
    workspace.build_file("", """
        genrule(name="errors", outs=["gen/errors.h", "gen/errors.c"], cmd="touch $(OUTS)")
        genrule(name="use", srcs=[":errors"], outs=["use.txt"], cmd="cat $(location gen/nope.c) > $@")
    """)
    rc, _, err = workspace.run("build", "//:use")
    assert rc == 2 and "gen/nope.c is not listed in srcs or outs, nor an output of a target listed" in err, err


def test_dollar_lt_with_several_inputs_names_them_and_where_they_come_from() -> None:
    with pytest.raises(SubstError) as e:
        sub("cp $< $@", srcs=["a.txt", "../x/y.out"])
    assert str(e.value) == ("$< needs exactly one input but the target has 2 in srcs and the outputs of deps "
                            "(a.txt, ../x/y.out); name one with $(location ...)")


@pytest.mark.parametrize(("cmd", "needle"), [
    # It said "unknown substitution $(( 1+2)", which is not what was written.
    ("echo $(( 1+2 ))", "is the shell's arithmetic, which buildtool would expand first: write $$(( ... ))"),
    # It said "a.txt b.txt is not listed in srcs".
    ("cat $(location a.txt b.txt)", "$(location X) takes one label or path: write one $(location X) for each"),
    ("cat $(locations a.txt :gen)", "$(locations X) takes one label or path"),
])
def test_misused_substitutions_say_what_was_written(cmd: str, needle: str) -> None:
    with pytest.raises(SubstError) as e:
        sub(cmd)
    assert needle in str(e.value), str(e.value)
    assert sub(cmd.replace("$((", "$$((")) if "$((" in cmd else True


def test_a_location_naming_nothing_says_only_that() -> None:
    # One word naming nothing: the error is locations' own, with no "write one $(location X)
    # for each" (that is for a label list with spaces).
    with pytest.raises(SubstError) as e:
        sub("cat $(location nope.txt)")
    assert str(e.value) == "nope.txt not listed"


def test_locations_quotes_each_path() -> None:
    from buildtool.subst import substitute
    assert substitute("ls $(locations :g)", [], ["o"], lambda x: ["my file.txt", "-d"]) == "ls 'my file.txt' ./-d"
