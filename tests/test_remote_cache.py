"""Remote cache end to end against real servers on 127.0.0.1: BuildGrid 0.4.4 (REAPI over
gRPC) and nginx with WebDAV (Bazel's HTTP cache protocol).  Two checkouts with separate local
caches stand for two machines."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Workspace

from buildtool.digest import hash_bytes

pytest.importorskip("grpc", reason="the 'remote' extra (grpcio, protobuf) is not installed: pip install '.[remote]'")
pytest.importorskip("google.protobuf", reason="the 'remote' extra (protobuf) is not installed")

import remote_servers

BIG = 4 * 1024 * 1024 + 123  # over the 3 MiB batch cap: goes through ByteStream


def _start(kind: str, workdir: Path) -> remote_servers.Server:
    try:
        if kind == "grpc":
            return remote_servers.start_buildgrid_cache(workdir)
        return remote_servers.start_nginx(workdir)
    except remote_servers.Unavailable as e:
        pytest.skip(f"{kind} cache server unavailable: {e}")


@pytest.fixture(scope="module")
def bgd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[remote_servers.Server]:
    s = _start("grpc", tmp_path_factory.mktemp("bgd"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[remote_servers.Server]:
    s = _start("http", tmp_path_factory.mktemp("nginx"))
    yield s
    s.stop()


@pytest.fixture(params=["grpc", "http"])
def server(request: pytest.FixtureRequest) -> remote_servers.Server:
    return request.getfixturevalue("bgd" if request.param == "grpc" else "nginx")


def _project(ws: Workspace, tag: str) -> None:
    """A multi-package workspace: a generator, an executable output, a big blob, stdout."""
    ws.write("gen/names.txt", f"alpha\nbeta\n{tag}\n")
    ws.write("data/big.bin", hashlib.sha256(tag.encode()).digest() * (BIG // 32) + b"tail")
    ws.build_file("gen", """
        genrule(name="header", srcs=["names.txt"], outs=["names.h"],
                cmd="sed 's/.*/#define N_& 1/' $< > $@ && echo generated header")
    """)
    ws.build_file("data", """
        genrule(name="pack", srcs=["big.bin"], outs=["big.copy", "tool.sh"],
                cmd="cp big.bin big.copy && printf '#!/bin/sh\\necho tool\\n' > tool.sh && chmod +x tool.sh")
    """)
    ws.build_file("", """
        genrule(name="app", srcs=["//gen:header", "//data:pack"], outs=["out/app.txt"],
                cmd="cat gen/names.h > $@ && wc -c < data/big.copy >> $@ && sh data/tool.sh >> $@")
    """)


OUTPUTS = ["gen/names.h", "data/big.copy", "data/tool.sh", "out/app.txt"]


def _checkouts(make_workspace: Callable[..., Workspace], tag: str) -> tuple[Workspace, Workspace]:
    a = make_workspace("machine-a")
    _project(a, tag)
    b = make_workspace("machine-b")
    _project(b, tag)
    assert a.cache != b.cache
    return a, b


def test_second_machine_builds_with_zero_local_commands(
    server: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    a, b = _checkouts(make_workspace, f"zero-{server.url}-{time.time_ns()}")
    first = a.build("--remote-cache", server.url)
    assert first.rc == 0, first.output
    assert first.ran == {"//gen:header", "//data:pack", "//:app"}
    assert "3 uploaded" in first.stdout, first.stdout
    [up] = first.remote
    assert (up["role"], up["endpoint"], up["hits"], up["misses"], up["uploads"]) == ("cache", server.url, 0, 3, 3), up
    assert up["bytes_up"] > 3 * 1024 * 1024 and up["bytes_down"] == 0 and up["disabled"] is None, up

    second = b.build("--remote-cache", server.url)
    assert second.rc == 0, second.output
    assert second.ran == set(), second.output
    for e in second.events:
        assert (e["status"], e["cache"]) == ("restored", "remote"), e
    for p in OUTPUTS:
        assert a.path(p).read_bytes() == b.path(p).read_bytes(), p
    assert os.access(b.path("data/tool.sh"), os.X_OK)
    assert "3 hits, 0 misses" in second.stdout, second.stdout
    [down] = second.remote
    assert (down["hits"], down["misses"], down["uploads"], down["bytes_up"]) == (3, 0, 0, 0), down
    assert down["bytes_down"] > 3 * 1024 * 1024, down
    # The restore went into machine B's local cache: the next restore needs no server.
    for p in OUTPUTS:
        b.path(p).unlink()
    third = b.build("--remote-cache", "grpc://127.0.0.1:1", "--remote-timeout", "2")
    assert third.rc == 0, third.output
    assert [t["hits"] for t in third.remote] == [0], third.remote
    assert {e["cache"] for e in third.events} == {"local"}, third.events


def test_a_remote_hit_whose_outputs_are_already_in_place_says_so(nginx: remote_servers.Server,
                                                                   make_workspace: Callable[..., Workspace]) -> None:
    """A checkout whose outputs are there but whose state is gone: the remote entry matched
    them and nothing was restored, yet the reason said "restored from the remote cache"."""
    import shutil

    url = f"{nginx.url}/adopted-{time.time_ns()}"
    a = make_workspace("adopt-a")
    a.build_file("", 'genrule(name="x", outs=["x.txt"], cmd="echo x > $@")\n')
    assert a.build("--remote-cache", url, "--remote-upload").rc == 0
    shutil.rmtree(a.root / ".buildtool")
    r = a.build("--remote-cache", url, cache=a.root.parent / "fresh-local-cache")
    assert r.rc == 0 and [(e["status"], e["cache"]) for e in r.events] == [("up_to_date", "remote")], r.events
    assert r.events[0]["reason"].endswith("; outputs on disk already match the remote cache's entry"), r.events


def test_a_miss_is_compared_with_the_latest_entry_the_local_cache_got_from_the_remote(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace],
) -> None:
    """The local cache's descriptions were written for actions that ran only: after a
    restore from the remote cache, a fresh checkout's miss was compared with an older run
    (a PATH difference that was not the cause)."""
    import shutil

    url = f"{nginx.url}/described-{time.time_ns()}"
    laptop, ci = make_workspace("laptop"), make_workspace("ci")
    for ws in (laptop, ci):
        ws.build_file("", 'genrule(name="s", srcs=["s.txt"], outs=["s.out"], cmd="cp $< $@")\n')
    laptop.write("s.txt", "v1\n")
    assert laptop.build(env_extra={"PATH": f"/opt/old/bin:{os.environ['PATH']}"}).rc == 0  # (v1, another PATH)
    ci.write("s.txt", "v2\n")
    assert ci.build("--remote-cache", url, "--remote-upload").rc == 0
    laptop.write("s.txt", "v2\n")
    shutil.rmtree(laptop.root / ".buildtool")
    r = laptop.build("--remote-cache", url)
    assert r.rc == 0 and r.by_label["//:s"]["cache"] == "remote", r.output
    shutil.rmtree(laptop.root / ".buildtool")
    laptop.write("s.txt", "v3\n")
    rc, out, _ = laptop.run("explain")
    assert rc == 0 and "differs: input s.txt changed" in out and "PATH" not in out, out


def test_a_binary_grpc_header_is_sent_and_a_key_grpc_refuses_is_said_before_the_build(
        bgd: remote_servers.Server, make_workspace: Callable[..., Workspace]) -> None:
    """A header whose key ends in -bin is binary gRPC metadata: its text value made grpcio
    raise TypeError in every call, so every target failed ("internal error"); a key with a
    character gRPC refuses (HTTP allows it) was the server's "INTERNAL Invalid metadata"."""
    a = make_workspace("bin-a")
    a.build_file("", f'genrule(name="x", outs=["x.txt"], cmd="echo {time.time_ns()} > $@")\n')
    r = a.build("--remote-cache", bgd.url, "--remote-upload", "--remote-header", "x-trace-bin=abc")
    assert r.rc == 0 and "1 uploaded" in r.stdout and "internal error" not in r.output, r.output
    b = make_workspace("bin-b")
    b.build_file("", a.read("BUILD.py"))
    r = b.build("--remote-cache", bgd.url, env_extra={"BUILDTOOL_REMOTE_HEADERS": "x-trace-bin=abc"})
    assert r.rc == 0 and [(e["status"], e["cache"]) for e in r.events] == [("restored", "remote")], r.output
    rc, _, err = b.run("build", "--remote-cache", bgd.url, "--remote-header", "x!y=1")
    assert rc == 2 and "header 'x!y' cannot be sent to a grpc:// endpoint: gRPC metadata keys are" in err, err
    r = b.build("--remote-cache", "http://127.0.0.1:1", "--remote-header", "x!y=1", "--remote-timeout", "2")
    assert r.rc == 0, r.output  # (HTTP takes it)


def test_config_file_and_env_select_the_remote(nginx: remote_servers.Server,
                                               make_workspace: Callable[..., Workspace]) -> None:
    a, b = _checkouts(make_workspace, f"cfg-{time.time_ns()}")
    a.write("buildtool.toml", f'remote_cache = "{nginx.url}/team-x"\n')
    assert a.build().rc == 0
    r = b.build(env_extra={"BUILDTOOL_REMOTE_CACHE": f"{nginx.url}/team-x"})
    assert r.rc == 0, r.output
    assert r.ran == set(), r.output
    # --no-remote-upload: reads only.
    c = make_workspace("machine-c")
    _project(c, f"cfg-other-{time.time_ns()}")
    r = c.build("--remote-cache", f"{nginx.url}/team-x", "--no-remote-upload")
    assert r.rc == 0 and len(r.ran) == 3
    assert "0 uploaded" in r.stdout, r.stdout


def test_credentials_in_the_url_are_sent_as_basic_authentication(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    """``http://USER:PASSWORD@HOST/...`` (bazel-remote's htpasswd, a proxy) authenticates
    every request; the password, percent-encoded in the URL, is never printed."""
    import urllib.parse

    secret = urllib.parse.quote(remote_servers.NGINX_PASSWORD, safe="")
    host = nginx.url.removeprefix("http://")
    locked = f"http://{remote_servers.NGINX_USER}:{secret}@{host}/locked"
    a, b = _checkouts(make_workspace, f"auth-{time.time_ns()}")
    first = a.build("--remote-cache", locked, "--remote-upload")
    assert first.rc == 0 and "3 uploaded" in first.stdout, first.output
    assert [u["endpoint"] for u in first.remote] == [f"{nginx.url}/locked"], first.remote
    second = b.build("--remote-cache", locked)
    assert second.rc == 0 and second.ran == set(), second.output
    for text in (first.output, second.output):
        assert remote_servers.NGINX_PASSWORD not in text and secret not in text
    # Without them the server refuses (401): one warning, the build runs locally.
    c = make_workspace("machine-c")
    _project(c, f"auth-{time.time_ns()}")
    r = c.build("--remote-cache", f"{nginx.url}/locked")
    assert r.rc == 0 and len(r.ran) == 3, r.output
    assert "401" in r.stderr, r.stderr


def test_corrupted_remote_blob_is_detected_and_the_target_reruns(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    tag = f"corrupt-{time.time_ns()}"
    a, b = _checkouts(make_workspace, tag)
    url = f"{nginx.url}/corrupt"  # a prefix of its own on the shared server
    assert a.build("--remote-cache", url).rc == 0
    good = a.path("gen/names.h").read_bytes()
    blob = nginx.workdir / "cache" / "corrupt" / "cas" / hashlib.sha256(good).hexdigest()
    assert blob.exists()
    blob.write_bytes(b"X" * len(good))  # same size, wrong content
    r = b.build("--remote-cache", url)
    assert r.rc == 0, r.output
    assert r.status("//gen:header") == "ran", r.output
    assert "does not verify" in r.stderr, r.stderr
    assert f"(from {url})" in r.stderr, r.stderr  # (the server named, as every other remote warning names it)
    assert b.path("gen/names.h").read_bytes() == good
    assert r.by_label["//data:pack"]["cache"] == "remote"
    # B's rerun sent the good content again (the server's copy said "present" but was not):
    # the next machine restores everything.
    assert blob.read_bytes() == good
    c = make_workspace("machine-c")
    _project(c, tag)
    r = c.build("--remote-cache", url)
    assert r.rc == 0, r.output
    assert r.ran == set(), r.output
    assert c.path("gen/names.h").read_bytes() == good


def test_blobs_evicted_before_their_entries_are_misses_not_a_broken_server(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    """A cleanup of old blobs (remote.md's `find -atime +14 -delete`) leaves entries whose
    blobs are gone: each is that target's miss.  Counted as unusable answers, five of them
    tripped the breaker for the rest of the build, as if the URL were no cache; and each
    was a warning of its own."""
    from buildtool.remote.cache_layer import BAD_IN_A_ROW

    tag = f"evicted-{time.time_ns()}"
    url = f"{nginx.url}/{tag}"
    rules = "\n".join(f'genrule(name="t{i}", outs=["t{i}.txt"], cmd="echo {i} > $@")' for i in range(BAD_IN_A_ROW + 2))
    a = make_workspace("evicted-a")
    a.build_file("", rules)
    assert a.build("--remote-cache", url).rc == 0
    for blob in (nginx.workdir / "cache" / tag / "cas").iterdir():
        blob.unlink()
    b = make_workspace("evicted-b")
    b.build_file("", rules)
    r = b.build("--remote-cache", url, "-j1")
    assert r.rc == 0 and {e["status"] for e in r.events} == {"ran"}, r.output
    # One warning, not one per target (a normal eviction: the rest are misses without a word)
    assert r.stderr.count("is missing (HTTP 404)") == 1, r.stderr
    assert "the server evicted it: later such entries are misses without a word" in r.stderr, r.stderr
    assert "remote cache unavailable" not in r.stderr, r.stderr
    assert r.remote and r.remote[0]["misses"] == BAD_IN_A_ROW + 2 and r.remote[0]["errors"] == 0, r.remote


def test_an_empty_output_needs_no_empty_blob_on_the_server(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    """An entry with an empty output was a miss where the server lacks the empty blob
    (a cache filled by Bazel, which never stores it): its content is known without asking."""
    tag = f"empty-{time.time_ns()}"
    url = f"{nginx.url}/{tag}"
    a = make_workspace("empty-a")
    a.build_file("", 'genrule(name="e", outs=["e.txt"], cmd=": > $@")')
    assert a.build("--remote-cache", url).rc == 0
    blob = nginx.workdir / "cache" / tag / "cas" / hashlib.sha256(b"").hexdigest()
    blob.unlink()
    b = make_workspace("empty-b")
    b.build_file("", 'genrule(name="e", outs=["e.txt"], cmd=": > $@")')
    r = b.build("--remote-cache", url)
    assert r.rc == 0 and r.by_label["//:e"]["cache"] == "remote", r.output
    assert b.read("e.txt") == "" and "missing" not in r.stderr, r.stderr


def _damage_the_header_entry(nginx: remote_servers.Server, prefix: str, damage: Callable[[Any], None]) -> None:
    """Edit the output file of the one action-cache entry naming names.h (//gen:header's), as
    a damaged or hostile cache under ``prefix`` would hold it."""
    from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2

    changed = 0
    for f in (nginx.workdir / "cache" / prefix / "ac").iterdir():
        res = re_pb2.ActionResult()
        res.ParseFromString(f.read_bytes())
        if any(o.path == "names.h" for o in res.output_files):
            damage(res.output_files[0])
            f.write_bytes(res.SerializeToString())
            changed += 1
    assert changed == 1


def test_cache_entry_naming_undeclared_paths_is_refused(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    """An action result that names another path (e.g. ../../etc/x) is a miss, never written."""
    a, b = _checkouts(make_workspace, f"paths-{time.time_ns()}")
    url = f"{nginx.url}/paths"
    assert a.build("--remote-cache", url).rc == 0
    _damage_the_header_entry(nginx, "paths", lambda out: setattr(out, "path", "../../escaped.h"))
    r = b.build("--remote-cache", url)
    assert r.rc == 0, r.output
    assert r.status("//gen:header") == "ran"
    assert "does not declare" in r.stderr
    assert not (b.root.parent / "escaped.h").exists() and not (b.root / "escaped.h").exists()


def test_an_entry_recording_a_failed_run_is_a_miss_with_a_warning(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    """docs/remote.md lists a non-zero exit code among what makes an entry a miss with a
    warning; it was a miss without one."""
    from buildtool.remote.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2

    a, b = _checkouts(make_workspace, f"failed-{time.time_ns()}")
    url = f"{nginx.url}/failed-run"
    assert a.build("--remote-cache", url).rc == 0
    for f in (nginx.workdir / "cache" / "failed-run" / "ac").iterdir():
        res = re_pb2.ActionResult()
        res.ParseFromString(f.read_bytes())
        if any(o.path == "names.h" for o in res.output_files):
            res.exit_code = 1
            f.write_bytes(res.SerializeToString())
    r = b.build("--remote-cache", url)
    assert r.rc == 0 and r.status("//gen:header") == "ran", r.output
    assert "remote cache entry not used: the entry records a failed run (exit code 1)" in r.stderr, r.stderr


def test_an_empty_entry_is_a_miss_not_a_passing_test(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace], tmp_path: Path
) -> None:
    """Zero bytes parse as an ActionResult with exit code 0 and no outputs: a test (which
    declares none) was "PASSED (cached)" without running, failing as it would have."""
    flag = tmp_path / "make-it-fail"
    a, b = _checkouts(make_workspace, f"empty-{time.time_ns()}")
    for ws in (a, b):
        ws.build_file("t", f'test(name="t", cmd="test ! -e {flag}")\n')
    url = f"{nginx.url}/empty-entry"
    assert a.build("--remote-cache", url, command="test").rc == 0
    entries = list((nginx.workdir / "cache" / "empty-entry" / "ac").iterdir())
    assert entries
    for f in entries:
        f.write_bytes(b"")
    flag.write_text("")
    r = b.build("--remote-cache", url, command="test")
    assert r.rc == 1 and r.status("//t:t") == "failed", r.output
    assert "the entry is empty or has no execution_metadata" in r.stderr, r.stderr


@pytest.mark.parametrize("bad", ["not hex", "ab cd\nef", "A" * 64, "a" * 63, "a" * 64 + "/../x"])
def test_a_malformed_digest_in_an_entry_is_a_miss_for_that_target_only(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace], bad: str
) -> None:
    """An action result naming a digest that is not 64 lowercase hex digits (a space, a
    newline, a path) is a miss for its target: the other targets still come from the cache
    (the breaker did not trip), nothing odd reaches a URL."""
    a, b = _checkouts(make_workspace, f"malformed-{time.time_ns()}")
    url = f"{nginx.url}/malformed-{len(bad)}-{bad[:2].strip()}"
    assert a.build("--remote-cache", url).rc == 0
    _damage_the_header_entry(nginx, url.rpartition("/")[2], lambda out: setattr(out.digest, "hash", bad))
    r = b.build("--remote-cache", url)
    assert r.rc == 0, r.output
    assert r.status("//gen:header") == "ran"
    assert "malformed digest" in r.stderr, r.stderr
    assert "unavailable" not in r.stderr, r.stderr
    assert r.status("//data:pack") == "restored", r.output
    assert b.path("gen/names.h").read_bytes() == a.path("gen/names.h").read_bytes()


def test_cache_server_killed_in_the_middle_of_a_build(
    tmp_path: Path, make_workspace: Callable[..., Workspace]
) -> None:
    server = _start("grpc", tmp_path / "bgd-doomed")
    try:
        ws = make_workspace("killed")
        marker = tmp_path / "first-ran"
        ws.build_file("", f"""
            genrule(name="first", outs=["first.txt"], cmd="echo one > $@ && touch {marker} && sleep 3")
            genrule(name="second", srcs=[":first"], outs=["second.txt"], cmd="cat first.txt > $@ && echo two >> $@")
            genrule(name="third", srcs=[":second"], outs=["third.txt"], cmd="cat second.txt > $@ && echo 3 >> $@")
        """)
        import subprocess

        from conftest import BUILDTOOL, _clean_env

        env = _clean_env(ws.cache, ws.home)
        proc = subprocess.Popen([BUILDTOOL, "build", "--remote-cache", server.url, "--remote-timeout", "5"],
                                cwd=ws.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the first action never started"
            time.sleep(0.05)
        server.stop()  # killed while //:first runs: its upload and later lookups hit a dead server
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
        assert ws.read("third.txt") == "one\ntwo\n3\n"
        assert "remote cache unavailable" in err, err
        assert err.count("remote cache unavailable") == 1, err  # warned once
    finally:
        server.stop()


@pytest.mark.parametrize(("args", "env"), [
    ([], {"BUILDTOOL_REMOTE_CACHE": "https://ci:4711#Xy9SECRET@cache.example.com/team"}),
    ([], {"BUILDTOOL_REMOTE_CACHE": "https://ci:Xy9?SECRET@cache.example.com/team"}),
    (["--remote-cache", "http://127.0.0.1:1", "--remote-header", "Authorization: Bearer SECRET"], None),
    ([], {"BUILDTOOL_REMOTE_CACHE": "http://127.0.0.1:1", "BUILDTOOL_REMOTE_HEADERS": "authorization=Bearer a,SECRET"}),
    (["--remote-cache", "http://127.0.0.1:1", "--remote-header", "=SECRET"], None),
], ids=["hash-in-password", "query-in-password", "curl-header", "comma-in-value", "no-key"])
def test_a_refused_remote_option_never_shows_its_secret(workspace: Workspace, args: list[str],
                                                        env: dict[str, str] | None) -> None:
    """An unencoded '#' or '?' in a URL's password moved the '@' out of urlsplit's netloc,
    and a header given in curl's syntax (or split at a ',' in its value) was echoed whole."""
    workspace.build_file("", 'genrule(name="x", outs=["x"], cmd="touch $@")\n')
    rc, out, err = workspace.run("build", *args, env_extra=env)
    assert rc == 2 and "SECRET" not in out + err and "Traceback" not in err, err


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "grpc://127.0.0.1:1"])
def test_the_counts_of_a_remote_that_went_off_add_up_to_the_lookups(workspace: Workspace, url: str) -> None:
    """A server down from the start read "0 hits, 0 misses": what became of three lookups?"""
    workspace.build_file("", "\n".join(f'genrule(name="{n}", outs=["{n}.txt"], cmd="echo > $@")' for n in "abc"))
    r = workspace.build("-j1", "--remote-cache", url)
    assert r.rc == 0 and r.stderr.count("remote cache unavailable") == 1, r.stderr
    assert f"remote cache {url}: 0 hits, 0 misses, 0 uploaded, 0 B down, 0 B up, 1 errors, 3 unanswered " \
           "(off for the rest of the build)" in r.stdout, r.stdout
    assert [(e["hits"], e["misses"], e["unanswered"]) for e in r.remote] == [(0, 0, 3)], r.remote


def test_bad_remote_options_are_exit_2(workspace: Workspace) -> None:
    workspace.build_file("", 'genrule(name="x", outs=["x"], cmd="touch $@")\n')
    rc, _, err = workspace.run("build", "--remote-cache", "ftp://example.com")
    assert rc == 2 and "--remote-cache must be grpc://" in err, err
    workspace.write("buildtool.toml", "remote_timeout = -1\n")
    rc, _, err = workspace.run("build")
    assert rc == 2 and "remote_timeout must be a positive number of seconds below a year" in err, err
    for args, env, needle in (
        (["--remote-timeout", "nan"], None, "--remote-timeout must be a positive number of seconds below a year"),
        ([], {"BUILDTOOL_REMOTE_TIMEOUT": "inf"}, "BUILDTOOL_REMOTE_TIMEOUT: remote_timeout must be"),
        (["--remote-header", "x-tok=a\nb"], None, "the value of header 'x-tok' contains a line break"),
        (["--remote-header", "Bad Key=1"], None, "'Bad Key' is not a valid header name"),
        (["--remote-header", "novalue"], None, "--remote-header must be KEY=VALUE"),
        (["--remote-cache", "http://127.0.0.1:1/q?q=1"], None, "--remote-cache: an HTTP cache URL takes no query"),
        (["--remote-cache", "http://127.0.0.1:1/f#frag"], None, "takes no query or fragment"),
        (["--remote-cache", "http://127.0.0.1:1/a b"], None, "the path has a space, a control or a non-ASCII"),
        # (these three failed the first targets with an internal UnicodeEncodeError, exit 1)
        (["--remote-cache", "http://127.0.0.1:1/caché"], None, "the path has a space, a control or a non-ASCII"),
        (["--remote-header", "x-team=€"], None, "the value of header 'x-team' must be printable ASCII"),
        (["--remote-instance", "ïnst"], None, "--remote-instance must be ASCII names joined by '/'"),
        (["--remote-cache", "http://[::1:1"], None, "--remote-cache is not a URL: Invalid IPv6 URL"),
        (["--remote-instance", "a b"], None, "--remote-instance must be ASCII names joined by '/'"),
        (["--remote-instance", "../../x"], None, "--remote-instance must be ASCII names joined by '/'"),
    ):
        workspace.write("buildtool.toml", "")
        rc, _, err = workspace.run("build", "--remote-cache", "http://127.0.0.1:1", *args, env_extra=env)
        assert rc == 2 and needle in err and "Traceback" not in err, (args, err)
    workspace.write("buildtool.toml", "")
    workspace.write("buildtool.toml", "remote_headers = {a = 1}\n")
    rc, _, err = workspace.run("build")
    assert rc == 2 and "remote_headers: the value of 'a' must be a string (got 1)" in err, err
    workspace.write("buildtool.toml", "")
    rc, _, err = workspace.run("build", env_extra={"BUILDTOOL_REMOTE_CACHE": "grpc://h"})
    assert rc == 0, err  # port defaults; an unreachable server only warns
    assert "remote cache unavailable" in err


def test_uploads_default_to_on_in_ci_only(nginx: remote_servers.Server,
                                          make_workspace: Callable[..., Workspace]) -> None:
    tag = f"ci-only-{time.time_ns()}"
    url = f"{nginx.url}/ci-only"
    dev = make_workspace("developer")
    _project(dev, tag)
    r = dev.build("--remote-cache", url, env_extra={"CI": ""})  # a developer's machine
    assert r.rc == 0 and len(r.ran) == 3, r.output
    assert "0 uploaded" in r.stdout, r.stdout
    ci = make_workspace("ci")
    _project(ci, tag)
    r = ci.build("--remote-cache", url, env_extra={"CI": "true"})
    assert r.rc == 0 and len(r.ran) == 3, r.output  # nothing was uploaded before
    assert "3 uploaded" in r.stdout, r.stdout
    dev2 = make_workspace("developer-2")
    _project(dev2, f"{tag}-other")
    r = dev2.build("--remote-cache", url, "--remote-upload", env_extra={"CI": ""})  # asked for
    assert "3 uploaded" in r.stdout, r.stdout


class _FaultyCache:
    """An HTTP cache on 127.0.0.1 that misbehaves: ``drip`` answers every GET with a body
    sent a byte every 0.3 s; ``drip_head`` sends even its headers a byte every 0.5 s;
    ``auth`` answers everything 401; ``cut`` sends a chunked body and hangs up halfway;
    ``short`` announces a length and hangs up before it (http.client says nothing)."""

    def __init__(self, mode: str) -> None:
        import http.server
        import threading

        outer = self
        self.requests = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                outer.requests += 1
                if mode == "auth":
                    self.send_response(401)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if mode == "cut":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1f4\r\n" + b"x" * 100)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if mode == "short":  # a Content-Length, fewer bytes, then the connection closes
                    self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 121\r\n\r\n" + b"\n\x00" * 20)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if mode == "drip_then_503" and outer.requests > 1:  # the first drips (below), the rest fail
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if mode == "put409":  # nothing there; every upload refused as nginx's WebDAV does without
                    # create_full_put_path
                    self.send_response(409 if self.command == "PUT" else 404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if mode == "html":  # a web page at every URL: a captive proxy, a URL that is no cache
                    page = b"<html>proxy login</html>"
                    self.send_response(200)
                    self.send_header("content-length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                if mode == "drip_head":
                    try:
                        for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-padding: " + b"p" * 80 + b"\r\n\r\n":
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(0.5)
                    except OSError:
                        pass
                    return
                self.send_response(200)
                self.send_header("content-length", "200")
                self.end_headers()
                try:
                    for _ in range(200):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.3)
                except OSError:
                    pass

            do_GET = do_HEAD = _answer

            def do_PUT(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self._answer()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode", ["drip", "drip_head", "auth", "cut", "short"])
def test_a_dripping_or_refusing_http_cache_costs_one_warning_not_the_build(
    make_workspace: Callable[..., Workspace], mode: str
) -> None:
    """A server sending a byte at a time, even its headers, must not hold a build past
    --remote-timeout (the socket's timeout is per read); an authentication error is one
    warning for the whole build (the breaker), not one per target; a response cut off
    halfway is one too (it failed every target with "internal error: IncompleteRead")."""
    server = _FaultyCache(mode)
    try:
        ws = make_workspace(f"faulty-{mode}")
        ws.build_file("", "\n".join(f'genrule(name="t{i}", outs=["t{i}.txt"], cmd="echo {i} > $@")'
                                    for i in range(3)))
        t0 = time.monotonic()
        r = ws.build("--remote-cache", server.url, "--remote-timeout", "1")
        took = time.monotonic() - t0
        assert r.rc == 0 and {e["status"] for e in r.events} == {"ran"}, r.output
        assert took < 30, took  # a bound, not a benchmark: the drip alone would take 60 s a request
        assert r.stderr.count("remote cache") <= 2, r.stderr
        if mode == "short":  # a cut-off entry was read as a shorter one: a hit without its stdout
            assert "the response broke off after 40 of its 121 bytes" in r.stderr, r.stderr
    finally:
        server.close()


def test_a_download_in_flight_stops_when_the_breaker_trips(make_workspace: Callable[..., Workspace]) -> None:
    """Once the remote is off for the build, a download dripping a byte at a time ran on to
    its own deadline (here 20 s; 3 s and 1 s per MB by default, two minutes for 120 MB)."""
    server = _FaultyCache("drip_then_503")
    try:
        ws = make_workspace("faulty-drip-503")
        ws.build_file("", "\n".join(f'genrule(name="t{i}", outs=["t{i}.txt"], cmd="echo {i} > $@")'
                                    for i in range(2)))
        t0 = time.monotonic()
        r = ws.build("--remote-cache", server.url, "--remote-timeout", "20", "-j2")
        took = time.monotonic() - t0
        assert r.rc == 0 and {e["status"] for e in r.events} == {"ran"}, r.output
        assert r.stderr.count("remote cache unavailable") == 1, r.stderr
        assert took < 10, took  # (a bound, not a benchmark: the drip alone is held to 20 s)
    finally:
        server.close()


def test_uploads_failing_in_a_row_stop_after_a_few_with_one_warning(make_workspace: Callable[..., Workspace]) -> None:
    """An HTTP 409 for every PUT warned once per target (30 targets, 30 lines) and never
    stopped uploading: after FAILED_UPLOADS_IN_A_ROW, uploads stop for the build, said once."""
    from buildtool.remote.cache_layer import FAILED_UPLOADS_IN_A_ROW

    server = _FaultyCache("put409")
    try:
        ws = make_workspace("faulty-put409")
        ws.build_file("", "\n".join(f'genrule(name="t{i}", outs=["t{i}.txt"], cmd="echo {i} > $@")'
                                    for i in range(10)))
        r = ws.build("--remote-cache", server.url, "--remote-upload", "-j1")
        assert r.rc == 0 and {e["status"] for e in r.events} == {"ran"}, r.output
        assert r.stderr.count("upload to the remote cache failed") == 1, r.stderr
        assert r.stderr.count(f"{FAILED_UPLOADS_IN_A_ROW} uploads in a row failed") == 1, r.stderr
        assert r.stderr.count("warning") == 2, r.stderr
    finally:
        server.close()


def test_a_server_answering_every_url_with_a_page_is_left_after_a_few_bad_entries(
    make_workspace: Callable[..., Workspace],
) -> None:
    """A 200 with a web page for every lookup: each target warned that its entry "is not an
    ActionResult message", a line per target (1,000 in a large build).  A run of unusable
    entries is the server's trouble: after BAD_IN_A_ROW the cache is left, said once."""
    from buildtool.remote.cache_layer import BAD_IN_A_ROW

    server = _FaultyCache("html")
    try:
        ws = make_workspace("faulty-html")
        ws.build_file("", "\n".join(f'genrule(name="t{i}", outs=["t{i}.txt"], cmd="echo {i} > $@")'
                                    for i in range(12)))
        r = ws.build("--remote-cache", server.url, "-j1")
        assert r.rc == 0 and {e["status"] for e in r.events} == {"ran"}, r.output
        assert r.stderr.count("remote cache entry not used") == BAD_IN_A_ROW, r.stderr
        assert r.stderr.count("remote cache unavailable") == 1, r.stderr
        assert f"{BAD_IN_A_ROW} entries in a row were unusable" in r.stderr, r.stderr
    finally:
        server.close()


@pytest.mark.parametrize("flag", ["--remote-cache", "--remote-executor"])
def test_ctrl_c_breaks_off_connecting_to_a_grpc_server_that_never_answers(
    make_workspace: Callable[..., Workspace], flag: str,
) -> None:
    """The first call (GetCapabilities) ran under the layer's lock, which Ctrl-C's abort
    waited for: with the default 30 s timeout, exit came ~20 s after Ctrl-C."""
    import signal
    import socket
    import subprocess
    import threading

    import conftest

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.extend(iter(lambda: silent.accept()[0], None)), daemon=True).start()
    try:
        ws = make_workspace(f"silent-{flag[2:]}")
        ws.build_file("", 'genrule(name="t", outs=["t.txt"], cmd="echo t > $@")')
        env = conftest._clean_env(ws.cache, ws.home)
        proc = subprocess.Popen([conftest.BUILDTOOL, "build", flag, f"grpc://127.0.0.1:{silent.getsockname()[1]}"],
                                cwd=ws.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # GetCapabilities sent, never answered
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=40)
        assert proc.returncode == 130, (proc.returncode, out, err)
        assert time.monotonic() - t0 < 5, (out, err)
        assert "fell back to local" not in out + err or "0 fell back to local" in out + err, out + err
    finally:
        silent.close()
        for c in accepted:
            c.close()


@pytest.mark.parametrize(("prefix", "said"), [("readonly", "HTTP 403"), ("full", "HTTP 500")])
def test_a_cache_refusing_uploads_still_serves_lookups(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace], prefix: str, said: str,
) -> None:
    """Uploads on (CI), the cache read-only for this client (PUT answered 403, the set-up
    docs/remote.md recommends), or unable to store (nginx on a full disk answers a PUT with
    500): the refusal stops uploads, not lookups (it tripped the breaker, and every later
    target ran though the cache held it: 9 of 11 hits lost, when a filling CI cache most
    needs them)."""
    tag = f"{prefix}-{time.time_ns()}"
    filler = "\n".join(f'genrule(name="c{i}", outs=["c{i}.txt"], cmd="echo {tag} {i} > $@")' for i in range(8))
    a = make_workspace("writer")
    a.build_file("", filler)
    assert "8 uploaded" in a.build("--remote-cache", f"{nginx.url}/{tag}", "--remote-upload").stdout
    b = make_workspace("reader")
    b.build_file("", filler + '\ngenrule(name="new", outs=["new.txt"], cmd="echo new > $@", priority=9)')
    r = b.build("-j1", "--remote-cache", f"{nginx.url}/{prefix}/{tag}", "--remote-upload")
    assert r.rc == 0, r.output
    assert r.ran == {"//:new"} and r.with_status("restored") == {f"//:c{i}" for i in range(8)}, r.output
    assert "refused an upload" in r.stderr and said in r.stderr, r.stderr
    assert "remote cache unavailable" not in r.stderr, r.stderr


def test_grpcs_to_a_server_without_tls_says_to_use_grpc(
    bgd: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    """The warning was gRPC's raw "TSI_PROTOCOL_FAILURE ... WRONG_VERSION_NUMBER" (the
    remote CI user): it now says what to type."""
    ws = make_workspace("tls")
    ws.build_file("", 'genrule(name="g", outs=["g.txt"], cmd="echo g > $@")')
    url = bgd.url.replace("grpc://", "grpcs://")
    r = ws.build("--remote-cache", url)
    assert r.rc == 0 and "remote cache unavailable" in r.stderr, r.output
    assert "a server without TLS is reached with grpc://" in r.stderr, r.stderr


def test_a_clone_s_venv_first_on_path_is_part_of_the_remote_action(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace], tmp_path: Path,
) -> None:
    """The remote Command leaves out PATH entries inside the checkout (a worker has no
    clone), but they must still tell two actions apart, as they tell the local keys apart:
    a checkout without the venv was served the output made with the venv's `mytool`."""
    tag = f"venv-{time.time_ns()}"
    sysbin = tmp_path / "sysbin"
    sysbin.mkdir()
    (sysbin / "mytool").write_text("#!/bin/sh\necho system tool\n")
    (sysbin / "mytool").chmod(0o755)
    a, b = make_workspace("venv-a"), make_workspace("venv-b")
    for ws in (a, b):
        ws.build_file("", 'genrule(name="g", outs=["out.txt"], cmd="mytool > $@")')
    a.write(".venv/bin/mytool", "#!/bin/sh\necho venv tool\n")
    a.path(".venv/bin/mytool").chmod(0o755)
    url = f"{nginx.url}/{tag}"
    r = a.build("--remote-cache", url, "--remote-upload",
                env_extra={"PATH": f"{a.root}/.venv/bin:{sysbin}:/usr/bin:/bin"})
    assert r.rc == 0 and a.read("out.txt") == "venv tool\n" and "1 uploaded" in r.stdout, r.output
    r = b.build("--remote-cache", url, env_extra={"PATH": f"{sysbin}:/usr/bin:/bin"})
    assert r.rc == 0 and r.status("//:g") == "ran" and b.read("out.txt") == "system tool\n", r.output


def test_tests_under_no_cache_tests_are_not_uploaded(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    tag = f"{time.time_ns()}\n"
    a, b = make_workspace("nct-a"), make_workspace("nct-b")
    for ws in (a, b):
        ws.write("u.txt", tag)
        ws.build_file("", 'test(name="t", srcs=["u.txt"], cmd="cat u.txt")')
    r = a.build("//:t", "--no-cache-tests", "--remote-cache", nginx.url, "--remote-upload", command="test")
    assert r.rc == 0 and "1 uploaded" not in r.stdout, r.stdout
    r = b.build("//:t", "--remote-cache", nginx.url, command="test")  # nothing there to hit
    assert r.rc == 0 and r.status("//:t") == "ran", r.output


def test_always_make_uploads_what_it_reran(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    """-B in a CI job refreshing the remote cache: nothing was uploaded (the targets were
    taken for always=True ones), and the next build, a no-op, never would."""
    tag = f"{time.time_ns()}\n"
    a, b = make_workspace("bm-a"), make_workspace("bm-b")
    for ws in (a, b):
        ws.write("u.txt", tag)
        ws.build_file("", 'genrule(name="g", srcs=["u.txt"], outs=["g.txt"], cmd="cp $< $@")')
    assert a.build("//:g").rc == 0  # (up to date here, never uploaded)
    r = a.build("-B", "//:g", "--remote-cache", nginx.url, "--remote-upload")
    assert r.rc == 0 and r.ran == {"//:g"} and "1 uploaded" in r.stdout + r.stderr, r.output
    r = b.build("//:g", "--remote-cache", nginx.url)
    assert r.rc == 0 and r.status("//:g") == "restored", r.output


def test_run_takes_the_remote_flags(nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]) -> None:
    """`run` refused --remote-cache ("unrecognized arguments"); the docs describe it."""
    tag = f"{time.time_ns()}"
    a, b = make_workspace("run-a"), make_workspace("run-b")
    for ws in (a, b):
        script = f"printf '#!/bin/sh\\\\necho {tag} $$1\\\\n' > $@ && chmod +x $@"
        ws.build_file("", f'genrule(name="exe", outs=["run.sh"], cmd="{script}")')
    assert a.build("//:exe", "--remote-cache", nginx.url, "--remote-upload").rc == 0
    rc, out, err = b.run("run", "//:exe", "--remote-cache", nginx.url, "--", "arg")
    assert rc == 0 and f"{tag} arg" in out and "0 ran" not in err, out + err
    assert "1 hits" in out + err, out + err


def test_ctrl_c_breaks_off_a_download_in_progress(make_workspace: Callable[..., Workspace]) -> None:
    """The server sends the body a byte every 0.3 s: Ctrl-C waited for the whole download
    (--remote-timeout 20: exit after 20 s)."""
    import signal
    import subprocess

    import conftest

    server = _FaultyCache("drip")
    try:
        ws = make_workspace("drip-int")
        ws.build_file("", 'genrule(name="t", outs=["t.txt"], cmd="echo t > $@")')
        env = conftest._clean_env(ws.cache, ws.home)
        proc = subprocess.Popen([conftest.BUILDTOOL, "build", "--remote-cache", server.url, "--remote-timeout", "20"],
                                cwd=ws.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while server.requests == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the body is coming, a byte at a time
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, (proc.returncode, out, err)
        assert time.monotonic() - t0 < 5, (out, err)
    finally:
        server.close()


def test_a_remote_hit_the_local_cache_cannot_hold_is_a_miss(
    nginx: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    """The blob downloaded from the remote could not be written to the local cache (a
    dangling link where its shard directory belongs; a file there is replaced now): the
    entry was stored anyway, pointing at nothing, and every later build said 'the cache
    entry was damaged'."""
    a, b = _checkouts(make_workspace, f"shard-{time.time_ns()}")
    assert a.build("--remote-cache", nginx.url).rc == 0
    digest = hash_bytes(a.path("data/big.copy").read_bytes())
    shard = b.cache / "v2" / "cas" / digest[:2]
    shard.parent.mkdir(parents=True, exist_ok=True)
    shard.symlink_to(b.cache / "elsewhere")
    r = b.build("--remote-cache", nginx.url)
    assert r.rc == 0 and r.status("//data:pack") == "ran", r.output
    assert "a symbolic link where the cache keeps a directory" in r.stderr, r.stderr
    shard.unlink()
    b.path("data/big.copy").unlink()
    again = b.build("--explain")
    assert again.rc == 0 and "damaged" not in again.output, again.output


def test_an_input_changed_since_its_key_is_never_looked_up_or_stored_under_that_key(tmp_path: Path) -> None:
    """With a SHA-256 server the Action was built from the files as they were when it was
    built, not as the key had them: an input saved in between fetched the result for the
    new content, stored locally under the old content's key (a wrong restore for good)."""
    import types

    from buildtool.remote import action as ra
    from buildtool.remote.cache_layer import RemoteCache

    (tmp_path / "in.txt").write_bytes(b"v1\n")
    keyed = hash_bytes(b"v1\n")
    layer = RemoteCache(None, None, str(tmp_path), None, str(tmp_path / "tmp"), lambda msg: None)  # type: ignore[arg-type]
    sha = types.SimpleNamespace(digest_fn="sha256")
    (tmp_path / "in.txt").write_bytes(b"v2\n")  # saved after the key was computed
    with pytest.raises(ra.ChangedSinceKeyed):  # an OSError: the lookup is a miss, the upload skipped
        layer._file_digest(sha, "in.txt", keyed)  # type: ignore[arg-type]
    # Through lookup and upload: a miss and no upload, never a failed target (a review found
    # the Action built outside their try: "internal error: ChangedSinceKeyed").
    warned: list[str] = []
    layer.warn = warned.append
    layer.cache = types.SimpleNamespace(writable=True)  # type: ignore[assignment]
    layer._get_store = lambda: sha  # type: ignore[method-assign,assignment,return-value]
    view = ra.TargetView("genrule", "", "cat in.txt > o", None, None, ("o",), ["in.txt"], None)
    desc = {"inputs": {"in.txt": keyed}, "env": {}, "extra": {}}
    layer.opt = types.SimpleNamespace(upload=True)  # type: ignore[assignment]
    assert layer.lookup(view, "k", desc, "//:o") is None and layer.stats.misses == 1
    layer.upload(view, "k", desc, [], b"", b"", 0.1, "//:o")
    assert layer.stats.uploads == 0 and len(warned) == 2 and "in.txt changed since" in warned[0], warned
    (tmp_path / "in.txt").write_bytes(b"v1\n")
    d = layer._file_digest(sha, "in.txt", keyed)  # type: ignore[arg-type]
    assert d.hash == hashlib.sha256(b"v1\n").hexdigest() and d.size == 3
    assert issubclass(ra.ChangedSinceKeyed, OSError)


def test_a_bytestream_read_past_the_digest_s_size_stops_at_once(tmp_path: Path) -> None:
    """ByteStream.Read wrote whatever the server streamed and checked the size at the end:
    a server streaming without end filled the disk (GBs for a 5 MB digest)."""
    from buildtool.remote.action import Digest
    from buildtool.remote.grpc_store import GrpcStore
    from buildtool.remote.store import BadBlob

    class EndlessCall:
        cancelled = False
        sent = 0

        def __iter__(self) -> Iterator[Any]:
            while not self.cancelled and self.sent < 20:  # ("endless": 20 MiB, so a regression fills no disk)
                self.sent += 1
                yield type("Resp", (), {"data": b"x" * (1 << 20)})()

        def cancel(self) -> None:
            self.cancelled = True

    call = EndlessCall()
    store = GrpcStore.__new__(GrpcStore)
    store.digest_fn, store.instance, store.timeout, store.metadata, store.name = "sha256", "", 5.0, (), "fake"
    store.bs = type("Stub", (), {"Read": lambda self, req, timeout, metadata: call})()
    with pytest.raises(BadBlob):
        store._read(Digest("0" * 64, 5 << 20), str(tmp_path))
    assert call.cancelled and call.sent <= 6, call.sent
    assert list(tmp_path.iterdir()) == [], "the partial download was left"


def test_a_file_name_that_is_not_utf8_keeps_its_target_local_with_one_warning(
    server: remote_servers.Server, make_workspace: Callable[..., Workspace]
) -> None:
    """A REAPI action holds names as protobuf strings: a source named with a byte that is
    not UTF-8 failed its genrule and its (passing) test with an internal UnicodeEncodeError.
    The target runs and is cached here, one warning each; the others use the server."""
    tag = f"{time.time_ns()}"
    ws = make_workspace("not-utf8")
    (ws.root / os.fsdecode(b"caf\xe9.txt")).write_text(f"{tag}\n")
    ws.write("plain.txt", f"{tag}\n")
    ws.build_file("", 'genrule(name="g", srcs=glob(["caf*.txt"]), outs=["out.txt"], cmd="cp $< $@")\n'
                      'test(name="t", srcs=glob(["caf*.txt"]), cmd="grep -q . $(SRCS)")\n'
                      'genrule(name="p", srcs=["plain.txt"], outs=["p.out"], cmd="cp $< $@")\n')
    r = ws.build("//:g", "//:t", "//:p", "--remote-cache", server.url, "--remote-upload", command="test")
    assert r.rc == 0, r.output
    assert (r.status("//:g"), r.status("//:t"), r.status("//:p")) == ("ran", "ran", "ran"), r.output
    assert "internal error" not in r.output and "PASSED" in r.stdout, r.output
    assert ws.read("out.txt") == f"{tag}\n"
    for label in ("//:g", "//:t"):
        assert r.output.count(f"{label}: not in the remote cache: its input 'caf\\xe9.txt' is not UTF-8") == 1, \
            r.output
    [st] = r.remote
    assert (st["uploads"], st["disabled"]) == (1, None), st  # (//:p's entry)
    # Locally cached all the same: deleted outputs come back without running anything.
    ws.path("out.txt").unlink()
    r = ws.build("//:g", "--remote-cache", server.url)
    assert r.rc == 0 and r.status("//:g") == "restored" and ws.read("out.txt") == f"{tag}\n", r.output


def test_calls_the_breaker_broke_off_are_unanswered_without_a_word(tmp_path: Path) -> None:
    """The breaker closes a gRPC channel: each lookup still in flight then failed with
    CANCELLED, one warning each (7 at -j8) besides the breaker's one.  Counted as unanswered
    (not as misses: the server never said "not here")."""
    import types

    from buildtool.remote import action as ra
    from buildtool.remote.cache_layer import RemoteCache
    from buildtool.remote.store import RemoteError

    warned: list[str] = []
    layer = RemoteCache(None, None, str(tmp_path), None, str(tmp_path / "tmp"), warned.append)  # type: ignore[arg-type]

    def cancelled(*_: object) -> None:
        layer._broken = "UNAVAILABLE from another call"  # (tripped while this one was in flight)
        raise RemoteError("GetActionResult failed: CANCELLED Stream removed (Channel closed!)")

    store = types.SimpleNamespace(digest_fn="sha256", get_action_result=cancelled, find_missing=cancelled)
    layer.cache = types.SimpleNamespace(writable=True)  # type: ignore[assignment]
    layer._get_store = lambda: store  # type: ignore[method-assign,assignment,return-value]
    layer.remote_action = lambda *_: types.SimpleNamespace(digest="d")  # type: ignore[method-assign]
    layer.action_result = lambda *_: (None, {})  # type: ignore[method-assign]
    layer.opt = types.SimpleNamespace(upload=True)  # type: ignore[assignment]
    view = ra.TargetView("genrule", "", "true", None, None, (), [], None)
    assert layer.lookup(view, "k", {}, "//:a") is None and (layer.stats.misses, layer.stats.off) == (0, 1)
    layer._broken = None
    layer.upload(view, "k", {}, [], b"", b"", 0.1, "//:a")
    assert warned == [] and layer.stats.errors == 0, (warned, layer.stats.errors)


def test_a_channel_reconnects_within_seconds_of_its_server_coming_back() -> None:
    """gRPC waits longer and longer between attempts to reach a server that is down (to
    120 s): a worker whose BuildGrid restarted came back 20-60 s after it, while it logged
    "retrying every 2 s".  After 30 s down, a call goes through seconds after the server is
    back (with gRPC's defaults, ~12 s here).  A gRPC server on 127.0.0.1 answering anything."""
    import socket
    from concurrent import futures

    import grpc

    from buildtool.remote.grpc_store import channel
    from buildtool.remote.options import Endpoint

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    chan = channel(Endpoint("grpc", "127.0.0.1", port, ""))
    call = chan.unary_unary("/t.T/Ping")
    down = time.monotonic()
    while time.monotonic() - down < 30:  # (as a worker's loop: a call every 0.5 s, each refused)
        with pytest.raises(grpc.RpcError):
            call(b"x", timeout=1)
        time.sleep(0.5)

    class Answer(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(lambda request, context: b"pong")

    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((Answer(),))
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    server.start()
    try:
        back = time.monotonic()
        while True:
            try:
                assert call(b"x", timeout=1) == b"pong"
                break
            except grpc.RpcError:
                assert time.monotonic() - back < 8, "no connection 8 s after the server came back"
                time.sleep(0.5)
    finally:
        server.stop(0)
        chan.close()
