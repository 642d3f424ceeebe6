"""The keeper's last resort: finding the command by the lock it shares, when the supervisor
died before it could say which process it started."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import wait_for
from local_mutex.supervise.reaper import group_holding

pytestmark = pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="reads /proc")


def _leader(fd: int) -> subprocess.Popen[bytes]:
    """``sleep`` leading a process group of its own, with ``fd`` inherited."""
    return subprocess.Popen(["sleep", "30"], pass_fds=(fd,), preexec_fn=os.setpgrp)  # noqa: PLW1509


def test_the_command_is_the_group_that_holds_our_lock(tmp_path: Path) -> None:
    path = tmp_path / "l.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    # A waiter on the same file (its own description, no lock granted) is not the command.
    waiter_fd = os.open(path, os.O_RDONLY)
    waiter = _leader(waiter_fd)
    command = None
    try:
        assert group_holding([fd]) is None
        command = _leader(fd)  # shares our description, lock and all, as a command does
        assert group_holding([fd]) == command.pid
    finally:
        for p in (waiter, command):
            if p is not None:
                p.kill()
                p.wait()
        os.close(waiter_fd)
        os.close(fd)


def test_nothing_without_descriptors() -> None:
    assert group_holding([]) is None


def test_another_runs_shared_lock_on_the_same_file_is_not_ours(tmp_path: Path) -> None:
    """Two ``--shared`` runs of one lock, started from one shell: each holds its own
    description of the same file. The other run's command must never be taken for ours."""
    path = tmp_path / "l.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)
    marker = tmp_path / "other-holds"
    taker = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "fcntl.flock(fd, fcntl.LOCK_SH)\n"
        "open(sys.argv[2], 'w').close()\n"
        "time.sleep(30)\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", taker, str(path), str(marker)],
        preexec_fn=os.setpgrp,  # noqa: PLW1509
    )
    command = None
    try:
        wait_for(marker, timeout=20)
        assert group_holding([fd]) is None
        command = _leader(fd)
        assert group_holding([fd]) == command.pid
    finally:
        for p in (other, command):
            if p is not None:
                p.kill()
                p.wait()
        os.close(fd)


def test_a_group_is_still_seen_where_proc_cannot_be_listed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Near a memory limit (``ulimit -v``) listing /proc fails with ENOMEM, and the keeper
    stopping an orphaned command ended in a traceback (exit 1, not 70). The kernel is asked
    about the group instead (here /proc is made unlistable: a path that is not there)."""
    from local_mutex import _proc
    from local_mutex.supervise import reaper

    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        monkeypatch.setattr(_proc, "PROC", str(tmp_path / "no-proc"))
        assert reaper.group_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not reaper.group_alive(proc.pid)
