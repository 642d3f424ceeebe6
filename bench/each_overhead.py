"""`each` over many items vs one CLI call per item vs a flock(1) loop, from one run.

    python bench/each_overhead.py [--items N] [--rounds R]

Targets: each <= 0.25x the sequential CLI calls, and <= 1.0x the bare flock(1) loop.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import clean_env, cli, compile_package, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = clean_env()
    compile_package()
    n = args.items
    items = "".join(f"item-{i}\n" for i in range(n)).encode()
    with tempfile.TemporaryDirectory() as d:
        each, sequential, flock = [], [], []
        loop = f'for i in $(seq {n}); do "$0" "item-$i" true {d} || exit 1; done'
        flock_loop = f"for i in $(seq {n}); do flock -o -x {d}/f-$i.lock sh -c true; done"
        for _ in range(args.rounds):
            each.append(seconds([*cli(), "each", "--lock-dir", d, "{}", "true"], env, items))
            sequential.append(seconds(["sh", "-c", loop, cli()[0]], env))
            if shutil.which("flock"):
                flock.append(seconds(["sh", "-c", flock_loop], env))
    e, s = statistics.median(each), statistics.median(sequential)
    print(f"each over {n} items            median {e:6.3f} s")
    print(
        f"{n} sequential local-mutex calls median {s:6.3f} s   each = {e / s:.2f}x "
        "(target <= 0.25x)"
    )
    if flock:
        f = statistics.median(flock)
        print(
            f"{n} x flock -o -x FILE sh -c true median {f:6.3f} s   each = {e / f:.2f}x "
            "(target <= 1.0x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
