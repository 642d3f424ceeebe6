"""The detached holder behind ``local-mutex hold``: take the lock, say so, keep it.

It keeps the lock until SIGTERM (a local ``release``; a PostgreSQL one ends its session
instead), its TTL, or the end of the job it belongs to (the runner process it watches
exits), checking the lock all along (a lock file put back if deleted, a session watched).
Whatever ends it, the runs inside the hold end first. A lock it has lost ends it too: a
lease or session gone, or a deleted lock file whose path another caller took before it was
put back. Any death, SIGKILL included, frees the lock: nothing else runs under it.
"""

from __future__ import annotations

import _thread
import os
import select
import signal
import time
from functools import partial

from .. import _proc
from .._json import dumps, loads_object
from ..backends import open_backend
from ..backends.flock import record
from ..backends.flock.lock import FlockLock
from ..backends.flock.share import SUPPORTED, Sharing
from ..errors import (
    Interrupted,
    LockLost,
    NotAcquired,
    RecordNotWritten,
    Unavailable,
    ValidationError,
)
from ..held import Held
from ..identity import job_identity, new_token, token_hash, utc_stamp
from ..runspec import Options
from ..ui.lines import Reporter
from .start import DELIVERED, ENV_ACK_FD, ENV_READY_FD, ENV_SPEC

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..backends.base import Backend


# How often the waiting holder looks whether its caller is still there.
_CALLER_LOOK_MS = 200
# The most runs our record names of each kind (the latest): 256 names are 6 KiB.
_NAMED = 256


def _say(fd: int, text: str) -> None:
    """Our one answer to the caller; a caller killed meanwhile (EPIPE) hears nothing."""
    try:
        os.write(fd, text.encode("utf-8", "surrogateescape"))
    except OSError:
        pass
    finally:
        os.close(fd)


def _stop(signum: int, frame: object) -> None:
    # Once: a second SIGTERM must not cut short the end the first began (handing the lock
    # to the runs inside, or waiting for them).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    raise SystemExit(0)


def main() -> int:
    spec: dict[str, Any] = loads_object(os.environ.pop(ENV_SPEC, "")) or {}
    ready = int(os.environ.pop(ENV_READY_FD, "-1"))
    ack = int(os.environ.pop(ENV_ACK_FD, "-1"))
    sharing: Sharing | None = None
    try:  # from the handler on, a SIGTERM is answered (before it, it kills: as good)
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        env = dict(os.environ)
        token = new_token()
        ttl = spec.get("ttl")
        extra: dict[str, Any] = {"hold": True, "token_sha256": token_hash(token)}
        extra.update(job_identity(env) or {})
        if ttl:
            extra["expires_at"] = utc_stamp(time.time() + ttl)
        backend = open_backend(env=env, **spec.get("backend", {}))
        sharing = _sharing(backend, token, env)  # before the record tells where it is
        held = Held(
            backend,
            spec["name"],
            Options(wait=spec.get("wait"), slots=spec.get("slots"), message=spec.get("message")),
            command="local-mutex hold",
            env=env,
            extra=extra,
            watch=False,
            reporter=_waiting_lines(spec.get("report")),
        )
        taken: list[bool] = []
        if ack >= 0 and hasattr(select, "poll"):
            _thread.start_new_thread(_end_with_the_caller, (ack, taken))
        try:
            held.__enter__()
        finally:
            taken.append(True)
            _let_go_of_stderr()
    except Interrupted as exc:  # a signal to us, not to our caller (``kill`` of our pid)
        _say(ready, f"stopped {exc.signum}")
        return exc.exit_code
    except SystemExit:  # ``_stop``: SIGTERM before the wait itself began
        _say(ready, f"stopped {int(signal.SIGTERM)}")
        return 128 + signal.SIGTERM
    except NotAcquired as exc:
        _say(
            ready,
            "busy " + dumps({"message": str(exc), "holder": exc.holder, "waited": exc.waited}),
        )
        return exc.exit_code
    except (ValidationError, Unavailable, RecordNotWritten) as exc:
        kind = (
            "invalid"
            if isinstance(exc, ValidationError)
            else "record"
            if isinstance(exc, RecordNotWritten)
            else "unavailable"
        )
        _say(ready, f"{kind} " + dumps({"message": str(exc)}))
        return exc.exit_code
    lock_file = held.lock.lock_file if held.lock is not None else ""
    _say(ready, f"ok {token} {held.waited:.3f} {lock_file}")
    os.chdir("/")  # a long-lived daemon must not pin the caller's directory (or its mount)
    try:
        _keep(held, spec.get("anchor"), ttl, sharing, ack if ack >= 0 else None)
    except LockLost as exc:
        return exc.exit_code
    finally:
        if sharing is not None:
            if sharing.in_use() and isinstance(held.lock, FlockLock):
                # Theirs until the last command of a run inside ends: the file at the path
                # too, if a tmp cleaner made it one the runs did not join with.
                sharing.share_more(held.lock.at_path())
                held.lock.hand_over(_left_to(sharing))
            sharing.close()
        held.__exit__(None, None, None)
    return 0


def _waiting_lines(settings: Any) -> Reporter | None:
    """The caller's stderr is ours while we take the lock: its waiting lines (who holds it,
    how long we waited) are ``hold``'s, as a run's are its own; the rest is ``hold``'s to say."""
    if not isinstance(settings, dict):
        return None
    annotations, words = settings.get("annotations"), settings.get("words")
    return Reporter(
        actions=settings.get("actions") is True,
        quiet=settings.get("quiet") is True,
        only_contended=settings.get("only_contended") is not False,
        annotations=annotations if isinstance(annotations, str) else "never",
        words=words if isinstance(words, dict) else None,
    )


def _end_with_the_caller(ack: int, taken: list[bool]) -> None:
    """Our caller waits for our answer while we wait for the lock. Killed (SIGKILL, an OOM
    kill), it can never hand the token on, and its stderr -- ours while we wait -- must not
    stay open for whoever reads it: its end of the ack pipe closes, and we stop waiting."""
    poller = select.poll()
    poller.register(ack, select.POLLHUP | select.POLLERR)
    while not taken:
        gone = poller.poll(_CALLER_LOOK_MS)
        if gone and not taken:
            _let_go_of_stderr()
            os.kill(os.getpid(), signal.SIGTERM)  # as a caller stopped by a signal would
            return


def _let_go_of_stderr() -> None:
    """A daemon keeps nobody's stream open: a step that reads our caller's stderr (a
    runner, ``$(...)``) would wait for our end to see its end."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _sharing(backend: Backend, token: str, env: dict[str, str]) -> Sharing | None:
    """Where runs inside this hold ask for its lock (a lock on this machine, on Linux)."""
    if not SUPPORTED or backend.kind != "flock":
        return None
    try:
        return Sharing(token, job_identity(env))
    except OSError:
        return None  # runs inside the hold then hold nothing of their own, as elsewhere


def _keep(
    held: Held,
    anchor: int | None,
    ttl: float | None,
    sharing: Sharing | None,
    ack: int | None,
) -> None:
    """Until the TTL runs out or the anchor process exits (SIGTERM ends it earlier),
    looking at the lock every tick and answering runs that join the hold. And until the
    caller says the token reached its reader (``ack``, see ``start.delivered``): its end
    closed without that word -- the caller killed with the token in its hands -- means
    nobody has the token, and the hold must not outlive every way to release it."""
    deadline = None if not ttl else time.monotonic() + ttl
    watch = None
    if anchor:
        try:
            watch = os.pidfd_open(anchor)  # becomes readable when the process exits
        except (AttributeError, OSError):
            watch = None
    tick = held.lock.check_interval() if held.lock is not None else None
    said = b""
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return
        pause = _min(remaining, tick)
        if watch is None and anchor:
            if not _proc.exists(anchor):
                return
            pause = _min(pause, 1.0) or 1.0
        waitables: list[Any] = [w for w in (watch, sharing, ack) if w is not None]
        # A run's goodbye (or its end) is seen at once, and our record follows: a holder
        # killed a tick later would have left the lock to a run that was over.
        # (Not one select() cannot take: that run's end is seen at the next tick.)
        waitables += [c for c in sharing.inside if c.fileno() < 1024] if sharing else []
        ready: list[Any] = []
        if waitables:
            ready = select.select(waitables, [], [], pause)[0]
            if watch is not None and watch in ready:
                return
            if ack is not None and ack in ready:
                chunk = _read(ack)
                said += chunk
                if DELIVERED in said or not chunk:
                    os.close(ack)
                    ack = None
                    if DELIVERED not in said:
                        return
        else:
            time.sleep(3600.0 if pause is None else pause)
        # A release (SIGTERM) waits until what runs inside hold is settled: the holder's
        # end must neither unlock nor drop a description a run was just given.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            if tick is not None:
                # A file deleted under us and the new one taken first (a tmp cleaner): the
                # hold goes on all the same, as a run's command does, and takes the new
                # file once whoever took it lets go (``putback``).
                held.check()
            if sharing is not None and isinstance(held.lock, FlockLock):
                if sharing in ready:
                    sharing.serve(held.lock.at_path(), partial(_name_runs, held.lock, sharing))
                sharing.in_use()  # forget the runs that left: a descriptor each
                held.lock.given = sharing.joined_with()
                _name_runs(held.lock, sharing)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _name_runs(lock: FlockLock, sharing: Sharing) -> None:
    """Our record names the runs inside (``runs_inside``) and those that left without their
    goodbye (``left_runs``): their commands hold the lock, and once we are gone and cannot
    be asked, their own calls of it still run inside (``ancestry``). Rewritten as runs come
    and go; a record that cannot take them (a full disk) stays as it was, and is tried
    again at the next tick."""
    if lock.record is None:
        return
    names = {
        "left_runs": " ".join(list(sharing.dropped_runs)[-_NAMED:]),
        "runs_inside": " ".join(sharing.runs_inside()[-_NAMED:]),
    }
    new = dict(lock.record)
    for key, value in names.items():
        if value:
            new[key] = value
        else:
            new.pop(key, None)
    if new != lock.record and all(
        record.rewrite_record(fd, new, lock.record) for fd in lock.descriptions()
    ):
        lock.record = new


def _left_to(sharing: Sharing) -> list[str]:
    """The runs a hold's end leaves its lock to: those gone without a goodbye, those inside."""
    return [*list(sharing.dropped_runs)[-_NAMED:], *sharing.runs_inside()[-_NAMED:]]


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 64)
    except OSError:
        return b""


def _min(a: float | None, b: float | None) -> float | None:
    values = [v for v in (a, b) if v is not None]
    return min(values) if values else None
