"""Watch mode: rebuild whenever a relevant file changes (``buildtool watch``, ``--watch``).

The watcher only produces invalidations: it never schedules anything by itself.  File
events (watchdog: inotify / FSEvents, or ``--poll``) are filtered down to the files that
matter for the requested closure (sources, BUILD.py files, glob directories, workspace
modules the BUILD.py files import), debounced, and turned into "these packages must be
re-evaluated" / "run a cycle"; a cycle is the ordinary ``Session.build`` (which takes
the workspace lock for the cycle only).  Content hashes decide what runs, so a touch or
an identical rewrite runs nothing.  The stat cache, the loader
and the graph stay in memory between cycles.  Docs: docs/watch.md.

Summary line printed (on stdout) after every cycle::

    watch: cycle N STATUS in S.SSSs: ran R [LABEL ...], restored X, up-to-date U, failed F[; changed: PATH ...]

STATUS is OK, FAILED (a command failed), ERROR (the request or a BUILD.py is invalid)
or CANCELLED (an input changed while the cycle ran, and a new cycle follows; or a signal
stopped it).
"""

from __future__ import annotations

import errno
import importlib
import os
import queue
import re
import signal
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from buildtool import keys, labels
from buildtool.atomic import temp_path
from buildtool.console import ClosableStream
from buildtool.errors import BuildFailed, BuildtoolError, Interrupted, StopRequested, UserError, count_stop_signal
from buildtool.graph import Graph
from buildtool.loader import BUILDFILE, Loader
from buildtool.outcome import Outcome, Status
from buildtool.record import BuildRecord
from buildtool.workspace import ALWAYS_SKIPPED, CACHEDIR_TAG, IGNORE_FILE, MARKER, is_cache_tag

QUIET_S = 0.04  # a cycle starts after this long without a new relevant event ...
SCRATCH_GRACE_S = 0.2  # an event of the last cycle's commands may be read this long after it ended
REHASH_S = 0.05  # a rewrite that looked changed is hashed again this much later (it may have been half done)
MAX_WAIT_S = 0.5  # ... or at most this long after the first one (steady streams still build)
POLL_INTERVAL_S = 0.25  # --poll: how often each watched directory is rescanned
LATE_EVENT_MARGIN_NS = 15_000_000  # _rewritten_as_was: the file clock's lag (a jiffy or a few) and more
MAX_EMITTERS = 16  # more watched directories than this: recursive watches on top-level dirs
RACY_MARGIN_NS = 20_000_000  # file timestamps may lag the clock by a tick
CANCEL_SIGNUM = 0  # Scheduler.request_stop(0): "an input changed", not a signal
# a target a cycle got to the end of (SKIPPED: a dependency failed, what it reads is moot until that is mended)
_FINISHED = (Status.RAN, Status.UP_TO_DATE, Status.RESTORED, Status.FAILED, Status.SKIPPED)

IGNORED_DIRS = frozenset({*ALWAYS_SKIPPED, "__pycache__"})
EVENT_TYPES = [
    FileModifiedEvent, FileCreatedEvent, FileDeletedEvent, FileMovedEvent, FileClosedEvent, FileAttribEvent,
    DirCreatedEvent, DirDeletedEvent, DirMovedEvent,
]


_ATOMIC_TEMP = re.compile(r"\.tmp\.\d+\.\d+$")  # the end of atomic.write_atomic's temp name: .tmp.<pid>.<thread>


def is_own_temp(rel: str, own: frozenset[str] | set[str]) -> bool:
    """Is ``rel`` the temp file ``atomic.write_atomic`` renames over one of the files ``own``
    (``<name>.tmp.<pid>.<thread>``, or the shorter name it takes when that is too long)?"""
    m = _ATOMIC_TEMP.search(rel)
    return m is not None and any(temp_path(p, m.group()) == rel for p in own)


def is_editor_temp(name: str) -> bool:
    """Swap, backup and lock files editors write next to the file being saved."""
    return (
        name.endswith(("~", ".swp", ".swo", ".swx", ".swpx", ".tmp", ".buildtool-tmp"))
        or name.startswith(".#")
        or (name.startswith("#") and name.endswith("#"))
        or name == "4913"  # vim probes whether it may create files in the directory
        or name.startswith(".goutputstream-")
    )


# -- what is watched --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchSet:
    """Everything event filtering needs; replaced as a whole after a cycle (thread-safe read)."""

    sources: frozenset[str] = frozenset()  # content matters: a cycle runs
    loader_files: frozenset[str] = frozenset()  # read or imported by BUILD.py evaluation: reload all
    glob_dirs: frozenset[str] = frozenset()  # a file appearing/disappearing: reload the package
    scan_dirs: frozenset[str] = frozenset()  # a BUILD.py or subdirectory appearing matters
    packages: frozenset[str] = frozenset()  # loaded packages (owner lookup for glob dirs)
    outputs: frozenset[str] = frozenset()  # never relevant
    output_dirs: frozenset[str] = frozenset()  # directories that hold only outputs
    dirs: frozenset[str] = frozenset()  # directories the observer must cover
    missing_dirs: frozenset[str] = frozenset()  # wanted directories that do not exist yet
    broken: bool = False  # the last cycle could not evaluate the graph: any event retries
    # Package -> its glob() include patterns (text, regex): which appearing or disappearing
    # files can change a glob's result; other files in its directories do not matter.
    glob_rules: Mapping[str, tuple[tuple[str, Any], ...]] = field(default_factory=dict)
    # The file a source reached through a symlink (to it, or to a directory on its way)
    # really is, in the workspace -> those sources: an event there is theirs.
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Files a pyrule's import looked for in vain (or that would shadow the module found): one
    # appearing is a module it imports now.  (Any new .py did: a venv's pip install in an
    # ignored directory started a cycle per file.)
    pyrules: frozenset[str] = frozenset()
    tools: frozenset[str] = frozenset()  # declared tools inside the workspace: a change checks every target
    # The headers a failed compile (a target with a depfile: which headers it reads is known
    # only once it succeeds) said were missing ("fatal error: cfg.h: No such file or
    # directory"), at each place it looks for them (the including file's directory, its
    # package's, its sources', the include directories its command names) -> when it was
    # seen failing (time_ns).
    # One made there after that retries it; no other file does (a failing lint's log).
    mend_paths: Mapping[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Change:
    path: str
    kind: str  # content | package | all | config | rescan | retry | tool | mend | recheck (path: a label not recorded)
    pkg: str = ""
    at: float = field(default_factory=time.monotonic)
    appeared: bool = False  # the event made the path exist (created, moved to)
    reached: bool = False  # a directory a package's glob reaches (the root package's too: pkg "")
    during: bool = False  # a "mend": made while the last cycle ran (Watcher._mends)


def _owner(pkgs: Iterable[str], d: str) -> str | None:
    best: str | None = None
    for p in pkgs:
        if (p == "" or d == p or d.startswith(p + "/")) and (best is None or len(p) > len(best)):
            best = p
    return best


def classify(ws: WatchSet, rel: str, event_type: str, is_dir: bool, broken: bool | None = None) -> Change | None:
    """What an event on workspace-relative ``rel`` means, or None when it does not matter.
    ``broken``: the graph failed to evaluate, as the watcher knows it now (``ws.broken`` is
    the watch set's, recomputed only after the cycle: an edit in between was taken for a
    healthy graph's, and a source saved right after an ERROR cycle started another)."""
    if broken is not None and broken != ws.broken:
        ws = replace(ws, broken=broken)
    if rel in ws.outputs:
        return None
    parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
    name = rel.rsplit("/", 1)[-1]
    appears = event_type in ("created", "moved_to")
    structural = appears or event_type in ("deleted", "moved_from")
    if is_dir or (structural and rel in ws.dirs):  # (a link to a directory re-pointed: inotify says a file)
        if not structural or rel in ws.output_dirs:
            return None
        if rel in ws.loader_files:  # a package directory an import looked for
            return Change(rel, "all")
        reached = None  # the package whose glob may reach into the directory
        if parent in ws.glob_dirs or rel in ws.glob_dirs:
            pkg = _owner(ws.packages, parent) or ""
            if any("/" in text or "**" in text for text, _ in ws.glob_rules.get(pkg, ())):
                reached = pkg
        if rel in ws.scan_dirs or parent in ws.scan_dirs or rel in ws.missing_dirs:
            # (a package may appear in it; and the package whose glob reaches it is evaluated
            # again, which a rescan alone did not do under //..., where every dir is scanned)
            return Change(rel, "rescan", reached or "", reached=reached is not None)
        if reached is not None:
            return Change(rel, "package", reached)
        if rel in ws.dirs:  # a watched directory, or one on the way to one, moved away or made again:
            return Change(rel, "rescan", _owner(ws.packages, rel) or "")  # (and the packages below it)
        return Change(rel, "retry") if ws.broken else None
    if name == BUILDFILE:
        if parent in ws.packages or parent in ws.scan_dirs or parent in ws.glob_dirs or ws.broken \
                or rel in ws.loader_files:
            return Change(rel, "rescan" if structural else "package", parent)
        return None
    if rel in ws.loader_files or rel in (MARKER, IGNORE_FILE):
        return Change(rel, "config" if rel in (MARKER, IGNORE_FILE) else "all")
    if name in (CACHEDIR_TAG, MARKER) and structural and (parent in ws.scan_dirs or parent in ws.glob_dirs
                                                          or parent in ws.packages or ws.broken):
        # a directory becomes a cache or a workspace of its own, or stops being one:
        # packages and globs below it change
        return Change(rel, "rescan", _owner(ws.packages, parent) or "")
    if structural and not (appears and rel in ws.sources) and _globbed(ws, rel):
        return Change(rel, "package", _owner(ws.packages, parent) or "")
    if rel in ws.sources:
        if event_type in ("deleted", "moved_from"):  # gone: validating the graph says so (exit 2's message)
            return Change(rel, "package", _owner(ws.packages, parent) or "")
        if ws.broken and not structural and not name.endswith(".py"):  # (a write to a data file mends no
            return None  # BUILD.py: the same error again; a .py source, a pyrule's module, may)
        return Change(rel, "content")
    if rel in ws.tools:  # (which targets use it is known only to the builds that hashed it; on_event
        return Change(rel, "tool")  # adds this to what a tool that is also a source or a glob's match is)
    if rel in ws.aliases:  # the file a symlinked source really is
        return Change(ws.aliases[rel][0], "content")
    if appears and rel in ws.pyrules:  # (a module a pyrule tried to import, in vain)
        return Change(rel, "content")
    if ws.broken and (structural or name.endswith(".py") or name in (MARKER, IGNORE_FILE)):
        # What can mend a graph that did not evaluate: a BUILD.py or module edited, a file
        # created (a missing source), the configuration; not a log written next to it.
        return Change(rel, "retry")
    if rel in ws.mend_paths and event_type not in ("deleted", "moved_from"):  # (the header a failed compile
        return Change(rel, "mend")  # missed, made or saved: Watcher._mends says whether it counts)
    return None


def _holds_a_package(top: str, limit: int = 10_000) -> bool:
    """Is there a BUILD.py or a buildtool.toml at or below directory ``top``?  True too when
    more than ``limit`` entries were looked at without an answer (a rescan decides then)."""
    seen = 0
    stack = [top]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    seen += 1
                    if seen > limit or e.name in (BUILDFILE, MARKER):
                        return True
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
        except OSError:
            continue
    return False


def _globbed(ws: WatchSet, rel: str) -> bool:
    """Does a glob of the package owning ``rel`` match it (the test ``classify`` makes)?"""
    parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
    if parent not in ws.glob_dirs:
        return False
    pkg = _owner(ws.packages, parent) or ""
    in_pkg = rel[len(pkg) + 1:] if pkg else rel
    return any(rx.match(in_pkg) for _, rx in ws.glob_rules.get(pkg, ()))


def _add_ancestors(dirs: set[str]) -> None:
    """Add to ``dirs`` (workspace-relative) every directory above one of them, the root too."""
    for d in list(dirs):
        while d:
            d = d.rsplit("/", 1)[0] if "/" in d else ""
            if d in dirs:
                break
            dirs.add(d)


def _pattern_dirs(patterns: list[str], cwd_pkg: str) -> tuple[set[str], set[str]]:
    """(recursive bases, package dirs) named by the patterns."""
    rec: set[str] = set()
    pkgs: set[str] = set()
    for text in patterns or ["//..."]:
        try:
            pat = labels.parse_pattern(text, cwd_pkg)
        except labels.LabelError:
            continue
        (rec if pat.kind == "recursive" else pkgs).add(pat.pkg)
    return rec, pkgs


def _scan(root: str, base: str, skip: set[str], ws_ignored: Any, out: set[str], fences: set[str]) -> None:
    """Add to ``out`` ``base`` and the directories below it where a package may appear;
    not into a nested workspace or a cache dir, which discovery leaves out too (a build in
    a `git worktree` below, or the cache storing, made directories there: idle cycles), whose
    marker file, whose going would change that, is added to ``fences``."""
    stack = [base]
    while stack:
        rel = stack.pop()
        try:
            it = os.scandir(os.path.join(root, rel) if rel else root)
        except OSError:
            out.add(rel)
            continue
        below = []
        fence = None
        with it:
            for e in it:
                if rel and (e.name == MARKER or (e.name == CACHEDIR_TAG and is_cache_tag(e.path))):
                    fence = f"{rel}/{e.name}"
                    break
                if e.name in IGNORED_DIRS:
                    continue
                try:
                    if not e.is_dir(follow_symlinks=False):
                        continue
                except OSError:
                    continue
                child = f"{rel}/{e.name}" if rel else e.name
                if child in skip or ws_ignored(child):
                    continue
                below.append(child)
        if fence is not None:
            fences.add(fence)
            continue
        out.add(rel)
        stack += below


# -- the watcher ------------------------------------------------------------------------


class _Stop(StopRequested):
    """Raised by our signal handler when no build is running."""


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self.w = watcher

    def dispatch(self, event: FileSystemEvent) -> None:
        if event.event_type == "moved":
            self.w.on_event(os.fsdecode(event.src_path), "moved_from", event.is_directory)
            self.w.on_event(os.fsdecode(event.dest_path), "moved_to", event.is_directory)
        else:
            self.w.on_event(os.fsdecode(event.src_path), event.event_type, event.is_directory)


class _Collector:
    """Session observer: remembers this cycle's graph, scheduler and outcomes."""

    def __init__(self, watcher: Watcher) -> None:
        self.w = watcher
        self.graph: Graph | None = None
        self.sched: Any = None
        self.src_targets: dict[str, list[int]] = {}
        self.outcomes: dict[int, Outcome] = {}
        # failed target with a depfile -> (when it was seen to end, time_ns; the headers it missed)
        self.failed: dict[int, tuple[int, frozenset[tuple[str, str]]]] = {}

    def started(self, graph: Graph, sched: Any) -> None:
        m = {p: list(ids) for p, ids in self.w._readers_of(graph).items()}  # (copied: extended below)
        self.graph, self.src_targets = graph, m
        if self.w.graph is graph:  # headers its depfiles found (by the record: the same graph's ids)
            for p, ids in self.w._discovered().items():
                m.setdefault(p, []).extend(ids)
            if self.w.pymods[0] is graph:  # pyrules' modules: an edit cancels a running pyrule
                for p, ids in self.w.pymods[1].items():
                    m.setdefault(p, []).extend(ids)
        self.sched = sched
        if self.w.stop_signal is not None:
            sched.request_stop(self.w.stop_signal)

    def target_started(self, t: int, lane: int) -> None:
        return

    def target_finished(self, t: int, o: Outcome) -> None:
        self.outcomes[t] = o
        g = self.graph
        if o.status is Status.FAILED and g is not None and getattr(g.targets[t], "depfile", None) is not None:
            # (now: the outcome's output is dropped once reported)
            self.failed[t] = (time.time_ns(), _missing_headers(o))

    def should_cancel(self, ch: Change) -> bool:
        """An input of a target not finished yet changed (or the graph itself did)."""
        if ch.kind in ("all", "config") or (ch.kind in ("package", "rescan")
                                             and ch.path.rsplit("/", 1)[-1] == BUILDFILE):
            return True  # (a BUILD.py saved by a rename over it is a "rescan")
        if ch.kind != "content" and not (ch.kind == "package" and ch.path in self.src_targets):
            return False  # (a source deleted or renamed away is a "package" change: its readers too)
        sched = self.sched
        if sched is None:
            return any(True for _ in self.src_targets.get(ch.path, ()))
        done, wanted = sched.outcomes, sched.plan.wanted  # (a focused cycle plans only the changed cone)
        readers = self.src_targets.get(ch.path, ())
        if not any(t in wanted and t not in done for t in readers) and not (
                self.w.req.mode == "test" and not sched.stopping and self._test_above(readers, wanted, done)):
            return False
        # Written with the content the cycle keyed from (a failing tool rewriting its report, a
        # `:w` of an unchanged buffer), or never keyed from (its readers, not started, read it
        # as it is): nothing to cancel for.
        if ch.kind != "content":
            return True
        same = self.w.as_read(ch.path)
        if same is False:  # (maybe read between `> f`'s truncation and its write: once more, a moment later)
            time.sleep(REHASH_S)
            same = self.w.as_read(ch.path)
        return same is False

    def _test_above(self, readers: Iterable[int], wanted: Any, done: Any) -> bool:
        """Does a test not finished yet depend on one of ``readers``, at any depth?  A
        test's key holds its dependencies' inputs at any depth (runfiles): a source edited
        below a running test makes its verdict one of the old content (the cycle ran on to
        an OK for a state already gone).  (Asked in `test --watch` only: a build's tests
        run nothing, and a finished reader's edit must not cancel its long link.)"""
        g = self.graph
        if g is None:
            return False
        seen: set[int] = set()
        stack = list(readers)
        while stack:
            for c in g.dependents[stack.pop()]:
                if c in seen:
                    continue
                seen.add(c)
                if g.targets[c].kind == "test" and c in wanted and c not in done:
                    return True
                stack.append(c)
        return False


class Watcher:
    """Owns the observer, the debounce loop and the graph kept between cycles."""

    def __init__(self, session: Any, req: Any, *, poll: bool = False, debounce_ms: float | None = None,
                 out: Any = None) -> None:
        self.session = session
        self.req = req
        self.root = session.ws.root
        self.cwd = os.getcwd()
        self.poll = poll
        self.quiet = QUIET_S if debounce_ms is None else max(debounce_ms, 0.0) / 1000.0
        # (its cycles' summaries too: `watch > log` on a disk that filled quit after one)
        self.out = ClosableStream(out or sys.stdout)
        self.q: queue.SimpleQueue[Change | None] = queue.SimpleQueue()
        self.ws = WatchSet()
        self.stop_signal: int | None = None
        self.in_cycle = False
        self.saved_in_cycle: set[str] = set()  # files saved while the cycle ran (on_event's thread adds)
        self.collector: _Collector | None = None
        self.cycle_no = 0
        self.cycle_start_ns = 0
        self.cycle_span = (0.0, 0.0)  # (monotonic start and end of the last cycle: _rewritten_as_was)
        self.said_at: tuple[float, int] | None = None  # (monotonic, time_ns) when the last summary was said
        self.cycle_wall = (0, 0)  # (the same in time_ns: a change seen late, polled or on a loaded machine:
        # its file's mtime says when)
        self.unrecorded: list[str] = []  # labels whose result the last cycle did not record
        # the graph of the last cycle that ended OK or FAILED, and the targets it finished (_rewritten_as_was)
        self.last_finished: tuple[Graph | None, dict[int, Status]] = (None, {})
        self.followed_up = False  # the last cycle was one more for such results
        # graph kept between cycles, and what must be re-evaluated before the next one
        self.loader: Loader | None = None
        self.graph: Graph | None = None
        self.clean: set[int] = set()  # targets that ended the last cycle ok, for clean_graph
        self.clean_graph: Graph | None = None
        self._src_index: tuple[Graph | None, dict[str, list[int]]] = (None, {})
        self.partial: Loader | None = None
        self.dirty_pkgs: set[str] = set()
        self.reload_all = False
        self.reload_config = False  # buildtool.toml or .buildtoolignore changed: read them again
        # Editor temps a glob matches by name that were no file when they came (Emacs's lock
        # link): their going starts no cycle either (on_event).
        self.unfiled_temps: set[str] = set()
        self.tools_seen: set[str] = set()  # declared tools in the workspace, workspace-relative (_note_tools)
        self.mend_paths: dict[str, int] = {}  # WatchSet.mend_paths, of the last cycle that ended
        self.missed: dict[str, frozenset[tuple[str, str]]] = {}  # failing label -> the headers it missed
        # The last cycle was started by headers made while the cycle before it ran, nothing
        # else: such a header starts no second one in a row (a failing command of the cycle
        # rewriting it each time would retry the compile without end).
        self.mend_streak = False
        self.rescan = False
        self.broken = False
        self.observer: Any = None
        self.watches: dict[tuple[str, bool], Any] = {}
        self.watched_ids: dict[tuple[str, bool], tuple[int, int]] = {}  # (dev, inode) when scheduled
        self.gone_dirs: set[str] = set()  # watched directories seen deleted or moved away (observer thread)
        self._synced_for: tuple[Any, ...] | None = None
        self.pymods: tuple[Graph | None, dict[str, list[int]]] = (None, {})  # (graph, module file -> pyrules)
        self._pyrules: tuple[Graph | None, list[str]] = (None, [])  # (graph, its pyrules' fn)
        self.cache_rel = self._cache_rel()
        self.said_outside: set[str] = set()  # sources linking outside the workspace, said once
        self.own_streams = _own_streams(self.root) | _own_reports(self.root, req)
        self.own_dirs = {p.rsplit("/", i)[0] for p in self.own_streams for i in range(1, p.count("/") + 1)}

    # -- events (observer thread) --------------------------------------------------------
    def on_event(self, path: str, event_type: str, is_dir: bool) -> None:
        if not path.startswith(self.root + os.sep):
            return
        rel = path[len(self.root) + 1:].replace(os.sep, "/")
        if is_dir and event_type in ("deleted", "moved_from") and ((rel, False) in self.watches
                                                                   or (rel, True) in self.watches):
            self.gone_dirs.add(rel)  # its watch ends with it: schedule the one made again anew
        parts = rel.split("/")
        ws = self.ws
        if any(p in IGNORED_DIRS for p in parts) and rel not in ws.loader_files and rel not in ws.tools:
            # (but .git/HEAD read by a BUILD.py, a tool in .venv/bin)
            return
        if is_editor_temp(parts[-1]) and rel not in ws.sources and rel not in ws.loader_files:
            if not _globbed(ws, rel):
                return
            # A glob that takes "foo~" gets a new source when one appears, but not Emacs's
            # lock link .#foo, which leads nowhere: its coming and its going start no cycle.
            # (Another temp's going does: a cycle in flight may have taken it meanwhile.)
            if event_type in ("deleted", "moved_from"):
                if rel in self.unfiled_temps:
                    self.unfiled_temps.discard(rel)
                    return
            elif not os.path.isfile(path):  # (what a glob takes: a file, or a link to one)
                self.unfiled_temps.add(rel)
                return
        if self.cache_rel and (rel == self.cache_rel or rel.startswith(self.cache_rel + "/")):
            return
        if rel in self.own_streams:  # `buildtool watch > log`, --junit, --profile: our own writes
            return
        if event_type in ("deleted", "moved_from") and rel in self.session.removed_dead:
            self.session.removed_dead.discard(rel)  # a cycle deleted it: a target that declared it is gone
            return
        if is_own_temp(rel, self.own_streams):
            return  # the temp file of one of them, renamed over it (atomic.write_atomic)
        if is_dir and event_type == "created" and rel in self.own_dirs:  # made for one (--profile out/p.json)
            return
        ch = classify(ws, rel, event_type, is_dir, self.broken)
        if ch is None:
            return
        ch.appeared = event_type in ("created", "moved_to")
        if self.in_cycle:
            self.saved_in_cycle.add(ch.path)  # (the runner's "changed while the command ran": a save)
        changes = [ch]
        if rel in ws.aliases:  # each source linked to it changed (whatever the event is to itself)
            changes += [Change(a, "content") for a in ws.aliases[rel] if a != ch.path]
        if rel in ws.tools and ch.kind != "tool":  # (a tool that is also a source, or a glob's match)
            changes.append(Change(rel, "tool"))
        c = self.collector
        for one in changes:
            self.q.put(one)
            if c is not None and self.in_cycle and c.sched is not None and c.should_cancel(one):
                c.sched.request_stop(CANCEL_SIGNUM)

    # -- signals ----------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        count_stop_signal(signum)  # (a third quits at once: a BUILD.py may catch _Stop in a loop)
        self.stop_signal = signum
        self.q.put(None)  # SimpleQueue.put is reentrant: safe in a signal handler
        c = self.collector
        if self.in_cycle:
            if c is not None and c.sched is not None:
                c.sched.request_stop(signum)
            else:
                raise _Stop  # loading the graph or waiting for the lock: leave now

    # -- graph (called by Session.build, lock held) ------------------------------------------
    def graph_source(self, record: BuildRecord, req: Any, stale: set[str]) -> tuple[Loader, Graph]:
        self.dirty_pkgs |= stale
        if self.graph is not None and self.loader is not None and not (
            self.dirty_pkgs or self.reload_all or self.rescan or self.broken
        ):
            return self.loader, self.graph
        new = Loader(self.session.ws, self.session.recorded_outputs(record))
        new.progress = self.session.loading
        old = self.loader
        if self.reload_all:
            _forget_workspace_modules(self.root)
        elif old is not None:
            for pkg, decls in old._packages.items():  # reuse packages no change touched
                if pkg not in self.dirty_pkgs:
                    new._packages[pkg] = decls
                    new._contexts[pkg] = old._contexts[pkg]
                    if pkg in old.stat_probes:  # (a re-evaluated package's are its new evaluation's)
                        new.stat_probes[pkg] = old.stat_probes[pkg]
            new.read_files |= old.read_files
            new.module_looks |= old.module_looks  # (the modules stay imported: their bodies do not run again)
            new.probes |= old.probes
            new.looked_for |= old.looked_for
            new.glob_dirs |= old.glob_dirs
            new.glob_links |= old.glob_links
            new.env_reads.update(old.env_reads)  # (also a kept module's, read when it was imported)
            for pkg, rules in old.glob_rules.items():
                if pkg not in self.dirty_pkgs:
                    new.glob_rules.setdefault(pkg, rules)
            new.cwd_relative = old.cwd_relative  # (a kept package may have opened files so)
            new.spawned = new.spawned or old.spawned
            if not self.rescan:
                new.take_discovery(old)
        self.partial = new
        graph = self.session._graph(new, req.patterns, req.mode, keep_going=req.keeps_going(self.session.config))
        if old is not None and not self.reload_all:  # the kept packages' reads, as they were read
            for f, st in old.read_stats.items():
                new.read_stats.setdefault(f, st)
        self.loader, self.graph, self.partial = new, graph, None
        self.dirty_pkgs.clear()
        self.reload_all = self.rescan = self.broken = False
        self.sync_watches(self.cycle_start_ns)  # watch the new inputs before anything runs
        return new, graph

    def _apply(self, changes: list[Change]) -> None:
        for ch in changes:
            if ch.kind == "package":
                self.dirty_pkgs.add(ch.pkg)
            elif ch.kind == "rescan":
                self.rescan = True
                self.dirty_pkgs.add(ch.pkg)
                below = ch.path + "/"  # (a directory moved away or made again: every package in it)
                self.dirty_pkgs.update(p for p in self.ws.packages if p == ch.path or p.startswith(below))
                if ch.pkg:  # a new sub-package takes files away from its parent's globs
                    self.dirty_pkgs.add(_owner(self.ws.packages, ch.pkg.rsplit("/", 1)[0] if "/" in ch.pkg else "")
                                        or "")
            elif ch.kind in ("all", "config"):
                self.reload_all = True
                self.reload_config |= ch.kind == "config"

    def _cache_rel(self) -> str | None:
        """The cache directory, if inside the workspace (its writes are never changes)."""
        rel = os.path.relpath(os.path.realpath(self.req.cache_dir or self.session.config.cache_dir), self.root)
        return None if rel.startswith("..") else rel

    def _fresh_cache(self) -> None:
        """A new cache object for each cycle, as each build gets: one that turned itself off
        (a full disk, a database that refused a store) or that remembers directories since
        deleted (the cache removed by hand) stayed so for the whole session, though trouble
        is "a miss for the rest of this build" (reliability.md).  Cheap: nothing is opened
        until used."""
        s = self.session
        if s.cache is None:
            return
        from buildtool.cache import Cache

        try:
            s.cache.close()  # (its database and its gc.lock descriptor: one a cycle was left open)
        except Exception:  # (its trouble was said when it happened; this one starts afresh)
            pass
        s.cache = Cache(self.req.cache_dir or s.config.cache_dir, _warn, s.config.restore_mode)

    def _reload_config(self) -> None:
        """buildtool.toml or .buildtoolignore changed: read the configuration again, with a
        new cache if its directory or restore mode changed."""
        s = self.session
        before = (s.config.cache_dir, s.config.restore_mode)
        s.reload_config()
        if (s.config.cache_dir, s.config.restore_mode) != before and s.cache is not None:
            from buildtool.cache import Cache

            s.cache = Cache(self.req.cache_dir or s.config.cache_dir, _warn, s.config.restore_mode)
            self.cache_rel = self._cache_rel()

    # -- watches -------------------------------------------------------------------------------
    def _compute(self) -> WatchSet:
        loader = self.partial or self.loader
        graph = self.graph
        sources: set[str] = set()
        outputs: set[str] = set()
        pyfiles: set[str] = set()
        pywanted: list[str] = []  # files its imports looked for in vain
        pymods: dict[str, list[int]] = {}  # a pyrule's module file -> the pyrules importing it
        if graph is not None:
            for t in graph.targets:
                sources.update(t.srcs)
                outputs.update(t.outs)
                if getattr(t, "depfile", None):  # written and deleted by every compile: not a change
                    outputs.add(t.depfile)
                if t.kind == "pyrule" and t.fn:
                    for f in keys.pyrule_module_files(self.root, t.fn, pywanted):
                        pyfiles.add(f)
                        pymods.setdefault(f, []).append(t.id)
        self.pymods = (graph, pymods)
        sources |= pyfiles
        sources |= set(self._discovered())  # headers found through depfiles are inputs too
        aliases = self._aliases(sources)
        loader_files: set[str] = set()
        probes: set[str] = set()
        glob_dirs: set[str] = set()
        glob_rules: dict[str, tuple[tuple[str, Any], ...]] = {}
        packages: set[str] = set()
        for ld in {id(x): x for x in (self.loader, loader) if x is not None}.values():
            loader_files |= {f for f in ld.read_files if f.rsplit("/", 1)[-1] != BUILDFILE}
            loader_files |= ld.imported_workspace_modules()
            probes |= ld.probes  # looked for, maybe missing: one appearing changes the graph
            glob_dirs |= ld.glob_dirs
            for pkg, rules in ld.glob_rules.items():
                glob_rules[pkg] = tuple({rx.pattern: (text, rx) for text, rx in (*glob_rules.get(pkg, ()), *rules)}
                                        .values())
            packages |= set(ld.loaded_packages())
            packages |= {f.rsplit("/", 1)[0] if "/" in f else "" for f in ld.read_files
                         if f.rsplit("/", 1)[-1] == BUILDFILE}
        rec, pkg_dirs = _pattern_dirs(self.req.patterns, self.session.ws.cwd_pkg_dir)
        tools = frozenset(self.tools_seen)
        keep = {f.rsplit("/", 1)[0] if "/" in f else "" for f in sources | loader_files | tools} | glob_dirs | packages
        _add_ancestors(keep)  # (a directory on the way to one of these holds more than outputs)
        out_dirs: set[str] = set()
        for o in outputs:
            d = o.rsplit("/", 1)[0] if "/" in o else ""
            while d and d not in keep and d not in out_dirs:
                out_dirs.add(d)
                d = d.rsplit("/", 1)[0] if "/" in d else ""
        # (not those in directories of outputs only: `out/BUILD.py`, asked for by the check
        # that an output stays in its package, would make every output directory a change)
        loader_files |= {p for p in probes if (p.rsplit("/", 1)[0] if "/" in p else "") not in out_dirs}
        scan: set[str] = set(pkg_dirs)
        fences: set[str] = set()
        for base in rec:
            _scan(self.root, base, out_dirs, self.session.ws.is_ignored, scan, fences)
        loader_files |= fences  # (one going away: that tree joins the workspace)
        looked_for = {os.path.normpath(p) for p in pywanted}  # (a module a pyrule's import missed: its directory)
        wanted = {f.rsplit("/", 1)[0] if "/" in f else ""
                  for f in sources | loader_files | aliases.keys() | tools | looked_for}
        wanted |= glob_dirs | scan | packages
        wanted |= {p.rsplit("/", 1)[0] if "/" in p else "" for p in self.mend_paths}
        wanted.add("")  # the root: buildtool.toml and .buildtoolignore are read again when edited
        # and every directory on their way: moving one away (or a new one in its place) is
        # seen there, where the moved directory's own watch says nothing
        _add_ancestors(wanted)
        dirs: set[str] = set()
        missing: set[str] = set()
        for d in wanted:
            while d and not os.path.isdir(os.path.join(self.root, d)):
                missing.add(d)
                d = d.rsplit("/", 1)[0] if "/" in d else ""
            dirs.add(d)
        return WatchSet(
            frozenset(sources), frozenset(loader_files), frozenset(glob_dirs), frozenset(scan),
            frozenset(packages), frozenset(outputs), frozenset(out_dirs), frozenset(dirs), frozenset(missing),
            self.broken, glob_rules, {k: tuple(sorted(v)) for k, v in aliases.items()},
            frozenset(looked_for), tools, self.mend_paths,
        )

    def _aliases(self, sources: set[str]) -> dict[str, set[str]]:
        """The workspace path each source reached through a symlink really is -> those
        sources (``k/l.txt -> ../shared/real.txt``, or a symlinked directory on the way):
        events come for the real file.  One reaching outside the workspace is said once;
        only its link is watched.  One realpath per directory, one lstat per source."""
        root = self.root
        real_dirs: dict[str, str] = {}
        out: dict[str, set[str]] = {}
        outside: list[tuple[str, str]] = []
        for s in sources:
            d, _, base = s.rpartition("/")
            rd = real_dirs.get(d)
            if rd is None:
                rd = real_dirs[d] = os.path.realpath(os.path.join(root, d) if d else root)
            full = os.path.join(rd, base)
            try:
                if os.path.islink(full):
                    full = os.path.realpath(full)
            except OSError:
                continue
            if full == os.path.join(root, s):
                continue
            if full.startswith(root + os.sep):
                out.setdefault(full[len(root) + 1:], set()).add(s)
            elif s not in self.said_outside:
                self.said_outside.add(s)
                outside.append((s, full))
        if outside and not self.poll:  # one line, however many (a vendored tree linked in has thousands)
            # (--poll stats each watched path through its link: an edit there is seen)
            outside.sort()
            (first, where), n = outside[0], len(outside)
            who = f"{first} links" if n == 1 else f"{first} and {n - 1} more sources link"
            _say(f"{who} outside the workspace ({where}{', ...' if n > 1 else ''}): edits there are not seen; "
                 "build again after one")
        return out

    def _layout(self, dirs: frozenset[str]) -> set[tuple[str, bool]]:
        if len(dirs) <= MAX_EMITTERS:
            return {(d, False) for d in dirs}
        tops = {(d.split("/", 1)[0], True) for d in dirs if d}
        if "" in dirs:
            tops.add(("", False))
        if len(tops) <= MAX_EMITTERS:
            return tops
        return {("", True)}

    def _new_observer(self) -> Any:
        obs = PollingObserver(timeout=POLL_INTERVAL_S) if self.poll else Observer()
        obs.start()
        return obs

    def sync_watches(self, since_ns: int) -> None:
        """Recompute the watch set and (un)schedule directories.  Files in directories that
        were not watched yet, and sources new to the watch set (a header a depfile named in
        this cycle), that changed after ``since_ns`` (the start of the cycle that read them)
        are queued as changes: no event could have reported them (an event for a header
        saved between the cycle's end and this call was filtered by the old set)."""
        key = (id(self.graph), id(self.partial), id(self.loader), self.broken, frozenset(self._discovered()),
               self._pyrule_modules(), frozenset(self.tools_seen), frozenset(self.mend_paths.items()))
        replaced = self._replaced_dirs()  # saves there since the cycle began went unseen
        if key == self._synced_for and not self.ws.missing_dirs and not replaced:
            return
        self._synced_for = key
        old = self.ws
        self.ws = self._compute()
        layout = self._layout(self.ws.dirs)
        try:
            self._schedule(layout, set(replaced))
        except OSError as e:
            if self.poll or e.errno not in (errno.ENOSPC, errno.EMFILE, errno.ENOMEM):
                raise
            limit = "max_user_watches" if e.errno == errno.ENOSPC else "max_user_instances"
            _say(f"the OS file watch limit was hit ({e.strerror}; see /proc/sys/fs/inotify/{limit}); "
                 "falling back to polling (--poll)")
            self._drop_observer()
            self.poll = True
            self._schedule(layout, set())
        for p, at in self.ws.mend_paths.items():  # (a header the failure was not known for yet: made as it
            if old.mend_paths.get(p) != at:  # ran on, its event went by)
                ch = Change(p, "mend")
                if self._mends(ch):
                    self.q.put(ch)
        new_dirs = (self.ws.dirs - old.dirs) | {d for d in self.ws.dirs for r, deep in replaced
                                                 if d == r or (deep and (not r or d.startswith(r + "/")))}
        new_sources = self.ws.sources - old.sources - self.ws.outputs
        if not new_dirs and not new_sources:
            return
        limit = since_ns - RACY_MARGIN_NS
        known = _buildfiles(self.ws.packages)
        handled = self.ws.sources | self.ws.loader_files | self.ws.aliases.keys() | known \
            | _buildfiles(self.ws.scan_dirs) | self.ws.tools | self.ws.pyrules
        for rel in sorted(handled):
            d = rel.rsplit("/", 1)[0] if "/" in rel else ""
            if d not in new_dirs and rel not in new_sources:
                continue
            try:
                st = os.stat(os.path.join(self.root, rel))
            except OSError:
                continue
            if max(st.st_mtime_ns, st.st_ctime_ns) >= limit:
                ch = classify(self.ws, rel, "modified" if rel in known else "created", False)
                if ch is not None:
                    self.q.put(ch)
        for d in sorted(new_dirs & self.ws.glob_dirs):
            self._queue_unseen(d, limit, handled)

    def _queue_unseen(self, d: str, limit: int, handled: set[str] | frozenset[str]) -> None:
        """Queue what a glob may take in the newly watched directory ``d`` and was made or
        changed after ``limit`` (the cycle's start): a file or directory made in it after
        the evaluation listed it and before its watch existed (``mkdir new && echo >
        new/f.md`` against a ``glob(["**"])``), which no event reported."""
        try:
            with os.scandir(os.path.join(self.root, d)) as it:
                entries = []
                for e in it:
                    if e.name in IGNORED_DIRS:
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if max(st.st_mtime_ns, st.st_ctime_ns) >= limit:
                        entries.append((e.name, e.is_dir(follow_symlinks=False)))
        except OSError:
            return
        for name, is_dir in entries:
            rel = f"{d}/{name}" if d else name
            if rel in handled or (is_dir and rel in self.ws.dirs):
                continue
            ch = classify(self.ws, rel, "created", is_dir)
            if ch is not None and ch.kind != "retry":
                ch.appeared = True
                self.q.put(ch)

    def _dir_id(self, key: tuple[str, bool]) -> tuple[int, int] | None:
        try:
            st = os.stat(os.path.join(self.root, key[0]) if key[0] else self.root)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _replaced_dirs(self) -> list[tuple[str, bool]]:
        """Watched directories that are another directory now (removed and made again, as
        ``git checkout`` or ``rm -rf gen && regenerate`` do): their watch follows the old
        one, so saves in the new one would go unseen.  Known by a delete event, or by a
        new inode (the filesystem may give the new directory the old one's number)."""
        gone = set(self.gone_dirs)
        return [k for k in self.watches if k[0] in gone or self._dir_id(k) != self.watched_ids.get(k)]

    def _schedule(self, layout: set[tuple[str, bool]], replaced: set[tuple[str, bool]]) -> None:
        """Watch the directories of ``layout``, anew those ``replaced`` (_replaced_dirs)."""
        if self.observer is None:
            self.observer = self._new_observer()
        self.gone_dirs.difference_update(k[0] for k in replaced)
        for key in list(self.watches):
            if key not in layout or key in replaced:
                self.watched_ids.pop(key, None)
                try:
                    self.observer.unschedule(self.watches.pop(key))
                except (KeyError, ValueError, OSError):
                    pass
        handler = _Handler(self)
        for key in sorted(layout - set(self.watches)):
            d, recursive = key
            path = os.path.join(self.root, d) if d else self.root
            ident = self._dir_id(key)
            try:
                self.watches[key] = self.observer.schedule(handler, path, recursive=recursive,
                                                           event_filter=EVENT_TYPES)
            except FileNotFoundError:  # gone again since the layout was computed: the next sync
                continue
            if ident is not None:
                self.watched_ids[key] = ident

    def _drop_observer(self) -> None:
        if self.observer is not None:
            try:
                self.observer.unschedule_all()
                self.observer.stop()
                self.observer.join(timeout=2)
            except (RuntimeError, OSError):
                pass
        self.observer = None
        self.watches = {}
        self.watched_ids = {}
        self.gone_dirs = set()

    # -- the loop -------------------------------------------------------------------------------
    def wait_for_changes(self) -> list[Change] | None:
        """Block until a debounced batch of relevant changes is ready (None: stop)."""
        pending: list[Change] = []
        first = last = 0.0
        while True:
            if self.stop_signal is not None:
                return None
            if pending:
                now = time.monotonic()
                timeout = min(last + self.quiet, first + MAX_WAIT_S) - now
                if timeout <= 0:
                    appeared = {ch.path for ch in pending if ch.appeared}
                    pending = [self._settled(ch) for ch in pending if not self._came_and_went(ch, appeared)]
                    pending = [ch for ch in pending if not self._rewritten_as_was(ch) and self._mends(ch)]
                    churn = [ch for ch in pending if self._scratch_dir(ch)]
                    if churn:  # (watched from now on, so a BUILD.py made in one later is seen)
                        pending = [ch for ch in pending if ch not in churn]
                        self._synced_for = None
                        self.sync_watches(self.cycle_wall[0] or time.time_ns())
                    if pending:
                        self.mend_streak = all(ch.kind == "mend" and ch.during for ch in pending)
                        return pending
                    continue
            else:
                timeout = 1.0
            try:
                ch = self.q.get(timeout=timeout)
            except queue.Empty:
                continue
            if ch is None:
                continue  # a signal: checked at the top
            if not pending:
                first = ch.at
            last = time.monotonic()
            pending.append(ch)
            # Everything queued meanwhile joins this batch: events that came during a long
            # cycle are older than MAX_WAIT_S, and one at a time they made a cycle each.
            while True:
                try:
                    more = self.q.get_nowait()
                except queue.Empty:
                    break
                if more is not None:  # (None: a signal, seen at the top)
                    pending.append(more)

    def _came_and_went(self, ch: Change, appeared: set[str]) -> bool:
        """A file or directory that appeared in this batch and is gone again, never part of
        the graph (a command's scratch directory, a temp file a glob pattern matches):
        nothing changed.  (One that was there before and is gone now did change.)"""
        if ch.kind not in ("package", "rescan", "retry", "mend") or ch.path not in appeared \
                or os.path.lexists(os.path.join(self.root, ch.path)):
            return False
        ws = self.ws
        return not (ch.path in ws.sources or ch.path in ws.scan_dirs or ch.path in ws.glob_dirs
                    or ch.path in ws.packages or ch.path in ws.missing_dirs
                    or (ch.path.rsplit("/", 1)[-1] == BUILDFILE
                        and (ch.path.rsplit("/", 1)[0] if "/" in ch.path else "") in ws.packages))

    def _mends(self, ch: Change) -> bool:
        """False for a "mend" change that cannot mend a failure: a file made before the
        compile that missed it failed (by its ctime, however late its event came), or one no
        failed compile misses any more.  True for every other change."""
        if ch.kind != "mend":
            return True
        at = self.ws.mend_paths.get(ch.path)
        try:
            made = os.lstat(os.path.join(self.root, ch.path)).st_ctime_ns
        except OSError:
            return False
        if at is None or made <= at:
            return False
        ch.during = made <= self.cycle_wall[1]  # (while the last cycle ran on: maybe by its own commands)
        return not (ch.during and self.mend_streak)

    def _scratch_dir(self, ch: Change) -> bool:
        """A directory the last cycle's own commands made, or removed and made again, below
        which the watch set reads nothing, that holds no package and that no glob reaches (a
        failing test's `rm -rf scratch; mkdir scratch`, a `mktemp -d` left behind): nothing
        to build again (it is watched from now on, so a BUILD.py made in it later is seen),
        and a cycle for it would run the failing command again, which makes it again, with
        no end.  (Made by a person between cycles, or one holding what the watch set reads,
        which may come back holding other sources: a cycle, as ever.)"""
        begun, ended = self.cycle_span
        if ch.kind != "rescan" or ch.reached or not begun or not begun <= ch.at <= ended + SCRATCH_GRACE_S:
            return False
        ws = self.ws
        below = ch.path + "/"
        if ch.path in ws.missing_dirs or any(  # (what the watch set reads there: it may come back as other files)
                p == ch.path or p.startswith(below)
                for group in (ws.packages, ws.glob_dirs, ws.sources, ws.loader_files, ws.tools, ws.pyrules,
                              ws.aliases.keys())
                for p in group):
            return False
        full = os.path.join(self.root, ch.path)
        if not os.path.isdir(full) or os.path.islink(full):
            return False  # (gone: a package may have gone with it; the rescan says)
        return not _holds_a_package(full)

    def _rewritten_as_was(self, ch: Change) -> bool:
        """A source written again during the last cycle with the content the cycle read (a
        tool's report or cache file beside its sources, which it rewrites even when it
        fails): nothing changed, and a cycle for it would run the failed command again, which
        writes it again, with no end.  Only writes made while the last cycle ran: a person's
        identical save between cycles retries the failed targets, as ever."""
        begun, ended = self.cycle_span
        g, finished = self.last_finished
        if ch.kind != "content" or not begun or g is None:
            return False
        # Only when the last cycle ended (OK or FAILED: not cancelled, its killed targets
        # still to run) with every target reading the file finished in it: the content a
        # cycle read was not read by the targets a focused cycle left out (a second save
        # 50 ms after the first, keyed by the first's cycle through another reader).
        readers = [*self._readers_of(g).get(ch.path, ()), *self._discovered().get(ch.path, ())]
        if not readers or any(r not in finished for r in readers):
            return False
        if not begun <= ch.at <= ended:  # (seen while the last cycle ran; polling sees it later, and
            wall0, wall1 = self.cycle_wall  # inotify's event may reach this thread after the cycle
            # ended on a loaded machine: by its mtime then, from the coarser file clock, which
            # lags a few ms: a write right after the cycle's end (a touch) may carry a time
            # before it, so an event seen late must be of a write well inside the cycle)
            end = wall1 if self.poll else wall1 - LATE_EVENT_MARGIN_NS
            try:
                if not wall0 - 20_000_000 <= os.stat(os.path.join(self.root, ch.path)).st_mtime_ns <= end:
                    return False
            except OSError:
                return False
        read = self.as_read(ch.path)
        if read is None:  # (never hashed: none read it; dropped when each waits for a failed dependency)
            return all(finished[r] is Status.SKIPPED for r in readers)
        return read

    def as_read(self, rel: str) -> bool | None:
        """Whether source ``rel`` holds the content this session last hashed of it (the stat
        cache's entry: what the keys were made from); None if it never hashed it."""
        stats = self.session.stats
        entry = stats.entries.get(rel) if stats is not None else None
        if entry is None:
            return None
        from buildtool.digest import hash_file

        try:
            return bool(hash_file(os.path.join(self.root, rel)) == entry[5])
        except OSError:
            return False

    def _settled(self, ch: Change) -> Change:
        """A source deleted or renamed away and back in place by now (an editor saving by
        renaming the old file aside): its content changed, the package's files did not."""
        if ch.kind == "package" and ch.path in self.ws.sources and os.path.isfile(os.path.join(self.root, ch.path)):
            return Change(ch.path, "content", at=ch.at)
        return ch

    def _focus(self, changes: list[Change]) -> set[int] | None:
        """Targets that may be dirty, when only sources changed and the graph is kept:
        those reading a changed file plus whatever did not end clean last cycle."""
        g = self.graph
        reuse = g is not None and not (self.dirty_pkgs or self.reload_all or self.rescan or self.broken)
        if not reuse or self.clean_graph is not g or not changes \
                or any(c.kind not in ("content", "recheck", "mend") for c in changes):
            return None
        if not self.session.record_unchanged():  # another buildtool wrote (or removed) the record
            self.clean = set()
            return None
        assert g is not None
        return self._maybe_dirty(g, changes)

    def _maybe_dirty(self, g: Graph, changes: list[Change]) -> set[int]:
        """The targets of ``g`` that may be dirty after ``changes``: those reading a changed
        file (a header through its depfile too), every pyrule after a ``.py`` file's edit,
        and whatever did not end the last cycle clean."""
        idx = self._readers_of(g)
        disc = self._discovered()
        affected = {t for c in changes for t in (*idx.get(c.path, ()), *disc.get(c.path, ()))}
        if any(c.path.endswith(".py") and c.kind != "package" for c in changes):  # a pyrule's module, or one
            affected.update(t.id for t in g.targets if t.kind == "pyrule")  # it imports (their keys say which)
        return affected | (set(range(len(g.targets))) - self.clean)

    def _refocus(self, changes: list[Change]) -> tuple[Graph, set[int]] | None:
        """After BUILD.py files saved in place (their packages to evaluate again, nothing
        else), the graph the last cycle ended with and the targets of it that may be dirty:
        those reading a changed file and whatever did not end clean.  The build compares the
        evaluated graph with it and plans only what is not declared as it was, or is among
        these, or has an output not as recorded.  (A glob's new file, a package made or a
        BUILD.py saved by rename: every target is checked, as before.)"""
        g = self.graph
        if g is None or not self.dirty_pkgs or self.reload_all or self.rescan or self.broken \
                or self.clean_graph is not g \
                or any(c.kind not in ("content", "recheck", "mend", "package") for c in changes) \
                or any(c.kind == "package" and c.path.rsplit("/", 1)[-1] != BUILDFILE for c in changes):
            return None
        if not self.session.record_unchanged():
            return None
        return g, self._maybe_dirty(g, changes)

    def _readers_of(self, g: Graph) -> dict[str, list[int]]:
        """Source path -> the targets of ``g`` that list it in ``srcs`` (memoised per graph)."""
        if self._src_index[0] is not g:
            m: dict[str, list[int]] = {}
            for t in g.targets:
                for src in t.srcs:
                    m.setdefault(src, []).append(t.id)
            self._src_index = (g, m)
        return self._src_index[1]

    def _pyrule_modules(self) -> frozenset[str]:
        """The module files the graph's pyrules import now (a module edited to import another
        one changes them with no change to the graph)."""
        g = self.graph
        if g is None:
            return frozenset()
        if self._pyrules[0] is not g:
            self._pyrules = (g, list(dict.fromkeys(t.fn for t in g.targets if t.kind == "pyrule" and t.fn)))
        return frozenset(f for fn in self._pyrules[1] for f in keys.pyrule_module_files(self.root, fn))

    def _discovered(self) -> dict[str, list[int]]:
        """Headers found through depfiles (from the build record) -> the targets reading them."""
        g = self.graph
        memo = getattr(self.session, "_record_memo", None)  # (between cycles; during one, the record in use)
        record = memo[1] if memo is not None else getattr(self.session, "record_in_use", None)
        if g is None or record is None:
            return {}
        out: dict[str, list[int]] = {}
        for t in g.targets:
            if getattr(t, "depfile", None) is None:
                continue
            for p in record.discovered(t.label) or ():
                out.setdefault(p, []).append(t.id)
        return out

    def _update_clean(self, col: _Collector, focused: bool, refocused: bool = False) -> None:
        g = col.graph
        if g is None:
            return
        base = self.clean if (focused and self.clean_graph is g) else set()
        if refocused:  # (a new graph: its targets not planned were declared as in the last, and clean there)
            base = {t for t, o in col.outcomes.items() if o.extra.get("unchanged") and o.ok}
        planned = {t: o for t, o in col.outcomes.items() if not o.extra.get("unchanged")}
        ok = {t for t, o in planned.items() if o.ok and o.extra.get("record", True) is not False}
        self.clean = (base - set(planned)) | ok
        self.clean_graph = g

    def cycle(self, changes: list[Change]) -> None:
        self.cycle_no += 1
        try:
            os.getcwd()
        except FileNotFoundError:  # the workspace was removed and made again (a fresh clone):
            try:  # work in the new directory of the same name (if it is not back yet, the
                os.chdir(self.cwd)  # cycle's error says the workspace is gone)
            except OSError:
                pass
        self._apply(changes)
        self.session.removed_dead.clear()  # (their events came during the debounce, if at all)
        if any(os.path.islink(os.path.join(self.root, c.path)) for c in changes if c.kind == "content"):
            self._synced_for = None  # a symlinked source saved: it may lead to another file now (aliases)
        self.session.focus = self._focus(changes)
        self.session.refocus = self._refocus(changes) if self.session.focus is None else None
        self.session.refocused = False
        self.session.saved_meanwhile = self.saved_in_cycle
        self._fresh_cache()
        t0 = time.monotonic()
        self.collector = col = _Collector(self)
        status, error = "OK", None
        self.saved_in_cycle.clear()
        self.in_cycle = True
        self.cycle_start_ns = time.time_ns()
        try:
            if self.reload_config:
                self._reload_config()  # (invalid now: an ERROR cycle, retried on the next save)
                self.reload_config = False
            self.session.build(self.req, out=self.out)
        except BuildFailed:
            status = "FAILED"
        except Interrupted as e:
            if e.signum != CANCEL_SIGNUM:
                self.stop_signal = e.signum
            status = "CANCELLED"
        except _Stop:  # Ctrl-C/SIGTERM while the BUILD.py files were evaluated: said as mid-build
            status = "CANCELLED"
        except UserError as e:
            status, error = "ERROR", str(e)
            if self.partial is not None or self.graph is None:
                self.broken = True
            if e.exit_code == 2:  # (not exit 4's "no tests": as a one-shot build, it keeps them)
                from buildtool.atomic import drop_stale_reports

                # (the latest cycle's reports, and this cycle wrote none)
                drop_stale_reports(self.req, self.session.ws.state_dir, getattr(e, "flags", ()), ours_too=True)
        except BuildtoolError as e:
            status, error = "ERROR", str(e)
        finally:
            self.in_cycle = False
            self.collector = None
            focused = self.session.focus is not None  # (None now if the build found the record changed)
            refocused = self.session.refocused
            self.session.focus = self.session.refocus = None
            self.session.refocused = False
            self._update_clean(col, focused, refocused)
        wall = time.monotonic() - t0
        if error is not None:
            print(f"buildtool: error: {error}", file=sys.stderr, flush=True)
        self._summary(col, status, wall, changes)
        # The cycle's garbage (runner, scheduler and console point at each other): a build
        # freezes what is alive when its scheduling starts, the last cycle's garbage too, and
        # the oldest generation is seldom collected, so it stayed: +25-160 KB a cycle, for good.
        import gc

        gc.collect()
        g = col.graph
        ended = g is not None and status in ("OK", "FAILED")
        self.last_finished = (g, {t: o.status for t, o in col.outcomes.items() if o.status in _FINISHED}) \
            if ended else (None, {})
        self.unrecorded = [g.targets[t].label for t, o in sorted(col.outcomes.items())
                           if o.extra.get("record", True) is False] if ended else []
        if ended and g is not None:  # (a cancelled cycle's failures are those of the one before)
            # A target failing again for another reason (the header made, empty or wrong) keeps
            # the headers it missed: saving one of them again retries it (no depfile names them).
            failed = {t: (at, missing or self.missed.get(g.targets[t].label, frozenset()))
                      for t, (at, missing) in col.failed.items()}
            self.missed = {g.targets[t].label: m for t, (_, m) in failed.items() if m}
            self.mend_paths = _mend_paths(self.root, g, failed)

    def _note_tools(self) -> None:
        """The declared tools inside the workspace that the cycle's build hashed (a script in
        ``bin/`` put on PATH, a ``.venv`` tool) join the watched files; none is forgotten
        (a focused cycle hashes only its targets' tools), which costs at most a cycle that
        checks every target.  Both the path found on PATH and, through links, the file it is
        (the root is a real path; a PATH entry may lead to the workspace through a link)."""
        prefix = self.root + os.sep
        for path in self.session.tools_hashed:
            for where in (path, os.path.realpath(path)):  # (a link to it, the file the key hashes)
                if where.startswith(prefix):
                    self.tools_seen.add(where[len(prefix):].replace(os.sep, "/"))

    def _follow_up(self) -> None:
        """A result not recorded (an input changed while its command ran) gets one more
        cycle of its own: the file that changed may be one no event could report (a header
        its depfile names for the first time).  Only one in a row: a result unrecorded again
        right after waits for the next save (no cycles of their own without end)."""
        if self.unrecorded and not self.followed_up:
            _say(f"{self.unrecorded[0]}{f' (and {len(self.unrecorded) - 1} more)' if len(self.unrecorded) > 1 else ''}"
                 " not recorded (an input changed while it ran): checking again")
            self.q.put(Change(self.unrecorded[0], "recheck"))
            self.followed_up = True
        else:
            self.followed_up = False

    def _summary(self, col: _Collector, status: str, wall: float, changes: list[Change]) -> None:
        n: dict[Status, int] = {}
        ran: list[str] = []
        g = col.graph
        for t, o in sorted(col.outcomes.items()):
            n[o.status] = n.get(o.status, 0) + 1
            if o.status is Status.RAN and g is not None:
                ran.append(g.targets[t].label)
        shown = " ".join(ran[:10]) + (f" +{len(ran) - 10} more" if len(ran) > 10 else "")
        line = (f"watch: cycle {self.cycle_no} {status} in {wall:.3f}s: ran {len(ran)} [{shown}], "
                f"restored {n.get(Status.RESTORED, 0)}, up-to-date {n.get(Status.UP_TO_DATE, 0)}, "
                f"failed {n.get(Status.FAILED, 0)}")
        for st in (Status.SKIPPED, Status.CANCELLED):
            if n.get(st):
                line += f", {st.value} {n[st]}"
        paths = list(dict.fromkeys(c.path for c in changes if c.kind != "recheck"))
        if paths:
            line += "; changed: " + " ".join(paths[:5]) + (f" +{len(paths) - 5} more" if len(paths) > 5 else "")
        again = [c.path for c in changes if c.kind == "recheck"]  # (a label: its result was not recorded)
        if again:
            line += "; checking again: " + again[0]
        # The cycle's end, before it is said: a write the reader of this line makes at once
        # comes after it (a touch was taken for the cycle's own rewrite: _rewritten_as_was).
        self.said_at = (time.monotonic(), time.time_ns())
        print(line, file=self.out, flush=True)

    def run(self) -> int:
        for text in self.req.patterns:  # a malformed pattern no edit can mend: exit 2, as build
            try:
                labels.parse_pattern(text, self.session.ws.cwd_pkg_dir)
            except labels.LabelError as e:
                # `watch core` in lib/ where lib/core is a package: the cycle's build reads it as
                # `build core` does (GraphBuilder.package_below, which evaluates the BUILD.py files)
                below = labels.below_here(text, self.session.ws.cwd_pkg_dir)
                if below is None or not Loader(self.session.ws).package_exists(below):
                    raise UserError(str(e)) from None
        stops = [signal.SIGINT, signal.SIGTERM]  # SIGHUP: a terminal closed (not under nohup); SIGQUIT: Ctrl-\\
        stops += [s for s in (signal.SIGHUP, signal.SIGQUIT) if signal.getsignal(s) is not signal.SIG_IGN]
        prev = {s: signal.signal(s, self._on_signal) for s in stops}
        s = self.session
        s.stats = s.stats or _stat_cache(s)
        if s.cache is None:
            from buildtool.cache import Cache

            s.cache = Cache(self.req.cache_dir or s.config.cache_dir, _warn, s.config.restore_mode)
        s.graph_source = self.graph_source
        s.observer = _Forward(self)
        try:
            changes: list[Change] | None = []
            said_none = False
            while changes is not None and self.stop_signal is None:
                begun, wall = time.monotonic(), time.time_ns()
                self.said_at = None
                self.cycle(changes)
                ended = self.said_at or (time.monotonic(), time.time_ns())
                self.cycle_span, self.cycle_wall = (begun, ended[0]), (wall, ended[1])
                if self.stop_signal is not None:
                    break
                self._note_tools()
                self.sync_watches(self.cycle_start_ns)
                self._follow_up()
                if self.cycle_no == 1 or (said_none and self.ws.sources):  # (again once a broken first cycle's
                    mode = "polling" if self.poll else "inotify"  # BUILD.py is mended: it said "0 sources")
                    n, m = len(self.ws.sources), len(self.ws.dirs)
                    _say(f"watching {n} source{'s' * (n != 1)} and {m} director{'y' if m == 1 else 'ies'} ({mode}); "
                         "Ctrl-C to stop")
                    said_none = not self.ws.sources
                changes = self.wait_for_changes()
        except _Stop:
            pass
        finally:
            self.in_cycle = False
            self._drop_observer()
            for sig, h in prev.items():
                signal.signal(sig, h)
            s.stats.save() if s.stats is not None else None
        if self.stop_signal is not None:  # (a log then ends saying so, not as a watch still waiting would)
            names = {signal.SIGINT: "SIGINT, Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP",
                     signal.SIGQUIT: "SIGQUIT, Ctrl-\\"}
            _say(f"watch stopped ({names.get(self.stop_signal, f'signal {self.stop_signal}')})")
        return 0 if self.stop_signal in (None, signal.SIGINT) else 128 + self.stop_signal  # SIGTERM 143, SIGHUP 129


class _Forward:
    """The session's observer slot: forwards to the current cycle's collector."""

    def __init__(self, w: Watcher) -> None:
        self.w = w

    def started(self, graph: Graph, sched: Any) -> None:
        if self.w.collector is not None:
            self.w.collector.started(graph, sched)

    def target_started(self, t: int, lane: int) -> None:
        return

    def target_finished(self, t: int, o: Outcome) -> None:
        if self.w.collector is not None:
            self.w.collector.target_finished(t, o)


_INCLUDE_FLAGS = ("--include-directory=", "-I", "-iquote", "-isystem", "-idirafter")


# What gcc and clang say of an #include they cannot find, after the file that has it
# (colours removed first): ``lib/x.h:1:10: fatal error: y.h: No such file or directory``.
_MISSING_HEADER = re.compile(rb"(?m)^(?:([^\s:][^:\n]*):\d+:\d+: )?fatal error: "
                             rb"(?:'([^'\n]+)' file not found|([^\s:]+): No such file or directory)")
_COLOURS = re.compile(rb"\x1b\[[0-9;]*[mK]")


def _missing_headers(o: Outcome) -> frozenset[tuple[str, str]]:
    """The headers a failed compile's output says it could not find (relative names only),
    each with the directory of the file that includes it ("" when not said), as written
    (relative to the package, where the command runs)."""
    said = _COLOURS.sub(b"", (o.stdout or b"") + b"\n" + (o.stderr or b""))
    out = set()
    for m in _MISSING_HEADER.finditer(said):
        name = (m.group(2) or m.group(3)).decode("utf-8", "surrogateescape")
        includer = (m.group(1) or b"").decode("utf-8", "surrogateescape")
        if not name.startswith("/"):
            out.add((name, includer.rsplit("/", 1)[0] if "/" in includer else ""))
    return frozenset(out)


def _mend_paths(root: str, g: Graph, failed: Mapping[int, tuple[int, frozenset[tuple[str, str]]]]) -> dict[str, int]:
    """WatchSet.mend_paths for the ``failed`` targets with a depfile: each header their
    compiler said it could not find, at each directory it looks in (the including file's,
    the package's, the sources', and those the command names with ``-I dir``, ``-Idir``,
    ``--include-directory=dir``, ``-iquote``, ``-isystem``, ``-idirafter``, relative to the
    package, where it runs, or absolute), inside the workspace."""
    import posixpath
    import shlex

    out: dict[str, int] = {}
    for t, (at, missing) in failed.items():
        tgt = g.targets[t]
        dirs = {os.path.join(root, tgt.pkg), *(os.path.join(root, posixpath.dirname(s)) for s in tgt.srcs)}
        try:
            words = shlex.split(tgt.cmd)
        except ValueError:  # (unbalanced quotes in a shell command: its include flags are not read)
            words = []
        for i, w in enumerate(words):
            flag = next((f for f in _INCLUDE_FLAGS if w.startswith(f)), None)
            if flag is None:
                continue
            d = w[len(flag):] or (words[i + 1] if i + 1 < len(words) else "")
            if d and not d.startswith("-"):
                dirs.add(posixpath.join(root, tgt.pkg, d))  # (an absolute d stays as it is)
        for name, includer in missing:
            for d in (*dirs, posixpath.join(root, tgt.pkg, includer)):
                p = posixpath.normpath(posixpath.join(d, name))
                if p.startswith(root + "/"):  # (`#include "../common/x.h"`: inside the workspace, kept)
                    p = p[len(root) + 1:]
                    out[p] = max(out.get(p, 0), at)
    return out


def _own_streams(root: str) -> frozenset[str]:
    """Workspace-relative paths of the files this process's stdout and stderr write to, if
    they are in the workspace (Linux: /proc/self/fd): changes to them are its own output."""
    out = set()
    for fd in (1, 2):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if path.startswith(root + os.sep):
            out.add(path[len(root) + 1:].replace(os.sep, "/"))
    return frozenset(out)


def _own_reports(root: str, req: Any) -> frozenset[str]:
    """Workspace-relative paths of the reports each cycle writes (--junit, --profile,
    --events): their changes are this process's own writes, not edits."""
    out = set()
    for path in (getattr(req, "junit", None), getattr(req, "profile", None), getattr(req, "events", None)):
        if path:  # (and where a link there leads: --junit and --profile write its target)
            for full in {os.path.abspath(path), os.path.realpath(path)}:
                if full.startswith(root + os.sep):
                    out.add(full[len(root) + 1:].replace(os.sep, "/"))
    return frozenset(out)


def _stat_cache(session: Any) -> Any:
    from buildtool.digest import StatCache

    state = session.ws.ensure_state_dir()
    return StatCache(session.ws.root, os.path.join(state, "stat-cache"), _warn)


def _buildfiles(pkgs: Iterable[str]) -> set[str]:
    return {f"{p}/{BUILDFILE}" if p else BUILDFILE for p in pkgs}


def _forget_workspace_modules(root: str) -> None:
    prefix = root + os.sep
    for name, mod in list(sys.modules.items()):
        fn = getattr(mod, "__file__", None)
        if fn and fn.startswith(prefix) and name != "buildtool" and not name.startswith("buildtool."):
            del sys.modules[name]
    importlib.invalidate_caches()


def _say(msg: str) -> None:
    print(f"buildtool: {msg}", file=sys.stderr, flush=True)


def _warn(msg: str) -> None:
    print(f"buildtool: warning: {msg}", file=sys.stderr, flush=True)


def watch(session: Any, req: Any, *, poll: bool = False, debounce_ms: float | None = None) -> int:
    """``buildtool watch``: build, then rebuild on every relevant change until SIGINT/SIGTERM/SIGHUP."""
    return Watcher(session, req, poll=poll, debounce_ms=debounce_ms).run()
