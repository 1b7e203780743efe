"""Where a question asked again parts from its remembered answer, and how near a tie it was there.

For each of bench's chat prompts: the plain (greedy, `none`) answer is remembered in a fresh suffix memory, as
bench's `memory` case does; then auto answers the same prompt with that memory, `--reps` times. Printed per run:
the first position where the two answers differ, the near-ties recorded there (the two best logits' gap, in the
plain answer and in auto's), decode time against the plain answer's, and each drafting round (where it started,
drafted, accepted, the first rejected position, and the plain answer's near-ties in its span).

    python benchmarks/memory_parting.py --target T.gguf [--threads 2] [--reps 2] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from localspec.bench.suites import suites
from localspec.decoding.engine import Done, GenerationConfig
from localspec.decoding.stats import RoundStats
from localspec.decoding.suffix_memory import SuffixMemory
from localspec.options import ModelOptions
from localspec.pipeline import load_pipeline
from localspec.sampling import SamplingParams


def _run(pipe: Any, prompt: list[int], method: str, max_tokens: int, memory: SuffixMemory | None = None) -> Any:
    drafter = pipe.new_drafter(method, memory=memory)
    config = GenerationConfig(max_tokens=max_tokens, num_draft=32 if method != "none" else 0, sampling=SamplingParams())
    rounds: list[RoundStats] = []
    done = None
    try:
        for ev in pipe.generate(prompt, config, drafter=drafter):
            if isinstance(ev, Done):
                done = ev
            elif ev.round is not None:
                rounds.append(ev.round)
    finally:
        drafter.close()
    assert done is not None
    return done, rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    pipe = load_pipeline(ModelOptions(target=args.target, draft_method="auto", threads=args.threads))
    try:
        for messages in suites()["memory"].prompts:
            prompt = pipe.prompt_tokens(list(messages))
            plain, _ = _run(pipe, prompt, "none", args.max_tokens)
            memory = SuffixMemory(pipe.target.vocab_info, root=Path(tempfile.mkdtemp()))
            memory.remember([*prompt, *plain.tokens])
            ties = {t.position: t for t in plain.stats.near_ties}
            for rep in range(args.reps):
                again, rounds = _run(pipe, prompt, "auto", args.max_tokens, memory)
                a, b = plain.tokens, again.tokens
                part = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
                theirs = {t.position: t for t in again.stats.near_ties}
                speed = plain.stats.decode_s / again.stats.decode_s
                print(f"prompt of {len(prompt)} tokens, run {rep + 1}: parts at {part}; plain's tie there "
                      f"{_tie(ties.get(part))}, auto's {_tie(theirs.get(part))}; plain {plain.stats.decode_s:.2f} s, "
                      f"asked again {again.stats.decode_s:.2f} s: {speed:.2f}x")  # fmt: skip
                at = 1  # the first token comes from the prompt's pass
                for r in rounds:
                    if r.n_drafted:
                        fail = at + r.n_accepted if r.n_accepted < r.n_drafted else None
                        span = [p for p in sorted(ties) if at <= p < at + r.n_drafted]
                        print(f"   at {at:3d}: drafted {r.n_drafted:2d}, accepted {r.n_accepted:2d}, rejected at "
                              f"{fail}, plain's ties in its span {span} | {r.note[-60:]}")  # fmt: skip
                    at += r.n_emitted
    finally:
        pipe.close()


def _tie(t: Any) -> str:
    return "none" if t is None else f"{t.token} over {t.runner_up} by {t.gap:.3f}"


if __name__ == "__main__":
    main()
