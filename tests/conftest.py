"""Shared fixtures: temp workspaces, the real ``buildtool`` command, ``--events`` reading.

End-to-end tests run the installed ``buildtool`` console script as a subprocess, with
``BUILDTOOL_CACHE_DIR`` pointed at a per-test cache directory and the user's config and
cache dirs redirected into the test's temp dir, so nothing of the developer's machine
leaks in and tests never share state.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from buildtool.config import CI_MARKERS

BUILDTOOL = shutil.which("buildtool") or ""
RUN_TIMEOUT_S = 120


def pytest_configure(config: pytest.Config) -> None:
    """End-to-end tests run the installed ``buildtool``, unit tests import this checkout's:
    the two must be the same code, or a change tested without reinstalling passes on the
    old code (a regular install is what CI and the README use).  Stop at once, saying so."""
    if not BUILDTOOL:
        return
    checkout = Path(__file__).resolve().parent.parent / "buildtool"
    with open(BUILDTOOL, "rb") as f:
        first = f.readline()
    python = first[2:].strip().decode() if first.startswith(b"#!") else ""
    if not python or not os.path.exists(python):
        return  # (not a pip console script: nothing to compare)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run([python, "-c", "import buildtool, os; print(os.path.dirname(os.path.realpath("
                            "buildtool.__file__)))"], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    installed = Path(found.stdout.strip())
    if found.returncode != 0 or installed == checkout:
        return
    differ = sorted(str(p.relative_to(checkout)) for p in checkout.rglob("*.py")
                    if not (installed / p.relative_to(checkout)).is_file()
                    or (installed / p.relative_to(checkout)).read_bytes() != p.read_bytes())
    if differ:
        pytest.exit(f"the installed buildtool ({installed}, run by the end-to-end tests) is not this checkout's "
                    f"code ({checkout}): {', '.join(differ[:5])} differ; reinstall (pip install .) and run again",
                    returncode=3)


def _clean_env(cache_dir: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDTOOL_")}
    env["BUILDTOOL_CACHE_DIR"] = str(cache_dir)
    env["XDG_CONFIG_HOME"] = str(home / "config")
    env["XDG_CACHE_HOME"] = str(home / "xdg-cache")
    env["CI"] = "1"
    for k in CI_MARKERS:  # tests that set CI="" mean "not CI", whichever CI runs them
        env.pop(k, None)
    env.pop("PYTHONPATH", None)
    return env


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``path`` immutable (``chattr +i``) for the block, as a read-only mount would make it
    even for root; the test is skipped where that cannot be done."""
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("cannot make a file immutable here (chattr, root, a filesystem that has the flag)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def run_buildtool(
    *args: str,
    cwd: Path | str,
    cache_dir: Path | str,
    home: Path | str | None = None,
    env_extra: dict[str, str] | None = None,
    timeout: float = RUN_TIMEOUT_S,
) -> tuple[int, str, str]:
    """Run the real ``buildtool`` command; return (exit code, stdout, stderr)."""
    assert BUILDTOOL, "the buildtool console script must be on PATH (pip install -e .)"
    home_p = Path(home) if home is not None else Path(cache_dir).parent / "home"
    env = _clean_env(Path(cache_dir), home_p)
    if env_extra:
        env.update(env_extra)
    p = subprocess.run(
        [BUILDTOOL, *args],
        cwd=str(cwd),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return p.returncode, p.stdout, p.stderr


def slot_file(state: Path | str, kind: str) -> Path:
    """The one request's ``kind`` file (``noop``, ``graph``, ``noop-clock``) in a state
    directory: ``<kind>.<request's slot>`` (noop.slot_of); a path that does not exist
    when there is none; a test with several requests' files names the slot itself."""
    import re

    found = [p for p in Path(state).iterdir() if re.fullmatch(re.escape(kind) + r"\.[0-9a-f]{8}", p.name)]
    assert len(found) <= 1, found
    return found[0] if found else Path(state) / f"{kind}.none"


def read_events(path: Path | str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Parse an ``--events`` JSONL file: (header, [event, ...])."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    assert lines, f"events file {path} is empty"
    objs = [json.loads(ln) for ln in lines if ln.strip()]
    header, events = objs[0], [o for o in objs[1:] if "type" not in o]  # "remote" lines: remote_totals()
    assert "schema" in header and "build_id" in header, header
    return header, events


def remote_totals(path: Path | str) -> list[dict[str, Any]]:
    """The ``{"type": "remote", ...}`` lines of an ``--events`` file."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [o for o in map(json.loads, lines[1:]) if o.get("type") == "remote"]


def by_label(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        assert e["label"] not in out, f"two events for {e['label']}"
        out[e["label"]] = e
    return out


@dataclass
class BuildRun:
    """The result of one ``buildtool`` invocation with ``--events``."""

    rc: int
    stdout: str
    stderr: str
    events: list[dict[str, Any]] = field(default_factory=list)
    remote: list[dict[str, Any]] = field(default_factory=list)  # the "remote" lines of --events
    written: bool = True  # whether the --events file was written (False: every status set would be empty)

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def by_label(self) -> dict[str, dict[str, Any]]:
        return by_label(self.events)

    def status(self, label: str) -> str:
        return self.by_label[label]["status"]

    def with_status(self, *statuses: str) -> set[str]:
        assert self.written, f"no --events file was written (exit {self.rc}): no status to read\n{self.output}"
        return {e["label"] for e in self.events if e["status"] in statuses}

    @property
    def ran(self) -> set[str]:
        return self.with_status("ran")


class Workspace:
    """A temp workspace (``buildtool.toml`` at its root) with its own cache dir."""

    _counter = 0

    def __init__(self, root: Path, cache: Path, home: Path) -> None:
        self.root = root
        self.cache = cache
        self.home = home
        root.mkdir(parents=True, exist_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
        toml = root / "buildtool.toml"
        if not toml.exists():
            toml.write_text("")

    # -- files ---------------------------------------------------------------------
    def path(self, rel: str) -> Path:
        return self.root / rel

    def write(self, rel: str, content: str | bytes = "", mode: int | None = None) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
        if mode is not None:
            p.chmod(mode)
        return p

    def build_file(self, pkg: str, text: str) -> Path:
        """Write ``pkg/BUILD.py`` (``""`` for the root package), dedented."""
        rel = f"{pkg}/BUILD.py" if pkg else "BUILD.py"
        return self.write(rel, textwrap.dedent(text).lstrip("\n"))

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    # -- commands ------------------------------------------------------------------
    def run(self, *args: str, cwd: Path | str | None = None, cache: Path | str | None = None,
            env_extra: dict[str, str] | None = None) -> tuple[int, str, str]:
        return run_buildtool(*args, cwd=cwd or self.root, cache_dir=cache or self.cache,
                             home=self.home, env_extra=env_extra)

    def build(self, *args: str, command: str = "build", cache: Path | str | None = None,
              cwd: Path | str | None = None, env_extra: dict[str, str] | None = None) -> BuildRun:
        """``buildtool <command> ARGS --events FILE``, parsed."""
        Workspace._counter += 1
        ev = self.home / f"events-{os.getpid()}-{Workspace._counter}.jsonl"
        ev.parent.mkdir(parents=True, exist_ok=True)
        if ev.exists():
            ev.unlink()
        rc, out, err = self.run(command, *args, "--events", str(ev), cwd=cwd, cache=cache, env_extra=env_extra)
        events: list[dict[str, Any]] = []
        remote: list[dict[str, Any]] = []
        written = ev.exists() and ev.stat().st_size > 0
        if written:
            _, events = read_events(ev)
            remote = remote_totals(ev)
        return BuildRun(rc, out, err, events, remote, written)

    def copy_to(self, dest: Path, *, with_state: bool = False, cache: Path | None = None) -> Workspace:
        """Copy the workspace's files (not its state, unless asked) to ``dest``."""
        ignore = None if with_state else shutil.ignore_patterns(".buildtool")
        shutil.copytree(self.root, dest, ignore=ignore, symlinks=True)
        return Workspace(dest, cache or self.cache, self.home)


@pytest.fixture
def make_workspace(tmp_path: Path) -> Callable[..., Workspace]:
    """Factory: ``make_workspace(name="ws", cache=None)`` -> a new Workspace under tmp_path.

    Each call gets a fresh directory; ``cache`` defaults to a fresh per-workspace cache.
    """
    counter = iter(range(10**9))

    def make(name: str = "ws", cache: Path | None = None) -> Workspace:
        i = next(counter)
        root = tmp_path / f"{name}-{i}"
        return Workspace(root, cache or tmp_path / f"cache-{name}-{i}", tmp_path / "home")

    return make


@pytest.fixture
def workspace(make_workspace: Callable[..., Workspace]) -> Workspace:
    """A fresh empty workspace (``buildtool.toml`` only) with a per-test cache dir."""
    return make_workspace("ws")


@pytest.fixture
def run_bt(workspace: Workspace) -> Callable[..., tuple[int, str, str]]:
    """``run_bt(*args, cwd=None)``: run the real ``buildtool`` in the workspace with the
    per-test cache; returns (rc, stdout, stderr)."""

    def run(*args: str, cwd: Path | str | None = None) -> tuple[int, str, str]:
        return workspace.run(*args, cwd=cwd)

    return run


@pytest.fixture
def events_file(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "events.jsonl"
