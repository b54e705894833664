"""A draft model for speculative decoding (`--draft-model`), checked before anything starts.

A draft token is a token id the target verifies: it must mean what the target's own token
of that id means. So a draft model is taken only with the target's tokenizer (the same
vocabulary, added tokens included); any other is refused at start, exit 78, rather than
drafting what the target would only ever refuse.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from steward.model.gguf import materialize
from steward.model.resolve import ModelError, ModelSource, resolve_model


def checked(target: ModelSource, spec: str) -> str:
    """The draft model's MLX directory (a GGUF imported once, as a model is). ModelError
    when its tokenizer is not the target's."""
    draft = materialize(resolve_model(spec))
    ours, theirs = vocabulary(materialize(target)), vocabulary(draft)
    if ours != theirs:
        differ = len(set(ours.items()) ^ set(theirs.items()))
        raise ModelError(
            f"--draft-model {spec}: its tokenizer is not the model's ({len(theirs)} tokens "
            f"against {len(ours)}, {differ} entries differ); a draft model must share it"
        )
    return str(draft)


def vocabulary(model_dir: Path) -> dict[str, int]:
    """Each token's id, added tokens included."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ModelError(f"{model_dir}: no tokenizer.json, so its tokenizer cannot be compared")
    return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
