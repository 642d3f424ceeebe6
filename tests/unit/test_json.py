"""``local_mutex._json`` checked against the standard library's ``json``.

``dumps`` must always write valid, strict, ASCII-only JSON that ``json.loads`` reads back
as ``json`` itself would (NaN and infinities become ``null``); ``loads`` must accept
exactly what ``json.loads`` accepts (minus ``NaN``/``Infinity``, which are not JSON) and
give the same values, within explicit bounds on size and depth.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from local_mutex import _json

FAST = settings(
    derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _reject_constant(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


def std_loads(text: str) -> Any:
    """The reference parser: RFC 8259 JSON, so no NaN/Infinity."""
    return json.loads(text, parse_constant=_reject_constant)


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types (1, 1.0 and True differ), NaN-free."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def finite(value: Any) -> Any:
    """What ``dumps`` promises to write: NaN and infinities as null, tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) < 0xE000 for c in value)
    if isinstance(value, dict):
        return any(has_surrogate(k) or has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_surrogate(v) for v in value)
    return False


# Text with everything a string can hold: lone surrogates, astral characters, controls.
TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=20)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([math.inf, -math.inf, math.nan, -0.0, 5e-324, 1.7976931348623157e308])
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=30,
)
FINITE_VALUES = st.recursive(
    SCALARS.filter(lambda v: not (isinstance(v, float) and not math.isfinite(v))),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=30,
)


# --- dumps ------------------------------------------------------------------------------


@FAST
@given(VALUES)
@example(math.nan)
@example([math.inf, -math.inf, {"n": math.nan}])
@example("\ud800")
@example("\udc00\ud800")
@example("\U0001f600\U0010ffff\x00\x1f\x7f\u2028\u2029")
@example({"\ud83d": "\ude00"})
def test_dumps_is_valid_ascii_json_that_round_trips(value: Any) -> None:
    text = _json.dumps(value)
    assert text.isascii(), text
    assert "\n" not in text
    parsed = std_loads(text)  # strict: no control characters, no NaN/Infinity
    # Round trip as the standard library's own writer does it (a string holding a lone
    # high and a lone low surrogate next to each other reads back as one astral
    # character with either writer).
    expected = std_loads(json.dumps(finite(value), ensure_ascii=True, allow_nan=False))
    assert same(parsed, expected), (text, parsed, expected)
    # ... and our reader reads our writer.
    assert same(_json.loads(text, max_depth=1000), expected)


@FAST
@given(FINITE_VALUES)
def test_dumps_round_trips_exactly_without_surrogates(value: Any) -> None:
    text = _json.dumps(value)
    if has_surrogate(value):
        return  # covered above; adjacent lone surrogates may pair up
    assert same(std_loads(text), finite(value))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-12, "-12"),
        (1.5, "1.5"),
        (1e16, "1e+16"),
        (-0.0, "-0.0"),
        (math.nan, "null"),
        (math.inf, "null"),
        (-math.inf, "null"),
        ("", '""'),
        ('a"b\\c', '"a\\"b\\\\c"'),
        ("\n\r\t", '"\\n\\r\\t"'),
        ("\x00\x1f\x7f", '"\\u0000\\u001f\\u007f"'),
        ("é", '"\\u00e9"'),
        ("\U0001f600", '"\\ud83d\\ude00"'),
        ("\ud800", '"\\ud800"'),
        ([], "[]"),
        ((1, "a"), '[1,"a"]'),
        ({}, "{}"),
        ({"a": [1, {"b": None}]}, '{"a":[1,{"b":null}]}'),
    ],
)
def test_dumps_known_texts(value: Any, text: str) -> None:
    assert _json.dumps(value) == text
    assert json.dumps(finite(value), separators=(",", ":"), allow_nan=False) == text


def test_dumps_matches_json_dumps_compact() -> None:
    value = {"pid": 12, "since_epoch": 1.7e9, "command": "make -j8 'x'", "u": "ü\u2028"}
    assert _json.dumps(value) == json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize(
    ("key", "text"),
    [
        (None, '"null"'),
        (True, '"true"'),
        (False, '"false"'),
        (0, '"0"'),
        (-12, '"-12"'),
        (1.5, '"1.5"'),
        (1e16, '"1e+16"'),
        (-0.0, '"-0.0"'),
        ("None", '"None"'),
    ],
)
def test_dumps_non_string_keys_as_json_dumps(key: Any, text: str) -> None:
    value = {key: 1}
    assert _json.dumps(value) == "{" + text + ":1}"
    assert _json.dumps(value) == json.dumps(value, separators=(",", ":"))


@FAST
@given(
    st.lists(
        st.tuples(
            st.none()
            | st.booleans()
            | st.integers(-(2**70), 2**70)
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=5),
            st.integers(),
        ),
        max_size=6,
    ).map(dict)
)
def test_dumps_keys_agree_with_json_dumps(value: dict[Any, int]) -> None:
    assert _json.dumps(value) == json.dumps(value, separators=(",", ":"))


def test_dumps_non_data_is_its_str() -> None:
    class Thing:
        def __str__(self) -> str:
            return "thing\n"

    assert std_loads(_json.dumps({"x": Thing(), "b": b"\xff"})) == {"x": "thing\n", "b": "b'\\xff'"}


# --- loads against json.loads on valid JSON -----------------------------------------------


@st.composite
def json_texts(draw: st.DrawFn) -> str:
    value = draw(FINITE_VALUES)
    indent = draw(st.sampled_from([None, 0, 1, 2, "\t", " \n "]))
    separators = draw(
        st.sampled_from([None, (",", ":"), (", ", ": "), (" ,\n", " :\t"), ("\r\n,", "\r\n:")])
    )
    text = json.dumps(
        value,
        indent=indent,
        separators=separators,
        ensure_ascii=draw(st.booleans()),
        sort_keys=draw(st.booleans()),
        allow_nan=False,
    )
    pad = st.text(" \t\r\n", max_size=3)
    return draw(pad) + text + draw(pad)


@FAST
@given(json_texts())
@example('{"a": 1, "a": 2}')
@example('"\\ud83d\\ude00 \\ud800 \\udc00\\ud800 \\ud800\\u0041 \\/ \\b\\f"')
@example("[1e400, -1e400, 1E+2, 1e-2, -0, -0.0, 0.5e1, 123456789012345678901234567890]")
@example('"\x7f\u2028 raw unicode é \U0001f600"')
def test_loads_agrees_with_json_loads(text: str) -> None:
    assert same(_json.loads(text, max_depth=1000), std_loads(text))


# --- loads against json.loads on invalid JSON --------------------------------------------

MALFORMED = [
    "",
    " ",
    "[1,]",
    "[,1]",
    '{"a":1,}',
    '{,"a":1}',
    "[1 2]",
    '{"a" 1}',
    '{"a":}',
    "{a:1}",
    "{'a':1}",
    "{1:2}",
    '{"a":1',
    "[1",
    "[",
    "]",
    "{",
    "}",
    "[]]",
    "{}}",
    "01",
    "-01",
    "00",
    "1.",
    ".5",
    "-",
    "+1",
    "1e",
    "1e+",
    "1.e5",
    "0x10",
    "1_000",
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "[NaN]",
    '{"a": Infinity}',
    "nul",
    "tru",
    "True",
    "None",
    "null null",
    "truex",
    "[true1]",
    '"abc',
    '"\\"',
    '"a\nb"',
    '"a\tb"',
    '"\x00"',
    '"\x1f"',
    '"\\x41"',
    '"\\a"',
    '"\\U0001F600"',
    '"\\u12"',
    '"\\u12g4"',
    '"\\u"',
    '"\\',
    "'single'",
    "\ufeff{}",
    "\u00a0[]",
    "[1]\x00",
    "/* c */ 1",
    "[1] // c",
    "\x0b1",
    "\x0c1",
]


@pytest.mark.parametrize("text", MALFORMED)
def test_loads_rejects_what_json_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        std_loads(text)
    with pytest.raises(ValueError):
        _json.loads(text)


JSONISH = st.text(
    st.sampled_from(list('[]{}",:0123456789-+.eE \t\n\\/utrfalsnbx\x00\x1fé\ud800')), max_size=24
)


@FAST
@given(JSONISH | st.text(max_size=24))
@example('"\\ud800\\ud800\\udc00"')
@example("[[[[]]]]")
def test_loads_accepts_exactly_what_json_accepts(text: str) -> None:
    try:
        expected = std_loads(text)
    except (ValueError, RecursionError):
        with pytest.raises(ValueError):
            _json.loads(text, max_depth=1000)
        return
    assert same(_json.loads(text, max_depth=1000), expected)


# --- bounds -------------------------------------------------------------------------------


@pytest.mark.parametrize("opener", ["[", '{"a":', '[{"a":'])
def test_deep_nesting_is_a_value_error_never_recursion(opener: str) -> None:
    text = opener * 100_000
    with pytest.raises(ValueError, match="nested deeper"):
        _json.loads(text)
    with pytest.raises(ValueError):
        _json.loads(text + "1" + "]" * 100_000)
    assert _json.loads_object("{" + '"a":' + text) is None


@pytest.mark.parametrize("depth", [1, 4, 32, 200])
def test_max_depth_is_exact(depth: int) -> None:
    assert _json.loads("[" * depth + "]" * depth, max_depth=depth) is not None
    with pytest.raises(ValueError, match="nested deeper"):
        _json.loads("[" * (depth + 1) + "]" * (depth + 1), max_depth=depth)
    nested_objects = '{"a":' * depth + "{}" + "}" * depth
    with pytest.raises(ValueError, match="nested deeper"):
        _json.loads(nested_objects, max_depth=depth)
    assert _json.loads(nested_objects, max_depth=depth + 1) is not None


def test_default_max_depth() -> None:
    ok = "[" * _json.MAX_DEPTH + "]" * _json.MAX_DEPTH
    assert _json.loads(ok) is not None
    with pytest.raises(ValueError):
        _json.loads("[" + ok + "]")


def test_scalars_need_no_depth() -> None:
    assert _json.loads('"x"', max_depth=0) == "x"
    with pytest.raises(ValueError):
        _json.loads("[]", max_depth=0)


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_nesting_with_a_generous_max_depth_is_still_a_value_error(opener: str) -> None:
    depth = sys.getrecursionlimit() * 4
    closer = "]" if opener == "[" else "}"
    with pytest.raises(ValueError, match="nested too deeply"):
        _json.loads(opener * depth + "1" + closer * depth, max_depth=depth)
    assert _json.loads_object('{"a":' + opener * depth, max_depth=depth) is None


def test_max_size() -> None:
    text = json.dumps("x" * 100)
    assert _json.loads(text, max_size=len(text)) == "x" * 100
    with pytest.raises(ValueError, match="longer than"):
        _json.loads(text, max_size=len(text) - 1)
    big = '"' + "a" * _json.MAX_TEXT + '"'
    with pytest.raises(ValueError, match="longer than"):
        _json.loads(big)
    assert _json.loads_object('{"a":' + big + "}") is None


def test_big_numbers() -> None:
    assert _json.loads("1e400") == math.inf  # as json.loads: a float that overflowed
    assert _json.loads("-1e400") == -math.inf
    assert _json.loads("1" * 4000) == int("1" * 4000)
    with pytest.raises(ValueError):  # past int's digit limit (3.11+): still a ValueError
        _json.loads("1" * 100_000)


# --- loads_object -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["", "null", "1", '"{}"', "[]", "[{}]", "true", "{", "{}x", "garbage", "\x00", "[" * 10_000],
)
def test_loads_object_none_for_non_objects(text: str) -> None:
    assert _json.loads_object(text) is None


def test_loads_object_bounds() -> None:
    assert _json.loads_object('{"a":{"b":{}}}') == {"a": {"b": {}}}
    assert _json.loads_object('{"a":{"b":{}}}', max_depth=2) is None
    assert _json.loads_object('{"a":1}', max_size=6) is None
    assert _json.loads_object('{"a":1}', max_size=7) == {"a": 1}


@FAST
@given(st.text(max_size=40) | JSONISH)
def test_loads_object_never_raises(text: str) -> None:
    result = _json.loads_object(text)
    assert result is None or isinstance(result, dict)
