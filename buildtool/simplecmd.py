"""Simple commands: shell command lines that can be exec'd without starting a shell.

``/bin/sh -c 'cp a b'`` costs two process images, the shell's and ``cp``'s; on the
machines we measure, starting a process costs more than the Python work of a whole
target.  GNU Make has long skipped the shell for a recipe line without shell syntax; this
module makes the same decision for buildtool, a little wider: one trailing ``> file``
(stdout to a file, the most common genrule shape, ``cat $(SRCS) > $@``) is allowed too.

A command qualifies only when the shell would do nothing but split it into words on
blanks and run the first word from ``PATH``:

- every character is a letter, a digit, a blank (space or tab) or one of ``_-./,:@%+=``
  (no quotes, ``$``, globs, ``~``, ``#``, ``;``, ``&``, ``|``, ``<``, backslash, braces,
  parentheses, newlines...);
- ``>`` appears at most once, as a word of its own followed by exactly one last word;
- the first word is no shell keyword or builtin (``cd``, ``echo``, ``test``, ``exit``,
  ...: builtins can differ from the programs of the same name) and no assignment
  (``NAME=value cmd``).

The executor still falls back to the shell whenever the direct start fails (command not
found, not executable, a script without ``#!``, the ``>`` file cannot be opened), so the
shell's own error message and exit status are what the user sees in those cases.  The
shell stays part of the action key: how the command is started is not what it computes.
"""

from __future__ import annotations

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./,:@%+= \t>")

# Keywords and builtins of dash, bash and POSIX sh: these run inside the shell (or mean
# syntax), so running a program of the same name instead could behave differently.
_SHELL_WORDS = frozenset(
    (
        "!", ".", ":", "[", "[[", "]]", "{", "}", "alias", "bg", "bind", "break", "builtin", "caller",
        "case", "cd", "chdir", "command", "compgen", "complete", "continue", "declare", "dirs",
        "disown", "do", "done", "echo", "elif", "else", "enable", "esac", "eval", "exec", "exit",
        "export", "false", "fc", "fg", "fi", "for", "function", "getopts", "hash", "help", "history",
        "if", "in", "jobs", "kill", "let", "local", "logout", "mapfile", "popd", "printf", "pushd",
        "pwd", "read", "readarray", "readonly", "return", "select", "set", "shift", "shopt", "source",
        "suspend", "test", "then", "time", "times", "trap", "true", "type", "typeset", "ulimit",
        "umask", "unalias", "unset", "until", "wait", "while",
    )
)


class SimpleCommand:
    """The argv of a command line and the file its stdout goes to (None: not redirected)."""

    __slots__ = ("argv", "stdout_path")

    def __init__(self, argv: list[str], stdout_path: str | None) -> None:
        self.argv = argv
        self.stdout_path = stdout_path

    def __repr__(self) -> str:
        return f"SimpleCommand({self.argv!r}, stdout_path={self.stdout_path!r})"


def parse(cmd: str) -> SimpleCommand | None:
    """The simple command ``cmd`` stands for, or None when it needs a shell."""
    if not _SAFE.issuperset(cmd):
        return None
    words = cmd.split()
    stdout_path = None
    if ">" in cmd:
        if cmd.count(">") != 1 or len(words) < 3 or words[-2] != ">":
            return None  # '>' glued to a word (2>, >>, >x) or not followed by exactly one word
        stdout_path = words[-1]
        words = words[:-2]
    if not words or words[0] in _SHELL_WORDS or "=" in words[0]:
        return None
    return SimpleCommand(words, stdout_path)
