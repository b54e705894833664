"""Build a Hugging Face fast tokenizer (tokenizer.json + tokenizer_config.json) from GGUF metadata.

GGUF keeps the vocabulary, not the tokenizer pipeline: the pre-tokenizer is only named
(`tokenizer.ggml.pre`), so it is rebuilt here the way llama.cpp interprets that name. The
output is the plain `tokenizers` format, so `mlx_lm.load` (through transformers' AutoTokenizer)
reads it like any converted model and picks its streaming detokenizer from the decoder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from .resolve import ModelError

# llama.cpp token types (gguf TokenType) that matter here.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` values that llama.cpp gives "split digits singly, then the GPT-2 regex".
DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
LLAMA3 = {"llama3", "llama-bpe", "falcon3", "pixtral"}


def write_tokenizer(meta: dict[str, Any], out: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json for the GGUF metadata `meta` into `out`."""
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
    if not tokens:
        raise ModelError("GGUF has no tokenizer.ggml.tokens: cannot build a tokenizer")
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if kind == "gpt2":
        tok = _bpe(tokens, meta)
    elif kind == "llama":
        tok = _spm(tokens, types, meta)
    else:
        raise ModelError(f"unsupported tokenizer {kind!r} (supported: 'gpt2' BPE, 'llama' SPM)")

    # Control tokens are special (hidden when decoding with skip_special_tokens); user-defined
    # ones are matched whole but rendered as text, as llama.cpp renders them.
    pairs = list(zip(tokens, types, strict=True))
    special = (CONTROL, UNKNOWN)
    tok.add_special_tokens([AddedToken(t, normalized=False) for t, ty in pairs if ty in special])
    tok.add_tokens([AddedToken(t, normalized=False) for t, ty in pairs if ty == USER_DEFINED])

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos, eos = token("bos"), token("eos")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")) and bos is not None
    if add_bos:
        bos_id = meta["tokenizer.ggml.bos_token_id"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    tok.save(str(out / "tokenizer.json"))

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.get(f"{meta.get('general.architecture')}.context_length", 2048),
    }
    if template := meta.get("tokenizer.chat_template"):
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def _bpe(tokens: list[str], meta: dict[str, Any]) -> Tokenizer:
    """Byte-level BPE (GPT-2 family), pre-tokenized as llama.cpp does for `tokenizer.ggml.pre`."""
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in LLAMA3)
    if pre in DIGITS_THEN_GPT2:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in LLAMA3:
        split = pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:  # "gpt2", "default" and the rest: the GPT-2 regex
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm(tokens: list[str], types: list[int], meta: dict[str, Any]) -> Tokenizer:
    """SentencePiece BPE (llama/mistral): score-ordered merges with byte fallback.

    GGUF has no merges for these, so they are rebuilt from the scores: a merge `l r` ranks by
    the score of the piece `l+r` it makes, which is how SentencePiece BPE picks pairs.
    """
    scores: list[float] = meta.get("tokenizer.ggml.scores") or []
    if len(scores) != len(tokens):
        raise ModelError("unsupported tokenizer 'llama' without tokenizer.ggml.scores")
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for piece, i in vocab.items():
        if types[i] != NORMAL:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], vocab[left], vocab[right], left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(
        models.BPE(
            vocab,
            merges,
            unk_token=tokens[unk] if unk is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    # Like llama.cpp: a space prefix on every text fragment (after each special token too).
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    space = normalizers.Replace(" ", "▁")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), space]) if prefix else space
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return tok
