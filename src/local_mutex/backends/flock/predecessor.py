"""A lock file new at the path while the kernel still holds the lock on the one deleted
from it: a tmp cleaner struck in the tick before the holder noticed (``putback``).

By the file alone a newcomer cannot tell such a path from a free one, but the file says when
to ask the kernel: one we just created, or one we took with a record left in it. Then
``/proc/locks`` tells (``held_elsewhere``), and the lock on the deleted file is

- an enclosing run's (a nested call): we run inside it, as inside any enclosing holder;
- our job's hold's (``run --reentrant``): its holder takes the new file within a tick; we let
  it, never locking the file meanwhile, and then join the hold as usual;
- anyone else's: we keep the new file locked, so that nobody newer slips in, and wait in the
  kernel for the deleted file's lock, opened through ``/proc/PID/fd``, within our wait
  ceiling. The file carries a record meanwhile, so that whoever takes it after we gave up
  asks again. (The holder finds the new file taken and says so; a hold ends.)
"""

from __future__ import annotations

import os
import time

from ... import nesting
from . import kernel, record
from .proclocks import KernelLock, held_elsewhere, key_of, read_proc_locks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ...ui.lines import Reporter
    from .lock import FlockLock

# How long a hold gets to take the new file: its holder looks every 0.1 s.
ADOPT_WITHIN = 1.0
# Files deleted from the path one after another, each still locked: waited out in turn.
_MAX_PREDECESSORS = 16


class Predecessor:
    """A granted lock on a file that was at the path, as the kernel lists it."""

    def __init__(self, lock: KernelLock, through: str, file: tuple[int, int]) -> None:
        self.lock = lock
        self.through = through  # /proc/PID/fd/N: opens the deleted file
        self.file = file  # (device, inode), as LOCAL_MUTEX_HELD names it
        # Who holds it now: its taker (the pid /proc/locks names) may have exited since.
        self.pid = int(os.path.basename(os.path.dirname(os.path.dirname(through))))

    @property
    def key(self) -> str:
        return "{}:{}".format(*self.file)

    def record(self) -> dict[str, Any] | None:
        return record.read_record(self.through, through_proc=True)

    def holder(self) -> dict[str, Any]:
        """For messages: its record (if it wrote one) with the pid the kernel names."""
        return {**(self.record() or {}), "pid": self.pid}


def find(path: str, fd: int) -> Predecessor | None:
    """A lock still held on a file deleted or renamed from ``path`` (``fd``: the file
    there now, ours). Only locks on the path's device can be such: renames stay on it."""
    locks = read_proc_locks()
    if not locks:
        return None
    here = key_of(os.fstat(fd))
    candidates = [k for k in locks if k.key[:2] == here[:2] and k.key != here]
    if not candidates:
        return None
    from .state import recorded_at  # a rare path: what status uses too

    # As the holder's /proc/PID/fd link spells it: whatever symlinks the lock dir went through.
    path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    found = held_elsewhere(path, candidates, recorded_at(path))
    if found is None:
        return None
    lock, through = found
    try:
        st = os.stat(through)
    except OSError:
        return None  # its holder let go meanwhile
    return Predecessor(lock, through, (st.st_dev, st.st_ino))


def enclosing(lock: FlockLock, env: Mapping[str, str]) -> tuple[int, str] | None:
    """Inside a run whose lock file was deleted: that run's lock, found through the kernel,
    encloses us (``None``: not ours, or none). Asked of a file we created (the holder had
    not put one back yet) or one somebody holds: the holder, or -- once a hold ended and
    left its lock to the run we are in -- the guardian waiting for our own command."""
    if not lock.fresh and not _locked(key_of(os.fstat(lock.fd))):
        return None  # free: taking it waits for nobody
    found = find(lock.path, lock.fd)
    inside = None if found is None else nesting.enclosing_hold(env, found.key)
    if found is not None and inside is not None:
        _mark_unlocked(lock, found)  # it stays unlocked until the holder takes it
    return inside


def let_our_hold_adopt(lock: FlockLock, env: Mapping[str, str], token: str | None) -> None:
    """If the deleted file's lock is our job's hold's, give its holder the moment it needs
    to take the new file (our own lock on it would end the hold)."""
    from ...identity import owned

    found = find(lock.path, lock.fd)
    if found is None or not owned(found.record(), env, token):
        return
    _mark_unlocked(lock, found)  # it stays unlocked until the holder takes it
    here = key_of(os.fstat(lock.fd))
    deadline = time.monotonic() + ADOPT_WITHIN
    while time.monotonic() < deadline:
        # Its record goes in right after it locks: a hold is known by its record.
        rec = record.read_record_fd(lock.fd)
        if _locked(here) and rec is not None and rec.get("pid") != os.getpid():
            return
        time.sleep(0.01)


def _locked(key: tuple[int, int, int]) -> bool:
    return any(k.key == key and not k.depth for k in read_proc_locks() or ())


def wait_out(
    lock: FlockLock, wait: float | None, reporter: Reporter | None
) -> tuple[bool, dict[str, Any] | None]:
    """Holding the file at the path: wait for every lock still held on a file deleted from
    it (or renamed away). (Whether there was one to wait for; None once none is left -- or
    it is an enclosing run's: waiting for it would wait for ourselves -- else, the ceiling
    passed, the holder of the one still held.)"""
    deadline = None if wait is None else time.monotonic() + wait
    if lock.fresh:  # marked before the look, which takes a while: should we die meanwhile
        _mark(lock, None)
    said = False
    for _ in range(_MAX_PREDECESSORS):
        found = find(lock.path, lock.fd)
        if found is None or nesting.enclosing_hold(lock.env, found.key) is not None:
            break
        if not said:
            said = True
            _mark(lock, found)  # ours to write: we hold the file
            if reporter is not None:
                reporter.warning(
                    f"lock file {lock.path!r} of {lock.label} was deleted while pid "
                    f"{found.pid} held it; waiting for that lock to end"
                )
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not _outwait(found, lock.shared, remaining):
            return True, found.holder()
    record.clear_record(lock.fd)  # ours now: no mark for the next taker to ask about
    return said, None


def _mark(lock: FlockLock, found: Predecessor | None) -> None:
    """A record in the new file, so that whoever takes it before the deleted file's holder
    does (or after we gave up, or died) asks the kernel too."""
    from ...identity import holder_record

    if found is None:
        message = "looking for a lock still held on a file deleted from here"
    else:
        message = f"pid {found.pid} holds this lock on a file deleted from here"
    rec = holder_record(
        lock.label, "", shared=lock.shared, env=lock.env, extra={"message": message}
    )
    try:
        record.write_record(lock.fd, rec, lock.path)
    except Exception:  # a full disk: we wait all the same
        pass


def _mark_unlocked(lock: FlockLock, found: Predecessor) -> None:
    """Mark a file we do not hold, unless its holder took it already: a holder that takes
    it in the instant between our look and our write loses its record to our mark (``status``
    then names us; a ``run --reentrant`` then waits as anyone would)."""
    if not _locked(key_of(os.fstat(lock.fd))):
        _mark(lock, found)


def _outwait(found: Predecessor, shared: bool, timeout: float | None) -> bool:
    """Wait for the lock on the deleted file in the kernel (True once it is free to us)."""
    try:
        fd = os.open(found.through, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return True  # its holder let go meanwhile
    except PermissionError:  # another user's process: its descriptors are not ours to open
        return _poll(found.lock.key, timeout)
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != found.file:
            return True  # the descriptor number was reused: that lock went
        with kernel.interruptible():
            return kernel.wait_lock(fd, shared=shared, timeout=timeout)
    finally:
        os.close(fd)  # never kept: it is a deleted file


def _poll(key: tuple[int, int, int], timeout: float | None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    with kernel.interruptible():
        while _locked(key):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
    return True
