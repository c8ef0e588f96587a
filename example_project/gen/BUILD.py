# //gen: code generation.  Two specs become Python modules, written in place next to
# their specs (gen/greetings_table.py, gen/version.py), as Make would.
#
# py_codegen is a macro: a plain Python function in tools/defs.py that calls genrule().
from tools.defs import py_codegen

# greetings.csv -> GREETINGS = {'de': 'Hallo', 'en': 'Hello', ...}
py_codegen(
    name="greetings",
    spec="greetings.csv",
    out="greetings_table.py",
    var="GREETINGS",
    # Everything downstream waits for this table: among the targets that are ready,
    # start it first (lower number = sooner; the default is 0).
    priority=-1,
)

# app.json -> APP_NAME = 'greet', APP_VERSION = '1.2.0', ...
py_codegen(
    name="version",
    spec="app.json",
    out="version.py",
    prefix="APP_",
)
