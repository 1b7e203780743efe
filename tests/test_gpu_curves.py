"""auto and the parallel policy replayed on the costs measured on an H200 (tests/gpu_curves.py): where a batch of 16
costs about two single tokens, lookup copies are drafted long, the 0.5B's model drafts are taken only where their
acceptance pays for their steps, and four sequences decoded in parallel draft where the curve allows. Pure: the policy
code sees the measured curves as a live run's rounds would time them (verify pass plus localspec's own work)."""

from __future__ import annotations

import pytest
from gpu_curves import H200, H200_1_5B, H200_7B, GpuCurve, cpu_like_s

from localspec.decoding.parallel import Candidate, plan_parallel
from localspec.decoding.policy import DRAFT_REPS, MARGIN, Acceptance, Controller, CostModel, ngram_prior

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def controller(target_s: dict[int, float], draft_token_s: float | None = None) -> Controller:
    c = Controller(CostModel(target=dict(target_s), draft_token=draft_token_s))
    c.draft_timings = DRAFT_REPS  # a remembered draft cost is settled
    return c


def model_plan(curve: GpuCurve, alpha: float, k_max: int = 16):  # type: ignore[no-untyped-def]
    c = controller(curve.live_target_s(), curve.draft_token_ms / 1e3)
    c.model_accept = Acceptance(alpha, weight=1e9)  # this acceptance, as a long run would have learnt it
    return c.plan(k_max, model=True)


@pytest.mark.parametrize("curve", H200, ids=lambda c: c.name)
def test_a_copy_is_drafted_long_where_sixteen_tokens_cost_two(curve: GpuCurve) -> None:
    raw, live = curve.target_s(), curve.live_target_s()
    assert raw[16] < 2.1 * raw[1]  # the fact the test rests on: a 16-token pass costs about two tokens
    c = controller(live)
    plan = c.plan(32, model=False, ngram_avail=32, ngram_order=32)  # a copy: a 32-token match, its prior
    assert plan.method == "ngram" and plan.k >= 16, plan
    assert plan.gain > 3.0, plan
    # On a CPU's steep curve the same copy is drafted much shorter: the length comes from the curve.
    cpu = controller(cpu_like_s()).plan(32, model=False, ngram_avail=32, ngram_order=32)
    assert cpu.method == "ngram" and cpu.k < plan.k / 2, cpu


@pytest.mark.parametrize("curve", H200, ids=lambda c: c.name)
def test_lookup_drafts_grow_with_the_match_they_copy(curve: GpuCurve) -> None:
    """The longer the match a lookup copies, the surer its next tokens (the priors by match length), and the
    longer the draft; even a short match is worth a short draft where an extra token costs a tenth of T(1)."""
    c = controller(curve.live_target_s())
    ks = [c.plan(32, model=False, ngram_avail=32, ngram_order=order).k for order in (2, 4, 8, 16, 32)]
    assert ks == sorted(ks) and ks[0] <= 2 and ks[-1] >= 16, ks
    assert ngram_prior(2) < 0.5 < ngram_prior(16)


def test_the_draft_models_tokens_are_taken_only_where_acceptance_pays() -> None:
    plans = {curve.name: {a: model_plan(curve, a) for a in ALPHAS} for curve in H200}
    big, small = plans[H200_7B.name], plans[H200_1_5B.name]
    # The 7B: at acceptance 0.8 a short model draft pays (the check's table: k = 2, 1.22x with localspec's cost).
    assert big[0.8].method == "model" and 1 <= big[0.8].k <= 3 and big[0.8].gain > 1.1, big[0.8]
    # The 1.5B: a 0.5B token costs 0.40 T(1) there; at 0.6 plain decoding is faster (the table: 0.86x).
    assert small[0.6].method == "none", small[0.6]
    assert small[0.95].method == "model" and small[0.95].k >= 4, small[0.95]
    for by_alpha in plans.values():
        chosen = [a for a in ALPHAS if by_alpha[a].method == "model"]
        assert chosen == [a for a in ALPHAS if a >= chosen[0]], by_alpha  # once it pays, it pays above too
        ks = [by_alpha[a].k for a in chosen]
        assert ks == sorted(ks), by_alpha  # and drafts grow with acceptance
        for a in chosen:
            assert by_alpha[a].gain > 1.0 + MARGIN
    # The draft is relatively cheaper beside the 7B: it starts to pay at a lower acceptance there.
    first = {name: min(a for a in ALPHAS if p[a].method == "model") for name, p in plans.items()}
    assert first[H200_7B.name] < first[H200_1_5B.name], first


def test_the_break_even_acceptance_is_where_the_measured_costs_put_it() -> None:
    """Model drafting is chosen exactly where its best expected rate beats plain decoding by the margin."""
    for curve in H200:
        live, d = curve.live_target_s(), curve.draft_token_ms / 1e3
        for a in (0.55, 0.65, 0.75, 0.85):
            best = max(sum(a**i for i in range(j + 1)) / (j * d + live[j + 1]) for j in range(1, 17))
            pays = best > (1.0 + MARGIN) / live[1]
            assert (model_plan(curve, a).method == "model") == pays, (curve.name, a)


@pytest.mark.parametrize("curve", H200, ids=lambda c: c.name)
def test_four_parallel_sequences_plan_drafts_where_the_curve_allows(curve: GpuCurve) -> None:
    live = curve.live_target_s()
    t = lambda n: live[min(n, 64)] if n <= 64 else live[64] * n / 64  # noqa: E731
    copies = [Candidate((0.95,) * 16)] * 4  # lookups on copies cost nothing to make
    plan = plan_parallel(copies, t)
    assert all(n > 0 for n in plan.lengths), plan
    assert plan.rate > plan.plain_rate * (1.0 + MARGIN), plan
    # Model drafts at acceptance 0.6: each token costs a 0.5B step that all four sequences wait for.
    d = curve.draft_token_ms / 1e3
    weak = plan_parallel([Candidate((0.6,) * 8, d)] * 4, t)
    assert sum(weak.lengths) < sum(plan.lengths)
    if curve is H200_1_5B:
        assert weak.lengths == (0, 0, 0, 0), weak
    # On a CPU's curve the same copies get far fewer draft tokens in the shared pass.
    cpu = cpu_like_s()
    cpu_plan = plan_parallel(copies, lambda n: cpu[min(n, 64)])
    assert sum(cpu_plan.lengths) < sum(plan.lengths) / 2, (cpu_plan, plan)
