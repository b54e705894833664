"""The agents' CLIs as a user runs them against steward: each one's settings (environment
and config files, in a home of its own), its one-shot turn and its resumed one.

Every CLI is told to stay off the network but for steward: no telemetry, no update checks,
no model lists fetched. What each setting is, and why, is in docs/agents.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

TURN_TIMEOUT = 240  # seconds: a CLI's turn, its retries and a worker's recovery included


@dataclass(frozen=True)
class Limits:
    """What the CLI is told of the model's context: its window, the tokens an answer may
    have, and where it compacts (None: the CLI's own defaults)."""

    window: int
    output: int = 4096
    compact_at: int | None = None


@dataclass
class Turn:
    """A finished run of the CLI."""

    args: list[str]
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        args = [arg if len(arg) < 80 else arg[:60] + f"... ({len(arg)} chars)" for arg in self.args]
        return f"{args[1:]} exited {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


class Agent:
    """One CLI in a home and a working folder of its own, pointed at `url`'s `model`."""

    name = ""
    compacted = b""  # what the CLI writes into its session's files when it compacts it

    def __init__(self, command: Path, root: Path, url: str, model: str, limits: Limits) -> None:
        self.command = command
        self.home = root / "home"
        self.work = root / "work"
        self.url = url
        self.model = model
        self.limits = limits
        self.home.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.configure()

    def configure(self) -> None:
        """Write the CLI's config files into its home."""

    def env(self) -> dict[str, str]:
        """The CLI's whole environment: nothing of the test process's leaks in."""
        node = shutil.which("node")
        path = os.pathsep.join(
            dict.fromkeys([str(Path(node).parent) if node else "", "/usr/bin", "/bin"])
        )
        return {
            "PATH": path.strip(os.pathsep),
            "HOME": str(self.home),
            "TERM": "dumb",
            "LANG": "C.UTF-8",
        }

    def args(self, prompt: str, again: bool) -> list[str]:
        raise NotImplementedError

    def holds(self, text: bytes) -> bool:
        """Whether any file in the CLI's home (its sessions, its logs) holds `text`."""
        return any(p.is_file() and text in p.read_bytes() for p in self.home.rglob("*"))

    def turn(self, prompt: str, *, again: bool = False) -> Turn:
        """One turn in the working folder; `again`: the same session's next turn."""
        args = [str(self.command), *self.args(prompt, again)]
        done = subprocess.run(
            args,
            cwd=self.work,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TURN_TIMEOUT,
        )
        return Turn(args, done.returncode, done.stdout, done.stderr)


class Claude(Agent):
    """Claude Code's `-p` (print) mode, through the Anthropic dialect."""

    name = "claude"
    compacted = b'"subtype":"compact_boundary"'

    def env(self) -> dict[str, str]:
        limits = self.limits
        env = {
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": "steward",  # any: steward runs here without --api-key
            "ANTHROPIC_MODEL": self.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": self.model,  # its small model, for side requests
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # telemetry, updates, reports
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(limits.output),
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(limits.window),
        }
        if limits.compact_at:  # a share of the window, in percent
            env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] = str(100 * limits.compact_at // limits.window)
        return super().env() | env

    def args(self, prompt: str, again: bool) -> list[str]:
        allowed = ["--allowedTools", "Bash(cat note.txt)"]  # the one call the model makes
        return ["-p", prompt, "--model", self.model, *allowed, *(["--continue"] if again else [])]


class Codex(Agent):
    """Codex's `exec` mode, through the Responses dialect (a provider of its own)."""

    name = "codex"
    compacted = b'"type":"compacted"'

    def configure(self) -> None:
        limits = self.limits
        lines = [
            f'model = "{self.model}"',
            'model_provider = "steward"',
            f"model_context_window = {limits.window}",
            *(
                [f"model_auto_compact_token_limit = {limits.compact_at}"]
                if limits.compact_at
                else []
            ),
            "check_for_update_on_startup = false",
            "[analytics]",
            "enabled = false",
            "[feedback]",
            "enabled = false",
            "[model_providers.steward]",
            'name = "steward"',
            f'base_url = "{self.url}/v1"',
            'wire_api = "responses"',
        ]
        (self.home / ".codex").mkdir(exist_ok=True)
        (self.home / ".codex" / "config.toml").write_text("\n".join(lines) + "\n")

    def args(self, prompt: str, again: bool) -> list[str]:
        # The sandbox is Codex's own (bubblewrap); the test's folder is its own already.
        flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        return ["exec", *(["resume", "--last"] if again else []), *flags, prompt]


class Opencode(Agent):
    """opencode's `run` mode, through chat completions (its OpenAI-compatible provider)."""

    name = "opencode"
    compacted = b'"type":"compaction"'

    @property
    def config(self) -> Path:
        return self.home / "opencode.json"

    def configure(self) -> None:
        limits = self.limits
        limit = {"context": limits.window, "output": limits.output}
        if limits.compact_at:  # it compacts at `input` less `compaction.reserved`
            limit["input"] = limits.window
        model = {"name": self.model, "limit": limit}
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "name": "steward",
            "options": {"baseURL": f"{self.url}/v1", "apiKey": "steward"},
            "models": {self.model: model},
        }
        config = {
            "$schema": "https://opencode.ai/config.json",
            "model": f"steward/{self.model}",
            "small_model": f"steward/{self.model}",
            "provider": {"steward": provider},
            "autoupdate": False,
            "share": "disabled",
            "permission": {"bash": "allow"},
        }
        if limits.compact_at:
            config["compaction"] = {"reserved": limits.window - limits.compact_at}
        self.config.write_text(json.dumps(config, indent=2))

    def env(self) -> dict[str, str]:
        env = {
            "OPENCODE_CONFIG": str(self.config),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",  # models.dev
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "npm_config_offline": "true",  # its config folder's plugin package: not fetched
        }
        return super().env() | env

    def args(self, prompt: str, again: bool) -> list[str]:
        return ["run", *(["--continue"] if again else []), prompt]


AGENTS: dict[str, type[Agent]] = {cls.name: cls for cls in (Claude, Codex, Opencode)}
