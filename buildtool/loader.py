"""Loader: finds packages and evaluates their BUILD.py files into declarations.

A package is a directory under the root holding ``BUILD.py``.  Discovery skips
``.git``, the state dir, ``.buildtoolignore`` entries and directory symlinks.  While a
BUILD.py runs, everything it reads is tracked (the BUILD.py itself, workspace modules it
imports, files it opens, directories it globs, environment variables read through
``getenv``) so a cached graph can be invalidated when any of them changes.
"""

from __future__ import annotations

import builtins
import io
import os
import re
import stat as stat_mod
import sys

from buildtool import dsl
from buildtool.atomic import RESTORE_TMP_SUFFIX
from buildtool.errors import BuildfileError, EvaluationInterrupted, StopRequested, UserError
from buildtool.noop import stat_row
from buildtool.workspace import (
    ALWAYS_SKIPPED,
    BUILDFILE,
    CACHEDIR_TAG,
    MARKER,
    Workspace,
    at_or_above,
    is_cache_tag,
    is_marker,
    read_file,
)

# The import system's path-based part (importlib._bootstrap_external), loaded at start-up:
# nothing to import, where importlib.util may not be loaded yet (the stand-ins must import nothing).
try:
    import _frozen_importlib_external as _import_system
except ImportError:  # (not CPython)
    import importlib._bootstrap_external as _import_system

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any


_REAL_OPEN = io.open  # (builtins.open is the same function)
_REAL_OPEN_CODE = io.open_code  # (what the import system and runpy read Python files with; _io's is the same)
_LOOKS = ("stat", "lstat", "access", "readlink", "listdir", "scandir")  # os functions tracked while a BUILD.py runs
_SPAWNS = ("system", "posix_spawn", "posix_spawnp")  # os functions that start a process (Loader._noting_spawn)
# Callers of those that stand for their own caller (os.path.exists, Path.glob, ...), and
# buildtool's own modules, whose looks while a BUILD.py runs (glob(), package checks) are
# noted by what they do with them.
_PATH_MODULES = frozenset({"os", "posixpath", "genericpath", "pathlib", "glob", "shutil", "fnmatch"})
_STAND_INS = frozenset({"stat", "stat_or_missing", "access", "readlink", "listing"})  # Loader._tracking_looks's
_PASS_THROUGH = _STAND_INS | {"stat_probe", "guarded"}  # (and the import guard, _shadow_guard's)
_OWN_MODULES = frozenset({"buildtool.loader", "buildtool.dsl", "buildtool.workspace", "buildtool.noop"})

# Ways a BUILD.py could end the whole process with a status of its choosing (os._exit(0)
# would end a build that built nothing with success), or split it: a forked child goes on
# as a second buildtool running the same build (multiprocessing's default start forks).
# (os.exec* other than execv/execve all go through them.)
_PROCESS_ENDS = ("_exit", "execv", "execve", "fork", "forkpty")


class _ChdirRefused(BaseException):  # BaseException: an ``except Exception`` in a BUILD.py keeps out
    """os.chdir() while a BUILD.py is evaluated: the whole process's working directory."""


def _refused_chdir(path: Any) -> None:
    raise _ChdirRefused(f"os.chdir({path!r})")


class _ProcessEnd(BaseException):  # BaseException: an ``except Exception`` in a BUILD.py keeps out
    def __init__(self, call: str) -> None:
        super().__init__(call)
        self.call = call


class _ExitGuard:
    """Stands in for ``os``'s process-ending (and forking) functions from the first BUILD.py
    evaluation to the end of the process (a thread a BUILD.py started may outlive its
    evaluation).

    A call ends only the calling thread, recorded in ``calls``: ``_ProcessEnd`` in the
    thread evaluating a BUILD.py, SystemExit (which ends a thread quietly) in a thread a
    BUILD.py started, with a warning when no evaluation is running any more.  Every other
    thread — buildtool's own, none of which calls these while loading, and the main thread
    ending the process — and a forked child get the real function."""

    def __init__(self) -> None:
        import threading

        self._threading = threading
        self.pid = os.getpid()
        self.evaluating: int | None = None  # the thread running a BUILD.py, while it runs (kernel ids)
        self.before: set[int] = set()  # the threads there were when that evaluation began
        self.started: set[int] = set()  # threads a BUILD.py started that outlived its evaluation
        self.calls: list[str] = []
        prior_hook = threading.excepthook

        def hook(args: Any) -> None:  # (its traceback would only repeat the loader's exit-2 error)
            if not isinstance(args.exc_value, dsl.OutsideEvaluation):
                prior_hook(args)

        threading.excepthook = hook
        for m in (os, sys.modules.get(os.name)):  # os's functions are posix's, reachable both ways
            for name in _PROCESS_ENDS:
                if m is not None and hasattr(m, name):
                    setattr(m, name, self._guarded(name, getattr(m, name)))

    def _guarded(self, name: str, real: Any) -> Any:
        def end(*args: Any) -> Any:
            me = self._threading.get_native_id()
            foreign = me in self.started or (self.evaluating is not None and me != self.evaluating
                                             and me not in self.before)
            if os.getpid() != self.pid or (me != self.evaluating and not foreign):
                return real(*args)
            shown = ", ".join(repr(a) for a in args) if name == "_exit" or not args else repr(args[0]) + ", ..."
            call = f"os.{name}({shown})"
            self.calls.append(call)
            if me == self.evaluating:
                raise _ProcessEnd(call)
            if self.evaluating is None:
                print(f"buildtool: warning: a thread started by a BUILD.py called {call}; "
                      "that thread was ended instead", file=sys.stderr)
            raise SystemExit(call)

        return end

    def begin(self) -> int | None:
        """An evaluation starts in this thread; what ``end`` needs to restore."""
        outer = self.evaluating
        self.evaluating, self.before, self.calls = self._threading.get_native_id(), self._threads(), []
        return outer

    def end(self, outer: int | None) -> set[int]:
        """The evaluation ended: the ``threading`` threads it started that still run.  Every
        thread that appeared during it is remembered as the BUILD.py's, also one started
        with ``_thread`` or by a library's native code (say, a BLAS pool at import), which
        is not an error: it only cannot end the process."""
        appeared = self._threads() - self.before
        self.started |= appeared
        self.evaluating = outer
        return {t.native_id for t in self._threading.enumerate() if t.native_id in appeared}

    def _threads(self) -> set[int]:
        """The kernel's ids of this process's threads: /proc lists them all, also those
        started with ``_thread`` directly, which ``threading.enumerate`` does not know."""
        try:
            return {int(tid) for tid in os.listdir("/proc/self/task")}
        except OSError:
            return {t.native_id for t in self._threading.enumerate() if t.native_id is not None}


_GUARD: list[_ExitGuard] = []


def _cwd() -> tuple[str, int] | None:
    """This process's working directory: its path and a descriptor that leads back to it
    (None if it cannot be had: a deleted directory); the caller closes the descriptor."""
    here = _getcwd()
    if here is None:
        return None
    try:
        return here, os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def _getcwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


def _exit_guard() -> _ExitGuard:
    if not _GUARD or _GUARD[0].pid != os.getpid():
        _GUARD[:] = [_ExitGuard()]
    return _GUARD[0]


def _check_package_dir(rel: str) -> None:
    """A directory holding a BUILD.py is a package; one whose path has a ``:``, a control
    character or a ``...`` directory would make labels that parse as something else (or as
    a pattern) or split the console's lines.
    (Other characters that labels do not take, a space or an ``é``, are let through as
    before: ``//...`` builds such a package, though no label on a command line names it.)"""
    if ":" in rel or any(ord(c) < 32 or ord(c) == 127 for c in rel) or "..." in rel.split("/"):
        msg = (f"{rel!r}: a directory holding a {BUILDFILE} is a package, and a package path cannot contain "
               "':', control characters or a directory named '...' (it ends a pattern); rename it, or list it "
               "in .buildtoolignore")
        raise UserError(msg)


class Loader:
    """Evaluates BUILD.py files on demand and remembers what each evaluation read."""

    def __init__(self, ws: Workspace, recorded_outputs: Iterable[str] = ()) -> None:
        self.ws = ws
        self.recorded_outputs = frozenset(recorded_outputs)
        # Outputs now declared where a directory holding only earlier outputs is (``x/y``
        # became ``x``): emptied of them by the session before anything runs.
        self.dirs_of_dead_outputs: set[str] = set()
        self._packages: dict[str, dict[str, dsl.Declaration]] = {}
        self._contexts: dict[str, dsl.PackageContext] = {}
        self._all: list[str] | None = None
        self._shadows: dict[str, str] | None = None  # root modules named as standard ones (_stdlib_shadows)
        self._all_set: frozenset[str] = frozenset()  # the same, for package_exists
        self.read_files: set[str] = set()  # workspace-relative files read while loading
        # Their stats when they were read (BUILD.py files, files opened): one edited later,
        # even during the evaluation of another BUILD.py, then refuses the no-op snapshot.
        self.read_stats: dict[str, list[int]] = {}
        # A BUILD.py opened a workspace file by a relative path: from the working directory,
        # as Python's open() does, so the graph holds for that directory only.
        self.cwd_relative = False
        # A BUILD.py (or a module it imported) started a process: what it read (`git
        # rev-parse HEAD`: .git's files) cannot be tracked, so no snapshot may vouch for the
        # graph; the BUILD.py that did it first, for `build -v`'s note.  None: none did.
        self.spawned: str | None = None
        self.glob_dirs: set[str] = set()  # workspace-relative directories listed (discovery, glob)
        self.glob_links: set[str] = set()  # workspace-relative files glob() found that are symbolic links
        # each listed directory's (mtime_ns, ctime_ns, ino) just before its first listing (None:
        # no directory): one that differs after the evaluation changed while it was read
        self.dir_stats: dict[str, tuple[int, int, int] | None] = {}
        # Workspace paths looked for and maybe not found: a package's BUILD.py or a nested
        # buildtool.toml asked for without discovery (`:name` from a subdirectory, a srcs
        # path's packages), a module an import looked for.  One appearing changes the graph.
        self.probes: set[str] = set()
        # package -> the workspace files its BUILD.py's own code (or a workspace module's)
        # looked at by stat (os.path.exists, os.stat, os.access) or looked for by an import,
        # found or not: none of them may be an output (graph.py), or the first build passes
        # and the next, the file made, refuses it as read.  Per package: watch keeps an
        # untouched package's.  ``module_looks``: those of a workspace module's code, whose
        # body runs once, at its first import, and which may memoise (watch keeps them while
        # the modules stay imported).
        self.stat_probes: dict[str, set[str]] = {}
        self.module_looks: set[str] = set()
        # absolute paths outside the workspace a macro looked for (cc: the compiler on PATH):
        # the no-op snapshot's business, not watch mode's (it would watch every PATH directory)
        self.looked_for: set[str] = set()
        self._nested: dict[str, bool] = {}  # directory -> in a nested workspace (memo)
        self._in_cache: dict[str, bool] = {}  # directory -> in a cache directory (memo)
        # Package -> the include patterns of its glob() calls (text, compiled): which new
        # files in a package's directories could change what a glob() returns (watch mode).
        self.glob_rules: dict[str, list[tuple[str, Any]]] = {}
        self.env_reads: dict[str, str | None] = {}
        # Files a glob() matched but left out as outputs of an earlier build: one that is
        # no output any more and stays (edited since) is a source, so the graph is redone.
        self.glob_hidden: dict[str, str] = {}  # path -> the package whose glob() left it out
        self._listed: dict[str, list[str]] = {}  # package -> its files, listed once (its glob() calls)
        self._present: dict[str, frozenset[str]] = {}  # the same as sets, for literal patterns
        # A terminal's loading line (console.LoadingLine), told as each evaluation begins and
        # erased before a BUILD.py writes to stdout or stderr; None elsewhere.
        self.progress: Any = None

    # -- discovery -------------------------------------------------------------------
    def all_packages(self) -> list[str]:
        """Every package under the root, sorted."""
        if self._all is None:
            found: list[str] = []
            todo = [""]  # (a stack, not recursion: a tree 1,000 directories deep is no RecursionError)
            while todo:
                todo += self._walk(todo.pop(), found)
            found.sort()
            self._all, self._all_set = found, frozenset(found)
        return self._all

    def packages_under(self, pkg: str) -> list[str]:
        """``pkg`` (if a package) and every package below it, sorted: a slice of the sorted
        list (a scan of every package per ``//dir/...`` pattern made 3,000 patterns over
        12,000 packages 72 million comparisons)."""
        every = self.all_packages()
        if not pkg:
            return list(every)
        import bisect

        below = every[bisect.bisect_left(every, pkg + "/"):bisect.bisect_left(every, pkg + "0")]  # ('0' follows '/')
        return [pkg, *below] if pkg in self._all_set else below

    def take_discovery(self, other: Loader) -> None:
        """Use ``other``'s package discovery (watch mode, when no directory came or went)."""
        self._all, self._all_set = other._all, other._all_set

    def _listing(self, rel: str) -> None:
        """``rel`` (workspace-relative) is about to be listed: a directory the graph depends on."""
        self.glob_dirs.add(rel)
        if rel not in self.dir_stats:
            self.dir_stats[rel] = dir_stat(os.path.join(self.ws.root, rel) if rel else self.ws.root)

    def _walk(self, rel: str, found: list[str]) -> list[str]:
        """List directory ``rel``: add it to ``found`` if it is a package; the
        subdirectories to walk next (none below a nested workspace or a cache dir)."""
        absdir = os.path.join(self.ws.root, rel) if rel else self.ws.root
        self._listing(rel)
        try:
            it = os.scandir(absdir)
        except (FileNotFoundError, NotADirectoryError):  # (gone since its parent was listed)
            return []
        except OSError as e:  # (a path too long, EIO: its packages would drop out of a build saying OK)
            raise UserError(_unlistable(rel, "finding the packages", e)) from None
        subdirs = []
        here = False
        with it:
            for entry in it:
                name = entry.name
                if name == BUILDFILE:
                    here = True
                    continue
                if name == MARKER and rel:  # a workspace of its own inside this one: not ours to walk
                    return []
                if name == CACHEDIR_TAG and rel and self._cache_dir(f"{rel}/{name}"):
                    return []
                if name in ALWAYS_SKIPPED:
                    continue
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                except OSError:
                    continue
                child = f"{rel}/{name}" if rel else name
                if self.ws.ignore_patterns and self.ws.is_ignored(child):
                    continue
                subdirs.append(child)
        if here:
            if rel:
                _check_package_dir(rel)
            found.append(rel)
        return subdirs

    def package_exists(self, pkg: str) -> bool:
        if self._all is not None:
            return pkg in self._all_set
        if pkg and self.ws.is_ignored(pkg):
            return False
        self.probes.add(f"{pkg}/{BUILDFILE}" if pkg else BUILDFILE)
        path = os.path.join(self.ws.root, pkg, BUILDFILE)
        return (os.path.isfile(path) and not _under_symlink(self.ws.root, pkg) and not self.in_nested_workspace(pkg)
                and not self.in_cache_dir(pkg))

    def in_cache_dir(self, pkg: str) -> bool:
        """Is ``pkg`` in a cache directory (a directory below the root, at or above it,
        holding a CACHEDIR.TAG with the signature)?  Discovery does not walk there, glob()
        does not list it, and a label does not load it."""
        def here(d: str) -> bool:
            tag = f"{d}/{CACHEDIR_TAG}"
            self.probes.add(tag)
            return os.path.lexists(os.path.join(self.ws.root, tag)) and self._cache_dir(tag)

        return at_or_above(pkg, self._in_cache, here)

    def in_nested_workspace(self, pkg: str) -> bool:
        """Is ``pkg`` in a nested workspace (a directory below the root, at or above it,
        with its own buildtool.toml)?  Discovery does not walk there; nor does a label."""
        def here(d: str) -> bool:
            self.probes.add(f"{d}/{MARKER}")
            return is_marker(os.path.join(self.ws.root, d, MARKER))

        return at_or_above(pkg, self._nested, here)

    # -- evaluation ------------------------------------------------------------------
    def load(self, pkg: str) -> dict[str, dsl.Declaration]:
        """Evaluate //pkg's BUILD.py once; return its declarations by name."""
        got = self._packages.get(pkg)
        if got is not None:
            return got
        buildfile = os.path.join(self.ws.root, pkg, BUILDFILE)
        rel_bf = f"{pkg}/{BUILDFILE}" if pkg else BUILDFILE
        try:
            source, st = read_file(buildfile)
        except OSError as e:
            msg = f"cannot read {rel_bf}: {e.strerror}"
            if os.path.islink(buildfile) and not os.path.exists(buildfile):
                msg = (f"{rel_bf} is a symbolic link to {os.readlink(buildfile)!r}, which leads nowhere (missing, "
                       "or a loop)")
            raise UserError(msg) from None
        self.read_files.add(rel_bf)
        self.read_stats.setdefault(rel_bf, stat_row(st))
        progress = self.progress
        if progress is not None:
            progress.evaluating(len(self._packages), len(self._all) if self._all is not None else None, pkg)
        ctx = dsl.PackageContext(
            root=self.ws.root, pkg=pkg, buildfile=buildfile, glob_fn=self._glob
        )
        namespace = self._namespace(buildfile, ctx)
        # The root goes first on sys.path for the evaluation only: left there, a workspace
        # typing.py or ast.py was what buildtool's own later imports found (a traceback).
        on_path = self.ws.root in sys.path
        real_import = builtins.__import__
        shadows = self._stdlib_shadows()
        guarded_import = _shadow_guard(real_import, shadows, self.ws.root)
        stdlib_first = _StdlibFirst(shadows, self.ws.root)
        import _io

        # (made before any state is changed: what raises here leaves nothing to undo)
        opens = (builtins.open, io.open, io.open_code, _io.open_code)
        tracking_open, tracking_open_code = self._tracking_open(), self._tracking_open_code()
        FileLoader = _import_system.FileLoader
        get_data = FileLoader.get_data
        tracking_get_data = self._tracking_get_data(get_data)
        looks = {name: getattr(os, name) for name in _LOOKS}
        real_chdir = os.chdir
        stand_ins = self._tracking_looks(pkg)
        import _posixsubprocess

        # (subprocess keeps its own reference, _fork_exec, taken when it was imported: an
        # import made before the evaluation (watchdog's, in watch mode) has the real one)
        sub = sys.modules.get("subprocess")
        spawns = [(m, name, getattr(m, name)) for m, names in ((os, _SPAWNS), (_posixsubprocess, ("fork_exec",)),
                                                                (sub, ("_fork_exec",)))
                  if m is not None for name in names if hasattr(m, name)]
        real_fork_exec = _posixsubprocess.fork_exec
        prefix = self.ws.root + os.sep
        probe = _ImportProbes(self.ws.root, self.probes, lambda rel, f: self._note_look(pkg, rel, f, prefix, True))
        no_pyc = sys.dont_write_bytecode
        misplaced = len(dsl.misplaced_calls)
        token = dsl.set_context(ctx)
        # What a BUILD.py prints goes to stderr: stdout carries `graph --format json`,
        # `query` answers and the build's own lines.
        stdout, stderr = sys.stdout, sys.stderr
        sys.stdout = _PrintsToStderr(stderr, progress)
        sys.stderr = _PrintsToStderr(stderr, progress)  # (its close() closed buildtool's own: errors lost)
        guard = _exit_guard()
        outer = guard.begin()
        ended = False
        here = _cwd()  # (an os.chdir() in it is undone, and refused: see below)
        try:  # (the stand-ins go in inside it: whatever happens, the ``finally`` takes them out)
            if not on_path:
                sys.path.insert(0, self.ws.root)
            if shadows:
                builtins.__import__ = guarded_import
            builtins.open = io.open = tracking_open
            io.open_code = _io.open_code = tracking_open_code  # (a module loaded by its path)
            FileLoader.get_data = tracking_get_data  # (... from a compiled file alone)
            for name, fn in stand_ins.items():
                setattr(os, name, fn)
            for m, name, real in spawns:
                setattr(m, name, self._noting_spawn(rel_bf, real))
            os.chdir = _refused_chdir  # (process-wide: the next BUILD.py's relative paths, the reports)
            if shadows:  # (after the probes: they record what was looked for, for the snapshot)
                sys.meta_path.insert(0, stdlib_first)
            sys.meta_path.insert(0, probe)
            sys.dont_write_bytecode = True  # no __pycache__ among the sources
            code = compile(source, buildfile, "exec")
            exec(code, namespace)
            left, ended = guard.end(outer), True
            if here is not None and _getcwd() != here[0]:  # (another way than os.chdir: os.fchdir, say)
                # (the next BUILD.py's relative opens, and the --junit/--events/--profile files,
                # went to the directory it chose: another build graph, reports elsewhere)
                msg = (f"evaluating {rel_bf} changed the working directory; a BUILD.py may only "
                       "declare targets: build paths from __file__ instead")
                raise BuildfileError(msg, rel_bf, None)
            if len(dsl.misplaced_calls) > misplaced:  # (a thread's exception may have been swallowed)
                name, fn, line = dsl.misplaced_calls[misplaced]
                inside = fn.startswith(self.ws.root + os.sep)
                msg = (f"evaluating {rel_bf} called {name}() in another thread; "
                       "declare targets in the thread evaluating the BUILD.py")
                raise BuildfileError(msg, os.path.relpath(fn, self.ws.root) if inside else rel_bf,
                                     line if inside else None)
            if guard.calls:  # called in a thread the BUILD.py started (this thread raises)
                msg = (f"evaluating {rel_bf} called {guard.calls[0]} (in another thread); "
                       "a BUILD.py may only declare targets")
                raise BuildfileError(msg, rel_bf, None)
            if left:
                msg = (f"evaluating {rel_bf} left {len(left)} thread(s) running; a BUILD.py may only declare "
                       "targets (join the threads it starts)")
                raise BuildfileError(msg, rel_bf, None)
        except BuildfileError:
            raise
        except SystemExit as e:  # sys.exit() in a BUILD.py (or a macro): not a way to end buildtool
            path, line = self._locate(e, buildfile)
            msg = f"evaluating {rel_bf} called sys.exit({e.code!r}); a BUILD.py may only declare targets"
            raise BuildfileError(msg, path, line) from None
        except _ChdirRefused as e:
            path, line = self._locate(e, buildfile)
            msg = (f"evaluating {rel_bf} called {e}, which moves the whole process (the next BUILD.py's "
                   "relative paths, the report files); build paths from __file__ instead")
            raise BuildfileError(msg, path, line) from None
        except _ProcessEnd as e:  # os._exit(0) would end the build "successfully", having built nothing
            path, line = self._locate(e, buildfile)
            msg = f"evaluating {rel_bf} called {e.call}; a BUILD.py may only declare targets"
            raise BuildfileError(msg, path, line) from None
        except _ShadowedStdlib as e:
            path, line = self._locate(e, buildfile)
            raise BuildfileError(str(e), path, line) from None
        except SyntaxError as e:
            path = os.path.relpath(e.filename or buildfile, self.ws.root)
            msg = f"syntax error: {e.msg}"
            if path != rel_bf and (call := _line_in(e, buildfile)):  # in a module: and where it was imported
                imported = e.filename is not None and os.path.isfile(e.filename)  # (not exec() of a string)
                msg += f" ({'imported' if imported else 'called'} from {rel_bf}:{call})"
            if e.text:
                caret = " " * max((e.offset or 1) - 1, 0) + "^"
                msg += f"\n    {e.text.rstrip()}\n    {caret}"
            raise BuildfileError(msg, path, e.lineno) from None
        except (EvaluationInterrupted, StopRequested):
            raise
        except KeyboardInterrupt as e:
            path, line = self._locate(e, buildfile)
            at = f"{path}:{line}" if line else path
            raise EvaluationInterrupted(at if path == rel_bf else f"{rel_bf} (at {at})",
                                        getattr(e, "signum", 2)) from None  # (2: Ctrl-C; a Terminated's)
        except BaseException as e:  # the buildfile raised: point at the deepest workspace frame
            frames = self._user_frames(e)
            path, line = frames[-1] if frames else (rel_bf, None)
            text = _text_of(e)
            msg = (f"evaluating {rel_bf} raised {type(e).__name__}{': ' + text if text else ''}{_suggestion(e)}"
                   f"{self._import_hint(e, pkg)}")
            # And every caller up to the BUILD.py's line, innermost first: the macro's line
            # that called the helper that raised was left out (which of its calls was it?).
            callers: list[str] = []
            for p, n in reversed(frames[:-1]):
                at = f"{p}:{n}"
                if not callers or callers[-1] != at:  # (a recursion: once)
                    callers.append(at)
            if len(callers) > 6:
                callers = [*callers[:3], f"... {len(callers) - 5} more", *callers[-2:]]
            if callers:
                msg += f" (called from {', from '.join(callers)})"
            raise BuildfileError(msg, path, line) from None
        finally:
            builtins.__import__ = real_import
            if not on_path and self.ws.root in sys.path:
                sys.path.remove(self.ws.root)
            sys.dont_write_bytecode = no_pyc
            if probe in sys.meta_path:
                sys.meta_path.remove(probe)
            if stdlib_first in sys.meta_path:
                sys.meta_path.remove(stdlib_first)
            builtins.open, io.open, io.open_code, _io.open_code = opens
            FileLoader.get_data = get_data
            for name, fn in looks.items():
                setattr(os, name, fn)
            for m, name, real in spawns:
                setattr(m, name, real)
            sub = sys.modules.get("subprocess")  # (imported during the evaluation: it took the stand-in)
            if sub is not None and getattr(sub, "_fork_exec", None) not in (None, real_fork_exec):
                sub._fork_exec = real_fork_exec
            os.chdir = real_chdir
            if not ended:
                guard.end(outer)
            if here is not None:
                if _getcwd() != here[0]:
                    try:
                        os.fchdir(here[1])
                    except OSError:
                        pass
                os.close(here[1])
            sys.stdout = stdout
            sys.stderr = stderr  # (always: a BUILD.py that set its own silenced every later error and warning)
            dsl.reset_context(token)
        ctx.evaluated()
        self._packages[pkg] = ctx.declarations
        self._contexts[pkg] = ctx
        self.env_reads.update(ctx.env_reads)
        self.looked_for.update(ctx.looked_for)
        return ctx.declarations

    def globbed(self, pkg: str) -> set[str]:
        ctx = self._contexts.get(pkg)
        return ctx.globbed if ctx else set()

    def loaded_packages(self) -> list[str]:
        return sorted(self._packages)

    def imported_workspace_modules(self) -> set[str]:
        """Workspace-relative paths of workspace Python modules imported so far."""
        root = self.ws.root + os.sep
        out = set()
        for mod in list(sys.modules.values()):
            fn = getattr(mod, "__file__", None)
            if fn and fn.startswith(root):
                out.add(os.path.relpath(fn, self.ws.root))
        return out

    def _tracking_open(self) -> Any:
        """``open`` that notes each workspace file opened for reading (and its stat then):
        it stands in for ``builtins.open`` and ``io.open`` while a BUILD.py is evaluated, so
        reads by the modules it imports and through ``pathlib`` count as well."""
        real = _REAL_OPEN

        def tracking_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, (str, bytes, os.PathLike)) and "r" in mode:
                rel = self._note_read(file)  # (first: a file that is missing now counts when it appears)
                f = real(file, mode, *args, **kwargs)  # (the caller closes it)
                if rel is not None:
                    self._note_stat(rel, f)
                return f
            return real(file, mode, *args, **kwargs)

        return tracking_open

    def _tracking_open_code(self) -> Any:
        """``io.open_code`` that notes the workspace files it opens, as ``open`` does: what
        ``importlib.util.spec_from_file_location(...).loader.exec_module`` and
        ``runpy.run_path`` read a module by its path with (no ``sys.modules`` entry, no
        ``open`` call: the module's edits went unseen).  A compiled ``__pycache__`` file
        counts with its source, which the import system checked it against."""
        real = _REAL_OPEN_CODE
        source_from_cache = _import_system.source_from_cache  # (not importlib.util's: see _import_system)

        def tracking_open_code(path: str) -> Any:
            if not isinstance(path, str):
                return real(path)  # (which refuses it)
            if path.endswith(".pyc"):  # (in __pycache__, or under sys.pycache_prefix)
                try:
                    source = source_from_cache(path)
                except (ValueError, NotImplementedError):  # (not a name the import system writes)
                    source = None
                if source is not None and os.path.exists(source):
                    src = self._note_read(source)
                    if src is not None:  # (stat-ed before the compiled file is read: near the check of it)
                        self._note_stat(src, None)
            rel = self._note_read(path)
            f = real(path)
            if rel is not None:
                self._note_stat(rel, f)
            return f

        return tracking_open_code

    def _tracking_get_data(self, real: Any) -> Any:
        """The import system's ``FileLoader.get_data`` that notes what a sourceless loader
        reads: a ``.pyc`` loaded by its path (``spec_from_file_location(name, "x.pyc")``)
        is read with ``_io.FileIO``, not ``open_code``.  Source loaders go on through
        ``open_code``, noted there."""
        by_open_code = (_import_system.SourceLoader, _import_system.ExtensionFileLoader)

        def get_data(loader: Any, path: str) -> Any:
            if isinstance(loader, by_open_code):
                return real(loader, path)
            rel = self._note_read(path)
            data = real(loader, path)
            if rel is not None:
                self._note_stat(rel, None)
            return data

        return get_data

    def _note_read(self, file: Any) -> str | None:
        """Note ``file``, about to be opened for reading, if it is in the workspace; its
        workspace-relative path then."""
        p = os.fsdecode(file)
        absp = os.path.abspath(p)  # what open() opens: a relative path is from the working directory
        # (also one that leads out of the workspace: its file is not tracked, but the
        # graph depends on the directory it was read from)
        self.cwd_relative = self.cwd_relative or not os.path.isabs(p)
        if not absp.startswith(self.ws.root + os.sep):
            return None
        rel = os.path.relpath(absp, self.ws.root)
        self.read_files.add(rel)
        return rel

    def _note_stat(self, rel: str, f: Any) -> None:
        """The stat data of ``rel`` as it was read: from ``f``, the open file (None: stat the path)."""
        try:
            st = os.fstat(f.fileno()) if f is not None else os.stat(os.path.join(self.ws.root, rel))
            self.read_stats.setdefault(rel, stat_row(st))
        except (OSError, AttributeError, ValueError):
            pass

    def _noting_spawn(self, rel_bf: str, real: Any) -> Any:
        """A stand-in for a function that starts a process (``subprocess`` goes through
        ``_posixsubprocess.fork_exec``; ``os.system``, ``os.posix_spawn``): noted in
        ``spawned``, then called."""

        def spawn(*args: Any, **kwargs: Any) -> Any:
            if self.spawned is None:
                self.spawned = rel_bf
            return real(*args, **kwargs)

        return spawn

    def _note_look(self, pkg: str, rel: str, f: Any, prefix: str, importer: bool = False) -> None:
        """``rel`` looked at (a stat) or for (an import) from frame ``f`` down, while //pkg is
        evaluated: noted when the workspace's code (a BUILD.py, a module of the workspace)
        made the look, not buildtool's (its lazy imports, the cc macros' compiler lookup,
        shutil.which called from them) nor the standard library's or an installed
        library's on their behalf (for an import, the import system's frames passed: one a
        module's body makes, the standard library's `datetime` importing `math`, is no
        look of the workspace's; one ``pkgutil.find_loader`` makes for a BUILD.py is).  A
        BUILD.py's own looks are its package's, made again when it is; a workspace module's
        are the workspace's while it stays imported (its body, a function it memoises or its
        body calls, are not run again when a package is evaluated again in watch mode)."""
        while f is not None:
            name = f.f_globals.get("__name__") or ""
            code = f.f_code
            if name == __name__ and code.co_name in _PASS_THROUGH:  # (the loader's stand-ins)
                f = f.f_back
                continue
            if importer and (name.startswith("importlib") or code.co_filename.startswith("<frozen importlib")):
                f = f.f_back
                continue
            if name == "buildtool" or name.startswith("buildtool."):
                return
            fn = code.co_filename
            if fn.startswith(prefix) and not _INSTALLED.search(fn, len(prefix) - 1):
                if os.path.basename(fn) != BUILDFILE:
                    self.module_looks.add(rel)
                else:
                    self.stat_probes.setdefault(pkg, set()).add(rel)
                return
            if importer and code.co_name == "<module>":
                return  # (a module's body importing what it needs: not a look on the workspace's behalf)
            f = f.f_back

    def _tracking_looks(self, pkg: str) -> dict[str, Any]:
        """Stand-ins for ``os.stat``/``os.lstat``/``os.access`` (so ``os.path.exists``,
        ``isfile``, ``islink``, ``pathlib.Path.exists``, ...), ``os.readlink`` and
        ``os.listdir``/``os.scandir`` (``Path.iterdir``, ``Path.glob``, ``glob.glob``) while a
        BUILD.py is evaluated: a workspace path looked at becomes a probe, a directory listed
        a listed directory, so a file appearing, going or changing later re-evaluates the
        BUILD.py files.  A symbolic link looked at itself (``lstat`` found one, ``readlink``)
        also lists its directory, whose listing has each link's target: a probe follows the
        link.  Only the evaluating thread's calls count (watch mode's observer threads stat
        files meanwhile)."""
        import threading

        root = self.ws.root
        real_stat, real_lstat = os.stat, os.lstat  # (taken before the stand-ins go in)
        me = threading.get_ident()
        state = os.path.join(root, ".buildtool")

        def rel_of(path: Any) -> str | None:
            if isinstance(path, int) or threading.get_ident() != me:
                return None  # (a file descriptor: what it is was noted when it was opened)
            try:
                p = os.fsdecode(path)
            except TypeError:
                return None
            if not os.path.isabs(p):
                self.cwd_relative = True  # (as for open(): the graph holds for this directory only)
            absp = os.path.abspath(p)
            if absp == root:
                return ""
            if not absp.startswith(root + os.sep) or absp == state or absp.startswith(state + os.sep):
                return None
            return os.path.relpath(absp, root)

        def ours() -> bool:
            """Is the call buildtool's own (glob(), the package checks)?  Those note what
            they look at themselves, and only what shapes the graph."""
            f = sys._getframe(1)
            while f is not None and f.f_code.co_name in _STAND_INS and f.f_globals.get("__name__") == __name__:
                f = f.f_back
            while f is not None and f.f_globals.get("__name__") in _PATH_MODULES:
                f = f.f_back  # (os.path.exists -> os.stat: the caller of genericpath counts)
            return f is not None and f.f_globals.get("__name__") in _OWN_MODULES

        prefix = root + os.sep

        def stat_probe(rel: str) -> None:
            self._note_look(pkg, rel, sys._getframe(1), prefix)

        def note(rel: str, mode: int) -> None:
            # A directory by its listing (its mtime moves whenever an output in it is
            # rewritten), a link seen as one (lstat, readlink) by its directory's (which has
            # each link's target; a probe would follow it), anything else by its stat.
            if stat_mod.S_ISLNK(mode):
                self._listing(rel.rpartition("/")[0])
            else:
                (self.glob_dirs if stat_mod.S_ISDIR(mode) else self.probes).add(rel)

        def looked(real: Any) -> Any:
            def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
                st = real(path, *args, **kwargs)  # (raises for a missing path: noted below)
                rel = rel_of(path)
                if rel and not ours():
                    note(rel, st.st_mode)
                    if not stat_mod.S_ISDIR(st.st_mode):
                        stat_probe(rel)
                return st

            def stat_or_missing(path: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    return stat(path, *args, **kwargs)
                except OSError:
                    rel = rel_of(path)
                    if rel and not ours():
                        self.probes.add(rel)  # (missing: one appearing changes the graph)
                        stat_probe(rel)
                    raise

            return stat_or_missing

        def accessed(real: Any) -> Any:
            def access(path: Any, *args: Any, **kwargs: Any) -> Any:
                rel = rel_of(path) if kwargs.get("dir_fd") is None else None  # (relative to a descriptor: not told)
                if rel and not ours():
                    follow = kwargs.get("follow_symlinks", True)
                    try:
                        mode = (real_stat if follow else real_lstat)(path).st_mode
                        note(rel, mode)
                    except (OSError, ValueError):
                        mode = 0
                        self.probes.add(rel)  # (missing: one appearing changes the graph)
                    if not stat_mod.S_ISDIR(mode):
                        stat_probe(rel)
                return real(path, *args, **kwargs)

            return access

        def linked(real: Any) -> Any:
            def readlink(path: Any, *args: Any, **kwargs: Any) -> Any:
                rel = rel_of(path)
                if rel and not ours():
                    note(rel, stat_mod.S_IFLNK)
                return real(path, *args, **kwargs)

            return readlink

        def listed(real: Any) -> Any:
            def listing(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
                rel = rel_of(path)
                if rel is not None and not ours():
                    self._listing(rel)
                return real(path, *args, **kwargs)

            return listing

        return {"stat": looked(os.stat), "lstat": looked(os.lstat), "access": accessed(os.access),
                "readlink": linked(os.readlink), "listdir": listed(os.listdir), "scandir": listed(os.scandir)}

    def _stdlib_shadows(self) -> dict[str, str]:
        """The workspace root's modules (``x.py``, ``x/__init__.py``) named as a standard
        library module, by name, listed once."""
        if self._shadows is None:
            found: dict[str, str] = {}
            try:
                for n in os.listdir(self.ws.root):
                    if n.endswith(".py") and n[:-3] in sys.stdlib_module_names:
                        found[n[:-3]] = n
                    elif n in sys.stdlib_module_names and os.path.isfile(os.path.join(self.ws.root, n, "__init__.py")):
                        found[n] = f"{n}/__init__.py"
            except OSError:
                pass
            self._shadows = found
        return self._shadows

    def _namespace(self, buildfile: str, ctx: dsl.PackageContext) -> dict[str, Any]:
        return {
            "__builtins__": builtins,
            "__name__": "BUILD",
            "__file__": buildfile,
            "genrule": dsl.genrule,
            "test": dsl.test,
            "group": dsl.group,
            "pyrule": dsl.pyrule,
            "glob": dsl.glob,
            "getenv": dsl.getenv,
            "fail": dsl.fail,
        }

    def _locate(self, exc: BaseException, buildfile: str) -> tuple[str, int | None]:
        """The deepest workspace frame of ``exc``'s traceback (the BUILD.py without a line
        if there is none)."""
        frames = self._user_frames(exc)
        return frames[-1] if frames else (os.path.relpath(buildfile, self.ws.root), None)

    def _import_hint(self, e: BaseException, pkg: str) -> str:
        """For ``import defs`` in pkg/BUILD.py beside pkg/defs.py: modules are found from
        the workspace root, and that one is ``pkg.defs``."""
        name = getattr(e, "name", None)
        if not isinstance(e, ModuleNotFoundError) or not isinstance(name, str) or not pkg:
            return ""
        top = name.split(".")[0]
        here = os.path.join(self.ws.root, pkg, top)
        if not (os.path.isfile(here + ".py") or os.path.isdir(here)):
            return ""
        dotted = pkg.replace("/", ".")
        return (f" ({pkg}/{top}{'.py' if os.path.isfile(here + '.py') else ''} is there, but modules are found "
                f"from the workspace root: `from {dotted} import {top}`)")

    def _user_frames(self, exc: BaseException) -> list[tuple[str, int | None]]:
        """The frames of ``exc``'s traceback in the workspace's own files (not buildtool's,
        nor a library installed in a venv inside it), outermost first: the BUILD.py line, the
        macro's, the helper's that raised."""
        import traceback  # (an error path: ~2 ms of import with linecache and tokenize)

        root = self.ws.root + os.sep
        ours = os.path.dirname(os.path.abspath(dsl.__file__)) + os.sep  # buildtool itself, in a venv in the root
        out: list[tuple[str, int | None]] = []
        for fs in traceback.extract_tb(exc.__traceback__):
            name = fs.filename
            if not name.startswith(root) or name.startswith(ours) or _INSTALLED.search(name):
                continue  # (a library installed in a venv inside the workspace is not the user's code)
            rel = os.path.relpath(name, self.ws.root)
            if not self.ws.is_ignored(rel):
                out.append((rel, fs.lineno))
        return out

    # -- glob ------------------------------------------------------------------------
    def _glob(self, pkg: str, include: list[str], exclude: list[str]) -> list[str]:
        for pat in [*include, *exclude]:
            if not isinstance(pat, str) or not pat:
                msg = f"glob patterns must be non-empty strings (got {pat!r})"
                raise ValueError(msg)
            if pat.startswith("/") or ".." in pat.split("/"):
                msg = f"glob pattern {pat!r} must stay inside package //{pkg} (no '..', not absolute)"
                raise ValueError(msg)
            segments = pat.split("/")
            if "" in segments:  # (as Bazel: 'src//x.c' matched nothing, a trailing '/' too)
                msg = f"glob pattern {pat!r} has an empty path segment ('//' or a trailing '/')"
                raise ValueError(msg)
            if any("**" in seg and seg != "**" for seg in segments):
                # (as Bazel; older buildtool read it as any characters, '/' included)
                same = _whole_double_stars(segments)
                msg = (f"glob pattern {pat!r}: '**' must be a whole path segment; " + (
                    f"{same!r} matches what it did" if same is not None else
                    "write it as a segment of its own, as in 'src/**/*.c' (it matched across directories)"))
                raise ValueError(msg)
        inc = [_checked_glob(p) for p in include]
        exc = [_checked_glob(p) for p in exclude]
        self.glob_rules.setdefault(pkg, []).extend(zip(include, inc, strict=True))
        prefix = f"{pkg}/" if pkg else ""
        files = self._listed.get(pkg)
        if files is None:  # (a package of 2,000 glob() calls listed its tree 2,000 times)
            files = self._listed[pkg] = []
            self._list_package_files(pkg, "", files)
        if not any(c in p for p in include for c in "*?["):  # literal paths: no scan of every file
            present = self._present.get(pkg)
            if present is None:
                present = self._present[pkg] = frozenset(files)
            files = [rel for rel in dict.fromkeys(include) if rel in present]
        out = []
        for rel in files:
            if not any(r.match(rel) for r in inc) or any(r.match(rel) for r in exc):
                continue
            if prefix + rel in self.recorded_outputs:
                self.glob_hidden[prefix + rel] = pkg
                continue
            if prefix + rel in self.glob_links and self._links_to_recorded_output(prefix + rel):
                continue  # (`latest.txt -> out/gen.txt`: dangling before the build, skipped; so after it)
            out.append(rel)
        out.sort()
        return out

    def _links_to_recorded_output(self, rel: str) -> bool:
        """Whether the symbolic link ``rel`` leads to a file an earlier build recorded as an
        output (one declared but not built yet is left out by graph.py)."""
        if not self.recorded_outputs:
            return False
        root = os.path.realpath(self.ws.root)
        real = os.path.realpath(os.path.join(root, rel))
        return real.startswith(root + os.sep) and os.path.relpath(real, root) in self.recorded_outputs

    def _cache_dir(self, tag: str) -> bool:
        """Is the directory of ``tag`` (a CACHEDIR.TAG below the root) a cache, whose files
        are no sources?  The tag's content decides, so the build depends on it."""
        self.read_files.add(tag)
        return is_cache_tag(os.path.join(self.ws.root, tag))

    def _list_package_files(self, pkg: str, sub: str, out: list[str]) -> None:
        """Add to ``out`` the files of //pkg below its directory ``sub`` (package-relative),
        sub-packages, nested workspaces and cache dirs left out."""
        todo = [sub]  # (a stack, not recursion: a tree 1,000 directories deep is no RecursionError)
        while todo:
            todo += self._list_package_dir(pkg, todo.pop(), out)

    def _list_package_dir(self, pkg: str, sub: str, out: list[str]) -> list[str]:
        """Add to ``out`` the files of //pkg's directory ``sub``; its subdirectories to list."""
        wrel = "/".join(p for p in (pkg, sub) if p)
        self._listing(wrel)
        absdir = os.path.join(self.ws.root, wrel)
        try:
            it = os.scandir(absdir)
        except (FileNotFoundError, NotADirectoryError):  # (gone since its parent was listed)
            return []
        except OSError as e:
            raise UserError(_unlistable(wrel, f"glob() of //{pkg}", e)) from None
        dirs = []
        files = []
        with it:
            for entry in it:
                name = entry.name
                if name == CACHEDIR_TAG and wrel and self._cache_dir(f"{wrel}/{name}"):
                    return []  # (none of its files, nor its subdirectories)
                rel = f"{sub}/{name}" if sub else name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if name in ALWAYS_SKIPPED:
                            continue
                        child = f"{wrel}/{name}" if wrel else name
                        if self.ws.is_ignored(child):
                            continue
                        if os.path.exists(os.path.join(entry.path, BUILDFILE)) \
                                or os.path.exists(os.path.join(entry.path, MARKER)):
                            # A sub-package (or a nested workspace) owns its files: until the
                            # file that makes it one goes (its listing is not taken: probed).
                            self.probes.update((f"{child}/{BUILDFILE}", f"{child}/{MARKER}"))
                            continue
                        dirs.append(rel)
                    elif entry.is_file() and not name.endswith(RESTORE_TMP_SUFFIX):  # (buildtool's own temp)
                        files.append(rel)  # (follows a file symlink; dir symlinks are skipped)
                        if entry.is_symlink():  # (one to an output is left out: graph.py)
                            self.glob_links.add(f"{wrel}/{name}" if wrel else name)
                except OSError:
                    continue
        out += files
        return dirs


def dir_stat(path: str) -> tuple[int, int, int] | None:
    """What tells that a directory's entries changed: (mtime_ns, ctime_ns, inode); None: none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _unlistable(rel: str, doing: str, e: OSError) -> str:
    """A directory that cannot be listed: its packages or sources would silently drop out."""
    import errno

    fix = {errno.EACCES: "make it readable", errno.EPERM: "make it readable",
           errno.ENAMETOOLONG: "move what is in it to a shorter path"}.get(e.errno or 0, "repair the directory")
    return (f"{doing}: cannot list the directory {rel or '.'} ({e.strerror}); {fix}, "
            f"or name it in .buildtoolignore to leave it out")


class _ShadowedStdlib(Exception):
    """An import, while a BUILD.py was evaluated, of a workspace module named as a standard one."""


def _shadow_guard(real: Callable[..., Any], shadows: dict[str, str], root: str) -> Callable[..., Any]:
    """``__import__`` refusing a top-level import of a name in ``shadows``: which module it
    gets (the workspace's, or the standard one buildtool may have imported already) would
    depend on buildtool's flags, and a workspace one left in sys.modules is what buildtool's
    own later imports would find.  Only the workspace's code is refused: a BUILD.py or a
    module under ``root`` (not one installed there, nor buildtool's own lazy imports)."""
    ours = os.path.dirname(os.path.abspath(dsl.__file__)) + os.sep
    under = root + os.sep

    def guarded(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        top = name.partition(".")[0]
        where = (globals or {}).get("__file__") or "" if level == 0 and top in shadows else ""
        if where.startswith(under) and not where.startswith(ours) and not _INSTALLED.search(where):
            msg = (f"import of {top!r}: the workspace's {shadows[top]} is named as a standard library module, so "
                   "which of the two an import gets would depend on what buildtool had imported already; rename it")
            raise _ShadowedStdlib(msg)
        return real(name, globals, locals, fromlist, level)

    return guarded


class _StdlibFirst:
    """A finder (on sys.meta_path while a BUILD.py is evaluated, after the import probes,
    before Python's own) that resolves a name in ``shadows`` without the workspace root:
    an import of it by a standard module (``tempfile`` importing ``shutil``) or through
    importlib gets the standard module, whether or not buildtool had imported it already
    (the guard refuses the workspace's own imports of it)."""

    def __init__(self, shadows: dict[str, str], root: str) -> None:
        self.shadows = shadows
        self.root = os.path.realpath(root)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if path is not None or name not in self.shadows:
            return None
        import importlib.machinery

        # (a module built into this Python or frozen first: the finders after this one would
        # have found it, where the root's file would only be found after them)
        spec = importlib.machinery.BuiltinImporter.find_spec(name) or importlib.machinery.FrozenImporter.find_spec(name)
        if spec is not None:
            return spec
        elsewhere = [p for p in sys.path if os.path.realpath(p or ".") != self.root]  # (a link to it too)
        spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        if spec is None:  # (none on this system, winreg on Linux: not the workspace's either)
            raise ModuleNotFoundError(f"No module named {name!r} (the workspace's {self.shadows[name]} is not "
                                      "imported in its place)", name=name)
        return spec


class _PrintsToStderr:
    """``sys.stdout`` while a BUILD.py runs: what it prints goes to stderr, and closing it
    closes nothing (``sys.stdout.close()`` closed buildtool's own stderr); ``sys.stderr``
    too.  With a loading line on the terminal (``progress``), erasing that line first."""

    def __init__(self, err: Any, progress: Any = None) -> None:
        self._err = err
        self._progress = progress

    def write(self, text: str) -> int:
        if self._progress is not None:
            self._progress.clear()
        return int(self._err.write(text))

    def flush(self) -> None:
        self._err.flush()

    def close(self) -> None:
        return

    @property
    def closed(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._err, name)


class _ImportProbes:
    """A meta path finder that finds nothing: it notes where in the workspace an import
    made while a BUILD.py is evaluated looks for its module in vain (``m.py``,
    ``m/__init__.py``, ``m/``), so a module that was missing — an ImportError the BUILD.py
    caught, or one found further along sys.path — and then appears changes the graph too."""

    def __init__(self, root: str, probes: set[str], note: Callable[[str, Any], None]) -> None:
        self.root = root
        self.probes = probes
        self.note = note  # (Loader._note_look: which of them the workspace's own imports looked for)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        import _imp

        if fullname in sys.builtin_module_names or _imp.is_frozen(fullname):
            return  # (pwd, posix: found before any file, which can never take its place)
        last = fullname.rpartition(".")[2]
        inside = self.root + os.sep
        for entry in sys.path if path is None else path:
            entry = os.path.abspath(entry or ".")
            if entry == self.root or entry.startswith(inside):
                base = os.path.join(entry, last)
                for candidate in (base + ".py", os.path.join(base, "__init__.py"), base):
                    if not os.path.lexists(candidate):  # (one that exists is imported, and tracked so)
                        rel = os.path.relpath(candidate, self.root)
                        self.probes.add(rel)
                        if candidate is not base:  # (a file there, not a directory, is no module)
                            self.note(rel, sys._getframe(1))

    def invalidate_caches(self) -> None:
        return


_INSTALLED = re.compile(r"/(site|dist)-packages/")


def _line_in(exc: BaseException, filename: str) -> int | None:
    """The line of ``filename``'s last frame in the traceback of ``exc``."""
    import traceback  # (an error path)

    lines = [fs.lineno for fs in traceback.extract_tb(exc.__traceback__) if fs.filename == filename]
    return lines[-1] if lines else None


# Bazel's names a newcomer writes first, and what a BUILD.py here says instead.
_FROM_BAZEL = {
    "load": "a BUILD.py is Python: import a macro module from the workspace root, `from tools.defs import m`",
    "native": "the rules are plain functions here: genrule(...), test(...), not native.genrule",
    "filegroup": "use group(name, deps=[...]) for targets, or a list (or glob()) of files in srcs",
    "sh_test": "use test(name, cmd=\"sh script.sh\", srcs=[\"script.sh\"])",
    "sh_binary": "use genrule, or a source script the tests and commands run",
    "exports_files": "a package's files are visible to every package here: name one by its label, //pkg:file",
    "package": "packages take no declaration here: a directory with a BUILD.py is one",
}


def _suggestion(e: BaseException) -> str:
    """`` (did you mean 'genrule'?)`` for a NameError of a name close to one the failing
    code could see (its frame's locals and globals, the builtins): what Python's own
    traceback would say, which ``str(e)`` leaves out."""
    name = getattr(e, "name", None)
    if not isinstance(e, NameError) or not isinstance(name, str):
        return ""
    if name in _FROM_BAZEL:
        return f" ({_FROM_BAZEL[name]})"
    tb = e.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    import difflib  # (only for this error)

    frame = tb.tb_frame
    seen = [*frame.f_locals, *frame.f_globals, *dir(builtins)]
    near = difflib.get_close_matches(name, [n for n in seen if not n.startswith("__")], n=1, cutoff=0.7)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _text_of(e: BaseException) -> str:
    """``str(e)``, or its class's name when even that raises."""
    try:
        return str(e)
    except Exception:
        return f"(an exception whose message could not be made: {type(e).__name__})"


def _under_symlink(root: str, pkg: str) -> bool:
    path = root
    for part in pkg.split("/") if pkg else []:
        path = os.path.join(path, part)
        if os.path.islink(path):
            return True
    return False


def _whole_double_stars(segments: list[str]) -> str | None:
    """The pattern with each ``**b`` segment written as ``**/*b`` (``src/**.c`` ->
    ``src/**/*.c``): what an older buildtool matched for it; None when a segment has
    something before its ``**`` (``a**b`` also matched within one name: no one pattern
    says both)."""
    out: list[str] = []
    for seg in segments:
        head, stars, tail = seg.partition("**")
        if not stars or seg == "**":
            out.append(seg)
            continue
        if head:
            return None
        tail = tail.lstrip("*")
        out += ["**"] + ([f"*{tail}"] if tail else [])
    return "/".join(out)


def _checked_glob(pattern: str) -> re.Pattern[str]:
    try:
        return _glob_regex(pattern)
    except re.error as e:  # a [...] class such as [z-a]
        raise ValueError(f"glob pattern {pattern!r} is not a valid pattern ({e.msg})") from None


def _glob_regex(pattern: str) -> re.Pattern[str]:
    i, n, out = 0, len(pattern), []
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":  # fnmatch's rules: "]" first in the set is one of its characters; never "/"
            j = i + 1 + pattern.startswith("!", i + 1)
            j = pattern.find("]", j + pattern.startswith("]", j))
            if j == -1:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1 : j]
                neg = body.startswith("!")
                body = re.sub(r"([\\\[\]&~|^])", r"\\\1", body[neg:])  # (literal in the set; "-" ranges stay)
                out.append(f"[^/{body}]" if neg else f"(?!/)[{body}]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)
