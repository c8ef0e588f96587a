"""Ctrl-C / SIGTERM during a build: exit 130/143, running commands gone, nothing recorded."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def _reaped(p: subprocess.Popen) -> Iterator[None]:  # type: ignore[type-arg]
    """A buildtool that a failed assertion left running is killed: one left spinning, or
    sleeping on a lock, would slow every later test."""
    try:
        yield
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def _wait_for(marker: Path, what: str, poll: float = 0.05) -> None:
    """Until ``marker`` exists (what the build does made it); ``what`` if not within 20 s."""
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, what
        time.sleep(poll)


def _signal_once_started(p: subprocess.Popen, marker: Path, sig: int, what: str) -> tuple:  # type: ignore[type-arg]
    """Send ``sig`` once ``marker`` exists (what the build does made it); its output."""
    _wait_for(marker, what)
    p.send_signal(sig)
    return p.communicate(timeout=20)


def _workspace(tmp_path: Path) -> Path:
    """An empty workspace (its buildtool.toml) in ``tmp_path``/ws."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "buildtool.toml").write_text("")
    return ws


def _hup_default() -> None:
    """In the child: SIGHUP and SIGQUIT at their defaults, whatever this test run inherited
    (``nohup``, a CI runner)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                           (signal.SIGQUIT, 131)])
def test_signal_cancels_running_commands(tmp_path: Path, sig: int, code: int) -> None:
    """SIGHUP too (a terminal closed, an ssh connection dropped), and SIGQUIT (Ctrl-\\): they
    killed buildtool at once, and its commands, each in a session of its own, ran on."""
    ws = _workspace(tmp_path)
    marker = tmp_path / "started"
    nap = f"{60 + (os.getpid() % 1000) / 1000 + sig / 10000:.4f}"  # unique to this test run
    (ws / "BUILD.py").write_text(
        f'genrule(name="slow", outs=["s.txt"], cmd="touch {marker}; sleep {nap}; echo > $@")\n'
        'genrule(name="after", srcs=[":slow"], outs=["a.txt"], cmd="cp $< $@")\n'
        'genrule(name="quick", outs=["q.txt"], cmd="echo q > $@")\n'
    )
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    assert subprocess.run(["buildtool", "-C", str(ws), "build", "//:quick"], env=env).returncode == 0
    (ws / "q.txt").unlink()  # (restored before the signal: work done, a chain to print)
    events = tmp_path / "ev.jsonl"
    p = subprocess.Popen(
        ["buildtool", "-C", str(ws), "build", "--events", str(events)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_hup_default,
    )
    with _reaped(p):
        out, _ = _signal_once_started(p, marker, sig, "the command never started")
    assert p.returncode == code
    assert b"restored //:quick" in out and b"critical path" not in out, out  # (of what finished: meaningless)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"sleep {nap}" not in ps
    assert not (ws / "s.txt").exists()
    statuses = {e["label"]: e["status"] for e in map(json.loads, events.read_text().splitlines()[1:])}
    assert statuses == {"//:slow": "cancelled", "//:after": "cancelled", "//:quick": "restored"}
    # Nothing partial was recorded: the next build runs the command again.
    (ws / "BUILD.py").write_text('genrule(name="slow", outs=["s.txt"], cmd="echo > $@")\n')
    r = subprocess.run(["buildtool", "-C", str(ws), "build"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "1 ran" in r.stdout


def test_sighup_ignored_from_the_start_stays_ignored(tmp_path: Path) -> None:
    """``nohup buildtool build``: the build goes on when the terminal goes."""
    ws = _workspace(tmp_path)
    marker = tmp_path / "started"
    (ws / "BUILD.py").write_text(f'genrule(name="g", outs=["g.txt"], cmd="touch {marker}; sleep 0.5; echo > $@")\n')
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.Popen(["buildtool", "-C", str(ws), "build"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    with _reaped(p):
        out, err = _signal_once_started(p, marker, signal.SIGHUP, "the command never started")
    assert p.returncode == 0, (out, err)
    assert (ws / "g.txt").exists()


@pytest.mark.parametrize("how", ["sigterm", "timeout"])
def test_a_member_that_ignores_sigterm_is_killed_before_buildtool_exits(tmp_path: Path, how: str) -> None:
    """The command's leader exits on SIGTERM, a member of its group ignores it: the SIGKILL
    after the grace period must not die with buildtool's own exit."""
    ws = _workspace(tmp_path)
    marker = tmp_path / "started"
    nap = f"{70 + (os.getpid() % 1000) / 1000 + len(how) / 10000:.4f}"  # unique to this test run
    timeout = ", timeout=1" if how == "timeout" else ""
    (ws / "BUILD.py").write_text(
        f'test(name="t", cmd="sh -c \'trap \\"\\" TERM INT; touch {marker}; sleep {nap}\' & wait"{timeout})\n')
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.Popen(["buildtool", "-C", str(ws), "test"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    with _reaped(p):
        _wait_for(marker, "the command never started")
        if how == "sigterm":
            p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
    assert p.returncode == (143 if how == "sigterm" else 1)
    time.sleep(0.3)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"sleep {nap}" not in ps


@pytest.mark.parametrize(("where", "inherited"), [("buildfile", signal.SIG_DFL), ("module", signal.SIG_DFL),
                                                  ("buildfile", signal.SIG_IGN)],
                         ids=["buildfile", "module", "started-with-sigint-ignored"])
def test_ctrl_c_in_an_endless_buildfile_names_it(tmp_path: Path, where: str, inherited: object) -> None:
    """A BUILD.py (or a module it imports) that never returns: Ctrl-C ends the command with
    130 and says which file was running, instead of ending without a word.  Also when
    buildtool was started with SIGINT ignored (``buildtool build &`` in a script; and
    whatever this test run inherited): the build phase stops on it all the same."""
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "buildtool.toml").write_text("")
    marker = tmp_path / "evaluating"
    spin = f"open({str(marker)!r}, 'w').close()\nwhile True:\n    pass\n"
    if where == "buildfile":
        (ws / "pkg" / "BUILD.py").write_text(spin)
        expected = "interrupted while evaluating pkg/BUILD.py:2"
    else:
        (ws / "spinning.py").write_text("def spin():\n" + "".join(f"    {ln}\n" for ln in spin.splitlines()))
        (ws / "pkg" / "BUILD.py").write_text("from spinning import spin\n\nspin()\n")
        expected = "interrupted while evaluating pkg/BUILD.py (at spinning.py:3)"
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "c"))
    p = subprocess.Popen(["buildtool", "-C", str(ws), "build", "//..."], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, inherited))  # type: ignore[arg-type]
    with _reaped(p):
        _, err = _signal_once_started(p, marker, signal.SIGINT, "the BUILD.py never ran")
    assert p.returncode == 130
    assert f"buildtool: {expected}" in err, err
    assert "Traceback" not in err


def _second_lock(ws: Path) -> Path:
    """The build's lock file outside the workspace (lock.second_lock_path)."""
    st = ws.stat()
    return Path(f"/tmp/buildtool-{os.getuid()}/{st.st_dev:x}-{st.st_ino:x}.lock")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGQUIT, 131)])
def test_sigterm_in_an_endless_buildfile_names_it_and_releases_the_locks(tmp_path: Path, sig: int, code: int) -> None:
    """As Ctrl-C does: SIGTERM and SIGHUP while a BUILD.py ran took their default action,
    no word (a Python parent saw -15), and the lock file in /tmp was left behind."""
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "buildtool.toml").write_text("")
    marker = tmp_path / "evaluating"
    (ws / "pkg" / "BUILD.py").write_text(f"open({str(marker)!r}, 'w').close()\nwhile True:\n    pass\n")
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "c"))
    p = subprocess.Popen(["buildtool", "-C", str(ws), "build", "//..."], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_hup_default)
    with _reaped(p):
        _wait_for(marker, "the BUILD.py never ran")
        assert _second_lock(ws).exists()  # (held while the BUILD.py runs)
        p.send_signal(sig)
        _, err = p.communicate(timeout=20)
    assert p.returncode == code, err
    assert f"buildtool: interrupted by signal {sig} while evaluating pkg/BUILD.py:2" in err, err
    assert "Traceback" not in err
    assert not _second_lock(ws).exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_waiting_for_the_lock_is_said_and_exit_128_plus_it(tmp_path: Path, sig: int) -> None:
    # SIGINT too: a CI system cancels a job with it first (GitHub), where no terminal shows ^C.
    ws = _workspace(tmp_path)
    marker = tmp_path / "started"
    (ws / "BUILD.py").write_text(f'genrule(name="g", outs=["g.txt"], cmd="touch {marker}; sleep 30; echo > $@")\n')
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    first = subprocess.Popen(["buildtool", "-C", str(ws), "build"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    with _reaped(first):
        _wait_for(marker, "the command never started")
        log = tmp_path / "second.err"
        with open(log, "w") as err_f:
            second = subprocess.Popen(["buildtool", "-C", str(ws), "build", "--events", str(tmp_path / "ev")],
                                      env=env, stdout=subprocess.DEVNULL, stderr=err_f,
                                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
        with _reaped(second):
            deadline = time.monotonic() + 20
            while "waiting for another buildtool" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            second.send_signal(sig)
            second.wait(20)
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=20)
    assert second.returncode == 128 + sig, log.read_text()
    assert f"buildtool: error: interrupted by signal {sig}" in log.read_text()
    assert first.returncode == 130


@pytest.mark.parametrize("command", ["build", "test"])
def test_a_command_that_exits_0_on_sigterm_is_not_recorded(tmp_path: Path, command: str) -> None:
    """A command that traps SIGTERM, writes half its output and exits 0 was recorded and
    cached: the next build called the partial output up to date (and restored it in other
    checkouts), and a test cut short this way became PASSED (cached)."""
    ws = _workspace(tmp_path)
    marker = tmp_path / "started"
    cut = f"touch {marker}; trap 'echo partial > out.txt; exit 0' TERM; sleep 30 & wait"
    (ws / "BUILD.py").write_text(
        f'genrule(name="g", outs=["out.txt"], cmd="{cut}; echo full > out.txt")\n'
        f'test(name="t", cmd="{cut}; exit 1")\n'
    )
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    target = "//:g" if command == "build" else "//:t"
    p = subprocess.Popen(["buildtool", "-C", str(ws), command, target], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with _reaped(p):
        out, err = _signal_once_started(p, marker, signal.SIGINT, "the command never started")
    assert p.returncode == 130, (out, err)
    assert b"PASSED" not in out, out
    if command == "build":
        assert not (ws / "out.txt").exists()  # the partial output is deleted, as a failure's
    r = subprocess.run(["buildtool", "-C", str(ws), "explain", "--test" if command == "test" else "--", target],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "WOULD RUN" in r.stdout, r.stdout + r.stderr


_IMPORT_INTERRUPTED = r'''
import runpy, sys
class CtrlC:  # Ctrl-C arriving while the command's modules are imported
    def find_spec(self, name, path, target=None):
        if name == "buildtool.cli":
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
sys.argv = [sys.argv[1], "--version"]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@pytest.mark.parametrize("entry", ["scripts/buildtool", "buildtool/__main__.py"])
def test_ctrl_c_while_the_command_is_imported_is_exit_130_without_a_traceback(entry: str) -> None:
    """In the first ~20 ms (one early SIGINT in 60) a traceback was printed and the process
    died by the signal instead of exiting 130."""
    import sys

    script = Path(__file__).resolve().parent.parent / entry
    r = subprocess.run([sys.executable, "-c", _IMPORT_INTERRUPTED, str(script)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 130 and "Traceback" not in r.stderr, (r.returncode, r.stderr)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_while_the_reports_are_written_lets_them_finish(tmp_path: Path, sig: int, code: int) -> None:
    """The signal handlers were put back to the defaults as soon as the scheduler returned:
    Ctrl-C while the JUnit file was written left the last run's (or, on SIGTERM, half a temp
    file) and no word.  Now the reports are finished, then the build ends interrupted.
    The JUnit file is a FIFO here, read only once the signal is sent: its writer is then
    surely in the middle of writing it (it is larger than a pipe holds)."""
    ws = _workspace(tmp_path)
    (ws / "BUILD.py").write_text(
        'test(name="big", cmd="head -c 300000 /dev/zero | tr \'\\\\0\' x | fold -w 1000; exit 1")\n'
        'test(name="ok", cmd="true")\n')
    junit = tmp_path / "j.xml"
    os.mkfifo(junit)
    reader = os.open(junit, os.O_RDONLY | os.O_NONBLOCK)  # (so that buildtool's open does not wait)
    events = tmp_path / "ev.jsonl"
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.Popen(["buildtool", "-C", str(ws), "test", "-k", "--junit", str(junit), "--events", str(events),
                          "--test-output", "none"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))  # (not nohup's)
    with _reaped(p), os.fdopen(reader, "rb") as f:
        poller = select.poll()
        poller.register(reader, select.POLLIN)
        assert poller.poll(60_000), "the JUnit file was never written"
        p.send_signal(sig)
        time.sleep(0.2)  # (the signal is taken while the writer waits for room in the pipe)
        os.set_blocking(reader, True)
        written = f.read()
        _, err = p.communicate(timeout=20)
    assert p.returncode == code, err
    assert f"interrupted by signal {sig}".encode() in err, err
    assert written.rstrip().endswith(b"</testsuites>") and written.count(b'<testcase ') == 2, written[-200:]
    statuses = {e["label"]: e["status"] for e in map(json.loads, events.read_text().splitlines()[1:])}
    assert statuses == {"//:big": "failed", "//:ok": "ran"}  # (the events file is whole as well)
    assert not (ws / ".buildtool" / "tmp").exists()


@contextlib.contextmanager
def _writing_its_junit_into_a_fifo(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A `buildtool test --junit FIFO` (no reader yet: the write waits for one), yielded
    once its results are printed: it is writing the report."""
    import threading

    ws = _workspace(tmp_path)
    (ws / "BUILD.py").write_text('test(name="t", cmd="echo hi")\n')
    junit = tmp_path / "j.xml"
    os.mkfifo(junit)
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.Popen(["buildtool", "-C", str(ws), "test", "--junit", str(junit)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_hup_default)
    lines: list[str] = []
    with _reaped(p):
        assert p.stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)  # type: ignore[arg-type]
        reader.start()
        deadline = time.monotonic() + 30
        while not any("PASSED" in ln for ln in lines):  # (the results table: the JUnit file is next)
            assert p.poll() is None and time.monotonic() < deadline, "the test never passed"
            time.sleep(0.05)
        time.sleep(0.3)
        yield p, junit


def test_a_second_signal_while_a_report_write_blocks_ends_the_build(tmp_path: Path) -> None:
    """The first signal is held while the reports are written; a write that blocks (a FIFO
    nobody reads, a hung mount) left only kill -9.  A second signal leaves at once."""
    with _writing_its_junit_into_a_fifo(tmp_path) as (p, _):
        p.send_signal(signal.SIGINT)
        time.sleep(1.3)  # (well past a burst, which is one signal: the next test)
        assert p.poll() is None  # (held: the report is being written)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=10)
        assert p.stderr is not None
        err = p.stderr.read()
    assert p.returncode == 143, err
    assert "Traceback" not in err, err
    assert not _second_lock(tmp_path / "ws").exists()


def test_a_burst_of_two_signals_while_a_report_is_written_lets_it_finish(tmp_path: Path) -> None:
    """A supervisor signalling the process group and the process (two SIGTERMs ms apart) is
    one signal, as the docs say of a burst: the second ended the build with no report."""
    import threading

    got: list[bytes] = []
    with _writing_its_junit_into_a_fifo(tmp_path) as (p, junit):
        p.send_signal(signal.SIGTERM)
        time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert p.poll() is None, "the burst's second signal ended the build"
        fifo_reader = threading.Thread(target=lambda: got.append(junit.read_bytes()), daemon=True)
        fifo_reader.start()
        p.wait(timeout=20)
        fifo_reader.join(timeout=10)
        assert p.stderr is not None
        err = p.stderr.read()
    assert p.returncode == 143 and "Traceback" not in err, err
    assert got and got[0].rstrip().endswith(b"</testsuites>"), got


def test_a_burst_of_sigterms_leaves_once_with_no_traceback_and_no_lock(tmp_path: Path) -> None:
    """A supervisor repeating SIGTERM: a second one cut the finally blocks that release the
    locks (the lock file in /tmp was left), or the exit itself (a traceback, -15)."""
    ws = _workspace(tmp_path)
    marker = tmp_path / "evaluating"
    (ws / "BUILD.py").write_text(f"open({str(marker)!r}, 'w').close()\nwhile True:\n    pass\n")
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "c"))
    for _ in range(15):  # (a race: one run in six or so hit it)
        marker.unlink(missing_ok=True)
        p = subprocess.Popen(["buildtool", "-C", str(ws), "build"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, preexec_fn=_hup_default)
        with _reaped(p):
            _wait_for(marker, "the BUILD.py never ran", poll=0.02)
            for _ in range(30):
                if p.poll() is not None:
                    break
                p.send_signal(signal.SIGTERM)
                time.sleep(0.0005)
            _, err = p.communicate(timeout=20)
        assert p.returncode == 143, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert not _second_lock(ws).exists()


def test_run_hands_an_ignored_sigterm_on_to_the_program(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "BUILD.py").write_text(
        'genrule(name="r", outs=["r.sh"], cmd="printf \'#!/bin/sh\\\\ngrep SigIgn /proc/$$$$/status\\\\n\' > $@; '
        'chmod +x $@")\n')
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "c"))

    def ignore_term() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    r = subprocess.run(["buildtool", "-C", str(ws), "run", "//:r"], capture_output=True, text=True, env=env,
                       preexec_fn=ignore_term, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    mask = int(r.stdout.split()[-1], 16)
    assert mask & (1 << (signal.SIGTERM - 1)), r.stdout


def _alive(pid: int) -> bool:
    """Is ``pid`` a live process (not a zombie)?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _wait_dead(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("how", ["timeout", "interrupt"])
def test_what_a_command_moves_to_a_process_group_of_its_own_does_not_outlive_the_build(
    tmp_path: Path, how: str
) -> None:
    """A child in another process group of the command's session (bash's `set -m`,
    Popen(process_group=0)) was missed by the kill of the command's group: it outlived
    Ctrl-C and a test's timeout (a fixture's server kept its port)."""
    ws = _workspace(tmp_path)
    pidfile = tmp_path / "pid"
    escape = f"bash -c 'set -m; sleep 300 & echo $$! > {pidfile}; wait'"
    if how == "timeout":
        (ws / "BUILD.py").write_text(f'test(name="t", cmd="{escape}", timeout=1)\n')
        args = ["test", "//:t"]
    else:
        (ws / "BUILD.py").write_text(f'genrule(name="g", outs=["g.txt"], cmd="{escape}; echo > $@")\n')
        args = ["build"]
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.Popen(["buildtool", "-C", str(ws), *args], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_hup_default)
    pid = 0
    try:
        with _reaped(p):
            _wait_for(pidfile, "the command never started")
            while not pidfile.read_text().strip():
                time.sleep(0.02)
            pid = int(pidfile.read_text())
            if how == "interrupt":
                p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=30)
        expected = {"timeout": 1, "interrupt": 130}[how]
        assert p.returncode == expected, out + err
        assert _wait_dead(pid, 5), f"the escaped child {pid} outlived the build"
    finally:
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("where", ["evaluating", "waiting for the lock"])
def test_an_interrupt_before_the_commands_removes_the_last_run_s_reports(tmp_path: Path, where: str) -> None:
    """As an exit 2 does: a run cut short while a BUILD.py was evaluated or while it waited
    for the lock left the last run's JUnit and events files, which a CI step that uploads
    them anyway showed as this run's passes."""
    ws = _workspace(tmp_path)
    marker = tmp_path / "evaluating"
    (ws / "BUILD.py").write_text('import os, time\n'
                                 'if os.environ.get("SLOW"):\n'
                                 f'    open({str(marker)!r}, "w").close()\n'
                                 '    time.sleep(30)\n'
                                 'test(name="t", cmd="true")\n')
    junit, events = tmp_path / "j.xml", tmp_path / "ev.jsonl"
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    reports = ["--junit", str(junit), "--events", str(events)]
    r = subprocess.run(["buildtool", "-C", str(ws), "test", *reports], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and junit.is_file() and events.is_file(), r.stdout + r.stderr
    holder = None
    if where == "evaluating":
        env["SLOW"] = "1"
    else:  # another build holds the workspace
        holder = subprocess.Popen(["flock", str(ws / ".buildtool" / "lock"), "-c", f"touch {marker}; sleep 30"])
    p = subprocess.Popen(["buildtool", "-C", str(ws), "test", *reports], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_hup_default)
    try:
        with _reaped(p):
            _wait_for(marker, "never got there")
            time.sleep(0.5)
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=20)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    assert p.returncode == 143, out + err
    assert not junit.exists() and not events.exists(), err


@pytest.mark.parametrize("leader", ["dies on SIGTERM", "ignores SIGTERM"])
def test_a_timed_out_test_s_escaped_server_is_gone_before_its_retry(tmp_path: Path, leader: str) -> None:
    """The sweep of a timed-out command's session came at the end of its grace period (too
    late for a flaky test's retry, which started at once) or, when its shell ignored
    SIGTERM, found the shell still alive and left the session alone."""
    ws = _workspace(tmp_path)
    pidfile = tmp_path / "pid"
    trap = "trap '' TERM; " if leader == "ignores SIGTERM" else ""
    (ws / "t.sh").write_text(  # (the retry: the first attempt's server must be gone, at most a zombie
        f'if [ -s {pidfile} ]; then\n'  # init has yet to reap, within half a second)
        f'  for i in 1 2 3 4 5; do\n'
        f'    s=$(cut -d" " -f3 /proc/$(cat {pidfile})/stat 2>/dev/null)\n'
        f'    if [ -z "$s" ] || [ "$s" = Z ]; then exit 0; fi; sleep 0.1\n'
        f'  done; echo ALIVE; exit 1\n'
        f'fi\n'
        f"{trap}bash -c 'set -m; sleep 300 & echo $! > {pidfile}; wait'\n")
    (ws / "BUILD.py").write_text('test(name="t", srcs=["t.sh"], cmd="sh t.sh", timeout=1, flaky=1)\n')
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    pid = 0
    try:
        r = subprocess.run(["buildtool", "-C", str(ws), "test", "//:t"], env=env, capture_output=True, text=True,
                           timeout=60, preexec_fn=_hup_default)
        pid = int(pidfile.read_text())
        assert r.returncode == 0 and "FLAKY" in r.stdout, r.stdout + r.stderr
    finally:
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("when", ["commands", "evaluation"])
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_is_128_plus_the_signal_when_the_output_is_gone(
    tmp_path: Path, when: str, sig: int, code: int
) -> None:
    """`buildtool build 2>&1 | tee log` cancelled (the signal ends tee too), or a terminal
    closed: the last message went to a dead stderr, and its write error made the exit 1,
    "a command failed", for a build that was interrupted."""
    ws = _workspace(tmp_path)
    marker = tmp_path / "started"
    if when == "commands":
        (ws / "BUILD.py").write_text(f'genrule(name="c", outs=["c.txt"], cmd="touch {marker}; sleep 30; echo > $@")\n')
    else:
        (ws / "BUILD.py").write_text(f"open({str(marker)!r}, 'w').close()\nwhile True:\n    pass\n")
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    r, w = os.pipe()
    p = subprocess.Popen(["buildtool", "-C", str(ws), "build"], env=env, stdout=w, stderr=w,
                         preexec_fn=_hup_default)
    os.close(w)
    with _reaped(p):
        _wait_for(marker, "the build never started")
        os.close(r)  # (the reader gone: each write now fails)
        p.send_signal(sig)
        assert p.wait(timeout=30) == code


def test_a_test_interrupted_while_it_ran_is_reported_so_with_its_output(tmp_path: Path) -> None:
    """A CI job's timeout (SIGTERM) while a test ran: the summary said NOT RUN with no log,
    JUnit `<skipped>` (neutral on a dashboard) without its output, and the profile had no
    span of it: what was running, the first question, was answered by --events alone."""
    ws = _workspace(tmp_path)
    (ws / "BUILD.py").write_text(
        'test(name="quick", cmd="echo quick ok")\n'
        'test(name="hangs", cmd="echo connecting to db...; touch ../started; sleep 30")\n'
        # (never started: what it needs was still being built; not "interrupted", nor its start 0)
        'genrule(name="slow_fixture", outs=["fixture"], cmd="sleep 30; touch $@")\n'
        'test(name="queued", srcs=[":slow_fixture"], cmd="true")\n')
    junit, profile, events = tmp_path / "j.xml", tmp_path / "trace.json", tmp_path / "ev.jsonl"
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.Popen(["buildtool", "-C", str(ws), "test", "-j2", "--junit", str(junit), "--profile", str(profile),
                          "--events", str(events)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_hup_default)
    with _reaped(p):
        out, err = _signal_once_started(p, tmp_path / "started", signal.SIGTERM, "the test never started")
    assert p.returncode == 143, out + err
    line = next(x for x in out.splitlines() if x.startswith("//:hangs "))
    assert " INTERRUPTED in " in line and "log: .buildtool/testlogs/hangs.log" in line, out
    assert "1 passed, 1 interrupted, 1 not run); 2 executed" in out, out  # (it ran, to its interruption)
    assert " NOT RUN" in next(x for x in out.splitlines() if x.startswith("//:queued ")), out
    assert (ws / ".buildtool/testlogs/hangs.log").read_text() == "connecting to db...\n"
    import xml.etree.ElementTree as ET

    suite = ET.parse(junit).getroot()
    case = next(c for c in suite.iter("testcase") if c.get("name") == "//:hangs")
    error = case.find("error")
    assert error is not None and error.get("type") == "interrupted" and case.find("skipped") is None, ET.tostring(case)
    assert case.findtext("system-out") == "connecting to db...\n" and suite.get("errors") == "1", ET.tostring(suite)
    queued = next(c for c in suite.iter("testcase") if c.get("name") == "//:queued")
    assert queued.find("skipped") is not None and queued.find("error") is None, ET.tostring(queued)
    assert float(suite.get("time") or "inf") < 60, ET.tostring(suite)
    spans = {e["name"]: e for e in json.loads(profile.read_text())["traceEvents"] if e.get("cat") == "target"}
    assert spans["//:hangs"]["args"]["status"] == "cancelled" and spans["//:hangs"]["dur"] > 0, spans
    lines = {e["label"]: e for e in map(json.loads, events.read_text().splitlines()) if "label" in e}
    assert lines["//:hangs"]["test"] == "interrupted" and lines["//:quick"]["test"] == "passed", lines


def test_the_quick_exit_kills_the_commands_still_running() -> None:
    """The third signal's quick exit left the commands running as orphans (a review): it
    SIGKILLs the process group of every command an executor of the process started."""
    from buildtool import executor

    p = subprocess.Popen(["sleep", "30"], start_new_session=True)
    with _reaped(p):
        ex = executor.SubprocessExecutor()
        ex._procs[p.pid] = None  # type: ignore[assignment]  # (the quick exit reads only the group ids)
        executor.kill_everything_now()
        assert p.wait(timeout=10) == -signal.SIGKILL


def test_a_buildfile_that_catches_the_interrupt_is_left_on_the_third(tmp_path: Path) -> None:
    """A BUILD.py whose wait loop has a bare ``except:`` caught each KeyboardInterrupt, and
    every further signal was ignored (the command on its way out): only SIGKILL ended it.
    The second is said; the third, 3 s after the first, quits at once (Bazel's three
    Ctrl-Cs), exit 130; the next build is not held up by a lock."""
    ws = _workspace(tmp_path)
    marker = tmp_path / "evaluating"
    (ws / "BUILD.py").write_text(
        f"import time\nopen({str(marker)!r}, 'w').close()\nwhile True:\n"
        "    try:\n        time.sleep(0.05)\n    except:\n        pass\n"
    )
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "c"))
    p = subprocess.Popen(["buildtool", "-C", str(ws), "build"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, preexec_fn=_hup_default)
    with _reaped(p):
        _wait_for(marker, "the BUILD.py never ran")
        for _ in range(3):  # (the third within 3 s of the first: still the orderly way, still looping)
            p.send_signal(signal.SIGINT)
            time.sleep(0.8)
        assert p.poll() is None
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
    assert p.returncode == 130, err
    assert "once more quits at once" in err and "a third stop signal (2): quitting at once" in err, err
    (ws / "BUILD.py").write_text('genrule(name="x", outs=["x"], cmd="touch $@")\n')
    r = subprocess.run(["buildtool", "-C", str(ws), "build", "--no-wait"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr



def test_a_flaky_test_interrupted_in_its_retry_leaves_no_cached_pass_for_the_failed_key(tmp_path: Path) -> None:
    """Its first attempt failed with a key the cache held a pass of; Ctrl-C during the retry.
    That pass must not answer for the key any more: another checkout sharing the cache got
    PASSED (cached) for a key that had just failed."""
    ws = _workspace(tmp_path)
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ws / "BUILD.py").write_text(
        f'test(name="t", flaky=1, cmd="if [ -e {ctl}/fail ]; then if [ -e {ctl}/tried ]; then touch {ctl}/started; '
        f'sleep 30; else touch {ctl}/tried; exit 1; fi; fi")\n')
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(["buildtool", "-C", str(ws), "test"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr  # (a pass of the key, in the shared cache)
    (ctl / "fail").touch()
    p = subprocess.Popen(["buildtool", "-C", str(ws), "test", "--no-cache-tests"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_hup_default)
    with _reaped(p):
        out, err = _signal_once_started(p, ctl / "started", signal.SIGINT, "the retry never started")
    assert p.returncode == 130, out + err
    (ctl / "fail").unlink()
    other = tmp_path / "other"
    other.mkdir()
    for name in ("buildtool.toml", "BUILD.py"):
        (other / name).write_text((ws / name).read_text())
    r = subprocess.run(["buildtool", "-C", str(other), "test"], env=env, capture_output=True, text=True, timeout=60)
    line = next(x for x in r.stdout.splitlines() if x.startswith("//:t "))
    assert r.returncode == 0 and " PASSED" in line and "cached" not in line, r.stdout + r.stderr
