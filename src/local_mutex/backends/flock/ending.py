"""Ending a hold: signal its detached holder process until it has let go of the lock.

Through a pidfd where the kernel has them (Linux 5.3+): the signals reach that very
process, never one that took its number after it exited, and its exit is seen at once,
zombie or not. Elsewhere, by its number and by the lock's holders."""

from __future__ import annotations

import os
import select
import time

from ... import _proc
from ..._fastsignal import signal
from ...errors import Refused
from .state import status_of_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

# How long ``release`` gives a holder to go after SIGTERM, then after SIGKILL.
RELEASE_GRACE = (10.0, 2.0)
_POLL = 0.02


def end_holder(
    pid: int, path: str, label: str, user: object, gone: Callable[[], bool] | None = None
) -> None:
    """SIGTERM, then SIGKILL after the grace, until ``pid`` no longer holds ``path`` (or,
    for a hold whose file was deleted, until ``gone``)."""
    pidfd = _open_pidfd(pid)
    let_go = gone if gone is not None else lambda: not _holds(pid, path)
    try:
        if let_go():  # it let go between our look and now
            return
        for sig, grace in zip((signal.SIGTERM, signal.SIGKILL), RELEASE_GRACE):
            try:
                _send(pid, pidfd, sig)
                _send(pid, pidfd, signal.SIGCONT)  # a stopped holder acts on it now
            except ProcessLookupError:
                return
            except PermissionError:
                raise Refused(
                    f"the hold on {label} (pid {pid}) belongs to user {_owner(pid, user)}; "
                    "only that user or root can end it"
                ) from None
            if _let_go(pid, pidfd, let_go, grace):
                return
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _owner(pid: int, recorded: object) -> str:
    """Who runs ``pid``, as the kernel says (the record's ``user`` is the holder's $USER,
    which anybody can set), else as recorded."""
    try:
        uid = os.stat(f"{_proc.PROC}/{pid}").st_uid
    except OSError:
        return str(recorded or "?")
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def _open_pidfd(pid: int) -> int | None:
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(pid))
    except OSError:  # gone already (ESRCH), or a kernel without pidfds (ENOSYS)
        return None


def _send(pid: int, pidfd: int | None, sig: int) -> None:
    send = getattr(signal, "pidfd_send_signal", None)
    if pidfd is not None and send is not None:
        send(pidfd, sig)
    else:
        os.kill(pid, sig)


def _let_go(pid: int, pidfd: int | None, let_go: Callable[[], bool], grace: float) -> bool:
    """Within ``grace``: has the holder exited, or stopped holding the lock? (Whoever
    was queued behind it may hold the lock by then: that is not the holder.)"""
    deadline = time.monotonic() + grace
    while True:
        if pidfd is not None and select.select([pidfd], [], [], 0)[0]:
            return True  # exited
        if let_go():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if pidfd is not None:
            select.select([pidfd], [], [], min(left, _POLL))
        else:
            time.sleep(min(left, _POLL))


def _holds(pid: int, path: str) -> bool:
    st = status_of_path(path, allow_other_owner=True)
    if not st.held:
        return False
    pids = {h.pid for h in st.holders}
    if pids - {None}:
        return pid in pids
    return _proc.exists(pid)  # the kernel names no holders here (no /proc/locks)
