"""``python -m buildtool``: the same as the ``buildtool`` command."""

try:
    from buildtool.cli import run
except KeyboardInterrupt:  # Ctrl-C while the command is imported: no traceback, exit 130 as later
    raise SystemExit(130) from None

run()
