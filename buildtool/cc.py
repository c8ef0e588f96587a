"""cc: a small standard library of C macros — cc_library, cc_binary, cc_test.

Plain Python on top of the DSL (``from buildtool.cc import cc_library, cc_binary, cc_test``
in a BUILD.py).  Each macro expands into ordinary targets:

- one compile ``genrule`` per source file, ``NAME@path~to~file.c``, writing
  ``_objs/NAME/path/to/file.o`` with ``cc -MD -MF`` and ``depfile=``, so the headers it
  includes are discovered after each run (only the objects that include an edited header
  rebuild) and only the ``.c`` file is a declared input; a label in ``srcs`` (a generated
  source) compiles to ``_objs/NAME/_gen/pkg~name.o`` as ``NAME@pkg~name`` (``~name`` for
  the root package's);
- ``cc_library``: an ``ar`` archive ``libNAME.a`` (target ``NAME.a``) and a ``group`` ``NAME``
  whose outputs are that archive followed by its ``deps``' archives, so a binary depending
  on ``:NAME`` links everything it needs;
- ``cc_binary``: a link step (``-Wl,--start-group`` on GNU ld, so archive order never matters);
- ``cc_test``: a ``cc_binary`` ``NAME.bin`` and a ``test`` ``NAME`` that runs it.

The compiler is ``$CC`` (read with ``getenv`` while evaluating, so changing it re-evaluates)
or ``cc``; it is declared in ``tools`` so its binary is part of every key.  When the compiler
is not on ``PATH`` every target is declared ``manual=True``: wildcard builds skip the C part
cleanly, and naming a target explicitly reports the missing compiler.  Docs: docs/cc.md
"""

from __future__ import annotations

import os
import shlex
import sys

from buildtool.dsl import current_context, fail, genrule, getenv, group, test
from buildtool.labels import _NAME_RE
from buildtool.workspace import pkg_relative

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build that evaluates BUILD.py files
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["cc_binary", "cc_library", "cc_test", "compiler", "have_compiler"]

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".c++", ".C", ".S", ".s")
CXX_SUFFIXES = (".cc", ".cpp", ".cxx", ".c++", ".C")
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".h++", ".H", ".inc", ".inl", ".ipp", ".tcc", ".tlh", ".tli")
# Prebuilt files a link takes as they are, in a binary's srcs (a library archives objects).
# Not a shared library: the binary must find it at run time (a SONAME, an rpath), which is
# the library's own business: linkopts (-L, -l, -Wl,-rpath) say how.
PREBUILT_SUFFIXES = (".o", ".a")


def compiler() -> str:
    """The C compiler command: ``$CC`` or ``cc`` (also for a blank ``$CC``)."""
    return (getenv("CC") or "").strip() or "cc"


def cxx_linker() -> str:
    """The C++ driver that links a binary with C++ sources: ``$CXX`` or ``c++`` (the C
    driver leaves out the C++ standard library: undefined __gxx_personality_v0)."""
    return (getenv("CXX") or "").strip() or "c++"


def have_compiler(cc: str | None = None) -> bool:
    """Is the compiler (the first word of the command) on PATH?"""
    import shutil  # (~4 ms of import: only for the BUILD.py files that ask)

    words = shlex.split(cc or compiler())
    if not words:
        return False
    _look_for(words[0])
    return shutil.which(words[0]) is not None


def _look_for(name: str) -> None:
    """Record, for the no-op snapshot, where ``which`` looks for ``name``: a compiler
    installed (or made executable) after a build changes what the macros declare."""
    from buildtool.dsl import evaluating

    ctx = evaluating()
    if ctx is None:
        return
    search = os.environ.get("PATH", os.defpath).split(os.pathsep)
    places = [name] if "/" in name else [os.path.join(d, name) for d in search if d]
    for path in places:
        try:
            ctx.looked_for.add(os.path.abspath(path))
        except OSError:  # (relative, from a working directory that was deleted: which() finds nothing there)
            pass


def _pkg_rel(path: str) -> str:
    """``//dir`` (workspace-relative) -> relative to this package; other paths unchanged."""
    if not path.startswith("//"):
        return path
    pkg = current_context().pkg
    target = path[2:].strip("/") or "."
    return pkg_relative(target, pkg)


def _flags(copts: Sequence[str], includes: Sequence[str], defines: Sequence[str]) -> str:
    words = [*copts, *(f"-I{_pkg_rel(i)}" for i in includes), *(f"-D{d}" for d in defines)]
    return " ".join(shlex.quote(w).replace("$", "$$") for w in words)


_SAID_MISSING: set[str] = set()  # compilers already said missing in this process


COMMON = ("priority", "manual", "pool")  # what ``**common`` may hold: passed to every target declared


def _checked(macro: str, positional: tuple[Any, ...], name: object, lists: dict[str, Any],
             common: dict[str, Any], scalars: tuple[str, ...] = ()) -> str:
    """The macro's own arguments, checked before anything is declared: a string where a
    list goes was taken a character at a time (``srcs="a.c"``: nothing compiled), and an
    unknown keyword was reported as one of ``genrule()``'s.  Keywords only, as the rules.
    The name, once checked."""
    if positional:
        fail(f"{macro}() takes keyword arguments only (got {len(positional)} positional: {positional[0]!r}...); "
             f"write {macro}(name=..., ...)")
    where = f"{macro}(name={name!r})"
    if not isinstance(name, str) or not name:
        fail(f"{macro}(): name must be a non-empty string (got {name!r})")
    for attr, value in lists.items():
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            fail(f"{where}: {attr} must be a list of strings (got {value!r})")
    for attr in ("deps", "hdr_deps"):
        for d in lists.get(attr, ()):
            # A bare name ("lib", "lib:core", "lib/util") is a label without its "//" or ":" (a
            # cc_binary's deps go to its link's srcs: "lib" was "source file 'lib' does not
            # exist"); a file name (a prebuilt "libfoo.a") is left to the link, as before.
            if d and not d.startswith((":", "//", "@")) and "." not in d.rsplit("/", 1)[-1]:
                fix = repr(f"//{d}") if ":" in d or "/" in d else repr(f":{d}")
                if fix == repr(f":{d}"):  # (a package of that name: which one was meant is not known yet)
                    ctx = current_context()
                    subs = [p for p in (f"{ctx.pkg}/{d}" if ctx.pkg else "", d)
                            if p and os.path.isfile(os.path.join(ctx.root, p, "BUILD.py"))]
                    if subs:
                        fix += f" (a target of this package) or '//{subs[0]}' (the package)"
                fail(f"{where}: {attr} entries must be labels ('//pkg:name' or ':name'), got {d!r}; "
                     f"did you mean {fix}?")
    unknown = sorted(set(common) - set(COMMON))
    if unknown:
        import difflib  # (only for this error)

        known = ["name", *lists, *scalars, *COMMON]
        near = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.75)
        hint = " (headers go in srcs)" if unknown[0] == "hdrs" else f" (did you mean {near[0]!r}?)" if near else ""
        fail(f"{where}: unknown attribute {unknown[0]!r}{hint}; {macro}() takes {', '.join(known)}")
    return name


def _common(cc: str, common: dict[str, Any]) -> dict[str, Any]:
    out = dict(common)
    if not have_compiler(cc):
        out["manual"] = True  # no compiler here: leave the C part out of wildcard builds
        if cc not in _SAID_MISSING:  # (a mistyped $CC must not look like "no C code here")
            _SAID_MISSING.add(cc)
            print(f"buildtool: warning: C compiler {cc!r} ($CC, or cc) not found on PATH: the cc_* targets "
                  "are left out of wildcard patterns (named, they fail)", file=sys.stderr, flush=True)
    return out


def _tool(cc: str) -> str:
    return shlex.split(cc)[0]


def _label_key(label: str) -> str:
    """``pkg~name`` (``~name`` in the root package) of a label given in ``srcs``."""
    if label.startswith(":"):
        pkg, name = current_context().pkg, label[1:]
    else:
        body = label[2:]
        pkg, _, name = body.partition(":") if ":" in body else (body, "", body.rsplit("/", 1)[-1])
    return f"{pkg.replace('/', '~')}~{name}"


def _name_part(key: str) -> str:
    """``key`` as a part of a target name: a character no name may hold (a space, an
    umlaut) becomes ``_``, and then the key gets ``~`` and 8 hex digits of the path's hash,
    so that "a b.c" and "a_b.c" stay two targets."""
    safe = "".join(c if _NAME_RE.fullmatch(c) else "_" for c in key)  # (labels' own rule, a character at a time)
    if safe == key:
        return key
    import hashlib  # (only for such names)

    return f"{safe}~{hashlib.blake2b(key.encode(), digest_size=4).hexdigest()}"


def _literal(path: str) -> str:
    """``path`` as a genrule command holds it literally: shell-quoted, '$' doubled."""
    return shlex.quote(path).replace("$", "$$")


def _compile(
    name: str,
    srcs: Sequence[str],
    copts: Sequence[str],
    includes: Sequence[str],
    defines: Sequence[str],
    hdr_deps: Sequence[str],
    cc: str,
    common: dict[str, Any],
    prebuilt: tuple[str, ...],
) -> tuple[list[str], list[str]]:
    """One compile genrule per source file; returns their labels, and the ``srcs`` entries
    with one of the ``prebuilt`` suffixes (objects, archives), which the caller links."""
    flags = _flags(copts, includes, defines)
    if any(o.startswith("-g") and o != "-g0" for o in copts):
        # Debug information names the compile's directory, which the key leaves out: an
        # object restored in another checkout sent gdb to the first one's sources. Written
        # as "." (the package directory), by the shell's $PWD: the key stays the same
        # everywhere, and so do the objects (ccache hashes the directory instead).
        flags = f'-fdebug-prefix-map="$$PWD"=. {flags}'
    flags = f" {flags}" if flags else ""  # (no double space in `cc -MD` without flags)
    labels: list[str] = []
    given: list[str] = []
    for src in srcs:
        generated = src.startswith((":", "//"))  # a target whose one output is a source file
        if generated and src.endswith(HEADER_SUFFIXES) and "/" in src.rpartition(":")[2]:
            continue  # a header's file label (//q:include/q.h): found through depfiles, as its path is
        if src.endswith(".so") or ".so." in src.rpartition("/")[2].rpartition(":")[2]:  # (libz.so.1)
            fail(f"{name}: srcs entry {src!r} is a shared library: link it through linkopts "
                 "(-L, -l, and -Wl,-rpath for where it is found at run time)")
        if not generated and not src.endswith(SOURCE_SUFFIXES) and (src.startswith("/") or ".." in src.split("/")):
            fail(f"{name}: srcs entry {src!r} must be a path inside the package "  # (as for a .c)
                 "(a header elsewhere is found through includes, not srcs; a prebuilt "
                 "library elsewhere by its file label, //pkg:libz.a)")
        if src.endswith(PREBUILT_SUFFIXES):  # by path or label (//third_party:lib/libz.a, ":libgen.a")
            if not src.endswith(prebuilt):
                fail(f"{name}: srcs entry {src!r}: a cc_library archives objects; an archive is "
                     "linked: list it in the srcs of the cc_binary or cc_test")
            given.append(src)  # (a missing one is the genrule's error, as for any source)
            continue
        if not generated and not src.endswith(SOURCE_SUFFIXES):
            if not src.endswith(HEADER_SUFFIXES):  # (it was taken for a header, and silently left out)
                takes = "/".join(SOURCE_SUFFIXES + HEADER_SUFFIXES + prebuilt)
                fail(f"{name}: srcs entry {src!r} is not a file the macro knows what to do with: "
                     f"srcs takes {takes} files")
            # Headers listed in srcs are discovered through depfiles, not compiled; but one
            # that is not there is an error, as a missing source is.  (A plain lookup: glob
            # leaves out ignored dirs, subpackages, links, outputs, and made the package a
            # globbing one, whose whole tree the no-op snapshot then stats.)
            ctx = current_context()
            if not os.path.lexists(os.path.join(ctx.root, ctx.pkg, src)):
                fail(f"{name}: srcs entry {src!r} does not exist (a generated header goes in hdr_deps)")
            continue
        # A label's object has a name no source path gives (":main" beside "main.c"), from the
        # label as resolved (":gen" in //p is //p:gen, not //:gen).
        key = _name_part(_label_key(src) if generated else src.replace("/", "~"))
        stem = f"_gen/{key}" if generated else src.rsplit(".", 1)[0]
        obj = f"_objs/{name}/{stem}.o"
        dep = f"_objs/{name}/{stem}.d"
        label = f"{name}@{key}"
        # A path goes into the command quoted for the shell and with its '$' doubled (a file
        # named m$x.c is no substitution); a label, which holds neither, as $(location).
        loc = '"$s"' if generated else _literal("./" + src if src.startswith("-") else src)  # (-x.c: no option)
        mf = _literal(dep)
        # (gcc writes no depfile for assembly it does not preprocess: an empty one, then)
        assemble = f"{cc}{flags} -c {loc} -o $@ && printf '%s:\\n' $@ > {mf}"
        compile_ = f"{cc}{flags} -MD -MF {mf} -c {loc} -o $@"
        if not generated:
            cmd = assemble if src.endswith(".s") else compile_
        else:  # its outputs are known only once the graph is: the command looks at them
            # The one source among them is compiled; its headers (a bison, flex or protoc-c
            # target makes x.c and x.h) are found as any header is, through the depfile.
            sources = "|".join("*" + s for s in SOURCE_SUFFIXES)
            cmd = (f"n=0; for f in $(locations {src}); do case $f in {sources}) n=$$((n+1)); s=$f;; esac; done; "
                   f"if [ $n -ne 1 ]; then echo \"{src} makes $n C, C++ or assembly sources (its outputs:\" "
                   f"$(locations {src}) \"); a srcs label must make exactly one (a generated header goes in "
                   "hdr_deps; an archive or object to link, in deps; several sources: a target for each)\" >&2; "
                   "exit 1; fi; "
                   f"case $s in *.s) {assemble};; *) {compile_};; esac")
        genrule(
            name=label,
            srcs=[src],
            deps=list(hdr_deps),
            outs=[obj],
            depfile=dep,
            tools=[_tool(cc)],
            cmd=cmd,
            **common,
        )
        labels.append(f":{label}")
    return labels, given


def cc_library(
    *positional: Any,
    name: str | None = None,
    srcs: Sequence[str] = (),
    deps: Sequence[str] = (),
    copts: Sequence[str] = (),
    includes: Sequence[str] = (),
    defines: Sequence[str] = (),
    hdr_deps: Sequence[str] = (),
    **common: Any,
) -> None:
    """A static library: compile ``srcs``, archive them into ``libNAME.a``.

    ``deps``: other ``cc_library`` labels (linked after this one); ``includes``: ``-I``
    directories, package-relative or ``//``-rooted (not propagated to dependents);
    ``hdr_deps``: targets generating headers, built before compiling; ``common``:
    ``priority``, ``manual``, ``pool``."""
    name = _checked("cc_library", positional, name, {"srcs": srcs, "deps": deps, "copts": copts, "includes": includes,
                                  "defines": defines, "hdr_deps": hdr_deps}, common)
    cc = compiler()
    common = _common(cc, common)
    objs, given = _compile(name, srcs, copts, includes, defines, hdr_deps, cc, common, (".o",))
    members = []
    if objs or given:
        ar_flags = "rcsD" if sys.platform.startswith("linux") else "rcs"  # D: deterministic archive
        genrule(name=f"{name}.a", srcs=[*objs, *given], outs=[f"lib{name}.a"], tools=["ar"],
                cmd=f"ar {ar_flags} $@ $(SRCS)", **common)
        members.append(f":{name}.a")
    group(name=name, deps=[*members, *deps], **common)


def cc_binary(
    *positional: Any,
    name: str | None = None,
    srcs: Sequence[str] = (),
    deps: Sequence[str] = (),
    copts: Sequence[str] = (),
    includes: Sequence[str] = (),
    defines: Sequence[str] = (),
    linkopts: Sequence[str] = (),
    hdr_deps: Sequence[str] = (),
    **common: Any,
) -> None:
    """An executable ``NAME`` in the package directory, linked from ``srcs`` and ``deps``."""
    name = _checked("cc_binary", positional, name, {"srcs": srcs, "deps": deps, "copts": copts, "includes": includes,
                                 "defines": defines, "linkopts": linkopts, "hdr_deps": hdr_deps}, common)
    cc = compiler()
    common = _common(cc, common)
    objs, given = _compile(name, srcs, copts, includes, defines, hdr_deps, cc, common, PREBUILT_SUFFIXES)
    cpp = any(not s.startswith((":", "//")) and s.endswith(CXX_SUFFIXES) for s in srcs)
    linker = cxx_linker() if cpp else cc
    gnu = sys.platform.startswith("linux")
    start, end = ("-Wl,--start-group ", " -Wl,--end-group") if gnu else ("", "")
    links = " ".join(shlex.quote(w).replace("$", "$$") for w in linkopts)
    genrule(
        name=name,
        srcs=[*objs, *given],
        deps=list(deps),  # ($(SRCS) lists their outputs after the srcs; a typo is said of `deps`)
        outs=[name],
        tools=[_tool(linker)],
        cmd=f"{linker} -o $@ {start}$(SRCS){end} {links}".rstrip(),
        **common,
    )


def cc_test(
    *positional: Any,
    name: str | None = None,
    srcs: Sequence[str] = (),
    deps: Sequence[str] = (),
    args: Sequence[str] = (),
    data: Sequence[str] = (),
    copts: Sequence[str] = (),
    includes: Sequence[str] = (),
    defines: Sequence[str] = (),
    linkopts: Sequence[str] = (),
    timeout: float | None = None,
    hdr_deps: Sequence[str] = (),
    **common: Any,
) -> None:
    """A test ``NAME`` running the binary ``NAME.bin`` (built like ``cc_binary``) with ``args``
    in the package directory; ``data`` files are inputs of the test."""
    name = _checked("cc_test", positional, name, {"srcs": srcs, "deps": deps, "args": args, "data": data,
                                                  "copts": copts, "includes": includes, "defines": defines,
                                                  "linkopts": linkopts, "hdr_deps": hdr_deps},
                    common, scalars=("timeout",))
    cc_binary(name=f"{name}.bin", srcs=srcs, deps=deps, copts=copts, includes=includes, defines=defines,
              linkopts=linkopts, hdr_deps=hdr_deps, **common)
    extra: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
    argv = " ".join(shlex.quote(a).replace("$", "$$") for a in args)
    test(name=name, srcs=[f":{name}.bin", *data], cmd=f"./$(location :{name}.bin) {argv}".rstrip(),
         **_common(compiler(), common), **extra)
