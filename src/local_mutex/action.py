"""Entry point of the composite action: inputs come from the environment, never from
``${{ }}`` pasted into a script. Click-free, so a bare runner with only python3 runs it.

The step's shell ``exec``s this process, making it the step's entry process: the runner's
cancel signals reach the keeper directly. All output bookkeeping happens here, after the
command ends, in the same process. The modes call the same lifecycle and backends as the
CLI's verbs.
"""

from __future__ import annotations

import os
import sys
import time

from .action_inputs import INPUT_PREFIX, ActionInputs, input_words
from .backends import Ending, open_backend
from .errors import EXIT_IOERR, Interrupted, LocalMutexError, NotAcquired, ValidationError
from .identity import ENV_GIT_TOKEN, utc_stamp
from .lifecycle import run_locked
from .names import digest, name_bytes
from .nesting import ENV_HELD
from .runspec import Command, Options
from .ui import github
from .ui.lines import ANNOTATIONS, Reporter, duration

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .backends.base import Backend


class _Step:
    """Outputs and the summary row of this step, written once at the end."""

    def __init__(self, env: dict[str, str], reporter: Reporter) -> None:
        self.env, self.reporter = env, reporter
        self.outputs = {"acquired": "false", "waited-seconds": "0", "held-seconds": "0"}
        self.outcome: str | None = None

    def finish(self, status: int, label: str) -> int:
        """The outputs, then the summary row. Outputs that cannot be written (a full disk)
        are lost answers: 74, unless the status says something went wrong already; a
        summary row is only a view of them: a warning."""
        try:
            github.append(self.env.get("GITHUB_OUTPUT"), github.format_outputs(self.outputs))
        except OSError as exc:
            self.reporter.error(f"could not write the step's outputs ({_why(exc)})")
            status = status or EXIT_IOERR
        if self.outcome is not None:
            row = github.summary_row(
                label,
                duration(float(self.outputs["waited-seconds"])),
                duration(float(self.outputs["held-seconds"])),
                self.outcome,
            )
            try:
                github.append(self.env.get("GITHUB_STEP_SUMMARY"), row)
            except OSError as exc:
                self.reporter.warning(f"could not write the job summary ({_why(exc)})")
        return status

    def not_acquired(self, exc: NotAcquired, skip: bool) -> int:
        self.outputs["waited-seconds"] = f"{exc.waited:.3f}"
        if skip:
            self.reporter.notice(f"{exc}; skipping (if-locked: skip)", notable=True)
            self.outcome = "skipped: lock held"
            return 0
        self.outcome = "not acquired"
        return self.reporter.failure(exc)

    def plain_env(self) -> dict[str, str]:
        """The step's environment without the action's inputs (a token among them)."""
        return {k: v for k, v in self.env.items() if not k.startswith(INPUT_PREFIX)}

    def lock_env(self) -> dict[str, str]:
        """What the backend sees: the remote-token input as LOCAL_MUTEX_GIT_TOKEN."""
        env = self.plain_env()
        token = self.env.get(INPUT_PREFIX + "REMOTE_TOKEN", "")
        if token:
            env[ENV_GIT_TOKEN] = token
        return env


def _backend(inputs: ActionInputs, step: _Step, *, reading: bool = False) -> Backend:
    return open_backend(
        inputs.remote,
        lock_dir=inputs.lock_dir,
        env=step.lock_env(),
        key_prefix=inputs.key_prefix or None,
        reading=reading,
    )


def _run(inputs: ActionInputs, step: _Step, backend: Backend) -> int:
    # The command's own GITHUB_OUTPUT goes to a private file, exposed as output-file:
    # composite actions do not pass a nested command's outputs on by themselves.
    capture = github.capture_file(step.env)
    step.outputs["output-file"] = capture
    child = step.plain_env()
    child["GITHUB_OUTPUT"] = capture
    try:
        result = run_locked(
            backend,
            inputs.name,
            Command(inputs.command),
            Options(
                wait=inputs.wait,
                timeout=inputs.timeout,
                shared=inputs.shared,
                slots=inputs.slots,
                reentrant=inputs.reentrant,
                message=inputs.message,
            ),
            env=child,
            reporter=step.reporter,
        )
    except BaseException:
        # Refused, not acquired, stopped while waiting: no output of the command's to keep
        # (an empty file), and none to leave in a /tmp that nobody empties.
        if github.discard_if_empty(capture):
            del step.outputs["output-file"]
        raise
    step.outputs.update(
        {
            "acquired": "true",
            "waited-seconds": f"{result.waited:.3f}",
            "held-seconds": f"{result.held:.3f}",
        }
    )
    step.outcome = f"exit {result.status}" + (" (timed out)" if result.timed_out else "")
    if result.lost is not None:
        step.outcome = "lock lost; command stopped"
    return result.status


def _hold(inputs: ActionInputs, step: _Step, backend: Backend) -> int:
    from .commands.holds import take_hold

    values = {
        "wait": inputs.wait,
        "ttl": inputs.ttl,
        "message": inputs.message,
        "slots": inputs.slots,
        "remote_url": inputs.remote,
    }
    info = take_hold(backend, inputs.name, values, step.plain_env(), step.reporter)
    try:  # the token first, on its own: a hold nobody has the token of must not stay
        github.append(step.env.get("GITHUB_OUTPUT"), github.format_outputs({"token": info.token}))
    except OSError as exc:
        ending = Ending(step.env, token=info.token, slots=inputs.slots is not None)
        what = f"could not write the hold's token to the step's outputs ({_why(exc)})"
        try:
            backend.release_hold(name_bytes(inputs.name), ending)
        except LocalMutexError:
            step.reporter.error(f"{what}, and could not end the hold: see release with force")
            return EXIT_IOERR
        step.reporter.error(f"{what}; ended the hold")
        step.outcome = "not held: its token could not be written"
        return EXIT_IOERR
    from .holds.start import delivered, job_anchor

    delivered(info)  # the job's end ends it too (its anchor), whoever has the token
    _note_job_hold(step, backend, inputs.name, "1")
    step.outputs.update({"acquired": "true", "waited-seconds": f"{info.waited:.3f}"})
    if backend.persistent_holds:
        ends = "until a release step (remote holds do not end with the job)"
    elif job_anchor(step.env) is None:  # no job process among our ancestors to end it with
        ends = "until a release step or its ttl-seconds (no job process found to end it)"
    else:
        ends = "until a later step releases it or this job ends"
    if inputs.ttl:
        ends += f"; its ttl-seconds end it at {utc_stamp(time.time() + inputs.ttl)} at the latest"
    where = f"detached pid {info.pid}" if info.pid else info.lock_file
    step.reporter.notice(f"holding {info.name} in {where} {ends}", notable=info.waited > 0)
    step.outcome = "held"
    return 0


def _release(inputs: ActionInputs, step: _Step, backend: Backend) -> int:
    from .commands.holds import end_hold, report_release
    from .errors import NotOurHold

    step.outputs["released"] = "false"
    try:
        done, slots_held = end_hold(
            backend,
            inputs.name,
            Ending(
                step.env,
                token=inputs.token,
                force=inputs.force,
                slots=inputs.slots is not None,
                waiting=lambda: step.reporter.info(
                    f"waiting for the runs inside the hold on {inputs.name} to end before ending it"
                ),
            ),
        )
    except NotOurHold as exc:
        if inputs.token or inputs.force:  # another's hold, asked for by name: refused
            raise
        if step.env.get(_job_hold_var(backend, inputs.name)):  # this job took one: lost
            raise NotOurHold(
                f"this job's hold of {inputs.name} is gone (its ttl-seconds, its holder "
                f"stopped, or its lease taken over): {exc}"
            ) from None
        # "Ends this job's hold", and this job took none: its hold step skipped (if-locked:
        # skip) or failed, and an `if: always()` release must not fail the job for that.
        step.reporter.warning(f"nothing released: this job holds no hold of it ({exc})")
        return 0
    _note_job_hold(step, backend, inputs.name, "")
    step.outputs["released"] = "true" if done.was_held else "false"
    if done.was_held:
        step.outputs["held-seconds"] = f"{done.held_seconds or 0.0:.3f}"
        step.outcome = "released"
    if slots_held:
        step.reporter.warning(
            f"{inputs.name} is not held, but its slots are: a hold taken with slots: is "
            "released by a step with slots: (any number) too"
        )
    else:
        report_release(step.reporter, inputs.name, done)
    return 0


def _job_hold_var(backend: Backend, name: str) -> str:
    """The variable a hold step sets for the job's later steps: this job took a hold of
    the name there (a release that then finds none of this job's says it was lost)."""
    where = backend.address.encode("utf-8", "surrogateescape") + b"\0" + name_bytes(name)
    return f"LOCAL_MUTEX_JOB_HOLD_{digest(where)[:16]}"


def _note_job_hold(step: _Step, backend: Backend, name: str, value: str) -> None:
    try:
        github.append(step.env.get("GITHUB_ENV"), f"{_job_hold_var(backend, name)}={value}\n")
    except OSError:  # best effort: a release then takes a lost hold for one never taken
        pass


def _check(inputs: ActionInputs, step: _Step, backend: Backend) -> int:
    from ._json import dumps

    st = backend.status(name_bytes(inputs.name))
    locked = st.busy(inputs.slots)
    # The holder of what ``locked`` is about (the plain lock, or the slots), and only then.
    of = st.holders if inputs.slots is None else [h for s in st.slots for h in s.holders]
    step.outputs.update(
        {
            "locked": "true" if locked else "false",
            "holder": dumps(of[0].as_dict()) if locked and of else "",
        }
    )
    return 0


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def main(env: Mapping[str, str] | None = None) -> int:
    env_d = dict(os.environ if env is None else env)
    annotations = env_d.get(INPUT_PREFIX + "ANNOTATIONS", "").strip().lower()
    reporter = Reporter(
        nested=bool(env_d.get(ENV_HELD)),
        annotations=annotations if annotations in ANNOTATIONS else "always",
        words=input_words(env_d),  # errors and warnings name the inputs, not the options
    )
    step = _Step(env_d, reporter)
    label = env_d.get(INPUT_PREFIX + "NAME", "")
    try:
        inputs = ActionInputs(env_d)
    except ValidationError as exc:
        return step.finish(reporter.failure(exc), label)
    if inputs.unused:
        reporter.warning(f"{inputs.unused}; ignored")
    modes = {"run": _run, "hold": _hold, "release": _release, "check": _check}
    started = time.monotonic()
    try:
        backend = _backend(inputs, step, reading=inputs.mode in ("release", "check"))
        warning = getattr(backend, "warning", None)  # a password in a URL, a lock dir
        if warning:
            reporter.warning(warning)
        try:
            status = modes[inputs.mode](inputs, step, backend)
        finally:
            backend.close()
    except NotAcquired as exc:
        status = step.not_acquired(exc, inputs.if_locked == "skip")
    except (LocalMutexError, KeyboardInterrupt) as exc:
        if isinstance(exc, Interrupted) and step.outputs["acquired"] == "false":
            # Stopped while it waited (or before its command started): the wait so far.
            step.outputs["waited-seconds"] = f"{time.monotonic() - started:.3f}"
        status = reporter.failure(exc)
        step.outcome = step.outcome or ("invalid input" if status == 2 else f"exit {status}")
    return step.finish(status, label)


if __name__ == "__main__":  # ``python -m local_mutex.action``, as the bootstrap runs main()
    sys.exit(main())
