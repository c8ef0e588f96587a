"""Remote cache layer: the runner's second cache level, behind the local cache.

``lookup`` (after a local miss) finds the target's REAPI Action in the remote action cache,
downloads every blob it names, verifies each against its digest, checks that the entry names
exactly the target's declared outputs (paths from a cache entry are never trusted), and puts
the blobs and the entry into the local cache, from where the runner restores them.
``upload`` (after a successful local run) sends the missing blobs (FindMissingBlobs first),
then the ActionResult (a blob whose download did not verify counts as missing: its good
content replaces the damaged one).  A circuit breaker turns the first connection failure or
timeout into one warning and a build that carries on with the local cache only.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from buildtool.cache import ActionEntry, Cache, CachedOutput
from buildtool.digest import hash_bytes, hash_file, is_remote
from buildtool.remote import action as ra
from buildtool.remote.action import Digest, RemoteAction, TargetView
from buildtool.remote.options import Endpoint, RemoteOptions
from buildtool.remote.store import (
    BadBlob,
    Connection,
    MissingBlob,
    Refused,
    RemoteError,
    Source,
    Store,
    Unavailable,
    checked_digest,
    declared_files,
    marker_digest,
    open_store,
)


class RemoteStats:
    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.uploads = 0
        self.bytes_down = 0
        self.bytes_up = 0
        self.errors = 0
        # Lookups without an answer: the remote cache was off (unavailable) from then on, or
        # went off during the call.  hits + misses + off = the lookups of the build.
        self.off = 0

    def line(self, name: str) -> str:
        return (f"remote cache {name}: {self.hits} hits, {self.misses} misses, {self.uploads} uploaded, "
                f"{_size(self.bytes_down)} down, {_size(self.bytes_up)} up"
                + (f", {self.errors} errors" if self.errors else "")
                + (f", {self.off} unanswered (off for the rest of the build)" if self.off else ""))


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


# Unusable entries in a row (garbage, an HTML page answering every URL, damaged blobs) after
# which the remote cache is left for the rest of the build: one bad entry is that entry's
# trouble, said per target; a run of them is the server's, said once.
BAD_IN_A_ROW = 5
FAILED_UPLOADS_IN_A_ROW = 3  # uploads failing in a row (not refused outright) that stop uploading for the build


class RemoteCache:
    """Thread-safe: the runner's workers call it in parallel."""

    def __init__(
        self, ep: Endpoint, opt: RemoteOptions, root: str, cache: Cache, tmp_dir: str, warn: Callable[[str], None]
    ) -> None:
        self.ep = ep
        self.opt = opt
        self.root = root
        self.cache = cache
        self.tmp_dir = tmp_dir
        self.warn = warn
        self.stats = RemoteStats()
        self._lock = threading.Lock()
        self._conn = Connection(lambda: open_store(self.ep, self.opt))
        self._broken: str | None = None
        self._no_uploads: str | None = None  # why this build uploads no more (writes refused)
        self._remote_digest: dict[str, Digest] = {}  # local BLAKE3 digest -> remote digest
        self._damaged: set[Digest] = set()  # blobs the server returned damaged: uploaded again
        self._actions: dict[str, RemoteAction] = {}  # local key -> remote action
        self._bad_in_a_row = 0  # entries found unusable since the last usable answer (BAD_IN_A_ROW)
        self._said_evicted = False  # an entry whose blob the server no longer has was warned about
        self._failed_uploads = 0  # uploads failed since the last that went through (FAILED_UPLOADS_IN_A_ROW)
        self._unnamed: set[str] = set()  # targets no REAPI action can name (ra.NotRemotable), warned of

    # -- connection and breaker ------------------------------------------------------------
    def _get_store(self) -> Store | None:
        """The connected store, or None once the remote is off (store.Connection: the first
        caller connects, the others wait; ``abort`` can break the connect off)."""
        with self._lock:
            if self._broken is not None:
                return None
        try:
            store = self._conn.get()
        except RemoteError as e:
            self._trip(str(e))
            return None
        except ValueError:  # grpc's "Cannot invoke RPC on closed channel!": aborted meanwhile
            if self._broken is None:
                raise
            return None
        with self._lock:
            return store if self._broken is None else None

    def _trip(self, why: str) -> None:
        with self._lock:
            tripped = self._trip_locked(why)
        if tripped:
            # The calls still in flight go too: a download dripping a byte a second ran on to
            # its own deadline (3 s and 1 s per MB: two minutes for 120 MB) and held the build.
            self._conn.abort()

    def _trip_locked(self, why: str) -> bool:
        """Off for the rest of the build (True: by this call; the caller then aborts what is in
        flight, outside the lock)."""
        if self._broken is None:
            self._broken = why
            self.stats.errors += 1
            self.warn(f"remote cache unavailable ({why}); continuing with the local cache only for this build")
            return True
        return False

    def _stop_uploads(self, why: str) -> None:
        """The server refuses writes: no more uploads this build (one warning); lookups go on."""
        with self._lock:
            if self._no_uploads is not None:
                return
            self._no_uploads = why
            self.stats.errors += 1
        self.warn(f"the remote cache refused an upload ({why}); not uploading for the rest of this build "
                  "(lookups continue)")

    @property
    def broken(self) -> bool:
        return self._broken is not None

    # -- the remote Action of a target -----------------------------------------------------
    def _file_digest(self, store: Store, rel: str, local: str) -> Digest:
        with self._lock:
            d = self._remote_digest.get(local)
        if d is not None:
            return d
        if is_remote(local):  # left in the remote executor's CAS (--remote-download): no local file
            return marker_digest(local, store.digest_fn, rel)
        full = os.path.join(self.root, rel)
        size = os.path.getsize(full)
        if store.digest_fn == "blake3":
            d = Digest(local, size)
        else:  # (the bytes hashed must be those the key has: ChangedSinceKeyed otherwise, a miss)
            d = Digest(ra.file_hash(full, store.digest_fn, local), size)
        with self._lock:
            self._remote_digest[local] = d
        return d

    def remote_action(self, store: Store, t: TargetView, key: str, desc: dict[str, Any]) -> RemoteAction:
        with self._lock:
            got = self._actions.get(key)
        if got is None:
            got = ra.build(self.root, t, desc, store.digest_fn, lambda rel, loc: self._file_digest(store, rel, loc))
            with self._lock:
                self._actions[key] = got
        return got

    def _not_remotable(self, label: str, e: ra.NotRemotable) -> None:
        """One warning per target that cannot be a remote action (its lookup and its
        upload both come here)."""
        with self._lock:
            if label in self._unnamed:
                return
            self._unnamed.add(label)
        self.warn(f"{label}: not in the remote cache: {e}; cached locally only")

    # -- lookup --------------------------------------------------------------------------------
    def lookup(self, t: TargetView, key: str, desc: dict[str, Any], label: str) -> ActionEntry | None:
        """The target's entry, fetched into the local cache; None on a miss (or any trouble)."""
        store = self._get_store()
        if store is None or not self.cache.writable:
            if store is None:
                with self._lock:
                    self.stats.off += 1
            return None
        try:
            act = self.remote_action(store, t, key, desc)
            res = store.get_action_result(act.digest)
            if res is None:
                self._count_miss()
                return None
            entry = self._fetch(store, t, res, label)
        except ra.NotRemotable as e:  # (before any request: the server has nothing to do with it)
            self._not_remotable(label, e)
            self._count_miss()
            return None
        except Unavailable as e:
            self._trip(str(e))
            with self._lock:
                self.stats.off += 1
            return None
        except ValueError:  # grpc's "Cannot invoke RPC on closed channel!": aborted (Ctrl-C) meanwhile
            if self._broken is None:
                raise
            with self._lock:
                self.stats.off += 1
            return None
        except (RemoteError, OSError) as e:
            if self._broken is not None:  # (a call the breaker broke off: gRPC's CANCELLED, one line each)
                with self._lock:
                    self.stats.off += 1
                return None
            evicted = isinstance(e, MissingBlob)  # (a cache that evicts blobs before entries: a plain miss)
            with self._lock:
                said, self._said_evicted = self._said_evicted, self._said_evicted or evicted
            if not (evicted and said):  # (30 targets, 30 such lines)
                more = "; the server evicted it: later such entries are misses without a word" if evicted else ""
                at = "" if str(self.ep) in str(e) else f" (from {self.ep})"  # (a blob that does not verify named none)
                self.warn(f"{label}: remote cache entry not used: {e}{at}{more}")
            tripped = False
            with self._lock:
                self.stats.misses += 1
                self.stats.errors += not evicted
                if isinstance(e, BadBlob):
                    self._damaged.add(e.digest)  # sent again by this build's upload
                # (a blob missing, local trouble such as a full disk: not the server's answers)
                self._bad_in_a_row += not isinstance(e, (MissingBlob, OSError))
                if self._bad_in_a_row >= BAD_IN_A_ROW:  # one bad entry is the entry's; so many, the server's
                    tripped = self._trip_locked(
                        f"{self._bad_in_a_row} entries in a row were unusable, the last: {e}; "
                        "is this URL a cache of the Remote Execution API or Bazel's HTTP protocol?")
            if tripped:
                self._conn.abort()
            return None
        if entry is None:
            self._count_miss()
            return None
        self.cache.put_action(key, entry)
        with self._lock:
            self.stats.hits += 1
            self._bad_in_a_row = 0
        return entry

    def _count_miss(self) -> None:
        with self._lock:
            self.stats.misses += 1
            self._bad_in_a_row = 0  # (a proper "not here" from the server)

    def _fetch(self, store: Store, t: TargetView, res: Any, label: str) -> ActionEntry | None:
        if res.exit_code != 0:  # (Bazel's clients never write one; a cache that holds one is odd: said)
            raise RemoteError(f"the entry records a failed run (exit code {res.exit_code})")
        if not res.HasField("execution_metadata"):  # (zero bytes parse as a result with exit code 0 and no
            # outputs: for a test, a pass.  Every entry buildtool or an executor writes says who ran it.)
            raise RemoteError("the entry is empty or has no execution_metadata, which every real result has")
        files = declared_files(t, res, "the entry")
        want = set(t.outs)
        if set(files) != want:
            missing = sorted(want - set(files))
            raise RemoteError(f"the entry lacks declared outputs {', '.join(missing)}")
        # (checked: a space in a digest went into a URL and tripped the breaker)
        need: list[Digest] = [checked_digest(f.digest, "the entry") for f in files.values()]
        for d in (res.stdout_digest, res.stderr_digest):
            if d.hash:
                need.append(checked_digest(d, "the entry"))
        os.makedirs(self.tmp_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix="remote-", dir=self.tmp_dir)
        try:
            got = store.download(need, tmp)
            with self._lock:
                self.stats.bytes_down += sum(d.size for d in set(need))
            outputs = []
            for p in sorted(files):
                f = files[p]
                path = got[Digest.of(f.digest)]
                local = hash_file(path)
                if not self.cache.put_file(path, local):
                    return None  # (said) restored from the local cache only: a miss, never an entry without it
                with self._lock:
                    self._remote_digest[local] = Digest.of(f.digest)
                outputs.append(CachedOutput(p, local, 0o755 if f.is_executable else 0o644))
            streams: list[str | None] = []
            for d, raw in ((res.stdout_digest, res.stdout_raw), (res.stderr_digest, res.stderr_raw)):
                data = raw
                if d.hash:
                    with open(got[Digest.of(d)], "rb") as fh:
                        data = fh.read()
                if data:
                    local = hash_bytes(data)
                    if not self.cache.put_bytes(data, local):
                        return None
                    streams.append(local)
                else:
                    streams.append(None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        md = res.execution_metadata
        duration = 0.0
        if md.HasField("execution_start_timestamp") and md.HasField("execution_completed_timestamp"):
            duration = max(0.0, (md.execution_completed_timestamp.ToNanoseconds()
                                 - md.execution_start_timestamp.ToNanoseconds()) / 1e9)
        return ActionEntry(tuple(outputs), duration, streams[0], streams[1])

    # -- upload --------------------------------------------------------------------------------
    def upload(self, t: TargetView, key: str, desc: dict[str, Any], outputs: list[list[Any]], stdout: bytes,
               stderr: bytes, duration: float, label: str) -> None:
        if not self.opt.upload or self._no_uploads is not None:
            return
        store = self._get_store()
        if store is None:
            return
        if getattr(store, "update_enabled", True) is False:
            self._stop_uploads("its capabilities say it takes no action results from clients")
            return
        try:
            act = self.remote_action(store, t, key, desc)
            result, blobs = self.action_result(store, t, act, outputs, stdout, stderr, duration)
            missing = store.find_missing(blobs)
            with self._lock:  # present there but damaged (a download did not verify): replace it
                missing |= self._damaged.intersection(blobs)
            sent = store.upload({d: blobs[d] for d in missing}) if missing else 0
            store.update_action_result(act.digest, result)
            sent += result.ByteSize()  # (the action-cache entry is sent too)
        except ra.NotRemotable as e:
            self._not_remotable(label, e)
            return
        except Unavailable as e:
            self._trip(str(e))
            return
        except Refused as e:
            self._stop_uploads(str(e))
            return
        except ValueError:  # grpc's "Cannot invoke RPC on closed channel!": aborted (Ctrl-C) meanwhile
            if self._broken is None:
                raise
            return
        except (RemoteError, OSError) as e:
            if self._broken is not None:  # (broken off by the breaker: said once already)
                return
            with self._lock:
                self.stats.errors += 1
                self._failed_uploads += 1
                n = self._failed_uploads
            if n == 1:
                self.warn(f"{label}: upload to the remote cache failed: {e}")
            elif n >= FAILED_UPLOADS_IN_A_ROW:  # (an HTTP 409 or 413 for every one: 30 targets, 30 lines)
                self._stop_uploads(f"{n} uploads in a row failed, the last: {e}")
            return
        with self._lock:
            self.stats.uploads += 1
            self.stats.bytes_up += sent
            self._failed_uploads = 0

    def action_result(
        self, store: Store, t: TargetView, act: RemoteAction, outputs: list[list[Any]], stdout: bytes,
        stderr: bytes, duration: float,
    ) -> tuple[Any, dict[Digest, Source]]:
        from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2

        h = ra.hasher(store.digest_fn)
        result = re_pb2.ActionResult(exit_code=0)
        cmd_digest = Digest.of(act.action.command_digest)
        blobs: dict[Digest, Source] = {act.digest: act.blobs[act.digest], cmd_digest: act.blobs[cmd_digest]}
        for path, local, mode in sorted(outputs):
            d = self._file_digest(store, path, local)
            rel = posixpath.relpath(path, t.pkg) if t.pkg else path
            result.output_files.add(path=rel, digest=d.proto(), is_executable=bool(mode & 0o100))
            blobs[d] = os.path.join(self.root, path)
        if stdout:
            d = Digest(h(stdout), len(stdout))
            result.stdout_digest.CopyFrom(d.proto())
            blobs[d] = stdout
        if stderr:
            d = Digest(h(stderr), len(stderr))
            result.stderr_digest.CopyFrom(d.proto())
            blobs[d] = stderr
        md = result.execution_metadata
        md.worker = f"buildtool@{socket.gethostname()}"
        md.execution_completed_timestamp.GetCurrentTime()
        md.execution_start_timestamp.FromNanoseconds(md.execution_completed_timestamp.ToNanoseconds()
                                                     - int(duration * 1e9))
        return result, blobs

    def summary(self) -> str | None:
        if not self._conn.started:
            return None
        return self.stats.line(str(self.ep))

    def totals(self) -> dict[str, object]:
        """This build's counts, for the ``remote`` line of ``--events``."""
        s = self.stats
        return {"role": "cache", "endpoint": str(self.ep), "hits": s.hits, "misses": s.misses,
                "uploads": s.uploads, "bytes_down": s.bytes_down, "bytes_up": s.bytes_up, "errors": s.errors,
                "unanswered": s.off, "disabled": self._broken}

    def abort(self) -> None:
        """The build is interrupted: calls in flight fail at once, and no new one starts."""
        with self._lock:
            if self._broken is None:
                self._broken = "the build was interrupted"  # (no warning: Ctrl-C says enough)
        self._conn.abort()

    def close(self) -> None:
        store, self._conn.store = self._conn.store, None
        if store is not None:
            store.close()
