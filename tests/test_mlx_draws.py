"""Sampled rounds on the MLX backend read one token a row, drawn by MLX where the model runs (forward_draws): the
draws follow the rows' softmax, and a sampled run with lookup drafts reads no whole row after the prompt's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from draw_checks import pit, softmax_rows, uniform_pvalue  # noqa: E402

pytestmark = pytest.mark.mlx

PROMPT = "<|im_start|>user\nWrite a poem about the sea.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    import mlx_tiny

    return mlx_tiny.build(tmp_path_factory.mktemp("mlx-draws") / "target", seed=1)


def _load(path: Path) -> Any:
    from localspec.backends.mlx import backend

    return backend.load(str(path), n_ctx=1024)


def test_draws_follow_the_rows_softmax_pass_after_pass(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the draws on (as on an Apple GPU), every row's draw follows softmax(logits / T) of the row forward hands
    back for the same batch (the draws' randomized probability integral transforms are uniform; against another
    temperature they are not: the check's own check), and passes do not repeat each other's draws."""
    from localspec.backends.mlx import backend as mb

    monkeypatch.setattr(mb, "PICK_ON_CPU", True)
    t, rng = 1.0, np.random.default_rng(11)
    b = _load(model)
    try:
        prompt = b.tokenize(PROMPT)
        head, batch = prompt[:-6], prompt[-6:]
        b.forward(head, all_logits=False)
        rows = np.array(b.forward(batch))
        draws = []
        for i in range(400):
            b.rollback(len(head))
            one = b.forward_draws(batch, t, rng)
            assert one is not None and len(one) == len(batch)
            if i == 0:
                probs = np.stack([b.drawn_probs(j) for j in range(len(batch))])
            b.commit_draws(one)
            draws.append(one)
        assert b.reads["draws"] == 400 * len(batch)
        b.rollback(len(head))
        cut = b.forward_draws(batch, t, rng, top_k=8)  # a draft's draws: from each row's 8 best alone
        assert cut is not None
        candidates = [b.drawn_candidates(j) for j in range(len(batch))]
    finally:
        b.close()
    for j, (ids, q) in enumerate(candidates):
        assert sorted(ids.tolist()) == sorted(np.argsort(-rows[j], kind="stable")[:8].tolist())
        assert cut[j] in ids.tolist()
        assert np.abs(q - softmax_rows(rows[j, ids], t)).max() < 1e-5
    # The softmax made beside the draws (what a model draft's rule reads): the rows' own.
    assert np.abs(probs - softmax_rows(rows, t)).max() < 1e-5
    assert len({tuple(d) for d in draws}) > 300
    assert uniform_pvalue(pit(draws, rows, t, rng)) > 1e-6
    assert uniform_pvalue(pit(draws, rows, 0.5, rng)) < 1e-6


def test_a_sampled_lookup_run_reads_one_draw_a_row(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampled run with lookup drafts hands the host the prompt's last row and then one draw a verified row; on the
    CPU without PICK_ON_CPU it reads rows (MLX's draws do not pay there)."""
    from localspec.backends.mlx import backend as mb
    from localspec.decoding.drafters import NgramDrafter, NoDrafter
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    def run(b: Any, prompt: list[int], temperature: float) -> Any:
        config = GenerationConfig(max_tokens=24, num_draft=4, sampling=SamplingParams(temperature=temperature, seed=5))
        done = list(generate(b, NgramDrafter(), prompt, config))[-1]
        assert isinstance(done, Done)
        return done

    b = _load(model)
    try:
        first = b.tokenize(PROMPT)
        answer = list(generate(b, NoDrafter(), first, GenerationConfig(max_tokens=24)))[-1].tokens
        prompt = [*first, *answer, *first]  # asked again: the answer is there to copy
        b.reads.clear()
        on_cpu = run(b, prompt, 0.3)
        assert b.reads["draws"] == 0 and b.reads["rows"] == 1 + on_cpu.stats.n_rounds + on_cpu.stats.n_drafted
        monkeypatch.setattr(mb, "PICK_ON_CPU", True)
        b.reads.clear()
        drawn = run(b, prompt, 0.3)
        st = drawn.stats
        assert st.n_drafted > 0
        assert b.reads["rows"] == 1 and b.reads["draws"] == st.n_rounds + st.n_drafted
    finally:
        b.close()


def test_a_sampled_model_draft_reads_draws_on_both_models(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampled run with a draft model: the target reads one draw a verified row (p(d) from the softmax beside
    it) and the draft model draws its tokens in its own passes; no whole row reaches the host after the prompts'."""
    import mlx_tiny

    from localspec.backends.mlx import backend as mb
    from localspec.decoding.drafters import ModelDrafter
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    monkeypatch.setattr(mb, "PICK_ON_CPU", True)
    target = _load(model)
    draft = _load(mlx_tiny.build(model.parent / "draft", seed=2))
    try:
        config = GenerationConfig(max_tokens=24, num_draft=4, sampling=SamplingParams(temperature=0.7, seed=5))
        done = list(generate(target, ModelDrafter(draft), target.tokenize(PROMPT), config))[-1]
        assert isinstance(done, Done)
        st = done.stats
        assert st.n_drafted > 0 and target.reads["rows"] == 1
        assert target.reads["draws"] == st.n_rounds + st.n_drafted
        assert draft.reads["rows"] <= 1 and draft.reads["draws"] >= st.n_drafted
    finally:
        target.close()
        draft.close()
