"""Forming a group (ranks/formation.py): what each backend of MLX reads to join, as
`mlx.launch` gives it, on fresh ports; pure but for the files a rank writes (milliseconds).
The ring is joined for real in every test of tests/ranks; nccl (CUDA) and jaccl (RDMA on
macOS) have no device here: their places are checked, and a build without them exits 78
(test_ranks.py). The ports a group is given are given to no other group until it is
reaped, even where the kernel would hand them out again (the serving group's ranks may not
have bound theirs yet when a spare group forms)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steward.ranks import formation
from steward.ranks.formation import form, holder, release
from steward.wire.ranks import HERE, RankHost, RankPlace

LOCAL = (RankHost(HERE, ("127.0.0.1",)),) * 2
MACS = (
    RankHost("mac1", ("10.0.0.1", "192.168.1.1"), (None, "rdma_en3")),
    RankHost("mac2", ("10.0.0.2",), ("rdma_en3", None)),
)


def placed(hosts: tuple[RankHost, ...], backend: str, folder: Path) -> list[RankPlace]:
    """Each rank's place, its ports given back at once (no group runs here)."""
    places, ports = form(hosts, backend, folder)
    release(ports)
    return places


def test_a_ring_reads_a_hostfile_of_fresh_ports_one_per_address(tmp_path: Path) -> None:
    places = placed(MACS, "any", tmp_path)
    assert [(p.rank, p.size, p.backend) for p in places] == [(0, 2, "ring"), (1, 2, "ring")]
    env = places[1].environment()
    assert env["MLX_RANK"] == "1"
    listed = json.loads(Path(env["MLX_HOSTFILE"]).read_text())
    assert [[a.rpartition(":")[0] for a in ips] for ips in listed] == [
        ["10.0.0.1", "192.168.1.1"],
        ["10.0.0.2"],
    ]
    ports = [a.rpartition(":")[2] for ips in listed for a in ips]
    assert len(set(ports)) == 3
    again = json.loads(
        Path(placed(MACS, "ring", tmp_path)[0].environment()["MLX_HOSTFILE"]).read_text()
    )
    assert again != listed  # a new formation, new ports
    assert Path(places[0].environment()["MLX_HOSTFILE"]) != Path(env["MLX_HOSTFILE"])


def test_nccl_reads_rank_0s_address_the_size_and_one_gpu_a_rank_of_each_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    local = [dict(p.environment()) for p in placed(LOCAL * 2, "nccl", tmp_path)]
    assert {e["NCCL_HOST_IP"] for e in local} == {"127.0.0.1"}
    assert len({e["NCCL_PORT"] for e in local}) == 1
    assert [e["MLX_WORLD_SIZE"] for e in local] == ["4"] * 4
    assert [e["CUDA_VISIBLE_DEVICES"] for e in local] == ["0", "1", "2", "3"]
    assert [e["MLX_RANK"] for e in local] == ["0", "1", "2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6")  # the GPUs the operator leaves us
    assert [p.environment()["CUDA_VISIBLE_DEVICES"] for p in placed(LOCAL, "nccl", tmp_path)] == [
        "4",
        "6",
    ]
    gpus = (MACS[0], MACS[1], MACS[1])  # rank 0 here, two ranks on the second host
    remote = [p.environment() for p in placed(gpus, "nccl", tmp_path)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in remote] == ["4", "0", "1"]
    assert {e["NCCL_HOST_IP"] for e in remote} == {"10.0.0.1"}


def test_jaccl_reads_a_coordinator_and_the_hosts_rdma_devices(tmp_path: Path) -> None:
    places = placed(MACS, "jaccl", tmp_path)
    env = places[1].environment()
    host, _, port = env["MLX_JACCL_COORDINATOR"].rpartition(":")
    assert host == "10.0.0.1" and int(port) > 0
    devices = json.loads(Path(env["MLX_IBV_DEVICES"]).read_text())
    assert devices == [[None, "rdma_en3"], ["rdma_en3", None]]
    assert "MLX_HOSTFILE" not in env and "CUDA_VISIBLE_DEVICES" not in env


def test_what_holds_a_ranks_part_is_its_host_or_on_nccl_its_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory a spare group's copy must fit beside the serving group's (ranks/room.py)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = (MACS[0], MACS[1], MACS[1])
    assert [holder(gpus, p) for p in placed(gpus, "ring", tmp_path)] == [HERE, "mac2", "mac2"]
    on_gpus = [holder(gpus, p) for p in placed(gpus, "nccl", tmp_path)]
    assert on_gpus == [f"{HERE} GPU 0", "mac2 GPU 0", "mac2 GPU 1"]


class Kernel:
    """Hands out ports in a fixed order, as if each were free when asked for."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = iter(ports)

    def socket(self) -> Kernel.Socket:
        return Kernel.Socket(next(self.ports))

    class Socket:
        def __init__(self, port: int) -> None:
            self.port = port

        def bind(self, address: tuple[str, int]) -> None:
            return None

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

        def close(self) -> None:
            return None


def test_a_groups_ports_are_its_own_until_it_is_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed = [5000, 5001, 5000, 5001, 5002, 5003, 5000, 5001]
    monkeypatch.setattr(formation, "socket", Kernel(handed))
    _, serving = form(LOCAL, "any", tmp_path)
    assert serving == [5000, 5001]
    _, spare = form(LOCAL, "any", tmp_path)
    assert spare == [5002, 5003]  # the serving group's, handed out again, are skipped
    release(serving)
    _, next_group = form(LOCAL, "any", tmp_path)
    assert next_group == [5000, 5001]  # free again once the group that had them is reaped
    release(spare)
    release(next_group)
