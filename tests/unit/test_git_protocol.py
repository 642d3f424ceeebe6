"""lock-action's commit protocol, read as untrusted input: anyone who can push to the lock
repository writes these messages, so a bad one is NotALock or BadBody naming the branch,
never another exception."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from local_mutex.backends import check_address, is_git_address
from local_mutex.backends.git.plumbing import ended, refused_for_good, why
from local_mutex.backends.git.protocol import (
    MAX_BODY,
    BadBody,
    NotALock,
    RemoteState,
    branch_for,
    describe,
    format_message,
    parse_message,
)
from local_mutex.errors import BadAddress, InvalidName, ValidationError

OID = "0123456789abcdef0123456789abcdef01234567"
REF = "refs/heads/lock__the-name"
FAST = settings(
    derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def bad(text: str, kind: type[ValidationError] = BadBody) -> str:
    with pytest.raises(kind) as info:
        parse_message(OID, text, REF)
    msg = str(info.value)
    assert REF in msg and OID[:12] in msg, msg
    assert info.value.exit_code == 2
    return msg


# --- lock-action's own format ---------------------------------------------------------------

LOCK_ACTION_BODY = {
    "message": "test",
    "state": "lock",
    "actor": "suzuki-shunsuke",
    "github_actions_workflow_run_url": "https://github.com/o/r/actions/runs/1",
    "pull_request_number": 237,
}


@pytest.mark.parametrize("indent", [None, 2])
def test_lock_action_lock_commit(indent: int | None) -> None:
    text = "lock by suzuki-shunsuke: test\n" + json.dumps(LOCK_ACTION_BODY, indent=indent) + "\n"
    st_ = parse_message(OID, text, REF)
    assert (st_.oid, st_.state, st_.actor, st_.message) == (OID, "lock", "suzuki-shunsuke", "test")
    assert st_.body == LOCK_ACTION_BODY
    assert st_.locked and not st_.expired() and st_.expires_at is None
    d = st_.as_dict()
    assert d["state"] == "lock" and d["locked"] is True and d["pull_request_number"] == 237
    assert "suzuki-shunsuke" in describe(st_) and "runs/1" in describe(st_)


def test_lock_action_unlock_commit() -> None:
    body = {**LOCK_ACTION_BODY, "state": "unlock"}
    st_ = parse_message(OID, "unlock by suzuki-shunsuke: test\n" + json.dumps(body), REF)
    assert st_.state == "unlock" and not st_.locked
    assert st_.as_dict()["locked"] is False


@pytest.mark.parametrize(
    ("text", "state", "actor", "message"),
    [
        ("lock by octo: deploying", "lock", "octo", "deploying"),
        ("unlock by octo: done\n", "unlock", "octo", "done"),
        ("lock by octo", "lock", "octo", ""),
        ("  lock by octo:  a: b  \n\n", "lock", "octo", "a: b"),
        ("lock by : x", "lock", "", "x"),
        ('unlock by a: b\n{"state": "unlock"}', "unlock", "a", "b"),  # they agree
        ('lock by a: b\n{"state": null}', "lock", "a", "b"),  # no say
        ('lock by a: b\n{"actor": "", "message": ""}', "lock", "a", ""),
    ],
)
def test_first_line(text: str, state: str, actor: str, message: str) -> None:
    st_ = parse_message(OID, text, REF)
    assert (st_.state, st_.actor, st_.message) == (state, actor, message)


@pytest.mark.parametrize(
    ("first", "state"),
    [
        ("unlock", '"lock"'),
        ("lock", '"unlock"'),
        ("lock", '"weird"'),
        ("lock", '"LOCK"'),
        ("lock", '""'),
        ("lock", '["lock"]'),
        ("unlock", '{"state": "unlock"}'),
        ("lock", "true"),
        ("lock", "1"),
    ],
)
def test_body_state_disagreeing_with_the_first_line(first: str, state: str) -> None:
    """Which one would be the truth? Neither is trusted: BadBody, naming the branch."""
    msg = bad(f"{first} by a: b\n" + '{"state": ' + state + "}")
    assert f"says {first!r} on its first line" in msg, msg


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "Merge branch 'main'",
        "locked by x: y",
        "lock x: y",
        "lock by",
        "lock by ",
        "LOCK by x: y",
        "relock by x",
        "\nlock by x: y",
        '{"state": "lock"}',
    ],
)
def test_not_a_lock(text: str) -> None:
    msg = bad(text, NotALock)
    assert "is not a lock" in msg


# --- our own format -----------------------------------------------------------------------


def test_format_message_round_trip() -> None:
    body = {
        "host": "h",
        "pid": 12,
        "holder_id": "abcd",
        "expires_at": 1.7e9 + 0.5,
        "token_sha256": "f" * 64,
        "github_actions_workflow_run_url": None,
        "pull_request_number": None,
    }
    text = format_message("lock", "octo", "deploy\n  now", body)
    assert text.startswith("lock by octo: deploy now\n")
    st_ = parse_message(OID, text, REF)
    assert (st_.state, st_.actor, st_.message) == ("lock", "octo", "deploy\n  now")
    assert st_.expires_at == 1.7e9 + 0.5 and st_.holder_id == "abcd"
    assert st_.expired(now=1.8e9) and not st_.expired(now=1.6e9)
    assert json.loads(text.partition("\n")[2]) == {
        "message": "deploy\n  now",
        "state": "lock",
        "actor": "octo",
        **body,
    }


ACTORS = st.text(st.characters(blacklist_categories=["Cs"]))
MESSAGES = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)
BODY_VALUES = st.none() | st.booleans() | st.integers() | st.text(max_size=10)


@FAST
@given(
    st.sampled_from(["lock", "unlock"]),
    ACTORS.filter(lambda a: a.strip() == a and ":" not in a and " by " not in a),
    MESSAGES,
    st.dictionaries(
        st.text(max_size=8).filter(lambda k: k not in ("expires_at", "state", "actor", "message")),
        BODY_VALUES,
        max_size=5,
    ),
    st.none() | st.floats(0, 1e11),
)
def test_format_message_round_trips(
    state: str, actor: str, message: str, extra: dict[str, Any], expires: float | None
) -> None:
    body = {**extra, "expires_at": expires}
    text = format_message(state, actor, message, body)
    first = text.partition("\n")[0]
    assert first == f"{state} by {' '.join(actor.split()) or '?'}: {' '.join(message.split())}"
    parsed = parse_message(OID, text, REF)
    # The body keeps the actor as given; an empty one reads back as the first line's "?".
    assert (parsed.state, parsed.actor, parsed.message) == (state, actor or "?", message)
    assert parsed.expires_at == expires
    for key, value in extra.items():
        assert parsed.body[key] == value


@pytest.mark.parametrize("actor", ["a\nb", "a\r\nb", " a \n\n b\t", "\n"])
def test_format_message_with_a_newline_in_the_actor(actor: str) -> None:
    text = format_message("lock", actor, "m\nn", {"holder_id": "h"})
    first, _, body = text.partition("\n")
    # the first line flattens the whitespace; the body keeps the actor as it was
    assert first == f"lock by {' '.join(actor.split()) or '?'}: m n"
    assert json.loads(body)["actor"] == actor
    parsed = parse_message(OID, text, REF)
    assert (parsed.state, parsed.actor, parsed.message) == ("lock", actor, "m\nn")
    assert parsed.holder_id == "h" and parsed.locked


def test_an_actor_only_on_the_first_line_is_the_flattened_one() -> None:
    text = format_message("lock", "a\nb", "m", {})
    first = text.partition("\n")[0]
    parsed = parse_message(OID, first + "\n" + json.dumps({"message": "m"}), REF)
    assert parsed.actor == "a b"


# --- untrusted bodies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "expires",
    [
        "1e400",
        "-1e400",
        "1e309",
        "-1",
        "1e12",
        "true",
        '"soon"',
        '"2024-13-01T00:00:00Z"',
        '"2024-01-01 00:00:00"',
        '"' + "9" * 100 + '"',
        "[]",
        "{}",
    ],
)
def test_expires_at_that_is_not_a_time(expires: str) -> None:
    msg = bad('lock by x: y\n{"expires_at": ' + expires + "}")
    assert "lease end that is not a time" in msg


@pytest.mark.parametrize("digits", ["1" + "0" * 400, "-1" + "0" * 400, "9" * 309])
def test_expires_at_huge_integer(digits: str) -> None:
    msg = bad('lock by x: y\n{"expires_at": ' + digits + "}")
    assert "lease end that is not a time" in msg


@pytest.mark.parametrize(
    ("expires", "epoch"),
    [("0", 0.0), ("1700000000", 1.7e9), ("1.5e9", 1.5e9), ('"2001-09-09T01:46:40Z"', 1e9)],
)
def test_expires_at_times(expires: str, epoch: float) -> None:
    st_ = parse_message(OID, 'lock by x: y\n{"expires_at": ' + expires + "}", REF)
    assert st_.expires_at == epoch and st_.expired(now=epoch) and not st_.locked


def test_expires_at_null_is_no_lease() -> None:
    st_ = parse_message(OID, 'lock by x: y\n{"expires_at": null}', REF)
    assert st_.expires_at is None and st_.locked


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_nesting(opener: str) -> None:
    msg = bad("lock by x: y\n" + opener * 100_000)
    assert "not usable JSON" in msg
    bad('lock by x: y\n{"a":' + opener * 100_000 + "1" + "]" * 100_000 + "}")


def test_big_body() -> None:
    filler = "x" * (2 * 1024 * 1024)
    msg = bad('lock by x: y\n{"message": "' + filler + '"}')
    assert "not usable JSON" in msg and "longer than" in msg
    just_fits = '{"m": "' + "x" * (MAX_BODY - 10) + '"}'
    assert len(just_fits) <= MAX_BODY
    assert parse_message(OID, "lock by x: y\n" + just_fits, REF).body["m"]


@pytest.mark.parametrize("body", ["[]", "1", '"text"', "null", "true", "[{}]"])
def test_non_object_body(body: str) -> None:
    assert "not a JSON object" in bad("lock by x: y\n" + body)


@pytest.mark.parametrize(
    "body", ["{", "{]", "not json", "{'a': 1}", '{"a": NaN}', '{"a": 1}}', "\x00"]
)
def test_malformed_body(body: str) -> None:
    assert "not usable JSON" in bad("lock by x: y\n" + body)


@pytest.mark.parametrize(
    ("body", "actor", "message"),
    [
        ('{"actor": ["a", "b"], "message": 7}', "['a', 'b']", "7"),
        ('{"actor": null, "message": null}', "x", ""),
        ('{"actor": 1.5, "message": {"a": 1}}', "1.5", "{'a': 1}"),
        ('{"actor": true, "message": false}', "True", "False"),
        ('{"state": "lock", "holder_id": 12}', "x", "y"),
    ],
)
def test_wrong_types_are_handled(body: str, actor: str, message: str) -> None:
    st_ = parse_message(OID, "lock by x: y\n" + body, REF)
    assert (st_.state, st_.actor, st_.message) == ("lock", actor, message)
    assert isinstance(st_.holder_id, str)
    assert isinstance(describe(st_), str)
    json.dumps(st_.as_dict())


def test_wrong_types_in_describe() -> None:
    body = '{"host": ["h"], "github_actions_workflow_run_url": {"u": 1}, "expires_at": 1e9}'
    text = describe(parse_message(OID, "lock by x: y\n" + body, REF))
    assert "on ['h']" in text and "{'u': 1}" in text


def test_body_cannot_spoof_computed_fields() -> None:
    body = json.dumps(
        {
            "locked": False,
            "expired": True,
            "oid": "spoofed",
            "expires_at": "2100-01-01T00:00:00Z",
            "holder_id": "h",
        }
    )
    st_ = parse_message(OID, "lock by x: y\n" + body, REF)
    d = st_.as_dict()
    assert (d["oid"], d["locked"], d["expired"]) == (OID, True, False)
    assert (d["state"], d["actor"], d["message"]) == ("lock", "x", "y")
    assert d["expires_at"] == st_.expires_at == 4102444800.0  # computed, not the body's text
    assert d["holder_id"] == "h"  # the body's own fields are still there


def test_as_dict_computed_fields_for_an_expired_lease() -> None:
    body = '{"locked": true, "expired": false, "state": "lock", "expires_at": 1}'
    d = parse_message(OID, "lock by x: y\n" + body, REF).as_dict()
    assert (d["locked"], d["expired"], d["expires_at"]) == (False, True, 1.0)


# --- fuzz: any message is a RemoteState, NotALock or BadBody --------------------------------

FIRST_LINES = st.sampled_from(["lock by a: b", "unlock by a:", "lock by x", "lock", ""]) | st.text(
    max_size=20
)
BODIES = (
    st.text(max_size=60)
    | st.text(st.sampled_from('{}[]":,0123456789.eE-+ntrufalse\\'), max_size=40)
    | st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**64), 2**64)
        | st.floats()
        | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=10,
    ).map(json.dumps)
    | st.dictionaries(
        st.sampled_from(["expires_at", "state", "actor", "message", "holder_id", "host"]),
        st.none()
        | st.booleans()
        | st.floats()
        | st.integers(-(10**20), 10**20)
        | st.integers(10**308, 10**400)  # past float range
        | st.sampled_from(["lock", "unlock"])
        | st.text(max_size=20)
        | st.lists(st.integers(), max_size=2),
    ).map(json.dumps)
)


@FAST
@given(FIRST_LINES, BODIES)
@example("lock by a: b", '{"expires_at": 1e400}')
@example("lock by a: b", "[" * 10_000)
@example("lock by a: b", '{"expires_at": "2024-02-30T00:00:00Z"}')
@example("lock by a: b", '{"expires_at": 1' + "0" * 400 + "}")
@example("unlock by a: b", '{"state": "lock"}')
def test_any_message(first: str, body: str) -> None:
    text = first + "\n" + body
    try:
        st_ = parse_message(OID, text, REF)
    except (NotALock, BadBody) as exc:
        assert REF in str(exc)
        return
    assert isinstance(st_, RemoteState)
    assert st_.state in ("lock", "unlock")
    assert st_.state == first.strip().partition(" by ")[0]  # the body never overrides it
    assert isinstance(st_.actor, str) and isinstance(st_.message, str)
    assert st_.expires_at is None or 0 <= st_.expires_at <= 1e11
    assert isinstance(st_.locked, bool)
    assert isinstance(describe(st_), str)
    assert isinstance(st_.holder_id, str)


# --- branch names ---------------------------------------------------------------------------


def test_branch_for_refuses_an_empty_prefix() -> None:
    with pytest.raises(ValidationError, match="--key-prefix must not be empty"):
        branch_for("name", "")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_branch_for() -> None:
    assert branch_for("deploy-prod", "lock__") == "refs/heads/lock__deploy-prod"
    assert branch_for("a/b", "locks/") == "refs/heads/locks/a/b"
    for name in ["", "a b", "a..b", "a~1", "a^", "a:b", "a?", "a*", "a[", "a\\b", "x.lock", "\x7f"]:
        with pytest.raises(ValidationError) as info:
            branch_for(name, "lock__")
        assert "branch" in str(info.value)
    with pytest.raises(ValidationError, match="not a valid git branch name"):
        branch_for("a\nb", "lock__")


def test_branch_for_refuses_a_name_that_is_not_utf8() -> None:
    # What ``names.display`` makes of the byte 0xFF (a name from argv or the API).
    name = b"deploy-\xff".decode("utf-8", "surrogateescape")
    with pytest.raises(InvalidName, match=r"'deploy-\\xff' cannot be a git branch name.*UTF-8"):
        branch_for(name, "lock__")
    assert branch_for("déploiement", "lock__") == "refs/heads/lock__déploiement"


# --- which addresses are git remotes --------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "self",
        "https://github.com/acme/locks.git",
        "http://127.0.0.1:8080/locks.git",
        "ssh://git@github.com/acme/locks.git",
        "git://127.0.0.1:9418/locks.git",
        "file:///srv/locks.git",
        "git@github.com:acme/locks.git",
        "host:locks.git",
        "[::1]:locks.git",
        "git@[::1]:locks.git",
        "https://user:token@[::1]:8443/locks.git",
        "file:///srv/my locks.git",
    ],
)
def test_documented_git_addresses(address: str) -> None:
    assert is_git_address(address)
    check_address(address)


@pytest.mark.parametrize(
    "address",
    [
        "/tmp",
        "./locks.git",
        "locks.git",
        "garbage",
        "postgresq://h/x",
        "htps://github.com/acme/locks.git",
        "file://",
        "https://",
        "ext::sh -c evil",
        ":path",
        "host:",
        "a/b:c",
        "my host:path",
        "https:// 127.0.0.1/x",
        "https:///x",
        "ssh://-oProxyCommand=x/y",
        "ssh://git@-oProxyCommand=x/y",
        "-oProxyCommand=touch:x",
        "git@-oProxy:x",
    ],
)
def test_other_addresses_are_refused(address: str) -> None:
    assert not is_git_address(address)
    with pytest.raises(BadAddress) as info:
        check_address(address)
    assert "is not a lock address" in str(info.value) and "file:///path" in str(info.value)
    assert info.value.exit_code == 2


def test_postgres_addresses_are_not_git() -> None:
    check_address("postgresql://ci@db/locks")
    check_address("postgres://ci@db/locks")


# --- git's stderr, as one line --------------------------------------------------------------

ADVICE = (
    "fatal: Could not read from remote repository.\n\n"
    "Please make sure you have the correct access rights\nand the repository exists.\n"
)


@pytest.mark.parametrize(
    ("stderr", "cause"),
    [
        (
            "ssh: Could not resolve hostname nonexistent.invalid: Name or service not known\n"
            + ADVICE,
            "ssh: Could not resolve hostname nonexistent.invalid: Name or service not known",
        ),
        (
            "fatal: '/tmp' does not appear to be a git repository\n" + ADVICE,
            "fatal: '/tmp' does not appear to be a git repository",
        ),
        (
            "fatal: unable to connect to 127.0.0.1:\n"
            "127.0.0.1[0: 127.0.0.1]: errno=Connection refused\n",
            "fatal: unable to connect to 127.0.0.1: "
            "127.0.0.1[0: 127.0.0.1]: errno=Connection refused",
        ),
        (
            "remote: Repository not found.\n"
            "fatal: repository 'https://github.com/a/b.git/' not found\n",
            "remote: Repository not found.; "
            "fatal: repository 'https://github.com/a/b.git/' not found",
        ),
        (
            "remote: error: cannot lock ref 'refs/heads/x': Unable to create "
            "'/srv/r/refs/heads/x.lock': File exists.        \nremote: \n"
            "remote: Another git process seems to be running in this repository, e.g.        \n"
            "remote: an editor opened by 'git commit'. Please make sure all processes        \n"
            "error: failed to push some refs to 'git://h/r'\n",
            "remote: error: cannot lock ref 'refs/heads/x': Unable to create "
            "'/srv/r/refs/heads/x.lock': File exists.",
        ),
        ("hint: only a hint\n", ""),
        ("", ""),
        # A server that closed the connection: git says nothing but its advice about access
        # rights, which is then no cause at all.
        (
            "fatal: Could not read from remote repository.\n\n"
            "Please make sure you have the correct access rights\n"
            "and the repository exists.\n",
            "the remote closed the connection or refused it (git said no more)",
        ),
    ],
)
def test_why_keeps_the_cause_not_the_advice(stderr: str, cause: str) -> None:
    assert why(stderr) == cause


@pytest.mark.parametrize(
    ("stderr", "for_good"),
    [
        (
            "remote: error: cannot lock ref 'refs/heads/lock__a/b': 'refs/heads/lock__a' "
            "exists; cannot create 'refs/heads/lock__a/b'        \n",
            "'refs/heads/lock__a' exists; cannot create",
        ),
        (
            "remote: error: cannot lock ref 'refs/heads/lock__aaa': Unable to create "
            "'/srv/r/./refs/heads/lock__aaa.lock': File name too long        \n",
            "File name too long",
        ),
        (
            "remote: error: cannot lock ref 'refs/heads/x': Unable to create "
            "'/srv/r/refs/heads/x.lock': Permission denied\n",
            "Permission denied",
        ),
        # A race, or what may be one: no verdict.
        (
            "remote: error: cannot lock ref 'refs/heads/x': Unable to create "
            "'/srv/r/refs/heads/x.lock': File exists.\n",
            None,
        ),
        ("remote: error: cannot lock ref 'refs/heads/x': reference already exists\n", None),
        ("remote: error: cannot lock ref 'refs/heads/x': is at 0123 but expected 4567\n", None),
        ("", None),
    ],
)
def test_refused_for_good(stderr: str, for_good: str | None) -> None:
    found = refused_for_good(stderr)
    if for_good is None:
        assert found is None
    else:
        assert found is not None and for_good in found and found.startswith("cannot lock ref")


def test_a_git_process_killed_by_a_signal_says_which() -> None:
    """A real process killed by SIGPIPE (a push whose server hung up) ends -13: said as
    the signal it is, not as "exit -13"."""
    import subprocess

    killed = subprocess.run(["sh", "-c", "kill -PIPE $$"], check=False)
    assert killed.returncode == -13
    assert ended(killed.returncode) == "killed by SIGPIPE"
    assert ended(1) == "exit 1"
    assert ended(-200) == "killed by signal 200"


@pytest.mark.parametrize(
    "address", ["https://h/x\nfoo", "postgresql://h/db\r", "git@h:x\tz", "file:///a\x7f"]
)
def test_an_address_with_a_control_character_is_refused(address: str) -> None:
    with pytest.raises(BadAddress, match="holds a control character") as info:
        check_address(address)
    assert info.value.exit_code == 2
