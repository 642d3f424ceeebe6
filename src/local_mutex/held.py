"""``Held``: the one lifecycle (``lifecycle``) without a command -- the lock is held by
this process for a block (``api.hold``, the ``hold`` holder process)."""

from __future__ import annotations

import _thread
import os
import time

from .errors import LockLost, NestingError
from .lifecycle import _held_here, _here_key, _let_go, _take
from .names import display, name_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from .backends.base import Backend, Lock
    from .runspec import Options
    from .ui.lines import Reporter


class Held:
    """``with Held(backend, name, ...) as lock:`` -- the lifecycle without a command: the
    lock is held by this process for the block (``api.hold``, the ``hold`` holder)."""

    def __init__(
        self,
        backend: Backend,
        name: str | bytes,
        opts: Options,
        *,
        command: str,
        env: Mapping[str, str],
        extra: Mapping[str, Any] | None = None,
        reporter: Reporter | None = None,
        watch: bool = True,
    ) -> None:
        self.backend, self.raw, self.opts = backend, name_bytes(name), opts
        self.command, self.env, self.extra = command, env, extra
        self.reporter, self.watch = reporter, watch
        self.lock: Lock | None = None
        self.lost: LockLost | None = None
        self.waited = 0.0
        self._key: tuple[str, str, bool, int] | None = None
        self._stop = False
        # The watcher's look (a put-back) and the block's end, one at a time: a put-back
        # finished after the release left a locked file nothing would close.
        self._turn = _thread.allocate_lock()
        self._pid = os.getpid()

    @property
    def label(self) -> str:
        return display(self.raw)

    def __enter__(self) -> Held:
        lock = self.backend.lock(self.raw)
        try:
            key = _here_key(self.backend, lock, self.opts.slots)
            if key in _held_here:
                raise NestingError(f"lock {lock.label} is already held by this thread")
            self.waited = _take(lock, self.opts, self.env, self.reporter, self.command, self.extra)
            self.lock, self._key, self._pid = lock, key, os.getpid()
            _held_here[key] = ("s" if self.opts.shared else "x", lock)
            if self.watch and lock.check_interval() is not None:
                _thread.start_new_thread(self._watch, ())
        except BaseException:  # a Ctrl-C too, wherever it lands: nothing stays held
            self._stop = True
            if self._key is not None:  # taken and noted: let go as the block's end would
                self._end()
            else:
                _let_go(lock)
                lock.close()
            raise
        return self

    def check(self) -> str | None:  # one periodic check, for holders with a loop of their own
        assert self.lock is not None
        try:
            return self.lock.check()
        except LockLost as exc:
            self.lost = exc
            raise

    def _watch(self) -> None:
        lock = self.lock
        while lock is not None and not self._stop and self.lost is None:
            interval = lock.check_interval()
            if interval is None:
                return
            time.sleep(interval)
            with self._turn:
                if self._stop:
                    return
                try:
                    self.check()
                except LockLost:
                    return
                except Exception:
                    continue

    def __exit__(self, *exc: object) -> None:
        if not self.taken_here:  # a forked child: no watcher here, and its copy of the
            self._end()  # turn may have been taken when the fork came
            return
        try:
            with self._turn:  # a look under way ends first; none starts after this
                self._stop = True
        finally:  # a Ctrl-C while the look ends still lets go
            self._end()
        if self.lost is not None and exc[0] is None:
            raise self.lost

    @property
    def taken_here(self) -> bool:
        """In the process that took it, not a child forked inside the block."""
        return os.getpid() == self._pid

    def _end(self) -> None:
        """Let go; the block's state is cleared last, so that an end a Ctrl-C cut short is
        seen as not done, and done again (``api.hold``)."""
        lock, key = self.lock, self._key
        if lock is None:
            return
        if not self.taken_here:
            # A forked child: the lock is the parent's. A kernel lock's copies close (an
            # unlock would free it for everyone); a remote lock's session or work tree is
            # left alone: closing it would end the parent's lock, or its git directory.
            self.lock = self._key = None
            if self.backend.kind == "flock":
                lock.close()
            return
        try:
            lock.release()
        finally:  # closing the last descriptor lets go too, should release() be cut short
            try:
                lock.close()
            finally:
                if key is not None:
                    _held_here.pop(key, None)
                self.lock = self._key = None
