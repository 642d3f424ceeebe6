"""status and list: the truth from the kernel, without taking or creating the lock."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

import local_mutex
from helpers import (
    CLI,
    Procs,
    clean_env,
    hold_until,
    lock_file,
    lock_is_free,
    run_cli,
    stopped,
    wait_for,
)
from helpers.otheruser import OtherUser, as_other_user

linux_only = pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks")


def _status(name: str, lock_dir: Path) -> tuple[int, dict[str, Any]]:
    r = run_cli(["status", name, "--lock-dir", str(lock_dir), "--json"], timeout=20)
    return r.returncode, json.loads(r.stdout)


def test_missing_lock_file_is_free_and_not_created(lock_dir: Path) -> None:
    code, st = _status("nobody-home", lock_dir)
    assert code == 0 and st["state"] == "free" and st["holders"] == []
    assert list(lock_dir.iterdir()) == []
    r = run_cli(["status", "nobody-home", "--lock-dir", str(lock_dir)])
    assert r.returncode == 0 and r.stdout.decode().startswith("nobody-home: free")


@linux_only
def test_held_lock_shows_the_holder(procs: Procs, lock_dir: Path, marks: Path) -> None:
    holder = procs.start(
        ["deploy", hold_until(marks), str(lock_dir)], cwd=marks, env={"RUNNER_NAME": "r7"}
    )
    wait_for(marks / "h.held")
    code, st = _status("deploy", lock_dir)
    assert code == 1 and st["state"] == "held" and st["mode"] == "exclusive"
    (h,) = st["holders"]
    assert h["pid"] == holder.pid and h["source"] == "record"
    assert "touch" in h["command"] and h["cwd"] == str(marks) and h["runner"] == "r7"
    assert h["since"].endswith("Z") and h["held_seconds"] >= 0
    human = run_cli(["status", "deploy", "--lock-dir", str(lock_dir)])
    assert human.returncode == 1
    assert f"deploy: held (exclusive) by pid {holder.pid}" in human.stdout.decode()
    api = local_mutex.status("deploy", str(lock_dir))
    assert api.held and api.holders[0].pid == holder.pid
    (marks / "h.go").touch()
    assert holder.wait(20) == 0
    assert _status("deploy", lock_dir)[0] == 0


@linux_only
def test_holder_started_through_the_cli_shim(procs: Procs, lock_dir: Path, marks: Path) -> None:
    procs.start(
        ["outer", 'sh "$LOCAL_MUTEX_CLI" inner "$INNER"', str(lock_dir)],
        env={"INNER": hold_until(marks)},
    )
    wait_for(marks / "h.held")
    code, st = _status("inner", lock_dir)
    assert code == 1
    (h,) = st["holders"]
    assert h["source"] == "record" and "touch" in h["command"]
    with open(f"/proc/{h['pid']}/cmdline", "rb") as f:
        assert b"inner" in f.read()
    (marks / "h.go").touch()


@linux_only
def test_waiters_are_listed_in_queue_order(procs: Procs, lock_dir: Path, marks: Path) -> None:
    procs.start(["q", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiters = []
    for i in range(3):
        w = procs.start(["q", f"echo {i}", str(lock_dir)])
        waiters.append(w)
        wait_for(lambda w=w: w.pid in [x["pid"] for x in _status("q", lock_dir)[1]["waiters"]])
    _, st = _status("q", lock_dir)
    assert [x["pid"] for x in st["waiters"]] == [w.pid for w in waiters]
    assert [x["position"] for x in st["waiters"]] == [1, 2, 3]
    assert st["queue_length"] == 3
    assert all(x["mode"] == "exclusive" and "echo" in x["command"] for x in st["waiters"])
    (marks / "h.go").touch()
    assert [w.wait(20) for w in waiters] == [0, 0, 0]


@linux_only
def test_a_waiters_start_is_when_it_started(procs: Procs, lock_dir: Path, marks: Path) -> None:
    """Start times came from /proc/stat's whole-second ``btime``: up to a second early, so
    a waiter seemed to start before the holder it queued behind."""
    procs.start(["t", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    before = time.time()
    waiter = procs.start(["t", "true", str(lock_dir)])
    wait_for(lambda: _status("t", lock_dir)[1]["waiters"])
    after = time.time()
    started = _status("t", lock_dir)[1]["waiters"][0]["started_epoch"]
    assert before - 0.05 <= started <= after, (before, started, after)  # a tick is 10 ms
    (marks / "h.go").touch()
    assert waiter.wait(20) == 0


@linux_only
@pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) not installed")
def test_plain_flock_holder_is_seen(lock_dir: Path, marks: Path) -> None:
    path = lock_file(lock_dir, "legacy")
    holder = subprocess.Popen(["flock", "-x", str(path), "sh", "-c", hold_until(marks)])
    try:
        wait_for(marks / "h.held")
        code, st = _status("legacy", lock_dir)
        assert code == 1
        (h,) = st["holders"]
        assert h["pid"] == holder.pid and h["source"] == "kernel"
        assert h["command"].startswith("flock -x ")
    finally:
        (marks / "h.go").touch()
        holder.wait(20)


def test_sigkilled_holder_is_free_at_once_despite_its_record(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    holder = procs.start(["k", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    # Its supervisor stops the command, then lets go (a moment, longer on a busy machine).
    wait_for(lambda: lock_is_free(lock_file(lock_dir, "k")), what="the supervisor let go")
    assert json.loads(lock_file(lock_dir, "k").read_text())["pid"] == holder.pid
    code, st = _status("k", lock_dir)
    assert code == 0 and st["state"] == "free" and st["holders"] == []
    (marks / "h.go").touch()


@linux_only
def test_concurrent_status_calls_disturb_nobody(
    procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    holder = procs.start(["c", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    waiter = procs.start(["c", f"echo waiter-ran >> '{log}'", str(lock_dir)])
    procs.wait_stderr(waiter, "waiting for lock c")
    pollers = [
        subprocess.Popen(
            [*CLI, "status", "c", "--lock-dir", str(lock_dir), "--json"],
            env=clean_env(),
            stdout=subprocess.PIPE,
        )
        for _ in range(10)
    ]
    results = [(p.wait(30), json.loads(p.communicate()[0])) for p in pollers]
    assert all(code == 1 and st["holders"][0]["pid"] == holder.pid for code, st in results)
    assert waiter.poll() is None and not log.exists()  # still queued, not let through
    (marks / "h.go").touch()
    assert holder.wait(20) == 0 and waiter.wait(20) == 0
    assert log.read_text() == "waiter-ran\n"
    assert all(_status("c", lock_dir)[0] == 0 for _ in range(5))


@linux_only
def test_list_shows_held_locks_and_all(procs: Procs, lock_dir: Path, marks: Path) -> None:
    for name in ("one", "two"):
        procs.start([name, hold_until(marks, name), str(lock_dir)])
        wait_for(marks / f"{name}.held")
    assert run_cli(["free-one", "true", str(lock_dir)]).returncode == 0
    (lock_dir / "unrelated.txt").write_text("not a lock")
    r = run_cli(["list", "--lock-dir", str(lock_dir), "--json"])
    assert r.returncode == 0
    held = json.loads(r.stdout)
    assert [s["name"] for s in held] == ["one", "two"]  # longest-held first
    assert all(s["state"] == "held" and s["queue_length"] == 0 for s in held)
    r = run_cli(["list", "--lock-dir", str(lock_dir), "--json", "--all"])
    everything = json.loads(r.stdout)
    assert len(everything) == 3 and everything[-1]["state"] == "free"
    human = run_cli(["list", "--lock-dir", str(lock_dir)]).stdout.decode()
    assert "one: held (exclusive)" in human and "two: held" in human
    assert [s.name for s in local_mutex.list_locks(str(lock_dir))] == ["one", "two"]
    for name in ("one", "two"):
        (marks / f"{name}.go").touch()


def test_list_names_the_lock_files_it_leaves_out(lock_dir: Path, tmp_path: Path) -> None:
    """A symlink or FIFO planted at a lock file's path blocks that name (every taker
    refuses it); ``list`` left it out without a word, so nobody saw why a job never ran."""
    assert run_cli(["fine", "true", str(lock_dir)]).returncode == 0
    link, fifo = lock_file(lock_dir, "linked"), lock_file(lock_dir, "piped")
    link.symlink_to(tmp_path / "elsewhere")
    os.mkfifo(fifo)
    r = run_cli(["list", "--all", "--lock-dir", str(lock_dir), "--json"], timeout=20)
    assert r.returncode == 0, r.stderr
    assert [s["lock_file"] for s in json.loads(r.stdout)] == [str(lock_file(lock_dir, "fine"))]
    assert set(r.stderr.decode().splitlines()) == {
        f"local-mutex: lock file {str(fifo)!r} is not a regular file; refusing to use it; "
        "not listed",
        f"local-mutex: lock file {str(link)!r} is a symlink; refusing to follow it; not listed",
    }
    r = run_cli(["linked", "true", str(lock_dir)])  # the block the warning is about
    assert r.returncode == 2 and b"is a symlink; refusing to follow it" in r.stderr


def test_list_leaves_out_what_run_refuses_and_does_not_trust_its_record(
    lock_dir: Path, tmp_path: Path
) -> None:
    """A hard link at a lock path, or (to whoever does not opt in) another user's file:
    ``run`` and ``status`` refuse it, and whoever wrote it wrote its record -- ``list``
    showed its holder as the record told, or the file as an ordinary free lock."""
    assert run_cli(["fine", "true", str(lock_dir)]).returncode == 0
    linked = lock_file(lock_dir, "linked")
    os.link(_touched(tmp_path / "theirs"), linked)
    planted = lock_file(lock_dir, "planted")
    record = {"v": 1, "name": "planted", "pid": os.getpid(), "command": "make deploy"}
    planted.write_text(json.dumps(record) + "\n")
    foreign = os.geteuid() == 0
    if foreign:  # our temporary dir: another uid's file needs no other user's process
        os.chown(planted, 65534, 65534)
    r = run_cli(["list", "--all", "--lock-dir", str(lock_dir), "--json"], timeout=20)
    assert r.returncode == 0, r.stderr
    listed = [s["lock_file"] for s in json.loads(r.stdout)]
    warned = sorted(r.stderr.decode().splitlines(), key=lambda w: str(planted) in w)
    assert len(warned) == 1 + foreign, warned
    assert warned[0].startswith(f"local-mutex: lock file {str(linked)!r} has 2 links")
    assert warned[0].endswith("refusing to write to it; not listed")
    if foreign:
        assert listed == [str(lock_file(lock_dir, "fine"))]
        assert f"{str(planted)!r} is owned by uid 65534" in warned[1]
        assert warned[1].endswith("to trust it; not listed")
        opted = ["list", "--all", "--allow-other-owner", "--lock-dir", str(lock_dir), "--json"]
        r = run_cli(opted)
        assert str(planted) in [s["lock_file"] for s in json.loads(r.stdout)]
        assert r.stderr.count(b"not listed") == 1
    r = run_cli(["linked", "true", str(lock_dir)])
    assert r.returncode == 2 and b"has 2 links" in r.stderr


def _touched(path: Path) -> Path:
    path.touch()
    return path


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc")
def test_list_answers_while_a_tmp_cleaner_deletes_lock_files(lock_dir: Path) -> None:
    """A file deleted between the dir's scan and its stat made the whole list exit 3,
    "cannot read lock dir ...: No such file or directory"."""
    for i in range(3000):
        (lock_dir / f"local-mutex-{i:064x}.lock").touch()
    cleaner = subprocess.Popen(
        [sys.executable, "-c", CLEAN_SLOWLY, str(lock_dir)], stdout=subprocess.PIPE
    )
    try:
        assert cleaner.stdout is not None and cleaner.stdout.readline() == b"cleaning\n"
        codes = [run_cli(["list", "--lock-dir", str(lock_dir)]) for _ in range(3)]
    finally:
        cleaner.kill()
        cleaner.wait()
    assert [(r.returncode, r.stderr) for r in codes] == [(0, b"")] * 3


# Deletes the lock files one by one, from the end of the dir's order, until killed.
CLEAN_SLOWLY = """
import os, sys, time
names = sorted(os.listdir(sys.argv[1]), reverse=True)
print("cleaning", flush=True)
for name in names:
    os.unlink(os.path.join(sys.argv[1], name))
    time.sleep(0.0002)
"""


def test_status_of_a_name_answers_for_its_lock_whatever_is_at_a_slot_path(
    lock_dir: Path,
) -> None:
    """A directory (or another user's file) planted at a slot path blocks ``--slots``
    runs of the name, not its plain lock: ``status NAME`` exited 2 and said nothing of it."""
    slot = lock_dir / (lock_file(lock_dir, "deploy").name[: -len(".lock")] + ".slot0.lock")
    slot.mkdir()
    r = run_cli(["status", "deploy", "--lock-dir", str(lock_dir)])
    assert r.returncode == 0 and r.stdout.startswith(b"deploy: free"), r.stderr
    assert r.stderr.decode() == (
        f"local-mutex: lock file {str(slot)!r} is not a regular file; refusing to use it; "
        "slot not counted\n"
    )
    r = run_cli(["status", "--slots", "deploy", "--lock-dir", str(lock_dir)])
    assert r.returncode == 2 and r.stderr.endswith(b"refusing to use it\n"), r.stderr
    r = run_cli(["--slots", "2", "deploy", "true", str(lock_dir)])
    assert r.returncode == 2 and b"slot0.lock' is not a regular file" in r.stderr
    st = local_mutex.status("deploy", str(lock_dir))  # the API (and the action's check)
    assert st.busy() is False
    with pytest.raises(local_mutex.UnsafeLockFile, match=r"slot0\.lock' is not a regular file"):
        st.busy(2)


def test_status_bad_input(lock_dir: Path, tmp_path: Path) -> None:
    r = run_cli(["status", "", "--lock-dir", str(lock_dir)])
    assert r.returncode == 2 and b"lock name is empty" in r.stderr
    r = run_cli(["status", "x", "--lock-dir", str(tmp_path / "missing")])
    assert r.returncode == 2 and b"does not exist" in r.stderr
    r = run_cli(["list", "--lock-dir", "relative"])
    assert r.returncode == 2 and b"must be an absolute path" in r.stderr


def _hidden_proc(
    args: list[str], user: OtherUser | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run the CLI with an empty tmpfs over /proc (a private mount namespace)."""
    cli = user.cli if user else CLI
    script = "mount -t tmpfs none /proc && exec " + shlex.join([*cli, *args])
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        timeout=30,
        cwd="/",
        env=user.env() if user else clean_env({"PYTHONPATH": os.pathsep.join(sys.path)}),
    )


needs_hidden_proc = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to hide /proc",
)


@needs_hidden_proc
def test_unreadable_proc_falls_back_to_a_probe(procs: Procs, marks: Path) -> None:
    shared_dir = Path(tempfile.mkdtemp(prefix="lm-status-"))
    shared_dir.chmod(0o755)
    try:
        holder = procs.start(["p", hold_until(marks), str(shared_dir)])
        wait_for(marks / "h.held")
        r = _hidden_proc(["status", "p", "--lock-dir", str(shared_dir), "--json"])
        assert r.returncode == 1, r.stderr
        st = json.loads(r.stdout)
        assert st["method"] == "probe" and st["holders"][0]["pid"] == holder.pid
        (marks / "h.go").touch()
        assert holder.wait(20) == 0
        r = _hidden_proc(["status", "p", "--lock-dir", str(shared_dir), "--json"])
        assert r.returncode == 0 and json.loads(r.stdout)["state"] == "free"
    finally:
        shutil.rmtree(shared_dir)


@needs_hidden_proc
def test_no_proc_and_an_unreadable_lock_file_cannot_tell(marks: Path) -> None:
    with as_other_user() as nobody:
        shared_dir = nobody.shared_dir("locks", 0o755)
        lock_file(shared_dir, "p").touch(mode=0o600)
        r = _hidden_proc(["status", "p", "--lock-dir", str(shared_dir)], user=nobody)
        assert r.returncode == 3, r.stderr
        assert b"cannot open lock file" in r.stderr


@pytest.mark.parametrize("name", ["../../etc/passwd", b"\xff\xfe", "x" * 1000, "a/b"])
def test_status_of_odd_names_is_free_and_creates_nothing(lock_dir: Path, name: str | bytes) -> None:
    r = run_cli(["status", name, "--lock-dir", str(lock_dir), "--json"])
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["state"] == "free" and st["lock_file"] == str(lock_file(lock_dir, name))
    assert list(lock_dir.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="finds the lock through /proc")
@pytest.mark.parametrize("what", ["a hold", "a hold's slot", "a run"])
def test_list_shows_a_lock_whose_file_a_tmp_cleaner_just_deleted(
    procs: Procs, lock_dir: Path, marks: Path, what: str
) -> None:
    """The file deleted before its holder put one back (within 0.1 s; here the holder is
    stopped): `status NAME` said held, `list` did not list it at all. Also a slot file."""
    d = ["--lock-dir", str(lock_dir)]
    path = lock_file(lock_dir, "gone")
    if what == "a run":
        run = procs.start(["gone", hold_until(marks), str(lock_dir)])
        wait_for(marks / "h.held")
        holder = run.pid
    else:
        slots = ["--slots", "1"] if what == "a hold's slot" else []
        r = run_cli(["hold", "gone", *slots, *d])
        assert r.returncode == 0, r.stderr
        if slots:
            path = path.with_name(path.name[: -len(".lock")] + ".slot0.lock")
        holder = json.loads(path.read_text())["pid"]
    try:
        with stopped(holder):
            path.unlink()
            listed = json.loads(run_cli(["list", "--json", *d]).stdout)
            assert [(s["name"], s["state"], s["lock_file"]) for s in listed] == [
                ("gone", "held", str(path))
            ], listed
            assert [h["pid"] for h in listed[0]["holders"]] == [holder], listed
    finally:
        (marks / "h.go").touch()
        run_cli(["release", "gone", "--force", "--slots", *d])
        run_cli(["release", "gone", "--force", *d])
