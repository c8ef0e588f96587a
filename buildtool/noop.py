"""No-op snapshot: the fast path that proves "nothing changed" (or "only these sources
and outputs changed") with stats alone.

After a build in which every target succeeded, buildtool writes ``.buildtool/noop``: the
request, the environment variables that can change an action key or an evaluation, and
the stat data of every file the build depended on (BUILD.py files, imported workspace
modules, files read while evaluating, config files, sources, outputs, tools) and of every
directory whose listing mattered (package discovery, globs).  The next identical request
stats those paths; if all match, the build is a no-op without evaluating a single
BUILD.py.  Any difference — or a snapshot of another version — falls back to the full
build, which is always correct.  A snapshot is not written while any file that shapes
the graph is racily clean (changed within the timestamp granularity of the snapshot), so
a change in the same clock tick can never hide; a racily clean source or output counts as
changed, unless the build recorded its digest and its content still has it.

When everything that shapes the graph (BUILD.py files, modules, listed directories,
config, env, tools) is unchanged and only some sources, outputs or headers discovered
through depfiles differ, the pickled graph of that build (``.buildtool/graph``) is reused
and only the targets touching those files (a header: the targets whose depfile named it),
and their dependents, are planned: an incremental build without evaluating any BUILD.py.
The pickle is only read after the snapshot's stat data (inode and ctime included, which
no checkout can reproduce) matched, so a ``.buildtool`` directory that came from
elsewhere is never unpickled.

When what changed shapes only the graph (a BUILD.py, a module it imports, a listed
directory), not the actions (the config, tools, pyrule modules: the snapshot's ``hard``
entries), the verdict is a *regraph*: the build evaluates everything
again and plans only what the new graph declares differently from the pickled one.
Spec: docs/formats.md#no-op-snapshot--buildtoolnoop-and-buildtoolgraph

Statting is the whole cost of a large no-op: the C loop of ``_statcmp.c`` (where the
install could build it) stats them on one thread per ``PER_THREAD`` paths, one per core at
most.  When the workspace's file monitor runs (monitor.py), a full check that found
nothing changed leaves ``.buildtool/noop-clock``: the monitor's position before that
check, the request, the environment and the few paths the monitor cannot see.  While the
monitor then answers "nothing changed since", a no-op stats only those (``_by_monitor``):
constant time.
"""

from __future__ import annotations

import marshal
import os
import sys
import time

from buildtool.workspace import open_regular, remove_if_not_a_file

TYPE_CHECKING = False  # the no-op path imports neither typing nor dataclasses (~20 ms of start-up)
if TYPE_CHECKING:  # nor collections.abc (which imports collections): annotations are strings here
    from collections.abc import Callable, Container, Iterable, Mapping, Sequence
    from typing import Any

    Seen = Sequence[Mapping[str, list]]  # path -> [size, mtime_ns, ino, ctime_ns, ...] as the build relied on it

FORMAT_VERSION = 13  # v6: the body in marshal, not JSON (json pulls in re and enum: ~6 ms of every no-op);
# v7: the length line also carries the CRC-32 of the body; v8: listings say where a link leads
# (an older snapshot's listings would vouch for a directory whose link changed its target);
# v9: listings leave out the directories on the way to outputs, which are listed themselves;
# v10: "hard" names what shapes actions, not only the graph (a BUILD.py edit is then a "regraph");
# v11: the request has the workspace's path, a listing each symbolic link's target;
# v12: "record" is the build record's identity when the snapshot was written, "graph" the
# checksum of the .buildtool/graph written with it; v13: "found", the headers discovered through
# depfiles, out of "hard": an edited header plans its readers (an incremental build), not every target
HEADER = f"# buildtool noop-snapshot v{FORMAT_VERSION}\n"
MARSHAL_VERSION = 4  # marshal's format 4 (Python 3.4 on); the body holds only str, int, list, dict, None
# v3: Graph is a plain slotted class; v4: the header line ends with the BLAKE3 of the pickle
# v5: the checksum is keyed with this user's secret (_user_key), preceded by the key's id
GRAPH_HEADER = b"# buildtool graph v5 "
WINDOW_NS = 50_000_000
COARSE_WINDOW_NS = 2_000_000_000
ENV_PREFIXES = ("BUILDTOOL_",)
ENV_ALWAYS = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "PYTHONPATH", "PYTHONHOME")  # (the last
# two: what a BUILD.py or a pyrule imports)
# Variables that may carry credentials (docs/remote.md): the snapshot keeps a digest of them.
ENV_SECRET = ("BUILDTOOL_REMOTE_CACHE", "BUILDTOOL_REMOTE_EXECUTOR", "BUILDTOOL_REMOTE_HEADERS")


LAST_STARTED = "noop-last"  # the slot of the request whose build started last
MAX_SLOTS = 4  # requests remembered at once: `build //...` and `build //app` in turn stay no-ops


def slot_of(request: Mapping[str, object]) -> str:
    """The file-name suffix of a request's snapshot, graph and clock: each request (patterns,
    mode, working directory...) keeps its own, up to MAX_SLOTS of them, so a developer who
    builds ``//...`` and ``//app`` in turn gets a no-op from each (one file held the last
    request's alone: at 30,000 targets every switch evaluated everything, 6-8 s).  A digest
    of ``request_of``'s value, builtins only (``_clock_sum``); two requests that share one
    still compare their whole request, and the second takes the full path.  Of its repr,
    not its marshal: marshal marks objects by their reference counts and interning, so
    equal requests made by two paths (the quick parser's, argparse's) got two slots."""
    return f"{_clock_sum(repr(request).encode('utf-8', 'surrogateescape')):08x}"


def _path(state_dir: str, slot: str) -> str:
    return os.path.join(state_dir, "noop." + slot)


def _graph_path(state_dir: str, slot: str) -> str:
    return os.path.join(state_dir, "graph." + slot)


def _slot_names(state_dir: str, kind: str = "noop") -> list[tuple[int, str]]:
    """(mtime_ns, slot) of every snapshot (``kind`` "graph": graph) in ``state_dir``."""
    found = []
    n = len(kind) + 1
    try:
        with os.scandir(state_dir) as it:
            for e in it:
                s = e.name[n:]
                if e.name.startswith(kind + ".") and len(s) == 8 and all(c in "0123456789abcdef" for c in s):
                    try:
                        found.append((e.stat(follow_symlinks=False).st_mtime_ns, s))
                    except OSError:
                        pass
    except OSError:
        pass
    return found


def _evict(state_dir: str, keep: str) -> None:
    """Remove the snapshots (with their graphs and clocks) of the requests built longest
    ago, beyond MAX_SLOTS."""
    others = sorted((m, s) for m, s in _slot_names(state_dir) if s != keep)
    gone = [s for _, s in others[: max(0, len(others) - (MAX_SLOTS - 1))]]
    kept = {s for _, s in others} - set(gone) | {keep}
    # (and a graph without its snapshot: a request whose last build failed, or started a process)
    gone += [s for _, s in _slot_names(state_dir, "graph") if s not in kept and s not in gone]
    for s in gone:
        for path in (_path(state_dir, s), _graph_path(state_dir, s), _clock_path(state_dir, s)):
            try:
                os.unlink(path)
            except OSError:
                pass


def _record_id(state_dir: str) -> list[int] | None:
    """The build record's [inode, size, mtime_ns, ctime_ns], None if it is missing.  An
    incremental build takes what the targets outside its cone produced from the record:
    only from the record the snapshot's build left (every build that writes the record
    removes the snapshot first), not one that lost its last lines (power loss) or was
    copied back."""
    try:
        st = os.stat(os.path.join(state_dir, "record"))
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]  # (ctime: `cp -p` keeps the mtime)


class Verdict:
    """What the snapshot proves: a no-op, or a build where only ``changed`` files differ."""

    __slots__ = ("body", "changed", "dirs", "env_names", "lock", "regraph", "slot", "struct", "targets", "verified")

    def __init__(
        self, targets: int, changed: list[str], struct: list[str], dirs: list[str], env_names: list[str],
        body: dict[str, Any], regraph: bool = False, verified: dict[str, list[Any]] | None = None, slot: str = "",
    ) -> None:
        self.targets = targets
        self.changed = changed  # sources and outputs whose stat differs ([] for a no-op); for a
        # regraph also the BUILD.py files, modules and listed directories that changed
        self.regraph = regraph  # the graph must be evaluated again (nothing else that shapes actions changed)
        self.struct = struct  # the files that shape the graph, to snapshot again
        self.dirs = dirs  # the directories whose listings shape it
        self.env_names = env_names
        self.body = body  # the snapshot as read: its unchanged parts are kept
        self.lock: Any = None  # from try_noop: the workspace lock, still held, so the verdict stays true
        self.slot = slot  # which request's files (slot_of)
        self.verified = verified or {}  # racy rows whose content the check found unchanged: their stat and digest

    def rows(self) -> dict[str, list[Any] | None]:
        """What the check found unchanged of each source and output of the snapshot (None:
        did not exist; a racy row the check verified by content: that stat and digest, as a
        stat cache entry), as ``seen`` for the snapshot written after a regraph build: a file
        of a target that build did not plan is signed against what the check vouched for, so
        an edit made since still counts as a change next time."""
        paths = self.body["srcs"] + self.body["outs"]
        cols = self.body["_cols"]
        changed = set(self.changed)
        out: dict[str, list[Any] | None] = {}
        for k, p in enumerate(paths):
            if p not in changed:
                row = [c[k] for c in cols]
                out[p] = self.verified.get(p) if row[0] == RACY[0] else None if row[0] == MISSING else row
        return out


def stat_row(st: os.stat_result) -> list[int]:
    """A file's stat data as the snapshot compares it."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def _sig(root: str, rel: str) -> list[int] | None:
    try:  # (not os.path.join: a snapshot signs every source and output, 20,000 at W6)
        st = os.stat(rel if rel[:1] == "/" else f"{root}/{rel}")
    except OSError:
        return None
    return stat_row(st)


_UNSEEN = object()


def env_view(names: Iterable[str]) -> dict[str, str | None]:
    env = os.environ
    out: dict[str, str | None] = {n: env.get(n) for n in (*ENV_ALWAYS, *names)}
    for k, v in env.items():
        if k.startswith(ENV_PREFIXES):
            out[k] = _secret_digest(v) if k in ENV_SECRET else v
    return out


def _secret_digest(value: str) -> str:
    from _blake2 import blake2b  # (imported only when such a variable is set)

    return "blake2b:" + blake2b(value.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def _same_env(recorded: Mapping[str, str | None]) -> list[str] | None:
    """The names a snapshot's env view was taken over (beyond the BUILDTOOL_* ones), if
    the environment still gives the same view; None if it changed."""
    names = [k for k in recorded if not k.startswith(ENV_PREFIXES)]
    return names if env_view(names) == recorded else None


def started(state_dir: str, who: str) -> None:
    """Note in ``noop-last`` that request ``who`` (or ``clean`` of some targets) writes the
    build record now: another request's snapshot then finds the record changed by it, not
    by a crash, and checks every target without a warning."""
    try:
        fd = os.open(os.path.join(state_dir, LAST_STARTED), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                     | os.O_NONBLOCK, 0o644)  # (a named pipe there: ENXIO, not a wait)
        try:
            os.write(fd, who.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def invalidate(state_dir: str, slot: str) -> None:
    """Before a build that may write files: remove this request's snapshot, and every
    request's clock (the monitor's "nothing changed since" must not outlive a build: what
    it wrote in .buildtool/ is unwatched).  Other requests' snapshots stay: each is still
    checked file by file, and against the build record's identity, before it vouches."""
    paths = [_path(state_dir, slot)]
    try:
        with os.scandir(state_dir) as it:
            paths += [e.path for e in it if e.name.startswith("noop-clock.")]
    except OSError:
        pass
    started(state_dir, slot)
    for path in paths:
        try:
            os.unlink(path)
        except IsADirectoryError:  # damaged state: remove it, or no snapshot could ever be written
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def drop_all(state_dir: str) -> None:
    """Remove every request's snapshot and clock: a build changed what other requests'
    targets depend on without changing a file they list (a stamp run again under its
    recorded key, ``build -B //:stamp``: its dependents must run on the next build)."""
    for _, s in _slot_names(state_dir):
        for path in (_path(state_dir, s), _clock_path(state_dir, s)):
            try:
                os.unlink(path)
            except OSError:
                pass


RACY = [-1]  # stored for a racily clean source/output: "treat as changed" next time


def _sigs(
    root: str, files: Iterable[str], now: int, racy_ok: bool, seen: Seen = (),
    digests: dict[str, str] | None = None, every: Seen = (),
) -> dict[str, list[int] | None] | None:
    """Stat data of ``files``.  A file that is racily clean, or whose stat differs from
    the one the build relied on (it changed during the build), is stored as RACY when
    ``racy_ok`` (it will count as changed), else the whole snapshot is refused (None).
    What the build relied on: every map of ``every`` that holds the file must agree with
    its stat; for a file none of them holds, the first map of ``seen`` that holds it.
    ``digests``: filled with the content digest of that entry (a stat cache entry) for each
    file stored as RACY only for being recent, so that the next check can compare its
    content instead of counting it as changed (``_verify_racy``)."""
    sigs: dict[str, list[int] | None] = {}
    for rel in files:
        if rel in sigs:
            continue
        try:  # (not os.path.join: a snapshot signs every source and output, 20,000 at W6)
            st = os.stat(rel if rel[:1] == "/" else f"{root}/{rel}")
            s: list[int] | None = stat_row(st)
        except OSError:
            s = None
        moved = False
        e: Any = _UNSEEN
        for m in every:
            got = m.get(rel, _UNSEEN)
            if got is not _UNSEEN:
                e = got
                moved = moved or _differs_from(got, s)
        if e is _UNSEEN:
            for m in seen:
                e = m.get(rel, _UNSEEN)  # (one call: the stat cache's mapping is Python code)
                if e is not _UNSEEN:
                    moved = _differs_from(e, s)
                    break
        recent = s is not None and _recent(s[1], s[3], now)
        if moved or recent:
            if not racy_ok:
                return None
            if not moved and digests is not None and s is not None and s[0] <= VERIFY_MAX:
                d = _digest_of(e)
                if d is not None:
                    digests[rel] = d + (X_MARK if st.st_mode & 0o100 else "")
            s = RACY
        sigs[rel] = s
    return sigs


X_MARK = "+x"  # ends a ``racy`` digest of a file with its owner's executable bit (an action key has it)


def _recent(mtime_ns: int, ctime_ns: int, now: int) -> bool:
    """Whether a stat taken after ``now`` was read may still change without its times
    moving: written within the clock's granularity of ``now`` (a whole-second filesystem
    gets a wider window)."""
    coarse = mtime_ns % 1_000_000_000 == 0 and ctime_ns % 1_000_000_000 == 0
    newest = ctime_ns if mtime_ns > now else max(mtime_ns, ctime_ns)  # (a future mtime: digest.racy)
    return newest + (COARSE_WINDOW_NS if coarse else WINDOW_NS) > now


def _differs_from(e: list | None, s: list[int] | None) -> bool:
    """Whether the stat ``s`` (None: no file) is not the one entry ``e`` was made at."""
    return e is not None if s is None else (e is None or e[:4] != s)


def _digest_of(e: Any) -> str | None:
    """The local content digest of a stat cache entry, or None (not an entry, or an output
    left in a remote CAS)."""
    d = e[5] if isinstance(e, list) and len(e) > 5 else None
    return d if isinstance(d, str) and not d.startswith("remote:") else None


def _still(root: str, rel: str, digest: str, seen: Seen) -> bool:
    """Whether a row the incremental build does not sign again may keep its racy digest:
    the build did not rely on the file, or relied on that content and the file has not
    been touched since (an A-B-A rewrite during the build, with a reader of B, changes the
    stat though the content is back)."""
    for m in seen:
        e = m.get(rel, _UNSEEN)
        if e is not _UNSEEN:
            return _digest_of(e) == digest.removesuffix(X_MARK) and not _differs_from(e, _sig(root, rel))
    return True


def struct_sigs(root: str, files: Iterable[str]) -> dict[str, list[int] | None]:
    """The stat data of the files that shaped the graph, taken right after evaluation: a
    BUILD.py edited later in the build then refuses the snapshot (see ``write``)."""
    return {rel: _sig(root, rel) for rel in files}


def dir_listings(
    root: str, dirs: Iterable[str], outputs: Iterable[str], dead: Iterable[str] = (),
    skip: Callable[[str], bool] | None = None,
) -> dict[str, str | None]:
    """The listing fingerprints of the directories the evaluation listed, right after it:
    a source or package that appears later in the build then refuses the snapshot.
    ``dead``: the outputs this build deletes because no target declares them now (left
    out: their going is no change; not their directories, which stay unless emptied)."""
    outputs = list(outputs)
    hidden = hidden_entries(outputs) | set(dead)  # (a dead output's directory stays, unless emptied)
    dirs = set(dirs)
    dirs.update(_output_dirs(root, outputs, dirs, skip))  # (as write() lists them: compared there)
    return {d: _listing(root, d, hidden) for d in dirs}


MOVED = "~moved"  # a listing fingerprint no directory has: "changed while the evaluation read it"


def unsettled_listings(
    root: str, dir_stats: Mapping[str, tuple[int, int, int] | None], listed: dict[str, str | None],
) -> None:
    """Mark (``MOVED``) in ``listed`` each directory whose stat moved since the evaluation
    listed it (a file made then may be in the fingerprint taken now though glob() never
    saw it): the snapshot is then refused, and the next build evaluates again.  (Not one
    whose change fell in the very clock tick of its listing, after it: the build's own
    ``.buildtool`` made just before would refuse the first snapshot of every checkout.)"""
    for d, before in dir_stats.items():
        try:
            st = os.stat(os.path.join(root, d) if d else root)
            now: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        except OSError:
            now = None
        if now != before:
            listed[d] = MOVED


def hidden_entries(outputs: Iterable[str]) -> set[str]:
    """What a listing leaves out: the outputs, and every directory on the way to one (a
    build makes those; the snapshot follows such a directory by its own listing instead,
    ``_output_dirs``, so a BUILD.py or source put in it is still seen)."""
    out = set(outputs)
    dirs: set[str] = set()
    for d in {o.rpartition("/")[0] for o in out}:  # (10,000 outputs in a few directories)
        while d and d not in dirs:
            dirs.add(d)
            d = d.rpartition("/")[0]
    out.update(d + "/" for d in dirs)  # ("gen/": the directory gen, not a link named gen: that one counts)
    return out


class _Lazy:
    """A set made on the first membership test (a 10,000-output incremental build whose
    directories' stats all match lists none of them, and makes none)."""

    __slots__ = ("_make", "_set")

    def __init__(self, make: Callable[[], set[str]]) -> None:
        self._make = make
        self._set: set[str] | None = None

    def __contains__(self, item: object) -> bool:
        return item in self.made()

    def made(self) -> set[str]:
        """The set itself (a listing of 100,000 entries asks the set, not this wrapper)."""
        if self._set is None:
            self._set = self._make()
        return self._set


def _output_dirs(
    root: str, outs: Iterable[str], listed: Iterable[str], skip: Callable[[str], bool] | None = None,
) -> list[str]:
    """The directories on the way to outputs that a listed directory's listing leaves out
    (``hidden_entries``) and that exist: each is then listed itself, down the chain.  Not
    one the evaluation never looks into: ``skip`` (.buildtoolignore).  (A package's is
    listed too, though a label build's glob only probes it: a BUILD.py a command put there
    must be seen.)"""
    tracked = set(listed)
    found: list[str] = []
    dirs = {d for parent in {o.rpartition("/")[0] for o in outs} if parent for d in _ancestors(parent + "/")}
    for d in sorted(dirs, key=lambda p: p.count("/")):  # parents first
        if d.rpartition("/")[0] not in tracked or d in tracked:
            continue
        full = os.path.join(root, d)
        if not os.path.isdir(full) or (skip is not None and skip(d)):
            continue
        tracked.add(d)
        found.append(d)
    return found


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def write(
    state_dir: str,
    root: str,
    request: Mapping[str, object],
    env_names: Iterable[str],
    struct: Iterable[str],
    dirs: Iterable[str],
    srcs: Iterable[str],
    outs: Iterable[str],
    graph: object,
    seen: Seen = (),
    keep: Verdict | None = None,
    listed: Mapping[str, str | None] | None = None,
    struct_seen: Seen = (),
    cwd: str | None = None,
    skip: Callable[[str], bool] | None = None,
    hard: Iterable[str] = (),
    carry: Verdict | None = None,
    found: Iterable[str] = (),
) -> bool:
    """Snapshot the files (workspace-relative or absolute) and pickle ``graph``;
    False (and no snapshot) if a file that shapes the graph is racily clean or changed
    since the build relied on it.

    ``seen``: the stat data the build relied on for sources and outputs (the entries it
    used, then the stat cache's); a file whose stat moved since is stored as changed.
    ``struct_seen``: for the files that shape the graph, what the build relied on (their
    stats right after evaluation, the entries its actions used): all must still hold,
    else the snapshot is refused; a file in none of them is checked against ``seen``.
    ``keep``: the verdict of the incremental build that ends here (its graph came from the
    snapshot): ``srcs``/``outs`` are then only the files of the planned cone, the rest keep
    the signatures that the check, under the same lock, found unchanged, and the pickled
    graph is left as it is.  ``cwd``: the working directory, when the evaluation opened a
    workspace file by a relative path (the graph then holds for that directory only).
    ``skip``: directories the evaluation never looks into (``_output_dirs``).
    ``hard``: the ``struct`` files and ``dirs`` that shape actions, not only the graph (the
    config, tools, the directories searched for them, pyrule modules):
    a change to one of them is a full build; to any other, a regraph (``check``).
    ``found``: the ``struct`` files that are headers discovered through depfiles (and
    nothing else that shapes the graph): a change to one plans the targets whose depfile
    named it, as a changed source plans its readers (``check``).
    ``carry``: the verdict of the regraph build that ends here: the ``hard`` files and
    directories of its snapshot that this build did not look at (the tools of targets it
    did not plan) are kept as the check found them.
    ``listed``: the directory fingerprints taken
    right after evaluation (``dir_listings``; after an incremental build, the ones the
    check verified): a directory whose listing differs now refuses the snapshot."""
    now = time.time_ns()
    slot = slot_of(request)
    unread: list[str] = []  # edited headers no planned target read: signed as they are now
    if keep is not None:
        old = keep.body
        cwd = old["request"].get("dir") if isinstance(old["request"], dict) else None
        # (a header the check found edited is signed anew: the build read it; an unchanged
        # one keeps the signature the check vouched for, as a source does)
        headers = set(keep.changed).intersection(old.get("found", ()))
        # One that no planned target read (its compile no longer names it; deleted, moved)
        # has nothing the build relied on to be checked against: the stat cache's older
        # entry refused the snapshot, and the next build checked every target.
        unread = sorted(h for h in headers if not any(h in m for m in struct_seen))
        struct = [f for f in struct if f not in old["files"] or (f in headers and f not in unread)]
        # A source the check found unchanged keeps its signature: a build writes no source,
        # and one edited since the check differs from that signature next time all the
        # same (W6: 10,000 sources not signed again).
        changed = set(keep.changed)
        srcs = [f for f in srcs if f in changed]
    racy: dict[str, str] = {}
    parts = [_sigs(root, struct, now, False, seen, every=struct_seen), _sigs(root, srcs, now, True, seen, racy),
             _sigs(root, outs, now, True, seen, racy), _sigs(root, unread, now, False)]
    if any(p is None for p in parts):
        invalidate(state_dir, slot)
        return False
    struct_sigs, src_sigs, out_sigs, unread_sigs = parts
    assert struct_sigs is not None and src_sigs is not None and out_sigs is not None and unread_sigs is not None
    struct_sigs.update(unread_sigs)
    if keep is not None:  # the re-signed rows have new digests; a kept row keeps its own
        # unless the build relied on other content (a command rewrote the file, another
        # read it, something put the old content back): it then counts as changed.
        kept = {p: d for p, d in keep.body.get("racy", {}).items() if p not in src_sigs and p not in out_sigs}
        racy = {p: d for p, d in kept.items() if _still(root, p, d, seen)} | racy
    if keep is None:
        src_paths, out_paths = list(src_sigs), list(out_sigs)
        cols = _columns([*src_sigs.values(), *out_sigs.values()])
        old_dirs: Mapping[str, list[object]] = {}
        n = len(getattr(graph, "targets", ()))
    else:  # the old columns, with the cone's files re-signed in place
        src_paths, out_paths = keep.body["srcs"], keep.body["outs"]
        cols = _columns([])
        for c, old_col in zip(cols, keep.body["_cols"], strict=True):
            c.extend(old_col)
        at = dict(zip([*src_paths, *out_paths], range(len(src_paths) + len(out_paths)), strict=True))
        for p, s in [*src_sigs.items(), *out_sigs.items()]:
            i = at.get(p)
            if i is not None:
                for c, v in zip(cols, _row(s), strict=True):
                    c[i] = v
        struct_sigs = {**keep.body["files"], **struct_sigs}
        old_dirs = keep.body["dirs"]
        n = keep.targets
    outputs = _Lazy(lambda: hidden_entries(out_paths))  # (built only if a directory is listed)
    dirs = set(dirs)
    made: list[str] = []
    if keep is None:  # (an incremental build keeps the directories its check verified)
        made = _output_dirs(root, out_paths, dirs, skip)
        dirs.update(made)
    dir_sigs = {d: _dir_sig(root, d, outputs, now, old_dirs.get(d)) for d in dirs}
    expected = {d: s[0] for d, s in old_dirs.items()} if keep is not None else dict(listed or {})
    for d in made:  # a directory the build made for outputs holds nothing else (a command that
        expected.setdefault(d, EMPTY_LISTING)  # put a BUILD.py or a source there changed the tree)
    if any(d in expected and sig[0] != expected[d] for d, sig in dir_sigs.items()):
        invalidate(state_dir, slot)  # an entry appeared or went away during the build
        return False
    if cwd is not None:
        request = {**request, "dir": cwd}
    hard = set(hard)
    found = set(found)
    for v in (keep, carry):
        if v is not None:
            hard.update(v.body["hard"])
    if keep is not None:  # (a header no compile names now stays until a full build: one more stat)
        found.update(keep.body.get("found", ()))
    found -= hard
    if carry is not None:
        for p in carry.body["hard"]:
            if p in carry.body["files"]:
                struct_sigs.setdefault(p, carry.body["files"][p])
            if p in carry.body["dirs"]:
                dir_sigs.setdefault(p, carry.body["dirs"][p])
    body = {"request": request, "env": env_view(env_names), "targets": n, "files": struct_sigs, "dirs": dir_sigs,
            "hard": sorted(hard), "found": sorted(found), "srcs": src_paths, "outs": out_paths, "racy": racy,
            "record": _record_id(state_dir),  # (closed by now: a compaction's rename came before)
            "graph": keep.body.get("graph") if keep is not None else None}
    pickle = _pickle()
    from buildtool.atomic import write_atomic  # (here: a no-op that writes nothing does without it)

    try:
        if keep is None:
            data = pickle.dumps(graph, protocol=-1)  # -1: the highest
            key = _user_key()
            gsum = _graph_sum(data, key)
            write_atomic(_graph_path(state_dir, slot), GRAPH_HEADER + _key_id(key) + b" " + gsum + b"\n" + data)
            body["graph"] = gsum.decode()
        raw = marshal.dumps(body, MARSHAL_VERSION)
        from array import array

        packed = b"".join(array("q", c).tobytes() for c in cols)
        write_atomic(_path(state_dir, slot), _framed(raw, packed))
    except OSError as e:
        # A directory in the place of either (renamed onto: EISDIR) turned the fast path off
        # for good without a word: removed, the next build writes them.
        for p in (_graph_path(state_dir, slot), _path(state_dir, slot)):
            if os.path.isdir(p) and not os.path.islink(p):
                print(f"buildtool: warning: {p} is a directory, not the no-op snapshot's file ({e.strerror}); "
                      "removed it", file=sys.stderr)
                remove_if_not_a_file(p)
        return False
    except (ValueError, pickle.PicklingError):
        return False
    _evict(state_dir, slot)
    return True


MISSING = -2  # size column of a file that did not exist; RACY's -1 matches no file


def _row(s: list[int] | None) -> list[int]:
    """One file's values in the columns: [size, mtime_ns, ino, ctime_ns] or a sentinel size."""
    if s is None:
        return [MISSING, 0, 0, 0]
    return s if len(s) == 4 else [-1, 0, 0, 0]


def _columns(sigs: list[list[int] | None]) -> list[list[int]]:
    """The stat columns of ``sigs``: all sizes, then all mtimes, inodes, ctimes.  Plain
    lists (``array`` imports collections.abc, which the no-op path does without); written
    as int64 in native byte order and read back as one ``memoryview`` cast."""
    cols: list[list[int]] = [[], [], [], []]
    for s in sigs:
        for c, v in zip(cols, _row(s), strict=True):
            c.append(v)
    return cols


def _pickle() -> Any:
    """pickle's C implementation, without the pure-Python ``pickle`` module around it (which
    costs ~1.5 ms to import, on every incremental build); the same bytes either way."""
    try:
        import _pickle

        return _pickle
    except ImportError:  # an interpreter without the accelerator
        import pickle

        return pickle


def load_graph(state_dir: str, warn: Callable[[str], None], expected: object, slot: str) -> object | None:
    """The graph pickled with the snapshot (only after ``check`` vouched for it); None when
    the file is missing, of another version or damaged (checked by its checksum: a flipped
    byte in a pickle may still load, as a graph with another command or path in it), or
    not the one written with the snapshot (``expected``: the checksum its body holds; the
    graph's rename lost to a crash, an older file copied back)."""
    pickle = _pickle()
    try:
        with open_regular(_graph_path(state_dir, slot)) as f:
            data = f.read()
    except OSError:
        return None
    head, nl, body = data.partition(b"\n")
    if not head.startswith(GRAPH_HEADER) and head.startswith(GRAPH_HEADER.split(b" v")[0] + b" v"):
        return None  # another version's: evaluated afresh, as after an upgrade (an empty or foreign file: damaged)
    key = _user_key()
    key_id, _, gsum = head[len(GRAPH_HEADER):].partition(b" ")
    if head.startswith(GRAPH_HEADER) and nl and (key is None or key_id != _key_id(key)):
        return None  # written under another key (this user's made anew after a reboot's /tmp), or none here
    try:
        if head.startswith(GRAPH_HEADER) and nl and gsum == _graph_sum(body, key):
            if gsum.decode() == expected:
                return pickle.loads(body)
            warn(f"{_graph_path(state_dir, slot)} is not the graph the no-op snapshot was written with; evaluating the "
                 "BUILD.py files again")
            return None
    except Exception:  # a pickle that does not load: said below
        pass
    warn(f"{_graph_path(state_dir, slot)} is damaged; evaluating the BUILD.py files again")
    return None


def _graph_sum(data: bytes, key: bytes | None) -> bytes:
    """The pickle's BLAKE3, keyed with this user's secret: a forged ``.buildtool/`` (a CI
    cache restored, a checkout, a copy) cannot name a pickle of its own making, so none
    is ever unpickled (a pickle runs code).  Unkeyed where there is no key: then never loaded."""
    import blake3

    from buildtool.workspace import blake3_refused_threads

    threads = blake3.blake3.AUTO
    while True:
        h = blake3.blake3(key=key, max_threads=threads) if key else blake3.blake3(max_threads=threads)
        try:
            h.update(data)
        except BaseException as e:
            if threads == 1 or not blake3_refused_threads(e):
                raise
            threads = 1
            continue
        return h.hexdigest().encode()


def _key_id(key: bytes | None) -> bytes:
    """Which key a graph was written under (not secret: a digest of it)."""
    if key is None:
        return b"none"
    import blake3

    return blake3.blake3(b"buildtool graph key id " + key).hexdigest(8).encode()


def _user_key() -> bytes | None:
    """This user's 32-byte secret for the graph's checksum: ``/tmp/buildtool-<uid>/graph-key``
    (0600, in a 0700 directory of this user's own), made if missing; None where there is
    no such place or the file is not this user's alone."""
    from buildtool.workspace import private_tmp_dir

    d = private_tmp_dir()
    if d is None:
        return None
    path = os.path.join(d, "graph-key")
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue  # (another buildtool made it meanwhile: read that one)
            except OSError:
                return None
            try:
                os.write(fd, os.urandom(32))
            finally:
                os.close(fd)
            continue
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            key = os.read(fd, 64)
        finally:
            os.close(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or len(key) != 32:
            return None
        return key
    return None


def _listing(root: str, rel: str, outputs: Container[str]) -> str | None:
    """A fingerprint of a directory's entries, leaving out outputs, the directories on the
    way to them (``hidden_entries``) and state: what package discovery and glob() see.
    (Its mtime would change each time an output is rewritten.)
    A symbolic link counts with what it leads to now (glob() takes a link to a file, not
    one to a directory or to nothing) and with its target's text (what ``os.readlink`` and
    ``os.lstat`` in a BUILD.py see), and then starts with ``LINKED``: such a listing can
    change with no change to the directory, so its stat never vouches for it."""
    prefix = f"{rel}/" if rel else ""
    names = []
    links = False
    if isinstance(outputs, _Lazy):
        outputs = outputs.made()
    try:
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            for e in it:
                path = prefix + e.name
                if path in outputs or e.name == ".buildtool" or (e.name == ".git" and e.is_dir(follow_symlinks=False)):
                    continue  # (a .git file, a worktree's or a submodule's, is a file a glob() takes)
                if path + "/" in outputs and e.is_dir(follow_symlinks=False):
                    continue  # a directory on the way to outputs: listed itself (_output_dirs)
                if e.is_symlink():
                    links = True
                    try:
                        target = os.readlink(e.path)
                    except OSError:  # (gone since it was listed)
                        target = ""
                    kind = "@f" if e.is_file() else "@d" if e.is_dir() else "@"
                    names.append(f"{e.name}{kind}//{target}")  # ("//": no name has a "/", a directory's ends in one)
                else:
                    names.append(e.name + ("/" if e.is_dir(follow_symlinks=False) else ""))
    except OSError:
        return None
    import blake3  # (here, not at the top: a no-op lists no directory unless one changed)

    fp = blake3.blake3("\0".join(sorted(names)).encode("utf-8", "surrogateescape")).hexdigest(length=16)
    return LINKED + fp if links else fp


LINKED = "L"  # starts the fingerprint of a listing with a symbolic link in it
EMPTY_LISTING = "af1349b9f5f9a1a6a0404dea36dcc949"  # _listing of a directory of outputs only (blake3-128 of b"")


def _dir_sig(
    root: str, rel: str, outputs: Container[str], now: int, old: list[object] | None = None
) -> list[object]:
    """[listing fingerprint, mtime_ns, ctime_ns, ino]; the stat part (None when racily
    clean) lets a check skip listing a directory whose entries cannot have changed.
    ``old``: the previous signature, kept as it is while the directory's stat matches it."""
    try:
        st = os.stat(os.path.join(root, rel) if rel else root)
    except OSError:
        return [_listing(root, rel, outputs), None, None, None]
    if old is not None and old[1] is not None and old[1:] == [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]:
        return old
    fp = _listing(root, rel, outputs)
    if _recent(st.st_mtime_ns, st.st_ctime_ns, now) or (fp or "").startswith(LINKED):
        return [fp, None, None, None]  # changed too recently (or linked) to vouch for by stat
    return [fp, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _dirs_differ(
    root: str, dirs: Mapping[str, list[object]], outs: list[str], now: int, settled: dict[str, list[object]],
    stop: Container[str] | None = None,
) -> list[str]:
    """The directories whose listing differs, up to the first one in ``stop`` (None: up to
    the first one at all).  One stored without its stat (racily clean then) whose listing is the
    same and whose stat is no longer recent goes to ``settled`` with that stat: the
    snapshot can then vouch for it by stat (``_settle``)."""
    outputs: set[str] | None = None  # built only if a directory must be listed again
    found: list[str] = []
    for rel, (fp, mtime, ctime, ino) in dirs.items():
        try:
            st = os.stat(os.path.join(root, rel) if rel else root)
        except OSError:
            st = None
        if mtime is not None and st is not None and (st.st_mtime_ns, st.st_ctime_ns, st.st_ino) == (mtime, ctime, ino):
            continue  # no entry was added, removed or renamed since
        if mtime is None or st is not None:
            if outputs is None:
                outputs = hidden_entries(outs)
            if _listing(root, rel, outputs) == fp:
                if st is not None and not _recent(st.st_mtime_ns, st.st_ctime_ns, now) \
                        and not (fp or "").startswith(LINKED):  # (stat before listing)
                    settled[rel] = [fp, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
                continue
        found.append(rel)
        if stop is None or rel in stop:
            break
    return found


def _odd_output(root: str, rel: str) -> bool:
    """Is what stands at an output path now other than a regular file, or nothing in a
    directory: a directory, a symbolic link, something else on its way (a directory on
    the way replaced by a link: the graph check refuses one that leads elsewhere)?"""
    path = os.path.join(root, rel)
    try:
        if (os.lstat(path).st_mode & 0o170000) != 0o100000:  # (not S_IFREG)
            return True
    except FileNotFoundError:
        if not os.path.isdir(os.path.dirname(path)):
            return True
    except OSError:
        return True
    return _linked_on_the_way(root, rel)


def _odd_source(root: str, rel: str) -> bool:
    """Is a changed source now missing, not a regular file, a link, or reached through
    one: the graph check judges it (exit 2 for a named pipe or a directory), as a fresh
    build would."""
    if rel[:1] == "/":  # (out of the workspace: only its existence is the graph's business)
        return not os.path.exists(rel)
    try:
        if (os.lstat(os.path.join(root, rel)).st_mode & 0o170000) != 0o100000:
            return True
    except OSError:
        return True
    return _linked_on_the_way(root, rel)


def _linked_on_the_way(root: str, rel: str) -> bool:
    """Whether a directory between the root and ``rel`` is a symbolic link (or gone)."""
    d = rel.rpartition("/")[0]
    while d:
        try:
            if (os.lstat(os.path.join(root, d)).st_mode & 0o170000) == 0o120000:  # (S_IFLNK)
                return True
        except OSError:
            return True
        d = d.rpartition("/")[0]
    return False


def _differs(root: str, sigs: Mapping[str, list[int] | None]) -> list[str]:
    """The paths (of ``files``) whose stat data differs."""
    paths = list(sigs)
    cols = _columns(list(sigs.values()))
    return [paths[k] for k in _differs_cols(root, paths, cols, 0, len(paths))]


# The C loop stats on one thread per this many paths (at most one per CPU this process may
# run on).  Measured on a 2-core VM against the forked child this replaced
# (docs/architecture.md): a 1,000-target no-op (2,000 paths, two threads) 14.6 -> 13.3 ms,
# 10,000 targets 35 -> 30 ms.
PER_THREAD = 500
MAX_THREADS = 8


def _differs_cols(root: str, paths: list[str], cols: Sequence[Sequence[int]], lo: int, hi: int) -> list[int]:
    """The positions in ``paths`` (increasing) whose stat data differs from columns ``lo:hi``.
    Relative paths are stat'ed against an open descriptor of the root (no string joins:
    this loop is the whole no-op build)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return _compare(fd, paths, cols, lo, 0, hi - lo)
    finally:
        os.close(fd)


def _compare(fd: int, paths: list[str], cols: Sequence[Sequence[int]], lo: int, a: int, b: int) -> list[int]:
    """The positions ``a <= k < b`` whose file's stat differs from row ``lo + k`` of the columns.
    Columns read from a snapshot (int64 buffers) go to the C loop where it was built
    (``_statcmp.c``: the same comparison without a ``stat_result`` per file, on
    ``_threads`` threads)."""
    if b - a >= C_LOOP_MIN and all(isinstance(c, memoryview) and c.format == "q" for c in cols):
        fast = _accelerator()
        if fast is not None:
            return fast(fd, paths, a, b, lo, *cols, MISSING, _threads(b - a))
    return _compare_py(fd, paths, cols, lo, a, b)


def _threads(n: int) -> int:
    """How many threads the C loop stats ``n`` paths on: one per ``PER_THREAD`` paths, at
    most one per CPU this process may run on and ``MAX_THREADS``."""
    if n < 2 * PER_THREAD:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (no affinity outside Linux)
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_THREADS, n // PER_THREAD))


def _compare_py(fd: int, paths: list[str], cols: Sequence[Sequence[int]], lo: int, a: int, b: int) -> list[int]:
    """``_compare`` in Python: what runs where the C loop was not built, and its reference."""
    stat = os.stat
    out = []
    sizes, mtimes, inos, ctimes = (c[lo + a : lo + b] for c in cols)
    for k, rel, size, mt, ino, ct in zip(range(a, b), paths[a:b], sizes, mtimes, inos, ctimes, strict=True):
        try:
            st = stat(rel, dir_fd=fd)
        except OSError:
            if size != MISSING:
                out.append(k)
            continue
        if size != st.st_size or mt != st.st_mtime_ns or ino != st.st_ino or ct != st.st_ctime_ns:
            out.append(k)
    return out


C_LOOP_MIN = 64  # fewer paths than this are stat-ed in Python: importing the C loop takes longer (~0.15 ms)
_UNLOADED: Any = object()
_fast: Any = _UNLOADED


STATCMP_API = 2  # the arguments ``changed`` takes (_statcmp.c's API)


def _accelerator() -> Callable[..., list[int]] | None:
    """``_statcmp.changed`` if the C loop was built at install time (optional: it needs a
    C compiler) and takes this module's arguments, else None; imported on first use."""
    global _fast
    if _fast is _UNLOADED:
        try:
            from buildtool import _statcmp
        except ImportError:
            _fast = None
        else:  # (one compiled before its source changed, as an editable install keeps it: not used)
            _fast = _statcmp.changed if getattr(_statcmp, "API", 1) == STATCMP_API else None
    return _fast


# A file stored as RACY with its digest is compared by content, up to these sizes; a
# larger one counts as changed (the incremental path then checks it, as before).
VERIFY_MAX = 16 << 20
VERIFY_BUDGET = 64 << 20  # bytes hashed by one check at most


def _verify_racy(
    root: str, paths: list[str], found: list[int], racy: Mapping[str, str], now: int, settled: dict[int, list[int]],
    verified: dict[str, list[Any]] | None = None,
) -> list[int]:
    """``found`` without the files that were stored as RACY only for having been written
    just before the snapshot (the clock might not have moved on from a later write, as in
    git's racy-clean rule) and whose content is still the one the build recorded: after a
    build, the last outputs it wrote are always that recent, and without this the next
    no-op would take the incremental path.  Content (and the owner's executable bit, which
    action keys have), not stat, decides, so a rewrite or a chmod in the same clock tick is
    still seen.  A verified file whose stat (taken before the read)
    is no longer recent goes to ``settled``, by position, with that stat (``_settle``); every
    verified file to ``verified``, by path, as a stat cache entry: its stat and digest."""
    out = []
    budget = VERIFY_BUDGET
    for k in found:
        want = racy.get(paths[k])
        if want is not None and budget > 0:
            got = _read_regular(os.path.join(root, paths[k]), min(VERIFY_MAX, budget))
            if got is not None:
                data, st = got
                budget -= len(data)
                import blake3  # digest.hash_bytes's hash; digest.py itself brings json and array

                digest = blake3.blake3(data).hexdigest()
                if digest + (X_MARK if st.st_mode & 0o100 else "") == want:  # (a chmod +x is a change too)
                    if not _recent(st.st_mtime_ns, st.st_ctime_ns, now):
                        settled[k] = stat_row(st)
                    if verified is not None:
                        verified[paths[k]] = [*stat_row(st), 0, digest]
                    continue
        out.append(k)
    return out


def _read_regular(path: str, limit: int) -> tuple[bytes, os.stat_result] | None:
    """The content of ``path`` and its stat before the read, if it is a regular file of at
    most ``limit`` bytes; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # (a named pipe must not block)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_size > limit:  # not a regular file, or too big
            return None
        data = b""
        while chunk := os.read(fd, limit + 1 - len(data)):
            data += chunk
            if len(data) > limit:  # it grew while being read
                return None
        return data, st
    except OSError:
        return None
    finally:
        os.close(fd)


def _settle(
    state_dir: str, slot: str, body: dict[str, Any], tail: memoryview, paths: list[str],
    dirs: Mapping[str, list[object]], rows: Mapping[int, list[int]],
) -> None:
    """Rewrite the snapshot (and ``body``) that a no-op just vouched for, with the
    directories and files it had to list or read (stored racily clean by the build) now
    signed by their stat: a build can leave its last outputs, and the directory they are
    in, that recent, and every later no-op would list and hash them again (~5 ms of a
    10,000-target no-op).  Best effort: on any trouble the old snapshot stays."""
    new = {k: v for k, v in body.items() if k != "_cols"}
    new["dirs"] = {**body["dirs"], **dirs}
    gone = {paths[k] for k in rows}
    new["racy"] = {p: d for p, d in body.get("racy", {}).items() if p not in gone}
    cols = bytearray(tail)
    q = memoryview(cols).cast("q")
    m = len(paths)
    for k, row in rows.items():
        for i, v in enumerate(row):
            q[i * m + k] = v
    from buildtool.atomic import write_atomic

    try:
        raw = marshal.dumps(new, MARSHAL_VERSION)
        write_atomic(_path(state_dir, slot), _framed(raw, cols))
    except (OSError, ValueError):
        return
    body.update(new, _cols=[q[i * m : (i + 1) * m] for i in range(4)])  # (the verdict's body: the clock's source)


def _crc(data: bytes) -> int:
    """CRC-32 of a snapshot's body (the clock has ``_clock_sum``): a flipped bit in a path
    would otherwise leave that file unchecked (a damaged stat column can only make a file
    look changed).  binascii costs ~0.3 ms to import; blake3, ~1 ms more of every no-op."""
    from binascii import crc32

    return crc32(data)


def _framed(raw: bytes, cols: bytes | bytearray) -> bytes:
    """The snapshot file: header, ``<body length> <CRC-32 of the body, 8 hex digits>``, body, columns."""
    return HEADER.encode() + b"%d %08x\n" % (len(raw), _crc(raw)) + raw + cols


def check(state_dir: str, root: str, request: Mapping[str, object]) -> Verdict | None:
    """What the snapshot proves for this request, or None: do the full build."""
    slot = slot_of(request)
    try:
        with open_regular(_path(state_dir, slot)) as f:
            data = f.read()
        if not data.startswith(HEADER.encode()):
            if data.startswith(HEADER.split(" v")[0].encode() + b" v"):
                return None  # another buildtool version's snapshot: just take the full path
            raise ValueError("header")
        nl = data.index(b"\n", len(HEADER))
        length, _, crc = data[len(HEADER) : nl].partition(b" ")
        end = nl + 1 + int(length)
        raw = data[nl + 1 : end]
        if len(raw) != int(length) or _crc(raw) != int(crc, 16):
            raise ValueError("checksum")
        body = marshal.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("body")
        tail = memoryview(data)[end:]  # not array: importing it imports collections.abc (~2 ms)
        if len(tail) % 8:
            raise ValueError("length")
        packed = tail.cast("q")
        m = len(body["srcs"]) + len(body["outs"])
        if len(packed) != 4 * m:
            raise ValueError("length")
        body["_cols"] = [packed[i * m : (i + 1) * m] for i in range(4)]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, EOFError) as e:
        why = e.strerror if isinstance(e, OSError) else "damaged or of another version"
        print(f"buildtool: warning: no-op snapshot unusable ({why}); discarding it", file=sys.stderr)
        remove_if_not_a_file(_path(state_dir, slot))  # (a directory there: no snapshot could ever be written)
        return None
    try:
        if not _same_request(body["request"], request):
            return None
        names = _same_env(body["env"])
        if names is None:
            return None
        hard = body["hard"]  # (a list: looked into only when something changed)
        regraph = _differs(root, body["files"])  # the graph itself may have changed
        if regraph and not set(hard).isdisjoint(regraph):
            return None  # and the actions too: a tool, the config, a pyrule module
        headers: list[str] = []  # discovered through depfiles: their readers are planned, as a source's
        if regraph and body.get("found"):
            found_set = set(body["found"])
            headers = [p for p in regraph if p in found_set]
            regraph = [p for p in regraph if p not in found_set]
        now = time.time_ns()  # (before the stats that may settle a racily clean row)
        srcs, outs, cols = body["srcs"], body["outs"], body["_cols"]
        settled_dirs: dict[str, list[object]] = {}
        listings = _dirs_differ(root, body["dirs"], outs, now, settled_dirs, hard)
        if listings and not set(hard).isdisjoint(listings):
            return None  # a tool may be found elsewhere now
        regraph += listings  # a file or package appeared or went away: evaluate, and compare graphs
        paths = srcs + outs  # one pass over both (the threads start once)
        found = _differs_cols(root, paths, cols, 0, len(paths))
        racy = body.get("racy")
        settled_rows: dict[int, list[int]] = {}
        verified: dict[str, list[Any]] = {}
        if found and racy:
            found = _verify_racy(root, paths, found, racy, now, settled_rows, verified)
        if any(_odd_source(root, paths[k]) for k in found if k < len(srcs)):
            return None  # a missing source (a pipe, a directory, a link now) is a graph error: the full path says so
        if any(_odd_output(root, paths[k]) for k in found if k >= len(srcs)):
            return None  # a directory, a link or a file on the way where an output goes: the graph
            # check judges it (exit 2, or an earlier output's directory to empty; a BUILD.py in it
            # is a package), as a fresh build would
        if not found and not regraph and not headers and (settled_dirs or settled_rows):
            _settle(state_dir, slot, body, tail, paths, settled_dirs, settled_rows)
        if (found or regraph or headers) and body["record"] != _record_id(state_dir):
            if _last_started(state_dir) != slot:  # (another request's build wrote it since: no crash to tell of)
                if not _record_extends(state_dir, body["record"]):
                    return None  # (compacted, or not as it was: every target checked)
            else:
                print("buildtool: warning: the build record (.buildtool/record) is not the one the last build left "
                      "(cut short by a crash, or copied back); checking every target", file=sys.stderr)
                return None
        changed = [paths[k] for k in found] + headers
        return Verdict(int(body["targets"]), changed + regraph, list(body["files"]), list(body["dirs"]), names, body,
                       bool(regraph), verified, slot)
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError):
        return None  # a body of the right shape but wrong contents: damaged, do the full build


CLOCK_HEADER = b"# buildtool noop-clock v3\n"  # v2: a line with the body's CRC-32 follows; v3: _clock_sum, not CRC-32
CLOCK_MOD = (1 << 30) - 35  # a prime below 2**30: CPython divides by one machine digit
MONITOR_SOCKET = "monitor.sock"  # where a workspace's file monitor listens (monitord.py; client: monitor.py)


def _clock_sum(raw: bytes) -> int:
    """The clock's checksum: its bytes as one little-endian number plus their count, modulo
    the prime ``CLOCK_MOD``.  Any flipped bit, or burst of up to 29, changes it (no power of
    two is a multiple of the prime); other damage, a cut or a lengthened body included, goes
    unseen with odds of about 2**-30 (CRC-32: 2**-32).  Builtins only, where binascii's
    import was ~0.35 ms of a no-op the monitor vouches for (~14 ms in all).  Not for the
    snapshot: on megabytes the division costs more than the import."""
    return (int.from_bytes(raw, "little") + len(raw)) % CLOCK_MOD


def _record_extends(state_dir: str, was: Any) -> bool:
    """Whether the build record is the one the snapshot saw with lines appended since (by
    another request's build): the same file, no shorter, its old part still ending in a
    whole line.  Its newer lines then say what that build made, and a target outside the
    cone of what changed since the snapshot (its files as the snapshot signed them) has
    the same outputs in them: an incremental build may take them from it.  (Edit, `build
    //app`, `build //...` evaluated everything: 3.7 s and 6.8 s at 30,000 targets.)"""
    try:
        ino, size = int(was[0]), int(was[1])
        with open_regular(os.path.join(state_dir, "record"), "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_ino != ino or st.st_size < size or size < 1:
                return False
            f.seek(max(0, size - 4096))
            tail = f.read(size - max(0, size - 4096))
    except (OSError, TypeError, ValueError, IndexError):
        return False
    return tail.endswith(b"\n") and b"\0" not in tail  # (a crash's zeros: not a continuation)


def _last_started(state_dir: str) -> str | None:
    """The slot of the request whose build started last (``invalidate``), None if unknown."""
    try:
        with open_regular(os.path.join(state_dir, LAST_STARTED)) as f:
            return f.read(8).decode("ascii", "replace")
    except OSError:
        return None


def _clock_path(state_dir: str, slot: str) -> str:
    return os.path.join(state_dir, "noop-clock." + slot)


def _snapshot_id(state_dir: str, slot: str) -> list[int] | None:
    """Which snapshot file a clock vouches for (it is only ever replaced by a rename)."""
    try:
        st = os.stat(_path(state_dir, slot))
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _unwatched(rel: str) -> bool:
    """Whether the file monitor cannot see ``rel``: absolute, out of the root, or in the
    tool's or git's state (which it does not watch)."""
    return rel.startswith(("/", "../", ".buildtool/", ".git/")) or rel in ("..", ".git")


def _write_clock(state_dir: str, answer: Any, verdict: Verdict) -> None:
    """Record that the snapshot held, with nothing changed, at the monitor's (token,
    generation) ``answer`` taken before the stat pass; with the request, the environment
    and the stat data of the paths the monitor cannot see, which are still checked."""
    try:
        body = verdict.body
        files = {p: s for p, s in body["files"].items() if _unwatched(p)}
        cols = body["_cols"]
        for k, p in enumerate(body["srcs"] + body["outs"]):
            if _unwatched(p):
                row = [c[k] for c in cols]
                files[p] = None if row[0] == MISSING else row
        clock = {"token": answer.token, "gen": answer.gen, "snapshot": _snapshot_id(state_dir, verdict.slot),
                 "request": body["request"], "env": body["env"], "targets": body["targets"], "files": files,
                 "dirs": {d: s for d, s in body["dirs"].items() if _unwatched(d)},
                 "outs": [p for p in body["outs"] if _unwatched(p)]}
        raw = marshal.dumps(clock, MARSHAL_VERSION)
        from buildtool.atomic import write_atomic

        write_atomic(_clock_path(state_dir, verdict.slot), CLOCK_HEADER + b"%08x\n" % _clock_sum(raw) + raw)
    except Exception:  # a damaged snapshot body or a full disk: only the next no-op's speed suffers
        pass


def _by_monitor(state_dir: str, root: str, request: Mapping[str, object]) -> tuple[Verdict | None, Any]:
    """(a no-op verdict, the monitor's answer) when the workspace's file monitor says that
    nothing changed since the clock the last full no-op check left; (None, answer) when a
    full check is needed (answer None: no monitor runs).  Spec: docs/monitor.md"""
    if not os.path.exists(os.path.join(state_dir, MONITOR_SOCKET)):
        return None, None  # no monitor: not even its client is imported
    from buildtool import monitor

    slot = slot_of(request)
    clock: Any = None
    try:
        with open_regular(_clock_path(state_dir, slot)) as f:
            data = f.read()
        start = len(CLOCK_HEADER) + 9
        if data.startswith(CLOCK_HEADER) and int(data[len(CLOCK_HEADER) : start - 1], 16) == _clock_sum(data[start:]):
            clock = marshal.loads(data[start:])
    except (OSError, EOFError, ValueError, TypeError):
        clock = None
    ok = isinstance(clock, dict)
    answer = monitor.since(state_dir, root, clock.get("token", "-") if ok else "-",
                           clock.get("gen", -1) if ok and isinstance(clock.get("gen"), int) else -1)
    if answer is None or answer.changed or not ok:
        return None, answer
    try:
        if clock["snapshot"] != _snapshot_id(state_dir, slot) or not _same_request(clock["request"], request):
            return None, answer
        names = _same_env(clock["env"])
        if names is None or _differs(root, clock["files"]):
            return None, answer
        if _dirs_differ(root, clock["dirs"], clock["outs"], 0, {}):  # (now=0: nothing settles here)
            return None, answer
        return Verdict(int(clock["targets"]), [], [], [], names, {}, slot=slot), answer
    except Exception:  # the clock is read from disk: any damage means the full check
        return None, answer


def _same_request(stored: Any, request: Mapping[str, object]) -> bool:
    """Whether a snapshot's request is this one (marshal keeps lists lists, as request_of
    makes them); one that holds ``dir`` (an evaluation that opened files by relative paths)
    also needs this process's working directory to be that one."""
    if isinstance(stored, dict) and "dir" in stored:
        rest = {k: v for k, v in stored.items() if k != "dir"}
        try:
            return rest == request and stored["dir"] == os.getcwd()
        except OSError:  # (the working directory was deleted)
            return False
    return stored == request


def request_of(mode: str, patterns: list[str], root: str, cwd_pkg: str, action_env: list[str]) -> dict[str, object]:
    """What a build was asked, as the snapshot keeps it.  With the workspace's absolute
    path: a workspace moved elsewhere keeps every file's stat, but a BUILD.py that builds
    paths from ``__file__`` declares other commands there."""
    from buildtool import __version__

    v = sys.version_info  # (a pyrule's key has the interpreter's version: keys.python_identity)
    return {"mode": mode, "patterns": list(patterns), "root": root, "cwd": cwd_pkg, "action_env": list(action_env),
            "version": __version__, "install": _install_id(),
            "python": f"{sys.implementation.name}-{v.major}.{v.minor}.{v.micro}",
            "fsenc": sys.getfilesystemencoding()}  # (a locale's encoding is in the keys: workspace.FS_ENCODING)


def _install_id() -> list[int]:
    """This install of buildtool: its package directory's inode and mtime.  ``pip install``
    of another commit (the same ``__version__``: macros such as cc_binary may declare other
    commands) writes the directory anew; one stat."""
    try:
        st = os.stat(os.path.dirname(os.path.abspath(__file__)))
    except OSError:
        return []
    return [st.st_ino, st.st_mtime_ns]


def try_noop(start_dir: str, mode: str, patterns: list[str], action_env: list[str]) -> tuple[Verdict, float] | None:
    """(verdict, seconds) if the snapshot vouches for this request; None: do the full build.
    A verdict with changed files holds the workspace lock (``verdict.lock``): the build
    that follows uses it, and whoever gets the verdict releases it."""
    t0 = time.monotonic()
    from buildtool.lock import WorkspaceLock
    from buildtool.workspace import find_workspace

    try:
        ws = find_workspace(start_dir)
    except Exception as e:  # (UserError, OSError; by its module: not errors.py's import on every no-op)
        if isinstance(e, OSError) or type(e).__module__ == "buildtool.errors":
            return None  # the full path reports it
        raise
    request = request_of(mode, patterns, ws.root, ws.cwd_pkg_dir, action_env)
    if not os.path.exists(_path(ws.state_dir, slot_of(request))) or os.path.islink(ws.state_dir):
        return None  # (a link: the full path refuses it)
    lock = WorkspaceLock(ws.state_dir)
    try:
        lock.acquire(False, lambda _msg: None)
    except Exception:
        return None  # busy: the full path waits with a message
    try:
        n, answer = _by_monitor(ws.state_dir, ws.root, request)
        if n is None:
            n = check(ws.state_dir, ws.root, request)
            if answer is not None and n is not None and not n.changed:
                _write_clock(ws.state_dir, answer, n)
    except BaseException:
        lock.release()
        raise
    if n is not None and n.changed:
        n.lock = lock  # the incremental build goes on under this lock: nothing can change the verdict
    else:
        lock.release()
    return None if n is None else (n, time.monotonic() - t0)
