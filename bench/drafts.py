"""What the drafter proposes, on answers recorded once: steps, tokens a verify step, kept.

A request's greedy answer does not depend on speculation (tests/worker/test_speculation.py),
so the drafts' worth can be counted apart from any device: the model answers each workload
of bench/speculation.py once (greedy, mlx-lm's own loop), then the answer is replayed
through a `Drafter` as the single-sequence loop feeds it (on a GPU's shapes, no draft model),
with lookup alone and with the file as the prediction. Printed per workload and mode: the
steps the answer takes, the verify steps among them, the tokens a verify step gives, and
the drafts kept of those offered. What a step costs is the device's (bench.verify_step).

    python -m bench.drafts [--model DIR] [--tokens 600] [--record FILE | --replay FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.speculation import EDIT, STORY, source
from steward.worker.speculation import Drafter, room, shaped


def record(model: Path, tokens: int) -> dict[str, dict[str, list[int]]]:
    """Each workload's prompt, greedy answer and prediction, as token ids."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    net, tokenizer = load(str(model))
    workloads = {"story": (STORY, "")}
    for variant in (0, 3):
        file, function = source(12, variant)
        text = EDIT.format(file=file, function=function, old="scale", new="factor")
        workloads[f"edit {variant}"] = (text, f"```python\n{file}```")
    recorded = {}
    for name, (text, prediction) in workloads.items():
        chat = [{"role": "user", "content": text}]
        prompt = list(tokenizer.apply_chat_template(chat, add_generation_prompt=True))
        answer = []
        steps = generate_step(mx.array(prompt), net, max_tokens=tokens)
        for (token, _), _ in zip(steps, range(tokens), strict=False):
            if int(token) in tokenizer.eos_token_ids:
                break
            answer.append(int(token))
        predicted = tokenizer.encode(prediction, add_special_tokens=False) if prediction else []
        recorded[name] = {"prompt": prompt, "answer": answer, "prediction": predicted}
        print(f"recorded {name}: {len(prompt)} prompt tokens, {len(answer)} answered", flush=True)
    return recorded


def replay(prompt: list[int], answer: list[int], prediction: list[int]) -> str:
    """The answer fed through a drafter a step at a time, as solo.py feeds it."""
    drafter = Drafter(prompt, prediction, resumed=False)
    at = steps = verifies = 0
    while at < len(answer):
        left = len(answer) - at - 1
        drafts = drafter.propose(min(room(1, gpu=True), left)) if left else []
        drafts = shaped({0: drafts})[0] if drafts else []
        kept = 0
        while kept < len(drafts) and answer[at + 1 + kept] == drafts[kept]:
            kept += 1
        for token in answer[at : at + 1 + kept]:
            drafter.extend(token)
        if drafts:
            drafter.observe(len(drafts), kept)
            verifies += 1
        steps += 1
        at += 1 + kept
    offered = drafter.accepted + drafter.rejected
    given = len(answer) - (steps - verifies)  # the tokens verify steps gave
    return (
        f"{steps:5} steps {verifies:5} verify  {given / max(verifies, 1):5.2f} tokens a verify"
        f"  kept {drafter.accepted}/{offered}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--record", type=Path, help="keep the answers recorded here")
    parser.add_argument("--replay", type=Path, help="answers recorded before, not the model's")
    args = parser.parse_args()
    if args.replay:
        recorded = json.loads(args.replay.read_text())
    else:
        from bench.overhead import bench_model

        recorded = record(bench_model(args.model), args.tokens)
        if args.record:
            args.record.write_text(json.dumps(recorded))
    for name, one in recorded.items():
        modes = {"lookup": []} | ({"prediction": one["prediction"]} if one["prediction"] else {})
        for mode, prediction in modes.items():
            print(f"{name:7} {mode:10} {replay(one['prompt'], one['answer'], prediction)}")


if __name__ == "__main__":
    main()
