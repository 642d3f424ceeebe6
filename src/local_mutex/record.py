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


def dump_json(value: Any) -> str:
    """Compact ASCII JSON for str/int/float/bool/None values, lists and string-keyed dicts.

    The json module (and the re module it pulls in) would cost a plain run or a ``status``
    more startup time than everything else they do; this is all they need of it.
    """
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _json_str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_str(k)}:{dump_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dump_json(v) for v in value) + "]"
    return _json_str(str(value))


class _NotFlat(Exception):
    pass


_UNESCAPE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_NUMBER = frozenset("+-.0123456789eE")


def _scan_string(text: str, i: int) -> tuple[str, int]:
    if text[i] != '"':
        raise ValueError("expected a string")
    i += 1
    out: list[str] = []
    while True:
        ch = text[i]
        if ch == '"':
            return "".join(out), i + 1
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        esc = text[i + 1]
        if esc != "u":
            out.append(_UNESCAPE[esc])
            i += 2
            continue
        code = int(text[i + 2 : i + 6], 16)
        i += 6
        if 0xD800 <= code < 0xDC00 and text.startswith("\\u", i):
            low = int(text[i + 2 : i + 6], 16)
            if 0xDC00 <= low < 0xE000:
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                i += 6
        out.append(chr(code))


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _load_flat(text: str) -> dict[str, Any]:
    """Parse one JSON object whose values are all scalars; raise _NotFlat otherwise."""
    out: dict[str, Any] = {}
    i = _skip(text, 0)
    if text[i] != "{":
        raise _NotFlat
    i = _skip(text, i + 1)
    if text[i] == "}":
        i += 1
    else:
        while True:
            key, i = _scan_string(text, _skip(text, i))
            i = _skip(text, i)
            if text[i] != ":":
                raise ValueError("expected ':'")
            i = _skip(text, i + 1)
            value: Any
            if text[i] == '"':
                value, i = _scan_string(text, i)
            elif text.startswith("null", i):
                value, i = None, i + 4
            elif text.startswith("true", i):
                value, i = True, i + 4
            elif text.startswith("false", i):
                value, i = False, i + 5
            elif text[i] in _NUMBER:
                j = i
                while j < len(text) and text[j] in _NUMBER:
                    j += 1
                token = text[i:j]
                value = float(token) if any(c in token for c in ".eE") else int(token)
                i = j
            else:
                raise _NotFlat
            out[key] = value
            i = _skip(text, i)
            if text[i] == ",":
                i += 1
                continue
            if text[i] == "}":
                i += 1
                break
            raise ValueError("expected ',' or '}'")
    if _skip(text, i) != len(text):
        raise ValueError("trailing data")
    return out


def load_json_object(text: str) -> dict[str, Any] | None:
    """A JSON object from one line, or None if it is not one (torn, foreign, corrupt)."""
    try:
        return _load_flat(text)
    except _NotFlat:
        import json  # nested values: not ours, but still readable

        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    except (ValueError, IndexError, KeyError):
        return None


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
    return load_json_object(line.decode("utf-8", "replace"))
