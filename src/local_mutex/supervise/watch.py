"""The supervisor's watch of its keeper, in a thread of its own: the keeper's death (its
pipe's EOF), a lease's stop deadline it no longer renews, a server session that ended;
and the line that says the keeper died."""

from __future__ import annotations

import os
import select
import time

from ..ui.lines import STOPPING_WRITE_WAIT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .supervisor import _Supervisor

# A socket whose peer closed it (POLLRDHUP: Linux; elsewhere POLLHUP, once both ways shut).
HANGUP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP
# A session's stop deadline passed by this much when we woke: we were frozen ourselves
# (see watch_keeper), and the keeper is given THAW_GRACE seconds to send a newer one.
FROZEN_IF_LATE = 1.0
THAW_GRACE = 2.0


def watch_keeper(sup: _Supervisor, life: int, session: int | None) -> None:
    """Thread: watch the keeper. It holds the pipe's other end, so EOF means it died; and
    for a leased lock it writes ``deadline T`` after each renewal: if T passes with no newer
    one (a keeper that is frozen, not dead), the command is stopped all the same, before
    the lease runs out. ``fds NAME``: take the descriptions it hands down (``handdown``).
    ``session``: the lock's server socket; its hangup (the server ended the session: the
    lock is someone else's now) stops the command at once, frozen keeper or not."""
    poller = select.poll()  # not select(): descriptors may be past FD_SETSIZE
    poller.register(life, select.POLLIN)
    if session is not None:
        poller.register(session, HANGUP)  # never POLLIN: the keeper reads that socket
    deadline: float | None = None
    thawed = False
    buffer = b""
    while True:
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            ready = dict(poller.poll(None if timeout is None else int(timeout * 1000) + 1))
            if session in ready:
                sup.session_closed = True
                break
            if not ready:
                # Woken long past the deadline: we were frozen too (a suspended machine), the
                # keeper most likely with us; or Ctrl-Z stopped the keeper with the command
                # (lately, or still). A server session outlives either (the kernel answers
                # its keepalives; a lease runs out): once continued the keeper confirms
                # it, or finds it lost, within a moment.
                now = time.monotonic()
                late = now - (deadline or 0.0)
                if session is not None and late > FROZEN_IF_LATE and not thawed:
                    deadline, thawed = now + THAW_GRACE, True
                    continue
                if session is not None and now < sup.resumed + THAW_GRACE:
                    deadline, thawed = min(now, sup.resumed) + THAW_GRACE, True
                    continue
                sup.lease_ran_out = True
                break
            data = os.read(life, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:  # EOF: the keeper is dead (we may not be reparented yet: say it here)
            sup.keeper_gone = True
            break
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"deadline "):
                newer = float(line.split()[1])
                # Only a later deadline says the keeper confirmed the lock since the thaw.
                thawed = thawed and deadline is not None and newer <= deadline
                deadline = newer
            elif line.startswith(b"fds "):  # a lock file the keeper put back: ours too
                from .handdown import take

                fds = take(line[4:].decode(), sup.keeper)
                if fds:  # the file now at the path: those handed down before are stale
                    for stale in sup.kept:
                        os.close(stale)
                    sup.kept = fds


def say_keeper_gone(keeper: int, code: int) -> None:
    """The keeper (the process that took the lock) was killed: say so on stderr, where
    its own bookend would have gone (best effort: nobody may read it)."""
    prefix = "::warning::" if os.environ.get("GITHUB_ACTIONS") == "true" else ""
    line = f"{prefix}local-mutex: pid {keeper}, which took the lock, died; stopped the command"
    try:
        # Never blocking on a stderr nobody reads: the lock is ours until we exit.
        poller = select.poll()
        poller.register(2, select.POLLOUT)
        if poller.poll(int(STOPPING_WRITE_WAIT * 1000)):
            os.write(2, f"{line} (exit {code})\n".encode())
    except OSError:
        pass
