"""One connection to the server: opened with settings a server default cannot undo, checked
for what a lock needs (a primary, version 14+), watched while it holds a lock.

A lock *is* this session: it ends when the server sees the socket close. The descriptor is
therefore shared with the supervisor's keeper and the command (``Lock.keep_fds``); only the
process that opened the connection ever talks on it. psycopg skips ``PQfinish`` when a
forked copy of the connection is collected (it checks the pid), and ``abandon`` replaces
our descriptor with /dev/null before letting go, so a process that must not talk never
sends a Terminate message that would end the session for everyone.
"""

from __future__ import annotations

import os
import select
import socket
import time
from contextlib import contextmanager

from ..._proc import decimal
from ...errors import BadAddress, Unavailable
from ..secrets import mask
from .address import MIN_SERVER, DropBound, load_driver
from .connect import (
    connect_error,
    connect_params,
    connect_seconds,
    driver_message,
    open_connection,
    ready,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any, NoReturn

    from psycopg import Connection

# How a statement's text-format values are read, by type oid (bool, ints, floats); the
# rest is text.
_CASTS: dict[int, Callable[[bytes], Any]] = {
    16: lambda v: v == b"t",
    20: int,
    21: int,
    23: int,
    26: int,
    700: float,
    701: float,
}


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


class Session:
    """An autocommit connection ready to hold advisory locks."""

    def __init__(
        self,
        url: str,
        env: Mapping[str, str],
        *,
        app_name: str,
        drop: DropBound,
        deadline: float | None = None,
    ) -> None:
        """``deadline`` (monotonic): connected and set up by then, or ``Unavailable``; else
        within the connect_timeout (10 s unless the URL or PGCONNECT_TIMEOUT says)."""
        self.url, self.drop = url, drop
        self.address = mask(url)
        self.stuck = False  # a statement went unanswered: only closing is left
        self._sent: float | None = None
        psycopg = load_driver()
        params = connect_params(url, env, drop)
        connect_by = deadline  # a ceiling bounds connecting as a whole, every host
        if deadline is None:  # no ceiling: setting up is bounded as connecting is
            seconds = connect_seconds(url, params)
            deadline = time.monotonic() + seconds if seconds else None
        try:
            self.conn: Connection[tuple[Any, ...]] = open_connection(
                url, params, app_name, connect_by
            )
        except psycopg.Error as exc:
            raise connect_error(self.address, exc, url) from None
        try:
            self._prepare(None if deadline is None else max(deadline - time.monotonic(), 1.0))
        except BaseException:
            self.close()
            raise
        self.last_ok = time.monotonic()

    def _prepare(self, timeout: float | None) -> None:
        info = self.conn.info
        refuse_server(self.address, info.server_version, False)
        settings = {
            "idle_session_timeout": "0",
            "idle_in_transaction_session_timeout": "0",
            "statement_timeout": "0",
            "lock_timeout": "0",
            **self.drop.server_settings(),
        }
        if info.server_version >= 170000:  # a server or role default would end a wait
            settings["transaction_timeout"] = "0"
        calls = ", ".join(f"set_config('{k}', '{v}', false)" for k, v in settings.items())
        row = self.fetch(
            "SELECT pg_is_in_recovery(), pg_backend_pid(), "
            f"current_setting('track_activity_query_size'), {_READS_LOCKS}, current_user, "
            f"{calls}",
            timeout=timeout,
        )
        refuse_server(self.address, info.server_version, bool(row[0]))
        if not row[3]:  # every heartbeat asks it: the first would lose the lock
            raise BadAddress(
                f"{self.address}: role {row[4]} may not read pg_locks, which tells whether a "
                "session still holds its lock; GRANT SELECT ON pg_catalog.pg_locks and "
                "EXECUTE ON FUNCTION pg_catalog.pg_lock_status() to it, in that database"
            )
        self.backend_pid = int(row[1])
        self.query_budget = _bytes(str(row[2]))
        # A pooler answers the startup with its own key data: the pid it names is not the
        # server process we talk to. Session pooling works; transaction pooling hands our
        # statements to other sessions, which the heartbeat's pg_locks check catches.
        self.pooled = info.backend_pid != self.backend_pid
        # Over a Unix socket no partition can part us: the kernel sees both ends. (Asked of
        # the socket: `host=/dir&hostaddr=IP` names a directory yet connects over TCP.)
        with socket.socket(fileno=os.dup(self.fileno())) as sock:
            self.over_tcp = sock.family != socket.AF_UNIX

    # -- talking ------------------------------------------------------------------------------

    def fetch(
        self, sql: str, params: tuple[Any, ...] | None = None, *, timeout: float | None = None
    ) -> tuple[Any, ...]:
        """One row of one statement; a broken session raises ``Unavailable``, and so does
        no answer within ``timeout`` seconds (the session is then ``stuck``)."""
        rows = self.rows(sql, params, timeout=timeout)
        if not rows:
            raise Unavailable(f"{self.address}: no answer row")
        return rows[0]

    def rows(
        self, sql: str, params: Any = None, *, timeout: float | None = None
    ) -> list[tuple[Any, ...]]:
        """Every row of one statement, typed as psycopg would for the types we read."""
        if self.stuck:
            raise Unavailable(f"{self.address}: an earlier statement was never answered")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._sent is not None and self._answer(deadline) is None:
            self._give_up(timeout)
        if params is not None:
            sql = load_driver().ClientCursor(self.conn).mogrify(sql, params)
        self.send(sql)
        rows = self._answer(deadline)
        if rows is None:
            self._give_up(timeout)
        return rows

    def send(self, sql: str) -> None:
        """Send one statement without waiting for its answer (``poll`` collects it)."""
        if self.stuck:
            raise Unavailable(f"{self.address}: an earlier statement was never answered")
        with self._errors():
            pg = self.conn.pgconn
            pg.send_query(sql.encode())
            self._sent = time.monotonic()
            pg.flush()  # non-blocking: what the socket did not take goes while we wait

    def poll(self, timeout: float) -> list[tuple[Any, ...]] | None:
        """The answer to what ``send`` sent, waiting at most ``timeout``; None if not yet."""
        return self._answer(time.monotonic() + timeout)

    @property
    def pending(self) -> float | None:
        """When the statement still unanswered was sent."""
        return self._sent

    def _give_up(self, timeout: float | None) -> NoReturn:
        self.stuck = True
        raise Unavailable(f"{self.address} did not answer within {timeout:.1f}s")

    def _answer(self, deadline: float | None) -> list[tuple[Any, ...]] | None:
        psycopg = load_driver()
        pg = self.conn.pgconn
        results = []
        with self._errors():
            while True:
                while pg.is_busy():
                    more = select.POLLOUT if pg.flush() else 0
                    if not self._ready(select.POLLIN | more, deadline):
                        return None
                    pg.consume_input()
                res = pg.get_result()
                if res is None:
                    break
                results.append(res)
        self._sent = None
        self.last_ok = time.monotonic()
        rows: list[tuple[Any, ...]] = []
        for res in results:
            if res.status == psycopg.pq.ExecStatus.TUPLES_OK:
                kinds = [_CASTS.get(res.ftype(i), _text) for i in range(res.nfields)]
                for r in range(res.ntuples):
                    values = [res.get_value(r, i) for i in range(res.nfields)]
                    rows.append(tuple(None if v is None else k(v) for k, v in zip(kinds, values)))
            elif res.status != psycopg.pq.ExecStatus.COMMAND_OK:
                raise psycopg.errors.error_from_result(res, encoding="utf-8")
        return rows

    def _ready(self, event: int, deadline: float | None) -> bool:
        return ready(self.fileno(), event, deadline)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        psycopg = load_driver()
        try:
            yield
        except psycopg.OperationalError as exc:
            if self.conn.closed or self.conn.broken:
                self._sent = None
                raise Unavailable(f"{self.address}: {driver_message(str(exc))}") from None
            raise

    # -- watching -----------------------------------------------------------------------------

    def fileno(self) -> int:
        return self.conn.pgconn.socket

    def readable(self) -> bool:
        """Has the server said something (an error, EOF) while we were quiet? Nothing
        else arrives on an idle session we did not ask for, bar a rare ParameterStatus."""
        import select

        try:
            poller = select.poll()
            poller.register(
                self.fileno(), select.POLLIN | select.POLLPRI | getattr(select, "POLLRDHUP", 0)
            )
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def cancel(self) -> None:
        """Cancel a statement still running on the server (after an interrupted wait)."""
        try:
            cancel_safe = getattr(self.conn, "cancel_safe", None)
            if cancel_safe is not None:
                cancel_safe(timeout=3.0)
            else:
                self.conn.cancel()
        except Exception:
            pass

    # -- letting go ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close for real: the server ends the session (and frees whatever it held). A
        stuck session is shut down first: its end reaches the server (when it answers
        again) even through copies of the descriptor that leftover processes keep."""
        if self.stuck:
            self.hang_up()
        try:
            self.conn.close()
        except Exception:
            pass

    def hang_up(self) -> None:
        import socket

        try:
            with socket.socket(fileno=os.dup(self.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass

    def abandon(self) -> None:
        """Let go of our descriptor without a word on the wire: after a fork, or when the
        state of the connection is not ours to trust. Other processes sharing the socket
        keep the session; when the last one closes it, the server ends the session."""
        fd = -1
        try:
            fd = self.conn.pgconn.socket
        except Exception:
            pass
        if fd >= 0:
            null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.dup2(null, fd, inheritable=False)  # anything libpq still says goes nowhere
            finally:
                os.close(null)
        try:
            self.conn.pgconn.finish()
        except Exception:
            pass


# May this role read pg_locks? A view whose function the caller must be allowed to run too.
_READS_LOCKS = (
    "has_table_privilege('pg_catalog.pg_locks', 'SELECT') AND "
    "has_function_privilege('pg_catalog.pg_lock_status()', 'EXECUTE')"
)


def refuse_server(address: str, version: int, in_recovery: bool) -> None:
    """BadAddress for a server that cannot hold these locks: older than 14, or a standby."""
    if version < MIN_SERVER:
        raise BadAddress(
            f"{address} runs PostgreSQL {version // 10000}; the postgres backend needs 14 or "
            "newer (for pg_locks.waitstart and idle_session_timeout)"
        )
    if in_recovery:
        raise BadAddress(
            f"{address} is a standby (in recovery): advisory locks there are local to that "
            "standby; give the primary's address"
        )


def _bytes(setting: str) -> int:
    """``track_activity_query_size`` as shown ('1kB', '4096', '1MB') in bytes."""
    units = {"B": 1, "kB": 1024, "MB": 1024 * 1024}
    for unit, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        number = decimal(setting[: -len(unit)].strip()) if setting.endswith(unit) else None
        if number is not None:
            return number * factor
    return decimal(setting) or 1024
