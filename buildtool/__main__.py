"""``python -m buildtool``: the same as the ``buildtool`` command."""

from buildtool.cli import run

run()
