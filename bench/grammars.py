"""Grammar-constrained decoding libraries, side by side: what each adds per token on the CPU.

Constrained decoding computes a token mask for every sequence of the batch before each
sample, and advances each sequence's matcher after it; that CPU work sits on the decode path
of every step. This replays the tokens of one valid JSON instance per schema through a batch
of matchers in lockstep (per step: all masks, then every matcher consumes the token) and
reports microseconds per step for llguidance (masks filled one by one, and in parallel on its
`LLExecutor` with its default thread count) and outlines_core, plus the time from a schema to
its first mask (outlines_core builds a whole token automaton up front, llguidance works
lazily). A coverage table then says, per JSON-schema feature, whether each library compiles
it, accepts a valid instance, and rejects an invalid one.

Each library keeps its own default whitespace (llguidance flexible, outlines_core `[ ]?`);
instances are `json.dumps` text, valid under both. All sequences of the batch replay the same
tokens. xgrammar is left out: its wheel requires torch and triton, which steward does not use.
Ratios are outlines_core / llguidance, measured in one run, runs alternating.

    python -m bench.grammars [--model DIR] [--batch 32] [--tokens 200] [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy as lnp
import numpy as np
import outlines_core
from outlines_core.json_schema import build_regex_from_schema

Step = Callable[[int], None]  # mask every sequence, then advance each by the token

ITEM = {
    "type": "object",
    "properties": {
        "sku": {"type": "string"},
        "qty": {"type": "integer"},
        "price": {"type": "number"},
        "note": {"type": "string"},
    },
    "required": ["sku", "qty", "price"],
}
WORKLOAD: dict[str, tuple[dict[str, Any], Any]] = {
    "flat": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "role": {"enum": ["admin", "editor", "viewer"]},
            },
            "required": ["name", "age", "role"],
        },
        {"name": "Ada Lovelace", "age": 36, "role": "editor"},
    ),
    "nested": (
        {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "items": {"type": "array", "items": ITEM},
                "shipping": {
                    "type": "object",
                    "properties": {"address": {"type": "string"}, "express": {"type": "boolean"}},
                    "required": ["address"],
                },
            },
            "required": ["id", "items"],
        },
        {
            "id": 90210,
            "tags": ["gift", "fragile"],
            "items": [
                {"sku": "LAMP-7", "qty": 2, "price": 19.99, "note": "brass, not chrome"},
                {"sku": "BULB-E27", "qty": 12, "price": 1.25},
                {"sku": "CORD-2M", "qty": 1, "price": 4.5, "note": "white"},
                {"sku": "SHADE-L", "qty": 1, "price": 32.0},
            ],
            "shipping": {"address": "1 Lighthouse Rd, Harbour Town", "express": True},
        },
    ),
    "ten-props": (
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 80},
                "author": {"type": "string"},
                "year": {"type": "integer"},
                "rating": {"type": "number"},
                "in_print": {"type": "boolean"},
                "genre": {"enum": ["fiction", "history", "science", "poetry"]},
                "isbn": {"type": "string", "pattern": "^[0-9]{13}$"},
                "pages": {"type": "integer"},
                "keywords": {"type": "array", "items": {"type": "string"}},
                "summary": {"type": "string"},
            },
            "required": ["title", "author", "year", "genre", "isbn", "summary"],
        },
        {
            "title": "The Lighthouse Keeper's Almanac",
            "author": "M. Okafor",
            "year": 1998,
            "rating": 4.6,
            "in_print": False,
            "genre": "history",
            "isbn": "9780140449136",
            "pages": 412,
            "keywords": ["lighthouses", "coast", "navigation", "weather"],
            "summary": "A year of logbook entries from a keeper on a remote northern rock.",
        },
    ),
}

NODE = {
    "type": "object",
    "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
    },
    "required": ["value"],
}
POINT = {
    "type": "object",
    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
    "required": ["x", "y"],
}
ONE_OF = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
]
INTS = {"type": "array", "items": {"type": "integer"}}
# (feature, schema, a valid instance, an invalid one)
COVERAGE: list[tuple[str, dict[str, Any], Any, Any]] = [
    ("enum", {"enum": ["red", "green", "blue"]}, "green", "purple"),
    ("const", {"type": "object", "properties": {"v": {"const": 42}}}, {"v": 42}, {"v": 41}),
    ("anyOf", {"anyOf": [{"type": "string"}, {"type": "integer"}]}, 7, True),
    ("oneOf", {"oneOf": ONE_OF}, {"b": "x"}, {"a": "x"}),
    (
        "$ref/$defs",
        {
            "$defs": {"pt": POINT},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
            "required": ["a", "b"],
        },
        {"a": {"x": 1, "y": 2}, "b": {"x": 0.5, "y": -3}},
        {"a": {"x": 1}, "b": {"x": 1, "y": 2}},
    ),
    (
        "recursive $ref",
        {"$defs": {"node": NODE}, "$ref": "#/$defs/node"},
        {"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]},
        {"value": 1, "children": [{"children": []}]},
    ),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "ABC-1234", "AB-1234"),
    (
        "format date-time",
        {"type": "string", "format": "date-time"},
        "2024-05-01T12:30:00Z",
        "2024-13-01T12:30:00Z",
    ),
    ("minLength/maxLength", {"type": "string", "minLength": 3, "maxLength": 8}, "hello", "hi"),
    ("minItems/maxItems", {**INTS, "minItems": 1, "maxItems": 4}, [1, 2, 3], []),
    (
        "additionalProperties",
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"a": 1, "b": 2},
        {"a": "x"},
    ),
    (
        "nested arrays",
        {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        [[1.5, 2], [], [3]],
        [[1, "x"]],
    ),
    ("integer min/max", {"type": "integer", "minimum": 1, "maximum": 100}, 42, 101),
    ("number min/max", {"type": "number", "minimum": 0, "maximum": 1}, 0.25, 1.5),
]


def outlines_vocabulary(hf_tok: Any) -> outlines_core.Vocabulary:
    """Each token's bytes, read the way outlines_core's `Vocabulary.from_pretrained` reads a
    tokenizer.json (which needs the hub): byte-level BPE through the GPT-2 byte map,
    SentencePiece through `▁` and `<0xNN>`. Special tokens and EOS are left out."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_level = "ByteLevel" in json.dumps(json.loads(hf_tok.backend_tokenizer.to_str())["decoder"])
    char_byte = {c: b for b, c in bytes_to_unicode().items()}
    special = set(hf_tok.added_tokens_decoder) | {hf_tok.eos_token_id}
    tokens: dict[bytes, list[int]] = defaultdict(list)
    for token, i in hf_tok.get_vocab().items():
        if i in special:
            continue
        if byte_level:
            text = bytes(char_byte[c] for c in token)
        elif re.fullmatch(r"<0x[0-9A-F]{2}>", token):
            text = bytes([int(token[3:5], 16)])
        else:
            text = token.replace("▁", " ").encode()
        tokens[text].append(i)
    return outlines_core.Vocabulary(hf_tok.eos_token_id, dict(tokens))


def llguidance_batch(llt: llguidance.LLTokenizer, grammar: str, batch: int, par: bool) -> Step:
    matchers = [llguidance.LLMatcher(llt, grammar) for _ in range(batch)]
    mask = lnp.allocate_token_bitmask(batch, llt.vocab_size)
    executor, indexed = llguidance.LLExecutor(), list(zip(matchers, range(batch), strict=True))

    def step(token: int) -> None:
        if par:
            lnp.fill_next_token_bitmask_par(executor, indexed, mask)
        else:
            for i, m in enumerate(matchers):
                lnp.fill_next_token_bitmask(m, mask, i)
        if not all([m.consume_token(token) for m in matchers]):
            raise RuntimeError(f"llguidance rejected token {token}: {matchers[0].get_error()}")

    return step


def outlines_batch(index: outlines_core.Index, words: int, batch: int) -> Step:
    guides = [outlines_core.Guide(index) for _ in range(batch)]
    mask = np.zeros((batch, words), np.int32)

    def step(token: int) -> None:
        base = mask.ctypes.data  # a raw pointer: `mask` must stay referenced here
        for i, g in enumerate(guides):
            g.write_mask_into(base + i * words * 4, words, 4)
        for g in guides:
            g.advance(token, return_tokens=False)  # raises on a token the index rejects

    return step


def replay(step: Step, tokens: list[int]) -> float:
    started = time.perf_counter()
    for t in tokens:
        step(t)
    return time.perf_counter() - started


def timed(f: Callable[[], object]) -> tuple[Any, float]:
    started = time.perf_counter()
    return f(), time.perf_counter() - started


def llguidance_first_mask(llt: llguidance.LLTokenizer, schema: dict[str, Any]) -> str:
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    lnp.fill_next_token_bitmask(
        llguidance.LLMatcher(llt, grammar), lnp.allocate_token_bitmask(1, llt.vocab_size)
    )
    return grammar


def outlines_first_mask(
    vocab: outlines_core.Vocabulary, schema: dict[str, Any], words: int
) -> outlines_core.Index:
    index = outlines_core.Index(build_regex_from_schema(json.dumps(schema)), vocab)
    mask = np.zeros(words, np.int32)
    outlines_core.Guide(index).write_mask_into(mask.ctypes.data, words, 4)
    return index


def llguidance_verdict(
    llt: llguidance.LLTokenizer, schema: dict[str, Any], good: list[int], bad: list[int]
) -> str:
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    if error := llguidance.LLMatcher.validate_grammar(grammar, llt):
        return "error: " + error.splitlines()[0]

    def accepts(tokens: list[int]) -> bool:
        m = llguidance.LLMatcher(llt, grammar)
        return m.try_consume_tokens(tokens) == len(tokens) and m.is_accepting()

    return verdict(accepts(good), accepts(bad))


def outlines_verdict(
    vocab: outlines_core.Vocabulary, schema: dict[str, Any], good: list[int], bad: list[int]
) -> str:
    try:
        index = outlines_core.Index(build_regex_from_schema(json.dumps(schema)), vocab)
    except Exception as e:  # a schema feature or regex it cannot build
        return "error: " + str(e).splitlines()[0]

    def accepts(tokens: list[int]) -> bool:
        guide = outlines_core.Guide(index)
        try:
            for t in tokens:
                guide.advance(t, return_tokens=False)
        except ValueError:
            return False
        return guide.is_finished()

    return verdict(accepts(good), accepts(bad))


def verdict(accepts_valid: bool, accepts_invalid: bool) -> str:
    if not accepts_valid:
        return "rejects valid"
    return "accepts invalid" if accepts_invalid else "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="MLX model dir (default: the default model)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=200, help="most tokens replayed per schema")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    from mlx_lm.utils import load_tokenizer

    from bench.overhead import bench_model

    model_dir = bench_model(args.model)
    hf_tok = load_tokenizer(model_dir)._tokenizer
    llt, llt_s = timed(lambda: llguidance.hf.from_tokenizer(hf_tok))
    vocab, vocab_s = timed(lambda: outlines_vocabulary(hf_tok))
    words = (llt.vocab_size + 31) // 32

    def encode(instance: Any) -> list[int]:
        return hf_tok.encode(json.dumps(instance), add_special_tokens=False)

    print(f"model {model_dir.name}, vocab {llt.vocab_size}, batch {args.batch}, ", end="")
    print(f"{os.cpu_count()} CPUs, median of {args.runs} alternating runs")
    print(f"tokenizer setup: llguidance {llt_s:.2f} s, outlines_core vocabulary {vocab_s:.2f} s")
    print(f"\nschema to first mask (ms); µs per step for the batch of {args.batch} (per sequence)")
    head = ("schema", "tok", "llg", "outl", "o/l", "llg seq", "llg par", "outl", "o/seq", "o/par")
    print("{:<10}{:>4} |{:>6}{:>7}{:>6} |{:>13}{:>13}{:>13}{:>7}{:>7}".format(*head))
    for name, (schema, instance) in WORKLOAD.items():
        tokens = encode(instance)[: args.tokens]
        grammar, llg_first = timed(lambda s=schema: llguidance_first_mask(llt, s))
        index, outl_first = timed(lambda s=schema: outlines_first_mask(vocab, s, words))
        variants: dict[str, Callable[[], Step]] = {
            "seq": lambda g=grammar: llguidance_batch(llt, g, args.batch, par=False),
            "par": lambda g=grammar: llguidance_batch(llt, g, args.batch, par=True),
            "outl": lambda i=index: outlines_batch(i, words, args.batch),
        }
        runs: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.runs):
            for key, start in variants.items():
                runs[key].append(replay(start(), tokens) / len(tokens) * 1e6)
        seq, par, outl = (statistics.median(runs[k]) for k in ("seq", "par", "outl"))
        cells = "".join(f"{f'{us:.0f} ({us / args.batch:.1f})':>13}" for us in (seq, par, outl))
        print(
            f"{name:<10}{len(tokens):>4} |{llg_first * 1e3:>6.1f}{outl_first * 1e3:>7.0f}"
            f"{outl_first / llg_first:>6.0f} |{cells}{outl / seq:>7.2f}{outl / par:>7.2f}"
        )
    print("o/l, o/seq, o/par: outlines_core / llguidance (first mask, sequential, parallel fill)")

    print("\ncoverage (compiles, accepts a valid instance, rejects an invalid one):")
    print(f"{'feature':<22}{'llguidance':<18}outlines_core (index build s)")
    errors = []
    for feature, schema, good, bad in COVERAGE:
        g, b = encode(good), encode(bad)
        llg = llguidance_verdict(llt, schema, g, b)
        outl, outl_s = timed(lambda s=schema, g=g, b=b: outlines_verdict(vocab, s, g, b))
        cells = []
        for lib, cell in (("llguidance", llg), ("outlines_core", outl)):
            if cell.startswith("error: "):
                errors.append(f"[{len(errors) + 1}] {lib}, {feature}: {cell[7:]}")
                cell = f"error [{len(errors)}]"
            cells.append(cell)
        print(f"{feature:<22}{cells[0]:<18}{cells[1]} ({outl_s:.2f})")
    print("\n".join(errors))


if __name__ == "__main__":
    main()
