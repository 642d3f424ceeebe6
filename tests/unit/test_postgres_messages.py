"""What the PostgreSQL driver says, as local-mutex passes it on."""

from __future__ import annotations

from local_mutex.backends.postgres.connect import driver_message

CLOSED = (
    "server closed the connection unexpectedly\n\tThis probably means the server terminated "
    "abnormally\n\tbefore or while processing the request.\n"
)


def test_the_servers_own_reason_is_not_followed_by_libpqs_guess() -> None:
    """A waiter whose session an administrator ended was told the server "probably
    terminated abnormally" (it had not) after the real reason."""
    said = "consuming input failed: terminating connection due to administrator command\n"
    assert driver_message(said + CLOSED) == "terminating connection due to administrator command"


def test_a_connection_closed_with_no_reason_keeps_libpqs_words() -> None:
    assert driver_message(CLOSED).startswith("server closed the connection unexpectedly")
    assert driver_message("connection failed: could not connect") == "could not connect"
