"""Import llama-family GGUF files into MLX model directories that `mlx_lm.load` reads.

mlx-lm loads only its own layout (config.json, model*.safetensors, tokenizer.json), so a GGUF
is converted once and cached. MLX itself reads GGUF tensors (`mx.load`), handing Q4_0, Q4_1
and Q8_0 over as MLX affine-quantized triples (weight, scales, biases; group 32), which are
kept as they are: no dequantize/requantize round trip, and the output is bit-faithful.

GGUF stores Q and K rows permuted for llama.cpp's interleaved rope; rather than undo that,
the config says `rope_traditional: true`, which is MLX's name for the interleaved rope.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import shutil
import struct
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from .resolve import ModelError, ModelSource, cache_dir
from .tokenizer import write_tokenizer

IMPORT_VERSION = 1  # bump when the output changes, so cached imports are redone

GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip
SUPPORTED_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
GROUP_SIZE = 32  # every supported GGUF quant has 32-element blocks

GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def materialize(source: ModelSource) -> Path:
    """The MLX directory for `source`, importing a GGUF into the cache on first use.

    The cache entry is named after the file's size, mtime and IMPORT_VERSION, so an edited
    file or a changed importer gets a fresh import. No lock: import_gguf builds in a private
    temp dir and renames it into place, so racing processes at worst both do the work, the
    first rename wins, and a crash never leaves a complete-looking half directory.
    """
    if source.kind == "mlx":
        return source.path
    try:
        st = source.path.stat()
        key = f"{st.st_size}:{st.st_mtime_ns}:{IMPORT_VERSION}".encode()
        out = cache_dir() / f"{source.path.stem}-{hashlib.sha256(key).hexdigest()[:12]}"
        if not (out / "config.json").is_file():
            with contextlib.suppress(FileExistsError):  # another process finished first
                import_gguf(source.path, out)
    except OSError as e:  # unreadable file, unwritable or full cache: restarting won't help
        raise ModelError(f"cannot import {source.path} into {cache_dir()}: {e}") from e
    return out


def import_gguf(src: Path, out: Path) -> Path:
    """Convert the llama-family GGUF `src` into the MLX model directory `out`: config.json,
    model.safetensors, tokenizer.json and tokenizer_config.json. `out` must not exist or be
    an empty directory; FileExistsError (saying what to do) otherwise."""
    src, out = Path(src), Path(out)
    check_out_dir(out)
    bad = {n: t for n, t in tensor_types(src).items() if t not in SUPPORTED_TYPES}
    if bad:
        name, kind = next(iter(bad.items()))
        raise ModelError(
            f"{src}: unsupported tensor type {kind} ({name}, {len(bad)} tensors in all); "
            f"steward imports {', '.join(SUPPORTED_TYPES)}"
        )
    try:
        tensors, raw_meta = mx.load(str(src), return_metadata=True)
    except (RuntimeError, ValueError) as e:
        raise ModelError(f"{src}: MLX cannot read this GGUF: {e}") from e
    meta = {k: _plain(v) for k, v in raw_meta.items()}
    if (arch := meta.get("general.architecture")) != "llama":
        raise ModelError(f"{src}: unsupported architecture {arch!r}; steward imports llama only")
    weights = {_mlx_name(src, k): v for k, v in tensors.items()}
    config = _config(src, meta, weights)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        write_tokenizer(meta, tmp)
        for path in tmp.iterdir():  # durable before visible
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        try:
            tmp.rename(out)  # replaces an empty directory, never a filled one
        except OSError as e:
            if out.exists():
                raise FileExistsError(_occupied(out)) from e
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left after a successful rename
    return out


def check_out_dir(out: Path) -> None:
    """An import may write to a new path or into an empty directory (as `mktemp -d` makes
    it), never over something that is there: another model, or files that are not ours."""
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    if out.exists() or out.is_symlink():
        raise FileExistsError(_occupied(out))


def _occupied(out: Path) -> str:
    if out.is_symlink():
        what = "a symbolic link"
    elif out.is_dir():
        what = "a directory that is not empty"
    else:
        what = "not a directory"
    return f"{out} is {what}; choose another OUT_DIR, or remove {out} first"


def tensor_types(path: Path) -> dict[str, str]:
    """GGML type of every tensor, read from the GGUF header (mx.load does not report it, and
    silently turns BF16 into F16)."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:

            def skip(vtype: int, pos: int) -> int:
                if vtype == 8:  # string
                    return pos + 8 + struct.unpack_from("<Q", m, pos)[0]
                if vtype == 9:  # array
                    itype, count = struct.unpack_from("<IQ", m, pos)
                    pos += 12
                    if itype in sizes:
                        return pos + count * sizes[itype]
                    for _ in range(count):
                        pos = skip(itype, pos)
                    return pos
                return pos + sizes[vtype]

            magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", m, 0)
            if magic != b"GGUF" or version < 2:
                raise ModelError(f"{path}: not a GGUF v2/v3 file")
            pos = 24
            for _ in range(n_kv):
                pos = skip(8, pos)
                pos = skip(struct.unpack_from("<I", m, pos)[0], pos + 4)
            types = {}
            for _ in range(n_tensors):
                n = struct.unpack_from("<Q", m, pos)[0]
                name = m[pos + 8 : pos + 8 + n].decode()
                n_dims = struct.unpack_from("<I", m, pos + 8 + n)[0]
                pos += 8 + n + 4 + 8 * n_dims
                ggml_type = struct.unpack_from("<I", m, pos)[0]
                pos += 4 + 8  # type, data offset
                types[name] = GGML_TYPES.get(ggml_type, f"ggml type {ggml_type}")
            return types
    except (OSError, ValueError, KeyError, struct.error) as e:
        raise ModelError(f"{path}: unreadable or corrupt GGUF header: {e!r}") from e


def _plain(value: Any) -> Any:
    """GGUF metadata as plain Python (float32 scalars at their shortest decimal: 1e-05)."""
    if not isinstance(value, mx.array):
        return value
    if value.ndim:
        return value.tolist()
    if value.dtype == mx.float32:
        return float(str(np.float32(value.item())))
    return value.item()


def _mlx_name(src: Path, name: str) -> str:
    """`blk.3.attn_q.scales` -> `model.layers.3.self_attn.q_proj.scales`."""
    base, _, part = name.rpartition(".")
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in BLOCK_NAMES:
        mapped = f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}"
    elif base in GLOBAL_NAMES:
        mapped = GLOBAL_NAMES[base]
    else:
        raise ModelError(f"{src}: unsupported tensor {name!r} for a llama model")
    return f"{mapped}.{part}"


def _config(src: Path, meta: dict[str, Any], weights: dict[str, mx.array]) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"llama.{key}", default)
        if value is None or isinstance(value, list):
            raise ModelError(f"{src}: missing or per-layer metadata llama.{key}")
        return value

    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    if get("rope.dimension_count", head_dim) != head_dim:
        raise ModelError(f"{src}: partial rotary embeddings are not supported")
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "rope_traditional": True,
        "vocab_size": weights["model.embed_tokens.weight"].shape[0],
        "max_position_embeddings": get("context_length"),
        "tie_word_embeddings": "lm_head.weight" not in weights,
    }
    scaling = get("rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling != "none":
        raise ModelError(f"{src}: unsupported rope scaling {scaling!r}")
    if (bos := meta.get("tokenizer.ggml.bos_token_id")) is not None:
        config["bos_token_id"] = bos
    # Stop on every end-of-generation token llama.cpp stops on (llama 3: eos, eot and eom).
    eog = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    if eog := list(dict.fromkeys(t for t in eog if t is not None)):
        config["eos_token_id"] = eog[0] if len(eog) == 1 else eog

    bits = {}
    for name, scales in weights.items():
        if name.endswith(".scales"):
            layer = name.removesuffix(".scales")
            bits[layer] = (
                32 * weights[f"{layer}.weight"].shape[-1] // (scales.shape[-1] * GROUP_SIZE)
            )
    if bits:  # per-layer entries where a layer differs, which every mlx-lm version honours
        common = Counter(bits.values()).most_common(1)[0][0]
        config["quantization"] = {"group_size": GROUP_SIZE, "bits": common} | {
            layer: {"group_size": GROUP_SIZE, "bits": b} for layer, b in bits.items() if b != common
        }
    return config
