"""Remote (git) locks against a git daemon on loopback, from one run.

    python bench/remote_overhead.py [--rounds N] [--contenders C]

Acquire+release latency (two CAS pushes and a read) vs a bare `git push` of one ref to the
same server (target <= 2x), and throughput of C contenders taking turns on one name.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers.gitserver import git_daemon
from timing import clean_env, cli, compile_package


def _bare_push(url: str, work: Path, rounds: int) -> float:
    repo = work / "baseline.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    env = {
        **clean_env(),
        "GIT_DIR": str(repo),
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@localhost",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@localhost",
    }
    tree = (
        subprocess.run(["git", "mktree"], input=b"", env=env, capture_output=True, check=True)
        .stdout.decode()
        .strip()
    )
    times = []
    for i in range(rounds):
        oid = (
            subprocess.run(
                ["git", "commit-tree", tree, "-m", f"b{i}"],
                env=env,
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .strip()
        )
        t0 = time.perf_counter()
        subprocess.run(
            ["git", "push", "-q", "--force", url, f"{oid}:refs/heads/baseline"], env=env, check=True
        )
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _lock_cycle(url: str, rounds: int) -> float:
    from local_mutex.backends import Take
    from local_mutex.backends.git.backend import GitBackend

    times = []
    backend = GitBackend(url, env=os.environ, poll=1)
    try:
        for _ in range(rounds):
            lock = backend.lock(b"bench")
            t0 = time.perf_counter()
            lock.acquire(Take(wait=0))
            lock.release()
            times.append(time.perf_counter() - t0)
    finally:
        backend.close()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--contenders", type=int, default=20)
    args = parser.parse_args()
    compile_package()
    with tempfile.TemporaryDirectory() as d, git_daemon(Path(d) / "srv") as url:
        push = _bare_push(url, Path(d), args.rounds)
        cycle = _lock_cycle(url, args.rounds)
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                [*cli(), "run", "--remote", url, "--poll", "0.1", "turns", "true"],
                env=clean_env(),
                stderr=subprocess.DEVNULL,
            )
            for _ in range(args.contenders)
        ]
        codes = [p.wait() for p in procs]
        total = time.perf_counter() - t0
    if any(codes):
        raise SystemExit(f"contenders failed: {codes}")
    print(f"bare git push of one ref        median {push * 1000:7.1f} ms   1.00x")
    print(
        f"acquire + release (in-process)  median {cycle * 1000:7.1f} ms   "
        f"{cycle / push:.2f}x the push (target <= 2x)"
    )
    print(
        f"{args.contenders} contenders taking turns     total {total:7.2f} s    "
        f"{args.contenders / total:.1f} locks/s ({os.cpu_count()} cores)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
