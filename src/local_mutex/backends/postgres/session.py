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
import time

from ...errors import BadAddress, Unavailable
from .address import ENV_PASSWORD, MIN_SERVER, DropBound, load_driver, mask, password_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from psycopg import Connection

# libpq environment variables and the connection parameter each stands for. They are read
# from the mapping we are given (not only from os.environ), and only where the URL itself
# does not set that parameter -- the URL wins, as in libpq.
_ENV_PARAMS = (
    ("PGHOST", "host"),
    ("PGHOSTADDR", "hostaddr"),
    ("PGPORT", "port"),
    ("PGDATABASE", "dbname"),
    ("PGUSER", "user"),
    ("PGPASSWORD", "password"),
    ("PGPASSFILE", "passfile"),
    ("PGSERVICE", "service"),
    ("PGSSLMODE", "sslmode"),
    ("PGSSLROOTCERT", "sslrootcert"),
    ("PGSSLCERT", "sslcert"),
    ("PGSSLKEY", "sslkey"),
    ("PGCONNECT_TIMEOUT", "connect_timeout"),
    ("PGTARGETSESSIONATTRS", "target_session_attrs"),
)
# Messages that mean the address (credentials, database, role) is wrong, not that the
# server is out of reach for now.
_BAD_ADDRESS = (
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "not permitted to log in",
    "invalid connection option",
    "invalid uri",
    "invalid integer value",
    "invalid sslmode",
    'missing "="',
    "end of string reached",
    "unexpected spaces",
)


def driver_message(text: str) -> str:
    flat = " ".join(str(text).split())
    for noise in ("connection failed: ",):
        flat = flat.replace(noise, "")
    return flat


def connect_params(url: str, env: Mapping[str, str], drop: DropBound) -> dict[str, Any]:
    from psycopg.conninfo import conninfo_to_dict

    try:
        given = conninfo_to_dict(url)
    except Exception as exc:  # psycopg.ProgrammingError: a malformed URL
        raise BadAddress(f"bad PostgreSQL URL {mask(url)}: {driver_message(str(exc))}") from None
    params: dict[str, Any] = {}
    for var, param in _ENV_PARAMS:
        if param not in given and env.get(var):
            params[param] = env[var]
    if "password" not in given and "password" not in params and env.get(ENV_PASSWORD):
        params["password"] = env[ENV_PASSWORD]
    if "connect_timeout" not in given and "connect_timeout" not in params:
        params["connect_timeout"] = "10"
    for key, value in drop.client_params().items():
        params.setdefault(key, value)
    return params


class Session:
    """An autocommit connection ready to hold advisory locks."""

    def __init__(self, url: str, env: Mapping[str, str], *, app_name: str, drop: DropBound) -> None:
        self.url, self.drop = url, drop
        self.address = mask(url)
        psycopg = load_driver()
        params = connect_params(url, env, drop)
        try:
            self.conn: Connection[tuple[Any, ...]] = psycopg.connect(
                url, autocommit=True, application_name=app_name, **params
            )
        except psycopg.Error as exc:
            raise connect_error(self.address, exc, url) from None
        try:
            self._prepare()
        except BaseException:
            self.conn.close()
            raise
        self.last_ok = time.monotonic()

    def _prepare(self) -> None:
        info = self.conn.info
        refuse_server(self.address, info.server_version, False)
        settings = {
            "idle_session_timeout": "0",
            "idle_in_transaction_session_timeout": "0",
            "statement_timeout": "0",
            "lock_timeout": "0",
            **self.drop.server_settings(),
        }
        calls = ", ".join(f"set_config('{k}', '{v}', false)" for k, v in settings.items())
        row = self.fetch(
            "SELECT pg_is_in_recovery(), pg_backend_pid(), "
            f"current_setting('track_activity_query_size'), {calls}"
        )
        refuse_server(self.address, info.server_version, bool(row[0]))
        self.backend_pid = int(row[1])
        self.query_budget = _bytes(str(row[2]))
        # A pooler answers the startup with its own key data: the pid it names is not the
        # server process we talk to. Session pooling works; transaction pooling hands our
        # statements to other sessions, which the heartbeat's pg_locks check catches.
        self.pooled = info.backend_pid != self.backend_pid

    # -- talking ------------------------------------------------------------------------------

    def fetch(self, sql: str, params: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        """One row of one statement; a broken session raises ``Unavailable``."""
        psycopg = load_driver()
        try:
            cur = self.conn.execute(sql.encode(), params, prepare=False)
            row = cur.fetchone()
        except psycopg.OperationalError as exc:
            if self.conn.closed or self.conn.broken:
                raise Unavailable(f"{self.address}: {driver_message(str(exc))}") from None
            raise
        if row is None:
            raise Unavailable(f"{self.address}: no answer row")
        self.last_ok = time.monotonic()
        return tuple(row)

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
        """Close for real: the server ends the session (and frees whatever it held)."""
        try:
            self.conn.close()
        except Exception:
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
        if setting.endswith(unit) and setting[: -len(unit)].strip().isdigit():
            return int(setting[: -len(unit)]) * factor
    return int(setting) if setting.isdigit() else 1024


def connect_error(address: str, exc: BaseException, url: str) -> Exception:
    text = driver_message(str(exc))
    secret = password_of(url)
    if secret:
        text = text.replace(secret, "***")
    lowered = text.lower()
    if any(marker in lowered for marker in _BAD_ADDRESS):
        return BadAddress(f"cannot use {address}: {text}")
    return Unavailable(f"cannot reach {address}: {text}")
