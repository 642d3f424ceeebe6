"""Wait and run ceilings, fail-fast, and shared (reader) locks."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from helpers import Procs, hold_until, run_cli, run_program, wait_for


def test_wait_ceiling_expires_with_75_and_names_the_holder(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    holder = procs.start(["w", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    t0 = time.monotonic()
    r = run_cli(["--wait", "0.5", "w", f"touch '{marks}/ran'", str(lock_dir)])
    assert r.returncode == 75
    assert 0.4 < time.monotonic() - t0 < 15
    err = r.stderr.decode()
    assert "not acquired after waiting" in err and f"held by pid {holder.pid}" in err
    assert not (marks / "ran").exists()
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


def test_wait_ceiling_not_reached_runs_the_command(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    holder = procs.start(["w", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiter = procs.start(["run", "--wait", "60", "w", "echo ran", str(lock_dir)])
    procs.wait_stderr(waiter, "waiting for lock w")
    (marks / "h.go").touch()
    assert waiter.wait(30) == 0
    assert procs.stdout(waiter) == "ran\n"
    assert holder.wait(5) == 0


def test_no_wait_fails_fast_when_held_and_runs_when_free(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    r = run_cli(["--no-wait", "nw", "echo free", str(lock_dir)])
    assert r.returncode == 0 and r.stdout == b"free\n"
    holder = procs.start(["nw", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    r = run_cli(["--no-wait", "nw", f"touch '{marks}/ran'", str(lock_dir)])
    assert r.returncode == 75
    assert f"held by pid {holder.pid}" in r.stderr.decode()
    assert not (marks / "ran").exists()
    (marks / "h.go").touch()


def test_timeout_stops_with_sigterm_124(lock_dir: Path) -> None:
    r = run_cli(["--timeout", "0.5", "t", "sleep 30", str(lock_dir)])
    assert r.returncode == 124
    assert "ran past --timeout 0.5s; stopped it with SIGTERM" in r.stderr.decode()


def test_timeout_escalates_to_sigkill_137(lock_dir: Path) -> None:
    r = run_cli(
        [
            "--timeout",
            "0.5",
            "--kill-after",
            "0.5",
            "t",
            "trap '' TERM; while :; do sleep 0.1; done",
            str(lock_dir),
        ]
    )
    assert r.returncode == 137
    assert "SIGKILL" in r.stderr.decode()


@pytest.mark.parametrize("kill_after", ["0", "0.001"])
@pytest.mark.parametrize(
    ("command", "statuses"), [("sleep 30", {124, 137}), ("trap '' TERM; sleep 30", {137})]
)
def test_no_grace_at_all_still_ends_as_a_timeout(
    lock_dir: Path, kill_after: str, command: str, statuses: set[int]
) -> None:
    """--kill-after 0: the KILL is due as the TERM goes out, and its 1 ms timer fired in
    the middle of the supervisor's own alarm handler, which broke (exit 70). (A command
    that obeys TERM may or may not be gone before the KILL: 124 or 137.)"""
    r = run_cli(["--timeout", "0.3", "--kill-after", kill_after, "t", command, str(lock_dir)])
    assert r.returncode in statuses, r.stderr
    assert b"ran past --timeout 0.3s" in r.stderr and b"supervisor" not in r.stderr, r.stderr


def test_timeout_counts_a_descendant_that_left_the_group_and_needed_sigkill(
    lock_dir: Path, marks: Path
) -> None:
    """A descendant in a session of its own (``setsid``) that ignores SIGTERM is stopped
    only by SIGKILL: that is 137, as for a member of the command's group. It said 124,
    "stopped it with SIGTERM", because only the group was counted."""
    daemon = f"setsid sh -c 'trap \"\" TERM; echo $$ > {marks}/d.pid; sleep 30' </dev/null"
    r = run_cli(
        ["--timeout", "0.5", "--kill-after", "0.5", "t", f"{daemon} & sleep 30", str(lock_dir)]
    )
    assert r.returncode == 137, r.stderr
    assert "SIGKILL" in r.stderr.decode()
    assert not Path(f"/proc/{(marks / 'd.pid').read_text().strip()}").exists()


def test_timeout_does_not_count_queue_time(procs: Procs, lock_dir: Path, marks: Path) -> None:
    holder = procs.start(["q", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiter = procs.start(["--timeout", "1.5", "q", "sleep 0.2; echo done", str(lock_dir)])
    procs.wait_stderr(waiter, "waiting for lock q")
    time.sleep(2.0)  # queue time well past the run ceiling
    (marks / "h.go").touch()
    assert waiter.wait(30) == 0
    assert procs.stdout(waiter) == "done\n"
    assert holder.wait(5) == 0


def test_shared_holders_overlap_and_exclusive_waits_for_them(
    procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    # Each reader waits until the other one is inside too: only possible if they overlap.
    r1 = procs.start(
        [
            "--shared",
            "db",
            f"touch '{marks}/r1'; while [ ! -e '{marks}/r2' ]; do sleep 0.02; done; "
            f"{hold_until(marks, 'x')}; echo r1-end >> '{log}'",
            str(lock_dir),
        ]
    )
    r2 = procs.start(
        [
            "--shared",
            "db",
            f"touch '{marks}/r2'; while [ ! -e '{marks}/r1' ]; do sleep 0.02; done; "
            f"{hold_until(marks, 'x')}; echo r2-end >> '{log}'",
            str(lock_dir),
        ]
    )
    wait_for(marks / "r1")
    wait_for(marks / "r2")
    writer = procs.start(["db", f"echo writer >> '{log}'", str(lock_dir)])
    procs.wait_stderr(writer, "waiting for lock db")
    (marks / "x.go").touch()
    assert r1.wait(20) == 0 and r2.wait(20) == 0 and writer.wait(20) == 0
    assert log.read_text().splitlines()[-1] == "writer"


def test_a_reader_waits_for_a_writer(procs: Procs, lock_dir: Path, marks: Path) -> None:
    writer = procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    r = run_cli(["--shared", "--no-wait", "db", "true", str(lock_dir)])
    assert r.returncode == 75
    (marks / "h.go").touch()
    assert writer.wait(20) == 0


# Counts each SIGTERM it is given (blocked, taken one by one with sigtimedwait, so two that
# come a moment apart are two), for argv[2] seconds after the first, then writes the count.
COUNT_TERMS = """
import signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
count, until = 0, None
while until is None or time.monotonic() < until:
    left = 60.0 if until is None else until - time.monotonic()
    if signal.sigtimedwait({signal.SIGTERM}, max(left, 0.0)) is not None:
        count += 1
        until = until or time.monotonic() + float(sys.argv[2])
with open(sys.argv[1], "w") as f:
    f.write(str(count))
"""


def test_the_command_is_sent_each_stop_signal_once(lock_dir: Path, marks: Path) -> None:
    """The run ceiling's SIGTERM went to the command's group and then again to its top
    process (a child of the supervisor), and again to each member of the group the
    supervisor adopted once the top process ended: a program that takes a second TERM as
    "stop now, skip the cleanup" (as many do for a second Ctrl-C) lost its cleanup."""
    counts = []
    for n in range(3):  # the second TERM may come before the first was taken: look thrice
        top, background = marks / f"top{n}", marks / f"background{n}"
        count = f"{sys.executable} -c '{COUNT_TERMS}'"
        r = run_cli(
            [
                "--timeout", "0.5", "--kill-after", "5", "t",
                f"{count} {background} 1.5 & exec {count} {top} 0.5", str(lock_dir),
            ]
        )  # fmt: skip
        assert r.returncode == 124, r.stderr
        counts.append((top.read_text(), background.read_text()))
    assert counts == [("1", "1")] * 3


def test_what_a_term_trap_starts_in_the_background_is_sent_term_too(
    lock_dir: Path, marks: Path
) -> None:
    """A clean-up the command's TERM trap starts in the background joins the group after
    the group got TERM; it was left to the KILL at the end of the grace (exit 137, not
    124). It gets TERM once its parent has gone."""
    log = marks / "log"
    late, top = marks / "late.sh", marks / "top.sh"
    late.write_text(
        f"trap 'echo TERM >> {log}; exit 0' TERM; echo started >> {log}\n"
        "while :; do sleep 0.05; done\n"
    )
    top.write_text(f"trap 'sh {late} & sleep 0.3; exit 0' TERM\nwhile :; do sleep 0.05; done\n")
    cmd = f"exec sh {top}"
    started = time.monotonic()
    r = run_cli(["--timeout", "1", "--kill-after", "8", "t", cmd, str(lock_dir)])
    assert r.returncode == 124, r.stderr
    assert log.read_text().split() == ["started", "TERM"]
    assert time.monotonic() - started < 7  # not the KILL 8 s after the TERM


# In the supervisor: the command's end is reaped, and the run ceiling's alarm comes before
# the supervisor's next step (a busy machine, between two bytecodes).
ALARM_RIGHT_AFTER_THE_REAP = """
import os, time
real = os.waitpid
def waitpid(pid, options):
    got = real(pid, options)
    if pid == -1 and options == 0 and got[0] > 0:  # the supervisor's wait for its command
        time.sleep(1.5)  # the --timeout alarm comes, and its handler runs, in here
    return got
os.waitpid = waitpid
"""


def test_a_command_that_ended_before_the_ceiling_is_no_timeout(
    lock_dir: Path, tmp_path: Path
) -> None:
    """It ended, was reaped, and then the alarm of --timeout was handled: the run said it
    ran past --timeout and exited 124 for a command that had ended in time with 0."""
    (tmp_path / "sitecustomize.py").write_text(ALARM_RIGHT_AFTER_THE_REAP)
    src = Path(__file__).resolve().parents[2] / "src"
    r = run_cli(
        ["--timeout", "1", "t", "exit 0", str(lock_dir)],  # ends well inside, even if busy
        env={"PYTHONPATH": f"{tmp_path}:{src}"},
    )
    assert r.returncode == 0, r.stderr
    assert b"ran past" not in r.stderr


ARMING_SLOWLY = """
import sys, time
import local_mutex as lm
from local_mutex.backends.flock import kernel

ARMING = kernel._AlarmIn.__enter__.__code__

def slowly(frame, event, arg):
    # A machine too busy to get from one line to the next within the ceiling: each line
    # of the arming takes 5 ms, past the 1 ms the alarm is set for.
    if frame.f_code is not ARMING:
        return None
    if event == "line":
        time.sleep(0.005)
    return slowly

sys.settrace(slowly)
try:
    with lm.hold("db", lock_dir=sys.argv[1], wait=0.001):
        print("acquired")
except lm.NotAcquired:
    print("not acquired")
"""


@pytest.mark.timeout(90)
def test_a_ceiling_whose_alarm_fires_while_it_is_being_armed_is_kept(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """The alarm came before the wait marked itself armed: its handler let it pass, and the
    wait ignored its ceiling until the lock came free (here 60 s later)."""
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    host = run_program(ARMING_SLOWLY, str(lock_dir), timeout=30)
    assert host.stdout == "not acquired\n", host.stderr
