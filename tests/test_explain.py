"""``buildtool explain`` and ``--explain``: why each target would run, computed without
running anything, against this workspace's build record."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import Workspace

BUILD = """
genrule(name="gen", srcs=["in.txt", "other.txt"], outs=["gen.out"],
        cmd="echo ran-gen >> ../log.txt; cat $(SRCS) > $@")
genrule(name="use", srcs=[":gen"], outs=["use.out"], env={"MODE": "fast"},
        cmd="echo ran-use >> ../log.txt; cat $< > $@")
genrule(name="side", srcs=["other.txt"], outs=["side.out"], cmd="cp $< $@")
"""


def _setup(ws: Workspace) -> None:
    ws.write("pkg/in.txt", "one\n")
    ws.write("pkg/other.txt", "x\n")
    ws.write("log.txt", "")
    ws.build_file("pkg", BUILD)
    r = ws.build("//pkg:use", "//pkg:side")
    assert r.rc == 0, r.output


def _lines(out: str) -> dict[str, str]:
    got = {}
    for ln in out.splitlines():
        m = re.match(r"^(//\S+)\s+(.*)$", ln)
        if m:
            got[m.group(1)] = m.group(2)
    return got


def test_explain_names_the_exact_changed_file_with_digest_prefixes(workspace: Workspace) -> None:
    _setup(workspace)
    log_before = workspace.read("log.txt")
    out_before = workspace.read("pkg/gen.out")
    workspace.write("pkg/in.txt", "two\n")
    rc, out, err = workspace.run("explain", "//pkg:use")
    assert rc == 0, err
    lines = _lines(out)
    assert re.search(r"WOULD RUN: input pkg/in\.txt changed \([0-9a-f]{8} -> [0-9a-f]{8}\)", lines["//pkg:gen"]), out
    assert "other.txt" not in lines["//pkg:gen"]
    assert "WOULD RUN" in lines["//pkg:use"] and "//pkg:gen" in lines["//pkg:use"]
    assert "//pkg:side" not in lines  # not in the closure of //pkg:use
    # Nothing ran, nothing changed on disk.
    assert workspace.read("log.txt") == log_before
    assert workspace.read("pkg/gen.out") == out_before


def test_explain_up_to_date_env_command_and_missing_output(workspace: Workspace) -> None:
    _setup(workspace)
    rc, out, _ = workspace.run("explain", "//pkg:use", "//pkg:side")
    assert rc == 0
    assert all("up to date" in v for v in _lines(out).values()), out
    workspace.build_file("pkg", BUILD.replace('"fast"', '"slow"').replace("cp $< $@", "cp  $< $@"))
    (workspace.root / "pkg" / "gen.out").unlink()
    rc, out, _ = workspace.run("explain", "//pkg/...")
    lines = _lines(out)
    assert "env var MODE changed" in lines["//pkg:use"], out
    assert "command changed" in lines["//pkg:side"], out
    assert "WOULD RESTORE" in lines["//pkg:gen"] and "output pkg/gen.out is missing" in lines["//pkg:gen"], out


def test_explain_without_record_and_without_cache(workspace: Workspace, tmp_path) -> None:
    _setup(workspace)
    (workspace.root / "pkg" / "side.out").unlink()
    rc, out, _ = workspace.run("explain", "//pkg:side", "--cache-dir", str(tmp_path / "nothing"))
    assert rc == 0
    assert "output pkg/side.out is missing" in out and "WOULD RUN" in out
    rc, out, _ = workspace.run("clean")
    rc, out, _ = workspace.run("explain", "//pkg:side", "--cache-dir", str(tmp_path / "nothing"))
    assert "not in this workspace's build record (never built here" in out


def test_a_fresh_checkout_s_miss_is_compared_with_the_last_action_stored_for_its_label(
    workspace: Workspace, tmp_path: Path,
) -> None:
    """A fresh CI checkout sharing the cache misses: with no record to compare with, the
    reason said only "no cache entry"; the cache keeps each label's last stored action, so
    explain and --explain name what differs (a PATH entry, a source, an env value)."""
    workspace.build_file("", 'genrule(name="g", srcs=["in.txt"], outs=["o.txt"], cmd="cp $< $@", env={"MODE": "a"})\n'
                             'genrule(name="same", outs=["s.txt"], cmd="echo s > $@")\n')
    workspace.write("in.txt", "one\n")
    assert workspace.build().rc == 0
    fresh = workspace.copy_to(tmp_path / "fresh")  # same cache, no state
    for out in ("o.txt", "s.txt"):
        fresh.path(out).unlink()
    fresh.write("in.txt", "two\n")
    fresh.build_file("", fresh.read("BUILD.py").replace('"a"', '"b"'))
    rc, out, err = fresh.run("explain")
    assert rc == 0, err
    g = _lines(out)["//:g"]
    assert g.startswith("WOULD RUN: not in this workspace's build record") and "; no cache entry for key " in g, g
    assert re.search(r"; the cache's last entry for this label, from this or another checkout, differs: "
                     r"env var MODE changed; input in\.txt changed \([0-9a-f]{8} -> [0-9a-f]{8}\)$", g), g
    assert _lines(out)["//:same"].startswith("WOULD RESTORE: "), out  # (a hit: nothing to compare)
    r = fresh.build("--explain")
    assert r.rc == 0 and "env var MODE changed; input in.txt changed" in r.by_label["//:g"]["reason"], r.output
    # Once the fresh checkout stored its own, its record answers; the cache's row is its.
    fresh.write("in.txt", "three\n")
    rc, out, err = fresh.run("explain")
    assert re.fullmatch(r"WOULD RUN: input in\.txt changed \([0-9a-f]{8} -> [0-9a-f]{8}\)", _lines(out)["//:g"]), out
    other = fresh.copy_to(tmp_path / "other")  # another fresh checkout, its PATH with one entry more
    rc, out, err = other.run("explain", env_extra={"PATH": f"/opt/bin:{os.environ['PATH']}"})
    assert _lines(out)["//:same"].endswith("differs: env var PATH changed: '/opt/bin' added"), out


def test_the_cache_s_descriptions_hold_no_env_value_but_path_s_and_a_bad_row_says_nothing(
    workspace: Workspace, tmp_path: Path,
) -> None:
    """The shared table held pass_env values in plain text (a token); a row of another
    shape (a damaged cache, a later buildtool) failed every build of the label with an
    internal error."""
    import sqlite3

    workspace.build_file("", 'genrule(name="g", srcs=["in.txt"], outs=["o.txt"], pass_env=["TOKEN"], '
                             'cmd="cp $< $@")\n')
    workspace.write("in.txt", "one\n")
    assert workspace.build(env_extra={"TOKEN": "s3cr3t-value"}).rc == 0
    db = workspace.cache / "v2" / "actions.db"
    with sqlite3.connect(db) as c:
        (desc,) = c.execute("SELECT desc FROM descriptions WHERE label = '//:g'").fetchone()
    assert "s3cr3t" not in desc and '"TOKEN":"blake3:' in desc.replace(" ", ""), desc
    fresh = workspace.copy_to(tmp_path / "fresh")
    fresh.path("o.txt").unlink()
    rc, out, err = fresh.run("explain", env_extra={"TOKEN": "another"})
    assert _lines(out)["//:g"].endswith("differs: env var TOKEN changed"), out
    with sqlite3.connect(db) as c:
        c.execute("""UPDATE descriptions SET desc = '{"env": ["PATH=/bin"], "inputs": 7}' WHERE label = '//:g'""")
    rc, out, err = fresh.run("explain", env_extra={"TOKEN": "another"})
    line = _lines(out)["//:g"]
    assert rc == 0 and line.startswith("WOULD RUN: not in this workspace") and "differs" not in line, (out, err)
    r = fresh.build(env_extra={"TOKEN": "another"})
    assert r.rc == 0 and r.status("//:g") == "ran", r.output


def test_a_target_whose_last_run_failed_is_not_called_never_built(workspace: Workspace) -> None:
    """A failing test drops its record entry (its earlier pass must not answer); the next
    reason said "never built in this workspace" of a test that had run twice."""
    workspace.write("d.txt", "A\n")
    workspace.build_file("", 'test(name="t", srcs=["d.txt"], cmd="test ! -e ../flag")')
    assert workspace.run("test")[0] == 0
    (workspace.root.parent / "flag").write_text("")
    try:
        assert workspace.run("test", "--no-cache-tests")[0] == 1
    finally:
        (workspace.root.parent / "flag").unlink()
    workspace.write("d.txt", "B\n")
    r = workspace.build(command="test")
    assert r.rc == 0 and ("not in this workspace's build record (never built here, its last run failed, or it left "
                          "the graph since)") in r.by_label["//:t"]["reason"], r.by_label["//:t"]


def test_build_explain_prints_each_reason(workspace: Workspace) -> None:
    _setup(workspace)
    workspace.write("pkg/other.txt", "y\n")
    r = workspace.build("//pkg:use", "//pkg:side", "--explain")
    assert r.rc == 0
    out = r.stdout
    assert re.search(r"//pkg:side: ran: input pkg/other\.txt changed \([0-9a-f]{8} -> [0-9a-f]{8}\)", out), out
    assert re.search(r"//pkg:use: ran: dependency //pkg:gen produced a different output pkg/gen\.out", out), out
    r = workspace.build("//pkg:use", "--explain")  # (not "up_to_date: up to date: same action key...")
    fresh = "//pkg:use: up_to_date: same action key as this workspace's last build, outputs unchanged"
    assert r.rc == 0 and fresh in r.stdout, r.stdout


def test_explain_bad_label_exits_2(workspace: Workspace) -> None:
    _setup(workspace)
    rc, _, err = workspace.run("explain", "//pkg:nope")
    assert rc == 2 and "//pkg:nope" in err


def test_reasons_show_where_a_long_command_differs_and_which_module_changed() -> None:
    from buildtool.outcome import Reason
    from buildtool.rebuild import why_changed

    base = {"cmd": "cc " + "-Iinclude/dir " * 12 + "-o app main.o -lm", "env": {}, "inputs": {},
            "extra": {"fn": "tools.mk:gen", "module:tools/mk.py": "8dfe48b3aa", "kwargs": '{"a":1}'}}
    new = {**base, "cmd": base["cmd"].replace("-lm", "-lz")}
    code, msg = why_changed(base, new, lambda p: None)
    assert code is Reason.COMMAND_CHANGED and "main.o -lm" in msg and "main.o -lz" in msg, msg
    new = {**base, "extra": {**base["extra"], "module:tools/mk.py": "4ba782f9bb", "kwargs": '{"a":2}'}}
    code, msg = why_changed(base, new, lambda p: None)
    assert code is Reason.DEFINITION_CHANGED, msg
    assert 'kwargs changed from {"a":1} to {"a":2}' in msg
    assert "module tools/mk.py changed (8dfe48b3 -> 4ba782f9)" in msg
    new = {**base, "extra": {**base["extra"], "module:tools/util.py": "11"}}
    assert "now imports module tools/util.py" in why_changed(base, new, lambda p: None)[1]
    # The same items in another order (fn sees the order, so it reruns): a dict from a set.
    two = {**base, "extra": {**base["extra"], "kwargs": '{"f":{"a":1,"b":2}}'}}
    swapped = {**base, "extra": {**base["extra"], "kwargs": '{"f":{"b":2,"a":1}}'}}
    assert "the same items in another order: a dict built from a set" in why_changed(two, swapped, lambda p: None)[1]
    assert "another order" not in msg


def test_a_dependency_output_s_mode_change_says_same_content_only_when_it_is() -> None:
    """It said "(same content)" also beside the new digest it had just named."""
    from buildtool.outcome import Reason
    from buildtool.rebuild import why_changed

    base = {"cmd": "./a.sh", "env": {}, "inputs": {"a.sh": "aa" * 32}, "extra": {}}
    same = {**base, "extra": {"executable": '["a.sh"]'}}
    code, msg = why_changed(base, same, lambda p: "//:a")
    assert code is Reason.DEP_CHANGED and msg == "dependency //:a's output a.sh became executable (same content)", msg
    other = {**same, "inputs": {"a.sh": "bb" * 32}}
    code, msg = why_changed(base, other, lambda p: "//:a")
    assert "(same content)" not in msg and "became executable" in msg and "a different output a.sh" in msg, msg


def test_a_dependency_output_fetched_from_the_remote_cas_is_not_said_to_differ() -> None:
    """--remote-download minimal left a.txt remote (its SHA-256 in the key); on disk now (its
    BLAKE3): "produced a different output (remote 3b09aeb6 -> 5b4b3e31)" of the same file."""
    from buildtool.outcome import Reason
    from buildtool.rebuild import why_changed

    base = {"cmd": "cat a.txt", "env": {}, "inputs": {"a.txt": f"remote:sha256:{'3b' * 32}:6"}, "extra": {}}
    now = {**base, "inputs": {"a.txt": "5b" * 32}}
    code, msg = why_changed(base, now, lambda p: "//:a")
    assert code is Reason.DEP_CHANGED and msg == ("dependency //:a's output a.txt was left in the remote CAS and is "
                                                  "on disk now, so the key names it by another digest "
                                                  "(remote 3b3b3b3b -> 5b5b5b5b)"), msg
    code, msg = why_changed(now, base, lambda p: "//:a")
    assert "was on disk and is left in the remote CAS now" in msg and "different" not in msg, msg


def test_the_tally_counts_groups_so_it_adds_up(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="a", outs=["a"], cmd="echo > $@")\n'
                             'genrule(name="b", outs=["b"], cmd="echo > $@")\n'
                             'group(name="g", deps=[":a", ":b"])\n')
    assert workspace.build("//:a").rc == 0
    rc, out, err = workspace.run("explain")
    assert rc == 0 and "explain: 3 targets: 1 run, 1 up to date, 1 group (nothing was run)" in out, out + err


def test_plan_refuses_j_with_jobs_range_and_cache_commands_a_file_as_cache_dir(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="a", outs=["a"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("plan", "-j", "2", "--jobs-range", "1-3")
    assert rc == 2 and "not allowed with argument -j/--jobs" in err, err
    afile = workspace.root / "not-a-dir"
    afile.write_text("")
    for command in ("stats", "gc"):
        rc, out, err = workspace.run("cache", command, "--cache-dir", str(afile))
        assert rc == 2 and f"the cache dir {afile} is not a directory" in err, (command, out, err)


def test_tests_are_said_cached_or_not_run_and_counted_so(workspace: Workspace, tmp_path) -> None:
    """A test whose pass the cache holds is 'PASSED (cached)' under --test (not 'WOULD
    RESTORE'), and a test `build` leaves alone is tallied as 'not run', not 'up to date'."""
    workspace.write("in", "ok\n")
    workspace.build_file("", 'genrule(name="b", srcs=["in"], outs=["b.out"], cmd="cat in > $@")\n'
                             'test(name="t", srcs=[":b"], cmd="grep -q ok $<")\n')
    assert workspace.build(command="test").rc == 0
    import shutil

    shutil.rmtree(workspace.root / ".buildtool")
    rc, out, err = workspace.run("explain", "--test")
    assert rc == 0, out + err
    assert "//:t  PASSED (cached): " in out and "its pass with this key is in the cache" in out, out
    # (//:b's output on disk is the cache entry's: the build adopts it, restoring nothing)
    assert "explain: 2 targets: 1 up to date, 1 cached pass (nothing was run)" in out, out
    rc, out, err = workspace.run("explain", "//:t")
    assert rc == 0 and "explain: 2 targets: 1 up to date, 1 not run (nothing was run)" in out, out + err
    r = workspace.build("//:t", command="test")
    assert r.rc == 0 and r.by_label["//:b"]["reason_code"] == "adopted", r.by_label["//:b"]
    # In the workspace that ran it, as `test` says it: PASSED (cached), not "up to date".
    assert workspace.build(command="test").rc == 0
    rc, out, err = workspace.run("explain", "--test")
    assert rc == 0, out + err
    assert "//:t  PASSED (cached): same action key as its last pass in this workspace" in out, out
    assert "explain: 2 targets: 1 up to date, 1 cached pass (nothing was run)" in out, out


def test_a_group_between_is_not_named_as_what_would_run(workspace: Workspace) -> None:
    """//:b depends on the group //:g of //:a: "dependency //:g would run", while //:g's own
    line said it runs nothing."""
    workspace.write("s", "a\n")
    workspace.build_file("", 'genrule(name="a", srcs=["s"], outs=["a.out"], cmd="cp s $@")\n'
                             'group(name="g", deps=[":a"])\n'
                             'genrule(name="b", srcs=[":g"], outs=["b.out"], cmd="cat $(SRCS) > $@")\n')
    assert workspace.run("build")[0] == 0
    workspace.write("s", "b\n")
    rc, out, _ = workspace.run("explain")
    assert rc == 0 and "//:b  WOULD RUN: dependency //:a would run" in out, out


def test_a_reverted_edit_whose_outputs_match_the_cache_is_up_to_date_not_a_restore(workspace: Workspace) -> None:
    """The build adopts such an entry (restores nothing); explain and -n said WOULD RESTORE,
    also of every outs-less stamp target after any reverted edit (a stamp is never taken
    from a cache now: what it did to the workspace is no entry's; it runs)."""
    workspace.write("in.txt", "one\n")
    workspace.build_file("", 'genrule(name="g", srcs=["in.txt"], outs=["out.txt"], cmd="cat $< > $@")\n'
                             'genrule(name="stamp", srcs=["in.txt"], cmd="true")\n')
    assert workspace.run("build")[0] == 0
    saved = workspace.read("out.txt")
    workspace.write("in.txt", "two\n")
    assert workspace.run("build")[0] == 0
    workspace.write("in.txt", "one\n")
    workspace.write("out.txt", saved)
    rc, out, _ = workspace.run("explain")
    assert rc == 0 and "1 up to date" in out and "RESTORE" not in out and "//:stamp  WOULD RUN" in out, out
    assert "but the outputs on disk already match the cache entry of this key" in out, out
    rc, out, _ = workspace.run("build", "-nv")
    assert rc == 0 and "1 of 2 targets would run or be restored" in out, out
    assert "//:g" not in out, out  # (was listed, with its command)
    r = workspace.build("--explain")
    assert r.rc == 0 and r.status("//:g") == "up_to_date" and r.by_label["//:g"]["reason_code"] == "adopted"
    assert r.status("//:stamp") == "ran", r.events


def test_a_target_behind_a_dependency_that_would_run_still_says_its_own_edits(workspace: Workspace) -> None:
    """//:B's own b.txt was edited too: explain said only "dependency //:A would run"."""
    workspace.write("a.txt", "a\n")
    workspace.write("b.txt", "b\n")
    workspace.build_file("", 'genrule(name="A", srcs=["a.txt"], outs=["A.out"], cmd="cat $< > $@")\n'
                             'genrule(name="B", srcs=[":A", "b.txt"], outs=["B.out"], cmd="cat $(SRCS) > $@")\n')
    assert workspace.run("build")[0] == 0
    workspace.write("a.txt", "a2\n")
    workspace.write("b.txt", "b2\n")
    rc, out, _ = workspace.run("explain")
    assert rc == 0 and "//:B  WOULD RUN: dependency //:A would run; input b.txt changed" in out, out


def test_a_target_that_was_always_true_is_not_said_to_be_unrecorded(workspace: Workspace) -> None:
    """always=True records under the empty key; the 'not recorded' reason took that key for
    a dirty run's, and explained a removed always=True as an input changing during a run."""
    workspace.build_file("", 'genrule(name="v", outs=["v.txt"], always=True, cmd="echo 1 > $@")')
    assert workspace.run("build", "//:v")[0] == 0
    workspace.build_file("", 'genrule(name="v", outs=["v.txt"], cmd="echo 1 > $@")')
    rc, out, _ = workspace.run("explain", "//:v")
    assert rc == 0 and "not recorded" not in out, out


def test_explain_and_dry_run_do_not_promise_a_restore_whose_blob_is_gone(workspace: Workspace) -> None:
    """Its blob deleted (a GC, a hand), an entry cannot be restored: the build reruns the
    target, while explain said WOULD RESTORE and -n "would restore from the cache"."""
    import cache_verify as cv

    workspace.build_file("", 'genrule(name="big", outs=["big.bin"], cmd="head -c 100000 /dev/zero > $@")\n')
    r = workspace.build()
    assert r.rc == 0, r.output
    key = r.by_label["//:big"]["key"]
    cv.blob_path(workspace.cache, cv.entry(workspace.cache, key)["outputs"][0][1]).unlink()
    (workspace.root / "big.bin").unlink()
    rc, out, _ = workspace.run("explain", "//:big")
    assert rc == 0 and "WOULD RUN" in out and "WOULD RESTORE" not in out, out
    rc, out, _ = workspace.run("build", "-n", "//:big")
    assert rc == 0 and "//:big: would run: " in out, out
    r = workspace.build()
    assert r.rc == 0 and r.status("//:big") == "ran", r.output


def test_a_gone_blob_matters_to_explain_only_where_the_build_reads_it(workspace: Workspace) -> None:
    """Outputs on disk that match the entry are adopted without its blobs (explain said
    WOULD RUN once blobs were checked); a test's log is always read (explain said PASSED
    (cached) while `test` ran it again)."""
    import shutil

    import cache_verify as cv

    workspace.build_file("", 'genrule(name="big", outs=["big.bin"], cmd="head -c 100000 /dev/zero > $@")\n'
                             'test(name="t", cmd="head -c 10000 /dev/zero | tr \\"\\\\\\\\0\\" y; echo")\n')
    assert workspace.build().rc == 0
    assert workspace.run("test", "//:t")[0] == 0
    shutil.rmtree(workspace.root / ".buildtool")  # a fresh checkout's state, outputs still on disk
    for p in (cv.layout_dir(workspace.cache) / "cas").rglob("*"):
        if p.is_file():
            p.unlink()
    rc, out, _ = workspace.run("explain", "//:big")
    assert rc == 0 and "WOULD RUN" not in out and "already match the cache entry" in out, out
    rc, out, _ = workspace.run("explain", "--test", "//:t")
    assert rc == 0 and "cached" not in out.lower(), out


def test_a_dry_run_of_a_test_whose_pass_is_in_the_cache_says_so(workspace: Workspace) -> None:
    """A fresh checkout's `test -n` of a test the cache holds a pass of: it said the
    outputs on disk matched the cache entry, but a test has no outputs."""
    import shutil

    workspace.build_file("", 'test(name="t", cmd="true")\n')
    assert workspace.run("test")[0] == 0
    shutil.rmtree(workspace.root / ".buildtool")
    rc, out, err = workspace.run("test", "-n")  # (the pass answers: nothing would run, nothing is listed)
    assert rc == 0 and "//:t" not in out and "0 of 1 target would run" in out, out + err
    r = workspace.build("-n", command="test")
    said = [e["reason"] for e in r.events if e["label"] == "//:t"]
    assert r.rc == 0 and said == ["up to date: not in this workspace's build record (never built here, its last run "
                                  "failed, or it left the graph since), but the cache holds a pass of this key"], \
        r.events
    rc, out, err = workspace.run("test", "-n", "--explain")
    assert rc == 0 and "PASSED (cached)" in out and "but the cache holds" not in out, out + err


def test_a_file_name_with_control_characters_is_shown_escaped_in_every_reason(workspace: Workspace) -> None:
    """`explain` and `build -n` printed a source named a<ESC>]0;pwned<BEL><ESC>[2J.txt as it
    is (a terminal's title set, its screen cleared), `build --explain` stripped it to
    a.txt, a file that does not exist; a newline in a name split a reason in two lines."""
    names = ["a\x1b]0;pwned\x07\x1b[2J.txt", "n\nl.txt"]
    for n in names:
        workspace.write(n, "v1\n")
    workspace.build_file("", 'genrule(name="g", srcs=glob(["*.txt"]), outs=["out"], cmd="cat $(SRCS) > $@")\n')
    assert workspace.build().rc == 0
    for n in names:
        workspace.write(n, "v2\n")
    shown = ["a\\x1b]0;pwned\\x07\\x1b[2J.txt", "n\\nl.txt"]
    for args in (["explain"], ["build", "-n"], ["build", "--explain", "-j", "1"]):
        rc, out, err = workspace.run(*args)
        assert rc == 0 and "\x1b" not in out + err and "\x07" not in out + err, (args, out)
        [line] = [ln for ln in out.splitlines() if ln.startswith("//:g")]
        assert any(s in line for s in shown), (args, out)  # (the first input that changed is named)


def test_a_failing_command_and_a_warning_show_a_control_character_name_escaped(
    workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """The failed command's line printed the substituted command as it is: under --color
    always (as on a terminal) a source named with an OSC set the terminal's title."""
    from buildtool import console

    workspace.write("a\x1b]0;PWNED\x07.txt", "x\n")
    workspace.build_file("", 'genrule(name="g", srcs=glob(["*.txt"]), outs=["o"], cmd="cat $(SRCS) > $@; exit 1")\n')
    rc, out, err = workspace.run("build", "--color", "always")
    assert rc == 1 and "\x1b]0;" not in out + err and "\x07" not in out + err, repr(out + err)
    assert "cat 'a\\x1b]0;PWNED\\x07.txt'" in out, out
    console.say("warning: input a\x1b]0;PWNED\x07.txt changed\nwhile")  # (every warning goes through say)
    said = capsys.readouterr().err
    assert said == "buildtool: warning: input a\\x1b]0;PWNED\\x07.txt changed\\nwhile\n", repr(said)


def test_a_path_entry_listed_again_is_not_called_a_reordering() -> None:
    """`PATH=$PATH:/usr/bin` (already on it) was said to be "the same entries in another order"."""
    from buildtool.rebuild import why_changed

    base = {"cmd": "true", "env": {"PATH": "/venv/bin:/usr/bin:/bin"}, "inputs": {}, "extra": {}}
    for path, said in [("/venv/bin:/usr/bin:/bin:/usr/bin", "'/usr/bin' listed again"),
                       ("/usr/bin:/bin", "'/venv/bin' gone"),
                       ("/usr/bin:/venv/bin:/bin", "the same entries in another order"),
                       ("/venv/bin:/usr/bin:/bin:", "an empty entry (the current directory) added")]:
        msg = why_changed(base, {**base, "env": {"PATH": path}}, lambda p: None)[1]
        assert msg == f"env var PATH changed: {said}", msg
    twice = {**base, "env": {"PATH": "/venv/bin:/venv/bin:/usr/bin:/bin"}}
    assert why_changed(twice, base, lambda p: None)[1] == "env var PATH changed: was '/venv/bin:/venv/bin:/usr/bin:" \
        "/bin', the same lookups: buildtool now keys PATH without repeated entries and trailing slashes (a one-time " \
        "change)"  # (a record of an older buildtool: its PATH as given)
    again = {**base, "env": {"PATH": "/venv/bin:/usr/bin:/venv/bin"}}
    assert why_changed(again, base, lambda p: None)[1] == "env var PATH changed: '/bin' added"


@pytest.mark.parametrize("flags", [["--remote-cache", "http://127.0.0.1:9"], ["--remote-upload"],
                                   ["--remote-header", "authorization=Bearer x"]])
def test_explain_given_a_build_s_remote_flags_says_what_it_does_instead(workspace: Workspace, flags: list[str]) -> None:
    """A CI job's build flags pasted in: argparse's "unrecognized arguments" (exit 2) said
    nothing of why; explain never contacts a remote, and `build --explain` does."""
    workspace.build_file("", 'genrule(name="a", outs=["a.out"], cmd="echo a > $@")\n')
    rc, out, err = workspace.run("explain", *flags)
    assert rc == 2 and f"explain takes no {flags[0]}: it never contacts a remote cache or executor" in err \
        and "buildtool build --explain" in err and out == "", (rc, out, err)


def test_a_dry_run_that_cannot_read_an_input_is_would_fail_not_would_run() -> None:
    """What `explain` says of a target whose source it cannot read (as a user other than
    the file's owner, after `chmod 000`): the dry run's "would fail: cannot read", which the
    tally counts as fail, not run."""
    from buildtool.explain import FAIL, RUN, reason_text, verdict
    from buildtool.outcome import Outcome, Reason, Status

    o = Outcome(Status.SKIPPED, Reason.DRY_RUN, "would fail: cannot read a.txt")
    assert verdict(o) == FAIL and reason_text(o) == "cannot read a.txt"
    o = Outcome(Status.SKIPPED, Reason.DRY_RUN, "would run: input a.txt changed")
    assert verdict(o) == RUN and reason_text(o) == "input a.txt changed"


def _report_outcomes() -> tuple[Any, dict[int, Any]]:
    from types import SimpleNamespace as NS

    from buildtool.outcome import Outcome, Reason, Status
    targets = [NS(label=f"//:m{i}", kind="genrule", deps=()) for i in range(7)]
    targets.append(NS(label="//:grp", kind="group", deps=tuple(range(7))))
    targets.append(NS(label="//:f", kind="genrule", deps=()))
    targets.append(NS(label="//:a", kind="genrule", deps=()))
    outs = {i: Outcome(Status.UP_TO_DATE, Reason.UP_TO_DATE, "up to date") for i in range(7)}
    outs[7] = Outcome(Status.UP_TO_DATE, Reason.GROUP, "group")
    outs[8] = Outcome(Status.SKIPPED, Reason.DRY_RUN, "would fail: cannot read a.txt")
    outs[9] = Outcome(Status.UP_TO_DATE, Reason.ADOPTED, "up to date: input a changed, but the outputs on disk "
                      "already match the cache entry of this key")
    return NS(targets=targets), outs


def test_report_lines_and_tally() -> None:
    # (stub targets: the reason of each verdict, a long group's "...", and a tally that adds up)
    import io

    from buildtool import explain, rebuild
    graph, outs = _report_outcomes()
    buf = io.StringIO()
    explain.report(graph, outs, buf)
    text = buf.getvalue()
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("//")}
    assert rebuild.UNCHANGED in lines["//:m0"], text
    assert lines["//:grp"].rstrip().endswith(" ..."), text
    assert "up to date: up to date" not in lines["//:a"], text
    assert "1 fail" in text.splitlines()[-1], text
