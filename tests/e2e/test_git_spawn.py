"""git's processes as a renewal runs them: with a descriptor that cuts the call short."""

from __future__ import annotations

import os
import time

import pytest

from local_mutex.backends.git.spawn import Cancelled, run_git

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("size", [60_000, 70_000, 1_000_000])
def test_the_whole_input_reaches_a_process_that_reads_late(size: int) -> None:
    """Past a pipe's buffer, the input stopped after the first slice of the wait: the
    process never got the rest, and the call ran into its timeout."""
    watch, poke = os.pipe()
    try:
        code, out, _ = run_git(
            ["sh", "-c", "sleep 0.3; wc -c"],
            stdin=b"x" * size,
            env=dict(os.environ),
            timeout=20,
            cancel=watch,
        )
    finally:
        os.close(watch)
        os.close(poke)
    assert code == 0 and int(out) == size


def test_a_readable_cancel_descriptor_ends_the_call_and_its_process_group() -> None:
    watch, poke = os.pipe()
    try:
        os.write(poke, b"done 0\n")  # the supervisor's report: the command ended
        t0 = time.monotonic()
        with pytest.raises(Cancelled):
            run_git(
                ["sh", "-c", "sleep 30 & wait"],
                stdin=b"",
                env=dict(os.environ),
                timeout=20,
                cancel=watch,
            )
        assert time.monotonic() - t0 < 5
    finally:
        os.close(watch)
        os.close(poke)
