"""The holder record: one JSON line the exclusive holder keeps inside the lock file.

It is advisory. Readers trust it only while the kernel says the lock is held, so a record
left behind by a holder that was SIGKILLed means nothing once the lock is free.
"""

from __future__ import annotations

import os
import time

# Type-only imports: typing and collections cost a plain run measurable startup time.
TYPE_CHECKING = False
if TYPE_CHECKING:
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


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _json_str(text: str) -> str:
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code > 0xFFFF:  # outside the BMP: a UTF-16 surrogate pair, as JSON wants
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:  # control characters, non-ASCII, and surrogateescape'd raw bytes
            out.append(f"\\u{code:04x}")
    return '"' + "".join(out) + '"'


def dump_json(record: Mapping[str, Any]) -> str:
    """Compact ASCII JSON for flat records of str/int/float/bool/None values.

    The json module (and the re module it pulls in) costs a plain run more startup time
    than everything else it does; a holder record needs only this much of it.
    """
    items = []
    for key, value in record.items():
        if value is None:
            text = "null"
        elif value is True or value is False:
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = _json_str(str(value))
        items.append(f"{_json_str(key)}:{text}")
    return "{" + ",".join(items) + "}"


def write_record(fd: int, record: Mapping[str, Any]) -> None:
    """Replace the file's content with the record; best effort (a read-only fd skips it)."""
    line = dump_json(record) + "\n"
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, line.encode("ascii"), 0)
    except OSError:
        pass


def clear_record(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass  # a read-only descriptor never wrote a record


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
        import json  # only readers pay for it; writers use dump_json

        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
