"""Command line: parse, call the library, map its typed errors to exit codes.

The established form ``local-mutex NAME COMMAND [LOCK_DIR]`` takes a fast path that never
imports click: nested calls in a loop pay only for what a plain run needs.
"""

from __future__ import annotations

import os
import sys

from .errors import (
    Interrupted,
    LocalMutexError,
    NotAcquired,
    Refused,
    RemoteError,
    ValidationError,
)
from .nesting import ENV_HELD
from .notices import Reporter

# Type-only imports: typing and collections cost a plain run measurable startup time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

VERBS = frozenset({"run", "status", "list", "each", "hold", "release", "history"})

EXIT_USAGE = 2
EXIT_NOT_ACQUIRED = 75  # as BSD lockf(1): "could not acquire the lock in time"
EXIT_SPAWN_FAILED = 125  # as timeout(1): the wrapper itself failed
EXIT_REFUSED = 77  # as EX_NOPERM: release declined (not a hold, or not ours)
EXIT_REMOTE = 69  # as EX_UNAVAILABLE: the git remote is down or refused
ENV_REMOTE = "LOCAL_MUTEX_REMOTE"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in VERBS and not args[0].startswith("-"):
        return _positional(args)
    if args and args[0] in ("status", "list") and not os.environ.get(ENV_REMOTE):
        quick = _quick_look(args)
        if quick is not None:
            return quick
    from .commands import dispatch  # click lives there

    return dispatch(args)


def _quick_look(args: list[str]) -> int | None:
    """``status``/``list`` with plain arguments, without importing click; None defers to it."""
    from .showstate import quick_parse, show_list, show_status

    if args[0] == "status":
        parsed = quick_parse(args[1:], frozenset({"--json"}))
        if parsed is None or len(parsed[0]) != 1:
            return None
        (name,), opts = parsed
        return show_status(name, opts.get("lock_dir"), bool(opts.get("--json")))
    parsed = quick_parse(args[1:], frozenset({"--json", "--all"}))
    if parsed is None or parsed[0]:
        return None
    opts = parsed[1]
    return show_list(opts.get("lock_dir"), bool(opts.get("--json")), bool(opts.get("--all")))


def _positional(args: list[str]) -> int:
    if len(args) not in (2, 3):
        reporter = Reporter(nested=bool(os.environ.get(ENV_HELD)))
        reporter.error(
            f"expected 2 or 3 arguments (NAME COMMAND [LOCK_DIR]), got {len(args)}; "
            "see local-mutex --help"
        )
        return EXIT_USAGE
    if os.environ.get(ENV_REMOTE):
        from .remotecli import remote_run

        lock_dir = args[2] if len(args) == 3 else None
        return remote_run(args[1], args[0], os.environ[ENV_REMOTE], lock_dir=lock_dir)
    return run_command(args[0], args[1], lock_dir=args[2] if len(args) == 3 else None)


def failure_status(exc: BaseException, reporter: Reporter) -> int:
    """Report a library error the way every command does and return its exit status."""
    if isinstance(exc, ValidationError):
        reporter.error(str(exc))
        return EXIT_USAGE
    if isinstance(exc, NotAcquired):
        reporter.error(str(exc))
        return EXIT_NOT_ACQUIRED
    if isinstance(exc, Interrupted):
        reporter.error(
            f"stopped waiting for the lock: received signal {exc.signum}; the command did not run"
        )
        return 128 + exc.signum
    if isinstance(exc, Refused):
        reporter.error(str(exc))
        return EXIT_REFUSED
    if isinstance(exc, RemoteError):
        reporter.error(str(exc))
        return EXIT_REMOTE
    if isinstance(exc, KeyboardInterrupt):
        return 130
    reporter.error(str(exc))
    return EXIT_SPAWN_FAILED


def run_command(
    name: str,
    command: str,
    *,
    lock_dir: str | None = None,
    wait: float | None = None,
    timeout: float | None = None,
    kill_after: float = 5.0,
    shared: bool = False,
    slots: int | None = None,
    reentrant: bool = False,
    allow_other_owner: bool | None = None,
    quiet: bool = False,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run under the lock with user-facing lines; return the process exit status."""
    from .wrap import run_locked

    env = os.environ if env is None else env
    reporter = Reporter(nested=bool(env.get(ENV_HELD)), quiet=quiet)
    try:
        return run_locked(
            command,
            name,
            lock_dir=lock_dir,
            wait=wait,
            timeout=timeout,
            kill_after=kill_after,
            shared=shared,
            slots=slots,
            reentrant=reentrant,
            allow_other_owner=allow_other_owner,
            env=env,
            reporter=reporter,
        ).status
    except (LocalMutexError, KeyboardInterrupt) as exc:
        return failure_status(exc, reporter)
