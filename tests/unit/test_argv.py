"""The click-free command-line parser (``commands.argv``) against its documented forms, and
the option table against the click tree that renders ``--help``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from local_mutex.commands.argv import (
    Parsed,
    asks_version,
    help_args,
    parse,
    verb_first,
    wants_help,
)
from local_mutex.commands.clicktree import tree
from local_mutex.commands.options import (
    EACH,
    HISTORY,
    HOLD,
    LIST,
    OPTIONS,
    POSITIONALS,
    RELEASE,
    RUN,
    STATUS,
    VERBS,
    Option,
    UsageError,
    options_for,
)
from local_mutex.errors import ValidationError
from local_mutex.runspec import MAX_SLOTS

NAMED = (HOLD, RELEASE, STATUS, HISTORY)  # verbs that take exactly NAME


def refused(verb: str, args: Sequence[str]) -> str:
    with pytest.raises(UsageError) as info:
        parse(verb, list(args))
    return str(info.value)


def flags_of(verb: str) -> set[str]:
    return {flag for o in options_for(verb) for flag in o.flags}


# --- the documented forms -----------------------------------------------------------------


def test_run_name_command() -> None:
    p = parse(RUN, ["n", "make deps"])
    assert (p.verb, p.positionals, p.argv) == (RUN, ["n", "make deps"], None)
    assert p.wait() is None  # waits forever by default
    assert p.values["kill_after"] == 5.0
    assert p.given == set()


def test_run_name_command_lock_dir() -> None:
    p = parse(RUN, ["n", "make", "/var/locks"])
    assert p.positionals == ["n", "make", "/var/locks"]
    assert p.text("lock_dir") == "/var/locks"


def test_run_lock_dir_positional_agrees_with_option() -> None:
    p = parse(RUN, ["--lock-dir", "/d", "n", "c", "/d"])
    assert p.text("lock_dir") == "/d"


def test_run_lock_dir_positional_disagrees_with_option() -> None:
    assert "disagree" in refused(RUN, ["--lock-dir", "/a", "n", "c", "/b"])
    assert "disagree" in refused(RUN, ["n", "c x", "/b", "--lock-dir=/a"])


def test_run_relative_lock_dir_positional() -> None:
    assert "must be an absolute path" in refused(RUN, ["n", "c", "rel"])


def test_run_name_dashdash_program() -> None:
    p = parse(RUN, ["n", "--", "make", "-j8", "--wait", "5", "--", "x"])
    assert p.positionals == ["n"]
    assert p.argv == ["make", "-j8", "--wait", "5", "--", "x"]
    assert "wait" not in p.given  # options after -- belong to the program


def test_each_forms() -> None:
    p = parse(EACH, ["build-{}", "make {}"])
    assert (p.positionals, p.argv) == (["build-{}", "make {}"], None)
    p = parse(EACH, ["build-{}", "--", "make", "-k"])
    assert (p.positionals, p.argv) == (["build-{}"], ["make", "-k"])
    assert not p.flag("keep_going")


@pytest.mark.parametrize("verb", NAMED)
def test_name_verbs(verb: str) -> None:
    p = parse(verb, ["the-name"])
    assert p.positionals == ["the-name"] and p.argv is None


def test_list() -> None:
    assert parse(LIST, []).positionals == []
    assert parse(LIST, ["--all", "--json"]).flag("include_free")


# --- options anywhere, --opt=value, clusters -----------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--wait", "3", "--message", "m", "n", "c x"],
        ["n", "--wait", "3", "c x", "--message", "m"],
        ["n", "c x", "--wait=3", "--message=m"],
        ["--message=m", "n", "--wait=3", "c x"],
    ],
)
def test_options_anywhere_before_dashdash(args: list[str]) -> None:
    p = parse(RUN, args)
    assert p.positionals == ["n", "c x"]
    assert p.number("wait") == 3.0 and p.text("message") == "m"
    assert p.given == {"wait", "message"}


def test_equals_value_keeps_later_equals() -> None:
    p = parse(RUN, ["--message=a=b=", "n", "c"])
    assert p.text("message") == "a=b="
    assert parse(RUN, ["--message=", "n", "c"]).text("message") == ""


def test_option_value_may_look_like_an_option() -> None:
    p = parse(RUN, ["--message", "--wait", "n", "c"])
    assert p.text("message") == "--wait" and "wait" not in p.given
    assert parse(HOLD, ["--message", "--", "n"]).text("message") == "--"


def test_flag_with_a_value() -> None:
    assert "takes no value" in refused(RUN, ["--shared=yes", "n", "c"])
    assert "takes no value" in refused(RELEASE, ["--slots=3", "n"])


@pytest.mark.parametrize(
    ("verb", "args"),
    [
        (RUN, ["n", "ls", "-q"]),
        (RUN, ["n", "make", "--timeout", "5"]),
        (RUN, ["n", "ls", "-h"]),
        (RUN, ["-q", "--", "-n", "ls", "-q"]),
        (EACH, ["{}", "echo", "--no-wait"]),
    ],
)
def test_an_option_after_a_one_word_command_is_refused(verb: str, args: list[str]) -> None:
    """Its command's (``ls -q``), or ours? Either reading would run something the caller
    may not have meant (``ls -h`` would print our help and run nothing, exit 0)."""
    message = refused(verb, args)
    command = args[args.index("ls" if "ls" in args else "make" if "make" in args else "echo")]
    assert f"after the one-word command {command!r} may be its option or local-mutex's" in message
    assert "the command must be one quoted argument" in message


def test_options_after_a_quoted_command_or_before_it_are_ours() -> None:
    assert parse(RUN, ["n", "ls -la", "-q"]).flag("quiet")
    # After NAME COMMAND LOCK_DIR (the seed's form, whole): ours, as before.
    p = parse(RUN, ["n", "true", "/locks", "--wait", "5", "-q"])
    assert p.number("wait") == 5.0 and p.flag("quiet") and p.text("lock_dir") == "/locks"
    assert parse(RUN, ["n", "-q", "ls"]).flag("quiet")
    assert parse(EACH, ["{}", "echo {}", "--no-wait"]).flag("no_wait")


def test_an_option_where_a_value_belongs_is_a_missing_value() -> None:
    """``--lock-dir --wait 5 N CMD`` read 5 as NAME and blamed the command for a lock dir."""
    assert "--lock-dir needs a value (DIR)" in refused(RUN, ["--lock-dir", "--wait", "5", "n", "c"])
    assert "--remote needs a value" in refused(RUN, ["--remote", "--no-wait", "n", "c"])
    assert "--wait needs a value" in refused(HOLD, ["--wait", "--ttl=5", "n"])
    assert parse(RUN, ["--message", "--wait", "n", "c"]).text("message") == "--wait"


def test_an_empty_lock_dir_option_is_refused() -> None:
    for verb, args in ((RUN, ["n", "c"]), (STATUS, ["n"]), (LIST, [])):
        assert "--lock-dir is empty" in refused(verb, ["--lock-dir", "", *args])
        assert "--lock-dir is empty" in refused(verb, ["--lock-dir=", *args])


def test_lock_dir_written_two_ways_agrees(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    p = parse(RUN, ["--lock-dir", str(tmp_path / "link"), "n", "c x", str(tmp_path / "real")])
    assert p.text("lock_dir") == str(tmp_path / "real")


def test_no_quoting_hint_for_words_after_a_quoted_command() -> None:
    message = refused(RUN, ["n", "echo x", "/dir", "extra"])
    assert "4 arguments where NAME COMMAND [LOCK_DIR] go" in message and "quoted" not in message
    message = refused(EACH, ["{}", "echo hi", "/tmp"])
    assert "each takes TEMPLATE COMMAND (a lock dir: --lock-dir)" in message


def test_slots_takes_no_count_with_status_and_release() -> None:
    for verb in (STATUS, RELEASE):
        assert f"--slots takes no count with {verb}" in refused(verb, ["--slots", "2", "n"])


def test_missing_value() -> None:
    assert "needs a value" in refused(RUN, ["n", "c x", "--wait"])
    assert "needs a value" in refused(HOLD, ["n", "--ttl"])


@pytest.mark.parametrize("verb", VERBS)
def test_short_clusters(verb: str) -> None:
    shorts = sorted(
        f[1]
        for o in options_for(verb)
        for f in o.flags
        if len(f) == 2 and not f.startswith("--") and o.kind == "flag"
    )
    args = {RUN: ["n", "c"], EACH: ["t", "c"], LIST: []}.get(verb, ["n"])
    if not shorts:
        assert "no such option" in refused(verb, ["-qk", *args])
        return
    cluster = "-" + "".join(shorts) * 2  # every short flag, twice over
    p = parse(verb, [cluster, *args])
    dests = {o.dest for o in options_for(verb) if any(f[1:] in shorts for f in o.flags)}
    assert all(p.flag(d) for d in dests)
    assert p.given == dests
    # a letter that is not one of this verb's short flags spoils the whole cluster
    assert "no such option" in refused(verb, [cluster + "Z", *args])


def test_each_cluster() -> None:
    p = parse(EACH, ["-q0k", "t", "c"])
    assert p.flag("quiet") and p.flag("null") and p.flag("keep_going")
    assert "no such option" in refused(RUN, ["-qk", "n", "c"])  # run has no -k
    assert refused(EACH, ["-q=1", "t", "c"]) == "-q takes no value"  # not "-q is each's"
    assert refused(RUN, ["-q=1", "n", "c"]) == "-q takes no value"


# --- -- before and after NAME -------------------------------------------------------------


def test_dashdash_before_name_ends_options() -> None:
    p = parse(RUN, ["--", "-n", "c"])
    assert p.positionals == ["-n", "c"]
    assert parse(STATUS, ["--", "--json"]).positionals == ["--json"]
    assert not parse(STATUS, ["--", "--json"]).flag("json")
    assert parse(HOLD, ["--", "-"]).positionals == ["-"]


def test_dashdash_before_name_then_program() -> None:
    p = parse(RUN, ["--", "-n", "--", "prog", "-q"])
    assert (p.positionals, p.argv) == (["-n"], ["prog", "-q"])
    assert not p.flag("quiet")


def test_options_after_name_once_dashdash_ended_options() -> None:
    p = parse(RUN, ["--", "-n", "--wait", "1", "c"])
    assert p.positionals == ["-n", "c"] and p.number("wait") == 1.0


def test_lone_dash_is_positional() -> None:
    assert parse(RUN, ["-", "-"]).positionals == ["-", "-"]


def test_missing_program_after_dashdash() -> None:
    assert "missing the program after --" in refused(RUN, ["n", "--"])
    assert "missing the program after --" in refused(EACH, ["t", "--"])


def test_command_and_program_both() -> None:
    assert "not both" in refused(RUN, ["n", "c", "--", "x"])
    assert "not both" in refused(EACH, ["t", "c", "--", "x"])


def test_missing_positionals() -> None:
    assert "missing NAME" in refused(RUN, [])
    # after a first `--` ends the options, a second one is the NAME
    assert "missing COMMAND after NAME" in refused(RUN, ["--", "--"])
    assert "missing TEMPLATE" in refused(EACH, ["-k"])
    assert "missing COMMAND after NAME" in refused(RUN, ["n"])
    assert "missing COMMAND after NAME" in refused(RUN, ["n", "-q"])
    assert "missing COMMAND after TEMPLATE" in refused(EACH, ["t"])


# --- the unquoted-command hints -------------------------------------------------------------

HINT = "the command must be one quoted argument"


def test_hint_for_two_words() -> None:
    msg = refused(RUN, ["n", "echo", "hi"])
    assert HINT in msg and "or follow --" in msg
    assert "local-mutex n 'echo hi'" in msg and "local-mutex n -- echo hi" in msg


def test_hint_for_an_unknown_option_after_the_command() -> None:
    msg = refused(RUN, ["n", "make", "-j8"])
    assert "-j8" in msg and HINT in msg
    assert "local-mutex n 'make -j8'" in msg and "local-mutex n -- make -j8" in msg
    msg = refused(RUN, ["n", "ls", "--color=auto"])
    assert HINT in msg and "--color=auto" in msg


def test_no_hint_for_a_quoted_command_and_a_relative_lock_dir() -> None:
    """Quoting the command again would run ``'echo hi' locks``: the lock dir is the fault."""
    for args in (["n", "echo hi", "locks"], ["n", "true", ""], ["n", "true", "  "]):
        msg = refused(RUN, args)
        assert "must be an absolute path" in msg and HINT not in msg, args
    assert HINT in refused(RUN, ["n", "echo", "hi"])


def test_hint_for_many_words() -> None:
    msg = refused(RUN, ["n", "echo", "a", "b"])
    assert HINT in msg and "'echo a b'" in msg
    msg = refused(RUN, ["n", "echo", "/abs", "b"])
    assert HINT in msg


def test_hint_for_each() -> None:
    msg = refused(EACH, ["t-{}", "echo", "hi"])
    assert HINT in msg and "local-mutex each 't-{}' -- echo hi" in msg
    msg = refused(EACH, ["t", "make", "-j8"])
    assert HINT in msg and "local-mutex each t 'make -j8'" in msg


def test_hint_quotes_awkward_names() -> None:
    msg = refused(RUN, ["it's", "echo", "hi"])
    assert "'it'\\''s'" in msg


def test_hint_repeats_the_options_given() -> None:
    """Pasting the suggestion must lock in the same domain, with the same ceilings."""
    msg = refused(RUN, ["--timeout", "60", "--lock-dir", "/tmp", "-q", "demo", "make", "deploy"])
    assert "(local-mutex --timeout 60 --lock-dir /tmp -q demo 'make deploy')" in msg
    assert "(local-mutex --timeout 60 --lock-dir /tmp -q demo -- make deploy)" in msg
    msg = refused(EACH, ["-k", "--shared", "t-{}", "make", "x"])
    assert "(local-mutex each -k --shared 't-{}' 'make x')" in msg


@pytest.mark.parametrize("name", ["status", "list", "-x", "--q"])
def test_hint_puts_a_name_that_reads_as_a_verb_or_an_option_after_double_dash(name: str) -> None:
    """``local-mutex run status make deploy`` was told ``local-mutex status 'make deploy'``,
    which asks for the status of a lock and runs nothing."""
    msg = refused(RUN, ["--", name, "make", "deploy"])
    assert f"(local-mutex -- {name} 'make deploy')" in msg
    assert f"(local-mutex -- {name} -- make deploy)" in msg
    for suggested in (["--", name, "make deploy"], ["--", name, "--", "make", "deploy"]):
        parsed = parse(RUN, suggested)
        assert parsed.positionals[0] == name


def test_a_lock_dir_given_twice_as_the_same_directory_agrees() -> None:
    parsed = parse(RUN, ["--lock-dir", "/tmp/d", "n", "c", "/tmp/d/"])
    assert parsed.text("lock_dir") == "/tmp/d/"
    assert "disagree" in refused(RUN, ["--lock-dir", "/tmp/d", "n", "c", "/tmp/e"])


@pytest.mark.parametrize("args", [["-qh"], ["-hq"], ["status", "-qh", "n"], ["each", "-kh"]])
def test_help_in_a_cluster_of_short_flags_is_help(args: list[str]) -> None:
    assert wants_help(args)


@pytest.mark.parametrize("args", [["-qx"], ["--", "-h"], ["n", "echo -h"]])
def test_what_is_not_a_help_request(args: list[str]) -> None:
    assert not wants_help(args)


def test_hint_keeps_every_word_after_an_unknown_option() -> None:
    """``git clean -fdx -e .env`` was suggested as ``'git clean -fdx'``: without -e .env."""
    msg = refused(RUN, ["n", "git", "clean", "-fdx", "-e", ".env"])
    assert "(local-mutex n 'git clean -fdx -e .env')" in msg
    msg = refused(RUN, ["n", "sed", "-i.bak", "-e", "s/a/b/", "f.txt"])
    assert "(local-mutex n -- sed -i.bak -e s/a/b/ f.txt)" in msg


def test_a_program_option_after_dashes_and_its_name_says_the_dashes_only_ended_ours() -> None:
    """cpu-mutex's ``-- make -j8``: the program's name is the lock's, and its option none
    of ours. Unless the option is ours mistyped and the name no program's."""
    said = "a -- before NAME only ends the options, and 'sh' is the lock's name here"
    assert said in refused(RUN, ["--", "sh", "-c", "echo hi"])
    assert said in refused(RUN, ["--", "sh", "--wiat", "5"])  # sh is a program: its option
    msg = refused(RUN, ["--", "no-such-program-x", "-j8"])
    assert msg.endswith("local-mutex NAME -- no-such-program-x -j8"), msg
    msg = refused(RUN, ["--", "no-such-program-x", "--wiat", "5", "c"])
    assert msg == "no such option: '--wiat' (did you mean --wait?) (see local-mutex run --help)"
    assert said in refused(RUN, ["--", "sh"])  # `-- true`: no command, a program's name
    msg = refused(RUN, ["--", "no-such-program-x"])
    assert msg == "missing COMMAND after NAME (or -- and a program)"
    # Options after the program's name are the program's in the line said to run instead.
    assert refused(RUN, ["-q", "--", "ls", "-q"]).endswith("local-mutex -q NAME -- ls -q")
    msg = refused(RUN, ["--wait", "5", "--", "sh", "-q", "-j8"])
    assert msg.endswith("local-mutex --wait 5 NAME -- sh -q -j8"), msg


def test_flock_hints_only_where_they_apply() -> None:
    """``release NAME -x`` was told locks are exclusive unless --shared: no option of it."""
    assert refused(RELEASE, ["n", "-x"]) == "no such option: '-x' (see local-mutex release --help)"
    assert refused(HOLD, ["n", "-c"]) == "no such option: '-c' (see local-mutex hold --help)"
    assert "exclusive unless --shared" in refused(HOLD, ["n", "-x"])
    assert "COMMAND is one quoted argument" in refused(EACH, ["-c", "t", "c"])


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_after_a_name_behind_dashes_is_not_called_unknown(flag: str) -> None:
    msg = refused(RUN, ["--", "NAME", flag])
    assert msg == f"{flag} after -- is no request for help: see local-mutex run --help"


def test_unknown_option_before_the_command_has_no_hint() -> None:
    msg = refused(RUN, ["--bogus", "n", "c"])
    assert msg == "no such option: '--bogus' (see local-mutex run --help)"
    msg = refused(RUN, ["n", "-j8", "c"])
    assert "no such option" in msg and HINT not in msg


# --- values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--wait", "nan", "needs a number of seconds"),
        ("--wait", "NaN", "needs a number of seconds"),
        ("--wait", "inf", "needs a number of seconds"),
        ("--wait", "-inf", "needs a number of seconds"),
        ("--wait", " 2.5 ", "needs a number of seconds"),
        ("--wait", "1_0", "needs a number of seconds"),
        ("--wait", "\u0663", "needs a number of seconds"),  # ARABIC-INDIC DIGIT THREE
        ("--wait", "-1", "is not between 0 and"),
        ("--wait", "-0.001", "is not between 0 and"),
        ("--wait", "1e9000", "is not between 0 and"),
        ("--wait", "1000000001", "is not between 0 and"),
        ("--wait", "", "needs a number of seconds"),
        ("--wait", "5s", "needs a number of seconds"),
        ("--wait", "0x10", "needs a number of seconds"),
        ("--timeout", "0", "must be more than 0"),
        ("--timeout", "-0", "must be more than 0"),
        ("--timeout", "-5", "must be more than 0 and at most"),
        ("--kill-after", "nan", "needs a number of seconds"),
        ("--kill-after", "1e10", "is not between 0 and"),
        ("--lease", "0", "must be more than 0"),
        ("--poll", "0.0", "must be more than 0"),
        ("--slots", "0", "is not between 1 and 1024"),
        ("--slots", "1025", "is not between 1 and 1024"),
        ("--slots", "-1", "needs a whole number"),
        ("--slots", "+2", "needs a whole number"),
        ("--slots", " 2 ", "needs a whole number"),
        ("--slots", "\u0663", "needs a whole number"),
        ("--slots", "1.5", "needs a whole number"),
        ("--slots", "two", "needs a whole number"),
        ("--slots", "", "needs a whole number"),
    ],
)
def test_bad_values(flag: str, value: str, needle: str) -> None:
    msg = refused(RUN, [flag, value, "n", "c"])
    assert needle in msg and flag in msg
    assert needle in refused(RUN, [f"{flag}={value}", "n", "c"])


def test_a_ttl_says_it_must_be_more_than_zero_whatever_is_wrong() -> None:
    for value in ("-5", "0", "2e9"):
        assert "--ttl" in refused(HOLD, ["--ttl", value, "n"])
        assert "must be more than 0 and at most 1e+09 seconds" in refused(
            HOLD, ["--ttl", value, "n"]
        )


@pytest.mark.parametrize(
    ("flag", "value", "dest", "expected"),
    [
        ("--wait", "0", "wait", 0.0),
        ("--wait", "1e9", "wait", 1e9),
        ("--wait", "+2.5", "wait", 2.5),
        ("--wait", "1E-3", "wait", 0.001),
        ("--timeout", "0.001", "timeout", 0.001),
        ("--kill-after", "0", "kill_after", 0.0),
        ("--slots", "1", "slots", 1),
        ("--slots", str(MAX_SLOTS), "slots", MAX_SLOTS),
    ],
)
def test_good_values(flag: str, value: str, dest: str, expected: float) -> None:
    p = parse(RUN, [flag, value, "n", "c"])
    assert p.values[dest] == expected and dest in p.given


NOT_NUMBERS = ["nan", "NaN", "inf", "-inf", "Infinity", " 2.5 ", "2.5\n", "1_0", "\u0663", "\uff15"]
NUMERIC = [o for o in OPTIONS if o.kind in ("seconds", "positive")]


@pytest.mark.parametrize("option", NUMERIC, ids=lambda o: f"{o.flags[0]}")
@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_numbers_are_plain_digits(option: Option, value: str) -> None:
    """Only 0-9 . e E + -: no NaN/infinity words, padding, underscores or other scripts."""
    verb = sorted(option.verbs)[0]
    positionals = {RUN: ["n", "c"], EACH: ["t", "c"], LIST: []}.get(verb, ["n"])
    flag = option.flags[0]
    expected = f"{flag} needs a number of seconds, not {value!r}"
    assert refused(verb, [flag, value, *positionals]) == expected
    assert refused(verb, [f"{flag}={value}", *positionals]) == expected


@pytest.mark.parametrize("value", ["-1", "+1", " 1", "1 ", "1.0", "1e1", "\u0661", "0x1"])
def test_slots_are_ascii_digits(value: str) -> None:
    assert refused(HOLD, ["--slots", value, "n"]) == f"--slots needs a whole number, not {value!r}"


def test_ttl_for_hold() -> None:
    assert parse(HOLD, ["--ttl", "60", "n"]).number("ttl") == 60.0
    assert "must be more than 0" in refused(HOLD, ["--ttl", "0", "n"])


def test_wait_and_no_wait_conflict() -> None:
    for verb, args in ((RUN, ["n", "c"]), (EACH, ["t", "c"]), (HOLD, ["n"])):
        assert "exclude each other" in refused(verb, ["--wait", "1", "--no-wait", *args])
        assert "exclude each other" in refused(verb, [args[0], "--no-wait", "--wait=0", *args[1:]])
    assert parse(RUN, ["--no-wait", "n", "c"]).wait() == 0.0
    assert parse(RUN, ["--wait", "7", "n", "c"]).wait() == 7.0


def test_last_value_wins() -> None:
    assert parse(RUN, ["--wait", "1", "--wait", "2", "n", "c"]).number("wait") == 2.0


def test_slots_is_a_flag_for_release_and_status() -> None:
    assert parse(RELEASE, ["--slots", "n"]).flag("slotted")
    assert parse(STATUS, ["n", "--slots"]).flag("slotted")
    assert parse(HOLD, ["--slots", "3", "n"]).count("slots") == 3


# --- unknown options and per-verb positional counts -----------------------------------------


@pytest.mark.parametrize("verb", VERBS)
def test_options_of_other_verbs_are_unknown(verb: str) -> None:
    args = {RUN: ["n", "c"], EACH: ["t", "c"], LIST: []}.get(verb, ["n"])
    every = {flag for o in OPTIONS for flag in o.flags}
    for flag in sorted(every - flags_of(verb)):
        msg = refused(verb, [flag, *args])
        owners = sorted({v for o in OPTIONS if flag in o.flags for v in o.verbs})
        assert msg.startswith(f"no such option: {flag!r} ({flag} is an option of "), msg
        assert all(owner in msg for owner in owners) and msg.endswith(
            f"not of {verb}) (see local-mutex {verb} --help)"
        )


@pytest.mark.parametrize("verb", NAMED)
def test_named_verbs_take_one_name(verb: str) -> None:
    assert f"local-mutex {verb} takes NAME, got 0 arguments" in refused(verb, [])
    assert f"local-mutex {verb} takes NAME, got 2 arguments" in refused(verb, ["a", "b"])
    assert "got 2 arguments" in refused(verb, ["--", "a", "--"])


def test_list_takes_nothing() -> None:
    assert "takes no arguments, got 1 argument" in refused(LIST, ["x"])


def test_positionals_table_covers_every_verb() -> None:
    assert set(POSITIONALS) == set(VERBS)


# --- wants_help -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-h"], True),
        (["--help"], True),
        (["n", "c x", "--help"], True),
        (["n", "--help", "c"], True),
        (["n", "c", "--help"], False),  # after a one-word command: ``parse`` asks whose
        (["run", "n", "c", "-h"], False),
        (["each", "t", "c", "-h"], False),
        (["-q", "status", "n", "-h"], True),
        (["status", "-h"], True),
        (["n", "--", "prog", "--help"], False),
        (["--", "-h"], False),
        (["n", "c"], False),
        (["-hq"], True),  # a cluster of short flags, as click reads it
        (["--helpful"], False),
        ([], False),
        (["status", "--slots", "--help"], True),  # a flag of status: no value to skip
        (["release", "--slots", "-h"], True),
        (["--slots", "status", "--help"], True),
        (["n", "--slots", "-h", "c x"], False),  # run's --slots takes a value (refused)
        (["n", "", "-h"], True),  # an empty command ("$CMD" unset) is no one-word command
    ],
)
def test_wants_help(args: list[str], expected: bool) -> None:
    assert wants_help(args) is expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--help"], ["--help"]),
        (["--version", "--help"], ["--help"]),
        (["-h", "--version"], ["--help"]),
        (["status", "--help", "--version"], ["status", "--help"]),
        (["status", "--slots", "--help"], ["status", "--help"]),
        (["n", "--frob", "--help"], ["run", "--help"]),
        (["--json", "--help"], ["run", "--help"]),
        (["-hq", "--timeout"], ["run", "--help"]),
    ],
)
def test_help_is_the_verbs_alone(args: list[str], expected: list[str]) -> None:
    """click parses what it is given, and refuses what our parser takes (``--version``,
    another verb's option) in a multi-line error of its own: it gets the verb alone."""
    assert help_args(args) == expected


# --- drift between the option table and the click tree --------------------------------------


def _click_command(verb: str) -> click.Command:
    group = tree()
    cmd = group.commands[verb]
    assert isinstance(cmd, click.Command)
    return cmd


@pytest.mark.parametrize("verb", VERBS)
def test_click_tree_shows_exactly_the_parsed_options(verb: str) -> None:
    cmd = _click_command(verb)
    shown = {
        flag
        for p in cmd.params
        if isinstance(p, click.Option)
        for flag in (*p.opts, *p.secondary_opts)
    }
    assert shown == flags_of(verb)


@pytest.mark.parametrize("verb", VERBS)
def test_click_tree_kinds_match(verb: str) -> None:
    cmd = _click_command(verb)
    by_flag = {p.opts[0]: p for p in cmd.params if isinstance(p, click.Option)}
    for o in options_for(verb):
        p = by_flag[o.flags[0]]
        assert p.is_flag == (o.kind == "flag"), o.flags
        if o.kind == "count":
            assert isinstance(p.type, click.IntRange)
            assert (p.type.min, p.type.max) == (1, MAX_SLOTS)


def test_click_tree_has_every_verb() -> None:
    assert set(tree().commands) == set(VERBS)


# --- fuzzing: any argument vector is parsed or refused with a UsageError ---------------------

WORDS = st.sampled_from(
    [
        *sorted({flag for o in OPTIONS for flag in o.flags}),
        *["--", "-", "=", "--=", "-qk", "-q0k", "-0", "-kZ", "--wait=", "--slots=", "nan", "-1"],
        *["1", "0", "1e9", "1e99", "/abs", "rel", "{}", "{{", "", " ", "\x00", "\ud800", "é"],
    ]
)
ARGS = st.lists(
    WORDS
    | st.text(max_size=12)
    | st.builds(lambda a, b: f"{a}={b}", WORDS, st.text(max_size=6))
    | st.builds(lambda a, b: f"{a}{b}", WORDS, st.text(max_size=4)),
    max_size=8,
)


@settings(
    derandomize=True, max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.sampled_from(VERBS), ARGS)
@example(RUN, ["--slots", "9" * 5000, "n", "c"])
@example(RUN, ["--wait", "\ud800", "n", "c"])
@example(EACH, ["--", "--", "--"])
@example(RUN, ["n", "c", "\ud800", "x"])
def test_any_argv_parses_or_is_a_usage_error(verb: str, args: list[str]) -> None:
    try:
        p = parse(verb, args)
    except UsageError as exc:
        assert isinstance(exc, ValidationError) and str(exc)
        return
    assert isinstance(p, Parsed)
    assert set(p.given) <= {o.dest for o in options_for(verb)}
    if verb in (RUN, EACH):
        assert p.positionals
        assert (p.argv is None) == (len(p.positionals) >= 2)
        assert p.argv is None or p.argv
    else:
        assert len(p.positionals) == len(POSITIONALS[verb])


def _one_line_args(args: list[str]) -> bool:
    return not any("\n" in a or "\r" in a for a in args)


@settings(
    derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.sampled_from(VERBS), ARGS.filter(_one_line_args))
def test_refusals_are_one_line(verb: str, args: list[str]) -> None:
    try:
        parse(verb, args)
    except UsageError as exc:
        assert "\n" not in str(exc) and "\r" not in str(exc), str(exc)


@pytest.mark.parametrize(
    ("verb", "args", "shown"),
    [
        (RUN, ["--x\ny", "n", "c"], "'--x\\ny'"),
        (HOLD, ["-q\n", "n"], "'-q\\n'"),
        (RUN, ["n", "echo", "hi", "x\ny"], "'x\\ny'"),
        (RUN, ["n", "c", "--y\nz"], "'--y\\nz'"),
        (EACH, ["t", "a", "b\nc"], "'b\\nc'"),
        (RUN, ["n", "c", "\r::error::x", "y"], "\\r::error::x"),
    ],
)
def test_refusals_with_newlines_in_arguments_are_one_line(
    verb: str,
    args: list[str],
    shown: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the CLI prints for a refusal is one line, the control characters escaped."""
    from local_mutex.cli import main

    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("LOCAL_MUTEX_HELD", raising=False)
    refused(verb, args)  # a UsageError, not a parsed command
    assert main([verb, *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("local-mutex: ") and err.endswith("\n"), err
    assert err.count("\n") == 1 and "\r" not in err, err
    assert shown in err, err


def test_unknown_options_are_quoted() -> None:
    assert refused(RUN, ["--x\ny", "n", "c"]) == (
        "no such option: '--x\\ny' (see local-mutex run --help)"
    )


def test_hint_suggestions_keep_the_words() -> None:
    import shlex

    msg = refused(RUN, ["n", "rm", "my file"])
    quoted, dashdash = msg.split("(local-mutex ")[1:]
    assert shlex.split(dashdash.removesuffix(")")) == ["n", "--", "rm", "my file"], msg
    name, command = shlex.split(quoted.removesuffix(") or follow -- "))
    assert name == "n" and shlex.split(command) == ["rm", "my file"], msg


@pytest.mark.parametrize(
    "words",
    [["rm", "my file"], ["echo", "it's", "$HOME"], ["printf", "%s\\n", "a b", ""], ["a", "-x y"]],
)
def test_hint_suggestions_run_what_was_typed(words: list[str]) -> None:
    import shlex

    from local_mutex.names import shell_quote

    msg = refused(RUN, ["n", *words])
    joined = " ".join(shell_quote(w) for w in words)
    assert f"(local-mutex n {shell_quote(joined)})" in msg, msg
    assert f"(local-mutex n -- {joined})" in msg, msg
    assert shlex.split(shlex.split(shell_quote(joined))[0]) == words


def test_verb_after_leading_options_moves_first() -> None:
    assert verb_first(["-q", "status", "n"]) == ["status", "-q", "n"]
    assert verb_first(["--lock-dir", "/d", "hold", "n"]) == ["hold", "--lock-dir", "/d", "n"]
    assert verb_first(["--lock-dir=/d", "each", "t", "c"]) == ["each", "--lock-dir=/d", "t", "c"]
    # an option's value is not the verb, nor is a word after `--`
    assert verb_first(["--message", "status", "n", "c"]) == ["--message", "status", "n", "c"]
    assert verb_first(["-q", "--", "status", "c"]) == ["-q", "--", "status", "c"]
    # a lock name that is no verb: the run form, untouched
    assert verb_first(["-q", "n", "status"]) == ["-q", "n", "status"]
    assert verb_first(["-q"]) == ["-q"]
    # --slots: a count for run/hold/each, a flag for release/status
    assert verb_first(["--slots", "release", "n"]) == ["release", "--slots", "n"]
    assert verb_first(["--slots", "2", "hold", "n"]) == ["hold", "--slots", "2", "n"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--version"], True),
        (["--version", "extra"], True),
        (["run", "--version"], True),
        (["status", "n", "--version"], True),
        (["--message", "--version", "n", "c x"], False),  # a value
        (["n", "--", "prog", "--version"], False),  # the program's
        (["n", "./mk", "--version"], False),  # after a one-word command: whose? (refused)
        (["each", "t", "./mk", "--version"], False),
        (["n", "make all", "--version"], True),
        (["status", "--slots", "--version"], True),
    ],
)
def test_asks_version(args: list[str], expected: bool) -> None:
    """Eager, as click's ``--version`` (and our ``--help``): said wherever it stands as an
    option; ``--version extra`` said "no such option: '--version'"."""
    assert asks_version(args) is expected


def test_an_unknown_option_after_a_quoted_command_is_just_unknown() -> None:
    """Not the one-word command's hint, whose ``-- 'echo hi' --frob`` runs no such thing."""
    assert refused(RUN, ["n", "echo hi", "--frob"]) == (
        "no such option: '--frob' (see local-mutex run --help)"
    )
    assert refused(RUN, ["n", "echo hi", "--wiat", "5"]).startswith(
        "no such option: '--wiat' (did you mean --wait?)"
    )
    assert "one quoted argument" in refused(RUN, ["n", "make", "--frob"])  # one word: whose?


def test_options_after_an_empty_command_are_ours() -> None:
    """``local-mutex NAME "$CMD" -q`` with CMD unset: not a one-word command's option."""
    p = parse(RUN, ["n", "", "-q"])
    assert p.flag("quiet") and p.positionals == ["n", ""]
    assert parse(EACH, ["t", "", "-q"]).flag("quiet")


def test_a_hold_given_a_command_says_a_hold_runs_none() -> None:
    msg = refused(HOLD, ["deploy", "./deploy.sh"])
    assert "takes NAME, got 2 arguments" in msg and "a hold runs no command" in msg


@pytest.mark.parametrize(
    ("verb", "args", "option"),
    [
        (HOLD, ["--", "-x", "--no-wait"], "--no-wait"),
        (STATUS, ["--", "-x", "-q"], "-q"),
        (RELEASE, ["--", "-x", "--force"], "--force"),
    ],
)
def test_an_option_after_the_dashes_that_end_options_is_pointed_at(
    verb: str, args: list[str], option: str
) -> None:
    """``--`` lets a name start with ``-``; an option after it is one more operand, and the
    count alone ("got 2 arguments") would not say why."""
    msg = refused(verb, args)
    assert "got 2 arguments" in msg and f"({option} came after --" in msg
    assert parse(verb, [option, "--", "-x"]).positionals == ["-x"]  # where it goes
    assert "came after" not in refused(verb, ["--", "-x", "-y"])  # a name, as far as we know


def test_what_a_refusal_repeats_of_the_line_holds_no_secret() -> None:
    """CI logs keep stderr: a --token's value or a --remote URL's password typed where it
    does not belong was printed back in the hint, the suggested line or "no such option"."""
    url = "https://u:s3cret@example.com/r.git"
    token = "0123456789abcdef0123456789abcdef"
    said = [
        refused(HOLD, ["--", "x", f"--remote={url}"]),
        refused(RELEASE, ["--", "x", f"--token={token}"]),
        refused(RUN, [f"--token={token}", "n", "true"]),
    ]
    for args in (["--remote", url], [f"--remote={url}"]):
        with pytest.raises(UsageError) as info:
            parse(RUN, [*args, "statuss", "x"], implicit=True)
        said.append(str(info.value))
        assert "local-mutex run " in said[-1] and "u:***@example.com/r.git" in said[-1]
    said.append(refused(RUN, ["--remote", url, "n", "echo", "hi"]))
    assert "u:***@example.com" in said[-1]
    assert not [s for s in said if "s3cret" in s or token in s], said


def test_the_remote_help_names_every_address_form_the_check_takes() -> None:
    from local_mutex.backends import ADDRESSES, GIT_SCHEMES, POSTGRES_SCHEMES

    (remote,) = [o for o in OPTIONS if "--remote" in o.flags]
    for scheme in (*GIT_SCHEMES, POSTGRES_SCHEMES[0], "user@host:path", "self"):
        assert scheme in remote.help and scheme.rstrip("/") in ADDRESSES, scheme
