"""What a mistyped command line most likely meant: a verb misspelt as a lock's name, an
option misspelt or borrowed from flock(1) or another verb. Only error paths import it."""

from __future__ import annotations

from .options import OPTIONS, VERBS, Option, UsageError

# flock(1)'s options, as its users type them out of habit.
_FLOCK = {
    "-w": "flock's -w is --wait SECONDS here",
    "-n": "flock's -n is --no-wait here",
    "--nonblock": "flock's --nonblock is --no-wait here",
    "-s": "flock's -s is --shared here",
    "-x": "locks are exclusive unless --shared: no option needed",
    "--exclusive": "locks are exclusive unless --shared: no option needed",
    "-c": "COMMAND is one quoted argument (or a program after --): no option needed",
    "-o": "the lock stays with the command's processes until all are gone: no option needed",
    "-E": "a lock not taken in time exits 75: no option needed",
}
# Verbs other tools have, and what says the same here.
_ELSEWHERE = {
    "lock": "hold (a lock that spans commands) or run",
    "unlock": "release",
    "check": "status",
    "acquire": "hold",
}


def _one_edit(a: str, b: str) -> bool:
    """Are these one insertion, deletion, substitution or swap of neighbours apart?"""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and a[diff[0]] == b[diff[1]]
            and a[diff[1]] == b[diff[0]]
        )
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def verb_meant(word: str) -> str | None:
    """The verb a lock name most likely stands for, mistyped (``relase``, ``Status``,
    ``unlock``), or None. Verbs without NAME (``list``) and short ones (``run``) are left
    out: their neighbours (``lint``, ``rum``) are names people give locks."""
    lowered = word.lower()
    if lowered in _ELSEWHERE:
        return _ELSEWHERE[lowered]
    if lowered in VERBS and lowered != word:
        return lowered
    for verb in ("hold", "release", "status", "history", "each"):
        if len(word) >= 4 and _one_edit(lowered, verb):
            return verb
    return None


def option_meant(flag: str, verb: str, known: dict[str, Option]) -> str | None:
    """A hint for an option this verb does not know: flock(1)'s, another verb's, or the
    nearest spelling of one of ours."""
    name = flag.partition("=")[0]
    if name in _FLOCK:
        return _FLOCK[name]
    others = sorted({v for o in OPTIONS if name in o.flags for v in o.verbs} - {verb})
    if others:
        verbs = ", ".join(others[:-1]) + " and " + others[-1] if len(others) > 1 else others[0]
        return f"{name} is an option of {verbs}, not of {verb}"
    import difflib

    spelled = difflib.get_close_matches(
        name, [f for f in known if f.startswith("--")] if name.startswith("--") else [], 1, 0.7
    )
    return f"did you mean {spelled[0]}?" if spelled else None


def refuse_a_misreading(name: str, command: str, dashed: bool) -> None:
    """``local-mutex NAME COMMAND`` with a one-word COMMAND that most likely meant something
    else: a verb misspelt (``relase ./deploy.sh`` would run the deploy), or a program after
    a ``--`` that only ends the options (cpu-mutex's ``-- vitest run`` would lock "vitest"
    and run "run"). ``run`` takes such words as they are."""
    meant = None if dashed else verb_meant(name)
    if meant is not None:
        raise UsageError(
            f"{name!r} is no verb here: did you mean {meant}? Nothing ran; for a lock named "
            f"{name!r} running {command!r}: {_as_is(name, command)}"
        )
    if dashed and not name.startswith("-") and name not in VERBS:
        import shutil  # only after a `--` before NAME: a plain run never pays for it

        if shutil.which(name):
            from ..names import shell_quote

            raise UsageError(
                f"a -- before NAME only ends the options: {name!r} would be the lock's name "
                f"and {command!r} the command. Nothing ran; to run the program under a lock: "
                f"local-mutex NAME -- {shell_quote(name)} {command}; for a lock named "
                f"{name!r}: {_as_is(name, command)}"
            )


def _as_is(name: str, command: str) -> str:
    from ..names import shell_quote

    return f"local-mutex run {shell_quote(name)} {shell_quote(command)}"
