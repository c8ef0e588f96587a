# //tools: the workspace's build helpers.
#
# This directory is a package so that its files can be used as inputs elsewhere with a
# label, e.g. "//tools:spec2py.py" (a label may name a source file of a package, as in
# Bazel).  defs.py and bundle.py are imported as Python modules (macros / pyrule
# functions); buildtool tracks them without any declaration.

test(
    name="spec2py_test",
    srcs=["spec2py_test.py", "spec2py.py", "testdata/sample.csv", "testdata/sample.json"],
    cmd="python3 spec2py_test.py",
    env={"PYTHONDONTWRITEBYTECODE": "1"},
)
