"""DFlash and DSpark block drafters on real llama.cpp (tiny random GGUFs), and the refusals.

What every head keeps (greedy equals plain, the exact rule's chi-square, rollback equals a fresh drafter) is
tests/test_head_contract.py's; here, what is the block drafters' own on llama.cpp: a bonus anchor, the block's
size and truncation, the features the block reads, lag, DSpark's confidence head, aborts, the pipeline, and the
refusals.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from head_chi import run

from localspec.backends.base import sync_cache
from localspec.backends.llama import backend as lb
from localspec.backends.llama.dflash import BlockDrafter
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.engine import Done, GenerationConfig
from localspec.errors import Interrupted, ModelFileError, UnsupportedModelError, UsageError
from localspec.options import ModelOptions
from localspec.pipeline import load_pipeline
from localspec.sampling import SamplingParams

LAYERS = (1, 2, 3)
BLOCK = 8
# name -> (drafter file, --draft-method): "dspark-bonus": slot 0 is a bonus anchor; "dflash2": a selector lattice
DRAFTERS = {
    "dflash": ("dflash", "dflash"),
    "dspark": ("dspark", "dspark"),
    "dspark-bonus": ("dspark_bonus", "dspark"),
    "dflash2": ("dflash2", "dflash"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    from gguf_factory import write_tiny_dflash, write_tiny_eagle3, write_tiny_llama

    d = tmp_path_factory.mktemp("dflash")
    f = {name: d / f"{name}.gguf" for name in (
        "target", "qwen2", "dflash", "dspark", "dspark_bonus", "dflash2", "no_mask", "deep", "wide", "eagle3")}  # fmt: skip
    write_tiny_llama(f["target"], smollm2_path, seed=0, n_layer=4)
    write_tiny_llama(f["qwen2"], smollm2_path, seed=0, n_layer=4, arch="qwen2")
    write_tiny_dflash(f["dflash"], smollm2_path, target_layers=LAYERS, block_size=BLOCK)
    write_tiny_dflash(
        f["dspark"], smollm2_path, target_layers=LAYERS, block_size=BLOCK, dspark=True, confidence=True, seed=21
    )
    write_tiny_dflash(f["dspark_bonus"], smollm2_path, target_layers=LAYERS, block_size=BLOCK, dspark=True,
                      sample_from_anchor=False, seed=22)  # fmt: skip
    write_tiny_dflash(f["dflash2"], smollm2_path, target_layers=LAYERS, block_size=BLOCK, selector_top_k=4, seed=23)
    write_tiny_dflash(f["no_mask"], smollm2_path, target_layers=LAYERS, mask_token=None)
    write_tiny_dflash(f["deep"], smollm2_path, target_layers=(2, 16, 29))
    write_tiny_dflash(f["wide"], smollm2_path, target_layers=LAYERS, hidden_size=4096)
    write_tiny_eagle3(f["eagle3"], smollm2_path, target_layers=(0, 2, 3))
    return f


@pytest.fixture(scope="module")
def target(files: dict[str, Path]):  # type: ignore[no-untyped-def]
    t = lb.load(files["target"], n_ctx=512, threads=1)
    yield t
    t.close()


def _drafter(target, files: dict[str, Path], which: str) -> BlockDrafter:  # type: ignore[no-untyped-def]
    file, method = DRAFTERS[which]
    return BlockDrafter(target, files[file], method=method)


# -- exactness ----------------------------------------------------------------------------------------


def test_greedy_with_a_bonus_anchor_equals_plain_greedy(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    """DSpark whose slot 0 is a bonus anchor drafts from slot 1, as DFlash (the others: test_head_contract)."""
    prompt = target.tokenize("Write a Python function that returns the n-th Fibonacci number.")
    plain = run(target, NoDrafter(), prompt, max_tokens=40)
    drafter = _drafter(target, files, "dspark-bonus")
    try:
        for k in (1, 3, 7):
            spec = run(target, drafter, prompt, max_tokens=40, num_draft=k)
            assert spec.tokens == plain.tokens, k
            assert spec.stats.n_drafted > 0 and spec.stats.draft_method == "dspark"
    finally:
        drafter.close()


@pytest.mark.parametrize("which", list(DRAFTERS))
def test_a_block_holds_the_longest_draft_and_a_smaller_k_truncates_it(
    files: dict[str, Path], target, which: str
) -> None:  # type: ignore[no-untyped-def]
    """As llama.cpp sizes the block by --draft-max: k only cuts the one block, and k past the trained block
    size drafts the block size (DSpark sampling from the anchor: all of it; otherwise one less)."""
    prompt = target.tokenize("def fibonacci(n):")
    context = [*prompt, 42]
    drafter = _drafter(target, files, which)  # first: turning the capture on empties the target's cache
    sync_cache(target, prompt, logits=False)
    try:
        drafter.prepare(prompt, 64)
        longest = drafter.propose(context, 64, SamplingParams(), np.random.default_rng(0)).tokens
        assert len(longest) == (BLOCK if which == "dspark" else BLOCK - 1)
        for k in (1, 3, 5):
            assert drafter.propose(context, k, SamplingParams(), np.random.default_rng(0)).tokens == longest[:k]
    finally:
        drafter.close()


def test_the_draft_reads_the_targets_features(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    """The same anchor after two different contexts drafts differently: the block attends to the
    features injected from the target, not to the anchor alone."""
    drafter = _drafter(target, files, "dflash")
    try:
        drafts = []
        for text in ("def fibonacci(n):", "The capital of France is"):
            prompt = target.tokenize(text)
            sync_cache(target, prompt, logits=False)
            drafter.prepare(prompt, 7)
            drafts.append(drafter.propose([*prompt, 42], 7, SamplingParams(temperature=1.0), np.random.default_rng(0)))
        assert drafts[0].q is not None and drafts[1].q is not None
        assert np.abs(drafts[0].q - drafts[1].q).max() > 1e-3
    finally:
        drafter.close()


# -- the drafter's own state ------------------------------------------------------------------------------


def test_lag_counts_the_features_not_yet_injected(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    prompt = target.tokenize("def fibonacci(n):")
    drafter = _drafter(target, files, "dflash")
    sync_cache(target, prompt, logits=False)
    try:
        drafter.prepare(prompt, 4)
        assert drafter.lag(prompt) == 0
        longer = [*prompt, 11, 12, 13]
        sync_cache(target, longer, logits=False)
        # The prompt's last token was the anchor then; now it and the three after it come before the anchor.
        assert drafter.lag([*longer, 14]) == 4
        drafter.catch_up([*longer, 14])
        assert drafter.lag([*longer, 14]) == 0
        assert drafter.lag([*prompt[:-2], 99, 98]) == 0  # a shorter, different context: nothing to add
    finally:
        drafter.close()


def test_dsparks_confidence_head_stops_the_draft(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    prompt = target.tokenize("def fibonacci(n):")
    context = [*prompt, 42]
    drafter = _drafter(target, files, "dspark")
    sync_cache(target, prompt, logits=False)
    try:
        drafter.prepare(context, 6)  # the features up to the anchor, then the block alone
        _, nextn = drafter._decode_block(context[-1], len(context) - 1)
        conf = nextn[:6, 0]  # the confidence of each draft slot, broadcast along its nextn row
        assert np.all((conf > 0) & (conf < 1)) and np.allclose(nextn[:6, :5], conf[:, None])
        cut = int(np.argmin(conf[1:])) + 1  # stop at the least confident slot after the first
        threshold = float(conf[cut]) + 1e-6
        want = next(i for i, c in enumerate(conf) if c < threshold)
        d = drafter.propose(context, 6, SamplingParams(), np.random.default_rng(0), min_confidence=threshold)
        assert len(d.tokens) == want and "confidence head" in d.note
    finally:
        drafter.close()


def test_an_abort_stops_the_drafter_and_leaves_its_cache_consistent(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    prompt = target.tokenize("def fibonacci(n):")
    context = [*prompt, 13]
    drafter = _drafter(target, files, "dflash")
    fresh = _drafter(target, files, "dflash")
    try:
        sync_cache(target, context[:-1], logits=False)
        target.abort(True)  # Ctrl-C: the drafter shares the target's flag
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


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_pipeline_builds_the_block_drafter(files: dict[str, Path], method: str) -> None:
    opts = ModelOptions(
        target=str(files["target"]), draft=str(files[method]), draft_method=method, n_ctx=512, threads=1
    )
    pipe = load_pipeline(opts)
    try:
        assert pipe.drafter.method == method and pipe.draft is None  # the drafter owns its model
        done = list(pipe.generate("Hello there", GenerationConfig(max_tokens=12, num_draft=3)))[-1]
        assert isinstance(done, Done) and done.stats.draft_method == method and done.stats.n_drafted > 0
        other = pipe.new_drafter(method)
        assert other.method == method
        other.close()
    finally:
        pipe.close()


@pytest.mark.parametrize(
    ("method", "draft", "error", "words"),
    [
        ("dflash", "eagle3", ModelFileError, "not a DFlash drafter"),
        ("dspark", "target", ModelFileError, "not a DSpark drafter"),
        ("dflash", "dspark", UsageError, "so it is a DSpark drafter"),
        ("dspark", "dflash", UsageError, "so it is a DFlash drafter"),
        ("dflash", "no_mask", ModelFileError, "names no mask token"),
        ("dflash", "deep", UnsupportedModelError, "has 4 layers"),
        ("dflash", "wide", UnsupportedModelError, "hidden size 4096"),
    ],
)
def test_a_drafter_that_does_not_fit_is_refused_before_loading(
    files: dict[str, Path], method: str, draft: str, error: type, words: str
) -> None:
    opts = ModelOptions(target=str(files["target"]), draft=str(files[draft]), draft_method=method, n_ctx=512, threads=1)
    with pytest.raises(error, match=words) as info:
        load_pipeline(opts)
    assert info.value.hint


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_qwen2_target_with_a_block_drafter_is_a_clear_error_and_the_process_lives(
    files: dict[str, Path], method: str
) -> None:
    cli = _python(f"""
        import sys
        from localspec.cli import main
        sys.exit(main(["run", "--target", {str(files["qwen2"])!r}, "--draft", {str(files[method])!r},
                       "--draft-method", {method!r}, "--n-ctx", "256", "--threads", "1", "--max-tokens", "4", "--raw", "hello"]))
    """)
    assert cli.returncode == 1, cli.stderr  # a LocalspecError, not SIGABRT (-6)
    assert "'qwen2' model" in cli.stderr and "DFlash" in cli.stderr and "hint:" in cli.stderr
    # The drafter itself refuses too (a front end that skipped the pipeline's check), and the process goes on.
    direct = _python(f"""
        from localspec.backends.llama import backend as lb
        from localspec.backends.llama.dflash import BlockDrafter
        from localspec.errors import UnsupportedModelError
        t = lb.load({str(files["qwen2"])!r}, n_ctx=256, threads=1)
        try:
            BlockDrafter(t, {str(files[method])!r}, method={method!r})
        except UnsupportedModelError as e:
            print("refused:", e.message)
        print("alive", t.forward(t.tokenize("hi")).shape)
    """)
    assert direct.returncode == 0, direct.stderr
    assert "refused:" in direct.stdout and "alive" in direct.stdout
