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

from ...errors import NotAcquired
from ...names import LOCK_SUFFIX
from ...ui.lines import describe_holder, duration
from . import kernel, record
from .lockdir import names_inode, open_lock_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...ui.lines import Reporter

MAX_SLOTS = 1024
_POLL_MIN, _POLL_MAX = 0.005, 0.1
# A waiter behind the head of the queue looks at the slots itself this often: a head that
# leaves a slot free that long is stopped (SIGSTOP, Ctrl-Z) or asks for a slot beyond ours.
_BEHIND_LOOK = 1.0


def _base(path: str) -> str:
    return path[: -len(LOCK_SUFFIX)]


def gate_path(lock_path: str) -> str:
    return _base(lock_path) + ".gate" + LOCK_SUFFIX


def slot_path(lock_path: str, index: int) -> str:
    return _base(lock_path) + f".slot{index}" + LOCK_SUFFIX


def existing_slots(lock_path: str) -> list[str]:
    """The slot files of a name, in index order (stops at the first missing index)."""
    out: list[str] = []
    while os.path.exists(slot_path(lock_path, len(out))) and len(out) < MAX_SLOTS:
        out.append(slot_path(lock_path, len(out)))
    return out


class Slot:
    """One taken slot: its descriptor, file and index."""

    __slots__ = ("dev", "fd", "index", "ino", "path")

    def __init__(self, fd: int, path: str, index: int) -> None:
        self.fd, self.path, self.index = fd, path, index
        st = os.fstat(fd)
        self.dev, self.ino = st.st_dev, st.st_ino


def _try_slots(lock_path: str, slots: int, allow_other_owner: bool) -> Slot | None:
    for index in range(slots):
        path = slot_path(lock_path, index)
        fd = open_lock_file(path, allow_other_owner=allow_other_owner)
        if kernel.try_lock(fd):
            if names_inode(path, fd):
                return Slot(fd, path, index)
            fresh = _retake(path, allow_other_owner, fd)
            if fresh is not None:
                return Slot(fresh, path, index)
            continue
        os.close(fd)
    return None


def _retake(path: str, allow_other_owner: bool, stale: int) -> int | None:
    """The slot file was replaced while we took it: try the file now at the path once."""
    os.close(stale)
    fd = open_lock_file(path, allow_other_owner=allow_other_owner)
    if kernel.try_lock(fd) and names_inode(path, fd):
        return fd
    os.close(fd)
    return None


def _busy_text(label: str, lock_path: str, slots: int) -> str:
    holders = []
    for index in range(slots):
        rec = record.read_record(slot_path(lock_path, index))
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
) -> tuple[Slot, float]:
    """Take a free slot (waiting in the gate's queue), returning it and the seconds waited."""
    start = time.monotonic()
    deadline = None if wait is None else start + wait
    gate = open_lock_file(gate_path(lock_path), allow_other_owner=allow_other_owner)
    announced = False
    slot: Slot | None = None
    try:
        with kernel.interruptible():
            if not kernel.try_lock(gate):
                announced = _announce(reporter, label, lock_path, slots)
                slot = _behind(gate, lock_path, slots, deadline, allow_other_owner)
                if slot is None and not kernel.try_lock(gate):
                    raise _not_acquired(label, lock_path, slots, start)
            # Head of the queue: look for a free slot until one frees or time runs out.
            delay = _POLL_MIN
            while True:
                slot = slot or _try_slots(lock_path, slots, allow_other_owner)
                if slot is not None:
                    break
                if not announced:
                    announced = _announce(reporter, label, lock_path, slots)
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise _not_acquired(label, lock_path, slots, start)
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
    gate: int, lock_path: str, slots: int, deadline: float | None, allow_other_owner: bool
) -> Slot | None:
    """Queue behind the head, asleep in the kernel, until we are the head (None, the gate
    ours), a slot stayed free while the head did not take it, or time ran out (None, after
    a last look: ``--no-wait`` behind a stopped head finds the slot it leaves free)."""
    while True:
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if remaining == 0:
            return _try_slots(lock_path, slots, allow_other_owner)
        if kernel.wait_lock(gate, timeout=_min(remaining, _BEHIND_LOOK)):
            return None
        slot = _try_slots(lock_path, slots, allow_other_owner)
        if slot is not None:
            return slot


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
