"""Testing: test results (PASSED, cached, FAILED, TIMEOUT, FLAKY), flaky reruns and test logs.

``buildtool test`` wraps the target runner in a :class:`TestRunner`, which reruns a failing
``flaky=N`` test up to N times (in the worker thread that ran it) and keeps each test's
output in ``.buildtool/testlogs/<pkg>/<name>.log`` (``other_log_rel_path`` when another
test's log is in the way; run here, its stdout and stderr are one stream, merged by the
runner): the latest run, or for a cached result the log of
the run that passed (replayed from the cache's blobs when the log on disk is not that
run's).  :meth:`TestRunner.finish` prints the per-test results, the output asked for by
``--test-output``, flakiness warnings, and writes ``--junit``.
Spec: docs/user-guide.md#tests and docs/formats.md#test-logs--buildtooltestlogs-and-buildtooltestlogs-index
"""

from __future__ import annotations

import enum
import functools
import json
import os
import threading

from buildtool.atomic import make_dirs, write_atomic
from buildtool.console import escape_controls
from buildtool.graph import Graph, Target
from buildtool.outcome import Outcome, Reason, Status
from buildtool.workspace import open_regular, remove_if_not_a_file

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any

LOG_DIR = "testlogs"
INDEX_FILE = "testlogs-index"
INDEX_VERSION = 1
TEST_OUTPUT_MODES = ("errors", "all", "none")


class TestResult(enum.Enum):
    """The result of one test target; ``value`` is the ``test`` field of ``--events``."""

    __test__ = False  # not a pytest class

    PASSED = "passed"
    CACHED = "cached"
    FAILED = "failed"
    TIMEOUT = "timeout"
    FLAKY = "flaky"

    @property
    def word(self) -> str:
        return {
            TestResult.PASSED: "PASSED",
            TestResult.CACHED: "PASSED (cached)",
            TestResult.FAILED: "FAILED",
            TestResult.TIMEOUT: "TIMEOUT",
            TestResult.FLAKY: "FLAKY",
        }[self]


def test_result(target: Target, o: Outcome) -> TestResult | None:
    """What a test target's outcome means as a test; None for a non-test or a test that
    did not run (a dependency failed, the build stopped or was interrupted, ``build``
    reached it through a dependency)."""
    if target.kind != "test":
        return None
    if o.status is Status.FAILED:
        return TestResult.TIMEOUT if o.extra.get("timed_out") else TestResult.FAILED
    if o.reason is Reason.TEST_NOT_RUN:  # `build` reached it through a dependency
        return None
    if o.status in (Status.UP_TO_DATE, Status.RESTORED) or o.extra.get("remote_cached"):
        return TestResult.CACHED  # (the last: a pass the remote executor's action cache held, as Bazel says)
    if o.status is Status.RAN:
        return TestResult.FLAKY if int(o.extra.get("attempts", 1)) > 1 else TestResult.PASSED  # type: ignore[call-overload]
    return None


test_result.__test__ = False  # type: ignore[attr-defined]


def log_rel_path(target: Target) -> str:
    """The log of a test, relative to the state dir: ``testlogs/<pkg>/<name>.log`` (a ``#``
    in a package directory's name doubled: ``other_log_rel_path``'s directories end in one)."""
    name = target.label.rsplit(":", 1)[1]
    return os.path.join(LOG_DIR, *_log_dirs(target.pkg), f"{name}.log")


def _log_dirs(pkg: str) -> list[str]:
    return [part.replace("#", "##") for part in pkg.split("/")] if pkg else []


def other_log_rel_path(target: Target) -> str:
    """Where a test's log goes when another test's log stands in the way of
    ``log_rel_path`` (the log ``a/b.log`` of //a:b and the directory ``a/b.log/`` of the
    package //a/b.log): ``testlogs/<each package directory>#/<name>.log``, or
    ``testlogs/#/<name>.log`` for the root package.  No target's name has a ``#``, and a
    package directory's ``#`` is doubled in both paths (a package ``a#`` keeps its logs in
    ``a##/``), so these directories, ending in an odd run of ``#``, are no other test's log
    nor package's."""
    name = target.label.rsplit(":", 1)[1]
    dirs = [f"{part}#" for part in _log_dirs(target.pkg)] if target.pkg else ["#"]
    return os.path.join(LOG_DIR, *dirs, f"{name}.log")


def _relative(path: str, root: str) -> str:
    """``path`` from ``root``: a log in the workspace's state dir by cutting the prefix
    (os.path.relpath, ~40 us a call, was a tenth of a no-op `test` of 10,000 tests)."""
    inside = root.rstrip(os.sep) + os.sep
    return path[len(inside):] if path.startswith(inside) and "/../" not in path else os.path.relpath(path, root)


def _attempt_path(path: str, attempt: int) -> str:
    return f"{path[: -len('.log')]}#attempt-{attempt}.log" if attempt else path


def _write_atomic(path: str, data: bytes, state_dir: str) -> None:
    make_dirs(os.path.dirname(path))  # (a test 1,000 packages down: os.makedirs recurses)
    write_atomic(path, data, tmp_dir=os.path.join(state_dir, "tmp"))  # (a kill -9 leaves no temp log)


class TestLogs:
    """The test logs of one workspace and the index saying which passing run each holds.

    The index (``.buildtool/testlogs-index``) maps a label to the action key of the passing
    run whose output its log holds, so a cached result keeps its log without reading the
    cache, and a log overwritten by a later failing run is replayed from the cache."""

    __test__ = False

    def __init__(self, state_dir: str, warn: Callable[[str], None]) -> None:
        self.state_dir = state_dir
        self.warn = warn
        self._lock = threading.Lock()
        # label -> the action key of its last run when that run failed: the cache's earlier
        # pass under the same key is not served again (a red test stays red until it passes).
        self.failed: dict[str, str] = {}
        # label -> seconds its last run took when that run failed (one attempt's): no record
        # line holds it, and a red 3 s test counted as the median started last (plan, weights).
        self.failed_s: dict[str, float] = {}
        self._index: dict[str, str] = self._load_index()
        self._dirty = False
        # label -> the output of its latest run in this build when its log could not be
        # written (the report shows that run's, not whatever file is there); a written log
        # is read back when the report needs it, not held (40 tests' 10 MB logs: 400 MB).
        self._output: dict[str, bytes] = {}
        self._moved: dict[str, str] = {}  # label -> its log's path when another log took log_rel_path's
        self.unwritten: dict[str, str] = {}  # label -> why its latest log could not be written
        # A package's log directory -> test name -> its attempt logs there, listed once a build:
        # a listing for each test that ran (its earlier attempts' logs removed) made a package
        # of 20,000 tests quadratic (220 s).
        self._attempt_logs: dict[str, dict[str, set[str]]] = {}
        # label -> the output of each failed attempt of a flaky test in this build (for the
        # console and JUnit's <flakyFailure>; only flaky tests' failures are held)
        self.attempts: dict[str, list[bytes]] = {}
        self._repaired = False  # _repair_dir done (at the first log written: never by test -n or plan)

    def _repair_dir(self) -> None:
        """``testlogs/`` that is no directory (a file, a named pipe, a link: damaged or planted
        state) is removed, so that logs are written again (every test warned, each build,
        naming another error), and never into where a link led."""
        import stat

        path = os.path.join(self.state_dir, LOG_DIR)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return
        if not stat.S_ISDIR(mode):
            from buildtool.atomic import remove_path
            from buildtool.workspace import file_kind

            remove_path(path)
            self.warn(f"{path} was {'a file' if stat.S_ISREG(mode) else file_kind(mode)}, not a directory; "
                      "removed it (test logs are written there)")

    @property
    def index_path(self) -> str:
        return os.path.join(self.state_dir, INDEX_FILE)

    def _load_index(self) -> dict[str, str]:
        try:
            with open_regular(self.index_path, "r", encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            self.warn("the test log index is unreadable; discarding it")
            remove_if_not_a_file(self.index_path)  # (a directory there: it could never be written)
            return {}
        if not isinstance(data, dict) or data.get("v") != INDEX_VERSION:
            self.warn("the test log index has an unknown format version; discarding it")
            return {}
        logs = data.get("logs")
        if not isinstance(logs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in logs.items()):
            self.warn("the test log index is damaged (its logs are not a map of labels to keys); discarding it")
            return {}
        failed = data.get("failed", {})
        if isinstance(failed, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in failed.items()):
            self.failed = failed
        took = data.get("failed_s", {})
        if isinstance(took, dict):  # (a value of another type: that one left out)
            self.failed_s = {k: float(v) for k, v in took.items() if isinstance(k, str) and
                             isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e9}
        return logs

    def path(self, target: Target) -> str:
        """The test's log: at ``log_rel_path``, or ``other_log_rel_path`` when it had to go there."""
        moved = self._moved.get(target.label)
        return moved if moved is not None else os.path.join(self.state_dir, log_rel_path(target))

    def holds(self, target: Target, key: str) -> bool:
        """Does the log on disk hold the passing run of ``key``?"""
        with self._lock:
            known = self._index.get(target.label)
        if not key or known != key:
            return False
        if os.path.isfile(self.path(target)):
            return True
        other = os.path.join(self.state_dir, other_log_rel_path(target))
        if os.path.isfile(other):  # (written there by an earlier build)
            self._moved[target.label] = other
            return True
        return False

    def output(self, target: Target) -> bytes | None:
        """The output of the test's latest run: the one this build had, else (a cached pass
        whose log on disk holds it) its log."""
        with self._lock:
            held = self._output.get(target.label)
        return held if held is not None else self.read(target)

    def write(self, target: Target, stdout: bytes, stderr: bytes, passed_key: str | None, attempt: int = 0) -> None:
        """Write a run's log (stdout, then stderr: empty for a test run here, merged into
        stdout).  ``attempt`` > 0 names an earlier failed
        attempt of a flaky test (``<name>#attempt-<n>.log``); ``passed_key`` is the key of a
        passing run (None for a failure).  A log that cannot be written is warned about,
        each one (and its test's summary line says so)."""
        data = stdout + stderr
        label = target.label
        if attempt:
            with self._lock:
                self.attempts.setdefault(label, []).append(data)
        where = _attempt_path(os.path.join(self.state_dir, log_rel_path(target)), attempt)
        if not self._repaired:
            with self._lock:  # (tests end on several threads: one repair, before any log is written)
                if not self._repaired:
                    self._repair_dir()
                    self._repaired = True
        try:
            _write_atomic(where, data, self.state_dir)
        except (IsADirectoryError, NotADirectoryError, FileExistsError) as e:  # another test's log is in the way
            other = _attempt_path(os.path.join(self.state_dir, other_log_rel_path(target)), attempt)
            try:
                _write_atomic(other, data, self.state_dir)
            except OSError as e2:
                self._not_written(target, attempt, f"{where} ({e.strerror}), nor at {other}", e2.strerror, data)
                return
            where = other
        except OSError as e:
            self._not_written(target, attempt, where, e.strerror, data)
            return
        if attempt:
            d, n = os.path.split(where)
            with self._lock:
                listed = self._attempt_logs.get(d)
                if listed is not None:
                    listed.setdefault(n.partition("#attempt-")[0], set()).add(n)
            return
        with self._lock:
            self._output.pop(label, None)
            self.unwritten.pop(label, None)
            if where != os.path.join(self.state_dir, log_rel_path(target)):
                self._moved[label] = where
            else:
                self._moved.pop(label, None)
            if passed_key:
                self._index[label] = passed_key
            else:
                self._index.pop(label, None)
            self._dirty = True

    def _not_written(self, target: Target, attempt: int, path: str, why: str | None, data: bytes) -> None:
        self.warn(f"could not write the test log {path} ({why})")
        if not attempt:
            with self._lock:
                self.unwritten[target.label] = str(why)
                self._output[target.label] = data

    def ran(self, target: Target, key: str, passed: bool, seconds: float | None = None) -> None:
        """A test ran to a verdict with ``key``: remember a failure (and ``seconds``, what
        the run took), forget it on a pass (the build record holds a pass's duration)."""
        with self._lock:
            if passed:
                self._dirty = self.failed.pop(target.label, None) is not None or self._dirty
                self._dirty = self.failed_s.pop(target.label, None) is not None or self._dirty
                return
            if key and self.failed.get(target.label) != key:
                self.failed[target.label] = key
                self._dirty = True
            if seconds is not None and self.failed_s.get(target.label) != round(seconds, 4):
                self.failed_s[target.label] = round(seconds, 4)
                self._dirty = True

    def remove_attempts(self, target: Target) -> None:
        """Delete the logs of earlier attempts left by a previous run of a flaky test."""
        with self._lock:
            self.attempts.pop(target.label, None)
        for rel in (log_rel_path(target), other_log_rel_path(target)):
            d, name = os.path.split(os.path.join(self.state_dir, rel)[: -len(".log")])
            with self._lock:
                tests = self._attempt_logs.get(d)
                if tests is None:
                    try:
                        listed = os.listdir(d)
                    except OSError:
                        listed = []
                    tests = self._attempt_logs[d] = {}
                    for n in listed:
                        if "#attempt-" in n and n.endswith(".log"):
                            tests.setdefault(n.partition("#attempt-")[0], set()).add(n)
                doomed = tests.pop(name, ())
            for n in doomed:
                try:
                    os.unlink(os.path.join(d, n))
                except OSError:
                    pass

    def read(self, target: Target) -> bytes | None:
        try:
            with open_regular(self.path(target)) as f:
                return f.read()
        except OSError:
            return None

    def save(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            body: dict[str, object] = {"v": INDEX_VERSION, "logs": self._index}
            if self.failed:
                body["failed"] = self.failed
            if self.failed_s:
                body["failed_s"] = self.failed_s
            data = json.dumps(body, sort_keys=True, separators=(",", ":"))
            self._dirty = False
        try:
            _write_atomic(self.index_path, data.encode(), self.state_dir)
        except OSError as e:
            self.warn(f"could not write the test log index ({e.strerror})")


class TestRunner:
    """Wraps a ``TargetRunner`` for ``buildtool test``: flaky reruns and test logs.

    Implements the scheduler's Runner protocol by delegation; non-test targets pass through."""

    __test__ = False

    def __init__(self, inner: Any, graph: Graph, logs: TestLogs) -> None:
        self.inner = inner
        self.graph = graph
        self.logs = logs
        self._stopping = False  # the build starts no new work: no flaky test's next attempt

    def label_of(self, t: int) -> str:
        return self.inner.label_of(t)

    def deps_of(self, t: int) -> tuple[int, ...]:
        return self.inner.deps_of(t)

    def cancel_all(self) -> None:
        self.inner.cancel_all()

    def interrupted(self) -> None:
        self.inner.interrupted()

    def warn(self, message: str) -> None:  # (the scheduler's: a cache store that failed is said, under test too)
        self.inner.warn(message)

    # No set_lane_hook: a flaky test runs again on the lane it holds, so its lane is only
    # free when its outcome is (scheduler.Runner).

    def try_inline(self, tid: int, waiting: bool = False) -> Outcome | None:
        return self._with_cached_log(tid, self.inner.try_inline(tid, waiting))

    def settle(self, tid: int) -> Outcome | None:
        return self._with_cached_log(tid, self.inner.settle(tid))

    def _with_cached_log(self, tid: int, o: Outcome | None) -> Outcome | None:
        """``o``, a test's cached pass settled without its command having its log kept."""
        t = self.graph.targets[tid]
        if o is not None and t.kind == "test" and o.ok:
            self._keep_cached_log(t, o)
        return o

    def run(self, tid: int, lane: int) -> Outcome:
        t = self.graph.targets[tid]
        o = self.inner.run(tid, lane)
        if t.kind != "test":
            return o
        if o.status is not Status.RAN and o.ok:
            self._keep_cached_log(t, o)
            return o
        self.logs.remove_attempts(t)
        failures: list[str] = []
        total = o.duration
        failed_key = None  # the key an attempt failed with
        why = (o.extra.get("why_reason"), o.extra.get("why"))  # why it ran (a rerun's is "failed before")
        while o.status is Status.FAILED and len(failures) < t.flaky and not self._stopping \
                and self._reran_makes_sense(o):
            failures.append(o.message)
            self.logs.write(t, o.stdout, o.stderr, None, attempt=len(failures))
            # A failure with this key: the rerun is a run, never a pass some other build
            # stored for the key meanwhile (the runner skips the caches for it).
            self.logs.ran(t, o.key, False)
            failed_key = o.key
            o = self.inner.run(tid, lane)
            total += o.duration
        if failures:
            o.extra["attempts"] = len(failures) + 1
            o.extra["failed_attempts"] = failures
            o.extra["attempt_s"] = o.duration  # (the last attempt's: what its next run is expected to take)
            o.duration = total
            if o.status is Status.RAN:
                if isinstance(why[0], Reason) and isinstance(why[1], str):
                    o.reason, o.message = why
                o.message = f"{o.message}; flaky: passed on attempt {len(failures) + 1}"
            elif o.status is Status.FAILED:  # (the last attempt's failure, and that it was not the only one)
                o.message = f"{o.message}; failed all {len(failures) + 1} attempts (flaky={t.flaky})"
        if o.status is Status.FAILED and len(failures) < t.flaky and self._stopping and self._reran_makes_sense(o):
            # (flaky=N in the BUILD.py, one attempt in the report: say why there were not more)
            o.message = f"{o.message}; not retried (flaky={t.flaky}): the build stopped after a failure"
        if o.status in (Status.RAN, Status.FAILED):
            self.logs.write(t, o.stdout, o.stderr, o.key if o.ok else None)
        if o.status is Status.FAILED:  # (FAILED, also one that could not start: other tests go on)
            o.extra["test_verdict"] = True
        if o.status is Status.RAN or (o.status is Status.FAILED and self._reran_makes_sense(o)):
            self.logs.ran(t, o.key, o.ok, o.extra.get("attempt_s", o.duration))
            if not o.ok:  # the record's earlier pass must not make the next run a no-op,
                self._forget_pass(t, o, o.key)
        elif failed_key and o.status is not Status.RAN:  # (a failed attempt, its retry interrupted)
            self._forget_pass(t, o, failed_key)
        return o

    def _forget_pass(self, t: Target, o: Outcome, key: str) -> None:
        """A test failed with ``key``: its record's earlier pass must not make the next run a
        no-op, nor the cache's answer a fresh checkout sharing it."""
        o.extra.setdefault("forget", []).append(t.label)
        cache = getattr(self.inner, "cache", None)
        if cache is not None and key:
            cache.forget_action(key)

    def build_stopping(self) -> None:
        """The scheduler starts no new work (a failure, without -k): no further attempts."""
        self._stopping = True

    def _reran_makes_sense(self, o: Outcome) -> bool:
        """Rerun only a test that ran and failed (not one whose inputs could not be read),
        and never once the build is being cancelled."""
        executor = getattr(self.inner, "executor", None)
        if executor is not None and getattr(executor, "cancelled", False):
            return False
        return o.exit_code is not None or bool(o.extra.get("timed_out"))

    def _keep_cached_log(self, t: Target, o: Outcome) -> None:
        """A cached pass: keep its log, or replay it from the outcome or the cache's blobs."""
        if self.logs.holds(t, o.key):
            return
        out: bytes | None = o.stdout
        err: bytes | None = o.stderr
        if not (out or err):
            cache = getattr(self.inner, "cache", None)
            hit = cache.get_action(o.key) if cache is not None and o.key else None
            if hit is not None:
                out, err = cache.stream(hit, hit.stdout), cache.stream(hit, hit.stderr)
            if hit is None or out is None or err is None:  # (gone, or a log blob missing or damaged)
                note = (
                    f"buildtool: {t.label} passed before with this key, but its output is no longer in the "
                    "cache; run `buildtool test --no-cache-tests` to see it again\n"
                )
                self.logs.write(t, b"", note.encode(), None)
                return
        self.logs.write(t, out, err, o.key)


def _wall_span(graph: Graph, outcomes: dict[int, Outcome]) -> float:
    """From the first test's start to the last one's end, in seconds: the tests that ran
    here (not cached passes)."""
    ran = [o for t in graph.targets if t.kind == "test" and (o := outcomes.get(t.id)) is not None
           and (test_result(t, o) not in (None, TestResult.CACHED) or cut_short(o))]
    return max(o.end for o in ran) - min(o.start for o in ran) if ran else 0.0


def cut_short(o: Outcome) -> bool:
    """Interrupted while it ran (Ctrl-C, a CI job's timeout): its log holds the output so far."""
    return o.status is Status.CANCELLED and o.reason is Reason.INTERRUPTED and o.lane >= 0


class TestCase:
    """One test target's result, as the JUnit writer and the summary see it."""

    __test__ = False
    __slots__ = ("_log", "attempt_logs", "build_failed", "failures", "interrupted", "label", "log_lost", "log_path",
                 "message", "pkg", "result", "time")

    def __init__(
        self,
        label: str,
        pkg: str,
        result: TestResult | None,  # None: not run
        time: float,  # seconds spent in this build (0 for a cached result)
        message: str,
        log: bytes | Callable[[], bytes | None],  # its output, or what reads it (None: none)
        log_path: str,  # relative to the workspace root; "": none (console pool: output on the terminal)
        failures: list[str] | None = None,  # earlier failed attempts (flaky); None: []
        log_lost: str | None = None,  # why its log file could not be written (log_path does not hold ``log``)
        build_failed: bool = False,  # not run because something it needs failed to build
        interrupted: bool = False,  # no result: the build was interrupted while it ran (``log``: its output so far)
        attempt_logs: list[bytes] | None = None,  # a flaky test's failed attempts' output, as ``failures``
    ) -> None:
        self.label = label
        self.pkg = pkg
        self.result = result
        self.time = time
        self.message = message
        self._log = log
        self.log_path = log_path
        self.failures = [] if failures is None else failures
        self.log_lost = log_lost
        self.build_failed = build_failed
        self.interrupted = interrupted
        self.attempt_logs = [] if attempt_logs is None else attempt_logs

    @property
    def log(self) -> bytes:
        """The test's output (read anew each time: a report reads it once a test)."""
        return (self._log() or b"") if callable(self._log) else self._log


class OutputFilter:
    """Sits in front of the console: with ``--test-output=none`` a failing test's output
    is not printed (it stays in its log; a console-pool test's went to the terminal)."""

    def __init__(self, console: Any, graph: Graph, logs: TestLogs, root: str) -> None:
        self.console = console
        self.graph = graph
        self.logs = logs
        self.root = root

    def target_started(self, t: int, lane: int) -> None:
        self.console.target_started(t, lane)

    def target_finished(self, t: int, o: Outcome) -> None:
        target = self.graph.targets[t]
        if target.kind == "test" and o.status is Status.FAILED and target.label not in self.logs.unwritten \
                and target.pool != "console":
            rel = _relative(self.logs.path(target), self.root)
            import copy

            o = copy.copy(o)  # the build's own outcome keeps the output
            o.stdout, o.stderr, o.message = b"", b"", f"{o.message} (output in {rel})"
        self.console.target_finished(t, o)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


class TestSession:
    """Everything ``buildtool test`` adds to a build: the wrapped runner, the console
    filter and the final report."""

    __test__ = False

    def __init__(
        self,
        root: str,
        state_dir: str,
        graph: Graph,
        warn: Callable[[str], None],
        *,
        test_output: str = "errors",
        junit: str | None = None,
    ) -> None:
        if test_output not in TEST_OUTPUT_MODES:
            from buildtool.errors import UserError

            msg = f"--test-output must be one of {', '.join(TEST_OUTPUT_MODES)} (got {test_output!r})"
            raise UserError(msg)
        self.root = root
        self.graph = graph
        self.warn = warn
        self.test_output = test_output
        self._console: Any = None
        self.lost_junit: str | None = None  # why the JUnit file could not be written
        self.junit = junit
        self.logs = TestLogs(state_dir, warn)

    def wrap(self, runner: Any) -> TestRunner:
        runner.failed_tests = self.logs.failed  # (TargetRunner: no cache hit for a key that failed)
        return TestRunner(runner, self.graph, self.logs)

    def console(self, console: Any) -> Any:
        self._console = console  # (finish shows logs through it: control characters as it shows them)
        return OutputFilter(console, self.graph, self.logs, self.root) if self.test_output == "none" else console

    def cases(self, outcomes: dict[int, Outcome]) -> list[TestCase]:
        out: list[TestCase] = []
        for t in self.graph.targets:
            if t.kind != "test":
                continue
            o = outcomes.get(t.id)
            if o is None:
                continue
            r = test_result(t, o)
            # An input it could not get (unreadable, lost in a remote CAS): no command ran, and
            # its log would be empty; as Bazel's FAILED TO BUILD, a JUnit error with the reason.
            never_ran = r is TestResult.FAILED and bool(o.extra.get("not_started"))
            if never_ran:
                r = None
            cut = r is None and cut_short(o)
            time_s = 0.0 if r is TestResult.CACHED else o.duration
            # A console-pool test's output went to the terminal: its log is empty, named nowhere.
            rel = _relative(self.logs.path(t), self.root) if t.pool != "console" else ""
            failures = [str(m) for m in o.extra.get("failed_attempts", ())]  # type: ignore[attr-defined]
            lost = self.logs.unwritten.get(t.label) if r is not None or cut else None
            broken = r is None and (never_ran or (o.status is Status.SKIPPED and o.reason is Reason.DEP_FAILED))
            # (its log is read when the report needs it, one test at a time)
            log = functools.partial(self.logs.output, t) if r is not None or cut else b""
            tries = self.logs.attempts.get(t.label) if r is TestResult.FLAKY else None
            out.append(TestCase(t.label, t.pkg, r, time_s, o.message, log, rel, failures, lost, broken, cut, tries))
        return out

    def _show(self, c: TestCase, log: bytes, out: IO[str]) -> None:
        if self._console is not None:
            self._console.output_in(c.pkg, (log,))
        else:
            text = log.decode("utf-8", "replace")
            print(text, end="" if text.endswith("\n") else "\n", file=out)

    def finish(self, outcomes: dict[int, Outcome], out: IO[str], recorded: Callable[[str], float | None]) -> None:
        """Print the results (and the output ``--test-output`` asks for), warn about flaky
        tests, write the JUnit file and the log index."""
        self.logs.save()
        cases = self.cases(outcomes)
        if self.test_output != "none":  # (a flaky pass's failed attempts are errors to see, as Bazel shows them)
            for c in cases:
                for i, (why, log) in enumerate(zip(c.failures, c.attempt_logs, strict=False), 1):
                    print(f"==== {c.label} (FLAKY: attempt {i} of {len(c.failures) + 1} failed: {escape_controls(why)})"
                          " output ====", file=out)
                    self._show(c, log, out)
        if self.test_output == "all":
            for c in cases:
                log = c.log if c.result in (TestResult.PASSED, TestResult.CACHED, TestResult.FLAKY) else b""
                if log:
                    print(f"==== {c.label} ({c.result.word}) output ====", file=out)
                    self._show(c, log, out)
        counts: dict[str, int] = {}
        for c in cases:
            word = c.result.word if c.result is not None else "INTERRUPTED" if c.interrupted else "NOT RUN"
            kind = c.result.value if c.result is not None else "interrupted" if c.interrupted else "not run"
            counts[kind] = counts.get(kind, 0) + 1
            if c.result is TestResult.CACHED:
                d = recorded(c.label)
                timing = f" (ran in {d:.2f}s)" if d is not None else ""
            else:
                timing = f" in {c.time:.2f}s"
            extra = ""
            if c.result in (TestResult.FAILED, TestResult.TIMEOUT) or c.interrupted:
                if not c.log_path:
                    extra = "  (output on the terminal: console pool)"
                elif c.log_lost is not None:
                    extra = f"  log: could not be written ({c.log_lost})"
                else:
                    extra = f"  log: {c.log_path}"
            elif c.result is None:
                extra = f"  ({escape_controls(c.message)})"
            print(f"{c.label:<50} {word}{timing}{extra}", file=out)
        ran = sum(1 for c in cases if c.result not in (None, TestResult.CACHED) or c.interrupted)
        # (a fixed order: CI logs are diffed)
        order = ("passed", "cached", "flaky", "failed", "timeout", "interrupted", "not run")
        parts = [f"{counts[k]} {k}" for k in order if k in counts]
        if cases:  # (none: only non-tests were named; they were built, and the command exits 4)
            print(f"Tests: {len(cases)} ({', '.join(parts)}); {ran} executed", file=out, flush=True)
        for c in cases:
            if c.result is TestResult.FLAKY:
                n = len(c.failures)
                logs = f"; logs of the failed attempts: {c.log_path[:-4]}#attempt-*.log" if c.log_path else ""
                self.warn(
                    f"{c.label} is FLAKY: it failed {n} time{'s' if n > 1 else ''} ({'; '.join(c.failures)}) "
                    f"and passed on attempt {n + 1}{logs}"
                )
        if self.junit:
            from buildtool.junit import write_junit

            try:
                write_junit(self.junit, cases, _wall_span(self.graph, outcomes))
            except OSError as e:
                from buildtool.atomic import remove_stale_report

                gone = remove_stale_report(self.junit, "--junit")
                self.warn(f"could not write the JUnit file {self.junit} ({e.strerror})"
                          + ("; removed the one an earlier run left there" if gone else ""))
                self.lost_junit = f"--junit {self.junit} could not be written ({e.strerror})"

