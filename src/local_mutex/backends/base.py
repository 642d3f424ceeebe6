"""The seam between the one lifecycle and the places a lock can live.

A *backend* is a lock domain: a lock directory on this machine (``flock``), a git remote
(``git``), a PostgreSQL database (``postgres``). ``backends.open_backend`` picks one from
the lock's address. A backend hands out ``Lock`` objects, one per name; the lifecycle
(``lifecycle.py``) drives a ``Lock`` through acquire -> record -> supervise -> release and
never looks behind it. This module holds the protocol (type-checking only) and the plain
data every backend reports: who holds, who waits, what a hold or a release did.

The holder guarantee -- while any process of a locked command runs, nobody else holds the
lock -- is kept in two places: ``Lock.keep_fds`` names the descriptors whose lifetime *is*
the lock (the flock file, a database connection); the supervisor's keeper process and the
command inherit them, so the lock outlives whichever process dies first. ``Lock.check``
runs periodically while the lock is held and raises ``LockLost`` when a lease or session is
gone, so the command is stopped (exit 69) instead of running unprotected.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Protocol

    from ..ui.lines import Reporter
    from . import Ending, Take

    class Lock(Protocol):
        """One name in one backend: opened by ``Backend.lock``, not yet taken."""

        label: str  # the name as people read it
        lock_file: str  # where it lives: a path, a branch, a key (for outputs and errors)
        # Set by the lifecycle before ``acquire``: seconds it may need to stop the command
        # (TERM, grace, KILL). A lease or heartbeat deadline must leave at least this much.
        stop_grace: float

        def enclosing(
            self, env: Mapping[str, str], slots: int | None = None
        ) -> tuple[int, str] | None:
            """(pid, "x" | "s") when an ancestor process already holds this very lock (with
            ``slots``: one of the name's first ``slots`` slots), so a nested call runs inside
            it instead of waiting for itself; else None."""

        def acquire(self, take: Take) -> float:
            """Take the lock, announcing the wait through ``take.reporter``; return the seconds
            waited. Raises NotAcquired (wait ran out), Interrupted (a stop signal arrived),
            Unsupported (shared/slots where the backend has none), Unavailable. A lock that
            itself says who holds it (a git lock commit) takes it with ``take.record``."""

        def write_record(self, record: Mapping[str, Any]) -> None:
            """Publish who holds it (pid, command, cwd, host, job, ...). Raises
            RecordNotWritten when it cannot; the caller then releases and exits 74."""

        def keep_fds(self) -> tuple[int, ...]:
            """Descriptors whose open file description keeps the lock held. The keeper
            process and the command inherit them (never at a fixed number)."""

        def check_interval(self) -> float | None:
            """Seconds between ``check`` calls while held; None: never needed."""

        # Optional, for leased locks: ``stop_deadline() -> float | None``, the monotonic
        # time by which the command must be stopped unless a newer deadline follows; the
        # supervisor enforces it on its own, so a frozen keeper cannot overrun the lease.
        # Optional, for server sessions: ``session_fd() -> int | None``, a socket whose
        # hangup means the server ended the lock's session; keeper and supervisor watch it,
        # so a lost session stops the command at once, even with the keeper frozen.
        # Optional: ``cancel_on(fd)``: a ``check`` under way (a renewal to a hung server)
        # ends early once ``fd`` turns readable -- the supervisor's report of the end.
        # Optional: ``leave()``: let go of ours, leaving the lock to the command's processes
        # that share it (an error of ours while they may run); else ``close()`` does that.
        # Optional: ``guardian: int | None``, a child of the keeper that holds the lock too
        # (a lock file put back: ``flock.guardian``), never stopped as the command's orphan.

        def check(self) -> str | None:
            """Runs while held, from the process that took the lock. Renew a lease, watch
            a session, put back a deleted lock file. Returns a warning to print, or None;
            raises LockLost when the lock is gone (the command is then stopped)."""

        def release(self) -> None:
            """Let go at a normal end. Raises Unavailable when a remote could not be told
            (the caller warns and keeps the command's exit status)."""

        def abandon(self) -> None:
            """Let go after the supervisor died, without trusting any shared state."""

        def child_env(self, env: Mapping[str, str], held: bool) -> dict[str, str]:
            """The command's environment: ``env`` plus what nested calls need to stay in
            this lock domain (and, when ``held``, to find this lock held)."""

        def close(self) -> None: ...

    class Backend(Protocol):
        kind: str  # "flock", "git", "postgres"
        address: str  # printable: a lock dir, or a URL with any password masked
        # Options of the command line (by their ``dest`` in commands/options.py) this
        # backend cannot honour: refused with exit 2 when given.
        refuses: tuple[str, ...]
        # Holds that outlive their holder process (git branches) versus holds kept by a
        # detached holder process (flock, postgres).
        persistent_holds: bool
        # What the last ``list_locks`` left out and why (a lock file or branch nobody can
        # take until a person removes it): the CLI warns of each, so none hides unseen.
        unlisted: Sequence[str]

        def lock(self, name: bytes) -> Lock: ...

        def status(self, name: bytes) -> LockStatus: ...

        def list_locks(self, *, include_free: bool) -> list[LockStatus]: ...

        def history(self, name: bytes) -> list[dict[str, Any]]:
            """Raises Unsupported where the backend keeps none."""

        def hold_persistent(
            self,
            name: bytes,
            *,
            wait: float | None,
            ttl: float | None,
            message: str | None,
            reporter: Reporter | None = None,
        ) -> HoldInfo:
            """Only where ``persistent_holds``; ``reporter`` says we wait."""

        def release_hold(self, name: bytes, ending: Ending) -> Released:
            """End a hold the caller owns (its token or job), or any with ``force``."""

        def close(self) -> None: ...


class _Fields:
    """Plain data with ``as_dict``; not dataclasses, whose import costs startup time."""

    __slots__: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.as_dict()!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Fields)
            and type(other) is type(self)
            and (self.as_dict() == other.as_dict())
        )

    __hash__ = None  # type: ignore[assignment]  # mutable: not hashable


class Holder(_Fields):
    """A process (or session) holding the lock; ``source`` says where the details came
    from: "record" (what the holder published) or "kernel"/"server" (observed only)."""

    __slots__ = (
        "command",
        "cwd",
        "held_seconds",
        "host",
        "job",
        "message",
        "mode",
        "pid",
        "run_url",
        "runner",
        "since",
        "since_epoch",
        "source",
        "user",
        "workflow",
    )

    def __init__(
        self,
        pid: int | None,
        mode: str,
        command: str | None = None,
        *,
        cwd: str | None = None,
        host: str | None = None,
        user: str | None = None,
        since: str | None = None,
        since_epoch: float | None = None,
        held_seconds: float | None = None,
        runner: str | None = None,
        job: str | None = None,
        workflow: str | None = None,
        run_url: str | None = None,
        message: str | None = None,
        source: str = "kernel",
    ) -> None:
        self.pid, self.mode, self.command, self.cwd = pid, mode, command, cwd
        self.host, self.user, self.since, self.since_epoch = host, user, since, since_epoch
        self.held_seconds, self.runner, self.job = held_seconds, runner, job
        self.workflow, self.run_url, self.message = workflow, run_url, message
        self.source = source


class Waiter(_Fields):
    """A queued waiter, ``position`` 1 being next; ``started`` is when it started (the
    process for flock, the wait itself where the backend knows it)."""

    __slots__ = ("command", "host", "mode", "pid", "position", "started", "started_epoch")

    def __init__(
        self,
        pid: int | None,
        mode: str,
        position: int,
        command: str | None = None,
        started: str | None = None,
        started_epoch: float | None = None,
        host: str | None = None,
    ) -> None:
        self.pid, self.mode, self.position, self.command = pid, mode, position, command
        self.started, self.started_epoch, self.host = started, started_epoch, host


class LockStatus(_Fields):
    """One lock's state. ``method`` says how it was learned: "proc" (kernel, full picture),
    "probe" (state and mode, the recorded holder), "git" (a branch), "server" (a database)."""

    __slots__ = (
        "detail",
        "holders",
        "lock_file",
        "method",
        "mode",
        "name",
        "refused_slots",
        "slot",
        "slots",
        "state",
        "waiters",
    )

    def __init__(
        self,
        lock_file: str,
        name: str | None,
        state: str,
        method: str,
        mode: str | None = None,
        holders: list[Holder] | None = None,
        waiters: list[Waiter] | None = None,
    ) -> None:
        self.lock_file, self.name, self.state, self.method = lock_file, name, state, method
        self.mode = mode
        self.holders: list[Holder] = holders or []
        self.waiters: list[Waiter] = waiters or []
        self.slots: list[LockStatus] = []  # a counting semaphore's slots, when it has any
        self.slot: int | None = None  # for a slot: its index
        # What only this backend knows (a git branch's commit and lease, ...), or None.
        self.detail: dict[str, Any] | None = None
        # Why slot files of the name were left out (a FIFO, another user's file): what a
        # ``--slots`` run refuses, so ``busy(slots)`` does; the plain lock is another file.
        self.refused_slots: list[str] = []

    @property
    def held(self) -> bool:
        return self.state == "held"

    def busy(self, slots: int | None = None) -> bool:
        """Would a caller wait: the lock is held, or (``slots``: a ``--slots N`` caller)
        every one of the name's first N slots is. The two are separate locks."""
        if slots is None:
            return self.held
        if self.refused_slots:
            from ..errors import UnsafeLockFile

            raise UnsafeLockFile(self.refused_slots[0])
        return 0 < slots <= len(self.slots) and all(s.held for s in self.slots[:slots])

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        del out["refused_slots"]  # said on stderr (a warning), or refused with --slots
        out["holders"] = [h.as_dict() for h in self.holders]
        out["waiters"] = [w.as_dict() for w in self.waiters]
        out["queue_length"] = len(self.waiters)
        out["slots"] = [s.as_dict() for s in self.slots]
        out["slots_in_use"] = sum(1 for s in self.slots if s.held)
        return out


class HoldInfo:
    """A hold that was taken: where, by which process (None for a persistent hold), the
    token that releases it, and how long it waited."""

    __slots__ = ("ack_fd", "lock_file", "name", "pid", "token", "waited")

    def __init__(
        self,
        name: str,
        lock_file: str,
        pid: int | None,
        token: str,
        waited: float,
        ack_fd: int | None = None,
    ) -> None:
        self.name, self.lock_file, self.pid = name, lock_file, pid
        self.token, self.waited = token, waited
        # A holder process waits on this pipe for word that the token reached someone
        # (``holds.start.delivered``); closed without it, the holder ends the hold.
        self.ack_fd = ack_fd


class Released:
    """What ``release`` did. ``found`` False: no lock of that name exists there at all;
    ``was_held`` False: it exists and is free (nothing to release)."""

    __slots__ = ("found", "held_seconds", "holder", "lock_file", "pid", "was_held")

    def __init__(
        self,
        lock_file: str,
        was_held: bool,
        pid: int | None = None,
        held_seconds: float | None = None,
        *,
        found: bool = True,
        holder: str | None = None,
    ) -> None:
        self.lock_file, self.was_held, self.pid = lock_file, was_held, pid
        self.held_seconds, self.found, self.holder = held_seconds, found, holder
