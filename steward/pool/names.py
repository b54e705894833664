"""Which model names a request may use (SPEC §4): the served model's id, `default`, the
operator's `--served-model-name` aliases, and names matching an alias that is a glob.

Coding agents send their own model names (Claude Code asks for `claude-…` models, a big
one and a small fast one); an operator who wants steward to answer them says so with a
pattern such as `claude-*`. Any other name is 404 `model_not_found`: a client must not
believe it got a model it did not ask for.
"""

from __future__ import annotations

import fnmatch

from steward.config import ServeConfig
from steward.errors import ApiError

GLOB = frozenset("*?[")


def is_pattern(name: str) -> bool:
    return not GLOB.isdisjoint(name)


def listed_names(model_id: str, config: ServeConfig) -> list[str]:
    """The concrete names, as `/v1/models` lists them: the id first, then the aliases."""
    return [model_id, *(n for n in config.served_model_name if not is_pattern(n))]


def resolve_model(name: str | None, model_id: str, config: ServeConfig) -> str:
    """The served model's id, if `name` names this model; else the 404 that says which
    names do."""
    names = listed_names(model_id, config)
    if name in (None, "", "default", *names):
        return model_id
    patterns = [n for n in config.served_model_name if is_pattern(n)]
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
        return model_id
    served = ", ".join(repr(n) for n in [*names, *patterns])
    raise ApiError(
        "model_not_found",
        f"The model {name!r} is not served here; this server serves {served}.",
        param="model",
    )
