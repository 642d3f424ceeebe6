"""The address of a PostgreSQL lock domain: its URL, the secrets in it, the driver, and how
fast the server drops a vanished holder.

Nothing here imports psycopg at module level: ``load_driver`` does, once a postgres address
was actually given, and turns a missing driver into a clear ``BadAddress``.
"""

from __future__ import annotations

import re

from ...errors import BadAddress
from ...supervise.hooks import SUPERVISOR_LATE
from ..secrets import has_password, mask, query_secrets

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import ModuleType

SCHEMES = ("postgresql://", "postgres://")
ENV_DROP = "LOCAL_MUTEX_PG_DROP_SECONDS"
# A nested call gets the URL without its password; the password (when one was in the URL)
# travels in this variable, which only this backend reads -- never PGPASSWORD, which the
# command's own clients would send to whatever server they talk to.
ENV_PASSWORD = "LOCAL_MUTEX_PG_PASSWORD"
# ... for the lock domain named here (``domain``): the same URL with other PG* variables
# reaches another server, which must not get it.
ENV_PASSWORD_FOR = "LOCAL_MUTEX_PG_PASSWORD_FOR"
DEFAULT_DROP = 30.0
MIN_DROP = 6.0
MIN_SERVER = 140000  # pg_locks.waitstart, idle_session_timeout, client_connection_check_interval
EXTRA_HINT = (
    "the postgres backend needs psycopg 3: install the extra, "
    "pip install '.[postgres]' in a checkout, or "
    "pip install 'local-mutex[postgres] @ git+https://github.com/local-mutex/local-mutex' "
    "(the index's package named local-mutex is an unrelated project)"
)

# userinfo "user:password@" in the authority (password=... in the query: query_secrets).
_USERINFO = re.compile(r"^(?P<scheme>[a-z]+://)(?P<user>[^:@/?#]*):(?P<pw>[^@/?#]*)@")


def is_postgres(address: str) -> bool:
    return address.startswith(SCHEMES)


def without_password(url: str) -> str:
    """The URL with any password removed: what a nested call is given."""
    url = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}@", url, count=1)
    for m in reversed(query_secrets(url, ("password",))):  # libpq decodes keys: pass%77ord
        url = url[: m.start()] + url[m.end() :]
    if "?" not in url and "&" in url:  # the password was the first parameter
        url = url.replace("&", "?", 1)
    return url


def password_of(url: str) -> str | None:
    """The password libpq would use (a query's ``password=`` overrides the userinfo's)."""
    from urllib.parse import unquote

    query = query_secrets(url, ("password",))
    userinfo = _USERINFO.match(url)
    found = [m["value"] for m in query[-1:]] + ([userinfo["pw"]] if userinfo else [])
    secrets = [unquote(pw) for pw in found if pw]
    return secrets[0] if secrets else None


def password_warning(url: str) -> str | None:
    """The warning the CLI prints when the URL carries a password (library code never
    prints); None when it carries none."""
    if not has_password(url):
        return None
    return (
        "the --remote URL holds a password, which anyone who can list processes on this "
        "machine can read; prefer PGPASSWORD, a ~/.pgpass file or PGSERVICE "
        f"(the URL is shown as {mask(url)})"
    )


# libpq environment variables and the connection parameter each stands for. They are read
# from the mapping we are given (not only from os.environ), and only where the URL itself
# does not set that parameter -- the URL wins, as in libpq.
ENV_PARAMS = (
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
# Of those, the ones libpq takes the server and database from when the URL leaves them
# open: a command that changes one reaches another lock domain with the same URL (another
# database's lock, not its own run's). The user is no part of it (advisory locks are the
# database's), but of where a forwarded password may go.
_DOMAIN_KEYS = ("host", "hostaddr", "port", "dbname", "service")
_SERVICE_FILES = ("PGSERVICEFILE", "PGSYSCONFDIR")  # where a service named is looked up


def domain(url: str, env: Mapping[str, str], *, user: bool = False) -> str:
    """The lock domain's identity for reentrancy (``user``: for a forwarded password): the
    URL without password, one scheme, and the PG* variables that fill in what it leaves
    open."""
    bare = without_password(url)
    for scheme in SCHEMES:
        if bare.startswith(scheme):
            bare = "postgresql://" + bare[len(scheme) :]
            break
    try:
        from psycopg.conninfo import conninfo_to_dict

        given = set(conninfo_to_dict(url))
    except Exception:  # a URL libpq cannot read (it fails to connect too): all of them
        given = set()
    keys = (*_DOMAIN_KEYS, "user") if user else _DOMAIN_KEYS
    filled = [
        f"{var}={env[var]}"
        for var, key in ENV_PARAMS
        if key in keys and env.get(var) and key not in given
    ]
    if "service" in given or env.get("PGSERVICE"):
        filled += [f"{var}={env[var]}" for var in _SERVICE_FILES if env.get(var)]
    return " ".join([bare, *filled])


def load_driver() -> ModuleType:
    from ..._site import ensure

    ensure()  # a nested call starts with -I -S: installed distributions need site
    try:
        import psycopg
    except ImportError:
        raise BadAddress(EXTRA_HINT) from None
    return psycopg


class DropBound:
    """How long a vanished holder's session can outlive it on the server, and the timings
    derived from it (all over TCP only: on a Unix socket the kernel sees both ends).

    The server drops an idle session whose peer stopped answering after
    ``keepalives_idle + keepalives_interval * keepalives_count`` seconds, and one whose
    unacknowledged data waits longer than ``tcp_user_timeout``; a waiter's blocked query
    notices a closed or dead peer every ``client_connection_check_interval`` (1 s). The
    holder heartbeats well inside that bound, so it stops its command before the server can
    hand the lock on.
    """

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DropBound:
        raw = env.get(ENV_DROP, "").strip()
        if not raw:
            return cls(DEFAULT_DROP)
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value >= MIN_DROP or value > 86400:
            raise BadAddress(f"{ENV_DROP}={raw!r}: need seconds from {MIN_DROP:g} to 86400")
        return cls(value)

    @property
    def keepalives(self) -> tuple[int, int, int]:
        """(idle, interval, count) in whole seconds, summing to about ``seconds``."""
        idle = max(int(self.seconds / 3), 1)
        count = 4
        interval = max(int((self.seconds - idle) / count), 1)
        return idle, interval, count

    @property
    def heartbeat(self) -> float:
        """Seconds between heartbeats of a holder."""
        return max(min(5.0, self.seconds / 6), 0.5)

    @property
    def heartbeat_deadline(self) -> float:
        """A heartbeat unanswered for this long means the lock may be gone: stop the command
        with time left for TERM -> KILL before the server drops the session."""
        return max(self.seconds / 4, 1.0)

    def stop_by(self, confirmed: float, stop_grace: float) -> float:
        """By when (monotonic) the command must be stopping if nothing confirms the session
        after ``confirmed`` (when the last heartbeat answered "held" was sent): the server
        cannot drop it sooner than its keepalives allow after hearing from us, and stopping
        takes ``stop_grace``; the supervisor acts ``SUPERVISOR_LATE`` after this.

        Never sooner than a keeper that runs confirms the next one: that heartbeat goes out
        a heartbeat after the answer (which may take its deadline), and its own answer may
        take the deadline again; checks come every half second. A slow server must not
        have the supervisor stop what the keeper keeps; a bound too small for the stop is
        warned about instead (``PostgresLock._warning``)."""
        idle, interval, count = self.keepalives
        server = min(idle + interval * count, self.seconds)
        keeper = self.heartbeat + 2 * self.heartbeat_deadline + 2.0
        return confirmed + max(server - stop_grace - SUPERVISOR_LATE, keeper)

    def server_settings(self) -> dict[str, str]:
        idle, interval, count = self.keepalives
        return {
            "tcp_keepalives_idle": str(idle),
            "tcp_keepalives_interval": str(interval),
            "tcp_keepalives_count": str(count),
            "tcp_user_timeout": str(int(self.seconds * 1000)),
            # A waiter killed in the queue (its socket closed) is noticed within a second,
            # whatever the bound: the lock it would be granted next is not held up for it.
            "client_connection_check_interval": "1000",
        }

    def client_params(self) -> dict[str, str]:
        """Our side: a heartbeat on a dead network fails within its deadline, not later."""
        deadline = self.heartbeat_deadline
        return {
            "keepalives": "1",
            "keepalives_idle": str(max(int(deadline / 3), 1)),
            "keepalives_interval": str(max(int(deadline / 6), 1)),
            "keepalives_count": "3",
            "tcp_user_timeout": str(int(deadline * 1000)),
        }
