"""Resources: exclusive targets and the -l load limit, driven by the scheduler's fakes
(real Scheduler, real worker threads, FakeRunner from test_scheduler)."""

from __future__ import annotations

import threading

from conftest import Workspace
from test_scheduler import FakeRunner, Recorder

from buildtool.loadlimit import LoadLimit
from buildtool.outcome import Status
from buildtool.plan import Plan
from buildtool.scheduler import Scheduler
from buildtool.status import Fanout


def _sched(n: int, *, jobs: int, exclusive: list[bool] | None = None, priority: list[int] | None = None,
           load: LoadLimit | None = None, pool_of: list[str | None] | None = None,
           pool_depth: dict[str, int] | None = None, **kw: object) -> tuple[Scheduler, FakeRunner, Recorder]:
    deps: list[list[int]] = [[] for _ in range(n)]
    plan = Plan(deps, [[] for _ in range(n)], range(n), priority or [0] * n, [1.0] * n)
    runner = FakeRunner(deps, pool_of=pool_of, **kw)  # type: ignore[arg-type]
    rec = Recorder()
    reporter = Fanout(rec, load) if load else rec
    sched = Scheduler(plan, runner, reporter, jobs=jobs, exclusive=exclusive, pool_of=pool_of,
                      pool_depth=pool_depth, can_start=load.can_start if load else None)
    return sched, runner, rec


def test_exclusive_target_runs_with_nothing_else_running() -> None:
    seen: dict[int, int] = {}
    holder: list[FakeRunner] = []

    def on_run(t: int) -> None:
        seen[t] = holder[0].total_running

    exclusive = [False, False, True, False, False, False]
    sched, runner, _ = _sched(6, jobs=4, exclusive=exclusive, sleep=0.05, on_run=on_run)
    holder.append(runner)
    outcomes = sched.run()
    assert all(o.status is Status.RAN for o in outcomes.values())
    assert seen[2] == 1, "the exclusive target shared the machine"
    # While it ran nobody else did: its interval overlaps no other target's.
    ex = outcomes[2]
    for t, o in outcomes.items():
        if t != 2:
            assert o.end <= ex.start + 1e-6 or o.start >= ex.end - 1e-6, (t, o.start, o.end, ex.start, ex.end)
    # Others did run in parallel before and after it.
    assert runner.max_total > 1


def test_exclusive_target_keeps_its_place_in_the_priority_order() -> None:
    # 0 runs; 1 (exclusive, most urgent of the rest) is held until 0 ends; nothing overtakes it.
    sched, runner, _ = _sched(4, jobs=3, exclusive=[False, True, False, False], priority=[0, 1, 2, 2], sleep=0.05)
    sched.run()
    assert runner.started[:2] == [0, 1]


def test_exclusive_in_a_pool() -> None:
    sched, runner, _ = _sched(
        4, jobs=4, exclusive=[False, False, False, True], pool_of=["p", "p", None, "p"], pool_depth={"p": 1},
        sleep=0.02,
    )
    outcomes = sched.run()
    assert len(outcomes) == 4 and all(o.ok for o in outcomes.values())
    assert runner.max_running.get("p") == 1


def test_load_limit_above_threshold_still_runs_one_job_at_a_time() -> None:
    calls = []

    def high() -> float:
        calls.append(1)
        return 99.0

    limit = LoadLimit(4.0, load=high, min_interval=0.0)
    sched, runner, _ = _sched(5, jobs=4, load=limit, sleep=0.02)
    outcomes = sched.run()
    assert len(outcomes) == 5 and all(o.ok for o in outcomes.values())
    assert runner.max_total == 1
    assert calls and limit.refusals > 0


def test_load_limit_below_threshold_does_not_limit() -> None:
    gate = threading.Barrier(3, timeout=10)

    def on_run(t: int) -> None:
        gate.wait()  # three targets must be running together, or this times out

    limit = LoadLimit(4.0, load=lambda: 0.5, min_interval=0.0)
    sched, runner, _ = _sched(3, jobs=3, load=limit, on_run=on_run)
    outcomes = sched.run()
    assert all(o.ok for o in outcomes.values())
    assert runner.max_total == 3


def test_a_pool_no_config_names_is_said_to_limit_nothing(workspace: Workspace) -> None:
    """pool="lnk" for a configured `link = 1` ran every such target at once without a
    word (Ninja: "unknown pool name"); it still limits nothing, as documented, but says so."""
    workspace.write("buildtool.toml", "[pools]\nlink = 1\n")
    workspace.build_file("", 'genrule(name="a", outs=["a"], pool="lnk", cmd="echo > $@")\n'
                             'genrule(name="b", outs=["b"], pool="lnk", cmd="echo > $@")\n'
                             'genrule(name="c", outs=["c"], pool="link", cmd="echo > $@")\n'
                             'genrule(name="d", outs=["d"], pool="console", cmd="echo > $@")\n')
    rc, out, err = workspace.run("build")
    assert rc == 0, out + err
    assert err.count("pool 'lnk' of //:a, //:b is not configured in [pools], so it limits nothing; "
                     "did you mean 'link'?") == 1, err
    assert "'link' of" not in err and "'console' of" not in err, err
