"""Who holds a lock and who waits for it, read from the kernel without taking the lock.

On Linux, /proc/locks lists every flock(2) lock with its waiters (the ``->`` lines). The pid
printed there is whoever *took* the lock, which may have exited while a child that
inherited the descriptor holds on, so holders are confirmed through /proc/<pid>/fdinfo.
Elsewhere (or when /proc is unreadable) a non-blocking probe tells held from free and
nothing more.
"""

from __future__ import annotations

import fcntl
import os
import time

from . import record
from .errors import CannotTell
from .lockdir import resolve_lock_dir
from .names import LOCK_PREFIX, LOCK_SUFFIX, display, lock_filename, validate_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

PROC = "/proc"
_CMD_LIMIT = 4096


class KernelLock:
    """One line of /proc/locks (or of an fdinfo ``lock:`` line)."""

    __slots__ = ("depth", "exclusive", "inode", "kind", "major", "minor", "pid")

    def __init__(
        self,
        kind: str,
        exclusive: bool,
        pid: int,
        major: int,
        minor: int,
        inode: int,
        depth: int,
    ) -> None:
        self.kind = kind  # FLOCK, POSIX, OFDLCK
        self.exclusive = exclusive
        self.pid = pid
        self.major, self.minor, self.inode = major, minor, inode
        self.depth = depth  # 0 for a granted lock, n for a waiter n arrows deep

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.inode)


class _Fields:
    """Plain data with ``as_dict``; not dataclasses, whose import costs status its speed."""

    __slots__: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.as_dict()!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Fields)
            and type(other) is type(self)
            and (self.as_dict() == other.as_dict())
        )

    __hash__ = None  # type: ignore[assignment]


class Holder(_Fields):
    """A process holding the lock; ``source`` says where the details came from."""

    __slots__ = (
        "command",
        "cwd",
        "held_seconds",
        "host",
        "job",
        "message",
        "mode",
        "pid",
        "run_url",
        "runner",
        "since",
        "since_epoch",
        "source",
        "user",
        "workflow",
    )

    def __init__(
        self,
        pid: int,
        mode: str,
        command: str | None = None,
        *,
        cwd: str | None = None,
        host: str | None = None,
        user: str | None = None,
        since: str | None = None,
        since_epoch: float | None = None,
        held_seconds: float | None = None,
        runner: str | None = None,
        job: str | None = None,
        workflow: str | None = None,
        run_url: str | None = None,
        message: str | None = None,
        source: str = "kernel",
    ) -> None:
        self.pid, self.mode, self.command, self.cwd = pid, mode, command, cwd
        self.host, self.user, self.since, self.since_epoch = host, user, since, since_epoch
        self.held_seconds, self.runner, self.job = held_seconds, runner, job
        self.workflow, self.run_url, self.message = workflow, run_url, message
        self.source = source  # "record": from the holder record; "kernel": /proc only


class Waiter(_Fields):
    """A process queued in flock(); ``started`` is when it started (its wait began after)."""

    __slots__ = ("command", "mode", "pid", "position", "started", "started_epoch")

    def __init__(
        self,
        pid: int,
        mode: str,
        position: int,
        command: str | None = None,
        started: str | None = None,
        started_epoch: float | None = None,
    ) -> None:
        self.pid, self.mode, self.position, self.command = pid, mode, position, command
        self.started, self.started_epoch = started, started_epoch


class LockStatus(_Fields):
    """One lock file's state; ``method`` is "proc" (full picture) or "probe" (held/free)."""

    __slots__ = (
        "holders",
        "lock_file",
        "method",
        "mode",
        "name",
        "slot",
        "slots",
        "state",
        "waiters",
    )

    def __init__(
        self,
        lock_file: str,
        name: str | None,
        state: str,
        method: str,
        mode: str | None = None,
        holders: list[Holder] | None = None,
        waiters: list[Waiter] | None = None,
    ) -> None:
        self.lock_file, self.name, self.state, self.method = lock_file, name, state, method
        self.mode = mode
        self.holders: list[Holder] = holders or []
        self.waiters: list[Waiter] = waiters or []
        self.slots: list[LockStatus] = []  # a counting semaphore's slots, when it has any
        self.slot: int | None = None  # for a slot file: its index (from the holder record)

    @property
    def held(self) -> bool:
        return self.state == "held"

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["holders"] = [h.as_dict() for h in self.holders]
        out["waiters"] = [w.as_dict() for w in self.waiters]
        out["queue_length"] = len(self.waiters)
        out["slots"] = [s.as_dict() for s in self.slots]
        out["slots_in_use"] = sum(1 for s in self.slots if s.held)
        return out


# -- /proc parsing -------------------------------------------------------------------------------


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


def read_proc_locks() -> list[KernelLock] | None:
    """All flock(2)-family locks, in the kernel's order; None when /proc/locks is unreadable."""
    try:
        with open(f"{PROC}/locks", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    locks = []
    for line in text.splitlines():
        parsed = parse_lock_line(line)
        if parsed is not None and parsed.kind == "FLOCK":
            locks.append(parsed)
    return locks


def _fd_holds(pid: int, key: tuple[int, int, int]) -> bool:
    """Does some descriptor of ``pid`` carry a granted lock on this inode?"""
    base = f"{PROC}/{pid}/fdinfo"
    try:
        fds = os.listdir(base)
    except OSError:
        return False
    for fd in fds:
        try:
            with open(f"{base}/{fd}", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("lock:"):
                        parsed = parse_lock_line(line)
                        if parsed is not None and parsed.key == key and parsed.depth == 0:
                            return True
        except OSError:
            continue
    return False


def _all_fd_holders(key: tuple[int, int, int]) -> list[int]:
    pids = []
    for entry in os.listdir(PROC):
        if entry.isdigit() and _fd_holds(int(entry), key):
            pids.append(int(entry))
    return sorted(pids)


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            raw = f.read(_CMD_LIMIT)
    except OSError:
        return None
    parts = [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]
    return " ".join(parts) or None


def _boot_time() -> float | None:
    try:
        with open(f"{PROC}/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def _process_start(pid: int, boot: float | None) -> float | None:
    if boot is None:
        return None
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            data = f.read()
        ticks = int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _stamp(epoch: float | None) -> str | None:
    return None if epoch is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


# -- building the answer -------------------------------------------------------------------------


def _key_of(st: os.stat_result) -> tuple[int, int, int]:
    return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)


def _holder_from(
    pid: int, exclusive: bool, rec: Mapping[str, Any] | None, now: float, boot: float | None
) -> Holder:
    mode = "exclusive" if exclusive else "shared"
    if rec is not None and rec.get("pid") == pid:
        since = rec.get("since_epoch")
        since_f = float(since) if isinstance(since, (int, float)) else None
        return Holder(
            pid=pid,
            mode=mode,
            command=rec.get("command"),
            cwd=rec.get("cwd"),
            host=rec.get("host"),
            user=rec.get("user"),
            since=_stamp(since_f),
            since_epoch=since_f,
            held_seconds=None if since_f is None else round(max(now - since_f, 0.0), 3),
            runner=rec.get("runner"),
            job=rec.get("job"),
            workflow=rec.get("workflow"),
            run_url=rec.get("run_url"),
            message=rec.get("message"),
            source="record",
        )
    return Holder(pid=pid, mode=mode, command=_cmdline(pid))


def _from_kernel(
    path: str,
    name: str | None,
    key: tuple[int, int, int],
    entries: list[KernelLock],
    boot: float | None,
) -> LockStatus:
    granted = [e for e in entries if e.depth == 0]
    queued = [e for e in entries if e.depth > 0]
    if not granted:
        return LockStatus(path, name, "free", "proc")
    now = time.time()
    rec = record.read_record(path) if any(e.exclusive for e in granted) else None
    pids = []
    for e in granted:
        if _fd_holds(e.pid, key):
            pids.append((e.pid, e.exclusive))
    if not pids:  # the pid that took it is gone; find who inherited the descriptor
        exclusive = granted[0].exclusive
        pids = [(pid, exclusive) for pid in _all_fd_holders(key)]
    if not pids:  # a holder we cannot see into (another user's /proc): keep the kernel's pid
        pids = [(e.pid, e.exclusive) for e in granted]
    holders = [_holder_from(pid, excl, rec, now, boot) for pid, excl in pids]
    if name is None and rec is not None and any(h.source == "record" for h in holders):
        name = rec.get("name")
    waiters: list[Waiter] = []
    seen: set[int] = set()
    for e in queued:
        if e.pid in seen:
            continue
        seen.add(e.pid)
        started = _process_start(e.pid, boot)
        waiters.append(
            Waiter(
                pid=e.pid,
                mode="exclusive" if e.exclusive else "shared",
                position=len(waiters) + 1,
                command=_cmdline(e.pid),
                started=_stamp(started),
                started_epoch=None if started is None else round(started, 3),
            )
        )
    mode = "exclusive" if any(e.exclusive for e in granted) else "shared"
    st = LockStatus(path, name, "held", "proc", mode, holders, waiters)
    if rec is not None and isinstance(rec.get("slot"), int):
        st.slot = rec["slot"]
    return st


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
            rec = record.read_record(path)
            holders = []
            if rec is not None and isinstance(rec.get("pid"), int):
                holders.append(_holder_from(rec["pid"], True, rec, time.time(), None))
                name = name or rec.get("name")
            return LockStatus(path, name, "held", "probe", None, holders)
        except OSError as exc:
            raise CannotTell(f"cannot probe lock file {path!r}: {exc.strerror}") from None
        return LockStatus(path, name, "free", "probe")
    finally:
        os.close(fd)


def status_of_path(path: str, name: str | None = None) -> LockStatus:
    """The state of one lock file. Never creates it; on Linux never takes the lock."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        method = "proc" if os.path.exists(f"{PROC}/locks") else "probe"
        return LockStatus(path, name, "free", method)
    except OSError as exc:
        raise CannotTell(f"cannot stat lock file {path!r}: {exc.strerror}") from None
    locks = read_proc_locks()
    if locks is None:
        return _probe(path, name)
    key = _key_of(st)
    return _from_kernel(path, name, key, [e for e in locks if e.key == key], _boot_time())


def status(name: str | bytes, lock_dir: str | None = None) -> LockStatus:
    """Who holds the lock ``name`` (in ``lock_dir``) and who waits for it."""
    from .slots import existing_slots

    raw = validate_name(name)
    path = os.path.join(resolve_lock_dir(lock_dir, writable=False), lock_filename(raw))
    st = status_of_path(path, display(raw))
    st.slots = [status_of_path(p, display(raw)) for p in existing_slots(path)]
    return st


def list_locks(lock_dir: str | None = None, *, include_free: bool = False) -> list[LockStatus]:
    """Every local-mutex lock file in the directory that is held (or all of them)."""
    directory = resolve_lock_dir(lock_dir, writable=False)
    locks = read_proc_locks()
    if locks is None:
        found = [
            _probe(os.path.join(directory, n), None) for n in _lock_files(os.listdir(directory))
        ]
        return _ordered([s for s in found if include_free or s.held])
    by_inode: dict[int, list[KernelLock]] = {}
    for e in locks:
        by_inode.setdefault(e.inode, []).append(e)
    boot = _boot_time()
    out = []
    with os.scandir(directory) as it:
        for entry in it:
            if not _is_lock_name(entry.name):
                continue
            path = os.path.join(directory, entry.name)
            candidates = by_inode.get(entry.inode())
            if candidates:
                st = entry.stat(follow_symlinks=False)
                key = _key_of(st)
                mine = [e for e in candidates if e.key == key]
                if mine:
                    out.append(_from_kernel(path, None, key, mine, boot))
                    continue
            elif not include_free:
                continue
            if include_free:
                out.append(LockStatus(path, None, "free", "proc"))
    return _ordered(out)


def _is_lock_name(name: str) -> bool:
    return name.startswith(LOCK_PREFIX) and name.endswith(LOCK_SUFFIX)


def _lock_files(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if _is_lock_name(n))


def _ordered(items: list[LockStatus]) -> list[LockStatus]:
    def longest_first(s: LockStatus) -> tuple[int, float, str]:
        since = [h.since_epoch for h in s.holders if h.since_epoch is not None]
        if s.held:
            return (0, min(since), s.lock_file) if since else (1, 0.0, s.lock_file)
        return (2, 0.0, s.lock_file)

    return sorted(items, key=longest_first)


# -- used by a waiting run -----------------------------------------------------------------------


def kernel_holders(path: str) -> list[Holder]:
    try:
        return status_of_path(path).holders
    except CannotTell:
        return []


def queue_position(path: str) -> str | None:
    """``position 2 of 3 in the queue`` for this process, when the kernel tells."""
    try:
        st = status_of_path(path)
    except CannotTell:
        return None
    me = os.getpid()
    for w in st.waiters:
        if w.pid == me:
            return f"position {w.position} of {len(st.waiters)} in the queue"
    return None
