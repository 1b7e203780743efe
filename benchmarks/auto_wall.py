"""Whole-process wall time of `localspec run` with `--draft-method auto` against `none`.

    python benchmarks/auto_wall.py --target T.gguf --draft D.gguf [--reps 5] [--max-tokens 96] [--threads 2]

Each repetition runs both methods as separate processes (model loading included), alternating which
goes first, so slow spells on a shared machine hit both alike. One unmeasured `auto` run first fills
the cost cache, as any earlier run on this machine would have. Prints every pair and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

PROMPT = "Explain to someone new to programming why version control matters, in three short paragraphs."


def run_once(method: str, args: argparse.Namespace) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "localspec.cli", "run", args.prompt, "--json", "--target", args.target,
           "--draft-method", method, "--max-tokens", str(args.max_tokens)]  # fmt: skip
    if args.draft:
        cmd += ["--draft", args.draft]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    return wall, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--no-warm-up", action="store_true", help="skip the warm-up run (the cost cache is already filled)")
    args = ap.parse_args()
    if not args.no_warm_up:
        _, warm = run_once("auto", args)  # fills the cost cache (not counted)
        print(f"warm-up auto run: notes={warm.get('notes')}", flush=True)
    walls: dict[str, list[float]] = {"none": [], "auto": []}
    rests: dict[str, list[float]] = {"none": [], "auto": []}
    for rep in range(args.reps):
        order = ("none", "auto") if rep % 2 == 0 else ("auto", "none")
        line = []
        for method in order:
            wall, out = run_once(method, args)
            walls[method].append(wall)
            s = out["stats"]
            rest = wall - s["prompt_s"] - s["decode_s"]  # start-up (imports, loading) and shut-down
            rests[method].append(rest)
            line.append(f"{method} {wall:.2f} s (load+exit {rest:.2f} s, prompt {s['prompt_s']:.2f} s, "
                        f"decode {s['decode_tps']:.1f} tok/s, drafted {s['n_drafted']})")  # fmt: skip
        print(f"rep {rep + 1}: " + "; ".join(line), flush=True)
    m_none, m_auto = statistics.median(walls["none"]), statistics.median(walls["auto"])
    print(f"median wall: none {m_none:.2f} s, auto {m_auto:.2f} s, auto/none {m_auto / m_none:.3f}x")
    print(
        f"median load+exit: none {statistics.median(rests['none']):.2f} s, auto {statistics.median(rests['auto']):.2f} s"
    )
    ratios = [a / n for a, n in zip(walls["auto"], walls["none"])]
    print(f"per-pair auto/none: {', '.join(f'{r:.3f}' for r in ratios)} (median {statistics.median(ratios):.3f})")


if __name__ == "__main__":
    main()
