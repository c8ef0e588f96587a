"""Workspace: finding the root, the state directory and the ignore list.

The root is the nearest ancestor of the start directory that holds ``buildtool.toml``.
Per-workspace state lives in ``<root>/.buildtool/`` (see docs/formats.md).
"""

from __future__ import annotations

import os
import posixpath
import stat
import sys

TYPE_CHECKING = False  # the no-op path imports neither typing nor errors.py from here
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any, NoReturn

# The encoding this process gives the system names and command texts in, when it is not
# UTF-8 (a locale's: ISO-8859-1, ASCII); None under UTF-8.  `echo é` runs as other bytes
# under it, so it is in the action keys (runner) and what it cannot encode is refused (graph).
FS_ENCODING: str | None = None if sys.getfilesystemencoding().lower().replace("_", "-") in ("utf-8", "utf8") \
    else sys.getfilesystemencoding()

MARKER = "buildtool.toml"
BUILDFILE = "BUILD.py"  # a package's build file
STATE_DIR = ".buildtool"
IGNORE_FILE = ".buildtoolignore"
ALWAYS_SKIPPED = frozenset({".git", STATE_DIR, ".hg", ".svn"})
# A directory holding this file, starting with this signature, is a cache (the Cache
# Directory Tagging Specification, https://bford.info/cachedir/, honoured by tar, borg,
# restic): its files are no sources, and no BUILD.py below it is a package.  buildtool
# tags its own cache dir, so a cache kept inside a workspace stays out of glob() and //...
CACHEDIR_TAG = "CACHEDIR.TAG"
CACHEDIR_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"


def is_cache_tag(path: str) -> bool:
    """Is ``path`` a regular file (or a link to one) that starts with the cache directory
    signature?  (Opened without blocking: a FIFO of that name must not hang the load.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(CACHEDIR_SIGNATURE)) == CACHEDIR_SIGNATURE
    except OSError:
        return False
    finally:
        os.close(fd)


class Workspace:
    """A workspace root and the paths derived from it.  (A plain class, not a dataclass:
    the no-op fast path imports this module, and ``dataclasses`` costs ~12 ms to import.)"""

    __slots__ = ("_ignore_rx", "cwd_pkg_dir", "ignore_patterns", "root")

    def __init__(self, root: str, cwd_pkg_dir: str, ignore_patterns: tuple[str, ...]) -> None:
        self.root = root  # absolute, symlinks resolved
        self.cwd_pkg_dir = cwd_pkg_dir  # workspace-relative directory the user started in ("" for root)
        self.ignore_patterns = ignore_patterns
        self._ignore_rx: Any = None  # the patterns as one regex, made at the first question

    def __repr__(self) -> str:
        return f"Workspace(root={self.root!r}, cwd_pkg_dir={self.cwd_pkg_dir!r})"

    @property
    def state_dir(self) -> str:
        return os.path.join(self.root, STATE_DIR)

    def is_ignored(self, rel: str) -> bool:
        """True if the workspace-relative path is listed in .buildtoolignore, or is below a
        directory that is (by path or by pattern: ``*/fixtures`` leaves ``a/fixtures/sub``
        out too, as discovery never enters ``a/fixtures``; a label naming it was built)."""
        for pat in self.ignore_patterns:
            if rel == pat or rel.startswith(pat + "/"):
                return True
        if not self.ignore_patterns:
            return False
        rx = self._ignore_rx
        if rx is None:  # here: fnmatch imports re, ~4 ms of the no-op path, which never asks
            import fnmatch
            import re

            # Each pattern as fnmatch takes it ("(?s:...)\Z"), then anything below it: one
            # match a path, where a try of every pattern at every directory above it cost
            # discovery 3.5 times as much.
            alts = "|".join(fnmatch.translate(p).removesuffix("\\Z") for p in self.ignore_patterns)
            rx = self._ignore_rx = re.compile(f"(?:{alts})(?:/.*)?\\Z", re.S)
        return rx.match(rel) is not None

    def ensure_state_dir(self) -> str:
        """The state dir, made if missing; a file or other non-directory in its place is
        not buildtool's to delete: exit 2, saying so."""
        path = self.state_dir
        if os.path.islink(path):  # (checked in, say: clean emptied, and builds wrote and removed, where it led)
            _refuse(f"{path} is a symbolic link (to {os.readlink(path)!r}); buildtool keeps its state in a "
                    "directory of the workspace's own, whose contents it deletes: remove the link and run the "
                    "command again")
        if not os.path.isdir(path):
            if os.path.lexists(path):
                what = "a file" if os.path.isfile(path) else "not a directory (a named pipe, socket or device)"
                msg = f"{path} must be buildtool's state directory but is {what}; move it away and build again"
                _refuse(msg)
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as e:  # a read-only workspace, a full disk
                msg = f"cannot create buildtool's state directory {path}: {e.strerror}"
                _refuse(msg)
        tmp = os.path.join(path, "tmp")  # per-build temp dirs: anything else there is in the way
        if os.path.lexists(tmp) and not os.path.isdir(tmp):
            os.unlink(tmp)
        gi = os.path.join(path, ".gitignore")
        try:
            whole = os.stat(gi).st_size == len(GITIGNORE)
        except OSError:
            whole = False
        if not whole:  # (missing; or emptied, cut short, by a full disk: `git add -A` took the state)
            from buildtool.atomic import write_atomic

            try:
                write_atomic(gi, GITIGNORE)
            except OSError:
                pass  # (a convenience for git users; the lock says what is wrong, if anything)
        return path


GITIGNORE = "# written by buildtool: this directory is local state\n*\n"  # (.buildtool/.gitignore)


def _refuse(msg: str) -> NoReturn:
    """Exit 2 with ``msg``.  errors.py is imported here, not at the top: the no-op path
    finds its workspace and never comes here (~0.2 ms of a no-op the monitor vouches for)."""
    from buildtool.errors import UserError

    raise UserError(msg) from None


def _is_dev_null(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.stat(os.devnull).st_rdev


def is_marker(path: str) -> bool:
    """Does ``path`` mark a workspace root: a regular file, or a link to /dev/null (a
    config masked, read as empty), as ``find_workspace`` takes it?"""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) or _is_dev_null(st)


def find_workspace(start: str) -> Workspace:
    """Find the workspace containing ``start`` (exit code 2 when there is none)."""
    try:
        start_abs = os.path.realpath(start)
    except FileNotFoundError:  # (a relative start in a working directory that was deleted)
        msg = "the current directory no longer exists (deleted after the shell entered it): cd to the workspace again"
        _refuse(msg)
    if not os.path.isdir(start_abs):
        msg = f"{start!r} is not a directory" if os.path.exists(start_abs) else f"directory {start!r} does not exist"
        _refuse(msg)
    if not os.access(start_abs, os.X_OK):  # (a directory one cannot enter: its buildtool.toml looked absent)
        msg = f"directory {start!r} cannot be entered (Permission denied)"
        _refuse(msg)
    d = start_abs
    while True:
        marker = os.path.join(d, MARKER)
        try:
            st = os.stat(marker)
            mode: int | None = st.st_mode
            if _is_dev_null(st):
                break  # (a link to /dev/null: a config masked, read as empty; the marker all the same)
        except OSError as e:
            import errno  # (not on every no-op: test_imports)

            mode = None
            if e.errno == errno.ENAMETOOLONG:  # (not "no marker here": the parent's workspace was built)
                mode = _marker_mode_in(d)
                if mode is not None:
                    _refuse(f"the path {d} is too long for this system ({len(os.fsencode(marker)):,} bytes with "
                            f"/{MARKER}): buildtool cannot work there; move the workspace to a shorter path")
            elif os.path.islink(marker):  # (skipped, the enclosing workspace was built instead, silently)
                _refuse(f"{marker} is a symbolic link to {os.readlink(marker)!r}, which "
                        f"{'leads round in a loop' if e.errno == errno.ELOOP else 'does not exist'}; the workspace "
                        "marker must be a file (an empty one will do)")
        if mode is not None and stat.S_ISREG(mode):
            break
        if mode is not None:
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a pipe, socket or device)"
            msg = f"{marker} is {what}; the workspace marker must be a file (an empty one will do)"
            _refuse(msg)
        parent = os.path.dirname(d)
        if parent == d:
            msg = (
                f"no workspace found: neither {start_abs} nor any parent directory contains "
                f"{MARKER} (create an empty {MARKER} at the root of your project)"
            )
            _refuse(msg)
        d = parent
    rel = os.path.relpath(start_abs, d)
    rel = "" if rel == "." else rel.replace(os.sep, "/")
    return Workspace(root=d, cwd_pkg_dir=rel, ignore_patterns=read_ignore(d))


def _marker_mode_in(d: str) -> int | None:
    """The mode of ``d``'s marker, looked up relative to ``d`` (whose path with the marker's
    name is too long for one call); None: there is none (or ``d`` cannot be opened either)."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0  # (not even the directory: no telling, refused)
    try:
        return os.stat(MARKER, dir_fd=fd).st_mode
    except OSError:
        return None
    finally:
        os.close(fd)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for messages: "a directory", ..."""
    return ("a directory" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode)
            else "a symbolic link" if stat.S_ISLNK(mode) else "a device or socket")


def read_file(path: str) -> tuple[bytes, os.stat_result]:
    """The content and stat of the file ``path``, which must be a regular file, or be
    /dev/null (a config masked by a link to it: empty): OSError otherwise (a named pipe
    would block the read for good, a device never end it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # (a FIFO: no wait for a writer)
    try:
        st = os.fstat(fd)
        if _is_dev_null(st):
            return b"", st
        if not stat.S_ISREG(st.st_mode):
            import errno

            raise OSError(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL,
                          f"it is {file_kind(st.st_mode)}, not a file", path)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def open_regular(path: str, mode: str = "rb", encoding: str | None = None) -> IO[Any]:
    """``open(path, mode)`` ("rb", "r", "r+b") of a state or cache file that must be a
    regular file: a named pipe or a device put there is an OSError (it is then discarded as
    a damaged file is), never a read that waits for a writer for good; a directory is
    EISDIR, as open() says."""
    fd = os.open(path, (os.O_RDWR if "+" in mode else os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            import errno  # (here: the monitored no-op imports nothing it does not need)

            if stat.S_ISDIR(st.st_mode):
                raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            raise OSError(errno.EINVAL, f"it is {file_kind(st.st_mode)}, not a file", path)
        return os.fdopen(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def pkg_relative(path: str, pkg: str) -> str:
    """Workspace-relative ``path`` (normalised; ``.`` is the root) as seen from package
    directory ``pkg``: ``posixpath.relpath(path, pkg)`` without ``os.getcwd()``, which
    relpath asks for and which fails in a working directory deleted since (a build run
    with ``-C`` from there failed every pyrule below the root)."""
    if not pkg:
        return path
    path = posixpath.normpath(path)  # (pure string work: "app//inc", "./a" as relpath takes them)
    if path.startswith(pkg + "/"):
        return path[len(pkg) + 1:]
    there = path.split("/") if path not in ("", ".") else []
    here = pkg.split("/")
    same = 0
    while same < len(there) and same < len(here) and there[same] == here[same]:
        same += 1
    return "/".join([".."] * (len(here) - same) + there[same:]) or "."


def blake3_refused_threads(e: BaseException) -> bool:
    """Whether ``e`` is ``blake3``'s panic when its thread pool could not start (a limit on
    threads: ``ulimit -u``, a container's pids.max): the hash is then taken on one thread.
    Rust's ``PanicException`` derives from BaseException, past every ``except Exception``."""
    return type(e).__name__ == "PanicException"


def remove_if_not_a_file(path: str) -> None:
    """Remove what stands at ``path`` in a state or cache file's place when it is not a
    regular file (a directory, a named pipe: appends and renames onto it would fail or
    block for good); a missing one, a regular file or a link is left."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
        from buildtool.atomic import remove_path  # (here: the no-op path does not import it)

        remove_path(path)


def read_ignore(root: str) -> tuple[str, ...]:
    """The patterns of ``.buildtoolignore``.  Bytes that are not UTF-8 (a Latin-1 directory
    name) are decoded as os.listdir decodes such a name, so the pattern still matches it.
    Lines end at "\n" alone, and only spaces, tabs and a "\r" around a line are dropped: a
    directory named with a form feed or U+2028 is one pattern, not two."""
    try:
        lines = read_file(os.path.join(root, IGNORE_FILE))[0].decode("utf-8", "surrogateescape").split("\n")
    except (FileNotFoundError, NotADirectoryError):
        return ()
    except OSError as e:  # (taken as empty, the packages it leaves out were built)
        msg = f"cannot read {os.path.join(root, IGNORE_FILE)}: {e.strerror}"
        _refuse(msg)
    pats = []
    for line in lines:
        line = line.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        pats.append(line.strip("/"))
    return tuple(pats)


def at_or_above(pkg: str, memo: dict[str, bool], here: Callable[[str], bool]) -> bool:
    """Whether ``here`` holds for workspace directory ``pkg`` or one above it below the
    root, memoised in ``memo`` for each directory asked; a loop up the path, checked from
    the top down (a package 1,000 directories deep is no RecursionError)."""
    chain = []
    d = pkg
    while d and d not in memo:
        chain.append(d)
        d = d.rpartition("/")[0]
    got = memo.get(d, False) if d else False
    for d in reversed(chain):
        got = memo[d] = got or here(d)
    return got


def private_tmp_dir() -> str | None:
    """``/tmp/buildtool-<uid>``, made 0700, if it is a directory of this user's own (another
    user may have made that name first: then None, and nothing of ours goes there)."""
    d = f"/tmp/buildtool-{os.getuid()}"
    try:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(d)
    except OSError:
        return None
    return d if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() else None
