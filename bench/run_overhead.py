"""Uncontended run cost and lock handoff gap, as ratios against baselines from this run.

    python bench/run_overhead.py [--runs N]

Baselines: the same interpreter running ``-c pass``, and flock(1) running ``sh -c true``
on a lock file. Targets: uncontended run <= 2.0x the bare interpreter, handoff <= 25 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_mutex.lifecycle import SHIM
from timing import clean_env, cli, compile_package, median_seconds


def handoff_gaps(lock_dir: str, waiters: int, env: dict[str, str]) -> list[float]:
    """Start ``waiters`` callers at once; gap = one holder's end to the next one's start."""
    log = Path(lock_dir) / "handoff.log"
    cmd = f'echo "s $(date +%s%N)" >> {log}; sleep 0.02; echo "e $(date +%s%N)" >> {log}'
    procs = [
        subprocess.Popen([*cli(), "handoff", cmd, lock_dir], env=env, stderr=subprocess.DEVNULL)
        for _ in range(waiters)
    ]
    for p in procs:
        p.wait()
    stamps = [(kind, int(ns)) for kind, ns in (ln.split() for ln in log.read_text().splitlines())]
    return [
        (stamps[i + 1][1] - stamps[i][1]) / 1e9
        for i in range(1, len(stamps) - 1, 2)
        if stamps[i][0] == "e"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--waiters", type=int, default=20)
    args = parser.parse_args()
    env = clean_env()
    compile_package()

    with tempfile.TemporaryDirectory() as lock_dir:
        lock_file = os.path.join(lock_dir, "bare.lock")
        python = median_seconds([sys.executable, "-c", "pass"], args.runs, env)
        ours = median_seconds([*cli(), "bench", "true", lock_dir], args.runs, env)
        shim = median_seconds(
            ["sh", SHIM, "bench", "true", lock_dir],
            args.runs,
            {**env, "LOCAL_MUTEX_PYTHON": sys.executable},
        )
        print(f"python3 -c pass               median {python * 1000:7.1f} ms   1.00x")
        print(
            f"local-mutex NAME true         median {ours * 1000:7.1f} ms   "
            f"{ours / python:.2f}x python (target <= 2.0x)"
        )
        print(
            f'sh "$LOCAL_MUTEX_CLI" NAME true median {shim * 1000:7.1f} ms   '
            f"{shim / python:.2f}x python (the nested-call path)"
        )
        if shutil.which("flock"):
            bare = median_seconds(
                ["flock", "-o", "-x", lock_file, "sh", "-c", "true"], args.runs, env
            )
            print(
                f"flock -o -x FILE sh -c true   median {bare * 1000:7.1f} ms   "
                f"{ours / bare:.2f}x is local-mutex over it"
            )
        gaps = handoff_gaps(lock_dir, args.waiters, env)
        print(
            f"handoff gap, {args.waiters} queued waiters  median "
            f"{statistics.median(gaps) * 1000:7.1f} ms   max {max(gaps) * 1000:.1f} ms "
            f"(target median <= 25 ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
