"""A real C project nobody here wrote: the brotli library and CLI from the Brotli sdist
on PyPI (36 translation units), built with the cc macros (tests/data/brotli_BUILD.py),
checked with brotli's own test data, then a header edit rebuilds exactly the objects whose
compilation includes it (computed independently with ``cc -MM``).

Skipped only when the sdist cannot be downloaded (offline) or there is no C compiler.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import Workspace

SDIST = "Brotli==1.2.1"
HEADER = "c/enc/histogram.h"  # included (directly or not) by some encoder files only
BUILD_FILE = Path(__file__).parent / "data" / "brotli_BUILD.py"

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def fetch_sdist(dest: Path) -> Path:
    """Download and unpack the sdist; skip the test when the registry is unreachable."""
    dl = dest / "download"
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--disable-pip-version-check", SDIST, "-d", str(dl)],
            capture_output=True, text=True, timeout=300, check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"offline? downloading the {SDIST} sdist from PyPI timed out")
    archives = list(dl.glob("*.tar.gz")) if dl.exists() else []
    if p.returncode != 0 or not archives:
        pytest.skip(f"offline? could not download the {SDIST} sdist from PyPI: {p.stderr.strip()[-300:]}")
    with tarfile.open(archives[0]) as tar:
        tar.extractall(dest / "src", filter="data")
    (root,) = (dest / "src").iterdir()
    return root


def compile_label(lib: str, src: str) -> str:
    return f"//:{lib}@{src.replace('/', '~')}"


def library_of(src: str) -> str:
    return {"c/common": "brotlicommon", "c/dec": "brotlidec", "c/enc": "brotlienc", "c/tools": "brotli"}[
        os.path.dirname(src)
    ]


def includers(root: Path, sources: list[str], header: str) -> set[str]:
    """The sources whose preprocessing reads ``header`` according to the compiler itself
    (``cc -MM``), parsed here without buildtool's depfile parser."""

    def deps(src: str) -> set[str]:
        out = subprocess.run(["cc", "-MM", "-Ic/include", src], cwd=root, capture_output=True, text=True,
                             timeout=60, check=True).stdout
        words = out.replace("\\\n", " ").split(":", 1)[1].split()
        return {os.path.normpath(w) for w in words}

    with ThreadPoolExecutor(4) as pool:
        return {src for src, d in zip(sources, pool.map(deps, sources), strict=True) if header in d}


def test_brotli_builds_passes_its_checks_and_rebuilds_exactly_the_includers(tmp_path: Path) -> None:
    root = fetch_sdist(tmp_path)
    ws = Workspace(root, tmp_path / "cache", tmp_path / "home")  # writes buildtool.toml
    shutil.copy(BUILD_FILE, root / "BUILD.py")
    sources = sorted(str(p.relative_to(root)) for p in (root / "c").rglob("*.c"))
    assert len(sources) >= 30, sources
    objects = {compile_label(library_of(s), s) for s in sources}

    r = ws.build("-j", "2")
    assert r.rc == 0, r.output[-3000:]
    assert objects <= r.ran, sorted(objects - r.ran)
    assert {"//:brotlicommon.a", "//:brotlidec.a", "//:brotlienc.a", "//:brotli"} <= r.ran
    assert not list(root.rglob("*.d")), "depfiles are read into the record and deleted"

    # brotli's own checks on its own test data, through the built CLI.
    t = ws.build("-j", "2", command="test")
    assert t.rc == 0, t.output[-3000:]
    assert t.status("//:compatibility_test") == "ran" and t.status("//:roundtrip_test") == "ran"
    assert "PASSED" in t.output

    # No-op stays a no-op.
    r = ws.build("-j", "2")
    assert r.rc == 0 and r.ran == set(), r.output[-2000:]

    # Edit one header: exactly the objects that include it rerun.
    expected = {compile_label(library_of(s), s) for s in includers(root, sources, HEADER)}
    assert 2 <= len(expected) <= len(objects) - 5, expected
    with open(root / HEADER, "a") as f:
        f.write("\n#define BUILDTOOL_TEST_EDIT 1\n")
    r = ws.build("-j", "2", "--explain")
    assert r.rc == 0, r.output[-3000:]
    assert r.ran & objects == expected, (sorted(r.ran & objects), sorted(expected))
    for lab in objects - expected:
        assert r.status(lab) == "up_to_date", (lab, r.by_label[lab])
    for lab in expected:
        assert HEADER in r.by_label[lab]["reason"], r.by_label[lab]
    # The CLI still works after the incremental build.
    t = ws.build("-j", "2", command="test")
    assert t.rc == 0, t.output[-3000:]
