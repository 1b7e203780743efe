"""Several sequences in one llama.cpp context (localspec/backends/llama/multi.py) on a real model (SmolLM2-135M):
each sequence's cache is its own (rollback of one leaves the others), a prefix shared between sequences answers as
read and outlives the donor's cut, greedy answers decoded together through
parallel_decoder.ParallelDecoder equal each answered alone (near-ties aside), each sequence decoded together follows
the target's joint distribution (chi-square at temperature 1, top-k 2, mixed draft lengths), and a
recurrent target is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from head_chi import CHI_PROMPT, N_SAMPLES, TOP_K, WINDOW, expected_joint
from test_verify import joint_check

from localspec.backends.base import sync_cache
from localspec.backends.llama import backend as lb
from localspec.backends.llama.multi import LlamaParallel
from localspec.decoding.drafters import ModelDrafter, NgramDrafter
from localspec.decoding.engine import Done, Event, GenerationConfig, generate
from localspec.decoding.parallel_decoder import Job, ParallelDecoder
from localspec.errors import UnsupportedModelError
from localspec.sampling import SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "One, two, three, four, five, six,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]


@pytest.fixture(scope="module")
def target(smollm2_path: Path):  # type: ignore[no-untyped-def]
    t = lb.load(str(smollm2_path), n_ctx=512, threads=1)
    yield t
    t.close()


@pytest.fixture(scope="module")
def batch(target):  # type: ignore[no-untyped-def]
    s = LlamaParallel(target, 4, 256)
    yield s
    s.close()


@pytest.fixture(scope="module")
def self_draft(smollm2_path: Path):  # type: ignore[no-untyped-def]
    t = lb.load(str(smollm2_path), n_ctx=512, threads=1)
    yield t
    t.close()


def _total_variation(a: np.ndarray, b: np.ndarray) -> float:
    pa, pb = np.exp(a - a.max()), np.exp(b - b.max())
    return float(0.5 * np.abs(pa / pa.sum() - pb / pb.sum()).sum())


def _drive(decoder: ParallelDecoder, jobs: dict[int, Job], sizes: set[int] | None = None) -> dict[int, Done]:
    """Decode the jobs together to the end; `sizes` collects how many sequences each shared pass held."""
    events: dict[int, list[Event]] = {key: decoder.add(key, job) for key, job in jobs.items()}
    while decoder.members:
        for key, event in decoder.step():
            events[key].append(event)
        if sizes is not None and decoder.last_pass is not None:
            sizes.add(decoder.last_pass.n_sequences)
    return {key: evs[-1] for key, evs in events.items()}  # type: ignore[misc]


@pytest.mark.parametrize("cut", [0, 2])
def test_each_sequence_rolls_back_alone(target, batch, cut: int) -> None:  # type: ignore[no-untyped-def]
    """Every sequence reads its prompt in one pass; sequence `cut` (the first, or one in the middle) is cut back to two
    tokens and reads the rest again while every other sequence reads one more token: each sequence's row is its own
    sequence read alone, so the cut reached its own sequence and no other."""
    prompts = [target.tokenize(p) for p in PROMPTS]
    for s in batch.sequences:
        s.rollback(0)
    batch.forward_many(list(enumerate(prompts)))
    batch.sequences[cut].rollback(2)
    assert [list(s.cached_tokens) for s in batch.sequences] == [p[:2] if i == cut else p for i, p in enumerate(prompts)]
    parts = [(i, p[2:] if i == cut else [42]) for i, p in enumerate(prompts)]
    rows = batch.forward_many(parts)
    for (i, _), r in zip(parts, rows):
        full = prompts[i] if i == cut else [*prompts[i], 42]
        assert list(batch.sequences[i].cached_tokens) == full
        _, alone = sync_cache(target, full, logits=True)
        assert alone is not None and int(np.argmax(alone)) == int(np.argmax(r[-1])), f"sequence {i}"
        assert _total_variation(r[-1], alone) < 1e-3, f"sequence {i}"


def test_greedy_answers_together_equal_each_alone(target, batch, self_draft) -> None:  # type: ignore[no-untyped-def]
    greedy = SamplingParams(temperature=0.0)
    # a model drafter holds one sequence's cache: one sequence gets it, two look up, the last decodes plainly
    drafters = [NgramDrafter(), ModelDrafter(self_draft), NgramDrafter(), NgramDrafter()]
    decoder = ParallelDecoder(batch)
    jobs = {}
    for i, prompt in enumerate(PROMPTS):
        cfg = GenerationConfig(max_tokens=32, num_draft=0 if i == 3 else 3, sampling=greedy)
        jobs[i] = Job(i, batch.sequences[i], drafters[i], target.tokenize(prompt), cfg)
    together = _drive(decoder, jobs)
    for i, prompt in enumerate(PROMPTS):
        cfg = GenerationConfig(max_tokens=32, num_draft=0, sampling=greedy)
        alone = list(generate(target, NgramDrafter(), target.tokenize(prompt), cfg))[-1]
        assert isinstance(alone, Done) and isinstance(together[i], Done)
        ties = [t.position for t in (*alone.stats.near_ties, *together[i].stats.near_ties)]
        cut = min([*ties, len(alone.tokens)])
        assert together[i].tokens[:cut] == alone.tokens[:cut], f"prompt {i}"
        if not ties:
            assert together[i].tokens == alone.tokens


def test_a_prompt_read_in_chunks_inside_the_others_passes_answers_as_alone(target, batch) -> None:  # type: ignore[no-untyped-def]
    """serve --parallel's interleaving: sequence 1's prompt rides in sequence 0's passes (step's prefill), then
    sequence 1 joins with only its last prompt token to read, and answers as alone."""
    greedy = SamplingParams(temperature=0.0)
    cfg = GenerationConfig(max_tokens=12, num_draft=0, sampling=greedy)
    decoder = ParallelDecoder(batch)
    for s in batch.sequences[:2]:
        s.rollback(0)
    decoder.add(0, Job(0, batch.sequences[0], NgramDrafter(), target.tokenize(PROMPTS[0]), cfg))
    prompt = target.tokenize(PROMPTS[3])
    fed = 0
    while fed < len(prompt) - 1:
        chunk = prompt[fed : min(fed + 4, len(prompt) - 1)]
        decoder.step([(1, chunk)])
        fed += len(chunk)
    assert list(batch.sequences[1].cached_tokens) == prompt[:-1]
    events = decoder.add(1, Job(1, batch.sequences[1], NgramDrafter(), prompt, cfg))
    while 1 in decoder.members:
        events += [e for key, e in decoder.step() if key == 1]
    done = events[-1]
    alone = list(generate(target, NgramDrafter(), prompt, cfg))[-1]
    assert isinstance(done, Done) and isinstance(alone, Done)
    assert done.stats.n_prompt_cached == len(prompt) - 1
    cut = min([t.position for t in (*alone.stats.near_ties, *done.stats.near_ties)] + [len(alone.tokens)])
    assert done.tokens[:cut] == alone.tokens[:cut]


def test_a_shared_prefix_answers_as_read_and_outlives_its_donors_cut(target, batch) -> None:  # type: ignore[no-untyped-def]
    """Sequence 2 takes sequence 0's cached prefix (LlamaParallel.share: the cells tagged, nothing read); sequence 0
    is then cut back and writes something else over those positions, and sequence 2's next logits are still the
    prefix's."""
    prefix = target.tokenize(PROMPTS[3])
    for s in batch.sequences:
        s.rollback(0)
    batch.sequences[2].forward(target.tokenize(PROMPTS[1]))  # what sequence 2 held before is dropped
    batch.sequences[0].forward(prefix)
    batch.share(0, 2, len(prefix) - 1)
    assert list(batch.sequences[2].cached_tokens) == prefix[:-1]
    batch.sequences[0].rollback(1)
    batch.sequences[0].forward(target.tokenize(PROMPTS[2]))  # sequence 0's own cells at the shared positions
    shared = batch.sequences[2].forward(prefix[-1:])[-1]
    _, alone = sync_cache(target, prefix, logits=True)
    # Not bit-equal: the last token lands in a cell below the prefix's (sequence 2's dropped ones), and llama.cpp
    # sums attention in cell order (the same 0.03 shows without sharing); another prompt is ~0.45 away.
    assert int(np.argmax(shared)) == int(np.argmax(alone))
    assert _total_variation(shared, alone) < 0.1
    with pytest.raises(ValueError):
        batch.share(1, 3, 1)  # sequence 1 holds nothing to share
    for s in batch.sequences:  # the cells in order again: the chi-square below compares with a single context's
        s.rollback(0)


def test_each_sequence_decoded_together_is_distributed_as_the_target(target, batch, self_draft) -> None:  # type: ignore[no-untyped-def]
    """Two sequences share every pass: a model draft of 2 on CHI_PROMPT, a lookup draft of 1 on another."""
    sampling = SamplingParams(temperature=1.0, top_k=TOP_K)
    prompt = target.tokenize(CHI_PROMPT)
    expected = expected_joint(target, prompt, sampling)
    other = target.tokenize(PROMPTS[2])
    drafter = ModelDrafter(self_draft)
    samples = []
    sizes: set[int] = set()
    for s in batch.sequences:  # cells out of position order shift logits (see the sharing test): start in order
        s.rollback(0)
    for draw in range(N_SAMPLES):
        decoder = ParallelDecoder(batch, planned=False)
        seeded = [SamplingParams(temperature=1.0, top_k=TOP_K, seed=1000 + draw + 5000 * i) for i in range(2)]
        jobs = {
            0: Job(
                0,
                batch.sequences[0],
                drafter,
                prompt,
                GenerationConfig(max_tokens=WINDOW, num_draft=2, sampling=seeded[0]),
            ),
            1: Job(
                1,
                batch.sequences[1],
                NgramDrafter(),
                other,
                GenerationConfig(max_tokens=WINDOW, num_draft=1, sampling=seeded[1]),
            ),
        }
        done = _drive(decoder, jobs, sizes)
        samples.append(done[0].tokens)
    assert 2 in sizes
    failure = joint_check(lambda n: samples[n], expected, N_SAMPLES)
    assert failure is None, failure


def test_a_recurrent_target_is_refused_with_the_reason(hybrid_ggufs) -> None:  # type: ignore[no-untyped-def]
    t = lb.load(str(hybrid_ggufs["lfm2"][0]), n_ctx=256, threads=1)
    try:
        with pytest.raises(UnsupportedModelError, match="--parallel 1"):
            LlamaParallel(t, 2, 128)
    finally:
        t.close()
