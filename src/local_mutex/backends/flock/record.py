"""The holder record: one JSON line the exclusive holder keeps inside the lock file.

It is advisory. Readers trust it only while the kernel says the lock is held, so a record
left behind by a holder that was SIGKILLed means nothing once the lock is free. Anyone who
can write the file can write anything into it: it is read with bounds and typed checks.
"""

from __future__ import annotations

import errno
import os
import time

from ..._json import cut_to_fit, dumps, loads_object
from ...errors import RecordNotWritten
from .lockdir import as_proc_names_it, ours_or_roots

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

MAX_RECORD = 64 * 1024
# The message of the record a hold's end leaves to the runs inside it (``handed_over``).
HANDED_OVER = "left to runs inside a hold"
# What a holder says about itself in free text, cut (longest first) where the record would
# be longer than readers read; a name longer than that is no name ``list`` can show anyway.
_CUT_FIRST = ("command", "message", "cwd", "run_url", "workflow", "job", "runner", "user", "name")


def _line(record: Mapping[str, Any]) -> bytes:
    return (dumps(cut_to_fit(record, MAX_RECORD - 1, _CUT_FIRST)) + "\n").encode("ascii")


def write_record(fd: int, record: Mapping[str, Any], path: str) -> bool:
    """Replace the file's content with the record. False when the descriptor is read-only
    (a lock file another user owns: the lock works, the record cannot be published);
    RecordNotWritten when the write fails (a full disk, a file size limit)."""
    line = _line(record)
    if len(line) > MAX_RECORD:  # not seen: thousands of fields
        clear_record(fd)
        raise RecordNotWritten(f"took the lock but its holder record for {path!r} is too long")
    try:
        # Over the old one, then cut to length: a reader (a newcomer asking whose a moved
        # file is) never finds the file empty, as between a truncate and the write.
        written = os.pwrite(fd, line, 0)
        if written != len(line):
            raise OSError(errno.ENOSPC, "short write")
        os.ftruncate(fd, len(line))
    except OSError as exc:
        if exc.errno in (errno.EBADF, errno.EINVAL) and not _writable(fd):
            return False
        clear_record(fd)
        raise RecordNotWritten(
            f"took the lock but could not write its holder record to {path!r}: "
            f"{exc.strerror}; let it go"
        ) from None
    return True


def rewrite_record(fd: int, record: Mapping[str, Any], before: Mapping[str, Any]) -> bool:
    """Replace ``before``, the record we wrote, with ``record``; one that cannot be
    written (a full disk) puts ``before`` back -- the file was never cut shorter meanwhile,
    so what that needs is the file's still -- and leaves the rest of the file as it was.
    Whether ``record`` is there now."""
    line, old = _line(record), _line(before)
    try:
        if len(line) <= MAX_RECORD and os.pwrite(fd, line, 0) == len(line):
            os.ftruncate(fd, len(line))
            return True
    except OSError:
        pass
    try:
        os.pwrite(fd, old, 0)
        os.ftruncate(fd, len(old))
    except OSError:
        pass
    return False


def _writable(fd: int) -> bool:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY


def clear_record(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass  # a read-only descriptor never wrote a record


def read_record_fd(fd: int) -> dict[str, Any] | None:
    """The record, or None. A line that does not parse is read again, twice at most: a read
    that meets a rewrite (a holder naming the runs inside its hold) may see a mix of both."""
    for again in (True, True, False):
        try:
            data = os.pread(fd, MAX_RECORD, 0)
        except OSError:
            return None
        rec = _parse(data)
        if rec is not None or not again or not data.split(b"\n", 1)[0]:
            return rec
        time.sleep(0.001)
    return None


def read_record(path: str, *, through_proc: bool = False) -> dict[str, Any] | None:
    """The record in ``path``, or None when absent, unreadable, torn or malformed.
    ``through_proc``: ``path`` is a /proc/<pid>/fd link, which must be followed."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if through_proc else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        return read_record_fd(fd)
    finally:
        os.close(fd)


def _parse(data: bytes) -> dict[str, Any] | None:
    line = data.split(b"\n", 1)[0]
    if not line:
        return None
    rec = loads_object(line.decode("utf-8", "replace"), max_depth=4, max_size=MAX_RECORD)
    if rec is None:
        return None
    # Typed fields: a planted record must not be able to break who reads it.
    pid = rec.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 1 << 31:
        rec["pid"] = None
    since = rec.get("since_epoch")
    if not isinstance(since, (int, float)) or isinstance(since, bool) or not 0 <= since < 1e11:
        rec["since_epoch"] = None
    for key, value in list(rec.items()):
        if isinstance(value, (dict, list)):
            del rec[key]
    return rec


def handed_over(rec: Mapping[str, Any]) -> bool:
    """Is it what a hold's end leaves in a lock file it left to the runs inside it
    (``FlockLock.hand_over``)? Nobody unlocks that lock then: it is held until the last
    process holding its description (the runs' commands, what they left behind) is gone."""
    return rec.get("pid") is None and rec.get("message") == HANDED_OVER


def recorded_path(through: str) -> str | None:
    """The lock file a holder record names, read through a /proc/PID/fd link: how a lock
    file renamed away (perhaps to another directory, under its old name) is known (a
    record of an older version names none)."""
    try:  # never opened unless a plain file: a device's open may do something
        st = os.stat(through)
    except OSError:
        return None
    # Nor trusted unless ours (or root's), as a lock file must be: anyone else could plant a
    # record naming our lock file, and make us wait for whatever they hold.
    if not ours_or_roots(st):
        return None
    rec = read_record(through, through_proc=True)
    where = rec.get("lock_file") if rec is not None else None
    return where if isinstance(where, str) else None


def shared_mark(path: str) -> bytes:
    """What shared holders keep in an empty lock file: no holder (they are many: the kernel
    lists them), only where the file is, so that one renamed away is still known
    (``recorded_path``). The same bytes for every one of them; it asks no taker to look."""
    return (dumps({"v": 1, "shared": True, "lock_file": path}) + "\n").encode("ascii")


def mark_shared(fd: int, path: str) -> None:
    try:
        if os.fstat(fd).st_size == 0:
            os.pwrite(fd, shared_mark(path), 0)
    except OSError:  # a full disk, another user's file: the lock works all the same
        pass


def only_shared_mark(fd: int, path: str) -> bool:
    """Does the file hold shared holders' line alone: nothing a taker must look into?"""
    mark = shared_mark(as_proc_names_it(path))
    try:
        return os.pread(fd, len(mark) + 1, 0) == mark
    except OSError:
        return False


def only_shared_mark_at(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return only_shared_mark(fd, path)
    finally:
        os.close(fd)
