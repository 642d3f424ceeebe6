"""Typed errors raised by the library; the CLI maps each family to one exit code."""

from __future__ import annotations


class LocalMutexError(Exception):
    """Base class of every error this package raises on purpose."""


class ValidationError(LocalMutexError):
    """Bad input or an unsafe setup: nothing was locked and nothing ran (exit 2)."""


class InvalidName(ValidationError):
    """The lock name is empty, whitespace-only or holds a control character."""


class InvalidCommand(ValidationError):
    """The command is empty or whitespace-only."""


class InvalidLockDir(ValidationError):
    """The lock directory is not absolute, missing, not a directory, or not writable."""


class UnsafeLockFile(ValidationError):
    """The lock path is a symlink, not a regular file, or owned by another user."""


class NestingError(ValidationError):
    """An exclusive lock was asked for inside a shared hold of the same lock."""


class NotAcquired(LocalMutexError):
    """The lock was not acquired within the wait ceiling (exit 75, as BSD lockf).

    ``holder`` describes who held it when we gave up, when that is known.
    """

    def __init__(self, message: str, holder: object | None = None, waited: float = 0.0) -> None:
        super().__init__(message)
        self.holder = holder
        self.waited = waited


class Interrupted(LocalMutexError):
    """A signal arrived while waiting for the lock; the command never ran (exit 128+N)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum} while waiting")
        self.signum = signum


class SpawnError(LocalMutexError):
    """The command could not be started at all (exit 125, as timeout(1))."""


class CannotTell(LocalMutexError):
    """The lock's state could not be determined (status exit 3)."""


class Refused(LocalMutexError):
    """``release`` declined: the lock is not a hold, or not this job's (exit 77)."""


class RemoteError(LocalMutexError):
    """A git remote could not be reached, or refused for a reason other than a lost race
    (exit 69, as EX_UNAVAILABLE); nothing was left half-taken."""
