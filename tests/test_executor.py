"""Executor end to end: how the real ``buildtool`` command starts commands.

Simple commands (simplecmd.py) start without ``/bin/sh``; anything else, and any simple
command that cannot be started directly, runs under the shell with the shell's own
errors and exit statuses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Workspace

from buildtool import executor, simplecmd

# Writes the name of its parent process to $1: buildtool when started directly, the
# shell when started by `sh -c`.
PARENT_PROBE = '#!/bin/sh\ncat /proc/$PPID/comm > "$1"\n'


def test_simple_commands_start_without_a_shell(workspace: Workspace) -> None:
    workspace.write("probe.sh", PARENT_PROBE, mode=0o755)
    workspace.build_file(
        "",
        """
        genrule(name="direct", srcs=["probe.sh"], outs=["direct.txt"], cmd="./probe.sh direct.txt")
        genrule(name="shell", srcs=["probe.sh"], outs=["shell.txt"], cmd="./probe.sh shell.txt && true")
        """,
    )
    r = workspace.build()
    assert r.rc == 0, r.output
    shells = {"sh", "dash", "bash"}
    assert workspace.read("direct.txt").strip() not in shells
    assert workspace.read("shell.txt").strip() in shells


def test_stdout_redirection_without_a_shell(workspace: Workspace) -> None:
    workspace.write("a.txt", "a\n")
    workspace.write("b.txt", "b\n")
    workspace.write("out/old.txt", "stale content that is longer than the new one\n")
    workspace.build_file(
        "",
        """
        genrule(name="cat", srcs=["a.txt", "b.txt"], outs=["out/ab.txt"], cmd="cat $(SRCS) > $@")
        """,
    )
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("out/ab.txt") == "a\nb\n"
    assert (workspace.path("out/ab.txt").stat().st_mode & 0o777) == 0o644  # 0666 less the umask (022)


def test_a_redirect_into_a_setgid_directory_takes_the_directory_s_group(workspace: Workspace) -> None:
    # As `sh -c 'cat a.txt > $@'` would make it: the file is not made in the staging dir
    # (whose group it would keep once linked into place).
    other = [g for g in os.getgroups() if g != os.getegid()]
    gid = 4242 if os.geteuid() == 0 else (other[0] if other else None)
    if gid is None:
        pytest.skip("needs a second group")
    workspace.write("a.txt", "a\n")
    out = workspace.path("out")
    out.mkdir()
    os.chown(out, -1, gid)
    out.chmod(0o2775)
    workspace.build_file("", 'genrule(name="cat", srcs=["a.txt"], outs=["out/a.txt"], cmd="cat a.txt > $@")\n')
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.path("out/a.txt").stat().st_gid == gid


def test_direct_start_sees_the_same_environment_as_the_shell_gives(workspace: Workspace) -> None:
    workspace.build_file(
        "",
        """
        genrule(name="direct", outs=["sub/direct.txt"], cmd="env > sub/direct.txt")
        genrule(name="shell", outs=["sub/shell.txt"], cmd="env > sub/shell.txt; true")
        """,
    )
    r = workspace.build()
    assert r.rc == 0, r.output

    def env_of(rel: str) -> dict[str, str]:
        pairs = (line.partition("=") for line in workspace.read(rel).splitlines())
        return {k: v for k, _, v in pairs if k not in ("_", "SHLVL", "OLDPWD", "TMPDIR", "HOME", "BUILDTOOL_LANE")}

    direct, shell = env_of("sub/direct.txt"), env_of("sub/shell.txt")
    assert direct == shell
    assert Path(direct["PWD"]).resolve() == workspace.root.resolve()


def test_a_missing_program_gets_the_shells_message_and_status(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="nope", outs=["x"], cmd="no-such-program-xyz a b")')
    r = workspace.build()
    assert r.rc == 1
    assert "exited with status 127" in r.output
    assert "not found" in r.output


def test_a_script_without_a_shebang_is_run_by_the_shell(workspace: Workspace) -> None:
    workspace.write("gen", "echo from-script > out.txt\n", mode=0o755)
    workspace.build_file("", 'genrule(name="gen", srcs=["gen"], outs=["out.txt"], cmd="./gen")')
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("out.txt") == "from-script\n"


def test_redirect_into_a_missing_directory_fails_as_the_shell_says(workspace: Workspace) -> None:
    workspace.write("a.txt", "a\n")
    workspace.build_file("", 'genrule(name="c", srcs=["a.txt"], outs=["o.txt"], cmd="cat a.txt > nodir/o.txt")')
    r = workspace.build()
    assert r.rc == 1
    assert "exited with status 2" in r.output  # sh: cannot create nodir/o.txt
    assert "nodir/o.txt" in r.output


def test_failing_direct_command_reports_its_status_and_output(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="ls", outs=["x"], cmd="ls does-not-exist")')
    r = workspace.build()
    assert r.rc == 1
    assert "exited with status 2" in r.output
    assert "does-not-exist" in r.output


def test_cancel_all_from_a_signal_handler_on_a_thread_holding_the_lock(tmp_path: Path) -> None:
    # The scheduler's thread holds the executor's lock while it starts and reaps commands;
    # SIGINT's handler runs on that same thread and calls cancel_all, which must not wait
    # for the lock its own thread holds (that hung the build until kill -9).  In a child
    # interpreter, so that a regression fails on the timeout instead of hanging the suite.
    script = f"""
import signal
from buildtool.executor import SubprocessExecutor
ex = SubprocessExecutor()
running = ex.start(["sleep", "30"], "/", {{"PATH": "/usr/bin:/bin"}}, capture={str(tmp_path / "cap")!r})
signal.signal(signal.SIGUSR1, lambda *_: ex.cancel_all())
with ex._lock:  # as Running.finish and start hold it
    signal.raise_signal(signal.SIGUSR1)
assert running.wait().exit_code == -signal.SIGTERM
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0 and p.stdout == "ok\n", p.stderr


def test_cancel_all_marks_running_commands_interrupted_not_ended_ones(tmp_path: Path) -> None:
    """A command that had exited (0) just before Ctrl-C was reported interrupted and its
    outputs deleted; one still running is cut short whatever it then exits with; a
    console-pool command (no process group of its own) is signalled too, not skipped."""
    env = {"PATH": "/usr/bin:/bin"}
    ex = executor.SubprocessExecutor()
    done = ex.start(["/bin/sh", "-c", "exit 0"], str(tmp_path), env, capture=str(tmp_path / "a"))
    os.waitid(os.P_PID, done.proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped yet
    trap = ex.start(["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 30 & wait"], str(tmp_path), env,
                    capture=str(tmp_path / "b"))
    console = ex.start(["sleep", "30"], str(tmp_path), env, capture=None)
    import time

    time.sleep(0.2)  # (the trap is set)
    ex.cancel_all()
    assert not done.wait().interrupted
    r = trap.wait()
    assert r.interrupted and r.exit_code == 0
    r = console.wait()
    assert r.interrupted and r.exit_code == -signal.SIGTERM


@pytest.mark.parametrize("at_end", [True, False], ids=["a-build", "a-remote-worker-lease"])
def test_ctrl_c_sweeps_the_commands_sessions_in_one_pass(tmp_path: Path, monkeypatch, at_end: bool) -> None:
    """Each command cut short by Ctrl-C swept /proc for what its session left when it was
    reaped: 500 commands took 4 s to stop (Ninja 0.12 s), more with every process on the
    machine.  A build (whose session calls kill_remaining at its end) sweeps them all in
    that one pass; an owner that does not (a remote worker's lease) still sweeps each as it
    is reaped.  What a command moved to a group of its own is killed either way."""
    swept: list[set[int]] = []
    real = executor.sweep_sessions

    def counting(sids: set[int], own: object = ()) -> int:
        swept.append(set(sids))
        return real(sids, own)  # type: ignore[arg-type]

    monkeypatch.setattr(executor, "sweep_sessions", counting)
    env = {"PATH": "/usr/bin:/bin"}
    ex = executor.SubprocessExecutor()
    ex.sweep_at_end = at_end
    mark = tmp_path / "escaped.pid"
    # (set -m: the background sleep leads a group of its own in the command's session)
    runs = [ex.start(["/bin/sh", "-c", f"set -m; sleep 30 & echo $! > {mark}.{i}; wait"], str(tmp_path), env,
                     capture=str(tmp_path / f"c{i}")) for i in range(5)]
    import time

    deadline = time.monotonic() + 10
    while not all(os.path.exists(f"{mark}.{i}") and os.path.getsize(f"{mark}.{i}") for i in range(5)):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    escaped = [int(Path(f"{mark}.{i}").read_text()) for i in range(5)]
    ex.cancel_all()
    for r in runs:
        assert r.wait().interrupted
    if at_end:
        assert swept == []
        ex.kill_remaining()
        assert len(swept) == 1 and swept[0] == {r.proc.pid for r in runs}
    else:
        assert sorted(swept, key=min) == sorted(({r.proc.pid} for r in runs), key=min)

    def state(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "gone"

    deadline = time.monotonic() + 10  # (killed; gone, or a zombie of this test's process at most)
    while any(state(pid) not in ("Z", "gone") for pid in escaped):
        assert time.monotonic() < deadline, [state(pid) for pid in escaped]
        time.sleep(0.02)


# -- the two ways a simple command starts: posix_spawn in this process's directory, Popen
# elsewhere (posix_spawn cannot change the child's directory); the child must not tell them apart.
PROBE = f"""#!{sys.executable}
import json, os, sys
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
print("to stderr", file=sys.stderr)
json.dump({{
    "stdin": sys.stdin.read(),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "ignored": status["SigIgn"].strip(),
    "blocked": status["SigBlk"].strip(),
    "own_session": int(stat[3]) == os.getpid(),
    "pwd": os.environ["PWD"],
    "cwd": os.getcwd(),
    "env": sorted(k for k in os.environ if k not in ("PWD", "LC_CTYPE")),
}}, sys.stdout)
"""


def _start_in(where: str, tmp_path: Path, monkeypatch) -> tuple[str, object, dict]:
    """Run PROBE as a simple command in the process's directory ("here") or another one."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    for d in (here, elsewhere):
        d.mkdir(exist_ok=True)
        (d / "probe").write_text(PROBE)
        (d / "probe").chmod(0o755)
    monkeypatch.chdir(here)
    cwd = str(here if where == "here" else elsewhere)
    ex = executor.SubprocessExecutor()
    line = "./probe > out.json"
    running = ex.start(executor.shell_argv("sh", line, False), cwd, {"PATH": "/usr/bin:/bin", "K": "v"},
                       capture=str(tmp_path / f"cap-{where}"), direct=simplecmd.parse(line))
    kind = type(running.proc).__name__
    res = running.wait()
    assert res.exit_code == 0, res.stderr
    assert res.stderr == b"to stderr\n"
    return kind, res, json.loads(Path(cwd, "out.json").read_text())


def test_both_ways_of_starting_give_the_child_the_same_process(tmp_path: Path, monkeypatch) -> None:
    r, w = os.pipe()  # as a make jobserver's pipe: inheritable descriptors buildtool was given
    os.set_inheritable(r, True)
    os.set_inheritable(w, True)
    try:
        seen = {where: _start_in(where, tmp_path, monkeypatch) for where in ("here", "elsewhere")}
    finally:
        os.close(r)
        os.close(w)
    assert seen["elsewhere"][0] == "Popened"
    assert seen["here"][0] == ("Spawned" if executor.pidfds_work() else "Popened")
    here, elsewhere = seen["here"][2], seen["elsewhere"][2]
    assert here["stdin"] == elsewhere["stdin"] == ""  # /dev/null
    assert here["fds"] == elsewhere["fds"] == [0, 1, 2, 3]  # 3: the listing's own; the pipe closed
    # 1-31 alike: the probe's own (a Python ignores SIGPIPE and SIGXFSZ); 32 and 33: see below
    assert int(here["ignored"], 16) & 0x7FFFFFFF == int(elsewhere["ignored"], 16) & 0x7FFFFFFF
    assert here["blocked"] == elsewhere["blocked"]
    assert here["own_session"] and elsewhere["own_session"]
    assert here["pwd"] == here["cwd"] == str(tmp_path / "here")
    assert elsewhere["pwd"] == elsewhere["cwd"] == str(tmp_path / "elsewhere")
    assert here["env"] == elsewhere["env"] == ["K", "PATH"]


def _ignored_1_to_31(status: str) -> int:
    """The SigIgn mask of a /proc/<pid>/status text, signals 1-31 (bit n-1 for signal n)."""
    line = next(x for x in status.splitlines() if x.startswith("SigIgn:"))
    return int(line.split()[1], 16) & 0x7FFFFFFF


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_exit_status_signal_and_deadline_either_way(where: str, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    cwd = str(tmp_path / where)
    ex = executor.SubprocessExecutor()
    env = {"PATH": "/usr/bin:/bin"}

    def start(line: str, timeout: float | None = None) -> executor.Running:
        return ex.start(executor.shell_argv("sh", line, False), cwd, env, timeout=timeout,
                        capture=str(tmp_path / "cap"), direct=simplecmd.parse(line))

    assert start("ls no-such-file").wait().exit_code == 2
    # Python ignores SIGPIPE and SIGXFSZ; the child gets them back at their defaults.  Signals
    # this process inherited as ignored (nohup's SIGHUP, a background job's SIGINT and SIGQUIT)
    # stay ignored, as under make and ninja.  (glibc's posix_spawn leaves its internal signals
    # 32 and 33 ignored, as in any child CPython's own subprocess starts with posix_spawn:
    # docs/architecture.md#spawning.)
    assert start("cat /proc/self/status > status.txt").wait().exit_code == 0
    ours = _ignored_1_to_31(Path("/proc/self/status").read_text())
    python_s = (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))
    assert ours & python_s == python_s
    child = _ignored_1_to_31((tmp_path / where / "status.txt").read_text())
    assert child == ours & ~python_s, (hex(child), hex(ours))
    running = start("sleep 30", timeout=0.3)
    res = running.wait()
    assert res.timed_out and res.exit_code == -signal.SIGTERM
    # What a command leaves running in its process group ends with it (it wrote on into
    # the lane's next capture files and TMPDIR); the daemon of a session of its own stays.
    daemonize = "setsid sleep 30 & echo $! > daemon.pid; sleep 0.3"  # (then it has left the group)
    assert start(f"sh -c 'sleep 30 & echo $! > bg.pid; {daemonize}'").wait().exit_code == 0
    bg, daemon = (int((tmp_path / where / f"{n}.pid").read_text()) for n in ("bg", "daemon"))
    try:
        assert _ends(bg)
        assert Path(f"/proc/{daemon}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    finally:
        os.kill(daemon, signal.SIGKILL)
    running = start("sleep 30")
    ex.cancel_all()
    assert running.wait().exit_code == -signal.SIGTERM


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_a_console_command_leads_a_process_group_in_buildtools_session(
    where: str, tmp_path: Path, monkeypatch
) -> None:
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    line = "cat /proc/self/stat > stat.txt"
    ex = executor.SubprocessExecutor()
    running = ex.start(executor.shell_argv("sh", line, False), str(tmp_path / where), {"PATH": "/usr/bin:/bin"},
                       capture=None, direct=simplecmd.parse(line))
    assert type(running.proc).__name__ == ("Spawned" if where == "here" and executor.pidfds_work() else "Popened")
    assert running.wait().exit_code == 0
    fields = (tmp_path / where / "stat.txt").read_text().rsplit(")", 1)[1].split()
    assert int(fields[2]) == running.proc.pid  # its own group (what a timeout or Ctrl-C kills)...
    assert int(fields[3]) == os.getsid(0)  # ...in this session: the terminal stays its own
    # A background job of the terminal: its writes under `stty tostop` and its reads of
    # /dev/tty must not stop it (until its timeout); these two are blocked in it.
    blocked = int(fields[29])  # (field 32: the blocked signals)
    assert blocked & (1 << (signal.SIGTTIN - 1)) and blocked & (1 << (signal.SIGTTOU - 1)), hex(blocked)
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGTTIN, signal.SIGTTOU}  # (not here)


def _ends(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie within 5 s (a SIGKILL takes a moment to land;
    a killed orphan then waits for init to reap it)."""
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


def test_a_spawned_child_is_waited_for_by_polling_when_no_pidfd_can_be_opened(tmp_path: Path) -> None:
    # Spawned.ended_by falls back to waitid(WNOWAIT) polling (out of descriptors, say): it
    # must neither reap the child nor miss its end.
    import time

    pid = os.posix_spawn("/bin/sleep", ["sleep", "0.3"], {"PATH": "/usr/bin:/bin"})
    child = executor.Spawned(pid)
    assert executor._polled_until(pid, time.monotonic() + 0.05) is False
    assert executor._polled_until(pid, time.monotonic() + 10) is True
    assert child.returncode is None  # not reaped by the polling
    assert child.wait() == 0


# -- the console pool: its command leads a process group of its own (in buildtool's session,
# so it keeps the terminal), and a timeout, Ctrl-C or SIGTERM ends all of it.
def _pid_in(path: Path, timeout: float = 20) -> int:
    """The pid a command wrote to ``path`` (waiting for it)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written")


def _kill_if_alive(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def test_a_timed_out_console_command_is_killed_with_what_it_started(workspace: Workspace, tmp_path: Path) -> None:
    """Its children outlived buildtool (re-parented to init): only the shell was signalled;
    what it leaves running in its group when it exits ends with it, as for any command.
    (Their output goes elsewhere: one on buildtool's stdout would keep the pipe read here open.)"""
    workspace.build_file("", f"""
        test(name="slow", pool="console", timeout=1,
             cmd="echo console-out; sleep 30 >/dev/null 2>&1 & echo $! > {tmp_path}/slow.pid; wait")
        test(name="deaf", pool="console", timeout=1,
             cmd="trap '' TERM; sleep 31 >/dev/null 2>&1 & echo $! > {tmp_path}/deaf.pid; wait")
        test(name="left", pool="console", cmd="sleep 32 >/dev/null 2>&1 & echo $! > {tmp_path}/left.pid")
        """)
    r = workspace.build("//...", "-k", command="test")
    pids = [_pid_in(tmp_path / f"{n}.pid") for n in ("slow", "deaf", "left")]
    try:
        assert r.rc == 1 and r.by_label["//:slow"]["test"] == r.by_label["//:deaf"]["test"] == "timeout", r.output
        assert "console-out" in r.stdout  # (its output still goes to buildtool's own stdout)
        assert all(_ends(p) for p in pids)
    finally:
        for p in pids:
            _kill_if_alive(p)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_ends_everything_a_console_command_started(
    workspace: Workspace, tmp_path: Path, sig: int
) -> None:
    from conftest import BUILDTOOL, _clean_env

    pid_file = tmp_path / "child.pid"
    workspace.build_file("", f"""
        test(name="t", pool="console", cmd="sleep 30 >/dev/null 2>&1 & echo $! > {pid_file}; wait")
        """)
    p = subprocess.Popen([BUILDTOOL, "test", "//:t"], cwd=workspace.root, env=_clean_env(workspace.cache,
                         workspace.home), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        child = _pid_in(pid_file)
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
        assert p.returncode == 128 + sig, (out, err)
        assert _ends(child)
    finally:
        p.kill()
        p.wait()
        if pid_file.exists():
            _kill_if_alive(int(pid_file.read_text()))


def test_ctrl_c_on_the_terminal_cancels_a_console_command_that_printed_there(
    workspace: Workspace, tmp_path: Path
) -> None:
    """In a process group of its own the command is no longer in the terminal's foreground
    group: Ctrl-C reaches buildtool alone, which ends the command's group."""
    import pty
    import select
    import time

    from conftest import BUILDTOOL, _clean_env

    pid_file = tmp_path / "child.pid"
    workspace.build_file("", f"""
        test(name="t", pool="console", cmd="echo on-the-terminal; sleep 30 & echo $! > {pid_file}; wait")
        """)
    env = {**_clean_env(workspace.cache, workspace.home), "CI": "", "TERM": "xterm"}
    pid, master = pty.fork()  # (the pty is buildtool's controlling terminal: \x03 is SIGINT)
    if pid == 0:
        try:
            os.chdir(workspace.root)
            os.execve(BUILDTOOL, [BUILDTOOL, "test", "//:t"], env)
        finally:
            os._exit(127)
    out = b""
    child = None
    try:
        child = _pid_in(pid_file)
        os.write(master, b"\x03")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # (EIO: every writer of the terminal is gone)
                    break
                if not data:
                    break
                out += data
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 130, out
        assert b"on-the-terminal" in out and b"interrupted" in out, out
        assert _ends(child)
    finally:
        os.close(master)
        _kill_if_alive(pid)
        if child is not None:
            _kill_if_alive(child)


def test_a_daemon_writes_nothing_into_the_next_commands_output_on_its_lane(
    workspace: Workspace, tmp_path: Path
) -> None:
    """The lane's capture files were reused: a daemon (a session of its own, left running)
    kept writing into the next command's log, JUnit entry and cached output."""
    junit = tmp_path / "junit.xml"
    pid = tmp_path / "d.pid"  # (a waits for it: written once the daemon leads its own session)
    workspace.build_file("", f"""
        test(name="a", priority=-1, cmd="setsid sh -c 'echo $$$$ > {pid}; sleep 0.3; echo DAEMON-OUT; "
                                        + "echo DAEMON-ERR >&2' & while ! [ -s {pid} ]; do sleep 0.01; done")
        test(name="b", cmd="sleep 1.2; echo b-done")
        """)
    r = workspace.build("//...", "-j", "1", "--test-output=all", "--junit", str(junit), command="test")
    daemon = _pid_in(pid)
    try:
        assert r.rc == 0, r.output
        assert r.by_label["//:a"]["end"] <= r.by_label["//:b"]["start"]  # (one lane, a first)
        assert workspace.read(".buildtool/testlogs/b.log") == "b-done\n"
        assert "DAEMON" not in r.output and "DAEMON" not in junit.read_text()
        assert _ends(daemon)
        workspace.path(".buildtool").rename(tmp_path / "state")  # b from the cache, with what it printed
        r = workspace.build("//:b", "--test-output=all", command="test")
        assert r.by_label["//:b"]["test"] == "cached" and "b-done" in r.stdout and "DAEMON" not in r.output
    finally:
        _kill_if_alive(daemon)


@pytest.mark.parametrize(("cmd", "pipe"), [
    ("a | b", True), ("a||b|c", True), ('sed "s|a|b|" x', True),  # (double quotes: it may be in a $(...))
    ("echo 'x | y", True), ("x='|'; a | b", True),
    # An apostrophe that opens no quote (reviewer: each made a real pipe pass for none, so a
    # failing stage went unnoticed under dash):
    ('echo "it\'s" > o; grep p missing | sort >> o; echo "that\'s all"', True),
    ("# don't stop\nfalse | cat > o\n# won't", True),
    ('x="\'"; false | cat; y="\'"', True),
    ("cat <<EOF | sort\nit's\nEOF", True),
    ('a "||" b', True), ("a || b || c", False),
    # A '"' in single quotes inside a "$(...)" is no closing quote (reviewer, again):
    ('v="$(tr -d \'"\' < in)"; false "$v" | sed "s/\'//g" > out', True),
    ('echo "$(printf \'%s"\' x)" | grep "it\'s"', True),
    ('echo "${x%\'"\'}" | cat; echo "\'"', True),
    ("sed 's|a|b|' x | sort", True), ('echo "a" > o; sed \'s|x|y|\' o > p', False),
    ("false `echo \\\\'` | echo ok `echo \\\\'`", True),  # (in backquotes \\' is a plain ')
    ("a || b", False), ("sed 's|a|b|' x > y", False), ("echo \\| x", False), ("cat a > b", False),
])
def test_a_pipe_is_told_from_a_bar_in_single_quotes(cmd: str, pipe: bool) -> None:
    """`sed 's|a|b|'` ran under bash (for pipefail it did not need: ~1 ms more a command
    where /bin/sh is dash); anything less plain still counts as a pipe."""
    from buildtool.executor import has_pipe

    assert has_pipe(cmd) is pipe


@pytest.mark.parametrize("kind", ["memory", "files"])
def test_every_command_captures_into_new_descriptors_that_leave_nothing_behind(
    kind: str, tmp_path: Path, monkeypatch
) -> None:
    """stdout and stderr go to memory files where the kernel has memfd_create (nothing is
    created on disk per command), else to files at the lane's prefix, unlinked when the
    command ends.  Either way never what the lane's previous command had: a daemon it left
    running (a session of its own) writes into nothing the next command's result holds."""
    if kind == "memory":
        _need_memfd()
    monkeypatch.setattr(executor, "_NO_MEMFD", [True] if kind == "files" else [])
    ex = executor.SubprocessExecutor()
    prefix = str(tmp_path / "lane.capture")
    env = {"PATH": "/usr/bin:/bin"}
    first = ex.start(["/bin/sh", "-c", "setsid sh -c 'sleep 0.4; echo DAEMON; echo DAEMON >&2' & echo first"],
                     str(tmp_path), env, capture=prefix)
    r = first.wait()
    assert (r.exit_code, r.stdout, r.stderr) == (0, b"first\n", b"")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    second = ex.start(["/bin/sh", "-c", "sleep 1; echo second; echo err >&2"], str(tmp_path), env, capture=prefix)
    on_disk = sorted(p.name for p in tmp_path.iterdir())
    r = second.wait()
    assert on_disk == ([] if kind == "memory" else ["lane.capture.err", "lane.capture.out"])
    assert (r.exit_code, r.stdout, r.stderr) == (0, b"second\n", b"err\n")  # (the daemon wrote meanwhile)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _need_memfd() -> None:
    """Skip where memfd_create is missing or refused (a sandbox's seccomp): there commands
    capture into files, which the tests with ``_NO_MEMFD`` set cover."""
    try:
        os.close(os.memfd_create("probe", os.MFD_CLOEXEC))
    except (AttributeError, OSError) as e:
        pytest.skip(f"no memfd_create here ({e})")


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_the_lanes_marker_names_a_running_commands_memory_files_until_it_ends(tmp_path: Path, monkeypatch) -> None:
    """What lets the next build find this command if this one is killed before its pid is
    recorded (orphans.py): the marker is written before the child exists.  A command that
    cannot be started leaves the marker naming nothing and no descriptor open."""
    _need_memfd()
    monkeypatch.setattr(executor, "_NO_MEMFD", [])
    from buildtool import orphans

    state = tmp_path / "state"
    (state / "tmp").mkdir(parents=True)
    tracker = orphans.Tracker(str(state))
    ex = executor.SubprocessExecutor()
    ex.tracker = tracker
    try:
        lane = orphans.lane_dir(str(state), os.getpid(), 0)
        running = ex.start(["sleep", "0.5"], str(tmp_path), {"PATH": "/usr/bin:/bin"}, capture=orphans.capture_of(lane))
        held = {(st.st_dev, st.st_ino) for st in (os.stat(f"/proc/{running.proc.pid}/fd/{fd}") for fd in (1, 2))}
        assert orphans._capture_files(str(state), os.getpid()) == held
        assert running.wait().exit_code == 0
        assert orphans._capture_files(str(state), os.getpid()) == set()
        before = _open_fds()
        with pytest.raises(OSError):  # (through Popen: no shell to report it)
            ex.start([str(tmp_path / "missing")], str(tmp_path), {"PATH": "/usr/bin:/bin"},
                     capture=orphans.capture_of(lane))
        assert orphans._capture_files(str(state), os.getpid()) == set()
        assert _open_fds() == before
    finally:
        tracker.close()


def test_which_passes_over_a_file_that_is_not_executable(tmp_path: Path) -> None:
    # As the shell does: a plain file `tool` early on PATH is not the program (nor, for
    # tools=, the binary whose digest the key holds).
    for d, mode in (("a", 0o644), ("b", 0o755)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "tool").write_text("#!/bin/sh\n")
        (tmp_path / d / "tool").chmod(mode)
    assert executor.which("tool", f"{tmp_path}/a:{tmp_path}/b") == f"{tmp_path}/b/tool"


def test_a_relative_path_entry_finds_each_package_s_own_program(tmp_path: Path) -> None:
    # PATH=bin:...: a directly started `tool` in a/ is a/bin/tool, in b/ b/bin/tool.
    ex = executor.SubprocessExecutor()
    env = {"PATH": "bin:/usr/bin:/bin"}
    for d in ("a", "b"):
        (tmp_path / d / "bin").mkdir(parents=True)
        (tmp_path / d / "bin" / "tool").write_text(f'#!/bin/sh\necho {d} > "$1"\n')
        (tmp_path / d / "bin" / "tool").chmod(0o755)
    for d in ("a", "b"):
        line = "tool out.txt"
        r = ex.start(executor.shell_argv("sh", line, False), str(tmp_path / d), env,
                     capture=str(tmp_path / f"cap-{d}"), direct=simplecmd.parse(line)).wait()
        assert r.exit_code == 0
        assert (tmp_path / d / "out.txt").read_text() == f"{d}\n"


def test_after_cancel_all_a_command_is_not_started(tmp_path: Path) -> None:
    ex = executor.SubprocessExecutor()
    ex.cancel_all()
    running = ex.start(["/bin/sh", "-c", "echo ran > marker"], str(tmp_path), {"PATH": "/usr/bin:/bin"},
                       capture=str(tmp_path / "cap"))
    assert running.proc is None
    r = running.wait()
    assert r.interrupted and r.exit_code != 0
    assert not (tmp_path / "marker").exists()


def test_a_command_started_as_cancel_all_ran_is_cut_short(tmp_path: Path, monkeypatch) -> None:
    # cancel_all came between the spawn and the executor's note of the process: cancel_all
    # did not see it, so start must stop it itself, or it ran to its end after Ctrl-C.
    ex = executor.SubprocessExecutor()
    real = subprocess.Popen

    def popen_then_cancel(*a, **kw):  # type: ignore[no-untyped-def]
        p = real(*a, **kw)
        ex.cancel_all()
        return p

    monkeypatch.setattr(subprocess, "Popen", popen_then_cancel)
    r = ex.start(["sleep", "5"], str(tmp_path), {"PATH": "/usr/bin:/bin"}, capture=str(tmp_path / "cap")).wait()
    assert r.interrupted and r.exit_code == -signal.SIGTERM


def test_a_command_killed_without_a_thread_for_its_grace_period_is_killed_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a limit on threads the SIGKILL timer of a cancelled or timed-out command could
    not start: an "internal error" for a timed-out test, and Ctrl-C ended in an error line
    rather than 130.  The command is killed at once then."""
    import threading

    env = {"PATH": "/usr/bin:/bin"}
    ex = executor.SubprocessExecutor()
    trap = ex.start(["/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"], str(tmp_path), env,
                    capture=str(tmp_path / "a"))  # (only SIGKILL ends it)
    import time

    time.sleep(0.2)  # (the trap is set)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    ex.cancel_all()
    r = trap.wait()
    assert r.interrupted and r.exit_code == -signal.SIGKILL


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_command_that_truncates_its_own_capture_is_told_what_was_lost(workspace: Workspace, stream: str) -> None:
    # `echo x > /dev/stderr` opens the capture again with O_TRUNC: what the command wrote
    # before is gone, and the failure's output would read as if it had never printed it.
    fd = "1" if stream == "stdout" else "2"
    workspace.build_file(
        "",
        f"""
        genrule(name="x", outs=["x.txt"],
                cmd="echo the-real-error >&{fd}; echo failed > /dev/{stream}; exit 1")
        genrule(name="fine", outs=["fine.txt"], cmd="echo kept >&{fd}; echo more >> /dev/{stream}; touch $@")
        """,
    )
    r = workspace.build("//:x")
    assert r.rc == 1, r.output
    assert "\nfailed\n[buildtool: this output was truncated while the command ran" in r.output, r.output
    assert "`>&2`" in r.output
    r = workspace.build("-v", "//:fine")  # `>>` keeps what was there: no note
    assert r.rc == 0, r.output
    assert "kept" in r.output and "more" in r.output
    assert "truncated" not in r.output
