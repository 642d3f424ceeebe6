"""Counting semaphores (``--slots N``): waiters queue in the server on the name's gate key;
the head of that queue (the session holding the gate) tries the slot keys with a short
backoff, as the local backend does with files, and lets the gate go once it has a slot.

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

    announced = lock._take(session, gate, False, wait, reporter, start, stop, limit, busy=busy)
    delay = _POLL_MIN
    while True:
        for index, key in enumerate(keys):
            sql = lock._statement("pg_try_advisory_lock", key, index, False)
            if session.fetch(sql, timeout=left(limit))[0]:
                lock.held_key, lock.slot = key, index
                # The next one in the queue looks.
                session.fetch(f"SELECT pg_advisory_unlock({gate})", timeout=left(limit))
                waited = time.monotonic() - start if announced else None
                bookend(reporter, f"{lock.label} (slot {index})", waited, lock.label)
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
