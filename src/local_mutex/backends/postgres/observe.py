"""Who holds and who waits, from ``pg_locks`` joined with ``pg_stat_activity``.

``pg_locks`` is readable by every role; of another role's sessions ``pg_stat_activity`` shows
``application_name`` (pid@host) but not the query text that carries the full record unless
the reader is a member of that role or of ``pg_read_all_stats``. Waiters are in queue order
by ``waitstart`` (PostgreSQL 14+). A bigint advisory key shows as ``classid`` (high 32 bits)
and ``objid`` (low 32 bits) with ``objsubid = 1``.
"""

from __future__ import annotations

import time

from ..base import Holder, LockStatus, Waiter
from . import record
from .keys import describe_key

# An observer's statement (status, list, release, a run's look for its own hold) unanswered
# this long means the server is not answering: give up rather than hang.
READ_SECONDS = 10.0

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .session import Session

_ROWS = """
SELECT (l.classid::bigint << 32) | l.objid::bigint, l.granted, l.mode, l.pid,
       extract(epoch FROM l.waitstart)::float8, a.application_name, a.query,
       a.usename::text, host(a.client_addr), extract(epoch FROM a.query_start)::float8,
       extract(epoch FROM a.state_change)::float8, a.state
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND {where}
ORDER BY l.granted DESC, l.waitstart NULLS LAST, l.pid
"""
_BY_KEYS = "((l.classid::bigint << 32) | l.objid::bigint) = ANY(%s::bigint[])"
# Only sessions that say they are ours, plus whoever waits on the same keys.
_OURS = (
    "((l.classid::bigint << 32) | l.objid::bigint) IN ("
    " SELECT (m.classid::bigint << 32) | m.objid::bigint FROM pg_locks m"
    " JOIN pg_stat_activity b ON b.pid = m.pid"
    " WHERE m.locktype = 'advisory' AND b.application_name LIKE 'local-mutex %%')"
)


class Row:
    """One session's interest in one key."""

    __slots__ = ("app", "granted", "info", "key", "mode", "pid", "since", "waitstart")

    def __init__(self, raw: Sequence[Any]) -> None:
        self.key = int(raw[0])
        self.granted = bool(raw[1])
        self.mode = "shared" if raw[2] == "ShareLock" else "exclusive"
        # The server process; 0 for a prepared transaction's lock, which has none (NULL: a
        # traceback in status, run and list).
        self.pid = int(raw[3]) if raw[3] is not None else 0
        self.waitstart = raw[4] if isinstance(raw[4], float) else None
        app = record.parse_application_name(raw[5] if isinstance(raw[5], str) else None)
        self.app = app
        rec = record.decode(raw[6] if isinstance(raw[6], str) else None) or {}
        info: dict[str, Any] = {**(app or {}), **rec}
        if raw[7]:
            info.setdefault("db_user", raw[7])
        if raw[8] and "host" not in info:
            info["host"] = raw[8]
        info["backend_pid"] = self.pid
        self.info = info
        # When it got the lock: the record says; else the end of its last statement.
        since = rec.get("since_epoch")
        if not isinstance(since, float) and isinstance(raw[10], float) and raw[11] == "idle":
            since = raw[10]
        self.since = since if isinstance(since, float) else None

    @property
    def ours(self) -> bool:
        return self.app is not None


def fetch_rows(
    session: Session, keys: Sequence[int] | None, timeout: float | None = None
) -> list[Row]:
    """Rows for these keys, or (None) for every key a session of ours holds or waits on;
    ``Unavailable`` when the server does not answer within ``timeout``."""
    where = _BY_KEYS if keys is not None else _OURS
    sql = _ROWS.format(where=where)
    params = (list(keys),) if keys is not None else None
    return [Row(r) for r in session.rows(sql, params, timeout=timeout)]


def holder_of(row: Row) -> Holder:
    info, now = row.info, time.time()
    pid = info.get("pid")
    return Holder(
        pid if isinstance(pid, int) else None,
        row.mode,
        _text(info.get("command")),
        cwd=_text(info.get("cwd")),
        host=_text(info.get("host")),
        user=_text(info.get("user")) or _text(info.get("db_user")),
        since=_stamp(row.since),
        since_epoch=row.since,
        held_seconds=None if row.since is None else max(now - row.since, 0.0),
        runner=_text(info.get("runner")),
        job=_text(info.get("job")),
        workflow=_text(info.get("workflow")),
        run_url=_text(info.get("run_url")),
        message=_text(info.get("message")),
        source="record" if "since_epoch" in info else "server",
    )


def first_holder(rows: Sequence[Row], key: int) -> dict[str, Any] | None:
    for row in rows:
        if row.key == key and row.granted:
            return holder_dict(row)
    return None


def holder_dict(row: Row) -> dict[str, Any]:
    """The holder as the waiting line shows it (the shape of the local record)."""
    out = {k: v for k, v in holder_of(row).as_dict().items() if v is not None}
    out["backend_pid"] = row.pid
    if row.info.get("hold"):
        out["hold"] = True
    return out


def status_of(label: str | None, key: int, rows: Sequence[Row]) -> LockStatus:
    mine = [r for r in rows if r.key == key]
    holders = [holder_of(r) for r in mine if r.granted]
    waiting = [r for r in mine if not r.granted]
    waiters = [waiter_of(r, position) for position, r in enumerate(waiting, start=1)]
    if not holders:
        return LockStatus(describe_key(key), label, "free", "server", None, [], waiters)
    mode = "exclusive" if any(h.mode == "exclusive" for h in holders) else "shared"
    return LockStatus(describe_key(key), label, "held", "server", mode, holders, waiters)


def waiter_of(row: Row, position: int) -> Waiter:
    """A session waiting for a key -- or, holding a gate of slots, for a slot (when it
    started waiting its record says)."""
    pid = row.info.get("pid")
    started = row.waitstart
    if started is None and isinstance(row.info.get("wait_since"), float):
        started = row.info["wait_since"]
    return Waiter(
        pid if isinstance(pid, int) else None,
        row.mode,
        position,
        _text(row.info.get("command")),
        _stamp(started),
        started,
        _text(row.info.get("host")),
    )


def name_of(rows: Sequence[Row]) -> bytes | None:
    for r in rows:
        name = r.info.get("name")
        if isinstance(name, bytes) and name:
            return name
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _stamp(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
