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
        return busy_text(session, lock.label, keys, limit, gate)

    if wait is not None and wait <= 0 and _try_slots(lock, session, keys, limit):
        # --no-wait never queues: a free slot is taken whoever is at the gate (a head that
        # is stopped would keep it from us, and the refusal would call it busy).
        bookend(reporter, f"{lock.label} (slot {lock.slot})", None, lock.label)
        return
    announced = lock._take(session, gate, False, wait, reporter, start, stop, limit, busy=busy)
    delay = _POLL_MIN
    while True:
        if _try_slots(lock, session, keys, limit):
            # The next one in the queue looks.
            session.fetch(f"SELECT pg_advisory_unlock({gate})", timeout=left(limit))
            waited = time.monotonic() - start if announced else None
            bookend(reporter, f"{lock.label} (slot {lock.slot})", waited, lock.label)
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


def busy_text(
    session: Session, label: str, keys: Sequence[int], limit: float | None, gate: int
) -> str:
    """``all N slots of NAME are busy (slot 0: pid …; slot 1: …)``, as the local backend
    says it; or, once one is free, who holds the queue's head (the server's queue is first
    come, first served: a head that is stopped keeps the free slot from those behind it)."""
    psycopg = __import__("psycopg")
    try:
        rows = observe.fetch_rows(session, [*keys, gate], timeout=left(limit))
    except (Unavailable, psycopg.Error):
        return f"all {len(keys)} slots of {label} are busy"
    held = []
    for index, key in enumerate(keys):
        holder = observe.first_holder(rows, key)
        if holder is not None:
            held.append(f"slot {index}: {who(holder)}")
    head = observe.first_holder(rows, gate)
    if len(held) < len(keys) and head is not None:
        free = len(keys) - len(held)
        return (
            f"{free} of {len(keys)} slots of {label} free, but the waiter at the head of the "
            f"queue ({who(head)}) has not taken one: stopped, or about to"
        )
    return f"all {len(keys)} slots of {label} are busy" + (
        " (" + "; ".join(held) + ")" if held else ""
    )
