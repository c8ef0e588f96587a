"""JUnit XML (buildtool/junit.py): parses, right counts, failure messages and output."""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import Workspace

from buildtool.junit import to_xml, write_junit, xml_text
from buildtool.testing import TestCase, TestResult


def test_junit_report_of_a_real_test_run(workspace: Workspace, tmp_path: Path) -> None:
    counter = tmp_path / "attempts.txt"
    workspace.build_file(
        "pkg",
        f"""
        test(name="ok", cmd="echo ok-output")
        test(name="bad", cmd="echo bad-output; echo bad-err >&2; exit 2")
        test(name="slow", cmd="sleep 30", timeout=0.5)
        genrule(name="gen", outs=["g.txt"], cmd="exit 1")
        test(name="needs_gen", srcs=[":gen"], cmd="true")
        test(name="wobbly", flaky=1, env={{"C": "{counter}"}},
             cmd="echo x >> $$C; test $$(wc -l < $$C) -ge 2 || {{ echo attempt-1-output; sleep 0.3; exit 1; }}")
        """,
    )
    junit = tmp_path / "out" / "junit.xml"
    rc, out, err = workspace.run("test", "//pkg/...", "-k", "--junit", str(junit))
    assert rc == 1, out + err
    root = ET.parse(junit).getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    assert suite.get("tests") == "5" and suite.get("failures") == "2"
    # needs_gen could not run: its dependency failed to build. An error, not a skip, as
    # Bazel's FAILED TO BUILD: a dashboard reading only this file must not show it as fine.
    assert suite.get("errors") == "1" and suite.get("skipped") == "0"
    assert root.get("tests") == "5"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {"//pkg:ok", "//pkg:bad", "//pkg:slow", "//pkg:needs_gen", "//pkg:wobbly"}
    assert all(c.get("classname") == "//pkg" for c in cases.values())
    times = {name: float(c.get("time", "x")) for name, c in cases.items()}
    # Seconds this build spent on each: never more than the suite's wall time, none for a test
    # that never ran, and a flaky test's every attempt (its failed one slept 0.3 s).
    assert all(0 <= t <= float(suite.get("time", "0")) + 0.001 for t in times.values()), (times, suite.get("time"))
    assert times["//pkg:needs_gen"] == 0.0 and times["//pkg:wobbly"] >= 0.3, times
    assert float(cases["//pkg:slow"].get("time", "0")) >= 0.45  # ran until its 0.5 s timeout
    bad = cases["//pkg:bad"].find("failure")
    assert bad is not None and bad.get("message") == "exited with status 2"
    assert "bad-output" in (bad.text or "") and "bad-err" in (bad.text or "")
    assert cases["//pkg:bad"].find("system-out") is None  # (its output once, not twice: reports have size limits)
    slow = cases["//pkg:slow"].find("failure")
    assert slow is not None and slow.get("type") == "timeout" and "TIMEOUT" in (slow.get("message") or "")
    error = cases["//pkg:needs_gen"].find("error")
    assert error is not None and cases["//pkg:needs_gen"].find("skipped") is None
    assert error.get("type") == "build_failed" and error.get("message") == "not run because //pkg:gen failed"
    ok = cases["//pkg:ok"]
    assert ok.find("failure") is None and ok.find("skipped") is None and ok.find("error") is None
    assert "ok-output" in (ok.findtext("system-out") or "")
    wobbly = cases["//pkg:wobbly"]
    assert wobbly.find("failure") is None
    assert (wobbly.findtext("system-err") or "").startswith(
        "FLAKY: passed on attempt 2; earlier: exited with status 1"), wobbly.findtext("system-err")
    # Each failed attempt as Surefire's <flakyFailure>, with its output (Jenkins shows them).
    tries = wobbly.findall("flakyFailure")
    assert [(f.get("message"), f.get("type")) for f in tries] == [("exited with status 1", "failed")], tries
    assert "attempt-1-output" in (tries[0].findtext("system-out") or "")
    assert "attempt-1-output" not in (wobbly.findtext("system-out") or "")

    # Second run: ok is cached (time 0, still reported with its log), counts unchanged.
    rc, out, err = workspace.run("test", "//pkg/...", "-k", "--junit", str(junit))
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "5"
    ok = next(c for c in suite.findall("testcase") if c.get("name") == "//pkg:ok")
    assert float(ok.get("time", "1")) == 0.0 and "ok-output" in (ok.findtext("system-out") or "")


def test_control_characters_in_output_still_give_valid_xml(tmp_path: Path) -> None:
    out = b"\x1b[31mred\x1b[0m \x00 done \xff\n"
    case = TestCase("//a:t", "a", TestResult.FAILED, 0.25, "exited with status 1", out, ".buildtool/testlogs/a/t.log")
    passed = TestCase("//a:u", "a", TestResult.PASSED, 0.1, "ran", b"fine\n", ".buildtool/testlogs/a/u.log")
    path = tmp_path / "j.xml"
    to_xml([case, passed]).write(path, encoding="utf-8", xml_declaration=True)
    root = ET.parse(path).getroot()
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None and "\\x1b[31mred" in (failure.text or "")
    assert root.find("testsuite").get("failures") == "1"  # type: ignore[union-attr]
    assert xml_text("a\x07b") == "a\\x07b"
    assert xml_text("tab\tand\nnewline") == "tab\tand\nnewline"
    # a byte that is not UTF-8 is named, not replaced by U+FFFD (for an encoding bug it is the clue)
    assert xml_text(b"caf\xe9 \xc3\xa9") == "caf\\xe9 \u00e9", xml_text(b"caf\xe9 \xc3\xa9")


def test_only_the_testsuite_counts_skipped_and_a_character_above_ff_is_no_byte() -> None:
    # The Jenkins xUnit plugin checks reports against junit-10.xsd, which has no `skipped`
    # on <testsuites>; a character XML forbids above U+00FF must not read as a byte + text.
    case = TestCase("//a:t", "a", None, 0.0, "not run", b"", "")
    root = to_xml([case]).getroot()
    assert "skipped" not in root.attrib and root.find("testsuite").get("skipped") == "1"  # type: ignore[union-attr]
    assert xml_text("a\ufffeb") == "a\\ufffeb" and xml_text("\x07") == "\\x07"


@pytest.mark.parametrize(("data", "cut", "start"), [(b"\0" * 900_000, 650_000, "\\x00"),
                                                    (b"caf\xe9 " * 200_000, 375_000, "caf\\xe9 "),
                                                    (b"ab\0" * 300_000 + b"z", 400_002, "ab\\x00")])
def test_binary_output_is_capped_as_it_is_written_escaped(data: bytes, cut: int, start: str) -> None:
    """900 kB of NULs wrote 3.6 MB of escapes per test case: the cap was of the characters
    before escaping (216 MB of JUnit for 60 such tests, escaped one Python call per byte).
    The cut is between two of the log's characters, never inside an escape, and counts them."""
    from buildtool.junit import MAX_OUTPUT_CHARS

    head, _, tail = xml_text(data).partition("\n")
    assert head == f"[... {cut} characters cut ...]" and tail.startswith(start), (head, tail[:20])
    assert MAX_OUTPUT_CHARS - 6 < len(tail) <= MAX_OUTPUT_CHARS and tail == xml_text(data[cut:])
    assert xml_text(b"\x01\x02\xff\xfe\x1f\t\xef\xbf\xbe\x7f") == "\\x01\\x02\\xff\\xfe\\x1f\t\\ufffe\x7f"


def test_the_suites_time_is_the_wall_time_the_tests_ran_in(workspace: Workspace, tmp_path: Path) -> None:
    # Four 1 s tests at -j4 take ~1 s, not 4 (Ant, Surefire and pytest report elapsed time).
    workspace.build_file("p", "\n".join(f'test(name="t{i}", cmd="sleep 1")' for i in range(4)))
    junit = tmp_path / "j.xml"
    assert workspace.run("test", "//p/...", "-j4", "--junit", str(junit))[0] == 0
    root = ET.parse(junit).getroot()
    cases = [float(c.get("time", "0")) for c in root.iter("testcase")]
    assert len(cases) == 4 and min(cases) >= 0.95, cases
    assert max(cases) <= float(root.get("time", "0")) < 0.75 * sum(cases), (root.get("time"), cases)
    assert root.find("testsuite").get("time") == root.get("time")  # type: ignore[union-attr]
    # All cached: nothing ran in this build.
    assert workspace.run("test", "//p/...", "-j4", "--junit", str(junit))[0] == 0
    assert ET.parse(junit).getroot().get("time") == "0.000"


def test_a_non_utf8_package_name_still_gives_valid_xml(tmp_path: Path) -> None:
    """A package directory named with byte 0xE9 (not UTF-8) reaches the label as the lone
    surrogate U+DCE9; written as a character reference, expat refused the whole report."""
    label = "//d\udce9:tq"
    case = TestCase(label, "d\udce9", TestResult.FAILED, 0.1, f"{label} exited with status 1", b"",
                    ".buildtool/testlogs/x.log")
    path = tmp_path / "j.xml"
    write_junit(str(path), [case])
    tc = ET.parse(path).getroot().find("testsuite/testcase")
    assert tc is not None and tc.get("name") == "//d\\xe9:tq" and tc.get("classname") == "//d\\xe9"
    failure = tc.find("failure")
    assert failure is not None and failure.get("message") == "//d\\xe9:tq exited with status 1"


def test_a_log_over_the_limit_keeps_its_tail_where_the_failure_is(workspace: Workspace, tmp_path: Path) -> None:
    """A test printing 1.5 MB of output and then its failure: the report keeps the last
    MAX_OUTPUT_CHARS characters, after a line saying how many were cut.  Keeping the head
    instead left the CI dashboard the first 1 MB of output, not the assertion that failed."""
    from buildtool.junit import MAX_OUTPUT_CHARS

    workspace.build_file("", 'test(name="noisy", cmd="printf %1500000s progress; echo; '
                             'echo ASSERTION-FAILED-HERE; exit 1")\n')  # (1.5 MB: spaces, then "progress")
    junit = tmp_path / "j.xml"
    rc, out, err = workspace.run("test", "//:noisy", "--junit", str(junit))
    assert rc == 1, out + err
    failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.text is not None
    log_len = 1_500_000 + len("\nASSERTION-FAILED-HERE\n")
    head = f"[... {log_len - MAX_OUTPUT_CHARS} characters cut ...]\n"
    assert failure.text.startswith(head), failure.text[:100]
    assert failure.text.endswith(" progress\nASSERTION-FAILED-HERE\n"), failure.text[-100:]
    assert len(failure.text) == len(head) + MAX_OUTPUT_CHARS


def test_a_carriage_return_in_output_survives_the_xml_reader(tmp_path: Path) -> None:
    """A progress bar's CR must not come back as a line feed (XML end-of-line handling)."""
    case = TestCase("//a:t", "a", TestResult.FAILED, 0.1, "exited with status 1", b"10%\r50%\r\n",
                    ".buildtool/testlogs/a/t.log")
    path = tmp_path / "j.xml"
    write_junit(str(path), [case])
    failure = ET.parse(path).getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.text == "10%\r50%\r\n"


def test_reports_go_through_links_and_into_pipes_and_a_lost_one_fails_the_job(
    workspace: Workspace, tmp_path: Path
) -> None:
    """--junit/--profile name a file the user owns: a symlink stays a symlink (its target is
    written), a FIFO or device is written into (a rename would replace it: --profile
    /dev/stdout replaced the system's /dev/stdout), and a report that could not be written
    is exit 1 after a build that succeeded."""
    import os
    import stat
    import subprocess
    import threading

    workspace.build_file("", 'test(name="t", cmd="true")')
    (tmp_path / "j.xml").symlink_to(tmp_path / "real" / "junit.xml")  # a link to a file not there yet
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    rc, out, err = workspace.run("test", "--junit", str(tmp_path / "j.xml"), "--profile", str(fifo))
    reader.join(timeout=5)
    assert rc == 0, out + err
    assert (tmp_path / "j.xml").is_symlink() and "<testsuites" in (tmp_path / "real" / "junit.xml").read_text()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and b'"traceEvents"' in got[0]
    # Into our own stdout, redirected to a log (as `--junit /dev/stdout > ci.log`; a link of
    # our own to /proc/self/fd/1 here): appended at stdout's offset, the log kept whole.
    (tmp_path / "out.xml").symlink_to("/proc/self/fd/1")
    log = tmp_path / "ci.log"
    with open(log, "w") as f:
        f.write("before\n")
        f.flush()
        r = subprocess.run(["buildtool", "test", "--junit", str(tmp_path / "out.xml")], cwd=workspace.root,
                           stdout=f, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "BUILDTOOL_CACHE_DIR": str(workspace.cache)})
        f.write("after\n")
    text = log.read_text()
    assert r.returncode == 0 and (tmp_path / "out.xml").is_symlink(), r.stderr
    assert text.startswith("before\n") and "<testsuites" in text and "PASSED" in text and text.endswith("after\n"), text
    # Into another descriptor the caller opened (`--junit /dev/fd/3 3>>ci.log`): appended.
    log3 = tmp_path / "ci3.log"
    log3.write_text("before\n")
    fd = os.open(log3, os.O_WRONLY | os.O_APPEND)
    (tmp_path / "fd3.xml").symlink_to(f"/proc/self/fd/{fd}")
    try:
        r = subprocess.run(["buildtool", "test", "--junit", str(tmp_path / "fd3.xml")], cwd=workspace.root,
                           capture_output=True, text=True, pass_fds=(fd,),
                           env={**os.environ, "BUILDTOOL_CACHE_DIR": str(workspace.cache)})
    finally:
        os.close(fd)
    text = log3.read_text()
    assert r.returncode == 0 and text.startswith("before\n") and "<testsuites" in text, (r.stderr, text)
    # A report refused by what it is written into (a pipe whose reader left): exit 1 at the
    # end of a build that succeeded, saying why.
    rd, wr = os.pipe()
    os.close(rd)
    (tmp_path / "gone.xml").symlink_to("/proc/self/fd/1")
    r = subprocess.run(["buildtool", "test", "--junit", str(tmp_path / "gone.xml")], cwd=workspace.root,
                       stdout=wr, stderr=subprocess.PIPE, text=True,
                       env={**os.environ, "BUILDTOOL_CACHE_DIR": str(workspace.cache)})
    os.close(wr)
    assert r.returncode == 1 and "the build succeeded, but --junit" in r.stderr, r.stderr


def test_a_junit_file_that_cannot_be_written_leaves_no_stale_report(workspace: Workspace, tmp_path: Path) -> None:
    """The JUnit file of an earlier green run must not stay behind when this run's cannot
    be written (a full disk: here a file-size limit makes the write fail for real): a CI
    step reading it would show green for a red job."""
    import resource
    import subprocess

    from conftest import BUILDTOOL, _clean_env

    # 80 passing tests: a JUnit file of ~12 kB, while each test's own files stay small
    workspace.build_file("", '[test(name=f"a_test_with_a_rather_long_name_{i}", cmd="true") for i in range(80)]')
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites tests="1" failures="0"/>\n')  # an earlier run's, green

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))

    r = subprocess.run([BUILDTOOL, "test", "--junit", str(junit)], cwd=workspace.root,
                       capture_output=True, text=True, env=_clean_env(workspace.cache, workspace.home),
                       preexec_fn=small_files, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"could not write the JUnit file {junit}" in r.stderr, r.stderr
    assert "removed the one an earlier run left there" in r.stderr, r.stderr
    assert not junit.exists()


def test_a_junit_name_too_long_is_exit_2_before_any_test_runs(workspace: Workspace, tmp_path: Path) -> None:
    """It ran every test, then warned and exited 1, where --events with the same name is
    refused up front (exit 2).  A name that fits is written, though the temp file's
    name beside it would not (it is cut to fit)."""
    workspace.build_file("", f'test(name="t", cmd="touch {tmp_path}/ran")\n')
    rc, out, err = workspace.run("test", "--junit", str(tmp_path / ("j" * 300)))
    assert rc == 2 and "its file system allows" in err, (rc, out, err)
    assert not (tmp_path / "ran").exists()
    rc, out, err = workspace.run("test", "--junit", str(tmp_path / ("j" * 250)))
    assert rc == 0 and (tmp_path / ("j" * 250)).is_file() and (tmp_path / "ran").exists(), (rc, out, err)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("j") and p.name != "j" * 250]  # no temp left


@pytest.mark.parametrize("refusal", ["buildfile-error", "no-such-target", "--bogus", "-j abc", "--test-output=x",
                                     "--no-cache"])
def test_a_request_refused_before_anything_runs_leaves_no_stale_report(
    workspace: Workspace, tmp_path: Path, refusal: str
) -> None:
    """A green run's reports, then a run refused with exit 2 (a BUILD.py that does not
    evaluate, a label that names nothing): the old JUnit, events and profile files go (a
    CI step showing them would show the last run's green results), other files stay."""
    workspace.build_file("", 'test(name="t", cmd="true")\n')
    reports = tmp_path / "r"
    flags = ["--junit", str(reports / "j.xml"), "--events", str(reports / "e.jsonl"),
             "--profile", str(reports / "p.json")]
    rc, out, err = workspace.run("test", *flags)
    assert rc == 0 and {p.name for p in reports.iterdir()} == {"j.xml", "e.jsonl", "p.json"}, (rc, out, err)
    (reports / "notes.txt").write_text("mine\n")
    if refusal == "buildfile-error":
        workspace.build_file("", 'test(name=\n')
        rc, out, err = workspace.run("test", *flags)
    elif refusal == "no-such-target":
        rc, out, err = workspace.run("test", "//:nope", *flags)
    else:  # the command line does not parse (--no-cache: no abbreviation of --no-cache-tests);
        # -C and --flag=VALUE spellings as the report flags of a CI script may be, the paths
        # relative to -C's directory
        rel = [os.path.relpath(f, workspace.root) if f.startswith("/") else f for f in flags]
        rc, out, err = workspace.run("-C", str(workspace.root), "test", *refusal.split(),
                                     *(f"{a}={b}" for a, b in zip(rel[::2], rel[1::2], strict=True)),
                                     cwd=tmp_path)
    assert rc == 2, (rc, out, err)
    assert {p.name for p in reports.iterdir()} == {"notes.txt"}, err


def test_a_dry_run_says_it_writes_no_junit_or_profile_and_leaves_no_stale_one(
    workspace: Workspace, tmp_path: Path
) -> None:
    """`test -n --junit F --profile P` ran nothing and wrote neither, silently, leaving an
    earlier run's files to pass for its own; `--events` has its would-run events."""
    workspace.build_file("", 'test(name="t", cmd="true")\n')
    junit, profile, events = tmp_path / "j.xml", tmp_path / "p.json", tmp_path / "e.jsonl"
    flags = ["--junit", str(junit), "--profile", str(profile), "--events", str(events)]
    rc, out, err = workspace.run("test", *flags)
    assert rc == 0 and junit.exists() and profile.exists(), (rc, out, err)
    rc, out, err = workspace.run("test", "-n", *flags)
    assert rc == 0, (rc, out, err)
    assert not junit.exists() and not profile.exists() and events.exists(), err
    assert f"--junit {junit}: a dry run runs nothing and writes no such report; removed the one" in err, err
    assert f"--profile {profile}: a dry run runs nothing" in err, err


def test_only_an_earlier_report_is_ever_removed(tmp_path: Path) -> None:
    """After a failed write, the stale report goes; a source (also through a link), a log,
    or an empty file never does."""
    from buildtool.atomic import remove_stale_report

    old = tmp_path / "junit.xml"
    old.write_text('<?xml version="1.0"?>\n<testsuites tests="1"/>\n')
    src = tmp_path / "in.txt"
    src.write_text("precious\n")
    (tmp_path / "link.xml").symlink_to(src)
    log = tmp_path / "ci.log"
    log.write_text("[1/2] ran //:a\n")
    assert remove_stale_report(str(old), "--junit") and not old.exists()
    for keep in (src, tmp_path / "link.xml", log):
        assert not remove_stale_report(str(keep), "--junit")
    assert src.read_text() == "precious\n" and log.exists()


def test_a_test_whose_build_failed_is_an_error_and_one_the_build_stopped_before_is_skipped(tmp_path: Path) -> None:
    broken = TestCase("//a:t", "a", None, 0.0, "not run because //a:gen failed", b"", "", build_failed=True)
    stopped = TestCase("//a:u", "a", None, 0.0, "the build stopped after a failure", b"", "")
    cut = TestCase("//a:v", "a", None, 1.5, "interrupted", b"so far\n", "", interrupted=True)
    root = to_xml([broken, stopped, cut]).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    # (an interrupted test is an error, not also skipped: dashboards add the counts up)
    counts = (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped"))
    assert counts == ("3", "0", "2", "1")
    assert root.get("errors") == "2"
    interrupted = {c.get("name"): c for c in suite.findall("testcase")}["//a:v"]
    assert interrupted.find("skipped") is None and interrupted.find("error").get("type") == "interrupted"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    error = cases["//a:t"].find("error")
    assert error is not None and error.get("type") == "build_failed"
    assert error.get("message") == "not run because //a:gen failed" and cases["//a:t"].find("skipped") is None
    skipped = cases["//a:u"].find("skipped")
    assert skipped is not None and cases["//a:u"].find("error") is None


def _mixed_cases() -> list[TestCase]:
    return [
        TestCase("//a:f", "a", TestResult.FAILED, 0.5, "exited with status 1", b"boom\r\n\x1b[31m", "l/f.log"),
        TestCase("//a:p", "a", TestResult.PASSED, 0.25, "", b"fine & <dandy>\n", "l/p.log"),
        TestCase("//a:w", "a", TestResult.FLAKY, 1.0, "", b"", "l/w.log", failures=["exited with status 3"]),
        TestCase("//b:t", "b", TestResult.TIMEOUT, 2.0, "TIMEOUT after 2s", b"...", "l/t.log"),
        TestCase("//b:n", "b", None, 0.0, "not run because //b:g failed", b"", "", build_failed=True),
        TestCase("//b:i", "b", None, 0.1, "interrupted", b"so far", "l/i.log", interrupted=True),
        TestCase("//b:s", "b", None, 0.0, "not run", b"", ""),
    ]


@pytest.mark.parametrize("cases", [_mixed_cases(), []], ids=["mixed", "none"])
def test_the_streamed_report_is_the_tree_s_document(tmp_path: Path, cases: list[TestCase]) -> None:
    """write_junit writes a case at a time; what a reader gets is to_xml's document."""
    path = tmp_path / "j.xml"
    write_junit(str(path), cases, elapsed=3.5)
    streamed = ET.canonicalize(from_file=str(path), strip_text=True)
    whole = ET.tostring(to_xml(cases, elapsed=3.5).getroot(), encoding="unicode").replace("\r", "&#13;")
    tree = ET.canonicalize(whole, strip_text=True)  # (a raw CR: a reader's LF, as the writer knows)
    assert streamed == tree
    root = ET.parse(path).getroot()
    assert root.get("tests") == str(len(cases)) and len(root.findall("testsuite/testcase")) == len(cases)


def test_the_report_never_holds_every_test_s_log_at_once(tmp_path: Path) -> None:
    """30 tests of 1 MB of output each: the whole tree (and its serialization) held them
    all, ~100 MB of a CI runner's memory for the report alone."""
    import tracemalloc

    def log() -> bytes:
        return b"x" * 999_999 + b"\n"

    cases = [TestCase(f"//p:t{i}", "p", TestResult.FAILED, 0.1, "exited with status 1", log, f"l/{i}.log")
             for i in range(30)]
    tracemalloc.start()
    try:
        write_junit(str(tmp_path / "j.xml"), cases)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12_000_000, peak
    assert os.path.getsize(tmp_path / "j.xml") > 30_000_000


def test_a_temp_file_a_killed_run_left_beside_the_report_is_removed(workspace: Workspace, tmp_path: Path) -> None:
    """A CI job SIGKILLed while its JUnit file was written left `j.xml.tmp.<pid>.<thread>`,
    a cut report, which no later run removed (an upload of reports/ carried it).  One of a
    process still running (writing it now) stays, as does one written to in the last minute
    (its pid may be another PID namespace's)."""
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    reports = tmp_path / "reports"
    reports.mkdir()
    left = reports / f"j.xml.tmp.{dead.pid}.140356803128192"
    left.write_text("<testsuites><testsuite")
    alive = reports / f"j.xml.tmp.{os.getpid()}.1"
    alive.write_text("<testsuites")
    recent = reports / f"j.xml.tmp.{dead.pid}.7"
    recent.write_text("<testsuites")
    old = time.time() - 3600
    workspace.build_file("", 'test(name="t", cmd="true")\n')
    for _ in range(2):  # (no report yet; then one to replace)
        for p in (left, alive):
            os.utime(p, (old, old))
        rc, out, err = workspace.run("test", "--junit", str(reports / "j.xml"))
        assert rc == 0, out + err
        assert not left.exists() and alive.exists() and recent.exists(), sorted(p.name for p in reports.iterdir())
        left.write_text("<testsuites><testsuite")


def test_a_log_far_over_the_cap_is_decoded_only_at_its_end_and_counted_whole() -> None:
    """A 100 MB log with one emoji was decoded whole: Python's str of 4-byte characters took
    400 MB.  Only its end is decoded now; the characters before it are counted."""
    from buildtool.junit import MAX_OUTPUT_CHARS

    data = "é".encode() * 3_000_000 + b"\xf0\x9f\x98\x80" + b"x" * (MAX_OUTPUT_CHARS - 1)
    head, _, tail = xml_text(data).partition("\n")
    assert tail == "\U0001f600" + "x" * (MAX_OUTPUT_CHARS - 1) and head == "[... 3000000 characters cut ...]", head


@pytest.mark.parametrize("n", [4_000_004, 4_000_005, 4_000_006, 4_000_007])
def test_binary_output_just_over_the_decode_window_keeps_the_cap(n: int) -> None:
    """Continuation bytes at the start of the decode window stepped it back past the log's
    first byte (a negative index: the end of the log): 8 characters kept of 4 MB."""
    from buildtool.junit import MAX_OUTPUT_CHARS

    head, _, tail = xml_text(b"\x80" * n).partition("\n")
    assert len(tail) == MAX_OUTPUT_CHARS and head == f"[... {n - MAX_OUTPUT_CHARS // 4} characters cut ...]", head


def test_a_cut_landing_on_the_continuation_byte_0x80_counts_whole_characters() -> None:
    """The decode window steps back off continuation bytes 0x80-0xBF: at exactly 0x80 (the
    second byte of 'À') it did not, and the count of characters cut was off by one."""
    from buildtool.junit import MAX_OUTPUT_CHARS

    m, r = 10, 4 * MAX_OUTPUT_CHARS + 3
    data = "À".encode() * m + b"x" * r  # (the window's first byte: the last 'À''s 0x80)
    head, _, tail = xml_text(data).partition("\n")
    assert head == f"[... {m + r - MAX_OUTPUT_CHARS} characters cut ...]" and tail == "x" * MAX_OUTPUT_CHARS, head


def test_a_failed_or_timed_out_test_s_output_is_written_once_in_its_failure() -> None:
    """user-guide.md: the output of a failure is in the <failure> element, once; a timeout's
    was also in <system-out>."""
    cases = {c.get("name"): c for c in to_xml(_mixed_cases()).getroot().iter("testcase")}
    for label, kind in (("//a:f", "failed"), ("//b:t", "timeout")):
        failure = cases[label].find("failure")
        assert failure is not None and failure.get("type") == kind and failure.text
        assert cases[label].find("system-out") is None, label
    assert cases["//a:p"].find("system-out").text == "fine & <dandy>\n"
