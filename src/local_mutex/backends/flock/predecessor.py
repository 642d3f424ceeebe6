"""A lock file new at the path while the kernel still holds the lock on the one deleted
from it: a tmp cleaner struck in the tick before the holder noticed (``putback``).

By the file alone a newcomer cannot tell such a path from a free one, but the file says when
to ask: a new one appears with a mark in it (``lockdir.new_file_mark``), and one left with a
record in it had a holder that died or gave up. Whoever takes such a file asks the kernel
(``/proc/locks``, ``held_elsewhere``), and the lock on the deleted file is

- an enclosing run's (a nested call): we run inside it, as inside any enclosing holder --
  found through that run's own descriptors (``ancestry``), which is cheaper and asked of
  every nested call whose enclosing runs hold other files than the one at the path;
- our job's hold's (``run --reentrant``): its holder takes the new file within a tick; we let
  it, never locking the file meanwhile, and then join the hold as usual (where a newcomer
  took the new file first, on the deleted file: ``joining.join_lost_hold``);
- anyone else's: we keep the new file locked, so that nobody newer slips in, and wait in the
  kernel for the deleted file's lock, opened through ``/proc/PID/fd``, within our wait
  ceiling. The file carries a record meanwhile, so that whoever takes it after we gave up
  asks again. (The holder finds the new file taken and says so; a hold goes on, and takes
  the file at the path back once it is free.)
"""

from __future__ import annotations

import os
import time

from ... import _proc, nesting
from ...errors import Interrupted
from . import kernel, record
from .lockdir import as_proc_names_it, is_file_at
from .proclocks import KernelLock, held_elsewhere, key_of, read_proc_locks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Mapping
    from typing import Any

    from ...ui.lines import Reporter
    from .lock import FlockLock

# How long a hold gets to take the new file: its holder looks every 0.1 s.
ADOPT_WITHIN = 1.0
ADOPT_LEAST = 0.3  # within a shorter --wait, or --no-wait
# Files deleted from the path one after another, each still locked: waited out in turn.
_MAX_PREDECESSORS = 16
# While waiting for a predecessor: how often to look whether our own file is still at the
# path (``_wait_while_at_path``).
_LOOK_AGAIN = 0.25


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


def find(
    path: str, fd: int, skip: Collection[tuple[int, int, int]] = (), any_owner: bool = False
) -> Predecessor | None:
    """A lock still held on a file deleted or renamed from ``path`` (``fd``: the file
    there now, ours), but none in ``skip``; on another user's file only if ``any_owner``
    (``proclocks.held_elsewhere``)."""
    return _find(path, key_of(os.fstat(fd)), skip, any_owner)


def lost_hold(path: str) -> tuple[int, dict[str, Any]] | None:
    """A live hold that holds a file deleted or renamed from ``path`` (and so not the file
    there now, if any): its holder's pid and record (for ``release``)."""
    try:
        here = key_of(os.stat(path, follow_symlinks=False))
    except OSError:
        here = None
    found = find_hold(path, here)
    rec = None if found is None else found.record()
    if found is None or rec is None or not isinstance(rec["pid"], int):
        return None
    # The pid a record names is only a claim: it must hold that very lock (a pid reused
    # since, or a record planted to have another process signalled, does not).
    return (rec["pid"], rec) if _proc.holds_lock(rec["pid"], {found.file}) else None


def find_hold(path: str, here: tuple[int, int, int] | None) -> Predecessor | None:
    """Of the locks held on files deleted from ``path`` (a fast tmp cleaner leaves several:
    the newcomers' files too), a hold's."""
    skip: set[tuple[int, int, int]] = set()
    for _ in range(_MAX_PREDECESSORS):
        found = _find(path, here, skip)
        if found is None:
            return None
        rec = found.record()
        if rec is not None and rec.get("hold") is True:
            return found
        skip.add(found.lock.key)
    return None


def _find(
    path: str,
    here: tuple[int, int, int] | None,
    skip: Collection[tuple[int, int, int]],
    any_owner: bool = False,
) -> Predecessor | None:
    """Only locks on the path's device can be such: renames stay on it."""
    locks = read_proc_locks()
    if not locks:
        return None
    if here is None:
        try:
            device = os.stat(os.path.dirname(path) or ".").st_dev
        except OSError:
            return None
        on = (os.major(device), os.minor(device))
    else:
        on = here[:2]
    candidates = [k for k in locks if k.key[:2] == on and k.key != here and k.key not in skip]
    path = as_proc_names_it(path)
    for _ in range(_MAX_PREDECESSORS):
        found = (
            held_elsewhere(path, candidates, record.recorded_path, any_owner)
            if candidates
            else None
        )
        if found is None:
            return None
        lock, through = found
        try:
            st = os.stat(through)
            if os.readlink(through) != path:
                return Predecessor(lock, through, (st.st_dev, st.st_ino))
        except OSError:
            pass  # its holder let go meanwhile
        # Or the file at the path now (ours deleted meanwhile, another's there): neither
        # hides a lock still held on a file deleted before.
        candidates = [k for k in candidates if k.key != lock.key]
    return None


def _worth_a_look(lock: FlockLock) -> bool:
    """Created by us, or with a mark in it (a new file's, a waiting newcomer's): not the
    hold's record a run inside a hold finds in the file its hold holds."""
    if lock.fresh:
        return True
    if record.only_shared_mark(lock.fd, lock.path):  # known as the acquire knows it
        return False
    rec = record.read_record_fd(lock.fd)
    return rec is not None and not rec.get("hold")


def let_our_hold_adopt(
    lock: FlockLock, env: Mapping[str, str], token: str | None, wait: float | None
) -> int | None:
    """If the deleted file's lock is our job's hold's, give its holder the moment it needs
    to take the new file (our own lock on it would end the hold). The holder's pid if it
    did not within that moment (or ``wait``): stopped, it cannot share its lock with us
    either."""
    from ...identity import owned

    if not _worth_a_look(lock):
        return None
    found = find(lock.path, lock.fd)
    rec = None if found is None else found.record()
    if found is None or rec is None or not owned(rec, env, token):
        return None
    holder = rec.get("pid")
    if not isinstance(holder, int) or not _proc.holds_lock(holder, {found.file}):
        # Its holder gone, and what ran inside the hold still holding its lock: the hold
        # is over, and its lock is waited for as anyone's.
        return None
    here = key_of(os.fstat(lock.fd))
    # Even --no-wait gives a running hold its tick: the lock is ours, not another's.
    deadline = time.monotonic() + (
        ADOPT_WITHIN if wait is None else min(ADOPT_WITHIN, max(wait, ADOPT_LEAST))
    )
    while True:
        if not is_file_at(lock.path, lock.fd):
            return None  # deleted in turn: nothing for the hold to take; ask it at the path
        # Its record goes in right after it locks: a hold is known by its record.
        takers = {k.pid for k in read_proc_locks() or () if k.key == here and not k.depth}
        now = record.read_record_fd(lock.fd)
        if takers and now is not None and now.get("hold"):
            return None
        if takers - {found.pid}:  # another caller has the new file: our hold never will
            return None
        if time.monotonic() >= deadline:
            return holder if _proc.holds_lock(holder, {found.file}) else None
        time.sleep(0.01)


def _locked(key: tuple[int, int, int]) -> bool:
    return any(k.key == key and not k.depth for k in read_proc_locks() or ())


def wait_out(
    lock: FlockLock, wait: float | None, reporter: Reporter | None
) -> tuple[bool, dict[str, Any] | None]:
    """Holding the file at the path: wait for every lock still held on a file deleted from
    it (or renamed away). (Whether to look at the path again -- we waited, or it names
    another file now --; None once no lock is left to wait for -- or it is an enclosing
    run's: waiting for it would wait for ourselves -- else, the ceiling passed, the holder
    of the one still held.)"""
    deadline = None if wait is None else time.monotonic() + wait
    said = False
    passed: set[tuple[int, int, int]] = set()  # shared locks a shared lock of ours joins
    for _ in range(_MAX_PREDECESSORS):
        if not is_file_at(lock.path, lock.fd):
            return True, None  # deleted in turn: waiting for what replaced it would deadlock
        found = find(lock.path, lock.fd, passed, lock.allow_other_owner)
        if found is None or nesting.enclosing_hold(lock.env, found.key) is not None:
            break
        fd = _open(found)
        if fd == _GONE:
            continue  # its holder let go meanwhile
        if fd is None:  # another user's process: ask the kernel's list until it is gone
            said = _say(lock, found, reporter, said)
            if not _poll(found.lock.key, _left(deadline)):
                return True, found.holder()
            continue
        try:
            if kernel.try_lock(fd, shared=lock.shared):
                if lock.shared and _locked(found.lock.key):
                    passed.add(found.lock.key)  # shared beside shared: still held, though
                continue
            said = _say(lock, found, reporter, said)
            got = _wait_while_at_path(lock, fd, deadline)
            if got is None:
                return True, None  # our file is gone from the path: start over
            if not got:
                return True, found.holder()
        finally:
            os.close(fd)  # never kept: it is a deleted file
    if not passed:  # ours alone now: no mark for the next taker to ask about
        record.clear_record(lock.fd)
    return said or not is_file_at(lock.path, lock.fd), None


def _wait_while_at_path(lock: FlockLock, fd: int, deadline: float | None) -> bool | None:
    """Wait for the predecessor's lock (True), until ``deadline`` (False) -- or until our
    own file is gone from the path too (None): a tmp cleaner deleting faster than anyone
    looks can make two waiters each other's predecessors, each keeping its own file locked
    while it waits for the other's. The one whose file is gone lets go. A lock our own
    description holds is looked at again (``ancestry.looking_again``)."""
    again = None
    if lock.waits_on_us is not None:
        from .ancestry import looking_again

        again = looking_again(lock)
    while True:
        left = _left(deadline)
        ceiling = _LOOK_AGAIN if left is None else min(left, _LOOK_AGAIN)
        with kernel.interruptible():
            if kernel.wait_lock(fd, shared=lock.shared, timeout=ceiling):
                return True
        if not is_file_at(lock.path, lock.fd):
            return None
        if left is not None and left <= _LOOK_AGAIN:
            return False
        if again is not None:
            with kernel.interruptible():
                again()


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _say(lock: FlockLock, found: Predecessor, reporter: Reporter | None, said: bool) -> bool:
    """Once: the mark in our file (whoever takes it should we give up asks too), and why
    we wait."""
    if said:
        return True
    from ...identity import holder_record

    message = f"pid {found.pid} holds this lock on a file deleted from here"
    extra = {"message": message, "lock_file": as_proc_names_it(lock.path)}
    mark = holder_record(lock.label, "", shared=lock.shared, env=lock.env, extra=extra)
    try:
        record.write_record(lock.fd, mark, lock.path)
    except Interrupted:  # a stop signal meanwhile: for the wait, not lost here
        raise
    except Exception:  # a full disk: we wait all the same
        pass
    if reporter is not None:
        reporter.warning(
            f"lock file {lock.path!r} of {lock.label} was deleted while pid {found.pid} "
            "held it; waiting for that lock to end"
        )
    return True


_GONE = -1


def _open(found: Predecessor) -> int | None:
    """The deleted file, opened through its holder's descriptor: ours to wait on. None if
    that is not ours to open (another user's process); ``_GONE`` if its holder let go."""
    try:
        fd = os.open(found.through, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except PermissionError:
        return None
    except OSError:
        return _GONE
    if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != found.file:
        os.close(fd)  # the descriptor number was reused: that lock went
        return _GONE
    return fd


def _poll(key: tuple[int, int, int], timeout: float | None) -> bool:
    """Until the lock is gone from the kernel's list. Not often: each read of /proc/locks
    takes the kernel's file-lock semaphore for writing, which every flock() waits on."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with kernel.interruptible():
        while _locked(key):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.25)
    return True
