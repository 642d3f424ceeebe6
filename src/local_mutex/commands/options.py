"""The one table of options: the parser (``argv.py``) and the click tree
(``clicktree.py``, for ``--help`` and shell completion) are both built from it, so help
and parser cannot drift. Nothing here imports click."""

from __future__ import annotations

from ..errors import ValidationError

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
# Verbs a slip of the finger may turn into a lock's name, and other tools' verbs for ours
# (``suggest.verb_meant``).
TYPED_AMISS = (HOLD, RELEASE, STATUS, HISTORY, EACH)
BORROWED = {"lock": "hold (a lock that spans commands) or run", "unlock": "release"}
BORROWED.update({"check": "status", "acquire": "hold"})
TAKING = frozenset({RUN, EACH, HOLD})
EVERY = frozenset(VERBS)


_NUMBER = frozenset("0123456789.eE+-")


def is_plain_number(text: str) -> bool:
    """Digits, a point, an exponent: what ``float``/``int`` should be given. They also take
    ``1_0``, `` 5 ``, ``inf`` and non-ASCII digits, none of which a number of seconds is."""
    return bool(text) and all(c in _NUMBER for c in text)


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
        "Grace between SIGTERM and SIGKILL when local-mutex stops the command, 7 at most "
        "after a stop signal it relays [default: 5].",
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
    Option(
        ("-q", "--quiet"),
        "quiet",
        "flag",
        EVERY,
        "Print only errors and warnings (status, list, history: no answer, just the exit status).",
    ),
    Option(
        ("--remote",),
        "remote",
        "text",
        EVERY,
        "Lock on a git remote (https://, http://, ssh://, git://, file:///path, "
        "user@host:path, or `self`: this GitHub repository) or a PostgreSQL database "
        "(postgresql://...) instead of this machine; also $LOCAL_MUTEX_REMOTE.",
        metavar="URL",
    ),
    Option(
        ("--key-prefix",),
        "key_prefix",
        "text",
        EVERY,
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
        "The token `hold` printed; better in $LOCAL_MUTEX_HOLD_TOKEN (a command line is "
        "anybody's to read); not needed inside the GitHub job that took the hold.",
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
