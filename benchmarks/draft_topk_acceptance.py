"""What drafting from the top k of the draft model's softmax costs in acceptance: the expected acceptance of one draft
token, sum_x min(p(x), q(x)), with q the draft's whole softmax at T against q cut to its k best logits and
renormalised (what a draft drawn in its model's graph uses, drafters.DRAFT_TOP_K), at every position of a few
sampled answers, both models reading the same text. No timing: the figures are exact for these positions.

    python benchmarks/draft_topk_acceptance.py --target TARGET.gguf --draft DRAFT.gguf [--temperature 0.7]
"""

from __future__ import annotations

import argparse

import numpy as np

from localspec.backends.base import ChatMessage, chat_prompt_tokens
from localspec.backends.llama import backend as lb
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.sampling import SamplingParams

PROMPTS = (
    "Write a Python function that reverses a string.",
    "Explain what a hash map is.",
    "Write a bash loop over files in a directory.",
    "Why are unit tests worth writing?",
)
CUTS = (0, 10, 64, 256)  # 0: the whole softmax


def softmax(z: np.ndarray, t: float) -> np.ndarray:
    x = z.astype(np.float64) / t
    e = np.exp(x - x.max())
    return e / e.sum()


def acceptances(p_rows: np.ndarray, q_rows: np.ndarray, t: float) -> dict[int, list[float]]:
    """sum_x min(p, q_k) per position, for each cut k in CUTS."""
    width = min(p_rows.shape[1], q_rows.shape[1])
    out: dict[int, list[float]] = {k: [] for k in CUTS}
    for z_p, z_q in zip(p_rows[:, :width], q_rows[:, :width]):
        p, q = softmax(z_p, t), softmax(z_q, t)
        for k in CUTS:
            cut = q
            if k:
                cut = np.zeros_like(q)
                best = np.argsort(-z_q, kind="stable")[:k]
                cut[best] = q[best] / q[best].sum()
            out[k].append(float(np.minimum(p, cut).sum()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="target GGUF")
    ap.add_argument("--draft", required=True, help="draft GGUF (the same tokenizer)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--tokens", type=int, default=64, help="tokens of each sampled answer")
    args = ap.parse_args()
    target, draft = lb.load(args.target, n_ctx=1024), lb.load(args.draft, n_ctx=1024)
    totals: dict[int, list[float]] = {k: [] for k in CUTS}
    try:
        for seed, prompt in enumerate(PROMPTS):
            asked = chat_prompt_tokens(target, [ChatMessage("user", prompt)])
            config = GenerationConfig(args.tokens, sampling=SamplingParams(args.temperature, seed=seed))
            done = list(generate(target, NoDrafter(), asked, config))[-1]
            assert isinstance(done, Done)
            text = [*asked, *done.tokens]
            target.rollback(0)
            draft.rollback(0)
            p_rows = target.forward(text).copy()[len(asked) - 1 : -1]  # the rows that chose the answer's tokens
            q_rows = draft.forward(text).copy()[len(asked) - 1 : -1]
            for k, values in acceptances(p_rows, q_rows, args.temperature).items():
                totals[k] += values
    finally:
        target.close()
        draft.close()
    for k, values in totals.items():
        label = "whole softmax" if k == 0 else f"top {k}"
        print(f"{label:14s} expected acceptance {np.mean(values):.4f} over {len(values)} positions")


if __name__ == "__main__":
    main()
