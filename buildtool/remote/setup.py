"""Remote setup: turns the remote_* config into the runner's remote layers, and reports
them in the build summary.  Trouble here never fails a build: it warns and builds locally.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, Any

from buildtool.remote.options import from_config


class RemoteSession:
    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers

    def finish(self, out: IO[str], events: Any = None) -> None:
        for layer in self.layers:
            if events is not None:
                events.remote(layer.totals())
            line = layer.summary()
            if line:
                print(line, file=out, flush=True)
            layer.close()


def attach(runner: Any, cfg: Any, root: str, cache: Any, state: str, warn: Callable[[str], None]) -> RemoteSession:
    opt = from_config(cfg)
    layers: list[Any] = []
    if opt.cache is not None and _have_deps(opt.cache.is_grpc, warn):
        from buildtool.remote.cache_layer import RemoteCache

        runner.remote = RemoteCache(opt.cache, opt, root, cache, os.path.join(state, "tmp", "remote"), warn)
        layers.append(runner.remote)
    if opt.executor is not None and _have_deps(True, warn):
        from buildtool.remote.exec_layer import RemoteExecutor

        runner.remote_exec = RemoteExecutor(opt.executor, opt, root, os.path.join(state, "tmp", "remote-exec"), warn)
        layers.append(runner.remote_exec)
    return RemoteSession(layers)


def check_download(cfg: Any, warn: Callable[[str], None], typed_jobs: bool = False) -> None:
    """--remote-download, or --remote-jobs given on the command line (``typed_jobs``; a
    config's may be for an executor that CI sets), without an executor: said, as each does
    nothing (they were ignored without a word)."""
    download = getattr(cfg, "remote_download", "all")
    if download != "all" and not cfg.remote_executor:
        warn(f"--remote-download {download} is for remote execution (outputs left in the executor's CAS); "
             "without --remote-executor every output is built or fetched here as usual")
    if download != "all" and cfg.remote_executor and cfg.remote_cache \
            and not _same_server(cfg.remote_cache, cfg.remote_executor):
        from buildtool.config import in_ci

        if cfg.remote_upload if cfg.remote_upload is not None else in_ci():
            which = "" if download == "minimal" else " (all but the requested targets')"
            warn(f"--remote-download {download}: the outputs left in the executor's CAS{which} are not uploaded "
                 f"to the remote cache {cfg.remote_cache} (they are not here to send), so it gets none of those "
                 "results; give its readers the executor's endpoint as their cache, or use --remote-download all")
    jobs = getattr(cfg, "remote_jobs", None)
    if typed_jobs and jobs is not None and not cfg.remote_executor:
        warn(f"--remote-jobs {jobs} is for remote execution (actions running at once on the executor); "
             "without --remote-executor -j alone sets how many commands run here")


def _same_server(a: str, b: str) -> bool:
    """Whether two remote URLs name one gRPC server (``localhost`` and ``127.0.0.1`` alike),
    as far as can be told without asking it."""
    from buildtool.remote.options import parse_endpoint

    try:
        x, y = parse_endpoint(a), parse_endpoint(b)
    except ValueError:
        return a.rstrip("/") == b.rstrip("/")
    local = {"localhost", "127.0.0.1"}  # (not ::1: a server may listen on IPv4 alone)

    def host(h: str) -> str:
        return "localhost" if h.lower() in local else h.lower()

    return x.scheme == y.scheme and host(x.host) == host(y.host) and x.port == y.port


def _have_deps(need_grpc: bool, warn: Callable[[str], None]) -> bool:
    """The remote cache needs protobuf (ActionResult messages, also on HTTP) and, for
    grpc://, grpcio: both come with the 'remote' extra."""
    try:
        import google.protobuf  # noqa: F401

        if need_grpc:
            import grpc  # noqa: F401
    except ImportError as e:
        warn(f"remote caching/execution needs the 'remote' extra (pip install 'buildtool[remote]'): {e}; "
             "building locally")
        return False
    return True
