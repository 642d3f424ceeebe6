"""Who is asking: the GitHub job a process belongs to, and the tokens that end holds.

Shared by every backend (a hold's record carries ``token_sha256`` and the job's identity)
and by ``release``, which ends only holds the caller owns.
"""

from __future__ import annotations

import os
import time

from .names import digest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

ENV_TOKEN = "LOCAL_MUTEX_HOLD_TOKEN"
# A token for an https git remote, handed to git in its environment only.
ENV_GIT_TOKEN = "LOCAL_MUTEX_GIT_TOKEN"
IDENTITY = (
    ("run_id", "GITHUB_RUN_ID"),
    ("run_attempt", "GITHUB_RUN_ATTEMPT"),
    ("job", "GITHUB_JOB"),
    ("runner", "RUNNER_NAME"),
)


def new_token() -> str:
    return os.urandom(16).hex()


def token_hash(token: str) -> str:
    # Ours are hex; one from the environment may hold any bytes (as str, surrogate-escaped):
    # hashed as the bytes given, it is simply not the hold's.
    return digest(token.encode("utf-8", "surrogateescape"))


def job_identity(env: Mapping[str, str]) -> dict[str, str] | None:
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
    mine = job_identity(env)
    # An empty variable (act leaves RUNNER_NAME empty) is a field a record may leave out.
    return mine is not None and all((rec.get(key) or "") == value for key, value in mine.items())


def run_url(env: Mapping[str, str]) -> str | None:
    """The Actions run (and attempt) this process belongs to, when there is one."""
    run_id = env.get("GITHUB_RUN_ID")
    repo = env.get("GITHUB_REPOSITORY")
    if not run_id or not repo:
        return None
    server = env.get("GITHUB_SERVER_URL") or "https://github.com"
    url = f"{server}/{repo}/actions/runs/{run_id}"
    attempt = env.get("GITHUB_RUN_ATTEMPT")
    return f"{url}/attempts/{attempt}" if attempt else url


def utc_stamp(epoch: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def holder_record(
    name: str,
    command: str,
    *,
    shared: bool,
    env: Mapping[str, str],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What a holder publishes about itself, the same fields in every backend."""
    now = time.time()
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "?"
    record: dict[str, Any] = {
        "v": 1,
        "name": name,
        "pid": os.getpid(),
        "command": command,
        "cwd": cwd,
        "host": os.uname().nodename,
        "user": env.get("USER") or env.get("LOGNAME") or str(os.geteuid()),
        "mode": "shared" if shared else "exclusive",
        **_since(now),
        "runner": env.get("RUNNER_NAME"),
        "job": env.get("GITHUB_JOB"),
        "workflow": env.get("GITHUB_WORKFLOW"),
        "run_url": run_url(env),
    }
    if extra:
        record.update(extra)
    return record


def stamped_now(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record, held since now (it was made before the lock was taken)."""
    return {**record, **_since(time.time())}


def _since(now: float) -> dict[str, Any]:
    return {"since": utc_stamp(now), "since_epoch": round(now, 3)}
