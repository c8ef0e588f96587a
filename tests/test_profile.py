"""``--profile FILE``: a Chrome trace with one span per executed target and the build
phases; the critical path of what ran is printed at the end of every build."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

from conftest import BUILDTOOL, Workspace, _clean_env

BUILD = """
genrule(name="a", srcs=["s.txt"], outs=["a.out"], cmd="sleep 0.3; cat $< > $@")
genrule(name="b", srcs=["s.txt"], outs=["b.out"], cmd="sleep 0.05; cat $< > $@")
genrule(name="c", srcs=[":a", ":b"], outs=["c.out"], cmd="sleep 0.1; cat $(SRCS) > $@")
group(name="all", deps=[":c"])
"""


def _load(path: Path) -> dict:
    doc = json.loads(path.read_text())
    assert doc["otherData"]["buildtool_profile_version"] == 1
    return doc


def test_profile_has_a_span_per_executed_target_on_its_lane(workspace: Workspace, tmp_path: Path) -> None:
    workspace.write("s.txt", "x\n")
    workspace.build_file("", BUILD)
    prof = tmp_path / "trace.json"
    r = workspace.build("-j", "2", "--profile", str(prof))
    assert r.rc == 0, r.output
    doc = _load(prof)
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "target"]
    executed = {e["label"]: e for e in r.events if e["status"] in ("ran", "restored")}
    assert sorted(s["name"] for s in spans) == sorted(executed) == ["//:a", "//:b", "//:c"]
    for s in spans:
        ev = executed[s["name"]]
        assert s["args"]["status"] == ev["status"]
        assert s["args"]["cache"] == ev["cache"]
        assert s["args"]["reason"] == ev["reason"]
        assert s["tid"] == ev["lane"] + 1
        assert s["dur"] > 0 and s["ts"] >= 0
    by = {s["name"]: s for s in spans}
    assert by["//:c"]["ts"] >= by["//:a"]["ts"] + by["//:a"]["dur"] - 1000  # c waits for a (1 ms slack)
    phases = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "phase"}
    assert {"load buildfiles and graph", "schedule"} <= phases
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "phases" in names and any(n.startswith("worker ") for n in names)
    # The hash phase of each target that ran, nested in its span on the same lane.
    hashes = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "hash"]
    assert {h["tid"] for h in hashes} <= {s["tid"] for s in spans} and len(hashes) == 3
    for h in hashes:
        assert any(s["tid"] == h["tid"] and s["ts"] <= h["ts"] and h["dur"] <= s["dur"] for s in spans)
    # The critical path of what ran: a (the long one) then c.
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("critical path:"))
    assert line.index("//:a") < line.index("//:c") and "//:b" not in line, line
    m = re.match(r"critical path: (\d+\.\d\d)s of (\d+\.\d\d)s wall: //:a (\d+\.\d\d)s -> //:c (\d+\.\d\d)s$", line)
    assert m, line
    busy, wall, a, c = map(float, m.groups())
    assert a >= 0.3 and c >= 0.1 and abs(busy - (a + c)) <= 0.011 and busy <= wall, line


def test_profile_of_a_restore_and_of_a_noop(workspace: Workspace, tmp_path: Path) -> None:
    workspace.write("s.txt", "x\n")
    workspace.build_file("", BUILD)
    assert workspace.build().rc == 0
    for name in ("a.out", "b.out", "c.out"):
        (workspace.root / name).unlink()
    prof = tmp_path / "restore.json"
    r = workspace.build("--profile", str(prof))
    assert r.rc == 0
    spans = [e for e in _load(prof)["traceEvents"] if e.get("cat") == "target"]
    assert {s["args"]["status"] for s in spans} == {"restored"} and len(spans) == 3
    assert {s["args"]["cache"] for s in spans} == {"local"}
    prof2 = tmp_path / "noop.json"
    rc, out, _ = workspace.run("build", "--profile", str(prof2))
    assert rc == 0
    assert [e for e in _load(prof2)["traceEvents"] if e.get("cat") == "target"] == []
    assert "critical path" not in out


def test_profile_is_written_for_a_failed_build(workspace: Workspace, tmp_path: Path) -> None:
    workspace.build_file("", 'genrule(name="bad", outs=["x"], cmd="echo oops >&2; exit 3")\n')
    prof = tmp_path / "fail.json"
    rc, _, _ = workspace.run("build", "--profile", str(prof))
    assert rc == 1
    spans = [e for e in _load(prof)["traceEvents"] if e.get("cat") == "target"]
    assert [s["args"]["status"] for s in spans] == ["failed"]
    assert "test" not in spans[0]["args"]


def test_a_test_s_span_says_its_verdict(workspace: Workspace, tmp_path: Path) -> None:
    """A timed-out test's span said only "failed", a flaky pass's "ran" (--events has the verdict)."""
    n = tmp_path / "n"
    workspace.build_file("", f'test(name="slow", cmd="sleep 5", timeout=0.2)\n'
                             f'test(name="wobbly", flaky=1, cmd="echo x >> {n}; test $$(wc -l < {n}) -ge 2")\n'
                             'test(name="ok", cmd="true")\n')
    prof = tmp_path / "t.json"
    rc, out, err = workspace.run("test", "-k", "--profile", str(prof))
    assert rc == 1, out + err
    spans = {e["name"]: e["args"] for e in _load(prof)["traceEvents"] if e.get("cat") == "target"}
    assert {k: (v["status"], v["test"]) for k, v in spans.items()} == {
        "//:slow": ("failed", "timeout"), "//:wobbly": ("ran", "flaky"), "//:ok": ("ran", "passed")}, spans


def test_events_and_profile_count_from_the_same_zero(workspace: Workspace, tmp_path: Path) -> None:
    """Both say "since the build began": the events' start and end counted from the
    scheduler's start instead, so a slow BUILD.py put the profile's spans 0.3 s later than
    the same targets' events."""
    workspace.build_file("", 'import time\ntime.sleep(0.3)\ntest(name="t", cmd="sleep 0.2")\n')
    prof = tmp_path / "p.json"
    r = workspace.build("--no-cache-tests", "--profile", str(prof), command="test")
    assert r.rc == 0, r.output
    ev = r.by_label["//:t"]
    [span] = [e for e in _load(prof)["traceEvents"] if e.get("cat") == "target"]
    assert ev["start"] >= 0.3, ev  # (after the BUILD.py's evaluation, which the build's time includes)
    assert abs(span["ts"] / 1e6 - ev["start"]) < 0.001 and abs(span["dur"] / 1e6 - (ev["end"] - ev["start"])) < 0.001


def test_the_console_shows_a_long_critical_path_cut_in_the_middle(workspace: Workspace) -> None:
    n = 60  # a chain: every step is on the critical path
    workspace.build_file("", "\n".join(
        f'genrule(name="s{i}", srcs=[{f"{chr(34)}:s{i - 1}{chr(34)}" if i else ""}], outs=["s{i}.txt"], '
        f'cmd="echo {i} > $@")' for i in range(n)))
    r = workspace.build()
    assert r.rc == 0, r.output
    [line] = [ln for ln in r.stdout.splitlines() if ln.startswith("critical path:")]
    assert line.count(" -> ") == 20 and "... 40 more ..." in line, line
    assert "//:s0 " in line and "//:s59 " in line and "//:s30 " not in line


def test_the_events_file_holds_each_target_while_the_build_runs(workspace: Workspace, tmp_path: Path) -> None:
    """--events is written line by line as the build goes: a reader following it saw
    nothing, not even the header, until the build ended (the lines were buffered)."""
    workspace.build_file("", 'genrule(name="fast", outs=["f.txt"], cmd="echo f > $@")\n'
                             'genrule(name="slow", outs=["s.txt"], cmd="sleep 30; echo s > $@")\n')
    events = tmp_path / "ev.jsonl"
    p = subprocess.Popen([BUILDTOOL, "build", "-j", "2", "--events", str(events)], cwd=workspace.root,
                         env=_clean_env(workspace.cache, workspace.home), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        lines: list[dict] = []
        while time.monotonic() < deadline and not any(e.get("label") == "//:fast" for e in lines):
            time.sleep(0.05)
            text = events.read_text() if events.exists() else ""
            lines = [json.loads(ln) for ln in text.splitlines()]
        assert p.poll() is None, "the build ended: the test proves nothing"
        assert lines and lines[0].get("type") == "header", lines
        assert [e["label"] for e in lines[1:]] == ["//:fast"], lines
    finally:
        p.send_signal(signal.SIGINT)  # (it ends the sleep too; a kill would leave it running)
        p.wait(timeout=60)



def test_the_critical_path_steps_over_a_check_settled_late_to_the_work_that_held_the_build_up() -> None:
    """An up-to-date dependency is checked when the scheduler gets to it, after the lanes'
    commands when all are busy: its late zero-length settle was taken for what released
    the link, and the line named the link alone (`critical path: 3.03s of 9.17s wall`)."""
    from types import SimpleNamespace

    from buildtool.outcome import Outcome, Reason, Status
    from buildtool.profile import actual_critical_path

    def o(status: Status, start: float, end: float) -> Outcome:
        out = Outcome(status, Reason.FAILED if status is Status.RAN else Reason.UP_TO_DATE, "")
        out.start, out.end = start, end
        return out

    deps = {0: (), 1: (0,), 2: (3,), 3: (), 4: (1, 2)}  # io.c -> io.a -> tool2 <- t_core.c <- gen
    graph = SimpleNamespace(targets=[SimpleNamespace(deps=deps[i], pool=None) for i in range(5)])
    outcomes = {0: o(Status.RAN, 0.0, 3.0), 1: o(Status.RAN, 3.0, 3.1), 2: o(Status.UP_TO_DATE, 6.0, 6.0),
                3: o(Status.UP_TO_DATE, 0.27, 0.27), 4: o(Status.RAN, 6.1, 9.1)}
    assert actual_critical_path(graph, outcomes) == [0, 1, 4]  # type: ignore[arg-type]
    outcomes[2] = o(Status.RAN, 5.0, 6.0)  # (had it run, it would be the step)
    assert actual_critical_path(graph, outcomes) == [2, 4]  # type: ignore[arg-type]


def test_the_critical_path_goes_through_the_pool_slot_a_target_waited_for() -> None:
    """Three 1 s links in a depth-1 pool at -j4: the line said `critical path: 1.00s of
    3.03s wall: //:x2 1.00s`, the link that ended last alone, though it waited 2 s for the
    pool.  The step before a target that waited for a slot is the pool's target whose end
    freed it, when the pool was full then (a review: a pool mate that ended long before, or
    a pool that was not full, is no step; nor is a restore settled without a lane)."""
    from types import SimpleNamespace

    from buildtool.outcome import Outcome, Reason, Status
    from buildtool.profile import format_critical_path

    def o(start: float, end: float, lane: int = 0) -> Outcome:
        out = Outcome(Status.RAN, Reason.NEW, "")
        out.start, out.end, out.lane = start, end, lane
        return out

    pools = ["link", "link", "link", None, "other"]
    graph = SimpleNamespace(targets=[SimpleNamespace(deps=(3,) if i == 0 else (), pool=pools[i], label=f"//:x{i}")
                                     for i in range(5)])
    outcomes = {3: o(0.0, 0.2), 0: o(0.2, 1.2), 1: o(1.2, 2.2, 1), 2: o(2.2, 3.2, 2), 4: o(0.0, 0.1, 3)}
    line = format_critical_path(graph, outcomes, 3.25, None, {"link": 1})  # type: ignore[arg-type]
    assert line == ("critical path: 3.20s of 3.25s wall: //:x3 0.20s -> //:x0 1.00s -> //:x1 1.00s "
                    "(after a slot of pool link) -> //:x2 1.00s (after a slot of pool link)"), line
    line = format_critical_path(graph, outcomes, 3.25, None, {})  # type: ignore[arg-type]  (no pool limits)
    assert line == "critical path: 1.00s of 3.25s wall: //:x2 1.00s", line
    line = format_critical_path(graph, outcomes, 3.25, None, {"link": 2})  # type: ignore[arg-type]  (never full)
    assert line == "critical path: 1.00s of 3.25s wall: //:x2 1.00s", line
    # The review's -j2 case: p3 (pool link, depth 1) started as n1 freed a lane, 0.5 s after
    # p1 (the pool's only other member) ended: a lane wait, not a slot's.
    graph = SimpleNamespace(targets=[SimpleNamespace(deps=(), pool=p, label=n) for n, p in
                                     (("//:p1", "link"), ("//:n1", None), ("//:n2", None), ("//:p3", "link"))])
    outcomes = {0: o(0.02, 0.53, 1), 1: o(0.01, 1.03, 0), 2: o(0.53, 2.04, 1), 3: o(1.03, 2.24, 0)}
    line = format_critical_path(graph, outcomes, 2.25, None, {"link": 1})  # type: ignore[arg-type]
    assert line == "critical path: 1.21s of 2.25s wall: //:p3 1.21s", line
    outcomes[0] = o(0.0, 0.0, -1)  # (p1 restored inline: it took no slot, and frees none)
    outcomes[3] = o(0.0, 0.0, -1)
    line = format_critical_path(graph, outcomes, 2.25, None, {"link": 1})  # type: ignore[arg-type]
    assert "slot" not in (line or ""), line


def test_a_restore_the_scheduler_settled_itself_is_drawn_on_its_own_thread(
        workspace: Workspace, tmp_path: Path) -> None:
    """A small restore of a target built here before is done on the scheduler's thread (no
    lane): it was drawn on worker 0, inside the command that lane was running (a child
    slice of it in Perfetto)."""
    workspace.build_file("", 'genrule(name="a", outs=["a.txt"], cmd="echo a > $@")\n'
                             'genrule(name="slow", srcs=["s.txt"], outs=["slow.txt"], cmd="sleep 0.3; cat $< > $@")\n')
    workspace.write("s.txt", "1\n")
    assert workspace.build().rc == 0
    workspace.path("a.txt").unlink()
    workspace.write("s.txt", "2\n")
    prof = tmp_path / "p.json"
    r = workspace.build("--profile", str(prof))
    assert r.rc == 0 and r.by_label["//:a"]["status"] == "restored" and "lane" not in r.by_label["//:a"], r.output
    doc = _load(prof)
    spans = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "target"}
    assert spans["//:a"]["tid"] == 1_000_000 and spans["//:slow"]["tid"] == r.by_label["//:slow"]["lane"] + 1
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[1_000_000] == "scheduler (settled inline)", names
