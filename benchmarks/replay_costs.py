"""A model of a busy machine's missing numbers: replay an answer through the engine on the measured cost curve.

    python benchmarks/replay_costs.py --tokenizer MODEL.gguf [--ms-per-token 35]

Not a measurement of speed: the target is a scripted fake that writes a given answer (tokenized with
the real model's tokenizer), and a fake clock charges every forward pass T(n) from the curve measured
on an idle 2-core machine with the Qwen2.5-Coder 1.5B Q4_K_M (measured: n=2 1.8x, 4 2.95x, 8 6.8x,
16 8.2x, 32 15x, 64 25x of one token, interpolated between). Drafting, acceptance and auto's choices
are the real code's. Use it where the machine is too loaded to time real runs; `localspec bench` is the
measurement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fakes import CostedBackend, FakeClock, scripted_tokens  # noqa: E402

from localspec.backends.base import chat_prompt_tokens  # noqa: E402
from localspec.bench.suites import _EDIT_SOURCE, _EDIT_SOURCE_2, suites  # noqa: E402
from localspec.decoding.auto import AutoDrafter, auto_lookup  # noqa: E402
from localspec.decoding.drafters import NgramDrafter, NoDrafter  # noqa: E402
from localspec.decoding.engine import Done, GenerationConfig, generate  # noqa: E402
from localspec.decoding.policy import CostModel  # noqa: E402
from localspec.decoding.suffix import SuffixDrafter  # noqa: E402
from localspec.sampling import SamplingParams  # noqa: E402

CURVE = {1: 1.0, 2: 1.8, 4: 2.95, 8: 6.8, 16: 8.2, 32: 15.0, 64: 25.0}

ANSWERS = {
    "code-edit #1": "```python\n"
    + _EDIT_SOURCE.replace(
        "    return ranked[:n]\n", "    ranked = [item for item in ranked if item[1] != 0]\n    return ranked[:n]\n"
    )
    + "```",
    "code-edit #2": "```python\n"
    + _EDIT_SOURCE_2.replace(
        "    def report(self):",
        "    def count(self, name):\n        return self.items.get(name, 0)\n\n    def report(self):",
    )
    + "```",
    "prose (chat #1)": "Version control keeps a history of every change, so you can see what changed, when and "
    "why, and go back when something breaks. It lets several people work on the same project without "
    "overwriting each other's work, and it makes experiments cheap: try an idea on a branch and throw it away.",
}
PROMPTS = {"code-edit #1": ("code-edit", 0), "code-edit #2": ("code-edit", 1), "prose (chat #1)": ("chat", 0)}


def cost(ms: float):  # type: ignore[no-untyped-def]
    sizes = sorted(CURVE)
    return lambda n: ms / 1000 * float(np.interp(n, sizes, [CURVE[s] for s in sizes]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="a GGUF file with the target's tokenizer")
    ap.add_argument("--ms-per-token", type=float, default=35.0)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    from localspec.backends.llama import backend as lb

    tok = lb.load(args.tokenizer, n_ctx=512, threads=1)
    all_suites = suites()
    t = cost(args.ms_per_token)
    known = CostModel(target={n: t(n) for n in range(1, 66)}, draft_token=0.65 * t(1))
    print(f"modelled: T(n) from the idle-machine curve x {args.ms_per_token} ms; {args.max_tokens} tokens; greedy")
    print(f"{'answer':<18}{'none tok/s':>11}{'ngram k=4':>11}{'suffix':>9}{'auto':>8}   auto: passes, accepted/drafted")
    try:
        for name, answer in ANSWERS.items():
            suite, i = PROMPTS[name]
            prompt = chat_prompt_tokens(tok, list(all_suites[suite].prompts[i]))
            script = prompt + tok.tokenize(answer, add_special=False)
            ids = {v: j for j, v in enumerate(dict.fromkeys(script))}  # a dense vocabulary for the fake
            dense = [ids[v] for v in script]
            out = {}
            for method in ("none", "ngram", "suffix", "auto"):
                clock = FakeClock()
                target = CostedBackend(scripted_tokens(dense, n_vocab=len(ids) + 1, fallback=len(ids)), clock, t)
                drafter = {
                    "none": NoDrafter(),
                    "ngram": NgramDrafter(),
                    "suffix": SuffixDrafter(),
                    "auto": AutoDrafter(ngram=auto_lookup(), target=target, costs=known, clock=clock),
                }[method]
                k = {"none": 0, "ngram": 4, "suffix": 32, "auto": 32}[method]
                n = min(args.max_tokens, len(dense) - len(prompt))
                cfg = GenerationConfig(max_tokens=n, num_draft=k, sampling=SamplingParams())
                *_, done = generate(target, drafter, dense[: len(prompt)], cfg, clock=clock)
                assert isinstance(done, Done) and list(done.tokens) == dense[len(prompt) : len(prompt) + n]
                out[method] = done.stats
            base = out["none"].decode_tps
            a = out["auto"]
            print(f"{name:<18}{base:>11.1f}" + "".join(f"{out[m].decode_tps / base:>{w}.2f}x" for m, w in (("ngram", 10), ("suffix", 8), ("auto", 7)))
                  + f"   {a.n_rounds}, {a.n_accepted}/{a.n_drafted}")  # fmt: skip
    finally:
        tok.close()


if __name__ == "__main__":
    main()
