"""EAGLE-3 heads on real llama.cpp (tiny random GGUFs), the staging-symbol checks, and the refusals.

What every head keeps (greedy equals plain, the exact rule's chi-square, rollback equals a fresh drafter) is
tests/test_head_contract.py's; here, what is EAGLE-3's own on llama.cpp: a reduced head vocabulary, which token
a pair holds, aborts, the capture's lifetime, the pipeline and auto, and the refusals.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from head_chi import first_draft_q, run

from localspec.backends.base import sync_cache
from localspec.backends.llama import backend as lb
from localspec.backends.llama import ext as llama_ext
from localspec.backends.llama.eagle3 import Eagle3Drafter
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Done, GenerationConfig
from localspec.errors import (
    BackendUnavailableError,
    Interrupted,
    ModelFileError,
    UnsupportedModelError,
)
from localspec.options import ModelOptions
from localspec.pipeline import load_pipeline
from localspec.sampling import SamplingParams

LAYERS = (0, 2, 3)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    from gguf_factory import write_tiny_eagle3, write_tiny_llama

    d = tmp_path_factory.mktemp("eagle3")
    f = {
        "target": d / "target.gguf",
        "head": d / "eagle3-head.gguf",
        "head_d2t": d / "eagle3-head-d2t.gguf",
        "head_deep": d / "eagle3-head-deep.gguf",
        "head_wide": d / "eagle3-head-wide.gguf",
        "qwen2": d / "qwen2-target.gguf",
    }
    write_tiny_llama(f["target"], smollm2_path, seed=0, n_layer=4)
    write_tiny_llama(f["qwen2"], smollm2_path, seed=0, n_layer=4, arch="qwen2")
    write_tiny_eagle3(f["head"], smollm2_path, target_layers=LAYERS)
    d2t = write_tiny_eagle3(f["head_d2t"], smollm2_path, target_layers=LAYERS, draft_vocab=2048, seed=11)
    np.save(d / "head_d2t.npy", d2t)
    write_tiny_eagle3(f["head_deep"], smollm2_path, target_layers=(2, 16, 29))
    write_tiny_eagle3(f["head_wide"], smollm2_path, target_layers=LAYERS, hidden_size=4096)
    return f


@pytest.fixture(scope="module")
def target(files: dict[str, Path]):  # type: ignore[no-untyped-def]
    t = lb.load(files["target"], n_ctx=512, threads=1)
    yield t
    t.close()


# -- the library's symbols --------------------------------------------------------------------------


def test_each_family_is_reported_available_or_with_a_reason() -> None:
    status = llama_ext.all_family_status()
    assert set(status) == {"eagle3", "mtp", "dflash", "dspark"}
    for family in ("eagle3", "mtp", "dflash", "dspark"):
        assert status[family].available and status[family].reason == "available"
        assert llama_ext.missing_symbols(family) == []  # every symbol found under one of its names


def test_a_symbol_missing_from_the_library_disables_its_family(monkeypatch: pytest.MonkeyPatch) -> None:
    real = llama_ext._SYMBOLS["get_embeddings_layer_inp"]
    renamed = llama_ext._Symbol(("llama_get_embeddings_layer_inp_v2", "_Z99renamed"), real.argtypes, real.restype)
    monkeypatch.setitem(llama_ext._SYMBOLS, "get_embeddings_layer_inp", renamed)
    llama_ext._lookup.cache_clear()
    try:
        status = llama_ext.family_status("eagle3")
        assert not status.available and "llama_get_embeddings_layer_inp_v2" in status.reason
        with pytest.raises(BackendUnavailableError, match="eagle3 cannot run here"):
            llama_ext.require_family("eagle3")
    finally:
        monkeypatch.undo()
        llama_ext._lookup.cache_clear()
    assert llama_ext.family_status("eagle3").available


# -- exactness ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_with_a_reduced_head_vocabulary_equals_plain_greedy(files: dict[str, Path], target, k: int) -> None:  # type: ignore[no-untyped-def]
    """d2t maps the head's vocabulary back inside llama.cpp's graph (the full-vocabulary head: test_head_contract)."""
    prompt = target.tokenize("Write a Python function that returns the n-th Fibonacci number.")
    plain = run(target, NoDrafter(), prompt, max_tokens=48)
    drafter = Eagle3Drafter(target, files["head_d2t"])
    try:
        spec = run(target, drafter, prompt, max_tokens=48, num_draft=k)
    finally:
        drafter.close()
    assert spec.tokens == plain.tokens
    assert spec.stats.n_drafted > 0 and spec.stats.draft_method == "eagle3"


def test_a_reduced_head_vocabulary_drafts_only_mapped_target_ids(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    d2t = {int(i) for i in np.load(files["head_d2t"].parent / "head_d2t.npy")}
    drafter = Eagle3Drafter(target, files["head_d2t"])
    try:
        prompt = target.tokenize("Once upon a time")
        sync_cache(target, prompt, logits=False)
        drafter.prepare(prompt, 4)
        ctx = [*prompt, 42]
        sync_cache(target, ctx[:-1], logits=False)
        rng = np.random.default_rng(0)
        draft = drafter.propose(ctx, 4, SamplingParams(temperature=1.0), rng)
        assert len(draft.tokens) == 4 and set(draft.tokens) <= d2t
        assert draft.q is not None and draft.q.shape == (4, target.n_vocab)
        outside = np.setdiff1d(np.arange(target.n_vocab), sorted(d2t))
        assert np.all(draft.q[:, outside] == 0.0)  # q lives on the head's vocabulary only
    finally:
        drafter.close()


# -- the head's own state ------------------------------------------------------------------------------


def test_each_pair_holds_the_next_token_so_the_first_draft_reads_the_last_one(
    files: dict[str, Path], target: lb.LlamaCppBackend
) -> None:
    """Pair P is (context[P+1], g[P]): the last pair carries the last context token. Contexts that differ only
    in it (the target holding the same prefix, so the same features) must give different first drafts. Pairs
    shifted by one, (context[P], g[P]), never feed the last token: every such draft would be the same, and
    greedy output would stay right with only the acceptance lost."""
    prompt = target.tokenize("def fibonacci(n):")
    drafter = Eagle3Drafter(target, files["head"])
    try:
        rows = [first_draft_q(target, drafter, [*prompt, last]) for last in (13, 42, 1000)]
        again = first_draft_q(target, drafter, [*prompt, 13])
    finally:
        drafter.close()
    np.testing.assert_allclose(again, rows[0], atol=1e-4)  # the same context drafts the same (seen: 7e-7)
    gaps = [float(np.abs(a - b).max()) for a, b in itertools.combinations(rows, 2)]
    assert min(gaps) > 0.01, gaps  # seen: 0.08 to 0.26


def test_an_abort_stops_the_head_and_leaves_its_cache_consistent(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    prompt = target.tokenize("def fibonacci(n):")
    context = [*prompt, 13]
    drafter = Eagle3Drafter(target, files["head"])
    fresh = Eagle3Drafter(target, files["head"])
    try:
        sync_cache(target, context[:-1], logits=False)
        target.abort(True)  # Ctrl-C: the head shares the target's flag
        with pytest.raises(Interrupted):
            drafter.propose(context, 3, SamplingParams(), np.random.default_rng(0))
        target.abort(False)
        a = drafter.propose(context, 3, SamplingParams(), np.random.default_rng(0))
        b = fresh.propose(context, 3, SamplingParams(), np.random.default_rng(0))
        assert a.tokens == b.tokens and len(a.tokens) == 3
    finally:
        target.abort(False)
        drafter.close()
        fresh.close()


def test_closing_a_head_drafter_ends_the_capture_only_when_no_other_needs_it(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    prompt = target.tokenize("def fibonacci(n):")
    first, second = Eagle3Drafter(target, files["head"]), Eagle3Drafter(target, files["head"])
    try:
        sync_cache(target, prompt, logits=False)
        first.close()
        assert target.features(0, len(prompt)).shape[0] == len(prompt)  # the second drafter still reads them
        assert len(second.propose([*prompt, 13], 3, SamplingParams(), np.random.default_rng(0)).tokens) == 3
    finally:
        second.close()
    # The last one released it: a method run next on this target (bench, serve) pays for no capture.
    sync_cache(target, [*prompt, 13], logits=False)
    with pytest.raises(ValueError, match="no features"):
        target.features(0, 1)


# -- through the pipeline, and the refusals -----------------------------------------------------------------


def test_pipeline_builds_the_eagle3_drafter(files: dict[str, Path]) -> None:
    opts = ModelOptions(
        target=str(files["target"]), draft=str(files["head"]), draft_method="eagle3", n_ctx=512, threads=1
    )
    pipe = load_pipeline(opts)
    try:
        assert pipe.drafter.method == "eagle3" and pipe.draft is None  # the head is the drafter's, not a Backend
        done = list(pipe.generate("Hello there", GenerationConfig(max_tokens=12, num_draft=3)))[-1]
        assert isinstance(done, Done) and done.stats.draft_method == "eagle3" and done.stats.n_drafted > 0
        other = pipe.new_drafter("eagle3")
        assert other.method == "eagle3"
        other.close()
    finally:
        pipe.close()


def test_auto_drafts_with_a_head_given_as_draft_where_its_measured_costs_can_pay(files: dict[str, Path]) -> None:
    """`--draft-method auto --draft HEAD.gguf`: the head takes the draft model's place in auto (its costs
    measured and remembered, picked per round); where the remembered costs say it cannot pay, it is not
    built at all (the target then captures nothing)."""
    from localspec.decoding.auto import AutoDrafter
    from localspec.decoding.policy import CostModel

    opts = ModelOptions(
        target=str(files["target"]), draft=str(files["head"]), draft_method="auto", n_ctx=512, threads=1
    )
    assert opts.auto_head == "eagle3" and not opts.uses_draft_model
    greedy = GenerationConfig(max_tokens=16, num_draft=4, sampling=SamplingParams(temperature=0.0))
    plain = load_pipeline(opts.with_method("none"))
    try:
        *_, want = plain.generate("Hello there", greedy)
    finally:
        plain.close()
    pipe = load_pipeline(opts)
    try:
        store = pipe.cost_store
        store.save(CostModel(target={1: 0.030, 2: 0.031, 5: 0.032, 9: 0.033, 33: 0.04}, draft_token=0.002))  # GPU-like
    finally:
        pipe.close()
    pipe = load_pipeline(opts)
    try:
        assert isinstance(pipe.drafter, AutoDrafter) and isinstance(pipe.drafter.model, Eagle3Drafter)
        *_, done = pipe.generate("Hello there", greedy)
        assert isinstance(done, Done) and done.tokens == want.tokens
        assert any(s.source == "eagle3" and s.drafted > 0 for s in done.stats.sources), done.stats.sources
        other = pipe.new_drafter("auto")  # the server's per-request drafter gets the head too
        assert isinstance(other, AutoDrafter) and isinstance(other.model, Eagle3Drafter)
        other.close()
    finally:
        pipe.close()
    store.save(CostModel(target={1: 0.030, 2: 0.054, 5: 0.1, 9: 0.2, 33: 0.45}, draft_token=0.019))  # CPU-like
    pipe = load_pipeline(opts)
    try:
        assert isinstance(pipe.drafter, AutoDrafter) and pipe.drafter.model is None
        assert "the eagle3 head not loaded" in pipe.draft_note
        *_, done = pipe.generate("Hello there", greedy)
        assert isinstance(done, Done) and done.tokens == want.tokens
    finally:
        pipe.close()


@pytest.mark.parametrize(
    ("head", "error", "words"),
    [
        ("target", ModelFileError, "not an EAGLE-3 head"),
        ("head_deep", UnsupportedModelError, "has 4 layers"),
        ("head_wide", UnsupportedModelError, "hidden size 4096"),
    ],
)
def test_a_head_that_does_not_fit_the_target_is_refused_before_loading(
    files: dict[str, Path], head: str, error: type, words: str
) -> None:
    opts = ModelOptions(
        target=str(files["target"]), draft=str(files[head]), draft_method="eagle3", n_ctx=512, threads=1
    )
    with pytest.raises(error, match=words) as info:
        load_pipeline(opts)
    assert info.value.hint


def test_capture_on_an_architecture_without_the_hook_is_refused_in_process(files: dict[str, Path]) -> None:
    qwen2 = lb.load(files["qwen2"], n_ctx=256, threads=1)
    try:
        with pytest.raises(UnsupportedModelError, match="'qwen2' model") as info:
            qwen2.capture_layers(list(LAYERS))
        assert "llama, qwen3" in info.value.hint
        assert qwen2.forward(qwen2.tokenize("still alive")).shape[1] == qwen2.n_vocab  # nothing was enabled
    finally:
        qwen2.close()


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


def test_qwen2_target_with_an_eagle3_head_is_a_clear_error_and_the_process_lives(files: dict[str, Path]) -> None:
    cli = _python(f"""
        import sys
        from localspec.cli import main
        sys.exit(main(["run", "--target", {str(files["qwen2"])!r}, "--draft", {str(files["head"])!r},
                       "--draft-method", "eagle3", "--n-ctx", "256", "--threads", "1", "--max-tokens", "4", "--raw", "hello"]))
    """)
    assert cli.returncode == 1, cli.stderr  # a LocalspecError, not SIGABRT (-6)
    assert "'qwen2' model" in cli.stderr and "hint:" in cli.stderr
    # The drafter itself refuses too (a front end that skipped the pipeline's check), and the process goes on.
    direct = _python(f"""
        from localspec.backends.llama import backend as lb
        from localspec.backends.llama.eagle3 import Eagle3Drafter
        from localspec.errors import UnsupportedModelError
        t = lb.load({str(files["qwen2"])!r}, n_ctx=256, threads=1)
        try:
            Eagle3Drafter(t, {str(files["head"])!r})
        except UnsupportedModelError as e:
            print("refused:", e.message)
        print("alive", t.forward(t.tokenize("hi")).shape)
    """)
    assert direct.returncode == 0, direct.stderr
    assert "refused:" in direct.stdout and "alive" in direct.stdout


def test_without_the_check_llama_cpp_would_abort_the_process(files: dict[str, Path]) -> None:
    """Why the architecture check exists: enabling capture on qwen2 kills the process (SIGABRT)."""
    crash = _python(f"""
        from localspec.backends.llama import backend as lb, ext as llama_ext
        t = lb.load({str(files["qwen2"])!r}, n_ctx=256, threads=1)
        llama_ext.set_layer_capture(t.handle[1], 0, True)
        t.forward(t.tokenize("hi"))
        print("survived")
    """)
    assert crash.returncode == -signal.SIGABRT and "survived" not in crash.stdout
