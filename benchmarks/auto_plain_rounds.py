"""What auto's plain rounds cost over plain decoding, in one process (no start-up in the figure).

    python benchmarks/auto_plain_rounds.py --target T.gguf [--draft D.gguf] [--reps 6] [--max-tokens 96]

One pipeline (auto, with the draft if given: loaded only if the remembered costs let it pay), then the
same greedy generation alternately with a `none` drafter and an `auto` drafter, the order swapped
every repetition. Prints the median decode tokens/s and verify time per round of each, and auto's
drafting time per round (lookup and policy). On a prompt where auto decodes plainly the two should
agree within noise; auto_wall.py measures the same as whole processes.
"""

from __future__ import annotations

import argparse
import statistics

from localspec.decoding.engine import Done, GenerationConfig
from localspec.decoding.stats import RoundStats
from localspec.options import ModelOptions
from localspec.pipeline import load_pipeline
from localspec.sampling import SamplingParams

PROMPT = "Explain to someone new to programming why version control matters, in three short paragraphs."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default=PROMPT)
    args = ap.parse_args()
    pipe = load_pipeline(ModelOptions(target=args.target, draft=args.draft, draft_method="auto", threads=args.threads))
    tps: dict[str, list[float]] = {"none": [], "auto": []}
    verify: dict[str, list[float]] = {"none": [], "auto": []}
    drafting: list[float] = []
    try:
        for rep in range(args.reps):
            for method in ("none", "auto") if rep % 2 == 0 else ("auto", "none"):
                drafter = pipe.new_drafter(method)
                cfg = GenerationConfig(
                    max_tokens=args.max_tokens, num_draft=32 if method == "auto" else 0, sampling=SamplingParams()
                )
                rounds: list[RoundStats] = []
                done = None
                for event in pipe.generate(args.prompt, cfg, drafter=drafter):
                    if isinstance(event, Done):
                        done = event
                    elif event.round is not None:
                        rounds.append(event.round)
                drafter.close()
                assert done is not None
                tps[method].append(done.stats.decode_tps)
                verify[method].append(statistics.median(r.verify_s for r in rounds) * 1000)
                if method == "auto":
                    drafting.append(statistics.median(r.draft_s for r in rounds) * 1000)
                    print(f"rep {rep + 1}: auto drafted {done.stats.n_drafted} tokens", flush=True)
    finally:
        pipe.close()
    for method in ("none", "auto"):
        print(f"{method}: decode {statistics.median(tps[method]):.2f} tok/s (runs: {', '.join(f'{x:.1f}' for x in tps[method])}), "
              f"verify {statistics.median(verify[method]):.2f} ms/round")  # fmt: skip
    print(f"auto/none decode: {statistics.median(tps['auto']) / statistics.median(tps['none']):.3f}x; "
          f"auto's drafting {statistics.median(drafting):.3f} ms/round (median)")  # fmt: skip


if __name__ == "__main__":
    main()
