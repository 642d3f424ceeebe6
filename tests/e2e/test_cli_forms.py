"""The command line as people type it: the argv form after ``--``, options anywhere, a hint
for an unquoted command, the fast path with options, the nested shim, ``--remote self``,
top-level help, shell completion, and the no-/proc paths on Linux."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import (
    CLI,
    Procs,
    clean_env,
    hold_until,
    lock_file,
    old_pythons,
    pyenv_python,
    run_cli,
    version_of,
    wait_for,
)
from helpers.gitserver import git_daemon

SHIM = Path(__file__).resolve().parents[2] / "src" / "local_mutex" / "local-mutex.sh"
# printf '[%s]' shows each argument the program got, bracketed: verbatim or not at all.
SHOW = ["printf", "[%s]"]
TRICKY = ["a b", "$HOME", "'q'", "*", ";", "-q", "--wait", "5", "--", "/abs/path"]
TRICKY_OUT = "".join(f"[{a}]" for a in TRICKY).encode()


def _ok(r: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[bytes]:
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r


# -- argv form: NAME -- PROGRAM [ARGS...] ---------------------------------------------------


def test_argv_form_runs_the_program_with_its_arguments_verbatim(
    lock_dir: Path, tmp_path: Path
) -> None:
    r = _ok(run_cli(["--lock-dir", str(lock_dir), "argv", "--", *SHOW, *TRICKY], cwd=tmp_path))
    assert r.stdout == TRICKY_OUT  # no shell: no expansion, no globbing, options untouched
    assert lock_file(lock_dir, "argv").exists()
    assert "waiting for lock argv" in r.stderr.decode()


def test_argv_form_with_the_run_verb(lock_dir: Path) -> None:
    r = _ok(run_cli(["run", "--lock-dir", str(lock_dir), "viarun", "--", *SHOW, *TRICKY]))
    assert r.stdout == TRICKY_OUT
    assert lock_file(lock_dir, "viarun").exists()


def test_argv_form_options_after_name_and_before_the_separator(lock_dir: Path) -> None:
    r = _ok(run_cli(["after", "-q", "--lock-dir", str(lock_dir), "--", *SHOW, "x"]))
    assert r.stdout == b"[x]" and r.stderr == b""
    assert lock_file(lock_dir, "after").exists()


def test_argv_form_takes_the_lock_dir_only_from_the_option_or_the_environment(
    lock_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    # An absolute path after `--` is the program's argument, never LOCK_DIR.
    r = _ok(
        run_cli(["envdir", "--", *SHOW, str(other)], env={"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)})
    )
    assert r.stdout == f"[{other}]".encode()
    assert lock_file(lock_dir, "envdir").exists()
    assert list(other.iterdir()) == []


def test_argv_form_excludes_like_the_quoted_form(procs: Procs, lock_dir: Path, marks: Path) -> None:
    holder = procs.start(["--lock-dir", str(lock_dir), "ex", "--", "sh", "-c", hold_until(marks)])
    wait_for(marks / "h.held")
    r = run_cli(["--no-wait", "--lock-dir", str(lock_dir), "ex", "--", "touch", str(marks / "no")])
    assert r.returncode == 75, r.stderr
    assert not (marks / "no").exists()
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


def test_argv_form_status_and_missing_program(lock_dir: Path) -> None:
    r = run_cli(["--lock-dir", str(lock_dir), "st", "--", "sh", "-c", "exit 7"])
    assert r.returncode == 7
    r = run_cli(["--lock-dir", str(lock_dir), "st", "--"])
    assert r.returncode == 2 and b"missing the program after --" in r.stderr
    r = run_cli(["--lock-dir", str(lock_dir), "st", "echo hi", "--", "echo"])
    assert r.returncode == 2 and b"not both" in r.stderr
    # A program that is no program (a directory) is named with the reason.
    r = run_cli(["--lock-dir", str(lock_dir), "st", "--", str(lock_dir)])
    assert r.returncode == 125
    assert f"cannot start the command: {lock_dir}: Permission denied".encode() in r.stderr


def test_each_argv_form_keeps_the_item_out_of_the_arguments(lock_dir: Path) -> None:
    items = b"one\ntwo words\n$(touch pwned)\n"
    r = _ok(
        run_cli(
            [
                "each",
                "--lock-dir",
                str(lock_dir),
                "item-{}",
                "--",
                "sh",
                "-c",
                'printf "<%s|%s>" "$LOCAL_MUTEX_ITEM" "$1"',
                "sh",
                "{}",
            ],
            input=items,
        )
    )
    assert r.stdout == b"<one|{}><two words|{}><$(touch pwned)|{}>"
    for item in ("one", "two words", "$(touch pwned)"):
        assert lock_file(lock_dir, f"item-{item}").exists()


def test_argv_form_through_the_nested_shim(lock_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    # Inside a locked command: the lock dir comes from the environment the outer run set,
    # or from --lock-dir; an absolute path after -- stays the program's.
    inner = (
        'sh "$LOCAL_MUTEX_CLI" inner -- printf "[%s]" "a b" "$OTHER" && '
        '"$LOCAL_MUTEX_CLI" --lock-dir "$OTHER" elsewhere -- printf "[%s]" --wait'
    )
    r = _ok(run_cli(["--lock-dir", str(lock_dir), "outer", inner], env={"OTHER": str(other)}))
    assert r.stdout == f"[a b][{other}][--wait]".encode()
    assert lock_file(lock_dir, "inner").exists()
    assert lock_file(other, "elsewhere").exists()
    assert not lock_file(lock_dir, "elsewhere").exists()


# -- options anywhere, and the hint for an unquoted command ---------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["{name}", "-q", "--lock-dir", "{dir}", "echo ran"],
        ["{name}", "echo ran", "-q", "--lock-dir", "{dir}"],
        ["-q", "{name}", "--wait", "5", "echo ran", "{dir}"],
        ["--lock-dir={dir}", "{name}", "--no-wait", "-q", "echo ran"],
    ],
)
def test_options_anywhere_in_the_verb_free_form(lock_dir: Path, args: list[str]) -> None:
    argv = [a.replace("{name}", "anywhere").replace("{dir}", str(lock_dir)) for a in args]
    r = _ok(run_cli(argv))
    assert r.stdout == b"ran\n" and r.stderr == b""  # -q took effect wherever it stood
    assert lock_file(lock_dir, "anywhere").exists()


@pytest.mark.parametrize(
    ("args", "verb"),
    [
        (["--json", "status", "{probe}"], "status"),
        (["--lock-dir", "{dir}", "status", "{probe}"], "status"),
        (["-q", "status", "{probe}"], "quiet status"),
        (["--lock-dir={dir}", "-q", "history", "{probe}"], "history"),
        (["-q", "release", "{probe}", "--lock-dir", "{dir}"], "release"),
        (["--lock-dir", "{dir}", "list"], "list"),
    ],
)
def test_options_before_the_verb_still_mean_the_verb(
    lock_dir: Path, tmp_path: Path, args: list[str], verb: str
) -> None:
    """`local-mutex -q status deploy` took `status` for a lock name and ran `deploy` (a
    program on PATH, or any shell command) under it. Options may come before the verb."""
    probe = tmp_path / "probe"
    argv = [a.replace("{dir}", str(lock_dir)).replace("{probe}", f"touch '{probe}'") for a in args]
    r = run_cli(argv, env={"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)})
    assert not probe.exists(), r.stderr
    assert not any(
        lock_file(lock_dir, v).exists() for v in ("status", "history", "release", "list")
    )
    expected = {"status": 0, "history": 2, "release": 2, "list": 0, "quiet status": 0}
    assert r.returncode == expected[verb], r.stderr
    if verb == "quiet status":
        assert r.stdout == b"" and r.stderr == b""


def test_a_lock_named_like_a_verb_goes_after_dashdash(lock_dir: Path) -> None:
    r = _ok(run_cli(["-q", "--", "status", "echo ran", str(lock_dir)]))
    assert r.stdout == b"ran\n"
    assert lock_file(lock_dir, "status").exists()


def test_help_after_options_before_the_verb_is_the_verbs_help() -> None:
    r = _ok(run_cli(["--lock-dir", "/tmp", "status", "--help"]))
    assert b"Usage: local-mutex status" in r.stdout


@pytest.mark.parametrize(
    ("words", "quoted"),
    [
        (["touch", "ran"], "'touch ran'"),
        (["make", "-j8"], "'make -j8'"),
        (["touch", "ran", "twice"], "'touch ran twice'"),
        (["touch", "ran", "--verbose"], "'touch ran --verbose'"),
    ],
)
def test_an_unquoted_command_gets_a_hint_and_does_not_run(
    lock_dir: Path, tmp_path: Path, words: list[str], quoted: str
) -> None:
    env = {"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)}
    r = run_cli(["hint", *words], cwd=tmp_path, env=env)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "the command must be one quoted argument" in err
    assert f"local-mutex hint {quoted}" in err
    assert f"local-mutex hint -- {' '.join(words)}" in err
    assert not (tmp_path / "ran").exists()
    assert not lock_file(lock_dir, "hint").exists()


def test_echo_hi_gets_the_hint(lock_dir: Path) -> None:
    r = run_cli(["hint", "echo", "hi"], env={"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)})
    assert r.returncode == 2 and r.stdout == b""
    err = r.stderr.decode()
    assert "one quoted argument" in err and "follow --" in err
    assert "local-mutex hint 'echo hi'" in err


def test_an_unquoted_command_in_each_gets_the_hint(lock_dir: Path, tmp_path: Path) -> None:
    r = run_cli(["each", "--lock-dir", str(lock_dir), "t-{}", "touch", "ran"], input=b"x\n")
    assert r.returncode == 2
    assert b"one quoted argument" in r.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("words", "meant"),
    [
        (["relase", "./ran.sh"], "did you mean release?"),
        (["stauts", "./ran.sh"], "did you mean status?"),
        (["hodl", "./ran.sh"], "did you mean hold?"),
        (["statuss", "./ran.sh"], "did you mean status?"),  # the last letter doubled
        (["holdd", "./ran.sh"], "did you mean hold?"),
        (["unlock", "./ran.sh"], "did you mean release?"),
        (["relase", "--", "./ran.sh"], "did you mean release?"),
        (["--", "touch", "ran"], "to run the program under a lock: local-mutex NAME -- touch"),
        # cpu-mutex's way with the program's own options: not "no such option" alone.
        (
            ["--", "sh", "-c", "touch ran"],
            "no such option: '-c'; a -- before NAME only ends the options, and 'sh' is the "
            "lock's name here. Nothing ran; to run the program under a lock: local-mutex NAME "
            "-- sh -c 'touch ran'",
        ),
        (["--", "touch"], "missing COMMAND after NAME (or -- and a program); a -- before NAME"),
    ],
)
def test_a_one_word_command_that_meant_something_else_does_not_run(
    lock_dir: Path, tmp_path: Path, words: list[str], meant: str
) -> None:
    """A misspelt verb ran its argument (``relase ./deploy.sh`` ran the deploy), and
    cpu-mutex's ``-- vitest run`` locked "vitest" and ran "run"."""
    (tmp_path / "ran.sh").write_text("#!/bin/sh\ntouch ran\n")
    (tmp_path / "ran.sh").chmod(0o755)
    r = run_cli(words, cwd=tmp_path, env={"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)})
    err = r.stderr.decode()
    assert r.returncode == 2 and meant in err and "Nothing ran" in err, err
    assert not (tmp_path / "ran").exists() and not os.listdir(lock_dir)
    # Taken as typed where that is said: the explicit verb, a name that is no program.
    name = words[words[0] == "--"]
    r = run_cli(
        ["run", name, "touch ran"], cwd=tmp_path, env={"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)}
    )
    assert r.returncode == 0 and (tmp_path / "ran").exists(), r.stderr


def test_a_file_after_a_one_word_command_is_said_to_be_the_commands(
    lock_dir: Path, tmp_path: Path
) -> None:
    """``NAME cat /etc/hosts``: the file was called a lock dir, with no word of quoting."""
    env = {"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)}
    target = tmp_path / "notes.txt"
    target.write_text("x")
    r = run_cli(["n", "touch", str(target)], cwd=tmp_path, env=env)
    err = r.stderr.decode()
    assert r.returncode == 2 and "does not exist or is not a directory" in err, err
    assert f"(local-mutex n 'touch {target}') or follow -- (local-mutex n -- touch {target})" in err
    assert not (tmp_path / "ran").exists() and not os.listdir(lock_dir)
    r = run_cli(["n", "touch ran", str(target)], cwd=tmp_path, env=env)  # quoted: no hint
    assert r.returncode == 2 and "quoted" not in r.stderr.decode(), r.stderr


def test_the_lines_said_to_run_instead_keep_the_options_typed(
    lock_dir: Path, tmp_path: Path
) -> None:
    """``--wait 5 -- ls run`` was told to run ``local-mutex NAME -- ls run``: no ceiling."""
    env = {"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)}
    r = run_cli(["--wait", "5", "--", "ls", "run"], cwd=tmp_path, env=env)
    err = r.stderr.decode()
    assert r.returncode == 2 and "local-mutex --wait 5 NAME -- ls run;" in err, err
    assert err.rstrip().endswith("for a lock named 'ls': local-mutex run --wait 5 ls run"), err
    r = run_cli(["-q", "--message", "a b", "relase", "./x"], cwd=tmp_path, env=env)
    err = r.stderr.decode()
    assert err.rstrip().endswith("local-mutex run -q --message 'a b' relase ./x"), err
    # The seed's LOCK_DIR word, and a value that reads as an option only with its '='.
    other = tmp_path / "other"
    other.mkdir()
    r = run_cli(["--message=--x", "statuss", "./x", str(other)], cwd=tmp_path, env=env)
    err = r.stderr.decode()
    said = f"local-mutex run --message=--x --lock-dir {other} statuss ./x"
    assert err.rstrip().endswith(said), err
    r = run_cli(shlex.split(said)[1:], cwd=tmp_path, env=env)  # as said: it runs, there
    assert r.returncode == 127 and os.listdir(other), r.stderr  # ./x: no such program
    assert not os.listdir(lock_dir)


def _as_bash_reads(line: str) -> list[str]:
    """The words of a line pasted into bash (``$'...'`` included)."""
    script = f'set -- {line}; printf "%s\\0" "$@"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    return out.decode("utf-8", "surrogateescape").split("\0")[:-1]


def test_a_suggested_line_with_control_characters_pastes_as_typed(
    lock_dir: Path, tmp_path: Path
) -> None:
    """Its words in ``$'...'``: the printer escapes a raw newline (one line stays one), and
    a pasted ``'a\\nb'`` would give a backslash and an n."""
    env = {"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)}
    r = run_cli(["--message", "a\nb", "statuss", "x"], cwd=tmp_path, env=env)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1, err
    said = err.rstrip().rpartition(": ")[2]
    assert said == "local-mutex run --message $'a\\nb' statuss x", err
    assert _as_bash_reads(said) == ["local-mutex", "run", "--message", "a\nb", "statuss", "x"]
    # An unquoted command: the quoted form keeps sh's quoting inside (dash reads no $'...').
    r = run_cli(["n", "printf\x1b", "b\nc"], cwd=tmp_path, env=env)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1, err
    quoted, _, dashed = err.partition("one quoted argument (")[2].partition(") or follow -- (")
    assert _as_bash_reads(quoted) == ["local-mutex", "n", "'printf\x1b' 'b\nc'"]
    assert _as_bash_reads(dashed.rstrip()[:-1]) == ["local-mutex", "n", "--", "printf\x1b", "b\nc"]
    assert not os.listdir(lock_dir)


@pytest.mark.parametrize(
    "words",
    [
        ["lint", "./ran.sh"],
        ["test", "./ran.sh"],
        ["stats", "./ran.sh"],
        ["released", "./ran.sh"],
        ["holds", "./ran.sh"],  # a letter added at the end that doubles none
        ["Status", "./ran.sh"],
        ["relase", "--", "sh", "ran.sh"],
        ["--", "-x", "./ran.sh"],
        ["--", "touch", "--", "./ran.sh"],  # a -- after NAME: NAME is the name, as documented
    ],
)
def test_names_near_a_verb_but_not_a_misspelling_run(
    lock_dir: Path, tmp_path: Path, words: list[str]
) -> None:
    (tmp_path / "ran.sh").write_text("#!/bin/sh\ntouch ran\n")
    (tmp_path / "ran.sh").chmod(0o755)
    r = run_cli(words, cwd=tmp_path, env={"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)})
    assert r.returncode == 0 and (tmp_path / "ran").exists(), r.stderr


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (["--version", "--help"], "Usage: local-mutex [OPTIONS] NAME"),
        (["status", "--help", "--version"], "Usage: local-mutex status [OPTIONS] NAME"),
        (["status", "--slots", "--help"], "Usage: local-mutex status [OPTIONS] NAME"),
        (["release", "--slots", "-h"], "Usage: local-mutex release [OPTIONS] NAME"),
        (["--frob", "--help"], "Usage: local-mutex run [OPTIONS] NAME"),
        (["--quiet=1", "--help"], "Usage: local-mutex run [OPTIONS] NAME"),
    ],
)
def test_help_asked_for_is_shown_whatever_else_the_line_holds(args: list[str], usage: str) -> None:
    """click parsed the whole line and refused in its own multi-line error what our
    parser takes (``--version`` with a verb) or would refuse in one line; and a flag
    ``--slots`` took the ``--help`` after it for its value."""
    r = run_cli(args)
    out = r.stdout.decode()
    assert r.returncode == 0 and out.startswith(usage), (out, r.stderr)
    assert not r.stderr


def test_version_after_a_one_word_command_is_refused_not_answered(
    lock_dir: Path, tmp_path: Path
) -> None:
    """It printed the version and exited 0: the caller took the command for run."""
    r = run_cli(
        ["n", "touch", "--version"],
        cwd=tmp_path,
        env={"LOCAL_MUTEX_LOCK_DIR": str(lock_dir)},
    )
    err = r.stderr.decode()
    assert r.returncode == 2 and "after the one-word command 'touch'" in err, err
    assert b"version" not in r.stdout and not os.listdir(lock_dir)


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["-w", "5", "n", "true"], "flock's -w is --wait SECONDS here"),
        (["-n", "n", "true"], "flock's -n is --no-wait here"),
        (["--wiat", "5", "n", "true"], "did you mean --wait?"),
        (["--lockdir", "/tmp", "n", "true"], "did you mean --lock-dir?"),
        (["--ttl", "5", "n", "true"], "--ttl is an option of hold, not of run"),
        (
            ["status", "--wait", "5", "n"],
            "--wait is an option of each, hold and run, not of status",
        ),
    ],
)
def test_an_unknown_option_says_what_was_meant(args: list[str], hint: str) -> None:
    r = run_cli(args)
    assert r.returncode == 2 and hint in r.stderr.decode(), r.stderr


# -- the fast path: the common options never load click -------------------------------------


def _modules(argv: list[str], cwd: Path) -> set[str]:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return {
        line.rsplit("|", 1)[1].strip()
        for line in r.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize(
    "args",
    [
        ["-q", "--wait", "5", "--lock-dir", "{dir}", "fast", "true"],
        ["fast", "--no-wait", "--timeout", "30", "--shared", "-q", "true", "{dir}"],
        ["run", "-q", "--wait", "5", "--lock-dir", "{dir}", "fast", "true"],
        ["-q", "--lock-dir", "{dir}", "fast", "--", "true"],
    ],
)
def test_common_options_do_not_import_click(tmp_path: Path, args: list[str]) -> None:
    argv = [a.replace("{dir}", str(tmp_path)) for a in args]
    loaded = _modules(["-m", "local_mutex", *argv], tmp_path)
    assert "local_mutex.cli" in loaded  # the probe saw the CLI run
    assert "click" not in loaded, f"{argv} imported click"


def test_help_does_import_click(tmp_path: Path) -> None:
    """The probe's own check: it would see click if a path loaded it."""
    assert "click" in _modules(["-m", "local_mutex", "--help"], tmp_path)


# -- the nested shim: -I -S, and help that loads site on demand -----------------------------


def test_the_shim_starts_python_isolated_and_without_site(lock_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "args"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{log}"\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    r = _ok(
        run_cli(
            [
                "--lock-dir",
                str(lock_dir),
                "outer",
                'LOCAL_MUTEX_PYTHON="$W" sh "$LOCAL_MUTEX_CLI" in -- echo ok',
            ],
            env={"W": str(wrapper)},
        )
    )
    assert r.stdout == b"ok\n"
    assert log.read_text().splitlines()[:2] == ["-I", "-S"]


def test_help_through_the_shim_loads_site_on_demand(lock_dir: Path) -> None:
    cmd = (
        'sh "$LOCAL_MUTEX_CLI" --help > top.txt && sh "$LOCAL_MUTEX_CLI" status --help > st.txt'
        " && cat top.txt st.txt"
    )
    r = _ok(run_cli(["--lock-dir", str(lock_dir), "helpful", cmd], cwd=lock_dir))
    out = r.stdout.decode()
    assert out.startswith("Usage: local-mutex [OPTIONS] NAME")
    assert "Usage: local-mutex status [OPTIONS] NAME" in out


def test_the_shim_runs_outside_a_locked_command_too(lock_dir: Path) -> None:
    env = clean_env({"LOCAL_MUTEX_PYTHON": sys.executable})
    r = subprocess.run(
        ["sh", str(SHIM), "--lock-dir", str(lock_dir), "-q", "direct", "--", "echo", "a b"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout == b"a b\n" and r.stderr == b"", r.stderr
    r = subprocess.run(["sh", str(SHIM), "--help"], env=env, capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(b"Usage: local-mutex [OPTIONS] NAME")


# Not Python 2: it does not know the shim's -I ("Unknown option: -I", exit 2). The shim
# keeps -I (no cwd on sys.path); the action and setup check the interpreter before it.
@pytest.mark.parametrize("version", old_pythons(python2=False))
def test_the_shim_on_an_old_python_says_what_it_needs(lock_dir: Path, version: str) -> None:
    python = pyenv_python(version)
    assert python is not None
    r = subprocess.run(
        ["sh", str(SHIM), "old", "echo must-not-run", str(lock_dir)],
        env=clean_env({"LOCAL_MUTEX_PYTHON": python}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    full = version_of(python)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (
        f"local-mutex: needs Python >= 3.9, {python} is {full}; "
        "set LOCAL_MUTEX_PYTHON to a newer one\n"
    )
    assert list(lock_dir.iterdir()) == []  # no lock was taken


# -- remotes: -q, and --remote self ---------------------------------------------------------


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[str]:
    with git_daemon(tmp_path / "server") as url:
        yield url


def _branches(url: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-remote", "--heads", url], capture_output=True, text=True, check=True
    ).stdout
    return sorted(line.split("refs/heads/", 1)[1] for line in out.splitlines())


@pytest.mark.timeout(180)
def test_quiet_works_with_a_remote(remote: str) -> None:
    r = _ok(run_cli(["-q", "--remote", remote, "quiet-remote", "echo ran"], timeout=120))
    assert r.stdout == b"ran\n" and r.stderr == b""
    assert "lock__quiet-remote" in _branches(remote)
    r = _ok(run_cli(["run", "--remote", remote, "quiet-remote", "-q", "--", "echo", "argv"]))
    assert r.stdout == b"argv\n" and r.stderr == b""


def test_remote_self_outside_actions_is_a_clear_error(lock_dir: Path, tmp_path: Path) -> None:
    base = clean_env()
    for key in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY"):
        base.pop(key, None)
    r = subprocess.run(
        [*CLI, "--remote", "self", "selfish", f"touch '{tmp_path}/ran'"],
        env=base,
        capture_output=True,
        timeout=60,
    )
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "--remote self" in err and "GITHUB_SERVER_URL" in err and "GITHUB_REPOSITORY" in err
    assert not (tmp_path / "ran").exists()
    r = subprocess.run(
        [*CLI, "selfish", f"touch '{tmp_path}/ran'"],
        env={**base, "LOCAL_MUTEX_REMOTE": "self"},
        capture_output=True,
        timeout=60,
    )
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "$LOCAL_MUTEX_REMOTE self means" in err and "--remote" not in err, err
    assert not (tmp_path / "ran").exists()


@pytest.mark.timeout(180)
def test_remote_self_inside_actions_locks_on_this_repository(remote: str) -> None:
    server, _, repo = remote.rpartition("/")
    env = {"GITHUB_SERVER_URL": server, "GITHUB_REPOSITORY": repo.removesuffix(".git")}
    r = _ok(run_cli(["--remote", "self", "mine", "echo in-self"], env=env, timeout=120))
    assert r.stdout == b"in-self\n"
    assert "lock__mine" in _branches(remote)  # the lock went to $SERVER/$REPOSITORY.git
    st = run_cli(["status", "mine", "--remote", "self", "--json"], env=env)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["state"] == "free"


# -- top-level help and shell completion ----------------------------------------------------


def test_top_level_help_shows_the_run_form_first() -> None:
    r = _ok(run_cli(["--help"]))
    out = r.stdout.decode()
    assert out.splitlines()[0].startswith("Usage: local-mutex [OPTIONS] NAME ")
    options, verbs = out.index("--lock-dir"), out.index("status")
    assert options < verbs  # the run form's options come before the verbs
    for option in ("--wait", "--no-wait", "--timeout", "--shared", "-q, --quiet", "--remote"):
        assert option in out[: out.index("Commands")]
    for verb in ("run", "each", "hold", "release", "status", "list", "history"):
        assert f"\n  {verb} " in out[out.index("Commands") :]
    assert _ok(run_cli(["-h"])).stdout == r.stdout


@pytest.mark.parametrize("args", [["--version"], ["-q", "--version"], ["--version", "-q"]])
def test_version_with_other_flags(args: list[str]) -> None:
    r = _ok(run_cli(args))
    assert r.stdout.startswith(b"local-mutex, version ")


def _complete(words: str, cword: int, shell: str = "bash") -> str:
    r = subprocess.run(
        [*CLI],
        env=clean_env(
            {
                "_LOCAL_MUTEX_COMPLETE": f"{shell}_complete",
                "COMP_WORDS": words,
                "COMP_CWORD": str(cword),
            }
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_completion_script_for_bash() -> None:
    r = subprocess.run(
        [*CLI],
        env=clean_env({"_LOCAL_MUTEX_COMPLETE": "bash_source"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "_LOCAL_MUTEX_COMPLETE=bash_complete" in r.stdout
    assert "complete " in r.stdout and "local-mutex" in r.stdout


@pytest.mark.parametrize("value", ["", "1", "yes", "tcsh_complete"])
def test_a_stray_completion_variable_does_not_stop_the_command(value: str, tmp_path: Path) -> None:
    """Only what click's completion scripts set asks for completions; the command ran not
    at all (exit 0 or 1, silently) when the variable was left empty or set by accident."""
    r = run_cli(
        ["--lock-dir", str(tmp_path), "n", f"touch '{tmp_path}/ran'"],
        env={"_LOCAL_MUTEX_COMPLETE": value},
    )
    assert r.returncode == 0 and (tmp_path / "ran").exists(), r.stderr


@pytest.mark.parametrize(
    "shell_vars",
    [{}, {"COMP_WORDS": "local-mutex st"}, {"COMP_WORDS": "x", "COMP_CWORD": "x"}],
)
def test_a_completion_request_without_the_shells_variables_is_one_clear_line(
    shell_vars: dict[str, str],
) -> None:
    """Set by hand, without COMP_WORDS or a numeric COMP_CWORD: click printed a traceback."""
    env = {"_LOCAL_MUTEX_COMPLETE": "bash_complete", **shell_vars}
    r = subprocess.run([*CLI], env=clean_env(env), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert "the shell's variables are missing or malformed" in r.stderr


def test_completion_offers_verbs_and_options() -> None:
    assert "plain,status" in _complete("local-mutex st", 1).splitlines()
    assert "plain,--lock-dir" in _complete("local-mutex run --lock", 2).splitlines()


def test_completion_offers_verbs_after_leading_options() -> None:
    """The parser finds a verb after leading options (``local-mutex -q status NAME``), so
    completion offers verbs there and completes that verb's options; not after ``run``
    or a lock name."""
    assert "plain,status" in _complete("local-mutex -q ", 2).splitlines()
    assert _complete("local-mutex --lock-dir /tmp st", 3).splitlines() == ["plain,status"]
    assert "plain,--json" in _complete("local-mutex -q status --js", 3).splitlines()
    assert _complete("local-mutex run ", 2).strip() == ""
    assert _complete("local-mutex -q mylock ", 3).strip() == ""
    # Only the verbs that take the options typed: status does not wait.
    offered = _complete("local-mutex --wait 5 ", 3).splitlines()
    assert "plain,hold" in offered and "plain,status" not in offered, offered


def test_completion_offers_the_run_forms_options_first_and_no_verb_after_dashes() -> None:
    """The top-level help lists the run form's options, but ``local-mutex --lo<TAB>``
    offered nothing (only -h and --help for ``-<TAB>``); after a ``--`` the word is a lock's
    name, which verbs were offered for."""
    offered = _complete("local-mutex -", 1).splitlines()
    for flag in ("--lock-dir", "--wait", "-q", "--remote", "--version", "--help"):
        assert f"plain,{flag}" in offered, offered
    assert _complete("local-mutex --lo", 1).splitlines() == ["plain,--lock-dir"]
    assert _complete("local-mutex --ver", 1).splitlines() == ["plain,--version"]
    assert _complete("local-mutex -- ", 2).strip() == ""
    assert _complete("local-mutex -- st", 2).strip() == ""


def test_quiet_works_with_every_verb(lock_dir: Path) -> None:
    """``-q`` before or after any verb: status answers by its exit status alone."""
    where = ["--lock-dir", str(lock_dir)]
    for args in (["-q", "status", "x", *where], ["status", "-q", "x", *where]):
        r = run_cli(args)
        assert (r.returncode, r.stdout, r.stderr) == (0, b"", b""), r.stderr
    r = run_cli(["-q", "list", *where])
    assert r.returncode == 0 and r.stdout == b"", r.stderr
    r = run_cli(["-q", "history", "x"])  # taken, and only the error is printed
    assert r.returncode == 2 and b"kept only by git remotes" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("words", "cword"),
    [
        ("local-mutex run --lock-dir ", 3),
        ("local-mutex each --lock-dir ", 3),
        ("local-mutex status --lock-dir ", 3),
        ("local-mutex list --lock-dir=", 2),
    ],
)
def test_lock_dir_completes_directories_after_a_verb(words: str, cword: int) -> None:
    assert _complete(words, cword).splitlines() == ["dir,"]


@pytest.mark.parametrize(
    ("words", "cword"),
    [("local-mutex --lock-dir ", 2), ("local-mutex -q --lock-dir ", 3)],
)
def test_lock_dir_completes_directories_in_the_verb_free_form(words: str, cword: int) -> None:
    assert _complete(words, cword).splitlines() == ["dir,"]


# -- LOCAL_MUTEX_NO_PROC=1: the paths a system without /proc takes, on Linux ----------------

NO_PROC = {"LOCAL_MUTEX_NO_PROC": "1"}


def test_status_by_probe_tells_a_shared_lock(procs: Procs, lock_dir: Path, marks: Path) -> None:
    """The probe tries a shared lock too: a lock held shared is said to be, not "held
    (held)", and the probe's own try leaves it as it was (an exclusive try still fails)."""
    holder = procs.start(["--shared", "sh", hold_until(marks), str(lock_dir)], env=NO_PROC)
    wait_for(marks / "h.held")
    human = run_cli(["status", "sh", "--lock-dir", str(lock_dir)], env=NO_PROC)
    assert human.returncode == 1
    assert human.stdout.decode().startswith("sh: held (shared)"), human.stdout
    st = json.loads(run_cli(["status", "sh", "--lock-dir", str(lock_dir), "--json"]).stdout)
    assert st["mode"] == "shared" and [h["pid"] for h in st["holders"]] == [holder.pid]
    r = run_cli(["--no-wait", "sh", "true", str(lock_dir)])
    assert r.returncode == 75, r.stderr
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


def test_status_and_list_by_probe(procs: Procs, lock_dir: Path, marks: Path) -> None:
    holder = procs.start(["probed", hold_until(marks), str(lock_dir)], env=NO_PROC, cwd=marks)
    wait_for(marks / "h.held")
    r = run_cli(["status", "probed", "--lock-dir", str(lock_dir), "--json"], env=NO_PROC)
    assert r.returncode == 1, r.stderr
    st = json.loads(r.stdout)
    assert st["state"] == "held" and st["method"] == "probe" and st["mode"] == "exclusive"
    (h,) = st["holders"]
    assert h["pid"] == holder.pid and h["source"] == "record" and h["cwd"] == str(marks)
    assert h["mode"] == "exclusive"
    human = run_cli(["status", "probed", "--lock-dir", str(lock_dir)], env=NO_PROC)
    assert human.returncode == 1
    text = human.stdout.decode()
    assert f"probed: held (exclusive) by pid {holder.pid}" in text, text
    assert "a holder shows only as its record names it" in text, text
    listed = json.loads(
        run_cli(["list", "--lock-dir", str(lock_dir), "--json"], env=NO_PROC).stdout
    )
    (entry,) = listed
    assert entry["name"] == "probed" and entry["method"] == "probe"
    assert entry["holders"][0]["pid"] == holder.pid
    (marks / "h.go").touch()
    assert holder.wait(20) == 0
    r = run_cli(["status", "probed", "--lock-dir", str(lock_dir), "--json"], env=NO_PROC)
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "free"


def test_reentrancy_through_the_shim_without_proc(lock_dir: Path) -> None:
    """Ancestry via ps: the nested same-name call sees its enclosing holder and runs inside."""
    cmd = 'sh "$LOCAL_MUTEX_CLI" nest "echo inner" && sh "$LOCAL_MUTEX_CLI" nest -- echo argv'
    r = run_cli(["nest", cmd, str(lock_dir)], env=NO_PROC, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"inner\nargv\n"
    assert r.stderr.decode().count("already held by enclosing pid") == 2


def test_a_non_descendant_still_waits_without_proc(
    procs: Procs, lock_dir: Path, marks: Path, tmp_path: Path
) -> None:
    """An inherited LOCAL_MUTEX_HELD proves nothing to a process outside the holder's tree:
    the ps-based ancestry check must refuse it as the /proc one does."""
    env_file = tmp_path / "held.env"
    holder = procs.start(
        ["guarded", f'echo "$LOCAL_MUTEX_HELD" > "{env_file}"; {hold_until(marks)}', str(lock_dir)],
        env=NO_PROC,
    )
    wait_for(marks / "h.held")
    held = env_file.read_text().strip()
    assert held
    r = run_cli(
        ["--no-wait", "guarded", f"touch '{marks}/stolen'", str(lock_dir)],
        env={**NO_PROC, "LOCAL_MUTEX_HELD": held},
    )
    assert r.returncode == 75, r.stderr
    assert not (marks / "stolen").exists()
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="compares with the /proc path")
def test_the_switch_is_what_changes_the_method(procs: Procs, lock_dir: Path, marks: Path) -> None:
    holder = procs.start(["switch", hold_until(marks), str(lock_dir)])
    wait_for(marks / "h.held")
    with_proc = json.loads(
        run_cli(["status", "switch", "--lock-dir", str(lock_dir), "--json"]).stdout
    )
    without = json.loads(
        run_cli(["status", "switch", "--lock-dir", str(lock_dir), "--json"], env=NO_PROC).stdout
    )
    assert with_proc["method"] == "proc" and without["method"] == "probe"
    assert with_proc["holders"][0]["pid"] == without["holders"][0]["pid"] == holder.pid
    (marks / "h.go").touch()
    assert holder.wait(20) == 0


@pytest.mark.parametrize("ask", [["--help"], ["run", "--help"], []])
def test_help_without_click_says_what_is_missing(ask: list[str]) -> None:
    """An interpreter without click (the action's tool-cache install runs nested calls with
    the runner's python): asking for help ended in a ModuleNotFoundError traceback."""
    src = Path(__file__).resolve().parents[2] / "src"
    code = (
        "import sys; sys.modules['click'] = None; "  # import click fails, as without it
        f"sys.path.insert(0, {str(src)!r}); sys.argv[1:] = {ask!r}; "
        "from local_mutex.cli import main, run_and_exit; run_and_exit(main)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "need click" in r.stderr, r.stderr


def test_help_with_a_click_this_python_cannot_import_says_so(tmp_path: Path) -> None:
    """A click that fails to import (one for a newer Python: a SyntaxError) was a
    traceback, not the line that says help needs click."""
    broken = tmp_path / "click"
    broken.mkdir()
    (broken / "__init__.py").write_text("def f(x:\n")
    src = Path(__file__).resolve().parents[2] / "src"
    env = clean_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{src}"})
    r = subprocess.run(
        [sys.executable, "-m", "local_mutex", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "need click" in r.stderr, r.stderr
    assert "cannot import (SyntaxError" in r.stderr
