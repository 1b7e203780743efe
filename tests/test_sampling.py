"""Logits processing (temperature, top-k, top-p, min-p) and sampling, against plain references."""

from __future__ import annotations

import numpy as np
import pytest

from localspec import sampling
from localspec.errors import UsageError
from localspec.sampling import SamplingParams, greedy_rows, probabilities, sample


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def _reference(
    logits: np.ndarray, *, t: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    """Full-sort reference: temperature, top-k, top-p, min-p, in that order."""
    p = _softmax(np.asarray(logits, dtype=np.float64) / t)
    order = np.argsort(-p, kind="stable")
    if top_k:
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:top_k]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        n_keep = int(np.searchsorted(cum, top_p)) + 1  # smallest prefix whose mass reaches top_p
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:n_keep]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if min_p > 0.0:
        p = np.where(p >= min_p * p.max(), p, 0.0)
        p /= p.sum()
    return p


def _distinct_logits(n: int, seed: int, scale: float = 3.0) -> np.ndarray:
    """Random logits without ties (ties at a cut make top-k/top-p ambiguous)."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n) * scale
    assert np.unique(z).size == n
    return z.astype(np.float32)


@pytest.mark.parametrize("t", [0.3, 1.0, 2.5])
def test_temperature_only_is_softmax(t: float) -> None:
    z = _distinct_logits(100, 1)
    expected = _softmax(z.astype(np.float64) / t)
    np.testing.assert_allclose(probabilities(z, SamplingParams(temperature=t)), expected, rtol=1e-12)


def test_probabilities_rows_and_shapes() -> None:
    z = np.stack([_distinct_logits(50, s) for s in range(3)])
    p = probabilities(z, SamplingParams(temperature=1.0))
    assert p.shape == (3, 50) and p.dtype == np.float64
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    np.testing.assert_allclose(p[1], probabilities(z[1], SamplingParams(temperature=1.0)))


@pytest.mark.parametrize("top_k", [1, 2, 7, 49])
def test_top_k(top_k: int) -> None:
    z = _distinct_logits(50, 2)
    p = probabilities(z, SamplingParams(temperature=0.8, top_k=top_k))
    assert np.count_nonzero(p) == top_k
    np.testing.assert_allclose(p, _reference(z, t=0.8, top_k=top_k), rtol=1e-12)


def test_top_k_at_or_above_vocab_is_off() -> None:
    z = _distinct_logits(10, 3)
    for k in (10, 11):
        p = probabilities(z, SamplingParams(temperature=1.0, top_k=k))
        np.testing.assert_allclose(p, _softmax(z.astype(np.float64)))


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99, 0.999999])
@pytest.mark.parametrize("vocab", [8, 300, 5000])
def test_top_p_matches_full_sort(top_p: float, vocab: int) -> None:
    z = _distinct_logits(vocab, vocab + int(top_p * 1000), scale=2.0)
    p = probabilities(z, SamplingParams(temperature=1.0, top_p=top_p))
    ref = _reference(z, top_p=top_p)
    np.testing.assert_array_equal(p > 0, ref > 0)
    np.testing.assert_allclose(p, ref, rtol=1e-12)


@pytest.mark.parametrize("top_p", [0.5, 0.95])
def test_top_p_nucleus_larger_than_the_partial_sort(top_p: float) -> None:
    """A flat distribution over a big vocabulary: the nucleus needs far more than 1024 candidates."""
    vocab = 50_000
    z = _distinct_logits(vocab, 11, scale=0.05)
    p = probabilities(z, SamplingParams(temperature=1.0, top_p=top_p))
    ref = _reference(z, top_p=top_p)
    kept = np.count_nonzero(ref)
    assert kept > sampling._NUCLEUS_START
    assert np.count_nonzero(p) == kept
    np.testing.assert_array_equal(p > 0, ref > 0)
    np.testing.assert_allclose(p, ref, rtol=1e-12)


def test_top_p_nucleus_exactly_at_a_boundary() -> None:
    # Probabilities 0.5, 0.25, 0.125, 0.125: top_p 0.75 keeps exactly two tokens.
    z = np.log(np.array([0.125, 0.5, 0.125, 0.25]))
    p = probabilities(z, SamplingParams(temperature=1.0, top_p=0.75))
    np.testing.assert_allclose(p, [0.0, 2 / 3, 0.0, 1 / 3])


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.6])
def test_min_p(min_p: float) -> None:
    z = _distinct_logits(200, 5)
    p = probabilities(z, SamplingParams(temperature=1.0, min_p=min_p))
    ref = _reference(z, min_p=min_p)
    np.testing.assert_allclose(p, ref, rtol=1e-12)
    base = _softmax(z.astype(np.float64))
    assert np.all((p > 0) == (base >= min_p * base.max()))


def test_all_filters_together_match_the_reference() -> None:
    z = _distinct_logits(3000, 9, scale=1.5)
    params = SamplingParams(temperature=0.7, top_k=400, top_p=0.8, min_p=0.02)
    ref = _reference(z, t=0.7, top_k=400, top_p=0.8, min_p=0.02)
    np.testing.assert_allclose(probabilities(z, params), ref, rtol=1e-12)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=1.0, min_p=0.1),
    ],
)
def test_minus_inf_logits_get_zero_probability(params: SamplingParams) -> None:
    z = np.array([-np.inf, 1.0, -np.inf, 0.5, 0.0, -np.inf], dtype=np.float32)
    with np.errstate(all="raise"):  # no nan, no invalid-value warnings
        p = probabilities(z, params)
    assert np.all(np.isfinite(p))
    assert p[0] == p[2] == p[5] == 0.0
    assert p.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    assert all(sample(p, rng) not in (0, 2, 5) for _ in range(500))


def test_sample_follows_the_distribution_and_skips_zeros() -> None:
    p = np.array([0.0, 0.2, 0.0, 0.5, 0.3, 0.0])
    rng = np.random.default_rng(1)
    draws = np.array([sample(p, rng) for _ in range(20_000)])
    counts = np.bincount(draws, minlength=6) / draws.size
    assert counts[0] == counts[2] == counts[5] == 0.0
    np.testing.assert_allclose(counts, p, atol=0.015)


def test_sample_accepts_unnormalized_weights() -> None:
    rng = np.random.default_rng(2)
    draws = [sample(np.array([0.0, 3.0, 1.0]), rng) for _ in range(4000)]
    assert 0 not in draws
    assert 0.7 < draws.count(1) / len(draws) < 0.8


def test_sample_never_returns_a_trailing_zero_weight_token() -> None:
    """Even a uniform draw at the very top of [0, 1) maps to the last token with weight."""

    class TopRng:
        def random(self) -> float:
            return np.nextafter(1.0, 0.0)

    assert sample(np.array([0.1, 0.7, 0.2, 0.0, 0.0]), TopRng()) == 2  # type: ignore[arg-type]
    assert sample(np.array([0.3] * 10 + [0.0]), TopRng()) == 9  # type: ignore[arg-type]


def test_greedy_rows_is_argmax_per_row_up_to_the_first_row_that_rejects_its_draft_token() -> None:
    z = np.array([[0.0, 2.0, 1.0], [-np.inf, -1.0, -np.inf], [5.0, 5.0, 0.0], [0.0, 0.0, 9.0]])
    assert greedy_rows(z, [1, 1, 0], 0.1)[0] == [1, 1, 0, 2]  # every draft token kept: every row, the bonus too
    assert greedy_rows(z, [1, 2, 0], 0.1)[0] == [1, 1]  # row 1 rejects its token: rows 2 and 3 are never read
    assert greedy_rows(z, [], 0.1)[0] == [1]  # no draft: the first row only
    nan_after = z.copy()
    nan_after[2:] = np.nan  # rows after a rejection are not read: their contents cannot matter
    assert greedy_rows(nan_after, [0], 0.1) == ([1], [])


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -0.1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}, {"min_p": -0.1}, {"min_p": 1.0}],
)
def test_invalid_params_are_usage_errors(kwargs: dict) -> None:
    with pytest.raises(UsageError):
        SamplingParams(**kwargs)


def test_greedy_flag() -> None:
    assert SamplingParams().greedy and SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=0.01).greedy


# -- large vocabularies: the thresholded top-k/top-p candidates and the two-level sampler ------------------


@pytest.mark.parametrize("top_k", [1, 5, 40, 1000, 20_000])
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])  # flat logits need the candidate window widened
def test_top_k_large_vocab_matches_full_sort(top_k: int, scale: float) -> None:
    z = _distinct_logits(50_000, top_k + int(scale * 10), scale=scale)
    p = probabilities(z, SamplingParams(temperature=1.0, top_k=top_k))
    ref = _reference(z, top_k=top_k)
    assert np.count_nonzero(p) == top_k
    np.testing.assert_array_equal(p > 0, ref > 0)
    np.testing.assert_allclose(p, ref, rtol=1e-12)


def test_top_k_with_minus_inf_beyond_k() -> None:
    z = np.full(10_000, -np.inf, dtype=np.float32)
    z[[3, 500, 9000]] = [1.0, 2.0, 0.5]
    p = probabilities(z, SamplingParams(temperature=1.0, top_k=50))
    assert set(np.flatnonzero(p)) == {3, 500, 9000}
    np.testing.assert_allclose(p.sum(), 1.0)


def test_top_p_ties_at_the_cut_go_to_the_lower_id() -> None:
    # Ten equal tokens of 0.1 each among a big vocabulary of near-zero ones: top_p 0.35 keeps four of them
    # (0.4 >= 0.35), the four with the lowest ids, as the stable full-sort reference does.
    vocab = 20_000
    z = np.full(vocab, -40.0)
    ties = np.array([17, 3, 19_999, 4096, 77, 12_000, 5, 8191, 8192, 600])
    z[ties] = 0.0
    p = probabilities(z, SamplingParams(temperature=1.0, top_p=0.35))
    ref = _reference(z, top_p=0.35)
    assert sorted(np.flatnonzero(p)) == sorted(np.flatnonzero(ref)) == [3, 5, 17, 77]
    np.testing.assert_allclose(p, ref, rtol=1e-12)


@pytest.mark.parametrize("vocab", [4097, 50_000, 151_936])
def test_sample_large_vocab_follows_the_distribution(vocab: int) -> None:
    """The two-level sampler (block sums, then within a block) on tokens at block edges and in the tail."""
    ids = np.array([0, 1023, 1024, 2047, vocab // 2, vocab - 2, vocab - 1])
    weights = np.array([0.05, 0.2, 0.1, 0.15, 0.3, 0.1, 0.1])
    p = np.zeros(vocab)
    p[ids] = weights
    rng = np.random.default_rng(4)
    draws = np.array([sample(p, rng) for _ in range(20_000)])
    assert set(np.unique(draws)) <= set(ids.tolist())
    freq = np.array([(draws == i).mean() for i in ids])
    np.testing.assert_allclose(freq, weights, atol=0.015)


def test_sample_large_vocab_never_picks_zero_weight_tokens_at_the_edges() -> None:
    class FixedRng:
        def __init__(self, u: float) -> None:
            self.u = u

        def random(self) -> float:
            return self.u

    vocab = 10_000
    p = np.zeros(vocab)
    p[[1500, 1501, 7000]] = [0.25, 0.25, 0.5]  # block 1 ends with zeros; trailing blocks are all zero
    for u in [0.0, 1e-300, 0.2499999999, 0.25, 0.4999999999, 0.5, 0.5000000001, 0.9999999, np.nextafter(1.0, 0.0)]:
        t = sample(p, FixedRng(u))  # type: ignore[arg-type]
        assert p[t] > 0, (u, t)
    assert sample(p, FixedRng(np.nextafter(1.0, 0.0))) == 7000  # type: ignore[arg-type]
    assert sample(p, FixedRng(0.0)) == 1500  # type: ignore[arg-type]


# -- temperature with top-p / top-k, against the independent reference (tests/sampling_reference.py) ------
# Temperature reshapes the distribution before any filter: a nucleus chosen at T = 1 and then sharpened or
# flattened keeps other tokens. Top-k is the same set at any T, but its probabilities are not.


@pytest.mark.parametrize("t", [0.4, 0.7, 1.8])
@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.95])
@pytest.mark.parametrize("vocab", [100, 3000])
def test_top_p_after_temperature_matches_the_reference(t: float, top_p: float, vocab: int) -> None:
    from sampling_reference import reference_probs

    z = _distinct_logits(vocab, vocab + int(t * 100) + int(top_p * 1000), scale=2.0)
    ref = reference_probs(z, t=t, top_p=top_p)
    # The case must tell the orders apart: the nucleus at T = 1 is another set of tokens.
    assert not np.array_equal(ref > 0, reference_probs(z, top_p=top_p) > 0)
    p = probabilities(z, SamplingParams(temperature=t, top_p=top_p))
    np.testing.assert_array_equal(p > 0, ref > 0)
    np.testing.assert_allclose(p, ref, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("t", [0.3, 0.7, 2.5])
@pytest.mark.parametrize("top_k", [2, 10, 200])
def test_top_k_after_temperature_matches_the_reference(t: float, top_k: int) -> None:
    from sampling_reference import reference_probs

    z = _distinct_logits(1000, top_k + int(t * 10), scale=2.0)
    ref = reference_probs(z, t=t, top_k=top_k)
    assert np.count_nonzero(ref) == top_k
    assert not np.allclose(ref, reference_probs(z, top_k=top_k), rtol=1e-3)  # T changed the kept mass
    p = probabilities(z, SamplingParams(temperature=t, top_k=top_k))
    np.testing.assert_array_equal(p > 0, ref > 0)
    np.testing.assert_allclose(p, ref, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize(("t", "top_k", "top_p"), [(0.5, 50, 0.9), (1.6, 400, 0.7)])
def test_top_k_then_top_p_after_temperature_matches_the_reference(t: float, top_k: int, top_p: float) -> None:
    """No min-p here: min-p can hide a wrong order of the other filters."""
    from sampling_reference import reference_probs

    z = _distinct_logits(3000, 19, scale=1.5)
    ref = reference_probs(z, t=t, top_k=top_k, top_p=top_p)
    assert not np.array_equal(ref > 0, reference_probs(z, top_k=top_k, top_p=top_p) > 0)
    p = probabilities(z, SamplingParams(temperature=t, top_k=top_k, top_p=top_p))
    np.testing.assert_array_equal(p > 0, ref > 0)
    np.testing.assert_allclose(p, ref, rtol=1e-12, atol=1e-300)


def test_the_reference_agrees_with_the_full_sort_reference() -> None:
    """Two references written differently agree (so a failure above is the code's, not a reference's)."""
    from sampling_reference import reference_probs

    z = _distinct_logits(500, 23, scale=2.0)
    for kw in ({"t": 0.6}, {"t": 0.6, "top_k": 30}, {"t": 1.3, "top_p": 0.7}, {"t": 0.9, "min_p": 0.05},
               {"t": 0.8, "top_k": 100, "top_p": 0.9, "min_p": 0.01}):  # fmt: skip
        np.testing.assert_allclose(reference_probs(z, **kw), _reference(z, **kw), rtol=1e-12, atol=1e-300)


def test_near_ties_are_the_rows_whose_runner_up_is_close_and_leave_the_rows_as_they_were() -> None:
    """The greedy round's near-tie check (a max pass with each row's best masked) agrees with the two-pass
    reference on every row read, finds the runner-up's id, and restores the logits it masked."""
    from sampling_reference import reference_runner_ups

    rng = np.random.default_rng(5)
    rows = (rng.standard_normal((6, 5000)) * 2).astype(np.float32)
    rows[1, 17] = rows[1].max() + 0.05  # a runner-up 0.05 below: a near-tie
    rows[3, 99] = rows[3].max()  # an exact tie: the first index wins, the other is the runner-up at gap 0
    rows[4] = -np.inf  # a row the grammar forbade whole: no runner-up can be close
    rows[4, 3] = 0.0
    before = rows.copy()
    best = np.argmax(rows, axis=1).tolist()
    expected = [(i, b, s, g) for i, (b, s, g) in enumerate(reference_runner_ups(rows)) if g < 0.1]
    read, got = greedy_rows(rows, best, 0.1)
    assert read == best
    assert [(i, b, s) for i, b, s, _ in got] == [(i, b, s) for i, b, s, _ in expected]
    assert [g for *_, g in got] == pytest.approx([g for *_, g in expected])
    assert {1, 3} <= {i for i, *_ in got} and 4 not in {i for i, *_ in got}
    assert np.array_equal(rows, before)
    rejected = greedy_rows(rows, [best[0], -1, *best[2:]], 0.1)  # row 1 rejects: it is read, rows 2-5 are not
    assert rejected == (best[:2], [t for t in got if t[0] <= 1])
    assert greedy_rows(rows[:0], [], 0.1) == ([], [])
