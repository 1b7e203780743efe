"""Replay recorded answers (record_answers.py) through the real engine and drafters on a fake clock.

    python benchmarks/replay_session.py benchmarks/answers/qwen2.5-coder-1.5b.json [--methods none,suffix,auto]

As replay_costs.py: the target is a scripted fake that writes the recorded answer, and a fake clock charges
each forward pass of n tokens T(n) from the cost curve measured for the Qwen2.5-Coder 1.5B on a 2-core
CPU. One drafter per conversation, as `localspec bench` builds one, so a session's drafter sees the earlier
turns. Drafting, acceptance and auto's choices are the real code's; auto has no draft model here.
Methods: none, suffix, auto, and suffix-noresync / auto-noresync (the suffix drafter without resync,
localspec.decoding.resync), and oracle: the best any policy could do with the suffix drafter's proposals
if it knew how many tokens of each would be accepted (each round drafts exactly those, or none, the
rounds chosen for the least total cost). A model of speed, not a measurement: `localspec bench` is the
measurement. `--curve 1:1,2:1.79,...` replays on a curve `localspec bench` printed (its "target batch"
line), interpolated between the sizes given.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fakes import CostedBackend, FakeClock, scripted_tokens  # noqa: E402

from localspec.decoding.auto import AutoDrafter  # noqa: E402
from localspec.decoding.drafters import Drafter, NoDrafter  # noqa: E402
from localspec.decoding.engine import Done, GenerationConfig, generate  # noqa: E402
from localspec.decoding.policy import CostModel  # noqa: E402
from localspec.decoding.suffix import SuffixDrafter  # noqa: E402
from localspec.sampling import SamplingParams  # noqa: E402

CURVE = {
    1: 1.0,
    2: 1.7,
    4: 2.8,
    5: 3.6,
    8: 7.0,
    16: 8.0,
    32: 14.0,
    64: 25.0,
}  # T(n)/T(1), a 2-core CPU's measured curve
MS_PER_TOKEN = 35.0


@dataclass
class Tally:
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0


def cost(ms: float) -> Callable[[int], float]:
    sizes = sorted(CURVE)
    return lambda n: ms / 1000 * float(np.interp(n, sizes, [CURVE[s] for s in sizes]))


def new_drafter(method: str, clock: FakeClock, t: Callable[[int], float]) -> Drafter:
    if method == "none":
        return NoDrafter()
    resync = not method.endswith("-noresync")
    if method.startswith("suffix"):
        return SuffixDrafter(resync=resync)
    known = CostModel(target={n: t(n) for n in range(1, 66)})
    return AutoDrafter(ngram=SuffixDrafter(gate=False, resync=resync), costs=known, clock=clock)


def replay(convs: list[list[dict]], method: str, k: int, ids: dict[int, int]) -> Tally:
    t = cost(MS_PER_TOKEN)
    eog = len(ids)
    tally = Tally()
    for conv in convs:
        clock = FakeClock()
        drafter = new_drafter(method, clock, t)
        for turn in conv:
            prompt = [ids[v] for v in turn["prompt"]]
            answer = [ids[v] for v in turn["answer"]]
            target = CostedBackend(
                scripted_tokens(prompt + answer, n_vocab=eog + 1, fallback=eog),
                clock,
                t,
                n_vocab=eog + 1,
                eog=frozenset({eog}),
            )
            cfg = GenerationConfig(max_tokens=len(answer) + 1, num_draft=k, sampling=SamplingParams())
            *_, done = generate(target, drafter, prompt, cfg, clock=clock)
            assert isinstance(done, Done) and list(done.tokens)[: len(answer)] == answer, "replay diverged"
            s = done.stats
            tally.tokens += s.decode_tokens
            tally.seconds += s.decode_s
            tally.drafted += s.n_drafted
            tally.accepted += s.n_accepted
            tally.rounds += s.n_rounds
        drafter.close()
    return tally


def oracle(convs: list[list[dict]], k: int) -> Tally:
    """The least decode time the suffix drafter's proposals allow: at each position a round drafts as many
    tokens as would be accepted (at most k) or none, chosen by dynamic programming over the answer."""
    t = cost(MS_PER_TOKEN)
    tally = Tally()
    for conv in convs:
        drafter = SuffixDrafter(gate=False)
        for turn in conv:
            prompt, answer = turn["prompt"], turn["answer"]
            drafter.prepare(prompt, k)
            n = len(answer)
            good = [0] * n  # at position p (p tokens out): how many of the drafter's tokens match the answer
            for p in range(1, n):
                d = drafter.lookup(prompt + answer[:p], k).tokens
                while good[p] < min(len(d), n - 1 - p) and d[good[p]] == answer[p + good[p]]:
                    good[p] += 1
            best = [0.0] * (n + 1)  # best[p]: least seconds to write answer[p:] (the first comes from the prompt pass)
            for p in range(n - 1, 0, -1):
                best[p] = min(t(j + 1) + best[p + j + 1] for j in range(good[p] + 1))
            tally.tokens += n - 1
            tally.seconds += best[1]
    return tally


def parse_curve(text: str) -> dict[int, float]:
    return {int(n): float(r.rstrip("x")) for n, r in (item.split(":") for item in text.split(","))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("answers")
    ap.add_argument("--methods", default="none,suffix-noresync,suffix,auto-noresync,auto")
    ap.add_argument("-k", type=int, default=32)
    ap.add_argument("--curve", help="T(n)/T(1) as n:ratio pairs, e.g. 1:1,2:1.79,4:3.03,16:10.05,33:16.1")
    args = ap.parse_args()
    if args.curve:
        CURVE.clear()
        CURVE.update(parse_curve(args.curve))
    data = json.loads(Path(args.answers).read_text())
    every = [
        v
        for convs in data["suites"].values()
        for conv in convs
        for turn in conv
        for v in turn["prompt"] + turn["answer"]
    ]
    ids = {v: j for j, v in enumerate(dict.fromkeys(every))}  # a dense vocabulary for the fake
    methods = args.methods.split(",")
    print(f"replayed on T(n)/T(1) {CURVE}; k={args.k}; greedy; speedup = decode tok/s over plain's")
    print(f"{'suite':<11}" + "".join(f"{m:>24}" for m in methods))
    for name, convs in data["suites"].items():
        out = {
            m: oracle(convs, args.k) if m == "oracle" else replay(convs, m, 0 if m == "none" else args.k, ids)
            for m in methods
        }
        base = out["none"].tokens / out["none"].seconds
        cells = []
        for m in methods:
            r = out[m]
            cells.append(f"{r.tokens / r.seconds / base:.2f}x {r.accepted:>4}/{r.drafted:<5} {r.rounds:>4}r")
        print(f"{name:<11}" + "".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
