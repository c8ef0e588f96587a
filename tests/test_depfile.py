"""Unit tests: the Make depfile parser, the workspace filter, two-level keys, manifests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import immutable

from buildtool import discovered, keys
from buildtool.cache import ActionEntry, Cache, CachedOutput
from buildtool.depfile import DepfileError, parse, parse_file, workspace_inputs


def test_gcc_style_with_continuations() -> None:
    text = "out.o: a.c include/a.h \\\n  /usr/include/stdio.h \\\n  b.h\n"
    d = parse(text)
    assert d.targets == ["out.o"]
    assert d.prerequisites == ["a.c", "include/a.h", "/usr/include/stdio.h", "b.h"]


def test_the_fast_tokenizer_reads_a_plain_depfile_as_the_escape_aware_one_does() -> None:
    """A depfile with no escapes, comments, ``$`` or CR (a compiler's usual one) is split by
    ``str.split``; on 20,000 random texts the words and line ends are those the
    character-by-character tokenizer finds."""
    import random

    from buildtool.depfile import _escaped_tokens, _tokens

    rng = random.Random(7)
    alphabet = ["a", "b.h", "/", " ", "  ", "\t", "\n", ":", "::", "\\\n", "\\", "x:y", "\v", "\xa0", "é"]
    plain = 0
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        fast = list(_tokens(text))
        assert fast == list(_escaped_tokens(text)), repr(text)
        plain += "\\" not in text.replace("\\\n", " ")
    assert plain > 5_000  # (the fast path was taken, not only the fallback)


def test_escaped_spaces_hash_and_dollar() -> None:
    d = parse("o.o: dir\\ with\\ space/x.h a\\#b.h cost$$.h\n")
    assert d.prerequisites == ["dir with space/x.h", "a#b.h", "cost$.h"]


def test_backslashes_before_a_space_follow_make() -> None:
    # 2N backslashes + space: N backslashes, then the path ends; 2N+1: N and a space.
    d = parse("o.o: a\\\\ b.h c\\\\\\ d.h\n")
    assert d.prerequisites == ["a\\", "b.h", "c\\ d.h"]


def test_backslashes_before_a_hash_are_one_fewer_and_the_line_goes_on() -> None:
    # gcc 12 writes the header e\#f.h as e\\#f.h: read as "e\" and a comment, x.h was lost
    # (an edit of it left the object up to date).  Ninja: N backslashes + '#' -> N-1 and '#'.
    d = parse("m.o: m.c e\\\\#f.h x.h\n")
    assert d.prerequisites == ["m.c", "e\\#f.h", "x.h"], d.prerequisites
    assert parse("m.o: a\\\\\\#b.h\n").prerequisites == ["a\\\\#b.h"]


def test_other_backslashes_are_literal() -> None:
    assert parse("o.o: a\\b.h\n").prerequisites == ["a\\b.h"]


def test_phony_targets_from_MP_and_duplicates() -> None:
    d = parse("o.o: a.c a.h b.h\n\na.h:\n\nb.h:\n")
    assert d.targets == ["o.o", "a.h", "b.h"]
    assert d.prerequisites == ["a.c", "a.h", "b.h"]
    assert parse("o.o: a.h a.h a.h\n").prerequisites == ["a.h"]


def test_several_targets_crlf_comments_and_tabs() -> None:
    d = parse("# generated\r\nx.o y.o:\ta.c\t\\\r\n b.h # trailing\r\n")
    assert d.targets == ["x.o", "y.o"]
    assert d.prerequisites == ["a.c", "b.h"]


def test_colon_inside_a_path_is_not_a_separator() -> None:
    d = parse("o.o: dir/a:b.h\n")
    assert d.prerequisites == ["dir/a:b.h"]


def test_a_stray_colon_among_prerequisites_is_no_input() -> None:
    """``a.o: b.h : c.h`` (a tool's separator in the wrong place): the second ``:`` is a
    separator, not a file.  Taken as a prerequisite named ``:`` it became a header input
    that never exists in the package, on both the plain and the escape-aware tokenizer's
    path, alone on a continuation line too."""
    for text in ("a.o: b.h : c.h\n", "a.o: b.h :\n", "a.o: my\\ b.h : c.h\n", "a.o: b.h \\\n : c.h\n"):
        d = parse(text)
        assert d.targets == ["a.o"] and ":" not in d.prerequisites, (text, d.prerequisites)
    assert parse("a.o: b.h : c.h\n").prerequisites == ["b.h", "c.h"]
    assert parse("a.o: my\\ b.h : c.h\n").prerequisites == ["my b.h", "c.h"]


def test_empty_file_and_no_prerequisites() -> None:
    assert parse("").prerequisites == []
    assert parse("o.o:\n").targets == ["o.o"]
    assert parse("o.o:").prerequisites == []


@pytest.mark.parametrize("text", ["just words here\n", ": a.h\n", "o.o a.c\n"])
def test_malformed(text: str) -> None:
    with pytest.raises(DepfileError, match="target: prerequisites"):
        parse(text)


def test_parse_file_reads_bytes(tmp_path: Path) -> None:
    p = tmp_path / "x.d"
    p.write_bytes(b"x.o: caf\xc3\xa9.h raw\xff.h\n")
    d = parse_file(str(p))
    assert d.prerequisites[0] == "café.h"
    assert d.prerequisites[1].encode("utf-8", "surrogateescape") == b"raw\xff.h"
    with pytest.raises(FileNotFoundError):
        parse_file(str(tmp_path / "missing.d"))


def test_workspace_inputs_filters_and_normalises(tmp_path: Path) -> None:
    root = str(tmp_path)
    got = workspace_inputs(
        [
            "a.c",
            "./include/../include/a.h",
            "../shared/s.h",  # from package lib: lib/../shared -> shared/s.h
            "../../outside.h",
            "/usr/include/stdio.h",
            f"{root}/lib/abs.h",
            "../.buildtool/y.h",
        ],
        root,
        "lib",
    )
    assert got == ["lib/a.c", "lib/abs.h", "lib/include/a.h", "shared/s.h"]


def test_workspace_inputs_root_package_and_symlinked_root(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    got = workspace_inputs(["x.h", f"{real}/y.h", f"{link}/z.h", "../escape.h"], str(link), "")
    assert got == ["x.h", "y.h", "z.h"]



def test_workspace_inputs_through_a_link_from_outside_into_the_workspace(tmp_path: Path) -> None:
    """-I/elsewhere/inc, /elsewhere/inc a link into the workspace (or the workspace reached
    by another link): those headers are the workspace's, and were taken for system headers
    (edits to them rebuilt nothing)."""
    ws = tmp_path / "ws"
    (ws / "third_party" / "inc").mkdir(parents=True)
    (tmp_path / "inc-link").symlink_to(ws / "third_party" / "inc")
    (tmp_path / "ws-link").symlink_to(ws)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "d.h").symlink_to(ws / "third_party" / "inc" / "d.h")  # a link to one header
    got = workspace_inputs([f"{tmp_path}/inc-link/a.h", f"{tmp_path}/ws-link/third_party/inc/b.h",
                            f"{tmp_path}/elsewhere/c.h", f"{tmp_path}/files/d.h", "/usr/include/stdio.h"],
                           str(ws), "")
    assert got == ["third_party/inc/a.h", "third_party/inc/b.h", "third_party/inc/d.h"]

# -- two-level keys ------------------------------------------------------------------------
def _desc(inputs: dict[str, str]) -> dict[str, object]:
    return keys.action_description("genrule", "", "cc -c a.c", "sh", {}, {}, inputs, ("a.o",),
                                   {"depfile": "a.d"})


def test_final_description_round_trips_and_changes_with_header_digest() -> None:
    desc = _desc({"a.c": "1" * 64})
    f1 = discovered.final_description(desc, {"a.h": "2" * 64, "a.c": "1" * 64})
    assert f1["discovered"] == ["a.h"]
    assert f1["inputs"] == {"a.c": "1" * 64, "a.h": "2" * 64}
    assert discovered.primary_description(f1) == desc
    f2 = discovered.final_description(desc, {"a.h": "3" * 64})
    assert keys.key_of(f1) != keys.key_of(f2) != keys.key_of(desc)
    k, _ = discovered.final_key(desc, ["a.h"], {"a.h": "2" * 64}.get)
    assert k == keys.key_of(f1)
    k_missing, d_missing = discovered.final_key(desc, ["a.h"], {}.get)
    assert d_missing["inputs"]["a.h"] == discovered.MISSING and k_missing != k


def test_recorded_paths() -> None:
    assert discovered.recorded_paths(None) is None
    assert discovered.recorded_paths({"desc": {}}) is None
    assert discovered.recorded_paths({"desc": {"discovered": ["a.h"]}}) == ["a.h"]
    assert discovered.recorded_paths({"desc": {"discovered": [1]}}) is None


def _cache(tmp_path: Path, warnings: list[str]) -> Cache:
    return Cache(str(tmp_path / "cache"), warnings.append)


def test_manifest_lookup_finds_the_variant_matching_the_files_on_disk(tmp_path: Path) -> None:
    warnings: list[str] = []
    cache = _cache(tmp_path, warnings)
    mf = discovered.Manifests(cache, warnings.append)
    desc = _desc({"a.c": "1" * 64})
    primary = keys.key_of(desc)
    on_disk = {"a.h": "2" * 64, "b.h": "4" * 64}
    # Two variants were seen for this primary key; each has its own final key in the cache.
    for paths, out in ((["a.h"], "5" * 64), (["a.h", "b.h"], "6" * 64)):
        fk, _ = discovered.final_key(desc, paths, on_disk.get)
        cache.put_action(fk, ActionEntry((CachedOutput("a.o", out, 0o644),), 0.1, None, None))
        mf.add(primary, paths)
    assert mf.read(primary) == [["a.h", "b.h"], ["a.h"]]
    # Both variants match the files on disk: with the same a.h, only something outside the
    # key (a header that appeared earlier on the include path) can make the compiler read
    # b.h or not, so neither is trusted: a miss, and the compiler decides.
    assert mf.lookup(primary, desc, on_disk.get) is None
    # One variant only: it is served.
    c2 = discovered.Manifests(cache, warnings.append)
    p2 = keys.key_of(_desc({"b.c": "1" * 64}))
    fk, _ = discovered.final_key(_desc({"b.c": "1" * 64}), ["a.h", "b.h"], on_disk.get)
    cache.put_action(fk, ActionEntry((CachedOutput("b.o", "7" * 64, 0o644),), 0.1, None, None))
    c2.add(p2, ["a.h", "b.h"])
    hit = c2.lookup(p2, _desc({"b.c": "1" * 64}), on_disk.get)
    assert hit is not None and hit[0].outputs[0].digest == "7" * 64
    assert hit[2]["discovered"] == ["a.h", "b.h"]
    # b.h gone: the first variant cannot be checked, the second still matches.
    hit = mf.lookup(primary, desc, {"a.h": "2" * 64}.get)
    assert hit is not None and hit[0].outputs[0].digest == "5" * 64
    # a header changed: nothing matches, never a stale entry.
    assert mf.lookup(primary, desc, {"a.h": "9" * 64, "b.h": "4" * 64}.get) is None
    assert warnings == []


def test_manifest_corrupt_other_version_or_escaping_paths_is_a_miss(tmp_path: Path) -> None:
    warnings: list[str] = []
    cache = _cache(tmp_path, warnings)
    mf = discovered.Manifests(cache, warnings.append)
    primary = "ab" * 32
    path = Path(mf.dir) / primary[:2] / primary
    path.parent.mkdir(parents=True)
    for body in (b"{not json", json.dumps({"v": 99, "variants": []}).encode(),
                 json.dumps({"v": 1, "variants": [["../../etc/passwd"]]}).encode(),
                 json.dumps({"v": 1, "variants": "x"}).encode()):
        path.write_bytes(body)
        assert mf.read(primary) == []
    assert len(warnings) == 4
    assert any("outside the workspace" in w for w in warnings)


@pytest.mark.parametrize("kind", ["fifo", "directory", "nested"])
def test_a_manifest_that_is_not_a_json_file_is_removed_not_waited_for(tmp_path: Path, kind: str) -> None:
    """A named pipe there hung the build (open waits for a writer, past Ctrl-C); a directory
    was warned about three times a build, forever; JSON nested 100,000 deep was a crash."""
    warnings: list[str] = []
    mf = discovered.Manifests(_cache(tmp_path, warnings), warnings.append)
    primary = "ef" * 32
    path = Path(mf.dir) / primary[:2] / primary
    path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        (path / "x").mkdir(parents=True)
    else:
        path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    assert mf.read(primary) == []
    assert not os.path.lexists(path) and len(warnings) == 1, warnings
    mf.add(primary, ["a.h"])
    assert mf.read(primary) == [["a.h"]]


def test_manifest_keeps_a_bounded_most_recent_first_list(tmp_path: Path) -> None:
    warnings: list[str] = []
    mf = discovered.Manifests(_cache(tmp_path, warnings), warnings.append)
    primary = "cd" * 32
    for i in range(discovered.MAX_VARIANTS + 5):
        mf.add(primary, [f"h{i}.h"])
    mf.add(primary, ["h7.h"])
    got = mf.read(primary)
    assert len(got) == discovered.MAX_VARIANTS
    assert got[0] == ["h7.h"] and got.count(["h7.h"]) == 1
    # Written atomically: no temp file is left behind.
    assert os.listdir(os.path.join(mf.cache.dir, "tmp")) == []


def test_a_manifest_the_cache_refuses_stops_the_stores_with_one_warning(tmp_path: Path) -> None:
    """A full disk (here: mf/ immutable) warned once per manifest, beside the cache's own
    "nothing is stored" warning, and went on trying each one."""
    warnings: list[str] = []
    cache = _cache(tmp_path, warnings)
    mf = discovered.Manifests(cache, warnings.append)
    Path(mf.dir).mkdir(parents=True, exist_ok=True)
    with immutable(Path(mf.dir)):
        for n in range(3):
            mf.add(f"{n:02d}" * 32, ["a.h"])
    assert not cache.writable
    assert len(warnings) == 1 and "nothing is stored in the cache for the rest of this build" in warnings[0], warnings


def test_a_word_of_backslashes_alone_before_a_continuation_is_a_word_of_its_own() -> None:
    """`\\\\` then a newline: one backslash, a word by itself; it did not join the next."""
    assert parse("o.o: \\\\\n b.h\n").prerequisites == ["\\", "b.h"]
    assert parse("o.o: a \\\\\n b.h\n").prerequisites == ["a", "\\", "b.h"]


def test_one_build_s_depfiles_in_two_packages_resolve_the_same_name_each_in_its_own(tmp_path: Path) -> None:
    """`cfg.h` in the root's depfile and in lib's are two files: the memo of the answers is
    per package (one memo for all left lib/cfg.h out of lib's inputs: a stale build)."""
    from buildtool.depfile import WorkspacePaths

    paths = WorkspacePaths(str(tmp_path))
    assert paths.inputs(["cfg.h"], "") == ["cfg.h"]
    assert paths.inputs(["cfg.h", "../cfg.h"], "lib") == ["cfg.h", "lib/cfg.h"]
    assert paths.inputs(["cfg.h"], "") == ["cfg.h"]


def test_the_workspace_s_parent_and_state_directory_themselves_are_no_inputs(tmp_path: Path) -> None:
    got = workspace_inputs([".", "..", ".buildtool", ".buildtool/record", "lib/..", "a.h"], str(tmp_path), "")
    assert got == ["a.h"]
    assert workspace_inputs(["..", "../.buildtool"], str(tmp_path), "lib") == []


def test_a_crlf_depfile_without_escapes_has_clean_prerequisites() -> None:
    # The fast tokenizer (no backslash, # or $) kept the \r of each line's last word: b.h\r was
    # never found on disk, and an edit of b.h rebuilt nothing.
    from buildtool.depfile import parse
    assert parse("a.o: a.c b.h\r\n").prerequisites == ["a.c", "b.h"]
