"""Run ``/bin/sh -c COMMAND`` in its own process group and stay in charge of it.

The supervisor forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to the command's whole group and
escalates (TERM, then KILL) so the group is gone well inside the GitHub runner's cancel
window (SIGINT, SIGTERM 7.5 s later, SIGKILL 2.5 s after that). Whoever holds the lock
around ``supervise()`` releases it only after this returns, i.e. after the group is gone.
"""

from __future__ import annotations

import os
import time

from .errors import SpawnError
from .fastsignal import signal

# Type-only imports: typing and collections cost a plain run measurable startup time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import FrameType

SHELL = "/bin/sh"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# After the first forwarded signal: TERM at +4 s, KILL at +7 s; the runner kills at +10 s.
ESCALATE_TERM_AFTER = 4.0
ESCALATE_KILL_AFTER = 7.0
# Only a process in uninterruptible sleep outlives SIGKILL; do not wait on it forever.
GIVE_UP_AFTER_KILL = 3.0
_GROUP_POLL = 0.02
# Python ignores these itself; the command must get the defaults (``yes | head`` needs SIGPIPE).
_RESET_FOR_CHILD = (signal.SIGPIPE, signal.SIGXFSZ)


class Outcome:
    """How the command ended. ``status`` is what the wrapper exits with."""

    __slots__ = ("gave_up", "kill_sent", "signals", "started", "status", "timed_out")

    def __init__(self) -> None:
        self.status = 0
        self.started = time.monotonic()
        self.timed_out = False
        self.kill_sent = False
        self.gave_up = False  # a group member survived SIGKILL (uninterruptible sleep)
        self.signals: list[int] = []


class _Supervisor:
    def __init__(self, timeout: float | None, kill_after: float) -> None:
        self.outcome = Outcome()
        self.pgid: int | None = None
        self.pending: list[int] = []
        self.events: list[tuple[float, int, bool]] = []  # (when, signal, is_the_timeout)
        self.stopping = False
        self.kill_at: float | None = None
        self.kill_after = kill_after
        self.timeout = timeout

    # -- signal handlers (run in the main thread between bytecodes) ---------------------------

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.outcome.signals.append(signum)
        if self.pgid is None:
            self.pending.append(signum)
            return
        self._send(signum)
        if not self.stopping:
            self._begin_stopping()
            now = time.monotonic()
            self._schedule(now + ESCALATE_TERM_AFTER, signal.SIGTERM)
            self._schedule(now + ESCALATE_KILL_AFTER, signal.SIGKILL)

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        # Edit the list in place: a signal handled in the middle of this may append to it.
        due = [e for e in self.events if e[0] <= now]
        for event in due:
            self.events.remove(event)
        for _, sig, is_timeout in sorted(due):
            if is_timeout:
                self.outcome.timed_out = True
                self._begin_stopping()
                self._schedule(now + self.kill_after, signal.SIGKILL)
            self._send(sig)
        self._arm()

    # -- helpers ---------------------------------------------------------------------------------

    def _begin_stopping(self) -> None:
        self.stopping = True

    def _schedule(self, when: float, sig: int, is_timeout: bool = False) -> None:
        self.events.append((when, sig, is_timeout))
        if sig == signal.SIGKILL:
            self.kill_at = when if self.kill_at is None else min(self.kill_at, when)
        self._arm()

    def _arm(self) -> None:
        if not self.events:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return
        delay = min(e[0] for e in self.events) - time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, max(delay, 0.001))

    def _send(self, sig: int) -> None:
        if self.pgid is None:
            return
        if sig == signal.SIGKILL and group_alive(self.pgid):
            self.outcome.kill_sent = True
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is already gone

    def start(self, command: str, env: Mapping[str, str], stdin_devnull: bool) -> int:
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)] if stdin_devnull else []
        try:
            pid = os.posix_spawn(
                SHELL,
                ["sh", "-c", command],
                env,
                file_actions=actions,
                setpgroup=0,
                setsigdef=_RESET_FOR_CHILD,
            )
        except OSError as exc:
            raise SpawnError(f"cannot start {SHELL}: {exc.strerror}") from None
        self.pgid = pid
        self.outcome.started = time.monotonic()
        if self.timeout is not None:
            self._schedule(self.outcome.started + self.timeout, signal.SIGTERM, is_timeout=True)
        for signum in self.pending:
            self.on_signal(signum, None)
        self.pending.clear()
        return pid

    def wait_group_gone(self) -> None:
        """After the shell exits while stopping: wait for the rest of its group."""
        assert self.pgid is not None
        while group_alive(self.pgid):
            if self.kill_at is not None and time.monotonic() > self.kill_at + GIVE_UP_AFTER_KILL:
                self.outcome.gave_up = True
                return
            time.sleep(_GROUP_POLL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def supervise(
    command: str,
    env: Mapping[str, str],
    *,
    timeout: float | None = None,
    kill_after: float = 5.0,
    stdin_devnull: bool = False,
) -> Outcome:
    """Run the command to the end and report how it ended.

    ``timeout`` bounds the run from the moment it starts: SIGTERM to the group, SIGKILL
    ``kill_after`` seconds later. ``stdin_devnull`` detaches the command from our stdin
    (``each`` reads its items there). Returns with the forwarded signals still blocked (see
    ``SignalsHeld``) so a late signal cannot kill the caller before it releases the lock.
    """
    sup = _Supervisor(timeout, kill_after)
    saved = _install(sup)
    tty = _foreground_tty()
    try:
        pid = sup.start(command, env, stdin_devnull)
        if tty is not None:
            _give_terminal(tty, pid)
        status = _wait_child(pid, tty)
        if sup.stopping:
            sup.wait_group_gone()
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        if tty is not None:
            _give_terminal(tty, os.getpgrp(), resume=False)
        signal.setitimer(signal.ITIMER_REAL, 0)
        _restore(saved)
    out = sup.outcome
    if out.timed_out:
        out.status = 137 if out.kill_sent else 124
    else:
        code = os.waitstatus_to_exitcode(status)
        out.status = 128 - code if code < 0 else code
    return out


class SignalsHeld:
    """``with SignalsHeld():`` around ``supervise()`` and the lock's release: the forwarded
    signals it leaves blocked are unblocked (and anything pending delivered) on exit."""

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)


def _wait_child(pid: int, tty: int | None) -> int:
    while True:
        _, status = os.waitpid(pid, os.WUNTRACED if tty is not None else 0)
        if not os.WIFSTOPPED(status):
            return status
        # Ctrl-Z in a terminal stopped the command: stop with it, as a shell job would,
        # and hand the terminal back to it when we are continued.
        _give_terminal(tty, os.getpgrp(), resume=False)
        os.kill(os.getpid(), signal.SIGSTOP)
        _give_terminal(tty, pid)


def _install(sup: _Supervisor) -> dict[int, object]:
    saved: dict[int, object] = {signal.SIGALRM: signal.signal(signal.SIGALRM, sup.on_alarm)}
    for sig in FORWARDED:
        if signal.getsignal(sig) == signal.SIG_IGN:
            continue  # ignored by our caller (nohup, `&`): the command inherits that
        saved[sig] = signal.signal(sig, sup.on_signal)
    return saved


def _restore(saved: Mapping[int, object]) -> None:
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _foreground_tty() -> int | None:
    """fd 0 when it is a terminal whose foreground group is ours, else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _give_terminal(tty: int | None, pgid: int, *, resume: bool = True) -> None:
    """Make ``pgid`` the terminal's foreground group so it can read keys and get Ctrl-C."""
    if tty is None:
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(tty, pgid)
    except OSError:
        pass  # not our terminal after all (e.g. we lost it): the command still runs
    finally:
        signal.signal(signal.SIGTTOU, previous)
    if resume:
        # The command may have tried the terminal before it was its own and been stopped.
        try:
            os.killpg(pgid, signal.SIGCONT)
        except OSError:
            pass
