"""The signal API without its enum wrappers, and the stop signals that abandon a wait.

``import signal`` pulls in enum, functools and collections: about two thirds of a bare
interpreter's start on a small machine, paid by every nested call in a loop. The C module
underneath has the same functions with plain-int signals and handlers, which is all this
package uses (compare handlers with ``==``, never ``is``).
"""

from __future__ import annotations

import sys

from .errors import Interrupted

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from collections.abc import Callable
    from types import FrameType
    from typing import TypeVar

    _T = TypeVar("_T", bound="StopHandlers")
    _I = TypeVar("_I", bound="interruptible")
else:
    try:
        import _signal as signal
    except ImportError:  # an interpreter without the C module split
        import signal

__all__ = [
    "STOP_SIGNALS",
    "StopHandlers",
    "deferred_stops",
    "edges",
    "interruptible",
    "main_thread",
    "note_stop",
    "quiet_stops",
    "raise_or_keep",
    "signal",
    "stoppable",
    "stops_taken",
]

# Signals that abandon a wait: the command has not started, so there is nothing to forward.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

# The stop signals this process took, whichever handler of ours took them: once one came,
# the run is ending, and a line about it must not keep it waiting on a stderr nobody reads.
stops_taken: list[int] = []


def note_stop(signum: int) -> None:
    stops_taken.append(signum)


class StopDuringWrite(BaseException):
    """A stop signal came while this thread was blocked writing a line of ours."""


def stoppable(call: Callable[..., object], *args: object) -> None:
    """``call(*args)`` -- a write of ours that may block -- cut short by a stop signal whose
    handler only notes it (``break_write``): the line is dropped. The exception is raised
    only in ``_call``'s frame, so it can never land outside the ``try`` here."""
    try:
        _call(call, *args)
    except StopDuringWrite:
        pass


def _call(call: Callable[..., object], *args: object) -> None:
    call(*args)


def break_write(signum: int, frame: FrameType | None) -> None:
    """From a stop signal's handler that does not raise: end a ``stoppable`` call that is
    under way (blocked in a C write called from ``_call``)."""
    while frame is not None:
        if frame.f_code is _call.__code__:
            raise StopDuringWrite(signum)
        frame = frame.f_back


def main_thread() -> bool:
    """Can this thread handle signals (the main thread of the main interpreter)? Asked of
    the interpreter itself, by putting a handler back as it is: ``threading`` would miss
    a ``_thread`` thread, and before 3.13 it names the wrong main thread when a thread
    other than the main one imported it first."""
    for sig in STOP_SIGNALS:
        handler = signal.getsignal(sig)
        if handler is None:
            continue  # installed outside Python: it could not be put back as it is
        try:
            signal.signal(sig, handler)
        except ValueError:
            return False
        return True
    threading = sys.modules.get("threading")
    return threading is None or threading.current_thread() is threading.main_thread()


class StopHandlers:
    """Inside the block, SIGINT/SIGTERM/SIGHUP/SIGQUIT go to ``handle`` -- unless the caller
    ignored them (``nohup``: its wish stands). Outside the main thread, where Python cannot
    take signals, it does nothing. The previous handlers come back on the way out."""

    def __init__(self) -> None:
        self.previous: dict[int, object] = {}

    def handle(self, signum: int, frame: FrameType | None) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        if main_thread():
            for sig in STOP_SIGNALS:
                current = signal.getsignal(sig)
                if current != signal.SIG_IGN and current is not None:
                    self.previous[sig] = current
                    signal.signal(sig, self._take)
        return self

    def _take(self, signum: int, frame: FrameType | None) -> None:
        note_stop(signum)
        self.handle(signum, frame)
        break_write(signum, frame)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self.previous.clear()


# Exceptions our handlers raise, kept while a wait's edges are set up or taken down
# (``edges``): raised halfway, they would leave the program's state half ours. Blocking the
# signals keeps them from this thread only; another thread takes them, and the handler
# runs here all the same.
_kept: list[BaseException] = []
_depth = [0]


def raise_or_keep(exc: BaseException) -> None:
    """From a handler of ours: raise ``exc`` now, or at the end of the ``edges`` block."""
    if not _depth[0]:
        raise exc
    _kept.append(exc)


class edges:  # noqa: N801 - used like a function
    """``with edges():`` -- a block that sets up or takes down a wait whole: what a
    handler of ours raises meanwhile (``raise_or_keep``) is raised as it ends."""

    def __enter__(self) -> None:
        _depth[0] += 1

    def __exit__(self, *exc: object) -> None:
        _depth[0] -= 1
        if not _depth[0] and _kept:
            first = _kept[0]
            _kept.clear()
            raise first


class interruptible(StopHandlers):  # noqa: N801 - used like a function
    """``with interruptible():`` -- a stop signal raises ``Interrupted``, so a waiter that
    is told to stop exits without running anything."""

    ends_waits = True  # a ``Nudge`` sends such a signal again until the wait has ended

    def __init__(self) -> None:
        super().__init__()
        self.raised_for: list[int] = []  # see ``Nudge.call``

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.raised_for.append(signum)
        raise_or_keep(Interrupted(signum))

    def __enter__(self: _I) -> _I:
        super().__enter__()
        # A stop signal that a ``deferred_stops`` around us noted just before this wait
        # began is one for the wait: waiting on would ignore it until the lock came; so
        # is a Ctrl-C that the CLI's first handler noted and Python dropped (``heard``).
        for handler in self.previous.values():
            outer = getattr(handler, "__self__", None)
            if isinstance(outer, deferred_stops) and outer.pending:
                self.__exit__()
                raise Interrupted(outer.pending[0])
            heard = getattr(handler, "heard", None)
            if heard:
                self.__exit__()
                raise Interrupted(heard[0])
        return self


class deferred_stops(StopHandlers):  # noqa: N801 - used like a function
    """``with deferred_stops() as stops:`` -- a stop signal is noted in ``stops.pending``
    for the caller to act on after the block (waits inside it use ``interruptible`` and
    raise as usual): what the block takes is never half-known when it is acted on."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[int] = []

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)


class quiet_stops(StopHandlers):  # noqa: N801 - used like a function
    """``with quiet_stops():`` -- a stop signal does nothing: the first one is being acted
    on, and cutting its bounded clean-up short would leave what it is there to undo."""

    def handle(self, signum: int, frame: FrameType | None) -> None:
        pass
