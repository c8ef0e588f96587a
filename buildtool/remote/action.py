"""Remote action: one target as a REAPI ``Command`` + ``Action`` with a Merkle-tree input root
of exactly its declared inputs, and the Action's digest (the remote cache key).

Built the same way for the remote cache and for remote execution so both share entries.
Paths in the Command are relative to the package (the working directory); the input root is
the workspace root.  Everything of the local key that REAPI has no field for (declared tools'
binary digests, the pyrule's Python version, the rule kind) goes into ``Action.salt``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from buildtool.digest import REMOTE_MARK
from buildtool.keys import CHECKOUT_MARK
from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
from buildtool.workspace import pkg_relative

SALT_VERSION = 1
PYRULE_PYTHON = "python3"  # resolved through the action's PATH, never an absolute path


class NotRemotable(Exception):
    """The target cannot be written as a REAPI action: a name in it is not UTF-8 (protobuf
    strings must be).  Neither the server's fault nor a miss of its: the target runs and is
    cached here only."""


@dataclass(frozen=True, slots=True)
class Digest:
    hash: str
    size: int

    def proto(self) -> re_pb2.Digest:
        return re_pb2.Digest(hash=self.hash, size_bytes=self.size)

    @staticmethod
    def of(p: re_pb2.Digest) -> Digest:
        return Digest(p.hash, p.size_bytes)

    def well_formed(self) -> bool:
        """64 lowercase hex digits (SHA-256 and BLAKE3 alike) and a size: what a digest
        named by a server must be before it goes into a URL or a resource name."""
        return len(self.hash) == 64 and not self.hash.strip("0123456789abcdef") and self.size >= 0

    def marker(self, digest_fn: str) -> str:
        """The recorded stand-in digest of an output left in the remote CAS (digest.REMOTE_MARK)."""
        return f"{REMOTE_MARK}{digest_fn}:{self.hash}:{self.size}"

    @staticmethod
    def of_marker(marker: str) -> tuple[str, Digest]:
        """(digest function, Digest) of a marker; ValueError if it is not one."""
        tag, fn, h, size = marker.split(":")
        if tag + ":" != REMOTE_MARK or fn not in ("sha256", "blake3") or not h or not size.isdigit():
            msg = f"not a remote output digest: {marker!r}"
            raise ValueError(msg)
        return fn, Digest(h, int(size))


def hasher(digest_fn: str) -> Callable[[bytes], str]:
    if digest_fn == "blake3":
        import blake3

        return lambda b: blake3.blake3(b).hexdigest()
    return lambda b: hashlib.sha256(b).hexdigest()


class ChangedSinceKeyed(OSError):
    """A file's content is no longer the one its action key was computed from."""


def file_hash(path: str, digest_fn: str, keyed: str | None = None) -> str:
    """Hash a file in 1 MiB reads (never the whole file in memory).  ``keyed``: the BLAKE3
    digest the action key has for it, checked on the same bytes (ChangedSinceKeyed if the
    file is another now): a remote entry looked up, or stored, under the Action of the new
    content would be filed locally under the key of the old one."""
    import blake3

    h: Any = blake3.blake3() if digest_fn == "blake3" else hashlib.sha256()
    check: Any = blake3.blake3() if keyed is not None and digest_fn != "blake3" else None
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            if check is not None:
                check.update(chunk)
    if keyed is not None and (check if check is not None else h).hexdigest() != keyed:
        raise ChangedSinceKeyed(f"{os.path.basename(path)} changed since this build hashed it")
    return h.hexdigest()


@dataclass(slots=True)
class RemoteAction:
    action: re_pb2.Action
    command: re_pb2.Command
    digest: Digest  # of the serialised Action: the remote cache key
    blobs: dict[Digest, bytes] = field(default_factory=dict)  # Action, Command, Directory messages
    files: dict[Digest, str] = field(default_factory=dict)  # input files: digest -> absolute path
    out_prefix: str = ""  # the package, to map output paths back to workspace paths


def command_arguments(t: Any, shell: str) -> list[str]:
    """The argv of a genrule/test/pyrule, independent of this machine's paths."""
    if t.kind == "pyrule":
        from buildtool.executor import PYRULE_MAIN, pyrule_texts

        return [PYRULE_PYTHON, "-c", PYRULE_MAIN, t.fn or "", *pyrule_texts(t.pkg, t.inputs, t.outs, t.kwargs_json)]
    if shell == "bash":
        return ["bash", "-e", "-o", "pipefail", "-c", t.cmd]
    argv = ["/bin/sh", "-e"]
    from buildtool.executor import has_pipe

    if has_pipe(t.cmd):
        argv += ["-o", "pipefail"]
    return [*argv, "-c", t.cmd]


def _check_utf8(t: TargetView, desc: dict[str, Any]) -> None:
    """NotRemotable naming the first name of the action that is not UTF-8 (a file name's
    undecodable bytes, kept by Python as surrogates): REAPI's paths, arguments and
    variables are protobuf strings."""
    names = [("package", t.pkg), *(("output", o) for o in t.outs), *(("input", i) for i in desc["inputs"]),
             *(("input", k.removeprefix("module:")) for k in desc.get("extra", {})),
             *(("variable", f"{k}={v}") for k, v in desc["env"].items()), ("command", t.cmd)]
    if t.kind == "pyrule":
        names += [("function", t.fn or ""), ("kwargs", t.kwargs_json or "")]
    for what, s in names:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            shown = s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            shown = shown if len(shown) <= 120 else shown[:117] + "..."
            msg = (f"its {what} '{shown}' is not UTF-8, which every name in a Remote Execution API "
                   "action must be")
            raise NotRemotable(msg) from None


class _Dir:
    __slots__ = ("dirs", "files")

    def __init__(self) -> None:
        self.files: dict[str, tuple[Digest, bool]] = {}
        self.dirs: dict[str, _Dir] = {}

    def sub(self, name: str) -> _Dir:
        d = self.dirs.get(name)
        if d is None:
            d = self.dirs[name] = _Dir()
        return d


def _merkle(node: _Dir, h: Callable[[bytes], str], blobs: dict[Digest, bytes]) -> Digest:
    msg = re_pb2.Directory()
    for name in sorted(node.files):
        d, x = node.files[name]
        msg.files.add(name=name, digest=d.proto(), is_executable=x)
    for name in sorted(node.dirs):
        msg.directories.add(name=name, digest=_merkle(node.dirs[name], h, blobs).proto())
    data = msg.SerializeToString(deterministic=True)
    dg = Digest(h(data), len(data))
    blobs[dg] = data
    return dg


@dataclass(slots=True)
class TargetView:
    """What action.py needs of a graph.Target plus its resolved inputs."""

    kind: str
    pkg: str
    cmd: str
    fn: str | None
    kwargs_json: str | None
    outs: tuple[str, ...]
    inputs: list[str]  # workspace-relative declared inputs (graph.inputs)
    timeout: float | None

    @staticmethod
    def of(t: Any, inputs: Any) -> TargetView:
        return TargetView(t.kind, t.pkg, t.cmd, t.fn, t.kwargs_json, t.outs, list(inputs), t.timeout)


def build(
    root: str,
    t: TargetView,
    desc: dict[str, Any],
    digest_fn: str,
    file_digest: Callable[[str, str], Digest],
    kept_mode: Callable[[str], int | None] = lambda rel: None,
) -> RemoteAction:
    """The REAPI Action of a target.  ``file_digest(rel_path, local_digest)`` gives an input
    file's remote digest (memoised by the caller); ``kept_mode(rel_path)`` the mode recorded
    for an input left in the server's CAS (no local file to stat)."""
    _check_utf8(t, desc)
    h = hasher(digest_fn)
    shell = desc.get("shell", "sh")
    cmd = re_pb2.Command()
    cmd.arguments.extend(command_arguments(t, shell))
    env = dict(desc["env"])
    keyed_path = None  # the PATH as the key holds it, when the Command's leaves entries out
    if CHECKOUT_MARK in env.get("PATH", ""):  # (a clone's .venv/bin: no place on a worker, which has no clone)
        keyed_path = env["PATH"]
        env["PATH"] = os.pathsep.join(e for e in env["PATH"].split(os.pathsep)
                                      if e != CHECKOUT_MARK and not e.startswith(CHECKOUT_MARK + "/"))
    if t.kind == "pyrule":
        env["PYTHONPATH"] = pkg_relative(".", t.pkg)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    for name in sorted(env):
        cmd.environment_variables.add(name=name, value=env[name])
    cmd.output_files.extend(sorted(pkg_relative(o, t.pkg) for o in t.outs))
    cmd.working_directory = t.pkg
    tree = _Dir()
    if t.pkg:  # the working directory must exist in the input root
        node = tree
        for part in t.pkg.split("/"):
            node = node.sub(part)
    files: dict[Digest, str] = {}
    inputs: dict[str, str] = dict(desc["inputs"])
    for k, v in desc.get("extra", {}).items():  # pyrule modules are inputs too
        if k.startswith("module:"):
            inputs[k[len("module:"):]] = v
    for rel, local in sorted(inputs.items()):
        full = os.path.join(root, rel)
        dg = file_digest(rel, local)
        try:
            x = bool(os.stat(full).st_mode & 0o100)
        except OSError:
            x = bool((kept_mode(rel) or 0) & 0o100)
        parts = rel.split("/")
        node = tree
        for part in parts[:-1]:
            node = node.sub(part)
        node.files[parts[-1]] = (dg, x)
        files[dg] = full
    blobs: dict[Digest, bytes] = {}
    try:
        root_digest = _merkle(tree, h, blobs)
    except RecursionError:  # (one call a level: an input ~1,000 directories down)
        msg = "its input tree is too deep to write as a Remote Execution API Directory tree"
        raise NotRemotable(msg) from None
    cdata = cmd.SerializeToString(deterministic=True)
    cdg = Digest(h(cdata), len(cdata))
    blobs[cdg] = cdata
    salt = {"v": SALT_VERSION, "kind": t.kind, "tools": desc.get("tools", {})}
    extra = desc.get("extra", {})
    for k in ("python", "fn", "kwargs", "depfile"):
        if k in extra:
            salt[k] = extra[k]
    for k in extra:  # dependencies without outputs: what they did is not in the input tree
        if k.startswith("after:"):
            salt[k] = extra[k]
    if keyed_path is not None:  # (a venv first on PATH or not: two actions, as two keys here)
        salt["path"] = keyed_path
    action = re_pb2.Action(command_digest=cdg.proto(), input_root_digest=root_digest.proto(),
                           salt=json.dumps(salt, sort_keys=True, separators=(",", ":")).encode())
    if t.timeout is not None:
        action.timeout.FromNanoseconds(int(t.timeout * 1e9))
    adata = action.SerializeToString(deterministic=True)
    adg = Digest(h(adata), len(adata))
    blobs[adg] = adata
    return RemoteAction(action, cmd, adg, blobs, files, t.pkg)
