"""The ``/proc/locks`` (and fdinfo ``lock:``) line parser: real-looking lines parse into
their fields, anything else is None, and nothing ever raises."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from local_mutex.backends.flock.proclocks import (
    KernelLock,
    key_of,
    parse_lock_line,
    read_proc_locks,
)

FAST = settings(
    derandomize=True, max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def fields(lock: KernelLock | None) -> tuple[object, ...] | None:
    if lock is None:
        return None
    return (lock.kind, lock.exclusive, lock.pid, lock.major, lock.minor, lock.inode, lock.depth)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "1: FLOCK  ADVISORY  WRITE 1924 fe:00:2146419 0 EOF",
            ("FLOCK", True, 1924, 0xFE, 0, 2146419, 0),
        ),
        (
            "12: FLOCK  ADVISORY  READ  77 08:01:123 0 EOF\n",
            ("FLOCK", False, 77, 8, 1, 123, 0),
        ),
        (
            "1: -> FLOCK  ADVISORY  WRITE 1925 fe:00:2146419 0 EOF",
            ("FLOCK", True, 1925, 0xFE, 0, 2146419, 1),
        ),
        (
            "1: -> -> FLOCK  ADVISORY  WRITE 1926 fe:01:123 0 EOF",
            ("FLOCK", True, 1926, 0xFE, 1, 123, 2),
        ),
        (
            "1: -> -> -> FLOCK  ADVISORY  READ 1927 fe:01:123 0 EOF",
            ("FLOCK", False, 1927, 0xFE, 1, 123, 3),
        ),
        (
            "4: POSIX  ADVISORY  READ 3629 fe:00:2146501 0 EOF",
            ("POSIX", False, 3629, 0xFE, 0, 2146501, 0),
        ),
        (
            "4: POSIX  ADVISORY  WRITE 3629 00:2a:99 100 199",
            ("POSIX", True, 3629, 0, 0x2A, 99, 0),
        ),
        (
            "7: OFDLCK ADVISORY  WRITE -1 103:02:4711 0 EOF",
            ("OFDLCK", True, -1, 0x103, 2, 4711, 0),
        ),
        (
            "lock:\t1: FLOCK  ADVISORY  WRITE 3629 fe:00:2146501 0 EOF\n",
            ("FLOCK", True, 3629, 0xFE, 0, 2146501, 0),
        ),
        (
            "lock:\t2: -> FLOCK  ADVISORY  WRITE 3629 fe:00:2146501 0 EOF\n",
            ("FLOCK", True, 3629, 0xFE, 0, 2146501, 1),
        ),
        (
            "3: FLOCK  MSNFS  WRITE 5 ff:ff:1",  # no range columns: still enough fields
            ("FLOCK", True, 5, 0xFF, 0xFF, 1, 0),
        ),
    ],
)
def test_real_looking_lines(line: str, expected: tuple[object, ...]) -> None:
    lock = parse_lock_line(line)
    assert fields(lock) == expected
    assert lock is not None and lock.key == expected[3:6]


def test_kernel_waiter_indentation() -> None:
    """The kernel marks a waiter blocked behind another waiter by indenting its single
    ``->`` (``"5:  -> FLOCK ..."``), not by more arrows: still a waiter, never granted."""
    lock = parse_lock_line("5:  -> FLOCK  ADVISORY  WRITE 3675 fe:00:2146501 0 EOF")
    assert lock is not None and lock.depth >= 1 and lock.pid == 3675


@pytest.mark.parametrize(
    "line",
    [
        "",
        " ",
        "\n",
        "lock:",
        "lock:\t",
        "1:",
        "1: ->",
        "1: -> -> ->",
        "1: FLOCK ADVISORY WRITE",
        "1: FLOCK ADVISORY WRITE 12",
        "1: FLOCK ADVISORY WRITE x fe:00:1 0 EOF",
        "1: FLOCK ADVISORY WRITE 12 fe:00 0 EOF",
        "1: FLOCK ADVISORY WRITE 12 fe:00:1:2 0 EOF",
        "1: FLOCK ADVISORY WRITE 12 zz:00:1 0 EOF",
        "1: FLOCK ADVISORY WRITE 12 fe:00:1f 0 EOF",  # inodes are decimal
        "1: FLOCK ADVISORY WRITE 12 fe::1 0 EOF",
        "1: FLOCK ADVISORY WRITE 12 :: 0 EOF",
        "1: FLOCK ADVISORY WRITE " + "9" * 5000 + " fe:00:1 0 EOF",
        "1: POSIX  ADVISORY  WRITE 1234 <none>:0 0 EOF",
        "pos:\t0",
        "flags:\t02100002",
        "\x00\x00\x00\x00\x00\x00",
        "\ud800 \udfff \ud800 \ud800 \ud800 \ud800",
    ],
)
def test_garbage_is_none(line: str) -> None:
    assert parse_lock_line(line) is None


KINDS = st.sampled_from(["FLOCK", "POSIX", "OFDLCK", "LEASE", "DELEG"])
SPACE = st.sampled_from([" ", "  ", "\t", " \t "])


@st.composite
def lock_lines(draw: st.DrawFn) -> tuple[str, tuple[object, ...]]:
    kind = draw(KINDS)
    access = draw(st.sampled_from(["READ", "WRITE", "UNLCK", "NONE"]))
    pid = draw(st.integers(-1, 2**22))
    major = draw(st.integers(0, 0xFFF))
    minor = draw(st.integers(0, 0xFFFFF))
    inode = draw(st.integers(0, 2**64 - 1))
    depth = draw(st.integers(0, 3))
    hexcase = draw(st.sampled_from(["x", "X"]))
    words = [f"{draw(st.integers(1, 10**6))}:"]
    words += ["->"] * depth
    words += [kind, draw(st.sampled_from(["ADVISORY", "MANDATORY"])), access, str(pid)]
    words.append(f"{major:02{hexcase}}:{minor:02{hexcase}}:{inode}")
    words += draw(st.sampled_from([[], ["0", "EOF"], ["100", "199"]]))
    sep = draw(SPACE)
    line = sep.join(words) + draw(st.sampled_from(["", "\n"]))
    if draw(st.booleans()):
        line = "lock:\t" + line
    return line, (kind, access == "WRITE", pid, major, minor, inode, depth)


@FAST
@given(lock_lines())
def test_generated_lines(case: tuple[str, tuple[object, ...]]) -> None:
    line, expected = case
    assert fields(parse_lock_line(line)) == expected


@FAST
@given(
    st.text(max_size=80)
    | st.lists(
        st.sampled_from(["1:", "->", "lock:", "FLOCK", "ADVISORY", "WRITE", "12", "fe:00:1", "::"])
        | st.text(st.sampled_from("0123456789abcdef:-x "), max_size=10),
        max_size=10,
    ).map(" ".join)
)
@example("1: -> FLOCK ADVISORY WRITE -0 -1:-0:-5 0 EOF")
def test_never_raises(line: str) -> None:
    lock = parse_lock_line(line)
    assert lock is None or isinstance(lock, KernelLock)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="no /proc/locks here")
def test_every_line_of_the_real_file() -> None:
    with open("/proc/locks", encoding="ascii", errors="replace") as f:
        lines = f.read().splitlines()
    for line in lines:
        lock = parse_lock_line(line)
        # every line the kernel writes is a lock line; a lock without an inode is printed
        # as `<none>:0` and cannot be one of ours
        assert lock is not None or "<none>" in line, line
    assert read_proc_locks() is not None


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="no /proc/locks here")
def test_a_lock_we_hold_and_its_waiter(tmp_path: Path) -> None:
    path = tmp_path / "f.lock"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    waiter = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        key = key_of(os.fstat(fd))
        code = (
            "import fcntl, os, sys\n"
            f"fd = os.open({str(path)!r}, os.O_RDWR)\n"
            "print('go', flush=True)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        )
        waiter = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        assert waiter.stdout is not None and waiter.stdout.readline() == b"go\n"
        for _ in range(500):
            locks = [lk for lk in read_proc_locks() or [] if lk.key == key]
            if any(lk.depth for lk in locks):
                break
            time.sleep(0.01)
        granted = [lk for lk in locks if lk.depth == 0]
        queued = [lk for lk in locks if lk.depth > 0]
        assert [(lk.pid, lk.exclusive, lk.kind) for lk in granted] == [(os.getpid(), True, "FLOCK")]
        assert [lk.pid for lk in queued] == [waiter.pid]
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as f:
            fdinfo_locks = [line for line in f if line.startswith("lock:")]
        assert [fields(parse_lock_line(line)) for line in fdinfo_locks] == [
            ("FLOCK", True, os.getpid(), *key, 0)
        ]
    finally:
        if waiter is not None:
            waiter.kill()
            waiter.wait()
        os.close(fd)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="no /proc/locks here")
def test_a_long_list_read_while_locks_come_and_go_lists_each_lock_once(tmp_path: Path) -> None:
    """/proc/locks comes a page per read, each walking the kernel's list afresh: with
    locks taken and let go meanwhile, lines repeated (``status`` named a holder twice) or
    went missing (a held lock looked free)."""
    fds = [os.open(tmp_path / f"held{i}", os.O_RDWR | os.O_CREAT) for i in range(600)]
    churn = (
        "import fcntl, os, sys\n"
        "fds = [os.open(os.path.join(sys.argv[1], f'c{i}'), os.O_RDWR | os.O_CREAT)"
        " for i in range(200)]\n"
        "print('go', flush=True)\n"
        "while True:\n"
        "    for fd in fds: fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "    for fd in fds: fcntl.flock(fd, fcntl.LOCK_UN)\n"
    )
    churner = subprocess.Popen(
        [sys.executable, "-c", churn, str(tmp_path)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_EX)
        ours = {key_of(os.fstat(fd)) for fd in fds}
        assert churner.stdout is not None and churner.stdout.readline() == b"go\n"
        for _ in range(30):
            seen = [lk.key for lk in read_proc_locks() or [] if lk.key in ours]
            assert len(seen) == len(ours) and set(seen) == ours, (len(seen), len(set(seen)))
    finally:
        churner.kill()
        churner.wait()
        for fd in fds:
            os.close(fd)
