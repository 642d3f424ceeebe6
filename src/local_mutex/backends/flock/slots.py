"""Counting semaphores: at most N holders of a name at once.

Files, next to the name's ordinary lock file ``local-mutex-<sha256>.lock``:
``local-mutex-<sha256>.gate.lock`` (the queue) and ``local-mutex-<sha256>.slot<i>.lock`` for
i in 0..N-1 (one flock each). Waiters queue in the kernel on the gate; only the head of the
queue holds the gate and looks for a free slot, so a crowd of waiters costs no CPU (the rest
look once a second, in case the head is stopped and leaves a free slot untaken). Slots
are separate from the name's plain lock: ``run NAME`` and ``run --slots N NAME`` do not
exclude each other. Callers that disagree on N share slots 0..min-1, so the larger N caps.
"""

from __future__ import annotations

import os
import time

from ... import nesting
from ...errors import NestingError, NotAcquired
from ...names import LOCK_SUFFIX
from ...ui.lines import describe_holder, duration
from . import kernel, record
from .lockdir import as_proc_names_it, names_inode, open_lock_file, open_or_create

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ...ui.lines import Reporter
    from .lock import FlockLock
    from .predecessor import Predecessor

    # Is the lock still held on a file deleted from this slot's path one we run inside?
    Ours = Callable[[str, Predecessor], bool] | None

MAX_SLOTS = 1024
_POLL_MIN, _POLL_MAX = 0.005, 0.1
# Missing slot files in a row past which a name has no more (``slots_to_look_at``).
_GAP = 8
# A waiter behind the head of the queue looks at the slots itself this often: a head that
# leaves a slot free that long is stopped (SIGSTOP, Ctrl-Z) or asks for a slot beyond ours.
_BEHIND_LOOK = 1.0


def _base(path: str) -> str:
    return path[: -len(LOCK_SUFFIX)]


def gate_path(lock_path: str) -> str:
    return _base(lock_path) + ".gate" + LOCK_SUFFIX


def slot_path(lock_path: str, index: int) -> str:
    return _base(lock_path) + f".slot{index}" + LOCK_SUFFIX


def slot_paths(lock_path: str, slots: int) -> list[str]:
    """The name's first ``slots`` slot files."""
    return [slot_path(lock_path, i) for i in range(min(slots, MAX_SLOTS))]


def slots_to_look_at(lock_path: str) -> list[str]:
    """Each slot file of a name up to the last one there, and the one after it: a tmp
    cleaner's deletion a moment ago leaves a gap, or takes the last (``release``,
    ``status``). Nothing where no slot file is there (a name never used with ``--slots``).
    Asked of each index in turn, up to ``_GAP`` missing in a row: listing the directory
    would cost ``status`` milliseconds in one of thousands of lock files."""
    last, index = -1, 0
    while index < MAX_SLOTS and index - last <= _GAP:
        if os.path.lexists(slot_path(lock_path, index)):
            last = index
        index += 1
    return slot_paths(lock_path, last + 2) if last >= 0 else []


class Slot:
    """One taken slot: its descriptor, file and index."""

    __slots__ = ("dev", "fd", "index", "ino", "path")

    def __init__(self, fd: int, path: str, index: int) -> None:
        self.fd, self.path, self.index = fd, path, index
        st = os.fstat(fd)
        self.dev, self.ino = st.st_dev, st.st_ino


def enclosing_slot(lock: FlockLock, env: Mapping[str, str], slots: int) -> tuple[int, str] | None:
    """An enclosing run (pid, mode) that holds one of the name's first ``slots`` slots: the
    file at its path, or one deleted from it (a tmp cleaner, before the put-back)."""
    paths, files = slot_paths(lock.path, slots), {}
    for path in paths:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        files[path] = (st.st_dev, st.st_ino)
        found = nesting.enclosing_hold(env, f"{st.st_dev}:{st.st_ino}", files[path])
        if found is not None:
            return found
    if not env.get(nesting.ENV_HELD):
        return None
    from .ancestry import held_by_ancestor, held_through_us

    found = held_by_ancestor({as_proc_names_it(p) for p in paths}, env)
    stuck: list[NestingError] = []  # slots we would wait for ourselves for
    ours: list[int] = []  # our own descriptors holding one: looked at again as we wait
    for path, file in files.items():  # a run whose keeper and supervisor died
        try:
            found = found or held_through_us(file, as_proc_names_it(path), env, lock.label, ours)
        except NestingError as exc:
            stuck.append(exc)
    if found is None and stuck and len(stuck) == slots:
        raise stuck[0]  # no other slot can come free for us
    lock.waits_on_us = env if ours and found is None else None
    return found


def _looking_again(lock: FlockLock, slots: int) -> Callable[[], None] | None:
    """For a wait for slots one of which our own description holds (``enclosing_slot``)."""
    if lock.waits_on_us is None:
        return None
    from .ancestry import looking_again

    return looking_again(lock, lambda lock, env: enclosing_slot(lock, env, slots))


def acquire_slot(
    lock: FlockLock, slots: int, wait: float | None, reporter: Reporter | None
) -> float:
    """``lock.acquire`` of a slot: the lock's file becomes the slot's; the seconds waited."""
    slot, waited = take_slot(
        lock.label,
        lock.path,
        slots,
        wait=wait,
        allow_other_owner=lock.allow_other_owner,
        reporter=reporter,
        ours=lambda path, found: _runs_beside(lock, path, found),
        again=_looking_again(lock, slots),
    )
    plain, lock.fd = lock.fd, slot.fd  # ours to let go (``close``) from here on
    os.close(plain)
    lock.path, lock.slot = slot.path, slot.index
    lock.lock_file = slot.path
    lock.held = True
    return waited


def _runs_beside(lock: FlockLock, path: str, found: Predecessor) -> bool:
    """A slot held on a file deleted from ``path`` by an enclosing run, or by our job's
    hold (``--reentrant``): we take the new file (the hold takes it back after us)."""
    from ...identity import owned
    from .ancestry import held_by_ancestor

    if lock.reentrant and owned(found.record(), lock.env, lock.token):
        return True
    return held_by_ancestor({as_proc_names_it(path)}, lock.env) is not None


def _try_slots(lock_path: str, slots: int, allow_other_owner: bool, ours: Ours) -> Slot | None:
    for index in range(slots):
        path = slot_path(lock_path, index)
        fd, created = open_or_create(path, allow_other_owner=allow_other_owner)
        if kernel.try_lock(fd):
            if names_inode(path, fd):
                if not _busy_after_all(path, fd, created, ours, allow_other_owner):
                    return Slot(fd, path, index)
            else:
                fresh = _retake(path, allow_other_owner, fd, ours)
                if fresh is not None:
                    return Slot(fresh, path, index)
                continue
        os.close(fd)
    return None


def _retake(path: str, allow_other_owner: bool, stale: int, ours: Ours) -> int | None:
    """The slot file was replaced while we took it: try the file now at the path once."""
    os.close(stale)
    fd, created = open_or_create(path, allow_other_owner=allow_other_owner)
    if (
        kernel.try_lock(fd)
        and names_inode(path, fd)
        and not _busy_after_all(path, fd, created, ours, allow_other_owner)
    ):
        return fd
    os.close(fd)
    return None


def _busy_after_all(path: str, fd: int, created: bool, ours: Ours, allow_other_owner: bool) -> bool:
    """Is the slot busy after all? A tmp cleaner deleted its file while a run held it,
    before that run's holder put one back (within a tick): the kernel still holds the lock
    on the deleted file (or the cleaner deleted ours while we looked). Asked, as for the
    plain lock (``predecessor``), of a new file (its mark) or one a holder left its record
    in; a released slot's file is empty. Let go, the new file is the holder's to take back.
    ``ours``: a lock we run inside after all (an enclosing run's, our job's hold's for
    ``--reentrant``)."""
    if not created and not os.fstat(fd).st_size:
        return False
    from .predecessor import find

    found = find(path, fd, any_owner=allow_other_owner)
    if found is not None and not (ours is not None and ours(path, found)):
        return True
    # Deleted in turn while we looked: its lock would exclude nobody (look again later).
    return not names_inode(path, fd)


def _busy_text(label: str, lock_path: str, slots: int) -> str:
    holders = []
    for index in range(slots):
        path = slot_path(lock_path, index)
        rec = record.read_record(path)
        if rec is not None and rec.get("pid") is None:  # a new file's mark: ask the kernel
            from .state import status_of_path

            held = status_of_path(path, None).holders
            rec = held[0].as_dict() if held else None
        if rec is not None:
            holders.append(f"slot {index}: {describe_holder(rec)}")
    return f"all {slots} slots of {label} are busy" + (
        " (" + "; ".join(holders) + ")" if holders else ""
    )


def take_slot(
    label: str,
    lock_path: str,
    slots: int,
    *,
    wait: float | None,
    allow_other_owner: bool,
    reporter: Reporter | None,
    ours: Ours = None,
    again: Callable[[], None] | None = None,
) -> tuple[Slot, float]:
    """Take a free slot (waiting in the gate's queue), returning it and the seconds waited.
    ``again``: called as we wait (``_looking_again``)."""
    start = time.monotonic()
    deadline = None if wait is None else start + wait
    gate = open_lock_file(gate_path(lock_path), allow_other_owner=allow_other_owner)
    announced = False
    slot: Slot | None = None
    try:
        with kernel.interruptible():
            if not kernel.try_lock(gate):
                announced = _announce(reporter, label, lock_path, slots)
                slot = _behind(gate, lock_path, slots, deadline, allow_other_owner, ours, again)
                if slot is None and not kernel.try_lock(gate):
                    raise _not_acquired(label, lock_path, slots, start)
            # Head of the queue: look for a free slot until one frees or time runs out.
            delay = _POLL_MIN
            while True:
                slot = slot or _try_slots(lock_path, slots, allow_other_owner, ours)
                if slot is not None:
                    break
                if not announced:
                    announced = _announce(reporter, label, lock_path, slots)
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise _not_acquired(label, lock_path, slots, start)
                if again is not None:
                    again()
                pause = delay if deadline is None else min(delay, deadline - now)
                time.sleep(max(pause, 0.0))
                delay = min(delay * 2, _POLL_MAX)
    except BaseException:
        if slot is not None:  # a stop just after we took it: an API caller lives on
            os.close(slot.fd)
        raise
    finally:
        os.close(gate)  # the next in the queue becomes the head
    # A slot free at once is no wait, as for the plain lock (``each`` reports only waits).
    waited = time.monotonic() - start if announced else 0.0
    try:
        if reporter is not None:  # may block on a full stderr: a stop can come meanwhile
            if not announced:
                reporter.waiting(label, None)
            else:
                reporter.acquired(f"{label} (slot {slot.index})", waited)
    except BaseException:
        os.close(slot.fd)
        raise
    return slot, waited


def _behind(
    gate: int,
    lock_path: str,
    slots: int,
    deadline: float | None,
    allow_other_owner: bool,
    ours: Ours,
    again: Callable[[], None] | None,
) -> Slot | None:
    """Queue behind the head, asleep in the kernel, until we are the head (None, the gate
    ours), a slot stayed free while the head did not take it, or time ran out (None, after
    a last look: ``--no-wait`` behind a stopped head finds the slot it leaves free)."""
    while True:
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if remaining == 0:
            return _try_slots(lock_path, slots, allow_other_owner, ours)
        if kernel.wait_lock(gate, timeout=_min(remaining, _BEHIND_LOOK)):
            return None
        slot = _try_slots(lock_path, slots, allow_other_owner, ours)
        if slot is not None:
            return slot
        if again is not None:
            again()


def _min(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)


def _announce(reporter: Reporter | None, label: str, lock_path: str, slots: int) -> bool:
    if reporter is not None:
        reporter.waiting(label, None, detail=_busy_text(label, lock_path, slots))
    return True


def _not_acquired(label: str, lock_path: str, slots: int, start: float) -> NotAcquired:
    waited = time.monotonic() - start
    return NotAcquired(
        f"lock {label} not acquired after waiting {duration(waited)}; "
        + _busy_text(label, lock_path, slots),
        None,
        waited,
    )
