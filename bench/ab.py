"""A/B of clean builds: Ninja and buildtool from several interpreters, interleaved.

    python bench/ab.py W1 1000 7 /tmp/venv-before/bin/python /tmp/venv-after/bin/python
    python bench/ab.py W2 2000 5 /tmp/venv-after/bin/python

Generates the workload (bench/workloads.py) once, then for each round runs Ninja and each
interpreter's ``python -m buildtool build`` from an empty cache and state, in the same
order, after a ``sync``; prints each variant's median and the ratio to Ninja's median.
For a before/after check of one change with less noise than a whole ``run.py`` scenario:
more rounds, nothing else in between.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios as sc
import workloads as wl
from tools import ALL_TOOLS


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] not in ("W1", "W2"):
        print(__doc__, file=sys.stderr)
        return 2
    kind, n, rounds, pythons = argv[0], int(argv[1]), int(argv[2]), argv[3:]
    workload = wl.w1_copy(n) if kind == "W1" else wl.w2_dag(n)
    ninja, bt = ALL_TOOLS["ninja"](), ALL_TOOLS["buildtool"]()
    base = Path(tempfile.mkdtemp(prefix="buildtool-ab-"))
    try:
        spaces = sc.make_workspaces(workload, [ninja, bt], base)
        variants = [("ninja", ninja, None)] + [(f"buildtool[{i}]", bt, py) for i, py in enumerate(pythons)]
        walls: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        for _ in range(rounds):
            for name, tool, py in variants:
                ws = spaces[tool.name]
                sc.clear_outputs(ws)
                tool.reset_state(ws)
                subprocess.run(["sync"], check=False)
                time.sleep(0.3)
                cmd = tool.argv(ws, 2)
                if py is not None:  # the same arguments after "-m buildtool"
                    cmd = [py, "-m", "buildtool", *cmd[cmd.index("-C"):]]
                t0 = time.perf_counter()
                p = subprocess.run(cmd, capture_output=True, cwd=ws.root, check=False)
                walls[name].append(time.perf_counter() - t0)
                if p.returncode != 0:
                    print(f"{name} failed:\n{p.stdout.decode()[-2000:]}{p.stderr.decode()[-2000:]}", file=sys.stderr)
                    return 1
                sc.verify(ws)
        median = {name: sorted(v)[len(v) // 2] for name, v in walls.items()}
        for (name, _, py), v in zip(variants, walls.values(), strict=True):
            ratio = f"  {median[name] / median['ninja']:.2f}x ninja" if py is not None else ""
            print(f"{name:14} median {median[name]:.3f} s{ratio}   [{' '.join(f'{x:.3f}' for x in sorted(v))}]"
                  + (f"  {py}" if py else ""))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
