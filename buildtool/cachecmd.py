"""Cache command: ``buildtool cache gc [--max-size SIZE]`` and ``buildtool cache stats``.

Parsing and printing only; the work is in cache_gc.py.  Works outside a workspace too: the
cache dir and ``max_size`` then come from the flag, the environment and the user config.
"""

from __future__ import annotations

import argparse
import os
import sys

from buildtool.errors import BuildtoolError, UserError

TYPE_CHECKING = False  # cli.py registers this parser on every start: the work is imported on use
if TYPE_CHECKING:
    from buildtool.config import Config


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = sub.add_parser("cache", help="trim the shared cache or show its statistics")
    csub = c.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    g = csub.add_parser("gc", help="evict least-recently-used cache entries down to a size")
    g.add_argument("--max-size", metavar="SIZE",
                   help="e.g. 500M, 2G (default: the max_size setting; without one, only garbage is removed)")
    g.add_argument("--cache-dir", help="cache directory (env BUILDTOOL_CACHE_DIR)")
    s = csub.add_parser("stats", help="entries, bytes and the hit rate of recent builds")
    s.add_argument("--cache-dir", help="cache directory (env BUILDTOOL_CACHE_DIR)")


def _config(args: argparse.Namespace) -> Config:
    from buildtool.config import load_config
    from buildtool.workspace import find_workspace

    try:
        root = find_workspace(args.directory).root
    except UserError as e:
        try:
            root = os.path.abspath(args.directory)  # no workspace: user config and env only
        except FileNotFoundError:  # the working directory was deleted: exit 2, said as build says it
            raise e from None
        return load_config(root, {"cache_dir": args.cache_dir}, workspace=False)
    return load_config(root, {"cache_dir": args.cache_dir})


def run_command(args: argparse.Namespace) -> int:
    cfg = _config(args)
    try:
        return _run(args, cfg)
    except BrokenPipeError:
        raise  # (the reader of the report went away: 141, as for every listing, cli.main)
    except OSError as e:  # (ActionDBError too: an unreadable database stops GC, said in one line)
        text = e.strerror or str(e)
        where = f": {e.filename}" if e.filename and str(e.filename) not in text else ""
        raise BuildtoolError(f"cache {args.cache_command}: {text}{where}") from None


def _run(args: argparse.Namespace, cfg: Config) -> int:
    from buildtool import cache_gc

    if os.path.exists(cfg.cache_dir) and not os.path.isdir(cfg.cache_dir):  # (it read as an empty cache)
        raise UserError(f"the cache dir {cfg.cache_dir} is not a directory")
    from buildtool.cache import LAYOUT

    layout = os.path.join(cfg.cache_dir, LAYOUT)
    if not os.path.isdir(layout):  # (a mistyped --cache-dir read as an empty cache)
        print(f"buildtool: note: there is no cache at {cfg.cache_dir} (no build has used it)", file=sys.stderr)
    elif not os.access(layout, os.R_OK | os.X_OK):  # (another user's, made under umask 077: it read as empty)
        raise UserError(f"cannot read the cache {layout}: it is not readable to this user (its mode is "
                        f"{os.stat(layout).st_mode & 0o7777:o}, its owner uid {os.stat(layout).st_uid})")

    if args.cache_command == "stats":
        print(cache_gc.stats_report(cfg.cache_dir, cfg.max_size))
        return 0
    limit = cfg.max_size
    if args.max_size is not None:
        try:
            limit = cache_gc.parse_size(args.max_size)
        except ValueError:
            msg = f"--max-size must be a size such as 500M, 2G or a number of bytes (got {args.max_size!r})"
            raise UserError(msg) from None
    def waiting() -> None:
        print(f"cache gc: waiting for the builds storing into {cfg.cache_dir} to finish (at most 60 s)",
              file=sys.stderr, flush=True)

    res = cache_gc.gc(cfg.cache_dir, limit, waiting=waiting)
    if res is None:
        raise BuildtoolError(f"the cache {cfg.cache_dir} stayed busy (builds storing results); try again")
    print(
        f"cache gc: {cache_gc.human(res.before)} -> {cache_gc.human(res.after)}; evicted {res.entries_evicted} "
        f"entries, deleted {res.blobs_deleted} blobs ({res.garbage_blobs} unreferenced), {res.tmp_deleted} temp files"
        + (f"; the database gave back {cache_gc.human(res.db_shrunk)}" if res.db_shrunk else ""),
        file=sys.stdout,
    )
    if res.blobs_kept:  # (it said "36.5 MiB -> 0 B" and exit 0 with every blob in place)
        print(f"buildtool: warning: {res.blobs_kept} blob(s) could not be deleted (first: {res.undeletable}); "
              "they are still counted in the cache's size", file=sys.stderr)
        if not res.entries_kept:
            return 1
    if res.entries_kept:  # (it said "evicted 0 entries" and exit 0 on a full disk)
        why = f" ({res.db_refused})" if res.db_refused else " (a full disk?)"
        gone = ", their blobs deleted (each a miss)" if res.blobs_deleted else ""
        print(f"buildtool: warning: the cache's database could not be changed{why}: {res.entries_kept} "
              f"entries chosen for eviction stay{gone}; run cache gc again once it can be written", file=sys.stderr)
        return 1
    return 0
