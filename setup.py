"""Build script for the one thing pyproject.toml cannot declare: the optional C loop of the
no-op check (buildtool/_statcmp.c).  ``optional=True``: where no C compiler or Python
headers are found, the install goes on without it and the same check runs in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("buildtool._statcmp", ["buildtool/_statcmp.c"], optional=True)])
