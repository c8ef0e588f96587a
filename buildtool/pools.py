"""Pools: which pooled targets may take a lane now (at most a pool's depth at once).

A target popped from the plan while its pool is full waits here, ordered as the plan
orders (priority, then longest remaining critical path, then id).  Every slot that comes
free sends the best waiter back to the plan: a pooled target's lane released, and also
an admitted target settled without taking a lane (up to date, restored inline, a group
in a pool), whose turn would otherwise be lost and its waiters stranded.  A target that
can be settled without a lane is settled at once, full pool or not (the scheduler asks
``would_wait`` first): it waited for a slot it would not use, and its dependents with it.  Per-run state,
shared by the scheduler and ``buildtool plan``'s simulation, so both follow one rule.
"""

from __future__ import annotations

import heapq

from buildtool.plan import Plan

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


class Pools:
    """Slots per pool name (``console`` has depth 1: its actions share the terminal);
    depth 0 or an unknown pool: unlimited."""

    def __init__(self, plan: Plan, pool_of: Sequence[str | None] | None, depth: Mapping[str, int] | None) -> None:
        self.plan = plan
        self.pool_of = pool_of
        self.depth = dict(depth or {})
        self.depth["console"] = 1
        self.use: dict[str, int] = {}
        self.waiting: dict[str, list[tuple[object, ...]]] = {}

    def admit(self, t: int) -> bool:
        """Whether ``t`` may start now; False: it waits here for a slot."""
        pool = self.pool_of[t] if self.pool_of else None
        if pool is None or self._has_room(pool):
            return True
        heapq.heappush(self.waiting.setdefault(pool, []), (self.plan.priority[t], -self.plan.critical[t], t))
        return False

    def would_wait(self, t: int) -> bool:
        """Whether ``admit(t)`` would make ``t`` wait (its pool is full), without queueing it."""
        pool = self.pool_of[t] if self.pool_of else None
        return pool is not None and not self._has_room(pool)

    def take(self, t: int) -> None:
        """``t`` starts on a lane: it holds a slot of its pool until ``release``."""
        pool = self.pool_of[t] if self.pool_of else None
        if pool is not None:
            self.use[pool] = self.use.get(pool, 0) + 1

    def release(self, t: int) -> None:
        """``t`` left its lane: its slot goes to the best waiter."""
        pool = self.pool_of[t] if self.pool_of else None
        if pool is not None:
            self.use[pool] -= 1
            self._pass_on(pool)

    def settled(self, t: int) -> None:
        """``t`` was admitted but settled without a lane: the turn it was given passes on."""
        pool = self.pool_of[t] if self.pool_of else None
        if pool is not None:
            self._pass_on(pool)

    def let_all_in(self) -> None:
        """Every waiter back to the plan, slots or not (the build stopped: nothing starts,
        and what needs no command is settled without a lane)."""
        for waiting in self.waiting.values():
            while waiting:
                self.plan.push(heapq.heappop(waiting)[2])  # type: ignore[arg-type]

    def _has_room(self, pool: str) -> bool:
        depth = self.depth.get(pool, 0)
        return depth <= 0 or self.use.get(pool, 0) < depth

    def _pass_on(self, pool: str) -> None:
        waiting = self.waiting.get(pool)
        if waiting and self._has_room(pool):
            self.plan.push(heapq.heappop(waiting)[2])  # type: ignore[arg-type]
