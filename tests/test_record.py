"""The build record: entries, descriptions kept as text, torn tails, the v1 upgrade."""

from __future__ import annotations

import json
from pathlib import Path

from buildtool import keys
from buildtool.record import HEADER, HEADER_V1, BuildRecord, desc_of

DESC = {"v": 1, "kind": "genrule", "cmd": "cp a b", "inputs": {"a": "d" * 64}, "outs": ["b"]}


def test_entries_round_trip_with_the_description_as_its_canonical_text(tmp_path: Path) -> None:
    path = tmp_path / "record"
    rec = BuildRecord(str(path), print)
    rec.put("//:b", "k1", [["b", "e" * 64, 420]], 0.25, DESC)
    rec.close()
    line = json.loads(path.read_text().splitlines()[1])
    assert line["desc"] == keys.canonical(DESC)  # the text the key hashes, not a second encoding
    again = BuildRecord(str(path), print)
    assert again.get("//:b")["k"] == "k1"
    assert desc_of(again.get("//:b")) == DESC
    assert desc_of(None) is None


def test_a_torn_last_line_is_ignored_and_healed_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "record"
    rec = BuildRecord(str(path), print)
    rec.put("//:a", "k1", [], 0.1, DESC)
    rec.close()
    with open(path, "a") as f:
        f.write('{"l":"//:b","k":"k2"')  # killed mid-write
    rec = BuildRecord(str(path), print)
    assert set(rec.entries) == {"//:a"}
    rec.put("//:c", "k3", [], 0.1, DESC)
    rec.close()
    assert set(BuildRecord(str(path), print).entries) == {"//:a", "//:c"}


def test_a_v1_record_is_read_and_rewritten_as_v2(tmp_path: Path) -> None:
    path = tmp_path / "record"
    old = {"l": "//:b", "k": "k1", "o": [["b", "e" * 64, 420]], "d": 0.5, "desc": DESC}
    path.write_text(HEADER_V1 + json.dumps(old) + "\n")
    warned: list[str] = []
    rec = BuildRecord(str(path), warned.append)
    assert desc_of(rec.get("//:b")) == DESC and not warned
    rec.close()
    text = path.read_text()
    assert text.startswith(HEADER)
    assert json.loads(text.splitlines()[1])["desc"] == keys.canonical(DESC)
    assert desc_of(BuildRecord(str(path), print).get("//:b")) == DESC


def test_another_version_is_discarded_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "record"
    path.write_text("# buildtool build-record v99\n{}\n")
    warned: list[str] = []
    rec = BuildRecord(str(path), warned.append)
    assert rec.entries == {} and warned and "version" in warned[0]
    assert not path.exists()


def test_the_last_line_of_a_label_wins_and_a_drop_line_forgets_it(tmp_path: Path) -> None:
    path = tmp_path / "record"
    rec = BuildRecord(str(path), print)
    rec.put("//:a", "k1", [], 0.1, DESC)
    rec.put("//:b", "k1", [], 0.1, DESC)
    rec.put("//:a", "k2", [], 0.2, DESC)
    rec.drop("//:b")
    rec.put("//p:ü", "k3", [], 0.3, DESC)  # a non-ASCII label is read as it was written
    rec._fh.close()
    again = BuildRecord(str(path), print)
    assert set(again.entries) == {"//:a", "//p:ü"} and len(again.entries) == 2
    assert again.get("//:a")["k"] == "k2" and again.get("//p:ü")["k"] == "k3"
    assert "//:b" not in again.entries and again.get("//:b") is None
    assert again.durations() == {"//:a": 0.2, "//p:ü": 0.3}


def test_a_drop_line_forgets_a_label_json_escapes(tmp_path: Path) -> None:
    """A package directory named ``a\\b`` or ``q"r`` gives a label written with JSON escapes,
    read by the full parser rather than the label scan.  Its drop line (a target removed
    from its BUILD.py) was read back as an entry of its own, with no key and no outputs:
    the removed target stayed in the record, found dead and dropped again -- one more line
    -- every build."""
    path = tmp_path / "record"
    rec = BuildRecord(str(path), print)
    labels = ["//a\\b:t", '//q"r:t']
    for label in labels:
        rec.put(label, "k1", [["o", "e" * 64, 420]], 0.1, DESC)
    rec.put("//:kept", "k2", [], 0.2, DESC)
    for label in labels:
        rec.drop(label)
    rec._fh.close()
    again = BuildRecord(str(path), print)
    assert set(again.entries) == {"//:kept"}, dict(again.entries)
    assert all(again.get(label) is None for label in labels)
    assert again.durations() == {"//:kept": 0.2}


def test_lines_are_parsed_only_when_their_entry_is_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "record"
    good = {"l": "//:good", "k": "k", "o": [], "d": 1.0, "desc": "{}"}
    path.write_text(HEADER + json.dumps(good) + "\n" + '{"l":"//:bad","k":"k","o":[[oops\n')
    warned: list[str] = []
    rec = BuildRecord(str(path), warned.append)
    assert set(rec.entries) == {"//:good", "//:bad"} and warned == []  # nothing parsed yet
    assert rec.get("//:good") == good and warned == []
    assert rec.get("//:bad") is None  # a corrupt line: the target counts as never built
    assert len(warned) == 1 and "corrupt" in warned[0]
    assert rec.entries == {"//:good": good}


def test_compaction_keeps_every_live_entry_parsed_or_not(tmp_path: Path) -> None:
    path = tmp_path / "record"
    rec = BuildRecord(str(path), print)
    for round_ in range(4):  # 4 lines per label, over 1000 lines: compacted on close
        for i in range(300):
            rec.put(f"//:t{i}", f"k{round_}", [[f"o{i}", "e" * 64, 420]], 0.1 * round_, DESC)
    rec.drop("//:t7")
    rec.close()
    again = BuildRecord(str(path), print)
    assert again.lines == 299  # compacted: one line per live label
    assert again.get("//:t3")["k"] == "k3"  # parse one; the others are copied unparsed
    again.put("//:new", "kn", [], 1.0, DESC)
    again.compact()
    third = BuildRecord(str(path), print)
    assert len(third.entries) == 300 and "//:t7" not in third.entries
    assert {lab: e["k"] for lab, e in third.entries.items()} == {
        **{f"//:t{i}": "k3" for i in range(300) if i != 7}, "//:new": "kn"}
    assert desc_of(third.get("//:t9")) == DESC


def test_a_record_that_cannot_be_written_is_said_once_a_build(tmp_path: Path) -> None:
    """Once per build, not per action (each line failed again on the buffered one) and not
    once per watch session (the record object is reused there)."""
    warned: list[str] = []
    path = tmp_path / "record"
    rec = BuildRecord(str(path), warned.append)
    path.mkdir()  # (any write now fails)
    for i in range(3):
        rec.put(f"//:t{i}", "k", [], 0.1, {"cmd": "x"})
    assert len(warned) == 1 and "could not write the build record" in warned[0], warned
    rec.begin_build()
    rec.put("//:t9", "k", [], 0.1, {"cmd": "x"})
    rec.close()
    assert len(warned) == 2, warned


def test_a_record_that_lost_a_line_is_written_anew_at_close_or_deleted(tmp_path: Path) -> None:
    """Its other lines would say what outputs and a passing test were before the lost one:
    the file is rewritten from memory (which has the lost line), or deleted if that fails."""
    path = tmp_path / "record"
    rec = BuildRecord(str(path), lambda _m: None)
    rec.put("//:a", "k1", [["a.out", "d1", 0o644]], 0.1, {"cmd": "x"})
    rec.put("//:b", "k1", [["b.out", "d1", 0o644]], 0.1, {"cmd": "x"})
    rec.close()

    def lost(line: str) -> None:
        raise OSError(27, "File too large")

    rec = BuildRecord(str(path), lambda _m: None)
    rec._write_line = lost  # type: ignore[method-assign]
    rec.put("//:a", "k2", [["a.out", "d2", 0o644]], 0.1, {"cmd": "x"})
    rec.close()
    again = BuildRecord(str(path), lambda _m: None)
    assert again.get("//:a")["k"] == "k2" and again.get("//:b")["k"] == "k1"  # type: ignore[index]
    rec = BuildRecord(str(path), lambda _m: None)
    rec._write_line = lost  # type: ignore[method-assign]
    rec.compact = lambda quiet=False: False  # type: ignore[method-assign]
    rec.drop("//:b")
    rec.close()
    assert not path.exists() and rec.get("//:a") is None


def test_outputs_and_durations_come_from_each_line_s_head_without_its_description(tmp_path: Path) -> None:
    """Every build asks every entry for its outputs; a test's description lists its inputs
    at every depth (hundreds of kB each beside 500 tests), and parsing them all was most of
    a build's start-up.  The heads give what the whole entries give, for every shape."""
    path = tmp_path / "record"
    big = {**DESC, "inputs": {f"lib/s{i}.py": "d" * 64 for i in range(2000)}}
    rec = BuildRecord(str(path), print)
    rec.put("//:a", "k1", [["a.out", "e" * 64, 420], ['q"uote,"desc":x', "f" * 64, 420]], 0.5, big)
    rec.put('//:we"ird', "k2", [["w.out", "e" * 64, 420]], 0.25, DESC)  # (an escaped label: another shape)
    rec.put("//:gone", "k3", [["g.out", "e" * 64, 420]], 0.1, DESC)
    rec.drop("//:gone")
    rec.close()
    with open(path, "a") as f:
        f.write('{"l":"//:old","o":[["o.out","' + "a" * 64 + '",420]],"d":2.0,"k":"k4","desc":"{}"}\n')
    again = BuildRecord(str(path), print)
    whole = BuildRecord(str(path), print)
    expected = {lab: e for lab, e in whole.entries.items()}  # (every line parsed whole)
    assert again.all_outputs() == {o[0] for e in expected.values() for o in e["o"]} == \
        {"a.out", 'q"uote,"desc":x', "w.out", "o.out"}
    assert again.durations() == {"//:a": 0.5, '//:we"ird': 0.25, "//:old": 2.0}
    assert again.entries._parsed.keys() == {'//:we"ird'}  # (the others: their heads only)
    assert again.get("//:a")["o"] == expected["//:a"]["o"] and desc_of(again.get("//:a")) == big
    again.entries["//:a"] = {"l": "//:a", "k": "k5", "o": [["new.out", "e" * 64, 420]], "d": 1.0, "desc": "{}"}
    assert again.entries.head("//:a")["o"] == [["new.out", "e" * 64, 420]] and "new.out" in again.all_outputs()


def test_holds_is_true_only_for_the_entry_prepare_would_make_of_the_same_values() -> None:
    """A result that holds the record's entry is not appended again; one with other outputs
    (same key: an A-B-A edit of an output, a nondeterministic command) must be, or the next
    build takes the output on disk for one modified since."""
    desc = {"cmd": "x"}
    outs = [["o.txt", "aa" * 32]]
    entry, _ = BuildRecord.prepare("//:t", "k1", outs, 1.23456, desc)
    text = keys.canonical(desc)
    assert BuildRecord.holds(entry, "k1", [["o.txt", "aa" * 32]], 1.23456, text)
    assert not BuildRecord.holds(entry, "k1", [["o.txt", "bb" * 32]], 1.23456, text)
    assert not BuildRecord.holds(entry, "k2", outs, 1.23456, text)
    assert not BuildRecord.holds(entry, "k1", outs, 2.0, text)
    assert not BuildRecord.holds(entry, "k1", outs, 1.23456, keys.canonical({"cmd": "y"}))
    # A stamp's run token (formats.md `r`): a rerun with the same key is a line of its own.
    stamp, line = BuildRecord.prepare("//:s", "k1", [], 1.0, desc, run="t1")
    assert stamp["r"] == "t1" and line.index('"r":"t1"') < line.index(',"desc":')
    assert BuildRecord.holds(stamp, "k1", [], 1.0, text, "t1")
    assert not BuildRecord.holds(stamp, "k1", [], 1.0, text, "t2") and not BuildRecord.holds(stamp, "k1", [], 1.0, text)


def test_a_stamp_s_run_token_is_read_from_the_line_s_head_and_a_bad_one_is_a_corrupt_line(tmp_path: Path) -> None:
    path = tmp_path / "record"
    rec = BuildRecord(str(path), print)
    rec.put_prepared(BuildRecord.prepare("//:s", "k1", [], 0.5, DESC, run="abc"))
    rec.close()
    with open(path, "a") as f:
        f.write('{"l":"//:bad","k":"k2","o":[],"d":1.0,"r":7,"desc":"{}"}\n')
    said: list[str] = []
    again = BuildRecord(str(path), said.append)
    assert again.entries.head("//:s")["r"] == "abc" and again.get("//:s")["r"] == "abc"
    assert again.get("//:bad") is None and said, said


def test_a_record_read_without_the_lock_is_never_removed(tmp_path: Path) -> None:
    """query, and a build checking its patterns before it waits for another build's lock,
    read the record: one that build had just made (empty: its header still to come) was
    taken for an unknown version and deleted from under it."""
    path = tmp_path / "record"
    for body in (b"", b"# buildtool record v99\n", b"garbage"):
        path.write_bytes(body)
        warned: list[str] = []
        assert BuildRecord(str(path), warned.append, readonly=True).all_outputs() == set()
        assert path.read_bytes() == body and warned == []
    path.unlink()
    path.mkdir()
    BuildRecord(str(path), lambda _m: None, readonly=True)
    assert path.is_dir()


def test_each_line_is_on_disk_before_the_next_target_so_a_kill_keeps_what_finished(tmp_path: Path) -> None:
    """A mutant that dropped the flush after each line survived: a kill -9 of the build then
    lost every line of it (the buffer), and what had finished ran again (no cache: for real)."""
    path = tmp_path / "record"
    rec = BuildRecord(str(path), print)
    rec.put("//:a", "ka", [["a", "e" * 64, 420]], 0.1, DESC)
    seen = BuildRecord(str(path), print, readonly=True)  # (another process's view, the build still going)
    assert seen.get("//:a") is not None and seen.get("//:a")["k"] == "ka"
    rec.close()


def test_a_compaction_that_fails_halfway_leaves_the_record_as_it_was(tmp_path: Path, monkeypatch) -> None:
    """Compaction writes a temp file and renames it: a mutant writing in place survived, and
    a full disk halfway through it would have cut the record (then deleted it)."""
    path = tmp_path / "record"
    rec = BuildRecord(str(path), print)
    for round_ in range(4):
        for i in range(300):
            rec.put(f"//:t{i}", f"k{round_}", [[f"o{i}", "e" * 64, 420]], 0.1, DESC)
    rec._fh.flush()  # type: ignore[union-attr]
    before = path.read_bytes()
    real_open = open

    class Full:
        def __init__(self, f: object) -> None:
            self.f, self.n = f, 0

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *a: object) -> None:
            self.f.close()  # type: ignore[attr-defined]

        def write(self, s: str) -> int:
            self.n += 1
            if self.n > 100:
                raise OSError(28, "No space left on device")
            return self.f.write(s)  # type: ignore[attr-defined, no-any-return]

    def full_open(file: str, mode: str = "r", *a: object, **k: object) -> object:
        f = real_open(file, mode, *a, **k)  # type: ignore[call-overload]
        return Full(f) if "w" in mode and ".tmp." in str(file) else f

    import builtins

    monkeypatch.setattr(builtins, "open", full_open)
    assert rec.compact(quiet=True) is False
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["record"]


def test_a_v1_record_s_lines_never_read_are_rewritten_as_v2_too(tmp_path: Path) -> None:
    """The upgrade copied lines it had not parsed as they were, a v1 line (its desc an
    object) under the v2 header; only a test reading every entry first covered it."""
    path = tmp_path / "record"
    lines = [{"l": f"//:{n}", "k": f"k{n}", "o": [[n, "e" * 64, 420]], "d": 0.5, "desc": DESC} for n in "bc"]
    path.write_text(HEADER_V1 + "".join(json.dumps(x) + "\n" for x in lines))
    rec = BuildRecord(str(path), print)
    assert desc_of(rec.get("//:b")) == DESC  # (//:c never read)
    rec.close()
    rows = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    assert [r["l"] for r in rows] == ["//:b", "//:c"] and all(isinstance(r["desc"], str) for r in rows), rows
    assert desc_of(BuildRecord(str(path), print).get("//:c")) == DESC


def test_an_empty_record_is_called_empty_not_of_another_version(tmp_path: Path) -> None:
    path = tmp_path / "record"
    path.write_bytes(b"")
    warned: list[str] = []
    BuildRecord(str(path), warned.append)
    assert warned == ["build record is empty; every target will be checked anew"], warned
