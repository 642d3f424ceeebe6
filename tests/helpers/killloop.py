"""The kill loop (issue 9): three callers on one name, random signals to whatever runs.

One implementation, used by ``tests/e2e/test_kill_loop.py`` (30 iterations) and
``bench/kill_loop.py`` (200). Each iteration starts three callers of one lock name; every
command records, at its own start (``witness.py``), any live process of another caller's
command, keeps a background member in its group, and writes an end marker when it ends on its
own. Meanwhile SIGKILL/SIGTERM/SIGINT go, at random moments, to a supervisor process (the CLI
pid, or a supervisor it forked), to the command's top process and to one other process in its
group, and a tmp cleaner deletes the lock file, a fourth caller coming right after. Counted:

- overlaps: a command started while another caller's command still had a live process (or two
  commands' start..end intervals intersect);
- left held: once no process of the iteration lives, its lock is still held;
- orphans: a command descendant still alive 5 s after the loop.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from helpers import CLI, clean_env, lock_file
from helpers import procwatch as pw

WITNESS = Path(__file__).resolve().parent / "witness.py"
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
# What each iteration may hit: three kinds of process, and the lock file (a tmp cleaner).
KINDS = ("supervisor", "top", "member", "cleaner")
CALLERS = 3  # started together; a fourth comes right after a deletion (``cleaner``)
ORPHAN_GRACE = 5.0
# A supervisor stopping a group may need TERM, then KILL ~3 s later.
SETTLE = 4.5
CALLER_CEILING = 30.0
# Ran, or was stopped by one of our signals (negative: the CLI itself died of it).
EXPECTED_STATUSES = {0, 128 + 2, 128 + 9, 128 + 15, -2, -9, -15}


def _bg_sleep() -> str:
    """A background member that dies of SIGINT too (sh starts `&` jobs with INT ignored)."""
    env = shutil.which("env")
    if env is not None:
        ok = subprocess.run([env, "--default-signal=INT,QUIT", "true"], capture_output=True)
        if ok.returncode == 0:
            return f"'{env}' --default-signal=INT,QUIT sleep 30"
    return "sleep 30"


@dataclass
class Counts:
    iterations: int = 0
    overlaps: int = 0
    left_held: int = 0
    orphans: int = 0
    hung_callers: int = 0
    signals_sent: int = 0
    deletions: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)

    def bad(self) -> int:
        return self.overlaps + self.left_held + self.orphans + self.hung_callers

    def summary(self) -> str:
        codes = ", ".join(f"{k}:{v}" for k, v in sorted(self.statuses.items()))
        return (
            f"iterations={self.iterations} overlaps={self.overlaps} "
            f"left_held={self.left_held} orphans={self.orphans} "
            f"hung_callers={self.hung_callers} signals_sent={self.signals_sent} "
            f"deletions={self.deletions} "
            f"exit_statuses={{{codes}}}"
        )


class _Iteration:
    def __init__(self, loop_tag: str, index: int, work: Path, rng: random.Random) -> None:
        self.loop_tag, self.index, self.rng = loop_tag, index, rng
        self.tag = f"{loop_tag}-{index}"
        self.name = f"kl{index}"
        self.locks = work / "locks"
        self.marks = work / f"it{index}"
        self.marks.mkdir()
        self.callers: list[subprocess.Popen[bytes]] = []
        # Targets depend on timing: draw them apart so the plan itself stays seeded.
        self.pick = random.Random(rng.random())

    def env(self, caller: int) -> dict[str, str]:
        return {"LM_LOOP": self.loop_tag, "LM_WITNESS": self.tag, "LM_CALLER": str(caller)}

    def command(self, caller: int, bg: str) -> str:
        m = self.marks
        work = self.rng.uniform(0.08, 0.25)
        return (
            f"\"{sys.executable}\" -S -E '{WITNESS}' '{m}' {caller}; "
            f"{bg} & bg=$!; sleep {work:.2f}; kill $bg 2>/dev/null; wait; "
            f"date +%s.%N > '{m}/{caller}.end'"
        )

    def start(self, bg: str) -> None:
        for _ in range(CALLERS):
            self.start_one(bg)

    def start_one(self, bg: str) -> None:
        k = len(self.callers)
        with open(self.marks / f"caller{k}.err", "wb") as err:
            self.callers.append(
                subprocess.Popen(
                    [*CLI, "--wait", "60", "-q", self.name, self.command(k, bg), str(self.locks)],
                    env=clean_env(self.env(k)),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )

    # -- who is who, from /proc ----------------------------------------------------------------

    def processes(self) -> dict[int, dict[str, str]]:
        out = {}
        for p in pw.all_pids():
            env = pw.environ(p)
            if env.get("LM_WITNESS") == self.tag and pw.alive(p):
                out[p] = env
        return out

    def commands_by_caller(self) -> dict[str, list[int]]:
        by: dict[str, list[int]] = {}
        for p, env in self.processes().items():
            if pw.is_command_process(p, env):
                by.setdefault(env.get("LM_CALLER", "?"), []).append(p)
        return by

    def supervisors_of(self, caller: str) -> list[int]:
        return [
            p
            for p, env in self.processes().items()
            if env.get("LM_CALLER") == caller and not pw.is_command_process(p, env)
        ]

    def target(self, kind: str) -> int | None:
        running = self.commands_by_caller()
        if not running:  # between holders: a supervisor of any caller still running
            if kind != "supervisor":
                return None
            live = [str(k) for k, c in enumerate(self.callers) if c.poll() is None]
            if not live:
                return None
            sups = self.supervisors_of(self.pick.choice(live))
            return self.pick.choice(sups) if sups else None
        caller = self.pick.choice(sorted(running))
        procs = running[caller]
        if kind == "supervisor":  # the CLI pid or the supervisor it forked, if any
            sups = self.supervisors_of(caller)
            return self.pick.choice(sups) if sups else None
        tops = [p for p in procs if pw.pgid(p) == p]
        if kind == "top":
            return tops[0] if tops else None
        members = [p for p in procs if p not in tops]
        return self.pick.choice(members) if members else None

    # -- the checks ------------------------------------------------------------------------------

    def overlaps(self) -> list[str]:
        found = []
        spans: dict[int, tuple[float, float | None]] = {}
        for k in range(len(self.callers)):
            seen = self.marks / f"{k}.seen"
            if seen.exists() and seen.read_text().strip():
                found.append(f"it{self.index} caller {k} started beside: {seen.read_text()!r}")
            t_start, t_end = _stamp(self.marks / f"{k}.start"), _stamp(self.marks / f"{k}.end")
            if t_start is not None:
                spans[k] = (t_start, t_end)
        for a, (sa, ea) in spans.items():
            for b, (sb, _) in spans.items():
                if a != b and ea is not None and sa <= sb < ea:
                    found.append(f"it{self.index} caller {b} started inside caller {a}'s run")
        return found


def run_kill_loop(
    iterations: int,
    seed: int,
    work: Path,
    *,
    budget: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> Counts:
    """Run the loop in WORK (a fresh directory); stop early once BUDGET seconds are spent."""
    rng = random.Random(seed)
    loop_tag = f"kl-{seed}-{uuid.uuid4().hex[:8]}"
    (work / "locks").mkdir(parents=True, exist_ok=True)
    bg = _bg_sleep()
    counts = Counts()
    t0 = time.monotonic()
    # Started in the background by a shell (`cmd &`, nohup), we would pass SIGINT on ignored,
    # and every SIGINT of the loop would be a no-op: let the callers get the default.
    int_was = signal.getsignal(signal.SIGINT)
    if int_was == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for i in range(iterations):
            if budget is not None and time.monotonic() - t0 > budget:
                counts.details.append(f"stopped after {i} iterations: time budget spent")
                break
            _one(_Iteration(loop_tag, i, work, rng), counts, bg)
            counts.iterations += 1
            if progress is not None and (i + 1) % 10 == 0:
                progress(f"{i + 1}/{iterations}: {counts.summary()}")
        # Orphans: a command descendant still alive ORPHAN_GRACE seconds after the loop.
        deadline = time.monotonic() + ORPHAN_GRACE
        while _loop_commands(loop_tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _loop_commands(loop_tag)
        counts.orphans = len(left)
        for p in left[:10]:
            counts.details.append(f"orphan {p}: {_describe(p)}")
    finally:
        if int_was == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        for _ in range(3):
            rest = pw.tagged("LM_LOOP", loop_tag)
            if not rest:
                break
            pw.signal_quietly(rest, signal.SIGKILL)
            time.sleep(0.1)
    return counts


def _one(it: _Iteration, counts: Counts, bg: str) -> None:
    actions = sorted(
        (it.rng.uniform(0.0, 0.9), kind, it.rng.choice(SIGNALS))
        for kind in KINDS
        if it.rng.random() < 0.75
    )
    it.start(bg)
    t0 = time.monotonic()
    for at, kind, sig in actions:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if kind == "cleaner":  # and a newcomer at once, in the tick before any put-back
            try:
                lock_file(it.locks, it.name).unlink()
                counts.deletions += 1
            except FileNotFoundError:
                pass
            it.start_one(bg)
            continue
        pid = it.target(kind)
        if pid is not None:
            try:
                os.kill(pid, sig)
                counts.signals_sent += 1
            except OSError:
                pass
    for k, c in enumerate(it.callers):
        try:
            status = c.wait(max(0.1, t0 + CALLER_CEILING - time.monotonic()))
        except subprocess.TimeoutExpired:
            counts.hung_callers += 1
            counts.details.append(f"it{it.index} caller {k} still running after the ceiling")
            c.kill()
            status = c.wait()
        counts.statuses[status] = counts.statuses.get(status, 0) + 1
        if status not in EXPECTED_STATUSES:
            err = (it.marks / f"caller{k}.err").read_text(errors="replace").strip()
            counts.details.append(f"it{it.index} caller {k} exited {status}: {err[-300:]!r}")
    # Supervisors that outlived their CLI (it was killed) may still be stopping a group.
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline:
        live = it.processes()
        if not live or all(pw.is_command_process(p, env) for p, env in live.items()):
            break  # nothing left, or only commands nobody supervises any more
        time.sleep(0.05)
    overlaps = it.overlaps()
    counts.overlaps += len(overlaps)
    counts.details.extend(overlaps)
    path = lock_file(it.locks, it.name)
    if not it.processes() and pw.flock_held(path):
        counts.left_held += 1
        who = [f"{p} {_describe(p)}" for p in pw.openers(path)]
        counts.details.append(
            f"it{it.index}: {path.name} held, no process of its callers alive; open in: {who}"
        )


def _stamp(path: Path) -> float | None:
    """A time a command wrote, or None (never written, or killed mid-write: empty)."""
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def _loop_commands(loop_tag: str) -> list[int]:
    return [p for p in pw.tagged("LM_LOOP", loop_tag) if pw.is_command_process(p)]


def _describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        argv = "?"
    return f"state={pw.state(pid)} ppid={pw.ppid(pid)} {argv[:120]}"
