"""Property-based fuzzing of the real CLI: names as any bytes, ``each`` templates, option
values and planted holder records.

Whatever the input: never a traceback; a refusal exits 2 with exactly one stderr line
starting ``local-mutex: ``, the command did not run and no lock file was made; nothing is
written outside the lock dir. Deterministic (``derandomize``) and bounded for CI.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from helpers import lock_file, run_cli

# A refusal costs one interpreter start (~40 ms idle, a few times that on a busy machine).
FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=50,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
RECORDS = settings(FUZZ, max_examples=30)  # two CLI runs each
VERBS = {b"run", b"each", b"hold", b"release", b"status", b"list", b"history"}
PREFIX = b"local-mutex: "
MARKER = "ran"
_boxes = itertools.count()


class Box:
    """A fresh directory per example: ``locks`` (the lock dir), ``marks`` (the command's
    marker), ``cwd`` (the CLI's working directory) and ``tmp`` ($TMPDIR)."""

    def __init__(self, root: Path) -> None:
        self.root = root / f"box{next(_boxes)}"
        self.locks, self.marks = self.root / "locks", self.root / "marks"
        self.cwd, self.tmp = self.root / "cwd", self.root / "tmp"
        for d in (self.locks, self.marks, self.cwd, self.tmp):
            d.mkdir(parents=True)
        self.tmp_locks_before = set(Path("/tmp").glob("local-mutex-*.lock"))

    @property
    def env(self) -> dict[str, str]:
        return {"M": str(self.marks), "TMPDIR": str(self.tmp)}

    @property
    def command(self) -> bytes:
        return f'touch "$M/{MARKER}"'.encode()

    def run(self, args: list[bytes], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return run_cli(args, env=self.env, cwd=self.cwd, input=stdin, timeout=30)

    def ran(self) -> bool:
        return (self.marks / MARKER).exists()

    def lock_files(self) -> set[str]:
        return {p.name for p in self.locks.iterdir()}

    def check_nothing_else_written(self, names: Sequence[bytes] = ()) -> None:
        """Outside ``locks`` and the marker: nothing, here or as a lock file in /tmp."""
        found = {str(p.relative_to(self.root)) for p in self.root.rglob("*")}
        allowed = {"locks", "marks", "cwd", "tmp", f"marks/{MARKER}"}
        allowed |= {f"locks/{n}" for n in self.lock_files()}
        assert found <= allowed, found - allowed
        assert all(n.startswith("local-mutex-") for n in self.lock_files())
        for name in names:
            path = lock_file(Path("/tmp"), name)
            assert path in self.tmp_locks_before or not path.exists(), path


@pytest.fixture
def boxes(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def no_traceback(r: subprocess.CompletedProcess[bytes]) -> None:
    assert b"Traceback" not in r.stderr, r.stderr.decode("utf-8", "replace")
    assert r.returncode < 128 or r.returncode in (137,), r


def every_line_ours(r: subprocess.CompletedProcess[bytes]) -> None:
    lines = r.stderr.split(b"\n")
    assert lines[-1] == b"", r.stderr
    assert all(line.startswith(PREFIX) for line in lines[:-1]), r.stderr


def refused(r: subprocess.CompletedProcess[bytes], box: Box, code: int = 2) -> None:
    no_traceback(r)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.count(b"\n") == 1 and r.stderr.endswith(b"\n"), r.stderr
    assert r.stderr.startswith(PREFIX), r.stderr
    assert r.stdout == b""
    assert not box.ran()
    assert box.lock_files() == set()


def valid_name(raw: bytes) -> bool:
    """The documented rules: not empty, no control bytes, not only whitespace."""
    if not raw or any(b < 0x20 or b == 0x7F for b in raw):
        return False
    return not raw.decode("utf-8", "surrogateescape").isspace()


# --- names: any bytes -----------------------------------------------------------------------

NAMES = st.binary(max_size=40).filter(lambda b: b"\0" not in b) | st.sampled_from(
    [b"", b" ", b"\xe3\x80\x80", b"-", b"--", b"-h", b"--help", b"status", b"a\nb", b"\x7f"]
)


@FUZZ
@given(name=NAMES, plain=st.booleans())
@example(name=b"\xff\xfe/../x", plain=False)
@example(name=b"a" * 4000, plain=True)
@example(name="\u2028 é \U0001f600".encode(), plain=True)
def test_names_as_any_bytes(boxes: Path, name: bytes, plain: bool) -> None:
    box = Box(boxes)
    if plain and name and not name.startswith(b"-") and name not in VERBS:
        args = [name, box.command, str(box.locks).encode()]
    else:
        args = [b"run", b"--lock-dir", str(box.locks).encode(), b"--", name, box.command]
    r = box.run(args)
    event("valid name" if valid_name(name) else "refused name")
    if valid_name(name):
        no_traceback(r)
        every_line_ours(r)
        assert r.returncode == 0, r.stderr
        assert box.ran()
        assert box.lock_files() == {lock_file(box.locks, name).name}
    else:
        refused(r, box)
    box.check_nothing_else_written([name])


# --- each: templates ------------------------------------------------------------------------

ITEM = b"item"
TEMPLATES = st.lists(
    st.sampled_from([b"{}", b"{{", b"}}", b"{", b"}", b"x", b"-"])
    | st.binary(min_size=1, max_size=6).filter(lambda b: b"\0" not in b),
    max_size=6,
).map(b"".join)


def has_control(raw: bytes) -> bool:
    return any(b < 0x20 or b == 0x7F for b in raw)


def reference_expand(template: bytes, item: bytes) -> bytes | None:
    """``{}`` is the item, ``{{``/``}}`` a brace, any other brace or a control byte makes
    it invalid."""
    if has_control(template):
        return None
    out, i = b"", 0
    while i < len(template):
        pair = template[i : i + 2]
        if pair == b"{}":
            out, i = out + item, i + 2
        elif pair in (b"{{", b"}}"):
            out, i = out + pair[:1], i + 2
        elif template[i : i + 1] in (b"{", b"}"):
            return None
        else:
            out, i = out + template[i : i + 1], i + 1
    return out


@FUZZ
@given(template=TEMPLATES)
@example(template=b"deploy-{}")
@example(template=b"{{}")
@example(template=b"\x01{}")
@example(template=b"")
@example(template=b"{{}}")
@example(template=b"a\nb-{}")
@example(template=b"{\x7f")
@example(template=b"   ")
def test_each_templates(boxes: Path, template: bytes) -> None:
    box = Box(boxes)
    args = [b"each", b"--lock-dir", str(box.locks).encode(), b"--", template, box.command]
    r = box.run(args, stdin=ITEM + b"\n")
    no_traceback(r)
    every_line_ours(r)
    name = reference_expand(template, ITEM)
    if not template.strip():  # no lock whatever the item: refused before any item
        name = None
    event("bad template" if name is None else "good name" if valid_name(name) else "bad name")
    if name is None:
        refused(r, box)
        assert b"template" in r.stderr
        if has_control(template):
            assert b"contains control characters" in r.stderr, r.stderr
    elif valid_name(name):
        assert r.returncode == 0, r.stderr
        assert box.ran()
        assert box.lock_files() == {lock_file(box.locks, name).name}
    else:
        # The template is fine; the name it makes for this item is not: refused per item.
        assert r.returncode == 2, r.stderr
        assert not box.ran() and box.lock_files() == set()
        assert b"item 'item'" in r.stderr
    box.check_nothing_else_written([] if name is None else [name])


# --- option values --------------------------------------------------------------------------

VALUES: st.SearchStrategy[str] = st.sampled_from(
    [
        "0",
        "-0",
        "1",
        "0.5",
        "1e9",
        "1000000001",
        "1e9000",
        "-1",
        "nan",
        "-nan",
        "inf",
        "Infinity",
        "1025",
        "1024",
        "0x10",
        "1_0",
        " 5 ",
        "",
        "٣",
        "1e-300",
        "+5",
        "1E2",
        " 5",
        "5\n",
        "-inf",
        "NaN",
        "\uff15",
        "--",
        "-q",
        "5s",
    ]
)
VALUES |= st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=8)
VALUES |= st.floats(0, 1e9).map(repr) | st.integers(-2, 1030).map(str)
FLAGS = ["--wait", "--timeout", "--slots", "--kill-after"]


def value_ok(flag: str, value: str) -> bool:
    """The documented ranges: seconds 0..1e9 (> 0 for --timeout), --slots 1..1024; and
    strict forms: --slots ASCII digits, seconds only ``0-9 . e E + -`` (no ``nan``,
    ``inf``, padding, ``1_0`` or other scripts' digits, all of which float() takes)."""
    if flag == "--slots":
        return value.isascii() and value.isdigit() and 1 <= int(value) <= 1024
    if not value or not set(value) <= set("0123456789.eE+-"):
        return False
    try:
        seconds = float(value)
    except ValueError:
        return False
    if not math.isfinite(seconds) or not 0 <= seconds <= 1e9:
        return False
    return seconds > 0 or flag != "--timeout"


@FUZZ
@given(flag=st.sampled_from(FLAGS), value=VALUES, inline=st.booleans())
@example(flag="--timeout", value="0", inline=False)
@example(flag="--slots", value="0", inline=True)
@example(flag="--wait", value="nan", inline=False)
def test_option_values(boxes: Path, flag: str, value: str, inline: bool) -> None:
    box = Box(boxes)
    opt = [f"{flag}={value}".encode()] if inline else [flag.encode(), value.encode()]
    args = [b"run", b"--lock-dir", str(box.locks).encode(), *opt, b"--", b"n", box.command]
    r = box.run(args)
    event(f"{flag} {'ok' if value_ok(flag, value) else 'refused'}")
    if value_ok(flag, value):
        no_traceback(r)
        every_line_ours(r)
        if flag == "--timeout" and float(value) < 5:
            assert r.returncode in (0, 124, 137), r.stderr  # a tiny ceiling may stop it
        else:
            assert r.returncode == 0, r.stderr
            assert box.ran()
    else:
        refused(r, box)
        assert flag.encode() in r.stderr
        assert b"needs a" in r.stderr or b"not between" in r.stderr or b"more than 0" in r.stderr
    box.check_nothing_else_written([b"n"])


# --- planted holder records -----------------------------------------------------------------

JSONISH: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from([2**31, -1, 0, 1e11, 1e400, "\x1b[31m", "\u2028", "%0A"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
FIELDS = [
    "pid",
    "since_epoch",
    "command",
    "cwd",
    "host",
    "user",
    "runner",
    "job",
    "workflow",
    "run_url",
    "message",
    "name",
    "slot",
    "hold",
    "token_sha256",
]


@st.composite
def records(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "json", "fields", "deep", "big"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        return b'{"pid": 1, "a": ' + b"[" * draw(st.integers(1, 50_000)) + b"\n"
    if kind == "big":
        return b'{"command": "' + b"x" * draw(st.integers(60_000, 200_000)) + b'"}\n'
    value = (
        draw(JSONISH) if kind == "json" else draw(st.dictionaries(st.sampled_from(FIELDS), JSONISH))
    )
    if isinstance(value, dict) and draw(st.integers(0, 3)):
        value["pid"] = os.getpid()  # the record then describes the kernel's holder
    text = json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")
    return text + draw(st.sampled_from([b"\n", b"", b"\ngarbage", b"\r\n"]))


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A real lock file for NAME ``n`` made by the CLI, then held by this test process."""
    locks = tmp_path / "held"
    locks.mkdir()
    r = run_cli(["run", "--lock-dir", str(locks), "--", "n", "true"])
    assert r.returncode == 0, r.stderr
    path = lock_file(locks, "n")
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        yield locks, fd
    finally:
        os.close(fd)


@RECORDS
@given(content=records())
@example(content=b"")
@example(content=b"\xff\xfe\x00garbage")
@example(content=b'{"pid": 1, "since_epoch": 1e400, "command": ["x"]}\n')
def test_planted_holder_records(
    held_lock: tuple[Path, int], tmp_path: Path, content: bytes
) -> None:
    locks, fd = held_lock
    os.ftruncate(fd, 0)
    os.pwrite(fd, content, 0)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    env = {"M": str(marks)}

    r = run_cli(["status", "--json", "--lock-dir", str(locks), "n"], env=env, timeout=30)
    no_traceback(r)
    assert r.returncode == 1, r.stderr  # held, by this process
    status = json.loads(r.stdout)  # strict JSON, whatever the record held
    assert status["state"] == "held"
    assert [h["pid"] for h in status["holders"]] == [os.getpid()]
    event(f"holder from {status['holders'][0]['source']}")

    r = run_cli(
        ["run", "--no-wait", "--lock-dir", str(locks), "--", "n", f'touch "$M/{MARKER}"'],
        env=env,
        timeout=30,
    )
    no_traceback(r)
    assert r.returncode == 75, r.stderr
    assert not (marks / MARKER).exists()
    assert b"not acquired" in r.stderr
    every_line_ours(r)  # whatever the record's fields hold
    assert sorted(p.name for p in locks.iterdir()) == [lock_file(locks, "n").name]


@pytest.mark.parametrize("key", ["cwd", "host", "runner", "job", "run_url"])
def test_record_fields_cannot_inject_lines(held_lock: tuple[Path, int], key: str) -> None:
    locks, fd = held_lock
    rec = {"pid": os.getpid(), key: "/x\n::error::injected\r\x1b[2K"}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(rec).encode() + b"\n", 0)
    r = run_cli(["run", "--no-wait", "--lock-dir", str(locks), "--", "n", "true"])
    assert r.returncode == 75
    every_line_ours(r)
    assert b"\r" not in r.stderr and b"\x1b" not in r.stderr, r.stderr
    # shown on the holder's line: whitespace flattened, other control characters escaped
    assert b"/x ::error::injected \\x1b[2K" in r.stderr, r.stderr
    r = run_cli(["status", "--lock-dir", str(locks), "n"])
    assert r.returncode == 1
    assert b"\n::error::" not in r.stdout and b"\r" not in r.stdout, r.stdout
    assert b"\x1b" not in r.stdout and b"::error::injected" in r.stdout, r.stdout
