"""The chi-square check shared by the head drafters' tests (EAGLE-3, MTP, DFlash/DSpark): the exact joint
distribution of the first WINDOW tokens from the target's own conditionals, and seeded draws of the same
window through the engine with a real drafter (compared by test_verify.joint_check). Also the first draft
row after a context, for the tests of what a head's pairs hold."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from localspec.backends.base import Backend, sync_cache
from localspec.decoding.drafters import Drafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.sampling import SamplingParams, probabilities

TOP_K = 2
K = 2
WINDOW = K + 2  # the prefill's token, then one full round: k drafts and the bonus
N_SAMPLES = 1200
CHI_PROMPT = "The capital of France"


def run(target, drafter, prompt, **cfg) -> Done:  # type: ignore[no-untyped-def]
    events = list(generate(target, drafter, prompt, GenerationConfig(**cfg)))
    assert isinstance(events[-1], Done)
    return events[-1]


def expected_joint(target, prompt: list[int], sampling: SamplingParams) -> dict[tuple[int, ...], float]:  # type: ignore[no-untyped-def]
    """Exact P(x1..xn | prompt) from the target's own processed conditionals, over the top-k tree."""
    out: dict[tuple[int, ...], float] = {}

    def walk(seq: tuple[int, ...], prob: float) -> None:
        if len(seq) == WINDOW:
            out[seq] = prob
            return
        _, row = sync_cache(target, [*prompt, *seq], logits=True)
        p = probabilities(row, sampling)
        for x in np.flatnonzero(p > 0):
            walk((*seq, int(x)), prob * float(p[x]))

    walk((), 1.0)
    return out


def draws(target, drafter, prompt: list[int], sampling: SamplingParams) -> Callable[[int], tuple[int, ...]]:  # type: ignore[no-untyped-def]
    """Draw i: the first WINDOW tokens of a speculative run seeded with 1000 + i."""

    def draw(i: int) -> tuple[int, ...]:
        seeded = SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k, seed=1000 + i)
        return run(target, drafter, prompt, max_tokens=WINDOW, num_draft=K, sampling=seeded).tokens

    return draw


def first_draft_q(target: Backend, drafter: Drafter, context: list[int]) -> np.ndarray:
    """The distribution [V] the drafter draws its first token from after `context` (temperature 1), with the
    target holding all but the last token, as after a round."""
    sync_cache(target, context[:-1], logits=False)
    draft = drafter.propose(context, 1, SamplingParams(temperature=1.0), np.random.default_rng(0))
    assert draft.q is not None and len(draft.tokens) == 1
    return draft.q[0]


def misreported(cls: type) -> type:
    """A subclass of drafter class `cls` that drafts the same tokens but reports q as uniform over its
    support: the chi-square check must fail through it (the test's own test)."""
    from dataclasses import replace

    class Misreported(cls):  # type: ignore[misc, valid-type]
        def propose(self, context, k, sampling, rng, *, min_confidence=0.0):  # type: ignore[no-untyped-def]
            d = super().propose(context, k, sampling, rng, min_confidence=min_confidence)
            if d.q is None:
                return d
            flat = (d.q > 0).astype(np.float64)
            return replace(d, q=flat / flat.sum(axis=1, keepdims=True))

    return Misreported


def check_exact_rule(target, drafter, prompt: list[int], sampling: SamplingParams, expected) -> None:  # type: ignore[no-untyped-def]
    """The exact rule through `drafter` matches the target's joint distribution, and both of its branches ran
    (drafts kept and drafts rejected) over 60 seeded runs."""
    from test_verify import joint_check

    failure = joint_check(draws(target, drafter, prompt, sampling), expected, N_SAMPLES)
    assert failure is None, failure
    runs = [run(target, drafter, prompt, max_tokens=WINDOW, num_draft=K, sampling=SamplingParams(
        temperature=1.0, top_k=TOP_K, seed=s)).stats for s in range(60)]  # fmt: skip
    accepted, drafted = sum(s.n_accepted for s in runs), sum(s.n_drafted for s in runs)
    assert 0 < accepted < drafted, (accepted, drafted)


def check_fresh_after_rejections(target, make, prompt: list[int], temperature: float, k: int, atol: float) -> None:  # type: ignore[no-untyped-def]
    """A drafter that ran a generation with rejected rounds proposes, on its context, what a fresh drafter
    prepared on that context proposes (its own cache came back right), and the same again when asked twice.
    `make()` builds a drafter; `atol` bounds q's difference (batched vs single-row passes differ in the last bits;
    a wrong state moves q by far more)."""
    sampling = SamplingParams(temperature=temperature, seed=7)
    used, fresh = make(), make()
    try:
        done = run(target, used, prompt, max_tokens=30, num_draft=k, sampling=sampling)
        assert done.stats.n_accepted < done.stats.n_drafted  # some rounds were rejected
        context = [*prompt, *done.tokens]
        sync_cache(target, context[:-1], logits=False)
        fresh.prepare(context[:-1], k)
        a = used.propose(context, k, sampling, np.random.default_rng(3))
        b = fresh.propose(context, k, sampling, np.random.default_rng(3))
        assert a.tokens == b.tokens and len(a.tokens) == k
        if temperature > 0 and (a.q is not None or b.q is not None):  # None for both: a deterministic drafter
            assert a.q is not None and b.q is not None
            np.testing.assert_allclose(a.q, b.q, atol=atol)
        assert used.propose(context, k, sampling, np.random.default_rng(3)).tokens == a.tokens
    finally:
        used.close()
        fresh.close()
