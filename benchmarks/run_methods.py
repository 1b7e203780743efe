"""Side-by-side `localspec run --json` for each draft method on a few code prompts.

    python benchmarks/run_methods.py --target T.gguf --draft D.gguf [--repeats 2] [--max-tokens 128]

Runs are interleaved (prompt by prompt, method by method, repeat by repeat) so machine noise hits all
methods alike; prints decode tokens/s (median), speedup over `none`, acceptance rate and mean accepted
length per prompt and method.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Write a Python class implementing an LRU cache with get and put methods.",
    "Write a Python function that parses a CSV file and returns the average of each numeric column.",
)
METHODS = ("none", "model", "ngram")


def run_once(prompt: str, method: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "localspec.cli", "run", prompt, "--json", "--target", args.target,
           "--draft", args.draft, "--draft-method", method, "--max-tokens", str(args.max_tokens), "-k", str(args.k)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["stats"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("-k", type=int, default=4)
    args = ap.parse_args()
    results: dict[tuple[int, str], list[dict]] = {}
    for _rep in range(args.repeats):
        for i, prompt in enumerate(PROMPTS):
            for method in METHODS:
                results.setdefault((i, method), []).append(run_once(prompt, method, args))
    print(f"{'prompt':<8}{'method':<8}{'decode tok/s':>14}{'speedup':>9}{'accept':>9}{'mean len':>10}{'tokens':>8}")
    for i in range(len(PROMPTS)):
        base = statistics.median(s["decode_tps"] for s in results[(i, "none")])
        for method in METHODS:
            runs = results[(i, method)]
            tps = statistics.median(s["decode_tps"] for s in runs)
            acc = statistics.median(s["acceptance_rate"] for s in runs)
            mal = statistics.median(s["mean_accepted_length"] for s in runs)
            n = runs[0]["n_generated"]
            print(f"{i + 1:<8}{method:<8}{tps:>14.2f}{tps / base:>8.2f}x{acc:>9.1%}{mal:>10.2f}{n:>8}")


if __name__ == "__main__":
    main()
