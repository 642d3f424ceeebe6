"""The PostgreSQL backend against a server that hangs: its postmaster and every backend
stopped with SIGSTOP (``PgServer.frozen``), so the kernel still accepts connections and
ACKs what we send, but nothing answers. A server of its own, so the freezes touch no other
test. Ceilings here are behaviours (``--wait``, the heartbeat deadline, the bounded
release), asserted with generous margins; the server is always resumed in a ``finally``.
Where the hang must start at one statement, a ``GatedProxy`` holds that statement back
until the server is frozen.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import wait_for
from helpers.pgserver import GatedProxy, PgServer, served

pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")

from local_mutex.backends import Take
from local_mutex.backends.postgres.backend import PostgresBackend
from local_mutex.backends.postgres.keys import name_key
from local_mutex.errors import Unavailable

pytestmark = pytest.mark.timeout(90)

CLI = [sys.executable, "-m", "local_mutex"]
MARGIN = 4.0  # on top of a ceiling: a loaded machine, interpreter start-up
READ = 10.0  # the backend's bound on one statement of status, list, release (READ_SECONDS)


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    yield from served()


def _env(pg: PgServer, drop: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in pg.env().items() if not k.startswith(("LOCAL_MUTEX_", "GITHUB_"))}
    if drop is not None:
        env["LOCAL_MUTEX_PG_DROP_SECONDS"] = str(drop)
    return env


def _spawn(pg: PgServer, err: Path, *args: str, drop: int | None = None) -> subprocess.Popen[bytes]:
    with open(err, "wb") as f:
        return subprocess.Popen(
            [*CLI, *args],
            env=_env(pg, drop),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=f,
        )


def _locks(pg: PgServer, key: int) -> list[bool]:
    """``granted`` of every session interested in ``key``."""
    rows = pg.psql(
        "SELECT granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
        f"AND (classid::bigint << 32) | objid::bigint = {key}"
    )
    return sorted((r == "True" for r in rows.splitlines() if r), reverse=True)


def _holding(tmp: Path) -> str:
    """A command that says it started, then runs until told to go."""
    return f"touch {tmp}/started; while [ ! -e {tmp}/go ]; do sleep 0.02; done; exit 3"


def _ended_within(proc: subprocess.Popen[bytes], seconds: float) -> tuple[int, float]:
    """(exit status, seconds it took) -- failing, not hanging, if it takes longer."""
    start = time.monotonic()
    try:
        code = proc.wait(seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after {seconds:.1f}s") from None
    return code, time.monotonic() - start


def test_wait_is_a_ceiling_while_the_server_hangs(pg: PgServer, tmp_path: Path) -> None:
    """A waiter queued with --wait gives up by its ceiling (75), one that cannot even
    connect by its ceiling too (69: unreachable); neither leaves anything behind."""
    key = name_key(b"hung-wait")
    holder = _spawn(pg, tmp_path / "h.err", "--remote", pg.url, "hung-wait", _holding(tmp_path))
    try:
        wait_for(tmp_path / "started", 20, "the holder's command")
        queued_at = time.monotonic()
        queued = _spawn(
            pg, tmp_path / "q.err", "--remote", pg.url, "--wait", "3", "hung-wait", "true"
        )
        wait_for(lambda: _locks(pg, key) == [True, False], 20, "the waiter queued")
        with pg.frozen():
            late_at = time.monotonic()
            late = _spawn(
                pg, tmp_path / "l.err", "--remote", pg.url, "--wait", "3", "hung-wait", "true"
            )
            code, _ = _ended_within(queued, 3 + MARGIN)
            assert code == 75, (tmp_path / "q.err").read_text()
            assert time.monotonic() - queued_at < 3 + MARGIN
            code, _ = _ended_within(late, 3 + MARGIN)
            took = time.monotonic() - late_at
            assert took < 3 + MARGIN
            assert code == 69, (tmp_path / "l.err").read_text()
            print(
                f"queued waiter gave up after {time.monotonic() - queued_at:.1f}s, late {took:.1f}s"
            )
        assert "not acquired after waiting" in (tmp_path / "q.err").read_text()
        assert "cannot reach" in (tmp_path / "l.err").read_text()
        # Resumed: the waiters' sessions end, the holder keeps its lock.
        wait_for(lambda: _locks(pg, key) == [True], 20, "nothing left of the waiters")
        (tmp_path / "go").touch()
        assert holder.wait(20) == 3
    finally:
        (tmp_path / "go").touch()
        holder.wait(20)


def test_release_gives_up_on_a_hung_server_and_keeps_the_status(
    pg: PgServer, tmp_path: Path
) -> None:
    """The command ends while the server hangs: the wrapper does not wait for the server
    (the unlock gives up after the heartbeat deadline, 3 s with a drop bound of 12), warns,
    keeps the command's status, and the server frees the lock once it runs again."""
    key = name_key(b"hung-release")
    err = tmp_path / "w.err"
    wrapper = _spawn(pg, err, "--remote", pg.url, "hung-release", _holding(tmp_path), drop=12)
    try:
        wait_for(tmp_path / "started", 20, "the command")
        with pg.frozen():
            (tmp_path / "go").touch()
            code, took = _ended_within(wrapper, 3 + MARGIN)
            print(f"the wrapper ended {took:.1f}s after the command was told to end")
            text = err.read_text()
            assert code == 3, text
            assert "could not release hung-release cleanly" in text, text
            assert "lost lock" not in text, text
        wait_for(lambda: _locks(pg, key) == [], 20, "the lock freed once the server ran again")
    finally:
        (tmp_path / "go").touch()
        if wrapper.poll() is None:
            wrapper.kill()
        wrapper.wait(20)


def test_heartbeat_deadline_stops_the_command_while_the_server_hangs(
    pg: PgServer, tmp_path: Path
) -> None:
    """README: "a heartbeat unanswered within the deadline" stops the command (69) -- also
    when the server process hangs (the kernel ACKs, so no TCP timeout fires). Drop bound 6:
    a heartbeat every 1 s, deadline 1.5 s. The lock is freed only after the command."""
    key = name_key(b"hung-beat")
    pidfile = tmp_path / "pid"
    err = tmp_path / "w.err"
    cmd = f"echo $$ > {pidfile}; while [ ! -e {tmp_path}/go ]; do sleep 0.02; done"
    wrapper = _spawn(pg, err, "--remote", pg.url, "--kill-after", "1", "hung-beat", cmd, drop=6)
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "command")
        command = int(pidfile.read_text())
        with pg.frozen():
            code, took = _ended_within(wrapper, 1 + 1.5 + 1 + MARGIN)
            print(f"the command was stopped {took:.1f}s into the hang")
            text = err.read_text()
            assert code == 69, text
            assert "lost lock hung-beat" in text and "did not answer a heartbeat" in text, text
            assert not Path(f"/proc/{command}").exists()
        wait_for(lambda: _locks(pg, key) == [], 20, "the lock freed once the server ran again")
    finally:
        (tmp_path / "go").touch()
        if wrapper.poll() is None:
            wrapper.kill()
        wrapper.wait(20)


def test_release_run_status_and_list_give_up_on_a_server_that_hangs_midway(
    pg: PgServer, tmp_path: Path
) -> None:
    """The server stops once each client is connected and has sent the statement this is
    about: ``release`` (with its token, and with --force) its pg_terminate_backend, a
    ``--reentrant`` run its look for a hold of this job, ``status`` and ``list`` their
    pg_locks read. Each gives up within the read bound: 69 (unavailable), or 3 for status
    and list (cannot tell), saying what it could not do. Proxies time the freeze. (The two
    releases end two holds: of one hold, the second release would wait for the first.)"""
    names = ("hung-end", "hung-end-2")
    tokens = []
    for name in names:
        hold = subprocess.run(
            [*CLI, "hold", "--remote", pg.url, name],
            env=_env(pg),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert hold.returncode == 0, hold.stderr
        tokens.append(hold.stdout.strip())
    token = tokens[0]
    ending = GatedProxy(pg, b"pg_terminate_backend")
    reading = GatedProxy(pg, b"FROM pg_locks")
    clients = {
        "release --token": (["release", "hung-end", "--remote", ending.url, "--token", token], 69),
        "release --force": (["release", "hung-end-2", "--remote", ending.url, "--force"], 69),
        "run --reentrant": (["--remote", reading.url, "--reentrant", "hung-end", "true"], 69),
        "status": (["status", "hung-end", "--remote", reading.url], 3),
        "list": (["list", "--remote", reading.url], 3),
    }
    errs = {what: tmp_path / f"{i}.err" for i, what in enumerate(clients)}
    procs = {what: _spawn(pg, errs[what], *args) for what, (args, _) in clients.items()}
    try:
        wait_for(lambda: (ending.held, reading.held) == (2, 3), 30, "each client at its statement")
        with pg.frozen():
            ending.open()
            reading.open()
            deadline = time.monotonic() + READ + MARGIN
            for what, proc in procs.items():
                try:
                    proc.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"{what}: still running {READ + MARGIN:g}s in") from None
            print(f"all gave up {time.monotonic() - deadline + READ + MARGIN:.1f}s into the hang")
        for what, (_, expected) in clients.items():
            text = errs[what].read_text()
            assert procs[what].returncode == expected, (what, text)
            assert "did not answer within" in text, (what, text)
            assert "Traceback" not in text, (what, text)
        assert "cannot end the hold on hung-end" in errs["release --token"].read_text()
        assert "whether a hold of this job has lock hung-end" in errs["run --reentrant"].read_text()
    finally:
        ending.close()
        reading.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(20)
        # Resumed, the server runs the terminations it was sent; end the holds if not.
        for name in names:
            if _locks(pg, name_key(name.encode())):
                subprocess.run(
                    [*CLI, "release", name, "--remote", pg.url, "--force"],
                    env=_env(pg),
                    capture_output=True,
                    timeout=30,
                )
            wait_for(lambda n=name: _locks(pg, name_key(n.encode())) == [], 20, "the hold ended")


def test_no_wait_is_a_ceiling_on_connecting_to_a_hung_server(pg: PgServer, tmp_path: Path) -> None:
    """--no-wait (1 s of grace) and --wait 0.5 against a server that accepts connections
    but never answers: the whole connection ends by the ceiling, not after libpq's floor of
    2 s per host. Measured in this process for one host (no interpreter start-up in it);
    as the CLI for an address that lists the host three times (6 s before). A
    ``--reentrant`` run's look for a hold of this job keeps to the ceiling too (10 s before)."""
    hosts = ",".join([f"127.0.0.1:{pg.port}"] * 3)
    url = f"postgresql://postgres@{hosts}/postgres"
    backend = PostgresBackend(pg.url, env=_env(pg))
    with pg.frozen():
        started = time.monotonic()
        clis = {
            "--no-wait": _spawn(pg, tmp_path / "n.err", "--remote", url, "--no-wait", "c", "true"),
            "--wait 0.5": _spawn(
                pg, tmp_path / "w.err", "--remote", url, "--wait", "0.5", "c", "true"
            ),
            # Its look for a hold of this job is bounded by the same ceiling.
            "--reentrant --no-wait": _spawn(
                pg, tmp_path / "r.err", "--remote", url, "--reentrant", "--no-wait", "c", "true"
            ),
        }
        try:
            at = time.monotonic()
            with pytest.raises(Unavailable, match=r"cannot reach .*timeout expired") as caught:
                backend.lock(b"hung-connect").acquire(Take(wait=0))
            took = time.monotonic() - at
            assert caught.value.exit_code == 69
            assert took < 1.9, f"--no-wait gave up connecting after {took:.2f}s"
            for what, proc in clis.items():
                code, _ = _ended_within(proc, max(started + 1.5 + 3 - time.monotonic(), 0.1))
                text = (tmp_path / f"{what.split()[0].strip('-')[0]}.err").read_text()  # n/w/r
                assert code == 69 and "cannot reach" in text, (what, text)
            print(f"in process {took:.2f}s; the CLIs {time.monotonic() - started:.1f}s")
        finally:
            backend.close()
            for proc in clis.values():
                if proc.poll() is None:
                    proc.kill()
                proc.wait(20)


def test_status_and_list_keep_their_bound_whatever_connect_timeout_says(
    pg: PgServer, tmp_path: Path
) -> None:
    """status and list give up within their 10 s on a server that hangs, even when the URL
    turns libpq's connect timeout off (``connect_timeout=0``: they hung for good) or
    PGCONNECT_TIMEOUT sets a longer one (30 s before)."""
    cases = [
        (["status", "--remote", f"{pg.url}?connect_timeout=0", "x"], {}),
        (["list", "--remote", pg.url], {"PGCONNECT_TIMEOUT": "30"}),
    ]
    with pg.frozen():
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                [*CLI, *args],
                env={**_env(pg), **extra},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for args, extra in cases
        ]
        try:
            for proc in procs:
                code, _ = _ended_within(proc, max(started + READ + MARGIN - time.monotonic(), 0.1))
                assert code == 3
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(20)
