"""Discovered inputs: two-level keys and cache manifests for targets with a ``depfile``.

A compile's headers are known only after it ran (from its depfile), so such a target has
two keys, as ccache's direct mode does:

- the **primary key** P: the ordinary action key over the *declared* inputs (its
  description carries ``extra.depfile``);
- the **final key** F = ``key_of(final_description(P's description, discovered))``, where
  ``discovered`` maps each workspace file the depfile listed (minus declared inputs) to its
  digest.  The final description is P's description with those files merged into
  ``inputs`` and their sorted paths under ``discovered``.

This workspace's build record stores F and the final description, so the discovered paths
are read back from the record (never re-parsed from the depfile): the target is up to date
when F, recomputed from the current digests of the recorded paths, matches.  The shared
cache stores the action entry under F and a **manifest** under P that lists the path sets
seen for P (most recent first): a lookup without workspace state hashes each listed set and
looks up the F it gives, so a changed header never restores a stale object, and a fresh
checkout restores everything.  Spec: docs/formats.md#manifests
"""

from __future__ import annotations

import json
import os
import stat
import time

from buildtool import keys
from buildtool.atomic import remove_path
from buildtool.cache import BLOB_OPEN, NOT_A_FILE, ActionEntry, Cache, safe_rel_path
from buildtool.depfile import DepfileError, WorkspacePaths, parse_file
from buildtool.digest import last_change
from buildtool.record import desc_of

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    DigestOf = Callable[[str], str | None]
    StatDigestOf = Callable[[str, os.stat_result], str | None]  # (the digest of a file whose stat was just read)

MANIFEST_VERSION = 1
MAX_VARIANTS = 16
MISSING = "missing"  # digest of a recorded discovered path that no longer exists
LATE_WINDOW_NS = 20_000_000  # a discovered file changed this close to the start counts as changed during the run


def final_description(desc: Mapping[str, Any], discovered: Mapping[str, str]) -> dict[str, Any]:
    """P's description with the discovered files merged into ``inputs``."""
    out = dict(desc)
    inputs = dict(desc["inputs"])
    for p, d in discovered.items():
        inputs.setdefault(p, d)
    out["inputs"] = inputs
    out["discovered"] = sorted(p for p in discovered if p not in desc["inputs"])
    return out


def primary_description(final: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of ``final_description``."""
    out = dict(final)
    found = set(out.pop("discovered", ()))  # (a set: 200 headers were 40,000 comparisons a target)
    out["inputs"] = {p: d for p, d in final["inputs"].items() if p not in found}
    return out


def recorded_paths(entry: Mapping[str, Any] | None) -> list[str] | None:
    """The discovered paths of a build-record entry (None when it has none); of the
    record's own entry of a label, ``BuildRecord.discovered`` says it once a build."""
    if entry is None:
        return None
    found = (desc_of(entry) or {}).get("discovered")
    if not isinstance(found, list) or not all(isinstance(p, str) for p in found):
        return None
    return found


def final_key(desc: Mapping[str, Any], paths: list[str], digest_of: DigestOf) -> tuple[str, dict[str, Any]]:
    """F and its description for these discovered paths as they are on disk now (a missing
    file gets the digest ``missing``, so the key cannot match a recorded one)."""
    discovered = {p: digest_of(p) or MISSING for p in paths if p not in desc["inputs"]}
    fdesc = final_description(desc, discovered)
    return keys.key_of(fdesc), fdesc


def _read_regular(path: str) -> bytes | None:
    """The content of the regular file at ``path``; None for anything else (a directory, a
    named pipe, a symbolic link: opened without waiting or following)."""
    try:
        fd = os.open(path, BLOB_OPEN)
    except OSError as e:
        if e.errno in NOT_A_FILE:
            return None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class Manifests:
    """Manifests under ``<cache>/v2/mf/<P[:2]>/<P>``: the discovered path sets seen for P."""

    def __init__(self, cache: Cache, warn: Callable[[str], None]) -> None:
        self.cache = cache
        self.dir = os.path.join(cache.dir, "mf")
        self._warn = warn

    def _path(self, primary: str) -> str:
        return os.path.join(self.dir, primary[:2], primary)

    def read(self, primary: str) -> list[list[str]]:
        path = self._path(primary)
        try:
            raw = _read_regular(path)  # (a named pipe put there: not waited for)
        except FileNotFoundError:
            return []
        except OSError as e:
            self._warn(f"cache manifest {primary[:12]} unreadable ({e.strerror}); treating it as a miss")
            return []
        try:
            if raw is None:
                raise ValueError("not a file")
            obj = json.loads(raw)
            if not isinstance(obj, dict) or obj.get("v") != MANIFEST_VERSION:
                raise ValueError("version")
            variants = obj["variants"]
            if not isinstance(variants, list):
                raise ValueError("variants")
            for v in variants:
                if not isinstance(v, list) or not all(isinstance(p, str) for p in v):
                    raise ValueError("variant")
                bad = next((p for p in v if p not in _SAFE and not _safe(p)), None)
                if bad is not None:
                    self._warn(
                        f"cache manifest {primary[:12]} names a path outside the workspace ({bad!r}); ignoring it"
                    )
                    return []
        except (ValueError, KeyError, TypeError, RecursionError):
            self._warn(f"cache manifest {primary[:12]} is corrupt or of another version; treating it as a miss")
            remove_path(path)
            return []
        return variants

    def add(self, primary: str, paths: list[str]) -> None:
        """Put ``paths`` first (read-modify-rename: a concurrent writer may drop a variant,
        which only costs a later miss)."""
        if not self.cache.writable:
            return
        variants = [v for v in self.read(primary) if v != paths]
        variants.insert(0, paths)
        data = json.dumps({"v": MANIFEST_VERSION, "variants": variants[:MAX_VARIANTS]}, separators=(",", ":"))
        dest = self._path(primary)
        tmp = os.path.join(self.cache.dir, "tmp", f"mf.{os.getpid()}.{time.monotonic_ns()}")
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(data)
            os.replace(tmp, dest)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self.cache.write_failed(e, dest)  # (a full disk: nothing more is stored, one warning in all)

    def lookup(
        self, primary: str, desc: Mapping[str, Any], digest_of: DigestOf
    ) -> tuple[ActionEntry, str, dict[str, Any]] | None:
        """(entry, F, final description) of the listed path set whose F, with its files as
        they are now (a missing one as ``missing``), is in the cache, if exactly one is.
        Two that both match the tree (x.h found in inc2/ once, in inc1/ after a header
        shadowing it appeared) cannot both be what the compiler would read now: that is a
        miss, and the compiler decides."""
        found: tuple[ActionEntry, str, dict[str, Any]] | None = None
        for paths in self.read(primary):
            # (a path missing now enters the key as "missing": it matches an entry stored
            # with that file missing too, as a depfile may list one, and no other)
            key, fdesc = final_key(desc, paths, digest_of)
            if found is not None and key == found[1]:
                continue
            hit = self.cache.get_action(key)
            if hit is not None:
                if found is not None:
                    return None
                found = (hit, key, fdesc)
        return found


_SAFE: set[str] = set()  # the manifests' paths found safe: 2,000 compiles' manifests name the same headers


def _safe(p: str) -> bool:
    if not safe_rel_path(p):
        return False
    if len(_SAFE) < 1_000_000:
        _SAFE.add(p)
    return True


def discover(
    depfile_full: str, root: str, pkg: str, exclude: set[str], digest_of: StatDigestOf, started_ns: int,
    settled: Callable[[str], bool], paths: WorkspacePaths | None = None,
) -> tuple[dict[str, str], str | None] | str:
    """After a successful run: ({path: digest} of the discovered workspace files, a path that
    changed while the command ran or None), or an error message.  A file written just
    before the start is no race when ``settled`` says a finished dependency wrote it.
    ``digest_of`` gets each file's stat as read here, after the run (one stat a header);
    ``paths``: the build's memo of which prerequisites are workspace files."""
    try:
        dep = parse_file(depfile_full)
    except FileNotFoundError:
        return f"the command did not write its depfile {os.path.relpath(depfile_full, root)}"
    except OSError as e:
        return f"cannot read depfile {os.path.relpath(depfile_full, root)}: {e.strerror}"
    except DepfileError as e:
        return f"depfile {os.path.relpath(depfile_full, root)} is malformed: {e}"
    found: dict[str, str] = {}
    late = None
    now = time.time_ns()
    for p in (paths or WorkspacePaths(root)).inputs(dep.prerequisites, pkg):
        if p in exclude:
            continue
        try:
            st = os.stat(os.path.join(root, p))
        except OSError:
            # Listed but not there (a temporary file gone, `gcc -MG`'s header to be made):
            # tracked as missing, so that a file appearing there later changes the key, as
            # it changes what the command would read.
            found[p] = MISSING
            continue
        d = digest_of(p, st)
        if d is None:
            continue
        if late is None and last_change(st.st_mtime_ns, st.st_ctime_ns, now) >= started_ns - LATE_WINDOW_NS \
                and not settled(p):
            late = p
        found[p] = d
    return found, late
