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
from ..wakeup import WakeupPipe
from . import terminal
from .supervisor import FORWARDED

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

__all__ = ["Relay", "SignalsHeld"]


class Relay:
    """Signal handlers of the keeper: pass stop signals on to the supervisor."""

    def __init__(self, child: int) -> None:
        self.child: int | None = child  # None: the supervisor is dead (its pid reaped)
        self.command: int | None = None  # its pid, its group's id: once the supervisor says
        self.done = False
        self.pending: list[int] = []
        self.ctrl_z = False  # one came before we knew the command: for it once we do
        # Every stop signal passed on: one that reached the supervisor only after the
        # command ended is in no report of its, yet it was a request to stop (``each``).
        self.relayed: list[int] = []
        self.saved: dict[int, object] = {}
        self.wakeup = WakeupPipe()

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
        if terminal.controlling_tty()[0] is not None and (
            signal.getsignal(signal.SIGTSTP) == signal.SIG_DFL
        ):
            self.saved[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, self._ctrl_z)
        self._wake_up_on_signals()

    def _ctrl_z(self, signum: int, frame: FrameType | None) -> None:
        """Ctrl-Z reached our group, not the command's: ``fg`` after ``bg`` gave us the
        terminal, and the supervisor has not passed it on yet (it looks every 0.1 s). The
        command stops instead, and the supervisor stops us with it, as a shell's job --
        stopped alone, we left the command running with the lock while the shell showed
        the job stopped. (Its pid not known yet, or ended: we stop as we would have.)
        We run, so our job was continued: the supervisor hears of it here too -- a stop
        signal makes the kernel drop a SIGCONT not yet delivered (``fg`` and at once
        Ctrl-Z), and with it the one word that its wait for our job to go on is over."""
        self._continue(signal.SIGCONT, frame)
        if self.command is None and self.child is not None and not self.done:
            # The supervisor starts the command (it may run already, its pid on its way to
            # us): stopped alone, we would leave it running while the shell shows the job
            # stopped. It stops as soon as we know it (``started``).
            self.ctrl_z = True
            return
        try:
            if self.command is not None and not self.done:
                os.killpg(self.command, signal.SIGTSTP)
                return
        except OSError:
            pass
        # The default action, kernel's rules and all: one in an orphaned group is dropped
        # (nobody could continue it).
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.kill(os.getpid(), signal.SIGTSTP)
        finally:
            signal.signal(signal.SIGTSTP, self._ctrl_z)

    def started(self, command: int) -> int:
        """The supervisor says the command runs (its pid): a Ctrl-Z that came before is
        its now."""
        self.command = command
        if self.ctrl_z:
            self.ctrl_z = False
            try:
                os.killpg(command, signal.SIGTSTP)
            except OSError:
                pass
        return command

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
        wakeup fd, written by whichever thread takes a signal, ends that sleep (out of
        descriptors, the keeper's poll falls back to a short timeout)."""
        self.wakeup.install()

    def _theirs_too(self, signum: int) -> bool:
        return signum not in self.saved

    @property
    def wake(self) -> int | None:
        """What the keeper polls: readable once a signal came."""
        return self.wakeup.read_end

    def drain(self) -> None:
        """Empty the wakeup pipe (the handlers run as this thread returns to Python code);
        the signals that are not ours go on to the caller's wakeup fd (an event loop's)."""
        self.wakeup.read(self._theirs_too)

    def restore(self) -> None:
        """The caller's handlers and wakeup fd back -- the wakeup fd first: SIGCONT, not
        blocked here, then reaches both."""
        try:
            if self.wakeup.read_end is not None:
                self.wakeup.uninstall()
            for sig, handler in self.saved.items():
                if handler is not None:
                    signal.signal(sig, handler)  # type: ignore[arg-type]
        finally:
            self.wakeup.close(self._theirs_too)


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
