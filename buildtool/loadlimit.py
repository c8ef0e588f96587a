"""Load limit: ``-l LOAD`` — start no new work while the 1-minute load average exceeds LOAD.

Like ``make -l``: it is a ``Scheduler.can_start`` hook plus a reporter that counts the
targets in flight, so that one target may always run and the build keeps progressing
however loaded the machine is.  The load average is re-read each time the scheduler
considers starting work (when a target finishes), at most every ``min_interval`` seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from buildtool.outcome import Outcome


def system_load() -> float:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0


class LoadLimit:
    """``can_start`` for the scheduler; also a reporter (target_started/finished)."""

    def __init__(self, max_load: float, load: Callable[[], float] = system_load, min_interval: float = 0.2) -> None:
        self.max_load = max_load
        self._load = load
        self._min_interval = min_interval
        self._in_flight: set[int] = set()
        self._last = (-1e9, 0.0)
        self.refusals = 0

    def can_start(self) -> bool:
        if not self._in_flight:
            return True  # always allow one job so the build progresses
        now = time.monotonic()
        at, value = self._last
        if now - at >= self._min_interval:
            value = self._load()
            self._last = (now, value)
        if value > self.max_load:
            self.refusals += 1
            return False
        return True

    def target_started(self, t: int, lane: int) -> None:
        self._in_flight.add(t)

    def target_finished(self, t: int, o: Outcome) -> None:
        self._in_flight.discard(t)
