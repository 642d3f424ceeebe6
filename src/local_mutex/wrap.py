"""Run one command under one named lock: the whole lifecycle, start to release."""

from __future__ import annotations

import os
import sys
import time

from . import kernel, nesting, record
from .errors import NestingError, NotAcquired
from .lockdir import allow_other_owner_from_env, open_lock_file, resolve_lock_dir
from .names import display, lock_filename, validate_command, validate_name
from .notices import Reporter, describe_holder, duration
from .supervise import Outcome, SignalsHeld, supervise

# Type-only imports: typing and collections cost a plain run measurable startup time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

ENV_CLI = "LOCAL_MUTEX_CLI"
ENV_PYTHON = "LOCAL_MUTEX_PYTHON"
ENV_PROGRESS = "LOCAL_MUTEX_PROGRESS_SECONDS"
DEFAULT_PROGRESS = 30.0
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local-mutex.sh")


class RunResult:
    """What happened: the exit status plus the numbers the action reports."""

    __slots__ = (
        "acquired",
        "held",
        "lock_file",
        "reentrant",
        "signalled",
        "status",
        "timed_out",
        "waited",
    )

    def __init__(self, lock_file: str) -> None:
        self.lock_file = lock_file
        self.status = 0
        self.signalled = False  # we forwarded a stop signal: the caller was asked to stop
        self.acquired = False
        self.reentrant = False
        self.timed_out = False
        self.waited = 0.0
        self.held = 0.0


class Target:
    """A validated name, its lock file, and an open descriptor on it."""

    def __init__(
        self,
        name: str | bytes,
        lock_dir: str | None,
        allow_other_owner: bool | None,
        env: Mapping[str, str],
    ) -> None:
        self.raw = validate_name(name)
        self.label = display(self.raw)
        self.lock_dir = resolve_lock_dir(lock_dir, env)
        self.path = os.path.join(self.lock_dir, lock_filename(self.raw))
        if allow_other_owner is None:
            allow_other_owner = allow_other_owner_from_env(env)
        self.fd = open_lock_file(self.path, allow_other_owner=allow_other_owner)
        st = os.fstat(self.fd)
        self.dev, self.ino = st.st_dev, st.st_ino

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor is what releases the lock
            self.fd = -1


def _busy_holder(target: Target) -> dict[str, Any] | None:
    """Who holds the lock right now, from its record or, failing that, from the kernel."""
    rec = record.read_record(target.path)
    if rec is not None:
        return rec
    from .lockstate import kernel_holders  # only paid for when the lock is busy

    holders = kernel_holders(target.path)
    return holders[0].as_dict() if holders else None


def acquire(
    target: Target,
    *,
    shared: bool,
    wait: float | None,
    reporter: Reporter | None,
    progress: float | None,
) -> float:
    """Take the lock (announcing the wait); return seconds waited or raise NotAcquired."""
    start = time.monotonic()
    with kernel.interruptible():
        if kernel.try_lock(target.fd, shared=shared):
            if reporter is not None:
                reporter.waiting(target.label, None)
            return 0.0
        holder = _busy_holder(target)
        if reporter is not None:
            reporter.waiting(target.label, holder)
        if wait is not None and wait <= 0:
            raise NotAcquired(_not_acquired_text(target, 0.0, holder), holder, 0.0)
        with _Progress(target, reporter, progress, start):
            got = kernel.wait_lock(target.fd, shared=shared, timeout=wait)
    waited = time.monotonic() - start
    if not got:
        holder = _busy_holder(target)
        raise NotAcquired(_not_acquired_text(target, waited, holder), holder, waited)
    if reporter is not None:
        reporter.acquired(target.label, waited)
    return waited


class _Progress:
    """Repeat a progress line from a helper thread while the main thread stays queued in
    flock(): interrupting the call to print would take us out of the kernel's queue."""

    def __init__(
        self, target: Target, reporter: Reporter | None, every: float | None, start: float
    ) -> None:
        self.target, self.reporter, self.every, self.start = target, reporter, every, start
        self.stop: Callable[[], None] | None = None

    def __enter__(self) -> None:
        reporter, every = self.reporter, self.every
        if reporter is None or every is None:
            return
        import threading

        done = threading.Event()

        def tick() -> None:
            from .lockstate import queue_position

            while not done.wait(every):
                reporter.still_waiting(
                    self.target.label,
                    time.monotonic() - self.start,
                    _busy_holder(self.target),
                    queue_position(self.target.path),
                )

        thread = threading.Thread(target=tick, name="local-mutex-progress", daemon=True)
        thread.start()

        def stop() -> None:
            done.set()
            thread.join()

        self.stop = stop

    def __exit__(self, *exc: object) -> None:
        if self.stop is not None:
            self.stop()


def _not_acquired_text(target: Target, waited: float, holder: Mapping[str, Any] | None) -> str:
    text = f"lock {target.label} not acquired after waiting {duration(waited)}"
    return text + (f"; held by {describe_holder(holder)}" if holder else "")


def _progress_interval(env: Mapping[str, str]) -> float:
    try:
        value = float(env.get(ENV_PROGRESS, "") or DEFAULT_PROGRESS)
    except ValueError:
        return DEFAULT_PROGRESS
    return value if value > 0 else DEFAULT_PROGRESS


def child_env(env: Mapping[str, str], lock_dir: str, held_entry: str | None) -> dict[str, str]:
    """The caller's environment plus what nested calls need to join our lock domain."""
    out = dict(env)
    out[ENV_CLI] = SHIM
    out["LOCAL_MUTEX_LOCK_DIR"] = lock_dir
    out[ENV_PYTHON] = sys.executable
    if held_entry is not None:
        out[nesting.ENV_HELD] = nesting.extend(env, held_entry)
    return out


def run_locked(
    command: str,
    name: str | bytes,
    *,
    lock_dir: str | None = None,
    wait: float | None = None,
    timeout: float | None = None,
    kill_after: float = 5.0,
    shared: bool = False,
    slots: int | None = None,
    reentrant: bool = False,
    allow_other_owner: bool | None = None,
    env: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
    stdin_devnull: bool = False,
) -> RunResult:
    """Run ``/bin/sh -c command`` while holding the named lock; see ``run`` for the rules."""
    env = os.environ if env is None else env
    validate_command(command)
    if slots is not None and (slots < 1 or shared):
        raise NestingError("--slots needs a count of at least 1 and cannot be --shared")
    target = Target(name, lock_dir, allow_other_owner, env)
    result = RunResult(target.path)

    def launch(extra_env: dict[str, str], waited: float, fd: int | None) -> RunResult:
        with SignalsHeld():
            outcome = supervise(
                command,
                extra_env,
                timeout=timeout,
                kill_after=kill_after,
                stdin_devnull=stdin_devnull,
            )
            if fd is not None and not shared:
                record.clear_record(fd)
            target.close()
            return _finish(result, outcome, target, waited, reporter, timeout)

    try:
        enclosing = nesting.enclosing_hold(env, target.dev, target.ino)
        if enclosing is None and reentrant and not kernel.try_lock(target.fd, shared=shared):
            enclosing = _our_hold(target, env)
        if enclosing is not None:
            pid, mode = enclosing
            if mode == "s" and not shared:
                raise NestingError(
                    f"lock {target.label} is held shared by enclosing pid {pid}; an exclusive "
                    "lock inside it would wait for itself forever"
                )
            target.close()
            if reporter is not None:
                reporter.reentrant(target.label, pid)
            result.reentrant = True
            return launch(child_env(env, target.lock_dir, None), 0.0, None)

        if slots is not None:
            from .slots import take_slot

            slot, result.waited = take_slot(
                target.label,
                target.path,
                slots,
                wait=wait,
                allow_other_owner=bool(allow_other_owner),
                reporter=reporter,
            )
            target.close()
            target.fd, target.path, target.dev, target.ino = slot.fd, slot.path, slot.dev, slot.ino
            result.lock_file = slot.path
            extra: dict[str, Any] | None = {"slot": slot.index}
        else:
            result.waited = acquire(
                target,
                shared=shared,
                wait=wait,
                reporter=reporter,
                progress=_progress_interval(env) if reporter is not None else None,
            )
            extra = None
        result.acquired = True
        if not shared:
            record.write_record(
                target.fd,
                record.make_record(target.label, command, shared=False, env=env, extra=extra),
            )
        entry = nesting.entry(os.getpid(), target.dev, target.ino, shared)
        return launch(child_env(env, target.lock_dir, entry), result.waited, target.fd)
    finally:
        target.close()


def _our_hold(target: Target, env: Mapping[str, str]) -> tuple[int, str] | None:
    """(pid, "x") when the busy lock is a ``hold`` of this very job (or our token)."""
    from .holds import ENV_TOKEN, owned

    rec = record.read_record(target.path)
    if rec is not None and owned(rec, env, env.get(ENV_TOKEN)):
        return int(rec.get("pid") or 0), "x"
    return None


def _finish(
    result: RunResult,
    outcome: Outcome,
    target: Target,
    waited: float,
    reporter: Reporter | None,
    timeout: float | None,
) -> RunResult:
    result.status = outcome.status
    result.timed_out = outcome.timed_out
    result.signalled = bool(outcome.signals)
    result.held = time.monotonic() - outcome.started
    if reporter is not None:
        if outcome.timed_out and timeout is not None:
            reporter.timed_out(target.label, timeout, outcome.kill_sent)
        if outcome.gave_up:
            reporter.gave_up_on_group(target.label)
        if result.reentrant:
            reporter.reentrant_done(target.label, result.held, result.status)
        else:
            reporter.released(target.label, waited, result.held, result.status)
    return result


def run(
    command: str,
    name: str | bytes,
    *,
    lock_dir: str | None = None,
    wait: float | None = None,
    timeout: float | None = None,
    kill_after: float = 5.0,
    shared: bool = False,
    allow_other_owner: bool | None = None,
    env: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
) -> int:
    """Run ``/bin/sh -c command`` under the lock ``name`` and return its exit status.

    ``wait``: seconds to wait for the lock (None: forever, 0: fail at once); on expiry
    ``NotAcquired`` is raised and the command does not run. ``timeout``: run ceiling from
    the command's start; on expiry the command's process group gets SIGTERM, then SIGKILL
    ``kill_after`` seconds later, and the status is 124 or 137. A command killed by signal
    N gives 128+N. ``shared`` takes a reader lock. Nothing is printed unless a
    ``reporter`` is given. Must be called from the main thread (signals drive it).
    """
    return run_locked(
        command,
        name,
        lock_dir=lock_dir,
        wait=wait,
        timeout=timeout,
        kill_after=kill_after,
        shared=shared,
        allow_other_owner=allow_other_owner,
        env=env,
        reporter=reporter,
    ).status
