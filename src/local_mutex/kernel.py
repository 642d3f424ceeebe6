"""flock(2) on an open lock file: try, block with a ceiling, release.

A blocked waiter sleeps inside flock(), queued by the kernel; the wait ceiling is a one-shot
timer whose SIGALRM interrupts that sleep. There is no polling loop.
"""

from __future__ import annotations

import fcntl
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from .errors import Interrupted

# Signals that abandon a wait: the command has not started, so there is nothing to forward.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class _Alarm(Exception):
    pass


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
    if timeout is None:
        fcntl.flock(fd, _mode(shared))
        return True
    if not _main_thread():
        return _poll_lock(fd, shared, timeout)
    try:
        with _alarm_in(max(timeout, 0.001)):
            fcntl.flock(fd, _mode(shared))
        return True
    except _Alarm:
        # The alarm may have landed just after flock() returned: a non-blocking
        # retry on the same descriptor tells whether we hold it now.
        return try_lock(fd, shared=shared)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


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


@contextmanager
def _alarm_in(seconds: float) -> Iterator[None]:
    armed = [True]

    def fire(signum: int, frame: FrameType | None) -> None:
        if armed[0]:
            raise _Alarm

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed[0] = False  # a SIGALRM still in flight must not raise past this point
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP/SIGQUIT raise ``Interrupted`` inside the block (unless the
    caller ignored them), so a waiter that is told to stop exits without running anything."""
    def stop(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    if not _main_thread():
        yield
        return

    previous = {}
    for sig in STOP_SIGNALS:
        current = signal.getsignal(sig)
        if current is signal.SIG_IGN:
            continue  # e.g. nohup: the caller asked for this signal to be ignored
        previous[sig] = current
        signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
