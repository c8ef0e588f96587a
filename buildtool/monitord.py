"""File monitor daemon: watches a workspace with inotify and answers the questions of its
client (monitor.py, which has the whole contract) on a Unix socket.

Run as ``python -m buildtool.monitord ROOT [IDLE_S]`` by ``monitor.start``.  Linux only
(inotify, through ctypes: watchdog hides queue overflows and holds some events back, and
the sync needs every event in kernel order on one thread).
"""

from __future__ import annotations

import os
import sys

from buildtool.monitor import IDLE_EXIT_S, PIDFILE, PROTOCOL, install_tag, read_line, socket_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

COOKIE = "monitor-cookie."
SYNC_TIMEOUT_S = 1.5  # the monitor's limit on a sync (a backlog of events after a big build)

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_ISDIR = 0x40000000
FILE_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF | IN_DONT_FOLLOW
WATCH_MASK = FILE_MASK | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ONLYDIR
NAMING = IN_CREATE | IN_MOVED_TO | IN_ATTRIB | IN_CLOSE_WRITE  # events after which a name is looked at
ANCESTOR_MASK = IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR  # only the directory itself moving or going
GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED
ENOENT, ENOTDIR = 2, 20
LIMITS = (28, 24, 12)  # ENOSPC, EMFILE, ENOMEM: the OS's watch limits


def _unescape(field: bytes) -> bytes:
    """A /proc/self/mountinfo path field: ``\\040`` (space), ``\\011``, ``\\012``, ``\\134`` as bytes."""
    if b"\\" not in field:
        return field
    import re

    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field)


class Exit(Exception):
    """The monitor must stop (asked to, idle, or its workspace went away)."""


class Monitor:
    """The daemon's state: the inotify descriptor, the watched directories and the count."""

    def __init__(self, root: str, state_dir: str) -> None:
        import ctypes
        import secrets

        self.root = root
        self.state_dir = state_dir
        self.token = secrets.token_hex(8)
        self.install = install_tag()  # (as it started: an upgrade meanwhile is another install)
        self.gen = 0
        self.unsure = ""  # why "unchanged" cannot be vouched for ("" when it can)
        self.overflows = 0
        self.cookies = 0
        self.vouched = 0  # "unchanged" answers given
        self.seen_cookie = ""
        self.dirs: dict[int, str] = {}  # watch descriptor -> directory, or hard-linked file (absolute)
        self.file_wds: set[int] = set()  # the hard-linked files among them
        self.links: set[str] = set()  # the symbolic links seen in the workspace (absolute)
        self.link_checks = 0  # links checked so far (one more appeared since ``links_checked_at``:
        self.links_checked_at = 0  # every link is checked again before the next answer)
        self.moved_out: set[int] = set()  # cookies of names moved away, their arrival not seen yet
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._ctypes = ctypes
        fd = self._libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1: " + os.strerror(ctypes.get_errno()))
        self.fd = fd
        # Not watched: the tool's own state, and git's (every `git status` rewrites .git/index;
        # noop.py stats the few .git files a BUILD.py may have read itself).
        self.skip = {state_dir, os.path.join(root, ".git")}
        self.state_wd = self._watch(state_dir)
        # The root's ancestors, for their own moves only: paths here are absolute, and a
        # renamed parent would make every one of them wrong without an event in the tree.
        self.ancestors: set[int] = set()
        up = root
        while os.path.dirname(up) != up:
            up = os.path.dirname(up)
            try:
                self.ancestors.add(self._watch(up, ANCESTOR_MASK, record=False))
            except OSError as e:
                self.unsure = f"cannot watch the parent directory {up}: {e.strerror}"
        self.root_wd = -1
        # A filesystem mounted over a directory of the workspace is no inotify event: the
        # kernel's mount table is watched instead (POLLPRI on /proc/self/mountinfo).
        self.mounts_fd: int | None = None
        try:
            self.mounts_fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.unsure = "cannot watch the mount table (/proc/self/mountinfo)"
        self.mounts = self._mounts_inside()
        self.add_tree(root)
        self.root_wd = next(wd for wd, d in self.dirs.items() if d == root)
        self.links_checked_at = self.link_checks  # (all of them checked just now, by the listing)

    def _mounts_inside(self) -> frozenset[tuple[bytes, str]]:
        """The mounts at or below the root, each as (its mount ID, its point): a mount
        stacked on an existing mount point, or an unmount and a mount between two looks,
        leaves the points as they were, not the IDs.  (Reading the table to its end
        re-arms its POLLPRI.)"""
        fd = self.mounts_fd
        if fd is None:
            return frozenset()
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        root = os.fsencode(self.root)
        out = set()
        for line in b"".join(chunks).split(b"\n"):
            fields = line.split(b" ")
            if len(fields) > 4:  # (the 5th: the mount point, with space, tab, \n and \\ as octal escapes)
                point = _unescape(fields[4])
                if point == root or point.startswith(root + b"/"):
                    out.add((fields[0], os.fsdecode(point)))
        return frozenset(out)

    def check_mounts(self, signalled: bool = False) -> None:
        """A mount or unmount since the last look: one inside the workspace is a change
        (every directory is watched again, those of the new filesystem too, as after an
        overflow).  ``signalled``: the main loop's poll reported it (a poll takes the
        signal: asking again would find nothing)."""
        if self.mounts_fd is None:
            return
        if not signalled:
            import select

            poller = select.poll()
            poller.register(self.mounts_fd, select.POLLPRI)
            if not poller.poll(0):
                return
        now = self._mounts_inside()
        if now != self.mounts:
            self.mounts = now
            self.gen += 1
            self._add_tree_or_give_up(self.root)

    def _watch(self, path: str, mask: int = WATCH_MASK, record: bool = True) -> int:
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = self._ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        if record:
            self.dirs[wd] = path
        return wd

    def add_tree(self, top: str) -> None:
        """Watch ``top`` and every directory below it (the watch first, then the listing:
        a directory created in between is reported by the watch or found by the listing)."""
        stack = [top]
        while stack:
            d = stack.pop()
            if d in self.skip:
                continue
            try:
                self._watch(d)
            except OSError as e:
                if d == top == self.root or e.errno in LIMITS:
                    raise
                if e.errno not in (ENOENT, ENOTDIR):  # (gone already: its deletion or move is an event)
                    self.unsure = f"cannot watch {os.path.relpath(d, self.root)}: {e.strerror}"
                continue
            try:
                with os.scandir(d) as it:
                    entries = list(it)
            except FileNotFoundError:
                continue  # it went away before it was listed: an event
            except OSError as e:
                if e.errno in LIMITS:
                    raise
                self.unsure = f"cannot list {os.path.relpath(d, self.root)}: {e.strerror}"
                continue
            for e in entries:  # each on its own: one entry gone meanwhile must not end the listing
                try:
                    if e.is_symlink():
                        self._check_link(e.path)
                    elif e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        self._check_file(e.path, e.stat(follow_symlinks=False).st_nlink)
                except FileNotFoundError:
                    continue  # gone meanwhile: its deletion is an event
                except OSError as err:
                    self.unsure = f"cannot inspect {os.path.relpath(e.path, self.root)}: {err.strerror}"

    def _add_tree_or_give_up(self, top: str) -> None:
        """``add_tree`` for a directory that appeared; at the OS's watch limit the monitor
        stops vouching (a directory it cannot watch could change unseen)."""
        try:
            self.add_tree(top)
        except OSError as e:
            self.unsure = f"cannot watch {os.path.relpath(top, self.root)}: {e.strerror or e}"

    def _check_link(self, path: str) -> None:
        """A symbolic link whose resolution passes through anything the monitor does not
        watch (out of the workspace, .git, .buildtool, another link out there) could hide
        a change: no more vouching."""
        self.links.add(path)
        self.link_checks += 1
        try:
            ok = self._resolves_inside(path)
        except OSError:
            ok = False  # it changed while resolved: be safe
        if not ok:
            self.unsure = f"{os.path.relpath(path, self.root)} is a symbolic link to where the monitor does not watch"

    def _watched(self, path: str) -> bool:
        inside = path == self.root or path.startswith(self.root + os.sep)
        return inside and not any(path == d or path.startswith(d + os.sep) for d in self.skip)

    def _resolves_inside(self, link: str) -> bool:
        """Whether resolving ``link`` component by component, as the kernel does, visits
        only watched paths, or the root's own ancestors on the way down to it (real
        directories, watched for their moves).  A missing component ends the resolution
        there: creating it later is an event in a watched directory."""
        todo = os.readlink(link).split("/")
        cur = "/" if todo[0] == "" else os.path.dirname(link)
        hops, missing = 0, False
        while todo:
            part = todo.pop(0)
            if part in ("", "."):
                continue
            cur = os.path.dirname(cur) if part == ".." else os.path.join(cur, part)
            if not (self._watched(cur) or cur == "/" or self.root.startswith(cur + os.sep)):
                return False
            if missing:
                continue  # the rest is resolved by name: each step must still be watched
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                missing = True
                continue
            if st.st_mode & 0o170000 == 0o120000:  # S_IFLNK: continue with its target
                hops += 1
                if hops > 40:
                    return False
                target = os.readlink(cur).split("/")
                todo = target + todo
                cur = "/" if target[0] == "" else os.path.dirname(cur)
        return self._watched(cur)  # (an ancestor of the root is fine on the way, not as the end)

    def _check_file(self, path: str, nlink: int) -> None:
        """A file with more than one hard link can be written through another name, in a
        directory not watched: watch the file itself (one watch per file, however often
        it is named).  The watch stays until the file is deleted everywhere: its other
        names, in the workspace or not, are not known."""
        if nlink > 1:
            try:
                self.file_wds.add(self._watch(path, FILE_MASK))
            except FileNotFoundError:
                pass  # gone again: an event
            except OSError as e:
                self.unsure = f"cannot watch {os.path.relpath(path, self.root)}: {e.strerror}"

    def read_events(self) -> None:
        """Read and count every queued event."""
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            i = 0
            while i + 16 <= len(buf):
                wd = int.from_bytes(buf[i : i + 4], sys.byteorder, signed=True)
                mask = int.from_bytes(buf[i + 4 : i + 8], sys.byteorder)
                cookie = int.from_bytes(buf[i + 8 : i + 12], sys.byteorder)
                n = int.from_bytes(buf[i + 12 : i + 16], sys.byteorder)
                name = os.fsdecode(buf[i + 16 : i + 16 + n].rstrip(b"\0"))
                i += 16 + n
                if mask & (IN_MOVED_FROM | IN_MOVED_TO) and self._in_watched_tree(wd, name):
                    if mask & IN_MOVED_FROM:
                        self.moved_out.add(cookie)
                    else:
                        self.moved_out.discard(cookie)
                self._event(wd, mask, name)

    def _in_watched_tree(self, wd: int, name: str) -> bool:
        """Whether ``name`` in the directory of ``wd`` is part of the tree the monitor
        watches: not the state directory's own entries (its atomic writes move names within
        it all the time), nor ``.buildtool``/``.git`` at the root (a name moved there has
        left the watched tree as surely as one moved out of the workspace)."""
        return wd != self.state_wd and not (wd == self.root_wd and name in (".buildtool", ".git"))

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:  # events were lost: count that, and watch every directory again
            self.gen += 1
            self.overflows += 1
            self._add_tree_or_give_up(self.root)
            return
        if wd in self.ancestors:
            if mask & GONE:
                raise Exit("a parent directory of the workspace moved or went away")
            return
        if wd == self.state_wd:
            if mask & GONE:
                raise Exit("the state directory went away")
            if name.startswith(COOKIE):
                self.seen_cookie = name
            return
        d = self.dirs.get(wd)
        if d is None:
            return
        if mask & IN_IGNORED:
            del self.dirs[wd]
            self.file_wds.discard(wd)
        if mask & IN_UNMOUNT:
            self.unsure = f"a filesystem was unmounted from {os.path.relpath(d, self.root)}"
        if wd == self.root_wd and mask & GONE:
            raise Exit("the workspace root went away")
        if wd == self.root_wd and name in (".buildtool", ".git"):
            if name == ".buildtool" and mask & (IN_DELETE | IN_MOVED_FROM):
                raise Exit("the state directory went away")
            if name == ".git" and mask & (IN_CREATE | IN_MOVED_TO):
                self.gen += 1  # a new repository: the no-op stats what a BUILD.py read in it
            return
        self.gen += 1
        # Whatever names an entry made, replaced, touched or closed after writing: a file
        # with another link (made from outside, or by a rename over it) is watched itself.
        if name and mask & NAMING and not (mask & IN_ISDIR and not mask & (IN_CREATE | IN_MOVED_TO)):
            path = os.path.join(d, name)
            if mask & IN_ISDIR:
                self._add_tree_or_give_up(path)  # (links in a directory moved in count as appearing)
                return
            try:
                st = os.lstat(path)
            except OSError:
                return  # gone again: an event
            if st.st_mode & 0o170000 == 0o120000:  # S_IFLNK
                self._check_link(path)
            elif st.st_mode & 0o170000 == 0o100000:  # S_IFREG
                self._check_file(path, st.st_nlink)

    def recheck_hard_links(self) -> None:
        """After names left the workspace (a move with no arrival in it): every file again.
        A name made and moved out before its creation was read could not be looked at; if
        it was a hard link, a file in the workspace now has a name outside, unwatched."""
        self.moved_out.clear()
        self._add_tree_or_give_up(self.root)

    def recheck_links(self) -> None:
        """After a link appeared: every known link again.  A link resolved through a
        missing component was followed by name from there (``x/../f`` as ``f``); a link
        made later at ``x`` changes where it leads."""
        for link in list(self.links):
            if not os.path.islink(link):
                self.links.discard(link)
                continue
            self._check_link(link)
        self.links_checked_at = self.link_checks

    def sync(self, select_mod: object) -> bool:
        """Make sure every change made before now has been counted (see the module doc)."""
        import time

        self.cookies += 1
        name = f"{COOKIE}{os.getpid()}.{self.cookies}"
        path = os.path.join(self.state_dir, name)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
        except OSError:
            return False
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        try:
            poller = select_mod.poll()  # type: ignore[attr-defined]
            poller.register(self.fd, 1)
            while self.seen_cookie != name:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if poller.poll(left * 1000):
                    self.read_events()
            return True
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass

    def status(self) -> dict[str, object]:
        return {"pid": os.getpid(), "root": self.root, "token": self.token, "generation": self.gen,
                "directories": len(self.dirs) - len(self.file_wds), "files": len(self.file_wds),
                "overflows": self.overflows,
                "unsure": self.unsure,
                "vouched": self.vouched, "protocol": PROTOCOL, "install": self.install}

    def answer(self, line: str, select_mod: object) -> str:
        parts = line.split(" ")
        if parts == ["status"]:
            import json

            return json.dumps(self.status())
        if parts == ["stop"]:
            raise Exit("stopping")
        if len(parts) == 5 and parts[0] == "since" and parts[3] == str(PROTOCOL) and parts[4] == self.install:
            synced = self.sync(select_mod)
            self.check_mounts()
            if self.link_checks != self.links_checked_at:
                self.recheck_links()
            if self.moved_out and synced:  # (the arrival of a move is read by the sync too)
                self.recheck_hard_links()
            try:
                same = parts[1] == self.token and int(parts[2]) == self.gen
            except ValueError:
                same = False
            unchanged = synced and same and not self.unsure
            self.vouched += unchanged
            return f"ok {self.token} {self.gen} {0 if unchanged else 1} {PROTOCOL} {self.install} {self.root}"
        return "error unknown request"


def serve(root: str, idle_exit_s: float) -> int:
    """The daemon's main loop (``python -m buildtool.monitord ROOT [IDLE_S]``)."""
    import fcntl
    import select
    import signal
    import socket
    import time

    state_dir = os.path.join(root, ".buildtool")

    def _term(_sig: int, _frame: object) -> None:
        raise Exit("terminated")

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    # One monitor per workspace: it holds this lock for its whole life (a second one, say
    # from a `start` while the first was stopped, would otherwise take over its socket).
    from buildtool.workspace import remove_if_not_a_file

    pid_path = os.path.join(state_dir, PIDFILE)
    remove_if_not_a_file(pid_path)  # (a named pipe, a directory: damaged state)
    if os.path.islink(pid_path):  # (planted: the pid written through it would overwrite what it leads to)
        try:
            os.unlink(pid_path)
        except FileNotFoundError:  # (another monitor starting did it)
            pass
    pid_fd = os.open(pid_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(pid_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        other = os.pread(pid_fd, 32, 0).decode(errors="replace").strip() or "?"
        print(f"buildtool monitor: another monitor (pid {other}) runs for {root}", file=sys.stderr, flush=True)
        return 2
    os.ftruncate(pid_fd, 0)
    os.pwrite(pid_fd, f"{os.getpid()}\n".encode(), 0)
    path = socket_path(state_dir)
    try:
        mon = Monitor(root, state_dir)
    except OSError as e:
        hint = " (raise /proc/sys/fs/inotify/max_user_watches)" if e.errno == 28 else ""
        print(f"buildtool monitor: cannot watch {root}: {e.strerror or e}{hint}", file=sys.stderr, flush=True)
        return 2
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path)  # a stale socket of a monitor that died (the lock says none runs)
    except OSError:
        pass
    old = os.umask(0o177)
    try:
        srv.bind(path)
    except OSError as e:
        what = "a directory is in the way" if os.path.isdir(path) else (e.strerror or str(e))
        print(f"buildtool monitor: cannot listen at {path}: {what}", file=sys.stderr, flush=True)
        return 2
    finally:
        os.umask(old)
    bound = os.stat(path).st_ino
    srv.listen(16)
    print(f"buildtool monitor: pid {os.getpid()} watching {len(mon.dirs)} directories of {root}",
          file=sys.stderr, flush=True)
    poller = select.poll()
    poller.register(mon.fd, select.POLLIN)
    poller.register(srv.fileno(), select.POLLIN)
    if mon.mounts_fd is not None:
        poller.register(mon.mounts_fd, select.POLLPRI)
    last = time.monotonic()
    why = "?"
    try:
        while True:
            left = idle_exit_s - (time.monotonic() - last)
            if left <= 0:
                raise Exit(f"idle for {idle_exit_s:.0f} s")
            ready = poller.poll(min(left, 3600.0) * 1000)
            if any(fd == mon.mounts_fd for fd, _ev in ready):  # (first: a request in the same poll is
                mon.check_mounts(signalled=True)  # answered after it, and its own poll would find nothing)
            for fd, _ev in ready:
                if fd == mon.fd:
                    mon.read_events()
                elif fd != mon.mounts_fd:
                    last = time.monotonic()
                    _serve_one(mon, srv, select)
    except Exit as e:
        why = str(e)
    except Exception as e:  # a bug: say so in the log; builds fall back to stat meanwhile
        import traceback

        traceback.print_exc()
        why = f"internal error: {e!r}"
    finally:
        try:
            if os.stat(path).st_ino == bound:  # (after a clean, a new monitor may own the path)
                os.unlink(path)
        except OSError:
            pass
        srv.close()
    print(f"buildtool monitor: exiting: {why}", file=sys.stderr, flush=True)
    return 0


def _serve_one(mon: Monitor, srv: Any, select_mod: object) -> None:
    """Accept one connection and answer its request; a client that went away or never
    spoke costs at most a second.  ``Exit`` (stop, or the workspace went away during a
    sync) propagates whether or not the client could be told."""
    import time

    try:
        conn, _ = srv.accept()
    except OSError:  # out of descriptors (the connection stays queued: no busy loop), or gone
        time.sleep(0.05)
        return
    with conn:
        try:
            line = read_line(conn, time.monotonic() + 1.0, 65536)
        except OSError:
            return
        if line is None:
            return
        try:
            reply = mon.answer(line, select_mod)
        except Exit:
            try:
                conn.sendall(b"stopping\n")
            except OSError:
                pass
            raise
        try:
            conn.sendall(reply.encode("utf-8", "surrogateescape") + b"\n")
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(serve(os.path.realpath(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else IDLE_EXIT_S))
