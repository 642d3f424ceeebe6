"""Entry point of the composite action: inputs come from the environment, never from
``${{ }}`` pasted into a script. Click-free, so a bare runner with only python3 can run it.

The step's shell ``exec``s this process, making it the step's entry process: the runner's
cancel signals reach the supervisor directly. All output bookkeeping happens here, after
the command ends, in the same process.
"""

from __future__ import annotations

import math
import os

from . import github
from .cli import failure_status
from .errors import LocalMutexError, NotAcquired, ValidationError
from .nesting import ENV_HELD
from .notices import Reporter, duration

INPUT_PREFIX = "LOCAL_MUTEX_INPUT_"
MODES = ("run", "hold", "release", "check")

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .remotelock import RemoteLock


class ActionInputs:
    """The action's inputs, parsed and checked; every bad value is a ValidationError."""

    def __init__(self, env: Mapping[str, str]) -> None:
        def get(key: str) -> str:
            return env.get(INPUT_PREFIX + key, "")

        self.mode = get("MODE").strip().lower() or "run"
        if self.mode not in MODES:
            raise ValidationError(f"mode must be one of {', '.join(MODES)}, not {get('MODE')!r}")
        self.name = get("NAME")
        self.command = get("RUN")
        if self.mode != "run" and self.command.strip():
            raise ValidationError(f"run: is only for mode: run, not mode: {self.mode}")
        self.lock_dir = get("LOCK_DIR") or None
        self.wait = _seconds(get("WAIT_SECONDS"), "wait-seconds", allow_zero=True)
        self.timeout = _seconds(get("TIMEOUT_SECONDS"), "timeout-seconds", allow_zero=False)
        self.ttl = _seconds(get("TTL_SECONDS"), "ttl-seconds", allow_zero=False)
        self.shared = _boolean(get("SHARED"), "shared")
        self.reentrant = _boolean(get("REENTRANT"), "reentrant")
        self.force = _boolean(get("FORCE"), "force")
        self.message = get("MESSAGE") or None
        self.token = get("TOKEN") or None
        slots = get("SLOTS").strip()
        try:
            self.slots = int(slots) if slots else None
        except ValueError:
            raise ValidationError(f"slots must be a whole number, not {slots!r}") from None
        if self.slots is not None and not 1 <= self.slots <= 1024:
            raise ValidationError(f"slots must be between 1 and 1024, not {slots!r}")
        self.remote = get("REMOTE").strip() or None
        self.key_prefix = get("KEY_PREFIX") or "lock__"
        if self.remote and (self.slots or self.shared):
            raise ValidationError("slots and shared cannot be used with remote")
        self.if_locked = get("IF_LOCKED").strip().lower() or "fail"
        if self.if_locked not in ("fail", "skip"):
            raise ValidationError(f"if-locked must be 'fail' or 'skip', not {get('IF_LOCKED')!r}")


def _seconds(text: str, label: str, *, allow_zero: bool) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"{label} must be a number of seconds, not {text!r}") from None
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero) or value > 1e9:
        raise ValidationError(f"{label} {text!r} is out of range")
    return value


def _boolean(text: str, label: str) -> bool:
    value = text.strip().lower()
    if value in ("", "false"):
        return False
    if value == "true":
        return True
    raise ValidationError(f"{label} must be 'true' or 'false', not {text!r}")


class _Step:
    """Outputs and the summary row of this step, written once at the end."""

    def __init__(self, env: dict[str, str], reporter: Reporter) -> None:
        self.env, self.reporter = env, reporter
        self.outputs = {"acquired": "false", "waited-seconds": "0", "held-seconds": "0"}
        self.outcome: str | None = None

    def finish(self, status: int, label: str) -> int:
        github.append(self.env.get("GITHUB_OUTPUT"), github.format_outputs(self.outputs))
        if self.outcome is not None:
            github.append(
                self.env.get("GITHUB_STEP_SUMMARY"),
                github.summary_row(
                    label,
                    duration(float(self.outputs["waited-seconds"])),
                    duration(float(self.outputs["held-seconds"])),
                    self.outcome,
                ),
            )
        return status

    def not_acquired(self, exc: NotAcquired, skip: bool) -> int:
        self.outputs["waited-seconds"] = f"{exc.waited:.3f}"
        if skip:
            self.reporter.write(f"{exc}; skipping (if-locked: skip)", "notice")
            self.outcome = "skipped: lock held"
            return 0
        self.outcome = "not acquired"
        return failure_status(exc, self.reporter)


def _plain_env(step: _Step) -> dict[str, str]:
    """The step's environment without the action's inputs (a token among them)."""
    return {k: v for k, v in step.env.items() if not k.startswith(INPUT_PREFIX)}


def _git_env(step: _Step) -> dict[str, str]:
    """What git sees: the token input as LOCAL_MUTEX_GIT_TOKEN (never in a command line)."""
    env = _plain_env(step)
    token = step.env.get(INPUT_PREFIX + "REMOTE_TOKEN", "")
    if token:
        env["LOCAL_MUTEX_GIT_TOKEN"] = token
    return env


def _remote_lock(inputs: ActionInputs, step: _Step) -> RemoteLock:
    from .remotelock import RemoteLock

    assert inputs.remote is not None
    return RemoteLock(inputs.remote, inputs.name, prefix=inputs.key_prefix, env=_git_env(step))


def _run(inputs: ActionInputs, step: _Step) -> int:
    from .wrap import run_locked

    # The command's own GITHUB_OUTPUT goes to a private file, exposed as output-file:
    # composite actions do not pass a nested command's outputs on by themselves.
    capture = github.capture_file(step.env)
    step.outputs["output-file"] = capture
    child = _plain_env(step)
    child["GITHUB_OUTPUT"] = capture
    if inputs.remote:
        from .remotecli import run_remote_locked

        status, waited, held = run_remote_locked(
            inputs.command,
            inputs.name,
            inputs.remote,
            prefix=inputs.key_prefix,
            wait=inputs.wait,
            timeout=inputs.timeout,
            lock_dir=inputs.lock_dir,
            env=child,
            lock_env=_git_env(step),
            reporter=step.reporter,
        )
        step.outputs.update(
            {"acquired": "true", "waited-seconds": f"{waited:.3f}", "held-seconds": f"{held:.3f}"}
        )
        step.outcome = f"exit {status}"
        return status
    result = run_locked(
        inputs.command,
        inputs.name,
        lock_dir=inputs.lock_dir,
        wait=inputs.wait,
        timeout=inputs.timeout,
        shared=inputs.shared,
        slots=inputs.slots,
        reentrant=inputs.reentrant,
        env=child,
        reporter=step.reporter,
    )
    step.outputs.update(
        {
            "acquired": "true",
            "waited-seconds": f"{result.waited:.3f}",
            "held-seconds": f"{result.held:.3f}",
        }
    )
    step.outcome = f"exit {result.status}" + (" (timed out)" if result.timed_out else "")
    return result.status


def _hold(inputs: ActionInputs, step: _Step) -> int:
    if inputs.remote:
        from .remotelock import new_token

        token = new_token()
        with _remote_lock(inputs, step) as lock:
            lock.acquire(
                message=inputs.message or "hold",
                lease=inputs.ttl,
                token=token,
                wait=inputs.wait,
                poll=5.0,
            )
        step.outputs.update({"acquired": "true", "token": token})
        step.reporter.write(
            f"holding {inputs.name} on {inputs.remote} until a release step "
            "(remote holds do not end with the job)",
            "notice",
        )
        step.outcome = "held (remote)"
        return 0
    from .holds import start_hold

    info = start_hold(
        inputs.name,
        lock_dir=inputs.lock_dir,
        wait=inputs.wait,
        ttl=inputs.ttl,
        message=inputs.message,
        slots=inputs.slots,
        env=_plain_env(step),
    )
    step.outputs.update(
        {"acquired": "true", "token": info.token, "waited-seconds": f"{info.waited:.3f}"}
    )
    step.reporter.write(
        f"holding {info.name} in detached pid {info.pid} until a later "
        "step releases it or this job ends",
        "notice",
    )
    step.outcome = "held"
    return 0


def _release(inputs: ActionInputs, step: _Step) -> int:
    if inputs.remote:
        with _remote_lock(inputs, step) as lock:
            released = lock.release(token=inputs.token, force=inputs.force)
        step.outputs["released"] = "true" if released is not None else "false"
        step.outcome = "released (remote)" if released is not None else None
        return 0
    from .holds import release

    done = release(
        inputs.name,
        lock_dir=inputs.lock_dir,
        token=inputs.token,
        force=inputs.force,
        slots=inputs.slots is not None,
        env=step.env,
    )
    step.outputs["released"] = "true" if done.was_held else "false"
    if done.was_held:
        held = done.held_seconds or 0.0
        step.outputs["held-seconds"] = f"{held:.3f}"
        step.reporter.write(f"released {inputs.name} (hold pid {done.pid})", "notice")
        step.outcome = "released"
    else:
        step.reporter.write(f"{inputs.name} is not held; nothing to release", "notice")
    return 0


def _check(inputs: ActionInputs, step: _Step) -> int:
    from .lockstate import status
    from .record import dump_json

    if inputs.remote:
        with _remote_lock(inputs, step) as lock:
            state = lock.read()
        step.outputs.update(
            {
                "locked": "true" if state.locked else "false",
                "holder": dump_json(state.as_dict()) if state.locked else "",
            }
        )
        return 0

    st = status(inputs.name, inputs.lock_dir)
    busy = st.held or (bool(st.slots) and all(s.held for s in st.slots))
    holders = [h.as_dict() for h in st.holders] or [
        h.as_dict() for s in st.slots for h in s.holders
    ]
    step.outputs.update(
        {"locked": "true" if busy else "false", "holder": dump_json(holders[0]) if holders else ""}
    )
    return 0


def main(env: Mapping[str, str] | None = None) -> int:
    env_d = dict(os.environ if env is None else env)
    reporter = Reporter(nested=bool(env_d.get(ENV_HELD)))
    step = _Step(env_d, reporter)
    label = env_d.get(INPUT_PREFIX + "NAME", "")
    try:
        inputs = ActionInputs(env_d)
    except ValidationError as exc:
        return step.finish(failure_status(exc, reporter), label)
    modes = {"run": _run, "hold": _hold, "release": _release, "check": _check}
    try:
        status = modes[inputs.mode](inputs, step)
    except NotAcquired as exc:
        status = step.not_acquired(exc, inputs.if_locked == "skip")
    except (LocalMutexError, KeyboardInterrupt) as exc:
        status = failure_status(exc, reporter)
        step.outcome = step.outcome or ("invalid input" if status == 2 else f"exit {status}")
    return step.finish(status, label)
