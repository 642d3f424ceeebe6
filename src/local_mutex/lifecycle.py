"""The one lifecycle of a lock: validate -> acquire (announcing the wait) -> record ->
supervise -> release -> report.

``run_locked`` serves ``run``, ``each``, the action and the Python ``run``; ``held.Held`` (the
same steps without a command) serves ``with hold(...)`` and ``hold``'s holder process.
Backends differ only behind the ``Lock`` protocol (``backends/base.py``); processes only
behind ``supervise``. Nothing here prints except through the ``Reporter`` it is given.
"""

from __future__ import annotations

import _thread
import os
import sys
import time

from ._proc import USE_PROC, running
from .backends import Take
from .errors import (
    EnclosedWhileWaiting,
    LocalMutexError,
    LockLost,
    NestingError,
    NotAcquired,
    Unavailable,
)
from .identity import ENV_TOKEN, holder_record, job_identity, stamped_now
from .names import name_bytes
from .runspec import Command, Options, RunResult
from .supervise.hooks import session_of
from .supervise.keeper import SignalsHeld, Spec, supervise
from .ui.lines import progress_interval

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from .backends.base import Backend, Lock
    from .supervise.keeper import Outcome
    from .ui.lines import Reporter

ENV_CLI = "LOCAL_MUTEX_CLI"
ENV_PYTHON = "LOCAL_MUTEX_PYTHON"
# What LOCAL_MUTEX_CLI points at: nested calls run the same CLI with the same interpreter.
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local-mutex.sh")
# Beyond the TERM -> KILL grace: what stopping a command may take (a lease must outlast it).
STOP_MARGIN = 2.0

# Locks ``Held`` in this process: (backend kind, lock file, thread) -> (mode, lock). A ``run``
# of one inside the block runs within it; the held lock names itself to its command's calls.
_held_here: dict[tuple[str, str, bool, int], tuple[str, Lock]] = {}
# A child forked inside a block holds nothing itself (its thread has the parent's thread id):
# a run there takes the lock as any other process's would.
os.register_at_fork(after_in_child=_held_here.clear)


def command_env(lock: Lock, env: Mapping[str, str], held: bool) -> dict[str, str]:
    """The command's environment: the caller's, the lock domain's, and the CLI shim."""
    out = lock.child_env(env, held)
    out[ENV_CLI] = SHIM
    out[ENV_PYTHON] = sys.executable
    return out


def _here_key(backend: Backend, lock: Lock, slots: int | None) -> tuple[str, str, bool, int]:
    # One file however its dir is spelled (``d//``, a symlink); a name's slots apart.
    where = os.path.realpath(lock.lock_file) if lock.lock_file[:1] == "/" else lock.lock_file
    return (backend.kind, where, slots is not None, _thread.get_ident())


def _enclosing(
    backend: Backend,
    lock: Lock,
    opts: Options,
    env: Mapping[str, str],
    reporter: Reporter | None = None,
) -> int | None:
    """The pid of an enclosing holder of this very lock (we run inside it), or None. With
    ``--slots`` the lock is the name's slots: a slot an ancestor holds covers us."""
    here = _held_here.get(_here_key(backend, lock, opts.slots)) if _held_here else None
    found = (os.getpid(), here[0]) if here is not None else lock.enclosing(env, opts.slots)
    if found is None and opts.reentrant:
        ours = getattr(lock, "held_by_our_hold", None)
        token = opts.token or env.get(ENV_TOKEN)
        pid = ours(env, token, opts.slots, opts.wait, reporter) if ours is not None else None
        if pid is not None and getattr(lock, "join_failed", False):
            raise NestingError(
                f"hold {pid} of lock {lock.label} did not share its lock (another user's or "
                "network namespace's, or not answering); inside it, nothing would hold it: not run"
            )
        found = None if pid is None else (pid, "x")
    return None if found is None else _inside_of(lock, opts, *found)


def _inside_of(lock: Lock, opts: Options, pid: int, held_mode: str) -> int:
    """The enclosing holder we run inside, if our mode fits in its: ``pid``."""
    if held_mode == "s" and not opts.shared:
        raise NestingError(
            f"lock {lock.label} is held shared by enclosing pid {pid}; an exclusive lock "
            "inside it would wait for itself forever"
        )
    return pid


def run_locked(
    backend: Backend,
    name: str | bytes,
    command: Command,
    opts: Options,
    *,
    env: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
    subreaper: bool = False,
    last: bool = False,
) -> RunResult:
    """Run the command while holding the named lock; see ``api.run`` for the rules.
    ``last``: this process exits right after (``SignalsHeld``)."""
    env = os.environ if env is None else env
    lock = backend.lock(name_bytes(name))
    result = RunResult(lock.lock_file)
    try:
        looked = time.monotonic()
        pid = _enclosing(backend, lock, opts, env, reporter)
        # Looking for our hold may have waited (its end, under way): part of the --wait.
        spent = time.monotonic() - looked if opts.reentrant else 0.0
        if pid is None:
            if opts.reentrant and reporter is not None and not _may_join_a_hold(opts, env):
                reporter.warning(
                    f"--reentrant runs inside a hold of this GitHub job, or the hold whose "
                    f"token is in ${ENV_TOKEN} (export it); there is neither here: "
                    f"{lock.label} is taken like anyone else would take it, after any hold of it"
                )
            try:
                return _run_holding(
                    lock, command, opts, env, reporter, result, subreaper, last, spent
                )
            except EnclosedWhileWaiting as now:  # its holder's end left it to our command
                pid = _inside_of(lock, opts, now.pid, now.mode)
        here = _held_here.get(_here_key(backend, lock, opts.slots)) if _held_here else None
        # A remote hold's run holds a key of its own (``backends.postgres.inside``): nested
        # calls of its command run inside, as under the holder's own lock.
        joined = session_of(lock) is not None
        inside = command_env(lock if here is None else here[1], env, here is not None or joined)
        # Inside this process's own hold, the command holds the hold's description: it keeps
        # the lock should we and the supervisor both die.
        holding = lock if here is None else here[1]
        return _run_inside(
            lock, pid, command, opts, inside, reporter, result, subreaper, last, holding
        )
    finally:
        lock.close()


def _run_holding(
    lock: Lock,
    command: Command,
    opts: Options,
    env: Mapping[str, str],
    reporter: Reporter | None,
    result: RunResult,
    subreaper: bool,
    last: bool,
    spent: float,
) -> RunResult:
    """Take the lock, run the command holding it, release."""
    with SignalsHeld(last) as held:
        try:
            result.waited = _take(lock, opts, env, reporter, command.text, spent=spent)
            result.acquired, result.lock_file = True, lock.lock_file
            outcome = supervise(
                _spec(command, command_env(lock, env, True), opts),
                keep_fds=lock.keep_fds(),
                lock=lock,
                reporter=reporter,
                subreaper=subreaper,
                held=held,
                then=lambda outcome: _release(lock, reporter, outcome, result),
            )
        except EnclosedWhileWaiting:  # (a stop signal meanwhile still stops us: no letting_go)
            _let_go(lock)  # what we took meanwhile (a new file at the path) is not the run's
            raise
        except BaseException:
            held.letting_go = True
            if held.command_may_run:  # our error once it may run: leave it the lock
                getattr(lock, "leave", lock.close)()
            else:
                _let_go(lock)
            raise
    _finish(result, outcome, lock.label, reporter, opts)
    return result


def _may_join_a_hold(opts: Options, env: Mapping[str, str]) -> bool:
    return bool(opts.token or env.get(ENV_TOKEN) or job_identity(env))


def _take(
    lock: Lock,
    opts: Options,
    env: Mapping[str, str],
    reporter: Reporter | None,
    command: str,
    extra: Mapping[str, Any] | None = None,
    spent: float = 0.0,
) -> float:
    """Acquire, then publish who holds it (or let go again): the seconds waited, ``spent``
    included. A ``reporter`` says we wait, and how long so far (``progress_interval``)."""
    lock.stop_grace = opts.kill_after + STOP_MARGIN
    progress = progress_interval(env, reporter) if reporter is not None else None
    wait = None if opts.wait is None else max(opts.wait - spent, 0.0)
    if opts.message:
        extra = {"message": opts.message, **(extra or {})}
    take = Take(
        shared=opts.shared, slots=opts.slots, wait=wait, reporter=reporter, progress=progress
    )
    # Who will hold it, for a lock that carries it (git: in the lock commit, no push after).
    take.record = holder_record(lock.label, command, shared=opts.shared, env=env, extra=extra)
    try:
        waited = lock.acquire(take) + spent
    except NotAcquired as exc:
        if not (opts.wait and wait == 0.0):
            raise
        # The look for our hold took all of --wait (its end was under way): say so.
        text = f"lock {lock.label} not acquired within --wait {opts.wait:g}: {exc}"
        raise NotAcquired(text, exc.holder, exc.waited + spent) from None
    holder = stamped_now(take.record)  # ``since`` is when it was taken, not asked for
    try:
        lock.write_record(holder)
    except LocalMutexError:  # (a session cut as it writes): its error, not the release's
        _let_go(lock)
        raise
    return waited


def _spec(command: Command, env: Mapping[str, str], opts: Options) -> Spec:
    return Spec(
        command.argv,
        env,
        timeout=opts.timeout,
        kill_after=opts.kill_after,
        stdin_devnull=opts.stdin_devnull,
        closed=opts.closed,
    )


def _run_inside(
    lock: Lock,
    pid: int,
    command: Command,
    opts: Options,
    child_env: Mapping[str, str],
    reporter: Reporter | None,
    result: RunResult,
    subreaper: bool,
    last: bool,
    holding: Lock,
) -> RunResult:
    """An enclosing holder has this lock: run the command within its hold. The lock stays
    open until the command is over: it may share the hold's (``backends.flock.share``).
    ``holding``: the lock whose descriptions the command keeps (``lock``, or this process's
    own hold)."""
    if reporter is not None:
        reporter.reentrant(lock.label, pid)
    result.reentrant = True
    spec = _spec(command, child_env, opts)
    # A run inside a hold tells its holder when the command is over, from the supervisor
    # too: a keeper killed alone must not leave the holder thinking it may still run.
    farewell = getattr(lock, "farewell", None)
    spec.farewell = farewell() if farewell is not None else None
    guard = lock if session_of(lock) is not None else None
    if guard is not None:
        guard.stop_grace = opts.kill_after + STOP_MARGIN
    # Through what we inherited (flock): a job the enclosing command left behind runs on
    # after that run ended and unlocked, as any leftover does -- said, not silent. Looked
    # at only once the enclosing run is gone: the nested path stays light.
    ours = getattr(lock, "held_through_us", None)
    try:
        with SignalsHeld(last) as held:
            outcome = supervise(
                spec,
                keep_fds=holding.keep_fds(),  # the hold's, if shared with us: the command's too
                # A remote hold's run holds a key of its own that the hold's end waits for
                # (``backends.postgres.inside``): watched as a lock is, lost if it ends.
                lock=guard,
                reporter=reporter,
                subreaper=subreaper,
                held=held,
            )
        let_go = ours is not None and USE_PROC and not running(pid) and not ours()
    finally:
        lock.close()
    if let_go and reporter is not None:
        reporter.warning(
            f"lock {lock.label} was let go while this command ran inside it (the run or hold "
            "it ran inside ended first, as it may for a job left behind): it ran on without "
            "the lock"
        )
    _finish(result, outcome, lock.label, reporter, opts)
    return result


def _release(lock: Lock, reporter: Reporter | None, outcome: Outcome, result: RunResult) -> None:
    """Let go; a remote that cannot be told keeps the command's status (its lease or session
    ends by itself), with a warning -- none for a lock lost already, whose error says it
    all. One found lost only now may have had another holder meanwhile: an error."""
    result.held = time.monotonic() - outcome.started  # the command's time, not the release's
    if outcome.lost is not None:
        _let_go(lock)
        return
    try:
        lock.release()
    except LockLost as exc:
        outcome.lost_at_release = exc
    except Unavailable as exc:
        if reporter is not None:
            reporter.warning(f"could not release {lock.label} cleanly: {exc}")


def _let_go(lock: Lock) -> None:
    """After a failure before the command started (a stop signal, an error of ours): a
    remote's lock outlives this process, so tell the remote. One not held is left alone."""
    try:
        lock.release()
    except LocalMutexError:
        pass  # the failure itself is what gets reported; a lease or session ends anyway


def _finish(
    result: RunResult,
    outcome: Outcome,
    label: str,
    reporter: Reporter | None,
    opts: Options,
) -> None:
    result.status = outcome.status
    result.timed_out = outcome.timed_out
    result.stop_signal = outcome.signals[0] if outcome.signals else 0
    result.lost = outcome.lost or outcome.lost_at_release
    result.held = result.held or time.monotonic() - outcome.started
    if result.lost is not None:
        result.status = result.lost.exit_code
    if reporter is None:
        return
    if outcome.timed_out and opts.timeout is not None:
        reporter.timed_out(label, opts.timeout, outcome.kill_sent)
    if outcome.gave_up:
        reporter.gave_up_on_group(label)
    if outcome.lost is not None:
        reporter.error(
            f"{outcome.lost}; the command was stopped (it exited {outcome.status}) "
            f"after {result.held:.1f}s"
        )
    elif outcome.lost_at_release is not None:
        reporter.error(
            f"{outcome.lost_at_release}: another holder may have run beside the command "
            f"(it exited {outcome.status} after {result.held:.1f}s)"
        )
    elif result.reentrant:
        reporter.reentrant_done(label, result.held, result.status)
    else:
        reporter.released(label, result.waited, result.held, result.status, stopped=outcome.stopped)
