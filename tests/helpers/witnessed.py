"""Callers whose commands report, at their own start, any live process of another's command.

The commands run ``witness.py`` first (``Witnessed.enter``); the callers are started with
``Witnessed.env`` so their processes carry a tag that finds them again in /proc.
"""

from __future__ import annotations

import signal
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import procwatch as pw

WITNESS = Path(__file__).resolve().parent / "witness.py"


class Witnessed:
    """Callers whose commands report each other: env, command prefix, what each saw."""

    def __init__(self, marks: Path) -> None:
        self.marks = marks
        self.tag = f"hg-{uuid.uuid4().hex[:12]}"

    def env(self, caller: str) -> dict[str, str]:
        return {"LM_WITNESS": self.tag, "LM_CALLER": caller}

    def enter(self, caller: str) -> str:
        """Shell words that record CALLER's start and whatever of the others still runs."""
        return f"\"{sys.executable}\" -S -E '{WITNESS}' '{self.marks}' {caller}"

    def seen(self, caller: str) -> list[str]:
        return (self.marks / f"{caller}.seen").read_text().splitlines()

    def started(self, caller: str) -> float:
        return float((self.marks / f"{caller}.start").read_text())

    def processes(self) -> list[int]:
        """Every live process started for this test (callers, supervisors, commands)."""
        return pw.tagged("LM_WITNESS", self.tag)

    def command_processes(self, caller: str) -> list[int]:
        return [
            p
            for p in self.processes()
            if pw.environ(p).get("LM_CALLER") == caller and pw.is_command_process(p)
        ]

    def assert_saw_nobody(self, caller: str) -> None:
        seen = self.seen(caller)
        assert seen == [], f"{caller} started while another holder's command still ran: {seen}"


@contextmanager
def witnessed(marks: Path) -> Iterator[Witnessed]:
    """A ``Witnessed``; whatever a failed test (or a broken product) left running is
    SIGKILLed at the end."""
    w = Witnessed(marks)
    try:
        yield w
    finally:
        for _ in range(3):
            left = w.processes()
            if not left:
                break
            pw.signal_quietly(left, signal.SIGKILL)
            time.sleep(0.1)
