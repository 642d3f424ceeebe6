"""One stop signal ends a run whose output nobody reads, wherever its write blocked.

A parent that reads only our stdout (or nothing: a paused pager) leaves a pipe full; a
line already blocked before the stop came is retried after a handler that does not raise
(PEP 475), and a helper thread blocked there is one the main thread waits for. Each test
blocks one such write for real, then sends a single SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import (
    CLI,
    clean_env,
    fill_to_the_last_byte,
    hold_until,
    lock_file,
    lock_is_free,
    start_filling_stderr,
    wait_for,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads wchan")


def _a_thread_writes_to_a_pipe(pid: int) -> bool:
    """Does any thread of ``pid`` sleep in a pipe write (/proc/PID/task/*/wchan)?"""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            if "pipe_write" in Path(f"/proc/{pid}/task/{task}/wchan").read_text():
                return True
        except OSError:
            pass
    return False


def _ended(p: subprocess.Popen[bytes], timeout: float = 10) -> int | None:
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def test_a_still_waiting_line_blocked_on_stderr_does_not_hold_a_stopped_waiter(
    lock_dir: Path, marks: Path
) -> None:
    """The progress thread's line blocked on a full stderr; SIGTERM made the wait give up,
    and the main thread then waited for that thread for good."""
    holder = subprocess.Popen(
        [*CLI, "busy", hold_until(marks), str(lock_dir)],
        stderr=subprocess.DEVNULL,
        env=clean_env(),
    )
    read_end, write_end = os.pipe()
    try:
        wait_for(marks / "h.held")
        waiter = subprocess.Popen(
            [*CLI, "busy", f"touch '{marks}/ran'", str(lock_dir)],
            stderr=write_end,
            env=clean_env({"LOCAL_MUTEX_PROGRESS_SECONDS": "0.5"}),
        )
        os.set_blocking(read_end, False)
        seen = bytearray()

        def said_waiting() -> bool:
            try:
                seen.extend(os.read(read_end, 65536))
            except BlockingIOError:
                pass
            return b"waiting for lock busy" in seen

        try:
            wait_for(said_waiting, 30, "the waiting line")
            fill_to_the_last_byte(
                write_end
            )  # and read no more: the next "still waiting" line blocks
            wait_for(lambda: _a_thread_writes_to_a_pipe(waiter.pid), 30, "a blocked line")
            waiter.send_signal(signal.SIGTERM)
            assert _ended(waiter) == 128 + signal.SIGTERM
            assert not (marks / "ran").exists()
            assert not lock_is_free(lock_file(lock_dir, "busy"))  # the holder's, untouched
        finally:
            waiter.kill()
            waiter.wait()
    finally:
        (marks / "h.go").touch()
        assert holder.wait(30) == 0
        os.close(read_end)
        os.close(write_end)


def test_each_blocked_on_a_failed_items_line_ends_on_one_stop(lock_dir: Path, marks: Path) -> None:
    """``each --keep-going``: the line about a failed item blocked on a full stderr before
    the stop came; the batch's handler only notes a stop, so the write went on blocking.
    Stopped, the batch ends with that item's status (the stop came after it ended)."""
    read_end, write_end = os.pipe()
    fill_to_the_last_byte(write_end)
    ran = marks / "ran"
    command = f'echo "$LOCAL_MUTEX_ITEM" >> {ran}; exit 1'
    batch = subprocess.Popen(
        [*CLI, "each", "--lock-dir", str(lock_dir), "--keep-going", "k-{}", command],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=write_end,
        env=clean_env(),
    )
    os.close(write_end)
    try:
        assert batch.stdin is not None
        batch.stdin.write(b"a\nb\n")
        batch.stdin.flush()
        wait_for(lambda: _a_thread_writes_to_a_pipe(batch.pid), 30, "a blocked line")
        batch.send_signal(signal.SIGTERM)
        assert _ended(batch) == 1
        assert ran.read_text() == "a\n"  # stopped early: b never ran
        assert lock_is_free(lock_file(lock_dir, "k-a"))
    finally:
        batch.kill()
        batch.wait()
        os.close(read_end)


def test_a_keeper_blocked_on_a_warning_ends_with_its_command(lock_dir: Path, marks: Path) -> None:
    """The command filled the unread stderr; its lock file was deleted, and the keeper's
    warning that it put one back blocked. SIGTERM was passed on and ended the command, yet
    the keeper never got past the write -- and kept the lock."""
    run = start_filling_stderr(lock_dir, marks, "gone")
    try:
        wait_for(marks / "full", 30)
        path = lock_file(lock_dir, "gone")
        path.unlink()
        wait_for(lambda: _a_thread_writes_to_a_pipe(run.pid), 30, "the warning blocked")
        run.send_signal(signal.SIGTERM)
        assert _ended(run) == 128 + signal.SIGTERM
        wait_for(lambda: not path.exists() or lock_is_free(path), 20, "the lock let go")
    finally:
        run.kill()
        run.communicate()


def test_a_hold_blocked_printing_its_token_ends_the_hold_on_one_stop(lock_dir: Path) -> None:
    """stdout is a pipe nobody reads: the token cannot get out. SIGTERM must end the hold
    (nobody has its token) and the caller, not leave both waiting."""
    read_end, write_end = os.pipe()
    fill_to_the_last_byte(write_end)
    caller = subprocess.Popen(
        [*CLI, "hold", "--lock-dir", str(lock_dir), "tok"],
        stdout=write_end,
        stderr=subprocess.DEVNULL,
        env=clean_env(),
    )
    os.close(write_end)
    try:
        path = lock_file(lock_dir, "tok")
        wait_for(lambda: _a_thread_writes_to_a_pipe(caller.pid), 30, "the token blocked")
        assert not lock_is_free(path)
        caller.send_signal(signal.SIGTERM)
        assert _ended(caller) == 128 + signal.SIGTERM
        wait_for(lambda: lock_is_free(path), 20, "the hold ended")
    finally:
        caller.kill()
        caller.wait()
        os.close(read_end)
