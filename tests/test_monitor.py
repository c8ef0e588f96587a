"""The file monitor: a no-op it vouches for skips the stats, and every kind of change it
can see still makes the next build a real one.  Real daemons, real inotify, real files."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import slot_file

from buildtool import monitor, monitord

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the monitor needs inotify")


def bt(ws: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(cache))
    return subprocess.run(["buildtool", "-C", str(ws), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    w = tmp_path / "ws"
    (w / "src").mkdir(parents=True)
    (w / "buildtool.toml").write_text("")
    (w / "src" / "a.txt").write_text("a\n")
    (w / "src" / "b.in").write_text("b\n")
    (w / "BUILD.py").write_text(
        'genrule(name="up", srcs=["src/a.txt"], outs=["up.txt"], cmd="tr a-z A-Z < $< > $@")\n'
        'genrule(name="g", srcs=glob(["src/**/*.in"]), outs=["g.txt"], cmd="cat $(SRCS) /dev/null > $@")\n'
    )
    yield w
    monitor.stop(str(w / ".buildtool"))


def vouched(ws: Path) -> int:
    info = monitor.status(str(ws / ".buildtool"))
    assert info is not None, "the monitor is not running"
    return int(info["vouched"])  # type: ignore[call-overload]


def armed(ws: Path, cache: Path) -> None:
    """Build, start the monitor, and build until a no-op is vouched for by it."""
    assert bt(ws, cache, "build").returncode == 0
    time.sleep(0.1)  # past the racy window of the outputs: the next build leaves a snapshot
    assert bt(ws, cache, "build").returncode == 0
    r = bt(ws, cache, "monitor", "start", "--idle-exit", "120")
    assert r.returncode == 0 and "monitor started" in r.stdout, r.stdout + r.stderr
    before = vouched(ws)
    for _ in range(3):
        r = bt(ws, cache, "build")
        assert "(nothing changed)" in r.stdout, r.stdout + r.stderr
    assert vouched(ws) > before, "the no-op never went through the monitor"


def rebuilt(ws: Path, cache: Path) -> str:
    r = bt(ws, cache, "build")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(nothing changed)" not in r.stdout, "a change under the monitor went unnoticed"
    return r.stdout


def test_start_status_stop(ws: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    r = bt(ws, cache, "monitor", "status")
    assert r.returncode == 3 and "no monitor runs" in r.stdout
    r = bt(ws, cache, "monitor", "start", "--idle-exit", "120")
    assert r.returncode == 0 and "monitor started" in r.stdout, r.stderr
    assert "already running" in bt(ws, cache, "monitor", "start").stdout
    r = bt(ws, cache, "monitor", "status")
    assert r.returncode == 0 and str(ws) in r.stdout
    assert bt(ws, cache, "monitor", "stop").stdout.strip() == "monitor stopped"
    assert bt(ws, cache, "monitor", "status").returncode == 3
    assert bt(ws, cache, "monitor", "stop").stdout.strip() == "no monitor was running"
    assert not (ws / ".buildtool" / monitor.SOCKET).exists()


def test_a_link_planted_at_the_pid_file_is_not_written_through(ws: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    bt(ws, cache, "build")
    (ws / ".buildtool" / monitor.PIDFILE).symlink_to(victim)
    r = bt(ws, cache, "monitor", "start", "--idle-exit", "120")
    try:
        assert r.returncode == 0 and "monitor started" in r.stdout, r.stdout + r.stderr
        assert victim.read_text() == "precious\n"
        assert not (ws / ".buildtool" / monitor.PIDFILE).is_symlink()
    finally:
        bt(ws, cache, "monitor", "stop")


def test_a_workspace_whose_path_is_not_utf8_gets_a_monitor(ws: Path, tmp_path: Path) -> None:
    """`monitor start` there crashed (UnicodeEncodeError measuring the socket path), and a
    request naming the root could not be sent."""
    odd = tmp_path / "caf\udce9"
    shutil.copytree(ws, odd)
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(tmp_path / "cache"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["buildtool", "-C", str(odd), *args], capture_output=True, text=True, env=env,
                              timeout=60, errors="surrogateescape")
    try:
        assert run("build").returncode == 0
        time.sleep(0.1)
        assert run("build").returncode == 0
        r = run("monitor", "start", "--idle-exit", "120")
        assert r.returncode == 0 and "monitor started" in r.stdout, r.stdout + r.stderr
        before = vouched(odd)
        for _ in range(3):
            assert "(nothing changed)" in run("build").stdout
        assert vouched(odd) > before, "the no-op never went through the monitor"
        (odd / "src" / "a.txt").write_text("changed\n")
        r = run("build")
        assert "(nothing changed)" not in r.stdout and (odd / "up.txt").read_text() == "CHANGED\n", r.stdout
    finally:
        monitor.stop(str(odd / ".buildtool"))


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_bad_idle_exit_is_a_usage_error(ws: Path, tmp_path: Path, value: str) -> None:
    r = bt(ws, tmp_path / "cache", "monitor", "start", "--idle-exit", value)
    assert r.returncode == 2 and "--idle-exit must be a positive number" in r.stderr


def test_a_directory_where_the_socket_goes_is_named(ws: Path, tmp_path: Path) -> None:
    (ws / ".buildtool" / "monitor.sock").mkdir(parents=True)
    r = bt(ws, tmp_path / "cache", "monitor", "start")
    assert r.returncode == 2 and "a directory is in the way" in r.stderr, r.stderr


def test_a_copy_made_with_hard_links_gets_its_own_monitor(ws: Path, tmp_path: Path) -> None:
    """cp -al links the socket and the lock: the copy's monitor commands acted on the
    original's monitor (stop stopped it; and, with the original paused, stop and clean)."""
    cache = tmp_path / "cache"
    assert bt(ws, cache, "monitor", "start", "--idle-exit", "120").returncode == 0
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-al", str(ws), str(copy)], check=True)
    try:
        assert bt(copy, cache, "monitor", "status").returncode == 3
        assert "no monitor was running" in bt(copy, cache, "monitor", "stop").stdout
        assert monitor.status(str(ws / ".buildtool")) is not None, "the copy stopped the original's monitor"
        # The original's monitor paused (it cannot say whose it is): the copy's `stop` left a
        # "stop" in the shared socket that ended it once continued, and `status` named it.
        import signal

        pid = int((ws / ".buildtool" / "monitor.pid").read_text().split()[0])
        os.kill(pid, signal.SIGSTOP)
        try:
            assert bt(copy, cache, "monitor", "status").returncode == 3
            assert "no monitor was running" in bt(copy, cache, "monitor", "stop").stdout
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)
        assert monitor.status(str(ws / ".buildtool")) is not None, "the copy stopped the original's paused monitor"
        assert bt(copy, cache, "clean").returncode == 0  # (it ended the original's monitor)
        assert monitor.status(str(ws / ".buildtool")) is not None, "the copy's clean ended the original's monitor"
        r = bt(copy, cache, "monitor", "start", "--idle-exit", "120")
        assert r.returncode == 0 and "monitor started" in r.stdout and str(copy) in r.stdout, r.stdout + r.stderr
        assert monitor.status(str(ws / ".buildtool"))["root"] == str(ws)  # type: ignore[index]
    finally:
        monitor.stop(str(copy / ".buildtool"))


@pytest.mark.parametrize(
    "change",
    ["edit", "touch", "chmod", "delete_output", "edit_output", "rename_over", "new_glob_match", "new_dir_then_file"],
)
def test_changes_under_the_monitor_rebuild(ws: Path, tmp_path: Path, change: str) -> None:
    cache = tmp_path / "cache"
    armed(ws, cache)
    a = ws / "src" / "a.txt"
    if change == "edit":
        a.write_text("edited\n")
    elif change == "touch":
        os.utime(a, ns=(time.time_ns(), time.time_ns() + 5_000_000_000))
    elif change == "chmod":
        a.chmod(0o600)
    elif change == "delete_output":
        (ws / "up.txt").unlink()
    elif change == "edit_output":
        (ws / "up.txt").write_text("hand-edited\n")
    elif change == "rename_over":
        (ws / "new.tmp").write_text("renamed\n")
        os.replace(ws / "new.tmp", a)
    elif change == "new_glob_match":
        (ws / "src" / "c.in").write_text("c\n")
    elif change == "new_dir_then_file":
        (ws / "src" / "deep").mkdir()
        (ws / "src" / "deep" / "d.in").write_text("d\n")  # a file in a directory created just now
    rebuilt(ws, cache)
    assert (ws / "up.txt").read_text() == a.read_text().upper()
    # //:g's glob (src/**/*.in) took the new file, in a new directory too, and nothing else
    want = {"new_glob_match": "b\nc\n", "new_dir_then_file": "b\nd\n"}.get(change, "b\n")
    assert (ws / "g.txt").read_text() == want, change


def test_nested_directory_made_before_its_watch(ws: Path, tmp_path: Path) -> None:
    """mkdir -p makes a/b/c faster than the monitor adds watches: files in the deepest
    one, written afterwards, must still be seen."""
    cache = tmp_path / "cache"
    armed(ws, cache)
    (ws / "src" / "x" / "y" / "z").mkdir(parents=True)
    rebuilt(ws, cache)  # new directories: a real build (re-arms the clock)
    for _ in range(2):
        bt(ws, cache, "build")
    n = vouched(ws)
    (ws / "src" / "x" / "y" / "z" / "late.in").write_text("late\n")
    rebuilt(ws, cache)
    assert "late" in (ws / "g.txt").read_text()
    assert vouched(ws) == n


def test_symlink_out_of_the_workspace_turns_it_to_stat(ws: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    outside = tmp_path / "outside.txt"
    outside.write_text("o\n")
    armed(ws, cache)
    (ws / "link.txt").symlink_to(outside)
    r = bt(ws, cache, "monitor", "status")
    assert "symbolic link to where the monitor does not watch" in r.stdout and "link.txt" in r.stdout
    n = vouched(ws)
    for _ in range(2):
        bt(ws, cache, "build")
    assert vouched(ws) == n  # never vouches again: changes behind the link would be invisible


def test_restarted_monitor_or_none_falls_back_to_stat(ws: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    armed(ws, cache)
    pid = int(monitor.status(str(ws / ".buildtool"))["pid"])  # type: ignore[arg-type,index]
    os.kill(pid, signal.SIGKILL)  # dies without removing its socket
    time.sleep(0.1)
    (ws / "src" / "a.txt").write_text("while no monitor ran\n")
    rebuilt(ws, cache)
    assert (ws / "up.txt").read_text() == "WHILE NO MONITOR RAN\n"
    # A new monitor has a new token: the old clock counts as "changed" once.
    assert bt(ws, cache, "monitor", "start", "--idle-exit", "120").returncode == 0
    (ws / "src" / "a.txt").write_text("before the clock\n")
    rebuilt(ws, cache)
    assert (ws / "up.txt").read_text() == "BEFORE THE CLOCK\n"


def test_clean_ends_the_monitor(ws: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    armed(ws, cache)
    pid = int(monitor.status(str(ws / ".buildtool"))["pid"])  # type: ignore[arg-type,index]
    assert bt(ws, cache, "clean").returncode == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the monitor outlived its state directory")
    assert "2 ran" in bt(ws, cache, "build").stdout.replace("2 restored", "2 ran")


def test_many_events_overflow_is_a_change(ws: Path, tmp_path: Path) -> None:
    """More events than the kernel queues (fs.inotify.max_queued_events) while the monitor
    is busy: lost events must still count as a change."""
    cache = tmp_path / "cache"
    spam = ws / "spam"
    spam.mkdir()  # watched from the start: each file made in it below is two events
    armed(ws, cache)
    pid = int(monitor.status(str(ws / ".buildtool"))["pid"])  # type: ignore[arg-type,index]
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    except OSError:
        pytest.skip("no inotify limits to read")
    if limit > 100_000:
        pytest.skip(f"max_queued_events is {limit}: too many files to overflow it here")
    os.kill(pid, signal.SIGSTOP)  # the monitor reads nothing while stopped
    try:
        for i in range(limit // 2 + 10):
            (spam / f"{i}").write_bytes(b"")
        (ws / "src" / "a.txt").write_text("after the overflow\n")
    finally:
        os.kill(pid, signal.SIGCONT)
    rebuilt(ws, cache)
    assert (ws / "up.txt").read_text() == "AFTER THE OVERFLOW\n"
    info = monitor.status(str(ws / ".buildtool"))
    assert info is not None and int(info["overflows"]) >= 1  # type: ignore[call-overload]


@pytest.mark.parametrize("over", ["an output's directory", "a source directory", "a mount point"])
def test_a_filesystem_mounted_inside_the_workspace_is_a_change(ws: Path, tmp_path: Path, over: str) -> None:
    """A mount is no inotify event: a tmpfs over out/ hid the output and a bind mount over
    src/ swapped the sources, and the monitor vouched "nothing changed"; so it did for a
    mount stacked on a directory that was a mount point already (the same point, another
    mount).  (Needs the right to mount: root, as on the CI machine.)"""
    cache = tmp_path / "cache"
    (ws / "BUILD.py").write_text((ws / "BUILD.py").read_text().replace('outs=["up.txt"]', 'outs=["out/up.txt"]'))
    where = ws / ("out" if over == "an output's directory" else "src")
    other = tmp_path / "other-src"
    (other / "sub").mkdir(parents=True)
    (other / "a.txt").write_text("mounted\n")
    (ws / "out").mkdir()

    def mount(*argv: str) -> None:
        if subprocess.run(["mount", *argv], capture_output=True, check=False).returncode != 0:
            pytest.skip("no right to mount here")

    try:
        if over == "a mount point":
            shutil.copytree(ws / "src", tmp_path / "first-src")
            mount("--bind", str(tmp_path / "first-src"), str(where))
        armed(ws, cache)
        if over == "an output's directory":
            mount("-t", "tmpfs", "tmpfs", str(where))
        else:
            mount("--bind", str(other), str(where))
        rebuilt(ws, cache)
        want = "A\n" if over == "an output's directory" else "MOUNTED\n"
        assert (ws / "out" / "up.txt").read_text() == want
        if over != "an output's directory":
            (other / "sub" / "new.in").write_text("new\n")  # (a directory of the mounted filesystem: watched now)
            rebuilt(ws, cache)
            assert "new" in (ws / "g.txt").read_text()
    finally:
        monitor.stop(str(ws / ".buildtool"))
        while subprocess.run(["umount", str(where)], capture_output=True).returncode == 0:
            pass


def test_git_state_is_not_watched_but_what_a_build_file_reads_there_is_checked(ws: Path, tmp_path: Path) -> None:
    """`git status` rewrites .git/index all the time: that must not cost the monitor's
    vouching; but a .git file that a BUILD.py read is still stat-ed by the no-op."""
    cache = tmp_path / "cache"
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "BUILD.py").write_text(
        (ws / "BUILD.py").read_text()
        + f'head = open({str(ws / ".git" / "HEAD")!r}).read().strip()\n'
        + 'genrule(name="rev", outs=["rev.txt"], cmd="echo ' + "'%s'" + ' > $@" % head)\n'
    )
    armed(ws, cache)
    n = vouched(ws)
    (ws / ".git" / "index").write_bytes(b"rewritten by git status\n")
    assert "(nothing changed)" in bt(ws, cache, "build").stdout
    assert vouched(ws) == n + 1
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/other\n")
    rebuilt(ws, cache)
    assert (ws / "rev.txt").read_text() == "ref: refs/heads/other\n"


def test_symlink_into_git_state_turns_it_to_stat(ws: Path, tmp_path: Path) -> None:
    """.git is not watched, so a link into it is as blind as a link out of the workspace."""
    cache = tmp_path / "cache"
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref1\n")
    armed(ws, cache)
    (ws / "src" / "head").symlink_to("../.git/HEAD")
    r = bt(ws, cache, "monitor", "status")
    assert "symbolic link to where the monitor does not watch" in r.stdout and "src/head" in r.stdout


def test_hard_link_written_from_outside(ws: Path, tmp_path: Path) -> None:
    """A file with a second name outside the workspace can be written through that name:
    no event in any watched directory, so the monitor watches such files themselves."""
    cache = tmp_path / "cache"
    outside = tmp_path / "outside.txt"
    outside.write_text("before\n")
    os.link(outside, ws / "src" / "h.txt")
    (ws / "BUILD.py").write_text(
        (ws / "BUILD.py").read_text() + 'genrule(name="hh", srcs=["src/h.txt"], outs=["hh.txt"], cmd="cp $< $@")\n'
    )
    armed(ws, cache)
    assert "1 hard-linked files" in bt(ws, cache, "monitor", "status").stdout
    with open(outside, "r+") as f:  # in place, through the other name
        f.write("AFTER!!")
    rebuilt(ws, cache)
    assert (ws / "hh.txt").read_text() == outside.read_text()


def test_an_output_written_later_by_what_its_command_left_running_is_seen(ws: Path, tmp_path: Path) -> None:
    """A `>` output is made in the staging dir and linked into place; the command's stdout
    was the descriptor opened by the staging name, so a daemon the command left holding it
    wrote to the output with inotify reporting to the staging dir, which is not watched
    (the monitor paused during the build: the race to watch the file while it had two
    names was lost).  The monitor then vouched for a no-op over a changed output."""
    import signal

    cache = tmp_path / "cache"
    # (the sleep: the daemon is in a session of its own before the command's group ends)
    (ws / "d.sh").write_text("echo start\nsetsid sh -c 'sleep 2.5; echo late' </dev/null 2>/dev/null &\nsleep 0.3\n")
    (ws / "BUILD.py").write_text('genrule(name="dm", srcs=["d.sh"], outs=["o.txt"], cmd="sh d.sh > o.txt")\n')
    r = bt(ws, cache, "monitor", "start", "--idle-exit", "120")
    assert r.returncode == 0, r.stdout + r.stderr
    pid = int((ws / ".buildtool" / "monitor.pid").read_text().split()[0])
    os.kill(pid, signal.SIGSTOP)
    try:
        assert bt(ws, cache, "build").returncode == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    for _ in range(2):  # (the full check, then a no-op the monitor may vouch for)
        assert bt(ws, cache, "build").returncode == 0
    deadline = time.monotonic() + 20
    while (ws / "o.txt").read_text() != "start\nlate\n":
        assert time.monotonic() < deadline, (ws / "o.txt").read_text()
        time.sleep(0.1)
    rebuilt(ws, cache)
    assert (ws / "o.txt").read_text() == "start\n"


def test_hard_link_made_while_watching(ws: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    armed(ws, cache)
    outside = tmp_path / "outside.txt"
    os.link(ws / "src" / "a.txt", outside)  # a second name for a source, made from outside
    os.utime(ws / "src" / "a.txt")  # (what makes the workspace see it: an event in src/)
    rebuilt(ws, cache)
    for _ in range(2):
        bt(ws, cache, "build")
    n = vouched(ws)
    outside.write_text("written through the other name\n")
    rebuilt(ws, cache)
    assert (ws / "up.txt").read_text() == "WRITTEN THROUGH THE OTHER NAME\n"
    assert vouched(ws) == n


def test_renamed_parent_directory_ends_the_monitor(tmp_path: Path) -> None:
    """Paths in the monitor are absolute: a parent renamed (and maybe renamed back) would
    make a new directory's path wrong without any event in the tree."""
    cache = tmp_path / "cache"
    w = tmp_path / "p1" / "ws"
    (w / "src").mkdir(parents=True)
    (w / "buildtool.toml").write_text("")
    (w / "src" / "a.txt").write_text("a\n")
    (w / "BUILD.py").write_text('genrule(name="up", srcs=["src/a.txt"], outs=["up.txt"], cmd="tr a-z A-Z < $< > $@")\n')
    try:
        armed(w, cache)
        pid = int(monitor.status(str(w / ".buildtool"))["pid"])  # type: ignore[arg-type,index]
        os.rename(tmp_path / "p1", tmp_path / "p2")
        os.rename(tmp_path / "p2", tmp_path / "p1")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), "the monitor survived its parent's rename"
        assert "a parent directory of the workspace moved" in (w / ".buildtool" / monitor.LOG).read_text()
    finally:
        monitor.stop(str(w / ".buildtool"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (its parent, `monitor start`, is gone; init reaps it) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_second_monitor_refused_and_stop_survives_a_stopped_monitor(ws: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert bt(ws, cache, "monitor", "start", "--idle-exit", "120").returncode == 0
    pid = int(monitor.status(str(ws / ".buildtool"))["pid"])  # type: ignore[arg-type,index]
    os.kill(pid, signal.SIGSTOP)
    try:
        r = bt(ws, cache, "monitor", "start", "--idle-exit", "120")  # status times out: it tries a second one
        assert r.returncode == 2 and f"another monitor (pid {pid})" in r.stderr, r.stdout + r.stderr
        t0 = time.monotonic()
        r = bt(ws, cache, "build")
        assert r.returncode == 0 and time.monotonic() - t0 < 10
        r = bt(ws, cache, "monitor", "status")  # as start and stop see it: there, not answering
        assert r.returncode == 1 and f"pid {pid} holds" in r.stdout and "did not answer" in r.stdout, r.stdout
        t0 = time.monotonic()
        r = bt(ws, cache, "monitor", "stop")  # no answer in time: the request is queued
        assert r.returncode == 0 and f"the monitor (pid {pid}) did not answer" in r.stdout, r.stdout
        assert time.monotonic() - t0 < 3.5  # (monitor.md: said within 2 s; it waited 2 s twice)
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid), "a stop whose client had gone away was lost"


def test_start_refuses_a_state_directory_that_is_a_link(ws: Path, tmp_path: Path) -> None:
    """reliability.md: every command that would write or delete in a .buildtool that is a
    link is exit 2 naming it.  `monitor start` took the other workspace's monitor for a
    copy's, deleted its socket and wrote its pid file there: that monitor ran on, out of
    reach of status and stop."""
    other = tmp_path / "other"
    (other / ".buildtool").mkdir(parents=True)
    (other / ".buildtool" / "keep").write_text("mine\n")
    os.symlink(other / ".buildtool", ws / ".buildtool")
    r = bt(ws, tmp_path / "cache", "monitor", "start", "--idle-exit", "60")
    assert r.returncode == 2 and ".buildtool is a symbolic link" in r.stderr, r.stdout + r.stderr
    assert sorted(p.name for p in (other / ".buildtool").iterdir()) == ["keep"]


def test_symlink_resolution_must_stay_in_the_watched_tree(tmp_path: Path) -> None:
    """Unit test of the link check, on real links: every step of the resolution (not only
    where it ends) must be watched, or be one of the root's ancestors on the way down."""
    t = Path(os.path.realpath(tmp_path))
    ws = t / "ws"
    for d in (".buildtool", "data", ".git"):
        (ws / d).mkdir(parents=True)
    (ws / "data" / "a.txt").write_text("a\n")
    (t / "x").mkdir()
    (t / "x" / "lnk").symlink_to(ws / "data" / "a.txt")  # a link outside that leads back in
    mon = monitord.Monitor(str(ws), str(ws / ".buildtool"))
    try:
        cases = [
            ("data/a.txt", True), (str(ws / "data" / "a.txt"), True), ("../ws/data/a.txt", True),
            (".#lock-user@host.123", True),  # dangling, inside (an editor's lock file)
            ("l1", True), (".", True), ("missing/../data/a.txt", True),
            (str(t / "x" / "lnk"), False), (".git/HEAD", False), ("/", False), ("..", False),
            ("data/../..", False), ("missing/../../x/lnk", False), (".buildtool/noop", False),
        ]
        for i, (target, inside) in enumerate(cases):
            name = "l1" if i == 0 else f"link{i}"
            (ws / name).symlink_to(target)
            assert mon._resolves_inside(str(ws / name)) is inside, (target, inside)
    finally:
        os.close(mon.fd)


@pytest.mark.parametrize("damage", [
    {"targets": float("inf")}, {"targets": "many"}, {"token": ["x"]}, {"gen": True}, {"env": {b"PATH": 1}},
    {"files": {b"/x": 1}}, {"files": {"/x": [1, 2]}}, {"dirs": {"/x": 5}}, {"snapshot": None}, "not a dict",
])
def test_damaged_clock_falls_back_to_the_full_check(ws: Path, tmp_path: Path, damage: object) -> None:
    import marshal

    cache = tmp_path / "cache"
    armed(ws, cache)
    from buildtool import noop

    path = slot_file(ws / ".buildtool", "noop-clock")
    header = noop.CLOCK_HEADER
    clock = marshal.loads(path.read_bytes()[len(header) + 9:])
    assert isinstance(clock, dict) and clock["token"]
    damaged = {**clock, **damage} if isinstance(damage, dict) else damage  # the rest as the monitor left it
    raw = marshal.dumps(damaged)  # with its right checksum: the reader must judge the content
    path.write_bytes(header + b"%08x\n" % noop._clock_sum(raw) + raw)
    r = bt(ws, cache, "build")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    path.write_bytes(header + b"%08x\n" % noop._clock_sum(raw) + raw)
    (ws / "src" / "a.txt").write_text("changed under a damaged clock\n")
    r = bt(ws, cache, "build")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert (ws / "up.txt").read_text() == "CHANGED UNDER A DAMAGED CLOCK\n"


def test_a_clock_that_does_not_match_its_checksum_is_not_used(ws: Path, tmp_path: Path) -> None:
    """A bit flipped in the clock's body on disk (here: its target count, which the no-op
    would print) must not be believed: the checksum line says so, and the full check runs."""
    import marshal

    from buildtool import noop

    cache = tmp_path / "cache"
    armed(ws, cache)
    path = slot_file(ws / ".buildtool", "noop-clock")
    start = len(noop.CLOCK_HEADER) + 9
    data = path.read_bytes()
    clock = marshal.loads(data[start:])
    n = clock["targets"]
    path.write_bytes(data[:start] + marshal.dumps({**clock, "targets": n ^ 64}))  # (the old checksum line)
    r = bt(ws, cache, "build")
    assert f"OK: {n} targets" in r.stdout and "(nothing changed)" in r.stdout, r.stdout + r.stderr
    assert path.read_bytes() == data or marshal.loads(path.read_bytes()[start:])["targets"] == n  # rewritten


def test_the_clock_checksum_sees_flipped_bits_and_length() -> None:
    from buildtool.noop import _clock_sum

    raw = bytes(range(256)) * 3
    base = _clock_sum(raw)
    for i in range(0, len(raw) * 8, 7):
        flipped = bytearray(raw)
        flipped[i // 8] ^= 1 << (i % 8)
        assert _clock_sum(bytes(flipped)) != base, i
    assert _clock_sum(raw + b"\0") != base and _clock_sum(raw[:-1]) != base
    assert 0 <= base < 1 << 32  # (it is written as 8 hex digits)


@pytest.mark.parametrize(("paused", "into"), [(False, "outside"), (True, "outside"), (True, ".buildtool")],
                         ids=["seen", "gone-before-looked-at", "into-the-state-dir"])
def test_a_hard_link_moved_out_keeps_the_file_watched(ws: Path, tmp_path: Path, paused: bool, into: str) -> None:
    """src/a.txt gets a second name in the workspace, which is then moved out (of the
    workspace, or into .buildtool/, which is not watched either): a.txt still shares its
    file with the name out there.  Paused, the monitor reads the link's creation only
    after the name left (as on a busy machine): it cannot look at that name, so the move
    out makes it look for hard-linked files again."""
    cache = tmp_path / "cache"
    outside = tmp_path / "h.txt" if into == "outside" else ws / ".buildtool" / "h.txt"
    armed(ws, cache)
    pid = int(monitor.status(str(ws / ".buildtool"))["pid"])  # type: ignore[arg-type,index]
    if paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        os.link(ws / "src" / "a.txt", ws / "k.txt")
        if not paused:  # the monitor has watched the file through its second name
            deadline = time.monotonic() + 10
            while int(monitor.status(str(ws / ".buildtool"))["files"]) < 1:  # type: ignore[arg-type,index]
                assert time.monotonic() < deadline, "the monitor never watched the hard-linked file"
                time.sleep(0.02)
        os.rename(ws / "k.txt", outside)
    finally:
        os.kill(pid, signal.SIGCONT)
    rebuilt(ws, cache)  # (the root's listing changed twice)
    for _ in range(2):
        bt(ws, cache, "build")
    outside.write_text("through the name outside\n")
    rebuilt(ws, cache)
    assert (ws / "up.txt").read_text() == "THROUGH THE NAME OUTSIDE\n"


def test_a_hard_linked_file_renamed_over_another_is_watched(ws: Path, tmp_path: Path) -> None:
    """Both files have a name outside; new.dat is renamed over src/a.txt (no deletion
    event for the file it replaces): the file now at src/a.txt must be watched."""
    cache = tmp_path / "cache"
    os.link(ws / "src" / "a.txt", tmp_path / "h1")
    (ws / "new.dat").write_text("new\n")
    os.link(ws / "new.dat", tmp_path / "h2")
    armed(ws, cache)
    os.rename(ws / "new.dat", ws / "src" / "a.txt")
    _written_outside_is_seen(ws, cache, tmp_path / "h2", "appended outside\n")
    assert (ws / "up.txt").read_text() == "NEW\nAPPENDED OUTSIDE\n"


def _written_outside_is_seen(ws: Path, cache: Path, outside: Path, text: str) -> None:
    """After a change in the workspace (rebuilt, then vouched for again), ``text`` appended
    through ``outside``, a hard link to a source, must make the next build a real one."""
    rebuilt(ws, cache)
    for _ in range(2):
        bt(ws, cache, "build")
    with open(outside, "a") as f:
        f.write(text)
    rebuilt(ws, cache)


def test_a_write_makes_a_file_linked_from_outside_watched(ws: Path, tmp_path: Path) -> None:
    """The link from outside is no event; the next write through the workspace's name is,
    and from then on the file is watched itself (docs/monitor.md)."""
    cache = tmp_path / "cache"
    armed(ws, cache)
    os.link(ws / "src" / "a.txt", tmp_path / "h.txt")
    with open(ws / "src" / "a.txt", "a") as f:
        f.write("b\n")
    _written_outside_is_seen(ws, cache, tmp_path / "h.txt", "c\n")
    assert (ws / "up.txt").read_text() == "A\nB\nC\n"


def test_a_link_made_on_another_links_way_is_checked_again(ws: Path, tmp_path: Path) -> None:
    """src/l.txt -> x/../../outside.txt with x missing resolves, by name, inside the
    workspace; then x is made a link to "." and src/l.txt leads out of it."""
    cache = tmp_path / "cache"
    armed(ws, cache)
    (ws / "src" / "l.txt").symlink_to("x/../../outside.txt")
    (ws / "src" / "x").symlink_to(".")
    bt(ws, cache, "build")
    r = bt(ws, cache, "monitor", "status")
    assert "src/l.txt is a symbolic link to where the monitor does not watch" in r.stdout, r.stdout


class _OlderMonitor:
    """A monitor as an older buildtool's answered (protocol 1, no lock on monitor.pid):
    `since` with no protocol, and 'nothing changed' to anything; with ``install``, one of
    this protocol that another install started (an upgrade since): it answers any `since`
    of the protocol, 'nothing changed', naming its install."""

    def __init__(self, ws: Path, install: str | None = None) -> None:
        import socket
        import threading

        self.root = str(ws)
        self.install = install
        self.path = monitor.socket_path(str(ws / ".buildtool"))
        (ws / ".buildtool").mkdir(exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import json

        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                line = monitor.read_line(conn, time.monotonic() + 2) or ""
                protocol = 1 if self.install is None else monitor.PROTOCOL
                if line == "status":
                    answer = json.dumps({"pid": os.getpid(), "root": self.root, "token": "t", "generation": 1,
                                         "directories": 1, "files": 0, "protocol": protocol,
                                         "install": self.install})
                elif line == "stop":
                    answer = "stopping"
                    self.stopped.set()
                elif line.startswith("since ") and len(line.split(" ")) == 3 and self.install is None:
                    answer = f"ok t 1 0 {self.root}"
                elif line.startswith(f"since t 1 {protocol} ") and self.install is not None:
                    answer = f"ok t 1 0 {protocol} {self.install} {self.root}"
                else:
                    answer = "error unknown request"
                conn.sendall(answer.encode() + b"\n")
        self.sock.close()
        os.unlink(self.path)


@pytest.mark.parametrize("other", ["protocol", "install"])
def test_a_monitor_of_an_older_protocol_or_install_is_no_monitor_and_is_replaced(
        ws: Path, tmp_path: Path, other: str) -> None:
    """A monitor an older buildtool started (with the blind spots fixed since) was trusted
    after an upgrade: 'nothing changed' over a changed source; `monitor start` said
    'already running' and `clean` did not end it (it held no lock).  The same for one of
    the same protocol that went on running across `pip install -U` (its mount-table
    check came later, and a bind mount over sources was 'nothing changed')."""
    state = str(ws / ".buildtool")
    old = _OlderMonitor(ws, None if other == "protocol" else "1-1")
    assert monitor.since(state, str(ws), "t", 1) is None  # not trusted
    r = bt(ws, tmp_path / "cache", "monitor", "status")
    said = (f"protocol 1, not this buildtool's {monitor.PROTOCOL}: unused" if other == "protocol"
            else "started by another buildtool's code (upgraded since): unused")
    assert said in r.stdout, r.stdout + r.stderr
    r = bt(ws, tmp_path / "cache", "monitor", "start", "--idle-exit", "120")
    assert r.returncode == 0 and "monitor started" in r.stdout, r.stdout + r.stderr
    assert old.stopped.is_set()
    info = monitor.status(state)
    assert info is not None and info["protocol"] == monitor.PROTOCOL and info["pid"] != os.getpid()
    monitor.stop(state)
    deadline = time.monotonic() + 10
    while monitor.status(state) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    old = _OlderMonitor(ws)  # `clean` ends one too
    assert bt(ws, tmp_path / "cache", "clean").returncode == 0
    assert old.stopped.is_set()


def test_named_pipes_at_its_pid_file_and_log_are_not_waited_on(ws: Path, tmp_path: Path) -> None:
    """`monitor status` waited for a writer on a named pipe at monitor.pid, and `monitor
    start` for a reader on one at monitor.log: damaged state, passed over as such."""
    cache = tmp_path / "cache"
    state = ws / ".buildtool"
    state.mkdir(exist_ok=True)
    os.mkfifo(state / "monitor.pid")
    os.mkfifo(state / "monitor.log")
    try:
        assert bt(ws, cache, "monitor", "status").returncode == 3  # (none running)
        r = bt(ws, cache, "monitor", "start", "--idle-exit", "120")
        assert r.returncode == 0, r.stdout + r.stderr
        assert bt(ws, cache, "monitor", "status").returncode == 0
    finally:
        bt(ws, cache, "monitor", "stop")
