"""The keeper: the caller's side of a supervised run.

The process that took the lock forks a supervisor (``supervisor.py``) that runs the command,
and becomes its keeper: it relays the stop signals it receives -- the GitHub runner signals
only the step's entry process, which is this one -- runs the lock's periodic ``check``
(lease renewals, a deleted lock file put back) and tells the supervisor to stop the
command if the lock is lost. Both processes hold the lock's open file description, and the
command inherits it as well, so no single death frees the lock while the command runs:

* the keeper dies (SIGKILL, OOM): the supervisor sees the keeper's pipe close, stops the
  command's group and every adopted descendant (TERM, then KILL), and only then exits;
* the supervisor dies: the keeper (a child subreaper in the CLI) adopts the command and
  does the same before it releases.
"""

from __future__ import annotations

import os
import select
import sys
import time

from .. import _proc
from .._fastsignal import signal
from ..errors import LockLost, SpawnError
from . import reaper, supervisor
from .hooks import guardian_of, session_of, tell_deadline, why_lost
from .relay import Relay, SignalsHeld
from .spec import Spec
from .supervisor import FORWARDED, STOP_NOW
from .watch import HANGUP

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from ..backends.base import Lock
    from ..ui.lines import Reporter

__all__ = ["Outcome", "SignalsHeld", "Spec", "supervise"]

# How often to wake for a signal another thread took, without the interpreter's wakeup fd.
_NO_WAKEUP_FD = 0.1


class Outcome:
    """How the command ended. ``status`` is what the wrapper exits with."""

    __slots__ = (
        "command_pid",
        "gave_up",
        "keeper_gone",
        "kill_sent",
        "lost",
        "lost_at_release",
        "signals",
        "started",
        "status",
        "supervisor_died",
        "timed_out",
    )

    def __init__(self) -> None:
        self.status = 0
        self.started = time.monotonic()
        self.timed_out = False
        self.kill_sent = False
        self.gave_up = False  # a process of the command survived SIGKILL
        self.keeper_gone = False
        self.signals: list[int] = []  # stop signals relayed to the command
        self.lost: LockLost | None = None  # the lock was lost mid-run; the command stopped
        self.lost_at_release: LockLost | None = None  # found lost once the command was over
        self.supervisor_died: int | None = None  # the signal that killed the supervisor
        self.command_pid: int | None = None  # also the command's process group

    @property
    def stopped(self) -> bool:
        """Was the command stopped by us (signals, ceiling, lost lock, a death)?"""
        died = self.supervisor_died is not None
        return bool(self.signals) or self.timed_out or self.lost is not None or died


def supervise(
    spec: Spec,
    *,
    keep_fds: Sequence[int] = (),
    lock: Lock | None = None,
    reporter: Reporter | None = None,
    subreaper: bool = False,
    held: SignalsHeld | None = None,
    then: Callable[[Outcome], None] | None = None,
) -> Outcome:
    """Run the command to the end under a forked supervisor and report how it ended.

    Returns with the stop signals blocked (unblocked by ``held`` on exit), so a late signal
    cannot kill the caller before it releases the lock. ``subreaper``: adopt the command's
    orphans if the supervisor dies (only for a process of our own, the CLI). ``then(outcome)``
    runs once the command is over and everything of it stopped -- the lock's release --
    while the supervisor still tears itself down (a third of a millisecond the next holder
    need not wait for), with the stop signals blocked: keep it short."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    # prctl (ctypes' C half) before the fork: the supervisor imports nothing (``_fork``).
    prctl = reaper.load_prctl()
    chld_ignored = reaper.keep_exit_statuses()
    spare: frozenset[int] = frozenset()
    if subreaper:
        if reaper.reap_strays():  # leftovers of earlier commands we adopted (``each``)
            spare = frozenset(_proc.children(os.getpid()))  # still running: not this one's
        subreaper = reaper.become_subreaper(prctl)  # a dead supervisor's orphans: ours
    watch = session_of(lock)
    if held is not None:
        held.forking = True  # a stop signal from now on is the command's: see SignalsHeld
    try:
        out_r, out_w, life_r, life_w, mask, child = _start_supervisor(lock)
    except BaseException:
        reaper.ignore_exit_statuses(chld_ignored)
        raise
    if child == 0:
        os.close(out_r)
        os.close(life_w)
        supervisor.main(spec, out_w, life_r, keep_fds, os.getppid(), mask, prctl, watch)
    os.close(out_w)
    os.close(life_r)
    relay = Relay(child)
    ended = reaped = False  # the supervisor has said its last word (or died); reaped it
    try:
        try:
            relay.install()
            if held is not None:  # what came while the relay was not yet in place
                early, held.pending[:] = list(held.pending), []
                for sig in early:
                    relay(sig, None)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            outcome, text, reaped = _wait(
                child, out_r, life_w, lock, reporter, relay, keep_fds, watch
            )
            ended = True
            outcome.signals += [sig for sig in relay.relayed if sig not in outcome.signals]
            if outcome.supervisor_died is not None or text.startswith("error"):
                # Inside another's lock, its descriptions are shared with other runs: not a
                # way to tell which processes are this command's.
                ours = keep_fds if lock is not None else ()
                spare |= guardian_of(lock)
                if held is not None:  # should this fail, the command may run on: keep it
                    held.command_may_run = True
                _stop_orphaned(outcome, spec, subreaper, reporter, text, ours, spare)
                if held is not None:
                    held.command_may_run = False
        finally:
            relay.done = True
            # The caller's mask, should an error have come before it was put back.
            signal.pthread_sigmask(signal.SIG_SETMASK, {*mask, *FORWARDED})
            relay.restore()
            if held is not None:
                held.pending.extend(relay.pending)
        if then is not None:
            then(outcome)
    finally:
        if not ended:
            # An error of ours mid-run: the closed pipes tell the supervisor to stop the
            # command (TERM, KILL after the grace), as our death would; reaped once it has.
            os.close(out_r)
            os.close(life_w)
        if not reaped:
            try:
                os.waitpid(child, 0)
            except ChildProcessError:
                pass
        if ended:
            # Only now: the supervisor would read the end of its pipe as our death.
            os.close(out_r)
            os.close(life_w)
        reaper.ignore_exit_statuses(chld_ignored)
    return outcome


def _start_supervisor(lock: Lock | None) -> tuple[int, int, int, int, Any, int]:
    """The two pipes and the fork: (out_r, out_w, life_r, life_w, the signal mask to put
    back, the child's pid -- 0 in the child). From before the fork, a stop signal must
    reach the command: it waits, blocked, until the relay (here) and the supervisor's
    handlers (there) are in place. Out of descriptors or processes: SpawnError, nothing
    left open."""
    fds: list[int] = []
    try:
        fds.extend(os.pipe())
        fds.extend(os.pipe())
        if lock is not None:  # before the fork: frozen right after it, we would give none
            tell_deadline(lock, fds[3])
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, supervisor.HANDLED)
        try:
            child = _fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
    except BaseException as exc:
        for fd in fds:
            os.close(fd)
        if isinstance(exc, OSError):  # EMFILE, EAGAIN (a process limit), ENOMEM
            raise SpawnError(f"cannot start the command: {exc.strerror or exc}") from None
        raise
    return fds[0], fds[1], fds[2], fds[3], mask, child


def _fork() -> int:
    """os.fork, without Python 3.12's warning about forking a threaded process: the child
    runs only code imported before the fork, takes no Python-level lock, talks through
    os.write and leaves through os._exit, which is what makes such a fork safe."""
    if sys.version_info < (3, 12) or _alone():
        return os.fork()  # nothing to warn about (and no warnings module to load)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _alone() -> bool:
    """Is this thread the process's only one, counted as the interpreter's warning counts
    (by the kernel where it can: ``hold()``'s watcher is a ``_thread`` thread)?"""
    count = _proc.thread_count()
    if count is not None:
        return count == 1
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def _wait(
    child: int,
    out: int,
    life: int,
    lock: Lock | None,
    reporter: Reporter | None,
    relay: Relay,
    keep_fds: Sequence[int],
    watch: int | None = None,
) -> tuple[Outcome, str, bool]:
    """Until the supervisor's last line (``done``), or its death: (outcome, that line, is
    the supervisor reaped -- only if it died). ``watch``: the lock's session socket, whose
    hangup (the server ended the session) runs the check at once, not at the next tick."""
    outcome = Outcome()
    handed = {_identity(fd) for fd in keep_fds}  # the supervisor holds these files too
    buffer = b""
    text = ""
    interval = lock.check_interval() if lock is not None else None
    next_check = time.monotonic() + (interval or 0.0)
    if (cancel_on := getattr(lock, "cancel_on", None)) is not None:
        cancel_on(out)  # a check under way ends once the supervisor reports the end
    poller = select.poll()  # not select(): a caller may hold descriptors past FD_SETSIZE
    poller.register(out, select.POLLIN)
    if relay.wake is not None:
        poller.register(relay.wake, select.POLLIN)
    if watch is not None and interval is not None:
        poller.register(watch, HANGUP)
    while True:
        timeout = max(next_check - time.monotonic(), 0.0) if interval is not None else None
        if relay.wake is None:  # to run the handler of a signal another thread took
            timeout = _NO_WAKEUP_FD if timeout is None else min(timeout, _NO_WAKEUP_FD)
        wait_ms = None if timeout is None else int(timeout * 1000) + 1
        ready = {fd for fd, _ in poller.poll(wait_ms)}
        if relay.wake in ready:
            relay.drain()
        if watch is not None and watch in ready:
            poller.unregister(watch)  # once: a hangup stays readable, and would spin
            watch = None
            next_check = time.monotonic()
        if out in ready:
            data = os.read(out, 4096)
            if not data:
                break
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                text = line.decode("utf-8", "replace")
                if text.startswith("pid "):
                    outcome.command_pid = relay.started(int(text.split()[1]))
                elif text.startswith("spawnfail "):
                    relay.done = True
                    detail = text.split(" ", 2)[2]
                    raise SpawnError(f"cannot start the command: {detail}")
                elif text.startswith("done "):
                    _parse_done(outcome, text, lock)
                    return outcome, text, False
        if interval is not None and lock is not None and time.monotonic() >= next_check:
            interval = _check(lock, reporter, child, outcome, interval)
            if outcome.lost is None:
                kept = {_identity(fd): fd for fd in lock.keep_fds()}
                fresh = [fd for file, fd in kept.items() if file not in handed]
                if fresh:
                    _hand_down(child, life, fresh, reporter)
                handed = set(kept)  # files still open: a closed one's inode may come back
            next_check = time.monotonic() + (interval or 0.0)
            tell_deadline(lock, life)
    relay.child = None  # gone: once reaped, its pid may be another's (relay nothing more)
    try:
        _, status = os.waitpid(child, 0)
    except ChildProcessError:  # reaped by someone else (an embedding program's os.wait)
        status = 0
    outcome.supervisor_died = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    outcome.status = 128 + outcome.supervisor_died if outcome.supervisor_died else 70
    return outcome, text, True


def _check(
    lock: Lock, reporter: Reporter | None, child: int, outcome: Outcome, interval: float
) -> float | None:
    try:
        warning = lock.check()
    except LockLost as exc:
        outcome.lost = exc
        try:
            os.kill(child, STOP_NOW)
            # A stopped supervisor (SIGSTOP, a debugger) would act on it only when continued,
            # while the command runs on beside the lock's next holder.
            os.kill(child, signal.SIGCONT)
        except OSError:
            pass
        return None
    if warning and reporter is not None:
        reporter.warning(warning)
    return lock.check_interval() or interval


def _identity(fd: int) -> tuple[int, int]:
    """Which file a descriptor is (its number may be reused once a stale one is closed)."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _hand_down(child: int, life: int, fds: Sequence[int], reporter: Reporter | None) -> None:
    """A description of the lock opened mid-run (a lock file put back): the supervisor
    must hold it too, or our death would free it while the command still runs."""
    try:  # out of descriptors even the import may fail: say so, the command runs on
        from .handdown import give

        taken = give(child, life, fds)
    except OSError:
        taken = False
    if not taken and reporter is not None:
        reporter.warning(
            "the supervisor did not take the lock file put back: until the command ends, "
            f"the lock depends on pid {os.getpid()} alone"
        )


def _parse_done(outcome: Outcome, text: str, lock: Lock | None = None) -> None:
    fields = text.split()
    _, status, timed_out, kill_sent, gave_up, keeper_gone, ran_out, closed = fields[:8]
    signals, started = fields[8:]
    outcome.status = int(status)
    outcome.timed_out, outcome.kill_sent = timed_out == "1", kill_sent == "1"
    outcome.gave_up, outcome.keeper_gone = gave_up == "1", keeper_gone == "1"
    if ran_out == "1" and outcome.lost is None:
        outcome.lost = LockLost(
            "lost the lease: no renewal went through in time (the keeper could not run "
            "or the server did not answer), so the supervisor stopped the command itself "
            "before anyone could take the lock over"
            if session_of(lock) is None
            else "lost the lock: nothing confirmed its session in time (the keeper could not "
            "run, or the server did not answer), so the supervisor stopped the command "
            "itself before the server could drop the session and hand the lock on"
        )
    if closed == "1" and outcome.lost is None:
        outcome.lost = why_lost(lock) or LockLost(
            "lost the lock: the server ended its session (the keeper could not run), so the "
            "supervisor stopped the command itself"
        )
    outcome.signals = [int(s) for s in signals.split(",")] if signals != "-" else []
    outcome.started = float(started)


def _stop_orphaned(
    outcome: Outcome,
    spec: Spec,
    subreaper: bool,
    reporter: Reporter | None,
    text: str,
    keep_fds: Sequence[int],
    spare: frozenset[int],
) -> None:
    """The supervisor died with the command still ours: stop it before the release. If
    it died before it could tell us the command's pid, the command is found the way the
    kernel sees it: the processes that share our lock's descriptions."""
    pgid = outcome.command_pid or reaper.group_holding(keep_fds)
    if reporter is not None:
        died = outcome.supervisor_died
        why = f"died from signal {died}" if died else f"failed ({text or 'no report'})"
        reporter.error(
            f"the supervisor of the command {why}; stopping the command before releasing"
        )
    stopper = reaper.Stopper(pgid, subreaper, spare)
    stopper.send(signal.SIGTERM)
    if not stopper.wait_gone(until=time.monotonic() + spec.kill_after):
        stopper.send(signal.SIGKILL)
        outcome.kill_sent = True
        outcome.gave_up = not stopper.wait_gone()
