"""Workspace-local helpers: build macros (defs.py), a code generator (spec2py.py) and
a pyrule function (bundle.py).  The workspace root is on sys.path while BUILD.py files
are evaluated and while pyrule actions run, so they import this as ``tools``."""
