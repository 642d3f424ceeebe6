"""Shared by the benchmarks: which CLI to time, how to time it, a clean environment."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def cli() -> list[str]:
    """The installed `local-mutex` script next to this interpreter, else `python -m`."""
    script = Path(sys.executable).parent / "local-mutex"
    return [str(script)] if script.exists() else [sys.executable, "-m", "local_mutex"]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_MUTEX_", "GITHUB_"))}


def compile_package() -> None:
    """A regular install has bytecode compiled by pip, and its first plain run writes the
    plain run's module cache; an editable one may have neither (PYTHONDONTWRITEBYTECODE
    keeps it that way), which would time the compiler and the import system instead."""
    import tempfile

    import local_mutex

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", os.path.dirname(local_mutex.__file__)],
        check=True,
    )
    env = clean_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as lock_dir:
        subprocess.run([*cli(), "-q", "warm-up", "true", lock_dir], env=env, check=True)


def seconds(
    argv: list[str], env: dict[str, str], stdin: bytes = b"", expect: int | None = 0
) -> float:
    """Wall time of one run; ``expect`` is the exit status it must have (None: any)."""
    t0 = time.perf_counter()
    r = subprocess.run(
        argv,
        env=env,
        input=stdin,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    elapsed = time.perf_counter() - t0
    if expect is not None and r.returncode != expect:
        raise SystemExit(f"{argv} exited {r.returncode}, expected {expect}")
    return elapsed


def median_seconds(
    argv: list[str], runs: int, env: dict[str, str], stdin: bytes = b"", expect: int | None = 0
) -> float:
    return statistics.median(seconds(argv, env, stdin, expect) for _ in range(runs))


def median_faults(argv: list[str], env: dict[str, str], runs: int = 5) -> float:
    """Minor page faults of one run and everything it started (each costs some µs: a
    fork copies a page the first time either side writes it)."""
    import resource

    counts = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
        seconds(argv, env)
        counts.append(resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before)
    return statistics.median(counts)


def interleaved_medians(
    cases: dict[str, tuple[list[str], dict[str, str]]], runs: int
) -> dict[str, float]:
    """Median wall time of each case, the cases taking turns run by run, so that a busy
    moment of the machine weighs on all of them alike."""
    times: dict[str, list[float]] = {label: [] for label in cases}
    for argv, env in cases.values():
        seconds(argv, env)  # warm caches and bytecode once
    for _ in range(runs):
        for label, (argv, env) in cases.items():
            times[label].append(seconds(argv, env))
    return {label: statistics.median(values) for label, values in times.items()}
