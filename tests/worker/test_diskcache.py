"""The prompt cache's disk tier (diskcache.py) on real MLX arrays and real files: an entry
serves the prompts it begins, corrupt, truncated and foreign entries are removed and never
loaded, the byte bound holds, a full filesystem (a real one: a tiny tmpfs, or the kernel's
file-size limit) drops the entry and fails nothing, and an entry is loaded or written only
where reading it is sooner than prefilling it."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from steward.worker import kvstore
from steward.worker.diskcache import DiskCache, Save, pays
from steward.worker.kvindex import BLOCK
from tests.conftest import until
from tests.tmpfs import tiny_tmpfs

MODEL = "a" * 32
TOKENS = list(range(1000, 1700))  # 700 tokens: an entry
BIG = 1 << 30


def kv(n: int, dtype: mx.Dtype = mx.float32) -> list[KVCache]:
    """Two layers' KV of `n` positions, random, as a prefill leaves them."""
    caches = []
    for _ in range(2):
        cache = KVCache()
        keys, values = (mx.random.normal((1, 2, n, 16)).astype(dtype) for _ in "kv")
        cache.update_and_fetch(keys, values)
        caches.append(cache)
    return caches


def saved(disk: DiskCache, tokens: list[int], cache: list[KVCache]) -> Path:
    """Save, and wait for the writer to put the entry in place."""
    disk.save(tokens, cache)
    path = disk.index.directory / disk.index.name(tokens)
    until(path.exists, 10, "the entry written")
    return path


def same(a: list[KVCache], b: list[KVCache], n: int) -> bool:
    return all(
        mx.array_equal(x.keys, y.keys[..., :n, :]).item()
        and mx.array_equal(x.values, y.values[..., :n, :]).item()
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_an_entry_serves_the_prompts_it_begins(tmp_path: Path, dtype: mx.Dtype) -> None:
    cache = kv(len(TOKENS), dtype)
    saved(DiskCache(tmp_path, BIG, MODEL), TOKENS, cache)
    disk = DiskCache(tmp_path, BIG, MODEL)  # another worker, started after
    found = disk.fetch([*TOKENS, 1, 2], 0)
    assert found is not None and found[1] == len(TOKENS) and same(found[0], cache, len(TOKENS))
    assert found[0][0].keys.dtype == dtype
    other_ending = [*TOKENS[:600], 7, 7, 7]  # shares 600 tokens: served to the block
    found = disk.fetch(other_ending, 0)
    assert found is not None and found[1] == 2 * BLOCK and same(found[0], cache, 2 * BLOCK)
    assert disk.fetch(other_ending, 2 * BLOCK) is None  # nothing longer than memory holds
    assert disk.fetch(TOKENS, 0)[1] == 2 * BLOCK  # at least one token left to compute
    assert disk.fetch(list(range(700)), 0) is None
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / disk.index.name(TOKENS)).stat().st_mode) == 0o600


def test_a_longer_entry_replaces_the_ones_it_begins(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path, BIG, MODEL)
    cache = kv(900)
    first = saved(disk, TOKENS, cache)
    saved(disk, [*TOKENS, *range(200)], cache)
    until(lambda: not first.exists(), 10, "the shorter entry removed")
    assert len(list(tmp_path.glob("*.kv"))) == 1


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def foreign(path: Path) -> None:
    """Another model's entry of the same tokens, under this model's name."""
    entry = kvstore.read(path)
    path.unlink()
    kvstore.write(path, "b" * 32, entry.tokens, entry.arrays)


@pytest.mark.parametrize("spoil", [corrupt, truncate, foreign])
def test_a_spoilt_entry_is_never_loaded_and_is_removed(tmp_path: Path, spoil) -> None:
    disk = DiskCache(tmp_path, BIG, MODEL)
    path = saved(disk, TOKENS, kv(len(TOKENS)))
    spoil(path)
    again = DiskCache(tmp_path, BIG, MODEL)  # a new worker: it reads the file's head
    assert again.fetch([*TOKENS, 1], 0) is None and not path.exists()
    assert disk.fetch([*TOKENS, 1], 0) is None  # the one that indexed it before
    assert again.use(None).errors == 1 and list(tmp_path.iterdir()) == []


def test_an_entry_spoilt_after_it_was_indexed_is_removed_when_read(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path, BIG, MODEL)
    path = saved(disk, TOKENS, kv(len(TOKENS)))
    corrupt(path)  # the same size: only the checksum tells
    assert disk.fetch([*TOKENS, 1], 0) is None and not path.exists()
    assert disk.use(None).errors == 1


def test_the_byte_bound_holds(tmp_path: Path) -> None:
    one = saved(DiskCache(tmp_path, BIG, MODEL), TOKENS, kv(len(TOKENS))).stat().st_size
    disk = DiskCache(tmp_path, int(2.5 * one), MODEL)
    prompts = [[i, *TOKENS] for i in range(5)]
    for prompt in prompts:
        saved(disk, prompt, kv(len(prompt)))
        assert sum(f.stat().st_size for f in tmp_path.iterdir()) <= 2.5 * one
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {disk.index.name(p) for p in prompts[-2:]}  # the least recent went
    DiskCache(tmp_path, int(1.5 * one), MODEL)  # a smaller bound at start-up: the older goes
    assert [p.name for p in tmp_path.iterdir()] == [disk.index.name(prompts[-1])]


def test_a_fault_drops_what_is_not_on_disk_yet(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path, BIG, MODEL)
    cache = kv(len(TOKENS))
    disk.fault()
    disk._write(Save(0, TOKENS, _copies(cache)))  # taken before the fault
    assert list(tmp_path.iterdir()) == []


def _copies(cache: list[KVCache]) -> list[mx.array]:
    from steward.worker.diskcache import _copies

    arrays = _copies(cache, len(TOKENS))
    assert arrays is not None
    return arrays


def test_a_full_filesystem_drops_the_entry(tmp_path: Path, caplog) -> None:
    with tiny_tmpfs(tmp_path / "full") as folder:
        disk = DiskCache(folder, BIG, MODEL)
        disk.save(TOKENS, kv(len(TOKENS)))  # ~360 KB on a 64 KB filesystem
        until(lambda: disk.errors, 10, "the failed write counted")
        assert list(folder.iterdir()) == [] and disk.fetch([*TOKENS, 1], 0) is None
    assert "entry not written (ENOSPC)" in caplog.text


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """The kernel refuses writes past `limit` bytes (EFBIG) in this process, as a quota
    does; SIGXFSZ ignored so the write fails instead of killing the process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_refused_write_drops_the_entry_anywhere(tmp_path: Path, caplog) -> None:
    disk = DiskCache(tmp_path, BIG, MODEL)
    cache = kv(len(TOKENS))
    with file_size_limit(64 * 1024):
        disk.save(TOKENS, cache)
        until(lambda: disk.errors, 10, "the failed write counted")
    assert list(tmp_path.iterdir()) == [] and "entry not written (EFBIG)" in caplog.text
    saved(disk, TOKENS, cache)  # the next one, room again, is written


def test_the_directory_is_made_private(tmp_path: Path) -> None:
    made = kvstore.prepare_dir(str(tmp_path / "new" / "kv"))
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert stat.S_IMODE(kvstore.prepare_dir(str(shared)).stat().st_mode) == 0o700  # repaired
    with pytest.raises(ValueError, match="not a directory"):
        kvstore.prepare_dir(str(Path(__file__)))
    if os.getuid() == 0:  # another user's directory: refused
        os.chown(shared, 1, 1)
        with pytest.raises(ValueError, match="owned by uid 1"):
            kvstore.prepare_dir(str(shared))


def test_a_directory_gone_is_a_miss_never_a_fault(tmp_path: Path) -> None:
    """The canary never reads this tier: an error here must not fail requests on a worker
    that the canary would keep."""
    disk = DiskCache(tmp_path / "kv", BIG, MODEL)
    saved(disk, TOKENS, kv(len(TOKENS)))
    for path in (tmp_path / "kv").iterdir():
        path.unlink()
    (tmp_path / "kv").rmdir()
    assert disk.fetch([*TOKENS, 1], 0) is None
    disk.save(list(range(2000, 2700)), kv(700))  # queued or refused, never raised
    assert disk.errors >= 1


def test_an_entry_indexed_twice_is_counted_once(tmp_path: Path) -> None:
    """Two workers of one model may write the same entry; the bound counts it once."""
    disk = DiskCache(tmp_path, BIG, MODEL)
    path = saved(disk, TOKENS, kv(len(TOKENS)))
    size = disk.index.size
    disk.index.add(path.name, TOKENS, path.stat().st_size, 1)  # as the other writer's rename
    assert disk.index.size == size == path.stat().st_size


def test_reading_pays_when_it_is_sooner_than_prefilling() -> None:
    assert pays(10**9, 0.0, 100, 1000.0) and pays(10**9, 1e6, 100, 0.0)  # not measured yet
    assert pays(10**6, 1e9, 1000, 1e4)  # 1 ms to read, 100 ms to prefill
    assert not pays(4 * 10**8, 3e8, 12_800, 2e4)  # 1.3 s to read, 0.64 s to prefill
    assert not pays(4 * 10**8, 1e9, 12_800, 2e4)  # 0.4 s against 0.64 s: a near tie, no read


def test_the_tier_loads_and_writes_only_where_reading_beats_prefilling(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path, BIG, MODEL)
    disk.probe()
    assert disk.read_bps > 0 and list(tmp_path.iterdir()) == []  # the probe leaves nothing
    size = saved(disk, TOKENS, kv(len(TOKENS))).stat().st_size
    prompt = [*TOKENS, 1]
    sooner_prefilled = 4 * len(TOKENS) * disk.read_bps / size  # tokens/s: a quarter of the read
    assert disk.fetch(prompt, 0, sooner_prefilled) is None
    # both times grow with the tokens: at that speed no length pays, none is looked up
    assert disk.never(sooner_prefilled) and not disk.never(sooner_prefilled / 16)
    assert disk.fetch(prompt, 0, sooner_prefilled / 16) is not None  # 4x the read
    never, later = [[i, *TOKENS] for i in (1, 2)]
    disk.save(never, kv(len(never)), sooner_prefilled * 16)
    saved(disk, later, kv(len(later)))  # queued after it: written after it would have been
    assert not (tmp_path / disk.index.name(never)).exists()
