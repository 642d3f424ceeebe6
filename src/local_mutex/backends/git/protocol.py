"""lock-action's protocol on a git branch: what a lock commit says, read as untrusted input.

The lock named KEY is the branch ``<prefix>KEY`` (prefix ``lock__`` by default). Every
transition is a commit on the empty tree whose message is ``<lock|unlock> by <actor>:
<message>`` followed by a JSON body -- ``message``, ``state``, ``actor``,
``github_actions_workflow_run_url``, ``pull_request_number`` as lock-action writes them, plus
``host``, ``pid``, ``holder_id``, ``expires_at`` (leases), ``token_sha256`` and the job's
identity. Anyone who can push to the repository writes these branches, so a body is read
with bounds on size and nesting and with typed fields, and a branch whose tip is not a
lock commit is never taken, rewritten or deleted.
"""

from __future__ import annotations

import os
import subprocess
import time

from ..._json import cut_to_fit, dumps, loads
from ...errors import InvalidName, ValidationError
from ...identity import utc_stamp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_PREFIX = "lock__"
MAX_BODY = 64 * 1024
MAX_DEPTH = 8
# A body's free text, cut to fit MAX_BODY (a 100 KB command made the lock commit one that
# nobody could read, its own run included).
_FREE_TEXT = ("command", "message", "cwd", "user", "github_actions_workflow_run_url")
# Epoch seconds a lease may name: anything outside is not a time but an attack or a bug.
_EPOCH_RANGE = (0.0, 1e11)


# Ref names git has accepted in this process (each check is a git process of its own).
_VALID: set[str] = set()


class NotALock(ValidationError):
    """The branch exists but its tip is not a commit of the lock protocol."""


class BadBody(ValidationError):
    """A lock commit whose body cannot be trusted (too big, too deep, mistyped)."""


def branch_for(name: str, prefix: str, env: Mapping[str, str] | None = None) -> str:
    """``refs/heads/<prefix><name>``, checked by git's own ref-name rules; no mangling."""
    if not prefix:
        raise ValidationError(
            "--key-prefix must not be empty: every branch of the repository would be a lock"
        )
    ref = f"refs/heads/{prefix}{name}"
    if ref in _VALID:
        return ref
    if not name or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ValidationError(f"lock name {name!r} is not a valid git branch name")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8, kept as surrogates (``display``)
        shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise InvalidName(
            f"lock name '{shown}' cannot be a git branch name: it is not valid UTF-8, and "
            "remote locks need names that every git server and client reads the same way"
        ) from None
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
    _VALID.add(ref)
    return ref


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _epoch(value: object) -> float | None:
    """A lease end as epoch seconds: a finite number in range, or lock-action's ISO form."""
    if isinstance(value, bool):
        return None
    number: float | None = None
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer too big for a float
            return None
    elif isinstance(value, str) and len(value) < 64:
        import calendar

        try:
            number = float(calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")))
        except (ValueError, OverflowError):
            return None
    if number is not None and number == number and _EPOCH_RANGE[0] <= number <= _EPOCH_RANGE[1]:
        return number
    return None


class RemoteState:
    """The branch's newest commit, parsed."""

    __slots__ = ("actor", "body", "expires_at", "message", "oid", "state")

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
        self.expires_at = _epoch(self.body.get("expires_at"))

    def expired(self, now: float | None = None) -> bool:
        expires = self.expires_at
        return expires is not None and (time.time() if now is None else now) >= expires

    @property
    def locked(self) -> bool:
        """Locked right now: a lock commit whose lease (if it has one) has not run out."""
        return self.state == "lock" and not self.expired()

    @property
    def holder_id(self) -> str:
        return _text(self.body.get("holder_id"))

    def as_dict(self) -> dict[str, Any]:
        # The body first: what we computed must win over what anyone pushed.
        return {
            **self.body,
            "oid": self.oid,
            "state": self.state or "absent",
            "locked": self.locked,
            "actor": self.actor,
            "message": self.message,
            "expired": self.expired(),
            "expires_at": self.expires_at,
        }


def parse_message(oid: str, text: str, ref: str) -> RemoteState:
    """A commit of the protocol; NotALock when the first line is not ``lock by …`` or
    ``unlock by …``; BadBody when its JSON body cannot be trusted."""
    subject = _subject(text)
    if subject is None:
        raise NotALock(
            f"branch {ref} ({oid[:12]}) is not a lock: its newest commit is not a lock "
            "commit; refusing to take, rewrite or delete it"
        )
    kind, actor, message = subject
    body: dict[str, Any] = {}
    raw = text.partition("\n")[2].strip()
    if raw:
        try:
            loaded = loads(raw, max_depth=MAX_DEPTH, max_size=MAX_BODY)
        except ValueError as exc:
            raise BadBody(
                f"branch {ref} ({oid[:12]}) has a lock body that is not usable JSON: {exc}"
            ) from None
        if not isinstance(loaded, dict):
            raise BadBody(f"branch {ref} ({oid[:12]}) has a lock body that is not a JSON object")
        body = loaded
    said = body.get("state")
    if said is not None and said != kind:
        raise BadBody(
            f"branch {ref} ({oid[:12]}) says {kind!r} on its first line but {said!r} in its "
            "body; refusing to guess which"
        )
    state = kind
    if (
        "expires_at" in body
        and body["expires_at"] is not None
        and _epoch(body["expires_at"]) is None
    ):
        raise BadBody(
            f"branch {ref} ({oid[:12]}) has a lease end that is not a time: "
            f"{_text(body['expires_at'])[:40]!r}"
        )
    actor_s = _text(body.get("actor")) or actor
    message_s = _text(body["message"]) if "message" in body else message
    return RemoteState(oid, state, actor_s, message_s, body)


def _subject(text: str) -> tuple[str, str, str] | None:
    """(kind, actor, message) of a first line ``<lock|unlock> by <actor>: <message>``."""
    kind, sep, after = text.partition("\n")[0].strip().partition(" by ")
    if kind not in ("lock", "unlock") or not sep:
        return None
    actor, _, message = after.partition(":")
    return kind, actor.strip(), message.strip()


def subject_only(oid: str, text: str) -> RemoteState:
    """A lock commit whose body cannot be trusted, as its first line alone says: no state,
    no body (for ``history``, which must show it, not trust it)."""
    _, actor, message = _subject(text) or ("", "", "")
    return RemoteState(oid, None, actor, message)


def format_message(state: str, actor: str, message: str, body: Mapping[str, Any]) -> str:
    """The commit message; the first line stays one line whatever the actor or message."""
    full = {"message": message, "state": state, "actor": actor, **body}
    full = cut_to_fit(full, MAX_BODY, _FREE_TEXT)  # as readers read it: 64 KiB at most
    message = str(full.get("message", ""))
    head = f"{state} by {' '.join(actor.split()) or '?'}: {' '.join(message.split())}"
    # A word's raw bytes (a Latin-1 terminal: ``caf\xe9``) are lone surrogates, which no
    # commit message can hold: U+FFFD in the first line, the body keeps them escaped.
    head = head.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return f"{head}\n{dumps(full)}\n"


def describe(state: RemoteState) -> str:
    parts = [state.actor or "?"]
    body = state.body
    if body.get("host"):
        parts.append(f"on {_text(body['host'])}")
    from ...ui.lines import quoted, running

    parts += running(body.get("command"), body.get("cwd"))  # as a local lock's holder's
    if state.message:
        parts.append(f"message {quoted(state.message)}")
    if state.expires_at is not None:
        parts.append("lease expires " + utc_stamp(state.expires_at))
    if body.get("github_actions_workflow_run_url"):
        parts.append(_text(body["github_actions_workflow_run_url"]))
    return ", ".join(parts)
