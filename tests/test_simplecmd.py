"""simplecmd.parse: which command lines run without a shell, and what they become."""

from __future__ import annotations

import pytest

from buildtool.simplecmd import parse


@pytest.mark.parametrize(
    ("cmd", "argv", "stdout_path"),
    [
        ("cp src/1.txt out/1.txt", ["cp", "src/1.txt", "out/1.txt"], None),
        ("cat a b c > out/x", ["cat", "a", "b", "c"], "out/x"),
        ("gcc -O2 -c a.c -o out/a.o -DX=1 -Iinc", ["gcc", "-O2", "-c", "a.c", "-o", "out/a.o", "-DX=1", "-Iinc"], None),
        ("  ./tool\t--flag=1   x  ", ["./tool", "--flag=1", "x"], None),
        ("/usr/bin/env python3 gen.py > gen/out.h", ["/usr/bin/env", "python3", "gen.py"], "gen/out.h"),
        ("tool a,b:c@d%e+f", ["tool", "a,b:c@d%e+f"], None),
    ],
)
def test_plain_word_lists_run_directly(cmd: str, argv: list[str], stdout_path: str | None) -> None:
    got = parse(cmd)
    assert got is not None
    assert got.argv == argv
    assert got.stdout_path == stdout_path


@pytest.mark.parametrize(
    "cmd",
    [
        "",
        "   ",
        "cp a b && touch c",  # lists
        "cp a b; touch c",
        "false | cat > out",  # pipes
        "cp $SRC out",  # expansions
        "cp a 'b c'",  # quoting
        'cp a "b c"',
        "cp a b\\ c",
        "cp *.txt out",  # globs
        "cp a? out",
        "cp [ab] out",
        "cp ~/x out",  # tilde
        "cp a b # comment",
        "cp a b\ntouch c",  # newlines
        "cp a b &",
        "cat < in > out",  # input redirection
        "cat a >> out",  # append
        "cat a 2> err",  # fd redirection glued to its number
        "cat a >out",  # '>' glued to the file name
        "cat a > out extra",  # '>' not before the last word
        "cat a > b > c",
        "> out",  # nothing to run
        "echo hi > out",  # builtins behave unlike the programs of the same name
        "test -f a",
        "cd sub",
        "exit 3",
        "true",
        "printf x",
        "kill 1",
        "if",
        "FOO=1 tool a",  # an assignment first
        "tool (a)",
        "tool {a,b}",
        "tool a`b`",
        "tool é",  # non-ASCII: left to the shell's own rules
    ],
)
def test_anything_the_shell_would_interpret_needs_the_shell(cmd: str) -> None:
    assert parse(cmd) is None
