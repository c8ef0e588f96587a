"""The CLI's plain-build shortcut: the arguments it builds without argparse are exactly
the parser's, and whatever the parser would treat differently is left to the parser."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from buildtool.cli import _parse, _plain_build

HEADS = [[], ["build"], ["-C", "ws", "build"], ["-C", "ws", "-C", "sub", "build"], ["-C", "-x", "build"], ["-C"],
         ["test"], ["--color", "never", "build"]]
WORDS = ["build", "-C", "ws", "-j", "-j2", "-j0", "2", "0", "--jobs", "--jobs=3", "--cache-dir", "--cache-dir=/c",
         "/d", "//...", "//a:b", ":c", "-x", "-k", "--", "", "-", "--explain", "\u0663", "\u00b2"]


def _parsed(argv: list[str]) -> dict[str, object] | None:
    """vars() of the real parser's result, None where it exits (an error or --help)."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return vars(_parse(argv))
        except SystemExit:
            return None


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(HEADS), st.lists(st.sampled_from(WORDS), max_size=6))
@example(["build"], [])
@example(["-C", "ws", "build"], ["//...", "-j", "2", "--cache-dir", "/d"])
@example(["build"], ["//a:b", ":c", "-j2", "--cache-dir=/c", "--jobs=3"])
@example(["build"], ["-j", "2", "//a:b", ":c"])
@example(["build"], ["//a:b", "-j", "2", ":c"])
def test_a_plain_build_parses_as_the_parser_does(head: list[str], tail: list[str]) -> None:
    argv = head + tail
    args = _plain_build(argv)
    if args is not None:
        assert vars(args) == _parsed(argv)


@pytest.mark.parametrize("argv", [["build", "--jobs=\u0663", "a"], ["build", "-j\u0663"], ["build", "-j", "1_0"]])
def test_a_count_in_other_digits_is_refused_by_both_paths(argv: list[str]) -> None:
    """int() (and so argparse's type=int) read any decimal digit and '1_0' as 10."""
    assert _plain_build(argv) is None and _parsed(argv) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["build"],
        ["-C", "ws", "build", "//...", "-j", "2", "--cache-dir", "/c"],
        ["build", "a", "b", "-j3"],
    ],
)
def test_common_plain_builds_take_the_shortcut(argv: list[str]) -> None:
    args = _plain_build(argv)
    assert args is not None and vars(args) == _parsed(argv)


def test_each_shortcut_gets_its_own_lists() -> None:
    a, b = _plain_build(["build"]), _plain_build(["build"])
    assert a is not None and b is not None
    assert a.action_env is not b.action_env and a.patterns is not b.patterns


@pytest.mark.parametrize(("argv", "said"), [
    (["-k", "build"], "-k goes after the command: buildtool build -k ..."),
    (["-j", "4", "build"], "-j goes after the command: buildtool build -j ..."),  # (was "invalid choice: '4'")
    (["-C", "ws", "--cache-dir=/c", "test"], "--cache-dir=/c goes after the command: buildtool test --cache-dir=/c"),
    (["run", "-C", "app", ":app"], "(-C DIR goes before the command: buildtool -C DIR run ...)"),
])
def test_an_option_on_the_wrong_side_of_the_command_says_where_it_goes(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Make and Ninja take `-k` and `-j 4` anywhere: `buildtool -k build` said that `build`
    did not recognise -k, one of its options."""
    with pytest.raises(SystemExit) as e:
        _parse(argv)
    assert e.value.code == 2 and said in capsys.readouterr().err


def test_watch_help_does_not_offer_the_dry_run_it_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, offered in ((["watch", "--help"], False), (["build", "--help"], True)):
        with pytest.raises(SystemExit):
            _parse(argv)
        assert ("--dry-run" in capsys.readouterr().out) is offered, argv
    with pytest.raises(SystemExit):  # (still parsed, for the error that says why not)
        _parse(["watch", "-n", "--help"])


def test_ninja_s_keep_going_count_says_there_is_none(capsys: pytest.CaptureFixture[str]) -> None:
    """`build -k 0 //...` said "a label must start with '//' or ':' (got '0')"."""
    with pytest.raises(SystemExit) as e:
        _parse(["build", "-k", "0", "//..."])
    assert e.value.code == 2 and "-k takes no count: it keeps going past every failure" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(["build", "-k0", "//..."])  # (argparse: "ignored explicit argument '0'")
    assert "-k takes no count" in capsys.readouterr().err
    assert _parse(["build", "-k", "//..."]).keep_going is True
    assert _parse(["run", "//:t", "--", "-k", "3"]).args == ["-k", "3"]


@pytest.mark.parametrize("command", [["build"], ["cache", "stats"], ["cache", "gc", "--max-size", "1G"]])
def test_a_deleted_working_directory_is_exit_2_said_in_one_line(tmp_path: Path, command: list[str]) -> None:
    """`cache gc`/`stats` in a directory deleted under the shell (a CI step after its
    checkout was removed) raised FileNotFoundError with a traceback, exit 1."""
    from conftest import BUILDTOOL, _clean_env

    gone = tmp_path / "gone"
    gone.mkdir()
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    p = subprocess.run(["sh", "-c", script, "sh", str(gone), BUILDTOOL, *command], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr == ("buildtool: error: the current directory no longer exists (deleted after the shell "
                        "entered it): cd to the workspace again\n"), p.stderr


def test_minus_c_from_a_deleted_working_directory_builds_a_pyrule_below_the_root(tmp_path: Path) -> None:
    """`make -C DIR` works from a deleted directory; `buildtool -C DIR build` did too, but
    every pyrule below the root failed "could not start the command" (the relative path
    from its package to the root was worked out by os.getcwd())."""
    from conftest import BUILDTOOL, _clean_env

    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "buildtool.toml").write_text("")
    (ws / "pkg" / "gen.py").write_text("def make(srcs, outs):\n    open(outs[0], 'w').write('made')\n")
    (ws / "pkg" / "BUILD.py").write_text('pyrule(name="p", fn="pkg.gen:make", outs=["o.txt"])\n')
    gone = tmp_path / "gone"
    gone.mkdir()
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    p = subprocess.run(["sh", "-c", script, "sh", str(gone), BUILDTOOL, "-C", str(ws), "build"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (ws / "pkg" / "o.txt").read_text() == "made"


def test_a_console_command_of_a_build_started_with_stdout_closed_gets_dev_null(tmp_path: Path) -> None:
    """`buildtool build >&-`: buildtool took /dev/null for its stdout, but opened it
    close-on-exec, so a console-pool command, which inherits the terminal's descriptors,
    started with none: `echo` failed (I/O error) and so did the build."""
    from conftest import BUILDTOOL, _clean_env

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "buildtool.toml").write_text("")
    (ws / "BUILD.py").write_text('genrule(name="t", outs=["o"], pool="console", cmd="echo hi && touch $@")\n')
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    p = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", BUILDTOOL, "-C", str(ws), "build"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and (ws / "o").exists(), p.stderr


def test_minus_c_takes_a_directory_named_with_a_leading_dash_and_a_file_is_said_to_be_one(tmp_path: Path) -> None:
    """`make -C -mk` and `git -C -dir` take the next word as the directory; argparse took
    `-lead` for an option ("expected one argument").  `-C a.txt` said "directory 'a.txt' is
    not a directory"."""
    from conftest import BUILDTOOL, _clean_env

    ws = tmp_path / "-lead"
    ws.mkdir()
    (ws / "buildtool.toml").write_text("")
    (ws / "BUILD.py").write_text('genrule(name="g", outs=["o.txt"], cmd="echo ok > $@")\n')
    (tmp_path / "a.txt").write_text("")
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    for argv in (["-C", "-lead", "build"], ["-C", "-lead", "-C", ".", "build", "--explain"]):
        p = subprocess.run([BUILDTOOL, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
    assert (ws / "o.txt").read_text() == "ok\n"
    p = subprocess.run([BUILDTOOL, "-C", "a.txt", "build"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr == "buildtool: error: 'a.txt' is not a directory\n", p.stderr


def test_a_workspace_marker_linked_to_dev_null_marks_the_root_with_no_configuration(tmp_path: Path) -> None:
    """user-guide.md: "a link to /dev/null, masking a config, reads as empty"; for
    buildtool.toml, the marker, it was "not a regular file", exit 2."""
    from conftest import BUILDTOOL, _clean_env

    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "buildtool.toml").symlink_to("/dev/null")
    (ws / "sub" / "BUILD.py").write_text('genrule(name="g", outs=["o.txt"], cmd="echo ok > $@")\n')
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    for _ in range(2):  # (the second: the no-op path)
        p = subprocess.run([BUILDTOOL, "build", "//..."], cwd=ws / "sub", env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
    assert (ws / "sub" / "o.txt").read_text() == "ok\n"


def test_minus_c_takes_a_directory_named_double_dash(tmp_path: Path) -> None:
    """`-C --` became `-C=--`, whose value argparse drops: a TypeError traceback, exit 1."""
    from conftest import BUILDTOOL, _clean_env

    ws = tmp_path / "--"
    ws.mkdir()
    (ws / "buildtool.toml").write_text("")
    (ws / "BUILD.py").write_text('genrule(name="g", outs=["o.txt"], cmd="echo ok > $@")\n')
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    for argv in (["-C", "--", "build"], ["-C=--", "build", "--explain"]):
        p = subprocess.run([BUILDTOOL, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
    assert (ws / "o.txt").read_text() == "ok\n"


def test_a_nested_workspace_marked_by_a_link_to_dev_null_is_fenced_off(tmp_path: Path) -> None:
    """Discovery skipped inner/ (a buildtool.toml by name), but a label into it loaded it
    (its marker was not a regular file): two workspaces owned its outputs."""
    from conftest import BUILDTOOL, _clean_env

    ws = tmp_path / "ws"
    (ws / "inner" / "pkg").mkdir(parents=True)
    (ws / "buildtool.toml").write_text("")
    (ws / "inner" / "buildtool.toml").symlink_to("/dev/null")
    (ws / "inner" / "pkg" / "BUILD.py").write_text('genrule(name="x", outs=["x.txt"], cmd="echo x > $@")\n')
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    p = subprocess.run([BUILDTOOL, "build", "//inner/pkg:x"], cwd=ws, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "nested workspace" in p.stderr, p.stdout + p.stderr
    p = subprocess.run([BUILDTOOL, "build", "//pkg:x"], cwd=ws / "inner", env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_cache_commands_outside_a_workspace_take_a_cache_under_a_dot_buildtool_directory(tmp_path: Path) -> None:
    """With no workspace there is no state directory to protect: `cache stats --cache-dir
    .buildtool/c` from ~ was refused as "inside this workspace's state directory"."""
    from conftest import BUILDTOOL, _clean_env

    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    p = subprocess.run([BUILDTOOL, "cache", "stats", "--cache-dir", ".buildtool/c"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_minus_j_0_says_how_to_ask_for_no_limit(tmp_path: Path) -> None:
    """Ninja's -j 0 is "no limit": a Ninja user's -j0 is told what to write here."""
    from conftest import BUILDTOOL, _clean_env

    (tmp_path / "buildtool.toml").write_text("")
    p = subprocess.run([BUILDTOOL, "build", "-j0"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env=_clean_env(tmp_path / "cache", tmp_path / "home"))
    assert p.returncode == 2 and p.stderr.strip().endswith(
        "-j must be from 1 to 4096 (got 0); for no limit, as Ninja's -j 0, give -j 4096"), p.stderr
