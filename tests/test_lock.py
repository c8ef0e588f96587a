"""lock.py: one buildtool per workspace, also when the lock file is deleted or replaced
while a second buildtool waits for it (``buildtool clean`` deleted the state dir that way)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from buildtool.lock import LockBusy, WorkspaceLock


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_lock_file_gone_while_waiting_is_not_what_the_waiter_holds(tmp_path: Path, how: str) -> None:
    """B waits on the file A holds; the file is deleted (or replaced) and A lets go. B must
    then hold the lock file at the path, so that C, starting now, cannot run beside it; it
    held the deleted file's lock and C made a new file and ran."""
    state = tmp_path / "state"
    state.mkdir()
    a = WorkspaceLock(str(state))
    a.acquire(False, lambda _m: None)
    b = WorkspaceLock(str(state))
    waiting = threading.Event()
    t = threading.Thread(target=b.acquire, args=(True, lambda _m: waiting.set()), daemon=True)
    t.start()
    assert waiting.wait(10), "B never waited"
    if how == "deleted":
        shutil.rmtree(state)
    else:
        (state / "lock.new").write_text("")
        os.replace(state / "lock.new", state / "lock")
    a.release()
    t.join(10)
    assert not t.is_alive() and b.fd is not None
    assert os.path.samestat(os.fstat(b.fd), os.stat(state / "lock"))
    c = WorkspaceLock(str(state))
    with pytest.raises(LockBusy):
        c.acquire(False, lambda _m: None)
    b.release()
    c.acquire(False, lambda _m: None)
    c.release()
