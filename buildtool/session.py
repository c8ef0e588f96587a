"""Session: the library entry point — load, graph, plan, schedule, report.

``cli.py`` only parses arguments and calls these functions; everything a build needs is
wired here (workspace, config, lock, build record, stat cache, shared cache, runner,
scheduler and reporters).
"""

from __future__ import annotations

import gc
import os
import posixpath
import signal
import sys
import time

from buildtool import cache_gc, labels, noop, orphans
from buildtool.atomic import remember_reports, remove_path, umask_for_commands
from buildtool.cache import Cache
from buildtool.config import Config, cpu_count, load_config
from buildtool.console import LoadingLine, escape_controls, is_live_terminal
from buildtool.console import say as console_say
from buildtool.console import targets as console_targets
from buildtool.digest import StatCache
from buildtool.errors import (
    BuildFailed,
    BuildtoolError,
    Interrupted,
    LostRemoteInputs,
    NoTestsError,
    ReportPathError,
    UserError,
)
from buildtool.graph import Graph, GraphBuilder
from buildtool.lock import WorkspaceLock
from buildtool.outcome import Outcome, Reason, Status
from buildtool.plan import Plan
from buildtool.profile import Phases, format_critical_path, write_profile
from buildtool.record import BuildRecord, desc_of
from buildtool.runner import RunOptions, TargetRunner
from buildtool.scheduler import Scheduler
from buildtool.status import Console, EventsWriter, Fanout
from buildtool.workspace import ALWAYS_SKIPPED, BUILDFILE, STATE_DIR, Workspace, find_workspace

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
    from typing import Any

    from buildtool.graph import Target
    from buildtool.loader import Loader
    from buildtool.loadlimit import LoadLimit

UNKNOWN_DURATION = 1.0
FRESH_WEIGHT = 0.001


class BuildRequest:
    """One build as asked for: by the command line, watch mode or a library caller."""

    __slots__ = ("action_env", "always_make", "cache_dir", "cache_tests", "color", "dry_run", "events", "explain",
                 "jobs", "junit", "keep_going", "load", "mode", "patterns", "print_directory", "prior", "profile",
                 "replay_output", "test_output", "verbose", "wait", "want_files")

    def __init__(
        self,
        patterns: list[str],
        mode: str = "build",  # build | test
        jobs: int | None = None,
        keep_going: bool | None = None,
        dry_run: bool = False,
        cache_dir: str | None = None,
        explain: bool = False,
        events: str | None = None,
        wait: bool = True,
        action_env: list[str] | None = None,  # None: []
        cache_tests: bool = True,
        profile: str | None = None,  # --profile FILE: Chrome trace (profile.py)
        load: float | None = None,  # -l LOAD: no new work above this load average (loadlimit.py)
        color: str = "auto",  # --color auto|always|never
        replay_output: bool = False,  # --replay-output: print cached stdout/stderr of restored targets
        test_output: str = "errors",  # --test-output errors|all|none (testing.py)
        junit: str | None = None,  # --junit FILE (junit.py)
        prior: Any = None,  # a noop.Verdict from the CLI: try the snapshot's graph (only files changed)
        want_files: bool = False,  # the requested targets' outputs must be on disk (`buildtool run`)
        verbose: bool = False,  # -v: each command that runs (or would run) is printed
        print_directory: bool = False,  # -w: "Entering directory" lines around a command's output
        always_make: bool = False,  # -B: every target's command runs (no up-to-date check, no cache)
    ) -> None:
        self.always_make = always_make
        self.patterns = patterns
        self.mode = mode
        self.jobs = jobs
        self.keep_going = keep_going
        self.dry_run = dry_run
        self.cache_dir = cache_dir
        self.explain = explain
        self.events = events
        self.wait = wait
        self.action_env = [] if action_env is None else action_env
        self.cache_tests = cache_tests
        self.profile = profile
        self.load = load
        self.color = color
        self.replay_output = replay_output
        self.test_output = test_output
        self.junit = junit
        self.prior = prior
        self.want_files = want_files
        self.verbose = verbose
        self.print_directory = print_directory

    def keeps_going(self, cfg: Any) -> bool:
        """-k / --no-keep-going as asked, else the config's (env, buildtool.toml) keep_going."""
        return bool(self.keep_going if self.keep_going is not None else cfg.keep_going)


class BuildResult:
    """What a build did: each requested label's outcome, the wall time, the exit code."""

    __slots__ = ("exit_code", "graph", "outcomes", "wall")

    def __init__(self, outcomes: dict[str, Outcome], wall: float, exit_code: int, graph: Graph | None = None) -> None:
        self.outcomes = outcomes
        self.wall = wall
        self.exit_code = exit_code
        self.graph = graph


def _warn(msg: str) -> None:
    _say(f"warning: {msg}")


def _say(msg: str) -> None:
    console_say(msg)  # (one write; above a terminal's live area)


class Session:
    """One workspace opened for a command."""

    def __init__(self, start_dir: str, flags: dict[str, Any] | None = None) -> None:
        self.ws: Workspace = find_workspace(start_dir)
        self.config: Config = load_config(self.ws.root, flags or {})
        self._flags = flags or {}  # (reload_config reads the same flags again)
        # Watch mode (watch.py) keeps these across build cycles; None: fresh per build.
        self.stats: StatCache | None = None
        self.cache: Cache | None = None
        self.unhidden: set[str] = set()  # this build's recorded outputs that glob() may return (recorded_outputs)
        # Watch mode's graph, reused or partly reloaded: (record, request, packages to evaluate
        # again) -> (loader, graph).
        self.graph_source: Callable[[BuildRecord, BuildRequest, set[str]], tuple[Loader, Graph]] | None = None
        # Extra reporter; also gets ``started(graph, scheduler)`` before the scheduler runs.
        self.observer: Any = None
        # Watch mode: targets that may be dirty this cycle (None: check everything).  Only
        # these and their dependents are planned; the rest keep last cycle's results.
        self.focus: set[int] | None = None
        # (watch) after BUILD.py edits: the last cycle's graph and the targets of it that may
        # be dirty; the evaluated graph's targets declared as they were there and not among
        # those are not planned (Graph.redefined), as a one-shot build compares with its
        # snapshot's graph.  ``refocused`` says it was applied.
        self.refocus: tuple[Graph, set[int]] | None = None
        self.saved_meanwhile: Container[str] = ()  # (watch) the files it saw saved during this build
        self.changed_under: set[str] = set()  # inputs the last build found changed while their command ran
        self.refocused = False
        self._record_memo: tuple[tuple[int, int, int], BuildRecord] | None = None
        self.record_in_use: BuildRecord | None = None  # the build record of the build running (or last run)
        self.removed_dead: set[str] = set()  # dead outputs this session deleted (watch: not a user's change)
        self.tools_hashed: dict[str, Any] = {}  # path -> stat of each declared tool the last build hashed (watch)
        self._noted_tests: set[str] = set()  # named tests `build` does not run (noted once each)
        self._remote_flags_checked = False  # (remote.setup.check_download: said once, not each watch cycle)
        self.tests_missing: str | None = None  # `test` named only non-tests: why it ends with exit 4
        self.loading: LoadingLine | None = None  # a terminal's line while BUILD.py files are evaluated
        # This build's stat cache knows the recorded outputs as the last build left them
        # (_identity_trusted; after a crash, once the entries the files no longer match are gone)
        self.identity_trusted = False

    def reload_config(self) -> None:
        """Read buildtool.toml, .buildtoolignore and the user config again, for the same
        workspace root (watch mode, when one changed); UserError when one is invalid now,
        or the marker is gone (the enclosing workspace, if any, is not this one)."""
        from buildtool.workspace import MARKER, is_marker, read_ignore  # (watch mode only)

        root = self.ws.root
        if not is_marker(os.path.join(root, MARKER)):
            msg = f"{os.path.join(root, MARKER)} was removed: it marks this workspace's root (an empty file will do)"
            raise UserError(msg)
        self.config = load_config(root, self._flags)
        self.ws = Workspace(root, self.ws.cwd_pkg_dir, read_ignore(root))

    # -- graph -----------------------------------------------------------------------
    def _graph(self, loader: Loader, patterns: list[str], mode: str, keep_going: bool = False) -> Graph:
        builder = GraphBuilder(loader, self.ws.cwd_pkg_dir)
        builder.default_test_timeout = self.config.test_timeout
        builder.keep_going = keep_going  # (-k: every BUILD.py a wildcard loads is evaluated, each error said)
        roots = builder.expand_patterns(patterns, want_tests=(mode == "test"))
        if mode == "test" and not any(
            loader.load(labels.split_label(lab)[0])[labels.split_label(lab)[1]].kind == "test" for lab in roots
        ):
            if not roots:  # built (nothing), reported (no test), then exit 4, as for non-tests named
                self.tests_missing = f"no test targets among {' '.join(patterns) or '//...'}"
                return builder.build([])
            graph = builder.build(roots)
            if not any(t.kind == "test" for t in graph.targets):  # (a group of tests runs them)
                # Non-tests named explicitly: built, then exit 4 (as Bazel).
                self.tests_missing = f"no test targets among {' '.join(patterns)}"
            return graph
        if mode == "build":
            # `build` never runs tests: a named test's dependencies are built and the test is
            # reported "not run" (reason test_not_run), as one a group reaches: every named
            # target has its --events line and is counted.
            for lab in roots:
                pkg, name = labels.split_label(lab)
                if loader.load(pkg)[name].kind == "test" and lab not in self._noted_tests:
                    self._noted_tests.add(lab)
                    _say(f"note: {lab} is a test; `build` builds only its dependencies, `buildtool test {lab}` runs it")
        return builder.build(roots)

    def load_graph(self, patterns: list[str], mode: str = "build") -> Graph:
        """The validated graph of a request, without taking the lock or touching state
        (for query, graph and plan)."""
        record = BuildRecord(os.path.join(self.ws.state_dir, "record"), _warn, readonly=True)  # (no lock held)
        from buildtool.loader import Loader

        self.tests_missing = None
        graph = self._graph(Loader(self.ws, record.all_outputs()), patterns, mode)
        if self.tests_missing is not None:  # (`plan --test //:lib`: no test to plan)
            raise NoTestsError(self.tests_missing)
        return graph

    def build(self, req: BuildRequest, out: Any = None) -> BuildResult:
        t_begin = time.monotonic()
        cfg = self.config
        state = self.ws.ensure_state_dir()
        lock = getattr(req.prior, "lock", None)  # held since the snapshot check (noop.try_noop)
        if lock is None:
            lock = WorkspaceLock(state)
            lock.acquire(req.wait, _say, self.ws.ensure_state_dir, lambda: self._check_patterns(req, state))
            if (self.focus is not None or self.refocus is not None) and not self.record_unchanged():
                # (watch) another buildtool wrote the record or cleaned while this one waited
                # for the lock: what the watcher knew to be clean may not be, check them all
                self.focus = self.refocus = None
        # Loading (graph, record, stat cache) and writing the snapshot allocate objects that
        # live until the build ends and form no cycles; the cycle collector would only scan
        # them again and again (~30 ms of a one-changed build at 10,000 targets).  It runs
        # during the scheduling only, with what was loaded frozen out of its way.
        collecting = gc.isenabled()
        gc.disable()
        signals = _Signals()
        try:
            try:
                self.tests_missing = None
                result = self._build_locked(req, cfg, state, t_begin, out, signals)
                if self.tests_missing is not None:
                    raise NoTestsError(self.tests_missing)
            finally:
                gc.unfreeze()
                if collecting:
                    gc.enable()
                lock.release()
                signals.restore()
        except BuildtoolError as e:  # (a failed test, a lost report: the user stopped the build all the same)
            if signals.held is None or isinstance(e, Interrupted):
                raise
            raise Interrupted(signals.held) from None
        if signals.held is not None:  # it came while the reports were written: they are whole
            raise Interrupted(signals.held)
        return result

    def _check_patterns(self, req: BuildRequest, state: str) -> None:
        """Before waiting for another build's lock: the request's labels name targets (a
        typo, a broken BUILD.py they load is exit 2 at once, not after minutes of waiting).
        Only the named packages are loaded (no wildcard: ``//...`` would load them all, for
        nothing), and the check leaves no trace: the workspace modules it imported are
        forgotten, so that the build, under the lock, imports them as they are then (an edit
        during the wait) and tracks what they read (a ``getenv`` at import)."""
        if self.graph_source is not None or not req.patterns or any("..." in p for p in req.patterns):
            return  # (watch: its graph was loaded already)
        from buildtool.loader import Loader

        record = BuildRecord(os.path.join(state, "record"), lambda _msg: None, readonly=True)  # (the build's)
        builder = GraphBuilder(Loader(self.ws, record.all_outputs()), self.ws.cwd_pkg_dir)
        before = set(sys.modules)
        try:
            builder.expand_patterns(req.patterns, want_tests=(req.mode == "test"))
        finally:
            inside = self.ws.root + os.sep
            installed = tuple(os.path.abspath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
            for name in set(sys.modules) - before:
                where = getattr(sys.modules[name], "__file__", None)
                # (not an installed module: a .venv inside the workspace holds buildtool itself, and
                # packages whose import has effects; nor buildtool's own, an editable install there)
                if isinstance(where, str) and where.startswith(inside) and not where.startswith(installed) \
                        and name.partition(".")[0] != "buildtool" \
                        and not {"site-packages", "dist-packages"} & set(where.split(os.sep)):
                    del sys.modules[name]

    def recorded_outputs(self, record: BuildRecord) -> set[str]:
        """The outputs earlier builds wrote, which glob() leaves out: all the record holds but
        those this build found edited after their target stopped declaring them."""
        return record.all_outputs() - self.unhidden

    def _build_locked(
        self, req: BuildRequest, cfg: Config, state: str, t_begin: float, out: Any, signals: _Signals
    ) -> BuildResult:
        self.unhidden = set()
        verdict, prior_graph = None, None
        if req.prior is not None and self.focus is None and self.graph_source is None:
            # The snapshot vouches for the graph, only files changed; checked under this lock.
            verdict = req.prior
            if verdict.lock is None:
                request = noop.request_of(req.mode, req.patterns, self.ws.root, self.ws.cwd_pkg_dir, req.action_env)
                verdict = noop.check(state, self.ws.root, request)
            prior_graph = noop.load_graph(state, _warn, verdict.body.get("graph"), verdict.slot) \
                if verdict is not None else None
        if not req.dry_run:  # (a dry run, `explain`, `plan` change no file: the snapshot still holds)
            request = noop.request_of(req.mode, req.patterns, self.ws.root, self.ws.cwd_pkg_dir, req.action_env)
            noop.invalidate(state, noop.slot_of(request))
        killed_before = False  # a build here was killed: what it stored went uncounted (cache_gc.after_build)
        cut: list[str] = []
        if not req.dry_run:  # (a dry run leaves them, and their lanes' records, to the next build)
            killed_before = orphans.left_by_a_killed_build(state)
            orphans.reap(state, _warn, cut_short=cut)  # commands a kill -9ed buildtool left running (reliability.md)
            _remove_cut_short(self.ws.root, cut)
        record = self.record_in_use = self._open_record(state)  # (watch mode reads discovered headers from it)
        # Stamps cut short: what they did is half done whatever the record says (a dry run
        # forgets their lines in memory only, as the build after it will on disk).
        for label in cut if not req.dry_run else orphans.being_written_when_killed(state):
            if label.startswith("//"):
                if req.dry_run:
                    record.entries.pop(label, None)
                else:
                    record.drop(label)
        if verdict is not None and record.torn:  # the snapshot's build ended on whole lines: a crash's
            _warn("the build record ends in a torn line (a crash?); checking every target")  # zeros, say
            verdict, prior_graph = None, None
        stats = self.stats or StatCache(self.ws.root, os.path.join(state, "stat-cache"), _warn)
        stats.begin_build()
        self.identity_trusted = _identity_trusted(state)
        if not req.dry_run and not self.identity_trusted:
            # The record has lines the saved stat cache never saw (a build killed after them):
            # an entry of a recorded output that is not the file's stat now (one lstat each,
            # no hashing) was left by the killed build's rewrite, which a removed rule's output
            # would then take for written again since (_changed_since_built).
            for p in record.all_outputs():
                e = stats.entries.get(p)
                if e is None:
                    continue
                try:
                    st = os.lstat(os.path.join(self.ws.root, p))
                except OSError:
                    continue
                if (e[0], e[1], e[2]) != (st.st_size, st.st_mtime_ns, st.st_ino):
                    stats.forget(p)
            self.identity_trusted = True  # (what is left is the files as they are)
        # Before the evaluation: a cache dir made in the workspace during the build would be a
        # directory entry that appeared after the listings, refusing the no-op snapshot once.
        cache = self.cache or Cache(cfg.cache_dir, _warn, cfg.restore_mode)
        loader: Loader | None = None  # None: the snapshot's graph, no BUILD.py evaluated
        phases = Phases(t_begin)
        phases.begin("load buildfiles and graph")

        def evaluate(stale: set[str]) -> tuple[Loader, Graph]:
            stream = out or sys.stdout
            whole = _wants_everything(req.patterns, self.ws.cwd_pkg_dir)  # (a total of //a/... would count all)
            self.loading = LoadingLine(stream, whole) if is_live_terminal(stream) else None
            try:
                if self.graph_source is not None:
                    return self.graph_source(record, req, stale)
                from buildtool.loader import Loader

                new = Loader(self.ws, self.recorded_outputs(record))
                new.progress = self.loading
                return new, self._graph(new, req.patterns, req.mode, keep_going=req.keeps_going(cfg))
            finally:
                if self.loading is not None:
                    self.loading.close()
                    self.loading = None

        cleans = self.focus is None and not req.dry_run  # (dead outputs are deleted after a full evaluation)
        dead: tuple[list[tuple[str, list[Any]]], list[str]] = ([], [])

        def read_then(loader: Loader | None) -> tuple[list[str], dict[str, Any], dict[str, str | None] | None]:
            """What the evaluation read, as it was then: an edit later in the build refuses the snapshot."""
            nonlocal dead
            struct = self._struct_of(loader)[0] if loader is not None else verdict.struct if verdict is not None else []
            struct_seen = {} if loader is None else noop.struct_sigs(self.ws.root, struct)
            if loader is not None and cleans:
                dead = self._dead_outputs(graph, loader, record)
            listed = None if loader is None or self.focus is not None or req.mode != "build" \
                else noop.dir_listings(self.ws.root, loader.glob_dirs, [o for t in graph.targets for o in t.outs],
                                       self._going(graph, dead[0], stats), self.ws.is_ignored)
            if listed is not None:  # (and as they were when they were listed)
                noop.unsettled_listings(self.ws.root, loader.dir_stats, listed)
            return struct, struct_seen, listed

        regraph = verdict is not None and verdict.regraph  # a BUILD.py, module or listing changed
        if isinstance(prior_graph, Graph) and not regraph:
            graph = prior_graph
        else:
            loader, graph = evaluate(set())
        struct, struct_seen, listed = read_then(loader)
        phases.end("load buildfiles and graph")
        _check_report_paths(req, graph, self.ws.root, struct)
        focus = self.focus
        from_snapshot = isinstance(prior_graph, Graph) and verdict is not None and not regraph
        rediff = isinstance(prior_graph, Graph) and regraph  # compared with the snapshot's graph
        if cleans and loader is not None:  # a dry run changes nothing
            phases.begin("clean dead outputs")
            hidden = loader.glob_hidden
            kept = [p for p in self._clean_dead(graph, loader, record, stats, dead) if p in hidden]
            if kept:  # a glob() left them out as outputs no target declares now: sources now
                self.unhidden = set(kept)  # (a live target's is still in its record entry)
                loader, graph = evaluate({hidden[p] for p in kept})
                struct, struct_seen, listed = read_then(loader)
                _check_report_paths(req, graph, self.ws.root, struct)
            phases.end("clean dead outputs")
        if from_snapshot or rediff:
            assert verdict is not None
            changed = set(verdict.changed)
            focus = {t.id for t in graph.targets if not changed.isdisjoint(t.srcs) or not changed.isdisjoint(t.outs)}
            focus |= _readers(graph, record, changed.intersection(verdict.body.get("found", ())))
            if rediff:  # a target that is declared as it was, with no file of it changed, is as the
                assert isinstance(prior_graph, Graph)  # last (wholly successful) build left it
                focus |= graph.redefined(prior_graph)
        elif focus is None and self.refocus is not None and self.refocus[0] is not graph and loader is not None:
            old, maybe = self.refocus  # (a comment in a BUILD.py checked 2,000 targets in watch, none one-shot)
            again = {old.targets[i].label for i in maybe}
            focus = {t.id for t in graph.targets if t.label in again} | graph.redefined(old)
            # (an output deleted or edited by hand meanwhile: a full check restored it)
            focus |= {t.id for t in graph.targets if t.id not in focus and t.kind != "group" and t.outs
                      and _outputs_differ(t.outs, record.get(t.label), stats)}
            self.refocused = True
        from buildtool.staging import Stage

        if os.path.islink(os.path.join(state, "tmp")):  # (planted: the lanes' files went where it led)
            os.unlink(os.path.join(state, "tmp"))
        stage = Stage(os.path.join(state, "tmp"))  # new files are born here (staging.py)
        cache.stage = stage
        action_env: dict[str, str | None] = {}
        for item in [*cfg.action_env, *req.action_env]:
            name, eq, value = item.partition("=")
            action_env[name] = value if eq else None
        runner = TargetRunner(
            self.ws.root, state, graph, record, stats, cache,
            RunOptions(base_path=os.environ.get("PATH", "/usr/bin:/bin"), action_env=action_env,
                       dry_run=req.dry_run, cache_tests=req.cache_tests, always_make=req.always_make,
                       run_tests=req.mode not in ("build", "explain")),  # (what `build` would do)
            _warn,
        )
        runner.executor.stage = stage
        runner.saved_meanwhile = self.saved_meanwhile
        runner.changed_before, self.changed_under = self.changed_under, runner.changed_under
        self.tools_hashed = runner.tool_stats
        remote = None
        typed_jobs = self._flags.get("remote_jobs") is not None  # (a config's, for its executor elsewhere: quiet)
        if (getattr(cfg, "remote_download", "all") != "all" or typed_jobs) and not self._remote_flags_checked:
            from buildtool.remote.setup import check_download

            self._remote_flags_checked = True
            check_download(cfg, _warn, typed_jobs)
        if (cfg.remote_cache or cfg.remote_executor) and not req.dry_run:
            from buildtool.remote.setup import attach

            remote = attach(runner, cfg, self.ws.root, cache, state, _warn)
            if runner.remote_exec is not None:  # --remote-download toplevel: these are downloaded
                runner.remote_exec.top = {graph.targets[i].label for i in graph.requested}
                if req.want_files and runner.remote_exec.download == "minimal":
                    runner.remote_exec.download = "toplevel"  # `buildtool run` needs the file it runs
        wanted: range | set[int] = range(len(graph.targets))
        if focus is not None:
            wanted = _with_dependents(graph, focus)
        later = _discovered_order(graph, record, wanted)  # plan edges from depfiles (and a cone grown by them)
        if focus is not None:
            if not (from_snapshot or rediff):  # (the snapshot's check already counts a changed output as changed)
                _add_stale_producers(graph, wanted, record, stats)
            # What the rest produced last time, for the keys of the cone: the outputs of the
            # cone's dependencies outside it (other record entries are not even parsed).
            outside: set[int] = set()
            todo = [d for i in wanted for d in graph.targets[i].deps if d not in wanted]
            while todo:  # a group stands for its members' outputs
                d = todo.pop()
                if d not in outside:
                    outside.add(d)
                    if graph.targets[d].kind == "group":
                        todo.extend(graph.targets[d].deps)
            for d in outside:
                entry = record.get(graph.targets[d].label)
                for o in entry["o"] if entry else ():
                    runner.publish_output(o[0], o[1], o[2] if len(o) > 2 else None)
        console = Console(graph, len(wanted), out, explain=req.explain, color=req.color,
                          replay_output=req.replay_output, verbose=req.verbose,
                          print_directory=self.ws.root if req.print_directory else None)
        events = EventsWriter(req.events, graph) if req.events else None
        handed_over = False  # the signals are the scheduler's (an interrupt then cancels, as it says itself)
        lost_report: str | None = None  # a report file (--profile, --junit, --events) that could not be written
        try:
            if req.dry_run:
                if req.mode == "test":  # which tests failed last time (testing.py)
                    from buildtool.testing import TestLogs

                    runner.failed_tests = TestLogs(state, _warn).failed
                outcomes = dry_run(graph, runner, record, later)
                _no_reports_of_a_dry_run(req)
                if req.explain:
                    from buildtool import explain

                    explain.report(graph, outcomes, console.out)
                for t, o in outcomes.items():
                    if events:
                        events.target_finished(t, o)
                    if req.explain:
                        continue
                    # (what would run; not what is fresh: up to date, adopted, a group, a test not asked for)
                    if o.status is not Status.UP_TO_DATE:
                        print(f"{graph.targets[t].label}: {escape_controls(o.message)}", file=console.out)
                        if req.verbose and not o.extra.get("would_restore"):
                            console.command_of(t)
                n = sum(1 for o in outcomes.values() if o.reason is Reason.DRY_RUN)
                if not req.explain:
                    print(f"dry run: {n} of {console_targets(len(outcomes))} would run or be restored",
                          file=console.out)
                by_label = {graph.targets[t].label: o for t, o in outcomes.items()}
                if events:
                    events.close()  # (and again, harmlessly, below)
                    if events.lost:
                        raise BuildtoolError(f"the dry run ended, but {events.lost}")
                return BuildResult(by_label, time.monotonic() - t_begin, 0, graph)
            umask_for_commands()
            phases.begin("critical-path weights")
            tests = _test_session(self.ws.root, state, graph, req) if req.mode == "test" else None
            weights = self._weights(graph, record, stats, wanted, runner if not from_snapshot else None, cache,
                                    tests.logs.failed_s if tests else None)
            deps: list[Any] = [t.deps for t in graph.targets]
            dependents: Any = graph.dependents
            if later:  # (the edges depfiles name: a header made by another target first)
                runner.after = later
                dependents = [list(c) for c in dependents]
                for r, makers in later.items():
                    deps[r] = (*deps[r], *makers)
                    for m in makers:
                        dependents[m].append(r)
            plan = Plan(
                deps,
                dependents,
                wanted,
                [t.priority for t in graph.targets],
                weights,
            )
            phases.end("critical-path weights")
            jobs = req.jobs or cfg.jobs or cpu_count()
            if cfg.remote_executor and cfg.remote_jobs:  # remote actions do not use local cores
                jobs = max(jobs, cfg.remote_jobs)
            console.estimate(weights, jobs, wanted)
            jobs = _fit_fd_limit(jobs, _warn)
            load_limit: LoadLimit | None = None
            if req.load is not None:
                from buildtool.loadlimit import LoadLimit

                load_limit = LoadLimit(req.load)
            _warn_unknown_pools(graph, wanted, cfg.pools)
            shown = tests.console(console) if tests else console
            runner_reporter = Fanout(_Committer(runner), shown, events, self.observer, load_limit)
            sched = Scheduler(
                plan, tests.wrap(runner) if tests else runner, runner_reporter, jobs=jobs,
                keep_going=req.keeps_going(cfg),
                pool_of=[t.pool for t in graph.targets], pool_depth=cfg.pools,
                can_start=load_limit.can_start if load_limit else None,
                exclusive=[t.exclusive for t in graph.targets],
                origin=t_begin,  # (start and end in --events count from when the build began, as --profile's)
            )
            if self.observer is not None:
                self.observer.started(graph, sched)
            children = orphans.Tracker(state)
            runner.executor.tracker = children
            runner.executor.sweep_at_end = True  # (kill_remaining below, whatever happens)
            signals.install(sched.request_stop)
            handed_over = True
            t_sched = time.monotonic()
            gc.freeze()
            gc.enable()
            try:
                outcomes = sched.run()
            finally:
                gc.disable()
                signals.hold()  # (what follows writes the reports and the state: it is not cut short)
                try:
                    runner.executor.kill_remaining()
                    children.close()
                finally:
                    console.close()  # (its ticker stopped and its live area gone, whatever happened)
            cache.write_queued()  # (whatever comes next: a signal held below skips after_build's flush)
            phases.add("schedule", t_sched, time.monotonic())
            wall = time.monotonic() - t_begin
            limited = {name: depth for name, depth in {**cfg.pools, "console": 1}.items() if 0 < depth < sched.jobs}
            if sched.interrupt is None:  # (cut short, the chain of what finished says nothing of the wall)
                console.critical_path(format_critical_path(graph, outcomes, wall, later, limited))
            if req.profile:
                lost_report = _write_profile(req.profile, graph, outcomes, phases, wall)
            cache.note_durations((graph.targets[t].label, o.extra.get("attempt_s", o.duration))  # (a flaky test's:
                                 for t, o in outcomes.items()  # the attempt that passed, as the record has)
                                 if (o.status is Status.RAN or o.extra.get("executed") == "remote")  # (an
                                 and o.duration > 0)  # executor's action cache hit: its run's time)
            cache.note_descriptions(_stored_descriptions(outcomes.values()))
            if signals.held is None:  # (interrupted: it may wait seconds for another build's size lock)
                cache_gc.after_build(cache, cfg.max_size, outcomes.values(), _warn, rescan=killed_before)
            if focus is not None and (events or self.observer):  # one event per target, as always
                kept = Outcome(Status.UP_TO_DATE, Reason.UP_TO_DATE,
                               "up to date: none of its inputs changed since the last build",
                               extra={"unchanged": True})  # (not planned: nothing was checked)
                for t in range(len(graph.targets)):
                    if t not in wanted:
                        o = runner.runs_nothing(t)  # (a test `build` passes by is still not run)
                        if o is not None:
                            o.extra["unchanged"] = True
                        for r in (events, self.observer):
                            if r is not None:
                                r.target_finished(t, o or kept)
            console.summary(wall, sched.failed, sched.interrupt is not None, len(graph.targets) - len(wanted))
            if remote is not None:
                remote.finish(console.out, events)
            if tests is not None:
                shown = outcomes
                if focus is not None:  # (a watch cycle; the snapshot's path is build-only): the tests left out
                    # of the plan passed last time and none of their inputs changed since: cached
                    # passes, as a full `test` shows them (JUnit lost them, and the summary's count)
                    shown = dict(outcomes)
                    for t in range(len(graph.targets)):
                        if t not in wanted and graph.targets[t].kind == "test":
                            shown[t] = Outcome(Status.UP_TO_DATE, Reason.UP_TO_DATE,
                                               "up to date: none of its inputs changed since the last build")
                tests.finish(shown, console.out, lambda lab: (record.get(lab) or {}).get("d"))
                lost_report = lost_report or tests.lost_junit
        except KeyboardInterrupt:  # (Ctrl-C, SIGTERM before the scheduler took the signals over)
            if events and not handed_over:  # every wanted target gets its line, as when the commands are cut short
                for t in sorted(set(wanted) - events.written):  # (a dry run's listing has some)
                    events.target_finished(t, Outcome(Status.CANCELLED, Reason.INTERRUPTED,
                                                      "not started: the build was interrupted"))
            raise
        finally:
            record.close(compact=not req.dry_run)  # (a dry run leaves the snapshot, which names this file)
            stats.save()
            if not req.dry_run and not stats.dirty and stats.path and not _identity_trusted(state):
                # Saved with nothing new (a test rerun writes the record, no stat): the stat
                # cache still knows the outputs as this build left them; say so by its time,
                # or the next build takes it for one a crash left behind (_identity_trusted).
                try:
                    os.utime(stats.path)
                except OSError:
                    pass
            if events:
                events.close()
                lost_report = lost_report or events.lost
            if not req.dry_run:  # (a killed build's lane records are the next real build's to read)
                remove_path(os.path.join(state, "tmp"))  # (the lanes' markers and emptied TMPDIRs)
                runner.drop_short_names()  # (their links in /tmp, which would lead nowhere now)
            remember_reports(state)  # (what a refused request may remove: drop_stale_reports)
        result = BuildResult({graph.targets[t].label: o for t, o in outcomes.items()}, wall, 0, graph)
        self._remember_record(state, record)
        if req.mode == "build" and (focus is None or from_snapshot or rediff) and not req.dry_run \
                and not sched.failed and not record.failed \
                and sched.interrupt is None and signals.held is None \
                and not any(t.always for t in graph.targets) \
                and not (runner.remote_exec is not None and runner.remote_exec.download != "all") \
                and all(o.extra.get("record", True) is not False for o in outcomes.values()):
            # always=True targets run on every build; outputs left remote are absent on disk, so
            # the snapshot (stat only) cannot vouch for them: the rebuilder checks each build.
            # A result not recorded (an input changed while its command ran): the next build
            # must look at that target again, whatever the files' stats say by then.
            # Files are signed against the stat data the build relied on: an input's first
            # (a file edited between two of its readers differs from it next time), an
            # output's last; the stat cache's own entries for files this build did not use.
            # (A refocused watch cycle writes none, its focus being neither: the tools of the
            # targets it left out were not looked at, and a snapshot listing only the others'
            # missed a tool's change.)
            seen = (stats.used, stats.entries)
            # What shapes the graph, as the build relied on it: the evaluation's reads (when
            # each was read, and all of them after it), an action's hash (a BUILD.py or
            # module may be a source too), the tools' stats when they were hashed.
            relied = (stats.used, struct_seen, {} if loader is None else loader.read_stats, runner.tool_stats)
            if from_snapshot:
                assert verdict is not None
                self._write_snapshot(req, state, graph, runner, verdict.struct, verdict.dirs,
                                     set(verdict.env_names), seen, relied, verdict, wanted)
            else:
                assert loader is not None
                carry = None
                if rediff:  # the targets not planned: signed as the check found their files
                    assert verdict is not None
                    seen, carry = (stats.used, verdict.rows(), stats.entries), verdict
                try:  # (a graph read by relative paths holds for this working directory only)
                    cwd = os.getcwd() if loader.cwd_relative else None
                except OSError:  # deleted under the shell: no directory to tie a snapshot to
                    pass
                else:
                    # A BUILD.py that started a process (`git rev-parse HEAD`): what the process
                    # read is unknown, so no snapshot; every build evaluates the BUILD.py files,
                    # as Make runs a $(shell ...) each time.
                    if loader.spawned is None:
                        self._write_snapshot(req, state, graph, runner, *self._struct_of(loader), seen, relied,
                                             listed=listed, cwd=cwd, carry=carry)
                    elif req.verbose:
                        _say(f"note: {loader.spawned} started a process while it was evaluated; what "
                             "that process read cannot be tracked, so every build evaluates the BUILD.py files "
                             "(no no-op snapshot)")
        if sched.interrupt is not None:
            raise Interrupted(sched.interrupt)
        if sched.failed:
            failed = [o for o in outcomes.values() if o.status is Status.FAILED]
            if failed and all(o.extra.get("lost_remote") for o in failed):  # (runner._fetch_inputs)
                raise LostRemoteInputs("build failed")
            raise BuildFailed("build failed")
        if lost_report:  # a CI job must not pass without the report it asked for
            raise BuildtoolError(f"the build succeeded, but {lost_report}")
        return result

    def events_of_nothing(self, path: str, graph: Graph, loader: Loader) -> None:
        """``--events`` for a request that builds nothing (``run`` of a target with neither
        outputs nor dependencies): the path checked as a build checks it, and the file of a
        build without targets written, the header alone (an earlier run's would pass for
        this one's)."""
        _check_report_paths(BuildRequest(patterns=[], events=path), graph, self.ws.root, self._struct_of(loader)[0])
        events = EventsWriter(path, graph)
        events.close()
        if events.lost:  # (a full disk: as a build says it, a CI job must not pass without it)
            raise BuildtoolError(f"nothing to build, but {events.lost}")

    @staticmethod
    def _struct_of(loader: Loader) -> tuple[list[str], list[str], set[str]]:
        """The files, listed directories and env vars the BUILD.py evaluation depended on."""
        files = [*loader.read_files, *loader.probes, *loader.looked_for, *loader.imported_workspace_modules(),
                 *_config_files()]
        return files, sorted(loader.glob_dirs), set(loader.env_reads)

    def _write_snapshot(
        self,
        req: BuildRequest,
        state: str,
        graph: Graph,
        runner: TargetRunner,
        struct: list[str],
        dirs: list[str],
        env_names: set[str],
        seen: noop.Seen,
        relied: noop.Seen,
        keep: noop.Verdict | None = None,
        cone: range | set[int] | None = None,
        listed: dict[str, str | None] | None = None,
        cwd: str | None = None,
        carry: noop.Verdict | None = None,
    ) -> None:
        """Record what this fully successful build depended on, for the no-op fast path:
        ``struct`` (what shapes the graph, tools, discovered headers) and every source and
        output — or, after an incremental build (``keep``), those of the planned ``cone``
        (the snapshot's other signatures stay as the check found them).  ``carry``: the
        verdict of the regraph build that ends here, whose unplanned targets' tools are kept
        as the check found them."""
        from buildtool import keys

        # What shapes the actions too, not only the graph: a change to one is a full build.
        hard = [*runner.tool_paths(), *_config_files()]
        # The headers found by depfiles: a change to one plans its readers (after an
        # incremental build, the cone's lists: the others' are in the snapshot already).
        # One the evaluation read too (a BUILD.py opened it) stays a full build's.
        shaping = set(struct) if keep is None else set(struct).difference(keep.body.get("found", ()))
        found: list[str] = []
        for p in dict.fromkeys(runner.discovered_inputs(cone if keep is not None else None)):
            (found if p not in shaping else hard).append(p)
        files = [*struct, *hard, *found]  # + the tools and the headers found by depfiles
        inside = self.ws.root + os.sep  # (a tool put in these would shadow the one used)
        searched = [d[len(inside):] if d.startswith(inside) else "" if d == self.ws.root else d
                    for d in runner.tool_dirs()]
        hard.extend(searched)
        dirs = list(dict.fromkeys([*dirs, *searched]))
        env_names.update(item.partition("=")[0] for item in [*self.config.action_env, *req.action_env])
        srcs: list[str] = []
        outs: list[str] = []
        targets = graph.targets if cone is None else [graph.targets[i] for i in cone]
        for t in targets:
            srcs.extend(t.srcs)
            outs.extend(t.outs)
        for t in graph.targets:
            env_names.update(t.pass_env)
            if t.fn:
                absent: list[str] = []  # (an import's candidates that do not exist: one made would be run)
                modules = keys.pyrule_module_files(self.ws.root, t.fn, absent)
                files.extend(modules + absent)
                hard.extend(modules + absent)
        request = noop.request_of(req.mode, req.patterns, self.ws.root, self.ws.cwd_pkg_dir, req.action_env)
        noop.write(state, self.ws.root, request, sorted(env_names), files, dirs, srcs, outs, graph, seen, keep,
                   listed, relied, cwd, self.ws.is_ignored, hard, carry, found)

    def _open_record(self, state: str) -> BuildRecord:
        """The build record; reused from the last build of this session if nobody else
        wrote it since (watch mode), else read from disk."""
        path = os.path.join(state, "record")
        memo, self._record_memo = self._record_memo, None
        if memo is not None:
            try:
                st = os.stat(path)
                if (st.st_size, st.st_mtime_ns, st.st_ino) == memo[0]:
                    memo[1].begin_build()
                    return memo[1]
            except OSError:
                pass
        return BuildRecord(path, _warn)

    def record_unchanged(self) -> bool:
        """Whether the build record on disk is the one the last build of this session left
        (watch mode: another buildtool, `clean`, `rm -rf .buildtool` may have changed it
        between cycles, and then what the watcher knows to be clean is not)."""
        memo = self._record_memo
        if memo is None:
            return False
        try:
            st = os.stat(os.path.join(self.ws.state_dir, "record"))
        except OSError:
            return False
        return (st.st_size, st.st_mtime_ns, st.st_ino) == memo[0]

    def _remember_record(self, state: str, record: BuildRecord) -> None:
        try:
            st = os.stat(os.path.join(state, "record"))
        except OSError:
            return
        self._record_memo = ((st.st_size, st.st_mtime_ns, st.st_ino), record)

    def _weights(
        self, graph: Graph, record: BuildRecord, stats: StatCache, wanted: range | set[int],
        predict: TargetRunner | None, cache: Cache | None = None, failed_s: Mapping[str, float] | None = None,
    ) -> list[float]:
        """Per target id: its recorded duration (else, for a test, what its last run took
        when it failed, ``failed_s``; else the one ``cache`` holds for its label, from any
        workspace using it; else the median of those known), ~0 if predicted fresh or a
        group.  Only wanted targets get one: the plan reads no other.
        ``predict`` (the runner, which knows each target's action): None when ``wanted`` is
        the cone of the files the no-op check found changed: each of its targets reads or
        writes one, or depends on one that does, so none is predicted fresh (W6: 10,000
        missing outputs not statted again here).  (Watch mode's focus also holds the
        targets that did not end clean last cycle: predicted.)"""
        fresh = predict_fresh(graph, record, stats, wanted, predict) if predict else [False] * len(graph.targets)
        weights = [0.0] * len(graph.targets)
        unknown = []
        for i in wanted:
            if fresh[i] or graph.targets[i].kind == "group":  # (a group runs nothing: no record entry either)
                weights[i] = FRESH_WEIGHT
                continue
            e = record.get(graph.targets[i].label)
            if e is None or "d" not in e:
                unknown.append(i)
            else:
                weights[i] = max(e["d"], FRESH_WEIGHT)
        if unknown and failed_s:  # (a red test: no record line; a slow one counted as the median started last)
            for i in unknown:
                d = failed_s.get(graph.targets[i].label)
                if d is not None:
                    weights[i] = max(d, FRESH_WEIGHT)
            unknown = [i for i in unknown if graph.targets[i].label not in failed_s]
        if unknown and cache is not None:  # (a fresh checkout, after `clean`: the cache remembers)
            shared = cache.durations(graph.targets[i].label for i in unknown)
            for i in unknown:
                d = shared.get(graph.targets[i].label)
                if d is not None:
                    weights[i] = max(d, FRESH_WEIGHT)
            unknown = [i for i in unknown if graph.targets[i].label not in shared]
        if unknown:  # the whole record's median: parsing every entry is worth it only here
            known = [d for d in record.durations().values() if d > 0]
            default = _median(known) if known else UNKNOWN_DURATION
            for i in unknown:
                weights[i] = max(default, FRESH_WEIGHT)
        return weights

    @staticmethod
    def _dead_outputs(
        graph: Graph, loader: Loader, record: BuildRecord,
    ) -> tuple[list[tuple[str, list[Any]]], list[str]]:
        """The outputs of targets that no longer exist, or no longer declare them: (label,
        record row) each, and the labels whose record entries go with them.  Nothing is
        deleted here (``_clean_dead`` does; the listing taken after the evaluation leaves
        these out, since their going is no change to the workspace).  A package that
        .buildtoolignore leaves out now, or that a nested workspace (a buildtool.toml of its
        own) or a cache directory (CACHEDIR.TAG) now holds, is not buildtool's to clean: its
        targets' entries go, their outputs stay as plain files (said in a note)."""
        live_outputs = {o for t in graph.targets for o in t.outs}
        loaded = set(loader.loaded_packages())
        rows: list[tuple[str, list[Any]]] = []
        gone: list[str] = []
        left: dict[str, list[str]] = {}  # why they are left out -> outputs in such packages, kept
        for lab in list(record.entries):
            pkg, name = labels.split_label(lab)
            tid = graph.by_label.get(lab)
            if tid is not None:
                declared = set(graph.targets[tid].outs)
                rows.extend((lab, o) for o in (record.entries.head(lab) or {}).get("o", [])
                            if o[0] not in declared and o[0] not in live_outputs)
                continue
            if pkg in loaded:
                if name in loader.load(pkg):
                    continue
            elif loader.package_exists(pkg):
                continue
            dead = [(lab, o) for o in (record.entries.head(lab) or {}).get("o", []) if o[0] not in live_outputs]
            why = _left_out(loader, pkg)
            if why:
                left.setdefault(why, []).extend(
                    o[0] for _, o in dead if os.path.lexists(os.path.join(loader.ws.root, o[0])))
            else:
                rows.extend(dead)
            gone.append(lab)
        for why, kept in left.items():
            if kept:
                _say(f"note: kept {len(kept)} output(s) of earlier builds in packages that {why} "
                     f"({', '.join(sorted(kept)[:3])}{', ...' if len(kept) > 3 else ''}); "
                     "they are plain files from now on")
        return rows, gone

    def _going(self, graph: Graph, rows: list[tuple[str, list[Any]]], stats: StatCache) -> list[str]:
        """The dead outputs ``_clean_dead`` will delete (the listing after evaluation leaves
        them out: their going is no change), not those it keeps: a source now, edited, or
        behind a directory that now links elsewhere."""
        if not rows:
            return []
        sources = {s for t in graph.targets for s in t.srcs}
        elsewhere: dict[str, str | None] = {}
        return [o[0] for _, o in rows if o[0] not in sources
                and _changed_since_built(self.ws.root, o[0], o[1], stats, self.identity_trusted) is None
                and _led_elsewhere(self.ws.root, o[0], elsewhere) is None]

    def _clean_dead(
        self, graph: Graph, loader: Loader, record: BuildRecord, stats: StatCache,
        dead: tuple[list[tuple[str, list[Any]]], list[str]],
    ) -> set[str]:
        """Delete ``dead`` (``_dead_outputs``: outputs of targets that no longer exist, as
        ``ninja -t cleandead``), but never a file that is a source now or that is no longer
        what the build wrote.  Returns the dead outputs kept."""
        rows, gone = dead
        sources = {s for t in graph.targets for s in t.srcs} if rows else set()
        kept: set[str] = set()
        elsewhere: dict[str, str | None] = {}
        vanished: list[tuple[str, list[Any], Any]] = []  # (label, row, its stat cache entry)
        for lab, o in rows:
            if os.path.lexists(os.path.join(self.ws.root, o[0])):
                self.removed_dead.add(o[0])  # (before its deletion event can come)
            else:
                vanished.append((lab, o, stats.entries.get(o[0])))
            if not _remove_dead(self.ws.root, lab, o, o[0] in sources, stats, elsewhere, self.identity_trusted):
                kept.add(o[0])
                self.removed_dead.discard(o[0])
        if vanished and sources:
            _warn_moved_outputs(self.ws.root, graph, vanished, sources)
        for lab in gone:
            record.drop(lab)
        for d in sorted(loader.dirs_of_dead_outputs):  # an output now, a directory of outputs before
            for sub, _dirs, _files in os.walk(os.path.join(self.ws.root, d), topdown=False):
                try:
                    os.rmdir(sub)
                except OSError:
                    pass
            if os.path.isdir(os.path.join(self.ws.root, d)):  # a dead output in it was kept (edited since)
                t = next(t for t in graph.targets if d in t.outs)
                msg = f"{t.where}: output {d!r} of {t.label} is an existing directory; outputs are files"
                raise UserError(msg)
        return kept

    # -- clean -----------------------------------------------------------------------
    def _sources_now(self, recorded: Iterable[str]) -> set[str]:
        """Every file the BUILD.py files name in ``srcs`` as they are now and that no target
        declares in ``outs`` (a label's name counts when its package has no such target: a
        file label), for ``clean``: an output of a rule since removed may have become a
        source, the user's.  ``recorded``: the build record's outputs, which glob() leaves
        out as a build does.  BUILD.py files that cannot be evaluated: a warning, and only
        the packages that could are known."""
        from buildtool.loader import Loader

        found: set[str] = set()
        declared: set[str] = set()
        loader = Loader(self.ws, recorded)
        try:
            packages = loader.all_packages()
        except BuildtoolError as e:
            _warn(f"could not list the packages ({e}); an output that became a source is kept only if found")
            return found
        for pkg in packages:
            try:
                decls = loader.load(pkg)
            except BuildtoolError as e:
                # (the error's first line: a syntax error's source and caret lines, in a
                # one-line warning, came out as literal \n escapes)
                first = str(e).partition("\n")[0]
                _warn(f"could not evaluate //{pkg} ({first}); outputs it may read as sources are not known to clean")
                continue
            for decl in decls.values():
                outs = decl.attrs.get("outs", ())
                for o in outs if isinstance(outs, (list, tuple)) else ():
                    if isinstance(o, str) and o:
                        declared.add(os.path.normpath(f"{pkg}/{o}" if pkg else o))
                items = decl.attrs.get("srcs", ())
                for item in items if isinstance(items, (list, tuple)) else ():
                    if not isinstance(item, str) or not item:
                        continue
                    base = pkg
                    if item.startswith(("//", ":")):
                        base, _, item = (item[2:] if item.startswith("//") else f"{pkg}{item}").partition(":")
                        if "/" not in item and _declares(loader, base, item):
                            continue  # a target's label, not a file
                    found.add(os.path.normpath(f"{base}/{item}") if base else os.path.normpath(item))
        return found - declared

    def clean_targets(self, patterns: list[str]) -> tuple[int, int]:
        """Delete the outputs that the targets of ``patterns`` and everything they depend on
        last wrote (``ninja -t clean TARGETS``), with ``clean``'s care: an output edited or
        written again since is kept, said so, as one whose directory now leads elsewhere.
        Only files the build record says their target wrote go, and only while that target
        still declares them (an output a BUILD.py dropped is the next build's to remove, or
        a source now).  The state and the cache stay: the next build restores them (or runs
        their commands when the cache lost them); the no-op snapshots stay too, as they
        hold the outputs' stats.  (Files removed, targets whose outputs
        were looked at.)"""
        state = self.ws.state_dir
        if not os.path.isdir(state) or os.path.islink(state):
            if os.path.lexists(state):
                self.ws.ensure_state_dir()  # says what is in the way (exit 2), a link too
            self.load_graph(patterns)  # (a bad label is exit 2 still; nothing was built)
            return 0, 0
        from buildtool.loader import Loader

        lock = WorkspaceLock(state)
        lock.acquire(True, _say)
        try:
            n = _reap_for_clean(self.ws.root, state)
            record = BuildRecord(os.path.join(state, "record"), _warn)
            try:
                graph = self._graph(Loader(self.ws, record.all_outputs()), patterns, "clean")
                stats = StatCache(self.ws.root, os.path.join(state, "stat-cache"), _warn)
                remover = _OutputRemover(self.ws.root, stats, _identity_trusted(state))
                for t in graph.targets:
                    entry = record.get(t.label)
                    declared = set(t.outs)
                    for o in entry.get("o", ()) if entry is not None else ():
                        if o[0] in declared and remover.remove(o[0], o[1]):
                            n += 1
                            stats.forget(o[0])
                failed = remover.failed
            finally:
                record.close(compact=False)
            if n:  # (a watch in another terminal checks every target after the record changed;
                noop.started(state, "clean")  # a no-op snapshot does too, without a crash's warning)
                try:
                    os.utime(record.path)
                except OSError:
                    pass
                # The stat cache, saved after that stamp, still knows the other outputs as
                # the last build left them: without it, the next build took the stamp for a
                # crash's, and deleted a dead output a checkout had written anew.
                stats.save()
                if stats.path and not _identity_trusted(state):
                    try:
                        os.utime(stats.path)
                    except OSError:
                        pass
            if failed:
                raise BuildtoolError(f"{failed} output(s) could not be removed (see above)")
            return n, len(graph.targets)
        finally:
            lock.release()

    def clean(self) -> int:
        state = self.ws.state_dir
        if not os.path.isdir(state) or os.path.islink(state):
            if os.path.lexists(state):
                self.ws.ensure_state_dir()  # says what is in the way (exit 2), a link too
            return 0
        lock = WorkspaceLock(state)
        lock.acquire(True, _say)
        try:
            n = _reap_for_clean(self.ws.root, state)
            record = BuildRecord(os.path.join(state, "record"), _warn)
            recorded = {o[0]: o for _, e in record.entries.heads() for o in e.get("o", ())}
            stats = StatCache(self.ws.root, os.path.join(state, "stat-cache"), _warn)
            remover = _OutputRemover(self.ws.root, stats, _identity_trusted(state))
            sources: set[str] | None = None

            def a_source_now(p: str) -> bool:  # a removed rule's output that a BUILD.py reads as a source now
                nonlocal sources
                if sources is None:
                    sources = self._sources_now(recorded)
                return p in sources

            for p in sorted(record.all_outputs()):
                o = recorded.get(p)
                if remover.remove(p, o[1] if o is not None else None, a_source_now):
                    n += 1
            failed = remover.failed
            record.close(compact=False)  # (read only; when outputs are kept, so is the snapshot naming this file)
            # The state goes while the lock is held: deleted after, it went from under a
            # build that had been waiting for the lock.  The lock file (which that build
            # holds now) and the .gitignore stay.  The file monitor's answers were about
            # this state: it is ended (SIGTERM, which also reaches one stopped with SIGSTOP
            # once it continues).
            from buildtool import monitor
            pid = monitor.holder(state, self.ws.root)  # (not the original's, in a `cp -al` copy)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
            elif os.path.exists(monitor.socket_path(state)):  # (one that holds no lock: an older buildtool's)
                info = monitor.status(state)
                if info is not None and info.get("root") == self.ws.root:
                    monitor.stop(state)

            if failed:
                msg = (f"{failed} output(s) could not be removed (see above); the build state is kept, "
                       "so a later `buildtool clean` tries them again")
                raise BuildtoolError(msg)
            for name in os.listdir(state):
                if name not in ("lock", ".gitignore"):
                    remove_path(os.path.join(state, name))
            left = sorted(name for name in os.listdir(state) if name not in ("lock", ".gitignore"))
            if left:  # (a read-only or immutable .buildtool: its test passes would still be cached)
                why = _why_not_removed(os.path.join(state, left[0]))
                msg = (f"removed {n} output(s) but not the workspace state: could not remove "
                       f"{os.path.join(os.path.basename(state), left[0])}{why}"
                       f"{f' and {len(left) - 1} more' if len(left) > 1 else ''}; the next build still "
                       "uses its record and cached test results")
                raise BuildtoolError(msg)
        finally:
            lock.release()
        return n


def _reap_for_clean(root: str, state: str) -> int:
    """Before a clean (the lock held): commands a kill -9ed build left running would write
    into outputs after it, and the list of them may go with the state: kill them, and
    delete the outputs they were writing.  The number deleted."""
    cut: list[str] = []
    orphans.reap(state, _warn, cut_short=cut)
    return _remove_cut_short(root, cut)


class _OutputRemover:
    """``clean``'s care for one recorded output: gone only if it is still what the build
    wrote there (else kept, said so), and its directory still the workspace's own."""

    def __init__(self, root: str, stats: StatCache, identity: bool) -> None:
        self.root = root
        self.stats = stats
        self.identity = identity  # (_identity_trusted)
        self.elsewhere: dict[str, str | None] = {}
        self.failed = 0  # outputs that could not be removed (said): the state stays to try again

    def remove(self, p: str, digest: str | None, a_source_now: Callable[[str], bool] | None = None) -> bool:
        """Delete output ``p`` (recorded with ``digest``) if it is there and the build's;
        whether it was deleted."""
        full = os.path.join(self.root, p)
        if not (os.path.isfile(full) or os.path.islink(full)):
            return False
        why = _led_elsewhere(self.root, p, self.elsewhere) or (
            _changed_since_built(self.root, p, digest, self.stats, self.identity) if digest is not None else None)
        if why is None and a_source_now is not None and a_source_now(p):
            why = "an output before, it is a source now"
        if why is not None:
            _warn(f"kept {p}: {why}")
            return False
        try:
            os.unlink(full)
        except OSError as e:  # (a read-only directory, say)
            _warn(f"could not remove {p}: {e.strerror}")
            self.failed += 1
            return False
        _prune_empty_dirs(self.root, os.path.dirname(p))
        return True


def _why_not_removed(path: str) -> str:
    """`` (<strerror>)`` of removing ``path`` once more (a directory: its first entry), or ""."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            with os.scandir(path) as it:
                first = next(iter(it), None)
            if first is None:
                os.rmdir(path)
                return ""
            path = first.path  # (what kept the directory from going)
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError as e:
        return f" ({e.strerror})"
    return ""


def _left_out(loader: Loader, pkg: str) -> str:
    """Why package ``pkg`` (not the root) is no longer this workspace's to build, if it is
    not ("": it is, or it is gone)."""
    if not pkg:
        return ""
    if loader.ws.is_ignored(pkg):
        return ".buildtoolignore now leaves out"
    if loader.in_nested_workspace(pkg):
        return "a nested buildtool.toml now makes a workspace of its own"
    if loader.in_cache_dir(pkg):
        return "a CACHEDIR.TAG now marks a cache directory"
    return ""


class _Committer:
    """Reporter that lets the runner record a result before anyone else sees it."""

    def __init__(self, runner: TargetRunner) -> None:
        self.runner = runner

    def target_started(self, t: int, lane: int) -> None:
        return

    def target_finished(self, t: int, o: Outcome) -> None:
        self.runner.commit(t, o)


def _write_profile(path: str, graph: Graph, outcomes: dict[int, Outcome], phases: Phases,
                   wall: float) -> str | None:
    """Write the --profile file; what went wrong, or None."""
    try:
        write_profile(path, graph, outcomes, phases, wall)
    except OSError as e:
        _warn(f"could not write the profile {path}: {e.strerror}")
        return f"--profile {path} could not be written ({e.strerror})"
    return None


def _remove(root: str, rel: str, stats: StatCache) -> None:
    try:
        os.unlink(os.path.join(root, rel))
    except FileNotFoundError:
        pass
    except OSError as e:  # it stays, and no record remembers it: say so
        _warn(f"could not remove {rel}, an output no target declares any more: {e.strerror}")
    stats.forget(rel)


def _wants_everything(patterns: list[str], cwd_pkg: str) -> bool:
    """Do the patterns take every package (none, ``//...``, ``...`` at the root)?"""
    if not patterns:
        return True
    for text in patterns:
        try:
            p = labels.parse_pattern(text, cwd_pkg)
        except labels.LabelError:
            continue
        if p.kind == "recursive" and p.pkg == "":
            return True
    return False


def _identity_trusted(state: str) -> bool:
    """Does the stat cache know the outputs the build record names as the last build left
    them (saved after the record's last write)?  Not after a crash: the record has lines of
    the killed build, whose outputs the saved stat cache never saw."""
    try:
        saved = os.stat(os.path.join(state, "stat-cache")).st_mtime_ns
        return saved >= os.stat(os.path.join(state, "record")).st_mtime_ns
    except OSError:
        return False


def _changed_since_built(root: str, rel: str, digest: str, stats: StatCache, identity: bool) -> str | None:
    """Why the file ``rel`` is not what the build recorded writing there (so it is the
    user's, kept), or None: other content (the stat cache vouches, else it is hashed), or
    the same content written again since the build left it (another mtime than the stat
    cache saw, when it is to be trusted: ``identity``, ``_identity_trusted``): a `git
    checkout` of a branch where the file is checked in writes it anew (the inode number
    may well be the freed one's), or a `touch`; a copy of the workspace (`cp -a`, tar,
    rsync) keeps the mtime and stays the build's.  A symlink or other non-regular file, or
    a digest of an output left remote: not checked."""
    import stat as stat_mod

    from buildtool.digest import hash_file, is_remote

    full = os.path.join(root, rel)
    try:
        st = os.lstat(full)
        if is_remote(digest) or not stat_mod.S_ISREG(st.st_mode):
            return None
        if (stats.lookup(rel, st) or hash_file(full)) != digest:
            return "its content is not what the build wrote (edited since?)"
    except OSError:
        return None
    e = stats.entries.get(rel) if identity else None
    if e is not None and e[1] != st.st_mtime_ns:
        return "it was written again since the build left it, with the same content (a checkout? a touch?)"
    return None


def _remove_cut_short(root: str, paths: Iterable[str]) -> int:
    """Delete the outputs a killed build's commands were writing when it died (the next
    build's reap killed what still ran): half-written, they are no user's edit to keep.
    Their targets run again (or are restored).  The number deleted."""
    n = 0
    elsewhere: dict[str, str | None] = {}
    for rel in dict.fromkeys(paths):
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or parts[0] == STATE_DIR or _led_elsewhere(root, rel, elsewhere):
            continue  # (a damaged list: nothing outside the workspace's own outputs' places)
        full = os.path.join(root, rel)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                continue
            os.unlink(full)
        except OSError:
            continue
        n += 1
    if n:
        _warn(f"removed {n} output(s) that commands of the killed build were writing when it died")
    return n


def _led_elsewhere(root: str, rel: str, memo: dict[str, str | None]) -> str | None:
    """Why the recorded output ``rel`` is not to be deleted at that path: a directory on its
    way became a symbolic link (since the build wrote it) that leads outside the workspace,
    or into a directory buildtool never writes into; None when the path is still the
    workspace's own.  Memoised per directory."""
    d = posixpath.dirname(rel)
    if d not in memo:
        real_root = os.path.realpath(root)
        real = os.path.realpath(os.path.join(root, d))
        why = None
        if real != real_root and not real.startswith(real_root + os.sep):
            why = f"its directory {d!r} leads outside the workspace (through a symbolic link), to {real!r}"
        elif real != os.path.normpath(os.path.join(real_root, d)):
            first = os.path.relpath(real, real_root).split(os.sep, 1)[0]
            if first in ALWAYS_SKIPPED:
                why = f"its directory {d!r} leads into {first}/ (through a symbolic link)"
        memo[d] = why
    return memo[d]


def _remove_dead(
    root: str, label: str, o: list[Any], is_source: bool, stats: StatCache, elsewhere: dict[str, str | None],
    identity: bool,
) -> bool:
    """Delete ``o`` (a record's [path, digest, ...]), a dead output of ``label``, unless it
    became a source or someone changed it since: those are the user's now, kept (warned);
    as is one whose path now leads elsewhere through a symbolic link (``_led_elsewhere``,
    memoised in ``elsewhere``).  Whether it is gone."""
    rel = o[0]
    full = os.path.join(root, rel)
    if not os.path.lexists(full):
        stats.forget(rel)
        return True
    where = _led_elsewhere(root, rel, elsewhere)
    if where is not None:
        _warn(f"kept {rel}: an output of {label} before, {where}")
    elif is_source:
        _warn(f"kept {rel}: an output of {label} before, it is a source now")
    elif (why := _changed_since_built(root, rel, o[1], stats, identity)) is not None:
        _warn(f"kept {rel}: an output of {label} before, {why}")
    else:
        _remove(root, rel, stats)
        return True
    stats.forget(rel)
    return False


def _median(values: list[float]) -> float:
    """statistics.median, without importing statistics (fractions, decimal, random: ~7 ms)."""
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _warn_moved_outputs(
    root: str, graph: Graph, vanished: list[tuple[str, list[Any], Any]], sources: set[str],
) -> None:
    """Warn, once, of the sources now that are outputs of a target gone, moved: the very
    file (its inode, size and mtime, as the stat cache last saw the output) at another path
    (a package directory moved, an IDE's rename: glob() takes the earlier build's outputs
    for sources, which a fresh checkout does not have).  A checked-in file with the same
    name and content is another file: not named.  Only outputs of targets gone and no
    longer on disk are looked for, by file name first."""
    by_name: dict[str, list[tuple[str, list[Any], Any]]] = {}
    for lab, o, e in vanished:
        if isinstance(e, list) and len(e) >= 3:
            by_name.setdefault(os.path.basename(o[0]), []).append((lab, o, e))
    if not by_name:
        return
    live = {o for t in graph.targets for o in t.outs}
    moved: list[str] = []
    for s in sorted(sources):
        rows = by_name.get(os.path.basename(s))
        if not rows or s in live:
            continue
        try:
            st = os.stat(os.path.join(root, s))
        except OSError:
            continue
        for lab, o, e in rows:
            if (e[0], e[1], e[2]) == (st.st_size, st.st_mtime_ns, st.st_ino):
                moved.append(f"{s} (was {o[0]}, an output of {lab})")
                break
    if moved:
        more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
        what = "1 source is an output" if len(moved) == 1 else f"{len(moved)} sources are outputs"
        _warn(f"{what} an earlier build made at another path, moved there with their directory: "
              f"{', '.join(moved[:3])}{more}; a fresh checkout does not have them: delete them unless they are "
              "sources of yours")


def _warn_unknown_pools(graph: Graph, wanted: Iterable[int], depths: Mapping[str, int]) -> None:
    """One warning per pool a planned target names that no ``[pools]`` configures (it
    limits nothing, as documented; a typo of ``link`` silently ran every link at once,
    where Ninja says "unknown pool name")."""
    unknown: dict[str, list[str]] = {}
    for t in wanted:
        pool = graph.targets[t].pool
        if pool is not None and pool != "console" and pool not in depths:
            unknown.setdefault(pool, []).append(graph.targets[t].label)
    if not unknown:
        return
    import difflib

    for pool, labels_ in sorted(unknown.items()):
        near = difflib.get_close_matches(pool, [*depths, "console"], n=1)
        hint = f"; did you mean {near[0]!r}?" if near else " (buildtool.toml or the user config)"
        who = ", ".join(labels_[:3]) + (f" and {len(labels_) - 3} more" if len(labels_) > 3 else "")
        _warn(f"pool {pool!r} of {who} is not configured in [pools], so it limits nothing{hint}")


def _prune_empty_dirs(root: str, rel_dir: str) -> None:
    """Remove directories left empty by deleting outputs (never the root)."""
    while rel_dir:
        try:
            os.rmdir(os.path.join(root, rel_dir))
        except OSError:
            return
        rel_dir = os.path.dirname(rel_dir)


BURST_S = 0.25  # signals this close together are one (a supervisor's to the group and to the process)


class _Signals:
    """SIGINT, SIGTERM, SIGHUP (a terminal closed, an ssh connection dropped) and SIGQUIT
    (Ctrl-\\: its default would leave the commands running, in sessions of their own) from the
    scheduler's start to the build's end.  While the scheduler runs, one stops it (running
    commands' groups are killed, nothing partial is recorded).  Once it returned, one is
    ``held`` until the reports (--profile, --junit, --events) and the state are written and
    the lock is released, which takes moments: cut short there, a report was half a temp
    file, or the last run's was left in its place, with no word; the build then ends
    interrupted all the same; a second one there leaves at once (a write that blocks).  A
    SIGHUP ignored from the start (``nohup``) stays ignored."""

    __slots__ = ("_held_at", "_prev", "_stop", "_stopping", "held")

    def __init__(self) -> None:
        self._prev: dict[int, Any] = {}
        self._stop: Callable[[int], None] | None = None
        self._stopping = False  # the scheduler was told to stop (once is enough)
        self.held: int | None = None  # the signal that came after the scheduler returned
        self._held_at = 0.0  # when (time.monotonic)

    def install(self, stop: Callable[[int], None]) -> None:
        self._stop = stop
        wanted = [signal.SIGINT, signal.SIGTERM]
        wanted += [s for s in (signal.SIGHUP, signal.SIGQUIT) if signal.getsignal(s) is not signal.SIG_IGN]
        for s in wanted:
            try:
                self._prev[s] = signal.signal(s, self._on_signal)
            except ValueError:  # not the main thread
                pass

    def hold(self) -> None:
        """The scheduler returned: a signal from now on waits for the end of the build."""
        self._stop = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        from buildtool.errors import count_stop_signal

        count_stop_signal(signum)  # (a third quits at once; the next build ends what it left running)
        if self._stop is not None:
            if not self._stopping:  # (again, from inside the first's cancel_all: threads half started)
                self._stopping = True
                self._stop(signum)
        elif self.held is None:
            self.held = signum
            self._held_at = time.monotonic()
        elif time.monotonic() - self._held_at < BURST_S:
            return  # (one burst, one signal: a supervisor's SIGTERM to the group and to the process)
        else:  # a second one while a report is written: that write blocks (a FIFO, a hung mount)
            from buildtool.errors import Terminated

            for s in self._prev:  # (on the way out: a third must not cut the finally blocks)
                signal.signal(s, signal.SIG_IGN)
            self._prev.clear()
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)

    def restore(self) -> None:
        """The handlers from before ``install`` back (the CLI's, or watch mode's)."""
        for s, h in self._prev.items():
            signal.signal(s, h)
        self._prev.clear()


def _stored_descriptions(outcomes: Iterable[Outcome]) -> Iterator[tuple[str, str, str]]:
    """(label, key, description text) of each action that ran and was recorded under its
    key (not always=True, not changed while it ran), or whose result a remote cache gave (it
    is in the local cache now: the label's latest entry there): what the cache's
    descriptions table keeps for a later miss to be compared with (actiondb), in its shared
    form (no env value but PATH's: a token passed through pass_env must not land in a
    shared cache)."""
    from buildtool import keys
    from buildtool.rebuild import shared_description

    for o in outcomes:
        stored = o.status is Status.RAN or (o.status is Status.RESTORED and o.cache == "remote")
        prepared = o.extra.get("record_entry") if stored else None
        if prepared is not None and prepared[0]["k"] == o.key and o.key:
            desc, text = o.extra.get("desc"), prepared[0]["desc"]
            if isinstance(desc, dict) and any(k != "PATH" for k in desc.get("env", ())):
                text = keys.canonical(shared_description(desc))
            yield prepared[0]["l"], o.key, text


def _discovered_order(graph: Graph, record: BuildRecord, wanted: range | set[int]) -> dict[int, list[int]]:
    """The targets whose last run's depfile named an output of another target of the build
    (a generated header missing from ``hdr_deps``): the plan runs each after the target
    that makes it (a full build raced the two), as Make's .d files and Ninja's deps log
    order them; in an incremental or watch build (``wanted`` a set, the cone of what
    changed: grown here) they join the cone (they were left out, and the build said OK over
    an object compiled from the old header).  Returns reader -> makers, none if those edges
    would close a cycle.  A cone's build parses only the record lines that name one of its
    outputs."""
    readers = [t for t in graph.targets if t.depfile is not None]
    if not readers:
        return {}
    raw = record.entries.raw_line
    read: dict[int, list[str]] = {}
    edges: dict[int, dict[int, None]] = {}
    while True:
        made = {o: i for i in wanted for o in graph.targets[i].outs}
        plain = _as_written(made) if isinstance(wanted, set) else None  # (a full build parses all)
        every = plain is None
        grow: set[int] = set()
        for t in readers:
            line = raw(t.label) if t.id not in read else None
            if line is not None and not every and not any(o in line for o in plain or ()):
                continue
            if t.id not in read:
                read[t.id] = record.discovered(t.label) or []
            for p in read[t.id]:
                m = made.get(p)
                if m is not None and m != t.id and m not in t.deps:
                    edges.setdefault(t.id, {})[m] = None
                    if t.id not in wanted:
                        grow.add(t.id)
        if not grow or not isinstance(wanted, set):
            break
        wanted |= _with_dependents(graph, grow)
    out = {r: list(ms) for r, ms in edges.items() if r in wanted}
    if out and len(graph.topo_order(out)) < len(graph.targets):  # (a cycle: never ready, "internal error")
        return {}
    return out


def _as_written(paths: Iterable[str]) -> list[bytes] | None:
    """``paths`` as a build record line holds them, where JSON writes such a path unescaped:
    a cheap test before parsing a line that may name hundreds of headers; None when one of
    them would be escaped (every line is parsed then)."""
    out: list[bytes] = []
    for p in paths:
        if not p.isprintable() or '"' in p or "\\" in p:
            return None
        out.append(p.encode())
    return out


def _readers(graph: Graph, record: BuildRecord, headers: set[str]) -> set[int]:
    """The targets whose last run's depfile named one of ``headers`` (edited since the no-op
    snapshot): they are planned, as a changed source's readers are (Ninja's deps log
    tells it the same).  Only the record lines holding a header's path as written are
    parsed; a path JSON would escape has every line parsed."""
    if not headers:
        return set()
    plain = _as_written(headers)
    out: set[int] = set()
    for t in graph.targets:
        if t.depfile is None:
            continue
        line = record.entries.raw_line(t.label)
        if line is not None and plain is not None and not any(p in line for p in plain):
            continue
        if not headers.isdisjoint(record.discovered(t.label) or ()):
            out.add(t.id)
    return out


def _with_dependents(graph: Graph, seeds: set[int]) -> set[int]:
    out = set(seeds)
    stack = list(seeds)
    while stack:
        for c in graph.dependents[stack.pop()]:
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


FDS_PER_ACTION = 5  # a pidfd, the captures of stdout and stderr, its lane's capture marker, a pipe end while spawning
def _fit_fd_limit(jobs: int, warn: Callable[[str], None]) -> int:
    """The jobs the limit on open files allows, raising its soft value toward the hard one
    when ``-j jobs`` needs more (as Bazel does): under the common 1,024, -j 400 failed
    targets with EMFILE ("Too many open files"), and so did -j 16 under a soft limit of 64
    (checked at every -j, not only above 128).  Where the hard limit is too low as well,
    fewer commands run at once, with a warning (none when that is -j itself)."""
    import resource

    try:  # (what is open now, and room for the cache, the state, the remote connections)
        reserve = len(os.listdir("/proc/self/fd")) + 64
    except OSError:
        reserve = 256
    need = jobs * FDS_PER_ACTION + reserve
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return jobs
    new = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        new = soft
    if new >= need:
        return jobs
    fits = max(1, (new - reserve) // FDS_PER_ACTION)
    if fits < jobs:
        warn(f"-j {jobs} needs about {need} open files and the limit is {new} (ulimit -n): "
             f"running at most {fits} command{'s' if fits != 1 else ''} at once")
    return min(fits, jobs)


def _config_files() -> list[str]:
    """The configuration a build reads: the workspace's (and its ignore file) and the user's."""
    from buildtool.config import user_config_path

    return ["buildtool.toml", ".buildtoolignore", *filter(None, [user_config_path()])]  # (none without a home)


def _check_report_paths(req: BuildRequest, graph: Graph, root: str, struct: Iterable[str]) -> None:
    """Refuse (exit 2) a --events, --profile or --junit file that is a source, an output
    or a BUILD.py of the graph, a file the evaluation read (``struct``: buildtool.toml, an
    imported module), in the state directory, or any other existing file but an earlier
    report of its kind: the report replaced the source (`--junit in.txt`, also of a target
    outside this build's graph), an empty ``buildtool.toml`` or ``__init__.py``, or the
    build record (`--junit .buildtool/record`), or a build restored the output over the
    report.  Paths are compared as they resolve (a link to a source is that source).
    Every report is checked, and the error names the refused ones (ReportPathError): those
    files are left alone when the earlier reports of a refused request are removed."""
    from buildtool.atomic import replaceable

    reports = [(flag, path) for flag, path in (("--junit", req.junit), ("--profile", req.profile),
                                               ("--events", req.events)) if path]
    refused: dict[str, str] = {}

    def refuse(flag: str, path: str, why: str) -> None:
        refused.setdefault(flag, f"{flag} {path}: {why}; name another file")

    inside: dict[str, tuple[str, str]] = {}
    for flag, path in reports:
        rel = os.path.relpath(os.path.realpath(path), root)
        if not rel.startswith(".."):
            inside[rel] = (flag, path)
    for rel, (flag, path) in inside.items():
        if rel == BUILDFILE or rel.endswith("/" + BUILDFILE):
            refuse(flag, path, "that is a BUILD.py")
        if rel == STATE_DIR or rel.startswith(STATE_DIR + "/"):
            refuse(flag, path, f"that is in the workspace's state directory {STATE_DIR}/")
    real = {os.path.realpath(path): (flag, path) for flag, path in reports}
    for f in struct if reports else ():
        hit = real.get(os.path.realpath(f)) if os.path.isabs(f) else inside.get(f)
        if hit is not None:
            refuse(*hit, f"that is {f}, which loading the BUILD.py files reads")
    # A report below an output (x/ev for an output x not built yet) or holding one (d for
    # an output d/x): its directory or file took the output's place, and the reverse.
    above = {os.path.dirname(rel) for rel in inside}
    while "" in above:
        above.remove("")
    for rel in list(above):
        while rel := os.path.dirname(rel):
            above.add(rel)
    below = tuple(rel + "/" for rel in inside)  # (one startswith per output: 100,000 targets)
    for t in graph.targets if inside else ():  # (no report in the workspace: no pass over 100,000 targets)
        for f in (*t.srcs, *t.outs):
            hit = inside.get(f)
            if hit is not None:
                refuse(*hit, f"that is {'a source' if f in t.srcs else 'an output'} of {t.label}")
        for o in t.outs:
            if o in above:
                for r, (flag, path) in inside.items():
                    if r.startswith(o + "/"):
                        refuse(flag, path, f"that is below {o}, an output of {t.label}")
            if o.startswith(below):
                for r, (flag, path) in inside.items():
                    if o.startswith(r + "/"):
                        refuse(flag, path, f"{o}, an output of {t.label}, is below that path")
    for flag, path in reports:
        if flag not in refused and not replaceable(path, flag):
            refused[flag] = (f"{flag} {path}: that file holds something else than a report of its kind "
                             "(an earlier run's); name another file, or remove it first")
    if refused:
        raise ReportPathError("; ".join(refused[flag] for flag, _ in reports if flag in refused), frozenset(refused))


def _add_stale_producers(graph: Graph, wanted: set[int], record: BuildRecord, stats: StatCache) -> None:
    """Add to ``wanted`` the dependencies outside it whose outputs are gone from disk or no
    longer what the build record says (deleted, or edited by hand, while watch waited): a
    planned target would read them, and its key would hold the recorded digests, so the
    cache would keep a result made from the edited file under the key of the real one.
    Planned, such a producer is restored from the cache (or run) before its dependents."""
    stale: dict[int, bool] = {}  # target -> an output of it (a group: of a member) is not as recorded

    def differs(t: int) -> bool:
        todo = [t]
        while todo:  # (post-order without recursion: 500 nested groups were a RecursionError)
            x = todo[-1]
            if x in stale:
                todo.pop()
                continue
            target = graph.targets[x]
            if target.kind != "group":
                stale[x] = _outputs_differ(target.outs, record.get(target.label), stats)
                todo.pop()
                continue
            waiting = [m for m in target.deps if m not in stale]
            if waiting:
                todo.extend(waiting)
                continue
            todo.pop()
            stale[x] = any(stale[m] for m in target.deps)
        return stale[t]

    stack = list(wanted)
    while stack:
        for d in graph.targets[stack.pop()].deps:
            if d not in wanted and differs(d):  # (a group added brings the members it stands for)
                wanted.add(d)
                stack.append(d)


def _outputs_differ(outs: Sequence[str], entry: dict[str, Any] | None, stats: StatCache) -> bool:
    """Is any of ``outs`` missing, or of another digest or executable bit than its record
    ``entry`` holds (by stat data, hashing only a file whose stat changed)?"""
    recorded = {o[0]: o for o in entry["o"]} if entry else {}
    for rel in outs:
        o = recorded.get(rel)
        try:
            if o is None or stats.digest(rel) != o[1]:
                return True
            if len(o) > 2 and bool(os.stat(os.path.join(stats.root, rel)).st_mode & 0o100) != bool(o[2] & 0o100):
                return True  # (chmod -x of a built tool: the build adopts it again, which sets the bit)
        except OSError:  # gone (or not a file to hash)
            return True
    return False


def predict_fresh(
    graph: Graph, record: BuildRecord, stats: StatCache, wanted: range | set[int], runner: TargetRunner
) -> list[bool]:
    """A cheap guess, for critical-path weights only: recorded with the same command,
    environment and input paths, sources (and the files its depfile named) unchanged by
    stat, every dependency predicted fresh (targets outside ``wanted`` count as fresh), and
    not a target that runs whatever the record says (``always``, a test under
    --no-cache-tests, a test whose last run failed); a pyrule's modules unchanged, a
    test's timeout the same.  (A tool's binary is not looked at: that would hash it.)"""
    fresh = [True] * len(graph.targets)
    root = stats.root
    digest_of: dict[str, str | None] = {}  # path -> its digest as the stat cache vouches (a header many read)
    for i in graph.topo_order():
        if i not in wanted:
            continue
        fresh[i] = False
        t = graph.targets[i]
        if t.kind == "group":
            fresh[i] = all(fresh[d] for d in t.deps)
            continue
        e = record.get(t.label)
        if e is None or not all(fresh[d] for d in t.deps) or runner.reruns_anyway(t):
            continue
        if not all(os.path.exists(os.path.join(root, o)) for o in t.outs):
            continue  # a missing output may have to be rebuilt: keep its real weight
        desc = desc_of(e) or {}
        if not runner.same_action(t, desc):
            continue  # its command or environment changed: it runs, with its recorded duration
        inputs = desc.get("inputs", {})
        extra = desc.get("extra", {})
        found = desc.get("discovered") if t.depfile is not None else None  # (headers: an edit reruns it too)
        modules = [k[7:] for k in extra if k.startswith("module:")]  # a pyrule's (an edit reruns it)
        ok = True
        for p in (*t.srcs, *(found if isinstance(found, list) else ()), *modules):
            if p not in digest_of:
                try:  # (a chmod moves the ctime: the stat cache then vouches for nothing)
                    digest_of[p] = stats.lookup(p, os.stat(os.path.join(root, p)))
                except OSError:
                    digest_of[p] = None
            want = extra.get("module:" + p) if p in modules else inputs.get(p)
            if digest_of[p] is None or digest_of[p] != want:
                ok = False
                break
        fresh[i] = ok
    return fresh


def _no_reports_of_a_dry_run(req: BuildRequest) -> None:
    """A dry run runs nothing: it writes no JUnit file or profile (``--events`` has its
    would-run events).  Say so, and remove such a report an earlier run left there, which
    would pass for this run's."""
    from buildtool.atomic import remove_stale_report

    for flag, path in (("--junit", req.junit), ("--profile", req.profile)):
        if path:
            gone = remove_stale_report(path, flag)
            _warn(f"{flag} {path}: a dry run runs nothing and writes no such report"
                  + ("; removed the one an earlier run left there" if gone else ""))


def dry_run(
    graph: Graph, runner: TargetRunner, record: BuildRecord, later: dict[int, list[int]] | None = None,
) -> dict[int, Outcome]:
    """What a build would do, without running anything.  ``later``: the plan's edges from
    depfiles (reader -> makers, _discovered_order): a maker that would run makes its
    reader run too, as the build would."""
    out: dict[int, Outcome] = {}
    would: dict[int, str] = {}  # target that would run, or a group holding one -> that runnable's label
    from buildtool import rebuild

    later = later or {}
    for i in graph.topo_order(later):
        t = graph.targets[i]
        if t.kind == "group" or (t.kind == "test" and not runner.opt.run_tests):
            out[i] = runner.try_inline(i) if t.kind == "test" else Outcome(Status.UP_TO_DATE, Reason.GROUP, "group")
            member = next((would[d] for d in t.deps if d in would), None)
            if member is not None:  # (a group runs nothing: its member is the reason)
                would[i] = member
            continue
        blocking = [would[d] for d in (*t.deps, *later.get(i, ())) if d in would]
        if blocking:
            would[i] = t.label
            own = _own_changes(t, record, runner)  # (its key waits for the dependency; its sources do not)
            out[i] = Outcome(Status.SKIPPED, Reason.DRY_RUN,
                             f"would run: dependency {blocking[0]} would run" + "".join(f"; {c}" for c in own))
            continue
        try:
            inputs = runner._input_digests(t, None)
        except OSError as e:
            would[i] = t.label
            out[i] = Outcome(Status.SKIPPED, Reason.DRY_RUN, f"would fail: cannot read {e.filename}")
            continue
        key, desc = runner.describe(t, inputs)
        entry = record.get(t.label)
        key, desc = runner.final_key(t, key, desc, entry)
        ok, _, _ = rebuild.up_to_date(entry, key, runner._disk_digest, runner.disk_modes.get)
        never_fresh = runner._never_fresh(t)  # always=True, a test under --no-cache-tests: runs, as the build would
        if ok and entry is not None and not never_fresh and not runner._failed_before(t, key):
            out[i] = Outcome(Status.UP_TO_DATE, Reason.UP_TO_DATE, "up to date", key=key)
            for p, d, *m in entry["o"]:
                runner.publish_output(p, d, m[0] if m else None)
            continue
        o = runner._dry_run(t, key, desc, entry)
        hit = runner.dry_hit(t, key, desc)
        if hit is not None:
            for c in hit.outputs:
                runner.publish_output(c.path, c.digest, c.mode)
        else:
            would[i] = t.label
        out[i] = o
    return out


def _declares(loader: Loader, pkg: str, name: str) -> bool:
    """Does package ``pkg`` declare a target ``name`` (False where it cannot be loaded)?"""
    try:
        return loader.package_exists(pkg) and name in loader.load(pkg)
    except BuildtoolError:
        return False


def _own_changes(t: Target, record: BuildRecord, runner: TargetRunner, limit: int = 3) -> list[str]:
    """Up to ``limit`` of ``t``'s own sources whose content differs from its last run's:
    said beside "dependency X would run", which alone hid an edit of the target's own."""
    old = desc_of(record.get(t.label))
    recorded = old.get("inputs") if isinstance(old, dict) else None
    if not isinstance(recorded, dict):
        return []
    found = []
    for p in t.srcs:
        if p in recorded and runner._disk_digest(p) != recorded[p]:
            found.append(f"input {p} changed")
            if len(found) == limit:
                break
    return found


def _test_session(root: str, state: str, graph: Graph, req: BuildRequest) -> Any:
    """``buildtool test``'s additions: flaky reruns, test logs, results, JUnit (testing.py)."""
    from buildtool.testing import TestSession

    return TestSession(root, state, graph, _warn, test_output=req.test_output, junit=req.junit)
