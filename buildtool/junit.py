"""JUnit XML: the ``--junit FILE`` report of ``buildtool test`` for CI systems.

One ``<testsuite>`` (inside ``<testsuites>``) with one ``<testcase>`` per test target:
``classname`` = the package (``//pkg``), ``name`` = the label, ``time`` = seconds spent in
this build; a failure or timeout carries ``<failure message=... type=...>`` with the test's
output; a test that did not run because something it needs failed to build is an
``<error type="build_failed">`` (as Bazel's "FAILED TO BUILD": a dashboard that reads only
this file must not show it as merely skipped), one the build was interrupted while it
ran an ``<error type="interrupted">`` with its output so far, any other that did not run (the build
stopped first: another failure without ``-k``, Ctrl-C) is ``<skipped/>``; every other test with output
has ``<system-out>`` (a flaky pass also ``<system-err>`` naming its failed attempts).  This is
the subset that GitHub Actions reporters, GitLab and Jenkins read.
Characters XML 1.0 forbids (e.g. ANSI escapes) are written as ``\\xNN`` (``\\uNNNN`` above
U+00FF); the suite's ``time`` is the wall time the tests ran in; the file is
written to a temp file and renamed, one test case at a time (a test's log is read when its
case is written: never all of them at once).  Spec: docs/user-guide.md#junit-xml
"""

from __future__ import annotations

import os
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence

from buildtool.atomic import write_report
from buildtool.testing import TestCase, TestResult

MAX_OUTPUT_CHARS = 1_000_000  # per test: the end of a longer log is kept
_CUT_CHUNK = 8192
_BAD_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# The forbidden characters a log holds, escaped by str.translate (binary output had a Python
# call per byte, ~1 s a test): C0 controls, bytes that were not UTF-8 (surrogateescape's
# U+DC80-U+DCFF), U+FFFE/U+FFFF.  Any other (a lone surrogate of a str) by _BAD_XML after.
_ESCAPES = {c: f"\\x{c:02x}" for c in range(0x20) if chr(c) not in "\t\n\r"}
_ESCAPES.update({c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)})
_ESCAPES.update({0xFFFE: "\\ufffe", 0xFFFF: "\\uffff"})  # (never read as \xff + "fe")


def xml_text(data: bytes | str) -> str:
    """Text safe for XML 1.0: forbidden characters and bytes that are not UTF-8 written as
    ``\\xNN`` (``\\uNNNN`` above U+00FF; not U+FFFD: for an encoding bug the byte is the clue), and at most
    MAX_OUTPUT_CHARS (the tail, where failures usually are)."""
    skipped = 0  # characters before the bytes decoded (a log far longer than the cap)
    if isinstance(data, bytes):
        split = len(data) - (4 * MAX_OUTPUT_CHARS + 4)  # (the cap's characters, 4 bytes at most each)
        if split > 0:
            for _ in range(3):  # (not inside a character: the count is exact for UTF-8, within 3 otherwise)
                if split > 0 and 0x80 <= data[split] <= 0xBF:
                    split -= 1
            skipped = _characters_in(memoryview(data)[:split])
            data = data[split:]
        s = data.decode("utf-8", "surrogateescape")  # (not all of a 100 MB log: one emoji made it 400 MB)
    else:
        s = data
    # The cap is of the text as written (an escape is 4 or 6 characters: 900 kB of NULs wrote
    # 3.6 MB a test), cut between two characters of the log (never inside an escape) and
    # counted in them: escaped a chunk at a time from the end, the last chunk a character at
    # a time (each escapes on its own).
    kept: list[str] = []
    size, end = 0, len(s)
    while end > 0:
        start = max(0, end - _CUT_CHUNK)
        text = xml_safe(s[start:end])
        if size + len(text) <= MAX_OUTPUT_CHARS:
            kept.append(text)
            size, end = size + len(text), start
            continue
        i = end
        while i > start and size + (n := len(xml_safe(s[i - 1]))) <= MAX_OUTPUT_CHARS:
            size, i = size + n, i - 1
        kept.append(xml_safe(s[i:end]))
        end = i
        break
    text = "".join(reversed(kept))
    end += skipped
    return f"[... {end} characters cut ...]\n{text}" if end else text


def _characters_in(data: memoryview) -> int:
    """How many characters ``data`` decodes to (as surrogateescape would), a megabyte at a time."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    n = sum(len(decoder.decode(data[i:i + (1 << 20)])) for i in range(0, len(data), 1 << 20))
    return n + len(decoder.decode(b"", final=True))


def xml_safe(s: str) -> str:
    """``s`` with the characters XML 1.0 forbids written as ``\\xNN`` (``\\uNNNN`` above U+00FF); a byte of a
    non-UTF-8 file name (held as a lone surrogate, Python's surrogateescape) as that byte."""
    if _BAD_XML.search(s) is None:
        return s
    s = s.translate(_ESCAPES)
    return _BAD_XML.sub(_escape, s) if _BAD_XML.search(s) else s


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # a byte that was not UTF-8
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"  # (U+FFFE: \ufffe, never read as \xff + "fe")


def _suite_attrs(
    cases: Sequence[TestCase], suite: str, timestamp: float | None, elapsed: float | None,
) -> tuple[dict[str, str], dict[str, str]]:
    """The ``<testsuites>`` and ``<testsuite>`` attributes: the counts, from the results alone.
    ``elapsed``: the suite's wall time, from the first test's start to the last one's end
    (tests run in parallel: not the sum of their times); None: the sum."""
    failures = sum(1 for c in cases if c.result in (TestResult.FAILED, TestResult.TIMEOUT))
    errors = sum(1 for c in cases if c.result is None and (c.build_failed or c.interrupted))
    skipped = sum(1 for c in cases if c.result is None and not (c.build_failed or c.interrupted))
    total_time = sum(c.time for c in cases) if elapsed is None else elapsed
    counts = {
        "name": suite,
        "tests": str(len(cases)),
        "failures": str(failures),
        "errors": str(errors),
        "time": f"{total_time:.3f}",
    }
    # ``skipped`` on <testsuite> only: the Jenkins xUnit plugin's schema (junit-10.xsd), which
    # it checks reports against, refuses it on <testsuites> (so do pytest's reports).
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(timestamp))
    return counts, {**counts, "skipped": str(skipped), "timestamp": stamp}


def _case(c: TestCase) -> ET.Element:
    """One test's ``<testcase>`` (its log read here, once)."""
    log = c.log
    tc = ET.Element("testcase", {"classname": xml_safe(f"//{c.pkg}"), "name": xml_safe(c.label),
                                 "time": f"{c.time:.3f}"})
    if c.result in (TestResult.FAILED, TestResult.TIMEOUT):
        kind = "timeout" if c.result is TestResult.TIMEOUT else "failed"
        f = ET.SubElement(tc, "failure", {"message": xml_text(c.message), "type": kind})
        f.text = xml_text(log)
    elif c.result is None and c.build_failed:
        ET.SubElement(tc, "error", {"message": xml_text(c.message), "type": "build_failed"})
    elif c.result is None and c.interrupted:  # (it ran and has no verdict: not "skipped", which reads neutral)
        ET.SubElement(tc, "error", {"message": xml_text(c.message), "type": "interrupted"})
    elif c.result is None:
        ET.SubElement(tc, "skipped", {"message": xml_text(c.message)})
    for why, output in zip(c.failures, c.attempt_logs if c.result is TestResult.FLAKY else (), strict=False):
        # Maven Surefire's element for a failed attempt of a test that passed on a rerun,
        # which Jenkins' JUnit plugin and GitLab show: each attempt's message and output.
        ff = ET.SubElement(tc, "flakyFailure", {"message": xml_text(why), "type": "failed"})
        ET.SubElement(ff, "system-out").text = xml_text(output)
    if log and c.result not in (TestResult.FAILED, TestResult.TIMEOUT):  # (a failure's holds it: not twice)
        so = ET.SubElement(tc, "system-out")
        so.text = xml_text(log)
    if c.result is TestResult.FLAKY:
        se = ET.SubElement(tc, "system-err")
        se.text = xml_text(f"FLAKY: passed on attempt {len(c.failures) + 1}; earlier: {'; '.join(c.failures)}\n")
    return tc


def to_xml(
    cases: Sequence[TestCase], suite: str = "buildtool", timestamp: float | None = None, elapsed: float | None = None,
) -> ET.ElementTree:
    """The report as one tree (every log in it: for tests; ``write_junit`` streams it)."""
    outer, inner = _suite_attrs(cases, suite, timestamp, elapsed)
    root = ET.Element("testsuites", outer)
    ts = ET.SubElement(root, "testsuite", inner)
    ts.extend(_case(c) for c in cases)
    ET.indent(root, "  ")
    return ET.ElementTree(root)


def junit_chunks(
    cases: Sequence[TestCase], suite: str = "buildtool", timestamp: float | None = None, elapsed: float | None = None,
) -> Iterator[bytes]:
    """The report's bytes, a test case at a time: the same document as ``to_xml``'s."""
    outer, inner = _suite_attrs(cases, suite, timestamp, elapsed)
    head = ET.tostring(ET.Element("testsuites", outer), encoding="unicode")[: -len(" />")]
    yield f"<?xml version='1.0' encoding='utf-8'?>\n{head}>\n".encode()
    yield f"  {ET.tostring(ET.Element('testsuite', inner), encoding='unicode')[: -len(' />')]}>\n".encode()
    for c in cases:
        tc = _case(c)
        ET.indent(tc, "  ", level=2)
        tc.tail = "\n"
        # A raw CR would reach readers as LF (XML end-of-line handling); the markup has none.
        yield b"    " + ET.tostring(tc, encoding="utf-8").replace(b"\r", b"&#13;")
    yield b"  </testsuite>\n</testsuites>"


def write_junit(path: str, cases: Sequence[TestCase], elapsed: float | None = None) -> None:
    """Write the report to ``path`` atomically (temp file + rename), a test case at a time."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_report(path, junit_chunks(cases, elapsed=elapsed))
