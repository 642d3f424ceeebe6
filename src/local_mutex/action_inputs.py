"""The action's inputs (``action.yml``), from the environment: parsed and checked, each bad
value a ValidationError in the inputs' own words."""

from __future__ import annotations

from .backends import POSTGRES_SCHEMES, remote_address
from .commands.options import is_plain_number
from .errors import ValidationError
from .runspec import MAX_SLOTS
from .ui.lines import ANNOTATIONS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

INPUT_PREFIX = "LOCAL_MUTEX_INPUT_"
MODES = ("run", "hold", "release", "check")

# The modes each input that is not for all of them is used by.
_INPUT_MODES = {
    "wait-seconds": ("run", "hold"),
    "timeout-seconds": ("run",),
    "ttl-seconds": ("hold",),
    "shared": ("run",),
    "reentrant": ("run",),
    "message": ("run", "hold"),
    "token": ("release",),
    "force": ("release",),
    "if-locked": ("run", "hold"),
}


_GIT_PREFIX = "lock__"  # the key-prefix input's default (action.yml)
# The remote input's default (action.yml): left out, as against given empty -- the value of
# an unset secret, which must not quietly lock on this machine instead.
_REMOTE_LEFT_OUT = "$LOCAL_MUTEX_REMOTE"


# The CLI's options that are inputs by another name, or by the same name without dashes: an
# error or warning the run words for the CLI names the inputs (``Reporter.words``).
INPUT_WORDS = {
    "message": "message",
    "remote": "remote",
    "reentrant": "reentrant",
    "slots": "slots",
    "shared": "shared",
    "key-prefix": "key-prefix",
    "lock-dir": "lock-dir",
    "ttl": "ttl-seconds",
}


def input_words(env: Mapping[str, str]) -> dict[str, str]:
    """``INPUT_WORDS``; with the remote input left out, an address is $LOCAL_MUTEX_REMOTE's."""
    left_out = env.get(INPUT_PREFIX + "REMOTE", _REMOTE_LEFT_OUT) == _REMOTE_LEFT_OUT
    return {**INPUT_WORDS, "remote": _REMOTE_LEFT_OUT if left_out else "remote"}


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
        self.wait = seconds(get("WAIT_SECONDS"), "wait-seconds", allow_zero=True)
        self.timeout = seconds(get("TIMEOUT_SECONDS"), "timeout-seconds", allow_zero=False)
        self.ttl = seconds(get("TTL_SECONDS"), "ttl-seconds", allow_zero=False)
        self.shared = boolean(get("SHARED"), "shared")
        self.reentrant = boolean(get("REENTRANT"), "reentrant")
        self.force = boolean(get("FORCE"), "force")
        self.message = get("MESSAGE") or None
        self.token = get("TOKEN") or None
        slots = get("SLOTS").strip()
        try:
            self.slots = (
                int(slots if slots.isascii() and slots.isdigit() else "x") if slots else None
            )
        except ValueError:
            raise ValidationError(f"slots must be a whole number, not {slots!r}") from None
        if self.slots is not None and not 1 <= self.slots <= MAX_SLOTS:
            raise ValidationError(f"slots must be between 1 and {MAX_SLOTS}, not {slots!r}")
        # As on the command line: the input, else $LOCAL_MUTEX_REMOTE (a job-wide default);
        # locking on this machine instead would not exclude the CLI's runs of the name.
        remote = env.get(INPUT_PREFIX + "REMOTE", _REMOTE_LEFT_OUT)
        asked = None if remote == _REMOTE_LEFT_OUT else remote.strip()
        if asked == "":  # as the CLI refuses --remote ''
            left_out = "on $LOCAL_MUTEX_REMOTE" if env.get("LOCAL_MUTEX_REMOTE") else "here"
            raise ValidationError(
                "remote is empty (an unset secret?): a lock on this machine would not exclude "
                f"the other machines; leave the input out to lock {left_out}"
            )
        self.remote = remote_address(asked, env)
        self.key_prefix = get("KEY_PREFIX")
        if asked and self.lock_dir:  # as the CLI's --remote with --lock-dir
            raise ValidationError("lock-dir is for this machine's locks; a remote lock has none")
        git = self.remote is not None and not self.remote.startswith(POSTGRES_SCHEMES)
        refused = ("slots", self.slots), ("shared", self.shared), ("reentrant", self.reentrant)
        if git and any(on for _, on in refused):  # reentrant: ignored, it waited on its hold
            used = " and ".join(k for k, on in refused if on)
            raise ValidationError(f"{used} cannot be used with a git remote")
        if self.slots and self.shared:  # in the inputs' words, not the CLI's
            raise ValidationError("slots and shared exclude each other: a slot is exclusive")
        # As the CLI refuses --key-prefix there. The input has a default: only another value
        # was given on purpose (an empty one, no prefix, is for git to refuse).
        if not git and self.key_prefix not in ("", _GIT_PREFIX):
            raise ValidationError(
                "key-prefix is for git remotes, not for "
                + ("a PostgreSQL lock" if self.remote else "this machine's locks")
            )
        self.if_locked = get("IF_LOCKED").strip().lower() or "fail"
        if self.if_locked not in ("fail", "skip"):
            raise ValidationError(f"if-locked must be 'fail' or 'skip', not {get('IF_LOCKED')!r}")
        self.annotations = get("ANNOTATIONS").strip().lower() or "always"
        if self.annotations not in ANNOTATIONS:
            raise ValidationError(
                f"annotations must be one of {', '.join(ANNOTATIONS)}, not {get('ANNOTATIONS')!r}"
            )
        # An input the mode does not use is refused, as the CLI refuses an option its verb
        # does not take: ignored, `shared: true` on a hold took an exclusive one.
        given = {
            "wait-seconds": self.wait is not None,
            "timeout-seconds": self.timeout is not None,
            "ttl-seconds": self.ttl is not None,
            "shared": self.shared,
            "reentrant": self.reentrant,
            "message": self.message is not None,
            "token": self.token is not None,
            "force": self.force,
            "if-locked": self.if_locked != "fail",
        }
        unused = [k for k, on in given.items() if on and self.mode not in _INPUT_MODES[k]]
        self.unused = f"{', '.join(unused)}: not used by mode: {self.mode}" if unused else ""
        # A release still releases (a step copied from its hold's): failing it would leave
        # the lock held. It says so instead.
        if unused and self.mode != "release":
            raise ValidationError(self.unused)


def seconds(text: str, label: str, *, allow_zero: bool) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text if is_plain_number(text) else "x")
    except ValueError:
        raise ValidationError(f"{label} must be a number of seconds, not {text!r}") from None
    if value != value or value < 0 or (value == 0 and not allow_zero) or value > 1e9:
        raise ValidationError(f"{label} {text!r} is out of range")
    return value


def boolean(text: str, label: str) -> bool:
    value = text.strip().lower()
    if value in ("", "false"):
        return False
    if value == "true":
        return True
    raise ValidationError(f"{label} must be 'true' or 'false', not {text!r}")
