"""File monitor client: asks a workspace's file monitor, an optional per-workspace daemon
(monitord.py), whether anything under the workspace changed since a given point, so that a
no-op check need not stat every file; starts, stops and queries that daemon.

``buildtool monitor start`` runs it in the background (``stop``, ``status``).  It watches
every directory of the workspace with inotify (``.buildtool/`` and ``.git/`` excepted) and counts the
events: the count is the *generation*.  A client asks ``since TOKEN GEN``; the monitor
first *syncs* (creates a cookie file in ``.buildtool/`` and reads events until the
cookie's own event arrives: inotify queues events in order, so every change made before
the question was asked has been counted), then answers its token, the current generation
and whether anything changed since ``GEN`` (a token from another monitor run always
counts as changed).  The no-op check (noop.py) stores the token and generation it took
*before* a full stat pass that found nothing changed; while later answers say "unchanged",
a no-op costs one round trip instead of one stat per file.

What the monitor cannot see makes it answer "changed" (the caller then stats as without
it): a symbolic link in the workspace that leads outside it (or nowhere), and events it
lost (a queue overflow: every directory is watched again, and the generation moves).
Changes it cannot see at all: files written through a shared ``mmap`` (no inotify event)
and changes made by another machine on a network filesystem.  docs/monitor.md has the
whole contract; the wire format is in docs/formats.md#file-monitor--buildtoolmonitorsock-and-buildtoolnoop-clock.

This module is the client side, on the no-op path wherever a monitor runs, so it stays
small: the daemon itself (inotify, the sync, the answers) is monitord.py, which ``start`` runs.
"""

from __future__ import annotations

import os
import stat
import sys

from buildtool.noop import MONITOR_SOCKET as SOCKET  # (noop.py checks it exists before importing this)
from buildtool.workspace import remove_if_not_a_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOG = "monitor.log"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL
IDLE_EXIT_S = 3 * 3600.0  # a monitor nobody asked for this long exits (like Bazel's server)
ASK_TIMEOUT_S = 2.0  # the client's limit on a whole request: a stopped monitor costs a build this much
PIDFILE = "monitor.pid"
# The request and answer formats (docs/formats.md).  2: ``since`` names it, and a monitor of
# another protocol (one an older buildtool started, with the blind spots fixed since) is
# no monitor to this client: asked with it, such a monitor answers an error.  3: ``since``
# and its answer name the install too (install_tag): a monitor that went on running across
# an upgrade of the same protocol vouched with the old code's blind spots.
PROTOCOL = 3


def install_tag() -> str:
    """The monitor's code as a monitor and its clients compare it: the checksum of its two
    source files (this one and monitord.py), read as they are now; the monitor takes it
    when it starts.  Not the package directory's identity: a checkout and its install
    hold the same code in two places, and an editable install's directory changes with
    any file added to it."""
    from buildtool.noop import _clock_sum  # (builtins only: binascii's import is a no-op's 0.3 ms)

    here = os.path.dirname(os.path.abspath(__file__))
    code = b""
    for name in ("monitor.py", "monitord.py"):
        try:
            with open(os.path.join(here, name), "rb") as f:
                code += f.read()
        except OSError:
            return "none"
    return f"{_clock_sum(code):08x}"


def socket_path(state_dir: str) -> str:
    return os.path.join(state_dir, SOCKET)


def _ask(state_dir: str, line: str, timeout: float = ASK_TIMEOUT_S) -> str | None:
    """Send one request line, return the answer line; None if no monitor answers within
    ``timeout`` in all.  ``_socket``, not ``socket``: the no-op path does without ``enum``."""
    import _socket
    import time

    deadline = time.monotonic() + timeout
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(socket_path(state_dir))
        s.sendall(line.encode("utf-8", "surrogateescape") + b"\n")  # (read_line's decoding: a path's bytes)
        return read_line(s, deadline)
    except (OSError, UnicodeError):
        return None
    finally:
        s.close()


def read_line(conn: Any, deadline: float, limit: int = 1 << 20) -> str | None:
    """One line from a socket, read before ``deadline`` (None: not in time, the peer
    closed first, or more than ``limit`` bytes): neither side can hold the other."""
    import time

    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > limit:
            return None
        conn.settimeout(left)
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    return data.decode("utf-8", "surrogateescape").rstrip("\n")


class Answer:
    """The monitor's answer to ``since``: its token, the generation after the sync, and
    whether anything changed since the generation asked about."""

    __slots__ = ("changed", "gen", "token")

    def __init__(self, token: str, gen: int, changed: bool) -> None:
        self.token = token
        self.gen = gen
        self.changed = changed


def since(state_dir: str, root: str, token: str, gen: int) -> Answer | None:
    """Ask the workspace's monitor what changed since (token, gen); None without one."""
    install = install_tag()
    got = _ask(state_dir, f"since {token} {gen} {PROTOCOL} {install}")
    if got is None:
        return None
    parts = got.split(" ", 6)
    if len(parts) != 7 or parts[0] != "ok" or parts[3] not in ("0", "1") or parts[4] != str(PROTOCOL) \
            or parts[5] != install or parts[6] != root:
        return None  # a monitor of another root (a copied .buildtool), another protocol or install
    try:
        return Answer(parts[1], int(parts[2]), parts[3] == "1")
    except ValueError:
        return None


def same_install(info: dict[str, object]) -> bool:
    """Whether the monitor whose status is ``info`` speaks this protocol and runs this
    install's code (else no build asks it, and ``start`` replaces it)."""
    return info.get("protocol") == PROTOCOL and info.get("install") == install_tag()


def status(state_dir: str) -> dict[str, object] | None:
    got = _ask(state_dir, "status", 2.0)
    if got is None:
        return None
    import json

    try:
        info = json.loads(got)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def stop(state_dir: str, timeout: float = 2.0) -> bool:
    """Ask the monitor to exit; True if one was running (and answered within ``timeout``:
    one that does not, stopped with SIGSTOP, reads the request when it runs again)."""
    return _ask(state_dir, "stop", timeout) == "stopping"


def holder(state_dir: str, root: str | None = None) -> int | None:
    """The pid of a monitor process that holds this workspace's lock (running or not
    answering), or None.  ``root``: only a monitor of that workspace (a copy made with
    ``cp -al`` shares the lock file with the original, whose monitor is not the copy's)."""
    pid = _lock_holder(state_dir)
    if pid is None or root is None:
        return pid
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return pid  # (no /proc to tell by: taken as this workspace's, as before)
    if argv[1:3] == [b"-m", b"buildtool.monitord"] and len(argv) > 3 and os.fsdecode(argv[3]) != root:
        return None
    return pid


def _lock_holder(state_dir: str) -> int | None:
    import fcntl

    try:  # (O_NONBLOCK: a named pipe there is no wait for a writer)
        fd = os.open(os.path.join(state_dir, PIDFILE), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdecimal() else None
        return None  # nobody holds it
    finally:
        os.close(fd)


def start(root: str, state_dir: str, idle_exit_s: float = IDLE_EXIT_S) -> dict[str, object]:
    """Start the monitor for ``root`` in the background and wait until it answers; its
    status.  Raises UserError when it cannot run here, with the reason."""
    import subprocess
    import time

    from buildtool.errors import UserError

    info = status(state_dir)
    if info is not None and info.get("root") != root:
        # .buildtool/ was copied with hard links (cp -al): the socket and the lock are the
        # original workspace's monitor's.  This workspace's names for them go; it stays.
        for name in (SOCKET, PIDFILE):
            try:
                os.unlink(os.path.join(state_dir, name))
            except OSError:
                pass
        info = None
    if info is not None and not same_install(info):  # (an older buildtool's: replaced)
        stop(state_dir)
        deadline = time.monotonic() + 10.0  # (gone when it no longer answers nor holds the lock)
        while (status(state_dir) is not None or _lock_holder(state_dir) is not None) and time.monotonic() < deadline:
            time.sleep(0.05)
        info = None
    if info is not None:
        info["already"] = True
        return info
    if not sys.platform.startswith("linux"):
        raise UserError(f"the file monitor needs Linux inotify; this is {sys.platform}")
    if len(os.fsencode(socket_path(state_dir))) > MAX_SOCKET_PATH:  # (a non-UTF-8 workspace path: its bytes)
        raise UserError(f"the monitor's socket path {socket_path(state_dir)} is longer than the "
                        f"{MAX_SOCKET_PATH} bytes a Unix socket allows; move the workspace to a shorter path")
    os.makedirs(state_dir, exist_ok=True)
    log = os.path.join(state_dir, LOG)
    remove_if_not_a_file(log)  # (a named pipe there: the open would wait for a reader)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "buildtool.monitord", root, str(idle_exit_s)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True,
            cwd="/",  # holds no directory busy, and ``-m`` puts no user directory on sys.path
        )
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"the file monitor exited at start ({_tail(log)}); log: {log}")
        info = status(state_dir)
        if info is not None:
            return info
        time.sleep(0.02)
    proc.kill()
    raise UserError(f"the file monitor did not answer within 60 s; log: {log}")


def _tail(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no message"
