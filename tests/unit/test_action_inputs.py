"""The composite action's inputs (``LOCAL_MUTEX_INPUT_*``), parsed without click: every
bad value is a ValidationError whose message names the input."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from local_mutex.action_inputs import INPUT_PREFIX, ActionInputs, boolean, input_words, seconds
from local_mutex.errors import ValidationError
from local_mutex.ui.lines import in_words

# The mode an input is used by, where run does not use it (others are refused: below).
MODE_OF = {"ttl_seconds": "hold", "token": "release", "force": "release"}


def inputs(**values: str) -> ActionInputs:
    for key in list(values):
        if key in MODE_OF and "mode" not in values:
            values["mode"] = MODE_OF[key]
    return ActionInputs({INPUT_PREFIX + k.upper(): v for k, v in values.items()})


def refused(**values: str) -> str:
    with pytest.raises(ValidationError) as info:
        inputs(**values)
    assert info.value.exit_code == 2
    return str(info.value)


def test_defaults() -> None:
    i = inputs(name="n", run="make")
    assert (i.mode, i.name, i.command) == ("run", "n", "make")
    assert i.wait is None and i.timeout is None and i.ttl is None
    assert (i.shared, i.reentrant, i.force) == (False, False, False)
    assert i.slots is None and i.remote is None and i.lock_dir is None
    assert (i.if_locked, i.annotations) == ("fail", "always")
    assert i.message is None and i.token is None


def test_empty_environment() -> None:
    i = ActionInputs({})
    assert i.mode == "run" and i.name == "" and i.command == ""


def test_other_variables_are_ignored() -> None:
    i = ActionInputs({"MODE": "bogus", "LOCAL_MUTEX_INPUT_mode": "bogus", "INPUT_SLOTS": "x"})
    assert i.mode == "run" and i.slots is None


# --- mode -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "mode"),
    [("", "run"), ("run", "run"), (" Hold ", "hold"), ("RELEASE", "release"), ("check", "check")],
)
def test_modes(raw: str, mode: str) -> None:
    assert inputs(mode=raw).mode == mode


@pytest.mark.parametrize("raw", ["bogus", "runs", "status", "hold release", "\x00", "é"])
def test_bad_mode(raw: str) -> None:
    msg = refused(mode=raw)
    assert msg.startswith("mode must be one of run, hold, release, check")
    assert repr(raw) in msg


@pytest.mark.parametrize("mode", ["hold", "release", "check"])
def test_run_only_for_mode_run(mode: str) -> None:
    msg = refused(mode=mode, run="make")
    assert "run: is only for mode: run" in msg and mode in msg
    assert inputs(mode=mode, run="  \n").mode == mode  # blank is no command


# --- seconds ----------------------------------------------------------------------------

SECONDS = [
    ("wait_seconds", "wait-seconds", "wait", True),
    ("timeout_seconds", "timeout-seconds", "timeout", False),
    ("ttl_seconds", "ttl-seconds", "ttl", False),
]


@pytest.mark.parametrize(("key", "label", "attr", "zero_ok"), SECONDS)
@pytest.mark.parametrize(
    ("raw", "value"),
    [("", None), ("  ", None), ("5", 5.0), (" 0.25 ", 0.25), ("1e9", 1e9), ("3600", 3600.0)],
)
def test_good_seconds(
    key: str, label: str, attr: str, zero_ok: bool, raw: str, value: float | None
) -> None:
    assert getattr(inputs(**{key: raw}), attr) == value


@pytest.mark.parametrize(("key", "label", "attr", "zero_ok"), SECONDS)
def test_zero_seconds(key: str, label: str, attr: str, zero_ok: bool) -> None:
    for raw in ("0", "0.0", "-0"):
        if zero_ok:
            assert getattr(inputs(**{key: raw}), attr) == 0.0
        else:
            msg = refused(**{key: raw})
            assert msg.startswith(label) and "out of range" in msg


@pytest.mark.parametrize(("key", "label", "attr", "zero_ok"), SECONDS)
@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("nan", "must be a number of seconds"),
        ("NaN", "must be a number of seconds"),
        ("inf", "must be a number of seconds"),
        ("-inf", "must be a number of seconds"),
        ("Infinity", "must be a number of seconds"),
        ("1_0", "must be a number of seconds"),
        ("\u0663", "must be a number of seconds"),  # ARABIC-INDIC DIGIT THREE
        ("1 0", "must be a number of seconds"),
        ("1e400", "out of range"),
        ("-1", "out of range"),
        ("1000000001", "out of range"),
        ("5s", "must be a number of seconds"),
        ("five", "must be a number of seconds"),
        ("1,5", "must be a number of seconds"),
        ("0x10", "must be a number of seconds"),
        ("\x00", "must be a number of seconds"),
    ],
)
def test_bad_seconds(key: str, label: str, attr: str, zero_ok: bool, raw: str, needle: str) -> None:
    msg = refused(**{key: raw})
    assert msg.startswith(label + " "), msg
    assert needle in msg


@pytest.mark.parametrize(("key", "label", "attr", "zero_ok"), SECONDS)
@pytest.mark.parametrize("raw", ["nan", " inf ", "\t-inf\n", "1_0", "\uff15"])
def test_seconds_are_plain_numbers(
    key: str, label: str, attr: str, zero_ok: bool, raw: str
) -> None:
    """Surrounding whitespace (YAML) is stripped; what is left must be 0-9 . e E + -."""
    assert refused(**{key: raw}) == f"{label} must be a number of seconds, not {raw.strip()!r}"


@given(st.text(max_size=12), st.booleans())
@settings(
    derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@example("nan", True)
@example("1e309", False)
@example("١٢", True)  # float() takes other scripts' digits; a number of seconds does not
@example(" -inf ", True)
@example("1_000", True)
def test_seconds_helper(text: str, allow_zero: bool) -> None:
    try:
        value = seconds(text, "some-input", allow_zero=allow_zero)
    except ValidationError as exc:
        assert str(exc).startswith("some-input ")
        return
    if value is None:
        assert not text.strip()
        return
    assert set(text.strip()) <= set("0123456789.eE+-"), text
    assert math.isfinite(value) and 0 <= value <= 1e9
    assert value > 0 or allow_zero


# --- booleans ----------------------------------------------------------------------------

BOOLEANS = [("shared", "shared"), ("reentrant", "reentrant"), ("force", "force")]


@pytest.mark.parametrize(("key", "attr"), BOOLEANS)
@pytest.mark.parametrize(
    ("raw", "value"),
    [("", False), ("false", False), ("False", False), (" FALSE ", False), ("true", True)],
)
def test_good_booleans(key: str, attr: str, raw: str, value: bool) -> None:
    assert getattr(inputs(**{key: raw}), attr) is value


@pytest.mark.parametrize(("key", "attr"), BOOLEANS)
@pytest.mark.parametrize("raw", ["yes", "no", "1", "0", "on", "t", "truee", "\x00"])
def test_bad_booleans(key: str, attr: str, raw: str) -> None:
    msg = refused(**{key: raw})
    assert msg == f"{attr} must be 'true' or 'false', not {raw!r}"


@given(st.text(max_size=8))
@settings(derandomize=True, max_examples=200, deadline=None)
def test_boolean_helper(text: str) -> None:
    try:
        value = boolean(text, "flag-input")
    except ValidationError as exc:
        assert str(exc).startswith("flag-input must be")
        return
    assert value is (text.strip().lower() == "true")


# --- slots -----------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "value"), [("", None), ("1", 1), (" 1024 ", 1024), ("7", 7)])
def test_good_slots(raw: str, value: int | None) -> None:
    assert inputs(slots=raw).slots == value


@pytest.mark.parametrize("raw", ["0", "00", "1025", "99999999999999999999"])
def test_slots_out_of_range(raw: str) -> None:
    assert refused(slots=raw) == f"slots must be between 1 and 1024, not {raw!r}"


@pytest.mark.parametrize(
    "raw", ["1.5", "two", "1e3", "0x10", "\x00", "-1", "+1", "1_0", "\u0663", "1 0"]
)
def test_slots_not_whole(raw: str) -> None:
    assert refused(slots=raw) == f"slots must be a whole number, not {raw!r}"


@pytest.mark.parametrize(
    "remote", ["https://example.com/r.git", "self", "file:///srv/locks.git", "git@h:r.git"]
)
def test_slots_shared_and_reentrant_refused_with_a_git_remote(remote: str) -> None:
    assert "cannot be used with a git remote" in refused(remote=remote, slots="2")
    assert "cannot be used with a git remote" in refused(remote=remote, shared="true")
    # As the CLI refuses --reentrant there: ignored, the run waited on its job's own hold.
    said = refused(remote=remote, reentrant="true")
    assert said == "reentrant cannot be used with a git remote", said
    assert inputs(remote=remote).remote == remote


def test_slots_and_shared_with_postgres() -> None:
    assert inputs(remote="postgresql://u@h/db", slots="2").slots == 2
    assert inputs(remote="postgresql://u@h/db", shared="true").shared


# --- if-locked, annotations ------------------------------------------------------------


@pytest.mark.parametrize(("raw", "value"), [("", "fail"), ("fail", "fail"), (" SKIP", "skip")])
def test_if_locked(raw: str, value: str) -> None:
    assert inputs(if_locked=raw).if_locked == value


@pytest.mark.parametrize("raw", ["wait", "skipped", "true", "\x00"])
def test_bad_if_locked(raw: str) -> None:
    assert refused(if_locked=raw) == f"if-locked must be 'fail' or 'skip', not {raw!r}"


@pytest.mark.parametrize(
    ("raw", "value"),
    [("", "always"), ("always", "always"), ("Waited", "waited"), (" never ", "never")],
)
def test_annotations(raw: str, value: str) -> None:
    assert inputs(annotations=raw).annotations == value


@pytest.mark.parametrize("raw", ["sometimes", "none", "false", "\x00"])
def test_bad_annotations(raw: str) -> None:
    msg = refused(annotations=raw)
    assert msg.startswith("annotations must be one of always, waited, never")
    assert repr(raw) in msg


# --- fuzz: any inputs are parsed or refused with a ValidationError ----------------------

KEYS = [
    "MODE",
    "NAME",
    "RUN",
    "LOCK_DIR",
    "WAIT_SECONDS",
    "TIMEOUT_SECONDS",
    "TTL_SECONDS",
    "SHARED",
    "REENTRANT",
    "FORCE",
    "MESSAGE",
    "TOKEN",
    "SLOTS",
    "REMOTE",
    "KEY_PREFIX",
    "IF_LOCKED",
    "ANNOTATIONS",
]
VALUES = st.sampled_from(
    ["", "true", "false", "run", "hold", "check", "1", "0", "-1", "nan", "1e400", "skip", "never"]
) | st.text(max_size=6)


@given(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=8))
@settings(
    derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
def test_any_inputs_parse_or_are_refused(values: dict[str, str]) -> None:
    env = {INPUT_PREFIX + k: v for k, v in values.items()}
    try:
        i = ActionInputs(env)
    except ValidationError as exc:
        assert str(exc) and exc.exit_code == 2
        return
    assert i.mode in ("run", "hold", "release", "check")
    assert i.slots is None or 1 <= i.slots <= 1024
    for value in (i.wait, i.timeout, i.ttl):
        assert value is None or (math.isfinite(value) and 0 <= value <= 1e9)


# --- inputs a mode does not use ----------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "key", "value"),
    [
        ("hold", "shared", "true"),
        ("hold", "timeout_seconds", "5"),
        ("hold", "reentrant", "true"),
        ("run", "ttl_seconds", "5"),
        ("run", "token", "t"),
        ("run", "force", "true"),
        ("check", "if_locked", "skip"),
        ("check", "wait_seconds", "0"),
    ],
)
def test_an_input_the_mode_does_not_use_is_refused(mode: str, key: str, value: str) -> None:
    """Ignored, ``shared: true`` on a hold took an exclusive one without a word."""
    msg = refused(mode=mode, name="n", **{key: value})
    assert msg == f"{key.replace('_', '-')}: not used by mode: {mode}"


def test_the_defaults_of_every_input_suit_every_mode() -> None:
    defaults = {"if_locked": "fail", "shared": "false", "reentrant": "false", "force": "false"}
    for mode in ("run", "hold", "release", "check"):
        run = {"run": "true"} if mode == "run" else {}
        assert inputs(mode=mode, name="n", **defaults, **run).mode == mode


def test_a_release_with_inputs_it_does_not_use_still_releases() -> None:
    """A release step copied from its hold's (message, wait-seconds): refusing it would
    leave the hold held; it is noted for a warning instead."""
    i = inputs(mode="release", name="n", message="m", wait_seconds="1")
    assert i.unused == "wait-seconds, message: not used by mode: release"


def test_an_empty_remote_is_refused_and_a_left_out_one_is_the_jobs_default() -> None:
    """``remote: ${{ secrets.LOCK_URL }}`` with the secret unset (a fork's PR) locked on
    this machine, silently: the other machines' runs were not excluded."""
    for empty in ("", "  "):
        assert refused(name="n", run="m", remote=empty).startswith("remote is empty")
    job_wide_too = {INPUT_PREFIX + "REMOTE": "", "LOCAL_MUTEX_REMOTE": "https://h/r.git"}
    with pytest.raises(ValidationError, match=r"leave the input out to lock on \$LOCAL_MUTEX"):
        ActionInputs(job_wide_too)
    assert inputs(name="n", run="m").remote is None  # left out: this machine
    assert inputs(name="n", run="m", remote="$LOCAL_MUTEX_REMOTE").remote is None
    job_wide = {"LOCAL_MUTEX_REMOTE": "https://h/r.git"}
    left_out = {INPUT_PREFIX + "NAME": "n", INPUT_PREFIX + "RUN": "m"}
    assert ActionInputs({**left_out, **job_wide}).remote == "https://h/r.git"
    sentinel = {**left_out, INPUT_PREFIX + "REMOTE": "$LOCAL_MUTEX_REMOTE", **job_wide}
    assert ActionInputs(sentinel).remote == "https://h/r.git"


@pytest.mark.parametrize("remote", ["$LOCAL_MUTEX_REMOTE", "postgresql://h/db"])
def test_key_prefix_is_refused_where_there_is_no_branch(remote: str) -> None:
    """As the CLI's --key-prefix: ignored, it would leave a user thinking a prefix of theirs
    kept their locks apart. The default (and an empty value) is no choice of the user's."""
    message = refused(name="n", run="make", remote=remote, key_prefix="team-a/")
    assert "key-prefix is for git remotes" in message
    for value in ("lock__", ""):
        assert inputs(name="n", run="make", remote=remote, key_prefix=value).key_prefix == value
    assert inputs(remote="https://h/r.git", key_prefix="team-a/").key_prefix == "team-a/"


def test_lock_dir_with_a_remote_input_is_refused() -> None:
    assert "a remote lock has none" in refused(name="n", run="m", remote="self", lock_dir="/d")
    job_wide = ActionInputs(
        {INPUT_PREFIX + "NAME": "n", INPUT_PREFIX + "LOCK_DIR": "/d", "LOCAL_MUTEX_REMOTE": "self"}
    )
    assert job_wide.remote == "self" and job_wide.lock_dir == "/d"


def test_slots_and_shared_are_refused_in_the_inputs_words() -> None:
    message = refused(name="n", run="m", slots="2", shared="true")
    assert "slots and shared exclude each other" in message and "--" not in message


@pytest.mark.parametrize(
    ("cli", "action"),
    [
        ("--message is 9 characters long", "message is 9 characters long"),
        ("--remote 'x' is not a lock address", "remote 'x' is not a lock address"),
        ("--ttl must be more than 0 seconds", "ttl-seconds must be more than 0 seconds"),
        ("--slots cannot be --shared", "slots cannot be shared"),
        ("use --no-wait or --wait 5", "use --no-wait or --wait 5"),  # not inputs by name
        ("a --remote-ish word, x--remote", "a --remote-ish word, x--remote"),
    ],
)
def test_errors_in_input_words(cli: str, action: str) -> None:
    assert in_words(cli, input_words({INPUT_PREFIX + "REMOTE": "r"})) == action


def test_an_address_from_the_environment_is_named_so() -> None:
    """The remote input left out: the address is $LOCAL_MUTEX_REMOTE's, not the input's."""
    words = input_words({"LOCAL_MUTEX_REMOTE": "x"})
    assert in_words("--remote 'x' is not a lock address", words) == (
        "$LOCAL_MUTEX_REMOTE 'x' is not a lock address"
    )
    assert in_words("--message is too long", words) == "message is too long"
