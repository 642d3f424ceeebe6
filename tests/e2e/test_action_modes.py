"""Action modes hold/release/check under act: locks that span steps and jobs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import run_cli, wait_for
from helpers.actions import needs_act, run_act, start_act, workflow

pytestmark = [needs_act, pytest.mark.timeout(300)]


def _state(name: str, locks: Path) -> dict[str, object]:
    r = run_cli(["status", name, "--lock-dir", str(locks), "--json"])
    data: dict[str, object] = json.loads(r.stdout)
    return data


def test_hold_across_steps_blocks_another_run_until_release(tmp_path: Path) -> None:
    locks, marks, log = tmp_path / "locks", tmp_path / "m", tmp_path / "log"
    locks.mkdir()
    marks.mkdir()
    holder_job = start_act(
        tmp_path,
        workflow(f"""
        - uses: ./lm
          with:
            mode: hold
            name: release-train
            lock-dir: {locks}
            message: deploying
        - run: |
            touch {marks}/held
            i=0; while [ ! -e {marks}/go ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
            echo "holder done" >> {log}
        - uses: ./lm
          with:
            mode: release
            name: release-train
            lock-dir: {locks}
        """),
        name="holder",
    )
    try:
        wait_for(marks / "held", 120)
        st = _state("release-train", locks)
        assert st["state"] == "held"
        waiter_job = start_act(
            tmp_path,
            workflow(f"""
            - uses: ./lm
              with:
                name: release-train
                lock-dir: {locks}
                run: echo "waiter ran" >> {log}
            """),
            name="waiter",
        )
        wait_for(
            lambda: len(_state("release-train", locks)["waiters"]) == 1,  # type: ignore[arg-type]
            120,
        )
        assert not log.exists()
        (marks / "go").touch()
        assert "Job succeeded" in holder_job.communicate(timeout=120)[0]
        out = waiter_job.communicate(timeout=120)[0]
        assert "Job succeeded" in out, out
        assert "deploying" in out  # the waiting line carries the hold's message
        assert log.read_text().splitlines() == ["holder done", "waiter ran"]
    finally:
        (marks / "go").touch()
        for job in (holder_job,):
            if job.poll() is None:
                job.kill()


def test_a_release_after_a_skipped_hold_passes_and_ends_nobody_elses(tmp_path: Path) -> None:
    """The documented pattern -- a hold with if-locked: skip, an `if: always()` release --
    failed the job when the hold was skipped: the release found another's hold (77). This
    job holds none, so there is nothing to release; a token given is still refused."""
    locks = tmp_path / "locks"
    locks.mkdir()
    theirs = run_cli(["hold", "--lock-dir", str(locks), "--message", "theirs", "train"])
    assert theirs.returncode == 0, theirs.stderr
    try:
        r = run_act(
            tmp_path,
            workflow(f"""
            - uses: ./lm
              with:
                mode: hold
                name: train
                lock-dir: {locks}
                wait-seconds: 0
                if-locked: skip
            - if: always()
              id: rel
              uses: ./lm
              with:
                mode: release
                name: train
                lock-dir: {locks}
            - run: echo "released=${{{{ steps.rel.outputs.released }}}}"
            - uses: ./lm
              with:
                mode: release
                name: train
                lock-dir: {locks}
                token: not-theirs
            """),
        )
        said = "::warning::local-mutex: nothing released: this job holds no hold of it (the"
        assert f"{said} hold on train" in r.output, r.output
        assert "released=false" in r.step_lines
        assert not r.succeeded and "belongs to another job or token" in r.output  # the token
        assert _state("train", locks)["state"] == "held"
    finally:
        rel = run_cli(["release", "--lock-dir", str(locks), "--force", "train"])
    assert rel.returncode == 0, rel.stderr


def test_a_release_of_a_hold_this_job_lost_fails(tmp_path: Path) -> None:
    """The release that passes where the job took no hold passed where the job's own hold
    was lost too (its ttl ran out, another took the lock): that is a failure to say."""
    locks = tmp_path / "locks"
    locks.mkdir()
    cli = f"{sys.executable} -m local_mutex"
    try:
        r = run_act(
            tmp_path,
            workflow(f"""
            - uses: ./lm
              with:
                mode: hold
                name: lost
                lock-dir: {locks}
                ttl-seconds: 1
            - run: |
                until {cli} -q status --lock-dir {locks} lost; do sleep 0.05; done
                env -u GITHUB_RUN_ID {cli} hold --lock-dir {locks} lost > /dev/null
            - if: always()
              uses: ./lm
              with:
                mode: release
                name: lost
                lock-dir: {locks}
            """),
        )
        assert not r.succeeded, r.output
        assert "this job's hold of lost is gone (its ttl-seconds" in r.output, r.output
        assert "nothing released" not in r.output
    finally:
        rel = run_cli(["release", "--lock-dir", str(locks), "--force", "lost"])
    assert rel.returncode == 0, rel.stderr


def test_check_outputs_and_reentrant_run(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    r = run_act(
        tmp_path,
        workflow(f"""
        - id: free
          uses: ./lm
          with:
            mode: check
            name: c
            lock-dir: {locks}
        - uses: ./lm
          with:
            mode: hold
            name: c
            lock-dir: {locks}
            message: checked
        - id: busy
          uses: ./lm
          with:
            mode: check
            name: c
            lock-dir: {locks}
        - uses: ./lm
          with:
            name: c
            lock-dir: {locks}
            reentrant: "true"
            run: echo "inside my own hold"
        - id: rel
          uses: ./lm
          with:
            mode: release
            name: c
            lock-dir: {locks}
        - uses: ./lm
          with:
            mode: hold
            name: pool
            lock-dir: {locks}
            slots: "2"
        - id: rel-slots
          uses: ./lm
          with:
            mode: release
            name: pool
            lock-dir: {locks}
        - run: |
            echo "free=$FREE busy=$BUSY"
            echo "released=${{{{ steps.rel.outputs.released }}}}"
            echo "slot hold released=${{{{ steps.rel-slots.outputs.released }}}}"
            case "$HOLDER" in *'"message":"checked"'*) echo "holder-msg=checked";; esac
          env:
            FREE: ${{{{ steps.free.outputs.locked }}}}
            BUSY: ${{{{ steps.busy.outputs.locked }}}}
            HOLDER: ${{{{ steps.busy.outputs.holder }}}}
        """),
    )
    assert r.succeeded, r.output
    assert "free=false busy=true" in r.step_lines
    assert "released=true" in r.step_lines
    assert "holder-msg=checked" in r.step_lines
    assert "inside my own hold" in r.step_lines
    assert _state("c", locks)["state"] == "free"
    # A release step without slots: ends the job's hold of the slots (the plain lock is free).
    assert "slot hold released=true" in r.step_lines
    assert _state("pool", locks)["slots_in_use"] == 0


def test_a_job_that_never_releases_frees_the_lock_when_it_ends(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    r = run_act(
        tmp_path,
        workflow(f"""
        - uses: ./lm
          with:
            mode: hold
            name: forgotten
            lock-dir: {locks}
        - run: echo "job ends without a release"
        """),
    )
    assert r.succeeded, r.output
    wait_for(lambda: _state("forgotten", locks)["state"] == "free", 15)


def test_bad_mode_and_run_with_hold_are_refused(tmp_path: Path) -> None:
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          with:
            mode: grab
            name: x
        """),
    )
    assert not r.succeeded and "mode must be one of run, hold, release, check" in r.output
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          with:
            mode: hold
            name: x
            run: echo never
        """),
        name="p2",
    )
    assert not r.succeeded and "run: is only for mode: run" in r.output
    # An unset secret as the remote: refused, not a lock on this machine alone.
    r = run_act(
        tmp_path,
        workflow(f"""
        - uses: ./lm
          with:
            name: x
            remote: ${{{{ secrets.NOT_SET }}}}
            run: touch {tmp_path}/ran
        """),
        name="p3",
    )
    said = "::error::local-mutex: remote is empty (an unset secret?)"
    assert not r.succeeded and said in r.output, r.output
    assert not (tmp_path / "ran").exists()


def test_remote_modes_against_a_git_server(tmp_path: Path) -> None:
    from helpers.gitserver import git_daemon

    with git_daemon(tmp_path / "server") as url:
        r = run_act(
            tmp_path,
            workflow(f"""
            - id: hold
              uses: ./lm
              with:
                mode: hold
                name: fleet-deploy
                remote: {url}
                message: cross-machine
            - id: check
              uses: ./lm
              with:
                mode: check
                name: fleet-deploy
                remote: {url}
            - uses: ./lm
              with:
                mode: release
                name: fleet-deploy
                remote: {url}
            - uses: ./lm
              with:
                name: fleet-deploy
                remote: {url}
                wait-seconds: "30"
                run: echo "ran under the remote lock"
            - run: echo "locked=$LOCKED token-set=${{{{ steps.hold.outputs.token != '' }}}}"
              env:
                LOCKED: ${{{{ steps.check.outputs.locked }}}}
            """),
        )
        assert r.succeeded, r.output
        assert "locked=true token-set=true" in r.step_lines
        assert "ran under the remote lock" in r.step_lines
        hist = run_cli(["history", "fleet-deploy", "--remote", url, "--json"])
        events = [e["event"] for e in json.loads(hist.stdout)]
        assert events == ["lock", "unlock", "lock", "unlock"]
