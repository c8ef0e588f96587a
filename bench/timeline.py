"""Where the scheduler's thread spends one build: count and time of its main steps.

    cd WORKSPACE && python /path/to/bench/timeline.py build //... -j2

Runs ``buildtool`` in this process with the runner's and the scheduler's steps wrapped in
timers (``try_inline``, ``start`` and within it the spawn, ``complete``, the deferred
cache stores, each wait in ``poll``), then prints their totals and when the first command
started and the last one finished.  For a build where one thread does the scheduling,
the sum of the steps against the scheduling window shows whether that thread or the
commands set the pace (docs/benchmarks.md).  Not a profiler: nothing else is timed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from buildtool import cli, executor, runner, scheduler

T0 = time.perf_counter()
LOG: list[tuple[str, float, float]] = []  # (step, start, duration) in seconds since T0


def _timed(owner: Any, name: str, step: str) -> None:
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            LOG.append((step, t - T0, time.perf_counter() - t))

    setattr(owner, name, wrapper)


def main(argv: list[str]) -> int:
    _timed(runner.TargetRunner, "try_inline", "try_inline")
    _timed(runner.TargetRunner, "start", "start (whole)")
    _timed(executor.SubprocessExecutor, "start", "  of which spawn")
    _timed(runner.TargetRunner, "complete", "complete")
    _timed(scheduler.Scheduler, "_run_after", "cache store")
    _timed(scheduler.Scheduler, "_poll_once", "poll round (incl. completes, stores)")
    rc = cli.main(argv)
    end = time.perf_counter() - T0
    totals: dict[str, list[float]] = {}
    for step, _, d in LOG:
        t = totals.setdefault(step, [0, 0.0])
        t[0] += 1
        t[1] += d
    out = sys.stderr
    print(f"\nwhole run {end * 1e3:.1f} ms (after imports)", file=out)
    for step, (n, d) in totals.items():
        print(f"  {step:40} n={int(n):6}  {d * 1e3:9.1f} ms  {d * 1e3 / n:7.3f} ms each", file=out)
    starts = [t for step, t, _ in LOG if step == "start (whole)"]
    ends = [t + d for step, t, d in LOG if step == "complete"]
    if starts and ends:
        print(f"  first start at {min(starts) * 1e3:.1f} ms, last complete at {max(ends) * 1e3:.1f} ms", file=out)
    return rc


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the command itself does: no interpreter teardown
