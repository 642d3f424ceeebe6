"""Letting go of a lock on a git remote: the unlock by compare-and-swap, and the undo of a
lock push that a stop signal cut short.

A refused push is no proof that the branch changed hands: a server may refuse for a
moment (a ref lock held by a concurrent update or a ``git gc``). So after a refusal the
branch is read again, and only a branch that moved counts as taken by someone else.
"""

from __future__ import annotations

import time

from ..._fastsignal import quiet_stops
from ...errors import LocalMutexError, LockLost, NotOurHold, Unavailable
from ...identity import owned, utc_stamp
from .protocol import RemoteState, describe, format_message, parse_message

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .lock import GitLock

_ATTEMPTS = 5
# A refusal while the branch stayed as it was: wait this long before the next try,
# doubled each time (0.1 + 0.2 + 0.4 + 0.8 s at most), so a brief one is outlasted.
_REFUSED_PAUSE = 0.1
# From a stop signal that cut a lock push short, how long undoing it may take: within the
# 7.5 s the GitHub runner leaves between its SIGINT and its SIGTERM.
UNDO_BUDGET = 5.0


def unlock(
    lock: GitLock,
    ours: RemoteState | None,
    *,
    force: bool,
    delete_branch: bool,
    token: str | None,
) -> RemoteState | None:
    """Unlock (or delete the branch) by CAS; only the holder unless ``force``. Returns the
    state that was released, or None when it was not locked."""
    current = ours if ours is not None else lock.read()
    refused = 0  # pushes refused while the branch did not move
    for _ in range(_ATTEMPTS):  # only a concurrent renew or takeover moves it under us
        if current.oid is None or current.state != "lock":
            return None
        if (
            ours is None
            and current.body.get("hold") is not True
            and current.expires_at
            and current.locked
        ):
            # A run's leased lock (as PostgreSQL): its command still runs; --force or not,
            # unlocking it would let a second holder in beside it.
            raise NotOurHold(
                f"remote lock {lock.label} is held by a running command ({describe(current)}); "
                "it ends with the command, or when its lease runs out"
            )
        if (
            ours is None
            and not force
            and not owned({"hold": True, **current.body}, lock.backend.env, token)
        ):
            raise NotOurHold(
                f"remote lock {lock.label} is held by {describe(current)}; "
                "release it with its token ($LOCAL_MUTEX_HOLD_TOKEN), from its job, or --force"
            )
        lock.backend.pushed.pop(lock.ref, None)
        new: str | None = None
        text = ""
        if not delete_branch:
            keep = ("github_actions_workflow_run_url", "pull_request_number")
            body = {k: v for k, v in current.body.items() if k in keep}
            body.update(lock._body({"released_holder_id": current.holder_id}))
            text = format_message("unlock", lock.backend.actor, current.message, body)
            new = lock.git.commit(current.oid, text, lock.backend.actor)
        if _pushed(lock, new, current.oid):
            if new is not None:
                lock.backend.pushed[lock.ref] = parse_message(new, text, lock.ref)
            return current
        seen = lock.git.fetch(lock.ref)
        if seen == new:  # it went through after all (None: the branch is gone, as asked)
            return current
        if seen == current.oid:
            refused += 1
            time.sleep(_REFUSED_PAUSE * 2 ** (refused - 1))
            continue
        if ours is not None and seen in lock.unanswered:  # a renewal of ours landed after all
            current = lock.read()
            if current.oid in lock.unanswered:
                continue  # (else the branch moved on meanwhile: not ours to unlock)
        if ours is not None:
            raise LockLost(f"remote lock {lock.label} changed hands before release")
        current = lock.read()
    if refused == _ATTEMPTS:
        raise Unavailable(
            f"remote lock {lock.label} not released: {refused} pushes to "
            f"{lock.backend.address} were refused while the branch stayed as it was "
            f"({lock.git.refusal or 'git gave no reason'}); it is still locked"
        )
    raise Unavailable(f"remote lock {lock.label} kept changing; release not done")


def _pushed(lock: GitLock, new: str | None, expected: str | None) -> bool:
    """The push went through. One whose answer was lost (the connection dropped after the
    server applied it) counts if the branch now is what it pushed."""
    try:
        return lock.git.push(lock.ref, new, expected)
    except Unavailable:
        try:
            landed = lock.git.fetch(lock.ref) == new
        except Unavailable:
            landed = False
        if landed:
            return True
        raise


def what_moved(lock: GitLock, oid: str | None) -> str:
    """What the branch became under a renewal of ours (``oid``: its tip now), for the lost
    lock's message: deleted, unlocked, or locked by someone else."""
    late = "before its renewal went through"
    if oid is None:
        return f"its branch was deleted {late}"
    try:
        state = parse_message(oid, lock.git.message(oid, lock.ref), lock.ref)
    except LocalMutexError:
        return f"the branch was changed {late}"
    if state.state != "lock":
        return f"it was unlocked by {describe(state)} {late}"
    return f"it was taken over by {describe(state)} {late}"


def withdraw(lock: GitLock, was: RemoteState, ours: RemoteState) -> str:
    """A stop signal came once our lock push (``was`` -> ``ours``) had started: it may land
    on the server whenever, even after we have given up on it. Make sure it does not
    leave the branch locked: if it landed, unlock it (CAS, as a release); if the branch is
    still as it was, push a commit of our own on it -- an unlock -- so that the push, should
    it still arrive, fails its compare-and-swap. Bounded by ``UNDO_BUDGET``; further stop
    signals meanwhile are not acted on. Returns what to add to the caller's message."""
    deadline = lock.git.deadline = time.monotonic() + UNDO_BUDGET
    try:
        with quiet_stops():
            for _ in range(_ATTEMPTS):
                seen = lock.git.fetch(lock.ref)
                if seen == ours.oid:
                    unlock(lock, ours, force=False, delete_branch=False, token=None)
                    return "; its lock push had gone through, and was undone"
                if seen != was.oid:
                    return ""  # moved on: a CAS from ``was`` can never land now
                if _fence(lock, was, ours):
                    return ""
                if time.monotonic() >= deadline:
                    break
            raise Unavailable("the branch kept changing")
    except LocalMutexError as exc:
        until = (
            f"until its lease runs out at {utc_stamp(ours.expires_at)}"
            if ours.expires_at is not None
            else "until released with --force"
        )
        return (
            f"; but its lock push to {lock.backend.address} had started and could not be "
            f"undone ({exc}): lock {lock.label} may stay held {until}"
        )
    finally:
        lock.git.deadline = None


def _fence(lock: GitLock, was: RemoteState, ours: RemoteState) -> bool:
    """An unlock commit on top of ``was``: the branch's meaning is unchanged (free, or an
    expired lease ended), but a push that expects ``was`` can no longer land."""
    body = lock._body({"withdrawn_holder_id": ours.holder_id})
    if was.state == "lock":
        body["released_holder_id"] = was.holder_id
    text = format_message("unlock", lock.backend.actor, was.message, body)
    fence = lock.git.commit(was.oid, text, lock.backend.actor)
    if not lock.git.push(lock.ref, fence, was.oid):
        return False
    lock.backend.pushed[lock.ref] = parse_message(fence, text, lock.ref)
    return True
