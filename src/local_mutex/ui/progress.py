"""The repeated "still waiting" line, from a helper thread.

The main thread stays queued where the wait happens -- inside flock(), or inside a blocked
statement on a database server -- because interrupting it to print would lose its place in
the queue. ``look`` says who holds the lock and where we stand, freshly, for each line.
"""

from __future__ import annotations

import time

from .._fastsignal import edges

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Mapping
    from typing import Any

    from .lines import Reporter

    Look = Callable[[], tuple[Mapping[str, Any] | None, str | None]]


class Progress:
    """``with Progress(reporter, label, every, start, look):`` around a blocking wait."""

    def __init__(
        self,
        reporter: Reporter | None,
        label: str,
        every: float | None,
        start: float,
        look: Look,
        *,
        done: Callable[[], None] | None = None,
    ) -> None:
        self.reporter, self.label, self.every = reporter, label, every
        self.start, self.look, self.done = start, look, done
        self._finished: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> None:
        reporter, every = self.reporter, self.every
        if reporter is None or every is None:
            return
        try:
            # Whole or not at all: a stop signal raising inside threading's own code (a
            # Ctrl-C as the wait begins) left its locks half-released -- a RuntimeError
            # instead of the stop, and a thread that went on saying we wait.
            with edges():
                self._start(reporter, every)
        except BaseException:
            self.__exit__()
            raise

    def _start(self, reporter: Reporter, every: float) -> None:
        import threading

        finished = threading.Event()

        def tick() -> None:
            try:
                while not finished.wait(every):
                    try:
                        holder, position = self.look()
                    except Exception:
                        holder, position = None, None
                    waited = time.monotonic() - self.start
                    reporter.still_waiting(self.label, waited, holder, position)
            finally:
                if self.done is not None:
                    self.done()

        thread = threading.Thread(target=tick, name="local-mutex-progress", daemon=True)
        self._finished, self._thread = finished, thread  # first: ``__exit__`` ends it
        thread.start()

    def __exit__(self, *exc: object) -> None:
        with edges():  # (its first line no code can guard: CPython's bpo-29988)
            finished, thread = self._finished, self._thread
            self._finished = self._thread = None
            if finished is not None:
                finished.set()
        if thread is not None and thread.is_alive():  # (not if it could not start)
            from .._fastsignal import stops_taken
            from .lines import STOPPING_WRITE_WAIT

            # Told to stop: a line blocked on a stderr nobody reads must not keep us here.
            thread.join(STOPPING_WRITE_WAIT if stops_taken else None)
