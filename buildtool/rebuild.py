"""Rebuilder: is a target fresh, and if not, why?  Every decision carries a reason.

Constructive traces (à la carte's CloudBuild cell): a target is ``up_to_date`` when this
workspace's build record holds the same action key and the outputs on disk still have
the recorded digests.  Otherwise the shared cache may restore it; otherwise it runs, and
the reason compares the new action description against the recorded one: which input
changed (old and new digest prefixes), which command text or env var changed, and so on.
"""

from __future__ import annotations

from buildtool.outcome import Reason

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    DigestOf = Callable[[str], str | None]  # path -> digest on disk, None if missing


KEY_CHANGED = "the action key changed"  # why_changed when no part of the description differs


# (a record entry goes when its target's run fails and when the target leaves the graph)
NOT_RECORDED = ("not in this workspace's build record "
                "(never built here, its last run failed, or it left the graph since)")
# The one wording of "fresh": build --explain, --events and explain say it alike.
UNCHANGED = "same action key as this workspace's last build, outputs unchanged"


def outputs_match(
    recorded: list[list[Any]], digest_of: DigestOf, mode_of: Callable[[str], int | None] | None = None,
) -> tuple[bool, Reason | None, str]:
    """Do the files on disk still hold the recorded outputs?  ``mode_of``: the st_mode the
    last ``digest_of`` call saw (None: not known), to hold the executable bit too."""
    for path, digest, *rest in recorded:
        now = digest_of(path)
        if now is None:
            return False, Reason.OUTPUT_MISSING, f"output {path} is missing"
        if now != digest:
            return False, Reason.OUTPUT_MODIFIED, f"output {path} was modified since it was built"
        mode = mode_of(path) if mode_of is not None and rest else None
        if mode is not None and bool(mode & 0o100) != bool(rest[0] & 0o100):  # (chmod -x of a built tool)
            how = "lost" if rest[0] & 0o100 else "gained"
            return False, Reason.OUTPUT_MODIFIED, f"output {path} {how} its executable bit since it was built"
    return True, None, ""


def up_to_date(
    entry: Mapping[str, Any] | None, key: str, digest_of: DigestOf,
    mode_of: Callable[[str], int | None] | None = None,
) -> tuple[bool, Reason, str]:
    """The verifying-trace check: same key as last time and outputs intact."""
    if entry is None:
        return False, Reason.NEW, NOT_RECORDED
    if entry.get("k") != key:
        return False, Reason.DEFINITION_CHANGED, KEY_CHANGED
    ok, reason, msg = outputs_match(entry.get("o", []), digest_of, mode_of)
    if ok:
        return True, Reason.UP_TO_DATE, f"up to date: {UNCHANGED}"
    assert reason is not None
    return False, reason, msg


def _short(d: str | None) -> str:
    if d and d.startswith("remote:"):  # left in the remote CAS: "remote:<fn>:<hash>:<size>"
        return "remote " + d.split(":")[2][:8]
    return d[:8] if d else "absent"


def _where(d: str) -> str:
    """Where a dependency's output was when a key named it: on disk (its BLAKE3), or left in
    the remote executor's CAS (``remote:<fn>:<hash>:<size>``, --remote-download)."""
    return "left in the remote CAS" if d.startswith("remote:") else "on disk"


def shared_description(desc: Mapping[str, Any]) -> dict[str, Any]:
    """``desc`` as the cache's descriptions table keeps it (formats.md): each env value but
    PATH's replaced by its digest (``blake3:<hex>``), which tells "changed" as well, and
    keeps a secret a target reads from the environment out of a cache other users read."""
    env = desc.get("env")
    if not isinstance(env, dict):
        return dict(desc)
    import blake3

    hidden = {k: v if k == "PATH" or not isinstance(v, str) else
              "blake3:" + blake3.blake3(v.encode("utf-8", "surrogateescape")).hexdigest() for k, v in env.items()}
    return {**desc, "env": hidden}


def why_changed(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    owner_of: Callable[[str], str | None],
) -> tuple[Reason, str]:
    """Compare the recorded action description with the new one; the first difference
    decides the reason code, and the message lists up to a few differences."""
    if old is None:
        return Reason.NEW, NOT_RECORDED
    if _flat_test_closure(old, new):
        return Reason.DEFINITION_CHANGED, ("the test's key format changed: its dependencies' inputs are keyed "
                                           "through their closure digests now, not listed one by one")
    found: list[tuple[Reason, str]] = []
    if old.get("cmd") != new.get("cmd"):
        was, now = _clip_pair(str(old.get("cmd")), str(new.get("cmd")))
        found.append((Reason.COMMAND_CHANGED, f"command changed: was {was!r}, now {now!r}"))
    if old.get("shell") != new.get("shell"):
        found.append((Reason.COMMAND_CHANGED, f"shell changed from {old.get('shell')} to {new.get('shell')}"))
    oenv, nenv = old.get("env", {}), new.get("env", {})
    for k in sorted(set(oenv) | set(nenv)):
        if oenv.get(k) != nenv.get(k):
            if k not in oenv:
                found.append((Reason.ENV_CHANGED, f"env var {k} was added"))
            elif k not in nenv:
                found.append((Reason.ENV_CHANGED, f"env var {k} was removed"))
            elif k == "PATH":  # (no secret: say how, which an unactivated venv explains at once)
                found.append((Reason.ENV_CHANGED, f"env var PATH changed: {_path_change(oenv[k], nenv[k])}"))
            else:
                found.append((Reason.ENV_CHANGED, f"env var {k} changed"))
    otools, ntools = old.get("tools", {}), new.get("tools", {})
    for k in sorted(set(otools) | set(ntools)):
        if otools.get(k) != ntools.get(k):
            found.append(
                (Reason.TOOL_CHANGED, f"tool {k} changed ({_short(otools.get(k))} -> {_short(ntools.get(k))})")
            )
    oin, nin = old.get("inputs", {}), new.get("inputs", {})
    made_other: set[str] = set()  # dependencies whose outputs changed (what they read did too: said once)
    for p, d in nin.items():
        od = oin.get(p)
        if od == d:
            continue
        owner = owner_of(p)
        if owner is not None:
            made_other.add(owner)
        if od is None:
            found.append((Reason.INPUTS_ADDED_REMOVED, f"input {p} was added"))
        elif owner is not None and _where(od) != _where(d):  # (two hash functions: no telling the content)
            found.append((Reason.DEP_CHANGED, f"dependency {owner}'s output {p} was {_where(od)} and is "
                          f"{_where(d)} now, so the key names it by another digest ({_short(od)} -> {_short(d)})"))
        elif owner is not None:
            found.append(
                (
                    Reason.DEP_CHANGED,
                    f"dependency {owner} produced a different output {p} ({_short(od)} -> {_short(d)})",
                )
            )
        else:
            found.append((Reason.INPUT_CHANGED, f"input {p} changed ({_short(od)} -> {_short(d)})"))
    for p in oin:
        if p not in nin:
            found.append((Reason.INPUTS_ADDED_REMOVED, f"input {p} was removed"))
    if old.get("outs") != new.get("outs"):
        found.append((Reason.OUTPUTS_CHANGED, "the declared outputs changed"))
    oextra, nextra = dict(old.get("extra", {})), dict(new.get("extra", {}))
    ox, nx = _executable(oextra.pop("executable", "[]")), _executable(nextra.pop("executable", "[]"))
    for p in sorted(nx - ox):
        if p in oin:  # (a new input is reported as added)
            found.append(_mode_changed(p, owner_of(p), "became executable", oin[p] == nin.get(p)))
    for p in sorted(ox - nx):
        if p in nin:
            found.append(_mode_changed(p, owner_of(p), "is no longer executable", oin.get(p) == nin[p]))
    for k in sorted(set(oextra) | set(nextra)):
        if k.startswith("closure:") and k[len("closure:"):] in made_other and k in oextra and k in nextra:
            continue
        if oextra.get(k) != nextra.get(k):
            code = Reason.DEP_CHANGED if k.startswith(("closure:", "after:")) else Reason.DEFINITION_CHANGED
            found.append((code, _extra_changed(k, oextra.get(k), nextra.get(k))))
    if old.get("pkg") != new.get("pkg") or old.get("kind") != new.get("kind") or old.get("v") != new.get("v"):
        found.append((Reason.DEFINITION_CHANGED, "the rule's kind, package or key format changed"))
    if not found:
        return Reason.DEFINITION_CHANGED, KEY_CHANGED
    msgs = [m for _, m in found[:4]]
    if len(found) > 4:
        msgs.append(f"and {len(found) - 4} more differences")
    return found[0][0], "; ".join(msgs)


def _flat_test_closure(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``old`` is a test's description from before closure digests, which listed
    every input of its dependencies, at any depth, in ``inputs``: its first run after the
    upgrade would otherwise list thousands of inputs "removed".  A test that had no
    dependency has no closure entry either, and its inputs are all still there when it
    gets one: that is a change to say, not a format."""
    oextra, nextra = old.get("extra"), new.get("extra", {})
    if old.get("kind") != "test" or not isinstance(oextra, dict) or any(k.startswith("closure:") for k in oextra):
        return False
    oin, nin = old.get("inputs"), new.get("inputs", {})
    if not isinstance(oin, dict) or not any(p not in nin for p in oin):
        return False
    return any(k.startswith("closure:") for k in nextra)


def _mode_changed(p: str, owner: str | None, how: str, same: bool) -> tuple[Reason, str]:
    """The reason an input's executable bit gives (a dependency's output: its producer's)."""
    if owner is not None:
        return Reason.DEP_CHANGED, f"dependency {owner}'s output {p} {how}" + (" (same content)" if same else "")
    return Reason.INPUT_CHANGED, f"input {p} {how}"


def _executable(text: str) -> set[str]:
    """The paths of an ``extra.executable`` value (a JSON list; anything else: none)."""
    import json

    try:
        got = json.loads(text)
    except ValueError:
        return set()
    return {p for p in got if isinstance(p, str)} if isinstance(got, list) else set()


def _clip_pair(a: str, b: str, n: int = 80) -> tuple[str, str]:
    """``a`` and ``b`` cut to about ``n`` characters around where they first differ (two
    long link lines differing at the end must not both print as the same prefix)."""
    if len(a) <= n and len(b) <= n:
        return a, b
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    start = max(0, i - n // 4)

    def cut(s: str) -> str:
        part = s[start:start + n - 6]
        return ("..." if start else "") + part + ("..." if start + n - 6 < len(s) else "")

    return cut(a), cut(b)


def _extra_changed(key: str, old: Any, new: Any) -> str:
    """The sentence for one changed ``extra`` entry of an action description."""
    if key.startswith("closure:"):  # a test's dependency: what it reads, at any depth
        label = key[len("closure:"):]
        if old is None or new is None:
            return f"dependency {label} was {'added' if old is None else 'removed'}"
        return (f"something dependency {label} reads changed, at some depth: a source of it or of a target "
                f"below it, or an output one of them made (closure {_short(old)} -> {_short(new)})")
    if key.startswith("after:"):  # a dependency without outputs (a stamp): the key it settled with
        label = key[len("after:"):]
        if old is None or new is None:
            return f"dependency {label}, which declares no outputs, was {'added' if old is None else 'removed'}"
        if str(new).startswith("always:"):
            return f"dependency {label}, which declares no outputs, has always=True: it ran again, and so does this"
        if str(old).partition("+")[0] == str(new).partition("+")[0]:
            return (f"dependency {label}, which declares no outputs, ran again with the same key (build -B), "
                    "and so does this")
        return f"dependency {label}, which declares no outputs, ran with another key ({_short(old)} -> {_short(new)})"
    if key.startswith("module:"):  # a pyrule's module or one it imports
        path = key[len("module:"):]
        if old is None or new is None:
            return f"the rule {'now' if old is None else 'no longer'} imports module {path}"
        return f"module {path} changed ({_short(old)} -> {_short(new)})"
    if key == "srcs":  # a pyrule's inputs in the order its function gets them (absent: sorted)
        return "the order of the rule's inputs changed (its function gets them in the order given)"
    names = {"fn": "function", "kwargs": "kwargs", "python": "Python", "timeout": "timeout", "depfile": "depfile"}
    if key == "encoding":  # (the locale's: what the command's text and its file names are written in)
        return f"the locale's encoding changed from {old or 'utf-8'} to {new or 'utf-8'}"
    if key in names:
        was, now = _clip_pair(str(old), str(new), 60)
        said = f"the rule's {names[key]} changed from {was} to {now}"
        if key == "kwargs" and _same_but_order(old, new):  # (fn sees the order: it reran, rightly)
            said += (" (the same items in another order: a dict built from a set comes out in another order "
                     "each run, as Python's string hashing is randomised; build it from sorted())")
        return said
    return f"the rule's definition changed ({key})"


def _same_but_order(old: Any, new: Any) -> bool:
    """Whether two kwargs JSON texts hold equal values, keys in another order."""
    import json

    try:
        return old != new and json.loads(old) == json.loads(new)
    except (TypeError, ValueError):
        return False


def _entry(e: str) -> str:
    """A PATH entry as an explanation shows it (an empty one is the current directory)."""
    return repr(e) if e else "an empty entry (the current directory)"


def _path_change(old: str, new: str) -> str:
    """What differs between two PATH values: the entries gone and added, else repeats or
    the order."""
    from buildtool.keys import keyed_path

    if keyed_path(old, "/") == new:  # (an older buildtool's key held it as given)
        return (f"was {old!r}, the same lookups: buildtool now keys PATH without repeated entries and "
                "trailing slashes (a one-time change)")
    o, n = old.split(":"), new.split(":")
    gone = [e for e in o if e not in n]
    added = [e for e in n if e not in o]
    parts = ([f"{', '.join(map(_entry, added[:3]))}{' ...' if len(added) > 3 else ''} added"] if added else []) + \
            ([f"{', '.join(map(_entry, gone[:3]))}{' ...' if len(gone) > 3 else ''} gone"] if gone else [])
    if parts:
        return "; ".join(parts)
    twice = [e for e in dict.fromkeys(n) if n.count(e) > o.count(e)]
    once = [e for e in dict.fromkeys(o) if o.count(e) > n.count(e)]
    if twice or once:  # (`PATH=$PATH:/usr/bin`: nothing reordered)
        said = [f"{', '.join(map(_entry, twice[:3]))} listed again" if twice else "",
                f"{', '.join(map(_entry, once[:3]))} listed fewer times" if once else ""]
        return "; ".join(p for p in said if p)
    return "the same entries in another order"
