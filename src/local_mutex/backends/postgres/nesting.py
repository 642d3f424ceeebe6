"""Reentrancy: a nested call for a lock its own ancestor holds runs inside it.

The supervisor adds ``<pid>:pg:<domain>/<key>:<x|s>`` to LOCAL_MUTEX_HELD in the command's
environment, ``<domain>`` a short hash of the server URL without password. The second field
is not a number, so the local backend's parser skips these entries. An entry counts only if
its pid is really one of our ancestors (the local backend's check), so an unrelated process
that copied the environment still waits like anyone else.
"""

from __future__ import annotations

import hashlib

from ..flock.nesting import ENV_HELD, extend, is_ancestor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

_TAG = "pg"


def _where(domain: str, key: int) -> str:
    return hashlib.sha256(domain.encode("utf-8", "surrogateescape")).hexdigest()[:16] + f"/{key}"


def held_entry(
    env: Mapping[str, str], pid: int, domain: str, key: int, shared: bool
) -> dict[str, str]:
    entry = f"{pid}:{_TAG}:{_where(domain, key)}:{'s' if shared else 'x'}"
    return {ENV_HELD: extend(env, entry)}


def enclosing_entry(env: Mapping[str, str], domain: str, key: int) -> tuple[int, str] | None:
    where = _where(domain, key)
    for item in env.get(ENV_HELD, "").split(";"):
        fields = item.split(":")
        if len(fields) != 4 or fields[1] != _TAG or fields[2] != where:
            continue
        if fields[0].isdigit() and fields[3] in ("s", "x") and is_ancestor(int(fields[0])):
            return int(fields[0]), fields[3]
    return None
