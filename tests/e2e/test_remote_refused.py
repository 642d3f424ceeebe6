"""A renewal or release push that the server refuses once while the branch stays ours
(against a real `git daemon`): a failed push, not a lock that changed hands."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Procs, hold_until, wait_for
from helpers.gitserver import git_daemon, lock_state, refuse_once

pytestmark = pytest.mark.timeout(60)


class Server:
    def __init__(self, url: str, repo: Path, marks: Path) -> None:
        self.url, self.repo, self.marks = url, repo, marks

    def tip(self, branch: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", str(self.repo), "rev-parse", "--verify", "-q", branch],
            capture_output=True,
            text=True,
        ).stdout.strip()

    def refuse_next_push(self) -> None:
        (self.marks / "refuse.armed").touch()

    def state(self, name: str) -> str:
        return lock_state(self.url, name)


@pytest.fixture
def server(tmp_path: Path, marks: Path) -> Iterator[Server]:
    with git_daemon(tmp_path / "server") as url:
        repo = tmp_path / "server" / "locks.git"
        refuse_once(repo, marks)
        yield Server(url, repo, marks)


def test_a_refused_renewal_is_retried_not_taken_for_a_lost_lock(
    procs: Procs, server: Server, marks: Path
) -> None:
    # The first renewal comes 4 s in; without one the command must be stopped 9 s in (the
    # lease, less --kill-after and 2 s): a retry a second later has time to spare.
    cli = procs.start(
        [
            "run",
            "--remote",
            server.url,
            "--lease",
            "12",
            "--kill-after",
            "1",
            "r",
            hold_until(marks),
        ]
    )
    wait_for(marks / "h.held", 30)
    server.refuse_next_push()  # the first renewal
    wait_for(marks / "refuse.done", 30)
    refused_at = server.tip("lock__r")  # a refused push leaves the branch where it was
    wait_for(
        lambda: server.tip("lock__r") != refused_at or cli.poll() is not None,
        30,
        "a renewal after the refused one",
    )
    (marks / "h.go").touch()
    assert cli.wait(30) == 0, procs.stderr(cli)
    err = procs.stderr(cli)
    assert "could not renew the lease on r yet" in err and "stayed ours" in err, err
    assert "lost" not in err and "taken over" not in err, err
    assert server.state("r") == "free"


def test_a_refused_release_is_retried_not_taken_for_a_lost_lock(
    procs: Procs, server: Server, marks: Path
) -> None:
    cli = procs.start(["run", "--remote", server.url, "rel", hold_until(marks)])
    wait_for(marks / "h.held", 30)
    server.refuse_next_push()  # the release: the lease (60 s) is not renewed before it
    (marks / "h.go").touch()
    assert cli.wait(30) == 0, procs.stderr(cli)
    assert (marks / "refuse.done").exists()
    err = procs.stderr(cli)
    assert "changed hands" not in err and "could not release" not in err, err
    assert server.state("rel") == "free"
