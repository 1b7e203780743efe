"""What llama.cpp's copies of a draws pass cost: the pass with the copies llama.cpp makes of a temperature + dist
chain (the softmax and the scaled logits, n_vocab floats each a row), with the softmax alone (what a model draft's
exact rule reads), and with the ids alone (plain and one-hot rounds), for 1 row (a plain sampled token) and 9 rows
(a k = 8 verify). The three alternate on one loaded model, each on a chain of its own (a rows pass takes the last
one off); each figure is the median of `passes` passes after the chain's first, and the table the median of
`reps` alternations. gpu_check runs the same measurement on a GPU.

On a CPU build the copies are host memcpys (draws are off there by default: PICK_ON_CPU forces them here); on a
GPU they cross PCIe inside the pass, where they cost more.

    python benchmarks/draw_copies.py MODEL.gguf [--threads 2] [--passes 80] [--reps 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from localspec.backends.llama import backend as lb
from localspec.backends.llama import samplers

# variant -> (samplers.KeepOnly at the chain's end, the softmax read)
VARIANTS = {"llama.cpp's copies": (False, True), "softmax only": (True, True), "ids only": (True, False)}
ROWS = (1, 9)


def measure(backend: Any, prompt: Sequence[int], *, passes: int, reps: int, temperature: float = 0.7) -> dict:
    """{rows: {variant: median ms}} for a loaded llama backend whose cache holds `prompt`."""
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    for rows in ROWS:
        runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for rep in range(reps):
            for name in list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS)):
                keep, probs = VARIANTS[name]
                batch = list(prompt[-rows:])
                _fresh_chain(backend, prompt, batch, temperature, rng, keep=keep, probs=probs)
                times = []
                for _ in range(passes):
                    backend.rollback(len(prompt))
                    t0 = time.perf_counter()
                    if backend.forward_draws(batch, temperature, rng, probs=probs) is None:
                        raise RuntimeError("this backend does not draw in its passes")
                    times.append(time.perf_counter() - t0)
                runs[name].append(statistics.median(times))
        out[str(rows)] = {name: statistics.median(r) * 1e3 for name, r in runs.items()}
    backend.rollback(len(prompt))
    return out


def _fresh_chain(
    backend: Any, prompt: Sequence[int], batch: list[int], t: float, rng: Any, *, keep: bool, probs: bool
) -> None:
    """A rows pass takes the last chain off; the first draws pass makes this variant's (untimed: it plans the graph)."""
    backend.rollback(len(prompt))
    backend.forward(batch[-1:], all_logits=False)
    backend.rollback(len(prompt))
    real = samplers.available
    samplers.available = (lambda: real()) if keep else (lambda: False)
    try:
        backend.forward_draws(batch, t, rng, probs=probs)
    finally:
        samplers.available = real


def lines(result: dict) -> list[str]:
    """The measurement as text: one line per row count, each variant's ms and its ratio to llama.cpp's copies."""
    out = []
    for rows, ms in result.items():
        base = ms["llama.cpp's copies"]
        parts = [f"{name} {v:.3f} ms ({v / base:.3f}x)" for name, v in ms.items()]
        out.append(f"{rows} row(s): " + ", ".join(parts))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=80)
    ap.add_argument("--reps", type=int, default=6)
    args = ap.parse_args()
    lb.PICK_ON_CPU = True
    backend = lb.load(args.model, n_ctx=1024, threads=args.threads)
    try:
        prompt = list(range(100, 300))
        backend.forward(prompt, all_logits=False)
        result = measure(backend, prompt, passes=args.passes, reps=args.reps)
    finally:
        backend.close()
    print(f"draws pass (T = 0.7), ms: median of {args.reps} alternations of {args.passes} passes each")
    print("\n".join(lines(result)))


if __name__ == "__main__":
    main()
