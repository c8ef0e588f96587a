"""Benchmark runner: buildtool side by side with make, ninja, doit and SCons.

    python bench/run.py --smoke            # every workload at tiny size, outputs checked
    python bench/run.py --quick            # the headline sizes, fewer rounds (~15 min)
    python bench/run.py --full             # everything, W1 up to 100,000 targets
    python bench/run.py --quick --tools make,ninja,buildtool --only W1,W2 --out /tmp/r

Writes ``results.md`` and ``results.json`` to ``--out`` (default bench/results/).  Exits 1
when a tool failed, produced wrong outputs, or the tools disagreed; 2 on bad arguments.
See docs/benchmarks.md for what each workload and scenario measures.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report
import scenarios as sc
import workloads as wl
from measure import Timer
from tools import ALL_TOOLS, Tool

REQUIRED = ("make", "buildtool")


@dataclass(frozen=True, slots=True)
class Mode:
    """Sizes, rounds and timing policy of one run mode."""

    name: str
    w1_sizes: tuple[int, ...]
    w1_clean_rounds: dict[int, int]
    w2_targets: int
    w3: tuple[int, float, float]  # targets, shortest and longest sleep
    w4_bytes: int
    w5_n: int
    w6_n: int
    rounds: int
    w3_rounds: int
    startup_rounds: int
    startup_venv: bool
    timer: Timer = field(default_factory=Timer)


MODES = {
    "smoke": Mode(
        "smoke",
        (20,),
        {20: 1},
        50,
        (8, 0.01, 0.05),
        4 << 20,
        20,
        20,
        rounds=1,
        w3_rounds=1,
        startup_rounds=3,
        startup_venv=False,
        timer=Timer(quiet_wait=0, retries=0, limit=30),
    ),
    "quick": Mode(
        "quick",
        (1000, 10_000),
        {1000: 3, 10_000: 1},
        2000,
        (60, 0.05, 0.5),
        1 << 30,
        10_000,
        10_000,
        rounds=3,
        w3_rounds=1,
        startup_rounds=10,
        startup_venv=True,
        timer=Timer(quiet_wait=2, retries=1, limit=60),
    ),
    "full": Mode(
        "full",
        (1000, 10_000, 100_000),
        {1000: 5, 10_000: 3, 100_000: 1},
        2000,
        (60, 0.05, 0.5),
        1 << 30,
        10_000,
        10_000,
        rounds=5,
        w3_rounds=3,
        startup_rounds=20,
        startup_venv=True,
        timer=Timer(quiet_wait=10, retries=2, limit=300),
    ),
}
WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "startup")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    for name in MODES:
        mode.add_argument(f"--{name}", dest="mode", action="store_const", const=name)
    p.add_argument("--tools", default=",".join(ALL_TOOLS), help="comma-separated subset of: " + ", ".join(ALL_TOOLS))
    p.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated subset of: " + ", ".join(WORKLOADS))
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument(
        "--work", type=Path, default=None, help="scratch directory (default: a fresh temp dir, deleted afterwards)"
    )
    p.add_argument("-j", "--jobs", type=int, default=2)
    args = p.parse_args(argv)
    args.mode = args.mode or "quick"
    return args


def select_tools(names: str) -> tuple[list[Tool], list[str]]:
    """The available tools among ``names``; and the problems (a required tool missing)."""
    tools, problems = [], []
    for name in names.split(","):
        if name not in ALL_TOOLS:
            problems.append(f"unknown tool {name!r}")
            continue
        tool = ALL_TOOLS[name]()
        if tool.available():
            tools.append(tool)
        elif name in REQUIRED:
            problems.append(f"{name} is required but was not found")
        else:
            print(f"skipping {name}: not installed", file=sys.stderr)
    return tools, problems


def plan(mode: Mode, bench: sc.Bench, only: set[str]) -> list[tuple[str, Callable[[], list[sc.Result]]]]:
    """The scenarios to run, in order, as (name, thunk) pairs."""
    steps: list[tuple[str, Callable[[], list[sc.Result]]]] = []
    if "startup" in only:
        steps.append(("start-up", lambda: [sc.startup(bench, mode.startup_rounds, mode.startup_venv)]))
    if "W1" in only:
        for n in mode.w1_sizes:
            steps.append(
                (f"W1-{n}", lambda n=n: sc.classic(bench, wl.w1_copy(n), mode.w1_clean_rounds[n], mode.rounds))
            )
    if "W2" in only:
        steps.append(("W2", lambda: sc.classic(bench, wl.w2_dag(mode.w2_targets), mode.rounds, mode.rounds)))
    if "W3" in only:
        n, lo, hi = mode.w3
        steps.append(("W3", lambda: [sc.scheduling(bench, wl.w3_sleeps(n, lo, hi), mode.w3_rounds)]))
    if "W4" in only:
        # Three times the rounds, as W5: a round takes about a second, and its figure is a
        # difference of two short runs (five rounds spread 0.77x-1.16x in the 9bf704c run).
        steps.append(("W4", lambda: [sc.hashing(bench, mode.w4_bytes, 3 * mode.rounds)]))
    if "W5" in only:
        steps.append(("W5", lambda: [sc.watch_latency(bench, mode.w5_n, 3 * mode.rounds)]))
    if "W6" in only:
        steps.append(("W6", lambda: [sc.restore(bench, mode.w6_n, mode.rounds)]))
    return steps


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import os

    return f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}"


def meta_for(args: argparse.Namespace, argv: list[str], tools: list[Tool]) -> dict[str, object]:
    return {
        "mode": args.mode,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python bench/run.py", *argv]),
        "machine": machine(),
        "python": sys.version.split()[0],
        "jobs": args.jobs,
        "rounds": MODES[args.mode].rounds,
        "tools": [t.name for t in tools],
        "versions": {t.name: t.version() for t in tools},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    tools, problems = select_tools(args.tools)
    unknown = set(args.only.split(",")) - set(WORKLOADS)
    problems += [f"unknown workload {w!r}" for w in sorted(unknown)]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    mode = MODES[args.mode]
    work = args.work or Path(tempfile.mkdtemp(prefix="buildtool-bench-"))
    bench = sc.Bench(tools, mode.timer, work, jobs=args.jobs)
    meta = meta_for(args, argv, tools)
    results: list[sc.Result] = []
    failed = False
    started = time.perf_counter()
    try:
        for name, step in plan(mode, bench, set(args.only.split(","))):
            t0 = time.perf_counter()
            print(f"[{time.perf_counter() - started:6.1f}s] {name} ...", file=sys.stderr)
            try:
                results += step()
            except Exception as exc:  # a failed step must not hide the others
                traceback.print_exc()
                results.append(sc.Result(name, name, "failed", args.jobs, [], error=str(exc)))
            failed |= any(r.error and r.scenario != "watch latency" for r in results)
            print(f"         {name} done in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
            report.write(args.out, meta, results)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out / 'results.md'} and results.json in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
