"""What a grammar costs per position: the mask the engine computes for every verified row, and its use.

Per position the engine (decoding/engine.py with GenerationConfig.grammar) does:
  mask     llguidance's token mask for the state after the accepted prefix + draft[:i] (Constraint.mask)
  consume  advance the matcher by the draft token (and roll back the rejected part once per round)
  apply    the forbidden logits set to -inf (grammar.apply_mask on one [V] row)
This script walks a JSON answer token by token on a real vocabulary and times each part.

    python benchmarks/grammar_cost.py                         # qwen2.5-coder 0.5b fixture vocabulary
    python benchmarks/grammar_cost.py --model OTHER.gguf --repeat 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from localspec.backends.llama import backend as llama_cpp  # noqa: E402
from localspec.decoding import grammar  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
        },
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "address", "active"],
    "additionalProperties": False,
}
ANSWER = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "tags": ["mathematics", "analytical engine", "poetry of science"],
    "address": {"city": "London", "zip": "12345"},
    "active": True,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF file (default: the qwen2.5-coder 0.5b fixture)")
    ap.add_argument("--repeat", type=int, default=10, help="walks over the answer (default 10)")
    args = ap.parse_args()
    path = args.model
    if path is None:
        from fixture_models import fetch

        path = str(fetch("qwen-0.5b"))
    backend = llama_cpp.load(path, n_ctx=256)
    t0 = time.perf_counter()
    grammar.tokenizer_for(backend)
    t_tok = time.perf_counter() - t0
    spec = grammar.json_schema(SCHEMA)
    t0 = time.perf_counter()
    grammar.Constraint(backend, spec)
    t_compile = time.perf_counter() - t0
    tokens = backend.tokenize(json.dumps(ANSWER, indent=1), add_special=False)
    logits = np.random.default_rng(0).standard_normal(backend.n_vocab).astype(np.float32)
    masks: list[float] = []
    consumes: list[float] = []
    applies: list[float] = []
    for _ in range(args.repeat):
        c = grammar.Constraint(backend, spec)
        for t in tokens:
            t0 = time.perf_counter()
            allowed = c.mask()
            t1 = time.perf_counter()
            grammar.apply_mask(logits, allowed)
            t2 = time.perf_counter()
            assert allowed[t], f"token {t} refused: the answer does not match the schema"
            c.advance(t)
            t3 = time.perf_counter()
            masks.append(t1 - t0)
            applies.append(t2 - t1)
            consumes.append(t3 - t2)
    print(f"vocabulary: {backend.info.name}, {backend.n_vocab:,} tokens")
    print(
        f"tokenizer build (once per model): {t_tok * 1e3:.0f} ms; "
        f"schema compile + first matcher: {t_compile * 1e3:.1f} ms"
    )
    print(f"answer: {len(tokens)} tokens, walked {args.repeat} times")
    for name, xs in (("mask", masks), ("apply", applies), ("consume", consumes)):
        print(
            f"  {name:8s} mean {statistics.mean(xs) * 1e3:.3f} ms  median {statistics.median(xs) * 1e3:.3f} ms  "
            f"p90 {sorted(xs)[int(0.9 * len(xs))] * 1e3:.3f} ms"
        )
    total = statistics.mean(masks) + statistics.mean(applies) + statistics.mean(consumes)
    print(f"  per position, all three: {total * 1e3:.3f} ms")
    backend.close()


if __name__ == "__main__":
    main()
