"""Scheduler: the coordinator loop that starts ready targets on ``-j`` workers.

It owns order and concurrency only: it pops the best ready target from the Plan, asks
the runner for a cheap inline decision (an up-to-date target never leaves this thread),
then lets the runner start the command on this thread and waits for any started command
to end through pidfds, as Ninja does (no thread hand-off per command); a target the
runner will not start here (large inputs to hash, remote work, test reruns) goes to a
worker thread.  It honours pools, stops on the first failure (or keeps going with
``-k``) and cancels running commands on SIGINT/SIGTERM.  Whether a target is fresh and
how it runs belong to the runner (rebuild + executor modules).
"""

from __future__ import annotations

import os
import queue
import select
import threading
import time
from collections import deque

from buildtool.outcome import Outcome, Reason, Status
from buildtool.plan import Plan
from buildtool.pools import Pools

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:  # the protocols only exist for type checkers
    from collections.abc import Callable, Sequence
    from typing import Any, Protocol

    class Runner(Protocol):
        """What the scheduler needs to turn a target id into an Outcome.

        A runner may also have ``set_lane_hook(hook)``: it then calls ``hook(t)`` from
        ``run`` once ``t``'s command has ended and its lane's resources (TMPDIR, output
        captures) are free, and the lane takes the next target while ``t``'s outputs are
        still hashed and recorded on that worker thread: ``-j`` bounds commands, as in
        Make and Ninja, not the bookkeeping after them.  A runner that may use a lane
        again after the hook (a flaky test's rerun) must not offer it.  A lane whose
        target's outcome would make a dependent ready waits for that outcome, so the next
        target it takes is the one the heap would give without the hook.

        A runner may also have ``build_stopping()``: called once, when the first failure
        (without ``-k``) stops the build from starting new work; a flaky test's next
        attempt is new work.  And ``settle(t)``: once the stopped build has nothing
        running, ``t``'s outcome if it needs no command (a restore of any size), else
        None; without it, ``try_inline(t, True)`` settles what it can."""

        def try_inline(self, t: int, waiting: bool = False) -> Outcome | None: ...
        def run(self, t: int, lane: int) -> Outcome: ...
        def cancel_all(self) -> None: ...

    class Started(Protocol):
        """A command a runner's optional ``start(t, lane)`` began on the scheduler's thread
        (None from ``start``: a worker thread runs ``t``; an Outcome: ``t`` is settled).
        The scheduler polls its ``pidfd`` (None: it cannot, so it waits for it at once),
        calls ``expire()`` once ``deadline`` (time.monotonic) has passed, and gives it
        back to the runner's ``complete(started, wait, ended, here)`` when it has exited
        (``ended``: when poll saw it, time.monotonic).  ``complete`` returns the Outcome,
        or None when the rest is too heavy for this thread (large outputs to hash): a
        worker then calls ``complete(started, False, None, False)``."""

        deadline: float | None

        def pidfd(self) -> int | None: ...
        def expire(self) -> None: ...

    class Reporter(Protocol):
        def target_started(self, t: int, lane: int) -> None: ...
        def target_finished(self, t: int, outcome: Outcome) -> None: ...


_LANE_FREE = object()  # a worker's message: the target's lane is free, its outcome comes later
INLINE_POLL = 64  # targets settled without a command (~50 us each) between looks at running ones
MAX_QUEUED_AFTER_BYTES = 32 << 20  # cache stores queued for the store thread hold at most this (_queue_after)
# The longest the coordinating thread waits in one go.  A signal the kernel hands to another
# thread (a test's retry loop, the store thread) interrupts no wait of this one, and Python
# runs the handler here only when this thread runs again: without a bound, Ctrl-C or SIGTERM
# waited for whatever the workers were doing (a flaky test's retries went on for good).
WAIT_SLICE_S = 0.25


class Scheduler:
    """Runs a Plan to completion with at most ``jobs`` targets on lanes at once."""

    def __init__(
        self,
        plan: Plan,
        runner: Runner,
        reporter: Reporter,
        *,
        jobs: int,
        keep_going: bool = False,
        pool_of: Sequence[str | None] | None = None,
        pool_depth: dict[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        can_start: Callable[[], bool] | None = None,
        exclusive: Sequence[bool] | None = None,
        origin: float | None = None,
    ) -> None:
        self.plan = plan
        self.runner = runner
        self.reporter = reporter
        self.jobs = max(1, jobs)
        self.keep_going = keep_going
        self.pools = Pools(plan, pool_of, pool_depth)
        self.clock = clock
        self.can_start = can_start
        self.exclusive = exclusive  # per id: must run with nothing else running
        self._held: int | None = None  # an exclusive target waiting for the workers to drain
        self._alone: int | None = None  # the exclusive target now running
        self.outcomes: dict[int, Outcome] = {}
        self.failed = False
        self.stopping = False
        self.interrupt: int | None = None
        self._ended = False  # every wanted target has its outcome: a late "input changed" cancels nothing
        self._end_lock = threading.Lock()
        self._results: queue.SimpleQueue[tuple[int, Outcome] | None] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        # Deferred work of finished targets (the cache store): one thread of its own, so a
        # lane's thread is free for the next command at once.
        self._after: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._after_thread: threading.Thread | None = None
        self._no_more_threads = False  # the OS refused a thread: no further one is asked for
        self._after_bytes = 0  # what the stores queued for the store thread hold (outputs, a test's log)
        self._after_lock = threading.Lock()
        self._free_lanes = list(range(self.jobs - 1, -1, -1))
        self._lane_of: dict[int, int] = {}  # target -> the lane it holds (until its lane is released)
        self._freed_at: dict[int, float] = {}  # target -> when its command's lane was released early
        self._running = 0  # lanes in use
        # The clock's reading that outcomes' start and end count from: when the build began
        # (the session's, so --events and --profile share one zero), or None: when run() starts.
        self.origin = origin
        self.t0 = 0.0
        # Commands started on this thread (runner.start): pidfd -> (target, lane, start, handle),
        # polled with the read end of a pipe that workers write to after each result.
        self._watched: dict[int, tuple[int, int, float, Started]] = {}
        self._inline = 0  # targets settled on this thread: every INLINE_POLL of them, a look at the running
        self._poller: Any = None
        self._wake: tuple[int, int] | None = None
        self._idle: deque[Callable[[], None]] = deque()  # their cache stores, run when nothing is ready
        self._wake_lock = threading.RLock()
        self._mono0 = 0.0
        self._in_flight = 0  # targets handed to workers whose outcome has not come back
        hook = getattr(runner, "set_lane_hook", None)
        if hook is not None:
            hook(self._lane_done)

    # -- public ----------------------------------------------------------------------
    def request_stop(self, signum: int) -> None:
        """Called from a signal handler: stop starting work and cancel running commands.
        A signal is never overwritten by watch mode's 0 ("an input changed") that came after it.
        That 0, from watch's observer thread (never a signal handler: it may take a lock),
        is dropped once the build has ended: nothing is left to cancel, the next cycle takes
        the change, and the build said OK while the cycle said CANCELLED."""
        if signum == 0:
            with self._end_lock:
                if self._ended:
                    return
                self._stop(signum)
            return
        self._stop(signum)

    def _stop(self, signum: int) -> None:
        if not self.interrupt:
            self.interrupt = signum
        self.stopping = True
        self.runner.cancel_all()
        interrupted = getattr(self.runner, "interrupted", None)
        if signum and interrupted is not None:  # (0: watch mode's "an input changed" goes on after)
            interrupted()
        self._results.put(None)  # wake the coordinator
        self._wake_up()

    def run(self) -> dict[int, Outcome]:
        self.t0 = self.clock() if self.origin is None else self.origin
        plan = self.plan
        starter = getattr(self.runner, "start", None)
        if starter is not None:
            self._open_poller()
        try:
            while True:
                # A worker is busy with each target in flight; those past their command
                # (lane released) finish their bookkeeping while the lanes run new ones.
                while not self.stopping and self._running < self.jobs and self._in_flight < 2 * self.jobs:
                    t = self._next_startable(self._running)
                    if t is None:
                        break
                    start = self.clock() - self.t0
                    if self._settled_inline(t):
                        self.pools.settled(t)
                        continue
                    if self.exclusive is not None and self.exclusive[t]:
                        self._alone = t
                    lane = self._free_lanes.pop()
                    self._lane_of[t] = lane
                    self._running += 1
                    self.pools.take(t)
                    self.reporter.target_started(t, lane)
                    step = self._start_here(starter, t, lane) if starter is not None else None
                    if step is None:
                        self._to_worker((t, lane))
                    elif isinstance(step, Outcome):
                        self._ended_here(t, lane, start, step, self.clock() - self.t0)
                    else:
                        self._watch(t, lane, start, step)
                if self._in_flight == 0 and not self._watched:
                    break
                if self._poller is None:
                    self._take(self._next_result())
                else:
                    self._poll_once()
            if self.stopping and self.interrupt is None:
                self._settle_what_needs_no_command()
            self._mark_unfinished()
            with self._end_lock:
                self._ended = True
                if self.interrupt == 0 and not any(o.reason is Reason.INTERRUPTED for o in self.outcomes.values()):
                    self.interrupt = None  # (an input changed as the last target finished: nothing was cut short)
        finally:
            self._close_poller()
            for _ in self._threads:
                self._work.put(None)
            for th in self._threads:
                th.join(timeout=120)
            if self._after_thread is not None:  # let deferred cache stores finish before the caller closes up
                self._after.put(None)
                self._after_thread.join(timeout=120)
            while self._idle:
                self._run_after(self._idle.popleft())
        del plan
        return self.outcomes

    def _settle_what_needs_no_command(self) -> None:
        """After a failure without -k, the ready targets the runner settles without a
        command (up to date, a cached pass, a group) are reported so, and their dependents
        looked at in turn, rather than as "not started": whether an untouched test showed
        as a cached pass or as NOT RUN (JUnit ``<skipped/>``) depended on how soon the
        failure came.  What would need a command is left unstarted.  The targets waiting
        for a pool's slot or for the build to drain (an exclusive one) are looked at too:
        none will start now, and one let back in needing a command passes no turn on."""
        self.pools.let_all_in()
        if self._held is not None:
            self.plan.push(self._held)
            self._held = None
        settle = getattr(self.runner, "settle", None)
        while self.interrupt is None and (t := self.plan.pop()) is not None:  # (Ctrl-C ends it at once)
            if settle is None:
                if self._settled_inline(t, True):  # (waiting: a fresh checkout's passes are the cache's)
                    self.pools.settled(t)
                continue
            try:
                done = settle(t)
            except Exception as e:  # a bug in a runner must not hang the build
                done = Outcome(Status.FAILED, Reason.FAILED, f"internal error: {type(e).__name__}: {e}")
            if done is not None:
                done.start = done.end = self.clock() - self.t0
                self._finish(t, done)
                self.pools.settled(t)

    def _to_worker(self, item: tuple[Any, ...]) -> None:
        """(t, lane): run t on a worker; (t, lane, started, start): finish a command this
        thread started (its outputs are large to hash)."""
        self._in_flight += 1
        if not self._ensure_workers(self._in_flight):  # no thread to give it to: this one does it
            self._work_one(item)
            return
        self._work.put(item)

    def _take(self, item: tuple[int, Outcome] | None) -> None:
        """Handle one worker message."""
        if item is None:
            return
        t, outcome = item
        if outcome is _LANE_FREE:
            # The lane takes the next ready target now, unless t's outcome would add one:
            # then it waits for it, so the choice stays the one Ninja would make.
            if not self.plan.would_release(t):
                self._release_lane(t)
            return
        self._in_flight -= 1
        if t in self._lane_of:
            self._release_lane(t)
        self._finish(t, outcome)

    # -- commands started on this thread (runner.start) -----------------------------------
    # Ninja's shape: one thread starts the commands and waits for any of them to end, so a
    # trivial command costs no thread hand-offs (each is a GIL hand-over in Python).
    def _start_here(self, starter: Callable[[int, int], Any], t: int, lane: int) -> Any:
        try:
            return starter(t, lane)
        except Exception as e:  # a bug in a runner must not hang the build
            return Outcome(Status.FAILED, Reason.FAILED, f"internal error: {type(e).__name__}: {e}")

    def _ended_here(self, t: int, lane: int, start: float, outcome: Outcome, end: float) -> None:
        outcome.start = start
        outcome.end = end
        outcome.lane = lane
        after = outcome.extra.pop("after", None)
        size = outcome.extra.pop("after_bytes", 0)
        if after is None:
            pass
        elif outcome.extra.pop("after_heavy", False):  # e.g. copying large outputs: the store thread's
            self._queue_after(after, size)
        else:  # a small cache store: when this thread has nothing else to do
            self._idle.append(after)
        self._release_lane(t)
        self._finish(t, outcome)

    def _watch(self, t: int, lane: int, start: float, step: Started) -> None:
        fd = step.pidfd()
        if fd is None:  # no pidfd for it: wait for it now
            self._exited(t, lane, start, step, True, None)
            return
        self._watched[fd] = (t, lane, start, step)
        self._poller.register(fd, select.POLLIN)

    def _exited(self, t: int, lane: int, start: float, step: Started, wait: bool, seen: float | None) -> None:
        """``step``'s process has exited (``seen``: when poll said so, time.monotonic):
        its outcome, or its outputs' hashing handed to a worker."""
        try:
            outcome = self.runner.complete(step, wait, seen)  # type: ignore[attr-defined]
        except Exception as e:
            outcome = Outcome(Status.FAILED, Reason.FAILED, f"internal error: {type(e).__name__}: {e}")
        if outcome is None:
            self._to_worker((t, lane, step, start))
            return
        end = self.clock() - self.t0 if seen is None else seen - self._mono0
        self._ended_here(t, lane, start, outcome, end)

    def _poll_once(self, block: bool = True) -> None:
        """Wait until a watched command ends, a worker reports or a deadline passes, and
        handle what happened.  Spare moments go to the deferred cache stores, one at a
        time, so a command that ends is seen at once.  ``block=False``: only what already
        happened (between targets settled without a command: thousands of them took 0.3 s,
        and a command that ended meanwhile was timed to the end of them)."""
        assert self._wake is not None
        while block and self._idle and self._results.empty() and not self._poller.poll(0):
            self._run_after(self._idle.popleft())
        deadlines = [s.deadline for _, _, _, s in self._watched.values() if s.deadline is not None]
        timeout = int(WAIT_SLICE_S * 1000)  # (see WAIT_SLICE_S; nothing happened: the loop polls again)
        if deadlines:
            timeout = max(0, min(timeout, int((min(deadlines) - time.monotonic()) * 1000) + 1))
        events = self._poller.poll(timeout) if block and self._results.empty() else self._poller.poll(0)
        seen = time.monotonic()
        for fd, _ in events:
            if fd == self._wake[0]:
                os.read(fd, 4096)
                continue
            t, lane, start, step = self._watched.pop(fd)
            self._poller.unregister(fd)
            os.close(fd)
            self._exited(t, lane, start, step, False, seen)
        if deadlines:
            now = time.monotonic()
            for _, _, _, s in self._watched.values():
                if s.deadline is not None and s.deadline <= now:
                    s.expire()
        while not self._results.empty():
            self._take(self._results.get())

    def _next_result(self) -> tuple[int, Outcome] | None:
        """The next report of a worker, waited for in slices (WAIT_SLICE_S)."""
        while True:
            try:
                return self._results.get(timeout=WAIT_SLICE_S)
            except queue.Empty:
                continue

    def _open_poller(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wake = (r, w)
        self._poller = select.poll()
        self._poller.register(r, select.POLLIN)
        # The scheduler's clock and time.monotonic (pidfd events) side by side.
        self._mono0 = time.monotonic() - (self.clock() - self.t0)

    def _close_poller(self) -> None:
        """After the loop.  Commands still watched (an exception left the loop) are killed
        and reaped, so no process or descriptor outlives the build."""
        for fd, (_, _, _, step) in list(self._watched.items()):
            os.close(fd)
            try:
                step.expire()
                self.runner.complete(step, True, None, False)  # type: ignore[attr-defined]
            except Exception:
                pass
        self._watched.clear()
        with self._wake_lock:
            wake, self._wake = self._wake, None
            if wake is not None:
                for fd in wake:
                    os.close(fd)
        self._poller = None

    def _wake_up(self) -> None:
        """Wake the loop's poll (from workers, signal handlers, other threads)."""
        with self._wake_lock:  # re-entrant: a signal handler may interrupt _close_poller
            if self._wake is not None:
                try:
                    os.write(self._wake[1], b"!")
                except OSError:  # full: the loop is awake anyway
                    pass

    # -- internals -------------------------------------------------------------------
    def _next_startable(self, running: int = 0) -> int | None:
        if self._alone is not None:
            return None  # an exclusive target runs alone
        if self._held is not None:
            if running:
                return None  # drain the workers first; nothing else starts meanwhile
            t, self._held = self._held, None
            return t
        busy = len(self._free_lanes) < self.jobs  # with nothing running, always start one: progress
        if self.can_start is not None and busy and self.plan.has_ready() and not self.can_start():
            return None
        while True:
            if self.stopping:  # (a command that failed, seen by the look _settled_inline takes)
                return None
            t = self.plan.pop()
            if t is None:
                return None
            # self._running, not ``running``: settling may have seen commands end meanwhile
            if (self.pools.would_wait(t) or self._must_wait_alone(t, self._running)) and self._settled_inline(t, True):
                continue  # up to date: it needs neither a pool's slot nor the machine to itself
            if self.pools.admit(t):
                return self._unless_exclusive(t, self._running)

    def _settled_inline(self, t: int, waiting: bool = False) -> bool:
        """Settle ``t`` on this thread if the runner can (up to date, restored, a group);
        ``waiting``: it would wait otherwise, so the runner may look further (the cache)."""
        inline = self.runner.try_inline(t, waiting) if waiting else self.runner.try_inline(t)
        if inline is None:
            return False
        inline.start = inline.end = self.clock() - self.t0
        self._finish(t, inline)
        self._inline += 1
        if self._inline % INLINE_POLL == 0 and self._watched:
            self._poll_once(block=False)  # a command that ended meanwhile is seen (and timed) now
        return True

    def _must_wait_alone(self, t: int, running: int) -> bool:
        return bool(running) and self.exclusive is not None and self.exclusive[t]

    def _unless_exclusive(self, t: int, running: int) -> int | None:
        """An exclusive target popped while others run is held until they finish (it is
        the best ready target, so nothing else may overtake it)."""
        if self._must_wait_alone(t, running):
            self._held = t
            return None
        return t

    def _lane_done(self, t: int) -> None:
        """Runner hook, on ``t``'s worker thread: its command ended, its lane is free."""
        self._freed_at[t] = self.clock() - self.t0
        self._results.put((t, _LANE_FREE))  # type: ignore[arg-type]
        self._wake_up()

    def _release_lane(self, t: int) -> None:
        self._free_lanes.append(self._lane_of.pop(t))
        self._running -= 1
        if t == self._alone:
            self._alone = None
        self.pools.release(t)

    def _ensure_workers(self, busy: int) -> bool:
        """At least ``busy`` worker threads (one per target in flight), as many as the OS
        lets start; False: there is none (the caller does the work itself)."""
        if len(self._threads) >= busy or self._no_more_threads:
            return bool(self._threads)
        self._ensure_store()
        th = threading.Thread(target=self._worker, name=f"buildtool-worker-{len(self._threads)}", daemon=True)
        if not self._no_more_threads and self._started(th):
            self._threads.append(th)
        return bool(self._threads)

    def _ensure_store(self) -> None:
        if self._after_thread is None and not self._no_more_threads:
            th = threading.Thread(target=self._afterwork, name="buildtool-store", daemon=True)
            if self._started(th):
                self._after_thread = th

    def _started(self, th: threading.Thread) -> bool:
        """Start ``th``; False, said once, when the OS refuses a thread (a limit on processes
        or threads: ``ulimit -u``, a container's pids.max): the build goes on with the
        threads it has, or on this one, rather than end in a traceback."""
        try:
            th.start()
        except RuntimeError as e:
            self._no_more_threads = True
            warn = getattr(self.runner, "warn", None)
            if warn is not None:
                warn(f"could not start another thread ({e}: a limit on processes or threads, such as ulimit -u "
                     f"or a container's pids.max); going on with {len(self._threads)} worker thread(s)"
                     + ("" if self._threads else ", the scheduler's own doing their work"))
            return False
        return True

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            self._work_one(item)

    def _work_one(self, item: tuple[Any, ...]) -> None:
        t, lane = item[0], item[1]
        start = self.clock() - self.t0 if len(item) == 2 else item[3]
        try:
            # (four items: a command the scheduler's thread started, whose large outputs are hashed here)
            outcome = self.runner.run(t, lane) if len(item) == 2 else \
                self.runner.complete(item[2], False, None, False)  # type: ignore[attr-defined]
        except BaseException as e:  # a bug in a runner must not hang the build
            outcome = Outcome(Status.FAILED, Reason.FAILED, f"internal error: {type(e).__name__}: {e}")
        outcome.start = start
        freed = self._freed_at.pop(t, None)  # the span on its lane ends with its command
        outcome.end = freed if freed is not None else self.clock() - self.t0
        outcome.lane = lane
        after = outcome.extra.pop("after", None)
        outcome.extra.pop("after_heavy", None)
        size = outcome.extra.pop("after_bytes", 0)
        if after is not None:  # e.g. the cache store: off the critical path and off this lane
            self._queue_after(after, size)
        self._results.put((t, outcome))
        self._wake_up()

    def _queue_after(self, after: Callable[[], None], size: int) -> None:
        """Hand a store to the store thread; while what it has queued holds more than
        MAX_QUEUED_AFTER_BYTES, this thread stores it itself: a store holds its command's
        output in memory until it runs, so a store thread behind a slow disk would hold the
        output of every test that finished meanwhile."""
        self._ensure_store()
        with self._after_lock:
            behind = self._after_bytes > 0 and self._after_bytes + size > MAX_QUEUED_AFTER_BYTES
            stored_here = behind or self._after_thread is None  # (no store thread: the OS refused one)
            if not stored_here:
                self._after_bytes += size
        if stored_here:
            self._run_after(after)
            return
        self._after.put((after, size))

    def _afterwork(self) -> None:
        while (item := self._after.get()) is not None:
            after, size = item
            self._run_after(after)
            with self._after_lock:
                self._after_bytes -= size

    def _run_after(self, after: Callable[[], None]) -> None:
        try:
            after()
        except Exception as e:  # the store degrades to a warning, never fails the build
            warn = getattr(self.runner, "warn", None)
            if warn is not None:
                warn(f"storing a result in the cache failed: {type(e).__name__}: {e}")

    def _finish(self, t: int, outcome: Outcome) -> None:
        if self.interrupt is not None and not outcome.ok:
            outcome.status = Status.CANCELLED
            outcome.reason = Reason.INTERRUPTED
            outcome.message = "interrupted while running; nothing was recorded"
        self.outcomes[t] = outcome
        self.reporter.target_finished(t, outcome)
        # The reporters have shown what the command printed (a test's is in its log): the
        # outcomes kept until the build ends hold none of it (2,000 tests' 1 MB outputs).
        outcome.stdout = outcome.stderr = b""
        if outcome.ok:
            self.plan.finished(t)
            return
        if outcome.status is Status.FAILED:
            self.failed = True
            self.plan.block_dependents(t)
            # A test's verdict stops nothing (`buildtool test`, as Bazel: every test gets its
            # result); a build failure does, without -k.
            if not self.keep_going and not self.stopping and not outcome.extra.get("test_verdict"):
                self.stopping = True
                stopping = getattr(self.runner, "build_stopping", None)
                if stopping is not None:
                    stopping()

    def _mark_unfinished(self) -> None:
        label_of = getattr(self.runner, "label_of", None)
        now = self.clock() - self.t0
        first_failed: dict[int, int | None] = {}
        for t in sorted(self.plan.wanted):
            if t in self.outcomes:
                continue
            if t in self.plan.blocked:
                failed = self._first_failed_dep(t, first_failed)
                name = label_of(failed) if (failed is not None and label_of) else "a dependency"
                o = Outcome(Status.SKIPPED, Reason.DEP_FAILED, f"not run because {name} failed")
            elif self.interrupt is not None:
                o = Outcome(Status.CANCELLED, Reason.INTERRUPTED, "not started: the build was interrupted")
            elif self.stopping:
                o = Outcome(Status.CANCELLED, Reason.CANCELLED, "not started: the build stopped after a failure")
            else:  # a scheduler bug: it must fail the build, never pass it without this target
                self.failed = True
                o = Outcome(Status.FAILED, Reason.FAILED, "internal error: the scheduler never started it")
            o.start = o.end = now
            self.outcomes[t] = o
            self.reporter.target_finished(t, o)

    def _first_failed_dep(self, t: int, memo: dict[int, int | None]) -> int | None:
        """The failed target (the lowest id) that ``t`` waits for, through targets that did
        not fail themselves; memoised in ``memo`` across the targets of one build, so that
        marking a 20,000-target chain behind a failure is linear (a search from each was
        quadratic: a minute, with Ctrl-C unheard)."""
        deps_of = getattr(self.runner, "deps_of", None)
        if deps_of is None:
            return None
        stack = [(t, False)]
        while stack:
            x, done = stack.pop()
            if x in memo:
                continue
            if not done:
                stack.append((x, True))
                stack.extend((d, False) for d in deps_of(x) if d not in memo and not self._failed(d))
                continue
            found = [d if self._failed(d) else memo.get(d) for d in deps_of(x)]
            memo[x] = min((f for f in found if f is not None), default=None)
        return memo[t]

    def _failed(self, t: int) -> bool:
        o = self.outcomes.get(t)
        return o is not None and o.status is Status.FAILED
