"""hold/release: a lock that spans commands, owned by a detached holder process."""

from __future__ import annotations

import fcntl
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import (
    CLI,
    Procs,
    clean_env,
    delete_until_put_back,
    full_pipe,
    hold_file,
    hold_until,
    left_behind_call,
    left_behind_call_waited,
    lock_file,
    lock_is_free,
    read_pid,
    read_written,
    run_cli,
    run_seen_over,
    sleeps_in,
    stopped,
    wait_for,
)
from helpers import procwatch as pw
from helpers.otheruser import as_other_user

JOB_A = {
    "GITHUB_RUN_ID": "100",
    "GITHUB_RUN_ATTEMPT": "1",
    "GITHUB_JOB": "build",
    "RUNNER_NAME": "runner-1",
}
JOB_B = {**JOB_A, "GITHUB_JOB": "deploy"}


def _status(name: str, lock_dir: Path) -> dict[str, Any]:
    r = run_cli(["status", name, "--lock-dir", str(lock_dir), "--json"])
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def _hold(name: str, lock_dir: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    r = run_cli(["hold", name, "--lock-dir", str(lock_dir), *extra], env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    token = r.stdout.decode().strip()
    assert len(token) == 32
    return token


def _inside(
    name: str,
    procs: Procs,
    lock_dir: Path,
    marks: Path,
    cleanup: list[str],
    command: str | None = None,
    started: str = "in.held",
) -> tuple[str, subprocess.Popen[bytes]]:
    """A hold of NAME and a `run --reentrant` inside it, its command (by default, one
    that holds until ``in.go``) past the marker ``started``."""
    cleanup.append(name)
    token = _hold(name, lock_dir)
    command = command or hold_until(marks, "in")
    run = procs.start(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), name, command],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    wait_for(marks / started)
    return token, run


def _inside_a_dead_hold(
    name: str, procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> tuple[str, subprocess.Popen[bytes]]:
    """A hold of NAME and a `run --reentrant` inside it (holding until ``in.go``), the
    holder then killed (and gone)."""
    cleanup.append(name)
    token = _hold(name, lock_dir)
    holder_pid = _status(name, lock_dir)["holders"][0]["pid"]
    run = procs.start(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), name, hold_until(marks, "in")],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    wait_for(marks / "in.held")
    os.kill(holder_pid, signal.SIGKILL)
    assert pw.wait_gone([holder_pid], 20) == []
    return token, run


def _free(name: str, lock_dir: Path) -> bool:
    return bool(_status(name, lock_dir)["state"] == "free")


@pytest.fixture
def cleanup(lock_dir: Path) -> Any:
    names: list[str] = []
    yield names
    for name in names:
        run_cli(["release", name, "--lock-dir", str(lock_dir), "--force"])


def test_hold_then_run_waits_until_release(
    procs: Procs, lock_dir: Path, tmp_path: Path, cleanup: list[str]
) -> None:
    cleanup.append("deploy")
    token = _hold("deploy", lock_dir, "--message", "migrating the db")
    st = _status("deploy", lock_dir)
    assert st["state"] == "held" and st["holders"][0]["message"] == "migrating the db"
    runner = procs.start(["deploy", f"touch '{tmp_path}/ran'", str(lock_dir)])
    procs.wait_stderr(runner, "waiting for lock deploy")
    assert "migrating the db" in procs.stderr(runner)
    assert not (tmp_path / "ran").exists()
    r = run_cli(["release", "deploy", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0 and b"released deploy" in r.stderr
    assert runner.wait(20) == 0 and (tmp_path / "ran").exists()


@pytest.mark.parametrize("what", ["message", "name", "command"])
def test_a_holder_record_too_long_to_read_is_cut_so_the_hold_can_be_released(
    procs: Procs, lock_dir: Path, tmp_path: Path, what: str, cleanup: list[str]
) -> None:
    """Readers read 64 KiB of a record, and JSON writes an emoji in 12 bytes: a record
    written whole made a hold nobody could release (it was "not a hold"), --force too."""
    long = "\U0001f600" * 8192  # the longest --message: 32 KB of text, 98 KB of JSON
    if what == "command":  # a run's: status still names its holder from the record
        script = f": '{long}'; touch {tmp_path}/in; sleep 60"
        runner = procs.start(["-q", "big", script, str(lock_dir)])
        wait_for((tmp_path / "in").exists, 20)
        holder = _status("big", lock_dir)["holders"][0]
        assert holder["source"] == "record" and holder["command"].startswith(": '\U0001f600")
        assert holder["command"].endswith("…") and len(holder["command"]) < len(long)
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(20) == 128 + signal.SIGTERM
        return
    name = long if what == "name" else "big"
    cleanup.append(name)  # should the release below fail
    token = _hold(name, lock_dir, *(["--message", long] if what == "message" else []))
    holder = _status(name, lock_dir)["holders"][0]
    assert holder["source"] == "record" and holder["command"] == "local-mutex hold"
    if what == "message":
        assert holder["message"].startswith("\U0001f600" * 100) and holder["message"][-1] == "…"
    r = run_cli(["release", name, "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0, r.stderr
    assert _free(name, lock_dir)
    if what == "message":  # longer: a hold's spec could not reach its holder (E2BIG, 125)
        for verb in ("hold", "run"):
            command = ["true"] if verb == "run" else []
            r = run_cli([verb, "--message", long + "x", "--lock-dir", str(lock_dir), "m", *command])
            assert r.returncode == 2, r.stderr
            assert r.stderr == b"local-mutex: --message is 8193 characters long; at most 8192\n"
        # With a long name as well, the holder's spec is longer than one environment
        # string may be (E2BIG: "cannot start the holder process", exit 125).
        r = run_cli(["hold", "\U0001f600" * 3000, "--message", long, "--lock-dir", str(lock_dir)])
        assert r.returncode == 2 and b"are too long together for a hold" in r.stderr, r.stderr


def test_second_hold_without_waiting_is_75(lock_dir: Path, cleanup: list[str]) -> None:
    cleanup.append("once")
    _hold("once", lock_dir)
    r = run_cli(["hold", "once", "--no-wait", "--lock-dir", str(lock_dir)])
    assert r.returncode == 75 and b"not acquired" in r.stderr


def test_release_is_for_this_job_or_its_token(lock_dir: Path, cleanup: list[str]) -> None:
    cleanup.append("j")
    token = _hold("j", lock_dir, env=JOB_A)
    r = run_cli(["release", "j", "--lock-dir", str(lock_dir)], env=JOB_B)
    assert r.returncode == 77 and b"belongs to another job" in r.stderr
    r = run_cli(["release", "j", "--lock-dir", str(lock_dir), "--token", "0" * 32])
    assert r.returncode == 77
    assert not _free("j", lock_dir)
    r = run_cli(["release", "j", "--lock-dir", str(lock_dir)], env=JOB_A)
    assert r.returncode == 0 and _free("j", lock_dir)
    _hold("j", lock_dir, env=JOB_A)
    r = run_cli(["release", "j", "--lock-dir", str(lock_dir), "--force"], env=JOB_B)
    assert r.returncode == 0 and _free("j", lock_dir)
    r = run_cli(["release", "j", "--lock-dir", str(lock_dir)])
    assert r.returncode == 0 and b"not held; nothing to release" in r.stderr
    _hold("j", lock_dir)
    r = run_cli(
        ["release", "j", "--lock-dir", str(lock_dir)], env={"LOCAL_MUTEX_HOLD_TOKEN": token}
    )
    assert r.returncode == 77  # an old token does not fit a new hold


def test_a_token_that_is_not_utf8_is_simply_not_the_holds(
    lock_dir: Path, cleanup: list[str]
) -> None:
    """A token from the environment or the command line may hold any bytes: it matches no
    hold (77; for a run inside one, it waits as a stranger), never a traceback."""
    cleanup.append("t8")
    _hold("t8", lock_dir)
    odd = "\udcff\udcfe"  # the bytes 0xff 0xfe, as Python carries them in a str
    where = ["--lock-dir", str(lock_dir)]
    r = run_cli(["release", "t8", *where], env={"LOCAL_MUTEX_HOLD_TOKEN": odd})
    assert r.returncode == 77 and b"belongs to another job" in r.stderr, r.stderr
    r = run_cli(["release", "t8", *where, "--token", "a" + odd])
    assert r.returncode == 77 and b"Traceback" not in r.stderr, r.stderr
    r = run_cli(
        ["--wait", "0.5", "--reentrant", *where, "t8", "echo ran"],
        env={"LOCAL_MUTEX_HOLD_TOKEN": odd},
    )
    assert r.returncode == 75 and r.stdout == b"" and b"Traceback" not in r.stderr, r.stderr
    assert not _free("t8", lock_dir)


def test_release_never_touches_a_running_command(procs: Procs, lock_dir: Path, marks: Path) -> None:
    runner = procs.start(["busy", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    r = run_cli(["release", "busy", "--lock-dir", str(lock_dir), "--force"])
    assert r.returncode == 77 and b"not a hold" in r.stderr
    assert runner.poll() is None
    (marks / "h.go").touch()
    assert runner.wait(20) == 0


def test_ttl_expiry_frees_it(lock_dir: Path) -> None:
    _hold("short", lock_dir, "--ttl", "1")
    assert not _free("short", lock_dir)
    wait_for(lambda: _free("short", lock_dir), 15)


def test_the_hold_notice_says_when_its_ttl_ends_it(lock_dir: Path) -> None:
    """A hold with --ttl says by when it lets go by itself; one without says no time."""
    import calendar
    import re

    before = time.time()
    r = run_cli(["hold", "ttl-said", "--lock-dir", str(lock_dir), "--ttl", "600"], timeout=30)
    after = time.time()
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    found = re.search(r"in detached pid \d+ until (\S+Z) at the latest \(--ttl\); release", err)
    assert found, err
    ends = calendar.timegm(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%SZ"))
    assert before + 600 - 1 <= ends <= after + 600 + 1, (found.group(1), before, after)
    r = run_cli(["hold", "no-ttl", "--lock-dir", str(lock_dir)], timeout=30)
    assert r.returncode == 0 and " until " not in r.stderr.decode(), r.stderr
    for name in ("ttl-said", "no-ttl"):
        assert run_cli(["release", name, "--lock-dir", str(lock_dir), "--force"]).returncode == 0


def test_sigkill_of_the_holder_frees_it(lock_dir: Path) -> None:
    _hold("k", lock_dir)
    pid = _status("k", lock_dir)["holders"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _free("k", lock_dir), 5)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc/*/environ")
def test_the_runners_end_of_job_cleanup_frees_it(lock_dir: Path) -> None:
    tracking = f"local-mutex-test-{os.getpid()}-{time.monotonic_ns()}"
    _hold("job-scoped", lock_dir, env={"RUNNER_TRACKING_ID": tracking})
    # What the runner does at the end of a job: kill every process carrying its id.
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"RUNNER_TRACKING_ID={tracking}".encode() in environ.split(b"\0"):
            os.kill(int(entry), signal.SIGKILL)
            killed.append(int(entry))
    assert len(killed) == 1
    wait_for(lambda: _free("job-scoped", lock_dir), 5)


def test_reentrant_inside_the_holding_job_only_when_asked(
    lock_dir: Path, cleanup: list[str]
) -> None:
    cleanup.append("r")
    token = _hold("r", lock_dir, env=JOB_A)
    r = run_cli(["run", "--reentrant", "r", "echo inside", str(lock_dir)], env=JOB_A)
    assert r.returncode == 0 and r.stdout == b"inside\n"
    assert b"already held by enclosing pid" in r.stderr
    r = run_cli(["run", "--no-wait", "r", "echo inside", str(lock_dir)], env=JOB_A)
    assert r.returncode == 75
    r = run_cli(["run", "--reentrant", "--no-wait", "r", "echo inside", str(lock_dir)], env=JOB_B)
    assert r.returncode == 75
    r = run_cli(
        ["run", "--reentrant", "r", "echo by-token", str(lock_dir)],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    assert r.returncode == 0 and r.stdout == b"by-token\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="holds share on Linux")
def test_the_nested_calls_of_a_reentrant_run_are_inside_the_hold_too(
    lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """A `run --reentrant` shares its job's hold; its command's own calls of the name (a
    Makefile calling "$LOCAL_MUTEX_CLI") ran inside it only when given --reentrant too, and
    otherwise waited for the hold -- the enclosing run -- forever."""
    cleanup.append("nest")
    _hold("nest", lock_dir, env=JOB_A)
    cli = '"$LOCAL_MUTEX_CLI" --no-wait nest'
    inner = f"{cli} 'touch {marks}/inner'"
    deeper = f"{cli} \"$LOCAL_MUTEX_CLI --no-wait nest 'touch {marks}/deeper'\""
    r = run_cli(["run", "--reentrant", "nest", f"{inner} && {deeper}", str(lock_dir)], env=JOB_A)
    assert r.returncode == 0, r.stderr
    assert (marks / "inner").exists() and (marks / "deeper").exists()
    # Outside the run, the hold is what it was: the same job's plain call still waits.
    r = run_cli(["run", "--no-wait", "nest", f"touch {marks}/outside", str(lock_dir)], env=JOB_A)
    assert r.returncode == 75 and not (marks / "outside").exists()


def test_hold_bad_input(lock_dir: Path) -> None:
    for args, needle in [
        (["hold", ""], b"lock name is empty"),
        (["hold", "x", "--ttl", "0"], b"more than 0"),
        (["hold", "x", "--lock-dir", "rel"], b"must be an absolute path"),
        (["release", "x", "--lock-dir", "rel"], b"must be an absolute path"),
    ]:
        r = run_cli(args if "--lock-dir" in args else [*args, "--lock-dir", str(lock_dir)])
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr
    assert not lock_file(lock_dir, "x").exists() or _free("x", lock_dir)


@pytest.mark.parametrize("closed", ["<&-", "2>&-", "<&- 2>&-"])
def test_hold_with_closed_stdin_or_stderr_returns_holding(
    lock_dir: Path, cleanup: list[str], closed: str
) -> None:
    """`local-mutex hold NAME <&-` used to hang, and `2>&-` to fail with a traceback
    after taking the lock; now each returns 0 with the lock held and the token printed."""
    cleanup.append("closed")
    cli = " ".join(shlex.quote(a) for a in [*CLI, "hold", "closed", "--lock-dir", str(lock_dir)])
    r = subprocess.run(
        ["sh", "-c", f"{cli} {closed}"], env=clean_env(), stdout=subprocess.PIPE, timeout=30
    )
    assert r.returncode == 0
    assert len(r.stdout.strip()) == 32
    assert _status("closed", lock_dir)["state"] == "held"


@pytest.mark.parametrize("closed", [">&-", "<&- >&-", "<&- >&- 2>&-"])
def test_hold_with_stdout_closed_is_refused_before_holding(
    lock_dir: Path, cleanup: list[str], closed: str
) -> None:
    """The token that ends a hold goes to stdout; with stdout closed nobody could read it,
    and the hold would last until a forced release. Nothing is held; `>/dev/null` is how
    to drop the token on purpose."""
    cleanup.append("closed")
    cli = " ".join(shlex.quote(a) for a in [*CLI, "hold", "closed", "--lock-dir", str(lock_dir)])
    r = subprocess.run(
        ["sh", "-c", f"{cli} {closed}"], env=clean_env(), stderr=subprocess.PIPE, timeout=30
    )
    assert r.returncode == 2
    if "2>&-" not in closed:
        assert b"standard output, which is closed; nothing was held" in r.stderr
    assert not lock_file(lock_dir, "closed").exists() or _free("closed", lock_dir)


def _broken_pipe() -> int:
    """A pipe whose reader is gone: writing to it fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


@pytest.mark.parametrize("where", ["/dev/full", "a closed pipe"])
@pytest.mark.parametrize("slots", [[], ["--slots", "2"]])
def test_hold_whose_token_cannot_be_printed_is_ended(
    lock_dir: Path, cleanup: list[str], where: str, slots: list[str]
) -> None:
    """A token lost on its way out (a full disk, a reader that went away) would leave a
    hold nobody can end without --force: the hold is ended with it and the status is 74."""
    cleanup.append("lost")
    stdout = _broken_pipe() if where == "a closed pipe" else os.open(where, os.O_WRONLY)
    try:
        r = subprocess.run(
            [*CLI, "hold", "lost", "--lock-dir", str(lock_dir), *slots],
            env=clean_env(),
            stdout=stdout,
            stderr=subprocess.PIPE,
            timeout=30,
        )
    finally:
        os.close(stdout)
    assert r.returncode == 74, r.stderr
    assert b"could not print the hold's token" in r.stderr
    assert b"ended the hold" in r.stderr
    listed = run_cli(["list", "--lock-dir", str(lock_dir), "--json"])
    assert json.loads(listed.stdout) == [], listed.stdout
    # The lock is free for the next taker at once.
    token = _hold("lost", lock_dir, *slots)
    run_cli(["release", "lost", "--lock-dir", str(lock_dir), "--token", token, *slots[:1]])


def test_release_returns_once_the_holder_let_go_though_a_waiter_took_the_lock(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """`release` waited for the lock to be free: a run queued behind the hold took it at
    once, so release sat out the whole 10 s grace, then sent SIGKILL to a pid that had
    already exited. It returns as soon as the holder is gone; the waiter holds on."""
    cleanup.append("queued")
    token = _hold("queued", lock_dir)
    holder_pid = _status("queued", lock_dir)["holders"][0]["pid"]
    waiter = procs.start(["queued", hold_until(marks), str(lock_dir)])
    procs.wait_stderr(waiter, "waiting for lock queued")
    r = run_cli(
        ["release", "queued", "--lock-dir", str(lock_dir), "--token", token], timeout=8
    )  # well inside the 10 s grace it used to sit out
    assert r.returncode == 0, r.stderr
    assert b"released queued" in r.stderr
    wait_for(marks / "h.held")
    st = _status("queued", lock_dir)
    assert st["state"] == "held" and st["holders"][0]["pid"] != holder_pid
    (marks / "h.go").touch()
    assert waiter.wait(30) == 0


# -- a run inside a hold keeps the lock when the hold ends under it --------------------------


def _kill_keeper_and_supervisor(run: subprocess.Popen[bytes]) -> None:
    """Both at once, as an OOM sweep: the run's command is left alone."""
    supervisor = pw.supervisor_child(run.pid)
    assert supervisor is not None
    pw.kill_together([run.pid, supervisor])
    assert pw.wait_gone([supervisor], 20) == []
    run.wait(20)


def _held_until_the_command_ends(name: str, lock_dir: Path, marks: Path) -> None:
    """A newcomer waits while the command (``hold_until(marks, "in")``) runs, and gets the
    lock once it ends."""
    _held_until_the_command_ends_at(name, lock_dir, marks, "in")


def _held_until_the_command_ends_at(name: str, lock_dir: Path, marks: Path, tag: str) -> None:
    r = run_cli(["--no-wait", name, f"touch '{marks}/newcomer'", str(lock_dir)])
    assert r.returncode == 75, r.stderr
    assert not (marks / "newcomer").exists()
    (marks / f"{tag}.go").touch()
    wait_for(lambda: run_cli(["--no-wait", name, "true", str(lock_dir)]).returncode == 0, 30)


def _release_then_kill_the_run(
    name: str, token: str, run: subprocess.Popen[bytes], lock_dir: Path, marks: Path
) -> None:
    """The hold released (handed over to the run inside), then the run's keeper and
    supervisor killed together: the lock stays held until the command ends."""
    r = run_cli(["release", name, "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0, r.stderr
    _kill_keeper_and_supervisor(run)
    _held_until_the_command_ends(name, lock_dir, marks)


def _hold_with_few_descriptors(name: str, lock_dir: Path, limit: int) -> str:
    """A hold whose holder may open ``limit`` descriptors at most: its token."""
    hold = [*CLI, "hold", name, "--lock-dir", str(lock_dir)]
    r = subprocess.run(
        ["sh", "-c", f'ulimit -n {limit} && exec "$@"', "sh", *hold],
        env=clean_env(),
        capture_output=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def _end_hold(how: str, name: str, lock_dir: Path, token: str, holder_pid: int) -> None:
    if how == "holder killed":
        os.kill(holder_pid, signal.SIGKILL)
    elif how == "release":
        r = run_cli(["release", name, "--lock-dir", str(lock_dir), "--token", token])
        assert r.returncode == 0, r.stderr
    # "ttl": it runs out by itself
    assert pw.wait_gone([holder_pid], 20) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
@pytest.mark.parametrize("how", ["holder killed", "release", "ttl"])
def test_a_run_inside_a_hold_keeps_the_lock_when_the_hold_ends_under_it(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str], how: str
) -> None:
    """`run --reentrant` inside a hold used to hold nothing: SIGKILL to the holder, a
    release or the TTL let the next holder in while the run's command still ran. The
    run shares the hold's lock now, and the lock is free once it ends."""
    cleanup.append("inside")
    token = _hold("inside", lock_dir, *(["--ttl", "3"] if how == "ttl" else []))  # busy: >1 s
    holder_pid = _status("inside", lock_dir)["holders"][0]["pid"]
    run = procs.start(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), "inside", hold_until(marks, "in")],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    wait_for(marks / "in.held")
    _end_hold(how, "inside", lock_dir, token, holder_pid)
    r = run_cli(["--no-wait", "inside", f"touch '{marks}/newcomer'", str(lock_dir)])
    assert r.returncode == 75, r.stderr
    assert not (marks / "newcomer").exists()
    (marks / "in.go").touch()
    assert run.wait(30) == 0, procs.stderr(run)
    r = run_cli(["--no-wait", "inside", f"touch '{marks}/newcomer'", str(lock_dir)])
    assert r.returncode == 0, r.stderr
    assert (marks / "newcomer").exists()


def _knocks(holder_pid: int) -> int:
    """Connections waiting in the hold's socket queue (Linux lists them under its name)."""
    name = f"@local-mutex-hold-{holder_pid}-"
    lines = Path("/proc/net/unix").read_text().splitlines()
    return sum(1 for line in lines if name in line) - 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_run_whose_hold_dies_before_it_shares_takes_the_lock_itself(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The holder killed while a `run --reentrant` waited for its answer: the run ran
    "inside" a hold that was gone, holding nothing, beside the next holder."""
    cleanup.append("died")
    token = _hold("died", lock_dir)
    holder_pid = _status("died", lock_dir)["holders"][0]["pid"]
    os.kill(holder_pid, signal.SIGSTOP)
    try:
        run = procs.start(
            ["run", "--reentrant", "--lock-dir", str(lock_dir), "died", hold_until(marks, "in")],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        )
        wait_for(lambda: _knocks(holder_pid) > 0, what="the run asking the holder")
    finally:
        os.kill(holder_pid, signal.SIGKILL)
    wait_for(marks / "in.held")
    r = run_cli(["--no-wait", "died", f"touch '{marks}/newcomer'", str(lock_dir)])
    assert r.returncode == 75, r.stderr
    assert not (marks / "newcomer").exists()
    (marks / "in.go").touch()
    assert run.wait(30) == 0, procs.stderr(run)
    assert "running inside" not in procs.stderr(run)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_run_whose_hold_does_not_share_is_refused(
    lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """A holder that never answers (stopped here): inside it the run would hold nothing
    of its own, and waiting for it would wait for its own hold. It is refused, saying why."""
    cleanup.append("mute")
    token = _hold("mute", lock_dir)
    holder_pid = _status("mute", lock_dir)["holders"][0]["pid"]
    with stopped(holder_pid):
        ran = f"touch '{marks}/ran'"
        r = run_cli(
            ["run", "--reentrant", "--lock-dir", str(lock_dir), "mute", ran],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
            timeout=60,
        )
    assert r.returncode == 2, r.stderr
    assert not (marks / "ran").exists()
    assert f"hold {holder_pid} of lock mute did not share its lock" in r.stderr.decode()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_file_the_holder_puts_back_is_shared_with_the_runs_inside(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The lock file deleted while a run was inside the hold: the holder put a file back
    that only it held, so releasing the hold freed it while the run's command still ran."""
    token, run = _inside("again", procs, lock_dir, marks, cleanup)
    path = lock_file(lock_dir, "again")
    delete_until_put_back(path)
    assert (
        run_cli(["release", "again", "--lock-dir", str(lock_dir), "--token", token]).returncode == 0
    )
    r = run_cli(["--no-wait", "again", f"touch '{marks}/newcomer'", str(lock_dir)])
    assert r.returncode == 75, r.stderr
    (marks / "in.go").touch()
    assert run.wait(30) == 0, procs.stderr(run)
    r = run_cli(["--no-wait", "again", f"touch '{marks}/newcomer'", str(lock_dir)])
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_hold_whose_file_was_put_back_many_times_still_shares_it(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The holder sent every description it had, one per file put back; past 16 the
    one that names the file at the path no longer fitted, and the run could not join."""
    cleanup.append("many")
    token = _hold("many", lock_dir)
    holder_pid = _status("many", lock_dir)["holders"][0]["pid"]
    path = lock_file(lock_dir, "many")
    for _ in range(18):
        delete_until_put_back(path)
    run = procs.start(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), "many", hold_until(marks, "in")],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    wait_for(marks / "in.held")
    os.kill(holder_pid, signal.SIGKILL)
    assert pw.wait_gone([holder_pid], 20) == []
    r = run_cli(["--no-wait", "many", f"touch '{marks}/newcomer'", str(lock_dir)])
    assert r.returncode == 75, r.stderr
    (marks / "in.go").touch()
    assert run.wait(30) == 0, procs.stderr(run)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_release_right_after_the_holder_shared_hands_the_lock_over(
    procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path, cleanup: list[str]
) -> None:
    """`release`'s SIGTERM reaching the holder just after it sent its lock to a run, before
    it counted the run as inside: the holder unlocked what the run now shared, and a
    newcomer ran beside it. The moment is widened by a pause after the send (in the
    holder only)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "if 'LOCAL_MUTEX_HOLD_SPEC' in os.environ:\n"
        "    import socket, time\n"
        "    _send = socket.send_fds\n"
        "    def send_fds(*args, **kwargs):\n"
        "        sent = _send(*args, **kwargs)\n"
        f"        open({str(marks / 'sent')!r}, 'w').close()\n"
        "        time.sleep(2)\n"
        "        return sent\n"
        "    socket.send_fds = send_fds\n"
    )
    cleanup.append("late")
    token = _hold("late", lock_dir, env={"PYTHONPATH": str(site)})
    run = procs.start(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), "late", hold_until(marks, "in")],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    wait_for(marks / "sent")
    r = run_cli(["release", "late", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0, r.stderr
    wait_for(marks / "in.held")
    r = run_cli(["--no-wait", "late", f"touch '{marks}/newcomer'", str(lock_dir)])
    assert r.returncode == 75, r.stderr
    (marks / "in.go").touch()
    assert run.wait(30) == 0, procs.stderr(run)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("setsid") is None,
    reason="abstract unix sockets, a child subreaper and setsid(1) are Linux's",
)
def test_a_run_inside_a_hold_stops_a_descendant_that_left_the_group_when_its_supervisor_dies(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The keeper of a run inside a hold was no subreaper: with its supervisor killed, a
    descendant in a session of its own went to PID 1, ran on and outlived the hold."""
    cmd = (
        f"setsid sh -c 'echo $$ > {marks}/escaped; exec sleep 60' >/dev/null 2>&1 & "
        f"while [ ! -s {marks}/escaped ]; do sleep 0.02; done; touch {marks}/top; sleep 60"
    )
    _, run = _inside("orphan", procs, lock_dir, marks, cleanup, cmd, "top")
    escaped = int((marks / "escaped").read_text())
    supervisor = pw.supervisor_child(run.pid)
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    try:
        assert run.wait(30) == 137, procs.stderr(run)
        assert pw.wait_gone([escaped], 10) == [], "a descendant outlived the run"
    finally:
        pw.signal_quietly([escaped])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_hold_ended_after_a_run_inside_lost_keeper_and_supervisor_keeps_the_lock(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The run's keeper and supervisor killed together (an OOM sweep), the hold released
    after: the holder saw no run inside and unlocked the description the command still
    shares, so a newcomer ran beside it. A run that did not say its command was over
    leaves the lock to that command."""
    token, run = _inside("swept", procs, lock_dir, marks, cleanup)
    _kill_keeper_and_supervisor(run)
    r = run_cli(["release", "swept", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0, r.stderr
    _held_until_the_command_ends("swept", lock_dir, marks)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_file_put_back_stays_held_after_the_release_when_the_run_inside_is_killed(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """A file put back under a hold, the hold released (handed over to the run inside),
    then the run's keeper and supervisor killed: the file put back was left to the
    descriptions queued on the run's connection, which went with them, and a newcomer
    took it while the command (holding the deleted file) ran. The hold's guardian keeps
    it until the command is gone."""
    token, run = _inside("swept", procs, lock_dir, marks, cleanup)
    delete_until_put_back(lock_file(lock_dir, "swept"))
    _release_then_kill_the_run("swept", token, run, lock_dir, marks)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_run_that_joined_after_a_put_back_keeps_that_file_through_the_next_one(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """A run joined after a first put-back (it shares the file put back), a second put-back
    followed, the hold was released, then the run's keeper and supervisor were killed: the
    guardian watched only the hold's first file, which nobody held any more, so it let the
    path's file go while the command (holding the first file put back) ran on."""
    cleanup.append("twice")
    token = _hold("twice", lock_dir)
    path = lock_file(lock_dir, "twice")
    delete_until_put_back(path)
    run = procs.start(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), "twice", hold_until(marks, "in")],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    wait_for(marks / "in.held")
    delete_until_put_back(path)
    _release_then_kill_the_run("twice", token, run, lock_dir, marks)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_tmp_cleaner_in_a_loop_does_not_run_a_hold_out_of_descriptors(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """With a run inside, the holder kept every file it put back (sent to the run, which
    never reads them): with 24 descriptors it could put no file back after a dozen
    deletions, and a newcomer created one and took it. Only what runs joined with stays."""
    cleanup.append("loop")
    token = _hold_with_few_descriptors("loop", lock_dir, 24)
    run = procs.start(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), "loop", hold_until(marks, "in")],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    wait_for(marks / "in.held")
    for _ in range(20):
        delete_until_put_back(lock_file(lock_dir, "loop"))
    _release_then_kill_the_run("loop", token, run, lock_dir, marks)


@pytest.mark.parametrize("released", [False, True], ids=["hold on", "hold released"])
def test_a_nested_call_after_a_put_back_runs_inside(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str], released: bool
) -> None:
    """A run inside a hold, then a file put back: the run's command holds the deleted
    file's lock, and the file at the path is held by the holder -- or, once the hold was
    released (handed over to the run), by its guardian until the command's lock ends. A
    nested call of the name in that command waited for them: for the guardian, which waited
    for the command, stuck until its --wait. It runs inside, found through the kernel."""
    cmd = (
        f"touch '{marks}/in.held'; while [ ! -e '{marks}/back' ]; do sleep 0.02; done; "
        f'"$LOCAL_MUTEX_CLI" --wait 10 handed "touch \'{marks}/inner\'"'
    )
    token, run = _inside("handed", procs, lock_dir, marks, cleanup, cmd)
    delete_until_put_back(lock_file(lock_dir, "handed"))
    if released:
        r = run_cli(["release", "handed", "--lock-dir", str(lock_dir), "--token", token])
        assert r.returncode == 0, r.stderr
    (marks / "back").touch()
    assert run.wait(30) == 0, procs.stderr(run)
    assert (marks / "inner").exists()
    assert "running inside it" in procs.stderr(run)


def test_a_release_just_after_a_tmp_cleaner_waits_for_the_put_back(
    lock_dir: Path, cleanup: list[str]
) -> None:
    """The lock file deleted, and `release` before the holder's next look put one back:
    it said there was no lock file here ("another lock dir?", exit 2), and the hold
    lived on. The holder is stopped here while the file is gone, so the release surely
    finds no file; it waits for the put-back and ends the hold."""
    cleanup.append("swift")
    token = _hold("swift", lock_dir)
    holder_pid = _status("swift", lock_dir)["holders"][0]["pid"]
    with stopped(holder_pid):
        lock_file(lock_dir, "swift").unlink()
        release = subprocess.Popen(
            [*CLI, "release", "swift", "--lock-dir", str(lock_dir), "--token", token],
            env=clean_env(),
            stderr=subprocess.PIPE,
        )
        time.sleep(0.3)  # the release looking meanwhile (a busy machine: it may look later)
    _, err = release.communicate(timeout=30)
    assert release.returncode == 0, err
    assert pw.wait_gone([holder_pid], 10) == []
    assert _free("swift", lock_dir)


def test_a_release_with_a_wrong_token_after_a_deletion_under_a_stopped_holder_says_so(
    lock_dir: Path, cleanup: list[str]
) -> None:
    """The hold's file deleted while its holder is stopped: a release with another token is
    told the hold is another's (77), not that there is no lock file here."""
    cleanup.append("solo")
    _hold("solo", lock_dir)
    holder_pid = _status("solo", lock_dir)["holders"][0]["pid"]
    with stopped(holder_pid):
        lock_file(lock_dir, "solo").unlink()
        r = run_cli(["release", "solo", "--lock-dir", str(lock_dir), "--token", "nope"])
    assert r.returncode == 77 and b"belongs to another job or token" in r.stderr, r.stderr


def test_a_reentrant_run_in_the_tick_after_a_deletion_joins_the_hold(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """A `run --reentrant` that came after a tmp cleaner and before the holder's next look
    created the new file, found no hold in it and took the lock alone; the holder, finding
    that file taken, ended the hold. It now lets the holder take the file, then joins. (The
    holder is stopped until the run created the file, so the run surely comes first.)"""
    cleanup.append("window")
    token = _hold("window", lock_dir)
    holder_pid = _status("window", lock_dir)["holders"][0]["pid"]
    path = lock_file(lock_dir, "window")
    with stopped(holder_pid):
        path.unlink()
        run = procs.start(
            ["run", "--reentrant", "--lock-dir", str(lock_dir), "window", hold_until(marks, "in")],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        )
        wait_for(path.exists, 20, "the run's new lock file")
    wait_for(marks / "in.held")
    time.sleep(0.3)  # the holder's looks meanwhile: one that found the file taken ended it
    assert pw.alive(holder_pid), "the hold ended"
    (marks / "in.go").touch()
    assert run.wait(30) == 0, procs.stderr(run)
    assert "running inside it" in procs.stderr(run)
    r = run_cli(["release", "window", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0, r.stderr
    assert _free("window", lock_dir)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="a zombie is told by /proc")
def test_a_reentrant_run_whose_hold_just_died_takes_its_turn(
    lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    """A hold's holder killed while a `run --reentrant` asked it to share (and another
    caller, which took the lock then, had not yet written its record): the dead holder
    never answered and, a zombie for a moment, still counted as running, so the run was
    refused ("did not share its lock ... not answering"). Here the zombie stays: a hold
    record names it, and its child keeps the lock, as that other caller would."""
    token = "0" * 32
    code = (
        "import fcntl, os, sys, time\n"
        "from local_mutex.backends.flock import record\n"
        "from local_mutex.identity import holder_record, token_hash\n"
        "path, token, go = sys.argv[1:]\n"
        "fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "extra = {'hold': True, 'token_sha256': token_hash(token)}\n"
        "record.write_record(fd, holder_record('dead', '', shared=False, env={}, extra=extra),"
        " path)\n"
        "if os.fork() == 0:\n"
        "    while not os.path.exists(go): time.sleep(0.02)\n"
        "    os._exit(0)\n"
    )
    go = marks / "go"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(lock_file(lock_dir, "dead")), token, str(go)],
        env=clean_env(),
    )
    try:
        # Exited, not reaped: a zombie whose record says it holds the hold.
        wait_for(lambda: pw.state(holder.pid) == "Z", 20, "the holder a zombie")
        r = subprocess.run(
            [
                *CLI,
                "run",
                "--reentrant",
                "--wait",
                "0.5",
                "--lock-dir",
                str(lock_dir),
                "dead",
                f"touch '{marks}/ran'",
            ],
            env=clean_env({"LOCAL_MUTEX_HOLD_TOKEN": token}),
            capture_output=True,
            timeout=30,
        )
        assert r.returncode == 75, r.stderr  # waited its turn behind the child, as anyone
        assert b"did not share" not in r.stderr, r.stderr
    finally:
        go.touch()
        holder.wait(20)
    r = run_cli(["run", "--reentrant", "--lock-dir", str(lock_dir), "dead", f"touch '{marks}/ran'"])
    assert r.returncode == 0 and (marks / "ran").exists(), r.stderr


def test_a_reentrant_run_after_a_deletion_whose_new_file_another_took_runs_inside_the_hold(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """A tmp cleaner took the hold's file and another caller the new one: the hold can never
    take it back. It ended, and the other ran beside the hold's job; it goes on now (the
    other waits for it), and a `run --reentrant` of its job joins it on the deleted file."""
    cleanup.append("taken")
    token = _hold("taken", lock_dir)
    holder_pid = _status("taken", lock_dir)["holders"][0]["pid"]
    with stopped(holder_pid):
        lock_file(lock_dir, "taken").unlink()
        other = procs.start(["taken", hold_until(marks, "o"), str(lock_dir)])
        procs.wait_stderr(other, f"was deleted while pid {holder_pid} held it")
    r = run_cli(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), "taken", f"touch '{marks}/ran'"],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    assert r.returncode == 0 and b"running inside it" in r.stderr, r.stderr
    assert (marks / "ran").exists() and not (marks / "o.held").exists()
    r = run_cli(["release", "taken", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0, r.stderr
    wait_for(marks / "o.held")  # only now
    (marks / "o.go").touch()
    assert other.wait(30) == 0, procs.stderr(other)


def test_a_reentrant_run_after_a_deletion_under_a_stopped_hold_keeps_its_ceiling(
    lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """Its hold's holder stopped (SIGSTOP) when the lock file went: the run gave it a second
    to take the new file back, past its --wait, then waited for its own hold forever. A hold
    that cannot take its file back cannot share its lock either: not run, within --wait."""
    cleanup.append("stopped")
    token = _hold("stopped", lock_dir)
    holder_pid = _status("stopped", lock_dir)["holders"][0]["pid"]
    with stopped(holder_pid):
        lock_file(lock_dir, "stopped").unlink()
        r, took = _timed_run_inside("stopped", lock_dir, marks, token, "--wait", "0.2")
    assert r.returncode == 2, r.stderr
    assert b"did not share its lock" in r.stderr, r.stderr
    assert not (marks / "ran").exists()
    assert took < 0.2 + 5, took  # its start and end, on a busy machine
    r = run_cli(["release", "stopped", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0, r.stderr  # the hold took its file back meanwhile


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_reentrant_run_asking_a_stopped_hold_keeps_to_no_wait(
    lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """A stopped holder never answers a run that asks to share its lock: the run waited
    2 s for each of its two tries (4 s) whatever its ``--no-wait``. A join now gets half the
    wait per try, and a second in all at least (a running holder answers within a tick)."""
    cleanup.append("asleep")
    token = _hold("asleep", lock_dir)
    holder_pid = _status("asleep", lock_dir)["holders"][0]["pid"]
    with stopped(holder_pid):
        r, took = _timed_run_inside("asleep", lock_dir, marks, token, "--no-wait")
    assert r.returncode == 2, r.stderr
    assert b"not answering" in r.stderr, r.stderr
    assert not (marks / "ran").exists()
    assert took < 3.0, took  # 1 s, and the run's start and end; it was 4 s and more
    inside, _ = _timed_run_inside("asleep", lock_dir, marks, token, "--no-wait")
    assert inside.returncode == 0 and (marks / "ran").exists(), inside.stderr  # running again


def _timed_run_inside(
    name: str, lock_dir: Path, marks: Path, token: str, *opts: str
) -> tuple[subprocess.CompletedProcess[bytes], float]:
    """A ``run --reentrant`` of the hold's job that touches ``ran``; and how long it took."""
    t0 = time.monotonic()
    r = run_cli(
        ["run", "--reentrant", *opts, "--lock-dir", str(lock_dir), name, f"touch '{marks}/ran'"],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        timeout=20,
    )
    return r, time.monotonic() - t0


def test_a_release_after_the_holder_was_killed_says_the_hold_is_over(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The holder SIGKILLed while a run inside still runs: the lock is that run's until it
    ends. `release` called it "held by pid …, which is not a hold" -- of a hold the user
    did start. It now says the hold is over and what still holds the lock."""
    token, run = _inside_a_dead_hold("orphaned", procs, lock_dir, marks, cleanup)
    r = run_cli(["release", "orphaned", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 77, r.stderr
    assert b"the hold on orphaned is over" in r.stderr and b"not a hold" not in r.stderr, r.stderr
    (marks / "in.go").touch()
    assert run.wait(30) == 0, procs.stderr(run)


def test_a_release_after_a_deletion_and_a_newcomer_that_gave_up_ends_the_hold(
    lock_dir: Path, cleanup: list[str]
) -> None:
    """The holder stopped, its file deleted, a newcomer that created a new one and gave up
    (``--no-wait``): the path names an unlocked file, and ``release`` said "not held"
    (exit 0) while the holder, once it ran again, took that file and held on for good."""
    cleanup.append("gaveup")
    token = _hold("gaveup", lock_dir)
    holder_pid = _status("gaveup", lock_dir)["holders"][0]["pid"]
    with stopped(holder_pid):
        lock_file(lock_dir, "gaveup").unlink()
        r = run_cli(["--no-wait", "gaveup", "true", str(lock_dir)])
        assert r.returncode == 75, r.stderr
        r = run_cli(["release", "gaveup", "--lock-dir", str(lock_dir), "--token", token])
        assert r.returncode == 0, r.stderr
        assert b"not held" not in r.stderr, r.stderr
    assert pw.wait_gone([holder_pid], 10) == []
    assert _free("gaveup", lock_dir)


def test_a_file_moved_away_and_left_to_a_run_inside_still_excludes(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """Moved to another directory while a run inside the hold held it, the hold released
    before it put a file back: ending, it emptied the record that said whose file it was,
    and a newcomer ran while the run's command went on."""
    token, run = _inside("left", procs, lock_dir, marks, cleanup)
    holder_pid = _status("left", lock_dir)["holders"][0]["pid"]
    path = lock_file(lock_dir, "left")
    (marks / "trash").mkdir()
    with stopped(holder_pid):
        path.rename(marks / "trash" / path.name)
        r = run_cli(["release", "left", "--lock-dir", str(lock_dir), "--token", token])
        assert r.returncode == 0, r.stderr
    r = run_cli(["--wait", "0.5", "left", f"touch '{marks}/newcomer.ran'", str(lock_dir)])
    assert r.returncode == 75, r.stderr
    assert not (marks / "newcomer.ran").exists()
    (marks / "in.go").touch()
    assert run.wait(30) == 0, procs.stderr(run)


def _hold_forged(path: Path, record: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Another process holding a file that was never a lock file, its content a record
    that claims to be a hold of our lock file (anyone can write one)."""
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
        "os.write(fd, sys.argv[2].encode())\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(path), json.dumps(record) + "\n"],
        stdout=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stdout.readline() == b"held\n"
    return p


def test_release_never_signals_a_pid_a_planted_record_names(lock_dir: Path, tmp_path: Path) -> None:
    """A hold whose lock file was deleted is found by its record; the pid in a record is
    only a claim. ``release --force`` signalled whatever pid a planted one named."""
    victim = subprocess.Popen(["sleep", "60"])
    target = os.path.join(os.path.realpath(lock_dir), lock_file(lock_dir, "forged").name)
    forger = _hold_forged(
        tmp_path / "planted", {"hold": True, "pid": victim.pid, "lock_file": target}
    )
    try:
        r = run_cli(["release", "forged", "--lock-dir", str(lock_dir), "--force"])
        assert victim.poll() is None, r.stderr
        assert b"released" not in r.stderr, r.stderr
    finally:
        victim.kill()
        forger.kill()
        victim.wait()
        forger.wait()


def _take_the_new_file_first(path: Path) -> int:
    """A tmp cleaner deletes the held lock file and another program creates and locks a new
    one before the holder's next look (every 0.1 s) puts one back: its descriptor."""
    for _ in range(200):
        path.unlink(missing_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue  # the holder put one back first: delete that one
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            os.close(fd)  # the holder found ours and locked it first
    raise AssertionError(f"the holder of {path} always put its file back first")


@pytest.mark.parametrize("inside", [False, True], ids=["alone", "a run inside"])
def test_a_hold_whose_new_lock_file_another_took_first_takes_it_back(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str], inside: bool
) -> None:
    """Another program (no local-mutex: it waits for nothing) took the new file: the hold
    ended by itself, and its job went on unprotected. It goes on now, and takes the file at
    the path back once that program lets go (a run inside it runs on); ``release`` ends it."""
    name = "taken"
    if inside:
        token, run = _inside(name, procs, lock_dir, marks, cleanup)
    else:
        cleanup.append(name)
        token = _hold(name, lock_dir)
    holder_pid = _status(name, lock_dir)["holders"][0]["pid"]
    fd = _take_the_new_file_first(lock_file(lock_dir, name))
    try:
        status = _status(name, lock_dir)
        assert [h["pid"] for h in status["holders"]] == [os.getpid()], status
        # Meanwhile a run of its job runs inside it, on the file deleted from the path.
        r = run_cli(
            ["run", "--reentrant", "--wait", "5", "--lock-dir", str(lock_dir), name, "true"],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        )
        assert r.returncode == 0 and b"running inside it" in r.stderr, r.stderr
    finally:
        os.close(fd)

    def the_holds_again() -> bool:
        return [h["pid"] for h in _status(name, lock_dir)["holders"]] == [holder_pid]

    wait_for(the_holds_again, 10, "the hold to take the file at the path back")
    if inside:
        (marks / "in.go").touch()
        assert run.wait(30) == 0, procs.stderr(run)
    r = run_cli(["release", name, "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0 and b"released" in r.stderr, r.stderr
    assert _free(name, lock_dir)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_what_a_run_inside_a_hold_leaves_behind_does_not_keep_the_lock(
    lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The run's keeper and supervisor share the hold's lock, not its command: a job the
    command left behind does not keep the lock once the hold is released."""
    cleanup.append("left")
    token = _hold("left", lock_dir)
    cmd = f"sleep 30 </dev/null >/dev/null 2>&1 & echo $! > '{marks}/left.pid'"
    r = run_cli(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), "left", cmd],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    leftover = int((marks / "left.pid").read_text())
    try:
        assert r.returncode == 0, r.stderr
        assert pw.alive(leftover)
        assert (
            run_cli(["release", "left", "--lock-dir", str(lock_dir), "--token", token]).returncode
            == 0
        )
        assert _free("left", lock_dir)
    finally:
        pw.signal_quietly([leftover])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_run_whose_keeper_alone_was_killed_still_lets_the_release_free_the_lock(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The supervisor stops the command when its keeper dies, then says goodbye in its
    stead: the hold's release still frees the lock, though another run inside left a
    background job behind (which must not keep it)."""
    cleanup.append("alone")
    token = _hold("alone", lock_dir)
    env = {"LOCAL_MUTEX_HOLD_TOKEN": token}
    cmd = f"sleep 30 </dev/null >/dev/null 2>&1 & echo $! > '{marks}/left.pid'"
    r = run_cli(["run", "--reentrant", "--lock-dir", str(lock_dir), "alone", cmd], env=env)
    assert r.returncode == 0, r.stderr
    leftover = read_pid(marks / "left.pid")
    try:
        run = procs.start(
            ["run", "--reentrant", "--lock-dir", str(lock_dir), "alone", hold_until(marks, "in")],
            env=env,
        )
        wait_for(marks / "in.held")
        supervisor = pw.supervisor_child(run.pid)
        assert supervisor is not None
        os.kill(run.pid, signal.SIGKILL)
        assert pw.wait_gone([supervisor], 20) == []  # it stopped the command first
        run.wait(20)
        r = run_cli(["release", "alone", "--lock-dir", str(lock_dir), "--token", token])
        assert r.returncode == 0, r.stderr
        assert pw.alive(leftover)
        assert _free("alone", lock_dir)
    finally:
        pw.signal_quietly([leftover])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
@pytest.mark.parametrize("then", ["kept", "deleted", "moved away"])
def test_a_nested_call_of_a_run_inside_a_hold_whose_keeper_and_supervisor_died_runs_inside(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str], then: str
) -> None:
    """Inside a hold, a run's keeper and supervisor killed together (an OOM sweep): its
    command's own call of that lock waited for the hold's lock, which its command holds --
    for itself -- until its ceiling (for good without one), and the command with it. The
    holder knows that run left without saying its command was over, and then never
    unlocks: asked, it says so, and the call runs inside. Also once a tmp cleaner deleted
    or renamed the file (the holder puts one back). Anyone else still waits."""
    nested = (
        f'"$LOCAL_MUTEX_CLI" -q --wait 10 orphan "touch {marks}/nested.ran"; echo $? > {marks}/rc'
    )
    cmd = f"{hold_until(marks, 'a')}; {nested}; {hold_until(marks, 'b')}"
    token, run = _inside("orphan", procs, lock_dir, marks, cleanup, cmd, "a.held")
    _kill_keeper_and_supervisor(run)
    path = lock_file(lock_dir, "orphan")
    if then == "deleted":
        delete_until_put_back(path)
    elif then == "moved away":
        path.rename(marks / "moved.lock")
        wait_for(path.exists, 10, "the holder to put a file back")
    (marks / "a.go").touch()
    assert read_written(marks / "rc", 30, "the nested call to end") == "0"
    assert (marks / "nested.ran").exists()
    wait_for(marks / "b.held")
    r = run_cli(["--no-wait", "orphan", f"touch '{marks}/newcomer.ran'", str(lock_dir)])
    assert r.returncode == 75, r.stderr
    r = run_cli(["release", "orphan", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0, r.stderr
    _held_until_the_command_ends_at("orphan", lock_dir, marks, "b")


_HOLD_OVER = [
    "named, then released",
    "named, then holder killed",
    "killed with its holder",
    "released, then orphaned",
    "holder killed, then orphaned",
    "released in the holder's last tick",
    "named, holder stopped when asked",
    "named, file deleted, then released",
]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
@pytest.mark.parametrize("how", _HOLD_OVER)
def test_a_nested_call_of_an_orphaned_run_whose_hold_is_over_runs_inside(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str], how: str
) -> None:
    """A run inside a hold lost its keeper and supervisor, and the hold ended -- before or
    after, by release or by its holder killed, with the holder killed too. Its command's
    own call of that lock waited for it -- for itself -- for good: nobody was left to ask,
    nor anybody who could unlock it (it is freed when the last process holding it is gone,
    the caller included). The holder names the runs inside, and those gone without their
    goodbye, in its record as they come and go, and its end leaves the lock to them by
    name: the call runs inside. Also when the drop comes in the holder's last tick, when
    the holder is stopped (it does not answer: its record stands), and after a put-back.
    Anyone else still waits until the command ends."""
    nested = f'"$LOCAL_MUTEX_CLI" -q orphan "touch {marks}/nested.ran"; echo $? > {marks}/rc'
    cmd = f"{hold_until(marks, 'a')}; {nested}; {hold_until(marks, 'b')}"
    token, run = _inside("orphan", procs, lock_dir, marks, cleanup, cmd, "a.held")
    holder = _status("orphan", lock_dir)["holders"][0]["pid"]
    path = lock_file(lock_dir, "orphan")
    release = ["release", "orphan", "--lock-dir", str(lock_dir), "--token", token]

    def named(key: str) -> None:
        wait_for(lambda: key in path.read_text(), 20, f"the holder to name the run ({key})")

    if how == "killed with its holder":
        named("runs_inside")
        supervisor = pw.supervisor_child(run.pid)
        assert supervisor is not None
        pw.kill_together([run.pid, supervisor, holder])
        run.wait(20)
    elif how.endswith(", then orphaned"):
        if how.startswith("released"):
            assert run_cli(release).returncode == 0
        else:
            named("runs_inside")
            os.kill(holder, signal.SIGKILL)
        assert pw.wait_gone([holder], 20) == []
        _kill_keeper_and_supervisor(run)
    elif how == "released in the holder's last tick":
        os.kill(holder, signal.SIGSTOP)  # it sees the drop only as it ends
        _kill_keeper_and_supervisor(run)
        os.kill(holder, signal.SIGTERM)  # what release sends
        os.kill(holder, signal.SIGCONT)
    else:
        _kill_keeper_and_supervisor(run)
        named("left_runs")
        if how == "named, holder stopped when asked":
            os.kill(holder, signal.SIGSTOP)  # (continued and released once the call ran)
        elif how == "named, then holder killed":
            os.kill(holder, signal.SIGKILL)
        else:
            if how == "named, file deleted, then released":
                delete_until_put_back(path)
            assert run_cli(release).returncode == 0
    if how != "named, holder stopped when asked":
        assert pw.wait_gone([holder], 20) == []
    (marks / "a.go").touch()
    assert read_written(marks / "rc", 30, "the nested call to end") == "0"
    assert (marks / "nested.ran").exists()
    if how == "named, holder stopped when asked":
        os.kill(holder, signal.SIGCONT)
        assert run_cli(release).returncode == 0
    wait_for(marks / "b.held")
    _held_until_the_command_ends_at("orphan", lock_dir, marks, "b")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
@pytest.mark.parametrize("hold", ["on", "released"])
def test_a_leftover_of_another_run_inside_the_hold_still_waits_beside_an_orphaned_run(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str], hold: str
) -> None:
    """Only the run that left without its goodbye is its command's: a job that another,
    finished run inside the same hold left behind must still wait for the hold (its
    release unlocks what that job shares), not run inside because some run was orphaned.
    Once the hold was released (and left the lock to the orphaned run), nobody can unlock
    what the job shares: it is told it would wait for itself (exit 2), and runs nothing."""
    leftover = left_behind_call(marks, "orphan")
    token, run = _inside("orphan", procs, lock_dir, marks, cleanup)
    try:
        r = run_cli(
            ["--lock-dir", str(lock_dir), "run", "--reentrant", "orphan", leftover],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        )
        assert r.returncode == 0, r.stderr
        _kill_keeper_and_supervisor(run)
        if hold == "on":
            left_behind_call_waited(marks)
            return
        path = lock_file(lock_dir, "orphan")
        wait_for(lambda: "left_runs" in path.read_text(), 20, "the holder to name the run")
        r = run_cli(["release", "orphan", "--lock-dir", str(lock_dir), "--token", token])
        assert r.returncode == 0, r.stderr
        (marks / "go").touch()
        assert read_written(marks / "rc", 20, "the left-behind job's call") == "2"
        assert not (marks / "ran").exists()
    finally:
        (marks / "go").touch()
        (marks / "in.go").touch()


def _waiting_job(marks: Path, name: str) -> str:
    """A shell command that leaves a job behind (in a session of its own) which, once
    ``job.go`` exists, calls NAME -- waiting, no ceiling -- with its stderr in ``job.err``:
    it writes its run's name to ``job.run``, ``ran`` if it ran inside, and its exit status
    to ``rc``."""
    return (
        f'(setsid sh -c \'echo "$LOCAL_MUTEX_HOLD_RUN" > "{marks}/job.run"; '
        f'while [ ! -e "{marks}/job.go" ]; do sleep 0.01; done; '
        f'sh "$LOCAL_MUTEX_CLI" {name} "touch {marks}/ran" '
        f'2> "{marks}/job.err"; echo $? > "{marks}/rc"\' </dev/null >/dev/null 2>&1 &)'
    )


def _says_it_waits(err: Path) -> None:
    wait_for(lambda: err.exists() and b"waiting for" in err.read_bytes(), 20, "the call to wait")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
@pytest.mark.parametrize("end", ["released", "holder killed", "file deleted, holder killed"])
def test_a_waiting_leftover_is_told_once_the_hold_ends_without_unlocking(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str], end: str
) -> None:
    """A job a finished run inside a hold left behind calls the lock and rightly waits: the
    hold's end unlocks what it shares. The hold then ends without unlocking -- released
    while an orphaned run is inside (the lock is left to that run), or its holder killed
    -- and the job's own inherited description keeps the lock for good: it waited for
    itself forever. It is looked at again as it waits, and told (exit 2), running nothing.
    Also when a tmp cleaner deleted the file under a stopped holder before the call: the
    call takes a new file, then waits out the deleted file's lock (``predecessor``)."""
    token, run = _inside("waiter", procs, lock_dir, marks, cleanup)
    holder = _status("waiter", lock_dir)["holders"][0]["pid"]
    r = run_cli(
        [
            "--lock-dir",
            str(lock_dir),
            "run",
            "--reentrant",
            "waiter",
            _waiting_job(marks, "waiter"),
        ],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    assert r.returncode == 0, r.stderr
    run_seen_over(lock_file(lock_dir, "waiter"), marks / "job.run")
    try:
        if end.startswith("file deleted"):
            os.kill(holder, signal.SIGSTOP)  # (it cannot put a file back)
            lock_file(lock_dir, "waiter").unlink()
        (marks / "job.go").touch()
        _says_it_waits(marks / "job.err")
        if end == "released":
            _kill_keeper_and_supervisor(run)
            path = lock_file(lock_dir, "waiter")
            wait_for(lambda: "left_runs" in path.read_text(), 20, "the holder to name the run")
            release = ["release", "waiter", "--lock-dir", str(lock_dir), "--token", token]
            assert run_cli(release).returncode == 0
        else:
            os.kill(holder, signal.SIGKILL)
        assert read_written(marks / "rc", 20, "the waiting call to end") == "2"
        assert b"wait for itself" in (marks / "job.err").read_bytes()
        assert not (marks / "ran").exists()
    finally:
        (marks / "in.go").touch()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
@pytest.mark.parametrize("file", ["kept", "deleted"])
def test_an_orphaned_runs_call_that_waited_for_a_stopped_holder_runs_inside_once_it_goes_on(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str], file: str
) -> None:
    """The holder stopped before it saw a run lose its keeper and supervisor: it can
    neither answer that run's command's call nor has it named the run, so the call waits
    -- for itself, for good. The holder, continued, names the run: the waiting call looks
    again and runs inside, and anyone else still waits until the command ends. Also when a
    tmp cleaner deleted the file meanwhile: the call takes a new file, then waits out the
    deleted file's lock (``predecessor``)."""
    err = marks / "nested.err"
    nested = f'"$LOCAL_MUTEX_CLI" orphan "touch {marks}/nested.ran" 2> {err}; echo $? > {marks}/rc'
    cmd = f"{hold_until(marks, 'a')}; {nested}; {hold_until(marks, 'b')}"
    token, run = _inside("orphan", procs, lock_dir, marks, cleanup, cmd, "a.held")
    holder = _status("orphan", lock_dir)["holders"][0]["pid"]
    os.kill(holder, signal.SIGSTOP)
    try:
        _kill_keeper_and_supervisor(run)
        if file == "deleted":
            lock_file(lock_dir, "orphan").unlink()
        (marks / "a.go").touch()
        _says_it_waits(err)
        assert not (marks / "rc").exists()
    finally:
        os.kill(holder, signal.SIGCONT)
    assert read_written(marks / "rc", 20, "the nested call to end") == "0", err.read_text()
    assert (marks / "nested.ran").exists()
    wait_for(marks / "b.held")
    r = run_cli(["release", "orphan", "--lock-dir", str(lock_dir), "--token", token])
    assert r.returncode == 0, r.stderr
    _held_until_the_command_ends_at("orphan", lock_dir, marks, "b")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_reentrant_run_after_the_holder_died_and_a_deletion_waits_as_anyone(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The holder killed while a run was inside, then the lock file deleted: the next
    `run --reentrant` found the hold's record on the deleted file, waited a second for the
    dead holder to take the new file, and was refused ("did not share its lock", exit 2).
    The hold is over: its lock, which the run inside keeps, is waited for as anyone's."""
    token, run = _inside_a_dead_hold("gone", procs, lock_dir, marks, cleanup)
    lock_file(lock_dir, "gone").unlink()
    env = {"LOCAL_MUTEX_HOLD_TOKEN": token}
    again = ["run", "--reentrant", "--lock-dir", str(lock_dir), "gone", f"touch '{marks}/2'"]
    r = run_cli(["--no-wait", *again], env=env)
    assert r.returncode == 75, r.stderr
    assert not (marks / "2").exists()
    (marks / "in.go").touch()
    assert run.wait(20) == 0, procs.stderr(run)
    r = run_cli(["--no-wait", *again], env=env)
    assert r.returncode == 0, r.stderr
    assert (marks / "2").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_runs_that_left_a_hold_do_not_pile_up_in_its_holder(
    lock_dir: Path, cleanup: list[str]
) -> None:
    """The holder kept every run's connection until the hold ended: with 32 descriptors,
    the 20-somethingth run inside one hold was refused (``each`` over many items)."""
    cleanup.append("many")
    token = _hold_with_few_descriptors("many", lock_dir, 32)
    env = {"LOCAL_MUTEX_HOLD_TOKEN": token}
    for i in range(40):
        r = run_cli(["-q", "--reentrant", "--lock-dir", str(lock_dir), "many", "true"], env=env)
        assert r.returncode == 0, (i, r.stderr)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_the_holder_shares_its_lock_only_with_its_token(lock_dir: Path, cleanup: list[str]) -> None:
    from local_mutex.backends.flock import share
    from local_mutex.backends.flock.record import read_record

    cleanup.append("asked")
    token = _hold("asked", lock_dir)
    rec = read_record(str(lock_file(lock_dir, "asked")))
    assert rec is not None
    pid, digest = rec["pid"], rec["token_sha256"]
    assert share.join(pid, digest, "0" * 32, None) is None
    assert share.join(pid, digest, None, {"run_id": "1", "job": "x"}) is None
    got = share.join(pid, digest, token, None)
    assert got is not None
    conn, fds, _ = got
    try:
        assert fds and all(not os.get_inheritable(fd) for fd in fds)
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_the_holder_never_shares_its_lock_with_another_user(
    lock_dir: Path, cleanup: list[str]
) -> None:
    """Another user who knows the token, or runs in the same job, gets no description of
    the lock (the holder closes its connection unread), and the holder serves its own
    user as before."""
    from local_mutex.backends.flock import share
    from local_mutex.backends.flock.record import read_record
    from local_mutex.identity import job_identity

    cleanup.append("theirs")
    token = _hold("theirs", lock_dir, env=JOB_A)
    job = job_identity(JOB_A)
    rec = read_record(str(lock_file(lock_dir, "theirs")))
    assert rec is not None
    pid, digest = rec["pid"], rec["token_sha256"]
    ask = (
        "import sys\n"
        "from local_mutex.backends.flock import share\n"
        "from local_mutex.identity import job_identity\n"
        "token = sys.argv[3] or None\n"
        "job = job_identity(dict(a.split('=') for a in sys.argv[4:]))\n"
        "got = share.join(int(sys.argv[1]), sys.argv[2], token, job)\n"
        "print('shared' if got else 'refused')\n"
    )
    with as_other_user() as nobody:
        for request in ([token], ["", *(f"{k}={v}" for k, v in JOB_A.items())]):
            r = subprocess.run(
                [*nobody.drop, nobody.python, "-c", ask, str(pid), digest, *request],
                env=nobody.env(),
                capture_output=True,
                timeout=60,
                cwd="/",
            )
            assert (r.returncode, r.stdout.strip()) == (0, b"refused"), r.stderr
    for got in (share.join(pid, digest, token, None), share.join(pid, digest, None, job)):
        assert got is not None
        conn, fds, _ = got
        for fd in fds:
            os.close(fd)
        conn.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_root_asks_no_hold_of_another_user() -> None:
    """A holder serves its own user and root, but root asks only its own holds: whoever
    listens at another user's hold's address may have planted the lock it points to (see
    test_security's fake hold). Such a run is refused (``lifecycle``: not run)."""
    from local_mutex.backends.flock import share
    from local_mutex.identity import token_hash

    token = "t" * 32
    serve = (
        "import fcntl, os, select, sys\n"
        "from local_mutex.backends.flock.share import Sharing\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "sharing = Sharing(sys.argv[2], None)\n"
        "open(sys.argv[3], 'w').close()\n"
        "while not os.path.exists(sys.argv[4]):\n"
        "    if select.select([sharing], [], [], 0.05)[0]:\n"
        "        sharing.serve([fd])\n"
    )
    with as_other_user() as nobody:
        d = nobody.shared_dir("hold", 0o777)
        lock, ready, done = d / "x.lock", d / "ready", d / "done"
        holder = subprocess.Popen(
            [*nobody.drop, nobody.python, "-c", serve, str(lock), token, str(ready), str(done)],
            env=nobody.env(),
            cwd="/",
        )
        try:
            wait_for(ready)
            assert share.join(holder.pid, token_hash(token), token, None) is None
        finally:
            done.touch()
            assert holder.wait(30) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_hold_that_ended_with_a_run_inside_leaves_no_record_to_join(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str]
) -> None:
    """The ended hold's record stayed in the lock file: a later `run --reentrant` with its
    token took it for the hold and ran "inside" whoever held the lock next."""
    token, run = _inside("stale", procs, lock_dir, marks, cleanup)
    assert (
        run_cli(["release", "stale", "--lock-dir", str(lock_dir), "--token", token]).returncode == 0
    )
    (marks / "in.go").touch()
    assert run.wait(30) == 0, procs.stderr(run)
    # The next holder writes no record of its own (flock(1), another program).
    other = hold_file(lock_file(lock_dir, "stale"), marks / "other.held", marks / "other.go")
    try:
        wait_for(marks / "other.held")
        r = run_cli(
            ["run", "--reentrant", "--no-wait", "--lock-dir", str(lock_dir), "stale", "true"],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        )
        assert r.returncode == 75, r.stderr
    finally:
        (marks / "other.go").touch()
        assert other.wait(30) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_run_tells_its_token_only_to_the_holder_itself(tmp_path: Path) -> None:
    """A server at the holder's socket name that is not the holder's process (it took
    the name first) never hears the token."""
    from local_mutex.backends.flock import share

    decoy = subprocess.Popen(["sleep", "30"])
    heard = tmp_path / "heard"
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "s.bind('\\0' + sys.argv[1]); s.listen(1); open(sys.argv[2] + '.up', 'w').close()\n"
            "c, _ = s.accept(); c.settimeout(10); data = b''\n"
            "while True:\n"
            "    chunk = c.recv(4096)\n"
            "    if not chunk: break\n"
            "    data += chunk\n"
            "open(sys.argv[2], 'wb').write(data)\n",
            share.address(decoy.pid, "f" * 64)[1:],  # abstract: the leading NUL added there
            str(heard),
        ]
    )
    try:
        wait_for(tmp_path / "heard.up")
        assert share.join(decoy.pid, "f" * 64, "the-secret-token", None) is None
        assert server.wait(20) == 0
        assert b"the-secret-token" not in heard.read_bytes()
    finally:
        for p in (decoy, server):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_peer_that_says_nothing_does_not_stall_the_holder(
    lock_dir: Path, cleanup: list[str]
) -> None:
    """A connection that drips a byte now and then used to hold the holder in its read
    for minutes (no TTL, no lock-file checks, no other run served)."""
    import socket
    import threading

    from local_mutex.backends.flock import share
    from local_mutex.backends.flock.record import read_record

    cleanup.append("drip")
    token = _hold("drip", lock_dir)
    rec = read_record(str(lock_file(lock_dir, "drip")))
    assert rec is not None
    name = share.address(rec["pid"], rec["token_sha256"])
    drip = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    drip.connect(name)
    stop = threading.Event()

    def dripping() -> None:
        while not stop.wait(0.05):
            try:
                drip.sendall(b"x")
            except OSError:
                return

    thread = threading.Thread(target=dripping)
    thread.start()
    try:
        got = share.join(rec["pid"], rec["token_sha256"], token, None)  # 2 s to answer
        assert got is not None
        conn, fds, _ = got
        for fd in fds:
            os.close(fd)
        conn.close()
    finally:
        stop.set()
        thread.join()
        drip.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_a_crowd_of_silent_connections_does_not_hold_up_a_release(
    lock_dir: Path, cleanup: list[str]
) -> None:
    """The holder keeps a release (SIGTERM) back while it serves runs; it served a crowd of
    connections that never ask anything 0.2 s each, and the release took its whole 10 s
    grace and a SIGKILL. It serves a quarter second per tick now."""
    import socket
    import threading

    from local_mutex.backends.flock import share
    from local_mutex.backends.flock.record import read_record

    cleanup.append("crowd")
    token = _hold("crowd", lock_dir)
    rec = read_record(str(lock_file(lock_dir, "crowd")))
    assert rec is not None
    name = share.address(rec["pid"], rec["token_sha256"])
    stop = threading.Event()
    crowd: list[socket.socket] = []

    def knocking() -> None:
        while not stop.is_set():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(name)
                crowd.append(s)
            except OSError:
                s.close()
                time.sleep(0.005)

    thread = threading.Thread(target=knocking)
    thread.start()
    try:
        wait_for(lambda: len(crowd) >= 64, what="the holder's queue full")
        started = time.monotonic()
        r = run_cli(["release", "crowd", "--lock-dir", str(lock_dir), "--token", token])
        took = time.monotonic() - started
    finally:
        stop.set()
        thread.join()
        for s in crowd:
            s.close()
    assert r.returncode == 0, r.stderr
    assert took < 5, f"release took {took:.1f}s"
    assert _free("crowd", lock_dir)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
@pytest.mark.parametrize("how", ["release", "ttl"])
def test_a_run_inside_an_ended_hold_keeps_the_lock_when_keeper_and_supervisor_die(
    procs: Procs, lock_dir: Path, marks: Path, cleanup: list[str], how: str
) -> None:
    """The hold ended under a `run --reentrant`, then its keeper and supervisor were killed
    together (an OOM sweep): only the command was left, and it did not have the hold's
    description, so a newcomer ran beside it. The command shares it now, as a plain run's
    does: the lock is held until the command ends."""
    cleanup.append("bare")
    token = _hold("bare", lock_dir, *(["--ttl", "3"] if how == "ttl" else []))  # busy: >1 s
    holder_pid = _status("bare", lock_dir)["holders"][0]["pid"]
    run = procs.start(
        ["run", "--reentrant", "--lock-dir", str(lock_dir), "bare", hold_until(marks, "in")],
        env={"LOCAL_MUTEX_HOLD_TOKEN": token},
    )
    wait_for(marks / "in.held")
    _end_hold(how, "bare", lock_dir, token, holder_pid)
    _kill_keeper_and_supervisor(run)
    _held_until_the_command_ends("bare", lock_dir, marks)


def test_reentrant_with_no_hold_it_could_join_says_so(lock_dir: Path) -> None:
    """Outside a GitHub job and without a token, --reentrant can join no hold: it said
    nothing and waited behind the caller's own hold as anyone would."""
    r = run_cli(["--reentrant", "--no-wait", "alone", "echo ran", str(lock_dir)])
    assert r.returncode == 0 and r.stdout == b"ran\n", r.stderr
    assert b"there is neither here: alone is taken like anyone else" in r.stderr
    quiet = run_cli(
        ["--reentrant", "--no-wait", "alone", "true", str(lock_dir)],
        env={"LOCAL_MUTEX_HOLD_TOKEN": "x" * 32},
    )
    assert quiet.returncode == 0 and b"there is neither" not in quiet.stderr, quiet.stderr


def test_a_hold_inside_a_run_of_the_same_lock_is_refused(lock_dir: Path) -> None:
    """It used to wait for itself: forever without --wait. Another name is fine."""
    cmd = (
        '"$LOCAL_MUTEX_CLI" hold n; echo "same $?"; '
        't=$("$LOCAL_MUTEX_CLI" hold other) && echo "other $?" && '
        '"$LOCAL_MUTEX_CLI" release other --token "$t"'
    )
    r = run_cli(["-q", "n", cmd, str(lock_dir)], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split("\n")[:2] == ["same 2", "other 0"], r.stdout
    assert b"would wait for itself" in r.stderr


@pytest.mark.skipif(not os.path.exists("/proc/self/wchan"), reason="needs /proc/PID/wchan")
def test_a_hold_whose_token_never_got_out_ends_with_its_caller(lock_dir: Path) -> None:
    """The holder said "ok" and went on keeping the lock; its caller, blocked printing
    the token (a full pipe, a frozen container), was then killed: a hold nobody could
    ever release with its token (it lasted for good, without --ttl). The holder now keeps
    it only once the caller says the token reached its reader."""
    read_end, write_end = full_pipe()
    path = lock_file(lock_dir, "undelivered")
    try:
        caller = subprocess.Popen(
            [*CLI, "hold", "--lock-dir", str(lock_dir), "undelivered"],
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=write_end,  # full: printing the token blocks
            stderr=subprocess.DEVNULL,
        )
        # The holder said "ok": its caller is stuck writing the token into the full pipe.
        wait_for(lambda: sleeps_in(caller.pid, "pipe_write"), 30, "the caller printing")
        assert not lock_is_free(path)
        caller.kill()
        caller.wait(10)
        wait_for(lambda: lock_is_free(path), 20, "the hold ended with its caller")
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_hold_waiting_for_its_token_to_get_out_still_keeps_its_ttl(lock_dir: Path) -> None:
    """The TTL counts from taking the lock: a caller stuck printing the token (a full
    pipe, a frozen terminal) must not stretch it -- the hold ends on time all the same."""
    read_end, write_end = full_pipe()
    path = lock_file(lock_dir, "ttl-undelivered")
    caller = subprocess.Popen(
        [*CLI, "hold", "--ttl", "1", "--lock-dir", str(lock_dir), "ttl-undelivered"],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: path.exists() and not lock_is_free(path), 30, "the holder took it")
        wait_for(lambda: lock_is_free(path), 20, "the TTL ended the hold")
        assert caller.poll() is None  # still stuck printing: the TTL alone ended it
    finally:
        caller.kill()
        caller.wait(10)
        os.close(read_end)
        os.close(write_end)


def test_a_hold_stopped_while_it_waits_says_nothing_was_held(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """It said "the command did not run": a hold has no command."""
    holder = procs.start(["busy", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiting = procs.start(["hold", "busy", "--lock-dir", str(lock_dir)])
    wait_for(lambda: _status("busy", lock_dir)["waiters"], 20, "the hold queued")
    waiting.send_signal(signal.SIGTERM)
    assert waiting.wait(20) == 143
    last = procs.stderr(waiting).splitlines()[-1]
    assert last == "local-mutex: stopped waiting for the lock: received signal 15; nothing was done"
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_holder_signalled_while_it_waits_is_a_stop_not_a_failure_to_start(
    procs: Procs, lock_dir: Path, marks: Path, sig: signal.Signals
) -> None:
    """Its pid is in ``status`` as a waiter, so someone may ``kill`` it: the caller said
    "the holder process ended (status 1)" and exited 125 (the holder's traceback went to
    /dev/null), or "(status -9)"."""
    holder = procs.start(["busy", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiting = procs.start(["hold", "busy", "--lock-dir", str(lock_dir)])
    wait_for(lambda: _status("busy", lock_dir)["waiters"], 20, "the hold queued")
    waiter = _status("busy", lock_dir)["waiters"][0]["pid"]
    assert waiter != waiting.pid  # the detached holder, as status shows it
    os.kill(waiter, sig)
    assert waiting.wait(20) == 128 + sig
    assert procs.stdout(waiting) == ""  # no token
    assert procs.stderr(waiting).splitlines()[-1] == (
        f"local-mutex: its holder process (pid {waiter}) received signal {int(sig)} "
        "while it waited for the lock; nothing is held"
    )
    assert _status("busy", lock_dir)["holders"][0]["pid"] != waiter
    (marks / "h.go").touch()
    assert holder.wait(20) == 0
    assert lock_is_free(lock_file(lock_dir, "busy"))


def _dead_with_every_thread(pid: int) -> bool:
    try:
        return pw.state(pid) == "Z" and os.listdir(f"/proc/{pid}/task") == [str(pid)]
    except OSError:  # reaped
        return True


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc/PID/task")
def test_a_holder_killed_as_it_took_the_lock_is_not_said_to_hold(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """Killed (an OOM kill) after it said it held the lock, before ``hold`` handed it the
    token: the hold said "holding busy in detached pid N" and exited 0, nothing held."""
    holder = procs.start(["busy", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiting = procs.start(["hold", "busy", "--lock-dir", str(lock_dir)])
    wait_for(lambda: _status("busy", lock_dir)["waiters"], 20, "the hold queued")
    taker = _status("busy", lock_dir)["waiters"][0]["pid"]
    with stopped(waiting.pid):  # it cannot pass the token on meanwhile
        (marks / "h.go").touch()
        assert holder.wait(20) == 0

        def took() -> bool:
            holders = _status("busy", lock_dir)["holders"]
            return bool(holders) and holders[0]["pid"] == taker

        wait_for(took, 20, "the holder took the lock")
        os.kill(taker, signal.SIGKILL)
        # A zombie (its parent is stopped) with no thread left exiting: its descriptors are
        # closed (a thread still exiting keeps them). (Killed in the instant after the
        # token went out, it would just be a holder that died.)
        wait_for(lambda: _dead_with_every_thread(taker), 20, "the holder a zombie")
    assert waiting.wait(20) == 128 + signal.SIGKILL, procs.stderr(waiting)
    assert procs.stderr(waiting).splitlines()[-1] == (
        f"local-mutex: its holder process (pid {taker}) received signal 9 as it took the "
        "lock; nothing is held"
    )
    assert lock_is_free(lock_file(lock_dir, "busy"))


def test_a_hold_that_waits_says_so_and_leaves_no_stream_of_ours_open(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """A hold's holder waited in silence (a `hold` step with no wait-seconds could sit for
    the whole job with no clue why); it says what a run says, then lets go of our stderr:
    a reader waiting for its end (a runner, `$(...)`) sees it as `hold` returns."""
    procs.start(["--message", "a long migration", "db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    hold = subprocess.Popen(
        [*CLI, "hold", "db", "--lock-dir", str(lock_dir), "--ttl", "60"],
        env=clean_env({"LOCAL_MUTEX_PROGRESS_SECONDS": "0.5"}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    err = hold.stderr
    lines: list[str] = []
    assert err is not None
    reader = threading.Thread(
        target=lambda: lines.extend(line.decode() for line in iter(err.readline, b""))
    )
    reader.start()
    try:
        wait_for(lambda: any("still waiting for lock db" in line for line in lines))
        (marks / "h.go").touch()
        assert hold.wait(30) == 0, lines
        reader.join(30)
        assert not reader.is_alive()  # stderr's end: the holder let go of it
        out = hold.stdout.read() if hold.stdout else b""
        waiting = lines[0]
        assert waiting.startswith("local-mutex: waiting for lock db at "), lines
        assert "held by pid" in waiting and "message 'a long migration'" in waiting
        assert lines[-2].startswith("local-mutex: acquired lock db at "), lines
        assert lines[-1].startswith("local-mutex: holding db in detached pid "), lines
    finally:
        hold.kill()
        (marks / "h.go").touch()
    r = run_cli(
        ["release", "db", "--lock-dir", str(lock_dir)],
        env={"LOCAL_MUTEX_HOLD_TOKEN": out.decode().strip()},
    )
    assert r.returncode == 0, r.stderr
    quiet = run_cli(["-q", "hold", "db", "--lock-dir", str(lock_dir), "--ttl", "60"])
    assert quiet.returncode == 0 and quiet.stderr == b""  # nobody held it: nothing to say
    token = {"LOCAL_MUTEX_HOLD_TOKEN": quiet.stdout.decode().strip()}
    assert run_cli(["release", "db", "--lock-dir", str(lock_dir)], env=token).returncode == 0


def test_a_hold_killed_while_it_waits_takes_its_holder_and_our_stream_with_it(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """SIGKILLed (an OOM kill) while its holder waits for the lock, `hold` left the holder
    waiting with our stderr open: a reader of that pipe (a runner) waited for the lock to
    come free, and the holder took it then for nobody. It stops waiting when its caller is
    gone."""
    procs.start(["db", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    hold = subprocess.Popen(
        [*CLI, "hold", "db", "--lock-dir", str(lock_dir)],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert hold.stderr is not None
    assert b"waiting for lock db" in hold.stderr.readline()  # the holder is waiting
    holders = pw.children(hold.pid)
    assert holders
    hold.kill()
    hold.wait(10)
    ready, _, _ = select.select([hold.stderr], [], [], 15)
    assert ready, "the holder kept our stderr open"
    assert hold.stderr.read() == b""  # its end: nobody holds our stream any more
    for pid in holders:
        wait_for(lambda pid=pid: not pw.alive(pid), what=f"holder {pid} gone")
    (marks / "h.go").touch()
    wait_for(lambda: lock_is_free(lock_file(lock_dir, "db")), what="nothing held after the run")
