"""flock(2) on an open lock file: try, block with a ceiling, release.

A blocked waiter sleeps inside flock(), queued by the kernel; the wait ceiling is a one-shot
timer whose SIGALRM interrupts that sleep. There is no polling loop.
"""

from __future__ import annotations

import fcntl
import time

from ..._fastsignal import edges, interruptible, main_thread, raise_or_keep, signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

__all__ = ["interruptible", "try_lock", "unlock", "wait_lock"]


class _Alarm(Exception):
    pass


_UNSET = object()  # no handler of ours put in place yet


def _mode(shared: bool) -> int:
    return fcntl.LOCK_SH if shared else fcntl.LOCK_EX


def try_lock(fd: int, *, shared: bool = False) -> bool:
    """Take the lock if nobody conflicting holds it; never blocks."""
    try:
        fcntl.flock(fd, _mode(shared) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def wait_lock(fd: int, *, shared: bool = False, timeout: float | None = None) -> bool:
    """Block until the lock is ours (True) or ``timeout`` seconds passed (False).

    Main thread only when ``timeout`` is set: the ceiling is a SIGALRM. Wrap the call in
    ``interruptible()`` to turn the usual stop signals into ``Interrupted``.
    """
    from ...nudge import Nudge  # only paid for when the lock is busy

    if timeout is None:
        if main_thread():
            with Nudge() as nudge:
                nudge.call(fcntl.flock, fd, _mode(shared))
        else:
            fcntl.flock(fd, _mode(shared))
        return True
    if not main_thread():
        return _poll_lock(fd, shared, timeout)
    try:
        with _AlarmIn(max(timeout, 0.001)), Nudge(alarm=True) as nudge:
            nudge.call(fcntl.flock, fd, _mode(shared))
        return True
    except _Alarm:
        # The alarm may have landed just after flock() returned: a non-blocking
        # retry on the same descriptor tells whether we hold it now.
        return try_lock(fd, shared=shared)


def _poll_lock(fd: int, shared: bool, timeout: float) -> bool:
    """Only for threads other than the main one, which cannot take a SIGALRM."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not try_lock(fd, shared=shared):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.25)
    return True


class _AlarmIn:
    """Raise ``_Alarm`` in the main thread after ``seconds`` (a one-shot ITIMER_REAL)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.armed = False
        self.previous: object = _UNSET
        self.theirs = (0.0, 0.0)  # a timer our caller had set: (delay, interval)
        self.start = 0.0
        self.mask: set[int | signal.Signals] | None = None

    def _fire(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            raise_or_keep(_Alarm())

    def __enter__(self) -> None:
        try:
            with edges():  # our alarm or a stop meanwhile: raised once all is set up
                self.previous = signal.signal(signal.SIGALRM, self._fire)
                # A caller that blocks SIGALRM (inherited across exec) would make the
                # ceiling wait for the lock instead: it is unblocked for the wait -- before
                # we arm, so that one already pending is not taken for ours.
                self.mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
                self.start = time.monotonic()
                self.theirs = signal.setitimer(signal.ITIMER_REAL, 0)  # stopped meanwhile
                # Armed before the timer starts: one that fired before this line (a
                # machine too busy to get here within a short ceiling) found us unarmed,
                # and the wait then ignored its ceiling until the lock came free.
                self.armed = True
                signal.setitimer(signal.ITIMER_REAL, self.seconds)
        except BaseException:  # the with statement will not clean up after __enter__
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        # A stop meanwhile is raised once all is taken down: halfway, it left our timer
        # and handler; a SIGALRM still in flight must not raise past ``armed``.
        with edges():
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            if self.mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
                self.mask = None
            if self.previous is not _UNSET:
                signal.signal(signal.SIGALRM, self.previous)  # type: ignore[arg-type]
                self.previous = _UNSET
            delay, interval = self.theirs
            self.theirs = (0.0, 0.0)
            if delay > 0:  # an embedding program's own timer: late at worst, never lost
                left = delay - (time.monotonic() - self.start)
                signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), interval)
