"""Scenarios: clean build, no-op, one source changed, scheduling, hashing, watch, restore.

Each scenario runs a list of variants (usually one per tool, each in its own workspace) for
a number of rounds, rotating the order every round (A B C, then B C A, ...) so that drift of
the machine hits every tool alike, and verifies every output after every timed run.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import workloads as wl
from measure import RunFailed, Sample, Timer, child_env, run_once
from tools import Buildtool, Tool, Workspace


@dataclass(slots=True)
class Variant:
    """One thing to time in a scenario: a command line with its setup and its check."""

    label: str
    argv: list[str]
    cwd: Path
    prepare: Callable[[], None] | None = None
    verify: Callable[[], None] | None = None
    rss: bool = True  # run under /usr/bin/time for peak RSS (adds ~1 ms)


@dataclass(slots=True)
class Result:
    """All samples of one scenario; ``samples[label][round]``."""

    id: str
    workload: str
    scenario: str
    jobs: int
    labels: list[str]
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    capped: dict[str, str] = field(default_factory=dict)
    floors: list[float] = field(default_factory=list)  # stat-only floor per round (no-op)
    notes: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "workload": self.workload,
            "scenario": self.scenario,
            "jobs": self.jobs,
            "labels": self.labels,
            "samples": {k: [s.as_dict() for s in v] for k, v in self.samples.items()},
            "capped": self.capped,
            "stat_floor": self.floors,
            "notes": self.notes,
            "error": self.error,
        }


def run_rounds(
    result: Result, variants: list[Variant], rounds: int, timer: Timer, floor: Callable[[], float] | None = None
) -> Result:
    """Time every variant ``rounds`` times, interleaved and rotated; fills ``result``."""
    for v in variants:
        result.samples.setdefault(v.label, [])
    for r in range(rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            if v.label in result.capped:
                continue
            sample = timer.time(v.argv, v.cwd, v.prepare, v.verify, v.rss)
            result.samples[v.label].append(sample)
            if sample.capped:
                result.capped[v.label] = f"over the {timer.limit:.0f} s limit"
        if floor:
            result.floors.append(floor())
    return result


# --- workspaces -------------------------------------------------------------------------


def make_workspaces(workload: wl.Workload, tools: list[Tool], base: Path) -> dict[str, Workspace]:
    """One workspace per tool, under ``base/<workload>/<tool>``, sources and build file."""
    spaces: dict[str, Workspace] = {}
    for tool in tools:
        root = base / workload.name / tool.name
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        wl.write_sources(root, workload.sources)
        tool.write(root, workload)
        cache = base / workload.name / f"{tool.name}-cache"
        shutil.rmtree(cache, ignore_errors=True)
        spaces[tool.name] = Workspace(root, workload, dict(workload.sources), cache)
    return spaces


def clear_outputs(ws: Workspace) -> None:
    with os.scandir(ws.root / wl.OUT_DIR) as entries:
        for entry in entries:
            os.unlink(entry.path)


def verify(ws: Workspace) -> None:
    """Every output holds exactly what the workload says it must."""
    expected = wl.expected_outputs(ws.workload, ws.sources)
    for rel, data in expected.items():
        try:
            with open(ws.root / rel, "rb") as f:
                actual = f.read()
        except FileNotFoundError:
            actual = None
        if actual != data:
            shown = "missing" if actual is None else f"{actual[:60]!r}"
            msg = f"{ws.root}: wrong output {rel}: expected {data[:60]!r}, got {shown}"
            raise RunFailed(msg)


def outputs_digest(ws: Workspace) -> str:
    h = hashlib.blake2b(digest_size=16)
    for rel in ws.workload.output_paths():
        h.update(rel.encode() + b"\0" + (ws.root / rel).read_bytes())
    return h.hexdigest()


def stat_floor(ws: Workspace) -> Callable[[], float]:
    """A function timing one ``os.stat`` of every input and output from Python."""
    paths = [str(ws.root / p) for p in [*ws.workload.source_paths(), *ws.workload.output_paths()]]

    def measure() -> float:
        t0 = time.perf_counter()
        for p in paths:
            os.stat(p)
        return time.perf_counter() - t0

    return measure


# --- the three classic scenarios ---------------------------------------------------------


@dataclass(slots=True)
class Bench:
    """What all scenarios share: the tools, the timer, the scratch dir and -j."""

    tools: list[Tool]
    timer: Timer
    base: Path
    jobs: int = 2
    warmups: int = 1


def tool_variants(
    bench: Bench,
    spaces: dict[str, Workspace],
    skip: set[str],
    prepare: Callable[[Tool, Workspace], Callable[[], None] | None],
) -> list[Variant]:
    out = []
    for tool in bench.tools:
        if tool.name in skip:
            continue
        ws = spaces[tool.name]
        out.append(Variant(tool.name, tool.argv(ws, bench.jobs), ws.root, prepare(tool, ws), lambda ws=ws: verify(ws)))
    return out


def clean_build(bench: Bench, workload: wl.Workload, spaces: dict[str, Workspace], rounds: int) -> Result:
    """Clean build: no outputs, no tool state, and for buildtool an empty cache."""
    result = Result(f"{workload.name} clean", workload.name, "clean", bench.jobs, [t.name for t in bench.tools])

    def prepare(tool: Tool, ws: Workspace) -> Callable[[], None]:
        def reset() -> None:
            clear_outputs(ws)
            tool.reset_state(ws)

        return reset

    run_rounds(result, tool_variants(bench, spaces, set(), prepare), rounds, bench.timer)
    digests = {name: outputs_digest(spaces[name]) for name in result.samples if name not in result.capped}
    result.notes["output_digests"] = digests
    if len(set(digests.values())) > 1:
        result.error = f"tools disagree on the outputs: {digests}"
    return result


MONITORED = "buildtool+monitor"  # buildtool's no-op with its file monitor running (docs/monitor.md)


def noop_build(
    bench: Bench, workload: wl.Workload, spaces: dict[str, Workspace], rounds: int, skip: set[str]
) -> Result:
    """No-op rebuild after warm-up runs, with the stat-only floor measured each round; on
    Linux also buildtool with its file monitor, in a copy of buildtool's workspace."""
    result = Result(f"{workload.name} no-op", workload.name, "no-op", bench.jobs, [t.name for t in bench.tools])
    result.capped.update({name: "clean build capped" for name in skip})
    variants = tool_variants(bench, spaces, skip, lambda tool, ws: None)
    monitored = monitored_variant(bench, spaces, skip)
    if monitored is not None:
        variants.append(monitored[0])
        result.labels.append(MONITORED)
    for v in variants:
        v.rss = False  # timed to the millisecond: RSS comes from the warm-up run
    try:
        warm(bench, variants, result)
        any_ws = next(iter(spaces.values()))
        run_rounds(result, variants, rounds, bench.timer, stat_floor(any_ws))
    finally:
        if monitored is not None:
            result.notes["monitor_vouched"] = monitored[1]()
    if monitored is not None and result.notes["monitor_vouched"] < len(result.samples.get(MONITORED, [])):
        result.error = (f"the monitor vouched for {result.notes['monitor_vouched']} of "
                        f"{len(result.samples[MONITORED])} timed no-ops: they were not all what {MONITORED} means")
    return result


def monitored_variant(
    bench: Bench, spaces: dict[str, Workspace], skip: set[str]
) -> tuple[Variant, Callable[[], int]] | None:
    """(the variant, a function that stops the monitor and says how many no-ops it
    vouched for), or None where there is no buildtool or no inotify.  The copy of
    buildtool's workspace gets two untimed builds (the copy's inodes invalidate the
    snapshot), then the monitor, then one no-op that arms the monitor's clock."""
    tool = next((t for t in bench.tools if isinstance(t, Buildtool)), None)
    if tool is None or tool.name in skip or not sys.platform.startswith("linux"):
        return None
    src = spaces[tool.name]
    root = src.root.parent / MONITORED
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(src.root, root, symlinks=True, ignore=shutil.ignore_patterns("monitor.*", "noop-clock", "lock"))
    ws = Workspace(root, src.workload, dict(src.sources), src.cache_dir)
    argv = tool.argv(ws, bench.jobs)
    control = [*tool.base_argv(), "-C", str(root), "monitor"]

    def run(cmd: list[str]) -> None:
        p = subprocess.run(cmd, cwd=root, env=child_env(), capture_output=True, text=True, timeout=bench.timer.limit)
        if p.returncode != 0:
            raise RunFailed(f"{' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")

    run(argv)
    time.sleep(0.1)  # past the racy window of what that build wrote: the next one leaves a snapshot
    run(argv)
    run([*control, "start", "--idle-exit", "3600"])
    run(argv)

    def stop() -> int:
        p = subprocess.run([*control, "status"], cwd=root, env=child_env(), capture_output=True, text=True)
        import re

        found = re.search(r"vouched for (\d+) no-op", p.stdout)
        vouched = int(found.group(1)) if found else -1
        subprocess.run([*control, "stop"], cwd=root, env=child_env(), capture_output=True)
        return vouched

    return Variant(MONITORED, argv, root, None, lambda: verify(ws)), stop


def warm(bench: Bench, variants: list[Variant], result: Result) -> None:
    """Untimed warm-up runs; a tool that hits the time limit here is capped."""
    for _ in range(bench.warmups):
        for v in variants:
            if v.label in result.capped:
                continue
            sample, stderr = run_once(v.argv, v.cwd, bench.timer.limit)
            result.notes.setdefault("warmup_rss_kib", {})[v.label] = sample.rss_kib
            if sample.capped:
                result.capped[v.label] = f"warm-up over the {bench.timer.limit:.0f} s limit"
            elif sample.returncode != 0:
                raise RunFailed(f"{v.label} warm-up failed:\n{stderr}")


def one_changed(
    bench: Bench, workload: wl.Workload, spaces: dict[str, Workspace], rounds: int, skip: set[str]
) -> Result:
    """Edit one source (new content each run), then rebuild."""
    source = wl.pick_changed_source(workload)
    result = Result(
        f"{workload.name} one changed", workload.name, "one source changed", bench.jobs, [t.name for t in bench.tools]
    )
    result.capped.update({name: "clean build capped" for name in skip})
    result.notes.update(source=source, cone=wl.cone(workload, source))
    counter = iter(range(1_000_000))

    def prepare(tool: Tool, ws: Workspace) -> Callable[[], None]:
        def edit() -> None:
            data = f"changed {next(counter)}\n".encode()
            (ws.root / source).write_bytes(data)
            ws.sources[source] = data

        return edit

    return run_rounds(result, tool_variants(bench, spaces, skip, prepare), rounds, bench.timer)


def classic(bench: Bench, workload: wl.Workload, clean_rounds: int, rounds: int) -> list[Result]:
    """Clean, no-op and one-changed for every tool on ``workload``."""
    spaces = make_workspaces(workload, bench.tools, bench.base)
    results = [clean_build(bench, workload, spaces, clean_rounds)]
    skip = set(results[0].capped)
    results.append(noop_build(bench, workload, spaces, rounds, skip))
    skip |= set(results[-1].capped)
    results.append(one_changed(bench, workload, spaces, rounds, skip))
    return results


# --- W3: scheduling ---------------------------------------------------------------------


def scheduling(bench: Bench, workload: wl.Workload, rounds: int) -> Result:
    """W3: makespan of a sleep DAG after one recording run, as a ratio to the lower bound."""
    spaces = make_workspaces(workload, bench.tools, bench.base)
    result = Result(
        f"{workload.name} schedule", workload.name, "schedule (sleep DAG)", bench.jobs, [t.name for t in bench.tools]
    )
    result.notes["lower_bound"] = wl.lower_bound(workload, bench.jobs)

    def prepare(tool: Tool, ws: Workspace) -> Callable[[], None]:
        def reset() -> None:
            clear_outputs(ws)
            shutil.rmtree(ws.cache_dir, ignore_errors=True)  # buildtool must rerun, not restore

        return reset

    variants = tool_variants(bench, spaces, set(), prepare)
    warm(bench, variants, result)  # records durations (.ninja_log, buildtool's state)
    return run_rounds(result, variants, rounds, bench.timer)


# --- W4: hashing throughput --------------------------------------------------------------


def blake3_seconds(paths: list[Path]) -> float:
    """Raw multithreaded BLAKE3 over an mmap of each file, in this process."""
    import blake3  # buildtool's own dependency

    t0 = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            blake3.blake3(m, max_threads=blake3.blake3.AUTO).digest()
    return time.perf_counter() - t0


def digest_seconds(paths: list[Path]) -> float | None:
    """buildtool's own file hashing (``digest.hash_file``) over the same files, in this
    process; None when this interpreter cannot import buildtool."""
    try:
        from buildtool import digest
    except ImportError:
        return None
    t0 = time.perf_counter()
    for path in paths:
        digest.hash_file(str(path))
    return time.perf_counter() - t0


def hashing(bench: Bench, total_bytes: int, rounds: int) -> Result:
    """W4: buildtool hashing large inputs with a cold stat cache vs raw BLAKE3."""
    tool = _buildtool(bench)
    big, small = wl.w4_big_inputs(total_bytes), wl.w4_big_inputs(4 * 4096)
    result = Result(
        f"{big.name} hashing",
        big.name,
        "hash inputs (cold stat cache)",
        bench.jobs,
        ["buildtool", "buildtool-tiny-inputs", "blake3", "buildtool-in-process"],
    )
    if tool is None:
        result.error = "buildtool is not available"
        return result
    spaces = {}
    for name, work in (("big", big), ("small", small)):
        ws = make_workspaces(work, [tool], bench.base / name)[tool.name]
        wl.write_big_files(ws.root, work.big_sources)
        spaces[name] = ws
    variants = [
        Variant(
            label,
            tool.argv(ws, bench.jobs),
            ws.root,
            lambda ws=ws: shutil.rmtree(ws.root / ".buildtool", ignore_errors=True),
            lambda ws=ws: verify(ws),
        )
        for label, ws in (("buildtool", spaces["big"]), ("buildtool-tiny-inputs", spaces["small"]))
    ]
    warm(bench, variants, result)  # fills the cache: timed runs hash, then hit the cache
    paths = [spaces["big"].root / p for p in big.big_sources]
    raw: list[float] = []
    own: list[float] = []
    for i in range(rounds):
        run_rounds(result, variants, 1, bench.timer)
        pair = (blake3_seconds, digest_seconds) if i % 2 == 0 else (digest_seconds, blake3_seconds)
        times = {f: f(paths) for f in pair}  # the two in-process measures alternate first
        raw.append(times[blake3_seconds])
        if times[digest_seconds] is not None:
            own.append(times[digest_seconds])
    result.samples["blake3"] = [Sample(t, t, 0, 0) for t in raw]
    result.samples["buildtool-in-process"] = [Sample(t, t, 0, 0) for t in own]
    result.notes["bytes"] = sum(big.big_sources.values())
    return result


def _buildtool(bench: Bench) -> Tool | None:
    return next((t for t in bench.tools if isinstance(t, Buildtool)), None)


# --- W5: watch latency -------------------------------------------------------------------


def watch_available(tool: Tool) -> bool:
    proc = subprocess.run([*tool.base_argv(), "watch", "--help"], capture_output=True, env=child_env(), check=False)
    return proc.returncode == 0


def watch_latency(bench: Bench, n: int, samples: int) -> Result:
    """W5: from saving a source to the start of its dependent command under ``watch``."""
    tool = _buildtool(bench)
    result = Result(f"W5-{n} watch", f"W5-{n}", "watch latency", bench.jobs, ["buildtool"])
    if tool is None or not watch_available(tool):
        result.error = "not available (`buildtool watch --help` failed)"
        result.notes["available"] = False
        return result
    result.notes["available"] = True
    work = wl.w1_copy(n)
    ws = make_workspaces(work, [tool], bench.base / "w5")[tool.name]
    log = ws.root.parent / "started.log"
    log.write_text("")
    (ws.root / "BUILD.py").write_text(
        f"for i in range({n}):\n"
        '    genrule(name=f"t{i}", srcs=[f"src/{i}.txt"], outs=[f"out/{i}.txt"],\n'
        f'            cmd=f"echo t{{i}} `date +%s.%N` >> {log} && cp $< $@")\n'
    )
    sample, stderr = run_once(tool.argv(ws, bench.jobs), ws.root, bench.timer.limit)
    if sample.returncode != 0:
        raise RunFailed(f"W5 initial build failed:\n{stderr}")
    argv = [a if a != "build" else "watch" for a in tool.argv(ws, bench.jobs)]
    proc = subprocess.Popen(
        argv, cwd=ws.root, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        result.samples["buildtool"] = _watch_samples(ws, log, samples)
        verify(ws)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return result


def _watch_samples(ws: Workspace, log: Path, count: int) -> list[Sample]:
    # The watcher is ready once it answers a save; until then, save again every second.
    _edit_and_wait(ws, log, 0, deadline=120.0, resave_every=1.0)
    out = []
    for i in range(1, count + 1):
        time.sleep(0.3)
        latency = _edit_and_wait(ws, log, i, deadline=10.0)
        out.append(Sample(latency, 0.0, -1, 0))
    time.sleep(0.5)  # let the last build finish before the outputs are verified
    return out


def _edit_and_wait(ws: Workspace, log: Path, i: int, deadline: float, resave_every: float = 0.0) -> float:
    """Save src/<i>.txt; return seconds from the save to the log showing t<i> starting."""
    rel = f"{wl.SRC_DIR}/{i}.txt"
    seen = len(log.read_text().splitlines())
    first = time.time()
    saved = 0.0
    while time.time() - first < deadline:
        if not saved or (resave_every and time.time() - saved > resave_every):
            data = f"edited {time.time()}\n".encode()
            saved = time.time()
            (ws.root / rel).write_bytes(data)
            ws.sources[rel] = data
        lines = log.read_text().splitlines()
        for line in lines[seen:]:
            name, stamp = line.split()
            if name == f"t{i}":
                return float(stamp) - saved
        seen = len(lines)
        time.sleep(0.002)
    msg = f"watch did not start t{i} within {deadline} s of saving {rel}"
    raise RunFailed(msg)


# --- W6: restore from the cache ----------------------------------------------------------


def restore(bench: Bench, n: int, rounds: int) -> Result:
    """W6: delete every output and rebuild: buildtool restores from its cache, others rerun."""
    work = wl.w1_copy(n)
    work.name = f"W6-{n}"
    spaces = make_workspaces(work, bench.tools, bench.base)
    result = Result(
        f"{work.name} restore",
        work.name,
        "outputs deleted",
        bench.jobs,
        [*(t.name for t in bench.tools), "buildtool-rerun"],
    )
    variants = tool_variants(bench, spaces, set(), lambda tool, ws: lambda ws=ws: clear_outputs(ws))
    tool = _buildtool(bench)
    if tool is not None:
        rerun_ws = make_workspaces(work, [tool], bench.base / "rerun")[tool.name]

        def rerun_prepare() -> None:
            clear_outputs(rerun_ws)
            shutil.rmtree(rerun_ws.cache_dir, ignore_errors=True)

        variants.append(
            Variant(
                "buildtool-rerun",
                tool.argv(rerun_ws, bench.jobs),
                rerun_ws.root,
                rerun_prepare,
                lambda: verify(rerun_ws),
            )
        )
    warm(bench, variants, result)  # the first build fills buildtool's cache
    return run_rounds(result, variants, rounds, bench.timer)


# --- start-up ----------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def startup(bench: Bench, rounds: int, venv: bool) -> Result:
    """``buildtool --version`` against ``python -c pass``, with the same interpreter.

    With ``venv``, the same pair again from a fresh venv holding a regular (non-editable)
    install of this checkout: no site-packages ``.pth`` imports, no editable finder.
    """
    result = Result("start-up", "-", "start-up", 1, [])
    bench.base.mkdir(parents=True, exist_ok=True)
    variants = _startup_pair(bench, "", sys.executable, _buildtool(bench))
    if venv and sys.prefix == sys.base_prefix:  # already in a venv: the pair above is that
        python = _make_venv(bench.base / "venv", result)
        if python is not None:
            variants += _startup_pair(bench, " (venv)", python, None)
    result.labels = [v.label for v in variants]
    for _ in range(2):
        warm(bench, variants, result)
    return run_rounds(result, variants, rounds, bench.timer)


def _startup_pair(bench: Bench, suffix: str, python: str, tool: Tool | None) -> list[Variant]:
    out = [Variant(f"python -c pass{suffix}", [python, "-c", "pass"], bench.base, rss=False)]
    if tool is not None:
        argv = [*tool.base_argv(), "--version"]
    elif suffix:
        argv = [str(Path(python).parent / "buildtool"), "--version"]
    else:
        return out
    out.append(Variant(f"buildtool --version{suffix}", argv, bench.base, rss=False))
    return out


def _make_venv(path: Path, result: Result) -> str | None:
    """A venv with ``pip install REPO`` (compiled at install time); None if that fails."""
    python = path / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", str(path)],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(REPO)],
    ]
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            result.notes["venv_error"] = proc.stderr[-2000:]
            return None
    return str(python)
