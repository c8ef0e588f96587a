"""Console: what a person sees while a build runs — a live multi-line status on a terminal,
plain stable lines elsewhere (CI logs, pipes), colors when wanted.

On a terminal (and not ``CI=true``, not ``TERM=dumb``) the bottom of the screen holds a
status area: ``[done/total]``, an ETA from recorded durations, and one line per running
target with its elapsed time, redrawn by a ticker thread.  Finished-target lines and
failures (command and full output) are printed above that area.  Elsewhere: one line per
target that did work, no control characters at all (unless ``--color always``, which adds
SGR colour codes and nothing else), and a ``still running`` line for a target that runs
long (after 30 s, then 1, 2, 4... minutes): a CI log that goes quiet names what it waits for.

Reporter calls come from the scheduler thread, the ticker thread redraws, and any thread's
``buildtool:`` line goes above the area through ``say``; one lock guards the shared state.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import Counter

from buildtool.config import in_ci
from buildtool.graph import Graph
from buildtool.outcome import Outcome, Reason, Status

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Collection, Container, Sequence
    from typing import IO

COLOR_MODES = ("auto", "always", "never")
_CONTROL = r"[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # (C1 too: U+009B is a CSI) compiled and cached by re when first used
TICK_S = 0.25
REDRAW_S = 0.05  # at most this often for targets that print nothing (the ticker redraws anyway)
MAX_RUNNING_LINES = 8
STILL_RUNNING_S = 30.0  # off a terminal, a target running this long is named, then at each doubling

_SGR = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "cyan": "36", "dim": "2", "bold": "1"}
_STATUS_COLOR = {
    "ran": "green",
    "restored": "cyan",
    "up_to_date": "dim",
    "failed": "red",
    "skipped": "yellow",
    "cancelled": "yellow",
}


class ClosableStream:
    """The console's stream, which its reader may close (``buildtool build | head``) or which
    may stop taking output (a full disk, ``> /dev/full``): from then on output is dropped
    (said once on stderr unless the reader just left) and the build goes on to its own end
    and exit status, where Python would raise out of the middle of the scheduler."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.gone = False

    def write(self, s: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(s)
            except OSError as e:
                self._lost(e)
        return len(s)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except OSError as e:
                self._lost(e)

    def _lost(self, e: OSError) -> None:
        self.gone = True
        if not isinstance(e, BrokenPipeError) and self._stream is not sys.stderr:
            try:
                print(f"buildtool: warning: the build's output is lost ({e.strerror}); the build goes on",
                      file=sys.stderr, flush=True)
            except OSError:
                pass

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        try:
            return self._stream.isatty()
        except (AttributeError, ValueError):
            return False


def is_live_terminal(out: IO[str]) -> bool:
    """A terminal that may receive cursor movement: a TTY, not CI, not ``TERM=dumb``."""
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and not in_ci() and os.environ.get("TERM") != "dumb"


def use_color(mode: str, out: IO[str]) -> bool:
    """``--color``: always / never, or auto = a live terminal and no ``NO_COLOR``."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    if os.environ.get("NO_COLOR"):
        return False
    return is_live_terminal(out)


def _terminal_size(out: ClosableStream, default: tuple[int, int]) -> tuple[int, int]:
    """(columns, lines) of the terminal ``out`` writes to, ``default`` where not told."""
    try:
        size = os.get_terminal_size(out.fileno())
    except (OSError, ValueError, AttributeError):
        return default
    return size.columns or default[0], size.lines or default[1]


def targets(n: int) -> str:
    """``n`` with the word "target", in the plural unless ``n`` is 1 (the summary lines)."""
    return f"{n} target" if n == 1 else f"{n} targets"


def elide_middle(text: str, room: int) -> str:
    """``text`` in ``room`` characters, its middle replaced by "...": more of the end, a
    label's target name, is kept (Ninja elides the middle too; cut at the right edge,
    //a_long_package:target_0 and :target_1 both read //a_long_packa)."""
    if len(text) <= room:
        return text
    if room < 8:
        return text[:max(room, 0)]
    head = (room - 3) // 3
    return text[:head] + "..." + text[len(text) - (room - 3 - head):]


def fmt_secs(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s + 0.5), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


_live: Console | LoadingLine | None = None  # the console drawing a live area now: other lines go above it


def say(msg: str) -> None:
    """``buildtool: MSG`` on stderr, in one write (worker threads warn at once: lines must
    not run into each other); above the live area if one is drawn (the runner's and the
    cache's warnings: written into it, they were erased by the next redraw).  Control
    characters in it (a file name's) are shown as escapes (``escape_controls``)."""
    msg = escape_controls(msg)
    live = _live
    if live is not None:
        live.say(msg)
        return
    sys.stderr.write(f"buildtool: {msg}\n")
    sys.stderr.flush()


class LoadingLine:
    """The one line a terminal shows while BUILD.py files are evaluated, before the build's
    own status area: nothing for the first half second, then how many packages were
    evaluated and which one is now, redrawn from the loader's thread as each evaluation
    begins (no ticker thread: ``Loader.load`` refuses threads left running).  Anything
    written meanwhile (a BUILD.py's print, a warning) first erases it."""

    DELAY_S = 0.5

    def __init__(self, out: IO[str], whole: bool = False) -> None:
        self.out = ClosableStream(out)
        self.whole = whole  # every package is wanted (//...): the count has a total
        self._next = time.monotonic() + self.DELAY_S
        self._drawn = False

    def evaluating(self, done: int, total: int | None, pkg: str) -> None:
        """``done`` packages were evaluated (of ``total``, when all are wanted); ``pkg`` is next."""
        global _live
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + TICK_S
        width = _terminal_size(self.out, (80, 24))[0]
        count = f"{done:,}/{total:,}" if total and self.whole else f"{done:,}"
        head = f"loading: {count} BUILD.py files evaluated, now "
        room = max(width - 1, 1) - len(head)
        text = (head + elide_middle(escape_controls(f"//{pkg}"), room))[: max(width - 1, 1)]
        self.out.write(f"\r{text}\x1b[K")
        self.out.flush()
        self._drawn = True
        _live = self

    def clear(self) -> None:
        if self._drawn:
            self._drawn = False
            self.out.write("\r\x1b[K")
            self.out.flush()

    def say(self, msg: str) -> None:
        self.clear()
        sys.stderr.write(f"buildtool: {msg}\n")
        sys.stderr.flush()

    def close(self) -> None:
        global _live
        self.clear()
        if _live is self:
            _live = None


class Console:
    """Progress, per-target lines, failures and the summary on ``out`` (stdout by default)."""

    def __init__(
        self,
        graph: Graph,
        total: int,
        out: IO[str] | None = None,
        *,
        tty: bool | None = None,
        explain: bool = False,
        color: str = "auto",
        replay_output: bool = False,
        verbose: bool = False,
        print_directory: str | None = None,
    ) -> None:
        self.graph = graph
        self.verbose = verbose  # -v: the command of every target that ran, after its line
        self.print_directory = print_directory  # -w: the workspace root (its packages' commands ran there)
        self.total = total
        stream = out or sys.stdout
        self.tty = is_live_terminal(stream) if tty is None else tty
        self.color = use_color(color, stream)
        self.out = ClosableStream(stream)
        self.explain = explain
        self.replay_output = replay_output
        self.done = 0
        self.running: dict[int, float] = {}
        self.counts: Counter[str] = Counter()
        self._failures: list[str] = []  # "label (where): message" of each build failure, for the recap
        self._lock = threading.RLock()
        self._area_lines = 0  # lines of the live status area currently on screen
        self._drawn_at = 0.0  # when it was last drawn (REDRAW_S)
        self._estimate: Sequence[float] | None = None
        self._jobs = 1
        self._finished: set[int] = set()
        self._counted: Container[int] = ()  # the targets the ETA waits for (the build's plan)
        self._left = 0.0  # their estimates, those not finished: kept as they finish (an ETA is O(jobs))
        self._ran_estimate = 0.0  # of the targets that ran: what was estimated, and what they took
        self._ran_actual = 0.0
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._console_actions = 0  # running targets of the console pool: their output is the screen's
        self._still_due: dict[int, float] = {}  # off a terminal: when a running target is next named

    # -- setup -------------------------------------------------------------------------
    def estimate(self, weights: Sequence[float], jobs: int, planned: Collection[int] | None = None) -> None:
        """Recorded (or predicted) seconds per target id, for the ETA; ``planned``: the
        targets the build runs or checks (None: all)."""
        self._estimate = weights
        self._jobs = max(1, jobs)
        ids: Collection[int] = range(len(weights)) if planned is None else planned
        self._counted = ids if planned is None else set(ids)
        self._left = sum(weights[t] for t in ids if t not in self._finished)

    def _paint(self, s: str, color: str | None) -> str:
        if not self.color or color is None:
            return s
        return f"\x1b[{_SGR[color]}m{s}\x1b[0m"

    # -- reporter --------------------------------------------------------------------
    def warn(self, msg: str) -> None:
        self.say(f"warning: {msg}")

    def say(self, msg: str) -> None:
        """A ``buildtool: MSG`` line on stderr, above the live area (which is cleared first
        and drawn again after it: a line written into it was erased by the next redraw)."""
        msg = escape_controls(msg)
        with self._lock:
            self._clear()
            self.out.flush()
            sys.stderr.write(f"buildtool: {msg}\n")
            sys.stderr.flush()
            self._draw()

    def target_started(self, t: int, lane: int) -> None:
        with self._lock:
            self.running[t] = time.monotonic()
            if self.graph.targets[t].pool == "console":  # (its output goes to the screen as it comes,
                self._console_actions += 1  # as Ninja's console pool: no area redrawn over it)
            if self.tty:
                self._start_ticker()
                self._clear()
                self._draw()
            else:
                self._still_due[t] = self.running[t] + STILL_RUNNING_S
                self._start_ticker()

    def target_finished(self, t: int, o: Outcome) -> None:
        with self._lock:
            if self.running.pop(t, None) is not None and self.graph.targets[t].pool == "console":
                self._console_actions -= 1
            self._still_due.pop(t, None)
            if t not in self._finished and self._estimate is not None and t in self._counted:
                self._left -= self._estimate[t]
                if o.status is Status.RAN and o.duration > 0:
                    self._ran_estimate += self._estimate[t]
                    self._ran_actual += o.duration
            self._finished.add(t)
            self.done += 1
            self.counts[o.status.value] += 1
            if self._area_lines and self._says_nothing(o) and time.monotonic() - self._drawn_at < REDRAW_S:
                return  # (an up-to-date target settled between two redraws: the next one counts it)
            self._clear()
            self._report(t, o)
            self._draw()

    def _says_nothing(self, o: Outcome) -> bool:
        """Whether ``_report`` prints no line for ``o`` (an up-to-date target; one that never
        started): a redraw of the area for it alone is one more flicker (65 in a 0.07 s
        build, over ssh), which the rate limit spares."""
        if self.explain or o.status is Status.FAILED:
            return False
        return o.status is Status.UP_TO_DATE or self._unstarted_unsaid(o)

    def _unstarted_unsaid(self, o: Outcome) -> bool:
        """A target a failure or Ctrl-C left unstarted: counted in the summary, no line (as
        Ninja and Make say nothing of them), unless -v or --explain lists every target."""
        return o.reason in _NOT_STARTED and o.lane < 0 and not self.explain and not self.verbose

    def _report(self, t: int, o: Outcome) -> None:
        label = self.graph.targets[t].label
        status = o.status.value
        if o.status is Status.FAILED:
            self._print_failure(t, o)
            return
        if self._unstarted_unsaid(o):
            return
        if self.explain:
            said = o.message.removeprefix(status.replace("_", " ") + ": ")  # ("up_to_date: up to date: ...")
            self._line(f"{label}: {self._paint(status, _STATUS_COLOR.get(status))}: {escape_controls(said)}")
        elif o.status is not Status.UP_TO_DATE:
            dur = f" ({o.duration:.2f}s)" if o.status is Status.RAN else ""
            word = self._paint(status, _STATUS_COLOR.get(status))
            self._line(f"[{self.done}/{self.total}] {word} {label}{dur}")
        if self.verbose and o.status is Status.RAN:
            self.command_of(t)
        if o.status is Status.RAN and self.graph.targets[t].kind != "test":
            # What a command that succeeded printed (a compiler's warnings) follows its line,
            # as Make and Ninja show it; a test's output is --test-output's to show.
            self._output_of(t, (o.stdout, o.stderr))
        if self.replay_output and o.status is Status.RESTORED and o.reason is Reason.RESTORED:
            self._replay(t, label, o)

    def _replay(self, t: int, label: str, o: Outcome) -> None:
        lost = o.extra.get("lost_streams", ())
        for name, data in (("stdout", o.stdout), ("stderr", o.stderr)):
            if name in lost:
                self._line(self._paint(f"--- {label}: cached {name} is no longer in the cache ---", "dim"))
            elif data:
                self._line(self._paint(f"--- {label}: cached {name} ---", "dim"))
                self._output_of(t, (data,))

    def command_of(self, t: int) -> None:
        """The line that shows target ``t``'s command, as a user would type it in its package
        directory (a pyrule's function; nothing for a group)."""
        target = self.graph.targets[t]
        if target.cmd:  # (a file name's control characters as escapes: they set a terminal's title)
            self._line(f"command (in //{target.pkg}): {escape_controls(target.cmd, lines=True)}")
        elif target.fn:
            self._line(f"pyrule (in //{target.pkg}): {target.fn}")

    def _print_failure(self, t: int, o: Outcome) -> None:
        target = self.graph.targets[t]
        self._line(self._paint(f"FAILED: {target.label} ({target.where}): {escape_controls(o.message)}", "red"))
        if not o.extra.get("test_verdict"):  # (a test's verdict: the test report lists those)
            first = next((ln for ln in o.message.splitlines() if ln.strip()), "")  # (its first line: the rest is above)
            self._failures.append(f"{target.label} ({target.where})" + (f": {escape_controls(first)}" if first else ""))
        if not o.extra.get("not_started"):  # (an unreadable input: no command ran, none to show)
            self.command_of(t)
        self._output_of(t, (o.stdout, o.stderr))

    def _output_of(self, t: int, streams: Sequence[bytes | None]) -> None:
        """Target ``t``'s command's output; under -w between make -w's lines naming the
        directory it ran in, which editors read to find the files its messages name
        (a compiler's ``eval.c:10:``, relative to the package directory)."""
        self.output_in(self.graph.targets[t].pkg, streams)

    def output_in(self, pkg: str, streams: Sequence[bytes | None]) -> None:
        """What a command of package ``pkg`` printed (a test's log under --test-output all
        too), between -w's directory lines."""
        if not any(streams):
            return
        where = None
        if self.print_directory is not None:
            where = escape_controls(os.path.join(self.print_directory, pkg) if pkg else self.print_directory)
            self._line(f"buildtool: Entering directory '{where}'")
        for data in streams:
            if data:
                self.text(data)
        if where is not None:
            self._line(f"buildtool: Leaving directory '{where}'")

    def text(self, data: bytes) -> None:
        """A command's output: as it is on a live terminal (with a colour reset after it if
        it holds escapes and colours are on: a command ending in bold yellow coloured the
        lines after it; without its colours when they are off, ``--color never``, as
        ``NO_COLOR`` asks); elsewhere without control characters, but for its colours under
        ``--color always`` (its cursor movement went into CI logs)."""
        s = data.decode("utf-8", "replace")
        if not self.tty:
            s = strip_controls(s, keep_colors=self.color)
        elif not self.color and "\x1b[" in s:  # (--color never, NO_COLOR: a compiler's colours too)
            s = re.sub(r"\x1b\[[0-9;:]*m", "", s)
        if self.color and "\x1b" in s:
            body = s.rstrip("\n")
            s = body + "\x1b[0m" + s[len(body):]  # (its trailing blank lines kept)
        self._write(s if s.endswith("\n") else s + "\n")

    def _line(self, s: str) -> None:
        if not self.tty and not self.color and re.search(_CONTROL, s):
            s = strip_controls(s)
        self._write(s + "\n")

    def _write(self, s: str) -> None:
        """One write per line, then a flush: ``print`` writes the line and its newline
        separately, two system calls each when stdout is unbuffered (PYTHONUNBUFFERED=1, as
        many CI images set): 10,000 extra in a build that restores 10,000 targets."""
        self.out.write(s)
        self.out.flush()

    # -- live area (terminal only) -----------------------------------------------------
    def _start_ticker(self) -> None:
        global _live
        _live = self
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="buildtool-console", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S if self.tty else min(1.0, STILL_RUNNING_S)):
            with self._lock:
                if not self.running:
                    continue
                if self.tty:
                    self._clear()
                    self._draw()
                else:
                    self.still_running(time.monotonic())

    def still_running(self, now: float) -> None:
        """Off a terminal, where no live area shows what runs: a line for each target that
        has run STILL_RUNNING_S, and again each time its time doubles (as Bazel's "still
        waiting" and its progress lines), with its command under -v, the first time.  A hung
        command in CI was silence until the job's time limit."""
        for t, due in sorted(self._still_due.items(), key=lambda kv: kv[1]):
            started = self.running.get(t)
            if started is None or now < due:
                continue
            ran = now - started
            self._still_due[t] = started + 2 * ran
            self._line(f"[{self.done}/{self.total}] still running {self.graph.targets[t].label} ({fmt_secs(ran)})")
            if self.verbose and due - started < 1.5 * STILL_RUNNING_S:  # (its first time)
                self.command_of(t)

    def _clear(self) -> None:
        if self.tty and self._area_lines:
            # Move to the first line of the area and erase to the end of the screen.
            up = f"\x1b[{self._area_lines - 1}A" if self._area_lines > 1 else ""
            self.out.write(f"\r{up}\x1b[J")
            self._area_lines = 0

    def eta(self, now: float) -> float | None:
        """Seconds left: remaining recorded work spread over the jobs, at least the
        longest remaining running target.  The estimates are scaled by what the commands
        that ran so far took against their estimates (a first build's unknown targets count
        1 s each: 30,000 of 4 ms said "3h45m"), and the sum is kept as targets finish (a
        scan of every target on each redraw made a 30,000-target build 3.6x slower on a
        terminal)."""
        w = self._estimate
        if w is None:
            return None
        scale = self._ran_actual / self._ran_estimate if self._ran_estimate > 0 else 1.0
        waiting = self._left  # (unscaled; the running ones' own estimates taken out below)
        running = 0.0  # what the running ones have left, scaled
        longest = 0.0
        for t, started in self.running.items():  # (at most -j of them)
            if t in self._counted:
                waiting -= w[t]
                rest = max(0.0, w[t] * scale - (now - started))
                running += rest
                longest = max(longest, rest)
        return max((max(waiting, 0.0) * scale + running) / self._jobs, longest)

    def overdue(self, now: float) -> bool:
        """Whether a running target has taken longer than its (scaled) estimate: the ETA,
        which counts nothing more for it, is then only a lower bound."""
        w = self._estimate
        if w is None:
            return False
        scale = self._ran_actual / self._ran_estimate if self._ran_estimate > 0 else 1.0
        return any(now - started > w[t] * scale for t, started in self.running.items() if t in self._counted)

    def status_lines(self, now: float, width: int) -> list[str]:
        head = f"[{self.done}/{self.total}]"
        eta = self.eta(now)
        if eta is not None and self.running:
            head += f" ETA {fmt_secs(eta)}" + ("+" if self.overdue(now) else "")  # (at least: one runs long)
        if self.running:
            head += f" running {len(self.running)}:"
        lines = [self._paint(head, "bold")]
        items = sorted(self.running.items(), key=lambda kv: kv[1])
        for t, started in items[:MAX_RUNNING_LINES]:
            lead = f"  {fmt_secs(now - started):>7} "
            room = max(width - 1, 1) - len(lead)
            lines.append((lead + elide_middle(self.graph.targets[t].label, room))[: max(width - 1, 1)])
        if len(items) > MAX_RUNNING_LINES:
            lines.append(f"  ... and {len(items) - MAX_RUNNING_LINES} more")
        if len(head) >= width:  # (a wrapped line: the clear would go up one row too few)
            lines[0] = self._paint(head[: max(width - 1, 1)], "bold")
        return lines

    def _draw(self) -> None:
        if not self.tty or not self.running or self._console_actions:
            return
        width, height = _terminal_size(self.out, (120, 24))
        lines = self.status_lines(time.monotonic(), width)[: max(height - 1, 1)]  # (the cursor-up stops at the top)
        self.out.write("\n".join(lines))
        self.out.flush()
        self._area_lines = len(lines)
        self._drawn_at = time.monotonic()

    # -- end of build ----------------------------------------------------------------
    def close(self) -> None:
        global _live
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
            self._ticker = None
        with self._lock:
            self._clear()
            self.running.clear()  # (nothing drawn again: a say() from a worker still running)
            if _live is self:
                _live = None

    def critical_path(self, text: str | None) -> None:
        """Print the critical path of what ran (see profile.actual_critical_path)."""
        if text:
            with self._lock:
                self._clear()
                self._line(text)

    def summary(self, wall: float, failed: bool, interrupted: bool = False, unchanged: int = 0) -> None:
        """The final line; ``unchanged`` counts targets left out of an incremental plan
        because nothing they read or wrote changed (watch mode, the no-op snapshot)."""
        self.close()
        order = ["ran", "restored", "up_to_date", "failed", "skipped", "cancelled"]
        parts = [f"{self.counts[k]} {k}" for k in order if self.counts.get(k)]
        if unchanged:
            parts.append(f"{unchanged} unchanged")
        head = "INTERRUPTED" if interrupted else ("FAILED" if failed else "OK")
        color = "green" if head == "OK" else "red"
        # What failed, again at the end: its output is above, maybe many screens up (other
        # commands' output and warnings after it, a -k build's later failures).
        for line in self._failures[:RECAP_SHOWN]:
            print(self._paint(f"failed {line}", "red"), file=self.out)
        if len(self._failures) > RECAP_SHOWN:
            print(f"... and {len(self._failures) - RECAP_SHOWN} more failed", file=self.out)
        total = self.total + unchanged
        print(
            f"{self._paint(head, color)}: {targets(total)}: {', '.join(parts) or 'nothing to do'} in {wall:.2f}s",
            file=self.out,
            flush=True,
        )


RECAP_SHOWN = 10  # failures listed again above the summary line
_NOT_STARTED = (Reason.DEP_FAILED, Reason.CANCELLED, Reason.INTERRUPTED)  # (not a dry run's "skipped")


_SHOWN_AS_ESCAPES = r"[\x00-\x1f\x7f-\x9f\u2028\u2029\udc80-\udcff]"
_SHOWN_AS_ESCAPES_BUT_LINES = r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\udc80-\udcff]"


def escape_controls(s: str, lines: bool = False) -> str:
    """``s`` (buildtool's own one-line text: a reason, a message naming files) with each
    control character, line separator and undecodable byte of a file name written as an
    escape (``\\x1b``, ``\\n``, ``\\u2028``, ``\\xe9``), as errors show such names: a
    source named ``a<ESC>]0;x<BEL>.txt`` set the terminal's title from `explain` and read as
    ``a.txt`` in `build --explain` (stripped), and a newline split a reason over two lines.
    ``lines``: text of several lines (a command), whose newlines and tabs stay."""
    pattern = _SHOWN_AS_ESCAPES_BUT_LINES if lines else _SHOWN_AS_ESCAPES
    if not re.search(pattern, s):
        return s

    def one(m: re.Match[str]) -> str:
        c = m.group()
        if "\udc80" <= c <= "\udcff":
            return f"\\x{ord(c) - 0xDC00:02x}"
        return repr(c)[1:-1]

    return re.sub(pattern, one, s)


def strip_controls(s: str, keep_colors: bool = False) -> str:
    """Drop ANSI escape sequences and other control characters (keeps newline and tab);
    ``keep_colors``: but not SGR sequences (``ESC[...m``), a compiler's coloured diagnostics
    under ``--color always`` in a CI log that shows them."""
    if keep_colors:  # (the text between SGR sequences stripped as ever: no other escape survives)
        parts = re.split(r"(\x1b\[[0-9;]*m)", s)
        return "".join(p if i % 2 else strip_controls(p) for i, p in enumerate(parts))
    # CSI (any parameter bytes: < = > ? too), OSC, and any other ESC sequence (ESC 7, ESC c,
    # ESC ( B: intermediates, then a final byte), as ECMA-48 shapes them
    # (and their one-character C1 forms, CSI U+009B and OSC U+009D, which some terminals honour)
    s = re.sub(r"(\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|(\x1b\]|\x9d)[^\x07\x1b\x9c]*(\x07|\x1b\\|\x9c)|\x1b[ -/]*[0-~]",
               "", s)
    s = s.replace("\r\n", "\n")
    return re.sub(_CONTROL, "", s)  # one pass in C: a 55 MB log took 7 s a character at a time
