"""Query: ``buildtool query EXPR`` and ``buildtool graph`` — read-only questions about the
build graph (nothing is hashed or run).

Expressions: ``deps(PATTERN)`` (the targets matched and everything they need),
``rdeps(UNIVERSE, TARGET)`` (the targets of UNIVERSE's closure that depend on TARGET,
transitively, TARGET included if it is in it; TARGET may be a file's label, then the
targets that read it, as a source, a pyrule's module, a dependency's output or a header
the last build's depfile named, and theirs), ``outputs(PATTERN)`` (the files the
matched targets and their dependencies produce), ``inputs(PATTERN)`` (the files the
matched targets read: their sources, their dependencies' outputs, a pyrule's modules and
the headers their last depfile named, as ``ninja -t deps`` lists them), ``kind(REGEX,
PATTERN)`` (the matched targets whose kind, ``genrule``, ``test``, ``group``, ``pyrule``, the
regular expression finds, as Bazel's), ``tests(PATTERN)`` (the matched test targets and the
tests of the matched groups, through groups, as Bazel's ``tests()`` expands test suites), or
a bare PATTERN (the targets it matches).  ``kind()`` and ``tests()`` may take the targets of
``deps()``, ``rdeps()`` or one another for PATTERN (``kind(test, deps(//app))``); other
functions do not nest.  An argument may be
quoted (``deps("//:a,b")``), for a target name with a comma.  Wildcard patterns
include test targets here.  ``graph`` prints the dependency graph as Graphviz dot or JSON
(compdb.py: compile_commands.json).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from buildtool.errors import UserError
from buildtool.graph import Graph, GraphBuilder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from buildtool.record import BuildRecord

_EXPR = re.compile(r"^\s*(\w+)\s*\((.*)\)\s*$", re.S)
FUNCTIONS = ("deps", "rdeps", "outputs", "inputs", "kind", "tests")


@dataclass(slots=True)
class Query:
    fn: str  # deps | rdeps | outputs | inputs | kind | tests | pattern
    args: list[str]
    inner: Query | None = None  # kind()/tests() of deps(...), rdeps(...) or another kind()/tests()


_FORMS = ("deps(PATTERN), rdeps(PATTERN, TARGET), outputs(PATTERN), inputs(PATTERN), kind(REGEX, PATTERN), "
          "tests(PATTERN) or a pattern (kind() and tests() may take deps(), rdeps(), kind() or tests() for PATTERN)")


def parse(text: str) -> Query:
    opened, closed = text.count("("), text.count(")")
    if opened != closed:
        msg = f"query {text!r}: unbalanced parentheses ({opened} '(' and {closed} ')'); expected {_FORMS}"
        raise UserError(msg)
    m = _EXPR.match(text)
    if m is None:
        if opened or not text.split():  # ('' meant //... silently; say //... for that)
            raise UserError(f"query {text!r}: expected {_FORMS}")
        return Query("pattern", text.split())
    fn, inner = m.group(1), m.group(2)
    if fn in ("kind", "tests") and "(" in inner:
        return _filter_of(fn, inner, text)
    if "(" in inner:
        first = inner.find(")")  # ("deps(a) deps(b)": the first call closes before the second opens)
        if 0 <= first < inner.find("("):
            msg = f"query {text!r}: one function a query; to combine, run one query per expression"
        else:
            msg = f"query {text!r}: functions do not nest; each takes patterns or labels (expected {_FORMS})"
        raise UserError(msg)
    args = _split_args(inner, text)
    want = {"deps": 1, "outputs": 1, "inputs": 1, "rdeps": 2, "kind": 2, "tests": 1}.get(fn)
    if want is None:
        msg = f"query {text!r}: unknown function {fn!r}; known: {', '.join(FUNCTIONS)}"
        raise UserError(msg)
    if len(args) != want:
        msg = f"query {text!r}: {fn}() takes {want} argument{'s' if want > 1 else ''}, got {len(args)}"
        if len(args) > want:
            msg += f" (a label with a comma in it goes in quotes: {fn}(\"//:a,b\"{', ...' if want > 1 else ''}))"
        raise UserError(msg)
    if fn in ("kind", "tests"):  # (the targets a pattern matches, filtered: as of a nested query)
        return Query(fn, [_regex(args[0], text)] if fn == "kind" else [], Query("pattern", args[-1].split()))
    return Query(fn, args)


def _regex(regex: str, text: str) -> str:
    """kind()'s first argument, checked."""
    try:
        re.compile(regex)
    except re.error as e:
        raise UserError(f"query {text!r}: kind()'s first argument is not a regular expression ({e})") from None
    return regex


def _filter_of(fn: str, inner: str, text: str) -> Query:
    """``kind(REGEX, EXPR)`` or ``tests(EXPR)`` of a query giving targets (Bazel's most
    used nesting, ``kind(test, deps(//x))``, was exit 2)."""
    regex, rest = "", inner
    if fn == "kind":
        regex, comma, rest = inner.partition(",")
        regex = regex.strip().strip("'\"")
        if not comma or not regex:
            raise UserError(f"query {text!r}: kind() takes 2 arguments: a regular expression, then targets")
        _regex(regex, text)
    sub = parse(rest.strip())
    if sub.fn in ("outputs", "inputs"):
        raise UserError(f"query {text!r}: {fn}() takes targets, and {sub.fn}() gives files")
    return Query(fn, [regex] if fn == "kind" else [], sub)


def _split_args(inner: str, text: str) -> list[str]:
    """The comma-separated arguments; a quoted part may hold commas (``"//:a,b"``: a target
    name may contain them), as in Bazel's query language, and an argument may mix quoted
    and bare patterns (``outputs(//p:a "//p:a,b")``).  A quote left open is exit 2."""
    out: list[str] = []
    cur: list[str] = []
    quote = ""
    for c in inner:
        if quote:
            if c == quote:
                quote = ""
            else:
                cur.append(c)
        elif c in "\"'":
            quote = c
        elif c == ",":
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    if quote:
        msg = f"query {text!r}: a {quote} is left open; close it after the label it quotes"
        raise UserError(msg)
    out.append("".join(cur).strip())
    if out == [""]:
        return []  # (f(): said as "takes 1 argument, got 0")
    if "" in out:  # (deps(//:a,) was deps(//:a), the empty one dropped without a word)
        msg = f"query {text!r}: argument {out.index('') + 1} is empty (a comma with nothing after or before it)"
        raise UserError(msg)
    return out


def roots(builder: GraphBuilder, patterns: list[str]) -> list[str]:
    """Labels matched by the patterns, tests included, manual targets only when named."""
    out: dict[str, None] = {}  # (ordered; a list's `in` made 30,000 labels a 7 s scan)
    for p in patterns or ["//..."]:
        found: list[str] = []
        errors: list[str] = []
        for tests in (False, True):
            try:
                found.extend(builder.expand_patterns([p], want_tests=tests))
            except UserError as e:
                errors.append(str(e))
                if not str(e).startswith("pattern "):
                    raise  # unknown package or target: the same error either way
        if not found:
            msg = f"pattern {p!r} matches no targets"
            raise UserError(msg)
        out.update(dict.fromkeys(found))
    return list(out)


def evaluate(
    builder: GraphBuilder, q: Query, record: BuildRecord | None = None, warn: Callable[[str], None] | None = None,
) -> tuple[Graph, list[str]]:
    """The graph of the query's universe and the result (labels or output paths).
    ``record``: the build record, whose depfile lists tell who read a file named in
    ``rdeps`` that no BUILD.py lists (a header); ``warn`` is told of the universe's depfile
    targets it has no list for (never built here, or cleaned): the answer may lack them."""
    if q.fn == "rdeps":
        universe = roots(builder, q.args[0].split())
        target: list[str] = []
        files: list[str] = []  # files named (//lib:src/core.py, //lib:VERSION, //gen:out.h): who reads them
        makers: list[str] = []  # the targets that make those of them that are outputs
        for item in q.args[1].split():
            try:
                target.extend(roots(builder, [item]))
            except UserError:
                found = _file_of(builder, item)
                if found is None:
                    raise
                files.append(found[0])
                if found[1] is not None:
                    makers.append(found[1])
        graph = builder.build(list(dict.fromkeys([*universe, *target, *makers])))
        wanted = {graph.by_label[lab] for lab in target}
        if makers:  # (an output is an input of every target depending on its maker, as the key has it)
            made_by = {graph.by_label[lab] for lab in makers}
            wanted |= {t.id for t in graph.targets if not made_by.isdisjoint(t.deps)}
        if files:  # (a target reads its srcs; a pyrule, the modules its function imports too)
            from buildtool.keys import pyrule_module_files

            named, root = set(files), builder.loader.ws.root
            wanted |= {t.id for t in graph.targets if not named.isdisjoint(t.srcs)
                       or (t.kind == "pyrule" and t.fn and not named.isdisjoint(pyrule_module_files(root, t.fn)))
                       or (t.depfile is not None and record is not None
                           and not named.isdisjoint(record.discovered(t.label) or ()))}
        in_universe = graph.closure(graph.by_label[lab] for lab in universe)
        if files and warn is not None:
            _say_unrecorded(warn, [t for t in graph.targets if t.id in in_universe], record,
                            "the files they read are known only once they are built, so this answer may lack them")
        seen = set(wanted)
        stack = list(wanted)
        while stack:
            x = stack.pop()
            for c in graph.dependents[x]:
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
        # (within the universe's closure, TARGET too: rdeps(//sub/..., //lib:gen) printed
        # //lib:gen, and rdeps(//lib:gen, //...) every target, as Bazel's does not)
        result = [t.label for t in graph.targets if t.id in seen and t.id in in_universe]
        if files and not result and not target and warn is not None:  # (an empty answer read as "safe to edit")
            warn(f"no target of {q.args[0]} reads {', '.join(files)}: it is in no target's srcs, nor made by one "
                 "(a command that reads it without declaring it is not rerun by its edits; a BUILD.py or macro "
                 "module shapes the graph, not an action)")
        return graph, result
    if q.inner is not None:  # kind()/tests() of another query's targets
        graph, found = evaluate(builder, q.inner, record, warn)
        if q.fn == "kind":
            kinds = re.compile(q.args[0])
            return graph, [lab for lab in found if kinds.search(graph.targets[graph.by_label[lab]].kind)]
        return graph, _tests_of(graph, found)
    # (an argument may hold several patterns, as the bare form does: labels hold no spaces)
    matched = roots(builder, [p for a in q.args for p in a.split()])
    graph = builder.build(matched)
    if q.fn == "pattern":
        return graph, matched
    if q.fn == "inputs":  # (the matched targets' own: what their keys hash)
        from buildtool.keys import pyrule_module_files

        read: set[str] = set()
        root = builder.loader.ws.root
        for lab in matched:
            t = graph.targets[graph.by_label[lab]]
            read.update(graph.inputs[t.id])
            if t.kind == "pyrule" and t.fn:
                read.update(pyrule_module_files(root, t.fn))
            if t.depfile is not None and record is not None:
                read.update(record.discovered(lab) or ())
        if warn is not None:
            _say_unrecorded(warn, [graph.targets[graph.by_label[lab]] for lab in matched], record,
                            "what their depfile names is known once they are built")
        return graph, sorted(read)
    closure = graph.closure(graph.by_label[lab] for lab in matched)
    if q.fn == "deps":
        return graph, [t.label for t in graph.targets if t.id in closure]
    files: list[str] = []
    for t in graph.targets:
        if t.id in closure:
            files.extend(t.outs)
    return graph, sorted(set(files))


def _tests_of(graph: Graph, matched: list[str]) -> list[str]:
    """The tests among ``matched`` and those a matched group holds, through its groups."""
    out: dict[str, None] = {}
    seen: set[int] = set()
    stack = [graph.by_label[lab] for lab in reversed(matched)]
    while stack:
        t = graph.targets[stack.pop()]
        if t.id in seen:
            continue
        seen.add(t.id)
        if t.kind == "test":
            out[t.label] = None
        elif t.kind == "group":
            stack.extend(reversed(t.deps))
    return list(out)


def _say_unrecorded(warn: Callable[[str], None], targets: list[Any], record: BuildRecord | None, why: str) -> None:
    """Warn of the ``targets`` with a depfile that the build record has no list for (never
    built here, or cleaned): what they read beyond their declared inputs is not known."""
    unknown = [t.label for t in targets if t.depfile is not None
               and (record is None or record.discovered(t.label) is None)]
    if unknown:
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        warn(f"{len(unknown)} target(s) with a depfile have no build record here ({', '.join(unknown[:3])}"
             f"{more}): {why}")


def _file_of(builder: GraphBuilder, text: str) -> tuple[str, str | None] | None:
    """The workspace-relative path of the file a label names (``//lib:src/core.py``,
    ``//lib:VERSION``, ``:x.txt``), if it is a file there or a declared output, and no
    target, with the label of the target that makes it (None for a source); else None
    (the caller's error stands: no such package, no such target).  As ``srcs`` takes it:
    a file of a subpackage, or a missing file below a package, is exit 2 saying so."""
    import os

    from buildtool import labels

    cur = builder.current_package()
    # (sub:f.txt from the working directory, as patterns take it; lib/x.txt stays a path typed)
    typed, text = text, labels.from_here(text, builder.cwd_pkg) if ":" in text else text
    found = labels.file_label(text, cur)
    if found is None:
        try:
            found = labels.parse_label(text, cur)
        except labels.LabelError:
            meant = _file_typed_as_path(builder, typed)
            if meant is not None:  # (`rdeps(//..., lvm.h)`: a Make user's path)
                raise UserError(f"{typed!r} is a file path, not a label: did you mean {meant}?") from None
            return None
    pkg, name = found
    if pkg and not builder.loader.package_exists(pkg):  # (the root's: any workspace file, as a pyrule's module)
        return None
    path = f"{pkg}/{name}" if pkg else name
    sub = builder.subpackage_on_the_way(pkg, path) if "/" in name else None
    if sub is not None:
        raise UserError(f"{typed!r} is in package //{sub}, not //{pkg}: refer to it as '//{sub}:{path[len(sub) + 1:]}'")
    producer = builder.producer_of(path)
    if producer is not None:  # (what reads it: its maker's dependents, and depfiles naming it)
        return path, producer
    if os.path.isfile(os.path.join(builder.loader.ws.root, path)):
        return path, None
    if "/" in name:  # (a file label: a target's name has no '/')
        raise UserError(f"{typed!r} names no target and there is no file {path}")
    return None


def _file_typed_as_path(builder: GraphBuilder, text: str) -> str | None:
    """The label of the workspace file (or declared output) that ``text``, a path relative
    to the directory the command runs in, names (``src/lvm.h`` -> ``//src:lvm.h``), quoted,
    or None."""
    import os
    import posixpath

    if text.startswith(("/", "//", ":")) or ":" in text:
        return None
    path = posixpath.normpath(posixpath.join(builder.cwd_pkg, text))
    if path.startswith("../") or path in (".", ".."):
        return None
    if builder.producer_of(path) is None and not os.path.isfile(os.path.join(builder.loader.ws.root, path)):
        return None
    pkg = posixpath.dirname(path)
    while pkg and not builder.loader.package_exists(pkg):
        pkg = posixpath.dirname(pkg)
    return f"'//{pkg}:{path[len(pkg) + 1:] if pkg else path}'"


def _dot_id(label: str) -> str:
    """``label`` as a quoted DOT ID: UTF-8 as it is (Graphviz knows no ``\\u`` escape, which
    JSON's quoting gave ``//café:n``), ``"`` and ``\\`` escaped, then a byte that is no
    UTF-8 (a package name that is not) as ``\\xNN`` text: after, so that a package named
    with the four characters ``\\xff`` is another node (``\\\\xff``)."""
    text = label.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace") + '"'


def to_dot(graph: Graph) -> str:
    lines = ["digraph buildtool {", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    for t in graph.targets:
        shape = {"group": "ellipse", "test": "hexagon"}.get(t.kind)
        attrs = f' [shape={shape}]' if shape else ""
        lines.append(f"  {_dot_id(t.label)}{attrs};")
    for t in graph.targets:
        for d in t.deps:
            lines.append(f"  {_dot_id(t.label)} -> {_dot_id(graph.targets[d].label)};")
    lines.append("}")
    return "\n".join(lines)


def to_json(graph: Graph) -> str:
    nodes = [
        {
            "label": t.label,
            "kind": t.kind,
            "deps": [graph.targets[d].label for d in t.deps],
            "srcs": list(t.srcs),
            "outs": list(t.outs),
            "priority": t.priority,
            "pool": t.pool,
            "where": t.where,
        }
        for t in graph.targets
    ]
    return json.dumps({"version": 1, "targets": nodes}, indent=1)

