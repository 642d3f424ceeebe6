"""Signal state a caller leaves behind survives exec: SIGCHLD ignored (bash's
``trap '' CHLD``, Python's subprocess passes it on) or signals blocked. Neither may cost
an exit status, a ceiling or the supervisor's stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import local_mutex
from helpers import CLI, Procs, clean_env, hold_until, lock_file, lock_is_free, wait_for
from helpers import procwatch as pw

# argv[1] is "ignore:SIG", "block:SIG" or "pending:SIG"; then the program to exec so.
LAUNCH = """
import os, signal, sys
how, name = sys.argv[1].split(":")
if how == "ignore":
    signal.signal(getattr(signal, name), signal.SIG_IGN)
else:
    signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, name)})
    if how == "pending":  # blocked, and one already sent: it survives exec
        signal.raise_signal(getattr(signal, name))
os.execv(sys.argv[2], sys.argv[2:])
"""


def _in(state: str, *args: str) -> list[str]:
    return [sys.executable, "-c", LAUNCH, state, *CLI, *args]


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


@pytest.mark.parametrize(
    ("state", "command", "expected"),
    [
        ("ignore:SIGCHLD", "exit 7", 7),
        ("ignore:SIGCHLD", "kill -9 $$", 137),
        ("block:SIGCHLD", "exit 7", 7),
        ("block:SIGCHLD", "sleep 0.2 & exit 3", 3),
    ],
)
def test_an_ignored_or_blocked_sigchld_costs_no_status_and_no_wait(
    lock_dir: Path, state: str, command: str, expected: int
) -> None:
    """Ignored, every status would be 0 (the kernel reaps unasked). Blocked, the supervisor
    -- asleep until a signal comes, SIGCHLD at the command's end -- would sleep on with the
    lock held after the command ended."""
    r = subprocess.run(
        _in(state, "-q", "c", command, str(lock_dir)),
        env=clean_env(),
        capture_output=True,
        timeout=30,
    )
    assert r.returncode == expected, r.stderr
    assert lock_is_free(lock_file(lock_dir, "c"))


@needs_proc
def test_an_ignored_sigchld_still_lets_the_keeper_stop_a_command_whose_supervisor_died(
    tmp_path: Path, lock_dir: Path, marks: Path
) -> None:
    """It used to end in a traceback, with the lock let go while the command ran on."""
    err = tmp_path / "keeper.err"
    cmd = f"echo $$ > '{marks}/cmd.pid'; " + hold_until(marks)
    with open(err, "wb") as f:
        keeper = subprocess.Popen(
            _in("ignore:SIGCHLD", "-q", "c", cmd, str(lock_dir)), env=clean_env(), stderr=f
        )
    try:
        wait_for(marks / "h.held")
        command = int((marks / "cmd.pid").read_text())
        supervisor = pw.ppid(command)
        assert supervisor is not None and supervisor > 1
        os.kill(supervisor, signal.SIGKILL)
        assert keeper.wait(30) == 128 + signal.SIGKILL, err.read_text()
        assert not pw.alive(command), "the keeper ended with the command still running"
        assert lock_is_free(lock_file(lock_dir, "c"))
        assert "Traceback" not in err.read_text()
    finally:
        (marks / "h.go").touch()
        if keeper.poll() is None:
            keeper.kill()
            keeper.wait()


def test_a_blocked_sigalrm_does_not_disarm_wait_or_timeout(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    holder = procs.start(["-q", "c", hold_until(marks), str(lock_dir)])
    try:
        wait_for(marks / "h.held")
        started = time.monotonic()
        r = subprocess.run(
            _in("block:SIGALRM", "-q", "--wait", "1", "c", "true", str(lock_dir)),
            env=clean_env(),
            capture_output=True,
            timeout=30,  # it used to wait for the lock, here until the holder ends (60 s)
        )
        assert r.returncode == 75, r.stderr
        print(f"--wait 1 gave up after {time.monotonic() - started:.1f}s")
        r = subprocess.run(
            _in("block:SIGALRM", "-q", "--timeout", "0.5", "t", "sleep 40", str(lock_dir)),
            env=clean_env(),
            capture_output=True,
            timeout=30,  # it used to let ``sleep 40`` run to its end
        )
        assert r.returncode == 124, r.stderr
    finally:
        (marks / "h.go").touch()
        holder.wait(20)


@needs_proc
def test_a_blocked_sigusr1_does_not_keep_the_supervisor_from_stopping_the_command(
    lock_dir: Path, marks: Path
) -> None:
    """SIGUSR1 is the keeper's "stop now"; the supervisor's own death watch uses it too."""
    cmd = f"echo $$ > '{marks}/cmd.pid'; " + hold_until(marks)
    keeper = subprocess.Popen(
        _in("block:SIGUSR1", "-q", "c", cmd, str(lock_dir)),
        env=clean_env(),
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(marks / "h.held")
        command = int((marks / "cmd.pid").read_text())
        keeper.kill()
        keeper.wait()
        wait_for(lambda: not pw.alive(command), 20, "the supervisor to stop the command")
    finally:
        (marks / "h.go").touch()


def test_the_api_collects_statuses_under_an_ignored_sigchld_and_puts_it_back(
    lock_dir: Path,
) -> None:
    before = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        result = local_mutex.run("api", command="exit 7", lock_dir=str(lock_dir))
        assert result.status == 7
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGCHLD, before)
    assert lock_is_free(lock_file(lock_dir, "api"))


def test_a_sigalrm_pending_at_exec_is_not_taken_for_the_wait_ceiling(
    procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    """Unblocked for the wait, the caller's pending SIGALRM must not end a --wait 30 at 0 s."""
    holder = procs.start(["-q", "c", hold_until(marks), str(lock_dir)])
    err = tmp_path / "waiter.err"
    try:
        wait_for(marks / "h.held")
        with open(err, "wb") as f:
            waiter = subprocess.Popen(
                _in("pending:SIGALRM", "--wait", "30", "c", "true", str(lock_dir)),
                env=clean_env(),
                stderr=f,
            )
        wait_for(lambda: b"waiting for lock c" in err.read_bytes(), 20, "the waiting line")
        (marks / "h.go").touch()
        assert waiter.wait(30) == 0, err.read_text()
    finally:
        (marks / "h.go").touch()
        holder.wait(20)
