"""The keeper's stop signals: before the command starts, after it ends, and in between.

From taking the lock until the command has started, a stop signal means "let go: do not
run it" (``SignalsHeld``); while the command runs, the keeper passes it on to the
supervisor, which passes it to the command (``Relay``); after the command ended, it waits
until the lock is released.
"""

from __future__ import annotations

import os

from .._fastsignal import StopHandlers, break_write, note_stop, signal
from ..errors import Interrupted
from .supervisor import FORWARDED

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

__all__ = ["Relay", "SignalsHeld"]


class Relay:
    """Signal handlers of the keeper: pass stop signals on to the supervisor."""

    def __init__(self, child: int) -> None:
        self.child: int | None = child  # None: the supervisor is dead (its pid reaped)
        self.done = False
        self.pending: list[int] = []
        # Every stop signal passed on: one that reached the supervisor only after the
        # command ended is in no report of its, yet it was a request to stop (``each``).
        self.relayed: list[int] = []
        self.saved: dict[int, object] = {}
        # Our end of the interpreter's wakeup fd, and the caller's (asyncio's) it replaced.
        self.wake: int | None = None
        self._wake_w = -1
        self._theirs = -1

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        try:
            self._take(signum)
        finally:
            break_write(signum, frame)

    def _take(self, signum: int) -> None:
        note_stop(signum)
        if self.done:
            self.pending.append(signum)  # after the command: for ourselves, after release
            return
        self.relayed.append(signum)
        if self.child is None:  # the command is being stopped already (``_stop_orphaned``)
            return
        try:
            os.kill(self.child, signum)
            # A stopped supervisor (SIGSTOP, a debugger let go) would act on it only when
            # continued: too late for the runner's 10 s cancel window.
            os.kill(self.child, signal.SIGCONT)
        except OSError:
            pass

    def install(self) -> None:
        for sig in FORWARDED:
            if signal.getsignal(sig) != signal.SIG_IGN:
                self.saved[sig] = signal.signal(sig, self)
        # The supervisor has a process group of its own, so a shell's ``fg`` (SIGCONT to
        # our group) reaches it only through us.
        self.saved[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._continue)
        self._wake_up_on_signals()

    def _continue(self, signum: int, frame: FrameType | None) -> None:
        try:
            if self.child is not None:
                os.kill(self.child, signal.SIGCONT)
        except OSError:
            pass

    def _wake_up_on_signals(self) -> None:
        """A stop signal that another thread of the process takes (ours has them blocked
        across the fork) runs its handler here only when this thread next runs Python
        code; the keeper sleeps in poll() until the command's end. The interpreter's
        wakeup fd, written by whichever thread takes a signal, ends that sleep."""
        try:
            wake, wake_w = os.pipe()
        except OSError:  # out of descriptors: the keeper's poll falls back to a short timeout
            return
        os.set_blocking(wake, False)
        os.set_blocking(wake_w, False)
        self._theirs = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.wake, self._wake_w = wake, wake_w

    def drain(self) -> None:
        """Empty the wakeup pipe (the handlers run as this thread returns to Python code);
        the signals that are not ours go on to the caller's wakeup fd (an event loop's)."""
        if self.wake is not None:
            self._drain(self.wake)

    def _drain(self, wake: int) -> None:
        while True:
            try:
                data = os.read(wake, 512)
            except OSError:  # EAGAIN: empty
                return
            if not data:
                return
            theirs = bytes(b for b in data if b not in self.saved)
            if theirs and self._theirs >= 0:
                try:
                    os.write(self._theirs, theirs)
                except OSError:
                    pass

    def restore(self) -> None:
        """The caller's handlers and wakeup fd back -- the wakeup fd first: SIGCONT, not
        blocked here, then reaches both."""
        wake, self.wake = self.wake, None
        try:
            if wake is not None:
                try:
                    # Their warn_on_full_buffer cannot be read back: a lost warning is harmless.
                    signal.set_wakeup_fd(self._theirs, warn_on_full_buffer=False)
                except (OSError, ValueError):  # theirs was closed (or made blocking) meanwhile
                    signal.set_wakeup_fd(-1)
                    self._theirs = -1  # its number may be another file's by now
            for sig, handler in self.saved.items():
                if handler is not None:
                    signal.signal(sig, handler)  # type: ignore[arg-type]
        finally:
            if wake is not None:
                self._drain(wake)
                os.close(wake)
                os.close(self._wake_w)


class SignalsHeld(StopHandlers):
    """``with SignalsHeld():`` from taking the lock to its release. Until the supervisor is
    forked, a stop signal raises ``Interrupted`` (the caller lets go of what it took: a
    remote lock is not freed by our death). From the fork on it never raises: the keeper
    must not leave a supervisor and its command behind, nor let go of their lock. One that
    comes before the relay is in place is queued in ``pending`` and relayed to the command
    (another thread of the process may take it while ours has them blocked); one during the
    command the relay passes on; one after the command ended waits in ``pending`` until
    the lock is released."""

    def __init__(self, last: bool = False) -> None:
        super().__init__()
        self.pending: list[int] = []
        self.letting_go = False  # a second signal must not cut the release short
        self.forking = False  # set just before the fork: queue, never raise, from then on
        # Set while the keeper stops an orphaned command: an error then leaves it running,
        # and the lock must stay with it (no release).
        self.command_may_run = False
        # The process exits right after a run that ended (the CLI's): a stop signal that
        # came once the command was over is dropped, so the exit status is the command's
        # (a run that did not end re-raises them as usual; one after this still counts).
        self.last = last

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.forking:
            self.pending.append(signum)
        elif not self.letting_go:
            raise Interrupted(signum, before_start=True)

    def __enter__(self) -> SignalsHeld:
        # The caller's mask, put back at the end: a program that blocks SIGTERM to take it
        # with sigwait() or a signalfd found it unblocked after a run, and died of the next.
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # the caller's own handlers, for what is pending
        if self.last and exc[0] is None:
            self.pending.clear()
            _discard_pending(FORWARDED)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        for sig in self.pending:
            os.kill(os.getpid(), sig)


def _discard_pending(signals: tuple[int, ...]) -> None:
    """Drop what the kernel holds pending of these blocked signals: a signal whose action
    is set to ignore is discarded, pending or not. Each handler is then put back as it
    was; one installed outside Python (unknown here) is left alone, and so is its signal.
    A dropped signal was still a request to stop: noted, so no last line waits for good."""
    for sig in signal.sigpending() & set(signals):
        note_stop(sig)
    for sig in signals:
        handler = signal.getsignal(sig)
        if handler is None or handler == signal.SIG_IGN:
            continue
        signal.signal(sig, signal.SIG_IGN)
        signal.signal(sig, handler)
