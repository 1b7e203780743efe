"""What a greedy round's picks cost on MLX: each row's best two tokens picked by MLX (the backend's forward_top2,
backends/mlx/backend.py _top_two) against the rows handed to numpy (np.asarray, then the engine's arg-max and
near-ties pass), on MLX's default device. This decides mlx backend.PICK_ON_CPU.

  block   an evaluated [n, 151,936] float32 array (Qwen's vocabulary), as a verify pass leaves it: the picks alone
  model   with --model DIR, a real verify pass of n tokens through forward and forward_top2, alternating

Measured on mlx[cpu] 0.32.4 (Linux, 2 shared cores; --model-reps 6 on the converted qwen-0.5b-f32), median ms:
  block   n=1: host 0.047, MLX 0.32;  n=5: host 0.20, MLX 1.55;  n=9: host 0.37, MLX 2.91
  model   n=1: rows 428.8, picks 429.1;  n=5: rows 2066.4, picks 2074.7;  n=9: rows 3761.6, picks 3769.8
so on the CPU the picks do not pay (off by default); on an Apple GPU they spare copying the rows off the device.

    python benchmarks/mlx_top2_cost.py [--rows 1 5 9] [--reps 200] [--model DIR] [--model-reps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from localspec.sampling import greedy_rows

VOCAB = 151_936
GAP = 0.1  # the engine's NEAR_TIE_GAP


def host_picks(rows: Any) -> None:
    """The engine's rows path: the host's view of the rows, each row's arg-max and its near-tie's masked max."""
    r = np.asarray(rows)
    greedy_rows(r, np.argmax(r, axis=1).tolist(), GAP)


def device_picks(rows: Any) -> None:
    import mlx.core as mx

    from localspec.backends.mlx.backend import _top_two

    ids, logits = _top_two(rows)
    mx.eval(ids, logits)
    np.asarray(ids), np.asarray(logits)


def time_block(n: int, reps: int) -> dict[str, float]:
    """Median ms of each way over a fresh evaluated [n, VOCAB] array a time (a pass makes a new buffer)."""
    import mlx.core as mx

    base = mx.array(np.random.default_rng(0).standard_normal((n, VOCAB)).astype(np.float32))
    out: dict[str, list[float]] = {"host": [], "mlx": []}
    for _ in range(reps):
        for name, pick in (("host", host_picks), ("mlx", device_picks)):
            rows = base + 0.0
            mx.eval(rows)
            start = time.perf_counter()
            pick(rows)
            out[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(ts) for name, ts in out.items()}


def time_model(path: str, n: int, reps: int) -> dict[str, float]:
    """Median ms of a verify pass of n tokens read as rows (forward + host picks) and as picks (forward_top2)."""
    from localspec.backends.mlx import backend as mb

    mb.PICK_ON_CPU = True  # time the picks wherever this runs
    b = mb.load(path, n_ctx=2048)
    prompt = b.tokenize("<|im_start|>user\nWrite a Python function is_prime(n).<|im_end|>\n<|im_start|>assistant\n")
    b.forward(prompt, all_logits=False)
    keep, batch = len(b.cached_tokens), prompt[-n:]
    ways: dict[str, Callable[[], Any]] = {
        "rows": lambda: host_picks(b.forward(batch)),
        "picks": lambda: b.forward_top2(batch).near_ties(n, GAP),  # type: ignore[union-attr]
    }
    out: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(reps + 1):  # the first of each: warm-up
        for name in sorted(ways, reverse=bool(i % 2)):  # alternating, so drift hits both alike
            start = time.perf_counter()
            ways[name]()
            if i:
                out[name].append((time.perf_counter() - start) * 1e3)
            b.rollback(keep)
    b.close()
    return {name: statistics.median(ts) for name, ts in out.items()}


def main() -> int:
    import mlx.core as mx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 5, 9], help="rows a pass (k+1)")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--model", help="an mlx-lm model directory, for the real pass too")
    ap.add_argument("--model-reps", type=int, default=10)
    args = ap.parse_args()
    print(f"mlx {mx.__version__} on {mx.default_device()}; median ms")
    for n in args.rows:
        t = time_block(n, args.reps)
        print(f"block n={n}: host {t['host']:.3f}  mlx {t['mlx']:.3f}")
    for n in args.rows if args.model else []:
        t = time_model(args.model, n, args.model_reps)
        print(f"model n={n}: rows {t['rows']:.1f}  picks {t['picks']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
