"""Who holds a lock, carried where other sessions can read it.

Two places: ``application_name`` (at most 63 bytes, readable by every role) says
``local-mutex <pid>@<host>`` -- the marker ``list`` looks for; the session's current query
text (``pg_stat_activity.query``: same role or ``pg_read_all_stats``) opens with a comment
holding the whole record::

    /* local-mutex 1 n=deploy p=4242 h=ci-7 s=1767225600.5 c=make%20deploy */ SELECT ...

Every value is percent-encoded with nothing left bare but letters, digits and ``_.-~``, so a
``*/`` in a command cannot end the comment and a space always separates fields. Fields go in
order of importance and the server shows only the first ``track_activity_query_size`` bytes
of a query: the encoder stops at a budget, the decoder drops a field cut in half. The
heartbeat re-sends the same text, so the record stays visible while the lock is held.
"""

from __future__ import annotations

import sys
from urllib.parse import quote, quote_from_bytes, unquote, unquote_to_bytes

from ..._proc import decimal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

MARKER = "local-mutex"
APP_PREFIX = MARKER + " "
VERSION = "1"
_OPEN = f"/* {MARKER} {VERSION} "
_CLOSE = "*/"
NAME_LIMIT = 63  # NAMEDATALEN - 1: the server cuts application_name there
_MAX_FIELD = 2000

# (short key, record key, kind) in order of importance: what survives truncation first.
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("n", "name", "bytes"),
    ("p", "pid", "int"),
    ("h", "host", "str"),
    ("x", "mode", "str"),
    ("i", "slot", "int"),
    ("k", "slots", "int"),
    ("s", "since_epoch", "float"),
    ("ws", "wait_since", "float"),
    ("hold", "hold", "bool"),
    ("t", "token_sha256", "str"),
    ("u", "user", "str"),
    ("ri", "run_id", "str"),
    ("ra", "run_attempt", "str"),
    ("j", "job", "str"),
    ("r", "runner", "str"),
    ("w", "workflow", "str"),
    ("url", "run_url", "str"),
    ("d", "cwd", "str"),
    ("m", "message", "str"),
    ("c", "command", "str"),
)
_BY_SHORT = {short: (key, kind) for short, key, kind in FIELDS}


def application_name(pid: int, host: str, hold: bool = False) -> str:
    text = f"{APP_PREFIX}{'hold ' if hold else ''}{pid}@{host}"
    return text.encode("utf-8", "replace")[:NAME_LIMIT].decode("utf-8", "ignore")


def waiter_command(url: str) -> str:
    """How a waiter shows in ``status``: its command line, the password masked."""
    argv = list(sys.argv)
    if argv and argv[0] in ("", "-c"):  # the $LOCAL_MUTEX_CLI shim, python -c
        argv[0] = "local-mutex"
    return without_secrets(" ".join(argv), url)


def without_secrets(text: str, url: str) -> str:
    """Free text a holder publishes (its command, its message) with ``url``'s password
    masked, as a waiter's command line is: every role that can read ``pg_stat_activity``
    reads it."""
    from ..secrets import hide_secrets, mask

    return hide_secrets(text.replace(url, mask(url)), url)


def without_secrets_in(rec: Mapping[str, Any], url: str) -> dict[str, Any]:
    """A holder's record with its command and message free of ``url``'s password."""
    return {
        k: without_secrets(v, url) if k in ("command", "message") and isinstance(v, str) else v
        for k, v in rec.items()
    }


def parse_application_name(text: str | None) -> dict[str, Any] | None:
    """pid/host/hold from ``local-mutex [hold ]<pid>@<host>``; None when not ours."""
    if not text or not text.startswith(APP_PREFIX):
        return None
    rest = text[len(APP_PREFIX) :]
    out: dict[str, Any] = {}
    if rest.startswith("hold "):
        out["hold"] = True
        rest = rest[5:]
    pid_text, _, host = rest.partition("@")
    pid = decimal(pid_text)
    if pid is not None:
        out["pid"] = pid
    if host:
        out["host"] = host
    return out


def _encode_value(value: Any, kind: str) -> str | None:
    if value is None or value == "":
        return None
    if kind == "bytes":
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")
        return quote_from_bytes(raw[:_MAX_FIELD], safe="")
    if kind == "bool":
        return "1" if value else None
    if kind == "int":
        return str(int(value)) if isinstance(value, (int, float)) else None
    if kind == "float":
        return f"{float(value):.3f}" if isinstance(value, (int, float)) else None
    text = str(value)[:_MAX_FIELD]
    return quote(text.encode("utf-8", "surrogateescape"), safe="")


def comment(rec: Mapping[str, Any], budget: int = 1024) -> str:
    """The record as one SQL comment of at most ``budget`` bytes (at least the opening)."""
    parts = [_OPEN]
    used = len(_OPEN) + len(_CLOSE)
    for short, key, kind in FIELDS:
        value = _encode_value(rec.get(key), kind)
        if value is None:
            continue
        field = f"{short}={value} "
        if used + len(field) > budget:
            continue  # a later, shorter field may still fit
        parts.append(field)
        used += len(field)
    parts.append(_CLOSE)
    return "".join(parts)


def decode(query: str | None) -> dict[str, Any] | None:
    """The record at the start of a query text; None when there is none. A field cut by the
    server's truncation is dropped; values are typed, never trusted further."""
    if not query or not query.startswith(_OPEN):
        return None
    body = query[len(_OPEN) :]
    end = body.find(_CLOSE)
    complete = end >= 0
    body = body[:end] if complete else body
    tokens = body.split(" ")
    if not complete and tokens:
        tokens = tokens[:-1]  # the last one may be cut in half
    out: dict[str, Any] = {}
    for token in tokens:
        short, sep, value = token.partition("=")
        if not sep or short not in _BY_SHORT:
            continue
        key, kind = _BY_SHORT[short]
        try:
            out[key] = _decode_value(value, kind)
        except ValueError:
            continue
    return out


def _decode_value(value: str, kind: str) -> Any:
    if kind == "bytes":
        return unquote_to_bytes(value)
    if kind == "bool":
        return value == "1"
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    return unquote(value, errors="surrogateescape")
