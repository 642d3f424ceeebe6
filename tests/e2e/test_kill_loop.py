"""Issue 9's kill loop in the suite: 30 seeded iterations (bench/kill_loop.py runs 200)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.killloop import run_kill_loop

pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc"),
    pytest.mark.timeout(75),
]


def test_thirty_rounds_of_random_kills_never_overlap_strand_a_lock_or_orphan(
    tmp_path: Path,
) -> None:
    counts = run_kill_loop(30, seed=9, work=tmp_path, budget=50.0)
    print(counts.summary())
    report = "\n".join([counts.summary(), *counts.details[:25]])
    # A busy machine (a load of 30) gets through fewer in the budget: a third, at least.
    assert counts.iterations >= 10, report
    assert (counts.overlaps, counts.left_held, counts.orphans, counts.hung_callers) == (
        0,
        0,
        0,
        0,
    ), report
