"""Which prompt prefixes the cache directory holds, found by their tokens without reading
any entry's arrays.

An entry of this model is indexed under the digests of its tokens' prefixes at every
multiple of BLOCK tokens and at its own length, so it serves a prompt that starts with the
whole of it, and one that shares only its first k·BLOCK tokens (a conversation that went
another way), trimmed to them. A prompt is looked up by the digests of its own prefixes at
the lengths the index has, longest first.

The index follows the directory: it is read again whenever the directory changed, so a
spare that started before an entry was written, or a restarted steward, finds it. Files
of other models (their names start with another identity) count toward the byte bound and
are evicted oldest first like any other, but are never matched: models that share a
directory share its bound. A file under this model's name that is no whole entry of this
model (truncated, mislabelled) is removed when read; `.tmp` files of writers that died are
removed too.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

from steward.worker import kvstore

log = logging.getLogger(__name__)

BLOCK = 256  # tokens: the granularity at which an entry serves a prompt it only begins
SETTLED_NS = 2 * 10**9  # a directory's mtime this old will not move within its clock tick


@dataclass
class File:
    name: str
    size: int
    used: int  # ns: the least recently used is evicted first
    tokens: int = 0  # 0: another model's entry, never matched
    keys: tuple[tuple[int, bytes], ...] = ()  # (prefix length, its digest)


def digests(tokens: list[int], lengths: list[int]) -> dict[int, bytes]:
    """The digest of each prefix of `tokens` of the given (ascending) lengths, in one pass."""
    data = memoryview(array("I", tokens)).cast("B")
    digest, at, found = hashlib.sha256(), 0, {}
    for n in lengths:
        digest.update(data[4 * at : 4 * n])
        at = n
        found[n] = digest.copy().digest()
    return found


class Index:
    def __init__(self, directory: Path, model: str) -> None:
        self.directory = directory
        self.model = model
        self.mine = model[:16] + "-"  # this model's file names start so
        self.files: dict[str, File] = {}
        self.keys: dict[int, dict[bytes, set[str]]] = {}  # length -> digest -> names
        self.size = 0  # bytes of every entry in the directory
        self.seen = -1  # the directory's mtime when last read, once settled

    def name(self, tokens: list[int]) -> str:
        digest = hashlib.sha256(self.model.encode() + array("I", tokens).tobytes())
        return self.mine + digest.hexdigest()[:32] + kvstore.SUFFIX

    def temporary(self, name: str) -> Path:
        """Where `name` is written before it is renamed into place."""
        return self.directory / f".{name}.{os.getpid()}{kvstore.TEMPORARY}"

    def refresh(self) -> list[str]:
        """Read the directory again if it changed since; the entries removed as corrupt."""
        mtime = os.stat(self.directory).st_mtime_ns
        if mtime == self.seen:
            return []
        # An mtime moves in clock ticks: a file added within the tick of this read would
        # leave it unchanged, so only a settled one is taken as read.
        self.seen = mtime if time.time_ns() - mtime > SETTLED_NS else -1
        present, removed = set(), []
        for item in os.scandir(self.directory):
            if item.name.endswith(kvstore.TEMPORARY):
                self._clean(item.name)
            elif item.name.endswith(kvstore.SUFFIX):
                present.add(item.name)
                if item.name not in self.files and not self._read(item.name):
                    removed.append(item.name)
        for name in set(self.files) - present:
            self._forget(name)
        return removed

    def add(self, name: str, tokens: list[int], size: int, used: int) -> None:
        """Index an entry written; one of the same name (another process's, same model)
        is replaced, not counted twice."""
        if name in self.files:
            self._forget(name)
        lengths = sorted({*range(BLOCK, len(tokens) + 1, BLOCK), len(tokens)})
        keys = tuple(digests(tokens, lengths).items())
        self.files[name] = File(name, size, used, len(tokens), keys)
        self.size += size
        for n, digest in keys:
            self.keys.setdefault(n, {}).setdefault(digest, set()).add(name)

    def lookup(self, tokens: list[int], above: int) -> list[tuple[int, str]]:
        """(tokens held, name) of the entries that hold more than `above` of `tokens`' first
        tokens and leave at least one to compute: longest first, then the latest used."""
        lengths = sorted(n for n in self.keys if above < n < len(tokens))
        found = []
        for n, digest in sorted(digests(tokens, lengths).items(), reverse=True):
            names = self.keys[n].get(digest, set())
            found += [(n, name) for name in sorted(names, key=lambda m: -self.files[m].used)]
        return found

    def superseded(self, tokens: list[int]) -> list[str]:
        """This model's entries whose tokens all begin `tokens` (a longer entry's): it
        serves them."""
        lengths = sorted({f.tokens for f in self.files.values() if 0 < f.tokens < len(tokens)})
        return [
            name
            for n, digest in digests(tokens, lengths).items()
            for name in self.keys.get(n, {}).get(digest, ())
            if self.files[name].tokens == n
        ]

    def victims(self, room: int, max_bytes: int) -> list[str]:
        """The least recently used entries to remove so that `room` more bytes fit."""
        over = self.size + room - max_bytes
        chosen = []
        for file in sorted(self.files.values(), key=lambda f: f.used):
            if over <= 0:
                break
            chosen.append(file.name)
            over -= file.size
        return chosen

    def touch(self, name: str) -> None:
        """`name` was just used: the last to be evicted (kept across restarts: its mtime)."""
        if file := self.files.get(name):
            file.used = time.time_ns()
            with contextlib.suppress(OSError):
                os.utime(self.directory / name, ns=(file.used, file.used))

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / name).unlink()
        self._forget(name)

    def _read(self, name: str) -> bool:
        """Index a file found in the directory; False if it was corrupt (and is gone)."""
        path = self.directory / name
        try:
            info = path.stat()
            if not name.startswith(self.mine):  # another model's: counted, never matched
                self._add_other(name, info.st_size, info.st_mtime_ns)
                return True
            model, tokens, size = kvstore.read_head(path)
            if model != self.model or self.name(tokens) != name:
                raise kvstore.Corrupt(f"{name}: holds another model's or other tokens")
        except FileNotFoundError:  # removed meanwhile (another worker's eviction)
            return True
        except kvstore.Corrupt as exc:
            log.warning("prompt cache: removed %s", exc)
            self.remove(name)
            return False
        self.add(name, tokens, size, info.st_mtime_ns)
        return True

    def _add_other(self, name: str, size: int, used: int) -> None:
        self.files[name] = File(name, size, used)
        self.size += size

    def _forget(self, name: str) -> None:
        file = self.files.pop(name, None)
        if file is None:
            return
        self.size -= file.size
        for n, digest in file.keys:
            names = self.keys[n][digest]
            names.discard(name)
            if not names:
                del self.keys[n][digest]
                if not self.keys[n]:
                    del self.keys[n]

    def _clean(self, name: str) -> None:
        """Remove a temporary file whose writer is dead (`.NAME.PID.tmp`)."""
        pid = name.removesuffix(kvstore.TEMPORARY).rpartition(".")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            return
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(FileNotFoundError):
                (self.directory / name).unlink()
        except PermissionError:  # alive, another user's (not in a 0700 directory)
            pass
