"""The one table of options, and the parser every command line goes through.

The same table builds the click tree (``clicktree``), which renders ``--help`` and shell
completion, so help and parser cannot drift. Parsing itself never imports click: a nested
``local-mutex -q --wait 5 NAME CMD`` in a loop pays only for what it runs.

Forms (options may come anywhere before ``--``)::

    local-mutex [run] [OPTIONS] NAME COMMAND [LOCK_DIR]
    local-mutex [run] [OPTIONS] NAME -- PROGRAM [ARGS...]
    local-mutex each [OPTIONS] TEMPLATE COMMAND        (or TEMPLATE -- PROGRAM [ARGS...])
    local-mutex hold|release|status|history [OPTIONS] NAME
    local-mutex list [OPTIONS]

A ``--`` before any positional only ends the options (a name may then start with ``-``); a
``--`` after NAME (TEMPLATE) starts the program's argv, taken verbatim.
"""

from __future__ import annotations

import os

from ..errors import ValidationError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

RUN, EACH, HOLD, RELEASE, STATUS, LIST, HISTORY = (
    "run",
    "each",
    "hold",
    "release",
    "status",
    "list",
    "history",
)
VERBS = (RUN, EACH, HOLD, RELEASE, STATUS, LIST, HISTORY)
TAKING = frozenset({RUN, EACH, HOLD})
EVERY = frozenset(VERBS)
MAX_SECONDS = 1e9
MAX_SLOTS = 1024


class UsageError(ValidationError):
    """The command line itself is wrong (exit 2)."""


class Option:
    """One option: its flags, where its value goes, what kind of value, and for which
    verbs. ``kind``: flag, seconds (>= 0), positive (> 0), count (1..1024), text, dir."""

    __slots__ = ("default", "dest", "flags", "help", "kind", "metavar", "verbs")

    def __init__(
        self,
        flags: tuple[str, ...],
        dest: str,
        kind: str,
        verbs: frozenset[str],
        help: str,
        *,
        metavar: str = "",
        default: object = None,
    ) -> None:
        self.flags, self.dest, self.kind, self.verbs = flags, dest, kind, verbs
        self.help, self.metavar, self.default = help, metavar, default


def _v(*verbs: str) -> frozenset[str]:
    return frozenset(verbs)


OPTIONS = (
    Option(
        ("--lock-dir",),
        "lock_dir",
        "dir",
        EVERY - {HISTORY},
        "Directory of lock files (else $LOCAL_MUTEX_LOCK_DIR, else /tmp).",
        metavar="DIR",
    ),
    Option(
        ("--wait",),
        "wait",
        "seconds",
        TAKING,
        "Give up after waiting this long for the lock: exit 75, nothing run.",
        metavar="SECONDS",
    ),
    Option(
        ("--no-wait",), "no_wait", "flag", TAKING, "Fail at once (exit 75) if the lock is held."
    ),
    Option(
        ("--timeout",),
        "timeout",
        "positive",
        _v(RUN, EACH),
        "Run ceiling from the "
        "command's start: SIGTERM to its process group, SIGKILL after --kill-after; "
        "exit 124 or 137.",
        metavar="SECONDS",
    ),
    Option(
        ("--kill-after",),
        "kill_after",
        "seconds",
        _v(RUN, EACH),
        "Grace between SIGTERM and SIGKILL when local-mutex stops the command [default: 5].",
        metavar="SECONDS",
        default=5.0,
    ),
    Option(
        ("--shared",),
        "shared",
        "flag",
        _v(RUN, EACH),
        "Take a reader lock: shared holders overlap, an exclusive one waits for all.",
    ),
    Option(
        ("--slots",),
        "slots",
        "count",
        TAKING,
        "Counting semaphore: at most N holders of NAME at once.",
        metavar="N",
    ),
    Option(
        ("--slots",),
        "slotted",
        "flag",
        _v(RELEASE, STATUS),
        "The name is a counting semaphore (taken with --slots N).",
    ),
    Option(
        ("--reentrant",),
        "reentrant",
        "flag",
        _v(RUN),
        "Run inside a `hold` of NAME "
        "taken by this job (or $LOCAL_MUTEX_HOLD_TOKEN) instead of waiting for it.",
    ),
    Option(
        ("--allow-other-owner",),
        "allow_other_owner",
        "flag",
        EVERY - {HISTORY},
        "Use a lock file owned by another user (also LOCAL_MUTEX_ALLOW_OTHER_OWNER=1).",
    ),
    Option(("-q", "--quiet"), "quiet", "flag", TAKING | {RELEASE}, "Print only errors."),
    Option(
        ("--remote",),
        "remote",
        "text",
        EVERY,
        "Lock on a git remote (an https/ssh/file "
        "URL, or `self`: this GitHub repository) or a PostgreSQL database "
        "(postgresql://...) instead of this machine; also $LOCAL_MUTEX_REMOTE.",
        metavar="URL",
    ),
    Option(
        ("--key-prefix",),
        "key_prefix",
        "text",
        EVERY - {LIST},
        "With a git --remote: branch prefix of locks [default: lock__].",
        metavar="PREFIX",
    ),
    Option(
        ("--lease",),
        "lease",
        "positive",
        _v(RUN, EACH),
        "With a git --remote: lease, "
        "renewed while the command runs; a holder that died is taken over once it "
        "expires [default: 60].",
        metavar="SECONDS",
    ),
    Option(
        ("--poll",),
        "poll",
        "positive",
        TAKING,
        "With a git --remote: how often a waiter looks, plus jitter [default: 5].",
        metavar="SECONDS",
    ),
    Option(("-0", "--null"), "null", "flag", _v(EACH), "Items are NUL-separated, not lines."),
    Option(
        ("-k", "--keep-going"),
        "keep_going",
        "flag",
        _v(EACH),
        "Run every item; exit with the number that failed (at most 125).",
    ),
    Option(
        ("--skip-locked",),
        "skip_locked",
        "flag",
        _v(EACH),
        "With --wait/--no-wait: skip items whose lock stays busy, and say so.",
    ),
    Option(
        ("--message",),
        "message",
        "text",
        _v(RUN, HOLD),
        "Why it is held; shown by status and in others' waiting lines.",
        metavar="TEXT",
    ),
    Option(
        ("--ttl",),
        "ttl",
        "positive",
        _v(HOLD),
        "Let go by itself after this long.",
        metavar="SECONDS",
    ),
    Option(
        ("--token",),
        "token",
        "text",
        _v(RELEASE),
        "The token `hold` printed (also "
        "$LOCAL_MUTEX_HOLD_TOKEN); not needed inside the GitHub job that took the hold.",
        metavar="TOKEN",
    ),
    Option(("--force",), "force", "flag", _v(RELEASE), "End the hold even if another job took it."),
    Option(
        ("--delete-branch",),
        "delete_branch",
        "flag",
        _v(RELEASE),
        "With a git --remote: delete the lock branch instead of adding an unlock commit.",
    ),
    Option(
        ("--json",), "json", "flag", _v(STATUS, LIST, HISTORY), "Print JSON (schema in the README)."
    ),
    Option(("--all",), "include_free", "flag", _v(LIST), "Include free lock files too."),
)

POSITIONALS = {
    RUN: ("NAME", "COMMAND", "[LOCK_DIR]"),
    EACH: ("TEMPLATE", "COMMAND"),
    HOLD: ("NAME",),
    RELEASE: ("NAME",),
    STATUS: ("NAME",),
    HISTORY: ("NAME",),
    LIST: (),
}


def options_for(verb: str) -> list[Option]:
    return [o for o in OPTIONS if verb in o.verbs]


class Parsed:
    """A parsed command line: positionals, the program's argv after ``--`` (or None),
    option values by ``dest`` (defaults filled in) and which options were given."""

    __slots__ = ("argv", "given", "positionals", "values", "verb")

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.positionals: list[str] = []
        self.argv: list[str] | None = None
        self.values: dict[str, object] = {o.dest: o.default for o in options_for(verb)}
        self.given: set[str] = set()

    def flag(self, dest: str) -> bool:
        return bool(self.values.get(dest))

    def text(self, dest: str) -> str | None:
        value = self.values.get(dest)
        return value if isinstance(value, str) else None

    def number(self, dest: str) -> float | None:
        value = self.values.get(dest)
        return float(value) if isinstance(value, (int, float)) else None

    def count(self, dest: str) -> int | None:
        value = self.values.get(dest)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def wait(self) -> float | None:
        """--wait SECONDS, or 0 for --no-wait; None waits forever."""
        return 0.0 if self.flag("no_wait") else self.number("wait")


def _convert(option: Option, flag: str, raw: str) -> object:
    if option.kind in ("text", "dir"):
        return raw
    if option.kind == "count":
        try:
            value = int(raw)
        except ValueError:
            raise UsageError(f"{flag} needs a whole number, not {raw!r}") from None
        if not 1 <= value <= MAX_SLOTS:
            raise UsageError(f"{flag} {raw!r} is not between 1 and {MAX_SLOTS}")
        return value
    try:
        seconds = float(raw)
    except ValueError:
        raise UsageError(f"{flag} needs a number of seconds, not {raw!r}") from None
    if seconds != seconds or not 0 <= seconds <= MAX_SECONDS:  # NaN is not equal to itself
        raise UsageError(f"{flag} {raw!r} is not between 0 and {MAX_SECONDS:g} seconds")
    if option.kind == "positive" and seconds == 0:
        raise UsageError(f"{flag} {raw!r} must be more than 0 seconds")
    return seconds


def _lookup(verb: str) -> dict[str, Option]:
    return {flag: o for o in options_for(verb) for flag in o.flags}


def wants_help(args: Sequence[str]) -> bool:
    for arg in args:
        if arg == "--":
            return False
        if arg in ("-h", "--help"):
            return True
    return False


def parse(verb: str, args: Sequence[str]) -> Parsed:
    """Parse the arguments after the verb; UsageError says what is wrong."""
    known = _lookup(verb)
    parsed = Parsed(verb)
    takes_argv = verb in (RUN, EACH)
    options_over = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--" and not options_over:
            if takes_argv and parsed.positionals:
                parsed.argv = list(args[i:])
                break
            options_over = True
            continue
        if options_over or not arg.startswith("-") or arg == "-":
            parsed.positionals.append(arg)
            if takes_argv and len(parsed.positionals) == 1 and options_over:
                options_over = False  # options may follow NAME again, and a `--` for argv
            continue
        flag, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        option = known.get(flag)
        if option is None and not arg.startswith("--") and len(arg) > 2:
            i = _short_cluster(arg, known, parsed, verb, i)
            continue
        if option is None:
            raise _unknown(verb, arg, parsed)
        if option.kind == "flag":
            if eq:
                raise UsageError(f"{flag} takes no value")
            parsed.values[option.dest] = True
        else:
            if not eq:
                if i >= len(args):
                    raise UsageError(f"{flag} needs a value ({option.metavar or 'VALUE'})")
                inline = args[i]
                i += 1
            parsed.values[option.dest] = _convert(option, flag, inline)
        parsed.given.add(option.dest)
    _check_shape(verb, parsed)
    return parsed


def _short_cluster(arg: str, known: dict[str, Option], parsed: Parsed, verb: str, i: int) -> int:
    """``-qk``: several short flags in one word."""
    for letter in arg[1:]:
        option = known.get(f"-{letter}")
        if option is None or option.kind != "flag":
            raise _unknown(verb, arg, parsed)
        parsed.values[option.dest] = True
        parsed.given.add(option.dest)
    return i


def _unknown(verb: str, arg: str, parsed: Parsed) -> UsageError:
    if verb in (RUN, EACH) and len(parsed.positionals) >= 2:
        return UsageError(
            _quote_hint(verb, parsed, f"unknown option {arg!r} after the command", arg)
        )
    return UsageError(f"no such option: {arg} (see local-mutex {verb} --help)")


def _quote_hint(verb: str, parsed: Parsed, problem: str, *more: str) -> str:
    from ..names import shell_quote

    words = [*parsed.positionals[1:], *more]
    head = parsed.positionals[0]
    cmd = " ".join(words)
    return (
        f"{problem}; the command must be one quoted argument "
        f"(local-mutex {'each ' if verb == EACH else ''}{shell_quote(head)} "
        f"{shell_quote(cmd)}) or follow -- "
        f"(local-mutex {'each ' if verb == EACH else ''}{shell_quote(head)} -- {cmd})"
    )


def _check_shape(verb: str, parsed: Parsed) -> None:
    count = len(parsed.positionals)
    wanted = POSITIONALS[verb]
    if parsed.flag("no_wait") and "wait" in parsed.given:
        raise UsageError("--wait and --no-wait exclude each other")
    if verb in (RUN, EACH):
        head = wanted[0]
        if count == 0:
            raise UsageError(f"missing {head} (see local-mutex {verb} --help)")
        if parsed.argv is not None:
            if count > 1:
                raise UsageError(
                    f"after {head} comes either a quoted COMMAND or -- and a program, not both"
                )
            if not parsed.argv:
                raise UsageError("missing the program after --")
            return
        if count == 1:
            raise UsageError(f"missing COMMAND after {head} (or -- and a program)")
        if verb == EACH and count > 2:
            raise UsageError(_quote_hint(verb, parsed, f"{count - 1} words after the template"))
        if verb == RUN and count == 3:
            lock_dir = parsed.positionals[2]
            if not os.path.isabs(lock_dir):
                raise UsageError(
                    _quote_hint(verb, parsed, f"lock dir {lock_dir!r} must be an absolute path")
                )
            given = parsed.text("lock_dir")
            if given and given != lock_dir:
                raise UsageError("LOCK_DIR and --lock-dir disagree; give one of them")
            parsed.values["lock_dir"] = lock_dir
        if verb == RUN and count > 3:
            raise UsageError(
                _quote_hint(verb, parsed, f"{count} arguments where NAME COMMAND [LOCK_DIR] go")
            )
        return
    if count != len(wanted):
        need = " ".join(wanted) or "no arguments"
        raise UsageError(
            f"local-mutex {verb} takes {need}, got {count} argument{'s' if count != 1 else ''}"
        )
