"""`steward drill`: the field report's repro, run against any OpenAI-compatible server.

A baseline request, an inducing one, then N ordinary ones while `/health` is sampled; the
verdict says whether the server recovered, exited or kept failing, or refused the inducing
request so that nothing was induced. No client-side retries: the point is what the server
does. The outage is timed from what health and the ordinary requests saw, never from the
inducing request's own answer, which may come long after the fault or long after the
recovery. docs/drill.md defines "recovered" and the outage.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import shlex
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import httpx

ORDINARY = [{"role": "user", "content": "Say hello."}]
EXIT_WAIT_S = 10.0  # how long a spawned server that stopped serving gets to exit
RETRY = (("true", "true"), ("false", "false"), ("absent", None))  # the header's values
RETRYABLE = (("true", True), ("false", False), ("absent", None))  # the envelope's
STEWARD = (("status",), ("worker", "generation"), ("worker", "pid"), ("faults", "total"))
Span = list[float | None]  # [start, end], seconds since the drill started; end None: not over


class Kind(StrEnum):
    """The verdicts, in the order their rules are tried (docs/drill.md)."""

    EXITED = "exited"
    NOT_INDUCED = "not_induced"
    NOT_RECOVERED = "not_recovered"
    NO_FAULT = "no_fault"
    REPLACED = "replaced"
    IN_PLACE = "in_place"


EXIT = {
    Kind.REPLACED: 0,
    Kind.IN_PLACE: 0,
    Kind.EXITED: 1,
    Kind.NOT_RECOVERED: 1,
    Kind.NO_FAULT: 2,
    Kind.NOT_INDUCED: 3,
}
EXIT_CODES = """exit status:
  0  recovered: in place, or by worker replacement
  1  not recovered: the server exited, or was still failing at the end
  2  inconclusive: the drill could not run, or no fault was observed
  3  not induced: the server refused the inducing request (4xx) and nothing faulted"""


class DrillError(Exception):
    """The drill could not run: nothing can be concluded about recovery."""


@dataclass
class Outcome:
    """One request, as the client saw it."""

    kind: str  # baseline | induce | ordinary
    t: float  # when it started, in seconds since the drill started
    status: int | str  # the HTTP status, or "down" / "timeout"
    ok: bool
    error: str | None = None  # the error envelope's type
    retryable: bool | None = None  # the error envelope's retryable
    should_retry: str | None = None  # the x-should-retry header
    latency_ms: float = 0.0
    answered: float = 0.0  # when its answer (or failure) came: when the client saw it


@dataclass
class Sample:
    """One health sample. The steward fields stay None for other servers."""

    t: float
    status: int | str  # /health's HTTP status, or "down" / "timeout"
    ready: int | str | None  # /health/ready's, when the server has one
    state: str | None
    generation: int | None
    pid: int | None
    faults: int | None

    @property
    def healthy(self) -> bool:
        """Ready to serve: /health 2xx, and /health/ready 2xx where the server has one."""
        return _2xx(self.status) and (self.ready is None or _2xx(self.ready))


def _2xx(status: int | str | None) -> bool:
    return isinstance(status, int) and 200 <= status < 300


def _4xx(status: int | str | None) -> bool:
    return isinstance(status, int) and 400 <= status < 500


def dig(value: Any, *keys: str) -> Any:
    """`value[k1][k2]...`, or None wherever the JSON differs: any server's body is tolerated."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _scalar(value: Any) -> Any:
    return value if isinstance(value, str | int | float) else None


def get(http: httpx.Client, path: str) -> tuple[int | str, Any]:
    """A GET's status and JSON body (None if not JSON); a transport failure is a status too."""
    try:
        r = http.get(path)
    except httpx.TimeoutException:
        return "timeout", None
    except httpx.TransportError:
        return "down", None
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, None


def big_png(edge: int) -> bytes:
    """A grey edge x edge RGB PNG: the GPU's work grows with its pixels, yet on the wire it
    is small (its rows repeat), so no body limit stops it first."""
    z = zlib.compressobj()
    data = b"".join(z.compress(b"\0" + b"\x80" * 3 * edge) for _ in range(edge)) + z.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", edge, edge, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def inducing(induce: str, edge: int) -> list[dict[str, Any]]:
    """The inducing request's messages: a huge image, or a prompt carrying a fault marker."""
    if induce == "image":
        url = "data:image/png;base64," + base64.b64encode(big_png(edge)).decode()
        parts = [{"type": "text", "text": "Describe this image."}]
        return [
            {"role": "user", "content": [*parts, {"type": "image_url", "image_url": {"url": url}}]}
        ]
    return [{"role": "user", "content": "Say hello. " + induce.removeprefix("marker=")}]


class Watch(threading.Thread):
    """Samples health every 100 ms: what a load balancer or a supervisor would have seen."""

    def __init__(self, url: str, t0: float, proc: subprocess.Popen | None) -> None:
        super().__init__(daemon=True)
        self.http = httpx.Client(base_url=url, timeout=2)
        self.t0, self.proc = t0, proc
        self.samples: list[Sample] = []
        self.body: Any = None  # the last /health body that answered
        self.exit: tuple[float, int] | None = None  # (when, exit code) of a spawned server
        self.done = threading.Event()
        self.has_ready = get(self.http, "/health/ready")[0] not in (404, 405)
        self.sample()  # one before the baseline request, so the starting worker is known

    def sample(self) -> None:
        t = round(time.monotonic() - self.t0, 3)
        status, body = get(self.http, "/health")
        self.body = body if status not in ("down", "timeout") else self.body
        ready = get(self.http, "/health/ready")[0] if self.has_ready else None
        fields = (dig(body, *keys) for keys in STEWARD)  # scalars only: other servers differ
        self.samples.append(Sample(t, status, ready, *(_scalar(v) for v in fields)))
        self.exited()

    def exited(self) -> bool:
        if self.proc and self.exit is None and self.proc.poll() is not None:
            self.exit = (round(time.monotonic() - self.t0, 3), self.proc.returncode)
        return self.exit is not None

    def settle(self) -> None:
        """A spawned server that stopped serving gets a moment to exit, so its code is seen."""
        deadline = time.monotonic() + EXIT_WAIT_S
        while self.proc and not self.exited() and time.monotonic() < deadline:
            time.sleep(0.1)

    def run(self) -> None:
        due = time.monotonic()
        while not self.done.wait(max(0.0, (due := due + 0.1) - time.monotonic())):
            self.sample()
        self.http.close()


def send(
    http: httpx.Client, kind: str, messages: list, args: argparse.Namespace, t0: float
) -> Outcome:
    """One chat completion, no retries; the outcome keeps what the server said about retrying."""
    body: dict[str, Any] = {"messages": messages, "max_tokens": args.max_tokens, "temperature": 0}
    if args.model:
        body["model"] = args.model
    start = time.monotonic()
    try:
        r = http.post("/v1/chat/completions", json=body)
        status: int | str = r.status_code
    except httpx.TransportError as exc:
        status = "timeout" if isinstance(exc, httpx.TimeoutException) else "down"
    end = time.monotonic()
    ms, t, answered = round((end - start) * 1000, 1), round(start - t0, 3), round(end - t0, 3)
    outcome = Outcome(kind, t, status, _2xx(status), latency_ms=ms, answered=answered)
    if isinstance(status, str):
        return outcome
    if not r.is_success:
        try:
            error = dig(r.json(), "error")
        except ValueError:
            error = None
        outcome.error = str(dig(error, "type") or dig(error, "code") or "") or None
        outcome.retryable = dig(error, "retryable")
        outcome.should_retry = r.headers.get("x-should-retry")
    return outcome


def replaced(samples: list[Sample]) -> bool:
    """Did the worker change? By generation where the server reports one, else by pid."""
    for key in ("generation", "pid"):
        seen = [getattr(s, key) for s in samples if getattr(s, key) is not None]
        if seen:
            return seen[0] != seen[-1]
    return False


def health_outage(samples: list[Sample], induced_at: float) -> Span | None:
    """From the first unready poll after the inducing request was sent to the first ready one
    after which none was unready; None when health never showed trouble."""
    after = [s for s in samples if s.t >= induced_at]
    bad = [i for i, s in enumerate(after) if not s.healthy]
    if not bad:
        return None
    return [after[bad[0]].t, after[bad[-1] + 1].t if bad[-1] + 1 < len(after) else None]


def request_outage(requests: list[Outcome]) -> Span | None:
    """From the first failed ordinary answer to the first successful one after which none
    failed: what clients saw. The inducing request's own answer is left out."""
    ordinary = [r for r in requests if r.kind == "ordinary"]
    bad = [i for i, r in enumerate(ordinary) if not r.ok]
    if not bad:
        return None
    after = ordinary[bad[-1] + 1 :]
    return [ordinary[bad[0]].answered, after[0].answered if after else None]


def outage(*spans: Span | None) -> Span | None:
    """The first trouble either saw to the moment both saw none after; None while not over."""
    seen = [s for s in spans if s]
    if not seen or any(s[1] is None for s in seen):
        return None
    return [min(s[0] for s in seen), max(s[1] for s in seen)]


def refusal(induce: Outcome) -> str:
    """The refused inducing request's answer, for the verdict: `404 (not_found)`."""
    return f"{induce.status}" + (f" ({induce.error})" if induce.error else "")


def verdict(requests: list[Outcome], watch: Watch, induced_at: float) -> dict[str, Any]:
    """The rules of docs/drill.md, in Kind's order; the outage from health and ordinary requests.

    A 4xx answer to the inducing request is a refusal, so nothing was induced, unless the
    server showed a fault anyway: steward answers 422 `request_quarantined` to a request that
    faulted its worker, and its health, worker and fault count show that fault.
    """
    samples = watch.samples
    trusted = samples[0].healthy  # else /health says nothing: judge by requests alone
    by_health = health_outage(samples, induced_at) if trusted else None
    by_requests = request_outage(requests)
    span = outage(by_health, by_requests)
    recovery_s = round(span[1] - span[0], 2) if span else None
    counts = [s.faults for s in samples if s.faults is not None]
    rose = len(counts) > 1 and counts[-1] > counts[0]
    shown = bool(by_health or by_requests or replaced(samples) or rose)  # a fault, seen apart
    induce = next((r for r in requests if r.kind == "induce"), None)
    refused = induce if induce and _4xx(induce.status) and not shown else None
    tried = [r for r in requests if r.kind != "baseline"]
    trailing = len(tried) - max((i + 1 for i, r in enumerate(tried) if r.ok), default=0)
    if watch.exit:
        kind, text = Kind.EXITED, f"exited with code {watch.exit[1]}"
    elif refused:
        kind = Kind.NOT_INDUCED
        text = f"NOT INDUCED: the server refused the inducing request with {refusal(refused)}"
    elif trailing:
        down = " (server down)" if samples[-1].status == "down" else ""
        kind, text = Kind.NOT_RECOVERED, f"NOT RECOVERED: {trailing} consecutive failures{down}"
    elif not (shown or (induce and not induce.ok)):
        kind, text = Kind.NO_FAULT, "NO FAULT OBSERVED: nothing failed, health never changed"
    else:
        kind = Kind.REPLACED if replaced(samples) else Kind.IN_PLACE
        how = "by worker replacement" if kind == Kind.REPLACED else "in place"
        text = f"recovered {how}" + (f" in {recovery_s:.1f} s" if span else "")
        n = sum(1 for r in tried if r.kind == "ordinary" and not r.ok)
        text += f" after {n} failed requests" if n and kind == Kind.IN_PLACE else ""
    return {
        "kind": kind,
        "text": text,
        "recovered": EXIT[kind] == 0,
        "recovery_s": recovery_s,
        "outage": span,
        "health_outage": by_health,
        "request_outage": by_requests,
        "consecutive_failures": trailing,
        "induced_at": induced_at,
    }


def wait_ready(http: httpx.Client, proc: subprocess.Popen, timeout: float) -> None:
    """A spawned server is drilled once it serves: /health/ready 200, or /health 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DrillError(f"the spawned server exited with code {proc.returncode} before ready")
        ready = get(http, "/health/ready")[0]
        if ready == 200 or (ready in (404, 405) and get(http, "/health")[0] == 200):
            return
        time.sleep(0.2)
    raise DrillError(f"the spawned server was not ready in {timeout:g} s")


def drill(args: argparse.Namespace, proc: subprocess.Popen | None) -> dict[str, Any]:
    """Runs the requests and the health watch; returns the whole report."""
    url = args.url.rstrip("/").removesuffix("/v1")
    messages = inducing(args.induce, args.image_edge) if args.induce != "none" else None
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else None
    with httpx.Client(base_url=url, timeout=args.timeout, headers=headers) as http:
        if proc:
            print(f"steward drill: waiting for {url} to be ready", file=sys.stderr)
            wait_ready(http, proc, args.ready_timeout)
        t0 = time.monotonic()
        watch = Watch(url, t0, proc)
        watch.start()
        try:
            requests = [send(http, "baseline", ORDINARY, args, t0)]
            if not requests[0].ok:
                raise DrillError(f"the baseline request failed ({requests[0].status}): not serving")
            induced_at = round(time.monotonic() - t0, 3)
            for kind in (["induce"] if messages else []) + ["ordinary"] * args.requests:
                if watch.exited():
                    break
                time.sleep(args.interval if kind == "ordinary" else 0)
                requests.append(
                    send(http, kind, messages if kind == "induce" else ORDINARY, args, t0)
                )
                if requests[-1].status == "down":
                    watch.settle()
            if not requests[-1].ok:
                watch.settle()
        finally:
            watch.done.set()
            watch.join()
    failures = [r for r in requests if not r.ok]
    changes = [
        s for i, s in enumerate(watch.samples) if i == 0 or _key(s) != _key(watch.samples[i - 1])
    ]
    return {
        "url": url,
        "induce": args.induce,
        "spawn": {"command": args.spawn, "exit": watch.exit} if proc else None,
        "requests": [asdict(r) for r in requests],
        "health": [asdict(s) for s in watch.samples],
        "health_changes": [asdict(s) for s in changes],
        "last_health": watch.body,
        "failures": {
            "total": len(failures),
            "x_should_retry": {k: sum(r.should_retry == v for r in failures) for k, v in RETRY},
            "retryable": {k: sum(r.retryable == v for r in failures) for k, v in RETRYABLE},
        },
        "verdict": verdict(requests, watch, induced_at),
    }


def _key(s: Sample) -> tuple:
    return s.status, s.ready, s.state, s.generation, s.pid


def table(report: dict[str, Any]) -> str:
    """The human view: one line per request, health state changes, failures, the verdict."""
    lines = [f"steward drill against {report['url']} (induce: {report['induce']})"]
    lines.append(f"{'t s':>8}  {'kind':<9}{'status':<8}{'error':<22}{'retry':<7}{'ms':>8}")
    for r in report["requests"]:
        retry = r["should_retry"] or ""
        lines.append(
            f"{r['t']:8.3f}  {r['kind']:<9}{r['status']!s:<8}{r['error'] or '':<22}{retry:<7}"
            f"{r['latency_ms']:8.0f}"
        )
    lines.append("health (changes only):")
    for s in report["health_changes"]:
        worker = f"worker gen {s['generation']} pid {s['pid']}" if s["generation"] else ""
        lines.append(f"{s['t']:8.3f}  {s['status']!s:<8}{s['state'] or '':<14}{worker}")
    if report["spawn"] and report["spawn"]["exit"]:
        t, code = report["spawn"]["exit"]
        lines.append(f"{t:8.3f}  process exited with code {code}")
    fault = dig(report["last_health"], "faults", "last")
    if isinstance(fault, dict):
        lines.append(f"server's last fault: {fault.get('class')}, {fault.get('action')}")
    f = report["failures"]
    retry, envelope = (
        ", ".join(f"{k} {n}" for k, n in f[x].items()) for x in ("x_should_retry", "retryable")
    )
    lines.append(
        f"failures: {f['total']} of {len(report['requests'])}; "
        f"x-should-retry: {retry}; retryable: {envelope}"
    )
    v = report["verdict"]
    spans = {"/health": v["health_outage"], "requests": v["request_outage"]}
    seen = [name for name, span in spans.items() if span]
    if v["outage"]:
        lines.append(f"outage: {_span(v['outage'])}, seen by {' and '.join(seen)}")
    elif seen:
        lines.append("outage: not over at the end")
    if len(seen) > 1 or not v["outage"]:  # each figure: both saw it, or it is not over
        lines += [f"  by {name}: {_span(spans[name])}" for name in seen]
    return "\n".join([*lines, f"verdict: {v['text']}"])


def _span(span: Span) -> str:
    start, end = span
    if end is None:
        return f"from {start:.3f} s, not over at the end"
    return f"{start:.3f} s to {end:.3f} s ({end - start:.1f} s)"


def induce_arg(text: str) -> str:
    if text in ("image", "none") or (text.startswith("marker=") and len(text) > 7):
        return text
    raise argparse.ArgumentTypeError("expected image, marker=TEXT or none")


def configure(p: argparse.ArgumentParser) -> None:
    """The drill's flags, shared by `steward drill` and `python -m steward.drill`."""
    p.epilog, p.formatter_class = EXIT_CODES, argparse.RawDescriptionHelpFormatter
    p.add_argument("--url", required=True, help="the server's base URL (a trailing /v1 is fine)")
    p.add_argument("--requests", type=int, default=70, help="ordinary requests (default: 70)")
    p.add_argument(
        "--induce",
        type=induce_arg,
        default="image",
        metavar="image|marker=TEXT|none",
        help="image (default), marker=TEXT, or none (induce it yourself)",
    )
    p.add_argument("--max-tokens", type=int, default=8, help="per request (default: 8)")
    p.add_argument("--model", help="the request's model field (default: omitted)")
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--timeout", type=float, default=120, help="seconds per request (default: 120)")
    p.add_argument("--interval", type=float, default=0, help="seconds between ordinary requests")
    p.add_argument("--image-edge", type=int, default=8192, help="the image's edge (default: 8192)")
    p.add_argument(
        "--spawn",
        metavar="CMD",
        help="start this server command (one quoted string), drill it, stop it",
    )
    p.add_argument("--ready-timeout", type=float, default=600, help="seconds --spawn may take")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--plot", metavar="F.png", help="write the timeline as a PNG (matplotlib)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Registers `steward drill` on the `steward` command."""
    configure(sub.add_parser("drill", help="run the field report's repro against a server"))


def main(args: argparse.Namespace) -> int:
    """Runs the drill and prints it; the exit status is EXIT_CODES's."""
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print(
            "steward drill: --plot needs matplotlib: pip install 'steward[drill]'", file=sys.stderr
        )
        return 2
    proc = subprocess.Popen(shlex.split(args.spawn), stdout=sys.stderr) if args.spawn else None
    try:
        report = drill(args, proc)
    except DrillError as exc:
        print(f"steward drill: {exc}", file=sys.stderr)
        return 2
    finally:
        if proc and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if args.plot:
        from steward.drill_plot import plot

        plot(report, args.plot)
    print(json.dumps(report, indent=2) if args.json else table(report))
    return EXIT[report["verdict"]["kind"]]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="steward drill", description=__doc__.splitlines()[0])
    configure(parser)
    sys.exit(main(parser.parse_args()))
