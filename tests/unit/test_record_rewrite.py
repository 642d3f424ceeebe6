"""A lock file's record rewritten under a reader in another process."""

from __future__ import annotations

import json
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
from local_mutex.backends.flock import record
fd = os.open(sys.argv[1], os.O_RDONLY)
print("ready", flush=True)
empty = unreadable = reads = 0
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    reads += 1
    if not os.pread(fd, 65536, 0).split(b"\\n", 1)[0]:
        empty += 1
    if record.read_record_fd(fd) is None:
        unreadable += 1
print(empty, unreadable, reads)
"""


def test_a_record_being_rewritten_is_never_empty_or_unreadable_to_a_reader(
    tmp_path: Path,
) -> None:
    """A newcomer asks a moved file's record whose the file is while its hold hands it to
    the runs inside (a rewrite): between a truncate and the write it found the file
    empty, could not tell, and ran beside them. And a read that meets the write may see a
    mix of the two lines (ext4: some in a thousand here, as a holder names the runs inside
    its hold): it reads again, and gets the one or the other."""
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
    empty, unreadable, reads = map(int, reader.stdout.read().split())
    os.close(fd)
    assert reads > 1000 and rewrites > 1000
    assert empty == 0, f"{empty} of {reads} reads found no record"
    assert unreadable == 0, f"{unreadable} of {reads} reads found no record it could read"


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


REWRITE = """
import json, os, resource, signal, sys
from local_mutex.backends.flock import record
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
path, limit = sys.argv[1], int(sys.argv[2])
before, after = json.loads(sys.argv[3]), json.loads(sys.argv[4])
fd = os.open(path, os.O_RDWR)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
print(record.rewrite_record(fd, after, before))
"""


@pytest.mark.parametrize("room", ["none", "some"])
def test_a_rewrite_that_cannot_be_written_leaves_the_record_as_it_was(
    tmp_path: Path, room: str
) -> None:
    """A holder naming its runs in a record the file system cannot take (a full disk; a
    file size limit here): the record it had stays, whole -- a record cut to nothing (as
    a first write's failure leaves it) would make its hold one nobody could release."""
    path = tmp_path / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    before = {"pid": 1, "hold": True, "lock_file": str(path), "message": "m" * 100}
    after = {**before, "left_runs": "ab" * 12 + " " + "cd" * 12}
    record.write_record(fd, before, str(path))
    old = path.read_bytes()
    limit = len(old) + (0 if room == "none" else 20)  # "some": a short write, then none
    args = [str(path), str(limit), json.dumps(before), json.dumps(after)]
    r = subprocess.run(
        [sys.executable, "-c", REWRITE, *args], capture_output=True, text=True, timeout=30
    )
    assert r.stdout.strip() == "False", r.stderr
    assert path.read_bytes() == old
    assert record.rewrite_record(fd, after, before) is True  # with room, it is rewritten
    assert record.read_record_fd(fd) == record._parse(path.read_bytes())
    assert record.read_record_fd(fd)["left_runs"] == after["left_runs"]  # type: ignore[index]
    os.close(fd)
