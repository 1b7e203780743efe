"""The suffix drafter's cost per round, in CPython, on a session of synthetic token text.

    python benchmarks/suffix_cost.py [--session-tokens 60000] [--rounds 2000]

A session of earlier documents (`--session-tokens` in all, a 2,000-token vocabulary with repeated
phrases, so that common keys have many occurrences), then a current text that copies one of them with
edits. Each round appends the tokens a round would have committed and asks for a draft of up to 32.
Prints microseconds per round (median and 99th percentile) and the index's size.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from localspec.decoding.suffix import SuffixDrafter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--session-tokens", type=int, default=60_000)
    ap.add_argument("--rounds", type=int, default=2_000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    phrases = [list(rng.integers(0, 2000, rng.integers(3, 12))) for _ in range(400)]

    def text(n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out += phrases[int(rng.integers(0, len(phrases)))] if rng.random() < 0.7 else [int(rng.integers(0, 2000))]
        return [int(t) for t in out[:n]]

    d = SuffixDrafter(gate=False)
    t0 = time.perf_counter()
    docs = [text(1500) for _ in range(args.session_tokens // 1500)]
    for doc in docs:
        d.prepare(doc, 32)
    build = time.perf_counter() - t0
    source = docs[-3]
    ctx = text(200) + source[:50]
    d.prepare(ctx, 32)
    times, drafted = [], 0
    pos = 50
    for _ in range(args.rounds):
        t = time.perf_counter()
        draft = d.lookup(ctx, 32)
        times.append(time.perf_counter() - t)
        drafted += len(draft.tokens)
        step = 1 + int(rng.integers(0, 8))  # what a round commits
        if rng.random() < 0.1:
            ctx += text(step)  # an edit
        else:
            ctx += source[pos : pos + step]
            pos = (pos + step) % (len(source) - 40)
    us = sorted(t * 1e6 for t in times)
    print(f"session: {d.index.n_tokens} tokens kept, {d.index.n_entries} index entries, built in {build:.2f} s "
          f"({build / max(d.index.n_tokens, 1) * 1e6:.1f} us per token)")  # fmt: skip
    print(f"per round: median {statistics.median(us):.0f} us, p99 {us[int(0.99 * len(us))]:.0f} us, "
          f"max {us[-1]:.0f} us (includes indexing the new tokens); {drafted / args.rounds:.1f} tokens drafted per round")  # fmt: skip


if __name__ == "__main__":
    main()
