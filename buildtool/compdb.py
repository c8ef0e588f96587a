"""Compilation database: the ``compile_commands.json`` of a graph's compile targets.

clangd, clang-tidy and most C/C++ editors read the commands that compile each source from
a JSON Compilation Database (clang's format: an array of ``directory``, ``file``,
``arguments`` and ``output``), as ``ninja -t compdb`` and CMake's
``CMAKE_EXPORT_COMPILE_COMMANDS`` write it.  ``buildtool graph --format compdb`` writes it
for the targets the patterns need.

A compile target here is one with a ``depfile`` (the cc macros' compiles, and a genrule of
the same shape written by hand) whose own ``srcs`` (else inputs) hold exactly one C, C++
or assembly source and whose command is a single command: words, quotes and ``$PWD``
(which the cc macros use for ``-fdebug-prefix-map``, replaced by the command's directory),
no ``;``, ``&&``, pipes, redirections, newlines, comments or leading assignments.  Others
are left out: a script has no one command line an editor can rerun (the cc macros'
compile of a generated source, which picks the source among a target's outputs, is one).
Nothing is built: the generated sources and headers an entry names exist once a build
made them.
"""

from __future__ import annotations

import json
import os
import shlex

from buildtool.graph import Graph, Target

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".c++", ".C", ".m", ".mm", ".S", ".s")
_OPERATORS = ";&|<>()\n"  # (a newline outside quotes separates commands)


def entries(graph: Graph, root: str) -> list[dict[str, object]]:
    """One entry per compile target of ``graph`` (workspace ``root``), in graph order."""
    found: list[dict[str, object]] = []
    for t in graph.targets:
        if t.depfile is None or not t.cmd or t.kind != "genrule":
            continue
        # Its own srcs first (a hdr_deps target that also makes a .c, as bison does, is
        # another input), else a source among its inputs (a generated one).
        own = [p for p in graph.inputs[t.id] if p in t.srcs and p.endswith(SOURCE_SUFFIXES)]
        sources = own or [p for p in graph.inputs[t.id] if p.endswith(SOURCE_SUFFIXES)]
        directory = os.path.join(root, t.pkg) if t.pkg else root
        arguments = command_words(t.cmd, directory)
        if len(sources) != 1 or arguments is None:
            continue
        entry: dict[str, object] = {
            "directory": directory,
            "file": os.path.join(root, sources[0]),
            "arguments": arguments,
        }
        if t.outs:
            entry["output"] = os.path.join(root, _object(t))
        found.append(entry)
    return found


def _object(t: Target) -> str:
    """The output an editor takes for the compile's product: the first ``.o``, else the first."""
    return next((o for o in t.outs if o.endswith(".o")), t.outs[0])


def command_words(cmd: str, directory: str) -> list[str] | None:
    """``cmd`` as the argument vector the shell would run in ``directory``, or None when it
    is more than one simple command (an operator or a newline outside quotes, a comment, an
    assignment before the command) or cannot be split."""
    cmd = cmd.replace("\\\n", "")  # (a backslash-newline joins lines, as the shell does)
    lexer = shlex.shlex(cmd, posix=True, punctuation_chars=_OPERATORS)
    lexer.whitespace_split = True
    lexer.commenters = ""  # (shlex takes '#' inside a word for a comment; the shell, only at a word's start)
    lexer.whitespace = " \t"
    try:
        words = list(lexer)
    except ValueError:  # (an unterminated quote: the shell's error when it runs)
        return None
    if not words or "=" in words[0].partition("/")[0] or any(
            w.startswith("#") or (w and set(w) <= set(_OPERATORS)) for w in words):
        return None
    return [w.replace("${PWD}", directory).replace("$PWD", directory) for w in words]


def to_json(graph: Graph, root: str) -> str:
    """The database as ``compile_commands.json`` holds it."""
    return json.dumps(entries(graph, root), indent=2, ensure_ascii=False)
