"""Creating a lock file that appears at its path already prepared (a put-back)."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

import pytest

from helpers import lock_is_free
from local_mutex.backends.flock import lockdir


def _prepare(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.pwrite(fd, b'{"pid": 1}\n', 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2")
def test_the_file_appears_locked_with_its_record_and_under_its_own_name(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    fd = lockdir.create_exclusive(str(path), _prepare)
    assert fd is not None
    try:
        assert path.read_bytes() == b'{"pid": 1}\n'
        assert not lock_is_free(path)
        assert os.readlink(f"/proc/self/fd/{fd}") == str(path)  # as status reads holders
        assert oct(path.stat().st_mode & 0o777) == oct(lockdir.FILE_MODE)
        assert [p.name for p in tmp_path.iterdir()] == ["x.lock"]  # nothing left beside it
    finally:
        os.close(fd)


def test_a_file_already_there_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    path.write_bytes(b"theirs")
    assert lockdir.create_exclusive(str(path), _prepare) is None
    assert path.read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["x.lock"]


def test_a_directory_gone_is_nothing_to_create(tmp_path: Path) -> None:
    assert lockdir.create_exclusive(str(tmp_path / "gone" / "x.lock"), _prepare) is None


def test_a_new_lock_file_is_marked_from_its_first_instant(tmp_path: Path) -> None:
    """Whoever takes it first, its creator or not, looks for a lock still held on a file
    deleted from the path (``predecessor``): an empty new file would not say so."""
    path = tmp_path / "x.lock"
    fd, created = lockdir.open_or_create(str(path))
    os.close(fd)
    assert created
    if sys.platform.startswith("linux"):
        assert path.read_bytes() == lockdir.new_file_mark(str(path))
    fd, created = lockdir.open_or_create(str(path))
    os.close(fd)
    assert not created


def test_without_a_rename_that_never_replaces_it_is_created_as_usual(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lockdir, "_renameat2", lambda: None)
    path = tmp_path / "x.lock"
    fd = lockdir.create_exclusive(str(path), _prepare)
    assert fd is not None
    try:
        assert path.read_bytes() == b'{"pid": 1}\n'  # prepared just after it appeared
        assert not lock_is_free(path)
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2")
def test_a_file_system_that_refuses_the_rename_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lockdir, "_renameat2", lambda: lambda old, new: False)
    path = tmp_path / "x.lock"
    fd = lockdir.create_exclusive(str(path), _prepare)
    assert fd is not None
    try:
        assert [p.name for p in tmp_path.iterdir()] == ["x.lock"]  # the attempt's file is gone
        assert not lock_is_free(path)  # the file returned is the one prepared, as always
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2")
@pytest.mark.parametrize("deletions", [1, 1000])
def test_a_prepared_file_deleted_before_its_rename_is_prepared_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deletions: int
) -> None:
    """A tmp cleaner took the prepared file: the file created the plain way instead was
    not the one prepared (a holder's put-back: nobody locked it). It prepares another; a
    cleaner that takes every one gets the plain way's, prepared just after it appears."""
    real = lockdir._renameat2()
    assert real is not None
    calls: list[str] = []

    def cleaner_first(old: str, new: str) -> bool:
        calls.append(old)
        if len(calls) <= deletions:
            os.unlink(old)
        return real(old, new)

    monkeypatch.setattr(lockdir, "_renameat2", lambda: cleaner_first)
    path = tmp_path / "x.lock"
    fd = lockdir.create_exclusive(str(path), _prepare)
    assert fd is not None
    try:
        assert [p.name for p in tmp_path.iterdir()] == ["x.lock"]
        assert not lock_is_free(path) and path.read_bytes() == b'{"pid": 1}\n'
        assert len(calls) == (2 if deletions == 1 else lockdir._VANISHED_TRIES)
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2")
def test_what_a_creator_killed_mid_creation_left_goes_with_the_next_creation(
    tmp_path: Path,
) -> None:
    """A SIGKILL between creating the file beside the path and renaming it leaves that file;
    the next creation of the same lock file removes it once it is clearly abandoned."""
    path = tmp_path / "x.lock"
    old = time.time() - lockdir._TEMP_LEFT_AFTER - 5
    left = tmp_path / ".x.lock.0123456789ab"  # as a killed creator leaves it
    recent = tmp_path / ".x.lock.ba9876543210"  # a creator mid-way right now
    other = tmp_path / ".y.lock.0123456789ab"  # another lock's
    odd = tmp_path / ".x.lock.not-ours"  # not a name we make
    for f in (left, recent, other, odd):
        f.write_bytes(lockdir.new_file_mark(str(path)))
    for f in (left, other, odd):
        os.utime(f, (old, old))
    fd = lockdir.create_exclusive(str(path), _prepare)
    assert fd is not None
    os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["x.lock", recent.name, other.name, odd.name]
    )


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="the look past a deleted file")
def test_a_put_back_that_lost_its_file_again_names_nobody_for_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaner deleted the new file another process had taken while the holder asked
    who took it: the look found the holder's own lock (on the file deleted first), and the
    holder warned that it, itself, "took the new file first" and may run beside it."""
    import subprocess

    from local_mutex.backends.flock import kernel, putback
    from local_mutex.backends.flock.lock import FlockLock

    lock = FlockLock(b"again", str(tmp_path), allow_other_owner=False, env={})
    try:
        assert kernel.try_lock(lock.fd)
        lock.held = True
        os.unlink(lock.path)  # the cleaner; a newcomer's file is there now, taken
        taker = subprocess.Popen(
            [sys.executable, "-c", TAKER, lock.path],
            stdout=subprocess.PIPE,
        )
        assert taker.stdout is not None and taker.stdout.readline() == b"locked\n"
        real_take = putback._take

        def take_then_clean(lock_: FlockLock, fd: int) -> bool:
            taken = real_take(lock_, fd)
            if not taken:  # as the holder asks who took it, the cleaner strikes again
                os.unlink(lock.path)
                taker.kill()
                taker.wait()
            return taken

        monkeypatch.setattr(putback, "_take", take_then_clean)
        warning = putback.put_back(lock)
        assert warning is None and lock.lost_to is None, warning
        monkeypatch.setattr(putback, "_take", real_take)
        warning = putback.put_back(lock)  # the next tick: the path is empty, ours again
        assert warning is not None and "put a locked file back" in warning, warning
    finally:
        lock.close()


TAKER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""
