"""The holder record: one JSON line the exclusive holder keeps inside the lock file.

It is advisory. Readers trust it only while the kernel says the lock is held, so a record
left behind by a holder that was SIGKILLed means nothing once the lock is free.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from typing import Any

RECORD_VERSION = 1
_MAX_READ = 64 * 1024


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


def make_record(
    name: str,
    command: str,
    *,
    shared: bool,
    env: Mapping[str, str],
    pid: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    now = time.time()
    record: dict[str, Any] = {
        "v": RECORD_VERSION,
        "name": name,
        "pid": os.getpid() if pid is None else pid,
        "command": command,
        "cwd": _cwd(),
        "host": os.uname().nodename,
        "user": env.get("USER") or env.get("LOGNAME") or str(os.geteuid()),
        "mode": "shared" if shared else "exclusive",
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "since_epoch": round(now, 3),
        "runner": env.get("RUNNER_NAME"),
        "job": env.get("GITHUB_JOB"),
        "workflow": env.get("GITHUB_WORKFLOW"),
        "run_url": run_url(env),
    }
    if extra:
        record.update(extra)
    return record


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:
        return "?"


def write_record(fd: int, record: Mapping[str, Any]) -> None:
    """Replace the file's content with the record; best effort (a read-only fd skips it)."""
    line = json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n"
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, line.encode("ascii"), 0)
    except OSError:
        pass


def clear_record(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)


def read_record(path: str) -> dict[str, Any] | None:
    """The record in ``path``, or None when absent, unreadable or torn mid-write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, _MAX_READ)
    except OSError:
        return None
    finally:
        os.close(fd)
    line = data.split(b"\n", 1)[0]
    if not line:
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
