"""Waiting in the server's queue: a progress line from a helper thread (the main thread
stays inside the blocked statement), and stop signals turned into ``Interrupted``."""

from __future__ import annotations

import time

from ...errors import Interrupted
from . import observe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ...ui.lines import Reporter
    from .lock import PostgresLock
    from .session import Session


class Progress:
    """Repeat a progress line from a helper thread while the main thread stays queued in
    the server: interrupting the statement to print would lose our place in the queue."""

    def __init__(
        self,
        lock: PostgresLock,
        reporter: Reporter | None,
        every: float | None,
        start: float,
        key: int,
        server_pid: int,
    ) -> None:
        self.lock, self.reporter, self.every = lock, reporter, every
        self.start, self.key, self.server_pid = start, key, server_pid
        self.stop: Any = None

    def __enter__(self) -> None:
        reporter, every = self.reporter, self.every
        if reporter is None or every is None:
            return
        import threading

        done = threading.Event()

        def tick() -> None:
            observer: Session | None = None
            try:
                while not done.wait(every):
                    try:
                        observer = observer or self.lock._connect()
                        rows = observe.fetch_rows(observer, [self.key])
                    except Exception:
                        rows = []
                    queued = [r.pid for r in rows if r.key == self.key and not r.granted]
                    position = (
                        f"position {queued.index(self.server_pid) + 1} of {len(queued)}"
                        if self.server_pid in queued
                        else None
                    )
                    reporter.still_waiting(
                        self.lock.label,
                        time.monotonic() - self.start,
                        observe.first_holder(rows, self.key),
                        position,
                    )
            finally:
                if observer is not None:
                    observer.close()

        thread = threading.Thread(target=tick, name="local-mutex-progress", daemon=True)
        thread.start()

        def stop() -> None:
            done.set()
            thread.join()

        self.stop = stop

    def __exit__(self, *exc: object) -> None:
        if self.stop is not None:
            self.stop()


class Interruptible:
    """SIGINT/SIGTERM/SIGHUP/SIGQUIT raise ``Interrupted`` while we wait (main thread only),
    and say whether it landed inside a server wait that must be cancelled."""

    _SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.interrupted_during_query = False
        self._in_query = False

    def _stop(self, signum: int, frame: object) -> None:
        self.interrupted_during_query = self._in_query
        raise Interrupted(signum)

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
