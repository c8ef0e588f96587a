"""Executor end to end: how the real ``buildtool`` command starts commands.

Simple commands (simplecmd.py) start without ``/bin/sh``; anything else, and any simple
command that cannot be started directly, runs under the shell with the shell's own
errors and exit statuses.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import Workspace

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
        return {k: v for k, _, v in pairs if k not in ("_", "SHLVL", "OLDPWD", "TMPDIR", "HOME")}

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
