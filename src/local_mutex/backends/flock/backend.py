"""The flock backend: a lock directory on this machine."""

from __future__ import annotations

import os
import stat
import time

from ...errors import InvalidLockDir, NotOurHold, Refused, UnsafeLockFile, Unsupported
from ...identity import ENV_TOKEN, owned
from ...names import display, lock_filename, validate_name
from .lock import FlockLock
from .lockdir import allow_other_owner_from_env, resolve_lock_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from ...ui.lines import Reporter
    from .. import Ending
    from ..base import HoldInfo, LockStatus, Released


# How long ``release`` waits for a holder to put back a lock file a tmp cleaner deleted.
_PUT_BACK_WAIT = 2.0


class FlockBackend:
    kind = "flock"
    persistent_holds = False
    # Options of the command line that mean nothing here (they are for remotes).
    refuses: tuple[str, ...] = ("key_prefix", "lease", "poll", "delete_branch")
    unlisted: Sequence[str] = ()

    def __init__(
        self,
        lock_dir: str | None,
        *,
        env: Mapping[str, str],
        allow_other_owner: bool | None = None,
        reading: bool = False,
    ) -> None:
        self.env = env
        self.lock_dir = resolve_lock_dir(lock_dir, env, writable=not reading)
        self.address = self.lock_dir
        self.warning = None if reading else _swappable(self.lock_dir)
        if allow_other_owner is None:
            allow_other_owner = allow_other_owner_from_env(env)
        self.allow_other_owner = allow_other_owner

    def path_of(self, name: bytes) -> str:
        return os.path.join(self.lock_dir, lock_filename(validate_name(name)))

    def lock(self, name: bytes) -> FlockLock:
        return FlockLock(
            validate_name(name),
            self.lock_dir,
            allow_other_owner=self.allow_other_owner,
            env=self.env,
        )

    def status(self, name: bytes) -> LockStatus:
        from .slots import gate_path, slots_to_look_at
        from .state import add_gate_queue, status_of_path

        path = self.path_of(name)
        st = status_of_path(path, display(name), allow_other_owner=self.allow_other_owner)
        for slot in slots_to_look_at(path):
            try:
                found = status_of_path(
                    slot, display(name), allow_other_owner=self.allow_other_owner
                )
            except UnsafeLockFile as exc:  # blocks `--slots` runs, not the plain lock
                st.refused_slots.append(str(exc))
                continue
            if found.held or os.path.lexists(slot):  # (held on a file just deleted, too)
                st.slots.append(found)
        if st.slots:  # waiting for a slot, after the plain lock's own waiters
            add_gate_queue(st.waiters, gate_path(path))
        return st

    def list_locks(self, *, include_free: bool) -> list[LockStatus]:
        from .state import list_locks

        unlisted: list[str] = []
        found = list_locks(
            self.lock_dir,
            include_free=include_free,
            unlisted=unlisted,
            allow_other_owner=self.allow_other_owner,
        )
        self.unlisted = unlisted
        return found

    def history(self, name: bytes) -> list[dict[str, Any]]:
        raise Unsupported("history is kept only by git remotes (--remote URL)")

    def hold_persistent(
        self,
        name: bytes,
        *,
        wait: float | None,
        ttl: float | None,
        message: str | None,
        reporter: Reporter | None = None,
    ) -> HoldInfo:
        raise Unsupported("holds on this machine are kept by a holder process")

    def release_hold(self, name: bytes, ending: Ending) -> Released:
        """End the hold on ``name`` started by this job (or with ``token``; any with
        ``force``) by stopping its holder process."""
        from ..base import Released
        from . import record
        from .state import status_of_path

        env, force, slots = ending.env, ending.force, ending.slots
        if ending.delete_branch:
            raise Unsupported("--delete-branch is for git remotes (--remote URL)")
        token = ending.token or env.get(ENV_TOKEN) or None
        label = display(validate_name(name))
        path = self.path_of(name)
        candidates = _slot_candidates(path) if slots else [path]
        refusal: Refused | None = None
        for candidate in candidates:  # a file deleted from its path a moment ago
            ended = _end_lost_hold(candidate, label, ending, token)
            if isinstance(ended, Released):
                return ended
            if ended is not None and not slots:
                raise ended
            refusal = ended or refusal  # (one of a name's slots: another may be ours)
        existing = [c for c in candidates if os.path.lexists(c)]
        if not existing and refusal is None:
            where = "slot files" if slots else "lock file"
            raise InvalidLockDir(
                f"no {where} for {label} in {self.lock_dir!r}; was the hold taken in "
                "another lock dir?"
            )
        for candidate in existing:
            try:
                st = status_of_path(candidate, allow_other_owner=True)
            except UnsafeLockFile:  # (a directory at a slot path, say): no hold is there
                continue
            if not st.held:
                continue
            rec = record.read_record(candidate)
            pids = {h.pid for h in st.holders}
            if rec is None or not rec.get("hold") or rec.get("pid") not in pids:
                who = ", ".join(str(p) for p in sorted(p for p in pids if p)) or "?"
                refusal = NotOurHold(
                    f"lock {label} is held by pid {who}, which is not a hold; "
                    "release only ends holds started with `local-mutex hold`"
                    if rec is None or not rec.get("hold") or _running(rec.get("pid"))
                    else f"the hold on {label} is over (its holder, pid {rec.get('pid')}, is "
                    f"gone), but what ran inside it holds the lock until it ends: pid {who}; "
                    "there is no hold left to release"
                )
                continue
            if not force and not owned(rec, env, token):
                refusal = _not_ours(label, rec["pid"])
                continue
            pid = int(rec["pid"])
            from .ending import end_holder

            end_holder(pid, candidate, label, rec.get("user"))
            return Released(candidate, True, pid, _held_for(rec))
        if refusal is not None:
            raise refusal
        return Released(existing[0] if existing else path, False)

    def close(self) -> None:
        pass


def _lost_hold(path: str) -> tuple[int, dict[str, Any]] | None:
    from .predecessor import lost_hold

    return lost_hold(path)


def _slot_candidates(path: str) -> list[str]:
    """The slot paths ``release --slots`` looks at: each index up to the last slot file
    there and the next, and any whose lock is held on a file deleted from it (a tmp
    cleaner takes files of one age together: every slot file of a pool, perhaps)."""
    from .slots import slot_path, slots_to_look_at
    from .state import held_deleted_from, slot_index

    candidates = slots_to_look_at(path)
    base = os.path.basename(path)[: -len(".lock")] + ".slot"
    for st in held_deleted_from(os.path.dirname(path), []):
        index = slot_index(st.lock_file)
        if index is None or not os.path.basename(st.lock_file).startswith(base):
            continue  # another name's lock file, or its plain one
        if slot_path(path, index) not in candidates:
            candidates.append(slot_path(path, index))
    return candidates


def _end_lost_hold(
    path: str, label: str, ending: Ending, token: str | None
) -> Released | Refused | None:
    """A hold whose file a tmp cleaner deleted from ``path`` and that did not put one back
    (a stopped holder, say) is ended where it is: what ``release`` did, or why not."""
    from ..base import Released
    from .state import status_of_path

    lost = _lost_hold(path)
    if lost is not None and not _waited_for_put_back(path, lost[0]):
        pid, held = lost
        if not ending.force and not owned(held, ending.env, token):
            return _not_ours(label, pid)
        from .ending import end_holder

        end_holder(pid, path, label, held.get("user"), gone=lambda: not _lost_hold(path))
        return Released(path, True, pid, _held_for(held))
    if not os.path.lexists(path) and status_of_path(path, allow_other_owner=True).held:
        _wait_for_a_file(path)  # put back by a holder that is no hold: said by the caller
    return None


def _waited_for_put_back(path: str, pid: int) -> bool:
    """A tmp cleaner deleted the file under a hold, whose holder puts one back (with its
    record) within its next look, 0.1 s: wait for that, rather than say there is no lock
    here, or end a hold that holds no file at the path. False if it did not."""
    from . import record
    from .state import status_of_path

    deadline = time.monotonic() + _PUT_BACK_WAIT
    while time.monotonic() < deadline:
        rec = record.read_record(path)
        ours = rec is not None and rec.get("hold") and rec.get("pid") == pid
        if ours and pid in {h.pid for h in status_of_path(path, allow_other_owner=True).holders}:
            return True
        time.sleep(0.02)
    return False


def _wait_for_a_file(path: str) -> None:
    deadline = time.monotonic() + _PUT_BACK_WAIT
    while not os.path.lexists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def _not_ours(label: str, pid: object) -> Refused:
    return NotOurHold(
        f"the hold on {label} (pid {pid}) belongs to another job or token; give its token "
        "($LOCAL_MUTEX_HOLD_TOKEN), or --force to end it anyway"
    )


def _held_for(rec: Mapping[str, Any]) -> float | None:
    since = rec.get("since_epoch")
    return time.time() - since if isinstance(since, (int, float)) else None


def _running(pid: object) -> bool:
    from ..._proc import running

    return isinstance(pid, int) and running(pid)


def _swappable(path: str) -> str | None:
    """Why other users could swap this lock dir's files (callers then lock apart), if they
    could: a directory anybody may write that is not sticky, or a symlink of another
    user's (they can point it elsewhere). Used all the same, with a warning."""
    try:
        link = os.lstat(path.rstrip("/") or "/")
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, os.geteuid()):
        return (
            f"lock dir {path!r} is a symlink of another user's (uid {link.st_uid}): they can "
            "point it elsewhere, and callers then lock apart"
        )
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return (
            f"lock dir {path!r} is writable by every user and not sticky: any of them can "
            "delete or replace its lock files (chmod +t it, or use a directory of your own)"
        )
    return None
