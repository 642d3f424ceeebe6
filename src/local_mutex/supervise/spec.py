"""What a supervised run runs: a shell command, or a program with its arguments."""

from __future__ import annotations

import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


class Spec:
    """What to run and how: a shell command, or a program with its arguments."""

    __slots__ = ("argv", "closed", "env", "farewell", "kill_after", "stdin_devnull", "timeout")

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        timeout: float | None = None,
        kill_after: float = 5.0,
        stdin_devnull: bool = False,
        closed: Sequence[int] = (),
    ) -> None:
        self.argv, self.env, self.timeout = list(argv), env, timeout
        self.kill_after, self.stdin_devnull = kill_after, stdin_devnull
        self.closed = tuple(closed)  # standard streams the command gets closed
        # A socket and what to say on it once everything of the command is over (a run
        # inside a hold tells its holder; the keeper does too, if it lives).
        self.farewell: tuple[int, bytes] | None = None

    @classmethod
    def shell(cls, command: str, env: Mapping[str, str], **options: object) -> Spec:
        return cls(shell_argv(command), env, **options)  # type: ignore[arg-type]


def shell_argv(command: str) -> list[str]:
    """``sh -c COMMAND``; one that starts with - or + after ``--``, or sh would take it for
    its own options (``-v echo hi``: "Illegal option")."""
    return ["sh", "-c", "--", command] if command.startswith(("-", "+")) else ["sh", "-c", command]


def find_program(spec: Spec) -> str:
    """The program of an argv run, searched in the command's own PATH (posix_spawnp
    would search ours)."""
    name = spec.argv[0]
    if "/" in name:
        return name
    for directory in spec.env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(errno.ENOENT, f"{name}: not found in PATH")


def why_not_started(spec: Spec, exc: OSError) -> str:
    """What to say when the command could not be started, naming its program."""
    why, program = exc.strerror or str(exc), spec.argv[0]
    if exc.errno == errno.ENOENT and program not in why:  # name what is missing
        return f"{program}: {why} (the program, or the interpreter its #! names)"
    return why if program in why else f"{program}: {why}"  # a directory, no x permission
