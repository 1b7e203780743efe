"""EAGLE-3 on MLX: hidden-state capture on mlx-lm targets (localspec/backends/mlx/capture.py) and the EAGLE-3 head in
its Hugging Face layouts (localspec/backends/mlx/eagle3.py), on tiny random models.

Capture must leave the target's logits bit-identical; greedy speculative output must equal plain greedy
output (ours and mlx-lm's own generate_step) in both layouts and on a hybrid target; and, on the llama.cpp golden
cases converted to MLX, the drafts of every round must be llama.cpp's own. What every head keeps (the exact rule's
chi-square, rollback equals a fresh drafter) is tests/test_head_contract.py's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx_heads  # noqa: E402
import mlx_tiny  # noqa: E402
from head_chi import run  # noqa: E402

from localspec.backends.base import sync_cache  # noqa: E402
from localspec.backends.mlx import backend as mb  # noqa: E402
from localspec.backends.mlx.eagle3 import Eagle3Drafter  # noqa: E402
from localspec.decoding.drafters import NoDrafter  # noqa: E402
from localspec.errors import ModelFileError, UnsupportedModelError  # noqa: E402
from localspec.sampling import SamplingParams  # noqa: E402

TARGET_CONFIG = {**mlx_tiny.CONFIG, "num_hidden_layers": 4}
LAYERS = (0, 2, 4)  # 4: the last layer's output
PROMPT = "Once upon a time, there was a"
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mlx-eagle3")
    target = mlx_tiny.build(root / "target", seed=1, config=TARGET_CONFIG)
    hybrid = mlx_tiny.build(root / "hybrid", seed=2, config=mlx_tiny.QWEN35_CONFIG)
    t = mb.load(str(target), n_ctx=512)
    prompt = t.tokenize(PROMPT)
    plain = run(t, NoDrafter(), prompt, max_tokens=24, num_draft=0, sampling=GREEDY).tokens
    t.close()
    near = sorted(set(plain))  # a head that can only draft what the target says: some drafts pass
    return {
        "target": target,
        "hybrid": hybrid,
        "head": mlx_heads.write_eagle3(root / "head", TARGET_CONFIG, seed=3, layer_ids=LAYERS),
        "speculators": mlx_heads.write_eagle3(
            root / "spec",
            TARGET_CONFIG,
            seed=4,
            layer_ids=LAYERS,
            layout=mlx_heads.SPECULATORS,
            norm_before_residual=True,
        ),  # fmt: skip
        "near": mlx_heads.save_eagle3(
            root / "near",
            _near_tensors(len(near)),
            _config(),
            layout=mlx_heads.ORIGINAL,
            layer_ids=LAYERS,
            d2t=np.array(near),
        ),
        "hybrid_head": mlx_heads.write_eagle3(
            root / "hhead", mlx_tiny.QWEN35_CONFIG, seed=5, layer_ids=(0, 2, 4), draft_vocab=16
        ),  # fmt: skip
    }


def _config() -> dict:  # type: ignore[type-arg]
    return mlx_heads._llama_config(64, 4, 2, 128, mlx_tiny.N_VOCAB, 1e-6, 10000.0)


def _near_tensors(n_out: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(6)
    return mlx_heads.eagle3_tensors(
        rng, hidden=64, target_hidden=64, heads=4, kv_heads=2, ff=128, n_out=n_out, scale=1.0
    )


@pytest.fixture(scope="module")
def target(files: dict[str, Path]):  # type: ignore[no-untyped-def]
    t = mb.load(str(files["target"]), n_ctx=512)
    yield t
    t.close()


# -- capture -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["target", "hybrid"])
def test_capture_keeps_the_logits_bit_identical_and_the_features_follow_rollback(
    files: dict[str, Path], which: str
) -> None:
    import mlx.core as mx

    plain = mb.load(str(files[which]), n_ctx=256)
    tapped = mb.load(str(files[which]), n_ctx=256)
    try:
        tokens = plain.tokenize("hello world, this is a test of the capture")
        n_layers = len(tapped.model.layers)
        tapped.capture_layers([0, 2, n_layers])
        assert type(tapped.model.layers[0]).__name__.startswith("Tapped")
        a, b = plain.forward(tokens), tapped.forward(tokens)
        assert np.array_equal(a, b)
        full = np.asarray(tapped.features(0, len(tokens)))
        assert full.shape == (len(tokens), 3 * 64)
        assert np.array_equal(full[:, :64], np.asarray(tapped.embed_tokens(mx.array(tokens))))  # layer 0's input
        tapped.rollback(5)  # a hybrid restores its saved state and reads the kept tokens again
        again = tapped.forward(tokens[5:])
        assert np.array_equal(again, b[5:])
        np.testing.assert_allclose(np.asarray(tapped.features(0, len(tokens))), full, atol=1e-5)
        tapped.release_capture()
        assert not type(tapped.model.layers[0]).__name__.startswith("Tapped")
        tapped.rollback(0)
        assert np.array_equal(tapped.forward(tokens), a)
    finally:
        plain.close()
        tapped.close()


# -- greedy: the same text ------------------------------------------------------------------------------


@pytest.mark.parametrize("head", ["speculators", "near"])  # the original layout's random head: test_head_contract
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_plain_greedy_and_mlx_lm(files: dict[str, Path], target, head: str, k: int) -> None:  # type: ignore[no-untyped-def]
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    prompt = target.tokenize(PROMPT)
    plain = run(target, NoDrafter(), prompt, max_tokens=24, num_draft=0, sampling=GREEDY)
    drafter = Eagle3Drafter(target, files[head])
    try:
        spec = run(target, drafter, prompt, max_tokens=24, num_draft=k, sampling=GREEDY)
    finally:
        drafter.close()
    assert spec.tokens == plain.tokens
    assert spec.stats.n_drafted > 0
    if head == "near":
        assert 0 < spec.stats.n_accepted < spec.stats.n_drafted  # both branches: kept and rolled back
    steps = generate_step(mx.array(prompt), target.model, max_tokens=24, sampler=lambda x: mx.argmax(x, axis=-1))
    assert [int(tok) for tok, _ in steps] == list(plain.tokens)


def test_a_hybrid_target_drafts_with_its_head_and_answers_as_plain(files: dict[str, Path]) -> None:
    t = mb.load(str(files["hybrid"]), n_ctx=512)
    try:
        prompt = t.tokenize(PROMPT)
        plain = run(t, NoDrafter(), prompt, max_tokens=20, num_draft=0, sampling=GREEDY)
        drafter = Eagle3Drafter(t, files["hybrid_head"])
        try:
            spec = run(t, drafter, prompt, max_tokens=20, num_draft=3, sampling=GREEDY)
        finally:
            drafter.close()
        assert spec.tokens == plain.tokens and spec.stats.n_drafted > 0
    finally:
        t.close()


def test_a_reduced_head_vocabulary_drafts_only_mapped_target_ids(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    import json

    import mlx.core as mx

    d2t = np.arange(16) + np.asarray(mx.load(str(files["hybrid_head"] / "model.safetensors"))["d2t"])
    assert json.loads((files["hybrid_head"] / "config.json").read_text())["draft_vocab_size"] == 16
    t = mb.load(str(files["hybrid"]), n_ctx=512)
    drafter = Eagle3Drafter(t, files["hybrid_head"])
    try:
        context = t.tokenize(PROMPT)
        sync_cache(t, context[:-1], logits=False)
        drafter.prepare(context[:-1], 4)
        d = drafter.propose(context, 4, SamplingParams(temperature=1.0), np.random.default_rng(0))
        assert d.tokens and set(d.tokens) <= set(int(i) for i in d2t)
        assert d.q is not None
        outside = np.setdiff1d(np.arange(d.q.shape[1]), d2t)
        assert np.all(d.q[:, outside] == 0.0)
    finally:
        drafter.close()
        t.close()


# -- the exact rule through the real head ----------------------------------------------------------------


# -- the head's own state ------------------------------------------------------------------------------


def test_each_pair_holds_the_next_token_so_the_first_draft_reads_the_last_one(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    from head_chi import first_draft_q

    prompt = target.tokenize(PROMPT)
    drafter = Eagle3Drafter(target, files["head"])
    try:
        rows = [first_draft_q(target, drafter, [*prompt, last]) for last in (13, 42, 100)]
        again = first_draft_q(target, drafter, [*prompt, 13])
    finally:
        drafter.close()
    np.testing.assert_allclose(again, rows[0], atol=1e-5)
    assert min(float(np.abs(a - b).max()) for a, b in [(rows[0], rows[1]), (rows[1], rows[2])]) > 0.01


# -- refusals, and the front ends ----------------------------------------------------------------------


def test_a_head_that_does_not_fit_the_target_is_refused(files: dict[str, Path], target, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelFileError, match="not an EAGLE-3 head"):
        Eagle3Drafter(target, files["target"])  # a model directory, not a head
    wide = mlx_heads.write_eagle3(tmp_path / "wide", {**TARGET_CONFIG, "hidden_size": 32}, seed=1, layer_ids=LAYERS)
    with pytest.raises(UnsupportedModelError, match="hidden size 32"):
        Eagle3Drafter(target, wide)
    with pytest.raises(ModelFileError):
        Eagle3Drafter(target, tmp_path / "missing")


def test_run_picks_the_head_from_its_directory_and_auto_drives_it(files: dict[str, Path]) -> None:
    import json
    import subprocess

    base = [sys.executable, "-m", "localspec.cli", "run", "--backend", "mlx", "--target", str(files["target"]),
            "--draft", str(files["near"]), "--max-tokens", "16", "--temperature", "0", "--json", PROMPT]  # fmt: skip
    for method, label in (("eagle3", "eagle3:near"), ("auto", "eagle3:near")):
        out = subprocess.run(
            [*base, "--draft-method", method], capture_output=True, text=True, timeout=300, check=False
        )
        assert out.returncode == 0, out.stderr
        stats = json.loads(out.stdout)["stats"]
        assert stats["draft_method"] == method and label in stats["draft"]


# -- the cross-backend check: llama.cpp's golden drafts, the same weights converted to MLX ----------------


@pytest.mark.parametrize("name", ["eagle3", "eagle3-d2t", "eagle3-near"])
def test_drafts_per_round_equal_llama_cpps_on_the_converted_models(
    name: str, smollm2_path: Path, tmp_path: Path
) -> None:
    from golden_cases import CASES, load_golden, write_case
    from test_golden_drafters import replay_rounds

    from localspec.convert_gguf import convert

    case = CASES[name]
    golden = load_golden(case)
    if golden is None:
        pytest.skip(f"no {case.golden_path.name}")
    files, hashes = write_case(case, tmp_path, smollm2_path)
    assert hashes == golden["sha256"]
    target_dir = convert(files["target"], tmp_path / "target-mlx", dtype="float32")
    head_dir = mlx_heads.from_gguf_eagle3(files["draft"], tmp_path / "head-mlx")
    target = mb.load(str(target_dir), n_ctx=case.n_ctx)
    drafter = Eagle3Drafter(target, head_dir)
    try:
        ours = replay_rounds(target, drafter, golden, case.n_draft)
    finally:
        drafter.close()
        target.close()
    theirs = [r["draft"] for r in golden["rounds"]]
    assert ours == theirs


def test_the_chat_apps_picker_offers_eagle3_for_a_head_directory_only(files: dict[str, Path]) -> None:
    from localspec.tui.models import method_choices

    offered, note = method_choices("mlx", str(files["target"]), str(files["head"]))
    assert "eagle3" in offered and note == ""
    offered, _ = method_choices("mlx", str(files["target"]), str(files["target"]))  # a model, not a head
    assert not {"eagle3", "dflash", "dspark", "mtp"} & set(offered)
