"""Lint: the workspace files a command runs by path that its action key does not hold.

``cmd="./gen.sh in.txt > $@"`` with ``gen.sh`` in neither ``srcs`` nor ``tools`` runs a
script whose edits nothing sees: the target stays up to date after an edit of it, and a
shared cache answers another checkout with the old script's result.  Bazel's sandbox
would fail the command; Make and Ninja say nothing.  buildtool says so when the command
runs: the words a shell would run as a program (the first word of each simple command,
and the script an interpreter such as ``python3`` or ``sh`` is given, or the ``.py`` files
given to a test runner: ``pytest x_test.py``, ``python -m pytest x_test.py``, ``python -m
unittest x_test.py``), when one names an existing workspace file by a path that is not
among the target's inputs.  A heuristic: a
program found on ``PATH`` or a path built at run time (``$VAR/x``) is not looked at.
"""

from __future__ import annotations

import os
import posixpath
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Container

# Where a shell starts a simple command: the start, after an operator, a subshell or
# command substitution, or a keyword that takes a command after it.
_SEGMENTS = re.compile(r"&&|\|\||[;&|\n(){}`]|\$\(")
_LEADING = frozenset({"then", "do", "else", "elif", "if", "while", "until", "!", "exec", "time", "command", "nohup",
                      "env"})
_INTERPRETERS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "python", "python3", "perl", "ruby", "node", "Rscript",
                           "tclsh", "lua"})
_TEST_RUNNERS = frozenset({"pytest", "py.test", "unittest"})  # (their .py arguments are scripts run)
# A test runner's options whose path argument is not a test it runs (--ignore old_test.py).
_NOT_RUN = frozenset({"--ignore", "--deselect", "--ignore-glob", "--confcutdir", "--rootdir", "-p"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"")  # (data: a grep pattern, an echo's text)
_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")


def _code(cmd: str) -> str:
    """``cmd`` without what the shell reads as data, not commands: here-document bodies, and
    quoted spans (each left as ``''``: a quoted program is not looked at, a miss rather
    than a warning about a grep pattern)."""
    lines: list[str] = []
    ends: list[str] = []  # the delimiters of the here-documents still open
    for line in cmd.replace("\\\n", " ").split("\n"):
        if ends:
            if line.lstrip("\t") == ends[0]:
                ends.pop(0)
            continue
        lines.append(line)
        ends = _HEREDOC.findall(line)
    return _QUOTED.sub("''", "\n".join(lines))


def programs_run(cmd: str) -> list[str]:
    """The words of ``cmd`` that a shell would run as a program or script and that name a
    file by a path (holding a ``/``), or a script given to an interpreter; in order."""
    out: list[str] = []
    for segment in _SEGMENTS.split(_code(cmd)):
        words = [w.strip("'\"") for w in segment.split()]
        i = 0
        while i < len(words) and (words[i] in _LEADING or _ASSIGNMENT.match(words[i])):
            i += 1
        if i >= len(words):
            continue
        first = words[i]
        if "/" in first:
            out.append(first)
        name = first.rsplit("/", 1)[-1]
        runner = name in _TEST_RUNNERS
        if name.startswith("python") and "-m" in words[i + 1:-1]:
            runner = words[words.index("-m", i + 1) + 1] in _TEST_RUNNERS
        if runner:
            args = words[i + 1:]
            paths = (w.split("::", 1)[0] for k, w in enumerate(args)  # (a pytest node id's file)
                     if not w.startswith("-") and not (k and args[k - 1] in _NOT_RUN))
            out.extend(w for w in paths if w.endswith(".py"))
        elif name in _INTERPRETERS:
            script = next((w for w in words[i + 1:] if not w.startswith("-")), None)
            if script is not None and not (script.startswith(("<", ">")) or "=" in script):
                out.append(script)
    return [w for w in out if w and "$" not in w and not w.startswith(("<", ">", "~"))]


def undeclared_programs(cmd: str, root: str, pkg: str, declared: Container[str]) -> list[str]:
    """The workspace files (workspace-relative) that ``cmd``, run in package ``pkg``, runs
    by path although they are not in ``declared`` (the target's inputs and tools)."""
    found: list[str] = []
    real_root = root.rstrip("/") + "/"
    for w in programs_run(cmd):
        if w.startswith("/"):
            if not w.startswith(real_root):
                continue
            rel = posixpath.normpath(w[len(real_root):])
        else:
            rel = posixpath.normpath(posixpath.join(pkg, w) if pkg else w)
        if rel.startswith("../") or rel in ("..", ".") or rel.startswith(".buildtool/"):
            continue
        if rel in declared or rel in found:
            continue
        if os.path.isfile(os.path.join(root, rel)):
            found.append(rel)
    return found
