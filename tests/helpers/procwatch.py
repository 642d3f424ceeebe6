"""Look at real processes through /proc: children, groups, liveness that ignores zombies.

Linux only (the holder-guarantee tests need /proc). A zombie is never "alive" here: it has
ended and only waits for its parent to collect its status; nor is a process already inside
exit(2) (it has closed its descriptors and runs no more code of its own).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, session, ...]."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].decode().split()


def state(pid: int) -> str | None:
    """The process state letter (R, S, D, Z, T, ...) or None when it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


PF_EXITING = 0x4


def _alive_fields(fields: list[str] | None) -> bool:
    # A process inside exit(2) has already closed its descriptors (so a lock it held may
    # be free) before it turns zombie: it counts as gone once PF_EXITING is set.
    return (
        fields is not None and fields[0] not in ("Z", "X", "x") and not int(fields[6]) & PF_EXITING
    )


def alive(pid: int) -> bool:
    """Running, sleeping or stopped — not gone, not a zombie, not already exiting."""
    return _alive_fields(_stat_fields(pid))


def ppid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def pgid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def all_pids() -> Iterator[int]:
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            yield int(entry.name)


def children(pid: int) -> list[int]:
    """Direct children, from /proc/PID/task/*/children (every thread's)."""
    out: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        todo.extend(children(p))
    return out


def exe(pid: int) -> str | None:
    try:
        return os.readlink(PROC / str(pid) / "exe")
    except OSError:
        return None


def environ(pid: int) -> dict[str, str]:
    """The environment a process was started with (empty for zombies and kernel threads)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def group_members(pgrp: int) -> list[int]:
    """Live (non-zombie) members of a process group."""
    out = []
    for p in all_pids():
        fields = _stat_fields(p)
        if fields and fields[2] == str(pgrp) and _alive_fields(fields):
            out.append(p)
    return out


def tagged(key: str, value: str) -> list[int]:
    """Live processes whose starting environment has KEY=VALUE."""
    return [p for p in all_pids() if environ(p).get(key) == value and alive(p)]


def supervisor_child(cli_pid: int) -> int | None:
    """A child of the CLI process running the same program (the forked supervisor), if any."""
    mine = exe(cli_pid)
    for c in children(cli_pid):
        if mine is not None and exe(c) == mine:
            return c
    return None


def signal_quietly(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


def kill_together(pids: Iterable[int]) -> None:
    """SIGKILL as an OOM sweep does, all at once: stopped first, so none of them sees
    another die and acts on it (a supervisor stopping the command when its keeper goes).
    PIDS parents first; they are killed children first: a parent's death that orphans a
    process group holding a stopped process makes the kernel send that group SIGHUP and
    SIGCONT -- the supervisor has a group of its own, and would wake up to stop the
    command before its own SIGKILL came."""
    pids = list(pids)
    signal_quietly(pids, signal.SIGSTOP)
    signal_quietly(reversed(pids), signal.SIGKILL)


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of PIDS is alive; return those still alive at the deadline."""
    pending = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        pending = [p for p in pending if alive(p)]
        if not pending or time.monotonic() > deadline:
            return pending
        time.sleep(0.02)


def flock_held(path: Path) -> bool:
    """Whether a flock(2) lock is held on the file now at PATH — read from /proc/locks, so
    looking never takes the lock (a probe with LOCK_NB could, for an instant)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in (PROC / "locks").read_text().splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[1] != "FLOCK":  # "->" lines are blocked waiters
            continue
        major, minor, inode = fields[5].split(":")
        if (int(major, 16), int(minor, 16), int(inode)) == want:
            return True
    return False


def openers(path: Path) -> list[int]:
    """Live processes with the file now at PATH open (any descriptor)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return []
    found = []
    for p in all_pids():
        try:
            fds = os.listdir(PROC / str(p) / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                s = os.stat(PROC / str(p) / "fd" / fd)
            except OSError:
                continue
            if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
                if alive(p):
                    found.append(p)
                break
    return found


def argv(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def is_local_mutex(pid: int) -> bool:
    """A process of local-mutex itself (a CLI, a supervisor, a nested call's CLI) rather than
    of a command: ``python -m local_mutex``, the nested-call shim's ``python -c '... from
    local_mutex...'`` or the installed ``local-mutex`` script."""
    args = argv(pid)
    for i, a in enumerate(args):
        if a in ("local_mutex", "local_mutex.__main__") and i > 0 and args[i - 1] == "-m":
            return True
        if "from local_mutex" in a or "import local_mutex" in a:
            return True
        if i <= 1 and os.path.basename(a) == "local-mutex":
            return True
    return False


def is_command_process(pid: int, env: dict[str, str] | None = None) -> bool:
    """A locked command or its descendant: started with ``LOCAL_MUTEX_CLI`` in its
    environment (only commands get it), and not local-mutex itself."""
    env = environ(pid) if env is None else env
    return "LOCAL_MUTEX_CLI" in env and not is_local_mutex(pid)
