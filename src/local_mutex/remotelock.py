"""Locks across machines: a branch on a git remote, in the lock-action protocol.

The lock named KEY is the branch ``<prefix>KEY`` (prefix ``lock__`` by default). Every
transition is a commit on the empty tree whose message is ``<lock|unlock> by <actor>:
<message>`` followed by a JSON body -- ``message``, ``state``, ``actor``,
``github_actions_workflow_run_url``, ``pull_request_number`` as lock-action writes them, plus
``host``, ``pid``, ``holder_id``, ``expires_at`` (leases), ``token_sha256`` and the job's
identity. A lock is taken only by a compare-and-swap push of the branch; losing the race
means "held", never success. Locks taken by either tool are respected by the other.
"""

from __future__ import annotations

import json
import os
import random
import re
import time

from .errors import NotAcquired, Refused, ValidationError
from .gitremote import Git, RemoteError
from .holds import identity, owned, token_hash
from .record import run_url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_PREFIX = "lock__"
ENV_REMOTE = "LOCAL_MUTEX_REMOTE"
DEFAULT_LEASE = 60.0
DEFAULT_POLL = 5.0
_FIRST_LINE = re.compile(r"^(lock|unlock) by (.*?): ?(.*)$")


class LostLease(RemoteError):
    """Our lease was taken over (it expired before we could renew it)."""


def branch_for(name: str, prefix: str, env: Mapping[str, str] | None = None) -> str:
    """``refs/heads/<prefix><name>``, checked by git's own ref-name rules; no mangling."""
    import subprocess

    ref = f"refs/heads/{prefix}{name}"
    if not name or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ValidationError(f"lock name {name!r} is not a valid git branch name")
    proc = subprocess.run(
        ["git", "check-ref-format", ref],
        capture_output=True,
        check=False,
        env=dict(os.environ if env is None else env),
    )
    if proc.returncode != 0:
        raise ValidationError(
            f"lock name {name!r} cannot be a git branch ({prefix}{name}); remote locks need "
            "names that git accepts as branch names (no spaces, '..', '~', '^', ':', '?', "
            "'*', '[', '\\\\', no leading '-' or trailing '.lock')"
        )
    return ref


class RemoteState:
    """The branch's newest commit, parsed."""

    __slots__ = ("actor", "body", "message", "oid", "state")

    def __init__(
        self,
        oid: str | None,
        state: str | None,
        actor: str = "",
        message: str = "",
        body: dict[str, Any] | None = None,
    ) -> None:
        self.oid, self.state, self.actor, self.message = oid, state, actor, message
        self.body: dict[str, Any] = body or {}

    @property
    def expires_at(self) -> float | None:
        value = self.body.get("expires_at")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                import calendar

                return float(calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")))
            except ValueError:
                return None
        return None

    def expired(self, now: float | None = None) -> bool:
        expires = self.expires_at
        return expires is not None and (time.time() if now is None else now) >= expires

    @property
    def locked(self) -> bool:
        """Locked right now: a lock commit whose lease (if it has one) has not run out."""
        return self.state == "lock" and not self.expired()

    def as_dict(self) -> dict[str, Any]:
        return {
            "oid": self.oid,
            "state": self.state or "absent",
            "locked": self.locked,
            "actor": self.actor,
            "message": self.message,
            "expired": self.expired(),
            **{k: v for k, v in self.body.items() if k not in ("state", "actor", "message")},
        }


def parse_message(oid: str, text: str) -> RemoteState:
    first, _, rest = text.partition("\n")
    match = _FIRST_LINE.match(first.strip())
    body: dict[str, Any] = {}
    try:
        loaded = json.loads(rest.strip()) if rest.strip() else {}
        body = loaded if isinstance(loaded, dict) else {}
    except ValueError:
        body = {}
    state = body.get("state") if body.get("state") in ("lock", "unlock") else None
    if state is None and match:
        state = match.group(1)
    actor = str(body.get("actor") or (match.group(2) if match else ""))
    message = str(body.get("message") if "message" in body else (match.group(3) if match else ""))
    return RemoteState(oid, state, actor, message, body)


def format_message(state: str, actor: str, message: str, body: Mapping[str, Any]) -> str:
    full = {"message": message, "state": state, "actor": actor, **body}
    return f"{state} by {actor}: {message}\n{json.dumps(full, indent=2)}\n"


class RemoteLock:
    """One named lock on one remote."""

    def __init__(
        self,
        url: str,
        name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.name = name
        self.ref = branch_for(name, prefix, self.env)
        self.git = Git(url, self.env)
        self.actor = self.env.get("GITHUB_ACTOR") or self.env.get("USER") or "local-mutex"
        # The newest commit we pushed ourselves: the next acquire can try a CAS on it
        # straight away instead of reading the branch first (the CAS still guards it).
        self._last: RemoteState | None = None

    def close(self) -> None:
        self.git.close()

    def __enter__(self) -> RemoteLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --

    def read(self) -> RemoteState:
        oid = self.git.fetch(self.ref)
        if oid is None:
            return RemoteState(None, None)
        return parse_message(oid, self.git.message(oid))

    def history(self) -> list[tuple[int, RemoteState]]:
        oid = self.git.fetch(self.ref, depth=None)
        if oid is None:
            return []
        return [(ct, parse_message(o, msg)) for o, ct, msg in self.git.history(oid)]

    # -- writing --

    def _body(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        pr = self.env.get("LOCAL_MUTEX_PULL_REQUEST_NUMBER", "")
        body: dict[str, Any] = {
            "github_actions_workflow_run_url": run_url(self.env) or "",
            "pull_request_number": int(pr) if pr.isdigit() else None,
            "host": os.uname().nodename,
            "pid": os.getpid(),
        }
        body.update(identity(self.env) or {})
        body.update(extra)
        return body

    def try_take(
        self,
        current: RemoteState,
        *,
        message: str,
        lease: float | None,
        token: str,
        extra: Mapping[str, Any] | None = None,
    ) -> RemoteState | None:
        """One CAS attempt to lock; our new state, or None when someone else got there."""
        body = self._body(
            {
                "holder_id": token_hash(token)[:16],
                "token_sha256": token_hash(token),
                "expires_at": None if lease is None else round(time.time() + lease, 3),
                **(extra or {}),
            }
        )
        if current.state == "lock" and current.expired():
            body["takeover_of"] = current.body.get("holder_id") or current.actor
        text = format_message("lock", self.actor, message, body)
        new = self.git.commit(current.oid, text, self.actor)
        if not self.git.push(self.ref, new, current.oid):
            return None
        self._last = parse_message(new, text)
        return self._last

    def acquire(
        self, *, message: str, lease: float | None, token: str, wait: float | None, poll: float
    ) -> RemoteState:
        """Take the lock, polling while it is held; NotAcquired once ``wait`` runs out."""
        start = time.monotonic()
        last_oid: str | None = "unread"
        current = RemoteState(None, None)
        if self._last is not None and not self._last.locked:
            ours = self.try_take(self._last, message=message, lease=lease, token=token)
            if ours is not None:
                return ours
        while True:
            # A cheap ls-remote first; fetch the commit only when the branch moved.
            head = self.git.head(self.ref) if last_oid != "unread" else None
            if last_oid == "unread" or head != last_oid:
                current = self.read()
                last_oid = current.oid
            if not current.locked:
                ours = self.try_take(current, message=message, lease=lease, token=token)
                if ours is not None:
                    return ours
                last_oid = "unread"  # lost the race: look again at once
                continue
            elapsed = time.monotonic() - start
            if wait is not None and elapsed >= wait:
                raise NotAcquired(
                    f"remote lock {self.name} not acquired after {elapsed:.1f}s; "
                    f"held by {describe(current)}",
                    current.as_dict(),
                    elapsed,
                )
            pause = poll * random.uniform(0.8, 1.2)  # jitter: contenders do not march in step
            if wait is not None:
                pause = min(pause, max(wait - elapsed, 0.0))
            time.sleep(pause)

    def renew(self, ours: RemoteState, lease: float) -> RemoteState:
        body = {**ours.body, "expires_at": round(time.time() + lease, 3)}
        text = format_message("lock", ours.actor, ours.message, body)
        new = self.git.commit(ours.oid, text, self.actor)
        if not self.git.push(self.ref, new, ours.oid):
            raise LostLease(f"remote lock {self.name} was taken over before its lease renewed")
        self._last = parse_message(new, text)
        return self._last

    def release(
        self,
        *,
        ours: RemoteState | None = None,
        token: str | None = None,
        force: bool = False,
        delete_branch: bool = False,
    ) -> RemoteState | None:
        """Unlock (or delete the branch) by CAS; only the holder unless ``force``.
        Returns the state that was released, or None when it was not locked."""
        for _ in range(5):  # only a concurrent renew or takeover moves it under us
            current = ours if ours is not None else self.read()
            if current.oid is None or current.state != "lock":
                return None
            if ours is None and not force and not self._owned(current, token):
                raise Refused(
                    f"remote lock {self.name} is held by {describe(current)}; "
                    "release it with its --token, from its job, or --force"
                )
            if delete_branch:
                done = self.git.push(self.ref, None, current.oid)
                if done:
                    self._last = RemoteState(None, None)
            else:
                body = {
                    k: v
                    for k, v in current.body.items()
                    if k in ("github_actions_workflow_run_url", "pull_request_number")
                }
                body.update(self._body({"released_holder_id": current.body.get("holder_id")}))
                text = format_message("unlock", self.actor, current.message, body)
                new = self.git.commit(current.oid, text, self.actor)
                done = self.git.push(self.ref, new, current.oid)
                if done:
                    self._last = parse_message(new, text)
            if done:
                return current
            if ours is not None:
                raise LostLease(f"remote lock {self.name} changed hands before release")
        raise RemoteError(f"remote lock {self.name} kept changing; release not done")

    def _owned(self, current: RemoteState, token: str | None) -> bool:
        rec = {"hold": True, **current.body}
        return owned(rec, self.env, token)


def describe(state: RemoteState) -> str:
    parts = [state.actor or "?"]
    body = state.body
    if body.get("host"):
        parts.append(f"on {body['host']}")
    if state.message:
        parts.append(f"message {state.message!r}")
    if state.expires_at is not None:
        parts.append(
            "lease expires " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.expires_at))
        )
    if body.get("github_actions_workflow_run_url"):
        parts.append(str(body["github_actions_workflow_run_url"]))
    return ", ".join(parts)


def new_token() -> str:
    return os.urandom(16).hex()
