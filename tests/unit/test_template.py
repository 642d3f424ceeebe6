"""``each``'s lock-name templates: ``{}`` is the item, ``{{``/``}}`` literal braces, checked
against ``str.format`` (the same brace rules, restricted to bare ``{}`` fields)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from local_mutex.commands.each import expand, parse_template
from local_mutex.errors import InvalidTemplate, ValidationError

FAST = settings(
    derandomize=True, max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize(
    ("template", "parts"),
    [
        ("", [""]),
        ("plain", ["plain"]),
        ("{}", ["", None, ""]),
        ("build-{}", ["build-", None, ""]),
        ("{}-{}", ["", None, "-", None, ""]),
        ("{{}}", ["{}"]),
        ("{{{}}}", ["{", None, "}"]),
        ("a{{b}}c", ["a{b}c"]),
        ("{}}}", ["", None, "}"]),
        ("{{{{", ["{{"]),
        ("é{}\U0001f600", ["é", None, "\U0001f600"]),
    ],
)
def test_parse_template(template: str, parts: list[str | None]) -> None:
    assert parse_template(template) == parts
    assert expand(parts, "X") == template.format(*["X"] * template.count("{}"))


@pytest.mark.parametrize(
    ("template", "brace", "at"),
    [
        ("{", "{", 0),
        ("}", "}", 0),
        ("a{b", "{", 1),
        ("a}b", "}", 1),
        ("{x}", "{", 0),
        ("{0}", "{", 0),
        ("{{}", "}", 2),
        ("{}}", "}", 2),
        ("}{", "}", 0),
        ("{{{", "{", 2),
        ("x{ }", "{", 1),
    ],
)
def test_lone_braces(template: str, brace: str, at: int) -> None:
    with pytest.raises(InvalidTemplate) as info:
        parse_template(template)
    msg = str(info.value)
    assert f"a lone {brace!r} at {at}" in msg
    assert repr(template) in msg
    assert "{{ or }}" in msg
    assert isinstance(info.value, ValidationError)  # exit 2
    if template != "{0}":  # str.format has numbered fields; templates do not
        with pytest.raises((ValueError, IndexError, KeyError)):
            template.format("X")


CONTROLS = "".join(map(chr, range(0x20))) + "\x7f"


def has_control(text: str) -> bool:
    return any(c in CONTROLS for c in text)


@pytest.mark.parametrize(
    ("template", "byte"),
    [
        ("\x00", "0x00"),
        ("a\nb-{}", "0x0A"),
        ("{}\r", "0x0D"),
        ("\t{}", "0x09"),
        ("x\x1b[31m{}", "0x1B"),
        ("{}\x7f", "0x7F"),
        ("{\x01", "0x01"),  # refused for the control character before any brace check
        ("ok-\x1f-\x00", "0x1F"),  # the first one is named
    ],
)
def test_control_characters_are_refused(template: str, byte: str) -> None:
    with pytest.raises(InvalidTemplate) as info:
        parse_template(template)
    msg = str(info.value)
    assert f"contains control characters (byte {byte})" in msg, msg
    assert repr(template) in msg and "\n" not in msg
    assert isinstance(info.value, ValidationError)  # exit 2


@pytest.mark.parametrize("template", [" {}", "~{}", "\x80{}", "é-{}", "\u2028{}"])
def test_printable_edges_are_not_control_characters(template: str) -> None:
    assert parse_template(template) == [template[:-2], None, ""]


def test_expand_never_reinterprets_the_item() -> None:
    parts = parse_template("k-{}-{}")
    assert expand(parts, "{}{{}}") == "k-{}{{}}-{}{{}}"
    assert expand(parts, "") == "k--"


TOKENS = st.lists(
    st.sampled_from(["{}", "{{", "}}"])
    | st.text(st.characters(blacklist_characters="{}" + CONTROLS), min_size=1, max_size=4),
    max_size=10,
)
ITEMS = st.text(max_size=8)


def _reference(tokens: list[str], item: str) -> str:
    return "".join({"{}": item, "{{": "{", "}}": "}"}.get(t, t) for t in tokens)


@FAST
@given(TOKENS, ITEMS)
@example(["{}", "}}"], "i")
@example(["{{", "{}", "}}"], "i")
@example(["}}", "{{"], "{}")
def test_well_formed_templates_expand_like_the_reference(tokens: list[str], item: str) -> None:
    template = "".join(tokens)
    parts = parse_template(template)
    assert expand(parts, item) == _reference(tokens, item)
    assert parts.count(None) == tokens.count("{}")
    # str.format with bare {} fields agrees
    assert expand(parts, item) == template.format(*[item] * tokens.count("{}"))


@FAST
@given(st.text(st.sampled_from("{}a\x00é"), max_size=12), ITEMS)
@example("{{}", "i")
@example("}{}{", "i")
@example("{}\x00", "i")
def test_agrees_with_str_format(template: str, item: str) -> None:
    if has_control(template):  # str.format takes them; templates do not
        with pytest.raises(InvalidTemplate, match="contains control characters"):
            parse_template(template)
        return
    try:
        expected = template.format(*[item] * len(template))
    except (ValueError, IndexError, KeyError):
        with pytest.raises(InvalidTemplate):
            parse_template(template)
        return
    assert expand(parse_template(template), item) == expected


@FAST
@given(st.text(max_size=30))
@example("a\nb")
@example("{}\x1b")
def test_any_text_parses_or_is_invalid_template(template: str) -> None:
    try:
        parts = parse_template(template)
    except InvalidTemplate as exc:
        if has_control(template):
            assert "contains control characters" in str(exc)
        else:
            assert "a lone" in str(exc) and ("{" in template or "}" in template)
        return
    assert not has_control(template)
    literal = "".join(p for p in parts if p is not None)
    assert len(literal) + 2 * parts.count(None) <= len(template)
    assert all(p is None or isinstance(p, str) for p in parts)
    assert parts[0] is not None and parts[-1] is not None
