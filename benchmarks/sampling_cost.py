"""The engine's per-round work around the two models at temperature > 0: sampling and verification.

Budget: at most 2 ms per draft position with a 150k-token vocabulary. One round with k
drafts does, outside the models:
  draft side   k x (probabilities(row) + sample)                 -> q [k, V]
  target side  probabilities([k+1, V]) + verify_exact(d, q, p)   -> accepted prefix + recovered/bonus
This script times exactly those calls (the engine's own functions) and divides by k.

    python benchmarks/sampling_cost.py                      # synthetic Zipf-shaped logits, V = 151,936
    python benchmarks/sampling_cost.py --model QWEN.gguf    # logits from a real model's forward pass
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from localspec.decoding.verify import verify_exact
from localspec.sampling import SamplingParams, probabilities, sample

V = 151_936
SETTINGS = {
    "temp 0.8": SamplingParams(temperature=0.8),
    "temp 0.8 top-p 0.95": SamplingParams(temperature=0.8, top_p=0.95),
    "temp 0.8 top-k 40": SamplingParams(temperature=0.8, top_k=40),
    "temp 0.7 top-p 0.9 min-p 0.05": SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05),
    "temp 1.0 top-k 50 top-p 0.9": SamplingParams(temperature=1.0, top_k=50, top_p=0.9),
}


def synthetic_logits(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Zipf-like rows (a few likely tokens, a long tail), in random token order: [rows, V] float32."""
    ranks = np.arange(1, V + 1, dtype=np.float64)
    base = -1.6 * np.log(ranks) * 2.0
    out = np.empty((rows, V), dtype=np.float32)
    for r in range(rows):
        out[r] = (base + rng.normal(0, 0.5, V))[rng.permutation(V)]
    return out


def model_logits(path: str, rows: int, threads: int | None) -> np.ndarray:
    from localspec.backends.llama import backend

    m = backend.load(path, n_ctx=2048, threads=threads, n_gpu_layers=-1)
    try:
        text = (
            'def merge_sorted(a, b):\n    """Merge two sorted lists into one sorted list."""\n    out = []\n'
            "    i = j = 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
            "            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n"
        )
        toks = m.tokenize(text * 3, add_special=True, parse_special=False)
        logits = m.forward(toks, all_logits=True).copy()
    finally:
        m.close()
    idx = np.linspace(8, len(logits) - 1, rows).astype(int)
    return logits[idx]


def time_round(
    draft_logits: np.ndarray, target_logits: np.ndarray, params: SamplingParams, rng: np.random.Generator
) -> tuple[float, float]:
    """(draft-side seconds, target-side seconds) for one round of k = len(draft_logits) drafts."""
    k = draft_logits.shape[0]
    t0 = time.perf_counter()
    rows, toks = [], []
    for i in range(k):
        q = probabilities(draft_logits[i], params)
        toks.append(sample(q, rng))
        rows.append(q)
    q = np.stack(rows)  # [k, V]
    t1 = time.perf_counter()
    p = probabilities(target_logits, params)  # [k+1, V]
    verify_exact(toks, q, p, rng)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="take logits from this GGUF (the draft side uses perturbed copies)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("-k", type=int, default=4, help="draft positions per round (default: 4)")
    ap.add_argument("--rounds", type=int, default=40, help="timed rounds per setting (default: 40)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    k = args.k
    pool = model_logits(args.model, 32, args.threads) if args.model else synthetic_logits(rng, 32)
    source = f"logits of {args.model}" if args.model else "synthetic Zipf logits"
    print(f"vocabulary {pool.shape[1]:,}, k={k}, {args.rounds} rounds per setting, {source}; budget 2.00 ms/position")
    print(f"{'setting':<32} {'draft ms/pos':>12} {'target ms/pos':>13} {'total ms/pos':>12}  verdict")
    worst = 0.0
    for name, params in SETTINGS.items():
        d_s, t_s = [], []
        for r in range(args.rounds + 3):
            pick = rng.choice(len(pool), k + 1, replace=False)
            target = pool[pick]  # [k+1, V]
            draft = target[:k] + rng.normal(0, 0.5, (k, pool.shape[1])).astype(np.float32)  # a similar draft
            ds, ts = time_round(draft, target, params, rng)
            if r >= 3:  # warm-up rounds are not counted
                d_s.append(ds)
                t_s.append(ts)
        d, t = statistics.median(d_s) / k * 1e3, statistics.median(t_s) / k * 1e3
        worst = max(worst, d + t)
        print(f"{name:<32} {d:>12.3f} {t:>13.3f} {d + t:>12.3f}  {'ok' if d + t <= 2.0 else 'OVER BUDGET'}")
    print(f"worst: {worst:.3f} ms per draft position ({'within' if worst <= 2.0 else 'over'} the 2 ms budget)")


if __name__ == "__main__":
    main()
