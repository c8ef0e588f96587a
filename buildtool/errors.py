"""Errors: the exception tree of buildtool and the exit code each maps to.

    BuildtoolError                 base; carries ``exit_code``
    +-- UserError (exit 2)         the request, a buildfile or the config is invalid
    |   +-- BuildfileError         ... with a file and line
    |   +-- NoTestsError (exit 4)  ``buildtool test`` matched no test target
    +-- BuildFailed (exit 1)       a command or a test failed
    +-- LockBusy (exit 1)          another buildtool holds the workspace, and --no-wait was given
    +-- Interrupted (130/143/129/131) SIGINT/TERM/HUP/QUIT while the scheduler ran or reports were written
    KeyboardInterrupt
    +-- EvaluationInterrupted      Ctrl-C (or SIGTERM, SIGHUP) while a BUILD.py ran (names it: an endless loop)
    +-- Terminated                 SIGTERM, SIGHUP, SIGQUIT elsewhere (loading, waiting for the lock): as Ctrl-C
    StopRequested (BaseException)  raised by buildtool's own signal handlers (watch): leave now

Only ``cli.py`` decides how to print them.  Cache and state trouble is never an
error: it degrades to a miss with a warning (see ``warnings.py``-style ``Status.warn``).
"""

from __future__ import annotations

import os

_exit = os._exit  # (as imported, before the loader guards os._exit while a BUILD.py runs: count_stop_signal)


class BuildtoolError(Exception):
    """Base class; ``exit_code`` is what the process exits with."""

    exit_code = 1


class UserError(BuildtoolError):
    """Invalid request, buildfile or configuration (exit code 2)."""

    exit_code = 2


class ReportPathError(UserError):
    """A --junit, --profile or --events path the build may not write (a source, an output,
    a BUILD.py ...); ``flags`` names them: the files there are never removed as an earlier
    run's reports."""

    def __init__(self, message: str, flags: frozenset[str]) -> None:
        super().__init__(message)
        self.flags = flags


class BuildfileError(UserError):
    """An error located in a buildfile (``path:line: message``)."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = ""
        if path:
            where = f"{path}:{line}: " if line else f"{path}: "
        super().__init__(where + message)


class NoTestsError(UserError):
    """``buildtool test`` found no test targets (exit code 4, as Bazel)."""

    exit_code = 4


class BuildFailed(BuildtoolError):
    """At least one command failed (exit code 1)."""

    exit_code = 1


class LostRemoteInputs(BuildFailed):
    """Every failure was a target whose inputs were left in a remote CAS (--remote-download)
    that the server no longer has: their producers are forgotten, so the same build run
    again makes them anew (the command line does, as Bazel retries an invocation whose
    remote blobs were evicted)."""


class LockBusy(BuildtoolError):
    """Another buildtool holds the workspace and ``--no-wait`` was given (exit 1)."""

    exit_code = 1


class Interrupted(BuildtoolError):
    """The build was interrupted by a signal (exit code 128 + signal number)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by signal {signum}")


class EvaluationInterrupted(KeyboardInterrupt):
    """Ctrl-C while a BUILD.py (or a module it imported) was running; ``where`` is the
    deepest workspace file and line, so a BUILD.py stuck in a loop is named on the way out.
    Still a KeyboardInterrupt: every caller that stops on Ctrl-C stops on it.  ``signum``:
    SIGINT, or the SIGTERM or SIGHUP a ``Terminated`` stood for (the exit is 128 + it)."""

    def __init__(self, where: str, signum: int = 2) -> None:
        self.where = where
        self.signum = signum
        super().__init__(where)


class Terminated(KeyboardInterrupt):
    """SIGTERM, SIGHUP or SIGQUIT (``signum``) outside the scheduler's loop: raised by the CLI's
    handler so that the command leaves as on Ctrl-C, its ``finally`` blocks releasing the
    locks, rather than dying at once (the default action) with its lock file in /tmp left
    behind.  A KeyboardInterrupt, so it passes wherever Ctrl-C passes."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"signal {signum}")


class StopRequested(BaseException):
    """Raised by one of buildtool's own signal handlers to leave whatever runs (watch mode
    stopping while it evaluates BUILD.py files): the evaluation passes it on untouched,
    where it turns anything else a BUILD.py raises into a BuildfileError."""


QUIT_AT = 3  # stopping signals: the third quits at once, as Bazel's third Ctrl-C does,
QUIT_AFTER_S = 3.0  # when it comes this long after the first: past the commands' 2 s of grace (executor.py),
# so a supervisor repeating SIGTERM every half second still gets the orderly way out
_seen_signals: list[float] = []  # when each came (time.monotonic)


def count_stop_signal(signum: int) -> None:
    """Count a signal that asks the command to stop (SIGINT, SIGTERM, SIGHUP, SIGQUIT).  The
    first stops it the orderly way (its handler's business); a later one is said; the third,
    three seconds or more after the first, quits the process at once, exit 128 + ``signum``,
    SIGKILLing the commands it started first (a supervisor repeating SIGTERM meanwhile
    leaves the orderly way, which takes 2 s of grace at most): a
    BUILD.py that caught the first ones (a bare ``except:`` around a wait loop), or a
    ``finally`` block stuck on a hung mount, left only SIGKILL.  The workspace lock is an
    flock(), which the kernel releases, and a build's commands left running are the next
    build's to end (orphans.py), as after a ``kill -9``."""
    import time

    _seen_signals.append(time.monotonic())
    n = len(_seen_signals)
    quit_now = n >= QUIT_AT and _seen_signals[-1] - _seen_signals[0] >= QUIT_AFTER_S
    try:
        if quit_now:
            os.write(2, f"buildtool: a third stop signal ({signum}): quitting at once\n".encode())
            _quit(signum)
        if n == 2:
            os.write(2, b"buildtool: still stopping (cleaning up, or a BUILD.py caught the interrupt); "
                        b"once more quits at once\n")
    except OSError:  # (stderr closed: a terminal gone)
        if quit_now:
            _quit(signum)


def _quit(signum: int) -> None:
    import sys

    executor = sys.modules.get("buildtool.executor")  # (loaded once a command ran: none to end before)
    if executor is not None:
        try:
            executor.kill_everything_now()
        except Exception:  # (on the way out at once: nothing may stop it)
            pass
    _exit(128 + signum)
