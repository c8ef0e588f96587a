"""A catalogue of hostile or broken buildfiles and files: each is a clear error with exit 2
(file, line or label named) and nothing written outside the workspace; odd but legal file
names work; a target with 10,000 inputs and an output of several GiB work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cache_verify as cv
import pytest
from conftest import BUILDTOOL, Workspace, _clean_env


def outside_snapshot(tmp: Path, ws: Workspace) -> dict[str, int]:
    """Every path under the test's temp dir except the workspace, its cache and home."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(tmp):
        d = Path(dirpath)
        if d == ws.root or ws.root in d.parents or d == ws.cache or ws.cache in d.parents:
            dirnames[:] = []
            continue
        for f in filenames:
            p = d / f
            if p.parent == ws.home or "events-" in f:
                continue
            out[str(p)] = p.lstat().st_size
    return out


RAN = 'genrule(name="r", outs=["r"], cmd="touch {outside}/ran; echo > $@")\n'  # (nothing may run)
CATALOGUE = [
    ("dotdot-output", 'genrule(name="t", outs=["../evil.txt"], cmd="echo x > $@")', "no '..'", None),
    ("absolute-output", 'genrule(name="t", outs=["{outside}/evil.txt"], cmd="echo x > $@")', "not absolute", None),
    ("symlinked-dir-output", 'genrule(name="t", outs=["link/evil.txt"], cmd="echo x > $@")', "outside the workspace",
     "link"),
    ("symlinked-file-output", 'genrule(name="t", outs=["flink"], cmd="echo x > $@")',
     "output 'flink' of //:t is a symbolic link to", "flink"),
    ("output-is-source", 'genrule(name="t", srcs=["a.txt"], outs=["a.txt"], cmd="echo x > $@")', "a.txt", None),
    ("bad-label-chars", 'genrule(name="t;rm -rf /", outs=["o"], cmd="echo x > $@")', "t;rm -rf /", None),
    ("bad-dep-label", 'genrule(name="t", deps=["//pkg:a b"], outs=["o"], cmd="echo x > $@")', "//pkg:a b", None),
    ("glob-escape", 'genrule(name="t", srcs=glob(["../*"]), outs=["o"], cmd="cat $(SRCS) > $@")', "'../*'", None),
    ("glob-absolute", 'genrule(name="t", srcs=glob(["/etc/*"]), outs=["o"], cmd="cat $(SRCS) > $@")', "/etc/*",
     None),
    ("raises", 'x = 1\nraise RuntimeError("boom from BUILD")', "boom from BUILD", None),
    # Misspellings are answered with the name meant (Python's own suggestion was dropped).
    ("target-named-as-an-output",  # (":x.out" meant the target; Bazel refuses it)
     'genrule(name="x", outs=["x.out"], cmd="echo > $@")\ngenrule(name="x.out", outs=["y"], cmd="echo > $@")',
     "BUILD.py:2: target name 'x.out' is also the path of an output of //:x", None),
    ("misspelled-rule", 'genrul(name="t", outs=["o"], cmd="echo > $@")',
     "NameError: name 'genrul' is not defined (did you mean 'genrule'?)", None),
    ("misspelled-variable", 'SRCS = ["a.txt"]\ngenrule(name="t", srcs=SRC, outs=["o"], cmd="echo > $@")',
     "name 'SRC' is not defined (did you mean 'SRCS'?)", None),
    ("bazel-load", 'load("//tools:defs.bzl", "m")', "name 'load' is not defined (a BUILD.py is Python: import", None),
    ("bazel-filegroup", 'filegroup(name="f", srcs=[])', "name 'filegroup' is not defined (use group(", None),
    ("misspelled-attribute", 'genrule(name="t", src=["a.txt"], outs=["o"], cmd="echo > $@")',
     "//:t: genrule() got an unknown attribute 'src' (did you mean 'srcs'?)", None),
    # Spelling alone offered 'outs' for inputs (and for any 5-letter word): another tool's word.
    ("other-tools-attribute", 'genrule(name="t", inputs=["a.txt"], outs=["o"], cmd="echo > $@")',
     "unknown attribute 'inputs' (did you mean 'srcs'?)", None),
    ("bazel-data-attribute", 'test(name="t", data=["a.txt"], cmd="true")',
     "unknown attribute 'data' (did you mean 'srcs'?)", None),
    ("make-command-attribute", 'genrule(name="t", outs=["o"], command="echo > $@")',
     "unknown attribute 'command' (did you mean 'cmd'?)", None),
    ("no-guess-for-no-likeness", 'genrule(name="t", outs=["o"], cmd="echo > $@", bogus=1)',
     "unknown attribute 'bogus'; allowed attributes are:", None),
    ("close-spelling-alike-start", 'genrule(name="t", outs=["o"], cmd="echo > $@", evn={})',
     "unknown attribute 'evn' (did you mean 'env'?)", None),
    ("case-only", 'genrule(name="t", outs=["o"], Cmd="echo > $@")', "unknown attribute 'Cmd' (did you mean 'cmd'?)",
     None),
    ("syntax", 'genrule(name="t", outs=["o"], cmd="echo" ', "BUILD.py", None),
    ("import-cycle", "import tools.loop\n", "circular import", "loop"),
    ("imports-itself", 'import BUILD\ngenrule(name="t", outs=["o"], cmd="echo > $@")', "BUILD.py:2", None),
    ("duplicate-name",
     'genrule(name="t", outs=["o1"], cmd="echo > $@")\ngenrule(name="t", outs=["o2"], cmd="echo > $@")',
     "defined twice", None),
    ("state-dir-output", 'genrule(name="t", outs=[".buildtool/record"], cmd="echo x > $@")', "state directory",
     None),
    # Outputs are deleted before their command runs: the build's own definition never is one.
    ("pyrule-missing-module", 'pyrule(name="t", fn="nosuchmod_xyz:make", outs=["o"])',
     "module 'nosuchmod_xyz' of fn='nosuchmod_xyz:make' is not in the workspace", None),
    ("pyrule-missing-function", 'pyrule(name="t", fn="tools.defs:make", outs=["o"])',
     "tools/defs.py never binds 'make'", "keep"),
    # tools/ has no __init__.py: a namespace package of the workspace, found by the import
    # system, so the missing tools/nope.py went unnoticed until the action ran.
    ("pyrule-missing-module-in-a-namespace", 'pyrule(name="t", fn="tools.nope:make", outs=["o"])',
     "module 'tools.nope' of fn='tools.nope:make' is not in the workspace", "namespace"),
    ("pyrule-dotted-function", 'pyrule(name="t", fn="tools.defs:a.b", outs=["o"])', "Python identifiers", None),
    ("output-is-its-buildfile", 'genrule(name="t", outs=["BUILD.py"], cmd="true")', "a BUILD.py file", "keep"),
    ("output-is-a-new-buildfile", 'genrule(name="t", outs=["sub/BUILD.py"], cmd="true")', "a BUILD.py file", None),
    ("output-is-the-marker", 'genrule(name="t", outs=["buildtool.toml"], cmd="true")', "buildtool.toml", "keep"),
    ("output-is-the-ignore-file", 'genrule(name="t", outs=[".buildtoolignore"], cmd="true")', ".buildtoolignore",
     "keep"),
    # Either would take the packages below it out of the build once made (a no-op then
    # vouched for the graph from before it, which query and a fresh evaluation refuse).
    ("output-is-a-nested-marker", 'genrule(name="t", outs=["p/buildtool.toml"], cmd="true")',
     "a buildtool.toml, which makes p/ a workspace of its own that this one skips", None),
    ("output-is-a-cachedir-tag", 'genrule(name="t", outs=["p/CACHEDIR.TAG"], cmd="true")',
     "a CACHEDIR.TAG, which marks p/ a cache directory that this workspace skips", None),
    ("output-is-a-read-file", 'open("a.txt").read()\ngenrule(name="t", outs=["a.txt"], cmd="true")',
     "evaluating the BUILD.py files reads", "keep"),
    ("output-is-an-imported-module", 'import tools.defs\ngenrule(name="t", outs=["tools/defs.py"], cmd="true")',
     "evaluating the BUILD.py files reads", "keep"),
    # Looked for and missing: the first build passed, and every one after it, the file
    # made, refused it as read (or declared other targets).
    ("output-is-an-import-looked-for", 'try:\n    import gen_cfg\nexcept ImportError:\n    pass\n'
     'genrule(name="t", outs=["gen_cfg.py"], cmd="echo > $@")', "evaluating the BUILD.py files looks at", None),
    ("output-is-looked-for", 'import os\nif os.path.exists("gen.def"):\n    x = open("gen.def").read()\n'
     'genrule(name="t", outs=["gen.def"], cmd="echo > $@")', "evaluating the BUILD.py files looks at", None),
    # A pyrule's module is part of its key, and was deleted before the writer ran: the
    # pyrule failed or passed by timing (-j2 / -j1) and the next evaluation refused it.
    ("output-is-a-pyrule-module",
     'pyrule(name="p", fn="tools.defs:VALUE", outs=["o"])\ngenrule(name="x", outs=["tools/defs.py"], cmd="true")',
     "output 'tools/defs.py' of //:x is a module of //:p's fn='tools.defs:VALUE'", "keep"),
    # (tools/ has none on disk: the output would make it a regular package, whose
    # __init__.py is then a module of the fn; the first build passed, the next refused it)
    ("output-is-a-pyrule-module-package-to-be",
     'pyrule(name="p", fn="tools.defs:make", outs=["o"])\ngenrule(name="x", outs=["tools/__init__.py"], cmd="true")',
     "output 'tools/__init__.py' of //:x is a module of //:p's fn='tools.defs:make'", "namespace"),
    ("output-is-a-pyrule-module-package",
     'pyrule(name="p", fn="tools.defs:VALUE", outs=["o"])\ngenrule(name="x", outs=["tools/__init__.py"], cmd="true")',
     "output 'tools/__init__.py' of //:x is a module of //:p's fn='tools.defs:VALUE'", "keep"),
    ("manual-as-a-string", 'genrule(name="t", outs=["o"], cmd="echo > $@", manual="no")', "'manual' must be True",
     None),
    ("output-inside-an-output",
     'genrule(name="t", outs=["gen"], cmd="echo > $@")\ngenrule(name="u", outs=["gen/x"], cmd="echo > $@")',
     "output 'gen/x' of //:u is inside 'gen', an output of //:t", None),
    ("output-under-a-file", 'genrule(name="t", outs=["a.txt/o"], cmd="echo > $@")', "which is an existing file",
     None),
    ("positional-attributes", 'genrule("t", "echo > $@", outs=["o"])', "keyword attributes only", None),
    ("glob-of-a-number", 'genrule(name="t", srcs=glob(3), outs=["o"], cmd="echo > $@")', "glob() include", None),
    ("sys-exit", 'import sys\ngenrule(name="t", outs=["o"], cmd="echo > $@")\nsys.exit(3)', "BUILD.py:3", None),
    ("sys-exit-0", 'import sys\nsys.exit(0)', "sys.exit(0)", None),
    # A process-level exit would end the build with its status, having built nothing.
    ("os-exit-0", 'import os\ngenrule(name="t", outs=["o"], cmd="echo > $@")\nos._exit(0)', "BUILD.py:3: evaluating "
     "BUILD.py called os._exit(0)", None),
    ("posix-exit-caught", 'import posix\ntry:\n    posix._exit(0)\nexcept Exception:\n    pass', "os._exit(0)", None),
    ("os-exec", 'import os\nos.execl("/bin/true", "true")', "called os.execv('/bin/true', ...)", None),
    # A forked child would go on as a second buildtool building the same targets.
    ("os-fork", 'import os\npid = os.fork()\ngenrule(name="t", outs=["o"], cmd="echo > $@")',
     "BUILD.py:2: evaluating BUILD.py called os.fork()", None),
    ("multiprocessing-pool", 'import multiprocessing\nwith multiprocessing.get_context("fork").Pool(2) as p:\n'
     '    n = sum(p.map(abs, [1, -2]))\ngenrule(name="t", outs=["o"], cmd="echo > $@")', "called os.fork()", None),
    ("os-exit-in-a-thread", 'import os, threading\nt = threading.Thread(target=os._exit, args=(0,))\nt.start()\n'
     't.join()\ngenrule(name="t", outs=["o"], cmd="echo > $@")', "called os._exit(0) (in another thread)", None),
    # A thread still running after the evaluation could end the process later.
    ("thread-left-running", 'import os, threading, time\n'
     'threading.Thread(target=lambda: (time.sleep(0.5), os._exit(0)), daemon=True).start()\n'
     'genrule(name="t", outs=["o"], cmd="sleep 1; echo > $@")', "left 1 thread(s) running", None),
    ("output-in-git", 'genrule(name="t", outs=[".git/config"], cmd="true")', "inside .git/", "keep"),
    # The thread's RuntimeError was printed by threading, //:t was missing, and the build passed.
    ("declares-in-a-thread", RAN + 'import threading\ndef f():\n    genrule(name="t", outs=["o"], cmd="true")\n'
     'th = threading.Thread(target=f)\nth.start()\nth.join()',
     "BUILD.py:4: evaluating BUILD.py called genrule() in another thread", None),  # (the call's line)
    ("output-in-a-nested-git", 'genrule(name="t", outs=["sub/.git/config"], cmd="true")',
     "inside a .git/ directory", "keep"),
    ("output-is-a-submodules-git-file", 'genrule(name="t", outs=["sub/.git"], cmd="true")',
     "a nested repository's or workspace's .git", "keep"),
    # Each below crashed when its action key was taken (a traceback; a NUL: an "internal
    # error" failing the target at run time, after others had run): refused up front.
    ("lone-surrogate-in-cmd", RAN + 'genrule(name="t", outs=["o"], cmd="echo \\ud800 > $@")',
     "cmd 'echo \\ud800 > $@' contains a lone surrogate '\\ud800'", None),
    ("lone-surrogate-in-an-output", RAN + 'genrule(name="t", outs=["x\\ud800"], cmd="echo > $@")',
     "contains a lone surrogate", None),
    ("lone-surrogate-in-env", RAN + 'genrule(name="t", outs=["o"], cmd="echo > $@", env={"A": "\\ud800"})',
     "env value of A", None),
    ("lone-surrogate-in-tools", RAN + 'genrule(name="t", outs=["o"], cmd="echo > $@", tools=["\\ud800"])',
     "tools entry", None),
    ("nul-in-cmd", RAN + 'genrule(name="t", outs=["o"], cmd="echo \\0 > $@")', "contains a NUL byte", None),
    ("nul-in-env", RAN + 'genrule(name="t", outs=["o"], cmd="echo > $@", env={"A": "a\\0b"})',
     "env value of A 'a\\x00b' contains a NUL byte", None),
    ("newline-in-an-output", RAN + 'genrule(name="t", outs=["x\\n.txt"], cmd="echo > $@")',
     "contains a control character", None),
    ("line-separator-in-an-output", RAN + 'genrule(name="t", outs=["x\\u2028.txt"], cmd="echo > $@")',
     "contains a control character", None),
    ("c1-control-in-an-output", RAN + 'genrule(name="t", outs=["x\\x85.txt"], cmd="echo > $@")',
     "contains a control character", None),
    # Not an Exception: it went through as a traceback and exit 1.
    ("raises-a-base-exception", 'class Odd(BaseException):\n    pass\n\nraise Odd("odd")', "BUILD.py:4", None),
    ("raises-generator-exit", 'raise GeneratorExit("g")', "GeneratorExit", None),
    ("raises-an-unprintable", 'class E(Exception):\n    def __str__(self):\n        raise ValueError\n\nraise E()',
     "raised E", None),
    ("glob-empty-segment", 'genrule(name="t", srcs=glob(["src//x.c"]), outs=["o"], cmd="true")',
     "glob pattern 'src//x.c' has an empty path segment", None),
    ("glob-partial-double-star", 'genrule(name="t", srcs=glob(["sr**/x.c"]), outs=["o"], cmd="true")',
     "glob pattern 'sr**/x.c': '**' must be a whole path segment; write it as a segment of its own", None),
    ("glob-double-star-suffix", 'genrule(name="t", srcs=glob(["src/**.c"]), outs=["o"], cmd="true")',
     "glob pattern 'src/**.c': '**' must be a whole path segment; 'src/**/*.c' matches what it did", None),
    ("glob-bad-range", 'genrule(name="t", srcs=glob(["[z-a]"]), outs=["o"], cmd="true")',
     "glob pattern '[z-a]' is not a valid pattern (bad character range", None),
    # It closed buildtool's own stderr: the error of the next package was lost (exit 1).
    ("closes-stdout", 'import sys\nprint("hello")\nsys.stdout.close()\nraise RuntimeError("after the close")',
     "after the close", None),
    # A macro library that silences a noisy import: buildtool's own errors went with it (exit 2, no word).
    # A label in tools= (Bazel's habit) was a "not on PATH" warning and no dependency: a race.
    ("tools-label", 'genrule(name="g", outs=["g.sh"], cmd="true")\ngenrule(name="t", outs=["o"], cmd="./g.sh", '
     'tools=[":g"])', "tools entry ':g' is a label; tools names programs found on PATH", None),
    ("huge-priority", 'genrule(name="t", outs=["o"], cmd="true", priority=10**5000)',
     "attribute 'priority' must be an int from -1,000,000,000 to 1,000,000,000 (got an int of 16610 bits)", None),
    ("huge-flaky", 'test(name="t", cmd="false", flaky=10**9)\ngenrule(name="g", deps=[":t"], outs=["o"], cmd="true")',
     "attribute 'flaky' must be a whole number of reruns from 0 to 100 (got 1000000000)", None),
    ("depfile-not-a-string", 'genrule(name="t", outs=["o"], cmd="true", depfile=5)',
     "attribute 'depfile' must be a non-empty path string (got 5)", None),
    ("location-without-argument", 'genrule(name="t", outs=["o"], cmd="cat $(location ) > $@")',
     "$(location) needs a label or a file, as in $(location :gen)", None),
    ("env-value-too-long", 'genrule(name="t", outs=["o"], cmd="true", env={"BIG": "x" * 200_000})',
     "env value of BIG is 200,004 bytes with its name: one environment string holds less than 131,072", None),
    ("replaces-stderr", 'import io, sys\nsys.stderr = io.StringIO()\n'
     'genrule(name="t", srcs=["missing.txt"], outs=["o"], cmd="true")', "missing.txt", None),
    ("closes-stderr", 'import sys\nsys.stderr.close()\ngenrule(name="t", srcs=["missing.txt"], outs=["o"], cmd="true")',
     "missing.txt", None),
    ("stderr-none", 'import sys\nsys.stderr = None\ngenrule(name="t", srcs=["missing.txt"], outs=["o"], cmd="true")',
     "missing.txt", None),
    # Built alone, //:t wrote into //tools through the link (and //tools:u, alone, back).
    ("output-through-a-link-into-a-package", 'genrule(name="t", outs=["gen/x"], cmd="echo > $@")',
     "is really 'tools/x' (through the symbolic link 'gen'), in package //tools", "linkpkg"),
    # Through a link, .git/ and the workspace's own files are what they are.
    ("output-through-a-link-into-git", 'genrule(name="t", outs=["meta/HEAD"], cmd="echo garbage > $@")',
     "output 'meta/HEAD' of //:t is really '.git/HEAD' (through the symbolic link 'meta'), inside .git/", "linkgit"),
    ("output-through-a-link-onto-the-marker", 'genrule(name="t", outs=["here/buildtool.toml"], cmd="echo > $@")',
     "is really 'buildtool.toml' (through the symbolic link 'here'), the workspace's buildtool.toml", "linkroot"),
    ("name-with-a-final-newline", 'genrule(name="a\\n", outs=["o"], cmd="true")', "target name must be", None),
    ("pass-env-with-a-value", 'genrule(name="t", outs=["o"], cmd="echo > $@", pass_env=["A=B"])',
     "pass_env entry 'A=B' is not a variable name (a value goes in env={...})", None),
    ("src-in-a-subpackage", 'genrule(name="t", srcs=["tools/defs.py"], outs=["o"], cmd="cat $< > $@")',
     "is in package //tools, not //: refer to it as '//tools:defs.py'", "subpkg"),
    # Building //:t alone never loads //tools, whose targets may read the file: refused anyway.
    ("output-in-a-subpackage", 'genrule(name="t", outs=["tools/defs.py"], cmd="echo overwritten > $@")',
     "output 'tools/defs.py' is in package //tools, not //: a target writes only inside its own package", "subpkg"),
    # An error in a macro: where in the macro, and which BUILD.py line called it.
    ("macro-raises", 'from tools.macros import boom\n\nboom("q")',
     "tools/macros.py:4: evaluating BUILD.py raised KeyError: 'q' (called from BUILD.py:3)", "macro"),
    # A helper the macro called raised: every caller's line, innermost first (the macro's was left out).
    ("helper-raises", 'from tools.macros import chain\n\nchain("q")',
     "tools/macros.py:14: evaluating BUILD.py raised KeyError: 'q' (called from tools/macros.py:18, "
     "from BUILD.py:3)", "macro"),
    ("macro-declares-twice", 'from tools.macros import twice\n\ntwice("y")',
     "BUILD.py:3: target 'y' is defined twice in package // (first at BUILD.py:3) (in the macro at "
     "tools/macros.py:8)", "macro"),
    # A syntax error in an imported module: where in it, and which BUILD.py line imported it.
    # Found when the graph is checked, after evaluation: still the macro's line that made it.
    ("macro-unknown-dependency", 'from tools.macros import dangling\n\ndangling("z")',
     "(in the macro at tools/macros.py:11)", "macro"),
    ("module-syntax-error", 'x = 1\nfrom tools import broken', "tools/broken.py:2: syntax error: ",
     "macro"),
    ("macro-made-cycle", 'from tools.macros import loop\nloop(name="c")',
     "BUILD.py:2: dependency cycle: //:c -> //:c_b -> //:c (in the macro at tools/macros.py:", "macro"),
    ("module-syntax-error-where", 'x = 1\nfrom tools import broken', "(imported from BUILD.py:2)", "macro"),
    ("exec-syntax-error", 'x = 1\nexec("def f(:")', "(called from BUILD.py:2)", None),
    # An error in a function the BUILD.py defines: where it raised, and the top-level line.
    ("local-function-raises", 'def mk(n):\n    return {}[n]\n\nmk("q")',
     "BUILD.py:2: evaluating BUILD.py raised KeyError: 'q' (called from BUILD.py:4)", None),
    ("empty-name", 'genrule(name="", outs=["o"], cmd="echo > $@")', "target name must not be empty", None),
    # fail(): a macro's own check, said as the rules' errors are (no "raised ValueError:").
    ("macro-fails", 'from tools.macros import checked\nchecked(1)\nchecked(-1)',
     "BUILD.py:3: checked(): n must be at least 0 (got -1) (in the macro at tools/macros.py:26)", "macro"),
    ("buildfile-fails", 'x = 1\nfail("x must be", 2, "not", x)', "BUILD.py:2: x must be 2 not 1", None),
    ("buildfile-fails-bare", 'x = 1\nfail()', "BUILD.py:2: fail() called", None),
]

MACROS = '''from buildtool.dsl import fail, genrule

def boom(name):
    return {}[name]

def twice(name):
    genrule(name=name, outs=[name + ".1"], cmd="true")
    genrule(name=name, outs=[name + ".2"], cmd="true")

def dangling(name):
    genrule(name=name, srcs=[":nope"], outs=[name + ".o"], cmd="true")

def _lookup(opts, key):
    return opts[key]

def chain(name):
    x = 1
    return _lookup({}, name)

def loop(name):
    genrule(name=name, srcs=[":" + name + "_b"], outs=[name + ".a"], cmd="true")
    genrule(name=name + "_b", srcs=[":" + name], outs=[name + ".b"], cmd="true")

def checked(n):
    if n < 0:
        fail(f"checked(): n must be at least 0 (got {n})")
'''


@pytest.mark.parametrize(("case", "build", "needle", "extra"), CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_hostile_buildfile_is_exit_2_and_writes_nothing_outside(
    make_workspace, tmp_path: Path, case: str, build: str, needle: str, extra: str | None
) -> None:
    ws = make_workspace("hostile")
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    ws.write("a.txt", "a\n")
    if extra == "link":
        os.symlink(outside, ws.root / "link")
    elif extra == "flink":
        (outside / "victim.txt").write_text("precious\n")
        os.symlink(outside / "victim.txt", ws.root / "flink")
    elif extra == "loop":
        ws.write("tools/__init__.py", "")
        ws.write("tools/loop.py", "import tools.loop2\n")
        ws.write("tools/loop2.py", "import tools.loop\nVALUE = tools.loop.VALUE\n")  # a real import cycle
    ws.write("BUILD.py", build.replace("{outside}", str(outside)) + "\n")
    if extra == "linkgit":
        ws.write(".git/HEAD", "ref: refs/heads/main\n")
        os.symlink(".git", ws.root / "meta")
    if extra == "linkroot":
        os.symlink(".", ws.root / "here")
    if extra == "linkpkg":
        ws.write("tools/BUILD.py", 'genrule(name="u", outs=["x"], cmd="echo > $@")\n')
        os.symlink("tools", ws.root / "gen")
    if extra == "macro":
        ws.write("tools/__init__.py", "")
        ws.write("tools/macros.py", MACROS)
        ws.write("tools/broken.py", "import os\ndef f(:\n    pass\n")
    if extra == "namespace":
        ws.write("tools/defs.py", "def make(srcs, outs):\n    pass\n")
    if extra == "subpkg":
        ws.write("tools/defs.py", "VALUE = 1\n")
        ws.write("tools/BUILD.py", "")
    if extra == "keep":
        ws.write(".buildtoolignore", "ignored/\n")
        ws.write("tools/__init__.py", "")
        ws.write("tools/defs.py", "VALUE = 1\n")
        ws.write(".git/config", "[core]\n")
    kept = {p: p.read_bytes() for p in ws.root.rglob("*") if p.is_file() and ".buildtool/" not in str(p)}
    before = outside_snapshot(tmp_path, ws)
    rc, out, err = ws.run("build")
    assert rc == 2, (case, rc, out, err)
    assert "Traceback" not in err
    assert needle in err, (case, err)
    assert "BUILD.py" in err or "//" in err, err
    assert outside_snapshot(tmp_path, ws) == before
    if extra == "flink":
        assert (outside / "victim.txt").read_text() == "precious\n"
    assert {p: p.read_bytes() for p in kept} == kept  # nothing of the workspace deleted or changed


def test_a_raw_thread_of_a_buildfile_cannot_end_the_build(workspace: Workspace) -> None:
    """A thread started with ``_thread`` (which ``threading`` does not list) that calls
    os._exit(0) once the evaluation is over: that thread ends, the build goes on to the
    end and says what happened."""
    workspace.build_file("", """
        import os, _thread, time
        _thread.start_new_thread(lambda: (time.sleep(0.3), os._exit(0)), ())
        genrule(name="t", outs=["o"], cmd="sleep 1; echo done > $@")
    """)
    rc, out, err = workspace.run("build")
    assert rc == 0, out + err
    assert workspace.read("o") == "done\n"
    assert "a thread started by a BUILD.py called os._exit(0); that thread was ended instead" in err


@pytest.mark.parametrize(("fifo", "said"), [("sub/BUILD.py", "cannot read sub/BUILD.py: it is a named pipe"),
                                             (".buildtoolignore", ".buildtoolignore: it is a named pipe")])
def test_a_named_pipe_where_a_file_is_read_is_exit_2_not_a_hang(workspace: Workspace, fifo: str, said: str) -> None:
    """The read of a BUILD.py or .buildtoolignore that is a FIFO waited for a writer for good."""
    workspace.build_file("", 'genrule(name="o", outs=["o.txt"], cmd="echo > $@")\n')
    (workspace.root / "sub").mkdir()
    os.mkfifo(workspace.root / fifo)
    rc, out, err = workspace.run("build")
    assert rc == 2 and said in err and "Traceback" not in err, out + err
    os.unlink(workspace.root / fifo)  # a file masked by a link to /dev/null reads as empty, as before
    os.symlink(os.devnull, workspace.root / fifo)
    rc, out, err = workspace.run("build", "//:o")
    assert rc == 0, out + err


def test_a_directory_too_deep_to_list_is_exit_2_not_left_out(workspace: Workspace) -> None:
    """A source below PATH_MAX's reach (ENAMETOOLONG) dropped out of glob() and discovery
    without a word, and the build said OK with n.out = 0."""
    workspace.build_file("", 'genrule(name="n", srcs=glob(["**/*.txt"]), outs=["n.out"], '
                             'cmd="echo $(SRCS) | wc -w > $@")\n')
    fd = os.open(workspace.root, os.O_RDONLY)
    try:
        for _ in range(18):  # 18 x 250 bytes: past the 4,096 of a path
            os.mkdir("d" * 250, dir_fd=fd)
            nxt = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        wfd = os.open("deep.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, b"x\n")
        os.close(wfd)
    finally:
        os.close(fd)
    try:
        rc, out, err = workspace.run("build")
        assert rc == 2 and "cannot list the directory" in err and "File name too long" in err, out + err
        assert not workspace.exists("n.out")
    finally:
        shutil.rmtree(workspace.root / ("d" * 250), ignore_errors=True)  # (pytest's cleanup cannot)
        subprocess.run(["rm", "-rf", str(workspace.root / ("d" * 250))], timeout=60)


def test_a_workspace_module_named_as_a_standard_one_cannot_be_imported_while_evaluating(
    workspace: Workspace,
) -> None:
    """`import shutil` with a root shutil.py got the workspace's under `build` and the
    standard one under `build -k` (which imports shutil first): two graphs for one tree,
    and 'nothing changed' said for the one its own evaluation would not make."""
    workspace.write("shutil.py", 'TAG = "workspace"\n')
    workspace.write("helper.py", "import shutil\n")
    for text in ('import shutil\n', 'import helper\n'):
        workspace.build_file("", text + 'genrule(name="t", outs=["t.out"], cmd="echo > $@")\n')
        for flags in ((), ("-k",)):
            rc, out, err = workspace.run("build", *flags)
            where = "BUILD.py:1" if text.startswith("import shutil") else "helper.py:1"
            assert rc == 2 and f"{where}: import of 'shutil': the workspace's shutil.py is named as a standard " \
                "library module" in err, (flags, out + err)
    workspace.build_file("", 'genrule(name="t", outs=["t.out"], cmd="echo > $@")\n')  # not imported: fine
    assert workspace.run("build")[0] == 0
    # Imported by a standard module, or through importlib: the standard one, whatever the flags.
    workspace.build_file("", 'import tempfile, importlib\nm = importlib.import_module("shutil")\n'
                             'tags = [getattr(x, "TAG", "stdlib") for x in (tempfile._shutil, m)]\n'
                             'genrule(name="t", outs=["t.out"], cmd="echo %s > $@" % " ".join(tags))\n')
    for flags in ((), ("-k",)):
        rc, out, err = workspace.run("build", *flags)
        assert rc == 0 and workspace.read("t.out") == "stdlib stdlib\n", (flags, out + err)
        shutil.rmtree(workspace.root / ".buildtool")  # (each run evaluates afresh)
    # A standard module this system has none of (winreg on Linux): not the workspace's either.
    workspace.write("winreg.py", 'TAG = "workspace"\n')
    workspace.build_file("", 'import importlib\ntry:\n    tag = importlib.import_module("winreg").TAG\n'
                             'except ModuleNotFoundError:\n    tag = "none"\n'
                             'genrule(name="t", outs=["t.out"], cmd="echo %s > $@" % tag)\n')
    rc, out, err = workspace.run("build")
    assert rc == 0 and workspace.read("t.out") == "none\n", out + err
    # One built into Python (atexit, which logging imports): found, not refused as missing.
    workspace.write("atexit.py", 'TAG = "workspace"\n')
    workspace.build_file("", 'import logging, sys\ntag = getattr(sys.modules["atexit"], "TAG", "builtin")\n'
                             'genrule(name="t", outs=["t.out"], cmd="echo %s > $@" % tag)\n')
    rc, out, err = workspace.run("build")
    assert rc == 0 and workspace.read("t.out") == "builtin\n", out + err


def test_symlink_loop_under_a_globbed_directory(workspace: Workspace) -> None:
    workspace.write("src/a.txt", "a\n")
    os.symlink("loop", workspace.root / "src" / "loop")  # a link to itself
    os.symlink("..", workspace.root / "src" / "up")  # a directory cycle
    workspace.build_file("", 'genrule(name="t", srcs=glob(["src/**"]), outs=["o"], cmd="cat $(SRCS) > $@")')
    rc, out, err = workspace.run("build")
    assert rc == 0, out + err  # loops are not followed: only the real file is a source
    assert workspace.read("o") == "a\n"


ODD_NAMES = ["with space.txt", "quote'single.txt", 'quote"double.txt', "new\nline.txt", "dollar$(x).txt",
             "star*.txt", "semi;colon.txt", "dash-first.txt", "ümlaut.txt"]


def test_odd_file_names_work_and_are_quoted(workspace: Workspace) -> None:
    for i, n in enumerate(ODD_NAMES):
        workspace.write(f"in/{n}", f"{i}\n")
    raw = b"in/latin1-\xe9.txt"
    (workspace.root / os.fsdecode(raw)).write_bytes(b"raw\n")
    workspace.build_file("", """
        genrule(name="cat", srcs=glob(["in/*"]), outs=["all.txt"], cmd="cat $(SRCS) > $@")
        genrule(name="copy", srcs=["in/with space.txt"], outs=["out dir/it's here.txt"], cmd="cp $< $@")
        genrule(name="each", srcs=glob(["in/*"]), outs=["count.txt"], cmd="for f in $(SRCS); do echo x; done > $@")
    """)
    r = workspace.build()
    assert r.rc == 0, r.output
    names = sorted([*(f"in/{n}" for n in ODD_NAMES), os.fsdecode(raw)])
    want = b"".join((workspace.root / n).read_bytes() for n in names)
    assert (workspace.root / "all.txt").read_bytes() == want
    assert workspace.read("out dir/it's here.txt") == workspace.read("in/with space.txt")
    assert workspace.read("count.txt") == "x\n" * len(names)  # each name one word for the shell
    r = workspace.build()
    assert r.rc == 0 and not r.ran, r.output  # and the state files round-trip the names
    (workspace.root / "all.txt").unlink()
    (workspace.root / "out dir" / "it's here.txt").unlink()
    r = workspace.build()
    assert r.rc == 0 and r.status("//:cat") == "restored"
    assert (workspace.root / "all.txt").read_bytes() == want


def test_ten_thousand_inputs(workspace: Workspace) -> None:
    d = workspace.root / "many"
    d.mkdir()
    for i in range(10_000):
        (d / f"f{i:05}.txt").write_text(f"{i}\n")
    workspace.build_file("", 'genrule(name="t", srcs=glob(["many/*.txt"]), outs=["n"], cmd="cat $(SRCS) | wc -l > $@")')
    r = workspace.build()
    assert r.rc == 0, r.output[-2000:]
    assert workspace.read("n").strip() == "10000"
    (d / "f00007.txt").write_text("changed\n")
    r = workspace.build()
    assert r.status("//:t") == "ran"


def test_cache_entry_naming_paths_outside_the_workspace_is_refused(workspace: Workspace, tmp_path: Path) -> None:
    """An entry written by someone else, with the right key but hostile output paths."""
    workspace.build_file("", 'genrule(name="t", outs=["o.txt"], cmd="echo real > $@")')
    r = workspace.build()
    assert r.rc == 0
    key = r.by_label["//:t"]["key"]
    assert list(cv.entries(workspace.cache)) == [key]
    obj = cv.entry(workspace.cache, key)
    digest = obj["outputs"][0][1]
    victim = tmp_path / "victim.txt"
    for bad in ["../victim.txt", str(victim), ".buildtool/record", "a/../../victim.txt", "other.txt"]:
        obj["outputs"] = [[bad, digest, 420]]
        cv.write_entry(workspace.cache, key, json.dumps(obj).encode())
        (workspace.root / "o.txt").unlink(missing_ok=True)
        r = workspace.build()
        assert r.rc == 0, r.output
        assert r.status("//:t") == "ran", bad
        assert "deleting it" in r.stderr or "lists other outputs" in r.stderr, r.stderr
        assert r.stderr.count("warning:") == 1, r.stderr  # (said twice: tried on two threads)
        assert not victim.exists()
        assert workspace.read("o.txt") == "real\n"


@pytest.mark.skipif(sys.platform != "linux", reason="sparse files and /proc are Linux features here")
def test_output_of_several_gib_is_hashed_and_cached_in_bounded_memory(workspace: Workspace, tmp_path: Path) -> None:
    size = 3 << 30
    big = workspace.root / "big.dat"
    with open(big, "wb") as f:
        f.truncate(size)  # sparse: no disk or memory needed to create it
        f.seek(size // 2)
        f.write(b"middle")
    workspace.build_file("", 'genrule(name="t", srcs=["big.dat"], outs=["copy.dat"], cmd="cp --sparse=always $< $@")')
    env = _clean_env(workspace.cache, workspace.home)
    cmd = [BUILDTOOL, "build"]
    script = (
        "import resource, subprocess, sys\n"
        f"p = subprocess.run({cmd!r}, cwd={str(workspace.root)!r})\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(p.returncode)\n"
    )
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
                       check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    peak_kib = int(p.stdout.strip().splitlines()[-1])
    # cp is a child too; both must stay far below the 3 GiB they handled.
    assert peak_kib < 512 * 1024, f"peak RSS {peak_kib} KiB"
    assert (workspace.root / "copy.dat").stat().st_size == size
    blobs = list((cv.layout_dir(workspace.cache) / "cas").glob("*/*"))
    assert any(b.stat().st_size == size for b in blobs)
    (workspace.root / "copy.dat").unlink()
    r = workspace.build()
    assert r.rc == 0 and r.status("//:t") == "restored"
    with open(workspace.root / "copy.dat", "rb") as f:
        f.seek(size // 2)
        assert f.read(6) == b"middle"


def test_error_lines_in_a_generated_buildfile_of_thousands_of_calls(workspace: Workspace) -> None:
    # Call sites are found from the line table once per code object, not by f_lineno per
    # call (quadratic in the calls of one file); the lines must stay those f_lineno gives.
    lines = [f'genrule(name="t{i}", outs=["o{i}"], cmd="echo > $@")' for i in range(3000)]
    lines[16] = 'genrule(\n    name="dup",\n    outs=["first"],\n    cmd="echo > $@",\n)'  # lines 17-21
    lines.append('genrule(name="ok", outs=["ok"], cmd="echo > $@")')
    lines.append('genrule(\n    name="dup",\n    outs=["second"],\n    cmd="echo > $@",\n)')
    text = "\n".join(lines) + "\n"
    second = text.count("\n", 0, text.rindex('genrule(\n    name="dup"')) + 1
    workspace.write("BUILD.py", text)
    rc, out, err = workspace.run("build")
    assert rc == 2, out + err
    assert f"BUILD.py:{second}" in err, err
    assert "first at BUILD.py:17)" in err, err


def test_what_a_buildfile_prints_goes_to_stderr(workspace: Workspace) -> None:
    """stdout carries machine-readable answers (graph --format json, query)."""
    workspace.build_file("", 'print("hello from BUILD")\ngenrule(name="t", outs=["o"], cmd="echo > $@")')
    rc, out, err = workspace.run("graph", "--format", "json")
    assert rc == 0, err
    assert [t["label"] for t in json.loads(out)["targets"]] == ["//:t"]
    assert "hello from BUILD" in err and "hello" not in out


def test_a_directory_named_like_the_marker_or_a_file_for_c(tmp_path: Path) -> None:
    (tmp_path / "ws" / "buildtool.toml").mkdir(parents=True)
    (tmp_path / "f").write_text("")
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    for argv, needle in ((["build"], "is a directory; the workspace marker must be a file"),
                         (["-C", str(tmp_path / "f"), "build"], "is not a directory")):
        p = subprocess.run([BUILDTOOL, *argv], cwd=tmp_path / "ws", env=env, capture_output=True, text=True,
                           check=False)
        assert p.returncode == 2, p.stderr
        assert needle in p.stderr, p.stderr


def test_a_marker_that_is_a_dangling_link_or_a_pipe_is_refused_not_skipped_for_the_parent(tmp_path: Path) -> None:
    """inner/buildtool.toml -> ../moved.toml (moved away): `build` in inner/ built the outer
    workspace, exit 0, while `query //...` in outer left //inner out as a nested one."""
    (tmp_path / "buildtool.toml").write_text("")
    (tmp_path / "BUILD.py").write_text('genrule(name="outer", outs=["o.txt"], cmd="echo > $@")\n')
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    for kind, needle in (("dangling", "is a symbolic link to '../moved.toml', which does not exist"),
                         ("loop", "which leads round in a loop"), ("fifo", "is not a regular file (a pipe")):
        inner = tmp_path / kind
        inner.mkdir()
        (inner / "BUILD.py").write_text('genrule(name="inner", outs=["i.txt"], cmd="echo > $@")\n')
        if kind == "dangling":
            os.symlink("../moved.toml", inner / "buildtool.toml")
        elif kind == "loop":
            os.symlink("buildtool.toml", inner / "buildtool.toml")
        else:
            os.mkfifo(inner / "buildtool.toml")
        p = subprocess.run([BUILDTOOL, "build"], cwd=inner, env=env, capture_output=True, text=True, check=False,
                           timeout=60)
        assert p.returncode == 2 and needle in p.stderr and "the workspace marker must be a file" in p.stderr, \
            (kind, p.stdout, p.stderr)
        assert not (tmp_path / "o.txt").exists()


def test_a_package_whose_build_py_is_a_dangling_link_says_so(workspace: Workspace) -> None:
    """`build //s3` said "there is no s3/BUILD.py; did you mean //s3?" (itself), `//...`
    "cannot read s3/BUILD.py: No such file or directory"."""
    (workspace.root / "s3").mkdir()
    os.symlink("../nowhere/BUILD.py", workspace.root / "s3" / "BUILD.py")
    for pattern in ("//s3", "//s3:x", "//..."):
        rc, _, err = workspace.run("build", pattern)
        assert rc == 2 and "s3/BUILD.py is a symbolic link to '../nowhere/BUILD.py', which leads nowhere" in err \
            and "did you mean" not in err, (pattern, err)


def test_a_workspace_whose_marker_path_is_too_long_is_refused_not_its_parents(tmp_path: Path) -> None:
    """<deep dir>/buildtool.toml longer than PATH_MAX: the lookup took ENAMETOOLONG for "no
    marker here" and built the enclosing workspace instead, exit 0."""
    (tmp_path / "buildtool.toml").write_text("")
    (tmp_path / "BUILD.py").write_text('genrule(name="parent", outs=["p.txt"], cmd="echo PARENT > $@")\n')
    deep = str(tmp_path)
    while len(os.fsencode(deep)) < 4085 - 201:
        deep += "/" + "d" * 200
    deep += "/" + "e" * (4085 - len(os.fsencode(deep)) - 1)
    os.makedirs(deep)
    env = _clean_env(tmp_path / "cache", tmp_path / "home")
    # No marker down there: the enclosing workspace is the one, as from any subdirectory.
    p = subprocess.run([BUILDTOOL, "-C", deep, "build", "//:parent"], env=env, capture_output=True, text=True,
                       check=False)
    assert p.returncode == 0 and (tmp_path / "p.txt").read_text() == "PARENT\n", p.stdout + p.stderr
    (tmp_path / "p.txt").unlink()
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.close(os.open("buildtool.toml", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    p = subprocess.run([BUILDTOOL, "-C", deep, "build"], env=env, capture_output=True, text=True, check=False)
    assert p.returncode == 2 and "is too long for this system" in p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "p.txt").exists()


def test_an_output_through_a_symlinked_directory_cannot_be_a_source_or_another_output(make_workspace) -> None:
    """gen -> src: 'gen/data.txt' as an output would overwrite the source 'src/data.txt';
    'l/o' and 'c/o' with l -> c are one file written by two targets.  Both are exit 2, and
    the source keeps its content."""
    ws = make_workspace("symdirs")
    ws.write("p/src/data.txt", "precious\n")
    os.symlink("src", ws.root / "p" / "gen")
    ws.write("p/BUILD.py", 'genrule(name="x", outs=["gen/data.txt"], cmd="echo generated > $@")\n'
                           'genrule(name="u", srcs=["src/data.txt"], outs=["u.out"], cmd="cat $< > $@")\n')
    rc, _, err = ws.run("build")
    assert rc == 2 and "p/BUILD.py:1" in err and "is the source 'p/src/data.txt' of //p:u" in err, err
    assert (ws.root / "p" / "src" / "data.txt").read_text() == "precious\n"
    ws.write("p/BUILD.py", 'genrule(name="x", outs=["src/o"], cmd="echo x > $@")\n'
                           'genrule(name="y", outs=["gen/o"], cmd="echo y > $@")\n')
    rc, _, err = ws.run("build")
    assert rc == 2 and "p/BUILD.py:2" in err and "is the same file as output 'p/src/o' of //p:x" in err, err


@pytest.mark.parametrize("kind", ["fifo", "dangling"])
def test_a_source_that_is_not_a_regular_file_is_exit_2_not_a_hang(make_workspace, kind: str) -> None:
    ws = make_workspace("special")
    if kind == "fifo":
        os.mkfifo(ws.root / "f.txt")
    else:
        os.symlink("nowhere", ws.root / "f.txt")
    ws.write("BUILD.py", 'genrule(name="a", srcs=["f.txt"], outs=["a"], cmd="cat $< > $@")\n')
    rc, _, err = ws.run("build")
    assert rc == 2 and "BUILD.py:1" in err and "source 'f.txt' is a" in err and "not a file" in err, err


def test_a_source_replaced_by_a_named_pipe_after_a_build_does_not_hang(make_workspace) -> None:
    """Hashing must not open the pipe and wait for a writer.  The no-op check sends such a
    changed source to the full path, whose graph check refuses it (exit 2), as a fresh
    build does."""
    ws = make_workspace("fifo-later")
    ws.write("f.txt", "x\n")
    ws.write("BUILD.py", 'genrule(name="a", srcs=["f.txt"], outs=["a"], cmd="cat $< > $@")\n')
    assert ws.run("build")[0] == 0
    time.sleep(0.1)
    assert ws.run("build")[0] == 0
    (ws.root / "f.txt").unlink()
    os.mkfifo(ws.root / "f.txt")
    rc, out, err = ws.run("build")
    assert rc == 2 and "is a named pipe, not a file" in err, out + err


def test_a_state_directory_that_is_a_symbolic_link_is_refused_and_its_target_untouched(make_workspace) -> None:
    """A checked-in `.buildtool -> ../victim`: `clean` emptied the victim directory (all but a
    `lock`), and builds wrote their state there and removed its `tmp`."""
    ws = make_workspace("statelink")
    ws.write("a", "x\n")
    ws.write("BUILD.py", 'genrule(name="g", srcs=["a"], outs=["o"], cmd="cat $< > $@")\n')
    victim = ws.root.parent / "victim"
    (victim / "tmp").mkdir(parents=True)
    (victim / "notes.txt").write_text("precious\n")
    os.symlink("../victim", ws.root / ".buildtool")
    for command in ("clean", "build", "explain"):
        rc, _, err = ws.run(command)
        assert rc == 2 and ".buildtool is a symbolic link" in err and "remove the link" in err, (command, err)
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt", "tmp"]


@pytest.mark.parametrize("damage", ["state-is-a-file", "state-is-a-pipe", "lock-is-a-directory", "tmp-is-a-file"])
def test_a_damaged_state_directory_is_exit_2_or_mended_never_a_traceback(make_workspace, damage: str) -> None:
    ws = make_workspace("state")
    ws.write("a", "x\n")
    ws.write("BUILD.py", 'genrule(name="g", srcs=["a"], outs=["o"], cmd="cat $< > $@")\n')
    state = ws.root / ".buildtool"
    if damage == "state-is-a-file":
        state.write_text("not a directory\n")
        for command in ("build", "clean"):
            rc, _, err = ws.run(command)
            assert rc == 2 and "must be buildtool's state directory but is a file" in err, (command, err)
            assert "Traceback" not in err
        assert state.read_text() == "not a directory\n"  # not ours to delete
        return
    if damage == "state-is-a-pipe":  # (it said "is a file (or a link to one)")
        os.mkfifo(state)
        rc, _, err = ws.run("build")
        assert rc == 2 and "must be buildtool's state directory but is not a directory (a named pipe" in err, err
        return
    assert ws.run("build")[0] == 0
    if damage == "lock-is-a-directory":
        (state / "lock").unlink()
        (state / "lock").mkdir()
        (state / "lock" / "x").write_text("")
    else:
        shutil.rmtree(state / "tmp", ignore_errors=True)
        (state / "tmp").write_text("in the way\n")
    ws.write("a", "y\n")
    rc, out, err = ws.run("build")
    assert rc == 0 and "Traceback" not in err and "internal error" not in out + err, out + err
    assert (ws.root / "o").read_text() == "y\n"


@pytest.mark.parametrize("where", ["flag", "flag-huge", "env", "config", "remote-flag", "remote-config"])
def test_an_absurd_job_count_is_exit_2_not_a_memory_error(make_workspace, where: str) -> None:
    ws = make_workspace("jobs")
    ws.write("BUILD.py", 'genrule(name="g", outs=["o"], cmd="echo > $@")\n')
    args, env = ["build"], None
    if where == "flag":
        args += ["-j", "100000000000"]
    elif where == "flag-huge":
        args += ["-j99999999999999999999"]
    elif where == "env":
        env = {"BUILDTOOL_JOBS": "100000000000"}
    elif where == "remote-flag":
        args += ["--remote-executor", "grpc://127.0.0.1:1", "--remote-jobs", "5000"]
    elif where == "remote-config":
        ws.write("buildtool.toml", "remote_jobs = 5000\n")
    else:
        ws.write("buildtool.toml", "jobs = 100000000000\n")
    rc, _, err = ws.run(*args, env_extra=env)
    assert rc == 2 and "from 1 to 4096" in err and "Traceback" not in err, err


def test_a_closed_stdout_drops_the_output_and_keeps_the_status(make_workspace) -> None:
    ws = make_workspace("closed-stdout")
    ws.write("BUILD.py", 'genrule(name="g", outs=["o"], cmd="echo built > $@")\n')
    env = _clean_env(ws.cache, ws.home)
    for args in ("build", "query //...", "build"):
        r = subprocess.run(f"{BUILDTOOL} {args} >&-", shell=True, cwd=ws.root, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stderr)
    assert (ws.root / "o").read_text() == "built\n"


def test_a_full_stdout_loses_the_output_not_the_build(make_workspace) -> None:
    # `> /dev/full`: every write fails with ENOSPC, as on a full log disk.
    ws = make_workspace("full-stdout")
    ws.write("BUILD.py", 'genrule(name="g", outs=["o"], cmd="echo built > $@")\n'
                         'genrule(name="h", srcs=[":g"], outs=["p"], cmd="cat $< > $@")\n')
    env = _clean_env(ws.cache, ws.home)

    def run(args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(f"{BUILDTOOL} {args} > /dev/full", shell=True, cwd=ws.root, env=env,
                              capture_output=True, text=True, timeout=120)

    r = run("build")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("output is lost (No space left on device)") == 1, r.stderr
    assert (ws.root / "p").read_text() == "built\n"
    r = run("query //...")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "buildtool: error: No space left on device" in r.stderr
    rc, out, _ = ws.run("build", "--explain")
    assert rc == 0 and "up_to_date" in out, out  # the first build was recorded in full


@pytest.mark.parametrize("dirname", ["a:b", "nl\nx", "odd/..."])
def test_a_buildfile_in_a_directory_no_label_can_name_is_exit_2(make_workspace, dirname: str) -> None:
    ws = make_workspace("odd-package")
    ws.write("BUILD.py", 'genrule(name="ok", outs=["o"], cmd="echo > $@")\n')
    ws.write("sp dir/BUILD.py", 'genrule(name="t", outs=["o"], cmd="echo > $@")\n')  # built, as ever
    ws.write(f"{dirname}/BUILD.py", 'genrule(name="t", outs=["o"], cmd="echo > $@")\n')
    rc, _, err = ws.run("build")
    assert rc == 2 and f"{dirname!r}: a directory holding a BUILD.py is a package" in err, err
    assert not (ws.root / "o").exists()
    rc, _, err = ws.run("build", "//:ok")  # discovery is not needed for one label
    assert rc == 0, err
    ws.write(".buildtoolignore", dirname.replace("\n", "?") + "/\n")
    rc, _, err = ws.run("build")
    assert rc == 0 and (ws.root / "sp dir" / "o").exists(), err


def test_an_error_points_at_the_buildfile_when_buildtool_is_installed_inside_the_workspace(
    workspace: Workspace,
) -> None:
    """A `.venv` in the workspace holding buildtool (and any library): the error named
    .venv/lib/site-packages/buildtool/loader.py, the deepest frame under the root."""
    import buildtool

    site = workspace.root / ".venv" / "lib" / "python3" / "site-packages"
    shutil.copytree(Path(buildtool.__file__).parent, site / "buildtool",
                    ignore=shutil.ignore_patterns("__pycache__"))
    workspace.write(".buildtoolignore", ".venv\n")
    workspace.write("pkg/BUILD.py", 'x = 1\nglob(["../x"])\n')
    env = dict(_clean_env(workspace.cache, workspace.home), PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-m", "buildtool", "build"], cwd=workspace.root, capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 2 and "pkg/BUILD.py:2:" in r.stderr, r.stderr


def test_a_buildtoolignore_that_is_not_utf8_still_ignores_what_it_names(workspace: Workspace) -> None:
    """A Latin-1 directory name in .buildtoolignore: every command was a traceback."""
    workspace.build_file("", 'genrule(name="t", outs=["o"], cmd="echo > $@")')
    bad = os.fsencode(workspace.root) + b"/caf\xe9"
    os.mkdir(bad)
    with open(bad + b"/BUILD.py", "wb") as f:
        f.write(b"raise RuntimeError('an ignored package was loaded')\n")
    (workspace.root / ".buildtoolignore").write_bytes(b"# caf\xe9 is a vendored tree\ncaf\xe9\n")
    rc, out, err = workspace.run("build")
    assert rc == 0 and "Traceback" not in err, (out, err)


def test_a_buildtoolignore_line_with_a_form_feed_or_line_separator_is_one_pattern(workspace: Workspace) -> None:
    """str.splitlines cut a line at U+2028, a form feed, \\x1c...: listing `vendor<U+2028>x`
    ignored //vendor, //x and //y instead, and the build said OK without //x and //y."""
    for d in ["x", "y", "vendor\u2028x\u2028y", "f\x0cg"]:
        workspace.build_file(d, f'genrule(name="g", outs=["o"], cmd="echo {len(d)} > $@")\n')
    workspace.build_file("", 'genrule(name="root", outs=["r"], cmd="echo > $@")\n')
    (workspace.root / ".buildtoolignore").write_text("# third-party\nvendor\u2028x\u2028y\nf\x0cg\n")
    rc, out, err = workspace.run("query", "//...")
    assert rc == 0 and set(out.split()) == {"//:root", "//x:g", "//y:g"}, out + err


@pytest.mark.parametrize(("pattern", "matched"), [
    ("test[!_]*", ["test1.c"]),  # (not test/fixture.c: a set never matches "/")
    ("test[/]fixture.c", []),
    ("[]]x", ["]x"]),  # ("]" first in a set is one of its characters, as in fnmatch)
    ("[!]]x", ["ax"]),
    ("br[[]ack].txt", ["br[ack].txt"]),  # (a literal "[", without Python's "nested set" warning)
])
def test_glob_sets_follow_fnmatch_within_one_path_component(workspace: Workspace, pattern: str,
                                                            matched: list[str]) -> None:
    """A set matched "/" (`test[!_]*` took test/fixture.c), `[]]` was "not a valid
    pattern (bad escape \\Z)" and `[[]` printed a FutureWarning."""
    for name in ["test1.c", "test_helper.c", "test/fixture.c", "]x", "ax", "br[ack].txt"]:
        workspace.write(name, "x\n")
    workspace.build_file("", f"print(sorted(glob([{pattern!r}])))\ngenrule(name='g', outs=['o'], cmd='echo > $@')\n")
    rc, out, err = workspace.run("query", "//...")
    assert rc == 0 and repr(matched) in err.splitlines(), out + err  # (print in a BUILD.py: stderr)
    assert "Warning" not in err, err


def test_output_names_with_format_characters_and_odd_spaces_are_fine(workspace: Workspace) -> None:
    """The control-character check refused U+200C (a zero-width non-joiner, in Persian
    words) and a no-break space: str.isprintable says no to them, yet they are no control."""
    names = ["\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645.txt", "no\u00a0break.txt"]
    workspace.build_file("", f"genrule(name='t', outs={names!r}, cmd='for f in $(OUTS); do echo > $$f; done')")
    r = workspace.build()
    assert r.rc == 0 and all(workspace.exists(n) for n in names), r.output


def _without_dac_override(workspace: Workspace, *args: str) -> subprocess.CompletedProcess[str]:
    """Run buildtool as root without the capabilities that let root read anything, so a
    chmod 000 directory is unreadable to it as to any user."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to take away root's override of file permissions")
    cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", shutil.which("buildtool") or "buildtool",
           "-C", str(workspace.root), *args]
    env = dict(os.environ, BUILDTOOL_CACHE_DIR=str(workspace.cache))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("where", ["package", "globbed", "ignore file"])
def test_an_unreadable_directory_or_ignore_file_is_exit_2_not_silently_left_out(
        workspace: Workspace, where: str) -> None:
    """A package directory or a globbed one that cannot be listed dropped out with exit 0
    (//q not built, a glob without the hidden sources); an unreadable .buildtoolignore was
    taken as empty, so the packages it leaves out were built."""
    workspace.build_file("q", 'genrule(name="q", outs=["q.out"], cmd="touch $@")\n')
    workspace.build_file("p", 'genrule(name="p", srcs=glob(["src/**/*.c"]), outs=["p.out"], cmd="cat $(SRCS) > $@")\n')
    workspace.write("p/src/one.c", "1\n")
    workspace.write("p/src/hidden/two.c", "2\n")
    workspace.write(".buildtoolignore", "q\n")
    blocked = {"package": workspace.root / "q", "globbed": workspace.root / "p" / "src" / "hidden",
               "ignore file": workspace.root / ".buildtoolignore"}[where]
    if where == "package":
        workspace.write(".buildtoolignore", "")
    blocked.chmod(0)
    try:
        r = _without_dac_override(workspace, "build")
    finally:
        blocked.chmod(0o755)
    assert r.returncode == 2, r.stdout + r.stderr
    rel = os.path.relpath(blocked, workspace.root)
    assert (f"cannot list the directory {rel} (Permission denied)" in r.stderr if where != "ignore file"
            else "cannot read" in r.stderr and ".buildtoolignore: Permission denied" in r.stderr), r.stderr
    assert not workspace.exists("p/p.out") and not workspace.exists("q/q.out")


def test_an_output_its_command_made_unreadable_fails_the_target_with_a_reason(workspace: Workspace) -> None:
    """chmod 000 of an output (as a user, not root) was "internal error: PermissionError"
    and the file stayed."""
    workspace.write("a.txt", "a\n")
    workspace.build_file("", 'genrule(name="z", srcs=["a.txt"], outs=["z.out"], cmd="cp $< $@ && chmod 000 $@")\n')
    r = _without_dac_override(workspace, "build")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "declared output z.out cannot be read (Permission denied)" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "internal error" not in r.stdout + r.stderr and not workspace.exists("z.out")


def test_a_tool_that_can_be_run_but_not_read_is_up_to_date_the_second_time(workspace: Workspace) -> None:
    """Its digest is "unreadable" and no stat was kept for it: the check after the command
    compared a stat with nothing, so every build ran the target and recorded nothing."""
    tool = workspace.root / "bin" / "xonly"
    tool.parent.mkdir()
    shutil.copy("/bin/true", tool)
    tool.chmod(0o111)
    workspace.build_file("", 'genrule(name="a", outs=["a.out"], tools=["xonly"], env={"PATH": "bin:/usr/bin:/bin"}, '
                             'cmd="xonly && echo a > $@")\n')
    r = _without_dac_override(workspace, "build")
    assert r.returncode == 0 and "changed while the command ran" not in r.stderr, r.stdout + r.stderr
    r = _without_dac_override(workspace, "build")
    assert r.returncode == 0 and "1 up_to_date" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("what", ["name", "path"])
def test_an_output_name_or_path_too_long_for_the_file_system_is_exit_2_before_anything_runs(
    workspace: Workspace, what: str
) -> None:
    """It failed its target at run time (exit 1), after the others had run."""
    out = "x" * 256 if what == "name" else "/".join(["d" * 200] * 21)
    workspace.build_file("", f'genrule(name="first", outs=["first.txt"], cmd="echo > $@")\n'
                             f'genrule(name="long", outs=["{out}"], cmd="echo > $@")\n')
    rc, out_, err = workspace.run("build")
    said = "has a name of 256 bytes; a file name can have at most 255" if what == "name" else \
        "bytes long as a path from /; a path can have at most 4095"
    assert rc == 2 and said in err and "BUILD.py:2" in err, out_ + err
    assert not workspace.exists("first.txt")


def test_a_tree_deeper_than_python_s_recursion_limit_is_walked(workspace: Workspace) -> None:
    """Discovery and glob() recursed once per directory level: 1,000 levels (a 2,000-byte
    path) were a RecursionError traceback for build, query and even clean."""
    deep = "/".join(["a"] * 1100)
    subprocess.run(["mkdir", "-p", deep], cwd=workspace.root, check=True)  # (os.makedirs recurses too)
    try:
        _walk_the_deep_tree(workspace, deep)
    finally:  # (shutil.rmtree, which removes the test's directory, recurses too)
        subprocess.run(["rm", "-rf", "a"], cwd=workspace.root, check=True)


def _walk_the_deep_tree(workspace: Workspace, deep: str) -> None:
    fd = os.open(workspace.root, os.O_RDONLY)
    try:  # (a path relative to a descriptor: pathlib's own walks up and down recurse)
        for name, text in (("leaf.txt", "bottom\n"),
                           ("BUILD.py", 'genrule(name="p", srcs=["leaf.txt"], outs=["p.out"], cmd="cp $< $@")\n')):
            with open(f"{deep}/{name}", "w", opener=lambda p, f: os.open(p, f, 0o644, dir_fd=fd)) as out:
                out.write(text)
    finally:
        os.close(fd)
    workspace.build_file("", 'genrule(name="g", srcs=glob(["**/*.txt"]), outs=["g.out"], cmd="echo $(SRCS) > $@")\n')
    for args in (["build"], ["query", "//..."], ["clean"], ["build", "//:g"]):
        rc, out, err = workspace.run(*args)
        assert rc == 0 and "Traceback" not in err, (args, out[-500:], err[-1500:])
    assert workspace.read("g.out") == "\n"  # (the leaf is its own package's, not //:g's)
    rc, out, err = workspace.run("query", f"//{deep}:p")
    assert rc == 0 and out.strip().endswith("/a:p"), err[-1500:]


def test_a_command_s_tree_deeper_than_python_s_recursion_limit_is_removed(workspace: Workspace) -> None:
    """A tree 1,000 levels deep that a command leaves in its TMPDIR, or an output 1,000
    directories down: shutil.rmtree and os.makedirs recurse once a level (Python 3.11), and
    the RecursionError failed targets whose commands had succeeded ("internal error")."""
    deep_out = "/".join(["e"] * 1000) + "/f"
    workspace.build_file("", 'genrule(name="g", outs=["g.out"], cmd="echo ok > $@; cd $$TMPDIR && '
                             'for i in $$(seq 1000); do mkdir x && cd x; done")\n'
                             f'genrule(name="deep", outs=["{deep_out}"], cmd="echo deep > $@")\n')
    try:
        r = workspace.build("-j1")
        assert r.rc == 0 and "internal error" not in r.output and "Traceback" not in r.output, r.output[-2000:]
        assert workspace.read("g.out") == "ok\n"
        subprocess.run(["rm", "-rf", "e"], cwd=workspace.root, check=True)  # (restored from the cache)
        r = workspace.build("-j1")
        assert r.rc == 0 and r.status("//:deep") == "restored", r.output[-2000:]
        rc, _, err = workspace.run("clean")
        assert rc == 0 and "Traceback" not in err, err[-2000:]
    finally:  # (shutil.rmtree, which removes the test's directory, recurses too)
        subprocess.run(["rm", "-rf", "e", ".buildtool"], cwd=workspace.root, check=True)


def test_a_buildfile_that_changes_the_working_directory_is_refused(workspace: Workspace, tmp_path: Path) -> None:
    """os.chdir() in a BUILD.py moved the whole process: --events went to that directory,
    and another BUILD.py's relative open() failed, blamed on that one.  Refused wherever
    buildtool runs from (a chdir into its own package passed when started there)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workspace.build_file("", f'import os\nos.chdir({str(elsewhere)!r})\n'
                             'genrule(name="x", outs=["x.out"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("build", "--events", "ev.jsonl")
    assert rc == 2 and f"BUILD.py:2: evaluating BUILD.py called os.chdir({str(elsewhere)!r}), which moves the " \
        "whole process" in err, out + err
    assert not (elsewhere / "ev.jsonl").exists() and list(elsewhere.iterdir()) == []
    workspace.build_file("tools", 'import os\nos.chdir(os.path.dirname(__file__))\n'
                                  'genrule(name="v", outs=["v"], cmd="echo > $@")\n')
    for cwd in (workspace.root, workspace.root / "tools"):
        rc, out, err = workspace.run("build", "//tools:v", cwd=cwd)
        assert rc == 2 and "tools/BUILD.py:2: evaluating tools/BUILD.py called os.chdir(" in err, (cwd, out + err)


def test_a_glob_that_may_not_be_empty_and_is_names_its_patterns(workspace: Workspace) -> None:
    """`allow_empty=False` (Bazel's) raised TypeError: unexpected keyword; a `*.cpp` for
    `.cc` files gave an empty srcs and an empty output without a word."""
    workspace.write("a.cc", "int main(){}\n")
    workspace.build_file("", 'genrule(name="x", srcs=glob(["*.cpp"], allow_empty=False), outs=["o"], '
                             'cmd="cat $(SRCS) > $@")\n')
    rc, out, err = workspace.run("build")
    assert rc == 2 and "BUILD.py:1: glob(['*.cpp']) matches no file of // (allow_empty=False)" in err, out + err
    workspace.build_file("", 'genrule(name="x", srcs=glob(["*.cc"], allow_empty=False), outs=["o"], '
                             'cmd="cat $(SRCS) > $@")\n')
    rc, out, err = workspace.run("build")
    assert rc == 0 and workspace.read("o") == "int main(){}\n", out + err


def test_a_path_into_another_package_is_told_how_to_name_it(workspace: Workspace) -> None:
    """`srcs=["../x/a.txt"]` said only "must stay inside the package"; the file of another
    package is named by a label (a path out of the workspace gets no such hint)."""
    workspace.write("x/a.txt", "a\n")
    workspace.build_file("x", 'genrule(name="a", srcs=["a.txt"], outs=["o"], cmd="cp $< $@")\n')
    workspace.build_file("lib", 'genrule(name="t", srcs=["../x/a.txt"], outs=["o"], cmd="cat $< > $@")\n')
    rc, _, err = workspace.run("build", "//lib:t")
    assert rc == 2 and "lib/BUILD.py:1: //lib:t: srcs path '../x/a.txt' must stay inside the package (no '..'); " \
        "a file of another package is named by its label, '//pkg:file'" in err, err
    workspace.build_file("lib", 'genrule(name="t", srcs=["../../a.txt"], outs=["o"], cmd="cat $< > $@")\n')
    rc, _, err = workspace.run("build", "//lib:t")
    assert rc == 2 and "(no '..')" in err and "named by its label" not in err, err


def test_a_module_imported_by_its_name_beside_the_buildfile_is_told_its_full_name(workspace: Workspace) -> None:
    """`import defs` in pkg/BUILD.py beside pkg/defs.py: a bare ModuleNotFoundError."""
    workspace.write("pkg/defs.py", "X = 1\n")
    workspace.build_file("pkg", "import defs\n")
    rc, _, err = workspace.run("build", "//pkg:all")
    assert rc == 2 and "No module named 'defs' (pkg/defs.py is there, but modules are found from the " \
        "workspace root: `from pkg import defs`)" in err, err


ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}  # (not UTF-8)


def test_a_locale_that_is_not_utf8_keys_apart_and_never_tracebacks(workspace: Workspace) -> None:
    """Under a Latin-1 or ASCII locale, `echo é` runs as other bytes with the UTF-8 run's
    key (its output restored or up to date across locales); a command printing a character
    the console could not show, or a file name it could not give the system, was a
    UnicodeEncodeError traceback."""
    workspace.build_file("", 'genrule(name="e", outs=["e.txt"], cmd="echo e > $@")\n'
                             "genrule(name=\"u\", outs=[\"u.txt\"], cmd=\"printf '\\\\305\\\\215\\\\n'; touch $@\")\n")
    assert workspace.run("build")[0] == 0
    for _ in range(5):  # (the no-op snapshot vouches, under UTF-8, once its files are older than a clock tick...)
        time.sleep(0.2)
        out = workspace.run("build")[1]
        if "(nothing changed)" in out:
            break
    assert "(nothing changed)" in out, out
    rc, out, err = workspace.run("build", env_extra=ASCII_LOCALE)  # (...not under another one)
    assert rc == 0 and "(nothing changed)" not in out and "2 ran" in out and "Traceback" not in err, out + err
    assert "\\u014d" in out, out  # (what the command printed, as an escape)
    rc, out, err = workspace.run("build", "--explain")
    assert rc == 0 and "//:e: up_to_date: the locale's encoding changed from ascii to utf-8" in out, out + err
    workspace.build_file("", 'genrule(name="o", outs=["\u014d.txt"], cmd="echo > $@")\n')
    rc, out, err = workspace.run("build", env_extra=ASCII_LOCALE)
    assert rc == 2 and "BUILD.py:1:" in err and "this locale's encoding (ascii) cannot give the system; " \
        "use a UTF-8 locale" in err and "Traceback" not in err, out + err
    assert workspace.run("build")[0] == 0  # (under UTF-8: fine)
