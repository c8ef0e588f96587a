"""Graph: immutable, validated targets built from the loader's declarations.

Everything is checked once, before anything runs: bad labels and patterns, unknown
targets ("did you mean"), missing source files, duplicate outputs, outputs outside the
workspace or equal to a source, bad attributes, and cycles (shown as a path).
Per-run state never lives here: the plan owns it, so watch mode can reuse a graph.
"""

from __future__ import annotations

import json
import operator
import os
import posixpath
import stat
import sys

from buildtool import labels
from buildtool.atomic import NAME_MAX, RESTORE_TMP_SUFFIX
from buildtool.config import RESERVED_ENV
from buildtool.errors import BuildfileError, BuildtoolError, UserError
from buildtool.workspace import (
    ALWAYS_SKIPPED,
    BUILDFILE,
    CACHEDIR_TAG,
    FS_ENCODING,
    IGNORE_FILE,
    MARKER,
    STATE_DIR,
    at_or_above,
    file_kind,
    pkg_relative,
)

PATH_MAX = 4096  # bytes in a path the kernel takes, its NUL included

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
    from typing import Any

    from buildtool.dsl import Declaration
    from buildtool.loader import Loader
# The loader, the DSL and substitution are GraphBuilder's alone (it is given a Loader and
# imports subst once): an incremental build from the no-op snapshot unpickles its Graph
# without them (~2 ms).

_ENV_NAME_OK = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
# Target's fields in the order of its __init__ parameters: a Target pickles as Target(*values).
_TARGET_FIELDS = ("id", "label", "kind", "pkg", "cmd", "srcs", "deps", "outs", "env", "pass_env", "tools", "priority",
                  "manual", "pool", "timeout", "fn", "kwargs_json", "where", "always", "flaky", "exclusive", "depfile",
                  "local")



def _closest(wanted: str, names: list[str]) -> str | None:
    """The name most like ``wanted`` (difflib's ratio, cutoff 0.6), ties going to one that
    starts with it, then the shortest, then the first in order: for //libs/pkg0 among
    pkg00..pkg39, pkg00 (difflib's own tie-break is the greatest string: pkg30)."""
    import difflib

    found = difflib.get_close_matches(wanted, names, n=16)
    if not found:
        return None
    def rank(n: str) -> tuple[float, bool, int, str]:
        return (-round(difflib.SequenceMatcher(None, wanted, n).ratio(), 9), not n.startswith(wanted), len(n), n)
    return min(found, key=rank)

class Target:
    """One node of the build graph: a command (or group) with its inputs and outputs.
    Never changed once made: graphs are shared by watch-mode cycles and pickled."""

    __slots__ = _TARGET_FIELDS

    def __init__(
        self,
        id: int,  # dense, in discovery order; the scheduler's final tie-break
        label: str,  # canonical //pkg:name
        kind: str,  # genrule | test | group | pyrule
        pkg: str,
        cmd: str,  # after substitution ("" for a group)
        srcs: tuple[str, ...],  # workspace-relative source files read directly
        deps: tuple[int, ...],  # targets whose outputs are inputs (srcs labels + deps), in order
        outs: tuple[str, ...],  # workspace-relative output files
        env: tuple[tuple[str, str], ...],
        pass_env: tuple[str, ...],
        tools: tuple[str, ...],
        priority: int,
        manual: bool,
        pool: str | None,
        timeout: float | None,
        fn: str | None,  # pyrule "module:function"
        kwargs_json: str | None,  # pyrule kwargs, compact JSON, dict keys in the order written
        where: str,  # "path:line" of the declaration
        always: bool = False,  # runs on every build, never cached or recorded as fresh (implies manual)
        flaky: int = 0,  # test: rerun a failing test up to this many times
        exclusive: bool = False,  # test: runs alone, no other target running
        depfile: str | None = None,  # genrule: workspace-relative Make depfile naming discovered inputs (discovered.py)
        local: bool = False,  # never runs on a remote executor (docs/remote.md)
    ) -> None:
        self.id = id
        self.label = label
        self.kind = kind
        self.pkg = pkg
        self.cmd = cmd
        self.srcs = srcs
        self.deps = deps
        self.outs = outs
        self.env = env
        self.pass_env = pass_env
        self.tools = tools
        self.priority = priority
        self.manual = manual
        self.pool = pool
        self.timeout = timeout
        self.fn = fn
        self.kwargs_json = kwargs_json
        self.where = where
        self.always = always
        self.flaky = flaky
        self.exclusive = exclusive
        self.depfile = depfile
        self.local = local

    def __reduce__(self) -> tuple[type[Target], tuple[Any, ...]]:
        # Pickled (.buildtool/graph) as its field values: one call per target to unpickle.
        return (Target, _target_values(self))


_target_values = operator.attrgetter(*_TARGET_FIELDS)
# What a target does, but for its id, its dependencies' ids and where it was declared.
_definition = operator.attrgetter(*(f for f in _TARGET_FIELDS if f not in ("id", "deps", "where")))


class Graph:
    """The validated targets of one build request, indexed by id and by label."""

    __slots__ = ("_files", "by_label", "dependents", "inputs", "requested", "targets")

    def __init__(
        self,
        targets: tuple[Target, ...],
        by_label: dict[str, int],
        requested: tuple[int, ...],  # what the patterns asked for, in order
        dependents: tuple[tuple[int, ...], ...],  # reverse edges, per id
        inputs: tuple[tuple[str, ...], ...],  # per id: every input file (srcs + deps' outputs); a group's: ()
    ) -> None:
        self._files: _FilesOf | None = None  # (outputs_of: the groups' files, flattened when asked)
        self.targets = targets
        self.by_label = by_label
        self.requested = requested
        self.dependents = dependents
        self.inputs = inputs

    def __reduce__(self) -> tuple[type[Graph], tuple[Any, ...]]:
        # Pickled as Graph(*fields), in field order: 6% smaller than a slotted class's default state.
        return (Graph, (self.targets, self.by_label, self.requested, self.dependents, self.inputs))

    def redefined(self, old: Graph) -> set[int]:
        """The targets that are not in ``old`` as they are here: a new label, or any field
        but the id and the declaration's line changed (dependencies compared by label).
        A target outside this set does what it did in ``old``, with the same inputs."""
        out: set[int] = set()
        for t in self.targets:
            i = old.by_label.get(t.label)
            if i is None:
                out.add(t.id)
                continue
            o = old.targets[i]
            if _definition(t) != _definition(o) or [self.targets[d].label for d in t.deps] != [
                old.targets[d].label for d in o.deps
            ]:
                out.add(t.id)
        return out

    def topo_order(self, extra: Mapping[int, Sequence[int]] | None = None) -> list[int]:
        """Every target id, each after all of its dependencies (Kahn's algorithm), first in
        first out: targets with no order between them come by id, as the scheduler starts them
        when nothing else tells them apart (a dry run listed 3,000 independent targets from
        the last to the first, the build ran them from the first).  ``extra``: target -> more
        dependencies (a build's edges from depfiles); a cycle through them leaves its
        targets out."""
        pending = [len(t.deps) for t in self.targets]
        after: dict[int, list[int]] = {}
        for r, makers in (extra or {}).items():
            pending[r] += len(makers)
            for m in makers:
                after.setdefault(m, []).append(r)
        order = [i for i, n in enumerate(pending) if n == 0]
        for i in order:  # (the list grows as it is walked: a queue)
            for c in (*self.dependents[i], *after.get(i, ())) if after else self.dependents[i]:
                pending[c] -= 1
                if pending[c] == 0:
                    order.append(c)
        return order

    def closure(self, start: Iterable[int]) -> set[int]:
        """``start`` and every target they depend on, directly or not."""
        seen = set(start)
        stack = list(seen)
        while stack:
            for d in self.targets[stack.pop()].deps:
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        return seen

    def closure_inputs(self, tid: int) -> list[str]:
        """``tid``'s inputs, then those of every target it depends on, directly or not
        (their sources and their own dependencies' outputs), each path once: what a test
        may read at run time, as Bazel's runfiles are transitive (a wrapper that reads a
        file made two levels down), and so what a remote worker's input root must hold.
        A test's key covers them through its dependencies' closure digests (runner.py)."""
        seen: dict[str, None] = dict.fromkeys(self.inputs[tid])
        for j in sorted(self.closure(self.targets[tid].deps)):
            seen.update(dict.fromkeys(self.inputs[j]))
        return list(seen)

    def outputs_of(self, tid: int) -> tuple[str, ...]:
        """The files a label stands for: its outputs, or a group's members' files (each
        once, in order, as its readers have them; a group keeps no list of them in the
        graph: _FilesOf, made once a graph object and not pickled)."""
        t = self.targets[tid]
        if t.kind != "group":
            return t.outs
        files = self._files
        if files is None:
            files = self._files = _FilesOf(len(self.targets))
            for u in self.targets:
                if u.kind == "group":
                    files.group(u.id, [("label", d) for d in u.deps])
                else:
                    files.set(u.id, u.outs)
        return files[tid]


class _FilesOf:
    """The files each target stands for when another reads it, by id: its outputs, or for
    a group its members' files (in order, each once), flattened when a reader asks and
    kept for the groups asked only -- each group keeping its whole closure was quadratic
    in time, memory and the pickled graph for a chain of nested groups (8,000: 3.3 s and a
    161 MB graph file), where only the last is read; a DAG of groups that many targets
    read (cc_library's) is walked once per group read, not once per reader."""

    __slots__ = ("_members", "_memo", "_outs")

    def __init__(self, n: int) -> None:
        self._outs: list[tuple[str, ...] | None] = [()] * n
        self._members: dict[int, list[tuple[str, Any]]] = {}  # group -> ("file", path) / ("label", id)
        self._memo: dict[int, tuple[str, ...]] = {}  # the groups a reader asked for

    def set(self, i: int, outs: tuple[str, ...]) -> None:
        self._outs[i] = outs

    def group(self, i: int, members: list[tuple[str, Any]]) -> None:
        self._outs[i] = None
        self._members[i] = members

    def __getitem__(self, i: int) -> tuple[str, ...]:
        got = self._outs[i]
        if got is not None:
            return got
        got = self._memo.get(i)
        if got is not None:
            return got
        out: list[str] = []
        seen: set[str] = set()
        groups = {i}
        stack = [iter(self._members[i])]
        while stack:  # (depth-first in declaration order, as a member's files come where it is listed)
            for k, v in stack[-1]:
                if k == "label" and self._outs[v] is None and v not in self._memo:
                    if v not in groups:
                        groups.add(v)
                        stack.append(iter(self._members[v]))
                        break
                    continue
                # (a group flattened before: its files, as walking it again would add them)
                for p in (v,) if k == "file" else self._outs[v] or self._memo.get(v, ()):
                    if p not in seen:
                        seen.add(p)
                        out.append(p)
            else:
                stack.pop()
        got = self._memo[i] = tuple(out)
        return got


MAX_ENV_STRING = 128 * 1024  # NAME=value, as execve takes one (MAX_ARG_STRLEN, its NUL included)
MAX_PRIORITY = 10**9  # (`graph --format json` wrote it: json cannot print an int of over 4,300 digits)
MAX_FLAKY = 100  # reruns of a failing test: more only runs a broken test for hours
MAX_TIMEOUT_S = 1e8  # ~3 years: in ms and ns (poll, REAPI's Duration) it fits every timer


def _together(errs: Sequence[BuildtoolError], what: str) -> UserError:
    """Several errors (-k) as one: each on a ``buildtool: error:`` line of its own, then how
    many ``what`` there were."""
    more = "".join(f"\nbuildtool: error: {e}" for e in errs[1:])
    return UserError(f"{errs[0]}{more}\n({len(errs)} {what}; nothing was built)")


def _not_a_file(full: str) -> str | None:
    """What is at ``full`` when it is there but is no regular file (a directory, a named
    pipe, a symlink to nothing), for an error; None otherwise, and for a package's
    directory (a label written with ':' for '/': another hint says that)."""
    try:
        st = os.lstat(full)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode) and os.path.exists(os.path.join(full, BUILDFILE)):
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(full)
        except OSError:
            return "a symlink to nothing"
    return None if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)


def _err(decl: Declaration, msg: str) -> BuildfileError:
    """The error of a declaration at its BUILD.py line, naming its target (a line of a
    macro's loop declares many) and the macro line that made it."""
    label = f"//{decl.pkg}:{decl.attrs['name']}"
    import re  # (errors only)

    # (//:lib is not in "did you mean //:lib_test", nor //:a in "bad label '//:a b'": a quoted
    # text names it only when it is the label whole)
    unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", msg)
    if not (re.search(re.escape(label) + r"(?![\w.+=,@~/-])", unquoted) or f"'{label}'" in msg or f'"{label}"' in msg):
        msg = f"{label}: {msg}"
    return BuildfileError(msg + decl.macro, decl.path, decl.line)


def _norm_rel(decl: Declaration, pkg: str, path: Any, attr: str) -> str:
    """A package-relative path -> workspace-relative, rejecting escapes."""
    if not isinstance(path, str) or not path:
        if attr == "depfile":  # (one path, not a list)
            raise _err(decl, f"attribute 'depfile' must be a non-empty path string (got {path!r})")
        raise _err(decl, f"{attr} entries must be non-empty strings (got {path!r})")
    if path.startswith("/"):
        raise _err(decl, f"{attr} path {path!r} must be relative to the package, not absolute")
    parts = path.split("/")
    if ".." in parts:
        hint = ("; a file of another package is named by its label, '//pkg:file'"
                if attr == "srcs" and not posixpath.normpath(f"{pkg}/{path}" if pkg else path).startswith("..") else "")
        raise _err(decl, f"{attr} path {path!r} must stay inside the package (no '..'){hint}")
    _text(decl, f"{attr} path", path)
    norm = posixpath.normpath(path)
    if norm in (".", "") or path.endswith("/"):
        raise _err(decl, f"{attr} path {path!r} must name a file")
    full = f"{pkg}/{norm}" if pkg else norm
    if full == STATE_DIR or full.startswith(STATE_DIR + "/"):
        raise _err(decl, f"{attr} path {path!r} is inside buildtool's state directory")
    if norm.endswith(RESTORE_TMP_SUFFIX):  # (a build deletes the one beside each output it runs)
        raise _err(decl, f"{attr} path {path!r} ends in {RESTORE_TMP_SUFFIX}, the suffix of buildtool's own temp "
                         "files (a restore cut short leaves one, and the next build deletes it): rename the file")
    if attr == "outs" and len(norm) > NAME_MAX // 4:  # (shorter, no name in it can be too long)
        for part in norm.split("/"):
            if len(os.fsencode(part)) > NAME_MAX:
                raise _err(decl, f"{attr} path {path!r} has a name of {len(os.fsencode(part))} bytes; "
                                 f"a file name can have at most {NAME_MAX}")
    return full


def _text(decl: Declaration, what: str, s: str) -> str:
    """``s``, refused when no command line, environment or file name can hold it: a NUL
    byte, or a lone surrogate (a str no encoding turns into bytes; a file name that is not
    UTF-8, as os.listdir decodes it, is fine)."""
    if "\0" in s:
        raise _err(decl, f"{what} {s!r} contains a NUL byte")
    try:
        s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        bad = e.object[e.start]
        raise _err(decl, f"{what} {s!r} contains a lone surrogate {bad!r}, which no command or file name "
                         "can hold") from None
    if FS_ENCODING is not None and not s.isascii():  # (a locale that is not UTF-8)
        try:
            s.encode(FS_ENCODING, "surrogateescape")
        except UnicodeEncodeError as e:  # (it failed when the command ran or the file was looked at: a traceback)
            bad = e.object[e.start]
            raise _err(decl, f"{what} {s!r} holds {bad!r}, which this locale's encoding ({FS_ENCODING}) "
                             "cannot give the system; use a UTF-8 locale (LANG=C.UTF-8)") from None
    return s


def _breaks_lines(s: str) -> bool:
    """Does ``s`` hold a control character (C0, DEL, C1) or a line or paragraph separator?
    Format characters (a zero-width non-joiner in a Persian word) and spaces are fine."""
    import unicodedata  # (only for a name str.isprintable refused: rare)

    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in s)


def _non_str_key(value: object) -> tuple[object] | None:
    """(a dict key inside ``value`` that is not a string,), or None if there is none."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    return (k,)
                stack.append(item)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return None


def _unjsonable(value: object, at: str = "", within: frozenset[int] = frozenset()) -> tuple[str, str] | None:
    """(the path, ``['models'][0]['when']``, and what it is) of the first value inside
    ``value`` that JSON cannot hold, or None."""
    if isinstance(value, (dict, list, tuple)):
        if id(value) in within:
            return at, "the dict or list it is inside (a circular reference)"
        within = within | {id(value)}
        items: Iterable[tuple[str, object]] = ((f"[{k!r}]", v) for k, v in value.items()) \
            if isinstance(value, dict) else ((f"[{i}]", v) for i, v in enumerate(value))
        for step, v in items:
            found = _unjsonable(v, at + step, within)
            if found is not None:
                return found
        return None
    if value is None or isinstance(value, (str, bool, int, float)):
        return None
    return at, f"a {type(value).__name__} ({value!r:.120})"


def _str_list(decl: Declaration, attr: str) -> list[Any]:
    v = decl.attrs.get(attr, [])
    if isinstance(v, str) or not isinstance(v, (list, tuple)):
        raise _err(decl, f"attribute {attr!r} must be a list of strings (got {v!r})")
    return list(v)


def _build_definition_file(path: str, read: set[str], probed: Set[str] = frozenset()) -> str | None:
    """What makes ``path`` part of the build's own definition (so never an output), or None.
    ``probed``: the paths evaluating looked for (a stat, an import), found or not."""
    first = path.split("/", 1)[0]
    if first in ALWAYS_SKIPPED:
        return f"inside {first}/, which buildtool never writes into"
    parts = path.split("/")
    inner = next((d for d in parts[1:-1] if d in ALWAYS_SKIPPED), None)
    if inner is not None:  # a nested repository (a submodule's .git/) or workspace's state
        return f"inside a {inner}/ directory, which buildtool never writes into"
    if len(parts) > 1 and parts[-1] in ALWAYS_SKIPPED:  # (a submodule's .git is a file)
        return f"a nested repository's or workspace's {parts[-1]}, which buildtool never writes"
    if path.rsplit("/", 1)[-1] == BUILDFILE:
        return f"a {BUILDFILE} file"
    if path in (MARKER, IGNORE_FILE):
        return f"the workspace's {path}"
    if path in read:
        return f"a file that evaluating the {BUILDFILE} files reads (imported or opened)"
    if path in probed:  # (refused only once made, the build passed first and failed from then on)
        return (f"a file whose existence evaluating the {BUILDFILE} files looks at (os.path.exists, os.stat, "
                "an import): what they declare would change once the build made it")
    return None


def _named_in_package(decls: dict[str, Declaration], pkg: str) -> dict[str, list[tuple[str, str]]]:
    """Each file path (workspace-relative) the package's declarations name -> what it is to
    each that names it (a source, an output or the depfile) and its label; made once a
    package (per depfile target it was quadratic: 13.6 s for a 2,000-source library)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, d in decls.items():
        lab = labels.label_str(pkg, name)
        for attr, what in (("srcs", "a source"), ("outs", "an output"), ("depfile", "the depfile")):
            v = d.attrs.get(attr)
            for e in (v,) if isinstance(v, str) else v if isinstance(v, (list, tuple)) else ():
                if isinstance(e, str) and not e.startswith((":", "//", "@")):
                    out.setdefault(posixpath.normpath(f"{pkg}/{e}" if pkg else e), []).append((what, lab))
    return out


def _realpath(path: str, memo: dict[str, str]) -> str:
    """``os.path.realpath`` of ``path`` (absolute, normalised, below a directory in ``memo``
    or ``/``), each directory on the way resolved once per ``memo``: realpath lstats every
    component of every path it is given, and 1,000 nested packages' outputs took 12 s."""
    todo: list[str] = []
    p = path
    while p not in memo:
        parent, base = os.path.split(p)
        if not base or parent == p:  # (/)
            memo[p] = os.path.realpath(p)
            break
        todo.append(p)
        p = parent
    for q in reversed(todo):
        parent, base = os.path.split(q)
        joined = os.path.join(memo[parent], base)
        memo[q] = os.path.realpath(joined) if os.path.islink(joined) else joined
    return memo[path]


def _boundary_file(path: str) -> str | None:
    """What makes ``path`` change which packages and sources the workspace has (so never an
    output: a build would make another graph than the one it ran), or None."""
    d, _, name = path.rpartition("/")
    if name == MARKER:
        return f"a {MARKER}, which makes {d}/ a workspace of its own that this one skips"
    if name == CACHEDIR_TAG and d:  # (one at the root is ignored)
        return f"a {CACHEDIR_TAG}, which marks {d}/ a cache directory that this workspace skips"
    return None


class GraphBuilder:
    """Turns patterns into a validated Graph, loading only the packages needed."""

    def __init__(self, loader: Loader, cwd_pkg: str) -> None:
        from buildtool import subst

        self._subst = subst  # (once here, not per target: a function-level import costs ~1 us)
        self.loader = loader
        self.cwd_pkg = cwd_pkg
        self.keep_going = False  # -k: a BUILD.py a wildcard loads that fails does not stop the others'
        self.default_test_timeout: float | None = None  # the test_timeout config key: a test's without timeout=
        self._outs_memo: dict[str, set[str]] = {}
        self._subpkg_memo: dict[str, bool] = {}  # directory -> holds a package (a BUILD.py)
        self._real_root: str | None = None  # the workspace root, links resolved (_output_behind)

    # -- patterns --------------------------------------------------------------------
    def current_package(self) -> str:
        """The nearest enclosing package of the working directory."""
        d = self.cwd_pkg
        while True:
            if self.loader.package_exists(d):
                return d
            if not d:
                return ""
            d = d.rsplit("/", 1)[0] if "/" in d else ""

    def expand_patterns(self, patterns: list[str], *, want_tests: bool) -> list[str]:
        """Labels matched by the patterns.  Wildcards skip manual targets and, unless
        ``want_tests``, tests; with ``want_tests`` wildcards select only tests."""
        cur = self.current_package()
        result: list[str] = []
        seen: set[str] = set()
        failed: list[UserError] = []  # (-k) the BUILD.py files that could not be evaluated
        failed_pkgs: set[str] = set()
        for text in patterns or ["//..."]:
            try:
                self._expand_one(text, cur, want_tests, result, seen, failed, failed_pkgs)
            except UserError as e:  # (-k: said with every other, not instead of them)
                if not self.keep_going:
                    raise
                if str(e) not in {str(f) for f in failed}:
                    failed.append(e)
        if failed:
            failed = list({str(e): e for e in failed}.values())  # (one BUILD.py reached by two patterns: said once)
            raise (_together(failed, "errors in the patterns and the BUILD.py files they load") if len(failed) > 1
                   else UserError(str(failed[0])))
        return result

    def _expand_one(self, text: str, cur: str, want_tests: bool, result: list[str], seen: set[str],
                    failed: list[UserError], failed_pkgs: set[str]) -> None:
        """Add the labels ``text`` matches to ``result``; under -k, a package whose BUILD.py
        cannot be evaluated (or declares a bad manual/always) goes to ``failed``, once,
        instead of raising."""
        if text.startswith(":"):
            self._check_here(text, cur)
        try:
            pat = labels.parse_pattern(text, cur, self.cwd_pkg)
        except labels.LabelError as e:
            if (below := self.package_below(text)) is None:
                raise self.pattern_error(text, e) from None
            pat = labels.parse_pattern(f"//{below}", cur, self.cwd_pkg)
        matched: list[str] = []
        tests_left = 0  # tests a build pattern passes over (said when it matches nothing else)
        skipped = 0  # manual and always=True targets the wildcard passes over (said likewise)
        if pat.kind == "target":
            decls = self._load_pkg_for(pat.pkg, text)
            if pat.name not in decls:
                raise UserError(self._unknown_msg(pat.pkg, pat.name, text, decls))
            matched.append(labels.label_str(pat.pkg, pat.name))
        else:
            if pat.kind == "package":
                pkgs = [pat.pkg]
                self._load_pkg_for(pat.pkg, text)
            else:
                pkgs = self.loader.packages_under(pat.pkg)
                if not pkgs and not (want_tests and pat.pkg == ""):
                    # A typo, not "no tests here" (exit 4): bad input for build and test
                    # alike.  (`test //...` in a workspace without packages has no tests.)
                    msg = f"pattern {text!r} matches no package: there is no BUILD.py at or below its directory"
                    below = [ig for ig in self.loader.ws.ignore_patterns
                             if not pat.pkg or ig.startswith(pat.pkg + "/")]
                    if pat.pkg and self.loader.ws.is_ignored(pat.pkg):
                        msg = f"pattern {text!r} matches no package: {pat.pkg} is left out by .buildtoolignore"
                    elif below:
                        msg += f" that buildtool loads (.buildtoolignore leaves out {', '.join(below[:3])})"
                    elif pat.pkg and self.loader.in_cache_dir(pat.pkg) \
                            and os.path.isdir(os.path.join(self.loader.ws.root, pat.pkg)):
                        msg += f" that buildtool loads; {self._cache_dir_why(pat.pkg)}"
                    raise UserError(msg)
            for pkg in pkgs:
                if pkg in failed_pkgs:
                    continue  # (said once, however many patterns reach it)
                try:
                    found = self._matching(pkg, want_tests)
                except UserError as e:  # (Bazel's --keep_going lists every package's error)
                    if not self.keep_going:
                        raise
                    failed.append(e)
                    failed_pkgs.add(pkg)
                    continue
                matched += found[0]
                tests_left += found[1]
                skipped += found[2]
        if failed:
            return  # (its matches may be incomplete: said with every error)
        if not matched and not want_tests:  # (`test`: the tests of the other patterns run; none: exit 4)
            why = (f" to build ({tests_left} test target(s) only: `buildtool test {text}` runs them)"
                   if tests_left else
                   f" ({skipped} manual or always=True target(s) left out: a wildcard skips them, a label "
                   "names one)" if skipped else "")
            raise UserError(f"pattern {text!r} matches no targets{why}")
        for lab in matched:
            if lab not in seen:
                seen.add(lab)
                result.append(lab)

    def _matching(self, pkg: str, want_tests: bool) -> tuple[list[str], int, int]:
        """The labels of ``pkg`` a wildcard matches, the tests it passes over (a build) and
        the manual or always=True targets it skips."""
        matched: list[str] = []
        tests_left = skipped = 0
        for name, d in self.loader.load(pkg).items():
            for attr in ("manual", "always"):  # checked here too: they decide who matches
                v = d.attrs.get(attr, False)
                if not isinstance(v, bool):
                    raise _err(d, f"attribute {attr!r} must be True or False (got {v!r})")
            if d.attrs.get("manual", False) or d.attrs.get("always", False):
                skipped += (d.kind == "test") == want_tests
                continue
            if (d.kind == "test") != want_tests:
                tests_left += d.kind == "test"
                continue
            matched.append(labels.label_str(pkg, name))
        return matched, tests_left, skipped

    def _check_here(self, text: str, cur: str) -> None:
        """``text`` (``:name``, ``:all``) names a target of the working directory's package;
        when the nearest BUILD.py at or above it is one buildtool does not load (ignored, in
        a cache directory or a nested workspace), that is the error: it named the next
        package up (the root's ``:all`` was built, exit 0)."""
        d = self.cwd_pkg
        while d != cur and d:
            if os.path.isfile(os.path.join(self.loader.ws.root, d, BUILDFILE)):
                if self.loader.ws.is_ignored(d):
                    why = f"{d} is left out by .buildtoolignore"
                elif self._hidden_by_cache_tag(d):
                    why = self._cache_dir_why(d)
                elif self.loader.in_nested_workspace(d):
                    why = "it is in a nested workspace (a buildtool.toml at or above it); build it from there"
                else:  # (a directory reached through a symbolic link, .git, .buildtool...)
                    why = f"buildtool loads no {d}/BUILD.py (a symbolic link on the way, or a directory it skips)"
                raise UserError(f"no package //{d} for {text!r} (the working directory's): {why}")
            d = d.rpartition("/")[0]

    def _load_pkg_for(self, pkg: str, text: str) -> dict[str, Declaration]:
        if not self.loader.package_exists(pkg):
            msg = f"no package //{pkg} for {text!r}: there is no {pkg + '/' if pkg else ''}BUILD.py"
            if pkg and self.loader.ws.is_ignored(pkg):
                msg = f"no package //{pkg} for {text!r}: {pkg} is left out by .buildtoolignore"
            elif pkg and self.loader.in_nested_workspace(pkg):
                msg = (f"no package //{pkg} for {text!r}: it is in a nested workspace (a buildtool.toml at or "
                       "above it); build it from there")
            elif pkg and self._hidden_by_cache_tag(pkg):
                msg = f"no package //{pkg} for {text!r}: {self._cache_dir_why(pkg)}"
            elif pkg and os.path.isfile(os.path.join(self.loader.ws.root, pkg, "BUILD.py")):
                msg = (f"no package //{pkg} for {text!r}: {pkg}/BUILD.py is reached through a symbolic link, and "
                       "packages are not (a package of two names would be built twice); use the real directory")
            elif os.path.islink(build_py := os.path.join(self.loader.ws.root, pkg, "BUILD.py")) \
                    and not os.path.exists(build_py):  # (dangling or a loop:
                # the hint offered //s3 itself, for a package discovery counts)
                raise UserError(f"no package //{pkg} for {text!r}: {pkg + '/' if pkg else ''}BUILD.py is a symbolic "
                                f"link to {os.readlink(build_py)!r}, which leads nowhere (missing, or a loop)")
            elif text.startswith(":") and self.cwd_pkg != pkg and self.loader.ws.is_ignored(self.cwd_pkg):
                msg += (f" (the working directory {self.cwd_pkg} is left out by .buildtoolignore, so {text!r} "
                        f"names a target of //{pkg}, its nearest package)")
            raise UserError(msg + self._package_hint(pkg, text))
        return self.loader.load(pkg)

    def package_below(self, text: str) -> str | None:
        """The package a single word typed on the command line names, as Bazel reads it:
        the directory of that name below the working directory (``build core`` in lib/:
        //lib/core, its target ``core``), when it is a package; else None (the error then
        offers the readings that exist: ``:core`` of the package here, a file's maker).
        None too when that package has no target of the name and the package here has one:
        the error offers both readings."""
        below = labels.below_here(text, self.cwd_pkg)
        if below is None or not self.loader.package_exists(below):
            return None
        cur = self.current_package()
        if text not in self.loader.load(below) and self.loader.package_exists(cur) and text in self.loader.load(cur):
            return None
        return below

    def pattern_error(self, text: str, e: labels.LabelError) -> UserError:
        """The error for a command-line pattern the label parser refused (``e``), with the
        readings of it that exist (``build core`` typed in lib/: '//lib/core')."""
        cur = self.current_package()
        if isinstance(text, str) and text.startswith(("-//", "-:")):  # (Bazel's exclusion)
            return UserError(f"bad pattern {text!r}: a pattern cannot subtract targets (Bazel's '-//x/...'); "
                             "name what to build, or mark what to leave out of wildcards manual=True")
        return UserError(self._bare_name_msg(text, cur) or self._file_label_msg(text, cur, str(e)))

    def _bare_name_msg(self, text: str, cur: str) -> str | None:
        """For a pattern typed without ``//`` or ``:`` (``lib``, ``lib:core``, ``core/``,
        ``obj/main.o``, an absolute path): the readings that exist -- a target of the
        package here, a package (below the working directory, or the path's own), the label
        with ``//`` put in front (from here, or from the root), the target whose output that
        path is -- or None for text that is no such slip (the label parser's message stands)."""
        if not isinstance(text, str) or text.startswith(("//", ":")) or not text or " " in text \
                or text.endswith("..."):  # (a pattern: the parser says what is wrong with it)
            return None
        ws_root, here = self.loader.ws.root, self.cwd_pkg
        if text.startswith("/"):  # a path inside the workspace, typed whole
            rel = os.path.relpath(text, ws_root)
            if rel == ".." or rel.startswith("../") or ":" in rel:
                return None
            text_rel, here = ("" if rel == "." else rel), ""
        else:
            text_rel = text
        meant: list[str] = []
        bare = text_rel.rstrip("/") if text_rel.endswith("/") else text_rel
        if bare and labels._NAME_RE.fullmatch(bare) and bare not in (".", ".."):
            if bare == text and self.loader.package_exists(cur) and bare in self.loader.load(cur):
                meant.append(f"':{bare}' (a target of the package here)")
            below = f"{here}/{bare}" if here else bare
            if self.loader.package_exists(below):
                meant.append(self._package_reading(below))
            elif (producer := self.producer_of(below)) is not None:  # `make foo.o` typed as is
                meant.append(f"'{producer}' (the target that makes it; patterns name targets, not files)")
        elif ":" in text_rel:
            pkg_part, _, name = text_rel.partition(":")
            readings = [posixpath.normpath(f"{here}/{pkg_part}") if here else pkg_part, pkg_part]
            for p in dict.fromkeys(r for r in readings if r != "." and not r.startswith("..")):
                if not labels._parses(f"//{p}:{name}"):
                    continue
                if self.loader.package_exists(p) and (name == "all" or name in self.loader.load(p)):
                    meant.append(f"'//{p}:{name}'")
                elif (slashed := self._slash_for_colon(p, name)) is not None:
                    meant.append(f"'{slashed}'")
        else:
            path = posixpath.normpath(f"{here}/{bare}" if here else bare)
            if path == "." or path == ".." or path.startswith("../"):
                pass  # (outside the workspace: no package there, and no BUILD.py there is evaluated)
            elif self.loader.package_exists(path):
                meant.append(self._package_reading(path))
            elif (producer := self.producer_of(path)) is not None:
                meant.append(f"'{producer}' (the target that makes it; patterns name targets, not files)")
        hint = f"; did you mean {' or '.join(meant)}?" if meant else ""  # (no guess at what does not exist)
        return f"a label must start with '//' or ':' (got {text!r}){hint}"

    def _package_reading(self, pkg: str) -> str:
        """A package's name typed as a pattern: ``//pkg`` where that is a target (``//pkg``
        is ``//pkg:<last part>``), else ``//pkg:all``, so the hint never leads to an
        unknown target."""
        last = pkg.rpartition("/")[2]
        try:
            own = last in self.loader.load(pkg)
        except BuildtoolError:
            own = False  # (its BUILD.py is broken: building it says so)
        return f"'//{pkg}' (package //{pkg}'s target {last!r})" if own else f"'//{pkg}:all' (package //{pkg}'s targets)"

    def _file_label_msg(self, text: str, cur: str, msg: str) -> str:
        """``msg``, and for a file label (``//:obj/x.out``) the target that makes that
        file, if any: patterns name targets."""
        found = labels.file_label(text, cur)
        producer = self.producer_of(posixpath.join(*found) if found[0] else found[1]) if found else None
        if producer is None:
            return msg
        return f"{msg}; did you mean '{producer}' (the target that makes it; patterns name targets, not files)?"

    def _slash_for_colon(self, pkg: str, name: str) -> str | None:
        """``//lib/core:core`` for ``lib``/``core`` when package lib/core has a target core:
        the label meant by ``//lib:core`` (a ':' typed for a '/'), or None."""
        joined = f"{pkg}/{name}" if pkg else name
        try:  # (a BUILD.py there that fails: its error replaced the user's own, in a hint)
            if self.loader.package_exists(joined) and name in self.loader.load(joined):
                return labels.label_str(joined, name)
        except BuildtoolError:
            pass
        return None

    def _declares(self, pkg: str, name: str) -> bool:
        """Whether package ``pkg`` declares a target ``name`` (for a hint: a package that
        cannot be evaluated declares none; ``//x`` alone would read as ``//x:x``)."""
        try:
            return name in self.loader.load(pkg)
        except Exception:
            return False

    def _colon_for_slash(self, pkg: str) -> str | None:
        """``//app:calc`` for ``//app/calc`` when package app has a target calc (a '/' typed
        for a ':'), or None; a parent whose BUILD.py does not load gives no hint."""
        parent, _, name = pkg.rpartition("/")
        if not name or not self.loader.package_exists(parent):
            return None
        try:
            found = name in self.loader.load(parent)
        except BuildtoolError:
            return None
        return labels.label_str(parent, name) if found else None

    def _declared_at(self, label: str) -> str:
        """`` (declared at path:line)`` of a loaded target's declaration, or ""."""
        p, n = labels.split_label(label)
        decl = self.loader.load(p).get(n)
        return f" (declared at {decl.path}:{decl.line})" if decl is not None else ""

    def producer_of(self, path: str) -> str | None:
        """The label of the target declaring the output ``path`` (workspace-relative), found
        in the package that owns the path's directory, or None."""
        d = posixpath.dirname(path)
        while True:
            if self.loader.package_exists(d):
                break
            if not d:
                return None
            d = posixpath.dirname(d)
        rel = path[len(d) + 1:] if d else path
        for name, decl in self.loader.load(d).items():
            outs = decl.attrs.get("outs")
            if isinstance(outs, (list, tuple)) and any(
                    isinstance(o, str) and o and posixpath.normpath(o) == rel for o in outs):  # (outs=["./x"])
                return labels.label_str(d, name)
        return None

    def _hidden_by_cache_tag(self, pkg: str) -> bool:
        """Is there a ``pkg/BUILD.py`` that a CACHEDIR.TAG at or above it keeps from loading?"""
        return self.loader.in_cache_dir(pkg) and os.path.isfile(os.path.join(self.loader.ws.root, pkg, BUILDFILE))

    def _cache_dir_why(self, pkg: str) -> str:
        d = pkg
        while self.loader.in_cache_dir(d.rpartition("/")[0]):
            d = d.rpartition("/")[0]  # up to the outermost tagged directory
        return (f"{d}/ holds a CACHEDIR.TAG, which marks a cache directory: buildtool loads no BUILD.py "
                "in it nor below it (remove the tag, or keep the package elsewhere)")

    def _package_hint(self, pkg: str, text: str) -> str:
        """A "did you mean" for a label of a package that does not exist: ``//lib:core`` for
        the target ``core`` of package ``lib/core`` (a ':' for a '/'), else the one package
        of the same directory name (moved), else the closest package's name to the package
        or to package and name together (``//lb:core``)."""
        name = text.rpartition(":")[2] if ":" in text else ""
        producer = self.producer_of(pkg) if pkg and not name else None  # //lib/x.o: a file path
        if producer is not None:
            return f"; did you mean '{producer}' (the target that makes that file; labels name targets)?"
        if not name and pkg and os.path.isfile(os.path.join(self.loader.ws.root, pkg)):
            return f" ({pkg} is a source file: labels to build name targets)"
        slashed = self._slash_for_colon(pkg, name) if name else None
        if slashed is not None:
            return f"; did you mean {slashed}?"
        colon = self._colon_for_slash(pkg) if not name else None
        if colon is not None:
            return f"; did you mean {colon}?"
        joined = f"{pkg}/{name}" if pkg and name else name
        packages = self.loader.all_packages()
        base = pkg.rpartition("/")[2]
        moved = [p for p in packages if p.rpartition("/")[2] == base] if base else []
        if len(moved) == 1:  # the same directory name elsewhere: moved (//pkgs/p20 -> //pkgs/group/p20)
            if not name:
                return f"; did you mean //{moved[0]}?"
            if name == "all" or self._declares(moved[0], name) or \
                    os.path.isfile(os.path.join(self.loader.ws.root, moved[0], name)):  # (a file label)
                return f"; did you mean //{moved[0]}:{name}?"
            return f"; did you mean the package //{moved[0]}?"
        for wanted in (pkg, joined):
            close = [p for p in packages if wanted and p.lower() == wanted.lower()]  # (//LIB: difflib finds none)
            close = close or ([_closest(wanted, packages)] if wanted else [])
            if close and close[0]:
                return f"; did you mean //{close[0]}?"
        return ""

    def _unknown_msg(
        self, pkg: str, name: str, text: str, decls: dict[str, Declaration], attr: str | None = None,
    ) -> str:
        msg = f"unknown target {text!r}: package //{pkg} has no target named {name!r}"
        import difflib  # (error messages only)

        same = [d for d in decls if d.lower() == name.lower()]
        path = f"{pkg}/{name}" if pkg else name
        producer = None if same else self.producer_of(path)
        close = same or ([] if producer else difflib.get_close_matches(name, list(decls), n=1))
        if not same and producer is None and os.path.isfile(os.path.join(self.loader.ws.root, path)):
            msg += (f" ({path} is a source file: a file goes in srcs)" if attr == "deps"  # (no look-alike guess)
                    else f" ({path} is a source file: labels to build name targets)")
        elif not same and producer is None and (what := _not_a_file(os.path.join(self.loader.ws.root, path))):
            msg += f" ({path} is {what}, not a file: a source must be one)"  # (a label to it reads as a file's)
        elif close:
            msg += f"; did you mean //{pkg}:{close[0]}?"
        elif producer is not None:  # //lib:out.txt for the output out.txt of //lib:gen
            msg += f"; did you mean '{producer}' (the target that makes that file; labels name targets)?"
        elif (slashed := self._slash_for_colon(pkg, name)) is not None:
            msg += f"; did you mean {slashed}?"
        elif text.startswith(":") and (sub := self._package_named(pkg, name)) is not None \
                and (meant := self._target_of(sub)) is not None:
            msg += f"; did you mean {meant}?"  # (deps=["util"] for //util)
        elif decls and name == pkg.rpartition("/")[2]:  # ('//x' for //x:x: the package has others)
            names = sorted(decls)
            msg += f" ('//{pkg}' is short for '//{pkg}:{name}'; its targets: {', '.join(names[:5])}" + \
                (", ...)" if len(names) > 5 else ")")
        return msg

    def _target_of(self, pkg: str) -> str | None:
        """``'//util'`` when that package has the target its name stands for, else its
        targets (a hint that named '//util' for a package without //util:util led nowhere);
        None for a package without targets or whose BUILD.py fails (the error being said
        is about another file)."""
        try:
            names = sorted(self.loader.load(pkg))
        except UserError:
            return None
        if not names:
            return None
        short = pkg.rpartition("/")[2]
        if short in names:
            return f"'//{pkg}'"
        shown = ", ".join(f"'//{pkg}:{n}'" for n in names[:3]) + (", ..." if len(names) > 3 else "")
        return f"a target of the package //{pkg}: {shown}"

    def _package_named(self, pkg: str, name: str) -> str | None:
        """The package ``name`` names below ``pkg`` or at the root, if there is one."""
        for p in (f"{pkg}/{name}" if pkg else "", name):
            if p and labels._parses(f"//{p}") and self.loader.package_exists(p):
                return p
        return None

    # -- closure ---------------------------------------------------------------------
    def build(self, roots: list[str]) -> Graph:
        """Instantiate, substitute and validate the closure of ``roots``."""
        order: list[str] = []
        index: dict[str, int] = {}
        refs: dict[str, list[tuple[str, str]]] = {}  # label -> [("file"|"label", value)]
        stack = list(reversed(roots))
        for lab in roots:
            index.setdefault(lab, -1)
        # Iterative discovery; ids are assigned in first-visit order (deterministic).
        queue = list(roots)
        qi = 0
        failed: dict[str, UserError] = {}  # (-k) every target's error, by its text (Bazel's --keep_going)
        while qi < len(queue):
            lab = queue[qi]
            qi += 1
            if index.get(lab, -1) >= 0:
                continue
            index[lab] = len(order)
            order.append(lab)
            pkg, name = labels.split_label(lab)
            try:
                decl = self.loader.load(pkg)[name]
                r = self._resolve_refs(pkg, decl)
            except UserError as e:
                if not self.keep_going:
                    raise
                failed.setdefault(str(e), e)
                continue
            refs[lab] = r
            for kind, value in r:
                if kind == "label" and index.get(value, -1) < 0:
                    index.setdefault(value, -1)
                    queue.append(value)
        del stack
        if failed:
            errs = list(failed.values())
            raise errs[0] if len(errs) == 1 else _together(errs, "errors in the targets to build")
        self._check_sources_written(order)
        self._check_cycles(order, refs)
        return self._instantiate(order, index, refs, roots)

    def _check_sources_written(self, order: list[str]) -> None:
        """Refuse a build that would write a file another target of the writer's package lists
        in ``srcs`` as a source (by path, ``./x``, or a file label ``:x``/``//pkg:x``), whether
        or not that reader is part of this build (as Bazel refuses a generated file that
        conflicts with a source file of its package): building the writer alone would
        overwrite what the reader takes for a hand-written source.  A file a glob() of the
        package also found on disk may be an earlier output copy, as ``_resolve_refs`` takes it
        (a Makefile's output left in place), but a target names it as a source: refused
        all the same (nothing written by hand is lost)."""
        building = set(order)
        for pkg in sorted({labels.split_label(lab)[0] for lab in order}):
            outs = self._declared_outs(pkg)
            if not outs:
                continue
            for name, decl, item, full in self._named_sources(pkg):
                if full not in outs:
                    continue
                producer, me = self.producer_of(full), labels.label_str(pkg, name)
                if producer is None or producer == me or producer not in building:
                    continue
                raise _err(decl, f"srcs entry {item!r} of {me} is an output of {producer}"
                                 f"{self._declared_at(producer)}: building {producer} would overwrite that "
                                 f"source; refer to '{producer}' instead, or rename the output")

    def _named_sources(self, pkg: str, globbed: bool = False) -> Iterator[tuple[str, Declaration, str, str]]:
        """(target name, declaration, srcs entry, workspace path) of each source file the
        targets of ``pkg`` name in ``srcs`` by path (``x``, ``./x``) or file label
        (``:x``, ``//pkg:x``), whether or not they are built; a glob()'s match only with
        ``globbed`` (at a declared output's own path it may be an earlier output copy found
        in place, which ``_resolve_refs`` takes so)."""
        from buildtool.dsl import Globbed  # (as in _resolve_refs)

        decls = self.loader.load(pkg)
        for name, decl in decls.items():
            srcs = decl.attrs.get("srcs")
            if not isinstance(srcs, (list, tuple)):
                continue  # (said when that target is built)
            for item in srcs:
                if not isinstance(item, str) or (isinstance(item, Globbed) and not globbed) or not item:
                    continue
                if item.startswith(("//", ":")):  # a file label of this package
                    try:
                        p, n = labels.parse_label(item, pkg)
                    except labels.LabelError:
                        found = labels.file_label(item, pkg)
                        if found is None:
                            continue
                        p, n = found
                    if p != pkg or n in decls:  # (another package's file; a target)
                        continue
                    yield name, decl, item, posixpath.normpath(f"{pkg}/{n}" if pkg else n)
                elif not item.startswith("/"):
                    yield name, decl, item, posixpath.normpath(f"{pkg}/{item}" if pkg else item)

    def _resolve_refs(self, pkg: str, decl: Declaration) -> list[tuple[str, str]]:
        from buildtool.dsl import Globbed  # (loaded with the BUILD.py files; not by a graph from the snapshot)

        out: list[tuple[str, str]] = []
        for attr in ("srcs", "deps"):
            if attr not in decl.attrs:
                continue
            for item in _str_list(decl, attr):
                if isinstance(item, str) and (item.startswith("//") or item.startswith(":")):
                    try:
                        p, n = labels.parse_label(item, pkg)
                    except labels.LabelError as e:
                        found = labels.file_label(item, pkg)
                        if found is None:
                            raise _err(decl, f"{attr}: {e}") from None
                        if attr == "deps":
                            raise _err(decl, f"deps entry {item!r} names a file; deps name targets "
                                             "(a file goes in srcs)") from None
                        p, n = found  # a file in a directory below its package (//lib:include/x.h)
                    if not self.loader.package_exists(p):
                        msg = f"{attr} refers to {item!r} but there is no package //{p}"
                        if p and self.loader.ws.is_ignored(p):
                            raise _err(decl, f"{msg}: {p} is left out by .buildtoolignore")
                        if p and self._hidden_by_cache_tag(p):
                            raise _err(decl, f"{msg}: {self._cache_dir_why(p)}")
                        raise _err(decl, msg + self._package_hint(p, item))
                    decls = self.loader.load(p)
                    sub = self.subpackage_on_the_way(p, f"{p}/{n}" if p else n) if "/" in n else None
                    if sub is not None:
                        rest = (f"{p}/{n}" if p else n)[len(sub) + 1:]
                        raise _err(decl, f"{attr} entry {item!r} is in package //{sub}, not //{p}: "
                                         f"refer to it as '//{sub}:{rest}'")
                    path, root = f"{p}/{n}" if p else n, self.loader.ws.root
                    producer = self.producer_of(path) if n not in decls and path in self._declared_outs(p) else None
                    if n in decls:
                        out.append(("label", labels.label_str(p, n)))
                    elif producer is None and attr == "srcs" and os.path.isfile(os.path.join(root, path)):
                        out.append(("file", _norm_rel(decl, p, n, attr)))  # (not in the state dir, say)
                    else:
                        if producer == labels.label_str(pkg, decl.attrs["name"]):
                            msg = f"{path!r} is both an output and a source of {producer}: a target cannot read " \
                                  "what it writes"
                        elif producer is not None:  # (made or not yet: a source it is not, whatever is on disk)
                            msg = f"{attr} refers to {item!r}, an output of {producer}: refer to '{producer}' instead"
                        elif "/" in n:  # (a file label: a target's name has no '/')
                            msg = f"{attr} refers to {item!r}, but there is no file {path}"
                        else:
                            msg = self._unknown_msg(p, n, item, decls, attr)
                            msg = f"{attr} refers to an {msg[0].lower()}{msg[1:]}"
                        raise _err(decl, msg)
                elif attr == "deps":
                    msg = f"deps entries must be labels ('//pkg:name' or ':name'), got {item!r}"
                    raise _err(decl, msg + self._absolute_hint(item, pkg))
                else:
                    path = _norm_rel(decl, pkg, item, attr)
                    if path in self._declared_outs(pkg):
                        producer, me = self.producer_of(path), labels.label_str(pkg, decl.attrs["name"])
                        if path in self.loader.globbed(pkg):  # an in-place output found by glob(): no source
                            if not isinstance(item, Globbed) and producer is not None and producer != me:
                                # written by hand, or a glob result made anew (str(p)): cannot tell which
                                from buildtool.console import say  # (above a terminal's loading line)

                                say(f"warning: {decl.path}:{decl.line}: {me}'s srcs entry {item!r} "
                                    f"is an output of {producer} (a glob() of this package found a copy of it "
                                    f"on disk): left out; refer to '{producer}' to read it")
                            continue
                        if producer is not None and producer != me:
                            # (its producer may be outside this build: a stale copy on disk is no source)
                            raise _err(decl, f"{attr} entry {item!r} of {me} is an output of {producer}"
                                             f"{self._declared_at(producer)}: refer to '{producer}' instead, or "
                                             "rename that output if this is a source file")
                    if isinstance(item, Globbed) and path in self.loader.glob_links \
                            and self._output_behind(path) is not None:
                        continue  # (`latest.txt -> out/x.txt`: glob() leaves out outputs, and links to them)
                    sub = self.subpackage_on_the_way(pkg, path)
                    if sub is not None:
                        name = path[len(sub) + 1:]
                        raise _err(decl, f"{attr} entry {item!r} is in package //{sub}, not //{pkg}: "
                                         f"refer to it as '//{sub}:{name}'")
                    if (":" in item and path not in self._declared_outs(pkg)
                            and not os.path.lexists(os.path.join(self.loader.ws.root, path))):
                        msg = f"{attr} entry {item!r} is neither a label nor a file of //{pkg}"
                        raise _err(decl, msg + self._absolute_hint(item, pkg))
                    # (one string per path: 400 tests globbing the same 2,000 files held 800,000
                    # copies, ~300 bytes an edge with the pickled graph's)
                    out.append(("file", sys.intern(path)))
        return out

    def _output_behind(self, src: str, out_owner: dict[str, str] | None = None) -> tuple[str, str] | None:
        """(the output, its producer) that the symbolic link ``src`` leads to (made or not
        yet), or None: a link to a source, or out of the workspace."""
        if self._real_root is None:
            self._real_root = os.path.realpath(self.loader.ws.root)
        real_root = self._real_root
        real = os.path.realpath(os.path.join(real_root, src))  # (non-strict: a dangling link's target too)
        if not real.startswith(real_root + os.sep):
            return None
        o = os.path.relpath(real, real_root)
        producer = out_owner.get(o) if out_owner is not None else None
        if producer is None:  # (one outside this build: built alone, the target read it stale)
            owner = posixpath.dirname(o)
            while owner and not self.loader.package_exists(owner):
                owner = posixpath.dirname(owner)
            try:  # (the package's outputs once, memoised: not a scan of it per link)
                if (owner or self.loader.package_exists("")) and o in self._declared_outs(owner):
                    producer = self.producer_of(o)
            except BuildtoolError:  # (that package's BUILD.py is broken: its own build says so)
                producer = None
        return None if producer is None else (o, producer)

    @staticmethod
    def _link_msg(src: str, user: str, o: str, producer: str) -> str:
        return (f"source {src!r} of {user} is a symbolic link to {o!r}, an output of {producer}: refer to "
                f"'{producer}' instead (a link orders nothing: it may be read before it is made)")

    def _absolute_hint(self, item: str, pkg: str) -> str:
        """``; did you mean '//lib:core'?`` for ``lib:core`` written without its ``//``
        when that label's package exists (``//lib/core:core`` when that one does); else
        nothing: a fuzzy guess at a string that is no label misled more than it helped."""
        if ":" not in item and "/" not in item:  # a bare name: a target of this package, if it is one
            if item in self.loader.load(pkg):
                return f"; did you mean ':{item}'?"
            sub = self._package_named(pkg, item)  # else a package of that name
            meant = self._target_of(sub) if sub is not None else None
            return f"; did you mean {meant}?" if meant is not None else ""
        if not labels._parses(f"//{item}"):
            return ""
        p, name = labels.parse_label(f"//{item}", "")
        if self.loader.package_exists(p):
            return f"; did you mean '//{item}'?"
        slashed = self._slash_for_colon(p, name) if ":" in item else None
        return f"; did you mean '{slashed}'?" if slashed is not None else ""

    def subpackage_on_the_way(self, pkg: str, path: str) -> str | None:
        """The package below ``pkg`` that owns the file ``path``, if any (a file belongs to
        the nearest package above it, as in Bazel); memoised per directory."""
        d = path.rpartition("/")[0]
        found = None
        while d != pkg and d:
            known = self._subpkg_memo.get(d)
            if known is None:
                known = self._subpkg_memo[d] = self.loader.package_exists(d)
            if known:
                found = d  # the nearest package above the file owns it
                break
            d = d.rpartition("/")[0]
        return found

    def _declared_outs(self, pkg: str) -> set[str]:
        got = self._outs_memo.get(pkg)
        if got is None:
            got = set()
            for d in self.loader.load(pkg).values():
                outs = d.attrs.get("outs", [])
                if isinstance(outs, (list, tuple)):
                    for o in outs:
                        if isinstance(o, str) and o and not o.startswith("/"):
                            got.add(posixpath.normpath(f"{pkg}/{o}" if pkg else o))
            self._outs_memo[pkg] = got
        return got

    def _check_cycles(self, order: list[str], refs: dict[str, list[tuple[str, str]]]) -> None:
        WHITE, GREY, BLACK = 0, 1, 2
        color = dict.fromkeys(order, WHITE)
        for start in order:
            if color[start] != WHITE:
                continue
            path = [start]
            iters = [iter([v for k, v in refs[start] if k == "label"])]
            color[start] = GREY
            while iters:
                nxt = next(iters[-1], None)
                if nxt is None:
                    color[path.pop()] = BLACK
                    iters.pop()
                    continue
                c = color[nxt]
                if c == GREY:
                    cyc = [*path[path.index(nxt):], nxt]
                    pkg, name = labels.split_label(nxt)
                    d = self.loader.load(pkg)[name]
                    from buildtool.profile import chain_text  # (an error path)

                    msg = "dependency cycle: " + chain_text(cyc)  # (a 6,000-target cycle: its ends)
                    raise _err(d, msg)
                if c == WHITE:
                    color[nxt] = GREY
                    path.append(nxt)
                    iters.append(iter([v for k, v in refs[nxt] if k == "label"]))

    def _instantiate(
        self,
        order: list[str],
        index: dict[str, int],
        refs: dict[str, list[tuple[str, str]]],
        roots: list[str],
    ) -> Graph:
        n = len(order)
        targets: list[Target | None] = [None] * n
        inputs: list[tuple[str, ...]] = [()] * n
        dependents: list[list[int]] = [[] for _ in range(n)]
        out_owner: dict[str, str] = {}
        src_users: dict[str, str] = {}
        root = self.loader.ws.root
        # Topological order (children first) so group outputs are known when needed.
        done: list[bool] = [False] * n
        topo: list[int] = []
        for start in range(n):
            if done[start]:
                continue
            stack = [(start, False)]
            while stack:
                i, expanded = stack.pop()
                if done[i]:
                    continue
                if expanded:
                    done[i] = True
                    topo.append(i)
                    continue
                stack.append((i, True))
                for k, v in refs[order[i]]:
                    if k == "label" and not done[index[v]]:
                        stack.append((index[v], False))
        outs_of = _FilesOf(n)
        for i in topo:
            lab = order[i]
            pkg, name = labels.split_label(lab)
            decl = self.loader.load(pkg)[name]
            t = self._make_target(i, lab, pkg, decl, refs[lab], index, outs_of)
            targets[i] = t
            ins: list[str] = []
            seen: set[str] = set()
            for k, v in refs[lab]:
                if k == "file":
                    src_users.setdefault(v, lab)
            if t.kind == "group":  # (its files are flattened where a target reads them: _FilesOf)
                outs_of.group(i, [(k, v if k == "file" else index[v]) for k, v in refs[lab]])
            else:
                for k, v in refs[lab]:
                    for p in (v,) if k == "file" else outs_of[index[v]]:
                        if p not in seen:
                            seen.add(p)
                            ins.append(p)
                outs_of.set(i, t.outs)
            inputs[i] = tuple(ins)
            for j in t.deps:
                dependents[j].append(i)
            for o in t.outs:
                prev = out_owner.get(o)
                if prev is not None:
                    msg = f"output {o!r} is declared by both {prev} and {lab}"
                    raise _err(decl, msg)
                out_owner[o] = lab
        self._check_loaded_duplicates(out_owner)
        linked: list[str] = []  # sources that are symbolic links
        unusable: list[BuildfileError] = []  # missing sources, each said under -k
        for src, user in src_users.items():
            if src in out_owner:
                pkg, name = labels.split_label(out_owner[src])
                d = self.loader.load(pkg)[name]
                if user == out_owner[src]:
                    msg = f"{src!r} is both an output and a source of {user}: a target cannot read what it writes"
                else:
                    msg = (f"output {src!r} of {out_owner[src]} is also used as a source file by "
                           f"{user}; refer to the target's label instead")
                raise _err(d, msg)
            full = os.path.join(root, src)
            try:
                if stat.S_ISLNK(os.lstat(full).st_mode):
                    linked.append(src)
            except OSError as e:
                pkg, name = labels.split_label(user)
                d = self.loader.load(pkg)[name]
                if isinstance(e, FileNotFoundError):
                    unusable.append(_err(d, f"{user}: source file {src!r} does not exist"))
                else:
                    unusable.append(_err(d, f"{user}: source file {src!r} cannot be looked at: {e.strerror}"))
                if not self.keep_going:
                    raise unusable[0] from None
                continue
            why = None
            try:
                mode = os.stat(full).st_mode
            except OSError as e:
                mode, why = None, e
            if mode is None or not stat.S_ISREG(mode):
                pkg, name = labels.split_label(user)
                d = self.loader.load(pkg)[name]
                behind = self._output_behind(src, out_owner) if isinstance(why, FileNotFoundError) else None
                if behind is not None:  # (not built yet: said as once it is, not "a symlink to nothing")
                    raise _err(d, self._link_msg(src, user, *behind))
                what = ("a symlink to nothing" if isinstance(why, FileNotFoundError)
                        else f"a symlink that cannot be followed ({why.strerror})" if why is not None
                        else file_kind(mode))
                unusable.append(_err(d, f"{user}: source {src!r} is {what}, not a file"))
                if not self.keep_going:
                    raise unusable[0]
        if unusable:  # (-k: every missing source, as Bazel's --keep_going lists every missing file)
            raise unusable[0] if len(unusable) == 1 else _together(unusable, "sources missing or unusable")
        for src in linked:  # a link to another target's output: that target must come first
            behind = self._output_behind(src, out_owner)
            if behind is not None:
                user = src_users[src]
                pkg, name = labels.split_label(user)
                raise _err(self.loader.load(pkg)[name], self._link_msg(src, user, *behind))
        self._check_output_paths(out_owner)
        self._check_depfiles(targets, out_owner, src_users)
        self._check_pyrule_modules(targets, out_owner)
        self._check_same_files(out_owner, src_users)
        final = [t for t in targets if t is not None]
        return Graph(
            targets=tuple(final),
            by_label={t.label: t.id for t in final},
            requested=tuple(index[r] for r in roots),
            dependents=tuple(tuple(d) for d in dependents),
            inputs=tuple(inputs),
        )

    def _check_loaded_duplicates(self, out_owner: dict[str, str]) -> None:
        """Outputs declared twice anywhere in the loaded packages are an error too, as is an
        output inside another's path: building one of the two would break the other."""
        seen: dict[str, str] = {}
        for pkg in self.loader.loaded_packages():
            for name, d in self.loader.load(pkg).items():
                outs = d.attrs.get("outs", [])
                if not isinstance(outs, (list, tuple)):
                    continue
                lab = labels.label_str(pkg, name)
                for o in outs:
                    if not isinstance(o, str) or not o or o.startswith("/") or ".." in o.split("/"):
                        continue
                    full = posixpath.normpath(f"{pkg}/{o}" if pkg else o)
                    prev = seen.get(full)
                    if prev is not None and prev != lab:
                        msg = f"output {full!r} is declared by both {prev} and {lab}"
                        raise _err(d, msg)
                    seen[full] = lab
        # A target named as another's output (``name="x.out"`` beside ``outs=["x.out"]``):
        # ``:x.out`` would mean the one target or the other's file (Bazel refuses it too).
        for pkg in self.loader.loaded_packages():
            for name, d in self.loader.load(pkg).items():
                owner = seen.get(f"{pkg}/{name}" if pkg else name)
                if owner is not None and owner != labels.label_str(pkg, name):
                    raise _err(d, f"target name {name!r} is also the path of an output of {owner}: the label "
                                  f"{labels.label_str(pkg, name)!r} would name either; rename the target")
        # And an output inside another's path (``x`` and ``x/y``), whichever of them is built.
        clear: set[str] = set()  # directories with no output at or above them
        for full, lab in seen.items():
            anc = posixpath.dirname(full)
            while anc and anc not in clear:
                other = seen.get(anc)
                if other is not None:
                    self._fail_on(lab, f"output {full!r} of {lab} is inside {anc!r}, an output of {other}; "
                                       "a path cannot be both an output file and an output's directory")
                anc = posixpath.dirname(anc)
            anc = posixpath.dirname(full)
            while anc and anc not in clear:
                clear.add(anc)
                anc = posixpath.dirname(anc)

    def _check_same_files(self, out_owner: dict[str, str], src_users: dict[str, str]) -> None:
        """Two paths that are one file through a symlinked directory (``gen -> src``): an
        output must not be a source or another target's output under a second name.  Only
        directories are resolved, once each; with no symlinked directory this is a dict pass."""
        root = self.loader.ws.root
        real_root = os.path.realpath(root)
        dirs: dict[str, str] = {}
        reals: dict[str, str] = {root: real_root}

        def canonical(p: str) -> str:
            parent, base = posixpath.split(p)
            r = dirs.get(parent)
            if r is None:
                full = os.path.join(root, parent) if parent else root
                probe, rest = full, ""
                while not os.path.lexists(probe) and probe != root:  # an output dir not made yet
                    probe, tail = os.path.split(probe)
                    rest = posixpath.join(tail, rest) if rest else tail
                real = _realpath(probe, reals)
                rel = os.path.relpath(real, real_root) if real != real_root else ""
                r = dirs[parent] = posixpath.join(rel, rest) if rest else rel
            return posixpath.join(r, base) if r else base

        linked: dict[str, bool] = {}

        def via_link(d: str) -> bool:  # is some directory from the root down to d a symlink?
            return at_or_above(d, linked, lambda a: os.path.islink(os.path.join(root, a)))

        # The sources of every target of the writers' packages, built or not (as
        # _check_sources_written holds them by path): `build //p:t` alone wrote gen/b.txt,
        # with gen -> src, over the source src/b.txt of //p:u.
        # A glob()'s match too: through the link it is no declared output's path, so a file
        # there is a source (the output writing it again once it is there is refused then).
        # (One of them is an output's file only under the output's own name: the others are
        # not resolved.)
        users = dict(src_users)
        out_names = {o.rpartition("/")[2] for o in out_owner}
        for pkg in {labels.split_label(lab)[0] for lab in out_owner.values()}:
            for name, _, _, full in self._named_sources(pkg, globbed=True):
                if full.rpartition("/")[2] in out_names:
                    users.setdefault(full, labels.label_str(pkg, name))
        if not any(via_link(d) for d in {p.rpartition("/")[0] for p in (*out_owner, *users)}):
            return  # no directory on the way is a symlink: the plain-path checks were exact
        names: dict[str, tuple[str, str]] = {}  # canonical path -> (declared path, label)
        for o, lab in out_owner.items():
            c = canonical(o)
            other = names.get(c)
            if other is not None:
                self._fail_on(lab, f"output {o!r} of {lab} is the same file as output {other[0]!r} of "
                                   f"{other[1]} (through a symlinked directory)")
            names[c] = (o, lab)
        for src, user in users.items():
            c = canonical(src)
            other = names.get(c)
            if other is not None and (c != src or other[0] != src):
                self._fail_on(other[1], f"output {other[0]!r} of {other[1]} is the source {src!r} of {user} "
                                        "(through a symlinked directory); an output is deleted before its command runs")
            if c != src and c != ".." and not c.startswith("../") and src in src_users:  # (a reader in this build)
                self._check_source_package(src, c, user)

    def _check_source_package(self, src: str, real: str, user: str) -> None:
        """A source reached through a symlinked directory is really ``real``: it must not be a
        declared output (of the package that owns ``real``), read with no dependency on the
        target that makes it, so stale when ``user`` is built alone.  Another package's
        source read through a link is what it is: hashed as any source."""
        d = real.rpartition("/")[0]
        while d and not self.loader.package_exists(d):
            d = d.rpartition("/")[0]
        if not d and not self.loader.package_exists(""):
            return  # in no package: nobody's output
        try:
            producer = self.producer_of(real) if real in self._declared_outs(d) else None
        except BuildtoolError:  # (that package's BUILD.py is broken: its own build says so)
            return
        if producer is not None and producer != user:
            self._fail_on(user, f"source {src!r} of {user} is really {real!r} (through a symlinked directory), "
                                f"an output of {producer}: refer to {producer!r} instead")

    def _fail_on(self, lab: str, msg: str) -> None:
        pkg, name = labels.split_label(lab)
        raise _err(self.loader.load(pkg)[name], msg)

    def _check_pyrule_modules(self, targets: Iterable[Target | None], out_owner: dict[str, str]) -> None:
        """A pyrule's ``fn`` module (and the packages' ``__init__.py`` on its way) is a source
        of the workspace, part of the pyrule's key: never an output, which is deleted before
        its command runs (an unrelated target writing it had the pyrule fail or pass by timing,
        and a build that says OK leave a module that the next evaluation refuses)."""
        root = self.loader.ws.root
        for t in targets:
            if t is None or t.fn is None:
                continue
            parts = t.fn.partition(":")[0].split(".")
            for i in range(1, len(parts) + 1):
                # What ``import`` would load once every output is made (not only what is on
                # disk now: an output that turns a namespace package into a regular one
                # passed a first build and failed the next evaluation): a package's
                # __init__.py before a module file beside it.
                base = "/".join(parts[:i])
                init = f"{base}/__init__.py"
                is_package = init in out_owner or os.path.isfile(os.path.join(root, init))
                rel = init if is_package else f"{base}.py"
                lab = out_owner.get(rel)
                if lab is not None:
                    self._fail_on(lab, f"output {rel!r} of {lab} is a module of {t.label}'s fn={t.fn!r}; "
                                       "an output is deleted before its command runs")

    def _check_depfiles(
        self, targets: list[Target | None], out_owner: dict[str, str], src_users: dict[str, str],
    ) -> None:
        """A depfile is deleted before its command runs and after it, as an output is: it may
        be neither a file of the build's definition (a BUILD.py, ``.git/``, the workspace's
        config), nor in a subpackage, nor a source, nor another target's output or depfile
        (``depfile="BUILD.py"`` deleted the BUILD.py, with no error until the next build)."""
        definition: set[str] | None = None
        owner: dict[str, str] = {}
        named: dict[str, dict[str, list[tuple[str, str]]]] = {}  # package -> its declarations' paths (once each)
        for t in targets:
            if t is None or t.depfile is None:
                continue
            p, lab = t.depfile, t.label
            d = self.loader.load(t.pkg)[labels.split_label(lab)[1]]
            if definition is None:
                definition = self.loader.read_files | self.loader.imported_workspace_modules()
            why = _build_definition_file(p, definition)
            if why is None and p in src_users:
                why = f"a source of {src_users[p]}"
            if why is None and out_owner.get(p, lab) != lab:
                why = f"an output of {out_owner[p]}"
            if why is None and p in owner:
                why = f"the depfile of {owner[p]} too"
            if why is None:  # (its package's other targets, built or not in this build)
                paths = named.get(t.pkg)
                if paths is None:
                    paths = named[t.pkg] = _named_in_package(self.loader.load(t.pkg), t.pkg)
                other = next(((what, by) for what, by in paths.get(p, ()) if by != lab), None)
                if other is not None:
                    why = f"{other[0]} of {other[1]}"
            if why is None:
                sub = self.subpackage_on_the_way(t.pkg, p)
                if sub is not None:
                    why = f"in package //{sub}, not //{t.pkg}"
            if why is not None:
                raise _err(d, f"depfile {p!r} of {lab} is {why}; a depfile is deleted before its command runs "
                              "and after it: name a file only this command writes (e.g. 'name.d')")
            owner[p] = lab

    def _check_output_paths(self, out_owner: dict[str, str]) -> None:
        root = self.loader.ws.root
        checked: dict[str, bool] = {}
        # A parent reached through a symlinked directory of the workspace -> (its real path
        # relative to the root, the existing directory on the way that is the link's)
        linked: dict[str, tuple[str, str]] = {}
        definition = self.loader.read_files | self.loader.imported_workspace_modules()
        probed = self.loader.module_looks.union(*self.loader.stat_probes.values())
        reals: dict[str, str] = {root: os.path.realpath(root)}  # (_realpath's memo)
        room = PATH_MAX - 1 - len(os.fsencode(root)) - 1  # (the path's bytes, the NUL after them)
        for o, lab in out_owner.items():
            if len(o) * 4 > room and len(os.fsencode(o)) > room:
                pkg, name = labels.split_label(lab)
                msg = (f"output {o!r} of {lab} is {len(os.fsencode(os.path.join(root, o)))} bytes long as a path "
                       f"from /; a path can have at most {PATH_MAX - 1}")
                raise _err(self.loader.load(pkg)[name], msg)
            own = _build_definition_file(o, definition, probed)
            if own is not None:
                # Declared outputs are deleted before their command runs: never one of these.
                pkg, name = labels.split_label(lab)
                d = self.loader.load(pkg)[name]
                raise _err(d, f"output {o!r} of {lab} is {own}; an output is deleted before its command runs")
            parent = posixpath.dirname(o)
            ok = checked.get(parent)
            if ok is None:
                anc = parent
                while anc:
                    other = out_owner.get(anc)
                    if other is not None:
                        pkg, name = labels.split_label(lab)
                        d = self.loader.load(pkg)[name]
                        raise _err(d, f"output {o!r} of {lab} is inside {anc!r}, an output of {other}; "
                                      "a path cannot be both an output file and an output's directory")
                    anc = posixpath.dirname(anc)
                # A symlinked directory on the way must not lead outside the workspace.
                probe = os.path.join(root, parent)
                while not os.path.lexists(probe) and probe != root:
                    probe = os.path.dirname(probe)
                where = os.path.relpath(probe, root)
                # An output of an earlier build that no target declares any more is removed
                # before anything runs (Session._clean_dead); any other file is in the way.
                if probe != root and not os.path.isdir(probe) and where not in self.loader.recorded_outputs:
                    pkg, name = labels.split_label(lab)
                    d = self.loader.load(pkg)[name]
                    what = (f"a symbolic link to {os.readlink(probe)!r}, which does not exist"
                            if os.path.islink(probe) else "an existing file")
                    raise _err(d, f"output {o!r} of {lab} needs the directory {where!r}, which is {what}")
                real = _realpath(probe, reals)
                ok = real == root or real.startswith(root + os.sep)
                checked[parent] = ok
                if ok and real != os.path.normpath(probe):  # through a symlinked directory of the workspace
                    linked[parent] = (os.path.relpath(real, root), where)
                    self._check_real_package(o, lab, *linked[parent])
            if parent in linked:  # (.git/ or the state dir reached through a link is still that)
                real_dir, where = linked[parent]
                real_o = posixpath.normpath(posixpath.join(real_dir, posixpath.relpath(o, where)))
                own = _build_definition_file(real_o, definition, probed)
                if own is not None:
                    pkg, name = labels.split_label(lab)
                    raise _err(self.loader.load(pkg)[name],
                               f"output {o!r} of {lab} is really {real_o!r} (through the symbolic link {where!r}), "
                               f"{own}; an output is deleted before its command runs")
            boundary = _boundary_file(o)
            if boundary is not None:
                pkg, name = labels.split_label(lab)
                raise _err(self.loader.load(pkg)[name], f"output {o!r} of {lab} is {boundary}")
            full = os.path.join(root, o)
            link_out = False
            if ok and os.path.islink(full):
                real = os.path.realpath(full)
                link_out = not real.startswith(root + os.sep)
                ok = not link_out
            if not ok:
                pkg, name = labels.split_label(lab)
                d = self.loader.load(pkg)[name]
                msg = f"output {o!r} of {lab} resolves (through a symlink) outside the workspace"
                if link_out:  # (the file at the output path, not the BUILD.py, is what is wrong)
                    msg = (f"output {o!r} of {lab} is a symbolic link to {os.readlink(full)!r}, outside the "
                           "workspace: remove the link (buildtool does not replace a link that leads out)")
                raise _err(d, msg)
            if os.path.isdir(full) and not os.path.islink(full):
                if self._holds_only_recorded_outputs(o, full):
                    self.loader.dirs_of_dead_outputs.add(o)  # Session._clean_dead empties it
                    continue
                pkg, name = labels.split_label(lab)
                d = self.loader.load(pkg)[name]
                raise _err(d, f"output {o!r} of {lab} is an existing directory; outputs are files")

    def _check_real_package(self, o: str, lab: str, real_dir: str, linked: str) -> None:
        """``o``'s existing directory ``linked`` is really ``real_dir``: the package that owns
        that directory must be ``lab``'s own (else two packages, each built alone, would
        overwrite each other's file through the link)."""
        d = "" if real_dir == "." else real_dir
        while d and not self.loader.package_exists(d):
            d = d.rpartition("/")[0]
        pkg, name = labels.split_label(lab)
        if d != pkg:
            real = posixpath.normpath(posixpath.join(real_dir, posixpath.relpath(o, linked)))
            raise _err(self.loader.load(pkg)[name],
                       f"output {o!r} of {lab} is really {real!r} (through the symbolic link {linked!r}), "
                       f"in package //{d}: a target writes only inside its own package")

    def _holds_only_recorded_outputs(self, rel: str, full: str) -> bool:
        """Is the directory ``full`` (``rel``) made only of outputs of earlier builds and
        directories (an empty one too, with or without a build record: a fresh checkout and
        one with history must agree)?  Then a declared output may take its place."""
        recorded = self.loader.recorded_outputs
        for d, subdirs, files in os.walk(full):
            base = rel + d[len(full):].replace(os.sep, "/")
            if any(f"{base}/{f}" not in recorded for f in files):
                return False
            if any(os.path.islink(os.path.join(d, s)) for s in subdirs):  # (walk lists links to dirs there)
                return False
        return True

    def _make_target(
        self,
        i: int,
        lab: str,
        pkg: str,
        decl: Declaration,
        refs: list[tuple[str, str]],
        index: dict[str, int],
        outs_of: _FilesOf,
    ) -> Target:
        a = decl.attrs
        kind = decl.kind
        priority = a.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > MAX_PRIORITY:
            got = repr(priority) if not isinstance(priority, int) or abs(priority) < 10**30 else "an int of " \
                f"{priority.bit_length()} bits"  # (repr of 10**5000 raises: Python's 4,300-digit limit)
            raise _err(decl, f"attribute 'priority' must be an int from {-MAX_PRIORITY:,} to {MAX_PRIORITY:,} "
                             f"(got {got})")
        manual = a.get("manual", False)
        if not isinstance(manual, bool):
            raise _err(decl, f"attribute 'manual' must be True or False (got {manual!r})")
        pool = a.get("pool")
        if pool is not None and (not isinstance(pool, str) or not pool):
            raise _err(decl, f"attribute 'pool' must be a pool name (got {pool!r})")
        outs = tuple(_norm_rel(decl, pkg, o, "outs") for o in _str_list(decl, "outs"))
        if len(set(outs)) != len(outs):
            raw = _str_list(decl, "outs")
            seen_outs: set[str] = set()  # (`o in outs[:i]` was quadratic: 1.5 s for 20,000 outs)
            i = next(i for i, o in enumerate(outs) if o in seen_outs or seen_outs.add(o))
            first = raw[outs.index(outs[i])]
            same = f"{raw[i]!r}" if raw[i] == first else f"{first!r} and {raw[i]!r} (both {outs[i]!r})"
            raise _err(decl, f"outs lists the same file twice: {same}")
        for o in outs:  # (a newline in $@, or in `query`'s one path per line; U+2028 splits lines too)
            if not o.isprintable() and _breaks_lines(o):
                raise _err(decl, f"output path {o!r} contains a control character or a line separator, "
                                 "which break commands and one-path-per-line listings")
        for o in outs:  # the subpackage's own targets, never loaded for this build, may read it
            sub = self.subpackage_on_the_way(pkg, o)
            if sub is not None:
                raise _err(decl, f"output {o[len(pkg) + 1 if pkg else 0:]!r} is in package //{sub}, not //{pkg}: "
                                 f"a target writes only inside its own package (declare it in //{sub})")
        env_raw = a.get("env", {})
        if not isinstance(env_raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_raw.items()
        ):
            raise _err(decl, f"attribute 'env' must be a dict of str to str (got {env_raw!r})")
        for k, v in env_raw.items():
            if not k or not set(k) <= _ENV_NAME_OK or k[0].isdigit():
                raise _err(decl, f"env variable name {k!r} is not a valid name")
            _text(decl, f"env value of {k}", v)
            size = len(k) + 1 + len(v.encode("utf-8", "surrogateescape"))
            if size >= MAX_ENV_STRING:  # (the command failed to start: "Argument list too long", naming nothing)
                raise _err(decl, f"env value of {k} is {size:,} bytes with its name: one environment string "
                                 f"holds less than {MAX_ENV_STRING:,} (Linux's MAX_ARG_STRLEN); pass it in a file")
        pass_env = tuple(_str_list(decl, "pass_env"))
        for k, why in RESERVED_ENV.items():  # (runner._execute sets them: a value given changed the key, not the run)
            if k in env_raw or k in pass_env:
                raise _err(decl, f"{k} is set by buildtool ({why}), so env and pass_env cannot give it")
        if kind == "pyrule":
            for k, why in (("PYTHONPATH", "the workspace root, so that its modules import"),
                           ("PYTHONDONTWRITEBYTECODE", "1: no __pycache__ written among the sources"),
                           ("BUILDTOOL_PYRULE_MODULES", "the file where it lists the modules its function imported")):
                if k in env_raw or k in pass_env:
                    raise _err(decl, f"a pyrule's {k} is set by buildtool ({why}; docs/user-guide.md), so env and "
                                     "pass_env cannot give it")
        tools = tuple(_str_list(decl, "tools"))
        for lst, what in ((pass_env, "pass_env"), (tools, "tools")):
            for item in lst:
                if not isinstance(item, str) or not item:
                    raise _err(decl, f"{what} entries must be non-empty strings (got {item!r})")
                _text(decl, f"{what} entry", item)
        for item in tools:
            if item.startswith(("//", ":", "@")):  # (Bazel's tools= takes labels: a habit)
                raise _err(decl, f"tools entry {item!r} is a label; tools names programs found on PATH (their "
                                 "binary is hashed into the key): a target that makes a program goes in srcs, "
                                 f"and the command runs it as $(location {item})")
        for k in pass_env:
            if not set(k) <= _ENV_NAME_OK or k[0].isdigit():
                hint = " (a value goes in env={...})" if "=" in k else ""
                raise _err(decl, f"pass_env entry {k!r} is not a variable name{hint}")
        always = a.get("always", False)
        if not isinstance(always, bool):
            raise _err(decl, f"attribute 'always' must be True or False (got {always!r})")
        flaky = a.get("flaky", 0)
        if isinstance(flaky, bool) or not isinstance(flaky, int) or not 0 <= flaky <= MAX_FLAKY:
            got = repr(flaky) if not isinstance(flaky, int) or abs(flaky) < 10**30 else "a larger int"
            raise _err(decl, f"attribute 'flaky' must be a whole number of reruns from 0 to {MAX_FLAKY} (got {got})")
        exclusive = a.get("exclusive", False)
        if not isinstance(exclusive, bool):
            raise _err(decl, f"attribute 'exclusive' must be True or False (got {exclusive!r})")
        local = a.get("local", False)
        if not isinstance(local, bool):
            raise _err(decl, f"attribute 'local' must be True or False (got {local!r})")
        depfile = a.get("depfile")
        if depfile is not None:
            depfile = _norm_rel(decl, pkg, depfile, "depfile")
            if any(k == "file" and v == depfile for k, v in refs):
                raise _err(decl, f"depfile {depfile!r} is also a source of {lab}; it must be a file the command writes")
        timeout = a.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout > 0):  # (NaN compares false; inf is MAX_TIMEOUT_S)
            raise _err(decl, f"attribute 'timeout' must be a positive number of seconds (got {timeout!r})")

        # Package-relative views for substitution (both paths normalised: a file of the
        # package is its tail; relpath, ~5 us a call, only for another package's).
        inside = f"{pkg}/"

        def rel(p: str) -> str:
            if not pkg:
                return p
            return p[len(inside):] if p.startswith(inside) else pkg_relative(p, pkg)

        src_paths: list[str] = []
        seen: set[str] = set()
        for k, v in refs if kind != "group" else ():  # (a group's files: flattened by each reader)
            for p in (v,) if k == "file" else outs_of[index[v]]:
                if p not in seen:
                    seen.add(p)
                    src_paths.append(p)
        cmd = ""
        fn = kwargs_json = None
        if kind in ("genrule", "test"):
            raw = a["cmd"]
            if not isinstance(raw, str) or not raw.strip():
                raise _err(decl, f"attribute 'cmd' must be a non-empty string (got {raw!r})")
            _text(decl, "cmd", raw)

            def locations(x: str) -> list[str]:
                return [rel(p) for p in self._location(decl, pkg, x, refs, index, outs_of, outs)]

            try:
                cmd = self._subst.substitute(raw, [rel(p) for p in src_paths], [rel(o) for o in outs], locations)
            except self._subst.SubstError as e:
                raise _err(decl, f"{lab}: {e}") from None
        elif kind == "pyrule":
            fn = a["fn"]
            if not isinstance(fn, str) or ":" not in fn:
                raise _err(decl, f"attribute 'fn' must be 'module.path:function' (got {fn!r})")
            from buildtool.keys import pyrule_fn_problem  # pyrules only

            problem = pyrule_fn_problem(self.loader.ws.root, fn)
            if problem:
                raise _err(decl, f"{lab}: {problem}")
            kw = a.get("kwargs", {})
            if not isinstance(kw, dict):
                raise _err(decl, f"attribute 'kwargs' must be a dict (got {kw!r})")
            bad = [k for k in kw if not isinstance(k, str) or k in ("srcs", "outs")]
            if bad:  # (JSON would make 1 the keyword "1"; srcs/outs are passed already: a TypeError at run time)
                raise _err(decl, f"{lab}: kwargs key {bad[0]!r} cannot be a keyword argument of fn: keys are "
                                 "strings other than 'srcs' and 'outs' (which fn receives anyway)")
            try:  # (in the order written: fn sees the dicts so, as Python keeps them; a reorder reruns it)
                kwargs_json = json.dumps(kw, separators=(",", ":"))
            except (TypeError, ValueError):
                where = _unjsonable(kw)
                raise _err(decl, "pyrule kwargs must be JSON-serialisable (str, numbers, lists, dicts)"
                           + (f": kwargs{where[0]} is {where[1]}" if where else "")) from None
            nested = _non_str_key(kw)
            if nested is not None:  # (JSON makes it a string: {1: "a"} reached fn as {"1": "a"})
                was = json.dumps({nested[0]: 0})[1:-4]
                raise _err(decl, f"{lab}: kwargs holds a dict key {nested[0]!r} that is not a string; fn would "
                                 f"receive it as {was} (JSON has string keys only)")
            cmd = f"pyrule {fn}({kwargs_json})"
        if kind in ("genrule", "pyrule") and not outs and kind == "pyrule":
            raise _err(decl, "pyrule needs at least one output in 'outs'")
        srcs_files = tuple(v for k, v in refs if k == "file")
        # (dict.fromkeys: in order, without duplicates, in linear time: a list's `in` made
        # a target of 50,000 deps take 20 s)
        deps = list(dict.fromkeys(index[v] for k, v in refs if k == "label"))
        return Target(
            id=i,
            label=lab,
            kind=kind,
            pkg=pkg,
            cmd=cmd,
            srcs=srcs_files,
            deps=tuple(deps),
            outs=outs,
            env=tuple(sorted(env_raw.items())),
            pass_env=tuple(sorted(set(pass_env))),
            tools=tools,
            priority=priority,
            manual=manual or always,
            pool=pool,
            # (beyond ~3 years a timeout never fires: clamped, so that no timer overflows)
            timeout=float(min(timeout, MAX_TIMEOUT_S)) if timeout is not None  # (10**400: no float)
            else float(min(self.default_test_timeout, MAX_TIMEOUT_S))  # (test_timeout = inf: never, as timeout=)
            if kind == "test" and self.default_test_timeout is not None else None,
            fn=fn,
            kwargs_json=kwargs_json,
            where=f"{decl.path}:{decl.line}",
            always=always,
            flaky=flaky,
            exclusive=exclusive,
            depfile=depfile,
            local=local,
        )

    def _location(
        self,
        decl: Declaration,
        pkg: str,
        x: str,
        refs: list[tuple[str, str]],
        index: dict[str, int],
        outs_of: _FilesOf,
        outs: tuple[str, ...],
    ) -> list[str]:
        SubstError = self._subst.SubstError
        if x.startswith("//") or x.startswith(":"):
            try:
                p, n = labels.parse_label(x, pkg)
            except labels.LabelError as e:
                found = labels.file_label(x, pkg)  # //lib:include/calc.h: a file, as in srcs
                if found is None:
                    raise SubstError(str(e)) from None
                p, n = found
            lab = labels.label_str(p, n)
            if ("label", lab) in refs:
                return list(outs_of[index[lab]])
            f = f"{p}/{n}" if p else n
            if ("file", f) in refs or f in outs or _made_by_a_ref(f, refs, index, outs_of):
                return [f]
            msg = f"$(location[s] {x}): {x} is not listed in srcs, deps or outs, nor an output of a target listed"
            raise SubstError(msg)
        full = _norm_rel(decl, pkg, x, "$(location)")
        if ("file", full) in refs or full in outs or _made_by_a_ref(full, refs, index, outs_of):
            return [full]  # (one output of a multi-output dependency: its path names it)
        msg = f"$(location[s] {x}): {x} is not listed in srcs or outs, nor an output of a target listed in srcs or deps"
        raise SubstError(msg)


def _made_by_a_ref(path: str, refs: list[tuple[str, str]], index: dict[str, int],
                   outs_of: _FilesOf) -> bool:
    """Is ``path`` an output of one of the labels in ``refs`` (``$(location gen/errors.c)``
    for one of //gen:errors's two outputs)?"""
    return any(kind == "label" and path in outs_of[index[value]] for kind, value in refs)
