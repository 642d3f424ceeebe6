"""A stop signal while the lock push is under way (against a real `git daemon`).

The server applies a push it has received whatever becomes of the client: giving up on
ours must not leave the branch locked behind a "the command did not run". A pre-receive
hook holds chosen pushes on the server (``gitserver.gate_pushes``): push 1 is the lock
push, push 2 what local-mutex sends once stopped.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import CLI, clean_env, hold_until, read_pid, run_cli, wait_for
from helpers import procwatch as pw
from helpers.gitserver import gate_pushes, git_daemon, lock_state

pytestmark = pytest.mark.timeout(60)


class Gated:
    def __init__(self, url: str, repo: Path, marks: Path) -> None:
        self.url, self.repo, self.marks = url, repo, marks

    def hold(self, n: int) -> None:
        (self.marks / f"hold.{n}").touch()

    def go(self, n: int) -> None:
        (self.marks / f"go.{n}").touch()

    def inflight(self, n: int) -> None:
        wait_for(self.marks / f"inflight.{n}", 30)

    def over(self, n: int) -> None:
        """Wait until the server is done with push N (applied or refused)."""
        pid = read_pid(self.marks / f"server.{n}", 30)
        assert pw.wait_gone([pid], 30) == [], f"push {n} still on the server"

    def tip_message(self, branch: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", str(self.repo), "log", "-1", "--format=%B", branch],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    def events(self, name: str) -> list[str]:
        r = run_cli(["history", name, "--remote", self.url, "--json"])
        assert r.returncode == 0, r.stderr
        return [e["event"] for e in json.loads(r.stdout)]  # oldest first

    def state(self, name: str) -> str:
        return lock_state(self.url, name)


@pytest.fixture
def gated(tmp_path: Path, marks: Path) -> Iterator[Gated]:
    with git_daemon(tmp_path / "server") as url:
        repo = tmp_path / "server" / "locks.git"
        gate_pushes(repo, marks)
        g = Gated(url, repo, marks)
        try:
            yield g
        finally:
            for n in range(1, 10):  # nothing stays held on the server
                g.go(n)


def _start(verb: str, gated: Gated, tmp_path: Path) -> subprocess.Popen[bytes]:
    args = ["hold", "x"] if verb == "hold" else ["x", f"touch '{tmp_path}/ran'"]
    return subprocess.Popen(
        [*CLI, "--remote", gated.url, *args],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _stopped(cli: subprocess.Popen[bytes], sig: int, tmp_path: Path) -> str:
    """The CLI's stderr once it ended as a stopped waiter does."""
    out, err = cli.communicate(timeout=40)
    text = err.decode()
    assert cli.returncode == 128 + sig, text
    # A run's command did not run; a hold has none: nothing was done.
    assert "the command did not run" in text or "nothing was done" in text, text
    assert out == b"", out  # no token: nothing was held
    assert not (tmp_path / "ran").exists()
    return text


@pytest.mark.parametrize(
    ("verb", "sig"),
    [
        ("run", signal.SIGTERM),
        ("hold", signal.SIGTERM),
        ("run", signal.SIGINT),
        ("hold", signal.SIGINT),
    ],
)
def test_a_stop_signal_during_the_lock_push_leaves_the_branch_free(
    gated: Gated, tmp_path: Path, verb: str, sig: int
) -> None:
    gated.hold(1)
    cli = _start(verb, gated, tmp_path)
    try:
        gated.inflight(1)
        cli.send_signal(sig)
        gated.go(1)  # the server goes on with the push we gave up on
        _stopped(cli, sig, tmp_path)
        gated.over(1)
        assert gated.state("x") == "free"
        r = run_cli(["--no-wait", "--remote", gated.url, "x", "echo next"])
        assert r.returncode == 0 and r.stdout == b"next\n", r.stderr
    finally:
        cli.kill()
        cli.wait()


@pytest.mark.parametrize(("verb", "sig"), [("hold", signal.SIGTERM), ("run", signal.SIGINT)])
def test_a_lock_push_that_lands_after_the_signal_is_let_go_again(
    gated: Gated, tmp_path: Path, verb: str, sig: int
) -> None:
    """The push lands while local-mutex is already stopping: it unlocks it (by CAS)."""
    gated.hold(1)
    gated.hold(2)
    cli = _start(verb, gated, tmp_path)
    try:
        gated.inflight(1)
        cli.send_signal(sig)
        gated.inflight(2)  # what it sends to keep push 1 out, held in turn
        gated.go(1)
        gated.over(1)
        assert gated.tip_message("lock__x").startswith("lock by "), "push 1 did not land"
        gated.go(2)  # too late: refused, the branch moved
        text = _stopped(cli, sig, tmp_path)
        assert "was undone" in text, text
        assert gated.state("x") == "free"
        assert gated.events("x") == ["lock", "unlock"]
    finally:
        cli.kill()
        cli.wait()


@pytest.mark.parametrize(("verb", "sig"), [("hold", signal.SIGINT), ("run", signal.SIGTERM)])
def test_a_lock_push_that_would_land_after_exit_cannot(
    gated: Gated, tmp_path: Path, verb: str, sig: int
) -> None:
    """local-mutex has exited before the server goes on with the push: it is refused."""
    gated.hold(1)
    gated.hold(2)
    cli = _start(verb, gated, tmp_path)
    try:
        gated.inflight(1)
        cli.send_signal(sig)
        gated.inflight(2)
        gated.go(2)
        _stopped(cli, sig, tmp_path)
        gated.go(1)
        gated.over(1)
        assert gated.state("x") == "free"
        assert "lock" not in gated.events("x"), "push 1 landed"
    finally:
        cli.kill()
        cli.wait()


def test_a_server_that_does_not_answer_the_undo_is_said_plainly(
    gated: Gated, tmp_path: Path
) -> None:
    """Neither push 1 nor the one meant to keep it out gets through in time: the message
    says the branch may stay locked, and until when, rather than nothing."""
    gated.hold(1)
    gated.hold(2)
    cli = _start("run", gated, tmp_path)
    try:
        gated.inflight(1)
        cli.send_signal(signal.SIGTERM)
        text = _stopped(cli, signal.SIGTERM, tmp_path)
        assert "could not be undone" in text and "may stay held until its lease" in text, text
    finally:
        cli.kill()
        cli.wait()


def test_a_lock_push_acknowledged_too_late_for_its_lease_runs_nothing(
    gated: Gated, tmp_path: Path
) -> None:
    """A server that takes longer to acknowledge the lock push than the lease leaves (here
    4.5 s of 6: the command would be stopped as it starts, and the lease runs out while it
    is being stopped) must not start the command at all: it let go again, exit 69."""
    gated.hold(1)
    args = ["--remote", gated.url, "--lease", "6", "--kill-after", "0"]
    cli = subprocess.Popen(
        [*CLI, *args, "x", f"touch '{tmp_path}/ran'"],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    gated.inflight(1)
    time.sleep(4.5)  # the slow server: past the point the command would have to stop
    gated.go(1)
    _, err = cli.communicate(timeout=40)
    assert cli.returncode == 69, err
    assert b"too late to run anything under a 6s lease" in err, err
    assert not (tmp_path / "ran").exists()
    assert gated.state("x") == "free"


@pytest.mark.parametrize("end", ["exits", "SIGINT"])
def test_a_renewal_the_server_holds_does_not_hold_the_caller_after_the_command(
    gated: Gated, marks: Path, end: str
) -> None:
    """Push 2, the first renewal, hangs on the server; the command then ends, by itself or
    stopped by a Ctrl-C. The renewal is cut short at once: the caller used to wait for
    its deadline (a third of the lease: 20 min with --lease 3600) before letting go."""
    gated.hold(2)
    command = f"touch '{marks}/ran'; " + hold_until(marks)
    cli = subprocess.Popen(
        [*CLI, "--remote", gated.url, "--lease", "24", "--kill-after", "0", "x", command],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    gated.inflight(2)  # 8 s in: the renewal waits on the server, its deadline 8 s away
    t0 = time.monotonic()
    if end == "exits":
        (marks / "h.go").touch()
    else:
        cli.send_signal(signal.SIGINT)
    _, err = cli.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    assert cli.returncode == (0 if end == "exits" else 130), err.decode()
    assert elapsed < 4.0, f"the caller took {elapsed:.1f}s after the command's end"
    assert "could not renew" not in err.decode()
    gated.go(2)
    gated.over(2)  # the renewal reached the server after the unlock: its CAS fails
    assert gated.state("x") == "free"
