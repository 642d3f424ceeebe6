"""Reentrancy: is this lock already held by an enclosing local-mutex in our process tree?

A supervisor adds ``pid:dev:ino:mode`` to LOCAL_MUTEX_HELD in its command's environment.
An entry counts only if that pid is really one of our ancestors, so an unrelated process
that merely inherited (or copied) the environment still waits like anyone else.
"""

from __future__ import annotations

import _thread
import os
import sys

# Type-only imports: typing and collections cost a plain run measurable startup time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ENV_HELD = "LOCAL_MUTEX_HELD"
_MAX_DEPTH = 4096

# Locks held in this process by ``with local_mutex.hold(...)``: (dev, ino, thread) -> mode.
# Per thread: another thread of ours asking for the same lock simply waits its turn.
held_here: dict[tuple[int, int, int], str] = {}


def here_key(dev: int, ino: int) -> tuple[int, int, int]:
    return (dev, ino, _thread.get_ident())


def entry(pid: int, dev: int, ino: int, shared: bool) -> str:
    return f"{pid}:{dev}:{ino}:{'s' if shared else 'x'}"


def extend(env: Mapping[str, str], new_entry: str) -> str:
    current = env.get(ENV_HELD, "")
    return f"{current};{new_entry}" if current else new_entry


def enclosing_hold(env: Mapping[str, str], dev: int, ino: int) -> tuple[int, str] | None:
    """(pid, mode) of the enclosing holder of this inode, verified; else None."""
    mode = held_here.get(here_key(dev, ino))
    if mode is not None:
        return os.getpid(), mode
    for item in env.get(ENV_HELD, "").split(";"):
        fields = item.split(":")
        if len(fields) != 4:
            continue
        try:
            pid, e_dev, e_ino = int(fields[0]), int(fields[1]), int(fields[2])
        except ValueError:
            continue
        if (e_dev, e_ino) == (dev, ino) and fields[3] in ("s", "x") and is_ancestor(pid):
            return pid, fields[3]
    return None


def is_ancestor(pid: int) -> bool:
    current = os.getppid()
    for _ in range(_MAX_DEPTH):
        if current == pid:
            return True
        if current <= 1:
            return False
        parent = parent_of(current)
        if parent is None:
            return False
        current = parent
    return False


def parent_of(pid: int) -> int | None:
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            return None
        # The command name in parentheses may itself hold spaces or ')'.
        return int(data[data.rindex(b")") + 2 :].split()[1])
    import subprocess

    try:
        out = subprocess.run(
            ["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return None
    return int(out) if out.isdigit() else None
