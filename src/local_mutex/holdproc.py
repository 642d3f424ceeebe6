"""The detached holder behind ``local-mutex hold``: take the lock, say so, keep it.

It keeps the lock until SIGTERM (``release``), its TTL, or the end of the job it belongs
to (the runner process it watches exits). Any death, SIGKILL included, frees the lock.
"""

from __future__ import annotations

import os
import select
import signal
import time

from . import record
from .errors import NotAcquired, ValidationError
from .holds import ENV_READY_FD, ENV_SPEC, identity, token_hash

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _say(fd: int, text: str) -> None:
    os.write(fd, text.encode("utf-8", "surrogateescape"))
    os.close(fd)


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> int:
    spec: dict[str, Any] = record.load_json_object(os.environ.pop(ENV_SPEC, "")) or {}
    ready = int(os.environ.pop(ENV_READY_FD, "-1"))
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .wrap import Target, acquire

    env = dict(os.environ)
    allow = spec.get("allow_other_owner")
    try:
        target = Target(spec["name"], spec["lock_dir"], allow, env)
        if spec.get("slots"):
            from .slots import take_slot

            slot, waited = take_slot(
                target.label,
                target.path,
                int(spec["slots"]),
                wait=spec.get("wait"),
                allow_other_owner=bool(allow),
                reporter=None,
            )
            target.close()
            fd, extra_slot = slot.fd, {"slot": slot.index}
        else:
            waited = acquire(
                target, shared=False, wait=spec.get("wait"), reporter=None, progress=None
            )
            fd, extra_slot = target.fd, {}
    except NotAcquired as exc:
        _say(
            ready,
            "busy "
            + record.dump_json({"message": str(exc), "holder": exc.holder, "waited": exc.waited}),
        )
        return 75
    except ValidationError as exc:
        _say(ready, "invalid " + record.dump_json({"message": str(exc)}))
        return 2
    token = os.urandom(16).hex()
    ttl = spec.get("ttl")
    extra: dict[str, Any] = {"hold": True, "token_sha256": token_hash(token), **extra_slot}
    extra.update(identity(env) or {})
    if spec.get("message"):
        extra["message"] = spec["message"]
    if ttl:
        extra["expires_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + ttl))
    record.write_record(
        fd, record.make_record(target.label, "local-mutex hold", shared=False, env=env, extra=extra)
    )
    _say(ready, f"ok {token} {waited:.3f}")
    os.chdir("/")  # a long-lived daemon must not pin the caller's directory (or its mount)
    try:
        _keep(spec.get("anchor"), ttl)
    finally:
        record.clear_record(fd)
        os.close(fd)  # the lock goes with it
    return 0


def _keep(anchor: int | None, ttl: float | None) -> None:
    """Sleep until the TTL runs out or the anchor process exits (SIGTERM ends it earlier)."""
    deadline = None if not ttl else time.monotonic() + ttl
    watch = None
    if anchor:
        try:
            watch = os.pidfd_open(anchor)  # becomes readable when the process exits
        except (AttributeError, OSError):
            watch = None
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return
        if watch is not None:
            if select.select([watch], [], [], remaining)[0]:
                return
        elif anchor:
            try:
                os.kill(anchor, 0)
            except ProcessLookupError:
                return
            time.sleep(1.0 if remaining is None else min(1.0, remaining))
        else:
            time.sleep(3600.0 if remaining is None else remaining)
