"""``buildtool plan``: the scheduler simulation, unit-tested on the seed example and checked
against a real run of sleep targets (prediction within 10% of the scheduler's own span)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Workspace

from buildtool.graph import Graph, Target
from buildtool.simulate import costs_from_record, critical_path, lower_bound, parse_jobs_range, report, simulate


def _graph(deps: list[list[int]], priority: list[int], pool: str | None = None) -> Graph:
    targets = tuple(
        Target(id=i, label=f"//:{'ABCDEFGHIJ'[i] if i < 10 else f't{i}'}", kind="genrule", pkg="", cmd="", srcs=(),
               deps=tuple(ds), outs=(),
               env=(), pass_env=(), tools=(), priority=priority[i], manual=False, pool=pool, timeout=None,
               fn=None, kwargs_json=None, where="BUILD.py:1")
        for i, ds in enumerate(deps)
    )
    dependents: list[list[int]] = [[] for _ in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            dependents[d].append(i)
    return Graph(targets, {t.label: t.id for t in targets}, tuple(range(len(deps))),
                 tuple(tuple(x) for x in dependents), tuple(() for _ in deps))


SEED = _graph([[], [], [0], [0], [1, 2]], [2, 1, 1, 3, 1])
SEED_D = {"//:A": 3.0, "//:B": 2.0, "//:C": 4.0, "//:D": 2.0, "//:E": 1.0}


def test_seed_example_one_worker_is_the_sum_in_seed_order() -> None:
    c = costs_from_record(SEED, SEED_D)
    p = simulate(SEED, c, 1)
    assert p.makespan == 12.0
    assert sorted(p.start, key=lambda t: p.start[t]) == [1, 0, 2, 4, 3]  # B, A, C, E, D


def test_seed_example_two_workers_makespan_is_the_critical_path() -> None:
    c = costs_from_record(SEED, SEED_D)
    p = simulate(SEED, c, 2)
    assert p.makespan == 8.0
    assert p.start[2] == p.start[3] == 3.0  # C and D start together when A finishes
    cp, chain = critical_path(SEED, c)
    assert cp == 8.0 and chain == [0, 2, 4]
    assert lower_bound(SEED, c, 2) == (8.0, 8.0, 12.0)


def test_unknown_durations_count_as_the_median_and_free_targets_cost_nothing() -> None:
    c = costs_from_record(SEED, {"//:A": 1.0, "//:B": 3.0, "//:C": 2.0}, free={4})
    assert c.unknown == {3} and c.default == 2.0
    assert c.cost == [1.0, 3.0, 2.0, 2.0, 0.0]
    c = costs_from_record(SEED, {})
    assert c.cost == [1.0] * 5


def test_a_free_target_takes_no_pool_slot_and_the_waiter_still_runs() -> None:
    # Pool depth 1: A runs, B (free: up to date) settles at once without a slot, C waits
    # for A (once left out: 0.5 s predicted where the pool forces 0.5 + 0.1 in series).
    g = _graph([[], [], []], [0, 1, 2], pool="p")
    c = costs_from_record(g, {"//:A": 0.5, "//:B": 0.3, "//:C": 0.1}, free={1})
    p = simulate(g, c, 3, pool_depth={"p": 1})
    assert p.start == {0: 0.0, 1: 0.0, 2: 0.5}
    assert p.makespan == 0.6


def test_jobs_range_parsing() -> None:
    assert parse_jobs_range("1-4") == [1, 2, 3, 4]
    assert parse_jobs_range("3") == [3]
    for bad in ("0-2", "4-2", "x", "abc", "1-y", "1-5000", "1_0-1_2", "\uff11-2", " 1-2"):  # (int(): the last 3)
        try:
            parse_jobs_range(bad)
        except ValueError as e:
            assert "--jobs-range must be A-B" in str(e), e  # the flag is named, not int()'s message
            continue
        raise AssertionError(bad)


def test_a_long_critical_path_is_shown_as_its_ends() -> None:
    chain = _graph([[]] + [[i] for i in range(29)], [0] * 30)
    text, data = report(chain, costs_from_record(chain, {}), [2], incremental=False)
    line = text.splitlines()[-1]
    assert "... 10 more ..." in line and line.count(" -> ") == 20
    assert len(data["critical_path"]) == 30  # (--json: every step)


# name: (seconds, deps); every target also reads stamp.txt, so editing it reruns all.
SLEEPS = {
    "a": (0.4, []), "b": (0.3, []), "c": (0.6, []),
    "d": (0.5, ["a"]), "e": (0.2, ["a", "b"]), "f": (0.4, ["c"]),
    "g": (0.3, ["d", "e"]), "h": (0.6, ["f"]), "i": (0.2, ["g", "h"]), "j": (0.5, ["e"]),
}


def _sleep_workspace(ws: Workspace) -> None:
    ws.write("stamp.txt", "1\n")
    lines = []
    for name, (secs, deps) in SLEEPS.items():
        srcs = ["stamp.txt", *[f":{d}" for d in deps]]
        lines.append(f"genrule(name={name!r}, srcs={srcs!r}, outs=['{name}.out'], "
                     f"cmd='sleep {secs}; cat $(SRCS) > $@')")
    ws.build_file("", "\n".join(lines) + "\n")


def _span(events: list[dict]) -> float:
    ran = [e for e in events if e["status"] == "ran"]
    assert len(ran) == len(SLEEPS), events
    return max(e["end"] for e in ran) - min(e["start"] for e in ran)


def test_prediction_is_within_ten_percent_of_a_real_run(workspace: Workspace, tmp_path: Path) -> None:
    _sleep_workspace(workspace)
    first = workspace.build("-j", "2")
    assert first.rc == 0, first.output
    # Every key changes, nothing is in the (fresh) cache: a build from an empty cache,
    # with the durations this workspace recorded.
    workspace.write("stamp.txt", "2\n")
    rc, out, err = workspace.run("plan", "-j", "2", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["simulation"] is True and data["to_run"] == len(SLEEPS)
    predicted = data["rows"][0]["makespan_s"]
    assert data["rows"][0]["lower_bound_s"] <= predicted + 1e-9
    real = workspace.build("-j", "2", "--cache-dir", str(tmp_path / "empty-cache"))
    assert real.rc == 0, real.output
    measured = _span(real.events)
    print(f"plan predicted {predicted:.3f}s, measured {measured:.3f}s")
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)

    rc, out, err = workspace.run("plan", "--jobs-range", "1-3")
    assert rc == 0, err
    assert "simulation of buildtool's scheduler (not the optimal schedule)" in out
    assert [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("-j ")] == ["-j 1", "-j 2", "-j 3"]
    assert "critical path" in out and "//:i" in out


def test_incremental_counts_fresh_targets_as_free(workspace: Workspace) -> None:
    """Fresh and restorable targets cost nothing, the others their recorded time (all
    fresh alone could not tell "fresh is free" from "everything is free")."""
    _sleep_workspace(workspace)
    assert workspace.build("-j", "4").rc == 0

    def incremental() -> dict:
        rc, out, err = workspace.run("plan", "-j", "2", "--incremental", "--json")
        assert rc == 0, err
        return json.loads(out)

    data = incremental()
    assert data["to_run"] == 0 and data["rows"][0]["makespan_s"] == 0
    (workspace.root / "a.out").unlink()  # (the cache has it: a restore, free)
    data = incremental()
    assert data["to_run"] == 0 and data["rows"][0]["makespan_s"] == 0, data
    # A leaf's command edited: that target alone, for about its recorded 0.5 s.
    lines = workspace.read("BUILD.py").splitlines()
    lines = [ln.replace("; cat", ";  cat") if "name='j'" in ln else ln for ln in lines]
    workspace.build_file("", "\n".join(lines) + "\n")
    data = incremental()
    assert data["to_run"] == 1 and 0.4 <= data["rows"][0]["makespan_s"] < 1.0, data
    workspace.write("stamp.txt", "2\n")  # (every target reads it)
    data = incremental()
    assert data["to_run"] == len(SLEEPS) and data["rows"][0]["makespan_s"] >= data["rows"][0]["lower_bound_s"] > 2
    rc, _, err = workspace.run("plan", "-j", "2", "--jobs-range", "0-2")
    assert rc == 2 and "--jobs-range" in err


def test_a_plan_of_build_leaves_out_the_tests_build_reaches(workspace: Workspace) -> None:
    """`build` never runs a test, also one reached through a group; plan (without --test)
    counted it as 1 s of work on the critical path."""
    workspace.build_file("", 'genrule(name="a", outs=["a"], cmd="sleep 0.2; echo > $@")\n'
                             'test(name="t", srcs=[":a"], cmd="sleep 1")\ngroup(name="g", deps=[":t"])\n')
    assert workspace.build(command="test").rc == 0
    rc, out, err = workspace.run("plan", "//:g", "--json")
    assert rc == 0, err
    assert json.loads(out)["to_run"] == 1, out
    rc, out, err = workspace.run("plan", "--test", "//:g", "--json")
    assert rc == 0 and json.loads(out)["to_run"] == 2, out


def test_a_jobs_range_simulates_only_until_jobs_stop_binding(monkeypatch) -> None:
    """`plan --jobs-range 1-4096` simulated every -j (~40 s on 3,000 targets); once a
    simulation never had -j commands running at once, every larger -j gives the same
    schedule, so its rows come from that one."""
    import buildtool.simulate as sim

    c = costs_from_record(SEED, SEED_D)
    full = [simulate(SEED, c, j).makespan for j in range(1, 65)]
    calls: list[int] = []
    real = sim.simulate

    def counting(graph: Graph, costs: object, jobs: int, **kw: object) -> object:
        calls.append(jobs)
        return real(graph, costs, jobs, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(sim, "simulate", counting)
    _, data = report(SEED, c, list(range(1, 65)), incremental=False)
    assert [r["makespan_s"] for r in data["rows"]] == full  # type: ignore[index]
    assert calls == [1, 2, 3]  # (the seed example never runs 3 at once: -j 3 and up are the same)


def test_the_lower_bound_counts_a_pool_s_work_over_its_depth_and_exclusive_work_alone() -> None:
    """Three 1 s links in a depth-1 pool at -j4: the bound said 1.00 s (max of the critical
    path and 3.7 s / 4), which no schedule comes near (3 s), and its gap blamed the
    scheduler; an exclusive test likewise runs with nothing beside it."""
    from buildtool.simulate import Costs, resource_bounds

    pools = ["link", "link", "link", None, None]
    targets = tuple(
        Target(id=i, label=f"//:t{i}", kind="genrule", pkg="", cmd="", srcs=(), deps=(), outs=(), env=(),
               pass_env=(), tools=(), priority=0, manual=False, pool=pools[i], timeout=None, fn=None,
               kwargs_json=None, where="BUILD.py:1", exclusive=(i == 4))
        for i in range(5))
    graph = Graph(targets, {t.label: t.id for t in targets}, tuple(range(5)), tuple(() for _ in targets),
                  tuple(() for _ in targets))
    c = Costs([1.0, 1.0, 1.0, 0.2, 0.5], set(), set(), 1.0)
    assert resource_bounds(graph, c, 4, {"link": 1}) == [
        ("pool link 3.00s / 1", 3.0), ("exclusive 0.50s + the rest / 4", 0.5 + 3.2 / 4)]
    assert lower_bound(graph, c, 4, {"link": 1})[0] == 3.0
    assert lower_bound(graph, c, 4)[0] == 0.5 + 3.2 / 4  # (no depth for the pool: unlimited)
    assert resource_bounds(graph, c, 1, {"link": 1}) == [("exclusive 0.50s + the rest / 1", 0.5 + 3.2)]
    text, data = report(graph, c, [4], incremental=False, pool_depth={"link": 1})
    assert "lower bound 3.00s = max(critical path 1.00s, total work 3.70s / 4, pool link 3.00s / 1, " \
           "exclusive 0.50s + the rest / 4)" in text, text
    text, data = report(graph, Costs([0.0] * 5, set(range(5)), set(), 1.0), [4], incremental=True)
    assert "critical path (0.00s): (nothing to run)" in text and data["critical_path"] == [], text
