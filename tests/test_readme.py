"""The README's two fresh-machine commands: the first two code blocks, and `.ci/run` runs
exactly the second one (CI must test what a reader is told to run)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)


def test_the_readme_opens_with_the_install_and_the_test_command() -> None:
    first, second = (b.strip() for b in _blocks()[:2])
    assert "example_project" in first and "buildtool" in first and "\n" not in first
    assert "pytest" in second and "\n" not in second


def test_ci_runs_exactly_the_readme_test_command() -> None:
    second = _blocks()[1].strip()
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[-1] == second


def test_the_migration_guides_objects_macro_rebuilds_on_a_header_edit(tmp_path: Path) -> None:
    """docs/migrating-from-make.md's pattern-rule macro, as printed: a header the compile
    reads is in the key through the depfile, so editing it reruns the object (the guide
    once printed a macro that gave a stale build here)."""
    import shutil

    import pytest
    from conftest import run_buildtool

    if shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine")
    doc = (ROOT / "docs" / "migrating-from-make.md").read_text()
    ws = tmp_path / "ws"
    for name in ("tools/defs.py", "net/BUILD.py"):
        block = re.search(rf"```python\n# {re.escape(name)}\n(.*?)```", doc, re.DOTALL)
        assert block, name
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(block.group(1))
    (ws / "buildtool.toml").write_text("")
    (ws / "net" / "k.h").write_text("#define K 1\n")
    (ws / "net" / "a.c").write_text('#include "k.h"\nint a(void) { return K; }\n')
    rc, out, err = run_buildtool("build", cwd=ws, cache_dir=tmp_path / "cache")
    assert rc == 0 and "2 ran" in out, out + err
    (ws / "net" / "k.h").write_text("#define K 2\n")
    rc, out, err = run_buildtool("build", cwd=ws, cache_dir=tmp_path / "cache")
    assert rc == 0 and "2 ran" in out, out + err  # the object and the archive
    # Its deps= for a generated header, as the guide's note says (with `$<` it was an error).
    (ws / "net" / "a.c").write_text('#include "gen.h"\nint a(void) { return G; }\n')
    (ws / "net" / "BUILD.py").write_text(
        'from tools.defs import objects\n'
        'genrule(name="gen_h", outs=["gen.h"], cmd="echo \'#define G 3\' > $@")\n'
        'genrule(name="libnet.a", srcs=objects(glob(["*.c"]), deps=[":gen_h"]), outs=["libnet.a"],\n'
        '        cmd="ar rcs $@ $(SRCS)", tools=["ar"])\n')
    rc, out, err = run_buildtool("build", cwd=ws, cache_dir=tmp_path / "cache")
    assert rc == 0 and "3 ran" in out, out + err
