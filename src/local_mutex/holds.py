"""Locks that outlive one command: ``hold`` starts a detached holder process, ``release``
ends it. The kernel still owns the truth: the lock is gone the moment the holder dies.

A holder ends on ``release``, when its ``--ttl`` runs out, when it is killed, or when the
job that started it ends: under GitHub Actions it watches the job's runner process, and the
runner's end-of-job cleanup kills every leftover process carrying the job's
RUNNER_TRACKING_ID, which the holder inherits. A forgotten release cannot outlive the job.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from . import nesting, record
from .errors import NotAcquired, Refused, SpawnError, ValidationError
from .lockdir import resolve_lock_dir
from .names import display, lock_filename, validate_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

ENV_TOKEN = "LOCAL_MUTEX_HOLD_TOKEN"
ENV_SPEC = "LOCAL_MUTEX_HOLD_SPEC"
ENV_READY_FD = "LOCAL_MUTEX_HOLD_READY_FD"
IDENTITY = (
    ("run_id", "GITHUB_RUN_ID"),
    ("run_attempt", "GITHUB_RUN_ATTEMPT"),
    ("job", "GITHUB_JOB"),
    ("runner", "RUNNER_NAME"),
)
JOB_PROCESSES = ("Runner.Worker", "act")
RELEASE_GRACE = 10.0
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from local_mutex.holdproc import main; sys.exit(main())"
)


def token_hash(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()


def identity(env: Mapping[str, str]) -> dict[str, str] | None:
    """This job's identity under GitHub Actions, else None."""
    if not env.get("GITHUB_RUN_ID"):
        return None
    return {key: env.get(var, "") for key, var in IDENTITY}


def owned(rec: Mapping[str, Any] | None, env: Mapping[str, str], token: str | None) -> bool:
    """Was this hold started by the caller: its token, or (under Actions) its very job?"""
    if rec is None or not rec.get("hold"):
        return False
    if token:
        return rec.get("token_sha256") == token_hash(token)
    mine = identity(env)
    return mine is not None and all(rec.get(key) == value for key, value in mine.items())


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        pass
    import subprocess

    out = subprocess.run(
        ["ps", "-o", "comm=", "-p", str(pid)], capture_output=True, text=True, check=False
    ).stdout.strip()
    return os.path.basename(out) or None


def job_anchor(env: Mapping[str, str]) -> int | None:
    """The pid of the job's runner process among our ancestors, under Actions."""
    if env.get("GITHUB_ACTIONS") != "true":
        return None
    pid = os.getppid()
    for _ in range(256):
        if pid <= 1:
            return None
        if _comm(pid) in JOB_PROCESSES:
            return pid
        parent = nesting.parent_of(pid)
        if parent is None:
            return None
        pid = parent
    return None


class HoldInfo:
    """A running hold: who holds it and the token that releases it."""

    __slots__ = ("lock_file", "name", "pid", "token", "waited")

    def __init__(self, name: str, lock_file: str, pid: int, token: str, waited: float) -> None:
        self.name, self.lock_file, self.pid = name, lock_file, pid
        self.token, self.waited = token, waited


def start_hold(
    name: str | bytes,
    *,
    lock_dir: str | None = None,
    wait: float | None = None,
    ttl: float | None = None,
    message: str | None = None,
    slots: int | None = None,
    allow_other_owner: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> HoldInfo:
    """Start a detached holder and return once it holds the lock (or raise)."""
    import subprocess

    env = dict(os.environ if env is None else env)
    raw = validate_name(name)
    directory = resolve_lock_dir(lock_dir, env)
    if ttl is not None and ttl <= 0:
        raise ValidationError("--ttl must be more than 0 seconds")
    spec = {
        "name": display(raw),
        "lock_dir": directory,
        "wait": wait,
        "ttl": ttl,
        "message": message,
        "slots": slots,
        "allow_other_owner": allow_other_owner,
        "anchor": job_anchor(env),
    }
    read_end, write_end = os.pipe()
    child_env = {**env, ENV_SPEC: record.dump_json(spec), ENV_READY_FD: str(write_end)}
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, package_parent],
            env=child_env,
            pass_fds=(write_end,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as exc:
        raise SpawnError(f"cannot start the holder process: {exc.strerror}") from None
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        answer = ready.read().decode("utf-8", "surrogateescape")
    kind, _, rest = answer.partition(" ")
    if kind == "ok":
        token, waited = rest.split()
        return HoldInfo(
            display(raw),
            os.path.join(directory, lock_filename(raw)),
            proc.pid,
            token,
            float(waited),
        )
    proc.wait()
    detail = record.load_json_object(rest) or {}
    text = str(detail.get("message") or f"the holder process ended (status {proc.returncode})")
    if kind == "busy":
        holder = detail.get("holder")
        raise NotAcquired(
            text, holder if isinstance(holder, dict) else None, float(detail.get("waited") or 0.0)
        )
    if kind == "invalid":
        raise ValidationError(text)
    raise SpawnError(text)


class Released:
    """What ``release`` did: ``was_held`` False means there was nothing to release."""

    __slots__ = ("held_seconds", "lock_file", "pid", "was_held")

    def __init__(
        self,
        lock_file: str,
        was_held: bool,
        pid: int | None = None,
        held_seconds: float | None = None,
    ) -> None:
        self.lock_file, self.was_held, self.pid = lock_file, was_held, pid
        self.held_seconds = held_seconds


def release(
    name: str | bytes,
    *,
    lock_dir: str | None = None,
    token: str | None = None,
    force: bool = False,
    slots: bool = False,
    env: Mapping[str, str] | None = None,
) -> Released:
    """End the hold on ``name`` started by this job (or with ``token``; any with ``force``)."""
    from .lockstate import status_of_path
    from .slots import existing_slots

    env = os.environ if env is None else env
    token = token or env.get(ENV_TOKEN) or None
    raw = validate_name(name)
    path = os.path.join(resolve_lock_dir(lock_dir, env, writable=False), lock_filename(raw))
    candidates = existing_slots(path) if slots else [path]
    refusal: Refused | None = None
    for candidate in candidates:
        st = status_of_path(candidate)
        if not st.held:
            continue
        rec = record.read_record(candidate)
        pids = {h.pid for h in st.holders}
        if rec is None or not rec.get("hold") or rec.get("pid") not in pids:
            who = ", ".join(str(p) for p in sorted(pids)) or "?"
            refusal = Refused(
                f"lock {display(raw)} is held by pid {who}, which is not a hold; "
                "release only ends holds started with `local-mutex hold`"
            )
            continue
        if not force and not owned(rec, env, token):
            refusal = Refused(
                f"the hold on {display(raw)} (pid {rec['pid']}) belongs to another job or "
                "token; pass its --token, or --force to end it anyway"
            )
            continue
        since = rec.get("since_epoch")
        held = time.time() - since if isinstance(since, (int, float)) else None
        _end_holder(int(rec["pid"]), candidate)
        return Released(candidate, True, int(rec["pid"]), held)
    if refusal is not None:
        raise refusal
    return Released(path, False)


def _end_holder(pid: int, path: str) -> None:
    from .lockstate import status_of_path

    for sig, grace in ((signal.SIGTERM, RELEASE_GRACE), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not status_of_path(path).held:
                return
            time.sleep(0.02)
