"""The click command tree. Imported only for verbs and options, never for the plain form."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from ._version import __version__
from .cli import failure_status, run_command
from .errors import LocalMutexError
from .nesting import ENV_HELD
from .notices import Reporter

MAX_SECONDS = 1e9
F = TypeVar("F", bound=Callable[..., Any])


class Seconds(click.ParamType):  # type: ignore[type-arg]
    """A non-negative, finite number of seconds (fractions allowed)."""

    name = "seconds"

    def __init__(self, *, positive: bool = False) -> None:
        self.positive = positive

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if math.isnan(seconds) or seconds < 0 or seconds > MAX_SECONDS:
            self.fail(f"{value!r} is not between 0 and {MAX_SECONDS:g} seconds", param, ctx)
        if self.positive and seconds == 0:
            self.fail(f"{value!r} must be more than 0 seconds", param, ctx)
        return seconds


HELP = """Run a shell command under a named kernel lock (flock(2)).

\b
  local-mutex NAME COMMAND [LOCK_DIR]
  local-mutex [OPTIONS] NAME COMMAND [LOCK_DIR]     (same as: local-mutex run ...)
  local-mutex each TEMPLATE COMMAND < items
  local-mutex hold NAME          local-mutex release NAME
  local-mutex status NAME        local-mutex list
  local-mutex history NAME --remote URL     (and --remote URL on run/hold/...)

COMMAND runs under /bin/sh -c once no other holder of NAME is running; the lock is
released the instant the holder ends, however it ends. Lock files live in LOCK_DIR,
else $LOCAL_MUTEX_LOCK_DIR, else /tmp.

\b
Exit status: the command's own (128+N when killed by signal N); 2 bad usage or
input; 75 lock not acquired in time; 124/137 run ceiling hit (SIGTERM/SIGKILL
needed); 125 the command could not be started; 77 release refused; 69 git
remote unavailable.
"""


def lock_dir_option(f: F) -> F:
    return click.option("--lock-dir", metavar="DIR", help="Directory of lock files.")(f)


def wait_options(f: F) -> F:
    f = click.option("--no-wait", is_flag=True, help="Fail at once (exit 75) if the lock is held.")(
        f
    )
    return click.option(
        "--wait",
        type=Seconds(),
        metavar="SECONDS",
        help="Give up after waiting this long for the lock: exit 75, nothing run.",
    )(f)


def run_options(f: F) -> F:
    """Options shared by ``run`` and ``each``."""
    for option in reversed(
        [
            click.option(
                "--timeout",
                type=Seconds(positive=True),
                metavar="SECONDS",
                help="Run ceiling from the command's start: SIGTERM to its process "
                "group, SIGKILL after --kill-after; exit 124 or 137.",
            ),
            click.option(
                "--kill-after",
                type=Seconds(),
                default=5.0,
                show_default=True,
                metavar="SECONDS",
                help="Grace between SIGTERM and SIGKILL for --timeout.",
            ),
            click.option(
                "--shared",
                is_flag=True,
                help="Take a reader lock: shared holders overlap, an exclusive one waits for all.",
            ),
            click.option(
                "--slots",
                type=click.IntRange(1, 1024),
                metavar="N",
                help="Counting semaphore: at most N holders of NAME at once.",
            ),
            click.option(
                "--allow-other-owner",
                is_flag=True,
                default=None,
                help="Use a lock file owned by another user "
                "(also LOCAL_MUTEX_ALLOW_OTHER_OWNER=1).",
            ),
            click.option("-q", "--quiet", is_flag=True, help="Print only errors."),
        ]
    ):
        f = option(f)
    return wait_options(lock_dir_option(f))


def remote_options(f: F) -> F:
    f = click.option(
        "--key-prefix",
        default="lock__",
        show_default=True,
        metavar="PREFIX",
        help="Branch prefix of remote locks (lock-action's default).",
    )(f)
    return click.option(
        "--remote",
        metavar="URL",
        envvar="LOCAL_MUTEX_REMOTE",
        help="Lock on this git remote (branch <prefix>NAME) instead of this machine's "
        "kernel; also $LOCAL_MUTEX_REMOTE.",
    )(f)


def _no_local_only(remote: str | None, **flags: object) -> None:
    used = [name for name, value in flags.items() if value]
    if remote and used:
        raise click.UsageError(f"{', '.join(used)} cannot be used with --remote")


def _wait_value(wait: float | None, no_wait: bool) -> float | None:
    if no_wait and wait is not None:
        raise click.UsageError("--wait and --no-wait exclude each other")
    return 0.0 if no_wait else wait


@click.group(help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="local-mutex")
def cli() -> None:
    pass


@cli.command("run")
@click.argument("name")
@click.argument("command")
@click.argument("lock_dir_arg", metavar="[LOCK_DIR]", required=False)
@run_options
@click.option(
    "--reentrant",
    is_flag=True,
    help="Run inside a `hold` of NAME taken by this job (or $LOCAL_MUTEX_HOLD_TOKEN) "
    "instead of waiting for it.",
)
@remote_options
@click.option(
    "--lease",
    type=Seconds(positive=True),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="With --remote: lease, renewed while the command runs; "
    "a holder that died is taken over once it expires.",
)
@click.option(
    "--poll",
    type=Seconds(positive=True),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="With --remote: how often a waiter looks (plus jitter).",
)
def run_cmd(
    name: str,
    command: str,
    lock_dir_arg: str | None,
    lock_dir: str | None,
    wait: float | None,
    no_wait: bool,
    timeout: float | None,
    kill_after: float,
    shared: bool,
    slots: int | None,
    allow_other_owner: bool | None,
    quiet: bool,
    reentrant: bool,
    remote: str | None,
    key_prefix: str,
    lease: float,
    poll: float,
) -> None:
    """Run COMMAND under the lock NAME (the verb-free form does the same).

    A lock literally named like a verb (run, status, list, each, hold, release, history)
    is reached through this spelling: local-mutex run status 'make'.
    """
    if lock_dir and lock_dir_arg and lock_dir != lock_dir_arg:
        raise click.UsageError("LOCK_DIR and --lock-dir disagree; give one of them")
    wait = _wait_value(wait, no_wait)
    if remote:
        _no_local_only(
            remote,
            **{"--shared": shared, "--slots": slots, "--reentrant": reentrant, "--quiet": quiet},
        )
        from .remotecli import remote_run

        sys.exit(
            remote_run(
                command,
                name,
                remote,
                prefix=key_prefix,
                lease=lease,
                poll=poll,
                wait=wait,
                timeout=timeout,
                kill_after=kill_after,
                lock_dir=lock_dir or lock_dir_arg,
            )
        )
    sys.exit(
        run_command(
            name,
            command,
            lock_dir=lock_dir or lock_dir_arg,
            wait=wait,
            timeout=timeout,
            kill_after=kill_after,
            shared=shared,
            slots=slots,
            reentrant=reentrant,
            allow_other_owner=allow_other_owner,
            quiet=quiet,
        )
    )


@cli.command("each")
@click.argument("template")
@click.argument("command")
@run_options
@click.option("-0", "--null", is_flag=True, help="Items are NUL-separated, not lines.")
@click.option(
    "-k",
    "--keep-going",
    is_flag=True,
    help="Run every item; exit with the number that failed (at most 125).",
)
@click.option(
    "--skip-locked",
    is_flag=True,
    help="With --wait/--no-wait: skip items whose lock stays busy, and say so.",
)
def each_cmd(
    template: str,
    command: str,
    lock_dir: str | None,
    wait: float | None,
    no_wait: bool,
    timeout: float | None,
    kill_after: float,
    shared: bool,
    slots: int | None,
    allow_other_owner: bool | None,
    quiet: bool,
    null: bool,
    keep_going: bool,
    skip_locked: bool,
) -> None:
    """Run COMMAND once per item read from stdin, each under the lock TEMPLATE names.

    {} in TEMPLATE is the item ({{ and }} are literal braces); the command gets the item
    in $LOCAL_MUTEX_ITEM, never pasted into its text, and /dev/null as stdin. Stops at the
    first failing item with its status unless --keep-going. Prints a summary line, plus a
    line for each item that had to wait or failed. One process for all items.
    """
    import os
    import time

    from .batch import read_items, run_each, summary

    wait = _wait_value(wait, no_wait)
    if skip_locked and wait is None:
        raise click.UsageError("--skip-locked needs --wait SECONDS or --no-wait")
    reporter = Reporter(nested=bool(os.environ.get(ENV_HELD)), quiet=quiet, only_contended=True)
    start = time.monotonic()
    try:
        result = run_each(
            read_items(sys.stdin.buffer, null=null),
            template,
            command,
            keep_going=keep_going,
            skip_locked=skip_locked,
            lock_dir=lock_dir,
            wait=wait,
            timeout=timeout,
            kill_after=kill_after,
            shared=shared,
            slots=slots,
            allow_other_owner=allow_other_owner,
            reporter=reporter,
        )
    except (LocalMutexError, KeyboardInterrupt) as exc:
        sys.exit(failure_status(exc, reporter))
    if not quiet or result.failed:
        reporter.write(summary(result, time.monotonic() - start))
    sys.exit(result.status)


@cli.command("hold")
@click.argument("name")
@lock_dir_option
@wait_options
@click.option("--message", metavar="TEXT", help="Why it is held; shown by status.")
@click.option(
    "--ttl",
    type=Seconds(positive=True),
    metavar="SECONDS",
    help="Let go by itself after this long.",
)
@click.option(
    "--slots",
    type=click.IntRange(1, 1024),
    metavar="N",
    help="Take one of N slots of NAME (see run --slots).",
)
@click.option(
    "--allow-other-owner", is_flag=True, default=None, help="Use a lock file owned by another user."
)
@remote_options
@click.option(
    "--poll",
    type=Seconds(positive=True),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="With --remote: how often a waiter looks (plus jitter).",
)
def hold_cmd(
    name: str,
    lock_dir: str | None,
    wait: float | None,
    no_wait: bool,
    message: str | None,
    ttl: float | None,
    slots: int | None,
    allow_other_owner: bool | None,
    remote: str | None,
    key_prefix: str,
    poll: float,
) -> None:
    """Take NAME and keep it after this command returns, until `release`.

    A detached holder process takes the lock; this returns (exit 0) once it holds it and
    prints the token that releases it. The hold ends on `local-mutex release NAME`, when
    --ttl runs out, when the holder dies, or when the GitHub job that took it ends.
    """
    if remote:
        _no_local_only(remote, **{"--slots": slots})
        from .remotecli import remote_hold

        sys.exit(
            remote_hold(
                name,
                remote,
                prefix=key_prefix,
                wait=_wait_value(wait, no_wait),
                poll=poll,
                ttl=ttl,
                message=message,
            )
        )
    from .holds import start_hold

    reporter = Reporter()
    try:
        info = start_hold(
            name,
            lock_dir=lock_dir,
            wait=_wait_value(wait, no_wait),
            ttl=ttl,
            message=message,
            slots=slots,
            allow_other_owner=allow_other_owner,
        )
    except (LocalMutexError, KeyboardInterrupt) as exc:
        sys.exit(failure_status(exc, reporter))
    reporter.write(
        f"holding {info.name} in detached pid {info.pid}; release with: "
        f"local-mutex release {_quote(info.name)} --token {info.token}",
        "notice",
    )
    click.echo(info.token)
    sys.exit(0)


@cli.command("release")
@click.argument("name")
@lock_dir_option
@click.option(
    "--token",
    metavar="TOKEN",
    help="The token `hold` printed (also $LOCAL_MUTEX_HOLD_TOKEN). Not needed "
    "inside the GitHub job that took the hold.",
)
@click.option("--force", is_flag=True, help="End the hold even if another job took it.")
@click.option("--slots", "slotted", is_flag=True, help="Release a slot taken by hold --slots.")
@remote_options
@click.option(
    "--delete-branch",
    is_flag=True,
    help="With --remote: delete the lock branch instead of adding an unlock commit.",
)
def release_cmd(
    name: str,
    lock_dir: str | None,
    token: str | None,
    force: bool,
    slotted: bool,
    remote: str | None,
    key_prefix: str,
    delete_branch: bool,
) -> None:
    """End a hold on NAME. Releasing a free lock is a no-op (exit 0).

    Only holds started by this job (or with its token) are ended, unless --force.
    A lock held by a running command rather than a hold is never touched (exit 77).
    """
    if remote:
        _no_local_only(remote, **{"--slots": slotted})
        from .remotecli import remote_release

        sys.exit(
            remote_release(
                name,
                remote,
                prefix=key_prefix,
                token=token,
                force=force,
                delete_branch=delete_branch,
            )
        )
    if delete_branch:
        raise click.UsageError("--delete-branch needs --remote")
    from .holds import release

    reporter = Reporter()
    try:
        done = release(name, lock_dir=lock_dir, token=token, force=force, slots=slotted)
    except (LocalMutexError, KeyboardInterrupt) as exc:
        sys.exit(failure_status(exc, reporter))
    if done.was_held:
        held = "" if done.held_seconds is None else f" after {done.held_seconds:.1f}s"
        reporter.write(f"released {name} (hold pid {done.pid}){held}", "notice")
    else:
        reporter.write(f"{name} is not held; nothing to release", "notice")
    sys.exit(0)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@cli.command("status")
@click.argument("name")
@lock_dir_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object (schema in the README).")
@remote_options
def status_cmd(
    name: str, lock_dir: str | None, as_json: bool, remote: str | None, key_prefix: str
) -> None:
    """Is NAME free or held; by whom, since when; who waits, in order.

    Exit 0 free, 1 held, 3 cannot tell, 2 bad input. Never creates the lock file and,
    on Linux, never takes the lock.
    """
    if remote:
        from .remotecli import remote_status

        sys.exit(remote_status(name, remote, prefix=key_prefix, as_json=as_json))
    from .showstate import show_status

    sys.exit(show_status(name, lock_dir, as_json))


@cli.command("history")
@click.argument("name")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="A JSON array, oldest first.")
def history_cmd(name: str, remote: str | None, key_prefix: str, as_json: bool) -> None:
    """Who locked, unlocked and took over NAME on a git remote, when, and why."""
    if not remote:
        raise click.UsageError("history needs --remote URL (or $LOCAL_MUTEX_REMOTE)")
    from .remotecli import remote_history

    sys.exit(remote_history(name, remote, prefix=key_prefix, as_json=as_json))


@cli.command("list")
@lock_dir_option
@click.option("--json", "as_json", is_flag=True, help="A JSON array of status objects.")
@click.option("--all", "include_free", is_flag=True, help="Include free lock files too.")
def list_cmd(lock_dir: str | None, as_json: bool, include_free: bool) -> None:
    """Every lock in the directory that is held, longest-held first."""
    from .showstate import show_list

    sys.exit(show_list(lock_dir, as_json, include_free))


def dispatch(args: Sequence[str]) -> int:
    """Run the click tree; options before a name mean the ``run`` verb."""
    argv = list(args)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "run")
    try:
        cli.main(argv, prog_name="local-mutex", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
