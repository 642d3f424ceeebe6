"""--slots N: a counting semaphore; at most N at once, waiters asleep."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from helpers import (
    Procs,
    hold_until,
    lock_file,
    lock_is_free,
    read_written,
    run_cli,
    run_seen_over,
    stopped,
    wait_for,
)
from helpers import procwatch as pw
from local_mutex.backends.flock.slots import gate_path, slot_path

needs_proc = pytest.mark.skipif(
    not os.path.isdir("/proc/self"), reason="reads the waiters' CPU time from /proc"
)
NO_PROC = {"LOCAL_MUTEX_NO_PROC": "1"}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_three_runs_two_slots_at_most_two_overlap(
    procs: Procs, lock_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    cmd = f'echo "start $(date +%s.%N)" >> "{log}"; sleep 1; echo "end $(date +%s.%N)" >> "{log}"'
    ps = [procs.start(["--slots", "2", "pool", cmd, str(lock_dir)]) for _ in range(3)]
    assert [p.wait(60) for p in ps] == [0, 0, 0]
    events = sorted(
        (float(t), 1 if kind == "start" else -1)
        for kind, t in (line.split() for line in log.read_text().splitlines())
    )
    running, peak = 0, 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert len(events) == 6 and peak == 2


@needs_proc
def test_a_waiting_third_sleeps_and_then_runs(procs: Procs, lock_dir: Path, marks: Path) -> None:
    a = procs.start(["--slots", "2", "pool", hold_until(marks, "a"), str(lock_dir)])
    b = procs.start(["--slots", "2", "pool", hold_until(marks, "b"), str(lock_dir)])
    wait_for(marks / "a.held")
    wait_for(marks / "b.held")
    third = procs.start(["--slots", "2", "pool", f"touch '{marks}/c.ran'", str(lock_dir)])
    fourth = procs.start(["--slots", "2", "pool", f"touch '{marks}/d.ran'", str(lock_dir)])
    procs.wait_stderr(third, "all 2 slots of pool are busy")
    procs.wait_stderr(fourth, "waiting for lock pool")
    st = json.loads(run_cli(["status", "pool", "--lock-dir", str(lock_dir), "--json"]).stdout)
    assert st["slots_in_use"] == 2
    listed = json.loads(run_cli(["list", "--lock-dir", str(lock_dir), "--json"]).stdout)
    assert sorted(x["slot"] for x in listed if x["slot"] is not None) == [0, 1]
    assert {s["holders"][0]["pid"] for s in st["slots"]} == {a.pid, b.pid}
    before = [_cpu_seconds(p.pid) for p in (third, fourth)]
    time.sleep(2)
    used = [_cpu_seconds(p.pid) - t for p, t in zip((third, fourth), before)]
    assert all(u < 0.5 for u in used), used
    assert not (marks / "c.ran").exists() and not (marks / "d.ran").exists()
    (marks / "a.go").touch()
    assert a.wait(20) == 0
    wait_for(lambda: (marks / "c.ran").exists() or (marks / "d.ran").exists(), 20)
    (marks / "b.go").touch()
    assert third.wait(20) == 0 and fourth.wait(20) == 0 and b.wait(20) == 0


def test_a_waiting_third_sleeps_and_then_runs_without_proc(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """The same on the path a system without /proc takes (LOCAL_MUTEX_NO_PROC=1, as on
    macOS): status by probe, CPU time from wait4 once the waiters are done."""
    a = procs.start(["--slots", "2", "pool", hold_until(marks, "a"), str(lock_dir)], env=NO_PROC)
    b = procs.start(["--slots", "2", "pool", hold_until(marks, "b"), str(lock_dir)], env=NO_PROC)
    wait_for(marks / "a.held")
    wait_for(marks / "b.held")
    third = procs.start(
        ["--slots", "2", "pool", f"touch '{marks}/c.ran'", str(lock_dir)], env=NO_PROC
    )
    fourth = procs.start(
        ["--slots", "2", "pool", f"touch '{marks}/d.ran'", str(lock_dir)], env=NO_PROC
    )
    procs.wait_stderr(third, "all 2 slots of pool are busy")
    procs.wait_stderr(fourth, "waiting for lock pool")
    r = run_cli(["status", "--slots", "pool", "--lock-dir", str(lock_dir), "--json"], env=NO_PROC)
    st = json.loads(r.stdout)
    assert r.returncode == 1 and st["method"] == "probe" and st["slots_in_use"] == 2
    assert {s["holders"][0]["pid"] for s in st["slots"]} == {a.pid, b.pid}
    assert all(s["method"] == "probe" for s in st["slots"])
    listed = json.loads(
        run_cli(["list", "--lock-dir", str(lock_dir), "--json"], env=NO_PROC).stdout
    )
    assert {h["pid"] for x in listed for h in x["holders"]} == {a.pid, b.pid}
    time.sleep(2)
    assert third.poll() is None and fourth.poll() is None
    assert not (marks / "c.ran").exists() and not (marks / "d.ran").exists()
    (marks / "a.go").touch()
    assert a.wait(20) == 0
    wait_for(lambda: (marks / "c.ran").exists() or (marks / "d.ran").exists(), 20)
    (marks / "b.go").touch()
    assert b.wait(20) == 0
    for p in (third, fourth):
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        assert p.returncode == 0, procs.stderr(p)
        used = usage.ru_utime + usage.ru_stime  # start-up included: a loose ceiling
        assert used < 1.5, f"a waiter used {used:.2f}s CPU in all, most of it blocked"


def test_the_slot_number_is_known_without_proc(procs: Procs, lock_dir: Path, marks: Path) -> None:
    a = procs.start(["--slots", "2", "pool", hold_until(marks, "a"), str(lock_dir)], env=NO_PROC)
    wait_for(marks / "a.held")
    try:
        st = json.loads(
            run_cli(["status", "pool", "--lock-dir", str(lock_dir), "--json"], env=NO_PROC).stdout
        )
        assert [s["slot"] for s in st["slots"]] == [0]
        listed = json.loads(
            run_cli(["list", "--lock-dir", str(lock_dir), "--json"], env=NO_PROC).stdout
        )
        assert [x["slot"] for x in listed if x["name"] == "pool"] == [0]
    finally:
        (marks / "a.go").touch()
        assert a.wait(20) == 0


@pytest.mark.parametrize("env", [{}, NO_PROC], ids=["proc", "probe"])
def test_every_slot_file_knows_its_slot_free_or_held(
    procs: Procs, lock_dir: Path, marks: Path, env: dict[str, str]
) -> None:
    """The slot came from the holder's record: a free slot file said ``slot: null`` (and
    ``list --all`` showed it as a plain lock), and a record could claim any slot."""
    a = procs.start(["--slots", "3", "pool", hold_until(marks, "a"), str(lock_dir)], env=env)
    wait_for(marks / "a.held")
    b = procs.start(["--slots", "3", "pool", hold_until(marks, "b"), str(lock_dir)], env=env)
    wait_for(marks / "b.held")
    (marks / "a.go").touch()
    assert a.wait(20) == 0  # slot 0 free again, slot 1 held
    assert run_cli(["--slots", "3", "pool", "true", str(lock_dir)], env=env).returncode == 0
    where = ["--lock-dir", str(lock_dir), "--json"]
    st = json.loads(run_cli(["status", "pool", *where], env=env).stdout)
    assert [(s["slot"], s["state"]) for s in st["slots"]] == [(0, "free"), (1, "held")]
    listed = json.loads(run_cli(["list", "--all", *where], env=env).stdout)
    assert sorted((x["slot"], x["state"]) for x in listed if x["slot"] is not None) == [
        (0, "free"),
        (1, "held"),
    ]
    (marks / "b.go").touch()
    assert b.wait(20) == 0


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks")
def test_status_shows_who_waits_for_a_slot(procs: Procs, lock_dir: Path, marks: Path) -> None:
    """Waiters queue on the name's gate file, which ``status`` never looked at: with every
    slot busy and three callers waiting it said ``queue_length: 0`` (PostgreSQL's showed
    them). The head of the queue holds the gate as it looks for a slot: a waiter, first."""
    holders = [
        procs.start(["--slots", "2", "pool", hold_until(marks, m), str(lock_dir)]) for m in "ab"
    ]
    for m in "ab":
        wait_for(marks / f"{m}.held")
    waiters = []
    gate = Path(gate_path(str(lock_file(lock_dir, "pool"))))
    for i in range(3):
        waiters.append(procs.start(["--slots", "2", "pool", f"echo {i}", str(lock_dir)]))
        wait_for(lambda n=i + 1: _at_gate(gate) == n, 20, f"{i + 1} at the gate")
    try:
        where = ["--lock-dir", str(lock_dir)]
        st = json.loads(run_cli(["status", "--slots", "pool", *where, "--json"]).stdout)
        # The head first (it holds the gate); the others rejoin the queue as they look.
        pids = [w["pid"] for w in st["waiters"]]
        assert pids[0] == waiters[0].pid and sorted(pids) == sorted(w.pid for w in waiters)
        assert [w["position"] for w in st["waiters"]] == [1, 2, 3] and st["queue_length"] == 3
        assert all("echo" in w["command"] for w in st["waiters"])
        text = run_cli(["status", "--slots", "pool", *where]).stdout.decode()
        assert "waiting: 3" in text, text
    finally:
        for m in "ab":
            (marks / f"{m}.go").touch()
    assert [p.wait(30) for p in holders + waiters] == [0] * 5


def _at_gate(gate: Path) -> int:
    """How many processes hold or wait for the gate file's lock (from /proc/locks)."""
    try:
        inode = gate.stat().st_ino
    except FileNotFoundError:
        return 0
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for ln in lines if f":{inode} " in ln and "FLOCK" in ln)


def test_slots_wait_ceiling_and_hold(lock_dir: Path) -> None:
    for _ in range(2):
        r = run_cli(["hold", "pool", "--slots", "2", "--lock-dir", str(lock_dir)])
        assert r.returncode == 0, r.stderr
    r = run_cli(["--slots", "2", "--wait", "0.3", "pool", "true", str(lock_dir)])
    assert r.returncode == 75 and b"all 2 slots of pool are busy" in r.stderr
    r = run_cli(["release", "pool", "--slots", "--lock-dir", str(lock_dir)])
    assert r.returncode == 77  # holds from no job and no token: not ours
    # Without --slots the release is of the plain lock, which is free: it says what to do.
    r = run_cli(["release", "pool", "--force", "--lock-dir", str(lock_dir)])
    assert r.returncode == 0, r.stderr
    assert b"pool is not held, but its slots are" in r.stderr and b"--slots" in r.stderr
    assert b"nothing released" in r.stderr and b"LOCAL_MUTEX_HOLD_TOKEN" in r.stderr
    for _ in range(2):
        r = run_cli(["release", "pool", "--slots", "--force", "--lock-dir", str(lock_dir)])
        assert r.returncode == 0 and b"released pool" in r.stderr
    r = run_cli(["--slots", "2", "--no-wait", "pool", "echo free", str(lock_dir)])
    assert r.returncode == 0 and r.stdout == b"free\n"


def test_plain_release_ends_our_own_slot_hold(lock_dir: Path) -> None:
    """`release NAME` after `hold --slots N NAME`: the plain lock is free, and the slot hold
    is the caller's (its token): ended, not left running behind an exit 0."""
    d = ["--lock-dir", str(lock_dir)]
    theirs = run_cli(["hold", "pool", "--slots", "2", *d])
    ours = run_cli(["hold", "pool", "--slots", "2", *d])
    assert theirs.returncode == 0 and ours.returncode == 0, ours.stderr
    token = ours.stdout.decode().strip()
    r = run_cli(["release", "pool", "--token", token, *d])
    assert r.returncode == 0, r.stderr
    assert b"released pool (hold pid" in r.stderr and b"but its slots are" not in r.stderr
    # Its slot is free (the other hold keeps one); a wrong token ends nothing and says so.
    r = run_cli(["--slots", "2", "--no-wait", "pool", "echo got a slot", str(lock_dir)])
    assert r.returncode == 0 and r.stdout == b"got a slot\n", r.stderr
    r = run_cli(["release", "pool", "--token", "not-a-token", *d])
    assert r.returncode == 0 and b"pool is not held, but its slots are" in r.stderr
    r = run_cli(["--slots", "2", "--no-wait", "pool", "true", str(lock_dir)])
    assert r.returncode == 0, r.stderr  # still only the one hold
    theirs_token = theirs.stdout.decode().strip()
    r = run_cli(["release", "pool", "--token", theirs_token, *d])
    assert r.returncode == 0 and b"released pool" in r.stderr


def test_a_slot_hold_is_released_when_a_tmp_cleaner_took_the_plain_lock_file(
    lock_dir: Path,
) -> None:
    """``release NAME`` said "no lock file for NAME" (exit 2) and left the slot hold running
    for good (no TTL) once the name's plain lock file was deleted."""
    d = ["--lock-dir", str(lock_dir)]
    r = run_cli(["hold", "pool", "--slots", "2", *d])
    assert r.returncode == 0, r.stderr
    token = r.stdout.decode().strip()
    lock_file(lock_dir, "pool").unlink()
    r = run_cli(["release", "pool", "--token", token, *d])
    assert r.returncode == 0 and b"released pool" in r.stderr, r.stderr
    r = run_cli(["release", "pool", "--token", token, *d])  # the slot files are still there
    assert r.returncode == 0 and b"pool is not held" in r.stderr, r.stderr


@pytest.mark.parametrize("deleted", ["the first", "the last"])
def test_release_slots_finds_holds_once_a_tmp_cleaner_deleted_a_slot_file(
    lock_dir: Path, deleted: str
) -> None:
    """`release --slots` and `status` looked at the slot files up to the first one missing:
    a slot file deleted by a tmp cleaner, before its holder put one back (every 0.1 s; here
    it is stopped), hid every hold after it ("no slot files", exit 2; "free") -- and the
    stopped hold of the deleted file could not be released at all. Each is found, shown
    and ended."""
    d = ["--lock-dir", str(lock_dir)]
    tokens = []
    for _ in range(2):
        r = run_cli(["hold", "pool", "--slots", "2", *d])
        assert r.returncode == 0, r.stderr
        tokens.append(r.stdout.decode().strip())
    gone = 0 if deleted == "the first" else 1
    path = Path(slot_path(str(lock_file(lock_dir, "pool")), gone))
    holder = json.loads(path.read_text())["pid"]
    with stopped(holder):
        path.unlink()
        st = json.loads(run_cli(["status", "pool", "--json", *d]).stdout)  # said "free"
        assert [s["state"] for s in st["slots"]] == ["held", "held"], st
        other = run_cli(["release", "pool", "--slots", "--token", tokens[1 - gone], *d])
        assert other.returncode == 0 and b"released pool" in other.stderr, other.stderr
        r = run_cli(["release", "pool", "--slots", "--token", tokens[gone], *d])
        assert r.returncode == 0 and b"released pool" in r.stderr, r.stderr
        assert pw.wait_gone([holder], 20) == []
    r = run_cli(["--slots", "2", "--no-wait", "pool", "true", str(lock_dir)])
    assert r.returncode == 0, r.stderr


def test_release_slots_finds_holds_once_a_tmp_cleaner_deleted_every_slot_file(
    lock_dir: Path,
) -> None:
    """A tmp cleaner deletes files of one age together: every slot file of a pool, under
    stopped holders. `release --slots` said "no slot files" (exit 2) and ended nothing:
    the holds are found through their holders' descriptors, and a wrong token is told so."""
    d = ["--lock-dir", str(lock_dir)]
    tokens = [run_cli(["hold", "pool", "--slots", "2", *d]).stdout.decode().strip() for _ in "ab"]
    paths = [Path(slot_path(str(lock_file(lock_dir, "pool")), i)) for i in (0, 1)]
    holders = [json.loads(path.read_text())["pid"] for path in paths]
    with stopped(holders[0]), stopped(holders[1]):
        for path in paths:
            path.unlink()
        r = run_cli(["release", "pool", "--slots", "--token", "nope", *d])
        assert r.returncode == 77 and b"belongs to another job or token" in r.stderr, r.stderr
        for token in reversed(tokens):
            r = run_cli(["release", "pool", "--slots", "--token", token, *d])
            assert r.returncode == 0 and b"released pool" in r.stderr, r.stderr
        assert pw.wait_gone(holders, 20) == []


def test_a_directory_at_a_slot_path_does_not_stop_release_slots(lock_dir: Path) -> None:
    """Something `--slots` refuses at a slot path past the holds (here a directory) made
    `release --slots` exit 2 for another job's hold (77) and where nothing is held (0)."""
    d = ["--lock-dir", str(lock_dir)]
    token = run_cli(["hold", "pool", "--slots", "1", *d]).stdout.decode().strip()
    Path(slot_path(str(lock_file(lock_dir, "pool")), 1)).mkdir()
    r = run_cli(["release", "pool", "--slots", "--token", "nope", *d])
    assert r.returncode == 77, r.stderr
    r = run_cli(["release", "pool", "--slots", "--token", token, *d])
    assert r.returncode == 0 and b"released pool" in r.stderr, r.stderr
    r = run_cli(["release", "pool", "--slots", "--token", token, *d])
    assert r.returncode == 0 and b"not held" in r.stderr, r.stderr


def test_slots_bad_input(lock_dir: Path) -> None:
    r = run_cli(["--slots", "0", "pool", "true", str(lock_dir)])
    assert r.returncode == 2
    r = run_cli(["--slots", "2", "--shared", "pool", "true", str(lock_dir)])
    assert r.returncode == 2 and b"cannot be --shared" in r.stderr
    assert b"count" not in r.stderr  # 2 is a good count: only --shared is wrong


# -- nesting: a name's slots are a lock apart from its plain lock ------------------------------


def test_slots_inside_the_plain_lock_are_not_reentrant(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """A nested `--slots 1 N` inside a plain `run N` took the plain lock for the slot and
    ran beside the holder of the only slot."""
    slot = procs.start(["--slots", "1", "pool", hold_until(marks, "slot"), str(lock_dir)])
    wait_for(marks / "slot.held")
    nested = f'sh "$LOCAL_MUTEX_CLI" --no-wait --slots 1 pool "touch \'{marks}/nested\'"'
    r = run_cli(["pool", nested, str(lock_dir)])
    assert r.returncode == 75, r.stderr
    assert not (marks / "nested").exists()
    (marks / "slot.go").touch()
    assert slot.wait(30) == 0


def test_slots_inside_the_same_slots_run_inside(lock_dir: Path, marks: Path) -> None:
    """A nested `--slots 1 N` inside `--slots 1 N` waited for its own slot forever."""
    nested = f'sh "$LOCAL_MUTEX_CLI" --slots 1 pool "touch \'{marks}/nested\'"'
    r = run_cli(["--wait", "10", "--slots", "1", "pool", nested, str(lock_dir)], timeout=60)
    assert r.returncode == 0, r.stderr
    assert (marks / "nested").exists()
    assert b"running inside it" in r.stderr


def test_a_reentrant_run_with_slots_joins_a_hold_of_the_slots_only(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """`run --reentrant --slots 1 N` inside a plain `hold N` joined that hold and took no
    slot; inside `hold --slots 1 N` it runs inside the hold's slot."""
    d = str(lock_dir)
    token = run_cli(["hold", "pool", "--lock-dir", d]).stdout.decode().strip()
    slot = procs.start(["--slots", "1", "pool", hold_until(marks, "slot"), d])
    try:
        wait_for(marks / "slot.held")
        r = run_cli(
            ["run", "--reentrant", "--no-wait", "--slots", "1", "--lock-dir", d, "pool", "true"],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        )
        assert r.returncode == 75, r.stderr
    finally:
        (marks / "slot.go").touch()
        assert slot.wait(30) == 0
        assert run_cli(["release", "pool", "--lock-dir", d, "--token", token]).returncode == 0
    token = run_cli(["hold", "pool", "--slots", "1", "--lock-dir", d]).stdout.decode().strip()
    try:
        r = run_cli(
            ["run", "--reentrant", "--no-wait", "--slots", "1", "--lock-dir", d, "pool", "true"],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        )
        assert r.returncode == 0, r.stderr
        assert b"running inside it" in r.stderr
    finally:
        r = run_cli(["release", "pool", "--slots", "--lock-dir", d, "--token", token])
        assert r.returncode == 0, r.stderr


def test_a_stopped_head_of_the_queue_does_not_keep_free_slots_from_the_rest(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """The head of the queue is the only waiter that looks at the slots: stopped (Ctrl-Z,
    SIGSTOP), it kept everyone behind it waiting while the slots were free."""
    d = str(lock_dir)
    holders = [procs.start(["--slots", "2", "pool", hold_until(marks, t), d]) for t in "ab"]
    wait_for(marks / "a.held")
    wait_for(marks / "b.held")
    head = procs.start(["--slots", "2", "pool", f"touch '{marks}/head.ran'", d])
    procs.wait_stderr(head, "waiting for lock pool")
    os.kill(head.pid, signal.SIGSTOP)
    try:
        for tag, p in zip("ab", holders):
            (marks / f"{tag}.go").touch()
            assert p.wait(20) == 0
        r = run_cli(["--slots", "2", "--wait", "10", "pool", f"touch '{marks}/behind.ran'", d])
        assert r.returncode == 0, r.stderr
        assert (marks / "behind.ran").exists()
        # Nor from --no-wait, which gave up at once, saying the slots were busy.
        for how in (["--no-wait"], ["--wait", "0.3"]):
            r = run_cli(["--slots", "2", *how, "pool", "true", d])
            assert r.returncode == 0, (how, r.stderr)
    finally:
        os.kill(head.pid, signal.SIGCONT)
    assert head.wait(20) == 0
    assert (marks / "head.ran").exists()


@pytest.mark.parametrize("env", [{}, NO_PROC], ids=["proc", "no-proc"])
def test_status_answers_for_the_plain_lock_and_with_slots_for_the_slots(
    procs: Procs, lock_dir: Path, marks: Path, env: dict[str, str]
) -> None:
    """One --slots 1 run holds the only slot: the plain lock is free (a plain run runs at
    once), so plain ``status`` says 0; ``status --slots`` says 1. It said 1 either way."""
    where = ["--lock-dir", str(lock_dir)]
    a = procs.start(["--slots", "1", "demo", hold_until(marks, "a"), str(lock_dir)])
    wait_for(marks / "a.held")
    plain = run_cli(["status", *where, "demo"], env=env)
    slotted = run_cli(["status", *where, "--slots", "demo"], env=env)
    assert (
        plain.returncode == 0
        and b"demo: plain lock free; slots held: 1 of 1 slot file" in plain.stdout
    )
    assert b"(a --slots N caller waits if N <= 1)" in plain.stdout
    assert slotted.returncode == 1, slotted.stdout
    assert run_cli(["--no-wait", *where, "demo", "true"]).returncode == 0
    (marks / "a.go").touch()
    assert a.wait(20) == 0
    assert run_cli(["status", *where, "--slots", "demo"], env=env).returncode == 0
    assert run_cli(["status", *where, "--slots", "never-slotted"], env=env).returncode == 0


def test_each_with_slots_reports_only_the_summary_when_nothing_waited(lock_dir: Path) -> None:
    """``each`` prints a line per item only when it waited, failed or was stopped; under
    Actions each such line is an annotation. With ``--slots`` every item counted the
    microseconds of its look at the slots as a wait, and so printed (and annotated) one."""
    r = run_cli(
        ["each", "--slots", "2", "--lock-dir", str(lock_dir), "s", "true"],
        env={"GITHUB_ACTIONS": "true"},
        input=b"1\n2\n3\n",
    )
    assert r.returncode == 0, r.stderr
    lines = r.stderr.decode().splitlines()
    assert [line for line in lines if "released" in line] == [], lines
    assert any("3 items ran" in line for line in lines), lines


# -- a tmp cleaner deleting a held slot's file --------------------------------------------------


def test_a_newcomer_in_the_tick_after_a_slot_files_deletion_leaves_that_slot(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """Deleted, and a newcomer came before the holder put a file back (every 0.1 s; here
    its keeper is stopped): it created a new slot file, took it, and ran beside the
    holder's command -- two in one slot. It now asks the kernel, as for the plain lock,
    finds the lock still held on the deleted file, and leaves that slot (the holder puts
    its file back once it runs)."""
    d = str(lock_dir)
    holder = procs.start(["--slots", "1", "pool", hold_until(marks), d])
    wait_for(marks / "h.held")
    path = Path(slot_path(str(lock_file(lock_dir, "pool")), 0))
    with stopped(holder.pid):
        path.unlink()
        r = run_cli(["--no-wait", "--slots", "1", "pool", f"touch '{marks}/early'", d])
        assert r.returncode == 75, r.stderr
        assert f"slot 0: pid {holder.pid} ".encode() in r.stderr, r.stderr
        assert not (marks / "early").exists()
        late = procs.start(
            ["--slots", "1", "pool", f"test -e '{marks}/h.go' && touch '{marks}/late'", d]
        )
        time.sleep(0.3)  # its looks (every 5-100 ms) leave the slot each time
        assert late.poll() is None, procs.stderr(late)
    procs.wait_stderr(holder, "put a locked file back at the path")
    assert not lock_is_free(path)
    (marks / "h.go").touch()
    assert holder.wait(20) == 0, procs.stderr(holder)
    assert late.wait(20) == 0, procs.stderr(late)
    assert (marks / "late").exists()


# In a newcomer, as it asks the kernel about the slot's new file: a tmp cleaner deletes
# that file too, and a third caller creates and locks the next one at the path.
CLEANER_AND_THIRD_DURING_THE_LOOK = """
import fcntl, os
from local_mutex.backends.flock import predecessor
real, third = predecessor.find, []
def find(path, fd, *args, **kwargs):
    if not third:
        os.unlink(path)
        third.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
        fcntl.flock(third[0], fcntl.LOCK_EX)
    return real(path, fd, *args, **kwargs)
predecessor.find = find
"""


def test_a_slot_file_deleted_again_during_the_look_is_not_taken(
    procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    """The look found the third caller's lock on the file now at the path first, took it
    for "nothing held on a deleted file", and the newcomer ran -- on a deleted file, beside
    the holder (two in one slot under a fast cleaner). It looks past it now, and a file
    deleted while it looked is not taken."""
    d = str(lock_dir)
    holder = procs.start(["--slots", "1", "pool", hold_until(marks), d])
    wait_for(marks / "h.held")
    path = Path(slot_path(str(lock_file(lock_dir, "pool")), 0))
    (tmp_path / "sitecustomize.py").write_text(CLEANER_AND_THIRD_DURING_THE_LOOK)
    src = Path(__file__).resolve().parents[2] / "src"
    with stopped(holder.pid):
        for n in range(3):  # whose lock the kernel lists first varies: look thrice
            path.unlink(missing_ok=True)
            r = run_cli(
                ["--no-wait", "--slots", "1", "pool", f"touch '{marks}/ran{n}'", d],
                env={"PYTHONPATH": f"{tmp_path}:{src}"},
            )
            assert r.returncode == 75, r.stderr
            assert not (marks / f"ran{n}").exists()
    (marks / "h.go").touch()
    assert holder.wait(20) == 0, procs.stderr(holder)


def test_a_nested_slots_call_in_the_tick_after_a_deletion_runs_inside(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    """The command's own `--slots` call, made after its slot's file was deleted and before
    its keeper put one back, runs inside its enclosing run (found through that run's own
    descriptors), not in a slot of its own -- nor waits for its own slot."""
    path = slot_path(str(lock_file(lock_dir, "pool")), 0)
    cmd = (
        f"touch '{marks}/started'; while [ ! -e '{marks}/go' ]; do sleep 0.02; done; "
        f"rm -f '{path}'; \"$LOCAL_MUTEX_CLI\" --no-wait --slots 1 pool "
        f"\"touch '{marks}/inner'\" && touch '{marks}/after'"
    )
    holder = procs.start(["--slots", "1", "pool", cmd, str(lock_dir)])
    wait_for(marks / "started")
    with stopped(holder.pid):  # the keeper: no put-back before the nested call
        (marks / "go").touch()
        wait_for(marks / "after")
    assert holder.wait(20) == 0, procs.stderr(holder)
    assert "running inside it" in procs.stderr(holder)
    assert (marks / "inner").exists()


def test_a_reentrant_run_in_the_tick_after_a_slot_files_deletion_runs(lock_dir: Path) -> None:
    """`run --reentrant --slots` of a `hold --slots`'s job, after a tmp cleaner deleted the
    hold's slot file and before the holder put one back: it runs (its job's hold has the
    slot); a run of anyone else does not."""
    d = str(lock_dir)
    token = run_cli(["hold", "pool", "--slots", "1", "--lock-dir", d]).stdout.decode().strip()
    path = Path(slot_path(str(lock_file(lock_dir, "pool")), 0))
    holder = json.loads(run_cli(["status", "pool", "--json", "--lock-dir", d]).stdout)
    try:
        with stopped(holder["slots"][0]["holders"][0]["pid"]):
            path.unlink()
            other = run_cli(["--no-wait", "--slots", "1", "--lock-dir", d, "pool", "true"])
            assert other.returncode == 75, other.stderr
            r = run_cli(
                ["run", "--reentrant", "--no-wait", "--slots", "1", "--lock-dir", d, "pool",
                 "true"],
                env={"LOCAL_MUTEX_HOLD_TOKEN": token},
            )  # fmt: skip
            assert r.returncode == 0, r.stderr
    finally:
        r = run_cli(["release", "pool", "--slots", "--lock-dir", d, "--token", token])
        assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="finds its lock through /proc")
@pytest.mark.parametrize("inside", ["a plain run", "a hold's run"])
def test_a_nested_slots_call_of_a_command_whose_keeper_and_supervisor_died_runs_inside(
    procs: Procs, lock_dir: Path, marks: Path, inside: str
) -> None:
    """Keeper and supervisor killed together under `--slots 1`: the command holds the
    slot alone, and its own `--slots 1` call of that name waited for it -- for itself --
    until its ceiling (for good without one), as a plain lock's call used to. It runs inside
    now, while anyone else still waits; also inside a `hold --slots 1`'s run."""
    d = str(lock_dir)
    nested = (
        f'"$LOCAL_MUTEX_CLI" -q --wait 10 --slots 1 pool "touch {marks}/nested.ran"; '
        f"echo $? > {marks}/rc"
    )
    cmd = f"{hold_until(marks, 'a')}; {nested}; {hold_until(marks, 'b')}"
    token = None
    if inside == "a plain run":
        run = procs.start(["--slots", "1", "pool", cmd, d])
    else:
        token = run_cli(["hold", "pool", "--slots", "1", "--lock-dir", d]).stdout.decode().strip()
        run = procs.start(
            ["run", "--reentrant", "--slots", "1", "--lock-dir", d, "pool", cmd],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        )
    try:
        wait_for(marks / "a.held")
        supervisor = pw.supervisor_child(run.pid)
        assert supervisor is not None
        pw.kill_together([run.pid, supervisor])
        assert pw.wait_gone([supervisor], 20) == []
        run.wait(20)
        (marks / "a.go").touch()
        assert read_written(marks / "rc", 30, "the nested call to end") == "0"
        assert (marks / "nested.ran").exists()
        wait_for(marks / "b.held")
        r = run_cli(["--no-wait", "--slots", "1", "pool", f"touch '{marks}/newcomer'", d])
        assert r.returncode == 75, r.stderr
        assert not (marks / "newcomer").exists()
    finally:
        (marks / "a.go").touch()
        (marks / "b.go").touch()
        if token is not None:
            run_cli(["release", "pool", "--slots", "--lock-dir", d, "--token", token])


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="finds its lock through /proc")
@pytest.mark.parametrize("who", ["the orphaned run", "a finished run's job"])
def test_a_nested_slots_call_once_a_slot_holds_holder_was_killed(
    procs: Procs, lock_dir: Path, marks: Path, who: str
) -> None:
    """A `hold --slots 1` killed while its slot is shared with what ran inside it: the
    orphaned run, which the holder named, still runs its own `--slots 1` call inside; a
    job a finished run left behind, not named, holds the only slot through its own
    descriptor, and nobody can unlock it: it is told it would wait for itself (exit 2),
    as for a plain hold, rather than wait for good."""
    d = str(lock_dir)
    token = run_cli(["hold", "pool", "--slots", "1", "--lock-dir", d]).stdout.decode().strip()
    st = json.loads(run_cli(["status", "pool", "--json", "--lock-dir", d]).stdout)
    holder = st["slots"][0]["holders"][0]["pid"]
    path = Path(slot_path(str(lock_file(lock_dir, "pool")), 0))
    env = {"LOCAL_MUTEX_HOLD_TOKEN": token}
    nested = (
        f'"$LOCAL_MUTEX_CLI" -q --slots 1 pool "touch {marks}/nested.ran"; echo $? > {marks}/rc'
    )
    try:
        if who == "the orphaned run":
            cmd = f"{hold_until(marks, 'a')}; {nested}; {hold_until(marks, 'b')}"
            run = procs.start(
                ["run", "--reentrant", "--slots", "1", "--lock-dir", d, "pool", cmd], env=env
            )
            wait_for(marks / "a.held")
            supervisor = pw.supervisor_child(run.pid)
            assert supervisor is not None
            pw.kill_together([run.pid, supervisor])
            run.wait(20)
            wait_for(lambda: "left_runs" in path.read_text(), 20, "the holder to name the run")
        else:
            job = (
                f"(setsid sh -c 'while [ ! -e {marks}/a.go ]; do sleep 0.01; done; {nested}' "
                "</dev/null >/dev/null 2>&1 &)"
            )
            r = run_cli(
                ["--lock-dir", d, "run", "--reentrant", "--slots", "1", "pool", job], env=env
            )
            assert r.returncode == 0, r.stderr
            wait_for(lambda: "runs_inside" not in path.read_text(), 10, "the run's end seen")
        os.kill(holder, signal.SIGKILL)
        assert pw.wait_gone([holder], 20) == []
        (marks / "a.go").touch()
        ran = who == "the orphaned run"
        assert read_written(marks / "rc", 30, "the nested call to end") == ("0" if ran else "2")
        assert (marks / "nested.ran").exists() is ran
    finally:
        (marks / "a.go").touch()
        (marks / "b.go").touch()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="finds its lock through /proc")
def test_a_job_waiting_for_the_only_slot_it_holds_itself_is_told_once_the_hold_is_killed(
    lock_dir: Path, marks: Path
) -> None:
    """A job a finished run inside a `hold --slots 1` left behind calls `--slots 1` and
    rightly waits while the hold lives. The holder killed, the job's own inherited
    description holds the only slot for good: it waited for itself forever. It looks again
    as it waits, and is told (exit 2), running nothing."""
    d = str(lock_dir)
    token = run_cli(["hold", "pool", "--slots", "1", "--lock-dir", d]).stdout.decode().strip()
    st = json.loads(run_cli(["status", "pool", "--json", "--lock-dir", d]).stdout)
    holder = st["slots"][0]["holders"][0]["pid"]
    err = marks / "job.err"
    job = (
        f'(setsid sh -c \'echo "$LOCAL_MUTEX_HOLD_RUN" > {marks}/job.run; '
        f'"$LOCAL_MUTEX_CLI" --slots 1 pool "touch {marks}/ran" 2> {err}; '
        f"echo $? > {marks}/rc' </dev/null >/dev/null 2>&1 &)"
    )
    try:
        r = run_cli(
            ["--lock-dir", d, "run", "--reentrant", "--slots", "1", "pool", job],
            env={"LOCAL_MUTEX_HOLD_TOKEN": token},
        )
        assert r.returncode == 0, r.stderr
        run_seen_over(Path(slot_path(str(lock_file(lock_dir, "pool")), 0)), marks / "job.run")
        wait_for(lambda: err.exists() and b"waiting for" in err.read_bytes(), 20, "it waits")
        os.kill(holder, signal.SIGKILL)
        assert read_written(marks / "rc", 30, "the waiting call to end") == "2", err.read_text()
        assert b"wait for itself" in err.read_bytes()
        assert not (marks / "ran").exists()
    finally:
        pw.signal_quietly([holder])
