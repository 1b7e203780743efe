"""auto's cost curve on its own (decoding/cost_learning.CostLearner), without AutoDrafter: the interface it offers
(at_context, draft_cap, steer, check_draft, pace, observe, save, take_note) is enough to remember, test, drop and
learn a curve. Pure: rounds are RoundStats with exact seconds; the store is a file under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeBackend, hashed_logits

from localspec.decoding.cost_cache import CHECK_PAIRS, CostStore
from localspec.decoding.cost_learning import CostLearner
from localspec.decoding.policy import Controller, CostModel, Plan
from localspec.decoding.stats import RoundStats
from localspec.draft import Draft

FLAT = {1: 0.010, 2: 0.0101, 4: 0.0102, 8: 0.0104}  # a GPU-like curve: a batch of 4 costs about one token


def _store(tmp_path: Path) -> CostStore:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    return CostStore.for_models(target=str(model), draft=None, backend="llama", device="CPU (2 threads)", threads=2)


def _round(n_drafted: int, seconds: float) -> RoundStats:
    return RoundStats(0, n_drafted, 0, 1, 0.0, seconds, "recovered" if n_drafted else "bonus", n_drafted)


def _feed(learner: CostLearner, controller: Controller, stats: RoundStats, context: int = 100) -> None:
    """One round as AutoDrafter runs it: the curve at this length, then the round's timings."""
    learner.at_context(context, controller.costs)
    learner.pace(stats, controller.costs)
    controller.costs.observe_target(stats.n_drafted + 1, stats.verify_s)
    learner.observe(stats, controller)


def test_a_remembered_curve_the_rounds_contradict_is_dropped_said_once_and_learnt_afresh(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(CostModel(target=dict(FLAT)))
    learner = CostLearner(target=FakeBackend(hashed_logits(1)), store=store)
    assert learner.initial is not None and learner.check is not None and not learner.learning
    controller = Controller(learner.initial)
    learner.new_generation(8)
    assert learner.draft_cap(8) == 8  # a remembered curve: the policy may plan the whole k
    for _ in range(CHECK_PAIRS + 1):  # a CPU: a batch of 4 costs 3.5 single tokens, not 1.02
        _feed(learner, controller, _round(0, 0.010))
        _feed(learner, controller, _round(3, 0.035))
    assert learner.learning and learner.check is None
    # The remembered curve is gone; what the rounds timed (a batch of 4 at 3.5 T(1), in pairs) is stored instead.
    relearnt = store.load()
    assert relearnt is not None and relearnt.target_s(4) / relearnt.target_s(1) == pytest.approx(3.5)
    note = learner.take_note()
    assert "remembered costs contradicted by live rounds" in note and "dropped, learning afresh" in note
    assert learner.take_note() == ""  # said once
    assert learner.draft_cap(8) < 8  # learning: drafts grow past what was timed, not to k at once


def test_a_check_round_in_a_plain_run_drafts_the_lookups_next_token(tmp_path: Path) -> None:
    """A plain run on a remembered curve pays a share of its time for a check: a 1-token draft after a 1-token pass."""
    store = _store(tmp_path)
    store.save(CostModel(target=dict(FLAT)))
    learner = CostLearner(target=FakeBackend(hashed_logits(1)), store=store)
    controller = Controller(learner.initial)
    learner.new_generation(4)
    plain = Plan("none", 0, 100.0, 100.0)
    checks: list[int] = []
    for i in range(400):
        plan = learner.steer(plain, 4, lookup=2)
        if learner.checking:
            assert plan.method == "none" and plan.k == 0
            draft = learner.check_draft([5, 6, 7], Draft([9, 10], None))
            assert (draft.tokens, draft.source) == ([9], "check") and "check T(2)" in draft.note
            checks.append(i)
            _feed(learner, controller, _round(1, 0.0101))
        else:
            _feed(learner, controller, _round(0, 0.010))
    # Paid from CHECK_SHARE of the plain rounds' time, backing off while the curve holds: fewer and fewer.
    assert checks and len([i for i in checks if i < 100]) > len([i for i in checks if i >= 300]) >= 1
    assert not learner.learning and learner.check is not None  # the curve held


def test_a_learnt_curve_is_stored_once_consistent_with_the_settled_draft_cost_only(tmp_path: Path) -> None:
    store = _store(tmp_path)
    learner = CostLearner(target=FakeBackend(hashed_logits(1)), store=store)
    assert learner.initial is None and learner.learning
    controller = Controller(learner.initial)
    learner.new_generation(4)
    for _ in range(20):  # pairs of a 1-token pass and a batch of 4, then of 3
        _feed(learner, controller, _round(0, 0.010))
        _feed(learner, controller, _round(3, 0.012))
        _feed(learner, controller, _round(0, 0.010))
        _feed(learner, controller, _round(2, 0.011))
    assert learner.live.storable() == ""
    learner.save(controller)
    saved = store.load()
    assert saved is not None and saved.draft_token is None  # no draft was ever timed
    assert saved.target_s(4) / saved.target_s(1) == pytest.approx(1.2, rel=0.05)
    assert saved.target_s(3) / saved.target_s(1) == pytest.approx(1.1, rel=0.05)
