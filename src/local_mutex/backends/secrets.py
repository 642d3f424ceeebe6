"""Passwords in remote URLs, found generously for what is shown: a malformed URL -- a raw
``/``, ``?``, ``#`` or ``@`` in its password, which the driver or git then quotes in an
error -- must not show its password (or the pieces the driver split it into) either."""

from __future__ import annotations

import re
from urllib.parse import unquote

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# A value runs to the next ``&``: libpq has no fragment, so ``password=ab#cd`` is all of it
# (cut at the ``#``, its tail was shown, and a nested call got "ab").
_QUERY_PARAM = re.compile(r"[?&](?P<key>[^=&#]*)=(?P<value>[^&]*)")
# Query parameters that are secrets: libpq's (it decodes keys: ``pass%77ord=`` counts).
SECRET_KEYS = ("password", "sslpassword")
# ``host:9418/path@x``: a port (1 to 5 digits), then a path with an @ in it. Read as a
# password instead it would be one of a port's shape followed by a raw "/": we do not.
_PORT_AND_PATH = re.compile(r"\d{1,5}/")
# Pieces of a password split at a delimiter are hidden too, down to this length (shorter
# ones would blank out letters all over a message).
_SHORTEST_PIECE = 4


def query_secrets(url: str, keys: tuple[str, ...] = SECRET_KEYS) -> list[re.Match[str]]:
    """The query parameters whose (percent-decoded) key is one of ``keys``."""
    return [m for m in _QUERY_PARAM.finditer(url) if unquote(m["key"]).lower() in keys]


def _userinfo_password(url: str) -> tuple[int, int] | None:
    """The span of the password in ``scheme://user:password@host...``: to the last ``@``
    before the query (a host holds none), or, for a password with a raw ``?`` in it, to
    the last ``@`` of all -- unless a ``/`` comes before the ``?``, as a path would put it
    (``host:5432/db?user=ci@server`` holds no password; nor, then, does a password with
    a raw ``/`` and, after it, a raw ``?``). The wider of the two."""
    scheme = _SCHEME.match(url)
    if scheme is None:
        return None
    start = scheme.end()
    query = url.find("?", start)
    ats = [url.rfind("@", start, query if query >= 0 else len(url))]
    last = url.rfind("@", start)
    if last > ats[0] and _no_path_before(url[start : query if query >= 0 else last]):
        ats.append(last)
    for at in reversed(ats):  # the widest first
        colon = url.find(":", start, at) if at >= 0 else -1
        if colon >= 0 and colon + 1 < at and not _PORT_AND_PATH.match(url, colon + 1, at):
            return colon + 1, at  # not ``user:@``, nor ``host:9418/path@x`` (a port)
    return None


def _no_path_before(head: str) -> bool:
    """No path before the query: no ``/`` -- or one after ``user:x`` where ``x`` is no port
    (``user:ab/cd?x@host``: a raw ``/`` in a password, not ``host:5432/db?...``)."""
    first = head.split("/", 1)[0]
    if first == head:
        return True
    if "@" in first or first.startswith("["):  # ``user:pw@host/db``, ``[::1]:5432/db``
        return False
    _, colon, after = first.partition(":")
    return bool(colon) and not after.isdigit()


def secrets_of(url: str) -> list[str]:
    """Every password in the URL, as written and percent-decoded (``user:@`` holds none)."""
    raw = []
    span = _userinfo_password(url)
    if span is not None:
        raw.append(url[span[0] : span[1]])
    raw += [m["value"] for m in query_secrets(url) if m["value"]]
    found = {*raw, *map(unquote, raw)}
    for secret in list(found):
        found.update(p for p in re.split(r"[/?#@]", secret) if len(p) >= _SHORTEST_PIECE)
    return sorted(found, key=len, reverse=True)  # the whole before its pieces


def has_password(url: str) -> bool:
    return bool(secrets_of(url))


def hide_secrets(text: str, url: str) -> str:
    """``text`` with every password of ``url`` in it replaced by ``***``; one shorter than
    ``_SHORTEST_PIECE`` only where a URL holds it (``:a@``, ``password=a``), or a one-letter
    password would blank that letter out of every word."""
    for secret in secrets_of(url):
        if len(secret) >= _SHORTEST_PIECE:
            text = text.replace(secret, "***")
        else:
            text = text.replace(f":{secret}@", ":***@").replace(
                f"password={secret}", "password=***"
            )
    return text


def mask(url: str) -> str:
    """The URL with any password replaced by ``***``: for messages, status and JSON."""
    for m in reversed(query_secrets(url)):  # from the end: earlier spans stay where they are
        if m["value"]:
            url = f"{url[: m.start('value')]}***{url[m.end('value') :]}"
    span = _userinfo_password(url)
    if span is not None:
        url = f"{url[: span[0]]}***{url[span[1] :]}"
    return url
