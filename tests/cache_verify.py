"""Test helper: read and check a cache dir as another program would (plain sqlite3 and
files), and the invariants that must survive crashes, concurrency and GC: each action
entry parses, names only safe relative paths, and has every content it names either
inside itself (hashing to its digest) or as a blob that exists and whose content hashes
to its name; no temp file is left half-written in a blob's place."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import blake3

LAYOUT = "v2"


def layout_dir(cache_dir: Path | str) -> Path:
    return Path(cache_dir) / LAYOUT


def blob_path(cache_dir: Path | str, digest: str) -> Path:
    return layout_dir(cache_dir) / "cas" / digest[:2] / digest


def db_path(cache_dir: Path | str) -> Path:
    return layout_dir(cache_dir) / "actions.db"


def entries(cache_dir: Path | str) -> dict[str, bytes]:
    """key -> the raw entry, for every action entry of the cache."""
    if not db_path(cache_dir).exists():
        return {}
    with sqlite3.connect(db_path(cache_dir)) as c:
        return {k: bytes(e) for k, e in c.execute("SELECT key, entry FROM actions")}


def entry(cache_dir: Path | str, key: str) -> dict:
    return json.loads(entries(cache_dir)[key])


def write_entry(cache_dir: Path | str, key: str, raw: bytes) -> None:
    """Replace the stored entry of ``key`` with ``raw`` (as a damaged or hostile cache would hold it)."""
    c = sqlite3.connect(db_path(cache_dir))
    try:
        with c:
            c.execute("UPDATE actions SET entry = ? WHERE key = ?", (raw, key))
    finally:
        c.close()


def stored(cache_dir: Path | str, key: str, digest: str) -> bytes:
    """The content the cache keeps for ``digest`` of ``key``'s entry: inside it, or as a blob."""
    inline = entry(cache_dir, key).get("inline", {})
    if digest in inline:
        return base64.b64decode(inline[digest])
    return blob_path(cache_dir, digest).read_bytes()


def blob_digest(p: Path) -> str:
    h = blake3.blake3()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verify_cache(cache_dir: Path | str) -> dict[str, int]:
    """Raise AssertionError on any broken invariant; return counts."""
    blobs: dict[str, Path] = {}
    cas = layout_dir(cache_dir) / "cas"
    if cas.is_dir():
        for shard in cas.iterdir():
            for b in shard.iterdir():
                assert b.is_file(), f"{b} is not a file"
                assert b.name[:2] == shard.name, f"blob {b} in the wrong shard"
                assert blob_digest(b) == b.name, f"blob {b} does not match its digest"
                blobs[b.name] = b
    n = 0
    for key, raw in entries(cache_dir).items():
        obj = json.loads(raw)
        assert obj["v"] == 1, key
        refs = [o[1] for o in obj["outputs"]] + [d for d in (obj.get("stdout"), obj.get("stderr")) if d]
        for p, _, mode in obj["outputs"]:
            assert not p.startswith("/") and ".." not in p.split("/"), (key, p)
            assert mode in (0o644, 0o755), (key, mode)
        inline = obj.get("inline", {})
        for d, text in inline.items():
            assert blake3.blake3(base64.b64decode(text)).hexdigest() == d, f"entry {key[:12]}: {d[:12]}"
        for d in refs:
            assert d in inline or d in blobs, f"entry {key[:12]} points at missing blob {d[:12]}"
        n += 1
    return {"entries": n, "blobs": len(blobs)}


def put_now(cache: Any, key: str, entry: Any) -> None:
    """Write ``entry`` into ``cache``'s database at once (``put_action`` queues it, and
    writes it only if its blobs are there: these entries name digests no blob has)."""
    assert cache.actions.put(key, cache.encode_entry(key, entry))
