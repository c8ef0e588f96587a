"""Outcome: the result of one target in one build, and the enumerated reasons.

Statuses and reason codes are part of the ``--events`` contract (docs/user-guide.md).
"""

from __future__ import annotations

import enum


class Status(enum.Enum):
    RAN = "ran"
    UP_TO_DATE = "up_to_date"
    RESTORED = "restored"
    FAILED = "failed"
    SKIPPED = "skipped"  # a dependency failed
    CANCELLED = "cancelled"  # the build stopped before it could run


class Reason(enum.Enum):
    """Why a target ran or not (``reason_code`` in events)."""

    UP_TO_DATE = "up_to_date"  # recorded key matches and outputs on disk match
    ADOPTED = "adopted"  # outputs on disk already equal the cache entry for this key
    RESTORED = "restored"  # key found in the cache; outputs copied back
    NEW = "new"  # never built in this workspace and not in the cache
    INPUT_CHANGED = "input_changed"
    DEP_CHANGED = "dep_changed"  # a dependency produced a different output
    COMMAND_CHANGED = "command_changed"
    ENV_CHANGED = "env_changed"
    TOOL_CHANGED = "tool_changed"
    INPUTS_ADDED_REMOVED = "inputs_changed"
    OUTPUTS_CHANGED = "outputs_changed"  # the list of declared outputs changed
    OUTPUT_MISSING = "output_missing"
    OUTPUT_MODIFIED = "output_modified"
    CACHE_CORRUPT = "cache_corrupt"
    ALWAYS = "always"  # always=True: runs on every build
    NO_CACHE_TESTS = "no_cache_tests"  # --no-cache-tests: a test reruns even with an unchanged key
    ALWAYS_MAKE = "always_make"  # -B (--always-make): every target runs, up to date or cached
    FAILED_BEFORE = "failed_before"  # a test that failed with this key runs again, whatever the cache holds
    DEFINITION_CHANGED = "definition_changed"
    GROUP = "group"
    TEST_NOT_RUN = "test_not_run"  # `build` reached a test through a dependency: built what it needs, not run
    FAILED = "failed"
    DEP_FAILED = "dep_failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    DRY_RUN = "dry_run"


class Outcome:
    """What happened to one target."""

    __slots__ = ("cache", "duration", "end", "exit_code", "extra", "key", "lane", "message", "reason", "start",
                 "status", "stderr", "stdout")

    def __init__(
        self,
        status: Status,
        reason: Reason,
        message: str,  # a sentence: why it ran or why not
        key: str = "",
        cache: str = "none",  # none | local
        duration: float = 0.0,
        start: float = 0.0,
        end: float = 0.0,
        lane: int = -1,
        stdout: bytes = b"",
        stderr: bytes = b"",
        exit_code: int | None = None,
        extra: dict[str, object] | None = None,  # None: {}
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.key = key
        self.cache = cache
        self.duration = duration
        self.start = start
        self.end = end
        self.lane = lane
        self.stdout = stdout
        self.stderr = stderr
        self.exit_code = exit_code
        self.extra = {} if extra is None else extra

    @property
    def ok(self) -> bool:
        return self.status in (Status.RAN, Status.UP_TO_DATE, Status.RESTORED)
