"""Status: the ``--events`` JSON Lines file and the reporter fan-out (the console that
people see lives in console.py and is re-exported here).

Reporters receive ``target_started`` / ``target_finished`` from the scheduler thread
only, so they need no locks.
"""

from __future__ import annotations

import json
import os
import stat

from buildtool.console import Console, say
from buildtool.graph import Graph
from buildtool.outcome import Outcome

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from typing import IO, Any

__all__ = ["Console", "EventsWriter", "Fanout"]  # Console lives in console.py; re-exported

EVENTS_SCHEMA = 1


class EventsWriter:
    """``--events FILE``: a header line, one JSON object per target, then (with a remote cache or
    executor) one ``remote`` line per remote.  Lines with a ``type`` are not targets."""

    def __init__(self, path: str, graph: Graph) -> None:
        import uuid  # with platform, ~5 ms: only when --events is given

        from buildtool.testing import cut_short, test_result

        self.graph = graph
        self._test_result = test_result
        self._cut_short = cut_short
        self.build_id = uuid.uuid4().hex
        self.path = path
        self.lost: str | None = None  # why the file is incomplete, once a write failed
        self._whole = 0  # bytes written in whole lines: where a failed write's file is cut back to
        self.written: set[int] = set()  # the targets that have their line
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.f: IO[str] | None = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
            from buildtool.atomic import wrote_report

            wrote_report(path)  # (this run's from now on, even cut short)
        except OSError as e:
            from buildtool.errors import UserError

            msg = f"--events {path}: cannot write it ({e.strerror})"
            raise UserError(msg) from None
        self._write({"schema": EVENTS_SCHEMA, "build_id": self.build_id, "type": "header"})

    def _write(self, obj: dict[str, Any]) -> None:
        """One line, flushed: a reader following the file sees each target as it finishes,
        and a build killed midway leaves every line up to then.  A write that fails (a full
        disk) is one warning, and the rest is dropped: the build's own result does not
        depend on its report."""
        if self.f is None:
            return
        line = json.dumps(obj) + "\n"  # (ASCII: json.dumps escapes the rest)
        try:
            self.f.write(line)
            self.f.flush()
        except OSError as e:
            self._failed(e)
        else:
            self._whole += len(line)

    def _failed(self, e: OSError) -> None:
        say(f"warning: could not write the events file {self.path} ({e.strerror}); it is incomplete")
        self.lost = f"--events {self.path} is incomplete ({e.strerror})"
        f, self.f = self.f, None
        if f is not None:
            try:
                fd = os.dup(f.fileno())
            except (OSError, ValueError):  # (ValueError: its close() failed, the descriptor is gone)
                fd = -1
            try:
                f.close()
            except OSError:
                pass
            if fd >= 0:  # cut back to its whole lines: a torn last one broke every reader's json.loads
                from buildtool.atomic import _own_stream, _through_a_descriptor

                try:  # (a file of its own only: not a stream others write too, `--events /dev/stdout > log`)
                    st = os.fstat(fd)
                    if stat.S_ISREG(st.st_mode) and not _own_stream(st) and not _through_a_descriptor(self.path):
                        os.ftruncate(fd, self._whole)
                except OSError:
                    pass
                finally:
                    os.close(fd)

    def target_started(self, t: int, lane: int) -> None:
        return

    def target_finished(self, t: int, o: Outcome) -> None:
        self.written.add(t)
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
        if o.extra.get("executed"):
            ev["executed"] = o.extra["executed"]  # "remote": ran on a remote executor (docs/remote.md)
        target = self.graph.targets[t]
        tr = self._test_result(target, o)
        if tr is not None:
            ev["test"] = tr.value  # passed | failed | timeout | flaky | cached
        elif target.kind == "test" and self._cut_short(o):
            ev["test"] = "interrupted"  # it ran, with no verdict (INTERRUPTED in the summary)
        self._write(ev)

    def remote(self, totals: dict[str, Any]) -> None:
        """One ``{"type": "remote", ...}`` line per remote cache/executor, after the targets."""
        self._write({"type": "remote", **totals})

    def close(self) -> None:
        if self.f is not None:
            try:
                self.f.flush()  # (a failure here still has the file open: cut back to whole lines)
                self.f.close()
                self.f = None
            except OSError as e:
                self._failed(e)


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
