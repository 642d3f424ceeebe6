"""The runner files local-mutex writes: step outputs and the job summary's row."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from local_mutex.ui.github import code_span, format_outputs, summary_row


def _span_text(cell: str) -> str:
    """The text a CommonMark code span at the start of ``cell`` shows (one space stripped
    from each side when both have one), and nothing may follow it."""
    fence = re.match(r"`+", cell)
    assert fence is not None
    rest = cell[fence.end() :]
    # The closing run: the first run of exactly as many backticks.
    for m in re.finditer(r"`+", rest):
        if len(m.group()) == len(fence.group()):
            inner, after = rest[: m.start()], rest[m.end() :]
            break
    else:
        raise AssertionError(f"unclosed code span: {cell!r}")
    assert after == "", f"text after the span renders as Markdown: {after!r}"
    if inner.startswith(" ") and inner.endswith(" ") and inner.strip(" "):
        inner = inner[1:-1]
    return inner


@given(st.text(alphabet="`a [](x) ", min_size=1, max_size=12))
def test_a_name_is_one_code_span_whatever_backticks_it_holds(name: str) -> None:
    assert _span_text(code_span(name)) == name


def test_a_backtick_in_the_name_does_not_end_the_span_in_the_summary() -> None:
    name = "x` [click to re-run](https://evil.example/) `y"
    row = summary_row(name, "0.0s", "1.0s", "exit 0").splitlines()[2]
    first_cell = row.split(" | ")[0].removeprefix("| ")
    assert _span_text(first_cell) == name


def test_the_summary_escapes_what_the_log_escapes() -> None:
    """U+202E made the name read backwards in the summary, while the log escaped it."""
    for raw, shown in (("ab\u202ecd", "ab\\u202ecd"), ("a\u2028b", "a\\u2028b"), ("a\nb", "a\\nb")):
        row = summary_row(raw, "0.0s", "1.0s", "exit 0").splitlines()[2]
        assert _span_text(row.split(" | ")[0].removeprefix("| ")) == shown


def test_a_value_with_a_line_break_adds_no_key_of_its_own() -> None:
    text = format_outputs({"a": "one\nb=two"})
    head, body, end = text.splitlines()[0], text.splitlines()[1:3], text.splitlines()[3]
    assert head.startswith("a<<") and end == head[3:]
    assert body == ["one", "b=two"]
