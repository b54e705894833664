"""The prompt cache's files: one prompt prefix's KV a file, whole or not at all.

A file is MAGIC, its header's length (4 bytes, little-endian), a JSON header (the model's
identity, each array's dtype and shape), the prefix's token ids (uint32), the arrays'
bytes, and a SHA-256 of everything before it. It is written under a temporary name and
renamed into place, so a reader never meets a half-written file under an entry's name; the
checksum catches what a rename cannot (a write torn by a power cut, a truncated copy, a
disk's own corruption). Nothing here imports MLX: the front checks the directory at start-up
(`prepare_dir`), and the worker's writer thread runs this without the runtime.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MAGIC = b"steward-kv 1\n"
SUFFIX = ".kv"
TEMPORARY = ".tmp"
DIGEST = 32  # bytes of SHA-256
WEIGHTS = ("*.safetensors", "*.gguf", "*.npz")  # what a model directory's identity covers


class Corrupt(ValueError):
    """A file that is no whole entry: truncated, torn, altered, or not ours at all."""


@dataclass(frozen=True)
class Array:
    """One array of an entry: MLX's dtype name, its shape, and its bytes on the host."""

    dtype: str
    shape: tuple[int, ...]
    data: memoryview


@dataclass(frozen=True)
class Entry:
    model: str
    tokens: list[int]
    arrays: list[Array]


def prepare_dir(path: str) -> Path:
    """The cache directory, created 0700. An existing one must be ours; one that others may
    read (it holds prompts, as KV) is repaired to 0700, and the log says so."""
    folder = Path(path).expanduser().absolute()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"--prompt-cache-dir {folder}: not a directory") from None
    info = folder.stat()
    if info.st_uid != os.getuid():
        raise ValueError(f"--prompt-cache-dir {folder}: owned by uid {info.st_uid}, not this user")
    if stat.S_IMODE(info.st_mode) != 0o700:
        log.warning(
            "--prompt-cache-dir %s: mode %o, made 0700 (it holds prompts)",
            folder,
            stat.S_IMODE(info.st_mode),
        )
        folder.chmod(0o700)
    return folder


def model_identity(path: Path) -> str:
    """What no other model can match: a model directory's config and its weight files'
    names, sizes and modification times (a .gguf file: its own). Weights rewritten in place
    with the same size and time are the one change it misses; hashing gigabytes at every
    start would cost more than the cache saves."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(f for w in WEIGHTS for f in path.glob(w))
    if path.is_dir():
        digest.update((path / "config.json").read_bytes())
    for file in files:
        info = file.stat()
        digest.update(f"{file.name}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:32]


def write(path: Path, model: str, tokens: Sequence[int], arrays: list[Array]) -> int:
    """Write an entry to `path` (a temporary name: the caller renames it into place), 0600;
    its size in bytes. OSError (a full disk included) leaves no file behind."""
    header = json.dumps(
        {"model": model, "arrays": [[a.dtype, list(a.shape)] for a in arrays]}
    ).encode()
    parts = [
        MAGIC,
        len(header).to_bytes(4, "little"),
        header,
        len(tokens).to_bytes(4, "little"),
        memoryview(array("I", tokens)),
        *(a.data for a in arrays),
    ]
    digest = hashlib.sha256()
    try:
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            for part in parts:
                digest.update(part)
                f.write(part)
            f.write(digest.digest())
            return f.tell()
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise


def read_head(path: Path) -> tuple[str, list[int], int]:
    """(model, tokens, size) from a file's start, unverified but checked for its length:
    cheap enough for every file at start-up. Corrupt if it cannot be an entry."""
    with path.open("rb") as f:
        head = _head(f.read)
        size = os.fstat(f.fileno()).st_size
    if size != head.size:
        raise Corrupt(f"{path.name}: {size} bytes, not {head.size}")
    return head.model, head.tokens, size


def read(path: Path) -> Entry:
    """The whole entry, its checksum verified; Corrupt otherwise."""
    blob = memoryview(path.read_bytes())
    if len(blob) < DIGEST or hashlib.sha256(blob[:-DIGEST]).digest() != blob[-DIGEST:]:
        raise Corrupt(f"{path.name}: checksum mismatch")
    at = 0

    def take(n: int) -> bytes | memoryview:
        nonlocal at
        at += n
        return blob[at - n : at]

    head = _head(take)
    if len(blob) != head.size:
        raise Corrupt(f"{path.name}: {len(blob)} bytes, not {head.size}")
    arrays = [Array(dtype, shape, blob[at : (at := at + n)]) for dtype, shape, n in head.shapes]
    return Entry(head.model, head.tokens, arrays)


ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # the KV dtypes stored


@dataclass(frozen=True)
class Head:
    """A file's header and tokens, and the size they promise."""

    model: str
    tokens: list[int]
    shapes: list[tuple[str, tuple[int, ...], int]]  # dtype, shape, bytes
    size: int


def _head(take: Callable[[int], bytes | memoryview]) -> Head:
    """The header and tokens, read by `take(n)` (the next n bytes); Corrupt if malformed."""
    try:
        if bytes(take(len(MAGIC))) != MAGIC:
            raise Corrupt("no entry (magic)")
        length = int.from_bytes(take(4), "little")
        header = json.loads(bytes(take(length)))
        count = int.from_bytes(take(4), "little")
        tokens = array("I", bytes(take(4 * count))).tolist()
        shapes = [_shape(str(d), tuple(int(n) for n in s)) for d, s in header["arrays"]]
        model = str(header["model"])
    except (ValueError, KeyError, TypeError) as exc:
        raise Corrupt(f"malformed header: {exc}") from exc
    if len(tokens) != count:
        raise Corrupt("truncated tokens")
    read = len(MAGIC) + 4 + length + 4 + 4 * count
    return Head(model, tokens, shapes, read + sum(n for *_, n in shapes) + DIGEST)


def _shape(dtype: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...], int]:
    if dtype not in ITEM_BYTES:
        raise Corrupt(f"unknown dtype {dtype!r}")
    count = 1
    for n in shape:
        count *= n
    return dtype, shape, count * ITEM_BYTES[dtype]
