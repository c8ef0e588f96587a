"""Console output: plain and stable without a terminal (no control characters), a live
multi-line status with colors on a terminal (a real pty), --color, NO_COLOR,
--replay-output, failures in full."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import BUILDTOOL, Workspace, _clean_env

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but \t and \n

BUILD = r"""
genrule(name="a", srcs=["s.txt"], outs=["a.out"], cmd="printf '\033[31mred warning\033[0m\r\n'; cat $< > $@")
genrule(name="b", srcs=[":a"], outs=["b.out"], cmd="sleep 0.4; cat $< > $@")
genrule(name="c", srcs=[":a"], outs=["c.out"], cmd="sleep 0.4; cat $< > $@")
"""
FAIL = """
genrule(name="bad", outs=["x"], cmd="echo line-one >&2; echo line-two >&2; printf 'tail\\033[1m!\\n' >&2; exit 3")
"""


def _ws(ws: Workspace) -> None:
    ws.write("s.txt", "x\n")
    ws.build_file("", BUILD)


def test_plain_output_has_no_control_characters(workspace: Workspace) -> None:
    _ws(workspace)
    for env in ({"CI": ""}, {"CI": "true", "TERM": "xterm-256color"}):
        workspace.write("s.txt", f"{env}\n")
        r = workspace.build("-j", "2", env_extra=env)
        assert r.rc == 0, r.output
        assert not CONTROL.search(r.stdout), repr(r.stdout)
        lines = r.stdout.splitlines()
        assert sum(1 for ln in lines if re.match(r"^\[\d+/3\] ran //:[abc] \(\d+\.\d\ds\)$", ln)) == 3, lines
        assert lines[-1].startswith("OK: 3 targets: 3 ran")
        # What //:a printed although it succeeded follows its line, as Make and Ninja show it.
        at = next(i for i, ln in enumerate(lines) if " ran //:a " in ln)
        assert lines[at + 1] == "red warning", lines
    # restore + failure + --replay-output: still no control characters (the replayed
    # output's own escapes are stripped too)
    for name in ("a.out", "b.out", "c.out"):
        (workspace.root / name).unlink()
    r = workspace.build("--replay-output", env_extra={"CI": ""})
    assert r.rc == 0
    assert not CONTROL.search(r.stdout), repr(r.stdout)
    assert "red warning" in r.stdout and "cached stdout" in r.stdout
    workspace.build_file("", FAIL)
    r = workspace.build(env_extra={"CI": ""})
    assert r.rc == 1
    assert not CONTROL.search(r.stdout), repr(r.stdout)
    assert "line-one\nline-two\ntail!" in r.stdout and "exit 3" in r.stdout


def test_test_output_all_has_no_control_characters_in_a_log(workspace: Workspace) -> None:
    workspace.build_file("", r"""test(name="t", cmd="printf 'a \033[31mRED\033[0m \007 \r x\n'")""")
    rc, out, _ = workspace.run("test", "--test-output=all")
    assert rc == 0 and "==== //:t (PASSED) output ====\na RED   x\n" in out, repr(out)
    assert not CONTROL.search(out), repr(out)


def test_replay_output_is_opt_in(workspace: Workspace) -> None:
    _ws(workspace)
    assert workspace.build().rc == 0
    (workspace.root / "a.out").unlink()
    r = workspace.build()
    assert r.status("//:a") == "restored"
    assert "red warning" not in r.output


def test_replay_output_says_when_a_cached_stream_is_gone(workspace: Workspace) -> None:
    """A restored target whose stdout blob the cache lost (evicted, deleted) still restores
    its outputs; --replay-output says the stream is gone rather than showing nothing."""
    from buildtool.digest import hash_bytes

    workspace.build_file("", 'genrule(name="loud", outs=["o.txt"], cmd="seq 1 3000; echo quiet >&2; echo x > $@")')
    assert workspace.build().rc == 0
    printed = "".join(f"{i}\n" for i in range(1, 3001)).encode()  # (larger than an entry holds inline)
    blob = hash_bytes(printed)
    (workspace.cache / "v2" / "cas" / blob[:2] / blob).unlink()
    (workspace.root / "o.txt").unlink()
    r = workspace.build("--replay-output", env_extra={"CI": ""})
    assert r.rc == 0 and r.status("//:loud") == "restored", r.output
    assert workspace.read("o.txt") == "x\n"
    assert "--- //:loud: cached stdout is no longer in the cache ---" in r.stdout, r.stdout
    assert "--- //:loud: cached stderr ---\nquiet\n" in r.stdout, r.stdout


def test_color_always_and_never(workspace: Workspace) -> None:
    _ws(workspace)
    r = workspace.build("--color", "always")
    assert "\x1b[32mran\x1b[0m" in r.stdout and "\x1b[32mOK\x1b[0m" in r.stdout
    assert "\x1b[J" not in r.stdout and "\r" not in r.stdout  # colors, but no live status
    assert "\x1b[31mred warning" in r.stdout, repr(r.stdout)  # a command's colours kept...
    workspace.build_file("", 'genrule(name="p", outs=["p.txt"], cmd="printf \'step 1\\r\\033[2K\\033[1Astep 2'
                             '\\033[?25l\\n\'; printf \'\\033[1;33mwarn\\n\'; echo > $@")\n')
    r = workspace.build("--color", "always")  # ...but never its cursor movement (it went into CI logs)
    assert "step 1step 2" in r.stdout and not re.search(r"\x1b\[(2K|1A|\?25l)", r.stdout), repr(r.stdout)
    # and a colour it leaves on is reset before buildtool's next line (bold yellow until the end)
    assert "\x1b[1;33mwarn\x1b[0m\n" in r.stdout, repr(r.stdout)
    # (--color never: on a terminal, test_no_color_on_a_terminal; off one nothing is coloured anyway)


def _run_in_pty(ws: Workspace, *args: str, env_extra: dict[str, str], timeout: float = 60,
                size: tuple[int, int] = (24, 100)) -> tuple[int, str]:
    import fcntl
    import struct
    import termios

    env = _clean_env(ws.cache, ws.home)
    env.update({"CI": "", "TERM": "xterm", "COLUMNS": str(size[1]), **env_extra})
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
    p = subprocess.Popen([BUILDTOOL, *args], cwd=ws.root, env=env, stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:
                data = b""
            if not data:
                break
            chunks.append(data)
        elif p.poll() is not None:
            break
    os.close(master)
    rc = p.wait(timeout=10)
    return rc, b"".join(chunks).decode("utf-8", "replace")


def test_terminal_gets_a_live_multi_line_status_with_colors(workspace: Workspace) -> None:
    _ws(workspace)
    assert workspace.build().rc == 0  # records durations, for the ETA
    workspace.write("s.txt", "z\n")
    rc, out = _run_in_pty(workspace, "build", "-j", "2", env_extra={})
    assert rc == 0, out
    assert re.search(r"\[1/3\] ETA \d", out), out  # done/total and an ETA
    assert "running 2:" in out, out  # b and c run together, one line each
    assert re.search(r"\d\.\ds //:b", out) and re.search(r"\d\.\ds //:c", out), out
    assert "\x1b[J" in out  # the area is redrawn in place
    assert "\x1b[32m" in out  # colors
    assert "OK" in out.splitlines()[-1]


def test_a_console_pool_action_s_output_is_not_drawn_over(workspace: Workspace) -> None:
    """The live area went on being redrawn while a console-pool command wrote to the
    terminal: each line landed in the area and the next redraw erased it."""
    workspace.build_file("", 'genrule(name="con", outs=["c.txt"], pool="console", '
                             'cmd="for i in 1 2 3; do echo console-line-$$i; sleep 0.3; done; echo > $@")\n'
                             'genrule(name="other", outs=["o.txt"], cmd="sleep 1.2; echo > $@")\n')
    rc, out = _run_in_pty(workspace, "build", "-j", "2", env_extra={})
    assert rc == 0, out
    during = out[out.index("console-line-1"):out.index("console-line-3")]
    assert "\x1b[J" not in during and "running" not in during, repr(out)


def test_a_warning_during_a_build_goes_above_the_live_area(workspace: Workspace) -> None:
    """The runner's warnings were written into the live area (after a running target's
    label) and erased by its next redraw."""
    workspace.build_file("", 'genrule(name="slow", outs=["s.txt"], cmd="sleep 1; echo > $@")\n'
                             'genrule(name="gen", outs=["g.txt"], tools=["no-such-tool-xyz"], deps=[":first"],\n'
                             '        cmd="echo > $@")\n'
                             'genrule(name="first", outs=["f.txt"], cmd="sleep 0.3; echo > $@")\n')
    rc, out = _run_in_pty(workspace, "build", "-j", "2", env_extra={})
    assert rc == 0, out
    assert re.search(r"(\x1b\[J|\n)buildtool: warning: BUILD.py:2: //:gen: declared tool 'no-such-tool-xyz'",
                     out), repr(out)


def test_the_live_area_fits_a_narrow_terminal(workspace: Workspace) -> None:
    """A header wider than the terminal wrapped, and every redraw left a line behind."""
    workspace.build_file("", 'genrule(name="s", outs=["s.txt"], cmd="sleep 1; echo > $@")\n')
    rc, out = _run_in_pty(workspace, "build", env_extra={"NO_COLOR": "1"}, size=(24, 20))
    assert rc == 0, out
    heads = re.findall(r"\[0/1\][^\r\n\x1b]*", out)
    assert heads and all(len(h) < 20 for h in heads), heads


@pytest.mark.parametrize("how", ["NO_COLOR", "--color never"])
def test_no_color_on_a_terminal(workspace: Workspace, how: str) -> None:
    """On a terminal, where colours are the default (checked last), NO_COLOR or --color
    never leave them out, the command's own too (a compiler's -fdiagnostics-color=always
    passed through: "never" read as "not mine")."""
    _ws(workspace)
    args, env = (["--color", "never"], {}) if how == "--color never" else ([], {"NO_COLOR": "1"})
    rc, out = _run_in_pty(workspace, "build", "-j", "2", *args, env_extra=env)
    assert rc == 0, out
    assert "red warning" in out and not re.search(r"\x1b\[[0-9;]*m", out), repr(out)
    assert "\x1b[J" in out  # still a live status
    workspace.write("s.txt", "again\n")
    rc, out = _run_in_pty(workspace, "build", "-j", "2", env_extra={})
    assert rc == 0 and "\x1b[32mOK\x1b[0m" in out, repr(out)


def test_version_is_fast_to_import(tmp_path: Path) -> None:
    """``--version`` must not import the engine (measured with -X importtime)."""
    p = subprocess.run(["python3", "-X", "importtime", "-m", "buildtool", "--version"], capture_output=True,
                       text=True, timeout=60, check=True)
    heavy = {"buildtool.session", "buildtool.runner", "buildtool.graph", "buildtool.console", "blake3",
             "buildtool.simulate", "buildtool.profile"}
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in p.stderr.splitlines() if "|" in ln}
    assert not (heavy & imported), heavy & imported


def _with_closed_stdout(ws: Workspace, *args: str, unbuffered: bool) -> tuple[int, str]:
    """Run buildtool with a stdout pipe nobody reads from (``buildtool ... | head -0``),
    its stdout buffered (Python's default for a pipe) or not (``PYTHONUNBUFFERED``)."""
    env = _clean_env(ws.cache, ws.home)
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    r, w = os.pipe()
    os.close(r)  # every write to w fails with EPIPE
    try:
        p = subprocess.run([BUILDTOOL, *args], cwd=ws.root, env=env, stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(w)
    return p.returncode, p.stderr


@pytest.mark.parametrize("unbuffered", [False, True])
def test_a_closed_stdout_drops_the_output_not_the_build(workspace: Workspace, unbuffered: bool) -> None:
    workspace.build_file("", "\n".join(
        f'genrule(name="t{i}", outs=["o{i}"], cmd="echo {i} > $@")' for i in range(20)))
    rc, err = _with_closed_stdout(workspace, "build", "-j2", unbuffered=unbuffered)
    assert rc == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert [workspace.read(f"o{i}") for i in range(20)] == [f"{i}\n" for i in range(20)]
    rc, err = _with_closed_stdout(workspace, "build", unbuffered=unbuffered)  # the no-op answer
    assert (rc, err) == (0, "")
    workspace.build_file("", 'genrule(name="bad", outs=["x"], cmd="exit 3")\n'
                             'test(name="ok", cmd="true")\ntest(name="no", cmd="exit 1")')
    rc, err = _with_closed_stdout(workspace, "build", unbuffered=unbuffered)
    assert rc == 1, err  # the build's own status, as with a terminal
    assert "Traceback" not in err, err
    junit = workspace.root / "r" / "junit.xml"
    rc, err = _with_closed_stdout(workspace, "test", "//:ok", "//:no", "--junit", str(junit), unbuffered=unbuffered)
    assert rc == 1 and "Traceback" not in err, (rc, err)  # a test failed: its own status
    assert 'name="//:no"' in junit.read_text()


@pytest.mark.parametrize("unbuffered", [False, True])
def test_a_closed_stdout_ends_a_listing_quietly(workspace: Workspace, unbuffered: bool) -> None:
    workspace.build_file("", 'genrule(name="t", outs=["o"], cmd="echo > $@")')
    for args in (("graph",), ("query", "deps(//...)"), ("explain",), ("cache", "stats"), ("cache", "gc")):
        rc, err = _with_closed_stdout(workspace, *args, unbuffered=unbuffered)
        assert rc == 141, (args, rc, err)  # 128 + SIGPIPE
        assert err == "", (args, err)


def test_a_listing_whose_reader_leaves_halfway_exits_141(workspace: Workspace) -> None:
    """`buildtool query //... | head -2`: the pipe took the first 64 KiB of one large write,
    and the rest was dropped without an error (exit 0, the listing cut short unsaid)."""
    workspace.build_file("", "\n".join(
        f'genrule(name="target_with_a_long_name_{i:05d}_{"x" * 40}", outs=["o{i}"], cmd="touch $@")'
        for i in range(3000)))
    for args in (("query", "//..."), ("graph",), ("graph", "--format", "json")):
        p = subprocess.run(["bash", "-c", '"$0" "$@" | head -c 100 > /dev/null; exit "${PIPESTATUS[0]}"',
                            BUILDTOOL, *args], cwd=workspace.root, capture_output=True, text=True, timeout=120,
                           check=False)
        assert p.returncode == 141, (args, p.returncode, p.stderr)
        assert p.stderr == "", (args, p.stderr)


def test_strip_controls_keeps_text_and_is_linear() -> None:
    from buildtool.console import strip_controls

    assert strip_controls("a\x1b[31mb\x1b[0m\r\nc\td\x07e\x7f\x00\x1b]0;title\x07f") == "ab\nc\tdef"
    # Every shape of escape goes, under --color always too (but colours, kept whole there):
    # ESC 7/8, ESC c, ESC ( B, private CSI parameters, a lone ESC left their ESC behind.
    odd = "\x1b7a\x1b8\x1bc\x1b#8\x1b(B\x1b[>4;2m\x1b[?25lb\x1b"
    assert strip_controls(odd) == "ab" and strip_controls(odd, keep_colors=True) == "ab"
    assert strip_controls("\x1b[1;33mw\x1b[0m\x1b[2K", keep_colors=True) == "\x1b[1;33mw\x1b[0m"
    # C1 controls, as UTF-8 in a command's output: CSI U+009B (a clear screen), NEL, OSC
    # U+009D ... ST U+009C went through off a terminal; other Latin-1 text stays.
    assert strip_controls("a\u009b2J b\u0085 c\u009d0;title\u009c d caf\u00e9\u00a0") == "a b c d caf\u00e9\u00a0"
    # A failing command's 11 MB log: one regex pass, not a Python loop per character (which
    # took seconds and ~10x the text in memory). Bounded by operations, not by time: the
    # per-character generator would need millions of Python-level steps, visible as a
    # profile's call count.
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.runcall(strip_controls, "0123456789\n" * 1_000_000)
    assert pstats.Stats(prof).total_calls < 1000  # type: ignore[attr-defined]


@pytest.mark.parametrize("args", [("build", "-n", "--explain"), ("query", "//...")])
def test_a_non_blocking_stdout_loses_nothing(workspace: Workspace, args: tuple[str, ...]) -> None:
    """A CI runner may hand over a pipe in O_NONBLOCK mode: a write to it while full fails
    with EAGAIN (which Python's print drops without a word).  buildtool makes it blocking,
    so a slow reader gets every line."""
    workspace.build_file("", "for i in range(3000):\n"
                             "    genrule(name=f'target_with_a_long_name_{i}', outs=[f'o{i}'], cmd='echo > $@')\n")
    r, w = os.pipe()
    os.set_blocking(w, False)
    env = _clean_env(workspace.cache, workspace.home)
    p = subprocess.Popen([BUILDTOOL, *args], cwd=workspace.root, env=env, stdout=w, stderr=subprocess.PIPE)
    os.close(w)
    time.sleep(1.0)  # the pipe (64 KiB) fills while nobody reads
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    assert p.wait(timeout=60) == 0
    lines = [ln for ln in data.split(b"\n") if ln.startswith(b"//:target_with")]
    assert len(data) > 65536 and len(lines) == 3000, len(data)
    assert b"output is lost" not in p.stderr.read()


def test_summary_lines_say_one_target_in_the_singular(workspace: Workspace) -> None:
    """"OK: 1 target", not "1 targets", in the build's summary, the no-op's line and
    explain's count."""
    workspace.write("s.txt", "x\n")
    workspace.build_file("", 'genrule(name="a", srcs=["s.txt"], outs=["a.out"], cmd="cat $< > $@")\n')
    ci = {"CI": ""}
    rc, out, err = workspace.run("build", env_extra=ci)
    assert rc == 0 and out.splitlines()[-1].startswith("OK: 1 target: 1 ran"), out + err
    rc, out, err = workspace.run("build", env_extra=ci)
    assert rc == 0 and out.splitlines()[-1].startswith("OK: 1 target: 1 up_to_date"), out + err
    for _ in range(5):  # (the no-op's own line, once the snapshot can vouch: files older than a clock tick)
        if "(nothing changed)" in out:
            break
        time.sleep(0.2)
        rc, out, err = workspace.run("build", env_extra=ci)
    assert rc == 0 and out.startswith("OK: 1 target: 1 up_to_date in ") and "(nothing changed)" in out, out + err
    rc, out, err = workspace.run("explain", "//:a", env_extra=ci)
    assert rc == 0 and "explain: 1 target: 1 up to date" in out, out + err
    workspace.build_file("", 'genrule(name="a", srcs=["s.txt"], outs=["a.out"], cmd="cat $< > $@")\n'
                             'genrule(name="b", srcs=["s.txt"], outs=["b.out"], cmd="cat $< > $@")\n')
    rc, out, err = workspace.run("build", env_extra=ci)
    assert rc == 0 and out.splitlines()[-1].startswith("OK: 2 targets: 1 ran, 1 unchanged"), out + err


def test_print_directory_names_where_a_command_ran_around_its_output(workspace: Workspace) -> None:
    """-w, as make -w: a compiler's messages name files relative to the package directory
    the command ran in, which an editor reading the log could not find from the root."""
    workspace.build_file("core", """
        genrule(name="warn", outs=["w"], cmd="echo 'eval.c:10: warning: x' >&2; echo > $@")
        genrule(name="bad", srcs=[":warn"], outs=["b"], cmd="echo 'eval.c:12: error' >&2; false")
        genrule(name="quiet", outs=["q"], cmd="echo > $@")
        """)
    where = f"'{workspace.root / 'core'}'"
    rc, out, _ = workspace.run("build", "-w", "-k", "//core:all")
    assert rc == 1, out
    lines = out.splitlines()
    for message in ("eval.c:10: warning: x", "eval.c:12: error"):
        i = lines.index(message)
        assert lines[i - 1] == f"buildtool: Entering directory {where}", out
        assert lines[i + 1] == f"buildtool: Leaving directory {where}", out
    assert out.count("Entering directory") == 2, out  # (not around the quiet command's nothing)
    rc, out, _ = workspace.run("build", "//core:all")
    assert rc == 1 and "eval.c:12: error" in out and "directory" not in out, out
    workspace.build_file("core", "test(name=\"t\", cmd=\"echo 't.c:3: note'\")\n")  # (a pass's log was not wrapped)
    rc, out, _ = workspace.run("test", "-w", "--test-output", "all", "//core:t")
    lines = out.splitlines()
    i = lines.index("t.c:3: note")
    assert rc == 0 and lines[i - 1] == f"buildtool: Entering directory {where}", out
    assert lines[i + 1] == f"buildtool: Leaving directory {where}", out


def test_a_running_label_too_long_for_the_terminal_keeps_its_end(workspace: Workspace) -> None:
    """Cut at the right edge, three targets of one long package read the same:
    "0.3s //a_very_long_packa" three times."""
    pkg = "a_very_long_package_name_for_testing_width"
    workspace.build_file(pkg, "\n".join(f'genrule(name="target_with_a_long_name_{i}", outs=["{i}"], '
                                        'cmd="sleep 1; echo > $@")' for i in range(3)))
    rc, out = _run_in_pty(workspace, "build", "-j3", env_extra={"NO_COLOR": "1"}, size=(24, 40))
    assert rc == 0, out
    for i in range(3):
        assert re.search(rf" //a_very\.\.\.[a-z_]*_long_name_{i}[\r\n\x1b]", out), out


def test_elide_middle() -> None:
    from buildtool.console import elide_middle

    assert elide_middle("//pkg:t", 20) == "//pkg:t"
    assert elide_middle("//abcdefghijklmnopqrstuvwxyz:target", 20) == "//abc...vwxyz:target"
    assert len(elide_middle("x" * 100, 20)) == 20 and elide_middle("x" * 100, 5) == "xxxxx"


def _slow_packages(ws: Workspace, n: int, extra: dict[int, str]) -> None:
    for i in range(n):
        ws.build_file(f"p{i}", "import time\ntime.sleep(0.15)\n"
                               f'genrule(name="t", outs=["o{i}.txt"], cmd="echo > $@")\n' + extra.get(i, ""))


def test_a_terminal_is_told_which_build_py_is_evaluated_and_the_line_goes_before_other_output(
        workspace: Workspace) -> None:
    """Evaluating the BUILD.py files of a large workspace printed nothing at all, even on a
    terminal (seconds at 50,000 targets): a line says how many were evaluated and which one
    is now, and is erased before a BUILD.py's print, a warning, an error or the build's lines."""
    _slow_packages(workspace, 8, {5: 'print("hi-from-build")\n',
                                  6: 'import sys\nsys.stderr.write("err-from-build\\n")\n'})
    rc, out = _run_in_pty(workspace, "build", "//...", env_extra={})
    assert rc == 0, out
    assert re.search(r"\rloading: \d/8 BUILD\.py files evaluated, now //p\d\x1b\[K", out), repr(out)
    plain = re.sub(r"\x1b\[[\d;]*m", "", out)  # (colours)
    for text in ("hi-from-build", "err-from-build", "[0/8]"):  # each at the start of a line
        at = plain.index(text)
        assert plain[:at].endswith(("\r\x1b[K", "\n")), repr(out)
    assert "loading:" not in out.splitlines()[-1]
    # an error after the line was drawn starts a line of its own
    _slow_packages(workspace, 8, {7: "raise ValueError('bad-p7')\n"})
    rc, out = _run_in_pty(workspace, "build", "//...", env_extra={})
    assert rc == 2 and "loading:" in out, repr(out)
    plain = re.sub(r"\x1b\[[\d;]*m", "", out)
    at = plain.index("buildtool: error")
    assert plain[:at].endswith(("\r\x1b[K", "\n")) and "bad-p7" in out, repr(out)
    # a pattern of some packages: no total (the workspace's would read as "5/50,000")
    _slow_packages(workspace, 8, {})
    rc, out = _run_in_pty(workspace, "build", *(f"//p{i}/..." for i in range(1, 8)), env_extra={})
    assert "loading:" in out and not re.search(r"loading: \d+/", out), repr(out)
    # off a terminal: no such line
    r = workspace.build("//...")
    assert r.rc == 0 and "loading:" not in r.stdout + r.stderr, r.stderr


def test_the_eta_learns_from_the_commands_that_ran_and_counts_the_plan_only() -> None:
    """A first build's unknown targets count 1 s each: 30,000 of ~4 ms said "ETA 3h45m" and
    never corrected itself; and each redraw summed every target of the graph (a 30,000-target
    build was 3.6x slower on a terminal).  Targets outside the plan are never waited for."""
    import io
    import types

    from buildtool.console import Console
    from buildtool.outcome import Outcome, Reason, Status

    targets = [types.SimpleNamespace(label=f"//p:t{i}", pool=None, pkg="p", kind="genrule", outs=())
               for i in range(1000)]
    graph = types.SimpleNamespace(targets=targets)
    c = Console(graph, 900, io.StringIO(), tty=False)  # type: ignore[arg-type]
    c.estimate([1.0] * 1000, 2, set(range(900)))  # (the last 100: not in this build's plan)
    assert c.eta(0.0) == 450.0
    for t in range(10):
        c.target_finished(t, Outcome(Status.RAN, Reason.NEW, "ran", duration=0.004))
    eta = c.eta(0.0)
    assert eta is not None and abs(eta - 890 * 0.004 / 2) < 1e-6, eta
    c.running[10] = 100.0  # (running for 1 s at now=101: its scaled 4 ms are long spent)
    eta = c.eta(101.0)
    assert eta is not None and abs(eta - 889 * 0.004 / 2) < 1e-6, eta
    # ... so the ETA is a lower bound, said with a "+" (a long command read "ETA 0s" for minutes)
    assert c.overdue(101.0) and not c.overdue(100.001)
    assert c.status_lines(101.0, 80)[0].startswith("[10/900] ETA 1.8s+ running 1:"), c.status_lines(101.0, 80)


def test_after_a_failure_unstarted_targets_get_no_line_and_the_failures_are_named_last(
        workspace: Workspace) -> None:
    """82 `skipped`/`cancelled` lines pushed a compile error off the screen, and the summary
    did not name what failed: Ninja prints neither kind, and its last line says it stopped."""
    lines = ['genrule(name="bad", outs=["bad.txt"], cmd="echo bad.c:1: error: nope >&2; exit 1")',
             'genrule(name="bad2", outs=["bad2.txt"], cmd="exit 3")']
    lines += [f'genrule(name="d{i}", deps=[":bad"], outs=["d{i}.txt"], cmd="touch $@")' for i in range(20)]
    workspace.build_file("", "\n".join(lines) + "\n")
    r = workspace.build("-j1", "-k", env_extra={"CI": ""})
    assert r.rc == 1 and "skipped" not in r.stdout.replace("20 skipped", ""), r.stdout
    tail = r.stdout.splitlines()[-3:]
    assert tail == ["failed //:bad (BUILD.py:1): exited with status 1",
                    "failed //:bad2 (BUILD.py:2): exited with status 3",
                    tail[-1]] and tail[-1].startswith("FAILED: 22 targets: 2 failed, 20 skipped"), r.stdout
    assert len(r.with_status("skipped")) == 20  # (the events still hold every one)
    r = workspace.build("-j1", "-k", "-v", env_extra={"CI": ""})
    assert r.stdout.count(" skipped //:d") == 20, r.stdout  # (-v lists them)


def test_up_to_date_targets_settled_while_a_command_runs_do_not_each_redraw_the_area(
        workspace: Workspace) -> None:
    """Each settled target cleared and redrew the live area: 65 redraws in a 0.07 s build,
    a flicker on a slow terminal or over ssh.  Those that print nothing are counted at the
    next redraw, at most every REDRAW_S (the ticker's too)."""
    lines = ['genrule(name="slow", srcs=["s.txt"], outs=["slow.out"], cmd="sleep 1.5; cat s.txt > $@")',
             'genrule(name="gate", srcs=["s.txt"], outs=["gate.out"], cmd="sleep 0.3; echo same > $@")']
    lines += [f'genrule(name="t{i}", srcs=["s{i}.txt"], deps=[":gate"], outs=["t{i}.out"], cmd="cp s{i}.txt $@")'
              for i in range(300)]
    workspace.build_file("", "\n".join(lines) + "\n")
    for i in range(300):
        workspace.write(f"s{i}.txt", f"{i}\n")
    workspace.write("s.txt", "one\n")
    assert workspace.build().rc == 0
    workspace.write("s.txt", "two\n")  # //:gate reruns to the same output: the 300 are checked while //:slow runs
    ev = str(workspace.root / "ev.jsonl")  # (--events: every target checked, none left to the snapshot)
    rc, out = _run_in_pty(workspace, "build", "-j", "2", "--events", ev, env_extra={})
    assert rc == 0 and "OK: 302 targets: 2 ran, 300 up_to_date" in re.sub(r"\x1b\[[0-9;]*m", "", out), out
    assert out.count("\x1b[J") < 60, out.count("\x1b[J")



def _fake_console(n: int, *, verbose: bool = False) -> tuple[Any, io.StringIO]:
    import types

    from buildtool.console import Console

    targets = [types.SimpleNamespace(label=f"//p:t{i}", pool=None, pkg="p", kind="genrule", outs=(),
                                     cmd=f"sleep {i}", fn=None) for i in range(n)]
    out = io.StringIO()
    return Console(types.SimpleNamespace(targets=targets), n, out, tty=False, verbose=verbose), out  # type: ignore[arg-type]


def test_off_a_terminal_a_long_running_target_is_named_at_30s_then_at_each_doubling() -> None:
    """A hung command in CI was silence until the job's time limit killed it, with nothing
    in the log saying what it waited for (Bazel prints "still waiting" progress lines)."""
    from buildtool.outcome import Outcome, Reason, Status

    c, out = _fake_console(3, verbose=True)
    try:
        c.target_started(0, 0)
        c.target_started(1, 1)
        t0 = c.running[0]
        c.running[1] = t0 + 10  # (started 10 s after the first)
        c._still_due[1] = t0 + 40
        c.still_running(t0 + 29.9)
        assert out.getvalue() == ""
        c.still_running(t0 + 30.5)
        assert out.getvalue().splitlines() == ["[0/3] still running //p:t0 (30.5s)", "command (in //p): sleep 0"]
        c.still_running(t0 + 45)  # (t0 not again before 61 s; t1 at its 30 s)
        assert out.getvalue().splitlines()[2:] == ["[0/3] still running //p:t1 (35.0s)", "command (in //p): sleep 1"]
        c.target_finished(1, Outcome(Status.RAN, Reason.NEW, "ran", duration=40.0))
        c.still_running(t0 + 500)  # (t1 finished: not named; t0 once, its command not again)
        lines = out.getvalue().splitlines()
        assert lines[4:] == ["[1/3] ran //p:t1 (40.00s)", "command (in //p): sleep 1",
                             "[1/3] still running //p:t0 (8m20s)"], lines
        c.still_running(t0 + 900)  # (next at 1000 s)
        assert len(out.getvalue().splitlines()) == 7
    finally:
        c.close()


def test_off_a_terminal_the_ticker_names_a_long_running_target_without_verbose(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from buildtool import console

    monkeypatch.setattr(console, "STILL_RUNNING_S", 0.3)
    c, out = _fake_console(1)
    try:
        c.target_started(0, 0)
        deadline = time.monotonic() + 10
        while "still running" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.getvalue().startswith("[0/1] still running //p:t0 ("), out.getvalue()
        assert "command" not in out.getvalue()
    finally:
        c.close()
