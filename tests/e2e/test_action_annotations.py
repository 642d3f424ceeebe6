"""The action's ``annotations`` input (always | waited | never) under a real Actions runtime
(act, host mode, offline). GitHub keeps at most 10 notices per step and 50 per job, so a
busy workflow wants them only where something happened."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.actions import ActRun, needs_act, run_act, workflow

pytestmark = [needs_act, pytest.mark.timeout(300)]


class Setup(Exception):
    """The workflow did not get where the check needs it: a real failure, never an xfail."""


def _expect(condition: bool, what: str, r: ActRun) -> None:
    if not condition:
        raise Setup(f"{what}\n{r.output}")


def annotated(r: ActRun, text: str) -> bool:
    """A ``::notice::`` workflow command (act shows these with their marker)."""
    return any(f"::notice::local-mutex: {text}" in line for line in r.output.splitlines())


def plain(r: ActRun, text: str) -> bool:
    """An ordinary log line of a step."""
    return any(line.startswith(f"local-mutex: {text}") for line in r.step_lines)


def test_uncontended_steps_per_setting(tmp_path: Path) -> None:
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          with:
            name: ann-default
            run: echo default
        - uses: ./lm
          with:
            name: ann-always
            annotations: always
            run: echo always
        - uses: ./lm
          with:
            name: ann-waited
            annotations: waited
            run: echo waited
        - uses: ./lm
          with:
            name: ann-never
            annotations: NEVER
            run: echo never
        """),
    )
    assert r.succeeded, r.output
    for word in ("default", "always", "waited", "never"):
        assert word in r.step_lines  # every command ran
    # always (the default): both bookends are annotations, as before the input existed.
    for name in ("ann-default", "ann-always"):
        assert annotated(r, f"waiting for lock {name} at ")
        assert annotated(r, f"released {name} at ")
    # waited (nobody waited, nothing failed) and never: the same lines, as plain log lines.
    for name in ("ann-waited", "ann-never"):
        assert plain(r, f"waiting for lock {name} at ")
        assert plain(r, f"released {name} at ")
        assert not annotated(r, f"waiting for lock {name}")
        assert not annotated(r, f"released {name}")


def test_waited_leaves_an_uncontended_hold_and_its_release_plain(tmp_path: Path) -> None:
    """``annotations: waited`` was honoured by run steps only: a hold step and its release
    made a notice each, nobody having waited."""
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          with:
            mode: hold
            name: ann-hold
            annotations: waited
        - uses: ./lm
          with:
            mode: release
            name: ann-hold
            annotations: waited
        - uses: ./lm
          with:
            mode: hold
            name: ann-hold-always
        - uses: ./lm
          with:
            mode: release
            name: ann-hold-always
        """),
    )
    assert r.succeeded, r.output
    assert plain(r, "holding ann-hold in ") and plain(r, "released ann-hold (")
    assert not annotated(r, "holding ann-hold in ") and not annotated(r, "released ann-hold (")
    # The default still annotates both, as before the input existed.
    assert annotated(r, "holding ann-hold-always in ")
    assert annotated(r, "released ann-hold-always (")


def test_errors_are_annotated_whatever_the_setting(tmp_path: Path) -> None:
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          continue-on-error: true
          with:
            name: ann-stopped
            annotations: never
            timeout-seconds: "1"
            run: sleep 30
        """),
    )
    assert r.succeeded, r.output  # continue-on-error
    assert "::error::local-mutex: command under lock ann-stopped ran past --timeout" in r.output
    assert plain(r, "released ann-stopped at ")
    assert not annotated(r, "released ann-stopped")


def test_a_bad_value_fails_the_step_without_running(tmp_path: Path) -> None:
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          with:
            name: ann-bad
            annotations: sometimes
            run: touch ran-marker
        - if: always()
          run: test ! -e ran-marker && echo "did not run"
        """),
    )
    assert not r.succeeded
    assert "did not run" in r.step_lines
    assert (
        "::error::local-mutex: annotations must be one of always, waited, never, not 'sometimes'"
        in r.output
    ), r.output


def test_waited_annotates_a_step_that_waited(tmp_path: Path) -> None:
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          with:
            name: ann-busy
            mode: hold
            ttl-seconds: "2"
        - uses: ./lm
          with:
            name: ann-busy
            annotations: waited
            run: echo after-the-wait
        """),
    )
    _expect(r.succeeded and "after-the-wait" in r.step_lines, "the second step ran", r)
    assert "holding ann-busy in detached pid " in r.output, r.output
    assert "; its ttl-seconds end it at 20" in r.output and "Z at the latest" in r.output, r.output
    waited = [x for x in r.output.splitlines() if "released ann-busy at" in x]
    _expect(len(waited) == 1 and "(waited 0.0s" not in waited[0], "the step waited", r)
    assert annotated(r, "waiting for lock ann-busy at "), r.output
    assert annotated(r, "released ann-busy at "), r.output


def test_waited_annotates_a_step_that_failed(tmp_path: Path) -> None:
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          continue-on-error: true
          with:
            name: ann-failed
            annotations: waited
            run: exit 3
        """),
    )
    _expect(
        any("released ann-failed at" in x and "exit 3)" in x for x in r.output.splitlines()),
        "the command failed with 3",
        r,
    )
    assert annotated(r, "released ann-failed at "), r.output
    assert not annotated(r, "waiting for lock ann-failed")  # nobody waited: plain


def test_waited_annotates_a_step_that_was_stopped(tmp_path: Path) -> None:
    r = run_act(
        tmp_path,
        workflow("""
        - uses: ./lm
          continue-on-error: true
          with:
            name: ann-ceiling
            annotations: waited
            timeout-seconds: "1"
            run: sleep 30
        """),
    )
    _expect("ran past --timeout" in r.output, "the run ceiling stopped the command", r)
    assert annotated(r, "released ann-ceiling at "), r.output
