"""What this package reads about other processes: parents, names, command lines, state.

Linux answers from /proc; elsewhere ``ps`` answers the few questions the callers need.
"""

from __future__ import annotations

import os
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Container, Iterator

PROC = "/proc"
_CMD_LIMIT = 4096
# LOCAL_MUTEX_NO_PROC=1 takes the paths a system without /proc takes (macOS), so that they
# are exercised on Linux too (the tests set it).
USE_PROC = (
    sys.platform.startswith("linux")
    and os.path.isdir(PROC)
    and os.environ.get("LOCAL_MUTEX_NO_PROC") != "1"
)


def decimal(text: str, digits: int = 18) -> int | None:
    """``text`` as a non-negative integer if it is nothing but ASCII digits, at most
    ``digits`` of them; else None. For text from outside (an environment entry, a server's
    row, a directory name): ``str.isdigit`` also takes digits ``int`` refuses ('¹'), and
    ``int`` refuses more than 4300 digits."""
    if 0 < len(text) <= digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def stat_fields(pid: int) -> list[bytes] | None:
    """Fields of /proc/PID/stat after the command name (which may hold spaces or ')')."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


def thread_count() -> int | None:
    """This process's threads as the kernel counts them (one started through ``_thread``
    too, which ``threading`` does not see); None without /proc."""
    if not USE_PROC:
        return None
    fields = stat_fields(os.getpid())
    try:
        return int(fields[17]) if fields else None  # field 20 of stat(5): num_threads
    except (IndexError, ValueError):
        return None


def exists(pid: int) -> bool:
    """Is there a process ``pid`` (of any user; a zombie counts)?"""
    if pid <= 0:  # 0 and negatives name process groups (a number read from a record)
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass
    return True


def running(pid: int) -> bool:
    """Is ``pid`` a process that has not ended? A zombie has (a holder killed under a PID
    1 that reaps late); without /proc, any process that exists counts."""
    if not exists(pid):
        return False
    fields = stat_fields(pid) if USE_PROC else [b"R"]
    return fields is not None and fields[0] not in b"ZX"


def parent_of(pid: int) -> int | None:
    if USE_PROC:
        fields = stat_fields(pid)
        return int(fields[1]) if fields else None
    out = _ps(pid, "ppid=")
    return int(out) if out.isdigit() else None


def is_ancestor(pid: int, max_depth: int = 4096) -> bool:
    """Is ``pid`` our parent, or its parent, and so on? Never pid 1 (or 0): everyone's
    ancestor, and no holder ever is it (a command's entry names its supervisor, a child)."""
    if pid <= 1:
        return False
    current = os.getppid()
    for _ in range(max_depth):
        if current == pid:
            return True
        if current <= 1:
            return False
        parent = parent_of(current)
        if parent is None:
            return False
        current = parent
    return False


def open_files(pid: int) -> Iterator[tuple[str, os.stat_result]]:
    """(descriptor number, what it names) for each of ``pid``'s open descriptors that can
    be looked at (/proc; nothing where there is none)."""
    if not USE_PROC:
        return
    try:
        names = os.listdir(f"{PROC}/{pid}/fd")
    except OSError:
        return
    for name in names:
        try:
            yield name, os.stat(f"{PROC}/{pid}/fd/{name}")
        except OSError:
            continue


def holds_lock(
    pid: int,
    files: Container[tuple[int, int]],
    *,
    sockets: bool = False,
    locks: Container[str] | None = None,
) -> bool:
    """Does ``pid`` hold a lock through a descriptor of one of ``files`` (device, inode)
    -- a flock granted on it, not merely the file open (Linux; elsewhere: no)? With
    ``sockets``, a socket among them counts as held (a database session). With ``locks``,
    only those granted locks count (see ``granted``): one open file description's, not
    any shared lock on the same file."""
    for name, st in open_files(pid):
        if (st.st_dev, st.st_ino) not in files:
            continue
        if sockets and stat.S_ISSOCK(st.st_mode):
            return True
        mine = granted(pid, name)
        if mine and (locks is None or any(lock in locks for lock in mine)):
            return True
    return False


def granted(pid: int, fd: int | str) -> frozenset[str]:
    """The flocks granted through one descriptor of ``pid``, as its fdinfo shows them:
    kind, mode, the pid that took it, device:inode. A description shared by inheritance
    shows the same lines; two shared locks on one file, taken by two processes, differ."""
    try:
        with open(f"{PROC}/{pid}/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
            # "lock:\t1: FLOCK  ADVISORY  READ 4242 fe:00:2152344 0 EOF": drop the ordinal
            return frozenset(" ".join(ln.split()[2:]) for ln in f if ln.startswith("lock:"))
    except OSError:
        return frozenset()


def peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket (Linux's SO_PEERCRED;
    for a listening socket, the process that listens)."""
    import socket
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    pid, uid, _ = struct.unpack("3i", creds)  # struct ucred: pid, uid, gid
    return pid, uid


def comm(pid: int) -> str | None:
    if not USE_PROC:
        return os.path.basename(_ps(pid, "comm=")) or None
    try:
        with open(f"{PROC}/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        pass
    return os.path.basename(_ps(pid, "comm=")) or None


def cmdline(pid: int) -> str | None:
    if not USE_PROC:
        return _ps(pid, "command=") or None
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            raw = f.read(_CMD_LIMIT)
    except OSError:
        return None
    parts = [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]
    return " ".join(parts) or None


def boot_time() -> float | None:
    """When the machine booted (epoch seconds), to the clock tick: ``btime`` in /proc/stat
    is whole seconds, which put every process's start up to a second early."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)  # the clock process start times count on
    if clock is not None and USE_PROC:
        return time.time() - time.clock_gettime(clock)
    try:
        with open(f"{PROC}/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def start_time(pid: int, boot: float | None) -> float | None:
    """When ``pid`` started (epoch seconds), from its start time in clock ticks."""
    if boot is None:
        return None
    fields = stat_fields(pid)
    try:
        ticks = int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None
    return None if ticks is None else boot + ticks / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """Live children of ``pid`` (of any of its threads)."""
    if not USE_PROC:
        return [child for child, parent in _ps_all() if parent == pid]
    found: list[int] = []
    try:
        tasks = os.listdir(f"{PROC}/{pid}/task")
    except OSError:
        tasks = []
    for tid in tasks:
        try:
            # Bytes: a signal handler calls this, and a first text read would import a
            # codec there, which a signal in the middle of it breaks.
            with open(f"{PROC}/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            return _children_by_scan(pid)
    return found if tasks else _children_by_scan(pid)


def _children_by_scan(pid: int) -> list[int]:
    found: list[int] = []
    try:
        entries = os.listdir(PROC)
    except OSError:  # out of descriptors or memory: none known (the group is signalled still)
        return found
    for entry in entries:
        if entry.isdigit() and parent_of(int(entry)) == pid:
            found.append(int(entry))
    return found


def _ps(pid: int, field: str) -> str:
    import subprocess

    try:
        return subprocess.run(
            ["ps", "-o", field, "-p", str(pid)], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return ""


def _ps_all() -> list[tuple[int, int]]:
    import subprocess

    try:
        out = subprocess.run(
            ["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return []
    pairs = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
            pairs.append((int(fields[0]), int(fields[1])))
    return pairs
