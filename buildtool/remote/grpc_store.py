"""gRPC store: a REAPI v2 remote cache (ActionCache, CAS, ByteStream, Capabilities).

The digest function is negotiated once from ``CacheCapabilities``: BLAKE3 when the server
advertises it, otherwise SHA-256.  Small blobs travel in batches capped at MAX_BATCH_BYTES
(serialised); blobs larger than that go through ByteStream in 1 MiB chunks, read from and
written to disk, never held whole in memory.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import grpc

from buildtool.remote.action import Digest
from buildtool.remote.options import Endpoint, RemoteOptions
from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2_grpc as re_grpc
from buildtool.remote.protos.google.bytestream import bytestream_pb2 as bs_pb2
from buildtool.remote.protos.google.bytestream import bytestream_pb2_grpc as bs_grpc
from buildtool.remote.store import (
    BATCH_OVERHEAD,
    CHUNK,
    FIND_MISSING_CHUNK,
    MAX_BATCH_BYTES,
    BadBlob,
    MissingBlob,
    Refused,
    RemoteError,
    Source,
    Store,
    Unavailable,
    _VerifyingWriter,
    read_chunks,
)

CODE_NOT_FOUND = 5  # google.rpc.Code, as a BatchReadBlobs response's status holds it

UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
}
DIGEST_FN = {"sha256": re_pb2.DigestFunction.SHA256, "blake3": re_pb2.DigestFunction.BLAKE3}


def channel(ep: Endpoint) -> grpc.Channel:
    # gRPC waits longer between connection attempts to a server that is down, up to 120 s
    # by default: a worker whose server restarted (BuildGrid's routine, its action cache in
    # memory) came back 20-60 s after the server did, though it said "retrying every 2 s".
    opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20),
            ("grpc.enable_retries", 0), ("grpc.initial_reconnect_backoff_ms", 1000),
            ("grpc.max_reconnect_backoff_ms", 2000), ("grpc.min_reconnect_backoff_ms", 5000)]
    # (min_reconnect_backoff_ms is also the time a connection attempt is given: 1 s cut off
    # slower TLS handshakes for good, and gRPC's 20 s left an attempt nothing answered
    # hanging that long)
    if ep.scheme == "grpcs":
        return grpc.secure_channel(ep.target, grpc.ssl_channel_credentials(), options=opts)
    return grpc.insecure_channel(ep.target, options=opts)


REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED}
WRITES = ("UpdateActionResult", "BatchUpdateBlobs", "ByteStream.Write")


def rpc_error(name: str, what: str, e: grpc.RpcError) -> RemoteError:
    code = e.code() if hasattr(e, "code") else None
    detail = e.details() if hasattr(e, "details") else str(e)
    msg = f"{name}: {what} failed: {code.name if code else '?'} {detail or ''}".rstrip()
    if name.startswith("grpcs://") and detail and ("WRONG_VERSION_NUMBER" in detail or "Handshake failed" in detail):
        msg += " (the TLS handshake failed: a server without TLS is reached with grpc://)"
    if what in WRITES and code in REFUSED:  # a cache read-only for this client
        return Refused(msg)
    if code not in UNAVAILABLE:
        return RemoteError(msg)
    err = Unavailable(msg)
    err.transient = code not in REFUSED  # (a dropped connection is UNAVAILABLE, UNKNOWN or INTERNAL to grpcio)
    return err


class GrpcStore(Store):
    def __init__(
        self, ep: Endpoint, opt: RemoteOptions, chan: grpc.Channel | None = None, negotiate: bool = True,
    ) -> None:
        """A channel to the server; ``negotiate``: ask its capabilities now (else call
        ``negotiate()``: the first call to a server that never answers takes the whole
        timeout, and the store must be reachable by ``abort`` meanwhile)."""
        self.ep = ep
        self.opt = opt
        self.name = str(ep)
        self.instance = opt.instance
        self.timeout = opt.timeout
        self.metadata = ep.metadata(opt.headers)
        self.chan = chan or channel(ep)
        self.cas = re_grpc.ContentAddressableStorageStub(self.chan)
        self.ac = re_grpc.ActionCacheStub(self.chan)
        self.bs = bs_grpc.ByteStreamStub(self.chan)
        self.max_batch = MAX_BATCH_BYTES
        if negotiate:
            self.negotiate()

    def _call(self, what: str, fn: Any, req: Any, timeout: float | None = None) -> Any:
        try:
            return fn(req, timeout=timeout or self.timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            raise rpc_error(self.name, what, e) from None

    def negotiate(self) -> None:
        caps = self._call("GetCapabilities", re_grpc.CapabilitiesStub(self.chan).GetCapabilities,
                          re_pb2.GetCapabilitiesRequest(instance_name=self.instance))
        cc = caps.cache_capabilities
        self.digest_fn = "blake3" if re_pb2.DigestFunction.BLAKE3 in cc.digest_functions else "sha256"
        if cc.max_batch_total_size_bytes:
            self.max_batch = min(MAX_BATCH_BYTES, int(cc.max_batch_total_size_bytes * 3 // 4))
        self.update_enabled = cc.action_cache_update_capabilities.update_enabled

    @property
    def _fn(self) -> int:
        return DIGEST_FN[self.digest_fn]

    def _resource(self, d: Digest, upload: bool) -> str:
        fn = "blake3/" if self.digest_fn == "blake3" else ""
        tail = f"uploads/{uuid.uuid4()}/blobs/{fn}{d.hash}/{d.size}" if upload else f"blobs/{fn}{d.hash}/{d.size}"
        return f"{self.instance}/{tail}" if self.instance else tail

    # -- action cache ----------------------------------------------------------------
    def get_action_result(self, action: Digest) -> Any:
        req = re_pb2.GetActionResultRequest(instance_name=self.instance, action_digest=action.proto(),
                                            digest_function=self._fn)
        try:
            return self.ac.GetActionResult(req, timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise rpc_error(self.name, "GetActionResult", e) from None

    def update_action_result(self, action: Digest, result: Any) -> None:
        req = re_pb2.UpdateActionResultRequest(instance_name=self.instance, action_digest=action.proto(),
                                               action_result=result, digest_function=self._fn)
        self._call("UpdateActionResult", self.ac.UpdateActionResult, req)

    # -- CAS ---------------------------------------------------------------------------
    def find_missing(self, digests: Iterable[Digest]) -> set[Digest]:
        todo = list(dict.fromkeys(digests))
        missing: set[Digest] = set()
        for i in range(0, len(todo), FIND_MISSING_CHUNK):
            part = todo[i : i + FIND_MISSING_CHUNK]
            req = re_pb2.FindMissingBlobsRequest(instance_name=self.instance, digest_function=self._fn)
            req.blob_digests.extend(d.proto() for d in part)
            resp = self._call("FindMissingBlobs", self.cas.FindMissingBlobs, req)
            missing.update(Digest.of(d) for d in resp.missing_blob_digests)
        return missing

    def _batches(self, digests: list[Digest]) -> Iterator[list[Digest]]:
        batch: list[Digest] = []
        size = 0
        for d in sorted(digests, key=lambda d: d.size):
            cost = d.size + BATCH_OVERHEAD
            if batch and size + cost > self.max_batch:
                yield batch
                batch, size = [], 0
            batch.append(d)
            size += cost
        if batch:
            yield batch

    def upload(self, blobs: dict[Digest, Source]) -> int:
        small = [d for d in blobs if d.size + BATCH_OVERHEAD <= self.max_batch]
        sent = 0
        for batch in self._batches(small):
            req = re_pb2.BatchUpdateBlobsRequest(instance_name=self.instance, digest_function=self._fn)
            for d in batch:
                src = blobs[d]
                data = src if isinstance(src, bytes) else _read_file(src)
                req.requests.add(digest=d.proto(), data=data)
            resp = self._call("BatchUpdateBlobs", self.cas.BatchUpdateBlobs, req)
            for r in resp.responses:
                if r.status.code != 0:
                    raise RemoteError(f"{self.name}: BatchUpdateBlobs refused {r.digest.hash[:12]}: {r.status.message}")
            sent += sum(d.size for d in batch)
        for d, src in blobs.items():
            if d.size + BATCH_OVERHEAD > self.max_batch:
                self._write(d, src)
                sent += d.size
        return sent

    def _write(self, d: Digest, src: Source) -> None:
        name = self._resource(d, True)

        def requests() -> Iterator[bs_pb2.WriteRequest]:
            offset = 0
            first = True
            for chunk in read_chunks(src):
                yield bs_pb2.WriteRequest(resource_name=name if first else "", write_offset=offset, data=chunk,
                                          finish_write=offset + len(chunk) >= d.size)
                first = False
                offset += len(chunk)

        timeout = self.timeout + d.size / (1 << 20)  # a second per MiB on top of the base deadline
        try:
            resp = self.bs.Write(requests(), timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.ALREADY_EXISTS:
                return
            raise rpc_error(self.name, "ByteStream.Write", e) from None
        if resp.committed_size not in (d.size, -1):
            raise RemoteError(f"{self.name}: ByteStream.Write committed {resp.committed_size} of {d.size} bytes")

    def download(self, digests: list[Digest], dest_dir: str) -> dict[Digest, str]:
        out: dict[Digest, str] = {}
        todo = list(dict.fromkeys(digests))
        small = [d for d in todo if d.size + BATCH_OVERHEAD <= self.max_batch]
        for batch in self._batches(small):
            req = re_pb2.BatchReadBlobsRequest(instance_name=self.instance, digest_function=self._fn)
            req.digests.extend(d.proto() for d in batch)
            resp = self._call("BatchReadBlobs", self.cas.BatchReadBlobs, req)
            got = {Digest.of(r.digest): r for r in resp.responses}
            for d in batch:
                r = got.get(d)
                if r is None or r.status.code != 0:
                    why = r.status.message if r is not None else "not in the response"
                    missing = r is None or r.status.code == CODE_NOT_FOUND
                    raise (MissingBlob if missing else RemoteError)(
                        f"{self.name}: blob {d.hash[:12]} could not be read: {why or 'NOT_FOUND'}")
                w = _VerifyingWriter(os.path.join(dest_dir, uuid.uuid4().hex), self.digest_fn)
                w.write(r.data)
                w.finish(d)
                out[d] = w.dest
        for d in todo:
            if d not in out:
                out[d] = self._read(d, dest_dir)
        return out

    def _read(self, d: Digest, dest_dir: str) -> str:
        w = _VerifyingWriter(os.path.join(dest_dir, uuid.uuid4().hex), self.digest_fn, d)
        timeout = self.timeout + d.size / (1 << 20)
        call = self.bs.Read(bs_pb2.ReadRequest(resource_name=self._resource(d, False)), timeout=timeout,
                            metadata=self.metadata)
        try:
            for resp in call:
                w.write(resp.data)  # (BadBlob past the digest's size: the stream is cancelled)
        except BadBlob:
            call.cancel()
            raise
        except grpc.RpcError as e:
            w.abort()
            err = rpc_error(self.name, "ByteStream.Read", e)
            if e.code() == grpc.StatusCode.NOT_FOUND:
                err = MissingBlob(str(err))
            raise err from None
        except OSError as e:
            w.abort()
            raise OSError(e.errno, f"cannot write a download: {e.strerror}") from None  # (local trouble)
        w.finish(d)
        return w.dest

    def close(self) -> None:
        self.chan.close()

    def abort(self) -> None:
        self.chan.close()  # (cancels every call in flight)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(CHUNK * 4)  # only small blobs (under the batch cap) come here
