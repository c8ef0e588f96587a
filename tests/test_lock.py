"""lock.py: one buildtool per workspace, also when the lock file is deleted or replaced
while a second buildtool waits for it (``buildtool clean`` deleted the state dir that way)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from conftest import Workspace

from buildtool.errors import LockBusy
from buildtool.lock import WorkspaceLock


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


def test_a_build_whose_lock_file_was_deleted_still_holds_the_workspace(tmp_path: Path) -> None:
    """rm -rf .buildtool while A runs: B made a new lock file, locked it and ran beside A,
    both writing the same outputs (a mixed output recorded as up to date, and cached).
    The second lock (in this user's runtime directory) still holds A's place."""
    root = tmp_path / "ws"
    state = root / ".buildtool"
    state.mkdir(parents=True)
    (root / "buildtool.toml").write_text("")
    a = WorkspaceLock(str(state))
    a.acquire(False, lambda _m: None)
    shutil.rmtree(state)
    state.mkdir()
    b = WorkspaceLock(str(state))
    with pytest.raises(LockBusy, match="deleted while it ran"):
        b.acquire(False, lambda _m: None)
    said: list[str] = []
    waiting = threading.Event()
    t = threading.Thread(target=b.acquire, args=(True, lambda m: (said.append(m), waiting.set())), daemon=True)
    t.start()
    assert waiting.wait(10) and "its .buildtool/lock was deleted while it ran" in said[0], said
    assert t.is_alive()
    a.release()
    t.join(10)
    assert not t.is_alive() and b.fd is not None and b.second_fd is not None
    b.release()


def test_a_command_of_the_root_package_may_lock_its_own_directory(workspace: Workspace) -> None:
    """The workspace lock once held the root directory's flock: `flock . cmd` in a command
    of the root package waited for the build that waited for it."""
    if shutil.which("flock") is None:
        pytest.skip("no flock(1) here")
    workspace.build_file("", 'genrule(name="g", outs=["o.txt"], cmd="flock -w 5 . echo locked > $@")')
    r = workspace.build()
    assert r.rc == 0 and workspace.read("o.txt") == "locked\n", r.output


def test_workspaces_sharing_a_linked_marker_do_not_lock_each_other(tmp_path: Path) -> None:
    """The second lock was once the marker's flock: workspaces whose buildtool.toml links
    to one shared file waited for each other (a nested build run by a command hung)."""
    common = tmp_path / "common.toml"
    common.write_text("")
    states = []
    for name in ("a", "b"):
        (tmp_path / name / ".buildtool").mkdir(parents=True)
        (tmp_path / name / "buildtool.toml").symlink_to(common)
        states.append(str(tmp_path / name / ".buildtool"))
    a, b = WorkspaceLock(states[0]), WorkspaceLock(states[1])
    a.acquire(False, lambda _m: None)
    b.acquire(False, lambda _m: None)  # (LockBusy before)
    assert a.second_fd is not None and b.second_fd is not None
    b.release()
    a.release()


def test_the_second_lock_is_the_workspaces_whatever_the_path_or_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It was named after the root's path in $XDG_RUNTIME_DIR: a build reached through a
    symlinked path, or started with another XDG_RUNTIME_DIR (cron, an IDE), ran beside the
    first after rm -rf .buildtool.  And it is removed once let go of."""
    root = tmp_path / "ws"
    (root / ".buildtool").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(root)
    a = WorkspaceLock(str(root / ".buildtool"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    a.acquire(False, lambda _m: None)
    shutil.rmtree(root / ".buildtool")
    (root / ".buildtool").mkdir()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    b = WorkspaceLock(str(tmp_path / "alias" / ".buildtool"))
    with pytest.raises(LockBusy, match="deleted while it ran"):
        b.acquire(False, lambda _m: None)
    from buildtool.lock import second_lock_path

    path = second_lock_path(str(root))
    assert path is not None and os.path.exists(path)
    a.release()
    assert not os.path.exists(path)
    b.acquire(False, lambda _m: None)
    b.release()


def test_the_second_lock_file_goes_with_its_holder_even_if_the_root_went_first(tmp_path: Path) -> None:
    """The path was worked out again at release, from the root: with the root deleted (or
    replaced) meanwhile, the file stayed in /tmp for good."""
    root = tmp_path / "ws"
    (root / ".buildtool").mkdir(parents=True)
    a = WorkspaceLock(str(root / ".buildtool"))
    a.acquire(False, lambda _m: None)
    path = a.second_path
    assert path is not None and os.path.exists(path)
    shutil.rmtree(root)
    a.release()
    assert not os.path.exists(path)


def test_the_check_before_waiting_runs_only_when_the_lock_is_busy_and_its_error_ends_the_wait(tmp_path: Path) -> None:
    """``buildtool build //pkg:typo`` beside a long build waited for it, then said "unknown
    target": the session checks the patterns in ``before_wait``, whose error is raised at once."""
    state = tmp_path / "state"
    state.mkdir()
    calls: list[str] = []
    a = WorkspaceLock(str(state))
    a.acquire(True, lambda _m: None, before_wait=lambda: calls.append("a"))
    assert calls == []  # (free: nothing to check early, the build checks under the lock)
    said: list[str] = []

    def refuse() -> None:
        calls.append("b")
        raise ValueError("typo")

    b = WorkspaceLock(str(state))
    with pytest.raises(ValueError, match="typo"):
        b.acquire(True, said.append, before_wait=refuse)
    assert calls == ["b"] and said == [] and b.fd is None
    with pytest.raises(ValueError, match="typo"):  # (--no-wait: the typo, not "another buildtool is running")
        b.acquire(False, said.append, before_wait=refuse)
    assert calls == ["b", "b"] and b.fd is None
    a.release()


def test_a_link_planted_at_the_lock_file_is_replaced_not_written_through(tmp_path: Path) -> None:
    # The pid was written through it: a source it led to was emptied, then built from.
    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "in.txt"
    victim.write_text("precious source\n")
    (state / "lock").symlink_to(victim)
    said: list[str] = []
    lock = WorkspaceLock(str(state))
    lock.acquire(True, said.append)
    try:
        assert victim.read_text() == "precious source\n"
        assert not (state / "lock").is_symlink() and (state / "lock").is_file()
        assert len(said) == 1 and "was a symbolic link" in said[0] and str(victim) in said[0], said
    finally:
        lock.release()
