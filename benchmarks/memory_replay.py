"""A question asked again, replayed: auto with the suffix memory against plain decoding, on a real target's
answers that part from the remembered one where batched arithmetic decides a near-tie the other way.

    python benchmarks/memory_replay.py --target T.gguf [--threads 2] [--tokens 160] [--cache replay.json]
        [--remembered all|none|LO-HI] [--show N]

Recording (the first run, or one without --cache): for bench's memory (chat) and code-gen prompts the real target writes
its plain greedy answer A (one-token passes), then answers again the way a copy of A is verified: A's tokens in
passes of n rows (n = 4, 8, 17, 33) until the first token the pass decides differently, then one token at a
time. Each distinct such answer B is a case (where no pass size parts, B = A). T(n) is timed as
edit_replay.py times it.

Replay: a scripted target writes B at those costs on a fake clock; `none`, and auto whose suffix memory holds
prompt + A (a new process that remembers the first answer). So it shows, in seconds and without the noise of
end-to-end runs, how fast a copy resumes after it parts, which memory_parting.py measures end to end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from copy_edits_sim import replay, report  # noqa: E402
from edit_replay import cost_fn, greedy_answer, measure_curve, remembered, remembered_spec  # noqa: E402

from localspec.backends.base import chat_prompt_tokens  # noqa: E402
from localspec.backends.llama import backend as llama_cpp  # noqa: E402
from localspec.bench.suites import suites  # noqa: E402
from localspec.decoding.suffix_memory import SuffixMemory  # noqa: E402
from localspec.errors import LocalspecError  # noqa: E402

PASS_SIZES = (4, 8, 17, 33)


def _copied(target: llama_cpp.LlamaCppBackend, prompt: list[int], a: list[int], size: int) -> list[int]:
    """The greedy answer when A is verified in passes of `size` rows until a pass parts from it, then plain."""
    target.rollback(0)
    last = target.forward(prompt, all_logits=False)[-1]
    out = [int(last.argmax())]
    if out != a[:1]:
        return greedy_answer(target, prompt, len(a))
    while len(out) < len(a):
        chunk = a[len(out) - 1 : len(out) - 1 + size]  # the last emitted token, then the copy's next ones
        rows = target.forward(chunk, all_logits=True)
        picks = [int(r.argmax()) for r in rows]
        n_ok = next((i for i in range(len(chunk) - 1) if picks[i] != chunk[i + 1]), len(chunk) - 1)
        out += picks[: n_ok + 1]
        if n_ok < len(chunk) - 1:  # parted: the rest is new text, written one token at a time
            target.rollback(len(prompt) + len(out) - 1)
            row = target.forward([out[-1]], all_logits=False)[-1]
            while len(out) < len(a) and out[-1] not in target.eog_ids:
                out.append(int(row.argmax()))
                row = target.forward([out[-1]], all_logits=False)[-1]
            break
    return [t for t in out[: len(a)] if t not in target.eog_ids]


def record(args: argparse.Namespace) -> dict:
    target = llama_cpp.load(args.target, n_ctx=2048, threads=args.threads)
    try:
        cases = []
        for messages in [*suites()["memory"].prompts, *suites()["code-gen"].prompts]:
            prompt = chat_prompt_tokens(target, list(messages), None)
            a = greedy_answer(target, prompt, args.tokens)
            seen: list[list[int]] = []
            for size in PASS_SIZES:
                b = _copied(target, prompt, a, size)
                if b not in seen:
                    seen.append(b)
                    part = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
                    cases.append({"prompt": prompt, "a": a, "b": b, "size": size, "part": part})
                    print(f"prompt of {len(prompt)}: passes of {size} part at {part}", flush=True)
        curve = measure_curve(target, cases[0]["prompt"] + cases[0]["a"])
        return {"cases": cases, "curve": curve}
    finally:
        target.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--cache", help="a JSON file of recorded answers and curve: read if there, else written")
    ap.add_argument("--remembered", default="all", type=remembered_spec, help="the curve auto starts from")
    ap.add_argument("--show", type=int, help="print this case's rounds (its number in the table)")
    args = ap.parse_args()
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.exists():
        data = json.loads(cache.read_text())
    else:
        data = record(args)
        if cache is not None:
            cache.write_text(json.dumps(data))
    curve = {int(n): s for n, s in data["curve"].items()}
    print("T(n)/T(1): " + " ".join(f"{n}:{curve[n] / curve[1]:.2f}" for n in sorted(curve)))
    tok = llama_cpp.load(args.target, n_ctx=256, threads=1)
    speeds = []
    try:
        for i, case in enumerate(data["cases"]):
            prompt, a, b = case["prompt"], case["a"], case["b"]
            memory = SuffixMemory(tok.vocab_info, root=Path(tempfile.mkdtemp()))
            memory.remember([*prompt, *a])
            cost = cost_fn(curve)
            plain, _ = replay(prompt, b, cost, None, "none", tok)
            auto, rounds = replay(prompt, b, cost, remembered(curve, args.remembered), "auto", tok, memory=memory)
            speeds.append(plain / auto)
            name = f"{i}: passes of {case['size']:2d} part at {case['part']}"
            report(name, b, plain, auto, rounds, args.show == i, tok)
    finally:
        tok.close()
    print(f"median {statistics.median(speeds):.3f}x, mean {statistics.mean(speeds):.3f}x")


if __name__ == "__main__":
    try:
        main()
    except LocalspecError as e:  # a missing or unreadable model: its message and hint, not a traceback
        raise SystemExit(f"memory_replay.py: {e}") from None
