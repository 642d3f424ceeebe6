"""A lock file's record rewritten under a reader in another process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
