"""The kernel's view of flock(2) locks on Linux: /proc/locks and /proc/<pid>/fdinfo.

The pid /proc/locks prints is whoever *took* the lock, which may have exited while a child
that inherited the descriptor holds on, so holders are confirmed through fdinfo. Waiters are
the ``->`` lines, in the kernel's queue order.
"""

from __future__ import annotations

import os

from ..._proc import PROC, USE_PROC
from .lockdir import ours_or_roots

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator


class KernelLock:
    """One line of /proc/locks (or of an fdinfo ``lock:`` line)."""

    __slots__ = ("depth", "exclusive", "inode", "kind", "major", "minor", "pid")

    def __init__(
        self, kind: str, exclusive: bool, pid: int, major: int, minor: int, inode: int, depth: int
    ) -> None:
        self.kind = kind  # FLOCK, POSIX, OFDLCK
        self.exclusive = exclusive
        self.pid = pid
        self.major, self.minor, self.inode = major, minor, inode
        self.depth = depth  # 0 for a granted lock, > 0 for a waiter (the kernel prints "->")

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.inode)


def parse_lock_line(line: str) -> KernelLock | None:
    """``1: -> FLOCK  ADVISORY  WRITE 1924 fe:00:2146419 0 EOF`` -> KernelLock."""
    fields = line.split()
    if not fields:
        return None
    if fields[0] == "lock:":
        fields = fields[1:]
    depth = 0
    rest = fields[1:]
    while rest and rest[0] == "->":
        depth += 1
        rest = rest[1:]
    if len(rest) < 5:
        return None
    kind, _advisory, access, pid, dev_ino = rest[:5]
    try:
        major, minor, inode = dev_ino.split(":")
        return KernelLock(
            kind=kind,
            exclusive=access == "WRITE",
            pid=int(pid),
            major=int(major, 16),
            minor=int(minor, 16),
            inode=int(inode),
            depth=depth,
        )
    except ValueError:
        return None


_MAX_READS = 10


def read_proc_locks() -> list[KernelLock] | None:
    """All flock(2) locks, in the kernel's order; None when /proc/locks is unreadable."""
    if not USE_PROC:
        return None
    locks: list[KernelLock] = []
    seen: set[tuple[object, ...]] = set()
    # A page per read, each walking the kernel's list afresh: locks taken or let go in
    # between repeat lines or skip them. A list longer than a page is read again until two
    # reads in a row show no line the others did not (every line once; a lock let go
    # meanwhile may still show, and its holder is checked in /proc/PID/fdinfo anyway).
    quiet = 0
    for _ in range(_MAX_READS):
        try:
            text, reads = _read(f"{PROC}/locks")
        except OSError:
            return None
        new = 0
        for line in text.splitlines():
            lock = parse_lock_line(line)
            if lock is None or lock.kind != "FLOCK":
                continue
            ident = (lock.exclusive, lock.pid, lock.major, lock.minor, lock.inode, lock.depth)
            if ident not in seen:
                seen.add(ident)
                locks.append(lock)
                new += 1
        quiet = 0 if new else quiet + 1
        if reads == 1 or quiet == 2:
            break
    return locks


def _read(path: str) -> tuple[str, int]:
    """The whole file, and how many reads it took."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks).decode("ascii", "replace"), len(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def key_of(st: os.stat_result) -> tuple[int, int, int]:
    return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)


def fd_holds(pid: int, key: tuple[int, int, int]) -> bool:
    """Does some descriptor of ``pid`` carry a granted lock on this inode?"""
    return _lock_fd(pid, key) is not None


def _lock_fd(pid: int, key: tuple[int, int, int]) -> str | None:
    return next((fd for fd, _ in _lock_fds(pid, {key})), None)


def _lock_fds(
    pid: int, keys: Collection[tuple[int, int, int]]
) -> Iterator[tuple[str, tuple[int, int, int]]]:
    """Each descriptor of ``pid`` that carries a granted lock on one of these inodes, and
    which inode: one pass over its fdinfo, however many of the keys it holds."""
    base = f"{PROC}/{pid}/fdinfo"
    try:
        fds = os.listdir(base)
    except OSError:
        return
    for fd in fds:
        try:
            with open(f"{base}/{fd}", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("lock:"):
                        parsed = parse_lock_line(line)
                        if parsed is not None and parsed.key in keys and parsed.depth == 0:
                            yield fd, parsed.key
                            break
        except OSError:
            continue


def all_fd_holders(key: tuple[int, int, int]) -> list[int]:
    pids = []
    for entry in os.listdir(PROC):
        if entry.isdigit() and fd_holds(int(entry), key):
            pids.append(int(entry))
    return sorted(pids)


def held_elsewhere(
    path: str | Callable[[str], bool],
    locks: list[KernelLock],
    recorded: Callable[[str], str | None],
    any_owner: bool = False,
) -> tuple[KernelLock, str] | None:
    """A granted lock on a file that was at ``path`` (or at any path the callable says
    yes to) and has been deleted or renamed away while held (its holder puts one back
    within a moment): found through the holder's descriptors, which still name the old
    path (``… (deleted)``) or whose holder record names ``path`` (``recorded`` reads the
    lock file a record was found in). Returns the lock and a /proc path that reads the
    file's content.

    Only a file of ours (or root's) counts, as at the path (``lockdir.refusal_for``), unless
    ``any_owner`` (``--allow-other-owner``): in a shared directory another user can create
    the file before us, delete it, and lock it later to pass for our holder -- root sees
    every process's descriptors, and would wait for that lock, or join it as a hold."""

    def was_at_path(pid: int, fd: str) -> str | None:
        through = f"{PROC}/{pid}/fd/{fd}"
        try:
            target = os.readlink(through)
            st = os.stat(through)
        except OSError:
            return None
        if not (any_owner or ours_or_roots(st)):
            return None
        if wanted(target.removesuffix(" (deleted)")):
            return through
        was = recorded(through)
        return through if was is not None and wanted(was) else None

    wanted = path if callable(path) else path.__eq__

    takers: dict[int, dict[tuple[int, int, int], KernelLock]] = {}
    for lock in locks:
        if not lock.depth:
            takers.setdefault(lock.pid, {})[lock.key] = lock
    # Locks whose taker no longer has them: held on by whoever inherited them.
    untaken: dict[tuple[int, int, int], KernelLock] = {}
    for pid, taken in takers.items():
        seen = set()
        for fd, key in _lock_fds(pid, taken):
            seen.add(key)
            through = was_at_path(pid, fd)
            if through is not None:
                return taken[key], through
        untaken.update((key, lock) for key, lock in taken.items() if key not in seen)
    if not untaken:
        return None
    for entry in os.listdir(PROC):  # one walk for all of them
        if entry.isdigit():
            for fd, key in _lock_fds(int(entry), untaken):
                through = was_at_path(int(entry), fd)
                if through is not None:
                    return untaken[key], through
    return None
