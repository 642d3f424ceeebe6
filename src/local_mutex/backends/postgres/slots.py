"""Counting semaphores (``--slots N``): waiters queue in the server on the name's gate key;
the head of that queue (the session holding the gate) tries the slot keys with a short
backoff, as the local backend does with files, and lets the gate go once it has a slot.
The others look at the slots once a second too, so a head that is stopped (Ctrl-Z,
SIGSTOP) never keeps free slots from the rest.

Messages name the slots' holders, never the gate's: whoever holds the gate is only the
next waiter.
"""

from __future__ import annotations

import time

from ...errors import NotAcquired, Unavailable
from . import observe
from .keys import gate_key, slot_key
from .waiting import left, who

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ...ui.lines import Reporter
    from .lock import PostgresLock
    from .session import Session
    from .waiting import Interruptible

_POLL_MIN, _POLL_MAX = 0.005, 0.1
# A waiter behind the head of the queue looks at the slots itself this often (leaving the
# queue for it, as the local backend does): a head that leaves a slot free that long is
# stopped, or asks for a slot beyond ours.
_BEHIND_LOOK = 1.0


def take_slot(
    lock: PostgresLock,
    session: Session,
    slots: int,
    wait: float | None,
    reporter: Reporter | None,
    start: float,
    stop: Interruptible,
    limit: float | None,
) -> None:
    """Take a free slot of ``lock``'s name on ``session`` (``lock.slot`` says which)."""
    gate = gate_key(lock.name)
    keys = [slot_key(lock.name, i) for i in range(slots)]

    def busy() -> str:
        return busy_text(session, lock.label, keys, limit)

    announced = False
    while True:  # behind the head: in the queue, but out of it once a second to look
        said = None if announced else reporter
        queued = lock._take(
            session, gate, False, wait, said, start, stop, limit, busy=busy, look=_BEHIND_LOOK
        )
        if queued is not None:
            announced = announced or queued
            break
        announced = True  # _take said we wait
        if _try_slots(lock, session, keys, limit):
            _took(lock, reporter, start)
            return
    delay = _POLL_MIN
    while True:
        if _try_slots(lock, session, keys, limit):
            # The next one in the queue looks.
            session.fetch(f"SELECT pg_advisory_unlock({gate})", timeout=left(limit))
            _took(lock, reporter, start if announced else None)
            return
        waited = time.monotonic() - start
        if wait is not None and waited >= wait:
            # The caller closes the session, which lets go of the gate.
            raise NotAcquired(
                f"lock {lock.label} not acquired after waiting {waited:.1f}s on "
                f"{session.address}; {busy()}",
                None,
                waited,
            )
        if not announced and reporter is not None:
            reporter.waiting(lock.label, None, detail=busy())
        announced = True
        pause = delay if wait is None else min(delay, wait - waited)
        time.sleep(max(pause, 0.0))
        delay = min(delay * 2, _POLL_MAX)


def _try_slots(lock: PostgresLock, session: Session, keys: list[int], limit: float | None) -> bool:
    """Take the first free slot (``lock.held_key``, ``lock.slot``), if any."""
    for index, key in enumerate(keys):
        sql = lock._statement("pg_try_advisory_lock", key, index, False)
        if session.fetch(sql, timeout=left(limit))[0]:
            lock.held_key, lock.slot = key, index
            return True
    return False


def _took(lock: PostgresLock, reporter: Reporter | None, start: float | None) -> None:
    waited = None if start is None else time.monotonic() - start
    bookend(reporter, f"{lock.label} (slot {lock.slot})", waited, lock.label)


def bookend(
    reporter: Reporter | None, label: str, waited: float | None, free_label: str | None = None
) -> None:
    """Once taken, the line a local lock prints: the waiting bookend of a lock free at once
    (``waited`` None), else when it was acquired after the wait."""
    if reporter is None:
        return
    if waited is None:
        reporter.waiting(free_label or label, None)
    else:
        reporter.acquired(label, waited)


def busy_text(session: Session, label: str, keys: Sequence[int], limit: float | None) -> str:
    """``all N slots of NAME are busy (slot 0: pid …; slot 1: …)``, as the local backend
    says it."""
    psycopg = __import__("psycopg")
    try:
        rows = observe.fetch_rows(session, keys, timeout=left(limit))
    except (Unavailable, psycopg.Error):
        rows = []
    held = []
    for index, key in enumerate(keys):
        holder = observe.first_holder(rows, key)
        if holder is not None:
            held.append(f"slot {index}: {who(holder)}")
    return f"all {len(keys)} slots of {label} are busy" + (
        " (" + "; ".join(held) + ")" if held else ""
    )
