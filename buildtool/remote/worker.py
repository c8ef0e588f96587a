"""Remote worker: ``buildtool worker``, a bot of the Remote Workers API (BuildGrid's Bots service)
that takes leases, runs each REAPI action in a fresh directory holding exactly its input root,
and reports an ActionResult.

Each of the ``--capacity`` slots is its own bot session: ``CreateBotSession``, then an
``UpdateBotSession`` loop (long-polled by the server, call deadline POLL_S) that sends back the
session as last returned.  A lease's payload is ``Any(Action)`` or ``Any(Digest)``.  The action
runs with exactly its Command's arguments, environment and working directory (nothing of the
worker's environment), under the Action's timeout; outputs, stdout and stderr are uploaded to
the server's CAS and the lease is reported COMPLETED with status OK and the ActionResult — a
failing command included (its exit code is in the result).  Trouble of ours (inputs missing
from the CAS, an upload refused) is reported as a non-OK lease status so the server can retry.
A lease the server cancels (dropped from the returned session, or marked CANCELLED) has its
command's process group killed; nothing of it is uploaded.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2

from buildtool.atomic import remove_path
from buildtool.executor import SubprocessExecutor
from buildtool.remote import action as ra
from buildtool.remote.action import Digest
from buildtool.remote.grpc_store import GrpcStore, channel
from buildtool.remote.options import RemoteOptions, parse_endpoint
from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
from buildtool.remote.protos.google.devtools.remoteworkers.v1test2 import bots_pb2, bots_pb2_grpc
from buildtool.remote.store import RemoteError, Source, Unavailable

POLL_S = 5.0  # UpdateBotSession deadline: the server long-polls for 80% of it (under 3 s: no leases)
KEEPALIVE_S = 10.0  # while an action runs, report the session at least this often
RETRY_S = 2.0
# Answers to CreateBotSession that say the request itself is wrong (an --instance the server
# does not have, a header it refuses), when no slot of this worker ever had a session: retried
# for REFUSED_FOR_S on end (a proxy in front of a server still starting says 401/403/404 too);
# once every slot was refused that long, the worker stops, exit 1.
REFUSED_AT_START = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)
REFUSED_FOR_S = 30.0
FAILING_SAID_EVERY_S = 60.0  # a server that stays down: one line a minute per slot, not one per retry
TIMEOUT_MARK = "buildtool worker: TIMEOUT after"
MISSING_HINTS = ("No such file", "not found", "can't open", "cannot open", "No module named")
HINT = ("buildtool worker: hint: a file the command needed was missing. A remote action sees only its "
        "declared inputs (srcs, deps' outputs): the input was probably not declared.\n")
CODE_CANCELLED = 1
CODE_UNAVAILABLE = 14
CODE_INTERNAL = 13
CODE_FAILED_PRECONDITION = 9


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] worker: {msg}", file=sys.stderr, flush=True)


class ActionError(Exception):
    """An infrastructure problem running a lease (not the command failing)."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg)
        self.code = code


def _cas_error(e: RemoteError, missing: str) -> ActionError:
    """A read from the CAS that failed: UNAVAILABLE when the server could not be reached (a
    restart, a dropped connection: the job is the server's to give out again; answered as
    FAILED_PRECONDITION, "missing", every client ran its action here with a warning),
    else FAILED_PRECONDITION, REAPI's answer for a missing input (a refusal too: asking
    again would meet it, and the job must not go from worker to worker)."""
    if (isinstance(e, Unavailable) and e.transient) or "RESOURCE_EXHAUSTED" in str(e):  # (overloaded: later)
        return ActionError(CODE_UNAVAILABLE, f"the CAS could not be read: {e}")
    return ActionError(CODE_FAILED_PRECONDITION, f"{missing}: {e}")


@dataclass(slots=True)
class Running:
    lease_id: str
    thread: threading.Thread
    result: Any = None  # ActionResult, or ActionError
    done: bool = False
    executor: SubprocessExecutor | None = None  # runs this lease's command; cancel_all kills it


class Worker:
    def __init__(self, url: str, instance: str, capacity: int, work_dir: str, timeout: float,
                 headers: dict[str, str]) -> None:
        self.ep = parse_endpoint(url, "--server")
        self.instance = instance
        self.capacity = capacity
        self.work_dir = work_dir
        self.opt = RemoteOptions(instance=instance, timeout=timeout, headers=headers)
        self.metadata = self.ep.metadata(headers)
        self.chan = channel(self.ep)
        self.bots = bots_pb2_grpc.BotsStub(self.chan)
        self.stop = threading.Event()
        self._live: set[SubprocessExecutor] = set()  # executors of the leases being run
        self._live_lock = threading.Lock()
        self._store: GrpcStore | None = None
        self._store_lock = threading.Lock()
        self._served = False  # a bot session was created: a refusal after that is retried (a server restarting)
        self._refused: set[int] = set()  # the slots refused REFUSED_FOR_S on end, before any had a session
        self._gave_up = False  # every slot was: the worker stops, exit 1
        self._sessions_lock = threading.Lock()  # (_served, _refused, _gave_up: one decision for the worker)
        self.host = socket.gethostname()

    # -- CAS -----------------------------------------------------------------------------------
    def store(self) -> GrpcStore:
        with self._store_lock:
            if self._store is None:
                self._store = GrpcStore(self.ep, self.opt, self.chan)
            return self._store

    # -- bot sessions --------------------------------------------------------------------------
    def _new_session(self, slot: int) -> Any:
        bot_id = f"buildtool-{self.host}-{os.getpid()}-{slot}-{uuid.uuid4().hex[:6]}"
        bs = bots_pb2.BotSession(bot_id=bot_id, status=bots_pb2.OK)
        dev = bs.worker.devices.add(handle=bot_id)
        dev.properties.add(key="OSFamily", value=platform.system().lower())
        dev.properties.add(key="ISA", value=platform.machine())
        said = 0.0
        refused_since: float | None = None  # (this slot's first refusal, while no slot had a session)
        while not self.stop.is_set():
            try:
                got = self.bots.CreateBotSession(bots_pb2.CreateBotSessionRequest(parent=self.instance, bot_session=bs),
                                                 timeout=POLL_S, metadata=self.metadata)
                log(f"slot {slot}: bot session {got.name} ({bot_id})")
                with self._sessions_lock:
                    self._served = True
                    self._refused.discard(slot)
                return got
            except grpc.RpcError as e:
                if e.code() in REFUSED_AT_START and not self._served:
                    # (--instance misspelt: it retried every 2 s forever, where a supervisor or CI
                    # needs an exit status to notice.  The worker stops once every slot was
                    # refused that long; a slot refused first goes on trying meanwhile, and
                    # serves if the server takes another's session: no worker at part capacity)
                    now = time.monotonic()
                    refused_since = now if refused_since is None else refused_since
                    if now - refused_since >= REFUSED_FOR_S and slot not in self._refused:
                        log(f"slot {slot}: CreateBotSession refused for {REFUSED_FOR_S:g} s: {e.code().name} "
                            f"{e.details() or ''}; check --server, --instance and --remote-header")
                        with self._sessions_lock:  # (one decision for the worker: never left at part capacity)
                            self._refused.add(slot)
                            if len(self._refused) == self.capacity and not self._served:
                                self._gave_up = True
                                self.stop.set()
                else:  # (30 s of refusals on end: an outage between them starts the count again)
                    refused_since = None
                    with self._sessions_lock:
                        self._refused.discard(slot)
                if time.monotonic() - said > FAILING_SAID_EVERY_S:
                    log(f"slot {slot}: CreateBotSession failed: {e.code().name} {e.details() or ''}; retrying every "
                        f"{RETRY_S:g} s")
                    said = time.monotonic()
                self.stop.wait(RETRY_S)
        return None

    def slot(self, slot: int) -> None:
        session = self._new_session(slot)
        running: Running | None = None
        finished: set[str] = set()
        failing_said = 0.0  # when a failed UpdateBotSession was last logged (0: it answers)
        while session is not None and not self.stop.is_set():
            for lease in session.leases:
                # A lease this slot finished may still be echoed as ACTIVE until the server takes
                # the report; one handed out as PENDING again (re-queued) runs again.
                if running is None and (lease.state == bots_pb2.PENDING
                                        or (lease.state == bots_pb2.ACTIVE and lease.id not in finished)):
                    running = self._start(lease)
                    lease.state = bots_pb2.ACTIVE
            if running is not None:
                running.thread.join(KEEPALIVE_S)
                if running.done:
                    self._report(session, running)
                    finished.add(running.lease_id)
                    running = None
            try:
                if self.stop.is_set():  # (no new lease for a bot that is going: it would wait out its keepalive)
                    session.status = bots_pb2.BOT_TERMINATING
                session = self.bots.UpdateBotSession(
                    bots_pb2.UpdateBotSessionRequest(name=session.name, bot_session=session),
                    timeout=POLL_S, metadata=self.metadata)
                if failing_said:
                    log(f"slot {slot}: the server answers again")
                    failing_said = 0.0
                if running is not None and self._cancelled(session, running):
                    log(f"slot {slot}: lease {running.lease_id} was cancelled by the server; its command is killed")
                    assert running.executor is not None
                    running.executor.cancel_all()
                    running.thread.join()
                    finished.add(running.lease_id)
                    running = None
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    continue  # a long poll without work
                if time.monotonic() - failing_said > FAILING_SAID_EVERY_S:  # (a line per slot per 2 s flooded)
                    log(f"slot {slot}: UpdateBotSession failed: {code.name} {e.details() or ''}; retrying every "
                        f"{RETRY_S:g} s (said again after {FAILING_SAID_EVERY_S:g} s if it goes on)")
                    failing_said = time.monotonic()
                if self.stop.wait(RETRY_S):
                    break
                if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                            grpc.StatusCode.FAILED_PRECONDITION):
                    if running is not None:
                        running.thread.join()
                        running = None
                    session = self._new_session(slot)
                    finished.clear()  # a new session: leases it is given are new work, whatever their ids
        if session is None:
            return
        self._leave(slot, session, running)

    def _leave(self, slot: int, session: Any, running: Running | None) -> None:
        """The slot's last word to the server as the worker stops: its session ends
        (``BOT_TERMINATING``), with the lease it ran handed back and those it never started
        declined.  An idle slot said nothing: the server kept giving actions to the session
        of a worker that was gone, each waiting ~30 s for its keepalive to run out."""
        # A lease the last long poll brought as the worker was stopping was neither run nor
        # handed back: the job sat EXECUTING until the session's keepalive ran out (~40 s).
        declined = self._decline_unstarted(session, running)
        if running is not None:  # stopped in the middle of a lease: hand it back
            self._hand_back(slot, session, running)
        elif declined:
            self._terminating(slot, session, f"lease {', '.join(declined)} handed back unstarted")
        else:
            self._terminating(slot, session, "session ended")

    @staticmethod
    def _decline_unstarted(session: Any, running: Running | None) -> list[str]:
        """Mark the leases of ``session`` this slot never started as done with UNAVAILABLE (the
        server queues the action again at once); their ids."""
        out = []
        for lease in session.leases:
            if lease.state == bots_pb2.PENDING and (running is None or lease.id != running.lease_id):
                lease.state = bots_pb2.COMPLETED
                lease.status.code = CODE_UNAVAILABLE
                lease.status.message = "the worker was stopped (a signal) before the action started"
                out.append(lease.id)
        return out

    def _hand_back(self, slot: int, session: Any, running: Running) -> None:
        """The lease of a stopping worker is reported at once (its command killed, UNAVAILABLE),
        so the server need not wait for the session's keepalive to run out (~30 s, then the
        action again from the start) and the client hears why."""
        if running.executor is not None:
            running.executor.cancel_all()
        running.thread.join(RETRY_S)
        if not running.done:  # (still fetching inputs or uploading outputs: handed back all the same)
            running.result = ActionError(CODE_UNAVAILABLE, "the worker was stopped (a signal) while the action ran")
        self._report(session, running)
        self._terminating(slot, session, f"lease {running.lease_id} handed back")

    def _terminating(self, slot: int, session: Any, done: str) -> None:
        """Send the session with the bot ``BOT_TERMINATING`` and its leases as reported."""
        session.status = bots_pb2.BOT_TERMINATING
        try:
            self.bots.UpdateBotSession(bots_pb2.UpdateBotSessionRequest(name=session.name, bot_session=session),
                                       timeout=RETRY_S, metadata=self.metadata)
            log(f"slot {slot}: {done}: the worker is stopping")
        except grpc.RpcError as e:
            log(f"slot {slot}: {done} could not be said to the server ({e.code().name})")

    @staticmethod
    def _cancelled(session: Any, r: Running) -> bool:
        """The server cancels a lease by dropping it from the session it returns (BuildGrid) or
        by marking it CANCELLED (the Remote Workers API allows both)."""
        return not any(lease.id == r.lease_id and lease.state != bots_pb2.CANCELLED for lease in session.leases)

    def _report(self, session: Any, r: Running) -> None:
        for lease in session.leases:
            if lease.id != r.lease_id:
                continue
            lease.state = bots_pb2.COMPLETED
            if isinstance(r.result, ActionError):
                lease.status.code = r.result.code
                lease.status.message = str(r.result)
                lease.ClearField("result")
            else:
                lease.status.code = 0
                lease.result.Pack(r.result)

    def _start(self, lease: Any) -> Running:
        ex = SubprocessExecutor()
        r = Running(lease.id, threading.Thread(target=lambda: None), executor=ex)
        payload = any_pb2.Any()
        payload.CopyFrom(lease.payload)

        def work() -> None:
            with self._live_lock:
                self._live.add(ex)
            try:
                r.result = self.run_lease(payload, lease.id, ex)
            except ActionError as e:
                log(f"lease {lease.id}: {e}")
                r.result = e
            except Exception as e:  # a bug must not kill the slot; the server retries
                log(f"lease {lease.id}: internal error: {e!r}")
                r.result = ActionError(CODE_INTERNAL, f"buildtool worker internal error: {e!r}")
            finally:
                with self._live_lock:
                    self._live.discard(ex)
            r.done = True

        r.thread = threading.Thread(target=work, name=f"lease-{lease.id}", daemon=True)
        r.thread.start()
        return r

    # -- one action ----------------------------------------------------------------------------
    def _blob(self, d: Digest, tmp: str) -> bytes:
        if d.size == 0:
            return b""
        try:
            path = self.store().download([d], tmp)[d]
        except RemoteError as e:
            raise _cas_error(e, "missing from the CAS") from None
        with open(path, "rb") as f:
            data = f.read()
        os.unlink(path)
        return data

    def run_lease(self, payload: Any, lease_id: str, executor: SubprocessExecutor) -> Any:
        os.makedirs(self.work_dir, exist_ok=True)
        base = tempfile.mkdtemp(prefix="action-", dir=self.work_dir)
        try:
            return self._run_in(base, payload, lease_id, executor)
        finally:
            remove_path(base)  # (what the action made, at any depth)

    def _run_in(self, base: str, payload: Any, lease_id: str, executor: SubprocessExecutor) -> Any:
        blobs = os.path.join(base, "blobs")
        root = os.path.join(base, "root")
        os.makedirs(blobs)
        os.makedirs(root)
        action = re_pb2.Action()
        if payload.Is(re_pb2.Action.DESCRIPTOR):
            payload.Unpack(action)
        elif payload.Is(re_pb2.Digest.DESCRIPTOR):
            dg = re_pb2.Digest()
            payload.Unpack(dg)
            action.ParseFromString(self._blob(Digest.of(dg), blobs))
        else:
            raise ActionError(CODE_FAILED_PRECONDITION, f"unknown lease payload {payload.type_url}")
        md = re_pb2.ExecutedActionMetadata(worker=f"buildtool@{self.host}")
        md.worker_start_timestamp.GetCurrentTime()
        md.input_fetch_start_timestamp.GetCurrentTime()
        cmd = re_pb2.Command()
        cmd.ParseFromString(self._blob(Digest.of(action.command_digest), blobs))
        self._stage(Digest.of(action.input_root_digest), root, blobs)
        md.input_fetch_completed_timestamp.GetCurrentTime()
        cwd = os.path.normpath(os.path.join(root, cmd.working_directory))
        if not _inside(cwd, root):
            raise ActionError(CODE_FAILED_PRECONDITION, f"working directory {cmd.working_directory!r} escapes the root")
        os.makedirs(cwd, exist_ok=True)
        outs = list(cmd.output_files) + list(cmd.output_directories) + list(cmd.output_paths)
        for o in outs:
            p = os.path.normpath(os.path.join(cwd, o))
            if not _inside(p, root):
                raise ActionError(CODE_FAILED_PRECONDITION, f"output {o!r} escapes the input root")
            os.makedirs(os.path.dirname(p), exist_ok=True)
        for o in cmd.output_directories:
            os.makedirs(os.path.join(cwd, o), exist_ok=True)
        env = {e.name: e.value for e in cmd.environment_variables}
        for name in ("TMPDIR", "HOME"):  # a fresh directory per action, as a local one has (not "/")
            if name not in env:
                env[name] = os.path.join(base, name.lower())
                os.makedirs(env[name], exist_ok=True)
        timeout = action.timeout.ToNanoseconds() / 1e9 if action.HasField("timeout") else None
        argv = list(cmd.arguments)
        md.execution_start_timestamp.GetCurrentTime()
        try:
            res = executor.run(argv, cwd, env, timeout=timeout or None, capture=os.path.join(base, "capture"))
            exit_code, stdout, stderr = res.exit_code, res.stdout, res.stderr
            if res.timed_out:
                stderr += f"{TIMEOUT_MARK} {timeout:g}s\n".encode()
        except OSError as e:
            exit_code, stdout, stderr = 127, b"", f"buildtool worker: cannot run {argv[:1]}: {e.strerror}\n".encode()
        md.execution_completed_timestamp.GetCurrentTime()
        if executor.cancelled:  # the server cancelled the lease, or this worker is stopping: nothing to upload
            if self.stop.is_set():  # (UNAVAILABLE: the client runs it elsewhere, as for any lost worker)
                raise ActionError(CODE_UNAVAILABLE, "the worker was stopped (a signal) while the action ran")
            raise ActionError(CODE_CANCELLED, "cancelled by the server")
        if exit_code != 0 and any(h in stderr.decode(errors="replace") for h in MISSING_HINTS):
            stderr += HINT.encode()
        md.output_upload_start_timestamp.GetCurrentTime()
        result = self._outputs(cmd, cwd, root, exit_code, stdout, stderr)
        md.output_upload_completed_timestamp.GetCurrentTime()
        md.worker_completed_timestamp.GetCurrentTime()
        result.execution_metadata.CopyFrom(md)
        log(f"lease {lease_id}: {' '.join(argv)[:80]!r} in /{cmd.working_directory} -> exit {exit_code}")
        return result

    def _stage(self, root_digest: Digest, root: str, blobs: str) -> None:
        """Materialise exactly the input root under ``root``."""
        st = self.store()
        files: list[tuple[str, Digest, bool]] = []
        level = [(root, root_digest)]
        while level:
            want = list({d for _, d in level if d.size})
            got = self._download(want, blobs)
            nxt = []
            for path, d in level:
                msg = re_pb2.Directory()
                if d.size:
                    with open(got[d], "rb") as f:
                        msg.ParseFromString(f.read())
                for fn in msg.files:
                    _check_name(fn.name)
                    files.append((os.path.join(path, fn.name), Digest.of(fn.digest), fn.is_executable))
                for sub in msg.directories:
                    _check_name(sub.name)
                    p = os.path.join(path, sub.name)
                    os.makedirs(p, exist_ok=True)
                    nxt.append((p, Digest.of(sub.digest)))
                if len(msg.symlinks):
                    raise ActionError(CODE_FAILED_PRECONDITION, "symlinks in the input root are not supported")
            for p in got.values():
                os.unlink(p)
            level = nxt
        got = self._download(list({d for _, d, _ in files if d.size}), blobs)
        del st
        for path, d, x in files:
            if d.size:
                shutil.copyfile(got[d], path)
            else:
                open(path, "wb").close()
            os.chmod(path, 0o755 if x else 0o644)
        for p in got.values():
            os.unlink(p)

    def _download(self, digests: list[Digest], dest: str) -> dict[Digest, str]:
        if not digests:
            return {}
        try:
            return self.store().download(digests, dest)
        except RemoteError as e:
            raise _cas_error(e, "input missing from the CAS") from None

    def _outputs(self, cmd: Any, cwd: str, root: str, exit_code: int, stdout: bytes, stderr: bytes) -> Any:
        st = self.store()
        h = ra.hasher(st.digest_fn)
        result = re_pb2.ActionResult(exit_code=exit_code)
        up: dict[Digest, Source] = {}
        for o in [*cmd.output_files, *cmd.output_paths]:
            p = os.path.join(cwd, o)
            try:
                s = os.lstat(p)
            except OSError:
                continue  # a missing output is simply absent from the result
            if stat.S_ISREG(s.st_mode):
                d = Digest(ra.file_hash(p, st.digest_fn), s.st_size)
                result.output_files.add(path=o, digest=d.proto(), is_executable=bool(s.st_mode & 0o100))
                up[d] = p
            elif stat.S_ISDIR(s.st_mode):
                result.output_directories.add(path=o, tree_digest=self._tree(p, h, up).proto())
            elif stat.S_ISLNK(s.st_mode):  # (reported as the link it is; a client wanting a file says so)
                result.output_symlinks.add(path=o, target=os.readlink(p))
        for o in cmd.output_directories:
            p = os.path.join(cwd, o)
            if os.path.isdir(p) and not os.path.islink(p):
                result.output_directories.add(path=o, tree_digest=self._tree(p, h, up).proto())
        for data, field in ((stdout, "stdout_digest"), (stderr, "stderr_digest")):
            if data:
                d = Digest(h(data), len(data))
                getattr(result, field).CopyFrom(d.proto())
                up[d] = data
        try:
            missing = st.find_missing(up)
            if missing:
                st.upload({d: up[d] for d in missing})
        except RemoteError as e:
            raise ActionError(CODE_INTERNAL, f"cannot upload the outputs: {e}") from None
        return result

    def _tree(self, top: str, h: Any, up: dict[Digest, Source]) -> Digest:
        """An output directory as a REAPI Tree (uploaded with its files)."""
        digest_fn = self.store().digest_fn
        children: dict[Digest, Any] = {}

        def walk(path: str) -> Any:
            msg = re_pb2.Directory()
            for name in sorted(os.listdir(path)):
                p = os.path.join(path, name)
                s = os.lstat(p)
                if stat.S_ISREG(s.st_mode):
                    d = Digest(ra.file_hash(p, digest_fn), s.st_size)
                    msg.files.add(name=name, digest=d.proto(), is_executable=bool(s.st_mode & 0o100))
                    up[d] = p
                elif stat.S_ISDIR(s.st_mode):
                    sub = walk(p)
                    data = sub.SerializeToString(deterministic=True)
                    sd = Digest(h(data), len(data))
                    children[sd] = sub
                    msg.directories.add(name=name, digest=sd.proto())
                elif stat.S_ISLNK(s.st_mode):
                    msg.symlinks.add(name=name, target=os.readlink(p))
            return msg

        tree = re_pb2.Tree(root=walk(top))
        tree.children.extend(children.values())
        data = tree.SerializeToString(deterministic=True)
        d = Digest(h(data), len(data))
        up[d] = data
        return d

    # -- process -------------------------------------------------------------------------------
    def serve(self) -> int:
        """Serve until stopped (0), or until every slot ended on its own (1: a supervisor
        restarts a worker that exits non-zero; one that exited 0 serving nothing stayed down)."""
        threads = [threading.Thread(target=self._slot_said, args=(i,), name=f"slot-{i}", daemon=True)
                   for i in range(self.capacity)]
        for t in threads:
            t.start()
        log(f"serving {self.ep} instance {self.instance!r} with {self.capacity} slot(s); work dir {self.work_dir}")
        stopped = False
        try:
            while any(t.is_alive() for t in threads) and not self.stop.is_set():
                self.stop.wait(0.5)
            stopped = self.stop.is_set()
        finally:
            self.stop.set()
            with self._live_lock:
                live = list(self._live)
            for ex in live:
                ex.cancel_all()
            for t in threads:
                t.join(POLL_S + 2 * RETRY_S + 1)  # (a long poll, then the hand-back of a lease)
            self.chan.close()
        if self._gave_up:
            log("every slot was refused a bot session: exiting with status 1")
            return 1
        if not stopped:
            log("every slot stopped: exiting with status 1")
            return 1
        return 0

    def _slot_said(self, slot: int) -> None:
        """``slot``, its unexpected end said in one log line (not a thread's traceback)."""
        try:
            self.slot(slot)
        except Exception as e:
            log(f"slot {slot} stopped: {type(e).__name__}: {e}")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", ".."):
        raise ActionError(CODE_FAILED_PRECONDITION, f"bad name {name!r} in the input root")
