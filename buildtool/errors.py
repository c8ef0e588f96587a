"""Errors: the exception tree of buildtool and the exit code each maps to.

    BuildtoolError                 base; carries ``exit_code``
    +-- UserError (exit 2)         the request, a buildfile or the config is invalid
    |   +-- BuildfileError         ... with a file and line
    |   +-- NoTestsError (exit 4)  ``buildtool test`` matched no test target
    +-- BuildFailed (exit 1)       a command or a test failed
    +-- Interrupted (130/143)      SIGINT / SIGTERM during a build
    KeyboardInterrupt
    +-- EvaluationInterrupted      Ctrl-C while a BUILD.py ran (names it: an endless loop)
    StopRequested (BaseException)  raised by buildtool's own signal handlers (watch): leave now

Only ``cli.py`` decides how to print them.  Cache and state trouble is never an
error: it degrades to a miss with a warning (see ``warnings.py``-style ``Status.warn``).
"""

from __future__ import annotations


class BuildtoolError(Exception):
    """Base class; ``exit_code`` is what the process exits with."""

    exit_code = 1


class UserError(BuildtoolError):
    """Invalid request, buildfile or configuration (exit code 2)."""

    exit_code = 2


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


class Interrupted(BuildtoolError):
    """The build was interrupted by a signal (exit code 128 + signal number)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by signal {signum}")


class EvaluationInterrupted(KeyboardInterrupt):
    """Ctrl-C while a BUILD.py (or a module it imported) was running; ``where`` is the
    deepest workspace file and line, so a BUILD.py stuck in a loop is named on the way out.
    Still a KeyboardInterrupt: every caller that stops on Ctrl-C stops on it."""

    def __init__(self, where: str) -> None:
        self.where = where
        super().__init__(where)


class StopRequested(BaseException):
    """Raised by one of buildtool's own signal handlers to leave whatever runs (watch mode
    stopping while it evaluates BUILD.py files): the evaluation passes it on untouched,
    where it turns anything else a BUILD.py raises into a BuildfileError."""
