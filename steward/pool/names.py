"""Which model a request's `model` names (SPEC §4, §9): a configured model's name, `default`
(the first model), an alias, or a name matching an alias that is a glob.

Coding agents send their own model names (Claude Code asks for `claude-…` models, a big
one and a small fast one); an operator who wants steward to answer them says so with a
pattern such as `claude-*`. Any other name is 404 `model_not_found`: a client must not
believe it got a model it did not ask for. Concrete names win over patterns, so a glob of
one model never takes a name another model is configured with.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Protocol, TypeVar

from steward.errors import ApiError

GLOB = frozenset("*?[")
DEFAULT = "default"  # what a request may name the first model by


class Named(Protocol):
    name: str
    aliases: tuple[str, ...]


T = TypeVar("T", bound="Named")


def is_pattern(name: str) -> bool:
    return not GLOB.isdisjoint(name)


def listed_names(model: Named) -> list[str]:
    """The concrete names, as `/v1/models` lists them: the name first, then the aliases."""
    return [model.name, *(n for n in model.aliases if not is_pattern(n))]


def find(name: str | None, models: Sequence[T]) -> T:
    """The model `name` names (the first for none or `default`); else the 404 that says
    which names are served."""
    if name in (None, "", DEFAULT):
        return models[0]
    for model in models:
        if name in listed_names(model):
            return model
    for model in models:
        if any(fnmatch.fnmatchcase(name, n) for n in model.aliases if is_pattern(n)):
            return model
    names = [n for model in models for n in listed_names(model)]
    patterns = [n for model in models for n in model.aliases if is_pattern(n)]
    served = ", ".join(repr(n) for n in [*names, *patterns])
    raise ApiError(
        "model_not_found",
        f"The model {name!r} is not served here; this server serves {served}.",
        param="model",
    )
