"""Explain: ``buildtool explain PATTERN`` — for each target, why the next build would run
it or not, computed without running anything.

The decisions come from ``session.dry_run`` (the rebuilder's own checks against this
workspace's build record): the same code the build uses, so the explanation cannot drift
from what a build does.  This module only turns those outcomes into the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO

from buildtool import rebuild
from buildtool.console import escape_controls, targets
from buildtool.graph import Graph
from buildtool.outcome import Outcome, Reason, Status

RUN, RESTORE, FRESH, GROUP, FAIL = "run", "restore", "up to date", "group", "fail"
NOT_RUN, CACHED = "not run", "cached pass"  # (tests: what `build` and `test` say of them)


def verdict(o: Outcome) -> str:
    """run | restore | up to date | group | fail, for a dry-run outcome."""
    if o.reason is Reason.GROUP:
        return GROUP
    if o.status is Status.UP_TO_DATE:
        return FRESH
    if o.extra.get("would_restore"):
        return RESTORE
    if o.message.startswith("would fail"):
        return FAIL
    return RUN


def reason_text(o: Outcome) -> str:
    msg = o.message
    for prefix in ("would run: ", "would fail: ", "would restore from the cache: "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if o.extra.get("would_restore") and o.status is not Status.UP_TO_DATE:
        msg += "; the cache has this key, so it would be restored"
    return msg


def report(graph: Graph, outcomes: Mapping[int, Outcome], out: IO[str]) -> dict[str, int]:
    """Print one block per target, dependencies first (the dry run's order); return the
    count per verdict."""
    counts: dict[str, int] = {}
    width = max((len(graph.targets[t].label) for t in outcomes), default=0)
    for t, o in outcomes.items():
        v = verdict(o)
        why = reason_text(o)
        if o.reason is Reason.TEST_NOT_RUN:
            v = NOT_RUN
        elif v == RESTORE and graph.targets[t].kind == "test":
            v = CACHED
            why = why.replace("; the cache has this key, so it would be restored", "") + \
                "; its pass with this key is in the cache, so it would not run"
        elif v == FRESH and o.reason is Reason.ADOPTED:  # the key changed, the outputs are the entry's
            why = why.removeprefix("up to date: ")
            if graph.targets[t].kind == "test":  # (a test has no outputs: the entry is its pass)
                v = CACHED
                why = why.split(", but the outputs")[0].split(", but the cache holds a pass")[0] + \
                    "; its pass with this key is in the cache, so it would not run"
        elif v == FRESH and graph.targets[t].kind == "test":  # as `test` prints it
            v = CACHED
            why = "same action key as its last pass in this workspace, so it would not run"
        elif v == FRESH:
            why = rebuild.UNCHANGED
        elif v == GROUP:
            members = [graph.targets[d].label for d in graph.targets[t].deps]
            why = ("runs nothing; builds " + ", ".join(members[:5]) + (" ..." if len(members) > 5 else "")
                   if members else "runs nothing; it has no members")
        counts[v] = counts.get(v, 0) + 1
        label = graph.targets[t].label
        word = {RUN: "WOULD RUN", RESTORE: "WOULD RESTORE", FRESH: "up to date", GROUP: "group",
                FAIL: "WOULD FAIL", NOT_RUN: "not run", CACHED: "PASSED (cached)"}[v]
        print(f"{label:<{width}}  {word}: {escape_controls(why)}", file=out)
    total = sum(counts.values())
    parts = [f"{counts[k]} {k}" for k in (RUN, RESTORE, FRESH, FAIL, CACHED, NOT_RUN) if counts.get(k)]
    if counts.get(GROUP):  # (left out, the parts did not add up to the total)
        parts.append(f"{counts[GROUP]} group{'s' if counts[GROUP] > 1 else ''}")
    print(f"explain: {targets(total)}: {', '.join(parts) or 'nothing'} (nothing was run)", file=out)
    return counts
