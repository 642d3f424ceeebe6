"""The optional parts of the ``Lock`` protocol (``backends.base``), as the keeper reads
them: a lock may have a guardian, a server session, or a lease with a stop deadline."""

from __future__ import annotations

import os

from ..errors import LockLost

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..backends.base import Lock

# How much later than the keeper the supervisor enforces a lease's stop deadline; less
# than the margin the lifecycle adds to --kill-after (lifecycle.STOP_MARGIN).
SUPERVISOR_LATE = 1.0


def guardian_of(lock: Lock | None) -> frozenset[int]:
    """The lock's guardian: our child, to outlive us as long as the command does, not to
    be stopped as one of its orphans."""
    pid = getattr(lock, "guardian", None)
    return frozenset({pid}) if isinstance(pid, int) else frozenset()


def session_of(lock: Lock | None) -> int | None:
    """The lock's server session socket: its hangup means the server ended the session,
    and with it the lock."""
    session_fd = getattr(lock, "session_fd", None)
    return session_fd() if session_fd is not None else None


def tell_deadline(lock: Lock, life: int) -> None:
    """For a leased lock: by when (monotonic) the supervisor must have stopped the command
    on its own, should no newer deadline follow (a keeper frozen by SIGSTOP renews
    nothing, yet keeps the pipe open). Only a new one is written, and never blocking: a
    supervisor that is stopped reads nothing, and a keeper blocked on its full pipe would
    stop watching the lock (a dropped line is followed by a newer one)."""
    stop_deadline = getattr(lock, "stop_deadline", None)
    deadline = stop_deadline() if stop_deadline is not None else None
    if deadline is None or _told.get(life) == deadline:
        return
    # A second late: the keeper, when it runs, acts first and says why.
    line = f"deadline {deadline + SUPERVISOR_LATE!r}\n".encode()
    try:
        os.set_blocking(life, False)
        try:
            if os.write(life, line) == len(line):
                _told[life] = deadline
        finally:
            os.set_blocking(life, True)
    except OSError:
        pass


# The last deadline written to each supervisor's pipe (by its descriptor).
_told: dict[int, float] = {}


def why_lost(lock: Lock | None) -> LockLost | None:
    """The lock's own account of its loss (which lock, and how), asked once the supervisor
    saw the server end the session first and has stopped the command already."""
    if lock is None:
        return None
    try:
        lock.check()
    except LockLost as exc:
        return exc
    except Exception:  # it cannot say: the supervisor's account stands
        pass
    return None
