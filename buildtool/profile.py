"""Profile: the ``--profile FILE`` Chrome trace of a build, and the critical path of what ran.

The trace is Chrome trace-event JSON (opens in Perfetto and ``chrome://tracing``): one
complete event (``"ph": "X"``) per target that ran, was restored or failed (or was running
when the build was interrupted), on the thread
("lane") of the worker that ran it, with ``args`` {status, cache, reason}; plus one span
per build phase (load buildfiles and graph, clean dead outputs, critical-path weights,
schedule) on a separate "phases" thread.  Times are microseconds since the build began.
Spec: docs/formats.md#profile
"""

from __future__ import annotations

import bisect
import json
import os
import time

from buildtool.atomic import write_report
from buildtool.graph import Graph
from buildtool.outcome import Outcome, Status

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

PROFILE_VERSION = 1
PHASE_TID = 0  # worker lane n is thread n + 1
SLOT_WAIT_S = 0.02  # a target that started this long after its dependencies were done waited (for a slot
# whose freeing, as long before its start at most, it took: the scheduler's own latency is ~1 ms a target)
SCHEDULER_TID = 1_000_000  # what the scheduler's own thread settled (a small restore): no worker's
WORK = (Status.RAN, Status.RESTORED)


class Phases:
    """Build phase spans in monotonic seconds since ``t0`` (the start of the build)."""

    __slots__ = ("_open", "spans", "t0")

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.spans: list[tuple[str, float, float]] = []
        self._open: dict[str, float] = {}

    def begin(self, name: str) -> None:
        self._open[name] = time.monotonic()

    def end(self, name: str) -> None:
        start = self._open.pop(name, None)
        if start is not None:
            self.spans.append((name, start - self.t0, time.monotonic() - self.t0))

    def add(self, name: str, start_abs: float, end_abs: float) -> None:
        self.spans.append((name, start_abs - self.t0, end_abs - self.t0))


def trace_events(graph: Graph, outcomes: Mapping[int, Outcome], phases: Phases) -> list[dict[str, object]]:
    """The trace's events.  Outcomes' start and end count from when the build began (the
    session gives the scheduler that origin), as the phases' spans and --events do."""
    from buildtool.testing import test_result

    pid = os.getpid()

    def us(s: float) -> int:
        return round(s * 1e6)

    evs: list[dict[str, object]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": PHASE_TID, "args": {"name": "buildtool"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": PHASE_TID, "args": {"name": "phases"}},
    ]
    threads: dict[int, str] = {}  # tid -> its name
    for name, start, end in phases.spans:
        evs.append({"ph": "X", "name": name, "cat": "phase", "pid": pid, "tid": PHASE_TID,
                    "ts": us(start), "dur": max(us(end - start), 1)})
    for t, o in sorted(outcomes.items(), key=lambda kv: (kv[1].start, kv[0])):
        if o.status not in WORK and not (o.status in (Status.FAILED, Status.CANCELLED) and o.lane >= 0):
            continue  # (a command interrupted while it ran: its span too, what a cancelled CI job asks after)
        # (one settled on the scheduler's thread has no lane: drawn on worker 0, it sat inside
        # the command that lane was running, as its child in Perfetto)
        tid = o.lane + 1 if o.lane >= 0 else SCHEDULER_TID
        threads[tid] = f"worker {o.lane}" if o.lane >= 0 else "scheduler (settled inline)"
        args = {"status": o.status.value, "cache": o.cache, "reason": o.message, "reason_code": o.reason.value}
        tr = test_result(graph.targets[t], o)
        if tr is not None:  # (as --events: a timeout's span said only "failed", a flaky pass's "ran")
            args["test"] = tr.value
        evs.append({
            "ph": "X", "name": graph.targets[t].label, "cat": "target", "pid": pid, "tid": tid,
            "ts": us(o.start), "dur": max(us(o.end - o.start), 1), "args": args,
        })
        hashed = o.extra.get("hash_s")
        if isinstance(hashed, float) and hashed > 0:  # the hash phase of this target, nested in its span
            evs.append({"ph": "X", "name": "hash inputs", "cat": "hash", "pid": pid, "tid": tid,
                        "ts": us(o.start), "dur": max(us(min(hashed, o.end - o.start)), 1)})
    for tid, name in sorted(threads.items()):
        evs.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
    return evs


def write_profile(path: str, graph: Graph, outcomes: Mapping[int, Outcome], phases: Phases, wall: float) -> None:
    """Write the trace atomically (temp file + rename)."""
    doc = {
        "traceEvents": trace_events(graph, outcomes, phases),
        "displayTimeUnit": "ms",
        "otherData": {"buildtool_profile_version": PROFILE_VERSION, "wall_s": round(wall, 6)},
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_report(path, json.dumps(doc, separators=(",", ":")) + "\n")


def actual_critical_path(
    graph: Graph, outcomes: Mapping[int, Outcome], extra: Mapping[int, Sequence[int]] | None = None,
    pools: Mapping[str, int] | None = None,
) -> list[int]:
    return _critical_path(graph, outcomes, extra, pools)[0]


def _critical_path(
    graph: Graph, outcomes: Mapping[int, Outcome], extra: Mapping[int, Sequence[int]] | None,
    pools: Mapping[str, int] | None,
) -> tuple[list[int], dict[int, str]]:
    """The chain of targets whose end times determined the wall time: start from the
    target that finished last and repeatedly step to the dependency that finished last
    (the one that released it; ``extra``: the plan's edges from depfiles too).  Only
    targets that ran or were restored are returned.  A dependency settled without work
    (up to date, a group) counts as done when its own dependencies were: it is checked
    when the scheduler gets to it, late when every lane is busy, and that check's time
    said nothing of what held the build up (an incremental build's line showed its last
    step alone).  A target of a pool that limits the build (``pools``: name -> depth, those
    below -j) that started after its dependencies were done, on a lane, as another of the
    pool ended while the pool was full, waited for that slot: that one is the step before
    it (three links in a depth-1 pool: the line named the last one alone, 1 s of a 3 s
    build).  The second value: such targets -> their pool."""
    work = {t: o for t, o in outcomes.items() if o.status in WORK or o.status is Status.FAILED}
    if not work:
        return [], {}
    more = extra or {}
    pooled: dict[str, list[tuple[float, int]]] = {}  # pool -> (end, target), by end (a bisect a step)
    full_at_end: set[int] = set()  # targets whose pool was full as they ended: the ending freed a slot
    for pool, depth in (pools or {}).items():
        members = [t for t in work if graph.targets[t].pool == pool and work[t].lane >= 0]  # (inline: no slot)
        if not members:
            continue
        pooled[pool] = sorted((work[t].end, t) for t in members)
        running = 0  # a sweep of starts and ends: at an end, how many ran (itself too); ends first at a tie
        for _, kind, t in sorted([(work[t].start, 1, t) for t in members] + [(work[t].end, 0, t) for t in members]):
            if kind:
                running += 1
                continue
            if running >= depth:
                full_at_end.add(t)
            running -= 1
    waited: dict[int, str] = {}

    def slot_of(t: int, pool: str) -> int | None:
        """The target of ``pool`` whose end, as ``t`` started, freed the slot it took."""
        o = work[t]
        ends = pooled[pool]
        i = bisect.bisect_right(ends, (o.start + SLOT_WAIT_S, len(graph.targets))) - 1
        while i >= 0 and (ends[i][1] == t or ends[i][0] >= o.end):
            i -= 1
        if i < 0 or o.start - ends[i][0] > SLOT_WAIT_S or ends[i][1] not in full_at_end:
            return None
        return ends[i][1]

    def deps_of(t: int) -> list[int]:
        return [d for d in (*graph.targets[t].deps, *more.get(t, ())) if d in outcomes]

    done: dict[int, float] = {}  # target -> when it was, in effect, done

    def done_at(t: int) -> float:
        stack = [t]
        while stack:  # (post-order without recursion: chains of up-to-date targets may be long)
            s = stack[-1]
            if s in done:
                stack.pop()
                continue
            if s in work:
                done[s] = outcomes[s].end
                stack.pop()
                continue
            waiting = [d for d in deps_of(s) if d not in done]
            if waiting:
                stack.extend(waiting)
                continue
            stack.pop()
            done[s] = max((done[d] for d in deps_of(s)), default=0.0)
        return done[t]

    cur: int | None = max(work, key=lambda t: (work[t].end, -t))
    chain: list[int] = []
    while cur is not None:
        deps = deps_of(cur)
        step = max(deps, key=lambda d: (done_at(d), d in work, -d)) if deps else None
        if cur in work:
            chain.append(cur)
            o = work[cur]
            pool = graph.targets[cur].pool
            ready = done_at(step) if step is not None else 0.0
            if pool in pooled and o.lane >= 0 and o.start > ready + SLOT_WAIT_S:  # (it waited: for a slot?)
                slot = slot_of(cur, pool)
                if slot is not None and work[slot].end > ready:
                    waited[cur] = pool
                    step = slot
        cur = step
    chain.reverse()
    return chain, waited


def format_critical_path(
    graph: Graph, outcomes: Mapping[int, Outcome], wall: float | None = None,
    extra: Mapping[int, Sequence[int]] | None = None, pools: Mapping[str, int] | None = None,
) -> str | None:
    chain, waited = _critical_path(graph, outcomes, extra, pools)
    if not chain:
        return None
    busy = sum(outcomes[t].end - outcomes[t].start for t in chain)
    of = f" of {wall:.2f}s wall" if wall is not None else ""
    return f"critical path: {busy:.2f}s{of}: " + chain_text(
        [f"{graph.targets[t].label} {outcomes[t].end - outcomes[t].start:.2f}s"
         + (f" (after a slot of pool {waited[t]})" if t in waited else "") for t in chain])


CRITICAL_PATH_SHOWN = 20  # steps of a critical-path line (a 20,000-step chain: 1 MB in one line)


def chain_text(steps: list[str]) -> str:
    """Steps joined by `` -> ``; a chain of more than CRITICAL_PATH_SHOWN steps as its
    first and last ten with ``... N more ...`` between them."""
    if len(steps) > CRITICAL_PATH_SHOWN:
        half = CRITICAL_PATH_SHOWN // 2
        steps = [*steps[:half], f"... {len(steps) - CRITICAL_PATH_SHOWN} more ...", *steps[-half:]]
    return " -> ".join(steps)
