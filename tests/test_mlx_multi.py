"""Several sequences of one MLX target in one batched forward (localspec/backends/mlx/multi.py), on tiny random mlx-lm
models (qwen2; a GLM-4.5-style MoE with partial RoPE; Gemma 3 with sliding windows in the mask): each
row's logits equal the sequence decoded alone, through right padding, rows that are not one contiguous
run, rollbacks of one sequence and a prefix shared between sequences; greedy answers decoded together through
parallel_decoder.ParallelDecoder equal each answered alone; each sequence decoded together follows the target's joint
distribution (chi-square at temperature 1, mixed draft lengths); a hybrid target is refused with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx_tiny
from head_chi import expected_joint
from test_llama_multi import _drive  # decode jobs together to the end
from test_verify import joint_check

from localspec.backends.mlx import backend as mb
from localspec.backends.mlx.multi import MLXParallel
from localspec.decoding.drafters import ModelDrafter, NgramDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.parallel_decoder import Job, ParallelDecoder
from localspec.errors import UnsupportedModelError
from localspec.sampling import SamplingParams

pytestmark = pytest.mark.mlx

GEMMA3_CONFIG = {
    "model_type": "gemma3_text", "vocab_size": mlx_tiny.N_VOCAB, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
    "sliding_window": 8, "sliding_window_pattern": 2, "max_position_embeddings": 4096, "tie_word_embeddings": False,
}  # fmt: skip
CONFIGS = {"qwen2": None, "glm4_moe": mlx_tiny.GLM4_MOE_CONFIG, "gemma3": GEMMA3_CONFIG}
TEXTS = ["hello world, hello world", "abc", "The quick brown fox jumps over the lazy dog.", "0123456789 0123456789"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mlx-multi")
    dirs = {name: mlx_tiny.build(root / name, seed=3, config=cfg) for name, cfg in CONFIGS.items()}
    dirs["draft"] = mlx_tiny.build(root / "draft", seed=3, base=dirs["qwen2"], noise=0.6)
    dirs["hybrid"] = mlx_tiny.build(root / "hybrid", seed=3, config=mlx_tiny.QWEN35_CONFIG)
    return dirs


@pytest.fixture(scope="module")
def loaded(model_dirs: dict[str, Path]) -> Any:
    models: dict[str, mb.MLXBackend] = {}

    def get(name: str) -> mb.MLXBackend:
        if name not in models:
            models[name] = mb.load(str(model_dirs[name]), n_ctx=512)
        return models[name]

    yield get
    for m in models.values():
        m.close()


def _alone(target: mb.MLXBackend, tokens: list[int]) -> np.ndarray:
    target.rollback(0)
    return target.forward(tokens)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_each_rows_logits_are_the_sequence_read_alone(loaded: Any, arch: str) -> None:
    """Prompts of different lengths (the longest past Gemma's window of 8), then a pass of parts of 1 to 4
    tokens over sequences 0, 2 and 3 (padded, not one contiguous run), a rollback of sequence 0, another pass, a
    rollback of sequence 2, another pass: every row is its own sequence read alone (a cut reaches its own sequence and
    no other)."""
    target = loaded(arch)
    batch = MLXParallel(target, 4, 256)
    prompts = [target.tokenize(t) for t in TEXTS]
    for i, p in enumerate(prompts):
        batch.sequences[i].forward(p[:-1], all_logits=False)
    extra = {0: [5, 6, 7], 2: [], 3: [9]}
    parts = [(i, prompts[i][-1:] + extra[i]) for i in (3, 0, 2)]
    rows = batch.forward_many(parts)
    for (i, tokens), r in zip(parts, rows):
        full = prompts[i] + extra[i]
        assert r.shape == (len(tokens), target.n_vocab)
        np.testing.assert_allclose(r, _alone(target, full)[-len(tokens) :], atol=1e-4, err_msg=f"sequence {i}")
        assert list(batch.sequences[i].cached_tokens) == full
    batch.sequences[0].rollback(len(prompts[0]))  # drop the three drafts; sequence 3's pass continues as it was
    rows = batch.forward_many([(0, [11, 12]), (3, [13])])
    np.testing.assert_allclose(rows[0], _alone(target, prompts[0] + [11, 12])[-2:], atol=1e-4)
    np.testing.assert_allclose(rows[1], _alone(target, prompts[3] + [9, 13])[-1:], atol=1e-4)
    batch.sequences[2].rollback(len(prompts[2]) - 2)  # a sequence past the first: its own row goes back, no other
    rows = batch.forward_many([(2, [14, 15]), (0, [16]), (3, [17])])
    np.testing.assert_allclose(
        rows[0], _alone(target, prompts[2][:-2] + [14, 15])[-2:], atol=1e-4, err_msg="sequence 2"
    )
    np.testing.assert_allclose(rows[1], _alone(target, prompts[0] + [11, 12, 16])[-1:], atol=1e-4, err_msg="sequence 0")
    np.testing.assert_allclose(rows[2], _alone(target, prompts[3] + [9, 13, 17])[-1:], atol=1e-4, err_msg="sequence 3")
    untouched = batch.sequences[1].forward(prompts[1][-1:])
    np.testing.assert_allclose(untouched, _alone(target, prompts[1])[-1:], atol=1e-4)


def test_a_shared_prefix_answers_as_read_and_outlives_its_donors_cut(loaded: Any) -> None:
    target = loaded("qwen2")
    batch = MLXParallel(target, 3, 256)
    prefix = target.tokenize(TEXTS[2])
    batch.sequences[2].forward(target.tokenize(TEXTS[1]))  # what sequence 2 held before is dropped
    batch.sequences[0].forward(prefix)
    batch.share(0, 2, len(prefix) - 1)
    assert list(batch.sequences[2].cached_tokens) == prefix[:-1]
    batch.sequences[0].rollback(1)
    batch.sequences[0].forward(target.tokenize(TEXTS[3]))  # the donor writes over the shared positions
    shared = batch.sequences[2].forward(prefix[-1:])
    np.testing.assert_allclose(shared, _alone(target, prefix)[-1:], atol=1e-4)
    with pytest.raises(ValueError):
        batch.share(1, 2, 1)  # sequence 1 holds nothing


def test_greedy_answers_together_equal_each_alone(loaded: Any) -> None:
    """A model drafter, two lookups and plain decoding share every pass."""
    target, draft = loaded("qwen2"), loaded("draft")
    batch = MLXParallel(target, 4, 256)
    greedy = SamplingParams(temperature=0.0)
    drafters = [NgramDrafter(), ModelDrafter(draft), NgramDrafter(), NgramDrafter()]
    jobs = {
        i: Job(i, batch.sequences[i], drafters[i], target.tokenize(text),
               GenerationConfig(max_tokens=24, num_draft=0 if i == 3 else 3, sampling=greedy))
        for i, text in enumerate(TEXTS)
    }  # fmt: skip
    together = _drive(ParallelDecoder(batch, planned=False), jobs)  # every draft as long as asked: mixed lengths
    for i, text in enumerate(TEXTS):
        cfg = GenerationConfig(max_tokens=24, num_draft=0, sampling=greedy)
        target.rollback(0)
        alone = list(generate(target, NgramDrafter(), target.tokenize(text), cfg))[-1]
        assert isinstance(alone, Done) and isinstance(together[i], Done)
        assert together[i].tokens == alone.tokens, f"prompt {i}"
    assert together[1].stats.n_drafted > 0


def test_a_prompt_read_between_the_others_passes_answers_as_alone(loaded: Any) -> None:
    """serve --parallel's interleaving on MLX: sequence 1's prompt chunks are read apart from sequence 0's passes."""
    target = loaded("qwen2")
    batch = MLXParallel(target, 2, 256)
    cfg = GenerationConfig(max_tokens=10, num_draft=2, sampling=SamplingParams(temperature=0.0))
    decoder = ParallelDecoder(batch)
    decoder.add(0, Job(0, batch.sequences[0], NgramDrafter(), target.tokenize(TEXTS[0]), cfg))
    prompt = target.tokenize(TEXTS[2])
    for fed in range(0, len(prompt) - 1, 5):
        decoder.step([(1, prompt[fed : min(fed + 5, len(prompt) - 1)])])
    assert list(batch.sequences[1].cached_tokens) == prompt[:-1]
    events = decoder.add(1, Job(1, batch.sequences[1], NgramDrafter(), prompt, cfg))
    while 1 in decoder.members:
        events += [e for key, e in decoder.step() if key == 1]
    target.rollback(0)
    alone = list(generate(target, NgramDrafter(), prompt, cfg))[-1]
    assert isinstance(events[-1], Done) and isinstance(alone, Done)
    assert events[-1].tokens == alone.tokens and events[-1].stats.n_prompt_cached == len(prompt) - 1


def test_each_sequence_decoded_together_is_distributed_as_the_target(
    loaded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sequences share every pass: a model draft of 2 and a lookup draft of 1 (planned lengths off)."""
    import head_chi

    target, draft = loaded("qwen2"), loaded("draft")
    window, n = 4, 1500
    sampling = SamplingParams(temperature=1.0, top_k=2)
    monkeypatch.setattr(head_chi, "WINDOW", window)  # the joint of the first `window` tokens
    # a prompt whose top-2 tree holds no end-of-generation token (a run that ends has no window to compare)
    for text in ("ab", "cd", "hello", "xyz", "12", "The"):
        prompt = target.tokenize(text)
        expected = expected_joint(target, prompt, sampling)
        if not any(t in target.eog_ids for seq in expected for t in seq):
            break
    else:
        pytest.fail("every prompt's top-2 tree ends a generation")
    batch = MLXParallel(target, 2, 64)
    drafter = ModelDrafter(draft)
    samples, sizes = [], set()
    for draw in range(n):
        decoder = ParallelDecoder(batch, planned=False)
        seeded = [SamplingParams(temperature=1.0, top_k=2, seed=1000 + draw + 5000 * i) for i in range(2)]
        jobs = {
            0: Job(0, batch.sequences[0], drafter, prompt,
                   GenerationConfig(max_tokens=window, num_draft=2, sampling=seeded[0])),
            1: Job(1, batch.sequences[1], NgramDrafter(), target.tokenize("xyzxyz"),
                   GenerationConfig(max_tokens=window, num_draft=1, sampling=seeded[1])),
        }  # fmt: skip
        samples.append(_drive(decoder, jobs, sizes)[0].tokens)
    assert 2 in sizes
    failure = joint_check(lambda i: samples[i], expected, n)
    assert failure is None, failure


def test_a_hybrid_target_is_refused_with_the_reason(loaded: Any) -> None:
    with pytest.raises(UnsupportedModelError, match="recurrent layers") as e:
        MLXParallel(loaded("hybrid"), 2, 128)
    assert "--parallel 1" in (e.value.hint or "")


def test_a_padded_pass_is_sized_rows_by_longest(loaded: Any) -> None:
    batch = MLXParallel(loaded("qwen2"), 3, 64)
    assert batch.pass_size([1, 4, 2]) == 12 and batch.pass_size([1, 1]) == 2
