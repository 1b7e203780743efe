"""The llama.cpp backend on real llama.cpp: tiny generated GGUFs (fast) and the fixture models."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from draw_checks import pit, softmax_rows, uniform_pvalue

from localspec.backends.base import ChatMessage, chat_prompt_tokens
from localspec.backends.llama import backend as lb
from localspec.decoding.drafters import ModelDrafter, NgramDrafter, NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.errors import ContextOverflowError, IncompatiblePairError, ModelFileError
from localspec.options import ModelOptions
from localspec.pipeline import load_pipeline
from localspec.sampling import SamplingParams

PROMPT = "Write a Python function that returns the n-th Fibonacci number."


def _run(target, drafter, prompt, **cfg) -> Done:  # type: ignore[no-untyped-def]
    events = list(generate(target, drafter, prompt, GenerationConfig(**cfg)))
    done = events[-1]
    assert isinstance(done, Done)
    return done


@pytest.fixture(scope="module")
def tiny(tiny_ggufs):  # type: ignore[no-untyped-def]
    target = lb.load(tiny_ggufs[0], n_ctx=512)
    yield target
    target.close()


def test_forward_shapes_and_cache_tracking(tiny) -> None:  # type: ignore[no-untyped-def]
    tiny.rollback(0)
    toks = tiny.tokenize("Hello world, this is a test")
    out = tiny.forward(toks)
    assert out.shape == (len(toks), tiny.n_vocab) and out.dtype == np.float32
    assert list(tiny.cached_tokens) == toks
    last = tiny.forward([toks[0]], all_logits=False)
    assert last.shape == (1, tiny.n_vocab)
    tiny.rollback(3)
    assert list(tiny.cached_tokens) == toks[:3]


def test_batched_logits_match_single_token_steps(tiny) -> None:  # type: ignore[no-untyped-def]
    tiny.rollback(0)
    toks = tiny.tokenize("The quick brown fox jumps over the lazy dog")
    batched = tiny.forward(toks).copy()
    tiny.rollback(0)
    single = np.concatenate([tiny.forward([t]).copy() for t in toks])
    assert np.abs(batched - single).max() < 1e-3  # float32 weights: only summation order differs


def test_rollback_leaves_cache_as_if_never_extended(tiny) -> None:  # type: ignore[no-untyped-def]
    tiny.rollback(0)
    toks = tiny.tokenize("one two three four five six")
    tiny.forward(toks[:4])
    fresh = tiny.forward(toks[4:]).copy()
    tiny.forward(tiny.tokenize(" unrelated tokens that must vanish"))
    tiny.rollback(4)
    again = tiny.forward(toks[4:]).copy()
    np.testing.assert_allclose(again, fresh, atol=1e-4)


def test_prefill_longer_than_batch_is_chunked(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    small = lb.LlamaCppBackend(tiny_ggufs[0], n_ctx=512, threads=None, n_gpu_layers=0, n_batch=32)
    big = lb.load(tiny_ggufs[0], n_ctx=512)
    try:
        toks = small.tokenize(" ".join(["word"] * 100))
        assert len(toks) > 32
        a = small.forward(toks, all_logits=False)[-1].copy()
        b = big.forward(toks, all_logits=False)[-1].copy()
        np.testing.assert_allclose(a, b, atol=0.05)  # chunked attention sums in another order
        assert len(small.cached_tokens) == len(toks)
    finally:
        small.close()
        big.close()


def test_incremental_detokenizer_never_splits_utf8(tiny) -> None:  # type: ignore[no-untyped-def]
    text = "héllo 🙂 世界, naïve café"
    toks = tiny.tokenize(text, add_special=False)
    detok = tiny.detokenizer()
    parts = [detok.add([t]) for t in toks] + [detok.flush()]
    assert "".join(parts) == text
    assert all("\ufffd" not in p for p in parts)


def test_chat_template_from_gguf_metadata(tiny) -> None:  # type: ignore[no-untyped-def]
    msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    text = tiny.apply_chat_template(msgs)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    toks = chat_prompt_tokens(tiny, msgs)
    assert toks[0] == tiny.tokenize("<|im_start|>", add_special=False)[0]  # parsed as one special token
    assert 2 in tiny.eog_ids  # <|im_end|>


@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_greedy_equals_plain_greedy(tiny_ggufs, k: int) -> None:  # type: ignore[no-untyped-def]
    target, draft = lb.load(tiny_ggufs[0], n_ctx=512), lb.load(tiny_ggufs[1], n_ctx=512)
    try:
        prompt = chat_prompt_tokens(target, [ChatMessage("user", PROMPT)])
        plain = _run(target, NoDrafter(), prompt, max_tokens=40)
        spec = _run(target, ModelDrafter(draft), prompt, max_tokens=40, num_draft=k)
        ngram = _run(target, NgramDrafter(), prompt, max_tokens=40, num_draft=k)
        assert spec.tokens == plain.tokens == ngram.tokens
        assert 0 < spec.stats.n_accepted < spec.stats.n_drafted  # a similar draft: partial acceptance
    finally:
        target.close()
        draft.close()


def test_self_draft_accepts_everything_on_tiny_model(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    target, draft = lb.load(tiny_ggufs[0], n_ctx=512), lb.load(tiny_ggufs[0], n_ctx=512)
    try:
        prompt = target.tokenize(PROMPT)
        done = _run(target, ModelDrafter(draft), prompt, max_tokens=48, num_draft=4)
        assert done.stats.acceptance_rate == 1.0 and done.stats.n_drafted > 0
    finally:
        target.close()
        draft.close()


def test_a_greedy_round_reads_two_picks_a_row_and_no_whole_row(tiny_ggufs, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp picks each row's best two tokens in its graph (BackendSpec.top2_on_device): a greedy run copies no
    whole row to the host, target or draft, prompt included, and makes the same choices and near-ties as the host's
    arg-max over whole rows (the table saying the backend cannot pick)."""
    import dataclasses

    from localspec.backends import registry

    monkeypatch.setattr(lb, "PICK_ON_CPU", True)  # the graph path a GPU runs, run here on the CPU

    def run() -> tuple[Done, Counter, Counter]:  # type: ignore[type-arg]
        target, draft = lb.load(tiny_ggufs[0], n_ctx=512), lb.load(tiny_ggufs[1], n_ctx=512)
        try:
            prompt = chat_prompt_tokens(target, [ChatMessage("user", PROMPT)])
            done = _run(target, ModelDrafter(draft), prompt, max_tokens=40, num_draft=4)
            return done, target.reads, draft.reads
        finally:
            target.close()
            draft.close()

    picked, target_reads, draft_reads = run()
    st = picked.stats
    assert st.n_drafted > st.n_accepted > 0  # the draft is similar: some rounds reject
    assert target_reads["rows"] == draft_reads["rows"] == 0
    assert target_reads["picks"] == 1 + st.n_rounds + st.n_drafted  # the prompt's last row, then every verified one
    assert draft_reads["picks"] == 1 + st.n_drafted  # the prompt read in (its last row unused), then one a draft

    monkeypatch.setitem(registry.BACKENDS, "llama", dataclasses.replace(registry.LLAMA, top2_on_device=False))
    rows, target_reads, draft_reads = run()
    assert target_reads["picks"] == draft_reads["picks"] == 0
    assert target_reads["rows"] == 1 + rows.stats.n_rounds + rows.stats.n_drafted
    assert draft_reads["rows"] == 1 + rows.stats.n_drafted
    assert rows.tokens == picked.tokens
    assert [(t.position, t.token, t.runner_up) for t in rows.stats.near_ties] == [
        (t.position, t.token, t.runner_up) for t in st.near_ties
    ]
    assert np.allclose([t.gap for t in rows.stats.near_ties], [t.gap for t in st.near_ties], atol=1e-6)


def test_rows_where_picks_do_not_pay_or_the_build_cannot(tiny_ggufs, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Picks only where they pay and the build has them: with the logits on the CPU (this machine) greedy runs read
    rows unless PICK_ON_CPU says otherwise, and a llama-cpp-python without llama_set_sampler (older builds) reads
    rows too (forward_top2: None, nothing fed); the tokens are the same every way."""
    import llama_cpp

    def run() -> tuple[Done, Counter]:  # type: ignore[type-arg]
        target = lb.load(tiny_ggufs[0], n_ctx=512)
        try:
            prompt = chat_prompt_tokens(target, [ChatMessage("user", PROMPT)])
            return _run(target, NgramDrafter(), prompt, max_tokens=24, num_draft=4), target.reads
        finally:
            target.close()

    on_cpu, reads = run()
    assert reads["picks"] == 0 and reads["rows"] == 1 + on_cpu.stats.n_rounds + on_cpu.stats.n_drafted
    monkeypatch.setattr(lb, "PICK_ON_CPU", True)
    picked, reads = run()
    assert reads["rows"] == 0 and reads["picks"] == 1 + picked.stats.n_rounds + picked.stats.n_drafted
    monkeypatch.delattr(llama_cpp, "llama_set_sampler")
    rows, reads = run()
    assert reads["picks"] == 0 and reads["rows"] == 1 + rows.stats.n_rounds + rows.stats.n_drafted
    assert rows.tokens == picked.tokens == on_cpu.tokens


def _sampled_counts(backend: lb.LlamaCppBackend, n: int) -> list[tuple[int, int]]:
    """(probabilities, logits) llama.cpp copied to the host for each of the last pass's n output rows."""
    ctx = backend._ctx
    return [
        (llama_cpp.llama_get_sampled_probs_count_ith(ctx, i), llama_cpp.llama_get_sampled_logits_count_ith(ctx, i))
        for i in range(n)
    ]


def test_draws_in_the_graph_follow_the_rows_and_need_their_commits(tiny_ggufs, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp's dist sampler in the graph (forward_draws), run on the CPU here: every row's draw follows
    softmax(logits / T) of the row forward hands back for the same batch, pass after pass (the draws' randomized
    probability integral transforms are uniform; against another temperature they are not: the check's own
    check). Its draws are transactional: a pass takes the uniforms after those committed, so without
    commit_draws it repeats the last pass's draws, which is why the engine commits every draw it emits."""
    monkeypatch.setattr(lb, "PICK_ON_CPU", True)
    t, rng = 1.0, np.random.default_rng(7)
    target = lb.load(tiny_ggufs[0], n_ctx=512)
    try:
        prompt = target.tokenize(PROMPT)
        head, batch = prompt[:-8], prompt[-8:]
        target.forward(head, all_logits=False)
        rows = target.forward(batch).copy()
        draws = []
        for i in range(400):
            target.rollback(len(head))
            one = target.forward_draws(batch, t, rng)
            assert one is not None and len(one) == len(batch)
            if i == 0:
                probs = np.stack([target.drawn_probs(j) for j in range(len(batch))])
                copied = _sampled_counts(target, len(batch))
                target.rollback(len(head))
                assert target.forward_draws(batch, t, rng) == one  # nothing committed: the same uniforms
            target.commit_draws(one)
            draws.append(one)
        assert target.reads["draws"] == 401 * len(batch)
        target.rollback(len(head))
        cut = target.forward_draws(batch, t, rng, top_k=8)  # a draft's draws: from each row's 8 best alone
        assert cut is not None
        candidates = [target.drawn_candidates(j) for j in range(len(batch))]
        copied_top = _sampled_counts(target, len(batch))
        # A pass that reads no softmax: only the ids come over, unless a chain that copies it is attached already
        # (it is kept: changing chains re-plans llama.cpp's graph).
        kept = target.forward_draws(batch, t, rng, top_k=8, probs=False)
        copied_kept = _sampled_counts(target, len(batch))
        target.forward(head, all_logits=False)  # rows: the chain comes off
        target.rollback(len(head))
        bare = target.forward_draws(batch, t, rng, probs=False)
        copied_bare = _sampled_counts(target, len(batch))
    finally:
        target.close()
    # What llama.cpp brought to the host a row: the softmax, not the scaled logits beside it (none read them).
    assert copied == [(target.n_vocab, 0)] * len(batch) and copied_top == [(8, 0)] * len(batch)
    assert kept is not None and copied_kept == copied_top
    assert bare is not None and len(bare) == len(batch) and copied_bare == [(0, 0)] * len(batch)
    for j, (ids, q) in enumerate(candidates):
        best = np.argsort(-rows[j], kind="stable")[:8]
        assert sorted(ids.tolist()) == sorted(best.tolist()) and cut[j] in ids.tolist()
        assert np.abs(q - softmax_rows(rows[j, ids], t)).max() < 1e-5
    # The softmax the draws came from, copied beside them (what a model draft's rule reads): the rows' own.
    assert np.abs(probs - softmax_rows(rows, t)).max() < 1e-5 and probs.shape == rows.shape
    assert len({tuple(d) for d in draws}) > 300  # committed: fresh uniforms every pass
    assert uniform_pvalue(pit(draws, rows, t, rng)) > 1e-6
    assert uniform_pvalue(pit(draws, rows, 0.5, rng)) < 1e-6


def test_a_sampled_lookup_round_reads_one_draw_a_row(tiny_ggufs, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A sampled run with lookup drafts reads one draw a verified row and no whole row after the prompt's; a model
    draft too, under either rule, and the draft model draws its tokens in its own passes (q from their softmax)."""
    monkeypatch.setattr(lb, "PICK_ON_CPU", True)
    target, draft = lb.load(tiny_ggufs[0], n_ctx=512), lb.load(tiny_ggufs[1], n_ctx=512)
    try:
        first = chat_prompt_tokens(target, [ChatMessage("user", PROMPT)])
        answer = _run(target, NoDrafter(), first, max_tokens=24).tokens
        prompt = [*first, *answer, *first[1:]]  # asked again: the answer is there to copy (gpu_check's copy_prompt)
        sampled = {"max_tokens": 24, "num_draft": 4, "sampling": SamplingParams(temperature=0.3, seed=3)}
        target.reads.clear()
        lookup = _run(target, NgramDrafter(), prompt, **sampled)
        st = lookup.stats
        assert st.n_drafted > 0
        assert target.reads["rows"] == 1 and target.reads["draws"] == st.n_rounds + st.n_drafted
        assert _sampled_counts(target, 1) == [(0, 0)]  # one-hot drafts read the draws alone: only ids were copied
        for rule in ("exact", "match"):
            target.reads.clear()
            draft.reads.clear()
            modelled = _run(target, ModelDrafter(draft), prompt, rule=rule, **sampled)
            st = modelled.stats
            assert st.n_drafted > 0 and target.reads["rows"] == 1
            assert target.reads["draws"] == st.n_rounds + st.n_drafted
            assert draft.reads["rows"] <= 1 and draft.reads["draws"] >= st.n_drafted  # rows: reading the prompt
            # The exact rule reads p(d) of a model draft: the softmax comes over; the match rule reads the draws alone.
            assert _sampled_counts(target, 1) == [(target.n_vocab if rule == "exact" else 0, 0)]
    finally:
        target.close()
        draft.close()


# -- errors a user meets --------------------------------------------------------------------------


def test_missing_not_gguf_and_truncated_files(tmp_path: Path, tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelFileError, match="not found"):
        lb.load(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    with pytest.raises(ModelFileError, match="not a GGUF"):
        lb.load(bad)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_ggufs[0].read_bytes()[:-1000])
    with pytest.raises(ModelFileError, match="truncated") as e:
        lb.load(cut)
    assert "download" in e.value.hint


def test_incompatible_pair_refused_before_loading(tiny_ggufs, qwen_header_copy: Path) -> None:  # type: ignore[no-untyped-def]
    opts = ModelOptions(target=str(qwen_header_copy), draft=str(tiny_ggufs[0]), draft_method="model")
    with pytest.raises(IncompatiblePairError) as e:
        load_pipeline(opts)  # the Qwen "file" is only a header: loading it would fail differently
    assert "vocabulary sizes differ" in e.value.message and "EOS token differs" in e.value.message


@pytest.fixture
def qwen_header_copy(tmp_path: Path) -> Path:
    """The Qwen 0.5B GGUF's header only (a few MB): enough for peek_vocab, not for loading."""
    from fixture_models import fetch

    from localspec.gguf_meta import read_gguf_header

    src = fetch("qwen-0.5b")
    header = read_gguf_header(src)
    dst = tmp_path / "qwen-header.gguf"
    with src.open("rb") as f:
        dst.write_bytes(f.read(header.data_start))
    return dst


def test_prompt_longer_than_context(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    target = lb.load(tiny_ggufs[0], n_ctx=256)
    try:
        prompt = target.tokenize(" ".join(["word"] * 400))
        with pytest.raises(ContextOverflowError, match="context holds"):
            list(generate(target, NoDrafter(), prompt, GenerationConfig(max_tokens=4)))
        # a prompt that fits but leaves little room stops at the window, not with an error
        done = _run(target, NgramDrafter(), prompt[:240], max_tokens=100)
        assert done.stats.stop_reason in ("context", "eog") and len(target.cached_tokens) <= 256
    finally:
        target.close()


# -- real fixture models --------------------------------------------------------------------------


def _first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


def _plain_logits(backend, prompt: list[int], prefix: tuple[int, ...]) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The logits after `prefix` as plain decoding computes them: the prompt in one pass, then one token at a time."""
    backend.rollback(0)
    logits = backend.forward(prompt, all_logits=False)[-1]
    for t in prefix:
        logits = backend.forward([t], all_logits=False)[-1]
    return logits


# Batched and single-token evaluation of quantized models differ in the last bits (measured up to ~0.1
# on Qwen2.5-Coder 1.5B Q4_K_M; Gemma 3's larger logits differ more: 0.6 between its top two in one
# shape). The rows of one position evaluated both ways must still be the same distribution, not a
# neighbour's: a shifted row differs by whole logits.
SAME_ROW = 1.5


def _recording_rows(backend, start: int) -> dict[tuple[int, ...], np.ndarray]:  # type: ignore[no-untyped-def]
    """Wrap the real backend's forward to keep, for every row from position `start` on, its logits keyed by
    the context it read (the last evaluation of a context wins, as the engine's does)."""
    rows: dict[tuple[int, ...], np.ndarray] = {}
    forward = backend.forward

    def recorded(tokens, *, all_logits=True):  # type: ignore[no-untyped-def]
        before = tuple(backend.cached_tokens)
        out = forward(tokens, all_logits=all_logits)
        firsts = range(len(tokens)) if all_logits else [len(tokens) - 1]
        for row, i in zip(out, firsts):
            context = (*before, *tokens[: i + 1])
            if len(context) >= start:
                rows[context] = np.array(row)
        return out

    backend.forward = recorded
    return rows


@pytest.mark.parametrize("model", ["smollm2_path", "gemma_path"])
def test_fixture_self_draft_accepts_every_token(
    model: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from localspec.backends import registry

    # The check below reads the verify rows themselves: the engine reads rows, not llama.cpp's picks.
    monkeypatch.setitem(registry.BACKENDS, "llama", dataclasses.replace(registry.LLAMA, top2_on_device=False))
    path = request.getfixturevalue(model)
    target, draft = lb.load(path, n_ctx=1024), lb.load(path, n_ctx=1024)
    try:
        prompt = chat_prompt_tokens(target, [ChatMessage("user", PROMPT)])
        plain = _run(target, NoDrafter(), prompt, max_tokens=64)
        rows = _recording_rows(target, len(prompt))
        spec = _run(target, ModelDrafter(draft), prompt, max_tokens=64, num_draft=4)
        div = _first_divergence(plain.tokens, spec.tokens)
        if div is None:
            assert spec.tokens == plain.tokens
            assert spec.stats.acceptance_rate == 1.0
        else:  # a rejection can only come from batched-vs-single arithmetic, where the streams part
            batched = rows[(*prompt, *spec.tokens[:div])]  # the verify row the speculative stream chose from
            single = _plain_logits(target, prompt, plain.tokens[:div])
            assert plain.tokens[div] == int(np.argmax(single))
            assert spec.tokens[div] == int(np.argmax(batched))  # greedy kept the target's own choice
            leaders = [plain.tokens[div], spec.tokens[div]]
            assert float(np.abs(batched[leaders] - single[leaders]).max()) < SAME_ROW, "a different position's row"
            assert float(single.max() - single[spec.tokens[div]]) < SAME_ROW
    finally:
        target.close()
        draft.close()


def test_load_reports_device(smollm2_path: Path) -> None:
    b = lb.load(smollm2_path, n_ctx=256)
    try:
        assert b.info.device.startswith(("CPU", "CUDA", "Metal", "ROCm", "Vulkan", "SYCL", "GPU"))
        assert b.info.architecture == "llama" and b.info.n_ctx >= 256
    finally:
        b.close()


def test_gguf_copy_with_other_name_loads(tmp_path: Path, tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    # No extension check: a GGUF is recognised by its magic, not its name.
    dst = tmp_path / "model.bin"
    shutil.copy(tiny_ggufs[0], dst)
    lb.load(dst, n_ctx=128).close()
