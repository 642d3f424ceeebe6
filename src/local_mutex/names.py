"""Lock names: validation and the hashed lock-file name. Pure functions, no I/O."""

from __future__ import annotations

import os
import sys

# hashlib loads OpenSSL, which costs every plain run a few milliseconds; the built-in
# SHA-256 module gives the same digest. Fall back to hashlib where it is missing.
try:
    if sys.version_info >= (3, 12):
        from _sha2 import sha256
    else:
        from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from hashlib import sha256  # type: ignore[assignment,no-redef,unused-ignore]

from .errors import InvalidCommand, InvalidName, ValidationError

LOCK_PREFIX = "local-mutex-"
LOCK_SUFFIX = ".lock"

# 0x00-0x1F and 0x7F: they would corrupt log lines and workflow commands.
_CONTROL = frozenset(range(0x20)) | {0x7F}


def name_bytes(name: str | bytes) -> bytes:
    """The exact bytes a name stands for; str from argv round-trips via surrogateescape.
    InvalidName for what stands for no bytes: a lone surrogate, something not a name."""
    if isinstance(name, bytes):
        return name
    if not isinstance(name, str):
        raise InvalidName(f"a lock name is a str or bytes, not {type(name).__name__}")
    return encoded(f"lock name {name!r}", name, InvalidName)


def encoded(what: str, text: str, error: type[ValidationError]) -> bytes:
    """The bytes ``text`` stands for (``\\udc80``-``\\udcff``: the raw bytes
    ``surrogateescape`` read); ``error`` for a lone surrogate, which stands for none."""
    try:
        return os.fsencode(text)
    except UnicodeEncodeError as exc:
        raise error(
            f"{what} holds {text[exc.start]!r} at {exc.start}: a lone surrogate, which "
            "encodes to no bytes"
        ) from None


def display(raw: bytes) -> str:
    """A str that encodes back to ``raw`` byte for byte (see ``ui.lines.Reporter.write``)."""
    return raw.decode("utf-8", "surrogateescape")


def validate_name(name: str | bytes) -> bytes:
    """Return the name's bytes, or raise InvalidName saying what is wrong."""
    raw = name_bytes(name)
    if not raw:
        raise InvalidName("lock name is empty")
    bad = next((b for b in raw if b in _CONTROL), None)
    if bad is not None:
        # "control characters" is the wording existing log searches match.
        raise InvalidName(
            f"lock name {display(raw)!r} contains control characters (byte 0x{bad:02X})"
        )
    if display(raw).isspace():
        raise InvalidName("lock name is only whitespace")
    return raw


def validate_command(command: str) -> str:
    if not command or command.isspace():
        raise InvalidCommand("command is empty" if not command else "command is only whitespace")
    return command


def digest(name: str | bytes) -> str:
    """SHA-256 hex of the name's bytes: the one way a name ever reaches a path or a key."""
    return str(sha256(name_bytes(name)).hexdigest())


def lock_filename(name: str | bytes) -> str:
    """``local-mutex-<sha256 hex of the name's bytes>.lock``: names never reach a path raw."""
    return f"{LOCK_PREFIX}{digest(name)}{LOCK_SUFFIX}"


def shell_quote(text: str) -> str:
    """``text`` as one word for a POSIX shell (for hints people copy and paste)."""
    safe = text and all(c.isalnum() or c in "-_./=:@%+," for c in text)
    return text if safe else "'" + text.replace("'", "'\\''") + "'"
