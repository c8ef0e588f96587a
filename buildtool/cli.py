"""CLI: parses arguments, calls the session, prints, and maps errors to exit codes.

Heavy modules are imported only after parsing so ``buildtool --version`` stays fast.
"""

from __future__ import annotations

import os
import sys

from buildtool import __version__

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing alone costs ~15 ms of start-up
if TYPE_CHECKING:  # argparse is imported only when arguments are parsed: --version stays fast
    import argparse
    from typing import Any, NoReturn


def _add_build_flags(p: argparse.ArgumentParser, watch: bool = False) -> None:
    import argparse  # (imported already by parser(), its only caller)

    from buildtool.config import integer

    p.add_argument("patterns", nargs="*", metavar="PATTERN", help="targets or patterns (default //...)")
    p.add_argument("-j", "--jobs", type=integer,
                   help="parallel jobs (default: the jobs setting, BUILDTOOL_JOBS, else usable CPUs)")
    p.add_argument("-k", "--keep-going", action="store_true", default=None,
                   help="keep building what does not depend on a failure")
    p.add_argument("--no-keep-going", dest="keep_going", action="store_false",
                   help="stop at the first failure, whatever keep_going the config or environment sets")
    p.add_argument("-n", "--dry-run", action="store_true",  # (watch takes it only to say why not)
                   help=argparse.SUPPRESS if watch else "show what would run, and why; run nothing")
    p.add_argument("-B", "--always-make", action="store_true",  # (watch takes it only to say why not)
                   help=argparse.SUPPRESS if watch else
                   "run every target's command, up to date or cached (make -B); the results are recorded and "
                   "stored in the caches as any run's")
    p.add_argument("--cache-dir", help="shared cache directory (default $XDG_CACHE_HOME/buildtool, else "
                                       "~/.cache/buildtool; env BUILDTOOL_CACHE_DIR)")
    p.add_argument("--explain", action="store_true", help="print why each target ran or not")
    p.add_argument("-w", "--print-directory", action="store_true",
                   help="around a command's output, print the directory it ran in (make -w), for editors that "
                        "jump to the files compiler messages name")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print the command of each target that runs" + ("" if watch else " (or, with -n, would run)")
                   + ", as ninja -v")
    p.add_argument("--events", metavar="FILE", help="write JSON Lines build events to FILE")
    p.add_argument("--profile", metavar="FILE", help="write a Chrome trace (Perfetto, chrome://tracing) to FILE")
    p.add_argument("-l", "--load-average", type=float, metavar="LOAD", dest="load",
                   help="start no new work while the load average exceeds LOAD (one job always runs)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colored output (auto: on a terminal, not in CI, unless NO_COLOR is set)")
    p.add_argument("--replay-output", action="store_true",
                   help="print the captured stdout/stderr of targets restored from the cache")
    p.add_argument("--no-wait", action="store_true", help="fail instead of waiting for another buildtool")
    p.add_argument("--action-env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="pass an environment variable to every action (part of its key)")
    from buildtool.remote.options import add_flags as add_remote_flags

    add_remote_flags(p)


def _add_watch_flags(p: argparse.ArgumentParser, with_switch: bool) -> None:
    if with_switch:
        p.add_argument("--watch", action="store_true", help="keep running: rebuild when a relevant file changes")
    p.add_argument("--poll", action="store_true", help="watch mode: poll for changes instead of inotify/FSEvents")
    p.add_argument("--debounce-ms", type=float, default=None, metavar="MS",
                   help="watch mode: quiet period before a rebuild (default 40)")


def parser() -> argparse.ArgumentParser:
    import argparse

    class Parser(argparse.ArgumentParser):
        """No abbreviated long options (argparse's default took `--no-cache` for
        `--no-cache-tests`, as Bazel and Ninja do not): the command's parsers are its kind."""

        def __init__(self, *a: Any, **k: Any) -> None:
            k.setdefault("allow_abbrev", False)
            super().__init__(*a, **k)

    ap = Parser(prog="buildtool", description="Build targets declared in BUILD.py files.")
    ap.add_argument("--version", action="version", version=f"buildtool {__version__}")
    ap.add_argument("-C", dest="directory", action="append", metavar="DIR",
                    help="run as if started in DIR (repeated: each relative to the one before, as make -C)")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    exits = ("Exit status: 0 success; 1 a command failed (also: --no-wait found the workspace busy, a report or "
             "output could not be written); 2 an invalid request, BUILD.py or configuration (nothing ran); "
             "129/130/131/143 interrupted (SIGHUP/Ctrl-C/SIGQUIT/SIGTERM). All of them: docs/user-guide.md#exit-codes.")
    b = sub.add_parser("build", help="build targets (never runs tests)", epilog=exits,
                       description="Build the targets the patterns name (default //...) and what they need; "
                                   "what is up to date is skipped, what the cache has is restored.")
    _add_build_flags(b)
    _add_watch_flags(b, True)
    t = sub.add_parser("test", help="build what tests need and run the test targets",
                       epilog=exits.replace("1 a command failed", "1 a command or a test failed; 4 no test targets"),
                       description="Build what the named tests need, then run them (a pass is cached: it is "
                                   "not run again until something it depends on changes).")
    _add_build_flags(t)
    _add_watch_flags(t, True)
    t.add_argument("--no-cache-tests", action="store_true", help="rerun tests even if they passed before")
    t.add_argument("--test-output", choices=("errors", "all", "none"), default="errors",
                   help="print the output of failing tests (errors, the default), of all tests, or of none")
    t.add_argument("--junit", metavar="FILE", help="write a JUnit XML report of the tests to FILE")
    w = sub.add_parser("watch", help="build, then rebuild whenever a relevant file changes (docs/watch.md)",
                       description="Build the patterns (default //...), then again each time a file they read, "
                                   "a BUILD.py or buildtool.toml is saved, until Ctrl-C (build --watch, test "
                                   "--watch: the same).",
                       epilog="Exit status: 0 stopped with Ctrl-C; 2 an invalid request at the start; 129/131/143 "
                              "SIGHUP/SIGQUIT/SIGTERM. docs/watch.md.")
    _add_build_flags(w, watch=True)
    _add_watch_flags(w, False)
    c = sub.add_parser("clean", help="remove this workspace's outputs and state (never the shared cache)",
                       description="Remove the outputs earlier builds wrote (an output edited since is kept, "
                                   "said so) and the workspace's state in .buildtool/; the shared cache is left "
                                   "as it is, so the next build restores from it.  With patterns: only the "
                                   "outputs of those targets and of everything they depend on (ninja -t clean "
                                   "TARGETS); the state stays.")
    c.add_argument("patterns", nargs="*", metavar="PATTERN",
                   help="labels or patterns (//pkg:name, //pkg:all, //pkg/...) whose outputs to remove")
    from buildtool.insight import add_parsers as add_insight_parsers

    add_insight_parsers(sub)
    from buildtool.cachecmd import add_parser as add_cache_parser

    add_cache_parser(sub)
    from buildtool.monitorcmd import add_parser as add_monitor_parser

    add_monitor_parser(sub)
    from buildtool.runcmd import add_parser as add_run_parser

    add_run_parser(sub)
    from buildtool.remote.workercmd import add_parser as add_worker_parser

    add_worker_parser(sub)
    ap.commands = sub.choices  # type: ignore[attr-defined]  # (_usage_error: a command's own usage)
    return ap


# What ``parser().parse_args(argv)`` gives a plain build besides its directory, patterns,
# -j, --cache-dir and --action-env (tests/test_cli.py keeps the two in step).
_PLAIN_BUILD_DEFAULTS: dict[str, object] = {
    "command": "build", "keep_going": None, "dry_run": False, "always_make": False, "explain": False, "events": None,
    "profile": None, "load": None, "color": "auto", "replay_output": False, "no_wait": False, "verbose": False,
    "print_directory": False,
    "remote_cache": None, "remote_executor": None, "remote_instance": None, "remote_header": None,
    "remote_timeout": None, "remote_jobs": None, "remote_download": None, "remote_upload": None,
    "watch": False, "poll": False, "debounce_ms": None,
}


def _plain_build(argv: list[str]) -> argparse.Namespace | None:
    """The parsed arguments (an object with the attributes argparse gives) if ``argv``
    is ``[-C DIR] build [PATTERN...]`` with at most ``-j N`` and ``--cache-dir DIR`` besides
    (neither changes what the no-op snapshot proves), else None.  Such a build is checked
    against the snapshot, and run, without importing argparse and building the parser
    (~20 ms: a fifth of a 10,000-target no-op, a tenth of a one-file change); anything
    else, including every mistake, goes to the real parser."""
    directory, jobs, cache_dir = ".", None, None
    patterns: list[str] = []
    seen_build, after_patterns, i = False, False, 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        if not seen_build and a == "-C" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            directory, i = argv[i + 1] if directory == "." else os.path.join(directory, argv[i + 1]), i + 2
            continue
        if not seen_build and a == "build":
            seen_build = True
        elif seen_build and name in ("-j", "--jobs", "--cache-dir"):
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                    return None  # argparse takes the next word for an option
                i, value = i + 1, argv[i + 1]
            if name == "--cache-dir":
                if not value:
                    return None  # an error, said by _run
                cache_dir = value
            elif value.isascii() and value.isdigit() and 1 <= int(value) <= 4096:  # (MAX_JOBS; else: the full path)
                jobs = int(value)
            else:
                return None
            after_patterns = bool(patterns)
        elif seen_build and a.startswith("-j") and a[2:].isascii() and a[2:].isdigit() and 1 <= int(a[2:]) <= 4096:
            jobs = int(a[2:])
            after_patterns = bool(patterns)
        elif not seen_build or after_patterns or a.startswith("-") or not a:
            return None  # (patterns on both sides of an option: argparse refuses the second run)
        else:
            patterns.append(a)
        i += 1
    if not seen_build:
        return None
    if _in_a_state_dir(cache_dir):
        return None
    return _Args(  # type: ignore[return-value]  # (argparse's Namespace is no more than this)
        directory=directory, patterns=patterns, jobs=jobs, cache_dir=cache_dir, action_env=[], **_PLAIN_BUILD_DEFAULTS)


def _in_a_state_dir(cache_dir: str | None) -> bool:
    """Whether ``--cache-dir`` names a place in a ``.buildtool`` directory: the config's
    check refuses it (exit 2), which a no-op answered from the snapshot never reaches."""
    return cache_dir is not None and ".buildtool" in cache_dir.split("/")


class _Args:
    """Parsed arguments as attributes, as argparse's ``Namespace`` holds them (not
    ``types.SimpleNamespace``: importing ``types`` is ~0.3 ms of a no-op build)."""

    def __init__(self, **values: object) -> None:
        self.__dict__.update(values)


def _streams_to_devnull() -> None:
    """Give a closed stdout/stderr /dev/null (which takes descriptor 1 or 2 again, so the
    commands too inherit a valid one), as Make and Ninja keep going with output dropped."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            stream = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
            os.set_inheritable(stream.fileno(), True)  # (Python opens it close-on-exec: a command got none)
            setattr(sys, name, stream)


def run() -> None:
    """The ``buildtool`` command: ``main()``, then an exit that skips tearing the interpreter
    down.  Freeing the objects of a large graph one by one at exit took 20-40 ms, more than
    some whole builds (mypy exits the same way, for the same reason).  Every file is closed
    by then; only the standard streams are still to flush."""
    try:
        code = main()
    except KeyboardInterrupt as e:  # Ctrl-C while starting up (imports, parsing, the no-op check)
        code = _interrupted(e)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe: nothing more can be said anyway
        pass
    except KeyboardInterrupt:  # (a signal that came before the handlers were set to ignore them)
        pass
    if _observed():  # (python -m cProfile/coverage ... $(which buildtool): their report is written
        raise SystemExit(code)  # at the normal exit)
    _EXIT(code)


def _observed() -> bool:
    """Whether a profiler, tracer or coverage tool watches this process (3.12's cProfile
    and coverage use sys.monitoring, not sys.setprofile)."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    mon = getattr(sys, "monitoring", None)
    return mon is not None and any(mon.get_tool(i) is not None for i in range(6))  # (every tool id)


_EXIT = os._exit  # (as imported: a BUILD.py evaluation cut short may have left os._exit guarded)


def _state_dir(args: Any) -> str | None:
    """The state dir of the workspace ``args`` name (-C), if there is one."""
    from buildtool.errors import UserError
    from buildtool.workspace import find_workspace

    d = args.directory  # (a list of -C values until _dispatch joins them)
    if isinstance(d, list):
        d = os.path.join(*d) if d else "."
    try:
        return find_workspace(d or ".").state_dir
    except (UserError, OSError):
        return None


def _interrupted(e: KeyboardInterrupt) -> int:
    """Name the BUILD.py that Ctrl-C (or SIGTERM, SIGHUP) stopped, if one was running (an
    endless loop in one otherwise ended the command without a word), else the signal; the
    exit code, 128 + the signal."""
    _leaving()
    signum = getattr(e, "signum", 2)  # (a plain KeyboardInterrupt: SIGINT)
    where = getattr(e, "where", None)
    if where:
        by = "" if signum == 2 else f" by signal {signum}"
        _last_word(f"buildtool: interrupted{by} while evaluating {where}")
    else:  # (as a build interrupted while its commands ran says it; also SIGINT: a CI cancel shows no ^C)
        _last_word(f"buildtool: error: interrupted by signal {signum}")
    return 128 + signum


def _last_word(msg: str) -> None:
    """Print the command's closing message to stderr, if stderr can still take it: a
    terminal closed, or ``| tee log`` ended by the same Ctrl-C, must not turn the exit code
    into a write error's."""
    try:
        print(msg, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _on_termination(signum: int, frame: Any) -> None:
    from buildtool.errors import Terminated

    _leaving(signum)
    raise Terminated(signum)


def _on_interrupt(signum: int, frame: Any) -> None:
    _leaving(signum)
    raise KeyboardInterrupt


def _leaving(signum: int | None = None) -> None:
    """The command is on its way out: a second signal (Ctrl-C twice, a supervisor repeating
    SIGTERM) must not cut the ``finally`` blocks that release the locks, nor the exit; it is
    only counted, and a third quits at once (errors.count_stop_signal)."""
    import _signal

    from buildtool.errors import count_stop_signal

    if signum is not None:  # (None: the way out of an interrupt a handler of the session's raised)
        count_stop_signal(signum)
    for s in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT):
        try:
            if _signal.getsignal(s) != _signal.SIG_IGN:  # (nohup's SIGHUP stays ignored)
                _signal.signal(s, _counted)
        except (ValueError, OSError):  # (not the main thread)
            pass


def _counted(signum: int, frame: Any) -> None:
    from buildtool.errors import count_stop_signal

    count_stop_signal(signum)


def _leave_on_termination() -> None:
    """SIGTERM, SIGHUP (a terminal closed, an ssh connection dropped) and SIGQUIT (Ctrl-\\,
    fatal to Make too) end the command as
    Ctrl-C does: through its ``finally`` blocks, which release the locks and remove the lock
    file in /tmp, with a word and exit 128 + the signal, rather than at once by their
    default action.  While a build's commands run and its reports are written, the
    session's own handlers take over (session.py).  A SIGHUP ignored from the start
    (``nohup buildtool build``) stays ignored, as does a SIGTERM ignored from the start
    (``buildtool run`` hands it on ignored).  Ctrl-C raises KeyboardInterrupt as Python's
    own handler does, and like the others ignores any further signal on the way out.
    Through ``_signal``, not ``signal``: that one imports enum, ~2 ms of every no-op build."""
    import _signal

    for s in (_signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT):
        if _signal.getsignal(s) != _signal.SIG_IGN:
            _signal.signal(s, _on_termination)
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, _on_interrupt)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    for stream in (sys.stdout, sys.stderr):  # a console that cannot show a character: an escape, not a traceback
        enc = (getattr(stream, "encoding", None) or "utf-8").lower()
        if enc not in ("utf-8", "utf8") and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    if sys.stdout is None or sys.stderr is None:  # started with `>&-`: what would be said goes nowhere
        _streams_to_devnull()
    for fd in (1, 2):  # left non-blocking (a CI runner's pipe): Python would drop what EAGAIN refused
        try:
            if not os.get_blocking(fd):
                os.set_blocking(fd, True)
        except OSError:
            pass
    if argv == ["--version"]:  # before building the parser: stay fast
        print(f"buildtool {__version__}")
        return 0
    checked: Any = False  # False: not checked yet; None or a verdict: the snapshot's answer
    args = _plain_build(argv)
    if args is not None:
        _leave_on_termination()  # (the no-op check takes the lock)
        import gc

        gc.disable()  # a one-shot build: see Session.build for when it collects cycles
        from buildtool import noop

        _env_from_directory(args.directory)  # (before the snapshot's env view is compared)
        checked = noop.try_noop(args.directory, "build", args.patterns, [])
        if checked is not None and not checked[0].changed:
            return _nothing_changed(checked[0].targets, checked[1])
    else:
        try:
            args = _parse(argv)
        except SystemExit as e:
            if e.code == 2:  # refused: no report of an earlier run left to pass for this one's
                from buildtool.atomic import drop_stale_reports

                named = _reports_named(argv)
                drop_stale_reports(named, _state_dir(named))
            raise
        if not args.command:
            parser().print_help()
            return 2
        _env_from_directory(args.directory)
    from buildtool.errors import BuildtoolError

    try:
        return _dispatch(args, checked)
    except BuildtoolError as e:
        if e.exit_code == 1 and str(e) == "build failed":
            return 1
        _last_word(f"buildtool: error: {e}")
        if e.exit_code == 2:
            from buildtool.atomic import drop_stale_reports

            drop_stale_reports(args, _state_dir(args), getattr(e, "flags", ()))
        return e.exit_code
    except KeyboardInterrupt as e:  # (before the commands: the scheduler's is an Interrupted)
        code = _interrupted(e)  # (no further signal from here: _leaving)
        from buildtool.atomic import drop_stale_reports

        drop_stale_reports(args, _state_dir(args))  # (a CI step that uploads JUnit anyway: not the last green run's)
        return code
    except BrokenPipeError:  # the reader of our stdout went away (``buildtool graph | head``)
        return 141  # 128 + SIGPIPE, the status of a C program killed by the closed pipe
    except RuntimeError as e:
        if "can't start new thread" not in str(e):
            raise
        # (watch's file observers, a monitor's: threads it cannot do without)
        print(f"buildtool: error: could not start a thread ({e}): a limit on processes or threads "
              "(ulimit -u, a container's pids.max, systemd's TasksMax) was reached", file=sys.stderr)
        return 1
    except OSError as e:
        import errno

        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG):
            raise
        # A full disk or a failing device (``buildtool query > /dev/full``): say so, no traceback.
        where = f": {e.filename}" if e.filename else ""
        print(f"buildtool: error: {e.strerror}{where}", file=sys.stderr)
        return 1


def _reports_named(argv: list[str]) -> argparse.Namespace:
    """The report paths (--junit, --events, --profile) and -C directories of a command line
    that did not parse, read word by word (a mistyped flag must not leave the last run's
    JUnit file where the CI step that publishes it looks)."""
    import argparse

    found = argparse.Namespace(junit=None, events=None, profile=None, directory=[])
    words = iter(argv[:argv.index("--")] if "--" in argv else argv)
    for word in words:
        flag, eq, value = word.partition("=")
        if word.startswith("-C"):  # -C DIR, -CDIR
            found.directory.append(word[2:] or next(words, "."))
        elif flag in ("--junit", "--events", "--profile"):
            setattr(found, flag[2:], value if eq else next(words, None))
    if found.directory:  # (a relative report path is taken from -C DIR, as a build takes it)
        for name in ("junit", "events", "profile"):
            path = getattr(found, name)
            if path:
                setattr(found, name, os.path.join(*found.directory, path))
    return found


def _parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line.  ``run``'s program arguments are what follows the first
    ``--``, taken aside first: the build's own options may come after TARGET, as in
    ``bazel run //x -c opt -- args``."""
    p = parser()
    i = 0  # the command's position: after the global options
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        if argv[i] == "-C" and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            # (-C -dir: the next word is the directory, whatever it looks like, as make -C
            # and git -C take it; argparse took it for an option and said "expected one argument")
            argv = [*argv[:i], f"-C={argv[i + 1]}", *argv[i + 2:]]  # (-C=--: argparse drops a '--' value)
        i += 2 if argv[i] == "-C" else 1
    _misplaced_options(p, argv[:i], argv[i:])
    sub = getattr(p, "commands", {}).get(argv[i] if i < len(argv) else "")
    for k, a in enumerate(argv):  # (Ninja's -k N: the N was taken for a target; -k0: "ignored explicit argument")
        if sub is None or argv[i] not in ("build", "test", "watch") or k <= i or "--" in argv[:k]:
            continue
        n = argv[k + 1] if a in ("-k", "--keep-going") and k + 1 < len(argv) else a[2:] if a.startswith("-k") else ""
        if n.isdecimal():
            sub.error(f"-k takes no count: it keeps going past every failure (Ninja's -k 0); "
                      f"'{n}' would be taken for a target" if a in ("-k", "--keep-going") else
                      "-k takes no count: it keeps going past every failure (Ninja's -k 0); use -k")
    if i >= len(argv) or argv[i] != "run":
        args, unknown = p.parse_known_args(argv)
        # Patterns on both sides of an option (`build //:a -k //:b`): argparse takes the first
        # run of positionals only, and subparsers rule out parse_intermixed_args.
        if unknown and hasattr(args, "patterns") and not any(u.startswith("-") and u != "-" for u in unknown):
            args.patterns = [*args.patterns, *unknown]
        elif unknown:
            where = " (-C DIR goes before the command: buildtool -C DIR build ...)" \
                if any(u.startswith("-C") for u in unknown) else ""
            _usage_error(p, args, f"unrecognized arguments: {' '.join(unknown)}{where}")
        args.directory = _directory(args.directory)
        return args
    cut = argv.index("--") if "--" in argv else len(argv)
    args, unknown = p.parse_known_args(argv[:cut])
    if unknown:
        where = "-C DIR goes before the command: buildtool -C DIR run ..." if any(u.startswith("-C") for u in unknown) \
            else "the program's own arguments go after '--': buildtool run TARGET -- ARGS"
        _usage_error(p, args, f"unrecognized arguments: {' '.join(unknown)} ({where})")
    args.args = [*args.args, *argv[cut + 1:]]
    args.directory = _directory(args.directory)
    return args


def _directory(given: list[Any] | None) -> str:
    """The -C directories joined.  argparse gives ``[]`` for a value that is exactly
    ``--`` (``-C=--``, which ``-C --`` becomes): that is the directory named ``--``."""
    return os.path.join(*[d if isinstance(d, str) else "--" for d in given or ["."]])


def _misplaced_options(p: argparse.ArgumentParser, before: list[str], rest: list[str]) -> None:
    """A command's option given before the command (``buildtool -k build``, as Make and
    Ninja take them): exit 2 saying where it goes; argparse said "unrecognized arguments:
    -k" of an option ``build`` has, or took ``-j 4``'s 4 for the command."""
    commands = getattr(p, "commands", {})
    opts, k = [], 0
    while k < len(before):
        if before[k] == "-C":
            k += 2  # (and its DIR)
            continue
        if before[k] not in ("-h", "--help", "--version") and not before[k].startswith("-C"):
            opts.append(before[k])
        k += 1
    if not opts:
        return
    cmd = next((a for a in rest if a in commands), None)  # (-j 4 build: 4 comes first)
    if cmd is None:
        return  # (argparse says what it says: no command to point at)
    sub = commands[cmd]
    known = {o for action in sub._actions for o in action.option_strings}
    flag = opts[0].partition("=")[0]
    if flag in known or (len(flag) > 2 and flag[:2] in known and not flag.startswith("--")):  # (-j4)
        sub.error(f"{opts[0]} goes after the command: buildtool {cmd} {opts[0]} ... "
                  "(before it go only -C DIR, --help and --version)")


def _usage_error(p: argparse.ArgumentParser, args: argparse.Namespace, msg: str) -> NoReturn:
    """Exit 2 with ``msg`` under the usage of the command it concerns (``build``'s, not
    buildtool's), as argparse does for the errors it finds itself."""
    sub = getattr(p, "commands", {}).get(getattr(args, "command", None))
    (sub or p).error(msg)


def _nothing_changed(n: int, secs: float) -> int:
    """The no-op answer; a closed stdout loses the line, not the build's status."""
    try:  # (console.targets' plural: console is not imported on this path)
        print(f"OK: {n} target{'s' if n != 1 else ''}: {n} up_to_date in {secs:.2f}s (nothing changed)", flush=True)
    except OSError:  # a closed pipe, a full disk
        pass
    return 0


def _interruptible() -> bool:
    """SIGINT stops the command even if it was started with SIGINT ignored (``cmd &`` in a
    script): the build phase stops on it whatever it inherited (as Ninja does), so an
    evaluation stuck in a BUILD.py must too.  True if it was ignored (``run`` hands that
    on to the program it becomes)."""
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True


def _from_directory(args: argparse.Namespace) -> None:
    """``-C DIR``: relative report and cache paths given as flags are taken from DIR too,
    as if buildtool had been started there (make -C, git -C); ``~`` is the home directory."""
    here = os.path.normpath(args.directory) == "."
    for name in ("cache_dir", "events", "profile", "junit"):
        path = getattr(args, name, None)
        if not path:
            continue
        if path.startswith("~"):  # (--events=~/x reaches us unexpanded: no shell does it after '=')
            path = os.path.expanduser(path)
        if not here and not os.path.isabs(path):
            path = os.path.join(args.directory, path)
        setattr(args, name, path)


def _env_from_directory(directory: str) -> None:
    """``-C DIR``: a relative ``BUILDTOOL_CACHE_DIR`` is taken from DIR, as the flags are
    (once, before the no-op check compares the environment; the commands see it so too)."""
    env_dir = os.environ.get("BUILDTOOL_CACHE_DIR", "")
    if os.path.normpath(directory) != "." and env_dir and not env_dir.startswith("~") and not os.path.isabs(env_dir):
        os.environ["BUILDTOOL_CACHE_DIR"] = os.path.join(directory, env_dir)


def _dispatch(args: argparse.Namespace, checked: Any = False) -> int:
    _from_directory(args)
    if args.command not in ("monitor", "worker"):  # (those check their own flags and signals)
        _check_build_flags(args)  # before the no-op answer too: a bad flag is exit 2 either way
        args.sigint_ignored = _interruptible()
        _leave_on_termination()
    if args.command == "cache":
        from buildtool.cachecmd import run_command as run_cache_command

        rc = run_cache_command(args)
        sys.stdout.flush()  # (a report: a reader gone is 141, as for the listings)
        return rc
    if args.command == "monitor":
        from buildtool.monitorcmd import run_command as run_monitor_command

        return run_monitor_command(args)
    if args.command == "worker":
        from buildtool.remote.workercmd import run_command as run_worker_command

        return run_worker_command(args)
    prior = None  # what the no-op snapshot proves: nothing changed, or only these files
    if args.command == "build" and not (
        args.dry_run or getattr(args, "always_make", False) or args.explain or args.events or args.profile
        or getattr(args, "watch", False) or _in_a_state_dir(args.cache_dir)
    ):
        from buildtool import noop

        hit = checked if checked is not False else noop.try_noop(
            args.directory, args.command, args.patterns, args.action_env)
        if hit is not None:
            verdict, secs = hit
            if not verdict.changed:
                return _nothing_changed(verdict.targets, secs)
            prior = verdict
    try:
        return _run(args, prior)
    finally:
        if prior is not None:
            prior.lock.release()  # normally released by the build itself; this covers errors before it


def _check_build_flags(args: argparse.Namespace) -> None:
    """Refuse (exit 2), before anything is built, flag values a build would trip over later
    (whichever of them the command has: ``cache gc --cache-dir ''`` fell back to the
    default shared cache)."""
    from buildtool.config import MAX_JOBS, check_action_env
    from buildtool.errors import UserError

    jobs = getattr(args, "jobs", None)
    if jobs is not None and not 1 <= jobs <= MAX_JOBS:
        msg = f"-j must be from 1 to {MAX_JOBS} (got {jobs})"
        if jobs == 0:  # (Ninja's -j 0: as many as it likes)
            msg += f"; for no limit, as Ninja's -j 0, give -j {MAX_JOBS}"
        raise UserError(msg)
    load = getattr(args, "load", None)
    if load is not None and not load >= 0:  # (nan too)
        msg = f"-l must be a load average of 0 or more, 0 for no limit (got {load})"
        raise UserError(msg)
    debounce = getattr(args, "debounce_ms", None)
    if debounce is not None and not 0 <= debounce < float("inf"):
        msg = f"--debounce-ms must be a number of milliseconds, 0 or more (got {debounce})"
        raise UserError(msg)
    if getattr(args, "watch", True) is False and (getattr(args, "poll", False) or debounce is not None):
        flag = "--poll" if getattr(args, "poll", False) else "--debounce-ms"  # (it would change nothing)
        msg = f"{flag} is for watch mode: add --watch (buildtool {args.command} --watch {flag} ...)"
        raise UserError(msg)
    if getattr(args, "dry_run", False) and (args.command == "watch" or getattr(args, "watch", False)):
        msg = ("-n (a dry run) is not for watch mode: a watch rebuilds what each save changes, and a dry "
               "run builds nothing; run `buildtool build -n` after a change")
        raise UserError(msg)
    if getattr(args, "always_make", False) and (args.command == "watch" or getattr(args, "watch", False)):
        msg = ("-B (--always-make) is not for watch mode: each save would rerun every command; run "
               "`buildtool build -B` once, then watch")
        raise UserError(msg)
    cache_dir = getattr(args, "cache_dir", None)
    if cache_dir is not None and not cache_dir:
        msg = "--cache-dir must name a directory (got an empty string)"
        raise UserError(msg)
    check_action_env(getattr(args, "action_env", None) or [], "--action-env")
    if any(getattr(args, k, None) is not None for k in vars(args) if k.startswith("remote_")):
        from buildtool.remote.options import flags_of

        flags_of(args)  # the --remote-* values (their own module: no import for a plain build)
    named: dict[str, str] = {}
    for flag, path in (("--events", getattr(args, "events", None)), ("--profile", getattr(args, "profile", None)),
                       ("--junit", getattr(args, "junit", None))):
        if path is not None:
            problem = _unwritable(path, flag)
            if problem:
                msg = f"{flag} {path}: {problem}"
                raise UserError(msg)
            other = named.setdefault(os.path.realpath(path), flag)
            if other != flag:  # the second report would replace the first
                msg = f"{flag} {path}: {other} writes that file too; give each report its own file"
                raise UserError(msg)


def _unwritable(path: str, flag: str) -> str | None:
    """Why the report of ``flag`` cannot be written at ``path``, or None: checked before
    anything runs (exit 2), where a --junit or --profile file was found unwritable only
    once the whole build was done.  Nothing is created or truncated here."""
    import stat

    if not path:
        return "the file name is empty"
    if os.path.isdir(path):
        return "is a directory; name a file"
    if path.endswith("/") or os.path.basename(path) in (".", ".."):  # (reports/ not there yet: a file
        example = {"--events": "events.jsonl", "--profile": "profile.json"}.get(flag, "junit.xml")  # named
        return f"names a directory; name a file (reports/{example})"  # reports was written)
    try:
        regular: bool | None = stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        regular = None  # nothing there yet (or a link to nothing yet): made
    # --junit and --profile replace a regular file, or make one, through a temp file beside
    # the file a link there names (atomic.write_report), in a directory that must take new
    # files (the temp file's name is cut to fit: atomic.temp_path).  --events writes into
    # the file itself.
    through_temp = flag != "--events" and regular is not False
    target = os.path.realpath(path) if through_temp else os.path.abspath(path)
    # Missing parent directories are created when the file is written (CI jobs name
    # ``reports/junit.xml`` in a fresh checkout); what must hold is that the nearest existing
    # ancestor is a writable directory, and that the names below it fit its file system.
    parent = os.path.dirname(target)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is not a directory"
    problem = _too_long(parent, target)
    if problem:
        return problem
    if regular is not None and not through_temp:
        return None if os.access(path, os.W_OK) else "not writable"
    where = parent if regular is None else os.path.dirname(target)  # (where the new file is made)
    return None if os.access(where, os.W_OK | os.X_OK) else f"{where} is not writable"


def _too_long(parent: str, target: str) -> str | None:
    """Why ``target``, a file to make below the existing directory ``parent``, has a name,
    or a directory on its way, or a path too long for the file system; or None."""
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
        path_max = os.pathconf(parent, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096  # (Linux's)
    for part in target[len(parent):].strip("/").split("/"):
        n = len(os.fsencode(part))
        if n > name_max:
            return f"the name {part[:20]}... is {n} bytes long, more than the {name_max} its file system allows"
    if len(os.fsencode(target)) >= path_max:
        return f"the path is longer than the {path_max - 1} bytes its file system allows"
    return None


LOST_REMOTE_RETRIES = 2  # builds again once remote outputs were lost (Bazel: remote cache eviction retries)


def _run(args: argparse.Namespace, prior: Any) -> int:
    from buildtool.session import BuildRequest, Session

    if args.command == "clean":
        if args.patterns:
            n, targets = Session(args.directory).clean_targets(args.patterns)
            print(f"removed {n} output{'' if n == 1 else 's'} of {targets} target{'' if targets == 1 else 's'}")
            return 0
        n = Session(args.directory).clean()
        print(f"removed {n} output{'' if n == 1 else 's'} and the workspace state")
        return 0
    if args.command in ("explain", "plan", "query", "graph"):
        from buildtool.insight import dispatch

        rc = dispatch(args)
        sys.stdout.flush()  # here, not at exit: a reader gone is 141 however stdout is buffered
        return rc
    if args.command == "run":
        from buildtool.runcmd import run_command

        return run_command(args)
    flags = {"jobs": args.jobs, "keep_going": args.keep_going, "cache_dir": args.cache_dir}
    if any(v is not None for k, v in vars(args).items() if k.startswith("remote_")):
        from buildtool.remote.options import flags_of as remote_flags_of

        flags.update(remote_flags_of(args))
    session = Session(args.directory, flags)
    req = BuildRequest(
        patterns=args.patterns,
        mode="build" if args.command == "watch" else args.command,
        jobs=args.jobs,
        keep_going=args.keep_going,
        dry_run=args.dry_run,
        cache_dir=args.cache_dir,
        explain=args.explain,
        events=args.events,
        wait=not args.no_wait,
        action_env=args.action_env,
        cache_tests=not getattr(args, "no_cache_tests", False),
        test_output=getattr(args, "test_output", "errors"),
        junit=getattr(args, "junit", None),
        profile=args.profile,
        load=args.load or None,  # -l 0: no limit, as in Ninja
        color=args.color,
        replay_output=args.replay_output,
        verbose=args.verbose,
        print_directory=args.print_directory,
        always_make=getattr(args, "always_make", False),
    )
    if args.command == "watch" or getattr(args, "watch", False):
        from buildtool.watch import watch

        return watch(session, req, poll=args.poll, debounce_ms=args.debounce_ms)
    req.prior = prior
    from buildtool.errors import LostRemoteInputs

    for attempt in range(1, LOST_REMOTE_RETRIES + 2):
        try:
            session.build(req)
            return 0
        except LostRemoteInputs:
            if attempt > LOST_REMOTE_RETRIES:
                raise
        req.prior = None  # (released: the first build's)
        print(f"buildtool: note: the remote CAS no longer has outputs this build needed (left there by "
              f"--remote-download); building again, their producers anew (retry {attempt} of "
              f"{LOST_REMOTE_RETRIES})", file=sys.stderr, flush=True)
    return 0  # (not reached)
