"""Which enclosing run holds the lock we found busy, where ``LOCAL_MUTEX_HELD`` alone
cannot tell (``nesting``): its lock file was deleted or renamed since, or everything of the
run but its command was killed. Found through ``/proc``: the enclosing runs' descriptors,
and the locks our own inherited descriptors hold.
"""

from __future__ import annotations

import os
import stat
import time

from ... import nesting
from ...errors import EnclosedWhileWaiting, NestingError
from . import kernel, record
from .lockdir import as_proc_names_it, file_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping
    from typing import Any

    from .lock import FlockLock

    Look = Callable[[FlockLock, Mapping[str, str]], tuple[int, str] | None]

# How often a wait for a lock our own description holds looks at who holds it again (its
# holder's end may have left it to our command): only such waits, which are rare, do.
LOOK_AGAIN = 1.0


def enclosing(lock: FlockLock, env: Mapping[str, str]) -> tuple[int, str] | None:
    """Inside a run whose lock file was deleted (before its holder put one back, or after
    a hold left its lock to the run we are in): that run's lock encloses us. Found through
    the enclosing runs' own descriptors (``/proc/PID/fd``): one of them, of the file
    LOCAL_MUTEX_HELD names, still names our path, deleted (or its record does, renamed)."""
    path = as_proc_names_it(lock.path)
    ours: list[int] = []
    found = held_by_ancestor([path], env) or held_through_us(
        file_id(lock.fd), path, env, lock.label, ours
    )
    # Our own description holds what we would wait for: only its holder's unlock lets us
    # on. One that ends without it (a hold over, a holder or keeper killed) may leave the
    # lock to our command, or to nobody we could wait for: looked at again while we wait.
    lock.waits_on_us = env if ours and found is None else None
    return found


def wait_looking_again(lock: FlockLock, shared: bool, wait: float | None) -> bool:
    """``lock.acquire``'s wait for a lock our own description holds (``looking_again``)."""
    again = looking_again(lock)
    deadline = None if wait is None else time.monotonic() + wait
    while lock.waits_on_us is not None:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        part = LOOK_AGAIN if left is None else min(left, LOOK_AGAIN)
        if kernel.wait_lock(lock.fd, shared=shared, timeout=part):
            return True
        if part == left:
            return False
        again()
    left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    return kernel.wait_lock(lock.fd, shared=shared, timeout=left)


def looking_again(lock: FlockLock, look: Look | None = None) -> Callable[[], None]:
    """For a wait for a lock our own description holds (``lock.waits_on_us``): only its
    holder's unlock ends it. A holder that ends without one (a hold over, killed; a run's
    keeper killed) leaves the lock to our command (``EnclosedWhileWaiting``: we run inside)
    or to nobody we could wait for (``NestingError``): called as we wait, this looks again
    (``look``: ``enclosing``) once every ``LOOK_AGAIN`` seconds at most."""
    due = time.monotonic() + LOOK_AGAIN

    def again() -> None:
        nonlocal due
        env = lock.waits_on_us
        if env is None or time.monotonic() < due:
            return
        found = (look or enclosing)(lock, env)
        if found is not None:
            raise EnclosedWhileWaiting(*found)
        due = time.monotonic() + LOOK_AGAIN

    return again


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
    here: tuple[int, int],
    path: str,
    env: Mapping[str, str],
    label: str,
    ours: list[int] | None = None,
) -> tuple[int, str] | None:
    """The run we are part of had its keeper and supervisor killed together: its lock is
    its command's alone, through the description the command inherited -- and we inherited
    it too. Waiting would wait for ourselves, and the command with us, for good. A plain
    run's lock counts once its taker (the keeper) is gone, the record in the file its own;
    a hold's if the hold left it to our run: its live holder says so (``_asked_or_named``),
    or once it is gone, its record (``_named``) -- a process it was not left to is told,
    NestingError, rather than wait for a lock nobody can unlock any more. A leftover of a
    plain run that ended holds nothing through it: the run unlocked it. A taker's pid that
    reads 0 (another PID namespace) tells nothing: we wait. ``here``: the file at ``path``
    now (device, inode); ``ours`` gets each of our descriptors that holds it and does not
    (yet) let us in. The command's top process, and mode."""
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
            if ours is not None:
                ours.append(int(fd))
            how, taker = line.split()[2:4]
            rec = record.read_record_fd(int(fd))
            if rec is None or not taker.isdigit():
                continue
            # A hand-over record counts on an exclusive lock only: a shared lock's takers
            # keep whatever line the file had.
            handed = how == "WRITE" and record.handed_over(rec)
            # Shared holders keep one mark, no pid: each one's own line names its taker.
            shared = how == "READ" and rec.get("shared") is True and rec.get("pid") is None
            if not handed and not shared and str(rec.get("pid")) != taker:
                continue  # not its record's taker's lock (or one of another PID namespace)
            if handed or rec.get("hold"):
                holder, file = int(taker), (st.st_dev, st.st_ino)
                if running(holder) and _still_holds(holder, file, line):
                    # A hold that is over while its holder holds the lock: no record of its.
                    if handed or not _asked_or_named(holder, rec, env):
                        continue  # the holder unlocks it at the hold's end
                elif line not in granted(me, fd):
                    continue  # it unlocked as it went: free, to take as anyone would
                elif not _named(rec, env, "left_runs", "runs_inside"):
                    raise NestingError(
                        f"lock {label} is held through a descriptor this process inherited "
                        "from a hold that is over and did not leave it to this process's "
                        "run: nobody can unlock it until this process and the others "
                        "holding it are gone, so waiting would wait for itself forever; "
                        "not run"
                    )
            elif running(int(taker)):
                continue  # a plain run's taker, its keeper, lives
            top, up = me, parent_of(me)
            while up is not None and up > 1 and holds_lock(up, {(st.st_dev, st.st_ino)}):
                top, up = up, parent_of(up)
            return top, "x" if how == "WRITE" else "s"
    return None


def _still_holds(pid: int, file: tuple[int, int], line: str) -> bool:
    """Does the live process ``pid`` -- a hold's holder, or another process under its pid
    now -- still hold this very lock? One we may not look into is taken to."""
    from ..._proc import PROC, holds_lock

    try:
        os.listdir(f"{PROC}/{pid}/fd")
    except PermissionError:
        return True
    except OSError:
        return False
    return holds_lock(pid, {file}, locks={line})


def _asked_or_named(holder: int, rec: dict[str, Any], env: Mapping[str, str]) -> bool:
    """A live holder's lock is ours if its record names our run among those gone without
    their goodbye (for which it never unlocks: no need to ask, nor to wait two seconds for
    a stopped holder's answer), or if it says so (``_left_to_our_command``): it may not
    have written down a run gone a moment ago."""
    return _named(rec, env, "left_runs") or bool(_left_to_our_command(holder, rec, env))


def _named(rec: dict[str, Any], env: Mapping[str, str], *keys: str) -> bool:
    """Does the hold's record name the run we are part of (LOCAL_MUTEX_HOLD_RUN) under one
    of ``keys`` (``holder._name_runs``, ``FlockLock.hand_over``)? ``left_runs``: gone
    without their goodbye, or left the lock by the hold's end; ``runs_inside``: inside it
    when its holder last wrote the record -- a holder gone since leaves them its lock."""
    run = env.get(nesting.ENV_HOLD_RUN)
    for key in keys:
        names = rec.get(key)
        if run and isinstance(names, str) and run in names.split():
            return True
    return False


def _left_to_our_command(holder: int, rec: dict[str, Any], env: Mapping[str, str]) -> bool | None:
    """A hold's description, shared by every run inside the hold and by what they left
    behind: ours only if the run we are part of (as the holder named it:
    LOCAL_MUTEX_HOLD_RUN) left without saying its command was over -- its keeper and
    supervisor died. Its holder, asked, knows; and then it never unlocks the lock, so it
    stays our command's. A job that a finished run left behind must wait: the hold's end
    unlocks what it shares. None: the holder did not answer."""
    from .share import left_without_goodbye

    token_sha256, run = rec.get("token_sha256"), env.get(nesting.ENV_HOLD_RUN)
    if not isinstance(token_sha256, str) or not run:
        return False
    return left_without_goodbye(holder, token_sha256, run)
