"""A signal meant to end a blocking call in the main thread reaches it, whenever it came.

Python runs a signal's handler in the main thread, between two bytecodes; a blocking call
(flock(), a read) ends early only if the signal lands while the thread sleeps in it. One
that lands a moment before -- after the last bytecode, before the system call (a waiter
preempted just there on a busy machine; the holder's own SIGTERM from its watcher thread,
sent the instant the main thread lets go of the interpreter to sleep) -- or on another
thread of an embedding program, only marks the handler due: the wait went on until the
lock came free, a stopped waiter lingering for minutes and a ceiling not kept.

While the main thread waits, a helper thread reads the interpreter's wakeup fd
(``WakeupPipe``); a stop signal whose handler ends waits (``interruptible``'s, the
PostgreSQL wait's), or the ceiling's alarm, is sent again to the main thread, a few times
and a little later, until the wait has ended. No handler of the caller's runs twice.
"""

from __future__ import annotations

import _thread
import os
import select

from ._fastsignal import STOP_SIGNALS, edges, signal
from .errors import Interrupted
from .wakeup import WakeupPipe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, TypeVar

    _T = TypeVar("_T")

# When the watcher sends a caught signal again, in seconds after it came: by the first, a
# waiter that took it in time has left; later ones for a machine too busy for the first.
_AGAIN_AFTER = (0.02, 0.1, 0.5, 2.0)
# The waits under way (one at most: the main thread's).
_active: set[Nudge] = set()


def _forked() -> None:
    """A child forked by another thread while the main thread waits: it has no watcher,
    and its signals must not reach the parent's (a worker pool's terminate())."""
    for nudge in list(_active):
        if nudge.wakeup is not None:
            nudge.wakeup.forget()
            nudge.wakeup = None
    _active.clear()


class Nudge:
    """``with Nudge(alarm=...) as nudge: nudge.call(blocking, *args)`` in the main thread,
    inside an ``interruptible``; ``alarm``: a SIGALRM ends the wait too (its ceiling)."""

    def __init__(self, *, alarm: bool = False) -> None:
        self.alarm = alarm
        # Held by the watcher while it sends, by the main thread from the wait's end on:
        # a signal sent again is then already pending, and none is sent after. Owned and
        # reentrant, so the wait's end and ``__exit__`` may both take it.
        self.over = _thread.RLock()
        self.wakeup: WakeupPipe | None = None
        self.ends: frozenset[int] = frozenset()
        self.owners: list[Any] = []  # what handles them (``raised_for``: see ``call``)
        # Sent again and not yet seen on the pipe: their bytes are ours alone. The rest go
        # on to the caller's wakeup fd, the signal that ended the wait too, as before.
        self.resent: dict[int, int] = {}

    def call(self, blocking: Callable[..., _T], *args: object) -> _T:
        """``blocking(*args)``, woken by a stop signal whenever it came -- also one whose
        ``Interrupted`` Python dropped: raised inside a weakref callback (every import
        ends with one) or a finalizer, it was only printed, "Exception ignored"."""
        for owner in self.owners:
            if owner.raised_for:  # we would not be here had it been raised
                raise Interrupted(owner.raised_for[0])
        try:
            return blocking(*args)
        finally:
            # C calls only, so no handler runs between the wait's end and the first: a
            # signal sent again meanwhile is pending, and taken at the second (a system
            # call), here -- not once the wait's handlers are gone. A handler raising
            # while the first waits for the watcher must not leave it sending.
            late: BaseException | None = None
            while True:
                try:
                    self.over.acquire()
                    break
                except BaseException as exc:
                    late = exc
            signal.pthread_sigmask(signal.SIG_BLOCK, ())
            if late is not None:
                raise late

    def __enter__(self) -> Nudge:
        if not hasattr(select, "poll"):
            return self
        try:
            with edges():  # a stop meanwhile is raised once all is set up, undone below
                self._start()
            return self
        except BaseException:
            self.__exit__()
            raise

    def _start(self) -> None:
        self.ends = self._ends()
        wakeup = WakeupPipe()
        try:
            if not wakeup.install():
                return
        except ValueError:  # not the main thread: no handler runs here anyway
            return
        self.wakeup = wakeup
        _active.add(self)
        _thread.start_new_thread(self._watch, (wakeup, _thread.get_ident()))

    def _ends(self) -> frozenset[int]:
        """The signals whose handler ends this wait: sent again, they end it again."""
        ends = set()
        for sig in STOP_SIGNALS:
            owner = getattr(signal.getsignal(sig), "__self__", None)
            if getattr(owner, "ends_waits", False) is True:
                ends.add(sig)
                if owner not in self.owners:
                    self.owners.append(owner)
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
                    data = wakeup.read(self._theirs_too)
                    if not data:  # the write end closed: the wait is over
                        return
                    new = {n for n in data if n in self.ends} - caught
                    if new:
                        caught |= new
                        again = _steps(_AGAIN_AFTER)
                        due = next(again)
                    continue
                if not self.over.acquire(False):
                    due = None  # the wait is over: read on, until the pipe's end
                    continue
                try:
                    for sig in caught:
                        self.resent[sig] = self.resent.get(sig, 0) + 1
                        signal.pthread_kill(main, sig)
                finally:
                    self.over.release()
                due = next(again, None)
        finally:
            wakeup.close_read_end(self._theirs_too)  # the main thread closes the write end

    def _theirs_too(self, signum: int) -> bool:
        if self.resent.get(signum, 0) > 0:
            self.resent[signum] -= 1
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        # A stop meanwhile (one sent again, too) is raised once all is taken down.
        with edges():
            wakeup, self.wakeup = self.wakeup, None
            _active.discard(self)
            if wakeup is not None:
                self.over.acquire()  # the wait ended by an error before ``call`` did
                wakeup.uninstall()
                wakeup.close_write_end()  # the watcher reads its end, and ends


def _steps(after: tuple[float, ...]) -> Iterator[float]:
    """The waits between one send and the next, from the moment a signal came."""
    last = 0.0
    for at in after:
        yield at - last
        last = at


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
