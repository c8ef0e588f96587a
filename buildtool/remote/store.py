"""Remote store: the two wire protocols of a remote cache behind one small interface —
REAPI v2 over gRPC (ActionCache, CAS, ByteStream, Capabilities) and Bazel's HTTP cache
protocol (``/ac/<hash>``, ``/cas/<hash>``).

Errors: ``Unavailable`` (connection refused, deadline exceeded, 5xx: the caller's circuit
breaker stops talking to the server) and ``RemoteError`` (anything else: a miss).  Downloads
are streamed to a file and verified against their digest; uploads of big blobs are streamed
from disk in 1 MiB chunks; batch requests are capped at ``MAX_BATCH_BYTES`` serialised.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from buildtool.remote.action import Digest, file_hash
from buildtool.remote.options import Endpoint, RemoteOptions

CHUNK = 1 << 20  # ByteStream chunk size
MAX_BATCH_BYTES = 3 << 20  # cap on a serialised batch request (BuildGrid refuses ~4 MiB)
BATCH_OVERHEAD = 200  # per-blob framing allowance in a batch (digest + tags)
FIND_MISSING_CHUNK = 2000  # digests per FindMissingBlobs request


class RemoteError(Exception):
    """The server answered, but not usefully (treated as a miss)."""


class BadBlob(RemoteError):
    """A downloaded blob is not what its digest names: the server holds damaged content."""

    def __init__(self, msg: str, digest: Digest) -> None:
        super().__init__(msg)
        self.digest = digest


class MissingBlob(RemoteError):
    """An entry's blob is not on the server (evicted before the entry, say): that entry's
    miss, never a sign that the server is no cache."""


class Unavailable(RemoteError):
    """The server is unreachable, too slow or failing: stop using it for this build.
    ``transient``: unreachable or too slow (a restart, a dropped connection), not a refusal
    (UNAUTHENTICATED, PERMISSION_DENIED...) that asking again would meet too."""

    transient = True


class Refused(RemoteError):
    """The server refuses this client's writes (a read-only cache): stop uploading for this
    build, keep reading."""


def checked_digest(p: Any, whose: str = "the result") -> Digest:
    """The Digest of a digest message a server sent, if well formed (64 lowercase hex digits
    and a size), before it goes into a URL, a resource name or the build record; else
    RemoteError: a miss (or a local run) for that target, never an outage."""
    d = Digest.of(p)
    if not d.well_formed():
        raise RemoteError(f"{whose} names a malformed digest {d.hash[:80]!r} (size {d.size})")
    return d


def marker_digest(marker: str, digest_fn: str, path: str) -> Digest:
    """The Digest of ``path``, an output left in a remote CAS (digest.REMOTE_MARK), on a
    server that hashes with ``digest_fn``; RemoteError if the marker cannot name it there."""
    try:
        fn, d = Digest.of_marker(marker)
    except ValueError as e:
        raise RemoteError(f"{path}: {e}") from None
    if fn != digest_fn:
        raise RemoteError(f"{path} was kept remote as a {fn} digest but the server uses {digest_fn}")
    return d


def _hash_obj(digest_fn: str) -> Any:
    if digest_fn == "blake3":
        import blake3

        return blake3.blake3()
    return hashlib.sha256()


def declared_files(t: Any, r: Any, what: str) -> dict[str, Any]:
    """Workspace path -> OutputFile of the ActionResult ``r``, each a declared output of
    ``t`` (its ``pkg`` and ``outs``) named once: a result names paths that are never
    trusted (a cache entry's, an execution's alike).  RemoteError, naming ``what`` (``the
    entry``), for a path twice or not declared, or output directories or symlinks; the
    caller says which declared outputs it lacks."""
    import posixpath

    if len(r.output_directories) or len(r.output_symlinks) or len(r.output_file_symlinks) \
            or len(r.output_directory_symlinks):
        raise RemoteError(f"{what} has output directories or symlinks; this target declares only files")
    want = set(t.outs)
    files: dict[str, Any] = {}
    for f in r.output_files:
        p = posixpath.normpath(posixpath.join(t.pkg, f.path)) if t.pkg else posixpath.normpath(f.path)
        if p in files:  # (of two different contents, the last would win)
            raise RemoteError(f"{what} names output {f.path!r} twice")
        if p not in want or f.path.startswith("/") or ".." in f.path.split("/"):
            raise RemoteError(f"{what} names output {f.path!r}, which the target does not declare")
        files[p] = f
    return files


class _VerifyingWriter:
    """Writes a download to ``dest`` while hashing it; ``finish`` checks the digest.  With
    ``want``, more bytes than its size is BadBlob at once (the file removed): a server
    that streams without end must not fill the disk."""

    def __init__(self, dest: str, digest_fn: str, want: Digest | None = None) -> None:
        self.dest = dest
        self.f = open(dest, "wb")  # noqa: SIM115 - closed in finish/abort
        self.h = _hash_obj(digest_fn)
        self.n = 0
        self.want = want

    def write(self, data: bytes) -> None:
        if self.want is not None and self.n + len(data) > self.want.size:
            self.abort()
            msg = f"blob {self.want.hash[:12]}/{self.want.size} does not verify: received more bytes than that"
            raise BadBlob(msg, self.want)
        self.f.write(data)
        self.h.update(data)
        self.n += len(data)

    def finish(self, want: Digest) -> None:
        self.f.close()
        got = self.h.hexdigest()
        if got != want.hash or self.n != want.size:
            os.unlink(self.dest)
            msg = f"blob {want.hash[:12]}/{want.size} does not verify: received {got[:12]}/{self.n}"
            raise BadBlob(msg, want)

    def abort(self) -> None:
        self.f.close()
        try:
            os.unlink(self.dest)
        except OSError:
            pass


Source = bytes | str  # blob content, or the path of a file holding it


class Store:
    """Interface of a remote cache protocol."""

    digest_fn = "sha256"
    name = ""

    def negotiate(self) -> None:
        """Connect and learn what the server supports (gRPC's GetCapabilities); HTTP: nothing."""
        return

    def get_action_result(self, action: Digest) -> Any:  # ActionResult or None
        raise NotImplementedError

    def update_action_result(self, action: Digest, result: Any) -> None:
        raise NotImplementedError

    def find_missing(self, digests: Iterable[Digest]) -> set[Digest]:
        raise NotImplementedError

    def upload(self, blobs: dict[Digest, Source]) -> int:
        """Upload these blobs (already known to be missing); returns bytes sent."""
        raise NotImplementedError

    def download(self, digests: list[Digest], dest_dir: str) -> dict[Digest, str]:
        """Download and verify blobs into files under dest_dir; RemoteError if any fails."""
        raise NotImplementedError

    def close(self) -> None:
        return

    def abort(self) -> None:
        """Break off every call in flight, from another thread (Ctrl-C): they fail at once."""
        return


class Connection:
    """A store made and connected once, by the first caller of ``get``, outside the
    caller's locks: ``abort`` (Ctrl-C, another thread) must be able to close the channel
    of a server that accepts and never answers (the first call waits the whole timeout).
    Later callers wait for the first and get its store, or its error."""

    def __init__(self, make: Callable[[], Store]) -> None:
        import threading

        self._make = make
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.started = False  # somebody asked for the store
        self.store: Store | None = None  # made (maybe still negotiating)
        self._error: BaseException | None = None
        self._aborted = False

    def get(self) -> Store:
        """The connected store; raises what making or negotiating raised (RemoteError;
        ValueError when grpc found its channel closed by ``abort`` meanwhile)."""
        with self._lock:
            first, self.started = not self.started, True
        if first:
            try:
                store = self._make()
                with self._lock:
                    self.store, aborted = store, self._aborted  # (abort closes it from now on)
                if aborted:
                    raise Unavailable("the build was interrupted")
                store.negotiate()
            except BaseException as e:
                self._error = e
                raise
            finally:
                self._done.set()
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self.store is not None
        return self.store

    def abort(self, connecting_only: bool = False) -> None:
        """Break off calls in flight by closing the store's channel (``connecting_only``:
        only while it still negotiates); a ``get`` that has not made it yet fails."""
        with self._lock:
            self._aborted = True
            store = self.store
        if store is not None and not (connecting_only and self._done.is_set()):
            store.abort()


class _Deadlines:
    """The HTTP exchanges in flight (a request waiting for its response's headers, a body
    being read), each until its deadline: one thread shuts down the socket of one past it
    (a server sending a byte at a time is never timed out by the socket, whose timeout is
    per read), or of every one when the build is interrupted."""

    def __init__(self) -> None:
        import threading

        self._cv = threading.Condition()
        self._live: dict[int, tuple[Any, float]] = {}  # token -> (connection, deadline)
        self._expired: set[int] = set()
        self._next = 0
        self._thread: Any = None
        self.aborted = False

    def add(self, conn: Any, seconds: float) -> int:
        import threading
        import time

        with self._cv:
            self._next += 1
            self._live[self._next] = (conn, time.monotonic() + seconds)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="buildtool-http-deadlines", daemon=True)
                self._thread.start()
            self._cv.notify()
            return self._next

    def done(self, token: int) -> bool:
        """That exchange is over (or failed); True if its deadline or an abort had cut it off."""
        with self._cv:
            self._live.pop(token, None)
            if token in self._expired:
                self._expired.discard(token)
                return True
            return False

    def abort_all(self) -> None:
        with self._cv:
            self.aborted = True
            doomed = [c for c, _ in self._live.values()]
            self._expired.update(self._live)
            self._live.clear()
        for c in doomed:
            _shut(c)

    def _run(self) -> None:
        import time

        while True:
            with self._cv:
                while not self._live:
                    self._cv.wait()
                now = time.monotonic()
                due = [k for k, (_, d) in self._live.items() if d <= now]
                doomed = [self._live.pop(k)[0] for k in due]
                self._expired.update(due)
                if not doomed:
                    self._cv.wait(timeout=max(0.01, min(d for _, d in self._live.values()) - now))
            for c in doomed:
                _shut(c)


def _shut(conn: Any) -> None:
    import socket

    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def open_store(ep: Endpoint, opt: RemoteOptions) -> Store:
    """The store for ``ep``, not yet connected: call ``negotiate`` (a gRPC server's
    capabilities) outside any lock, so that ``abort`` can break it off."""
    if ep.is_grpc:
        from buildtool.remote.grpc_store import GrpcStore

        return GrpcStore(ep, opt, negotiate=False)
    return HttpStore(ep, opt)


def read_chunks(src: Source) -> Iterator[bytes]:
    if isinstance(src, bytes):
        for i in range(0, max(len(src), 1), CHUNK):
            yield src[i : i + CHUNK]
        return
    with open(src, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def verify_source(src: Source, d: Digest, digest_fn: str) -> bool:
    """An upload source still has the content it was hashed as (a file may have changed)."""
    if isinstance(src, bytes):
        return len(src) == d.size
    try:
        return os.path.getsize(src) == d.size and file_hash(src, digest_fn) == d.hash
    except OSError:
        return False


class HttpStore(Store):
    """Bazel's HTTP cache protocol: GET/HEAD/PUT ``[prefix/]ac/<hash>`` and ``cas/<hash>``
    (SHA-256 only: the protocol cannot negotiate).  One keep-alive connection per thread."""

    def __init__(self, ep: Endpoint, opt: RemoteOptions) -> None:
        import http.client  # noqa: F401 - here, once: two lanes importing it at once for their first request
        import threading  # could see the module before `http.client` was bound on `http` (CPython's import
        # race): "AttributeError: module 'http' has no attribute 'client'", an internal error of one target

        self.ep = ep
        self.opt = opt
        self.name = str(ep)
        self.base = "/" + (ep.prefix + "/" if ep.prefix else "")
        if opt.instance:
            self.base += opt.instance.strip("/") + "/"
        self._local = threading.local()
        self._deadlines = _Deadlines()

    def abort(self) -> None:
        self._deadlines.abort_all()

    def _conn(self) -> Any:
        import http.client

        c = getattr(self._local, "conn", None)
        if c is None:
            cls = http.client.HTTPSConnection if self.ep.scheme == "https" else http.client.HTTPConnection
            c = cls(self.ep.host, self.ep.port, timeout=self.opt.timeout)
            self._local.conn = c
        return c

    def _request(self, method: str, path: str, body: Any = None, size: int | None = None) -> Any:
        """One request; returns the response (body unread).  Retries once on a stale
        keep-alive connection."""
        import http.client

        headers = self.ep.headers(self.opt.headers)
        if size is not None:
            headers["content-length"] = str(size)
        for attempt in (0, 1):
            if self._deadlines.aborted:
                raise Unavailable(f"{self.name}: the build was interrupted")
            c = self._conn()
            token = self._deadlines.add(c, self.opt.timeout + (size or 0) / 1e6)  # (+1 s a MB sent, as _chunks)
            try:
                if hasattr(body, "seek"):
                    body.seek(0)
                c.request(method, self.base + path, body=body, headers=headers)
                resp = c.getresponse()
            except (OSError, http.client.HTTPException) as e:
                c.close()
                self._local.conn = None
                if self._deadlines.done(token):
                    why = "interrupted" if self._deadlines.aborted else "no answer within its deadline"
                    raise Unavailable(f"{self.name}: {method} {path}: {why}") from None
                stale = isinstance(e, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError))
                if stale and not attempt:  # a keep-alive connection the server had closed: once more
                    continue
                if isinstance(e, http.client.BadStatusLine) and not isinstance(e, ConnectionError):
                    # (its text is the server's raw bytes; RemoteDisconnected is one too)
                    raise Unavailable(f"{self.name}: the server did not answer in HTTP/1.1 "
                                      "(a gRPC port? use grpc:// for those)") from None
                raise Unavailable(f"{self.name}: {e}") from None
            self._deadlines.done(token)
            if method == "PUT" and (resp.status in (401, 403, 405) or resp.status >= 500):
                # A cache read-only for us, or one that cannot store (nginx on a full disk: 500;
                # 507): uploads stop, lookups go on (a server that is down fails them too).
                self._body(resp, 1 << 20)
                raise Refused(f"{self.name}: {method} {path} answered HTTP {resp.status}")
            if resp.status >= 500 or resp.status in (401, 403):  # (an auth error holds for every call)
                self._body(resp, 1 << 20)
                raise Unavailable(f"{self.name}: {method} {path} answered HTTP {resp.status}")
            return resp
        raise Unavailable(self.name)  # not reached

    def get_action_result(self, action: Digest) -> Any:
        from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2

        resp = self._request("GET", f"ac/{action.hash}")
        data = self._body(resp, 64 << 20)
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise RemoteError(f"{self.name}: GET ac/{action.hash[:12]} answered HTTP {resp.status}")
        res = re_pb2.ActionResult()
        try:
            res.ParseFromString(data)
        except Exception:
            raise RemoteError(f"{self.name}: ac/{action.hash[:12]} is not an ActionResult message") from None
        return res

    def _chunks(self, resp: Any, size: int) -> Iterator[bytes]:
        """The body in chunks, within the call's deadline (the timeout, plus a second per MB
        of the expected size: a server dripping bytes must not hold a build, and the socket's
        timeout is per read) and at most ``size`` bytes (more cannot be the digest's blob)."""
        import http.client
        import time

        announced = resp.length  # Content-Length (None: chunked, whose cut-off http.client raises)
        expected = announced if announced is not None and announced <= size else size
        allowed = self.opt.timeout + expected / 1e6
        deadline = time.monotonic() + allowed
        conn = getattr(self._local, "conn", None)  # (watched, so a stalled read is cut at the deadline or Ctrl-C)
        token = self._deadlines.add(conn, allowed) if conn is not None else None
        got = 0
        try:
            while True:
                try:
                    chunk = resp.read1(CHUNK)
                    if not chunk:
                        chunk = resp.read()  # (at the end of a sized body read1 leaves the response open)
                except (OSError, http.client.HTTPException) as e:  # cut off, a bad chunk size, a timeout
                    if token is not None and self._deadlines.done(token):
                        token = None
                        why = "interrupted" if self._deadlines.aborted else "its deadline passed"
                        raise Unavailable(f"{self.name}: a download broke off: {why}") from None
                    raise Unavailable(f"{self.name}: the response broke off ({type(e).__name__}: {e})") from None
                if not chunk:
                    if token is not None and self._deadlines.done(token):  # (the end a shutdown made)
                        token = None
                        why = "interrupted" if self._deadlines.aborted else "its deadline passed"
                        raise Unavailable(f"{self.name}: a download broke off: {why}")
                    if announced is not None and got < announced:  # (read1 gives b"" on a closed socket)
                        raise Unavailable(f"{self.name}: the response broke off after {got} of its "
                                          f"{announced} bytes")
                    return
                got += len(chunk)
                if got > size:
                    raise RemoteError(f"{self.name}: sent more than the {size} bytes asked for")
                yield chunk
                if self._deadlines.aborted:
                    raise Unavailable(f"{self.name}: a download broke off: interrupted")
                if time.monotonic() > deadline:
                    raise Unavailable(f"{self.name}: a download took longer than its deadline")
        finally:
            if token is not None:
                self._deadlines.done(token)

    def _body(self, resp: Any, limit: int) -> bytes:
        try:
            return b"".join(self._chunks(resp, limit))
        except RemoteError:
            resp.close()
            self._local.conn = None
            raise

    def update_action_result(self, action: Digest, result: Any) -> None:
        data = result.SerializeToString(deterministic=True)
        resp = self._request("PUT", f"ac/{action.hash}", data, len(data))
        self._body(resp, 1 << 20)
        if resp.status not in (200, 201, 204):
            raise RemoteError(f"{self.name}: PUT ac/{action.hash[:12]} answered HTTP {resp.status}")

    def find_missing(self, digests: Iterable[Digest]) -> set[Digest]:
        missing = set()
        for d in digests:
            resp = self._request("HEAD", f"cas/{d.hash}")
            self._body(resp, 1 << 20)
            if resp.status != 200:
                missing.add(d)
        return missing

    def upload(self, blobs: dict[Digest, Source]) -> int:
        sent = 0
        for d, src in blobs.items():
            if isinstance(src, bytes):
                resp = self._request("PUT", f"cas/{d.hash}", src, d.size)
            else:
                with open(src, "rb") as f:  # streamed from disk by http.client
                    resp = self._request("PUT", f"cas/{d.hash}", f, d.size)
            self._body(resp, 1 << 20)
            if resp.status not in (200, 201, 204):
                raise RemoteError(f"{self.name}: PUT cas/{d.hash[:12]} answered HTTP {resp.status}")
            sent += d.size
        return sent

    def download(self, digests: list[Digest], dest_dir: str) -> dict[Digest, str]:
        out: dict[Digest, str] = {}
        for d in digests:
            if d.size == 0:  # the empty blob: known without asking (Bazel's clients never store it)
                w = _VerifyingWriter(os.path.join(dest_dir, uuid.uuid4().hex), "sha256")
                w.finish(d)  # (a size-0 digest of some other hash is a bad entry all the same)
                out[d] = w.dest
                continue
            resp = self._request("GET", f"cas/{d.hash}")
            if resp.status != 200:
                self._body(resp, 1 << 20)
                raise (MissingBlob if resp.status == 404 else RemoteError)(
                    f"{self.name}: cas/{d.hash[:12]} is missing (HTTP {resp.status})")
            w = _VerifyingWriter(os.path.join(dest_dir, uuid.uuid4().hex), "sha256")
            try:
                for chunk in self._chunks(resp, d.size):
                    w.write(chunk)
            except OSError as e:
                w.abort()
                raise Unavailable(f"{self.name}: {e}") from None
            except RemoteError:
                w.abort()
                resp.close()  # (the rest of the body is not read: the connection is not reusable)
                self._local.conn = None
                raise
            w.finish(d)
            out[d] = w.dest
        return out
