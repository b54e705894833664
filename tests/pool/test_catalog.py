"""The models configuration (SPEC §9), the names requests use, the budget's choices and the
server's state from its models': pure functions, in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from steward.config import ServeConfig
from steward.errors import ApiError
from steward.model.resolve import ModelSource
from steward.pool import budget
from steward.pool.catalog import CatalogError, ModelEntry, check_groups, from_flags, load
from steward.pool.names import find
from steward.pool.slot import Slot
from steward.pool.snapshot import ModelState, overall
from steward.supervisor.state import State
from steward.wire.faultspec import parse


def models_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return str(path)


def test_a_models_file_configures_each_model(tmp_path: Path, tiny_model: Path) -> None:
    path = models_file(
        tmp_path,
        f'[a]\npath = "{tiny_model}"\naliases = ["small", "claude-*"]\npin = true\n\n'
        f'[b]\npath = "{tiny_model}"\nidle_ttl = 30\nmax_batch = 4\nstandby = "none"\n'
        'speculate = "none"\n',
    )
    a, b = load([], path, ["extra"])
    assert (a.name, a.aliases, a.pin, a.source.model_id) == (
        "a",
        ("small", "claude-*", "extra"),
        True,
        "a",
    )
    overrides = {"max_batch": 4, "standby": "none", "speculate": "none"}
    assert (b.name, b.idle_ttl, b.overrides) == ("b", 30.0, overrides)
    assert b.config(ServeConfig()).speculate == "none"
    (default,) = load([], models_file(tmp_path, '[smollm2]\nkind = "embedding"\n'), [])
    assert (default.path, default.kind) == (None, "embedding")  # no path: the default model
    assert default.source.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('[a]\npath = "X"\n[b]\npath = "X"\ncolour = "red"\n', 5, "unknown key 'colour'"),
        ('[a]\npath = "X"\n\n[b]\npath = "X"\nmax_batch = "many"\n', 6, "max_batch"),
        ('[a]\npath = "X"\npin = 1\n', 3, "pin"),
        ('[a]\npath = "X"\nspeculate = "sometimes"\n', 3, "speculate: one of auto, always, none"),
        ('[a]\npath = "X"\n[b]\npath = "X"\naliases = ["a"]\n', 5, "'a' is given twice"),
        ('[a]\npath = "X"\naliases = ["s"]\n[b]\naliases = ["s"]\npath = "X"\n', 5, "twice"),
        ('[a]\npath = "X"\npath = "Y"\n', 3, "overwrite"),  # TOML's own error, with its line
        ('[a]\npath = "X"\npin = true\nidle_ttl = 5\n', 4, "pin or idle_ttl"),
        ('[a]\npath = "X"\n[default]\npath = "X"\n', 4, "'default' means the first model"),
        ('[a]\npath = "X"\n[b]\npath = "X"\naliases = ["default"]\n', 5, "means the first"),
        ('[a]\npath = "X"\nranks = 0\n', 3, "ranks: at least 1"),
        ('[a]\npath = "X"\nparallel = "sideways"\n', 3, "parallel: one of auto, tensor"),
        ('[a]\npath = "X"\ndistributed_backend = "tcp"\n', 3, "distributed_backend: one of"),
    ],
)
def test_a_bad_models_file_names_the_line(
    tmp_path: Path, tiny_model: Path, text: str, line: int, words: str
) -> None:
    with pytest.raises(CatalogError) as refused:
        load([], models_file(tmp_path, text.replace("X", str(tiny_model))), [])
    assert f"line {line}" in str(refused.value) and words in str(refused.value)


def test_each_models_group_is_its_own(tmp_path: Path, tiny_model: Path) -> None:
    """A table's ranks, hostfile, backend and parallel are that model's alone; a group that
    cannot be formed names its model; a hot spare group counts twice."""
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        '[{"ssh": "127.0.0.1", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]'
    )
    text = (
        f'[a]\npath = "{tiny_model}"\nranks = 2\nparallel = "pipeline"\n'
        f'[b]\npath = "{tiny_model}"\nhostfile = "{hosts}"\n[c]\npath = "{tiny_model}"\n'
    )
    a, b, c = (entry.config(ServeConfig()) for entry in load([], models_file(tmp_path, text), []))
    assert (a.ranks, a.parallel, a.standby, a.rank_hosts) == (2, "pipeline", "auto", None)
    assert (b.ranks, b.distributed_backend, b.standby) == (2, "any", "auto")
    assert b.rank_hosts is not None and [h.ssh for h in b.rank_hosts.hosts] == ["127.0.0.1", "b"]
    assert (c.ranks, c.standby, c.rank_hosts) == (1, "auto", None)
    slots = [Slot(entry, ServeConfig()) for entry in load([], models_file(tmp_path, text), [])]
    for slot in slots:
        slot.measured = 1000  # rank 0's part, for a group
    one = budget.need(1000, ServeConfig().prompt_cache_bytes, 1)
    assert [slot.need() for slot in slots] == [2 * one, one, one]  # b's rank 1 is elsewhere
    hot = f'[a]\npath = "{tiny_model}"\nranks = 2\nstandby = "hot"\n'
    (spared,) = load([], models_file(tmp_path, hot), [])
    check_groups([spared], ServeConfig())
    slot = Slot(spared, ServeConfig())
    slot.measured = 1000
    assert slot.need() == 2 * budget.need(1000, ServeConfig().prompt_cache_bytes, 2)
    jaccl = f'[a]\npath = "{tiny_model}"\n[b]\npath = "{tiny_model}"\nranks = 2\n'
    jaccl += 'distributed_backend = "jaccl"\n'
    with pytest.raises(CatalogError, match="model b: --ranks 2: jaccl joins hosts over RDMA"):
        check_groups(load([], models_file(tmp_path, jaccl), []), ServeConfig())


def test_model_flags_name_models_or_keep_todays_bare_path(tiny_model: Path) -> None:
    (bare,) = load([str(tiny_model)], None, ["smol"])
    assert (bare.name, bare.aliases, bare.path) == (tiny_model.name, ("smol",), str(tiny_model))
    a, b = load([f"a={tiny_model}", f"b={tiny_model}"], None, [])
    assert (a.name, b.name, b.source.model_id) == ("a", "b", "b")
    with pytest.raises(CatalogError, match="'a' is given twice"):
        load([f"a={tiny_model}", f"a={tiny_model}"], None, [])
    (same,) = load([str(tiny_model)], None, [tiny_model.name])  # named as its directory is
    assert same.name == tiny_model.name
    assert from_flags([], [])[0].path is None  # the embedded default


def test_a_model_gives_its_context_length_before_it_ever_loads(tiny_model: Path) -> None:
    """What `/v1/models` lists of an unloaded model: its files' length, as its worker reads
    it (a GGUF not yet imported: unknown until its import)."""
    (entry,) = load([str(tiny_model)], None, [])
    snapshot = Slot(entry, ServeConfig()).snapshot(False, 0.0, detail=False)
    assert (snapshot.state, snapshot.context_length) == (ModelState.UNLOADED, 2048)
    gguf = ModelEntry("g", "x.gguf", source=ModelSource("gguf", Path("x.gguf"), "g"))
    assert Slot(gguf, ServeConfig()).known_context_length is None


def test_names_route_to_one_model_concrete_names_first() -> None:
    models = [ModelEntry("a", None, ("claude-*",)), ModelEntry("b", None, ("claude-haiku",))]
    assert find(None, models).name == "a" and find("default", models).name == "a"
    assert find("claude-haiku", models).name == "b"  # concrete beats another's glob
    assert find("claude-opus", models).name == "a"
    with pytest.raises(ApiError) as unknown:
        find("gpt-4o", models)
    assert unknown.value.status == 404
    assert "'a', 'b', 'claude-haiku', 'claude-*'" in unknown.value.message


def test_the_budget_evicts_the_least_recently_used_idle_models() -> None:
    holders = [
        budget.Holder("pinned", 40, False, 0.0),
        budget.Holder("old", 30, True, 1.0),
        budget.Holder("new", 30, True, 2.0),
    ]
    assert budget.room(0, 100, holders) == []
    assert budget.room(20, 100, holders) == ["old"]
    assert budget.room(50, 100, holders) == ["old", "new"]
    assert budget.room(61, 100, holders) is None  # the pinned one stays
    assert budget.need(100, 10, copies=2) == 2 * (120 + 10)


def test_a_fault_aims_at_one_model() -> None:
    assert parse("decode:poison:marker=X,model=a").model == "a"
    assert parse("decode:raise:model=b").nth == 1
    assert parse("decode:raise:marker=x,y").marker == "x,y"  # a comma in a marker stays
    with pytest.raises(ValueError, match="model=NAME"):
        parse("decode:raise:nth=1,model=")


def test_the_servers_state_from_its_models() -> None:
    ready, failed, unloaded = ModelState.READY, ModelState.FAILED, ModelState.UNLOADED
    assert overall([ready, unloaded], False, False, False) is State.READY
    assert overall([ready, failed], False, False, False) is State.DEGRADED
    assert overall([failed, failed], False, False, False) is State.FAILED
    assert overall([ModelState.LOADING, unloaded], True, False, False) is State.STARTING
    assert overall([ready], False, False, True) is State.STOPPING
