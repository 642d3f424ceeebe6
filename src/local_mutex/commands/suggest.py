"""What a mistyped command line most likely meant: a verb misspelt as a lock's name, an
option misspelt or borrowed from flock(1) or another verb. Only error paths import it."""

from __future__ import annotations

from .options import BORROWED, EACH, HOLD, OPTIONS, RUN, TYPED_AMISS, VERBS, Option, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .argv import Parsed

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
_NO_COMMAND = ("-c", "-o")  # the hints above that speak of a command: not for hold
_DOLLAR_SHORT = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def shown_options(typed: Sequence[str]) -> list[str]:
    """The options as typed, for a line printed to a log: a --token's value left out and a
    --remote URL's password masked (CI logs keep what a hint says)."""
    shown: list[str] = []
    for word in typed:
        flag, eq, value = word.partition("=")
        before = shown[-1] if shown else ""
        if before == "--token" or (flag == "--token" and eq):
            shown.append(f"{flag}{eq}<token>" if eq else "<token>")
        elif before == "--remote" or (flag == "--remote" and eq):
            # Only here: it loads `re` and `urllib.parse`, and a plain run that merely
            # passes through ``refuse_a_misreading`` would keep them in its module cache.
            from ..backends.secrets import mask

            shown.append(f"{flag}{eq}{mask(value)}" if eq else mask(word))
        else:
            shown.append(word)
    return shown


def paste_quote(text: str) -> str:
    """``text`` as one word of a line people paste into their shell. Where it holds what
    the line's printer would escape (a newline, an escape), bash's ``$'...'`` (zsh's, ksh's,
    POSIX sh's since 2024): quoted plainly, the pasted line would carry the escape's
    backslash. Only for that outer line: a COMMAND quoted inside it goes to /bin/sh, which
    (dash) may not read ``$'...'``, and keeps its characters as they are."""
    from ..names import shell_quote
    from ..ui.lines import printable

    if printable(text) == text:
        return shell_quote(text)
    return "$'" + "".join(_dollar_escaped(c, printable) for c in text) + "'"


def _dollar_escaped(c: str, printable: Callable[[str], str]) -> str:
    if c in _DOLLAR_SHORT:
        return _DOLLAR_SHORT[c]
    if printable(c) == c:
        return c
    if "\udc80" <= c <= "\udcff":  # an argument's raw byte, which no code point stands for
        return f"\\x{ord(c) - 0xDC00:02x}"
    return f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{ord(c):04x}"


def _typo(word: str, verb: str) -> bool:
    """Is ``word`` a slip in typing ``verb``: two neighbours swapped (``stauts``), a letter
    doubled (``releease``, ``statuss``), or one left out of a long verb (``relase``)?
    Never a letter put for another, another letter added at the end or one left out of a
    short verb: those make the words people name locks (``hood``, ``holds``, ``stats``)."""
    if len(word) == len(verb):
        diff = [i for i in range(len(word)) if word[i] != verb[i]]
        return (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and (word[diff[0]], word[diff[1]]) == (verb[diff[1]], verb[diff[0]])
        )
    if len(word) == len(verb) - 1 and len(verb) >= 7:
        return any(verb[:i] + verb[i + 1 :] == word for i in range(1, len(verb) - 1))
    if len(word) == len(verb) + 1:
        return any(
            word[:i] + word[i + 1 :] == verb and word[i] == word[i - 1] for i in range(1, len(word))
        )
    return False


def verb_meant(word: str) -> str | None:
    """The verb a lock name most likely stands for, mistyped (``relase``, ``stauts``) or
    another tool's (``unlock``), or None. Verbs without NAME (``list``) and short ones
    (``run``) are left out: their neighbours (``lint``, ``rum``) are names people use."""
    lowered = word.lower()
    if lowered in BORROWED:
        return BORROWED[lowered]
    for verb in TYPED_AMISS:
        if _typo(lowered, verb):
            return verb
    return None


def option_meant(flag: str, verb: str, known: dict[str, Option]) -> str | None:
    """A hint for an option this verb does not know: flock(1)'s, another verb's, or the
    nearest spelling of one of ours."""
    name = flag.partition("=")[0]
    if name in _FLOCK and (verb in (RUN, EACH) or (verb == HOLD and name not in _NO_COMMAND)):
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


def no_such_option(
    flag: str,
    verb: str,
    known: dict[str, Option],
    after_dash: Sequence[str] = (),
    typed: Sequence[str] = (),
) -> UsageError:
    """``after_dash``: ``-- NAME`` came first, and these words from NAME on (the option
    among them): cpu-mutex's ``-- make -j8``, unless the option is ours mistyped."""
    hint = option_meant(flag, verb, known)
    said = flag.partition("=")[0] if flag.startswith("--") else flag  # --token=SECRET: no
    if after_dash and (not hint or _on_path(after_dash[0])):  # a program's, not ours
        name, *words = after_dash
        return UsageError(program_after_dash(f"no such option: {said!r}", name, words, typed))
    return UsageError(
        f"no such option: {said!r}{f' ({hint})' if hint else ''} (see local-mutex {verb} --help)"
    )


def refuse_a_misreading(name: str, command: str, dashed: bool, typed: Sequence[str] = ()) -> None:
    """``local-mutex NAME COMMAND`` with a one-word COMMAND that most likely meant something
    else: a verb misspelt (``relase ./deploy.sh`` would run the deploy), or a program after
    a ``--`` that only ends the options (cpu-mutex's ``-- vitest run`` would lock "vitest"
    and run "run"). ``run`` takes such words as they are. The lines said to run instead
    keep the options ``typed``."""
    meant = None if dashed else verb_meant(name)
    options = "".join(f" {paste_quote(word)}" for word in shown_options(typed))
    if meant is not None:
        raise UsageError(
            f"{name!r} is no verb here: did you mean {meant}? Nothing ran; for a lock named "
            f"{name!r} running {command!r}: {_as_is(name, command, options)}"
        )
    if dashed and not name.startswith("-") and name not in VERBS and _on_path(name):
        raise UsageError(
            f"a -- before NAME only ends the options: {name!r} would be the lock's name "
            f"and {command!r} the command. Nothing ran; to run the program under a lock: "
            f"local-mutex{options} NAME -- {paste_quote(name)} {paste_quote(command)}; for "
            f"a lock named {name!r}: {_as_is(name, command, options)}"
        )


def quote_hint(verb: str, parsed: Parsed, problem: str, *more: str) -> str:
    """A command typed unquoted: the two lines that run it as one."""
    from ..names import shell_quote

    # The line runs what was typed: each word as one, the options too, and a `--` before
    words, name = [*parsed.positionals[1:], *more], parsed.positionals[0]  # a verb's name
    head = " ".join(
        [
            "local-mutex",
            *(["each"] if verb == EACH else []),
            *(paste_quote(w) for w in shown_options(parsed.typed)),
            *(["--"] if name.startswith("-") or name in VERBS else []),
            paste_quote(name),
        ]
    )
    return (
        f"{problem}; the command must be one quoted argument ({head} "  # read by sh -c:
        f"{paste_quote(' '.join(map(shell_quote, words)))}) or follow -- ({head} -- "
        f"{' '.join(map(paste_quote, words))})"
    )


def program_after_dash(
    problem: str, name: str, words: Sequence[str], typed: Sequence[str], unsure: bool = False
) -> str:
    """A leading ``--`` and a program after it, cpu-mutex's way (``-- make -j8``): the ``--``
    only ended the options, so the program's name became the lock's. ``unsure``: the words
    may be meant as they are (an option of ours mistyped, a command left out) unless the
    name is a program's."""
    if unsure and not _on_path(name):
        return problem
    options = "".join(f" {paste_quote(word)}" for word in shown_options(typed))
    program = " ".join(paste_quote(w) for w in (name, *words))
    return (
        f"{problem}; a -- before NAME only ends the options, and {name!r} is the lock's name "
        f"here. Nothing ran; to run the program under a lock: local-mutex{options} NAME -- "
        f"{program}"
    )


def _on_path(name: str) -> bool:
    """``shutil.which(name)``, without ``shutil`` (it loads ``re``; a run that passes here
    is a plain run, which must stay light)."""
    import os

    def runnable(path: str) -> bool:
        return os.access(path, os.X_OK) and not os.path.isdir(path)

    if "/" in name:
        return runnable(name)
    path = os.environ.get("PATH", os.defpath).split(os.pathsep)
    return any(runnable(os.path.join(folder or ".", name)) for folder in path)


def _as_is(name: str, command: str, options: str) -> str:
    return f"local-mutex run{options} {paste_quote(name)} {paste_quote(command)}"
