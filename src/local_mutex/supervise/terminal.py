"""Sharing a terminal with the command: it gets the foreground (it can prompt, and Ctrl-C
and Ctrl-Z reach it), and we take it back when it stops or ends."""

from __future__ import annotations

import os

from .._fastsignal import signal


def foreground_tty() -> int | None:
    """fd 0 when it is a terminal whose foreground group is ours, else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def give_terminal(tty: int | None, pgid: int, *, resume: bool = True) -> None:
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


def stop_with(tty: int | None, keeper: int) -> None:
    """Ctrl-Z stopped the command: stop the keeper and ourselves as a shell job would, so
    the shell sees its job stopped; ``fg`` continues us all."""
    give_terminal(tty, os.getpgrp(), resume=False)
    try:
        os.kill(keeper, signal.SIGSTOP)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGSTOP)
