"""Build tools under test: how to find each one, write its build file, run it, and reset it.

Every generator writes the idiomatic build file of its tool (a pattern rule for Make, a loop
in ``dodo.py``/``SConstruct``/``BUILD.py`` for W1; one declaration per target otherwise);
every command expands to the same shell string (``workloads.Target.shell``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from workloads import Target, Workload

SCRIPTS_DIR = Path(sysconfig.get_path("scripts"))


def find_binary(name: str) -> str | None:
    """The real executable: this interpreter's scripts dir first, never a pyenv shim."""
    candidate = SCRIPTS_DIR / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if "shims" in directory:
            continue
        path = shutil.which(name, path=directory)
        if path:
            return path
    return None


@dataclass(slots=True)
class Workspace:
    """One tool's copy of a workload on disk, plus the source contents it now holds."""

    root: Path
    workload: Workload
    sources: dict[str, bytes]
    cache_dir: Path  # buildtool's --cache-dir; unused by the peers


class Tool:
    """Base class; subclasses fill in the file name, the generator and the command line."""

    name = ""
    binary = ""
    build_file = ""
    state_files: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.path = find_binary(self.binary)

    def available(self) -> bool:
        return self.path is not None

    def version(self) -> str:
        if not self.path:
            return "missing"
        proc = subprocess.run([*self.base_argv(), "--version"], capture_output=True, text=True, check=False)
        lines = (proc.stdout or proc.stderr).strip().splitlines()
        return self.pick_version(lines)

    def pick_version(self, lines: list[str]) -> str:
        line = lines[0] if lines else "unknown"
        return line.removeprefix(f"{self.name} ")

    def base_argv(self) -> list[str]:
        assert self.path is not None
        return [self.path]

    def argv(self, ws: Workspace, jobs: int) -> list[str]:
        raise NotImplementedError

    def write(self, root: Path, workload: Workload) -> None:
        text = self.render_uniform(workload) if workload.uniform_cp else self.render(workload)
        (root / self.build_file).write_text(text)

    def render_uniform(self, workload: Workload) -> str:
        return self.render(workload)

    def render(self, workload: Workload) -> str:
        raise NotImplementedError

    def reset_state(self, ws: Workspace) -> None:
        """Forget everything the tool remembers, for a clean build."""
        for pattern in self.state_files:
            for path in ws.root.glob(pattern):
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()


class Make(Tool):
    name = "make"
    binary = "make"
    build_file = "Makefile"

    def argv(self, ws: Workspace, jobs: int) -> list[str]:
        return [*self.base_argv(), "-r", f"-j{jobs}"]

    def render_uniform(self, workload: Workload) -> str:
        outs = " ".join(workload.output_paths())
        return f".PHONY: all\nall: {outs}\nout/%.txt: src/%.txt\n\tcp $< $@\n"

    def render(self, workload: Workload) -> str:
        lines = [".PHONY: all", "all: " + " ".join(workload.output_paths())]
        for t in workload.targets:
            lines.append(f"{t.output}: {' '.join(t.inputs)}")
            lines.append("\t" + _recipe(t, all_in="$^", one_in="$<", out="$@"))
        return "\n".join(lines) + "\n"


class Ninja(Tool):
    name = "ninja"
    binary = "ninja"
    build_file = "build.ninja"
    state_files = (".ninja_log", ".ninja_deps")

    def argv(self, ws: Workspace, jobs: int) -> list[str]:
        return [*self.base_argv(), f"-j{jobs}"]

    def render(self, workload: Workload) -> str:
        lines = [
            "rule cp\n  command = cp $in $out",
            "rule cat\n  command = cat $in > $out",
            "rule sleep\n  command = sleep $secs && cat $in > $out",
            "rule stat\n  command = stat -c %s $in > $out",
        ]
        for t in workload.targets:
            lines.append(f"build {t.output}: {t.kind} {' '.join(t.inputs)}")
            if t.kind == "sleep":
                lines.append(f"  secs = {t.seconds:.3f}")
        return "\n".join(lines) + "\n"


class Doit(Tool):
    name = "doit"
    binary = "doit"
    build_file = "dodo.py"
    state_files = (".doit.db*",)

    def argv(self, ws: Workspace, jobs: int) -> list[str]:
        return [*self.base_argv(), "-n", str(jobs)]

    def pick_version(self, lines: list[str]) -> str:
        return lines[0] if lines else "unknown"

    def render_uniform(self, workload: Workload) -> str:
        return (
            '"""W1 for doit: independent copies."""\n'
            f"N = {len(workload.targets)}\n\n\n"
            "def task_copy():\n"
            "    for i in range(N):\n"
            "        yield {\n"
            '            "name": f"t{i}",\n'
            '            "actions": [f"cp src/{i}.txt out/{i}.txt"],\n'
            '            "file_dep": [f"src/{i}.txt"],\n'
            '            "targets": [f"out/{i}.txt"],\n'
            "        }\n"
        )

    def render(self, workload: Workload) -> str:
        rows = ",\n".join(
            f"    ({t.name!r}, {list(t.inputs)!r}, {t.output!r}, {t.shell().replace('%', '%%')!r})"
            for t in workload.targets
        )
        return (
            '"""Generated workload for doit: one task per target."""\n'
            f"TARGETS = [\n{rows},\n]\n\n\n"
            "def task_build():\n"
            "    for name, inputs, output, cmd in TARGETS:\n"
            '        yield {"name": name, "actions": [cmd], "file_dep": inputs,\n'
            '               "targets": [output]}\n'
        )


class SCons(Tool):
    name = "scons"
    binary = "scons"
    build_file = "SConstruct"
    state_files = (".sconsign*",)

    def argv(self, ws: Workspace, jobs: int) -> list[str]:
        return [*self.base_argv(), "-Q", f"-j{jobs}"]

    def pick_version(self, lines: list[str]) -> str:
        for line in lines:
            if "SCons: v" in line:
                return line.split("SCons: v")[1].split(".b")[0].split(",")[0]
        return lines[0] if lines else "unknown"

    _HEAD = (
        "# Generated workload for SCons (no compiler tools: faster start, same commands).\n"
        "DefaultEnvironment(tools=[])\n"
        "env = Environment(tools=[])\n"
    )

    def render_uniform(self, workload: Workload) -> str:
        return (
            self._HEAD
            + f"for i in range({len(workload.targets)}):\n"
            + '    env.Command(f"out/{i}.txt", f"src/{i}.txt", "cp $SOURCE $TARGET")\n'
        )

    def render(self, workload: Workload) -> str:
        lines = [self._HEAD]
        for t in workload.targets:
            cmd = _recipe(t, all_in="$SOURCES", one_in="$SOURCE", out="$TARGET")
            lines.append(f"env.Command({t.output!r}, {list(t.inputs)!r}, {cmd!r})")
        return "\n".join(lines) + "\n"


class Buildtool(Tool):
    name = "buildtool"
    binary = "buildtool"
    build_file = "BUILD.py"
    state_files = (".buildtool",)

    def __init__(self) -> None:
        super().__init__()
        if self.path is None and _importable("buildtool.cli"):
            self.path = sys.executable  # run as ``python -m buildtool``

    def base_argv(self) -> list[str]:
        assert self.path is not None
        if self.path == sys.executable:
            return [sys.executable, "-m", "buildtool"]
        return [self.path]

    def version(self) -> str:
        """The version, and whether the install compiled the no-op check's C loop
        (buildtool/_statcmp.c: optional, and worth ~25% of a cold no-op)."""
        return f"{super().version()} ({'C' if self.has_c_loop() else 'no C'} stat loop)"

    def has_c_loop(self) -> bool:
        if not self.path:
            return False
        python = [self.path]
        if self.path != sys.executable:  # a script: its #! line names its interpreter
            with open(self.path, "rb") as f:
                first = f.readline()
            python = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
            python = python or [sys.executable]  # (``#!/usr/bin/env python3`` is two words)
        probe = "import buildtool.noop as n; print(n._accelerator() is not None)"
        try:
            proc = subprocess.run([*python, "-c", probe], cwd="/", capture_output=True, text=True, check=False)
        except OSError:
            return False
        return proc.stdout.strip() == "True"

    def argv(self, ws: Workspace, jobs: int) -> list[str]:
        return [
            *self.base_argv(),
            "-C",
            str(ws.root),
            "build",
            "//...",
            "-j",
            str(jobs),
            "--cache-dir",
            str(ws.cache_dir),
        ]

    def write(self, root: Path, workload: Workload) -> None:
        super().write(root, workload)
        (root / "buildtool.toml").write_text("")

    def render_uniform(self, workload: Workload) -> str:
        return (
            '"""W1 for buildtool: independent copies, declared in a loop."""\n'
            f"for i in range({len(workload.targets)}):\n"
            '    genrule(name=f"t{i}", srcs=[f"src/{i}.txt"], outs=[f"out/{i}.txt"],'
            ' cmd="cp $< $@")\n'
        )

    def render(self, workload: Workload) -> str:
        lines = ['"""Generated workload for buildtool: one genrule per target."""']
        for t in workload.targets:
            srcs = _as_srcs(t)
            cmd = _recipe(t, all_in="$(SRCS)", one_in="$<", out="$@")
            lines.append(f"genrule(name={t.name!r}, srcs={srcs!r}, outs=[{t.output!r}], cmd={cmd!r})")
        return "\n".join(lines) + "\n"

    def reset_state(self, ws: Workspace) -> None:
        super().reset_state(ws)
        shutil.rmtree(ws.cache_dir, ignore_errors=True)


def _as_srcs(t: Target) -> list[str]:
    """``t.inputs`` with other targets' outputs written as labels, in the same order."""
    label_of = {f"out/{d}.txt": f":{d}" for d in t.deps}
    return [label_of.get(p, p) for p in t.inputs]


def _recipe(t: Target, *, all_in: str, one_in: str, out: str) -> str:
    """``t.shell()`` written with a tool's own placeholders."""
    if t.kind == "cp":
        return f"cp {one_in} {out}"
    if t.kind == "cat":
        return f"cat {all_in} > {out}"
    if t.kind == "sleep":
        return f"sleep {t.seconds:.3f} && cat {all_in} > {out}"
    if t.kind == "stat":
        return f"stat -c %s {all_in} > {out}"
    msg = f"unknown target kind {t.kind!r}"
    raise ValueError(msg)


def _importable(module: str) -> bool:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, check=False)
    return proc.returncode == 0


ALL_TOOLS: dict[str, type[Tool]] = {
    "make": Make,
    "ninja": Ninja,
    "doit": Doit,
    "scons": SCons,
    "buildtool": Buildtool,
}
