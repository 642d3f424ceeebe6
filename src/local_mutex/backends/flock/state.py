"""Who holds a lock and who waits for it, read without taking the lock.

On Linux, /proc/locks joined with /proc/<pid>/fdinfo gives holders and the waiters' queue.
Elsewhere (or when /proc is unreadable) a non-blocking probe tells held from free and
nothing more. A lock file that ``run`` would refuse (a symlink, a FIFO, a file with other
links, another user's) is refused here too, with the same message.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time

from ... import _proc
from ...errors import CannotTell, Interrupted, InvalidName
from ...identity import utc_stamp
from ...names import LOCK_PREFIX, LOCK_SUFFIX, lock_filename
from ..base import Holder, LockStatus, Waiter
from . import record
from .guardian import is_guardian
from .lockdir import as_proc_names_it, refusal_for
from .proclocks import (
    KernelLock,
    all_fd_holders,
    fd_holds,
    held_elsewhere,
    key_of,
    read_proc_locks,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def _holder_from(pid: int, exclusive: bool, rec: Mapping[str, Any] | None, now: float) -> Holder:
    mode = "exclusive" if exclusive else "shared"
    ours = rec is not None and rec.get("pid") == pid
    command = None if ours else _proc.cmdline(pid)
    # A guardian stands for the run that wrote the record: told by that run's details.
    guardian = rec is not None and command is not None and is_guardian(command)
    if rec is not None and (ours or guardian):
        since = rec.get("since_epoch")
        since_f = float(since) if isinstance(since, (int, float)) else None

        def text(key: str) -> str | None:
            return None if rec.get(key) is None else str(rec[key])

        return Holder(
            pid=pid,
            mode=mode,
            command=text("command"),
            cwd=text("cwd"),
            host=text("host"),
            user=text("user"),
            since=None if since_f is None else utc_stamp(since_f),
            since_epoch=since_f,
            held_seconds=None if since_f is None else round(max(now - since_f, 0.0), 3),
            runner=text("runner"),
            job=text("job"),
            workflow=text("workflow"),
            run_url=text("run_url"),
            message=text("message"),
            source="guardian" if guardian else "record",
        )
    return Holder(pid=pid, mode=mode, command=command)


def _from_kernel(
    path: str,
    name: str | None,
    key: tuple[int, int, int],
    entries: list[KernelLock],
    boot: float | None,
    rec: Mapping[str, Any] | None = None,
) -> LockStatus:
    granted = [e for e in entries if e.depth == 0]
    queued = [e for e in entries if e.depth > 0]
    if not granted:
        return LockStatus(path, name, "free", "proc")
    now = time.time()
    if rec is None and any(e.exclusive for e in granted):
        rec = record.read_record(path)
    pids = [(e.pid, e.exclusive) for e in granted if fd_holds(e.pid, key)]
    if not pids:  # the pid that took it is gone; find who inherited the descriptor
        exclusive = granted[0].exclusive
        pids = [(pid, exclusive) for pid in all_fd_holders(key)]
    if not pids:  # a holder we cannot see into (another user's /proc): keep the kernel's pid
        pids = [(e.pid, e.exclusive) for e in granted]
    # One line per holder: a torn read of /proc/locks (or two shared descriptions) repeats.
    pids = list(dict.fromkeys(pids))
    holders = [_holder_from(pid, excl, rec, now) for pid, excl in pids]
    if name is None and rec is not None and any(h.source != "kernel" for h in holders):
        name = recorded_name(rec, path)
    waiters: list[Waiter] = []
    add_waiters(waiters, queued, boot)
    mode = "exclusive" if any(e.exclusive for e in granted) else "shared"
    return LockStatus(path, name, "held", "proc", mode, holders, waiters)


def add_waiters(waiters: list[Waiter], entries: list[KernelLock], boot: float | None) -> None:
    """The processes of ``entries`` (in their order), after ``waiters``, each once."""
    seen = {w.pid for w in waiters}
    for e in entries:
        if e.pid in seen:
            continue
        seen.add(e.pid)
        started = _proc.start_time(e.pid, boot)
        waiters.append(
            Waiter(
                pid=e.pid,
                mode="exclusive" if e.exclusive else "shared",
                position=len(waiters) + 1,
                command=_proc.cmdline(e.pid),
                started=None if started is None else utc_stamp(started),
                started_epoch=None if started is None else round(started, 3),
            )
        )


def add_gate_queue(waiters: list[Waiter], gate: str) -> None:
    """Who waits for a slot, after ``waiters``: the head of the queue (it holds the gate
    while it looks for a free slot), then the rest as the kernel lists them now (they
    rejoin that queue each time they look for themselves: no order to count on)."""
    locks = read_proc_locks()
    try:
        st = os.stat(gate, follow_symlinks=False)
    except OSError:
        return
    if locks is None or not stat.S_ISREG(st.st_mode):
        return  # no /proc/locks: waiters are unknown, as for any lock
    at_gate = [e for e in locks if e.key == key_of(st)]
    add_waiters(waiters, sorted(at_gate, key=lambda e: e.depth > 0), _proc.boot_time())


def recorded_name(rec: Mapping[str, Any], path: str) -> str | None:
    """The name a record gives, if it is the name of this file (or of its slots): anyone
    who can write a lock file in the dir writes its record, and ``list`` shows the name."""
    named = rec.get("name")
    if not isinstance(named, str):
        return None
    try:
        stem = lock_filename(named)[: -len(LOCK_SUFFIX)]
    except InvalidName:  # a surrogate that stands for no byte
        return None
    base = os.path.basename(path)
    return named if base == stem + LOCK_SUFFIX or base.startswith(stem + ".slot") else None


def slot_index(path: str) -> int | None:
    """A slot file's index, from its name (``….slot<i>.lock``), free or held, whatever its
    record says; None for any other file."""
    stem = os.path.basename(path)[: -len(LOCK_SUFFIX)]
    _, dot, index = stem.rpartition(".slot")
    return _proc.decimal(index, 4) if dot else None


def _probe(path: str, name: str | None) -> LockStatus:
    """Held or free by trying the lock without blocking; for systems without /proc/locks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return LockStatus(path, name, "free", "probe")
    except OSError as exc:
        raise CannotTell(f"cannot open lock file {path!r}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            exclusive = _held_exclusively(fd)
            rec = record.read_record_fd(fd)
            holders = []
            if rec is not None and isinstance(rec.get("pid"), int) and _proc.exists(rec["pid"]):
                holders.append(_holder_from(rec["pid"], exclusive, rec, time.time()))
                name = name or recorded_name(rec, path)
            mode = "exclusive" if exclusive else "shared"
            return LockStatus(path, name, "held", "probe", mode, holders)
        except OSError as exc:
            raise CannotTell(f"cannot probe lock file {path!r}: {exc.strerror}") from None
        return LockStatus(path, name, "free", "probe")
    finally:
        os.close(fd)


def _held_exclusively(fd: int) -> bool:
    """Of a held lock: does a shared try fail too? (A shared one taken is let go at once.)"""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def status_of_path(
    path: str, name: str | None = None, *, allow_other_owner: bool = True
) -> LockStatus:
    """The state of one lock file. Never creates it; on Linux never takes the lock."""
    st = _status_of(path, name, allow_other_owner)
    st.slot = slot_index(path)
    return st


def _status_of(path: str, name: str | None, allow_other_owner: bool) -> LockStatus:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return _missing(path, name)
    except OSError as exc:
        raise CannotTell(f"cannot stat lock file {path!r}: {exc.strerror}") from None
    refusal = refusal_for(st, path, allow_other_owner)
    if refusal is not None:
        raise refusal
    locks = read_proc_locks()
    if locks is None:
        return _probe(path, name)
    return _of_file(path, name, st, locks, _proc.boot_time())


def _of_file(
    path: str, name: str | None, st: os.stat_result, locks: list[KernelLock], boot: float | None
) -> LockStatus:
    """The file at the path, as the kernel lists it -- or, free with something in it, the
    lock still held on a file deleted from the path (``_held_deleted``)."""
    key = key_of(st)
    mine = [e for e in locks if e.key == key]
    # (Shared holders' line alone asks nothing: as an empty file, it was theirs and is free.)
    if st.st_size and not any(e.depth == 0 for e in mine) and not record.only_shared_mark_at(path):
        deleted = _held_deleted(path, name, locks, key)
        if deleted is not None:
            return deleted
    return _from_kernel(path, name, key, mine, boot)


def _missing(path: str, name: str | None) -> LockStatus:
    """No file at the path: free -- unless a holder's file was deleted under it (its
    holder puts one back within a moment; until then the truth is "held")."""
    locks = read_proc_locks()
    if locks is None:
        return LockStatus(path, name, "free", "probe")
    return _held_deleted(path, name, locks, None) or LockStatus(path, name, "free", "proc")


def _held_deleted(
    path: str, name: str | None, locks: list[KernelLock], here: tuple[int, int, int] | None
) -> LockStatus | None:
    """The lock still held on a file deleted from the path (or renamed away), if any. Asked
    where no file is at the path, and where the file there is free with something in it:
    a newcomer's mark (it gave up waiting for that lock), or a record whose writers are gone
    while their command holds the deleted file. Everyone who takes the file asks the same
    (``predecessor``), so the lock is held all the same."""
    others = [e for e in locks if e.key != here]
    found = held_elsewhere(as_proc_names_it(path), others, record.recorded_path)
    if found is None:
        return None
    lock, content = found
    entries = [e for e in locks if e.key == lock.key]
    rec = record.read_record(content, through_proc=True)
    return _from_kernel(path, name, lock.key, entries, _proc.boot_time(), rec)


# Deleted files still held that ``list`` looks for (each one more walk of /proc).
_MAX_DELETED = 64


def list_locks(
    directory: str,
    *,
    include_free: bool = False,
    unlisted: list[str] | None = None,
    allow_other_owner: bool = False,
) -> list[LockStatus]:
    """Every local-mutex lock file in the directory that is held (or all of them); what
    ``run`` would refuse to use (not a regular file, more than one link, another user's)
    goes to ``unlisted``, said why: nobody (or not this user) can lock its name, and its
    record is not to be trusted."""
    try:
        entries = [e for e in os.scandir(directory) if _is_lock_name(e.name)]
    except OSError as exc:
        raise CannotTell(f"cannot read lock dir {directory!r}: {exc.strerror}") from None
    infos = []
    for entry in entries:
        try:
            infos.append((entry, entry.stat(follow_symlinks=False)))
        except FileNotFoundError:  # deleted since the scan (a tmp cleaner): not there
            continue
        except OSError as exc:
            raise CannotTell(f"cannot read lock dir {directory!r}: {exc.strerror}") from None
    locks = read_proc_locks()
    out = []
    boot = _proc.boot_time()
    for entry, st in infos:
        path = os.path.join(directory, entry.name)
        refusal = refusal_for(st, path, allow_other_owner)
        if refusal is not None:
            if unlisted is not None:
                unlisted.append(f"{refusal}; not listed")
            continue
        if locks is None:
            probed = _probe(path, None)
            if include_free or probed.held:
                out.append(probed)
            continue
        found = _of_file(path, None, st, locks, boot)
        if include_free or found.held:
            out.append(found)
    if locks:
        out += held_deleted_from(directory, [key_of(st) for _, st in infos], locks)
    for found in out:
        found.slot = slot_index(found.lock_file)
    return ordered([s for s in out if include_free or s.held])


def held_deleted_from(
    directory: str, listed: list[tuple[int, int, int]], locks: list[KernelLock] | None = None
) -> list[LockStatus]:
    """The locks still held on files a tmp cleaner deleted from the directory, whose
    holders have not put one back (within a tick; never, while stopped): nothing at their
    path to list, yet held, as ``status`` says. ``listed``: files there, not asked about."""
    locks = read_proc_locks() if locks is None else locks
    if not locks:
        return []
    here = os.path.realpath(directory)  # as /proc names it (``as_proc_names_it``)

    def deleted_from_here(path: str) -> bool:
        head, name = os.path.split(path)
        return head == here and _is_lock_name(name) and not os.path.lexists(path)

    try:  # deleted or renamed, a file stays on the directory's device
        device = os.stat(directory).st_dev
    except OSError:
        return []
    on = (os.major(device), os.minor(device))
    others = [e for e in locks if e.key[:2] == on and e.key not in listed]
    out: list[LockStatus] = []
    for _ in range(_MAX_DELETED):
        found = held_elsewhere(deleted_from_here, others, record.recorded_path)
        if found is None:
            break
        lock, through = found
        others = [e for e in others if e.key != lock.key]
        rec = record.read_record(through, through_proc=True)
        path = rec.get("lock_file") if rec is not None else None
        try:
            link = os.readlink(through).removesuffix(" (deleted)")
        except OSError:
            continue  # let go meanwhile
        path = path if isinstance(path, str) and deleted_from_here(path) else link
        entries = [e for e in locks if e.key == lock.key]
        out.append(_from_kernel(path, None, lock.key, entries, _proc.boot_time(), rec))
    return out


def _is_lock_name(name: str) -> bool:
    """A lock or slot file; not a semaphore's gate, which only queues its waiters."""
    return (
        name.startswith(LOCK_PREFIX)
        and name.endswith(LOCK_SUFFIX)
        and not name.endswith(".gate" + LOCK_SUFFIX)
    )


def ordered(items: list[LockStatus]) -> list[LockStatus]:
    def longest_first(s: LockStatus) -> tuple[int, float, str]:
        since = [h.since_epoch for h in s.holders if h.since_epoch is not None]
        if s.held:
            return (0, min(since), s.lock_file) if since else (1, 0.0, s.lock_file)
        return (2, 0.0, s.lock_file)

    return sorted(items, key=longest_first)


# -- used by a waiting run -----------------------------------------------------------------


def kernel_holders(path: str) -> list[Holder]:
    try:
        return status_of_path(path).holders
    except Interrupted:  # a stop signal while we looked: for the wait, not lost here
        raise
    except Exception:
        return []


def queue_position(path: str) -> str | None:
    """``position 2 of 3 in the queue`` for this process, when the kernel tells."""
    try:
        st = status_of_path(path)
    except Interrupted:
        raise
    except Exception:
        return None
    me = os.getpid()
    for w in st.waiters:
        if w.pid == me:
            return f"position {w.position} of {len(st.waiters)} in the queue"
    return None
