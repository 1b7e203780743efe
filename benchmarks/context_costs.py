"""How the target's forward pass T(n) grows with the context it attends to (llama.cpp or MLX).

    python benchmarks/context_costs.py --target T.gguf [--contexts 512,2048,8192] [--sizes 1,4,8] [--reps 5]

For each context length L the cache is filled with L tokens of real text (the long-summary document,
repeated), then T(n) is timed in pairs with a 1-token pass (calibrate.time_target_paired, the way auto's
idle calibration times it), `--reps` pairs per size. Prints the median T(n) per context, the ratio to
T(1) at the same context, the ratio to the first context's T(n), the pairs' spread, and the machine's
load average (a busy machine spreads the pairs: read the spread before the numbers).
"""

from __future__ import annotations

import argparse
import os

from localspec.bench.costs import current_load
from localspec.bench.suites import long_document
from localspec.decoding.calibrate import time_target_paired
from localspec.options import ModelOptions
from localspec.pipeline import load_pipeline


def _text_tokens(pipe_target, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    doc = long_document()
    tokens = pipe_target.tokenize(doc, add_special=True, parse_special=False)
    while len(tokens) < n:
        tokens += pipe_target.tokenize("\n\n" + doc, add_special=False, parse_special=False)
    return tokens[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--contexts", default="512,2048,8192")
    ap.add_argument("--sizes", default="1,4,8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    n_ctx = max(contexts) + max(sizes) + 64
    opts = ModelOptions(
        target=args.target, backend=args.backend, draft_method="none", n_ctx=n_ctx, threads=args.threads
    )
    pipe = load_pipeline(opts)
    target = pipe.target
    print(f"{target.info.name} on {target.info.device}, {os.cpu_count()} CPUs, {args.reps} pairs per size", flush=True)
    rows: list[tuple[int, dict[int, float], float, str]] = []
    try:
        for length in contexts:
            target.rollback(0)
            target.forward(_text_tokens(target, length), all_logits=False)
            load = current_load()
            timed = time_target_paired(target, sizes, reps=args.reps)
            rows.append((length, timed.curve(), timed.spread, load.describe()))
            print(f"  context {length}: timed ({load.describe()})", flush=True)
    finally:
        pipe.close()
    base = rows[0][1]
    head = "context  " + "  ".join(f"{'T(' + str(n) + ')':>9}" for n in sizes)
    head += "  " + "  ".join(f"{'T(' + str(n) + ')/T(1)':>10}" for n in sizes if n > 1)
    head += "  " + "  ".join(f"{'vs ' + str(rows[0][0]):>8}" for _ in [0]) + "  spread  load"
    print(head)
    for length, curve, spread, load in rows:
        cells = "  ".join(f"{curve[n] * 1e3:7.1f}ms" for n in sizes)
        ratios = "  ".join(f"{curve[n] / curve[1]:10.2f}" for n in sizes if n > 1)
        grow = f"{curve[1] / base[1]:7.2f}x"
        print(f"{length:>7}  {cells}  {ratios}  {grow:>8}  {spread:5.0%}  {load}")


if __name__ == "__main__":
    main()
