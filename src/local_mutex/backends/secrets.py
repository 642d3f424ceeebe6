"""Passwords in remote URLs, found generously for what is shown: a malformed URL -- a raw
``/``, ``?``, ``#`` or ``@`` in its password, which the driver or git then quotes in an
error -- must not show its password (or the pieces the driver split it into) either."""

from __future__ import annotations

import re
from urllib.parse import unquote

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_QUERY_PW = re.compile(r"(?P<key>[?&]password=)(?P<pw>[^&#]*)")
# Pieces of a password split at a delimiter are hidden too, down to this length (shorter
# ones would blank out letters all over a message).
_SHORTEST_PIECE = 4


def _userinfo_password(url: str) -> tuple[int, int] | None:
    """The span of the password in ``scheme://user:password@host...``. The userinfo ends
    at the last ``@`` before the query (a host holds none), else at the last ``@`` at all
    (a password with a raw ``?``)."""
    scheme = _SCHEME.match(url)
    if scheme is None:
        return None
    query = url.find("?", scheme.end())
    at = url.rfind("@", scheme.end(), query if query >= 0 else len(url))
    if at < 0:
        at = url.rfind("@", scheme.end())
    colon = url.find(":", scheme.end(), at) if at >= 0 else -1
    return None if colon < 0 or colon + 1 == at else (colon + 1, at)


def secrets_of(url: str) -> list[str]:
    """Every password in the URL, as written and percent-decoded (``user:@`` holds none)."""
    raw = []
    span = _userinfo_password(url)
    if span is not None:
        raw.append(url[span[0] : span[1]])
    raw += [m["pw"] for m in _QUERY_PW.finditer(url) if m["pw"]]
    found = {*raw, *map(unquote, raw)}
    for secret in list(found):
        found.update(p for p in re.split(r"[/?#@]", secret) if len(p) >= _SHORTEST_PIECE)
    return sorted(found, key=len, reverse=True)  # the whole before its pieces


def has_password(url: str) -> bool:
    return bool(secrets_of(url))


def hide_secrets(text: str, url: str) -> str:
    """``text`` with every password of ``url`` in it replaced by ``***``."""
    for secret in secrets_of(url):
        text = text.replace(secret, "***")
    return text


def mask(url: str) -> str:
    """The URL with any password replaced by ``***``: for messages, status and JSON."""
    span = _userinfo_password(url)
    if span is not None:
        url = f"{url[: span[0]]}***{url[span[1] :]}"
    return _QUERY_PW.sub(lambda m: f"{m['key']}***" if m["pw"] else m[0], url)
