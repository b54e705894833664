"""The configured models (SPEC §9): `--model NAME=PATH` repeated, or `--models FILE.toml`.

Only these can ever load: a request names a model, never a path. A bare `--model PATH`
(or none: the embedded default) is one model, named as today by its path. A models file
holds one table per model, the first one the default:

    [tiny]
    path = "/models/tiny"
    aliases = ["small", "claude-*"]
    pin = true

Anything wrong in it (TOML syntax, an unknown key, a wrong type, a name or alias twice) is
a `CatalogError` naming the file's line: exit 78, before anything starts.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from steward.config import SPECULATE, ServeConfig
from steward.model.resolve import ModelError, ModelSource, resolve_model
from steward.pool.groups import configure
from steward.pool.names import DEFAULT, is_pattern, listed_names
from steward.wire.faultspec import FaultSpec

NAME = re.compile(r"^[A-Za-z0-9][\w.:-]*$")
# a model's own settings: ServeConfig fields its table may override
OVERRIDES = (
    "max_batch",
    "standby",
    "max_restarts",
    "prompt_cache_bytes",
    "ranks",
    "hostfile",
    "distributed_backend",
    "parallel",
    "speculate",
    "draft_model",
)
CHOICES = {  # a model's settings that take one of a few values
    "kind": ("auto", "chat", "embedding"),
    "standby": ("auto", "none", "warm", "hot"),
    "distributed_backend": ("any", "ring", "jaccl", "nccl", "mpi"),
    "parallel": ("auto", "tensor", "pipeline"),
    "speculate": SPECULATE,
}
KEYS: dict[str, type | tuple[type, ...]] = {
    "path": str,
    "aliases": list,
    "kind": str,
    "pin": bool,
    "idle_ttl": (int, float),
    "max_batch": int,
    "standby": str,
    "max_restarts": int,
    "prompt_cache_bytes": int,
    "ranks": int,
    "hostfile": str,
    "distributed_backend": str,
    "parallel": str,
    "speculate": str,
    "draft_model": str,
}


class CatalogError(ValueError):
    """The models configuration cannot work: exit 78."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: str | None  # what a bare --model takes: a dir, a .gguf, a repo id; None: the default
    aliases: tuple[str, ...] = ()
    kind: str | None = None  # chat, embedding, auto; None: as --model-kind says
    pin: bool = False  # loaded at start, never evicted
    idle_ttl: float | None = None  # seconds unused before it is unloaded
    overrides: dict[str, Any] = field(default_factory=dict)
    named: bool = True  # False: a bare --model, named by its path (the id resolve gives)
    source: ModelSource | None = None  # once resolved

    def config(self, base: ServeConfig) -> ServeConfig:
        """The ServeConfig its supervisor sees: one model, its own settings, its group's
        hosts read (ValueError where its group cannot be formed: pool/groups.py)."""
        kind = {"model_kind": self.kind} if self.kind else {}  # else as --model-kind says
        return configure(
            replace(
                base,
                model=self.path,
                served_model_name=list(self.aliases),
                **kind,
                **self.overrides,
            )
        )


def from_flags(specs: list[str], aliases: list[str]) -> list[ModelEntry]:
    """`--model PATH` or `--model NAME=PATH`, repeated; `--served-model-name` aliases the
    first (the default)."""
    entries = [_flag_entry(spec) for spec in specs] or [ModelEntry("", None, named=False)]
    entries[0] = replace(entries[0], aliases=tuple(aliases))
    return entries


def _flag_entry(spec: str) -> ModelEntry:
    name, eq, path = spec.partition("=")
    if eq and NAME.match(name) and path:
        return ModelEntry(name, path)
    return ModelEntry("", spec, named=False)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise CatalogError(f"--models {path}: {exc}") from exc


def from_file(path: str, text: str, aliases: list[str]) -> list[ModelEntry]:
    """The models a TOML file configures, in its order."""
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"--models {path}: {exc}") from exc
    if not tables:
        raise CatalogError(f"--models {path}: no model tables")
    entries = [_table_entry(path, text, name, table) for name, table in tables.items()]
    entries[0] = replace(entries[0], aliases=entries[0].aliases + tuple(aliases))
    return entries


def _table_entry(path: str, text: str, name: str, table: Any) -> ModelEntry:
    def wrong(message: str, key: str | None = None) -> CatalogError:
        return CatalogError(f"--models {path}, line {line_of(text, name, key)}: {message}")

    if not isinstance(table, dict):
        raise wrong(f"{name!r} is not a table; each model is a [NAME] table")
    if not NAME.match(name):
        raise wrong(f"model name {name!r}: letters, digits and . _ : - only")
    for key, value in table.items():
        if key not in KEYS:
            raise wrong(f"[{name}] unknown key {key!r}; known: {', '.join(KEYS)}", key)
        kind = KEYS[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise wrong(f"[{name}] {key}: {value!r} is not {_kind_name(kind)}", key)
    aliases = table.get("aliases", [])
    if not all(isinstance(a, str) and a for a in aliases):
        raise wrong(f"[{name}] aliases: a list of names", "aliases")
    for key, choices in CHOICES.items():
        if table.get(key, choices[0]) not in choices:
            raise wrong(f"[{name}] {key}: one of {', '.join(choices)}", key)
    for key in ("max_batch", "ranks"):
        if key in table and table[key] < 1:
            raise wrong(f"[{name}] {key}: at least 1", key)
    for key in ("max_restarts", "prompt_cache_bytes", "idle_ttl"):
        if key in table and table[key] < 0:
            raise wrong(f"[{name}] {key}: not negative", key)
    if table.get("pin") and "idle_ttl" in table:
        raise wrong(f"[{name}] a pinned model is never unloaded: pin or idle_ttl", "idle_ttl")
    ttl = table.get("idle_ttl")
    return ModelEntry(
        name,
        table.get("path"),  # none: the embedded default, as a bare `steward serve` serves
        tuple(aliases),
        table.get("kind"),
        table.get("pin", False),
        None if ttl is None else float(ttl),
        {key: table[key] for key in OVERRIDES if key in table},
    )


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", list: "a list", bool: "true or false", int: "an integer"}
    return "a number" if isinstance(kind, tuple) else names[kind]


def line_of(text: str, table: str, key: str | None = None) -> int:
    """The line of `[table]` in the file, or of its `key` (1 where neither is found)."""
    header = re.compile(
        rf"^\s*\[\s*(\"{re.escape(table)}\"|'{re.escape(table)}'|"
        rf"{re.escape(table)})\s*\]"
    )
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return 1
    if key is not None:
        setting = re.compile(rf"^\s*\"?{re.escape(key)}\"?\s*=")
        for i in range(start + 1, len(lines)):
            if lines[i].lstrip().startswith("["):
                break
            if setting.match(lines[i]):
                return i + 1
    return start + 1


def load(specs: list[str], models_file: str | None, aliases: list[str]) -> list[ModelEntry]:
    """The configured models, each resolved to its source (cheap checks, no loading), their
    names checked: `--models FILE`, or `--model` (repeated)."""
    if models_file and specs:
        raise CatalogError("--models and --model: give one or the other")
    if models_file:
        text = _read(models_file)
        entries = from_file(models_file, text, aliases)

        def where(entry: ModelEntry, key: str) -> str:
            return f"--models {models_file}, line {line_of(text, entry.name, key)}"
    else:
        entries = from_flags(specs, aliases)

        def where(entry: ModelEntry, key: str) -> str:
            return f"--model {entry.name}={entry.path}" if entry.named else "--model"

    entries = [_resolved(entry, where) for entry in entries]
    _check_names(entries, where)
    return entries


def _resolved(entry: ModelEntry, where: Callable[[ModelEntry, str], str]) -> ModelEntry:
    try:
        source = resolve_model(entry.path)
    except ModelError as exc:
        message = f"{where(entry, 'path')}: {exc}" if entry.named else str(exc)
        raise CatalogError(message) from exc
    if not entry.named:
        return replace(entry, name=source.model_id, source=source)
    return replace(entry, source=replace(source, model_id=entry.name))


def _check_names(entries: list[ModelEntry], where: Callable[[ModelEntry, str], str]) -> None:
    """No name or alias of two models: a request's `model` must name one model (a model
    may be named twice itself: `--served-model-name` repeating its directory's name), and
    `default` names the first (names.py), so no other may take it."""
    seen: dict[str, str] = {}
    for i, entry in enumerate(entries):
        names = [*listed_names(entry), *(a for a in entry.aliases if is_pattern(a))]
        if i > 0 and DEFAULT in names:
            key = "aliases" if entry.name != DEFAULT else "path"
            raise CatalogError(
                f"{where(entry, key)}: the name {DEFAULT!r} means the first model "
                f"({entries[0].name!r}); name this one otherwise"
            )
        for name in dict.fromkeys(names):
            if name in seen:
                owner = seen[name]
                also = "" if owner == entry.name else f" (already {owner!r}'s)"
                key = "aliases" if name != entry.name else "path"
                raise CatalogError(f"{where(entry, key)}: the name {name!r} is given twice{also}")
            seen[name] = entry.name


def check_groups(entries: list[ModelEntry], base: ServeConfig) -> None:
    """Every model's group can be formed (its settings configured now, not kept: groups.py)."""
    for entry in entries:
        try:
            entry.config(base)
        except ValueError as exc:
            raise CatalogError(
                f"model {entry.name}: {exc}" if len(entries) > 1 else str(exc)
            ) from exc


def check_aims(faults: list[FaultSpec], entries: list[ModelEntry]) -> None:
    """A fault aimed at a model (`model=NAME`) names a configured one."""
    known = [entry.name for entry in entries]
    for spec in faults:
        if spec.model is not None and spec.model not in known:
            raise CatalogError(
                f"--inject-fault model={spec.model}: no such model; configured: {', '.join(known)}"
            )
