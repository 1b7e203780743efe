"""Verification rules: exactness of speculative sampling through the real engine, and greedy cases.

The exactness test runs the engine's full round logic (prefill, draft, one batched verify, accept,
rollback, emit) many times on a toy vocabulary and compares the joint distribution of the emitted
tokens with the exact product of the target's conditionals. Deliberately broken rules must fail the
same check: they are the test's own test.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from fakes import DrawingBackend, FakeBackend

from localspec.decoding import drafters, verify
from localspec.decoding.drafters import ModelDrafter, NgramDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.verify import Verdict, verify_exact, verify_greedy, verify_match
from localspec.sampling import SamplingParams, probabilities, sample

# -- the toy pair -----------------------------------------------------------------------------------

V = 4
K = 2
WINDOW = K + 2  # the prefill's token, then one full round: k drafts + the bonus
N_SAMPLES = 20_000
ALPHA = 1e-6


def _normalize(rows: np.ndarray) -> np.ndarray:
    return rows / rows.sum(axis=-1, keepdims=True)


def _target_table() -> np.ndarray:
    """p(x | a, b) for the last two tokens (a, b): [V, V, V], with zeros the draft does not share."""
    rng = np.random.default_rng(20261130)
    p = rng.dirichlet(np.full(V, 0.8), size=(V, V))
    for a, b in itertools.product(range(V), repeat=2):
        p[a, b, (a + 2 * b + 1) % V] = 0.0  # one impossible token per context, depending on both
    p[1, 2, :] = [0.0, 0.0, 0.3, 0.7]
    return _normalize(p)


def _draft_table() -> np.ndarray:
    """q(x | b) for the last token only: [V, V]; zero where the target is likely, mass where it is zero."""
    q = np.array(
        [
            [0.40, 0.30, 0.00, 0.30],
            [0.10, 0.00, 0.60, 0.30],
            [0.00, 0.50, 0.25, 0.25],
            [0.25, 0.25, 0.50, 0.00],
        ]
    )
    return _normalize(q)


P_TABLE = _target_table()
Q_TABLE = _draft_table()


def _log(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(p)  # zero probability -> -inf logits


def _target_fn(table: np.ndarray) -> Callable[[Sequence[int]], np.ndarray]:
    logp = _log(table)
    return lambda ctx: logp[ctx[-2] if len(ctx) > 1 else 0, ctx[-1]]


def _draft_fn(table: np.ndarray) -> Callable[[Sequence[int]], np.ndarray]:
    logq = _log(table)
    return lambda ctx: logq[ctx[-1]]


def _expected_joint(prompt: Sequence[int], n: int, p_table: np.ndarray = P_TABLE) -> dict[tuple[int, ...], float]:
    """Exact P(x1..xn | prompt) = prod of target conditionals, for every sequence."""
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(V), repeat=n):
        ctx = list(prompt)
        prob = 1.0
        for x in seq:
            prob *= p_table[ctx[-2], ctx[-1], x]
            ctx.append(x)
        out[seq] = prob
    return out


# -- the statistics ---------------------------------------------------------------------------------


def chi2_sf(x: float, df: int) -> float:
    """Chi-square survival function, exact closed forms for integer df (no scipy needed)."""
    if x <= 0:
        return 1.0
    h = x / 2
    if df % 2 == 0:
        terms = (math.exp(i * math.log(h) - h - math.lgamma(i + 1)) for i in range(df // 2))
        return min(1.0, sum(terms))
    terms = (math.exp((i + 0.5) * math.log(h) - h - math.lgamma(i + 1.5)) for i in range(df // 2))
    return min(1.0, math.erfc(math.sqrt(h)) + sum(terms))


def test_chi2_sf_matches_known_values() -> None:
    # Reference values (scipy.stats.chi2.sf).
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(5.991464547107979, 2) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(7.814727903251178, 3) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(23.20925115620080, 10) == pytest.approx(0.01, rel=1e-9)
    assert chi2_sf(124.3421134, 100) == pytest.approx(0.05, rel=1e-6)
    assert chi2_sf(0.0, 5) == 1.0


def joint_check(draw: Callable[[int], tuple[int, ...]], expected: dict[tuple[int, ...], float], n: int) -> str | None:
    """Draw n samples; None if they fit `expected`, else why not. An impossible sample fails at once."""
    counts: Counter[tuple[int, ...]] = Counter()
    for i in range(n):
        seq = draw(i)
        if expected.get(seq, 0.0) <= 0.0:
            return f"impossible sample {seq} (draw {i})"
        counts[seq] += 1
    # Pool the cells expected fewer than 5 times so the chi-square approximation holds.
    stat, pooled_obs, pooled_exp, n_bins = 0.0, 0, 0.0, 0
    for seq, prob in expected.items():
        if prob <= 0.0:
            continue
        e, o = n * prob, counts.get(seq, 0)
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
            continue
        stat += (o - e) ** 2 / e
        n_bins += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        n_bins += 1
    pvalue = chi2_sf(stat, n_bins - 1)
    if pvalue < ALPHA:
        worst = sorted(expected, key=lambda s: -abs(counts.get(s, 0) - n * expected[s]))[:3]
        detail = ", ".join(f"{s}: {counts.get(s, 0)} vs {n * expected[s]:.0f}" for s in worst)
        return f"chi-square {stat:.1f} on {n_bins - 1} df, p = {pvalue:.2e} (worst: {detail})"
    return None


# -- the engine runs --------------------------------------------------------------------------------

MODEL_PROMPT = [0, 1]
NGRAM_PROMPT = [1, 2, 3, 0, 2, 1, 3, 3, 1, 0, 1, 2, 0, 0, 1]  # repeats: lookup proposes often


def _engine_draw(
    drafter_kind: str,
    rule: str,
    prompt: Sequence[int],
    target: FakeBackend | None = None,
    num_draft: int = K,
    window: int = WINDOW,
    draft: FakeBackend | None = None,
) -> Callable[[int], tuple[int, ...]]:
    target = target or FakeBackend(_target_fn(P_TABLE), n_vocab=V, eog=frozenset(), name="toy-target")
    if drafter_kind == "model":
        drafter = ModelDrafter(draft or FakeBackend(_draft_fn(Q_TABLE), n_vocab=V, eog=frozenset(), name="toy-draft"))
    else:
        drafter = NgramDrafter(max_ngram=2)

    def draw(seed: int) -> tuple[int, ...]:
        config = GenerationConfig(
            max_tokens=window, num_draft=num_draft, rule=rule, sampling=SamplingParams(temperature=1.0, seed=seed)
        )
        done = None
        for event in generate(target, drafter, prompt, config):
            if isinstance(event, Done):
                done = event
        assert done is not None and len(done.tokens) == window
        return done.tokens

    return draw


def test_toy_pair_exercises_every_branch() -> None:
    """The toy pair has zeros on both sides where they matter, and the window covers a full round."""
    # The draft can propose a token the target never emits, and the target has mass the draft lacks.
    assert any(Q_TABLE[b, x] > 0 and P_TABLE[a, b, x] == 0 for a, b, x in itertools.product(range(V), repeat=3))
    assert any(Q_TABLE[b, x] == 0 and P_TABLE[a, b, x] > 0 for a, b, x in itertools.product(range(V), repeat=3))
    target = FakeBackend(_target_fn(P_TABLE), n_vocab=V, eog=frozenset())
    drafter = ModelDrafter(FakeBackend(_draft_fn(Q_TABLE), n_vocab=V, eog=frozenset()))
    kinds = Counter()
    for seed in range(300):
        config = GenerationConfig(max_tokens=WINDOW, num_draft=K, sampling=SamplingParams(temperature=1.0, seed=seed))
        events = list(generate(target, drafter, MODEL_PROMPT, config))
        first_round = next(e.round for e in events if getattr(e, "round", None) is not None)
        assert first_round.k == K  # the first round drafts the full k inside the window
        kinds[(first_round.n_accepted, first_round.kind)] += 1
    assert {(0, "recovered"), (1, "recovered"), (K, "bonus")} <= set(kinds)


@pytest.mark.parametrize(
    ("drafter_kind", "rule", "prompt"),
    [
        ("model", "exact", MODEL_PROMPT),
        ("model", "match", MODEL_PROMPT),
        ("ngram", "exact", NGRAM_PROMPT),
        ("ngram", "match", NGRAM_PROMPT),
    ],
)
def test_engine_output_is_distributed_as_the_target(drafter_kind: str, rule: str, prompt: list[int]) -> None:
    failure = joint_check(_engine_draw(drafter_kind, rule, prompt), _expected_joint(prompt, WINDOW), N_SAMPLES)
    assert failure is None, failure


@pytest.fixture
def draws_in_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fakes' backend listed as one that draws in its passes (BackendSpec.draws_on_device)."""
    import dataclasses

    from localspec.backends import registry

    monkeypatch.setitem(registry.BACKENDS, "fake", dataclasses.replace(registry.LLAMA, name="fake"))


DRAW_WINDOW = 5  # one token a round at least, k = 1: two rounds or more, the second's draws after the first's


def _drawing_draft(**kw: float) -> DrawingBackend:
    return DrawingBackend(_draft_fn(Q_TABLE), n_vocab=V, eog=frozenset(), name="toy-draft", **kw)  # type: ignore[arg-type]


@pytest.mark.usefixtures("draws_in_pass")
@pytest.mark.parametrize(
    ("drafter_kind", "rule", "prompt", "num_draft", "window", "drawing_draft"),
    [
        ("ngram", "exact", NGRAM_PROMPT, 1, DRAW_WINDOW, False),
        ("model", "match", MODEL_PROMPT, K, WINDOW, False),
        ("model", "exact", MODEL_PROMPT, K, WINDOW, False),
        ("model", "exact", MODEL_PROMPT, K, WINDOW, True),
        ("model", "exact", MODEL_PROMPT, K, WINDOW, 2),
    ],
)
def test_engine_output_from_draws_made_in_the_pass_is_distributed_as_the_target(
    drafter_kind: str,
    rule: str,
    prompt: list[int],
    num_draft: int,
    window: int,
    drawing_draft: bool | int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sampled round reads one token a row, drawn in the target's pass (llama.cpp's dist sampler, here its fake
    with the same uniform stream), and the few numbers of the rows' softmax the rule needs. A one-hot draft (or the
    match rule): accepting while the draw equals the draft token is the exact rule. A model draft: p(d) / q(d)
    read from the softmax, the draw the residual's first proposal; its q from host rows, or drawn by the draft
    model in its own passes too (from its rows' top-k softmax: with k = 2 < V, a q unlike the draft model's own,
    which the rule grades as it is). Only the prompt's pass hands the target's rows back."""
    if drawing_draft is not True and drawing_draft:
        assert (Q_TABLE > 0).sum(axis=1).max() > drawing_draft  # the cut drops tokens the draft model gives mass
        monkeypatch.setattr(drafters, "DRAFT_TOP_K", drawing_draft)
    target = DrawingBackend(_target_fn(P_TABLE), n_vocab=V, eog=frozenset(), name="toy-target")
    draft = _drawing_draft() if drawing_draft else None
    draw = _engine_draw(drafter_kind, rule, prompt, target, num_draft, window, draft)
    failure = joint_check(draw, _expected_joint(prompt, window), N_SAMPLES)
    assert failure is None, failure
    assert len(target.row_calls) == N_SAMPLES  # one a run: the prompt's (its first token is the host's draw)
    assert len(target.draw_calls) >= N_SAMPLES and max(target.draw_calls) == num_draft + 1
    if draft is not None:  # the draft model's passes: rows only where prepare reads the prompt, then draws
        assert len(draft.row_calls) <= N_SAMPLES and len(draft.draw_calls) >= N_SAMPLES * K


@pytest.mark.usefixtures("draws_in_pass")
def test_draws_whose_uniforms_are_used_again_fail_the_check() -> None:
    """The test's own test: a backend that loses the commits hands each pass the uniforms of the last one, so the
    second round's draws follow the first's. The same check must catch it."""
    target = DrawingBackend(_target_fn(P_TABLE), n_vocab=V, eog=frozenset(), name="toy-target", commits=False)
    draw = _engine_draw("ngram", "exact", NGRAM_PROMPT, target, 1, DRAW_WINDOW)
    assert joint_check(draw, _expected_joint(NGRAM_PROMPT, DRAW_WINDOW), N_SAMPLES) is not None


@pytest.mark.usefixtures("draws_in_pass")
@pytest.mark.parametrize("side", ["target", "draft"])
def test_a_softmax_unlike_the_draws_fails_the_check(side: str) -> None:
    """The test's own test for model drafts: the rule reads p(d) or q(d) from the backend's softmax, so a softmax at
    another temperature than the draws (a wrong chain, a stale row) must show in the output."""
    kw = {"probs_t": 2.0}
    target = DrawingBackend(_target_fn(P_TABLE), n_vocab=V, eog=frozenset(), name="toy-target",
                            **(kw if side == "target" else {}))  # fmt: skip
    draw = _engine_draw("model", "exact", MODEL_PROMPT, target, draft=_drawing_draft(**(kw if side == "draft" else {})))
    assert joint_check(draw, _expected_joint(MODEL_PROMPT, WINDOW), N_SAMPLES) is not None


@pytest.mark.usefixtures("draws_in_pass")
def test_a_model_draft_of_another_width_reads_rows() -> None:
    """A draft vocabulary of another width than the target's (padding) cannot be graded against the backend's
    softmax row for row: the run reads rows from then on."""
    target = DrawingBackend(_target_fn(P_TABLE), n_vocab=V, eog=frozenset(), name="toy-target")
    wide = FakeBackend(lambda ctx: np.append(_draft_fn(Q_TABLE)(ctx), -np.inf), n_vocab=V + 1, eog=frozenset())
    _engine_draw("model", "exact", MODEL_PROMPT, target, draft=wide)(0)
    assert target.draw_calls == [] and target.row_calls[1] == K + 1  # the prompt's rows, then the round's


FILTERS = SamplingParams(temperature=0.5, top_k=3, top_p=0.8)  # no min-p: it can hide a wrong filter order


def test_engine_output_with_filters_is_distributed_as_the_processed_target() -> None:
    """Temperature, top-k and top-p on both models, through generate() with a model drafter: the output
    follows the target processed by the independent reference (tests/sampling_reference.py)."""
    from sampling_reference import reference_table

    kw = {"t": FILTERS.temperature, "top_k": FILTERS.top_k, "top_p": FILTERS.top_p}
    p_ref = reference_table(_log(P_TABLE), **kw)
    # the case tells a wrong order apart: the nucleus chosen before the temperature is another set
    assert not np.array_equal(p_ref > 0, reference_table(_log(P_TABLE), top_k=FILTERS.top_k, top_p=FILTERS.top_p) > 0)
    target = FakeBackend(_target_fn(P_TABLE), n_vocab=V, eog=frozenset(), name="toy-target")
    drafter = ModelDrafter(FakeBackend(_draft_fn(Q_TABLE), n_vocab=V, eog=frozenset(), name="toy-draft"))
    accepted = 0

    def draw(seed: int) -> tuple[int, ...]:
        nonlocal accepted
        sampling = SamplingParams(FILTERS.temperature, FILTERS.top_k, FILTERS.top_p, seed=seed)
        config = GenerationConfig(max_tokens=WINDOW, num_draft=K, rule="exact", sampling=sampling)
        done = [e for e in generate(target, drafter, MODEL_PROMPT, config) if isinstance(e, Done)][0]
        accepted += done.stats.n_accepted
        return done.tokens

    failure = joint_check(draw, _expected_joint(MODEL_PROMPT, WINDOW, p_ref), N_SAMPLES)
    assert failure is None, failure
    assert accepted > N_SAMPLES // 4  # the drafts were used, not just rejected


# -- broken rules: the check must catch each --------------------------------------------------------


def _exact_variant(*, residual: str = "max0", bonus: str = "p_k", ratio: str = "p/q") -> verify.Rule:
    """verify_exact with one deliberate mistake (for testing the test)."""

    def rule(draft: Sequence[int], q: np.ndarray | None, p: np.ndarray, rng: np.random.Generator) -> Verdict:
        if not draft:  # a round with nothing drafted: the target's own sample
            return Verdict(0, sample(p[0], rng), "bonus")
        assert q is not None
        for i, d in enumerate(draft):
            a = p[i, d] / q[i, d] if ratio == "p/q" else (q[i, d] / p[i, d] if p[i, d] > 0 else np.inf)
            if rng.random() < min(1.0, a):
                continue
            res = np.maximum(p[i] - q[i], 0.0) if residual == "max0" else p[i]
            return Verdict(i, sample(res if res.sum() > 0 else p[i], rng), "recovered")
        k = len(draft)
        row = {"p_k": p[k], "q": q[k - 1], "p_k-1": p[k - 1]}[bonus]
        return Verdict(k, sample(row, rng), "bonus")

    return rule


def test_reference_variant_passes() -> None:
    """The harness's own copy of the rule, without a mistake, passes (so failures below are the mistakes)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(verify.RULES, "exact", _exact_variant())
        failure = joint_check(
            _engine_draw("model", "exact", MODEL_PROMPT), _expected_joint(MODEL_PROMPT, WINDOW), N_SAMPLES
        )
    assert failure is None, failure


@pytest.mark.parametrize(
    "mistake",
    [
        {"residual": "p"},  # recovered token from p instead of normalize(max(0, p - q))
        {"bonus": "q"},  # bonus token from the draft's distribution
        {"bonus": "p_k-1"},  # bonus token from the wrong context (row k-1)
        {"ratio": "q/p"},  # acceptance ratio upside down
    ],
    ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()),
)
def test_broken_rules_fail_the_check(monkeypatch: pytest.MonkeyPatch, mistake: dict[str, str]) -> None:
    monkeypatch.setitem(verify.RULES, "exact", _exact_variant(**mistake))
    failure = joint_check(
        _engine_draw("model", "exact", MODEL_PROMPT), _expected_joint(MODEL_PROMPT, WINDOW), N_SAMPLES
    )
    assert failure is not None


# -- a fast complement: verify_exact in a hand-written round loop -----------------------------------


def _round_loop_draw(
    rule: verify.Rule, prompt: Sequence[int], seed: int, p_table: np.ndarray = P_TABLE, q_table: np.ndarray = Q_TABLE
) -> Callable[[int], tuple[int, ...]]:
    """One hand-written round from `prompt` with `rule`, completed to k+1 tokens from the target."""
    rng = np.random.default_rng(seed)

    def draw(_: int) -> tuple[int, ...]:
        ctx = list(prompt)
        draft, q_rows = [], []
        for _ in range(K):
            q = q_table[ctx[-1]]
            d = sample(q, rng)
            draft.append(d)
            q_rows.append(q)
            ctx.append(d)
        p = np.stack([p_table[ctx[i - 2], ctx[i - 1]] for i in range(len(prompt), len(prompt) + K + 1)])
        v = rule(draft, np.stack(q_rows), p, rng)
        return _finish(prompt, [*draft[: v.n_accepted], v.token], rng, p_table)

    return draw


@pytest.mark.parametrize("rule", [verify_exact, verify_match, _exact_variant()], ids=["exact", "match", "reference"])
def test_verify_round_loop_is_exact(rule: verify.Rule) -> None:
    """One round from a fixed context, calling the rule directly: the k+1 tokens follow the target."""
    prompt = [3, 2]
    failure = joint_check(_round_loop_draw(rule, prompt, 7), _expected_joint(prompt, K + 1), N_SAMPLES)
    assert failure is None, failure


@pytest.mark.parametrize(
    "mistake",
    [{"residual": "p"}, {"bonus": "q"}, {"bonus": "p_k-1"}, {"ratio": "q/p"}],
    ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()),
)
def test_verify_round_loop_catches_broken_rules(mistake: dict[str, str]) -> None:
    prompt = [3, 2]
    draw = _round_loop_draw(_exact_variant(**mistake), prompt, 7)
    assert joint_check(draw, _expected_joint(prompt, K + 1), N_SAMPLES) is not None


SMOOTH_P, SMOOTH_Q, SMOOTH_PROMPT = _normalize(P_TABLE + 0.05), _normalize(Q_TABLE + 0.05), [3, 2]


def test_round_loop_without_zeros_is_exact() -> None:
    expected = _expected_joint(SMOOTH_PROMPT, K + 1, SMOOTH_P)
    draw = _round_loop_draw(verify_exact, SMOOTH_PROMPT, 7, SMOOTH_P, SMOOTH_Q)
    failure = joint_check(draw, expected, N_SAMPLES)
    assert failure is None, failure


@pytest.mark.parametrize(
    "mistake",
    [{"residual": "p"}, {"bonus": "q"}, {"bonus": "p_k-1"}, {"ratio": "q/p"}],
    ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()),
)
def test_chi_square_alone_catches_broken_rules(mistake: dict[str, str]) -> None:
    """Without zeros no sample is impossible: the chi-square part of the check must catch each mistake."""
    expected = _expected_joint(SMOOTH_PROMPT, K + 1, SMOOTH_P)
    draw = _round_loop_draw(_exact_variant(**mistake), SMOOTH_PROMPT, 7, SMOOTH_P, SMOOTH_Q)
    failure = joint_check(draw, expected, N_SAMPLES)
    assert failure is not None and failure.startswith("chi-square")


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.7, top_k=3), SamplingParams(temperature=1.5, top_p=0.8, min_p=0.05)],
    ids=["t0.7-topk3", "t1.5-topp0.8-minp0.05"],
)
def test_verify_exact_round_loop_is_exact_after_filters(params: SamplingParams) -> None:
    """p and q both processed by temperature/top-k/top-p/min-p: the output follows the processed target."""
    p_table = probabilities(_log(P_TABLE).reshape(V * V, V), params).reshape(V, V, V)
    q_table = probabilities(_log(Q_TABLE), params)
    prompt = [0, 3]
    rng = np.random.default_rng(8)

    def draw(_: int) -> tuple[int, ...]:
        ctx = list(prompt)
        draft, q_rows = [], []
        for _ in range(K):
            d = sample(q_table[ctx[-1]], rng)
            draft.append(d)
            q_rows.append(q_table[ctx[-1]])
            ctx.append(d)
        p = np.stack([p_table[ctx[i - 2], ctx[i - 1]] for i in range(len(prompt), len(prompt) + K + 1)])
        v = verify_exact(draft, np.stack(q_rows), p, rng)
        out = [*prompt, *draft[: v.n_accepted], v.token]
        while len(out) < len(prompt) + K + 1:
            out.append(sample(p_table[out[-2], out[-1]], rng))
        return tuple(out[len(prompt) :])

    expected = {}
    for seq in itertools.product(range(V), repeat=K + 1):
        ctx, prob = list(prompt), 1.0
        for x in seq:
            prob *= p_table[ctx[-2], ctx[-1], x]
            ctx.append(x)
        expected[seq] = prob
    failure = joint_check(draw, expected, N_SAMPLES)
    assert failure is None, failure


def _finish(
    prompt: Sequence[int], tokens: list[int], rng: np.random.Generator, p_table: np.ndarray = P_TABLE
) -> tuple[int, ...]:
    """Complete a short round's output to k+1 tokens by sampling the target directly."""
    ctx = [*prompt, *tokens]
    while len(ctx) - len(prompt) < K + 1:
        ctx.append(sample(p_table[ctx[-2], ctx[-1]], rng))
    return tuple(ctx[len(prompt) :])


# -- the rules on hand-made cases -------------------------------------------------------------------


def _one_hot(rows: Sequence[int], width: int = V) -> np.ndarray:
    out = np.zeros((len(rows), width))
    out[np.arange(len(rows)), rows] = 1.0
    return out


@pytest.mark.parametrize(
    ("draft", "argmax", "expected"),
    [
        ([], [2], Verdict(0, 2, "bonus")),
        ([1], [1, 3], Verdict(1, 3, "bonus")),
        ([1], [0, 3], Verdict(0, 0, "recovered")),
        ([1, 2, 3], [1, 2, 3, 0], Verdict(3, 0, "bonus")),
        ([1, 2, 3], [1, 2, 0, 0], Verdict(2, 0, "recovered")),
        ([1, 2, 3], [2, 2, 3, 0], Verdict(0, 2, "recovered")),
        ([1, 1, 1], [1, 0, 1, 1], Verdict(1, 0, "recovered")),
    ],
)
def test_verify_greedy(draft: list[int], argmax: list[int], expected: Verdict) -> None:
    assert verify_greedy(draft, np.array(argmax)) == expected


@pytest.mark.parametrize("rule", [verify_exact, verify_match])
@pytest.mark.parametrize("one_hot_q", [False, True])
@pytest.mark.parametrize(
    ("draft", "argmax", "expected"),
    [
        ([], [2], Verdict(0, 2, "bonus")),
        ([1], [1, 3], Verdict(1, 3, "bonus")),
        ([1], [0, 3], Verdict(0, 0, "recovered")),
        ([1, 2, 3], [1, 2, 3, 0], Verdict(3, 0, "bonus")),
        ([1, 2, 3], [1, 2, 0, 0], Verdict(2, 0, "recovered")),
        ([1, 2, 3], [2, 2, 3, 0], Verdict(0, 2, "recovered")),
    ],
)
def test_sampling_rules_with_one_hot_p_act_greedily(
    rule: verify.Rule, one_hot_q: bool, draft: list[int], argmax: list[int], expected: Verdict
) -> None:
    """A degenerate (one-hot) target makes both rules deterministic and equal to verify_greedy."""
    p = _one_hot(argmax)
    q = None if one_hot_q or not draft else np.full((len(draft), V), 1.0 / V)
    for seed in range(20):
        assert rule(draft, q, p, np.random.default_rng(seed)) == expected


def test_verify_exact_never_accepts_a_zero_probability_draft() -> None:
    p = np.array([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = np.array([[1.0, 0.0, 0.0, 0.0]])
    for seed in range(50):
        v = verify_exact([0], q, p, np.random.default_rng(seed))
        assert v.n_accepted == 0 and v.kind == "recovered" and v.token in (1, 2)


def test_verify_exact_accepts_when_p_dominates_q() -> None:
    p = np.array([[0.1, 0.9, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    q = np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    for seed in range(50):
        assert verify_exact([1, 3], q, p, np.random.default_rng(seed)) == Verdict(2, 0, "bonus")


def test_verify_exact_accepts_with_probability_p_over_q_when_q_is_larger() -> None:
    """The random branch: p(d) = 0.3 < q(d) = 0.6 keeps d with probability 0.3 / 0.6 = 1/2; a rejection
    recovers from max(0, p - q) = [0, 0.3, 0, 0], so token 1; an acceptance adds the bonus from row 1."""
    p = np.array([[0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    q = np.array([[0.6, 0.4, 0.0, 0.0]])
    n = 4000
    verdicts = Counter(verify_exact([0], q, p, np.random.default_rng(seed)) for seed in range(n))
    assert set(verdicts) == {Verdict(1, 3, "bonus"), Verdict(0, 1, "recovered")}
    kept = verdicts[Verdict(1, 3, "bonus")]
    assert abs(kept - n / 2) < 5 * math.sqrt(n * 0.5 * 0.5), kept  # binomial(n, 1/2): 5 sigma


def test_verify_exact_compares_one_uniform_draw_with_p_over_q() -> None:
    """The acceptance test is u < p(d)/q(d) on the rule's first draw: u just under 0.5 keeps d, just over rejects."""

    class Draws:
        def __init__(self, *u: float) -> None:
            self.u = list(u)

        def random(self) -> float:
            return self.u.pop(0)

    p = np.array([[0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    q = np.array([[0.6, 0.4, 0.0, 0.0]])
    assert verify_exact([0], q, p, Draws(0.4999, 0.5)) == Verdict(1, 3, "bonus")  # type: ignore[arg-type]
    assert verify_exact([0], q, p, Draws(0.5001, 0.5)) == Verdict(0, 1, "recovered")  # type: ignore[arg-type]


def test_recovered_token_comes_from_the_residual() -> None:
    """After rejecting d, the replacement is never a token where q >= p (the residual is zero there)."""
    p = np.array([[0.4, 0.3, 0.3, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = np.array([[0.1, 0.8, 0.05, 0.05]])
    seen = Counter()
    for seed in range(2000):
        v = verify_exact([1], q, p, np.random.default_rng(seed))
        if v.kind == "recovered":
            seen[v.token] += 1
    assert set(seen) == {0, 2}  # residual max(0, p - q) = [0.3, 0, 0.25, 0]
    assert 0.45 < seen[0] / sum(seen.values()) < 0.65  # 0.3 / 0.55 = 0.545


def test_one_hot_q_residual_drops_only_the_draft_token() -> None:
    p = np.array([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    for seed in range(100):
        v = verify_exact([1], None, p, np.random.default_rng(seed))
        assert v in (Verdict(1, 0, "bonus"), Verdict(0, 0, "recovered"))
