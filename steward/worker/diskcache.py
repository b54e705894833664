"""The prompt cache's disk tier: prompt prefixes' KV that outlives the worker.

After a fault the replacement worker's memory cache is empty, and a resumed stream would
prefill its whole context again: seconds of silence in the middle of an answer. So the
worker saves the KV of long prompt prefixes to `--prompt-cache-dir`, and a replacement, or
a restarted steward, loads the longest one a prompt begins with instead of computing it.

What is saved: a prompt's KV as soon as its prefill is done (the prompt less its last
token, which the first decode step feeds), when it has at least MIN_TOKENS, so that a
crash mid-answer finds it; and, as the memory cache gets it, a finished answer's whole KV
(a conversation's next turn begins with it). An entry whose tokens all begin a newer one's
is removed: the newer one serves it.

Only where it pays: an entry is loaded only when reading it is sooner than prefilling the
tokens it spares, both as measured in this worker (the prefill speed the chunks are sized
by, or the model's first worker's; the read path's bytes per second, timed once at bring-up
on a probe entry and then on every read), and nothing is written when reading it would
never pay (a GPU that prefills faster than the host reads its KV back). Both times grow with
the tokens, so once an entry's bytes per token are known, a tier that does not pay for one
length pays for none: nothing is looked up or saved then (`never`). A speed not yet
measured says "load": a CPU's prefill, slow, is the case the tier is for.

Off the token path: the main thread, which alone runs MLX, only copies the arrays on the
device (the KV is computed already; a device copy is cheap); a writer thread copies those
to the host, writes, checksums and renames, and evicts the least recently used entries to
stay within the byte bound. A full queue drops the save. A write that fails (a full disk:
ENOSPC, EDQUOT, EFBIG; any OSError) is logged and counted, and the entry dropped: no
request ever waits for a write or fails by one. Loading is on the request's own prefill
path, where it replaces the computation.

After a fault (`fault()`, from the engine's `drop_all`) the saves still queued or being
written are dropped: only entries whose write completed before the fault stay. Their KV
comes from steps that completed before it, copied to the host then; a write torn by a
crash fails its checksum and is removed when read. (A fault that corrupts results silently
before any error reaches these entries as it reaches the answers; the canary guards the
device, not the files.)

Only caches whose every layer is mlx-lm's plain `KVCache` are saved (llama, qwen, mistral,
most models); sliding-window, quantized and state-space caches stay in memory only.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from steward.wire.protocol import DiskUse
from steward.wire.settings import WorkerSettings
from steward.worker import kvstore
from steward.worker.kvindex import Index

log = logging.getLogger(__name__)

MIN_TOKENS = 512  # a shorter prefix is prefilled again in about the time it takes to load
QUEUED = 4  # saves waiting for the writer; more are dropped (each holds a copy of its KV)
PROBE = (16, (1, 8, 1024, 64))  # arrays and shape of the entry the read path is timed on
SMOOTHING = 0.5  # weight of the newest read in the read speed
MARGIN = 2.0  # a read must take at most half the prefill it spares (`pays`)
# MLX dtype -> how its bytes are held on the host (numpy has no bfloat16)
HOST = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16}


@dataclass(frozen=True)
class Save:
    epoch: int  # the fault count when it was taken: a later fault drops it
    tokens: list[int]
    arrays: list[mx.array]  # evaluated: the writer copies them to the host


def pays(size: int, read_bps: float, tokens: int, prefill_tps: float) -> bool:
    """Reading an entry of `size` bytes takes at most 1/`MARGIN` of prefilling the `tokens`
    it spares. Both speeds are estimates (the read's from a small probe and earlier reads,
    the prefill's from chunks of other lengths), so a near tie is no reason to read: it
    would win little and may lose. A speed not measured yet (0) says yes."""
    if read_bps <= 0 or prefill_tps <= 0:
        return True
    return MARGIN * size / read_bps <= tokens / prefill_tps


def configured(settings: WorkerSettings) -> DiskCache | None:
    """The tier `--prompt-cache-dir` asks for; none if it cannot be opened now (logged:
    the worker serves without it)."""
    if not settings.prompt_cache_dir or settings.prompt_cache_disk_bytes <= 0:
        return None
    try:
        model = kvstore.model_identity(settings.source.path)
        directory = Path(settings.prompt_cache_dir)
        return DiskCache(directory, settings.prompt_cache_disk_bytes, model)
    except (OSError, ValueError) as exc:
        log.warning("prompt cache: no disk tier: %s", exc)
        return None


class DiskCache:
    def __init__(self, directory: Path, max_bytes: int, model: str) -> None:
        self.max_bytes = max_bytes
        self.index = Index(kvstore.prepare_dir(str(directory)), model)
        self.lock = threading.Lock()  # the index: looked up here, changed by the writer too
        self.queue: queue.Queue[Save] = queue.Queue(QUEUED)
        self.epoch = 0
        self.errors = self.reported = 0  # `reported`: errors already told
        self.read_bps = 0.0  # the read path's speed, measured (0: not yet)
        self.token_bytes = 0.0  # an entry's bytes per token, once one was sized (0: not yet)
        with self.lock:
            self._refresh()
            self._evict(0)
        threading.Thread(target=self._writer, daemon=True, name="prompt-cache-writer").start()

    def fetch(
        self, tokens: list[int], above: int, prefill_tps: float = 0.0
    ) -> tuple[list[Any], int] | None:
        """The KV of the longest prefix of `tokens` on disk holding more than `above` of
        them (a fresh copy), and how many it holds, if reading it is sooner than
        prefilling them at `prefill_tps`; None if there is none. Corrupt entries met on the
        way are removed. Whatever goes wrong (the directory deleted, a filesystem gone
        read-only, memory) is a miss, never the request's fault: the canary never reads
        this tier, so a fault here would keep failing requests on a worker it keeps."""
        if len(tokens) < MIN_TOKENS or self.never(prefill_tps):  # nothing worth loading
            return None
        try:
            return self._fetch(tokens, above, prefill_tps)
        except Exception as exc:
            self._missed("read", exc)
            return None

    def save(self, tokens: list[int], cache: list[Any] | None, prefill_tps: float = 0.0) -> None:
        """Queue the KV `cache` holds of `tokens` for the writer, never waiting for it (and
        never failing the request whose KV it is, as `fetch`), unless reading it back
        would never beat prefilling it at `prefill_tps`."""
        try:
            self._save(tokens, cache, prefill_tps)
        except Exception as exc:
            self._missed("save", exc)

    def probe(self) -> None:
        """Time the read path (a file read, its checksum, the arrays onto the device) on an
        entry of known size written for it, so the first real load is decided on a
        measured speed. A failure leaves the speed unmeasured."""
        count, shape = PROBE
        data = np.zeros(shape, np.uint16)
        arrays = [kvstore.Array("bfloat16", shape, memoryview(data).cast("B"))] * count
        path = self.index.temporary("probe")
        try:
            size = kvstore.write(path, self.index.model, list(range(shape[2])), arrays)
            started = time.perf_counter()
            _device_cache(kvstore.read(path).arrays, shape[2])
            self._timed(size, time.perf_counter() - started)
        except Exception as exc:
            log.warning("prompt cache: read speed not measured: %s: %s", type(exc).__name__, exc)
        finally:
            path.unlink(missing_ok=True)

    def never(self, prefill_tps: float) -> bool:
        """Reading KV back never beats prefilling it at the speeds measured: both grow with
        the tokens, so it holds for every length, and nothing is looked up or saved."""
        size = int(self.token_bytes * MIN_TOKENS)
        return size > 0 and not pays(size, self.read_bps, MIN_TOKENS, prefill_tps)

    def _timed(self, size: int, seconds: float) -> None:
        if seconds > 0:
            rate = size / seconds
            self.read_bps = (
                SMOOTHING * rate + (1 - SMOOTHING) * self.read_bps if self.read_bps else rate
            )

    def _missed(self, what: str, exc: Exception) -> None:
        self._failed()
        log.warning("prompt cache: %s failed: %s: %s", what, type(exc).__name__, exc)

    def _fetch(
        self, tokens: list[int], above: int, prefill_tps: float
    ) -> tuple[list[Any], int] | None:
        with self.lock:
            self._refresh()
            files = self.index.files
            found = [(n, name, files[name].size) for n, name in self.index.lookup(tokens, above)]
        for n, name, size in found:
            if not pays(size, self.read_bps, n - above, prefill_tps):
                continue  # a shorter entry, a smaller file, may still pay
            started = time.perf_counter()
            try:
                entry = kvstore.read(self.index.directory / name)
                if entry.model != self.index.model or entry.tokens[:n] != tokens[:n]:
                    raise kvstore.Corrupt(f"{name}: holds another model's or other tokens")
                cache = _device_cache(entry.arrays, n)
            except FileNotFoundError:  # evicted meanwhile
                continue
            except (kvstore.Corrupt, ValueError) as exc:
                self._drop(name, exc)
                continue
            except OSError as exc:  # unreadable now, not known corrupt: left in place
                log.warning("prompt cache: cannot read %s: %s", name, exc)
                continue
            self._timed(size, time.perf_counter() - started)
            with self.lock:
                self.index.touch(name)
            return cache, n
        return None

    def _save(self, tokens: list[int], cache: list[Any] | None, prefill_tps: float) -> None:
        held = min(len(tokens), _held(cache))
        if held < MIN_TOKENS or self.queue.full() or self.never(prefill_tps):
            return
        assert cache is not None
        if sum(c.nbytes for c in cache) > self.max_bytes:  # could never be kept: not copied
            return
        if self.index.name(tokens[:held]) in self.index.files:  # on disk already
            return
        arrays = _copies(cache, held)
        if arrays is None:
            return
        size = _size(arrays, held)
        self.token_bytes = size / held
        if not pays(size, self.read_bps, held, prefill_tps):
            return
        mx.eval(arrays)  # a copy on the device: the writer copies them to the host
        self.queue.put_nowait(Save(self.epoch, tokens[:held], arrays))

    def fault(self) -> None:
        """KV computed around a fault is suspect: drop every save not yet on disk."""
        with self.lock:
            self.epoch += 1

    def use(self, tokens: int | None) -> DiskUse:
        """What an answer reports: the prompt tokens it loaded (None: it did not ask), and
        the tier's bytes and errors since the last report."""
        errors, self.reported = self.errors - self.reported, self.errors
        return DiskUse(tokens or 0, tokens == 0, self.index.size, errors)

    def _writer(self) -> None:
        while True:
            save = self.queue.get()
            try:
                self._write(save)
            except OSError as exc:
                self._failed()
                reason = errno.errorcode.get(exc.errno or 0, "error")
                log.warning("prompt cache: entry not written (%s): %s", reason, exc)
            except Exception:  # a bug here must not end the writer, nor the worker
                self._failed()
                log.exception("prompt cache: entry not written")

    def _failed(self) -> None:
        with self.lock:
            self.errors += 1

    def _write(self, save: Save) -> None:
        index = self.index
        name = index.name(save.tokens)
        room = _size(save.arrays, len(save.tokens))
        with self.lock:
            if save.epoch != self.epoch or room > self.max_bytes:
                return
            self._refresh()
            if name in index.files:
                return
            self._evict(room)
        arrays = _host_copy(save.arrays)
        temporary = index.temporary(name)
        size = kvstore.write(temporary, index.model, save.tokens, arrays)
        with self.lock:
            if save.epoch != self.epoch:  # a fault came while it was written
                temporary.unlink()
                return
            os.replace(temporary, index.directory / name)
            index.add(name, save.tokens, size, time.time_ns())
            for old in index.superseded(save.tokens):
                index.remove(old)
            self._evict(0)

    def _refresh(self) -> None:
        """The index, up to date with the directory (the lock held)."""
        self.errors += len(self.index.refresh())

    def _evict(self, room: int) -> None:
        """Least recently used entries out until `room` more bytes fit (the lock held)."""
        for name in self.index.victims(room, self.max_bytes):
            self.index.remove(name)

    def _drop(self, name: str, exc: Exception) -> None:
        log.warning("prompt cache: removed %s", exc)
        with self.lock:
            self.errors += 1
            self.index.remove(name)


def _held(cache: list[Any] | None) -> int:
    """Tokens a cache holds, if it is one the disk tier stores (plain KV, every layer)."""
    if not cache or any(type(c) is not KVCache or c.keys is None for c in cache):
        return 0
    return min(c.offset for c in cache)


def _copies(cache: list[Any], held: int) -> list[mx.array] | None:
    """The first `held` positions of every layer's keys and values, copied on the device
    into buffers of their own (bfloat16 seen as uint16, which numpy holds), not computed
    yet; None if a dtype is not stored. Their own: MLX on CUDA moves a device buffer to
    host-visible memory when the host reads it, which on the writer's thread must never be
    a buffer the batch's kernels use (the KV, the memory cache's entries). An arithmetic op
    never shares a buffer that others hold, as `contiguous` may."""
    arrays = [a[..., :held, :] for c in cache for a in (c.keys, c.values)]
    if any(a.dtype not in HOST for a in arrays):
        return None
    arrays = [a + 0 for a in arrays]
    return [a.view(mx.uint16) if a.dtype == mx.bfloat16 else a for a in arrays]


def _size(arrays: list[mx.array], tokens: int) -> int:
    """An entry's bytes, about: its arrays' and its tokens'."""
    return sum(a.nbytes for a in arrays) + 4 * tokens


def _host_copy(arrays: list[mx.array]) -> list[kvstore.Array]:
    """Evaluated arrays copied to the host (on the writer's thread)."""
    copies = []
    for a in arrays:
        dtype = "bfloat16" if a.dtype == mx.uint16 else str(a.dtype).removeprefix("mlx.core.")
        copies.append(kvstore.Array(dtype, a.shape, np.array(a).data))
    return copies


def _device_cache(arrays: list[kvstore.Array], held: int) -> list[Any]:
    """Each layer's `KVCache` from an entry's arrays, trimmed to `held` positions."""
    if len(arrays) % 2 or any(len(a.shape) != 4 or a.shape[2] < held for a in arrays):
        raise kvstore.Corrupt("arrays of no KV cache")
    device = []
    for a in arrays:
        dtype = getattr(mx, a.dtype)
        host = np.frombuffer(a.data, HOST[dtype]).reshape(a.shape)[:, :, :held, :]
        array = mx.array(np.ascontiguousarray(host))
        device.append(array.view(dtype) if dtype == mx.bfloat16 else array)
    mx.eval(device)
    caches = []
    for keys, values in zip(device[::2], device[1::2], strict=True):
        cache = KVCache()
        cache.keys, cache.values, cache.offset = keys, values, held
        caches.append(cache)
    return caches
