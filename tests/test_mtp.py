"""MTP drafting on real llama.cpp: a tiny random glm4moe target whose own MTP (nextn) layer drafts.

What every head keeps (greedy equals plain, the exact rule's chi-square, rollback equals a fresh drafter) is
tests/test_head_contract.py's; here, what is MTP's own on llama.cpp: the accept path on a target whose head
often agrees with it, which token a pair holds, lag and catch_up, aborts, the pipeline and auto, and the
refusals: targets without MTP weights are refused before llama.cpp sees them (it would abort the process).
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
from localspec.backends.llama.mtp import MtpDrafter, check_target
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Done, GenerationConfig
from localspec.errors import Interrupted, UnsupportedModelError
from localspec.options import ModelOptions
from localspec.pipeline import load_pipeline
from localspec.sampling import SamplingParams

FAVOURED = (100, 101, 102, 103)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    from gguf_factory import write_tiny_glm4moe, write_tiny_llama

    d = tmp_path_factory.mktemp("mtp")
    f = {
        "target": d / "glm4moe-mtp.gguf",
        "near_greedy": d / "glm4moe-mtp-near-greedy.gguf",  # the same, with greedy drafts often accepted
        "trunk_only": d / "glm4moe-trunk-only.gguf",
        "no_mtp": d / "glm4moe-no-mtp.gguf",
        "llama": d / "llama.gguf",
    }
    write_tiny_glm4moe(f["target"], smollm2_path, seed=0)
    write_tiny_glm4moe(f["near_greedy"], smollm2_path, seed=4, favoured=FAVOURED)
    write_tiny_glm4moe(f["trunk_only"], smollm2_path, seed=0, n_mtp=0, mtp_declared=1)
    write_tiny_glm4moe(f["no_mtp"], smollm2_path, seed=0, n_mtp=0)
    write_tiny_llama(f["llama"], smollm2_path, seed=0, n_layer=2)
    return f


@pytest.fixture(scope="module")
def target(files: dict[str, Path]):  # type: ignore[no-untyped-def]
    t = lb.load(files["target"], n_ctx=512, threads=1, load_mtp=True)
    yield t
    t.close()


# -- exactness ----------------------------------------------------------------------------------------


def test_greedy_with_accepted_drafts_equals_plain_greedy(files: dict[str, Path]) -> None:
    """On the target whose head often agrees with it, so the accept path runs too."""
    t = lb.load(files["near_greedy"], n_ctx=512, threads=1, load_mtp=True)
    drafter = MtpDrafter(t)
    try:
        prompt = t.tokenize("The capital of France")
        plain = run(t, NoDrafter(), prompt, max_tokens=40)
        spec = run(t, drafter, prompt, max_tokens=40, num_draft=3)
        assert spec.tokens == plain.tokens
        assert 0 < spec.stats.n_accepted < spec.stats.n_drafted
    finally:
        drafter.close()
        t.close()


# -- the head's own state ------------------------------------------------------------------------------


def test_each_pair_holds_its_own_token_so_the_first_draft_reads_the_last_one(target: lb.LlamaCppBackend) -> None:
    """Pair P is (context[P], h[P-1]): the last pair carries the last context token, so contexts that differ
    only in it (the target holding the same prefix, so the same states) must give different first drafts."""
    prompt = target.tokenize("def fibonacci(n):")
    drafter = MtpDrafter(target)
    try:
        rows = [first_draft_q(target, drafter, [*prompt, last]) for last in (13, 42, 1000)]
        again = first_draft_q(target, drafter, [*prompt, 13])
    finally:
        drafter.close()
    np.testing.assert_allclose(again, rows[0], atol=1e-4)  # the same context drafts the same
    gaps = [float(np.abs(a - b).max()) for a, b in itertools.combinations(rows, 2)]
    assert min(gaps) > 0.01, gaps  # seen: 0.11 to 0.13


def test_lag_counts_the_pairs_to_write_and_catch_up_writes_them(target) -> None:  # type: ignore[no-untyped-def]
    prompt = target.tokenize("Once upon a time")
    context = [*prompt, 42, 43, 44]
    drafter = MtpDrafter(target)
    fresh = MtpDrafter(target)
    try:
        sync_cache(target, prompt, logits=False)
        drafter.prepare(prompt, 3)
        assert drafter.lag(prompt) == 0
        sync_cache(target, context[:-1], logits=False)  # the target took in two more tokens without us
        assert drafter.lag(context) == 3  # one pair per new token the target holds a state before
        drafter.catch_up(context)
        assert drafter.lag(context) == 0
        a = drafter.propose(context, 3, SamplingParams(), np.random.default_rng(0))
        b = fresh.propose(context, 3, SamplingParams(), np.random.default_rng(0))
        assert a.tokens == b.tokens and len(a.tokens) == 3
        # No state for the last position yet (the target is behind): no draft rather than a wrong one.
        sync_cache(target, prompt, logits=False)
        assert drafter.propose(context, 3, SamplingParams(), np.random.default_rng(0)).tokens == []
    finally:
        drafter.close()
        fresh.close()


def test_an_abort_stops_the_head_and_leaves_its_cache_consistent(target) -> None:  # type: ignore[no-untyped-def]
    prompt = target.tokenize("def fibonacci(n):")
    context = [*prompt, 13]
    drafter = MtpDrafter(target)
    fresh = MtpDrafter(target)
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


# -- through the pipeline, and the refusals -----------------------------------------------------------------


def test_pipeline_builds_the_mtp_drafter_without_a_draft_file(files: dict[str, Path]) -> None:
    opts = ModelOptions(target=str(files["target"]), draft_method="mtp", n_ctx=512, threads=1)
    pipe = load_pipeline(opts)
    try:
        assert pipe.drafter.method == "mtp" and pipe.draft is None
        done = list(pipe.generate("Hello there", GenerationConfig(max_tokens=12, num_draft=3)))[-1]
        assert isinstance(done, Done) and done.stats.draft_method == "mtp" and done.stats.n_drafted > 0
        other = pipe.new_drafter("mtp")
        assert other.method == "mtp"
        other.close()
    finally:
        pipe.close()


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("llama", "has no MTP layers"),
        ("no_mtp", "has no MTP layers"),
        ("trunk_only", "holds no weights for them"),
    ],
)
def test_a_target_without_mtp_weights_is_refused_before_loading(files: dict[str, Path], model: str, words: str) -> None:
    opts = ModelOptions(target=str(files[model]), draft_method="mtp", n_ctx=512, threads=1)
    with pytest.raises(UnsupportedModelError, match=words) as info:
        load_pipeline(opts)
    assert "--draft-method ngram" in info.value.hint


def test_several_mtp_heads_are_refused_until_chaining_is_driven(
    files: dict[str, Path], smollm2_path: Path, tmp_path: Path
) -> None:
    from gguf_factory import write_tiny_glm4moe

    two = tmp_path / "glm4moe-two-heads.gguf"
    write_tiny_glm4moe(two, smollm2_path, n_mtp=2)
    with pytest.raises(UnsupportedModelError, match="2 chained MTP heads") as info:
        check_target(two)
    assert info.value.hint


def test_a_target_loaded_without_its_mtp_layers_is_refused(files: dict[str, Path]) -> None:
    t = lb.load(files["target"], n_ctx=256, threads=1)
    try:
        with pytest.raises(UnsupportedModelError, match="loaded without its MTP layers") as info:
            MtpDrafter(t)
        assert info.value.hint
        assert t.forward(t.tokenize("still alive")).shape[1] == t.n_vocab
    finally:
        t.close()


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


def test_a_target_without_mtp_is_a_clear_error_and_the_process_lives(files: dict[str, Path]) -> None:
    cli = _python(f"""
        import sys
        from localspec.cli import main
        sys.exit(main(["run", "--target", {str(files["trunk_only"])!r}, "--draft-method", "mtp",
                       "--n-ctx", "256", "--threads", "1", "--max-tokens", "4", "--raw", "hello"]))
    """)
    assert cli.returncode == 1, cli.stderr  # a LocalspecError, not SIGABRT (-6)
    assert "holds no weights for them" in cli.stderr and "hint:" in cli.stderr
    # The drafter itself refuses too (a front end that skipped the pipeline's check), and the process goes on.
    direct = _python(f"""
        from localspec.backends.llama import backend as lb
        from localspec.backends.llama.mtp import MtpDrafter
        from localspec.errors import UnsupportedModelError
        t = lb.load({str(files["trunk_only"])!r}, n_ctx=256, threads=1, load_mtp=True)
        try:
            MtpDrafter(t)
        except UnsupportedModelError as e:
            print("refused:", e.message)
        print("alive", t.forward(t.tokenize("hi")).shape)
    """)
    assert direct.returncode == 0, direct.stderr
    assert "refused:" in direct.stdout and "alive" in direct.stdout


def test_without_the_check_llama_cpp_would_abort_the_process(files: dict[str, Path]) -> None:
    """Why the weights check exists: an MTP context on a file without the MTP block kills the process."""
    crash = _python(f"""
        import llama_cpp
        from localspec.backends.llama import backend as lb
        t = lb.load({str(files["trunk_only"])!r}, n_ctx=256, threads=1, load_mtp=True)
        params = llama_cpp.llama_context_default_params()
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.n_ctx = 256
        llama_cpp.llama_init_from_model(t.handle[0], params)
        print("survived")
    """)
    assert crash.returncode == -signal.SIGABRT and "survived" not in crash.stdout


def test_a_draft_file_given_with_mtp_is_said_to_be_unused(files: dict[str, Path]) -> None:
    import argparse

    from localspec.commands.run import ignored_options

    opts = ModelOptions(target=str(files["target"]), draft=str(files["llama"]), draft_method="mtp")
    notes = ignored_options(argparse.Namespace(draft=str(files["llama"])), opts)
    assert len(notes) == 1 and "--draft is not used by --draft-method mtp" in notes[0]
    eagle = ModelOptions(target=str(files["target"]), draft=str(files["llama"]), draft_method="eagle3")
    assert ignored_options(argparse.Namespace(draft=str(files["llama"])), eagle) == []


def test_auto_drafts_with_the_targets_own_mtp_layers_given_as_its_draft(
    files: dict[str, Path], smollm2_path: Path
) -> None:
    """A catalog MTP pair names the target file as its draft: auto then drafts with the MTP head in the draft
    model's place (costs measured and remembered); the same file without MTP layers is a self-draft."""
    from localspec.decoding.auto import AutoDrafter
    from localspec.decoding.policy import CostModel

    t = str(files["near_greedy"])
    opts = ModelOptions(target=t, draft=t, draft_method="auto", n_ctx=512, threads=1)
    assert opts.auto_head == "mtp" and not opts.uses_draft_model
    assert ModelOptions(target=str(smollm2_path), draft=str(smollm2_path), draft_method="auto").auto_head is None
    greedy = GenerationConfig(max_tokens=24, num_draft=3, sampling=SamplingParams(temperature=0.0))
    plain = load_pipeline(opts.with_method("none"))
    try:
        *_, want = plain.generate("The capital of France", greedy)
    finally:
        plain.close()
    pipe = load_pipeline(opts)
    try:
        # Costs where a draft token is free and batches cost one token's time, so that auto drafts and does
        # not cut drafts at a token the (random, unsure) head doubts.
        pipe.cost_store.save(CostModel(target={1: 0.030, 2: 0.030, 5: 0.030, 9: 0.030, 33: 0.030}, draft_token=1e-6))
    finally:
        pipe.close()
    pipe = load_pipeline(opts)
    try:
        assert isinstance(pipe.drafter, AutoDrafter) and isinstance(pipe.drafter.model, MtpDrafter)
        *_, done = pipe.generate("The capital of France", greedy)
        assert isinstance(done, Done) and done.tokens == want.tokens
        assert any(s.source == "mtp" and s.drafted > 0 for s in done.stats.sources), done.stats.sources
    finally:
        pipe.close()
