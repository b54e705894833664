"""`--hostfile FILE`: MLX's JSON hostfile, the one `mlx.launch` reads.

Either a list of hosts or `{"backend": ..., "envs": [...], "hosts": [...]}`, each host
`{"ssh": NAME, "ips": [IP, ...], "rdma": [DEVICE or null, ...]}` (`rdma`: `jaccl`'s, the
host's RDMA device toward each host, null toward itself). One rank per host, in the file's
order. Rank 0 runs here, beside the front, whatever its `ssh` says: it speaks the
worker channel, so the first host must be this machine, and its `ips` are where the others
reach it. Every other host is started over ssh, except one whose `ssh` is `127.0.0.1`
(`mlx.launch`'s rule: started here, without ssh). The ring backend needs every host's `ips`.

Only the operator's file names a host: nothing a client sends can.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from steward.wire.ranks import Hostfile, RankHost


def read(path: str) -> Hostfile:
    """The file's hosts; ValueError (exit 78) saying what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--hostfile {path}: {exc}") from exc
    spec = data if isinstance(data, dict) else {"hosts": data}
    hosts, backend, envs = spec.get("hosts"), spec.get("backend", ""), spec.get("envs", [])
    if not isinstance(hosts, list) or len(hosts) < 2:
        raise ValueError(f"--hostfile {path}: a list of at least two hosts, one per rank")
    if not isinstance(backend, str):
        raise ValueError(f"--hostfile {path}: backend: a string")
    if not isinstance(envs, list) or not all(_is_env(e) for e in envs):
        raise ValueError(f"--hostfile {path}: envs: a list of KEY=VALUE strings")
    return Hostfile(
        path, tuple(_host(path, i, h) for i, h in enumerate(hosts)), backend, tuple(envs)
    )


def _host(path: str, index: int, host: Any) -> RankHost:
    where = f"--hostfile {path}: host {index}"
    if not isinstance(host, dict) or not isinstance(host.get("ssh"), str) or not host["ssh"]:
        raise ValueError(f'{where}: an object with "ssh" (a host name) and "ips"')
    ips = host.get("ips", [])
    if not isinstance(ips, list) or not ips or not all(isinstance(ip, str) and ip for ip in ips):
        raise ValueError(f"{where} ({host['ssh']}): ips: the ring backend needs its addresses")
    rdma = host.get("rdma", [])
    if not isinstance(rdma, list) or not all(d is None or isinstance(d, str) for d in rdma):
        raise ValueError(f"{where} ({host['ssh']}): rdma: a list of device names or null")
    return RankHost(host["ssh"], tuple(ips), tuple(rdma))


def unmeshed(hosts: tuple[RankHost, ...]) -> str:
    """What keeps `jaccl` from joining these hosts ("" nothing): every host names an RDMA
    device toward every other host, and null toward itself (as `mlx.launch` checks)."""
    for i, host in enumerate(hosts):
        if len(host.rdma) != len(hosts) or host.rdma[i] is not None:
            return f"host {i} ({host.ssh}): rdma lists one device per host, null for itself"
        for j, device in enumerate(host.rdma):
            if device is None and j != i:
                return f"host {i} ({host.ssh}): no RDMA device toward host {j} ({hosts[j].ssh})"
    return ""


def _is_env(entry: object) -> bool:
    if not isinstance(entry, str):
        return False
    key, eq, _ = entry.partition("=")
    return bool(eq and key) and all(c.isalnum() or c == "_" for c in key)
