"""Greedy rounds on the MLX backend read each row's best two tokens, picked by MLX (forward_top2), not whole rows:
the same tokens, near-ties and runner-ups as the host's arg-max over rows, exact ties to the lower id, and rows where
the picks do not pay (MLX on the CPU, unless PICK_ON_CPU) or a head taps the hidden states."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytestmark = pytest.mark.mlx

PROMPT = "<|im_start|>user\nWrite a poem about the sea.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    import mlx_tiny

    root = tmp_path_factory.mktemp("mlx-top2")
    target = mlx_tiny.build(root / "target", seed=1)
    hybrid = mlx_tiny.build(root / "qwen3_5", seed=1, config=mlx_tiny.QWEN35_CONFIG)
    return {
        "target": target,
        "noisy": mlx_tiny.build(root / "noisy", seed=2, base=target, noise=0.1),
        "hybrid": hybrid,
        "hybrid_noisy": mlx_tiny.build(root / "qwen3_5-noisy", seed=2, base=hybrid, noise=0.1,
                                       config=mlx_tiny.QWEN35_CONFIG),
    }  # fmt: skip


def _load(path: Path) -> Any:
    from localspec.backends.mlx import backend

    return backend.load(str(path), n_ctx=1024)


def _run(target: Any, drafter: Any, prompt: list[int], *, n: int = 40, k: int = 4) -> Any:
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    config = GenerationConfig(max_tokens=n, num_draft=k, sampling=SamplingParams(temperature=0.0, seed=0))
    done = list(generate(target, drafter, prompt, config))[-1]
    assert isinstance(done, Done)
    return done


def _pair(models: dict[str, Path], target: str, draft: str) -> tuple[Any, Counter[str], Counter[str]]:
    """A greedy run with a model draft: (Done, the target's reads, the draft's reads)."""
    from localspec.decoding.drafters import ModelDrafter

    t, d = _load(models[target]), _load(models[draft])
    try:
        done = _run(t, ModelDrafter(d), t.tokenize(PROMPT))
        return done, t.reads, d.reads
    finally:
        t.close()
        d.close()


def _ties(done: Any) -> list[tuple[int, int, int]]:
    return [(t.position, t.token, t.runner_up) for t in done.stats.near_ties]


@pytest.mark.parametrize("target,draft", [("target", "noisy"), ("hybrid", "hybrid_noisy")])
def test_a_greedy_round_reads_two_picks_a_row_and_no_whole_row(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, target: str, draft: str
) -> None:
    """With the picks on (as on an Apple GPU), a greedy run hands the host no whole row, target or draft, prompt
    included, and makes the same choices and near-ties as whole rows (the table saying MLX cannot pick) and as plain
    decoding; a hybrid model (its recurrent state checkpointed and restored) too."""
    from localspec.backends import registry
    from localspec.backends.mlx import backend as mb
    from localspec.decoding.drafters import NoDrafter

    monkeypatch.setattr(mb, "PICK_ON_CPU", True)  # the path a GPU runs, run here on the CPU
    picked, target_reads, draft_reads = _pair(models, target, draft)
    st = picked.stats
    assert st.n_drafted > st.n_accepted > 0  # the draft is similar: some rounds reject
    assert target_reads["rows"] == draft_reads["rows"] == 0
    assert target_reads["picks"] == 1 + st.n_rounds + st.n_drafted  # the prompt's last row, then every verified one
    assert draft_reads["picks"] == 1 + st.n_drafted  # the prompt read in (its last row unused), then one a draft

    monkeypatch.setitem(registry.BACKENDS, "mlx", dataclasses.replace(registry.MLX, top2_on_device=False))
    rows, target_reads, draft_reads = _pair(models, target, draft)
    assert target_reads["picks"] == draft_reads["picks"] == 0
    assert target_reads["rows"] == 1 + rows.stats.n_rounds + rows.stats.n_drafted
    assert rows.tokens == picked.tokens
    assert _ties(rows) == _ties(picked)
    assert np.allclose([t.gap for t in rows.stats.near_ties], [t.gap for t in st.near_ties], atol=1e-6)

    plain_target = _load(models[target])
    plain = _run(plain_target, NoDrafter(), plain_target.tokenize(PROMPT))
    plain_target.close()
    assert plain.tokens == picked.tokens


def test_picks_are_the_rows_arg_max_and_runner_up(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Pass by pass, forward_top2 gives each row's arg-max and runner-up with their logits as whole rows do: every
    row of a verify batch, and a long prompt's last row (fed in chunks, as forward feeds it)."""
    from localspec.backends.base import TopTwo
    from localspec.backends.mlx import backend as mb

    monkeypatch.setattr(mb, "PICK_ON_CPU", True)
    picks_b, rows_b = _load(models["target"]), _load(models["target"])
    picks_b.CHUNK = rows_b.CHUNK = 16  # the prompt goes in chunks
    prompt = picks_b.tokenize(PROMPT)
    assert len(prompt) > 2 * picks_b.CHUNK
    first = picks_b.forward_top2(prompt, all_rows=False)
    row = rows_b.forward(prompt, all_logits=False)
    assert first is not None and len(first) == 1
    _assert_same(first, TopTwo.of_rows(row))
    assert list(picks_b.cached_tokens) == list(rows_b.cached_tokens) == prompt
    batch = [int(first.best[0]), 10, 20, 30, 40]
    picks, rows = picks_b.forward_top2(batch), rows_b.forward(batch)
    assert picks is not None and len(picks) == len(batch)
    assert picks.best.tolist() == np.argmax(rows, axis=1).tolist()
    _assert_same(picks, TopTwo.of_rows(rows))
    assert picks_b.reads == Counter({"picks": 1 + len(batch)})


def _assert_same(picks: Any, rows: Any) -> None:
    assert picks.ids.tolist() == rows.ids.tolist()
    np.testing.assert_array_equal(picks.logits, rows.logits)  # the same float32 logits, not close ones
    assert picks.ids.dtype == np.int64 and picks.logits.dtype == np.float32


def test_an_exact_tie_goes_to_the_lower_id(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Output rows made equal (copies of the best token's lm_head row) tie exactly: the best and the runner-up are
    the two lowest of the tied ids, as numpy's arg-max and sampling.greedy_rows pick them from whole rows (a top-k or
    a partition picks among ties in any order)."""
    import mlx.core as mx

    from localspec.backends.mlx import backend as mb
    from localspec.sampling import greedy_rows

    monkeypatch.setattr(mb, "PICK_ON_CPU", True)
    b = _load(models["target"])
    prompt = b.tokenize(PROMPT)
    best = int(np.argmax(b.forward(prompt, all_logits=False)[-1]))
    tied = sorted({best, 263, (best + 101) % 256, (best + 37) % 256})  # the copies both above and below it
    weight = np.array(b.model.lm_head.weight)
    weight[tied] = weight[best]
    b.model.lm_head.weight = mx.array(weight)
    b.rollback(len(prompt) - 1)
    batch = [prompt[-1], *tied]
    rows = b.forward(batch)
    b.rollback(len(prompt) - 1)
    picks = b.forward_top2(batch)
    assert picks is not None
    assert (rows[:, tied] == rows[:, tied[:1]]).all()  # the copies tie exactly at every row
    top = np.flatnonzero(rows[0] == rows[0].max())
    assert top.tolist() == tied  # the first row's best is a tie of them all
    assert picks.ids[0].tolist() == tied[:2] and picks.logits[0, 0] == picks.logits[0, 1]
    arg_max = np.argmax(rows, axis=1)
    assert picks.best.tolist() == arg_max.tolist()
    assert picks.near_ties(len(batch), 0.1) == greedy_rows(rows.copy(), arg_max.tolist(), 0.1)[1]


def test_top_two_ties_on_a_wide_row() -> None:
    """The picks themselves, on Qwen-wide rows with ties at the top, for the runner-up, and at the highest ids."""
    pytest.importorskip("mlx.core")
    import mlx.core as mx

    from localspec.backends.mlx.backend import _top_two
    from localspec.sampling import greedy_rows

    rows = np.random.default_rng(0).standard_normal((4, 151_936)).astype(np.float32)
    rows[0, [30, 20, 10]] = 9.0
    rows[1, [5000, 70]] = 9.0
    rows[2, 100], rows[2, [300, 200, 250]] = 9.0, 8.0
    rows[3, [151_935, 151_934]] = 9.0
    ids, logits = _top_two(mx.array(rows))
    assert np.asarray(ids).tolist() == [[10, 20], [70, 5000], [100, 200], [151_934, 151_935]]
    assert np.asarray(logits).tolist() == [[9, 9], [9, 9], [9, 8], [9, 9]]
    best = np.argmax(rows, axis=1)
    assert [(i, b, r) for i, b, r, _ in greedy_rows(rows.copy(), best.tolist(), 1.5)[1]] == [
        (i, int(ids[i, 0].item()), int(ids[i, 1].item())) for i in range(4)
    ]


def test_rows_where_picks_do_not_pay_or_a_head_taps_the_passes(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLX on the CPU reads rows by default (forward_top2: None, nothing fed), and so does a model whose hidden
    states a head captures, picks forced on or not; the tokens are the same every way."""
    from localspec.backends.mlx import backend as mb
    from localspec.decoding.drafters import NgramDrafter

    def run() -> tuple[Any, Counter[str]]:
        target = _load(models["target"])
        try:
            return _run(target, NgramDrafter(), target.tokenize(PROMPT), n=24), target.reads
        finally:
            target.close()

    on_cpu, reads = run()
    assert reads["picks"] == 0 and reads["rows"] == 1 + on_cpu.stats.n_rounds + on_cpu.stats.n_drafted
    monkeypatch.setattr(mb, "PICK_ON_CPU", True)
    picked, reads = run()
    assert reads["rows"] == 0 and reads["picks"] == 1 + picked.stats.n_rounds + picked.stats.n_drafted
    assert picked.tokens == on_cpu.tokens

    b = _load(models["target"])
    b.capture_layers([1])
    assert b.forward_top2([10, 20]) is None and list(b.cached_tokens) == [] and not b.reads
    b.release_capture()
    picks = b.forward_top2([10, 20])
    assert picks is not None and len(picks) == 2 and list(b.cached_tokens) == [10, 20]
    monkeypatch.setattr(mb, "PICK_ON_CPU", False)
    assert b.forward_top2([30]) is None and list(b.cached_tokens) == [10, 20]
    b.close()
