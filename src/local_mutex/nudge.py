"""A signal meant to end a blocking call in the main thread reaches it, whenever it came.

Python runs a signal's handler in the main thread, between two bytecodes; a blocking call
(flock(), a read) ends early only if the signal lands while the thread sleeps in it. One
that lands a moment before -- after the last bytecode, before the system call (a waiter
preempted just there on a busy machine; the holder's own SIGTERM from its watcher thread,
sent the instant the main thread lets go of the interpreter to sleep) -- or on another
thread of an embedding program, only marks the handler due: the wait went on until the
lock came free, a stopped waiter lingering for minutes and a ceiling not kept.

While the main thread waits, a helper thread reads the interpreter's wakeup fd
(``WakeupPipe``); a stop signal whose handler is an ``interruptible``'s, or the ceiling's
alarm, is sent again to the main thread, a few times and a little later, until the wait
has ended. No handler of the caller's runs twice.
"""

from __future__ import annotations

import _thread
import select

from ._fastsignal import STOP_SIGNALS, interruptible, signal
from .wakeup import WakeupPipe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

# When the watcher sends a caught signal again, in seconds after it came: by the first, a
# waiter that took it in time has left; later ones for a machine too busy for the first.
_AGAIN_AFTER = (0.02, 0.1, 0.5, 2.0)


class Nudge:
    """``with Nudge(alarm=...):`` around a blocking call in the main thread, inside an
    ``interruptible``; ``alarm``: a SIGALRM ends it too (the wait's ceiling)."""

    def __init__(self, *, alarm: bool = False) -> None:
        self.alarm = alarm
        self.waiting = False
        self.turn = _thread.allocate_lock()  # a send again and the wait's end take turns
        self.wakeup: WakeupPipe | None = None
        self.ends: frozenset[int] = frozenset()

    def __enter__(self) -> Nudge:
        if not hasattr(select, "poll"):
            return self
        self.ends = self._ends()
        wakeup = WakeupPipe()
        try:
            if not wakeup.install():
                return self
        except ValueError:  # not the main thread: no handler runs here anyway
            return self
        self.wakeup = wakeup
        self.waiting = True
        try:
            _thread.start_new_thread(self._watch, (wakeup, _thread.get_ident()))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ends(self) -> frozenset[int]:
        """The signals whose handler ends this wait: sent again, they end it again."""
        ends = {
            sig
            for sig in STOP_SIGNALS
            if isinstance(getattr(signal.getsignal(sig), "__self__", None), interruptible)
        }
        if self.alarm:
            ends.add(signal.SIGALRM)
        return frozenset(ends)

    def _watch(self, wakeup: WakeupPipe, main: int) -> None:
        assert wakeup.read_end is not None
        poller = select.poll()
        poller.register(wakeup.read_end, select.POLLIN)
        caught: set[int] = set()
        again: Iterator[float] = iter(())
        due: float | None = None
        try:
            while True:
                if poller.poll(None if due is None else due * 1000):
                    data = wakeup.read(self.ends)
                    if not data:  # the write end closed: the wait is over
                        return
                    new = {n for n in data if n in self.ends} - caught
                    if new:
                        caught |= new
                        again = _steps(_AGAIN_AFTER)
                        due = next(again)
                    continue
                with self.turn:
                    if self.waiting:
                        for sig in caught:
                            signal.pthread_kill(main, sig)
                due = next(again, None) if self.waiting else None
        finally:
            wakeup.close_read_end(self.ends)  # the main thread closes the write end

    def __exit__(self, *exc: object) -> None:
        wakeup, self.wakeup = self.wakeup, None
        if wakeup is None:
            return
        # Signals blocked meanwhile: a handler raising here cannot leave the watcher
        # sending to a wait that is over. Unblocked last, a signal sent again just before
        # the end is taken here, by this wait's handlers, not by whatever comes after it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, (*STOP_SIGNALS, signal.SIGALRM))
        try:
            with self.turn:
                self.waiting = False
            wakeup.uninstall()
            wakeup.close_write_end()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _steps(after: tuple[float, ...]) -> Iterator[float]:
    """The waits between one send and the next, from the moment a signal came."""
    last = 0.0
    for at in after:
        yield at - last
        last = at
