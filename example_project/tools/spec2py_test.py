"""Unit test of the code generator, run by //tools:spec2py_test."""

import subprocess
import sys


def generate(*args):
    out = subprocess.run(
        [sys.executable, "spec2py.py", *args], check=True, capture_output=True, text=True
    ).stdout
    scope = {}
    exec(out, scope)
    return out, scope


out, scope = generate("--var", "T", "testdata/sample.csv")
assert scope["T"] == {"a": "1", "b": "two"}, scope["T"]
assert out == generate("--var", "T", "testdata/sample.csv")[0], "output is not deterministic"

_, scope = generate("--prefix", "X_", "testdata/sample.json")
assert scope["X_NAME"] == "demo" and scope["X_VERSION"] == "0.1", scope

print("spec2py: ok")
