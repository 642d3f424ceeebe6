"""status and list cost, as ratios against baselines measured in the same run.

    python bench/status_overhead.py [--files N] [--held H] [--runs R]

`list --json` over a dir of N lock files (H of them held) vs `ls -l` of that dir
(target <= 10x), and `status NAME` on a held lock vs an uncontended run (target <= 1.5x).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import clean_env, cli, compile_package, median_seconds

HOLDER = """
import fcntl, os, sys
fds = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    fds.append(fd)
print("ready", flush=True)
sys.stdin.read()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--held", type=int, default=100)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    env = clean_env()
    compile_package()
    import local_mutex

    with tempfile.TemporaryDirectory() as lock_dir:
        paths = [local_mutex.lock_path(f"item-{i}", lock_dir) for i in range(args.files)]
        for p in paths:
            Path(p).touch()
        # One process holding many locks: each is a real flock(2) holder to report.
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, *paths[: args.held]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        try:
            ls = median_seconds(["ls", "-l", lock_dir], args.runs, env)
            lst = median_seconds([*cli(), "list", "--lock-dir", lock_dir, "--json"], args.runs, env)
            # Exit 1 (held) proves status really saw the holder each time.
            status = median_seconds(
                [*cli(), "status", "item-0", "--lock-dir", lock_dir], args.runs, env, expect=1
            )
            run = median_seconds([*cli(), "uncontended", "true", lock_dir], args.runs, env)
        finally:
            holder.communicate("")
    print(f"ls -l ({args.files} files)             median {ls * 1000:8.1f} ms   1.00x")
    print(
        f"list --json ({args.held} held)          median {lst * 1000:8.1f} ms   "
        f"{lst / ls:.2f}x ls -l (target <= 10x)"
    )
    print(f"local-mutex NAME true (uncontended) median {run * 1000:8.1f} ms   1.00x")
    print(
        f"status NAME (held)                  median {status * 1000:8.1f} ms   "
        f"{status / run:.2f}x the run (target <= 1.5x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
