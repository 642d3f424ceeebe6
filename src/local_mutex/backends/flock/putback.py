"""A held lock file deleted or renamed (a tmp cleaner): put a locked file back at the path.

A newcomer cannot tell a deleted holder's path from a free one, so the holder must notice
first: ``FlockLock.check`` runs this every tick while the lock is held. The file put back is
held by the keeper, handed down to the supervisor (``supervise.handdown``), and held by a
``guardian`` for as long as the command's own lock (on the deleted file) lives.
"""

from __future__ import annotations

import errno
import os
import time

from . import guardian, kernel, record
from .lockdir import cannot_put_back, create_exclusive, file_id, new_file_mark, refusal_for

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .lock import FlockLock

# How long a newcomer that took the new file gets to start waiting for our lock.
_WAITER_WITHIN = 0.3


def put_back(lock: FlockLock) -> str | None:
    """Nothing if the path still names a file we hold; else a warning saying what we did:
    put a locked file back, or found that a newcomer took the new file first. Once it
    did, the path is tried again every tick (said only once): the file is ours again as
    soon as whoever took it lets go."""
    if lock.guardian is not None:
        warning = _guardian_gone(lock, lock.guardian)
        if warning is not None:
            return warning
    try:
        st = os.stat(lock.path, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    except OSError:
        return None
    if st is not None and (st.st_dev, st.st_ino) in map(file_id, (lock.fd, *lock.spares)):
        lock.cannot_create = None
        return None
    # Whether ``create_exclusive`` locked the file for us: the file it returns is always the
    # last it prepared (an earlier one it gave up may have had that very inode number).
    taken: list[bool] = []

    def prepare(new: int) -> None:
        taken.append(_take(lock, new))

    try:
        fd = create_exclusive(lock.path, prepare) if st is None else _open_quietly(lock.path)
    except OSError as exc:
        return cannot_put_back(lock, exc)
    lock.cannot_create = None
    if fd is None:
        # Nothing to lock at the path: its directory is gone (a tmp cleaner), or a file
        # came and went. Nobody else can take the lock there either; look next tick.
        return None
    if refusal_for(os.fstat(fd), lock.path, lock.allow_other_owner):
        os.close(fd)  # never write into a file that may be someone else's (which
        return None  # a newcomer refuses as well): look again next tick
    if (taken and taken[-1]) or _take(lock, fd):
        lock.lost_to = None
        # Files put back before, gone from the path again, are let go -- but those a hold
        # gave runs inside it stay held and guarded: those runs' commands may hold them.
        kept = [s for s in lock.spares if file_id(s) in lock.given]
        lock.guardian = guardian.replace(lock.guardian, fd, [lock.fd, *kept])
        for stale in lock.spares:
            if stale not in kept:
                os.close(stale)
        lock.spares = [*kept, fd]
        return (
            f"lock file {lock.path!r} of {lock.label} was deleted or replaced while held; "
            f"put a locked file back at the path{_unguarded(lock)}"
        )
    os.close(fd)  # the file now at the path is locked: somebody took it first
    if lock.lost_to is not None:
        return None  # said already
    other = lock.busy_holder() or {}
    pid = other.get("pid")
    if pid == os.getpid():
        # The file we found taken went too as we asked who took it (a fast cleaner): the
        # lock the look found is our own, on the file deleted first. Look again next tick.
        return None
    lock.lost_to = pid if isinstance(pid, int) else -1
    who = f"pid {pid}" if isinstance(pid, int) else "another process"
    then = (
        "and waits for this lock to end"
        if _waited_for(lock)
        else "and does not wait for this lock: whatever holds it may run beside this command"
    )
    return (
        f"lock file {lock.path!r} of {lock.label} was deleted or replaced while pid "
        f"{os.getpid()} held it, and {who} took the new file first {then}"
    )


def _waited_for(lock: FlockLock) -> bool:
    """Does anyone wait in the kernel for our lock on the file deleted from the path? A
    local-mutex run that took a new file (marked) does, within a moment; a slot file, a
    file put there empty by another program, or another program's lock does not."""
    from .proclocks import key_of, read_proc_locks

    ours = key_of(os.fstat(lock.fd))
    deadline = time.monotonic() + _WAITER_WITHIN
    while True:
        if any(k.key == ours and k.depth for k in read_proc_locks() or ()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _take(lock: FlockLock, fd: int) -> bool:
    """Lock the file, then write our record into it: until it is there, a hold's own calls
    (run --reentrant, release) see a lock without a hold. A shared holder has no record:
    an empty file gets the new file's mark instead, for other shared holders may hold the
    deleted file on after we let this one go, and whoever takes it then must ask."""
    if not kernel.try_lock(fd, shared=lock.shared):
        return False
    try:
        if lock.record is not None:
            record.write_record(fd, lock.record, lock.path)
        elif os.fstat(fd).st_size == 0:
            os.pwrite(fd, new_file_mark(lock.path), 0)
    except Exception:  # a full disk
        pass
    return True


def _guardian_gone(lock: FlockLock, pid: int) -> str | None:
    """A guardian that was killed is started again (one that ended by itself did so
    because the command's lock is gone: nothing left to guard)."""
    status = guardian.ended(pid)
    if status is None:
        return None
    lock.guardian = None
    if status == -1 or not os.WIFSIGNALED(status) or not lock.spares:
        return None
    lock.guardian = guardian.start(lock.spares[-1], [lock.fd, *lock.spares[:-1]])
    return (
        f"the guardian (pid {pid}) of lock file {lock.path!r} put back was killed; "
        f"started another{_unguarded(lock)}"
    )


def _unguarded(lock: FlockLock) -> str:
    if lock.guardian is not None or not guardian.SUPPORTED:
        return ""
    return (
        " (no guardian could start: until the command ends, that file is held by pid "
        f"{os.getpid()} and the supervisor alone)"
    )


def _open_quietly(path: str) -> int | None:
    """The file now at the path, if we may open it; OSError if we are out of descriptors."""
    try:
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise
        return None
