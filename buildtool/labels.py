"""Labels: parsing ``//pkg/path:name`` labels and target patterns.

A target name is one or more of ``A-Z a-z 0-9 _ - . + = , @ ~``; a package path is
such names joined by ``/`` (no empty, ``.`` or ``..`` component).  The root package is
``""`` and its targets are written ``//:name``.  A file label may name a file in a
directory below its package (``//lib:include/calc.h``): see ``file_label``.
"""

from __future__ import annotations

import re

NAME_CHARS = "A-Za-z0-9_\\-.+=,@~"
_NAME_RE = re.compile(f"[{NAME_CHARS}]+")  # (fullmatch: "$" would let a final newline through)
ALLOWED_NAME_CHARS_TEXT = "letters, digits and _ - . + = , @ ~"


class LabelError(ValueError):
    """A label or pattern is malformed; the message says what must be and what was found."""


def check_name(name: str) -> None:
    if name == "":
        raise LabelError("target name must not be empty (got '')")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in (".", ".."):
        msg = f"target name must be made of {ALLOWED_NAME_CHARS_TEXT}, and not be '.' or '..' (got {name!r})"
        if name == "*":  # (Bazel's every target and file of a package)
            msg += "; every target of a package is ':all' (//pkg:all), of a tree '...' (//pkg/...)"
        raise LabelError(msg)


def check_package(pkg: str) -> None:
    if pkg == "":
        return
    for part in pkg.split("/"):
        if not _NAME_RE.fullmatch(part) or part in (".", ".."):
            msg = (
                f"package path must be names of {ALLOWED_NAME_CHARS_TEXT} joined by '/' "
                f"(got {pkg!r})"
            )
            raise LabelError(msg)


def label_str(pkg: str, name: str) -> str:
    return f"//{pkg}:{name}"


def split_label(label: str) -> tuple[str, str]:
    """Split a canonical ``//pkg:name`` label."""
    pkg, _, name = label[2:].partition(":")
    return pkg, name


def parse_label(text: str, current_pkg: str, cwd_dir: str | None = None) -> tuple[str, str]:
    """Parse an absolute (``//pkg:name``, ``//pkg``) or relative (``:name``) label.
    ``cwd_dir``: the working directory, for the "did you mean" of a label written without
    its ``//`` (``core:x`` typed in lib/ means //lib/core:x)."""
    if not isinstance(text, str):
        msg = f"a label must be a string (got {text!r})"
        raise LabelError(msg)
    if text.startswith(":"):
        pkg, name = current_pkg, text[1:]
    elif text.startswith("//"):
        body = text[2:]
        if ":" in body:
            pkg, _, name = body.partition(":")
        else:
            pkg = body
            name = body.rsplit("/", 1)[-1]
            if not body:
                msg = f"label {text!r} names no target: write //:NAME for the root package"
                raise LabelError(msg)
            if not name:
                bare = body.rstrip("/")
                last = bare.rsplit("/", 1)[-1]
                msg = f"label {text!r} ends with '/': write '//{bare}' (its target named {last!r}) or '//{bare}:NAME'"
                if last == "...":  # a pattern with a '/' after it
                    msg = f"label {text!r} ends with '/': write '//{bare}'"
                raise LabelError(msg)
        if "..." in pkg.split("/"):
            msg = f"{text!r} is not a label: '...' ends a pattern (//... or //pkg/...), it is no package name"
            raise LabelError(msg)
    else:
        msg = f"a label must start with '//' or ':' (got {text!r})"
        if text.startswith("@"):
            msg += "; external repositories (@repo//...) are not supported: every label is in this workspace"
        elif text and not text.startswith("/") and (":" in text or "/" in text) and " " not in text \
                and _parses(f"//{text}"):
            here = f"//{cwd_dir}/{text}" if cwd_dir else ""
            msg += f"; did you mean '{here}' (from this directory) or '//{text}'?" if here and _parses(here) \
                else f"; did you mean '//{text}'?"
        raise LabelError(msg)
    try:
        check_package(pkg)
        check_name(name)
    except LabelError as e:
        msg = f"bad label {text!r}: {e}"
        raise LabelError(msg) from None
    return pkg, name


def file_label(text: str, current_pkg: str) -> tuple[str, str] | None:
    """``(package, path below it)`` for a label naming a file in a directory below its
    package (``//lib:include/calc.h``, ``:include/calc.h``), as in Bazel: a target's name
    has no ``/``, a file's may.  None for any other text."""
    if not isinstance(text, str):
        return None
    if text.startswith(":"):
        pkg, name = current_pkg, text[1:]
    elif text.startswith("//") and ":" in text:
        pkg, _, name = text[2:].partition(":")
    else:
        return None
    if "/" not in name:
        return None
    try:
        check_package(pkg)
        check_package(name)  # the same rule: names joined by '/', no '.' or '..'
    except LabelError:
        return None
    return pkg, name


class Pattern:
    """A target pattern: one target, every target of a package, or a package subtree."""

    __slots__ = ("kind", "name", "pkg", "text")

    def __init__(self, kind: str, pkg: str, name: str = "", text: str = "") -> None:
        self.kind = kind  # "target" | "package" | "recursive"
        self.pkg = pkg
        self.name = name
        self.text = text


def parse_pattern(text: str, current_pkg: str, cwd_dir: str | None = None) -> Pattern:
    """Parse ``//...``, ``//pkg/...``, ``//pkg:all``, ``//pkg:name``, ``:name``, ``...``.
    ``:name`` is in ``current_pkg``; ``...``, ``sub/...``, ``sub:name``, ``sub:all`` and
    ``sub/pkg`` are below ``cwd_dir`` (the working directory, package or not, as in Bazel;
    default ``current_pkg``)."""
    here = current_pkg if cwd_dir is None else cwd_dir
    if text in ("...", "//..."):
        base = "" if text == "//..." else here
        return Pattern("recursive", base, text=text)
    if text.endswith("/..."):
        base = text[:-4]
        typed = base  # (what must be names: the working directory's own path need not be, as for "...")
        if base.startswith("//"):
            base = typed = base[2:]
        else:
            typed = "/".join(p for p in base.split("/") if p not in (".", "..")) or ""
            if "." in base.split("/") or ".." in base.split("/"):  # ./... and ../... from a subdirectory
                import posixpath

                base = posixpath.normpath(f"{here}/{base}" if here else base)
                if base == ".." or base.startswith("../"):
                    msg = f"bad pattern {text!r}: it leads out of the workspace"
                    raise LabelError(msg)
                here, base = "", "" if base == "." else base
            if here:
                base = f"{here}/{base}"
        try:
            check_package(typed)
        except LabelError as e:
            msg = f"bad pattern {text!r}: {e}"
            raise LabelError(msg) from None
        return Pattern("recursive", base, text=text)
    pkg, name = parse_label(from_here(text, here), current_pkg, here)
    if name == "all" and (text.endswith(":all")):
        return Pattern("package", pkg, text=text)
    return Pattern("target", pkg, name, text=text)


def from_here(text: str, cwd_dir: str) -> str:
    """A label typed on the command line without its '//' (``sub:x``, ``sub/pkg``, and a
    file's ``sub:f.txt``), taken from the working directory ``cwd_dir``, as ``sub/...`` is
    and as Bazel's command line takes them (from lib/: //lib/sub:x); any other text as it is."""
    if text[:1] not in ("/", ":", "@", "-", "") and (":" in text or "/" in text) and " " not in text:
        rel = f"//{cwd_dir}/{text}" if cwd_dir else f"//{text}"
        if _parses(rel):
            return rel
    return text


def below_here(text: str, cwd_dir: str) -> str | None:
    """The directory a single word typed on the command line names below the working
    directory ``cwd_dir`` (``core`` in lib/: ``lib/core``), whether a package or not; None
    for any other text."""
    if not _NAME_RE.fullmatch(text) or text in (".", ".."):
        return None
    return f"{cwd_dir}/{text}" if cwd_dir else text


def _parses(text: str) -> bool:
    """Is ``text`` a valid absolute label (for a "did you mean" hint)?"""
    try:
        parse_label(text, "")
    except LabelError:
        return False
    return True
