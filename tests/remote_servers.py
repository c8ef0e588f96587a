"""Real remote-cache servers for the tests, on 127.0.0.1: BuildGrid 0.4.4 (REAPI, cache only,
in memory) and nginx with WebDAV (Bazel's HTTP cache protocol).

BuildGrid is installed once with uv into ~/.cache/buildtool-test/bgd-venv (reused by later
runs); nginx comes from Debian (``apt-get install nginx-light``) when it is missing and we are
root.  Each server is started by pid, polled until it answers, and stopped by pid.  When a
server cannot be installed the caller skips with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

BGD_VERSION = "0.4.4"
VENV = Path(os.environ.get("BUILDTOOL_TEST_CACHE", Path.home() / ".cache" / "buildtool-test")) / "bgd-venv"
READY_TIMEOUT_S = 60.0


class Unavailable(Exception):
    """A server could not be installed or started; the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def _uv() -> str:
    uv = shutil.which("uv")
    if uv:
        return uv
    p = _run([sys.executable, "-m", "pip", "install", "-q", "uv"], 300)
    if p.returncode != 0:
        raise Unavailable(f"cannot install uv from PyPI: {p.stderr.strip()[-300:]}")
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not os.path.exists(uv):
        raise Unavailable("uv was installed but is not on PATH")
    return uv


def bgd_binary() -> str:
    """The ``bgd`` of a BuildGrid venv, installing it on first use (with psycopg2 for the
    execution set-up)."""
    bgd = VENV / "bin" / "bgd"
    if (VENV / ".complete").exists() and bgd.exists():
        return str(bgd)
    shutil.rmtree(VENV, ignore_errors=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    uv = _uv()
    p = _run([uv, "venv", "-q", "-p", sys.executable, str(VENV)], 300)
    if p.returncode != 0:
        raise Unavailable(f"uv venv failed: {p.stderr.strip()[-300:]}")
    env = {**os.environ, "VIRTUAL_ENV": str(VENV)}
    p = _run([uv, "pip", "install", "-q", "--compile-bytecode", f"buildgrid=={BGD_VERSION}", "psycopg2-binary"],
             600, env)
    if p.returncode != 0 or not bgd.exists():
        raise Unavailable(f"cannot install buildgrid=={BGD_VERSION} with uv: {p.stderr.strip()[-300:]}")
    (VENV / ".complete").write_text(BGD_VERSION)
    return str(bgd)


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path, workdir: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log
        self.workdir = workdir

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


BGD_CACHE_YML = """\
server: [!channel {{address: "127.0.0.1:{port}", insecure-mode: true}}]
storages: [!lru-storage &cas {{size: 1GB}}]
instances:
  - name: ""
    services:
      - !cas {{storage: *cas}}
      - !bytestream {{storage: *cas, stream-blob: false}}
      - !action-cache {{cache: !lru-action-cache {{storage: *cas, max-cached-refs: 10000}}}}
"""


def grpc_ready(url: str, deadline: float, proc: subprocess.Popen[bytes]) -> None:
    """Poll Capabilities.GetCapabilities until it answers."""
    import grpc

    from buildtool.remote.options import parse_endpoint
    from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
    from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2_grpc as re_grpc

    ep = parse_endpoint(url)
    with grpc.insecure_channel(ep.target) as chan:
        stub = re_grpc.CapabilitiesStub(chan)
        while True:
            if proc.poll() is not None:
                raise Unavailable(f"the server exited with status {proc.returncode}")
            try:
                stub.GetCapabilities(re_pb2.GetCapabilitiesRequest(), timeout=2)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise Unavailable(f"{url} did not answer GetCapabilities within {READY_TIMEOUT_S:g}s") from None
                time.sleep(0.2)


def start_bgd(bgd: str, workdir: Path, name: str, config: str, port: int, what: str) -> Server:
    """Start ``bgd server`` with ``config`` (written to ``workdir/name.yml``) and wait until
    it answers GetCapabilities on ``port``."""
    cfg = workdir / f"{name}.yml"
    cfg.write_text(config)
    log = workdir / f"{name}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([bgd, "server", "start", str(cfg)], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=workdir)
    server = Server(proc, f"grpc://127.0.0.1:{port}", log, workdir)
    try:
        grpc_ready(server.url, time.monotonic() + READY_TIMEOUT_S, proc)
    except Unavailable as e:
        server.stop()
        raise Unavailable(f"{what}: {e}\n{server.log_tail()}") from None
    return server


def start_buildgrid_cache(workdir: Path) -> Server:
    bgd = bgd_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    return start_bgd(bgd, workdir, "buildgrid-cache", BGD_CACHE_YML.format(port=port), port, f"BuildGrid {BGD_VERSION}")


# Under /locked/ the cache asks for HTTP basic authentication with these credentials.
NGINX_USER, NGINX_PASSWORD = "ci", "s3cret+/@"  # nginx ends a password at ":"

NGINX_CONF = """\
worker_processes 1;
pid nginx.pid;
error_log stderr warn;
{user}
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path tmp;
    proxy_temp_path tmp; fastcgi_temp_path tmp; uwsgi_temp_path tmp; scgi_temp_path tmp;
    sendfile on;
    types {{ }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root cache;
        client_max_body_size 0;
        location ~ "^/locked/(ac|cas)/[0-9a-f]{{64}}$" {{
            auth_basic "cache";
            auth_basic_user_file {workdir}/htpasswd;
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            limit_except GET HEAD PUT {{ deny all; }}
        }}
        location ~ "^/full/(.+/)?((ac|cas)/[0-9a-f]{{64}})$" {{  # reads /PREFIX/..., a PUT fails as on a full disk
            alias {workdir}/cache/$1$2;
            if ($request_method = PUT) {{ return 500; }}
        }}
        location ~ "^/readonly/(.+/)?((ac|cas)/[0-9a-f]{{64}})$" {{  # reads /PREFIX/..., refuses PUT (403)
            alias {workdir}/cache/$1$2;
            limit_except GET HEAD {{ deny all; }}
        }}
        location ~ "^/(.+/)?(ac|cas)/[0-9a-f]{{64}}$" {{
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            limit_except GET HEAD PUT {{ deny all; }}
        }}
        location / {{ return 404; }}
    }}
}}
"""


def nginx_binary() -> str:
    for cand in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if cand and os.path.exists(cand):
            return cand
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable("nginx is not installed and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for pkg in ("nginx-light", "nginx"):
        p = _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", pkg], 600, env)
        if p.returncode != 0:
            _run(["apt-get", "update", "-q"], 600, env)
            p = _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", pkg], 600, env)
        if p.returncode == 0 and os.path.exists("/usr/sbin/nginx"):
            return "/usr/sbin/nginx"
    raise Unavailable(f"apt-get install nginx-light/nginx failed: {p.stderr.strip()[-300:]}")


def start_nginx(workdir: Path) -> Server:
    nginx = nginx_binary()
    (workdir / "cache").mkdir(parents=True, exist_ok=True)
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = workdir / "nginx.conf"
    (workdir / "htpasswd").write_text(f"{NGINX_USER}:{{PLAIN}}{NGINX_PASSWORD}\n")
    conf.write_text(NGINX_CONF.format(port=port, user="user root;" if os.geteuid() == 0 else "", workdir=workdir))
    log = workdir / "nginx.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([nginx, "-p", f"{workdir}/", "-c", str(conf), "-e", "stderr", "-g", "daemon off;"],
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    server = Server(proc, f"http://127.0.0.1:{port}", log, workdir)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise Unavailable(f"nginx exited with status {proc.returncode}:\n{server.log_tail()}")
        try:
            urllib.request.urlopen(f"{server.url}/cas/{'0' * 64}", timeout=2)
        except urllib.error.HTTPError:
            return server  # 404: it answers
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise Unavailable(f"nginx did not answer within {READY_TIMEOUT_S:g}s:\n{server.log_tail()}") from None
            time.sleep(0.1)
        else:
            return server


class TcpProxy:
    """A TCP relay on 127.0.0.1 in front of a real server, whose open connections a test can
    cut (``cut``) while it keeps accepting new ones: a network blip between client and server."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"grpc://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cut_count = 0  # connections cut so far
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self._lock:
            socks, self._open = self._open, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.cut_count += len(socks) // 2

    def close(self) -> None:
        self.listener.close()
        self.cut()
