"""The kill loop of issue 9: random SIGKILL/SIGTERM/SIGINT while three callers share a lock.

    python bench/kill_loop.py [--iterations 200] [--seed 9]

Prints the counts (overlaps, locks left held with no live holder, orphans); exits 1 if any
is above 0. The loop itself is tests/helpers/killloop.py (the suite runs 30 iterations).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers.killloop import run_kill_loop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=9)
    args = parser.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kill-loop-") as tmp:
        counts = run_kill_loop(
            args.iterations, args.seed, Path(tmp), progress=lambda s: print(s, flush=True)
        )
    print(f"seed={args.seed} {counts.summary()} in {time.monotonic() - t0:.1f}s")
    for line in counts.details[:40]:
        print("  " + line)
    print(
        f"overlaps: {counts.overlaps}\n"
        f"locks left held with no live holder: {counts.left_held}\n"
        f"orphans: {counts.orphans}"
    )
    return 1 if counts.bad() else 0


if __name__ == "__main__":
    sys.exit(main())
