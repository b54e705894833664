"""Forming a group (steward/ranks/formation.py): the ports a group is given are given to no
other group until it is reaped, even where the kernel would hand them out again (the
serving group's ranks may not have bound theirs yet when a spare group forms)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steward.ranks import formation
from steward.ranks.formation import form, release


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


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = [5000, 5001, 5000, 5001, 5002, 5003, 5000, 5001]
    monkeypatch.setattr(formation, "socket", Kernel(handed))


def test_a_groups_ports_are_its_own_until_it_is_reaped(kernel: None, tmp_path: Path) -> None:
    two = [("127.0.0.1",), ("127.0.0.1",)]
    places, serving = form(two, "any", tmp_path)
    assert serving == [5000, 5001]
    assert json.loads(Path(places[0].hostfile).read_text()) == [
        ["127.0.0.1:5000"],
        ["127.0.0.1:5001"],
    ]
    _, spare = form(two, "any", tmp_path)
    assert spare == [5002, 5003]  # the serving group's, handed out again, are skipped
    release(serving)
    _, next_group = form(two, "any", tmp_path)
    assert next_group == [5000, 5001]  # free again once the group that had them is reaped
    release(spare)
    release(next_group)
