"""Remote execution end to end against a real stack on 127.0.0.1: PostgreSQL (Debian's package),
BuildGrid 0.4.4 with its execution services, and two ``buildtool worker`` processes.  A second
checkout with its own cache builds locally, for byte-for-byte comparison."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import conftest
import pytest
from conftest import Workspace

pytest.importorskip("grpc", reason="the 'remote' extra (grpcio, protobuf) is not installed: pip install '.[remote]'")
pytest.importorskip("google.protobuf", reason="the 'remote' extra (protobuf) is not installed")

import remote_exec_servers as rx
import remote_servers

BIG = 3 * 1024 * 1024 + 77  # over the batch cap: inputs and outputs go through ByteStream


class Stack:
    def __init__(self, url: str, workers: list[remote_servers.Server], server: remote_servers.Server) -> None:
        self.url = url
        self.workers = workers
        self.server = server

    def worker_logs(self) -> str:
        return "".join(w.log_tail() for w in self.workers)

    def cancellations(self) -> int:
        """Leases the workers saw the server cancel, over their whole logs."""
        return sum(w.log.read_text(errors="replace").count("was cancelled by the server") for w in self.workers)


@contextlib.contextmanager
def _buildgrid_exec(work: pathlib.Path) -> Iterator[remote_servers.Server]:
    """PostgreSQL and BuildGrid with execution in ``work`` (the test skipped where they cannot
    start), stopped afterwards."""
    try:
        pg = rx.Postgres(work)
        pg.start()
    except (remote_servers.Unavailable, OSError) as e:
        pytest.skip(f"PostgreSQL for BuildGrid's scheduler unavailable: {e}")
    server = None
    try:
        try:
            server = rx.start_buildgrid_exec(work, pg)
        except remote_servers.Unavailable as e:
            pytest.skip(f"BuildGrid {remote_servers.BGD_VERSION} with execution unavailable: {e}")
        yield server
    finally:
        if server is not None:
            server.stop()
        pg.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("rexec")
    with _buildgrid_exec(work) as server:
        workers = [rx.start_worker(work, server.url, n, capacity=2) for n in range(2)]
        workers.append(rx.start_worker(work, server.url, 2, capacity=1, instance=rx.FAILURES_CACHED))
        try:
            yield Stack(server.url, workers, server)
        finally:
            for w in workers:
                rx.stop_gracefully(w)


def _project(ws: Workspace) -> None:
    """Three packages: a generator, a pyrule, an executable output, a big input and output,
    independent leaves (for --remote-jobs), and a ``local=True`` target."""
    ws.write("gen/names.txt", "alpha\nbeta\ngamma\n")
    ws.write("data/big.bin", hashlib.sha256(b"seed").digest() * (BIG // 32) + b"tail")
    ws.write("lib/join.py", """
def join(srcs, outs, sep):
    with open(outs[0], "w") as f:
        f.write(sep.join(open(s).read() for s in srcs))
""")
    ws.build_file("gen", """
        genrule(name="header", srcs=["names.txt"], outs=["names.h"],
                cmd="sed 's/.*/#define N_& 1/' $< > $@ && echo generated header")
        [genrule(name=f"leaf{i}", outs=[f"leaf{i}.txt"], cmd=f"sleep 0.5; echo leaf {i} > $@") for i in range(4)]
    """)
    ws.build_file("data", """
        genrule(name="pack", srcs=["big.bin"], outs=["big.copy", "tool.sh"],
                cmd="cp big.bin big.copy && printf '#!/bin/sh\\\\necho tool\\\\n' > tool.sh && chmod +x tool.sh")
    """)
    ws.build_file("lib", """
        pyrule(name="joined", fn="lib.join:join", srcs=["//gen:header", "//gen:leaf0"], outs=["joined.txt"],
               kwargs={"sep": "--\\n"})
        genrule(name="here", srcs=["//gen:header"], outs=["here.txt"], cmd="cp ../gen/names.h $@", local=True)
    """)
    ws.build_file("", """
        genrule(name="app", srcs=["//lib:joined", "//lib:here", "//data:pack", "//gen:leaf1", "//gen:leaf2",
                                  "//gen:leaf3"],
                outs=["out/app.txt"],
                cmd="cat lib/joined.txt lib/here.txt gen/leaf1.txt gen/leaf2.txt gen/leaf3.txt > $@ "
                    "&& wc -c < data/big.copy >> $@ && sh data/tool.sh >> $@")
    """)


OUTPUTS = ["gen/names.h", "gen/leaf0.txt", "gen/leaf3.txt", "data/big.copy", "data/tool.sh", "lib/joined.txt",
           "lib/here.txt", "out/app.txt"]
REMOTE = ["//gen:header", "//gen:leaf0", "//gen:leaf1", "//gen:leaf2", "//gen:leaf3", "//data:pack",
          "//lib:joined", "//:app"]


def test_an_execute_status_is_said_by_its_name_too() -> None:
    from buildtool.remote.exec_layer import status_text

    assert status_text(9, "input blob missing") == "9 FAILED_PRECONDITION: input blob missing"
    assert status_text(8, "") == "8 RESOURCE_EXHAUSTED"
    assert status_text(99, "x") == "99 an unknown code: x"


def test_remote_build_matches_local_build(stack: Stack, make_workspace: Callable[..., Workspace]) -> None:
    remote = make_workspace("remote")
    _project(remote)
    r = remote.build("-j", "1", "--remote-executor", stack.url, "--remote-jobs", "6", "//:app")
    assert r.rc == 0, r.output + stack.worker_logs()
    ev = r.by_label
    for label in REMOTE:
        assert ev[label]["status"] == "ran", (label, ev[label])
        assert ev[label].get("executed") == "remote", (label, ev[label], r.output)
        assert "executed remotely on buildtool@" in ev[label]["reason"]
    assert ev["//lib:here"]["status"] == "ran"
    assert "executed" not in ev["//lib:here"], "local=True must run locally"
    m = re.search(r"remote executor grpc://\S+: (\d+) executed remotely \(\d+ from its cache, 0 failed\), "
                  r"0 fell back to local", r.stdout)
    assert m and int(m.group(1)) == len(REMOTE), r.output
    [ex] = r.remote
    assert (ex["role"], ex["executed"], ex["failed"], ex["fallbacks"], ex["left_remote"]) == \
        ("executor", len(REMOTE), 0, 0, 0), ex
    assert ex["bytes_up"] > BIG and ex["bytes_down"] > BIG, ex
    assert "warning" not in r.stderr.lower(), r.stderr
    # -j 1 but --remote-jobs 6: the four independent leaves were in flight on several lanes at once.
    lanes = {ev[f"//gen:leaf{i}"]["lane"] for i in range(4)}
    assert len(lanes) > 1, lanes

    local = make_workspace("local")
    _project(local)
    assert local.cache != remote.cache
    lr = local.build("//:app")
    assert lr.rc == 0, lr.output
    assert not any("executed" in e for e in lr.events)
    for rel in OUTPUTS:
        a, b = remote.path(rel), local.path(rel)
        assert a.read_bytes() == b.read_bytes(), rel
        assert os.stat(a).st_mode & 0o111 == os.stat(b).st_mode & 0o111, rel
    assert os.stat(remote.path("data/tool.sh")).st_mode & 0o100
    # The remotely built outputs were recorded like a local run: the next build is a no-op.
    again = remote.build("--remote-executor", stack.url, "//:app")
    assert again.rc == 0 and not again.ran, again.output


LEFT_REMOTE = ["out/app.txt", "data/big.copy", "data/tool.sh", "lib/joined.txt", "gen/leaf0.txt", "gen/leaf3.txt"]


def test_outputs_stay_remote_until_needed(stack: Stack, make_workspace: Callable[..., Workspace]) -> None:
    """--remote-download minimal|toplevel: a remote action's outputs stay in the server's CAS
    until a local action, a requested target (toplevel) or an ``all`` build needs them, and
    every file that lands is the same as a local build's."""
    ws = make_workspace("lazy")
    _project(ws)
    url = stack.url
    r = ws.build("--remote-executor", url, "--remote-download", "minimal", "//:app")
    assert r.rc == 0, r.output + stack.worker_logs()
    assert all(r.by_label[label].get("executed") == "remote" for label in REMOTE), r.output
    # The local=True //lib:here needed gen/names.h: that one was fetched; nothing else landed.
    assert ws.exists("gen/names.h") and ws.exists("lib/here.txt")
    assert [rel for rel in LEFT_REMOTE if ws.exists(rel)] == []
    assert re.search(r"; 9 outputs left remote, 1 fetched when needed", r.stdout), r.stdout
    assert (r.remote[0]["left_remote"], r.remote[0]["fetched"]) == (9, 1), r.remote
    assert "outputs left in the remote CAS" in r.by_label["//:app"]["reason"]

    again = ws.build("--remote-executor", url, "--remote-download", "minimal", "//:app")
    assert again.rc == 0 and again.with_status("ran", "restored") == set(), again.output
    assert not ws.exists("out/app.txt")

    top = ws.build("--remote-executor", url, "--remote-download", "toplevel", "//:app")
    assert top.rc == 0 and top.ran == set(), top.output
    assert top.status("//:app") == "restored", top.by_label["//:app"]
    assert "downloaded from the remote executor's CAS" in top.by_label["//:app"]["reason"]
    assert ws.exists("out/app.txt") and not ws.exists("data/big.copy")

    full = ws.build("--remote-executor", url, "//:app")  # the default: --remote-download all
    assert full.rc == 0 and full.ran == set(), full.output
    assert full.with_status("restored") == {"//gen:leaf0", "//gen:leaf1", "//gen:leaf2", "//gen:leaf3",
                                            "//data:pack", "//lib:joined"}, full.output
    local = make_workspace("local")
    _project(local)
    assert local.build("//:app").rc == 0
    for rel in OUTPUTS:
        a, b = ws.path(rel), local.path(rel)
        assert a.read_bytes() == b.read_bytes(), rel
        assert os.stat(a).st_mode & 0o111 == os.stat(b).st_mode & 0o111, rel
    # Once on disk, the files are checked against their remote digests: no remote needed.
    plain = ws.build("//:app")
    assert plain.rc == 0 and plain.with_status("ran", "restored") == set(), plain.output
    ws.write("lib/joined.txt", "edited by hand\n")
    edited = ws.build("//:app")
    assert edited.rc == 0 and "//lib:joined" in edited.ran, edited.output
    assert ws.read("lib/joined.txt") == local.read("lib/joined.txt")


def test_an_executable_left_remote_stays_executable_for_remote_dependents(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """--remote-download minimal: run.sh stays in the server's CAS; the action that runs
    it gets it in its input root with the executable bit recorded for it (there is no
    local file to stat: it was sent without the bit, "Permission denied")."""
    ws = make_workspace("xbit")
    ws.build_file("lib", """
        genrule(name="exe", outs=["run.sh"], cmd="printf '#!/bin/sh\\necho hi\\n' > $@ && chmod +x $@")
    """)
    ws.build_file("app", """
        genrule(name="use", srcs=["//lib:exe"], outs=["out.txt"], cmd="../lib/run.sh > $@")
    """)
    r = ws.build("--remote-executor", stack.url, "--remote-download", "minimal", "//lib:exe")
    assert r.rc == 0 and not ws.exists("lib/run.sh"), r.output + stack.worker_logs()
    r = ws.build("--remote-executor", stack.url, "--remote-download", "toplevel", "//app:use")
    assert r.rc == 0, r.output + stack.worker_logs()
    assert r.by_label["//app:use"].get("executed") == "remote"
    assert ws.read("app/out.txt") == "hi\n"


def test_a_remote_action_gets_a_tmpdir_and_home_of_its_own(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """The worker gave none: "$TMPDIR/x" was /x on the worker, shared by every action."""
    ws = make_workspace("tmpdir")
    ws.build_file("", """
        genrule(name="t", outs=["t.txt"], cmd='test -d "$$TMPDIR" && test "$$TMPDIR" != / && test -d "$$HOME" '
                '&& echo x > "$$TMPDIR/probe" && cat "$$TMPDIR/probe" > $@')
    """)
    r = ws.build("--remote-executor", stack.url, "//:t")
    assert r.rc == 0 and r.by_label["//:t"].get("executed") == "remote", r.output + stack.worker_logs()
    assert ws.read("t.txt") == "x\n"


def test_output_left_remote_and_unreachable_is_said_and_made_again_by_a_retry(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    ws = make_workspace("lost")
    ws.build_file("", """
        genrule(name="gen", outs=["g.txt"], cmd="echo made remotely > $@")
        genrule(name="use", srcs=[":gen"], outs=["u.txt"], cmd="cat g.txt > $@", local=True)
    """)
    r = ws.build("--remote-executor", stack.url, "--remote-download", "minimal", "//:gen")
    assert r.rc == 0 and not ws.exists("g.txt"), r.output
    dead = f"grpc://127.0.0.1:{remote_servers.free_port()}"
    lost = ws.build("--remote-executor", dead, "--remote-timeout", "3", "--remote-download", "minimal", "//:use")
    assert lost.rc == 0, lost.output  # (built again at once: the producer ran here, the executor being dead)
    assert "needs g.txt, left in the remote CAS by --remote-download" in lost.output, lost.output
    assert "//:gen run again on the next build" in lost.output and "(retry 1 of 2)" in lost.stderr, lost.output
    assert lost.ran == {"//:gen", "//:use"} and ws.read("u.txt") == "made remotely\n", lost.output
    plain = ws.build("//:use")  # no remote at all: nothing to do
    assert plain.rc == 0 and plain.ran == set(), plain.output


def test_remote_download_mode_is_checked(make_workspace: Callable[..., Workspace]) -> None:
    ws = make_workspace("mode")
    ws.build_file("", """
        genrule(name="a", outs=["a.txt"], cmd="echo a > $@")
    """)
    rc, _, err = ws.run("build", "--remote-download", "some", "//:a")
    assert rc == 2 and "--remote-download must be one of all, toplevel, minimal (got 'some')" in err, err
    ws.write("buildtool.toml", 'remote_download = "lazy"\n')
    rc, _, err = ws.run("build", "//:a")
    assert rc == 2 and "buildtool.toml" in err and "remote_download must be one of" in err, err
    ws.write("buildtool.toml", "")
    for remote in (["--remote-cache", "http://127.0.0.1:1"], []):  # (ignored without a word)
        assert ws.run("clean")[0] == 0  # (not a no-op, which checks nothing)
        rc, _, err = ws.run("build", *remote, "--remote-download", "minimal", "//:a")
        assert rc == 0 and "--remote-download minimal is for remote execution" in err, err
        assert ws.run("clean")[0] == 0
        rc, _, err = ws.run("build", *remote, "--remote-jobs", "8", "//:a")
        assert rc == 0 and "--remote-jobs 8 is for remote execution" in err, err
    ws.write("buildtool.toml", "remote_jobs = 8\n")  # (a team's, for the executor CI sets): quiet
    assert ws.run("clean")[0] == 0
    rc, _, err = ws.run("build", "//:a")
    assert rc == 0 and "remote-jobs" not in err, err


def test_a_cas_the_worker_cannot_reach_gives_the_job_back_and_a_missing_blob_fails_it() -> None:
    """An executor restarting mid-build: the worker's read of the action or of an input failed
    on the dropped connection and it answered FAILED_PRECONDITION "missing from the CAS",
    which the client took as a failed action (six warnings, six local runs).  UNAVAILABLE:
    the server gives the job out again.  A blob really not there, or a read refused
    (PERMISSION_DENIED: asking again meets it too), stays FAILED_PRECONDITION."""
    from buildtool.remote.action import Digest
    from buildtool.remote.store import MissingBlob, RemoteError, Unavailable
    from buildtool.remote.worker import CODE_FAILED_PRECONDITION, CODE_UNAVAILABLE, ActionError, Worker

    refused = Unavailable("BatchReadBlobs failed: PERMISSION_DENIED")
    refused.transient = False
    for error, code in ((Unavailable("BatchReadBlobs failed: UNAVAILABLE Stream removed"), CODE_UNAVAILABLE),
                        (RemoteError("BatchReadBlobs failed: RESOURCE_EXHAUSTED too many"), CODE_UNAVAILABLE),
                        (MissingBlob("blob ab could not be read: NOT_FOUND"), CODE_FAILED_PRECONDITION),
                        (refused, CODE_FAILED_PRECONDITION)):
        class Store:
            def download(self, digests: Any, tmp: str, e: Exception = error) -> Any:
                raise e

        w = Worker.__new__(Worker)
        w.store = Store  # type: ignore[method-assign,assignment]
        for read in (lambda w=w: w._blob(Digest("ab" * 32, 5), "/nonexistent"),  # (the Action, the Command)
                     lambda w=w: w._download([Digest("cd" * 32, 7)], "/nonexistent")):  # (the input tree)
            with pytest.raises(ActionError) as got:
                read()
            assert got.value.code == code and str(error) in str(got.value), (got.value.code, str(got.value))


def test_a_dropped_connection_is_transient_and_a_refusal_is_not() -> None:
    import grpc

    from buildtool.remote.grpc_store import rpc_error
    from buildtool.remote.store import Unavailable

    class Err(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode) -> None:
            self._code = code

        def code(self) -> grpc.StatusCode:
            return self._code

        def details(self) -> str:
            return "x"

    for code, transient in ((grpc.StatusCode.UNAVAILABLE, True), (grpc.StatusCode.DEADLINE_EXCEEDED, True),
                            (grpc.StatusCode.UNKNOWN, True), (grpc.StatusCode.INTERNAL, True),  # (RST_STREAM...)
                            (grpc.StatusCode.PERMISSION_DENIED, False), (grpc.StatusCode.UNAUTHENTICATED, False)):
        e = rpc_error("grpc://h:1", "BatchReadBlobs", Err(code))
        assert isinstance(e, Unavailable) and e.transient is transient, (code, e)


def test_outputs_left_remote_with_a_cache_of_its_own_are_said_to_reach_it_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI with --remote-download minimal and an HTTP cache of its own for developers
    uploaded nothing there (the outputs were never here to send), without a word: the
    teammates reading that cache got 0 hits."""
    from buildtool.config import Config
    from buildtool.remote.setup import check_download

    monkeypatch.delenv("CI", raising=False)
    said: list[str] = []
    ex = "grpc://127.0.0.1:8980"
    for download, cache, upload in (("minimal", "http://c:8080/ci", True), ("toplevel", "http://c:8080/ci", True),
                                    ("all", "http://c:8080/ci", True), ("minimal", ex, True),
                                    ("minimal", "http://c:8080/ci", False), ("minimal", "", True)):
        said.clear()
        check_download(Config(remote_executor=ex, remote_cache=cache, remote_download=download,
                              remote_upload=upload), said.append)
        expect = download != "all" and cache not in ("", ex) and upload
        assert bool(said) == expect, (download, cache, upload, said)
        if expect:
            which = "" if download == "minimal" else " (all but the requested targets')"
            assert said == [f"--remote-download {download}: the outputs left in the executor's CAS{which} are not "
                            f"uploaded to the remote cache {cache} (they are not here to send), so it gets none of "
                            "those results; give its readers the executor's endpoint as their cache, or use "
                            "--remote-download all"], said
    for same in ("grpc://localhost:8980", "grpc://127.0.0.1:8980/"):  # (the executor's own server, spelled so)
        said.clear()
        check_download(Config(remote_executor=ex, remote_cache=same, remote_download="minimal", remote_upload=True),
                       said.append)
        assert said == [], (same, said)
    said.clear()
    monkeypatch.setenv("CI", "true")  # (upload on by default in CI)
    check_download(Config(remote_executor=ex, remote_cache="http://c:8080/ci", remote_download="minimal"), said.append)
    assert len(said) == 1


@pytest.mark.parametrize("url", ["bogus", "http://127.0.0.1:1"])
def test_an_executor_or_worker_url_that_is_not_grpc_gets_the_forms_it_may_take(
    make_workspace: Callable[..., Workspace], url: str,
) -> None:
    """The message offered http(s):// for a garbled URL, then refused the http:// URL it had
    offered: executors and workers speak gRPC only."""
    ws = make_workspace("url")
    ws.build_file("", 'genrule(name="a", outs=["a.txt"], cmd="echo a > $@")\n')
    want = f"must be grpc://HOST:PORT or grpcs://HOST:PORT (got {url!r})"
    rc, _, err = ws.run("build", "--remote-executor", url)
    assert rc == 2 and f"--remote-executor {want}" in err, err
    rc, _, err = ws.run("worker", "--server", url)
    assert rc == 2 and f"--server {want}" in err, err


@pytest.mark.parametrize("timeout", ["-5", "0", "nan", "inf"])
def test_a_worker_refuses_a_timeout_that_is_no_positive_number(
    make_workspace: Callable[..., Workspace], timeout: str,
) -> None:
    """`build --remote-timeout -1` was exit 2, `worker --remote-timeout -5` started serving."""
    ws = make_workspace("wt")
    rc, _, err = ws.run("worker", "--server", "grpc://127.0.0.1:1", "--remote-timeout", timeout)
    assert rc == 2 and "--remote-timeout must be a positive number of seconds below a year" in err, err


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--work-dir", "a-file", "--work-dir a-file is not a directory"),
    ("--instance", "a b", "--instance must be ASCII names joined by '/'"),
])
def test_a_worker_refuses_a_work_dir_that_is_a_file_and_an_instance_name_build_refuses(
    make_workspace: Callable[..., Workspace], flag: str, value: str, needle: str,
) -> None:
    """Both started serving: every lease then failed as an internal error (FileExistsError),
    or the instance named what `--remote-instance` refuses."""
    ws = make_workspace("wd")
    ws.write("a-file", "x\n")
    rc, _, err = ws.run("worker", "--server", "grpc://127.0.0.1:1", flag, value)
    assert rc == 2 and needle in err, err


def test_a_failure_in_the_executors_action_cache_is_run_again(
    stack: Stack, make_workspace: Callable[..., Workspace], tmp_path: pathlib.Path,
) -> None:
    """BuildGrid's action cache keeps failed actions unless told not to (its default): a
    failure, of a test or of a genrule, was answered from it on every later build, in
    every checkout (an out-of-memory kill once became a permanent red), while a local
    failure runs again.  A failed result from the executor's cache is run again, skipping
    its cache.  The flag file outside the workspace is what the command checks (the
    worker runs on this machine): absent, it fails; present, it passes."""
    flag = tmp_path / "flag"
    ws = make_workspace("fc")
    ws.build_file("", f'genrule(name="g", outs=["g.txt"], cmd="test -e {flag} && echo ok > $@")\n'
                      f'test(name="t", cmd="test -e {flag}")\n')
    remote = ("--remote-executor", stack.url, "--remote-instance", rx.FAILURES_CACHED)
    for command, label in (("build", "//:g"), ("test", "//:t")):
        r = ws.build(*remote, label, command=command)
        assert r.rc == 1 and r.status(label) == "failed", r.output
    flag.write_text("")
    for command, label in (("build", "//:g"), ("test", "//:t")):
        r = ws.build(*remote, label, command=command)
        assert r.rc == 0 and r.status(label) == "ran", r.output
        assert "answered from the remote executor's action cache" not in r.output, r.output
    assert ws.read("g.txt") == "ok\n"


def test_undeclared_input_fails_remotely_and_passes_locally(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    def project(ws: Workspace) -> None:
        ws.write("conf/settings.txt", "x=1\n")
        ws.write("conf/BUILD.py", "")
        ws.build_file("app", """
            genrule(name="sneaky", srcs=["main.txt"], outs=["out.txt"], cmd="cat main.txt ../conf/settings.txt > $@")
        """)
        ws.write("app/main.txt", "main\n")

    remote = make_workspace("remote")
    project(remote)
    r = remote.build("--remote-executor", stack.url, "//app:sneaky")
    assert r.rc == 1, r.output
    ev = r.by_label["//app:sneaky"]
    assert ev["status"] == "failed" and ev.get("executed") == "remote", ev
    assert "was an input not declared?" in ev["reason"], ev
    assert "No such file" in r.output and "not declared" in r.output, r.output
    assert not remote.exists("app/out.txt")

    local = make_workspace("local")
    project(local)
    lr = local.build("//app:sneaky")
    assert lr.rc == 0, lr.output
    assert local.read("app/out.txt") == "main\nx=1\n"


def test_a_remote_result_without_a_declared_output_names_that_output(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """The message named the first declared output (nothing was placed, so the runner found
    m1.txt absent) though the command made m1.txt and not m2.txt; a link was "not created"
    where a local run says "is not a regular file"; and the summary counted no failure."""
    ws = make_workspace("lacking")
    ws.write("in.txt", "x\n")
    ws.build_file("", """
        genrule(name="half", srcs=["in.txt"], outs=["m1.txt", "m2.txt"], cmd="cp in.txt m1.txt")
        genrule(name="link", srcs=["in.txt"], outs=["l.txt"], cmd="ln -s in.txt l.txt")
    """)
    r = ws.build("--remote-executor", stack.url, "-k", "//:half", "//:link")
    assert r.rc == 1, r.output + stack.worker_logs()
    for label, said in (("//:half", "declared output m2.txt was not created"),
                        ("//:link", "declared output l.txt is not a regular file")):
        ev = r.by_label[label]
        assert ev["status"] == "failed" and ev.get("executed") == "remote", ev
        assert ev["reason"].startswith(said) and "executed remotely on" in ev["reason"], ev
    assert "(0 from its cache, 2 failed)" in r.output, r.output
    assert not ws.exists("m1.txt") and not ws.exists("l.txt")


def test_action_sees_exactly_its_command_environment(stack: Stack, make_workspace: Callable[..., Workspace]) -> None:
    ws = make_workspace("env")
    ws.build_file("", """
        genrule(name="env", outs=["env.txt"], env={"GREETING": "hi"}, cmd="env > $@; ls -a . > ls.txt")
        genrule(name="tree", outs=["tree.txt"], cmd="(find . | sort) > $@")
    """)
    ws.write("other/file.txt", "not an input\n")
    r = ws.build("--remote-executor", stack.url, "//:env", "//:tree")
    assert r.rc == 0, r.output + stack.worker_logs()
    assert r.by_label["//:env"].get("executed") == "remote"
    env = dict(line.split("=", 1) for line in ws.read("env.txt").splitlines() if "=" in line)
    assert env.get("GREETING") == "hi"
    assert "PATH" in env
    assert rx.WORKER_PROBE not in env, "the worker's own environment leaked into the action"
    assert env["HOME"] != env["TMPDIR"] and env["TMPDIR"] not in ("", "/"), env  # the action's own, as locally
    # The input root holds nothing but what was declared (here: nothing): no other/file.txt, no BUILD.py.
    assert ws.read("tree.txt").split() == [".", "./tree.txt"]
    # A clone's own .venv/bin first on PATH (as the README sets it up) is keyed as
    # $BUILDTOOL_CHECKOUT/.venv/bin; that literal reached the worker's PATH.
    path = f"{ws.root}/.venv/bin{os.pathsep}{os.environ['PATH']}"
    r = ws.build("--remote-executor", stack.url, "//:env", env_extra={"PATH": path})
    assert r.rc == 0 and r.by_label["//:env"].get("executed") == "remote", r.output
    env = dict(line.split("=", 1) for line in ws.read("env.txt").splitlines() if "=" in line)
    # (as keys hold it, and a local command gets it: an entry listed again, a trailing / dropped)
    from buildtool.keys import keyed_path

    assert "BUILDTOOL_CHECKOUT" not in env["PATH"] and env["PATH"] == keyed_path(os.environ["PATH"], "/"), env["PATH"]


def test_remote_timeout_is_enforced(stack: Stack, make_workspace: Callable[..., Workspace]) -> None:
    ws = make_workspace("timeout")
    ws.build_file("", """
        test(name="slow", cmd="sleep 30", timeout=1)
    """)
    r = ws.build("--remote-executor", stack.url, "//:slow", command="test")
    assert r.rc != 0, r.output
    ev = r.by_label["//:slow"]
    assert ev.get("executed") == "remote" and ev["status"] == "failed", ev
    assert "TIMEOUT" in ev["reason"], ev


def test_unreachable_executor_falls_back_to_local_with_one_warning(make_workspace: Callable[..., Workspace]) -> None:
    ws = make_workspace("fallback")
    ws.build_file("", """
        genrule(name="a", outs=["a.txt"], cmd="echo a > $@")
        genrule(name="b", srcs=[":a"], outs=["b.txt"], cmd="cat a.txt > $@")
    """)
    url = f"grpc://127.0.0.1:{remote_servers.free_port()}"
    r = ws.build("--remote-executor", url, "--remote-timeout", "3", "//:b")
    assert r.rc == 0, r.output
    assert r.ran == {"//:a", "//:b"}
    assert not any("executed" in e for e in r.events)
    assert r.stderr.count("remote execution unavailable") == 1, r.stderr
    assert "2 fell back to local" in r.stdout, r.stdout  # (it said 0: only the first counted as tried)
    assert ws.read("b.txt") == "a\n"


def conftest_env(ws: Workspace) -> dict[str, str]:
    return conftest._clean_env(ws.cache, ws.home)


def test_ctrl_c_stops_waiting_for_remote_actions(stack: Stack, make_workspace: Callable[..., Workspace]) -> None:
    ws = make_workspace("sigint")
    ws.home.mkdir(parents=True, exist_ok=True)
    marker = ws.home / "remote-started"
    late = ws.home / "remote-finished"
    # The worker runs on this machine, so the remote action can leave markers at absolute paths.
    ws.build_file("", f"""
        genrule(name="slow", outs=["s.txt"], cmd="touch {marker}; sleep 12; touch {late}; echo > $@")
        genrule(name="after", srcs=[":slow"], outs=["a.txt"], cmd="cp $< $@")
    """)
    env = conftest_env(ws)
    p = subprocess.Popen([conftest.BUILDTOOL, "build", "--remote-executor", stack.url], cwd=ws.root, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            if p.poll() is not None:
                pytest.fail(f"the build ended before the remote action started: {p.communicate()}")
            assert time.monotonic() < deadline, "the remote action never started"
            time.sleep(0.05)
        started = time.monotonic()
        seen = stack.cancellations()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=10)  # well before the remote sleep ends
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 130, out + err
    assert "running it locally" not in err, err
    assert not ws.exists("s.txt") and not ws.exists("a.txt")
    # The build asked the server to cancel the action (CancelOperation), and the worker that ran
    # it killed the command when the server took the lease back: it never gets to its end.
    while stack.cancellations() == seen:
        assert time.monotonic() < started + 11, "no worker saw the cancellation:\n" + stack.worker_logs()
        time.sleep(0.1)
    time.sleep(max(0.0, started + 14 - time.monotonic()))
    assert not late.exists(), "the cancelled remote command ran to its end"


def test_the_queued_note_is_for_a_server_that_answers_and_said_once() -> None:
    """A server frozen or killed while actions waited in its queue: each of them warned
    "still queued (no worker connected, or all busy)" before the executor was found
    unavailable, a wrong diagnosis a line per action.  The note needs an answer from the
    server within the last segment, and is given once a build."""
    import threading

    from buildtool.remote import exec_layer
    from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
    from buildtool.remote.protos.google.longrunning import operations_pb2 as ops_pb2

    op = ops_pb2.Operation(name="op", done=False)
    op.metadata.Pack(re_pb2.ExecuteOperationMetadata(stage=re_pb2.ExecutionStage.QUEUED))
    said = threading.Lock()
    warned: list[str] = []
    # (notes after 1.5 s: a segment of 1 s)
    silent = exec_layer._QueuedNote(warned.append, "//:silent", "grpc://x", 1.5, said)
    silent.seen(op)  # (the Execute's first answer, then nothing)
    answering = [exec_layer._QueuedNote(warned.append, f"//:a{i}", "grpc://x", 1.5, said) for i in range(2)]
    time.sleep(0.9)
    for note in answering:
        note.seen(op)  # (a segment's WaitExecution answered: still queued)
    time.sleep(1.0)
    for note in (silent, *answering):
        note.cancel()
    assert len(warned) == 1 and warned[0].startswith("//:a"), warned


def test_an_action_queued_again_after_its_worker_went_gets_the_note() -> None:
    """A worker stopped or killed after taking the action: the server queues it again, and
    the build waited for another worker in silence (the note's timer ended at EXECUTING)."""
    import threading

    from buildtool.remote import exec_layer
    from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
    from buildtool.remote.protos.google.longrunning import operations_pb2 as ops_pb2

    def op(stage: int) -> ops_pb2.Operation:
        o = ops_pb2.Operation(name="op", done=False)
        o.metadata.Pack(re_pb2.ExecuteOperationMetadata(stage=stage))
        return o

    warned: list[str] = []
    note = exec_layer._QueuedNote(warned.append, "//:t", "grpc://x", 1.5, threading.Lock())
    note.seen(op(re_pb2.ExecutionStage.EXECUTING))  # (a worker took it at once)
    time.sleep(0.3)
    note.seen(op(re_pb2.ExecutionStage.QUEUED))  # (its worker went: queued again)
    for _ in range(4):  # (the server answers each segment: still queued)
        time.sleep(0.5)
        note.seen(op(re_pb2.ExecutionStage.QUEUED))
    note.cancel()
    assert len(warned) == 1 and warned[0].startswith("//:t: still queued"), warned
    done = exec_layer._QueuedNote(warned.append, "//:u", "grpc://x", 0.3, threading.Lock())
    done.cancel()
    done.seen(op(re_pb2.ExecutionStage.QUEUED))  # (after the wait ended: never armed again)
    time.sleep(0.5)
    assert len(warned) == 1, warned


def test_a_worker_whose_server_is_down_says_so_once_a_minute_per_slot(tmp_path: pathlib.Path) -> None:
    """It logged a line per slot every 2 s while the server was down (50 lines in 50 s with
    two slots: the remote CI user)."""
    import sys

    p = subprocess.Popen([sys.executable, "-m", "buildtool", "worker", "--server", "grpc://127.0.0.1:1",
                          "--capacity", "2", "--work-dir", str(tmp_path / "w"), "--remote-timeout", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(6.5)  # (three retries of each slot's at 2 s)
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    said = [line for line in out.splitlines() if "CreateBotSession failed" in line]
    assert len(said) == 2 and {re.search(r"slot \d", line).group() for line in said} == {"slot 0", "slot 1"}, out  # type: ignore[union-attr]


def test_a_stopping_worker_hands_back_the_leases_it_never_started() -> None:
    """A worker stopped while its long poll was out: the lease that poll brought was neither
    run nor handed back, and the job sat EXECUTING on a bot that was gone until its
    keepalive ran out (~40 s, the build silent meanwhile).  Such a lease is reported done
    with UNAVAILABLE, which the server queues again; the lease being run is not among them
    (_hand_back reports it)."""
    import threading

    from buildtool.remote.protos.google.devtools.remoteworkers.v1test2 import bots_pb2
    from buildtool.remote.worker import CODE_UNAVAILABLE, Running, Worker

    session = bots_pb2.BotSession(name="s")
    session.leases.add(id="new", state=bots_pb2.PENDING)
    session.leases.add(id="mine", state=bots_pb2.PENDING)
    session.leases.add(id="old", state=bots_pb2.COMPLETED)
    running = Running("mine", threading.Thread(target=lambda: None))
    assert Worker._decline_unstarted(session, running) == ["new"]
    states = {lease.id: (lease.state, lease.status.code) for lease in session.leases}
    assert states == {"new": (bots_pb2.COMPLETED, CODE_UNAVAILABLE), "mine": (bots_pb2.PENDING, 0),
                      "old": (bots_pb2.COMPLETED, 0)}, states


def test_an_idle_slot_of_a_stopping_worker_ends_its_session() -> None:
    """A worker stopped while idle said nothing: BuildGrid gave the next action to the gone
    bot's session, where it sat EXECUTING ~30 s until the keepalive ran out (a rollout of the
    worker farm).  Each slot's session ends with BOT_TERMINATING, leases or not."""
    from buildtool.remote.protos.google.devtools.remoteworkers.v1test2 import bots_pb2
    from buildtool.remote.worker import Worker

    sent: list[tuple[str, int, list[str]]] = []

    class Bots:
        def UpdateBotSession(self, req: Any, timeout: float, metadata: Any) -> Any:
            sent.append((req.name, req.bot_session.status, [lease.id for lease in req.bot_session.leases]))
            return req.bot_session

    w = Worker.__new__(Worker)
    w.bots, w.metadata = Bots(), ()
    w._leave(0, bots_pb2.BotSession(name="idle"), None)
    busy = bots_pb2.BotSession(name="late")
    busy.leases.add(id="new", state=bots_pb2.PENDING)
    w._leave(1, busy, None)
    assert sent == [("idle", bots_pb2.BOT_TERMINATING, []), ("late", bots_pb2.BOT_TERMINATING, ["new"])], sent


def test_an_action_no_worker_takes_gets_one_note(stack: Stack, make_workspace: Callable[..., Workspace]) -> None:
    """Six 6-second actions on two workers of two slots each, with a 3 s remote timeout (the
    note comes after 1.5 of it, 4.5 s: a server silent for one segment is unavailable instead):
    the two that wait in the queue say so, once for the build; the four executing at once do
    not, though they too take longer than the timeout.  (With 1.5 s and 4 s, CI's busy machine
    once took longer than the timeout to hand even the first four to the workers.)"""
    ws = make_workspace("queued")
    ws.build_file("", """
        [genrule(name=f"q{i}", outs=[f"q{i}.txt"], cmd=f"sleep 6; echo {i} > $@") for i in range(6)]
    """)
    r = ws.build("--remote-executor", stack.url, "--remote-jobs", "6", "-j", "6", "--remote-timeout", "3")
    assert r.rc == 0, r.output
    notes = [ln for ln in r.stderr.splitlines() if "still queued on the remote executor" in ln]
    assert len(notes) == 1, r.stderr + "\n" + stack.worker_logs()  # (two wait: one cause, one line)
    assert "after 4.5 s (no worker connected, or all busy; other actions may be waiting too)" in notes[0], notes
    assert "running it locally" not in r.stderr
    assert [ws.read(f"q{i}.txt") for i in range(6)] == [f"{i}\n" for i in range(6)]


def test_an_action_longer_than_the_remote_timeout_is_followed_to_its_end(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """The Operation stream is followed in segments of --remote-timeout (WaitExecution after
    each): an action that runs longer is neither run again, nor locally, nor cancelled."""
    ws = make_workspace("long")
    ws.build_file("", 'genrule(name="long", outs=["l.txt"], cmd="sleep 3.5; echo long > $@")\n')
    seen = stack.cancellations()
    r = ws.build("--remote-executor", stack.url, "--remote-timeout", "1")
    assert r.rc == 0 and ws.read("l.txt") == "long\n", r.output
    assert "running it locally" not in r.stderr and "unavailable" not in r.stderr, r.stderr
    assert "executed remotely" in r.by_label["//:long"]["reason"], r.by_label["//:long"]
    assert stack.cancellations() == seen, stack.worker_logs()


def test_a_server_that_stops_answering_mid_action_is_left_for_local_runs(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """The execution server frozen (SIGSTOP) while an action ran there: the build waited in
    silence for the action's whole deadline (an hour).  Now a --remote-timeout segment with
    no word from the server trips the breaker: one warning, the action runs here."""
    ws = make_workspace("frozen")
    ws.home.mkdir(parents=True, exist_ok=True)
    marker = ws.home / "remote-started"
    ws.build_file("", f'genrule(name="f", outs=["f.txt"], cmd="touch {marker}; sleep 3; echo f > $@")\n')
    env = conftest_env(ws)
    p = subprocess.Popen([conftest.BUILDTOOL, "build", "--remote-executor", stack.url, "--remote-timeout", "2"],
                         cwd=ws.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = stack.server.proc.pid
    stopped = False
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        os.killpg(pid, signal.SIGSTOP)
        stopped = True
        out, err = p.communicate(timeout=40)
    finally:
        if stopped:
            os.killpg(pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 0, out + err
    assert "remote execution unavailable" in err and "said nothing for 2 s" in err, err
    assert ws.read("f.txt") == "f\n"


def test_broken_operation_stream_is_resumed_with_wait_execution(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """The connection to the server drops while an action runs: the client follows the same
    operation with WaitExecution instead of running the action again or locally."""
    ws = make_workspace("wait")
    ws.home.mkdir(parents=True, exist_ok=True)
    marker = ws.home / "wait-started"
    ws.build_file("", f"""
        genrule(name="slow", outs=["s.txt"], cmd="touch {marker}; sleep 3; echo finished > $@")
    """)
    proxy = remote_servers.TcpProxy(int(stack.url.rsplit(":", 1)[1]))
    events = ws.home / "wait-events.jsonl"
    p = subprocess.Popen([conftest.BUILDTOOL, "build", "--remote-executor", proxy.url, "--events", str(events)],
                         cwd=ws.root, env=conftest_env(ws), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the remote action never started"
            time.sleep(0.05)
        proxy.cut()
        out, err = p.communicate(timeout=60)
    finally:
        proxy.close()
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert proxy.cut_count >= 1
    assert p.returncode == 0, out + err
    assert "running it locally" not in err and "unavailable" not in err, err
    _, evs = conftest.read_events(events)
    [ev] = evs
    assert ev["status"] == "ran" and ev.get("executed") == "remote", ev
    assert ws.read("s.txt") == "finished\n"
    [totals] = conftest.remote_totals(events)
    assert (totals["executed"], totals["fallbacks"]) == (1, 0), totals


def test_local_attribute_is_checked(make_workspace: Callable[..., Workspace]) -> None:
    ws = make_workspace("attr")
    ws.build_file("", """
        genrule(name="a", outs=["a.txt"], cmd="echo a > $@", local="yes")
    """)
    rc, _, err = ws.run("build", "//:a")
    assert rc == 2 and "attribute 'local' must be True or False" in err, err


def test_a_test_pass_from_the_executors_action_cache_is_reported_cached(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """A second checkout: the server answers the test from its action cache; nothing ran,
    so it is a cached pass (as Bazel says), not "PASSED in 0.00s ... 1 executed"."""
    tag = f"{time.time_ns()}"
    a, b = make_workspace("ac-a"), make_workspace("ac-b")
    for ws in (a, b):
        ws.build_file("", f'test(name="t", cmd="echo {tag}")')
    assert a.build("--remote-executor", stack.url, "//:t", command="test").rc == 0
    r = b.build("--remote-executor", stack.url, "//:t", command="test")
    assert r.rc == 0 and r.by_label["//:t"]["test"] == "cached", r.output
    assert "PASSED (cached)" in r.stdout, r.stdout
    # ... and counted as restored, not ran (a dashboard counting "ran" counted it as run)
    assert r.status("//:t") == "restored" and "1 restored" in r.stdout and " ran" not in r.stdout, r.stdout
    # (its events said "cache": "none" and "executed remotely on ... (result from the remote
    # action cache)" beside "no cache entry": where the result came from is the remote)
    ev = r.by_label["//:t"]
    assert ev["cache"] == "remote" and "answered from the remote executor's action cache (run before on" \
        in ev["reason"] and "executed remotely on" not in ev["reason"], ev


def test_a_remote_test_gets_every_file_its_dependencies_read_at_any_depth(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """A test's key holds its dependencies' closure digests, not their files: its remote
    input root must still hold the data file two levels down that the script it runs
    reads, and editing that file (the script comes out byte for byte the same) must run
    the test again, remotely, with the new file, as --remote-download minimal must fetch
    the files left remote below a test that runs here."""
    ws = make_workspace("closure")
    ws.write("lib/data.in", "ok\n")
    ws.build_file("lib", 'genrule(name="data", srcs=["data.in"], outs=["data.txt"], cmd="cp $< $@")\n')
    ws.build_file("tool", 'genrule(name="check", srcs=["//lib:data"], outs=["check.sh"], '
                          'cmd="printf \'grep -qx ok lib/data.txt && grep -qx ok lib/data.in\\\\n\' > $@")\n')
    ws.build_file("", 'test(name="t", srcs=["//tool:check"], cmd="sh tool/check.sh")\n'
                      'test(name="here", srcs=["//tool:check"], cmd="sh tool/check.sh", local=True)\n')
    remote = ("--remote-executor", stack.url)
    r = ws.build(*remote, "//:t", command="test")
    assert r.rc == 0 and r.by_label["//:t"].get("executed") == "remote", r.output + stack.worker_logs()
    ws.write("lib/data.in", "broken\n")
    r = ws.build(*remote, "//:t", command="test")
    assert r.rc == 1 and r.by_label["//:t"].get("executed") == "remote", r.output + stack.worker_logs()
    assert ws.read("tool/check.sh").startswith("grep -qx ok lib/data.txt")  # (the same script)
    ws.write("lib/data.in", "ok\nnew\n")  # (new keys: run remotely, left there)
    r = ws.build(*remote, "--remote-download", "minimal", "//:here", command="test")
    assert r.rc == 0 and r.by_label["//:here"]["test"] == "passed", r.output + stack.worker_logs()
    assert r.by_label["//lib:data"].get("executed") == "remote", r.output
    assert "executed" not in r.by_label["//:here"], r.by_label["//:here"]
    assert ws.read("lib/data.txt") == "ok\nnew\n"  # fetched: the test's script reads it


def test_an_action_the_executor_answers_from_its_action_cache_is_restored_not_ran(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """A second checkout: the executor answers from its action cache, nothing runs; the
    console said "ran //:g", the summary "1 ran" and `cache stats` counted a run, beside
    the executor's own "(1 from its cache)". A hit is "restored", as a remote cache's is."""
    tag = f"{time.time_ns()}"
    a, b = make_workspace("acg-a"), make_workspace("acg-b")
    for ws in (a, b):
        ws.build_file("", f'genrule(name="g", outs=["g.txt"], cmd="echo {tag} > $@")')
    assert a.build("--remote-executor", stack.url, "//:g").rc == 0
    r = b.build("--remote-executor", stack.url, "//:g")
    assert r.rc == 0 and r.status("//:g") == "restored" and r.by_label["//:g"]["cache"] == "remote", r.output
    assert "restored //:g" in r.stdout and "1 restored" in r.stdout and "ran" not in r.stdout.split("critical")[0], \
        r.stdout
    assert b.read("g.txt") == f"{tag}\n"
    rc, out, _ = b.run("cache", "stats")
    assert rc == 0 and "(0 restored, 0 adopted, 0 ran)" not in out and "1 restored" in out, out
    import sqlite3

    import cache_verify
    with contextlib.closing(sqlite3.connect(cache_verify.db_path(b.cache))) as db:  # (its run's time, for `plan`)
        assert db.execute("SELECT seconds FROM durations WHERE label = '//:g'").fetchone() is not None
    again = b.build("--remote-executor", stack.url, "//:g")  # (recorded as any restore: a no-op now)
    assert again.rc == 0 and again.with_status("ran", "restored") == set(), again.output


def test_a_test_to_rerun_is_executed_not_answered_from_the_action_cache(
    stack: Stack, make_workspace: Callable[..., Workspace], tmp_path: pathlib.Path
) -> None:
    """The server's action cache holds the pass of this key; --no-cache-tests, and then a
    test that failed last time with the key, must execute (skip_cache_lookup), not get
    that pass back."""
    flag = tmp_path / "broken"
    ws = make_workspace("rerun")
    ws.build_file("", f'test(name="t", cmd="test ! -e {flag}")')
    remote = ("--remote-executor", stack.url, "//:t")
    assert ws.build(*remote, command="test").rc == 0
    flag.write_text("")
    r = ws.build(*remote, "--no-cache-tests", command="test")
    assert r.rc == 1 and r.by_label["//:t"].get("executed") == "remote", r.output + stack.worker_logs()
    r = ws.build(*remote, command="test")
    assert r.rc == 1 and r.by_label["//:t"].get("executed") == "remote", r.output
    flag.unlink()
    r = ws.build(*remote, command="test")
    assert r.rc == 0 and r.by_label["//:t"]["reason_code"] == "failed_before", r.output


@pytest.mark.parametrize("bad", ["A" * 64, "a" * 63, "a" * 65, "ab cd", "a" * 62 + ":1", ""])
def test_a_result_naming_a_malformed_digest_is_refused(bad: str) -> None:
    """A result's digest goes into a resource name and, left remote, into the build record:
    one that is not 64 lowercase hex digits makes the action fall back to a local run."""
    from buildtool.remote import exec_layer
    from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
    from buildtool.remote.store import RemoteError

    good = "0123456789abcdef" * 4
    assert exec_layer._checked(re_pb2.Digest(hash=good, size_bytes=3)).hash == good
    with pytest.raises(RemoteError, match="malformed digest"):
        exec_layer._checked(re_pb2.Digest(hash=bad, size_bytes=3))


def test_an_input_left_remote_that_the_server_lost_is_said_so_not_as_a_missing_local_file(
        tmp_path: pathlib.Path) -> None:
    """The server's CAS lost an output left there (restarted, evicted): uploading the blob
    opened the local file it stands for, which never existed ("[Errno 2] No such file or
    directory: '/abs/gen/b.txt'").  (A fake store: the real path needs a server that forgets.)"""
    import blake3

    from buildtool.remote import exec_layer
    from buildtool.remote.action import TargetView
    from buildtool.remote.options import Endpoint, RemoteOptions
    from buildtool.remote.store import RemoteError

    class LostStore:
        digest_fn = "sha256"

        def find_missing(self, blobs: dict) -> list:
            return list(blobs)

        def upload(self, blobs: dict) -> int:
            for src in blobs.values():
                if isinstance(src, str):
                    open(src, "rb").close()
            return 0

    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "a.txt").write_text("a\n")
    ex = exec_layer.RemoteExecutor(Endpoint("grpc", "127.0.0.1", 1, ""), RemoteOptions(), str(tmp_path),
                                   str(tmp_path / "tmp"), lambda _m: None)
    t = TargetView("genrule", "gen", "cat a.txt b.txt > c.txt", None, None, ("gen/c.txt",),
                   ["gen/a.txt", "gen/b.txt"], None)
    desc = {"shell": "sh", "env": {}, "tools": {}, "extra": {},
            "inputs": {"gen/a.txt": blake3.blake3(b"a\n").hexdigest(),
                       "gen/b.txt": "remote:sha256:" + "bb" * 32 + ":2"}}
    with pytest.raises(RemoteError, match=r"^input gen/b.txt was left in its CAS \(--remote-download\) and the "
                                          r"server no longer has it$"):
        ex._run(LostStore(), t, t.inputs, desc, 0.0, False)  # type: ignore[arg-type]
    # A source deleted since it was hashed is not "left in the CAS": the upload's own error.
    (tmp_path / "gen" / "a.txt").unlink()
    desc["inputs"]["gen/b.txt"] = blake3.blake3(b"b\n").hexdigest()
    (tmp_path / "gen" / "b.txt").write_text("b\n")
    with pytest.raises(OSError):
        ex._run(LostStore(), t, t.inputs, desc, 0.0, False)  # type: ignore[arg-type]


def test_a_chain_left_remote_and_lost_is_rebuilt_by_the_same_command_not_one_level_a_build(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """p -> gen -> use, p and gen left in the executor's CAS, which then lost them: only
    gen's record entry was dropped, so the next build failed again on p's output (a chain
    k deep took k failing builds); and the build that found them lost failed (exit 1),
    where Bazel retries the invocation: the same command builds again, the chain anew."""
    ws = make_workspace("lost-chain")
    ws.build_file("", """
        genrule(name="p", outs=["p.txt"], cmd="echo p > $@")
        genrule(name="gen", srcs=[":p"], outs=["g.txt"], cmd="cat p.txt > $@; echo g >> $@")
        genrule(name="use", srcs=[":gen"], outs=["u.txt"], cmd="cat g.txt > $@", local=True)
    """)
    r = ws.build("--remote-executor", stack.url, "--remote-download", "minimal", "//:gen")
    assert r.rc == 0 and not ws.exists("g.txt") and not ws.exists("p.txt"), r.output
    dead = f"grpc://127.0.0.1:{remote_servers.free_port()}"  # (its CAS is gone with it)
    args = ("--remote-executor", dead, "--remote-timeout", "3", "--remote-download", "minimal", "//:use")
    lost = ws.build(*args)  # the executor is unreachable: the retry runs both here, then use
    assert lost.rc == 0, lost.output
    assert "//:gen, //:p run again on the next build" in lost.stdout + lost.stderr, lost.output
    assert "building again, their producers anew (retry 1 of 2)" in lost.stderr, lost.output
    assert lost.ran == {"//:p", "//:gen", "//:use"}, lost.output  # (--events: the last build's)
    assert ws.read("u.txt") == "p\ng\n"


def test_a_server_busy_through_every_retry_is_left_for_the_rest_of_the_build(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """RESOURCE_EXHAUSTED after every retry (a used-up quota) cost each action ~12 s before
    it ran here; the first such action now trips the breaker: one warning, the rest local.
    (A unit test of the retry policy: the server is faked, nothing is contacted.)"""
    from buildtool.remote import exec_layer
    from buildtool.remote.options import RemoteOptions, parse_endpoint
    from buildtool.remote.store import RemoteError

    said: list[str] = []
    ex = exec_layer.RemoteExecutor(parse_endpoint("grpc://127.0.0.1:9", grpc_only=True), RemoteOptions(),
                                   str(tmp_path), str(tmp_path / "tmp"), said.append)
    calls: list[str] = []

    def busy(*_: object) -> None:
        calls.append("run")
        raise RemoteError("Execute: RESOURCE_EXHAUSTED: too many concurrent requests")

    monkeypatch.setattr(ex, "_get", lambda: object())
    monkeypatch.setattr(ex, "_run", busy)
    monkeypatch.setattr(exec_layer.time, "sleep", lambda s: None)
    t = type("T", (), {"label": "//:a", "local": False, "depfile": None, "pool": None})()
    assert ex.run(t, None, {}, "//:a") is None
    assert len(calls) == exec_layer.BUSY_RETRIES + 1
    assert not ex.wants(t)  # the breaker tripped: the next actions run here at once
    assert len(said) == 1 and "remote execution unavailable (still busy after 6 retries" in said[0], said


def test_a_pyrule_or_a_command_too_long_for_a_command_line_runs_here(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """A worker's command line refused them (exit 127, "Argument list too long"): the
    action runs here, where they go through a file.  A genrule over a glob() of 1,500 long
    paths: green here, red remotely."""
    ws = make_workspace("longargs")
    ws.write("mk.py", "def run(srcs, outs, x):\n    open(outs[0], 'w').write(str(len(x)))\n")
    ws.build_file("", 'pyrule(name="p", fn="mk:run", outs=["o.txt"], kwargs={"x": "y" * 150000})\n'
                      'genrule(name="g", outs=["g.txt"], cmd="echo " + "z" * 150000 + " | wc -c > $@")\n')
    r = ws.build("--remote-executor", stack.url)
    assert r.rc == 0 and ws.read("o.txt") == "150000" and ws.read("g.txt").strip() == "150001", r.output
    assert r.stderr.count("too long for a remote command line") == 2 and "; running it locally" in r.stderr, r.stderr


def test_a_target_with_a_name_that_is_not_utf8_runs_here(
    stack: Stack, make_workspace: Callable[..., Workspace]
) -> None:
    """No REAPI Command can name the file (protobuf strings): an internal
    UnicodeEncodeError failed the target; it runs here, saying why."""
    ws = make_workspace("notutf8")
    (ws.root / os.fsdecode(b"n\xe9.txt")).write_text("x\n")
    ws.build_file("", 'genrule(name="g", srcs=glob(["n*.txt"]), outs=["o.txt"], cmd="cp $< $@")\n')
    r = ws.build("--remote-executor", stack.url)
    assert r.rc == 0 and ws.read("o.txt") == "x\n" and r.status("//:g") == "ran", r.output
    assert "//:g: remote execution failed (its input 'n\\xe9.txt' is not UTF-8" in r.stderr, r.stderr


@pytest.mark.parametrize(("extra", "said"), [
    ("twice", "names output 'g.txt' twice"),
    ("undeclared", "names output '../../escape.txt', which the target does not declare"),
    ("symlink", "has output directories or symlinks"),
])
def test_an_execution_result_is_checked_as_a_cache_entry_is(tmp_path: pathlib.Path, extra: str, said: str) -> None:
    """A result naming g.txt twice took the last one's content (the build was OK with it);
    an undeclared path or an extra symlink was passed over without a word.  (A unit test:
    the result is made here, nothing is contacted.)"""
    from buildtool.remote import exec_layer
    from buildtool.remote.action import TargetView
    from buildtool.remote.options import RemoteOptions, parse_endpoint
    from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
    from buildtool.remote.store import RemoteError

    ex = exec_layer.RemoteExecutor(parse_endpoint("grpc://127.0.0.1:9", grpc_only=True), RemoteOptions(),
                                   str(tmp_path), str(tmp_path / "tmp"), lambda msg: None)
    view = TargetView("genrule", "p", "echo > g.txt", None, None, ("p/g.txt",), [], None)
    r = re_pb2.ActionResult(exit_code=0)
    r.output_files.add(path="g.txt", digest=re_pb2.Digest(hash="a" * 64, size_bytes=6))
    if extra == "twice":
        r.output_files.add(path="g.txt", digest=re_pb2.Digest(hash="b" * 64, size_bytes=7))
    elif extra == "undeclared":
        r.output_files.add(path="../../escape.txt", digest=re_pb2.Digest(hash="b" * 64, size_bytes=7))
    else:
        r.output_symlinks.add(path="link", target="g.txt")
    st = type("Store", (), {"digest_fn": "sha256"})()
    with pytest.raises(RemoteError, match=re.escape(said)):
        ex._outputs(st, view, r, str(tmp_path), True)  # type: ignore[arg-type]


def test_a_worker_whose_slots_all_end_on_their_own_exits_1_with_a_line_each(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A slot that raised (a header grpcio refused) printed a thread's traceback, and the
    worker exited 0 serving nothing: a supervisor saw a clean exit and left it down."""
    from buildtool.remote.worker import Worker

    class Broken(Worker):
        def slot(self, slot: int) -> None:
            raise TypeError(f"slot {slot} cannot start")

    w = Broken(f"grpc://127.0.0.1:{remote_servers.free_port()}", "", 2, str(tmp_path), 5.0, {})
    assert w.serve() == 1
    err = capsys.readouterr().err
    assert "slot 0 stopped: TypeError: slot 0 cannot start" in err and "slot 1 stopped" in err, err
    assert "Traceback" not in err and "every slot stopped: exiting with status 1" in err, err


def test_a_worker_stopped_mid_action_hands_its_lease_back_at_once(
    tmp_path_factory: pytest.TempPathFactory, make_workspace: Callable[..., Workspace]
) -> None:
    """SIGTERM to `buildtool worker` (a CI pool scaling down) while it ran an action: the lease
    was dropped silently (the server waited out the session's keepalive, then ran the action
    again from the start: 52-62 s for a 25 s build), or reported as "cancelled by the server",
    which nothing had asked for (the client gave up on the remote and ran it here).  It
    reports the lease at once as UNAVAILABLE, which the server gives to another worker."""
    work = tmp_path_factory.mktemp("rexec-stop")
    first = second = None
    with _buildgrid_exec(work) as server:
        try:
            first = rx.start_worker(work, server.url, 0, capacity=1)
            ws = make_workspace("stop")
            ws.home.mkdir(parents=True, exist_ok=True)
            marker = ws.home / "remote-started"
            # The first run (on the first worker) is slow; the one after it is quick.
            ws.build_file("", f'genrule(name="slow", outs=["s.txt"], cmd="if [ ! -e {marker} ]; then touch {marker}; '
                              f'sleep 60; fi; echo done > $@")\n')
            p = subprocess.Popen([conftest.BUILDTOOL, "build", "--remote-executor", server.url, "--events", "ev.jsonl"],
                                 cwd=ws.root, env=conftest_env(ws), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
            try:
                deadline = time.monotonic() + 60
                while not marker.exists():
                    if p.poll() is not None:
                        pytest.fail(f"the build ended before the remote action started: {p.communicate()}")
                    assert time.monotonic() < deadline, "the remote action never started\n" + first.log_tail()
                    time.sleep(0.05)
                stopped = time.monotonic()
                os.killpg(first.proc.pid, signal.SIGTERM)
                assert first.proc.wait(timeout=20) == 0, first.log_tail()
                second = rx.start_worker(work, server.url, 1, capacity=1)
                out, err = p.communicate(timeout=60)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            took = time.monotonic() - stopped
            assert p.returncode == 0 and ws.read("s.txt") == "done\n", out + err + first.log_tail()
            assert "running it locally" not in err, err  # (not given up on: another worker ran it)
            [ev] = [json.loads(line) for line in ws.read("ev.jsonl").splitlines()[1:] if '"label"' in line]
            assert ev["executed"] == "remote", ev
            assert took < 25, (took, err, first.log_tail(), second.log_tail())  # (the keepalive's 30 s not waited out)
            assert "the worker was stopped (a signal) while the action ran" in first.log_tail(), first.log_tail()
            assert "cancelled by the server" not in first.log_tail(), first.log_tail()
        finally:
            for w in (first, second):
                if w is not None:
                    rx.stop_gracefully(w)


def _bots(answer: Callable[[str, Any], bytes]) -> Any:
    """A gRPC handler whose every call, whatever its method, is ``answer(method, context)``
    (a bots service that refuses, flaps or makes sessions as a test needs)."""
    import grpc

    class Handler(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(lambda request, context: answer(details.method, context))

    return Handler()


@contextlib.contextmanager
def _worker_against(
    handler: Any, tmp_path: pathlib.Path, instance: str
) -> Iterator[tuple[threading.Thread, list[int]]]:
    """A two-slot Worker serving (on a thread) against a gRPC server on 127.0.0.1 whose every
    call ``handler`` answers; yields the thread and the list its exit status goes to."""
    from concurrent import futures

    import grpc

    from buildtool.remote.worker import Worker

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        w = Worker(f"grpc://127.0.0.1:{port}", instance, 2, str(tmp_path), 5.0, {})
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(w.serve()), daemon=True)
        t.start()
        yield t, done
        w.stop.set()
        t.join(30)
    finally:
        server.stop(0)


def test_a_worker_whose_first_bot_session_is_refused_exits_1(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`--instance nosuch`: BuildGrid answers INVALID_ARGUMENT, and the worker retried every
    2 s forever, where a supervisor or CI needs an exit status.  It retries a refusal for a
    while (REFUSED_FOR_S: a proxy before a server still starting refuses too), here 3 s.  (A
    gRPC server on 127.0.0.1 that refuses every call stands for the server.)"""
    import grpc

    from buildtool.remote import worker

    monkeypatch.setattr(worker, "REFUSED_FOR_S", 3.0)

    def refuse(method: str, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Invalid instance name: [nosuch]")

    with _worker_against(_bots(refuse), tmp_path, "nosuch") as (t, done):
        t.join(30)
    err = capsys.readouterr().err
    assert done == [1], err
    said = ("CreateBotSession refused for 3 s: INVALID_ARGUMENT Invalid instance name: [nosuch]; "
            "check --server, --instance")
    assert said in err and "every slot was refused a bot session: exiting with status 1" in err, err


def test_a_refusal_after_a_session_was_made_is_retried(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """One slot had its session, the other's was refused: that slot stopped for good, and
    the worker served on with half its capacity, unsaid (the review).  Once any slot had a
    session, a refusal is the server's passing state: retried."""
    import grpc

    from buildtool.remote import worker
    from buildtool.remote.protos.google.devtools.remoteworkers.v1test2 import bots_pb2

    monkeypatch.setattr(worker, "REFUSED_FOR_S", 3.0)
    calls: list[str] = []

    def first_only(method: str, context: grpc.ServicerContext) -> bytes:
        calls.append(method)
        if len(calls) == 1 and method.endswith("/CreateBotSession"):
            time.sleep(1)  # (the other slot's refusal comes first)
            return bots_pb2.BotSession(name="sessions/one").SerializeToString()
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "the auth service is down")

    with _worker_against(_bots(first_only), tmp_path, "") as (t, done):
        t.join(6)  # (past REFUSED_FOR_S: still serving)
        assert t.is_alive() and not done, capsys.readouterr().err
    assert done == [0] and "exiting with status 1" not in capsys.readouterr().err


def test_a_worker_refused_until_its_server_is_up_serves_with_every_slot_or_exits(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A proxy refusing until its server is up, about when the slots' refusals run out: a
    slot stopped, the other got its session, and the worker served on at half capacity for
    good (the third review).  Either every slot serves or the worker exits 1."""
    import grpc

    from buildtool.remote import worker
    from buildtool.remote.protos.google.devtools.remoteworkers.v1test2 import bots_pb2

    monkeypatch.setattr(worker, "REFUSED_FOR_S", 3.0)
    up_at = time.monotonic() + 4.5

    def up_later(method: str, context: grpc.ServicerContext) -> bytes:
        if time.monotonic() < up_at:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "proxy: no route yet")
        if method.endswith("/UpdateBotSession"):
            time.sleep(1)  # (a long poll without work)
        return bots_pb2.BotSession(name="sessions/s").SerializeToString()

    with _worker_against(_bots(up_later), tmp_path, "") as (t, done):
        t.join(9)
    err = capsys.readouterr().err
    assert done == [1] or err.count(": bot session sessions/s") == 2, (done, err)


def test_refusals_count_30_s_on_end_an_outage_between_them_starts_again(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refusal, then the server down, then one more refusal: the count of the first went
    on through the outage and both slots stopped at the second (the third review)."""
    import grpc

    from buildtool.remote import worker
    from buildtool.remote.protos.google.devtools.remoteworkers.v1test2 import bots_pb2

    monkeypatch.setattr(worker, "REFUSED_FOR_S", 3.0)
    t0 = time.monotonic()

    def flapping(method: str, context: grpc.ServicerContext) -> bytes:
        now = time.monotonic() - t0
        if now < 1 or 5 <= now < 7:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "proxy: no route yet")
        if now < 5:
            context.abort(grpc.StatusCode.UNAVAILABLE, "down")
        if method.endswith("/UpdateBotSession"):
            time.sleep(1)
        return bots_pb2.BotSession(name="sessions/s").SerializeToString()

    with _worker_against(_bots(flapping), tmp_path, "") as (t, done):
        t.join(11)
    err = capsys.readouterr().err
    assert done == [0] and err.count(": bot session sessions/s") == 2, (done, err)
