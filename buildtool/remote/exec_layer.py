"""Remote execution layer: runs a target's action on a REAPI execution service instead of a
local subprocess (``--remote-executor``).

``run`` builds the target's REAPI Action (action.py: exactly the declared inputs), uploads what
the server lacks (FindMissingBlobs first), calls ``Execute`` and follows the Operation stream
(``WaitExecution`` when the stream breaks), then downloads and verifies the outputs into the
workspace and returns a result shaped like executor.ProcessResult, so the runner records it
like a local run.  Under ``--remote-download toplevel|minimal`` the outputs a target does not
need locally stay in the server's CAS: the result lists them as ``remote:`` digests (see
digest.REMOTE_MARK), and ``fetch`` downloads them later when a local action, a requested target
or a later ``--remote-download all`` build needs the files.  Any infrastructure trouble
returns None: the runner runs the action locally.  The first unreachable server trips a
circuit breaker (one warning, the rest of the build runs locally); any other trouble warns
for that target.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from buildtool.digest import REMOTE_MARK, is_remote
from buildtool.executor import MAX_ARG, arg_size, pyrule_texts
from buildtool.remote import action as ra
from buildtool.remote.action import Digest, TargetView
from buildtool.remote.grpc_store import GrpcStore, rpc_error
from buildtool.remote.options import Endpoint, RemoteOptions
from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2_grpc as re_grpc
from buildtool.remote.protos.google.longrunning import operations_pb2 as ops_pb2
from buildtool.remote.protos.google.longrunning import operations_pb2_grpc as ops_grpc
from buildtool.remote.store import Connection, RemoteError, Source, Unavailable, declared_files, marker_digest
from buildtool.remote.store import checked_digest as _checked

CANCEL_WAIT_S = 2.0  # Ctrl-C: how long CancelOperation calls may hold up the exit
WAIT_RETRIES = 5  # WaitExecution attempts after a broken Operation stream
BUSY_RETRIES = 6  # attempts while the server answers RESOURCE_EXHAUSTED (about 12 s of backoff)
DEFAULT_EXEC_DEADLINE_S = 3600.0  # an action without a timeout: how long we wait for it at most
TIMEOUT_MARK = "buildtool worker: TIMEOUT after"
CODE_DEADLINE_EXCEEDED = 4
MISSING_HINTS = ("No such file", "not found", "can't open", "cannot open", "No module named")
HINT = ("buildtool: hint: the remote action failed on a missing file. A remote action sees only its "
        "declared inputs (srcs and the outputs of deps): the file was probably not declared.\n")


def status_text(code: int, message: str) -> str:
    """A google.rpc.Status as users read it: ``9 FAILED_PRECONDITION: <message>`` (the
    number alone told nothing without the table of gRPC codes)."""
    import grpc

    name = next((c.name for c in grpc.StatusCode if c.value[0] == code), "an unknown code")
    return f"{code} {name}" + (f": {message}" if message else "")


@dataclass(slots=True)
class RemoteResult:
    """What the runner needs of an execution (the fields of executor.ProcessResult) + a note."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    duration: float
    note: str  # appended to the outcome's message, e.g. "; executed remotely on buildtool@host"
    cached: bool = False
    outputs: list[list[Any]] | None = None  # [path, remote: digest, mode] of outputs left remote
    lacking: str | None = None  # exit 0, but a declared output the result has no file for: why


def _lacking(t: TargetView, r: Any) -> str | None:
    """``declared output X ...`` for the first declared output (in declared order, as a
    local run says) the ActionResult ``r`` has no file for: a directory or a symbolic link
    there (what the worker found), or nothing; None when it has a file for each."""
    def rel(p: str) -> str:
        return posixpath.normpath(posixpath.join(t.pkg, p)) if t.pkg else posixpath.normpath(p)

    files = {rel(f.path) for f in r.output_files if not f.path.startswith("/") and ".." not in f.path.split("/")}
    others = {rel(d.path) for d in r.output_directories}
    others |= {rel(ln.path) for ln in (*r.output_file_symlinks, *r.output_symlinks, *r.output_directory_symlinks)}
    for o in t.outs:
        if o not in files:
            return f"declared output {o} {'is not a regular file' if o in others else 'was not created'}"
    return None


class ExecStats:
    def __init__(self) -> None:
        self.executed = 0
        self.cached = 0
        self.failed = 0
        self.fallbacks = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.left_remote = 0  # outputs not downloaded (--remote-download)
        self.fetched = 0  # outputs left remote earlier, downloaded when needed

    def line(self, name: str) -> str:
        line = (f"remote executor {name}: {self.executed} executed remotely ({self.cached} from its cache, "
                f"{self.failed} failed), {self.fallbacks} fell back to local")
        if self.left_remote or self.fetched:
            line += f"; {self.left_remote} outputs left remote, {self.fetched} fetched when needed"
        return line


class RemoteExecutor:
    """Thread-safe: the runner's workers call ``run`` in parallel."""

    def __init__(self, ep: Endpoint, opt: RemoteOptions, root: str, tmp_dir: str, warn: Callable[[str], None]) -> None:
        self.ep = ep
        self.opt = opt
        self.root = root
        self.tmp_dir = tmp_dir
        self.warn = warn
        self.stats = ExecStats()
        self._lock = threading.Lock()
        self._conn = Connection(lambda: GrpcStore(self.ep, self.opt, negotiate=False))
        self._exec: Any = None
        self._broken: str | None = None
        self._digests: dict[str, Digest] = {}  # local digest -> remote digest
        self.kept_modes: dict[str, int] = {}  # path -> mode of outputs left in the server's CAS (the runner's)
        self._calls: set[Any] = set()  # Operation streams in flight (cancelled on Ctrl-C)
        self._ops: set[str] = set()  # names of the Operations in flight (CancelOperation on Ctrl-C)
        self.cancelled = False
        self.download = opt.download  # all | toplevel | minimal
        self.top: set[str] = set()  # labels of the requested targets (toplevel: downloaded)
        self._queued_said = threading.Lock()  # taken by the one "still queued" note a build gives (_QueuedNote)

    def leaves_remote(self, t: Any) -> bool:
        """May this target's outputs stay in the server's CAS (not downloaded)?"""
        return self.download == "minimal" or (self.download == "toplevel" and t.label not in self.top)

    def wants(self, t: Any) -> bool:
        """Targets that may run remotely: not ``local=True``, no depfile, not the console pool."""
        if self.cancelled or getattr(t, "local", False) or t.depfile is not None or t.pool == "console":
            return False
        if self._broken is not None:
            with self._lock:
                self.stats.fallbacks += 1  # it runs here: the executor was found unusable
            return False
        return True

    def cancel_all(self) -> None:
        """The build is interrupted: stop waiting for remote actions (the runner's local
        executor, already cancelled, then reports them as killed) and ask the server to
        cancel them (``Operations.CancelOperation``, best effort: at most CANCEL_WAIT_S)."""
        with self._lock:
            self.cancelled = True
            calls = list(self._calls)
            ops = sorted(self._ops)
            st = self._conn.store
        for c in calls:
            c.cancel()
        self._conn.abort(connecting_only=True)  # GetCapabilities in flight: a silent server held it the timeout
        if st is None or not ops:
            return
        stub = ops_grpc.OperationsStub(st.chan)
        sent = [stub.CancelOperation.future(ops_pb2.CancelOperationRequest(name=n), timeout=CANCEL_WAIT_S,
                                            metadata=st.metadata) for n in ops]
        deadline = time.monotonic() + CANCEL_WAIT_S
        for f in sent:
            try:
                f.result(timeout=max(0.0, deadline - time.monotonic()))
            except (grpc.RpcError, grpc.FutureTimeoutError):
                pass  # the server may finish the action; its result lands in its action cache

    def _get(self) -> GrpcStore | None:
        """The connected executor's store, or None once it is off (store.Connection: the
        first caller connects, the others wait; cancel_all can break the connect off)."""
        with self._lock:
            if self._broken is not None or self.cancelled:
                return None
        try:
            store = self._conn.get()
        except (RemoteError, ValueError) as e:  # (ValueError: grpc's "closed channel", Ctrl-C meanwhile)
            if isinstance(e, ValueError) and not self.cancelled:
                raise
            with self._lock:
                if not self.cancelled:  # (Ctrl-C closed the channel: no warning, Ctrl-C says enough)
                    self._trip_locked(str(e))
                self._broken = self._broken or "the build was interrupted"
            return None
        assert isinstance(store, GrpcStore)
        with self._lock:
            if self._exec is None:
                self._exec = re_grpc.ExecutionStub(store.chan)
            return store if self._broken is None and not self.cancelled else None

    def _trip_locked(self, why: str) -> None:
        if self._broken is None:
            self._broken = why
            self.warn(f"remote execution unavailable ({why}); running actions locally for the rest of this build")

    def _file_digest(self, st: GrpcStore, rel: str, local: str) -> Digest:
        if local.startswith(REMOTE_MARK):  # an output left in the server's CAS: no local file
            return marker_digest(local, st.digest_fn, rel)
        with self._lock:
            d = self._digests.get(local)
        if d is None:
            full = os.path.join(self.root, rel)
            d = Digest(ra.file_hash(full, st.digest_fn, local), os.path.getsize(full))  # (as the cache layer)
            with self._lock:
                self._digests[local] = d
        return d

    # -- one action --------------------------------------------------------------------------------
    def run(
        self, t: Any, inputs: Any, desc: dict[str, Any], label: str, skip_cache: bool = False
    ) -> RemoteResult | None:
        """Run ``t`` remotely; None on infrastructure trouble (run it here).  ``skip_cache``:
        the server must execute, not answer from its action cache (always=True, a test
        under --no-cache-tests or one that failed last time with this key)."""
        st = self._get()
        if st is None:
            with self._lock:
                if not self.cancelled:  # (cancelled: it runs nowhere; the runner reports it so)
                    self.stats.fallbacks += 1  # (it runs here: the executor was found unusable)
            return None
        started = time.monotonic()
        try:
            res = self._run_retrying(st, t, inputs, desc, started, skip_cache)
        except Unavailable as e:
            with self._lock:
                if not self.cancelled:
                    self.stats.fallbacks += 1
                    self._trip_locked(str(e))
            return None
        except (RemoteError, OSError, ra.NotRemotable) as e:
            if self.cancelled:
                return None
            self.warn(f"{label}: remote execution failed ({e}); running it locally")
            with self._lock:
                self.stats.fallbacks += 1
            return None
        with self._lock:
            self.stats.executed += 1
            self.stats.cached += res.cached
            self.stats.failed += res.exit_code != 0 or res.lacking is not None
        return res

    def _run_retrying(
        self, st: GrpcStore, t: Any, inputs: Any, desc: dict[str, Any], started: float, skip_cache: bool
    ) -> RemoteResult:
        """A busy server (RESOURCE_EXHAUSTED, e.g. BuildGrid's concurrent-RPC limit) is retried
        with backoff; still busy after that, it is unavailable for the rest of the build (a
        quota used up would otherwise cost every action the same ~12 s before running here)."""
        for attempt in range(BUSY_RETRIES):
            try:
                return self._run(st, t, inputs, desc, started, skip_cache)
            except RemoteError as e:
                if "RESOURCE_EXHAUSTED" not in str(e) or self.cancelled:
                    raise
            time.sleep(min(0.25 * 2**attempt, 4.0))
        try:
            return self._run(st, t, inputs, desc, started, skip_cache)
        except RemoteError as e:
            if "RESOURCE_EXHAUSTED" in str(e) and not isinstance(e, Unavailable):
                raise Unavailable(f"still busy after {BUSY_RETRIES} retries: {e}") from None
            raise

    def _run(
        self, st: GrpcStore, t: Any, inputs: Any, desc: dict[str, Any], started: float, skip_cache: bool
    ) -> RemoteResult:
        view = TargetView.of(t, inputs)
        if t.kind == "pyrule" and \
                sum(map(arg_size, pyrule_texts(view.pkg, view.inputs, view.outs, view.kwargs_json))) > MAX_ARG:
            # (here they go through a file: executor.PYRULE_MAIN; a worker's command line refuses them)
            raise RemoteError("its srcs, outs and kwargs are too long for a remote command line")
        if t.kind != "pyrule" and arg_size(t.cmd) > MAX_ARG:  # (here: a script file, executor.shell_argv)
            raise RemoteError(f"its command ({arg_size(t.cmd):,} bytes) is too long for a remote command line "
                              "(a worker's exec refuses an argument over 128 KiB)")
        act = ra.build(self.root, view, desc, st.digest_fn, lambda rel, loc: self._file_digest(st, rel, loc),
                       self.kept_modes.get)
        blobs: dict[Digest, Source] = dict(act.blobs)
        for d, path in act.files.items():
            blobs.setdefault(d, path)
        missing = st.find_missing(blobs)
        inputs = desc["inputs"]
        lost = sorted(rel for d in missing if isinstance(p := blobs[d], str)
                      and is_remote(inputs.get(rel := os.path.relpath(p, self.root))))
        if lost:  # (upload opened a file that never was here: "[Errno 2] No such file" of an absolute path)
            raise RemoteError(f"input {lost[0]} was left in its CAS (--remote-download) and the server no longer "
                              "has it" + (f" ({len(lost) - 1} more such)" if len(lost) > 1 else ""))
        if missing:
            sent = st.upload({d: blobs[d] for d in missing})
            with self._lock:
                self.stats.bytes_up += sent
        resp = self._execute(st, act.digest, t, skip_cache)
        if resp.cached_result and not skip_cache and (resp.result.exit_code != 0
                                                      or resp.status.code == CODE_DEADLINE_EXCEEDED):
            # A failure from the executor's action cache (BuildGrid keeps failed actions unless
            # told not to): run it again, as a failure here runs again, rather than making a
            # one-off failure (an out-of-memory kill) every checkout's red until an input changes.
            resp = self._execute(st, act.digest, t, True)
        if resp.status.code == CODE_DEADLINE_EXCEEDED and not resp.HasField("result"):
            raise RemoteError(f"the server reports a timeout without a result: {resp.status.message}")
        if resp.status.code not in (0, CODE_DEADLINE_EXCEEDED):
            status = status_text(resp.status.code, resp.status.message or resp.message)
            raise RemoteError(f"Execute answered status {status}")
        r = resp.result
        timed_out = resp.status.code == CODE_DEADLINE_EXCEEDED
        os.makedirs(self.tmp_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix="exec-", dir=self.tmp_dir)
        try:
            stdout, stderr = self._streams(st, r, tmp)
            timed_out = timed_out or TIMEOUT_MARK.encode() in stderr
            left = lacking = None
            if r.exit_code == 0 and not timed_out:
                lacking = _lacking(view, r)
                if lacking is None:
                    left = self._outputs(st, view, r, tmp, self.leaves_remote(t))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        worker = r.execution_metadata.worker or "a remote worker"
        note = f"; executed remotely on {worker}"
        if resp.cached_result:  # (what "worker" names ran it before: nothing ran now)
            note = f"; answered from the remote executor's action cache (run before on {worker})"
        if r.exit_code != 0:
            text = stderr.decode(errors="replace") + stdout.decode(errors="replace")
            if any(h in text for h in MISSING_HINTS):
                note += " — a file it needed was missing there: was an input not declared? (docs/remote.md)"
                if HINT.encode() not in stderr and b"hint: a file the command needed was missing" not in stderr:
                    stderr += HINT.encode()
        md = r.execution_metadata
        duration = time.monotonic() - started
        if md.HasField("execution_start_timestamp") and md.HasField("execution_completed_timestamp"):
            duration = max(0.0, (md.execution_completed_timestamp.ToNanoseconds()
                                 - md.execution_start_timestamp.ToNanoseconds()) / 1e9)
        if left is not None:
            note += "; outputs left in the remote CAS (--remote-download)"
        return RemoteResult(r.exit_code, stdout, stderr, timed_out, duration, note, resp.cached_result, left, lacking)

    def _execute(self, st: GrpcStore, action: Digest, t: Any, skip_cache: bool) -> Any:
        """Execute, following the Operation stream to its end (WaitExecution on a broken stream)."""
        names: list[str] = []
        # (after 1.5 segments: a server silent for one is unavailable, not "queued")
        # (_follow's segments are --remote-timeout, at least 1 s)
        queued = _QueuedNote(self.warn, t.label, st.name, max(self.opt.timeout, 1.0) * 1.5, self._queued_said)
        try:
            return self._follow(st, action, t, names, skip_cache, queued)
        finally:
            queued.cancel()
            with self._lock:
                if not self.cancelled:  # cancel_all still needs the names
                    self._ops.difference_update(names)

    def _follow(
        self, st: GrpcStore, action: Digest, t: Any, names: list[str], skip_cache: bool, queued: _QueuedNote,
    ) -> Any:
        """The Operation stream, in segments of ``--remote-timeout`` seconds: a segment that
        ends with the action still running is followed by ``WaitExecution``, which a live
        server answers at once with the current state (REAPI); a segment in which the server
        said nothing at all means it stopped answering (frozen, or a connection that went
        dead without a reset), and the action runs here, rather than the build waiting in
        silence for the action's whole deadline (an hour)."""
        req = re_pb2.ExecuteRequest(instance_name=st.instance, action_digest=action.proto(),
                                    skip_cache_lookup=skip_cache, digest_function=st._fn)
        end = time.monotonic() + ((t.timeout + 600.0) if t.timeout else DEFAULT_EXEC_DEADLINE_S)
        segment = max(self.opt.timeout, 1.0)
        name = ""
        broken = 0  # streams that broke (not segments that ended): WAIT_RETRIES of them at most
        stream = self._exec.Execute(req, timeout=min(segment, end - time.monotonic()), metadata=st.metadata)
        while True:
            heard, before = False, broken
            with self._lock:
                if self.cancelled:
                    stream.cancel()
                self._calls.add(stream)
            try:
                for op in stream:
                    heard = True
                    queued.seen(op)
                    if op.name and op.name != name:
                        name = op.name
                        names.append(name)
                        with self._lock:
                            self._ops.add(name)
                    if op.done:
                        if op.HasField("error"):
                            raise RemoteError(f"Execute failed: status {status_text(op.error.code, op.error.message)}")
                        resp = re_pb2.ExecuteResponse()
                        if not op.response.Unpack(resp):
                            raise RemoteError(f"Execute answered a {op.response.type_url}, not an ExecuteResponse")
                        return resp
                err: Any = RemoteError("the Operation stream ended before the action was done")
                broken += 1
            except grpc.RpcError as e:
                err = rpc_error(st.name, "Execute", e)
                if self.cancelled:
                    raise RemoteError("cancelled") from None
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    if time.monotonic() >= end:
                        raise err from None
                    if not heard:  # (a live server answers WaitExecution at once)
                        raise Unavailable(f"{st.name} said nothing for {segment:g} s (--remote-timeout) "
                                          "while an action ran there") from None
                elif e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
                    broken += 1
                else:
                    raise err from None
            finally:
                with self._lock:
                    self._calls.discard(stream)
            if not name or broken > WAIT_RETRIES:
                raise err
            if broken > before:  # (a segment that ended is followed at once)
                time.sleep(min(0.5 * broken, 2.0))
            stream = self._exec.WaitExecution(re_pb2.WaitExecutionRequest(name=name),
                                              timeout=min(segment, max(end - time.monotonic(), 0.1)),
                                              metadata=st.metadata)

    def _streams(self, st: GrpcStore, r: Any, tmp: str) -> tuple[bytes, bytes]:
        out = []
        for d, raw in ((r.stdout_digest, r.stdout_raw), (r.stderr_digest, r.stderr_raw)):
            data = raw
            if d.hash and d.size_bytes:
                path = st.download([_checked(d)], tmp)[Digest.of(d)]
                with open(path, "rb") as f:
                    data = f.read()
            out.append(data)
        return out[0], out[1]

    def _outputs(self, st: GrpcStore, t: TargetView, r: Any, tmp: str, lazy: bool) -> list[list[Any]] | None:
        """Download every declared output (verified), then move each into the workspace; or,
        when ``lazy``, download nothing and return [path, remote: digest, mode] of each.  Paths
        named by the result are never trusted: each must be a declared output."""
        want = set(t.outs)
        files = declared_files(t, r, "the result")  # (checked as a cache entry is: cache_layer._fetch)
        for f in files.values():
            _checked(f.digest)  # (left remote, it would be recorded as the output's digest)
        if set(files) != want:  # (_lacking said which first: not reached)
            raise RemoteError(f"the result lacks declared outputs: {sorted(want - set(files))}")
        if lazy:
            with self._lock:
                self.stats.left_remote += len(files)
            return [[p, Digest.of(f.digest).marker(st.digest_fn), 0o755 if f.is_executable else 0o644]
                    for p, f in sorted(files.items())]
        self._place(st, [(p, Digest.of(f.digest), 0o755 if f.is_executable else 0o644)
                         for p, f in sorted(files.items())], tmp)
        return None

    def _place(self, st: GrpcStore, files: list[tuple[str, Digest, int]], tmp: str) -> None:
        """Download (verified) and move each (path, digest, mode) into the workspace."""
        digests = list({d for _, d, _ in files if d.size})
        got = st.download(digests, tmp) if digests else {}
        with self._lock:
            self.stats.bytes_down += sum(d.size for d in digests)
        for p, d, mode in files:
            full = os.path.join(self.root, p)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            staged = os.path.join(tmp, f"out-{len(p)}-{os.path.basename(p)}")
            if d.size:
                shutil.copyfile(got[d], staged)
            else:
                open(staged, "wb").close()
            os.chmod(staged, mode)
            os.replace(staged, full)

    def fetch(self, files: list[tuple[str, str, int]]) -> str | None:
        """Download outputs left remote earlier, given as (path, remote: digest, mode), into the
        workspace (each blob verified).  None when done; else why not, as a sentence."""
        st = self._get()
        if st is None:
            return f"the remote executor {self.ep} is unavailable ({self._broken})"
        try:
            todo = [(p, marker_digest(marker, st.digest_fn, p), mode) for p, marker, mode in files]
            os.makedirs(self.tmp_dir, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix="fetch-", dir=self.tmp_dir)
            try:
                self._place(st, todo, tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        except (RemoteError, OSError) as e:
            return f"downloading {', '.join(p for p, _, _ in files)} from {self.ep} failed: {e}"
        with self._lock:
            self.stats.fetched += len(files)
        return None

    def summary(self) -> str | None:
        if not self._conn.started:
            return None
        return self.stats.line(str(self.ep))

    def totals(self) -> dict[str, object]:
        """This build's counts, for the ``remote`` line of ``--events``."""
        s = self.stats
        return {"role": "executor", "endpoint": str(self.ep), "executed": s.executed, "cached": s.cached,
                "failed": s.failed, "fallbacks": s.fallbacks, "bytes_down": s.bytes_down, "bytes_up": s.bytes_up,
                "left_remote": s.left_remote, "fetched": s.fetched, "disabled": self._broken}

    def close(self) -> None:
        st, self._conn.store = self._conn.store, None
        if st is not None:
            st.close()


class _QueuedNote:
    """One warning a build when an action has waited ``after`` seconds (1.5 segments of the
    remote timeout) without a worker taking it, while the server answers: with no worker
    connected, or all busy, a build otherwise waited in silence (up to the hour an action
    without a timeout may take).  Not when the server has said nothing for a segment (it
    froze or died: that is said once as the executor being unavailable), and not again for
    the other actions waiting (``said``, the layer's: one cause, one line)."""

    def __init__(
        self, warn: Callable[[str], None], label: str, server: str, after: float, said: threading.Lock,
    ) -> None:
        self._msg = (f"{label}: still queued on the remote executor {server} after {after:g} s "
                     "(no worker connected, or all busy; other actions may be waiting too); "
                     "waiting on (Ctrl-C stops the build)")
        self._warn = warn
        self._said = said
        self._segment = after / 1.5
        self._after = after
        self._heard: float | None = None  # when the server last sent an update of the operation
        self._closed = False  # the action is done (or the wait over): no timer again
        self._timer: threading.Timer | None = None
        self._arm()

    def _arm(self) -> None:
        self._timer = threading.Timer(self._after, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        heard = self._heard
        if heard is None or time.monotonic() - heard > self._segment:
            return
        if self._said.acquire(blocking=False):  # (never released: the first note of the build only)
            self._warn(self._msg)

    def seen(self, op: Any) -> None:
        """An update of the Operation: past the queue once a worker executes it (or it is done);
        back in it when the server queues it again (its worker died or was stopped: the
        wait for another one was silent)."""
        self._heard = time.monotonic()
        if self._closed:
            return
        md = re_pb2.ExecuteOperationMetadata()
        if op.done:
            self.cancel()
        elif op.metadata.Unpack(md) and md.stage >= re_pb2.ExecutionStage.EXECUTING:
            self._stop_timer()
        elif self._timer is None:
            self._arm()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def cancel(self) -> None:
        self._closed = True
        self._stop_timer()
