"""Smoke test of the benchmark suite: every workload at tiny size, every installed tool agrees.

Runs ``python bench/run.py --smoke`` as a real subprocess (real tools, real files under a
temp dir).  Deselect with ``-m "not bench"``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PEERS = ("ninja", "doit", "scons")


def installed(name: str) -> bool:
    scripts = Path(sysconfig.get_path("scripts")) / name
    return scripts.is_file() or shutil.which(name) is not None


@pytest.mark.bench
def test_smoke_run_agrees_and_lists_every_installed_tool(tmp_path: Path) -> None:
    assert installed("make"), "GNU make is required"
    tools = ["make", *(p for p in PEERS if installed(p)), "buildtool"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--smoke", "--tools", ",".join(tools), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["tools"] == tools
    classic = [r for r in data["results"] if r["scenario"] == "clean"]
    assert classic, "no clean-build scenario ran"
    for result in classic:
        assert set(result["samples"]) == set(tools)
        assert all(result["samples"][t] for t in tools), result["id"]
        assert len(set(result["notes"]["output_digests"].values())) == 1
    noops = [r for r in data["results"] if r["scenario"] == "no-op"]
    assert noops, "no no-op scenario ran"
    if sys.platform.startswith("linux"):  # buildtool with its file monitor, vouched for every timed run
        for result in noops:
            runs = result["samples"].get("buildtool+monitor", [])
            assert runs and result["notes"]["monitor_vouched"] >= len(runs), result["id"]
            assert not result["error"], result["error"]
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# Benchmark results")
    assert "buildtool+monitor / " in md or not sys.platform.startswith("linux")
