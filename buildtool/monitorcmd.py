"""Monitor command: ``buildtool monitor start|stop|status`` (parsing and printing only;
the client is monitor.py, the daemon monitord.py, the contract docs/monitor.md)."""

from __future__ import annotations

import argparse

from buildtool.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    m = sub.add_parser("monitor", help="a background file monitor that makes no-op builds constant-time "
                       "(docs/monitor.md)")
    msub = m.add_subparsers(dest="monitor_command", metavar="ACTION", required=True)
    s = msub.add_parser("start", help="start this workspace's file monitor (no-op if one runs)")
    s.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                   help="exit after this long without a request (default 10800: 3 hours)")
    msub.add_parser("stop", help="stop this workspace's file monitor")
    msub.add_parser("status", help="whether a file monitor runs here, and what it watches")


def run_command(args: argparse.Namespace) -> int:
    from buildtool import monitor
    from buildtool.workspace import find_workspace

    ws = find_workspace(args.directory)
    if args.monitor_command == "start":
        idle = monitor.IDLE_EXIT_S if args.idle_exit is None else args.idle_exit
        if not idle > 0:  # (NaN too)
            raise UserError(f"--idle-exit must be a positive number of seconds (got {args.idle_exit})")
        ws.ensure_state_dir()  # (a .buildtool that is a link: exit 2 naming it, before anything is touched there)
        info = monitor.start(ws.root, ws.state_dir, idle)
        verb = "already running" if info.get("already") else "started"
        print(f"monitor {verb}: pid {info['pid']}, watching {info['directories']} directories of {info['root']}")
        return 0
    info = monitor.status(ws.state_dir)
    # A socket and lock linked by `cp -al`: the original's monitor, not ours (also when it
    # does not answer: its command line names its workspace)
    foreign = info.get("root") != ws.root if info is not None else \
        monitor.holder(ws.state_dir) != monitor.holder(ws.state_dir, ws.root)
    if foreign:
        info = None
    if args.monitor_command == "stop":
        # (one that did not answer the status request above, 2 s: the stop request is left
        # for it to read when it runs again, not waited for another 2 s)
        silent = info is None and not foreign and monitor.holder(ws.state_dir) is not None
        if not foreign and monitor.stop(ws.state_dir, 0.05 if silent else 2.0):
            import time

            deadline = time.monotonic() + 5.0  # until it has exited, as systemctl stop waits (status agrees then)
            while (pid := monitor.holder(ws.state_dir)) is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            print("monitor stopped" if pid is None else f"monitor stopping: pid {pid} has not exited after 5 s")
        elif not foreign and (pid := monitor.holder(ws.state_dir)) is not None:
            print(f"the monitor (pid {pid}) did not answer (stopped with SIGSTOP?); it stops when it runs again")
        else:
            print("no monitor was running")
        return 0
    if info is None:
        pid = None if foreign else monitor.holder(ws.state_dir)
        if pid is not None:  # it holds the workspace but does not answer: as `stop` and `start` see it
            print(f"monitor: pid {pid} holds {ws.root} but did not answer within 2 s (stopped with SIGSTOP?); "
                  "no-op builds check every file by stat meanwhile")
            return 1
        print(f"no monitor runs for {ws.root}")
        return 3
    files = f" and {info['files']} hard-linked files" if info.get("files") else ""
    print(f"monitor: pid {info['pid']}, watching {info['directories']} directories{files} of {info['root']}")
    print(f"  generation {info.get('generation')} (events counted), {info.get('overflows', 0)} queue overflows, "
          f"vouched for {info.get('vouched', 0)} no-op builds")  # (.get: an older monitor's fields)
    if info.get("protocol") != monitor.PROTOCOL:  # (one an older buildtool started: no build asks it)
        print(f"  protocol {info.get('protocol', 1)}, not this buildtool's {monitor.PROTOCOL}: unused (every no-op "
              "is checked by stat); `buildtool monitor start` replaces it")
    elif not monitor.same_install(info):
        print("  started by another buildtool's code (upgraded since): unused (every no-op is "
              "checked by stat); `buildtool monitor start` replaces it")
    elif info.get("unsure"):
        print(f"  every no-op is checked by stat: {info['unsure']}")
    return 0
