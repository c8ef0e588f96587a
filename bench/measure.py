"""Timing of one child process: wall, user+sys CPU and peak RSS, on a quiet machine.

Wall time is ``perf_counter`` around the child; CPU time comes from the rusage that
``os.wait4`` returns (the child and every descendant it waited for).  Peak RSS cannot come
from that rusage: a child forked from this (large) Python process carries our RSS as its
high-water mark past ``exec``.  So peak RSS comes from ``/usr/bin/time -f %M``, whose child
is forked from a tiny process.  The wrapper costs about 1 ms, so runs that are timed to the
millisecond (no-op, start-up) run unwrapped and take their RSS from a wrapped warm-up run.
Foreign load is read from ``/proc/stat``: the machine's busy time during the run minus our
own and the child's CPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
PYCACHE = Path(tempfile.gettempdir()) / "buildtool-bench-pycache"
GNU_TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


@dataclass(slots=True)
class Sample:
    """One timed run of one tool."""

    wall: float
    cpu: float  # user + sys of the child and its waited-for descendants
    rss_kib: int  # -1: not measured in this run
    returncode: int
    foreign_cpu: float = 0.0  # CPU seconds used by other processes during the run
    retries: int = 0
    capped: bool = False  # killed at the per-run time limit

    def as_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


class RunFailed(RuntimeError):
    """A tool exited non-zero (or produced wrong outputs) in a timed run."""


def child_env() -> dict[str, str]:
    """The environment for tools: byte-code caching on, in a prefix outside the repo.

    This environment sets PYTHONDONTWRITEBYTECODE=1; left as is, every Python tool would
    compile its modules on each run and we would measure the compiler.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (from the first line of /proc/stat)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / HZ


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def wait_quiet(max_wait: float, threshold: float = 0.1, window: float = 0.25) -> float:
    """Wait until other processes use under ``threshold`` cores; returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait:
        b0, c0 = busy_seconds(), own_cpu()
        time.sleep(window)
        foreign = (busy_seconds() - b0) - (own_cpu() - c0)
        if foreign / window < threshold:
            break
    return time.perf_counter() - start


def run_once(argv: list[str], cwd: Path, timeout: float, rss: bool = True) -> tuple[Sample, str]:
    """Run ``argv`` once; returns the sample and the tail of its stderr.

    With ``rss`` (and GNU time installed) the child runs under ``/usr/bin/time -f %M``.
    """
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rss_file:
        wrapped = bool(rss and GNU_TIME)
        if wrapped:
            argv = [GNU_TIME, "-q", "-f", "%M", "-o", rss_file.name, *argv]
        b0, c0 = busy_seconds(), own_cpu()
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
        killed = threading.Event()
        timer = threading.Timer(timeout, _kill_group, (proc.pid, killed))
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        foreign = max(0.0, (busy_seconds() - b0) - cpu - (own_cpu() - c0))
        err.seek(0)
        tail = err.read()[-4000:].decode(errors="replace")
        peak = _read_rss(rss_file.read()) if wrapped else -1
    sample = Sample(wall, cpu, peak, proc.returncode, foreign, capped=killed.is_set())
    return sample, tail


def _read_rss(text: str) -> int:
    lines = text.strip().splitlines()
    try:
        return int(lines[-1])
    except (IndexError, ValueError):
        return -1


def _kill_group(pid: int, killed: threading.Event) -> None:
    killed.set()
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass(slots=True)
class Timer:
    """How to time runs: quiet-machine wait, retries of disturbed runs, per-run time limit."""

    quiet_wait: float = 10.0  # seconds at most to wait for a quiet machine; 0 = don't wait
    retries: int = 2  # redo a run disturbed by foreign load at most this many times
    limit: float = 300.0  # per-run time limit; a run over it is killed and "capped"

    def disturbed(self, s: Sample) -> bool:
        return s.foreign_cpu > 0.03 + 0.2 * s.wall

    def time(
        self,
        argv: list[str],
        cwd: Path,
        prepare: Callable[[], None] | None = None,
        verify: Callable[[], None] | None = None,
        rss: bool = True,
    ) -> Sample:
        """Time one run; ``prepare`` runs before each attempt, ``verify`` after it."""
        sample: Sample | None = None
        for attempt in range(self.retries + 1):
            if prepare:
                prepare()
            # Earlier runs' dirty pages (and this preparation's deletions) are written back
            # now, not during the timed run of whichever tool comes next.
            os.sync()
            if self.quiet_wait:
                wait_quiet(self.quiet_wait)
            sample, stderr = run_once(argv, cwd, self.limit, rss)
            sample.retries = attempt
            if sample.capped:
                return sample
            if sample.returncode != 0:
                msg = f"{' '.join(argv[:3])}... exited {sample.returncode} in {cwd}:\n{stderr}"
                raise RunFailed(msg)
            if verify:
                verify()
            if not self.disturbed(sample):
                break
        assert sample is not None
        return sample
