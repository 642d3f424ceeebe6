"""The click tree, built from the option table: ``--help`` text and shell completion.

Parsing and running never go through here (``commands.options.parse`` does that), so the
two cannot drift: every option click shows is one the parser takes, and the reverse.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click
from click.shell_completion import CompletionItem

from ..runspec import MAX_SLOTS
from .argv import verb_first
from .options import EACH, HISTORY, HOLD, LIST, RELEASE, RUN, STATUS, Option, options_for

_IMPLICIT_RUN = "local_mutex.implicit_run"  # ctx.meta: the run form without its verb
_DASHED = "local_mutex.dashed"  # ctx.meta: a -- came first (the next word is a name)

HELP = """Run a command under a named lock, held while it runs and released once it is over.

\b
  local-mutex [OPTIONS] NAME COMMAND [LOCK_DIR]
  local-mutex [OPTIONS] NAME -- PROGRAM [ARGS]...

COMMAND runs under /bin/sh -c (PROGRAM runs directly, with its arguments verbatim) once no
other holder of NAME is running; the lock is released when it ends, however it ends (a
holder that is killed stops the command first).
Lock files live in LOCK_DIR or --lock-dir, else $LOCAL_MUTEX_LOCK_DIR, else /tmp;
--remote locks on a git remote or a PostgreSQL database instead.

\b
Exit status: the command's own (128+N when killed by signal N; also when
local-mutex is stopped by signal N before the command started); 2 bad usage or
input; 3 status/list cannot tell; 69 remote unavailable or lock lost mid-run; 70
the supervisor failed mid-run; 74 holder record or answer not written; 75 lock not
acquired in time; 77 release refused; 124/137 run ceiling hit; 125 the command
could not start.
"""

VERB_HELP = {
    RUN: (
        "Run COMMAND (or -- PROGRAM ARGS...) under the lock NAME.",
        "The verb-free form does the same. A lock literally named like a verb (run, "
        "each, hold, release, status, list, history) is reached through this spelling: "
        "local-mutex run status 'make'.",
    ),
    EACH: (
        "Run COMMAND once per item read from stdin, each under the lock TEMPLATE names.",
        "{} in TEMPLATE is the item ({{ and }} are literal braces); the command gets the "
        "item in $LOCAL_MUTEX_ITEM, never pasted into its text, and /dev/null as stdin. "
        "Stops at the first failing item with its status unless --keep-going. One process "
        "for all items.",
    ),
    HOLD: (
        "Take NAME and keep it after this command returns, until `release`.",
        "Prints the token that releases it on stdout (only there). The hold ends on "
        "`local-mutex release NAME`, when --ttl runs out, when its holder dies, or when "
        "the GitHub job that took it ends (git remote holds persist until released).",
    ),
    RELEASE: (
        "End a hold on NAME.",
        "Only holds started by this job (or with its token) are ended, unless --force; "
        "a lock held by a running command is never touched (exit 77). A free lock is a "
        "no-op with a warning; no lock of that name in that place at all is exit 2.",
    ),
    STATUS: (
        "Is NAME free or held; by whom, since when; who waits, in order.",
        "Exit 0 free, 1 held, 3 cannot tell, 2 bad input, 74 the answer not written. Never "
        "creates the lock file and, "
        "on Linux, never takes the lock.",
    ),
    LIST: ("Every lock in the lock dir (or on the remote) that is held.", ""),
    HISTORY: ("Who locked, unlocked and took over NAME on a git remote, when, and why.", ""),
}
ARGUMENTS = {
    RUN: [("name", "NAME"), ("command", "COMMAND [LOCK_DIR] | -- PROGRAM [ARGS]...")],
    EACH: [("template", "TEMPLATE"), ("command", "COMMAND | -- PROGRAM [ARGS]...")],
    HOLD: [("name", "NAME")],
    RELEASE: [("name", "NAME")],
    STATUS: [("name", "NAME")],
    HISTORY: [("name", "NAME")],
    LIST: [],
}


def _click_option(option: Option) -> click.Option:
    kwargs: dict[str, Any] = {"help": option.help}
    if option.kind == "flag":
        kwargs["is_flag"] = True
    elif option.kind == "dir":
        kwargs["type"] = click.Path(file_okay=False, dir_okay=True)
        kwargs["metavar"] = option.metavar
    elif option.kind == "count":
        kwargs["type"] = click.IntRange(1, MAX_SLOTS)
        kwargs["metavar"] = option.metavar
    elif option.kind in ("seconds", "positive"):
        kwargs["type"] = float
        kwargs["metavar"] = option.metavar
    else:
        kwargs["metavar"] = option.metavar
    return click.Option(list(option.flags), **kwargs)


def _verb(verb: str) -> click.Command:
    short, more = VERB_HELP[verb]
    params: list[click.Parameter] = [
        click.Argument(
            [dest],
            metavar=metavar,
            nargs=-1 if dest == "command" else 1,
            shell_complete=_verbs_for_a_bare_name if verb == RUN and dest == "name" else None,
        )
        for dest, metavar in ARGUMENTS[verb]
    ]
    params += [_click_option(o) for o in options_for(verb)]
    return click.Command(
        verb,
        params=params,
        help=f"{short}\n\n{more}" if more else short,
        short_help=short,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def _verbs_for_a_bare_name(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """``local-mutex -q <TAB>``: the word after leading options may be a verb too (the
    parser looks for it there), unless ``run`` was typed."""
    if not ctx.meta.get(_IMPLICIT_RUN) or ctx.meta.get(_DASHED):
        return []
    from click.core import ParameterSource

    # Only the verbs that take every option typed before them (``--wait 5 <TAB>``: no status).
    typed = {
        p.name
        for p in ctx.command.params
        if isinstance(p, click.Option)
        and p.name is not None
        and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE
    }
    return [
        CompletionItem(v)
        for v in VERB_HELP
        if v.startswith(incomplete) and typed <= {o.dest for o in options_for(v)}
    ]


class _Group(click.Group):
    """Top-level help shows the run form and its options first, then the verbs; a first
    word that is not a verb means ``run`` (for help and for completion alike), and a verb
    after leading options is that verb, as the parser reads it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0].startswith("-") and args[0] not in ("-h", "--help", "--version"):
            args = verb_first(args)
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            ctx.meta[_DASHED] = "--" in args  # when completing a NAME: it came before it
            args = [RUN, *args]
            ctx.meta[_IMPLICIT_RUN] = True
        return super().parse_args(ctx, args)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """``local-mutex -<TAB>``: the run form's options and --version as well (the
        group itself has only help), as the top-level help lists them."""
        if not incomplete.startswith("-"):
            return super().shell_complete(ctx, incomplete)
        run = self.commands[RUN]
        flags = [f for p in run.params if isinstance(p, click.Option) for f in p.opts]
        flags += ["--version", "-h", "--help"]
        return [CompletionItem(f) for f in flags if f.startswith(incomplete)]

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(
            "local-mutex", "[OPTIONS] NAME (COMMAND [LOCK_DIR] | -- PROGRAM [ARGS]...)"
        )
        formatter.write_usage("local-mutex", "VERB [ARGS]...", prefix="   or: ")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        run = self.commands[RUN]
        rows = [p.get_help_record(ctx) for p in run.params if isinstance(p, click.Option)]
        rows.append(("--version", "Show the version and exit."))
        rows.append(("-h, --help", "Show this message and exit."))
        with formatter.section("Options (of the run form)"):
            formatter.write_dl([r for r in rows if r is not None])
        self.format_commands(ctx, formatter)


def tree() -> click.Group:
    group = _Group(
        "local-mutex",
        help=HELP,
        context_settings={"help_option_names": ["-h", "--help"]},
        commands={verb: _verb(verb) for verb in (RUN, EACH, HOLD, RELEASE, STATUS, LIST, HISTORY)},
    )
    group.params.append(
        click.Option(["--version"], is_flag=True, expose_value=False, is_eager=True, hidden=True)
    )
    return group


def show(args: Sequence[str]) -> int:
    """Help, or completion: what click is here for."""
    try:
        tree().main(list(args), prog_name="local-mutex", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(show(sys.argv[1:]))
