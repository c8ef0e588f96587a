"""Config: settings from flags, ``BUILDTOOL_*`` env vars, ``buildtool.toml`` and the
user's config file, in that order of precedence.  Unknown keys are an error (exit 2).
"""

from __future__ import annotations

import os

from buildtool.errors import UserError
from buildtool.workspace import STATE_DIR, read_file

MAX_JOBS = 4096  # -j, jobs, remote_jobs: beyond this a typo, not a machine (each job has a lane)


def integer(text: str) -> int:
    """A whole number written in ASCII digits, with an optional ``-`` (an argparse ``type=``):
    Python's ``int()`` also takes other scripts' digits, ``'1_0'`` and ``' 3 '``: typos here."""
    digits = text[1:] if text[:1] == "-" else text
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(text)
    return int(text)

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

KEYS: dict[str, type] = {
    "jobs": int,
    "keep_going": bool,
    "cache_dir": str,
    "action_env": list,
    "restore_mode": str,
    "pools": dict,
    "max_size": str,  # or an int of bytes; user config / env only (the cache is shared)
    "test_timeout": float,  # or an int: seconds, for a test without timeout= (Bazel's --test_timeout)
    # remote cache / execution (docs/remote.md); validated by buildtool/remote/options.py
    "remote_cache": str,
    "remote_executor": str,
    "remote_instance": str,
    "remote_headers": dict,
    "remote_timeout": float,
    "remote_upload": bool,
    "remote_jobs": int,
    "remote_download": str,
}
RESTORE_MODES = ("copy", "hardlink")


class Config:
    """The merged settings; one keyword per key of ``KEYS`` (None for a list or dict: empty)."""

    __slots__ = ("action_env", "cache_dir", "jobs", "keep_going", "max_size", "pools", "remote_cache",
                 "remote_download", "remote_executor", "remote_headers", "remote_instance", "remote_jobs",
                 "remote_timeout", "remote_upload", "restore_mode", "test_timeout")

    def __init__(
        self,
        jobs: int | None = None,
        keep_going: bool = False,
        cache_dir: str = "",
        action_env: list[str] | None = None,
        restore_mode: str = "copy",
        pools: dict[str, int] | None = None,
        max_size: int | None = None,  # bytes; cache_gc.py keeps the shared cache under it
        remote_cache: str = "",  # grpc(s)://HOST:PORT or http(s)://HOST[:PORT][/prefix]
        remote_executor: str = "",  # grpc(s)://HOST:PORT
        remote_instance: str = "",
        remote_headers: dict[str, str] | None = None,
        remote_timeout: float = 30.0,
        remote_upload: bool | None = None,  # None: on in CI (the CI variable), off elsewhere
        remote_jobs: int | None = None,  # with remote_executor: run up to this many actions at once
        remote_download: str = "all",  # with remote_executor: all | toplevel | minimal (docs/remote.md)
        test_timeout: float | None = None,  # seconds: a test's timeout when its BUILD.py gives none
    ) -> None:
        self.test_timeout = test_timeout
        self.jobs = jobs
        self.keep_going = keep_going
        self.cache_dir = cache_dir
        self.action_env = [] if action_env is None else action_env
        self.restore_mode = restore_mode
        self.pools = {} if pools is None else pools
        self.max_size = max_size
        self.remote_cache = remote_cache
        self.remote_executor = remote_executor
        self.remote_instance = remote_instance
        self.remote_headers = {} if remote_headers is None else remote_headers
        self.remote_timeout = remote_timeout
        self.remote_upload = remote_upload
        self.remote_jobs = remote_jobs
        self.remote_download = remote_download


def _home() -> str | None:
    """The user's home directory; None when there is none to be had (HOME unset and a uid
    with no passwd entry: expanduser gives "~" back, which was then a directory named
    ``~`` made in the current directory for the cache).  A relative HOME (``HOME=.``)
    names no one place: the passwd entry's directory is taken instead, as for no HOME
    (it put the cache under whatever directory buildtool ran in)."""
    home = os.path.expanduser("~")
    if not home.startswith("~") and not os.path.isabs(home):
        try:
            import pwd

            home = pwd.getpwuid(os.getuid()).pw_dir
        except (KeyError, ImportError):
            return None
    return None if home.startswith("~") or not os.path.isabs(home) else home


def _xdg(var: str) -> str | None:
    """$XDG_CONFIG_HOME / $XDG_CACHE_HOME when set to an absolute path (a relative one is
    to be ignored, as the XDG spec says)."""
    v = os.environ.get(var)
    return v if v and os.path.isabs(v) else None


def user_config_path() -> str:
    home = _home()
    base = _xdg("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else "")
    return os.path.join(base, "buildtool", "config.toml") if base else ""


def default_cache_dir() -> str:
    home = _home()
    base = _xdg("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home else None)
    if base is None:  # (no home: in this user's own /tmp/buildtool-<uid>, not "./~/.cache")
        from buildtool.workspace import private_tmp_dir

        d = private_tmp_dir()
        # (that name taken by another user: no cache at all, "not usable", rather than theirs)
        return os.path.join(d, "cache") if d else "/dev/null/no-home-for-a-cache"
    return os.path.join(base, "buildtool")


def _read_toml(path: str, user: bool = False) -> dict[str, Any]:
    """The TOML at ``path``; {} if there is none.  ``user``: the user's config, absent when
    its directory cannot be reached (HOME=/dev/null, `su -m` into another user's home):
    there is none to read, as for a missing file (a warning when it is a permission)."""
    if not path:  # (no home: no user config)
        return {}
    try:
        data = read_file(path)[0]
    except FileNotFoundError:
        return {}
    except NotADirectoryError:
        if user:
            return {}
        msg = f"{path}: cannot read config (Not a directory)"
        raise UserError(msg) from None
    except OSError as e:
        import errno
        import sys

        if user and e.errno in (errno.EACCES, errno.EPERM) and not os.path.isfile(path):
            print(f"buildtool: warning: {path}: cannot be reached ({e.strerror}); no user config", file=sys.stderr)
            return {}
        msg = f"{path}: cannot read config ({e.strerror})"
        raise UserError(msg) from None
    if not data.strip():
        return {}
    import tomllib

    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        msg = f"{path}: invalid TOML: {e}"
        raise UserError(msg) from None


def _file_layer(path: str, user: bool = False) -> dict[str, Any]:
    """A config file's settings; a relative ``cache_dir`` in it is taken from the file's own
    directory (the workspace root for ``buildtool.toml``), whatever directory buildtool is
    started in."""
    raw = _read_toml(path, user)
    try:
        layer = _check(path, raw)
    except UserError:  # again, with the file's text: the error names the key's line
        _check(path, raw, read_file(path)[0].decode("utf-8", "replace"))
        raise
    d = layer.get("cache_dir")
    if d and not d.startswith("~") and not os.path.isabs(d):
        layer["cache_dir"] = os.path.join(os.path.dirname(path), d)
    return layer


def _check(path: str, raw: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    """``raw``'s settings checked; an error names ``path`` and, given the file's ``text``,
    the line that sets the key."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        at = f"{path}:{n}" if text is not None and (n := _line_of(text, k)) else path
        want = KEYS.get(k)
        if want is None:
            import difflib  # (this error only)

            near = difflib.get_close_matches(str(k), list(KEYS), n=1, cutoff=0.7)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            msg = f"{at}: unknown config key {k!r}{hint}; known keys are: {', '.join(sorted(KEYS))}"
            raise UserError(msg)
        if k.startswith("remote_"):
            from buildtool.remote.options import check_key

            try:
                out[k] = check_key(k, v)
            except ValueError as e:
                if path.startswith("environment"):  # name the variable, not the key
                    from buildtool.remote.options import ENV_VARS

                    raise UserError(f"{ENV_VARS.get(k, path)}: {e}") from None
                raise UserError(f"{at}: {e}") from None
            continue
        if k == "test_timeout":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:  # (NaN compares false)
                msg = f"{at}: test_timeout must be a positive number of seconds (got {v!r})"
                raise UserError(msg)
            out[k] = float(v)
            continue
        if k == "max_size":
            from buildtool.cache_gc import parse_size

            try:
                out[k] = parse_size(v)
            except ValueError:
                msg = f"{at}: max_size must be a size such as 500M, 2G or a number of bytes (got {v!r})"
                raise UserError(msg) from None
            continue
        if want is int and (isinstance(v, bool) or not isinstance(v, int)):
            msg = f"{at}: {k} must be an integer (got {v!r})"
            raise UserError(msg)
        if not isinstance(v, want):
            msg = f"{at}: {k} must be a {want.__name__} (got {v!r})"
            raise UserError(msg)
        if k == "action_env":
            if not all(isinstance(x, str) for x in v):
                msg = f"{at}: action_env must be a list of variable names (got {v!r})"
                raise UserError(msg)
            check_action_env(v, f"{at}: action_env")
        if k == "pools":
            for name, depth in v.items():
                if text is not None and (n := _line_of(text, k, str(name))):
                    at = f"{path}:{n}"
                if name == "console":
                    msg = (f"{at}: pools.console cannot be configured: the console pool is built in "
                           "with depth 1 (its actions share the terminal)")
                    raise UserError(msg)
                if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
                    msg = f"{at}: pools.{name} must be a non-negative integer depth (got {depth!r})"
                    raise UserError(msg)
        if k == "cache_dir" and not v:
            msg = f"{at}: cache_dir must name a directory (got an empty string)"
            raise UserError(msg)
        if k == "restore_mode" and v not in RESTORE_MODES:
            msg = f"{at}: restore_mode must be one of {', '.join(RESTORE_MODES)} (got {v!r})"
            raise UserError(msg)
        if k in ("jobs", "remote_jobs") and not 1 <= v <= MAX_JOBS:
            msg = f"{at}: {k} must be from 1 to {MAX_JOBS} (got {v})"
            raise UserError(msg)
        out[k] = v
    return out


def _line_of(text: str, key: str, sub: str | None = None) -> int | None:
    """The line of a TOML text that sets top-level ``key`` (``key =``, ``key.x =`` or a
    ``[key]`` table), or ``key.sub`` (``key.sub =``, ``sub =`` in ``[key]``), for an error to
    point at; None where it cannot be told."""
    import re  # (errors only)

    def quoted(k: str) -> str:
        return rf"(?:{re.escape(k)}|\"{re.escape(k)}\"|'{re.escape(k)}')"

    name = quoted(key)
    table: str | None = None  # the table the line is in ("": top level; a key inside another is not ours)
    found: int | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*\[\s*{name}\s*\]", line):
            table, found = key, found or n
        elif re.match(r"\s*\[", line):
            table = "[other]"
        elif table is None and re.match(rf"\s*{name}\s*[=.]", line):
            if sub is None or re.match(rf"\s*{name}\s*\.\s*{quoted(sub)}\s*=", line):
                return n
            found = found or n
        elif table == key and sub is not None and re.match(rf"\s*{quoted(sub)}\s*=", line):
            return n
        if table == key and sub is None and found:
            return found
    return found


def env_bool(var: str, v: str) -> bool:
    """A yes/no environment variable; anything else is an error (exit 2), not a silent no."""
    low = v.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    msg = f"{var} must be 1/true/yes/on or 0/false/no/off (got {v!r})"
    raise UserError(msg)


# Variables buildtool sets in every command's environment (runner._execute), which no
# target or --action-env may give: the value given went into the key, not into the run.
RESERVED_ENV = {
    "BUILDTOOL_LANE": "every command's lane directory: how a killed build's commands are found",
}


def check_action_env(items: list[str], where: str) -> None:
    """Each ``NAME`` or ``NAME=VALUE`` of --action-env / action_env names a valid variable,
    not one buildtool sets itself."""
    for item in items:
        name = item.partition("=")[0]
        if name in RESERVED_ENV:
            msg = f"{where}: {name} is set by buildtool ({RESERVED_ENV[name]}), so it cannot be given"
            raise UserError(msg)
        if not (name and (name[0].isalpha() or name[0] == "_") and name.isascii()
                and all(c.isalnum() or c == "_" for c in name)):
            msg = (f"{where}: {item!r} is not NAME or NAME=VALUE with a variable name of letters, "
                   f"digits and _ (not starting with a digit)")
            raise UserError(msg)


def _env_layer() -> dict[str, Any]:
    out: dict[str, Any] = {}
    env = os.environ
    if env.get("BUILDTOOL_JOBS"):
        try:
            out["jobs"] = integer(env["BUILDTOOL_JOBS"].strip())  # (a stray space of an env file or YAML)
        except ValueError:
            msg = f"BUILDTOOL_JOBS must be an integer (got {env['BUILDTOOL_JOBS']!r})"
            raise UserError(msg) from None
        if not 1 <= out["jobs"] <= MAX_JOBS:
            msg = f"BUILDTOOL_JOBS must be from 1 to {MAX_JOBS} (got {out['jobs']})"
            raise UserError(msg)
    if env.get("BUILDTOOL_TEST_TIMEOUT"):
        try:
            seconds: object = float(env["BUILDTOOL_TEST_TIMEOUT"].strip())
        except ValueError:
            seconds = env["BUILDTOOL_TEST_TIMEOUT"]
        out.update(_check("BUILDTOOL_TEST_TIMEOUT", {"test_timeout": seconds}))
    if env.get("BUILDTOOL_KEEP_GOING"):
        out["keep_going"] = env_bool("BUILDTOOL_KEEP_GOING", env["BUILDTOOL_KEEP_GOING"])
    for var, key in (("BUILDTOOL_CACHE_DIR", "cache_dir"), ("BUILDTOOL_ACTION_ENV", "action_env"),
                     ("BUILDTOOL_RESTORE_MODE", "restore_mode"), ("BUILDTOOL_MAX_CACHE_SIZE", "max_size")):
        if env.get(var):
            value = [x.strip() for x in env[var].split(",") if x.strip()] if key == "action_env" else env[var]
            out.update(_check(var, {key: value}))  # (an error names the variable, not the key)
    if any(k.startswith("BUILDTOOL_REMOTE_") for k in env):
        from buildtool.remote.options import env_values

        try:
            remote = env_values(env)
        except ValueError as e:
            raise UserError(str(e)) from None
        out.update(_check("environment (BUILDTOOL_*)", remote))
    return out


def load_config(root: str, flags: dict[str, Any], workspace: bool = True) -> Config:
    """Merge the layers; ``flags`` holds only the options given on the command line.
    ``workspace``: ``root`` is a workspace's (else: `cache` commands run outside any)."""
    merged: dict[str, Any] = {}
    ws_toml = os.path.join(root, "buildtool.toml")
    ws_layer = _file_layer(ws_toml)
    if "max_size" in ws_layer:
        n = _line_of(read_file(ws_toml)[0].decode("utf-8", "replace"), "max_size")
        msg = (f"{ws_toml}{f':{n}' if n else ''}: max_size cannot be set by a workspace: the cache is shared by all "
               f"workspaces; set it in {user_config_path() or 'the user config'} or BUILDTOOL_MAX_CACHE_SIZE")
        raise UserError(msg)
    for layer in (
        _file_layer(user_config_path(), user=True),
        ws_layer,
        _env_layer(),
        {k: v for k, v in flags.items() if v is not None},
    ):
        for k, v in layer.items():
            if k in ("pools", "remote_headers"):  # tables: merged key by key, the higher source winning
                merged[k] = {**merged.get(k, {}), **v}
            else:
                merged[k] = v
    cfg = Config(**merged)
    if cfg.remote_headers and any(u and u.lower().startswith("grpc") for u in (cfg.remote_cache, cfg.remote_executor)):
        from buildtool.remote.options import grpc_header_problem

        problem = grpc_header_problem(cfg.remote_headers, "--remote-header / remote_headers")
        if problem is not None:
            raise UserError(problem)
    if not cfg.cache_dir:
        cfg.cache_dir = default_cache_dir()
    cfg.cache_dir = os.path.abspath(os.path.expanduser(cfg.cache_dir))
    state = os.path.realpath(os.path.join(root, STATE_DIR))
    if workspace and os.path.commonpath([os.path.realpath(cfg.cache_dir), state]) == state:
        raise UserError(f"the cache dir {cfg.cache_dir} is inside this workspace's state directory {state}, "
                        f"which `buildtool clean` deletes and builds prune (the cache, shared by every workspace, "
                        f"would be lost): put it elsewhere (default: {default_cache_dir()})")
    return cfg


# CI services that do not set ``CI``, by a variable each always sets: Jenkins, Azure
# Pipelines, TeamCity, AWS CodeBuild, Bamboo.  (GitHub Actions, GitLab, CircleCI, Travis,
# Buildkite, Bitbucket, Drone and Woodpecker set ``CI``.)
CI_MARKERS = ("JENKINS_URL", "TF_BUILD", "TEAMCITY_VERSION", "CODEBUILD_BUILD_ID", "bamboo_buildKey")


def in_ci() -> bool:
    """Whether this runs in CI: ``CI`` says so (``1``/``true``/``yes``; ``0``/``false``/``no``
    says not, whatever else is set), else a CI service without ``CI`` is recognised by its
    own variable (CI_MARKERS)."""
    ci = os.environ.get("CI", "").lower()
    if ci in ("1", "true", "yes"):
        return True
    if ci in ("0", "false", "no"):
        return False
    return any(os.environ.get(k) for k in CI_MARKERS)


def cpu_count() -> int:
    """CPUs this process may use: its affinity mask, and its cgroup's CPU quota rounded up
    (1.5 CPUs allow 2 jobs)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpus()
    if quota is not None:
        n = max(1, min(n, -int(-quota // 1)))  # rounded up
    return n


def cgroup_cpus(fs: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup") -> float | None:
    """The tightest CPU quota on this process's cgroup and its ancestors, in CPUs: cgroup v2
    ``cpu.max``, or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; None if none is set
    (or there are no cgroups).  A cgroup path that is not visible (a container sees its own
    cgroup as the root) falls back to the hierarchy's root."""
    try:
        with open(own) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = ["0::/"]
    found: list[float] = []
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and not controllers:  # v2 (also the "unified" mount of a hybrid setup)
            for mount in (fs, os.path.join(fs, "unified")):
                found += _quotas(mount, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # v1
            for mount in {os.path.join(fs, c) for c in ("cpu", "cpu,cpuacct", "cpuacct,cpu")}:
                found += _quotas(mount, path, _v1_quota)
    return min(found) if found else None


def _quotas(mount: str, path: str, read: Callable[[str], float | None]) -> list[float]:
    """The quotas set along ``path`` up to the hierarchy's root at ``mount``."""
    if not os.path.isdir(mount):
        return []
    d = os.path.join(mount, path.strip("/"))
    if not os.path.isdir(d):
        d = mount
    top = os.path.normpath(mount)
    d = os.path.normpath(d)
    out = []
    while True:
        q = read(d)
        if q is not None:
            out.append(q)
        if len(d) <= len(top):
            return out
        d = os.path.dirname(d)


def _v2_quota(d: str) -> float | None:
    try:
        with open(os.path.join(d, "cpu.max")) as f:
            quota, period = f.read().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(d: str) -> float | None:
    try:
        with open(os.path.join(d, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(d, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None
