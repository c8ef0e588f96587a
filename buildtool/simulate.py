"""Simulate: ``buildtool plan`` — predict a build's makespan by running our scheduler's
policy on recorded durations, without running anything.

The simulation uses the real ``plan.Plan`` (same ready heap ``(priority, -critical path,
arrival)``, same release order) and the scheduler's rules: at most ``jobs`` targets in
flight, pools, exclusive targets alone, free targets (groups; with ``--incremental`` also
targets predicted up to date or restorable) settled at once without a worker.  The clock
jumps to the next finish time.  It predicts *our* schedule, not the optimal one (finding
that is NP-hard); the lower bound max(critical path, total work / jobs) says how far off
any schedule could be.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from buildtool.config import MAX_JOBS, integer
from buildtool.graph import Graph
from buildtool.plan import Plan
from buildtool.pools import Pools
from buildtool.profile import chain_text

UNKNOWN_DURATION = 1.0
FRESH_WEIGHT = 0.001


@dataclass(slots=True)
class Costs:
    """Predicted seconds per target id; ``free`` ids cost nothing and take no worker."""

    cost: list[float]
    free: set[int]
    unknown: set[int]
    default: float


@dataclass(slots=True)
class Prediction:
    jobs: int
    makespan: float
    peak: int = 0  # the most commands running at once (below ``jobs``: a larger -j changes nothing)
    start: dict[int, float] = field(default_factory=dict)
    end: dict[int, float] = field(default_factory=dict)


def costs_from_record(
    graph: Graph, durations: Mapping[str, float], free: set[int] | None = None
) -> Costs:
    """Recorded duration per target; unknown = median of the recorded ones (1 s if none);
    groups and ``free`` targets cost 0."""
    known = [d for d in durations.values() if d > 0]
    default = statistics.median(known) if known else UNKNOWN_DURATION
    cost: list[float] = []
    unknown: set[int] = set()
    free_ids = set(free or ())
    for t in graph.targets:
        if t.kind == "group":
            free_ids.add(t.id)
        if t.id in free_ids:
            cost.append(0.0)
            continue
        d = durations.get(t.label)
        if d is None:
            unknown.add(t.id)
            d = default
        cost.append(max(float(d), 0.0))
    return Costs(cost, free_ids, unknown, default)


def weights(c: Costs) -> list[float]:
    """Critical-path weights as session._weights computes them (free ~0)."""
    return [FRESH_WEIGHT if t in c.free else max(w, FRESH_WEIGHT) for t, w in enumerate(c.cost)]


def simulate(
    graph: Graph,
    c: Costs,
    jobs: int,
    *,
    pool_depth: Mapping[str, int] | None = None,
    exclusive: Sequence[bool] | None = None,
) -> Prediction:
    """Run the scheduler's policy on a virtual clock."""
    jobs = max(1, jobs)
    n = len(graph.targets)
    plan = Plan([t.deps for t in graph.targets], graph.dependents, range(n),
                [t.priority for t in graph.targets], weights(c))
    pools = Pools(plan, [t.pool for t in graph.targets], pool_depth)
    pred = Prediction(jobs, 0.0)
    running: list[tuple[float, int, int]] = []  # (end, seq, t)
    seq = 0
    now = 0.0
    held: int | None = None
    alone: int | None = None

    def next_startable() -> int | None:
        nonlocal held
        if alone is not None:
            return None
        if held is not None:
            if running:
                return None
            t, held = held, None
            return t
        while True:
            t = plan.pop()
            if t is None:
                return None
            if t in c.free:
                return t  # settled at once: it needs neither a pool's slot nor the machine alone
            if not pools.admit(t):
                continue
            if exclusive is not None and exclusive[t] and running:
                held = t
                return None
            return t

    while True:
        while len(running) < jobs:
            t = next_startable()
            if t is None:
                break
            pred.start[t] = now
            if t in c.free:
                pred.end[t] = now
                plan.finished(t)
                continue
            pools.take(t)
            if exclusive is not None and exclusive[t]:
                alone = t
            heapq.heappush(running, (now + c.cost[t], seq, t))
            seq += 1
        pred.peak = max(pred.peak, len(running))
        if not running:
            break
        end, _, t = heapq.heappop(running)
        now = end
        pred.end[t] = end
        if t == alone:
            alone = None
        pools.release(t)
        plan.finished(t)
    pred.makespan = max(pred.end.values(), default=0.0)
    return pred


def critical_path(graph: Graph, c: Costs) -> tuple[float, list[int]]:
    """The longest chain by predicted cost, as (seconds, ids from first to last)."""
    best: dict[int, tuple[float, int | None]] = {}  # t -> (path cost from t to the end, next)
    order = graph.topo_order()
    for t in reversed(order):
        nxt = max(graph.dependents[t], key=lambda d: best[d][0], default=None)
        tail = best[nxt][0] if nxt is not None else 0.0
        best[t] = (c.cost[t] + tail, nxt)
    if not best:
        return 0.0, []
    cur: int | None = max(best, key=lambda t: (best[t][0], -t))
    total = best[cur][0]
    chain = []
    while cur is not None:
        chain.append(cur)
        cur = best[cur][1]
    return total, [t for t in chain if c.cost[t] > 0 or len(chain) == 1]


def lower_bound(
    graph: Graph, c: Costs, jobs: int, pool_depth: Mapping[str, int] | None = None,
) -> tuple[float, float, float]:
    """(bound, critical path, total work)."""
    cp, _ = critical_path(graph, c)
    total = sum(c.cost)
    return max(cp, total / max(1, jobs), *(v for _, v in resource_bounds(graph, c, jobs, pool_depth))), cp, total


def resource_bounds(
    graph: Graph, c: Costs, jobs: int, pool_depth: Mapping[str, int] | None,
) -> list[tuple[str, float]]:
    """What no schedule at ``jobs`` can beat besides the critical path and the work over
    the jobs: a pool's work over its depth (``pool link 4.00s / 1``), and the exclusive
    targets' work, each alone, plus the rest over the jobs.  Without them the bound of a
    build behind a depth-1 link pool was a third of what any schedule takes, and its gap
    blamed the scheduler."""
    depth = {**(pool_depth or {}), "console": 1}
    work: dict[str, float] = {}
    alone = 0.0
    for t in graph.targets:
        if t.pool is not None and depth.get(t.pool, 0) > 0:
            work[t.pool] = work.get(t.pool, 0.0) + c.cost[t.id]
        if t.exclusive:
            alone += c.cost[t.id]
    out = [(f"pool {name} {w:.2f}s / {depth[name]}", w / depth[name]) for name, w in sorted(work.items())
           if depth[name] < jobs and w > 0]
    if alone > 0:
        out.append((f"exclusive {alone:.2f}s + the rest / {jobs}", alone + (sum(c.cost) - alone) / max(1, jobs)))
    return out


def parse_jobs_range(text: str) -> list[int]:
    """``A-B`` (or a single ``N``) -> [A..B]; raises ValueError on bad input."""
    a, sep, b = text.partition("-")
    try:
        lo = integer(a)
        hi = integer(b) if sep else lo
    except ValueError:
        lo = hi = 0
    if lo < 1 or hi < lo or hi > MAX_JOBS:
        msg = f"--jobs-range must be A-B with 1 <= A <= B <= {MAX_JOBS} (got {text!r})"
        raise ValueError(msg)
    return list(range(lo, hi + 1))


def report(
    graph: Graph, c: Costs, jobs_list: list[int], *, incremental: bool,
    pool_depth: Mapping[str, int] | None = None,
) -> tuple[str, dict[str, object]]:
    """The text ``buildtool plan`` prints, and the same as data (``--json``)."""
    exclusive = [t.exclusive for t in graph.targets]
    to_run = [t.id for t in graph.targets if t.id not in c.free]
    cp, chain = critical_path(graph, c)
    total = sum(c.cost)
    rows = []
    p: Prediction | None = None
    for j in jobs_list:
        if p is None or p.peak >= p.jobs or j < p.jobs:  # (else -j p.jobs never bound: the same schedule)
            p = simulate(graph, c, j, pool_depth=pool_depth, exclusive=exclusive)
        extra = resource_bounds(graph, c, j, pool_depth)
        bound = max(cp, total / j, *(v for _, v in extra))
        rows.append({"jobs": j, "makespan_s": round(p.makespan, 4), "lower_bound_s": round(bound, 4),
                     "bound_terms": [text for text, _ in extra]})
    src = "the current state (--incremental)" if incremental else "an empty cache"
    lines = [
        f"plan: a simulation of buildtool's scheduler (not the optimal schedule) from {src}: "
        f"{len(graph.targets)} target{'s' if len(graph.targets) != 1 else ''}, {len(to_run)} to run, "
        f"{total:.2f}s of work",
    ]
    if c.unknown:
        have = "1 target has" if len(c.unknown) == 1 else f"{len(c.unknown)} targets have"
        lines.append(f"  {have} no recorded duration; each counts as {c.default:.2f}s "
                     "(the median of the recorded ones, or 1s)")
    for r in rows:
        terms = "".join(f", {text}" for text in r["bound_terms"])  # type: ignore[attr-defined]
        lines.append(
            f"-j {r['jobs']}: predicted makespan {r['makespan_s']:.2f}s; lower bound {r['lower_bound_s']:.2f}s "
            f"= max(critical path {cp:.2f}s, total work {total:.2f}s / {r['jobs']}{terms})"
        )
    lines.append(f"critical path ({cp:.2f}s): " + (chain_text(
        [f"{graph.targets[t].label} {c.cost[t]:.2f}s" for t in chain]) if cp > 0 else "(nothing to run)"))
    data: dict[str, object] = {
        "simulation": True,
        "incremental": incremental,
        "targets": len(graph.targets),
        "to_run": len(to_run),
        "total_work_s": round(total, 4),
        "critical_path_s": round(cp, 4),
        "critical_path": [graph.targets[t].label for t in chain] if cp > 0 else [],
        "unknown_durations": sorted(graph.targets[t].label for t in c.unknown),
        "rows": rows,
    }
    return "\n".join(lines), data

