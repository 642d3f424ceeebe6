"""Opening a connection: its parameters (the URL's, libpq's environment variables, our
keepalives), a deadline for the whole of it, and what a failure means (a wrong address, or
a server out of reach for now).

libpq bounds connecting by ``connect_timeout``: per host, and never under 2 s. A caller
with a ceiling of its own (``--no-wait``, ``--wait``) needs the whole connection -- every
host, TLS, authentication -- done by then, so it drives libpq's non-blocking connect and
polls its socket itself.
"""

from __future__ import annotations

import select
import time

from ...errors import BadAddress, Unavailable
from ..secrets import hide_secrets, mask
from .address import (
    ENV_PARAMS,
    ENV_PASSWORD,
    ENV_PASSWORD_FOR,
    DropBound,
    domain,
    load_driver,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from psycopg import Connection

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
    ' value: "',  # libpq's "invalid sslmode value: "x"" (target_session_attrs, gssencmode, ...)
    'missing "="',
    "end of string reached",
    "unexpected spaces",
    "bad value for",  # psycopg's own check of connect_timeout
    'definition of service "',  # PGSERVICE names none
    'service file "',  # PGSERVICEFILE names none
    "but ssl was required",  # sslmode the server cannot meet: trying again will not help
)
LIBPQ_FLOOR = 2.0  # libpq reads a connect_timeout under 2 s as 2 s


# What libpq adds to any connection the server closed, after the server's own reason when
# it gave one ("terminating connection due to administrator command"): a guess that
# misleads once that reason is there.
_CLOSED = (
    "server closed the connection unexpectedly This probably means the server terminated "
    "abnormally before or while processing the request."
)


def driver_message(text: str) -> str:
    flat = " ".join(str(text).split())
    for noise in ("connection failed: ", "consuming input failed: "):
        flat = flat.replace(noise, "")
    reason = flat.replace(_CLOSED, "").strip()
    return reason if reason else flat


def connect_params(url: str, env: Mapping[str, str], drop: DropBound) -> dict[str, Any]:
    from psycopg.conninfo import conninfo_to_dict

    try:
        given = conninfo_to_dict(url)
    except Exception as exc:  # psycopg.ProgrammingError: a malformed URL
        why = hide_secrets(driver_message(str(exc)), url)
        # libpq quotes the bad part, which may be the password, now masked: say where it is.
        why = why.replace(': "***"', " in the password (not shown)")
        raise BadAddress(f"bad PostgreSQL URL {mask(url)}: {why}") from None
    params: dict[str, Any] = {}
    for var, param in ENV_PARAMS:
        if param not in given and env.get(var):
            params[param] = env[var]
    _check_numbers({**given, **params}, url)
    if "password" not in given and "password" not in params and _forwarded_to(url, env):
        params["password"] = env[ENV_PASSWORD]
    if "connect_timeout" not in given and "connect_timeout" not in params:
        params["connect_timeout"] = "10"
    for key, value in drop.client_params().items():
        params.setdefault(key, value)
    return params


def _check_numbers(params: Mapping[str, Any], url: str) -> None:
    """A port or connect_timeout that is no number: libpq says so only as it connects (an
    unreachable server, exit 69), or ignores it; it is a bad address (exit 2)."""
    bad = None
    for part in str(params.get("port") or "").split(","):  # one per host, empty: the default
        port = part.strip()
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            bad = f"port {port!r} is not a port number (1 to 65535)"
    timeout = str(params.get("connect_timeout") or "").strip()
    if timeout and not (timeout.isascii() and timeout.lstrip("-").isdigit()):
        bad = f"connect_timeout {timeout!r} is not a whole number of seconds"
    if bad is not None:
        raise BadAddress(f"bad PostgreSQL address {mask(url)}: {bad}")


def _forwarded_to(url: str, env: Mapping[str, str]) -> bool:
    """Is there a password an enclosing run forwarded for this very lock domain? Only a
    URL that reaches its own server, database and user gets it, never another server a
    nested call names -- by its URL or by PG* variables the command set."""
    domain_for = env.get(ENV_PASSWORD_FOR, "")
    here = domain(url, env, user=True)
    return bool(env.get(ENV_PASSWORD)) and bool(domain_for) and domain_for == here


def connect_seconds(url: str, params: Mapping[str, Any]) -> float:
    """The connect_timeout in force (0: none), as libpq reads it (2 s at least)."""
    from psycopg.conninfo import conninfo_to_dict

    raw = params.get("connect_timeout", conninfo_to_dict(url).get("connect_timeout", 0))
    try:
        seconds = float(raw)
    except ValueError:
        return 0.0
    return max(seconds, LIBPQ_FLOOR) if seconds > 0 else 0.0


def open_connection(
    url: str, params: Mapping[str, Any], app_name: str, deadline: float | None
) -> Connection[tuple[Any, ...]]:
    """An autocommit connection; psycopg errors as they come. Without ``deadline``
    (monotonic) psycopg connects as libpq would: each host in turn, within
    ``connect_timeout`` each. With one, the same attempts (psycopg's split of the hosts
    and their addresses), each within ``connect_timeout`` too, all of them by then."""
    psycopg = load_driver()
    conn: Connection[tuple[Any, ...]]
    if deadline is None:
        conn = psycopg.connect(url, autocommit=True, application_name=app_name, **params)
        return conn
    from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo

    each = connect_seconds(url, params)
    failures: list[str] = []
    for attempt in conninfo_attempts(conninfo_to_dict(url, application_name=app_name, **params)):
        now = time.monotonic()
        if failures and now >= deadline:
            break
        by = min(deadline, now + each) if each else deadline
        try:
            pgconn = _connect(make_conninfo("", **attempt), by)
        except psycopg.OperationalError as exc:
            failures.append(str(exc))
            continue
        try:
            conn = psycopg.Connection(pgconn)
            conn.autocommit = True  # idle after connecting: no round trip
        except BaseException:
            pgconn.finish()
            raise
        return conn
    raise psycopg.OperationalError("; ".join(dict.fromkeys(failures)))


def _connect(conninfo: str, deadline: float) -> Any:
    """libpq's non-blocking connect (PQconnectPoll), driven as psycopg's generator drives
    it but polled here until ``deadline``: the PGconn, or ``OperationalError``."""
    psycopg = load_driver()
    pq = psycopg.pq
    pgconn = pq.PGconn.connect_start(conninfo.encode())
    try:
        while pgconn.status != pq.ConnStatus.BAD:
            status = pgconn.connect_poll()
            if status == pq.PollingStatus.OK:
                pgconn.nonblocking = 1
                return pgconn
            if status == pq.PollingStatus.FAILED:
                break
            event = select.POLLIN if status == pq.PollingStatus.READING else select.POLLOUT
            if not ready(pgconn.socket, event, deadline):
                raise psycopg.OperationalError("connection timeout expired")
        why = bytes(pgconn.error_message).decode("utf-8", "replace").strip()
        raise psycopg.OperationalError(why or "connection failed")
    except BaseException:  # a stop signal (Interrupted) too: nothing half-open left behind
        pgconn.finish()
        raise


def ready(fd: int, event: int, deadline: float | None) -> bool:
    """Wait until ``fd`` is ready for ``event`` (or failed); False at the deadline."""
    poller = select.poll()
    poller.register(fd, event | select.POLLERR | select.POLLHUP)
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        if poller.poll(None if left is None else max(int(left * 1000), 1)):
            return True


def connect_error(address: str, exc: BaseException, url: str) -> Exception:
    text = hide_secrets(driver_message(str(exc)), url)
    lowered = text.lower()
    if any(marker in lowered for marker in _BAD_ADDRESS):
        return BadAddress(f"cannot use {address}: {text}")
    return Unavailable(f"cannot reach {address}: {text}")


def refused_by_server(exc: BaseException, label: str, address: str) -> Exception | None:
    """An error the server answered the take with (an administrator cancelling the wait,
    a role denied the advisory lock functions): one line and an exit status of the table,
    not a traceback. Nothing was taken: the session is closed."""
    psycopg = load_driver()  # loaded already: a session was open
    if not isinstance(exc, psycopg.Error):
        return None
    why = driver_message(str(exc))
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return BadAddress(f"cannot take lock {label} on {address}: {why}")
    return Unavailable(f"lock {label} not acquired: {address} ended the request: {why}")
