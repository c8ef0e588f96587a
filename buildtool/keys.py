"""Action keys: the canonical description of an action and its BLAKE3 key.

The key covers the rule kind, the package (the working directory), the command after
substitution, the shell, the environment the command receives (minus the per-action
TMPDIR/HOME), declared tools with their binary digests, every input's workspace-relative
path and digest, the output paths and KEY_VERSION — never the workspace's absolute path,
so the same workspace at two paths gets the same keys.  Spec: docs/formats.md#action-key
"""

from __future__ import annotations

import json
import os
import sys

import blake3

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

# 2: extra.executable lists dependencies' outputs too (an upgrade reruns every target once,
# said as "the key format changed", rather than some of them for a bit that did not change)
KEY_VERSION = 2


def compact_json(sort_keys: bool) -> Callable[[object], str]:
    """``json.dumps(o, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False)``,
    the same text, without building a JSONEncoder on each call: json's C encoder made
    once (its circular check off: these are plain trees).  ~2.5 us less per call, and a
    build makes two per target (its key, its build-record line)."""
    from json.encoder import c_make_encoder, encode_basestring

    def unknown(o: object) -> object:
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    try:  # (markers, default, encoder, indent, key sep, item sep, sort_keys, skipkeys, allow_nan)
        encode = c_make_encoder(None, unknown, encode_basestring, None, ":", ",", sort_keys, False, True)
    except TypeError:  # no C accelerator (None), or one that takes other arguments: json's own path
        return json.JSONEncoder(sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False).encode
    return lambda o: "".join(encode(o, 0))


def compact_loads() -> Callable[[bytes], Any]:
    """``json.loads`` of UTF-8 bytes, the same result, through json's C scanner made once:
    ~3 us less per call than ``json.loads``'s encoding detection and Python-level decode.
    What it does not take whole (surrounding whitespace, a BOM, UTF-16, an error) goes
    to ``json.loads``, which says what it says of it."""
    from json.scanner import c_make_scanner

    if c_make_scanner is None:  # no C accelerator
        return json.loads
    scan = c_make_scanner(json.JSONDecoder())

    def loads(data: bytes) -> Any:
        try:
            text = data.decode("utf-8", "surrogatepass")
            obj, end = scan(text, 0)
        except (ValueError, StopIteration):  # not UTF-8 (ASCII UTF-16 decodes), no value at 0
            return json.loads(data)
        return obj if end == len(text) else json.loads(data)

    return loads


_canonical = compact_json(sort_keys=True)


def action_description(
    kind: str,
    pkg: str,
    cmd: str,
    shell: str,
    env: Mapping[str, str],
    tools: Mapping[str, str],
    inputs: Mapping[str, str],
    outs: tuple[str, ...],
    extra: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """Everything the key covers, as plain data (also stored for ``explain``)."""
    return {
        "v": KEY_VERSION,
        "kind": kind,
        "pkg": pkg,
        "cmd": cmd,
        "shell": shell,
        "env": dict(env),
        "tools": dict(tools),
        "inputs": dict(inputs),
        "outs": list(outs),
        "extra": dict(extra or {}),
    }


CHECKOUT_MARK = "$BUILDTOOL_CHECKOUT"  # stands for the checkout's root in a key's PATH


def checkout_root(root: str) -> str:
    """The root of the checkout holding the workspace: the nearest directory at or above
    ``root`` with a ``.git``, else ``root`` itself."""
    d = root
    while True:
        if os.path.lexists(os.path.join(d, ".git")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return root
        d = parent


def keyed_path(path: str, base: str) -> str:
    """``path`` (a PATH value) as keys hold it (and as the command gets it, ``real_path``):
    entries inside the checkout ``base`` written from ``CHECKOUT_MARK``, so two clones with
    their own ``.venv/bin`` first on PATH (as the README sets one up) share cache entries, as
    they share every workspace path; a trailing ``/`` dropped and an entry listed again left
    out (it never wins a lookup), so that a CI image's ``/bin/`` or a setup step's repeated
    entry does not miss every target."""
    base = base.rstrip("/") or "/"
    prefix = base + "/" if base != "/" else None

    def keyed(e: str) -> str:
        if e:  # ("": the working directory, as ".")
            e = e.rstrip("/") or "/"
        if prefix is None:
            return e
        r = e
        if e != base and not e.startswith(prefix) and os.path.isabs(e):
            r = os.path.realpath(e)  # (a venv made through a symlink to the checkout: `direnv`'s layout)
        return CHECKOUT_MARK + r[len(base):] if r == base or r.startswith(prefix) else e  # (others as given)

    return os.pathsep.join(dict.fromkeys(keyed(e) for e in path.split(os.pathsep)))


def real_path(path: str, base: str) -> str:
    """The PATH value a command gets for a keyed one (``keyed_path`` undone)."""
    if CHECKOUT_MARK not in path:
        return path
    mark, base = CHECKOUT_MARK, base.rstrip("/")
    return os.pathsep.join(base + e[len(mark):] if e == mark or e.startswith(mark + "/") else e
                           for e in path.split(os.pathsep))


def canonical(desc: Mapping[str, object]) -> str:
    """The description as the JSON text its key hashes (also how the build record stores it)."""
    return _canonical(desc)


def key_of(desc: Mapping[str, object]) -> str:
    return key_of_text(canonical(desc))


def key_of_text(text: str) -> str:
    """The key of a description given as its canonical text."""
    return blake3.blake3(text.encode("utf-8", "surrogateescape")).hexdigest()


def python_identity() -> str:
    v = sys.version_info
    return f"{sys.implementation.name}-{v.major}.{v.minor}.{v.micro}"


def pyrule_module_files(root: str, fn: str, missing: list[str] | None = None) -> list[str]:
    """Workspace-relative files of the pyrule's module and the workspace modules it
    imports (found statically, transitively).  ``missing``: filled with the workspace files
    an import looked for in vain (``m/__init__.py``, ``m.py``) or that would shadow the one
    found (``m/__init__.py`` beside ``m.py``): one made later would be imported instead (the
    no-op snapshot watches them).  An absolute import is looked for from the workspace root
    and also beside the importing module (``sys.path.insert(0, os.path.dirname(__file__))``,
    a script's habit): each file found counts."""
    module = fn.partition(":")[0]
    todo: list[tuple[str, str]] = [(module, "")]  # (module, the importer's directory, relative to root)
    seen_mods: set[tuple[str, str]] = set()
    files: list[str] = []
    while todo:
        mod, near = todo.pop()
        if (mod, near) in seen_mods:
            continue
        seen_mods.add((mod, near))
        where = os.path.join(root, near) if near else root
        path = _module_file(where, mod)
        if missing is not None and (path is None or not path.endswith("__init__.py")):
            base = os.path.join(near, *mod.split("."))
            missing.extend([os.path.join(base, "__init__.py")] + ([] if path else [base + ".py"]))
        if path is None:
            continue
        rel = os.path.relpath(path, root)
        files.append(rel)
        here = os.path.dirname(rel)  # ("": at the root)
        # A relative import (``from . import x``, ``from .sub import y``) is from this
        # module's package: the module itself for a package's __init__.py.
        package = mod if os.path.basename(path) == "__init__.py" else mod.rpartition(".")[0]
        for level, base, names in _imports_of(path):
            if level:
                up = package.split(".") if package else []
                if level - 1 > len(up) or (level - 1 == len(up) and not base):
                    continue  # (beyond the top package: an ImportError when it runs)
                base = ".".join([*up[:len(up) - (level - 1)], *([base] if base else [])])
            if not base:
                continue
            beside = not level and here and base.partition(".")[0] not in sys.stdlib_module_names
            for d in ("", here) if beside else ("",):  # (`import os` is never looked for beside it)
                todo.append((base, d))
                todo.extend((f"{base}.{n}", d) for n in names)
        # Parent packages' __init__ run on import too.
        parts = mod.split(".")
        todo.extend((".".join(parts[:i]), near) for i in range(1, len(parts)))  # (found where mod was)
    return sorted(set(files))


# path -> (its stat when parsed, its imports): a module is parsed once while it is unchanged
# (150 pyrules of one module tree parsed it 150 times per build and per watch cycle).
_IMPORTS: dict[str, tuple[tuple[int, int, int], list[tuple[int, str, tuple[str, ...]]]]] = {}


def _imports_of(path: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """The import statements of a module file: (level, module, names); ``import a.b`` is
    (0, "a.b", ()).  None parse: none."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    sig = (st.st_mtime_ns, st.st_size, st.st_ino)
    got = _IMPORTS.get(path)
    if got is not None and got[0] == sig:
        return got[1]
    import ast  # (pyrules only: ~2 ms of import)

    found: list[tuple[int, str, tuple[str, ...]]] = []
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            found.extend((0, a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or "", tuple(a.name for a in node.names)))
    _IMPORTS[path] = (sig, found)
    return found


def pyrule_fn_problem(root: str, fn: str) -> str | None:
    """Why ``fn`` ("module.path:function") cannot name a function, or None: its module is
    neither in the workspace nor importable here, or the workspace module never binds the
    name (no ``def``, ``class``, assignment or import of it anywhere in the file).
    A module with a syntax error: where.
    Conservative: a module that cannot be read, defines ``__getattr__``, star-imports or
    binds names through ``globals()``/``setattr``/``match`` is left for the run to judge."""
    import ast
    import importlib.machinery

    module, _, func = fn.partition(":")
    if not module or not func.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        return f"'fn' must be 'module.path:function' of Python identifiers (got {fn!r})"
    path = _module_file(root, module)
    if path is None:
        top = module.split(".")[0]
        in_workspace = _module_file(root, top) is not None  # then the workspace's package is the one imported
        builtin = top in sys.builtin_module_names
        # (searched as the pyrule's process searches: the workspace root first, then this
        # Python's path, which has the root only while a BUILD.py is evaluated)
        # (not PYTHONPATH's entries: the action never gets them, and its import failed at run
        # time; but one naming a directory the interpreter has anyway, its site-packages, stays)
        from_env = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
        if from_env:
            import site
            import sysconfig

            own = [*site.getsitepackages(), site.getusersitepackages(), *sysconfig.get_paths().values()]
            from_env -= {os.path.abspath(p) for p in own}
        where = [root, *(p for p in sys.path if os.path.abspath(p or ".") not in from_env)]
        spec = None if in_workspace or builtin else importlib.machinery.PathFinder.find_spec(top, where)
        if spec is not None and spec.origin in (None, "namespace") and "." in module:
            # A namespace package (directories without __init__.py), maybe the workspace's
            # own: the module must be in one of its directories.
            places = list(spec.submodule_search_locations or ())
            rest = module.split(".", 1)[1]
            if os.path.join(root, top) in places and not any(
                _module_file(d, rest) or os.path.isdir(os.path.join(d, *rest.split("."))) for d in places
            ):
                in_workspace = True
        if not in_workspace and (builtin or spec is not None):
            return None
        return (f"module {module!r} of fn={fn!r} is not in the workspace "
                f"(no {module.replace('.', '/')}.py or {module.replace('.', '/')}/__init__.py) nor importable")
    try:
        with open(path, "rb") as f:
            source = f.read()
        tree = ast.parse(source, path)
    except SyntaxError as e:  # (the run failed on it, exit 1, in ten frames of importlib)
        return (f"{os.path.relpath(path, root)}:{e.lineno}: syntax error: {e.msg} (the module of fn={fn!r}, "
                "which the rule's process imports)")
    except (OSError, ValueError):
        return None
    if b"globals()" in source or b"setattr(" in source:
        return None
    bound: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in n.names):
                return None
            bound.update(a.asname or a.name.split(".")[0] for a in n.names)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            bound.add(n.id)
        elif isinstance(n, ast.Match):
            return None
    if "__getattr__" in bound or func in bound:
        return None
    return f"{os.path.relpath(path, root)} never binds {func!r} (no def, class, assignment or import of it; fn={fn!r})"


def _module_file(root: str, mod: str) -> str | None:
    """The workspace file that ``import mod`` runs: a package's ``__init__.py`` before a
    ``mod.py`` beside it, as Python's path finder takes them."""
    base = os.path.join(root, *mod.split("."))
    for cand in (os.path.join(base, "__init__.py"), base + ".py"):
        if os.path.isfile(cand):
            return cand
    return None
