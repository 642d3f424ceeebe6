"""Stopping a command for good: its process group, and every descendant we adopted.

On Linux the supervisor (and the CLI's keeper) is a child subreaper: a descendant whose
parent dies is re-parented to it instead of to PID 1, so "every descendant is gone" is
exactly "we have no children left", zombies are reaped by us (never counted as alive), and
descendants that left the process group (``setsid``) are still found and stopped. Elsewhere
the process group is what can be stopped.
"""

from __future__ import annotations

import errno
import os
import sys
import time

from .. import _proc
from .._fastsignal import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

_PR_SET_CHILD_SUBREAPER = 36
# Only a process in uninterruptible sleep outlives SIGKILL; do not wait on it forever.
GIVE_UP_AFTER_KILL = 3.0
POLL = 0.02
# Processes of the command looked at before a signal, at most (a fork bomb is not walked).
_MAX_WALKED = 10_000


def load_prctl() -> int | None:
    """prctl(2) through the C half of ctypes (``import ctypes`` costs a plain run ~2 ms)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import _ctypes

        c: Any = _ctypes
        return int(c.dlsym(c.dlopen(None, 2), "prctl"))
    except (ImportError, AttributeError, OSError):
        return None


def become_subreaper(prctl: int | None) -> bool:
    """Orphans of our descendants come to us instead of PID 1 (Linux >= 3.4)."""
    if prctl is None:
        return False
    import _ctypes

    c: Any = _ctypes
    try:
        return bool(c.call_function(prctl, (_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0)
    except (AttributeError, OSError, TypeError):
        return False


def keep_exit_statuses() -> bool:
    """Exit statuses need SIGCHLD at its default: a caller that ignores it (bash's
    ``trap '' CHLD``, inherited across exec) has the kernel reap our children unasked, and
    every status -- the supervisor's, the command's -- would be lost. Put back to the
    default (a run starts from the main thread only); True if it was ignored."""
    if signal.getsignal(signal.SIGCHLD) != signal.SIG_IGN:
        return False
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    return True


def ignore_exit_statuses(was_ignored: bool) -> None:
    if was_ignored:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)


def reap_strays() -> bool:
    """Reap adopted children that have ended (only for a process that has no children of
    its own to wait for: the CLI's keeper); are any left, still running?"""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        except InterruptedError:
            continue
        if pid == 0:
            return True


def group_holding(fds: Sequence[int]) -> int | None:
    """The command's process group, found the way the kernel sees it, for when the
    supervisor died before it could tell us: a group leader in our session, started after
    us, that holds one of our lock's descriptions (a socket we share, or a file open with
    our lock granted on it -- a waiter on the same file has none, and another run's shared
    lock is another description's). None without /proc."""
    if not fds or not _proc.USE_PROC:
        return None
    wanted: set[tuple[int, int]] = set()
    locks: set[str] = set()
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        wanted.add((st.st_dev, st.st_ino))
        # Our description's own locks: another run's shared lock on the same file is not ours.
        locks.update(_proc.granted(os.getpid(), fd))
    me, session = os.getpid(), os.getsid(0)
    mine = _proc.stat_fields(me)
    born = int(mine[19]) if mine else 0
    for entry in os.listdir(_proc.PROC):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        fields = _proc.stat_fields(pid)
        try:
            leader = fields is not None and int(fields[2]) == pid and int(fields[3]) == session
            if not leader or fields is None or int(fields[19]) < born:
                continue
        except (ValueError, IndexError):
            continue
        if _proc.holds_lock(pid, wanted, sockets=True, locks=locks):
            return pid
    return None


def group_alive(pgid: int) -> bool:
    """Does any process of the group still run? Zombies do not count (but where /proc
    cannot be listed -- none, or no memory left for it -- the kernel's answer does)."""
    try:
        entries = os.listdir(_proc.PROC) if _proc.USE_PROC else None
    except OSError:
        entries = None
    if entries is not None:
        for entry in entries:
            if not entry.isdigit():
                continue
            fields = _proc.stat_fields(int(entry))
            if fields and len(fields) > 2 and fields[2] == b"%d" % pgid and fields[0] not in b"ZX":
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Stopper:
    """Sends the stop signals to the command's group (and, as a subreaper, to each child
    we have), reaps, and says when nothing is left."""

    def __init__(
        self, pgid: int | None, subreaper: bool, spare: frozenset[int] = frozenset()
    ) -> None:
        self.pgid = pgid
        self.subreaper = subreaper
        # Children we had before this command started (what earlier items of ``each``
        # left behind, adopted): not this command's, neither stopped nor waited for.
        self.spare = spare
        self.last: int | None = None  # the last signal sent to everyone
        # signal -> the group's members (pid, start time) when it was sent to the group:
        # those are not sent it again as our children (the top process, orphans of the
        # group): a second TERM is "stop now" to many programs.
        self.had: dict[int, frozenset[tuple[int, bytes]]] = {}
        self.kill_at: float | None = None
        self.told: dict[int, int] = {}  # child pid -> the last signal it got from us

    def send(self, sig: int) -> None:
        """To the group (SIGTERM once: again only to members that did not have it) and, as
        a subreaper, to each child that does not have it."""
        self.last = sig
        if sig == signal.SIGKILL and self.kill_at is None:
            self.kill_at = time.monotonic()
        if sig != signal.SIGTERM or sig not in self.had:
            self.send_group(sig)
        else:  # started since, by a member still alive (a TERM trap's clean-up)
            for pid, start in self._members() - self.had[sig]:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    continue
                self.had[sig] |= {(pid, start)}
        if self.subreaper:
            self.tell_children()

    def send_group(self, sig: int) -> bool:
        """To the command's process group (and SIGCONT: a stopped group acts on it now);
        False if there is none any more."""
        if self.pgid is None:
            return False
        before = self._members() if self.subreaper else frozenset()
        try:
            os.killpg(self.pgid, sig)
            if sig != signal.SIGKILL:
                os.killpg(self.pgid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            return False
        # In the group before and after: it got it (not one that left it meanwhile, setsid).
        got = frozenset(m for m in before if self._member(m[0]) == m)
        self.had[sig] = self.had.get(sig, frozenset()) | got
        return True

    def _members(self) -> frozenset[tuple[int, bytes]]:
        """The group's processes now (looked at before the signal: one started after it
        did not get it), each with its start time (a pid may come back). All are our
        descendants (we are a subreaper): a walk down from us, not over every process;
        twice, for one whose parent ended mid-walk (it moved up to us meanwhile)."""
        found: set[tuple[int, bytes]] = set()
        for _ in range(2 if _proc.USE_PROC else 0):  # (without /proc: none known)
            below = _proc.children(os.getpid())
            walked = 0
            while below and walked < _MAX_WALKED:
                pid, walked = below.pop(), walked + 1
                member = self._member(pid)
                if member is not None:
                    found.add(member)
                below += _proc.children(pid)
        return frozenset(found)

    def _member(self, pid: int) -> tuple[int, bytes] | None:
        """(pid, start time) of a process of the group, else None."""
        fields = _proc.stat_fields(pid)
        if fields and len(fields) > 19 and fields[2] == b"%d" % (self.pgid or 0):
            return pid, fields[19]
        return None

    def tell_children(self) -> None:
        """Give the last signal to each child that has not had it: an orphan that left the
        group (adopted since), and what the group's members started after the group was
        sent it (a TERM trap's clean-up in the background); a child busy cleaning up after
        SIGTERM is not signalled again."""
        if self.last is None:
            return
        had = self.had.get(self.last, frozenset())
        for child in _proc.children(os.getpid()):
            if self.told.get(child) == self.last or child in self.spare:
                continue
            self.told[child] = self.last
            member = self._member(child)
            if member is not None and member in had:
                continue
            try:
                os.kill(child, self.last)
            except (ProcessLookupError, PermissionError):
                continue
            if member is not None:  # a member that has it now: the escalation spares it
                self.had[self.last] = had = had | {member}

    def reap(self) -> bool:
        """Reap what has ended; True when no descendant is left (the group's members for
        a process that is not a subreaper, which must not reap children not its own)."""
        if not self.subreaper:
            return not self._group_left()
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if pid == 0:
                return bool(self.spare) and set(_proc.children(os.getpid())) <= self.spare
            self.spare -= {pid}  # its number may come back, on an orphan of this command

    def _group_left(self) -> bool:
        return self.pgid is not None and group_alive(self.pgid)

    def anyone_left(self) -> bool:
        """Does a process of the command still run: one of its group or, for a subreaper,
        an adopted descendant that had left the group (``setsid``)? Zombies do not count;
        nothing is reaped here (the top process's status is the caller's to collect)."""
        if self._group_left():
            return True
        if not self.subreaper:
            return False
        for child in _proc.children(os.getpid()):
            fields = _proc.stat_fields(child)
            if child not in self.spare and fields and fields[0] not in b"ZX":
                return True
        return False

    def gave_up(self) -> bool:
        """A process outlived SIGKILL for a while: uninterruptible sleep; stop waiting."""
        return self.kill_at is not None and time.monotonic() > self.kill_at + GIVE_UP_AFTER_KILL

    def wait_gone(self, until: float | None = None) -> bool:
        """Until nothing is left (True), or a process outlived SIGKILL or the monotonic
        time ``until`` passed (False). Looks again after 1 ms, then less and less often:
        most processes are gone within a few ms of the signal, and the lock is released
        the moment they are."""
        pause = 0.001
        while not self.reap():
            if self.gave_up() or (until is not None and time.monotonic() >= until):
                return False
            if self.subreaper:
                self.tell_children()
            time.sleep(pause)
            pause = min(pause * 2, POLL)
        return True
