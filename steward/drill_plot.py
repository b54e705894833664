"""The drill's timeline as a PNG: request outcomes above, the health state as a band below.

Requests are drawn when their answer came, the moment the client saw it, as the outage is
measured (docs/drill.md); the dashed line marks when the inducing request was sent.

matplotlib (the `steward[drill]` extra) with the Agg backend: no display is needed, and the
server itself never imports it.
"""

from __future__ import annotations

from typing import Any

OK, FAILED = "#2ca02c", "#d62728"
STATES = {
    "ready": OK,
    "degraded": "#bcbd22",
    "starting": "#ff7f0e",
    "recovering": "#ff7f0e",
    "failed": FAILED,
    "stopping": "#7f7f7f",
}


def _state(sample: dict[str, Any]) -> tuple[str, str]:
    """A health sample's label and colour; a server without steward's states gets its status."""
    status = sample["status"]
    if status in ("down", "timeout"):
        return str(status), "#222222"
    healthy = isinstance(status, int) and 200 <= status < 300
    colour = STATES.get(sample["state"], OK if healthy else "#ff7f0e")
    return f"{status} {sample['state'] or ''}".strip(), colour


def plot(report: dict[str, Any], path: str) -> None:
    """Writes the report's timeline to `path` (PNG), the verdict as its title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter

    fig, (ax, band) = plt.subplots(
        2, 1, sharex=True, figsize=(10, 4.8), height_ratios=[3, 1.2], layout="constrained"
    )
    requests, verdict = report["requests"], report["verdict"]
    for ok, colour, marker in ((True, OK, "o"), (False, FAILED, "x")):
        shown = [r for r in requests if r["ok"] is ok and r["kind"] != "induce"]
        ax.scatter(
            [r["answered"] for r in shown],
            [max(r["latency_ms"], 0.1) for r in shown],
            s=24,
            c=colour,
            marker=marker,
            label=f"{'ok' if ok else 'failed'} ({len(shown)})",
        )
    for r in requests:
        if r["kind"] == "induce":
            label = f"inducing request ({r['status']} {r['error'] or ''})".replace(" )", ")")
            ax.scatter(
                [r["answered"]],
                [max(r["latency_ms"], 0.1)],
                s=160,
                marker="*",
                c=OK if r["ok"] else FAILED,
                edgecolors="k",
                label=label,
            )
    for axis in (ax, band):
        axis.axvline(verdict["induced_at"], color="k", ls="--", lw=1)
        if verdict["outage"]:
            label = f"outage ({verdict['recovery_s']:.1f} s)" if axis is ax else None
            axis.axvspan(*verdict["outage"], color=FAILED, alpha=0.1, lw=0, label=label)
    if report["spawn"] and report["spawn"]["exit"]:
        t, code = report["spawn"]["exit"]
        for axis in (ax, band):
            axis.axvline(t, color=FAILED, lw=2)
        ax.plot([], [], color=FAILED, lw=2, label=f"process exited ({code})")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))  # 20, not 2x10^1
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.5)))
    ax.set_ylabel("latency (ms), when answered")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.grid(alpha=0.3)

    changes, samples = report["health_changes"], report["health"]
    ends = [c["t"] for c in changes[1:]] + [samples[-1]["t"] + 0.1]
    seen: set[str] = set()
    for change, end in zip(changes, ends, strict=True):
        label, colour = _state(change)
        band.axvspan(change["t"], end, color=colour, lw=0, label=None if label in seen else label)
        seen.add(label)
    workers = [(s["t"], s["generation"]) for s in samples if s["generation"] is not None]
    if workers:  # steward: the worker generation as a step line over the state band
        band.step(*zip(*workers, strict=True), where="post", color="k", lw=1.5)
        generations = sorted({g for _, g in workers})
        band.set_yticks(generations)
        band.set_ylim(generations[0] - 0.5, generations[-1] + 0.5)
        band.set_ylabel("worker")
    else:
        band.set_yticks([])
        band.set_ylabel("/health")
    band.set_xlabel("seconds since the drill started")
    band.legend(
        title="/health",
        loc="upper left",
        bbox_to_anchor=(1.0, 1.1),
        fontsize=8,
        title_fontsize=8,
        frameon=False,
    )
    fig.suptitle(verdict["text"], fontweight="bold")
    ax.set_title(f"{report['url']}  induce: {report['induce']}", fontsize=9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
