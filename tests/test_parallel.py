"""Several sequences in one target pass (parallel_decoder.ParallelDecoder) and their planned draft lengths
(decoding/parallel.py).

The policy's tests use a cost curve T(n) flat to 8 tokens, then steep (a GPU-like shape): one sequence drafts
long, eight draft nothing, and the plan's expected rate is never below plain batched decoding. The decoder
runs on a fake batch whose shared pass advances a fake clock by that curve, so the policy sees only what it
measured. Exactness: each of several sequences decoded together follows its target's joint distribution
(chi-square, exact rule, temperature 1, mixed draft lengths), and greedy answers decoded together equal
each answered alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
from fakes import FakeBackend, hashed_logits, noisy, without
from test_verify import (
    MODEL_PROMPT,
    NGRAM_PROMPT,
    P_TABLE,
    Q_TABLE,
    WINDOW,
    V,
    _draft_fn,
    _expected_joint,
    _target_fn,
    joint_check,
)

from localspec.decoding.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter
from localspec.decoding.engine import Done, Event, GenerationConfig, generate
from localspec.decoding.parallel import Candidate, plan_parallel
from localspec.decoding.parallel_decoder import Job, ParallelDecoder
from localspec.decoding.policy import MARGIN, Controller, CostModel
from localspec.sampling import SamplingParams


def steep_after_8(n: int) -> float:
    """T(n): 10 ms up to 8 tokens (spare compute), then 10 ms more per token."""
    return 0.01 if n <= 8 else 0.01 + 0.01 * (n - 8)


# -- the policy ---------------------------------------------------------------------------------------


def test_one_sequence_drafts_long_on_a_flat_curve() -> None:
    plan = plan_parallel([Candidate((0.8,) * 8)], steep_after_8)
    assert plan.lengths == (7,)  # the batch fills the flat part exactly
    assert plan.rate > 3 * plan.plain_rate


def test_eight_sequences_draft_nothing_where_the_curve_turns_steep() -> None:
    plan = plan_parallel([Candidate((0.8,) * 8)] * 8, steep_after_8)
    assert plan.lengths == (0,) * 8
    assert plan.rate == pytest.approx(plan.plain_rate)


def test_four_sequences_share_the_spare_room_by_acceptance() -> None:
    """The flat part has 4 spare tokens: the likelier drafts take them."""
    plan = plan_parallel(
        [Candidate((0.9,) * 8), Candidate((0.3,) * 8), Candidate((0.9,) * 8), Candidate(())], steep_after_8
    )
    assert plan.batch == 8
    assert plan.lengths[0] >= 2 and plan.lengths[2] >= 2 and plan.lengths[1] == 0 and plan.lengths[3] == 0


def padded(lengths: Sequence[int]) -> int:
    """A right-padded batch's positions (MLX): rows x the longest part."""
    return len(lengths) * max(lengths)


@pytest.mark.parametrize("n", range(1, 13))
@pytest.mark.parametrize("alpha", [0.05, 0.5, 0.95])
@pytest.mark.parametrize("size", [None, padded])
def test_the_plan_is_never_below_plain_batched_decoding(n: int, alpha: float, size: Callable | None) -> None:
    candidates = [Candidate((alpha,) * 6, draft_s=0.001)] * n
    plan = (
        plan_parallel(candidates, steep_after_8)
        if size is None
        else plan_parallel(candidates, steep_after_8, size, padded=True)
    )
    assert plan.rate >= plan.plain_rate
    assert plan.plain_rate == pytest.approx(n / steep_after_8(n))


def test_a_padded_batch_spreads_the_spare_room_evenly() -> None:
    """The same four sequences as above: one batch of tokens gives the likely drafts 4 tokens between them; a
    right-padded one pays every row for the longest draft, so one token each fills its 8 positions."""
    candidates = [Candidate((0.9,) * 8), Candidate((0.3,) * 8), Candidate((0.9,) * 8), Candidate(())]
    summed = plan_parallel(candidates, steep_after_8)
    even = plan_parallel(candidates, steep_after_8, padded, padded=True)
    assert max(summed.lengths) >= 2
    assert even.lengths == (1, 1, 1, 0) and padded([1 + j for j in even.lengths]) == 8
    assert even.rate > even.plain_rate


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("draft_s", [0.0, 0.002, 0.02])
def test_one_sequence_reduces_to_autos_choice(alpha: float, draft_s: float) -> None:
    """With one sequence the plan is auto's best model-draft length (policy.Controller, no rollback cost)."""
    costs = CostModel(target={n: steep_after_8(n) for n in range(1, 12)}, draft_token=draft_s)
    controller = Controller(costs)
    for _ in range(40):  # teach it this acceptance
        controller.model_accept.update(round(alpha * 10), 10)
    a = controller.model_accept.alpha
    best = controller.best("model", 8)
    plan = plan_parallel([Candidate((a,) * 8, draft_s)], costs.target_s)
    expected = best.k if best.rate > controller.plain_rate() * (1 + MARGIN) else 0  # Controller.plan's rule
    assert plan.lengths == (expected,)


def test_nothing_measured_means_plain_decoding() -> None:
    plan = plan_parallel([Candidate((0.9,) * 4)] * 2, lambda n: float("nan"))
    assert plan.lengths == (0, 0)


# -- the decoder on a fake batch ----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeParallel:
    """Fake backends as the sequences of one batched target: a shared pass advances the clock by T(total)."""

    def __init__(self, fn: Callable[[Sequence[int]], np.ndarray], n: int, clock: FakeClock, **kw: object) -> None:
        self.sequences = [FakeBackend(fn, name=f"seq{i}", **kw) for i in range(n)]  # type: ignore[arg-type]
        self.clock = clock
        self.passes: list[list[int]] = []  # each pass's part sizes

    prefill_apart = False
    pass_padded = False

    def pass_size(self, lengths: Sequence[int]) -> int:
        return sum(lengths)

    def forward_many(self, parts: Sequence[tuple[int, Sequence[int]]]) -> list[np.ndarray]:
        self.passes.append([len(t) for _, t in parts])
        self.clock.now += steep_after_8(sum(len(t) for _, t in parts))
        return [self.sequences[s].forward(t).copy() for s, t in parts]


TARGET = without(hashed_logits(1))
GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [
    list(b"The quick brown fox jumps. The quick brown"),
    list(b"abcabcabcabc"),
    list(b"Once upon a time"),
    list(b"0123456789"),
    list(b"hello hello hello"),
    list(b"zyx"),
    list(b"print(print(print("),
    list(b"A B C D"),
]


def _drive(decoder: ParallelDecoder, jobs: dict[int, Job]) -> dict[int, Done]:
    events: dict[int, list[Event]] = {key: decoder.add(key, job) for key, job in jobs.items()}
    while decoder.members:
        for key, event in decoder.step():
            events[key].append(event)
    done = {key: evs[-1] for key, evs in events.items()}
    assert all(isinstance(d, Done) for d in done.values())
    return done  # type: ignore[return-value]


def _self_drafter() -> Drafter:
    return ModelDrafter(FakeBackend(TARGET, name="self-draft"))


def _jobs(batch: FakeParallel, n: int, drafter: Callable[[], Drafter], **config: object) -> dict[int, Job]:
    cfg = GenerationConfig(**{"sampling": GREEDY, "max_tokens": 60, "num_draft": 8, **config})  # type: ignore[arg-type]
    return {i: Job(i, batch.sequences[i], drafter(), PROMPTS[i], cfg) for i in range(n)}


def test_one_sequence_drafts_long_eight_draft_nothing_on_the_measured_curve() -> None:
    clock = FakeClock()
    batch = FakeParallel(TARGET, 8, clock)
    _drive(ParallelDecoder(batch, clock=clock), _jobs(batch, 1, _self_drafter))
    late = [p[0] - 1 for p in batch.passes[len(batch.passes) // 2 :]]
    assert np.median(late) >= 5  # a perfect drafter fills the flat part of the curve

    clock = FakeClock()
    batch = FakeParallel(TARGET, 8, clock)
    decoder = ParallelDecoder(batch, clock=clock)
    _drive(decoder, _jobs(batch, 8, _self_drafter, max_tokens=30))
    full = [p for p in batch.passes if len(p) == 8]
    drafted = sum(sum(n - 1 for n in p) for p in full)
    assert drafted <= len(full)  # at most the cold start's probes: about nothing per sequence
    assert decoder.last_pass is not None and decoder.last_pass.n_sequences >= 1


def test_a_model_drafting_sequence_starts_from_the_draft_models_cost_not_free() -> None:
    """A sequence whose drafter drafts with a model (serve --parallel lends it one) is planned from the draft
    model's remembered cost per token, or a cautious prior, before its own are measured: its steps stall every
    sequence of the pass. With a draft token as dear as a target pass, the first shared pass drafts nothing;
    taken as free (a lookup's cost), it drafts."""
    curve = {n: steep_after_8(n) for n in range(1, 33)}
    drafted = {}
    for model_drafts in (False, True):
        clock = FakeClock()
        batch = FakeParallel(TARGET, 4, clock)
        decoder = ParallelDecoder(batch, clock=clock, costs=CostModel(dict(curve), draft_token=steep_after_8(1)))
        cfg = GenerationConfig(sampling=GREEDY, max_tokens=20, num_draft=8)
        for i in range(4):
            decoder.add(i, Job(i, batch.sequences[i], _self_drafter(), PROMPTS[i], cfg, model_drafts=model_drafts))
        decoder.step()
        drafted[model_drafts] = sum(batch.passes[-1]) - 4
    assert drafted[False] > 0 and drafted[True] == 0
    prior = ParallelDecoder(FakeParallel(TARGET, 1, FakeClock()), costs=CostModel(dict(curve)))._draft_prior()
    assert prior == pytest.approx(0.25 * steep_after_8(1))  # nothing remembered: a quarter of T(1)


def test_planned_lengths_beat_fixed_k_with_eight_sequences() -> None:
    """Aggregate tokens per (fake) second: the planned lengths vs every sequence drafting its full k."""
    rates = {}
    for aware in (True, False):
        clock = FakeClock()
        batch = FakeParallel(TARGET, 8, clock)
        done = _drive(ParallelDecoder(batch, clock=clock, planned=aware), _jobs(batch, 8, NgramDrafter, max_tokens=40))
        rates[aware] = sum(len(d.tokens) for d in done.values()) / clock.now
    assert rates[True] > rates[False]


@pytest.mark.parametrize("drafter", [NoDrafter, NgramDrafter, lambda: ModelDrafter(FakeBackend(noisy(TARGET, 5, 2.0)))])
def test_greedy_answers_together_equal_each_alone(drafter: Callable[[], Drafter]) -> None:
    clock = FakeClock()
    batch = FakeParallel(TARGET, 5, clock)
    together = _drive(ParallelDecoder(batch, clock=clock), _jobs(batch, 5, drafter, num_draft=4))
    for i in range(5):
        cfg = GenerationConfig(max_tokens=60, num_draft=4, sampling=GREEDY)
        alone = list(generate(FakeBackend(TARGET), drafter(), PROMPTS[i], cfg))[-1]
        assert isinstance(alone, Done)
        assert together[i].tokens == alone.tokens
        assert together[i].text == alone.text


def test_a_cancelled_sequence_ends_stopped_and_the_others_go_on() -> None:
    clock = FakeClock()
    batch = FakeParallel(TARGET, 3, clock)
    decoder = ParallelDecoder(batch, clock=clock)
    for i, job in _jobs(batch, 3, NgramDrafter, max_tokens=20).items():
        decoder.add(i, job)
    decoder.step()
    stopped = decoder.cancel(1)
    assert isinstance(stopped[-1], Done) and stopped[-1].stats.stop_reason == "stopped"
    ends = {}
    while decoder.members:
        ends |= {k: e for k, e in decoder.step() if isinstance(e, Done)}
    assert set(ends) == {0, 2} and all(len(d.tokens) == 20 for d in ends.values())


# -- exactness of each sequence decoded together --------------------------------------------------------

N_DRAWS = 8000


def test_each_sequence_decoded_together_is_distributed_as_its_target() -> None:
    """Three sequences share every pass: a model draft of 2, a lookup draft of 2, a model draft of 1 (planned
    lengths off, so the drafts stay mixed). Each one's first WINDOW tokens follow the target exactly."""
    specs = [  # (prompt, drafter, k)
        (MODEL_PROMPT, lambda: ModelDrafter(FakeBackend(_draft_fn(Q_TABLE), n_vocab=V, eog=frozenset())), 2),
        (NGRAM_PROMPT, lambda: NgramDrafter(max_ngram=2), 2),
        ([2, 3], lambda: ModelDrafter(FakeBackend(_draft_fn(Q_TABLE), n_vocab=V, eog=frozenset())), 1),
    ]
    clock = FakeClock()
    batch = FakeParallel(_target_fn(P_TABLE), 3, clock, n_vocab=V, eog=frozenset())
    drafters = [make() for _, make, _ in specs]
    samples: list[list[tuple[int, ...]]] = [[] for _ in specs]
    for draw in range(N_DRAWS):
        decoder = ParallelDecoder(batch, clock=clock, planned=False)
        jobs = {
            i: Job(
                i,
                batch.sequences[i],
                drafters[i],
                prompt,
                GenerationConfig(
                    max_tokens=WINDOW, num_draft=k, sampling=SamplingParams(temperature=1.0, seed=draw * 7 + i)
                ),
            )
            for i, (prompt, _, k) in enumerate(specs)
        }
        for i, d in _drive(decoder, jobs).items():
            samples[i].append(d.tokens)
    sizes = {tuple(p) for p in batch.passes}
    assert (3, 3, 2) in sizes  # the sequences were verified together, with mixed draft lengths
    for i, (prompt, _, _) in enumerate(specs):
        failure = joint_check(lambda n, i=i: samples[i][n], _expected_joint(prompt, WINDOW), N_DRAWS)
        assert failure is None, f"sequence {i}: {failure}"


class SwappedParallel(FakeParallel):
    """A broken batch: every part gets the next part's rows (what mixing up sequences in a pass would do)."""

    def forward_many(self, parts: Sequence[tuple[int, Sequence[int]]]) -> list[np.ndarray]:
        rows = super().forward_many(parts)
        swapped = rows[1:] + rows[:1]
        return swapped if all(a.shape == b.shape for a, b in zip(rows, swapped)) else rows


def test_the_together_check_catches_rows_given_to_the_wrong_sequence() -> None:
    """The same check fails when the pass hands a sequence another one's rows (the test's own test)."""
    clock = FakeClock()
    batch = SwappedParallel(_target_fn(P_TABLE), 2, clock, n_vocab=V, eog=frozenset())
    drafters = [ModelDrafter(FakeBackend(_draft_fn(Q_TABLE), n_vocab=V, eog=frozenset())) for _ in range(2)]
    samples = []
    for draw in range(2000):
        decoder = ParallelDecoder(batch, clock=clock, planned=False)
        cfg = GenerationConfig(max_tokens=WINDOW, num_draft=2, sampling=SamplingParams(temperature=1.0, seed=draw))
        jobs = {
            i: Job(i, batch.sequences[i], drafters[i], prompt, cfg) for i, prompt in enumerate([MODEL_PROMPT, [2, 3]])
        }
        samples.append(_drive(decoder, jobs)[0].tokens)
    assert joint_check(lambda n: samples[n], _expected_joint(MODEL_PROMPT, WINDOW), 2000) is not None


class Forecasting(ModelDrafter):
    """A drafter that forecasts its drafts as nearly sure (as auto does for a long copy)."""

    def forecast(self, context: Sequence[int], k: int) -> tuple[float, ...]:
        return (0.99,) * k


def test_a_drafters_forecast_buys_drafts_the_measured_prior_would_not() -> None:
    """Each extra token costs half a single one: at the decoder's prior acceptance (0.6) no draft pays, at the
    drafter's own forecast (0.99, auto's for a long copy) drafts do; the first pass shows which."""
    half = {n: 0.01 + 0.005 * (n - 1) for n in range(1, 40)}
    for drafter, drafts in ((ModelDrafter, False), (Forecasting, True)):
        clock = FakeClock()
        batch = FakeParallel(TARGET, 2, clock)
        decoder = ParallelDecoder(batch, clock=clock, costs=CostModel(dict(half)))
        for i, job in _jobs(batch, 2, lambda d=drafter: d(FakeBackend(TARGET)), num_draft=4).items():
            decoder.add(i, job)
        decoder.step()
        assert (max(batch.passes[-1]) > 1) == drafts, (drafter.__name__, batch.passes)
