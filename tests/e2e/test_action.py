"""The composite action under a real Actions runtime (act, host mode, offline)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import (
    CLI,
    clean_env,
    hold_until,
    lock_file,
    lock_is_free,
    read_pid,
    run_cli,
    wait_for,
)
from helpers import procwatch as pw
from helpers.actions import needs_act, run_act, start_act, workflow

pytestmark = [needs_act, pytest.mark.timeout(300)]


def test_success_outputs_and_summary(tmp_path: Path) -> None:
    r = run_act(
        tmp_path,
        workflow(
            """
        - id: lock
          uses: ./lm
          with:
            name: demo lock
            run: |
              echo "cwd=$PWD ws=$GITHUB_WORKSPACE"
              echo "step=$STEP_VAR job=$JOB_VAR"
              echo "plain=1" >> "$GITHUB_OUTPUT"
              printf 'multi<<EOT\\nline one\\nline two\\nEOT\\n' >> "$GITHUB_OUTPUT"
          env:
            STEP_VAR: from-step
        - run: cat "${{ steps.lock.outputs.output-file }}" >> "$GITHUB_OUTPUT"
          id: fwd
        - run: |
            echo "acquired=${{ steps.lock.outputs.acquired }}"
            echo "plain=${{ steps.fwd.outputs.plain }}"
            [ "$MULTI" = "$(printf 'line one\\nline two')" ] && echo "multi ok"
            echo "held=${{ steps.lock.outputs.held-seconds }}"
          env:
            MULTI: ${{ steps.fwd.outputs.multi }}
        """,
            job_env="JOB_VAR: from-job",
        ),
    )
    assert r.succeeded, r.output
    lines = r.step_lines
    cwd = next(x for x in lines if x.startswith("cwd="))
    assert cwd.split()[0][4:] == cwd.split()[1][3:]  # the command runs in $GITHUB_WORKSPACE
    assert "step=from-step job=from-job" in lines
    assert "acquired=true" in lines and "plain=1" in lines
    assert "multi ok" in lines
    held = next(x for x in lines if x.startswith("held="))
    assert float(held[5:]) >= 0
    assert "local-mutex: waiting for lock demo lock at" in r.output
    assert "local-mutex: released demo lock at" in r.output
    assert "| `demo lock` |" in r.output  # the job summary row


def test_failing_command_fails_the_step_with_its_status(tmp_path: Path) -> None:
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          with:
            name: fail
            run: |
              false
              echo "no set -e imposed"
              exit 7
        - if: always()
          run: echo "after"
        """),
    )
    assert not r.succeeded
    assert "no set -e imposed" in r.step_lines
    assert "exit status 7" in r.output or "exit code 7" in r.output, r.output
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          with:
            name: fail
            run: |
              set -e
              false
              echo "not reached"
        """),
        name="p2",
    )
    assert not r.succeeded and "not reached" not in r.step_lines


@pytest.mark.parametrize(("field", "value"), [("name", "' '"), ("run", "' '"), ("name", "''")])
def test_empty_inputs_fail_without_running(tmp_path: Path, field: str, value: str) -> None:
    other = "run" if field == "name" else "name"
    r = run_act(
        tmp_path,
        workflow(f"""
        - uses: ./lm
          with:
            {field}: {value}
            {other}: {"touch ran-marker" if other == "run" else "n"}
        - if: always()
          run: test ! -e ran-marker && echo "did not run"
        """),
    )
    assert not r.succeeded
    assert "did not run" in r.step_lines
    assert "::error::local-mutex:" in r.output or "local-mutex: " in r.output


def test_lock_dir_input_routes_the_lock_file(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    r = run_act(
        tmp_path,
        workflow(f"""
        - uses: ./lm
          with:
            name: routed
            lock-dir: {locks}
            run: |
              echo "dir=$LOCAL_MUTEX_LOCK_DIR"
              sh "$LOCAL_MUTEX_CLI" nested-inherits true
        """),
    )
    assert r.succeeded, r.output
    assert f"dir={locks}" in r.step_lines
    assert lock_file(locks, "routed").exists() and lock_file(locks, "nested-inherits").exists()


def test_cli_reinvocable_and_per_item_loop(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    r = run_act(
        tmp_path,
        workflow(f"""
        - uses: ./lm
          with:
            name: sweep
            lock-dir: {locks}
            run: |
              for key in a "b c" '$(touch pwned)'; do
                KEY="$key" sh "$LOCAL_MUTEX_CLI" "item-$key" 'echo "item:$KEY"'
              done
              "$LOCAL_MUTEX_CLI" sweep 'echo reentrant-ok'
              test ! -e pwned && echo "no injection"
        """),
    )
    assert r.succeeded, r.output
    for item in ("item:a", "item:b c", "item:$(touch pwned)", "reentrant-ok", "no injection"):
        assert item in r.step_lines
    assert lock_file(locks, "item-b c").exists()


def test_if_locked_skip_and_wait_zero(tmp_path: Path, marks: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    holder = subprocess.Popen(
        [*CLI, "busy", hold_until(marks), str(locks)], env=clean_env(), stderr=subprocess.DEVNULL
    )
    try:
        wait_for(marks / "h.held")
        r = run_act(
            tmp_path,
            workflow(f"""
            - id: skip
              uses: ./lm
              with:
                name: busy
                lock-dir: {locks}
                wait-seconds: 0
                if-locked: skip
                run: touch ran-marker
            - run: echo "acquired=${{{{ steps.skip.outputs.acquired }}}}"
            - id: fail
              uses: ./lm
              with:
                name: busy
                lock-dir: {locks}
                wait-seconds: "0.5"
                run: touch ran-marker
            - if: always()
              run: |
                echo "fail-outcome=${{{{ steps.fail.outcome }}}}"
                test ! -e ran-marker && echo "never ran"
            """),
        )
    finally:
        (marks / "h.go").touch()
        holder.wait(20)
    assert "acquired=false" in r.step_lines
    assert "fail-outcome=failure" in r.step_lines and "never ran" in r.step_lines
    assert f"held by pid {holder.pid}" in r.output


def test_setup_action_then_plain_steps_take_locks(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    r = run_act(
        tmp_path,
        workflow(f"""
        - id: setup
          uses: ./lm/setup
          with:
            lock-dir: {locks}
            python: {sys.executable}
        - run: |
            local-mutex later-step 'echo "via PATH"'
            sh "$LOCAL_MUTEX_CLI" later-step 'echo "via CLI var"'
            sh "${{{{ steps.setup.outputs.cli }}}}" later-step 'echo "via output"'
            local-mutex status later-step --json | grep -q '"state":"free"' && echo "status ok"
        - uses: ./lm
          with:
            name: later-step
            run: echo "action shares the domain $LOCAL_MUTEX_LOCK_DIR"
        """),
    )
    assert r.succeeded, r.output
    for text in (
        "via PATH",
        "via CLI var",
        "via output",
        "status ok",
        f"action shares the domain {locks}",
    ):
        assert text in r.step_lines
    assert lock_file(locks, "later-step").exists()


def test_bare_runner_python_without_click(tmp_path: Path) -> None:
    bare = tmp_path / "bare-python"
    # -S: no site-packages at all, so nothing but the standard library is importable.
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    r = run_act(
        tmp_path,
        workflow(f"""
        - run: {bare} -c 'import click' 2>/dev/null || echo "no click here"
        - uses: ./lm
          with:
            name: bare
            python: {bare}
            wait-seconds: "5"
            run: echo "ran on a bare python"
        """),
    )
    assert r.succeeded, r.output
    assert "no click here" in r.step_lines and "ran on a bare python" in r.step_lines


def test_a_python_input_that_is_not_a_python_fails_the_step(tmp_path: Path) -> None:
    """``python: /bin/true``: the step succeeded, with no lock taken, no command run and no
    outputs; the setup step succeeded too, and later steps had no CLI."""
    r = run_act(
        tmp_path,
        workflow(f"""
        - id: lock
          uses: ./lm
          with:
            name: not-python
            python: /bin/true
            run: touch {tmp_path}/ran
        - if: always()
          run: echo "outcome=$OUTCOME acquired=$ACQUIRED"
          env:
            OUTCOME: ${{{{ steps.lock.outcome }}}}
            ACQUIRED: ${{{{ steps.lock.outputs.acquired }}}}
        - id: setup
          if: always()
          uses: ./lm/setup
          with:
            python: /bin/true
        - if: always()
          run: echo "setup=${{{{ steps.setup.outcome }}}}"
        """),
    )
    assert not r.succeeded, r.output
    assert not (tmp_path / "ran").exists()
    assert "outcome=failure acquired=false" in r.step_lines
    assert "setup=failure" in r.step_lines
    errors = [x for x in r.output.splitlines() if "::error::local-mutex: '/bin/true'" in x]
    assert len(errors) == 2, r.output


def test_an_index_that_never_answers_is_one_warning_of_a_few_seconds(tmp_path: Path) -> None:
    """Setup on a python without click, with a package index that takes connections and
    never answers: each such step stalled ~100 s in pip's retries, whose warnings flooded
    the log. One warning annotation now, and the next setup step does not ask again."""
    import socket

    bare = tmp_path / "bare-python"  # -S: no site-packages, no click
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    (tmp_path / "links").mkdir()
    with socket.socket() as index:
        index.bind(("127.0.0.1", 0))
        index.listen(64)  # answers nothing: connections wait in the backlog
        pip = {
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_INDEX_URL": f"http://127.0.0.1:{index.getsockname()[1]}/simple",
            "PIP_NO_INDEX": "0",
            "PIP_FIND_LINKS": str(tmp_path / "links"),
            "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
        }
        setup = f"""
        - uses: ./lm/setup
          with:
            python: {bare}
        """
        r = run_act(tmp_path, workflow(setup + setup + "- run: local-mutex n true"), env=pip)
    assert r.succeeded, r.output
    warnings = [x for x in r.output.splitlines() if "::warning::" in x]
    assert len(warnings) == 2, r.output
    assert all("::warning::local-mutex: could not install click for" in x for x in warnings)
    assert " ago; pip is tried again " in warnings[1]
    assert not [x for x in r.step_lines if "::warning::" in x]  # each a command, not text
    assert "Retrying" not in r.output and "\x1b[" not in "".join(r.step_lines)


def test_two_runs_at_once_never_overlap(tmp_path: Path) -> None:
    locks, log = tmp_path / "locks", tmp_path / "log"
    locks.mkdir()
    steps = f"""
        - uses: ./lm
          with:
            name: contended
            lock-dir: {locks}
            run: |
              echo "start $GITHUB_RUN_ID-$$" >> {log}
              sleep 1
              echo "end $GITHUB_RUN_ID-$$" >> {log}
        """
    runs = [start_act(tmp_path, workflow(steps), name=f"p{i}") for i in range(2)]
    outputs = [p.communicate(timeout=240)[0] for p in runs]
    assert all("Job succeeded" in out for out in outputs), outputs
    lines = log.read_text().splitlines()
    assert len(lines) == 4
    assert lines[0].split()[0] == "start" and lines[1] == lines[0].replace("start", "end")
    assert lines[2].split()[0] == "start" and lines[3] == lines[2].replace("start", "end")


def test_two_first_uses_install_once(tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    steps = """
        - uses: ./lm
          with:
            name: install-race
            run: echo "installed and ran"
        """
    runs = [start_act(tmp_path, workflow(steps), cache=cache, name=f"p{i}") for i in range(2)]
    outputs = [p.communicate(timeout=240)[0] for p in runs]
    assert all("Job succeeded" in out and "installed and ran" in out for out in outputs), outputs
    installs = [
        p for p in (cache / "tool_cache" / "local-mutex").iterdir() if not p.name.startswith(".")
    ]
    assert len(installs) == 1
    assert (installs[0] / ".complete").exists()
    assert not [
        p for p in (cache / "tool_cache" / "local-mutex").iterdir() if p.name.startswith(".tmp-")
    ]
    # Later uses reuse the install rather than copying again.
    before = (installs[0] / ".complete").stat().st_mtime_ns
    r = run_act(tmp_path, workflow(steps), cache=cache, name="p3")
    assert r.succeeded
    assert (installs[0] / ".complete").stat().st_mtime_ns == before


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return True
    return state == b"Z"  # exited, waiting to be reaped by init


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc to find processes")
def test_cancel_signal_to_the_entry_process_frees_the_lock(tmp_path: Path) -> None:
    """The runner's cancel (SIGINT to the step's entry process, our keeper) reaches a
    command that ignores it -- from its first instant: a child started before the trap
    could take the SIGINT before it ignored it, and its end let `wait` return 0 -- and
    the escalation ends it; the job fails."""
    locks, marks = tmp_path / "locks", tmp_path / "m"
    locks.mkdir()
    marks.mkdir()
    run = start_act(
        tmp_path,
        workflow(f"""
        - uses: ./lm
          with:
            name: cancel-me
            lock-dir: {locks}
            run: |
              trap '' INT
              echo $PPID > {marks}/supervisor.pid
              sleep 300 &
              echo $! > {marks}/child.pid
              wait
        """),
    )
    try:
        child = read_pid(marks / "child.pid", 120)
        entry = pw.ppid(read_pid(marks / "supervisor.pid"))
        assert entry is not None
        with open(f"/proc/{entry}/cmdline", "rb") as f:
            assert b"bootstrap.py" in f.read()  # the step's shell exec'd the keeper
        os.kill(entry, signal.SIGINT)
        t0 = time.monotonic()

        wait_for(lambda: lock_is_free(lock_file(locks, "cancel-me")), 15)
        assert time.monotonic() - t0 < 10
        wait_for(lambda: _gone(child), 5)
        out = run.communicate(timeout=60)[0]
        assert "Job failed" in out
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def test_a_step_stopped_while_it_waits_says_how_long_it_waited(tmp_path: Path) -> None:
    """waited-seconds said 0 (and the summary row 0.0s) for a wait a stop signal ended."""
    locks = tmp_path / "locks"
    locks.mkdir()
    holder = run_cli(["hold", "--lock-dir", str(locks), "busy-wait"])
    assert holder.returncode == 0, holder.stderr
    run = start_act(
        tmp_path,
        workflow(f"""
        - id: w
          continue-on-error: true
          uses: ./lm
          with:
            name: busy-wait
            lock-dir: {locks}
            run: touch {tmp_path}/ran
        - run: echo "waited=${{{{ steps.w.outputs.waited-seconds }}}}"
        """),
    )
    try:

        def waiter() -> int | None:
            st = json.loads(
                run_cli(["status", "busy-wait", "--lock-dir", str(locks), "--json"]).stdout
            )
            return st["waiters"][0]["pid"] if st["waiters"] else None

        wait_for(lambda: waiter() is not None, 120)
        time.sleep(1.5)  # a wait long enough to tell from none
        os.kill(waiter() or 0, signal.SIGINT)
        out = run.communicate(timeout=60)[0]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        run_cli(["release", "--lock-dir", str(locks), "--force", "busy-wait"])
    (waited,) = [ln.split("waited=")[1] for ln in out.splitlines() if "| waited=" in ln]
    assert 1.5 <= float(waited) < 60, out
    assert not (tmp_path / "ran").exists()


def test_inputs_never_reach_a_script_by_interpolation() -> None:
    # Every input reaches the CLI through env:, never as ${{ }} pasted into run:.
    root = Path(__file__).resolve().parents[2]
    for path in (root / "action.yml", root / "setup" / "action.yml"):
        runs = [x for x in path.read_text().splitlines() if x.strip().startswith("run:")]
        assert runs and all("${{" not in x for x in runs), path
