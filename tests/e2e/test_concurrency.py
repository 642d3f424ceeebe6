"""Mutual exclusion between real processes, proven by what the commands themselves log."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers import Procs, hold_until, run_cli, wait_for

needs_proc = pytest.mark.skipif(
    not os.path.isdir("/proc/self"), reason="reads the waiter's CPU time from /proc"
)


def _critical(log: Path, tag: str, seconds: float = 0.05) -> str:
    # Appends are atomic for short lines; the order of start/end lines is the evidence.
    return f"echo 'start {tag}' >> '{log}'; sleep {seconds}; echo 'end {tag}' >> '{log}'"


def _assert_strictly_paired(log: Path, count: int) -> None:
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * count, lines
    for i in range(0, len(lines), 2):
        start, end = lines[i].split(), lines[i + 1].split()
        assert start[0] == "start" and end[0] == "end" and start[1] == end[1], lines


def test_two_same_name_callers_never_overlap(procs: Procs, lock_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    a = procs.start(["same", _critical(log, "a", 0.5), str(lock_dir)])
    b = procs.start(["same", _critical(log, "b", 0.5), str(lock_dir)])
    assert a.wait(30) == 0 and b.wait(30) == 0
    _assert_strictly_paired(log, 2)


def test_twenty_concurrent_callers_are_strictly_paired(
    procs: Procs, lock_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    ps = [procs.start(["crowd", _critical(log, str(i)), str(lock_dir)]) for i in range(20)]
    assert [p.wait(60) for p in ps] == [0] * 20
    _assert_strictly_paired(log, 20)


def test_different_names_run_in_parallel(procs: Procs, lock_dir: Path, marks: Path) -> None:
    a = procs.start(["alpha", hold_until(marks, "a"), str(lock_dir)])
    wait_for(marks / "a.held")
    r = run_cli(["beta", "echo ran", str(lock_dir)], timeout=20)
    assert r.returncode == 0 and r.stdout == b"ran\n"
    assert a.poll() is None  # alpha is still holding its own lock
    (marks / "a.go").touch()
    assert a.wait(20) == 0


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@needs_proc
def test_blocked_waiter_sleeps_in_the_kernel(procs: Procs, lock_dir: Path, marks: Path) -> None:
    holder = procs.start(["cpu", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiter = procs.start(["cpu", "true", str(lock_dir)], env={"LOCAL_MUTEX_PROGRESS_SECONDS": "1"})
    procs.wait_stderr(waiter, "waiting for lock cpu")
    before = _cpu_seconds(waiter.pid)
    time.sleep(2.5)
    used = _cpu_seconds(waiter.pid) - before
    assert waiter.poll() is None
    assert used < 0.5, f"waiter burned {used:.2f}s CPU while blocked"
    (marks / "h.go").touch()
    assert holder.wait(20) == 0 and waiter.wait(20) == 0


def test_quiet_waiters_print_no_progress(procs: Procs, lock_dir: Path, marks: Path) -> None:
    """``-q`` prints only errors and warnings: a long wait's ``still waiting`` lines are
    neither (the loud waiter beside it shows they were due)."""
    holder = procs.start(["cpu", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    every = {"LOCAL_MUTEX_PROGRESS_SECONDS": "0.5"}
    quiet = procs.start(["-q", "cpu", "true", str(lock_dir)], env=every)
    loud = procs.start(["cpu", "true", str(lock_dir)], env=every)
    procs.wait_stderr(loud, "still waiting for lock cpu")
    procs.wait_stderr(loud, "still waiting for lock cpu after 1.")
    (marks / "h.go").touch()
    assert holder.wait(20) == 0 and quiet.wait(20) == 0 and loud.wait(20) == 0
    assert procs.stderr(quiet) == ""


def test_blocked_waiter_sleeps_without_proc(procs: Procs, lock_dir: Path, marks: Path) -> None:
    """The same on the path a system without /proc takes (LOCAL_MUTEX_NO_PROC=1, as on
    macOS), measured portably: the waiter's whole CPU time, from wait4 once it is done."""
    no_proc = {"LOCAL_MUTEX_NO_PROC": "1"}
    holder = procs.start(["cpu", hold_until(marks), str(lock_dir)], env=no_proc)
    wait_for(marks / "h.held")
    waiter = procs.start(
        ["cpu", "true", str(lock_dir)], env={**no_proc, "LOCAL_MUTEX_PROGRESS_SECONDS": "1"}
    )
    procs.wait_stderr(waiter, "waiting for lock cpu")
    time.sleep(2.5)
    assert waiter.poll() is None
    (marks / "h.go").touch()
    assert holder.wait(20) == 0
    _, status, usage = os.wait4(waiter.pid, 0)
    waiter.returncode = os.waitstatus_to_exitcode(status)
    assert waiter.returncode == 0, procs.stderr(waiter)
    used = usage.ru_utime + usage.ru_stime  # start-up included: a loose ceiling
    assert used < 1.5, f"waiter used {used:.2f}s CPU in all, most of it blocked"
    assert "acquired lock cpu" in procs.stderr(waiter)


def test_waiting_line_names_the_holder(procs: Procs, lock_dir: Path, marks: Path) -> None:
    holder = procs.start(["busy", hold_until(marks), str(lock_dir)], cwd=marks)
    wait_for(marks / "h.held")
    waiter = procs.start(["busy", "true", str(lock_dir)])
    procs.wait_stderr(waiter, "waiting for lock busy")
    line = next(x for x in procs.stderr(waiter).splitlines() if "waiting for lock busy" in x)
    assert f"held by pid {holder.pid} (" in line
    assert "touch" in line and f"in {marks}" in line and "since " in line
    (marks / "h.go").touch()
    assert waiter.wait(20) == 0
    assert "acquired lock busy" in procs.stderr(waiter)


@pytest.mark.parametrize(("value", "lines"), [("0.00001", (1, 3)), ("inf", (0, 0))])
def test_a_tiny_progress_interval_is_raised_to_half_a_second_and_a_huge_one_taken(
    procs: Procs, lock_dir: Path, marks: Path, value: str, lines: tuple[int, int]
) -> None:
    """Each line reads /proc/locks: 0.00001 s printed thousands of lines a second. ``inf``
    asks for none, without a word."""
    holder = procs.start(["tiny", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    r = run_cli(
        ["--wait", "1.2", "tiny", "true", str(lock_dir)],
        env={"LOCAL_MUTEX_PROGRESS_SECONDS": value},
    )
    assert r.returncode == 75
    low, high = lines
    assert low <= r.stderr.count(b"still waiting for lock tiny") <= high, r.stderr[-2000:]
    assert b"SECONDS" not in r.stderr
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


@pytest.mark.parametrize("value", ["junk", "0", "-5", "nan"])
def test_a_progress_interval_that_is_no_number_above_zero_is_said(
    lock_dir: Path, value: str
) -> None:
    env = {"LOCAL_MUTEX_PROGRESS_SECONDS": value}
    said = [
        f"local-mutex: $LOCAL_MUTEX_PROGRESS_SECONDS={value!r} is not a number of seconds "
        "above 0; ignored: a still-waiting line every 30s"
    ]
    r = run_cli(["-q", "p", "true", str(lock_dir)], env=env)
    assert (r.returncode, r.stderr.decode().splitlines()) == (0, said), r.stderr
    # Once a process: not once for each item.
    r = run_cli(
        ["-q", "each", "--lock-dir", str(lock_dir), "p-{}", "true"], env=env, input=b"a\nb\n"
    )
    assert (r.returncode, r.stderr.decode().splitlines()) == (0, said), r.stderr


def test_progress_line_repeats_while_waiting(procs: Procs, lock_dir: Path, marks: Path) -> None:
    holder = procs.start(["slow", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiter = procs.start(
        ["slow", "true", str(lock_dir)],
        env={"LOCAL_MUTEX_PROGRESS_SECONDS": "0.5", "GITHUB_ACTIONS": "true"},
    )
    wait_for(lambda: procs.stderr(waiter).count("still waiting for lock slow") >= 2)
    lines = [x for x in procs.stderr(waiter).splitlines() if "still waiting" in x]
    # A plain log line (never an annotation), with the wait, the queue place and the holder.
    assert lines[0].startswith("local-mutex: still waiting for lock slow after ")
    assert "position 1 of 1 in the queue" in lines[0]
    assert f"held by pid {holder.pid}" in lines[0]
    (marks / "h.go").touch()
    assert waiter.wait(20) == 0
