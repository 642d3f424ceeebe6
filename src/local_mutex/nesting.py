"""Reentrancy: is this lock already held by an enclosing local-mutex in our process tree?

A holder adds ``pid:KEY:mode`` to LOCAL_MUTEX_HELD in its command's environment, where KEY
names the lock in its backend (``dev:ino`` of a lock file, ``g-<digest>`` of a git branch,
``p-<key>`` of a database lock). An entry counts only if that pid is really one of our
ancestors, so an unrelated process that merely inherited (or copied) the environment
still waits like anyone else. The pid is the supervisor's (``handed_down``): it lives for
this one run of the command, while the process that took the lock may go on to the next
(``each``) and adopt the leftovers of this one.
"""

from __future__ import annotations

from ._proc import USE_PROC, decimal, holds_lock, is_ancestor, parent_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ENV_HELD = "LOCAL_MUTEX_HELD"
# The remote lock domain a command runs in: nested calls take their locks there too.
ENV_REMOTE = "LOCAL_MUTEX_REMOTE"
# The run inside a hold a command is of: the name its holder gave that run.
ENV_HOLD_RUN = "LOCAL_MUTEX_HOLD_RUN"


def entry(pid: int, key: str, shared: bool) -> str:
    return f"{pid}:{key}:{'s' if shared else 'x'}"


def extend(env: Mapping[str, str], new_entry: str) -> str:
    current = env.get(ENV_HELD, "")
    return f"{current};{new_entry}" if current else new_entry


def enclosing_hold(
    env: Mapping[str, str], key: str, file: tuple[int, int] | None = None
) -> tuple[int, str] | None:
    """(pid, mode) of the enclosing holder of the lock ``key``, verified; else None.
    ``file`` (a lock file's device and inode): an enclosing holder that holds the lock on
    that file counts too -- the file it put back at the path after ours was deleted has a
    new key. (Holds it: a descriptor merely open on the file, inherited, does not count.)"""
    entries = held_entries(env)
    for pid, item_key, mode in entries:
        # A pid that came back (the supervisor's, reused by a leftover job's child after
        # the pid space wrapped) is an ancestor yet holds nothing: where /proc can tell,
        # the lock on the file must really be held there.
        if item_key == key and is_ancestor(pid) and (file is None or _holds_here(pid, file)):
            return pid, mode
    if file is None:
        return None
    for pid, _, mode in entries:  # only when no key matched: it reads /proc
        if is_ancestor(pid) and _held_from(pid, file):
            return pid, mode
    return None


def held_entries(env: Mapping[str, str]) -> list[tuple[int, str, str]]:
    """LOCAL_MUTEX_HELD as (pid, key, mode) entries, unverified."""
    entries = []
    for item in env.get(ENV_HELD, "").split(";"):
        pid_text, _, rest = item.partition(":")
        item_key, _, mode = rest.rpartition(":")
        pid = decimal(pid_text)
        if mode in ("s", "x") and pid is not None:
            entries.append((pid, item_key, mode))
    return entries


def _holds_here(pid: int, file: tuple[int, int]) -> bool:
    return not USE_PROC or _held_from(pid, file)


def _held_from(pid: int, file: tuple[int, int]) -> bool:
    """Does ``pid``, or a process above it, hold the lock on ``file``? The entry names a
    run's supervisor, and the file put back at the path may be held further up: by the
    Python process whose ``with hold(...)`` the run runs in. (The entry's pid must still be
    our ancestor: a leftover job of an earlier run has none, and waits.)"""
    current: int | None = pid
    for _ in range(4096):  # a chain that loops (pids reused meanwhile) ends too
        if current is None or current <= 1:
            return False
        if holds_lock(current, {file}):
            return True
        current = parent_of(current)
    return False


def handed_down(held: str, keeper: int, supervisor: int) -> str:
    """LOCAL_MUTEX_HELD as a supervisor gives it to its command: the entries in its
    keeper's name (the locks held for this run) in the supervisor's. A leftover of the
    command that outlives the run -- adopted by the keeper, ``each``'s between items --
    no longer finds an ancestor behind them, and waits like anyone else."""
    prefix = f"{keeper}:"
    return ";".join(
        f"{supervisor}:{item[len(prefix) :]}" if item.startswith(prefix) else item
        for item in held.split(";")
    )
