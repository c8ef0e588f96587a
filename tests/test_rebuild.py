"""rebuild: the reason a target runs again, one difference kind at a time (why_changed)."""

from __future__ import annotations

from typing import Any

import pytest

from buildtool.outcome import Reason
from buildtool.rebuild import NOT_RECORDED, why_changed

BASE: dict[str, Any] = {"cmd": "cat a.txt > $@", "shell": "sh", "env": {"LANG": "C"}, "tools": {},
                        "inputs": {"a.txt": "aa" * 32}, "outs": ["o.txt"], "extra": {}, "pkg": "", "kind": "genrule"}


def _with(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


def _no_owner(p: str) -> str | None:
    return None


@pytest.mark.parametrize(("new", "code", "said"), [
    (_with(inputs={**BASE["inputs"], "run.sh": "bb" * 32}, extra={"executable": '["run.sh"]'}),
     Reason.INPUTS_ADDED_REMOVED, "input run.sh was added"),  # (a new executable input: added, no KeyError)
    (_with(inputs={}), Reason.INPUTS_ADDED_REMOVED, "input a.txt was removed"),
    (_with(inputs={"a.txt": "cc" * 32}), Reason.INPUT_CHANGED, "input a.txt changed (aaaaaaaa -> cccccccc)"),
    (_with(outs=["o.txt", "p.txt"]), Reason.OUTPUTS_CHANGED, "the declared outputs changed"),
    (_with(env={}), Reason.ENV_CHANGED, "env var LANG was removed"),
    (_with(env={"LANG": "C", "TZ": "UTC"}), Reason.ENV_CHANGED, "env var TZ was added"),
    (_with(env={"LANG": "en_US.UTF-8"}), Reason.ENV_CHANGED, "env var LANG changed"),
    (_with(shell="bash"), Reason.COMMAND_CHANGED, "shell changed from sh to bash"),
    (_with(tools={"cc": "dd" * 32}), Reason.TOOL_CHANGED, "tool cc changed (absent -> dddddddd)"),
    (_with(kind="test"), Reason.DEFINITION_CHANGED, "the rule's kind, package or key format changed"),
    ({**BASE, "v": 2}, Reason.DEFINITION_CHANGED, "the rule's kind, package or key format changed"),
])
def test_each_kind_of_difference_has_its_reason(new: dict[str, Any], code: Reason, said: str) -> None:
    assert why_changed(BASE, new, _no_owner) == (code, said)


def test_the_first_difference_decides_the_code_and_the_message_lists_a_few() -> None:
    new = _with(cmd="cat a.txt b.txt > $@", inputs={"b.txt": "bb" * 32}, outs=["p.txt"],
                env={"LANG": "C", "X": "1"}, extra={"timeout": "5"})
    code, msg = why_changed(BASE, new, _no_owner)
    assert code is Reason.COMMAND_CHANGED, (code, msg)
    assert msg.split("; ") == ["command changed: was 'cat a.txt > $@', now 'cat a.txt b.txt > $@'",
                               "env var X was added", "input b.txt was added", "input a.txt was removed",
                               "and 2 more differences"], msg


def test_a_dependency_s_output_names_its_producer() -> None:
    new = _with(inputs={"a.txt": "cc" * 32})
    assert why_changed(BASE, new, lambda p: "//:gen") == (
        Reason.DEP_CHANGED, "dependency //:gen produced a different output a.txt (aaaaaaaa -> cccccccc)")


TEST: dict[str, Any] = {**BASE, "kind": "test", "cmd": "sh run.sh", "inputs": {"run.sh": "aa" * 32},
                        "extra": {"closure://tool:run": "11" * 32, "closure://lib:data": "22" * 32}}


def test_a_test_names_the_dependency_below_which_something_changed() -> None:
    """A test's key holds its dependencies' closure digests: what changed is said by the
    dependency it is below, and not again beside a changed output of that dependency."""
    owner = {"run.sh": "//tool:run"}.get
    below = {**TEST, "extra": {**TEST["extra"], "closure://lib:data": "33" * 32}}
    assert why_changed(TEST, below, owner) == (Reason.DEP_CHANGED, (
        "something dependency //lib:data reads changed, at some depth: a source of it or of a target below it, "
        "or an output one of them made (closure 22222222 -> 33333333)"))
    both = {**below, "inputs": {"run.sh": "cc" * 32}, "extra": {**below["extra"], "closure://tool:run": "44" * 32}}
    code, said = why_changed(TEST, both, owner)
    assert code is Reason.DEP_CHANGED and said.split("; ") == [
        "dependency //tool:run produced a different output run.sh (aaaaaaaa -> cccccccc)",
        "something dependency //lib:data reads changed, at some depth: a source of it or of a target below it, "
        "or an output one of them made (closure 22222222 -> 33333333)"], said
    fewer = {**TEST, "extra": {"closure://tool:run": "11" * 32}}
    assert why_changed(TEST, fewer, owner) == (Reason.DEP_CHANGED, "dependency //lib:data was removed")


def test_a_test_recorded_with_its_closure_listed_file_by_file_says_the_format_changed() -> None:
    """Before closure digests a test's ``inputs`` listed every file below it: its first run
    after the upgrade says so once, not "input ... was removed" thousands of times."""
    old = {**TEST, "inputs": {"run.sh": "aa" * 32, "lib/data.txt": "bb" * 32, "lib/data.in": "cc" * 32},
           "extra": {}}
    assert why_changed(old, TEST, _no_owner) == (Reason.DEFINITION_CHANGED, (
        "the test's key format changed: its dependencies' inputs are keyed through their closure digests now, "
        "not listed one by one"))
    assert why_changed({**old, "kind": "genrule"}, TEST, _no_owner)[1].startswith("input lib/data.txt was removed")
    # A test that had no dependency, and gets its first (and an env var): said as such,
    # not as the old format (whose sentence hid every other difference).
    alone = {**TEST, "inputs": {"run.sh": "aa" * 32}, "extra": {}}
    now = {**TEST, "inputs": {"run.sh": "aa" * 32, "g.txt": "dd" * 32}, "env": {"X": "1"},
           "extra": {"closure://:g": "11" * 32}}
    _, said = why_changed(alone, now, _no_owner)
    assert "input g.txt was added" in said and "dependency //:g was added" in said and "X" in said, said


def test_no_record_and_no_visible_difference() -> None:
    assert why_changed(None, BASE, _no_owner) == (Reason.NEW, NOT_RECORDED)
    assert why_changed(BASE, dict(BASE), _no_owner) == (Reason.DEFINITION_CHANGED, "the action key changed")


def test_up_to_date_needs_each_recorded_output_intact_with_its_executable_bit() -> None:
    from buildtool.rebuild import up_to_date

    entry = {"k": "K", "o": [["o.txt", "d1", 0o100755]]}
    on_disk = {"o.txt": "d1"}
    assert up_to_date(entry, "K", on_disk.get, lambda p: 0o100755)[:2] == (True, Reason.UP_TO_DATE)
    assert up_to_date(entry, "K", {"o.txt": "d2"}.get) == (
        False, Reason.OUTPUT_MODIFIED, "output o.txt was modified since it was built")
    assert up_to_date(entry, "K", {}.get) == (False, Reason.OUTPUT_MISSING, "output o.txt is missing")
    assert up_to_date(entry, "K", on_disk.get, lambda p: 0o100644) == (
        False, Reason.OUTPUT_MODIFIED, "output o.txt lost its executable bit since it was built")
    plain = {"k": "K", "o": [["o.txt", "d1", 0o100644]]}
    assert up_to_date(plain, "K", on_disk.get, lambda p: 0o100744)[2] == (
        "output o.txt gained its executable bit since it was built")


def test_the_cache_s_descriptions_hold_env_values_but_path_s_as_digests() -> None:
    from buildtool.rebuild import shared_description

    desc = {**BASE, "env": {"PATH": "/usr/bin", "PASSWORD": "hunter2", "TOKEN": "t0k"}}
    env = shared_description(desc)["env"]
    assert env["PATH"] == "/usr/bin"
    assert "hunter2" not in str(env) and "t0k" not in str(env)
    assert env["PASSWORD"].startswith("blake3:") and env["PASSWORD"] != env["TOKEN"]


def test_a_long_command_against_a_short_one_is_clipped_too() -> None:
    """Both commands are cut around where they differ unless both are short (a mutant that
    left one side whole when the other was short printed 2,000 characters)."""
    from buildtool.rebuild import _clip_pair

    old, new = _clip_pair("cc -c a.c", "cc -c a.c " + "-I/x " * 400)
    assert old == "cc -c a.c" and len(new) <= 80 and new.endswith("..."), (old, new)
    assert _clip_pair("a", "b") == ("a", "b")
