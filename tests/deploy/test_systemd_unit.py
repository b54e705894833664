"""The committed service definitions (deploy/): the systemd unit, the launchd plist and the
Kubernetes manifest. Each is checked by the tool that would load it where one exists here
(`systemd-analyze verify`), else parsed as that tool would, and every steward command line in
them is parsed by steward's own CLI, so a renamed flag breaks this test, not a deployment.
The numbers that must agree with steward's behaviour (exit codes, drain timeout vs. stop
timeout, probe paths) are asserted here.
"""

from __future__ import annotations

import plistlib
import re
import shlex
import shutil
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from steward.cli import parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNIT = DEPLOY / "steward.service"
DRAIN_TIMEOUT = 30.0  # steward's default --drain-timeout (SPEC §3)
EX_TEMPFAIL, EX_CONFIG = 75, 78


def unit_sections(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as {section: {key: [values, in order]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(span: str) -> float:
    """A systemd time span (`45s`, `20min`, `1min 30s`, `90`) in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span):
        total += float(number) * units[unit]
    return total


def serve_args(argv: list[str]) -> Namespace:
    """`steward serve ...` parsed by steward's own parser: unknown flags fail here."""
    assert argv[0] == "serve", argv
    return parser().parse_args(argv)


def installed_steward() -> Path:
    """The `steward` executable of the venv running the tests (beside its python)."""
    candidate = Path(sys.executable).parent / "steward"
    found = candidate if candidate.is_file() else shutil.which("steward")
    if not found:
        pytest.fail("no `steward` executable beside the test interpreter or on PATH")
    return Path(found)


# --- systemd -------------------------------------------------------------------------------


def test_systemd_analyze_verify_passes_cleanly(tmp_path: Path) -> None:
    """`systemd-analyze verify` checks every key and value as systemd would load them. It also
    requires ExecStart's executable to exist, and the unit names the install location
    (/opt/steward/.venv), so it verifies a copy whose ExecStart points at this venv's steward;
    nothing else is changed."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian/Ubuntu: apt-get install systemd)")
    text = UNIT.read_text()
    (exec_start,) = unit_sections(text)["Service"]["ExecStart"]
    committed = shlex.split(exec_start)[0]
    copy = tmp_path / "steward.service"
    copy.write_text(text.replace(committed, str(installed_steward())))
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60
    )
    about_us = [line for line in (result.stdout + result.stderr).splitlines() if "steward" in line]
    assert result.returncode == 0, result.stdout + result.stderr
    assert about_us == [], "systemd-analyze warns:\n" + "\n".join(about_us)


def test_systemd_unit_matches_stewards_contract() -> None:
    """Exit codes, notify protocol, stop timing: what SPEC §7 asks of a supervisor."""
    unit = unit_sections(UNIT.read_text())
    service = {key: values[-1] for key, values in unit["Service"].items()}
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"  # the worker must not be able to notify
    assert service["Restart"] == "on-failure"  # restarts 75, not 0
    assert str(EX_CONFIG) in service["RestartPreventExitStatus"].split()
    success = service.get("SuccessExitStatus", "").split()
    assert str(EX_TEMPFAIL) not in success and str(EX_CONFIG) not in success
    assert service["KillSignal"] == "SIGTERM"
    # SIGTERM to the front only; the default control-group mode would kill the worker too
    # and cut the generations the drain is meant to finish.
    assert service["KillMode"] == "mixed"
    args = serve_args(shlex.split(service["ExecStart"])[1:])
    assert seconds(service["TimeoutStopSec"]) > args.drain_timeout
    assert seconds(service["TimeoutStartSec"]) >= 10 * 60  # model loads take minutes
    assert seconds(service["WatchdogSec"]) > 0
    assert seconds(unit["Unit"]["StartLimitIntervalSec"][-1]) > 0
    assert int(unit["Unit"]["StartLimitBurst"][-1]) >= 2
    assert service["CacheDirectory"] == "steward"
    assert "STEWARD_CACHE_DIR=%C/steward" in unit["Service"]["Environment"]
    for key, value in {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "read-only",
        "PrivateTmp": "yes",
    }.items():
        assert service[key] == value, key


# --- launchd -------------------------------------------------------------------------------


def test_launchd_plist_parses_and_restarts_only_unsuccessful_exits() -> None:
    """plutil is macOS-only; plistlib's XML parser rejects what launchd would (including
    `--` inside a comment), and the keys launchd acts on are checked."""
    with (DEPLOY / "steward.plist").open("rb") as f:
        plist = plistlib.load(f)
    assert plist["KeepAlive"]["SuccessfulExit"] is False  # restart after a non-zero exit
    assert plist["RunAtLoad"] is True
    assert plist["ThrottleInterval"] >= 5  # launchd's only backoff between restarts
    program, *argv = plist["ProgramArguments"]
    assert Path(program).is_absolute() and program.endswith("/steward")
    args = serve_args(argv)
    assert plist["ExitTimeOut"] > args.drain_timeout  # SIGKILL must not cut the drain
    for key in ("StandardOutPath", "StandardErrorPath"):
        assert Path(plist[key]).is_absolute(), key  # launchd does not expand ~
    assert Path(plist["EnvironmentVariables"]["STEWARD_CACHE_DIR"]).is_absolute()


# --- Kubernetes ----------------------------------------------------------------------------


def test_kubernetes_probes_and_grace_period_fit_stewards_health_and_drain() -> None:
    """Readiness/startup on /health/ready (503 while recovering), liveness on /health/live
    (200 whatever the backend does), and a grace period that covers preStop + drain."""
    yaml = pytest.importorskip("yaml", reason="PyYAML not installed (pip install pyyaml)")
    docs = {
        doc["kind"]: doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text())
    }
    deployment, service = docs["Deployment"], docs["Service"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["restartPolicy"] == "Always"

    assert container["command"] == ["steward"]
    args = serve_args(container["args"])
    assert args.host == "0.0.0.0"  # reachable by probes and the Service
    (port,) = container["ports"]
    assert port["containerPort"] == args.port

    def probe(name: str) -> dict:
        get = container[name]["httpGet"]
        assert get["port"] in (port["name"], port["containerPort"]), name
        return container[name]

    assert probe("startupProbe")["httpGet"]["path"] == "/health/ready"
    assert probe("readinessProbe")["httpGet"]["path"] == "/health/ready"
    assert probe("livenessProbe")["httpGet"]["path"] == "/health/live"
    startup = container["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 10 * 60  # model loads

    pre_stop = container["lifecycle"]["preStop"]
    sleep = (
        pre_stop["sleep"]["seconds"]
        if "sleep" in pre_stop
        else float(pre_stop["exec"]["command"][-1])
    )
    assert sleep > 0  # endpoints are removed before the drain refuses new requests
    assert args.drain_timeout == DRAIN_TIMEOUT
    # The grace period starts with preStop; SIGKILL comes at its end.
    assert pod["terminationGracePeriodSeconds"] >= sleep + args.drain_timeout + 5

    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] in (port["name"], port["containerPort"])
