"""Runs inside a hold: ``run --reentrant`` in the job of a hold (or with its token).

Such a run takes no lock of its own: the hold's session has it. So that the hold outlasts
the run, as a local hold outlasts the runs sharing its lock file, the run holds the hold's
inside key (``keys.inside_key``) shared, in a session of its own that its command inherits
and its keeper heartbeats; whatever ends the hold -- ``release`` (maybe on another machine),
or the holder at its TTL or its job's end -- first takes that key exclusively, and so waits
until every run inside has ended. Whoever takes the lock next waits until that key is free
too: a holder killed outright frees the lock at once, while the runs inside it still run
(until their next heartbeat stops them).

A run that finds the inside key taken, or asked for, exclusively waits its turn (within its
``--wait``), then looks again whether the hold still has the lock: ended, it takes the lock
as anyone would; still there (a release stopped with Ctrl-C), it runs inside it.
"""

from __future__ import annotations

import signal
import time

from ...errors import NotAcquired, Unavailable
from . import observe, record
from .keys import inside_key
from .waiting import Interruptible, left

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ...ui.lines import Reporter
    from .lock import PostgresLock
    from .session import Session

# What a stop signal must not cut short: a holder's wait for the runs inside its hold.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def enter(
    lock: PostgresLock,
    env: Mapping[str, str],
    token: str | None,
    limit: float,
    wait: float | None,
    reporter: Reporter | None = None,
) -> int | None:
    """The pid of a hold of this job (or ``token``) that has ``lock``'s key, with ``lock``
    now inside it (holding the inside key in a session of its own); None if there is no
    such hold, or it ended while we waited for our turn. Each look is answered by
    ``limit``; the turn is waited for within ``wait`` (None: as long as it takes)."""
    from ...identity import owned

    try:
        session = lock._connect(limit)
        try:
            for row in observe.fetch_rows(session, [lock.key], timeout=left(limit)):
                pid = row.info.get("pid")
                if row.granted and owned(row.info, env, token) and isinstance(pid, int):
                    joined = _join(lock, session, row.pid, limit, wait, reporter)
                    return pid if joined else None
        finally:
            if lock.session is not session:
                session.close()
    except Unavailable as exc:
        raise Unavailable(
            f"cannot tell whether a hold of this job has lock {lock.label}: {exc}"
        ) from None
    return None


def _join(
    lock: PostgresLock,
    session: Session,
    hold: int,
    limit: float,
    wait: float | None,
    reporter: Reporter | None,
) -> bool:
    """Take the inside key shared, with the run's record (heartbeats repeat it); True if
    the hold -- server pid ``hold`` -- still has the lock once we have it."""
    key = inside_key(lock.name)
    start = time.monotonic()
    lock._wait_since, lock._command = time.time(), record.waiter_command(lock.url)
    lock._comment = lock._record(None, True)
    if not session.fetch(
        f"{lock._comment} SELECT pg_try_advisory_lock_shared({key})", timeout=left(limit)
    )[0]:
        # The hold is being ended (or a release waits to end it): our turn comes once it
        # has ended, or once that release was stopped.
        if wait is not None and wait <= 0:
            return False
        if reporter is not None:
            reporter.waiting(lock.label, None, detail="its hold of this job is being ended")
        turn = None if wait is None else start + wait + 1.0
        if wait is not None:  # the server's ceiling, as for the lock itself
            ms = str(max(int((wait - (time.monotonic() - start)) * 1000), 1))
            session.fetch(
                "SELECT set_config('lock_timeout', %s, false)", (ms,), timeout=left(limit)
            )
        psycopg = __import__("psycopg")
        try:
            _wait_in_server(session, f"{lock._comment} SELECT pg_advisory_lock_shared({key})", turn)
        except psycopg.errors.LockNotAvailable:
            return False
    rows = observe.fetch_rows(session, [lock.key], timeout=left(limit))
    if not any(row.pid == hold and row.granted for row in rows):
        return False  # it ended before we had the key
    lock.session, lock.held_key, lock.shared, lock.inside_of = session, key, True, hold
    lock._beat(session)  # the record again: ``status`` and ``list`` read the last statement
    return True


def settle(
    session: Session,
    name: bytes,
    comment: str,
    waiting: Callable[[], None] | None = None,
    *,
    stoppable: bool = True,
) -> bool:
    """Take the inside key exclusively: at once if no run is inside the hold, else once the
    last has ended (``waiting()`` is told first): True if it had to wait. Kept until
    ``session`` ends. ``stoppable``: a stop signal cancels the wait in the server and raises
    ``Interrupted``; else (the holder ending its own hold) it waits until the wait is over."""
    key = inside_key(name)
    try_sql = f"{comment} SELECT pg_try_advisory_lock({key})"
    if session.fetch(try_sql, timeout=observe.READ_SECONDS)[0]:
        return False
    # No ceiling of an earlier wait of this session's (``--wait`` of the hold) applies.
    session.fetch("SELECT set_config('lock_timeout', '0', false)", timeout=observe.READ_SECONDS)
    wait_sql = f"{comment} SELECT pg_advisory_lock({key})"
    if not stoppable:
        if waiting is not None:
            waiting()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            session.fetch(wait_sql)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return True
    _wait_in_server(session, wait_sql, said=waiting)
    return True


def _wait_in_server(
    session: Session, sql: str, limit: float | None = None, said: Callable[[], None] | None = None
) -> None:
    """A statement that waits for a lock in the server: a stop signal cancels it there (a
    waiter left queued would be served later) and raises ``Interrupted``. ``said()`` (we
    wait) is told once a stop signal raises that: one just after it, before the wait, was
    a KeyboardInterrupt, the run ending 130 without a word."""
    with Interruptible() as stop:
        if said is not None:
            said()
        try:
            with stop.query():
                session.fetch(sql, timeout=left(limit))
        except BaseException:
            if stop.interrupted_during_query:
                session.cancel()
            raise


def clear(
    lock: PostgresLock,
    session: Session,
    shared: bool,
    take: tuple[float | None, float, float | None],
    reporter: Reporter | None,
) -> bool:
    """For whoever just took the lock: wait until no run of an earlier hold is inside (its
    holder was killed outright; they stop at their next heartbeat); True if it waited.
    ``take``: the wait ceiling, when the wait began, and by when the server must answer;
    past the ceiling, ``NotAcquired``. Only a shared holder of the key is a run inside: an
    exclusive one is another taker looking, or the end of a hold (over, as we have the lock)."""
    wait, start, limit = take
    key = inside_key(lock.name)
    bound = left(limit) or observe.READ_SECONDS
    # CASE, not AND: only CASE promises the order (an unlock first would leave the lock).
    free = (
        f"SELECT CASE WHEN pg_try_advisory_lock({key}) THEN pg_advisory_unlock({key})"
        " ELSE false END"
    )
    if session.fetch(free, timeout=bound)[0]:  # the usual answer, and the cheapest
        return False
    if not session.fetch(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
        f" AND granted AND mode = 'ShareLock' AND (classid::bigint << 32) | objid::bigint = {key}"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
        timeout=bound,
    )[0]:
        return False
    if reporter is not None:
        detail = "runs inside its last hold, whose holder was killed, are still running"
        reporter.waiting(lock.label, None, detail=detail)
    remaining = None if wait is None else wait - (time.monotonic() - start)
    psycopg = __import__("psycopg")
    try:
        if remaining is not None:
            if remaining <= 0:
                raise psycopg.errors.LockNotAvailable()
            ms = str(max(int(remaining * 1000), 1))
            session.fetch(
                "SELECT set_config('lock_timeout', %s, false)", (ms,), timeout=left(limit)
            )
        comment = lock._record(None, shared)
        session.fetch(
            f"{comment} SELECT pg_advisory_lock({key}), pg_advisory_unlock({key})",
            timeout=left(limit),
        )
    except psycopg.errors.LockNotAvailable:
        waited = time.monotonic() - start
        raise NotAcquired(
            f"lock {lock.label} not acquired after waiting {waited:.1f}s on {session.address}:"
            " runs inside its last hold (whose holder was killed) are still running",
            None,
            waited,
        ) from None
    return True
