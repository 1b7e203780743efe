"""What llama.cpp's copies of a draws pass cost: the pass with the copies llama.cpp makes of a temperature + dist
chain (the softmax and the scaled logits, n_vocab floats each a row), with the softmax alone (what a model draft's
exact rule reads), and with the ids alone (plain and one-hot rounds), for 1 row (a plain sampled token) and 9 rows
(a k = 8 verify). The three run alternately on the same machine; each figure is the median of 80 passes, and
the table the median of 6 alternations.

On a CPU build the copies are host memcpys (draws are off there by default: PICK_ON_CPU forces them here); on a
GPU they cross PCIe inside the pass, where they cost more.

    python benchmarks/draw_copies.py MODEL.gguf [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from localspec.backends.llama import backend as lb
from localspec.backends.llama import samplers


def _load(path: str, threads: int, keep: bool) -> Any:
    real = samplers.available
    samplers.available = (lambda: True) if keep else (lambda: False)  # without KeepOnly: llama.cpp's own copies
    try:
        return lb.load(path, n_ctx=1024, threads=threads)
    finally:
        samplers.available = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=80)
    ap.add_argument("--reps", type=int, default=6)
    args = ap.parse_args()
    lb.PICK_ON_CPU = True
    rng = np.random.default_rng(0)
    cases = {
        "llama.cpp's copies": (_load(args.model, args.threads, False), True),
        "softmax only": (_load(args.model, args.threads, True), True),
        "ids only": (_load(args.model, args.threads, True), False),
    }
    prompt = list(range(100, 300))
    for b, probs in cases.values():
        b.forward(prompt, all_logits=False)
        b.forward_draws(prompt[:1], 0.7, rng, probs=probs)  # the chain attached before timing
    print(f"draws pass (T = 0.7), ms: median of {args.reps} alternations of {args.passes} passes each")
    for rows in (1, 9):
        runs: dict[str, list[float]] = {name: [] for name in cases}
        for rep in range(args.reps):
            for name in list(cases) if rep % 2 == 0 else list(reversed(cases)):
                b, probs = cases[name]
                times = []
                for _ in range(args.passes):
                    b.rollback(len(prompt))
                    t0 = time.perf_counter()
                    b.forward_draws(prompt[:rows], 0.7, rng, probs=probs)
                    times.append(time.perf_counter() - t0)
                runs[name].append(statistics.median(times))
        base = statistics.median(runs["llama.cpp's copies"])
        for name, r in runs.items():
            mid = statistics.median(r)
            spread = f"{min(r) * 1e3:.3f}-{max(r) * 1e3:.3f}"
            print(f"{rows} row(s)  {name:20s} {mid * 1e3:8.3f}  ({spread})  {mid / base:.3f}x")
    for b, _ in cases.values():
        b.close()


if __name__ == "__main__":
    main()
