"""Which enclosing run holds the lock we found busy, where ``LOCAL_MUTEX_HELD`` alone
cannot tell (``nesting``): its lock file was deleted or renamed since, or everything of the
run but its command was killed. Found through ``/proc``: the enclosing runs' descriptors,
and the locks our own inherited descriptors hold.
"""

from __future__ import annotations

import os
import stat

from ... import nesting
from ...errors import NestingError
from . import record
from .lockdir import as_proc_names_it, file_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Mapping
    from typing import Any

    from .lock import FlockLock


def enclosing(lock: FlockLock, env: Mapping[str, str]) -> tuple[int, str] | None:
    """Inside a run whose lock file was deleted (before its holder put one back, or after
    a hold left its lock to the run we are in): that run's lock encloses us. Found through
    the enclosing runs' own descriptors (``/proc/PID/fd``): one of them, of the file
    LOCAL_MUTEX_HELD names, still names our path, deleted (or its record does, renamed)."""
    path = as_proc_names_it(lock.path)
    return held_by_ancestor([path], env) or held_through_us(file_id(lock.fd), path, env, lock.label)


def held_by_ancestor(paths: Collection[str], env: Mapping[str, str]) -> tuple[int, str] | None:
    """An enclosing run (pid, mode) that holds a file deleted from one of ``paths`` (as
    ``/proc`` names them), or moved away from it."""
    from ..._proc import PROC, is_ancestor, open_files

    for pid, key, mode in nesting.held_entries(env):
        if not is_ancestor(pid):
            continue
        for name, st in open_files(pid):
            if f"{st.st_dev}:{st.st_ino}" != key:
                continue
            through = f"{PROC}/{pid}/fd/{name}"
            try:
                target = os.readlink(through)
            except OSError:
                continue
            if target.endswith(" (deleted)") and target[: -len(" (deleted)")] in paths:
                return pid, mode
            # Moved away (its link names where it is now, perhaps under its old name), or
            # another name's lock file: its record says which lock file it is.
            if record.recorded_path(through) in paths:
                return pid, mode
    return None


def held_through_us(
    here: tuple[int, int], path: str, env: Mapping[str, str], label: str
) -> tuple[int, str] | None:
    """The run we are part of had its keeper and supervisor killed together: its lock is
    its command's alone, through the description the command inherited -- and we inherited
    it too. Waiting would wait for ourselves, and the command with us, for good. A plain
    run's lock counts once its taker (the keeper) is gone, the record in the file its own.
    A hold's, if it was left to our run: its holder, alive, says so (``_left_to_our_command``);
    once it is gone, or the hold's end left the lock to the runs inside
    (``record.handed_over``), its record does (``_named_as_left``). Nobody can unlock such
    a lock then -- it is freed when its last description closes, ours included -- so a
    process it was not left to (a job a finished run left behind) is told, NestingError,
    rather than wait for itself forever. A leftover of a plain run that ended holds nothing
    through it: the run unlocked it. A taker's pid that reads 0 (another PID namespace)
    tells nothing: we wait. ``here``: the file at ``path`` now (device, inode). The
    command's top process, and mode."""
    from ..._proc import PROC, granted, holds_lock, open_files, parent_of, running

    me = os.getpid()
    for fd, st in open_files(me):
        if (st.st_dev, st.st_ino) != here:
            if st.st_dev != here[0] or not stat.S_ISREG(st.st_mode):
                continue  # not a lock file of this dir's file system: no need to look
            # The file at the path, one deleted from it (before its put-back), or one moved
            # away (its record names the path: its link, where it is now).
            through = f"{PROC}/{me}/fd/{fd}"
            try:
                if (
                    os.readlink(through) != path + " (deleted)"
                    and record.recorded_path(through) != path
                ):
                    continue
            except OSError:
                continue
        for line in granted(me, fd):  # "FLOCK ADVISORY WRITE <taker> dev:ino 0 EOF"
            how, taker = line.split()[2:4]
            rec = record.read_record_fd(int(fd))
            if rec is None or not taker.isdigit():
                continue
            handed = record.handed_over(rec)
            if not handed and str(rec.get("pid")) != taker:
                continue  # not its record's taker's lock (or one of another PID namespace)
            if handed or rec.get("hold"):
                if not handed and running(int(taker)):
                    if not _left_to_our_command(int(taker), rec, env):
                        continue  # the holder lives, and unlocks it at the hold's end
                elif not _named_as_left(rec, env):
                    raise NestingError(
                        f"lock {label} is held through a descriptor this process inherited "
                        "from a hold that is over: nobody can unlock it until this process "
                        "and the others holding it are gone, so waiting would wait for "
                        "itself forever; not run"
                    )
            elif running(int(taker)):
                continue  # a plain run's taker, its keeper, lives
            top, up = me, parent_of(me)
            while up is not None and up > 1 and holds_lock(up, {(st.st_dev, st.st_ino)}):
                top, up = up, parent_of(up)
            return top, "x" if how == "WRITE" else "s"
    return None


def _named_as_left(rec: dict[str, Any], env: Mapping[str, str]) -> bool:
    """Does the hold's record, left by a holder that is gone, name the run we are part of
    as one that left without its goodbye (``holder._name_left_runs``)?"""
    run, names = env.get(nesting.ENV_HOLD_RUN), rec.get("left_runs")
    return bool(run) and isinstance(names, str) and run in names.split()


def _left_to_our_command(holder: int, rec: dict[str, Any], env: Mapping[str, str]) -> bool:
    """A hold's description, shared by every run inside the hold and by what they left
    behind: ours only if the run we are part of (as it named itself to the holder:
    LOCAL_MUTEX_HOLD_RUN) left without saying its command was over -- its keeper and
    supervisor died. Its holder, asked, knows; and then it never unlocks the lock, so it
    stays our command's. A job that a finished run left behind must wait: the hold's end
    unlocks what it shares. A holder that cannot be asked (stopped, or its pid another
    process's now): we wait."""
    from .share import left_without_goodbye

    token_sha256, run = rec.get("token_sha256"), env.get(nesting.ENV_HOLD_RUN)
    if not isinstance(token_sha256, str) or not run:
        return False
    return left_without_goodbye(holder, token_sha256, run)
