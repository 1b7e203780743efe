"""Real copy edits replayed: auto against plain decoding on a real target's own answers and its measured costs.

    python benchmarks/edit_replay.py --target T.gguf [--threads 2] [--cases rename,hints] [--show rename]
        [--cache replay.json] [--remembered 1-6|none|all]

The first run (or one without --cache) loads the real target, writes its greedy answers to auto_tax.py's
held-out edit prompts (`none`, 160 tokens) and times T(n), a pass of n tokens with every row's logits as a
verify pass reads them, for n = 1..34, in alternating passes (3 each, the median). A later run with the same
--cache skips both. Then a scripted target that writes exactly those answers, at exactly those costs on a
fake clock, runs `none` and `auto` (lookup only, as `localspec run` on a CPU whose cores the target takes).

So it shows, in seconds, what a change to the suffix drafter, resync or the policy does to the real answers
on this CPU's real curve, without ten minutes of noisy end-to-end runs. `--remembered` is the curve auto
starts from: `1-6` what auto_tax.py's warm HOME held (a prose answer times only short passes), `all` the
whole measured curve, `none` nothing (auto learns it from the rounds). Confirm a gain with auto_tax.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from auto_tax import CASES  # noqa: E402
from copy_edits_sim import replay, report  # noqa: E402

from localspec.backends.base import Backend, chat_prompt_tokens  # noqa: E402
from localspec.backends.llama import backend as llama_cpp  # noqa: E402
from localspec.backends.messages import ChatMessage  # noqa: E402
from localspec.decoding.policy import CostModel  # noqa: E402
from localspec.decoding.stats import RoundStats  # noqa: E402
from localspec.errors import LocalspecError  # noqa: E402

MAX_N = 34  # a verify pass of 33 tokens (k = 32, auto's default) and one more


def record(args: argparse.Namespace, cases: list[str]) -> dict:
    """The target's prompts, greedy answers and T(n) curve, measured on the real model."""
    target = llama_cpp.load(args.target, n_ctx=2048, threads=args.threads)
    try:
        out: dict = {"answers": {}, "prompts": {}}
        for name in cases:
            case = CASES[name]
            prompt = chat_prompt_tokens(target, [ChatMessage("user", case.prompt)], None)
            out["prompts"][name], out["answers"][name] = prompt, greedy_answer(target, prompt, case.tokens)
        out["curve"] = measure_curve(target, out["prompts"][cases[0]] + out["answers"][cases[0]])
        return out
    finally:
        target.close()


def greedy_answer(target: llama_cpp.LlamaCppBackend, prompt: list[int], n: int) -> list[int]:
    """The target's plain greedy answer to `prompt` (one token a pass), up to n tokens, its end of generation left out."""
    target.rollback(0)
    row = target.forward(prompt, all_logits=False)[-1]
    answer: list[int] = []
    for _ in range(n):
        tok = int(row.argmax())
        if tok in target.eog_ids:
            break
        answer.append(tok)
        row = target.forward([tok], all_logits=False)[-1]
    return answer


def measure_curve(target: llama_cpp.LlamaCppBackend, text: list[int], reps: int = 3) -> dict[int, float]:
    """T(n) with every row's logits, the median of `reps` passes per n, sizes alternating (a drift hits all)."""
    base = text[: len(text) - MAX_N]
    target.rollback(0)
    target.forward(base, all_logits=False)
    times: dict[int, list[float]] = {}
    for _ in range(reps):
        for n in range(1, MAX_N + 1):
            t = time.perf_counter()
            target.forward(text[len(base) : len(base) + n], all_logits=True)
            times.setdefault(n, []).append(time.perf_counter() - t)
            target.rollback(len(base))
    return {n: statistics.median(v) for n, v in times.items()}


def cost_fn(curve: dict[int, float]):
    top = max(curve)
    slope = (curve[top] - curve[top - 8]) / 8

    def cost(n: int) -> float:
        return curve[n] if n in curve else curve[top] + slope * (n - top)

    return cost


def remembered_spec(spec: str) -> str:
    """argparse's check of --remembered: `none`, `all`, or LO-HI sizes within 1..MAX_N."""
    parts = spec.split("-")
    if spec in ("none", "all") or (
        len(parts) == 2 and all(p.isdigit() for p in parts) and 1 <= int(parts[0]) <= int(parts[1]) <= MAX_N
    ):
        return spec
    raise argparse.ArgumentTypeError(f"{spec!r}: give none, all, or sizes LO-HI within 1-{MAX_N} (e.g. 1-6)")


def remembered(curve: dict[int, float], spec: str) -> CostModel | None:
    if spec == "none":
        return None
    if spec == "all":
        return CostModel(target=dict(curve))
    lo, hi = (int(x) for x in spec.split("-"))
    return CostModel(target={n: curve[n] for n in range(lo, hi + 1)})


def simulate(
    prompt: list[int], answer: list[int], curve: dict[int, float], method: str, spec: str, tok: Backend, text: bool
) -> tuple[float, list[RoundStats]]:
    return replay(prompt, answer, cost_fn(curve), remembered(curve, spec), method, tok, text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", default="rename,hints")
    ap.add_argument("--cache", help="a JSON file of recorded answers and curve: read if there, else written")
    ap.add_argument(
        "--remembered", default="1-6", type=remembered_spec, help="the curve auto starts from: LO-HI sizes, all, none"
    )
    ap.add_argument("--show", help="print this case's rounds")
    ap.add_argument("--tokens", action="store_true", help="resync token by token (no tokenizer), as before bytes")
    args = ap.parse_args()
    cases = args.cases.split(",")
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.exists():
        data = json.loads(cache.read_text())
    else:
        data = record(args, cases)
        if cache is not None:
            cache.write_text(json.dumps(data))
    curve = {int(n): s for n, s in data["curve"].items()}
    print("T(n)/T(1): " + " ".join(f"{n}:{curve[n] / curve[1]:.2f}" for n in sorted(curve)))
    tok = llama_cpp.load(args.target, n_ctx=256, threads=1)
    try:
        for name in cases:
            prompt, answer = data["prompts"][name], data["answers"][name]
            plain, _ = simulate(prompt, answer, curve, "none", args.remembered, tok, not args.tokens)
            auto, rounds = simulate(prompt, answer, curve, "auto", args.remembered, tok, not args.tokens)
            report(name, answer, plain, auto, rounds, args.show == name, tok)
    finally:
        tok.close()


if __name__ == "__main__":
    try:
        main()
    except LocalspecError as e:  # a missing or unreadable model: its message and hint, not a traceback
        raise SystemExit(f"edit_replay.py: {e}") from None
