"""A PostgreSQL database as a lock domain: locks, status, list, and the end of holds.

The domain is one server and one database: advisory locks are per database, and a standby
has its own. A hold is a detached holder process somewhere that keeps its session open
with a record saying ``hold`` (and its token's SHA-256); it lasts as long as that process
and its host (unlike git's persistent holds), and ``release`` ends it with
``pg_terminate_backend``, which needs the right to signal that session: the same role,
membership in it, or ``pg_signal_backend`` (a superuser's session only a superuser ends).
"""

from __future__ import annotations

import time

from ...errors import (
    BadAddress,
    Interrupted,
    NestingError,
    NotOurHold,
    Refused,
    Unavailable,
    Unsupported,
)
from ...identity import ENV_TOKEN, owned
from ...names import validate_name
from ..base import LockStatus, Released
from ..secrets import mask
from . import observe
from .address import DropBound, domain, is_postgres, load_driver, password_warning
from .connect import driver_message
from .inside import settle
from .keys import MAX_SLOTS, describe_key, gate_key, inside_key, name_key, slot_key
from .lock import PostgresLock
from .nesting import enclosing_entry
from .session import Session

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from ...ui.lines import Reporter
    from .. import Ending
    from ..base import HoldInfo

_END_WAIT = 5.0  # how long a terminated hold's session may take to end


class PostgresBackend:
    kind = "postgres"
    persistent_holds = False
    # Options (by their dest) that mean nothing here: refused with exit 2 when given.
    refuses: tuple[str, ...] = ("key_prefix", "lease", "poll", "delete_branch", "allow_other_owner")
    unlisted: Sequence[str] = ()

    def __init__(self, url: str, *, env: Mapping[str, str], reading: bool = False) -> None:
        if not is_postgres(url):
            raise BadAddress(f"{mask(url)} is not a postgresql:// or postgres:// URL")
        load_driver()  # a missing extra is a clear error now, not mid-lock
        self.url, self.env, self.reading = url, env, reading
        self.address = mask(url)
        # For the CLI to print (library code never prints): a password in the URL.
        self.warning = password_warning(url)
        self.drop = DropBound.from_env(env)
        self._observer: Session | None = None

    # -- locks --------------------------------------------------------------------------------

    def lock(self, name: bytes) -> PostgresLock:
        return PostgresLock(self.url, validate_name(name), self.env, self.drop)

    def hold_persistent(
        self,
        name: bytes,
        *,
        wait: float | None,
        ttl: float | None,
        message: str | None,
        reporter: Reporter | None = None,
    ) -> HoldInfo:
        raise Unsupported("holds in PostgreSQL are kept by a holder process, not persisted")

    def history(self, name: bytes) -> list[dict[str, Any]]:
        raise Unsupported("lock history is not kept by this backend (postgres)")

    # -- reading ------------------------------------------------------------------------------

    def _session(self) -> Session:
        if self._observer is None:
            # Connecting too is bounded as a read is, whatever connect_timeout the URL or
            # PGCONNECT_TIMEOUT gives (0: none at all).
            self._observer = Session(
                self.url,
                self.env,
                app_name="local-mutex-observer",
                drop=self.drop,
                deadline=time.monotonic() + observe.READ_SECONDS,
            )
        return self._observer

    def _rows(self, keys: Sequence[int] | None) -> list[observe.Row]:
        psycopg = load_driver()
        session = self._session()
        try:
            return observe.fetch_rows(session, keys, timeout=observe.READ_SECONDS)
        except psycopg.Error as exc:
            raise Unavailable(
                f"cannot read pg_locks on {self.address}: {driver_message(str(exc))}"
            ) from None

    def status(self, name: bytes) -> LockStatus:
        # As every backend: an empty name, or one with a control character (a NUL made
        # ``dep\0slot0`` the key of dep's first slot), is refused.
        name = validate_name(name)
        slot_keys = [slot_key(name, i) for i in range(MAX_SLOTS)]
        rows = self._rows([name_key(name), gate_key(name), inside_key(name), *slot_keys])
        return _status(name, rows)

    def list_locks(self, *, include_free: bool) -> list[LockStatus]:
        """Locks that sessions of this tool hold or wait for. A free lock leaves no trace
        on the server, so ``include_free`` adds nothing here."""
        rows = self._rows(None)
        # A key's name, from any of its rows that names it: a holder whose record we may
        # not read (another role, a plain client) is the named waiter's lock's holder --
        # it showed as "(unnamed): held", and the name as free with a waiter.
        named_keys: dict[int, bytes] = {}
        for row in rows:
            name = row.info.get("name")
            if isinstance(name, bytes) and name and _belongs(name, row):
                named_keys.setdefault(row.key, name)
        by_name: dict[bytes, list[observe.Row]] = {}
        nameless: dict[int, list[observe.Row]] = {}
        for row in rows:
            if row.key in named_keys:
                by_name.setdefault(named_keys[row.key], []).append(row)
            else:
                nameless.setdefault(row.key, []).append(row)
        out = [_status(name, by_name[name]) for name in sorted(by_name)]
        # The runs inside a hold hold a key that is no lock of its own (``inside``).
        insides = {inside_key(name) for name in by_name}
        for key, group in nameless.items():
            # A session whose record we may not read (another role) or a plain client.
            named = observe.name_of(group)
            if key in insides or (
                named is not None and (named in by_name or key == inside_key(named))
            ):
                continue
            out.append(observe.status_of(None, key, group))
        return out

    # -- holds --------------------------------------------------------------------------------

    def release_hold(self, name: bytes, ending: Ending) -> Released:
        """End a hold the caller owns (its token or job), or any with ``force``. A hold is a
        holder process's session: ending it is ``pg_terminate_backend``."""
        env, force, slots = ending.env, ending.force, ending.slots
        name = validate_name(name)
        label = name.decode("utf-8", "surrogateescape")
        token = ending.token or env.get(ENV_TOKEN) or None
        keys = [slot_key(name, i) for i in range(MAX_SLOTS)] if slots else [name_key(name)]
        rows = [r for r in self._rows(keys) if r.granted]
        refusal: Refused | None = None
        for row in rows:
            info = row.info
            who = observe.holder_dict(row)
            if not info.get("hold"):
                refusal = NotOurHold(
                    f"lock {label} is held by {_describe(who)}, which is not a hold; "
                    "release only ends holds started with `local-mutex hold`"
                )
                continue
            if not force and not owned(info, env, token):
                unreadable = "token_sha256" not in info and "since_epoch" not in info
                refusal = NotOurHold(
                    f"the hold on {label} ({_describe(who)}) belongs to another job or token; "
                    "give its token ($LOCAL_MUTEX_HOLD_TOKEN), or --force to end it anyway"
                    + (
                        " (its record is not readable: same role or pg_read_all_stats needed)"
                        if unreadable
                        else ""
                    )
                )
                continue
            if not slots and enclosing_entry(env, domain(self.url, env), row.key) is not None:
                raise NestingError(
                    f"release of {label} from inside a run inside its hold would wait for "
                    "that run, and so for itself: release it once the run is over"
                )
            # Refused now, not after waiting for the runs inside: ending it would fail.
            self._check_may_end(label, row)
            # The runs inside the hold end first. Once they have, the hold may have ended
            # by itself (its TTL): its server pid could be another session's by then.
            try:
                waited = not slots and settle(self._session(), name, "", ending.waiting)
            except Interrupted as exc:
                what = f"the runs inside the hold on {label} to end (the hold stays)"
                raise Interrupted(exc.signum, waiting_for=what) from None
            if waited and not _still_there(row, self._rows([row.key])):
                # Ended meanwhile (another release, its TTL): this release ended nothing.
                return Released(describe_key(row.key), False)
            self._terminate(label, row)
            since = row.since
            held = None if since is None else max(time.time() - since, 0.0)
            pid = info.get("pid")
            return Released(
                describe_key(row.key),
                True,
                pid if isinstance(pid, int) else None,
                held,
                holder=_describe(who),
            )
        if refusal is not None:
            raise refusal
        return Released(describe_key(name_key(name)), False, found=False)

    def _check_may_end(self, label: str, row: observe.Row) -> None:
        """Refused unless this session may end the holder's, by the server's own rule for
        ``pg_terminate_backend``: a superuser's only by a superuser; else the holder's
        role's privileges, or pg_signal_backend's. Unknown (an error): left to the try."""
        psycopg = load_driver()
        try:
            (may,) = self._session().fetch(_MAY_END, (row.pid,), timeout=observe.READ_SECONDS)
        except (psycopg.Error, Unavailable):
            return
        if may is False:
            raise Refused(
                f"cannot end the hold on {label}: permission denied to terminate its session "
                f"(server pid {row.pid}; ending another session needs its role, membership "
                "in it, or pg_signal_backend, and a superuser's needs a superuser)"
            )

    def _terminate(self, label: str, row: observe.Row) -> None:
        psycopg = load_driver()
        session = self._session()
        try:
            # Without a wait in the server (no second argument): the answer comes at once,
            # so a server that gives none within the read bound is not answering. The loop
            # below waits for the session to end, every look bounded as well.
            session.fetch(
                "SELECT pg_terminate_backend(%s)", (row.pid,), timeout=observe.READ_SECONDS
            )
        except psycopg.errors.InsufficientPrivilege as exc:
            raise Refused(
                f"cannot end the hold on {label}: {driver_message(str(exc))} "
                "(ending another session needs its role, membership in it, or "
                "pg_signal_backend)"
            ) from None
        except psycopg.Error as exc:
            raise Unavailable(
                f"cannot end the hold on {label}: {driver_message(str(exc))}"
            ) from None
        except Unavailable as exc:
            raise Unavailable(
                f"cannot end the hold on {label}: {exc} (the request may still reach the "
                "server; see status once it answers)"
            ) from None
        deadline = time.monotonic() + _END_WAIT
        try:
            while time.monotonic() < deadline:
                if not any(r.pid == row.pid and r.granted for r in self._rows([row.key])):
                    return
                time.sleep(0.02)
        except Unavailable as exc:
            raise Unavailable(f"cannot tell whether the hold on {label} ended: {exc}") from None
        raise Unavailable(f"the session holding {label} (server pid {row.pid}) did not end")

    def close(self) -> None:
        session, self._observer = self._observer, None
        if session is not None:
            session.close()


# May this session end the one of that server pid? NULL when it is gone (or unseen).
_MAY_END = """
SELECT CASE
    WHEN me.rolsuper THEN true
    WHEN them.rolsuper THEN false
    ELSE pg_has_role(current_user, a.usesysid, 'USAGE')
        OR pg_has_role(current_user, 'pg_signal_backend', 'USAGE')
END
FROM pg_roles me, pg_stat_activity a JOIN pg_roles them ON them.oid = a.usesysid
WHERE me.rolname = current_user AND a.pid = %s
"""


def _still_there(row: observe.Row, rows: Sequence[observe.Row]) -> bool:
    """Is the hold that ``row`` saw still holding its key (the same session, the same
    holder)?"""
    return any(
        r.pid == row.pid and r.granted and r.info.get("pid") == row.info.get("pid") for r in rows
    )


def _belongs(name: bytes, row: observe.Row) -> bool:
    """Is this row's key one of the name's keys (its record could be forged or stale)?"""
    if row.key in (name_key(name), gate_key(name), inside_key(name)):
        return True
    slot = row.info.get("slot")
    return isinstance(slot, int) and 0 <= slot < MAX_SLOTS and row.key == slot_key(name, slot)


def _status(name: bytes, rows: Sequence[observe.Row]) -> LockStatus:
    label = name.decode("utf-8", "surrogateescape")
    plain, gate, inside = name_key(name), gate_key(name), inside_key(name)
    st = observe.status_of(label, plain, [r for r in rows if r.key != inside])
    # The runs inside a hold hold the lock with it, and without it once its holder was
    # killed outright: the next taker waits for them (``inside``). Only they hold that key
    # shared; whoever waits for it, or looks, is ending a hold or taking the lock.
    runs = [r for r in rows if r.key == inside and r.granted and r.mode == "shared"]
    st.holders += [observe.holder_of(r) for r in runs]
    if runs and not st.held:
        st.state, st.mode = "held", "shared"
    indexes: dict[int, int] = {}
    count = 0
    for row in rows:
        slots = row.info.get("slots")
        if isinstance(slots, int) and 0 < slots <= MAX_SLOTS:
            count = max(count, slots)
    for i in range(MAX_SLOTS):
        indexes[slot_key(name, i)] = i
    used = [indexes[r.key] for r in rows if r.key in indexes]
    count = max(count, max(used) + 1 if used else 0)
    for i in range(count):
        slot = observe.status_of(label, slot_key(name, i), rows)
        slot.slot = i
        st.slots.append(slot)
    if count:
        # Waiting for a slot, after the plain lock's own waiters: the session at the head
        # of the queue (it holds the gate while it looks for a free slot), then the gate's
        # queue.
        at_gate = [r for r in rows if r.key == gate]
        for row in [r for r in at_gate if r.granted] + [r for r in at_gate if not r.granted]:
            st.waiters.append(observe.waiter_of(row, len(st.waiters) + 1))
    return st


def _describe(holder: Mapping[str, Any]) -> str:
    from ...ui.lines import describe_holder

    return describe_holder(holder)
