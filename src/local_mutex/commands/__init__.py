"""The verbs as plain functions, one per verb, each ``(Parsed) -> int``: the click-free
fast path and the action call the same functions. What they share lives here."""

from __future__ import annotations

from ..backends import given_remote, open_backend, remote_from_env
from ..errors import LocalMutexError, Unsupported
from ..nesting import ENV_HELD, ENV_REMOTE
from ..ui.lines import Reporter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TypeVar

    from ..backends.base import Backend
    from .argv import Parsed

    T = TypeVar("T")


def reporter_for(parsed: Parsed, env: Mapping[str, str], **options: object) -> Reporter:
    return Reporter(
        nested=bool(env.get(ENV_HELD)),
        quiet=parsed.flag("quiet"),
        words={"remote": f"${ENV_REMOTE}"} if remote_from_env(parsed.text("remote"), env) else None,
        **options,  # type: ignore[arg-type]
    )


def backend_for(
    parsed: Parsed,
    env: Mapping[str, str],
    *,
    reading: bool = False,
    reporter: Reporter | None = None,
) -> Backend:
    """The backend the command line names, with options it cannot honour refused."""
    remote = given_remote(parsed.text("remote"), env, "--remote")
    backend = open_backend(
        remote,
        lock_dir=parsed.text("lock_dir"),
        env=env,
        allow_other_owner=True if parsed.flag("allow_other_owner") else None,
        key_prefix=parsed.text("key_prefix"),
        lease=parsed.number("lease"),
        poll=parsed.number("poll"),
        reading=reading,
    )
    used = [d for d in getattr(backend, "refuses", ()) if d in parsed.given]
    if remote is not None and "remote" in parsed.given and "lock_dir" in parsed.given:
        # Both asked for: a lock dir a remote lock never uses. (One from the environment,
        # $LOCAL_MUTEX_REMOTE, moves a job's locks off the machine, LOCK_DIRs and all.)
        used.append("lock_dir")
    if used:
        backend.close()
        flags = ", ".join("--" + _flag(d) for d in used)
        where = "this machine's locks" if backend.kind == "flock" else f"{backend.kind} remotes"
        raise Unsupported(f"{flags} cannot be used with {where}")
    warning = getattr(backend, "warning", None)  # e.g. a password given in the URL
    if warning and reporter is not None:
        reporter.warning(warning)
    return backend


def _flag(dest: str) -> str:
    return "slots" if dest == "slotted" else dest.replace("_", "-")


class Failed(Exception):
    """A command's work failed; the line is printed, ``code`` is the exit status."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def using(
    parsed: Parsed,
    env: Mapping[str, str],
    reporter: Reporter,
    work: Callable[[Backend], T],
    *,
    reading: bool = False,
    translate: Callable[[BaseException], BaseException] | None = None,
) -> T:
    """Open the backend the command line names, do the work, close it. A library error
    is reported (through ``translate`` first) and raised as Failed with its status."""
    try:
        backend = backend_for(parsed, env, reading=reading, reporter=reporter)
        try:
            return work(backend)
        finally:
            backend.close()
    except (LocalMutexError, KeyboardInterrupt) as exc:
        raise Failed(reporter.failure(translate(exc) if translate else exc)) from None
