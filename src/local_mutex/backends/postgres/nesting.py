"""Reentrancy: a nested call for a lock its own ancestor holds runs inside it.

The holder adds ``<pid>:p-<domain>-<key>:<x|s>`` to LOCAL_MUTEX_HELD in the command's
environment (``nesting``), ``<domain>`` a short hash of the server URL without password,
so the same name on another server or database is another lock. An entry counts only if
its pid is really one of our ancestors, so an unrelated process that copied the
environment still waits like anyone else.
"""

from __future__ import annotations

from ... import nesting
from ...names import digest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def nesting_key(domain: str, key: int) -> str:
    return f"p-{digest(domain.encode('utf-8', 'surrogateescape'))[:16]}-{key}"


def held_entry(
    env: Mapping[str, str], pid: int, domain: str, key: int, shared: bool
) -> dict[str, str]:
    entry = nesting.entry(pid, nesting_key(domain, key), shared)
    return {nesting.ENV_HELD: nesting.extend(env, entry)}


def enclosing_entry(env: Mapping[str, str], domain: str, key: int) -> tuple[int, str] | None:
    return nesting.enclosing_hold(env, nesting_key(domain, key))
