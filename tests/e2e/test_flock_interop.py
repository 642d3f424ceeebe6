"""Same path, same kernel lock: plain flock(1) and local-mutex exclude each other."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import Procs, hold_until, lock_file, run_cli, wait_for

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) not installed")


def test_flock_holder_blocks_local_mutex(lock_dir: Path, marks: Path) -> None:
    path = lock_file(lock_dir, "shared-tool")
    holder = subprocess.Popen(["flock", "-x", str(path), "sh", "-c", hold_until(marks)])
    try:
        wait_for(marks / "h.held")
        r = run_cli(["--no-wait", "shared-tool", f"touch '{marks}/ran'", str(lock_dir)])
        assert r.returncode == 75
        assert f"held by pid {holder.pid}" in r.stderr.decode()
        assert not (marks / "ran").exists()
    finally:
        (marks / "h.go").touch()
        holder.wait(20)


def test_local_mutex_holder_blocks_flock(procs: Procs, lock_dir: Path, marks: Path) -> None:
    procs.start(["shared-tool", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    path = lock_file(lock_dir, "shared-tool")
    assert subprocess.run(["flock", "-n", "-x", str(path), "true"], timeout=10).returncode == 1
    (marks / "h.go").touch()
    wait_for(lambda: subprocess.run(["flock", "-n", str(path), "true"]).returncode == 0)


# The moment between a holder's lock and its record, made certain (audit hooks run before
# the call): the caller's first try of the lock has the holder take it first, and the
# holder writes its record only once the caller reads the lock file a second time.
TAKE_FIRST = """
import os, sys, time
MARKS, PATH = os.environ.get("TAKE_FIRST"), os.environ.get("TAKE_FIRST_PATH")
reads = []
def wait_for(name):
    while not os.path.exists(os.path.join(MARKS, name)):
        time.sleep(0.001)
def hook(event, args):
    if event == "fcntl.flock" and args[1] & 4 and not os.path.exists(MARKS + "/go"):
        open(MARKS + "/go", "w").close()  # LOCK_NB: the first try
        wait_for("locked")
    elif event == "open" and args[0] == PATH and os.path.exists(MARKS + "/locked"):
        reads.append(1)
        if len(reads) == 2:
            open(MARKS + "/again", "w").close()
            wait_for("written")
if MARKS:
    sys.addaudithook(hook)
"""

LATE_RECORD = """
import fcntl, json, os, sys, time
path, marks = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
def wait_for(name):
    while not os.path.exists(os.path.join(marks, name)):
        time.sleep(0.001)
wait_for("go")
fcntl.flock(fd, fcntl.LOCK_EX)
open(marks + "/locked", "w").close()
wait_for("again")
record = {"v": 1, "pid": os.getpid(), "command": "deploy", "message": "the real holder"}
os.pwrite(fd, (json.dumps(record) + "\\n").encode(), 0)
open(marks + "/written", "w").close()
wait_for("end")
"""


def test_a_holder_that_just_took_the_lock_is_named_by_its_record(
    lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    """Callers that start together (jobs of one workflow): the one that lost found the
    lock taken an instant before its holder's record was written, and named the holder
    by its command line alone (the action's: the interpreter running its bootstrap)."""
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(TAKE_FIRST)
    src = Path(__file__).resolve().parents[2] / "src"
    path = lock_file(lock_dir, "late")
    holder = subprocess.Popen([sys.executable, "-c", LATE_RECORD, str(path), str(marks)])
    try:
        r = run_cli(
            ["--no-wait", "late", "true", str(lock_dir)],
            env={
                "PYTHONPATH": f"{site}:{src}",
                "TAKE_FIRST": str(marks),
                "TAKE_FIRST_PATH": str(path),
            },
        )
        assert r.returncode == 75, r.stderr
        waiting = r.stderr.splitlines()[0]  # the look that found it busy
        assert waiting.startswith(b"local-mutex: waiting for lock late"), r.stderr
        assert b"message 'the real holder'" in waiting, r.stderr
    finally:
        (marks / "end").touch()
        holder.wait(30)


STALE_THEN_HOLD = """
import fcntl, json, os, sys, time
path, marks, dead = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
record = {"v": 1, "name": "st", "pid": dead, "command": "old job", "cwd": "/srv",
          "user": "0", "since_epoch": time.time()}
os.pwrite(fd, (json.dumps(record) + "\\n").encode(), 0)  # as a SIGKILLed holder left it
fcntl.flock(fd, fcntl.LOCK_SH)  # a holder that keeps no record (shared, or flock(1))
open(marks + "/held", "w").close()
while not os.path.exists(marks + "/end"):
    time.sleep(0.01)
"""


@pytest.mark.parametrize("proc", ["with /proc", "without /proc"])
def test_a_waiter_never_names_the_holder_a_dead_holders_record_names(
    lock_dir: Path, marks: Path, proc: str
) -> None:
    """The record a SIGKILLed holder left means nothing once another holds the lock:
    ``status`` knew it, the waiting line named its dead process ("held by 0 ('old job',
    in /srv, ...)", the 0 being its user)."""
    import sys

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid reaped: no process has it (for the moment this test needs)
    path = lock_file(lock_dir, "st")
    holder = subprocess.Popen(
        [sys.executable, "-c", STALE_THEN_HOLD, str(path), str(marks), str(dead.pid)]
    )
    env = {"LOCAL_MUTEX_NO_PROC": "1"} if proc == "without /proc" else {}
    try:
        wait_for(marks / "held")
        r = run_cli(["--no-wait", "st", "true", str(lock_dir)], env=env)
        assert r.returncode == 75, r.stderr
        assert b"old job" not in r.stderr and b"/srv" not in r.stderr, r.stderr
        r = run_cli(["status", "st", "--lock-dir", str(lock_dir)], env=env)
        assert r.returncode == 1 and b"old job" not in r.stdout, r.stdout
    finally:
        (marks / "end").touch()
        holder.wait(30)
