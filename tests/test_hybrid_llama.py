"""Recurrent and hybrid models on real llama.cpp: tiny random Mamba (recurrent in every layer; llama.cpp
keeps no snapshots for it, so rollbacks restore a checkpoint) and LFM2 (short convolutions beside
attention; rollbacks within the latest batch use llama.cpp's n_rs_seq snapshots) GGUFs.

Weights are float32, so batched and one-token passes agree to about 1e-4 in the logits: the tolerance
below (TOL) is far above that and far below what a stale or wrongly restored state gives (order 1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_verify import joint_check

from localspec.backends.base import ChatMessage, chat_prompt_tokens, sync_cache
from localspec.backends.llama import backend as lb
from localspec.decoding.drafters import ModelDrafter, NgramDrafter, NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.errors import UnsupportedModelError
from localspec.options import ModelOptions
from localspec.pipeline import load_pipeline
from localspec.sampling import SamplingParams, probabilities

FAMILIES = ("mamba", "lfm2")
PROMPT = "Write a Python function that returns the n-th Fibonacci number."
TOL = 2e-3  # logits: batched vs one-token float32 arithmetic differs by ~1e-4
N_GREEDY = 28  # tokens per greedy comparison


def _run(target, drafter, prompt, **cfg) -> Done:  # type: ignore[no-untyped-def]
    events = list(generate(target, drafter, prompt, GenerationConfig(**cfg)))
    done = events[-1]
    assert isinstance(done, Done)
    return done


def _plain_logits(backend, tokens: list[int]) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Logits after `tokens` as plain decoding computes them: the first in one pass, the rest one at a time."""
    backend.rollback(0)
    row = backend.forward(tokens[:1], all_logits=False)[-1]
    for t in tokens[1:]:
        row = backend.forward([t], all_logits=False)[-1]
    return row.copy()


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


# -- loading and plain decoding ---------------------------------------------------------------------------


@pytest.mark.parametrize("fam", FAMILIES)
def test_plain_decoding_is_never_refused(hybrid_ggufs, fam: str) -> None:  # type: ignore[no-untyped-def]
    target, _ = hybrid_ggufs[fam]
    pipeline = load_pipeline(ModelOptions(target=str(target), draft_method="none", max_draft=0))
    try:
        assert pipeline.target.info.is_recurrent
        assert pipeline.target.info.recurrent.startswith(("recurrent (mamba)", "hybrid (lfm2)"))
        done = None
        for event in pipeline.generate(PROMPT, GenerationConfig(max_tokens=24, num_draft=0)):
            done = event
        assert isinstance(done, Done) and len(done.tokens) == 24
        assert not pipeline.target.rollback_routes  # plain decoding never rolls back
    finally:
        pipeline.close()


def test_snapshot_window_follows_max_draft_where_llama_cpp_has_snapshots(hybrid_ggufs) -> None:  # type: ignore[no-untyped-def]
    lfm2 = lb.load(hybrid_ggufs["lfm2"][0], n_ctx=256, max_draft=6)
    mamba = lb.load(hybrid_ggufs["mamba"][0], n_ctx=256, max_draft=6)
    try:
        assert "snapshots undo up to 6 drafted tokens" in lfm2.info.recurrent
        assert "no snapshots for this architecture" in mamba.info.recurrent  # llama.cpp clamps n_rs_seq to 0
    finally:
        lfm2.close()
        mamba.close()


# -- greedy speculation equals plain greedy -------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(hybrid_ggufs, family: str):  # type: ignore[no-untyped-def]
    t_path, d_path = hybrid_ggufs[family]
    target, draft = lb.load(t_path, n_ctx=512, max_draft=8), lb.load(d_path, n_ctx=512)
    prompt = chat_prompt_tokens(target, [ChatMessage("user", PROMPT)])
    plain = _run(target, NoDrafter(), prompt, max_tokens=N_GREEDY)
    yield target, draft, prompt, plain
    target.close()
    draft.close()


@pytest.mark.parametrize("k", range(1, 9))
def test_speculative_greedy_equals_plain_greedy(loaded, k: int) -> None:  # type: ignore[no-untyped-def]
    target, draft, prompt, plain = loaded
    target.rollback_routes.clear()
    spec = _run(target, ModelDrafter(draft), prompt, max_tokens=N_GREEDY, num_draft=k)
    ngram = _run(target, NgramDrafter(), prompt, max_tokens=N_GREEDY, num_draft=k)
    assert spec.tokens == plain.tokens
    assert ngram.tokens == plain.tokens
    assert 0 < spec.stats.n_accepted < spec.stats.n_drafted  # a similar draft: partial acceptance
    routes = target.rollback_routes
    assert routes["refused"] == 0 and (routes["snapshot"] + routes["restore"]) > 0
    if target.info.architecture == "lfm2":
        # Every verify rollback fits the snapshots (k <= max_draft); the two restores are the prompts of
        # the two runs, which reuse the cache the run before left (its checkpoint at 0).
        assert routes["snapshot"] > 0 and routes["restore"] <= 2
    else:
        assert routes["snapshot"] == 0  # mamba: llama.cpp keeps no snapshots, checkpoints serve


@pytest.mark.parametrize(("t_kind", "d_kind"), [("llama", "lfm2"), ("lfm2", "llama"), ("lfm2", "mamba")])
def test_mixed_pairs_of_hybrid_and_attention_models(hybrid_ggufs, tiny_ggufs, t_kind: str, d_kind: str) -> None:  # type: ignore[no-untyped-def]
    """A hybrid draft for an attention target, and the other way round (same tokenizer: a valid pair)."""
    paths = {"llama": tiny_ggufs[0], "lfm2": hybrid_ggufs["lfm2"][0], "mamba": hybrid_ggufs["mamba"][1]}
    target, draft = lb.load(paths[t_kind], n_ctx=512, max_draft=4), lb.load(paths[d_kind], n_ctx=512)
    try:
        prompt = chat_prompt_tokens(target, [ChatMessage("user", PROMPT)])
        plain = _run(target, NoDrafter(), prompt, max_tokens=32)
        spec = _run(target, ModelDrafter(draft), prompt, max_tokens=32, num_draft=4)
        assert spec.tokens == plain.tokens
        assert spec.stats.n_drafted > 0
    finally:
        target.close()
        draft.close()


# -- the state after a partly accepted round -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fam", "max_draft", "route"), [("lfm2", 8, "snapshot"), ("lfm2", 0, "restore"), ("mamba", 8, "restore")]
)
def test_after_a_partial_round_the_next_logits_equal_plain_decoding(
    hybrid_ggufs, fam: str, max_draft: int, route: str
) -> None:  # type: ignore[no-untyped-def]
    backend = lb.load(hybrid_ggufs[fam][0], n_ctx=256, max_draft=max_draft)
    try:
        prompt = backend.tokenize(PROMPT)
        drafts = backend.tokenize(" def fib(n): return n", add_special=False)[:5]
        backend.forward(prompt, all_logits=False)
        n_before = len(backend.cached_tokens)
        backend.forward(drafts)  # a verify pass of 5: [last, d1..d4]
        backend.rollback(n_before + 2)  # two of the five kept
        assert backend.rollback_routes[route] == 1
        nxt = backend.tokenize(" x", add_special=False)[0]
        after = backend.forward([nxt], all_logits=False)[-1].copy()
        expected = _plain_logits(backend, [*prompt, *drafts[:2], nxt])
        np.testing.assert_allclose(after, expected, atol=TOL)
    finally:
        backend.close()


def test_snapshots_are_single_use_and_a_checkpoint_takes_over(hybrid_ggufs) -> None:  # type: ignore[no-untyped-def]
    backend = lb.load(hybrid_ggufs["lfm2"][0], n_ctx=256, max_draft=4)
    try:
        prompt = backend.tokenize(PROMPT)
        backend.forward(prompt, all_logits=False)
        p = len(backend.cached_tokens)
        backend.checkpoint()
        extra = backend.tokenize(" a b c d e", add_special=False)[:5]
        backend.forward(extra)  # 5 tokens: 4 snapshots undo up to 4 of them
        backend.rollback(p + 3)
        backend.rollback(p + 1)  # a second cut before the next batch: from the checkpoint at p
        assert backend.rollback_routes == {"snapshot": 1, "restore": 1}
        row = backend.forward(extra[1:2], all_logits=False)[-1].copy()
        np.testing.assert_allclose(row, _plain_logits(backend, [*prompt, *extra[:2]]), atol=TOL)
    finally:
        backend.close()


# -- rollback beyond what was kept -------------------------------------------------------------------------


def test_rollback_beyond_snapshots_and_checkpoint_is_refused_clearly(hybrid_ggufs) -> None:  # type: ignore[no-untyped-def]
    backend = lb.load(hybrid_ggufs["lfm2"][0], n_ctx=256, max_draft=4)
    try:
        prompt = backend.tokenize(PROMPT)
        backend.forward(prompt, all_logits=False)
        backend.checkpoint()
        for t in backend.tokenize(" one two three", add_special=False):
            backend.forward([t], all_logits=False)
        keep = len(prompt) - 3
        assert not backend.can_rollback(keep) and backend.can_rollback(len(prompt)) and backend.can_rollback(0)
        with pytest.raises(UnsupportedModelError) as e:
            backend.rollback(keep)
        assert "recurrent layers" in e.value.message and f"saved at {len(prompt)} tokens" in e.value.message
        assert "--draft-method none" in e.value.hint
        # sync_cache (a new prompt that shares only part of the cache) starts over instead, and gets it right
        n_cached, row = sync_cache(
            backend, [*prompt[:keep], *backend.tokenize(" other", add_special=False)], logits=True
        )
        assert n_cached == 0 and row is not None
    finally:
        backend.close()


# -- the exact rule through a hybrid target ----------------------------------------------------------------

K = 2
WINDOW = K + 2  # the prefill's token, then one full round (k drafts and the bonus)
TOP_K = 2  # two candidates per position: 2**WINDOW outcomes, few enough to count
# Few samples (each is a real prefill and round): the chi-square part only catches gross bias here, but
# a stale or wrongly restored state changes the candidates themselves, and one sample outside the
# target's top two fails at once.
N_SAMPLES = 400


def _expected_joint(backend, prompt: list[int], sampling: SamplingParams) -> dict[tuple[int, ...], float]:  # type: ignore[no-untyped-def]
    """P(x1..xn | prompt) from the target's plain (one token at a time) conditionals."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == WINDOW:
            out[prefix] = prob
            return
        p = probabilities(_plain_logits(backend, [*prompt, *prefix]), sampling)
        for x in np.flatnonzero(p):
            walk((*prefix, int(x)), prob * float(p[x]))

    walk((), 1.0)
    return out


@pytest.mark.slow  # minutes on a busy 2-core CPU
@pytest.mark.parametrize("fam", FAMILIES)
def test_exact_rule_is_distributed_as_the_hybrid_target(hybrid_ggufs, fam: str) -> None:  # type: ignore[no-untyped-def]
    t_path, d_path = hybrid_ggufs[fam]
    target, draft = lb.load(t_path, n_ctx=256, max_draft=K), lb.load(d_path, n_ctx=256)
    try:
        prompt = target.tokenize("The number")
        sampling = SamplingParams(temperature=1.5, top_k=TOP_K)
        expected = _expected_joint(target, prompt, sampling)
        drafter = ModelDrafter(draft)

        def draw(seed: int) -> tuple[int, ...]:
            config = GenerationConfig(
                max_tokens=WINDOW,
                num_draft=K,
                rule="exact",
                sampling=SamplingParams(temperature=1.5, top_k=TOP_K, seed=seed),
            )
            return _run_config(target, drafter, prompt, config).tokens

        failure = joint_check(draw, expected, N_SAMPLES)
        assert failure is None, failure
        assert sum(target.rollback_routes.values()) > 0  # rejections happened and were rolled back
    finally:
        target.close()
        draft.close()


def _run_config(target, drafter, prompt, config: GenerationConfig) -> Done:  # type: ignore[no-untyped-def]
    done = list(generate(target, drafter, prompt, config))[-1]
    assert isinstance(done, Done) and len(done.tokens) == WINDOW
    return done


def test_tiny_hybrid_files_are_what_llama_cpp_calls_recurrent(hybrid_ggufs) -> None:  # type: ignore[no-untyped-def]
    for fam, (path, _) in hybrid_ggufs.items():
        b = lb.load(Path(path), n_ctx=256)
        try:
            assert b.info.architecture == fam and b.info.is_recurrent
        finally:
            b.close()


# -- what users see: bench, doctor, the picker ---------------------------------------------------------


def _cli(*args: str):  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "localspec.cli", *args], capture_output=True, text=True, timeout=900)


def test_bench_shows_the_rollback_cost_next_to_the_verify_cost(hybrid_ggufs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import json

    t, d = hybrid_ggufs["mamba"]
    out = tmp_path / "bench.json"
    r = _cli("bench", "--target", str(t), "--draft", str(d), "--suites", "code-edit", "--prompts", "1", "--reps", "1",
             "--max-tokens", "12", "--methods", "none,model:3", "--threads", "2", "--json-out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "rollback after a rejection (k=3)" in r.stdout and "verify/round" in r.stdout
    data = json.loads(out.read_text())
    assert data["costs"]["code-edit"]["rollback_round_s"] > 0  # a restore and a re-fed token: measured
    model_row = next(row for row in data["summary"] if row["method"] == "model k=3")
    assert 0 < model_row["rollback_ms"] < model_row["verify_ms"]


def test_doctor_and_the_picker_say_a_model_is_hybrid(hybrid_ggufs) -> None:  # type: ignore[no-untyped-def]
    import json

    from localspec.tui.models import check_pair

    t, d = hybrid_ggufs["lfm2"]
    r = _cli("doctor", "--target", str(t), "--draft", str(d), "--threads", "1", "--json")
    assert r.returncode in (0, 1), r.stderr
    messages = [f["message"] for f in json.loads(r.stdout)["findings"]]
    assert any(
        m.startswith("the target is hybrid (lfm2): speculative decoding works; llama.cpp keeps snapshots")
        for m in messages
    )
    ok, text = check_pair("llama", str(t), str(hybrid_ggufs["mamba"][1]), "model")
    assert (
        ok and "target hybrid (lfm2)" in text and "draft recurrent (mamba)" in text and "restores a saved state" in text
    )
