"""Real remote-execution stack for the tests, on 127.0.0.1: a throw-away PostgreSQL (Debian's
``postgresql`` package), BuildGrid 0.4.4 with the execution services, and ``buildtool worker``
processes.

Everything is started by pid, polled until it answers and stopped by pid.  When PostgreSQL or
BuildGrid cannot be installed or started the caller skips with the reason (``Unavailable``).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from remote_servers import Server, Unavailable, _run, bgd_binary, free_port, start_bgd

BGD_EXEC_YML = """\
# Each bot session holds a gRPC thread in its long poll and each client Execute stream one
# more: the default pool (5 x CPUs) is too small for 4 bot slots + 6 remote jobs on 2 CPUs.
thread-pool-size: 64
server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
  method: none
connections:
  - !sql-connection &sql
    connection-string: {db}
    pool-size: 5
    max-overflow: 5
storages:
  - !lru-storage &cas
    size: 1GB
caches:
  - !lru-action-cache &ac
    storage: *cas
    max-cached-refs: 10000
    allow-updates: true
    cache-failed-actions: false
  # BuildGrid's default, kept by instance FAILURES_CACHED: a failed action is answered from the cache
  - !lru-action-cache &ac2
    storage: *cas
    max-cached-refs: 1000
    allow-updates: true
    cache-failed-actions: true
schedulers:
  - !sql-scheduler &sched
    sql: *sql
    storage: *cas
    action-cache: *ac
    bot-session-keepalive-timeout: 30
  - !sql-scheduler &sched2
    sql: *sql
    storage: *cas
    action-cache: *ac2
    bot-session-keepalive-timeout: 30
instances:
  - name: "failures-cached"
    services:
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
        stream-blob: false
      - !action-cache
        cache: *ac2
      - !execution
        scheduler: *sched2
  - name: ""
    services:
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
        stream-blob: false
      - !action-cache
        cache: *ac
      - !execution
        scheduler: *sched
"""


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable("PostgreSQL is not installed and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"]
    p = _run(argv, 600, env)
    if p.returncode != 0:
        _run(["apt-get", "update", "-q"], 600, env)
        p = _run(argv, 600, env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if p.returncode != 0 or not found:
        raise Unavailable(f"apt-get install postgresql failed: {p.stderr.strip()[-300:]}")
    return Path(found[-1]).parent


class Postgres:
    """A throw-away cluster in ``workdir/pg`` (trust auth, user bgd, database bgd)."""

    def __init__(self, workdir: Path) -> None:
        self.bin = _pg_bin()
        self.dir = workdir / "pg"
        self.port = free_port()
        self.url = f"postgresql+psycopg2://bgd@127.0.0.1:{self.port}/bgd"
        self._as: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root
            self._as = ["runuser", "-u", "postgres", "--"]

    def _pg(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return _run([*self._as, str(self.bin / tool), *args], timeout)

    def start(self) -> None:
        self.dir.mkdir(parents=True)
        if self._as:
            shutil.chown(self.dir, "postgres", "postgres")
            os.chmod(self.dir.parent, 0o755)
            for parent in self.dir.parents:  # postgres must be able to reach its directory
                if str(parent) == "/":
                    break
                mode = os.stat(parent).st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)
        data = str(self.dir / "data")
        p = self._pg("initdb", "-D", data, "-U", "bgd", "--auth=trust", "-A", "trust")
        if p.returncode != 0:
            raise Unavailable(f"initdb failed: {(p.stderr or p.stdout).strip()[-400:]}")
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off"
        p = self._pg("pg_ctl", "-D", data, "-o", opts, "-l", str(self.dir / "pg.log"), "-w", "-t", "60", "start")
        if p.returncode != 0:
            raise Unavailable(f"pg_ctl start failed: {(p.stderr or p.stdout).strip()[-400:]}")
        p = self._pg("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "bgd", "bgd")
        if p.returncode != 0:
            self.stop()
            raise Unavailable(f"createdb failed: {(p.stderr or p.stdout).strip()[-400:]}")

    def stop(self) -> None:
        self._pg("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "-t", "30", "stop", timeout=60)


def start_buildgrid_exec(workdir: Path, pg: Postgres) -> Server:
    bgd = bgd_binary()
    p = _run([bgd, "migrate", "apply", pg.url], 120)
    if p.returncode != 0:
        raise Unavailable(f"bgd migrate apply failed: {(p.stderr or p.stdout).strip()[-400:]}")
    port = free_port()
    return start_bgd(bgd, workdir, "buildgrid-exec", BGD_EXEC_YML.format(port=port, db=pg.url), port,
                     "BuildGrid (execution)")


FAILURES_CACHED = "failures-cached"  # the instance whose action cache keeps failed actions (BuildGrid's default)
WORKER_PROBE = "BUILDTOOL_TEST_WORKER_ONLY"  # set for the worker process; an action must never see it


def start_worker(workdir: Path, url: str, n: int, capacity: int = 2, instance: str = "") -> Server:
    """``buildtool worker`` as a real subprocess (its log in workdir/worker-N.log)."""
    log = workdir / f"worker-{n}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "buildtool", "worker", "--server", url, "--capacity", str(capacity),
             "--work-dir", str(workdir / f"worker-{n}"), "--instance", instance],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, WORKER_PROBE: "the worker's own environment"},
        )
    return Server(proc, url, log, workdir)


def stop_gracefully(server: Server) -> None:
    """SIGTERM then SIGKILL (workers finish their current RPC and exit)."""
    if server.proc.poll() is None:
        try:
            os.killpg(server.proc.pid, signal.SIGTERM)
            server.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    server.stop()
