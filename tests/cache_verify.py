"""Test helper: walk a cache dir's v1/ac and v1/cas and check every invariant that must
survive crashes, concurrency and GC: each action entry parses, names only safe relative
paths, and has every content it names either inside itself (hashing to its digest) or as
a blob that exists and whose content hashes to its name; no temp file is left
half-written in a blob's place."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import blake3


def blob_digest(p: Path) -> str:
    h = blake3.blake3()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verify_cache(cache_dir: Path | str) -> dict[str, int]:
    """Raise AssertionError on any broken invariant; return counts."""
    v1 = Path(cache_dir) / "v1"
    blobs: dict[str, Path] = {}
    cas = v1 / "cas"
    if cas.is_dir():
        for shard in cas.iterdir():
            for b in shard.iterdir():
                assert b.is_file(), f"{b} is not a file"
                assert b.name[:2] == shard.name, f"blob {b} in the wrong shard"
                assert blob_digest(b) == b.name, f"blob {b} does not match its digest"
                blobs[b.name] = b
    entries = 0
    ac = v1 / "ac"
    if ac.is_dir():
        for shard in ac.iterdir():
            for e in shard.iterdir():
                obj = json.loads(e.read_bytes())
                assert obj["v"] == 1, e
                refs = [o[1] for o in obj["outputs"]] + [d for d in (obj.get("stdout"), obj.get("stderr")) if d]
                for p, _, mode in obj["outputs"]:
                    assert not p.startswith("/") and ".." not in p.split("/"), (e, p)
                    assert mode in (0o644, 0o755), (e, mode)
                inline = obj.get("inline", {})
                for d, text in inline.items():
                    assert blake3.blake3(base64.b64decode(text)).hexdigest() == d, f"entry {e.name[:12]}: {d[:12]}"
                for d in refs:
                    assert d in inline or d in blobs, f"entry {e.name[:12]} points at missing blob {d[:12]}"
                entries += 1
    return {"entries": entries, "blobs": len(blobs)}
