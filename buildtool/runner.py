"""TargetRunner: one target's pipeline — key, rebuild decision, executor chain, record.

``try_inline`` runs in the scheduler's thread and settles up-to-date targets (and groups)
without a thread hop; ``run`` runs in a worker: the cache layer first (restore verified
blobs), then the subprocess executor; ``commit`` (scheduler thread) records the result
in the build record and makes the outputs' digests visible to dependents.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import stat
import sys
import time

from buildtool import discovered, keys, orphans, rebuild, simplecmd
from buildtool.atomic import RESTORE_TMP_SUFFIX, make_dirs, remove_path, temp_path
from buildtool.cache import INLINE_MAX, INLINE_TOTAL_MAX, ActionEntry, Cache, CachedOutput, CannotPlace
from buildtool.depfile import WorkspacePaths
from buildtool.digest import StatCache, hash_bytes, hash_file, is_remote, racy
from buildtool.executor import (
    MAX_ARG,
    PYRULE_MAIN,
    Running,
    SubprocessExecutor,
    arg_size,
    has_pipe,
    pidfds_work,
    pyrule_texts,
    shell_argv,
    shell_for,
)
from buildtool.graph import Graph, Target
from buildtool.noop import stat_row
from buildtool.outcome import Outcome, Reason, Status
from buildtool.record import BuildRecord, desc_of
from buildtool.workspace import FS_ENCODING, STATE_DIR, pkg_relative

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Mapping
    from typing import Any

SHORT_TMP_OVER = 60  # bytes: a lane directory's path over this reaches commands as a short link (_short_name)
FAILED_BEFORE_WHY = "it failed last time with this action key; a failing test runs until it passes"
ALWAYS_MAKE_WHY = "-B (--always-make): up to date, but every target runs"
DIRTY_KEY = "dirty"  # the record's key of a result not recorded (an input changed while it ran): never a key
INLINE_HASH_LIMIT = 1 << 20  # hash up to this many bytes of changed sources inline


class RunOptions:
    """How the runner runs actions: the base PATH, the --action-env variables, -n, test caching, -B."""

    __slots__ = ("action_env", "always_make", "base_path", "cache_tests", "dry_run", "run_tests")

    def __init__(self, base_path: str, action_env: dict[str, str | None] | None = None, dry_run: bool = False,
                 cache_tests: bool = True, run_tests: bool = True, always_make: bool = False) -> None:
        self.always_make = always_make  # -B: every target runs, whatever its record or the cache holds
        self.base_path = base_path
        self.action_env = {} if action_env is None else action_env  # name -> fixed value or None (inherit)
        self.dry_run = dry_run
        self.cache_tests = cache_tests
        self.run_tests = run_tests  # False for `build`: a test some target depends on is not run


class Pending:
    """A target whose command has started (``running``), or has run remotely (``result``):
    what ``TargetRunner._landed`` needs to turn the ended command into its Outcome."""

    __slots__ = ("desc", "key", "reason", "result", "running", "started_ns", "t", "tmp", "why")

    def __init__(
        self, t: Target, key: str, desc: dict[str, Any], reason: Reason, why: str, tmp: str, started_ns: int,
        running: Running | None, result: Any,
    ) -> None:
        self.t = t
        self.key = key
        self.desc = desc
        self.reason = reason
        self.why = why
        self.tmp = tmp
        self.started_ns = started_ns
        self.running = running
        self.result = result  # remote execution's result, when running is None

    # What the scheduler's event loop asks of a started target (scheduler.Runner.start).
    def pidfd(self) -> int | None:
        return None if self.running is None else self.running.pidfd()

    @property
    def deadline(self) -> float | None:
        return None if self.running is None else self.running.deadline

    def expire(self) -> None:
        if self.running is not None:
            self.running.expire()

    def wait(self) -> Any:
        """The command's result, waiting for it to end (executor.Running.wait)."""
        if self.running is not None:
            self.result, self.running = self.running.wait(), None
        return self.result

    def finish(self, ended: float | None = None) -> Any:
        """The result of a command that has ended (executor.Running.finish); kept, so that
        a worker thread can take the rest from here."""
        if self.running is not None:
            self.result, self.running = self.running.finish(ended), None
        return self.result


def _not_a_file(mode: int) -> str:
    """What an output that is not a regular file is, and what to do instead."""
    if stat.S_ISDIR(mode):
        return (": a directory (outputs are files; there are no directory outputs, as Bazel's tree "
                "artifacts): declare each file the command writes in outs, listed in the BUILD.py from what "
                "decides them, or pack the directory into one file (tar)")
    if stat.S_ISLNK(mode):
        return ": a symbolic link (outputs are files: copy what it leads to)"
    return ""


# Stamp keys of one run alone (stamp_key): a dependent's key naming one is cached nowhere.
_RUN_ALONE = ("always:", "dirty:", "unknown:")


class TargetRunner:
    """Implements scheduler.Runner for a real workspace."""

    def __init__(
        self,
        root: str,
        state_dir: str,
        graph: Graph,
        record: BuildRecord,
        stats: StatCache,
        cache: Cache,
        options: RunOptions,
        warn: Callable[[str], None],
    ) -> None:
        self.root = root
        self.state_dir = state_dir
        self.graph = graph
        self.record = record
        self.stats = stats
        self.cache = cache
        self.opt = options
        self.warn = warn
        self.executor = SubprocessExecutor()
        self.out_digests: dict[str, str] = {}  # per run: output path -> digest
        self.out_executable: set[str] = set()  # per run: those outputs made with the owner's x bit
        # Per run: source path -> (its stat as first read, its digest), as Ninja stats a file
        # once a build: 500 tests reading one 2,000-file library stat'ed it 500 times (9 s).
        # An edit after that first read is still caught: the stat a key was made with is
        # what the "changed while the command ran" check compares (_key_stats), and a
        # source that check finds changed is read again by the targets keyed after it.
        self._sources: dict[str, tuple[os.stat_result, str, int]] = {}  # (and when the stat was read)
        # (the headers a depfile names are read through it too: _discovered_digest)
        self._depfile_paths: WorkspacePaths | None = None  # per run: which depfile paths are workspace files
        self._executable: dict[int, list[str]] = {}  # per target: its sources with the x bit (the key has it)
        self._closure_memo: dict[int, str] = {}  # per target: closure_digest
        self.saved_meanwhile: Container[str] = ()  # (watch) files it saw saved during this build
        self.changed_before: Container[str] = ()  # (watch) inputs the last cycle found changed under a command
        self.changed_under: set[str] = set()  # inputs this build found changed while their command ran
        # per target in a closure: its input digests and the stats of its sources, as the digest read them
        self._closure_read: dict[int, tuple[dict[str, str], dict[str, tuple[int, int, int, int, int]]]] = {}
        self._remote_full: dict[int, dict[str, str]] = {}  # per test: its closure's digests (_remote_inputs)
        self._closure_of: dict[int, dict[str, str]] = {}  # per test: its dependencies' closure digests, by label
        self._stamps_of: dict[int, dict[str, str]] = {}  # per target: its dependencies without outputs (stamp_key)
        self._stamp_keys: dict[int, str] = {}  # per run: the key each target without outputs settled with
        self._run_token = os.urandom(8).hex()  # (an always=True stamp's stands for this run alone)
        self._any_stamp: bool | None = None  # whether the graph has a stamp at all (_stamp_deps)
        self._group_stamps: dict[int, tuple[int, ...]] = {}  # per group: the stamps it reaches
        self._always_memo: dict[int, bool] = {}  # per stamp: always=True, or behind one (_always_behind)
        self._left_remote = False  # an output this build knows of was left in a remote CAS (--remote-download)
        self.after: dict[int, list[int]] = {}  # the plan's edges from depfiles: reader -> makers (session.py)
        self.failed_tests: dict[str, str] = {}  # test label -> key its last (failing) run had (testing.py)
        self._desc: dict[int, tuple[str, dict[str, Any]]] = {}
        # Target -> the stat (size, mtime_ns, ino, ctime_ns) of each source as its key read
        # it: what the "changed while the command ran" check compares with (until _settled).
        self._key_stats: dict[int, dict[str, tuple[int, int, int, int, int]]] = {}  # (and when read, ns)
        self._module_stats: dict[int, dict[str, tuple[int, int, int, int, int]]] = {}  # a pyrule's modules, likewise
        self._texts: dict[int, tuple[dict[str, Any], str]] = {}  # per target: last description, its text
        self._primary_keys: dict[int, str] = {}  # per depfile target: its primary key (_discovered_lookup)
        self._linted: set[int] = set()  # targets whose command lint.py looked at in this run
        self._tool_digests: dict[str, str] = {}
        # Per target: where its declared tools were found, and the stat each one's digest in its key was taken at.
        self._tool_paths: dict[int, dict[str, list[int] | None]] = {}
        self._real_dirs: dict[str, str] = {}  # output directory -> its real path (_leads_elsewhere)
        self._unplaceable: set[int] = set()  # targets a cache hit could not be put in place for
        self._said_damaged = False  # a local entry whose blobs were missing or damaged (said once a build)
        self._refused: dict[int, str] = {}  # target -> key whose local entry the scheduler thread found unusable
        self._no_commands = False  # settle(): the build stopped; what needs its command stays unstarted
        self._described: frozenset[str] | None = None  # labels the cache's descriptions table holds
        self._claimed: dict[str, str] | None = None  # source or output path -> a target that has it
        self._tool_dirs: dict[str, None] = {}  # PATH directories searched before a tool was found (or in vain)
        self._tools_absent: dict[str, None] = {}  # where a tool was looked for in vain (or not executable)
        self._keyed_paths: dict[str, str] = {}  # PATH value -> as keys hold it (_key_env)
        self._checkout_root: str | None = None
        self.tool_stats: dict[str, list[int]] = {}  # path -> its stat just before it was hashed
        # (tool, where it was looked for) warned about: once, not once a target (35 compiles)
        self._missing_tools: set[tuple[str, tuple[str, ...]]] = set()
        self._owner_memo: dict[str, str] | None = None
        self.disk_modes: dict[str, int] = {}  # path -> st_mode the last _disk_digest of it saw
        self._lane_dirs: set[str] = set()  # the lanes' TMPDIRs made (_tmpdir)
        self._short_names: set[str] = set()  # the links to them made or checked (_short_name)
        self._hash_s: dict[int, float] = {}  # per target: time spent hashing its inputs (worker path)
        self._lane_hook: Callable[[int], None] | None = None  # scheduler.Runner's set_lane_hook
        self.remote: Any = None  # remote/cache_layer.RemoteCache under --remote-cache (docs/remote.md)
        self.remote_exec: Any = None  # remote/exec_layer.RemoteExecutor under --remote-executor

    @property
    def _owner(self) -> dict[str, str]:
        """output path -> label of the target declaring it (built on first use: explanations only)."""
        if self._owner_memo is None:
            self._owner_memo = {o: t.label for t in self.graph.targets for o in t.outs}
        return self._owner_memo

    def _producer_for(self, t: Target) -> Callable[[str], str | None]:
        """For ``t``'s explanations: the label of the target that produced input ``p``, or
        None for a source of ``t`` (no file is both: the graph refuses it), without the map
        of every output in the graph (``_owner``: 30 ms to build at 100,000 targets) when
        only sources changed, as in an edit-and-rebuild."""
        srcs: frozenset[str] | None = None

        def producer(p: str) -> str | None:
            nonlocal srcs
            if srcs is None:
                srcs = frozenset(t.srcs)
            return None if p in srcs else self._owner.get(p)

        return producer

    def _made_by_dependency(self, t: Target) -> Callable[[str], bool]:
        """Is ``p`` an output of one of ``t``'s dependencies, direct or not, and still what
        that dependency made?  All of them finished before ``t``'s command started, so a
        header one of them wrote just before (a generated header reached through another
        target) did not change during the run, unless its content now differs (edited by
        hand meanwhile: then it did).  Asked only of such recent files: the output map and
        ``t``'s ancestors are made on first use."""
        ancestors: set[int] | None = None

        def made(p: str) -> bool:
            nonlocal ancestors
            label = self._owner.get(p)
            if label is None or p not in self.out_digests:
                return False
            if ancestors is None:
                ancestors = self.graph.closure([*t.deps, *self.after.get(t.id, ())])
            if self.graph.by_label[label] not in ancestors:
                return False
            return not self._output_edited(p, self.out_digests[p])

        return made

    def tool_paths(self) -> list[str]:
        """Absolute paths of the tool binaries resolved during this run, and of the places
        a tool was looked for in vain (nothing there, or not executable: a chmod +x there
        changes which tool runs)."""
        return [*self._tool_digests, *self._tools_absent]

    def tool_dirs(self) -> list[str]:
        """The PATH directories searched in vain before each tool was found (all of them
        for a missing tool): a tool put in one of them would be found instead."""
        return list(self._tool_dirs)

    # -- helpers used by the scheduler ------------------------------------------------
    def set_lane_hook(self, hook: Callable[[int], None]) -> None:
        """``hook(t)`` once ``t``'s command has ended and its lane's TMPDIR is emptied."""
        self._lane_hook = hook

    def label_of(self, t: int) -> str:
        return self.graph.targets[t].label

    def deps_of(self, t: int) -> tuple[int, ...]:
        """What ``t`` waits for: its declared deps and the plan's depfile edges (a header
        another target makes), so a skip names the failed maker, not "a dependency"."""
        deps = self.graph.targets[t].deps
        after = self.after.get(t)
        return (*deps, *after) if after else deps

    # -- inputs and keys ---------------------------------------------------------------
    def _env(self, t: Target) -> dict[str, str]:
        env = {"PATH": self.opt.base_path}
        for name, fixed in self.opt.action_env.items():
            v = fixed if fixed is not None else os.environ.get(name)
            if v is not None:
                env[name] = v
        for name in t.pass_env:
            v = os.environ.get(name)
            if v is not None:
                env[name] = v
        env.update(t.env)
        if t.kind == "pyrule":  # (set by _execute, as the runner needs them: never --action-env's,
            env.pop("PYTHONPATH", None)  # which only changed the key, not the run)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env.pop("BUILDTOOL_PYRULE_MODULES", None)
        return env

    def _key_env(self, t: Target, env: dict[str, str] | None = None) -> dict[str, str]:
        """``t``'s environment as its key holds it: PATH entries inside the checkout from
        keys.CHECKOUT_MARK (``_execute`` turns them back into this checkout's paths)."""
        env = dict(self._env(t) if env is None else env)
        path = env.get("PATH")
        if path is not None:
            keyed = self._keyed_paths.get(path)
            if keyed is None:
                keyed = self._keyed_paths[path] = keys.keyed_path(path, self._checkout())
            env["PATH"] = keyed
        return env

    def _checkout(self) -> str:
        """keys.checkout_root of the workspace, looked up once (a few stats)."""
        if self._checkout_root is None:
            self._checkout_root = keys.checkout_root(self.root)
        return self._checkout_root

    def _tools(self, t: Target, env: dict[str, str]) -> dict[str, str]:
        out = {}
        if not t.tools:
            return out
        import shutil  # (only for declared tools: ~4 ms of import)

        found = self._tool_paths[t.id] = {}  # path -> the stat its digest was taken at

        # Found as the command finds it: a relative PATH entry from the package directory.
        cwd = os.path.join(self.root, t.pkg)
        search = [os.path.normpath(os.path.join(cwd, e)) for e in env.get("PATH", os.defpath).split(os.pathsep)]
        for name in t.tools:
            # A name with a slash is a path: from the package directory too (which() would
            # take it from this process's directory).
            if "/" in name:
                path = shutil.which(os.path.join(cwd, name))
            else:
                path = None
                for d in search:
                    path = shutil.which(name, path=d)
                    if path is not None:
                        break
                    self._tool_dirs[d] = None  # (a tool put there would be found first)
                    self._tools_absent[os.path.join(d, name)] = None  # (or one there made executable)
            if path is not None:
                path = os.path.abspath(path)
            elif "/" in name:  # (one made there, or made executable, would be found: the snapshot watches it)
                self._tools_absent[os.path.normpath(os.path.join(cwd, name))] = None
            if path is None:
                out[name] = "missing"
                looked = (name, (cwd,) if "/" in name else tuple(search))
                if looked not in self._missing_tools:
                    self._missing_tools.add(looked)
                    self.warn(f"{t.where}: {t.label}: declared tool {name!r} is not on the command's PATH")
                continue
            d = self._tool_digests.get(path)
            if d is None:
                try:
                    st = os.stat(path)  # (the no-op snapshot signs the tool against it)
                    d = hash_file(os.path.realpath(path))
                    self.tool_stats[path] = stat_row(st)
                except OSError:
                    d = "unreadable"
                self._tool_digests[path] = d
                if os.path.basename(os.path.dirname(path)) == "shims" and path not in _SAID_SHIMS \
                        and not path.startswith(self.root + os.sep) \
                        and not any(os.path.basename(i) in VERSION_FILES for i in self.graph.inputs[t.id]):
                    _SAID_SHIMS.add(path)  # (once a process: a watch session too)
                    self.warn(f"{t.where}: {t.label}: declared tool {name!r} is {path}, a version manager's shim "
                              "(pyenv, asdf, mise...), the same script whatever version it runs: switching "
                              "versions reruns nothing; list the file that picks the version (.python-version, "
                              ".tool-versions) in its srcs")
            out[name] = d
            found[path] = self.tool_stats.get(path)  # (None: it could not be read; nothing to compare)
        return out

    def _input_digests(
        self, t: Target, budget: int | None, keep_stats: bool = False,
        stats_into: dict[str, tuple[int, int, int, int, int]] | None = None,
    ) -> dict[str, str] | None:
        """path -> digest for every input; None if hashing would exceed ``budget`` bytes.
        ``keep_stats``: for a key the target may run with, keep the sources' stats as read
        (``stats_into``: in that dict, not as the target's own key's)."""
        keep_stats = keep_stats or stats_into is not None
        res: dict[str, str] = {}
        outs = self.out_digests
        sources = self._sources
        stats = self.stats
        root = self.root
        spent = 0
        executable: list[str] = []
        seen: dict[str, tuple[int, int, int, int, int]] = {}
        # (a group's: its members' files, for its closure digest -- a group keeps no list)
        for p in self.graph.inputs[t.id] if t.kind != "group" else self.graph.outputs_of(t.id):
            d = outs.get(p)
            if d is not None:
                if p in self.out_executable:  # (its mode is its producer's: same content, +x differs)
                    executable.append(p)
            else:
                known = sources.get(p)
                if known is not None and not racy(known[0].st_mtime_ns, known[0].st_ctime_ns, known[2]):
                    st, d, read_ns = known
                else:  # (first read, or written so shortly before it that a same-tick rewrite keeps the stat)
                    read_ns = time.time_ns()
                    st = os.stat(os.path.join(root, p))
                    d = stats.lookup(p, st)
                    if d is None:
                        if budget is not None:
                            spent += st.st_size
                            if spent > budget:
                                return None
                        d = stats.digest(p, st)
                    sources[p] = (st, d, read_ns)
                if keep_stats:
                    seen[p] = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, read_ns)
                if st.st_mode & 0o100:
                    executable.append(p)
            res[p] = d
        if executable:
            self._executable[t.id] = executable
        else:
            self._executable.pop(t.id, None)
        if stats_into is not None:
            stats_into.update(seen)
        elif keep_stats:
            self._key_stats[t.id] = seen
        if t.kind == "test" and t.deps:  # (a dependency's unreadable source: said as the test's own)
            labels = [self.graph.targets[d].label for d in t.deps]
            self._closure_of[t.id] = dict(zip(labels, map(self.closure_digest, t.deps), strict=True))
        if stats_into is None and t.deps:
            stamps = self._stamp_deps(t)
            if stamps:
                self._stamps_of[t.id] = {self.graph.targets[d].label: self.stamp_key(d) for d in stamps}
            else:
                self._stamps_of.pop(t.id, None)
        return res

    def _stamp_deps(self, t: Target) -> list[int]:
        """``t``'s dependencies that are genrules without outputs, directly or through groups
        (not a test: its record follows `test`, not `build`): Make's stamp targets, whose
        effects ``t``'s key cannot see in its inputs.  Nothing to look for in a graph without
        any (most); a group's are found once a run (1,500 targets behind a group of 1,500:
        a walk of the group each was 1.3 s)."""
        targets = self.graph.targets
        if self._any_stamp is None:
            self._any_stamp = any(not x.outs and x.kind == "genrule" for x in targets)
        if not self._any_stamp:
            return []
        found: dict[int, None] = {}
        for d in t.deps:
            dt = targets[d]
            if dt.kind == "group":
                found.update(dict.fromkeys(self._stamps_in_group(d)))
            elif not dt.outs and dt.kind == "genrule":
                found[d] = None
        return list(found)

    def _stamps_in_group(self, gid: int) -> tuple[int, ...]:
        """The stamps group ``gid`` reaches through its members (groups within it too), memoised."""
        memo = self._group_stamps
        targets = self.graph.targets
        stack = [gid]
        while stack:  # (post-order without recursion: groups may nest deep)
            g = stack[-1]
            if g in memo:
                stack.pop()
                continue
            inner = [d for d in targets[g].deps if targets[d].kind == "group" and d not in memo]
            if inner:
                stack.extend(inner)
                continue
            stack.pop()
            found: dict[int, None] = {}
            for d in targets[g].deps:
                dt = targets[d]
                if dt.kind == "group":
                    found.update(dict.fromkeys(memo[d]))
                elif not dt.outs and dt.kind == "genrule":
                    found[d] = None
            memo[g] = tuple(found)
        return memo[gid]

    def _note_stamp(self, t: Target, key: str, dirty: bool = False, again: bool = False) -> None:
        """The key a genrule without outputs settled with (or, in a dry run, would run with),
        as its dependents' keys name it (stamp_key): its key, and the token of a run that ran
        it again under the key its record line held already (``again``: this one; ``build
        -B``), so that they rerun then too; this run's own when it has always=True or its
        result was not recorded (an input changed while it ran: its rerun has the same key,
        and its dependents must not stay as they were).  A stamp run under a new key (a
        fresh checkout's first run) adds no token: its dependents can be restored."""
        if not t.outs and t.kind == "genrule":
            self._stamp_keys[t.id] = f"always:{self._run_token}" if self._always_behind(t.id) else \
                f"dirty:{self._run_token}" if dirty else \
                f"{key}+{self._run_token}" if again else _with_run(key, self.record.get(t.label))

    def _ran_again(self, t: Target, outcome: Outcome) -> bool:
        """Whether stamp ``t`` ran under the key its record line holds (``build -B``)."""
        if outcome.status is not Status.RAN or t.outs or t.kind != "genrule":
            return False
        entry = self.record.get(t.label)
        return entry is not None and entry.get("k") == outcome.key

    def _always_behind(self, tid: int) -> bool:
        """Whether stamp ``tid`` has always=True, or a stamp it depends on (through groups and
        other stamps) does: its key then changes every build, so it stands for this run
        alone, as the always=True one does (a chain a -> b -> d gave d a new key, cached and
        uploaded, each build).  Memoised for the run."""
        memo = self._always_memo
        targets = self.graph.targets
        stack = [tid]
        while stack:  # (post-order without recursion: a chain of stamps may be long)
            s = stack[-1]
            if s in memo:
                stack.pop()
                continue
            below = self._stamp_deps(targets[s])
            waiting = [d for d in below if d not in memo]
            if waiting and not targets[s].always:
                stack.extend(waiting)
                continue
            stack.pop()
            memo[s] = targets[s].always or any(memo[d] for d in below)
        return memo[tid]

    def _uncached(self, t: Target) -> bool:
        """Whether ``t``'s result is neither looked up in a cache nor stored there: a stamp
        (a genrule without outputs), whose result is what it did to this workspace, which a
        cache entry cannot do again (taken from one, it left a half-done install or another
        key's files in place as they were); and a target whose key names an always=True
        stamp, a key of this run alone that no build would ever ask for."""
        return (not t.outs and t.kind == "genrule") or \
            any(v.startswith(_RUN_ALONE) for v in self._stamps_of.get(t.id, {}).values())

    def stamp_key(self, tid: int) -> str:
        """What a dependency without outputs stands for in its dependents' keys (``extra``
        ``after:<label>``, docs/formats.md): the action key it settled with in this build,
        else the one the build record holds (a focused or incremental build that did not
        plan it); an ``always=True`` one's is this run's own.  A Make user's stamp rule that
        generates files it does not declare must rerun its dependents when it reruns, and
        only then: their inputs, which list its outputs, list none of it."""
        key = self._stamp_keys.get(tid)
        if key is None:
            if self._always_behind(tid):  # (not planned, in a focused build: as if it ran)
                return f"always:{self._run_token}"
            entry = self.record.get(self.graph.targets[tid].label)
            key = entry.get("k") if entry else None
            if isinstance(key, str) and key and key != DIRTY_KEY:
                return _with_run(key, entry)
        return key if isinstance(key, str) and key and key != DIRTY_KEY else f"unknown:{self._run_token}"

    def closure_digest(self, tid: int) -> str:
        """The digest of everything target ``tid`` reads, at any depth: its inputs (paths,
        digests, executable bits) and this digest of each of its dependencies, memoised for
        the run.  A test's key holds its direct dependencies' (``extra`` ``closure:<label>``,
        docs/formats.md): a file a script reads two levels down reruns the test, as Bazel's
        runfiles do, while the key and its record line stay the size of the test's own
        inputs (a flat list of the closure made them tests x closure: 69 MB of record, 4 s
        of a cached ``test //...`` with 200 tests over 10,000 files)."""
        memo = self._closure_memo
        targets = self.graph.targets
        stack = [tid]
        while stack:  # (post-order without recursion: a chain may be thousands deep)
            i = stack[-1]
            if i in memo:
                stack.pop()
                continue
            t = targets[i]
            waiting = [d for d in t.deps if d not in memo]
            if waiting:
                stack.extend(waiting)
                continue
            stack.pop()
            self._publish_recorded(t.deps)
            read: dict[str, tuple[int, int, int, int, int]] = {}
            own = self._input_digests(t, None, stats_into=read)
            assert own is not None  # (no budget)
            self._closure_read[i] = (own, read)
            below = {targets[d].label: memo[d] for d in t.deps}
            memo[i] = keys.key_of(
                {"inputs": own, "executable": sorted(self._executable.get(i, ())), "deps": below}
            )
        return memo[tid]

    def _publish_recorded(self, deps: Iterable[int]) -> None:
        """The outputs of ``deps`` this build has not made or checked, as the build record
        has them: a closure reaches targets a focused (watch) or incremental build does not
        plan, whose outputs it takes from the record (a file left in a remote CAS is not on
        disk to hash; one that is would be hashed on the scheduler's thread)."""
        for d in deps:
            t = self.graph.targets[d]
            if t.kind == "group" or all(o in self.out_digests for o in t.outs):
                continue
            entry = self.record.get(t.label)
            for p, dg, *m in entry.get("o", ()) if entry else ():
                if p not in self.out_digests:
                    self.publish_output(p, dg, m[0] if m else None)

    def _closure_changed(self, t: Target, started_ns: int) -> str | None:
        """The first source below ``t``'s dependencies, at any depth, that changed while its
        command ran, as ``_inputs_changed`` judges its own: a test's key names them only
        through closure digests, read once (an A-B-A rewrite below during the run, `git
        stash; git stash pop`, must not leave a pass recorded for content it did not see)."""
        for j in self.graph.closure(t.deps):
            own, stats = self._closure_read.get(j, ({}, {}))
            for p, was in stats.items():
                if self._moved(p, own[p], was, started_ns):
                    self._sources.pop(p, None)
                    self._closure_memo = {}  # (the tests keyed from now on read it again; a new dict:
                    return p  # a worker thread computing one meanwhile goes on with the one it holds)
        return None

    def same_action(self, t: Target, desc: Mapping[str, Any]) -> bool:
        """Whether a recorded description has ``t``'s kind, command, environment, outputs
        and input paths: the parts of its key known without hashing anything (a cheap
        guess for critical-path weights; the rebuilder decides)."""
        if t.depfile is not None and isinstance(desc.get("discovered"), list):  # (headers it found: inputs too)
            desc = discovered.primary_description(desc)
        timeout = repr(t.timeout) if t.kind == "test" and t.timeout is not None else None
        return (desc.get("kind") == t.kind and desc.get("cmd") == t.cmd and desc.get("outs") == list(t.outs)
                and desc.get("env") == self._key_env(t) and desc.get("extra", {}).get("timeout") == timeout
                and desc.get("inputs", {}).keys() == set(self.graph.inputs[t.id]))

    def describe(self, t: Target, inputs: dict[str, str]) -> tuple[str, dict[str, Any]]:
        env = self._env(t)
        extra: dict[str, str] = {}
        if t.kind == "pyrule":
            assert t.fn is not None
            extra["fn"] = t.fn
            extra["kwargs"] = t.kwargs_json or "{}"
            extra["python"] = keys.python_identity()
            seen: dict[str, tuple[int, int, int, int, int]] = {}
            for f in keys.pyrule_module_files(self.root, t.fn):
                read_ns = time.time_ns()
                st = os.stat(os.path.join(self.root, f))
                extra["module:" + f] = self.stats.digest(f, st)
                seen[f] = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, read_ns)
            self._module_stats[t.id] = seen  # (an A-B-A edit while it runs: as for inputs, _moved)
            order = list(self.graph.inputs[t.id])  # the function gets them in this order; `inputs` is sorted
            if order != sorted(order):  # (absent when sorted, so the keys of most pyrules did not change)
                extra["srcs"] = json.dumps(order)
        if t.depfile is not None:
            extra["depfile"] = t.depfile
        if t.kind == "test" and t.timeout is not None:  # a tighter timeout may fail a cached pass
            extra["timeout"] = repr(t.timeout)
        if t.kind == "test":  # what its dependencies read, at any depth (closure_digest)
            for label, d in self._closure_of.get(t.id, {}).items():
                extra["closure:" + label] = d
        for label, d in self._stamps_of.get(t.id, {}).items():
            extra["after:" + label] = d
        if FS_ENCODING is not None:  # (`echo é` writes other bytes under Latin-1: not the UTF-8 run's result)
            extra["encoding"] = FS_ENCODING.lower()
        executable = self._executable.get(t.id)
        if executable:  # inputs with the owner's x bit: `cp` carries it into the output
            extra["executable"] = json.dumps(sorted(executable))
        shell = shell_for(t.cmd) if t.kind in ("genrule", "test") else "python"
        desc = keys.action_description(
            t.kind, t.pkg, t.cmd, shell, self._key_env(t, env), self._tools(t, env), inputs, t.outs, extra
        )
        text = keys.canonical(desc)
        self._texts[t.id] = (desc, text)  # the build record stores the same text
        return keys.key_of_text(text), desc

    def _disk_digest(self, p: str) -> str | None:
        try:
            st = os.stat(os.path.join(self.root, p))
        except OSError:
            return None
        self.disk_modes[p] = st.st_mode  # (rebuild.outputs_match's mode_of: no second stat)
        return self._digest_at(p, st)

    def _digest_at(self, p: str, st: os.stat_result) -> str | None:
        """The content digest of the file ``p`` whose stat is ``st`` (the stat cache's, or
        hashed now); None for anything but a regular file, or one that cannot be read."""
        if not stat.S_ISREG(st.st_mode):
            return None
        d = self.stats.lookup(p, st)
        if d is None:
            try:
                d = self.stats.digest(p, st)
            except OSError:
                return None
        return d

    # -- discovered inputs (depfile targets; discovered.py) ------------------------------
    def _discovered_digest(self, p: str) -> str | None:
        """The digest of a discovered input (a header a depfile named), read once a build as
        a declared source's is: 2,000 compiles naming one header stat it once, not 2,000
        times.  A file not there, or not a regular file, is None."""
        d = self.out_digests.get(p)
        if d is not None:
            return d
        known = self._sources.get(p)
        if known is not None and not racy(known[0].st_mtime_ns, known[0].st_ctime_ns, known[2]):
            return known[1]
        read_ns = time.time_ns()
        try:
            st = os.stat(os.path.join(self.root, p))
        except OSError:
            return None
        d = self._fresh_digest(p, st)
        if d is not None:
            self._sources[p] = (st, d, read_ns)
        return d

    def _fresh_digest(self, p: str, st: os.stat_result) -> str | None:
        """The digest of the file ``p`` whose stat ``st`` was just read (an output of this
        build: as made); a build's earlier read of it is forgotten when the content moved."""
        d = self.out_digests.get(p) or self._digest_at(p, st)
        if d is None:
            return None
        known = self._sources.get(p)
        if known is not None and known[1] != d:  # (the targets keyed from now on read it again)
            self._sources.pop(p, None)
        return d

    def final_key(
        self, t: Target, key: str, desc: dict[str, Any], entry: dict[str, Any] | None
    ) -> tuple[str, dict[str, Any]]:
        """The key that decides up_to_date: for a depfile target, the primary key plus the
        current digests of the inputs its last run discovered (read from the record)."""
        if t.depfile is None:
            return key, desc
        paths = self.record.discovered(t.label) if entry is not None else None  # (entry: the record's, of t)
        return discovered.final_key(desc, paths or [], self._discovered_digest)

    def _discovered_lookup(
        self, t: Target, key: str, desc: dict[str, Any]
    ) -> tuple[str, dict[str, Any], ActionEntry | None]:
        """Two-level cache lookup through the manifest of the primary key."""
        pdesc = discovered.primary_description(desc)
        pkey = self._primary_keys[t.id] = keys.key_of(pdesc)
        found = discovered.Manifests(self.cache, self.warn).lookup(pkey, pdesc, self._discovered_digest)
        if found is None:
            return key, desc, None
        hit, fkey, fdesc = found
        return fkey, fdesc, hit

    def _discover(
        self, t: Target, desc: dict[str, Any], started_ns: int
    ) -> tuple[str, dict[str, Any], str | None] | str:
        """After a successful run: (final key, final description, input changed during the
        run or None) from the depfile, which is then deleted unless declared; or an error."""
        assert t.depfile is not None
        pdesc = discovered.primary_description(desc)
        exclude = {*pdesc["inputs"], *t.outs, t.depfile}
        full = os.path.join(self.root, t.depfile)
        if self._depfile_paths is None:
            self._depfile_paths = WorkspacePaths(self.root)
        got = discovered.discover(full, self.root, t.pkg, exclude, self._fresh_digest, started_ns,
                                  self._made_by_dependency(t), self._depfile_paths)
        if t.depfile not in t.outs:
            try:
                os.unlink(full)
            except OSError:
                pass
        if isinstance(got, str):
            return got
        found, late = got
        fdesc = discovered.final_description(pdesc, found)
        self._warn_undeclared(t, fdesc)
        if late is None:  # (the primary key as the lookup made it: one encoding of 200 headers' digests less)
            pkey = self._primary_keys.get(t.id) or keys.key_of(pdesc)
            discovered.Manifests(self.cache, self.warn).add(pkey, fdesc["discovered"])
        text = keys.canonical(fdesc)
        self._texts[t.id] = (fdesc, text)  # the build record stores the same text
        return keys.key_of_text(text), fdesc, late

    def _warn_undeclared(self, t: Target, fdesc: dict[str, Any]) -> None:
        """Warn when a discovered input (a header the depfile names) is the output of a
        target that is not among ``t``'s dependencies: nothing orders the two, so ``t`` may
        read it before it is made or while it is rewritten (Bazel refuses such an
        inclusion; Ninja says nothing).  On every run of ``t``, not only when its inputs
        changed: a header it always read may have become another target's output (a genrule
        added to make it), and the next build may then compile it before it is remade.  (The
        map of every output is built once per build: ~3 ms at 10,000 targets.)"""
        ancestors: set[int] | None = None
        for p in fdesc["discovered"]:
            owner = self._owner.get(p)
            if owner is None or owner == t.label:
                continue
            if ancestors is None:
                ancestors = self.graph.closure(t.deps)
            if self.graph.by_label[owner] not in ancestors:
                self.warn(f"{t.label}: its depfile names {p}, an output of {owner}, which is not among its "
                          f"dependencies; add {owner} to its deps (hdr_deps of a cc_* macro), or {p} may be "
                          "read before it is made or while it is rewritten")

    def discovered_inputs(self, among: Iterable[int] | None = None) -> list[str]:
        """Every recorded discovered input of this graph's depfile targets, or of those
        ``among`` these ids (no-op snapshot)."""
        out: list[str] = []
        targets = self.graph.targets
        for t in targets if among is None else (targets[i] for i in among):
            if t.depfile is not None:
                out.extend(self.record.discovered(t.label) or ())
        return out

    # -- scheduler.Runner --------------------------------------------------------------
    def runs_nothing(self, tid: int) -> Outcome | None:
        """The outcome of a target that has nothing to run in this build (a group, a test
        that ``build`` reached), whatever its inputs; None for the others."""
        t = self.graph.targets[tid]
        if t.kind == "group":
            return Outcome(Status.UP_TO_DATE, Reason.GROUP, "group: builds its members, runs nothing")
        if t.kind == "test" and not self.opt.run_tests:  # reached as a dependency: `build` runs no test
            return Outcome(Status.UP_TO_DATE, Reason.TEST_NOT_RUN,
                           f"a test: `build` builds what it needs, `buildtool test {t.label}` runs it",
                           extra={"record": True})
        return None

    def try_inline(self, tid: int, waiting: bool = False) -> Outcome | None:
        done = self._try_inline(tid, waiting)
        if done is not None:
            self._key_stats.pop(tid, None)
            self._module_stats.pop(tid, None)
        return done

    def _try_inline(self, tid: int, waiting: bool = False) -> Outcome | None:
        """``waiting``: the target would otherwise wait (a full pool, an exclusive test while
        others run): a local cache hit is looked up here even without a record entry (a
        fresh checkout's cached test), as it would need neither the slot nor the machine."""
        t = self.graph.targets[tid]
        fixed = self.runs_nothing(tid)
        if fixed is not None:
            return fixed
        if self.reruns_anyway(t):
            return None  # always=True, -B, --no-cache-tests, a test that failed: a worker decides
        if not self.opt.dry_run and not waiting and t.label not in self.record.entries:
            return None  # never built here: the key is computed by a worker, off this thread
        try:
            inputs = self._input_digests(t, INLINE_HASH_LIMIT, keep_stats=True)
        except OSError:
            return None  # let the worker report it
        if inputs is None:
            return None
        key, desc = self.describe(t, inputs)
        self._desc[tid] = (key, desc)
        entry = self.record.get(t.label)
        key, desc = self.final_key(t, key, desc, entry)
        on_disk: dict[str, str | None] = {}  # what the check found, for the restore below
        base = self._outputs_digest(t, entry)

        def noted(p: str) -> str | None:
            d = on_disk[p] = base(p)
            return d

        # (An entry with outputs left remote checks them otherwise: its findings are not kept.)
        ok, _, why = rebuild.up_to_date(entry, key, noted if base == self._disk_digest else base,
                                        self.disk_modes.get)
        if ok:
            assert entry is not None
            self._texts.pop(tid, None)  # not recorded again
            return Outcome(
                Status.UP_TO_DATE,
                Reason.UP_TO_DATE,
                f"up to date: {rebuild.UNCHANGED}",
                key=key,
                extra={"outputs": entry["o"]},
            )
        if self.opt.dry_run:
            return self._dry_run(t, key, desc, entry)
        same = entry is not None and entry.get("k") == key
        if (same or waiting) and t.depfile is None and not self._failed_before(t, key) and not self._uncached(t):
            # Same action as last time, outputs missing or edited: a restore from the local
            # cache of small blobs costs less than the hop to a worker thread (W6).
            hit = self.cache.get_action(key)
            if hit is not None and self.cache.blobs_smaller_than(hit, INLINE_HASH_LIMIT):
                if not same and entry is not None:  # (the reason the worker would give)
                    why = self._why_changed(t, entry, desc)[1]
                done = self._restored(t, hit, key, desc, why, "local", on_disk)
                if done is not None:
                    self._prepare_record(tid, done)
                    return done
                self._refused[tid] = key  # (it said why: the worker does not try the entry again)
        return None

    def settle(self, tid: int) -> Outcome | None:
        """Scheduler thread, once a failure stopped the build (without -k) and nothing runs:
        ``tid``'s outcome if it needs no command (up to date, a restore from a cache of any
        size, a depfile target's too, a cached test pass), else None (it stays unstarted).
        ``try_inline`` leaves large restores and depfile targets to workers: a fresh
        checkout's cached cc_test showed as NOT RUN when a failure came first."""
        done = self.try_inline(tid, True)
        if done is not None:
            return done
        self._no_commands = True
        step = self._run(tid, 0)
        assert not isinstance(step, Pending)
        return None if step is None else self._settled(tid, step)

    def run(self, tid: int, lane: int) -> Outcome:
        """Worker thread: decide, restore or execute; pre-serialise the record entry."""
        step = self._run(tid, lane)
        assert step is not None  # only the scheduler thread's calls hand work on
        if isinstance(step, Pending):
            step = self._landed(step, step.wait(), True)
        return self._settled(tid, step)

    def start(self, tid: int, lane: int) -> Outcome | Pending | None:
        """Scheduler thread (scheduler.Runner's optional ``start``): ``run`` up to the start
        of the command, when that is cheap: no remote cache or executor, inputs to hash
        within INLINE_HASH_LIMIT bytes, pidfds available.  A Pending comes back through
        ``complete`` once its process has exited; None: a worker thread runs the target."""
        if self.remote is not None or self.remote_exec is not None or not pidfds_work():
            return None
        if tid not in self._desc:
            t = self.graph.targets[tid]
            try:
                t0 = time.monotonic()
                inputs = self._input_digests(t, INLINE_HASH_LIMIT, keep_stats=True)
            except OSError:
                return None  # a worker reports it
            if inputs is None:
                return None
            self._hash_s[tid] = time.monotonic() - t0
            self._desc[tid] = self.describe(t, inputs)
        step = self._run(tid, lane, here=True)
        if step is None:
            return None  # a restore of large blobs: a worker's
        return step if isinstance(step, Pending) else self._settled(tid, step)

    def complete(
        self, step: Pending, wait: bool = False, ended: float | None = None, here: bool = True
    ) -> Outcome | None:
        """The outcome of a command from ``start`` whose process exited (at ``ended``,
        time.monotonic; ``wait``: it may not have: block until it does).  ``here``: on the
        scheduler's thread, which does not hash outputs of more than INLINE_HASH_LIMIT
        bytes: None then, and a worker calls this again with ``here=False``."""
        res = step.wait() if wait else step.finish(ended)
        if here and res.exit_code == 0 and not res.timed_out and self._outputs_size(step.t) > INLINE_HASH_LIMIT:
            return None
        return self._settled(step.t.id, self._landed(step, res, not here))

    def _missing_header_hint(self, t: Target, output: bytes) -> str:
        """For a compile that failed on a header it could not find: the target that makes a
        file of that name, when ``t`` does not depend on it (a generated header missing from
        ``hdr_deps``: the first build has no depfile to order the two by), as a sentence."""
        import re

        m = re.search(rb"fatal error: '?([^':\n]+?)'?(?::| file not found)", output)  # (gcc's, clang's)
        if m is None:
            return ""
        name = m.group(1).decode("utf-8", "replace").strip()
        makers = sorted({lab for p, lab in self._owner.items() if p == name or p.endswith("/" + name.lstrip("./"))})
        ancestors = {self.graph.targets[i].label for i in self.graph.closure(t.deps)}
        makers = [lab for lab in makers if lab not in ancestors and lab != t.label]
        if len(makers) != 1:
            return ""
        return (f" ({name} is made by {makers[0]}, which {t.label} does not depend on: add it to hdr_deps of the "
                "cc_* macro, or to deps)")

    def _outputs_size(self, t: Target) -> int:
        size = 0
        for o in t.outs:
            try:
                size += os.lstat(os.path.join(self.root, o)).st_size
            except OSError:
                pass
        return size

    def _settled(self, tid: int, outcome: Outcome) -> Outcome:
        t = self.graph.targets[tid]
        if not outcome.ok and not t.outs and t.kind == "genrule":
            # A stamp that failed or was stopped part-way did part of its work: its record's
            # run no longer describes the workspace (its inputs put back, it was "up to date"
            # over a half-done install), so it runs next time whatever its key.
            outcome.extra.setdefault("forget", []).append(t.label)
        if not t.flaky:  # (a flaky test's next attempt runs with the same key)
            self._key_stats.pop(tid, None)
            self._module_stats.pop(tid, None)
        hashed = self._hash_s.pop(tid, None)
        if hashed is not None:  # seconds spent hashing this target's inputs (a span in --profile)
            outcome.extra["hash_s"] = hashed
        self._prepare_record(tid, outcome)
        return outcome

    def _prepare_record(self, tid: int, outcome: Outcome) -> None:
        """The build-record line of a successful outcome, serialised before commit()."""
        fresh_by_record = outcome.status is Status.UP_TO_DATE and outcome.reason is not Reason.ADOPTED
        described = self._texts.pop(tid, None)
        t = self.graph.targets[tid]
        again = outcome.ok and bool(outcome.key) and self._ran_again(t, outcome)
        if again:  # (no request's no-op snapshot may vouch for its dependents: they list no file of it)
            from buildtool import noop

            noop.drop_all(self.state_dir)
        if outcome.ok and outcome.key:
            self._note_stamp(t, outcome.key, bool(outcome.extra.get("dirty")), again)
        if outcome.ok and (outcome.extra.get("record", not fresh_by_record) or outcome.extra.get("dirty")):
            label = self.label_of(tid)
            desc = outcome.extra.get("desc") or self._desc.get(tid, ("", {}))[1]
            text = described[1] if described is not None and described[0] is desc else None
            prev = self.record.get(label)
            # The command's duration: this run's, else the cache entry's (a restore to a fresh
            # checkout: what `plan` and the critical path weigh; 0: a remote entry without
            # timestamps), else the record's.
            duration = outcome.duration if outcome.status is Status.RAN else \
                outcome.extra.get("ran_for") or (prev or {}).get("d", outcome.duration)
            # always=True, or an input changed while it ran: recorded (outputs, duration) under
            # a key that never matches, so it runs next time and its outputs are known.
            key = "" if self.graph.targets[tid].always else DIRTY_KEY if outcome.extra.get("dirty") else outcome.key
            outputs = outcome.extra.get("outputs")
            # (a stamp run again under its recorded key: the run's token, which its dependents'
            # keys hold with that key)
            run = self._run_token if again else None
            if prev is not None and text is not None and self.record.holds(prev, key, outputs, duration, text, run):
                return  # a restore of what the record says already: no line (W6 appends none)
            outcome.extra["record_entry"] = self.record.prepare(
                label, key, outputs, duration, desc, text, run  # type: ignore[arg-type]
            )

    def _run(self, tid: int, lane: int, here: bool = False) -> Outcome | Pending | None:
        """The target's pipeline up to the start of its command.  ``here``: on the
        scheduler's thread, which leaves restores of blobs over INLINE_HASH_LIMIT bytes to a
        worker (None)."""
        t = self.graph.targets[tid]
        pre = self._desc.get(tid)
        if pre is None:
            try:
                t0 = time.monotonic()
                inputs = self._input_digests(t, None, keep_stats=True)
                self._hash_s[tid] = time.monotonic() - t0
            except OSError as e:
                return Outcome(Status.FAILED, Reason.FAILED, f"cannot read input {e.filename}: {e.strerror}",
                               extra={"not_started": True})
            pre = self.describe(t, inputs)
            self._desc[tid] = pre
            entry = self.record.get(t.label)
            fkey = self.final_key(t, *pre, entry)[0]
            ok, _, _ = rebuild.up_to_date(entry, fkey, self._outputs_digest(t, entry), self.disk_modes.get)
            # (a test whose last attempt with this key failed, its record's pass still there:
            # a flaky retry interrupted after a failed attempt was "PASSED (cached)" next)
            if ok and entry is not None and not self._never_fresh(t) and not self._failed_before(t, fkey):
                return Outcome(
                    Status.UP_TO_DATE, Reason.UP_TO_DATE, "up to date", key=fkey, extra={"outputs": entry["o"]}
                )
        key, desc = pre
        entry = self.record.get(t.label)
        key, desc = self.final_key(t, key, desc, entry)
        cache_skip = self._never_fresh(t) or self._uncached(t)
        failed_before = self._failed_before(t, key)
        if t.always:
            reason, why = Reason.ALWAYS, "always=True: runs on every build, never cached"
        elif self.opt.always_make and entry is not None and entry.get("k") == key:
            reason, why = Reason.ALWAYS_MAKE, ALWAYS_MAKE_WHY
        elif cache_skip and entry is not None and entry.get("k") == key:
            reason, why = Reason.NO_CACHE_TESTS, "--no-cache-tests: the test passed before but runs again"
        elif failed_before:
            cache_skip = True
            reason, why = Reason.FAILED_BEFORE, FAILED_BEFORE_WHY
        elif entry is not None and entry.get("k") == key:
            _, reason, why = rebuild.outputs_match(entry.get("o", []), self._outputs_digest(t, entry),
                                                   self.disk_modes.get)
            assert reason is not None
        else:
            reason, why = self._why_changed(t, entry, desc)
        if self.opt.dry_run:
            return self._dry_run(t, key, desc, entry)
        if entry is not None and entry.get("k") == key and not cache_skip and self.remote_exec is not None:
            done = self._fetch_left_remote(t, entry, key, desc, why)
            if done is not None:
                return done
        corrupt, lost = False, False
        if not cache_skip:
            if t.depfile is not None:
                key, desc, hit = self._discovered_lookup(t, key, desc)
            else:
                hit = self.cache.get_action(key)
            if hit is not None:
                if here and not self.cache.blobs_smaller_than(hit, INLINE_HASH_LIMIT):
                    return None
                done = None if self._refused.get(t.id) == key else self._restored(t, hit, key, desc, why, "local")
                if done is not None:
                    return done
                # (the entry was fine where its outputs could not be put: no damage)
                corrupt = self._leads_elsewhere(t) is None and t.id not in self._unplaceable
                lost = corrupt and not self._said_damaged and self.cache.lost_blobs(hit)  # (said once)
        if self.remote is not None and not cache_skip and t.depfile is None:
            done = self._remote_restore(t, key, desc, why)
            if done is not None:
                return done
        if corrupt:
            reason, why = Reason.CACHE_CORRUPT, f"{why}; the cache entry was damaged"
            if lost and not self.cache.damage_said:  # (a cache restored in part, blobs deleted by hand:
                self._said_damaged = True  # each such target ran, said by --explain only)
                self.warn(f"{t.label}: its cache entry names blobs the cache no longer has; running its command "
                          "(said once a build: `--explain` names each such target)")
        elif not cache_skip:
            why = f"{why}; {self._no_entry(t, key)}{self._stored_elsewhere(t, key, desc, entry)}"
        if self._no_commands:
            return None
        return self._execute(t, key, desc, reason, why, lane)

    # -- outputs left in the remote executor's CAS (--remote-download; docs/remote.md) ----------
    def _outputs_digest(self, t: Target, entry: dict[str, Any] | None) -> Callable[[str], str | None]:
        """The digest-on-disk function that checks ``t``'s recorded outputs.  An output recorded
        as a ``remote:`` digest matches when its file is absent and this build may leave it
        remote, or when the file on disk has that remote digest (it was fetched)."""
        recorded = {o[0]: o[1] for o in entry.get("o", ()) if is_remote(o[1])} if entry else None
        if not recorded:
            return self._disk_digest
        lazy_ok = self.remote_exec is not None and self.remote_exec.leaves_remote(t)

        def digest_of(p: str) -> str | None:
            marker = recorded.get(p)
            if marker is None:
                return self._disk_digest(p)
            full = os.path.join(self.root, p)
            if not os.path.lexists(full):
                return marker if lazy_ok else None
            return marker if _has_remote_digest(full, marker) else self._disk_digest(p)

        return digest_of

    def _fetch_left_remote(
        self, t: Target, entry: dict[str, Any], key: str, desc: dict[str, Any], why: str
    ) -> Outcome | None:
        """Same key as the record, outputs left remote and needed now: download them."""
        want = [(p, d, m) for p, d, m in entry.get("o", ()) if is_remote(d)
                and not _has_remote_digest(os.path.join(self.root, p), d)]
        if not want or any(not is_remote(d) and self._disk_digest(p) != d for p, d, _ in entry.get("o", ())):
            return None
        _drop_bytecode(self.root, [p for p, _, _ in want])
        problem = self.remote_exec.fetch(want)
        if problem is not None:
            self.warn(f"{t.label}: {problem}; running it again")
            return None
        return Outcome(Status.RESTORED, Reason.RESTORED, f"{why}; downloaded from the remote executor's CAS",
                       key=key, cache="remote", extra={"outputs": entry["o"], "desc": desc})

    def _fetch_inputs(self, t: Target) -> tuple[str, list[str]] | None:
        """Before a local run: download the inputs that dependencies left remote.  None when
        every input is on disk; else why not, and the producers to forget (they run again)."""
        want = []
        if not self._left_remote:
            return None
        for p in self._remote_inputs(t, None)[0]:
            d = self.out_digests.get(p)
            if is_remote(d) and not os.path.lexists(os.path.join(self.root, p)):
                want.append((p, d, 0o755 if self._mode_of(p) & 0o100 else 0o644))
        if not want:
            return None
        owners = self._remote_producers(sorted({o for p, _, _ in want if (o := self._owner.get(p)) is not None}))
        if self.remote_exec is None:
            return (f"input {want[0][0]} was left in a remote CAS (--remote-download) and no --remote-executor "
                    "is set; the targets that made it run again on the next build", owners)
        _drop_bytecode(self.root, [p for p, _, _ in want])
        problem = self.remote_exec.fetch(want)
        if problem is None:
            return None
        return (f"needs {', '.join(p for p, _, _ in want)}, left in the remote CAS by --remote-download: {problem}; "
                f"{', '.join(owners)} run again on the next build", owners)

    def _remote_inputs(self, t: Target, desc: dict[str, Any] | None) -> tuple[list[str], dict[str, Any]]:
        """The input paths of ``t``'s remote action, and ``desc`` with their digests as its
        ``inputs``: a test's whole closure (the worker must hold every file it may read,
        which its local key covers through closure digests); other targets' own inputs."""
        if t.kind != "test" or not t.deps:
            return list(self.graph.inputs[t.id]), desc or {}
        paths = self.graph.closure_inputs(t.id)
        if desc is None:
            return paths, {}
        full = self._remote_full.get(t.id)  # (once a run: the upload after the run sends what the key read)
        if full is None:
            full = dict(desc["inputs"])
            for j in self.graph.closure(t.deps):
                self.closure_digest(j)
                full.update(self._closure_read[j][0])
            self._remote_full[t.id] = full
        return paths, {**desc, "inputs": full}

    def _remote_producers(self, labels: list[str]) -> list[str]:
        """These producers, and their dependencies, transitively, whose outputs were left
        in the remote CAS too: when the server lost a blob, rerunning a producer needs its
        own inputs, which it may have lost as well (one failed build a level, it was)."""
        out = dict.fromkeys(labels)
        by_label, targets = self.graph.by_label, self.graph.targets
        stack = [by_label[lab] for lab in labels if lab in by_label]
        seen = set(stack)
        while stack:
            for d in targets[stack.pop()].deps:
                if d in seen:
                    continue
                seen.add(d)
                dt = targets[d]
                entry = self.record.get(dt.label)
                if dt.kind == "group":
                    stack.append(d)
                elif entry is not None and any(is_remote(o[1]) for o in entry.get("o", ())):
                    out[dt.label] = None
                    stack.append(d)
        return list(out)

    def _mode_of(self, p: str) -> int:
        owner = self._owner.get(p)
        entry = self.record.get(owner) if owner else None
        for o in entry.get("o", ()) if entry else ():
            if o[0] == p:
                return int(o[2])
        return 0o644

    def _remote_restore(self, t: Target, key: str, desc: dict[str, Any], why: str) -> Outcome | None:
        """After a local miss: the remote cache's entry, fetched into the local cache and restored."""
        from buildtool.remote.action import TargetView

        paths, full = self._remote_inputs(t, desc)
        hit = self.remote.lookup(TargetView.of(t, paths), key, full, t.label)
        return None if hit is None else self._restored(t, hit, key, desc, why, "remote")

    def _restored(
        self, t: Target, hit: ActionEntry, key: str, desc: dict[str, Any], why: str, where: str,
        on_disk: dict[str, str | None] | None = None,
    ) -> Outcome | None:
        """The outcome of putting a cache entry's outputs in place (None: the entry was unusable).
        ``on_disk``: output -> digest on disk (None: absent), as this thread just found them.
        A test whose log (stdout/stderr) the cache no longer has is unusable: the log is
        what a test's result is read from, so the test runs again."""
        out, err = self.cache.stream(hit, hit.stdout), self.cache.stream(hit, hit.stderr)
        if (t.kind == "test" and (out is None or err is None)) or t.id in self._unplaceable:
            return None
        got = self._restore(t, hit, on_disk)
        if got is None:
            return None
        status, msg = got
        if where == "remote":  # (its outputs already in place: nothing was restored)
            msg = "restored from the remote cache" if status is Status.RESTORED else \
                "outputs on disk already match the remote cache's entry" if hit.outputs else \
                f"the remote cache holds a {'pass' if t.kind == 'test' else 'run'} of this key"
        extra: dict[str, Any] = {"outputs": [[o.path, o.digest, o.mode] for o in hit.outputs], "desc": desc,
                                 "ran_for": hit.duration}
        lost = [name for name, data in (("stdout", out), ("stderr", err)) if data is None]
        if lost:  # (--replay-output says so rather than showing nothing)
            extra["lost_streams"] = lost
        return Outcome(
            status, Reason.ADOPTED if status is Status.UP_TO_DATE else Reason.RESTORED,
            f"{why}; {msg}", key=key, cache=where, extra=extra, stdout=out or b"", stderr=err or b"",
        )

    def _failed_before(self, t: Target, key: str) -> bool:
        """A test whose last run, with this same key, failed (testing.py): no cache answers it."""
        return t.kind == "test" and bool(key) and self.failed_tests.get(t.label) == key

    def _never_fresh(self, t: Target) -> bool:
        """always=True targets, every target under -B, and tests under --no-cache-tests run
        whatever the record says (and no cache is asked)."""
        return t.always or self.opt.always_make or (t.kind == "test" and not self.opt.cache_tests)

    def reruns_anyway(self, t: Target) -> bool:
        """Does ``t`` run whatever its record says: ``_never_fresh``, or a test whose last
        run failed (with the same key it runs again; for critical-path weights)?  (The
        failed tests are known here once ``failed_tests`` is loaded; before, such a test
        has no record entry to be predicted fresh from: its failure dropped it.)"""
        return self._never_fresh(t) or (t.kind == "test" and t.label in self.failed_tests)

    def commit(self, tid: int, outcome: Outcome) -> None:
        """Scheduler thread: publish output digests and record the result."""
        outs = outcome.extra.get("outputs")
        if outcome.ok and outs is not None:
            for path, digest, *mode in outs:  # type: ignore[attr-defined]
                self.publish_output(path, digest, mode[0] if mode else None)
        for label in outcome.extra.get("forget", ()):  # their outputs were lost remotely: rebuild them
            self.record.drop(label)  # type: ignore[arg-type]
        prepared = outcome.extra.get("record_entry")
        if outcome.ok and prepared is not None:
            self.record.put_prepared(prepared)  # type: ignore[arg-type]

    def publish_output(self, path: str, digest: str, mode: int | None) -> None:
        """An output as this build knows it, for its dependents' keys: its digest and its
        executable bit (a command that now makes the same bytes without ``chmod +x`` must
        rerun what runs or copies them); when it was left in the remote executor's CAS, its
        recorded mode (no local file to stat)."""
        self.out_digests[path] = digest
        if is_remote(digest):
            self._left_remote = True
        if mode is not None and mode & 0o100:
            self.out_executable.add(path)
        else:
            self.out_executable.discard(path)
        if mode is not None and self.remote_exec is not None and is_remote(digest):
            self.remote_exec.kept_modes[path] = mode

    def cancel_all(self) -> None:
        self.executor.cancel_all()
        if self.remote_exec is not None:
            self.remote_exec.cancel_all()

    def interrupted(self) -> None:
        """Ctrl-C or SIGTERM (not a watch cycle's cancel, after which the finished targets'
        uploads must still go): remote cache calls in flight are broken off."""
        if self.remote is not None:
            self.remote.abort()

    # -- cache layer -------------------------------------------------------------------
    def _restore(
        self, t: Target, hit: ActionEntry, on_disk: dict[str, str | None] | None = None
    ) -> tuple[Status, str] | None:
        if sorted(o.path for o in hit.outputs) != sorted(t.outs):
            self.warn(f"cache entry for {t.label} lists other outputs than the target; ignoring it")
            return None
        if self._leads_elsewhere(t) is not None:
            return None  # (nor adopted, nor run: _execute says why)
        found = on_disk or {}  # (a 10,000-target restore stats each missing output once, not twice)
        stale = [o for o in hit.outputs
                 if (found[o.path] if o.path in found else self._disk_digest(o.path)) != o.digest]
        if not stale:
            stale = [o for o in hit.outputs if not self._fix_mode(o)]  # (linked to a blob: placed anew)
            if not stale:
                return Status.UP_TO_DATE, "outputs on disk already match the cache entry" if hit.outputs else \
                    f"the cache holds a {'pass' if t.kind == 'test' else 'run'} of this key"  # (a test has no outputs)
        _drop_bytecode(self.root, [o.path for o in stale])
        for o in stale:
            try:
                st = self._restore_one(o, hit)
            except CannotPlace as e:
                self._unplaceable.add(t.id)  # (said once: the worker does not try again, nor call it damage)
                self.warn(f"{t.label}: could not restore {o.path} from the cache ({e}); running its command")
                return None
            if st is None:
                return None
            self.stats.remember(o.path, st, o.digest, time.time_ns(), produced=True)
        return Status.RESTORED, "restored from the local cache"

    def _restore_one(self, o: CachedOutput, hit: ActionEntry) -> os.stat_result | None:
        dest = os.path.join(self.root, o.path)
        try:
            return self.cache.restore(o.digest, dest, o.mode, hit.inline.get(o.digest))
        except CannotPlace as e:
            if e.errno != errno.EISDIR:
                raise
            try:
                os.rmdir(dest)  # an empty directory where it goes: nothing in it is lost (as _delete_outputs)
            except OSError:
                raise e from None
            return self.cache.restore(o.digest, dest, o.mode, hit.inline.get(o.digest))

    def _leads_elsewhere(self, t: Target) -> str | None:
        """Why ``t``'s outputs may not be written where they are declared, or None: a
        directory on the way that is a symbolic link now (made after the graph was checked:
        a watch cycle or a no-op snapshot reuses the graph) and takes an output outside the
        workspace or onto a source or another target's output, which deleting and writing
        the output would destroy.  One realpath per output directory a build writes in."""
        root = self.root
        for o in t.outs:
            parent = o.rpartition("/")[0]
            if not parent:
                continue
            real = self._real_dirs.get(parent)
            if real is None:
                probe, rest = os.path.join(root, parent), ""
                while not os.path.lexists(probe) and probe != root:  # (not made yet: its existing part)
                    probe, tail = os.path.split(probe)
                    rest = os.path.join(tail, rest) if rest else tail
                resolved = os.path.realpath(probe)
                real = self._real_dirs[parent] = os.path.join(resolved, rest) if rest else resolved
            if real == os.path.join(root, parent):
                continue  # no symbolic link on the way
            if real != root and not real.startswith(root + os.sep):
                return f"output {o!r} of {t.label} leads (through a symbolic link) outside the workspace, to {real}"
            where = os.path.relpath(os.path.join(real, o.rpartition("/")[2]), root)
            claimed = self._claimed
            if claimed is None:  # (built once, and only when a link is on the way; whole before it is shared)
                claimed = {p: f"an output of {u.label}" for u in self.graph.targets for p in u.outs}
                claimed.update({p: f"a source of {u.label}" for u in self.graph.targets for p in u.srcs})
                self._claimed = claimed
            what = claimed.get(where)
            if what is not None and what != f"an output of {t.label}":
                return (f"output {o!r} of {t.label} is really {where!r} (through a symbolic link made since the "
                        f"graph was checked), {what}: remove the link")
        return None

    def _fix_mode(self, o: CachedOutput) -> bool:
        """Give an adopted output the executable bits of its cache entry; False when it needs
        them but is a hard link (to a cache blob, in hardlink mode: a chmod would change the
        blob, and every output linked to it, too): it is then restored as a file of its own."""
        full = os.path.join(self.root, o.path)
        try:
            st = os.stat(full)
            if stat.S_IMODE(st.st_mode) & 0o111 != o.mode & 0o111:
                if st.st_nlink > 1:
                    return False
                os.chmod(full, o.mode)
        except OSError:
            pass
        return True

    # -- subprocess layer --------------------------------------------------------------
    def _tmpdir(self, lane: int) -> str:
        """The worker lane's TMPDIR/HOME: created once, emptied after an action used it."""
        d = orphans.lane_dir(self.state_dir, os.getpid(), lane)  # the next build's reap looks for it
        if d not in self._lane_dirs:
            if os.path.lexists(d):  # left by a killed build
                remove_path(d)
            os.makedirs(d, exist_ok=True)
            self._lane_dirs.add(d)
        return d

    def _short_name(self, d: str, lane: int) -> str:
        """Lane directory ``d`` by a short path when its own is long: a link in this user's
        ``/tmp/buildtool-<uid>/``, named after the state dir and the lane, pointed at ``d``
        (again, if another build in this workspace pointed it elsewhere since).  A Unix
        socket a command makes in TMPDIR (multiprocessing's listener: TMPDIR and 32 bytes)
        must have a path under 108 bytes: a test using one failed in a checkout at a long
        path, as CI runners' are.  ``d`` itself where the link cannot be had."""
        if len(os.fsencode(d)) <= SHORT_TMP_OVER:
            return d
        from buildtool.workspace import private_tmp_dir

        base = private_tmp_dir()
        if base is None:
            return d
        link = os.path.join(base, f"lane-{hash_bytes(os.fsencode(self.state_dir))[:12]}-{lane}")
        try:
            if os.readlink(link) == d:
                self._short_names.add(link)
                return link
        except OSError:
            pass
        try:
            tmp_link = f"{link}.{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_link)
            os.symlink(d, tmp_link)
            os.replace(tmp_link, link)  # (atomic: the name always leads somewhere whole)
        except OSError:
            return d
        self._short_names.add(link)
        return link

    def drop_short_names(self) -> None:
        """The build is over: remove the links ``_short_name`` made (each build of a
        workspace made its own; the test suite left thousands leading nowhere)."""
        for link in self._short_names:
            with contextlib.suppress(OSError):
                os.unlink(link)
        self._short_names.clear()

    def _reset_tmp(self, d: str) -> None:
        """Empty lane TMPDIR ``d`` after a command; one that cannot be made again now (the
        state dir being removed under the build, `rm -rf .buildtool`) is made by the
        lane's next command, whose start says so if it still cannot be."""
        try:
            with os.scandir(d) as it:
                dirty = next(it, None) is not None
        except OSError:
            dirty = True
        if dirty:
            remove_path(d)
            try:
                os.makedirs(d, exist_ok=True)
            except OSError:  # (not this command's failure: the lane's next command makes it, or says why not)
                self._lane_dirs.discard(d)

    def _delete_outputs(self, t: Target, before_run: bool = False) -> str | None:
        """Delete ``t``'s outputs (and depfile).  A directory where an output goes is removed
        after the command ran (it made it); ``before_run``, it is someone's directory: kept,
        and the reason the target cannot run is returned (the graph check says the same
        when the graph is evaluated; a graph reused from the no-op snapshot was not)."""
        _drop_bytecode(self.root, t.outs)
        for o in t.outs:
            full = os.path.join(self.root, o)
            if before_run:  # a restore beside it that a kill -9 cut short (atomic.RESTORE_TMP_SUFFIX)
                with contextlib.suppress(OSError):
                    os.unlink(temp_path(full, RESTORE_TMP_SUFFIX))
            try:
                os.unlink(full)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                if before_run:
                    try:
                        os.rmdir(full)  # an empty one goes, as the graph check lets it (nothing in it is lost)
                    except OSError:
                        return f"output {o!r} of {t.label} is an existing directory; outputs are files (left as it is)"
                    self.stats.forget(o)
                    continue
                remove_path(full)
            except NotADirectoryError:
                pass  # (a file where a directory on the way should be: no output there)
            except OSError as e:
                if before_run and e.errno == errno.ENAMETOOLONG:
                    return f"output {o!r} of {t.label}: the name is too long for the file system"
                if before_run:  # it would stay, and be taken for what the command wrote
                    return f"could not delete the old output {o!r} of {t.label} before its command: {e.strerror}"
            self.stats.forget(o)
        if t.depfile is not None:
            try:
                os.unlink(os.path.join(self.root, t.depfile))
            except OSError:
                pass
        return None

    def _lint(self, t: Target) -> None:
        """Warn (once a build) of the workspace files ``t``'s command runs by path that its
        key does not hold (lint.py): an edit of them would not rerun it."""
        self._linted.add(t.id)
        from buildtool import lint

        if not lint.programs_run(t.cmd):
            return
        declared = {posixpath.normpath(posixpath.join(t.pkg, x)) for x in t.tools if "/" in x}
        declared.update(t.outs, self.graph.inputs[t.id])
        found = lint.undeclared_programs(t.cmd, self.root, t.pkg, declared)
        for p in found:
            shown = p[len(t.pkg) + 1:] if t.pkg and p.startswith(t.pkg + "/") else p
            self.warn(f"{t.label}: its command runs {shown}, which is not among its srcs or tools: its action key "
                      f"does not hold that file, so an edit of it will not rerun {t.label} (and a cache may answer "
                      f"with the old script's result); add it to srcs")

    def _execute(
        self, t: Target, key: str, desc: dict[str, Any], reason: Reason, why: str, lane: int
    ) -> Outcome | Pending:
        """Start ``t``'s command (or run it remotely): a Pending for ``_landed``, or the
        Outcome when it could not start."""
        cwd = os.path.join(self.root, t.pkg)
        try:
            tmp = self._tmpdir(lane)
        except OSError as e:  # (the state dir made read-only or immutable under the build)
            return Outcome(Status.FAILED, Reason.FAILED, f"cannot make the command's temp directory "
                           f"{e.filename or 'in ' + self.state_dir}: {e.strerror}", key=key,
                           extra={"not_started": True})
        if t.cmd and t.id not in self._linted:
            self._lint(t)
        env = dict(desc["env"])
        if "PATH" in env:
            env["PATH"] = keys.real_path(env["PATH"], self._checkout())  # (keyed from the checkout's root)
        # The lane's fresh directory, unless the action's environment names them (env,
        # pass_env, --action-env: in its key; they were keyed and then dropped).  The lane
        # is named in BUILDTOOL_LANE whatever they are: how the next build finds the
        # commands of a killed one (orphans._lane_leaders; an action naming both HOME and
        # TMPDIR left an orphan appending to the next build's output, cached so).
        short = self._short_name(tmp, lane) if "TMPDIR" not in env or "HOME" not in env else tmp
        env.setdefault("TMPDIR", short)
        env.setdefault("HOME", short)
        if t.kind == "test":  # (Bazel's name for it, which googletest, absl and others read)
            env.setdefault("TEST_TMPDIR", env["TMPDIR"])
        env["BUILDTOOL_LANE"] = tmp
        blocked = self._leads_elsewhere(t) or self._delete_outputs(t, before_run=True)
        if blocked is not None:
            return Outcome(Status.FAILED, Reason.FAILED, blocked, key=key, extra={"not_started": True})
        try:
            for o in t.outs:
                _make_dir(os.path.dirname(os.path.join(self.root, o)))
            direct = None
            if t.kind == "pyrule":
                env["PYTHONPATH"] = pkg_relative(".", t.pkg)
                env["PYTHONDONTWRITEBYTECODE"] = "1"  # never write __pycache__ into sources
                env["BUILDTOOL_PYRULE_MODULES"] = os.path.join(tmp, "pyrule-modules")  # (_unkeyed_files)
                argv = [sys.executable, "-c", PYRULE_MAIN, t.fn or ""]
                texts = pyrule_texts(t.pkg, self.graph.inputs[t.id], t.outs, t.kwargs_json)
                if sum(map(arg_size, texts)) > MAX_ARG:  # (one argument may hold 128 KiB at most)
                    args = os.path.join(tmp, "pyrule-args.json")
                    with open(args, "w", encoding="utf-8") as f:
                        json.dump(texts, f)
                    texts = ["@" + args]
                argv += texts
            elif arg_size(t.cmd) > MAX_ARG:
                script = os.path.join(tmp, "cmd.sh")
                with open(script, "w") as f:
                    f.write(t.cmd)
                argv = shell_argv(desc["shell"], script, True)
            else:
                argv = shell_argv(desc["shell"], t.cmd, False)
                if desc["shell"] == "sh":
                    direct = simplecmd.parse(t.cmd)
            capture = None if t.pool == "console" else orphans.capture_of(tmp)
            started_ns = time.time_ns()
            res: Any = None
            running = None
            if self.remote_exec is not None and self.remote_exec.wants(t):  # None: infrastructure trouble
                paths, full = self._remote_inputs(t, desc)
                res = self.remote_exec.run(t, paths, full, t.label,
                                           skip_cache=self._never_fresh(t) or reason is Reason.FAILED_BEFORE)
            if res is None:
                lost = self._fetch_inputs(t)
                if lost is not None:
                    self._reset_tmp(tmp)
                    return Outcome(Status.FAILED, Reason.FAILED, lost[0], key=key,
                                   extra={"forget": lost[1], "not_started": True, "lost_remote": True})
                running = self.executor.start(argv, cwd, env, timeout=t.timeout, capture=capture, direct=direct,
                                              merge_stderr=t.kind == "test",  # (one log, in order)
                                              # a stamp is named by its label (no path starts with /): a kill -9
                                              # of buildtool drops its record line (session.py)
                                              outs=t.outs or ((t.label,) if t.kind == "genrule" else ()))
        except OSError as e:
            self._delete_outputs(t)
            self._reset_tmp(tmp)
            return Outcome(Status.FAILED, Reason.FAILED, f"could not start the command: {e.strerror}", key=key)
        return Pending(t, key, desc, reason, why, tmp, started_ns, running, res)

    def _landed(self, p: Pending, res: Any, release_early: bool) -> Outcome:
        """The outcome of ``p``'s ended command: outputs checked and hashed, the cache store
        prepared as the outcome's "after" work.  ``release_early``: tell the scheduler (lane
        hook) that the lane is free before the outputs are hashed (worker threads)."""
        t, key, desc, reason, why, started_ns = p.t, p.key, p.desc, p.reason, p.why, p.started_ns
        imported = _imported_modules(p.tmp) if t.kind == "pyrule" else []  # (before the lane's directory is emptied)
        self._reset_tmp(p.tmp)
        base: dict[str, Any] = {"desc": desc}
        note = getattr(res, "note", "")  # remote execution: where it ran
        if note:
            base["executed"] = "remote"
            if getattr(res, "cached", False):  # the executor answered from its action cache: nothing ran
                base["remote_cached"] = True
        interrupted = getattr(res, "interrupted", False)
        if res.exit_code != 0 or res.timed_out or interrupted:
            self._delete_outputs(t)
            if res.timed_out:
                msg = f"TIMEOUT after {t.timeout:g}s"
            elif interrupted:
                msg = "interrupted: sent SIGTERM by buildtool" + (f" (it exited {res.exit_code})"
                                                                   if res.exit_code >= 0 else "")
            elif res.exit_code < 0:
                msg = f"killed by signal {-res.exit_code}"
            else:
                msg = f"exited with status {res.exit_code}"
                if res.exit_code == 141 and has_pipe(t.cmd):  # 128 + SIGPIPE, from a stage of a pipe
                    msg += (" (141 is SIGPIPE: with pipefail on, a stage whose reader stopped early, as "
                            "`grep -q` or `head` do, fails the pipe; let the reader take all its input: "
                            "`grep -c`, `sed -n`)")
                elif t.depfile is not None:
                    msg += self._missing_header_hint(t, res.stdout + res.stderr)
            msg += note
            return Outcome(
                Status.FAILED, Reason.FAILED, msg, key=key, duration=res.duration,
                stdout=res.stdout, stderr=res.stderr, exit_code=res.exit_code,
                extra={**base, "timed_out": res.timed_out, "why": why, "why_reason": reason},
            )
        lacking = getattr(res, "lacking", None)  # remote execution: an output the result lacks
        if lacking is not None:
            self._delete_outputs(t)
            return Outcome(Status.FAILED, Reason.FAILED, lacking + note, key=key, duration=res.duration,
                           stdout=res.stdout, stderr=res.stderr, exit_code=0, extra=base)
        left_remote = getattr(res, "outputs", None)  # remote execution, outputs not downloaded
        made: list[tuple[str, os.stat_result]] = []
        for o in t.outs if left_remote is None else ():
            lost = None
            try:
                st = os.lstat(os.path.join(self.root, o))
            except OSError as e:
                st, lost = None, e
            if st is None or not stat.S_ISREG(st.st_mode):
                self._delete_outputs(t)
                what = ("was not created" if st is None and isinstance(lost, FileNotFoundError)
                        else f"cannot be looked at ({lost.strerror})" if lost is not None
                        else "is not a regular file" + _not_a_file(st.st_mode))
                return Outcome(
                    Status.FAILED, Reason.FAILED, f"declared output {o} {what}", key=key,
                    duration=res.duration, stdout=res.stdout, stderr=res.stderr, exit_code=0, extra=base,
                )
            made.append((o, st))
        late = None
        checked = desc["inputs"]  # (the inputs the run's key read; discover judges the headers it names)
        if t.depfile is not None:
            checked = discovered.primary_description(desc)["inputs"]
            found = self._discover(t, desc, started_ns)
            if isinstance(found, str):
                self._delete_outputs(t)
                return Outcome(
                    Status.FAILED, Reason.FAILED, found, key=key, duration=res.duration,
                    stdout=res.stdout, stderr=res.stderr, exit_code=0, extra=base,
                )
            key, desc, late = found
            base = {"desc": desc}
        if release_early and self._lane_hook is not None:
            # Nothing left that fails it: the lane may take the next command (fail-fast
            # starts nothing after a failure) while the outputs are hashed and recorded.
            self._lane_hook(t.id)
        outputs: list[list[Any]] = list(left_remote or ())
        size = len(res.stdout) + len(res.stderr)
        for o, st in made:
            mode = 0o755 if st.st_mode & 0o100 else 0o644
            try:
                outputs.append([o, self.stats.digest(o, st, produced=True), mode])
            except OSError as e:  # (the command made it unreadable: chmod 000)
                self._delete_outputs(t)
                return Outcome(
                    Status.FAILED, Reason.FAILED, f"declared output {o} cannot be read ({e.strerror})", key=key,
                    duration=res.duration, stdout=res.stdout, stderr=res.stderr, exit_code=0, extra=base,
                )
            size += st.st_size
        if imported:
            self._unkeyed_files(t, desc, imported)
        # Inputs that changed while the command ran: do not cache, stay dirty.
        changed = late if late is not None else \
            self._inputs_changed(checked, started_ns, self._key_stats.get(t.id, {})) \
            or self._helpers_changed(t, desc, started_ns) \
            or (self._closure_changed(t, started_ns) if t.kind == "test" else None)
        record = changed is None
        extra: dict[str, Any] = {**base, "outputs": outputs, "record": record}
        if not record:  # its outputs are still the build's (clean removes them): kept under a key that never matches
            extra["dirty"] = True
        if record and not t.always and left_remote is None and not self._uncached(t):  # always=True: never cached

            def store() -> None:
                self._store(t, key, outputs, res)
                # (-B reran it: the result of the same key, uploaded as any run's -- a CI job
                # refreshing a remote cache with -B stored nothing there)
                if self.remote is not None and t.depfile is None and \
                        not (t.always or (t.kind == "test" and not self.opt.cache_tests)):
                    from buildtool.remote.action import TargetView

                    paths, full = self._remote_inputs(t, desc)
                    self.remote.upload(TargetView.of(t, paths), key, full, outputs,
                                       res.stdout, res.stderr, res.duration, t.label)

            # Run after the outcome is reported, so dependents start while the outputs are
            # copied into the cache (scheduler.Runner's "after" work; "after_heavy": not
            # on the scheduler's own thread).
            extra["after"] = store
            extra["after_heavy"] = size > INLINE_HASH_LIMIT
            extra["after_bytes"] = len(res.stdout) + len(res.stderr)  # (what the store holds in memory)
        elif not record and changed in self.saved_meanwhile and changed not in self.changed_before:
            # (watch saw it saved; the second cycle in a row, a command writing its own
            # input is the likelier cause: watch would rebuild it for ever)
            self.changed_under.add(changed)
            self.warn(f"{t.label}: input {changed} was saved while the command ran; result not recorded "
                      "(it runs again with the new content)")
        elif not record:
            # (the usual cause, when it comes back each build: the command writes a file its
            # own glob reaches, a test's stamp or log; the warning alone read as "you edited")
            self.changed_under.add(changed)
            self.warn(f"{t.label}: input {changed} changed while the command ran; result not recorded (if a "
                      "command wrote it: a file a command writes must not be an input, and a glob that reaches "
                      "it makes it one; exclude it or write it elsewhere)")
        if base.get("remote_cached"):  # (a test's: a cached pass, testing.test_result)
            # Nothing ran: the executor's action cache answered, as a remote cache's hit is
            # "restored" (the console said "ran", the summary and `cache stats` counted it so;
            # a test's pass too: "10 ran" of which 7 never ran, as CI dashboards count them).
            extra["ran_for"] = res.duration
            return Outcome(Status.RESTORED, Reason.RESTORED, why + note, key=key, duration=res.duration,
                           stdout=res.stdout, stderr=res.stderr, exit_code=0, extra=extra, cache="remote")
        return Outcome(
            Status.RAN, reason, why + note, key=key, duration=res.duration,
            stdout=res.stdout, stderr=res.stderr, exit_code=0, extra=extra,
            cache="remote" if base.get("remote_cached") else "none",  # (where the result came from)
        )

    def _inputs_changed(
        self, recorded: dict[str, str], started_ns: int, at_key: dict[str, tuple[int, int, int, int, int]],
    ) -> str | None:
        """The first input that changed while the command ran (started at ``started_ns``),
        or None.  A source whose size, mtime or inode is not what it was when the key read it
        (``at_key``) changed, even with its content back (an A-B-A rewrite during the run,
        ``git stash; git stash pop``: the command may have read B).  One whose ctime alone
        moved (chmod, a hard link made, or a rewrite that put the mtime back) and one written
        just before the start (a same-tick rewrite keeps the stat) are judged by content."""
        for p, d in recorded.items():
            if p in self.out_digests:
                if self._output_edited(p, d):
                    return p
                continue
            was = at_key.get(p)
            if was is None:  # (a key computed elsewhere: content only; a discovered file the
                # depfile listed but that is not there is "missing" until it appears)
                if (self._disk_digest(p) or discovered.MISSING) != d:
                    return p
                continue
            if self._moved(p, d, was, started_ns):
                self._sources.pop(p, None)  # (the targets keyed from now on read it again)
                return p
        return None

    def _moved(self, p: str, d: str, was: tuple[int, int, int, int, int], started_ns: int) -> bool:
        """Is the file ``p`` not what the key read (stat ``was``, digest ``d``)?  A size,
        mtime or inode of another file, even with its content back, or a ctime alone (or
        a rewrite racy against the read) that came with other content."""
        try:
            st = os.stat(os.path.join(self.root, p))
        except OSError:
            return True
        # (racy against when the key read the stat: a same-tick rewrite after that read
        # and before the start keeps the stat, and the build's other targets keyed from it)
        return (st.st_size, st.st_mtime_ns, st.st_ino) != was[:3] or \
            ((st.st_ctime_ns != was[3] or racy(st.st_mtime_ns, st.st_ctime_ns, min(started_ns, was[4])))
             and self._disk_digest(p) != d)

    def _unkeyed_files(self, t: Target, desc: dict[str, Any], imported: list[str]) -> None:
        """Warn of the workspace modules a pyrule's function imported, and the workspace files
        it opened to read, that its key does not hold (PYRULE_MAIN lists them): a module
        reached through a ``sys.path`` entry it added (a src-layout library) or imported by a
        name the static search cannot see, a template beside the generator; an edit of them
        would not rerun it, and the cache would give the old output elsewhere too."""
        found = [os.path.relpath(m, self.root) for m in imported if not m.startswith("<")]
        keyed = {k[len("module:"):] for k in desc.get("extra", {}) if k.startswith("module:")}
        keyed.update(desc.get("inputs", {}))
        unkeyed = [m for m in found if m not in keyed and not m.startswith("..")]
        if unkeyed:
            more = f" and {len(unkeyed) - 3} more" if len(unkeyed) > 3 else ""
            self.warn(f"{t.label}: its function imported {', '.join(unkeyed[:3])}{more}, which its key does not "
                      "hold (found through a sys.path entry it added, or a name an import statement does not "
                      "show): an edit there will not rerun it; list them in its srcs, or import them from the "
                      "workspace root")
        mine = set(t.outs)
        read = [r for r in (os.path.relpath(m[1:], self.root) for m in imported if m.startswith("<"))
                if r not in keyed and r not in mine and not r.startswith(("..", STATE_DIR + "/"))
                and os.path.isfile(os.path.join(self.root, r))]
        if read:  # (a declared source read through its real path: a symlinked directory resolved)
            real = {os.path.realpath(os.path.join(self.root, k)) for k in keyed}
            read = [r for r in read if os.path.realpath(os.path.join(self.root, r)) not in real]
        if read:  # (a template beside the generator: the commonest codegen layout)
            more = f" and {len(read) - 3} more" if len(read) > 3 else ""
            one = len(read) == 1
            self.warn(f"{t.label}: its function read {', '.join(read[:3])}{more}, which {'is' if one else 'are'} "
                      "not among its srcs: an edit there will not rerun it, and the cache would give the old "
                      f"output elsewhere too; list {'it' if one else 'them'} in its srcs")

    def _helpers_changed(self, t: Target, desc: dict[str, Any], started_ns: int) -> str | None:
        """The first file besides the inputs that the key covers and that changed while the
        command ran: a pyrule's module (or one it imports), as an input, by its stat against
        the one the key read (an edit undone before the end, `git stash; git stash pop`,
        counts: the function may have imported the other content), else by content; a
        declared tool, by its stat against the one its digest in this target's key was
        taken at (that digest is then forgotten, so the next target using the tool hashes
        it again)."""
        read = self._module_stats.get(t.id, {})
        for k, d in desc.get("extra", {}).items():
            if k.startswith("module:"):
                was = read.get(k[7:])
                if self._moved(k[7:], d, was, started_ns) if was is not None else self._disk_digest(k[7:]) != d:
                    return k[7:]
        for path, then in self._tool_paths.get(t.id, {}).items():
            if then is None:
                continue  # (unreadable when it was hashed: "unreadable" is in the key, not content)
            try:
                now = stat_row(os.stat(path))
            except OSError:
                now = None
            if now != then:
                if self.tool_stats.get(path) == then:  # (not hashed again since, by another target)
                    self._tool_digests.pop(path, None)
                return path
        return None

    def _output_edited(self, p: str, made: str) -> bool:
        """Is a dependency's output no longer what it made (``made``), edited or deleted by
        hand while this command ran?  One stat: while it matches the one the digest was
        taken at, the file is unchanged (outputs were just written, so the stat cache's
        racy-entry rule would re-hash every one of them).  A size, mtime or inode not that
        one's: rewritten, even with its content back (the command may have read the other
        content), as for sources; a ctime alone (chmod, a hard link) is judged by content."""
        if is_remote(made):
            return False  # left in the remote executor's CAS: there is no local file
        full = os.path.join(self.root, p)
        try:
            st = os.stat(full)
        except OSError:
            return True
        e = self.stats.entries.get(p)
        if e is not None and e[5] == made:
            if (e[0], e[1], e[2]) != (st.st_size, st.st_mtime_ns, st.st_ino):
                return True
            if e[3] == st.st_ctime_ns:
                return False
        try:
            return hash_file(full) != made
        except OSError:
            return True

    def _store(self, t: Target, key: str, outputs: list[list[Any]], res: Any) -> None:
        with self.cache.storing() as free:  # cache GC (cache_gc.py) waits until the entry is written
            if free:  # (else a GC holds the cache: not stored, said once by the cache)
                self._store_blobs_then_entry(key, outputs, res)

    def _store_blobs_then_entry(self, key: str, outputs: list[list[Any]], res: Any) -> None:
        cache = self.cache
        if not cache.writable:
            return
        # Small contents go inside the entry (cache.INLINE_MAX), up to INLINE_TOTAL_MAX in all.
        inline: dict[str, bytes] = {}
        room = INLINE_TOTAL_MAX
        for path, digest, _ in outputs:
            if digest in inline:
                continue
            full = os.path.join(self.root, path)
            data = cache.read_small(full)
            if data is not None and hash_bytes(data) != digest:
                return  # changed since it was hashed: it must not be stored under that digest
            if data is not None and len(data) <= room:
                inline[digest] = data
                room -= len(data)
            elif not cache.put_file(full, digest):
                return  # (said) an entry must never point at a blob that is not there
        streams: list[str | None] = []
        for data in (res.stdout, res.stderr):
            d = hash_bytes(data) if data else None
            if d is not None and len(data) <= min(INLINE_MAX, room):
                inline[d] = data
                room -= len(data)
            elif d is not None and not cache.put_bytes(data, d):
                return
            streams.append(d)
        if cache.writable:
            outs = tuple(CachedOutput(p, d, m) for p, d, m in outputs)
            cache.put_action(key, ActionEntry(outs, res.duration, streams[0], streams[1], inline))

    def _why_changed(self, t: Target, entry: dict[str, Any] | None, desc: dict[str, Any]) -> tuple[Reason, str]:
        """rebuild.why_changed, and for an entry recorded under DIRTY_KEY (its result not
        recorded: an input changed while it ran) that reason when nothing else differs."""
        reason, why = rebuild.why_changed(desc_of(entry), desc, self._producer_for(t))
        if entry is not None and entry.get("k") == DIRTY_KEY and why == rebuild.KEY_CHANGED:
            why = "its last result was not recorded (an input changed while its command ran)"
        return reason, why

    def _dry_run(self, t: Target, key: str, desc: dict[str, Any], entry: dict[str, Any] | None) -> Outcome:
        # (a stamp here would run: never restored nor adopted; under -B, with its record's key)
        self._note_stamp(t, key, again=entry is not None and entry.get("k") == key)
        if t.always:  # (the reasons the build gives, in the same order)
            return Outcome(Status.SKIPPED, Reason.DRY_RUN, "would run: always=True: runs on every build, never cached",
                           key=key, extra={"dry_reason": Reason.ALWAYS})
        if self.opt.always_make and entry is not None and entry.get("k") == key:
            return Outcome(Status.SKIPPED, Reason.DRY_RUN, f"would run: {ALWAYS_MAKE_WHY}", key=key,
                           extra={"dry_reason": Reason.ALWAYS_MAKE})
        if self._never_fresh(t) and entry is not None and entry.get("k") == key:
            return Outcome(Status.SKIPPED, Reason.DRY_RUN,
                           "would run: --no-cache-tests: the test passed before but runs again", key=key,
                           extra={"dry_reason": Reason.NO_CACHE_TESTS})
        if self._failed_before(t, key):
            return Outcome(Status.SKIPPED, Reason.DRY_RUN, f"would run: {FAILED_BEFORE_WHY}", key=key,
                           extra={"dry_reason": Reason.FAILED_BEFORE})
        if entry is not None and entry.get("k") == key:
            _, reason, why = rebuild.outputs_match(entry.get("o", []), self._disk_digest, self.disk_modes.get)
            assert reason is not None
        else:
            reason, why = self._why_changed(t, entry, desc)
        hit = self.dry_hit(t, key, desc)
        if hit is not None and sorted(o.path for o in hit.outputs) == sorted(t.outs) \
                and all(self._disk_digest(o.path) == o.digest for o in hit.outputs):
            # (as _restore finds it: the build adopts the entry, restoring nothing)
            what = ("the cache holds a pass of this key" if t.kind == "test" and not t.outs
                    else "the outputs on disk already match the cache entry of this key")
            return Outcome(Status.UP_TO_DATE, Reason.ADOPTED, f"up to date: {why}, but {what}", key=key)
        if hit is not None:  # (the cache has the key: `build -n` and `explain` say so, not "would run")
            return Outcome(Status.SKIPPED, Reason.DRY_RUN, f"would restore from the cache: {why}", key=key,
                           extra={"dry_reason": reason, "would_restore": True})
        hint = "" if self._never_fresh(t) else self._stored_elsewhere(t, key, desc, entry)
        if hint:
            why += f"; {self._no_entry(t, key)}{hint}"
        return Outcome(Status.SKIPPED, Reason.DRY_RUN, f"would run: {why}", key=key, extra={"dry_reason": reason})

    def _no_entry(self, t: Target, key: str) -> str:
        """What a cache miss looked for: a key, or for a target with a depfile (whose key is
        known only once its headers are) a variant of its primary key with the headers as
        they are now -- not the key the record's headers gave, which the lookup never used."""
        pkey = self._primary_keys.get(t.id) if t.depfile is not None else None
        if pkey is None:
            return f"no cache entry for key {key[:12]}"
        return f"no cache entry for its headers as they are now (primary key {pkey[:12]})"

    def _stored_elsewhere(self, t: Target, key: str, desc: dict[str, Any], entry: dict[str, Any] | None) -> str:
        """For a miss with no record entry to compare with (a fresh checkout, after
        ``clean``): how its action differs from the last one stored for its label in the
        cache, by any workspace using it ("" when none is known, or it is the same key)."""
        if entry is not None:
            return ""
        if self._described is None:  # (one query a build; a race between workers only repeats it)
            self._described = self.cache.described_labels()
        if t.label not in self._described:
            return ""
        found = self.cache.description(t.label)
        if found is None or found[0] == key:
            return ""
        try:  # (advisory: a row of another shape, from a damaged cache or a later buildtool, says nothing)
            old = json.loads(found[1])
            if t.depfile is not None:  # (the row is a final description: compare finals, the same headers')
                paths = discovered.recorded_paths({"desc": old})
                if paths:
                    desc = discovered.final_key(discovered.primary_description(desc), paths,
                                                self._discovered_digest)[1]
            _, why = rebuild.why_changed(old, rebuild.shared_description(desc), self._producer_for(t))
        except Exception:
            return ""
        return f"; the cache's last entry for this label, from this or another checkout, differs: {why}"

    def dry_hit(self, t: Target, key: str, desc: dict[str, Any]) -> ActionEntry | None:
        """The cache entry a build would restore ``t`` from, without restoring it (never one
        for an always=True target or a test under --no-cache-tests: they run, whatever the
        cache holds)."""
        if self._never_fresh(t) or self._uncached(t):
            return None
        hit = self.cache.get_action(key) if t.depfile is None else self._discovered_lookup(t, key, desc)[2]
        if hit is None:
            return None
        # With a blob gone (GC, a hand) the build would rerun it, not restore it (_restored):
        # a test's log is always read; an output only when the one on disk differs (adopted).
        there = self.cache.has_blob
        if t.kind == "test" and not all(not d or d in hit.inline or there(d) for d in (hit.stdout, hit.stderr)):
            return None
        if any(o.digest not in hit.inline and self._disk_digest(o.path) != o.digest and not there(o.digest)
               for o in hit.outputs):
            return None
        return hit


# A declared tool in a ``shims`` directory (pyenv, asdf, mise, rbenv, nodenv) is the same script
# whatever version it runs: the version comes from one of these files (or the environment).
VERSION_FILES = frozenset({".python-version", ".tool-versions", ".ruby-version", ".node-version", ".nvmrc",
                           "mise.toml", ".mise.toml"})
_SAID_SHIMS: set[str] = set()


def _with_run(key: str, entry: Mapping[str, Any] | None) -> str:
    """A stamp's settled key as its dependents name it: ``key``, and ``+<token>`` of the
    run that last ran it when its record line, of that key, holds one (``r``, formats.md;
    a line of another key is a run before this one's: its token is not this key's)."""
    run = entry.get("r") if entry is not None and entry.get("k") == key else None
    return f"{key}+{run}" if isinstance(run, str) and run else key


def _imported_modules(tmp: str) -> list[str]:
    """The module files a pyrule's function imported, as PYRULE_MAIN listed them in the
    lane's directory ``tmp`` (none: it failed, or ran remotely), and the workspace files it
    opened to read, each after a ``<``."""
    try:
        with open(os.path.join(tmp, "pyrule-modules"), encoding="utf-8", errors="surrogateescape") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except OSError:
        return []


def _drop_bytecode(root: str, outputs: Iterable[str]) -> None:
    """Delete the ``__pycache__`` files Python compiled from the ``.py`` ones of ``outputs``
    before they are written anew.  Python takes a .pyc as current when the source's size
    and whole-second mtime are those it recorded: a generated module rewritten in the same
    second with the same size (two quick builds, a script) was imported as the old one, and
    a test run on old code had its pass cached under the new key.  One listing a directory
    (a codegen target of 3,000 modules listed it 3,000 times); a .pyc is
    ``<stem>.<tag>[.opt-N].pyc``, its stem matched exactly (``a.py`` is not ``a.b.py``)."""
    stems: dict[str, set[str]] = {}
    for o in outputs:
        if o.endswith(".py"):
            d, name = os.path.split(os.path.join(root, o))
            stems.setdefault(os.path.join(d, "__pycache__"), set()).add(name[:-3])
    for cache, names in stems.items():
        try:
            found = os.listdir(cache)
        except OSError:
            continue
        for n in found:
            base = n.removesuffix(".pyc")
            if base == n:
                continue
            if ".opt-" in base:
                base = base.rpartition(".opt-")[0]
            if base.rpartition(".")[0] in names:  # (what precedes the interpreter's tag)
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(cache, n))


def _make_dir(d: str) -> None:
    """``os.makedirs(d, exist_ok=True)`` in one system call when ``d`` exists (the usual case)."""
    try:
        os.mkdir(d)
    except FileExistsError:
        pass
    except FileNotFoundError:
        make_dirs(d)


def _has_remote_digest(full: str, marker: str) -> bool:
    """Does the file hold the content a ``remote:`` digest names (after a fetch)?"""
    try:
        from buildtool.remote.action import Digest, file_hash
    except ImportError:  # the 'remote' extra was uninstalled since: the output is rebuilt
        return False

    try:
        fn, d = Digest.of_marker(marker)
        return os.path.getsize(full) == d.size and file_hash(full, fn) == d.hash
    except (OSError, ValueError):
        return False
