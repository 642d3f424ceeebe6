"""How long a stopped run takes to release: SIGTERM to a run whose command has a background
child, until the wrapper exits (the lock is released just before), as medians.

    python bench/stop_release.py [--runs N]

Measured with this process as the parent, and -- as root, with util-linux's ``unshare`` --
under a PID 1 that never reaps orphans (a container without an init), where counting
zombies as alive used to cost 10 s and a false "survived SIGKILL". Target: <= 0.5 s either
way. The baseline is the same measurement on a command without a background child.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import clean_env, cli, compile_package

# PID 1 of a new pid namespace that starts one child and never reaps anything else.
_PID1 = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def _keeper_below(pid: int) -> int:
    """The local-mutex process: unshare's child is our PID 1, whose child it is."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid1 in _children(pid):
            for keeper in _children(pid1):
                return keeper
        time.sleep(0.01)
    raise SystemExit("no local-mutex process under unshare")


def stop_seconds(argv: list[str], marker: Path, env: dict[str, str]) -> tuple[float, int, str]:
    marker.unlink(missing_ok=True)
    p = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not marker.exists():
        if time.monotonic() > deadline or p.poll() is not None:
            raise SystemExit(f"{argv} never started its command")
        time.sleep(0.005)
    target = p.pid if argv[0] != "unshare" else _keeper_below(p.pid)
    t0 = time.perf_counter()
    os.kill(target, signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    return time.perf_counter() - t0, p.returncode, err.decode("utf-8", "replace")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    env = clean_env()
    compile_package()
    with tempfile.TemporaryDirectory() as d:
        marker = Path(d) / "started"
        plain = f"touch {marker}; exec sleep 100"
        with_child = f"sleep 100 & touch {marker}; wait"
        cases = [
            ("no background child (baseline)", [*cli(), "stop", plain, d]),
            ("a background child", [*cli(), "stop", with_child, d]),
        ]
        if os.geteuid() == 0 and shutil.which("unshare"):
            cases.append(
                (
                    "a background child, PID 1 never reaps",
                    [
                        "unshare",
                        "-fp",
                        "--mount-proc",
                        sys.executable,
                        "-c",
                        _PID1,
                        *cli(),
                        "stop",
                        with_child,
                        d,
                    ],
                )
            )
        base = None
        for label, argv in cases:
            times = []
            for _ in range(args.runs):
                seconds, code, err = stop_seconds(argv, marker, env)
                if code != 143 or "survived" in err:
                    raise SystemExit(f"{label}: exit {code}, {err!r}")
                times.append(seconds)
            median = statistics.median(times)
            base = base or median
            print(
                f"{label:<40} median {median * 1000:7.1f} ms  max {max(times) * 1000:7.1f} ms  "
                f"{median / base:.2f}x the baseline (target <= 500 ms)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
