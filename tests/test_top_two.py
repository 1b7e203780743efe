"""TopTwo, what a greedy round reads where the backend picks each row's best two tokens on its device: the same
verdict and near-ties as the host's arg-max over whole rows."""

from __future__ import annotations

import numpy as np

from localspec.backends.base import TopTwo
from localspec.sampling import greedy_rows


def rows_with_ties(seed: int = 0, n: int = 9, vocab: int = 5000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n, vocab)).astype(np.float32)
    for i in range(n):
        best = int(rng.integers(vocab))
        rows[i, best] = 6.0
        if i % 2 == 0:  # a runner-up close behind
            rows[i, (best + 7) % vocab] = 6.0 - 0.03 * (i + 1)
    rows[3, 10] = rows[3, 20] = 9.0  # an exact tie: the lower id wins, as numpy's arg-max
    return rows


def test_picks_give_the_arg_max_and_the_near_ties_of_whole_rows() -> None:
    rows = rows_with_ties()
    picks = TopTwo.of_rows(rows)
    best = np.argmax(rows, axis=1)
    assert picks.best.tolist() == best.tolist()
    for n in (1, 4, len(rows)):
        assert picks.near_ties(n, 0.1) == greedy_rows(rows[:n].copy(), best.tolist(), 0.1)[1]


def test_picks_in_any_order_are_put_best_first() -> None:
    ids = np.array([[4, 9], [9, 4], [7, 3], [3, 7]])
    logits = np.array([[1.0, 2.0], [2.0, 1.0], [5.0, 5.0], [5.0, 5.0]], dtype=np.float32)
    picks = TopTwo.picked(ids, logits)
    assert picks.ids.tolist() == [[9, 4], [9, 4], [3, 7], [3, 7]]
    assert picks.logits[:, 0].tolist() == [2.0, 2.0, 5.0, 5.0]
    assert len(picks) == 4
