"""Messages between the front and the worker.

Every message is a frozen, tagged `msgspec.Struct`, encoded as msgpack; every message
about a request carries its id, so the worker interleaves many requests (continuous
batching). Decoding a union of tagged structs gives one type per message: no `isinstance`
ladders over loosely shaped dicts. The token path is one `Step` per decode step, carrying
every member's new token: never a message per token.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec


class _Msg(msgspec.Struct, tag=True, tag_field="msg", frozen=True, array_like=True):
    pass


class _Part(msgspec.Struct, frozen=True, array_like=True):
    pass


# front -> worker


class Generate(_Msg):
    """Run one generation. `seq` is the server-wide request number, `attempt` counts replays:
    both exist for fault injection triggers (SPEC §6), the backend ignores them."""

    id: int
    seq: int
    attempt: int
    max_tokens: int | None
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = {}
    stop: list[str] = []
    seed: int | None = None
    logprobs: int = -1  # -1: none; else the chosen token's and this many top entries
    grammar: str | None = None  # an llguidance grammar the answer must match
    tools: list[dict[str, Any]] | None = None  # for the chat template
    calls: str = ""  # tool calls: "" none, "auto" the model's format, "list" or "named" forced
    call_name: str = ""  # the function a "named" answer's arguments are for
    parallel_calls: bool = True  # False: the answer's first tool call only (toolcalls.py)
    images: list[bytes] = []  # encoded, validated and downscaled by the front, in part order
    resume: list[int] = []  # after a fault: the answer's tokens the client already has
    ignore_eos: bool = False  # end tokens suppressed: exactly max_tokens tokens (the canary)
    # A thinking model's `enable_thinking` for the template: None on (mlx-lm's rule), else as
    # said. Only a chat answer with no grammar is split into thinking and answer (`Token`).
    thinking: bool | None = None
    armed: list[int] = []  # fault-injection specs with a period that fire on this request
    # The worker's own request (the canary, a warm-up): computed afresh, never cached on disk.
    internal: bool = False
    prediction: str = ""  # the answer as the client expects it to be: drafts (speculation.py)

    @property
    def penalised(self) -> bool:
        """A presence, frequency or repetition penalty applies."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )


class Embed(_Msg):
    """Embed each input, a text or token ids, in one vector (a model of kind `embedding`).
    `dimensions`: the vectors cut to that many, then made unit length again (Matryoshka);
    `seq`, `attempt` and `armed` as `Generate`'s, for fault injection."""

    id: int
    seq: int
    attempt: int
    inputs: list[str | list[int]]
    dimensions: int | None = None
    armed: list[int] = []


class Cancel(_Msg):
    """The client went away: stop generating for it."""

    id: int


class Shutdown(_Msg):
    """Finish nothing more; exit."""


class Load(_Msg):
    """A warm spare is promoted: load the model now."""


# worker -> front


class Calibration(_Part):
    """What a model's first worker measured on this device (the batch-width knee within
    memory, the prefill speed and chunk the chunks are sized by): every later worker of the
    model (a replacement, a spare) reuses it instead of measuring again, and warms only the
    shapes (SPEC §3: a new worker in seconds)."""

    max_batch: int
    prefill_tps: float
    chunk: int


class Room(_Part):
    """Where a second copy of the model is tightest: for a group of ranks, the host whose
    ranks' parts take the largest share of its memory (ranks/room.py); a spare group must
    fit there."""

    copy_bytes: int  # what one copy of the model takes there
    memory_bytes: int  # that host's device memory (its recommended working set, if any)
    where: str  # which host, as the standby's reason says it


class Ready(_Msg):
    """`max_token_chars`: the most characters one token stands for, so the front can
    refuse a prompt that cannot fit the context without tokenising it. `max_batch`: how
    many requests the worker decodes together (1 for a model it cannot batch)."""

    pid: int
    context_length: int
    max_token_chars: int
    max_batch: int
    load_seconds: float
    model_bytes: int = 0  # the device memory the loaded model takes
    memory_bytes: int = 0  # the device's memory (the machine's, where it has none apart)
    working_set_bytes: int = 0  # the device's recommended working set (Metal), 0 if none
    thinking: bool = False  # the tokenizer marks thinking (mlx-lm's detection: `<think>`, ...)
    dimensions: int = 0  # an embedding model's vector length (0: a generating model)
    calibration: Calibration | None = None  # measured here, or the one it was given
    calibrating: bool = False  # none yet: measured between requests, then `Calibrated`
    phases: dict[str, float] = {}  # seconds of each bring-up phase: imports, device, load, warmup
    device: str = ""  # where the model runs: "gpu" or "cpu" ("": not said, an older worker)
    room: Room | None = None  # a group's tightest host (its handle fills it); None: this one


class Calibrated(_Msg):
    """A worker that came up without its model's calibration has measured it between
    requests (worker/calibrating.py): it serves by it now, and later workers are given it."""

    calibration: Calibration


class Warm(_Msg):
    """A warm spare: runtime imported, device initialised, waiting for `Load`."""

    pid: int


class LoadFailed(_Msg):
    """`config` is true when restarting cannot help (bad path, config, architecture)."""

    config: bool
    message: str
    traceback: str


class Heartbeat(_Msg):
    """Sent every second by a worker thread: the process is alive and its GIL is free."""


class Shaping(_Msg):
    """The worker's next step is of a shape it has not run (a verify step's number of
    positions a row, at its width): MLX builds its kernels first, which no step clock
    predicts. Sent before the step; its next `Step` ends it."""


class TopLogprob(_Part):
    token: str
    raw: bytes  # the token's bytes (OpenAI's `bytes`)
    logprob: float


class Logprob(_Part):
    """The chosen token's log-probability and the most likely alternatives, from the
    distribution the token was drawn from."""

    token: str
    raw: bytes  # the token's bytes (OpenAI's `bytes`)
    logprob: float
    top: list[TopLogprob] = []


class CallDelta(_Part):
    """Part of tool call `index`: `name` on its first part, then pieces of `arguments`."""

    index: int
    name: str | None
    arguments: str


class Token(_Msg):
    """`token` is -1 for text that is no token of its own (a stop string's held text).
    `text` is the answer's; `reasoning` the thinking text this token adds (a thinking
    model), never parsed for tool calls or stop strings. A thinking marker's token adds
    text to neither."""

    id: int
    token: int
    text: str
    logprob: Logprob | None = None
    calls: list[CallDelta] = []
    reasoning: str = ""


class Admitted(_Part):
    """A request the worker took in: `prefill` tokens to compute before its first token (its
    prompt and resumed answer, less what the prompt cache held), so the front knows how long
    its silence may honestly last. Sent before that prefill begins; never after a `Failed`
    that names the request."""

    id: int
    prefill: int


class Vectors(_Part):
    """An `Embed`'s answer: one vector per input, in order, `dimensions` little-endian
    float32 each (OpenAI's base64 bytes, as they are)."""

    dimensions: int
    data: bytes


class DiskUse(_Part):
    """The prompt cache's disk tier at an answer's end: `tokens` of its prompt it loaded
    (`missed`: it was asked and held nothing longer than memory), and the tier's own facts,
    which reach the front with each answer: its `bytes` now, and the `errors` (writes that
    failed, corrupt entries removed) since the previous answer."""

    tokens: int
    missed: bool
    bytes: int
    errors: int


class Done(_Msg):
    """`batch`: the most requests decoded beside this one (1: it ran alone), so decode
    speeds compare like with like. `cached_tokens`: prompt tokens the prompt cache held.
    An `Embed` ends with its `embedding` (its inputs' tokens are `prompt_tokens`, `ttft` the
    time to its vectors): a job that yields one result, to the supervisor like any other."""

    id: int
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    ttft: float
    decode_tps: float
    cached_tokens: int = 0
    batch: int = 1
    reasoning_tokens: int = 0  # of completion_tokens, those that were thinking (markers too)
    stop_sequence: str = ""  # the stop string that ended the answer, if one did
    # Draft tokens (a prediction's, or found by lookup) the answer kept, and those refused.
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    disk: DiskUse | None = None  # None: no disk tier (or the canary, which never uses it)
    embedding: Vectors | None = None


class Rejected(_Msg):
    """The request itself is unacceptable (e.g. too long for the context): no fault. A
    prompt too long for the context says its counts, for each dialect to word them."""

    id: int
    type: str
    message: str
    prompt_tokens: int = 0
    context_length: int = 0  # 0: not a prompt over the context
    completion_tokens: int = 0


class StepClock(_Part):
    """One engine step on the worker's own clock: what it was and how long it took, so the
    supervisor bounds a silence by what steps like the next one took (SPEC §3), never by a
    client's TTFT. `members`: rows that decoded a token in it; `prefill`: prompt tokens it
    computed; `new_shape`: the first step at this width (MLX builds kernels then);
    `seconds`: from the step's start until its outputs were on the host; `chunk`: the prefill
    chunk per prompt the next step will use."""

    members: int
    prefill: int
    seconds: float
    new_shape: bool = False
    chunk: int = 0


class Step(_Msg):
    """One step of the batch: new tokens, finished requests, and the prompts a prefill
    chunk advanced (a long prompt is progress, not a stall); `clock`: the step itself (None
    for a message that announces admissions only)."""

    tokens: list[Token] = []
    done: list[Done] = []
    prefilled: list[int] = []
    admitted: list[Admitted] = []  # sent before the prefill it announces begins
    clock: StepClock | None = None


class Failed(_Msg):
    """The backend raised while serving these requests (a batch fails whole): a fault to
    classify."""

    ids: list[int]
    message: str
    traceback: str


def prompt_text(req: Generate | Embed) -> str:
    """What fault-injection markers are looked for in."""
    if isinstance(req, Embed):
        return "\n".join(text for text in req.inputs if isinstance(text, str))
    return (req.prompt or "") if req.messages is None else json.dumps(req.messages)


ToWorker = Generate | Embed | Cancel | Shutdown | Load
FromWorker = Ready | Calibrated | Warm | LoadFailed | Heartbeat | Shaping | Step | Rejected | Failed

encode = msgspec.msgpack.Encoder().encode
decode_to_worker = msgspec.msgpack.Decoder(ToWorker).decode
decode_from_worker = msgspec.msgpack.Decoder(FromWorker).decode
