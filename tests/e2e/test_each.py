"""each: many items, one process, one lock per item, items never executed."""

from __future__ import annotations

import collections
import io
import os
import signal
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import (
    CLI,
    Procs,
    clean_env,
    hold_until,
    lock_file,
    run_cli,
    sleeps_in,
    start_each,
    wait_for,
)
from helpers import procwatch as pw
from local_mutex.commands.each import MAX_ITEM, SHOWN, TooLong, read_items
from local_mutex.names import display

# Over Linux's 128 KiB cap on one environment string, and macOS's 1 MiB for all of them:
# as $LOCAL_MUTEX_ITEM, an item this long makes execve fail with E2BIG.
TOO_BIG = 3_000_000


def test_two_hundred_items_each_once_under_its_own_lock(lock_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    items = "".join(f"key-{i}\n" for i in range(200)).encode()
    cmd = f'echo "$LOCAL_MUTEX_ITEM" >> "{log}"'
    r = run_cli(["each", "--lock-dir", str(lock_dir), "cache-{}", cmd], input=items)
    assert r.returncode == 0, r.stderr
    assert log.read_text().splitlines() == [f"key-{i}" for i in range(200)]
    for i in (0, 199):
        assert lock_file(lock_dir, f"cache-key-{i}").exists()
    err = r.stderr.decode().splitlines()
    assert err == [next(x for x in err if x.startswith("local-mutex: each: 200 items ran in"))]


def test_concurrent_each_over_the_same_items_never_overlaps_per_item(
    lock_dir: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    items = "".join(f"{i}\n" for i in range(40)).encode()
    cmd = (
        f'f="{logs}/$LOCAL_MUTEX_ITEM"; echo "start $$" >> "$f"; sleep 0.01; echo "end $$" >> "$f"'
    )
    procs = [
        subprocess.Popen(
            [*CLI, "each", "--lock-dir", str(lock_dir), "item-{}", cmd],
            stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=clean_env(),
        )
        for _ in range(2)
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(items)
        p.stdin.close()
    assert [p.wait(120) for p in procs] == [0, 0]
    for i in range(40):
        lines = (logs / str(i)).read_text().splitlines()
        assert len(lines) == 4
        for k in (0, 2):
            assert lines[k].split()[0] == "start" and lines[k + 1] == lines[k].replace(
                "start", "end"
            )


def test_items_are_passed_verbatim_and_never_executed(lock_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    items = ["with space", "quote'\"", "$(touch pwned)", "`touch pwned2`", "{braces}", "a;b"]
    r = run_cli(
        [
            "each",
            "--lock-dir",
            str(lock_dir),
            "x-{}",
            f'printf "%s\\n" "$LOCAL_MUTEX_ITEM" >> "{out}"',
        ],
        input="\n".join(items).encode() + b"\n",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text().splitlines() == items
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert lock_file(lock_dir, "x-$(touch pwned)").exists()


def test_nul_separated_items(lock_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run_cli(
        [
            "each",
            "-0",
            "--lock-dir",
            str(lock_dir),
            "n-{}",
            f'printf "[%s]" "$LOCAL_MUTEX_ITEM" >> "{out}"',
        ],
        input=b"with space\0back\\slash\0\0last",
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text() == "[with space][back\\slash][last]"
    # A newline inside an item is fine for the command but not for a lock name.
    r = run_cli(["each", "-0", "--lock-dir", str(lock_dir), "n-{}", "true"], input=b"a\nb\0")
    assert r.returncode == 2 and b"control characters (byte 0x0A)" in r.stderr


def test_stops_at_the_first_failure_or_counts_with_keep_going(
    lock_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    cmd = f'echo "$LOCAL_MUTEX_ITEM" >> "{out}"; case "$LOCAL_MUTEX_ITEM" in bad*) exit 3;; esac'
    items = b"a\nbad1\nb\nbad2\nc\n"
    r = run_cli(["each", "--lock-dir", str(lock_dir), "k-{}", cmd], input=items)
    assert r.returncode == 3
    assert out.read_text().split() == ["a", "bad1"]
    assert "first: 'bad1', exit 3" in r.stderr.decode() and "stopped early" in r.stderr.decode()
    out.unlink()
    r = run_cli(["each", "--keep-going", "--lock-dir", str(lock_dir), "k-{}", cmd], input=items)
    assert r.returncode == 2  # two items failed
    assert out.read_text().split() == ["a", "bad1", "b", "bad2", "c"]
    assert "5 items ran, 2 failed" in r.stderr.decode()


def test_skip_locked_skips_busy_items_and_reports_them(
    procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    procs.start(["s-b", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    r = run_cli(
        [
            "each",
            "--no-wait",
            "--skip-locked",
            "--lock-dir",
            str(lock_dir),
            "s-{}",
            f'echo "$LOCAL_MUTEX_ITEM" >> "{out}"',
        ],
        input=b"a\nb\nc\n",
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text().split() == ["a", "c"]
    err = r.stderr.decode()
    assert "skipped item 'b'" in err and "1 skipped because locked" in err
    r = run_cli(["each", "--no-wait", "--lock-dir", str(lock_dir), "s-{}", "true"], input=b"b\n")
    assert r.returncode == 75
    (marks / "h.go").touch()


def test_items_that_waited_get_a_line(procs: Procs, lock_dir: Path, marks: Path) -> None:
    holder = procs.start(["w-b", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    p = procs.start(["each", "--lock-dir", str(lock_dir), "w-{}", "true"])  # stdin: /dev/null
    assert p.wait(30) == 0
    p = start_each(["--lock-dir", str(lock_dir), "w-{}", "true"], b"a\nb\nc\n")
    assert p.stderr is not None
    line = p.stderr.readline().decode()
    assert "waiting for lock w-b" in line and f"held by pid {holder.pid}" in line
    (marks / "h.go").touch()
    assert p.wait(30) == 0
    rest = p.stderr.read().decode().splitlines()
    assert not any("w-a" in x or "w-c" in x for x in rest)
    assert any(x.startswith("local-mutex: released w-b") for x in rest)


def test_each_bad_input(lock_dir: Path, marks: Path) -> None:
    cmd = f"touch '{marks}/ran'"
    for args, needle in [
        (["each", "--lock-dir", str(lock_dir), "x-{", cmd], "lone '{'"),
        (["each", "--lock-dir", str(lock_dir), "x-{}", " "], "command is only whitespace"),
        (["each", "--skip-locked", "--lock-dir", str(lock_dir), "x-{}", cmd], "--skip-locked"),
        (["each", "--lock-dir", "rel", "x-{}", cmd], "must be an absolute path"),
        (["each", "--lock-dir", str(lock_dir), "", cmd], "template '' names no lock"),
        (["each", "--lock-dir", str(lock_dir), "  ", cmd], "names no lock: it is only whitespace"),
    ]:
        r = run_cli(args, input=b"a\n")
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr.decode()
    assert not (marks / "ran").exists() and not any(lock_dir.iterdir())
    r = run_cli(["each", "--lock-dir", str(lock_dir), "x-{}", cmd], input=b"ok\nbad\tname\n")
    assert r.returncode == 2 and b"control characters (byte 0x09)" in r.stderr
    assert collections.Counter(p.name for p in lock_dir.iterdir()) == {
        lock_file(lock_dir, "x-ok").name: 1
    }


@pytest.mark.parametrize("template,expected", [("{{{}}}", "{a}"), ("p-{}-{}", "p-a-a")])
def test_template_braces(lock_dir: Path, template: str, expected: str) -> None:
    r = run_cli(["each", "--lock-dir", str(lock_dir), template, "true"], input=b"a\n")
    assert r.returncode == 0, r.stderr
    assert lock_file(lock_dir, expected).exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_stops_the_batch_even_when_the_item_exits_0(
    lock_dir: Path, marks: Path, sig: signal.Signals
) -> None:
    """The item catches the relayed signal and exits 0; the signal was a request to stop
    the batch all the same: no later item runs, and the status is 128+N."""
    cmd = (
        f"trap 'exit 0' INT TERM HUP; touch '{marks}/'\"$LOCAL_MUTEX_ITEM\"; "
        "while :; do sleep 0.05; done"
    )
    with open(marks / "err", "wb") as err:
        p = subprocess.Popen(
            [*CLI, "each", "--lock-dir", str(lock_dir), "k-{}", cmd],
            stdin=subprocess.PIPE,
            stderr=err,
            env=clean_env(),
        )
    assert p.stdin is not None
    p.stdin.write(b"a\nb\nc\n")
    p.stdin.close()
    wait_for(marks / "a")
    p.send_signal(sig)
    assert p.wait(30) == 128 + sig, (marks / "err").read_text()
    assert not (marks / "b").exists() and not (marks / "c").exists()
    assert "stopped early" in (marks / "err").read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_between_fast_items_stops_the_batch(
    lock_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """Items that end within a millisecond: the signal often reaches the supervisor after
    its command ended, when it no longer reports it. The batch stops all the same."""
    out = tmp_path / "out"
    p = start_each(
        ["-q", "--lock-dir", str(lock_dir), "k-{}", f"echo x >> '{out}'"],
        b"".join(b"%d\n" % i for i in range(3000)),
    )
    assert p.stderr is not None
    wait_for(lambda: out.exists() and len(out.read_bytes()) >= 2 * 50)
    p.send_signal(sig)
    assert p.wait(60) == 128 + sig
    assert len(out.read_bytes()) < 2 * 3000
    err = p.stderr.read()
    assert b"Traceback" not in err and b"stopped early" in err, err


@pytest.mark.skipif(not os.path.exists("/proc/self/wchan"), reason="needs /proc/PID/wchan")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_while_waiting_for_the_next_item_stops_the_batch(
    lock_dir: Path, marks: Path, sig: signal.Signals
) -> None:
    """Items from a slow producer (`find`, a generator): between items, reading stdin,
    `each` died from the signal itself, with no summary and no status of its own."""
    with open(marks / "err", "wb") as err:
        p = subprocess.Popen(
            [*CLI, "each", "--lock-dir", str(lock_dir), "k-{}", f"touch '{marks}/ran'"],
            stdin=subprocess.PIPE,
            stderr=err,
            env=clean_env(),
        )
    assert p.stdin is not None
    try:
        p.stdin.write(b"a\n")
        p.stdin.flush()
        wait_for(marks / "ran")
        wait_for(  # asleep in select() until stdin is readable; the item's keeper polls too
            lambda: not pw.children(p.pid) and sleeps_in(p.pid, "poll_schedule_timeout"),
            what="each reading its stdin",
        )
        p.send_signal(sig)
        assert p.wait(30) == 128 + sig, (marks / "err").read_text()
    finally:
        p.stdin.close()
    assert "each: 1 item ran, stopped early" in (marks / "err").read_text()


def test_a_supervisor_death_in_one_item_spares_what_earlier_items_left_behind(
    lock_dir: Path, marks: Path
) -> None:
    """Item a leaves a job running (it runs on, unlocked, as after any normal end) and
    `each` adopts it. Item b's supervisor is SIGKILLed: `each` stops item b's command
    before letting go -- and only it, not item a's job."""
    cmd = (
        'if [ "$LOCAL_MUTEX_ITEM" = a ]; then '
        f"(setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > '{marks}/a.pid'); exit 0; fi; "
        f"echo $$ > '{marks}/b.pid'; while :; do sleep 0.05; done"
    )
    p = start_each(["-q", "--lock-dir", str(lock_dir), "k", cmd], b"a\nb\n")
    assert p.stderr is not None
    wait_for(lambda: (marks / "b.pid").exists() and (marks / "b.pid").read_text().strip() != "")
    left = int((marks / "a.pid").read_text())
    b_top = int((marks / "b.pid").read_text())
    try:
        wait_for(lambda: pw.ppid(left) == p.pid, what="each adopting item a's job")
        supervisor = pw.supervisor_child(p.pid)
        assert supervisor is not None
        os.kill(supervisor, signal.SIGKILL)
        assert p.wait(30) != 0
        assert pw.wait_gone([b_top], 10) == []
        assert pw.alive(left), "item a's job was stopped with item b's command"
        assert "stopping the command before releasing" in p.stderr.read().decode()
    finally:
        pw.signal_quietly([left, b_top])


@pytest.mark.parametrize("template", ["", " "])
def test_a_template_that_names_no_lock_is_refused_even_with_no_items(
    lock_dir: Path, template: str
) -> None:
    """Refused up front, as any bad template: not accepted and found out per item (or
    never, when stdin is empty)."""
    r = run_cli(["each", "--lock-dir", str(lock_dir), template, "true"], input=b"")
    assert r.returncode == 2, r.stderr
    err = r.stderr.decode()
    assert f"template {template!r} names no lock" in err and "items ran" not in err


def test_a_command_that_cannot_start_fails_each_item_named(lock_dir: Path) -> None:
    prog = ["--", "/nonexistent/prog"]
    r = run_cli(["each", "-k", "--lock-dir", str(lock_dir), "k{}", *prog], input=b"a\nb\n")
    assert r.returncode == 2, r.stderr  # --keep-going: the number of items that failed
    err = r.stderr.decode().splitlines()
    assert [x for x in err if "cannot start the command" in x] == [
        f"local-mutex: item {item!r}: cannot start the command: /nonexistent/prog: No such "
        "file or directory (the program, or the interpreter its #! names)"
        for item in ("a", "b")
    ]
    assert "each: 0 items ran, 2 could not run, 2 failed (first: 'a', exit 125) in" in err[-1]
    r = run_cli(["each", "--lock-dir", str(lock_dir), "k{}", *prog], input=b"a\nb\n")
    assert r.returncode == 125, r.stderr
    text = r.stderr.decode()
    assert "item 'a': cannot start the command" in text and "item 'b'" not in text
    assert "0 items ran, 1 could not run, 1 failed (first: 'a', exit 125), stopped early" in text


def test_an_item_not_acquired_is_not_counted_as_run(
    procs: Procs, lock_dir: Path, marks: Path
) -> None:
    holder = procs.start(["i-b", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    argv = [
        "each",
        "--no-wait",
        "--lock-dir",
        str(lock_dir),
        "i-{}",
        'echo "ran $LOCAL_MUTEX_ITEM"',
    ]
    r = run_cli(argv, input=b"a\nb\nc\n")
    assert r.returncode == 75, r.stderr
    assert r.stdout.decode().split() == ["ran", "a"]
    assert "each: 1 item ran, 1 could not run, 1 failed (first: 'b', exit 75), stopped early" in (
        r.stderr.decode()
    )
    r = run_cli([*argv[:1], "-k", *argv[1:]], input=b"a\nb\nc\n")
    assert r.returncode == 1, r.stderr
    assert "each: 2 items ran, 1 could not run, 1 failed (first: 'b', exit 75) in" in (
        r.stderr.decode()
    )
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


def test_an_item_too_big_for_the_environment_fails_alone(lock_dir: Path, tmp_path: Path) -> None:
    """An item longer than $LOCAL_MUTEX_ITEM can carry is refused before its lock (it was
    E2BIG, exit 125, once the lock was taken): with --keep-going the next item (same lock)
    still runs, the longest that fits too; without, the batch stops there. The item is
    named, but cut short."""
    out = tmp_path / "out"
    cmd = f'echo "${{#LOCAL_MUTEX_ITEM}}" >> "{out}"'
    items = b"x" * TOO_BIG + b"\nsmall\n" + b"b" * MAX_ITEM + b"\n"
    r = run_cli(["each", "-k", "--lock-dir", str(lock_dir), "k", cmd], input=items)
    assert r.returncode == 1, r.stderr[-2000:]
    assert out.read_text() == f"5\n{MAX_ITEM}\n"
    err = r.stderr.decode()
    assert len(err) < 2000, "a huge item was quoted whole"
    line = next(x for x in err.splitlines() if "can hold" in x)
    assert line.startswith("local-mutex: item 'xxx") and f"({TOO_BIG} bytes)" in line
    assert line.endswith(f"it is longer than $LOCAL_MUTEX_ITEM can hold ({MAX_ITEM} bytes)")
    assert "2 items ran, 1 could not run, 1 failed (first: 'xxx" in err and "exit 2) in" in err
    out.unlink()
    r = run_cli(["each", "--lock-dir", str(lock_dir), "k", cmd], input=items)
    assert r.returncode == 2, r.stderr[-2000:]
    assert not out.exists()
    assert "0 items ran, 1 could not run, 1 failed" in r.stderr.decode()


class Chunked(io.RawIOBase):
    """A binary stream that hands out DATA cut at the given offsets, as a pipe would."""

    def __init__(self, data: bytes, cuts: list[int]) -> None:
        bounds = [0, *sorted(set(cuts)), len(data)]
        self.chunks = [data[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]

    def read1(self, size: int = -1) -> bytes:
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if 0 <= size < len(chunk):
            chunk, rest = chunk[:size], chunk[size:]
            self.chunks.insert(0, rest)
        return chunk


def split_items(data: bytes, *, null: bool) -> list[str]:
    """The README's rule: lines (a line's trailing CR dropped) or NUL-separated items,
    empty ones skipped."""
    sep = b"\0" if null else b"\n"
    raws = data.split(sep)
    if not null:
        raws = [raw[:-1] if raw.endswith(b"\r") else raw for raw in raws]
    return [display(raw) for raw in raws if raw]


@given(
    data=st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\0", b"\r", b"\xff", b"\xc3\xa9"])).map(
        b"".join
    ),
    cuts=st.lists(st.integers(0, 64)),
    null=st.booleans(),
)
def test_items_do_not_depend_on_how_stdin_is_chunked(
    data: bytes, cuts: list[int], null: bool
) -> None:
    assert list(read_items(Chunked(data, cuts), null=null)) == split_items(data, null=null)


def test_an_item_is_yielded_once_its_separator_arrives() -> None:
    """Items run as they come: the first is out before the stream has more to give."""

    class Stalls(Chunked):
        def read1(self, size: int = -1) -> bytes:
            assert self.chunks, "read past the first item before yielding it"
            return super().read1(size)

    items = read_items(Stalls(b"first\nsec", [2]), null=False)
    assert next(items) == "first"


@pytest.mark.parametrize("null", [False, True])
def test_items_of_several_megabytes(null: bool) -> None:
    """More than $LOCAL_MUTEX_ITEM can carry: known by their start and length."""
    sep = b"\0" if null else b"\n"
    data = b"x" * 5_000_000 + sep + b"next" + sep + b"y" * 3_000_001
    items = list(read_items(io.BytesIO(data), null=null))
    assert items == ["x" * SHOWN, "next", "y" * SHOWN]
    assert [getattr(x, "length", None) for x in items] == [5_000_000, None, 3_000_001]
    edge = b"z" * MAX_ITEM + sep + b"w" * (MAX_ITEM + 1)
    items = list(read_items(io.BytesIO(edge), null=null))
    assert items[0] == "z" * MAX_ITEM and not isinstance(items[0], TooLong)
    assert isinstance(items[1], TooLong) and items[1].length == MAX_ITEM + 1


def test_an_endless_line_does_not_fill_memory() -> None:
    """`each ... < /dev/zero` grew by a gigabyte every second, saying nothing."""
    import tracemalloc

    class Endless(io.RawIOBase):
        left = 3200  # 200 MB in 64 KiB reads, no separator, then one short item

        def read1(self, size: int) -> bytes:
            self.left -= 1
            return b"\0" * 65536 if self.left > 0 else (b"\nok\n" if self.left == 0 else b"")

    tracemalloc.start()
    try:
        items = list(read_items(Endless(), null=False))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [getattr(x, "length", None) for x in items] == [3199 * 65536, None]
    assert items[1] == "ok" and peak < 2 * MAX_ITEM + (1 << 20), peak


def test_an_item_with_a_nul_byte_is_refused_before_its_lock(lock_dir: Path) -> None:
    """A line may hold a NUL byte, which no environment variable can: with a template
    that leaves the item out of the name, the lock was taken and the supervisor failed
    (exit 70, the item counted as ran)."""
    r = run_cli(
        [
            "each",
            "--keep-going",
            "--lock-dir",
            str(lock_dir),
            "fixed",
            'echo "[$LOCAL_MUTEX_ITEM]"',
        ],
        input=b"a\0b\nc\n",
    )
    err = r.stderr.decode()
    assert r.stdout == b"[c]\n", err
    assert "item 'a\\x00b': it holds a NUL byte" in err, err
    assert "1 item ran, 1 could not run, 1 failed (first: 'a\\x00b', exit 2)" in err, err
    assert "supervisor" not in err


def test_items_from_a_pipe_made_non_blocking_are_all_run(lock_dir: Path, marks: Path) -> None:
    """O_NONBLOCK is the pipe's, shared by every process on it (Node.js sets it): an empty
    read said "try again", taken for the end of the items -- the batch ended at what had
    come, exit 0, and the rest never ran."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    each = subprocess.Popen(
        [*CLI, "each", "--lock-dir", str(lock_dir), "nb{}", f'touch "{marks}/$LOCAL_MUTEX_ITEM"'],
        stdin=r,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    os.close(r)
    try:
        os.write(w, b"a\n")
        wait_for(marks / "a")  # it ran a, and found the pipe empty after it
        os.write(w, b"b\nc\n")
    finally:
        os.close(w)
    _, err = each.communicate(timeout=30)
    assert each.returncode == 0, err
    assert sorted(os.listdir(marks)) == ["a", "b", "c"]
    assert err.decode().startswith("local-mutex: each: 3 items ran"), err


@pytest.mark.parametrize("stdin", ["write-only", "closed"])
def test_items_that_cannot_be_read_are_said_so(lock_dir: Path, stdin: str) -> None:
    """A stdin open for writing only gave a traceback (EBADF); a closed one (/dev/null
    stands in for it) ran no items and exited 0, as if none had been given."""
    redirect = "0>/dev/null" if stdin == "write-only" else "0<&-"
    args = [*CLI, "each", "--lock-dir", str(lock_dir), "p{}", "true"]
    r = subprocess.run(
        ["sh", "-c", f'exec "$@" {redirect}', "sh", *args],
        capture_output=True,
        env=clean_env(),
        timeout=30,
    )
    why = " from stdin: Bad file descriptor" if stdin == "write-only" else ": stdin is closed"
    assert r.returncode == 74, r.stderr
    said = r.stderr.decode().splitlines()
    assert said[0] == f"local-mutex: cannot read items{why}" and len(said) == 2, said
    assert said[1].startswith("local-mutex: each: 0 items ran, stopped early in "), said
