"""The interpreter's wakeup fd, ours for a while: a pipe written for every signal it
catches, on whatever thread -- the one way to learn of a signal whose handler the main
thread would run only at its next bytecode, long after, if it sleeps in a system call.

The caller's own wakeup fd (an event loop's) keeps getting the signals that are not ours,
and is put back afterwards.
"""

from __future__ import annotations

import os
import select
import time

from ._fastsignal import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Keep = Callable[[int], bool]  # is this signal's byte the caller's too?


class WakeupPipe:
    def __init__(self) -> None:
        self.read_end: int | None = None
        self._write_end = -1
        self._theirs = -1

    def install(self) -> bool:
        """Main thread only (ValueError elsewhere). False: out of descriptors."""
        try:
            read_end, write_end = os.pipe()
        except OSError:
            return False
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        try:
            self._theirs = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except BaseException:
            os.close(read_end)
            os.close(write_end)
            raise
        self.read_end, self._write_end = read_end, write_end
        return True

    def read(self, keep: Keep) -> bytes:
        """The signals caught since the last read (b"" at the end: the pipe is closed);
        those ``keep`` says are the caller's too go on to the caller's wakeup fd."""
        data = b""
        while self.read_end is not None:
            try:
                chunk = os.read(self.read_end, 512)
            except OSError:  # EAGAIN: empty
                break
            if not chunk:
                break
            data += chunk
        theirs = bytes(b for b in data if keep(b))
        if theirs and self._theirs >= 0:
            try:
                os.write(self._theirs, theirs)
            except OSError:
                pass  # full or closed: as the interpreter itself would drop it
        return data

    def uninstall(self) -> None:
        """The caller's wakeup fd back; from now on nothing writes to our pipe."""
        try:
            # Their warn_on_full_buffer cannot be read back: a lost warning is harmless.
            signal.set_wakeup_fd(self._theirs, warn_on_full_buffer=False)
        except (OSError, ValueError):  # theirs was closed (or made blocking) meanwhile
            signal.set_wakeup_fd(-1)
            self._theirs = -1  # its number may be another file's by now

    def close_write_end(self) -> None:
        """After ``uninstall``: a reader of the pipe then reads its end."""
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1

    def close(self, keep: Keep) -> None:
        """Both ends, after passing on what is left."""
        self.close_write_end()
        self.close_read_end(keep)

    def close_read_end(self, keep: Keep) -> None:
        """After passing on what is left (the write end closed: all there will be)."""
        if self.read_end is not None:
            self.read(keep)
            os.close(self.read_end)
            self.read_end = None

    def forget(self) -> None:
        """In a child forked meanwhile: the caller's wakeup fd back, our ends closed -- the
        child's signals are not the parent's to learn of."""
        try:
            signal.set_wakeup_fd(self._theirs, warn_on_full_buffer=False)
        except (OSError, ValueError):
            signal.set_wakeup_fd(-1)
        for fd in (self.read_end, self._write_end):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.read_end, self._write_end = None, -1


def until_a_signal() -> Callable[[float | None], None]:
    """``sleep(at_most)``: a sleep that every signal this process catches ends, for a
    process whose wakeup fd is its own (the caller's was let go of): also one that lands a
    moment before the sleep begins, whose handler the interpreter only marks due -- a
    blocking system call would sleep on. (Out of descriptors: a sleep of 20 ms.)"""
    wake = WakeupPipe()
    if not wake.install() or wake.read_end is None:
        return lambda at_most: time.sleep(min(at_most or 0.02, 0.02))
    poller = select.poll()  # not select(): descriptors may be past FD_SETSIZE
    poller.register(wake.read_end, select.POLLIN)

    def sleep(at_most: float | None) -> None:
        poller.poll(None if at_most is None else int(at_most * 1000))
        wake.read(_nobody_elses)  # the handlers run as this thread returns to Python code

    return sleep


def _nobody_elses(signum: int) -> bool:
    return False
