"""``run`` (also the verb-free form): one command under one lock."""

from __future__ import annotations

import os
import sys

from ..errors import InvalidLockDir, LocalMutexError
from ..lifecycle import run_locked
from ..runspec import Command, Options
from . import Failed, reporter_for, using

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .argv import Parsed


def command_of(parsed: Parsed) -> Command:
    """The quoted COMMAND, or the program after ``--``."""
    if parsed.argv is not None:
        return Command(argv=parsed.argv)
    return Command(parsed.positionals[1])


def options_of(parsed: Parsed, **extra: object) -> Options:
    # The streams our caller closed, which /dev/null stands in for in our process
    # (``cli``): the module that notes them is loaded only when one was.
    output = sys.modules.get(f"{__package__.rpartition('.')[0]}.ui.output")
    closed = tuple(sorted(output.closed_by_caller)) if output is not None else ()
    return Options(
        closed=closed,
        wait=parsed.wait(),
        timeout=parsed.number("timeout"),
        kill_after=parsed.number("kill_after") or 0.0,
        shared=parsed.flag("shared"),
        slots=parsed.count("slots"),
        reentrant=parsed.flag("reentrant"),
        message=parsed.text("message"),
        **extra,  # type: ignore[arg-type]
    )


def run(parsed: Parsed, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    reporter = reporter_for(parsed, env)
    try:
        command, opts = command_of(parsed), options_of(parsed)
    except LocalMutexError as exc:
        return reporter.failure(exc)
    name = parsed.positionals[0]
    try:
        result = using(
            parsed,
            env,
            reporter,
            lambda b: run_locked(
                b, name, command, opts, env=env, reporter=reporter, subreaper=True, last=True
            ),
            translate=lambda exc: _unquoted(parsed, exc),
        )
    except Failed as exc:
        return exc.code
    return result.status


def _unquoted(parsed: Parsed, exc: BaseException) -> BaseException:
    """``NAME cat /etc/hosts``: a LOCK_DIR refused after a one-word COMMAND may be the
    command's own word, typed unquoted (a relative one is refused while parsing)."""
    words = parsed.positionals
    if isinstance(exc, InvalidLockDir) and len(words) == 3 and words[1].split() == [words[1]]:
        from .suggest import quote_hint

        return InvalidLockDir(quote_hint("run", parsed, str(exc)))
    return exc
