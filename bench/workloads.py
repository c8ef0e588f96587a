"""Workload graphs for the benchmark suite: what every tool must build, tool-independently.

A workload is a list of targets.  Each target writes exactly one output file from its inputs
with one shell command; the command text is the same for every tool (each tool's generator
renders it with its own placeholders, which expand to the same string).  All paths are
relative to the workspace root, and every target lives in the root package, so "run in the
package directory" and "run in the workspace root" are the same place.

Kinds of command:
  cp      ``cp IN OUT``                        (W1, one input)
  cat     ``cat IN1 IN2 ... > OUT``            (W2, W4 uses ``stat``)
  sleep   ``sleep D && cat IN1 ... > OUT``     (W3)
  stat    ``stat -c %s IN1 ... > OUT``         (W4: sizes only, so the inputs are not read)
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

SRC_DIR = "src"
OUT_DIR = "out"


@dataclass(frozen=True, slots=True)
class Target:
    """One command that turns its inputs into a single output file."""

    name: str
    inputs: tuple[str, ...]  # workspace-relative paths, sources and other targets' outputs
    deps: tuple[str, ...]  # names of the targets whose outputs appear in ``inputs``
    output: str
    kind: str  # "cp" | "cat" | "sleep" | "stat"
    seconds: float = 0.0  # for "sleep"

    def shell(self) -> str:
        """The exact shell command every tool ends up running."""
        ins = " ".join(self.inputs)
        if self.kind == "cp":
            return f"cp {ins} {self.output}"
        if self.kind == "cat":
            return f"cat {ins} > {self.output}"
        if self.kind == "sleep":
            return f"sleep {self.seconds:.3f} && cat {ins} > {self.output}"
        if self.kind == "stat":
            return f"stat -c %s {ins} > {self.output}"
        msg = f"unknown target kind {self.kind!r}"
        raise ValueError(msg)


@dataclass(slots=True)
class Workload:
    """A named set of targets plus the initial content of its source files.

    ``uniform_cp`` marks W1: N independent ``cp src/i.txt out/i.txt`` targets, which the
    generators emit as a loop (or pattern rule) instead of N explicit declarations.
    """

    name: str
    targets: list[Target]
    sources: dict[str, bytes]
    uniform_cp: bool = False
    big_sources: dict[str, int] = field(default_factory=dict)  # path -> size, written lazily

    def source_paths(self) -> list[str]:
        return [*self.sources, *self.big_sources]

    def output_paths(self) -> list[str]:
        return [t.output for t in self.targets]


def w1_copy(n: int) -> Workload:
    """W1: ``n`` independent targets, each copying one small file."""
    sources = {f"{SRC_DIR}/{i}.txt": f"source {i}\n".encode() for i in range(n)}
    targets = [Target(f"t{i}", (f"{SRC_DIR}/{i}.txt",), (), f"{OUT_DIR}/{i}.txt", "cp") for i in range(n)]
    return Workload(f"W1-{n}", targets, sources, uniform_cp=True)


def _layered_dag(
    rng: random.Random, n_targets: int, n_layers: int, n_sources: int
) -> list[tuple[list[int], list[int]]]:
    """Per target: (source indices, dependency target indices), targets in layer order."""
    per_layer = max(1, n_targets // n_layers)
    layers: list[list[int]] = []
    plan: list[tuple[list[int], list[int]]] = []
    for i in range(n_targets):
        layer = min(i // per_layer, n_layers - 1)
        if layer == len(layers):
            layers.append([])
        srcs: list[int] = []
        deps: list[int] = []
        if layer == 0:
            srcs = rng.sample(range(n_sources), k=min(n_sources, rng.randint(1, 3)))
        else:
            prev = layers[layer - 1]
            deps = rng.sample(prev, k=min(len(prev), rng.randint(1, 2)))
            if rng.random() < 0.3:
                earlier = [t for lay in layers[:layer] for t in lay]
                extra = rng.choice(earlier)
                if extra not in deps:
                    deps.append(extra)
            if rng.random() < 0.2:
                srcs = [rng.randrange(n_sources)]
        layers[layer].append(i)
        plan.append((srcs, deps))
    return plan


def w2_dag(n_targets: int = 2000, seed: int = 2) -> Workload:
    """W2: a random layered DAG (fixed seed); each command concatenates its inputs."""
    rng = random.Random(seed)
    n_sources = max(4, n_targets // 10)
    n_layers = max(2, min(10, n_targets // 5))
    sources = {f"{SRC_DIR}/{i}.txt": f"s{i}\n".encode() for i in range(n_sources)}
    targets = []
    for i, (srcs, deps) in enumerate(_layered_dag(rng, n_targets, n_layers, n_sources)):
        inputs = [f"{SRC_DIR}/{s}.txt" for s in srcs] + [f"{OUT_DIR}/t{d}.txt" for d in deps]
        targets.append(Target(f"t{i}", tuple(inputs), tuple(f"t{d}" for d in deps), f"{OUT_DIR}/t{i}.txt", "cat"))
    return Workload(f"W2-{n_targets}", targets, sources)


def w3_sleeps(
    n_targets: int = 60, lo: float = 0.05, hi: float = 0.5, seed: int = 147, window_size: int = 4
) -> Workload:
    """W3: a random DAG of ``sleep`` commands, to measure scheduling quality at -j2.

    The default seed gives a critical path close to total work / 2 (9.15 s vs 9.08 s), so
    that the order in which ready targets start decides the makespan.
    """
    rng = random.Random(seed)
    sources = {f"{SRC_DIR}/{i}.txt": f"s{i}\n".encode() for i in range(n_targets)}
    targets: list[Target] = []
    for i in range(n_targets):
        seconds = round(rng.uniform(lo, hi), 3)
        # Dependencies among the few previous targets give long chains (a long critical path).
        window = range(max(0, i - window_size), i)
        deps = sorted(rng.sample(window, k=min(len(window), rng.choice((0, 1, 1, 2)))))
        inputs = [f"{SRC_DIR}/{i}.txt"] + [f"{OUT_DIR}/t{d}.txt" for d in deps]
        targets.append(
            Target(f"t{i}", tuple(inputs), tuple(f"t{d}" for d in deps), f"{OUT_DIR}/t{i}.txt", "sleep", seconds)
        )
    return Workload(f"W3-{n_targets}", targets, sources)


def w4_big_inputs(total_bytes: int, n_files: int = 4) -> Workload:
    """W4: one target whose inputs are a few large files (written by ``write_big_files``)."""
    size = total_bytes // n_files
    big = {f"{SRC_DIR}/big{i}.bin": size for i in range(n_files)}
    target = Target("hash", tuple(big), (), f"{OUT_DIR}/sizes.txt", "stat")
    return Workload(f"W4-{total_bytes >> 20}MiB", [target], {}, big_sources=big)


def lower_bound(workload: Workload, jobs: int) -> dict[str, float]:
    """max(critical path, total work / jobs) of a sleep DAG, counting only the sleeps."""
    finish: dict[str, float] = {}
    for t in workload.targets:  # targets are in topological order
        finish[t.name] = t.seconds + max((finish[d] for d in t.deps), default=0.0)
    critical = max(finish.values(), default=0.0)
    work = sum(t.seconds for t in workload.targets)
    return {"critical_path": critical, "work_per_job": work / jobs, "bound": max(critical, work / jobs)}


def cone(workload: Workload, source: str) -> int:
    """How many targets must rerun when ``source`` changes."""
    dirty: set[str] = set()
    for t in workload.targets:
        if source in t.inputs or any(d in dirty for d in t.deps):
            dirty.add(t.name)
    return len(dirty)


def pick_changed_source(workload: Workload) -> str:
    """The source to edit in "one source changed".

    W1: the middle source (cone of one).  DAGs: the source whose cone is closest to 5% of
    the targets (about 100 of W2's 2,000), ties broken by name.
    """
    sources = sorted(workload.sources)
    if workload.uniform_cp:
        return sources[len(sources) // 2]
    goal = max(1, len(workload.targets) // 20)
    return min(sources, key=lambda s: (abs(cone(workload, s) - goal), s))


def expected_outputs(workload: Workload, sources: dict[str, bytes]) -> dict[str, bytes]:
    """What every output must contain, given the current source contents."""
    out: dict[str, bytes] = {}
    for t in workload.targets:
        if t.kind == "stat":
            out[t.output] = "".join(f"{workload.big_sources[p]}\n" for p in t.inputs).encode()
            continue
        data = b"".join(out[p] if p in out else sources[p] for p in t.inputs)
        out[t.output] = data
    return out


def write_sources(root: Path, sources: dict[str, bytes]) -> None:
    """Write the small source files and create the output directory."""
    made: set[str] = set()
    for rel, data in sources.items():
        parent = os.path.dirname(rel)
        if parent not in made:
            (root / parent).mkdir(parents=True, exist_ok=True)
            made.add(parent)
        with open(root / rel, "wb") as f:
            f.write(data)
    (root / OUT_DIR).mkdir(parents=True, exist_ok=True)


def write_big_files(root: Path, sizes: dict[str, int]) -> None:
    """Write W4's large inputs: real (non-sparse) pseudo-random data, 1 MiB block repeated.

    The block differs per file so that no two files hash alike.
    """
    rng = random.Random(4)
    for rel, size in sizes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        block = rng.randbytes(1 << 20)
        with open(path, "wb") as f:
            left = size
            while left > 0:
                chunk = block[: min(left, len(block))]
                f.write(chunk)
                left -= len(chunk)
    (root / OUT_DIR).mkdir(parents=True, exist_ok=True)
