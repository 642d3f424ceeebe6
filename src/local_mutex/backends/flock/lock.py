"""One name in one lock directory: the ``Lock`` of the flock backend.

The lock is ``flock(2)`` on ``<lock-dir>/local-mutex-<sha256>.lock``. Two things make the
lock file the file *at the path*: after every successful flock the path must still name
the locked inode (a waiter that woke on a file deleted or replaced while it waited retries
on the file now there), and while held, ``check`` puts a locked file back within a tick when
a tmp cleaner deletes or renames ours -- a newcomer cannot tell a deleted holder's path from
a free one, so the holder must notice first.
"""

from __future__ import annotations

import os
import time

from ... import _proc, nesting
from ...errors import NotAcquired, UnsafeLockFile
from ...names import display, lock_filename
from ...ui.lines import describe_holder, duration
from . import kernel, record
from .lockdir import (
    ENV_LOCK_DIR,
    as_proc_names_it,
    cannot_put_back,
    file_id,
    is_file_at,
    names_inode,
    open_or_create,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping, Sequence
    from typing import Any

    from ...ui.lines import Reporter
    from .. import Take

# How often a holder looks at its lock file's path: the bound is 250 ms.
WATCH_INTERVAL = 0.1
# A waiter waking on replaced files this often within ``RETRY_WINDOW`` seconds gives up (exit
# 2): a cleaner deleting faster than anyone can take the lock (a slower one never wears it out).
MAX_RETRIES = 20
RETRY_WINDOW = 2.0
# A holder's record follows its lock within microseconds: looks for it before a holder is
# described by its command line alone (flock(1) and other programs write none).
_RECORD_LOOKS, _RECORD_LOOK_EVERY = 4, 0.01


class FlockLock:
    """A validated name, its lock file, and an open descriptor on it (not yet locked)."""

    def __init__(
        self, raw: bytes, lock_dir: str, *, allow_other_owner: bool, env: Mapping[str, str]
    ) -> None:
        self.raw = raw
        self.label = display(raw)
        self.lock_dir = lock_dir
        self.path = os.path.join(lock_dir, lock_filename(raw))
        self.lock_file = self.path
        self.allow_other_owner = allow_other_owner
        self.env = env
        # fresh: we created the file, so a held one may just have been deleted (``predecessor``)
        self.fd, self.fresh = open_or_create(self.path, allow_other_owner=allow_other_owner)
        self.shared = False
        self.stop_grace = 0.0  # nothing to renew: the kernel keeps this lock for us
        self.slot: int | None = None
        self.held = False
        self.record: dict[str, Any] | None = None
        self.spares: list[int] = []  # files we put back at the path while holding
        # (device, inode) of the files runs inside a hold joined with (``share``): gone from
        # the path, they stay held (and guarded) while those runs' commands may hold them.
        self.given: set[tuple[int, int]] = set()
        self.lost_to: int | None = None  # pid that took a replacement file before us
        self.cannot_create: int | None = None  # why no file could be put back (errno)
        self.guardian: int | None = None  # holds the file put back too (``guardian``)
        # Inside a hold: its descriptions of the lock, and our connection to its holder.
        self.joined: tuple[socket.socket, list[int]] | None = None
        self.hold_run: str | None = None  # the name its holder gave us
        self.join_failed = False  # a hold's holder that could not share its lock with us
        self.reentrant = False  # a run that may join its job's hold (with its token)
        self.token: str | None = None
        # Held through our own inherited description: the env to look again with (``ancestry``)
        self.waits_on_us: Mapping[str, str] | None = None

    # -- who we are ----------------------------------------------------------------------

    def held_through_us(self) -> bool:
        """Do descriptions this process inherited hold this lock (/proc; True once closed)?"""
        return self.fd < 0 or _proc.holds_lock(os.getpid(), {file_id(self.fd)})

    def _key(self) -> str:
        return _file_key(self.fd)

    def enclosing(self, env: Mapping[str, str], slots: int | None = None) -> tuple[int, str] | None:
        if slots is None:
            found = nesting.enclosing_hold(env, self._key(), file_id(self.fd))
            if found is None and env.get(nesting.ENV_HELD):  # inside some lock
                from .ancestry import enclosing

                found = enclosing(self, env)
            return found
        from .slots import enclosing_slot  # a lock apart from the plain one

        return enclosing_slot(self, env, slots)

    def held_by_our_hold(
        self,
        env: Mapping[str, str],
        token: str | None,
        slots: int | None = None,
        wait: float | None = None,
        reporter: Reporter | None = None,
    ) -> int | None:
        """The pid of a ``hold`` of this very job (or token) that has this lock busy (with
        ``slots``: one of those slots); the hold's descriptions of the lock are then ours
        too while we are open (``share``). A hold that ends while we ask is asked again,
        and is then gone: None. Where it did not share (``join_failed``), the caller takes
        the lock as anyone else would. ``wait`` bounds the moment we give a hold to take a
        new lock file back after a tmp cleaner (``predecessor``)."""
        from .joining import join_ours
        from .predecessor import let_our_hold_adopt
        from .slots import slot_paths

        self.reentrant, self.token = True, token
        if slots is None:
            stuck = let_our_hold_adopt(self, env, token, wait)
            if stuck is not None:
                self.join_failed = True
                return stuck
        paths = [self.path] if slots is None else slot_paths(self.path, slots)
        return join_ours(self, paths, env, token, wait)

    def descriptions(self) -> list[int]:
        """Our open descriptions of the held lock (with the files we put back)."""
        return [fd for fd in (self.fd, *self.spares) if fd >= 0]

    def at_path(self) -> list[int]:
        """The description of the file now at the path (for a hold to share); once another
        took the file at the path first (``putback``), those of the file deleted from it."""
        here = [fd for fd in self.descriptions() if names_inode(self.path, fd)]
        return here if here or self.lost_to is None else self.descriptions()

    def hand_over(self, runs: Sequence[str] = ()) -> None:
        """Close our descriptions without unlocking them: runs inside our hold share them,
        and the lock is held until the last of those ends. The hold's record goes: the hold
        is over (a run must not take it for a hold to join), and ``status`` names the runs;
        what stays says where the file is (a file moved away is known by it: ``predecessor``)
        and which ``runs`` it is left to (their calls run inside it: ``ancestry``)."""
        left = {"lock_file": as_proc_names_it(self.path), "message": record.HANDED_OVER}
        if runs:
            left["left_runs"] = " ".join(runs)
        if self.record is not None:
            for fd in self.descriptions():  # a full disk: the hold's record stays, naming
                record.rewrite_record(fd, left, self.record)  # them too (``ancestry``)
        self.held = False
        # A guardian holds the file put back for as long as the lock on the deleted file
        # lives: the commands inside hold that lock now, so it stays (it ends by itself).
        self.guardian = None
        self.close()

    # -- taking it -----------------------------------------------------------------------

    def acquire(self, take: Take) -> float:
        shared, slots, wait = take.shared, take.slots, take.wait
        reporter, progress = take.reporter, take.progress
        if slots is not None:
            from .slots import acquire_slot

            return acquire_slot(self, slots, wait, reporter)
        self.shared = shared
        start = time.monotonic()
        announced = False
        replaced: list[float] = []  # when we woke on a replaced file, within the window
        while len(replaced) < MAX_RETRIES:
            remaining = None if wait is None else max(wait - (time.monotonic() - start), 0.0)
            got, announced = self._take_once(
                shared, remaining, reporter, progress, start, announced
            )
            if not got:
                holder = self.busy_holder()
                waited = time.monotonic() - start
                raise NotAcquired(_not_acquired_text(self.label, waited, holder), holder, waited)
            if names_inode(self.path, self.fd):
                self.held = True
                # Rare (see ``predecessor``): once we waited there, look at the path again.
                if (self.fresh or self._marked()) and self._wait_out_predecessor(
                    wait, start, reporter
                ):
                    announced = True
                    self.held = names_inode(self.path, self.fd)
            if self.held:
                waited = time.monotonic() - start if announced else 0.0
                if reporter is not None and announced:
                    reporter.acquired(self.label, waited)
                return waited
            # We woke on a file deleted or replaced while we waited: it locks nothing.
            kernel.unlock(self.fd)
            os.close(self.fd)
            self.fd, self.fresh = open_or_create(
                self.path, allow_other_owner=self.allow_other_owner
            )
            now = time.monotonic()
            replaced = [t for t in replaced if now - t < RETRY_WINDOW] + [now]
        raise UnsafeLockFile(
            f"lock file {self.path!r} was deleted or replaced {MAX_RETRIES} times within "
            f"{RETRY_WINDOW:g}s while we took it; something keeps removing lock files in "
            "that directory"
        )

    def _take_once(
        self,
        shared: bool,
        wait: float | None,
        reporter: Reporter | None,
        progress: float | None,
        start: float,
        announced: bool,
    ) -> tuple[bool, bool]:
        """(got it, announced a wait so far)."""
        with kernel.interruptible():
            if kernel.try_lock(self.fd, shared=shared):
                if reporter is not None and not announced:
                    reporter.waiting(self.label, None)
                return True, announced
            holder = self.busy_holder()
            if reporter is not None and not announced:
                reporter.waiting(self.label, holder)
            if wait is not None and wait <= 0:
                return False, True
            from ...ui.progress import Progress  # only paid for when the lock is busy

            with Progress(reporter, self.label, progress, start, self._look):
                if self.waits_on_us is None:
                    return kernel.wait_lock(self.fd, shared=shared, timeout=wait), True
                from .ancestry import wait_looking_again  # rare: only ``ancestry`` sets it

                return wait_looking_again(self, shared, wait), True

    def _marked(self) -> bool:
        """Something in the file but shared holders' mark: a new file's, or a record left."""
        size = os.fstat(self.fd).st_size
        return bool(size) and not record.only_shared_mark(self.fd, self.path)

    def _wait_out_predecessor(
        self, wait: float | None, start: float, reporter: Reporter | None
    ) -> bool:
        """Holding a new file or one with a record left in it: wait out a lock still held
        on a file deleted from the path (True if there was one); NotAcquired past ``wait``."""
        from .predecessor import wait_out

        remaining = None if wait is None else max(wait - (time.monotonic() - start), 0.0)
        waited, holder = wait_out(self, remaining, reporter)
        self.fresh = False
        if holder is not None:
            kernel.unlock(self.fd)  # its record stays: the next taker asks again
            self.held = False
            spent = time.monotonic() - start
            raise NotAcquired(_not_acquired_text(self.label, spent, holder), holder, spent)
        return waited

    def _look(self) -> tuple[dict[str, Any] | None, str | None]:
        """For the progress line: who holds it, and where we stand in the queue."""
        from .state import queue_position

        return self.busy_holder(), queue_position(self.path)

    def busy_holder(self) -> dict[str, Any] | None:
        """The kernel's holder (the one its record names: a run inside a hold holds the
        hold's lock too), as ``status`` names it, or None. A holder that took the lock a
        moment ago gets that moment to write its record: without it, it is known by its
        command line alone (the action's is the interpreter running its bootstrap). Never
        the record alone: one a SIGKILLed holder left names a process long gone."""
        from .state import kernel_holders  # only paid for when the lock is busy

        for _ in range(_RECORD_LOOKS):
            holders = kernel_holders(self.path)
            named = [h for h in holders if h.source == "record"]
            if named or not holders or holders[0].mode != "exclusive":
                break
            time.sleep(_RECORD_LOOK_EVERY)
        return (named or holders)[0].as_dict() if holders else None

    # -- while held ----------------------------------------------------------------------

    def write_record(self, rec: Mapping[str, Any]) -> None:
        if self.shared:  # many: the kernel lists them; only where the file is (``record``)
            record.mark_shared(self.fd, as_proc_names_it(self.path))
            return
        self.record = dict(rec)
        if self.slot is not None:
            self.record["slot"] = self.slot
        # Where it is: a file renamed away (a tmp cleaner) is known by it (``predecessor``).
        self.record["lock_file"] = as_proc_names_it(self.path)
        if not record.write_record(self.fd, self.record, self.path) and rec.get("hold"):
            from ...errors import RecordNotWritten

            raise RecordNotWritten(
                f"took {self.label} but cannot write its holder record: {self.path!r} is "
                "another user's file (read-only to us), and a hold without a record could "
                "never be released; let it go"
            )

    def farewell(self) -> tuple[int, bytes] | None:
        """Inside a hold: the connection to its holder, and what tells it we are done."""
        if self.joined is None:
            return None
        from .share import BYE

        return self.joined[0].fileno(), BYE

    def keep_fds(self) -> tuple[int, ...]:
        # Inside a hold, the hold's that we joined (the command's too: they outlive us).
        return tuple(self.joined[1]) if self.joined else tuple(self.descriptions())

    def check_interval(self) -> float | None:
        return WATCH_INTERVAL

    def check(self) -> str | None:
        """Put a locked file back at the path if ours was deleted or renamed."""
        if self.guardian is None and not self.spares and is_file_at(self.path, self.fd):
            self.cannot_create = None
            return None  # the common case, looked at without loading what a put-back needs
        try:
            from .putback import put_back
        except OSError as exc:  # out of descriptors: not even that code can be read
            return cannot_put_back(self, exc)
        return put_back(self)

    # -- letting go ----------------------------------------------------------------------

    def release(self) -> None:
        """Clear the record, drop the lock for every holder of its descriptions (leftover
        background processes of the command run on without it), close."""
        for fd in (self.fd, *self.spares):
            if fd < 0:
                continue
            if self.held and self.record is not None:
                record.clear_record(fd)
            try:
                kernel.unlock(fd)
            except OSError:
                pass
        self.held = False
        self.close()

    def abandon(self) -> None:
        self.release()

    def close(self) -> None:
        for fd in (self.fd, *self.spares):
            if fd >= 0:
                try:
                    os.close(fd)  # closing the last descriptor is what releases the lock
                except OSError:
                    pass
        self.fd, self.spares = -1, []
        if self.guardian is not None:
            from .guardian import end

            end(self.guardian)
            self.guardian = None
        if self.joined is not None:
            from .share import leave

            conn, fds = self.joined
            self.joined = None
            for fd in fds:
                os.close(fd)  # never unlocked: they are the hold's
            leave(conn)  # our command is over: the hold's end may unlock

    def child_env(self, env: Mapping[str, str], held: bool) -> dict[str, str]:
        """The caller's environment plus what nested calls need to join our lock domain."""
        out = dict(env)
        out[ENV_LOCK_DIR] = self.lock_dir
        out.pop(nesting.ENV_REMOTE, None)
        if held and self.fd >= 0:
            out[nesting.ENV_HELD] = nesting.extend(
                env, nesting.entry(os.getpid(), self._key(), self.shared)
            )
        elif self.joined is not None:
            # Inside our job's hold, holding its lock: the command's own calls of this name
            # are inside it too (verified as any entry is: our supervisor holds that lock).
            for fd in self.joined[1]:
                entry = nesting.entry(os.getpid(), _file_key(fd), False)
                out[nesting.ENV_HELD] = nesting.extend(out, entry)
            if self.hold_run is not None:  # should keeper and supervisor die (``ancestry``)
                out[nesting.ENV_HOLD_RUN] = self.hold_run
        return out


def _file_key(fd: int) -> str:
    """How ``LOCAL_MUTEX_HELD`` names a lock file: its device:inode."""
    return "{}:{}".format(*file_id(fd))


def _not_acquired_text(label: str, waited: float, holder: Mapping[str, Any] | None) -> str:
    text = f"lock {label} not acquired after waiting {duration(waited)}"
    return text + (f"; held by {describe_holder(holder)}" if holder else "")
