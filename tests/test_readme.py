"""The README's two fresh-machine commands: the first two code blocks, and `.ci/run` runs
exactly the second one (CI must test what a reader is told to run)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)


def test_the_readme_opens_with_the_install_and_the_test_command() -> None:
    first, second = (b.strip() for b in _blocks()[:2])
    assert "example_project" in first and "buildtool" in first and "\n" not in first
    assert "pytest" in second and "\n" not in second


def test_ci_runs_exactly_the_readme_test_command() -> None:
    second = _blocks()[1].strip()
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[-1] == second
