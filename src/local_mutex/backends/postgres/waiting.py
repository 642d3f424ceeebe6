"""Waiting in the server's queue: a progress line from a helper thread (the main thread
stays inside the blocked statement), and stop signals turned into ``Interrupted``."""

from __future__ import annotations

import time

from ..._fastsignal import note_stop, raise_or_keep
from ...errors import Interrupted
from ...ui.progress import Progress
from . import observe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from ...ui.lines import Reporter
    from .lock import PostgresLock
    from .session import Session

_MIN_LEFT = 0.1
_LOOK_SECONDS = 5.0


def queue_progress(
    lock: PostgresLock,
    reporter: Reporter | None,
    every: float | None,
    start: float,
    key: int,
    server_pid: int,
) -> Progress:
    """The "still waiting" line while we are queued in the server: who holds the key and
    where our session stands, read through a second session of its own."""
    observer: list[Session] = []

    def look() -> tuple[Any, str | None]:
        if not observer:  # bounded: the main thread joins us when its wait ends
            observer.append(lock._connect(time.monotonic() + _LOOK_SECONDS))
        rows = observe.fetch_rows(observer[0], [key], timeout=_LOOK_SECONDS)
        queued = [r.pid for r in rows if r.key == key and not r.granted]
        position = (
            f"position {queued.index(server_pid) + 1} of {len(queued)}"
            if server_pid in queued
            else None
        )
        return observe.first_holder(rows, key), position

    def done() -> None:
        for session in observer:
            session.close()

    return Progress(reporter, lock.label, every, start, look, done=done)


def wait_in_queue(session: Session, sql: str, limit: float | None) -> None:
    """The lock statement, asleep in poll() until the server answers: a stop signal that
    lands a moment before the sleep begins (a hold's own watcher sends one just then) is
    sent again, not left unheard until the lock is granted."""
    from ...nudge import Nudge  # (loaded only once a lock is busy)

    with Nudge() as nudge:
        nudge.call(lambda: session.fetch(sql, timeout=left(limit)))


class Interruptible:
    """SIGINT/SIGTERM/SIGHUP/SIGQUIT raise ``Interrupted`` while we wait (main thread only),
    and say whether it landed inside a server wait that must be cancelled."""

    _SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    ends_waits = True  # a ``Nudge`` sends such a signal again until the wait has ended

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.interrupted_during_query = False
        self._in_query = False
        self.raised_for: list[int] = []  # see ``Nudge.call``

    def _stop(self, signum: int, frame: object) -> None:
        note_stop(signum)
        self.raised_for.append(signum)
        self.interrupted_during_query = self.interrupted_during_query or self._in_query
        # Kept while a wait is set up or taken down (``edges``): raised halfway, it would
        # leave the progress line's thread or the borrowed wakeup fd half done.
        raise_or_keep(Interrupted(signum))

    def __enter__(self) -> Interruptible:
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self
        for name in self._SIGNALS:
            signum = getattr(signal, name)
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue
            self.previous[signum] = signal.signal(signum, self._stop)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def query(self) -> _InQuery:
        return _InQuery(self)


class _InQuery:
    def __init__(self, owner: Interruptible) -> None:
        self.owner = owner

    def __enter__(self) -> None:
        self.owner._in_query = True

    def __exit__(self, *exc: object) -> None:
        self.owner._in_query = False


def left(limit: float | None) -> float | None:
    """Seconds a statement may take before ``limit`` (monotonic), never quite none."""
    if limit is None:
        return None
    return max(limit - time.monotonic(), _MIN_LEFT)


def refusal(
    label: str,
    address: str,
    holder: dict[str, Any] | None,
    busy: Callable[[], str] | None,
    waited: float | None,
) -> str:
    """Why the lock was not acquired: who holds it (or, for slots, ``busy()``); ``waited``
    None for ``--no-wait``."""
    if busy is not None:
        return (
            f"lock {label} not acquired after waiting {waited or 0.0:.1f}s on {address}; {busy()}"
        )
    if waited is None:
        return f"lock {label} is held on {address}" + (f" by {who(holder)}" if holder else "")
    return f"lock {label} not acquired after waiting {waited:.1f}s on {address}" + (
        f"; held by {who(holder)}" if holder else ""
    )


def queue_detail(ahead: int) -> str | None:
    if ahead == 0:
        return None
    return f"{ahead} other waiter{'s' if ahead != 1 else ''} queued ahead"


def who(holder: Mapping[str, Any]) -> str:
    from ...ui.lines import describe_holder

    return describe_holder(holder)


def holder_and_queue(
    session: Session, key: int, limit: float | None
) -> tuple[dict[str, Any] | None, int]:
    """Who holds ``key`` and how many wait for it."""
    rows = observe.fetch_rows(session, [key], timeout=left(limit))
    return observe.first_holder(rows, key), sum(1 for r in rows if not r.granted)
