"""Lock backends, and the one place that picks one from a lock's address.

An address is a lock directory (this machine's kernel) or a ``--remote`` URL: the scheme
picks the backend (``postgresql://``/``postgres://``: PostgreSQL; ``self`` or a git URL of a
documented form: a git remote; anything else is refused). Nothing here imports a backend
until it is chosen, so the plain local path never loads git or database code.
"""

from __future__ import annotations

import os

from ..nesting import ENV_REMOTE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from ..ui.lines import Reporter
    from .base import Backend

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
GIT_SCHEMES = ("https://", "http://", "ssh://", "git://", "file://")
ADDRESSES = (
    "a git remote (https://…, http://…, ssh://…, git://…, file:///path, user@host:path, "
    "or self) or a PostgreSQL database (postgresql://…, postgres://…)"
)


class Take:
    """How to take a lock: what ``Lock.acquire`` is asked for."""

    __slots__ = ("progress", "record", "reporter", "shared", "slots", "wait")

    def __init__(
        self,
        *,
        shared: bool = False,
        slots: int | None = None,
        wait: float | None = None,
        reporter: Reporter | None = None,
        progress: float | None = None,
    ) -> None:
        self.shared, self.slots, self.wait = shared, slots, wait
        self.reporter, self.progress = reporter, progress
        # Who will hold it (``identity.holder_record``), known before it is taken: a backend
        # whose lock itself says who holds it (a git lock commit) publishes it with the lock.
        self.record: Mapping[str, Any] | None = None


class Ending:
    """What ``release`` asks of ``Backend.release_hold``."""

    __slots__ = ("delete_branch", "env", "force", "slots", "token", "waiting")

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        token: str | None = None,
        force: bool = False,
        slots: bool = False,
        delete_branch: bool = False,
        waiting: Callable[[], None] | None = None,
    ) -> None:
        self.env, self.token, self.force = env, token, force
        self.slots, self.delete_branch = slots, delete_branch
        # Called once if the hold's end must wait for runs still inside it.
        self.waiting = waiting


def remote_address(explicit: str | None, env: Mapping[str, str]) -> str | None:
    """``--remote`` > $LOCAL_MUTEX_REMOTE; empty or blank counts as unset."""
    value = explicit if explicit is not None else env.get(ENV_REMOTE, "")
    return value.strip() or None


def remote_from_env(explicit: str | None, env: Mapping[str, str]) -> bool:
    """The address is $LOCAL_MUTEX_REMOTE's: what is wrong with it should name that."""
    return explicit is None and remote_address(None, env) is not None


def given_remote(explicit: str | None, env: Mapping[str, str], what: str) -> str | None:
    """``remote_address``, with an explicit empty ``what`` (``--remote "$REMOTE"`` with the
    variable unset) refused: quietly locking on this machine instead would lose the
    exclusion across machines the caller asked for."""
    if explicit is not None and not explicit.strip():
        from ..errors import BadAddress

        raise BadAddress(
            f"{what} is empty (an unset variable?): give the address, or leave {what} "
            "out to lock on this machine"
        )
    return remote_address(explicit, env)


def is_git_address(remote: str) -> bool:
    """A git URL of a documented form: a known scheme with something after it, ``self``,
    or scp-like ``[user@]host:path`` (a ':' before any '/', as git itself reads it)."""
    if remote == "self":
        return True
    if remote.startswith(GIT_SCHEMES):
        rest = remote.partition("://")[2]
        host = rest.partition("/")[0].rpartition("@")[2]
        # No host is blank, holds a space or starts with '-' (ssh would take it for an
        # option); file:// has none, its path may hold spaces.
        return bool(rest.strip("/")) and (
            remote.startswith("file://") or (bool(host) and not _odd_host(host))
        )
    # ``[user@]host:path``; an IPv6 host is bracketed: ``[::1]:path``, ``user@[::1]:path``
    split = "]:" if remote.startswith("[") or "@[" in remote else ":"
    host, colon, path = remote.partition(split)
    return bool(
        colon
        and host
        and path
        and "/" not in host
        and not path.startswith(("//", ":"))  # a mistyped scheme; ``helper::address``
        and not _odd_host(host.rpartition("@")[2])
    )


def _odd_host(host: str) -> bool:
    return host.startswith("-") or any(c.isspace() for c in host)


def check_address(remote: str) -> None:
    """BadAddress unless ``remote`` is an address some backend is documented to take."""
    from ..errors import BadAddress

    bad = next((c for c in remote if c < " " or c == "\x7f"), None)
    if bad is not None:  # a newline pasted along: no form holds one
        raise BadAddress(
            f"--remote {remote!r} holds a control character (0x{ord(bad):02X}); "
            "no lock address does"
        )
    if remote.startswith(POSTGRES_SCHEMES) or is_git_address(remote):
        return

    hint = " (a local path? give it as file:///path)" if remote.startswith((".", "/")) else ""
    raise BadAddress(f"--remote {remote!r} is not a lock address{hint}: give {ADDRESSES}")


def open_backend(
    remote: str | None,
    *,
    lock_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    allow_other_owner: bool | None = None,
    key_prefix: str | None = None,
    lease: float | None = None,
    poll: float | None = None,
    reading: bool = False,
) -> Backend:
    """The backend for this address. ``remote`` None means this machine's lock dir
    (``lock_dir``, else $LOCAL_MUTEX_LOCK_DIR, else /tmp). ``reading``: for status, list
    and release, which never create anything."""
    env = os.environ if env is None else env
    if remote is None:
        from .flock.backend import FlockBackend

        return FlockBackend(lock_dir, env=env, allow_other_owner=allow_other_owner, reading=reading)
    check_address(remote)
    if remote.startswith(POSTGRES_SCHEMES):
        from .postgres.backend import PostgresBackend  # type: ignore[import-not-found, unused-ignore]

        return PostgresBackend(remote, env=env, reading=reading)  # type: ignore[no-any-return, unused-ignore]
    from .git.backend import GitBackend

    return GitBackend(remote, env=env, key_prefix=key_prefix, lease=lease, poll=poll)
