"""End to end, with the real ``buildtool`` command on real files in temp dirs:
the seed's scheduling example, incremental == clean (property test), restore,
failures, dry run and exit codes."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import BUILDTOOL, BuildRun, Workspace, immutable
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

# ---------------------------------------------------------------------------------------
# 1. The seed's worked example
# ---------------------------------------------------------------------------------------

UNIT = 0.5  # seconds; >= 0.3 s so process start-up noise stays small against it
SEED_JOBS = {  # name: (priority, duration in units, deps)
    "A": (2, 3, []),
    "B": (1, 2, []),
    "C": (1, 4, ["A"]),
    "D": (3, 2, ["A"]),
    "E": (1, 1, ["B", "C"]),
}


def seed_buildfile(variant: str = "") -> str:
    lines = []
    for name, (prio, dur, deps) in SEED_JOBS.items():
        dep_list = ", ".join(f'":{d}"' for d in deps)
        lines.append(
            f'genrule(name="{name}", priority={prio}, deps=[{dep_list}], outs=["{name}.out"], '
            f'cmd="{variant}sleep {dur * UNIT:g} && echo {name} > $@")'
        )
    return "\n".join(lines) + "\n"


def seed_times(r: BuildRun) -> dict[str, tuple[float, float]]:
    assert r.rc == 0, r.output
    ev = r.by_label
    assert set(ev) == {f"//:{n}" for n in SEED_JOBS}
    for e in ev.values():
        assert e["status"] == "ran", e
    return {lab[3:]: (e["start"] / UNIT, e["end"] / UNIT) for lab, e in ev.items()}


def start_order(times: dict[str, tuple[float, float]]) -> list[str]:
    return sorted(times, key=lambda n: times[n][0])


def check_one_worker(times: dict[str, tuple[float, float]]) -> None:
    order = start_order(times)
    assert order == ["B", "A", "C", "E", "D"], times
    # Strictly one at a time, each lasting at least its duration.
    for prev, nxt in itertools.pairwise(order):
        assert times[nxt][0] >= times[prev][1] - 0.05, times
    for n, (s, e) in times.items():
        assert e - s >= SEED_JOBS[n][1] * 0.95, (n, times)
    makespan = max(e for _, e in times.values())
    assert 12 * 0.95 <= makespan < 12 + 6, times  # 12 units plus generous overhead


def test_seed_example_one_worker(make_workspace: Any) -> None:
    ws = make_workspace("seed1")
    ws.build_file("", seed_buildfile())
    check_one_worker(seed_times(ws.build("-j", "1")))


def test_seed_example_two_workers_then_priority_still_wins_with_recorded_durations(make_workspace: Any) -> None:
    ws = make_workspace("seed2")
    ws.build_file("", seed_buildfile())
    t = seed_times(ws.build("-j", "2"))
    # A and B start at once; C and D start together when A finishes; E after B and C.
    assert abs(t["A"][0] - t["B"][0]) < 1 and min(t["A"][0], t["B"][0]) < 4, t
    assert t["C"][0] >= t["A"][1] - 0.05 and t["D"][0] >= t["A"][1] - 0.05, t
    assert abs(t["C"][0] - t["D"][0]) < 1, t  # together, not one after the other (>= 2 units)
    assert t["E"][0] >= max(t["B"][1], t["C"][1]) - 0.05, t
    makespan = max(e for _, e in t.values()) - min(s for s, _ in t.values())  # (not the start-up)
    # Critical path A -> C -> E = 8 units; one worker would need 12.
    assert 8 * 0.95 <= makespan < 11, t
    # Change every command (new keys) so the rerun has recorded durations, hence real
    # critical-path weights (A: 8, B: 3...): priority still orders ready targets.
    ws.build_file("", seed_buildfile(variant=": v2 && "))
    check_one_worker(seed_times(ws.build("-j", "1")))


# ---------------------------------------------------------------------------------------
# 2. Incremental == clean, with minimality, over random DAGs and edits
# ---------------------------------------------------------------------------------------

LETTERS = "abcxyz"
content_st = st.text(alphabet=LETTERS + "\n", min_size=1, max_size=10).filter(
    lambda s: any(c in LETTERS for c in s)
)


@dataclass
class TSpec:
    srcs: list[int]  # source indexes
    deps: list[int]  # earlier target indexes
    mode: str  # "cat" (output depends on content) or "size" (only on total size)
    via_srcs: bool  # reference deps in srcs (True) or in deps (False)


@dataclass
class Scenario:
    sources: list[str]
    targets: list[TSpec]
    edits: list[tuple[Any, ...]]


def pkg_of(i: int) -> str:
    return "" if i % 2 == 0 else "p"


def out_of(i: int) -> str:
    return f"t{i}.out" if pkg_of(i) == "" else f"p/t{i}.out"


def label_of(i: int) -> str:
    return f"//{pkg_of(i)}:t{i}"


@st.composite
def scenarios(draw: Any) -> Scenario:
    m = draw(st.integers(1, 3))
    n = draw(st.integers(3, 8))
    sources = [draw(content_st) for _ in range(m)]
    targets = []
    for i in range(n):
        srcs = draw(st.lists(st.integers(0, m - 1), unique=True, max_size=2))
        deps = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        if not srcs and not deps:
            srcs = [0]
        mode = draw(st.sampled_from(["cat", "cat", "size"]))
        targets.append(TSpec(srcs, deps, mode, draw(st.booleans())))
    edit = st.one_of(
        st.tuples(st.just("content"), st.integers(0, m - 1), content_st),
        st.tuples(st.just("touch"), st.integers(0, m - 1)),
        st.tuples(st.just("samesize"), st.integers(0, m - 1)),
        st.tuples(st.just("delete_output"), st.integers(0, n - 1)),
        st.tuples(st.just("cmd"), st.integers(0, n - 1)),
    )
    edits = draw(st.lists(edit, min_size=1, max_size=3))
    return Scenario(sources, targets, edits)


def write_scenario(ws: Workspace, sc: Scenario, versions: list[int]) -> None:
    by_pkg: dict[str, list[str]] = {"": [], "p": []}
    for i, t in enumerate(sc.targets):
        pkg = pkg_of(i)
        srcs = [f"s{j}.txt" if pkg == "" else f"//:s{j}.txt" for j in t.srcs]
        dep_labels = [label_of(k) for k in t.deps]
        if t.via_srcs:
            srcs += dep_labels
            deps: list[str] = []
        else:
            deps = dep_labels
        if t.mode == "cat":
            cmd = f"cat $(SRCS) > $@ && echo t{i}-v{versions[i]} >> $@"
        else:
            cmd = f": v{versions[i]}; cat $(SRCS) | wc -c | tr -d ' ' > $@"
        by_pkg[pkg].append(f"genrule(name={f't{i}'!r}, srcs={srcs!r}, deps={deps!r}, outs=['t{i}.out'], cmd={cmd!r})")
    ws.build_file("", "\n".join(by_pkg[""]) + "\n")
    ws.build_file("p", "\n".join(by_pkg["p"]) + "\n")


def inputs_of(sc: Scenario, i: int) -> list[str]:
    t = sc.targets[i]
    return [f"s{j}.txt" for j in t.srcs] + [out_of(k) for k in t.deps]


def snapshot(ws: Workspace, sc: Scenario) -> dict[str, bytes | None]:
    files = {f"s{j}.txt" for j in range(len(sc.sources))} | {out_of(i) for i in range(len(sc.targets))}
    return {f: (ws.root / f).read_bytes() if (ws.root / f).exists() else None for f in files}


def clean_copy(ws: Workspace, sc: Scenario, dest: Path, cache: Path) -> Workspace:
    """Copy the sources (no outputs, no state), with a fresh cache."""
    clean = ws.copy_to(dest, cache=cache)
    for i in range(len(sc.targets)):
        (clean.root / out_of(i)).unlink(missing_ok=True)
    return clean


def clean_build(clean: Workspace, sc: Scenario) -> tuple[BuildRun, dict[str, bytes]]:
    """Build a clean copy from scratch."""
    r = clean.build()
    assert r.rc == 0, r.output
    assert r.ran == {label_of(i) for i in range(len(sc.targets))}
    outs = {out_of(i): (clean.root / out_of(i)).read_bytes() for i in range(len(sc.targets))}
    return r, outs


def apply_edit(ws: Workspace, sc: Scenario, versions: list[int], edit: tuple[Any, ...]) -> set[int]:
    """Apply one edit to the workspace; return the targets whose command changed."""
    kind = edit[0]
    if kind == "content":
        ws.write(f"s{edit[1]}.txt", edit[2])
    elif kind == "touch":
        os.utime(ws.root / f"s{edit[1]}.txt")
    elif kind == "samesize":
        p = ws.root / f"s{edit[1]}.txt"
        st_ = p.stat()
        old = p.read_text()
        new = "".join(LETTERS[(LETTERS.index(c) + 1) % len(LETTERS)] if c in LETTERS else c for c in old)
        assert new != old and len(new) == len(old)
        p.write_text(new)
        os.utime(p, ns=(st_.st_atime_ns, st_.st_mtime_ns))  # same size and same mtime
    elif kind == "delete_output":
        (ws.root / out_of(edit[1])).unlink()
    elif kind == "cmd":
        versions[edit[1]] += 1
        write_scenario(ws, sc, versions)
        return {edit[1]}
    return set()


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sc=scenarios())
@example(  # found by CI: a seen key whose output (a size) is already on disk is adopted, not restored
    sc=Scenario(sources=["aa"], targets=[TSpec(srcs=[0], deps=[], mode="size", via_srcs=False)],
                edits=[("content", 0, "a\n"), ("content", 0, "aa")])
)
def test_incremental_equals_clean_and_is_minimal(make_workspace: Any, sc: Scenario) -> None:
    ws: Workspace = make_workspace("inc")
    for j, text in enumerate(sc.sources):
        ws.write(f"s{j}.txt", text)
    versions = [0] * len(sc.targets)
    write_scenario(ws, sc, versions)
    labels = [label_of(i) for i in range(len(sc.targets))]
    pool = ThreadPoolExecutor(2)
    step = 0

    def both() -> tuple[BuildRun, BuildRun, dict[str, bytes]]:
        nonlocal step
        step += 1
        base = ws.root.parent / f"{ws.root.name}-clean{step}"
        # Copy before the incremental build starts, so the copy never races with it.
        clean_ws = clean_copy(ws, sc, base, ws.root.parent / f"{ws.root.name}-cleancache{step}")
        fut = pool.submit(clean_build, clean_ws, sc)
        inc = ws.build()
        clean, clean_outs = fut.result()
        assert inc.rc == 0, inc.output
        assert set(inc.by_label) == set(labels)
        for f, data in clean_outs.items():
            assert (ws.root / f).read_bytes() == data, f"{f} differs from a clean build"
        # Same workspace content at another path: the same keys.
        assert {k: e["key"] for k, e in inc.by_label.items()} == {k: e["key"] for k, e in clean.by_label.items()}
        return inc, clean, clean_outs

    try:
        first, _, _ = both()
        assert first.ran == set(labels)
        seen_keys = {e["key"] for e in first.events}
        prev_keys = {k: e["key"] for k, e in first.by_label.items()}
        for edit in sc.edits:
            before = snapshot(ws, sc)
            deleted = {edit[1]} if edit[0] == "delete_output" else set()
            cmd_changed = apply_edit(ws, sc, versions, edit)
            inc, _, _ = both()
            after = snapshot(ws, sc)
            for i, lab in enumerate(labels):
                e = inc.by_label[lab]
                changed = i in cmd_changed or any(before[f] != after[f] for f in inputs_of(sc, i))
                key_changed = e["key"] != prev_keys[lab]
                assert key_changed == changed, (edit, lab, e)
                if not changed:
                    want = "restored" if i in deleted else "up_to_date"
                elif e["key"] not in seen_keys:
                    want = "ran"
                elif before[out_of(i)] == after[out_of(i)]:
                    # A key seen before whose cached output is already on disk (e.g. a size
                    # that did not change): adopted, nothing written.
                    want = "up_to_date"
                    assert e["reason_code"] == "adopted", (edit, lab, e, sc)
                else:
                    want = "restored"
                assert e["status"] == want, (edit, lab, e, sc)
            # Minimality in the contract's words: only targets whose key changed ran.
            assert inc.ran <= {lab for lab in labels if inc.by_label[lab]["key"] != prev_keys[lab]}
            seen_keys |= {e["key"] for e in inc.events}
            prev_keys = {k: e["key"] for k, e in inc.by_label.items()}
    finally:
        pool.shutdown()
        for p in ws.root.parent.glob(f"{ws.root.name}-clean*"):
            shutil.rmtree(p, ignore_errors=True)


def test_early_cutoff(workspace: Workspace) -> None:
    """A target rerun with byte-identical output does not rerun its dependents."""
    workspace.write("in.txt", "abc\n")
    workspace.build_file(
        "",
        """
        genrule(name="size", srcs=["in.txt"], outs=["size.out"], cmd="wc -c < $< | tr -d ' ' > $@")
        genrule(name="user", srcs=[":size"], outs=["user.out"], cmd="echo size=$$(cat $<) > $@")
        genrule(name="user2", srcs=[":user"], outs=["user2.out"], cmd="cat $< $< > $@")
        """,
    )
    r = workspace.build()
    assert r.ran == {"//:size", "//:user", "//:user2"}
    workspace.write("in.txt", "xyz\n")  # same size, other content
    r = workspace.build()
    assert r.rc == 0, r.output
    assert r.status("//:size") == "ran"
    assert r.status("//:user") == "up_to_date"
    assert r.status("//:user2") == "up_to_date"
    workspace.write("in.txt", "longer\n")  # control: a real change does propagate
    r = workspace.build()
    assert r.ran == {"//:size", "//:user", "//:user2"}
    assert workspace.read("user.out") == "size=7\n"


# ---------------------------------------------------------------------------------------
# 3. Restore
# ---------------------------------------------------------------------------------------

RESTORE_BUILD = """
genrule(name="gen", srcs=["in.txt"], outs=["gen/a.txt", "gen/tool.sh"],
        cmd="cat $< > $(location gen/a.txt) && printf '#!/bin/sh\\\\necho hi\\\\n' > $(location gen/tool.sh) "
            "&& chmod +x $(location gen/tool.sh) && echo ran >> ../ran.log")
genrule(name="use", srcs=[":gen"], outs=["use.txt"], cmd="cat $(SRCS) > $@ && echo ran >> ../ran.log")
"""


def test_deleted_outputs_are_restored_without_running_anything(workspace: Workspace) -> None:
    workspace.write("pkg/in.txt", "input\n")
    outs = _restore_ws_in_pkg(workspace)
    shutil.rmtree(workspace.path("pkg/gen"))
    workspace.path("pkg/use.txt").unlink()
    log_before = workspace.read("ran.log")
    record_before = workspace.path(".buildtool/record").read_bytes()
    r = workspace.build()
    assert r.rc == 0, r.output
    assert {e["status"] for e in r.events} == {"restored"}
    assert {e["cache"] for e in r.events} == {"local"}
    assert workspace.read("ran.log") == log_before  # no command ran
    # The record said all of this already: a restore appends no line to it.
    assert workspace.path(".buildtool/record").read_bytes() == record_before
    for f, data in outs.items():
        assert workspace.path(f).read_bytes() == data
    assert os.access(workspace.path("pkg/gen/tool.sh"), os.X_OK)
    r = workspace.build()
    assert {e["status"] for e in r.events} == {"up_to_date"}


def _restore_ws_in_pkg(ws: Workspace) -> dict[str, bytes]:
    ws.build_file("pkg", RESTORE_BUILD)
    r = ws.build()
    assert r.rc == 0, r.output
    assert r.ran == {"//pkg:gen", "//pkg:use"}
    assert ws.read("ran.log") == "ran\nran\n"
    return {f: ws.path(f).read_bytes() for f in ("pkg/gen/a.txt", "pkg/gen/tool.sh", "pkg/use.txt")}


def test_second_checkout_with_the_same_cache_runs_nothing(workspace: Workspace, tmp_path: Path) -> None:
    workspace.write("pkg/in.txt", "input\n")
    outs = _restore_ws_in_pkg(workspace)
    workspace.path("ran.log").unlink()
    (tmp_path / "elsewhere").mkdir()
    second = tmp_path / "elsewhere" / "checkout2"
    shutil.copytree(workspace.root, second, ignore=shutil.ignore_patterns(".buildtool", "gen", "use.txt"))
    other = Workspace(second, workspace.cache, workspace.home)
    assert not other.exists("pkg/use.txt")
    r = other.build()
    assert r.rc == 0, r.output
    assert r.ran == set()
    assert {e["status"] for e in r.events} == {"restored"}
    assert not other.exists("ran.log")
    for f, data in outs.items():
        assert other.path(f).read_bytes() == data


def test_modified_output_is_restored(workspace: Workspace) -> None:
    workspace.write("pkg/in.txt", "input\n")
    outs = _restore_ws_in_pkg(workspace)
    workspace.write("pkg/use.txt", "hand edited\n")
    r = workspace.build()
    assert r.status("//pkg:use") == "restored"
    assert r.by_label["//pkg:use"]["reason_code"] == "restored"
    assert workspace.path("pkg/use.txt").read_bytes() == outs["pkg/use.txt"]
    assert workspace.read("ran.log") == "ran\nran\n"


def test_cache_loss_never_turns_a_noop_into_a_rebuild(workspace: Workspace, tmp_path: Path) -> None:
    workspace.write("pkg/in.txt", "input\n")
    _restore_ws_in_pkg(workspace)
    shutil.rmtree(workspace.cache)
    r = workspace.build(cache=tmp_path / "another-cache")
    assert {e["status"] for e in r.events} == {"up_to_date"}
    assert workspace.read("ran.log") == "ran\nran\n"


# ---------------------------------------------------------------------------------------
# 4. Failures, -k, -n
# ---------------------------------------------------------------------------------------

FAIL_BUILD = """
genrule(name="bad", outs=["bad.out"], priority=0,
        cmd="echo partial > $@; echo some-output; echo the-error-message >&2; exit 3")
genrule(name="after_bad", srcs=[":bad"], outs=["after.out"], priority=0, cmd="cat $< > $@")
genrule(name="after_after", srcs=[":after_bad"], outs=["after2.out"], cmd="cat $< > $@")
genrule(name="independent", outs=["ind.out"], priority=5, cmd="echo ok > $@")
genrule(name="ind2", srcs=[":independent"], outs=["ind2.out"], priority=5, cmd="cat $< > $@")
"""


def test_failing_command_exit_1_with_its_output_shown(workspace: Workspace) -> None:
    workspace.build_file("", FAIL_BUILD)
    r = workspace.build("-j", "1")
    assert r.rc == 1
    assert "the-error-message" in r.output
    assert "some-output" in r.output
    assert "//:bad" in r.output
    assert "exit 3" in r.output  # the command is shown
    assert not workspace.exists("bad.out")  # partial output deleted
    st = {e["label"]: e["status"] for e in r.events}
    assert st["//:bad"] == "failed"
    assert st["//:after_bad"] == "skipped"
    assert st["//:after_after"] == "skipped"
    # Fail fast: the lower-priority independent targets never started.
    assert st["//:independent"] == "cancelled"
    assert st["//:ind2"] == "cancelled"
    assert not workspace.exists("ind.out")
    assert r.by_label["//:bad"]["exit_code"] == 3


def test_keep_going_builds_the_independent_targets(workspace: Workspace) -> None:
    workspace.build_file("", FAIL_BUILD)
    r = workspace.build("-j", "1", "-k")
    assert r.rc == 1
    assert "the-error-message" in r.output
    st = {e["label"]: e["status"] for e in r.events}
    assert st == {
        "//:bad": "failed", "//:after_bad": "skipped", "//:after_after": "skipped",
        "//:independent": "ran", "//:ind2": "ran",
    }
    assert workspace.read("ind2.out") == "ok\n"
    assert not workspace.exists("after.out")


def test_missing_declared_output_is_a_failure(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="t", outs=["a", "b"], cmd="echo > a")\n')
    r = workspace.build()
    assert r.rc == 1
    assert "b" in r.output and "not created" in r.output
    assert not workspace.exists("a")


def test_pipefail_and_errexit_are_on(workspace: Workspace) -> None:
    workspace.build_file(
        "",
        """
        genrule(name="pipe", outs=["p"], cmd="false | cat > $@")
        genrule(name="errexit", outs=["e"], cmd="false; echo still > $@")
        """,
    )
    r = workspace.build("-k")
    assert r.rc == 1
    assert r.status("//:pipe") == "failed"
    assert r.status("//:errexit") == "failed"


def test_dry_run_runs_nothing_and_says_why(workspace: Workspace) -> None:
    workspace.write("in.txt", "x\n")
    workspace.build_file(
        "",
        """
        genrule(name="one", srcs=["in.txt"], outs=["one.out"], cmd="cat $< > $@ && echo ran >> log")
        genrule(name="two", srcs=[":one"], outs=["two.out"], cmd="cat $< > $@ && echo ran >> log")
        """,
    )
    rc, out, err = workspace.run("build", "-n")
    assert rc == 0, err
    assert "//:one" in out and "//:two" in out
    assert "would run" in out
    assert not workspace.exists("one.out") and not workspace.exists("two.out") and not workspace.exists("log")
    # After a real build, a dry run lists nothing to run; after an edit, just that.
    assert workspace.build().rc == 0
    workspace.write("in.txt", "y\n")
    rc, out, _ = workspace.run("build", "-n")
    assert rc == 0
    assert "//:one" in out and "input in.txt changed" in out
    assert workspace.read("log") == "ran\nran\n"
    assert workspace.read("one.out") == "x\n"


def test_a_dry_run_lists_independent_targets_in_the_order_the_build_starts_them(workspace: Workspace) -> None:
    """`build -n` listed targets with no order between them from the last declared to the
    first, where the build (at -j1) runs them from the first: `make -n` prints what `make`
    would run, in its order."""
    workspace.build_file("", "".join(f'genrule(name="t{i}", outs=["o{i}.txt"], cmd="echo > $@")\n'
                                     for i in range(6)))
    rc, out, err = workspace.run("build", "-n", "-j1")
    assert rc == 0, err
    listed = re.findall(r"^(//:t\d): would run", out, re.M)
    rc, out, err = workspace.run("build", "-j1")
    assert rc == 0, err
    assert listed == re.findall(r"ran (//:t\d)", out) == [f"//:t{i}" for i in range(6)], out


def test_a_dry_run_runs_what_the_build_would_whatever_the_record_says(workspace: Workspace) -> None:
    """always=True targets and tests under --no-cache-tests run although their record is
    current: -n and explain say so, with the build's own reasons."""
    workspace.write("in", "ok\n")
    workspace.build_file("", """
        genrule(name="b", srcs=["in"], outs=["b.out"], cmd="cat in > $@")
        test(name="t", srcs=[":b"], cmd="grep -q ok $<")
        genrule(name="v", outs=["v.txt"], cmd="echo 1 > $@", always=True)
    """)
    rc, out, err = workspace.run("test", "//...")
    assert rc == 0, out + err
    rc, out, err = workspace.run("test", "-n", "--no-cache-tests", "//:t")
    assert rc == 0 and "//:t: would run: --no-cache-tests: the test passed before but runs again" in out, out + err
    rc, out, err = workspace.run("test", "-n", "//:t")
    assert rc == 0 and "0 of 2 targets would run" in out, out + err
    workspace.write("in", "ok, changed\n")  # another key, whose pass the cache holds: run all the same
    assert workspace.run("test", "//...")[0] == 0
    workspace.write("in", "ok\n")
    rc, out, err = workspace.run("test", "-n", "--no-cache-tests", "//:t")
    assert rc == 0 and "//:t: would run: " in out and "would restore" not in out.split("//:t: ")[1], out + err
    for command in (["build", "-n", "//:v"], ["explain", "//:v"]):
        rc, out, err = workspace.run(*command)
        assert rc == 0 and "always=True: runs on every build, never cached" in out, out + err


def test_always_make_runs_every_command_up_to_date_or_cached_as_make_b(workspace: Workspace) -> None:
    """`make -B`: to see a compile's warnings again, or time a real build, every command of
    the closure runs -- not restored from the cache (after `clean` that was the only way
    short of a fresh cache directory), tests included; the next build is a no-op."""
    workspace.write("in", "ok\n")
    workspace.build_file("", """
        genrule(name="b", srcs=["in"], outs=["b.out"], cmd="cat in > $@; echo warning: b >&2")
        genrule(name="c", srcs=[":b"], outs=["c.out"], cmd="cat $< $< > $@")
        test(name="t", srcs=[":c"], cmd="grep -q ok $<")
    """)
    assert workspace.build(command="test").rc == 0
    r = workspace.build("-B", command="test")
    assert r.rc == 0 and r.ran == {"//:b", "//:c", "//:t"}, r.output
    assert {r.by_label[lab]["reason_code"] for lab in r.ran} == {"always_make"}, r.events
    assert "warning: b" in r.output and workspace.read("c.out") == "ok\nok\n"
    assert workspace.build().with_status("up_to_date") == {"//:b", "//:c"}  # (the record is the -B run's)
    assert workspace.run("clean")[0] == 0
    r = workspace.build("-B", "//:c")
    assert r.rc == 0 and r.ran == {"//:b", "//:c"}, r.output  # (the cache holds both: not restored)
    assert r.by_label["//:b"]["reason_code"] != "always_make"  # (no record after clean: its own reason)
    rc, out, err = workspace.run("build", "-n", "-B", "//:c")
    assert rc == 0 and "//:b: would run: -B (--always-make)" in out, out + err
    for argv in (["build", "--watch", "-B"], ["watch", "-B"]):
        rc, out, err = workspace.run(*argv)
        assert rc == 2 and "-B (--always-make) is not for watch mode" in err, (argv, err)


def test_an_always_target_is_left_out_of_wildcards_and_runs_when_named(workspace: Workspace) -> None:
    """always=True implies manual=True (user guide): a stamp or deploy task in //... would
    run on every `build //...`."""
    workspace.build_file("", 'genrule(name="stamp", outs=["stamp.txt"], cmd="date +%N >> ../stamps; echo > $@", '
                             'always=True)\n'
                             'genrule(name="plain", outs=["plain.txt"], cmd="echo > $@")\n')
    r = workspace.build("//...")
    assert r.rc == 0 and r.ran == {"//:plain"} and not (workspace.root.parent / "stamps").exists(), r.output
    for n in (1, 2):  # named: runs, every time
        r = workspace.build("//:stamp")
        assert r.rc == 0 and r.ran == {"//:stamp"}, r.output
        assert len((workspace.root.parent / "stamps").read_text().splitlines()) == n
    import cache_verify as cv

    # Its result is never stored in the cache (user guide): only //:plain's entry is there.
    stored = cv.entries(workspace.cache)
    assert len(stored) == 1 and r.by_label["//:stamp"].get("key") not in stored, stored


def test_small_command_line_contracts(workspace: Workspace) -> None:
    """-n said "would run: ...; would restore from the cache" of a target it would restore;
    keep_going from the environment could not be turned off for one build; `query ''`
    listed every target (the empty pattern is exit 2 everywhere else); --poll without
    --watch did nothing, silently."""
    workspace.write("in", "1\n")
    workspace.build_file("", 'genrule(name="g", srcs=["in"], outs=["g.out"], cmd="cat in > $@")\n'
                             'genrule(name="bad", outs=["bad.out"], cmd="exit 3")\n'
                             'genrule(name="after", deps=[":bad"], outs=["after.out"], cmd="touch $@")\n'
                             'genrule(name="other", outs=["other.out"], cmd="sleep 0.3; touch $@")\n')
    assert workspace.run("build", "//:g")[0] == 0
    workspace.write("in", "2\n")
    assert workspace.run("build", "//:g")[0] == 0
    workspace.write("in", "1\n")  # the first key again: its entry is in the cache
    rc, out, err = workspace.run("build", "-n", "//:g")
    assert rc == 0 and "//:g: would restore from the cache: input in changed" in out, out + err
    rc, out, err = workspace.run("build", "-j1", "--no-keep-going", "//:bad", "//:other",
                                 env_extra={"BUILDTOOL_KEEP_GOING": "1"})
    assert rc == 1 and not workspace.exists("other.out"), out + err
    rc, out, err = workspace.run("build", "-j1", "//:bad", "//:other", env_extra={"BUILDTOOL_KEEP_GOING": "1"})
    assert rc == 1 and workspace.exists("other.out"), out + err
    rc, out, err = workspace.run("query", "")
    assert rc == 2 and "query '': expected" in err, out + err
    workspace.build_file("sub", 'genrule(name="sub", outs=["s"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("run", "sub", cwd=workspace.root / "sub")  # (build and run: the same hint)
    assert rc == 2 and "did you mean ':sub' (a target of the package here)?" in err, out + err
    rc, out, err = workspace.run("run", "//:bad", "--no-keep-going")
    assert rc == 1 and "unrecognized" not in err, out + err
    rc, out, err = workspace.run("build", "--poll", "//:g")  # (it changed nothing, unsaid)
    assert rc == 2 and "--poll is for watch mode: add --watch" in err, out + err
    for args in (["watch", "-n"], ["build", "--watch", "--dry-run"], ["test", "--watch", "-n"]):
        rc, out, err = workspace.run(*args)  # (its cycles' summaries counted nothing it would do)
        assert rc == 2 and "-n (a dry run) is not for watch mode" in err, (args, out + err)


def test_a_restore_temp_file_a_kill_left_is_no_source_and_goes_when_its_output_is_made(
    workspace: Workspace,
) -> None:
    """A restore beside its output (the state dir on another file system) killed with -9
    left data/x.bin.buildtool-tmp: a glob took it for a source, and it stayed for good
    when the command ran instead of a restore."""
    workspace.write("data/src.txt", "s\n")
    workspace.write("data/x.bin.buildtool-tmp", "half a restore")
    workspace.build_file("", 'genrule(name="t", outs=["data/x.bin"], cmd="echo x > $@")\n'
                             'genrule(name="list", srcs=glob(["data/*"]), outs=["list.txt"],\n'
                             '        cmd="echo $(SRCS) > $@")\n')
    assert workspace.build("//:list").rc == 0
    assert workspace.read("list.txt") == "data/src.txt\n"
    assert workspace.build("//:t").rc == 0
    assert not workspace.exists("data/x.bin.buildtool-tmp") and workspace.read("data/x.bin") == "x\n"


def test_environment_is_scrubbed(workspace: Workspace) -> None:
    workspace.build_file(
        "",
        """
        genrule(name="env", outs=["env.txt"], env={"MINE": "1"}, pass_env=["PASSED"],
                cmd="env | cut -d= -f1 | sort > $@")
        """,
    )
    r = workspace.build(env_extra={"SECRET_LEAK": "x", "PASSED": "p"})
    assert r.rc == 0, r.output
    names = set(workspace.read("env.txt").split()) - {"_", "PWD", "OLDPWD", "SHLVL"}  # set by the shell
    assert names == {"PATH", "HOME", "TMPDIR", "BUILDTOOL_LANE", "MINE", "PASSED"}


def test_a_test_gets_test_tmpdir_as_bazel_sets_it(workspace: Workspace, tmp_path: Path) -> None:
    """googletest and absl put their scratch files under TEST_TMPDIR (Bazel sets it); a genrule
    does not get it, and a test's own env wins."""
    out = tmp_path / "seen"
    workspace.build_file("", f"""
        test(name="t", cmd='test "$$TEST_TMPDIR" = "$$TMPDIR" && test -d "$$TEST_TMPDIR" && echo ok >> {out}')
        test(name="own", env={{"TEST_TMPDIR": "/x"}}, cmd='test "$$TEST_TMPDIR" = /x && echo own >> {out}')
        genrule(name="g", outs=["g.txt"], cmd='echo "[$${{TEST_TMPDIR-}}]" > $@')
        """)
    r = workspace.build(command="test")
    assert r.rc == 0 and workspace.build("//:g").rc == 0, r.output
    assert sorted(out.read_text().split()) == ["ok", "own"] and workspace.read("g.txt") == "[]\n"


def test_home_and_tmpdir_named_by_the_action_s_environment_reach_the_command(
    workspace: Workspace, tmp_path: Path
) -> None:
    """HOME and TMPDIR are a fresh per-action directory unless the target's env, pass_env
    or --action-env names them: then the command gets that value (they were keyed, so the
    target reran when they changed, and then replaced by the lane's directory)."""
    mine = tmp_path / "my-tmp"
    mine.mkdir()
    workspace.build_file("", f"""
        genrule(name="given", outs=["given.txt"], env={{"TMPDIR": "{mine}"}}, cmd="echo $$TMPDIR $$HOME > $@")
        genrule(name="passed", outs=["passed.txt"], pass_env=["HOME"], cmd="echo $$HOME > $@")
        genrule(name="fresh", outs=["fresh.txt"], cmd="echo $$TMPDIR $$HOME > $@")
        """)
    r = workspace.build("--action-env", "HOME=/srv/ci-home", env_extra={"HOME": str(workspace.home)})
    assert r.rc == 0, r.output
    tmpdir, home = workspace.read("given.txt").split()
    assert tmpdir == str(mine) and home == "/srv/ci-home"
    assert workspace.read("passed.txt").split() == [str(workspace.home)]  # (the target's pass_env over --action-env)
    tmpdir, home = workspace.read("fresh.txt").split()
    # (the lane's directory, or at a long path a short link to it, gone with the lanes)
    lanes = (str(workspace.root / ".buildtool" / "tmp") + "/", f"/tmp/buildtool-{os.getuid()}/lane-")
    assert tmpdir.startswith(lanes) and home == "/srv/ci-home"
    r = workspace.build()  # without --action-env: only the lane's directory for HOME
    assert r.rc == 0, r.output
    assert workspace.read("fresh.txt").split()[1].startswith(lanes)


# ---------------------------------------------------------------------------------------
# 5. Exit codes
# ---------------------------------------------------------------------------------------


def test_no_workspace_is_exit_2(tmp_path: Path, workspace: Workspace) -> None:
    lonely = tmp_path / "no-workspace-here"
    lonely.mkdir()
    rc, _, err = workspace.run("build", cwd=lonely)
    assert rc == 2
    assert "buildtool.toml" in err
    rc, _, err = workspace.run("-C", str(lonely), "build")
    assert rc == 2


def test_pattern_matching_nothing_is_exit_2(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="m", outs=["m"], cmd="echo > $@", manual=True)\n')
    rc, _, err = workspace.run("build", "//...")
    assert rc == 2
    assert "//..." in err
    rc, _, _ = workspace.run("build", "//:m")
    assert rc == 0


def test_test_with_no_tests_is_exit_4(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="echo > $@")\n')
    rc, _, err = workspace.run("test")
    assert rc == 4
    assert "test" in err
    rc, _, _ = workspace.run("test", "//...")
    assert rc == 4
    assert not workspace.exists("g")  # a wildcard selects only tests: nothing to build
    # A non-test named explicitly is built (as `bazel test //:g` does), then exit 4.
    rc, out, err = workspace.run("test", "//:g")
    assert rc == 4 and "no test targets among //:g" in err and "Tests:" not in out, out + err
    assert workspace.exists("g")
    rc, out, err = workspace.run("plan", "--test", "//:g")  # nothing to plan a test run of
    assert rc == 4 and "no test targets among //:g" in err, out + err


def test_test_runs_tests_and_build_never_does(workspace: Workspace) -> None:
    workspace.build_file(
        "",
        """
        genrule(name="g", outs=["g"], cmd="echo data > $@")
        test(name="passes", srcs=[":g"], cmd="grep -q data g && echo tested >> test.log")
        test(name="fails", srcs=[":g"], cmd="echo boom >&2; exit 1", manual=True)
        """,
    )
    r = workspace.build()
    assert r.rc == 0, r.output
    assert not workspace.exists("test.log")
    assert set(r.by_label) == {"//:g"}
    r = workspace.build(command="test")
    assert r.rc == 0, r.output
    assert r.status("//:passes") == "ran"
    assert workspace.read("test.log") == "tested\n"
    r = workspace.build("//:fails", command="test")
    assert r.rc == 1
    assert "boom" in r.output
    r = workspace.build("//:fails")  # named in `build`: what it needs is built, and that is said
    assert r.rc == 0, r.output
    assert "boom" not in r.output
    fails = r.by_label["//:fails"]  # (a line for each named target: it had none, and the summary did not count it)
    assert fails["status"] == "up_to_date" and fails["reason_code"] == "test_not_run", r.by_label
    assert "note: //:fails is a test; `build` builds only its dependencies, `buildtool test //:fails` runs it" \
        in r.stderr


def test_bad_config_key_is_exit_2(workspace: Workspace) -> None:
    workspace.write("buildtool.toml", "no_such_key = 1\n")
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="echo > $@")\n')
    rc, _, err = workspace.run("build")
    assert rc == 2
    assert "no_such_key" in err


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--events", "/dev/null/e.jsonl"], {}, "/dev/null is not a directory"),
    (["--events", "{tmp}"], {}, "is a directory"),
    (["--profile", "{tmp}"], {}, "--profile"),
    # A directory not made yet: a file named trace was written (and reports/junit.xml failed next time).
    (["--profile", "{tmp}/new/"], {}, "--profile {tmp}/new/: names a directory; name a file (reports/profile.json)"),
    (["--events", "{tmp}/new/."], {}, "names a directory; name a file (reports/events.jsonl)"),
    # A name too long for the file system: --profile (and --junit) failed only once the build was done.
    (["--profile", "{tmp}/" + "p" * 300], {}, "its file system allows"),
    (["--events", "{tmp}/new/" + "e" * 300], {}, "its file system allows"),
    (["--cache-dir="], {}, "--cache-dir"),
    (["--action-env", "=x"], {}, "--action-env"),
    (["--action-env", "1A=2"], {}, "--action-env"),
    ([], {"BUILDTOOL_KEEP_GOING": "maybe"}, "BUILDTOOL_KEEP_GOING"),
    ([], {"BUILDTOOL_ACTION_ENV": "A B"}, "BUILDTOOL_ACTION_ENV: action_env"),
    # (named the key, as if a file held it: "environment (BUILDTOOL_*): max_size must be")
    ([], {"BUILDTOOL_MAX_CACHE_SIZE": "lots"}, "BUILDTOOL_MAX_CACHE_SIZE: max_size must be a size"),
    ([], {"BUILDTOOL_RESTORE_MODE": "sym"}, "BUILDTOOL_RESTORE_MODE: restore_mode must be one of"),
    ([], {"BUILDTOOL_REMOTE_UPLOAD": "sometimes"}, "BUILDTOOL_REMOTE_UPLOAD"),
    # Python's int() takes these: -j 1_0 ran ten jobs, a fullwidth 3 three.
    (["-j", "1_0"], {}, "invalid integer value: '1_0'"),
    (["-j", "\uff13"], {}, "invalid integer value"),
    ([], {"BUILDTOOL_JOBS": "1_0"}, "BUILDTOOL_JOBS must be an integer (got '1_0')"),
    ([], {"BUILDTOOL_REMOTE_JOBS": "\uff14"}, "BUILDTOOL_REMOTE_JOBS must be a whole number"),
])
def test_bad_flag_values_are_exit_2_before_anything_runs(
    workspace: Workspace, tmp_path: Path, args: list[str], env: dict[str, str], needle: str
) -> None:
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("build", *[a.replace("{tmp}", str(tmp_path)) for a in args], env_extra=env)
    assert rc == 2, (rc, out, err)
    assert needle.replace("{tmp}", str(tmp_path)) in err and "Traceback" not in err, err
    assert not workspace.exists("g")
    assert not (tmp_path / "new").exists()  # (nothing made for a report that cannot be written)


@pytest.mark.parametrize("args", [["--cache-dir="], ["-j", "0"], ["-j", "1_0"], ["-j\uff13"], ["--events", ""],
                                  ["--action-env", "=x"]])
def test_bad_flag_values_are_exit_2_when_nothing_changed_too(workspace: Workspace, args: list[str]) -> None:
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="echo > $@")\n')
    assert workspace.build().rc == 0
    rc, out, err = workspace.run("build", *args)
    assert rc == 2, (rc, out, err)
    assert "nothing changed" not in out and "Traceback" not in err, out + err


@pytest.mark.parametrize("command", [["cache", "stats"], ["cache", "gc"], ["explain"], ["plan"],
                                     ["explain", "--action-env"]])
def test_every_command_refuses_an_empty_cache_dir_and_a_bad_action_env(
    workspace: Workspace, command: list[str],
) -> None:
    """`cache gc --cache-dir "$UNSET"` fell back to the default shared cache, over the one
    BUILDTOOL_CACHE_DIR names."""
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="echo > $@")\n')
    if command == ["explain", "--action-env"]:  # explain took any --action-env as well
        rc, out, err = workspace.run("explain", "--action-env", "=x")
        assert rc == 2 and "--action-env: '=x' is not NAME or NAME=VALUE" in err, (rc, out, err)
        return
    rc, out, err = workspace.run(*command, "--cache-dir", "")
    assert rc == 2 and "--cache-dir must name a directory" in err, (rc, out, err)


def test_patterns_may_stand_on_both_sides_of_an_option(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="a", outs=["a"], cmd="echo > $@")\n'
                             'genrule(name="b", outs=["b"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("build", "//:a", "-k", "//:b")
    assert rc == 0 and workspace.exists("a") and workspace.exists("b"), out + err
    rc, out, err = workspace.run("explain", "//:a", "--no-wait", "//:b")
    assert rc == 0 and "//:a" in out and "//:b" in out, out + err
    rc, out, err = workspace.run("build", "//:a", "--bogus", "//:b")
    assert rc == 2 and "unrecognized arguments: --bogus" in err and "goes before" not in err, err
    rc, out, err = workspace.run("build", "-C", ".", "//:a")  # (a global option after the command)
    assert rc == 2 and "-C DIR goes before the command: buildtool -C DIR build" in err, err


def test_dash_C_runs_as_if_started_there(workspace: Workspace, tmp_path: Path) -> None:
    """-C DIR is "as if started in DIR": a relative --events/--cache-dir went to the
    directory buildtool was started in, and a second -C replaced the first instead of
    going on from it (make -C, git -C).  A flag the command lacks shows its own usage."""
    workspace.build_file("lib", 'genrule(name="lib", outs=["l"], cmd="echo > $@")\n')
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    rc, out, err = workspace.run("-C", str(workspace.root), "-C", "lib", "build", ":lib", "--events", "ev.jsonl",
                                 "--cache-dir", "c", cwd=outside)
    assert rc == 0, out + err
    assert workspace.exists("lib/ev.jsonl") and workspace.exists("lib/c") and not list(outside.iterdir())
    rc, out, err = workspace.run("-C", str(workspace.root), "-C", "lib", "build", ":lib", "-n", cwd=outside,
                                 env_extra={"BUILDTOOL_CACHE_DIR": "c2"})  # (the variable as well)
    assert rc == 0 and workspace.exists("lib/c2") and not list(outside.iterdir()), out + err
    time.sleep(0.1)
    for _ in range(3):  # (and the snapshot's environment holds it as moved: a no-op, not a full build each time)
        rc, out, err = workspace.run("-C", str(workspace.root), "build", "//lib:lib", cwd=outside,
                                     env_extra={"BUILDTOOL_CACHE_DIR": "c3"})
    assert rc == 0 and "(nothing changed)" in out, out + err
    rc, out, err = workspace.run("build", "--bogus")
    assert rc == 2 and err.startswith("usage: buildtool build "), err


def test_an_old_output_file_may_become_a_directory_of_outputs(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="g", outs=["gen"], cmd="echo one > $@")\n')
    assert workspace.build().rc == 0
    workspace.build_file("", 'genrule(name="g", outs=["gen/a.txt"], cmd="echo two > $@")\n')
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("gen/a.txt") == "two\n"


def test_report_files_create_missing_directories(workspace: Workspace, tmp_path: Path) -> None:
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("build", "--events", str(tmp_path / "r" / "e" / "ev.jsonl"),
                                 "--profile", str(tmp_path / "r" / "p" / "prof.json"))
    assert rc == 0, out + err
    assert (tmp_path / "r" / "e" / "ev.jsonl").read_text().startswith('{"schema"')
    assert json.loads((tmp_path / "r" / "p" / "prof.json").read_text())["traceEvents"]


def test_an_events_file_on_a_full_disk_is_a_warning_then_exit_1(workspace: Workspace) -> None:
    """The build goes on and is recorded; the job fails at the end, without its report."""
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("build", "--events", "/dev/full")
    assert rc == 1, out + err
    assert "could not write the events file /dev/full" in err and "Traceback" not in err, err
    assert "the build succeeded, but --events /dev/full is incomplete" in err, err
    assert workspace.exists("g")
    rc, _, err = workspace.run("build", "-n", "--events", "/dev/full")  # a dry run's report likewise
    assert rc == 1 and "the dry run ended, but --events /dev/full is incomplete" in err, err
    rc, out, _ = workspace.run("build")
    assert rc == 0 and "up_to_date" in out, out


def test_an_events_file_cut_short_by_a_full_disk_ends_on_a_whole_line(workspace: Workspace, tmp_path: Path) -> None:
    """The write that failed left half a JSON line at the end, and the documented reader
    (json.loads of each line) crashed on it.  (A file-size limit makes the write fail for real.)"""
    import resource
    import subprocess

    from conftest import BUILDTOOL, _clean_env

    workspace.build_file("", '[genrule(name=f"a_rather_long_target_name_{i}", outs=[f"o{i}"], cmd="true > $@") '
                             'for i in range(40)]\n')
    events = tmp_path / "e.jsonl"

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))

    r = subprocess.run([BUILDTOOL, "build", "--events", str(events)], cwd=workspace.root, capture_output=True,
                       text=True, env=_clean_env(workspace.cache, workspace.home), preexec_fn=small_files, timeout=60)
    assert r.returncode == 1 and f"could not write the events file {events}" in r.stderr, r.stdout + r.stderr
    text = events.read_text()
    assert 0 < len(text) <= 4000 and text.endswith("\n"), text[-200:]
    assert [json.loads(line)["label"] for line in text.splitlines()[1:]], text


def test_a_pipe_failed_by_sigpipe_says_why(workspace: Workspace) -> None:
    """`seq ... | grep -q x`: pipefail makes the writer's SIGPIPE the pipe's status, and
    "exited with status 141" alone read as a flaky command to a Make user."""
    workspace.build_file("", """genrule(name="g", outs=["g"], cmd="seq 1 200000 | grep -q '^1$$' && echo > $@")\n""")
    r = workspace.build()
    assert r.rc == 1 and "exited with status 141 (141 is SIGPIPE: with pipefail on" in r.stdout, r.output
    assert "|| true" not in r.stdout, r.stdout  # (`w || true | r` reads `w || (true | r)`: no fix)
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="exit 141 || echo > $@")\n')  # (no pipe)
    r = workspace.build()
    assert r.rc == 1 and "exited with status 141" in r.stdout and "SIGPIPE" not in r.stdout, r.output


def test_a_declared_tool_missing_from_path_is_a_warning(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="echo > $@", tools=["no-such-tool-xyz"])\n'
                             'genrule(name="h", outs=["h"], cmd="echo > $@", tools=["no-such-tool-xyz"])\n')
    r = workspace.build()
    assert r.rc == 0, r.output
    assert r.stderr.count("no-such-tool-xyz") == 1, r.stderr  # (once, not once a target: CC=clang, 35 compiles)
    assert "warning: BUILD.py:1: //:g: declared tool 'no-such-tool-xyz' is not on the command's PATH" in r.stderr, \
        r.stderr


def test_a_declared_tool_that_is_a_version_manager_s_shim_is_a_warning(workspace: Workspace, tmp_path: Path) -> None:
    """pyenv's shims/python3 is the same script for every version: `echo 3.12 >
    .python-version` changed the interpreter and the test stayed PASSED (cached)."""
    shims = tmp_path / "pyenv" / "shims"
    shims.mkdir(parents=True)
    (shims / "py").write_text('#!/bin/sh\nexec python3 "$@"\n')
    (shims / "py").chmod(0o755)
    workspace.build_file("", 'genrule(name="g", outs=["g"], cmd="py -c pass > $@", tools=["py"])\n'
                             'genrule(name="h", outs=["h"], cmd="py -c pass > $@", tools=["py"])\n')
    r = workspace.build(env_extra={"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"})
    assert r.rc == 0, r.output
    assert r.stderr.count("a version manager's shim") == 1, r.stderr  # (once a build)
    assert f"declared tool 'py' is {shims / 'py'}, a version manager's shim" in r.stderr, r.stderr
    # Its advice taken (the version file in srcs), or a workspace's own tools/shims/: no word.
    workspace.write(".python-version", "3.11\n")
    workspace.write("tools/shims/gen", '#!/bin/sh\necho > "$1"\n')
    (workspace.root / "tools" / "shims" / "gen").chmod(0o755)
    workspace.build_file("", 'genrule(name="g", srcs=[".python-version"], outs=["g"], cmd="py -c pass > $@", '
                             'tools=["py"])\n'
                             'genrule(name="w", outs=["w"], cmd="tools/shims/gen $@", tools=["tools/shims/gen"])\n')
    r = workspace.build(env_extra={"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"})
    assert r.rc == 0 and "shim" not in r.stderr, r.output


# -- outputs of targets that are gone: deleted, unless they are the user's now ------------
def test_a_dead_output_that_became_a_source_is_kept(workspace: Workspace) -> None:
    """notes.txt was generated; then the target goes and a hand-written notes.txt is a
    source: cleaning dead outputs must not delete it under the build that reads it."""
    workspace.build_file("", 'genrule(name="gen", outs=["notes.txt"], cmd="echo generated > $@")')
    assert workspace.build().rc == 0
    workspace.build_file("", 'genrule(name="use", srcs=["notes.txt"], outs=["use.out"], cmd="cat $< > $@")')
    workspace.write("notes.txt", "my precious notes\n")
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("notes.txt") == "my precious notes\n" == workspace.read("use.out")
    assert "kept notes.txt: an output of //:gen before, it is a source now" in r.stderr


def test_outputs_moved_with_their_package_directory_and_globbed_as_sources_are_warned_of(
        workspace: Workspace) -> None:
    """`mv pkg pkg2` (an IDE's folder rename) took pkg/A.txt, an output, along: pkg2's glob
    made it a source, silently, which a fresh checkout does not have."""
    build = ('genrule(name="up", srcs=["a.txt"], outs=["{out}"], cmd="tr a-z A-Z < $< > $@")\n'
             'genrule(name="list", srcs=glob(["*.txt"]), outs=["list.out"], cmd="ls $(SRCS) > $@")\n')
    workspace.build_file("pkg", build.format(out="A.txt"))
    workspace.write("pkg/a.txt", "a\n")
    assert workspace.build().rc == 0
    (workspace.root / "pkg").rename(workspace.root / "pkg2")
    workspace.build_file("pkg2", build.format(out="upper.txt"))
    r = workspace.build()
    assert r.rc == 0, r.output
    assert "1 source is an output an earlier build made at another path, moved there with their directory: " \
           "pkg2/A.txt (was pkg/A.txt, an output of //pkg:up)" in r.stderr, r.stderr
    assert "upper.txt" not in r.stderr and workspace.build().stderr == ""  # (said once; nothing else)


def test_a_checked_in_file_like_a_removed_target_s_output_is_not_taken_for_a_moved_one(
        workspace: Workspace) -> None:
    """The same name and content (an empty __init__.py, a VERSION) is not the same file: a
    package deleted with its outputs made every such source "an output moved here", with
    advice to delete it (300 warnings for 300 __init__.py files)."""
    workspace.build_file("old", 'genrule(name="init", outs=["__init__.py"], cmd="touch $@")\n'
                                'genrule(name="ver", outs=["VERSION"], cmd="echo 1.0 > $@")\n')
    for d in ("lib", "lib/a", "lib/b"):
        workspace.write(f"{d}/__init__.py", "")
    workspace.write("lib/VERSION", "1.0\n")
    workspace.build_file("lib", 'genrule(name="pkg", srcs=glob(["**/*.py"]) + ["VERSION"], outs=["out.txt"], '
                                'cmd="cat $(SRCS) > $@")\n')
    assert workspace.build().rc == 0
    shutil.rmtree(workspace.root / "old")
    r = workspace.build()
    assert r.rc == 0 and "moved there" not in r.stderr, r.stderr


def test_an_edited_dead_output_is_kept_an_untouched_one_deleted_and_clean_keeps_edits(
    workspace: Workspace,
) -> None:
    workspace.build_file("", 'genrule(name="gen", outs=["x.txt"], cmd="echo generated > $@")\n'
                             'genrule(name="old", outs=["old.txt"], cmd="echo generated > $@")\n'
                             'genrule(name="g2", outs=["y.txt"], cmd="echo generated > $@")')
    assert workspace.build().rc == 0
    workspace.write("x.txt", "edited by hand\n")
    workspace.build_file("", 'genrule(name="g2", outs=["y.txt"], cmd="echo generated > $@")')
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("x.txt") == "edited by hand\n" and not workspace.exists("old.txt")
    assert "kept x.txt" in r.stderr and "not what the build wrote" in r.stderr
    workspace.write("y.txt", "also edited\n")
    rc, _, err = workspace.run("clean")
    assert rc == 0 and workspace.read("y.txt") == "also edited\n" and "kept y.txt" in err, err


def test_a_dead_output_a_checkout_put_back_with_the_same_content_is_kept(workspace: Workspace) -> None:
    """A branch where the generated d.txt is checked in, its generator gone: the checkout
    wrote d.txt (a new file, the very content the build wrote) and the next build deleted
    it as a dead output, unsaid: `git status` showed it deleted and the glob left it out."""
    workspace.write("a.txt", "alpha\n")
    workspace.build_file("", 'genrule(name="all", srcs=glob(["*.txt"]), outs=["all.out"], cmd="cat $(SRCS) > $@")\n'
                             'genrule(name="mkd", outs=["d.txt"], cmd="echo delta > $@")\n')
    assert workspace.build().rc == 0
    workspace.build_file("", 'genrule(name="all", srcs=glob(["*.txt"]), outs=["all.out"], cmd="cat $(SRCS) > $@")\n')
    os.unlink(workspace.root / "d.txt")  # (as git does: unlink, then write the blob anew)
    workspace.write("d.txt", "delta\n")
    r = workspace.build()
    assert r.rc == 0 and workspace.read("d.txt") == "delta\n", r.output
    assert "kept d.txt: an output of //:mkd before, it was written again since the build left it" in r.stderr, \
        r.stderr
    assert workspace.read("all.out") == "alpha\ndelta\n"  # (a source now: the glob has it)
    # One the build left as it was goes, as before; so does one copied with its mtime (cp -a,
    # tar: another inode) and, after a crash (the record newer than the stat cache), one the
    # stat cache cannot vouch for but whose content is the build's.
    import shutil

    def copied(path: Path) -> None:
        shutil.copy2(path, path.with_name("tmp-copy"))
        os.replace(path.with_name("tmp-copy"), path)

    def after_a_crash(path: Path) -> None:
        os.unlink(path)
        path.write_text("e\n")
        record = workspace.root / ".buildtool" / "record"
        os.utime(record, ns=(record.stat().st_atime_ns, record.stat().st_mtime_ns + 10_000_000_000))

    for change in (None, copied, after_a_crash):
        workspace.build_file("", 'genrule(name="mke", outs=["e.out"], cmd="echo e > $@")\n'
                                 'genrule(name="k", outs=["k.out"], cmd="echo k > $@")\n')
        assert workspace.build().rc == 0
        if change is not None:
            change(workspace.root / "e.out")
        workspace.build_file("", 'genrule(name="k", outs=["k.out"], cmd="echo k > $@")\n')
        r = workspace.build()
        assert r.rc == 0 and not workspace.exists("e.out") and "kept" not in r.stderr, (change, r.output)
    # ... also after a build that wrote the record and no stat (a test rerun): the stat cache
    # is still the record's (it was taken for one a crash left behind, and the file deleted)
    workspace.build_file("", 'genrule(name="mkd", outs=["d3.txt"], cmd="echo delta > $@")\n'
                             'test(name="t", cmd="true")\n')
    assert workspace.build().rc == 0 and workspace.build(command="test").rc == 0
    workspace.build_file("", 'genrule(name="mkd", outs=["d3.txt"], cmd="echo delta > $@")\n'
                             'test(name="t", cmd="true; true")\n')
    assert workspace.build(command="test").rc == 0
    os.unlink(workspace.root / "d3.txt")
    workspace.write("d3.txt", "delta\n")
    workspace.build_file("", 'test(name="t", cmd="true; true")\n')
    r = workspace.build(command="test")
    assert r.rc == 0 and workspace.read("d3.txt") == "delta\n", r.output
    assert "kept d3.txt: an output of //:mkd before, it was written again" in r.stderr, r.output
    # A build killed after rewriting an output and recording it, then a build of something
    # else: the stat cache's entry of that output stayed the older file's, and removing its
    # rule later kept the build's own file as "written again" (the entries are forgotten now).
    workspace.build_file("", 'genrule(name="t", outs=["t.out"], cmd="echo t > $@")\n'
                             'genrule(name="u", outs=["u.out"], cmd="echo u > $@")\n'
                             'genrule(name="other", outs=["other.out"], cmd="echo o > $@")\n')
    assert workspace.build().rc == 0
    os.unlink(workspace.root / "t.out")  # (the killed build's rewrite)
    workspace.write("t.out", "t\n")
    record = workspace.root / ".buildtool" / "record"
    os.utime(record, ns=(record.stat().st_atime_ns, record.stat().st_mtime_ns + 10_000_000_000))
    workspace.write("other.in", "x\n")
    workspace.build_file("", 'genrule(name="t", outs=["t.out"], cmd="echo t > $@")\n'
                             'genrule(name="u", outs=["u.out"], cmd="echo u > $@")\n'
                             'genrule(name="other", srcs=["other.in"], outs=["other.out"], cmd="echo o > $@")\n')
    assert workspace.build("//:other").rc == 0
    os.unlink(workspace.root / "u.out")  # (and a checkout then writes u.out, which the crash never touched:
    workspace.write("u.out", "u\n")  # its entry was kept, so it is still known as written again)
    workspace.build_file("", 'genrule(name="other", srcs=["other.in"], outs=["other.out"], cmd="echo o > $@")\n')
    r = workspace.build()
    assert r.rc == 0 and not workspace.exists("t.out") and "kept t.out" not in r.stderr, r.output
    assert workspace.read("u.out") == "u\n" and "kept u.out: an output of //:u before, it was written again" \
        in r.stderr, r.output
    # `clean` keeps a file a checkout put there as `build` does
    workspace.build_file("", 'genrule(name="mkd", outs=["d2.txt"], cmd="echo delta > $@")\n')
    assert workspace.build().rc == 0
    os.unlink(workspace.root / "d2.txt")
    workspace.write("d2.txt", "delta\n")
    rc, _, err = workspace.run("clean")
    assert rc == 0 and workspace.read("d2.txt") == "delta\n" and "kept d2.txt: it was written again since" in err, err


def test_outputs_in_a_package_ignored_since_are_kept_as_plain_files(workspace: Workspace) -> None:
    """Adding vendor/ to .buildtoolignore says "leave it alone": the next build deleted the
    files buildtool had built there, as dead outputs.  They stay, said in a note, and the
    record forgets them."""
    workspace.build_file("vendor", 'genrule(name="x", outs=["x.txt"], cmd="echo built > $@")')
    workspace.build_file("ok", 'genrule(name="y", outs=["y.txt"], cmd="echo y > $@")')
    assert workspace.build().rc == 0
    workspace.write(".buildtoolignore", "vendor\n")
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("vendor/x.txt") == "built\n"
    assert "note: kept 1 output(s) of earlier builds in packages that .buildtoolignore now leaves out " \
        "(vendor/x.txt)" in r.stderr, r.stderr
    r = workspace.build()
    assert r.rc == 0 and "kept" not in r.stderr and workspace.read("vendor/x.txt") == "built\n", r.output
    rc, out, err = workspace.run("clean")
    assert rc == 0 and workspace.read("vendor/x.txt") == "built\n" and not workspace.exists("ok/y.txt"), err
    assert out == "removed 1 output and the workspace state\n", out  # (not "1 outputs")


@pytest.mark.parametrize(("marker", "why"), [
    ("vendor/buildtool.toml", "a nested buildtool.toml now makes a workspace of its own"),
    ("vendor/CACHEDIR.TAG", "a CACHEDIR.TAG now marks a cache directory"),
])
def test_outputs_in_a_package_that_became_a_nested_workspace_or_a_cache_are_kept(
    workspace: Workspace, marker: str, why: str
) -> None:
    """As with .buildtoolignore: the directory is no longer this workspace's to clean (a
    nested buildtool.toml deleted the files built there without a word)."""
    workspace.build_file("vendor", 'genrule(name="x", outs=["x.txt"], cmd="echo built > $@")')
    workspace.build_file("ok", 'genrule(name="y", outs=["y.txt"], cmd="echo y > $@")')
    assert workspace.build().rc == 0
    workspace.write(marker, "Signature: 8a477f597d28d172789f06886806bc55\n" if marker.endswith(".TAG") else "")
    r = workspace.build()
    assert r.rc == 0, r.output
    assert workspace.read("vendor/x.txt") == "built\n"
    assert f"note: kept 1 output(s) of earlier builds in packages that {why} (vendor/x.txt)" in r.stderr, r.stderr
    r = workspace.build()
    assert r.rc == 0 and "kept" not in r.stderr and workspace.read("vendor/x.txt") == "built\n", r.output


def test_a_dead_output_whose_directory_now_links_outside_is_kept_and_so_is_it_by_clean(
    workspace: Workspace, tmp_path: Path
) -> None:
    """gen/ was the build's directory; the user replaced it with a link to a directory of
    their own holding a file of the same name and content.  Neither the removal of dead
    outputs nor `clean` may delete that file through the link."""
    shared = tmp_path / "shared"
    shared.mkdir()
    for cleaning in (False, True):
        workspace.write("s.txt", "data\n")
        workspace.build_file("", 'genrule(name="x", srcs=["s.txt"], outs=["gen/o.txt"], cmd="cat $< > $@")')
        assert workspace.build().rc == 0
        shutil.rmtree(workspace.root / "gen")
        (shared / "o.txt").write_text("data\n")
        os.symlink(shared, workspace.root / "gen")
        if cleaning:
            rc, _, err = workspace.run("clean")
            assert rc == 0, err
        else:
            workspace.build_file("", 'genrule(name="y", srcs=["s.txt"], outs=["z.txt"], cmd="cat $< > $@")')
            r = workspace.build()
            assert r.rc == 0, r.output
            err = r.stderr
        assert (shared / "o.txt").read_text() == "data\n", err
        assert f"kept gen/o.txt: {'' if cleaning else 'an output of //:x before, '}its directory 'gen' leads " \
               "outside the workspace (through a symbolic link)" in err, err
        os.unlink(workspace.root / "gen")


def test_an_output_read_through_a_link_as_a_source_is_refused_when_built_alone(workspace: Workspace) -> None:
    """alias -> real: 'alias/o.txt' is //real's output, read by //:a with no dependency on
    //real:r, so it went stale when built alone.  A source of //real read through the link
    is a source (hashed, so never stale)."""
    workspace.write("real/s.txt", "hi\n")
    workspace.build_file("real", 'genrule(name="r", srcs=["s.txt"], outs=["o.txt"], cmd="cat $< > $@")')
    os.symlink("real", workspace.root / "alias")
    workspace.build_file("", 'genrule(name="a", srcs=["alias/o.txt"], outs=["x.txt"], cmd="cat $< > $@")')
    assert workspace.build("//real:r").rc == 0
    r = workspace.build("//:a")
    assert r.rc == 2, r.output
    assert "BUILD.py:1: source 'alias/o.txt' of //:a is really 'real/o.txt' (through a symlinked directory), " \
           "an output of //real:r: refer to '//real:r' instead" in r.stderr, r.stderr
    workspace.build_file("", 'genrule(name="a", srcs=["//real:r"], outs=["x.txt"], cmd="cat $< > $@")')
    assert workspace.build("//:a").rc == 0 and workspace.read("x.txt") == "hi\n"
    workspace.build_file("", 'genrule(name="a", srcs=["alias/s.txt"], outs=["x.txt"], cmd="cat $< > $@")')
    workspace.write("real/s.txt", "ho\n")
    assert workspace.build("//:a").rc == 0 and workspace.read("x.txt") == "ho\n"
    workspace.build_file("real", "genrule(name=")  # broken: no business of //:a's, built alone
    workspace.write("real/s.txt", "hu\n")
    r = workspace.build("//:a")
    assert r.rc == 0 and workspace.read("x.txt") == "hu\n", r.output


def _immutable(path: Path) -> None:
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("cannot make a file immutable here (chattr, root, a filesystem that has the flag)")


def test_an_output_that_cannot_be_removed_is_said_and_clean_keeps_the_state(workspace: Workspace) -> None:
    """A dead output whose unlink fails is warned about (it stays); `clean` failing to
    remove an output says so, exits 1 and keeps the record, so a later clean tries again."""
    workspace.build_file("", 'genrule(name="a", outs=["a.out"], cmd="echo a > $@")\n'
                             'genrule(name="b", outs=["b.out"], cmd="echo b > $@")\n')
    assert workspace.build().rc == 0
    _immutable(workspace.root / "a.out")
    try:
        workspace.build_file("", 'genrule(name="b", outs=["b.out"], cmd="echo b > $@")\n')
        r = workspace.build()
        assert r.rc == 0 and "could not remove a.out, an output no target declares any more" in r.stderr, r.output
        workspace.build_file("", 'genrule(name="a", outs=["a.out"], cmd="echo a > $@")\n'
                                 'genrule(name="b", outs=["b.out"], cmd="echo b > $@")\n')
        subprocess.run(["chattr", "-i", str(workspace.root / "a.out")], check=True)
        assert workspace.build().rc == 0
        _immutable(workspace.root / "a.out")
        rc, out, err = workspace.run("clean")
        assert rc == 1 and "could not remove a.out" in err and "the build state is kept" in err, out + err
        assert not workspace.exists("b.out") and workspace.exists(".buildtool/record")
    finally:
        subprocess.run(["chattr", "-i", str(workspace.root / "a.out")], check=False)
    rc, _, err = workspace.run("clean")
    assert rc == 0 and not workspace.exists("a.out"), err


def test_clean_that_cannot_remove_the_state_says_so_and_exits_1(workspace: Workspace) -> None:
    """A read-only (here: immutable) .buildtool: clean said "removed 0 outputs and the
    workspace state" and exited 0, and the record it kept still vouched for every target."""
    workspace.build_file("", 'test(name="t", cmd="true")\n')
    assert workspace.run("test")[0] == 0
    with immutable(workspace.root / ".buildtool"):
        rc, out, err = workspace.run("clean")
        assert rc == 1 and "removed 0 output(s) but not the workspace state: could not remove .buildtool/" in err \
            and "(Operation not permitted)" in err and "cached test results" in err, (rc, out, err)
    assert workspace.exists(".buildtool/record")
    rc, out, err = workspace.run("clean")
    assert rc == 0 and "workspace state" in out and not workspace.exists(".buildtool/record"), (rc, out, err)


def test_clean_removes_the_directories_it_emptied_and_keeps_the_others(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="g", outs=["out/deep/g.txt", "kept/g.txt"], cmd="echo > out/deep/g.txt; '
                             'echo > kept/g.txt")\n')
    workspace.write("kept/mine.txt", "a user's file\n")
    assert workspace.build().rc == 0
    rc, _, err = workspace.run("clean")
    assert rc == 0, err
    assert not workspace.exists("out") and not workspace.exists("kept/g.txt") and workspace.exists("kept/mine.txt")


def test_clean_with_a_build_py_that_does_not_parse_warns_in_one_readable_line(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="a", outs=["a.txt"], cmd="echo > $@")\n')
    assert workspace.build().rc == 0
    workspace.write("BUILD.py", workspace.read("BUILD.py") + "bad(\n")
    rc, out, err = workspace.run("clean")
    assert rc == 0 and not workspace.exists("a.txt"), (rc, out, err)
    assert "could not evaluate // (BUILD.py:2: syntax error: '(' was never closed); outputs" in err, err
    assert "\\n" not in err


@pytest.mark.parametrize("spelling", ["vend/vendored.txt", "//:vend/vendored.txt", ":vend/vendored.txt"])
def test_clean_keeps_a_removed_rules_output_that_is_a_source_now(workspace: Workspace, spelling: str) -> None:
    """A generated file kept as a source and its rule dropped, then clean before any build:
    clean deleted the only copy (a build in between would have kept it, with a warning)."""
    workspace.build_file("", 'genrule(name="gen", outs=["vend/vendored.txt"], cmd="echo once > $@")\n'
                             'genrule(name="other", outs=["o.txt"], cmd="echo > $@")')
    assert workspace.build().rc == 0
    workspace.build_file("", f'genrule(name="use", srcs=["{spelling}"], outs=["u.txt"], cmd="cat $< > $@")\n'
                             'genrule(name="other", outs=["o.txt"], cmd="echo > $@")')
    rc, _, err = workspace.run("clean")
    assert rc == 0 and workspace.read("vend/vendored.txt") == "once\n", err
    assert "kept vend/vendored.txt: an output before, it is a source now" in err and not workspace.exists("o.txt")


def test_clean_still_removes_live_outputs_that_globs_or_labels_reach(workspace: Workspace) -> None:
    """The first version of the check above took every file a glob matched on disk, and
    every label's name, as a source: live outputs (gen.txt, sub/tool) were kept, with a
    false 'it is a source now'."""
    workspace.write("notes.txt", "a\n")
    workspace.build_file("sub", 'genrule(name="tool", outs=["tool"], cmd="echo > $@")')
    workspace.build_file("", 'genrule(name="gen", outs=["gen.txt"], cmd="echo hi > $@")\n'
                             'genrule(name="pack", srcs=glob(["*.txt"]) + [":gen", "//sub:tool"], outs=["pack.out"],\n'
                             '        cmd="cat $(SRCS) > $@")')
    assert workspace.build().rc == 0
    rc, _, err = workspace.run("clean")
    assert rc == 0 and "source now" not in err, err
    assert not workspace.exists("gen.txt") and not workspace.exists("sub/tool") and workspace.exists("notes.txt")


def test_an_output_may_replace_the_directory_of_earlier_outputs(workspace: Workspace) -> None:
    """``outs=["x/y/z"]`` becomes ``outs=["x"]``: the directory holds only what the build
    wrote, so it goes like any dead output; with a file of the user's in it, exit 2."""
    def declare(out: str) -> None:
        workspace.build_file("", f'genrule(name="t", outs=["{out}"], cmd="echo {out} > $@")')

    def refused() -> None:  # outs=["x"] where x/ holds something not the build's
        declare("x")
        rc, _, err = workspace.run("build")
        assert rc == 2 and "BUILD.py:1: output 'x' of //:t is an existing directory" in err, err

    declare("x/y/z")
    assert workspace.build().rc == 0
    declare("x")
    r = workspace.build()
    assert r.rc == 0 and workspace.read("x") == "x\n", r.output
    # A file of the user's in x/, the earlier output itself edited (kept, as edited dead
    # outputs are), a link to a directory in there: exit 2, before anything runs.
    for path, text in (("x/mine.txt", "the user's\n"), ("x/y", "edited\n"), ("x/link", None)):
        declare("x/y")
        assert workspace.build().rc == 0
        if text is None:
            workspace.path("x/y").unlink()
            os.symlink(workspace.root, workspace.root / path)
        else:
            workspace.write(path, text)
        refused()
        if text is not None:
            assert workspace.read(path) == text
            workspace.path(path).unlink()


@pytest.mark.parametrize("how", ["ran", "restored"])
def test_an_empty_directory_where_an_output_goes_is_replaced_as_the_graph_check_allows(
        workspace: Workspace, how: str) -> None:
    """After a no-op (the snapshot's graph is reused, unchecked), an empty directory where
    an output goes failed a target that had to run (exit 1), and a restore hit it (a
    warning, then a rerun), where a checked graph replaced it silently."""
    workspace.write("a.txt", "a\n")
    workspace.build_file("", 'genrule(name="g", srcs=["a.txt"], outs=["g.out"], cmd="cat $< > $@")\n')
    assert workspace.build().rc == 0
    time.sleep(0.1)
    assert workspace.build().rc == 0
    workspace.path("g.out").unlink()
    workspace.path("g.out").mkdir()
    if how == "ran":
        workspace.write("a.txt", "a2\n")  # (no cache entry: the command runs)
    rc, out, err = workspace.run("build")  # (no --events: the snapshot's graph is used)
    assert rc == 0 and workspace.read("g.out") == ("a2\n" if how == "ran" else "a\n"), out + err
    assert f"1 {how}" in out and "warning" not in err, out + err


def test_a_directory_made_where_an_output_goes_is_never_deleted(workspace: Workspace) -> None:
    """After a no-op (the graph is then reused from the snapshot, unchecked), someone puts
    a directory with files where an output goes: the build must fail on it, not rmtree it."""
    workspace.write("a.txt", "a\n")
    workspace.build_file("", 'genrule(name="g", srcs=["a.txt"], outs=["g.out"], cmd="cat $< > $@")\n'
                             'genrule(name="h", srcs=[":g"], outs=["h.out"], cmd="cat $< > $@")')
    assert workspace.build().rc == 0
    time.sleep(0.1)  # past the snapshot's racy window
    assert workspace.build().rc == 0
    workspace.path("g.out").unlink()
    workspace.write("g.out/important.txt", "data\n")
    r = workspace.build()
    assert r.rc != 0
    assert workspace.read("g.out/important.txt") == "data\n"
    assert "is an existing directory" in r.output, r.output
    assert r.stderr.count("could not restore") <= 1, r.stderr
    rc, _, err = workspace.run("build")
    assert rc == 2 and "BUILD.py:1: output 'g.out' of //:g is an existing directory" in err, err


def test_a_source_made_executable_changes_the_key_and_the_restored_mode(workspace: Workspace) -> None:
    """`cp` carries the x bit: chmod +x on a source must rerun, and a restore from the
    cache must give the mode of the key's run, not of an earlier one."""
    workspace.write("s.sh", "#!/bin/sh\necho hi\n")
    workspace.build_file("", 'genrule(name="c", srcs=["s.sh"], outs=["out.sh"], cmd="cp $< $@")')
    assert workspace.build().rc == 0
    workspace.path("s.sh").chmod(0o755)
    r = workspace.build("--explain")
    assert r.rc == 0 and "input s.sh became executable" in r.stdout, r.output
    assert os.access(workspace.path("out.sh"), os.X_OK)
    assert workspace.run("clean")[0] == 0
    r = workspace.build()
    assert r.rc == 0 and r.status("//:c") == "restored", r.output
    assert os.access(workspace.path("out.sh"), os.X_OK)


def test_a_dependency_output_losing_its_x_bit_with_the_same_content_reruns_its_dependents(
    workspace: Workspace,
) -> None:
    """Early cutoff compared only the bytes of a dependency's output: the same script no
    longer made executable left the `cp` of it (still 0755) and its test (cached pass, a
    clean run fails with 126) up to date, and the shared cache answered both input states
    with one entry."""
    workspace.build_file("", 'genrule(name="tool", outs=["run.sh"], cmd="echo exit 0 > $@ && chmod +x $@")\n'
                             'genrule(name="copy", srcs=[":tool"], outs=["copy.sh"], cmd="cp $< $@")\n'
                             'test(name="t", srcs=[":tool"], cmd="./run.sh")\n')
    assert workspace.build("//...", "//:copy", command="test").rc == 0
    workspace.build_file("", workspace.read("BUILD.py").replace(" && chmod +x $@", ""))
    r = workspace.build("//...", "//:copy", "--explain", "-k", command="test")
    assert r.rc != 0 and r.status("//:t") == "failed", r.output
    assert "dependency //:tool's output run.sh is no longer executable (same content)" in r.stdout, r.output
    assert not os.access(workspace.path("copy.sh"), os.X_OK)
    assert workspace.run("clean")[0] == 0  # the cache holds both states apart
    r = workspace.build("//:copy")
    assert r.rc == 0 and r.status("//:copy") == "restored" and not os.access(workspace.path("copy.sh"), os.X_OK)


def test_a_nested_workspace_is_not_part_of_the_outer_one(workspace: Workspace) -> None:
    """inner/ has its own buildtool.toml: `//...` of the outer workspace does not walk
    into it (it is built from inside), as Bazel does not cross into a nested workspace."""
    workspace.build_file("", 'genrule(name="o", outs=["o.out"], cmd="echo > $@")')
    workspace.write("inner/buildtool.toml", "")
    workspace.build_file("inner", 'genrule(name="i", outs=["i.out"], cmd="echo > $@")')
    r = workspace.build()
    assert r.rc == 0 and set(r.by_label) == {"//:o"}, r.output
    assert not workspace.exists("inner/i.out")
    rc, _, err = workspace.run("build", "//inner:i")  # nor through a label
    assert rc == 2 and "//inner" in err and not workspace.exists("inner/i.out"), err


def test_a_pooled_target_behind_an_up_to_date_one_still_runs(workspace: Workspace) -> None:
    # Pool depth 1: a runs; b (unchanged) and c wait.  b is let in when a ends and found
    # up to date: c must run all the same (it was left out, "cancelled", and the build
    # passed with a stale c.out).
    workspace.write("buildtool.toml", "[pools]\np = 1\n")
    for n in "abc":
        workspace.write(f"{n}.txt", "0\n")
    workspace.build_file("", """
        genrule(name="a", srcs=["a.txt"], outs=["a.out"], cmd="sleep 0.3; cat $< > $@", pool="p", priority=-2)
        genrule(name="b", srcs=["b.txt"], outs=["b.out"], cmd="cat $< > $@", pool="p", priority=-1)
        genrule(name="c", srcs=["c.txt"], outs=["c.out"], cmd="cat $< > $@", pool="p")
    """)
    assert workspace.build("//...", "-j3").rc == 0
    workspace.write("a.txt", "1\n")
    workspace.write("c.txt", "1\n")
    r = workspace.build("//...", "-j3")
    assert r.rc == 0, r.output
    assert r.status("//:c") == "ran"
    assert workspace.read("c.out") == "1\n"


def test_fail_fast_starts_nothing_after_an_output_goes_missing(workspace: Workspace) -> None:
    # a exits 0 without one of its outputs, after a large one whose hashing goes to a
    # worker: its lane was freed before the outputs were checked, so b started after the
    # failure (docs: on the first failure no new work starts).
    workspace.build_file("", """
        genrule(name="a", outs=["big.out", "missing.out"], cmd="truncate -s 64M big.out", priority=-1)
        genrule(name="b", outs=["b.out"], cmd="echo b > $@")
    """)
    r = workspace.build("//...", "-j1")
    assert r.rc == 1
    assert "declared output missing.out was not created" in r.output
    assert r.status("//:b") == "cancelled"
    assert not workspace.exists("b.out")


def test_a_target_whose_command_changed_keeps_its_recorded_weight(workspace: Workspace) -> None:
    # Every command changes; the longest recorded one must start first.  It was predicted
    # fresh (sources unchanged), weighed ~0, and started last.
    def declare(extra: str) -> None:
        workspace.build_file("", f"""
            genrule(name="y1", outs=["y1.out"], cmd="sleep 0.1; echo{extra} y1 > $@")
            genrule(name="y2", outs=["y2.out"], cmd="sleep 0.1; echo{extra} y2 > $@")
            genrule(name="x", outs=["x.out"], cmd="sleep 0.4; echo{extra} x > $@")
        """)

    declare("")
    first = workspace.build("//...", "-j1")
    assert [e["label"] for e in first.events] == ["//:y1", "//:y2", "//:x"]  # nothing recorded: declaration order
    declare(" -n")
    second = workspace.build("//...", "-j1")
    assert second.rc == 0
    assert second.events[0]["label"] == "//:x"


def test_a_group_weighs_nothing_and_an_always_target_its_recorded_time(workspace: Workspace) -> None:
    """Groups have no record entry: each weighed the median duration, so four nested ones
    made four short targets outrank a longer chain.  An always=True target was predicted
    fresh (same command, same sources) and weighed ~0 though it always reruns."""
    workspace.write("in.txt", "1\n")
    workspace.build_file("", """
        genrule(name="c1", srcs=["in.txt"], outs=["c1.out"], cmd="sleep 0.5; cat $< > $@")
        genrule(name="c2", srcs=[":c1"], outs=["c2.out"], cmd="sleep 0.5; cat $< > $@")
        genrule(name="c3", srcs=[":c2"], outs=["c3.out"], cmd="sleep 0.5; cat $< > $@")
        for i in range(4):
            genrule(name=f"y{i}", srcs=["in.txt"], outs=[f"y{i}.out"], cmd="sleep 0.3; cat $< > $@")
        group(name="g1", deps=[f":y{i}" for i in range(4)])
        group(name="g2", deps=[":g1"])
        group(name="g3", deps=[":g2"])
        group(name="g4", deps=[":g3"])
        genrule(name="final", srcs=[":g4", ":c3"], outs=["final.out"], cmd="cat $(SRCS) > $@")
        genrule(name="stamp", outs=["stamp.out"], cmd="sleep 1.25; date +%N > $@", always=True)
    """)
    assert workspace.build("//...", "//:stamp", "-j2").rc == 0  # (always=True: named, not in //...)
    workspace.write("in.txt", "2\n")
    r = workspace.build("//...", "//:stamp", "-j1")
    assert r.rc == 0, r.output
    order = [e["label"] for e in sorted(r.events, key=lambda e: e["start"]) if e["status"] == "ran"]
    # c1 -> c2 -> c3 (1.5 s) first, then the stamp (1.25 s) before c2 (1 s left), the y's
    # (0.3 s; 1.5 s with four median-weighted groups, as before) last
    assert order[:3] == ["//:c1", "//:stamp", "//:c2"], order
    assert {"//:y0", "//:y1", "//:y2", "//:y3"} <= set(order[3:]), order


def test_after_clean_the_cache_gives_the_weights_the_record_held(workspace: Workspace) -> None:
    """Durations lived in the build record only: after `clean` (or in a fresh CI checkout
    sharing the cache) every target weighed 1 s, and the chain with the most targets went
    first though a shorter one took longer.  The cache keeps each label's last duration."""
    workspace.write("in.txt", "1\n")
    workspace.build_file("", """
        for c in range(2):
            for k in range(3):
                dep = [f":s{c}_{k - 1}"] if k else []
                genrule(name=f"s{c}_{k}", srcs=["in.txt"] + dep, outs=[f"s{c}_{k}.out"], cmd="sleep 0.05; echo > $@")
        genrule(name="L1", srcs=["in.txt"], outs=["L1.out"], cmd="sleep 0.4; cat $< > $@")
        genrule(name="L2", srcs=[":L1"], outs=["L2.out"], cmd="sleep 0.4; cat $< > $@")
    """)
    assert workspace.build("-j2").rc == 0
    rc, _, err = workspace.run("clean")
    assert rc == 0, err
    workspace.write("in.txt", "2\n")  # (every key changes: nothing is restored)
    plan = workspace.run("plan", "-j1")
    path = re.search(r"critical path \(([0-9.]+)s\): //:L1 ", plan[1])
    assert plan[0] == 0 and path and float(path.group(1)) >= 0.8, plan
    r = workspace.build("-j1")
    assert r.rc == 0, r.output
    order = [e["label"] for e in sorted(r.events, key=lambda e: e["start"]) if e["status"] == "ran"]
    assert order[:2] == ["//:L1", "//:L2"], order


def test_a_never_run_target_weighs_the_median_of_the_recorded_durations(workspace: Workspace) -> None:
    """User guide: a target never run counts as the median recorded duration (else 1 s):
    here 2 s, more than //:z's recorded 1.3 s, so at -j1 the new //:n starts first (at 1 s
    it would wait behind //:z, declared before it)."""
    workspace.build_file("", "".join(f'genrule(name="{n}", outs=["{n}.out"], cmd="echo > $@")\n' for n in "abz"))
    assert workspace.build().rc == 0
    record = workspace.path(".buildtool/record")
    lines = record.read_text().splitlines()
    durations = {"//:a": 2.0, "//:b": 2.0, "//:z": 1.3}
    edited = [lines[0]] + [json.dumps({**e, "d": durations[e["l"]]}) for e in map(json.loads, lines[1:])]
    record.write_text("\n".join(edited) + "\n")
    workspace.build_file("", "".join(f'genrule(name="{n}", outs=["{n}.out"], cmd="echo {n} > $@")\n'
                                     for n in "abzn"))
    r = workspace.build("-j1", "//:z", "//:n")
    assert r.rc == 0, r.output
    order = [e["label"] for e in sorted(r.events, key=lambda e: e["start"]) if e["status"] == "ran"]
    assert order == ["//:n", "//:z"], order


def test_what_a_command_leaves_running_in_its_group_ends_with_it(workspace: Workspace) -> None:
    # `cmd &` left behind wrote on into the lane's next capture files (another test's log
    # and JUnit) and TMPDIR, and outlived buildtool.
    workspace.build_file("", """
        genrule(name="bg", outs=["bg.pid"], cmd="sleep 30 & echo $$! > $@")
        test(name="t", srcs=[":bg"], cmd="echo ok")
    """)
    r = workspace.build("//...", "-j1", command="test")
    assert r.rc == 0, r.output
    pid = int(workspace.read("bg.pid"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        raise AssertionError("the background process outlived its command")


def test_an_output_through_a_symlinked_directory_into_another_package_is_refused(workspace: Workspace) -> None:
    # a/gen -> ../b: //a:t's gen/x is b/x, //b:u's output.  Built one at a time, each wrote
    # the other's file (only a build loading both packages noticed).
    workspace.build_file("a", 'genrule(name="t", outs=["gen/x"], cmd="echo A > $@")')
    workspace.build_file("b", 'genrule(name="u", outs=["x"], cmd="echo B > $@")')
    os.symlink("../b", workspace.root / "a" / "gen")
    rc, _, err = workspace.run("build", "//a:t")
    assert rc == 2 and "is really 'b/x' (through the symbolic link 'a/gen'), in package //b" in err, err
    assert not workspace.exists("b/x")


SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"  # the Cache Directory Tagging Specification's


def test_a_cache_dir_inside_the_workspace_is_neither_sources_nor_packages(workspace: Workspace) -> None:
    """A cache kept in the workspace (``--cache-dir .cache``): glob(["**/*"]) took in its
    blobs and database, which every build changes, so the target ran on every build.  The
    cache dir is tagged (CACHEDIR.TAG), and a tagged directory is left out of glob() and
    of //..., also another tool's; the tag's content decides, and the no-op sees it change."""
    workspace.write("data/a.txt", "a\n")
    workspace.write("tool-cache/blob", "x\n")
    workspace.build_file("", 'genrule(name="all", srcs=glob(["**/*"]), outs=["list.txt"], cmd="echo $(SRCS) > $@")\n')
    cache = workspace.root / ".cache"
    assert workspace.build(cache=cache).rc == 0
    assert (cache / "CACHEDIR.TAG").read_text().startswith(SIGNATURE + "\n")
    again = workspace.build(cache=cache)
    assert again.rc == 0 and again.ran == set(), again.output
    listed = workspace.read("list.txt").split()
    assert "data/a.txt" in listed and "tool-cache/blob" in listed and not any(".cache" in p for p in listed)

    workspace.write("tool-cache/CACHEDIR.TAG", SIGNATURE + "\n")  # another tool tags its cache
    workspace.build_file("tool-cache", 'genrule(name="x", outs=["x"], cmd="touch $@")\n')
    tagged = workspace.build(cache=cache)
    assert tagged.rc == 0 and tagged.ran == {"//:all"}, tagged.output
    assert not any("tool-cache" in p for p in workspace.read("list.txt").split())

    workspace.write("tool-cache/CACHEDIR.TAG", "not a tag\n")
    untagged = workspace.build(cache=cache)
    assert untagged.rc == 0 and "//tool-cache:x" in untagged.ran, untagged.output


def test_a_package_in_a_cache_directory_is_no_package_by_any_path(workspace: Workspace) -> None:
    """Discovery skipped a tagged package while a label still loaded it (and its glob, in
    its own tagged directory, listed nothing): each way in now says why there is no package.
    A FIFO named CACHEDIR.TAG is no tag, and reading it does not block the load."""
    workspace.write("p/in.txt", "hi\n")
    workspace.build_file("p", 'genrule(name="x", srcs=glob(["*.txt"]), outs=["x.out"], cmd="cat $(SRCS) > $@")\n')
    workspace.build_file("", 'genrule(name="all", srcs=["//p:x"], outs=["all.out"], cmd="cat $(SRCS) > $@")\n')
    assert workspace.build().rc == 0
    workspace.write("p/CACHEDIR.TAG", SIGNATURE + "\n")
    why = "p/ holds a CACHEDIR.TAG, which marks a cache directory"
    for args in (["//:all"], ["//..."], ["//p:x"], ["//p/..."]):
        rc, _, err = workspace.run("build", *args)
        assert rc == 2 and why in err, (args, err)
    rc, _, err = workspace.run("build", "//p/nothere:x")  # no BUILD.py there: the tag is not the reason
    assert rc == 2 and "there is no p/nothere/BUILD.py" in err and "CACHEDIR" not in err, err
    os.unlink(workspace.path("p/CACHEDIR.TAG"))
    os.mkfifo(workspace.path("p/CACHEDIR.TAG"))
    rc, _, err = workspace.run("build", "//...")
    assert rc == 0, err


@pytest.mark.parametrize(("args", "needle"), [
    (["test", "--junit", "in.txt"], "--junit in.txt: that is a source of //:t"),
    (["build", "--events", "out.txt"], "--events out.txt: that is an output of //:g"),
    (["build", "--profile", "BUILD.py"], "--profile BUILD.py: that is a BUILD.py"),
    (["test", "//:t", "--junit", ".buildtool/record"], "that is in the workspace's state directory .buildtool/"),
    (["test", "//:t", "--profile", "out.txt"], "--profile out.txt: that file holds something else than a report"),
    (["test", "//:t", "--junit", "rec.xml"], "--junit rec.xml: that is in the workspace's state directory"),
    (["test", "//:t", "--events", "notes.txt"], "--events notes.txt: that file holds something else"),
    (["test", "--junit", "r/same", "--profile", "r/same"], "--junit r/same: --profile writes that file too"),
    (["test", "--events", "r/x", "--junit", "./r/../r/x"], "--junit ./r/../r/x: --events writes that file too"),
    # Not built yet: the report's directory took the output's place, or the reverse.
    (["build", "//:g", "//:h", "--events", "later/ev"], "--events later/ev: that is below later, an output of //:h"),
    (["build", "//:g", "//:h", "--profile", "d"], "--profile d: d/x, an output of //:h, is below that path"),
])
def test_a_report_file_may_not_be_a_source_an_output_or_a_buildfile(
    workspace: Workspace, args: list[str], needle: str,
) -> None:
    """--junit in.txt replaced the source with XML; --events on an output was overwritten
    by the restored output (events lost, exit 0); --junit .buildtool/record (here through a
    link) replaced the build record; --profile on the output of a target outside the
    tests' graph replaced it; any file but an earlier report is kept; of two reports given
    one file, the second replaced the first (exit 0)."""
    workspace.write("in.txt", "precious\n")
    workspace.write("notes.txt", "mine\n")
    workspace.build_file("", 'genrule(name="g", outs=["out.txt"], cmd="echo > $@")\n'
                             'test(name="t", srcs=["in.txt"], cmd="true")\n')
    assert workspace.run("build")[0] == 0
    with open(workspace.root / "BUILD.py", "a") as f:
        f.write('genrule(name="h", outs=["later", "d/x"], cmd="echo > later; echo > d/x")\n')
    os.symlink(".buildtool/record", workspace.root / "rec.xml")
    record = workspace.read(".buildtool/record")
    rc, out, err = workspace.run(*args)
    assert rc == 2 and needle in err, (rc, out, err)
    assert workspace.read("in.txt") == "precious\n"
    assert workspace.read(".buildtool/record") == record and workspace.read("out.txt") == "\n"
    assert workspace.read("notes.txt") == "mine\n"


def test_a_refused_report_path_is_left_as_it_is_even_when_it_holds_a_report(workspace: Workspace) -> None:
    """The paths refused were deleted by the removal of a refused request's earlier
    reports when they held one: a committed fixture that is an events file, and, with the
    reports inside a root glob as docs/ci.md describes, every report of the last run (the
    runs went 0, 2, 0, 2).  Every refused path is named; a report elsewhere still goes."""
    workspace.build_file("", 'genrule(name="a", outs=["a.txt"], cmd="echo a > $@")\n'
                             'test(name="t", srcs=["fixture.jsonl"], cmd="test -s fixture.jsonl")\n')
    workspace.write("fixture.jsonl", "")
    assert workspace.run("build", "//:a", "--events", "fixture.jsonl")[0] == 0
    fixture = workspace.read("fixture.jsonl")
    assert '"schema"' in fixture
    assert workspace.run("build", "//:a", "--events", "elsewhere.jsonl")[0] == 0
    rc, _, err = workspace.run("test", "//...", "--events", "fixture.jsonl", "--profile", "prof.json")
    assert rc == 2 and "--events fixture.jsonl: that is a source of //:t; name another file" in err, err
    assert workspace.read("fixture.jsonl") == fixture
    # Refused before its path is checked (a bad label), after a checkout wrote the file anew:
    # not the report a build of this workspace wrote (inode, size, mtime), so it stays.
    os.unlink(workspace.path("fixture.jsonl"))
    workspace.write("fixture.jsonl", fixture)
    rc, _, err = workspace.run("test", "//:nosuch", "--events", "fixture.jsonl")
    assert rc == 2 and workspace.read("fixture.jsonl") == fixture, err
    # The report a build wrote, untouched since, is the last run's: it goes.
    assert workspace.run("build", "//:a", "--events", "mine.jsonl")[0] == 0
    rc, _, err = workspace.run("test", "//:nosuch", "--events", "mine.jsonl")
    assert rc == 2 and not workspace.exists("mine.jsonl"), err
    # As docs/ci.md: reports inside the workspace, under a root glob.
    workspace.build_file("", 'test(name="all_files", srcs=glob(["**/*"]), cmd="true")\n')
    os.unlink(workspace.path("fixture.jsonl"))
    ci = ["test", "//...", "-k", "--junit", "reports/junit.xml", "--profile", "reports/build-trace.json",
          "--events", "reports/events.jsonl"]
    rc, out, err = workspace.run(*ci)
    assert rc == 0, out + err
    reports = {p: workspace.read(p) for p in ("reports/junit.xml", "reports/build-trace.json", "reports/events.jsonl")}
    for _ in range(2):
        rc, out, err = workspace.run(*ci)
        assert rc == 2, out + err
        assert err.count("that is a source of //:all_files") == 3, err
        assert "--junit reports/junit.xml: that is a source of //:all_files; name another file" in err, err
        assert {p: workspace.read(p) for p in reports} == reports


def test_a_report_file_may_not_be_a_file_the_buildfiles_read(workspace: Workspace) -> None:
    """An empty buildtool.toml, .buildtoolignore or __init__.py passed as "an empty file a
    report may take": the report replaced it and every later build failed to load.  Checked
    after an evaluation and after a build whose graph came from the no-op snapshot."""
    workspace.write("tools/__init__.py", "")
    workspace.write(".buildtoolignore", "")
    workspace.write("tools/defs.py", "from buildtool.dsl import genrule\n"
                                     "def g(n): genrule(name=n, outs=[n + '.txt'], cmd='echo > $@')\n")
    workspace.build_file("", 'from tools.defs import g\ng("a")\ntest(name="t", cmd="true")\n')
    for first in ("test", "build"):  # the graph evaluated; then the snapshot's
        for flag, rel in (("--junit" if first == "test" else "--events", "tools/__init__.py"),
                          ("--events", "buildtool.toml"), ("--profile", ".buildtoolignore")):
            rc, out, err = workspace.run(first, flag, rel)
            assert rc == 2 and f"{flag} {rel}: that is {rel}, which loading the BUILD.py files reads" in err, \
                (first, rc, out, err)
            assert workspace.read(rel) == "", rel
        assert workspace.run("build")[0] == 0


@pytest.mark.parametrize(("args", "needle"), [
    (["build", "-l", "-5"], "-l must be a load average of 0 or more, 0 for no limit (got -5.0)"),
    (["build", "-l", "nan"], "-l must be a load average of 0 or more"),
    (["watch", "--debounce-ms", "-5"], "--debounce-ms must be a number of milliseconds, 0 or more (got -5.0)"),
    (["watch", "--debounce-ms", "inf"], "--debounce-ms must be a number of milliseconds"),
])
def test_a_negative_or_nan_load_or_debounce_is_exit_2(workspace: Workspace, args: list[str], needle: str) -> None:
    """-l -5 ran one job at a time and -l nan was ignored; --debounce-ms -5 was taken."""
    workspace.build_file("", 'genrule(name="g", outs=["g.txt"], cmd="echo > $@")\n')
    rc, out, err = workspace.run(*args)
    assert rc == 2 and needle in err, (rc, out, err)
    assert not workspace.exists("g.txt")


def test_load_limit_zero_means_no_limit(workspace: Workspace, tmp_path: Path) -> None:
    """As Ninja's -l 0: with an impossible limit of 0, two jobs still overlap."""
    workspace.build_file("", "".join(
        f'genrule(name="s{i}", outs=["s{i}.txt"], cmd="touch {tmp_path}/started{i}; '
        f'for _ in $$(seq 100); do [ -e {tmp_path}/started{1 - i} ] && break; sleep 0.05; done; '
        f'[ -e {tmp_path}/started{1 - i} ] && echo > $@")\n' for i in (0, 1)))
    rc, out, err = workspace.run("build", "-j", "2", "-l", "0")
    assert rc == 0, out + err  # each waits for the other to start: only runs when both run at once


def test_clean_empties_the_state_dir_under_the_lock_and_keeps_the_lock_file(workspace: Workspace) -> None:
    """Deleting the whole state dir after releasing the lock took the lock file from under
    a build that had waited for it, so a third build made a new one and ran beside it."""
    workspace.build_file("", 'genrule(name="g", outs=["g.txt"], cmd="echo > $@")\n')
    assert workspace.run("build")[0] == 0
    assert workspace.run("clean")[0] == 0
    assert not workspace.exists("g.txt")
    assert sorted(os.listdir(workspace.path(".buildtool"))) == [".gitignore", "lock"]
    rc, out, err = workspace.run("build")
    assert rc == 0 and "1 restored" in out, out + err


@pytest.mark.parametrize(("hard", "jobs", "soft"), [("as-is", 300, 512), ("low", 300, 512), ("as-is", 16, 64),
                                                     ("low", 4, 200)])
def test_a_large_j_fits_the_open_files_limit(workspace: Workspace, hard: str, jobs: int, soft: int) -> None:
    """-j 300 under a soft limit of 512 open files: targets failed with EMFILE ("Too many
    open files") and the rest were cancelled.  The soft limit is raised toward the hard one;
    where the hard one is low too, fewer commands run at once, with a warning.  -j 16 under
    a soft limit of 64 failed the same way: the check ran only above -j 128."""
    import resource
    import subprocess

    from conftest import BUILDTOOL, _clean_env

    n = 300 if jobs == 300 else 2 * jobs  # (two rounds of commands: all at once must fit)
    workspace.build_file("", f'for i in range({n}):\n    genrule(name=f"t{{i}}", outs=[f"o{{i}}"], '
                             'cmd="sleep 0.5; echo $@ > $@")\n')
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1] if hard == "as-is" else 512
    if hard == "as-is" and limit != resource.RLIM_INFINITY and limit < 2000:
        pytest.skip(f"this machine's hard limit on open files is {limit}")

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, limit if hard == "as-is" else soft))

    r = subprocess.run([BUILDTOOL, "build", "-j", str(jobs)], cwd=workspace.root, capture_output=True, text=True,
                       env=_clean_env(workspace.cache, workspace.home), preexec_fn=lower, timeout=120)
    assert r.returncode == 0 and f"{n} ran" in r.stdout, r.stdout[-2000:] + r.stderr
    if hard == "low" and jobs == 4:  # (-j 4 fits 200: it ran one at a time under the fixed reserve of 256)
        assert "open files" not in r.stderr, r.stderr
    elif hard == "low":
        assert re.search(r"-j 300 needs about \d+ open files and the limit is 512 \(ulimit -n\): running at most "
                         r"\d\d commands at once", r.stderr), r.stderr
    else:
        assert "open files" not in r.stderr, r.stderr


def test_an_output_that_lost_its_executable_bit_gets_it_back(workspace: Workspace) -> None:
    """chmod -x of a built tool: the next build called it up to date and left it unusable
    (content equal, mode not looked at); restores already set the mode."""
    workspace.build_file("", 'genrule(name="tool", outs=["tool.sh"], '
                             'cmd="printf \'#!/bin/sh\\\\necho hi\\\\n\' > $@ && chmod +x $@")')
    assert workspace.build().rc == 0 and os.access(workspace.path("tool.sh"), os.X_OK)
    os.chmod(workspace.path("tool.sh"), 0o644)
    r = workspace.build()
    assert r.rc == 0 and os.access(workspace.path("tool.sh"), os.X_OK), r.output
    assert r.by_label["//:tool"]["reason_code"] == "adopted", r.by_label["//:tool"]
    assert "lost its executable bit" in r.by_label["//:tool"]["reason"], r.by_label["//:tool"]


def test_a_restore_the_destination_refuses_is_not_called_a_damaged_entry(workspace: Workspace) -> None:
    """An output directory that takes no new file (immutable here; read-only for a user):
    the restore failed, was warned about twice (scheduler thread, then worker) and the
    target's reason was cache_corrupt, "the cache entry was damaged", which it was not."""
    workspace.write("a.txt", "a\n")
    workspace.build_file("", 'genrule(name="g", srcs=["a.txt"], outs=["gen/g.out"], cmd="cat $< > $@")\n')
    assert workspace.build().rc == 0
    workspace.path("gen/g.out").unlink()
    gen = workspace.root / "gen"
    with immutable(gen):
        r = workspace.build()
    assert r.rc == 1, r.output
    assert r.stderr.count("could not restore gen/g.out from the cache (Operation not permitted)") == 1, r.stderr
    ev = next(e for e in r.events if e["label"] == "//:g")
    assert ev["reason_code"] != "cache_corrupt" and "damaged" not in ev["reason"], ev


def test_verbose_prints_each_command_that_runs(workspace: Workspace) -> None:
    """A Make user sees every command; here there was no way to (ninja -v, bazel -s)."""
    workspace.write("in", "1\n")
    workspace.build_file("", 'genrule(name="g", srcs=["in"], outs=["g.out"], cmd="cat in > $@")\n'
                             'genrule(name="h", outs=["h.out"], cmd="echo h > $@")\n')
    assert workspace.run("build", "//:h")[0] == 0
    rc, out, err = workspace.run("build", "-v")
    assert rc == 0 and "command (in //): cat in > g.out" in out and "echo h" not in out, out + err
    rc, out, err = workspace.run("build")
    assert rc == 0 and "command (in" not in out, out + err
    workspace.write("in", "2\n")
    rc, out, err = workspace.run("build", "-nv")
    assert rc == 0 and "//:g: would run: " in out and "command (in //): cat in > g.out" in out, out + err


def test_the_command_under_cprofile_leaves_its_profile(workspace: Workspace, tmp_path: Path) -> None:
    """`python -m cProfile -o X $(which buildtool) build` exited 0 and wrote no X: the
    command leaves through os._exit (no teardown), which skipped cProfile's report."""
    import sys

    workspace.build_file("", 'genrule(name="a", outs=["a"], cmd="echo > $@")\n')
    prof = tmp_path / "build.prof"
    r = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), BUILDTOOL, "build"], cwd=workspace.root,
                       env=dict(os.environ, BUILDTOOL_CACHE_DIR=str(workspace.cache)), capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0 and prof.stat().st_size > 0, r.stdout + r.stderr


@pytest.mark.parametrize("cmd", [
    """echo "it's made" > $@; grep pattern missing.txt | sort >> $@; echo "that's all" >> $@""",
    """v="$$(tr -d '"' < /dev/null)"; missing-tool "$$v" | sed "s/'//g" > $@""",
])
def test_a_failing_pipeline_stage_fails_the_target_whatever_quotes_are_around(workspace: Workspace, cmd: str) -> None:
    """An apostrophe inside double quotes (or a '"' in single quotes in a "$(...)") was
    taken to open or close a quote: the pipe after it was missed, the command ran without
    pipefail, and the failing stage passed (exit 0)."""
    workspace.build_file("", f"genrule(name='g', outs=['o.txt'], cmd={cmd!r})\n")
    r = workspace.build()
    assert r.rc == 1 and "//:g" in r.output, r.output


def test_a_working_directory_deleted_under_the_shell_is_an_error_not_a_traceback(
    workspace: Workspace, tmp_path: Path,
) -> None:
    """`cd D; rmdir D; buildtool build` crashed in realpath (the no-op check and the full
    path); with -C, the snapshot of a BUILD.py that opened a relative path crashed in getcwd."""
    import shlex

    from conftest import BUILDTOOL, _clean_env

    workspace.write("data.txt", "a\n")
    workspace.build_file("", 'n = open("data.txt").read().strip()\n'
                             'genrule(name="t", outs=["t.out"], cmd="echo " + n + " > $@")\n')
    d = tmp_path / "D"
    d.mkdir()
    (d / "data.txt").write_text("a\n")
    time.sleep(0.1)
    assert workspace.run("-C", str(workspace.root), "build", cwd=d)[0] == 0
    gone = f"cd {shlex.quote(str(d))} && rm data.txt && cd . && rmdir {shlex.quote(str(d))}"
    for args in (f"-C {shlex.quote(str(workspace.root))} build", "build"):
        again = f"mkdir -p {shlex.quote(str(d))} && touch {shlex.quote(str(d))}/data.txt"
        r = subprocess.run(["sh", "-c", f'{again} && {gone} && "$0" {args}', BUILDTOOL], cwd=tmp_path,
                           capture_output=True, text=True, env=_clean_env(workspace.cache, workspace.home), timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stdout + r.stderr)
    workspace.build_file("", 'import os\nx = os.path.exists("foo.txt")\n'  # (relative, and no error)
                             'genrule(name="t", outs=["t.out"], cmd="echo %s > $@" % x)\n')
    r = subprocess.run(["sh", "-c", f'mkdir -p {shlex.quote(str(d))} && cd {shlex.quote(str(d))} && cd . && '
                       f'rmdir {shlex.quote(str(d))} && "$0" -C {shlex.quote(str(workspace.root))} build', BUILDTOOL],
                       cwd=tmp_path, capture_output=True, text=True, env=_clean_env(workspace.cache, workspace.home),
                       timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr


def test_an_input_that_cannot_be_read_fails_its_target_without_a_command_line(workspace: Workspace) -> None:
    """A source replaced by a directory during the build: the failure said "a named pipe,
    device or socket", followed by a `command (in //)` line for a command that never ran."""
    workspace.write("b.txt", "b\n")
    workspace.build_file("", 'genrule(name="a", outs=["a.out"], cmd="rm b.txt && mkdir b.txt && echo a > $@")\n'
                             'genrule(name="b", srcs=["b.txt", ":a"], outs=["b.out"], cmd="cat b.txt > $@")\n')
    r = workspace.build()
    assert r.rc == 1, r.output
    assert "FAILED: //:b (BUILD.py:2): cannot read input" in r.output, r.output
    assert "b.txt: not a regular file (a directory)" in r.output, r.output
    assert "command (in //): cat b.txt" not in r.output, r.output


def test_a_generated_module_rewritten_with_the_same_size_and_mtime_is_not_imported_from_its_old_pyc(
    workspace: Workspace,
) -> None:
    """Python takes __pycache__'s .pyc as current when the source's size and whole-second
    mtime match: a generated module rewritten in the same second with the same size (two
    quick builds) was imported as the old one, and the test's pass on old code was cached
    under the new key.  The output's bytecode goes before it is written anew."""
    import sys

    workspace.write("v.txt", "g01\n")
    workspace.write("check.py", "import sys\nimport genmod\nsys.exit(genmod.V == 'bad')\n")
    workspace.build_file("", f"""
        genrule(name="gen", srcs=["v.txt"], outs=["genmod.py"],
                cmd="printf 'V = %s\\\\n' \\"'$$(cat v.txt)'\\" > $@ && touch -d @1000000000 $@")
        test(name="t", deps=[":gen"], srcs=["check.py"], cmd="{sys.executable} check.py")
        """)
    r = workspace.build(command="test")
    assert r.rc == 0 and workspace.read("genmod.py") == "V = 'g01'\n", r.output
    assert [p.name for p in workspace.path("__pycache__").iterdir() if p.name.startswith("genmod.")], r.output
    workspace.write("v.txt", "bad\n")  # the same size, and the same mtime (touch -d)
    r = workspace.build(command="test")
    assert workspace.read("genmod.py") == "V = 'bad'\n"
    assert r.rc == 1 and r.by_label["//:t"]["status"] == "failed", r.output


def test_clean_targets_removes_the_outputs_of_those_targets_and_their_dependencies_only(workspace: Workspace) -> None:
    """`ninja -t clean TARGETS`: the named targets' outputs and, recursively, those of what
    they depend on; the rest, an edited output and the state stay, and the next build
    restores what went (the snapshot that vouched for them dropped)."""
    workspace.build_file("lib", 'genrule(name="base", outs=["base.txt"], cmd="echo base > $@")\n'
                                'genrule(name="edited", outs=["edited.txt"], cmd="echo e > $@")\n')
    workspace.build_file("app", 'genrule(name="bin", srcs=["//lib:base", "//lib:edited"], outs=["gen/bin.txt"],\n'
                                '        cmd="cat $(SRCS) > $@")\n'
                                'genrule(name="other", outs=["other.txt"], cmd="echo o > $@")\n')
    assert workspace.build("//...").rc == 0
    workspace.write("lib/edited.txt", "mine\n")
    rc, out, err = workspace.run("clean", "//app:bin")
    assert rc == 0, err
    assert out.strip() == "removed 2 outputs of 3 targets", out
    assert not workspace.exists("app/gen") and not workspace.exists("lib/base.txt")  # (its emptied directory too)
    assert workspace.read("lib/edited.txt") == "mine\n" and "kept lib/edited.txt: its content is not what" in err
    assert workspace.exists("app/other.txt") and workspace.exists(".buildtool/record")
    rc, out, err = workspace.run("build", "//...")  # (the request whose snapshot held them)
    assert rc == 0 and workspace.read("app/gen/bin.txt") == "base\ne\n", out + err
    assert "] restored //lib:base" in out and "] restored //app:bin" in out, out
    assert "warning" not in err, err  # (not "the build record ... is not the one the last build left")
    rc, out, err = workspace.run("clean", "app:nope", cwd=workspace.path(""))
    assert rc == 2 and "app:nope" in err, (rc, out, err)
    rc, out, err = workspace.run("clean", ":other", cwd=workspace.path("app"))  # (relative to the directory)
    assert rc == 0 and out.strip() == "removed 1 output of 1 target" and not workspace.exists("app/other.txt"), out


def test_an_emptied_state_gitignore_is_written_again(workspace: Workspace) -> None:
    """A full disk left .buildtool/.gitignore empty (it was written in place, and only when
    missing): `git status` listed the state dir from then on, and `git add -A` took it."""
    workspace.write("a.txt", "1\n")
    workspace.build_file("", 'genrule(name="g", srcs=["a.txt"], outs=["g.txt"], cmd="cp $< $@")\n')
    assert workspace.build().rc == 0
    gi = workspace.path(".buildtool/.gitignore")
    want = gi.read_text()
    assert want.endswith("\n*\n")
    for damage in ("", "# written by bu"):
        gi.write_text(damage)
        workspace.write("a.txt", f"{damage}!\n")  # (a build that does work: the no-op path looks at no state)
        assert workspace.build().rc == 0
        assert gi.read_text() == want


def test_clean_of_some_targets_is_no_crash_to_the_next_build(workspace: Workspace) -> None:
    """clean PATTERN stamps the record anew (so a watch elsewhere checks every target): the
    no-op snapshot that vouched for the record then took it for one a crash cut short and
    warned "the build record ... is not the one the last build left"."""
    workspace.build_file("", 'genrule(name="a", outs=["a.txt"], cmd="echo a > $@")\n'
                             'genrule(name="b", outs=["b.txt"], cmd="echo b > $@")\n')
    assert workspace.run("build")[0] == 0
    time.sleep(0.2)
    assert workspace.run("build")[0] == 0
    rc, out, err = workspace.run("build")
    assert "(nothing changed)" in out, out + err
    assert workspace.run("clean", "//:a")[0] == 0
    rc, out, err = workspace.run("build")
    assert rc == 0 and "] restored //:a" in out and err == "", out + err
    assert workspace.read("a.txt") == "a\n"


def test_after_clean_of_some_targets_a_dead_output_checked_out_anew_is_still_kept(workspace: Workspace) -> None:
    """A review's sequence: clean PATTERN stamped the record; the next build took the stamp
    for a crash's, no longer trusted the stat cache, and deleted gen.txt, which a checkout
    of a branch where it is tracked had just written (without the clean: kept, said so)."""
    workspace.build_file("", 'genrule(name="gen", outs=["gen.txt"], cmd="echo hello > $@")\n'
                             'genrule(name="other", outs=["other.txt"], cmd="echo other > $@")\n')
    assert workspace.run("build")[0] == 0
    time.sleep(0.2)
    assert workspace.run("build")[0] == 0
    assert workspace.run("clean", "//:other")[0] == 0
    workspace.build_file("", 'genrule(name="other", outs=["other.txt"], cmd="echo other > $@")\n')
    time.sleep(0.05)
    workspace.path("gen.txt").unlink()
    workspace.write("gen.txt", "hello\n")  # (the checkout's own copy)
    rc, out, err = workspace.run("build")
    assert rc == 0 and workspace.exists("gen.txt"), out + err
    assert "kept gen.txt: an output of //:gen before, it was written again since the build left it" in err, err
