"""No-op snapshot: the fast path that proves "nothing changed" with stats alone.

After a build in which every target succeeded, buildtool writes ``.buildtool/noop``: the
request, the environment variables that can change an action key or an evaluation, and
the stat data of every file the build depended on (BUILD.py files, imported workspace
modules, files read while evaluating, config files, sources, outputs, tools) and of every
directory whose listing mattered (package discovery, globs).  The next identical request
stats those paths; if all match, the build is a no-op without evaluating a single
BUILD.py.  Any difference — or a snapshot of another version — falls back to the full
build, which is always correct.  A snapshot is not written while any file is racily
clean (changed within the timestamp granularity of the snapshot), so a change in the
same clock tick can never hide.  Spec: docs/formats.md#no-op-snapshot
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Mapping

from buildtool.atomic import write_atomic

FORMAT_VERSION = 1
HEADER = f"# buildtool noop-snapshot v{FORMAT_VERSION}\n"
WINDOW_NS = 50_000_000
COARSE_WINDOW_NS = 2_000_000_000
ENV_PREFIXES = ("BUILDTOOL_",)
ENV_ALWAYS = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")


def _path(state_dir: str) -> str:
    return os.path.join(state_dir, "noop")


def _sig(root: str, rel: str) -> list[int] | None:
    try:
        st = os.stat(os.path.join(root, rel))
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def env_view(names: Iterable[str]) -> dict[str, str | None]:
    env = os.environ
    out: dict[str, str | None] = {n: env.get(n) for n in (*ENV_ALWAYS, *names)}
    for k, v in env.items():
        if k.startswith(ENV_PREFIXES):
            out[k] = v
    return out


def invalidate(state_dir: str) -> None:
    try:
        os.unlink(_path(state_dir))
    except IsADirectoryError:  # damaged state: remove it, or no snapshot could ever be written
        import shutil

        shutil.rmtree(_path(state_dir), ignore_errors=True)
    except OSError:
        pass


def write(
    state_dir: str,
    root: str,
    request: Mapping[str, object],
    env_names: Iterable[str],
    files: Iterable[str],
    targets: int,
) -> bool:
    """Snapshot the given files (workspace-relative or absolute); False if any is racy."""
    now = time.time_ns()
    sigs: dict[str, list[int] | None] = {}
    for rel in files:
        if rel in sigs:
            continue
        s = _sig(root, rel)
        if s is not None:
            newest = max(s[1], s[3])
            coarse = s[1] % 1_000_000_000 == 0 and s[3] % 1_000_000_000 == 0
            if newest + (COARSE_WINDOW_NS if coarse else WINDOW_NS) > now:
                invalidate(state_dir)
                return False
        sigs[rel] = s
    body = {"request": request, "env": env_view(env_names), "targets": targets, "files": sigs}
    path = _path(state_dir)
    try:
        text = HEADER + json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        write_atomic(path, text, errors="surrogateescape")
    except OSError:
        return False
    return True


def check(state_dir: str, root: str, request: Mapping[str, object]) -> int | None:
    """The number of targets if the snapshot proves this request is a no-op, else None."""
    try:
        with open(_path(state_dir), encoding="utf-8", errors="surrogateescape") as f:
            head = f.readline()
            if head != HEADER:
                raise ValueError("header")
            body = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else "damaged or of another version"
        print(f"buildtool: warning: no-op snapshot unusable ({why}); discarding it", file=sys.stderr)
        return None
    try:
        if body["request"] != json.loads(json.dumps(request)):
            return None
        env = body["env"]
        names = [k for k in env if not k.startswith(ENV_PREFIXES)]
        if env_view(names) != env:
            return None
        join = os.path.join
        stat = os.stat
        for rel, s in body["files"].items():
            try:
                st = stat(join(root, rel))
            except OSError:
                if s is not None:
                    return None
                continue
            if s is None or s[0] != st.st_size or s[1] != st.st_mtime_ns or s[2] != st.st_ino or s[3] != st.st_ctime_ns:
                return None
        return int(body["targets"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def request_of(mode: str, patterns: list[str], cwd_pkg: str, action_env: list[str]) -> dict[str, object]:
    from buildtool import __version__

    return {"mode": mode, "patterns": list(patterns), "cwd": cwd_pkg, "action_env": list(action_env),
            "version": __version__}


def try_noop(start_dir: str, mode: str, patterns: list[str], action_env: list[str]) -> tuple[int, float] | None:
    """(targets, seconds) if the snapshot proves a no-op; None means: do the full build."""
    t0 = time.monotonic()
    from buildtool.errors import UserError
    from buildtool.lock import WorkspaceLock
    from buildtool.workspace import find_workspace

    try:
        ws = find_workspace(start_dir)
    except UserError:
        return None  # the full path reports it
    if not os.path.exists(_path(ws.state_dir)):
        return None
    lock = WorkspaceLock(ws.state_dir)
    try:
        lock.acquire(False, lambda _msg: None)
    except Exception:
        return None  # busy: the full path waits with a message
    try:
        n = check(ws.state_dir, ws.root, request_of(mode, patterns, ws.cwd_pkg_dir, action_env))
    finally:
        lock.release()
    return None if n is None else (n, time.monotonic() - t0)
