"""Passwords in remote URLs never shown, however malformed the URL holding them."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from local_mutex.backends.secrets import has_password, hide_secrets, mask, secrets_of

# What a password may hold, raw: the delimiters a URL parser stops at included -- but not a
# raw "?" after a raw "/", which reads as a path and a query (see secrets._userinfo_password).
_PASSWORD = st.text(
    string.ascii_letters + string.digits + "/?#@%:+=", min_size=8, max_size=24
).filter(lambda p: "?" not in p[p.find("/") :] if "/" in p else True)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:SEC/RET@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:SEC@RET@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:SEC?RET@h/db", "postgresql://u:***@h/db"),
        (
            "postgresql://u:pw@h/db?application_name=a@b",
            "postgresql://u:***@h/db?application_name=a@b",
        ),
        ("postgresql://h/db?password=pw&x=1", "postgresql://h/db?password=***&x=1"),
        (
            "https://x-access-token:TOK@github.com/o/r.git",
            "https://x-access-token:***@github.com/o/r.git",
        ),
        ("postgresql://u:@h/db", "postgresql://u:@h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("git://h:9418/r.git", "git://h:9418/r.git"),
        # An @ past the host is no userinfo: Azure's user@server, a name, a path.
        (
            "postgresql://h:5432/db?user=ci@server&sslmode=off",
            "postgresql://h:5432/db?user=ci@server&sslmode=off",
        ),
        ("postgresql://h/db?application_name=a@b", "postgresql://h/db?application_name=a@b"),
        ("git://h:9418/path@x/r.git", "git://h:9418/path@x/r.git"),
        ("postgresql://u:ab/cd+ef==@h/db", "postgresql://u:***@h/db"),  # base64, raw
        # A raw / and then a raw ? in a password: "u:ab" cannot be a host and its port.
        ("postgresql://u:ab/SECRET1?x@h:5/db", "postgresql://u:***@h:5/db"),
        ("postgresql://[::1]:5432/db?user=a@b", "postgresql://[::1]:5432/db?user=a@b"),
        # libpq decodes a parameter's key, and sslpassword unlocks the client's key.
        ("postgresql://h/db?pass%77ord=SECRET2", "postgresql://h/db?pass%77ord=***"),
        ("postgresql://h/db?sslpassword=SECRET3&a=b", "postgresql://h/db?sslpassword=***&a=b"),
    ],
)
def test_mask(url: str, shown: str) -> None:
    assert mask(url) == shown
    assert has_password(url) == (shown != url)


def test_pieces_a_driver_split_the_password_into_are_hidden_too() -> None:
    url = "postgresql://postgres:SECRET/WORD@127.0.0.1:5/postgres"
    said = 'invalid integer value "SECRET/WORD@127.0.0.1:5" for port; host "WORD@127.0.0.1"'
    assert "SECRET" not in hide_secrets(said, url) and "WORD" not in hide_secrets(said, url)
    encoded = "postgresql://u:SEC%ZZRET@h/db"  # an invalid escape: quoted as written
    assert hide_secrets('invalid percent-encoded token: "SEC%ZZRET"', encoded).count("***") == 1
    assert "p%40ss" in secrets_of("postgresql://u:p%40ss@h/db")
    assert "p@ss" in secrets_of("postgresql://u:p%40ss@h/db")  # and as the server gets it


def test_a_short_password_is_hidden_where_a_url_holds_it_not_in_every_word() -> None:
    url = "http://user:a@git.example/r.git"
    said = f"fatal: unable to access '{url}': Failed to connect"
    assert hide_secrets(said, url) == (
        "fatal: unable to access 'http://user:***@git.example/r.git': Failed to connect"
    )


@given(_PASSWORD, st.sampled_from(["postgresql", "postgres", "https", "http"]))
def test_no_password_survives_masking(password: str, scheme: str) -> None:
    url = f"{scheme}://user:{password}@db.example:5432/name"
    assume(password not in url.replace(password, "", 1))  # not also the URL's other text
    assume(not re.match(r"\d{1,5}/", password))  # a port and a path, as secrets reads it
    assert password not in mask(url)
    quoted = f"error connecting to {url}: bad password {password!r} for user"
    assert password not in hide_secrets(quoted, url)


def test_a_query_password_runs_to_the_next_ampersand() -> None:
    """libpq takes ``password=ab#cdSECRETQ`` whole (it has no fragment): cut at the ``#``,
    the mask showed ``***#cdSECRETQ`` and a nested call was given the password "ab"."""
    from local_mutex.backends.postgres.address import password_of, without_password

    url = "postgresql://w4@127.0.0.1:5432/postgres?password=ab#cdSECRETQ&sslmode=disable"
    assert "SECRETQ" not in mask(url) and mask(url).endswith("password=***&sslmode=disable")
    assert password_of(url) == "ab#cdSECRETQ"
    assert without_password(url) == "postgresql://w4@127.0.0.1:5432/postgres?sslmode=disable"
    assert "SECRETQ" not in hide_secrets(f"failed for {url} (ab#cdSECRETQ)", url)
