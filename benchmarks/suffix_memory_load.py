"""What the suffix memory costs a new process: reading a full store, choosing and indexing its documents for
a prompt, and writing an answer back.

    python benchmarks/suffix_memory_load.py [--tokens 2000000] [--doc-tokens 2000] [--dir DIR]

Fills a store (in a temporary directory unless --dir) with documents of about `--doc-tokens` tokens each
(a 30,000-token vocabulary, each document a variation of a few shared "files"), then times in a fresh
SuffixMemory, as a restarted process would: the first `relevant` (lists and reads every document, hashes
it), the drafter's first `prepare` (that plus indexing the chosen documents), and one `remember`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from localspec.decoding.suffix import SuffixDrafter
from localspec.decoding.suffix_memory import SuffixMemory
from localspec.vocab import VocabInfo

VOCAB = VocabInfo("gpt2", 30_000, None, 0, False, False, [f"t{i}" for i in range(30_000)])


def fill(root: Path, tokens: int, doc_tokens: int, rng: np.random.Generator) -> list[np.ndarray]:
    files = [rng.integers(0, 30_000, doc_tokens // 2) for _ in range(20)]
    mem = SuffixMemory(lambda: VOCAB, root=root, max_tokens=tokens)
    docs = []
    for i in range(tokens // doc_tokens):
        base = files[i % len(files)]
        doc = np.concatenate([base, rng.integers(0, 30_000, doc_tokens - len(base))])
        mem.remember(doc)
        docs.append(doc)
    return docs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2_000_000)
    ap.add_argument("--doc-tokens", type=int, default=2_000)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    root = args.dir or Path(tempfile.mkdtemp(prefix="suffix-memory-"))
    t0 = time.perf_counter()
    docs = fill(root, args.tokens, args.doc_tokens, rng)
    print(f"filled {len(docs):,} documents, {sum(len(d) for d in docs):,} tokens in {time.perf_counter() - t0:.1f} s")
    prompt = docs[-1][: args.doc_tokens // 2].tolist()

    mem = SuffixMemory(lambda: VOCAB, root=root, max_tokens=args.tokens)
    t0 = time.perf_counter()
    listed = mem.listing()
    t1 = time.perf_counter()
    chosen = mem.relevant(prompt, budget=1 << 15)
    t2 = time.perf_counter()
    again = mem.relevant(prompt, budget=1 << 15)
    t3 = time.perf_counter()
    print(f"listing {len(listed):,} files: {1e3 * (t1 - t0):.0f} ms")
    print(f"first relevant (read + hash all, choose {len(chosen)}, {sum(len(t) for _, t in chosen):,} tokens): "
          f"{1e3 * (t2 - t1):.0f} ms; again (cached): {1e3 * (t3 - t2):.0f} ms; {len(again)} chosen")  # fmt: skip

    fresh = SuffixMemory(lambda: VOCAB, root=root, max_tokens=args.tokens)
    d = SuffixDrafter(memory=fresh)
    t0 = time.perf_counter()
    d.prepare(prompt, 32)
    t1 = time.perf_counter()
    ms = 1e3 * (t1 - t0)
    print(f"first prepare in a fresh process (read, choose, index {d.index.n_tokens:,} tokens): {ms:.0f} ms")
    answer = [*prompt, *rng.integers(0, 30_000, 500).tolist()]
    t0 = time.perf_counter()
    fresh.remember(answer)
    print(f"remember one answer ({len(answer):,} tokens, dedup, evict): {1e3 * (time.perf_counter() - t0):.0f} ms")


if __name__ == "__main__":
    main()
