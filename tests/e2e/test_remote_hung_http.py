"""An http(s) remote that never answers: git talks to it through a helper process
(git-remote-http) of its own. When local-mutex gives up on git -- a stop signal, a
timeout -- that helper must end too, not stay blocked on the hung server after we exit."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from helpers import CLI, clean_env, wait_for
from helpers import procwatch as pw
from helpers.gitserver import Silent
from local_mutex.backends.git.plumbing import Git
from local_mutex.errors import Unavailable

pytestmark = pytest.mark.timeout(60)

TAG = "LOCAL_MUTEX_TEST_RUN"  # in every process of the run's environment, helpers included


@pytest.fixture
def silent() -> Iterator[Silent]:
    s = Silent()
    yield s
    s.close()


def _helpers(tag: str) -> list[int]:
    """Live git-remote-http(s) processes started for this run."""
    return [p for p in pw.tagged(TAG, tag) if "git-remote-http" in " ".join(pw.argv(p))]


def _left(tag: str) -> list[tuple[int, list[str]]]:
    """Every process of this run still alive a moment after it ended (SIGKILL is
    asynchronous: allow them to finish dying), with its command line."""
    left = pw.wait_gone(pw.tagged(TAG, tag), 5)
    return [(p, pw.argv(p)) for p in left]


@pytest.mark.parametrize(
    ("verb", "sig"),
    [("run", signal.SIGTERM), ("hold", signal.SIGINT)],
)
def test_a_stop_signal_leaves_no_git_helper_behind(silent: Silent, verb: str, sig: int) -> None:
    tag = uuid.uuid4().hex
    args = ["hold", "x"] if verb == "hold" else ["x", "true"]
    cli = subprocess.Popen(
        [*CLI, "--remote", silent.url, *args],
        env=clean_env({TAG: tag}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # The helper is up and its request is in: it now waits on a server that never answers.
        wait_for(lambda: _helpers(tag) and silent.held, 30, "git-remote-http connected")
        cli.send_signal(sig)
        _, err = cli.communicate(timeout=30)
        assert cli.returncode == 128 + sig, err
        assert b"did not run" in err or b"nothing was done" in err, err
        assert _left(tag) == []
    finally:
        cli.kill()
        cli.wait()
        pw.signal_quietly(pw.tagged(TAG, tag))


@pytest.mark.parametrize("call", ["head", "fetch"])
def test_a_git_timeout_leaves_no_git_helper_behind(silent: Silent, call: str) -> None:
    tag = uuid.uuid4().hex
    git = Git(silent.url, {**clean_env(), TAG: tag})
    git.timeout = 1.0
    try:
        with pytest.raises(Unavailable, match="timed out after 1s"):
            getattr(git, call)("refs/heads/lock__x")
        assert silent.held, "git never reached the server"
        assert _left(tag) == []
    finally:
        git.close()
        pw.signal_quietly(pw.tagged(TAG, tag))
    assert os.path.isdir(git.dir) is False


@pytest.mark.parametrize(
    ("verb", "ceiling"),
    [("run", ["--no-wait"]), ("hold", ["--wait", "1"])],
)
def test_a_wait_ceiling_holds_against_a_remote_that_never_answers(
    silent: Silent, verb: str, ceiling: list[str]
) -> None:
    """Each git call may take 60 s; a take bounded by --wait (or --no-wait) gives up within
    it and a few seconds' grace (a push to a distant server takes a second or two) -- it
    took the full 60 s -- and says it was not acquired (75), leaving no git helper."""
    tag = uuid.uuid4().hex
    args = ["hold", "x"] if verb == "hold" else ["x", "true"]
    r = subprocess.run(
        [*CLI, "--remote", silent.url, *ceiling, *args],
        env=clean_env({TAG: tag}),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=40,
    )
    assert r.returncode == 75, r.stderr
    assert b"not acquired after" in r.stderr and b"timed out" in r.stderr, r.stderr
    assert _left(tag) == []
