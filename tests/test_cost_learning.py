"""auto's cost curve on its own (decoding/cost_learning.CostLearner), without AutoDrafter: the interface it offers
(at_context, draft_cap, steer, check_draft, pace, observe, save, take_note) is enough to remember, test, drop and
learn a curve. Pure: rounds are RoundStats with exact seconds; the store is a file under tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeBackend, hashed_logits

from localspec.decoding.cost_cache import CHECK_PAIRS, CostStore
from localspec.decoding.cost_learning import CHECK_SHARE, CostLearner
from localspec.decoding.policy import MAX_BACKOFF, Controller, CostModel, Plan
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


CPU = {1: 0.040, 2: 0.0688, 4: 0.112, 8: 0.22}  # this 2-core CPU's shape: T(2) = 1.72 T(1)


def _plain_answer(store: CostStore, rounds: int, lookup: int, t2: float = CPU[2]) -> tuple[list[int], float]:
    """One process's plain answer on the stored curve: the rounds that checked it (a 1-token draft that fails,
    timed `t2`), and what those checks cost over plain rounds, as a share of the answer's time."""
    learner = CostLearner(target=FakeBackend(hashed_logits(1)), store=store)
    controller = Controller(learner.initial)
    learner.new_generation(8)
    checks: list[int] = []
    total = extra = 0.0
    for i in range(rounds):
        learner.steer(Plan("none", 0, 0.0, 0.0), 8, lookup)
        seconds = t2 if learner.checking else CPU[1]
        if learner.checking:
            checks.append(i)
            extra += seconds - CPU[1]
        total += seconds
        _feed(learner, controller, _round(1 if learner.checking else 0, seconds))
    learner.save(controller)
    return checks, extra / total


def test_a_plain_answer_with_nothing_to_copy_pays_at_most_check_share_for_checks_in_every_run(tmp_path: Path) -> None:
    """New text, one process an answer (`localspec run`): checks are paid before they run, never from an overdraft,
    and a curve that held is checked less often in the runs after it."""
    store = _store(tmp_path)
    store.save(CostModel(target=dict(CPU)))
    runs = [_plain_answer(store, 96, lookup=0) for _ in range(5)]
    assert all(share <= CHECK_SHARE for _, share in runs), runs
    first_checks, _ = runs[0]
    assert first_checks and first_checks[0] >= 60  # 0.72 T(1) saved at 1% of ~T(1) a round: about 72 rounds
    assert store.held() >= 1 and store.load() is not None  # checked, held, remembered as held
    assert not any(checks for checks, _ in runs[1:])  # a curve that held: the next check is due later than 96 rounds


def test_a_curve_that_held_is_checked_less_in_the_next_run_and_one_doubt_brings_the_checks_back(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(CostModel(target=dict(CPU)))
    assert store.held() == 0
    checks, _ = _plain_answer(store, 20, lookup=2)  # a curve not yet held, a guess to draft: checked at once
    held = store.held()
    assert checks == [1] and held == 2  # round 0 times T(1), round 1 checks: two pairs (plain, check; check, plain)
    checks, _ = _plain_answer(store, 400, lookup=2)  # held twice: 2**2 x its price (0.72 T(1)) saved first
    assert checks and 0.9 * 72 * 2**held <= checks[0] <= 1.1 * 72 * 2**held and store.held() > held
    rounds = 80 * 2 ** min(store.held(), MAX_BACKOFF)  # a long answer reaches its check
    checks, _ = _plain_answer(store, rounds, lookup=2, t2=3 * CPU[2])  # a pair far off (a busy spell, a new machine)
    assert checks and store.held() == 0
    checks, _ = _plain_answer(store, 20, lookup=2)  # doubted: checked at once again
    assert checks == [1]


def test_a_stored_curve_without_a_check_count_or_with_a_damaged_one_counts_as_never_held(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(CostModel(target=dict(CPU)), held=3)
    assert store.held() == 3
    data = json.loads(store.path.read_text())
    for value in (None, "many", -2):
        data["checks_held"] = value
        store.path.write_text(json.dumps(data))
        assert store.held() == 0 and store.load() is not None
    del data["checks_held"]  # a file an earlier version wrote
    store.path.write_text(json.dumps(data))
    assert store.held() == 0 and store.load() is not None


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
