"""localspec's own time per round, with the models taken out: a backend whose forward pass costs only handing
back logits rows (151,936-token vocabulary, as Qwen2.5's), so everything a round spends is the engine's,
the drafter's, the sampling's and the verification's. Per drafter (model, suffix, auto), greedy and
sampled, at k = 4 and 8; the forward passes are timed apart and left out.

The text is a loop of LOOP tokens (each token's logits pick the next one, with a runner-up close behind), so
a lookup drafter finds copies and a model drafter (the same table) is always right: every round drafts. A pass
waits for what the H200 took for the 1.5B target (tests/gpu_curves.py's figures: 2.9 ms for one token,
5.7 ms for 16) and a draft token for the 0.5B's 1.2 ms, so that auto decides as it would on that GPU; the
waits are part of the passes' time, which is left out.

How the host waits changes what the same work costs after it. CUDA's default on a machine with more cores than
GPUs (llama.cpp keeps it) spins in cudaStreamSynchronize: the core stays busy and its caches warm. A blocking wait
(Metal's, or a sleep) lets the core idle, and the round's work then runs on a cold core: on this 2-core VM a greedy
round's own work measured 0.08 ms after a spin and 0.45 ms after a sleep. --wait both (the default) prints each.

A greedy round reads each row's best two tokens, picked inside the pass as llama.cpp's backend sampling picks
them (BackendSpec.top2_on_device), and a sampled round one token a row, drawn inside the pass, with the numbers
of the row's softmax the rule needs read from the copy that comes with it (BackendSpec.draws_on_device); the
draft model draws its tokens the same way. --host-rows reads whole rows instead, as a backend without either
does.

    python benchmarks/round_cost.py [--rounds 150] [--wait both|spin|sleep|none] [--profile model:8:0] [--host-rows]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.backends.base import ByteDetokenizer, ModelInfo, TopTwo
from localspec.decoding.drafters import ModelDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.pipeline import make_drafter
from localspec.sampling import SamplingParams
from localspec.vocab import VocabInfo

VOCAB = 151_936
LOOP = 48  # distinct rows: the text repeats with this period
EOG = VOCAB - 1


WAITS = ("spin", "sleep")  # how a pass's time is spent: CUDA's spinning synchronize, or a blocking wait


def wait_until(deadline: float, how: str) -> None:
    """Pass the time up to `deadline` (perf_counter) as a host waiting for its device does."""
    if how == "sleep":
        time.sleep(max(deadline - time.perf_counter(), 0.0))
        return
    while time.perf_counter() < deadline:
        pass


def h200_pass_s(n: int) -> float:
    """The H200's T(n) for the 1.5B (a few of gpu_check's sizes, interpolated)."""
    return float(np.interp(n, (1, 2, 4, 8, 16, 32, 64), (2.94, 3.85, 4.04, 4.45, 5.72, 6.90, 8.32))) / 1e3


class TableBackend:
    """The Backend protocol over a fixed table: after token t the logits are row t % LOOP (pre-built)."""

    def __init__(
        self,
        table: np.ndarray,
        name: str,
        pass_s: Callable[[int], float] | None = None,
        picks: bool = True,
        wait: str = "sleep",
    ) -> None:
        if not picks:  # as a backend that cannot pick or draw on its device (MLX, an older llama.cpp): rows only
            self.forward_top2 = None
            self.forward_draws = None
        self._pass_s = pass_s
        self._wait = wait
        self._table = table
        self._tokens: list[int] = []
        self.seconds = 0.0  # time spent handing back rows (the "forward pass")
        self.cpu_seconds = 0.0  # ... of it, this thread's CPU time
        self.info = ModelInfo("llama", f"/table/{name}", name, "table", "CPU", 1 << 16)
        self.n_vocab, self.n_ctx, self.eog_ids = VOCAB, 1 << 16, frozenset({EOG})
        self._rows = np.empty((64, VOCAB), np.float32)
        self._top2: TopTwo | None = None  # every table row's best two, as a device picks them inside its pass
        self._cdfs: dict[float, np.ndarray] = {}  # every table row's softmax(row / T) CDF, by T: a device's draws
        self._probs: dict[float, np.ndarray] = {}  # ... and the softmax itself, float32 (what llama.cpp copies)
        self._drawn: tuple[float, list[int]] = (0.0, [])  # the last draws pass: its T and table rows
        self._tops: dict[tuple[float, int], tuple[np.ndarray, np.ndarray]] = {}  # (T, k): each row's k best, softmax
        self._drawn_top: list[tuple[np.ndarray, np.ndarray]] = []  # the last top-k draws pass's candidates
        self._uniforms = np.random.default_rng(0)

    @property
    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        t0, c0 = time.perf_counter(), time.thread_time()
        self._tokens += tokens
        picked = tokens if all_logits else tokens[-1:]
        out = self._rows[: len(picked)]  # one buffer, as llama.cpp's: valid until the next forward
        np.take(self._table, [t % LOOP for t in picked], axis=0, out=out)
        if self._pass_s is not None:
            wait_until(t0 + self._pass_s(len(tokens)), self._wait)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0
        return out

    def forward_top2(self, tokens: Sequence[int], *, all_rows: bool = True) -> TopTwo:
        """As llama.cpp's with a top-2 sampler in the graph: the picks are made inside the pass (timed with it; a
        GPU makes them in microseconds), and only they reach the host."""
        t0, c0 = time.perf_counter(), time.thread_time()
        self._tokens += tokens
        if self._top2 is None:
            self._top2 = TopTwo.of_rows(self._table)
        rows = [t % LOOP for t in (tokens if all_rows else tokens[-1:])]
        out = TopTwo(self._top2.ids[rows], self._top2.logits[rows])
        if self._pass_s is not None:
            wait_until(t0 + self._pass_s(len(tokens)), self._wait)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0
        return out

    def forward_draws(
        self,
        tokens: Sequence[int],
        temperature: float,
        rng: np.random.Generator,
        *,
        top_k: int = 0,
        probs: bool = True,
    ) -> list[int]:
        """As llama.cpp's with a dist sampler in the graph: each row's token drawn inside the pass (timed with it),
        and the ids and the softmax beside them reach the host (with a top_k: the k best's; the copies are not
        modelled, so `probs` changes nothing here)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        self._tokens += tokens
        if top_k:
            return self._draws_top(tokens, temperature, top_k, t0, c0)
        cdf = self._cdfs.get(temperature)
        if cdf is None:
            z = self._table.astype(np.float64) / temperature
            p = np.exp(z - z.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            self._probs[temperature] = p.astype(np.float32)
            cdf = self._cdfs[temperature] = np.cumsum(p, axis=1)
        draws = [min(int(np.searchsorted(cdf[t % LOOP], self._uniforms.random())), VOCAB - 1) for t in tokens]
        self._drawn = (temperature, [t % LOOP for t in tokens])
        if self._pass_s is not None:
            wait_until(t0 + self._pass_s(len(tokens)), self._wait)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0
        return draws

    def commit_draws(self, tokens: Sequence[int]) -> None:
        pass  # this table's uniforms are fresh for every row: nothing to move on

    def _draws_top(self, tokens: Sequence[int], temperature: float, k: int, t0: float, c0: float) -> list[int]:
        top = self._tops.get((temperature, k))
        if top is None:
            ids = np.argsort(-self._table, axis=1, kind="stable")[:, :k]
            z = np.take_along_axis(self._table, ids, axis=1).astype(np.float64) / temperature
            p = np.exp(z - z.max(axis=1, keepdims=True))
            top = self._tops[(temperature, k)] = (ids.astype(np.int64), (p / p.sum(axis=1, keepdims=True)))
        rows = [t % LOOP for t in tokens]
        cdf = np.cumsum(top[1], axis=1)
        draws = [int(top[0][r, min(int(np.searchsorted(cdf[r], self._uniforms.random())), k - 1)]) for r in rows]
        self._drawn = (temperature, rows)
        self._drawn_top = [(top[0][r], top[1][r].astype(np.float32)) for r in rows]
        if self._pass_s is not None:
            wait_until(t0 + self._pass_s(len(tokens)), self._wait)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.thread_time() - c0
        return draws

    def drawn_candidates(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self._drawn_top[i]

    def drawn_probs(self, i: int) -> np.ndarray:
        """Row i's softmax of the last draws pass, as llama.cpp copies it beside the draw (made with the pass)."""
        temperature, rows = self._drawn
        return self._probs[temperature][rows[i]]

    def rollback(self, n_keep: int) -> None:
        del self._tokens[n_keep:]

    def can_rollback(self, n_keep: int) -> bool:
        return True

    def checkpoint(self) -> None:
        pass

    def abort(self, on: bool = True) -> None:
        pass

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer(lambda t: b"x")

    def vocab_info(self) -> VocabInfo:
        return VocabInfo("table", VOCAB, None, EOG, False, False, [])

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) % LOOP for c in text]

    def close(self) -> None:
        pass


def make_table(seed: int = 0) -> np.ndarray:
    """Row t: token (t + 1) % LOOP on top, a runner-up 0.5 below it, the rest a spread of logits."""
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((LOOP, VOCAB)) * 2.0).astype(np.float32)
    for t in range(LOOP):
        table[t, (t + 1) % LOOP] = 20.0
        table[t, (t + 2) % LOOP] = 19.5
    return table


@dataclass(frozen=True)
class Case:
    method: str
    k: int
    temperature: float

    @property
    def label(self) -> str:
        return f"{self.method} k={self.k} {'greedy' if self.temperature == 0 else f'T={self.temperature}'}"


def run_case(
    table: np.ndarray, case: Case, rounds: int, wait: str = "sleep", prompt_len: int = 200, picks: bool = True
) -> dict[str, float]:
    """One run's own time per round; `wait`: how a pass's modelled time passes (WAITS), or "none" (no pass time:
    auto then sees free passes)."""
    timed = wait != "none"
    target = TableBackend(table, "target", h200_pass_s if timed else None, picks, wait)
    draft = TableBackend(table, "draft", (lambda n: 1.19e-3 * n) if timed else None, picks, wait)
    drafter = ModelDrafter(draft) if case.method == "model" else make_drafter(case.method, target, draft)  # type: ignore[arg-type]
    prompt = [i % LOOP for i in range(prompt_len)]  # the loop again and again: lookups match from the start
    config = GenerationConfig(max_tokens=rounds * (case.k + 1), num_draft=case.k,
                              sampling=SamplingParams(temperature=case.temperature, seed=1))  # fmt: skip
    n_rounds, done, cpu0 = 0, None, 0.0
    for i, ev in enumerate(generate(target, drafter, prompt, config)):  # type: ignore[arg-type]
        if i == 0:
            target.seconds = draft.seconds = target.cpu_seconds = draft.cpu_seconds = 0.0
            cpu0 = time.thread_time()
        if isinstance(ev, Done):
            done = ev
        elif ev.round is not None:
            n_rounds += 1
    assert done is not None and n_rounds
    st = done.stats
    own = (st.decode_s - target.seconds - draft.seconds) / n_rounds
    # The same on this thread's CPU clock: what a busy machine's other work does not inflate.
    own_cpu = (time.thread_time() - cpu0 - target.cpu_seconds - draft.cpu_seconds) / n_rounds
    return {"own_ms": own * 1e3, "own_cpu_ms": own_cpu * 1e3, "tokens_per_round": st.n_generated / n_rounds,
            "acceptance": st.acceptance_rate}  # fmt: skip


CASES = [Case(m, k, t) for m in ("model", "suffix", "auto") for t in (0.0, 0.7) for k in (4, 8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", help="METHOD:K:TEMPERATURE: profile one case instead")
    ap.add_argument("--wait", choices=("both", *WAITS, "none"), default="both",
                    help="how a pass's time passes: spin (CUDA), sleep (a blocking wait), both, or none (no pass "
                         "time: auto then sees free passes)")  # fmt: skip
    ap.add_argument("--prompt-tokens", type=int, default=200, help="context length (work that grows with it shows)")
    ap.add_argument("--only", help="a comma-separated list of case labels' methods to run (model,suffix,auto)")
    ap.add_argument("--sort", default="tottime", help="--profile: pstats sort key (tottime, cumulative, ...)")
    ap.add_argument("--lines", type=int, default=25, help="--profile: lines to print")
    ap.add_argument("--host-rows", action="store_true", help="no picks on the device: greedy rounds read whole rows")
    args = ap.parse_args()
    table = make_table()
    picks = not args.host_rows
    waits = WAITS if args.wait == "both" else (args.wait,)
    if args.profile:
        m, k, t = args.profile.split(":")
        case = Case(m, int(k), float(t))
        run_case(table, case, 20, waits[0], picks=picks)
        prof = cProfile.Profile()
        prof.enable()
        print(run_case(table, case, args.rounds, waits[0], picks=picks))
        prof.disable()
        pstats.Stats(prof).sort_stats(args.sort).print_stats(args.lines)
        return
    print(f"localspec's own time per round (ms), vocabulary {VOCAB:,}, a {args.prompt_tokens:,}-token context, median "
          f"of {args.reps} runs of {args.rounds} rounds; the host waits for each pass by: {', '.join(waits)}")  # fmt: skip
    print(f"{'case':24s}" + "".join(f" {w + ' own':>11s} {w + ' CPU':>11s}" for w in waits)
          + f" {'tokens/round':>12s} {'acceptance':>10s}")  # fmt: skip
    only = set(args.only.split(",")) if args.only else None
    for case in CASES:
        if only is not None and case.method not in only:
            continue
        cols, first = "", None
        for wait in waits:
            run_case(table, case, 10, wait, args.prompt_tokens, picks)  # warm-up
            runs = [run_case(table, case, args.rounds, wait, args.prompt_tokens, picks) for _ in range(args.reps)]
            own = statistics.median(r["own_ms"] for r in runs)
            cpu = statistics.median(r["own_cpu_ms"] for r in runs)
            cols += f" {own:11.3f} {cpu:11.3f}"
            first = first or runs[0]
        assert first is not None
        print(f"{case.label:24s}{cols} {first['tokens_per_round']:12.2f} {first['acceptance']:10.0%}")


if __name__ == "__main__":
    main()
