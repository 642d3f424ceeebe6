"""The Python API: ``run``, ``hold``, ``status``, ``list_locks``, ``lock_path``.

Library calls print nothing unless given a ``reporter`` and raise the typed errors in
``errors``; the lock is the same lock the CLI and the action take.
"""

from __future__ import annotations

import _thread
import os
import sys
from collections.abc import Mapping

from ._fastsignal import main_thread
from .backends import given_remote, open_backend
from .errors import BadAddress, InvalidLockDir, NestingError, Unsupported, ValidationError
from .held import Held
from .lifecycle import run_locked
from .names import display, name_bytes, validate_name
from .runspec import Command, Options, RunResult, passable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .backends.base import Backend, LockStatus
    from .ui.lines import Reporter

# What the calls below are given is checked here, before anything is opened or locked:
# found later, a bad value was a bare TypeError from deep inside, a lock in /tmp, or a
# run that took the lock and ended with 70, the command never started.


def _lock_dir(lock_dir: str | os.PathLike[str] | None) -> str | None:
    """``lock_dir`` as a str (a ``pathlib.Path`` too). An empty one is refused, as the
    CLI refuses ``--lock-dir ""``: an unset variable must not lock in /tmp."""
    if lock_dir is None:
        return None
    try:
        path = os.fsdecode(lock_dir)
    except TypeError:
        raise InvalidLockDir(
            f"lock_dir is a path (a str or os.PathLike), not {type(lock_dir).__name__}"
        ) from None
    if not path:
        raise InvalidLockDir(
            "lock_dir is empty (an unset variable?): give a directory, or leave lock_dir "
            "out for $LOCAL_MUTEX_LOCK_DIR, else /tmp"
        )
    passable(f"lock_dir {path!r}", path, InvalidLockDir)
    return path


def _remote(remote: str | None, env: Mapping[str, str], lock_dir: str | None = None) -> str | None:
    """``remote``, else $LOCAL_MUTEX_REMOTE, as for the CLI and the action: the same
    name then locks in the same place whichever of them takes it. A lock dir given
    beside a remote given is refused, as the CLI refuses both (a remote in the
    environment moves a job's locks off the machine, lock dirs and all)."""
    if remote is not None:
        if not isinstance(remote, str):
            raise BadAddress(f"remote is a URL string, not {type(remote).__name__}")
        passable("remote", remote, BadAddress)
    address = given_remote(remote, env, "remote")
    if remote is not None and lock_dir is not None:
        raise Unsupported("lock_dir is for this machine's locks, not a remote: give one of them")
    return address


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    """The command's environment: what a program can be given, or ValidationError."""
    if env is None:
        return os.environ
    if not isinstance(env, Mapping):
        raise ValidationError(f"env is a mapping (a dict) of str to str, not {type(env).__name__}")
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValidationError(f"env maps str to str, not {key!r}: {value!r}")
        if not key:
            raise ValidationError("env has an empty name, which no program can be given")
        if "=" in key:
            raise ValidationError(f"env name {key!r} holds '=', which ends a name")
        passable(f"env name {key!r}", key, ValidationError)
        passable(f"env[{key!r}]", value, ValidationError)
    return env


def _flag(what: str, value: object, *, none: bool = False) -> None:
    """A flag is True or False (``None`` too where it means "as the environment says"):
    ``shared="no"`` took a shared lock."""
    if not isinstance(value, bool) and not (none and value is None):
        raise ValidationError(f"{what} must be True or False, not {value!r}")


def run(
    name: str | bytes,
    /,
    *,
    command: str | None = None,
    argv: Sequence[str] | None = None,
    lock_dir: str | os.PathLike[str] | None = None,
    remote: str | None = None,
    wait: float | None = None,
    timeout: float | None = None,
    kill_after: float = 5.0,
    shared: bool = False,
    slots: int | None = None,
    allow_other_owner: bool | None = None,
    env: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
) -> RunResult:
    """Run ``command`` (``/bin/sh -c``) or ``argv`` (a program and its arguments) under
    the lock ``name`` and return a ``RunResult`` (``.status`` is the exit status).

    ``wait``: seconds to wait for the lock (None: forever, 0: fail at once); on expiry
    ``NotAcquired`` is raised and nothing runs. ``timeout``: run ceiling from the start;
    on expiry the command's process group gets SIGTERM, then SIGKILL ``kill_after``
    seconds later, and the status is 124 or 137. A command killed by signal N gives 128+N.
    ``shared`` takes a reader lock; ``slots`` makes ``name`` a counting semaphore.
    ``remote`` locks on a git remote or PostgreSQL URL instead of ``lock_dir`` (a str or
    ``os.PathLike``; not both). ``argv`` is a list or tuple of str; ``env`` (default
    ``os.environ``) maps str to str. Bad input raises a ``ValidationError`` before anything
    is opened. Nothing is printed unless a ``reporter`` is given. Call it from the main
    thread (signals drive it).
    """
    if not main_thread():  # refused before anything is opened or run
        raise ValidationError(
            "run a command from the main thread: it relays stop signals to the command, and "
            "only the main thread can handle signals (hold() works from any thread)"
        )
    validate_name(name)
    what = Command(command, argv)
    opts = Options(wait=wait, timeout=timeout, kill_after=kill_after, shared=shared, slots=slots)
    _flag("allow_other_owner", allow_other_owner, none=True)
    env, where = _env(env), _lock_dir(lock_dir)
    backend = open_backend(
        _remote(remote, env, where), lock_dir=where, env=env, allow_other_owner=allow_other_owner
    )
    try:
        return run_locked(backend, name, what, opts, env=env, reporter=reporter)
    finally:
        backend.close()


class HeldLock:
    """What ``with hold(...) as lock`` gives: the lock file and how long we waited."""

    __slots__ = ("name", "path", "shared", "waited")

    def __init__(self, name: str, path: str, shared: bool, waited: float) -> None:
        self.name, self.path, self.shared, self.waited = name, path, shared, waited


class hold:  # noqa: N801 - reads as a function: ``with hold("name"):``
    """Hold the named lock in this process for the body of a ``with`` block.

    Serializes against the CLI and the action on the same name and lock dir. Raises
    ``NotAcquired`` when ``wait`` runs out (None waits forever, 0 fails at once). A
    ``local_mutex.run`` on the same name inside the block runs within it instead of
    waiting for itself; another thread asking for the same lock waits its turn. A lock
    file deleted under the block is put back by a watcher thread.
    """

    def __init__(
        self,
        name: str | bytes,
        *,
        lock_dir: str | os.PathLike[str] | None = None,
        remote: str | None = None,
        wait: float | None = None,
        shared: bool = False,
        allow_other_owner: bool | None = None,
        message: str | None = None,
    ) -> None:
        validate_name(name)
        self._opts = Options(wait=wait, shared=shared, message=message)
        _flag("allow_other_owner", allow_other_owner, none=True)
        where = _lock_dir(lock_dir)
        self._args = (name, where, remote, allow_other_owner)
        _remote(remote, os.environ, where)  # refused here, not at the ``with``
        # By thread: one object may serve several, as a threading.Lock does (a shared
        # hold's second thread overwrote the first's, whose lock then stayed held). A child
        # forked inside a block finds its parent's there: not its own (``taken_here``).
        self._held: dict[int, Held] = {}

    def __enter__(self) -> HeldLock:
        backend: Backend | None = None
        held: Held | None = None
        try:  # a Ctrl-C too, wherever it lands from here: nothing stays held or open
            name, lock_dir, remote, allow_other_owner = self._args
            backend = open_backend(
                _remote(remote, os.environ, lock_dir),
                lock_dir=lock_dir,
                env=os.environ,
                allow_other_owner=allow_other_owner,
            )
            me = _thread.get_ident()
            if me in self._held and self._held[me].taken_here:
                raise NestingError(
                    f"lock {display(name_bytes(name))} is already held by this thread"
                )
            command = " ".join(sys.argv) or sys.executable
            held = Held(backend, name, self._opts, command=command, env=os.environ)
            self._held[me] = held  # before it is taken: its end always finds it
            held.__enter__()
            lock_file = held.lock.lock_file if held.lock is not None else ""
            return HeldLock(held.label, lock_file, self._opts.shared, held.waited)
        except BaseException:
            try:
                if held is not None:
                    if self._held.get(_thread.get_ident()) is held:
                        del self._held[_thread.get_ident()]
                    if held.lock is not None:
                        held.__exit__(None, None, None)
            finally:
                if backend is not None:
                    backend.close()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            held = self._held.get(_thread.get_ident())
            if held is not None:
                held.__exit__(*exc)
        finally:
            held = self._held.pop(_thread.get_ident(), None)
            if held is not None:
                try:
                    if held.lock is not None:  # cut short by a Ctrl-C: let go now
                        held.__exit__(None, None, None)
                finally:
                    if held.taken_here:  # a forked child's would end the parent's session
                        held.backend.close()  # (or remove its git work tree)


def status(
    name: str | bytes,
    lock_dir: str | os.PathLike[str] | None = None,
    *,
    remote: str | None = None,
) -> LockStatus:
    """Who holds the lock ``name`` and who waits for it."""
    raw, where = validate_name(name), _lock_dir(lock_dir)
    backend = open_backend(
        _remote(remote, os.environ, where), lock_dir=where, env=os.environ, reading=True
    )
    try:
        return backend.status(raw)
    finally:
        backend.close()


class Locks(list["LockStatus"]):
    """What ``list_locks`` returns: a list of LockStatus, and ``unlisted``, why each file
    at a lock path was left out (a FIFO, a symlink, another user's file: what `run`
    refuses), as the CLI warns of each."""

    unlisted: list[str]


def list_locks(
    lock_dir: str | os.PathLike[str] | None = None,
    *,
    include_free: bool = False,
    remote: str | None = None,
) -> Locks:
    """Every held lock in ``lock_dir`` (all lock files with ``include_free``); what was
    left out is in ``.unlisted``."""
    _flag("include_free", include_free)
    where = _lock_dir(lock_dir)
    backend = open_backend(
        _remote(remote, os.environ, where), lock_dir=where, env=os.environ, reading=True
    )
    try:
        found = Locks(backend.list_locks(include_free=include_free))
        found.unlisted = list(backend.unlisted)
        return found
    finally:
        backend.close()


def lock_path(name: str | bytes, lock_dir: str | os.PathLike[str] | None = None) -> str:
    """The lock file for ``name``; both are validated and resolved as the CLI does."""
    from .backends.flock.backend import FlockBackend

    raw, where = validate_name(name), _lock_dir(lock_dir)
    return FlockBackend(where, env=os.environ).path_of(raw)


__all__ = ["HeldLock", "display", "hold", "list_locks", "lock_path", "run", "status"]
