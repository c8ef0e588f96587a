"""orphans.py: the children file records a start-time window that a later build checks.

Real processes: a ``sleep`` in its own session stands for a command a killed build left.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from buildtool import orphans


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "30"], start_new_session=True)


def _lines(state: Path) -> list[list[int]]:
    text = (state / "children").read_text().splitlines()
    assert text[0].startswith(orphans.HEADER_PREFIX)
    return [[int(x) for x in ln.split()] for ln in text[1:]]


def test_the_recorded_window_holds_the_start_time_and_reap_kills_the_group(tmp_path: Path) -> None:
    tracker = orphans.Tracker(str(tmp_path))
    before = orphans.boot_clock()
    proc = _sleeper()
    try:
        tracker.add(proc.pid, before)
        [[pgid, lo, hi]] = _lines(tmp_path)
        started = orphans.start_time(proc.pid)
        assert pgid == proc.pid and started is not None
        assert lo <= started <= hi and hi - lo < 100  # a window of ticks, not a blanket
        # As if this build were killed: the next one reaps the group.
        assert orphans.reap(str(tmp_path), lambda _m: None, wait_s=5) == 1
        assert proc.wait(timeout=5) == -9
        assert not (tmp_path / "children").exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_leader_started_outside_the_window_is_a_recycled_pid_and_survives(tmp_path: Path) -> None:
    proc = _sleeper()
    try:
        started = orphans.start_time(proc.pid)
        assert started is not None
        (tmp_path / "children").write_text(f"{orphans.HEADER_PREFIX}1\n{proc.pid} {started - 50} {started - 10}\n")
        assert orphans.reap(str(tmp_path), lambda _m: None, wait_s=1) == 0
        assert proc.poll() is None  # not killed
        # A version-1 file (one exact start time) written by an older build is still honoured.
        (tmp_path / "children").write_text(f"{orphans.V1_PREFIX}1\n{proc.pid} {started}\n")
        assert orphans.reap(str(tmp_path), lambda _m: None, wait_s=5) == 1
        assert proc.wait(timeout=5) == -9
    finally:
        proc.kill()
        proc.wait()


def _sleeper_with_tmpdir(tmpdir: str) -> subprocess.Popen[bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": tmpdir, "HOME": tmpdir}
    return subprocess.Popen(["sleep", "30"], start_new_session=True, env=env)


def test_a_command_started_but_never_recorded_is_found_by_its_lane_tmpdir(tmp_path: Path) -> None:
    """A build killed between starting a command and recording its pid: the children file
    has only its header, yet the command (TMPDIR in the dead build's lane) is reaped; other
    builds' and other workspaces' commands are left alone."""
    holder = 4242
    state = tmp_path / "ws" / ".buildtool"
    state.mkdir(parents=True)
    other_state = tmp_path / "other" / ".buildtool"
    unrecorded = _sleeper_with_tmpdir(orphans.lane_dir(str(state), holder, 3))
    spared = [
        _sleeper_with_tmpdir(orphans.lane_dir(str(state), holder + 1, 3)),  # another build (pid 4243)
        _sleeper_with_tmpdir(orphans.lane_dir(str(state), 42420, 3)),  # 4242 is a prefix of its pid
        _sleeper_with_tmpdir(orphans.lane_dir(str(other_state), holder, 3)),  # another workspace
        _sleeper_with_tmpdir(orphans.lane_dir(str(state), holder, 3) + "/sub"),  # not a lane itself
    ]
    try:
        (state / "children").write_text(f"{orphans.HEADER_PREFIX}{holder}\n")
        warned: list[str] = []
        assert orphans.reap(str(state), warned.append, wait_s=5) == 1
        assert unrecorded.wait(timeout=5) == -9
        assert "pid 4242" in warned[0]
        assert all(p.poll() is None for p in spared)
        assert not (state / "children").exists()
        # Without a children file (the previous build ended cleanly) nothing is looked for.
        assert orphans.reap(str(tmp_path / "other" / ".buildtool"), warned.append) == 0
        assert all(p.poll() is None for p in spared)
    finally:
        for p in [unrecorded, *spared]:
            p.kill()
            p.wait()
