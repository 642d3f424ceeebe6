"""``with local_mutex.hold(name):`` -- the lock held by this Python process for a block."""

from __future__ import annotations

import os
import sys

from . import nesting, record
from .errors import NestingError
from .wrap import Target, acquire


class HeldLock:
    """What ``with hold(...) as lock`` gives: the lock file and how long we waited."""

    __slots__ = ("name", "path", "shared", "waited")

    def __init__(self, name: str, path: str, shared: bool, waited: float) -> None:
        self.name = name
        self.path = path
        self.shared = shared
        self.waited = waited


class hold:  # noqa: N801 - reads as a function: ``with hold("name"):``
    """Hold the named lock in this process for the body of a ``with`` block.

    Serializes against the CLI and the action on the same name and lock dir. Raises
    ``NotAcquired`` when ``wait`` runs out (None waits forever, 0 fails at once). A
    ``local_mutex.run`` on the same name inside the block runs reentrantly instead of
    waiting for itself; another thread asking for the same lock waits its turn.
    """

    def __init__(
        self,
        name: str | bytes,
        *,
        lock_dir: str | None = None,
        wait: float | None = None,
        shared: bool = False,
        allow_other_owner: bool | None = None,
        message: str | None = None,
    ) -> None:
        self._args = (name, lock_dir, wait, shared, allow_other_owner, message)
        self._target: Target | None = None
        self._key: tuple[int, int, int] | None = None

    def __enter__(self) -> HeldLock:
        name, lock_dir, wait, shared, allow_other_owner, message = self._args
        env = os.environ
        target = Target(name, lock_dir, allow_other_owner, env)
        try:
            key = nesting.here_key(target.dev, target.ino)
            if key in nesting.held_here:
                raise NestingError(f"lock {target.label} is already held by this thread")
            waited = acquire(target, shared=shared, wait=wait, reporter=None, progress=None)
            if not shared:
                command = " ".join(sys.argv) or sys.executable
                extra = {"message": message} if message else None
                record.write_record(
                    target.fd,
                    record.make_record(target.label, command, shared=False, env=env, extra=extra),
                )
        except BaseException:
            target.close()
            raise
        nesting.held_here[key] = "s" if shared else "x"
        self._target, self._key = target, key
        return HeldLock(target.label, target.path, shared, waited)

    def __exit__(self, *exc: object) -> None:
        target, key = self._target, self._key
        if target is None or key is None:
            return
        del nesting.held_here[key]
        if not self._args[3]:
            record.clear_record(target.fd)
        target.close()
        self._target = self._key = None
