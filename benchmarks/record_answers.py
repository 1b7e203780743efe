"""Record a target's greedy answers to the bench suites, for offline drafting replays (replay_session.py).

    flock /tmp/bench.lock python benchmarks/record_answers.py --target MODEL.gguf --out answers.json

Each conversation runs turn by turn as `localspec bench` runs it (the history holds the earlier answers'
text); every turn's prompt and answer token ids are saved, so a replay through the real engine and
drafters with a scripted target sees exactly the texts the real model wrote.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from localspec.backends.base import ChatMessage, chat_prompt_tokens
from localspec.bench.suites import suites
from localspec.decoding.engine import Done, GenerationConfig
from localspec.options import ModelOptions
from localspec.pipeline import load_pipeline
from localspec.sampling import SamplingParams

SUITES = ("agentic", "code-edit", "code-gen", "chat")


def record(target: str, max_tokens: int, threads: int, names: list[str]) -> dict[str, list[list[dict[str, object]]]]:
    pipe = load_pipeline(ModelOptions(target=target, draft_method="none", threads=threads))
    out: dict[str, list[list[dict[str, object]]]] = {}
    try:
        all_suites = suites()
        for name in names:
            suite = all_suites[name]
            convs = []
            for msgs in suite.prompts:
                turns = msgs if suite.session else (msgs,)
                history: list[ChatMessage] = []
                rec = []
                for turn in turns:
                    history += list(turn) if isinstance(turn, tuple) else [turn]
                    prompt = chat_prompt_tokens(pipe.target, history)
                    cfg = GenerationConfig(max_tokens=max_tokens, num_draft=0, sampling=SamplingParams())
                    t0 = time.perf_counter()
                    done = next(e for e in pipe.generate(prompt, cfg, drafter=pipe.drafter) if isinstance(e, Done))
                    assert isinstance(done, Done)
                    took = time.perf_counter() - t0
                    print(f"{name}: {len(prompt)} prompt, {len(done.tokens)} answer tokens, {took:.0f} s", flush=True)
                    rec.append({"prompt": list(prompt), "answer": list(done.tokens), "text": done.text})
                    history.append(ChatMessage("assistant", done.text))
                convs.append(rec)
            out[name] = convs
    finally:
        pipe.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--suites", default=",".join(SUITES))
    args = ap.parse_args()
    data = record(args.target, args.max_tokens, args.threads, args.suites.split(","))
    Path(args.out).write_text(
        json.dumps({"target": Path(args.target).name, "max_tokens": args.max_tokens, "suites": data})
    )


if __name__ == "__main__":
    main()
