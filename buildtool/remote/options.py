"""Remote options: the endpoint URL grammar and the settings of the remote cache/executor.

Pure data and validation (no gRPC import), so config.py and cli.py can use it cheaply:
cli.py builds its parser from ``add_flags`` before the no-op fast path runs, so this
module imports neither ``dataclasses`` nor ``typing`` (together ~20 ms of start-up).
"""

from __future__ import annotations

from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SCHEMES = ("grpc", "grpcs", "http", "https")
DEFAULT_TIMEOUT_S = 30.0
MAX_REMOTE_TIMEOUT_S = 86_400 * 365  # (a year: past it, deadlines overflow what gRPC takes)
DOWNLOAD_MODES = ("all", "toplevel", "minimal")  # --remote-download (Bazel's --remote_download_outputs)


class Endpoint(namedtuple("Endpoint", ["scheme", "host", "port", "prefix", "userinfo"], defaults=(None,))):
    """scheme: grpc | grpcs | http | https; prefix: http(s) only, the path prefix without
    leading/trailing slash; userinfo: ``USER:PASSWORD`` given in the URL (sent as HTTP basic
    authentication, never printed), or None.  Immutable and hashable."""

    __slots__ = ()

    def headers(self, given: dict[str, str]) -> dict[str, str]:
        """The headers (gRPC metadata) to send to this endpoint: ``given``, with basic
        authentication from the URL's credentials in place of any ``authorization`` there
        (the URL names this endpoint; a header from a config file is for every remote)."""
        if self.userinfo is None:
            return dict(given)
        import base64

        return {**given, "authorization": "Basic " + base64.b64encode(self.userinfo.encode()).decode("ascii")}

    def metadata(self, given: dict[str, str]) -> tuple[tuple[str, str | bytes], ...]:
        """``headers`` as gRPC metadata: the value of a key ending in ``-bin`` is binary
        metadata, bytes (grpcio refused the text with a TypeError: every target failed)."""
        return tuple((k, v.encode() if k.endswith("-bin") else v) for k, v in self.headers(given).items())

    @property
    def is_grpc(self) -> bool:
        return self.scheme in ("grpc", "grpcs")

    @property
    def target(self) -> str:
        """host:port for gRPC (IPv6 literals bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        tail = f"/{self.prefix}" if self.prefix else ""
        return f"{self.scheme}://{self.target}{tail}"


def parse_endpoint(url: str, what: str = "--remote-cache", grpc_only: bool = False) -> Endpoint:
    """``grpc(s)://[USER:PASSWORD@]HOST:PORT`` or ``http(s)://[USER:PASSWORD@]HOST[:PORT][/prefix]``
    (``grpc_only``: an executor or a worker's server, which speak gRPC only); ValueError
    with a sentence saying what must be and what was found."""
    import urllib.parse

    try:
        u = urllib.parse.urlsplit(url)
    except ValueError as e:  # "Invalid IPv6 URL"
        msg = f"{what} is not a URL: {e} (got {_redacted(url)!r})"
        raise ValueError(msg) from None
    if u.scheme not in SCHEMES or not u.hostname or (grpc_only and u.scheme not in ("grpc", "grpcs")):
        forms = "grpc://HOST:PORT or grpcs://HOST:PORT" if grpc_only else \
            "grpc://HOST:PORT, grpcs://HOST:PORT or http(s)://HOST[:PORT][/prefix]"
        msg = f"{what} must be {forms} (got {_redacted(url)!r})"
        raise ValueError(msg)
    try:
        port = u.port
    except ValueError:
        msg = f"{what} has an invalid port (got {_redacted(url)!r})"
        raise ValueError(msg) from None
    if u.scheme in ("grpc", "grpcs"):
        if u.path not in ("", "/") or u.query:
            msg = (f"{what}: a gRPC endpoint takes no path; use --remote-instance for the instance name "
                   f"(got {_redacted(url)!r})")
            raise ValueError(msg)
        if port is None:
            port = 443 if u.scheme == "grpcs" else 80
    else:
        if u.query or u.fragment or "?" in url or "#" in url:
            msg = f"{what}: an HTTP cache URL takes no query or fragment (got {_redacted(url)!r})"
            raise ValueError(msg)
        if any(c.isspace() or not c.isprintable() or not c.isascii() for c in u.path):  # (é failed every target)
            msg = (f"{what}: the path has a space, a control or a non-ASCII character; percent-encode it "
                   f"(got {_redacted(url)!r})")
            raise ValueError(msg)
        if port is None:
            port = 443 if u.scheme == "https" else 80
    userinfo = None
    if u.username is not None:  # bazel-remote's htpasswd, a proxy's basic authentication
        import urllib.parse as up

        userinfo = up.unquote(u.username) + ":" + up.unquote(u.password or "")
    return Endpoint(u.scheme, u.hostname, port, u.path.strip("/"), userinfo)


def _redacted(url: str) -> str:
    """``url`` as shown in a message: a password in it replaced by ``***`` (a user part
    alone, which may be a token, as well)."""
    import urllib.parse

    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:  # (by the last @, not urlsplit's netloc: a '#', '?' or '/' in an unencoded
        # password ends the netloc early, and the rest of the password was shown as a path or fragment)
        userinfo, _, host = rest.rpartition("@")
        shown = f"{userinfo.partition(':')[0]}:***" if ":" in userinfo else "***"
        return f"{scheme}://{shown}@{host}"
    try:
        u = urllib.parse.urlsplit(url)
    except ValueError:
        return url.split("@")[-1]
    userinfo, at, host = u.netloc.rpartition("@")
    if not at:
        if not u.netloc and "@" in url:  # no "//" ("ghp_TOKEN@host:1", "http:TOKEN@host"): all before the last @
            return "***@" + url.rpartition("@")[2]
        return url
    shown = f"{userinfo.partition(':')[0]}:***" if ":" in userinfo else "***"
    return urllib.parse.urlunsplit(u._replace(netloc=f"{shown}@{host}"))


def check_instance(name: str, what: str = "--remote-instance") -> None:
    """An REAPI instance name: path segments of printable characters without spaces, none
    of them '.' or '..' (it is part of every resource name, and of HTTP paths)."""
    parts = name.split("/")
    if name and (any(p in ("", ".", "..") for p in parts)
                 or any(c.isspace() or not c.isprintable() or not c.isascii() for c in name)):
        msg = (f"{what} must be ASCII names joined by '/', without spaces, control characters, empty, '.' or "
               f"'..' parts (got {name!r})")
        raise ValueError(msg)


def parse_headers(items: list[str] | dict[str, str], what: str = "--remote-header") -> dict[str, str]:
    """``["K=V", ...]`` (or a mapping from a config file) -> {lower-case key: value}."""
    out: dict[str, str] = {}
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for i in items:
            if not isinstance(i, str) or "=" not in i:  # (shown up to a ':' or blank: the rest may be a token,
                # "Authorization: Bearer ..." in curl's syntax)
                got = f"{i.partition(':')[0].strip()!r}: ..." if isinstance(i, str) and ":" in i else \
                    "an entry without '='"  # (a value split at a ',' in it: all of it may be the token)
                msg = f"{what} must be KEY=VALUE (got {got}; what may be a token is not shown)"
                raise ValueError(msg)
            pairs.append(tuple(i.partition("=")[::2]))
    for k, v in pairs:
        if not isinstance(k, str) or not k.strip():
            msg = f"{what} must be KEY=VALUE with a non-empty KEY (got {k!r}=...; the value is not shown)"
            raise ValueError(msg)
        if not isinstance(v, str):
            msg = f"{what}: the value of {k!r} must be a string (got {v!r})"
            raise ValueError(msg)
        key = k.strip().lower()
        if not all(c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in key):
            msg = f"{what}: {k.strip()!r} is not a valid header name (letters, digits and !#$%&'*+-.^_`|~)"
            raise ValueError(msg)
        if any(c in v for c in "\r\n\0"):  # (the value is not shown: it may be a token)
            msg = f"{what}: the value of header {key!r} contains a line break or NUL"
            raise ValueError(msg)
        if not all(c.isascii() and (c.isprintable() or c == "\t") for c in v):  # (HTTP and gRPC metadata: ASCII)
            msg = f"{what}: the value of header {key!r} must be printable ASCII (encode it: base64, percent-encoding)"
            raise ValueError(msg)
        out[key] = v
    return out


def grpc_header_problem(headers: dict[str, str], what: str) -> str | None:
    """Why ``headers`` cannot go to a gRPC endpoint (metadata keys are lower-case letters,
    digits, ``-``, ``_`` and ``.``: HTTP allows more), or None.  Said before the build, not
    as the server's "INTERNAL Invalid metadata" on every call."""
    for k in headers:
        if not all(c in "abcdefghijklmnopqrstuvwxyz0123456789-_." for c in k):
            return (f"{what}: header {k!r} cannot be sent to a grpc:// endpoint: gRPC metadata keys are "
                    "lower-case letters, digits, '-', '_' and '.'")
    return None


class RemoteOptions:
    """The merged remote settings of one build (``from_config``)."""

    __slots__ = ("cache", "download", "executor", "headers", "instance", "jobs", "timeout", "upload")

    def __init__(
        self,
        cache: Endpoint | None = None,
        executor: Endpoint | None = None,
        instance: str = "",
        headers: dict[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        upload: bool = True,
        jobs: int | None = None,  # --remote-jobs
        download: str = "all",  # --remote-download: which outputs of remote actions are fetched
    ) -> None:
        self.cache = cache
        self.executor = executor
        self.instance = instance
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.upload = upload
        self.jobs = jobs
        self.download = download

    @property
    def enabled(self) -> bool:
        return self.cache is not None or self.executor is not None


ENV_VARS = {  # config key -> environment variable
    "remote_cache": "BUILDTOOL_REMOTE_CACHE",
    "remote_executor": "BUILDTOOL_REMOTE_EXECUTOR",
    "remote_instance": "BUILDTOOL_REMOTE_INSTANCE",
    "remote_headers": "BUILDTOOL_REMOTE_HEADERS",  # comma-separated K=V
    "remote_timeout": "BUILDTOOL_REMOTE_TIMEOUT",
    "remote_upload": "BUILDTOOL_REMOTE_UPLOAD",
    "remote_jobs": "BUILDTOOL_REMOTE_JOBS",
    "remote_download": "BUILDTOOL_REMOTE_DOWNLOAD",
}


def env_values(env: dict[str, str] | Any) -> dict[str, Any]:
    """The remote_* settings given as BUILDTOOL_REMOTE_* environment variables (raw).  An
    empty BUILDTOOL_REMOTE_CACHE or BUILDTOOL_REMOTE_EXECUTOR turns off one set by a config
    file (as ``--remote-cache=`` does); other empty variables are as if unset."""
    from buildtool.config import integer

    out: dict[str, Any] = {}
    for key, var in ENV_VARS.items():
        v = env.get(var)
        if v is None or (not v and key not in ("remote_cache", "remote_executor")):
            continue
        if key == "remote_headers":
            out[key] = [x.strip() for x in v.split(",") if x.strip()]
        elif key == "remote_upload":
            from buildtool.config import env_bool

            out[key] = env_bool(var, v)
        elif key == "remote_jobs":
            try:
                out[key] = integer(v.strip())
            except ValueError:
                msg = f"{var} must be a whole number (got {v!r})"
                raise ValueError(msg) from None
        elif key == "remote_timeout":
            try:
                out[key] = float(v)
            except ValueError:
                msg = f"{var} must be a number of seconds (got {v!r})"
                raise ValueError(msg) from None
        else:
            out[key] = v
    return out


def check_key(key: str, v: Any) -> Any:
    """Validate one remote_* config value; returns it normalised or raises ValueError."""
    if key in ("remote_cache", "remote_executor"):
        if not isinstance(v, str):
            msg = f"{key} must be a URL string (got {v!r})"
            raise ValueError(msg)
        if v:
            parse_endpoint(v, key, grpc_only=key == "remote_executor")
        return v
    if key == "remote_instance":
        if not isinstance(v, str):
            msg = f"remote_instance must be a string (got {v!r})"
            raise ValueError(msg)
        check_instance(v, key)
        return v
    if key == "remote_headers":
        if not isinstance(v, (list, dict)):
            msg = f"remote_headers must be a table of strings or a list of \"KEY=VALUE\" strings (got {v!r})"
            raise ValueError(msg)
        return parse_headers(v, key)
    if key == "remote_timeout":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < MAX_REMOTE_TIMEOUT_S:  # (NaN, inf)
            msg = (f"remote_timeout must be a positive number of seconds below a year, {MAX_REMOTE_TIMEOUT_S:.0f} "
                   f"(got {v!r})")
            raise ValueError(msg)
        return float(v)
    if key == "remote_jobs":
        from buildtool.config import MAX_JOBS

        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_JOBS:
            msg = f"remote_jobs must be a whole number from 1 to {MAX_JOBS} (got {v!r})"
            raise ValueError(msg)
        return v
    if key == "remote_download":
        if v not in DOWNLOAD_MODES:
            msg = f"remote_download must be one of {', '.join(DOWNLOAD_MODES)} (got {v!r})"
            raise ValueError(msg)
        return v
    if key == "remote_upload":
        if not isinstance(v, bool):
            msg = f"remote_upload must be true or false (got {v!r})"
            raise ValueError(msg)
        return v
    msg = f"unknown remote key {key!r}"
    raise ValueError(msg)


def add_flags(p: Any) -> None:
    """The remote options of ``build``/``test``/``watch``/``run`` (argparse)."""
    from buildtool.config import integer

    g = p.add_argument_group("remote cache and execution (docs/remote.md)")
    g.add_argument("--remote-cache", metavar="URL",
                   help="grpc(s)://HOST:PORT (REAPI) or http(s)://HOST[:PORT][/prefix] (Bazel HTTP cache)")
    g.add_argument("--remote-executor", metavar="URL", help="grpc(s)://HOST:PORT: run actions remotely (REAPI)")
    g.add_argument("--remote-instance", metavar="NAME", help="REAPI instance name (default empty)")
    g.add_argument("--remote-header", action="append", metavar="KEY=VALUE",
                   help="header sent with every remote request, e.g. an auth token (repeatable)")
    g.add_argument("--remote-timeout", type=float, metavar="SECONDS",
                   help="deadline of one remote call (default 30); a timeout disables the remote for the build")
    g.add_argument("--remote-jobs", type=integer, metavar="N",
                   help="with --remote-executor: actions in flight at once (may exceed the local cores)")
    g.add_argument("--remote-download", metavar="MODE",
                   help="with --remote-executor: which outputs of remote actions are downloaded: all (default), "
                        "toplevel (the requested targets' and what local actions need) or minimal (only what "
                        "local actions need); the rest stays in the server's CAS")
    g.add_argument("--remote-upload", action="store_true", default=None, dest="remote_upload",
                   help="upload results to the remote cache (default in CI: CI=true/1/yes, JENKINS_URL, TF_BUILD...)")
    g.add_argument("--no-remote-upload", action="store_false", dest="remote_upload",
                   help="only read from the remote cache")


def flags_of(args: Any) -> dict[str, Any]:
    """The remote_* config values given on the command line, validated."""
    raw = {
        "remote_cache": getattr(args, "remote_cache", None),
        "remote_executor": getattr(args, "remote_executor", None),
        "remote_instance": getattr(args, "remote_instance", None),
        "remote_headers": getattr(args, "remote_header", None),
        "remote_timeout": getattr(args, "remote_timeout", None),
        "remote_upload": getattr(args, "remote_upload", None),
        "remote_jobs": getattr(args, "remote_jobs", None),
        "remote_download": getattr(args, "remote_download", None),
    }
    out = {}
    for k, v in raw.items():
        if v is not None:
            try:
                out[k] = check_key(k, v)
            except ValueError as e:
                from buildtool.errors import UserError

                flag = "--" + k.replace("_", "-").removesuffix("s" if k == "remote_headers" else "")
                raise UserError(str(e).replace(k, flag, 1)) from None
    return out


def from_config(cfg: Any) -> RemoteOptions:
    """RemoteOptions of a merged config.Config.  Uploads default to on in CI only: CI
    fills the shared cache, developers' machines read from it."""
    from buildtool.config import in_ci

    return RemoteOptions(
        cache=parse_endpoint(cfg.remote_cache, "remote_cache") if cfg.remote_cache else None,
        executor=parse_endpoint(cfg.remote_executor, "remote_executor") if cfg.remote_executor else None,
        instance=cfg.remote_instance,
        headers=dict(cfg.remote_headers),
        timeout=cfg.remote_timeout,
        upload=cfg.remote_upload if cfg.remote_upload is not None else in_ci(),
        jobs=getattr(cfg, "remote_jobs", None),
        download=getattr(cfg, "remote_download", "all"),
    )
