"""The agents' CLIs the suite drives, pinned, installed from npm into `.venv/agents`.

Each version has its own folder (`.venv/agents/claude-2.1.332`), filled once: a pin that
changes installs beside the old one, and a run that overrides the pins (to test the newest
CLIs) does not disturb the pinned ones. `STEWARD_AGENT_VERSIONS` overrides them: `latest`
(every CLI at npm's newest) or `claude=2.1.340,codex=latest` (some of them).

`python -m tests.agents.install` installs them (scripts/setup.sh test does); the tests' session
fixture does the same, so a run of pytest alone finds them too.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / ".venv" / "agents"


@dataclass(frozen=True)
class Cli:
    """One agent's CLI: its npm package, the version pinned, the command it installs."""

    name: str
    package: str
    pin: str
    command: str


CLIS = {
    cli.name: cli
    for cli in (
        Cli("claude", "@anthropic-ai/claude-code", "2.1.332", "claude"),
        Cli("codex", "@openai/codex", "0.171.0", "codex"),
        Cli("opencode", "opencode-ai", "1.18.33", "opencode"),
    )
}
NO_NODE = (
    "node and npm are needed to install the agents' CLIs: `apt-get install nodejs npm` "
    "(Debian, Ubuntu), `brew install node` (macOS), or https://nodejs.org"
)


class Unavailable(Exception):
    """A CLI that cannot be installed here (no npm, no registry): why, and how to mend it."""


def wanted(overrides: str | None = None) -> dict[str, str]:
    """Each CLI's version spec: its pin, or what `STEWARD_AGENT_VERSIONS` says."""
    text = os.environ.get("STEWARD_AGENT_VERSIONS", "") if overrides is None else overrides
    specs = {name: cli.pin for name, cli in CLIS.items()}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, version = item.rpartition("=")
        if not name:
            specs = dict.fromkeys(specs, version)
        elif name in specs:
            specs[name] = version
        else:
            raise ValueError(f"STEWARD_AGENT_VERSIONS: no CLI named {name!r} (one of {list(CLIS)})")
    return specs


def npm(*args: str) -> str:
    if not shutil.which("npm"):
        raise Unavailable(NO_NODE)
    done = subprocess.run(["npm", *args], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise Unavailable(f"npm {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def resolve(cli: Cli, spec: str) -> str:
    """A version spec (`2.1.332`, `latest`, a range) as the exact version npm has."""
    if spec.count(".") == 2 and spec.replace(".", "").isdigit():
        return spec
    return npm("view", f"{cli.package}@{spec}", "version").split()[-1].strip("'")


def install(cli: Cli, version: str) -> Path:
    """The CLI's command at `version`, installed if it is not there yet."""
    home = AGENTS / f"{cli.name}-{version}"
    command = home / "node_modules" / ".bin" / cli.command
    if command.exists():
        return command
    AGENTS.mkdir(parents=True, exist_ok=True)
    with (AGENTS / ".lock").open("w") as lock:  # one installer at a time (pytest workers)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if command.exists():
            return command
        partial = home.with_name(home.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        npm(
            "install",
            "--prefix",
            str(partial),
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            f"{cli.package}@{version}",
        )
        partial.rename(home)
    return command


def commands(overrides: str | None = None) -> dict[str, Path]:
    """Every CLI's command, at the versions wanted, installed where missing."""
    specs = wanted(overrides)
    return {name: install(cli, resolve(cli, specs[name])) for name, cli in CLIS.items()}


if __name__ == "__main__":
    try:
        for name, command in commands().items():
            print(f"{name}: {command}")
    except Unavailable as why:
        print(f"agents' CLIs not installed: {why}", file=sys.stderr)
        sys.exit(1)
