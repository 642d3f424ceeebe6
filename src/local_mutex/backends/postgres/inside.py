"""Runs inside a hold: ``run --reentrant`` in the job of a hold (or with its token).

Such a run takes no lock of its own: the hold's session has it. So that the hold outlasts
the run, as a local hold outlasts the runs sharing its lock file, the run holds the hold's
inside key (``keys.inside_key``) shared, in a session of its own that its command inherits
and its keeper heartbeats; whatever ends the hold -- ``release`` (maybe on another machine),
or the holder at its TTL or its job's end -- first takes that key exclusively, and so waits
until every run inside has ended.

A run that finds the inside key taken exclusively has found a hold that is being ended: it
takes the lock as anyone would, behind the hold. One that gets the key looks again that the
hold still has the lock: it may have ended between the run's first look and its key.
"""

from __future__ import annotations

import time

from ...errors import Unavailable
from . import observe, record
from .keys import inside_key
from .waiting import Interruptible, left

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .lock import PostgresLock
    from .session import Session


def enter(
    lock: PostgresLock, env: Mapping[str, str], token: str | None, limit: float
) -> int | None:
    """The pid of a hold of this job (or ``token``) that has ``lock``'s key, with ``lock``
    now inside it (holding the inside key in a session of its own); None if there is no
    such hold, or it is being ended. Every statement is answered by ``limit``."""
    from ...identity import owned

    try:
        session = lock._connect(limit)
        try:
            for row in observe.fetch_rows(session, [lock.key], timeout=left(limit)):
                pid = row.info.get("pid")
                if row.granted and owned(row.info, env, token) and isinstance(pid, int):
                    return pid if _join(lock, session, row.pid, limit) else None
        finally:
            if lock.session is not session:
                session.close()
    except Unavailable as exc:
        raise Unavailable(
            f"cannot tell whether a hold of this job has lock {lock.label}: {exc}"
        ) from None
    return None


def _join(lock: PostgresLock, session: Session, hold: int, limit: float) -> bool:
    """Take the inside key shared, with the run's record (heartbeats repeat it); True if
    the hold -- server pid ``hold`` -- still has the lock."""
    key = inside_key(lock.name)
    lock._wait_since, lock._command = time.time(), record.waiter_command(lock.url)
    lock._comment = lock._record(None, True)
    try_sql = f"{lock._comment} SELECT pg_try_advisory_lock_shared({key})"
    if not session.fetch(try_sql, timeout=left(limit))[0]:
        return False  # whoever ends the hold has the key: it is ending
    rows = observe.fetch_rows(session, [lock.key], timeout=left(limit))
    if not any(row.pid == hold and row.granted for row in rows):
        return False  # it ended before we had the key
    lock.session, lock.held_key, lock.shared, lock.inside_of = session, key, True, hold
    lock._beat(session)  # the record again: ``status`` and ``list`` read the last statement
    return True


def settle(
    session: Session, name: bytes, comment: str, waiting: Callable[[], None] | None = None
) -> bool:
    """Take the inside key exclusively: at once if no run is inside the hold, else once the
    last has ended (``waiting()`` is told first): True if it had to wait. Kept until
    ``session`` ends. A stop signal cancels the wait in the server and raises
    ``Interrupted``."""
    key = inside_key(name)
    try_sql = f"{comment} SELECT pg_try_advisory_lock({key})"
    if session.fetch(try_sql, timeout=observe.READ_SECONDS)[0]:
        return False
    if waiting is not None:
        waiting()
    with Interruptible() as stop:
        try:
            with stop.query():
                session.fetch(f"{comment} SELECT pg_advisory_lock({key})")
        except BaseException:
            if stop.interrupted_during_query:
                session.cancel()
            raise
    return True
