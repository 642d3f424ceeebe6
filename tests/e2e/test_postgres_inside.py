"""Runs inside a PostgreSQL hold (``run --reentrant`` with the hold's token) against a real
server: whatever ends the hold -- ``release``, its TTL -- waits until they have ended, so
nobody else holds the lock while their commands run. Real CLI processes; the tests wait on
marker files, output lines and ``pg_locks``, never on fixed sleeps."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import wait_for
from helpers.pgserver import PASSWORD, PgServer, served
from local_mutex.backends.postgres.keys import inside_key, name_key

pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")

pytestmark = pytest.mark.timeout(90)

CLI = [sys.executable, "-m", "local_mutex"]


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    yield from served()


class Job:
    """A hold taken through the CLI, and the environment of its job (its token)."""

    def __init__(self, pg: PgServer, tmp: Path, name: str, *hold_args: str) -> None:
        self.pg, self.tmp, self.name = pg, tmp, name
        self.env = {k: v for k, v in pg.env().items() if not k.startswith(("LOCAL_", "GITHUB_"))}
        held = self.cli("hold", *hold_args, name)
        assert held.returncode == 0, held.stderr
        self.job = {**self.env, "LOCAL_MUTEX_HOLD_TOKEN": held.stdout.strip()}
        self.procs: list[subprocess.Popen[bytes]] = []

    def cli(self, *args: str, job: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, args[0], "--remote", self.pg.url, *args[1:]],
            env=self.job if job else self.env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    def spawn(self, tag: str, *args: str, job: bool = True) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{tag}.err", "wb") as err:
            proc = subprocess.Popen(
                [*CLI, args[0], "--remote", self.pg.url, *args[1:]],
                env=self.job if job else self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        self.procs.append(proc)
        return proc

    def err(self, tag: str) -> str:
        return (self.tmp / f"{tag}.err").read_text()

    def inside(self, tag: str) -> subprocess.Popen[bytes]:
        """A run inside the hold that logs its start and end, and ends once ``<tag>.go``
        exists."""
        go, log = self.tmp / f"{tag}.go", self.tmp / "log"
        cmd = (
            f"echo '{tag} start' >> {log}; touch {self.tmp}/{tag}.started; "
            f"while [ ! -e {go} ]; do sleep 0.02; done; echo '{tag} end' >> {log}"
        )
        proc = self.spawn(tag, "run", "--reentrant", self.name, cmd)
        wait_for(self.tmp / f"{tag}.started", what=f"{tag} to start inside the hold")
        # Not taken like anyone's lock (a hold that ended first): a clear failure at once.
        assert "running inside it" in self.err(tag), self.err(tag)
        return proc

    def log(self) -> list[str]:
        path = self.tmp / "log"
        return path.read_text().splitlines() if path.exists() else []

    def advisory(self, key: int) -> list[tuple[int, bool]]:
        """(server pid, granted) of every session interested in ``key``."""
        rows = self.pg.psql(
            "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            f"AND (classid::bigint << 32) | objid::bigint = {key}"
        )
        return [(int(p), g == "True") for p, g in (r.split("|") for r in rows.splitlines() if r)]

    def ending(self) -> bool:
        """Is something ending the hold (its holder at its TTL, a release) waiting for the
        runs inside? It queues for the inside key."""
        return any(not granted for _, granted in self.advisory(inside_key(self.name.encode())))

    def releasing(self) -> subprocess.Popen[bytes]:
        """A release of the hold that waits for the runs inside (and says so)."""
        release = self.spawn("release", "release", self.name)
        wait_for(lambda: "waiting for the runs inside" in self.err("release"), what="a release")
        return release

    def outlasts(self, run: subprocess.Popen[bytes]) -> None:
        """While the hold is being ended, it is held (a contender is refused) until the run
        inside -- ``inside("a")`` -- is let go and ends; then it ends too."""
        assert self.held()
        assert self.cli("run", "--no-wait", self.name, "true").returncode == 75
        (self.tmp / "a.go").touch()
        assert run.wait(timeout=30) == 0, self.err("a")
        wait_for(lambda: not self.held(), what="the hold to end after the run inside")

    def held(self) -> bool:
        return any(granted for _, granted in self.advisory(name_key(self.name.encode())))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.cli("release", "--force", self.name)


@pytest.fixture
def job(pg: PgServer, tmp_path: Path) -> Iterator[Callable[..., Job]]:
    made: list[Job] = []

    def make(name: str, *hold_args: str) -> Job:
        made.append(Job(pg, tmp_path, name, *hold_args))
        return made[-1]

    yield make
    for j in made:
        j.close()


def test_release_waits_until_the_run_inside_has_ended(job: Callable[..., Job]) -> None:
    """Nobody else holds the lock while a command inside the hold runs: the release says it
    waits, a contender is still refused, and a queued one runs only after the command."""
    j = job("inside-release")
    first = j.inside("a")
    release = j.releasing()
    assert release.poll() is None and j.held()
    busy = j.cli("run", "--no-wait", j.name, "true")
    assert busy.returncode == 75, busy.stderr
    queued = j.spawn("queued", "run", j.name, f"echo queued >> {j.tmp}/log", job=False)
    wait_for(lambda: "waiting for lock" in j.err("queued"), what="the contender to queue")
    (j.tmp / "a.go").touch()
    assert first.wait(timeout=30) == 0, j.err("a")
    assert release.wait(timeout=30) == 0, j.err("release")
    assert queued.wait(timeout=30) == 0, j.err("queued")
    assert j.log() == ["a start", "a end", "queued"]
    assert "running inside it" in j.err("a")
    assert f"released {j.name}" in j.err("release")


def test_a_hold_past_its_ttl_outlasts_the_run_inside(job: Callable[..., Job]) -> None:
    """The TTL ends the hold only once the run inside it has ended."""
    j = job("inside-ttl", "--ttl", "3")
    first = j.inside("a")
    wait_for(j.ending, what="the holder to reach its TTL")
    j.outlasts(first)


def test_a_run_joining_a_hold_that_is_being_ended_queues_behind_it(job: Callable[..., Job]) -> None:
    """A run of the job that comes while the release waits does not run inside a hold
    that is ending: it says so, waits its turn, and takes the lock as anyone would."""
    j = job("inside-late")
    first = j.inside("a")
    release = j.releasing()
    late = j.spawn("late", "run", "--reentrant", j.name, f"echo late >> {j.tmp}/log")
    wait_for(lambda: "is being ended" in j.err("late"), what="the late run to wait its turn")
    (j.tmp / "a.go").touch()
    assert first.wait(timeout=30) == 0, j.err("a")
    assert release.wait(timeout=30) == 0, j.err("release")
    assert late.wait(timeout=30) == 0, j.err("late")
    assert j.log() == ["a start", "a end", "late"]
    assert "running inside it" not in j.err("late")


def test_a_run_that_waited_for_a_release_that_was_stopped_runs_inside(
    job: Callable[..., Job],
) -> None:
    """The release a late run waited for is stopped with Ctrl-C: the hold stays, and the
    run goes inside it then, not behind it (where it would wait for its own hold)."""
    j = job("inside-cancelled")
    first = j.inside("a")
    release = j.releasing()
    late = j.spawn("late", "run", "--reentrant", j.name, f"echo late >> {j.tmp}/log")
    wait_for(lambda: "is being ended" in j.err("late"), what="the late run to wait its turn")
    release.send_signal(signal.SIGINT)
    assert release.wait(timeout=30) == 130, j.err("release")
    assert "the hold stays" in j.err("release")
    assert late.wait(timeout=30) == 0, j.err("late")
    assert "running inside it" in j.err("late")
    assert first.poll() is None and j.log() == ["a start", "late"]
    (j.tmp / "a.go").touch()
    assert first.wait(timeout=30) == 0, j.err("a")


def test_nested_calls_inside_a_run_inside_a_hold_that_is_ending_run_inside(
    job: Callable[..., Job],
) -> None:
    """The hold's TTL came while a run was inside; the run's command then calls
    local-mutex for the same lock, with --reentrant and without. Both run inside the
    run (its descendants), never waiting for the hold's end that waits for them."""
    j = job("inside-nested", "--ttl", "3")
    go, log = j.tmp / "a.go", j.tmp / "log"
    cmd = (
        f"touch {j.tmp}/a.started; while [ ! -e {go} ]; do sleep 0.02; done; "
        f'"$LOCAL_MUTEX_CLI" --reentrant {j.name} "echo B >> {log}" && '
        f'"$LOCAL_MUTEX_CLI" {j.name} "echo C >> {log}"'
    )
    first = j.spawn("a", "run", "--reentrant", j.name, cmd)
    wait_for(j.tmp / "a.started", what="a to start inside the hold")
    assert "running inside it" in j.err("a"), j.err("a")
    wait_for(j.ending, what="the holder to reach its TTL")
    go.touch()
    assert first.wait(timeout=30) == 0, j.err("a")
    assert j.log() == ["B", "C"]
    wait_for(lambda: not j.held(), what="the hold to end after the run inside")


def test_a_release_from_inside_a_run_inside_the_hold_is_refused(job: Callable[..., Job]) -> None:
    """It would wait for the run it is part of: refused (2), the hold as it was."""
    j = job("inside-self")
    ran = j.spawn("a", "run", "--reentrant", j.name, f'"$LOCAL_MUTEX_CLI" release {j.name}')
    assert ran.wait(timeout=30) == 2, j.err("a")
    assert "would wait for that run" in j.err("a")
    assert j.held()


def test_a_holder_told_to_stop_while_it_waits_for_the_runs_inside_waits_on(
    job: Callable[..., Job],
) -> None:
    """SIGTERM to the holder once its TTL came: it ends the hold only after the run inside
    (it did so at once, and another run started beside the command)."""
    j = job("inside-term", "--ttl", "3")
    first = j.inside("a")
    wait_for(j.ending, what="the holder to reach its TTL")
    holder = json.loads(j.cli("status", j.name, "--json").stdout)["holders"][0]["pid"]
    os.kill(holder, signal.SIGTERM)

    def pending() -> bool:  # the holder has the signal, blocked: it waits on
        status = Path(f"/proc/{holder}/status").read_text()
        shdpnd = next(line for line in status.splitlines() if line.startswith("ShdPnd:"))
        return bool(int(shdpnd.split()[1], 16) & (1 << (signal.SIGTERM - 1)))

    wait_for(pending, what="the SIGTERM to reach the holder")
    j.outlasts(first)


def test_a_run_inside_whose_session_ends_is_stopped(job: Callable[..., Job]) -> None:
    """The run's own session is watched as a lock's is: ended by the server, the command is
    stopped (69), and the hold's end no longer waits for it."""
    j = job("inside-lost")
    first = j.inside("a")
    sessions = [pid for pid, granted in j.advisory(inside_key(j.name.encode())) if granted]
    assert len(sessions) == 1
    j.pg.psql(f"SELECT pg_terminate_backend({sessions[0]})")
    assert first.wait(timeout=30) == 69, j.err("a")
    assert "lost lock" in j.err("a") and "a end" not in j.log()
    done = j.cli("release", j.name, job=True)
    assert done.returncode == 0 and "waiting for the runs inside" not in done.stderr


def test_a_stopped_release_leaves_the_hold_and_the_runs_inside(job: Callable[..., Job]) -> None:
    """Ctrl-C on a release that waits: nothing ended, nothing left queued in the server."""
    j = job("inside-stop")
    first = j.inside("a")
    release = j.releasing()
    release.send_signal(signal.SIGINT)
    assert release.wait(timeout=30) == 130, j.err("release")
    assert "stopped waiting for the runs inside the hold" in j.err("release")
    wait_for(
        lambda: len(j.advisory(inside_key(j.name.encode()))) == 1,
        what="the release's queued request to go",
    )
    assert j.held() and first.poll() is None
    (j.tmp / "a.go").touch()
    assert first.wait(timeout=30) == 0, j.err("a")
    assert j.held()  # the hold is still there: nobody ended it
    assert j.cli("release", j.name, job=True).returncode == 0


def test_a_background_leftover_of_a_run_inside_does_not_keep_the_hold(
    job: Callable[..., Job],
) -> None:
    """A command that leaves a background process (which inherited its session) ends the
    run; the run lets go of the inside key as a lock is let go of, so the release does not
    wait for the leftover."""
    j = job("inside-leftover")
    leftover = j.tmp / "leftover.pid"
    ran = j.spawn("a", "run", "--reentrant", j.name, f"sleep 120 & echo $! > {leftover}")
    assert ran.wait(timeout=30) == 0, j.err("a")
    pid = int(leftover.read_text())
    try:
        done = j.cli("release", j.name, job=True)
        assert done.returncode == 0, done.stderr
        assert "waiting for the runs inside" not in done.stderr
        assert not j.held()
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_run_inside_a_hold_whose_holder_dies_is_stopped(job: Callable[..., Job]) -> None:
    """The holder killed outright frees the lock (the server ends its session): the run
    inside notices at its next heartbeat and stops its command (69), as a lost lock's --
    and whoever takes the lock next starts only once that command is gone."""
    j = job("inside-orphan")
    log = j.tmp / "log"
    # The trap ignores a second TERM (the group's, and the top process's own, may both come).
    cmd = (
        f'trap \'trap "" TERM; echo "a stopped" >> {log}; exit 1\' TERM; '
        f"echo 'a start' >> {log}; touch {j.tmp}/a.started; while :; do sleep 0.02; done"
    )
    first = j.spawn("a", "run", "--reentrant", j.name, cmd)
    wait_for(j.tmp / "a.started", what="a to start inside the hold")
    holder = json.loads(j.cli("status", j.name, "--json").stdout)["holders"][0]["pid"]
    os.kill(holder, signal.SIGKILL)
    after = j.cli("run", "--wait", "30", j.name, f"echo next >> {log}")
    assert after.returncode == 0, after.stderr
    assert first.wait(timeout=30) == 69, j.err("a")
    assert "the hold it ran inside ended" in j.err("a")
    assert j.log() == ["a start", "a stopped", "next"]


def test_a_release_that_waited_while_the_ttl_ended_the_hold_ends_nothing_else(
    job: Callable[..., Job],
) -> None:
    """The TTL comes while a run is inside, then a release: both wait for the run. The
    holder goes first and ends the hold; the release, once through, must not end whoever
    has the lock by then (the next holder, here queued before it)."""
    j = job("inside-ttl-release", "--ttl", "3")
    first = j.inside("a")
    wait_for(j.ending, what="the holder to reach its TTL")
    nxt = j.tmp / "next"
    queued = j.spawn(
        "queued",
        "run",
        j.name,
        f"touch {nxt}.started; while [ ! -e {nxt}.go ]; do sleep 0.02; done; "
        f"echo next >> {j.tmp}/log",
        job=False,
    )
    wait_for(lambda: "waiting for lock" in j.err("queued"), what="the next holder to queue")
    release = j.releasing()
    (j.tmp / "a.go").touch()
    assert first.wait(timeout=30) == 0, j.err("a")
    wait_for(Path(f"{nxt}.started"), what="the next holder to start")
    assert release.wait(timeout=30) == 0, j.err("release")
    assert queued.poll() is None and j.held()  # the next holder runs on, untouched
    Path(f"{nxt}.go").touch()
    assert queued.wait(timeout=30) == 0, j.err("queued")
    assert j.log() == ["a start", "a end", "next"]


@contextlib.contextmanager
def _holding_inside(pg: PgServer, name: str, mode: str) -> Iterator[None]:
    """A plain session of our own holding the name's inside key, ``shared`` as a run inside
    does (a run whose hold is gone) or ``exclusive`` as the end of a hold or a taker's look."""
    psycopg = pytest.importorskip("psycopg")
    call = "pg_advisory_lock_shared" if mode == "shared" else "pg_advisory_lock"
    with psycopg.connect(pg.url, password=PASSWORD, autocommit=True) as conn:
        conn.execute(f"SELECT {call}({inside_key(name.encode())})")
        yield


def test_an_exclusive_look_at_the_inside_key_keeps_nobody_out(
    pg: PgServer, job: Callable[..., Job]
) -> None:
    """Only a shared holder of the inside key is a run inside: another taker's look, or
    the tail of a release, holds it exclusively for a moment and must not make a
    --no-wait run fail (it did, at random, between concurrent shared runs)."""
    j = job("inside-look")
    assert j.cli("release", j.name, job=True).returncode == 0
    with _holding_inside(pg, j.name, "exclusive"):
        ran = j.cli("run", "--no-wait", j.name, "true")
    assert ran.returncode == 0, ran.stderr


def test_a_stray_run_inside_keeps_the_next_taker_within_its_wait(
    pg: PgServer, job: Callable[..., Job]
) -> None:
    """A session still holding the inside key shared (a run inside a hold whose holder was
    killed): the next taker says why it waits, and gives up by its --wait."""
    j = job("inside-stray")
    assert j.cli("release", j.name, job=True).returncode == 0
    with _holding_inside(pg, j.name, "shared"):
        refused = j.cli("run", "--no-wait", j.name, "true")
        started = time.monotonic()
        waited = j.cli("run", "--wait", "1", j.name, "true")
        took = time.monotonic() - started
    assert refused.returncode == 75, refused.stderr
    assert waited.returncode == 75, waited.stderr
    assert "whose holder was killed" in waited.stderr
    assert took < 1 + 5  # the ceiling, and an interpreter's start on a busy machine
    assert j.cli("run", "--no-wait", j.name, "true").returncode == 0


def test_a_hold_that_waited_for_its_lock_still_outlasts_the_run_inside_at_its_ttl(
    pg: PgServer, job: Callable[..., Job]
) -> None:
    """A hold's --wait is its session's lock_timeout while it waits for the lock: that
    ceiling must not bound its wait for the runs inside at its TTL (the hold ended once it
    ran out, and the run inside was stopped, 69)."""
    psycopg = pytest.importorskip("psycopg")
    name = "inside-waited"
    key = name_key(name.encode())
    with psycopg.connect(pg.url, password=PASSWORD, autocommit=True) as blocker:
        blocker.execute(f"SELECT pg_advisory_lock({key})")

        def let_go_once_waited_for() -> None:
            query = (
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                f"AND (classid::bigint << 32) | objid::bigint = {key}"
            )
            with psycopg.connect(pg.url, password=PASSWORD, autocommit=True) as look:
                wait_for(lambda: look.execute(query).fetchone()[0] > 0, what="the hold to wait")
            blocker.execute(f"SELECT pg_advisory_unlock({key})")

        freer = threading.Thread(target=let_go_once_waited_for)
        freer.start()
        j = job(name, "--wait", "3", "--ttl", "3")  # takes it once the blocker lets go
        freer.join()
    first = j.inside("a")
    wait_for(j.ending, what="the holder to reach its TTL")
    until = time.monotonic() + 3.5  # past any ceiling the hold's --wait 3 could have left
    while time.monotonic() < until:
        assert j.held() and first.poll() is None, j.err("a")
        time.sleep(0.2)
    (j.tmp / "a.go").touch()
    assert first.wait(timeout=30) == 0, j.err("a")
    wait_for(lambda: not j.held(), what="the hold to end after the run inside")


def test_two_sigterms_to_a_holder_do_not_cut_its_wait_short(job: Callable[..., Job]) -> None:
    """Back to back, the second SIGTERM came before the holder's wait for the runs inside
    blocked it, and ended the hold at once (2 runs in 4)."""
    j = job("inside-twice")
    first = j.inside("a")
    holder = json.loads(j.cli("status", j.name, "--json").stdout)["holders"][0]["pid"]
    os.kill(holder, signal.SIGTERM)
    os.kill(holder, signal.SIGTERM)
    wait_for(j.ending, what="the holder to wait for the run inside")
    j.outlasts(first)


def test_a_run_waiting_for_its_hold_to_end_keeps_to_its_wait(job: Callable[..., Job]) -> None:
    """Its turn at the hold being ended is part of its --wait: it gives up by then (it
    waited again, the whole --wait, for the lock itself)."""
    j = job("inside-ceiling")
    first = j.inside("a")
    release = j.releasing()
    started = time.monotonic()
    late = j.cli("run", "--reentrant", "--wait", "4", j.name, "true", job=True)
    took = time.monotonic() - started
    assert late.returncode == 75, late.stderr
    assert "is being ended" in late.stderr
    # Which of the two waits ran out says it (seen once under heavy load: the lock's own).
    assert "not acquired within --wait 4" in late.stderr or "after waiting" in late.stderr
    assert took < 4 + 3, took  # the ceiling, and a slack for a busy machine (was 8 and more)
    (j.tmp / "a.go").touch()
    assert first.wait(timeout=30) == 0, j.err("a")
    assert release.wait(timeout=30) == 0, j.err("release")


def test_status_and_list_name_the_runs_inside_a_hold(job: Callable[..., Job]) -> None:
    """The runs inside a hold hold the lock with it: ``status`` names them beside the hold,
    and ``list`` shows the lock once."""
    j = job("inside-status")
    first = j.inside("a")
    status = json.loads(j.cli("status", j.name, "--json").stdout)
    modes = sorted(h["mode"] for h in status["holders"])
    assert status["state"] == "held" and modes == ["exclusive", "shared"], status
    assert first.pid in [h["pid"] for h in status["holders"]]
    listed = json.loads(j.cli("list", "--json").stdout)
    assert [lock["name"] for lock in listed] == [j.name], listed
    (j.tmp / "a.go").touch()
    assert first.wait(timeout=30) == 0, j.err("a")


def test_a_killed_holders_run_inside_still_shows_as_holding_the_lock(
    job: Callable[..., Job],
) -> None:
    """The holder killed outright, the lock is free on the server, yet the next taker
    waits for the run still inside (its command deaf to TERM): ``status`` says it is held,
    by that run, not free."""
    j = job("inside-status-orphan")
    pidfile = j.tmp / "command.pid"
    cmd = f"trap '' TERM; echo $$ > {pidfile}; while :; do sleep 0.05; done"
    run = j.spawn("a", "run", "--reentrant", "--kill-after", "30", j.name, cmd)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", what="the run")
    command = int(pidfile.read_text())
    holder = json.loads(j.cli("status", j.name, "--json").stdout)["holders"][0]["pid"]
    try:
        os.kill(holder, signal.SIGKILL)
        wait_for(lambda: not j.held(), what="the server to end the holder's session")
        status = json.loads(j.cli("status", j.name, "--json").stdout)
        assert status["state"] == "held", status
        assert [h["pid"] for h in status["holders"]] == [run.pid], status
        assert j.cli("run", "--no-wait", j.name, "true").returncode == 75
    finally:
        os.kill(command, signal.SIGKILL)
    assert run.wait(timeout=30) in (69, 137), j.err("a")
    assert j.cli("run", "--no-wait", j.name, "true").returncode == 0


def test_of_two_releases_waiting_for_the_runs_inside_one_ends_the_hold(
    job: Callable[..., Job],
) -> None:
    """Both wait; the first through ends the hold, the second finds it gone and says it
    ended nothing (both said "released")."""
    j = job("inside-two-releases")
    first = j.inside("a")
    one = j.releasing()
    other = j.spawn("other", "release", j.name)
    wait_for(lambda: "waiting for the runs inside" in j.err("other"), what="a second release")
    (j.tmp / "a.go").touch()
    assert first.wait(timeout=30) == 0, j.err("a")
    assert one.wait(timeout=30) == 0 and other.wait(timeout=30) == 0
    said = [f"released {j.name}" in j.err(tag) for tag in ("release", "other")]
    assert sorted(said) == [False, True], (j.err("release"), j.err("other"))
    assert not j.held()


def test_a_release_that_may_not_end_the_hold_is_refused_before_any_wait(
    job: Callable[..., Job], pg: PgServer
) -> None:
    """A role that cannot end the holder's session (a superuser's, here) is told so at
    once (77): it does not queue behind the runs inside first, holding them up."""
    j = job("unending")
    run = j.inside("a")
    pg.psql("DROP ROLE IF EXISTS lm_weak")
    pg.psql("CREATE ROLE lm_weak LOGIN PASSWORD 'weak' IN ROLE pg_read_all_stats")
    r = subprocess.run(
        [
            *CLI,
            "release",
            "--remote",
            pg.url.replace("postgres@", "lm_weak@"),
            "--force",
            "unending",
        ],
        env={**j.env, "PGPASSWORD": "weak"},
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 77, r.stderr
    assert "pg_signal_backend" in r.stderr and "waiting" not in r.stderr, r.stderr
    assert not j.ending() and j.held() and run.poll() is None
    (j.tmp / "a.go").touch()
    assert run.wait(timeout=30) == 0, j.err("a")
    assert j.held()  # nothing was ended
