"""Session: when a build lets the cycle collector run (in-process, a real workspace)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from conftest import Workspace

from buildtool.errors import UserError
from buildtool.session import BuildRequest, Session


class GcProbe:
    """An observer noting whether the cycle collector is on at each point it is called."""

    def __init__(self) -> None:
        self.at_start: bool | None = None
        self.during: list[bool] = []

    def started(self, graph: object, sched: object) -> None:
        self.at_start = gc.isenabled()

    def target_started(self, t: int, lane: int) -> None:
        self.during.append(gc.isenabled())

    def target_finished(self, t: int, o: object) -> None:
        self.during.append(gc.isenabled())


def _workspace(root: Path, build_py: str) -> Path:
    root.mkdir()
    (root / "buildtool.toml").write_text("")
    (root / "a.txt").write_text("a\n")
    (root / "BUILD.py").write_text(build_py)
    return root


def test_collector_off_while_loading_on_while_scheduling(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(tmp_path / "cache"))
    ws = _workspace(tmp_path / "ws", 'genrule(name="b", srcs=["a.txt"], outs=["b.txt"], cmd="cp $< $@")\n')
    session = Session(str(ws))
    probe = GcProbe()
    session.observer = probe
    assert gc.isenabled()
    session.build(BuildRequest(patterns=["//:b"]))
    assert probe.at_start is False  # graph, record and stat cache loaded without collections
    assert probe.during and all(probe.during)
    assert gc.isenabled() and gc.get_freeze_count() == 0  # as it was, nothing left frozen
    assert (ws / "b.txt").read_text() == "a\n"


def test_collector_restored_after_a_load_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(tmp_path / "cache"))
    ws = _workspace(tmp_path / "ws", 'genrule(name="b", srcs=["missing.txt"], outs=["b.txt"], cmd="cp $< $@"\n')
    with pytest.raises(UserError):
        Session(str(ws)).build(BuildRequest(patterns=["//:b"]))
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:  # a caller that keeps it off (the one-shot command line) gets it back off
        with pytest.raises(UserError):
            Session(str(ws)).build(BuildRequest(patterns=["//:b"]))
        assert not gc.isenabled()
    finally:
        gc.enable()


def _spy_on_predictions(monkeypatch: pytest.MonkeyPatch) -> list[list[bool]]:
    """What each later call of session.predict_fresh returns, in order."""
    from buildtool import session as session_mod

    seen: list[list[bool]] = []
    real = session_mod.predict_fresh

    def spy(*args: object) -> list[bool]:
        got = real(*args)  # type: ignore[arg-type]
        seen.append(got)
        return got

    monkeypatch.setattr(session_mod, "predict_fresh", spy)
    return seen


@pytest.mark.parametrize("change", ["nothing", "timeout", "module", "x-bit"])
def test_a_test_s_timeout_and_a_pyrule_s_module_are_part_of_the_freshness_guess(
    tmp_path: Path, monkeypatch, change: str,
) -> None:
    """Each of these reruns its target (it is in the key), but the guess called the target
    fresh, so it weighed ~0 and started after everything else.  (A chmod of a source was
    seen: it moves the ctime, so the stat cache vouches for nothing.)"""
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(tmp_path / "cache"))
    rules = ('test(name="t", srcs=["a.txt"], cmd="true", timeout=30)\n'
             'pyrule(name="py", fn="mod:make", srcs=["a.txt"], outs=["py.out"])\n'
             'genrule(name="cp", srcs=["s.sh"], outs=["c.sh"], cmd="cp $< $@")\n')
    ws = _workspace(tmp_path / "ws", rules)
    (ws / "mod.py").write_text("def make(srcs, outs):\n    open(outs[0], 'w').write('x')\n")
    (ws / "s.sh").write_text("echo\n")
    import time

    time.sleep(0.2)  # (files older than the stat cache's racy window: their digests are vouched for)
    Session(str(ws)).build(BuildRequest(patterns=["//...", "//:py", "//:cp"], mode="test"))
    seen = _spy_on_predictions(monkeypatch)
    if change == "timeout":
        (ws / "BUILD.py").write_text(rules.replace("timeout=30", "timeout=20"))
    else:
        (ws / "BUILD.py").write_text(rules + "# evaluated again\n")
    if change == "module":
        (ws / "mod.py").write_text("def make(srcs, outs):\n    open(outs[0], 'w').write('y')\n")
    if change == "x-bit":
        (ws / "s.sh").chmod(0o755)
    result = Session(str(ws)).build(BuildRequest(patterns=["//...", "//:py", "//:cp"], mode="test"))
    assert seen, "the weights were not predicted"
    fresh = {t.label: seen[0][t.id] for t in result.graph.targets}
    assert fresh == {"//:t": change != "timeout", "//:py": change != "module", "//:cp": change != "x-bit"}, fresh


@pytest.mark.parametrize("change", ["nothing", "command", "header"])
def test_critical_path_weights_predict_what_is_fresh(tmp_path: Path, monkeypatch, change: str) -> None:
    """A recorded target with the same command and inputs, sources unchanged, weighs ~0;
    one whose command changed keeps its weight.  A depfile target's recorded inputs hold
    the headers it found: it was never predicted fresh; then a header edit was not seen,
    and the compile that reruns for it weighed ~0 (it started last)."""
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(tmp_path / "cache"))
    rules = ('genrule(name="obj", srcs=["a.txt"], outs=["a.o"], depfile="a.d", '
             'cmd="printf \'a.o: a.txt h.txt\\\\n\' > a.d && cat a.txt h.txt > $@")\n'
             'genrule(name="plain", srcs=["a.txt"], outs=["p.txt"], cmd="cp $< $@")\n')
    ws = _workspace(tmp_path / "ws", rules)
    (ws / "h.txt").write_text("h\n")
    import time

    time.sleep(0.2)  # (sources older than the stat cache's racy window: their digests are vouched for)
    Session(str(ws)).build(BuildRequest(patterns=["//..."]))
    seen = _spy_on_predictions(monkeypatch)
    edited = rules.replace("cp $< $@", "cp $< $@ && true") if change == "command" else rules + "# evaluated again\n"
    (ws / "BUILD.py").write_text(edited)
    if change == "header":
        (ws / "h.txt").write_text("h2\n")
    result = Session(str(ws)).build(BuildRequest(patterns=["//..."]))
    assert seen, "the weights were not predicted"
    graph = result.graph
    fresh = {t.label: seen[0][t.id] for t in graph.targets}
    assert fresh == {"//:obj": change != "header", "//:plain": change != "command"}, fresh


def test_an_interrupt_before_the_scheduler_leaves_a_line_per_target_in_the_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the events file's header, before the scheduler took the signals over
    (1,500 tests: their sessions are set up there): the file held the header alone, a build
    of no targets with nothing said of the interrupt."""
    import json

    from buildtool import session as session_mod

    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(tmp_path / "cache"))
    ws = _workspace(tmp_path / "ws", 'genrule(name="b", srcs=["a.txt"], outs=["b.txt"], cmd="cp $< $@")\n'
                                     'genrule(name="c", srcs=[":b"], outs=["c.txt"], cmd="cp $< $@")\n')

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(session_mod, "_fit_fd_limit", interrupted)  # (between the header and the scheduler)
    events = tmp_path / "ev.jsonl"
    with pytest.raises(KeyboardInterrupt):
        Session(str(ws)).build(BuildRequest(patterns=["//:c"], events=str(events)))
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert lines[0]["type"] == "header"
    assert sorted((e["label"], e["status"], e["reason_code"]) for e in lines[1:]) == [
        ("//:b", "cancelled", "interrupted"), ("//:c", "cancelled", "interrupted")]


def test_an_interrupted_dry_run_gives_each_target_one_line_in_the_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dry run's listing writes the lines of the targets it lists: the interrupt's
    cancelled lines are for the others only (some targets had two)."""
    import json

    from buildtool import session as session_mod

    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(tmp_path / "cache"))
    ws = _workspace(tmp_path / "ws", "".join(f'genrule(name="t{i}", outs=["o{i}"], cmd="echo > $@")\n'
                                             for i in range(4)))
    listed: list[str] = []

    def escape(text: str, *a: object, **kw: object) -> str:
        listed.append(text)
        if len(listed) == 2:
            raise KeyboardInterrupt
        return text

    monkeypatch.setattr(session_mod, "escape_controls", escape)
    events = tmp_path / "ev.jsonl"
    with pytest.raises(KeyboardInterrupt):
        Session(str(ws)).build(BuildRequest(patterns=["//..."], events=str(events), dry_run=True))
    lines = [json.loads(line) for line in events.read_text().splitlines()[1:]]
    assert sorted(e["label"] for e in lines) == [f"//:t{i}" for i in range(4)], lines
    assert [e["status"] for e in lines].count("cancelled") == 2, lines


def test_the_loading_line_has_a_total_only_for_patterns_that_take_every_package() -> None:
    from buildtool.session import _wants_everything

    assert _wants_everything([], "") and _wants_everything(["//..."], "a") and _wants_everything(["..."], "")
    assert _wants_everything(["//a:b", "//..."], "")
    assert not _wants_everything(["..."], "a") and not _wants_everything(["//a/...", "//b:c"], "")


def test_a_config_reload_takes_a_marker_linked_to_dev_null_and_refuses_a_removed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Watch reloads the config when .buildtoolignore or buildtool.toml changes: with the
    marker linked to /dev/null (which find_workspace takes) it said "buildtool.toml was
    removed" in every cycle until watch was restarted."""
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "buildtool.toml").symlink_to("/dev/null")
    s = Session(str(ws))
    s.reload_config()
    (ws / "buildtool.toml").unlink()
    with pytest.raises(UserError, match="was removed: it marks this workspace's root"):
        s.reload_config()


def test_an_input_watch_saw_saved_during_the_command_is_said_to_be_a_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Watch mode knows the user saved the file: the hint that a command may be writing its
    own input (the usual cause in a one-shot build) sent a watch user looking for one."""
    import io

    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(tmp_path / "cache"))
    build_py = 'genrule(name="b", srcs=["a.txt"], outs=["b.txt"], cmd="cp $< $@; echo x >> $<")\n'
    ws = _workspace(tmp_path / "ws", build_py)
    session = Session(str(ws))
    session.saved_meanwhile = {"a.txt"}
    session.build(BuildRequest(patterns=["//:b"]), out=io.StringIO())
    err = capsys.readouterr().err
    assert "//:b: input a.txt was saved while the command ran; result not recorded (it runs again" in err, err
    assert "a file a command writes" not in err
    session.build(BuildRequest(patterns=["//:b"]), out=io.StringIO())  # (again the next cycle: a command's doing)
    assert "a file a command writes must not be an input" in capsys.readouterr().err
    session = Session(str(ws))  # (a one-shot build: the hint)
    session.build(BuildRequest(patterns=["//:b"]), out=io.StringIO())
    assert "a file a command writes must not be an input" in capsys.readouterr().err


def test_a_link_planted_at_the_state_tmp_dir_is_not_followed(workspace: Workspace, tmp_path: Path) -> None:
    # The lanes' TMPDIRs and capture files were made where it led (and left there).
    workspace.build_file("", 'genrule(name="a", outs=["a.txt"], cmd="echo $$TMPDIR > $@; touch $$TMPDIR/scratch")\n')
    assert workspace.build().rc == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace.root / ".buildtool" / "tmp").symlink_to(elsewhere)
    r = workspace.build("-B")
    assert r.rc == 0, r.output
    assert list(elsewhere.iterdir()) == [] and not (workspace.root / ".buildtool" / "tmp").is_symlink()
