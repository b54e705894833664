"""GGUF import through real MLX: the default model answers, and tiny llamas written in every
supported tensor type compute the same logits as a reference built from their dequantized
weights in Hugging Face layout (which also proves the Q/K permutation + traditional rope)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
import sentencepiece as spm
from gguf import GGMLQuantizationType as T
from mlx_lm.models.llama import Model, ModelArgs
from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tokenizers import Tokenizer

from steward.model.gguf import import_gguf, materialize, tensor_types
from steward.model.resolve import ModelError, resolve_model
from steward.model.tokenizer import write_tokenizer

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128


@pytest.fixture(scope="module")
def smol(default_model_dir: Path) -> tuple:
    return mlx_lm.load(str(default_model_dir))


@pytest.fixture(scope="module")
def smol_meta() -> dict:
    """The SmolLM2 tokenizer metadata, reused by the tiny GGUFs."""
    _, meta = mx.load(str(resolve_model(None).path), return_metadata=True)
    plain = {k: v.tolist() if isinstance(v, mx.array) else v for k, v in meta.items()}
    return {k: v for k, v in plain.items() if k.startswith("tokenizer.")}


def test_default_model_answers(default_model_dir: Path, smol: tuple) -> None:
    model, tokenizer = smol
    config = json.loads((default_model_dir / "config.json").read_text())
    assert config["rope_traditional"] and config["tie_word_embeddings"]
    assert config["quantization"]["bits"] == 4
    assert config["quantization"]["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    assert tokenizer.eos_token_ids == {2} and tokenizer.eos_token == "<|im_end|>"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    assert "Paris" in mlx_lm.generate(model, tokenizer, prompt, max_tokens=8)


def test_materialize_reuses_the_cached_import(default_model_dir: Path) -> None:
    before = (default_model_dir / "model.safetensors").stat().st_mtime_ns
    assert materialize(resolve_model(None)) == default_model_dir
    assert (default_model_dir / "model.safetensors").stat().st_mtime_ns == before
    assert [p.name for p in default_model_dir.parent.glob(".*")] == []  # no temp dirs left


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("Hello world", ["Hello", " world"]),
        ("12345", ["1", "2", "3", "4", "5"]),  # smollm pre-tokenizer: digits one by one
        ("  two spaces", None),
        ("héllo 世界\n", None),
        ("<|im_start|>user\nhi<|im_end|>", ["<|im_start|>", "user", "\n", "hi", "<|im_end|>"]),
    ],
)
def test_tokenizer_round_trips(smol: tuple, text: str, pieces: list[str] | None) -> None:
    tokenizer = smol[1]
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    if pieces:
        assert [tokenizer.decode([i]) for i in ids] == pieces
    detokenizer = tokenizer.detokenizer  # the streaming path the server uses
    detokenizer.reset()
    for i in ids:
        detokenizer.add_token(i)
    detokenizer.finalize()
    assert detokenizer.text == text.removeprefix(" ")  # mlx-lm trims one leading space


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("smollm", ["Hi", "Ġ", "1", "2", "3", "4", "5", "!"]),
        ("gpt2", ["Hi", "Ġ12345", "!"]),
        ("llama-bpe", ["Hi", "Ġ", "123", "45", "!"]),
    ],
)
def test_pre_tokenizer_follows_llama_cpp(tmp_path: Path, smol_meta: dict, pre, pieces) -> None:
    write_tokenizer({**smol_meta, "tokenizer.ggml.pre": pre}, tmp_path)
    split = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).pre_tokenizer.pre_tokenize_str
    assert [piece for piece, _ in split("Hi 12345!")] == pieces


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face Q/K rows to GGUF's interleaved-rope order (llama.cpp's convert script)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(
    path: Path, qtype: T, meta: dict, *, tied: bool = True, arch: str = "llama"
) -> dict[str, mx.array]:
    """A random llama GGUF with `qtype` matrices; returns the reference weights (dequantized,
    Hugging Face names and Q/K order)."""
    rng = np.random.default_rng(1)
    vocab = len(meta["tokenizer.ggml.tokens"])
    head_dim = HIDDEN // HEADS

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))

    tensors = {"token_embd": ("model.embed_tokens", normal(vocab, HIDDEN))}
    tensors["output_norm"] = ("model.norm", 1 + normal(HIDDEN) / 4)
    if not tied:
        tensors["output"] = ("lm_head", normal(vocab, HIDDEN))
    for i in range(LAYERS):
        hf = f"model.layers.{i}"
        tensors |= {
            f"blk.{i}.attn_q": (f"{hf}.self_attn.q_proj", normal(HEADS * head_dim, HIDDEN)),
            f"blk.{i}.attn_k": (f"{hf}.self_attn.k_proj", normal(KV_HEADS * head_dim, HIDDEN)),
            f"blk.{i}.attn_v": (f"{hf}.self_attn.v_proj", normal(KV_HEADS * head_dim, HIDDEN)),
            f"blk.{i}.attn_output": (f"{hf}.self_attn.o_proj", normal(HIDDEN, HIDDEN)),
            f"blk.{i}.ffn_gate": (f"{hf}.mlp.gate_proj", normal(FFN, HIDDEN)),
            f"blk.{i}.ffn_up": (f"{hf}.mlp.up_proj", normal(FFN, HIDDEN)),
            f"blk.{i}.ffn_down": (f"{hf}.mlp.down_proj", normal(HIDDEN, FFN)),
            f"blk.{i}.attn_norm": (f"{hf}.input_layernorm", 1 + normal(HIDDEN) / 4),
            f"blk.{i}.ffn_norm": (f"{hf}.post_attention_layernorm", 1 + normal(HIDDEN) / 4),
        }

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_merges(meta["tokenizer.ggml.merges"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(meta["tokenizer.chat_template"])
    reference = {}
    for name, (hf, w) in tensors.items():
        if name.endswith(("attn_q", "attn_k")):
            w = permute(w, HEADS if name.endswith("attn_q") else KV_HEADS)
        if w.ndim == 1 or qtype == T.F32:  # llama.cpp keeps norms in F32
            data, raw, stored = w, None, w
        elif qtype == T.F16:
            data = w.astype(np.float16)
            raw, stored = None, data.astype(np.float32)
        else:
            data, raw = gguf.quants.quantize(w, qtype), qtype
            stored = gguf.quants.dequantize(data, qtype)
        writer.add_tensor(f"{name}.weight", data, raw_dtype=raw)
        if name.endswith(("attn_q", "attn_k")):
            stored = unpermute(stored, HEADS if name.endswith("attn_q") else KV_HEADS)
        reference[f"{hf}.weight"] = mx.array(stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return reference


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.Q8_0, T.Q4_0, T.Q4_1], ids=lambda t: t.name)
def test_tiny_gguf_matches_dequantized_reference(tmp_path: Path, smol_meta: dict, qtype) -> None:
    tied = qtype not in (T.F32, T.Q4_0)
    reference = write_tiny_gguf(tmp_path / "tiny.gguf", qtype, smol_meta, tied=tied)
    assert set(tensor_types(tmp_path / "tiny.gguf").values()) == {"F32", qtype.name}
    model, tokenizer = mlx_lm.load(str(import_gguf(tmp_path / "tiny.gguf", tmp_path / "out")))
    args = ModelArgs.from_dict(json.loads((tmp_path / "out" / "config.json").read_text()))
    args.rope_traditional = False  # Hugging Face layout: the reference un-permuted Q/K
    ref = Model(args)
    ref.load_weights(list(reference.items()))

    ids = mx.array([tokenizer.encode("The capital of France is Paris, 12345!")])
    got, want = model(ids), ref(ids)
    assert got.dtype == mx.float32 and bool(mx.isfinite(got).all())
    # Only float noise (quantized embeddings come out in float16); a Q/K layout or rope
    # mismatch would be off by O(1).
    assert mx.abs(got - want).max().item() < 1e-2 * mx.abs(want).max().item()


@pytest.mark.parametrize(
    ("qtype", "arch"),
    [(T.Q5_0, "llama"), (T.BF16, "llama"), (T.F32, "gpt2")],
    ids=["Q5_0", "BF16", "gpt2-arch"],
)
def test_unsupported_gguf_is_a_model_error(tmp_path: Path, qtype, arch: str) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), arch)
    w = np.ones((4, 64), dtype=np.float32)
    data = w if qtype == T.F32 else gguf.quants.quantize(w, qtype)
    writer.add_tensor("token_embd.weight", data, raw_dtype=None if qtype == T.F32 else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match=qtype.name if arch == "llama" else "architecture"):
        import_gguf(tmp_path / "x.gguf", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf"]


def test_import_fills_an_empty_directory(tmp_path: Path, smol_meta: dict) -> None:
    """An OUT_DIR made beforehand (`mktemp -d`) is fine while it is empty."""
    write_tiny_gguf(tmp_path / "tiny.gguf", T.Q8_0, smol_meta)
    (tmp_path / "out").mkdir()
    assert import_gguf(tmp_path / "tiny.gguf", tmp_path / "out") == tmp_path / "out"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny.gguf"]  # no temp dir


@pytest.mark.parametrize("occupant", ["file in dir", "plain file", "symlink"])
def test_import_leaves_what_is_there_alone(tmp_path: Path, smol_meta: dict, occupant: str) -> None:
    """A directory with files in it, a file or a link is refused, untouched, with a message
    that says how to go on."""
    write_tiny_gguf(tmp_path / "tiny.gguf", T.F32, smol_meta)
    out = tmp_path / "out"
    if occupant == "file in dir":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif occupant == "plain file":
        out.write_text("mine")
    else:
        (tmp_path / "empty").mkdir()
        out.symlink_to(tmp_path / "empty")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(FileExistsError, match=r"choose another OUT_DIR, or remove .*out first"):
        import_gguf(tmp_path / "tiny.gguf", out)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    if occupant != "symlink":
        assert (out / "notes.txt" if out.is_dir() else out).read_text() == "mine"


def test_racing_materializers_share_one_complete_dir(tmp_path: Path, smol_meta: dict) -> None:
    """Two processes racing on one GGUF both get the same complete dir, and no temp dir stays."""
    write_tiny_gguf(tmp_path / "race.gguf", T.Q8_0, smol_meta)
    code = (
        "import sys; from steward.model.gguf import materialize; "
        "from steward.model.resolve import resolve_model; "
        "print(materialize(resolve_model(sys.argv[1])))"
    )
    env = {**os.environ, "STEWARD_CACHE_DIR": str(tmp_path / "cache")}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "race.gguf")],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = {racer.communicate(timeout=120)[0].strip() for racer in racers}
    assert len(outs) == 1 and all(r.returncode == 0 for r in racers)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [Path(outs.pop()).name]
    with pytest.raises(FileExistsError):
        import_gguf(tmp_path / "race.gguf", next((tmp_path / "cache").iterdir()))


def test_sentencepiece_tokenizer_matches_sentencepiece(tmp_path: Path) -> None:
    """`tokenizer.ggml.model == "llama"`: rebuilt from pieces and scores, it encodes like the
    SentencePiece model it came from (llama settings: identity normalization, byte fallback)."""
    corpus = ["The quick brown fox jumps over the lazy dog.", "Héllo wörld, 12345 and 67890!"]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus * 20),
        model_writer=proto,
        vocab_size=350,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    ids = range(sp.get_piece_size())
    kinds = [(sp.is_control, 3), (sp.is_unknown, 2), (sp.is_byte, 6)]  # else 1: normal
    types = [next((t for is_kind, t in kinds if is_kind(i)), 1) for i in ids]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in ids],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in ids],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
    }
    write_tokenizer(meta, tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert isinstance(tokenizer.detokenizer, SPMStreamingDetokenizer)
    for text in ["The quick brown fox", "  two spaces", "12345", "héllo 世界", "a.\nNew line"]:
        ids = tokenizer.encode(text)
        assert ids == [sp.bos_id(), *sp.encode(text)]
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
