"""TargetRunner behaviour seen through the real command: changed-during-build inputs,
partial outputs, missing outputs, executable bits, the action environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest


def bt(ws: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, BUILDTOOL_CACHE_DIR=str(ws.parent / "cache"))
    e.update(env or {})
    return subprocess.run(["buildtool", "-C", str(ws), *args], capture_output=True, text=True, env=e, timeout=60)


def make_ws(tmp_path: Path, build: str, files: dict[str, str] | None = None) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "buildtool.toml").write_text("")
    (ws / "BUILD.py").write_text(build)
    for k, v in (files or {}).items():
        (ws / k).write_text(v)
    return ws


def events(path: Path) -> dict[str, dict[str, object]]:
    return {e["label"]: e for e in map(json.loads, path.read_text().splitlines()[1:])}


def test_input_changed_while_running_is_not_recorded(tmp_path: Path) -> None:
    ws = make_ws(
        tmp_path,
        'genrule(name="t", srcs=["a.txt"], outs=["o.txt"], cmd="cp $< $@; echo more >> $<")\n',
        {"a.txt": "one\n"},
    )
    r = bt(ws, "build")
    assert r.returncode == 0
    assert "changed while the command ran" in r.stderr
    ev = tmp_path / "ev.jsonl"
    r = bt(ws, "build", "--events", str(ev))
    assert events(ev)["//:t"]["status"] == "ran"  # it stayed dirty


def test_a_source_below_a_test_s_dependency_changed_and_back_while_it_runs_is_not_recorded(tmp_path: Path) -> None:
    """The test's key names what its dependencies read only through closure digests: an
    A -> B -> A rewrite of a source two levels down while it ran left a pass recorded (and
    cached) for content the run did not see; the next `test` said PASSED (cached)."""
    ws = make_ws(tmp_path, 'test(name="t", deps=["//lib:wrap"], cmd="if [ ! -e once ]; then touch once; '
                           'echo ok > lib/data.in; sh lib/check.sh; r=$$?; echo bad > lib/data.in; exit $$r; fi; '
                           'sh lib/check.sh")\n')
    (ws / "lib").mkdir()
    (ws / "lib" / "data.in").write_text("bad\n")
    (ws / "lib" / "BUILD.py").write_text('genrule(name="wrap", srcs=["data.in"], outs=["check.sh"], '
                                         'cmd="echo \'grep -qx ok lib/data.in\' > $@")\n')
    r = bt(ws, "test")
    assert r.returncode == 0 and "//:t: input lib/data.in changed while the command ran" in r.stderr, \
        r.stdout + r.stderr
    r = bt(ws, "test")
    assert r.returncode == 1 and "FAILED" in r.stdout and "cached" not in r.stdout, r.stdout + r.stderr


def test_input_changed_and_changed_back_while_running_is_not_recorded(tmp_path: Path) -> None:
    """A -> B -> A during the run (``git stash; git stash pop``): the content is back, but
    the command read B.  Recorded under A's key, out.txt said B until the next edit, and the
    cache handed B to every checkout with A."""
    ws = make_ws(
        tmp_path,
        'genrule(name="t", srcs=["in.txt"], outs=["o.txt"],\n'
        '        cmd="if [ ! -e once ]; then touch once; echo B > in.txt; fi; cat in.txt > $@; echo A > in.txt")\n',
        {"in.txt": "A\n"},
    )
    r = bt(ws, "build")
    assert r.returncode == 0 and "input in.txt changed while the command ran" in r.stderr, r.stdout + r.stderr
    ev = tmp_path / "ev.jsonl"
    r = bt(ws, "build", "--events", str(ev))
    assert r.returncode == 0 and events(ev)["//:t"]["status"] == "ran", r.stdout + r.stderr
    assert (ws / "o.txt").read_text() == "A\n"


def test_a_pyrule_module_changed_and_changed_back_while_running_is_not_recorded(tmp_path: Path) -> None:
    """The same for a module the pyrule's function imports: compared by content only, the
    output made from B was recorded under A's key, and cached for every checkout."""
    ws = make_ws(tmp_path, 'pyrule(name="p", fn="tools.m:f", outs=["out.txt"])\n')
    (ws / "tools").mkdir()
    (ws / "tools" / "__init__.py").write_text("")
    (ws / "tools" / "salt.py").write_text('SALT = "A"\n')
    (ws / "tools" / "m.py").write_text(
        "import importlib, pathlib\n"
        "from tools import salt\n\n"
        "def f(srcs, outs):\n"
        "    module = pathlib.Path('tools/salt.py')\n"
        "    if not pathlib.Path('once').exists():\n"
        "        pathlib.Path('once').touch()\n"
        "        module.write_text('SALT = \"B\"\\n')\n"
        "        importlib.reload(salt)\n"
        "    pathlib.Path(outs[0]).write_text(salt.SALT + '\\n')\n"
        "    module.write_text('SALT = \"A\"\\n')\n")
    r = bt(ws, "build")
    assert r.returncode == 0 and "//:p: input tools/salt.py changed while the command ran; result not recorded" \
        in r.stderr, r.stdout + r.stderr
    assert (ws / "out.txt").read_text() == "B\n" and (ws / "tools" / "salt.py").read_text() == 'SALT = "A"\n'
    ev = tmp_path / "ev.jsonl"
    r = bt(ws, "build", "--events", str(ev))
    assert r.returncode == 0 and events(ev)["//:p"]["status"] == "ran", r.stdout + r.stderr
    assert (ws / "out.txt").read_text() == "A\n"


def test_dependency_output_edited_while_running_is_not_recorded(tmp_path: Path) -> None:
    """g.txt is //:gen's output; it is edited (here by //:use's own command, standing in for
    a hand edit) while //:use runs, and //:use reads the edited text.  Recording //:use
    under the key of what //:gen made would keep that wrong o.txt for good, and cache it."""
    ws = make_ws(
        tmp_path,
        'genrule(name="gen", outs=["g.txt"], cmd="echo gen > $@")\n'
        'genrule(name="use", srcs=[":gen"], outs=["o.txt"],\n'
        '        cmd="if [ ! -e once ]; then touch once; echo edited >> g.txt; fi; cat g.txt > $@")\n',
    )
    r = bt(ws, "build", "//:use")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "//:use: input g.txt changed while the command ran; result not recorded" in r.stderr
    ev = tmp_path / "ev.jsonl"
    r = bt(ws, "build", "//:use", "--events", str(ev))  # g.txt is made again; //:use was not recorded
    assert r.returncode == 0 and "changed while" not in r.stderr, r.stdout + r.stderr
    assert events(ev)["//:use"]["status"] == "ran"
    assert (ws / "o.txt").read_text() == (ws / "g.txt").read_text() == "gen\n"


def test_an_output_whose_result_was_not_recorded_is_still_the_builds_to_clean(tmp_path: Path) -> None:
    """A result not recorded (an input changed while the command ran) left the record with the
    old run's output digest, so `clean` kept the output buildtool had just written: "its
    content is not what the build wrote (edited since?)".  It stays dirty all the same."""
    ws = make_ws(
        tmp_path,
        'genrule(name="t", srcs=["in.txt"], outs=["o.txt"],\n'
        '        cmd="cat in.txt > $@; if [ -e ../flag ]; then rm ../flag; echo B > in.txt; fi")\n',
        {"in.txt": "A\n"},
    )
    assert bt(ws, "build").returncode == 0
    (tmp_path / "flag").write_text("")
    (ws / "in.txt").write_text("C\n")
    r = bt(ws, "build")
    assert r.returncode == 0 and "result not recorded" in r.stderr, r.stdout + r.stderr
    r = bt(ws, "explain")
    assert "WOULD RUN" in r.stdout and "input in.txt changed" in r.stdout, r.stdout + r.stderr
    (ws / "in.txt").write_text("C\n")  # put back: no input differs from the run's, yet it reruns
    r = bt(ws, "explain")
    assert "WOULD RUN: its last result was not recorded (an input changed while its command ran)" in r.stdout, \
        r.stdout + r.stderr
    r = bt(ws, "clean")
    assert r.returncode == 0 and "kept" not in r.stderr and not (ws / "o.txt").exists(), r.stdout + r.stderr


def test_dependency_output_untouched_while_running_is_recorded(tmp_path: Path) -> None:
    ws = make_ws(
        tmp_path,
        'genrule(name="gen", outs=["g.txt"], cmd="echo gen > $@")\n'
        'genrule(name="use", srcs=[":gen"], outs=["o.txt"], cmd="cat g.txt > $@")\n',
    )
    r = bt(ws, "build", "//:use")
    assert r.returncode == 0 and "changed while" not in r.stderr, r.stdout + r.stderr
    ev = tmp_path / "ev.jsonl"
    assert bt(ws, "build", "//:use", "--events", str(ev)).returncode == 0
    assert events(ev)["//:use"]["status"] == "up_to_date"


def test_failed_command_leaves_no_partial_output(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, 'genrule(name="t", outs=["o.txt"], cmd="echo partial > $@; echo boom >&2; exit 7")\n')
    r = bt(ws, "build")
    assert r.returncode == 1
    assert "boom" in r.stdout + r.stderr and "exited with status 7" in r.stdout + r.stderr
    assert not (ws / "o.txt").exists()


def test_killed_command_is_a_failure(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, 'genrule(name="t", outs=["o.txt"], cmd="echo partial > $@; kill -9 $$$$")\n')
    r = bt(ws, "build")
    assert r.returncode == 1
    assert not (ws / "o.txt").exists()


def test_missing_declared_output_fails(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, 'genrule(name="t", outs=["o.txt", "p.txt"], cmd="echo > o.txt")\n')
    r = bt(ws, "build")
    assert r.returncode == 1
    assert "p.txt was not created" in r.stdout
    assert not (ws / "o.txt").exists()


def test_executable_bit_survives_restore(tmp_path: Path) -> None:
    ws = make_ws(
        tmp_path, 'genrule(name="t", outs=["run.sh"], cmd="printf \'#!/bin/sh\\\\necho hi\\\\n\' > $@; chmod +x $@")\n'
    )
    assert bt(ws, "build").returncode == 0
    (ws / "run.sh").unlink()
    ev = tmp_path / "ev.jsonl"
    assert bt(ws, "build", "--events", str(ev)).returncode == 0
    assert events(ev)["//:t"]["status"] == "restored"
    assert os.stat(ws / "run.sh").st_mode & stat.S_IXUSR
    assert subprocess.run([str(ws / "run.sh")], capture_output=True, text=True).stdout == "hi\n"


def test_environment_is_exactly_declared(tmp_path: Path) -> None:
    ws = make_ws(
        tmp_path,
        'genrule(name="t", outs=["env.txt"], env={"A": "1"}, pass_env=["PASSED"],'
        ' cmd="env | sort > $@; umask >> $@")\n',
    )
    assert bt(ws, "build", env={"PASSED": "yes", "LEAKED": "no"}).returncode == 0
    text = (ws / "env.txt").read_text()
    names = {line.split("=", 1)[0] for line in text.splitlines() if "=" in line}
    assert {"A", "PASSED", "PATH", "TMPDIR", "HOME"} <= names
    assert "LEAKED" not in names
    assert text.strip().endswith("0022")
    # A passed variable is part of the key.
    ev = tmp_path / "ev.jsonl"
    bt(ws, "build", "--events", str(ev), env={"PASSED": "other"})
    e = events(ev)["//:t"]
    assert e["status"] == "ran" and e["reason_code"] == "env_changed"


def test_pipefail_is_on(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, 'genrule(name="t", outs=["o.txt"], cmd="false | cat > $@")\n')
    assert bt(ws, "build").returncode == 1


def test_pyrule_runs_in_a_process_and_tracks_its_module(tmp_path: Path) -> None:
    ws = make_ws(
        tmp_path,
        'pyrule(name="p", fn="tools.gen:make", srcs=["a.txt"], outs=["o.txt"], kwargs={"n": 2})\n',
        {"a.txt": "x\n"},
    )
    (ws / "tools").mkdir()
    (ws / "tools" / "__init__.py").write_text("")
    (ws / "tools" / "gen.py").write_text(
        "def make(srcs, outs, n):\n    open(outs[0], 'w').write(open(srcs[0]).read() * n)\n"
    )
    assert bt(ws, "build").returncode == 0
    assert (ws / "o.txt").read_text() == "x\nx\n"
    (ws / "tools" / "gen.py").write_text(
        "def make(srcs, outs, n):\n    open(outs[0], 'w').write(open(srcs[0]).read() * (n + 1))\n"
    )
    ev = tmp_path / "ev.jsonl"
    assert bt(ws, "build", "--events", str(ev)).returncode == 0
    assert events(ev)["//:p"]["status"] == "ran"
    assert (ws / "o.txt").read_text() == "x\nx\nx\n"
    assert not (ws / "tools" / "__pycache__").exists()


def test_a_dependency_without_outputs_reruns_its_dependents_when_it_reruns(tmp_path: Path) -> None:
    """Make's stamp rule, ported as docs/migrating-from-make.md says (a genrule without
    outs): it generated files it did not declare, and its dependent, whose inputs list only
    declared outputs, stayed "up to date" over the old ones after the stamp reran."""
    build = ('genrule(name="stamp", srcs=["ops.def"], cmd="mkdir -p gen && cp ops.def gen/ops.txt{}")\n'
             'group(name="g", deps=[":stamp"])\n'
             'genrule(name="use", srcs=["u.in"], deps=[":stamp"], outs=["use.txt"], cmd="cat gen/ops.txt > $@")\n'
             'genrule(name="via", deps=[":g"], outs=["via.txt"], cmd="cat gen/ops.txt > $@")\n')
    ws = make_ws(tmp_path, build.format(""), {"ops.def": "add\n", "u.in": ""})
    assert bt(ws, "build").returncode == 0
    assert (ws / "use.txt").read_text() == (ws / "via.txt").read_text() == "add\n"
    (ws / "ops.def").write_text("add\nmul\n")
    r = bt(ws, "build", "--explain")
    assert r.returncode == 0, r.stderr
    assert "dependency //:stamp, which declares no outputs, ran with another key" in r.stdout, r.stdout
    assert (ws / "use.txt").read_text() == (ws / "via.txt").read_text() == "add\nmul\n"
    (ws / "BUILD.py").write_text(build.format(" && echo sub >> gen/ops.txt"))  # its command
    assert bt(ws, "build").returncode == 0
    assert (ws / "use.txt").read_text() == (ws / "via.txt").read_text() == "add\nmul\nsub\n"
    ev = tmp_path / "ev.jsonl"
    assert bt(ws, "build", "--events", str(ev)).returncode == 0
    assert {e["status"] for e in events(ev).values()} == {"up_to_date"}
    assert bt(ws, "build").returncode == 0  # (leaves the no-op snapshot: the next build is incremental)
    (ws / "ops.def").write_text("div\n")
    assert bt(ws, "build").returncode == 0
    assert (ws / "use.txt").read_text() == (ws / "via.txt").read_text() == "div\nsub\n"
    (ws / "u.in").write_text("x\n")  # an incremental build without the stamp: its key is the record's
    r = bt(ws, "build")  # (no --events: that takes the full path)
    assert r.returncode == 0 and re.findall(r"\bran (//\S+)", r.stdout) == ["//:use"], r.stdout


def test_an_output_made_a_directory_or_a_link_says_what_to_do_instead(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, 'genrule(name="d", outs=["gen"], cmd="mkdir $@ && touch $@/a.c")\n'
                           'genrule(name="l", srcs=["a.txt"], outs=["l.txt"], cmd="ln -s a.txt $@")\n',
                 {"a.txt": "a\n"})
    r = bt(ws, "build", "-k")
    assert r.returncode == 1
    assert "declared output gen is not a regular file: a directory (outputs are files; there are no directory " \
           "outputs, as Bazel's tree artifacts): declare each file the command writes in outs" in r.stdout, r.stdout
    assert "declared output l.txt is not a regular file: a symbolic link" in r.stdout, r.stdout
    assert not (ws / "gen").exists() and not (ws / "l.txt").is_symlink()


def test_a_stamp_s_dependents_follow_its_key_chained_env_cutoff_tests_and_always(tmp_path: Path) -> None:
    """What stands for a stamp in its dependents' keys is the key it ran with: a first
    version (its command and its closure's sources) missed a deeper stamp's command and its
    env (dependents stale), reran them behind an early cutoff, and left tests out."""
    build = ('genrule(name="g", srcs=["in.txt"], outs=["first.txt"], cmd="head -1 in.txt > $@")\n'
             'genrule(name="s2", deps=[":g"], env={{"V": "{v}"}},'
             ' cmd="mkdir -p gen && cp first.txt gen/x.txt{extra}")\n'
             'genrule(name="s1", deps=[":s2"], cmd="cp gen/x.txt gen/y.txt && echo $$V >> gen/y.txt",'
             ' env={{"V": "{v}"}})\n'
             'genrule(name="d", deps=[":s1"], outs=["d.txt"], cmd="cat gen/y.txt > $@")\n'
             'test(name="t", deps=[":s1"], cmd="tail -1 gen/y.txt | grep -qx {v}")\n'
             'genrule(name="a", always=True, cmd="mkdir -p gen && date +%s%N > gen/now.txt")\n'
             'genrule(name="u", deps=[":a"], outs=["u.txt"], cmd="cat gen/now.txt > $@", manual=True)\n')
    ws = make_ws(tmp_path, build.format(v="one", extra=""), {"in.txt": "a\n"})
    ev = tmp_path / "ev.jsonl"

    def ran(*args: str) -> set[str]:
        got: set[str] = set()
        for command in [[*args]] if args else [["build"], ["test"]]:  # (`test` builds only what tests need)
            r = bt(ws, *command, "--events", str(ev))
            assert r.returncode == 0, r.stdout + r.stderr
            got |= {k for k, e in events(ev).items() if e["status"] == "ran"}
        return got

    assert ran() >= {"//:d", "//:t"}
    assert (ws / "d.txt").read_text() == "a\none\n"
    (ws / "BUILD.py").write_text(build.format(v="one", extra=" && echo extra >> gen/x.txt"))  # the deeper stamp
    assert ran() == {"//:s2", "//:s1", "//:d", "//:t"}
    assert (ws / "d.txt").read_text() == "a\nextra\none\n"
    (ws / "BUILD.py").write_text(build.format(v="two", extra=" && echo extra >> gen/x.txt"))  # their env
    assert ran() == {"//:s2", "//:s1", "//:d", "//:t"}
    assert (ws / "d.txt").read_text() == "a\nextra\ntwo\n"
    (ws / "in.txt").write_text("a\nsecond line\n")  # g's output stays the same: nothing behind it reruns
    assert ran() == {"//:g", "//:t"}  # (but the test, whose closure holds every source below it: formats.md)
    assert ran("build", "//:u") == {"//:a", "//:u"}  # always=True: it and what needs it, every build
    first = (ws / "u.txt").read_text()
    entries = re.findall(r"entries: +(\d+)", bt(ws, "cache", "stats").stdout)
    assert ran("build", "//:u") == {"//:a", "//:u"}
    assert (ws / "u.txt").read_text() == (ws / "gen" / "now.txt").read_text() != first
    # (a key of that run alone: no entry stored that no build would ask for)
    assert re.findall(r"entries: +(\d+)", bt(ws, "cache", "stats").stdout) == entries
    # Nor behind a stamp behind it: that stamp's key changes each build too.
    (ws / "BUILD.py").write_text(build.format(v="two", extra=" && echo extra >> gen/x.txt")
                                 + 'genrule(name="b", deps=[":a"], cmd="true")\n'
                                   'genrule(name="w", deps=[":b"], outs=["w.txt"], cmd="echo w > $@", manual=True)\n')
    assert "//:w" in ran("build", "//:w")
    entries = re.findall(r"entries: +(\d+)", bt(ws, "cache", "stats").stdout)
    assert "//:w" in ran("build", "//:w")
    assert re.findall(r"entries: +(\d+)", bt(ws, "cache", "stats").stdout) == entries


def test_a_stamp_s_dependents_after_a_dirty_run_and_in_a_dry_run(tmp_path: Path) -> None:
    """A stamp whose input changed while it ran reruns with the same key: its dependent,
    keyed by that key, stayed over the other content for good.  And `build -n` took the
    record's key for a stamp it would adopt under another: "0 would run"."""
    build = ('genrule(name="stamp", srcs=["ops.def"], cmd="if [ ! -e once ]; then touch once; echo B > ops.def; fi; '
             'mkdir -p gen && cat ops.def > gen/ops.txt")\n'
             'genrule(name="use", deps=[":stamp"], outs=["use.txt"], cmd="cat gen/ops.txt > $@")\n'
             'test(name="t", cmd="true")\n'
             'genrule(name="after_test", deps=[":t"], outs=["at.txt"], cmd="echo > $@")\n')
    ws = make_ws(tmp_path, build, {"ops.def": "A\n"})
    r = bt(ws, "build")
    assert r.returncode == 0 and "changed while the command ran" in r.stdout + r.stderr, r.stdout + r.stderr
    assert (ws / "use.txt").read_text() == "B\n"
    (ws / "ops.def").write_text("A\n")  # (A-B-A: a stash and its pop)
    assert bt(ws, "build").returncode == 0
    assert (ws / "use.txt").read_text() == (ws / "gen" / "ops.txt").read_text() == "A\n"
    (ws / "ops.def").write_text("B\n")
    assert bt(ws, "build").returncode == 0
    (ws / "ops.def").write_text("A\n")  # (the cache's run of A is not taken for a stamp: it runs)
    r = bt(ws, "build", "-n")
    assert r.returncode == 0 and "//:use: would run: dependency //:stamp would run" in r.stdout, r.stdout
    # A genrule behind a test follows the test's definition, not what `test` last did.
    assert bt(ws, "test").returncode == 0
    r = bt(ws, "build", "-n")
    assert "//:after_test" not in r.stdout, r.stdout


def test_a_stamp_is_never_taken_from_a_cache_and_a_failed_one_runs_again(tmp_path: Path) -> None:
    """A stamp's result is what it did to this workspace: taken from the cache when its
    input went back to an earlier content, it left the later content's files in place
    (and its dependent built, and cached, from them); failed or stopped part-way, then its
    input put back, it was "up to date" over a half-done install."""
    build = ('genrule(name="install", srcs=["deps.txt"], cmd="rm -rf mods; mkdir mods; '
             'for d in $$(cat deps.txt); do [ $$d != bad ] || exit 1; echo $$d > mods/$$d; done")\n'
             'genrule(name="app", srcs=["main.txt"], deps=[":install"], outs=["app.txt"], '
             'cmd="cat main.txt mods/* > $@")\n')
    ws = make_ws(tmp_path, build, {"deps.txt": "a\n", "main.txt": "m\n"})
    assert bt(ws, "build").returncode == 0
    (ws / "deps.txt").write_text("a\nb\n")
    assert bt(ws, "build").returncode == 0
    assert (ws / "app.txt").read_text() == "m\na\nb\n"
    (ws / "deps.txt").write_text("a\n")  # back: the cache holds the run of this key
    assert bt(ws, "build").returncode == 0
    assert sorted(p.name for p in (ws / "mods").iterdir()) == ["a"]
    assert (ws / "app.txt").read_text() == "m\na\n"
    (ws / "deps.txt").write_text("a\nbad\n")  # fails part-way: mods/ holds a alone, then nothing
    assert bt(ws, "build", "-k").returncode == 1
    (ws / "deps.txt").write_text("a\n")  # put back: the record's run no longer holds
    r = bt(ws, "build", "--explain")
    assert r.returncode == 0 and "//:install: ran" in r.stdout, r.stdout
    assert sorted(p.name for p in (ws / "mods").iterdir()) == ["a"]


def test_a_stamp_forced_to_run_again_with_its_key_reruns_its_dependents_next_time(tmp_path: Path) -> None:
    """`build -B //:stamp` reran the stamp with the key its dependents held: the next
    build left them as they were, built from what the stamp's earlier run wrote (a Make
    user's `make -B stamp; make` remakes them: the stamp file is newer)."""
    build = ('genrule(name="fetch", srcs=["src.txt"], cmd="mkdir -p gen && '
             '{ cat src.txt; cat gen/n.txt 2>/dev/null || true; } | wc -l > gen/n.new && mv gen/n.new gen/n.txt")\n'
             'genrule(name="use", deps=[":fetch"], outs=["use.txt"], cmd="cat gen/n.txt > $@")\n')
    ws = make_ws(tmp_path, build, {"src.txt": "s\n"})
    ev = tmp_path / "ev.jsonl"

    def ran(*args: str) -> list[str]:
        r = bt(ws, *args, "--events", str(ev))
        assert r.returncode == 0, r.stdout + r.stderr
        return sorted(k for k, e in events(ev).items() if e["status"] == "ran")

    assert ran("build") == ["//:fetch", "//:use"]
    assert ran("build") == []
    assert ran("build", "-B", "//:fetch") == ["//:fetch"]  # (gen/n.txt is 2 now)
    r = bt(ws, "build", "-n")
    assert "//:use: would run: dependency //:fetch, which declares no outputs, ran again with the same key" \
        in r.stdout, r.stdout
    r = bt(ws, "build")  # (no --events: the no-op path, which lists no file the stamp's run changed)
    assert r.returncode == 0 and re.findall(r"\bran (//\S+)", r.stdout) == ["//:use"], r.stdout
    assert (ws / "use.txt").read_text().strip() == (ws / "gen" / "n.txt").read_text().strip() == "2"
    assert ran("build") == []  # (the stamp's run is in the record: up to date, and so is //:use)
    # Run under a new key later: its dependents' key is that key alone (the earlier run's
    # token belongs to the earlier key), the same in the build that runs it and the next.
    (ws / "src.txt").write_text("t\n")
    assert ran("build") == ["//:fetch", "//:use"]
    assert ran("build") == []
    r = bt(ws, "build", "-B", "-n")  # (a dry run predicts the same)
    assert "//:use: would run" in r.stdout, r.stdout
    # A fresh checkout's first run of the stamp adds no token: its dependent's key is any
    # checkout's, and the cache answers for it.
    shutil.rmtree(ws / ".buildtool")
    assert ran("build") == ["//:fetch"]
    assert events(ev)["//:use"]["status"] == "up_to_date"  # (the cache's entry of that key: adopted)


def test_what_the_standard_library_imports_for_a_build_file_is_no_look_of_the_workspace(tmp_path: Path) -> None:
    """`import datetime` looked for `math` in the workspace root (the standard library's
    own import), and an output named `math` was refused as looked for; a workspace under a
    path with site-packages in it had no looked-for check at all."""
    ws = make_ws(tmp_path, 'import datetime, subprocess\n'
                           'genrule(name="t", outs=["math", "selectors"], cmd="touch math selectors")\n')
    r = bt(ws, "build")
    assert r.returncode == 0, r.stdout + r.stderr
    # A built-in module is found before any file: an import of one looks for none.
    (tmp_path / "bi").mkdir()
    ws = make_ws(tmp_path / "bi", 'import sys\n'
                                  'name = next(n for n in sorted(sys.builtin_module_names) if n not in sys.modules)\n'
                                  '__import__(name)\n'
                                  'genrule(name="t", outs=[name + ".py"], cmd="touch $@")\n')
    r = bt(ws, "build")
    assert r.returncode == 0, r.stdout + r.stderr
    # An import the standard library makes on a BUILD.py's behalf is its look.
    (tmp_path / "pk").mkdir()
    ws = make_ws(tmp_path / "pk", 'import pkgutil\nHAVE = pkgutil.find_loader("gen_cfg") is not None\n'
                                  'genrule(name="g", outs=["gen_cfg.py"], cmd="echo X=1 > $@")\n')
    r = bt(ws, "build")
    assert r.returncode == 2 and "looks at" in r.stderr, r.stdout + r.stderr
    inside = tmp_path / "x" / "site-packages"
    inside.mkdir(parents=True)
    ws = make_ws(inside, 'import os\nx = os.path.exists(os.path.join(os.path.dirname(__file__), "x.txt"))\n'
                         'genrule(name="t", outs=["x.txt"], cmd="touch $@")\n')
    r = bt(ws, "build")
    assert r.returncode == 2 and "looks at" in r.stderr, r.stdout + r.stderr


def test_the_order_of_a_pyrule_s_srcs_is_in_its_key(tmp_path: Path) -> None:
    """The function gets its srcs in the order given, but the key mapped them by path
    (sorted): `srcs=["b.txt", "a.txt"]` after `["a.txt", "b.txt"]` was up to date, and a
    clean build restored the other order's output from the cache."""
    build = 'pyrule(name="p", fn="gen:cat", srcs=[{}], outs=["o.txt"])\n'
    ws = make_ws(tmp_path, build.format('"a.txt", "b.txt"'), {"a.txt": "A\n", "b.txt": "B\n"})
    (ws / "gen.py").write_text("def cat(srcs, outs):\n"
                               "    open(outs[0], 'w').write(''.join(open(s).read() for s in srcs))\n")
    assert bt(ws, "build").returncode == 0
    assert (ws / "o.txt").read_text() == "A\nB\n"
    (ws / "BUILD.py").write_text(build.format('"b.txt", "a.txt"'))
    r = bt(ws, "build", "--explain")
    assert r.returncode == 0, r.stderr
    assert "the order of the rule's inputs changed" in r.stdout
    assert (ws / "o.txt").read_text() == "B\nA\n"
    (ws / "BUILD.py").write_text(build.format('"a.txt", "b.txt"'))
    assert bt(ws, "clean").returncode == 0
    assert bt(ws, "build").returncode == 0  # restored: the first order's entry
    assert (ws / "o.txt").read_text() == "A\nB\n"


def test_a_pyrule_tracks_its_relative_imports_and_sees_the_workspace_root_first(tmp_path: Path) -> None:
    """`from . import relmod` / `from .sub import leaf` were not tracked (an edit left the
    output stale, "up to date"), and the package's own directory was first on sys.path: its
    helper.py shadowed the root's that the key tracks (and pkg/json.py broke the runner)."""
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "gen" / "sub").mkdir(parents=True)
    (ws / "buildtool.toml").write_text("")
    (ws / "gen" / "__init__.py").write_text("")
    (ws / "gen" / "sub" / "__init__.py").write_text("from .leaf import V as LEAF\n")
    (ws / "gen" / "relmod.py").write_text('V = "rel1"\n')
    (ws / "gen" / "sub" / "leaf.py").write_text('V = "leaf1"\n')
    (ws / "helper.py").write_text('WHO = "root helper"\n')
    (ws / "pkg" / "helper.py").write_text('WHO = "pkg helper"\n')
    (ws / "pkg" / "json.py").write_text("raise SystemExit('the package shadowed the stdlib')\n")
    (ws / "gen" / "main.py").write_text(
        "import helper\nfrom . import relmod\nfrom .sub import LEAF\n\n\n"
        "def run(srcs, outs):\n    open(outs[0], 'w').write(' '.join([relmod.V, LEAF, helper.WHO]) + '\\n')\n")
    (ws / "pkg" / "BUILD.py").write_text('pyrule(name="p", fn="gen.main:run", outs=["o.txt"])\n')
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "pkg" / "o.txt").read_text() == "rel1 leaf1 root helper\n", r.stdout + r.stderr
    assert "its key does not hold" not in r.stderr, r.stderr  # (every module it imported is keyed)
    (ws / "gen" / "relmod.py").write_text('V = "rel2"\n')
    (ws / "gen" / "sub" / "leaf.py").write_text('V = "leaf2"\n')
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "pkg" / "o.txt").read_text() == "rel2 leaf2 root helper\n", r.stdout + r.stderr
    (ws / "helper.py").write_text('WHO = "root edited"\n')
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "pkg" / "o.txt").read_text() == "rel2 leaf2 root edited\n", r.stdout + r.stderr


def test_a_pyrule_importing_a_workspace_module_through_its_own_sys_path_entry_is_warned_of(tmp_path: Path) -> None:
    """A src-layout library reached through `sys.path.insert` is no import the static
    search follows: its edit never reran the pyrule (and the cache handed the stale output
    to other checkouts), without a word."""
    ws = make_ws(tmp_path, 'pyrule(name="p", fn="tools.slugs:make", srcs=["a.txt"], outs=["o.txt"])\n',
                 {"a.txt": "Hello World\n"})
    (ws / "tools").mkdir()
    (ws / "tools" / "__init__.py").write_text("")
    (ws / "libs" / "core" / "core").mkdir(parents=True)
    (ws / "libs" / "core" / "core" / "strings.py").write_text("def slug(s):\n    return '-'.join(s.split())\n")
    (ws / "tools" / "slugs.py").write_text(
        "import os, sys\n"
        "root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n"
        "sys.path.insert(0, os.path.join(root, 'libs', 'core'))\n"
        "from core.strings import slug\n\n\n"
        "def make(srcs, outs):\n    open(outs[0], 'w').write(slug(open(srcs[0]).read()) + '\\n')\n")
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "o.txt").read_text() == "Hello-World\n", r.stdout + r.stderr
    assert "warning: //:p: its function imported libs/core/core/strings.py, which its key does not hold" \
        in r.stderr, r.stderr


def test_a_pyrule_reading_a_workspace_file_not_among_its_srcs_is_warned_of(tmp_path: Path) -> None:
    """A template beside the generator, read with open() or pathlib: not in the key, so its
    edit reran nothing (and the cache gave the stale output to other checkouts), silently.
    Its srcs, a file it only tried to open, and what it writes are not warned of."""
    ws = make_ws(tmp_path, 'pyrule(name="p", fn="tools.gen:make", srcs=["a.txt"], outs=["o.txt"])\n')
    (ws / "real").mkdir()
    (ws / "real" / "a.txt").write_text("body\n")
    os.symlink("real/a.txt", ws / "a.txt")  # (a declared source, read through its real path)
    (ws / "tools" / "templates").mkdir(parents=True)
    (ws / "tools" / "__init__.py").write_text("")
    (ws / "tools" / "templates" / "head.txt").write_text("head\n")
    (ws / "tools" / "templates" / "foot.txt").write_text("foot\n")
    (ws / "tools" / "gen.py").write_text(
        "import os, pathlib\n"
        "here = pathlib.Path(__file__).parent\n\n\n"
        "def make(srcs, outs):\n"
        "    try:\n        open('optional.cfg').read()\n    except OSError:\n        pass\n"
        "    open('scratch.json', 'w').write('{}')\n"  # (written, then read back: no input)
        "    open('scratch.json').read()\n"
        "    text = open(here / 'templates' / 'head.txt').read() + pathlib.Path(srcs[0]).resolve().read_text()\n"
        "    text += (here / 'templates' / 'foot.txt').read_text()\n"
        "    open(outs[0], 'w').write(text)\n")
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "o.txt").read_text() == "head\nbody\nfoot\n", r.stdout + r.stderr
    assert "warning: //:p: its function read tools/templates/foot.txt, tools/templates/head.txt, which are not " \
        "among its srcs" in r.stderr, r.stderr
    for quiet in ("a.txt", "optional.cfg", "o.txt", "scratch.json"):
        assert quiet not in r.stderr, r.stderr
    (ws / "BUILD.py").write_text('pyrule(name="p", fn="tools.gen:make", outs=["o.txt"], srcs=["a.txt", '
                                 '"tools/templates/head.txt", "tools/templates/foot.txt"])\n')
    r = bt(ws, "build")
    assert r.returncode == 0 and "its function read" not in r.stderr, r.stderr


def test_a_pyrule_returning_its_text_or_missing_a_module_says_why(tmp_path: Path) -> None:
    """A function returning the generated text (or an async one) failed only with "declared
    output was not created"; a module installed in the project's venv but not in
    buildtool's Python, with a bare ModuleNotFoundError."""
    import sys

    ws = make_ws(tmp_path, 'pyrule(name="r", fn="gen:text", outs=["r.txt"])\n'
                           'pyrule(name="a", fn="gen:later", outs=["a.txt"])\n'
                           'pyrule(name="m", fn="gen:needs", outs=["m.txt"])\n'
                           'pyrule(name="ok", fn="gen:fine", outs=["ok.txt"])\n'
                           'pyrule(name="typo", fn="gen:typo", outs=["t.txt"])\n'
                           'pyrule(name="moves", fn="gen:moves", outs=["mv.txt"])\n', {})
    (ws / "gen.py").write_text(
        "def text(srcs, outs):\n    return 'the text'\n\n\n"
        "async def later(srcs, outs):\n    open(outs[0], 'w').write('x')\n\n\n"
        "def needs(srcs, outs):\n    import not_installed_here_xyz  # noqa\n\n\n"
        "def fine(srcs, outs):\n    open(outs[0], 'w').write('x')\n    return True\n\n\n"
        "def typo(srcs, outs):\n    import gen.helperz  # noqa\n\n\n"
        "def moves(srcs, outs):\n    import os\n    out = os.path.abspath(outs[0])\n    os.chdir('/')\n"
        "    open(out, 'w').write('x')\n    return 0\n")
    r = bt(ws, "build", "-k")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "gen:text returned a value (str) and left an output unwritten: what it returns is dropped" in out, out
    assert "gen:later returned a value (coroutine) and left an output unwritten" in out, out
    # (buildtool's interpreter: its venv's, python or python3)
    assert f"a pyrule runs under {os.path.dirname(sys.executable)}/python" in out, out
    assert ", which has no module 'not_installed_here_xyz' (nor has the workspace): install it there" in out, out
    assert "no module 'gen." not in out and "No module named 'gen.helperz'" in out, out  # (a typo: no pip install)
    assert "gen:fine returned" not in out and (ws / "ok.txt").read_text() == "x", out
    assert "gen:moves returned" not in out and (ws / "mv.txt").read_text() == "x", out  # (it left the package dir)


def test_listing_a_pyrule_s_imports_never_runs_a_module_it_imported_lazily(tmp_path: Path) -> None:
    """The listing of the workspace modules a pyrule imported read __file__ of every entry
    of sys.modules: a lazy module's proxy (importlib.util.LazyLoader) ran its import then,
    and an optional dependency that raises failed a rule that had succeeded."""
    ws = make_ws(tmp_path, 'pyrule(name="p", fn="gen:main", outs=["p.txt"])\n', {})
    (ws / "optional_dep.py").write_text("raise ImportError('optional_dep needs libfoo')\n")
    (ws / "gen.py").write_text(
        "import importlib.util, sys\n"
        "spec = importlib.util.find_spec('optional_dep')\n"
        "spec.loader = importlib.util.LazyLoader(spec.loader)\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['optional_dep'] = module\n"
        "spec.loader.exec_module(module)\n\n\n"
        "def main(srcs, outs):\n    open(outs[0], 'w').write('plain\\n')\n")
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "p.txt").read_text() == "plain\n", r.stdout + r.stderr


@pytest.mark.parametrize("name", ["json.py", "_json.py"])
def test_a_workspace_module_named_as_a_standard_one_leaves_the_pyrule_runner_alone(tmp_path: Path, name: str) -> None:
    """The runner imported json with the workspace root first on sys.path: a root json.py
    (or one json imports) broke every pyrule, even one importing none of them.  (A
    module Python's start-up imports, such as types.py, is Python's own PYTHONPATH rule.)"""
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "buildtool.toml").write_text("")
    (ws / name).write_text("raise SystemExit('the runner imported the workspace module')\n")
    (ws / "gen.py").write_text("def make(srcs, outs):\n    open(outs[0], 'w').write('ok\\n')\n")
    (ws / "pkg" / "BUILD.py").write_text('pyrule(name="x", fn="gen:make", outs=["x.txt"], kwargs={})\n')
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "pkg" / "x.txt").read_text() == "ok\n", r.stdout + r.stderr


def test_a_workspace_module_named_as_a_standard_one_is_not_what_buildtool_imports(tmp_path: Path) -> None:
    """The loader left the workspace root first on buildtool's own sys.path: its later
    imports (typing for explain, ast for a pyrule's imports) took a root typing.py or ast.py,
    and crashed with a traceback."""
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "buildtool.toml").write_text("")
    for name in ("typing.py", "ast.py"):
        (ws / name).write_text("raise SystemExit('buildtool imported the workspace module')\n")
    (ws / "gen.py").write_text("def make(srcs, outs):\n    open(outs[0], 'w').write('ok\\n')\n")
    (ws / "pkg" / "BUILD.py").write_text('pyrule(name="x", fn="gen:make", outs=["x.txt"])\n')
    for command in ("explain", "build"):
        r = bt(ws, command)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert (ws / "pkg" / "x.txt").read_text() == "ok\n"


@pytest.mark.parametrize("name", ["PYTHONPATH", "BUILDTOOL_PYRULE_MODULES"])
def test_action_env_s_pythonpath_is_not_a_pyrule_s(tmp_path: Path, name: str) -> None:
    """--action-env PYTHONPATH=/a, then /b: the pyrule ran again ("env var PYTHONPATH
    changed"), though the runner sets its own PYTHONPATH and the function saw '.' both times
    (BUILDTOOL_PYRULE_MODULES alike; a genrule gets either as given)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "buildtool.toml").write_text("")
    (ws / "gen.py").write_text("import os\n\n\ndef make(srcs, outs):\n"
                               "    open(outs[0], 'w').write(os.environ['PYTHONPATH'] + '\\n')\n")
    (ws / "BUILD.py").write_text('pyrule(name="x", fn="gen:make", outs=["x.txt"])\n'
                                 f'genrule(name="g", outs=["g.txt"], cmd="echo $${name} > $@")\n')
    r = bt(ws, "build", "--action-env", f"{name}=/a")
    assert r.returncode == 0 and (ws / "g.txt").read_text() == "/a\n", r.stdout + r.stderr
    if name == "PYTHONPATH":
        assert (ws / "x.txt").read_text() == ".\n"
    r = bt(ws, "build", "--action-env", f"{name}=/b", "--explain")
    assert r.returncode == 0 and "//:x: up_to_date" in r.stdout, r.stdout + r.stderr
    assert (ws / "g.txt").read_text() == "/b\n"


# -- commands started on the scheduler's thread, and the worker threads beside them ----------
def test_large_inputs_go_to_a_worker_and_large_outputs_are_stored(tmp_path: Path) -> None:
    # big.bin (2 MiB) is more than the scheduler's thread hashes itself: that target runs on a
    # worker thread while the small ones are started in place; the 2 MiB output is stored by
    # the store thread.  All of it is restored byte for byte after the outputs are deleted.
    build = 'genrule(name="big", srcs=["big.bin"], outs=["big.out"], cmd="cp $< $@")\n'
    build += "".join(f'genrule(name="s{i}", srcs=["s.txt"], outs=["s{i}.out"], cmd="cat $< > $@; echo {i} >> $@")\n'
                     for i in range(8))
    ws = make_ws(tmp_path, build, {"s.txt": "small\n"})
    big = os.urandom(2 << 20)
    (ws / "big.bin").write_bytes(big)
    ev = tmp_path / "ev.jsonl"
    r = bt(ws, "build", "-j2", "--events", str(ev))
    assert r.returncode == 0, r.stderr
    assert {e["status"] for e in events(ev).values()} == {"ran"}
    assert (ws / "big.out").read_bytes() == big
    for p in ws.glob("*.out"):
        p.unlink()
    (ws / ".buildtool").rename(tmp_path / "old-state")  # only the cache can bring them back
    r = bt(ws, "build", "-j2", "--events", str(ev))
    assert r.returncode == 0, r.stderr
    assert {e["status"] for e in events(ev).values()} == {"restored"}
    assert (ws / "big.out").read_bytes() == big
    assert (ws / "s3.out").read_text() == "small\n3\n"


def test_large_outputs_and_large_restores_are_left_to_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In process, to see which work the scheduler's thread hands to a worker: hashing the
    # 3 MB output of a command it started (a 4-tuple work item), then, with the outputs and
    # state gone, restoring that output from the cache (a 2-tuple: the whole target).
    from buildtool import cli
    from buildtool.scheduler import Scheduler

    ws = make_ws(tmp_path, 'genrule(name="big", outs=["big.out"], cmd="head -c 3000000 /dev/zero > $@")\n'
                 'genrule(name="small", outs=["small.out"], cmd="echo s > $@")\n')
    handed: list[tuple[object, ...]] = []
    orig = Scheduler._to_worker

    def spy(self: Scheduler, item: tuple[object, ...]) -> None:
        handed.append(item)
        orig(self, item)

    monkeypatch.setattr(Scheduler, "_to_worker", spy)
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", str(tmp_path / "cache"))
    ev = tmp_path / "ev.jsonl"
    argv = ["-C", str(ws), "build", "-j2", "--events", str(ev)]
    assert cli.main(argv) == 0
    assert [len(i) for i in handed] == [4]  # big's outputs, hashed on a worker
    assert (ws / "big.out").stat().st_size == 3_000_000
    for p in ws.glob("*.out"):
        p.unlink()
    (ws / ".buildtool").rename(tmp_path / "old-state")
    handed.clear()
    assert cli.main(argv) == 0
    assert [len(i) for i in handed] == [2]  # big restored by a worker, small on this thread
    assert {e["status"] for e in events(ev).values()} == {"restored"}
    assert (ws / "big.out").read_bytes() == b"\0" * 3_000_000 and (ws / "small.out").read_text() == "s\n"


def test_a_command_that_only_chmods_or_links_its_source_is_recorded(tmp_path: Path) -> None:
    """chmod +x $< and ln $< $@ move only the source's ctime: counted as 'changed while the
    command ran', the target reran on every build and was never recorded."""
    ws = make_ws(
        tmp_path,
        'genrule(name="s", srcs=["gen.sh"], outs=["s.out"], cmd="chmod +x $< && ./$< > $@")\n'
        'genrule(name="lnk", srcs=["a.txt"], outs=["out/a.txt"], cmd="ln $< $@")\n',
        {"gen.sh": "#!/bin/sh\necho hi\n", "a.txt": "hello\n"},
    )
    (ws / "gen.sh").chmod(0o755)  # (already executable: chmod +x changes nothing but the ctime)
    r = bt(ws, "build", "//...")
    assert r.returncode == 0 and "changed while" not in r.stderr, r.stdout + r.stderr
    ev = tmp_path / "ev.jsonl"
    r = bt(ws, "build", "//...", "--events", str(ev))
    assert r.returncode == 0, r.stdout + r.stderr
    assert {k: v["status"] for k, v in events(ev).items()} == {"//:s": "up_to_date", "//:lnk": "up_to_date"}


@pytest.mark.parametrize("first", ["a", "b"])
def test_a_source_chmodded_while_another_target_reads_it_leaves_both_recorded(tmp_path: Path, first: str) -> None:
    """Whichever check ran first re-hashed the file into the stat cache with a time after
    the other command's start, which then counted as 'changed while the command ran'."""
    slow = {"a": "1", "b": "0.3"} if first == "b" else {"a": "0.3", "b": "1"}
    ws = make_ws(
        tmp_path,
        f'genrule(name="a", srcs=["gen.sh"], outs=["a.out"], cmd="chmod +x $< && sleep {slow["a"]} && ./$< > $@")\n'
        f'genrule(name="b", srcs=["gen.sh"], outs=["b.out"], cmd="sleep {slow["b"]} && sh $< > $@")\n',
        {"gen.sh": "#!/bin/sh\necho hi\n"},
    )
    (ws / "gen.sh").chmod(0o755)
    r = bt(ws, "build", "-j2")
    assert r.returncode == 0 and "changed while" not in r.stderr, r.stdout + r.stderr
    ev = tmp_path / "ev.jsonl"
    assert bt(ws, "build", "-j2", "--events", str(ev)).returncode == 0
    assert {k: v["status"] for k, v in events(ev).items()} == {"//:a": "up_to_date", "//:b": "up_to_date"}


def test_a_source_edited_earlier_in_the_build_is_not_changed_during_a_later_run(tmp_path: Path) -> None:
    """x reads s.txt and edits it as it ends (x is rightly not recorded); y and z, after x,
    read the edited file: neither ran while it changed, but the stat cache's entries (the
    first, x's, and the one z's key re-hashed after y started) flagged y."""
    ws = make_ws(
        tmp_path,
        'genrule(name="x", srcs=["s.txt"], outs=["x.out"],\n'
        '        cmd="cat $< > $@; sleep 0.3; if [ ! -e once ]; then touch once; echo BB > $<; fi")\n'
        'genrule(name="y", srcs=["s.txt"], outs=["y.out"], deps=[":x"], cmd="cat s.txt > $@; sleep 0.3")\n'
        'genrule(name="z", srcs=["s.txt"], outs=["z.out"], deps=[":x"], cmd="cat s.txt > $@; sleep 0.3")\n',
        {"s.txt": "s\n"},
    )
    r = bt(ws, "build", "-j2", "//:y", "//:z")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "//:x: input s.txt changed while the command ran" in r.stderr, r.stderr
    assert "//:y: input" not in r.stderr and "//:z: input" not in r.stderr, r.stderr


def test_a_flaky_tests_rerun_still_sees_a_source_changed_and_put_back(tmp_path: Path) -> None:
    """The sources' stats as the key read them were dropped after the first attempt, so the
    rerun compared content only and an A-B-A edit during it became PASSED (cached)."""
    once = tmp_path / "once"
    ws = make_ws(
        tmp_path,
        f'test(name="fl", srcs=["s.txt"], flaky=2, cmd="if [ -e {once} ]; then echo B > s.txt; sleep 0.2; '
        f'echo A > s.txt; exit 0; else touch {once}; exit 1; fi")\n',
        {"s.txt": "A\n"},
    )
    os.utime(ws / "s.txt", (1_600_000_000, 1_600_000_000))
    r = bt(ws, "test", "//:fl")
    assert "//:fl: input s.txt changed while the command ran; result not recorded" in r.stderr, r.stdout + r.stderr
    r = bt(ws, "test", "//:fl")
    assert "PASSED (cached)" not in r.stdout, r.stdout


def test_a_dependency_output_rewritten_and_put_back_while_running_is_not_recorded(tmp_path: Path) -> None:
    """A hand edit of g.txt and its undo, both while //:use runs: the content is back, but
    the command read the edit; recorded, o.txt kept the edit for good (and in the cache)."""
    ws = make_ws(
        tmp_path,
        'genrule(name="gen", outs=["g.txt"], cmd="echo gen > $@")\n'
        'genrule(name="use", srcs=[":gen"], outs=["o.txt"],\n'
        '        cmd="if [ ! -e once ]; then touch once; cp g.txt keep; echo HANDEDIT > g.txt; cat g.txt > $@; '
        'sleep 0.02; cp keep g.txt; else cat g.txt > $@; fi")\n',
    )
    r = bt(ws, "build", "//:use")
    assert r.returncode == 0 and "//:use: input g.txt changed while the command ran" in r.stderr, r.stdout + r.stderr
    r = bt(ws, "build", "//:use")
    assert r.returncode == 0 and (ws / "o.txt").read_text() == "gen\n", r.stdout + r.stderr


@pytest.mark.parametrize("what", ["pyrule module", "tool"])
def test_a_pyrule_module_or_tool_changed_while_running_is_not_recorded(tmp_path: Path, what: str) -> None:
    """The key covers a pyrule's modules and the declared tools as well as the sources; one
    of them edited while the command ran, then put back: recorded, the output of the edit
    was up to date for good and went into the cache."""
    if what == "tool":
        build = ('genrule(name="t", srcs=["in.txt"], outs=["out.txt"], tools=["mytool"],\n'
                 '        env={"PATH": "bin:/usr/bin:/bin"},\n'
                 '        cmd="if [ ! -e once ]; then touch once; '
                 'printf \'#!/bin/sh\\\\necho NEW\\\\n\' > bin/mytool; fi; { cat in.txt; mytool; } > $@")\n')
        (tmp_path / "ws" / "bin").mkdir(parents=True)
        tool = tmp_path / "ws" / "bin" / "mytool"
        tool.write_text("#!/bin/sh\necho old\n")
        tool.chmod(0o755)
        edited, original = tool, "#!/bin/sh\necho old\n"
    else:
        (tmp_path / "ws" / "gen").mkdir(parents=True)
        (tmp_path / "ws" / "gen" / "__init__.py").write_text("")
        (tmp_path / "ws" / "gen" / "helper.py").write_text('TAG = "old"\n')
        (tmp_path / "ws" / "gen" / "rules.py").write_text(
            "import importlib\nimport os\n\n\ndef make(srcs, outs):\n"
            "    if not os.path.exists('once'):\n"
            "        open('once', 'w').close()\n"
            "        open('gen/helper.py', 'w').write('TAG = \"NEW\"\\n')\n"
            "    from gen import helper\n"
            "    importlib.reload(helper)\n"
            "    open(outs[0], 'w').write(open(srcs[0]).read() + helper.TAG + '\\n')\n")
        build = 'pyrule(name="t", fn="gen.rules:make", srcs=["in.txt"], outs=["out.txt"])\n'
        edited, original = tmp_path / "ws" / "gen" / "helper.py", 'TAG = "old"\n'
    (tmp_path / "ws" / "buildtool.toml").write_text("")
    (tmp_path / "ws" / "BUILD.py").write_text(build)
    (tmp_path / "ws" / "in.txt").write_text("in\n")
    ws = tmp_path / "ws"
    r = bt(ws, "build")
    assert r.returncode == 0 and "changed while the command ran; result not recorded" in r.stderr, r.stdout + r.stderr
    assert (ws / "out.txt").read_text() == "in\nNEW\n"
    edited.write_text(original)
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "out.txt").read_text() == "in\nold\n", r.stdout + r.stderr


def test_an_old_output_that_cannot_be_deleted_fails_the_target(tmp_path: Path) -> None:
    """The delete before the command failed silently (a read-only directory, an immutable
    file); a command that then wrote nothing had the old output recorded and cached under
    the new key."""
    import shutil

    ws = make_ws(tmp_path, 'genrule(name="a", srcs=["a.txt"], outs=["a.out"], cmd="cp $< $@")\n', {"a.txt": "one\n"})
    assert bt(ws, "build").returncode == 0
    out = ws / "a.out"
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode:
        pytest.skip("cannot make a file immutable here (chattr, root, a filesystem that has the flag)")
    try:
        (ws / "a.txt").write_text("two\n")
        (ws / "BUILD.py").write_text('genrule(name="a", srcs=["a.txt"], outs=["a.out"], cmd="true")\n')
        r = bt(ws, "build")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "could not delete the old output 'a.out' of //:a before its command" in r.stdout + r.stderr
    finally:
        subprocess.run(["chattr", "-i", str(out)], check=False)


def test_a_tool_rewritten_while_a_target_runs_is_seen_even_when_another_target_hashed_it_again(
        tmp_path: Path) -> None:
    """//:u saw the tool change and dropped its digest; //:x then hashed the new tool, and
    //:w, started with the old digest in its key, compared the new stat with the new stat
    and was recorded (and cached) with what the new tool printed."""
    ws = tmp_path / "ws"
    (ws / "bin").mkdir(parents=True)
    (ws / "buildtool.toml").write_text("")
    tool = ws / "bin" / "mytool"
    tool.write_text("#!/bin/sh\necho old\n")
    tool.chmod(0o755)
    e = '{"PATH": "bin:/usr/bin:/bin"}'
    (ws / "BUILD.py").write_text(
        'genrule(name="e", outs=["e.out"], cmd="sleep 0.5; printf \'#!/bin/sh\\\\necho NEW\\\\n\' > bin/t.tmp; '
        'chmod +x bin/t.tmp; mv bin/t.tmp bin/mytool; echo > $@")\n'
        f'genrule(name="u", outs=["u.out"], tools=["mytool"], env={e}, cmd="sleep 1; echo u > $@")\n'
        f'genrule(name="w", outs=["w.out"], tools=["mytool"], env={e}, cmd="sleep 2.5; mytool > $@")\n'
        f'genrule(name="x", deps=[":u"], outs=["x.out"], tools=["mytool"], env={e}, cmd="echo x > $@")\n')
    r = bt(ws, "build", "-j", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "//:w: input" in r.stderr and "mytool changed while the command ran" in r.stderr, r.stderr
    tool.write_text("#!/bin/sh\necho old\n")
    (ws / "w.out").unlink()
    r = bt(ws, "build", "//:w")
    assert r.returncode == 0 and (ws / "w.out").read_text() == "old\n", r.stdout + r.stderr


def test_an_output_under_a_link_to_the_workspace_root_is_written(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, 'genrule(name="c", outs=["gen/x.txt"], cmd="echo hi > $@")\n')
    os.symlink(".", ws / "gen")
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "x.txt").read_text() == "hi\n", r.stdout + r.stderr


def test_a_pyrule_with_arguments_too_long_for_a_command_line_runs(tmp_path: Path) -> None:
    """3,000 globbed srcs (or big kwargs): "could not start the command: Argument list too
    long", where a genrule with the same srcs ran."""
    ws = make_ws(tmp_path, 'pyrule(name="p", fn="mk:run", outs=["o.txt"], srcs=glob(["many/*.txt"]), '
                           'kwargs={"big": "x" * 150000})\n')
    (ws / "mk.py").write_text("def run(srcs, outs, big):\n"
                              "    open(outs[0], 'w').write(f'{len(srcs)} {len(big)} {srcs[0]}\\n')\n")
    (ws / "many").mkdir()
    for i in range(3000):
        (ws / "many" / f"file_with_a_fairly_long_name_number_{i:04}.txt").write_text("")
    r = bt(ws, "build")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert (ws / "o.txt").read_text() == "3000 150000 many/file_with_a_fairly_long_name_number_0000.txt\n"


def test_a_pyrule_function_in_a_macro_module_says_why_getenv_fails(tmp_path: Path) -> None:
    """doit's habit: the action beside the task definitions.  The pyrule's own process
    imports that module, whose getenv() at import raised OutsideEvaluation with no word of
    why a pyrule's process is no evaluation."""
    ws = make_ws(tmp_path, "from tools.defs import make\nmake()\n")
    (ws / "tools").mkdir()
    (ws / "tools" / "__init__.py").write_text("")
    (ws / "tools" / "defs.py").write_text(
        'from buildtool.dsl import getenv, pyrule\nMODE = getenv("MODE", "dev")\n'
        'def gen(srcs, outs):\n    open(outs[0], "w").write(MODE)\n'
        'def make():\n    pyrule(name="g", fn="tools.defs:gen", outs=["g.txt"])\n')
    r = bt(ws, "build")
    assert r.returncode == 1 and "getenv() was called in a process that evaluates no BUILD.py (a pyrule's " \
        "function runs in a Python process of its own" in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_command_over_the_argument_limit_in_bytes_runs_from_a_script(tmp_path: Path) -> None:
    """45,000 "€" are 45,000 characters but 135,000 bytes: the check counted characters,
    and the command failed with "Argument list too long" instead of going through a script."""
    ws = make_ws(tmp_path, 'genrule(name="e", outs=["e.txt"], cmd="printf %s ' + "€" * 45000 + ' | wc -c > $@")\n')
    r = bt(ws, "build")
    assert r.returncode == 0 and (ws / "e.txt").read_text().strip() == "135000", (r.stdout + r.stderr)[-2000:]


def test_a_same_stat_rewrite_after_the_key_read_is_caught_by_content(tmp_path: Path) -> None:
    """With sources stat'ed once a build, a key may be made from a stat read seconds before
    the command starts.  On a file system with whole-second times, a rewrite in the second
    of that read keeps the stat: judged racy against the command's start only, the result
    (for the new content) was recorded and cached under the old content's key."""
    import types

    from buildtool.digest import hash_bytes
    from buildtool.runner import TargetRunner

    f = tmp_path / "s.txt"
    f.write_bytes(b"v2\n")  # what the command read
    st = os.stat(f)
    read_ns = max(st.st_mtime_ns, st.st_ctime_ns) + 1_000  # the key read the stat just after a write...
    fake = types.SimpleNamespace(out_digests={}, root=str(tmp_path), _sources={"s.txt": None},
                                 _disk_digest=lambda p: hash_bytes((tmp_path / p).read_bytes()))
    fake._moved = lambda *a: TargetRunner._moved(fake, *a)  # type: ignore[arg-type]
    at_key = {"s.txt": (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, read_ns)}
    started_ns = read_ns + 5_000_000_000  # ...and the command started seconds later
    changed = TargetRunner._inputs_changed(fake, {"s.txt": hash_bytes(b"v1\n")}, started_ns, at_key)  # type: ignore[arg-type]
    assert changed == "s.txt" and "s.txt" not in fake._sources
    same = TargetRunner._inputs_changed(fake, {"s.txt": hash_bytes(b"v2\n")}, started_ns, at_key)  # type: ignore[arg-type]
    assert same is None


def test_a_py_output_s_bytecode_goes_and_only_its_own(tmp_path: Path) -> None:
    """Each `.py` output's `<stem>.<tag>[.opt-N].pyc`, whatever the interpreter; not another
    module's whose name it starts (`a.py` is not `a.b.py`), in one listing a directory."""
    from buildtool.runner import _drop_bytecode

    cache = tmp_path / "pkg" / "__pycache__"
    cache.mkdir(parents=True)
    for n in ("a.cpython-311.pyc", "a.cpython-312.opt-1.pyc", "a.b.cpython-311.pyc", "ab.cpython-311.pyc",
              "b.cpython-311.pyc", "a.txt"):
        (cache / n).write_text("")
    _drop_bytecode(str(tmp_path), ["pkg/a.py", "pkg/x.txt", "other/none.py"])
    assert sorted(p.name for p in cache.iterdir()) == ["a.b.cpython-311.pyc", "a.txt", "ab.cpython-311.pyc",
                                                       "b.cpython-311.pyc"]


SOCKET_TEST = """
import os, socket, sys, tempfile
d = tempfile.mkdtemp(prefix="pymp-")  # (as multiprocessing's listener: TMPDIR and 32 bytes)
s = socket.socket(socket.AF_UNIX)
s.bind(os.path.join(d, "listener-abcdefgh"))
assert os.path.realpath(os.environ["TMPDIR"]) == os.path.realpath(os.environ["BUILDTOOL_LANE"])
assert os.environ["HOME"] == os.environ["TMPDIR"]
print("bound", len(os.environ["TMPDIR"]))
"""


def test_a_unix_socket_in_tmpdir_binds_in_a_checkout_at_a_long_path(tmp_path: Path) -> None:
    """TMPDIR was <checkout>/.buildtool/tmp/<pid>-<lane>: a test binding a Unix socket
    there (multiprocessing.Manager) failed with "AF_UNIX path too long" once the checkout's
    path passed ~50 bytes, as CI runners' do; it reaches commands as a short link now."""
    ws = tmp_path / ("w" * 80) / "checkout"
    ws.mkdir(parents=True)
    (ws / "buildtool.toml").write_text("")
    (ws / "sock.py").write_text(SOCKET_TEST)
    (ws / "BUILD.py").write_text('test(name="t", srcs=["sock.py"], cmd="python3 sock.py")\n'
                                 'genrule(name="g", outs=["g.txt"], cmd="echo $$TMPDIR > $@")\n')
    r = bt(ws, "test", "--test-output", "all")
    assert r.returncode == 0 and "bound" in r.stdout, r.stdout + r.stderr
    assert bt(ws, "build", "//:g").returncode == 0
    link = (ws / "g.txt").read_text().strip()
    assert len(link) <= 60 and not os.path.lexists(link)  # (removed with the lanes as the build ended)
