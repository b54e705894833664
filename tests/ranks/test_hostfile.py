"""`--hostfile`: MLX's JSON hostfile read as `mlx.launch` reads it (pure, milliseconds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from steward.ranks.hostfile import read, unmeshed
from steward.wire.ranks import RankHost


def written(tmp_path: Path, data: object) -> str:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_both_of_mlx_launchs_forms(tmp_path: Path) -> None:
    hosts = [{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["10.0.0.1"]}]
    listed = read(written(tmp_path, hosts))
    assert listed.hosts == (RankHost("mac1", ("10.0.0.1",)), RankHost("127.0.0.1", ("10.0.0.1",)))
    assert (listed.backend, listed.envs) == ("", ())
    assert [h.remote for h in listed.hosts] == [True, False]  # only 127.0.0.1 skips ssh
    full = {"backend": "ring", "envs": ["MLX_METAL_FAST_SYNCH=1"], "hosts": hosts}
    spec = read(written(tmp_path, full))
    assert (spec.backend, spec.envs, spec.hosts) == (
        "ring",
        ("MLX_METAL_FAST_SYNCH=1",),
        listed.hosts,
    )


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"hosts": "mac1"}, "a list of at least two hosts"),
        ([{"ips": ["1.2.3.4"]}, {"ssh": "b", "ips": ["1.2.3.5"]}], 'host 0: an object with "ssh"'),
        ([{"ssh": "a", "ips": []}, {"ssh": "b", "ips": ["1.2.3.5"]}], "host 0 (a): ips"),
        ({"envs": ["A-B=2"], "hosts": [{"ssh": "a", "ips": ["1.2.3.4"]}] * 2}, "envs: a list"),
        ([{"ssh": "a", "ips": ["1.2.3.4"], "rdma": "rdma_en3"}] * 2, "host 0 (a): rdma: a list"),
    ],
)
def test_a_hostfile_that_cannot_work_says_what(tmp_path: Path, data: object, why: str) -> None:
    with pytest.raises(ValueError, match="--hostfile .*" + re.escape(why)):
        read(written(tmp_path, data))
    with pytest.raises(ValueError, match="No such file"):
        read(str(tmp_path / "missing.json"))


MESH = [
    {"ssh": "mac1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en3"]},
    {"ssh": "mac2", "ips": ["10.0.0.2"], "rdma": ["rdma_en3", None]},
]


def test_jaccls_rdma_devices_are_read_and_must_join_every_pair(tmp_path: Path) -> None:
    """jaccl's hostfile names each host's RDMA device toward each other host, null toward
    itself, as `mlx.launch` checks."""
    hosts = read(written(tmp_path, MESH)).hosts
    assert [h.rdma for h in hosts] == [(None, "rdma_en3"), ("rdma_en3", None)]
    assert unmeshed(hosts) == ""
    assert "host 1 (mac2): no RDMA device toward host 0" in unmeshed(
        (hosts[0], RankHost("mac2", ("10.0.0.2",), (None, None)))
    )
    assert "host 0 (mac1): rdma lists one device per host" in unmeshed(
        (RankHost("mac1", ("10.0.0.1",)), hosts[1])
    )
