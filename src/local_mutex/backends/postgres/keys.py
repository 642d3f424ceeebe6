"""Lock names to advisory-lock keys.

A name's key is the first 8 bytes of the SHA-256 of the name's bytes, read as a big-endian
*signed* 64-bit integer -- ``pg_advisory_lock`` takes a ``bigint``. Any client can take the
same lock::

    SELECT pg_advisory_lock(('x' || left(encode(sha256(convert_to('NAME', 'UTF8')),
                                                'hex'), 16))::bit(64)::bigint);

(``convert_to``, not ``'NAME'::bytea``, which would read backslashes as escapes.)

Counting semaphores (``--slots N``) use one key per slot and a gate, derived the same way
from the name's bytes followed by a NUL and a suffix: ``NAME\\0slot0`` .. ``NAME\\0slot<N-1>``
and ``NAME\\0gate``. A valid name holds no control character, so these never collide with a
plain name's key.

A hold's ``NAME\\0inside`` key is held shared by each ``run --reentrant`` inside it, and
taken exclusively by whatever ends the hold (``release``, its TTL) before it does: the hold
outlasts the runs inside it, as a local hold does.
"""

from __future__ import annotations

import hashlib

MAX_SLOTS = 1024


def key_of(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big", signed=True)


def name_key(name: bytes) -> int:
    return key_of(name)


def slot_key(name: bytes, index: int) -> int:
    return key_of(name + b"\0slot" + str(index).encode())


def gate_key(name: bytes) -> int:
    return key_of(name + b"\0gate")


def inside_key(name: bytes) -> int:
    return key_of(name + b"\0inside")


def describe_key(key: int) -> str:
    """How outputs and errors name the lock: the SQL that takes it."""
    return f"pg_advisory_lock({key})"
