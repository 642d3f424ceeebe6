"""``hold`` and ``release``: a lock kept across commands, and its end."""

from __future__ import annotations

import os
import time

from .._fastsignal import deferred_stops, quiet_stops, stoppable
from ..backends import Ending
from ..errors import (
    EXIT_IOERR,
    EXIT_USAGE,
    Interrupted,
    InvalidLockDir,
    LocalMutexError,
    LockLost,
    NestingError,
)
from ..identity import ENV_TOKEN, utc_stamp
from ..names import name_bytes
from ..nesting import ENV_REMOTE
from ..ui.output import STDOUT, closed_by_caller, out
from . import Failed, reporter_for, using

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ..backends.base import Backend, HoldInfo, Released
    from ..ui.lines import Reporter
    from .argv import Parsed


def take_hold(
    backend: Backend,
    name: str,
    parsed_values: Mapping[str, Any],
    env: Mapping[str, str],
    reporter: Reporter | None = None,
) -> HoldInfo:
    """A hold on ``name``: persistent where the backend keeps them (git), else a detached
    holder process (this machine, PostgreSQL), which says as ``reporter`` would that it
    waits (on our stderr, until it holds the lock)."""
    raw = name_bytes(name)
    wait, ttl = parsed_values.get("wait"), parsed_values.get("ttl")
    message = parsed_values.get("message")
    if parsed_values.get("slots") is None:  # a hold of another slot need not wait for ours
        _refuse_inside_itself(backend, raw, env)
    waiting = None if reporter is None else reporter.waiting_only()
    if backend.persistent_holds:
        return backend.hold_persistent(raw, wait=wait, ttl=ttl, message=message, reporter=waiting)
    from ..holds.start import start_hold

    return start_hold(
        raw,
        backend_spec(backend, parsed_values),
        lock_file=backend.address,
        wait=wait,
        ttl=ttl,
        message=message,
        slots=parsed_values.get("slots"),
        env=env,
        report=None if waiting is None else waiting.settings(),
    )


def _refuse_inside_itself(backend: Backend, raw: bytes, env: Mapping[str, str]) -> None:
    """A hold of the lock that an enclosing run of ours holds would wait for itself."""
    lock = backend.lock(raw)
    try:
        found = lock.enclosing(env)
    finally:
        lock.close()
    if found is not None:
        raise NestingError(
            f"lock {lock.label} is held by enclosing pid {found[0]}, which this hold runs "
            "inside: it would wait for itself forever; nothing was held"
        )


def backend_spec(backend: Backend, values: Mapping[str, Any]) -> dict[str, Any]:
    """How the holder process opens the same backend again."""
    if backend.kind == "flock":
        return {
            "remote": None,
            "lock_dir": backend.address,
            "allow_other_owner": bool(getattr(backend, "allow_other_owner", False)),
        }
    return {"remote": values.get("remote_url") or backend.address}


def release_hint(name: str, parsed: Parsed, address: str) -> str:
    """The command that ends this hold, minus its token (stdout only) and any password
    (``address`` is the backend's printable address, passwords masked)."""
    from .suggest import paste_quote

    options = []
    for dest in ("lock_dir", "remote", "key_prefix"):
        value = parsed.text(dest)
        if value is not None and dest in parsed.given:
            shown = address if dest == "remote" else value
            options += ["--" + dest.replace("_", "-"), paste_quote(shown)]
    if parsed.count("slots"):
        options.append("--slots")
    # In the environment, not --token: a command line is anybody's to read (ps).
    release = [f"{ENV_TOKEN}=<the token printed above>", "local-mutex", "release"]
    if name.startswith("-"):  # it reads as an option: after a `--`, as on the way in
        return " ".join([*release, *options, "--", paste_quote(name)])
    return " ".join([*release, paste_quote(name), *options])


def hold(parsed: Parsed, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    reporter = reporter_for(parsed, env)
    name = parsed.positionals[0]
    if STDOUT in closed_by_caller:
        reporter.error(
            "hold prints the token that ends it on standard output, which is closed; "
            "nothing was held (send it to a file, or to /dev/null to drop it on purpose)"
        )
        return EXIT_USAGE
    values = {**parsed.values, "wait": parsed.wait()}
    values["remote_url"] = parsed.text("remote") or env.get(ENV_REMOTE)
    address = ""
    taken: list[HoldInfo] = []

    def work(backend: Backend) -> HoldInfo:
        nonlocal address
        address = backend.address
        taken.append(take_hold(backend, name, values, env, reporter))
        return taken[0]

    stops = deferred_stops()
    try:
        # Until the token is out, a stop signal waits (a wait for the lock stays
        # interruptible): then it ends what was taken, which nobody else has the token of
        # (a remote's hold would last until a forced release).
        with stops:
            info = using(parsed, env, reporter, work, translate=_nothing_held)
            _print_token(info.token, stops.pending)
    except Failed as exc:  # reported; if it came after the hold was taken, end it
        return _end_undelivered(parsed, env, reporter, name, taken, "failed", exc.code)
    except OSError as exc:  # a closed pipe, a full disk: nobody has the token
        why = f"could not print the hold's token ({exc.strerror or type(exc).__name__})"
        return _end_undelivered(parsed, env, reporter, name, taken, why, EXIT_IOERR)
    if stops.pending:
        sig = stops.pending[0]
        why = f"stopped by signal {sig}"
        return _end_undelivered(parsed, env, reporter, name, taken, why, 128 + sig)
    from ..holds.start import delivered

    try:
        delivered(info)  # only now does the holder keep it: killed before this, it ends
    except (Interrupted, LockLost) as exc:  # killed meanwhile: the token printed ends nothing
        return reporter.failure(exc)
    where = f"detached pid {info.pid}" if info.pid else info.lock_file
    ttl = values.get("ttl")
    until = ""
    if isinstance(ttl, (int, float)) and ttl:
        until = f" until {utc_stamp(time.time() + ttl)} at the latest (--ttl)"
    reporter.notice(
        f"holding {info.name} in {where}{until}; release with: "
        f"{release_hint(name, parsed, address)}"
    )
    return 0


def _print_token(token: str, stops: list[int]) -> None:
    """stdout only: logs (stderr, annotations) are read by many. Told to stop (``stops``),
    before or while the write blocks (a stdout nobody reads), it is not printed: the hold
    is ended, as nobody has its token."""
    stoppable(_unless_stopped, token, stops)


def _unless_stopped(token: str, stops: list[int]) -> None:
    if not stops:  # looked at inside ``stoppable``: a stop from here on cuts the write
        out(token)


def _end_undelivered(
    parsed: Parsed,
    env: Mapping[str, str],
    reporter: Reporter,
    name: str,
    taken: list[HoldInfo],
    what: str,
    code: int,
) -> int:
    """A hold whose ``hold`` failed once it was taken (``what``: its token not printed, a
    stop signal) would last until a forced release: end it with its token and fail with
    ``code``. A second stop signal must not cut that short. Nothing taken: just fail."""
    if not taken:
        return code
    ending = Ending(env, token=taken[0].token, slots=bool(parsed.count("slots")))
    with quiet_stops():
        try:
            using(parsed, env, reporter, lambda b: b.release_hold(name_bytes(name), ending))
        except Failed as failed:
            reporter.error(f"{what}, and could not end the hold: see release --force")
            return failed.code
    reporter.error(f"{what}; ended the hold")
    return code


def _nothing_held(exc: BaseException) -> BaseException:
    """A stop while ``hold`` waited: it has no command that "did not run" (what a remote
    added, say a lock push undone, stays)."""
    if isinstance(exc, Interrupted):
        exc.args = (str(exc).replace("; the command did not run", "; nothing was done", 1),)
    return exc


def release(parsed: Parsed, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    reporter = reporter_for(parsed, env)
    name = parsed.positionals[0]
    ending = Ending(
        env,
        token=parsed.text("token"),
        force=parsed.flag("force"),
        slots=parsed.flag("slotted"),
        delete_branch=parsed.flag("delete_branch"),
        waiting=lambda: reporter.info(
            f"waiting for the runs inside the hold on {name} to end before ending it"
        ),
    )

    try:
        done, slots_held = using(
            parsed, env, reporter, lambda b: end_hold(b, name, ending), reading=True
        )
    except Failed as exc:
        return exc.code
    if slots_held:
        from .suggest import paste_quote

        reporter.warning(
            f"{name} is not held, but its slots are, by no hold of this job or token: "
            f"nothing released (a hold of the slots is released with its token in "
            f"${ENV_TOKEN}, or local-mutex release --slots --force {paste_quote(name)})"
        )
        return 0
    report_release(reporter, name, done)
    return 0


def end_hold(backend: Backend, name: str, ending: Ending) -> tuple[Released, bool]:
    """``release_hold``, and (whether NAME's slots are held by others' holds: the caller
    should say how to name them). A release of NAME's plain lock, which is free, ends this
    job's (or the token's) hold of NAME's slots: that is the hold the caller meant."""
    slotted = Ending(ending.env, token=ending.token, slots=True, waiting=ending.waiting)
    try:
        done = backend.release_hold(name_bytes(name), ending)
    except InvalidLockDir as missing:  # no plain lock file (a tmp cleaner): slots may be held
        if ending.slots:
            raise
        try:
            return backend.release_hold(name_bytes(name), slotted), False
        except InvalidLockDir:  # no slot files either: the plain lock's answer stands
            raise missing from None
    if done.was_held or ending.slots:
        return done, False
    try:
        if not any(s.held for s in backend.status(name_bytes(name)).slots):
            return done, False
    except LocalMutexError:
        return done, False
    # Not with --force: which of several holds of the slots it ended would be a guess.
    try:
        return backend.release_hold(name_bytes(name), slotted), False
    except LocalMutexError:  # not ours
        return done, True


def report_release(reporter: Reporter, name: str, done: Any) -> None:
    if done.was_held:
        held = "" if done.held_seconds is None else f" after {done.held_seconds:.1f}s"
        who = f"hold pid {done.pid}" if done.pid else (done.holder or "hold")
        reporter.notice(f"released {name} ({who}){held}")
    else:
        reporter.warning(f"{name} is not held; nothing to release")
