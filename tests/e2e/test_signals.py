"""Signals to the supervisor: the command's group goes first, then the lock."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import (
    CLI,
    FILL_STDERR,
    Procs,
    clean_env,
    full_pipe,
    hold_until,
    lock_file,
    lock_is_free,
    read_pid,
    run_cli,
    sleeps_in,
    start_filling_stderr,
    wait_for,
)
from helpers import procwatch as pw


def test_sigkill_to_the_keeper_stops_the_command_before_the_lock_frees(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """Version 1 freed the lock the instant its process was SIGKILLed, while the command
    ran on unprotected. Now the supervisor stops the command first, then lets go."""
    cmd = f"echo $$ > '{marks}/cmd.pid'; " + hold_until(marks)
    holder = procs.start(["k", cmd, str(lock_dir)])
    wait_for(marks / "h.held")
    command = int((marks / "cmd.pid").read_text())
    path = lock_file(lock_dir, "k")
    assert not lock_is_free(path)
    holder.send_signal(signal.SIGKILL)
    holder.wait(5)
    wait_for(lambda: lock_is_free(path), 20)
    assert not _alive(command), "the lock was free while the command still ran"


def test_a_report_that_cannot_be_written_does_not_make_the_wrapper_deaf(
    lock_dir: Path, marks: Path
) -> None:
    """The command filled the stderr pipe nobody reads (a paused pager): the lock is let go,
    the wrapper blocks writing its last line -- and a SIGTERM still ends it."""
    script = marks / "fill.py"
    script.write_text(FILL_STDERR)
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "local_mutex", "full", f"{sys.executable} {script}", str(lock_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # never read until the end
    )
    try:
        path = lock_file(lock_dir, "full")
        # Blocked writing: a free lock alone is no sign (a new lock file is free for an
        # instant before its first taker locks it, and the last line may not be under way).
        wait_for(lambda: sleeps_in(wrapper.pid, "pipe_write") and wrapper.poll() is None, 30)
        assert lock_is_free(path)
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(20) == -signal.SIGTERM
    finally:
        wrapper.kill()
        wrapper.communicate()


def test_a_stop_signal_dropped_at_release_still_spares_a_report_nobody_reads(
    lock_dir: Path, tmp_path: Path, marks: Path
) -> None:
    """A SIGTERM that came as the lock was let go is dropped (the status stays the
    command's), yet it was a request to stop: the last line, to a stderr pipe the command
    filled and nobody reads, must not keep the wrapper waiting for good."""
    script = marks / "fill.py"
    script.write_text(FILL_STDERR)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(AT_RELEASE)
    src = Path(__file__).resolve().parents[2] / "src"
    env = clean_env({"PYTHONPATH": f"{site}:{src}", "SIGNAL_AT_RELEASE": str(int(signal.SIGTERM))})
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "local_mutex", "full", f"{sys.executable} {script}", str(lock_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # never read until the end
        env=env,
    )
    try:
        assert wrapper.wait(30) == 0
        assert lock_is_free(lock_file(lock_dir, "full"))
    finally:
        wrapper.kill()
        wrapper.communicate()


def _start_unread(args: list[str]) -> subprocess.Popen[bytes]:
    """local-mutex with a stderr nobody reads: a pipe already full (a parent that reads
    only stdout, as ``subprocess.run(..., stderr=PIPE)`` without communicate())."""
    read_end, write_end = full_pipe()
    try:
        return subprocess.Popen(
            [*CLI, *args], stdout=subprocess.DEVNULL, stderr=write_end, env=clean_env()
        )
    finally:
        os.close(write_end)
        _unread.append(read_end)  # open until the test ends: a full pipe, not a broken one


_unread: list[int] = []


@pytest.fixture(autouse=True)
def _close_unread() -> Iterator[None]:
    yield
    while _unread:
        os.close(_unread.pop())


@pytest.mark.parametrize("contended", [True, False], ids=["waiting", "holding"])
def test_a_stop_signal_ends_a_run_blocked_on_a_stderr_nobody_reads(
    procs: Procs, lock_dir: Path, marks: Path, contended: bool
) -> None:
    """Its first line blocks (waiting for a busy lock, or holding a free one before the
    command): SIGTERM ends it, the command never runs, the lock is free. Its own line
    about the stop cannot be written either; it used to block there until a second
    signal."""
    if contended:
        procs.start(["full", hold_until(marks), str(lock_dir)])
        wait_for(marks / "h.held")
    run = _start_unread(["full", f"touch '{marks}/ran'", str(lock_dir)])
    path = lock_file(lock_dir, "full")
    wait_for(lambda: sleeps_in(run.pid, "pipe_write"), 20, "its first line blocks")
    if not contended:
        assert not lock_is_free(path)  # it holds the lock while blocked
    run.send_signal(signal.SIGTERM)
    assert run.wait(10) == 128 + signal.SIGTERM
    assert not (marks / "ran").exists()
    if not contended:
        assert lock_is_free(path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stop_ends_a_run_whose_command_filled_the_unread_stderr(
    lock_dir: Path, marks: Path, sig: signal.Signals
) -> None:
    """SIGTERM: the command is stopped and the lock let go; the "released" line cannot be
    written and is dropped, so the run ends with the command's status at once. SIGKILL
    (to the keeper): the supervisor's line saying it stopped the command blocked on the
    full pipe, and it held the lock until someone read the pipe -- for good, under a
    parent that never does."""
    run = start_filling_stderr(lock_dir, marks, "full")
    try:
        wait_for(marks / "full")
        run.send_signal(sig)
        assert run.wait(10) == (128 + sig if sig == signal.SIGTERM else -sig)
        wait_for(lambda: lock_is_free(lock_file(lock_dir, "full")), 20, "the lock let go")
    finally:
        run.kill()
        run.communicate()


# Run as PID 1 of a PID namespace of its own, where the next pid can be chosen: the
# supervisor is SIGKILLed and reaped, its pid goes to an unrelated process, and the keeper
# (stopping the command itself) is sent a stop signal to relay.
SUPERVISOR_PID_REUSED = """
import json, os, signal, subprocess, sys, time
cli, lock_dir, marks = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
err = open(f"{marks}/keeper.err", "wb")
cmd = f"touch {marks}/started; trap '' TERM; exec sleep 60"
keeper = subprocess.Popen([*cli, "--kill-after", "30", "ru", cmd, lock_dir], stderr=err)
def wait(what):
    deadline = time.monotonic() + 20
    while not what():
        assert time.monotonic() < deadline, open(f"{marks}/keeper.err").read()
        time.sleep(0.02)
wait(lambda: os.path.exists(f"{marks}/started"))
with open(f"/proc/{keeper.pid}/task/{keeper.pid}/children") as f:
    supervisor = int(f.read().split()[0])
os.kill(supervisor, signal.SIGKILL)
wait(lambda: b"stopping the command before" in open(f"{marks}/keeper.err", "rb").read())
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(supervisor - 1))
victim = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda *a: open(sys.argv[1], 'w').close())\\n"
    "open(sys.argv[2], 'w').close(); time.sleep(5)", f"{marks}/hit", f"{marks}/ready"])
if victim.pid != supervisor:
    print("pid not reused")
    sys.exit(0)
wait(lambda: os.path.exists(f"{marks}/ready"))
keeper.send_signal(signal.SIGTERM)
time.sleep(0.5)
print("hit" if os.path.exists(f"{marks}/hit") else "missed")
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_the_keeper_never_signals_its_dead_supervisors_pid_again(
    lock_dir: Path, marks: Path
) -> None:
    """Its supervisor killed and reaped, the keeper stops the command itself; a stop
    signal meanwhile went on to the supervisor's pid -- by then perhaps another process."""
    script = marks / "reuse.py"
    script.write_text(SUPERVISOR_PID_REUSED)
    namespace = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    if subprocess.run([*namespace, "true"], capture_output=True).returncode != 0:
        pytest.skip("no PID namespace may be made here")
    r = subprocess.run(
        [*namespace, sys.executable, str(script), json.dumps(CLI), str(lock_dir), str(marks)],
        env=clean_env(),
        capture_output=True,
        timeout=60,
    )
    assert r.stdout == b"missed\n", (r.stdout, r.stderr)


# Logs each SIGINT and SIGTERM it is given (blocked, taken one by one, so two that come a
# moment apart are two) and never ends by itself: SIGKILL ends it.
LOG_SIGNALS = """
import os, signal, sys
if sys.argv[3:] == ["setsid"]:
    os.setsid()  # a daemon: it never hears what is relayed to the group
wanted = {signal.SIGINT, signal.SIGTERM}
signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
open(sys.argv[2], "w").close()
with open(sys.argv[1], "a") as log:
    while True:
        log.write(f"{signal.sigwaitinfo(wanted).si_signo}\\n")
        log.flush()
"""


def _signals_logged(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_a_group_sent_sigterm_is_not_sent_it_again(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """SIGTERM relayed to the group; its top process ended: "stop what is left" sent the
    group TERM again, and the escalation 4 s after the signal a third time (a second
    TERM is "stop now, skip the cleanup" to many programs); a daemon that left the group
    got TERM when the top process ended and again at the escalation, as did a clean-up
    the trap started. What is left gets KILL after the grace."""
    member, daemon, helper = marks / "member", marks / "daemon", marks / "helper"
    logger = marks / "log_signals.py"
    logger.write_text(LOG_SIGNALS)
    log = f"{sys.executable} {logger}"
    cmd = (
        f"{log} {member} {member}.ready & {log} {daemon} {daemon}.ready setsid & "
        f"trap '{log} {helper} {helper}.ready & "
        f"while [ ! -e {helper}.ready ]; do sleep 0.01; done; exit 0' TERM; "
        "while :; do sleep 0.05; done"
    )
    run = procs.start(["--kill-after", "4.5", "--lock-dir", str(lock_dir), "once", cmd])
    wait_for(marks / "member.ready")
    wait_for(marks / "daemon.ready")
    run.send_signal(signal.SIGTERM)
    assert run.wait(30) == 0, procs.stderr(run)  # its top process's status
    assert _signals_logged(member) == [str(signal.SIGTERM.value)]
    assert _signals_logged(daemon) == [str(signal.SIGTERM.value)]
    # Started by the trap after the group had TERM: sent it once adopted, and not again.
    assert _signals_logged(helper) == [str(signal.SIGTERM.value)]


def test_the_escalation_sends_sigterm_to_what_started_after_the_group_had_it(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """After a relayed SIGTERM the top process's trap starts a clean-up and waits for it:
    the 4 s escalation's TERM reaches that clean-up (it never had one) before the KILL."""
    late, logger = marks / "late", marks / "log_signals.py"
    logger.write_text(LOG_SIGNALS)
    cmd = (
        f"trap '{sys.executable} {logger} {late} {late}.ready & wait' TERM; "
        f"touch {marks}/ready; while :; do sleep 0.05; done"
    )
    run = procs.start(["--kill-after", "4.2", "--lock-dir", str(lock_dir), "late", cmd])
    wait_for(marks / "ready")
    run.send_signal(signal.SIGTERM)
    wait_for(marks / "late.ready")
    assert run.wait(30) == 128 + signal.SIGKILL, procs.stderr(run)
    assert _signals_logged(late) == [str(signal.SIGTERM.value)]


def test_sigterm_after_sigint_brings_the_kill_after_grace_forward(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """--kill-after counts from the first SIGTERM: one relayed after a SIGINT still left
    the KILL where the INT had put it (4 s + the grace after the INT)."""
    log = marks / "log"
    cmd = f"exec {sys.executable} -c '{LOG_SIGNALS}' {log} {marks}/ready"
    run = procs.start(["--kill-after", "0.5", "--lock-dir", str(lock_dir), "soon", cmd])
    wait_for(marks / "ready")
    run.send_signal(signal.SIGINT)
    wait_for(lambda: _signals_logged(log) == [str(signal.SIGINT.value)])
    termed = time.monotonic()
    run.send_signal(signal.SIGTERM)
    assert run.wait(30) == 128 + signal.SIGKILL, procs.stderr(run)
    assert time.monotonic() - termed < 3.0  # 0.5 s, and room for a busy machine
    assert _signals_logged(log) == [str(signal.SIGINT.value), str(signal.SIGTERM.value)]


def test_a_script_killed_under_the_shell_has_the_rest_stopped_before_the_release(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """`local-mutex NAME 'bash job.sh'`: dash does not exec the last command, so the top
    process is sh, and the OOM killer's SIGKILL to the script reached sh as an exit
    status of 137 -- a "normal" exit, and the script's background child ran on after the
    lock was free. A status of 128+N, how shells report a command killed by signal N,
    now counts as a death from that signal."""
    job = marks / "job.sh"
    job.write_text(f"sleep 300 & echo $! > '{marks}/bg.pid'; echo $$ > '{marks}/job.pid'; wait\n")
    run = procs.start(["oom", f"bash '{job}'; exit $?", str(lock_dir)])
    os.kill(read_pid(marks / "job.pid"), signal.SIGKILL)
    assert run.wait(20) == 128 + signal.SIGKILL, procs.stderr(run)
    assert not _alive(read_pid(marks / "bg.pid")), "it ran on after the release"
    assert lock_is_free(lock_file(lock_dir, "oom"))


def test_a_program_that_exits_128_plus_n_is_no_shell_reporting_a_kill(
    lock_dir: Path, marks: Path
) -> None:
    """Only a shell's 128+N reports a killed command: another program's is a status of its
    own, a normal exit, and what it left in the background runs on (unlocked)."""
    program = (
        "import subprocess, sys; "
        "p = subprocess.Popen(['sleep', '30'], stdout=-3, stderr=-3); "  # DEVNULL
        f"open('{marks}/bg.pid', 'w').write(str(p.pid)); "
        "sys.exit(130)"
    )
    r = run_cli(["--lock-dir", str(lock_dir), "own", "--", sys.executable, "-c", program])
    assert r.returncode == 130, r.stderr
    bg = read_pid(marks / "bg.pid")
    try:
        assert _alive(bg)
    finally:
        os.kill(bg, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_stops_the_group_before_the_lock_frees(
    procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    log = tmp_path / "log"
    # The command starts a background member of its group, then cleans up slowly on a signal.
    cmd = (
        f"sleep 300 & echo $! > '{marks}/bg.pid'; "
        f"trap 'sleep 0.5; echo cleanup >> \"{log}\"; exit 9' INT TERM HUP; "
        f"echo start >> '{log}'; touch '{marks}/ready'; wait"
    )
    holder = procs.start(["sig", cmd, str(lock_dir)])
    wait_for(marks / "ready")
    nxt = procs.start(
        [
            "sig",
            f'echo next >> "{log}"; kill -0 "$(cat {marks}/bg.pid)" '
            f'2>/dev/null && echo bg-alive >> "{log}"; true',
            str(lock_dir),
        ]
    )
    procs.wait_stderr(nxt, "waiting for lock sig")
    holder.send_signal(sig)
    assert holder.wait(15) == 9
    assert nxt.wait(15) == 0
    assert log.read_text().splitlines() == ["start", "cleanup", "next"]


def test_command_ignoring_signals_is_killed_within_ten_seconds(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    cmd = f"trap '' INT TERM HUP; touch '{marks}/ready'; while :; do sleep 0.1; done"
    holder = procs.start(["stubborn", cmd, str(lock_dir)])
    wait_for(marks / "ready")
    t0 = time.monotonic()
    holder.send_signal(signal.SIGINT)
    status = holder.wait(15)
    elapsed = time.monotonic() - t0
    assert elapsed < 10.0, elapsed
    assert status == 137
    assert lock_is_free(lock_file(lock_dir, "stubborn"))


@pytest.mark.parametrize(
    ("sig", "after", "before"), [(signal.SIGTERM, 1.0, 3.5), (signal.SIGINT, 5.0, 6.5)]
)
def test_kill_after_bounds_the_grace_after_a_relayed_signal(
    procs: Procs, lock_dir: Path, marks: Path, sig: signal.Signals, after: float, before: float
) -> None:
    """--kill-after 1: SIGKILL a second after the first SIGTERM the command gets (at once
    for a relayed SIGTERM, 4 s after a SIGINT). It came at the fixed 7 s whatever it said."""
    cmd = f"trap '' INT TERM HUP; touch '{marks}/ready'; while :; do sleep 0.1; done"
    holder = procs.start(["--kill-after", "1", "deaf", cmd, str(lock_dir)])
    wait_for(marks / "ready")
    t0 = time.monotonic()
    holder.send_signal(sig)
    assert holder.wait(15) == 137
    elapsed = time.monotonic() - t0
    assert after <= elapsed < before, elapsed


def test_a_waiter_signalled_before_running_does_not_run(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    holder = procs.start(["w", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiter = procs.start(["w", f"touch '{marks}/ran'", str(lock_dir)])
    procs.wait_stderr(waiter, "waiting for lock w")
    waiter.send_signal(signal.SIGTERM)
    assert waiter.wait(10) == 143
    assert "did not run" in procs.stderr(waiter)
    (marks / "h.go").touch()
    assert holder.wait(10) == 0
    assert not (marks / "ran").exists()


def _ignoring(traps: str, lock_dir: Path, command: str) -> subprocess.CompletedProcess[bytes]:
    """A run of ``command`` from a caller that ignores ``traps`` (``trap '' ...``)."""
    script = f"trap '' {traps}; exec \"$PY\" -m local_mutex -q n '{command}' '{lock_dir}'"
    return subprocess.run(
        ["sh", "-c", script],
        env={**os.environ, "PY": sys.executable},
        capture_output=True,
        timeout=20,
    )


def test_ignored_sigint_stays_ignored_for_the_command(lock_dir: Path) -> None:
    # As after `nohup` or `cmd &` in a script: the caller ignores SIGINT; so must the command.
    r = _ignoring("INT", lock_dir, "kill -INT $$; echo alive")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"alive\n"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads SigIgn from /proc")
def test_which_ignored_signals_the_command_keeps_ignoring(lock_dir: Path) -> None:
    """As the README says: all the caller ignored, but SIGPIPE and SIGXFSZ (the interpreter
    took them over) and SIGALRM and SIGUSR1 (local-mutex's own): those at their defaults."""
    kept = [signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR2]
    reset = [signal.SIGPIPE, signal.SIGXFSZ, signal.SIGALRM, signal.SIGUSR1]
    traps = " ".join(str(int(s)) for s in kept + reset)
    r = _ignoring(traps, lock_dir, "grep SigIgn: /proc/$$/status")
    assert r.returncode == 0, r.stderr
    ignored = int(r.stdout.split()[1], 16)
    assert [s.name for s in kept if not ignored & (1 << (s - 1))] == []
    assert [s.name for s in reset if ignored & (1 << (s - 1))] == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_command_is_continued_to_act_on_the_signal(
    procs: Procs, lock_dir: Path, marks: Path, sig: signal.Signals
) -> None:
    """The command's group was stopped (SIGSTOP, Ctrl-Z) when the caller was told to stop:
    it is continued along with the signal (as timeout(1) does), so its trap runs. It used
    to stay stopped until the grace ran out and SIGKILL ended it (exit 137, no cleanup)."""
    cmd = (
        f"trap 'touch \"{marks}/cleaned\"; exit 5' INT TERM; "
        f"echo $$ > '{marks}/pid'; while :; do sleep 0.1; done"
    )
    holder = procs.start(["stopped", cmd, str(lock_dir)])
    group = read_pid(marks / "pid")
    os.killpg(group, signal.SIGSTOP)
    # Some process of the group stopped: the shell itself stays in D while a child it
    # vforked is stopped before its exec.
    wait_for(lambda: any(pw.pgid(p) == group and pw.state(p) == "T" for p in pw.all_pids()))
    holder.send_signal(sig)
    assert holder.wait(30) == 5
    assert (marks / "cleaned").exists()


def test_a_stop_signal_reaches_a_stopped_supervisor(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """A SIGSTOPped supervisor left SIGTERM to the keeper unanswered until somebody sent
    SIGCONT: the runner's cancel (SIGKILL 10 s after SIGINT) came first."""
    cmd = f"echo $$ > '{marks}/cmd.pid'; " + hold_until(marks)
    keeper = procs.start(["-q", "c", cmd, str(lock_dir)])
    wait_for(marks / "h.held")
    command = int((marks / "cmd.pid").read_text())
    supervisor = pw.ppid(command)
    assert supervisor is not None and supervisor > 1
    os.kill(supervisor, signal.SIGSTOP)
    keeper.send_signal(signal.SIGTERM)
    assert keeper.wait(15) == 128 + signal.SIGTERM, procs.stderr(keeper)
    assert not _alive(command)


# Sends SIGNUM to this very process when it unlocks a lock file (``fcntl.flock`` with
# LOCK_UN): the release after the command, the instant a late stop signal must not undo.
AT_RELEASE = """
import fcntl, os, sys
def _late(event, args, signum=int(os.environ["SIGNAL_AT_RELEASE"])):
    if event == "fcntl.flock" and args[1] & fcntl.LOCK_UN:
        os.kill(os.getpid(), signum)
sys.addaudithook(_late)
"""


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_after_the_command_ended_leaves_its_status(
    lock_dir: Path, tmp_path: Path, signum: int
) -> None:
    """The command ran and exited 42; a stop signal that came while the lock was being
    released (a second Ctrl-C, a storm of SIGHUPs) killed local-mutex with 128+N -- the
    status that says the command never ran -- before it printed the released line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(AT_RELEASE)
    src = Path(__file__).resolve().parents[2] / "src"
    env = clean_env({"PYTHONPATH": f"{site}:{src}", "SIGNAL_AT_RELEASE": str(int(signum))})
    r = subprocess.run(
        [sys.executable, "-m", "local_mutex", "late", "exit 42", str(lock_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 42, r.stderr
    assert "released late" in r.stderr and "exit 42" in r.stderr, r.stderr
    assert lock_is_free(lock_file(lock_dir, "late"))
