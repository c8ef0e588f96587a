"""Build record: what each target of *this workspace* last produced (like .ninja_log).

An append-only JSON-lines log in ``.buildtool/record``: a header line, then one entry per
finished action; the last entry for a label wins; a torn last line is ignored.  It decides
``up_to_date`` (the shared cache only serves restores) and feeds ``explain`` and the
critical-path durations.  Recompacted (unparsed lines copied as they are) when it holds
more than 1000 lines and more than 1.5 times as many lines as labels.  Spec:
docs/formats.md#build-record--buildtoolrecord
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, MutableMapping

from buildtool import keys
from buildtool.workspace import open_regular, remove_if_not_a_file

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of every build
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

FORMAT_VERSION = 2
HEADER = f"# buildtool build-record v{FORMAT_VERSION}\n"
HEADER_V1 = "# buildtool build-record v1\n"  # read (its descs are objects), rewritten as v2 on close
_line_of = keys.compact_json(sort_keys=False)  # an entry's line: json.dumps's compact text
_loads = keys.compact_loads()  # json.loads of a line, a 10,000-target restore parses every one
COMPACT_MIN_LINES = 1000
COMPACT_RATIO = 1.5  # lines per live label: each incremental build appends its cone's lines,
# and every build reads them all; rewriting at 1.5x keeps reads small for a rare rewrite


def desc_of(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The action description of an entry's key.  Stored as its canonical JSON text, so
    loading the record does not build 10,000 description objects nobody asks for."""
    if entry is None:
        return None
    d = entry.get("desc")
    if isinstance(d, str):
        try:
            d = json.loads(d)
        except ValueError:
            return None
    return d if isinstance(d, dict) else None


_CMD_HEAD, _FOUND_HEAD = '{"cmd":', ',"discovered":'


def _discovered_of(entry: Mapping[str, Any] | None) -> object:
    """The ``discovered`` value of an entry's description.  A genrule's canonical text
    (keys sorted, formats.md) has it right after ``cmd``, before the inputs and their
    digests: only the command and the list are decoded, not the whole text (an
    incremental build's snapshot lists every compile's headers).  Any other text is parsed
    whole."""
    d = entry.get("desc") if entry is not None else None
    if isinstance(d, str) and d.startswith(_CMD_HEAD):
        from json.decoder import JSONDecoder

        decode = JSONDecoder().raw_decode
        try:
            _, end = decode(d, len(_CMD_HEAD))
            if d.startswith(_FOUND_HEAD, end):
                return decode(d, end + len(_FOUND_HEAD))[0]
        except ValueError:
            pass
    return (desc_of(entry) or {}).get("discovered")


def _well_formed(e: object) -> bool:
    """Has the parsed line ``e`` the shape buildtool writes (formats.md): a label, and when
    present a key that is a string, a description, a duration that is a number, outputs
    that are [path, digest, mode] rows?  A line of another shape (edited by hand, written
    by another tool) is a corrupt line, not a crash of every build until `clean`."""
    if not isinstance(e, dict) or not isinstance(e.get("l"), str):
        return False
    if not isinstance(e.get("k", ""), str) or not isinstance(e.get("desc", ""), (str, dict)):  # (dict: a v1 file's)
        return False
    if not isinstance(e.get("r", ""), str):
        return False
    d = e.get("d", 0)
    if isinstance(d, bool) or not isinstance(d, (int, float)):
        return False
    outs = e.get("o", [])
    return isinstance(outs, list) and all(
        isinstance(o, list) and 2 <= len(o) <= 3 and isinstance(o[0], str) and isinstance(o[1], str)
        and (len(o) == 2 or (isinstance(o[2], int) and not isinstance(o[2], bool))) for o in outs)


_LABEL_START = b'{"l":"'
_DROP_TAIL = b',"x":1}'


class Entries(MutableMapping):  # type: ignore[type-arg]
    """label -> entry, each parsed from its record line on first use.

    An incremental build of a large workspace asks for the entries of a few targets; parsing
    all of them was most of its start-up (0.1 s at 10,000 targets).  Loading only finds the
    lines in the file's bytes and reads each one's label, which leads every line as this
    module writes it; a line is copied out and parsed when its entry is asked for."""

    __slots__ = ("_data", "_found", "_heads", "_lines", "_parsed", "_warn")

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._data = b""  # the record file as read
        self._lines: dict[str, tuple[int, int]] = {}  # label -> its line in _data, not parsed yet
        self._parsed: dict[str, dict[str, Any]] = {}
        self._heads: dict[str, dict[str, Any]] = {}  # label -> its entry but "desc" (head), line not parsed
        self._found: dict[str, list[str] | None] = {}  # label -> discovered(label), once asked
        self._warn = warn

    def load(self, data: bytes, start: int) -> int:
        """Take the complete lines of ``data`` from ``start`` on, in file order (the last line
        of a label wins); a last line without its newline (a torn write) is left out.
        Returns how many lines there were."""
        self._data = data
        self._found.clear()
        lines, parsed = self._lines, self._parsed
        find, startswith = data.find, data.startswith
        skip, tail = len(_LABEL_START), len(_DROP_TAIL)
        n = 0
        pos = start
        while (nl := find(b"\n", pos)) >= 0:
            n += 1
            end = find(b'"', pos + skip, nl) if startswith(_LABEL_START, pos) else -1
            if end < 0 or find(b"\\", pos + skip, end) >= 0:  # another shape, or an escaped label
                e = self._parse(data[pos:nl])
                if e is not None:
                    self._forget(e["l"])
                    if not e.get("x"):
                        parsed[e["l"]] = e
            else:
                label = data[pos + skip : end].decode("utf-8", "surrogatepass")
                if parsed:
                    parsed.pop(label, None)
                self._heads.pop(label, None)
                if nl - end - 1 == tail and startswith(_DROP_TAIL, end + 1):
                    lines.pop(label, None)
                else:
                    lines[label] = (pos, nl)
            pos = nl + 1
        return n

    def _forget(self, label: str) -> None:
        self._found.pop(label, None)
        self._lines.pop(label, None)
        self._parsed.pop(label, None)
        self._heads.pop(label, None)

    def _parse(self, line: bytes) -> dict[str, Any] | None:
        try:
            e = _loads(line)
        except ValueError:
            e = None
        if not _well_formed(e):
            self._warn("build record has a corrupt line; ignoring it")
            return None
        return e

    def get(self, label: str, default: dict[str, Any] | None = None) -> dict[str, Any] | None:
        e = self._parsed.get(label)
        if e is None:
            span = self._lines.pop(label, None)
            if span is None:
                return default
            self._heads.pop(label, None)
            e = self._parse(self._data[span[0] : span[1]])
            if e is None or e["l"] != label:
                return default
            self._parsed[label] = e
        return e

    def head(self, label: str) -> dict[str, Any] | None:
        """The entry of ``label`` without its ``desc`` (key, outputs, duration: what every
        build asks of every entry), parsed from the start of its line only: a test's
        description lists its inputs at every depth, hundreds of kB, and parsing them all
        (``all_outputs``) was most of the start-up of a build beside 500 such tests.
        ``,"desc":`` ends the head of every line this module writes (a string holds no bare
        quote); another line is parsed whole."""
        e = self._parsed.get(label)
        if e is not None:
            return e
        e = self._heads.get(label)
        if e is not None:
            return e
        span = self._lines.get(label)
        if span is None:
            return None
        cut = self._data.find(b',"desc":', span[0], span[1])
        if cut >= 0:
            try:
                e = _loads(self._data[span[0] : cut] + b"}")
            except ValueError:
                e = None
            if _well_formed(e) and e["l"] == label and "o" in e and "d" in e:  # (else: written otherwise)
                self._heads[label] = e
                return e
        return self.get(label)  # (another shape: whole, with the warning for a corrupt line)

    def heads(self) -> list[tuple[str, dict[str, Any]]]:
        """``head`` of every entry."""
        return [(label, e) for label in self if (e := self.head(label)) is not None]

    def discovered(self, label: str) -> list[str] | None:
        """The workspace files the last run of ``label`` discovered (its depfile's: the
        description's ``discovered``), None when it has none; parsed once a build, each path
        one string object (2,000 compiles naming the same 200 headers: 4 parses of each 20 kB
        description a build, and 400,000 path strings)."""
        if label in self._found:
            return self._found[label]
        found = _discovered_of(self.get(label))
        try:
            paths = list(map(sys.intern, found)) if isinstance(found, list) else None
        except TypeError:  # (not all strings: a line of another shape)
            paths = None
        self._found[label] = paths
        return paths

    def raw_line(self, label: str) -> bytes | None:
        """The record line of a not yet parsed entry, as read (to copy it on compaction)."""
        span = self._lines.get(label)
        return None if span is None else self._data[span[0] : span[1]]

    def __getitem__(self, label: str) -> dict[str, Any]:
        e = self.get(label)
        if e is None:
            raise KeyError(label)
        return e

    def __setitem__(self, label: str, entry: dict[str, Any]) -> None:
        self._found.pop(label, None)
        self._lines.pop(label, None)
        self._heads.pop(label, None)
        self._parsed[label] = entry

    def __delitem__(self, label: str) -> None:
        if self.pop(label) is None:
            raise KeyError(label)

    def pop(self, label: str, default: dict[str, Any] | None = None) -> dict[str, Any] | None:
        e = self.get(label)
        self._forget(label)
        return e if e is not None else default

    def __contains__(self, label: object) -> bool:
        return label in self._parsed or label in self._lines

    def __len__(self) -> int:
        return len(self._parsed) + len(self._lines)

    def __iter__(self) -> Iterator[str]:
        return iter([*self._parsed, *self._lines])

    def values(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Every entry (all parsed); a corrupt line is left out, as everywhere."""
        return [e for label in self if (e := self.get(label)) is not None]

    def items(self) -> list[tuple[str, dict[str, Any]]]:  # type: ignore[override]
        return [(label, e) for label in self if (e := self.get(label)) is not None]

    def __eq__(self, other: object) -> bool:
        return dict(self.items()) == dict(other.items()) if isinstance(other, Mapping) else NotImplemented


class BuildRecord:
    """label -> last entry: {"k": key, "o": [[path, digest, mode], ...], "d": seconds,
    "desc": the key's description as canonical JSON text (``desc_of``)}."""

    def __init__(self, path: str, warn: Callable[[str], None], readonly: bool = False) -> None:
        self.path = path
        self._readonly = readonly  # (read without the workspace lock: what it cannot read is left as it is)
        self.entries = Entries(warn)
        self.lines = 0
        self._warn = warn
        self._fh: Any = None
        self._said_failed = False  # a write failed this build: warned once
        self.failed = False  # a write failed: the file no longer says what the builds did (close discards it)
        self._upgrade = False  # a v1 file: compacted into v2 on close
        self.torn = False  # its last line had no newline when read (a killed build, or a crash's zeros)
        self._load()

    def _load(self) -> None:
        try:
            with open_regular(self.path) as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as e:
            self._warn(f"build record unreadable ({e.strerror}); every target will be checked anew")
            if not self._readonly:
                remove_if_not_a_file(self.path)  # (a directory, a named pipe: nothing could be appended to it)
            return
        self.torn = not data.endswith(b"\n")
        nl = data.find(b"\n")
        head = data[:nl] if nl >= 0 else data
        self._upgrade = head + b"\n" == HEADER_V1.encode()
        if head + b"\n" != HEADER.encode() and not self._upgrade:
            if self._readonly:  # (another build may have made it a moment ago: empty, its header to come)
                return
            # (empty: a build killed, or a disk full, before its first line; nothing is lost)
            self._warn("build record is empty; every target will be checked anew" if not data else
                       "build record has an unknown format version; discarding it")
            self._discard()
            return
        self.lines = self.entries.load(data, len(head) + 1)  # a torn last line is left out

    def _heal_torn_tail(self) -> None:
        """Cut a last line that a killed build left without its newline, so the next
        append starts a fresh line instead of gluing itself onto the torn one."""
        try:
            with open_regular(self.path, "r+b") as f:
                end = f.seek(0, os.SEEK_END)
                if end == 0:
                    return
                f.seek(end - 1)
                if f.read(1) == b"\n":
                    return
                pos = end
                while pos > 0:
                    start = max(0, pos - 65536)
                    f.seek(start)
                    chunk = f.read(pos - start)
                    i = chunk.rfind(b"\n")
                    if i >= 0:
                        f.truncate(start + i + 1)
                        return
                    pos = start
                f.truncate(0)
        except OSError:
            pass

    def _discard(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def get(self, label: str) -> dict[str, Any] | None:
        return self.entries.get(label)

    def discovered(self, label: str) -> list[str] | None:
        return self.entries.discovered(label)

    def durations(self) -> dict[str, float]:
        return {lab: e.get("d", 0.0) for lab, e in self.entries.heads()}

    def all_outputs(self) -> set[str]:
        return {o[0] for _, e in self.entries.heads() for o in e.get("o", ())}

    def _append(self, obj: dict[str, Any]) -> None:
        self._write_line(_line_of(obj) + "\n")

    def _write_line(self, line: str) -> None:
        if self._fh is None:
            self._heal_torn_tail()
            new = not os.path.exists(self.path)
            self._fh = open(self.path, "a", encoding="utf-8", errors="surrogatepass")  # noqa: SIM115 - kept open
            if new or self._fh.tell() == 0:
                self._fh.write(HEADER)
        self._fh.write(line)
        self._fh.flush()
        self.lines += 1

    @staticmethod
    def prepare(
        label: str,
        key: str,
        outputs: list[list[Any]],
        duration: float,
        desc: dict[str, Any],
        desc_text: str | None = None,
        run: str | None = None,
    ) -> tuple[dict[str, Any], str]:
        """An entry and its serialised line (done by workers, off the scheduler thread).
        ``desc_text``: ``keys.canonical(desc)`` when the caller has it already; ``run``:
        the token of the run of a stamp (a genrule without outputs) that ran."""
        text = desc_text if desc_text is not None else keys.canonical(desc)
        entry: dict[str, Any] = {"l": label, "k": key, "o": outputs, "d": round(duration, 4)}
        if run is not None:
            entry["r"] = run
        entry["desc"] = text  # (last: formats.md)
        return entry, _line_of(entry) + "\n"

    @staticmethod
    def holds(entry: Mapping[str, Any], key: str, outputs: Any, duration: float, desc_text: str,
              run: str | None = None) -> bool:
        """Whether ``entry`` is the one ``prepare`` would make of these: appending it again
        would change nothing but the file's length (and bring the next compaction closer)."""
        return (
            entry.get("k") == key
            and entry.get("o") == outputs
            and entry.get("d") == round(duration, 4)
            and entry.get("desc") == desc_text
            and entry.get("r") == run
        )

    def put_prepared(self, prepared: tuple[dict[str, Any], str]) -> None:
        entry, line = prepared
        self.entries[entry["l"]] = entry
        try:
            self._write_line(line)
        except OSError as e:
            self._write_failed(e)

    def begin_build(self) -> None:
        """A new build with this (watch mode's reused) record: a failed write is said again."""
        self._said_failed = self.failed = False

    def _write_failed(self, e: OSError) -> None:
        """A line could not be written (a full disk, a file-size limit, a file made
        immutable): warned once a build.  The file is let go of, with whatever its buffer
        held (a flush would fail again at every later line and at close); the next write
        reopens it, first cutting a torn last line.  ``close`` then writes the file anew from
        what this build holds in memory, or deletes it if that fails too: an entry that a lost
        line should have replaced or dropped would tell the next build of outputs and a
        passing test that are no longer there (the no-op snapshot's incremental path takes
        the outputs of targets it does not plan from it)."""
        self.failed = True
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()
            except OSError:
                pass
        if not self._said_failed:
            self._said_failed = True
            self._warn(f"could not write the build record ({e.strerror}); it is written anew at the end of "
                       "this build, or deleted if that fails too (the next build then checks every target anew)")

    def put(self, label: str, key: str, outputs: list[list[Any]], duration: float, desc: dict[str, Any]) -> None:
        self.put_prepared(self.prepare(label, key, outputs, duration, desc))

    def drop(self, label: str) -> None:
        if self.entries.pop(label, None) is not None:
            try:
                self._append({"l": label, "x": 1})
            except OSError as e:
                self._write_failed(e)

    def close(self, compact: bool = True) -> None:
        """Close the file; ``compact``: and rewrite it when it holds too many stale lines
        (not for a dry run or ``clean``, which leave the no-op snapshot in place, and the
        snapshot vouches for this very file: formats.md)."""
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as e:  # (the last flush)
                self._fh = None
                self._write_failed(e)
            self._fh = None
        if self.failed:
            if not self.compact(quiet=True):  # (the list of outputs it keeps is worth keeping: globs skip them)
                self._discard()
                self.entries = Entries(self._warn)  # (watch mode's next cycle starts from nothing, as the file)
                self.lines = 0
            return
        if compact and (self._upgrade or (self.lines > COMPACT_MIN_LINES
                                          and self.lines > COMPACT_RATIO * max(len(self.entries), 1))):
            self.compact()

    def compact(self, quiet: bool = False) -> bool:
        """Rewrite the file from memory (temp file + rename); False if that failed."""
        tmp = f"{self.path}.tmp.{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8", errors="surrogatepass") as f:  # non-UTF-8 file names
                f.write(HEADER)
                for label in list(self.entries):
                    raw = None if self._upgrade else self.entries.raw_line(label)
                    if raw is not None:  # never parsed: copied as it was read
                        f.write(raw.decode("utf-8", "surrogatepass") + "\n")
                        continue
                    e = self.entries.get(label)
                    if e is None:
                        continue
                    if isinstance(e.get("desc"), dict):  # read from a v1 file
                        e = {**e, "desc": keys.canonical(e["desc"])}
                    f.write(_line_of(e) + "\n")
            os.replace(tmp, self.path)
            self.lines = len(self.entries)
            self._upgrade = False
            return True
        except OSError as e:
            if not quiet:
                self._warn(f"could not compact the build record ({e.strerror})")
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
