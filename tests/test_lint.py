"""The lint of undeclared programs (buildtool/lint.py): unit cases, and the warning end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Workspace

from buildtool.lint import programs_run, undeclared_programs


@pytest.mark.parametrize(("cmd", "words"), [
    ("./gen.sh a.txt > out", ["./gen.sh"]),
    ("python3 tools/g.py --x 1 > $@", ["tools/g.py"]),
    ("cat a | ./f.sh && FOO=1 sub/run x; env A=b ../t/x.py", ["./f.sh", "sub/run", "../t/x.py"]),
    ("sh -e './s p.sh'", []),  # (a quoted word is data, or a program not looked at: a miss, no wrong warning)
    ("bash -c 'echo hi'", []),
    # Data is not a command (a review): a grep pattern, a here-document's body.
    ("grep -c 'x|scripts/gen.sh' src/a.c > $@ || true", []),
    ("cat > $@ <<'EOF'\n#!/bin/sh\nexec tools/server.sh \"$@\"\nEOF\nchmod +x $@ && ./after.sh", ["./after.sh"]),
    ("cat <<-END > $@\n\tsrc/a.c\n\tEND\n./next.sh", ["./next.sh"]),
    ("cp $< $@; echo a/b >> $@", []),
    ("$TOOLS/x.sh in", []),
    ("if ./check.sh; then ./ok.sh; fi", ["./check.sh", "./ok.sh"]),
    ("out=$(./ver.sh)", ["./ver.sh"]),
    ("python3 -m pkg.mod", ["pkg.mod"]),
    # A test runner's .py arguments are the scripts it runs (a Bazel user's test went stale silently).
    ("python -m pytest -q -p no:cacheprovider test_x.py", ["test_x.py"]),
    ("python3 -u -m pytest -m slow t/a_test.py::test_one conftest.ini", ["t/a_test.py"]),
    ("pytest -k x a.py b.py && py.test c.py", ["a.py", "b.py", "c.py"]),
    ("python3 -m unittest test_y.py", ["test_y.py"]),
    ("python3 x.py -m pytest", ["x.py"]),
    ("pytest --ignore tests/old_test.py --rootdir=. x_test.py", ["x_test.py"]),
    ("python -m unittest -c test_foo.py", ["test_foo.py"]),  # (unittest's -c is --catch, no value)
])
def test_the_words_a_shell_runs_as_programs(cmd: str, words: list[str]) -> None:
    assert programs_run(cmd) == words


def test_only_existing_workspace_files_not_declared_are_named(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    for name in ("p/gen.sh", "p/ok.sh", "tools.py"):
        (tmp_path / name).write_text("")
    cmd = "./gen.sh && ./ok.sh && ./missing.sh && python3 ../tools.py && ../../outside.sh && pkg.mod"
    assert undeclared_programs(cmd, str(tmp_path), "p", {"p/ok.sh"}) == ["p/gen.sh", "tools.py"]
    assert undeclared_programs(f"{tmp_path}/p/gen.sh", str(tmp_path), "", ()) == ["p/gen.sh"]


def test_a_script_the_command_runs_undeclared_is_warned_about(workspace: Workspace) -> None:
    """`cmd="./gen.sh a.txt > $@"` with gen.sh in neither srcs nor tools: an edit of the
    script left the target up to date, and `explain` said so, without a word of why."""
    workspace.write("a.txt", "a\n")
    workspace.write("gen.sh", "#!/bin/sh\ncat \"$1\"\n")
    workspace.path("gen.sh").chmod(0o755)
    workspace.build_file("", """
        genrule(name="x", srcs=["a.txt"], outs=["x.out"], cmd="./gen.sh a.txt > $@")
        genrule(name="ok", srcs=["a.txt", "gen.sh"], outs=["ok.out"], cmd="./gen.sh a.txt > $@")
        genrule(name="tool", srcs=["a.txt"], outs=["t.out"], tools=["./gen.sh"], cmd="./gen.sh a.txt > $@")
        """)
    rc, out, err = workspace.run("build")
    assert rc == 0, out + err
    assert "//:x: its command runs gen.sh, which is not among its srcs or tools" in err, err
    assert "//:ok:" not in err and "//:tool:" not in err, err
    assert err.count("warning") == 1, err


def test_a_script_flag_named_dash_m_at_the_end_is_no_crash() -> None:
    from buildtool.lint import programs_run
    assert programs_run("python3 gen.py -m") == ["gen.py"]


def test_a_file_outside_the_workspace_is_not_warned_about(tmp_path) -> None:
    from buildtool.lint import undeclared_programs
    (tmp_path / "ws").mkdir()
    (tmp_path / "outside.sh").write_text("#!/bin/sh\n")
    assert undeclared_programs("../outside.sh > $@", str(tmp_path / "ws"), "", set()) == []


def test_a_program_in_the_state_dir_is_not_warned_about(tmp_path) -> None:
    # (buildtool's own files: nothing a BUILD.py could declare)
    from buildtool.lint import undeclared_programs

    (tmp_path / ".buildtool" / "tmp").mkdir(parents=True)
    (tmp_path / ".buildtool" / "tmp" / "x.sh").write_text("#!/bin/sh\n")
    assert undeclared_programs(".buildtool/tmp/x.sh > $@", str(tmp_path), "", set()) == []
