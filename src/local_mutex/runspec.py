"""What a run is: the command, the options it is taken and run with, and what happened.
Shared by every verb, the action and the Python API; ``lifecycle`` carries it out."""

from __future__ import annotations

from .errors import InvalidCommand, LockLost, NestingError, ValidationError
from .names import encoded, shell_quote, validate_command
from .supervise.spec import shell_argv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Command", "Options", "RunResult"]


class RunResult:
    """What happened: the exit status plus the numbers the action reports."""

    __slots__ = (
        "acquired",
        "held",
        "lock_file",
        "lost",
        "reentrant",
        "status",
        "stop_signal",
        "timed_out",
        "waited",
    )

    def __init__(self, lock_file: str) -> None:
        self.lock_file = lock_file
        self.status = 0
        self.stop_signal = 0  # the first stop signal that reached us: we were asked to stop
        self.acquired = self.reentrant = self.timed_out = False
        self.lost: LockLost | None = None
        self.waited = 0.0
        self.held = 0.0

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"RunResult({fields})"


class Command:
    """What to run: a shell command (``/bin/sh -c``) or a program with its arguments."""

    __slots__ = ("argv", "text")

    def __init__(self, command: str | None = None, argv: Sequence[str] | None = None) -> None:
        if (command is None) == (argv is None):
            raise ValidationError("give a shell command or a program with its arguments")
        if argv is not None:
            # A string is a sequence too ("true" ran "t"); a set or a generator gives no
            # order to trust, or is gone once looked at.
            if not isinstance(argv, (list, tuple)):
                raise InvalidCommand(
                    "argv is a list (or tuple) of the program and its arguments, "
                    f"not {type(argv).__name__}"
                )
            if not argv or not argv[0]:
                raise ValidationError("the program to run is missing after --")
            if not all(isinstance(a, str) for a in argv):
                raise InvalidCommand("every argument in argv must be a str")
            for arg in argv:
                passable("an argument", arg)
            self.argv = list(argv)
            self.text = " ".join(shell_quote(a) for a in argv)
        else:
            if not isinstance(command, str):
                hint = ""
                if isinstance(command, (list, tuple)):
                    hint = ": give a program and its arguments as argv="
                elif isinstance(command, bytes):
                    hint = ": decode it (os.fsdecode keeps every byte)"
                raise InvalidCommand(
                    f"the command is a str for /bin/sh -c, not {type(command).__name__}{hint}"
                )
            self.text = validate_command(command)
            passable("the command", command)
            self.argv = shell_argv(command)


def passable(what: str, text: str, error: type[ValidationError] = InvalidCommand) -> None:
    """Refuse what no program can be given (found only once the lock was taken, it ended
    a run with 70): a NUL byte, or a lone surrogate (``names.encoded``)."""
    if "\0" in text:
        raise error(f"{what} holds a NUL byte, which no system call takes")
    encoded(what, text, error)


# As the command line's bound: past it, timers overflow.
MAX_SECONDS = 1e9


def _check_seconds(label: str, value: float | None, *, zero: bool, none: bool = True) -> None:
    """The bounds the command line keeps, for the API's callers too: NaN, infinity and
    negative values made the supervisor fail (70) after the lock was taken."""
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(f"{label} must be a number of seconds, not {value!r}")
    if value != value or not 0 <= value <= MAX_SECONDS or (value == 0 and not zero):
        low = "0" if zero else "more than 0"
        raise ValidationError(f"{label} {value!r} is not between {low} and {MAX_SECONDS:g} seconds")


# The most slots a name has (``--slots``, the action's ``slots``, the API's ``slots=``).
MAX_SLOTS = 1024

# A message is for people reading a waiting line. Longer, a hold's could not reach its
# holder process (E2BIG: 128 KiB an environment string, JSON takes up to 12 bytes a
# character), while a run's was taken whole.
MAX_MESSAGE = 8192


def check_message(message: str | None) -> None:
    if message is not None and not isinstance(message, str):
        raise ValidationError(f"message must be a str, not {type(message).__name__}")
    if message is not None and len(message) > MAX_MESSAGE:
        raise ValidationError(f"--message is {len(message)} characters long; at most {MAX_MESSAGE}")


class Options:
    """How to take the lock and run: the options every verb and the action share."""

    __slots__ = (
        "closed",
        "kill_after",
        "message",
        "reentrant",
        "shared",
        "slots",
        "stdin_devnull",
        "timeout",
        "token",
        "wait",
    )

    def __init__(
        self,
        *,
        wait: float | None = None,
        timeout: float | None = None,
        kill_after: float = 5.0,
        shared: bool = False,
        slots: int | None = None,
        reentrant: bool = False,
        stdin_devnull: bool = False,
        message: str | None = None,
        token: str | None = None,
        closed: tuple[int, ...] = (),
    ) -> None:
        for flag, on in (("shared", shared), ("reentrant", reentrant)):
            if not isinstance(on, bool):  # shared="no" took a shared lock
                raise ValidationError(f"{flag} must be True or False, not {on!r}")
        if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int)):
            raise ValidationError(f"slots must be a whole number (an int), not {slots!r}")
        if slots is not None and shared:
            raise NestingError(
                "--slots cannot be --shared: a slot is one holder's (N slots let N in at once)"
            )
        if slots is not None and slots < 1:
            raise NestingError("--slots needs a count of at least 1")
        if slots is not None and slots > MAX_SLOTS:  # no slot past it is ever looked at
            raise ValidationError(f"slots {slots} is not between 1 and {MAX_SLOTS}")
        _check_seconds("wait", wait, zero=True)
        _check_seconds("timeout", timeout, zero=False)
        _check_seconds("kill_after", kill_after, zero=True, none=False)
        check_message(message)
        self.wait, self.timeout, self.kill_after = wait, timeout, kill_after
        self.shared, self.slots, self.reentrant = shared, slots, reentrant
        self.stdin_devnull, self.message, self.token = stdin_devnull, message, token
        # Standard streams the caller had closed (``cmd >&-``): closed for the command too.
        self.closed = closed
