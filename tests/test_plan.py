"""Plan: the ready heap keyed by (priority, -critical path, arrival), lazy deletion,
dependency counting and critical paths.  Pure unit tests, no I/O."""

from __future__ import annotations

import pytest
from plans import make_plan

from buildtool.plan import Plan, critical_paths


def pop_all(plan: Plan) -> list[int]:
    out = []
    while (t := plan.pop()) is not None:
        out.append(t)
    return out


def test_lower_priority_first() -> None:
    plan = make_plan([[], [], []], priority=[5, -1, 2])
    assert pop_all(plan) == [1, 2, 0]


def test_equal_priority_longest_critical_path_first() -> None:
    # 0 and 1 are ready; 0 leads to a chain of weight 10, 1 to a chain of weight 3.
    deps = [[], [], [0], [1]]
    plan = make_plan(deps, weight=[1, 1, 10, 3])
    assert plan.critical[0] == pytest.approx(11)
    assert plan.critical[1] == pytest.approx(4)
    assert plan.pop() == 0
    assert plan.pop() == 1


def test_priority_beats_critical_path() -> None:
    deps = [[], [], [0]]
    plan = make_plan(deps, priority=[1, 0, 1], weight=[1, 1, 100])
    assert pop_all(plan) == [1, 0]


def test_full_ties_are_fifo_by_arrival() -> None:
    plan = make_plan([[]] * 5)
    assert pop_all(plan) == [0, 1, 2, 3, 4]
    # Later arrivals come after earlier ones with the same key.
    for t in (3, 1, 4):
        plan.push(t)
    assert pop_all(plan) == [3, 1, 4]


def test_only_ready_targets_are_queued_and_finishing_releases_dependents() -> None:
    # 2 needs 0 and 1; 3 needs 2.
    deps = [[], [], [0, 1], [2]]
    plan = make_plan(deps)
    assert sorted(plan.peek_all()) == [0, 1]
    assert plan.pending == {0: 0, 1: 0, 2: 2, 3: 1}
    a = plan.pop()
    assert plan.finished(a) == []  # type: ignore[arg-type]
    b = plan.pop()
    assert plan.pop() is None
    assert plan.finished(b) == [2]  # type: ignore[arg-type]
    assert plan.pop() == 2
    assert plan.finished(2) == [3]
    assert pop_all(plan) == [3]


def test_unwanted_dependencies_do_not_block() -> None:
    deps = [[], [0]]
    plan = make_plan(deps, wanted=[1])
    assert pop_all(plan) == [1]


def test_lazy_deletion_skips_removed_entries() -> None:
    plan = make_plan([[]] * 4)
    heap_before = len(plan._heap)
    assert plan.remove(1) is True
    assert plan.remove(1) is False  # already removed
    assert len(plan._heap) == heap_before  # not rebuilt: marked, skipped on pop
    assert 1 not in plan.peek_all()
    assert pop_all(plan) == [0, 2, 3]
    assert plan.remove(0) is False  # not queued any more


def test_reprioritise_moves_a_queued_entry() -> None:
    plan = make_plan([[]] * 3)
    plan.reprioritise(2, -5)
    assert plan.has_ready()
    assert pop_all(plan) == [2, 0, 1]
    assert not plan.has_ready()


def test_reprioritise_of_unqueued_target_only_records_priority() -> None:
    deps = [[], [0]]
    plan = make_plan(deps)
    plan.reprioritise(1, -3)  # not ready yet: nothing pushed
    assert pop_all(plan) == [0]
    plan.finished(0)
    assert plan.peek_all() == [1]
    assert plan.priority[1] == -3


def test_has_ready_ignores_removed_entries() -> None:
    plan = make_plan([[]])
    plan.remove(0)
    assert not plan.has_ready()
    assert plan.pop() is None


def test_block_dependents_is_transitive_and_drops_queued() -> None:
    # 1 and 2 depend on 0; 3 depends on 1; 4 is independent.
    deps = [[], [0], [0], [1], []]
    plan = make_plan(deps)
    assert sorted(plan.block_dependents(0)) == [1, 2, 3]
    assert plan.blocked == {1, 2, 3}
    plan.pop()
    plan.finished(0)  # even if 0 "finished", blocked ones are not released
    assert pop_all(plan) == [4]


def test_drain_returns_everything_queued() -> None:
    plan = make_plan([[]] * 3, priority=[2, 1, 0])
    plan.remove(1)
    assert plan.drain() == [2, 0]
    assert plan.pop() is None


def test_critical_paths_longest_path_to_the_end() -> None:
    #   0 -> 1 -> 3
    #   0 -> 2 -> 3,   weights 1, 5, 2, 1
    deps = [[], [0], [0], [1, 2]]
    dependents = [[1, 2], [3], [3], []]
    cp = critical_paths(deps, dependents, {0, 1, 2, 3}, [1, 5, 2, 1])
    assert cp == {3: 1, 1: 6, 2: 3, 0: 7}


def test_critical_paths_only_over_wanted() -> None:
    deps = [[], [0]]
    dependents = [[1], []]
    cp = critical_paths(deps, dependents, {0}, [2, 100])
    assert cp == {0: 2}


def test_seed_example_order_with_one_worker() -> None:
    """A(p2), B(p1), C(p1, needs A), D(p3, needs A), E(p1, needs B, C): B A C E D."""
    A, B, C, D, E = range(5)
    deps = [[], [], [A], [A], [B, C]]
    plan = make_plan(deps, priority=[2, 1, 1, 3, 1], weight=[3, 2, 4, 2, 1])
    order = []
    while (t := plan.pop()) is not None:
        order.append(t)
        plan.finished(t)
    assert order == [B, A, C, E, D]


def test_would_release_counts_only_wanted_dependents_whose_last_pending_dependency_it_is() -> None:
    """The lane hook asks before the scheduler finishes ``t``; a dependent outside ``wanted``
    (an incremental build's focus) has no pending count and is never released."""
    plan = Plan(deps=[[], [0], [0], [0, 1]], dependents=[[1, 2, 3], [3], [], []], wanted={0, 2, 3},
                priority=[0] * 4, weight=[1.0] * 4)
    assert plan.pending == {0: 0, 2: 1, 3: 1}  # (1 is not wanted: 3 waits on 0 alone)
    assert plan.would_release(0) is True  # 2 and 3 have 0 as their last pending dependency
    alone = Plan(deps=[[], [0]], dependents=[[1], []], wanted={0}, priority=[0, 0], weight=[1.0, 1.0])
    assert alone.would_release(0) is False  # (1 outside wanted: nothing to release, no TypeError)
    two = Plan(deps=[[], [], [0, 1]], dependents=[[2], [2], []], wanted={0, 1, 2}, priority=[0] * 3,
               weight=[1.0] * 3)
    assert two.would_release(0) is False  # 2 still waits on 1
