"""Run: ``buildtool run //pkg:target -- ARGS`` builds one target, then runs it in the foreground.

A target with one output runs that output (it must be executable); a target with no
outputs runs its command (after substitution) with ARGS appended, shell-quoted.  Either
runs in the target's package directory with the caller's environment plus the target's
``env``, replacing the buildtool process (``exec``), so the terminal, signals and the exit
code belong to the child.  A target without outputs is not built itself (only its
dependencies), so an ``always=True`` task runs once, not twice.  If the build fails, its
exit code is returned and nothing runs.  Imports of heavy modules are deferred so the CLI
stays fast.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys

TYPE_CHECKING = False  # cli.py registers this parser on every start
if TYPE_CHECKING:
    from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``run`` subcommand's arguments."""
    from buildtool.config import integer

    r: argparse.ArgumentParser = sub.add_parser(
        "run", help="build one target, then run its output (or its command) with ARGS: run //pkg:t -- ARGS",
        usage="buildtool run TARGET [options] [ARGS...] [-- ARGS...]",
        epilog="Exit status: the program's own once the build succeeded (127: it could not be executed); "
               "else the build's (1 failed, 2 invalid, 130 interrupted) and nothing runs.",
    )
    # Optional to argparse only so that a missing TARGET gets our message.  ARGS: those
    # right after TARGET; cli.py adds the ones after ``--``.
    r.add_argument("target", metavar="TARGET", nargs="?", help="one target label")
    r.add_argument("args", nargs="*", metavar="ARGS",
                   help="arguments for the program, after -- (buildtool's own options may come before it)")
    r.add_argument("-j", "--jobs", type=integer,
                   help="parallel jobs for the build (default: the jobs setting, else usable CPUs)")
    r.add_argument("-k", "--keep-going", action="store_true", default=None, help="keep building after a failure")
    r.add_argument("--no-keep-going", dest="keep_going", action="store_false",
                   help="stop at the first failure, whatever keep_going the config or environment sets")
    r.add_argument("--cache-dir", help="shared cache directory (env BUILDTOOL_CACHE_DIR)")
    r.add_argument("--events", metavar="FILE", help="write JSON Lines build events to FILE")
    r.add_argument("--no-wait", action="store_true", help="fail instead of waiting for another buildtool")
    r.add_argument("--action-env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="pass an environment variable to every action (part of its key)")
    from buildtool.remote.options import add_flags as add_remote_flags

    add_remote_flags(r)
    return r


def run_command(ns: argparse.Namespace) -> int:
    """Build ``ns.target`` and exec it; returns only on a build failure or exec error."""
    from buildtool import labels
    from buildtool.errors import UserError
    from buildtool.graph import GraphBuilder
    from buildtool.loader import Loader
    from buildtool.record import BuildRecord
    from buildtool.session import BuildRequest, Session

    if ns.target is None:
        msg = "run needs one TARGET: buildtool run //pkg:target [-- ARGS...]"
        raise UserError(msg)
    flags = {"jobs": ns.jobs, "keep_going": ns.keep_going, "cache_dir": ns.cache_dir}
    if any(v is not None for k, v in vars(ns).items() if k.startswith("remote_")):
        from buildtool.remote.options import flags_of

        flags.update(flags_of(ns))
    session = Session(ns.directory, flags)
    ws = session.ws

    def warn(msg: str) -> None:
        print(f"buildtool: warning: {msg}", file=sys.stderr, flush=True)

    # Read only (not closed: closing may compact the file, which takes the workspace lock's
    # build to do safely).
    builder = GraphBuilder(Loader(ws, BuildRecord(os.path.join(ws.state_dir, "record"), warn).all_outputs()),
                           ws.cwd_pkg_dir)
    try:
        pat = labels.parse_pattern(ns.target, builder.current_package(), ws.cwd_pkg_dir)
    except labels.LabelError as e:
        if (below := builder.package_below(ns.target)) is None:
            raise builder.pattern_error(ns.target, e) from None
        ns.target = f"//{below}"  # (`run core` in lib/: //lib/core, as build takes it)
        pat = labels.parse_pattern(ns.target, builder.current_package(), ws.cwd_pkg_dir)
    if pat.kind != "target":
        msg = f"`buildtool run` needs one target label, not the pattern {ns.target!r}"
        raise UserError(msg)
    graph = builder.build(builder.expand_patterns([ns.target], want_tests=False))
    t = graph.targets[graph.requested[0]]
    if t.kind == "group" or len(t.outs) > 1:
        what = "is a group" if t.kind == "group" else f"has {len(t.outs)} outputs"
        msg = (f"cannot run {t.label}: it {what}; `buildtool run` runs a target's single output, "
               "or the command of a target without outputs")
        raise UserError(msg)
    to_build = [t.label] if t.outs else [graph.targets[d].label for d in t.deps]
    if to_build:
        req = BuildRequest(
            patterns=to_build, mode="build", jobs=ns.jobs, keep_going=ns.keep_going, cache_dir=ns.cache_dir,
            events=ns.events, wait=not ns.no_wait, action_env=ns.action_env, want_files=True,
        )
        session.build(req, out=sys.stderr)  # raises BuildFailed / Interrupted: the CLI maps the exit code
    elif ns.events:
        session.events_of_nothing(ns.events, graph, builder.loader)
    return exec_target(ws.root, t, list(ns.args), getattr(ns, "sigint_ignored", False))


def exec_target(root: str, t: Any, args: list[str], sigint_ignored: bool = False) -> int:
    """Replace this process with the target's program (see the module docstring), with
    SIGPIPE and SIGXFSZ at their defaults (Python ignores both, and the program would then
    die of neither: ``run //:yes | head`` said "Broken pipe"; what buildtool inherited for
    them is not known), and SIGINT ignored if ``sigint_ignored``: it was when buildtool
    started (the CLI stops on it while building), as ``prog &`` in a script would have it."""
    import signal

    from buildtool.executor import shell_argv, shell_for

    cwd = os.path.join(root, t.pkg)
    env = dict(os.environ)
    env.update(t.env)
    env["BUILDTOOL_WORKSPACE"] = root
    env["BUILDTOOL_RUN_CWD"] = os.getcwd()
    if t.outs:
        path = os.path.join(root, t.outs[0])
        if not os.access(path, os.X_OK) or not os.path.isfile(path):  # 127, as a shell says (docs' exit codes)
            print(f"buildtool: error: cannot run {t.label}: its output {t.outs[0]} is not an executable file "
                  "(make the command chmod +x it)", file=sys.stderr)
            return 127
        argv = [path, *args]
    else:
        import shlex

        cmd = t.cmd if not args else f"{t.cmd} {shlex.join(args)}"
        argv = shell_argv(shell_for(cmd), cmd, False)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.chdir(cwd)
        for sig, how in ((signal.SIGPIPE, signal.SIG_DFL), (signal.SIGXFSZ, signal.SIG_DFL),
                         (signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.SIG_DFL)):
            signal.signal(sig, how)
        os.execve(argv[0], argv, env)
    except OSError as e:
        why = e.strerror
        interpreter = _interpreter(argv[0]) if e.errno == errno.ENOENT and os.path.isfile(argv[0]) else None
        if interpreter is not None:  # (ENOENT for a file that is there: its #! names a missing program)
            why = f"its interpreter {interpreter!r} (from its #! line) does not exist"
        print(f"buildtool: error: could not run {argv[0]}: {why}", file=sys.stderr)
        return 127
    return 127  # not reached


def _interpreter(path: str) -> str | None:
    """The program a script's ``#!`` line names, if it does not exist (else None)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].rstrip(b"\n").replace(b"\t", b" ").split(b" ")  # (the kernel splits at blanks only:
    name = next((w for w in words if w), None)                           # a CRLF line names "/bin/sh\r")
    return None if name is None or os.path.exists(name) else os.fsdecode(name)
