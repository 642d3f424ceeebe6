"""``local-mutex``: ``main(argv) -> int``. Parses without click (the table in
``commands.options``), calls the verb's plain function; click only renders ``--help`` and
shell completion. Nothing heavy is imported before it is needed: a nested call in a loop
pays only for what a plain run needs."""

from __future__ import annotations

import gc
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .commands.argv import Parsed

COMPLETE_VAR = "_LOCAL_MUTEX_COMPLETE"
# See run_and_exit.
_GC_THRESHOLD = 25_000


def _command(verb: str) -> Callable[[Parsed], int]:
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


def main(argv: Sequence[str] | None = None) -> int:
    from .commands.argv import parse, wants_help
    from .commands.options import VERBS, UsageError

    args = list(sys.argv[1:] if argv is None else argv)
    if COMPLETE_VAR in os.environ or not args or wants_help(args):
        from ._site import ensure

        ensure()
        from .commands.clicktree import show

        return show(args)
    if args == ["--version"]:
        from ._version import __version__
        from .ui.output import out

        out(f"local-mutex, version {__version__}")
        return 0
    verb, rest = (args[0], args[1:]) if args[0] in VERBS else ("run", args)
    try:
        parsed = parse(verb, rest)
    except UsageError as exc:
        from .nesting import ENV_HELD
        from .ui.lines import Reporter

        return Reporter(nested=bool(os.environ.get(ENV_HELD))).failure(exc)
    return _command(verb)(parsed)


def run_and_exit(entry: Callable[[], int]) -> None:
    """Exit with ``entry()``'s status without the interpreter's teardown, which costs a
    short locked run ~3 ms: by then the lock is released, temporary files are gone and
    nothing else is left to clean up, so only the standard streams need flushing.

    The cyclic collector waits longer between collections: start-up allocates about 8,000
    objects and no garbage cycles, and the ~11 collections the default threshold (700)
    would run over them cost a short run ~0.3 ms. A long wait or run still collects."""
    gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])
    try:
        status = entry()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        status = 130
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 1  # e.g. stdout closed by a pipe reader: say so, as sys.exit would
    os._exit(status)
