"""Tests as cached results (buildtool/testing.py), always=True targets and `buildtool run`.

End to end: the real ``buildtool`` in temp workspaces.  Commands count their runs by
appending to a file outside the workspace (an absolute path passed through ``env``), so
"ran once" is observed from the command itself, not only from buildtool's report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import BUILDTOOL, Workspace, _clean_env, immutable

from buildtool.graph import Target
from buildtool.outcome import Outcome, Reason, Status
from buildtool.testing import TestLogs, TestResult, log_rel_path, other_log_rel_path, test_result


def _runs(p: Path) -> int:
    return len(p.read_text().splitlines()) if p.exists() else 0


def _counting_test(ws: Workspace, tmp: Path, *, cmd_tail: str = "true", extra: str = "") -> Path:
    counter = tmp / "runs.txt"
    ws.write("t/input.txt", "v1\n")
    ws.build_file(
        "t",
        f"""
        test(name="unit", srcs=["input.txt"], env={{"COUNTER": "{counter}"}},
             cmd="echo run >> $$COUNTER; echo unit-output-marker; cat input.txt; {cmd_tail}"{extra})
        """,
    )
    return counter


# -- unit: result mapping and the log index ------------------------------------------------
def _target(kind: str = "test", label: str = "//p:t", pkg: str = "p") -> Target:
    return Target(
        id=0, label=label, kind=kind, pkg=pkg, cmd="true", srcs=(), deps=(), outs=(), env=(), pass_env=(),
        tools=(), priority=0, manual=False, pool=None, timeout=None, fn=None, kwargs_json=None, where="BUILD.py:1",
    )


def test_result_of_each_outcome() -> None:
    t = _target()
    assert test_result(t, Outcome(Status.RAN, Reason.NEW, "")) is TestResult.PASSED
    assert test_result(t, Outcome(Status.UP_TO_DATE, Reason.UP_TO_DATE, "")) is TestResult.CACHED
    assert test_result(t, Outcome(Status.RESTORED, Reason.RESTORED, "")) is TestResult.CACHED
    assert test_result(t, Outcome(Status.FAILED, Reason.FAILED, "")) is TestResult.FAILED
    assert test_result(t, Outcome(Status.FAILED, Reason.FAILED, "", extra={"timed_out": True})) is TestResult.TIMEOUT
    assert test_result(t, Outcome(Status.RAN, Reason.NEW, "", extra={"attempts": 2})) is TestResult.FLAKY
    assert test_result(t, Outcome(Status.SKIPPED, Reason.DEP_FAILED, "")) is None
    assert test_result(t, Outcome(Status.UP_TO_DATE, Reason.TEST_NOT_RUN, "")) is None  # `build` passed it by
    assert test_result(_target(kind="genrule"), Outcome(Status.RAN, Reason.NEW, "")) is None


def test_log_paths_and_index(tmp_path: Path) -> None:
    assert log_rel_path(_target(label="//a/b:t", pkg="a/b")) == "testlogs/a/b/t.log"
    assert log_rel_path(_target(label="//:t", pkg="")) == "testlogs/t.log"
    assert other_log_rel_path(_target(label="//a/b:t", pkg="a/b")) == "testlogs/a#/b#/t.log"
    assert other_log_rel_path(_target(label="//:t", pkg="")) == "testlogs/#/t.log"
    # A package directory named a# (discovery takes it): its logs must not be where //a:b's
    # go when //a/b.log's are in their way (one test's log was shown as another's).
    assert log_rel_path(_target(label="//a#:b", pkg="a#")) == "testlogs/a##/b.log"
    assert other_log_rel_path(_target(label="//a:b", pkg="a")) == "testlogs/a#/b.log"
    assert other_log_rel_path(_target(label="//a#:b", pkg="a#")) == "testlogs/a###/b.log"
    warnings: list[str] = []
    logs = TestLogs(str(tmp_path), warnings.append)
    t = _target()
    logs.write(t, b"out\n", b"err\n", "key1")
    assert logs.read(t) == b"out\nerr\n"
    assert logs.holds(t, "key1") and not logs.holds(t, "key2")
    logs.save()
    again = TestLogs(str(tmp_path), warnings.append)
    assert again.holds(t, "key1")
    again.write(t, b"boom\n", b"", None)  # a failure: the log no longer holds a passing run
    assert not again.holds(t, "key1")
    (tmp_path / "testlogs-index").write_text('{"v": 99}')
    assert TestLogs(str(tmp_path), warnings.append)._index == {}
    assert any("format version" in w for w in warnings)
    warnings.clear()  # (the right version, its logs of another shape: damaged, not another version)
    (tmp_path / "testlogs-index").write_text('{"v": 1, "logs": [1, 2]}')
    assert TestLogs(str(tmp_path), warnings.append)._index == {}
    assert warnings == ["the test log index is damaged (its logs are not a map of labels to keys); discarding it"]


# -- end to end ----------------------------------------------------------------------------
def test_a_log_moved_by_another_in_its_way_is_found_there_by_the_next_build(tmp_path: Path) -> None:
    warnings: list[str] = []
    logs = TestLogs(str(tmp_path), warnings.append)
    t = _target(label="//a:b", pkg="a")
    (tmp_path / "testlogs" / "a" / "b.log").mkdir(parents=True)  # the package //a/b.log's logs
    logs.write(t, b"passed\n", b"", "key1")
    assert logs.path(t) == str(tmp_path / "testlogs" / "a#" / "b.log") and not warnings
    assert logs.output(t) == b"passed\n"
    logs.save()
    again = TestLogs(str(tmp_path), warnings.append)
    assert again.holds(t, "key1") and again.output(t) == b"passed\n"  # a cached pass keeps it, unreplayed
    assert again.path(t) == logs.path(t)


def test_passing_test_runs_once_then_is_cached(workspace: Workspace, tmp_path: Path) -> None:
    counter = _counting_test(workspace, tmp_path)
    r1 = workspace.build("//t:unit", command="test")
    assert r1.rc == 0, r1.output
    assert "PASSED" in r1.stdout and "(cached)" not in r1.stdout
    assert r1.by_label["//t:unit"]["test"] == "passed"
    r2 = workspace.build("//t:unit", command="test")
    assert r2.rc == 0, r2.output
    assert "//t:unit" in r2.stdout and "PASSED (cached)" in r2.stdout
    assert r2.by_label["//t:unit"]["test"] == "cached"
    assert _runs(counter) == 1
    log = workspace.read(".buildtool/testlogs/t/unit.log")
    assert "unit-output-marker" in log


def test_changing_an_input_reruns_the_test(workspace: Workspace, tmp_path: Path) -> None:
    counter = _counting_test(workspace, tmp_path)
    assert workspace.build("//t:unit", command="test").rc == 0
    workspace.write("t/input.txt", "v2\n")
    r = workspace.build("//t:unit", command="test")
    assert r.rc == 0, r.output
    assert r.by_label["//t:unit"]["test"] == "passed"
    assert _runs(counter) == 2
    assert "v2" in workspace.read(".buildtool/testlogs/t/unit.log")


def test_no_cache_tests_reruns_a_passing_test(workspace: Workspace, tmp_path: Path) -> None:
    counter = _counting_test(workspace, tmp_path)
    assert workspace.build("//t:unit", command="test").rc == 0
    r = workspace.build("//t:unit", "--no-cache-tests", command="test")
    assert r.rc == 0, r.output
    assert r.by_label["//t:unit"]["status"] == "ran"
    assert r.by_label["//t:unit"]["reason_code"] == "no_cache_tests"
    assert _runs(counter) == 2


def test_failing_test_exits_1_shows_output_and_is_never_cached(workspace: Workspace, tmp_path: Path) -> None:
    counter = _counting_test(workspace, tmp_path, cmd_tail="echo failure-detail >&2; exit 3")
    r = workspace.build("//t:unit", command="test")
    assert r.rc == 1
    assert "FAILED" in r.stdout
    assert "unit-output-marker" in r.output and "failure-detail" in r.output
    assert r.by_label["//t:unit"]["test"] == "failed"
    log = workspace.read(".buildtool/testlogs/t/unit.log")
    assert "unit-output-marker" in log and "failure-detail" in log
    r2 = workspace.build("//t:unit", command="test")
    assert r2.rc == 1 and r2.by_label["//t:unit"]["status"] == "failed"
    assert _runs(counter) == 2


@pytest.mark.parametrize("started", ["shell", "direct"])
def test_a_tests_log_holds_stdout_and_stderr_in_the_order_written(workspace: Workspace, started: str) -> None:
    # One stream, as Bazel's test.log (and `2>&1`): a `set -x` trace or a traceback beside the
    # output that came before it.  "direct": a simple command started without the shell.
    workspace.write("t/t.py", "import sys\nfor s in (sys.stdout, sys.stderr, sys.stdout, sys.stderr):\n"
                              "    print(s.name, file=s, flush=True)\nsys.exit(1)\n")
    cmd = "python3 t.py" if started == "direct" else "python3 t.py; exit $?"
    workspace.build_file("t", f'test(name="unit", srcs=["t.py"], cmd="{cmd}")')
    r = workspace.build("//t:unit", "--junit", "junit.xml", command="test")
    assert r.rc == 1, r.output
    order = "<stdout>\n<stderr>\n<stdout>\n<stderr>\n"
    assert workspace.read(".buildtool/testlogs/t/unit.log") == order
    assert order in r.stdout  # the failure's output on the console, as in the log
    failure = ET.parse(workspace.root / "junit.xml").find(".//failure")
    assert failure is not None and order in (failure.text or "")


@pytest.mark.parametrize("what", ["file", "link"])
def test_a_testlogs_that_is_no_directory_is_replaced_once(workspace: Workspace, tmp_path: Path, what: str) -> None:
    # A file there: every test of every build warned "could not write the test log ... (File
    # exists)"; a link to a directory elsewhere: the logs were written there.
    workspace.build_file("t", 'test(name="unit", cmd="echo hello")')
    assert workspace.build("//t:unit", command="test").rc == 0
    logs = workspace.root / ".buildtool" / "testlogs"
    shutil.rmtree(logs)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if what == "file":
        logs.write_text("junk\n")
    else:
        logs.symlink_to(elsewhere)
    r = workspace.build("//t:unit", "--no-cache-tests", command="test")
    assert r.rc == 0 and "not a directory; removed it" in r.stderr and "could not write" not in r.stderr, r.output
    assert workspace.read(".buildtool/testlogs/t/unit.log") == "hello\n" and list(elsewhere.iterdir()) == []
    r = workspace.build("//t:unit", "--no-cache-tests", command="test")
    assert r.rc == 0 and "warning" not in r.stderr, r.output


def test_the_log_of_a_test_with_a_long_name_is_written(workspace: Workspace, tmp_path: Path) -> None:
    """A name whose log fits in NAME_MAX (255 bytes) but whose temp file
    ``<name>.log.tmp.<pid>.<thread>`` would not: the temp file gets a shorter name."""
    name = "F" * 240
    workspace.build_file("p", f'test(name="{name}", cmd="echo long-output-marker; exit 1")')
    junit = tmp_path / "junit.xml"
    rc, out, err = workspace.run("test", "//p/...", "--junit", str(junit))
    assert rc == 1, out + err
    log = workspace.root / ".buildtool" / "testlogs" / "p" / f"{name}.log"
    assert log.read_text() == "long-output-marker\n"
    assert f"log: .buildtool/testlogs/p/{name}.log" in out and "could not write" not in err, out + err
    assert sorted(p.name for p in log.parent.iterdir()) == [log.name]  # no temp file left
    assert "long-output-marker" in junit.read_text()


@pytest.mark.parametrize("first", ["//a:b", "//a/b.log:t"])
def test_two_tests_whose_logs_claim_one_path_both_keep_theirs(workspace: Workspace, tmp_path: Path, first: str) -> None:
    """//a:b's log is the file testlogs/a/b.log, the package //a/b.log's the directory of that
    name: whichever comes second is written at testlogs/a#/... instead, the summary names
    where each is, and the JUnit report has each test's own output."""
    workspace.build_file("a", 'test(name="b", cmd="echo I am a:b; exit 1")')
    workspace.build_file("a/b.log", 'test(name="t", cmd="echo I am b.log:t; exit 1")')
    assert workspace.run("test", first)[0] == 1  # it takes testlogs/a/b.log
    junit = tmp_path / "junit.xml"
    for _ in range(2):  # (the second time, the moved log is where the first put it)
        rc, out, err = workspace.run("test", "//a/...", "-k", "--junit", str(junit))
        assert rc == 1 and "could not write" not in err, out + err
        paths = dict(re.findall(r"^(//\S+)\s+FAILED .*  log: (\S+)$", out, re.M))
        assert set(paths) == {"//a:b", "//a/b.log:t"}, out
        assert (workspace.root / paths["//a:b"]).read_text() == "I am a:b\n"
        assert (workspace.root / paths["//a/b.log:t"]).read_text() == "I am b.log:t\n"
        moved = {".buildtool/testlogs/a#/b.log", ".buildtool/testlogs/a#/b.log#/t.log"}
        assert len(moved & set(paths.values())) == 1, paths
        cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
        assert (cases["//a:b"].findtext("failure") or "") == "I am a:b\n"
        assert (cases["//a/b.log:t"].findtext("failure") or "") == "I am b.log:t\n"


def test_a_log_that_cannot_be_written_is_said_for_each_test(workspace: Workspace, tmp_path: Path) -> None:
    """Names of 253 characters: <name>.log is longer than a file name may be.  Each test
    gets its warning, the summary says its log could not be written (it names no file
    that is not there), and the JUnit report still has its output."""
    n1, n2 = "x" * 253, "y" * 253
    workspace.build_file("p", f'test(name="{n1}", cmd="echo out-1; exit 1")\n'
                              f'test(name="{n2}", cmd="echo out-2; exit 1")')
    junit = tmp_path / "junit.xml"
    rc, out, err = workspace.run("test", "//p/...", "-k", "--junit", str(junit))
    assert rc == 1, out + err
    assert err.count("could not write the test log") == 2, err
    assert out.count("log: could not be written (File name too long)") == 2, out
    assert ".log\n" not in out and "log: .buildtool" not in out, out
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert (cases[f"//p:{n1}"].findtext("failure") or "") == "out-1\n"
    assert (cases[f"//p:{n2}"].findtext("failure") or "") == "out-2\n"
    # --test-output=none keeps a failure's output off the console only when its log has it.
    rc, out, err = workspace.run("test", "//p/...", "-k", "--test-output=none")
    assert rc == 1 and "out-1" in out + err and "output in" not in out + err, out + err


def test_a_test_that_failed_with_a_key_is_not_served_a_cached_pass_of_it(
    workspace: Workspace, tmp_path: Path
) -> None:
    """A pass is cached; then the same test fails with the same key (a nightly
    --no-cache-tests run, a non-hermetic test): the next plain run must run it again, not
    report the earlier pass from the record or the cache.  It stays red until it passes."""
    flag = tmp_path / "broken"
    counter = _counting_test(workspace, tmp_path, cmd_tail=f"test ! -e {flag}")
    assert workspace.build("//t:unit", command="test").rc == 0
    flag.write_text("")
    assert workspace.build("//t:unit", "--no-cache-tests", command="test").rc == 1
    r = workspace.build("//t:unit", command="test")
    assert r.rc == 1, r.output
    assert r.by_label["//t:unit"]["status"] == "failed" and "(cached)" not in r.stdout
    assert _runs(counter) == 3
    rc, out, _ = workspace.run("test", "-n", "//t:unit")
    assert rc == 0 and "failed last time with this action key" in out, out
    flag.unlink()
    r = workspace.build("//t:unit", command="test")
    assert r.rc == 0 and r.by_label["//t:unit"]["reason_code"] == "failed_before", r.output
    r = workspace.build("//t:unit", command="test")
    assert r.rc == 0 and r.by_label["//t:unit"]["test"] == "cached", r.output
    assert _runs(counter) == 4


def test_a_failure_in_one_checkout_is_not_answered_by_its_pass_in_another(
    make_workspace: Callable[..., Workspace], tmp_path: Path
) -> None:
    """CI's set-up: fresh checkouts sharing BUILDTOOL_CACHE_DIR, .buildtool/ not kept.  A
    nightly --no-cache-tests run fails with the key a pass was cached under: the next
    checkout must run the test (it got "PASSED (cached)" and went green)."""
    cache = tmp_path / "shared-cache"
    flag = tmp_path / "broken"
    runs = [make_workspace(f"run{i}", cache=cache) for i in range(3)]
    for ws in runs:
        _counting_test(ws, tmp_path, cmd_tail=f"test ! -e {flag}")
    assert runs[0].build("//t:unit", command="test").rc == 0
    flag.write_text("")
    assert runs[1].build("//t:unit", "--no-cache-tests", command="test").rc == 1
    r = runs[2].build("//t:unit", command="test")
    assert r.rc == 1 and r.status("//t:unit") == "failed", r.output


def test_a_tighter_timeout_reruns_a_cached_pass(workspace: Workspace) -> None:
    workspace.build_file("", 'test(name="t", cmd="sleep 1", timeout=30)')
    assert workspace.build("//:t", command="test").rc == 0
    workspace.build_file("", 'test(name="t", cmd="sleep 1", timeout=0.3)')
    r = workspace.build("//:t", command="test")
    assert r.rc == 1 and r.by_label["//:t"]["test"] == "timeout", r.output


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_timeout_of_years_is_a_timeout_that_never_fires(workspace: Workspace, jobs: str) -> None:
    """poll() takes at most 2**31-1 ms (~24.8 days): a longer timeout was an internal
    error that left the test running after buildtool exited."""
    workspace.build_file("", 'test(name="t", cmd="sleep 0.3; echo ok", timeout=10**20)\n'
                         'test(name="u", cmd="sleep 0.3; echo ok", timeout=3000000)\n'
                         'test(name="v", cmd="sleep 0.3; echo v", timeout=1e306)')
    r = workspace.build("//...", "-j", jobs, command="test")
    assert r.rc == 0, r.output
    assert [r.by_label[t]["test"] for t in ("//:t", "//:u", "//:v")] == ["passed"] * 3, r.output


def test_test_output_modes(workspace: Workspace, tmp_path: Path) -> None:
    workspace.build_file(
        "",
        """
        test(name="good", cmd="echo good-$$((20+1))")
        test(name="bad", cmd="echo bad-$$((40+2)); exit 1")
        """,
    )
    rc, out, err = workspace.run("test", "-k")
    assert rc == 1
    assert "bad-42" in out + err and "good-21" not in out + err  # errors (default)
    rc, out, err = workspace.run("test", "-k", "--test-output=none")
    assert rc == 1 and "bad-42" not in out + err
    assert ".buildtool/testlogs/bad.log" in out + err
    rc, out, err = workspace.run("test", "-k", "--test-output=all")
    assert rc == 1 and "good-21" in out + err and "bad-42" in out + err


def test_cached_result_keeps_the_log_of_the_run_that_passed(workspace: Workspace, tmp_path: Path) -> None:
    workspace.write("t/input.txt", "good\n")
    workspace.build_file("t", 'test(name="unit", srcs=["input.txt"], cmd="cat input.txt; grep -q good input.txt")')
    assert workspace.build("//t:unit", command="test").rc == 0
    workspace.write("t/input.txt", "bad\n")
    assert workspace.build("//t:unit", command="test").rc == 1
    assert workspace.read(".buildtool/testlogs/t/unit.log") == "bad\n"
    workspace.write("t/input.txt", "good\n")
    r = workspace.build("//t:unit", command="test")
    assert r.rc == 0 and r.by_label["//t:unit"]["test"] == "cached", r.output
    assert workspace.read(".buildtool/testlogs/t/unit.log") == "good\n"  # replayed from the cache


@pytest.mark.parametrize("damage", ["deleted", "corrupt"])
def test_a_cached_pass_whose_log_the_cache_lost_runs_again(workspace: Workspace, tmp_path: Path, damage: str) -> None:
    """A fresh checkout sharing the cache, whose blob of the test's stdout is gone or
    damaged: the log is the test's result, so the test runs again (it got an empty log
    and "PASSED (cached)" for good); a log lost after the fact gets a note, not nothing."""
    workspace.build_file("", 'test(name="big", cmd="python3 -c \'print(\\"y\\" * 10000)\'; echo END")')
    assert workspace.build("//:big", command="test").rc == 0
    blobs = [p for p in (workspace.cache / "v2" / "cas").rglob("*") if p.is_file()]
    assert blobs, "the 10 kB stdout should be a blob"
    for b in blobs:
        if damage == "deleted":
            b.unlink()
        else:
            b.chmod(0o644)
            b.write_bytes(b"not the log")
    fresh = workspace.copy_to(tmp_path / "fresh")  # same cache, no state
    r = fresh.build("//:big", command="test")
    assert r.rc == 0 and r.by_label["//:big"]["test"] != "cached" and r.status("//:big") == "ran", r.output
    assert fresh.read(".buildtool/testlogs/big.log").endswith("y\nEND\n")
    (fresh.root / ".buildtool" / "testlogs" / "big.log").unlink()  # the log lost on this side, then the cache's
    for b in (workspace.cache / "v2" / "cas").rglob("*"):
        if b.is_file():
            b.unlink()
    r = fresh.build("//:big", command="test")
    assert r.rc == 0, r.output
    assert "no longer in the cache" in fresh.read(".buildtool/testlogs/big.log")


def test_the_test_timeout_key_is_the_timeout_of_a_test_that_gives_none(workspace: Workspace) -> None:
    """Bazel gives every test a timeout (300 s for the default size); a hung test here waited
    for the CI job's limit.  `test_timeout` (buildtool.toml, BUILDTOOL_TEST_TIMEOUT) is the
    timeout of a test without timeout=; a test's own wins; it is in the key (a tighter one may
    fail a cached pass), so a new default runs those tests again."""
    workspace.build_file("", 'test(name="hangs", cmd="sleep 30")\n'
                             'test(name="own", cmd="sleep 1; echo ok", timeout=20)\n'
                             'test(name="quick", cmd="true")\n')
    workspace.write("buildtool.toml", "test_timeout = 0.5\n")
    r = workspace.build(command="test")
    assert r.rc == 1 and r.by_label["//:hangs"]["test"] == "timeout", r.output
    assert "TIMEOUT after 0.5s" in r.output and r.by_label["//:hangs"]["duration_s"] < 20, r.output
    assert r.by_label["//:own"]["test"] == "passed" and r.by_label["//:quick"]["test"] == "passed", r.output
    r = workspace.build("//:quick", "//:own", command="test", env_extra={"BUILDTOOL_TEST_TIMEOUT": "2"})
    assert r.by_label["//:quick"]["test"] == "passed" and r.by_label["//:own"]["test"] == "cached", r.output
    for bad, said in (("test_timeout = 0\n", "buildtool.toml:1: test_timeout must be a positive number"),
                      ('test_timeout = "5m"\n', "test_timeout must be a positive number of seconds (got '5m')")):
        workspace.write("buildtool.toml", bad)
        rc, _, err = workspace.run("test")
        assert rc == 2 and said in err, err
    workspace.write("buildtool.toml", "")
    r = workspace.build("//:quick", command="test", env_extra={"BUILDTOOL_TEST_TIMEOUT": "inf"})  # (never, as timeout=)
    assert r.rc == 0 and r.by_label["//:quick"]["test"] == "passed", r.output
    rc, _, err = workspace.run("test", env_extra={"BUILDTOOL_TEST_TIMEOUT": "soon"})
    assert rc == 2 and "BUILDTOOL_TEST_TIMEOUT: test_timeout must be a positive number" in err, err


def test_timeout_reports_timeout_and_exits_1(workspace: Workspace) -> None:
    workspace.build_file("", 'test(name="slow", cmd="echo started; sleep 30", timeout=0.5)')
    r = workspace.build("//:slow", command="test")
    assert r.rc == 1
    assert "TIMEOUT" in r.stdout
    assert r.by_label["//:slow"]["test"] == "timeout"
    assert r.by_label["//:slow"]["duration_s"] < 20


def test_a_timed_out_tests_processes_get_their_grace_period(workspace: Workspace, tmp_path: Path) -> None:
    """SIGTERM, then SIGKILL after the grace period (Bazel's order): a child that cleans up
    on SIGTERM was SIGKILLed at once when its shell, the group's leader, died."""
    flag = tmp_path / "cleaned"
    workspace.write("grace.py", (
        "import os, signal, sys, time\n"
        "def done(*_):\n    time.sleep(0.3)\n    open(sys.argv[1], 'w').write('yes')\n    os._exit(1)\n"
        "signal.signal(signal.SIGTERM, done)\nopen(sys.argv[1] + '.ready', 'w').close()\ntime.sleep(30)\n"
    ))
    # (timeout 3: python3 has its handler by then, on a busy machine too)
    workspace.build_file("", f'test(name="t", srcs=["grace.py"], timeout=3, cmd="python3 grace.py {flag} & wait")')
    r = workspace.build("//:t", command="test")
    assert r.rc == 1 and "TIMEOUT" in r.stdout, r.output
    assert (tmp_path / "cleaned.ready").exists()
    assert flag.read_text() == "yes"


@pytest.mark.parametrize("mode", ["errors", "none"])
def test_a_console_pool_tests_output_is_on_the_terminal_and_no_empty_log_is_named(
    workspace: Workspace, mode: str
) -> None:
    workspace.build_file("", 'test(name="c", pool="console", cmd="echo console-says; exit 3")')
    r = workspace.build("//:c", f"--test-output={mode}", command="test")
    assert r.rc == 1 and r.by_label["//:c"]["test"] == "failed", r.output
    assert "console-says" in r.stdout  # (buildtool's own stdout: the terminal)
    assert "testlogs" not in r.output  # its log holds nothing
    assert re.search(r"//:c +FAILED in [0-9.]+s  \(output on the terminal: console pool\)", r.stdout), r.stdout


def test_flaky_test_that_passes_on_a_rerun_exits_0_with_a_warning(workspace: Workspace, tmp_path: Path) -> None:
    counter = tmp_path / "attempts.txt"
    workspace.build_file(
        "",
        f"""
        test(name="wobbly", flaky=2, env={{"COUNTER": "{counter}"}},
             cmd="echo x >> $$COUNTER; n=$$(wc -l < $$COUNTER); echo attempt $$n; test $$n -ge 2")
        """,
    )
    r = workspace.build("//:wobbly", command="test")
    assert r.rc == 0, r.output
    assert "FLAKY" in r.stdout
    assert "warning" in r.stderr and "FLAKY" in r.stderr
    assert r.by_label["//:wobbly"]["test"] == "flaky"
    assert _runs(counter) == 2
    assert "attempt 2" in workspace.read(".buildtool/testlogs/wobbly.log")
    assert "attempt 1" in workspace.read(".buildtool/testlogs/wobbly#attempt-1.log")
    assert r.by_label["//:wobbly"]["reason_code"] == "new", r.by_label["//:wobbly"]  # why it ran, not the rerun's
    # The failed attempt's output is shown (it was only in its attempt log), not with --test-output=none.
    assert "==== //:wobbly (FLAKY: attempt 1 of 2 failed: exited with status 1) output ====\nattempt 1\n" in r.stdout
    assert r.stdout.count("attempt 1\n") == 1 and "attempt 2\n" not in r.stdout, r.stdout
    counter.unlink()
    r = workspace.build("//:wobbly", "--no-cache-tests", "--test-output", "none", command="test")
    assert r.rc == 0 and "FLAKY" in r.stdout and "attempt 1\n" not in r.stdout, r.stdout


def test_the_attempt_logs_of_a_flaky_test_go_when_it_runs_again(workspace: Workspace, tmp_path: Path) -> None:
    """Each test that ran listed its package's log directory for earlier attempts' logs (a
    package of 20,000 tests: quadratic); listed once a build now, both tests' logs still go."""
    workspace.build_file("", "".join(
        f'test(name="{n}", flaky=1, env={{"C": "{tmp_path / n}"}}, cmd="echo x >> $$C; test $$(wc -l < $$C) -ge 2")\n'
        for n in ("a", "b")))
    logs = workspace.root / ".buildtool" / "testlogs"
    r = workspace.build(command="test")
    assert r.rc == 0 and sorted(p.name for p in logs.glob("*#attempt-*")) == ["a#attempt-1.log", "b#attempt-1.log"]
    r = workspace.build("--no-cache-tests", command="test")  # (both pass at once now)
    assert r.rc == 0 and r.with_status("ran") == {"//:a", "//:b"}, r.output
    assert not list(logs.glob("*#attempt-*")), sorted(p.name for p in logs.iterdir())


def test_a_flaky_test_s_reported_time_covers_every_attempt(workspace: Workspace, tmp_path: Path) -> None:
    """A flaky test whose failed first attempt took 0.6 s and whose pass took a few ms: the
    summary line, --events and JUnit say the time it cost this build, all attempts (as
    Bazel's flaky test time does), not "FLAKY in 0.01s" for a test that held a lane 0.6 s."""
    counter = tmp_path / "attempts.txt"
    workspace.build_file(
        "",
        f"""
        test(name="wobbly", flaky=1, env={{"C": "{counter}"}},
             cmd="echo x >> $$C; test $$(wc -l < $$C) -ge 2 || {{ sleep 0.6; exit 1; }}")
        """,
    )
    junit = tmp_path / "j.xml"
    r = workspace.build("//:wobbly", "--junit", str(junit), command="test")
    assert r.rc == 0 and r.by_label["//:wobbly"]["test"] == "flaky" and _runs(counter) == 2, r.output
    assert r.by_label["//:wobbly"]["duration_s"] >= 0.6, r.by_label["//:wobbly"]
    m = re.search(r"//:wobbly +FLAKY in ([0-9.]+)s", r.stdout)
    assert m is not None and float(m.group(1)) >= 0.6, r.stdout
    case = ET.parse(junit).getroot().find("testsuite/testcase")
    assert case is not None and float(case.get("time", "0")) >= 0.6, junit.read_text()


def test_flaky_test_that_always_fails_runs_n_plus_1_times(workspace: Workspace, tmp_path: Path) -> None:
    counter = tmp_path / "attempts.txt"
    workspace.build_file("", f'test(name="broken", flaky=2, env={{"C": "{counter}"}}, cmd="echo x >> $$C; exit 1")')
    r = workspace.build("//:broken", command="test")
    assert r.rc == 1
    assert r.by_label["//:broken"]["test"] == "failed"
    assert _runs(counter) == 3
    # said on the console and in the events, not only in the #attempt-N.log files
    assert "exited with status 1; failed all 3 attempts (flaky=2)" in r.output, r.output
    assert "failed all 3 attempts" in r.by_label["//:broken"]["reason"]


def test_a_flaky_test_whose_input_cannot_be_read_is_not_retried(workspace: Workspace) -> None:
    """flaky=N reruns a test that ran and failed.  One whose command never started (an
    input that cannot be read: here a source replaced by a directory during the build)
    fails the same way every time: it was "retried", said "failed all 3 attempts
    (flaky=2)" as if the test had run and failed three times, and left attempt logs of
    attempts that never ran."""
    workspace.write("b.txt", "b\n")
    workspace.build_file("", 'genrule(name="a", outs=["a.out"], cmd="rm b.txt && mkdir b.txt && echo a > $@")\n'
                             'test(name="t", srcs=["b.txt", ":a"], flaky=2, cmd="cat b.txt")\n')
    r = workspace.build("//:t", command="test")
    assert r.rc == 1 and r.by_label["//:t"]["test"] == "failed", r.output
    reason = r.by_label["//:t"]["reason"]
    assert reason.startswith("cannot read input") and reason.endswith("not a regular file (a directory)"), reason
    assert "attempts" not in r.output, r.output
    assert not list((workspace.root / ".buildtool" / "testlogs").glob("t#attempt-*.log"))


def test_a_flaky_test_gets_no_further_attempt_once_a_failure_stops_the_build(
    workspace: Workspace, tmp_path: Path
) -> None:
    """Without -k the first build failure starts no new work; a flaky test's next attempt is
    new work, yet all of them ran.  With -k they do."""
    counter = tmp_path / "attempts.txt"
    workspace.build_file("", 'genrule(name="broken", outs=["x"], cmd="exit 1")\n'
                             'test(name="a_needs", srcs=[":broken"], cmd="true")\n'
                             f'test(name="b_flaky", flaky=3, env={{"C": "{counter}"}}, '
                             'cmd="echo x >> $$C; sleep 0.5; exit 1")')
    r = workspace.build("-j2", command="test")
    assert r.rc == 1 and r.by_label["//:broken"]["status"] == "failed", r.output
    assert r.by_label["//:b_flaky"]["test"] == "failed" and _runs(counter) == 1, r.output
    said = "not retried (flaky=3): the build stopped after a failure"  # (why one attempt of flaky=3)
    assert said in r.by_label["//:b_flaky"]["reason"] and said in r.stdout, r.output
    counter.unlink()
    r = workspace.build("-j2", "-k", command="test")
    assert r.rc == 1 and _runs(counter) == 4 and "not retried" not in r.output, r.output


def test_a_failing_test_stops_no_other_test_a_build_failure_does(workspace: Workspace) -> None:
    """As Bazel: a test's failure is its result, not a build failure; without -k one red test
    left the others NOT RUN (a developer saw one failure and no other result).  A build
    failure still stops the rest (-k goes on)."""
    workspace.build_file("", 'test(name="a_fails", cmd="exit 1")\n'
                             + "".join(f'test(name="t{i}", cmd="sleep 0.2; echo {i}")\n' for i in range(4)))
    r = workspace.build("-j1", command="test")
    assert r.rc == 1 and {r.by_label[f"//:t{i}"]["test"] for i in range(4)} == {"passed"}, r.output
    assert "Tests: 5 (4 passed, 1 failed); 5 executed" in r.stdout, r.stdout
    # nor does one that could not start (a test before it deleted its input)
    workspace.write("x.txt", "x\n")
    workspace.build_file("", 'test(name="a_del", cmd="rm x.txt")\n'
                             'test(name="b_reads", srcs=["x.txt"], cmd="cat x.txt")\n'
                             + "".join(f'test(name="t{i}", cmd="sleep 0.2; echo {i}c")\n' for i in range(2)))
    r = workspace.build("-j1", command="test")
    assert r.rc == 1 and r.by_label["//:b_reads"]["status"] == "failed", r.output
    assert {r.by_label[f"//:t{i}"]["test"] for i in range(2)} == {"passed"}, r.output
    workspace.build_file("", 'genrule(name="broken", outs=["x"], cmd="exit 1")\n'
                             'test(name="a_needs", srcs=[":broken"], cmd="true")\n'
                             + "".join(f'test(name="t{i}", cmd="sleep 0.2; echo {i}b")\n' for i in range(4)))
    r = workspace.build("-j1", command="test")
    assert r.rc == 1 and "not started: the build stopped after a failure" in r.stdout, r.output


def test_a_pattern_below_no_package_is_bad_input_not_no_tests(workspace: Workspace) -> None:
    """`test //typo/...` is exit 2 like `build //typo/...`; exit 4 is for packages that
    exist and hold no test."""
    workspace.build_file("", 'genrule(name="g", outs=["g.out"], cmd="echo > $@")')
    for command in ("test", "build"):
        rc, _, err = workspace.run(command, "//nothere/...")
        assert rc == 2 and "matches no package" in err, (command, rc, err)
    rc, _, err = workspace.run("test", "//...")
    assert rc == 4 and "no test targets" in err, (rc, err)


def test_no_test_matched_is_exit_4_with_the_reports_ci_uploads(
    make_workspace: Callable[..., Workspace], tmp_path: Path
) -> None:
    """Exit 4 however it is reached (no package at all, only manual tests, a pattern of
    non-tests beside one of tests), and the JUnit/events files written all the same: a
    CI step that uploads them `if: always()` found none."""
    empty = make_workspace("empty")
    rc, _, err = empty.run("test", "//...")
    assert rc == 4 and "no test targets" in err, (rc, err)  # (it was "matches no package", exit 2)
    ws = make_workspace("manual")
    ws.build_file("p", """
        genrule(name="g", outs=["g.out"], cmd="echo > $@")
        test(name="m", cmd="true", manual=True)
    """)
    ws.build_file("q", 'test(name="t", cmd="true")')
    junit, events = tmp_path / "out" / "j.xml", tmp_path / "out" / "e.jsonl"
    rc, _, err = ws.run("test", "//p/...", "--junit", str(junit), "--events", str(events))
    assert rc == 4 and "no test targets" in err, (rc, err)
    assert 'tests="0"' in junit.read_text() and events.exists()
    r = ws.build("//p/...", "//q/...", command="test")  # //p/... holds no test: //q's run
    assert r.rc == 0 and r.status("//q:t") == "ran", r.output


def test_build_does_not_run_a_test_reached_through_a_dependency(workspace: Workspace, tmp_path: Path) -> None:
    """`build` never runs tests, also one a group depends on; it builds what the test needs."""
    counter = tmp_path / "runs.txt"
    workspace.build_file("", f'genrule(name="d", outs=["d.out"], cmd="echo d > $@")\n'
                             f'test(name="t", deps=[":d"], env={{"COUNTER": "{counter}"}}, '
                             f'cmd="echo run >> $$COUNTER; false")\n'
                             f'group(name="g", deps=[":t"])')
    r = workspace.build("//:g")
    assert r.rc == 0, r.output
    assert r.by_label["//:t"]["reason_code"] == "test_not_run"
    assert workspace.read("d.out") == "d\n" and _runs(counter) == 0
    workspace.build_file("", f'genrule(name="d", outs=["d.out"], cmd="echo d2 > $@")\n'
                             f'test(name="t", deps=[":d"], env={{"COUNTER": "{counter}"}}, '
                             f'cmd="echo run >> $$COUNTER; false")\n'
                             f'group(name="g", deps=[":t"])')
    rc, out, _ = workspace.run("explain", "//:g")
    assert rc == 0 and "//:t" in out and "`build` builds what it needs" in out, out
    rc, out, _ = workspace.run("explain", "--test", "//:t")  # what `buildtool test` would do
    assert rc == 0 and "//:t  WOULD RUN: dependency //:d would run" in out, out
    rc, out, _ = workspace.run("build", "-n", "//:g")  # what would run: //:d, not the test
    assert rc == 0 and "//:d:" in out and "//:t" not in out and "dry run: 1 of 3" in out, out
    assert workspace.build("//:t", command="test").rc == 1 and _runs(counter) == 1


def test_bad_flaky_and_always_attributes_exit_2(workspace: Workspace) -> None:
    workspace.build_file("", 'test(name="t", cmd="true", flaky="twice")')
    rc, _, err = workspace.run("test")
    assert rc == 2 and "BUILD.py:1" in err and "flaky" in err
    workspace.build_file("", 'genrule(name="g", cmd="true", always=1)')
    rc, _, err = workspace.run("build", "//:g")
    assert rc == 2 and "BUILD.py:1" in err and "always" in err
    workspace.build_file("", 'genrule(name="g", cmd="true", flaky=1)')
    rc, _, err = workspace.run("build", "//:g")
    assert rc == 2 and "flaky" in err
    workspace.build_file("", 'test(name="t", cmd="true", timeout=float("nan"))')
    rc, _, err = workspace.run("test")
    assert rc == 2 and "BUILD.py:1" in err and "timeout" in err


def test_always_target_runs_every_build_and_its_dependent_uses_early_cutoff(
    workspace: Workspace, tmp_path: Path
) -> None:
    counter = tmp_path / "always.txt"
    workspace.build_file(
        "",
        f"""
        genrule(name="stamp", outs=["stamp.txt"], always=True, env={{"C": "{counter}"}},
                cmd="echo x >> $$C; echo same > $@")
        genrule(name="user", srcs=[":stamp"], outs=["user.txt"], cmd="cat $< > $@", manual=True)
        genrule(name="plain", outs=["plain.txt"], cmd="echo p > $@")
        """,
    )
    r1 = workspace.build("//:user")
    assert r1.rc == 0, r1.output
    assert r1.ran == {"//:stamp", "//:user"}
    for _ in range(2):
        r = workspace.build("//:user")
        assert r.rc == 0, r.output
        assert r.status("//:stamp") == "ran" and r.by_label["//:stamp"]["reason_code"] == "always"
        assert r.status("//:user") == "up_to_date"
    rc, out, err = workspace.run("build", "//:user")  # no events: the no-op fast path must not skip it
    assert rc == 0, out + err
    assert _runs(counter) == 4
    r = workspace.build("//...")  # always implies manual
    assert set(r.by_label) == {"//:plain"}, r.output


def test_run_of_a_program_that_cannot_be_executed_is_127_and_says_why(workspace: Workspace) -> None:
    """As a shell: 127 for an output that is not executable (the docs' exit codes), and a
    script whose #! names a missing interpreter is said to be that, not 'No such file'."""
    workspace.build_file("", r"""
        genrule(name="plain", outs=["x.sh"], cmd="echo 'echo hi' > $@")
        genrule(name="badsh", outs=["y.sh"], cmd="printf '#!/nonexistent/sh\\necho hi\\n' > $@ && chmod +x $@")
        genrule(name="crlf", outs=["z.sh"], cmd="printf '#!/bin/sh\\r\\necho hi\\r\\n' > $@ && chmod +x $@")
    """)
    rc, out, err = workspace.run("run", "//:plain")
    assert rc == 127 and "its output x.sh is not an executable file" in err, (rc, out, err)
    rc, out, err = workspace.run("run", "//:badsh")
    assert rc == 127 and "its interpreter '/nonexistent/sh' (from its #! line) does not exist" in err, (rc, out, err)
    rc, out, err = workspace.run("run", "//:crlf")  # the kernel looks for "/bin/sh\r": said as such
    assert rc == 127 and "its interpreter '/bin/sh\\r' (from its #! line) does not exist" in err, (rc, out, err)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_run_hands_the_program_the_signal_dispositions_buildtool_started_with(
    workspace: Workspace, inherited: str,
) -> None:
    """``run`` execs the program as a shell would start it: SIGPIPE and SIGXFSZ (ignored
    by Python) back to default, SIGINT ignored only if buildtool was started so (the CLI
    itself stops on it while building)."""
    workspace.build_file("", 'genrule(name="show", cmd="grep SigIgn /proc/self/status")')
    how = signal.SIG_IGN if inherited == "ignored" else signal.SIG_DFL
    p = subprocess.run([BUILDTOOL, "run", "//:show"], cwd=workspace.root, capture_output=True, text=True,
                       env=_clean_env(workspace.cache, workspace.home), timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, how))  # type: ignore[arg-type]
    assert p.returncode == 0, p.stdout + p.stderr
    ignored = int(p.stdout.split()[-1], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (sig - 1)), (sig, p.stdout)
    assert bool(ignored & (1 << (signal.SIGINT - 1))) is (inherited == "ignored"), p.stdout


def test_run_of_a_target_with_nothing_to_build_writes_its_events_file(workspace: Workspace) -> None:
    """--events was ignored for a target with no outputs and no dependencies: an earlier
    build's file stayed, passing for this run's, and the path went unchecked."""
    workspace.build_file("", 'genrule(name="task", cmd="echo task-ran", always=True)\n'
                             'genrule(name="x", outs=["x"], cmd="echo > $@")\n')
    ev = workspace.root / "ev.jsonl"
    assert workspace.run("build", "//:x", "--events", str(ev))[0] == 0
    rc, out, err = workspace.run("run", "//:task", "--events", str(ev))
    assert rc == 0 and "task-ran" in out, out + err
    lines = [json.loads(line) for line in ev.read_text().splitlines()]
    assert [e.get("type") for e in lines] == ["header"], lines
    rc, out, err = workspace.run("run", "//:task", "--events", "BUILD.py")
    assert rc == 2 and "--events BUILD.py: that is a BUILD.py" in err and "task-ran" not in out, out + err


def test_run_passes_arguments_and_exit_code_through(workspace: Workspace) -> None:
    workspace.build_file(
        "tools",
        r"""
        genrule(name="prog", outs=["prog.sh"],
                cmd="printf '#!/bin/sh\\necho \"args:$$*\"; pwd; exit $$#\\n' > $@; chmod +x $@")
        genrule(name="task", cmd="echo task-ran", always=True)
        genrule(name="broken", outs=["b.sh"], cmd="exit 5")
        """,
    )
    rc, out, err = workspace.run("run", "//tools:prog", "--", "a", "b c", "-x")
    assert rc == 3, out + err
    assert "args:a b c -x" in out
    assert out.strip().splitlines()[-1] == str(workspace.root / "tools")
    rc, out, err = workspace.run("run", "//tools:task", "--", "extra-arg")
    assert rc == 0, out + err
    assert out.count("task-ran extra-arg") == 1  # run once: the command itself is not built first
    rc, out, err = workspace.run("run", "//tools:broken")
    assert rc == 1 and "FAILED" in out + err
    rc, out, err = workspace.run("run", "//tools/...")
    assert rc == 2 and "one target" in err
    rc, out, err = workspace.run("run")
    assert rc == 2 and "run needs one TARGET: buildtool run //pkg:target" in err, err
    # buildtool's options may follow TARGET; the program gets only what follows `--` (a
    # second `--` included) and the plain words right after TARGET.
    ev = workspace.root / "ev.jsonl"
    rc, out, err = workspace.run("run", "//tools:prog", "w", "-j", "2", "--events", str(ev), "--", "a", "--", "-j")
    assert rc == 4 and "args:w a -- -j" in out, out + err
    assert ev.exists()
    rc, out, err = workspace.run("run", "//tools:prog", "-j", "5000")
    assert rc == 2 and "-j must be from 1 to 4096" in err, err
    rc, out, err = workspace.run("run", "//tools:prog", "--cache-dir", "")
    assert rc == 2 and "--cache-dir must name a directory" in err, err
    rc, out, err = workspace.run("run", "//tools:prog", "--verbose")  # the program's flag, before `--`
    assert rc == 2 and "the program's own arguments go after '--'" in err, err
    rc, out, err = workspace.run("query", "--", "//tools:prog")  # other commands keep their `--`
    assert rc == 0 and out.split() == ["//tools:prog"], out + err


def test_a_result_restored_into_a_fresh_checkout_keeps_how_long_the_test_ran(
    workspace: Workspace, tmp_path: Path
) -> None:
    """A CI checkout restoring from the shared cache says how long the cached run took, and
    its record weighs the target by that (``plan``, critical path), not by the restore."""
    workspace.build_file("", 'test(name="slow", cmd="sleep 0.4")\n')
    r = workspace.build("//:slow", command="test")
    assert r.rc == 0 and r.ran == {"//:slow"}, r.output
    fresh = workspace.copy_to(tmp_path / "fresh")  # same cache, no state
    r = fresh.build("//:slow", command="test")
    assert r.rc == 0 and r.ran == set(), r.output
    line = next(ln for ln in r.stdout.splitlines() if "PASSED (cached)" in ln)
    assert float(line.split("ran in ")[1].rstrip("s)")) >= 0.4, line
    rc, out, _ = fresh.run("plan", "--test", "--json", "//:slow")
    assert rc == 0 and json.loads(out)["total_work_s"] >= 0.4, out


def test_a_flaky_test_reruns_for_real_not_from_a_pass_stored_meanwhile(
    make_workspace: Any, tmp_path: Path
) -> None:
    """Two CI jobs share a cache: job A's first attempt fails; meanwhile job B passes the
    same test (same key) and stores the pass.  A's rerun must run, not take B's pass."""
    mark, go = tmp_path / "a-started", tmp_path / "go"
    build = (f'test(name="racy", flaky=1, env={{"MARK": "{mark}", "GO": "{go}"}}, '
             'cmd="case $$PWD in *jobA*) touch $$MARK; while [ ! -e $$GO ]; do sleep 0.05; done; exit 1;; esac")\n')
    a = make_workspace("jobA")
    b = make_workspace("jobB", cache=a.cache)
    for ws in (a, b):
        ws.build_file("", build)
    env = _clean_env(a.cache, a.home)
    p = subprocess.Popen([BUILDTOOL, "test"], cwd=a.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 30
    while not mark.exists():
        assert time.monotonic() < deadline and p.poll() is None, "job A's test never started"
        time.sleep(0.05)
    r = b.build(command="test")
    assert r.rc == 0 and r.ran == {"//:racy"}, r.output  # B's pass is in the shared cache now
    go.touch()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "//:racy" in out and "FAILED" in out and "cached" not in out, out + err


def test_a_fresh_checkouts_cached_exclusive_test_does_not_drain_the_build(workspace: Workspace, tmp_path: Path) -> None:
    """With no build record (a fresh checkout sharing the cache), a cached exclusive test
    was looked up by a worker only when its turn to run alone came: every lane drained
    first.  It is settled from the cache while //:busy still runs."""
    workspace.build_file("", 'test(name="busy", srcs=["stamp.txt"], cmd="sleep 1")\n'
                             'test(name="ex", cmd="sleep 0.3", exclusive=True, priority=1)\n')
    workspace.write("stamp.txt", "1\n")
    assert workspace.build("-j", "2", command="test").rc == 0
    fresh = workspace.copy_to(tmp_path / "fresh")  # same cache, no state
    fresh.write("stamp.txt", "2\n")  # busy must run
    r = fresh.build("-j", "2", command="test")
    assert r.rc == 0 and r.by_label["//:ex"]["test"] == "cached", r.output
    assert r.by_label["//:ex"]["end"] < r.by_label["//:busy"]["end"], (r.by_label["//:ex"], r.by_label["//:busy"])


def test_a_fresh_checkout_s_cached_pass_behind_a_large_restore_is_reported_after_an_early_failure(
    workspace: Workspace, tmp_path: Path,
) -> None:
    """Without -k, a failure stops the build; a test whose pass is in the shared cache is
    still reported as a cached pass, also when its dependency's restore is too large to do
    inline (a cc_test's objects, depfile targets, likewise): it was NOT RUN, JUnit <skipped/>,
    when the failure came first."""
    workspace.build_file("", 'genrule(name="big", outs=["big.bin"], cmd="head -c 2000000 /dev/zero > $@")\n'
                             'test(name="uses_big", deps=[":big"], cmd="test -s big.bin && echo big-ok")\n'
                             'genrule(name="broken", outs=["b.txt"], cmd="exit 1", priority=-1)\n'
                             'test(name="needs_broken", deps=[":broken"], cmd="true")\n')
    assert workspace.build("//:uses_big", command="test").rc == 0
    fresh = workspace.copy_to(tmp_path / "fresh")  # same cache, no state
    fresh.path("big.bin").unlink()  # (a clone: no outputs)
    junit = tmp_path / "j.xml"
    r = fresh.build("-j", "1", "--junit", str(junit), command="test")
    assert r.rc == 1 and r.by_label["//:broken"]["status"] == "failed", r.output
    assert r.by_label["//:big"]["status"] == "restored" and r.by_label["//:uses_big"]["test"] == "cached", r.output
    assert fresh.path("big.bin").stat().st_size == 2_000_000
    assert "//:uses_big" in r.stdout and "PASSED (cached)" in r.stdout, r.stdout
    assert fresh.read(".buildtool/testlogs/uses_big.log") == "big-ok\n"  # (its log, from the cache's blobs)
    case = ET.parse(junit).getroot().find(".//testcase[@name='//:uses_big']")
    assert case is not None and list(case.iter("skipped")) == [] and list(case.iter("failure")) == [], \
        ET.tostring(case)


def test_a_waiting_exclusive_test_that_failed_here_is_not_taken_from_anothers_pass(
    workspace: Workspace, tmp_path: Path,
) -> None:
    """The inline lookup for a waiting target skipped the failed-before rule: another
    checkout's pass for the same key answered a test that had just failed here."""
    flag = tmp_path / "flag"
    workspace.build_file("", 'test(name="slow", cmd="sleep 1", priority=-5, always=True)\n'
                             f'test(name="ex", cmd="test ! -e {flag}", exclusive=True)\n')
    other = workspace.copy_to(tmp_path / "other")  # same cache
    flag.write_text("")
    assert workspace.build("//:ex", command="test").rc == 1
    flag.unlink()
    assert other.build("//:ex", command="test").rc == 0  # a pass for the key, in the shared cache
    flag.write_text("")
    r = workspace.build("-j", "2", "//:slow", "//:ex", command="test")
    assert r.rc == 1 and r.by_label["//:ex"]["test"] == "failed", r.output


def test_test_logs_are_written_through_the_state_dirs_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill -9 between a log's write and its rename left <name>.log.tmp.<pid>.<thread> in
    testlogs/ for good; through the state dir's tmp/ (which the next build empties) nothing
    is left beside the logs.  (The rename is watched, not replaced: the file is written.)"""
    import buildtool.atomic as atomic
    from buildtool.testing import _write_atomic

    renamed: list[str] = []
    real = atomic.os.replace

    def spy(src: str, dst: str) -> None:
        renamed.append(src)
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", spy)
    state = tmp_path / ".buildtool"
    log = state / "testlogs" / "pkg" / "t.log"
    _write_atomic(str(log), b"out\n", str(state))
    assert log.read_bytes() == b"out\n"
    assert len(renamed) == 1 and os.path.dirname(renamed[0]) == str(state / "tmp"), renamed
    assert os.listdir(log.parent) == ["t.log"]


@pytest.mark.parametrize(("make_data", "reads", "edited", "made"), [
    ("cp $< $@", "lib/data.txt", "broken\n", "broken\n"),  # a file made one level down
    ("wc -l < $< > $@", "lib/data.in", "no\n", "1\n"),  # a source two levels down, its output the same
])
def test_a_test_runs_again_when_a_file_its_dependency_reads_at_run_time_changes(
        workspace: Workspace, make_data: str, reads: str, edited: str, made: str) -> None:
    """A wrapper script whose own output does not change when the data it reads does: the
    test that runs it must not stay PASSED (cached) on the old data (a CI false green).
    A test's inputs are its dependencies' inputs too, at any depth, as Bazel's runfiles."""
    workspace.write("lib/data.in", "ok\n")
    workspace.build_file("lib", f'genrule(name="data", srcs=["data.in"], outs=["data.txt"], cmd="{make_data}")\n')
    workspace.build_file("tool", 'genrule(name="check", srcs=["//lib:data"], outs=["check.sh"], '
                                 f'cmd="printf \'grep -qx ok {reads}\\\\n\' > $@")\n')
    workspace.build_file("", 'test(name="t", srcs=["//tool:check"], cmd="sh tool/check.sh")\n')
    rc, out, err = workspace.run("test")
    assert rc == 0 and "PASSED" in out, (rc, out, err)
    rc, out, err = workspace.run("test")
    assert rc == 0 and "PASSED (cached)" in out, (rc, out, err)
    workspace.write("lib/data.in", edited)  # check.sh is rebuilt, byte for byte the same
    assert workspace.run("build", "//tool:check")[0] == 0
    rc, out, err = workspace.run("explain", "--test", "//:t")  # (said through the dependency it is below)
    assert "something dependency //tool:check reads changed, at some depth" in out, (rc, out, err)
    rc, out, err = workspace.run("test")
    assert rc == 1 and "FAILED" in out and "cached" not in out.split("FAILED")[0][-200:], (rc, out, err)
    assert (workspace.root / "tool" / "check.sh").read_text() == f"grep -qx ok {reads}\n"
    assert (workspace.root / "lib" / "data.txt").read_text().strip() == made.strip()


def test_a_test_s_record_line_holds_its_own_inputs_and_its_dependencies_closure_digests(
        workspace: Workspace) -> None:
    """A test below a 40-deep chain: its key and record line name its one input and its one
    dependency's closure digest, not the 80 files below (a flat list made the record tests x
    closure); an edit at the bottom still reruns it, said through that dependency."""
    chain = []
    for i in range(40):
        workspace.write(f"lib/s{i}.txt", f"{i}\n")
        dep = f', ":g{i - 1}"' if i else ""
        chain.append(f'genrule(name="g{i}", srcs=["s{i}.txt"{dep}], outs=["o{i}.txt"], cmd="cat $(SRCS) > $@")\n')
    workspace.build_file("lib", "".join(chain))
    workspace.build_file("", 'test(name="t", srcs=["//lib:g39"], cmd="test -s lib/o39.txt")\n')
    rc, out, err = workspace.run("test")
    assert rc == 0 and "PASSED" in out, (rc, out, err)
    lines = (workspace.root / ".buildtool" / "record").read_text().splitlines()[1:]
    [entry] = [json.loads(line) for line in lines if json.loads(line)["l"] == "//:t"]
    desc = json.loads(entry["desc"])
    assert list(desc["inputs"]) == ["lib/o39.txt"], desc
    assert [k for k in desc["extra"] if k.startswith("closure:")] == ["closure://lib:g39"], desc
    workspace.write("lib/s0.txt", "edited\n")
    rc, out, err = workspace.run("test", "--explain")
    assert rc == 0 and "//:t: ran: dependency //lib:g39 produced a different output lib/o39.txt" in out, out
    rc, out, err = workspace.run("test")
    assert rc == 0 and "PASSED (cached)" in out, (rc, out, err)


def test_a_test_that_could_not_start_is_a_junit_error_with_its_reason_not_a_failure_with_an_empty_log(
        workspace: Workspace) -> None:
    """Nothing ran (here: its temp directory could not be made; also an input lost in a
    remote CAS): it was FAILED with an empty log and a JUnit <failure>, where Bazel says
    FAILED TO BUILD; now NOT RUN with the reason, a JUnit error of type build_failed."""
    workspace.build_file("", 'test(name="t", cmd="echo hi")\n')
    tmp = workspace.root / ".buildtool" / "tmp"
    tmp.mkdir(parents=True)
    junit = workspace.root / "j.xml"
    with immutable(tmp):
        rc, out, err = workspace.run("test", "--junit", str(junit))
    assert rc == 1 and re.search(r"//:t +NOT RUN.*cannot make the command's temp directory", out), (out, err)
    assert "Tests: 1 (1 not run); 0 executed" in out, out
    [case] = ET.parse(junit).getroot().iter("testcase")
    [error] = list(case)
    assert error.tag == "error" and error.get("type") == "build_failed", ET.tostring(case)
    assert "cannot make the command's temp directory" in (error.get("message") or ""), ET.tostring(case)


def test_the_tests_summary_line_counts_in_a_fixed_order(workspace: Workspace) -> None:
    """The counts came in the order the results first appeared in the table: "(1 cached,
    1 passed)" or "(1 passed, 1 cached)" for the same run, whichever test was edited."""
    workspace.write("a.txt", "1\n")
    workspace.write("b.txt", "1\n")
    workspace.build_file("", 'test(name="a", srcs=["a.txt"], cmd="cat a.txt")\n'
                             'test(name="b", srcs=["b.txt"], cmd="cat b.txt")\n'
                             'test(name="c", cmd="exit 1")\n')
    rc, out, _ = workspace.run("test", "-k")
    assert rc == 1 and "Tests: 3 (2 passed, 1 failed); 3 executed" in out, out
    for edited in ("a.txt", "b.txt"):
        workspace.write(edited, f"{edited}\n")
        rc, out, _ = workspace.run("test", "-k")
        assert rc == 1 and "Tests: 3 (1 passed, 1 cached, 1 failed); 2 executed" in out, (edited, out)


def test_untouched_cached_passes_stay_cached_passes_when_a_failure_stops_the_build(workspace: Workspace) -> None:
    """Without -k, edited one test's input next to a failing test: the five untouched tests
    were NOT RUN (JUnit <skipped/>) at -j1, and at -j2 one time in five cached passes."""
    workspace.write("e.txt", "1\n")
    workspace.build_file("", 'test(name="fail", cmd="exit 1")\ntest(name="edited", srcs=["e.txt"], cmd="cat e.txt")\n'
                             + "".join(f'test(name="ok{i}", cmd="echo {i}")\n' for i in range(5)))
    assert workspace.run("test", "-k")[0] == 1
    for j in ("1", "2"):
        workspace.write("e.txt", f"{j}{j}\n")
        rc, out, _ = workspace.run("test", "-j", j)  # (the edited one: run or not, as it came before the failure)
        assert rc == 1 and re.search(r"Tests: 7 \((1 passed, )?5 cached, 1 failed(, 1 not run)?\)", out), (j, out)
    for j in ("1", "2"):  # a fresh checkout sharing the cache: the passes are the cache's, not the record's
        fresh = workspace.copy_to(workspace.root.parent / f"fresh-{j}")
        rc, out, _ = fresh.run("test", "-j", j)  # (the edited one: cached if the last run got to it)
        assert rc == 1 and re.search(r"Tests: 7 \((1 passed, )?[56] cached, 1 failed(, 1 not run)?\)", out), (j, out)


def test_a_flaky_test_s_expected_time_is_its_passing_attempt_in_every_checkout(
    make_workspace: Callable[..., Workspace], tmp_path: Path,
) -> None:
    """The build record kept the attempt that passed, the shared cache's durations every
    attempt: `plan` in a second checkout weighed the test at its failed attempts' seconds,
    and `test` there said "ran in 0.00s" (and the docs said both)."""
    counter = tmp_path / "n"
    build = (f'test(name="fl", flaky=1, cmd="n=$$(cat {counter} 2>/dev/null || echo 0); n=$$((n+1)); '
             f'echo $$n > {counter}; if [ $$n -lt 2 ]; then sleep 1; exit 1; fi")\n')
    a = make_workspace("flaky-a")
    b = make_workspace("flaky-b", cache=a.cache)  # (a second checkout sharing the cache)
    for ws in (a, b):
        ws.build_file("", build)
    assert a.run("test")[0] == 0
    for ws in (a, b):
        rc, out, err = ws.run("plan", "--test", "-j", "1", "--json")
        assert rc == 0 and json.loads(out)["rows"][0]["makespan_s"] < 0.5, (ws.root, out + err)


def test_a_cached_pass_in_a_fresh_checkout_says_the_cache_holds_a_pass(workspace: Workspace) -> None:
    """Its reason was "outputs on disk already match the cache entry", of a test with none."""
    import shutil

    workspace.build_file("", 'test(name="t", cmd="true")\n')
    assert workspace.build(command="test").rc == 0
    shutil.rmtree(workspace.root / ".buildtool")
    r = workspace.build(command="test")
    [e] = r.events
    assert r.rc == 0 and e["test"] == "cached", r.events
    assert e["reason"].endswith("; the cache holds a pass of this key"), e


def _terminated_once_hanging(workspace: Workspace) -> None:
    """``buildtool test //:t --no-cache-tests``, SIGTERMed once its command made ``hanging``
    (exit 143)."""
    env = _clean_env(workspace.cache, workspace.home)
    proc = subprocess.Popen([BUILDTOOL, "test", "//:t", "--no-cache-tests"], cwd=workspace.root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (workspace.root / "hanging").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (workspace.root / "hanging").exists(), "the (re)run never started"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_flaky_retry_interrupted_after_a_failed_attempt_is_not_a_cached_pass_next(
    workspace: Workspace, tmp_path: Path,
) -> None:
    """A test passed; later, under --no-cache-tests, its first attempt failed and the retry
    was cut short by SIGTERM: its record's pass (the same key) stayed, and the next run
    said "PASSED (cached)" for a key whose last attempt had failed -- so did a fresh
    checkout sharing the cache."""
    mode = workspace.root / "mode"
    workspace.write("t.sh", 'case $(cat ../mode 2>/dev/null || cat mode) in pass) exit 0;; fail) exit 1;;\n'
                            '  failthenhang) echo hang > mode; exit 1;; hang) touch hanging; sleep 30;; esac\n')
    workspace.build_file("", 'test(name="t", srcs=["t.sh"], cmd="sh t.sh", flaky=1)\n')
    mode.write_text("pass\n")
    assert workspace.build(command="test").rc == 0
    mode.write_text("failthenhang\n")
    _terminated_once_hanging(workspace)
    mode.write_text("fail\n")
    fresh = workspace.copy_to(tmp_path / "fresh")
    for ws in (workspace, fresh):
        r = ws.build(command="test")
        assert r.rc == 1 and r.status("//:t") == "failed" and "PASSED (cached)" not in r.output, r.output


def test_a_run_cut_short_leaves_no_log_that_a_later_cached_pass_replays(workspace: Workspace) -> None:
    """A test passed; rerun under --no-cache-tests with the same key, it was killed by
    SIGTERM midway.  Its log (the output so far) was indexed as the pass of that key, so
    the next `buildtool test` said "PASSED (cached)" and showed the killed run's partial
    output as the passing run's log.  Only a pass's log is the log of its key: the cached
    pass replays its own output."""
    mode = workspace.root / "mode"  # (not an input: the same key whatever it says)
    workspace.write("t.sh", 'case $(cat mode) in pass) echo the-passing-run;; '
                            'hang) echo partial-output-of-the-killed-run; touch hanging; sleep 30;; esac\n')
    workspace.build_file("", 'test(name="t", srcs=["t.sh"], cmd="sh t.sh")\n')
    mode.write_text("pass\n")
    assert workspace.build(command="test").rc == 0
    mode.write_text("hang\n")
    _terminated_once_hanging(workspace)
    r = workspace.build("--test-output=all", command="test")
    assert r.rc == 0 and r.by_label["//:t"]["test"] == "cached", r.output
    log = workspace.read(".buildtool/testlogs/t.log")
    assert log == "the-passing-run\n", log
    assert "the-passing-run" in r.stdout and "partial-output-of-the-killed-run" not in r.stdout, r.stdout


def test_a_builds_test_outputs_are_not_all_held_in_memory_until_it_ends(workspace: Workspace) -> None:
    """30 tests printing 6 MB each: their logs are on disk, and the report reads them back
    one at a time; buildtool held all of them (180 MB) until the build ended (304 MB peak).
    The peak RSS of the buildtool process (its commands are smaller) must stay far below
    that: ~70 MB here, at most the stores' queue (scheduler.MAX_QUEUED_AFTER_BYTES, 32 MB)
    more."""
    lines = [f'test(name="t{i}", cmd="python3 -c \\"import sys; sys.stdout.write(\'{i}\' * 6_000_000)\\"")'
             for i in range(30)]
    workspace.build_file("", "\n".join(lines) + "\n")
    assert BUILDTOOL
    env = _clean_env(Path(workspace.cache), workspace.home)
    # Measured from a small launcher's own child: Linux counts a process's peak from the
    # image it replaced at exec, so buildtool started by this test run, hundreds of MB by
    # the end of the suite, "peaked" at the test run's size (354 MB in CI).
    launcher = ("import os, sys\npid = os.fork()\nif pid == 0:\n    os.execv(sys.argv[1], sys.argv[1:])\n"
                "_, status, usage = os.wait4(pid, 0)\nprint(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n")
    p = subprocess.run([sys.executable, "-c", launcher, BUILDTOOL, "test", "//...", "-j2"], cwd=workspace.root,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=300)
    rc, maxrss = (int(w) for w in p.stdout.split()[-2:])
    assert rc == 0
    assert maxrss < 160 * 1024, f"peak RSS {maxrss // 1024} MB"  # (KiB on Linux)
    assert workspace.read(".buildtool/testlogs/t7.log") == "7" * 6_000_000
    # The report still reads each log: --test-output=all shows the cached passes' output.
    rc, out, _ = workspace.run("test", "//:t3", "//:t4", "--test-output=all")
    assert rc == 0 and "3" * 6_000_000 in out and "4" * 6_000_000 in out


def test_a_failing_test_s_duration_orders_the_next_run_and_the_plan(workspace: Workspace) -> None:
    """A failure has no record line, so a red 1 s test counted as the median of the
    others (0.2 s) and started last: the next run's critical path took what its last run
    took, as `plan --test` does; a pass forgets it (the record holds the pass's)."""
    workspace.build_file("", """
        test(name="a_fast", cmd="sleep 0.2")
        test(name="b_fast", cmd="sleep 0.2")
        test(name="z_slow", cmd="sleep 1; test -e pass")
    """)
    r = workspace.build("-k", "-j1", command="test")
    assert r.rc == 1 and r.by_label["//:z_slow"]["test"] == "failed", r.output
    index = json.loads(workspace.read(".buildtool/testlogs-index"))
    assert 1.0 <= index["failed_s"]["//:z_slow"] < 5, index
    r = workspace.build("-k", "-j1", "--no-cache-tests", command="test")
    starts = sorted((e["start"], e["label"]) for e in r.events if e["label"].endswith("fast") or "slow" in e["label"])
    assert starts[0][1] == "//:z_slow", starts
    rc, out, err = workspace.run("plan", "--test", "-j1")
    assert rc == 0 and "no recorded duration" not in out and "1.0" in out, out + err
    workspace.write("pass", "")
    assert workspace.build("-k", "-j1", command="test").rc == 0
    assert "failed_s" not in json.loads(workspace.read(".buildtool/testlogs-index"))


def test_a_test_failing_every_attempt_is_not_shown_as_flaky(workspace: Workspace) -> None:
    workspace.build_file("t", 'test(name="bad", cmd="echo boom; exit 1", flaky=2)\n')
    rc, out, err = workspace.run("test", "//t:bad")
    assert rc == 1
    assert "FLAKY: attempt" not in out + err, out + err


def test_a_damaged_failure_duration_in_the_index_is_left_out(tmp_path: Path) -> None:
    # A hand-edited or damaged index fed `true`, negative or huge "seconds" to plan's weights.
    from buildtool.testing import INDEX_FILE, INDEX_VERSION, TestLogs

    took = {"//:ok": 2.5, "//:b": True, "//:neg": -5, "//:huge": 1e300, "//:nan": float("nan"), "//:s": "3"}
    (tmp_path / INDEX_FILE).write_text(json.dumps({"v": INDEX_VERSION, "logs": {}, "failed_s": took}))
    assert TestLogs(str(tmp_path), lambda _m: None).failed_s == {"//:ok": 2.5}


def test_a_dry_run_or_plan_leaves_a_damaged_testlogs_as_it_is(workspace: Workspace) -> None:
    # (test -n and plan --test change nothing; the next real run replaces it)
    workspace.build_file("t", 'test(name="unit", cmd="echo hello")')
    logs = workspace.root / ".buildtool" / "testlogs"
    assert workspace.build("//t:unit", command="test").rc == 0
    shutil.rmtree(logs)
    logs.write_text("junk\n")
    for args in (("test", "-n", "//t:unit"), ("plan", "--test", "//t:unit")):
        rc, out, err = workspace.run(*args)
        assert rc == 0 and logs.read_text() == "junk\n", (args, out + err)
