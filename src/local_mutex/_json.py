"""JSON for records, specs and branch bodies, without the json module.

``import json`` pulls in ``re`` and costs a plain run or a ``status`` more startup time
than everything else they do. This is the one codec of the package: ``dumps`` writes
compact ASCII JSON, ``loads`` reads any JSON text with explicit bounds on size and nesting,
because what it reads (lock files in a shared /tmp, branches anyone with push access
wrote, server rows) is untrusted input.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

MAX_DEPTH = 32
MAX_TEXT = 1 << 20

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNESCAPE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WHITESPACE = " \t\n\r"
_DIGITS = "0123456789"


def _str(text: str) -> str:
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


def cut_to_fit(obj: Mapping[str, Any], limit: int, keys: Sequence[str]) -> dict[str, Any]:
    """``obj`` with its text cut in half, longest first, each with a "…", until its
    ``dumps`` is at most ``limit`` characters (an escape takes up to 12 a character): the
    free text under ``keys`` first, then any (an environment variable gone wild). For what
    its readers read with a bound (a holder record, a branch's body): written whole, it
    could not be read back -- a hold nobody could release, a branch nobody could take.
    Only an object of thousands of short fields stays longer."""
    out = dict(obj)
    while len(dumps(out)) > limit:
        long = [k for k in keys if _long(out.get(k))] or [k for k in out if _long(out[k])]
        if not long:
            break
        key = max(long, key=lambda k: len(dumps(out[k])))
        out[key] = out[key][: len(out[key]) // 2] + "…"
    return out


def _long(value: object) -> bool:
    return isinstance(value, str) and len(value) > _SHORTEST_CUT


_SHORTEST_CUT = 64


def dumps(value: Any) -> str:
    """Compact ASCII JSON. NaN and infinities, which JSON cannot say, become ``null``;
    anything that is not JSON data is written as its ``str``."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if value == value and value not in (_INF, -_INF) else "null"
    if isinstance(value, str):
        return _str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_key(k)}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return _str(str(value))


_INF = float("inf")


def _key(key: object) -> str:
    """Object keys as json.dumps writes them: None, True and False as JSON words."""
    if key is None or isinstance(key, bool):
        return _str(dumps(key))
    return _str(key if isinstance(key, str) else dumps(key).strip('"'))


class _Reader:
    __slots__ = ("max_depth", "pos", "text")

    def __init__(self, text: str, max_depth: int) -> None:
        self.text, self.pos, self.max_depth = text, 0, max_depth

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{what} at offset {self.pos}")

    def skip(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _WHITESPACE:
            pos += 1
        self.pos = pos

    def value(self, depth: int) -> Any:
        self.skip()
        if self.pos >= len(self.text):
            raise self.fail("expected a value")
        ch = self.text[self.pos]
        if ch == "{":
            return self.obj(depth + 1)
        if ch == "[":
            return self.array(depth + 1)
        if ch == '"':
            return self.string()
        for word, result in (("null", None), ("true", True), ("false", False)):
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return result
        if ch == "-" or ch in _DIGITS:
            return self.number()
        raise self.fail(f"unexpected {ch!r}")

    def _nest(self, depth: int) -> None:
        if depth > self.max_depth:
            raise self.fail(f"nested deeper than {self.max_depth} levels")
        self.pos += 1

    def obj(self, depth: int) -> dict[str, Any]:
        self._nest(depth)
        out: dict[str, Any] = {}
        self.skip()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return out
        while True:
            self.skip()
            if not self.text.startswith('"', self.pos):
                raise self.fail("expected a key")
            key = self.string()
            self.skip()
            if not self.text.startswith(":", self.pos):
                raise self.fail("expected ':'")
            self.pos += 1
            out[key] = self.value(depth)
            if self._next_or_end("}"):
                return out

    def array(self, depth: int) -> list[Any]:
        self._nest(depth)
        out: list[Any] = []
        self.skip()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return out
        while True:
            out.append(self.value(depth))
            if self._next_or_end("]"):
                return out

    def _next_or_end(self, end: str) -> bool:
        self.skip()
        ch = self.text[self.pos : self.pos + 1]
        self.pos += 1
        if ch == ",":
            return False
        if ch == end:
            return True
        self.pos -= 1
        raise self.fail(f"expected ',' or {end!r}")

    def number(self) -> int | float:
        text, start = self.text, self.pos
        pos = start + (text[start] == "-")
        digits = pos
        while pos < len(text) and text[pos] in _DIGITS:
            pos += 1
        if pos == digits or (text[digits] == "0" and pos - digits > 1):
            raise self.fail("malformed number")
        is_float = False
        if text.startswith(".", pos):
            is_float, pos = True, pos + 1
            frac = pos
            while pos < len(text) and text[pos] in _DIGITS:
                pos += 1
            if pos == frac:
                raise self.fail("malformed number")
        if pos < len(text) and text[pos] in "eE":
            is_float, pos = True, pos + 1
            if pos < len(text) and text[pos] in "+-":
                pos += 1
            exp = pos
            while pos < len(text) and text[pos] in _DIGITS:
                pos += 1
            if pos == exp:
                raise self.fail("malformed number")
        self.pos = pos
        token = text[start:pos]
        return float(token) if is_float else int(token)

    def string(self) -> str:
        text = self.text
        pos = self.pos + 1
        out: list[str] = []
        while True:
            end = pos
            while end < len(text) and text[end] not in '"\\' and text[end] >= " ":
                end += 1
            out.append(text[pos:end])
            if end >= len(text):
                self.pos = end
                raise self.fail("unterminated string")
            ch = text[end]
            if ch == '"':
                self.pos = end + 1
                return "".join(out)
            if ch != "\\":
                self.pos = end
                raise self.fail("control character in string")
            esc = text[end + 1 : end + 2]
            if esc in _UNESCAPE:
                out.append(_UNESCAPE[esc])
                pos = end + 2
                continue
            if esc != "u":
                self.pos = end
                raise self.fail("bad escape")
            code = self._hex4(end + 2)
            pos = end + 6
            if 0xD800 <= code < 0xDC00 and text.startswith("\\u", pos):
                low = self._hex4(pos + 2)
                if 0xDC00 <= low < 0xE000:
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    pos += 6
            out.append(chr(code))

    def _hex4(self, at: int) -> int:
        digits = self.text[at : at + 4]
        if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
            self.pos = at
            raise self.fail("bad \\u escape")
        return int(digits, 16)


def loads(text: str, *, max_depth: int = MAX_DEPTH, max_size: int = MAX_TEXT) -> Any:
    """Parse one JSON text; ValueError for anything that is not exactly that, or that is
    longer than ``max_size`` characters or nested deeper than ``max_depth``."""
    if len(text) > max_size:
        raise ValueError(f"JSON text longer than {max_size} characters")
    reader = _Reader(text, max_depth)
    try:
        value = reader.value(0)
    except RecursionError:  # a max_depth beyond what the interpreter's stack allows
        raise ValueError("JSON text nested too deeply") from None
    reader.skip()
    if reader.pos != len(text):
        raise reader.fail("trailing data")
    return value


def loads_object(text: str, **bounds: int) -> dict[str, Any] | None:
    """A JSON object, or None when ``text`` is not one (torn, foreign, corrupt, too big)."""
    try:
        value = loads(text, **bounds)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
