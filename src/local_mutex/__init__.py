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
from .inprocess import HeldLock, hold
from .lockdir import lock_path
from .wrap import RunResult, run, run_locked

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .lockstate import LockStatus


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
    "HeldLock",
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
