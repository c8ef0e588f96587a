"""orphans.py: the children file records a start-time window that a later build checks.

Real processes: a ``sleep`` in its own session stands for a command a killed build left.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from buildtool import orphans


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "30"], start_new_session=True)


def _dead_pid() -> int:
    """The pid of a process that has exited (and been waited for): a killed build's."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _as_if_killed(state: Path) -> None:
    """Put a dead holder's pid in the children file's header, as a kill -9ed build leaves it."""
    lines = (state / "children").read_text().splitlines(keepends=True)
    since = lines[0].partition(" since=")[2]
    lines[0] = f"{orphans.HEADER_PREFIX}{_dead_pid()} since={since}"
    (state / "children").write_text("".join(lines))


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
        # While the build that wrote the file runs (a copy of its state taken mid-build),
        # its commands are its own: spared, and the copied file dropped.
        text = (tmp_path / "children").read_text()
        assert orphans.reap(str(tmp_path), lambda _m: None, wait_s=5) == 0
        assert proc.poll() is None and not (tmp_path / "children").exists()
        # As if this build were killed: the next one reaps the group.
        (tmp_path / "children").write_text(text)
        _as_if_killed(tmp_path)
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


def _sleeper_with_tmpdir(tmpdir: str, session: bool = True, stderr: str | None = "capture") -> subprocess.Popen[bytes]:
    """``sleep`` as buildtool starts a command in lane directory ``tmpdir``: that TMPDIR,
    its own session, stderr to the lane's capture file (``stderr="stdout"``: stdout to its
    capture file and stderr to /dev/null, as a shell that redirected its own stderr; else
    a path for stderr)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": tmpdir, "HOME": tmpdir}
    os.makedirs(os.path.dirname(tmpdir), exist_ok=True)
    if stderr == "stdout":
        with open(orphans.capture_of(tmpdir) + ".out", "ab") as out:
            return subprocess.Popen(["sleep", "30"], start_new_session=session, env=env, stdout=out,
                                    stderr=subprocess.DEVNULL)
    path = orphans.capture_of(tmpdir) + ".err" if stderr == "capture" else stderr or os.devnull
    with open(path, "ab") as err:
        return subprocess.Popen(["sleep", "30"], start_new_session=session, env=env, stderr=err)


def _tick_now() -> int:
    booted = orphans.boot_clock()
    assert booted is not None
    return int(booted * os.sysconf("SC_CLK_TCK"))


@pytest.mark.parametrize("ws", ["ws", "caf\udce9"])  # (a non-UTF-8 path: every build after a kill -9 crashed)
def test_a_command_started_but_never_recorded_is_found_by_its_lane_tmpdir(tmp_path: Path, ws: str) -> None:
    """A build killed between starting a command and recording its pid: the children file
    has only its header, yet the command (TMPDIR in the dead build's lane, its own session,
    stderr to the lane's capture file, started after the build began) is reaped.  Spared:
    other builds' and workspaces' commands, other paths, a process the same pid's earlier
    build left running, a process outside a session of its own (a console-pool command
    runs in the group of whoever started buildtool: that group must never be killed), and
    a daemon a command started (its own session and log: a clean build leaves it alone)."""
    holder = _dead_pid()
    state = tmp_path / ws / ".buildtool"
    state.mkdir(parents=True)
    other_state = tmp_path / "other" / ".buildtool"
    lane = orphans.lane_dir(str(state), holder, 3)
    earlier = _sleeper_with_tmpdir(lane)  # an earlier build with the same pid left it running
    time.sleep(0.05)  # a few clock ticks
    since = _tick_now() - 1
    time.sleep(0.05)
    redirected = _sleeper_with_tmpdir(orphans.lane_dir(str(state), holder, 0), stderr="stdout")  # `2>/dev/null`
    unrecorded = [_sleeper_with_tmpdir(lane), redirected]
    spared = [
        earlier,
        _sleeper_with_tmpdir(lane, session=False),  # in this process's group, as a console-pool command
        _sleeper_with_tmpdir(orphans.lane_dir(str(state), holder + 1, 3)),  # another build (the next pid)
        _sleeper_with_tmpdir(orphans.lane_dir(str(state), holder * 10, 3)),  # the holder's pid is a prefix of it
        _sleeper_with_tmpdir(orphans.lane_dir(str(other_state), holder, 3)),  # another workspace
        _sleeper_with_tmpdir(lane + "/sub"),  # not a lane itself
        _sleeper_with_tmpdir(lane, stderr=str(tmp_path / "daemon.log")),  # a daemon a command started
    ]
    try:
        (state / "children").write_text(f"{orphans.HEADER_PREFIX}{holder} since={since}\n")
        warned: list[str] = []
        assert orphans.reap(str(state), warned.append, wait_s=5) == 2
        assert [p.wait(timeout=5) for p in unrecorded] == [-9, -9]
        assert f"pid {holder}" in warned[0]
        assert all(p.poll() is None for p in spared)
        assert not (state / "children").exists()
        # A header without the start (an older buildtool's): only recorded groups are killed.
        again = _sleeper_with_tmpdir(lane)
        spared.append(again)
        (state / "children").write_text(f"{orphans.HEADER_PREFIX}{holder}\n")
        assert orphans.reap(str(state), warned.append, wait_s=5) == 0
        # Without a children file (the previous build ended cleanly) nothing is looked for.
        assert orphans.reap(str(tmp_path / "other" / ".buildtool"), warned.append) == 0
        assert all(p.poll() is None for p in spared)
    finally:
        for p in [*unrecorded, *spared]:
            p.kill()
            p.wait()


def test_a_killed_build_left_a_zombie_is_not_taken_for_a_running_one(tmp_path: Path) -> None:
    """A build killed while its parent had gone (pid 1, slow to reap, held it as a zombie):
    its start time was still readable, so the sweep took it for a running build that
    started before its commands, dropped the list, and left them running."""
    zombie = subprocess.Popen(["true"])  # (never waited for until the end: a zombie meanwhile)
    time.sleep(0.2)
    state = tmp_path / "ws" / ".buildtool"
    state.mkdir(parents=True)
    since = _tick_now()
    orphan = _sleeper_with_tmpdir(orphans.lane_dir(str(state), zombie.pid, 0))
    try:
        (state / "children").write_text(f"{orphans.HEADER_PREFIX}{zombie.pid} since={since}\n")
        assert orphans.reap(str(state), lambda _msg: None, wait_s=5) == 1
        assert orphan.wait(timeout=5) == -9
    finally:
        orphan.kill()
        orphan.wait()
        zombie.wait()


def test_the_tracker_header_holds_the_pid_and_the_tick_before_any_command(tmp_path: Path) -> None:
    before = _tick_now()
    orphans.Tracker(str(tmp_path))
    header = (tmp_path / "children").read_text().splitlines()[0]
    pid, _, since = header.removeprefix(orphans.HEADER_PREFIX).partition(" since=")
    assert int(pid) == os.getpid() and before - 1 <= int(since) <= _tick_now()


def test_a_children_file_deleted_under_the_build_is_written_again(tmp_path: Path) -> None:
    """`rm -rf .buildtool` (git clean -xfd) under a build, then its kill -9: the lines went on
    into the deleted file, and the next build killed nothing (its orphans wrote beside it)."""
    state = tmp_path / ".buildtool"
    state.mkdir()
    tracker = orphans.Tracker(str(state))
    first, second = _sleeper(), _sleeper()
    try:
        tracker.add(first.pid, orphans.boot_clock())
        (state / "children").unlink()
        state.rmdir()
        tracker.add(second.pid, orphans.boot_clock())
        assert [line[0] for line in _lines(state)] == [first.pid, second.pid]
        _as_if_killed(state)
        assert orphans.reap(str(state), lambda _m: None, wait_s=5) == 2
        assert first.wait(timeout=5) == second.wait(timeout=5) == -9
    finally:
        for p in (first, second):
            p.kill()
            p.wait()


def test_a_command_capturing_into_memory_files_is_found_through_its_lanes_marker(tmp_path: Path) -> None:
    """Where output goes to memory files (memfd_create), there is no capture file to compare
    with: the build names a command's memory files in its lane's marker before the child
    exists and clears it when the command ends.  Killed between the spawn and the pid's
    line, that command is still reaped; spared: a daemon that holds the memory files of a
    command that ended (as a cleanly ending build leaves it), one holding memory files no
    marker names, and anything a damaged marker seems to name."""
    if not hasattr(os, "memfd_create"):
        pytest.skip("no memfd_create here: commands capture into files (the test above)")
    holder = _dead_pid()
    state = tmp_path / ".buildtool"
    (state / "tmp").mkdir(parents=True)
    since = _tick_now() - 1
    time.sleep(0.02)
    tracker = orphans.Tracker(str(state))
    procs: list[subprocess.Popen[bytes]] = []

    def command(lane: int, marked: bool | None) -> subprocess.Popen[bytes]:
        tmpdir = orphans.lane_dir(str(state), holder, lane)
        out, err = os.memfd_create("cap.out"), os.memfd_create("cap.err")
        try:
            if marked is not None:
                tracker.capturing(orphans.capture_of(tmpdir), out, err)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": tmpdir}
            p = subprocess.Popen(["sleep", "30"], start_new_session=True, env=env, stdout=out, stderr=err)
            procs.append(p)
            if marked is False:
                tracker.captured(orphans.capture_of(tmpdir))
            return p
        finally:
            os.close(out)
            os.close(err)

    try:
        running = command(0, True)
        spared = [command(1, False), command(2, None), command(3, True)]
        (state / "tmp" / f"{holder}-3.capture").write_bytes(b"capture v1 1 2 oops")  # damaged: names nothing
        assert orphans._capture_files(str(state), holder) == {
            (os.stat(f"/proc/{running.pid}/fd/{fd}").st_dev, os.stat(f"/proc/{running.pid}/fd/{fd}").st_ino)
            for fd in (1, 2)
        }
        (state / "children").write_text(f"{orphans.HEADER_PREFIX}{holder} since={since}\n")
        warned: list[str] = []
        assert orphans.reap(str(state), warned.append, wait_s=5) == 1
        assert running.wait(timeout=5) == -9
        assert all(p.poll() is None for p in spared)
    finally:
        tracker.close()
        for p in procs:
            p.kill()
            p.wait()


def test_reap_waits_until_no_process_of_the_killed_groups_can_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """reliability.md: the next build waits (up to 5 s) until the orphans it killed can no
    longer run before it touches an output: a group still dying could write into it.  The
    group here is reported alive for its first three looks (a slow death, which a SIGKILL
    of a sleep is not)."""
    tracker = orphans.Tracker(str(tmp_path))
    before = orphans.boot_clock()
    proc = _sleeper()
    looks: list[bool] = []
    real = orphans.live_groups

    def slow(pgids: set[int]) -> set[int] | None:
        looks.append(True)
        return set(pgids) if len(looks) <= 3 else real(pgids)

    try:
        tracker.add(proc.pid, before)
        _as_if_killed(tmp_path)
        monkeypatch.setattr(orphans, "live_groups", slow)
        assert orphans.reap(str(tmp_path), lambda _m: None, wait_s=5) == 1
        assert len(looks) >= 4 and proc.wait(timeout=5) == -9
    finally:
        proc.kill()
        proc.wait()


def _pids_in_session(sid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            got = orphans._stat_of(name)
            if got is not None and got[1] == sid and int(name) != sid:
                out.append(int(name))
    return out


def _wait_for(cond: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def test_a_sweep_leaves_the_command_s_own_group_to_its_kill(tmp_path: Path) -> None:
    """What is left in a reaped command's own process group is its group kill's, with the
    grace period a TERM gives; the sweep is for what moved to a group of its own."""
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    sid = leader.pid
    try:
        _wait_for(lambda: len(_pids_in_session(sid)) == 2)
        leader.kill()
        leader.wait()
        assert orphans.sweep_sessions({sid}) == 0
        assert len(_pids_in_session(sid)) == 2
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sid, 9)

