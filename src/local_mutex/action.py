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
from .errors import Interrupted, NotAcquired, SpawnError, ValidationError
from .nesting import ENV_HELD
from .notices import Reporter, duration
from .wrap import run_locked

INPUT_PREFIX = "LOCAL_MUTEX_INPUT_"
EXIT_USAGE, EXIT_NOT_ACQUIRED, EXIT_SPAWN_FAILED = 2, 75, 125

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


class ActionInputs:
    __slots__ = ("command", "if_locked", "lock_dir", "name", "shared", "timeout", "wait")

    def __init__(self, env: Mapping[str, str]) -> None:
        def get(key: str) -> str:
            return env.get(INPUT_PREFIX + key, "")

        self.name = get("NAME")
        self.command = get("RUN")
        self.lock_dir = get("LOCK_DIR") or None
        self.wait = _seconds(get("WAIT_SECONDS"), "wait-seconds", allow_zero=True)
        self.timeout = _seconds(get("TIMEOUT_SECONDS"), "timeout-seconds", allow_zero=False)
        self.shared = _boolean(get("SHARED"), "shared")
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


def main(env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    reporter = Reporter(nested=bool(env.get(ENV_HELD)))
    outputs = {"acquired": "false", "waited-seconds": "0", "held-seconds": "0"}
    label = env.get(INPUT_PREFIX + "NAME", "")
    try:
        inputs = ActionInputs(env)
    except ValidationError as exc:
        reporter.error(str(exc))
        github.append(env.get("GITHUB_OUTPUT"), github.format_outputs(outputs))
        return EXIT_USAGE
    # The command's own GITHUB_OUTPUT goes to a private file, exposed as output-file:
    # composite actions do not pass a nested command's outputs on by themselves.
    capture = github.capture_file(env)
    outputs["output-file"] = capture
    child = {k: v for k, v in env.items() if not k.startswith(INPUT_PREFIX)}
    child["GITHUB_OUTPUT"] = capture
    status, outcome = 0, ""
    try:
        result = run_locked(
            inputs.command,
            inputs.name,
            lock_dir=inputs.lock_dir,
            wait=inputs.wait,
            timeout=inputs.timeout,
            shared=inputs.shared,
            env=child,
            reporter=reporter,
        )
        status = result.status
        outputs.update(
            {
                "acquired": "true",
                "waited-seconds": f"{result.waited:.3f}",
                "held-seconds": f"{result.held:.3f}",
            }
        )
        outcome = f"exit {status}" + (" (timed out)" if result.timed_out else "")
    except NotAcquired as exc:
        outputs["waited-seconds"] = f"{exc.waited:.3f}"
        if inputs.if_locked == "skip":
            reporter.write(f"{exc}; skipping the command (if-locked: skip)", "notice")
            status, outcome = 0, "skipped: lock held"
        else:
            reporter.error(str(exc))
            status, outcome = EXIT_NOT_ACQUIRED, "not acquired"
    except ValidationError as exc:
        reporter.error(str(exc))
        status, outcome = EXIT_USAGE, "invalid input"
    except Interrupted as exc:
        reporter.error(f"stopped waiting for the lock: received signal {exc.signum}")
        status, outcome = 128 + exc.signum, "cancelled while waiting"
    except SpawnError as exc:
        reporter.error(str(exc))
        status, outcome = EXIT_SPAWN_FAILED, "could not start"
    github.append(env.get("GITHUB_OUTPUT"), github.format_outputs(outputs))
    if outcome != "invalid input":
        github.append(
            env.get("GITHUB_STEP_SUMMARY"),
            github.summary_row(
                label,
                duration(float(outputs["waited-seconds"])),
                duration(float(outputs["held-seconds"])),
                outcome,
            ),
        )
    return status
