"""Uncontended run cost and lock handoff gap, as ratios against baselines from this run.

    python bench/run_overhead.py [--runs N]

Baselines: the same interpreter running ``-c pass``, and flock(1) running ``sh -c true``
on a lock file. Targets: uncontended run <= 1.6x the bare interpreter, with common options
<= 1.5x, the nested path (``$LOCAL_MUTEX_CLI``, started with ``-I -S``) <= 1.0x; handoff
gap <= 25 ms. The cases take turns run by run, so a busy machine weighs on all alike.

The two "floor" rows time the least any Python implementation of a supervised run must
do, started the same two ways: open and flock the lock file, fork a supervisor that
becomes a child subreaper (prctl, reached through ctypes' C half), spawns ``sh -c true``
and waits for it, wait for the supervisor, and exit without the interpreter's teardown
(a real run skips it too). What a real run costs
above its floor is ours to cut; a target below the floor cannot be met on that machine.

Each row also counts the minor page faults of one run (with all it started): a fork shares
the interpreter's pages until either side writes one, and every object Python touches is a
write (its reference count), so each module a run loads costs its pages again after the
fork; on a virtual machine a fault can cost several microseconds.
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
from timing import (
    clean_env,
    cli,
    compile_package,
    interleaved_medians,
    median_faults,
    median_seconds,
)

# The floor of a supervised run (see the module docstring): nothing but its system calls.
FLOOR = """
import _ctypes, fcntl, os, sys
prctl = _ctypes.dlsym(_ctypes.dlopen(None, 2), "prctl")
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
child = os.fork()
if child == 0:
    _ctypes.call_function(prctl, (36, 1, 0, 0, 0))  # PR_SET_CHILD_SUBREAPER
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "true"], os.environ, setpgroup=0)
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
os._exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))  # no teardown, as a real run
"""


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
        floor_file = os.path.join(lock_dir, "floor.lock")
        shim_env = {**env, "LOCAL_MUTEX_PYTHON": sys.executable}
        cases = {
            "python": ([sys.executable, "-c", "pass"], env),
            "plain": ([*cli(), "bench", "true", lock_dir], env),
            "options": (
                [*cli(), "-q", "--wait", "5", "--lock-dir", lock_dir, "bench", "true"],
                env,
            ),
            "shim": (["sh", SHIM, "bench", "true", lock_dir], shim_env),
            "floor": ([sys.executable, "-c", FLOOR, floor_file], env),
            "shim floor": (
                ["sh", "-c", 'exec "$0" -I -S -c "$1" "$2"', sys.executable, FLOOR, floor_file],
                env,
            ),
        }
        medians = interleaved_medians(cases, args.runs)
        python, ours = medians["python"], medians["plain"]
        rows = [
            ("python3 -c pass", "python", "baseline"),
            ("local-mutex NAME true", "plain", "target <= 1.6x"),
            ("local-mutex -q --wait 5 --lock-dir D NAME true", "options", "target <= 1.5x"),
            ('sh "$LOCAL_MUTEX_CLI" NAME true (nested path)', "shim", "target <= 1.0x"),
            ("floor: the same system calls, no more", "floor", "floor of the first two"),
            ("floor, started as the nested path is", "shim floor", "floor of the nested path"),
        ]
        for label, key, target in rows:
            value = medians[key]
            faults = median_faults(*cases[key])
            print(
                f"{label:<48} median {value * 1000:6.1f} ms  {value / python:.2f}x ({target}); "
                f"{faults:.0f} page faults"
            )
        print(
            f"{'above the floor':<48} plain +{(ours - medians['floor']) * 1000:.1f} ms, "
            f"nested path +{(medians['shim'] - medians['shim floor']) * 1000:.1f} ms"
        )
        if shutil.which("flock"):
            bare = median_seconds(
                ["flock", "-o", "-x", lock_file, "sh", "-c", "true"], args.runs, env
            )
            print(
                f"{'flock -o -x FILE sh -c true':<48} median {bare * 1000:6.1f} ms  "
                f"(local-mutex is {ours / bare:.1f}x it)"
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
