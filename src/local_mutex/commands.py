"""The click command tree. Imported only for verbs and options, never for the plain form."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import click

from ._version import __version__
from .cli import run_command

MAX_SECONDS = 1e9


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
  local-mutex status NAME        local-mutex list

COMMAND runs under /bin/sh -c once no other holder of NAME is running; the lock is
released the instant the holder ends, however it ends. Lock files live in LOCK_DIR,
else $LOCAL_MUTEX_LOCK_DIR, else /tmp.

\b
Exit status: the command's own (128+N when killed by signal N); 2 bad usage or
input; 75 lock not acquired in time; 124/137 run ceiling hit (SIGTERM/SIGKILL
needed); 125 the command could not be started.
"""


@click.group(help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="local-mutex")
def cli() -> None:
    pass


@cli.command("run")
@click.argument("name")
@click.argument("command")
@click.argument("lock_dir_arg", metavar="[LOCK_DIR]", required=False)
@click.option("--lock-dir", metavar="DIR", help="Directory of lock files (same as LOCK_DIR).")
@click.option(
    "--wait",
    type=Seconds(),
    metavar="SECONDS",
    help="Give up after waiting this long for the lock: exit 75, command not run.",
)
@click.option("--no-wait", is_flag=True, help="Fail at once (exit 75) if the lock is held.")
@click.option(
    "--timeout",
    type=Seconds(positive=True),
    metavar="SECONDS",
    help="Run ceiling from the command's start: SIGTERM to its process group, "
    "SIGKILL after --kill-after; exit 124 or 137.",
)
@click.option(
    "--kill-after",
    type=Seconds(),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="Grace between SIGTERM and SIGKILL for --timeout.",
)
@click.option(
    "--shared",
    is_flag=True,
    help="Take a reader lock: shared holders overlap, an exclusive one waits for all.",
)
@click.option(
    "--allow-other-owner",
    is_flag=True,
    default=None,
    help="Use a lock file owned by another user (also LOCAL_MUTEX_ALLOW_OTHER_OWNER=1).",
)
@click.option("-q", "--quiet", is_flag=True, help="Print only errors, not the bookends.")
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
    allow_other_owner: bool | None,
    quiet: bool,
) -> None:
    """Run COMMAND under the lock NAME (the verb-free form does the same).

    A lock literally named like a verb (run, status, list, each, hold, release) is
    reached through this spelling: local-mutex run status 'make'.
    """
    if lock_dir and lock_dir_arg and lock_dir != lock_dir_arg:
        raise click.UsageError("LOCK_DIR and --lock-dir disagree; give one of them")
    if no_wait and wait is not None:
        raise click.UsageError("--wait and --no-wait exclude each other")
    sys.exit(
        run_command(
            name,
            command,
            lock_dir=lock_dir or lock_dir_arg,
            wait=0.0 if no_wait else wait,
            timeout=timeout,
            kill_after=kill_after,
            shared=shared,
            allow_other_owner=allow_other_owner,
            quiet=quiet,
        )
    )


@cli.command("status")
@click.argument("name")
@click.option("--lock-dir", metavar="DIR", help="Directory of lock files.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (schema in the README).")
def status_cmd(name: str, lock_dir: str | None, as_json: bool) -> None:
    """Is NAME free or held; by whom, since when; who waits, in order.

    Exit 0 free, 1 held, 3 cannot tell, 2 bad input. Never creates the lock file and,
    on Linux, never takes the lock.
    """
    from .showstate import show_status

    sys.exit(show_status(name, lock_dir, as_json))


@cli.command("list")
@click.option("--lock-dir", metavar="DIR", help="Directory of lock files.")
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
