"""Depfile: parse Make-format dependency files as written by ``gcc/clang -MD -MF``.

The format is a subset of Make (as Ninja's depfile parser reads it)::

    out.o: a.c include/a.h \\
      dir\\ with\\ space/b.h
    include/a.h:

A backslash-newline continues a line; ``\\ `` is a space inside a path (2N backslashes
before a space are N backslashes and end the path, 2N+1 are N backslashes and a space);
N backslashes before ``#`` are N-1 backslashes and a ``#`` (``\\#`` is ``#``; gcc writes a
file ``e\\#f.h`` as ``e\\\\#f.h``); ``$$`` is ``$``; an unescaped ``#`` starts a comment.
A ``:`` followed by whitespace or the end of the line ends a rule's targets.  ``-MP`` phony rules
(``a.h:``) add targets without prerequisites.  ``workspace_inputs`` turns the
prerequisites into workspace-relative paths, leaving out files outside the workspace
(system headers) and buildtool's state directory.
"""

from __future__ import annotations

import os
import posixpath

from buildtool.workspace import STATE_DIR

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Iterable


class DepfileError(ValueError):
    """The text is not a Make-format depfile."""


class Depfile:
    """A parsed depfile: the rules' targets and their prerequisites."""

    __slots__ = ("prerequisites", "targets")

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.prerequisites: list[str] = []  # in order of first appearance, de-duplicated


def _tokens(text: str) -> Iterable[tuple[str, bool]]:
    """(word, ends_line) pairs; a rule separator ':' is its own word (":", ...)."""
    plain = text.replace("\\\n", " ")
    if not any(c in plain for c in "\\$#\r") and ":\\\n" not in text:  # ("a:\\<newline>": no separator)
        return _plain_tokens(plain)  # (a compiler's usual depfile: ~10x faster than character by character)
    return _escaped_tokens(text)


def _plain_tokens(text: str) -> Iterable[tuple[str, bool]]:
    """``_escaped_tokens`` of a text with no escapes, comments, ``$`` or CR (continuations
    already joined): the words between spaces and tabs, a ``:`` ending a word a separator."""
    for line in text.split("\n"):
        for w in line.replace("\t", " ").split(" "):
            if not w:
                continue
            if w[-1] == ":":
                if len(w) > 1:
                    yield w[:-1], False
                yield ":", False
            else:
                yield w, False
        yield "", True


def _escaped_tokens(text: str) -> Iterable[tuple[str, bool]]:
    """(word, ends_line) pairs, character by character: escapes, comments, ``$$``."""
    i, n = 0, len(text)
    word: list[str] = []
    have = False

    def flush() -> Iterable[tuple[str, bool]]:
        nonlocal have
        if have:
            w = "".join(word)
            word.clear()
            have = False
            yield w, False

    while i < n:
        c = text[i]
        if c == "\\":
            j = i
            while j < n and text[j] == "\\":
                j += 1
            count = j - i
            nxt = text[j] if j < n else ""
            if nxt == "\n" or (nxt == "\r" and text[j + 1 : j + 2] == "\n"):
                # Line continuation (a single backslash before the newline; more are literal).
                word.append("\\" * (count - 1))
                have = have or count > 1
                yield from flush()
                i = j + (2 if nxt == "\r" else 1)
                continue
            if nxt == " " or nxt == "\t":
                word.append("\\" * (count // 2))
                have = True
                if count % 2:
                    word.append(nxt)
                    i = j + 1
                else:
                    i = j
                continue
            if nxt == "#":  # (as Ninja: N backslashes and '#' are N-1 backslashes and a '#')
                word.append("\\" * (count - 1) + "#")
                have = True
                i = j + 1
                continue
            word.append("\\" * count)
            have = True
            i = j
            continue
        if c == "$" and text[i + 1 : i + 2] == "$":
            word.append("$")
            have = True
            i += 2
            continue
        if c == "#":
            yield from flush()
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "\n" or (c == "\r" and text[i + 1 : i + 2] == "\n"):
            yield from flush()
            yield "", True
            i += 1 if c == "\n" else 2
            continue
        if c in " \t\r":
            yield from flush()
            i += 1
            continue
        if c == ":" and (i + 1 >= n or text[i + 1] in " \t\r\n"):
            if have:
                yield from flush()
            yield ":", False
            i += 1
            continue
        word.append(c)
        have = True
        i += 1
    yield from flush()
    yield "", True


def parse(text: str) -> Depfile:
    """Parse a depfile; raises DepfileError when a line has no ``target:`` part."""
    result = Depfile()
    seen: set[str] = set()
    targets: list[str] = []
    in_prereqs = False
    line_words: list[str] = []
    for word, eol in _tokens(text):
        if eol:
            if line_words and not in_prereqs:
                msg = f"expected 'target: prerequisites', found {' '.join(line_words)!r} without a ':'"
                raise DepfileError(msg)
            line_words = []
            in_prereqs = False
            continue
        if word == ":" and not in_prereqs:
            if not line_words:
                msg = "expected 'target: prerequisites', found a ':' with no target before it"
                raise DepfileError(msg)
            targets.extend(line_words)
            in_prereqs = True
            line_words = ["<rule>"]
            continue
        if in_prereqs:
            if word != ":" and word not in seen:
                seen.add(word)
                result.prerequisites.append(word)
        else:
            line_words.append(word)
    result.targets = list(dict.fromkeys(targets))
    return result


def parse_file(path: str) -> Depfile:
    """Read and parse; OSError when unreadable, DepfileError when malformed."""
    with open(path, "rb") as f:
        data = f.read()
    return parse(data.decode("utf-8", "surrogateescape"))


def workspace_inputs(prereqs: Iterable[str], root: str, pkg: str) -> list[str]:
    """Workspace-relative, normalised paths of the prerequisites that lie inside the
    workspace (relative ones are relative to the package directory, where the command
    ran); system headers and anything under the state directory are left out."""
    return WorkspacePaths(root).inputs(prereqs, pkg)


_OUTSIDE = "\0"  # (memoised: not a workspace file)


class WorkspacePaths:
    """``workspace_inputs`` for one build's depfiles, each answer memoised: 2,000 compiles
    name the same few hundred headers (and system headers, each a symbolic-link check)."""

    __slots__ = ("_by_pkg", "_real_dirs", "_real_root", "_roots")

    def __init__(self, root: str) -> None:
        self._real_root = os.path.realpath(root)
        self._roots = (root, self._real_root) if root != self._real_root else (root,)
        self._real_dirs: dict[str, str] = {}  # a directory outside both spellings -> where it really is
        self._by_pkg: dict[str, dict[str, str]] = {}  # pkg -> prerequisite -> its path, or _OUTSIDE

    def inputs(self, prereqs: Iterable[str], pkg: str) -> list[str]:
        """The workspace files among ``prereqs`` (written by a command run in ``pkg``), sorted."""
        memo = self._by_pkg.get(pkg)
        if memo is None:
            memo = self._by_pkg[pkg] = {}
        out: set[str] = set()
        for p in prereqs:
            rel = memo.get(p)
            if rel is None:
                rel = memo[p] = self._rel(p, pkg) or _OUTSIDE
            if rel is not _OUTSIDE:
                out.add(rel)
        return sorted(out)

    def _rel(self, p: str, pkg: str) -> str | None:
        if not p:
            return None
        if os.path.isabs(p):
            ap = os.path.normpath(p)
            rel = _under(ap, self._roots)
            if rel is None:  # (-I/link/include, with /link -> the workspace: its headers count)
                d, _, name = ap.rpartition(os.sep)
                real = self._real_dirs.get(d)
                if real is None:
                    real = self._real_dirs[d] = os.path.realpath(d or os.sep)
                rel = _under(os.path.join(real, name), (self._real_root,))
                if rel is None and os.path.islink(ap):  # (-I/elsewhere, elsewhere/a.h -> the workspace's)
                    rel = _under(os.path.realpath(ap), (self._real_root,))
            if rel is None:
                return None
        else:
            rel = posixpath.normpath(posixpath.join(pkg, p) if pkg else p)
        if rel in (".", "..") or rel.startswith("../") or rel.startswith("/"):
            return None
        if rel == STATE_DIR or rel.startswith(STATE_DIR + "/"):
            return None
        return rel


def _under(path: str, roots: Iterable[str]) -> str | None:
    """``path`` (absolute, normalised) relative to the first of ``roots`` it lies under."""
    for r in roots:
        if path.startswith(r + os.sep):
            return os.path.relpath(path, r).replace(os.sep, "/")
    return None
