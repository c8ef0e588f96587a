"""A/B of clean or one-changed builds: Ninja and buildtool from several installs, interleaved.

    python bench/ab.py W1 1000 7 /tmp/venv-before/bin/python /tmp/venv-after/bin/python
    python bench/ab.py W2 2000 5 /tmp/venv-after/bin/python
    python bench/ab.py W2:change 2000 15 /tmp/venv-after/bin/python

Generates the workload (bench/workloads.py) once, then for each round runs Ninja and each
interpreter's ``buildtool build`` (the console script beside the interpreter, else
``python -m buildtool``), in an order rotated each round, after a ``sync``: from an empty
cache and state, or with ``:change`` after editing the source of the "one source changed"
scenario (every tool built once beforehand, untimed); each variant has its own workspace
and cache.  Prints each variant's median wall and CPU time (user+sys, its commands
included) and the ratio to Ninja's median wall time.
For a before/after check of one change with less noise than a whole ``run.py`` scenario:
more rounds, nothing else in between.
"""

from __future__ import annotations

import os
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
    kind, _, scenario = argv[0].partition(":") if argv else ("", "", "")
    if len(argv) < 4 or kind not in ("W1", "W2") or scenario not in ("", "change"):
        print(__doc__, file=sys.stderr)
        return 2
    n, rounds, pythons = int(argv[1]), int(argv[2]), argv[3:]
    workload = wl.w1_copy(n) if kind == "W1" else wl.w2_dag(n)
    source = wl.pick_changed_source(workload) if scenario == "change" else None
    ninja, bt = ALL_TOOLS["ninja"](), ALL_TOOLS["buildtool"]()
    base = Path(tempfile.mkdtemp(prefix="buildtool-ab-"))
    try:
        variants = [("ninja", ninja, None)] + [(f"buildtool[{i}]", bt, py) for i, py in enumerate(pythons)]
        # A workspace (and cache) per variant: installs of different versions must not read
        # each other's state files (a format change would cost one of them a rehash).
        spaces = {name: sc.make_workspaces(workload, [tool], base / name)[tool.name] for name, tool, _ in variants}
        walls: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        cpus: dict[str, list[float]] = {name: [] for name, _, _ in variants}  # user+sys, with the commands
        edits = iter(range(1_000_000))
        for r in range(-1 if source else 0, rounds):  # round -1: the untimed first builds
            k = max(r, 0) % len(variants)  # rotated each round: no variant always follows the same one
            for name, tool, py in variants[k:] + variants[:k]:
                ws = spaces[name]
                if source is None:
                    sc.clear_outputs(ws)
                    tool.reset_state(ws)
                elif r >= 0:
                    data = f"changed {next(edits)}\n".encode()
                    (ws.root / source).write_bytes(data)
                    ws.sources[source] = data
                subprocess.run(["sync"], check=False)
                time.sleep(0.3)
                cmd = tool.argv(ws, 2)
                if py is not None:  # the same arguments, from that install
                    script = Path(py).parent / "buildtool"
                    head = [str(script)] if script.exists() else [py, "-m", "buildtool"]
                    cmd = [*head, *cmd[cmd.index("-C"):]]
                t0 = time.perf_counter()
                with tempfile.TemporaryFile() as log:
                    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ws.root)
                    _, status, usage = os.wait4(p.pid, 0)
                    wall = time.perf_counter() - t0
                    p.returncode = os.waitstatus_to_exitcode(status)
                    if p.returncode != 0:
                        log.seek(0)
                        print(f"{name} failed:\n{log.read().decode()[-4000:]}", file=sys.stderr)
                        return 1
                if r >= 0:
                    walls[name].append(wall)
                    cpus[name].append(usage.ru_utime + usage.ru_stime)
                sc.verify(ws)
        median = {name: sorted(v)[len(v) // 2] for name, v in walls.items()}
        for (name, _, py), v in zip(variants, walls.values(), strict=True):
            ratio = f"  {median[name] / median['ninja']:.2f}x ninja" if py is not None else ""
            cpu = sorted(cpus[name])[len(v) // 2]
            print(f"{name:14} median {median[name]:.3f} s{ratio}  cpu {cpu:.3f} s   "
                  f"[{' '.join(f'{x:.3f}' for x in sorted(v))}]" + (f"  {py}" if py else ""))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
