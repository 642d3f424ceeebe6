"""The remote (git) lock domain as commands: run, hold, release, status, history."""

from __future__ import annotations

import os
import signal
import threading
import time

from .cli import failure_status
from .errors import LocalMutexError, RemoteError
from .lockdir import choose_lock_dir
from .nesting import ENV_HELD
from .notices import Reporter, one_line, utc_stamp
from .record import dump_json
from .remotelock import (
    DEFAULT_LEASE,
    DEFAULT_POLL,
    DEFAULT_PREFIX,
    LostLease,
    RemoteLock,
    RemoteState,
    describe,
    new_token,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


class _Heartbeat:
    """Renews the lease every third of it while the command runs. If the lease is lost
    (taken over), the command is stopped: it would no longer be protected."""

    def __init__(
        self, lock: RemoteLock, ours: RemoteState, lease: float, reporter: Reporter
    ) -> None:
        self.lock, self.ours, self.lease, self.reporter = lock, ours, lease, reporter
        self.lost = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="local-mutex-lease", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat(self) -> None:
        while not self._done.wait(self.lease / 3):
            try:
                self.ours = self.lock.renew(self.ours, self.lease)
            except LostLease as exc:
                self.lost = True
                self.reporter.error(f"{exc}; stopping the command")
                os.kill(os.getpid(), signal.SIGTERM)  # the supervisor stops the group
                return
            except RemoteError as exc:  # transient: try again next beat
                self.reporter.write(f"could not renew the lease yet: {exc}")


def run_remote_locked(
    command: str,
    name: str,
    url: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    lease: float = DEFAULT_LEASE,
    poll: float = DEFAULT_POLL,
    wait: float | None = None,
    timeout: float | None = None,
    kill_after: float = 5.0,
    message: str | None = None,
    lock_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    lock_env: Mapping[str, str] | None = None,
    reporter: Reporter,
) -> tuple[int, float, float]:
    """Run the command under a leased lock on the remote: (status, waited, held).

    ``lock_env`` is what git sees (credentials); ``env`` is what the command sees.
    """
    from .names import validate_command
    from .supervise import SignalsHeld, supervise
    from .wrap import child_env

    env = os.environ if env is None else env
    validate_command(command)
    with RemoteLock(url, name, prefix=prefix, env=lock_env or env) as lock:
        current = lock.read()
        detail = f"held on {url} by {describe(current)}" if current.locked else None
        reporter.waiting(name, None, detail=detail)
        start = time.monotonic()
        ours = lock.acquire(
            message=message or f"run: {one_line(command, 200)}",
            lease=lease,
            token=new_token(),
            wait=wait,
            poll=poll,
        )
        waited = time.monotonic() - start
        if "takeover_of" in ours.body:
            reporter.write(
                f"took over remote lock {name}: the previous holder's lease had expired", "notice"
            )
        with _Heartbeat(lock, ours, lease, reporter) as beat, SignalsHeld():
            outcome = supervise(
                command,
                child_env(env, choose_lock_dir(lock_dir, env), None),
                timeout=timeout,
                kill_after=kill_after,
            )
            beat.stop()  # before the release, and before signals are let through again
            if not beat.lost:
                lock.release(ours=beat.ours)
        held = time.monotonic() - outcome.started
        if outcome.timed_out and timeout is not None:
            reporter.timed_out(name, timeout, outcome.kill_sent)
        reporter.released(name, waited, held, outcome.status)
        return outcome.status, waited, held


def remote_run(command: str, name: str, url: str, **options: Any) -> int:
    """``run --remote`` for the CLI: the exit status, errors reported."""
    env = options.get("env") or os.environ
    reporter = Reporter(nested=bool(env.get(ENV_HELD)))
    try:
        return run_remote_locked(command, name, url, reporter=reporter, **options)[0]
    except (LocalMutexError, KeyboardInterrupt) as exc:
        return failure_status(exc, reporter)


def remote_hold(
    name: str,
    url: str,
    *,
    prefix: str,
    wait: float | None,
    poll: float,
    ttl: float | None,
    message: str | None,
) -> int:
    """Take a persistent (or --ttl) lock on the remote; print its token."""
    reporter = Reporter()
    token = new_token()
    try:
        with RemoteLock(url, name, prefix=prefix) as lock:
            ours = lock.acquire(
                message=message or "hold", lease=ttl, token=token, wait=wait, poll=poll
            )
    except (LocalMutexError, KeyboardInterrupt) as exc:
        return failure_status(exc, reporter)
    reporter.write(f"holding {name} on {url} ({lock.ref}, commit {ours.oid})", "notice")
    print(token)
    return 0


def remote_release(
    name: str, url: str, *, prefix: str, token: str | None, force: bool, delete_branch: bool
) -> int:
    reporter = Reporter()
    try:
        with RemoteLock(url, name, prefix=prefix) as lock:
            released = lock.release(
                token=token or os.environ.get("LOCAL_MUTEX_HOLD_TOKEN"),
                force=force,
                delete_branch=delete_branch,
            )
    except (LocalMutexError, KeyboardInterrupt) as exc:
        return failure_status(exc, reporter)
    if released is None:
        reporter.write(f"{name} is not locked on {url}; nothing to release", "notice")
    else:
        reporter.write(f"released {name} on {url} (was held by {describe(released)})", "notice")
    return 0


def remote_status(name: str, url: str, *, prefix: str, as_json: bool) -> int:
    try:
        with RemoteLock(url, name, prefix=prefix) as lock:
            state = lock.read()
            ref = lock.ref
    except RemoteError as exc:
        Reporter().error(str(exc))
        return 3
    except LocalMutexError as exc:
        return failure_status(exc, Reporter())
    data = {"name": name, "remote": url, "ref": ref, **state.as_dict()}
    if as_json:
        print(dump_json(data))
    elif state.locked:
        print(f"{name}: locked on {url} ({ref}) by {describe(state)}")
    else:
        print(
            f"{name}: free on {url} ({ref}" + (", lease expired)" if state.state == "lock" else ")")
        )
    return 1 if state.locked else 0


def remote_history(name: str, url: str, *, prefix: str, as_json: bool) -> int:
    try:
        with RemoteLock(url, name, prefix=prefix) as lock:
            entries = lock.history()
    except (LocalMutexError, KeyboardInterrupt) as exc:
        return failure_status(exc, Reporter())
    rows = []
    previous: RemoteState | None = None
    for when, st in reversed(entries):  # oldest first: a story reads forwards
        what = st.state or "?"
        holder = st.body.get("holder_id")
        if st.body.get("takeover_of"):
            what = "takeover"
        elif (
            what == "lock"
            and previous is not None
            and previous.state == "lock"
            and holder
            and previous.body.get("holder_id") == holder
        ):
            what = "renew"
        previous = st
        rows.append(
            {
                "time": utc_stamp(when),
                "event": what,
                "actor": st.actor,
                "message": st.message,
                "host": st.body.get("host"),
                "holder_id": st.body.get("holder_id"),
                "oid": st.oid,
                "run_url": st.body.get("github_actions_workflow_run_url") or None,
            }
        )
    if as_json:
        print(dump_json(rows))
    elif not rows:
        print(f"{name}: no history on {url}")
    else:
        for row in rows:
            host = f" on {row['host']}" if row["host"] else ""
            print(f"{row['time']}  {row['event']:<8} {row['actor']}{host}: {row['message']}")
    return 0
