"""Starting a detached holder process and waiting until it holds the lock (or says why not).

A holder ends on ``release``, when its ``--ttl`` runs out, when it is killed, or when the
job that started it ends: under GitHub Actions it watches the job's runner process, and the
runner's end-of-job cleanup kills every leftover process carrying the job's
RUNNER_TRACKING_ID, which the holder inherits. A forgotten release cannot outlive the job.
"""

from __future__ import annotations

import os
import sys

from .. import _proc
from .._fastsignal import interruptible
from .._json import dumps, loads_object
from ..backends.base import HoldInfo
from ..errors import (
    Interrupted,
    LockLost,
    NotAcquired,
    RecordNotWritten,
    SpawnError,
    Unavailable,
    ValidationError,
)
from ..names import display, validate_name
from ..nudge import Nudge
from ..runspec import check_message

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from subprocess import Popen
    from typing import Any

ENV_SPEC = "LOCAL_MUTEX_HOLD_SPEC"
# Linux's MAX_ARG_STRLEN: the most one environment string ("NAME=value\0") may take.
_MAX_ENV_STRING = 128 * 1024
ENV_READY_FD = "LOCAL_MUTEX_HOLD_READY_FD"
ENV_ACK_FD = "LOCAL_MUTEX_HOLD_ACK_FD"
DELIVERED = b"delivered\n"
# A job's process: the runner's worker, or act (``gh act`` runs it as gh-act), which runs
# every job of a workflow: a hold under act ends with the whole run, not its job.
JOB_PROCESSES = ("Runner.Worker", "act", "gh-act")
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from local_mutex.holds.holder import main; sys.exit(main())"
)
# What a holder may answer besides "ok": the error to raise in the caller.
_ANSWERS: dict[str, type[Exception]] = {
    "invalid": ValidationError,
    "unavailable": Unavailable,
    "record": RecordNotWritten,
}

# Holders that said they hold the lock, until their token is delivered: how each ended, if
# it did meanwhile (``delivered``).
_undelivered: dict[int, Popen[bytes]] = {}
# How long a holder stopped while taking the lock may take to let go of it.
_END_WAIT = 5.0


def job_anchor(env: Mapping[str, str]) -> int | None:
    """The pid of the job's runner process among our ancestors, under Actions."""
    if env.get("GITHUB_ACTIONS") != "true":
        return None
    pid = os.getppid()
    for _ in range(256):
        if pid <= 1:
            return None
        if _proc.comm(pid) in JOB_PROCESSES:
            return pid
        parent = _proc.parent_of(pid)
        if parent is None:
            return None
        pid = parent
    return None


def start_hold(
    name: str | bytes,
    backend_spec: Mapping[str, Any],
    *,
    lock_file: str,
    wait: float | None = None,
    ttl: float | None = None,
    message: str | None = None,
    slots: int | None = None,
    env: Mapping[str, str] | None = None,
    report: Mapping[str, Any] | None = None,
) -> HoldInfo:
    """Start a detached holder and return once it holds the lock (or raise). With
    ``report`` (``Reporter.settings``) it shares our stderr until then, to say it waits."""
    import subprocess

    env = dict(os.environ if env is None else env)
    raw = validate_name(name)
    if ttl is not None and ttl <= 0:
        raise ValidationError("--ttl must be more than 0 seconds")
    check_message(message)
    spec = {
        "name": display(raw),
        "backend": dict(backend_spec),
        "wait": wait,
        "ttl": ttl,
        "message": message,
        "slots": slots,
        "anchor": job_anchor(env),
        "report": dict(report) if report is not None else None,
    }
    said = dumps(spec)
    if len(ENV_SPEC) + len(said) + 2 > _MAX_ENV_STRING:  # E2BIG: the holder would not start
        raise ValidationError(
            f"the lock's name and --message are too long together for a hold ({len(said)} "
            f"bytes as JSON; a holder process takes {_MAX_ENV_STRING // 1024} KiB)"
        )
    read_end, write_end = os.pipe()
    ack_read, ack_write = os.pipe()
    child_env = {
        **env,
        ENV_SPEC: said,
        ENV_READY_FD: str(write_end),
        ENV_ACK_FD: str(ack_read),
    }
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, package_parent],
            env=child_env,
            pass_fds=(write_end, ack_read),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=None if report is not None else subprocess.DEVNULL,
        )
    except OSError as exc:
        os.close(ack_write)
        raise SpawnError(f"cannot start the holder process: {exc.strerror}") from None
    finally:
        os.close(write_end)
        os.close(ack_read)
    try:
        with os.fdopen(read_end, "rb") as ready, interruptible(), Nudge() as nudge:
            answer = nudge.call(ready.read).decode("utf-8", "surrogateescape")
    except BaseException:
        # Stopped while the holder waits (or just as it took the lock and said so): it
        # is ours to end -- its SIGTERM lets go of whatever it holds.
        os.close(ack_write)
        proc.terminate()
        try:
            proc.wait(_END_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()  # stuck: the kernel frees a lock of ours, a server ends a session
        raise
    kind, _, rest = answer.partition(" ")
    if kind == "ok":
        token, waited, where = rest.split(" ", 2)
        where = where or lock_file
        _undelivered[proc.pid] = proc  # collected, it could reap the holder unseen
        return HoldInfo(display(raw), where, proc.pid, token, float(waited), ack_write)
    os.close(ack_write)
    proc.wait()
    if kind == "stopped" or (not answer and proc.returncode < 0):
        # Signalled while it waited (``kill`` of its pid, an OOM kill): not by our caller,
        # whose own stop ends above.
        signum = int(rest) if rest.isdigit() else -proc.returncode
        raise Interrupted(signum, holder_pid=proc.pid)
    detail = loads_object(rest) or {}
    text = str(detail.get("message") or f"the holder process ended (status {proc.returncode})")
    if kind == "busy":
        holder = detail.get("holder")
        waited_f = detail.get("waited")
        raise NotAcquired(
            text,
            holder if isinstance(holder, dict) else None,
            float(waited_f) if isinstance(waited_f, (int, float)) else 0.0,
        )
    raise _ANSWERS.get(kind, SpawnError)(text)


def delivered(info: HoldInfo) -> None:
    """Tell the holder that the token reached its reader (printed, an output written):
    only then is the hold its to keep. Until then -- this process killed with the token
    still in its hands -- nobody could ever end the hold with it, so the holder ends it.
    Raises Interrupted or LockLost if the holder was killed meanwhile: nothing is held."""
    fd, info.ack_fd = info.ack_fd, None
    proc = _undelivered.pop(info.pid, None) if info.pid is not None else None
    if fd is None:
        return
    try:
        os.write(fd, DELIVERED)
    except OSError:  # its end closed: it has exited (only its exit closes it before this)
        _ended_before_delivery(info.pid, proc)
    finally:
        os.close(fd)


def _ended_before_delivery(pid: int | None, proc: Popen[bytes] | None) -> None:
    """The holder is gone since it said it held the lock. Ended as asked (a release by
    whoever read the token already, its TTL, its job's end): so be it. Killed (an OOM
    kill), or ended by a lost lock: nothing is held, and the caller must not say it is."""
    status = None if proc is None else proc.wait()  # exited already: its end is closed
    if status is not None and status < 0:
        raise Interrupted(-status, holder_pid=pid, taken=True)
    if status != 0:
        code = "" if status is None else f" (status {status})"
        raise LockLost(
            f"its holder process (pid {pid}) ended as it took the lock{code}; nothing is held"
        )
