"""Typed errors raised by the library. Each class carries the exit status the CLI gives it
(``exit_code``); ``ui.lines.Reporter.failure`` is the one place that turns them into a line
and a status. Library callers catch them like any exception."""

from __future__ import annotations

# The exit statuses of local-mutex's own outcomes (README, "Exit status").
EXIT_USAGE = 2
EXIT_CANNOT_TELL = 3
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a remote is down, or a held remote lock was lost
EXIT_IOERR = 74  # EX_IOERR: the holder record could not be written
EXIT_NOT_ACQUIRED = 75  # as BSD lockf(1): not acquired in time
EXIT_REFUSED = 77  # EX_NOPERM: release declined
EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_KILLED = 137
EXIT_CANNOT_START = 125  # as timeout(1): the command could not start


class LocalMutexError(Exception):
    """Base class of every error this package raises on purpose."""

    exit_code = EXIT_CANNOT_START


class ValidationError(LocalMutexError):
    """Bad input or an unsafe setup: nothing was locked and nothing ran."""

    exit_code = EXIT_USAGE


class InvalidName(ValidationError):
    """The lock name is empty, whitespace-only or holds a control character."""


class InvalidCommand(ValidationError):
    """The command is empty or whitespace-only."""


class InvalidLockDir(ValidationError):
    """The lock directory is not absolute, missing, not a directory, or not writable."""


class UnsafeLockFile(ValidationError):
    """The lock path is a symlink, not a regular file, has other links, or is another
    user's."""


class NestingError(ValidationError):
    """An exclusive lock was asked for inside a shared hold of the same lock."""


class EnclosedWhileWaiting(Exception):
    """Not an error: while it waited, a lock held through our own inherited description
    was left to the run we are part of (its holder ended without unlocking it). ``pid``
    and ``mode`` (``"x"``/``"s"``) are the enclosing run's, as ``Lock.enclosing`` gives."""

    def __init__(self, pid: int, mode: str) -> None:
        super().__init__(pid, mode)
        self.pid, self.mode = pid, mode


class InvalidTemplate(ValidationError):
    """A ``{`` or ``}`` in an ``each`` template that is neither ``{}`` nor doubled."""


class BadAddress(ValidationError):
    """A lock address (``--remote``) that names no usable backend, or a server that cannot
    serve locks (a standby, too old)."""


class Unsupported(ValidationError):
    """The backend cannot do what was asked (shared locks on git, history on flock, ...)."""


class NotAcquired(LocalMutexError):
    """The lock was not acquired within the wait ceiling.

    ``holder`` describes who held it when we gave up, when that is known.
    """

    exit_code = EXIT_NOT_ACQUIRED

    def __init__(self, message: str, holder: object | None = None, waited: float = 0.0) -> None:
        super().__init__(message)
        self.holder = holder
        self.waited = waited


class Interrupted(LocalMutexError):
    """A stop signal arrived while waiting for the lock (or, ``before_start``, once it was
    taken but before the command started: it was let go again); the command never ran."""

    def __init__(
        self,
        signum: int,
        *,
        before_start: bool = False,
        waiting_for: str | None = None,
        holder_pid: int | None = None,
        taken: bool = False,
    ) -> None:
        """``waiting_for``: what else was waited for (and so nothing was done);
        ``holder_pid``: ``hold``'s detached holder got the signal while it waited (or, if
        ``taken``, as it took the lock, before the hold was its to keep)."""
        if holder_pid is not None:
            when = "as it took the lock" if taken else "while it waited for the lock"
            text = (
                f"its holder process (pid {holder_pid}) received signal {signum} {when}; "
                "nothing is held"
            )
        elif waiting_for is not None:
            text = f"stopped waiting for {waiting_for}: received signal {signum}; nothing was done"
        else:
            when = "before the command started" if before_start else "waiting for the lock"
            text = f"stopped {when}: received signal {signum}; the command did not run"
        super().__init__(text)
        self.signum = signum
        self.exit_code = 128 + signum


class SpawnError(LocalMutexError):
    """The command could not be started at all."""

    exit_code = EXIT_CANNOT_START


class CannotTell(LocalMutexError):
    """The lock's state could not be determined."""

    exit_code = EXIT_CANNOT_TELL


class Refused(LocalMutexError):
    """``release`` declined: not a hold, another job's, or another user's."""

    exit_code = EXIT_REFUSED


class NotOurHold(Refused):
    """``release`` found the lock held, but by no hold of the caller's: another job's (or
    token's) hold, or a run. The action's release step, "end this job's hold", has none."""


class RecordNotWritten(LocalMutexError):
    """The lock was taken but the holder record could not be written; it was let go."""

    exit_code = EXIT_IOERR


class NoRoom(LocalMutexError):
    """No lock file could be created: the file system is full (its inodes too) or a quota
    is spent; nothing was held."""

    exit_code = EXIT_IOERR


class ItemsUnreadable(LocalMutexError):
    """``each`` could not read its items (stdin closed, not open for reading, an I/O
    error); the items read before it ran."""

    exit_code = EXIT_IOERR


class Unavailable(LocalMutexError):
    """A remote could not be reached, or refused for a reason other than a lost race;
    nothing was left half-taken."""

    exit_code = EXIT_UNAVAILABLE


class LockLost(Unavailable):
    """A held lock was lost while its command ran (lease taken over, session ended)."""
