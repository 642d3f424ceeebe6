"""One line stays one line: what a name, a record or a command holds is printed escaped."""

from __future__ import annotations

import pytest

from local_mutex.ui.lines import describe_holder, printable


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text", "plain text"),
        ("a\nb", "a\\nb"),
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("a\x85b\x9bc", "a\\x85b\\x9bc"),
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),  # a new line to many log viewers
        ("caf\u00e9 \u6f22\u5b57", "caf\u00e9 \u6f22\u5b57"),
        ("a\udcffb", "a\udcffb"),  # a name's raw byte 0xFF: written back as that byte
        ("a\ud800b", "a\\ud800b"),  # a surrogate that stands for no byte
        ("a\udc9bb", "a\\x9bb"),  # a name's raw byte 0x9B: a terminal's CSI, as such
        ("evil\u202etxt.sh", "evil\\u202etxt.sh"),  # would read "evilhs.txt"
        ("a\u2066b\u2069c\u200fd", "a\\u2066b\\u2069c\\u200fd"),
    ],
)
def test_printable(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_a_holders_text_is_escaped_once() -> None:
    """``repr`` of text ``one_line`` had escaped doubled the backslashes (``\\\\x1b``) and
    wrote a name's raw bytes as ``\\udcff``; a holder known only by its user read as a pid."""
    holder = {"pid": 7, "command": "sleep 2 # \udcff\x1b[32m", "message": "m\x1b[31mred"}
    said = describe_holder(holder, now=0.0)
    # ascii(): a lone surrogate in the report would crash a pytest-xdist worker instead.
    assert said == "pid 7 ('sleep 2 # \udcff\\x1b[32m', message 'm\\x1b[31mred')", ascii(said)
    assert describe_holder({"user": "0", "host": "h"}) == "user 0 (on h)"
    assert describe_holder({}) == "?"


@pytest.mark.parametrize("kind", ["error", "warning", None])
def test_a_line_quoting_a_huge_value_keeps_its_head_and_tail(kind: str | None) -> None:
    """A 100 KB environment variable, a 5,000-digit --wait: quoted whole, one "line" was
    as long as the value."""
    import io

    from local_mutex.ui.lines import Reporter

    out = io.StringIO()
    Reporter(out, actions=False).write(f"--wait '{'9' * 100_000}' is not a number", kind)
    line = out.getvalue()
    assert line.count("\n") == 1 and len(line) < 3100, len(line)
    assert line.startswith("local-mutex: --wait '999") and line.endswith("' is not a number\n")
    assert "characters]" in line
    out = io.StringIO()
    Reporter(out, actions=False).write("short", kind)
    assert out.getvalue() == "local-mutex: short\n"
