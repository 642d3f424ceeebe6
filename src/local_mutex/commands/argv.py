"""Parsing a command line against the option table (``options.py``), without click.

Forms (options may come anywhere before ``--``, but not after a one-word COMMAND: its own?)::

    local-mutex [run] [OPTIONS] NAME COMMAND [LOCK_DIR]
    local-mutex [run] [OPTIONS] NAME -- PROGRAM [ARGS...]
    local-mutex each [OPTIONS] TEMPLATE COMMAND        (or TEMPLATE -- PROGRAM [ARGS...])
    local-mutex hold|release|status|history [OPTIONS] NAME
    local-mutex list [OPTIONS]

Options may come before the verb too (``local-mutex -q status NAME``). A ``--`` before any
positional only ends the options (a name may then start with ``-``, or be a verb's); a
``--`` after NAME (TEMPLATE) starts the program's argv, taken verbatim.
"""

from __future__ import annotations

import os

from ..runspec import MAX_SECONDS, MAX_SLOTS
from .options import (
    BORROWED,
    EACH,
    HOLD,
    OPTIONS,
    POSITIONALS,
    RELEASE,
    RUN,
    STATUS,
    TYPED_AMISS,
    VERBS,
    Option,
    UsageError,
    is_plain_number,
    options_for,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence


class Parsed:
    """A parsed command line: positionals, the program's argv after ``--`` (or None),
    option values by ``dest`` (defaults filled in) and which options were given."""

    __slots__ = ("argv", "dashed", "given", "positionals", "typed", "values", "verb")

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.positionals: list[str] = []
        self.argv: list[str] | None = None
        self.values: dict[str, object] = {o.dest: o.default for o in options_for(verb)}
        self.given: set[str] = set()
        self.typed: list[str] = []  # the options as typed, for a usage hint to repeat
        # NAME came after a -- that ended the options: how many words of ``typed`` before it
        self.dashed: int | None = None

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
            value = int(raw) if raw.isascii() and raw.isdigit() else int("x")
        except ValueError:
            raise UsageError(f"{flag} needs a whole number, not {raw!r}") from None
        if not 1 <= value <= MAX_SLOTS:
            raise UsageError(f"{flag} {raw!r} is not between 1 and {MAX_SLOTS}")
        return value
    try:
        seconds = float(raw if is_plain_number(raw) else "x")
    except ValueError:
        raise UsageError(f"{flag} needs a number of seconds, not {raw!r}") from None
    positive = option.kind == "positive"
    # NaN is not equal to itself.
    if seconds != seconds or not 0 <= seconds <= MAX_SECONDS or (positive and seconds == 0):
        if positive:
            raise UsageError(
                f"{flag} {raw!r} must be more than 0 and at most {MAX_SECONDS:g} seconds"
            )
        raise UsageError(f"{flag} {raw!r} is not between 0 and {MAX_SECONDS:g} seconds")
    return seconds


def _lookup(verb: str) -> dict[str, Option]:
    return {flag: o for o in options_for(verb) for flag in o.flags}


def _option_words(args: Sequence[str]) -> Iterator[tuple[int, str, bool]]:
    """(index, word, is it an option) for each word before ``--``, an option's value
    skipped (``--message -h`` holds no ``-h``)."""
    takes_value = {f for o in OPTIONS if o.kind != "flag" for f in o.flags}
    # A flag for some verbs, a value for others (``--slots``): as the verb takes it once
    # it is known (``status --slots --help``); before a verb, a flag.
    flag_too = {f for o in OPTIONS if o.kind == "flag" for f in o.flags} & takes_value
    verb = None  # the first word that is not an option names it (else: run)
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--":
            return
        is_option = arg.startswith("-") and arg != "-"
        yield i, arg, is_option
        if not is_option:
            verb = verb or (arg if arg in VERBS else RUN)
            continue
        skip = arg in takes_value
        if skip and arg in flag_too:
            if verb is not None:
                option = _lookup(verb).get(arg)  # None: not the verb's (parse says so)
                skip = option is not None and option.kind != "flag"
            elif i + 1 < len(args) and args[i + 1] in VERBS:
                skip = False


def wants_help(args: Sequence[str]) -> bool:
    """``-h``/``--help`` as an option, not as the value of one, nor after a one-word
    command (``local-mutex NAME ls -h``: the command's, most likely; ``parse`` says so)."""
    shorts = {f[1] for o in OPTIONS for f in o.flags if len(f) == 2} | {"h"}
    words: list[str] = []  # the positionals so far (a verb first, if any)
    for _, arg, is_option in _option_words(args):
        if not is_option:
            words.append(arg)
            continue
        if arg in ("-h", "--help") or (arg[1] != "-" and "h" in arg and set(arg[1:]) <= shorts):
            return not _after_one_word_command(words)
    return False


def asks_version(args: Sequence[str]) -> bool:
    """``--version`` where ``wants_help`` would take ``--help``; eager, as help is."""
    words: list[str] = []
    for _, arg, is_option in _option_words(args):
        if not is_option:
            words.append(arg)
        elif arg == "--version":
            return not _after_one_word_command(words)
    return False


def help_args(args: Sequence[str]) -> list[str]:
    """What click gets for the help asked for: the verb's (run's for the verb-free form),
    nothing else -- click refuses what we take (``--version``) in an error of its own."""
    words = [arg for _, arg, is_option in _option_words(args) if not is_option]
    if words:
        return [words[0] if words[0] in VERBS else RUN, "--help"]
    bare = {"-h", "--help", "--version"}
    return ["--help"] if set(args) <= bare else [RUN, "--help"]


def _after_one_word_command(words: Sequence[str]) -> bool:
    """Whether these positionals (a verb first, if any) end in a run's or each's one-word
    command: an option after it may be the command's as well as ours."""
    if words and words[0] in VERBS:
        if words[0] not in (RUN, EACH):
            return False
        words = words[1:]
    # NAME COMMAND LOCK_DIR (the seed's form) is whole: what follows is local-mutex's.
    whole = len(words) == 3 and os.path.isabs(words[2])
    # An empty one ("$CMD" unset) is none: options after it are ours; it is refused as empty.
    return len(words) >= 2 and bool(words[1]) and not _has_space(words[1]) and not whole


def verb_first(args: Sequence[str]) -> list[str]:
    """``local-mutex -q status NAME`` means ``status -q NAME``: the first word that is not
    an option is the verb, if one (a lock named so goes after ``--``: ``-q -- status CMD``)."""
    for i, arg, is_option in _option_words(args):
        if not is_option:
            return [arg, *args[:i], *args[i + 1 :]] if arg in VERBS else list(args)
    return list(args)


def parse(verb: str, args: Sequence[str], implicit: bool = False) -> Parsed:
    """Parse the arguments after the verb (``implicit``: the verb-free form's run);
    UsageError says what is wrong."""
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
            if options_over and not parsed.positionals:
                parsed.dashed = len(parsed.typed)
            parsed.positionals.append(arg)
            if takes_argv and len(parsed.positionals) == 1 and options_over:
                options_over = False  # options may follow NAME again, and a `--` for argv
            continue
        if takes_argv and _after_one_word_command(parsed.positionals):
            command = parsed.positionals[1]
            problem = (
                f"{arg!r} after the one-word command {command!r} may be its option or "
                "local-mutex's (ours go anywhere before it)"
            )
            raise UsageError(_quote_hint(verb, parsed, problem, arg, *args[i:]))
        flag, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        option = known.get(flag)
        if option is None and not arg.startswith("--") and len(arg) > 2:
            _short_cluster(arg, known, parsed, verb, args[i:])
            continue
        if option is None:
            raise _unknown(verb, arg, parsed, args[i:])
        if option.kind == "flag":
            if eq:
                raise UsageError(f"{flag} takes no value")
            parsed.values[option.dest] = True
            parsed.typed.append(arg)
        else:
            if not eq:
                if i >= len(args) or _is_our_option(args[i], known, option):
                    raise UsageError(f"{flag} needs a value ({option.metavar or 'VALUE'})")
                inline = args[i]
                i += 1
            parsed.values[option.dest] = _convert(option, flag, inline)
            parsed.typed += [arg] if eq else [flag, inline]  # --key-prefix=--x: one word
        parsed.given.add(option.dest)
    _check_shape(verb, parsed)
    if implicit:
        command = parsed.positionals[1] if parsed.argv is None else " ".join(parsed.argv)
        # A -- after NAME says what is the program: only the name may be a slip then.
        dashed = parsed.dashed is not None and parsed.argv is None
        one_word = len(parsed.argv) == 1 if parsed.argv is not None else not _has_space(command)
        if one_word and (dashed or _maybe_a_verb(parsed.positionals[0])):  # which was meant?
            from .suggest import refuse_a_misreading

            lock_dir = parsed.positionals[2:3] if parsed.argv is None else []  # LOCK_DIR
            typed = [*parsed.typed, *(["--lock-dir", *lock_dir] if lock_dir else [])]
            refuse_a_misreading(parsed.positionals[0], command, dashed, typed)
    return parsed


def _maybe_a_verb(name: str) -> bool:
    """Could this name be a verb mistyped? Asked of every run with a one-word command, so
    only the cheapest look: a slip never changes the length by more than one, nor the first
    letter (but for a swap with the second)."""
    lowered = name.lower()
    return lowered in BORROWED or any(
        len(v) - 1 <= len(name) <= len(v) + 1 and lowered[:1] in v[:2] for v in TYPED_AMISS
    )


def _is_our_option(word: str, known: dict[str, Option], option: Option) -> bool:
    """Is the word after an option that takes a value one of ours (``--lock-dir --wait 5``:
    the value was left out)? A message may be any text, ``--wait`` included."""
    return option.dest != "message" and word.partition("=")[0] in known


def _short_cluster(
    arg: str, known: dict[str, Option], parsed: Parsed, verb: str, rest: Sequence[str]
) -> None:
    """``-qk``: several short flags in one word."""
    option = known.get(arg[:2])
    if arg[2] == "=" and option is not None and option.kind == "flag":  # as ``--quiet=1``
        raise UsageError(f"{arg[:2]} takes no value")
    for letter in arg[1:]:
        option = known.get(f"-{letter}")
        if option is None or option.kind != "flag":
            raise _unknown(verb, arg, parsed, rest)
        parsed.values[option.dest] = True
        parsed.given.add(option.dest)
    parsed.typed.append(arg)


def _unknown(verb: str, arg: str, parsed: Parsed, rest: Sequence[str]) -> UsageError:
    words = parsed.positionals
    if verb in (RUN, EACH) and len(words) >= 2 and words[1] and not _has_space(words[1]):
        # Every word after the command's first is the command's: the hint keeps them all.
        # (After a quoted command it is one of ours, mistyped.)
        return UsageError(
            _quote_hint(verb, parsed, f"unknown option {arg!r} after the command", arg, *rest)
        )
    if arg in ("-h", "--help"):  # after `-- NAME`: the caller took the -- for the end
        return UsageError(f"{arg} after -- is no request for help: see local-mutex {verb} --help")
    from .suggest import no_such_option

    if parsed.dashed is not None and verb == RUN and len(words) == 1:
        # cpu-mutex's `-- make -j8`: what came after the name is the program's, options too
        before, after = parsed.typed[: parsed.dashed], parsed.typed[parsed.dashed :]
        return no_such_option(arg, verb, _lookup(verb), [*words, *after, arg, *rest], before)
    return no_such_option(arg, verb, _lookup(verb))


def _quote_hint(verb: str, parsed: Parsed, problem: str, *more: str) -> str:
    from .suggest import quote_hint

    return quote_hint(verb, parsed, problem, *more)


def _same_dir(a: str, b: str) -> bool:
    """The same directory, however written (a symlink to it, a trailing slash)."""
    if os.path.normpath(a) == os.path.normpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one is missing: the lock dir's own check says so
        return False


def _has_space(text: str) -> bool:
    return any(c.isspace() for c in text)


def _check_shape(verb: str, parsed: Parsed) -> None:
    count = len(parsed.positionals)
    wanted = POSITIONALS[verb]
    if parsed.flag("no_wait") and "wait" in parsed.given:
        raise UsageError("--wait and --no-wait exclude each other")
    if "lock_dir" in parsed.given and not parsed.text("lock_dir"):
        # An unset variable (--lock-dir "$DIR"): locking in the default dir instead would
        # not exclude the callers that use DIR.
        raise UsageError("--lock-dir is empty; give a directory, or leave the option out")
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
            problem = f"missing COMMAND after {head} (or -- and a program)"
            if parsed.dashed is not None and verb == RUN:  # `-- true`: a program's name?
                from .suggest import program_after_dash

                name, at = parsed.positionals[0], parsed.dashed
                problem = program_after_dash(
                    problem, name, parsed.typed[at:], parsed.typed[:at], unsure=True
                )
            raise UsageError(problem)
        if verb == EACH and count > 2:
            problem = f"{count - 1} words after the template"
            if _has_space(parsed.positionals[1]):  # quoted: the rest is no part of it
                raise UsageError(f"{problem}; each takes TEMPLATE COMMAND (a lock dir: --lock-dir)")
            raise UsageError(_quote_hint(verb, parsed, problem))
        if verb == RUN and count == 3:
            lock_dir = parsed.positionals[2]
            if not os.path.isabs(lock_dir):
                problem = f"lock dir {lock_dir!r} must be an absolute path"
                # A one-word command and a word after it: maybe a command typed unquoted.
                # A command with spaces was quoted already, and an empty word is no command.
                unquoted = bool(lock_dir.strip()) and not _has_space(parsed.positionals[1])
                raise UsageError(_quote_hint(verb, parsed, problem) if unquoted else problem)
            given = parsed.text("lock_dir")
            if given and not _same_dir(given, lock_dir):
                raise UsageError("LOCK_DIR and --lock-dir disagree; give one of them")
            parsed.values["lock_dir"] = lock_dir
            parsed.given.add("lock_dir")
        if verb == RUN and count > 3:
            problem = f"{count} arguments where NAME COMMAND [LOCK_DIR] go"
            quoted = _has_space(parsed.positionals[1])  # the words after it are not its own
            raise UsageError(problem if quoted else _quote_hint(verb, parsed, problem))
        return
    slots_count = count > len(wanted) and parsed.positionals[0].isdigit()
    if verb in (STATUS, RELEASE) and parsed.flag("slotted") and slots_count:
        raise UsageError(f"--slots takes no count with {verb}: local-mutex {verb} --slots NAME")
    if count != len(wanted):
        need = " ".join(wanted) or "no arguments"
        text = f"local-mutex {verb} takes {need}, got {count} argument{'s' if count != 1 else ''}"
        stray = [w for w in parsed.positionals if w.partition("=")[0] in _lookup(verb)]
        if stray:  # only a -- makes an option a positional: `hold -- -x --no-wait`
            text += f" ({stray[0].partition('=')[0]} came after --, which ends the options)"
        elif verb == HOLD and count == 2:  # a command: that is run's, inside or not
            text += " (a hold runs no command: hold, run what needs it, release; or run NAME CMD)"
        raise UsageError(text)
