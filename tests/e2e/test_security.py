"""A shared, world-writable lock dir must not be turned against the user."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from helpers import CLI, clean_env, lock_file, lock_is_free, run_cli


def test_planted_symlink_to_an_existing_file_is_refused(
    lock_dir: Path, tmp_path: Path, marks: Path
) -> None:
    victim = tmp_path / "precious"
    victim.write_bytes(b"keep me\n")
    before = victim.stat()
    lock_file(lock_dir, "n").symlink_to(victim)
    r = run_cli(["n", f"touch '{marks}/ran'", str(lock_dir)])
    assert r.returncode == 2
    assert b"is a symlink" in r.stderr
    assert victim.read_bytes() == b"keep me\n"
    assert victim.stat().st_mtime_ns == before.st_mtime_ns
    assert not (marks / "ran").exists()


def test_dangling_symlink_is_refused_and_its_target_not_created(
    lock_dir: Path, tmp_path: Path, marks: Path
) -> None:
    target = tmp_path / "would-be-created"
    lock_file(lock_dir, "n").symlink_to(target)
    r = run_cli(["n", f"touch '{marks}/ran'", str(lock_dir)])
    assert r.returncode == 2
    assert b"is a symlink" in r.stderr
    assert not target.exists()
    assert not (marks / "ran").exists()


def test_fifo_or_directory_at_the_lock_path_is_refused(lock_dir: Path, marks: Path) -> None:
    os.mkfifo(lock_file(lock_dir, "fifo"))
    r = run_cli(["fifo", f"touch '{marks}/ran'", str(lock_dir)], timeout=20)
    assert r.returncode == 2 and b"not a regular file" in r.stderr
    lock_file(lock_dir, "dir").mkdir()
    r = run_cli(["dir", f"touch '{marks}/ran'", str(lock_dir)])
    assert r.returncode == 2
    assert not (marks / "ran").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_lock_file_owned_by_another_user_is_refused_unless_allowed(
    lock_dir: Path, marks: Path
) -> None:
    path = lock_file(lock_dir, "theirs")
    path.touch()
    os.chown(path, 12345, 12345)
    r = run_cli(["theirs", f"touch '{marks}/ran'", str(lock_dir)])
    assert r.returncode == 2
    assert b"owned by uid 12345" in r.stderr and b"--allow-other-owner" in r.stderr
    assert not (marks / "ran").exists()
    r = run_cli(["--allow-other-owner", "theirs", "echo ok", str(lock_dir)])
    assert r.returncode == 0 and r.stdout == b"ok\n"
    r = run_cli(["theirs", "echo ok", str(lock_dir)], env={"LOCAL_MUTEX_ALLOW_OTHER_OWNER": "1"})
    assert r.returncode == 0 and r.stdout == b"ok\n"
    assert path.exists()  # never unlinked


@pytest.mark.parametrize("umask", ["022", "002"])
def test_new_lock_file_mode_is_0644_whatever_the_umask(lock_dir: Path, umask: str) -> None:
    """Common default umasks; umask 0 and 077 for every verb are in test_hostile.py."""
    import subprocess
    import sys

    r = subprocess.run(
        ["sh", "-c", f'umask {umask}; exec "{sys.executable}" -m local_mutex n true "{lock_dir}"'],
        capture_output=True,
        timeout=20,
    )
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(lock_file(lock_dir, "n").stat().st_mode) == 0o644


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/<pid>/fd")
def test_the_command_inherits_the_lock_and_a_normal_end_drops_it(
    lock_dir: Path, marks: Path
) -> None:
    """The command shares the lock's open file description (so the lock outlives a killed
    supervisor while the command runs), but a normal end drops it with LOCK_UN: leftover
    background processes that still hold the descriptor run on unlocked."""
    r = run_cli(["n", 'ls -l /proc/$$/fd/ | grep -c "local-mutex-" || true', str(lock_dir)])
    assert int(r.stdout.strip()) >= 1
    leftover = f"sleep 30 >/dev/null 2>&1 & echo $! > '{marks}/pid'"
    r = run_cli(["n", leftover, str(lock_dir)])
    assert r.returncode == 0, r.stderr
    pid = int((marks / "pid").read_text())
    try:
        assert lock_is_free(lock_file(lock_dir, "n"))
        assert run_cli(["--no-wait", "n", "true", str(lock_dir)]).returncode == 0
    finally:
        os.kill(pid, signal.SIGKILL)


# Another user's trap in a shared lock dir: a file created at the lock path before us (or
# after a tmp cleaner), deleted, and kept open unlocked; armed later as a fake "hold" of
# ours -- locked, a forged record with our hold's token hash, and the hold's socket.
FAKE_HOLD = """
import fcntl, json, os, socket, sys, time
path, arm, said = sys.argv[1:4]
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
os.unlink(path)
open(said + ".planted", "w").close()
while not os.path.exists(arm):
    time.sleep(0.02)
forged = {**json.load(open(arm)), "pid": os.getpid()}
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, (json.dumps(forged) + "\\n").encode(), 0)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind("\\0local-mutex-hold-%d-%s" % (os.getpid(), forged["token_sha256"][:16]))
server.listen(8)
open(said + ".armed", "w").close()
kept = []
while True:
    conn, _ = server.accept()
    with open(said, "ab") as f:
        f.write(conn.recv(4096))
    socket.send_fds(conn, [b"ok\\n"], [fd])
    kept.append(conn)
"""


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="the look past a deleted file")
def test_another_users_deleted_file_never_passes_for_our_hold(marks: Path) -> None:
    """Root sees every process's descriptors: it took another user's planted, deleted
    file for its job's hold's lost file -- `run --reentrant` told that user its job and ran
    beside the lock's holder, `release` ended that user's process instead of the hold."""
    import json
    import subprocess

    from helpers import wait_for
    from helpers.otheruser import as_other_user

    job = {"GITHUB_RUN_ID": "7", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_JOB": "j", "RUNNER_NAME": "r"}
    with as_other_user() as other:
        locks = other.shared_dir("locks", 0o1777)
        talk = other.shared_dir("talk", 0o1777)
        script, arm, said = other.base / "fake_hold.py", other.base / "arm.json", talk / "said"
        script.write_text(FAKE_HOLD)
        script.chmod(0o644)
        path = lock_file(locks, "db")
        attacker = subprocess.Popen(
            [*other.drop, other.python, str(script), str(path), str(arm), str(said)],
            env=other.env(),
            cwd="/",
        )
        hold, release = ["-q", "hold", "db", "--lock-dir", str(locks)], ["release", "db"]
        reentrant = ["run", "--reentrant", "--no-wait", "--lock-dir", str(locks)]
        try:
            wait_for(Path(f"{said}.planted"))
            assert run_cli(hold, env=job).returncode == 0
            real = json.loads(path.read_text().splitlines()[0])  # the job's, to copy
            assert run_cli([*release, "--lock-dir", str(locks)], env=job).returncode == 0
            arm.write_text(json.dumps({k: v for k, v in real.items() if k != "pid"}))
            arm.chmod(0o644)
            wait_for(Path(f"{said}.armed"))

            held, go = marks / "held", marks / "go"
            holder = subprocess.Popen(
                [
                    *CLI,
                    "db",
                    f"touch '{held}'; until [ -e '{go}' ]; do sleep 0.05; done",
                    str(locks),
                ],
                env=clean_env(),
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_for(held)
                r = run_cli(
                    [*reentrant, "db", f"touch '{marks}/beside'"],
                    env=job,
                )
                assert r.returncode == 75, r.stderr
                assert not (marks / "beside").exists()
            finally:
                go.touch()
                assert holder.wait(30) == 0

            assert run_cli(hold, env=job).returncode == 0
            r = run_cli([*release, "--lock-dir", str(locks)], env=job)
            assert r.returncode == 0, r.stderr
            assert str(attacker.pid).encode() not in r.stderr
            assert attacker.poll() is None  # never signalled
            wait_for(lambda: lock_is_free(path), what="the real hold ended")
            assert not said.exists() or said.read_bytes() == b""  # heard nothing of ours
        finally:
            attacker.kill()
            attacker.wait(10)


def test_a_lock_dir_others_can_swap_files_in_is_used_with_a_warning(tmp_path: Path) -> None:
    """Anybody may write it and it is not sticky (or it is another user's symlink): any
    user can replace its lock files, and callers then lock apart. Said, not refused (shared
    directories made with mkdir -m 777 are common; chmod +t is the fix)."""

    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    r = run_cli(["n", "true", str(d)])
    assert r.returncode == 0 and b"writable by every user and not sticky" in r.stderr
    assert b"writable by every user" not in run_cli(["status", "n", "--lock-dir", str(d)]).stderr
    d.chmod(0o1777)
    r = run_cli(["n", "true", str(d)])
    assert r.returncode == 0 and b"warning" not in r.stderr and b"sticky" not in r.stderr
    if os.geteuid() == 0:  # a symlink of another user's, to a directory of ours
        link = tmp_path / "theirs"
        link.symlink_to(d)
        os.lchown(link, 65534, 65534)
        r = run_cli(["n", "true", str(link)])
        assert r.returncode == 0 and b"a symlink of another user's (uid 65534)" in r.stderr
