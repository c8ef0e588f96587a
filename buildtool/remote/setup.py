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

    def finish(self, out: IO[str]) -> None:
        for layer in self.layers:
            line = layer.summary()
            if line:
                print(line, file=out, flush=True)
            layer.close()


def attach(runner: Any, cfg: Any, root: str, cache: Any, state: str, warn: Callable[[str], None]) -> RemoteSession:
    opt = from_config(cfg)
    layers: list[Any] = []
    if opt.cache is not None:
        if opt.cache.is_grpc and not _have_grpc(warn):
            return RemoteSession([])
        from buildtool.remote.cache_layer import RemoteCache

        runner.remote = RemoteCache(opt.cache, opt, root, cache, os.path.join(state, "tmp", "remote"), warn)
        layers.append(runner.remote)
    return RemoteSession(layers)


def _have_grpc(warn: Callable[[str], None]) -> bool:
    try:
        import google.protobuf  # noqa: F401
        import grpc  # noqa: F401
    except ImportError:
        warn("a grpc:// remote needs the 'remote' extra (pip install 'buildtool[remote]'); building locally")
        return False
    return True
