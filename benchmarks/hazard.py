"""How often a suffix copy goes on, by how long it has held: the numbers behind auto's lookup acceptance.

    python benchmarks/hazard.py benchmarks/answers/qwen2.5-coder-1.5b.json [--suites agentic,code-edit]

For every position of every recorded answer (record_answers.py), the suffix drafter proposes up to 64
tokens from the text so far (one drafter per conversation, as `localspec bench` runs sessions) and the
proposal is compared with what the model wrote next. Two tables per suite:
- by copy length (the match the draft started from plus the draft tokens before): of the draft tokens
  at that length, the share that matched, given the ones before them did (what the policy's alpha per
  bucket estimates, localspec.decoding.policy);
- by the match the draft started from: proposals, mean tokens matched, share matched to the end.
Resync drafts (after an edit, localspec.decoding.resync) are listed as R + tokens confirmed since the edit.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from localspec.decoding.policy import RESYNC, match_bucket
from localspec.decoding.suffix import SuffixDrafter


def label(order: int) -> str:
    b = match_bucket(order)
    return f"R{b - RESYNC}" if b >= RESYNC else str(b)


def sort_key(name: str) -> tuple[bool, int]:
    return name.startswith("R"), int(name.lstrip("R"))


def measure(convs: list[list[dict]]) -> tuple[dict[str, list[int]], dict[str, list[tuple[int, int]]]]:
    held: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # copy length bucket -> [went on, broke]
    starts: dict[str, list[tuple[int, int]]] = defaultdict(list)  # start bucket -> (matched, comparable)
    for conv in convs:
        drafter = SuffixDrafter(gate=False)
        for turn in conv:
            prompt, answer = turn["prompt"], turn["answer"]
            drafter.prepare(prompt, 64)
            for p in range(len(answer)):
                d = drafter.lookup(prompt + answer[:p], 64)
                truth = answer[p:]
                n_cmp = min(len(d.tokens), len(truth))
                if n_cmp == 0:
                    continue
                n = 0
                while n < n_cmp and d.tokens[n] == truth[n]:
                    n += 1
                starts[label(d.order)].append((n, n_cmp))
                for i in range(min(n + 1, n_cmp)):
                    held[label(d.order + i)][0 if i < n else 1] += 1
    return held, starts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("answers")
    ap.add_argument("--suites", default="agentic,code-edit,code-gen,chat")
    args = ap.parse_args()
    data = json.loads(Path(args.answers).read_text())
    for name in args.suites.split(","):
        held, starts = measure(data["suites"][name])
        print(f"suite {name}")
        print("  copy length   went on  broke  share")
        for key in sorted(held, key=sort_key):
            on, broke = held[key]
            print(f"  {key:>11}  {on:8d}  {broke:5d}  {on / (on + broke):.3f}")
        print("  start match  proposals  mean matched  matched to the end")
        for key in sorted(starts, key=sort_key):
            rows = starts[key]
            full = sum(n >= c for n, c in rows) / len(rows)
            print(f"  {key:>11}  {len(rows):9d}  {sum(n for n, _ in rows) / len(rows):12.1f}  {full:18.2f}")


if __name__ == "__main__":
    main()
