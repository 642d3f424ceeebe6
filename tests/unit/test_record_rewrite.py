"""A lock file's record rewritten under a reader in another process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from local_mutex.backends.flock import record

READER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
print("ready", flush=True)
empty = reads = 0
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    reads += 1
    if not os.pread(fd, 65536, 0).split(b"\\n", 1)[0]:
        empty += 1
print(empty, reads)
"""


def test_a_record_being_rewritten_is_never_empty_to_a_reader(tmp_path: Path) -> None:
    """A newcomer asks a moved file's record whose the file is while its hold hands it to
    the runs inside (a rewrite): between a truncate and the write it found the file
    empty, could not tell, and ran beside them."""
    path = tmp_path / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    records = [{"pid": 1, "lock_file": str(path), "message": "x" * n} for n in (10, 300)]
    record.write_record(fd, records[0], str(path))
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path), "2"], stdout=subprocess.PIPE, text=True
    )
    assert reader.stdout is not None and reader.stdout.readline() == "ready\n"
    rewrites = 0
    while reader.poll() is None:
        record.write_record(fd, records[rewrites % 2], str(path))
        rewrites += 1
    empty, reads = map(int, reader.stdout.read().split())
    os.close(fd)
    assert reads > 1000 and rewrites > 1000
    assert empty == 0, f"{empty} of {reads} reads found no record"


@settings(max_examples=40, deadline=None)
@example(texts={"run_id": "7" * 70_000})  # from the environment, not cut first: cut too
@given(
    texts=st.dictionaries(
        st.sampled_from(["command", "message", "cwd", "job", "user", "name", "run_id"]),
        # Long runs of one character: what hypothesis draws unaided stays short.
        st.builds(lambda c, n: c * n, st.characters(), st.integers(0, 20_000)),
    )
)
def test_a_record_of_any_length_is_written_so_that_it_reads_back(
    tmp_path_factory: pytest.TempPathFactory, texts: dict[str, str]
) -> None:
    """What is written is read back (readers read ``MAX_RECORD`` bytes): a record they
    could not read made a hold nobody could release."""
    path = tmp_path_factory.mktemp("rec") / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        written = {"pid": 4242, "mode": "exclusive", "hold": True, **texts}
        assert record.write_record(fd, written, str(path))
        assert os.fstat(fd).st_size <= record.MAX_RECORD
        back = record.read_record_fd(fd)
    finally:
        os.close(fd)
    assert back is not None and back["pid"] == 4242 and back["hold"] is True
    for key, text in texts.items():
        kept = back.get(key)
        if kept != text:  # cut: a start of it, and a "…"
            assert isinstance(kept, str) and kept.endswith("…") and text.startswith(kept[:-1])
