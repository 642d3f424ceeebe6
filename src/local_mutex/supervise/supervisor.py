"""The supervisor: a forked child of the keeper that runs the command and stays in charge.

It spawns the command in its own process group, forwards the stop signals the keeper
relays (SIGINT/SIGTERM/SIGHUP/SIGQUIT) to that group and escalates (TERM, then KILL) well
inside the GitHub runner's cancel window (SIGINT, SIGTERM 7.5 s later, SIGKILL 2.5 s after
that). It is a child subreaper on Linux, so orphans of the command come back to it.

It stops the command's group and every adopted descendant -- and only then reports and
exits -- when: a stop was asked for (a relayed signal, the run ceiling, SIGUSR1 from the
keeper because the lock was lost), the command's top process died from a signal nobody
here sent (or exited 128+N, a shell's word for it), or the keeper died (its pipe closed).
Because the supervisor holds the lock's open file description too, the lock outlives the
keeper until then. After a normal exit of the top process, leftover background processes
run on unlocked, as with any Unix command.

Everything here runs in a forked copy of the caller: it never prints, never returns into
the caller's code, and always leaves through ``os._exit``.
"""

from __future__ import annotations

import _thread
import fcntl
import os
import time

from .._fastsignal import STOP_SIGNALS, signal
from ..nesting import ENV_HELD, handed_down
from ..wakeup import until_a_signal
from . import reaper, terminal
from .spec import Spec, find_program, why_not_started
from .watch import say_keeper_gone, watch_keeper

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from types import FrameType

SHELL = "/bin/sh"
FORWARDED = STOP_SIGNALS  # passed on to the command
# The keeper's "stop now": the lock was lost, or the keeper is gone.
STOP_NOW = signal.SIGUSR1
# Every signal the supervisor handles. They stay blocked from the fork until the command has
# started (so a stop request is never lost before there is a group to stop), and always in
# the keeper-watch thread: a process-directed signal delivered to that thread would leave
# the main thread asleep in waitpid() with the handler never run.
HANDLED = (*FORWARDED, STOP_NOW, signal.SIGALRM)
# After the first forwarded signal: TERM at +4 s, KILL at +7 s; the runner kills at +10 s.
ESCALATE_TERM_AFTER = 4.0
ESCALATE_KILL_AFTER = 7.0
# A signal the keeper relays and the group also got directly (kill -TERM -PGID, systemd):
# the same signal again within this window is one request, not two.
_SAME_REQUEST = 0.1
# Python ignores these itself; the command must get the defaults (``yes | head`` needs SIGPIPE).
# (Signals we catch are reset by exec anyway; ones our caller ignored stay ignored.)
_RESET_FOR_CHILD = (signal.SIGPIPE, signal.SIGXFSZ)
# ``_Supervisor.resumed`` while Ctrl-Z keeps our caller's job stopped (not math.inf: the
# plain path loads no extension module it can do without).
_STOPPED = float("inf")
# A top process by these names that exits 128+N reports a command of its killed by signal N.
_SHELLS = frozenset({"sh", "dash", "bash", "zsh", "ksh", "mksh", "ash", "busybox"})


class _Supervisor:
    def __init__(self, spec: Spec, keeper: int, subreaper: bool) -> None:
        self.spec = spec
        self.keeper = keeper
        self.pgid: int | None = None
        self.stopper = reaper.Stopper(None, subreaper)
        self.events: list[tuple[float, int, bool]] = []  # (when, signal, is_the_timeout)
        self.stopping = False
        self.timed_out = False
        self.kill_sent = False
        self.keeper_gone = False
        self.lease_ran_out = False
        self.session_closed = False  # the server ended the lock's session
        # When our caller's job, stopped by Ctrl-Z, was last continued (or _STOPPED: now).
        self.resumed = -_STOPPED
        self.signals: list[int] = []
        self.last_request: dict[int, float] = {}
        self.kept: list[int] = []  # descriptions of the lock handed down mid-run
        self.started = time.monotonic()

    # -- signal handlers (run in the main thread between bytecodes) --------------------------

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if now - self.last_request.get(signum, -1.0) < _SAME_REQUEST:
            return
        self.last_request[signum] = now
        self.signals.append(signum)
        self.stopper.send_group(signum)
        if not self.stopping:
            self.stopping = True
            # TERM at +4 s (to what has had none: the group after an INT, a daemon that
            # left it), KILL at +7 s (the runner's comes at +10 s) or --kill-after after
            # the first TERM.
            self._schedule(now + ESCALATE_TERM_AFTER, signal.SIGTERM)
            term = now if signum == signal.SIGTERM else now + ESCALATE_TERM_AFTER
            self._kill_by(min(now + ESCALATE_KILL_AFTER, term + self.spec.kill_after))
        elif signum == signal.SIGTERM:
            self._kill_by(now + self.spec.kill_after)  # a first TERM after an INT

    def on_continue(self, signum: int, frame: FrameType | None) -> None:
        """Our caller passes on the shell's SIGCONT (``fg``, ``bg``, ``kill %1``)."""
        if self.resumed == _STOPPED:
            self.resumed = time.monotonic()

    def _kill_by(self, when: float) -> None:
        """SIGKILL at ``when``, unless one comes sooner already."""
        if all(when < at for at, sig, _ in self.events if sig == signal.SIGKILL):
            self._schedule(when, signal.SIGKILL)

    def on_stop_now(self, signum: int, frame: FrameType | None) -> None:
        """The keeper says stop: the lock is lost, or (from our own watcher) it is gone."""
        if os.getppid() != self.keeper:
            self.keeper_gone = True
        self.stop_everything()

    def stop_everything(self) -> None:
        """TERM to the group and every adopted descendant now, KILL after the grace."""
        if self.stopping and self.stopper.last is not None:
            return
        self.stopping = True
        self.stopper.send(signal.SIGTERM)
        self._schedule(time.monotonic() + self.spec.kill_after, signal.SIGKILL)

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        # Not re-entered: an event due at once (--kill-after 0) re-arms the timer for 1 ms,
        # which would fire in the middle of this handler's own sends.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            self._alarm()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _alarm(self) -> None:
        now = time.monotonic()
        # Edit the list in place: a signal handled in the middle of this may append to it.
        due = [e for e in self.events if e[0] <= now]
        for event in due:
            self.events.remove(event)
        for _, sig, is_timeout in sorted(due):
            if is_timeout and self._command_over():
                continue  # it ended in time; only its reap came first
            if is_timeout:
                self.timed_out = True
                self.stopping = True
                self._schedule(now + self.spec.kill_after, signal.SIGKILL)
            if sig == signal.SIGKILL:
                self.kill_sent = self.kill_sent or self.stopper.anyone_left()
            self.stopper.send(sig)
        self._arm()

    # -- helpers -----------------------------------------------------------------------------

    def _command_over(self) -> bool:
        """Has the command's top process ended (reaped, or a zombie not yet reaped)?"""
        waitid = getattr(os, "waitid", None)  # (not on every platform)
        if self.pgid is None or waitid is None:
            return False
        try:
            return waitid(os.P_PID, self.pgid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True  # reaped already

    def _schedule(self, when: float, sig: int, is_timeout: bool = False) -> None:
        self.events.append((when, sig, is_timeout))
        self._arm()

    def _arm(self) -> None:
        if not self.events:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return
        delay = min(e[0] for e in self.events) - time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, max(delay, 0.001))

    def start(self, keep_fds: Sequence[int], mask: Iterable[int], tty: int | None) -> int:
        spec = self.spec
        actions: list[tuple[object, ...]] = []
        for kept in keep_fds:
            fd = kept
            if kept <= 2:
                # Our caller's stdin, stdout or stderr was closed and the lock took its
                # number: the command gets the lock's description on a higher one, and that
                # stream closed, as its caller had it (not our lock file to write into).
                actions.append((os.POSIX_SPAWN_CLOSE, kept))
                fd = fcntl.fcntl(kept, fcntl.F_DUPFD, 3)
            os.set_inheritable(fd, True)  # the lock's description: the command's second line
        program = SHELL if spec.argv[:2] == ["sh", "-c"] else find_program(spec)
        env = spec.env
        if ENV_HELD in env:
            env = {**env, ENV_HELD: handed_down(env[ENV_HELD], self.keeper, os.getpid())}
        if tty is not None:
            pid = terminal.spawn_in_foreground(tty, program, spec, env, mask, _RESET_FOR_CHILD)
        else:
            # Closed as the caller had them, not the /dev/null standing in for them here.
            shut = {a[1] for a in actions if a[0] == os.POSIX_SPAWN_CLOSE}
            actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in spec.closed if fd not in shut]
            if spec.stdin_devnull:
                actions.append((os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0))
            pid = os.posix_spawn(
                program,
                spec.argv,
                env,
                file_actions=actions,
                setpgroup=0,
                setsigdef=_RESET_FOR_CHILD,
                setsigmask=mask,  # the caller's mask, not the one we hold while starting
            )
        self.pgid = self.stopper.pgid = pid
        self.started = time.monotonic()
        if spec.timeout is not None:
            self._schedule(self.started + spec.timeout, signal.SIGTERM, is_timeout=True)
        return pid


def _install(sup: _Supervisor) -> None:
    # A handler, so that a child's end writes the wakeup fd (``until_a_signal``).
    signal.signal(signal.SIGCHLD, _woken)
    signal.signal(signal.SIGCONT, sup.on_continue)
    signal.signal(signal.SIGALRM, sup.on_alarm)
    signal.signal(STOP_NOW, sup.on_stop_now)
    for sig in FORWARDED:
        if signal.getsignal(sig) != signal.SIG_IGN:  # ignored by our caller (nohup, `&`)
            signal.signal(sig, sup.on_signal)


def _watch_keeper(sup: _Supervisor, life: int, session: int | None) -> None:
    """Thread: ``watch.watch_keeper``, then stop the command (in the main thread)."""
    watch_keeper(sup, life, session)
    os.kill(os.getpid(), STOP_NOW)


def _write(fd: int, line: str) -> None:
    data = line.encode()
    while data:
        try:
            data = data[os.write(fd, data) :]
        except InterruptedError:
            continue
        except OSError:
            return  # the keeper is gone; nobody reads this


def _woken(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD: nothing to do here; its byte in the wakeup fd ends the sleep in
    ``_wait_command``."""


def _wait_command(sup: _Supervisor, pid: int, tty: int | None, home: int) -> int:
    """The command's wait status; reaps adopted orphans on the way. Never asleep in
    waitpid(): a stop (a --timeout, a relayed signal, the keeper's death) that landed just
    before it would wait for the command's own end; a child's end is a signal too."""
    flags = os.WNOHANG | (os.WUNTRACED if tty is not None else 0)
    given = tty if tty == 0 else None  # passed on unasked: the terminal that is our stdin
    sleep = until_a_signal()
    while True:
        try:
            # Any child: the command, or an orphan adopted as a subreaper (reaped here so it
            # never lingers as a zombie); without a subreaper the command is the only one.
            got, status = os.waitpid(-1, flags)
        except ChildProcessError:
            return 0
        if got == 0:
            sleep(terminal.LOOK_AGAIN if terminal.in_background(given, pid) else None)
            terminal.back_in_the_foreground(given, pid, home)
            continue
        if got != pid:
            continue  # an adopted orphan ended: reaped, so it never lingers as a zombie
        if os.WIFSTOPPED(status) and terminal.its_own_stop(
            tty, pid, home, sup.keeper, status, asks=given is None
        ):
            continue
        if os.WIFSTOPPED(status):
            # Ctrl-Z: our caller stops with the command; we stay awake (``stop_caller``).
            sup.resumed = _STOPPED
            terminal.stop_caller(tty, sup.keeper, home, pid)
            while sup.resumed == _STOPPED and not sup.stopping:
                sleep(None)
            if sup.stopping:
                terminal.continue_caller(sup.keeper, home)  # to hear how it ended, and let go
            # ``fg`` gave our caller's group the terminal; ``bg``, ``kill %1`` leave it be.
            terminal.give_terminal(given, pid, taking_from=home.__eq__)  # and it goes on
            continue
        return status


def main(
    spec: Spec,
    out: int,
    life: int,
    keep_fds: Sequence[int],
    keeper: int,
    mask: Iterable[int],
    prctl: int | None,
    session: int | None = None,
) -> None:
    """The supervisor's whole life, in the forked child, which starts with HANDLED blocked
    (``mask`` is the caller's own); ``session``: see ``watch.watch_keeper``. Never returns."""
    code = 70
    try:
        # The caller's wakeup fd (an event loop's, before 3.12 resets it in forked children)
        # must not hear of the signals handled here.
        signal.set_wakeup_fd(-1)
        sup = _Supervisor(spec, keeper, subreaper=False)
        code = _run(sup, out, life, keep_fds, mask, prctl, session)
    except BaseException as exc:
        _write(out, f"error {type(exc).__name__}: {exc}\n".replace("\n", " ").strip() + "\n")
    finally:
        os._exit(code)


def _run(
    sup: _Supervisor,
    out: int,
    life: int,
    keep_fds: Sequence[int],
    mask: Iterable[int],
    prctl: int | None,
    session: int | None,
) -> int:
    _install(sup)
    tty, foreground = terminal.controlling_tty()
    home = os.getpgrp()  # the caller's group: the terminal goes back to it
    # A group of our own: whoever kills the caller's whole group (``kill -9 -PGID``,
    # ``timeout``) takes the keeper but not us, and we stop the command before letting go.
    os.setpgid(0, 0)
    # A child subreaper before the command exists, so that every orphan it makes (a
    # double-forked daemon, a setsid'd child of a shell we stop) comes to us, never to
    # PID 1, from its very first instant (``prctl``: loaded by the keeper before the fork).
    sup.stopper.subreaper = reaper.become_subreaper(prctl)
    try:
        pid = sup.start(keep_fds, mask, tty if foreground else None)
    except OSError as exc:
        _write(out, f"spawnfail {exc.errno or 0} {why_not_started(sup.spec, exc)}\n")
        return 0
    # First: should we die now, the keeper knows whom to stop. (A command in the terminal
    # took it before it ran: nothing to hand over, and a SIGCONT would undo a Ctrl-Z.)
    _write(out, f"pid {pid}\n")
    _thread.start_new_thread(_watch_keeper, (sup, life, session))  # born with HANDLED blocked
    # Now requests reach the main thread: the caller's mask, but never blocking what we
    # handle (a caller that blocks SIGALRM or SIGUSR1 would disarm --timeout and our
    # "stop now", SIGCHLD our waking at the command's end; the command still gets the
    # caller's mask as it was).
    signal.pthread_sigmask(signal.SIG_SETMASK, set(mask) - {*HANDLED, signal.SIGCHLD})
    status = _wait_command(sup, pid, tty, home)
    if sup.stopping or os.WIFSIGNALED(status) or _reports_a_kill(sup.spec, status):
        # Killed by a signal nobody here sent (OOM, kill -9) -- or what it ran was, as a
        # shell says with 128+N (dash runs `sh -c 'bash job.sh'` as sh's child) --, or
        # ended after a stop was asked for: what is left of it -- the rest of its group, a
        # daemon that left the group and never heard a relayed Ctrl-C -- is stopped now
        # (not at the escalation, seconds later): not to run on after the release.
        sup.stop_everything()
    gave_up = False
    if sup.stopping:
        gave_up = not sup.stopper.wait_gone()
    signal.setitimer(signal.ITIMER_REAL, 0)

    def ours(fg: int) -> bool:  # the command's group, or one gone: not a shell's
        return fg == sup.pgid or not reaper.group_alive(fg)

    terminal.give_terminal(tty, home, resume=False, taking_from=ours)
    if sup.timed_out:
        code = 137 if sup.kill_sent else 124
    else:
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code
    # In the order keeper._parse_done reads them.
    ended = (sup.timed_out, sup.kill_sent, gave_up)
    causes = (sup.keeper_gone, sup.lease_ran_out, sup.session_closed)
    flags = " ".join(str(int(flag)) for flag in (*ended, *causes))
    signals = ",".join(str(s) for s in sup.signals) or "-"
    if sup.spec.farewell is not None and not gave_up:
        _say_farewell(*sup.spec.farewell)
    if sup.keeper_gone:  # nobody else is left to say why the command ended
        say_keeper_gone(sup.keeper, code)
    _write(out, f"done {code} {flags} {signals} {sup.started!r}\n")
    return 0


def _reports_a_kill(spec: Spec, status: int) -> bool:
    """A shell that exited 128+N: how it reports a command killed by signal N."""
    shell = os.path.basename(spec.argv[0]) in _SHELLS
    return shell and os.WIFEXITED(status) and 128 < os.WEXITSTATUS(status) < 128 + signal.NSIG


def _say_farewell(fd: int, text: bytes) -> None:
    # socket is loaded already: the keeper made this connection before the fork.
    import socket

    try:
        with socket.socket(fileno=os.dup(fd)) as conn:
            conn.send(text, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
    except OSError:
        pass  # nobody listens any more
