"""The holder guarantee on a git remote (issue 9, case 7), against a real `git daemon`.

A branch that is not a lock is never taken, rewritten or deleted; a holder whose renewals
fail is stopped before its lease can expire; a failure at release keeps the command's status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import CLI, Procs, clean_env, run_cli, wait_for
from helpers import procwatch as pw
from helpers.gitserver import Silent, git_daemon
from helpers.witnessed import witnessed

pytestmark = pytest.mark.timeout(90)

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@localhost",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@localhost",
}


class Server:
    """A git daemon we can kill mid-run; its repository stays readable on disk."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url = root, url
        self.repo = root / "locks.git"

    def daemon_pids(self) -> list[int]:
        port = self.url.split(":")[2].split("/")[0]
        found = []
        for p in pw.all_pids():
            try:
                argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"daemon" in argv and f"--port={port}".encode() in argv:
                found.append(p)
        return found

    def kill(self) -> None:
        """The server goes away: the daemon and every connection it was serving."""
        daemons = self.daemon_pids()
        assert daemons, "git daemon not found"
        for d in daemons:
            victims = [d, *pw.descendants(d)]
            pw.signal_quietly(victims, signal.SIGKILL)
        assert pw.wait_gone(daemons, 5) == []

    def tip(self, branch: str) -> str | None:
        r = subprocess.run(
            ["git", "--git-dir", str(self.repo), "rev-parse", "--verify", "-q", branch],
            capture_output=True,
            text=True,
        )
        return r.stdout.strip() or None

    def body(self, branch: str) -> dict[str, object]:
        """The JSON body of the branch's newest lock commit, read from disk."""
        msg = subprocess.run(
            ["git", "--git-dir", str(self.repo), "log", "-1", "--format=%B", branch],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        data: dict[str, object] = json.loads(msg.partition("\n")[2])
        return data

    def plant_plain_branch(self, branch: str, work: Path) -> str:
        """Push an ordinary commit with a file in it (not a lock) to BRANCH; its oid."""
        work.mkdir()
        git = ["git", "-C", str(work)]
        subprocess.run([*git, "init", "-q"], check=True)
        (work / "README").write_text("not a lock\n")
        subprocess.run([*git, "add", "README"], check=True)
        subprocess.run([*git, "commit", "-qm", "real work"], check=True, env=clean_env(GIT_ENV))
        subprocess.run(
            [*git, "push", "-q", self.url, f"HEAD:refs/heads/{branch}"],
            check=True,
            capture_output=True,
        )
        oid = self.tip(branch)
        assert oid is not None
        return oid


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with git_daemon(tmp_path / "server") as url:
        yield Server(tmp_path / "server", url)


# -- not-a-lock branches and an empty prefix -------------------------------------------------


def test_an_empty_key_prefix_is_refused(server: Server, tmp_path: Path) -> None:
    main = server.plant_plain_branch("main", tmp_path / "work")
    r = run_cli(["hold", "--remote", server.url, "--key-prefix", "", "main"])
    assert r.returncode == 2, r.stderr
    r = run_cli(
        ["run", "--remote", server.url, "--key-prefix", "", "main", "touch ran"], cwd=tmp_path
    )
    assert r.returncode == 2, r.stderr
    assert not (tmp_path / "ran").exists()
    r = run_cli(["release", "--remote", server.url, "--key-prefix", "", "--force", "main"])
    assert r.returncode == 2, r.stderr
    assert server.tip("main") == main


NOT_A_LOCK_OPS = {
    "run": ["run", "--wait", "10", "--poll", "0.5", "--remote", "{url}", "plain", "touch ran"],
    "hold": ["hold", "--wait", "10", "--poll", "0.5", "--remote", "{url}", "plain"],
    "release-force-delete": [
        "release",
        "--remote",
        "{url}",
        "--force",
        "--delete-branch",
        "plain",
    ],
}


@pytest.mark.parametrize("op", sorted(NOT_A_LOCK_OPS))
def test_a_branch_that_is_not_a_lock_is_never_taken_rewritten_or_deleted(
    server: Server, tmp_path: Path, op: str
) -> None:
    oid = server.plant_plain_branch("lock__plain", tmp_path / "work")
    args = [a.replace("{url}", server.url) for a in NOT_A_LOCK_OPS[op]]
    r = run_cli(args, cwd=tmp_path, timeout=40)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert b"lock__plain" in r.stderr, r.stderr
    assert not (tmp_path / "ran").exists()
    assert server.tip("lock__plain") == oid


# -- the holder dies: its lease may lapse only once its command is gone ------------------------


@pytest.mark.parametrize("victim", ["keeper", "callers-group"])
def test_a_killed_remote_holder_is_taken_over_only_once_its_command_is_gone(
    server: Server, marks: Path, tmp_path: Path, victim: str
) -> None:
    """Issue 9 case 1 on a remote: after a SIGKILL the lease lapses and a contender takes
    over — so the command must be gone by then. ``callers-group`` is ``kill -9 -PGID`` (or
    ``timeout -s KILL``): every process in the caller's group at once; the command has a group
    of its own and no descriptor can hold a remote lock for it."""
    lease = ["--remote", server.url, "--lease", "10", "--kill-after", "1"]
    with witnessed(marks) as wit:
        cmd = f"{wit.enter('A')}; touch '{marks}/A.held'; while :; do sleep 0.1; done"
        with open(tmp_path / "a.err", "wb") as err:
            a = subprocess.Popen(
                [*CLI, "run", *lease, "dead", cmd],
                env=clean_env(wit.env("A")),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,  # a group of its own: killing it spares pytest
            )
        try:
            wait_for(marks / "A.held", 30)
            if victim == "keeper":
                a.send_signal(signal.SIGKILL)
            else:
                os.killpg(a.pid, signal.SIGKILL)
            a.wait(10)
            b = run_cli(
                ["run", *lease, "--poll", "0.5", "--wait", "40", "dead", wit.enter("B")],
                env=wit.env("B"),
                timeout=50,
            )
            assert b.returncode == 0, b.stderr
            wit.assert_saw_nobody("B")
        finally:
            if a.poll() is None:
                a.kill()
                a.wait()


# -- renewals fail: the command is stopped before its lease can expire ------------------------


def test_a_lease_too_short_to_stop_the_command_in_is_refused(
    server: Server, tmp_path: Path
) -> None:
    # 3 x (kill_after + 2) = 9 s is the least a 1 s grace allows.
    r = run_cli(
        ["run", "--remote", server.url, "--lease", "5", "--kill-after", "1", "short", "touch ran"],
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    assert b"lease" in r.stderr
    assert not (tmp_path / "ran").exists()
    assert server.tip("lock__short") is None


@pytest.mark.parametrize("failure", ["refused", "hung"])
def test_a_holder_that_cannot_renew_stops_its_command_before_the_lease_expires(
    procs: Procs, server: Server, marks: Path, failure: str
) -> None:
    # refused: the server is gone (connections refused); hung: something else took its
    # port and never answers, so a renewal push hangs — that must not stall the deadline.
    # The command ignores SIGTERM (and so does its sleep): only the KILL step can end it.
    cmd = f"trap '' TERM; echo $$ > '{marks}/pid.tmp'; mv '{marks}/pid.tmp' '{marks}/pid'; "
    cmd += "while :; do sleep 0.1; done"
    cli = procs.start(
        ["run", "--remote", server.url, "--lease", "10", "--kill-after", "1", "renew", cmd]
    )
    wait_for(marks / "pid", 30)
    group = pw.pgid(int((marks / "pid").read_text()))
    assert group is not None
    dead_at: list[float] = []

    def watch() -> None:
        while pw.group_members(group):
            time.sleep(0.02)
        dead_at.append(time.time())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    server.kill()
    # A hung server: it takes the dead daemon's port and never answers.
    hang = Silent(int(server.url.split(":")[2].split("/")[0])) if failure == "hung" else None
    killed_at = time.time()
    # The newest lease the server ever acknowledged (read from its repository on disk).
    expires = float(server.body("lock__renew")["expires_at"])  # type: ignore[arg-type]
    assert expires > killed_at, "the lease had expired before the server went away"
    try:
        watcher.join(max(expires - time.time() + 10, 1))
        assert dead_at, (
            f"the command still ran {time.time() - expires:.1f}s after its lease expired; "
            f"stderr: {procs.stderr(cli)}"
        )
    finally:
        pw.signal_quietly(pw.group_members(group))
        if hang is not None:
            # The release that follows may wait on the hung server (git's own timeout);
            # a server that is gone for good makes it fail at once.
            hang.close()
    status = cli.wait(30)
    # Polled every 20 ms: allow that much after the real end.
    assert dead_at[0] - 0.1 < expires, (dead_at[0] - expires, procs.stderr(cli))
    assert status == 69, (status, procs.stderr(cli))
    err = procs.stderr(cli).lower()
    assert "lease" in err and "lost" in err, err


# -- a failure at release keeps the command's own exit status ---------------------------------


def test_a_failure_at_release_keeps_the_commands_exit_status(
    procs: Procs, server: Server, marks: Path
) -> None:
    cmd = f"touch '{marks}/ready'; while [ ! -e '{marks}/go' ]; do sleep 0.05; done; exit 3"
    cli = procs.start(["run", "--remote", server.url, "rel", cmd])
    wait_for(marks / "ready", 30)
    server.kill()
    (marks / "go").touch()
    status = cli.wait(30)
    err = procs.stderr(cli)
    assert status == 3, (status, err)
    # A warning says the release failed (wording aside): a line besides the two bookends.
    others = [
        line
        for line in err.splitlines()
        if "waiting for lock rel" not in line and "released rel at" not in line
    ]
    assert any("releas" in line.lower() for line in others), err


# -- a keeper that is frozen, not dead --------------------------------------------------------


def test_a_frozen_keeper_cannot_let_the_command_outrun_its_lease(
    procs: Procs, server: Server, marks: Path
) -> None:
    """SIGSTOP the process that renews the lease: it keeps its pipes open, so nothing looks
    dead, yet nothing renews. The supervisor enforces the deadline on its own."""
    cmd = f"trap '' TERM; echo $$ > '{marks}/pid.tmp'; mv '{marks}/pid.tmp' '{marks}/pid'; "
    cmd += "while :; do sleep 0.1; done"
    cli = procs.start(
        ["run", "--remote", server.url, "--lease", "9", "--kill-after", "1", "frozen", cmd]
    )
    wait_for(marks / "pid", 30)
    group = pw.pgid(int((marks / "pid").read_text()))
    assert group is not None
    os.kill(cli.pid, signal.SIGSTOP)
    try:
        expires = float(server.body("lock__frozen")["expires_at"])  # type: ignore[arg-type]
        deadline = time.monotonic() + max(expires - time.time(), 0) + 10
        while pw.group_members(group) and time.monotonic() < deadline:
            time.sleep(0.02)
        dead_at = time.time()
        assert not pw.group_members(group), "the command outlived its lease"
        assert dead_at - 0.1 < expires, dead_at - expires
    finally:
        os.kill(cli.pid, signal.SIGCONT)
        pw.signal_quietly(pw.group_members(group))
    assert cli.wait(60) == 69, procs.stderr(cli)
    assert "lost the lease" in procs.stderr(cli)


def test_a_scratch_repository_a_sigkill_left_behind_goes_with_the_next_remote_call(
    server: Server, marks: Path, tmp_path: Path
) -> None:
    """A remote lock talks through a private repository in TMPDIR; SIGKILL leaves it
    there. The next call of the same user removes it (its process is gone); a live
    holder's stays."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = clean_env({"TMPDIR": str(tmp)})
    remote = ["--remote", server.url, "--lease", "30", "--kill-after", "1"]
    victim = subprocess.Popen(
        [*CLI, "run", *remote, "swept", f"touch '{marks}/held'; exec sleep 1000"],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    live = subprocess.Popen(
        [*CLI, "run", *remote, "other", f"touch '{marks}/live'; exec sleep 1000"],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(marks / "held", 30)
        wait_for(marks / "live", 30)
        assert len(list(tmp.glob("local-mutex-git-*"))) == 2
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)
        assert len(list(tmp.glob("local-mutex-git-*"))) == 2  # left behind
        status = subprocess.run(
            [*CLI, "status", *remote[:2], "third"], env=env, capture_output=True, timeout=60
        )
        assert status.returncode == 0, status.stderr
        left = [p.name for p in tmp.glob("local-mutex-git-*")]
        assert len(left) == 1 and f"-{live.pid}-" in left[0], left
    finally:
        for p in (victim, live):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
