"""buildtool: a build system with Python buildfiles, a content-addressed cache and a
priority scheduler.  The public API is deliberately small; the CLI is ``buildtool``."""

__version__ = "0.1.0"

__all__ = ["__version__"]
