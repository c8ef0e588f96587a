"""Insight commands: ``explain``, ``plan``, ``query`` and ``graph`` — their arguments and
handlers.  Each looks at a build without running anything (cli.py registers them).
"""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False  # cli.py registers these parsers on every start
if TYPE_CHECKING:
    from typing import Any

COMMANDS = ("explain", "plan", "query", "graph")


def add_parsers(sub: Any) -> None:
    from buildtool.config import integer

    e = sub.add_parser("explain", help="why each target would run or not (runs nothing)")
    e.add_argument("patterns", nargs="*", metavar="PATTERN", help="targets or patterns (default //...)")
    e.add_argument("--cache-dir", help="shared cache directory (env BUILDTOOL_CACHE_DIR)")
    e.add_argument("--action-env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="as for build: variables passed to every action (part of the key)")
    e.add_argument("--no-wait", action="store_true", help="fail instead of waiting for another buildtool")
    e.add_argument("--test", action="store_true",
                   help="explain `buildtool test` (would each test run, or is its pass cached?) instead of build")
    # A build's --remote-* flags pasted in (a CI job's): refused with what explain does instead.
    for flag in ("--remote-cache", "--remote-executor", "--remote-instance", "--remote-timeout", "--remote-jobs",
                 "--remote-download"):
        e.add_argument(flag, help=argparse.SUPPRESS)
    e.add_argument("--remote-header", action="append", help=argparse.SUPPRESS)
    e.add_argument("--remote-upload", action="store_true", default=None, help=argparse.SUPPRESS)
    e.add_argument("--no-remote-upload", action="store_false", dest="remote_upload", help=argparse.SUPPRESS)

    p = sub.add_parser("plan", help="simulate the scheduler on recorded durations; predict the makespan")
    p.add_argument("patterns", nargs="*", metavar="PATTERN", help="targets or patterns (default //...)")
    jobs = p.add_mutually_exclusive_group()  # (-j with --jobs-range: -j was silently ignored)
    jobs.add_argument("-j", "--jobs", type=integer,
                      help="simulated parallel jobs (default: the jobs setting, else usable CPUs)")
    jobs.add_argument("--jobs-range", metavar="A-B", help="predict for every job count from A to B")
    p.add_argument("--incremental", action="store_true",
                   help="predict the next build from the current state (up to date / restorable = free)")
    p.add_argument("--test", action="store_true", help="plan `buildtool test` (tests included) instead of build")
    p.add_argument("--cache-dir", help="shared cache directory: durations of labels this workspace has no "
                   "record of, and what --incremental may restore")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")

    q = sub.add_parser("query", help="deps(), rdeps(), outputs(), inputs(), kind(), tests() of targets",
                       epilog="Examples: query 'deps(//app:main)'; query 'rdeps(//..., //lib:include/core.h)' "
                              "(what a header edit reruns); query 'outputs(//lib/...)'; query "
                              "'kind(test, deps(//app:main))'.")
    q.add_argument("expr", metavar="EXPR", help="deps(P) | rdeps(UNIVERSE, TARGET|FILE) | outputs(P) | inputs(P) | "
                   "kind(REGEX, P) | tests(P) | PATTERN; P: a pattern, or deps(), rdeps(), kind() or tests() "
                   "inside kind() and tests()")

    g = sub.add_parser("graph", help="print the dependency graph (Graphviz dot, JSON, or compile_commands.json)")
    g.add_argument("patterns", nargs="*", metavar="PATTERN", help="targets or patterns (default //...)")
    g.add_argument("--format", choices=("dot", "json", "compdb"), default="dot",
                   help="dot (Graphviz, the default), json (formats.md) or compdb (compile_commands.json of "
                   "the compile targets, for clangd: docs/cc.md)")


class _ReaderWatch:
    """A stream that notes when its reader went away (the console drops output from then
    on and the command goes on; a listing then exits 141, as a C program killed by SIGPIPE)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.reader_left = False

    def write(self, s: str) -> int:
        try:
            return self._stream.write(s)
        except BrokenPipeError:
            self.reader_left = True
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self.reader_left = True
            raise

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: the stream's
        return getattr(self._stream, name)


def dispatch(args: argparse.Namespace) -> int:
    from buildtool.session import Session

    if args.command == "explain":
        from buildtool.session import BuildRequest

        given = sorted(k for k, v in vars(args).items() if k.startswith("remote_") and v is not None)
        if given:
            from buildtool.errors import UserError

            flag = "--" + given[0].replace("_", "-")
            msg = (f"explain takes no {flag}: it never contacts a remote cache or executor (what one holds shows as "
                   f"WOULD RUN); `buildtool build --explain {flag} ...` says what a build with it does")
            raise UserError(msg)

        session = Session(args.directory, {"cache_dir": args.cache_dir})
        req = BuildRequest(patterns=args.patterns, mode="test" if args.test else "explain", dry_run=True, explain=True,
                           cache_dir=args.cache_dir, wait=not args.no_wait, action_env=args.action_env)
        out = _ReaderWatch(sys.stdout)
        session.build(req, out=out)
        return 141 if out.reader_left else 0  # (`explain | head -1`: 128 + SIGPIPE, as the other listings)
    if args.command == "plan":
        return _plan(args, Session(args.directory, {"jobs": args.jobs, "cache_dir": args.cache_dir}))
    if args.command in ("query", "graph"):
        from buildtool import query
        from buildtool.graph import GraphBuilder
        from buildtool.loader import Loader
        from buildtool.record import BuildRecord

        session = Session(args.directory)
        import os

        record = BuildRecord(os.path.join(session.ws.state_dir, "record"), _warn)
        builder = GraphBuilder(Loader(session.ws, record.all_outputs()), session.ws.cwd_pkg_dir)
        builder.default_test_timeout = session.config.test_timeout  # (the graph a build would have)
        if args.command == "query":
            _, result = query.evaluate(builder, query.parse(args.expr), record, _warn)
            _emit("".join(f"{line}\n" for line in result))
            return 0
        graph = builder.build(query.roots(builder, args.patterns))
        if args.format == "compdb":
            from buildtool import compdb

            _emit(compdb.to_json(graph, session.ws.root) + "\n")
        else:
            _emit((query.to_dot(graph) if args.format == "dot" else query.to_json(graph)) + "\n")
        return 0
    raise AssertionError(args.command)


def _emit(text: str) -> None:
    """Labels and paths as the file system has them: UTF-8 (a name that is not as its own
    bytes), whatever the locale's encoding (print() raised UnicodeEncodeError for 日本
    under a Latin-1 one, and wrote é as a Latin-1 byte into a dot file)."""
    import os
    import select

    data = memoryview(text.encode("utf-8", "surrogateescape"))
    sys.stdout.flush()
    try:
        fd = sys.stdout.buffer.fileno()
    except (AttributeError, OSError, ValueError):  # (not a file: a test's capture)
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    # Not the buffer's write: a pipe whose reader left after taking part of a large write
    # got the rest dropped without an error (exit 0, the listing cut short unsaid).
    while data:
        try:
            n = os.write(fd, data)  # BrokenPipeError once the reader left (exit 141)
        except BlockingIOError:  # (a non-blocking stdout someone handed us)
            select.select([], [fd], [])
            continue
        data = data[n:]


def _warn(msg: str) -> None:
    print(f"buildtool: warning: {msg}", file=sys.stderr, flush=True)


def _plan(args: argparse.Namespace, session: Any) -> int:
    import json
    import os

    from buildtool import simulate
    from buildtool.config import MAX_JOBS, cpu_count
    from buildtool.errors import UserError
    from buildtool.record import BuildRecord

    mode = "test" if args.test else "build"
    if args.jobs_range:
        try:
            jobs_list = simulate.parse_jobs_range(args.jobs_range)
        except ValueError as e:
            raise UserError(str(e)) from None
    else:
        jobs = args.jobs if args.jobs is not None else (session.config.jobs or cpu_count())
        if not 1 <= jobs <= MAX_JOBS:
            msg = f"-j must be from 1 to {MAX_JOBS} (got {jobs})"
            raise UserError(msg)
        jobs_list = [jobs]
    durations = BuildRecord(os.path.join(session.ws.state_dir, "record"), _warn).durations()
    free: set[int] = set()
    if args.incremental:
        import io

        from buildtool import explain
        from buildtool.session import BuildRequest

        res = session.build(BuildRequest(patterns=args.patterns, mode=mode, dry_run=True, cache_dir=args.cache_dir),
                            out=io.StringIO())
        graph = res.graph
        for lab, o in res.outcomes.items():
            if explain.verdict(o) in (explain.FRESH, explain.RESTORE, explain.GROUP):
                free.add(graph.by_label[lab])
    else:
        graph = session.load_graph(args.patterns, mode)
        if mode == "build":  # a test that `build` reaches (through a group, a dep) is not run
            free.update(t.id for t in graph.targets if t.kind == "test")
    # Labels the record has no duration for (a fresh checkout, after `clean`): the cache's,
    # as the build's own weights take them.
    missing = [t.label for t in graph.targets if t.kind != "group" and t.label not in durations]
    if missing and mode == "test":  # (a red test's last run: testing.py, as the build's weights take it)
        from buildtool.testing import TestLogs

        failed_s = TestLogs(session.ws.state_dir, lambda _m: None).failed_s  # (read only: the next test says)
        durations.update((lab, failed_s[lab]) for lab in missing if lab in failed_s)
        missing = [lab for lab in missing if lab not in durations]
    if missing:
        durations.update(_cached_durations(session.config.cache_dir, missing))
    costs = simulate.costs_from_record(graph, durations, free)
    text, data = simulate.report(graph, costs, jobs_list, incremental=args.incremental,
                                 pool_depth=session.config.pools)
    print(json.dumps(data, indent=1) if args.json else text)
    return 0


def _cached_durations(cache_dir: str, labels: list[str]) -> dict[str, float]:
    """The durations the shared cache holds for ``labels`` (actiondb's durations table),
    read only: a report writes nothing to the cache."""
    import os

    from buildtool.actiondb import read_durations
    from buildtool.cache import LAYOUT

    return read_durations(os.path.join(cache_dir, LAYOUT), labels)
