"""The git backend: locks as branches of a git remote (``--remote URL`` or ``self``)."""

from __future__ import annotations

from ...errors import BadAddress
from ...identity import ENV_GIT_TOKEN, ENV_TOKEN, new_token, utc_stamp
from ...names import validate_name
from ..base import Holder, HoldInfo, LockStatus, Released
from ..secrets import has_password, mask
from .letgo import unlock
from .lock import GitLock
from .plumbing import GIT_TIMEOUT, Git
from .protocol import (
    DEFAULT_PREFIX,
    BadBody,
    NotALock,
    RemoteState,
    describe,
    parse_message,
    subject_only,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from ...ui.lines import Reporter
    from .. import Ending

DEFAULT_LEASE = 60.0
DEFAULT_POLL = 5.0


def resolve_url(url: str, env: Mapping[str, str]) -> tuple[str, str | None]:
    """(URL, token): ``self`` is this GitHub repository, with the job's token."""
    token = env.get(ENV_GIT_TOKEN) or None
    if url != "self":
        return url, token
    server, repo = env.get("GITHUB_SERVER_URL", ""), env.get("GITHUB_REPOSITORY", "")
    if not server or not repo:
        raise BadAddress(
            "--remote self means this GitHub repository, but GITHUB_SERVER_URL and "
            "GITHUB_REPOSITORY are not set (not inside GitHub Actions); give the URL"
        )
    return f"{server.rstrip('/')}/{repo}.git", token or env.get("GITHUB_TOKEN") or None


class GitBackend:
    kind = "git"
    persistent_holds = True
    refuses: tuple[str, ...] = ("shared", "slots", "slotted", "reentrant", "allow_other_owner")
    unlisted: Sequence[str] = ()

    def __init__(
        self,
        url: str,
        *,
        env: Mapping[str, str],
        key_prefix: str | None = None,
        lease: float | None = None,
        poll: float | None = None,
    ) -> None:
        self.env = env
        self.url, token = resolve_url(url, env)
        self.address = mask(self.url)  # what messages, status and JSON show
        # For the CLI to print (library code never prints): a password in the URL.
        self.warning = (
            "the --remote URL holds a password, which anyone who can list processes on this "
            f"machine can read; prefer ${ENV_GIT_TOKEN} (the URL is shown as {self.address})"
            if has_password(self.url)
            else None
        )
        self.prefix = DEFAULT_PREFIX if key_prefix is None else key_prefix
        self.lease = DEFAULT_LEASE if lease is None else lease
        self.poll = DEFAULT_POLL if poll is None else poll
        self.git_timeout = GIT_TIMEOUT
        self.actor = env.get("GITHUB_ACTOR") or env.get("USER") or "local-mutex"
        self.git = Git(self.url, env, token)
        # Per branch, the newest commit this process pushed (see ``GitLock.take``).
        self.pushed: dict[str, RemoteState] = {}

    def lock(self, name: bytes) -> GitLock:
        return GitLock(self, validate_name(name))

    def status(self, name: bytes) -> LockStatus:
        lock = self.lock(name)
        return _status(lock.read(), lock.lock_file, lock.label)

    def list_locks(self, *, include_free: bool) -> list[LockStatus]:
        out: list[LockStatus] = []
        unlisted: list[str] = []
        self.unlisted = unlisted
        for ref, oid in self.git.heads(self.prefix):
            name = ref[len("refs/heads/") + len(self.prefix) :]
            try:
                fetched = self.git.fetch(ref)
                state = parse_message(oid, self.git.message(fetched or oid, ref), ref)
            except (NotALock, BadBody) as exc:
                # Nobody can take its name until a person fixes the branch: said, but one
                # such branch must not hide all the others.
                unlisted.append(f"{exc}; not listed")
                continue
            st = _status(state, f"{self.address} {ref}", name)
            if include_free or st.held:
                out.append(st)
        return out

    def history(self, name: bytes) -> list[dict[str, Any]]:
        lock = self.lock(name)
        oid = self.git.fetch(lock.ref, depth=None)
        if oid is None:
            return []
        self.git.message(oid, lock.ref)  # NotALock for a tip that is no commit
        entries: list[tuple[int, RemoteState, str | None]] = []
        for commit, when, message in self.git.history(oid):
            try:
                entries.append((when, parse_message(commit, message, lock.ref), None))
            except NotALock:
                continue
            except BadBody as exc:
                # Pushed by anyone, and there for good: shown as unread, not the end of it.
                entries.append((when, subject_only(commit, message), str(exc)))
        return _story(entries)

    def hold_persistent(
        self,
        name: bytes,
        *,
        wait: float | None,
        ttl: float | None,
        message: str | None,
        reporter: Reporter | None = None,
    ) -> HoldInfo:
        """A lock commit that stays until released (or its ``ttl`` runs out)."""
        lock = self.lock(name)
        lock.token = new_token()
        waited = lock.take(wait, reporter, lease=ttl, message=message or "", extra={"hold": True})
        return HoldInfo(lock.label, lock.lock_file, None, lock.token, waited)

    def release_hold(self, name: bytes, ending: Ending) -> Released:
        lock = self.lock(name)
        done = unlock(
            lock,
            None,
            force=ending.force,
            delete_branch=ending.delete_branch,
            token=ending.token or ending.env.get(ENV_TOKEN) or None,
        )
        if done is None:
            return Released(lock.lock_file, False)
        return Released(lock.lock_file, True, None, None, holder=describe(done))

    def close(self) -> None:
        self.git.close()


def _status(state: RemoteState, where: str, name: str) -> LockStatus:
    st = _bare_status(state, where, name)
    st.detail = state.as_dict()
    return st


def _bare_status(state: RemoteState, where: str, name: str) -> LockStatus:
    if not state.locked:
        return LockStatus(where, name, "free", "git")
    body = state.body

    def text(key: str) -> str | None:
        value = body.get(key)
        return value if isinstance(value, str) and value else None

    pid = body.get("pid")
    holder = Holder(
        pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        "exclusive",
        # A hold has no process of its own on a remote: its pid is the `hold` that took it.
        text("command") or ("local-mutex hold" if body.get("hold") is True else None),
        cwd=text("cwd"),
        host=text("host"),
        user=state.actor or None,
        runner=text("runner"),
        job=text("job"),
        run_url=text("github_actions_workflow_run_url"),
        message=state.message or None,
        source="record",
    )
    return LockStatus(where, name, "held", "git", "exclusive", [holder])


def _story(entries: list[tuple[int, RemoteState, str | None]]) -> list[dict[str, Any]]:
    rows = []
    previous: RemoteState | None = None
    for when, st, error in reversed(entries):  # oldest first: a story reads forwards
        what = st.state or "?"
        holder = st.holder_id
        if error is not None:
            what = "unreadable"
        elif st.body.get("takeover_of"):
            what = "takeover"
        elif (
            what == "lock"
            and previous is not None
            and previous.state == "lock"
            and holder
            and previous.holder_id == holder
        ):
            what = "renew"
        previous = st
        rows.append(
            {
                "time": utc_stamp(when),
                "event": what,
                "actor": st.actor,
                "message": st.message or None,  # none given: null, as in status
                "host": _string(st.body, "host"),
                "command": _string(st.body, "command"),
                "cwd": _string(st.body, "cwd"),
                "holder_id": holder or None,
                "oid": st.oid,
                "run_url": st.body.get("github_actions_workflow_run_url") or None,
                "error": error,
            }
        )
    return rows


def _string(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    return value if isinstance(value, str) else None
