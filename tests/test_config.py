"""config.py: the CPU count from the cgroup quota read from v2 and v1 hierarchies (real files in a
temp tree standing for /sys/fs/cgroup and /proc/self/cgroup), CI detection, layering."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import Workspace

from buildtool import config


def _write(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_v2_quota_of_the_own_cgroup_and_the_tightest_ancestor(tmp_path: Path) -> None:
    fs, own = tmp_path / "fs", tmp_path / "cgroup"
    _write(own, "0::/ci.slice/job-7\n")
    _write(fs / "cpu.max", "max 100000\n")
    _write(fs / "ci.slice" / "cpu.max", "300000 100000\n")
    _write(fs / "ci.slice" / "job-7" / "cpu.max", "150000 100000\n")
    assert config.cgroup_cpus(str(fs), str(own)) == 1.5
    _write(fs / "ci.slice" / "job-7" / "cpu.max", "max 100000\n")
    assert config.cgroup_cpus(str(fs), str(own)) == 3.0  # the parent's limit still holds


def test_v1_cfs_quota_and_no_limit(tmp_path: Path) -> None:
    fs, own = tmp_path / "fs", tmp_path / "cgroup"
    _write(own, "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n")
    _write(fs / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(fs / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    assert config.cgroup_cpus(str(fs), str(own)) is None  # -1: unlimited
    _write(fs / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "250000\n")
    _write(fs / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    assert config.cgroup_cpus(str(fs), str(own)) == 2.5


def test_an_invisible_own_cgroup_falls_back_to_the_root(tmp_path: Path) -> None:
    """In a container, /proc/self/cgroup names a host path; the container sees its own
    cgroup as the root of the mount."""
    fs, own = tmp_path / "fs", tmp_path / "cgroup"
    _write(own, "0::/host/path/not/mounted\n")
    _write(fs / "cpu.max", "200000 100000\n")
    assert config.cgroup_cpus(str(fs), str(own)) == 2.0
    assert config.cgroup_cpus(str(tmp_path / "none"), str(tmp_path / "nothing")) is None


@pytest.mark.parametrize(("quota", "jobs"), [(0.5, 1), (1.5, 2), (None, None)])
def test_cpu_count_rounds_the_quota_up_within_the_affinity_mask(
    monkeypatch: pytest.MonkeyPatch, quota: float | None, jobs: int | None
) -> None:
    import os

    mask = len(os.sched_getaffinity(0))
    # None: a quota above the mask (on any host), so the mask decides
    monkeypatch.setattr(config, "cgroup_cpus", lambda: quota if quota is not None else mask + 0.5)
    assert config.cpu_count() == (min(jobs, mask) if jobs is not None else mask)


@pytest.mark.parametrize(("env", "ci"), [
    ({"CI": "true"}, True), ({"CI": "1"}, True), ({}, False), ({"CI": ""}, False),
    ({"JENKINS_URL": "http://jenkins:8080/"}, True), ({"TF_BUILD": "True"}, True),
    ({"CI": "false", "JENKINS_URL": "http://jenkins:8080/"}, False),
])
def test_in_ci_recognises_services_that_do_not_set_CI(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], ci: bool
) -> None:
    for k in ("CI", *config.CI_MARKERS):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert config.in_ci() is ci


@pytest.mark.parametrize("empty_from", ["env", "flag"])
def test_an_empty_remote_url_turns_off_the_one_a_config_file_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_from: str
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for k in list(os.environ):
        if k.startswith("BUILDTOOL_"):
            monkeypatch.delenv(k)
    _write(tmp_path / "ws" / "buildtool.toml",
           'remote_cache = "http://127.0.0.1:1/x"\nremote_executor = "grpc://127.0.0.1:2"\n')
    root = str(tmp_path / "ws")
    assert config.load_config(root, {}).remote_cache == "http://127.0.0.1:1/x"
    monkeypatch.setenv("BUILDTOOL_REMOTE_TIMEOUT", "")  # empty, not a setting: as if unset
    flags: dict[str, object] = {}
    if empty_from == "env":
        monkeypatch.setenv("BUILDTOOL_REMOTE_CACHE", "")
        monkeypatch.setenv("BUILDTOOL_REMOTE_EXECUTOR", "")
    else:
        flags = {"remote_cache": "", "remote_executor": ""}
    cfg = config.load_config(root, flags)
    assert not cfg.remote_cache and not cfg.remote_executor


def test_a_count_in_the_environment_may_have_spaces_around_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BUILDTOOL_JOBS="4 " (a stray space of an env file or CI YAML) worked with int()."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for k in list(os.environ):
        if k.startswith("BUILDTOOL_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("BUILDTOOL_JOBS", " 4 ")
    monkeypatch.setenv("BUILDTOOL_REMOTE_JOBS", "8\n")
    _write(tmp_path / "ws" / "buildtool.toml", "")
    cfg = config.load_config(str(tmp_path / "ws"), {})
    assert (cfg.jobs, cfg.remote_jobs) == (4, 8)


def test_tables_merge_key_by_key_and_a_higher_list_replaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for k in list(os.environ):
        if k.startswith("BUILDTOOL_"):
            monkeypatch.delenv(k)
    _write(tmp_path / "xdg" / "buildtool" / "config.toml", 'remote_headers = {authorization = "Bearer U", x-a = "1"}\n')
    _write(tmp_path / "ws" / "buildtool.toml", 'action_env = ["LANG"]\nremote_headers = {x-b = "2"}\n')
    root = str(tmp_path / "ws")
    monkeypatch.setenv("BUILDTOOL_ACTION_ENV", "FOO, BAR ,")  # (spaces after commas are not a name's)
    monkeypatch.setenv("BUILDTOOL_REMOTE_HEADERS", "x-a=env, x-c=3")
    cfg = config.load_config(root, {"remote_headers": {"authorization": "Bearer FLAG"}})
    assert cfg.remote_headers == {"authorization": "Bearer FLAG", "x-a": "env", "x-b": "2", "x-c": "3"}
    assert cfg.action_env == ["FOO", "BAR"]


def test_a_relative_cache_dir_in_a_config_file_is_taken_from_the_file_s_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``cache_dir = "cache"`` in buildtool.toml went to ``sub/cache`` when buildtool was
    started in ``ws/sub``: a second cache (inside the workspace) per directory of the tree."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for k in list(os.environ):
        if k.startswith("BUILDTOOL_"):
            monkeypatch.delenv(k)
    _write(tmp_path / "ws" / "buildtool.toml", 'cache_dir = "cache"\n')
    (tmp_path / "ws" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "ws" / "sub")
    assert config.load_config(str(tmp_path / "ws"), {}).cache_dir == str(tmp_path / "ws" / "cache")
    _write(tmp_path / "xdg" / "buildtool" / "config.toml", 'cache_dir = "../c"\n')
    (tmp_path / "ws" / "buildtool.toml").unlink()
    assert config.load_config(str(tmp_path / "ws"), {}).cache_dir == str(tmp_path / "xdg" / "c")
    monkeypatch.setenv("BUILDTOOL_CACHE_DIR", "e")  # the environment and the flag: from where it started
    assert config.load_config(str(tmp_path / "ws"), {}).cache_dir == str(tmp_path / "ws" / "sub" / "e")
    assert config.load_config(str(tmp_path / "ws"), {"cache_dir": "f"}).cache_dir == str(tmp_path / "ws" / "sub" / "f")


def test_url_credentials_are_basic_auth_for_their_endpoint_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from buildtool.remote.options import parse_endpoint

    ep = parse_endpoint("https://ci:p%40ss@cache.example:8443/team")
    assert str(ep) == "https://cache.example:8443/team" and ep.userinfo == "ci:p@ss"
    got = ep.headers({"authorization": "Bearer FROM-CONFIG", "x-a": "1"})
    assert got == {"authorization": "Basic Y2k6cEBzcw==", "x-a": "1"}  # base64("ci:p@ss")
    assert parse_endpoint("grpc://h:1").headers({"x": "y"}) == {"x": "y"}
    with pytest.raises(ValueError) as e:
        parse_endpoint("http://ci:s3cret@host:99999/x")
    assert "s3cret" not in str(e.value) and "ci:***@host" in str(e.value)
    with pytest.raises(ValueError) as e:
        parse_endpoint("http://ghp_TOKEN@host:99999/x")  # a token as the user part
    assert "ghp_TOKEN" not in str(e.value) and "***@host" in str(e.value)
    for typo in ("ghp_TOKEN@cache.example:9092", "http:ghp_TOKEN@host"):  # no "//": still no token shown
        with pytest.raises(ValueError) as e:
            parse_endpoint(typo)
        assert "ghp_TOKEN" not in str(e.value), str(e.value)
    # The no-op snapshot's view of the environment keeps a digest of such a variable.
    from buildtool import noop

    monkeypatch.setenv("BUILDTOOL_REMOTE_CACHE", "http://ci:s3cret@host/x")
    view = noop.env_view([])
    assert view["BUILDTOOL_REMOTE_CACHE"].startswith("blake2b:") and "s3cret" not in repr(view)
    monkeypatch.setenv("BUILDTOOL_REMOTE_CACHE", "http://ci:other@host/x")
    assert noop.env_view([]) != view


@pytest.mark.parametrize(("toml", "needle"), [
    ('cache_dir = ""\n', "1: cache_dir must name a directory (got an empty string)"),
    ("[pools]\nconsole = 4\n", "2: pools.console cannot be configured: the console pool is built in with depth 1"),
    ("jobs = 0\n", "1: jobs must be from 1 to 4096 (got 0)"),
    ("remote_jobs = 4097\n", "1: remote_jobs must be a whole number from 1 to 4096 (got 4097)"),
    ("jobs = true\n", "1: jobs must be an integer (got True)"),
])
def test_values_that_were_taken_silently_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, needle: str,
) -> None:
    """``cache_dir = ""`` fell back to the default shared cache (``--cache-dir ''`` is an
    error); ``console = 4`` let console actions share the terminal four at a time."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    _write(tmp_path / "ws" / "buildtool.toml", toml)
    with pytest.raises(config.UserError) as e:
        config.load_config(str(tmp_path / "ws"), {})
    assert f"buildtool.toml:{needle}" in str(e.value)


@pytest.mark.parametrize(("toml", "line", "needle"), [
    ('# jobs = 2\n\njobs = "x"\n', 3, "jobs must be an integer (got 'x')"),
    ("jobz = 3\n", 1, "unknown config key 'jobz'"),
    ("[pools]\ncc = 2\n\nlink = -1\n", 4, "pools.link must be a non-negative integer depth (got -1)"),
    ('pools.cc = 1\n"pools".link = "x"\n', 2, "pools.link must be a non-negative integer depth"),
    ("jobs = 1\n[pools]\njobs = 3\n[remote]\nx = 1\n", 4, "unknown config key 'remote'"),
    ("[pools]\njobs = 3\n[x]\n", 3, "unknown config key 'x'"),  # (not pools.jobs: a key inside a table)
    ("remote_cache = 3\n", 1, "remote_cache must be a URL string (got 3)"),
])
def test_a_config_error_names_the_line_that_sets_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, line: int, needle: str,
) -> None:
    """A config error named the file alone, where a BUILD.py error names its line."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    _write(tmp_path / "ws" / "buildtool.toml", toml)
    with pytest.raises(config.UserError) as e:
        config.load_config(str(tmp_path / "ws"), {})
    assert f"buildtool.toml:{line}: {needle}" in str(e.value), str(e.value)


def test_a_user_config_that_cannot_be_reached_is_no_user_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HOME=/dev/null (or a home another user owns, under `su -m`) made every command exit 2:
    "cannot read config (Not a directory)", though there was no config to read; and with
    no home at all the cache went to a directory named `~` in the current directory."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "buildtool.toml").write_text("")
    (ws / "BUILD.py").write_text('genrule(name="g", outs=["g.txt"], cmd="echo > $@")\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "BUILDTOOL_"))}
    env["HOME"] = "/dev/null"
    r = subprocess.run(["buildtool", "-C", str(ws), "build"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "cannot read config" not in r.stderr, r.stdout + r.stderr
    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", "~")  # (what expanduser gives back when there is no home at all)
    assert config.user_config_path() == ""
    assert config.default_cache_dir() == f"/tmp/buildtool-{os.getuid()}/cache"  # (this user's own 0700 dir)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # (ignored, as the XDG spec says)
    assert config.default_cache_dir() == f"/tmp/buildtool-{os.getuid()}/cache"
    # A relative HOME put the cache under the directory buildtool ran in: the passwd entry's home instead.
    import pwd

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "relhome")
    passwd_home = pwd.getpwuid(os.getuid()).pw_dir
    assert config.default_cache_dir() == os.path.join(passwd_home, ".cache", "buildtool")
    assert config.user_config_path() == os.path.join(passwd_home, ".config", "buildtool", "config.toml")


def test_an_unknown_config_key_gets_a_did_you_mean(workspace: Workspace) -> None:
    """`jobz = 3` listed every key but did not say which was meant (BUILD.py attributes do)."""
    workspace.build_file("", 'genrule(name="x", outs=["x"], cmd="touch $@")\n')
    workspace.write("buildtool.toml", "jobz = 3\n")
    rc, _, err = workspace.run("build")
    assert rc == 2 and "unknown config key 'jobz' (did you mean 'jobs'?); known keys are:" in err, err
    workspace.write("buildtool.toml", "zzzz = 3\n")
    rc, _, err = workspace.run("build")
    assert rc == 2 and "unknown config key 'zzzz'; known keys are:" in err, err


@pytest.mark.parametrize("value", ["0", "4097", "-1"])
def test_jobs_from_the_environment_out_of_range_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str,
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("BUILDTOOL_JOBS", value)
    _write(tmp_path / "ws" / "buildtool.toml", "")
    with pytest.raises(config.UserError) as e:
        config.load_config(str(tmp_path / "ws"), {})
    assert str(e.value) == f"BUILDTOOL_JOBS must be from 1 to 4096 (got {int(value)})"


def test_a_cache_dir_inside_the_workspace_state_directory_is_refused(workspace: Workspace) -> None:
    """A cache at .buildtool/cache was deleted by `clean` ("never the shared cache",
    user-guide.md), and one under .buildtool/tmp was wiped at the end of every build:
    silently, for every workspace sharing it."""
    workspace.build_file("", 'genrule(name="x", outs=["x"], cmd="touch $@")\n')
    for where in (".buildtool/cache", ".buildtool/tmp/c", ".buildtool"):
        for command in (["build"], ["cache", "stats"]):
            rc, out, err = workspace.run(*command, cache=workspace.root / where)
            assert rc == 2 and "is inside this workspace's state directory" in err, (where, command, out, err)
    assert not (workspace.root / "x").exists()
    rc, _, err = workspace.run("build", cache=workspace.root / ".buildtool-cache")  # (beside it: fine)
    assert rc == 0, err
    # After a build, a plain `build --cache-dir` is checked against the no-op snapshot before
    # any config is read: the refusal must not depend on whether something changed.
    for _ in range(3):  # (until the snapshot vouches: a build's last outputs are racy at first)
        rc, out, err = workspace.run("build", cache=workspace.root / ".buildtool-cache")
        if "nothing changed" in out:
            break
    assert rc == 0 and "nothing changed" in out, out + err
    rc, out, err = workspace.run("build", "--cache-dir", ".buildtool/c", cache=workspace.root / ".buildtool-cache")
    assert rc == 2 and "is inside this workspace's state directory" in err, (out, err)


def test_the_workspace_config_beats_the_user_config(tmp_path, monkeypatch) -> None:
    from buildtool import config
    for k in list(os.environ):
        if k.startswith("BUILDTOOL_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "buildtool").mkdir(parents=True)
    (tmp_path / "xdg" / "buildtool" / "config.toml").write_text("jobs = 3\n")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "buildtool.toml").write_text("jobs = 5\n")
    assert config.load_config(str(tmp_path / "ws"), {}).jobs == 5
