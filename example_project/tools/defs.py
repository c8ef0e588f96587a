"""Build macros shared by the BUILD.py files of this workspace.

A macro is an ordinary Python function that calls the DSL functions.  BUILD.py files
import it with ``from tools.defs import py_codegen``; buildtool tracks this module, so
editing it re-evaluates every BUILD.py that imports it.
"""

from buildtool.dsl import genrule, test

# The generator script is a source file of the //tools package.  Naming it with a label
# makes it an input of every codegen action: editing it reruns them all.
SPEC2PY = "//tools:spec2py.py"


def py_codegen(name, spec, out, var=None, prefix=None, **kwargs):
    """Turn a .csv or .json spec of this package into a Python module `out`.

    .csv  -> one dict named `var`, first column -> second column
    .json -> one constant per top-level key, upper-cased and prefixed with `prefix`

    Extra keyword arguments (priority, manual, env, ...) go to the genrule unchanged.
    """
    flags = []
    if var:
        flags.append(f"--var {var}")
    if prefix:
        flags.append(f"--prefix {prefix}")
    genrule(
        name=name,
        srcs=[spec, SPEC2PY],
        outs=[out],
        cmd=f"python3 $(location {SPEC2PY}) {' '.join(flags)} $(location {spec}) > $@",
        **kwargs,
    )


def doctest_each(srcs, prefix="doctest_"):
    """One `test` per Python source file: the buildtool spelling of a Make pattern rule.

    Make would say   %.doctest: %.py ; python3 -m doctest $<
    here it is a plain loop that declares one target per file (usually fed by glob()).
    """
    for src in srcs:
        stem = src.rsplit("/", 1)[-1].removesuffix(".py")
        test(
            name=prefix + stem,
            srcs=[src],
            cmd="python3 -m doctest $<",
            # Keep the source tree clean: no __pycache__ next to the sources.
            env={"PYTHONDONTWRITEBYTECODE": "1"},
        )
