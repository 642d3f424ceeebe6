"""GitHub Actions files: step outputs, the job summary, and the command's own GITHUB_OUTPUT."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def format_outputs(values: Mapping[str, str]) -> str:
    """``key=value`` lines; multi-line values use a random heredoc delimiter."""
    lines = []
    for key, value in values.items():
        if "\n" in value or "\r" in value:
            delimiter = f"ghadelimiter_{os.urandom(8).hex()}"
            lines.append(f"{key}<<{delimiter}\n{value}\n{delimiter}\n")
        else:
            lines.append(f"{key}={value}\n")
    return "".join(lines)


def append(path: str | None, text: str) -> None:
    """Append to a runner file (GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, ...) when there is one."""
    if not path:
        return
    with open(path, "a", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)


def capture_file(env: Mapping[str, str]) -> str:
    """A fresh private file (mkstemp, never a predictable name) for the command's outputs."""
    import tempfile

    directory = env.get("RUNNER_TEMP") or None
    if directory and not os.path.isdir(directory):
        directory = None
    fd, path = tempfile.mkstemp(prefix="local-mutex-output-", dir=directory)
    os.close(fd)
    return path


def discard_if_empty(path: str) -> bool:
    """Remove a ``capture_file`` nothing was written to; whether it is gone."""
    try:
        if os.stat(path).st_size == 0:
            os.unlink(path)
            return True
    except OSError:
        pass
    return False


def summary_row(name: str, waited: str, held: str, outcome: str) -> str:
    from .lines import printable

    def cell(text: str) -> str:
        # Escaped as the log escapes it: a right-to-left mark could make a name read
        # backwards, a line separator start a new line.
        return printable(text).replace("|", "\\|")

    return (
        "| lock | waited | held | result |\n| --- | --- | --- | --- |\n"
        f"| {code_span(cell(name))} | {waited} | {held} | {cell(outcome)} |\n"
    )


def code_span(text: str) -> str:
    """``text`` as one Markdown code span, whatever backticks it holds: fenced by a run
    longer than any inside (a lone backtick would close the span, and what follows would
    render as Markdown: a link of the name's choosing), padded so an edge one stays text."""
    longest, run = 0, 0
    for c in text:
        run = run + 1 if c == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    edges = text[:1] + text[-1:]
    pad = " " if "`" in edges or (edges == "  " and text.strip(" ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"
