"""Profiler harness: where buildtool spends a build of a generated workload.

    python bench/profile.py --n 10000 --scenario noop       # cProfile + import times
    python bench/profile.py --workload W2 --scenario change --top 40

Generates the workspace (W1 with ``--n`` targets, or W2), brings it to the state the
scenario needs with untimed runs, then runs ``buildtool build`` once under ``cProfile`` and
once under ``-X importtime`` and prints the top functions and the slowest imports.
Scenarios: ``noop`` (nothing changed), ``noop-cold`` (``.buildtool/noop`` snapshot
deleted, so the graph is loaded and every target checked), ``change`` (one source
edited), ``clean`` (empty cache and state), ``restore`` (every output deleted, cache kept:
W6).
"""

from __future__ import annotations

import argparse
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads as wl
from measure import child_env
from tools import Buildtool, Workspace


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=("W1", "W2"), default="W1")
    p.add_argument("--n", type=int, default=10_000, help="W1 targets")
    p.add_argument("--scenario", choices=("noop", "noop-cold", "change", "clean", "restore"), default="noop")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--work", type=Path, default=None)
    return p.parse_args(argv)


def setup(args: argparse.Namespace, base: Path) -> tuple[Buildtool, Workspace]:
    tool = Buildtool()
    if not tool.available():
        sys.exit("buildtool is not installed")
    work = wl.w1_copy(args.n) if args.workload == "W1" else wl.w2_dag()
    root = base / work.name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    wl.write_sources(root, work.sources)
    tool.write(root, work)
    ws = Workspace(root, work, dict(work.sources), base / "cache")
    for _ in range(2):
        run(tool.argv(ws, 2), root)
    return tool, ws


def prepare(scenario: str, tool: Buildtool, ws: Workspace) -> None:
    if scenario == "noop-cold":
        (ws.root / ".buildtool" / "noop").unlink(missing_ok=True)
    elif scenario == "change":
        source = wl.pick_changed_source(ws.workload)
        (ws.root / source).write_text(f"changed {time.time()}\n")
    elif scenario in ("clean", "restore"):
        shutil.rmtree(ws.root / wl.OUT_DIR)
        (ws.root / wl.OUT_DIR).mkdir()
        if scenario == "clean":
            tool.reset_state(ws)


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=child_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return proc


def build_args(tool: Buildtool, ws: Workspace) -> list[str]:
    return tool.argv(ws, 2)[len(tool.base_argv()) :]


def profile(tool: Buildtool, ws: Workspace, scenario: str, top: int, base: Path) -> None:
    prof = base / "build.prof"
    prepare(scenario, tool, ws)
    t0 = time.perf_counter()
    # Not ``-m buildtool``: the command ends in os._exit (cli.run), before cProfile writes.
    script = base / "profiled_build.py"
    script.write_text("import sys\nfrom buildtool.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    run([sys.executable, "-m", "cProfile", "-o", str(prof), str(script), *build_args(tool, ws)], ws.root)
    print(f"== cProfile of one {scenario} build: {time.perf_counter() - t0:.3f} s wall (with profiler overhead)")
    stats = pstats.Stats(str(prof))
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def importtime(tool: Buildtool, ws: Workspace, scenario: str, top: int) -> None:
    prepare(scenario, tool, ws)
    proc = run([sys.executable, "-X", "importtime", "-m", "buildtool", *build_args(tool, ws)], ws.root)
    rows = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _self, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append((int(cumulative), name.rstrip()))
    rows.sort(reverse=True)
    total = sum(c for c, name in rows if not name.startswith("  "))  # depth 1: top level
    print(f"== -X importtime: {total / 1000:.1f} ms in top-level imports; slowest:")
    for cumulative, name in rows[:top]:
        print(f"{cumulative / 1000:8.1f} ms  {name}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    base = args.work or Path(tempfile.mkdtemp(prefix="buildtool-profile-"))
    try:
        tool, ws = setup(args, base)
        profile(tool, ws, args.scenario, args.top, base)
        importtime(tool, ws, args.scenario, args.top)
    finally:
        if args.work is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
