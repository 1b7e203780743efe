"""The engine, drafters, calibration and auto over backends that follow a recurrent model's rollback
rules (fakes.RecurrentFakeBackend raises where a real recurrent model could not go back): every caller
stays inside them, the output is unchanged, and the exact rule keeps the target's distribution."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import RecurrentFakeBackend, hashed_logits, noisy, without
from test_verify import (
    MODEL_PROMPT,
    N_SAMPLES,
    P_TABLE,
    Q_TABLE,
    WINDOW,
    K,
    V,
    _draft_fn,
    _expected_joint,
    _target_fn,
    joint_check,
)

from localspec.backends.base import rollback_route, sync_cache
from localspec.decoding.auto import AutoDrafter, auto_ngram
from localspec.decoding.calibrate import time_target
from localspec.decoding.drafters import ModelDrafter, NgramDrafter, NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.sampling import SamplingParams

TARGET = without(hashed_logits(1))
PROMPT = list(b"The quick brown fox jumps over the lazy dog. The quick brown")


def _run(target, drafter, prompt=PROMPT, **cfg) -> Done:  # type: ignore[no-untyped-def]
    done = list(generate(target, drafter, prompt, GenerationConfig(**cfg)))[-1]
    assert isinstance(done, Done)
    return done


@pytest.mark.parametrize(
    ("n_cached", "n_keep", "kw", "route"),
    [
        (10, 10, {"recurrent": True}, "none"),
        (10, 4, {"recurrent": False}, "trim"),
        (10, 0, {"recurrent": True}, "trim"),
        (10, 7, {"recurrent": True, "snapshot_reach": 3}, "snapshot"),
        (10, 6, {"recurrent": True, "snapshot_reach": 3, "checkpoint_at": 6}, "restore"),
        (10, 5, {"recurrent": True, "snapshot_reach": 3, "checkpoint_at": 6}, "refused"),
        (10, 5, {"recurrent": True}, "refused"),
    ],
)
def test_rollback_route(n_cached: int, n_keep: int, kw: dict, route: str) -> None:
    assert rollback_route(n_cached, n_keep, **kw) == route


@pytest.mark.parametrize("snapshots", [0, 8])
@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_greedy_speculation_over_recurrent_models_equals_plain(kind: str, k: int, snapshots: int) -> None:
    plain = _run(RecurrentFakeBackend(TARGET), NoDrafter(), max_tokens=60)
    target = RecurrentFakeBackend(TARGET, snapshots=snapshots)
    draft = RecurrentFakeBackend(noisy(TARGET, 5, 2.0), name="draft")  # a recurrent draft: no snapshots
    drafter = ModelDrafter(draft) if kind == "model" else NgramDrafter()
    spec = _run(target, drafter, max_tokens=60, num_draft=k)
    assert spec.tokens == plain.tokens
    assert "refused" not in target.routes + draft.routes
    assert 0 < spec.stats.n_drafted and spec.stats.n_accepted < spec.stats.n_drafted and target.routes
    if snapshots >= k:
        assert set(target.routes) <= {"snapshot"}  # verify rollbacks stay inside the snapshot window
    if kind == "model":
        assert spec.stats.n_accepted > 0
    if kind == "model":  # drafting token by token leaves no snapshot: the draft restores its checkpoint
        assert set(draft.routes) <= {"restore"} and (len(draft.routes) > 0) == (k > 1)


def test_plain_decoding_of_a_recurrent_model_never_rolls_back_or_saves() -> None:
    target = RecurrentFakeBackend(TARGET)
    _run(target, NoDrafter(), max_tokens=40)
    assert target.routes == [] and target.checkpoints == 1  # once, before the prompt's batch


def test_rollback_time_is_part_of_each_round() -> None:
    target = RecurrentFakeBackend(TARGET)
    done = _run(target, NgramDrafter(), max_tokens=40, num_draft=4)
    assert done.stats.rollback_s > 0 and done.stats.rollback_s <= done.stats.verify_s


def test_second_turn_on_a_recurrent_target_reuses_or_restarts_correctly() -> None:
    target = RecurrentFakeBackend(TARGET)
    first = _run(target, NgramDrafter(), max_tokens=20, num_draft=4)
    follow = [*PROMPT, *first.tokens, *b" and then"]
    again = _run(target, NgramDrafter(), follow, max_tokens=20, num_draft=4)
    assert again.stats.n_prompt_cached > 0  # the cache already held the first turn
    unrelated = list(b"Something else entirely, sharing only a prefix")
    third = _run(target, NgramDrafter(), [*PROMPT[:5], *unrelated], max_tokens=20, num_draft=4)
    assert third.stats.n_prompt_cached == 0  # too far back for the checkpoint: started over
    fresh = RecurrentFakeBackend(TARGET)
    assert third.tokens == _run(fresh, NoDrafter(), [*PROMPT[:5], *unrelated], max_tokens=20).tokens


def test_sync_cache_starts_over_when_the_state_cannot_go_back_that_far() -> None:
    b = RecurrentFakeBackend(TARGET)
    b.forward(PROMPT)
    b.checkpoint()
    b.forward([1])
    b.forward([2])
    keep, row = sync_cache(b, [*PROMPT[:10], 3], logits=True)
    assert keep == 0 and row is not None and list(b.cached_tokens) == [*PROMPT[:10], 3]


def test_calibration_on_a_recurrent_target_restores_the_cache() -> None:
    target = RecurrentFakeBackend(TARGET, snapshots=2)
    target.forward(PROMPT)
    costs = time_target(target, range(1, 6))
    assert sorted(costs) == [1, 2, 3, 4, 5]
    assert list(target.cached_tokens) == PROMPT and "refused" not in target.routes


def test_auto_over_a_recurrent_pair() -> None:
    target = RecurrentFakeBackend(TARGET, snapshots=8)
    draft = RecurrentFakeBackend(noisy(TARGET, 5, 1.0), name="draft")
    plain = _run(target, NoDrafter(), max_tokens=60)
    auto = AutoDrafter(ngram=auto_ngram(), model=ModelDrafter(draft), target=target)
    done = _run(target, auto, max_tokens=60, num_draft=8)
    assert done.tokens == plain.tokens
    assert "refused" not in target.routes + draft.routes


@pytest.mark.parametrize("snapshots", [0, K])
def test_exact_rule_through_recurrent_target_and_draft(snapshots: int) -> None:
    rule = "exact"
    target = RecurrentFakeBackend(_target_fn(P_TABLE), n_vocab=V, eog=frozenset(), snapshots=snapshots)
    draft = RecurrentFakeBackend(_draft_fn(Q_TABLE), n_vocab=V, eog=frozenset())
    drafter = ModelDrafter(draft)

    def draw(seed: int) -> tuple[int, ...]:
        sampling = SamplingParams(temperature=1.0, seed=seed)
        done = _run(target, drafter, MODEL_PROMPT, max_tokens=WINDOW, num_draft=K, rule=rule, sampling=sampling)
        return done.tokens

    failure = joint_check(draw, _expected_joint(MODEL_PROMPT, WINDOW), N_SAMPLES)
    assert failure is None, failure
    assert "refused" not in target.routes + draft.routes and len(target.routes) > 0


def test_a_caller_that_breaks_the_rules_is_refused() -> None:
    b = RecurrentFakeBackend(TARGET, snapshots=4)
    b.forward(PROMPT)
    b.checkpoint()
    for t in (1, 2, 3):
        b.forward([t])
    assert not b.can_rollback(len(PROMPT) - 1)
    with pytest.raises(Exception, match="cannot roll back"):
        b.rollback(len(PROMPT) - 1)
    assert np.array_equal(b.cached_tokens, [*PROMPT, 1, 2, 3])  # nothing changed
