"""DSL: the functions a BUILD.py calls (genrule, test, group, pyrule, glob, getenv).

They only record declarations (with their file and line) into the package being
evaluated; no graph logic lives here.  The same functions are importable from
``buildtool.dsl`` so macro modules and editors see them.
"""

from __future__ import annotations

import os
import sys
from bisect import bisect_right
from contextvars import ContextVar

from buildtool.errors import BuildfileError
from buildtool.labels import LabelError, check_name

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

__all__ = ["fail", "genrule", "getenv", "glob", "group", "pyrule", "test"]

COMMON_ATTRS = ("name", "priority", "manual", "pool", "deps")
RULE_ATTRS: dict[str, tuple[str, ...]] = {
    "genrule": (*COMMON_ATTRS, "cmd", "srcs", "outs", "env", "pass_env", "tools", "always", "depfile", "local"),
    "test": (*COMMON_ATTRS, "cmd", "srcs", "env", "pass_env", "tools", "timeout", "flaky", "always", "exclusive",
             "local"),
    "group": COMMON_ATTRS,
    "pyrule": (*COMMON_ATTRS, "fn", "srcs", "outs", "kwargs", "env", "pass_env", "local"),
}
# What users of other build tools write for an attribute (Bazel's `data`, Make's inputs and
# outputs): the "did you mean" of an unknown one, where spelling alone guesses wrong
# (difflib took "inputs" for "outs") or not at all ("command").
ATTR_ALIASES: dict[str, str] = {
    "command": "cmd", "commands": "cmd", "inputs": "srcs", "input": "srcs", "sources": "srcs", "data": "srcs",
    "outputs": "outs", "output": "outs", "environment": "env", "environ": "env", "dependencies": "deps",
    "prio": "priority",
}
REQUIRED_ATTRS: dict[str, tuple[str, ...]] = {
    "genrule": ("name", "cmd"),
    "test": ("name", "cmd"),
    "group": ("name", "deps"),
    "pyrule": ("name", "fn", "outs"),
}


class Declaration:
    """One rule call as written in a BUILD.py (or a macro it called)."""

    __slots__ = ("attrs", "kind", "line", "macro", "path", "pkg")

    def __init__(self, kind: str, attrs: dict[str, Any], path: str, line: int, macro: str = "",
                 pkg: str = "") -> None:
        self.kind = kind
        self.attrs = attrs
        self.path = path  # workspace-relative file of the call site
        self.line = line
        self.macro = macro  # " (in the macro at tools/macros.py:12)" when a macro declared it, else ""
        self.pkg = pkg  # the package it declares a target of


def _glob_after_evaluation(pkg: str, include: list[str], exclude: list[str]) -> list[str]:
    raise RuntimeError(f"glob() called for //{pkg} after its BUILD.py was evaluated")


class PackageContext:
    """What the DSL functions need while one BUILD.py is evaluated."""

    __slots__ = ("_globbed_objs", "_lines", "_rel", "buildfile", "declarations", "env_reads", "glob_fn", "globbed",
                 "looked_for", "pkg", "root")

    def __init__(
        self, root: str, pkg: str, buildfile: str, glob_fn: Callable[[str, list[str], list[str]], list[str]]
    ) -> None:
        self.root = root
        self.pkg = pkg
        self.buildfile = buildfile  # absolute path of the BUILD.py
        self.glob_fn = glob_fn
        self.declarations: dict[str, Declaration] = {}
        self.globbed: set[str] = set()  # workspace-relative paths
        # path -> its Globbed, one object per path however many glob() calls return it (400
        # tests globbing the same 2,000 files held 800,000 of them in their declarations)
        self._globbed_objs: dict[str, Globbed] = {}
        self.env_reads: dict[str, str | None] = {}
        self.looked_for: set[str] = set()  # absolute paths outside the workspace a macro looked for (a compiler)
        self._rel: dict[str, str] = {}  # file -> workspace-relative (a BUILD.py declares thousands of targets)
        # id(code) -> (code, its line table): keyed by id, as hashing a code object hashes
        # all its constants (the value holds the code, so its id stays its own)
        self._lines: dict[int, tuple[object, list[int], list[int | None]]] = {}

    def evaluated(self) -> None:
        """Its BUILD.py was evaluated: let go of the loader's glob (watch mode keeps the
        context of a package no edit touched in the next loader, and this bound method kept
        the loader before it alive, with every context it held: a chain, ~40 KB a
        re-evaluation of another package than the last)."""
        self.glob_fn = _glob_after_evaluation

    def line_of(self, frame: Any) -> int:
        """``frame.f_lineno`` without its cost: that reads the code's line table from the
        start on every call, so a generated BUILD.py of N rule calls took N^2 steps (36 ms
        at 2,000 targets, seconds at 20,000).  Each code object's table is read once here."""
        code = frame.f_code
        table = self._lines.get(id(code))
        if table is None:
            starts: list[int] = []
            lines: list[int | None] = []
            for start, _end, line in code.co_lines():
                starts.append(start)
                lines.append(line)
            table = self._lines[id(code)] = (code, starts, lines)
        i = bisect_right(table[1], frame.f_lasti) - 1
        line = table[2][i] if i >= 0 else None
        return line if line is not None else frame.f_lineno

    def rel(self, path: str) -> str:
        """``path`` relative to the workspace root, memoised."""
        r = self._rel.get(path)
        if r is None:
            r = self._rel[path] = os.path.relpath(path, self.root)
        return r


_current: ContextVar[PackageContext | None] = ContextVar("buildtool_package", default=None)


# Calls made with no evaluation in their thread: a thread a BUILD.py started does not
# inherit the context, and its exception may be swallowed (threading prints it and the
# target is silently missing): the loader looks here after each evaluation.
misplaced_calls: list[tuple[str, str, int]] = []  # (function, file and line of its caller)


class OutsideEvaluation(RuntimeError):
    """A buildtool.dsl function called with no BUILD.py evaluation in its thread."""


def current_context() -> PackageContext:
    ctx = _current.get()
    if ctx is None:
        frame, name = sys._getframe(1), "a buildtool.dsl function"
        while frame is not None and frame.f_code.co_filename == __file__:  # the outermost one: genrule
            name, frame = frame.f_code.co_name, frame.f_back
        misplaced_calls.append((name, frame.f_code.co_filename, frame.f_lineno) if frame is not None else (name, "", 0))
        msg = ("buildtool.dsl functions can only be called while a BUILD.py is evaluated, "
               "in the thread evaluating it")
        if "buildtool.loader" not in sys.modules:  # (no buildtool here: a pyrule's own process, say)
            msg += (f"; {name}() was called in a process that evaluates no BUILD.py (a pyrule's function runs "
                    "in a Python process of its own, which imports the function's module: keep the function in "
                    "a module that declares no targets and calls no getenv() when imported)")
        raise OutsideEvaluation(msg)
    return ctx


def evaluating() -> PackageContext | None:
    """The context of the BUILD.py this thread evaluates, or None (no error, unlike
    ``current_context``: for helpers that also run outside an evaluation)."""
    return _current.get()


def set_context(ctx: PackageContext | None) -> object:
    return _current.set(ctx)


def reset_context(token: object) -> None:
    _current.reset(token)  # type: ignore[arg-type]


_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep  # buildtool itself (a venv may be in the root)


def _call_site(ctx: PackageContext) -> tuple[str, int, str]:
    """(file, line) of the declaration: the BUILD.py line that called, or the innermost
    workspace file (a macro) when no BUILD.py frame is found; and `` (in the macro at
    tools/macros.py:12)`` when a function of a workspace module declared the target, else
    "" (a BUILD.py line alone does not show which of the macro's lines went wrong)."""
    frame = sys._getframe(2)
    root = ctx.root + os.sep
    inner: tuple[str, int] | None = None  # the innermost workspace frame that is not the BUILD.py
    while frame is not None:
        fn = frame.f_code.co_filename
        if fn == ctx.buildfile:
            break
        if inner is None and fn.startswith(root) and not fn.startswith(_OURS):
            inner = (ctx.rel(fn), ctx.line_of(frame))
        frame = frame.f_back  # type: ignore[assignment]
    macro = f" (in the macro at {inner[0]}:{inner[1]})" if inner is not None else ""
    if frame is not None:
        return ctx.rel(ctx.buildfile), ctx.line_of(frame), macro
    return (*inner, macro) if inner is not None else (ctx.rel(ctx.buildfile), 0, "")


def _refuse_at_import(ctx: PackageContext, kind: str) -> None:
    """A rule called by a workspace module's own top-level code as the module is imported:
    exit 2 at that line.  A module is imported once a build, so what it declares went to the
    first package importing it and to no other (and watch lost it on re-evaluating that
    package).  A file each BUILD.py runs (``runpy.run_path``, ``exec``) is no import: each
    package gets its targets, as Make's ``include``."""
    frame = sys._getframe(2)
    root = ctx.root + os.sep
    while frame is not None:
        fn = frame.f_code.co_filename
        if fn == ctx.buildfile:
            return
        if frame.f_code.co_name == "<module>" and fn.startswith(root) and not fn.startswith(_OURS):
            name = frame.f_globals.get("__name__", "")
            module = sys.modules.get(name) if not name.startswith("<") else None  # (runpy's "<run_path>")
            if module is not None and getattr(module, "__file__", None) == fn:  # (being imported)
                rel, line = ctx.rel(fn), ctx.line_of(frame)
                raise BuildfileError(
                    f"{kind}() called while {rel} is imported (by //{ctx.pkg}): a module is imported once for "
                    "the whole build, so what it declares would belong to whichever package imported it first, "
                    "and to no other; declare targets in a function of the module (a macro) that each BUILD.py "
                    "calls", rel, line)
        frame = frame.f_back  # type: ignore[assignment]


def _declare(kind: str, attrs: dict[str, Any], args: tuple[Any, ...] = ()) -> None:
    ctx = current_context()
    _refuse_at_import(ctx, kind)
    path, line, macro = _call_site(ctx)
    if args:
        msg = (f"{kind}() takes keyword attributes only (got {len(args)} positional: {args[0]!r}...); "
               f"write {kind}(name=..., ...)")
        raise BuildfileError(msg + macro, path, line)
    allowed = RULE_ATTRS[kind]
    for key in attrs:
        if key not in allowed:
            import difflib  # (only for this error)

            low = key.lower()
            alias = low if low in allowed else ATTR_ALIASES.get(low)
            # (a close spelling that starts alike, evn for env; else a closer one: bogus is no outs)
            near = [alias] if alias in allowed else [
                c for c in difflib.get_close_matches(low, allowed, n=3, cutoff=0.6)
                if c[0] == low[:1] or difflib.SequenceMatcher(None, low, c).ratio() >= 0.7][:1]
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            name = attrs.get("name")
            who = f"//{ctx.pkg}:{name}: " if isinstance(name, str) and name else ""  # (a macro's loop)
            msg = (
                f"{who}{kind}() got an unknown attribute {key!r}{hint}; "
                f"allowed attributes are: {', '.join(allowed)}"
            )
            raise BuildfileError(msg + macro, path, line)
    for key in REQUIRED_ATTRS[kind]:
        if key not in attrs:
            msg = f"{kind}() is missing the required attribute {key!r}"
            raise BuildfileError(msg + macro, path, line)
    name = attrs["name"]
    if not isinstance(name, str):
        msg = f"{kind}() attribute 'name' must be a string (got {name!r})"
        raise BuildfileError(msg + macro, path, line)
    try:
        check_name(name)
    except LabelError as e:
        raise BuildfileError(str(e) + macro, path, line) from None
    previous = ctx.declarations.get(name)
    if previous is not None:
        msg = (
            f"target {name!r} is defined twice in package //{ctx.pkg} "
            f"(first at {previous.path}:{previous.line})"
        )
        raise BuildfileError(msg + macro, path, line)
    ctx.declarations[name] = Declaration(kind, attrs, path, line, macro, ctx.pkg)


def genrule(*args: Any, **attrs: Any) -> None:
    """Declare a shell command that turns ``srcs`` into ``outs`` (see docs/user-guide.md)."""
    _declare("genrule", attrs, args)


def test(*args: Any, **attrs: Any) -> None:
    """Declare a test: a command whose success is the result; run by ``buildtool test``."""
    _declare("test", attrs, args)


test.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def group(*args: Any, **attrs: Any) -> None:
    """Declare a named set of targets (like a phony Make target)."""
    _declare("group", attrs, args)


def pyrule(*args: Any, **attrs: Any) -> None:
    """Declare a Python function (``"module:function"``) run in its own process as an action."""
    _declare("pyrule", attrs, args)


class Globbed(str):
    """A path glob() returned.  An output found in place by a glob (a copy left on disk)
    is left out of srcs quietly; the same path given otherwise (written by hand, or a glob
    result copied with str()) is left out with a warning (graph.py)."""

    __slots__ = ()


def glob(include: list[str] | str, exclude: list[str] | None = None, *, allow_empty: bool = True) -> list[str]:
    """Source files of this package matching ``include`` minus ``exclude``, sorted;
    ``allow_empty=False``: none is an error (Bazel's attribute: a pattern that matches
    nothing, ``*.cpp`` for ``.cc`` files, otherwise makes an empty srcs list)."""
    ctx = current_context()
    for what, v in (("include", include), ("exclude", exclude or [])):
        if not isinstance(v, (str, list, tuple)):
            path, line, macro = _call_site(ctx)
            msg = f"glob() {what} must be a pattern or a list of patterns (got {v!r})"
            raise BuildfileError(msg + macro, path, line)
    if not isinstance(allow_empty, bool):
        path, line, macro = _call_site(ctx)
        raise BuildfileError(f"glob() allow_empty must be True or False (got {allow_empty!r})" + macro, path, line)
    inc = [include] if isinstance(include, str) else list(include)
    exc = [exclude] if isinstance(exclude, str) else list(exclude or [])
    result = ctx.glob_fn(ctx.pkg, inc, exc)
    if not result and not allow_empty:
        path, line, macro = _call_site(ctx)
        msg = f"glob({inc!r}{f', exclude={exc!r}' if exc else ''}) matches no file of //{ctx.pkg} (allow_empty=False)"
        raise BuildfileError(msg + macro, path, line)
    prefix = f"{ctx.pkg}/" if ctx.pkg else ""
    ctx.globbed.update(prefix + p for p in result)
    objs = ctx._globbed_objs
    return [objs.get(p) or objs.setdefault(p, Globbed(p)) for p in result]


def fail(*message: object, sep: str = " ") -> NoReturn:
    """Stop evaluating with ``message`` (its parts joined by ``sep``, as Bazel's ``fail()``)
    as an error of the BUILD.py line that called (and of the macro's line, when a macro
    called): exit 2.  For macros that check their own arguments; a Python exception says
    the same, prefixed with its type."""
    ctx = current_context()
    path, line, macro = _call_site(ctx)
    raise BuildfileError((sep.join(map(str, message)) or "fail() called") + macro, path, line)


def getenv(name: str, default: str | None = None) -> str | None:
    """Read an environment variable while evaluating; tracked so a change re-evaluates."""
    ctx = current_context()
    if not isinstance(name, str) or not name or "=" in name or "\0" in name:
        path, line, macro = _call_site(ctx)
        raise BuildfileError(f"getenv() takes a variable name (got {name!r})" + macro, path, line)
    value = os.environ.get(name)
    ctx.env_reads[name] = value
    return default if value is None else value
