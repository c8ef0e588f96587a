"""Surviving faults, for real: ``kill -9`` of buildtool at random moments, commands killed
by a signal or leaving partial outputs, two builds on one workspace, two workspaces on one
cache at once, damaged state files and cache entries, a full or read-only cache dir."""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import shutil
import signal
import sqlite3
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import cache_verify as cv
import pytest
from cache_verify import verify_cache
from conftest import BUILDTOOL, Workspace, _clean_env, immutable, read_events, run_buildtool, slot_file

MIB = 1 << 20


def tree(root: Path) -> dict[str, bytes]:
    """Every file of a workspace but its state dir: relative path -> content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".buildtool"]
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def popen_build(ws: Workspace, *args: str, cache: Path | None = None) -> subprocess.Popen[str]:
    env = _clean_env(cache or ws.cache, ws.home)
    return subprocess.Popen([BUILDTOOL, "build", *args], cwd=ws.root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# -- kill -9 loop ---------------------------------------------------------------------------
KILL_SEED = 20240611
N_BIG = 6
N_SMALL = 12


def kill_workspace(ws: Workspace, rng: random.Random) -> None:
    """~45 targets: big inputs (hashing, cache writes), slow commands that write their
    output in two steps (an orphan would still be writing), and fan-in targets."""
    for i in range(N_BIG):
        ws.write(f"big/in{i}.dat", rng.randbytes(6 * MIB))
    for i in range(N_SMALL):
        ws.write(f"src/s{i}.txt", f"small {i}\n")
    ws.build_file("big", f"""
        for i in range({N_BIG}):
            genrule(name=f"copy{{i}}", srcs=[f"in{{i}}.dat"], outs=[f"copy{{i}}.out"], cmd="cp $< $@")
            genrule(name=f"sum{{i}}", srcs=[f":copy{{i}}"], outs=[f"sum{{i}}.txt"], cmd="cksum < $< > $@")
        genrule(name="all", srcs=[f":sum{{i}}" for i in range({N_BIG})], outs=["all.txt"], cmd="cat $(SRCS) > $@")
    """)
    ws.build_file("src", f"""
        for i in range({N_SMALL}):
            genrule(name=f"slow{{i}}", srcs=[f"s{{i}}.txt"], outs=[f"slow{{i}}.out"],
                    cmd="head -c 1 $< > $@; sleep 0.15; cat $< >> $@")
            genrule(name=f"up{{i}}", srcs=[f":slow{{i}}"], outs=[f"up{{i}}.out"], cmd="tr a-z A-Z < $< > $@")
        genrule(name="fan", srcs=[f":up{{i}}" for i in range({N_SMALL})] + ["//big:all"], outs=["fan.out"],
                cmd="cat $(SRCS) > $@; sleep 0.05")
    """)


def mutate(ws: Workspace, rng: random.Random, step: int) -> None:
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.35:
            i = rng.randrange(N_BIG)
            p = ws.path(f"big/in{i}.dat")
            with open(p, "r+b") as f:  # same size, new bytes somewhere in the middle
                f.seek(rng.randrange(6 * MIB - 16))
                f.write(rng.randbytes(16))
        else:
            i = rng.randrange(N_SMALL)
            ws.write(f"src/s{i}.txt", f"small {i} edit {step}\n")
    if rng.random() < 0.25:  # lost outputs: restores from the cache get killed too
        victims = [p for p in ws.root.rglob("*.out") if rng.random() < 0.3]
        for p in victims:
            p.unlink()


def test_kill_9_at_random_moments_never_corrupts_outputs_or_the_cache(make_workspace, tmp_path: Path) -> None:
    rng = random.Random(KILL_SEED)
    ws = make_workspace("killed")
    kill_workspace(ws, rng)
    kills = 0
    t_end = time.monotonic() + 45  # a budget, not an assertion: fewer iterations on a slow machine
    latest = 1.2  # kill moments are drawn from [0.05, latest]; adapted to how long builds take here
    for step in range(60):  # until 15 builds were killed mid-way (bounded by the iterations and the budget)
        if kills >= 15 or (time.monotonic() > t_end and kills >= 8):
            break
        mutate(ws, rng, step)
        p = popen_build(ws, "-j", "2")
        time.sleep(rng.uniform(0.05, latest))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
            latest = min(1.2, latest * 1.1)
        else:  # it finished first: kill earlier next time
            latest = max(0.1, latest * 0.7)
        p.communicate(timeout=60)
    assert kills >= 8, f"only {kills} builds were still running when killed; the workload is too small"
    # The next build succeeds (killing what the last victim left running) ...
    r = ws.build("-j", "2")
    assert r.rc == 0, r.output
    # ... and gives exactly what a clean build of the same sources gives.
    clean_src = tmp_path / "clean-src"
    shutil.copytree(ws.root, clean_src, ignore=shutil.ignore_patterns(".buildtool", "*.out", "sum*.txt", "all.txt"))
    clean = Workspace(clean_src, tmp_path / "clean-cache", ws.home)
    assert clean.build("-j", "2").rc == 0
    assert tree(ws.root) == tree(clean.root)
    counts = verify_cache(ws.cache)
    assert counts["entries"] > 0
    tmp = cv.layout_dir(ws.cache) / "tmp"
    assert not list(tmp.iterdir()) or all(not cv.blob_path(ws.cache, f.name).exists() for f in tmp.iterdir())
    # And the build after that is a no-op.
    r = ws.build("-j", "2")
    assert r.rc == 0 and not r.ran, r.ran


def _children_of_session(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes()
            if marker.encode() in cmdline and (d / "stat").read_text().split(") ")[1][0] not in "ZX":
                out.append(int(d.name))
        except OSError:
            continue
    return out


@pytest.mark.parametrize(("recorded", "clean", "lose", "own_tmpdir"),
                         [(True, False, "", False), (False, False, "", False), (True, True, "", False),
                          (True, False, "state", False), (True, False, "list", False), (True, False, "state", True),
                          (True, False, "damaged", False)],
                         ids=["recorded", "killed-before-recording", "then-clean", "state-removed", "list-emptied",
                              "state-removed-own-tmpdir", "list-damaged"])
def test_orphans_of_a_killed_build_are_killed_before_the_next_build_writes(
    workspace: Workspace, recorded: bool, clean: bool, lose: str, own_tmpdir: bool
) -> None:
    """The build is killed once its command runs and is listed (on a busy machine the
    listing can come long after the start).  ``recorded=False``: as a build killed after
    starting the command but before it wrote the pid to .buildtool/children (a window
    that can last milliseconds while the scheduler's thread waits for the GIL); the
    command's TMPDIR still gives it away.
    ``clean``: ``buildtool clean`` comes first; it removes the list of them with the state.
    ``lose``: the state directory removed (``rm -rf .buildtool``, a CI checkout's ``git clean
    -ffdx``) or the list emptied: the orphan appended to the next build's output, which was
    recorded so; the list's spare copy outside the workspace still names the killed build.
    ``own_tmpdir``: the action's env names TMPDIR and HOME (BUILDTOOL_LANE still names its lane)."""
    marker = f"orphanmark{os.getpid()}x{time.monotonic_ns()}"
    workspace.write("in.txt", "v1\n")
    # The command writes half its output, sleeps, then appends: an orphan left alive would
    # append to the output of the next build's run.
    env = ', env={"TMPDIR": "/tmp", "HOME": "/tmp"}' if own_tmpdir else ""
    workspace.build_file("", f"""
        genrule(name="slow", srcs=["in.txt"], outs=["o.txt"]{env},
                cmd="cat $< > $@; sleep 30 # {marker}\\necho ORPHAN >> $@")
    """)
    p = popen_build(workspace)
    try:
        children = workspace.path(".buildtool/children")

        def recorded_and_running() -> bool:
            try:
                return len(children.read_text().splitlines()) >= 2 and bool(_children_of_session(marker))
            except OSError:
                return False

        deadline = time.monotonic() + 20
        while not recorded_and_running():
            assert time.monotonic() < deadline, "the command never started (or was never recorded)"
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=10)
        assert _children_of_session(marker), "the orphan should have outlived its buildtool"
        lines = children.read_text().splitlines()
        assert len(lines) == 2, lines  # the header and the one command
        if not recorded:
            children.write_text(lines[0] + "\n")
        if lose == "state":
            shutil.rmtree(workspace.path(".buildtool"))
        elif lose == "list":
            children.write_text("")
        elif lose == "damaged":  # (said as damaged, not as gone with the state directory)
            children.write_bytes(b"\x8f\x02garbage\n1 2 3\n")
        workspace.build_file("", """
            genrule(name="slow", srcs=["in.txt"], outs=["o.txt"], cmd="cat $< > $@")
        """)
        if clean:
            rc, _, err = workspace.run("clean")
            assert rc == 0 and "left running by a previous buildtool" in err, err
            assert not _children_of_session(marker)
            # Half written by the killed command (no record names it): it was kept.
            assert not workspace.path("o.txt").exists() and "were writing when it died" in err, err
        r = workspace.build()
        assert r.rc == 0, r.output
        assert ("left running by a previous buildtool" in r.stderr) is not clean
        assert ("its list of them was damaged" in r.stderr) is (lose in ("damaged", "list")), r.stderr
        assert ("its list of them went with the state directory" in r.stderr) is (lose == "state"), r.stderr
        assert not _children_of_session(marker)  # (the shell that would append is gone)
        assert workspace.read("o.txt") == "v1\n"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        for pid in _children_of_session(marker):  # a failure above must not leave the orphan running
            with contextlib.suppress(OSError):
                group = os.getpgid(pid)
                if group == os.getpgid(0):  # (never this test run's own group)
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.killpg(group, signal.SIGKILL)


@pytest.mark.parametrize("first", ["build", "explain"])
def test_a_half_written_output_of_a_killed_build_is_deleted_not_kept_as_a_users_edit(
    workspace: Workspace, first: str,
) -> None:
    """kill -9 while a command was writing p.out, then its rule renamed the output: p.out,
    half written, differed from the record and was kept as "edited since?" (a dead output),
    and a glob(["*.out"]) took it into bundle.txt, which a fresh checkout makes without it.
    ``explain`` first ("what would rebuild?" after a crash): it took the lanes' records
    away with the state's tmp/, and the build after it kept p.out all the same."""
    marker = f"halfmark{os.getpid()}x{time.monotonic_ns()}"
    workspace.write("in.txt", "two\n")
    workspace.build_file("", """
        genrule(name="p", srcs=["in.txt"], outs=["p.out"], cmd="echo start > $@; cat $< >> $@")
        genrule(name="bundle", srcs=glob(["*.out"]), outs=["bundle.txt"], cmd="cat $(SRCS) /dev/null > $@")
    """)
    assert workspace.build().rc == 0
    workspace.write("in.txt", "three\n")
    workspace.build_file("", f"""
        genrule(name="p", srcs=["in.txt"], outs=["p.out"], cmd="echo start > $@; sleep 30 # {marker}\\ncat $< >> $@")
        genrule(name="bundle", srcs=glob(["*.out"]), outs=["bundle.txt"], cmd="cat $(SRCS) /dev/null > $@")
    """)
    with _killed_while_running(workspace, "//:p", marker):
        assert workspace.read("p.out") == "start\n"  # (half written)
        workspace.build_file("", """
            genrule(name="p", srcs=["in.txt"], outs=["gen/p.out"], cmd="echo start > $@; cat $< >> $@")
            genrule(name="bundle", srcs=glob(["*.out"]), outs=["bundle.txt"], cmd="cat $(SRCS) /dev/null > $@")
        """)
        if first == "explain":
            assert workspace.run("explain")[0] == 0
        r = workspace.build()
        assert r.rc == 0 and "were writing when it died" in r.stderr, r.output
        assert not workspace.path("p.out").exists() and workspace.read("bundle.txt") == "", r.output


@contextlib.contextmanager
def _killed_while_running(workspace: Workspace, pattern: str, marker: str) -> Iterator[None]:
    """A build of ``pattern`` SIGKILLed once the command whose text holds ``marker`` runs;
    what it left running is killed on the way out, whatever the body did."""
    p = popen_build(workspace, pattern)
    try:
        deadline = time.monotonic() + 20
        while not _children_of_session(marker):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=10)
        yield
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        for pid in _children_of_session(marker):
            with contextlib.suppress(OSError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


def test_a_stamp_cut_short_by_a_kill_9_runs_again_whatever_its_record_says(workspace: Workspace) -> None:
    """A genrule without outputs (a stamp) killed half-way with buildtool, its input then
    put back: the record's run of that key made it "up to date" over the half-done work,
    and its dependent with it (a stamp has no output to delete, as a half-written one is)."""
    marker = f"stampmark{os.getpid()}x{time.monotonic_ns()}"
    build = """
        genrule(name="s", srcs=["in.txt"], cmd="cp in.txt half.txt; {wait}cp in.txt full.txt")
        genrule(name="d", deps=[":s"], outs=["d.out"], cmd="cat half.txt full.txt > $@")
    """
    workspace.write("in.txt", "v1\n")
    workspace.build_file("", build.format(wait=""))
    assert workspace.build().rc == 0
    workspace.write("in.txt", "v2\n")
    workspace.build_file("", build.format(wait=f"sleep 30 # {marker}\\n"))
    with _killed_while_running(workspace, "//...", marker):
        workspace.write("in.txt", "v1\n")
        workspace.build_file("", build.format(wait=""))
        rc, out, _ = workspace.run("explain")  # (a dry run: it predicts, the build reaps)
        assert rc == 0 and "//:s  WOULD RUN" in out, out
        r = workspace.build()
        assert r.rc == 0 and r.status("//:s") == "ran", r.output
        assert workspace.read("half.txt") == workspace.read("full.txt") == "v1\n"
        assert workspace.read("d.out") == "v1\nv1\n"


# -- commands killed by a signal, partial outputs -------------------------------------------
@pytest.mark.parametrize(
    "cmd, message",
    [
        ("echo part > a.out; echo part > b.out; kill -TERM $$$$", "killed by signal 15"),
        ("echo part > a.out; sh -c 'kill -SEGV $$$$'; echo never > b.out", "exited with status 139"),
        ("echo part > a.out; exit 3", "exited with status 3"),
        ("echo part > a.out; echo partial-b > b.out; rm a.out", "a.out was not created"),
    ],
)
def test_signalled_or_partial_commands_fail_and_leave_nothing(workspace: Workspace, cmd: str, message: str) -> None:
    workspace.build_file("", f"""
        genrule(name="t", outs=["a.out", "b.out"], cmd="{cmd}")
        genrule(name="after", srcs=[":t"], outs=["c.out"], cmd="cat $(SRCS) > $@")
    """)
    r = workspace.build()
    assert r.rc == 1
    assert message in r.output
    assert r.status("//:t") == "failed" and r.status("//:after") in ("skipped", "cancelled")
    assert not workspace.exists("a.out") and not workspace.exists("b.out") and not workspace.exists("c.out")
    # Nothing was cached or recorded: the next build tries again.
    assert verify_cache(workspace.cache)["entries"] == 0
    r = workspace.build()
    assert r.status("//:t") == "failed"


# -- two builds at once ---------------------------------------------------------------------
@contextlib.contextmanager
def _two_builds(workspace: Workspace, first_args: tuple[str, ...], go: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Start a build (its command waits for ``go``) and wait until it holds the lock; the
    list it yields has that build first, then any the test adds (each killed if still
    running at the end, after ``go`` is made)."""
    procs = [popen_build(workspace, *first_args)]
    try:
        lock = workspace.root / ".buildtool" / "lock"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (lock.exists() and lock.read_text().strip()):
            time.sleep(0.02)
        yield procs
    finally:
        go.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def _says_it_waits(p: subprocess.Popen[str]) -> str:
    """The first line the build ``p`` says (it blocks on the lock right after)."""
    assert p.stderr is not None
    ready, _, _ = select.select([p.stderr], [], [], 30)  # (no hang if it never says a word)
    assert ready, "the second build said nothing in 30 s"
    said = p.stderr.readline()
    assert "waiting for another buildtool" in said, said
    return said


def test_second_build_waits_for_the_first_or_fails_fast(workspace: Workspace) -> None:
    """The first build's command runs until the test says go, once the second build says
    it waits (a fixed sleep raced the start of two more buildtools on a busy machine)."""
    workspace.home.mkdir(parents=True, exist_ok=True)
    go = workspace.home / "go"
    workspace.build_file("", f"""
        genrule(name="slow", outs=["o.txt"], cmd="while [ ! -e {go} ]; do sleep 0.02; done; echo done > $@")
    """)
    with _two_builds(workspace, (), go) as procs:
        first = procs[0]
        holder = int((workspace.root / ".buildtool" / "lock").read_text().strip())
        assert holder == first.pid
        rc, _, err = workspace.run("build", "--no-wait")
        assert rc == 1
        assert f"pid {first.pid}" in err and "--no-wait" in err
        # A typo is said at once, not after the other build (it waited for the lock first).
        for typo, needle in (("//:slwo", "unknown target '//:slwo'"), ("//nopkg:x", "//nopkg")):
            rc, _, err = run_buildtool("build", typo, cwd=workspace.root, cache_dir=workspace.cache,
                                       home=workspace.home, timeout=20)
            assert rc == 2 and needle in err and "waiting" not in err, err
        events = workspace.home / "second.jsonl"
        procs.append(second := popen_build(workspace, "--events", str(events)))
        said = _says_it_waits(second)
        assert f"waiting for another buildtool (pid {first.pid}) on this workspace" in said, said
        go.touch()
        assert second.wait(timeout=30) == 0, second.communicate()
        assert first.wait(timeout=30) == 0
        _, ev = read_events(events)
        assert [e["status"] for e in ev if e["label"] == "//:slow"] == ["up_to_date"]  # the first's result
        assert workspace.read("o.txt") == "done\n"


def test_a_macro_module_edited_while_a_build_waits_for_the_lock_is_read_as_it_is_then(
    workspace: Workspace,
) -> None:
    """The check of the patterns before the wait imported tools/defs.py; the build, under
    the lock, used that import: the edit made during the wait was lost, and the stale
    output was "up to date" from then on (and a getenv() at import went untracked)."""
    workspace.home.mkdir(parents=True, exist_ok=True)
    go = workspace.home / "go"
    workspace.write("tools/__init__.py", "")
    workspace.write("tools/defs.py", "from buildtool.dsl import genrule\n\ndef mk(name):\n"
                                     "    genrule(name=name, outs=[name + '.txt'], cmd='echo OLD > $@')\n")
    workspace.build_file("sub", 'from tools.defs import mk\nmk("m")\n')
    workspace.build_file("", f'genrule(name="slow", outs=["slow.txt"], cmd="while [ ! -e {go} ]; do sleep 0.02; done; '
                             'echo > $@")\n')
    assert workspace.build("//sub:m").rc == 0 and workspace.read("sub/m.txt") == "OLD\n"
    with _two_builds(workspace, ("//:slow",), go) as procs:
        procs.append(second := popen_build(workspace, "//sub:m"))
        _says_it_waits(second)
        workspace.write("tools/defs.py", workspace.read("tools/defs.py").replace("OLD", "NEW"))
        go.touch()
        assert second.wait(timeout=30) == 0, second.communicate()
        assert procs[0].wait(timeout=30) == 0
        assert workspace.read("sub/m.txt") == "NEW\n"


def test_two_workspaces_share_one_cache_concurrently(make_workspace, tmp_path: Path) -> None:
    shared = tmp_path / "shared-cache"
    a = make_workspace("a", cache=shared)
    build = "\n".join(
        f'genrule(name="t{i}", outs=["t{i}.out"], cmd="{{ echo {i}; head -c {50_000 + i} /dev/zero; }} >$@; sleep .02")'
        for i in range(40)
    ) + '\ngenrule(name="all", srcs=[' + ",".join(f'":t{i}"' for i in range(40)) + '], outs=["all.out"], ' \
        'cmd="cat $(SRCS) | cksum > $@")\n'
    a.build_file("", build)
    b = a.copy_to(tmp_path / "b", cache=shared)
    for _ in range(2):
        pa, pb = popen_build(a, "-j", "2", cache=shared), popen_build(b, "-j", "2", cache=shared)
        ra, rb = pa.communicate(timeout=120), pb.communicate(timeout=120)
        assert pa.returncode == 0, ra
        assert pb.returncode == 0, rb
        assert tree(a.root) == tree(b.root)
        verify_cache(shared)
        for ws in (a, b):  # the second round restores into both at once
            for p in ws.root.glob("*.out"):
                p.unlink()
    ref = make_workspace("ref")
    ref.build_file("", build)
    assert ref.build("-j", "2").rc == 0
    pa, pb = popen_build(a, cache=shared), popen_build(b, cache=shared)
    assert pa.wait(timeout=120) == 0 and pb.wait(timeout=120) == 0
    assert tree(a.root) == tree(ref.root) == tree(b.root)


# -- damaged state files and cache entries ----------------------------------------------------
STATE_FILES = ["record", "stat-cache", "noop", "children"]


def _damage(path: Path, how: str) -> None:
    if how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: max(1, len(data) // 2)])
    elif how == "garbage":
        path.write_bytes(b"\x00\xff garbage \xfe\n{not json\n")
    elif how == "other-version":
        data = path.read_bytes()
        first, _, rest = data.partition(b"\n")
        path.write_bytes(first.replace(b"v1", b"v99") + b"\n" + rest)
    elif how == "directory":  # unreadable even for root
        if path.exists():
            path.unlink()
        path.mkdir()
        (path / "x").write_text("x")
    elif how == "empty":
        path.write_bytes(b"")


def state_workspace(ws: Workspace, big: bool = False) -> None:
    """Two targets; ``big``: outputs over cache.INLINE_MAX, so the cache keeps them as blobs."""
    ws.write("a.txt", "a\n" * (3000 if big else 1))
    ws.write("b.txt", "b\n" * (3000 if big else 1))
    ws.build_file("", """
        genrule(name="x", srcs=["a.txt"], outs=["x.out"], cmd="cat $< > $@; echo x >> $@")
        genrule(name="y", srcs=["b.txt", ":x"], outs=["y.out"], cmd="cat $(SRCS) > $@")
    """)


@pytest.mark.parametrize("how", ["truncated", "garbage", "other-version", "directory", "empty"])
@pytest.mark.parametrize("name", STATE_FILES)
def test_damaged_state_file_is_discarded_not_fatal(workspace: Workspace, name: str, how: str) -> None:
    state_workspace(workspace)
    assert workspace.build().rc == 0
    state = workspace.root / ".buildtool"
    path = slot_file(state, name) if name == "noop" else state / name
    if not path.exists():
        path.write_text("# buildtool children v1 pid=1\n12345 1\n")  # as a kill -9ed build leaves it
    _damage(path, how)
    workspace.write("a.txt", "a2\n")  # something to do, so the damaged file is consulted
    rc, out, err = workspace.run("build")  # plain: the no-op fast path reads its snapshot too
    assert rc == 0, out + err
    assert "Traceback" not in out + err
    assert workspace.read("x.out") == "a2\nx\n" and workspace.read("y.out") == "b\na2\nx\n"
    warnings = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warnings) <= 2, warnings  # one line per damaged file, not one per target
    # The build after that is healthy again (and silent).
    r = workspace.build()
    assert r.rc == 0 and not r.ran and "warning" not in r.stderr, r.output


def _blobs(cache: Path) -> list[Path]:
    return sorted((cv.layout_dir(cache) / "cas").glob("*/*"))


def _damage_entry(raw: bytes, how: str) -> bytes:
    if how == "truncated":
        return raw[: len(raw) // 2]
    if how == "garbage":
        return b"\x00\xff garbage \xfe\n{not json\n"
    if how == "other-version":
        return json.dumps({**json.loads(raw), "v": 99}).encode()
    return b""


def _damage_database(cache: Path, how: str) -> None:
    db = cv.db_path(cache)
    if how == "other-version":
        with contextlib.closing(sqlite3.connect(db)) as c:
            c.execute("PRAGMA user_version = 99")
    else:
        for suffix in ("-wal", "-shm"):  # what the damage left of them is gone too
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        _damage(db, how)


DAMAGE = ("truncated", "garbage", "other-version", "directory", "empty")


@pytest.mark.parametrize(("what", "how"), [
    (w, h) for w in ("entry", "database", "blob") for h in DAMAGE
    if (w, h) not in (("blob", "other-version"), ("entry", "directory"))  # a blob has no version, a row is no dir
])
def test_damaged_cache_file_is_a_miss_never_a_wrong_output(workspace: Workspace, what: str, how: str) -> None:
    state_workspace(workspace, big=what == "blob")
    assert workspace.build().rc == 0
    want = tree(workspace.root)
    if what == "entry":
        rows = cv.entries(workspace.cache)
        assert rows, "the build stored no entry to damage"
        for key, raw in rows.items():
            cv.write_entry(workspace.cache, key, _damage_entry(raw, how))
    elif what == "database":
        _damage_database(workspace.cache, how)
    else:
        blobs = _blobs(workspace.cache)
        assert blobs, "the build stored no blob to damage"
        for p in blobs:
            os.chmod(p, 0o644)
            _damage(p, how)
    for o in ("x.out", "y.out"):
        workspace.path(o).unlink()
    r = workspace.build()
    assert r.rc == 0, r.output
    assert "Traceback" not in r.output
    assert tree(workspace.root) == want
    assert r.status("//:x") in ("ran", "restored")
    if how != "empty" or what != "blob":
        assert r.status("//:x") == "ran"
    # The damage was repaired by that build: the next one restores, quietly.
    for o in ("x.out", "y.out"):
        workspace.path(o).unlink()
    r = workspace.build()
    assert r.rc == 0 and r.status("//:x") == "restored" and "warning" not in r.stderr, r.output
    assert tree(workspace.root) == want


# -- a full or read-only cache dir -------------------------------------------------------------
def _mount_tmpfs(where: Path, opts: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, check=False)
    return p.returncode == 0


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    where = tmp_path / "tmpfs"
    if os.geteuid() != 0 or not shutil.which("mount") or not _mount_tmpfs(where, "size=256k"):
        pytest.skip("cannot mount a tmpfs here (needs root and mount rights); cache.py unit tests inject ENOSPC")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_full_cache_disk_still_builds_and_leaves_no_half_blob(workspace: Workspace, small_tmpfs: Path) -> None:
    workspace.build_file("", "\n".join(
        f'genrule(name="t{i}", outs=["t{i}.out"], cmd="{{ echo {i}; head -c 100000 /dev/zero; }} > $@")'
        for i in range(6)
    ) + "\n")
    r = workspace.build("-j", "2", cache=small_tmpfs)
    assert r.rc == 0, r.output
    assert r.stderr.count("nothing is stored in the cache for the rest of this build") == 1, r.stderr
    for i in range(6):
        assert workspace.path(f"t{i}.out").stat().st_size == 100000 + len(f"{i}\n")
    verify_cache(small_tmpfs)  # every blob whole, every entry complete
    assert not list((cv.layout_dir(small_tmpfs) / "tmp").iterdir())


def test_read_only_cache_dir_still_builds(workspace: Workspace, tmp_path: Path) -> None:
    ro = tmp_path / "ro-cache"
    if os.geteuid() != 0 or not _mount_tmpfs(ro, "size=1m,ro"):
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        state_workspace(workspace)
        r = workspace.build(cache=ro)
        assert r.rc == 0, r.output
        assert "caching is off for the rest of this build" in r.stderr, r.stderr  # (an empty one: nothing to read)
        assert workspace.read("y.out") == "b\na\nx\n"
        r = workspace.build(cache=ro)  # the workspace record still makes it a no-op
        assert r.rc == 0 and not r.ran
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def _build_while_the_record_may_grow_1_KiB(workspace: Workspace) -> subprocess.CompletedProcess[str]:
    """``buildtool build`` under a file-size limit (standing in for a full disk) that lets
    .buildtool/record grow by 1 KiB."""
    import resource

    limit = os.path.getsize(workspace.path(".buildtool/record")) + 1024

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([BUILDTOOL, "build"], cwd=workspace.root, capture_output=True, text=True,
                          env=_clean_env(workspace.cache, workspace.home), preexec_fn=small_files, timeout=120)


def test_a_build_record_that_stops_growing_mid_build_is_one_warning_not_a_failure(workspace: Workspace) -> None:
    """A file-size limit (standing in for a full disk) reached by .buildtool/record during a
    build: one warning per action, then 'OK' and exit 1 ('File too large') from the last
    flush, which also skipped the build's cleanup (.buildtool/tmp/ left behind)."""
    workspace.write("s.txt", "a\n")
    workspace.build_file("", "for i in range(8):\n"
                             "    genrule(name=f't{i}', srcs=['s.txt'], outs=[f'o{i}'], cmd='cat $< > $@')\n")
    assert workspace.build().rc == 0
    workspace.write("s.txt", "b\n")
    r = _build_while_the_record_may_grow_1_KiB(workspace)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.count("could not write the build record") == 1, r.stderr
    assert "Traceback" not in r.stderr and not os.path.exists(workspace.path(".buildtool/tmp")), r.stderr
    for i in range(8):
        assert workspace.read(f"o{i}") == "b\n"
    r2 = workspace.build()
    assert r2.rc == 0 and all(workspace.read(f"o{i}") == "b\n" for i in range(8)), r2.output


def test_a_build_record_that_lost_a_line_leaves_no_snapshot_to_trust_it(workspace: Workspace) -> None:
    """A reviewer's sequence: a record append fails (a file-size limit for a full disk) in a
    build that succeeds; its no-op snapshot was still written, so the next incremental build
    took A's output digest from A's stale record line: B's key was the old one, and B's
    missing output was restored from the cache with the old content of a.out."""
    workspace.write("a.txt", "1\n")
    workspace.write("b.txt", "x\n")
    workspace.build_file("", 'genrule(name="A", srcs=["a.txt"], outs=["a.out"], cmd="cp a.txt a.out", '
                             'env={"PAD": "p" * 6000})\n'
                             'genrule(name="B", srcs=[":A", "b.txt"], outs=["b.out"], cmd="cat a.out b.txt > b.out")\n')
    time.sleep(0.1)
    assert workspace.build().rc == 0
    workspace.write("a.txt", "2\n")
    r = _build_while_the_record_may_grow_1_KiB(workspace)
    assert r.returncode == 0 and "could not write the build record" in r.stderr, r.stdout + r.stderr
    assert workspace.read("b.out") == "2\nx\n"
    time.sleep(0.1)
    os.unlink(workspace.path("b.out"))
    rc, out, err = workspace.run("build")  # (no --events: the snapshot's path, if there is one)
    assert rc == 0 and workspace.read("b.out") == "2\nx\n", out + err


def test_a_state_dir_that_takes_no_new_directory_fails_the_target_in_words(workspace: Workspace) -> None:
    """.buildtool immutable (or read-only, for a user without root) and its tmp/ gone: the
    command's temp directory cannot be made, which said `internal error: PermissionError`."""
    workspace.write("in", "x\n")
    workspace.build_file("", 'genrule(name="a", srcs=["in"], outs=["a"], cmd="cat in > $@")\n')
    assert workspace.build().rc == 0
    workspace.write("in", "y\n")
    state = workspace.root / ".buildtool"
    shutil.rmtree(state / "tmp", ignore_errors=True)
    with immutable(state):
        r = workspace.build()
    assert r.rc == 1 and "internal error" not in r.output, r.output
    assert f"cannot make the command's temp directory {state / 'tmp'}" in r.output, r.output


def test_an_adopted_output_linked_to_a_blob_gets_its_mode_as_a_file_of_its_own(workspace: Workspace) -> None:
    """hardlink mode: an output linked to a 0444 blob, adopted for a key whose entry says
    0755, was chmod'ed in place: the blob became writable and executable, for every output
    linked to it (a reviewer's sequence)."""
    hard = {"BUILDTOOL_RESTORE_MODE": "hardlink"}
    workspace.write("tool.sh", "#" * 5000 + "\n")  # (big enough to be a blob of its own, not inline)
    workspace.build_file("", 'genrule(name="T", srcs=["tool.sh"], outs=["out.sh"], cmd="cp tool.sh out.sh")\n')
    out = workspace.path("out.sh")
    assert workspace.run("build", env_extra=hard)[0] == 0
    os.chmod(workspace.path("tool.sh"), 0o755)
    assert workspace.run("build", env_extra=hard)[0] == 0
    os.chmod(workspace.path("tool.sh"), 0o644)
    os.unlink(out)
    assert workspace.run("build", env_extra=hard)[0] == 0
    assert os.stat(out).st_nlink > 1  # restored as a link to the blob
    blob = os.stat(out)
    os.chmod(workspace.path("tool.sh"), 0o755)
    rc, so, se = workspace.run("build", env_extra=hard)
    assert rc == 0 and os.stat(out).st_mode & 0o111, so + se
    linked = [p for p in Path(workspace.cache).rglob("*") if p.is_file() and os.stat(p).st_ino == blob.st_ino]
    assert linked and all(stat.S_IMODE(os.stat(p).st_mode) == stat.S_IMODE(blob.st_mode) for p in linked)
    assert os.stat(out).st_ino != blob.st_ino


def test_a_lane_temp_dir_that_cannot_be_made_again_fails_no_command_that_ended_well(workspace: Workspace) -> None:
    """`rm -rf .buildtool` under a build: emptying the lane's TMPDIR after a command could
    not make it again, and the target whose command had succeeded failed with "internal
    error: FileNotFoundError".  Here the command itself puts a file where the lanes' parent
    directory was (the race, made certain)."""
    workspace.build_file("", 'genrule(name="g", outs=["g.out"], '
                             'cmd=\'T=$$(dirname "$$BUILDTOOL_LANE"); rm -rf "$$T"; echo > "$$T"; echo ok > $@\')\n')
    r = workspace.build("-j1")
    assert r.rc == 0 and r.status("//:g") == "ran" and workspace.read("g.out") == "ok\n", r.output
    assert "internal error" not in r.output


@pytest.mark.parametrize("where", ["cache:size", "cache:stats", "state:record", "state:stat-cache", "state:noop",
                                   "state:graph", "state:testlogs-index", "state:children", "state:reports"])
def test_a_named_pipe_in_the_place_of_a_state_or_cache_file_is_discarded_not_waited_on(
    workspace: Workspace, where: str
) -> None:
    """A FIFO at <cache>/v2/size (or stats, record, the stat cache...) hung every build of
    every workspace using that cache, SIGTERM ignored: opening it waited for a writer.  It
    is damage like any other: discarded, and the build goes on."""
    workspace.write("a.txt", "a\n")
    workspace.build_file("", 'genrule(name="a", srcs=["a.txt"], outs=["a.out"], cmd="cp a.txt a.out")\n'
                             'test(name="t", srcs=[":a"], cmd="grep -q a a.out")\n')
    rc, out, err = workspace.run("test", "//...")
    assert rc == 0, out + err
    kind, _, name = where.partition(":")
    path = (Path(workspace.cache) / "v2" / name) if kind == "cache" else workspace.root / ".buildtool" / name
    if name in ("noop", "graph"):  # (the snapshot of `build //...`, which the last loop below reads)
        time.sleep(0.1)  # (out of the racy window: a snapshot is written)
        assert workspace.run("build", "//...")[0] == 0
        path = slot_file(workspace.root / ".buildtool", name)
        assert path.exists(), sorted(p.name for p in path.parent.iterdir())
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    os.mkfifo(path)
    workspace.write("a.txt", "a2\n")
    reports = ["--events", str(workspace.home / "ev.jsonl")]  # (the reports ledger is read with a report)
    for command in ("build", "test"):
        try:
            rc, out, err = run_buildtool(command, "//...", *reports, cwd=workspace.root, cache_dir=workspace.cache,
                                         home=workspace.home, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command} waited on the named pipe at {where}")
        assert rc == 0, (command, out + err)
        assert "Traceback" not in err
    assert workspace.read("a.out") == "a2\n"
    for _ in range(2):  # (the snapshot of the no-op fast path is a build's: then it answers)
        rc, out, err = workspace.run("build", "//...")
    assert rc == 0 and "nothing changed" in out + err, out + err


@pytest.mark.parametrize(("name", "line"), [
    ("record", '{"l":"//:a","k":"zz","o":[["a.out","abc",420]],"d":null,"desc":"{}"}'),
    ("record", '{"l":"//:a","k":"zz","o":"x","d":1.0,"desc":"{}"}'),
    ("record", '{"l":"//:a","k":"zz","o":[[5]],"d":1.0,"desc":"{}"}'),
    ("record", '{"l":"//:a","k":"zz","o":[],"d":"s","desc":"{}"}'),
    ("stat-cache", '{"a.txt":5}'),
    ("stat-cache", '{"a.txt":{}}'),
])
def test_a_state_line_of_the_wrong_types_is_a_corrupt_line_not_a_crash(
    workspace: Workspace, name: str, line: str
) -> None:
    """A well-formed JSON line with values of other types (a hand edit, another tool) made
    every build end in a traceback (TypeError in the weights, IndexError, KeyError) until
    `clean`: it is a corrupt line, as one of another shape was."""
    workspace.write("a.txt", "a\n")
    workspace.build_file("", 'genrule(name="a", srcs=["a.txt"], outs=["a.out"], cmd="cp a.txt a.out")\n')
    assert workspace.run("build")[0] == 0
    with open(workspace.root / ".buildtool" / name, "a") as f:
        f.write(line + "\n")
    workspace.write("a.txt", "a2\n")
    for _ in range(2):
        rc, out, err = workspace.run("build")
        assert rc == 0 and "Traceback" not in err, out + err
    assert workspace.read("a.out") == "a2\n"


def test_a_directory_in_the_place_of_the_pickled_graph_is_removed_with_a_warning(workspace: Workspace) -> None:
    """The snapshot's write failed on it without a word, and the no-op fast path was off
    for good."""
    workspace.write("a.txt", "a\n")
    workspace.build_file("", 'genrule(name="a", srcs=["a.txt"], outs=["a.out"], cmd="cp a.txt a.out")\n')
    time.sleep(0.2)  # (files written within the snapshot's racy window are not vouched for: none written)
    assert workspace.run("build")[0] == 0
    graph = slot_file(workspace.root / ".buildtool", "graph")
    graph.unlink()
    graph.mkdir()
    workspace.write("a.txt", "a2\n")
    rc, out, err = workspace.run("build")
    assert rc == 0 and "is a directory, not the no-op snapshot's file" in err, out + err
    for _ in range(2):
        rc, out, err = workspace.run("build")
    assert rc == 0 and "nothing changed" in out + err, out + err


def test_a_directory_in_the_place_of_the_test_log_index_is_removed(workspace: Workspace) -> None:
    """Two warnings on every `test`, for good: it was read as unreadable and never written."""
    workspace.build_file("", 'test(name="t", cmd="true")\n')
    assert workspace.run("test", "//...")[0] == 0
    index = workspace.root / ".buildtool" / "testlogs-index"
    index.unlink()
    index.mkdir()
    rc, out, err = workspace.run("test", "//...")
    assert rc == 0 and "the test log index is unreadable; discarding it" in err, out + err
    rc, out, err = workspace.run("test", "//...")
    assert rc == 0 and "warning" not in err and index.is_file(), out + err
