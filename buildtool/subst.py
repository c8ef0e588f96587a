"""Command substitution: the fixed ``$(SRCS)``/``$(OUTS)``/``$<``/``$@``/``$(location X)``
table applied to a genrule's ``cmd``.

``$$`` is a literal ``$``; any other ``$(NAME)`` is an error (write ``$$(`` for shell
command substitution); any other ``$`` reaches the shell unchanged.  Paths are relative
to the package directory and shell-quoted only when needed; one that starts with ``-``
is written ``./-name``, so that no command takes it for an option.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable


class SubstError(ValueError):
    """The command uses a substitution that does not apply; the message says why."""


def quote_path(p: str) -> str:
    """A path as a shell word: quoted when needed, ``./`` before a leading ``-``."""
    return shlex.quote("./" + p if p.startswith("-") else p)


def quote_all(paths: list[str]) -> str:
    return " ".join(quote_path(p) for p in paths)


def substitute(
    cmd: str,
    srcs: list[str],
    outs: list[str],
    locations: Callable[[str], list[str]],
) -> str:
    """Expand ``cmd``. ``locations(X)`` returns the package-relative paths of file/label X."""
    if "$" not in cmd:
        return cmd
    out: list[str] = []
    i, n = 0, len(cmd)
    while i < n:
        j = cmd.find("$", i)
        if j < 0:
            out.append(cmd[i:])
            break
        out.append(cmd[i:j])
        nxt = cmd[j + 1] if j + 1 < n else ""
        if nxt == "$":
            out.append("$")
            i = j + 2
        elif nxt == "<":
            out.append(quote_path(_single(srcs, "$<", "input", "srcs and the outputs of deps")))
            i = j + 2
        elif nxt == "@":
            out.append(quote_path(_single(outs, "$@", "output", "outs")))
            i = j + 2
        elif nxt == "(" and cmd[j + 2 : j + 3] == "(":  # $(( ... )): the shell's arithmetic
            msg = (f"$(( in cmd at offset {j} is the shell's arithmetic, which buildtool would expand "
                   "first: write $$(( ... ))")
            raise SubstError(msg)
        elif nxt == "(":
            k = _closing(cmd, j + 2)
            if k < 0:
                msg = f"unterminated '$(' in cmd at offset {j}; write '$$(' for shell command substitution"
                raise SubstError(msg)
            body = cmd[j + 2 : k].strip()
            out.append(_expand(body, srcs, outs, locations))
            i = k + 1
        else:
            out.append("$")
            i = j + 1
    return "".join(out)


def _closing(cmd: str, start: int) -> int:
    """The index of the ")" that closes the "$(" before ``start``, parentheses inside it
    paired (``$(location paren(x).txt)`` names ``paren(x).txt``); when they do not pair
    (``$(location a(b.txt) > $@``), the first ")"; -1 if there is none."""
    depth = 1
    first = -1
    for k in range(start, len(cmd)):
        c = cmd[k]
        if c == "(":
            depth += 1
        elif c == ")":
            first = k if first < 0 else first
            depth -= 1
            if depth == 0:
                return k
    return first


def _single(paths: list[str], token: str, what: str, attr: str) -> str:
    if len(paths) != 1:
        shown = ", ".join(paths[:4]) + (", ..." if len(paths) > 4 else "")
        msg = f"{token} needs exactly one {what} but the target has {len(paths)} in {attr}"
        msg += f" ({shown}); name one with $(location ...)" if paths else ""
        raise SubstError(msg)
    return paths[0]


def _located(word: str, arg: str, locations: Callable[[str], list[str]]) -> list[str]:
    """``locations(arg)``; when ``arg`` names nothing and holds spaces, the error also says
    that $(location) takes one label or path (a file name with spaces is taken whole)."""
    try:
        return locations(arg)
    except SubstError as e:
        if len(arg.split()) < 2:
            raise
        msg = f"{e}; $({word} X) takes one label or path: write one $({word} X) for each"
        raise SubstError(msg) from None


def _expand(
    body: str, srcs: list[str], outs: list[str], locations: Callable[[str], list[str]]
) -> str:
    if body == "SRCS":
        return quote_all(srcs)
    if body == "OUTS":
        return quote_all(outs)
    word, _, arg = body.partition(" ")
    arg = arg.strip()
    if word == "location" and arg:
        paths = _located(word, arg, locations)
        if len(paths) != 1:
            msg = f"$(location {arg}) must name exactly one file (got {len(paths)}); use $(locations {arg})"
            raise SubstError(msg)
        return quote_path(paths[0])
    if word == "locations" and arg:
        return quote_all(_located(word, arg, locations))
    if word in ("location", "locations"):  # (`$(location )`: not an unknown substitution)
        msg = f"$({word}) needs a label or a file, as in $({word} :gen) or $({word} data.txt)"
        raise SubstError(msg)
    msg = (
        f"unknown substitution $({body}) in cmd: the supported ones are $(SRCS), $(OUTS), "
        f"$<, $@, $(location X), $(locations X) and $$; write $$( for shell command substitution"
    )
    raise SubstError(msg)
