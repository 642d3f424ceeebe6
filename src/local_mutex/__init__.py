"""local-mutex: run a command under a named kernel lock that dies with its holder.

Light on purpose: a nested ``local-mutex NAME CMD`` imports this package on every call.
"""

from __future__ import annotations

from ._version import __version__
from .errors import (
    CannotTell,
    Interrupted,
    InvalidCommand,
    InvalidLockDir,
    InvalidName,
    LocalMutexError,
    NestingError,
    NotAcquired,
    SpawnError,
    UnsafeLockFile,
    ValidationError,
)
from .lockdir import lock_path
from .wrap import RunResult, run, run_locked

TYPE_CHECKING = False
if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from .inprocess import HeldLock
    from .lockstate import LockStatus


def hold(
    name: str | bytes,
    *,
    lock_dir: str | None = None,
    wait: float | None = None,
    shared: bool = False,
    allow_other_owner: bool | None = None,
    message: str | None = None,
) -> AbstractContextManager[HeldLock]:
    """``with hold(name): ...`` holds the lock in this process (see ``inprocess.hold``)."""
    from .inprocess import hold as _hold

    return _hold(
        name,
        lock_dir=lock_dir,
        wait=wait,
        shared=shared,
        allow_other_owner=allow_other_owner,
        message=message,
    )


def status(name: str | bytes, lock_dir: str | None = None) -> LockStatus:
    """Who holds the lock ``name`` and who waits for it (see ``lockstate.LockStatus``)."""
    from .lockstate import status as _status

    return _status(name, lock_dir)


def list_locks(lock_dir: str | None = None, *, include_free: bool = False) -> list[LockStatus]:
    """Every held lock in ``lock_dir`` (all lock files with ``include_free``)."""
    from .lockstate import list_locks as _list_locks

    return _list_locks(lock_dir, include_free=include_free)


__all__ = [
    "CannotTell",
    "Interrupted",
    "InvalidCommand",
    "InvalidLockDir",
    "InvalidName",
    "LocalMutexError",
    "NestingError",
    "NotAcquired",
    "RunResult",
    "SpawnError",
    "UnsafeLockFile",
    "ValidationError",
    "__version__",
    "hold",
    "list_locks",
    "lock_path",
    "run",
    "run_locked",
    "status",
]
