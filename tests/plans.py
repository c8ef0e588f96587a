"""A Plan built from a plain dependency list, for the plan and scheduler unit tests."""

from __future__ import annotations

from collections.abc import Sequence

from buildtool.plan import Plan


def make_plan(
    deps: Sequence[Sequence[int]],
    priority: Sequence[int] | None = None,
    weight: Sequence[float] | None = None,
    wanted: Sequence[int] | None = None,
) -> Plan:
    """A Plan of ``deps`` (target -> its dependencies), wanting ``wanted`` (default: all)."""
    n = len(deps)
    dependents: list[list[int]] = [[] for _ in range(n)]
    for t, ds in enumerate(deps):
        for d in ds:
            dependents[d].append(t)
    return Plan(
        deps,
        dependents,
        range(n) if wanted is None else wanted,
        priority if priority is not None else [0] * n,
        weight if weight is not None else [1.0] * n,
    )
