"""git's processes, each in a session (and so a process group) of its own.

git talks to an http(s) remote through a helper it starts (``git-remote-https``), and to
an ssh one through ``ssh``. Killing git alone on a timeout or a stop signal orphans that
helper, which then stays blocked on a hung server after we have exited. Killing git's
whole group ends all of it. A session rather than just a group: a helper that wants a
password must fail at once (there is no one to answer), not stop on the terminal as a
background group would, and a Ctrl-C at the terminal reaches us, not git, so that we --
not the terminal -- decide what happens to a push under way.
"""

from __future__ import annotations

import os
import subprocess
import time

from ..._fastsignal import signal
from ...errors import Unavailable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# With a ``cancel`` descriptor: how often to look at it while git runs.
_CANCEL_POLL = 0.1


class Cancelled(Exception):
    """The git call was cut short: its ``cancel`` descriptor turned readable."""


# After SIGKILL a process ends at once unless it is stuck in the kernel (a dead NFS
# mount): wait that long for git, and as long again for helpers we adopted, no more.
REAP_WAIT = 2.0


def run_git(
    argv: Sequence[str],
    *,
    stdin: bytes,
    env: Mapping[str, str],
    timeout: float,
    cancel: int | None = None,
) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr). On a timeout (``subprocess.TimeoutExpired``), once
    ``cancel`` turns readable (``Cancelled``), or on any exception while it runs (a stop
    signal's ``Interrupted``), git's whole group is killed and reaped before the exception
    goes on."""
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
        )
    except FileNotFoundError:
        raise Unavailable("git is not installed") from None
    try:
        out, err = _communicate(proc, stdin, timeout, cancel)
    except BaseException:
        end_group(proc)
        raise
    return proc.returncode, out, err


def _communicate(
    proc: subprocess.Popen[bytes], stdin: bytes, timeout: float, cancel: int | None
) -> tuple[bytes, bytes]:
    if cancel is None:
        return proc.communicate(stdin, timeout=timeout)
    import select

    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(cancel, select.POLLIN)
    # The input first, in full: communicate() called again after its timeout goes on
    # reading, but writes only what its first call was given, once. git reads its input
    # at once (a commit message; a push takes none), whatever the server does.
    if proc.stdin is not None:
        try:
            if stdin:
                proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # git ended without reading it: its status says why
        proc.stdin = None
    while True:
        # In slices: communicate() may be called again after its timeout, losing nothing.
        left = deadline - time.monotonic()
        try:
            return proc.communicate(timeout=max(min(left, _CANCEL_POLL), 0.0))
        except subprocess.TimeoutExpired:
            if left <= _CANCEL_POLL:
                raise
        if poller.poll(0):
            raise Cancelled


def end_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill every process of git's group, then reap git and any of them we adopted.

    The group's id is git's pid, which stays reserved while git is unreaped or any
    member of its group lives, so the signal cannot reach a stranger."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass  # already gone
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        # Not drained: a helper that left the group could keep them open for ever.
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
    try:
        proc.wait(REAP_WAIT)
    except subprocess.TimeoutExpired:
        return
    _reap_adopted(proc.pid)


def _reap_adopted(pgid: int) -> None:
    """As a child subreaper (the keeper of a run is one), git's helpers became our children
    when git died: collect them, so none lingers as a zombie. Otherwise there is no child
    of ours in that group and this returns at once."""
    deadline = time.monotonic() + REAP_WAIT
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)  # SIGKILLed: they are on their way out
