"""Sharing a terminal with the command: it gets the foreground (it can prompt, and Ctrl-C
and Ctrl-Z reach it), and we take it back when it stops or ends."""

from __future__ import annotations

import os

from .._fastsignal import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from .spec import Spec


def controlling_tty() -> tuple[int | None, bool]:
    """Our controlling terminal: fd 0 -- or, where stdin is not it (``printf x |
    local-mutex ...``, ``each``), fd 2 or 1 -- else None; and whether the command gets it
    from the start: not a run started with `&`, whose command gets it on `fg`, nor one
    whose stdin is not the terminal, whose command gets it only when it asks for it (a
    read stops it: ``read_in_the_foreground``) -- it might have stopped for good unseen."""
    for fd in (0, 2, 1):
        try:
            if os.isatty(fd):
                return fd, fd == 0 and os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:  # another session's terminal
            continue
    return None, False


def give_terminal(
    tty: int | None,
    pgid: int,
    *,
    resume: bool = True,
    taking_from: Callable[[int], bool] | None = None,
) -> None:
    """Make ``pgid`` the terminal's foreground group so it can read keys and get Ctrl-C --
    with ``taking_from``, only if it says yes to the group that has it now (one gone is
    still named by the kernel): a terminal the shell took back (its job stopped, then
    ``bg`` or ``kill %1``) stays the shell's. Taken from it, the shell lost its prompt; an
    interactive bash exited. (No terminal: it is only continued, with ``resume``.)"""
    if tty is not None:
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            if taking_from is None or taking_from(os.tcgetpgrp(tty)):
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


def spawn_in_foreground(
    tty: int,
    program: str,
    spec: Spec,
    env: Mapping[str, str],
    mask: Iterable[int],
    reset: Iterable[int],
) -> int:
    """Start the command in its own process group that owns the terminal *before* it
    runs: a Ctrl-Z typed the moment it prints its first line must stop it, and one that
    reached our group instead would be dropped (the kernel does not stop an orphaned
    group). posix_spawn cannot hand the terminal over in the child, so fork and exec."""
    pid = os.fork()
    if pid:
        # Its group from now on, whoever of us runs first (as shells do): a stop signal
        # relayed before the child got to it would find no group to go to.
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # it has exec'd: its own setpgid came first
        return pid
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        os.tcsetpgrp(tty, os.getpid())
        # A Ctrl-C typed from here on is the command's: the supervisor's handlers, copied
        # by the fork, must not take it (blocked until the mask below; ignored stay so).
        defaults = {signal.SIGTTOU, *reset}
        for sig in signal.valid_signals():
            if sig in defaults or callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in spec.closed:  # as the caller had them (``Spec.closed``)
            os.close(fd)
        if spec.stdin_devnull:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.execve(program, spec.argv, env)
    except BaseException:
        os._exit(127)


# A run whose command is not in the foreground (`bg`, or started with `&`) looks this often
# whether the shell brought it back: `fg` sends a running job no signal, it only gives our
# caller's group the terminal.
LOOK_AGAIN = 0.1


def in_background(tty: int | None, command: int) -> bool:
    """Is the terminal another group's than the command's (the shell's, after `bg`)?"""
    try:
        return tty is not None and os.tcgetpgrp(tty) != command
    except OSError:
        return False


def back_in_the_foreground(tty: int | None, command: int, home: int) -> None:
    """`fg` after `bg` gave our caller's group the terminal: the command's again (or it
    would stop at its next read, and a Ctrl-Z would stop our caller alone)."""
    give_terminal(tty, command, resume=False, taking_from=home.__eq__)


def its_own_stop(
    tty: int | None, command: int, home: int, keeper: int, status: int, asks: bool
) -> bool:
    """Is this stop of the command one its job does not share (taken care of here)? A read
    of a terminal that is the job's (``read_in_the_foreground``), or any stop when our
    caller's group is not a job (``_a_job``): the terminal's Ctrl-Z would have been dropped
    for the command too, had it been in that group -- it goes on. (Not from a read of a
    terminal that is not its to take: it would only stop again, and again.) ``asks``: the
    command gets the terminal only when it asks (our stdin is not the terminal) -- and
    only from a group a shell made for our run (``_made_for``)."""
    job = _a_job(keeper, home)  # first: a shell's `fg` may come meanwhile (ours to see)
    ours = _made_for(keeper, home) if asks else job
    if read_in_the_foreground(tty, command, home if ours else None, status):
        return True
    if asks and not ours and os.WSTOPSIG(status) in (signal.SIGTTIN, signal.SIGTTOU):
        return True  # it stays at its read: our caller's group may be a shell's own
    if job:
        return False
    if os.WSTOPSIG(status) not in (signal.SIGSTOP, signal.SIGTTIN, signal.SIGTTOU):
        try:  # (one sent by hand stays)
            os.killpg(command, signal.SIGCONT)
        except OSError:
            pass
    return True


def _a_job(keeper: int, home: int) -> bool:
    """Is our caller's group a job of a shell with job control, which stops and continues
    it? Not an orphaned one (no member's parent in another group of the session: a session
    whose leader runs us -- ``ssh -t host cmd``, ``script -c``, ``docker run -t``, or a
    shell script such a leader runs): the kernel drops the terminal's stop signals there,
    for nobody could continue it. Asked of our caller's first ancestor outside its group."""
    from .. import _proc  # loaded already (``reaper``)

    pid, session = keeper, os.getsid(0)
    for _ in range(64):
        parent = _proc.parent_of(pid)
        if parent is None or parent <= 1:
            return False
        try:
            if os.getpgid(parent) != home:
                return os.getsid(parent) == session
        except OSError:
            return False
        pid = parent
    return False


def _made_for(keeper: int, home: int) -> bool:
    """Did a shell with job control make our caller's group for our run's pipeline (the
    keeper's parent is outside it, in our session)? Not a group a shell itself runs in --
    an interactive one with job control off (``set +m``, also one a shell started as a
    job), a script --, which may be reading its next line from the terminal meanwhile."""
    from .. import _proc  # loaded already (``reaper``)

    parent = _proc.parent_of(keeper)
    try:
        return (
            parent is not None
            and parent > 1
            and os.getpgid(parent) != home
            and (os.getsid(parent) == os.getsid(0))
        )
    except OSError:
        return False


def read_in_the_foreground(tty: int | None, command: int, home: int | None, status: int) -> bool:
    """The command stopped at the terminal (SIGTTIN, SIGTTOU) that our caller's group has
    -- `fg` after `bg`, not passed on yet; a command whose stdin is not the terminal asks
    for it so --: it is the command's now, and it goes on. (Or the command's already:
    passed on as the stop was on its way to us.) ``home``: None where our caller's group's
    terminal is not ours to take (``its_own_stop``): a shell's own group, whose shell may
    be reading its next command line from it (an interactive bash then exits)."""
    if tty is None or os.WSTOPSIG(status) not in (signal.SIGTTIN, signal.SIGTTOU):
        return False
    try:
        group = os.tcgetpgrp(tty)
    except OSError:
        return False
    if group not in (home, command) and not _an_enclosing_runs_caller(group):
        return False  # in the background: it stops, as any job would
    give_terminal(tty, command)
    return True


def _an_enclosing_runs_caller(group: int) -> bool:
    """Is ``group`` the caller's group of a run whose command we are part of? That run's
    command would get the terminal by asking (its stdin not the terminal, it gets it only
    then), and so do we: a nested run's stop would stop it instead, for good after each
    `fg`. (Not a shell's own group: a run started with `&` stops, as any job would.)"""
    from .. import _proc  # loaded already (``reaper``)
    from ..nesting import held_entries

    for supervisor, _, _ in held_entries(os.environ):
        keeper = _proc.parent_of(supervisor) if _proc.is_ancestor(supervisor) else None
        try:
            if keeper is not None and os.getpgid(keeper) == group:
                return _made_for(keeper, group)
        except OSError:
            continue
    return False


def stop_caller(tty: int | None, keeper: int, home: int, command: int) -> None:
    """Ctrl-Z stopped the command: stop our caller's job as well -- the keeper's whole
    group (``| cat``; the shell whose list runs us), as the terminal would have -- so the
    shell sees its job stopped and takes the terminal back (a job one process of which
    runs on is not stopped: no prompt). ``fg``, ``bg`` or ``kill %1`` continues it, and our
    caller passes the SIGCONT on to us. We never stop ourselves: that SIGCONT could come
    before our stop and leave us, and the command, stopped for good. Awake, we still
    enforce --timeout, a lease, and our caller's end."""
    give_terminal(tty, home, resume=False, taking_from=command.__eq__)
    # All at once (a SIGCONT after part of it would be undone), and not SIGTSTP: the
    # keeper passes that on to the command (``Relay``).
    _to_caller(keeper, home, signal.SIGSTOP)


def continue_caller(keeper: int, home: int) -> None:
    """The command was stopped for good while its job was stopped: the job goes on, and our
    caller reports how the command ended."""
    _to_caller(keeper, home, signal.SIGCONT)


def _to_caller(keeper: int, home: int, sig: int) -> None:
    try:
        os.killpg(home, sig)
    except OSError:  # none such any more (an API caller that moved to another group)
        try:
            os.kill(keeper, sig)
        except OSError:
            pass
