"""local-mutex: run a command under a named lock that dies with its holder.

The public names below load on first use: a nested ``local-mutex NAME CMD`` imports this
package on every call and must not pay for what it does not use.
"""

# No ``from __future__ import annotations`` here (the annotations that need it are quoted):
# importing ``__future__`` would cost every run ~0.15 ms (see ``_startup._compile``).

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._version import __version__ as __version__
    from .api import HeldLock as HeldLock
    from .api import Locks as Locks
    from .api import hold as hold
    from .api import list_locks as list_locks
    from .api import lock_path as lock_path
    from .api import run as run
    from .api import status as status
    from .backends.base import Holder as Holder
    from .backends.base import HoldInfo as HoldInfo
    from .backends.base import LockStatus as LockStatus
    from .backends.base import Released as Released
    from .backends.base import Waiter as Waiter
    from .errors import BadAddress as BadAddress
    from .errors import CannotTell as CannotTell
    from .errors import Interrupted as Interrupted
    from .errors import InvalidCommand as InvalidCommand
    from .errors import InvalidLockDir as InvalidLockDir
    from .errors import InvalidName as InvalidName
    from .errors import InvalidTemplate as InvalidTemplate
    from .errors import LocalMutexError as LocalMutexError
    from .errors import LockLost as LockLost
    from .errors import NestingError as NestingError
    from .errors import NoRoom as NoRoom
    from .errors import NotAcquired as NotAcquired
    from .errors import RecordNotWritten as RecordNotWritten
    from .errors import Refused as Refused
    from .errors import SpawnError as SpawnError
    from .errors import Unavailable as Unavailable
    from .errors import UnsafeLockFile as UnsafeLockFile
    from .errors import Unsupported as Unsupported
    from .errors import ValidationError as ValidationError
    from .runspec import RunResult as RunResult

__all__ = [
    "BadAddress",
    "CannotTell",
    "HeldLock",
    "HoldInfo",
    "Holder",
    "Interrupted",
    "InvalidCommand",
    "InvalidLockDir",
    "InvalidName",
    "InvalidTemplate",
    "LocalMutexError",
    "LockLost",
    "LockStatus",
    "Locks",
    "NestingError",
    "NoRoom",
    "NotAcquired",
    "RecordNotWritten",
    "Refused",
    "Released",
    "RunResult",
    "SpawnError",
    "Unavailable",
    "UnsafeLockFile",
    "Unsupported",
    "ValidationError",
    "Waiter",
    "__version__",
    "hold",
    "list_locks",
    "lock_path",
    "run",
    "status",
]
# Where the names live, lightest first: an error class never loads the lifecycle.
_HOMES = ("_version", "errors", "backends.base", "runspec", "api")


if not TYPE_CHECKING:  # seen by a type checker, any name would import (as `object`)

    def __getattr__(name: str) -> object:
        if name in __all__:
            from importlib import import_module

            for home in _HOMES:
                module = import_module(f"{__name__}.{home}")
                if name in vars(module):
                    value = getattr(module, name)
                    globals()[name] = value
                    return value
        raise AttributeError(f"module 'local_mutex' has no attribute {name!r}")


def __dir__() -> "list[str]":
    return __all__
