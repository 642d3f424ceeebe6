"""A hold of this very job (or token) that has the lock busy: find it, and take a share of
its lock, so that a ``run --reentrant`` inside it holds the lock as the hold does."""

from __future__ import annotations

import os
import time

from ... import _proc
from . import kernel, record
from .lockdir import file_id, names_inode

# Asking a hold for its lock again once it did not answer: it may have ended meanwhile.
JOIN_TRIES = 2
# The least time a join gets in all, whatever ``--wait``: a running holder answers within
# a tick; a stopped one never does.
JOIN_LEAST = 1.0
# A holder that gave no share because it was killed as we asked is gone a moment later;
# one that stays silent (stopped) takes the whole wait for its answer to fail, not a blink.
_DYING = 0.5
_BLINK = 0.1

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from .lock import FlockLock


def our_hold(
    lock: FlockLock, path: str, env: Mapping[str, str], token: str | None
) -> dict[str, Any] | None:
    """The record of a live hold of ours that has the lock at ``path`` busy."""
    from ...identity import owned

    if path == lock.path:
        fd = lock.fd
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
    try:
        if kernel.try_lock(fd):
            kernel.unlock(fd)
            return None
    finally:
        if fd != lock.fd:
            os.close(fd)
    rec = record.read_record(path)
    if rec is None or not owned(rec, env, token) or not isinstance(rec.get("pid"), int):
        return None
    if not _proc.running(rec["pid"]):
        return None  # a record its holder left behind (dead, or a zombie) is not a hold
    return rec


def join_ours(
    lock: FlockLock, paths: list[str], env: Mapping[str, str], token: str | None, wait: float | None
) -> int | None:
    """The pid of a hold of ours that has one of ``paths`` busy, its lock now shared with
    us (``lock.join_failed``: it did not share); None when there is none, or it ended as
    we asked it (killed then: a zombie a moment, it answers nothing, and is no hold)."""
    for path in paths:
        rec, dying = None, False
        for _ in range(JOIN_TRIES):
            rec = our_hold(lock, path, env, token)
            if rec is None:
                break
            asked = time.monotonic()
            if join(lock, rec, path, env, token, wait):
                return int(rec["pid"])
            dying = time.monotonic() - asked < _BLINK  # refused at once: going, or gone
        if rec is not None and not _ended(int(rec["pid"]), _DYING if dying else 0.0):
            return int(rec["pid"])
    # The plain lock's file, taken by a newcomer that waits for our hold on the file deleted
    # from the path (a tmp cleaner): the hold's lock is there.
    return join_lost_hold(lock, env, token, wait) if paths == [lock.path] else None


def _ended(pid: int, grace: float) -> bool:
    deadline = time.monotonic() + grace
    while _proc.running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def join(
    lock: FlockLock,
    rec: Mapping[str, Any],
    path: str,
    env: Mapping[str, str],
    token: str | None,
    wait: float | None = None,
    file: tuple[int, int] | None = None,
) -> bool:
    """Take a share of the hold's lock; False if it did not give one (where holds
    can share at all: elsewhere a run inside a hold holds nothing, as documented). Each
    of the ``JOIN_TRIES`` waits for the holder's answer half the ``wait`` ceiling at most
    (but a second in all even for ``--no-wait``: a running holder answers within a tick)."""
    from ...identity import job_identity
    from . import share

    digest = rec.get("token_sha256")
    if not share.SUPPORTED or not isinstance(digest, str):
        return True
    lock.join_failed = True  # until the holder's descriptions are ours
    within = (
        share.TIMEOUT if wait is None else min(share.TIMEOUT, max(wait, JOIN_LEAST) / JOIN_TRIES)
    )
    got = share.join(int(rec["pid"]), digest, token, job_identity(env), within)
    if got is None:
        return False
    conn, fds, name = got
    # Only what really is the hold's lock on this very file: a description of the
    # file at the path (or of ``file``, deleted from it: ``join_lost_hold`` -- unless the
    # hold put a file back at the path meanwhile, and shares that one) that holds the lock
    # already (taking it again is then a no-op).
    shared = rec.get("mode") == "shared"
    if not any(
        (names_inode(path, fd) or (file is not None and file_id(fd) == file))
        and kernel.try_lock(fd, shared=shared)
        for fd in fds
    ):
        for fd in fds:
            os.close(fd)
        share.leave(conn)
        return False
    lock.joined, lock.join_failed = (conn, fds), False
    lock.hold_run = name
    return True


def join_lost_hold(
    lock: FlockLock, env: Mapping[str, str], token: str | None, wait: float | None
) -> int | None:
    """Our job's hold that keeps its lock on a file deleted from the path, the file at the
    path taken by another (``putback``): join it there, as at the path. Its pid
    (``lock.join_failed``: it did not share), or None if there is none. Asked of every
    ``run --reentrant`` that found no hold at the path, a file without a mark too (another
    program may have taken it): /proc/locks, once."""
    from ...identity import owned
    from .predecessor import find_hold
    from .proclocks import key_of

    # The file at the path now, not ours: a cleaner may have deleted ours from it as we
    # looked -- the very file the hold holds on.
    try:
        here = key_of(os.stat(lock.path, follow_symlinks=False))
    except OSError:
        here = None
    found = find_hold(lock.path, here)
    rec = None if found is None else found.record()
    if found is None or rec is None or rec.get("pid") != found.pid:
        return None
    if not owned(rec, env, token):
        return None
    join(lock, rec, lock.path, env, token, wait, file=found.file)
    return found.pid
