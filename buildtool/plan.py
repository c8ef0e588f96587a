"""Plan: which targets this run wants, which are ready, and in what order they start.

Pure per-run data, no I/O.  Ready targets sit in a heap keyed by
``(priority, -critical_path, arrival)``: lower ``priority`` first, then the longest
remaining path (seconds, from recorded durations) to the end of the build, then first-in
first-out.  Only targets whose dependencies are all done are pushed; finishing one
decrements its dependents' pending counts and releases those that reach zero.  Removing
or reprioritising a queued entry uses lazy deletion (mark removed, push a fresh entry,
skip removed entries on pop), as in the heapq documentation.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Sequence

REMOVED = -1


class Plan:
    """Dependency counts + ready heap over target ids ``0..n-1`` (a subset is wanted)."""

    def __init__(
        self,
        deps: Sequence[Sequence[int]],
        dependents: Sequence[Sequence[int]],
        wanted: Iterable[int],
        priority: Sequence[int],
        weight: Sequence[float],
    ) -> None:
        self.wanted: set[int] = set(wanted)
        self.priority = list(priority)
        self.dependents = dependents
        self.pending: dict[int, int] = {}
        self._heap: list[list[object]] = []
        self._entries: dict[int, list[object]] = {}
        self._counter = itertools.count()
        self.critical = critical_paths(deps, dependents, self.wanted, weight)
        self.done: set[int] = set()
        self.blocked: set[int] = set()  # transitively depends on a failed target
        ready = []
        for t in self.wanted:
            n = sum(1 for d in deps[t] if d in self.wanted)
            self.pending[t] = n
            if n == 0:
                ready.append(t)
        # Initial arrival order: by id, so the declaration order breaks remaining ties.
        for t in sorted(ready):
            self.push(t)

    def push(self, t: int) -> None:
        entry: list[object] = [self.priority[t], -self.critical[t], next(self._counter), t]
        self._entries[t] = entry
        heapq.heappush(self._heap, entry)

    def pop(self) -> int | None:
        """The best ready target, or None when nothing is ready."""
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            t = entry[3]
            if t == REMOVED:
                continue
            del self._entries[t]  # type: ignore[arg-type]
            return t  # type: ignore[return-value]
        return None

    def peek_all(self) -> list[int]:
        return [e[3] for e in sorted(self._heap) if e[3] != REMOVED]  # type: ignore[misc]

    def remove(self, t: int) -> bool:
        """Lazily drop a queued target; True if it was queued."""
        entry = self._entries.pop(t, None)
        if entry is None:
            return False
        entry[3] = REMOVED
        return True

    def reprioritise(self, t: int, priority: int) -> None:
        self.priority[t] = priority
        if self.remove(t):
            self.push(t)

    def has_ready(self) -> bool:
        return bool(self._entries)

    def finished(self, t: int) -> list[int]:
        """Mark ``t`` done; return the dependents it released (now queued)."""
        self.done.add(t)
        released = []
        pending = self.pending
        for c in self.dependents[t]:
            if c in pending:
                n = pending[c] - 1
                pending[c] = n
                if n == 0 and c not in self.blocked:
                    self.push(c)
                    released.append(c)
        return released

    def would_release(self, t: int) -> bool:
        """Would finishing ``t`` now make a dependent ready (``t`` its last pending dependency)?"""
        pending = self.pending
        return any(pending.get(c) == 1 and c not in self.blocked for c in self.dependents[t])

    def block_dependents(self, t: int) -> list[int]:
        """After ``t`` failed: every wanted target depending on it, transitively."""
        out = []
        stack = [t]
        while stack:
            x = stack.pop()
            for c in self.dependents[x]:
                if c in self.pending and c not in self.blocked:
                    self.blocked.add(c)
                    self.remove(c)
                    out.append(c)
                    stack.append(c)
        return out

    def drain(self) -> list[int]:
        """Remove and return everything still queued (used when stopping)."""
        out = []
        while (t := self.pop()) is not None:
            out.append(t)
        return out


def critical_paths(
    deps: Sequence[Sequence[int]],
    dependents: Sequence[Sequence[int]],
    wanted: set[int],
    weight: Sequence[float],
) -> dict[int, float]:
    """Longest path (sum of weights) from each wanted target to the end of the build."""
    # Kahn's algorithm from the sinks backwards over the wanted subgraph.
    out_count = {t: sum(1 for c in dependents[t] if c in wanted) for t in wanted}
    stack = [t for t, n in out_count.items() if n == 0]
    cp: dict[int, float] = {}
    while stack:
        t = stack.pop()
        best = 0.0
        for c in dependents[t]:
            if c in wanted:
                v = cp[c]
                if v > best:
                    best = v
        cp[t] = weight[t] + best
        for d in deps[t]:
            if d in wanted:
                n = out_count[d] - 1
                out_count[d] = n
                if n == 0:
                    stack.append(d)
    return cp
