"""Worker command: the ``buildtool worker`` argument parser and entry point (docs/remote.md).

Kept apart from worker.py so building the CLI parser never imports gRPC.
"""

from __future__ import annotations

import argparse
import os

TYPE_CHECKING = False  # cli.py registers this parser on every start: the rest is imported on use
if TYPE_CHECKING:
    from typing import Any


def add_parser(sub: Any) -> None:
    from buildtool.config import integer

    w = sub.add_parser("worker", help="serve a Remote Workers API server (BuildGrid) as a build worker")
    w.add_argument("--server", required=True, metavar="URL", help="grpc(s)://HOST:PORT of the server")
    w.add_argument("--instance", default="", metavar="NAME", help="REAPI instance name (default empty)")
    w.add_argument("--capacity", type=integer, default=1, metavar="N", help="actions run at the same time (default 1)")
    w.add_argument("--work-dir", metavar="DIR", help="where actions are staged (default: a new temp dir)")
    w.add_argument("--remote-header", action="append", default=[], metavar="KEY=VALUE",
                   help="header sent with every request, e.g. an auth token (repeatable)")
    w.add_argument("--remote-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="deadline of one CAS call (default 60)")


def run_command(args: argparse.Namespace) -> int:
    from buildtool.errors import UserError
    from buildtool.remote.options import check_instance, parse_endpoint, parse_headers

    try:
        import grpc  # noqa: F401
    except ImportError as e:
        raise UserError(f"buildtool worker needs the 'remote' extra (pip install 'buildtool[remote]'): {e}") from None

    if args.capacity < 1:
        raise UserError(f"--capacity must be at least 1 (got {args.capacity})")
    from buildtool.remote.options import MAX_REMOTE_TIMEOUT_S

    if not 0 < args.remote_timeout < MAX_REMOTE_TIMEOUT_S:  # (nan too: as build's --remote-timeout)
        raise UserError(f"--remote-timeout must be a positive number of seconds below a year, "
                        f"{MAX_REMOTE_TIMEOUT_S:.0f} (got {args.remote_timeout})")
    try:
        parse_endpoint(args.server, "--server", grpc_only=True)
        headers = parse_headers(args.remote_header)
        check_instance(args.instance, "--instance")
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.work_dir is not None and os.path.lexists(args.work_dir) and not os.path.isdir(args.work_dir):
        # (each action's directory is made in it: every lease failed, as an internal error)
        raise UserError(f"--work-dir {args.work_dir} is not a directory (actions are staged in it)")
    from buildtool.remote.options import grpc_header_problem

    problem = grpc_header_problem(headers, "--remote-header")
    if problem is not None:
        raise UserError(problem)
    import signal
    import tempfile

    own_dir = args.work_dir is None
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="buildtool-worker-")
    from buildtool.atomic import remove_path
    from buildtool.remote.worker import Worker, log

    w = Worker(args.server, args.instance, args.capacity, os.path.abspath(work_dir), args.remote_timeout, headers)

    def on_signal(signum: int, _frame: Any) -> None:
        log(f"signal {signum}: stopping")
        w.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return w.serve()
    finally:
        if own_dir:
            remove_path(work_dir)
