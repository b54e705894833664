"""The agents' test model: a one-layer llama with a long context that answers a few words,
or calls a tool when asked to, whatever the CLI's prompt around it.

Its answer to a chat is one of two chains of tokens, each token's next set by the lm_head
(as in `tests.tinymodel.build_scripted_model`): CALL (a tool call in LFM2's pythonic format,
`<|tool_call_start|>[Bash(command="cat note.txt")]<|tool_call_end|>`) when the user's turn
holds the ASK token and no tool result is in the context yet, else ANSWER; then the end
token. Which chain follows the generation prompt's last token depends on the context through
the layer's two attention heads: each one's query is constant (residual dimension 0, 1 for
every token), its key is large only at its marker (ASK in a user's turn; RESULT, which the
chat template writes at the start of every tool result), and its value writes the marker's
presence into a residual dimension the lm_head reads. A huge `rope_theta` keeps positions
out of the keys (they live in the slowest-turning RoPE pair), so a marker 100 thousand tokens
back counts as one just before. The margins between the chosen token's logit and any other's
are over 60, so sampling at temperature 1 follows the chains too.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from tests.tinymodel import Llama, add_tokens, distinct, save, tool_template, trigger

ASK = "<|use_tool|>"  # in a user's turn: call the tool
RESULT = "<|tool_result|>"  # written by the template before each tool result
TOOL_START, TOOL_END = "<|tool_call_start|>", "<|tool_call_end|>"
ANSWER = " All done"
CALLS = {  # a harmless call of each CLI's shell tool: it reads the file the test wrote
    "claude": '[Bash(command="cat note.txt")]',
    "codex": '[exec_command(cmd="cat note.txt")]',
    "opencode": '[bash(command="cat note.txt")]',
}
LONG_CONTEXT = 131_072

# Residual dimensions: 0 is 1 for every token; ASK_SEEN and RESULT_SEEN are written by the
# heads; the markers' own directions are what the heads' keys read; chains start at CHAINS.
ASK_SEEN, RESULT_SEEN, ASK_DIR, RESULT_DIR, CHAINS = 1, 2, 3, 4, 5
HEAD_DIM = 32
SLOW = HEAD_DIM // 2 - 1  # the head dimension RoPE turns slowest (rotate-half pairs)
# Logit weights: a chain's next token, the call's first token when asked, the answer's
# first token, the filler (what any token off the chains is followed by).
NEXT, CALL_FIRST, ANSWER_FIRST, FILLER = 100.0, 40.0, 20.0, 4.0
KEY = 2.83  # query and key weights: a marker's score is about 45 above any other token's


def build_agent_model(
    out: Path, tokenizer_dir: Path, call: str, *, context: int = LONG_CONTEXT
) -> Path:
    """Write the model to `out` with `tokenizer_dir`'s tokenizer; `call` is the text between
    the tool-call markers (see CALLS), `context` its max_position_embeddings."""
    from transformers import AutoTokenizer

    template = tool_template(RESULT)
    vocab = add_tokens(out, tokenizer_dir, (TOOL_START, TOOL_END, ASK, RESULT), template)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ids = tokenizer.convert_tokens_to_ids
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    first = trigger(tokenizer)
    called = encode(TOOL_START + call + TOOL_END)
    answered = encode(ANSWER)
    eos, (filler,) = tokenizer.eos_token_id, encode("~")
    distinct(tokenizer, [first, *called, *answered], eos, filler, ids(ASK), ids(RESULT))
    hidden = 64
    if CHAINS + 1 + len(called) + len(answered) > hidden:
        raise ValueError(f"{call!r} is too long for a model {hidden} wide")

    shape = Llama(vocab, hidden, 1, 2, 2, 2 * hidden, context, tied=False, rope_theta=1e9)
    weights = shape.layer(0, shape.write_config(out), silent=True)
    embed = np.zeros((vocab, hidden), np.float32)
    embed[:, 0] = 1
    head = np.zeros((vocab, hidden), np.float32)
    head[filler, 0] = FILLER
    embed[first, CHAINS] = 1  # the trigger: its next token is the call's or the answer's
    dims = iter(range(CHAINS + 1, hidden))
    for chain in (called, answered):
        for token, follower in zip(chain, [*chain[1:], eos], strict=True):
            embed[token, dim := next(dims)] = 1
            head[follower, dim] = NEXT
    head[called[0], ASK_SEEN], head[called[0], RESULT_SEEN] = CALL_FIRST, -CALL_FIRST
    head[answered[0], CHAINS] = ANSWER_FIRST

    q, k, v, o = (np.zeros((hidden, hidden), np.float32) for _ in range(4))
    unit = 1 / np.sqrt(2 / hidden)  # a marker's entry after RMSNorm (two ones in the row)
    for h, (marker, seen, own) in enumerate(
        [(ASK, ASK_SEEN, ASK_DIR), (RESULT, RESULT_SEEN, RESULT_DIR)]
    ):
        embed[ids(marker), own] = 1
        q[h * HEAD_DIM + SLOW, 0] = KEY
        k[h * HEAD_DIM + SLOW, own] = KEY
        v[h * HEAD_DIM, own] = 1 / unit  # the head's output: 1 where it found its marker
        o[seen, h * HEAD_DIM] = 1
    attention = {"q_proj": q, "k_proj": k, "v_proj": v, "o_proj": o}
    weights |= {f"model.layers.0.self_attn.{name}.weight": w for name, w in attention.items()}
    weights |= {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": shape.ones,
        "lm_head.weight": head,
    }
    save(out, weights)
    return out


def with_context(model: Path, out: Path, context: int) -> Path:
    """`model` with another context, built once: its files linked into `out`, its config's
    max_position_embeddings changed (no RoPE scaling reads it: the answers are the same)."""
    out.mkdir(parents=True)
    for path in model.iterdir():
        if path.name != "config.json":
            (out / path.name).symlink_to(path.resolve())
    config = json.loads((model / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"max_position_embeddings": context}))
    return out
