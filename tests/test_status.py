"""status: the --events writer when its file system fails it (a fake file at the open, the
rest real)."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest

import buildtool.status as status


def test_an_events_file_whose_close_fails_is_a_warning_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS and FUSE report a full quota or an I/O error at close(2): the cut-back to whole
    lines asked the closed file for its descriptor (ValueError, a traceback that skipped
    the rest of the build's clean-up)."""

    class NfsFile(io.FileIO):
        def close(self) -> None:
            super().close()
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    def nfs_open(path: str, mode: str, encoding: str | None = None) -> io.TextIOWrapper:
        return io.TextIOWrapper(io.BufferedWriter(NfsFile(path, mode)), encoding=encoding)

    monkeypatch.setattr(status, "open", nfs_open, raising=False)
    path = tmp_path / "e.jsonl"
    w = status.EventsWriter(str(path), None)  # type: ignore[arg-type]
    w.close()
    assert w.lost is not None and os.strerror(errno.EDQUOT) in w.lost, w.lost
    assert json.loads(path.read_text())["type"] == "header"
