"""``local-mutex``: ``main(argv) -> int``. Parses without click (the table in
``commands.options``), calls the verb's plain function; click only renders ``--help`` and
shell completion. Nothing heavy is imported before it is needed: a nested call in a loop
pays only for what a plain run needs."""

# No ``from __future__ import annotations`` here (the annotations that need it are quoted):
# importing ``__future__`` would cost every run ~0.15 ms (see ``_startup._compile``).

import gc
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import FrameType

    from .commands.argv import Parsed
    from .ui.lines import Reporter


class _Interrupt:
    """Python's own Ctrl-C, noted: until our handlers are in place, a KeyboardInterrupt
    raised in the import system's weakref callback (every import ends with one) is only
    printed, "Exception ignored", and the run went on to run its command. Noted, it ends
    the run before the command (``main``; ``interruptible`` asks ``heard``)."""

    def __init__(self) -> None:
        self.heard: list[int] = []

    def __call__(self, signum: int, frame: "FrameType | None") -> None:
        self.heard.append(signum)
        raise KeyboardInterrupt


_interrupt = _Interrupt()
try:
    if TYPE_CHECKING:
        import signal as _signal
    else:
        import _signal  # not ``signal``: it loads enum (see ``_fastsignal``)
    if _signal.getsignal(_signal.SIGINT) == _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, _interrupt)
except (ImportError, ValueError):  # no C module split; not the main thread
    pass

COMPLETE_VAR = "_LOCAL_MUTEX_COMPLETE"
# What click's shell completion sets it to; any other value (empty, stray) is no request
# for completions, and the command runs as usual rather than silently not at all.
_COMPLETIONS = {
    f"{shell}_{what}" for shell in ("bash", "zsh", "fish") for what in ("source", "complete")
}
# See run_and_exit.
_GC_THRESHOLD = 25_000
# Verbs other than ``run``: they do not read the plain run's module cache (``_startup``).
OTHER_VERBS = frozenset({"each", "hold", "release", "status", "list", "history"})
_STARTUP = f"{__package__}._startup"


def _command(verb: str) -> "Callable[[Parsed], int]":
    if verb == "run":
        from .commands.run import run

        return run
    if verb == "each":
        from .commands.each import each

        return each
    if verb in ("hold", "release"):
        from .commands import holds

        return holds.hold if verb == "hold" else holds.release
    from .commands import look

    return {"status": look.status, "list": look.list_, "history": look.history}[verb]


def main(argv: "Sequence[str] | None" = None) -> int:
    _interrupt.heard.clear()  # (a program calling us again)
    args = list(sys.argv[1:] if argv is None else argv)
    completing = os.environ.get(COMPLETE_VAR) in _COMPLETIONS
    if args and args[0] not in OTHER_VERBS and not completing:
        from . import _startup

        _startup.load()  # very likely a plain run: its modules in one read
    from .backends import remote_address
    from .commands.argv import asks_version, help_args, parse, verb_first, wants_help
    from .commands.options import VERBS, UsageError

    if args and args[0].startswith("-"):
        args = verb_first(args)
    if completing or not args or wants_help(args):
        from ._site import ensure

        ensure()
        try:
            import click  # noqa: F401

            from .commands.clicktree import show
        except Exception as exc:
            # Not there, not for this Python (a SyntaxError), or too old (a name missing):
            # the plain form and the verbs need no click; only help and completion do.
            if "click" in sys.modules and not (
                isinstance(exc, ImportError) and (exc.name or "").partition(".")[0] == "click"
            ):
                raise  # click imported: the error is ours
            has = (
                "does not have"
                if isinstance(exc, ModuleNotFoundError) and exc.name == "click"
                else f"cannot import ({type(exc).__name__}: {exc})"
            )
            return _reporter().failure(
                UsageError(
                    f"help and shell completion need click, which {sys.executable} {has}: "
                    "pip install click (the setup action installs it); "
                    "usage: local-mutex [OPTIONS] NAME COMMAND [LOCK_DIR]"
                )
            )
        from .ui.output import STDOUT, closed_by_caller

        if STDOUT in closed_by_caller:  # it would go to the /dev/null standing in
            from .errors import EXIT_IOERR

            _reporter().error(
                "could not print the help or completions (stdout closed by the caller)"
            )
            return EXIT_IOERR
        try:
            return show(args if completing else help_args(args))
        except (KeyError, ValueError) as exc:
            if not completing:
                raise
            # Set by hand, not by the shell's completion script: COMP_WORDS or COMP_CWORD
            # missing or not a number (click would print a traceback).
            return _reporter().failure(
                UsageError(
                    f"{COMPLETE_VAR} asks for completions, but the shell's variables are "
                    f"missing or malformed ({exc}): the script that "
                    f"{COMPLETE_VAR}=bash_source local-mutex prints sets them"
                )
            )
        except OSError as exc:  # click ends quietly (exit 1) on EPIPE only: a full disk
            from .errors import EXIT_IOERR

            why = exc.strerror or type(exc).__name__
            _reporter().error(f"could not print the help or completions ({why})")
            return EXIT_IOERR
    if "--version" in args and asks_version(args):  # eager, as click's: `run N --version` too
        from ._version import __version__
        from .ui.output import answer

        return answer(f"local-mutex, version {__version__}", 0, _reporter())
    verb, rest = (args[0], args[1:]) if args[0] in VERBS else ("run", args)
    try:
        parsed = parse(verb, rest, implicit=verb != args[0])
    except UsageError as exc:
        return _reporter().failure(exc)
    if _STARTUP in sys.modules and verb == "run":
        from . import _startup

        # What a plain run (a local lock) imports belongs in the cache.
        _startup.plain_run = remote_address(parsed.text("remote"), os.environ) is None
    verb_function = _command(verb)
    if _interrupt.heard:  # a Ctrl-C Python dropped (see there): the command must not run
        return 130
    return verb_function(parsed)


def _reporter() -> "Reporter":
    """The stderr lines of what runs before a verb's own (help, --version, bad usage)."""
    from .nesting import ENV_HELD
    from .ui.lines import Reporter

    return Reporter(nested=bool(os.environ.get(ENV_HELD)))


def run_and_exit(entry: "Callable[[], int]") -> None:
    """Exit with ``entry()``'s status without the interpreter's teardown, which costs a
    short locked run ~3 ms: by then the lock is released, temporary files are gone and
    nothing else is left to clean up, so only the standard streams need flushing.

    The cyclic collector waits longer between collections: start-up allocates about 8,000
    objects and no garbage cycles, and the ~11 collections the default threshold (700)
    would run over them cost a short run ~0.3 ms. A long wait or run still collects."""
    gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])
    try:
        _stand_in_for_closed_streams()
        status = 130 if _interrupt.heard else entry()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        status = 130
    try:
        status = _flush(status)
        _save_startup_cache(status)
    except KeyboardInterrupt:  # a late Ctrl-C: the lock is released already
        status = 130
    os._exit(status)


def _save_startup_cache(status: int) -> None:
    """After the answer is out: a plain run that imported modules the usual way writes them
    to the plain run's cache (``_startup``) for the runs after it."""
    if _STARTUP in sys.modules:
        from . import _startup

        _startup.save(status)


def _flush(status: int) -> int:
    """Flush what is left in stdout and stderr; the status ``os._exit`` should leave.

    Our answers are flushed as they are written (``ui.output.answer`` picked the status
    when one failed); what is left here is the last of a failed write, or text that
    bypassed it (click's help). A reader that went away (EPIPE) changes nothing: it
    stopped reading on purpose, and a command's 0 must not become 1 for it. Anything else
    (a full disk) lost output: 74, unless the status already says something went wrong.
    stderr is best effort, as every diagnostic line is: its failure changes nothing."""
    if sys.stdout is not None:  # None: closed, and no stand-in could be opened
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            pass
        except (OSError, ValueError):
            from .errors import EXIT_IOERR

            status = status or EXIT_IOERR
    if sys.stderr is not None:
        from .ui.lines import writable_when_stopping

        try:
            if writable_when_stopping(sys.stderr):
                sys.stderr.flush()
        except (OSError, ValueError):
            pass
    return status


def _stand_in_for_closed_streams() -> None:
    """A caller that closed our stdin, stdout or stderr (``cmd >&-``) left that descriptor
    free: the first file we open would take it, and the command would inherit our lock
    file as its stdout or stderr. /dev/null stands in for each in our process (Python saw
    it closed and left ``sys.stdout`` and the like as None); we open them lowest first, so
    each gets the very number that was missing. The command gets it closed, as the caller
    had it (``Options.closed``)."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is None:
            got = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if got != fd:  # not the lowest free number after all: leave things as they were
                os.close(got)
                continue
            setattr(sys, name, open(fd, mode, encoding="utf-8"))  # noqa: SIM115 (kept open)
            from .ui.output import closed_by_caller

            closed_by_caller.add(fd)
