"""One client streaming through `localspec serve` against `localspec run`, on the same prompts.

Both use the same pair, settings and greedy decoding; they alternate (which goes first flips each
repetition) so that a slow spell on a shared machine hits both. Per request it prints run's decode
tokens/s and prompt time, and the server's decode tokens/s as the client sees it (tokens after the
first over the time from the first text delta to the last chunk) and its time to first token (from
sending the request to the first text delta). Each (repetition, prompt) is a new user message, so
the server cannot answer from its cache beyond the shared template prefix (its cache_n is shown).
Bar: server decode >= 0.95x run's, and TTFT within 50 ms of run's prompt time.

    python benchmarks/serve_vs_run.py --target T.gguf --draft D.gguf [--max-tokens 96] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from serve_process import ServeProcess  # noqa: E402

PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Write a Python class for a stack with push, pop and peek, with docstrings.",
    "Explain the difference between a list and a tuple in Python, with examples.",
)


def run_once(args: argparse.Namespace, prompt: str) -> dict:  # type: ignore[type-arg]
    cmd = [sys.executable, "-m", "localspec.cli", "run", prompt, "--target", args.target, "--json",
           "--max-tokens", str(args.max_tokens), "--n-ctx", str(args.n_ctx), *model_flags(args)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    s = out["stats"]
    return {"decode_tps": s["decode_tps"], "prompt_ms": s["prompt_s"] * 1000, "n_prompt": s["n_prompt"],
            "n": s["n_generated"], "text": out["text"]}  # fmt: skip


def serve_once(server: ServeProcess, args: argparse.Namespace, prompt: str) -> dict:  # type: ignore[type-arg]
    client = server.client(timeout=600)
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model="bench", messages=[{"role": "user", "content": prompt}],
                                            max_tokens=args.max_tokens, temperature=0, stream=True)  # fmt: skip
    t_first = t_last = None
    parts, timings = [], {}
    for c in stream:
        now = time.perf_counter()
        if c.choices and c.choices[0].delta.content:
            t_first = t_first or now
            parts.append(c.choices[0].delta.content)
        if c.choices and c.choices[0].finish_reason:
            t_last, timings = now, c.model_extra["timings"]
    assert t_first is not None and t_last is not None
    n = timings["predicted_n"]
    return {"decode_tps": (n - 1) / (t_last - t_first) if n > 1 and t_last > t_first else 0.0,
            "server_tps": timings["predicted_per_second"], "ttft_ms": (t_first - t0) * 1000,
            "prompt_ms": timings["prompt_ms"], "cache_n": timings["cache_n"], "n": n, "text": "".join(parts)}  # fmt: skip


def model_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--draft-method", args.draft_method]
    if args.draft:
        flags += ["--draft", args.draft]
    if args.num_draft:
        flags += ["-k", str(args.num_draft)]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    return flags


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft")
    p.add_argument("--draft-method", default="auto")
    p.add_argument("-k", "--num-draft", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()

    server = ServeProcess(
        "--target", args.target, "--n-ctx", str(args.n_ctx), "--model-name", "bench", *model_flags(args)
    )
    rows = []
    try:
        print(f"{'prompt':<8}{'run tok/s':>10}{'serve tok/s':>12}{'ratio':>7}{'run prompt ms':>15}{'TTFT ms':>9}"
              f"{'diff ms':>9}{'cache_n':>8}{'same text':>10}")  # fmt: skip
        for rep in range(args.reps):
            for i, base in enumerate(PROMPTS):
                prompt = f"{base} (request {rep + 1}.{i + 1})"
                order = (run_once, serve_once) if (rep + i) % 2 == 0 else (serve_once, run_once)
                results = {}
                for fn in order:
                    results[fn.__name__] = fn(server, args, prompt) if fn is serve_once else fn(args, prompt)  # type: ignore[operator]
                r, s = results["run_once"], results["serve_once"]
                ratio = s["decode_tps"] / r["decode_tps"] if r["decode_tps"] else 0.0
                rows.append((ratio, s["ttft_ms"] - r["prompt_ms"]))
                print(f"{rep + 1}.{i + 1:<6}{r['decode_tps']:>10.2f}{s['decode_tps']:>12.2f}{ratio:>7.3f}"
                      f"{r['prompt_ms']:>15.0f}{s['ttft_ms']:>9.0f}{s['ttft_ms'] - r['prompt_ms']:>+9.0f}"
                      f"{s['cache_n']:>8}{str(r['text'] == s['text']):>10}", flush=True)  # fmt: skip
    finally:
        server.close()
    ratios, diffs = [r for r, _ in rows], [d for _, d in rows]
    print(f"\nserver decode / run decode: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
          f"max {max(ratios):.3f}); TTFT - run prompt time: median {statistics.median(diffs):+.0f} ms "
          f"(min {min(diffs):+.0f}, max {max(diffs):+.0f})")  # fmt: skip


if __name__ == "__main__":
    main()
