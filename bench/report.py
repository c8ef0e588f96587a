"""Report: statistics over the samples, the markdown tables and the raw JSON."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from measure import Sample
from scenarios import MONITORED, Result

PEERS = ("make", "ninja", "doit", "scons")
DASH, TIMES = "\u2013", "\u00d7"  # en dash and multiplication sign, for the tables


def good(samples: list[Sample]) -> list[Sample]:
    return [s for s in samples if not s.capped]


def spread(values: list[float]) -> tuple[float, float, float] | None:
    """(median, min, max), or None when there is nothing to summarise."""
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def ratios(result: Result, a: str, b: str) -> list[float]:
    """a/b wall-time ratios, one per round in which both ran to completion."""
    sa, sb = result.samples.get(a, []), result.samples.get(b, [])
    return [x.wall / y.wall for x, y in zip(sa, sb, strict=False) if not x.capped and not y.capped and y.wall > 0]


def fmt_time(v: float) -> str:
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    if v >= 0.01:
        return f"{v:.3f}"
    return f"{v:.4f}"


def fmt_spread(stats: tuple[float, float, float] | None, fmt: Any = fmt_time, suffix: str = "") -> str:
    if stats is None:
        return "—"
    med, lo, hi = stats
    if lo == hi:
        return f"{fmt(med)}{suffix}"
    return f"{fmt(med)}{suffix} ({fmt(lo)}{DASH}{fmt(hi)})"


def fmt_ratio(v: float) -> str:
    return f"{v:.3g}{TIMES}" if v < 100 else f"{v:.0f}{TIMES}"


def cell(result: Result, label: str, what: str) -> str:
    """One table cell: median (min-max) of wall/cpu, or median RSS, or why there is none."""
    if label in result.capped and not good(result.samples.get(label, [])):
        return f"capped ({result.capped[label]})"
    samples = good(result.samples.get(label, []))
    if not samples:
        return "—"
    if what == "rss":
        measured = [s.rss_kib for s in samples if s.rss_kib >= 0]
        if not measured:  # unwrapped timed runs: the warm-up run measured it
            warm = result.notes.get("warmup_rss_kib", {}).get(label, -1)
            measured = [warm] if warm >= 0 else []
        return f"{statistics.median(measured) / 1024:.0f} MiB" if measured else "—"
    values = [s.wall if what == "wall" else s.cpu for s in samples]
    return fmt_spread(spread(values))


def tool_table(results: list[Result], tools: list[str], what: str, title: str) -> list[str]:
    floor = what == "wall"
    head = ["scenario", *tools] + (["stat floor"] if floor else [])
    lines = [f"### {title}", "", _row(head), _row(["---"] * len(head))]
    for r in results:
        row = [r.id, *(cell(r, t, what) for t in tools)]
        if floor:
            row.append(fmt_spread(spread(r.floors)) if r.floors else "")
        lines.append(_row(row))
    return [*lines, ""]


def ratio_table(results: list[Result], peers: list[str], subject: str = "buildtool") -> list[str]:
    head = ["scenario", *(f"{subject} / {p}" for p in peers)]
    lines = [
        f"### {subject} / peer, wall-time ratio within a round (median, min{DASH}max)",
        "",
        "Below 1 means buildtool was faster."
        + (" With its file monitor running (docs/monitor.md); no-op builds only." if subject == MONITORED else ""),
        "",
        _row(head),
        _row(["---"] * len(head)),
    ]
    for r in results:
        cells = [fmt_spread(spread(ratios(r, subject, p)), fmt_ratio) for p in peers]
        lines.append(_row([r.id, *cells]))
    return [*lines, ""]


def schedule_lines(r: Result) -> list[str]:
    bound = r.notes["lower_bound"]
    lines = [
        f"### {r.id}: makespan / lower bound",
        "",
        f"Lower bound max(critical path {bound['critical_path']:.2f} s, work/"
        f"{r.jobs} {bound['work_per_job']:.2f} s) = {bound['bound']:.2f} s.",
        "",
        _row(["tool", "makespan", "/ lower bound"]),
        _row(["---"] * 3),
    ]
    for label, samples in r.samples.items():
        walls = [s.wall for s in good(samples)]
        st = spread(walls)
        rel = spread([w / bound["bound"] for w in walls])
        lines.append(_row([label, fmt_spread(st, suffix=" s"), fmt_spread(rel, fmt_ratio)]))
    return [*lines, ""]


def hashing_lines(r: Result) -> list[str]:
    lines = [f"### {r.id}: hashing throughput", ""]
    if r.error:
        return [*lines, r.error, ""]
    gib = r.notes["bytes"] / 2**30
    big = [s.wall for s in r.samples["buildtool"]]
    tiny = [s.wall for s in r.samples["buildtool-tiny-inputs"]]
    raw = [s.wall for s in r.samples["blake3"]]
    rows = []
    for b, t, w in zip(big, tiny, raw, strict=False):
        net = max(b - t, 1e-9)
        rows.append((gib / b, gib / net, gib / w, w / net))
    cols = list(zip(*rows, strict=False)) if rows else [[], [], [], []]
    gbps = lambda v: f"{v * 1.073741824:.2f}"  # noqa: E731  GiB/s -> GB/s
    lines += [
        f"{r.notes['bytes'] / 1e6:.0f} MB of inputs, `.buildtool` deleted before each run "
        "(cold stat cache), cache dir kept (so the run is hash + cache hit).",
        "",
        _row(["measure", f"median (min{DASH}max)"]),
        _row(["---"] * 2),
        _row(["buildtool, whole run (GB/s)", fmt_spread(spread(list(cols[0])), gbps)]),
        _row(["buildtool, minus the same run with tiny inputs (GB/s)", fmt_spread(spread(list(cols[1])), gbps)]),
        _row(["raw blake3, mmap + max_threads=AUTO, in-process (GB/s)", fmt_spread(spread(list(cols[2])), gbps)]),
        _row(["buildtool net / raw blake3", fmt_spread(spread(list(cols[3])), fmt_ratio)]),
    ]
    own = [s.wall for s in r.samples.get("buildtool-in-process", [])]
    if own:  # the same rounds: buildtool's hash_file and raw blake3 alternate in this process
        mine = spread([gib / w for w in own])
        ratio = spread([w / o for w, o in zip(raw, own, strict=False)])
        lines += [
            _row(["buildtool's `digest.hash_file`, in-process (GB/s)", fmt_spread(mine, gbps)]),
            _row(["`digest.hash_file` / raw blake3, in-process", fmt_spread(ratio, fmt_ratio)]),
        ]
    return [*lines, ""]


def watch_lines(r: Result) -> list[str]:
    lines = [f"### {r.id}: save → command starts", ""]
    if r.error:
        return [*lines, r.error, ""]
    walls = [s.wall * 1000 for s in r.samples.get("buildtool", [])]
    st = spread(walls)
    text = fmt_spread(st, lambda v: f"{v:.0f}", " ms")
    return [*lines, f"buildtool watch latency over {len(walls)} edits: {text}", ""]


def pair_lines(r: Result, a: str, b: str, title: str) -> list[str]:
    sa, sb = spread([s.wall for s in good(r.samples.get(a, []))]), spread([s.wall for s in good(r.samples.get(b, []))])
    rel = spread(ratios(r, a, b))
    return [
        f"### {title}",
        "",
        _row(["variant", "wall (s)"]),
        _row(["---"] * 2),
        _row([a, fmt_spread(sa)]),
        _row([b, fmt_spread(sb)]),
        _row([f"{a} / {b}", fmt_spread(rel, fmt_ratio)]),
        "",
    ]


def startup_lines(r: Result) -> list[str]:
    lines = []
    for suffix in ("", " (venv)"):
        a, b = f"buildtool --version{suffix}", f"python -c pass{suffix}"
        if r.samples.get(a) and r.samples.get(b):
            lines += pair_lines(r, a, b, f"Start-up{suffix}")
    return lines


def noise_lines(results: list[Result]) -> list[str]:
    """How many timed runs still had foreign load after the quiet-machine wait and retries."""
    samples = [s for r in results for v in r.samples.values() for s in v if s.cpu > 0]
    noisy = [s for s in samples if s.foreign_cpu > 0.03 + 0.2 * s.wall]
    if not samples:
        return []
    share = sum(s.foreign_cpu for s in samples) / max(sum(s.wall for s in samples), 1e-9)
    return [
        f"- machine noise: {len(noisy)} of {len(samples)} timed runs had foreign load "
        f"after retries; other processes used {share:.2f} cores on average during runs",
        "",
    ]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown(meta: dict[str, Any], results: list[Result]) -> str:
    tools = [t for t in meta["tools"] if t in {*PEERS, "buildtool"}]
    peers = [t for t in tools if t in PEERS]
    monitored = [r for r in results if r.samples.get(MONITORED) and not r.error]
    if monitored:
        tools.append(MONITORED)
    main = [
        r for r in results if r.scenario in {"clean", "no-op", "one source changed", "outputs deleted"} and not r.error
    ]
    lines = [
        f"# Benchmark results ({meta['mode']})",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}`",
        f"- machine: {meta['machine']}",
        f"- -j: {meta['jobs']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"- rounds per scenario: {meta['rounds']}; tools interleaved and rotated per round",
        "",
    ]
    lines += noise_lines(results)
    lines += tool_table(main, tools, "wall", f"Wall time, seconds (median, min{DASH}max)")
    if "buildtool" in tools and peers:
        lines += ratio_table(main, peers)
        if monitored:
            lines += ratio_table(monitored, peers, MONITORED)
    lines += tool_table(main, tools, "cpu", f"CPU time user+sys, seconds (median, min{DASH}max)")
    lines += tool_table(main, tools, "rss", "Peak RSS (median)")
    for r in results:
        if r.scenario.startswith("schedule") and not r.error:
            lines += schedule_lines(r)
        elif r.scenario.startswith("hash"):
            lines += hashing_lines(r)
        elif r.scenario == "watch latency":
            lines += watch_lines(r)
        elif r.scenario == "outputs deleted" and "buildtool-rerun" in r.samples:
            lines += pair_lines(r, "buildtool", "buildtool-rerun", f"{r.id}: restore from cache vs rerun the commands")
        elif r.scenario == "start-up":
            lines += startup_lines(r)
    errors = [r for r in results if r.error and r.scenario not in {"watch latency"}]
    if errors:
        lines += ["### Errors", ""] + [f"- {r.id}: {r.error}" for r in errors] + [""]
    return "\n".join(lines)


def write(out: Path, meta: dict[str, Any], results: list[Result]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "results": [r.as_dict() for r in results]}
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "results.md").write_text(markdown(meta, results))
