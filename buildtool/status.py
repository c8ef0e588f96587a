"""Status: what the user sees while a build runs (live line on a TTY, plain lines in CI)
and the ``--events`` JSON Lines file.

Reporters receive ``target_started`` / ``target_finished`` from the scheduler thread
only, so they need no locks.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from typing import IO, Any

from buildtool.graph import Graph
from buildtool.outcome import Outcome, Status
from buildtool.testing import test_result

EVENTS_SCHEMA = 1


class Console:
    """Progress and failures on stderr-like ``out``; a live line only on a terminal."""

    def __init__(
        self, graph: Graph, total: int, out: IO[str] | None = None, *, tty: bool | None = None, explain: bool = False
    ) -> None:
        self.graph = graph
        self.total = total
        self.out = out or sys.stdout
        if tty is None:
            tty = (
                self.out.isatty()
                and os.environ.get("CI", "").lower() not in ("1", "true")
                and os.environ.get("TERM") != "dumb"
            )
        self.tty = tty
        self.explain = explain
        self.done = 0
        self.running: dict[int, float] = {}
        self.counts: Counter[str] = Counter()
        self._last_draw = 0.0
        self._line_shown = False

    def warn(self, msg: str) -> None:
        self._clear()
        print(f"buildtool: warning: {msg}", file=sys.stderr, flush=True)

    def target_started(self, t: int, lane: int) -> None:
        self.running[t] = time.monotonic()
        if self.tty:
            self._draw()

    def target_finished(self, t: int, o: Outcome) -> None:
        self.running.pop(t, None)
        self.done += 1
        self.counts[o.status.value] += 1
        label = self.graph.targets[t].label
        if o.status is Status.FAILED:
            self._clear()
            self._print_failure(t, o)
        elif self.explain:
            self._clear()
            self._line(f"{label}: {o.status.value}: {o.message}")
        elif not self.tty and o.status is not Status.UP_TO_DATE:
            dur = f" ({o.duration:.2f}s)" if o.status is Status.RAN else ""
            self._line(f"[{self.done}/{self.total}] {o.status.value} {label}{dur}")
        if self.tty:
            self._draw()

    def _print_failure(self, t: int, o: Outcome) -> None:
        target = self.graph.targets[t]
        lines = [f"FAILED: {target.label} ({target.where}): {o.message}"]
        if target.cmd:
            lines.append(f"command (in //{target.pkg}): {target.cmd}")
        text = "\n".join(lines)
        print(text, file=self.out, flush=True)
        for data in (o.stdout, o.stderr):
            if data:
                s = data.decode("utf-8", "replace")
                print(s, end="" if s.endswith("\n") else "\n", file=self.out, flush=True)

    def _line(self, s: str) -> None:
        print(s, file=self.out, flush=True)

    def _clear(self) -> None:
        if self.tty and self._line_shown:
            self.out.write("\r\x1b[K")
            self._line_shown = False

    def _draw(self) -> None:
        now = time.monotonic()
        if now - self._last_draw < 0.05 and self.running:
            return
        self._last_draw = now
        names = ", ".join(self.graph.targets[t].label for t in list(self.running)[:3])
        more = f" +{len(self.running) - 3}" if len(self.running) > 3 else ""
        line = f"[{self.done}/{self.total}] running: {names}{more}" if self.running else f"[{self.done}/{self.total}]"
        width = 120
        try:
            width = os.get_terminal_size(self.out.fileno()).columns
        except (OSError, ValueError, AttributeError):
            pass
        self.out.write("\r\x1b[K" + line[: max(width - 1, 10)])
        self.out.flush()
        self._line_shown = True

    def summary(self, wall: float, failed: bool, interrupted: bool = False) -> None:
        self._clear()
        order = ["ran", "restored", "up_to_date", "failed", "skipped", "cancelled"]
        parts = [f"{self.counts[k]} {k}" for k in order if self.counts.get(k)]
        head = "INTERRUPTED" if interrupted else ("FAILED" if failed else "OK")
        print(
            f"{head}: {self.total} targets: {', '.join(parts) or 'nothing to do'} in {wall:.2f}s",
            file=self.out,
            flush=True,
        )


class EventsWriter:
    """``--events FILE``: a header line, then one JSON object per target."""

    def __init__(self, path: str, graph: Graph) -> None:
        self.graph = graph
        self.build_id = uuid.uuid4().hex
        self.f: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.f.write(json.dumps({"schema": EVENTS_SCHEMA, "build_id": self.build_id, "type": "header"}) + "\n")

    def target_started(self, t: int, lane: int) -> None:
        return

    def target_finished(self, t: int, o: Outcome) -> None:
        ev: dict[str, Any] = {
            "label": self.graph.targets[t].label,
            "status": o.status.value,
            "cache": o.cache,
            "duration_s": round(o.duration, 6),
            "start": round(o.start, 6),
            "end": round(o.end, 6),
            "reason_code": o.reason.value,
            "reason": o.message,
        }
        if o.key:
            ev["key"] = o.key
        if o.lane >= 0:
            ev["lane"] = o.lane
        if o.exit_code is not None:
            ev["exit_code"] = o.exit_code
        tr = test_result(self.graph.targets[t], o)
        if tr is not None:
            ev["test"] = tr.value  # passed | failed | timeout | flaky | cached
        self.f.write(json.dumps(ev) + "\n")

    def close(self) -> None:
        self.f.close()


class Fanout:
    """Sends every event to several reporters."""

    def __init__(self, *reporters: Any) -> None:
        self.reporters = [r for r in reporters if r is not None]

    def target_started(self, t: int, lane: int) -> None:
        for r in self.reporters:
            r.target_started(t, lane)

    def target_finished(self, t: int, o: Outcome) -> None:
        for r in self.reporters:
            r.target_finished(t, o)
