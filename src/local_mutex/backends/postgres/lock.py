"""One name in one database, held by one session-level advisory lock.

Waiting happens in the server: ``pg_advisory_lock`` queues us behind the holder and returns
the moment it lets go; the wait ceiling is the session's ``lock_timeout``, so there is no
polling. ``--no-wait`` is ``pg_try_advisory_lock``. Slots queue on a gate key and the head
of that queue polls the slot keys, as the local backend does with files.

While held, ``check`` reads an unasked-for message (the server's FATAL before it closes, or
EOF: keeper and supervisor poll ``session_fd`` for that hangup) and heartbeats on a timer: a
statement that re-sends the holder record and asks ``pg_locks`` whether this session still
holds the key. A lost session, or a heartbeat unanswered within the deadline (the kernel's
``tcp_user_timeout``), raises ``LockLost`` well before the server's drop bound ends it.
"""

from __future__ import annotations

import os
import time

from ... import nesting
from ...errors import LockLost, NotAcquired, RecordNotWritten, Unavailable
from . import observe, record, waiting
from .address import (
    ENV_DROP,
    ENV_PASSWORD,
    ENV_PASSWORD_FOR,
    DropBound,
    domain,
    password_of,
    without_password,
)
from .connect import driver_message, refused_by_server
from .inside import clear, enter, settle
from .keys import describe_key, name_key
from .nesting import enclosing_entry, held_entry
from .session import Session
from .slots import bookend, take_slot
from .waiting import Interruptible, left, queue_detail, queue_progress, refusal, wait_in_queue

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from ...ui.lines import Reporter
    from .. import Take

_GRACE = 1.0  # past --wait: the server's lock_timeout answers first when it can
_PEEK = 0.1  # how long a check waits for a heartbeat's answer before it looks again
_LOCK_SQL = {
    (False, False): "pg_advisory_lock",
    (True, False): "pg_advisory_lock_shared",
    (False, True): "pg_try_advisory_lock",
    (True, True): "pg_try_advisory_lock_shared",
}


class PostgresLock:
    """``Backend.lock(name)`` for a PostgreSQL domain; see ``base.Lock``."""

    def __init__(self, url: str, name: bytes, env: Mapping[str, str], drop: DropBound) -> None:
        self.url, self.name, self.env, self.drop = url, name, env, drop
        self.label = name.decode("utf-8", "surrogateescape")
        self.key = name_key(name)
        self.lock_file = describe_key(self.key)
        self.session: Session | None = None
        self.held_key: int | None = None
        self.shared = False
        self.slot: int | None = None
        self.slots: int | None = None
        self._comment = ""
        self._next_beat = 0.0
        self._beat_sent: float | None = None
        self._confirmed: float | None = None  # the last heartbeat answered "held" was sent
        self._warned = self._hold = False
        self.inside_of: int | None = None  # the hold's server pid, for a run inside it
        self._wait_since, self._command = 0.0, ""
        self._budget = 512
        self.stop_grace = 7.0  # stopping the command (set by the lifecycle); see DropBound
        self._host = os.uname().nodename

    # -- nesting ------------------------------------------------------------------------------
    def enclosing(self, env: Mapping[str, str], slots: int | None = None) -> tuple[int, str] | None:
        if slots is not None:
            return None  # a name's slots are locks apart from its plain one (not nested)
        return enclosing_entry(env, domain(self.url, env), self.key)

    def held_by_our_hold(
        self,
        env: Mapping[str, str],
        token: str | None,
        slots: int | None = None,
        wait: float | None = None,
        reporter: Reporter | None = None,
    ) -> int | None:
        """The pid of a ``hold`` of this very job (or token) that has this lock, the run now
        inside it (``inside.enter``); looked at within the wait (plus grace) or read bound."""
        if slots is not None:
            return None  # a hold of the plain lock is not one of the slots
        read = observe.READ_SECONDS
        bound = read if wait is None else min(max(wait, 0.0) + _GRACE, read)
        return enter(self, env, token, time.monotonic() + bound, wait, reporter)

    def child_env(self, env: Mapping[str, str], held: bool) -> dict[str, str]:
        out = dict(env)
        out[nesting.ENV_REMOTE] = without_password(self.url)
        here = domain(self.url, env)
        secret = password_of(self.url)
        if secret:
            out[ENV_PASSWORD], out[ENV_PASSWORD_FOR] = secret, domain(self.url, env, user=True)
        inside = self.inside_of is not None  # nested calls run inside the hold too
        if held and (self.held_key == self.key or inside):
            shared = self.shared and not inside
            out.update(held_entry(out, os.getpid(), here, self.key, shared))
        return out

    # -- taking -------------------------------------------------------------------------------

    def _connect(self, deadline: float | None = None) -> Session:
        app = record.application_name(os.getpid(), self._host)
        return Session(self.url, self.env, app_name=app, drop=self.drop, deadline=deadline)

    def _statement(self, call: str, key: int, slot: int | None, shared: bool) -> str:
        """A lock call carrying the waiter's record (``status`` lists waiters from it)."""
        return f"{self._record(slot, shared)} SELECT {call}({key})"

    def _record(self, slot: int | None, shared: bool) -> str:
        rec = {
            "name": self.name,
            "pid": os.getpid(),
            "host": self._host,
            "mode": "shared" if shared else "exclusive",
            "slot": slot,
            "slots": self.slots,
            "wait_since": self._wait_since,
            "command": self._command,
        }
        return record.comment(rec, self._budget)

    def acquire(self, take: Take) -> float:
        """Wait in the server's queue; with a ceiling (``--wait``), give up by then even if
        the server stops answering: 69 if it could not be reached, else 75."""
        shared, slots, wait = take.shared, take.slots, take.wait
        reporter, progress = take.reporter, take.progress
        start = time.monotonic()
        self._wait_since, self._command = time.time(), record.waiter_command(self.url)
        limit = None if wait is None else start + max(wait, 0.0) + _GRACE
        with Interruptible() as stop:
            session = self._connect(limit)
            self._budget = max(session.query_budget - 200, 256)
            try:
                self.slots = slots
                if slots is not None:
                    take_slot(self, session, slots, wait, reporter, start, stop, limit)
                else:
                    queued = self._take(
                        session, self.key, shared, wait, reporter, start, stop, limit, progress
                    )
                    with stop.query():  # the runs inside a hold killed outright end first
                        late = clear(self, session, shared, (wait, start, limit), reporter)
                    since = time.monotonic() - start if queued or late else None
                    bookend(reporter, self.label, since)
            except BaseException as exc:
                if stop.interrupted_during_query:
                    session.cancel()
                session.close()  # nothing half-taken: the session's end frees anything
                if isinstance(exc, Unavailable):  # say which lock (a restart ended the wait)
                    waited = time.monotonic() - start
                    text = f"lock {self.label} not acquired after waiting {waited:.1f}s: {exc}"
                    if session.stuck and limit is not None:
                        raise NotAcquired(text, None, waited) from None
                    raise Unavailable(text) from None
                raise (refused_by_server(exc, self.label, session.address) or exc) from None
        self.session, self.shared = session, shared
        return time.monotonic() - start

    def _take(
        self,
        session: Session,
        key: int,
        shared: bool,
        wait: float | None,
        reporter: Reporter | None,
        start: float,
        stop: Interruptible,
        limit: float | None,
        progress: float | None = None,
        busy: Callable[[], str] | None = None,
    ) -> bool:
        """Take ``key``, queueing in the server: True if it had to wait. ``busy`` (the gate
        of slots) says why instead of the key's holder, who is only the next waiter."""
        sql = self._statement(_LOCK_SQL[(shared, True)], key, None, shared)
        if session.fetch(sql, timeout=left(limit))[0]:
            self.held_key = key
            return False
        holder, ahead = waiting.holder_and_queue(session, key, limit) if busy is None else (None, 0)
        if wait is not None and wait <= 0:
            waited = time.monotonic() - start
            raise NotAcquired(
                refusal(self.label, session.address, holder, busy, None), holder, waited
            )
        if reporter is not None:
            detail = busy() if busy is not None else queue_detail(ahead)
            reporter.waiting(self.label, holder, detail=detail)
        psycopg = __import__("psycopg")
        try:
            if wait is not None:
                # The ceiling is the server's: lock_timeout ends the wait, no polling. Nothing
                # later in this session waits on a lock, so it need not be reset. A server
                # that stops answering is given up on a moment later (``limit``).
                remaining = max(wait - (time.monotonic() - start), 0.001)
                timeout = str(max(int(remaining * 1000), 1))
                session.fetch(
                    "SELECT set_config('lock_timeout', %s, false)", (timeout,), timeout=left(limit)
                )
            with (
                stop.query(),
                queue_progress(self, reporter, progress, start, key, session.backend_pid),
            ):
                sql = self._statement(_LOCK_SQL[(shared, False)], key, None, shared)
                wait_in_queue(session, sql, limit)
        except psycopg.errors.LockNotAvailable:
            waited = time.monotonic() - start
            if busy is None:
                holder = waiting.holder_and_queue(session, key, limit)[0] or holder
            why = refusal(self.label, session.address, holder, busy, waited)
            raise NotAcquired(why, holder, waited) from None
        self.held_key = key
        return True

    # -- holding ------------------------------------------------------------------------------

    def write_record(self, rec: Mapping[str, Any]) -> None:
        session = self._held()
        full = {
            **record.without_secrets_in(rec, self.url),
            "name": self.name,
            "mode": "shared" if self.shared else "exclusive",
            "slot": self.slot,
            "slots": self.slots,
        }
        self._comment = record.comment(full, max(session.query_budget - 200, 256))
        try:
            self._hold = bool(rec.get("hold"))
            if self._hold:  # readable by every role, unlike the query text
                app = record.application_name(os.getpid(), self._host, hold=True)
                session.fetch("SELECT set_config('application_name', %s, false)", (app,))
            self._beat(session)
        except LockLost as exc:
            raise RecordNotWritten(str(exc)) from None

    def session_fd(self) -> int | None:
        # None inside a hold of this job's (``--reentrant``): that session is the hold's.
        return None if self.session is None else self.session.fileno()

    def keep_fds(self) -> tuple[int, ...]:
        return () if self.session is None else (self.session.fileno(),)

    def check_interval(self) -> float | None:
        return 0.5

    def check(self) -> str | None:
        """Never blocks for long: a heartbeat is sent, and its answer collected by this
        check or a later one; unanswered within the deadline, the lock counts as lost."""
        session = self._held()
        now = time.monotonic()
        if self._beat_sent is None and (session.readable() or now >= self._next_beat):
            try:
                session.send(self._beat_sql())
            except Exception as exc:
                raise self._lost(session, exc) from None
            self._beat_sent = now
        if self._beat_sent is not None:
            try:
                rows = session.poll(_PEEK)
            except Exception as exc:
                raise self._lost(session, exc) from None
            if rows is not None:
                sent, self._beat_sent = self._beat_sent, None
                self._judge(session, rows[0], sent)
            elif time.monotonic() - self._beat_sent >= self.drop.heartbeat_deadline:
                session.stuck = True
                raise LockLost(
                    f"lost lock {self.label}: {session.address} did not answer a heartbeat "
                    f"within {self.drop.heartbeat_deadline:g}s"
                )
        if self._warned:
            return None
        self._warned = True
        return self._warning(session)

    def _warning(self, session: Session) -> str | None:
        """Said once: what could let a lost session go unnoticed for too long."""
        if session.pooled:
            return (
                f"{session.address} answers through a connection pooler; session locks need "
                "session pooling (transaction pooling shows up as a lost lock)"
            )
        drop = self.drop
        if drop.heartbeat + drop.heartbeat_deadline + self.stop_grace > drop.seconds:
            return (
                f"{ENV_DROP}={drop.seconds:g} leaves less than the {self.stop_grace:g}s it may "
                "take to stop the command after a lost session: another holder could start "
                "before it is gone"
            )
        return None

    def _beat_sql(self) -> str:
        """Re-send the record and ask whether this session still holds the key -- and, for
        a run inside a hold, whether the hold's session still has the lock."""
        held = (
            "EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
            " AND granted AND pid = {} AND (classid::bigint << 32) | objid::bigint = {})"
        )
        sql = f"{self._comment} SELECT pg_backend_pid(), "
        sql += held.format("pg_backend_pid()", self.held_key)
        if self.inside_of is not None:
            sql += ", " + held.format(self.inside_of, self.key)
        return sql

    def _beat(self, session: Session) -> None:
        """One heartbeat, waiting for its answer (at most the deadline)."""
        sent = time.monotonic()
        try:
            row = session.fetch(self._beat_sql(), timeout=self.drop.heartbeat_deadline)
        except Exception as exc:
            raise self._lost(session, exc) from None
        self._judge(session, row, sent)

    def _lost(self, session: Session, exc: Exception) -> LockLost:
        if isinstance(exc, Unavailable):
            return LockLost(
                f"lost lock {self.label}: the PostgreSQL session ended or stopped answering ({exc})"
            )
        return LockLost(
            f"lost lock {self.label}: heartbeat failed on {session.address}: "
            f"{driver_message(str(exc))}"
        )

    def _judge(self, session: Session, row: tuple[Any, ...], sent: float) -> None:
        if not row[1]:
            why = (
                " (a pooler in transaction mode? session locks need session pooling)"
                if session.pooled or row[0] != session.backend_pid
                else ""
            )
            raise LockLost(f"lost lock {self.label}: this session no longer holds it{why}")
        if len(row) > 2 and not row[2]:
            raise LockLost(
                f"lost lock {self.label}: the hold it ran inside ended (its holder died, or "
                "the server ended its session)"
            )
        self._next_beat, self._confirmed = time.monotonic() + self.drop.heartbeat, sent

    def stop_deadline(self) -> float | None:
        """For the supervisor, which stops the command by then unless a newer one comes: a
        frozen keeper confirms nothing, and the session may be gone without a hangup."""
        confirmed = self._confirmed if self.session and self.session.over_tcp else None
        return None if confirmed is None else self.drop.stop_by(confirmed, self.stop_grace)

    # -- letting go ---------------------------------------------------------------------------

    def release(self) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        key, self.held_key = self.held_key, None
        unlock = "pg_advisory_unlock_shared" if self.shared else "pg_advisory_unlock"
        self._beat_sent = None
        if session.stuck:  # a heartbeat went unanswered (reported as a lost lock)
            session.close()
            return
        try:  # bounded: closing a stuck session makes the server end it once it runs again
            if self._hold and key == self.key:  # the runs inside the hold end first
                settle(session, self.name, self._comment, stoppable=False)
            session.fetch(f"SELECT {unlock}({key})", timeout=self.drop.heartbeat_deadline)
        except Exception as exc:
            raise Unavailable(
                f"could not tell {session.address} to release {self.label}: "
                f"{driver_message(str(exc))}; it is freed when the session ends"
            ) from None
        finally:
            session.close()

    def abandon(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.abandon()

    leave = abandon  # the command's copy of the socket keeps the session, and the lock

    def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close()

    def _held(self) -> Session:
        if self.session is None:
            raise LockLost(f"lock {self.label} is not held")
        return self.session
