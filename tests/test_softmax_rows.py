"""Softmax rows read only as far as a decision needs (localspec/softmax_rows.py): the same numbers and draws as the
whole softmax, the exact rule still exact where the tail matters, and a sampled round that never computes a whole
row at a 151,936-token vocabulary."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest
from fakes import FakeBackend
from test_verify import joint_check

from localspec import sampling, softmax_rows
from localspec.decoding.drafters import ModelDrafter, NgramDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.verify import verify_exact, verify_match
from localspec.sampling import SamplingParams
from localspec.softmax_rows import WORK, SoftmaxRow, SoftmaxRows

BIG = 151_936


def _softmax64(z: np.ndarray, t: float) -> np.ndarray:
    x = z.astype(np.float64) / t
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize(("scale", "t", "lift", "flat"), [(2.0, 0.7, 10.0, False), (3.0, 1.0, 15.0, False),
                                                         (0.5, 1.0, 2.0, True), (2.0, 0.7, 2.0, True)])  # fmt: skip
def test_a_row_reads_as_the_whole_softmax_at_150k(scale: float, t: float, lift: float, flat: bool) -> None:
    """Probabilities, bounds and the whole row agree with a float64 softmax (to float32's precision, as llama.cpp's
    own softmax); a peaked row is read from its head alone, a flat one whole, in one pass."""
    rng = np.random.default_rng(int(scale * 10 + t))
    z = (rng.standard_normal(BIG) * scale).astype(np.float32)
    z[[7, 90_000]] = [z.max() + lift, z.max() + lift - 0.5]
    ref = _softmax64(z, t)
    before = WORK.full
    row = SoftmaxRow(z, t)
    assert WORK.full - before == int(flat)
    assert (row.total_bounds()[0] == row.total_bounds()[1]) == flat
    lo, hi = row.total_bounds()
    assert lo <= row.total() <= hi
    for token in (7, 90_000, int(np.argmin(z)), 12_345):
        assert row.weight(token) / row.total() == pytest.approx(ref[token], rel=1e-5)
    np.testing.assert_allclose(row.dense(), ref, rtol=2e-5, atol=1e-12)


@pytest.mark.parametrize("known", [7, 90_000, 12_345, 3, BIG + 5])
def test_a_known_token_finds_the_same_head(known: int) -> None:
    """The draft token a target row grades bounds its max from below: the head found from it is the same (a token
    near the max, one far below it, one the row forbids, one outside the vocabulary)."""
    rng = np.random.default_rng(6)
    z = (rng.standard_normal(BIG) * 2.0).astype(np.float32)
    z[[7, 90_000, 3]] = [z.max() + 10.0, z.max() + 9.0, -np.inf]
    plain, hinted = SoftmaxRow(z, 0.7), SoftmaxRow(z, 0.7, known)
    assert hinted.total_bounds() == plain.total_bounds()
    assert [hinted.weight(t) for t in (7, 90_000, 3, 12_345)] == [plain.weight(t) for t in (7, 90_000, 3, 12_345)]


def _tailed_logits(n: int, seed: int) -> np.ndarray:
    """A row over n tokens: four likely tokens (ids 0-3) and a tail that holds about a fifth of the mass."""
    rng = np.random.default_rng(seed)
    z = np.full(n, -4.0) + rng.uniform(-1.0, 0.0, n)
    z[:4] = rng.uniform(-0.5, 0.5, 4)
    z[:4] += np.log((n - 4) * np.exp(-4.5))  # the four hold about 4/5 of the mass
    return z.astype(np.float32)


@pytest.fixture
def short_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head of scaled logits within 2 of the max: the tail holds real mass, so the draws and decisions that
    the tail could flip (rare at the real span) happen often enough to be counted."""
    monkeypatch.setattr(softmax_rows, "HEAD_SPAN", 2.0)


def _class(token: int) -> int:
    """Ids 0-3 as themselves, the tail in four groups (by id)."""
    return token if token < 4 else 4 + (token - 4) * 4 // 508


@pytest.mark.usefixtures("short_head")
def test_draws_follow_the_softmax_head_and_tail() -> None:
    z = _tailed_logits(512, 1)
    p = _softmax64(z, 1.0)
    expected: dict[tuple[int, ...], float] = {}
    for token, mass in enumerate(p):
        expected[(_class(token),)] = expected.get((_class(token),), 0.0) + mass
    rng = np.random.default_rng(2)
    before = WORK.full
    failure = joint_check(lambda _: (_class(SoftmaxRow(z, 1.0).sample(rng)),), expected, 20_000)
    assert failure is None, failure
    assert WORK.full - before > 1000  # the tail was drawn from (and computed) often: the case tests it


# -- the exact rule on rows with a tail -------------------------------------------------------------------------

V = 512
T = 1.0
P_ROWS = np.stack([_tailed_logits(V, s) for s in (10, 11, 12)])  # the target's rows for positions 1..3
Q_ROWS = np.stack([_tailed_logits(V, s) for s in (20, 21)])  # the draft's rows for positions 1..2
P_DENSE = np.stack([_softmax64(r, T) for r in P_ROWS])


def _expected_classes() -> dict[tuple[int, ...], float]:
    """The round's three tokens are independent draws from the target's rows (they do not depend on the context)."""
    per_pos = []
    for p in P_DENSE:
        masses: dict[int, float] = {}
        for token, mass in enumerate(p):
            masses[_class(token)] = masses.get(_class(token), 0.0) + mass
        per_pos.append(masses)
    return {
        seq: float(np.prod([per_pos[i][c] for i, c in enumerate(seq)]))
        for seq in itertools.product(*(sorted(m) for m in per_pos))
    }


def _round(rule: Callable, lookup: Sequence[int] | None) -> Callable[[int], tuple[int, ...]]:
    """One round through the rule on fresh lazy rows (a model draft, or a fixed lookup draft), completed to three
    tokens from the target's rows."""
    rng = np.random.default_rng(3)
    params = SamplingParams(temperature=T)

    def draw(_: int) -> tuple[int, ...]:
        if lookup is None:
            q_rows = [SoftmaxRow(r, T) for r in Q_ROWS]
            draft = [r.sample(rng) for r in q_rows]
            q: SoftmaxRows | None = SoftmaxRows.of_rows(list(q_rows), V)
        else:
            draft, q = list(lookup), None
        v = rule(draft, q, SoftmaxRows.of_logits(P_ROWS, params), rng)
        out = [*draft[: v.n_accepted], v.token]
        while len(out) < 3:
            out.append(int(rng.choice(V, p=P_DENSE[len(out)])))
        return tuple(_class(t) for t in out)

    return draw


@pytest.mark.usefixtures("short_head")
@pytest.mark.parametrize(
    ("rule", "lookup"),
    [(verify_exact, None), (verify_match, None), (verify_exact, [1, 2]), (verify_exact, [2, 300])],
    ids=["exact-model", "match-model", "exact-lookup", "exact-lookup-tail-token"],
)
def test_the_exact_rule_on_lazy_rows_is_exact(rule: Callable, lookup: list[int] | None) -> None:
    failure = joint_check(_round(rule, lookup), _expected_classes(), 20_000)
    assert failure is None, failure


@pytest.mark.usefixtures("short_head")
def test_a_rule_that_ignored_the_tail_would_fail_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above sees the tail: rows that take their head for the whole row fail it."""

    def head_only(self: SoftmaxRow) -> tuple[float, float]:
        return self.head_total, self.head_total

    monkeypatch.setattr(SoftmaxRow, "total_bounds", head_only)
    monkeypatch.setattr(SoftmaxRow, "total", lambda self: self.head_total)
    assert joint_check(_round(verify_exact, None), _expected_classes(), 20_000) is not None


def test_lazy_rows_read_as_the_array() -> None:
    """Tests and the grammar read q and p as [n, V] arrays: rows, single entries, slices."""
    params = SamplingParams(temperature=0.8)
    rows = SoftmaxRows.of_logits(P_ROWS, params)
    whole = np.stack([_softmax64(r, 0.8) for r in P_ROWS])
    assert rows.shape == whole.shape and len(rows) == 3
    np.testing.assert_allclose(np.asarray(rows), whole, rtol=2e-5, atol=1e-12)
    np.testing.assert_allclose(rows[1], whole[1], rtol=2e-5, atol=1e-12)
    assert rows[2, 7] == pytest.approx(whole[2, 7], rel=2e-5)
    np.testing.assert_allclose(rows[:, 3], whole[:, 3], rtol=2e-5)
    np.testing.assert_allclose(rows[-1], whole[2], rtol=2e-5, atol=1e-12)
    with pytest.raises(IndexError):
        rows.row(3)


# -- the work a sampled round does at a real vocabulary ---------------------------------------------------------

LOOP = 8


def _table() -> np.ndarray:
    """Rows of a 151,936-token vocabulary: after token t, token (t + 1) % LOOP leads, (t + 2) % LOOP close behind."""
    rng = np.random.default_rng(4)
    table = (rng.standard_normal((LOOP, BIG)) * 2.0).astype(np.float32)
    for t in range(LOOP):
        table[t, (t + 1) % LOOP], table[t, (t + 2) % LOOP] = 20.0, 19.5
    return table


TABLE = _table()


def _sampled_run(kind: str, k: int, rounds: int) -> Iterator[int]:
    """A sampled generation at the big vocabulary; yields each round's number of draft tokens."""
    target = FakeBackend(lambda ctx: TABLE[ctx[-1] % LOOP], n_vocab=BIG, eog=frozenset())
    draft = FakeBackend(lambda ctx: TABLE[ctx[-1] % LOOP], n_vocab=BIG, eog=frozenset())
    drafter = ModelDrafter(draft) if kind == "model" else NgramDrafter(max_ngram=3)
    prompt = [i % LOOP for i in range(24)]
    config = GenerationConfig(max_tokens=rounds * (k + 1), num_draft=k, sampling=SamplingParams(0.7, seed=5))
    for event in generate(target, drafter, prompt, config):
        if not isinstance(event, Done) and event.round is not None:
            yield event.round.n_drafted


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_a_sampled_round_never_processes_a_whole_row(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Neither the draft's rows nor the target's go through the whole-row processing (a float64 softmax of the
    150k vocabulary; nine a round at k = 4 before): the rule reads each row's head."""
    calls = 0
    whole_row = sampling._row_probs

    def counted(z: np.ndarray, params: SamplingParams) -> np.ndarray:
        nonlocal calls
        calls += 1
        return whole_row(z, params)

    monkeypatch.setattr(sampling, "_row_probs", counted)
    drafted = list(_sampled_run(kind, 4, 12))
    assert sum(drafted) > 0  # rounds drafted: the rows were read
    assert calls == 0


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_a_sampled_round_finds_each_rows_head_once_and_no_tail(kind: str) -> None:
    """Per round: a head search for each draft row and each target row the rule reads (at most k + 1), and no full
    exp pass (the draws near a tail's bound that would need one are a few in ten thousand)."""
    k, heads, full = 4, WORK.heads, WORK.full
    drafted = list(_sampled_run(kind, k, 12))
    n_draft_rows = sum(drafted) if kind == "model" else 0
    assert WORK.full - full <= 1  # (a decision near a bound: a few in ten thousand)
    assert WORK.heads - heads <= n_draft_rows + len(drafted) * (k + 1) + 1  # + 1: the prompt's row


def test_lazy_rows_take_array_operators() -> None:
    """Tests compare drafts' q with operators (q > 0, q1 - q2) as they did when q was an array."""
    params = SamplingParams(temperature=1.0)
    a, b = SoftmaxRows.of_logits(P_ROWS, params), SoftmaxRows.of_logits(P_ROWS[::-1], params)
    np.testing.assert_array_equal(a > 0, np.asarray(a) > 0)
    np.testing.assert_allclose(np.abs(a - b), np.abs(np.asarray(a) - np.asarray(b)))


# -- rows a backend made where the model runs (DrawsInPass) -----------------------------------------------------


def test_a_drawn_row_hands_out_its_draw_then_draws_from_its_softmax_on_the_host() -> None:
    """DrawnRow: the first sample is the backend's draw (no host work); later ones (the residual's rejection loop)
    follow the softmax over block sums, across block edges and into rows' zeros."""
    z = _tailed_logits(5000, 3)  # several 1024-token blocks, a head and a tail
    p = _softmax64(z, 1.0).astype(np.float32)
    p[4000:4500] = 0.0  # a stretch of zeros (as a softmax underflows), across a block edge
    p /= p.sum()
    row = softmax_rows.DrawnRow(p, draw=7)
    rng = np.random.default_rng(4)
    assert row.sample(rng) == 7 and row.weight(7) == float(p[7]) and row.total() == 1.0
    expected: dict[tuple[int, ...], float] = {}
    for token, mass in enumerate(p.astype(np.float64)):
        expected[(_class(token),)] = expected.get((_class(token),), 0.0) + mass
    failure = joint_check(lambda _: (_class(row.sample(rng)),), expected, 20_000)
    assert failure is None, failure
    assert all(not 4000 <= row.sample(rng) < 4500 for _ in range(2000))


def test_a_sparse_row_reads_its_candidates_and_zeros_elsewhere() -> None:
    ids, probs = np.array([40, 3, 17]), np.array([0.5, 0.2, 0.3], dtype=np.float32)
    row = softmax_rows.SparseRow(ids, probs, 64)
    assert [row.weight(t) for t in (3, 17, 40, 0, 41, 63)] == pytest.approx([0.2, 0.3, 0.5, 0, 0, 0])
    dense = row.dense()
    assert dense.shape == (64,) and dense.sum() == pytest.approx(1.0) and dense[17] == pytest.approx(0.3)
    rng = np.random.default_rng(1)
    counts = np.bincount([row.sample(rng) for _ in range(6000)], minlength=64)
    assert set(np.flatnonzero(counts)) == {3, 17, 40} and abs(counts[40] / 6000 - 0.5) < 0.03
