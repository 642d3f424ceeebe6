"""One lock on a git remote: taken by a compare-and-swap push, kept by a leased heartbeat.

A lease cannot fence a process that keeps running after its holder lost it, so the holder
stops its own command first: the deadline to have it stopped is counted from when the
last acknowledged renewal was *sent* (the lease may have started then on a contender's
clock), minus the time a stop takes; past it, ``check`` raises LockLost and the command is
stopped (TERM, then KILL) before anyone can take the lock over. A renewal push that hangs
is cut off at that deadline, so it cannot stall it, or as soon as the command ends. The
holder counts its own lease on the monotonic clock (a step of its wall clock cannot
stretch it); clocks must agree to within a third of the lease.
"""

from __future__ import annotations

import os
import random
import time

from ... import nesting
from ..._fastsignal import interruptible
from ..._proc import decimal
from ...errors import Interrupted, LockLost, NotAcquired, Unavailable, Unsupported
from ...identity import job_identity, run_url, token_hash
from ...names import digest, display
from .letgo import unlock, what_moved, withdraw
from .plumbing import PushRefused
from .protocol import RemoteState, branch_for, describe, format_message, parse_message
from .spawn import Cancelled

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ...ui.lines import Reporter
    from .. import Take
    from .backend import GitBackend

# The lease outlasts a stop three times over: a heartbeat every third of it, and two
# missed renewals still leave time to stop the command before it runs out.
LEASE_PER_STOP = 3.0
_ATTEMPTS = 5
RELEASE_TIMEOUT = 10.0
# Past --wait, how long the git call under way may still take: a take that was answered in
# time (a push to a distant server takes a second or two) is not cut off; a hung one is.
_WAIT_GRACE = 5.0
# What of a holder record a lock commit carries (the rest is in its body already, or local).
_PUBLISHED = ("command", "cwd", "user", "message")


class GitLock:
    def __init__(self, backend: GitBackend, raw: bytes) -> None:
        self.backend = backend
        self.git = backend.git
        self.label = display(raw)
        self.ref = branch_for(self.label, backend.prefix, backend.env)
        self.lock_file = f"{backend.address} {self.ref}"
        self.key = "g-" + digest(self.lock_file.encode("utf-8", "surrogateescape"))[:32]
        self.stop_grace = 7.0
        self.token = os.urandom(16).hex()
        self.ours: RemoteState | None = None
        self.record: dict[str, Any] = {}
        self.acked_sent = 0.0  # when (monotonic) the last renewal that went through was sent
        self.cancel: int | None = None  # readable: the command ended (``cancel_on``)
        self.lease: float | None = None  # set once taken for a run
        # While a lock push of ours may be under way: (the state it replaces, ours).
        self.pending: tuple[RemoteState, RemoteState] | None = None
        # Renewals pushed without an answer (oid: when sent): one may have landed all the
        # same, and the branch then names our own renewal, not someone else's lock.
        self.unanswered: dict[str, float] = {}
        self.warned = False

    # -- reading -------------------------------------------------------------------------

    def read(self) -> RemoteState:
        oid = self.git.fetch(self.ref)
        if oid is None:
            return RemoteState(None, None)
        return parse_message(oid, self.git.message(oid, self.ref), self.ref)

    def enclosing(self, env: Mapping[str, str], slots: int | None = None) -> tuple[int, str] | None:
        return nesting.enclosing_hold(env, self.key)  # slots: refused before (``refuses``)

    # -- taking it -----------------------------------------------------------------------

    def _body(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        env = self.backend.env
        pr = env.get("LOCAL_MUTEX_PULL_REQUEST_NUMBER", "")
        body: dict[str, Any] = {
            "github_actions_workflow_run_url": run_url(env) or "",
            "pull_request_number": decimal(pr),
            "host": os.uname().nodename,
            "pid": os.getpid(),
        }
        body.update(job_identity(env) or {})
        body.update(extra)
        return body

    def try_take(
        self, current: RemoteState, *, message: str, lease: float | None, extra: Mapping[str, Any]
    ) -> RemoteState | None:
        """One CAS attempt to lock; our new state, or None when someone else got there."""
        body = self._body(
            {
                "holder_id": token_hash(self.token)[:16],
                "token_sha256": token_hash(self.token),
                "expires_at": None if lease is None else round(time.time() + lease, 3),
                **extra,
            }
        )
        if current.state == "lock" and current.expired():
            body["takeover_of"] = current.holder_id or current.actor
        text = format_message("lock", self.backend.actor, message, body)
        sent = time.monotonic()
        new = self.git.commit(current.oid, text, self.backend.actor)
        ours = parse_message(new, text, self.ref)
        # From here a stop signal may find the push landed, or about to: see ``take``.
        self.pending = (current, ours)
        try:
            pushed = self.git.push(self.ref, new, current.oid)
        except PushRefused:
            self.pending = None  # the server said no: nothing landed, nothing to undo
            raise
        if not pushed:
            self.pending = None
            return None
        self.acked_sent = sent
        self.ours = self.backend.pushed[self.ref] = ours
        return ours

    def acquire(self, take: Take) -> float:
        """Take it for a run: leased, renewed by ``check`` while the command runs."""
        if take.shared or take.slots is not None:
            raise Unsupported("git remotes have no shared locks or slots")
        lease = self.backend.lease
        if lease < LEASE_PER_STOP * self.stop_grace:
            raise Unsupported(
                f"--lease {lease:g}s is too short: the holder must be able to stop its "
                f"command ({self.stop_grace:g}s with --kill-after) well before the lease "
                f"runs out; give at least {LEASE_PER_STOP * self.stop_grace:g}s"
            )
        # Who holds it goes in the lock commit itself: shown at once, with no push of its own.
        self.write_record(take.record or {})
        message = str(self.record.get("message") or "")  # none given: none invented
        fields = {k: v for k, v in self.record.items() if k != "message"}
        waited = self.take(take.wait, take.reporter, lease=lease, message=message, extra=fields)
        self.lease = lease
        late = time.monotonic() - self.acked_sent
        if time.monotonic() >= self._stop_by(lease):
            # Acknowledged so late that the command would be stopped as it starts, beside
            # whoever takes the lease over once it runs out: run nothing under it.
            self.abandon()
            raise Unavailable(
                f"remote lock {self.label} was taken, but {self.backend.address} took "
                f"{late:.1f}s to acknowledge it, too late to run anything under a {lease:g}s "
                "lease; let go again"
            )
        return waited

    def take(
        self,
        wait: float | None,
        reporter: Reporter | None,
        *,
        lease: float | None,
        message: str,
        extra: Mapping[str, Any],
    ) -> float:
        """Take it with this lease (None: until released), message and body fields."""
        start = time.monotonic()
        limit = None if wait is None else start + max(wait, 0.0) + _WAIT_GRACE
        self.git.deadline = limit  # every git call of the take ends by then, a hung one too
        try:
            with interruptible():
                # What this process itself pushed last: a CAS straight on it saves reading
                # the branch (the CAS still guards it; on a miss we read as usual).
                last = self.backend.pushed.get(self.ref)
                current = last if last is not None and not last.locked else self.read()
                busy = current.locked
                if reporter is not None:
                    detail = (
                        f"held on {self.backend.address} by {describe(current)}" if busy else None
                    )
                    reporter.waiting(self.label, None, detail=detail)
                ours, slept = self._take(current, start, wait, lease, message, extra)
                if reporter is not None and (busy or slept):
                    reporter.acquired(self.label, time.monotonic() - start)
        except (Interrupted, KeyboardInterrupt, Unavailable) as exc:
            # Stopped (or failed: a timeout, a lost answer) with a lock push started: the
            # server may apply it even though we gave up on it, and we would exit saying
            # nothing ran while the branch stays locked. Undo it before we go.
            note = withdraw(self, *self.pending) if self.pending is not None else ""
            if note and not isinstance(exc, KeyboardInterrupt):
                exc.args = (f"{exc}{note}",)
            elapsed = time.monotonic() - start
            if isinstance(exc, Unavailable) and limit is not None and time.monotonic() >= limit:
                raise NotAcquired(
                    f"remote lock {self.label} not acquired after {elapsed:.1f}s: {exc}",
                    None,
                    elapsed,
                ) from None
            raise
        finally:
            self.pending = None
            self.git.deadline = None
        if "takeover_of" in ours.body and reporter is not None:
            why = "the previous holder's lease had expired"
            reporter.notice(f"took over remote lock {self.label}: {why}", notable=True)
        return time.monotonic() - start

    def _take(
        self,
        current: RemoteState,
        start: float,
        wait: float | None,
        lease: float | None,
        message: str,
        extra: Mapping[str, Any],
    ) -> tuple[RemoteState, bool]:
        """Our lock state once taken, and whether we waited for it (a race lost counts)."""
        last_oid = current.oid
        slept = False
        poll = self.backend.poll
        unexplained = 0  # pushes in a row that failed while the branch stayed as it was
        unreachable = 0  # polls in a row the server did not answer
        while True:
            if not current.locked:
                ours = self.try_take(current, message=message, lease=lease, extra=extra)
                if ours is not None:
                    return ours, slept
                seen = self.read()
                if seen.oid != current.oid:  # lost the race: look again at once
                    current, last_oid, unexplained = seen, seen.oid, 0
                    continue
                # The branch did not move, so no one beat us to it: a concurrent push
                # still under way, or a refusal that lasts. Wait as for a holder, and
                # do not try for ever.
                current, last_oid, unexplained = seen, seen.oid, unexplained + 1
                if unexplained >= _ATTEMPTS:
                    raise Unavailable(
                        f"remote lock {self.label} not taken; {self._not_taken(unexplained)}"
                    )
            elapsed = time.monotonic() - start
            if wait is not None and elapsed >= wait:
                why = f"held by {describe(current)}" if current.locked else ""
                if unreachable:  # what we last saw may be long gone: say what we know
                    why = f"{self.backend.address} did not answer (last seen {why or 'free'})"
                raise NotAcquired(
                    f"remote lock {self.label} not acquired after {elapsed:.1f}s; "
                    + (why or self._not_taken(unexplained)),
                    current.as_dict(),
                    elapsed,
                )
            pause = poll * random.uniform(0.8, 1.2)  # jitter: contenders do not march in step
            if wait is not None:
                pause = min(pause, max(wait - elapsed, 0.0))
            time.sleep(pause)
            slept = True
            try:
                # A cheap ls-remote first; fetch the commit only when the branch moved.
                if self.git.head(self.ref) != last_oid:
                    current = self.read()
                    last_oid = current.oid
                unreachable = 0
            except Unavailable:
                # A server restarting, a network blip: a waiter rides it out, as the holder
                # does its renewals, within --wait; only an outage that lasts ends the wait.
                unreachable += 1
                if unreachable >= _ATTEMPTS:
                    raise

    def _not_taken(self, tries: int) -> str:
        pushes = "a push" if tries == 1 else f"{tries} pushes"
        why = self.git.refusal or "git gave no reason"
        return f"it is free, but {pushes} to {self.backend.address} did not take it: {why}"

    # -- while held ----------------------------------------------------------------------

    def write_record(self, record: Mapping[str, Any]) -> None:
        """Kept for the renewals: ``acquire`` put it in the lock commit (no push of its own)."""
        self.record = {k: v for k, v in record.items() if k in _PUBLISHED}

    def keep_fds(self) -> tuple[int, ...]:
        return ()

    def close(self) -> None:
        pass

    def _lease(self) -> float | None:
        return None if self.ours is None else self.lease

    def _stop_by(self, lease: float) -> float:
        """When (monotonic) the command must have been stopped: a third of the lease before
        it runs out (clocks off by less cannot let a contender in), or the stop's time."""
        return self.acked_sent + lease - max(self.stop_grace, lease / 3)

    def stop_deadline(self) -> float | None:
        """``_stop_by``, for the supervisor to enforce even if this process is frozen."""
        lease = self._lease()
        return None if lease is None else self._stop_by(lease)

    def check_interval(self) -> float | None:
        lease = self._lease()
        if lease is None:
            return None
        # No later than the deadline: the command is stopped at it, not up to a tick past.
        return max(min(1.0, lease / 10, self._stop_by(lease) - time.monotonic()), 0.01)

    def cancel_on(self, fd: int) -> None:
        self.cancel = fd  # a hung renewal must not hold the caller after the command ended

    def check(self) -> str | None:
        """Renew every third of the lease; stop the command in time if renewals fail."""
        lease, ours = self._lease(), self.ours
        if lease is None or ours is None:
            return None
        now = time.monotonic()
        if now < self.acked_sent + lease / 3:
            return None
        stop_by = self._stop_by(lease)
        if now >= stop_by:
            raise self._lost()
        body = {**ours.body, **self.record, "expires_at": round(time.time() + lease, 3)}
        text = format_message("lock", ours.actor, ours.message, body)
        # A hung push (or the read after a refused one) must not stall the deadline.
        self.git.deadline = now + max(stop_by - now, 0.5)
        self.git.cancel = self.cancel
        moved = False
        try:
            new = self.git.commit(ours.oid, text, self.backend.actor)
            self.unanswered[new] = now
            if not self.git.push(self.ref, new, ours.oid):
                seen = self.git.fetch(self.ref)
                if seen is not None and seen != new and seen in self.unanswered:
                    # An earlier renewal of ours landed, its answer lost: ours still, as
                    # of when that one was sent. Renew on top of it next time.
                    self._renewed(seen, self.unanswered[seen])
                    return None
                if seen == ours.oid:
                    # Refused, yet nobody moved the branch: still ours, a failed push like
                    # any other; the next check tries again before the deadline.
                    raise Unavailable(
                        f"the push was refused while the branch stayed ours "
                        f"({self.git.refusal or 'git gave no reason'})"
                    )
                moved = seen != new  # else: it went through after all
        except Cancelled:
            return None  # the command is over; a renewal that landed is ours to unlock
        except Unavailable as exc:
            if time.monotonic() >= stop_by:  # cut at the deadline: stop now, not a tick later
                raise self._lost() from None
            self.warned = True
            return f"could not renew the lease on {self.label} yet: {exc}"
        finally:
            self.git.deadline = self.git.cancel = None
        if moved:
            raise LockLost(f"lost the lease on remote lock {self.label}: {what_moved(self, seen)}")
        self._renewed(new, now, text)
        return None

    def _lost(self) -> LockLost:
        since = time.ctime(time.time() - (time.monotonic() - self.acked_sent))
        why = f"no renewal since {since} ({self.backend.address} or this process stalled)"
        return LockLost(f"lost the lease on remote lock {self.label}: {why}")

    def _renewed(self, oid: str, sent: float, text: str | None = None) -> None:
        self.acked_sent = sent
        message = self.git.message(oid, self.ref) if text is None else text
        self.ours = self.backend.pushed[self.ref] = parse_message(oid, message, self.ref)
        self.unanswered.clear()

    # -- letting go ----------------------------------------------------------------------

    def release(self) -> None:
        if self.ours is None:
            return
        ours, self.ours = self.ours, None
        # The command is over: a hung server must not hold the caller long, all the unlock's
        # git calls together; if it does not go through, the lease frees the lock anyway.
        self.git.deadline = time.monotonic() + RELEASE_TIMEOUT
        try:
            done = unlock(self, ours, force=False, delete_branch=False, token=None)
        finally:
            self.git.deadline = None
        if done is None:
            raise LockLost(f"remote lock {self.label} changed hands before release")

    def abandon(self) -> None:
        try:
            self.release()
        except Unavailable:
            pass  # the lease runs out by itself

    def child_env(self, env: Mapping[str, str], held: bool) -> dict[str, str]:
        out = dict(env)
        out[nesting.ENV_REMOTE] = self.backend.url
        if held:
            out[nesting.ENV_HELD] = nesting.extend(env, nesting.entry(os.getpid(), self.key, False))
        return out
