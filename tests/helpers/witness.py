"""Run by a locked command at its own start: did anyone else's command still run?

    python -S -E witness.py MARK_DIR CALLER

A "command process" is a live (non-zombie) process whose starting environment has
``LM_WITNESS=<the same tag>`` and ``LOCAL_MUTEX_CLI`` (only the locked command and its
descendants get that variable; the callers' own processes are started without it) and that
is not local-mutex itself. Those
of another caller (``LM_CALLER`` differs) are written to ``MARK_DIR/CALLER.seen``, one
``pid caller state cmdline`` a line (empty: nobody). Then ``MARK_DIR/CALLER.start`` gets
this moment (epoch seconds) — that file is the marker to wait for.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from helpers import procwatch


def others(tag: str, caller: str) -> list[str]:
    seen = []
    for pid in procwatch.all_pids():
        env = procwatch.environ(pid)
        if env.get("LM_WITNESS") != tag or not procwatch.is_command_process(pid, env):
            continue
        if env.get("LM_CALLER") == caller or not procwatch.alive(pid):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        seen.append(f"{pid} {env.get('LM_CALLER')} {procwatch.state(pid)} {cmd}")
    return seen


def main() -> None:
    marks, caller = sys.argv[1], sys.argv[2]
    now = time.time()
    tag = os.environ.get("LM_WITNESS", "")
    seen = others(tag, caller) if tag else []
    with open(os.path.join(marks, f"{caller}.seen"), "w") as f:
        f.write("".join(line + "\n" for line in seen))
    tmp = os.path.join(marks, f".{caller}.start")
    with open(tmp, "w") as f:
        f.write(f"{now:.6f}\n")
    os.rename(tmp, os.path.join(marks, f"{caller}.start"))


if __name__ == "__main__":
    main()
