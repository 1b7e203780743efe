"""MTP on MLX (localspec/backends/mlx/mtp.py): a tiny hybrid Qwen3.5 target (Gated DeltaNet beside attention) whose
checkpoint keeps one MTP layer (tests/mlx_heads.add_mtp). Greedy speculative output equals plain greedy output
(ours and mlx-lm's generate_step); the exact rule's joint distribution matches the target's at temperature 1
through the layer (and fails for a misreported q); the layer's cache comes back right after rejected rounds;
checkpoints without the weights, and other architectures, are refused with the reason; run finds the layer
when --draft is the target itself.

Its drafts are checked round by round against mlx-vlm's Qwen3_5MTPDraftModel in tests/test_mlx_reference.py;
DeepSeek/GLM nextn MTP runs on llama.cpp only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx_heads  # noqa: E402
import mlx_tiny  # noqa: E402
from head_chi import (  # noqa: E402
    CHI_PROMPT,
    N_SAMPLES,
    TOP_K,
    check_exact_rule,
    check_fresh_after_rejections,
    draws,
    expected_joint,
    misreported,
    run,
)
from test_verify import joint_check  # noqa: E402

from localspec.backends.mlx import backend as mb  # noqa: E402
from localspec.backends.mlx.mtp import MtpDrafter, _unsanitized, safetensors_headers  # noqa: E402
from localspec.decoding.drafters import NoDrafter  # noqa: E402
from localspec.errors import ModelFileError, UnsupportedModelError  # noqa: E402
from localspec.sampling import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "Once upon a time, there was a"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mlx-mtp")
    plain = mlx_tiny.build(root / "plain", seed=2, config=mlx_tiny.QWEN35_CONFIG)
    out = {"plain": plain}
    for name, echo in (("mtp", False), ("echo", True)):
        shutil.copytree(plain, root / name)
        out[name] = mlx_heads.add_mtp(root / name, seed=3, echo=echo)
    declared = root / "declared"
    shutil.copytree(plain, declared)
    cfg = json.loads((declared / "config.json").read_text())
    (declared / "config.json").write_text(json.dumps({**cfg, "mtp_num_hidden_layers": 1}))
    out["declared"] = declared
    return out


@pytest.fixture(scope="module")
def target(dirs: dict[str, Path]):  # type: ignore[no-untyped-def]
    """The target whose MTP layer echoes its hidden state: its drafts overlap the target's enough that the
    exact rule both keeps and rejects them (a random layer's are all rejected, whatever q says)."""
    t = mb.load(str(dirs["echo"]), n_ctx=512)
    yield t
    t.close()


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("which", ["mtp", "echo"])
def test_greedy_speculative_equals_plain_greedy_and_mlx_lm(dirs: dict[str, Path], which: str, k: int) -> None:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    t = mb.load(str(dirs[which]), n_ctx=512)
    try:
        prompt = t.tokenize(PROMPT)
        plain = run(t, NoDrafter(), prompt, max_tokens=30, num_draft=0, sampling=GREEDY)
        drafter = MtpDrafter(t)
        try:
            spec = run(t, drafter, prompt, max_tokens=30, num_draft=k, sampling=GREEDY)
        finally:
            drafter.close()
        assert spec.tokens == plain.tokens and spec.stats.n_drafted > 0
        t.rollback(0)
        steps = generate_step(mx.array(prompt), t.model, max_tokens=30, sampler=lambda x: mx.argmax(x, axis=-1))
        assert [int(tok) for tok, _ in steps] == list(plain.tokens)
    finally:
        t.close()


@pytest.fixture(scope="module")
def chi(target):  # type: ignore[no-untyped-def]
    sampling = SamplingParams(temperature=1.0, top_k=TOP_K)
    for text in (CHI_PROMPT, PROMPT, "def main():", "Hello, world"):
        prompt = target.tokenize(text)
        expected = expected_joint(target, prompt, sampling)
        if not any(set(seq) & target.eog_ids for seq in expected):
            return prompt, sampling, expected
    pytest.fail("every candidate prompt can end within the window")


@pytest.mark.slow
def test_exact_rule_matches_the_target_distribution_through_the_mtp_layer(target, chi) -> None:  # type: ignore[no-untyped-def]
    prompt, sampling, expected = chi
    drafter = MtpDrafter(target)
    try:
        check_exact_rule(target, drafter, prompt, sampling, expected)
    finally:
        drafter.close()


@pytest.mark.slow
def test_an_mtp_layer_whose_q_is_misreported_fails_the_same_check(target, chi) -> None:  # type: ignore[no-untyped-def]
    prompt, sampling, expected = chi
    drafter = misreported(MtpDrafter)(target)
    try:
        assert joint_check(draws(target, drafter, prompt, sampling), expected, N_SAMPLES) is not None
    finally:
        drafter.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_after_rejected_rounds_the_next_proposal_equals_a_fresh_drafters(target, temperature: float) -> None:  # type: ignore[no-untyped-def]
    check_fresh_after_rejections(
        target, lambda: MtpDrafter(target), target.tokenize(PROMPT), temperature, k=3, atol=1e-4
    )


def test_checkpoints_without_the_layer_and_other_architectures_are_refused(
    dirs: dict[str, Path], tmp_path: Path
) -> None:
    for name, says in (("plain", "declares no MTP layers"), ("declared", "hold no mtp")):
        t = mb.load(str(dirs[name]), n_ctx=128)
        try:
            with pytest.raises(ModelFileError, match=says) as e:
                MtpDrafter(t)
            assert "original Hugging Face checkpoint" in e.value.hint
        finally:
            t.close()
    qwen2 = mlx_tiny.build(tmp_path / "qwen2", seed=1)
    t = mb.load(str(qwen2), n_ctx=128)
    try:
        with pytest.raises(UnsupportedModelError, match="qwen2"):
            MtpDrafter(t)
    finally:
        t.close()


def test_an_original_checkpoint_is_told_by_its_unconverted_conv_weights(tmp_path: Path) -> None:
    """mlx-lm's rule (conv1d weights still (C, 1, K)), read from the headers: then the MTP norms get +1."""
    import mlx.core as mx

    mx.save_safetensors(
        str(tmp_path / "a.safetensors"), {"model.layers.0.linear_attn.conv1d.weight": mx.zeros((8, 1, 4))}
    )
    assert _unsanitized(safetensors_headers(tmp_path))
    mx.save_safetensors(
        str(tmp_path / "a.safetensors"), {"model.layers.0.linear_attn.conv1d.weight": mx.zeros((8, 4, 1))}
    )
    assert not _unsanitized(safetensors_headers(tmp_path))


@pytest.mark.parametrize("method", ["mtp", "auto"])
def test_run_finds_the_layer_when_the_draft_is_the_target_itself(dirs: dict[str, Path], method: str) -> None:
    argv = [sys.executable, "-m", "localspec.cli", "run", "--backend", "mlx", "--target", str(dirs["echo"]),
            "--draft", str(dirs["echo"]), "--draft-method", method, "--max-tokens", "12", "--temperature", "0",
            "--json", PROMPT]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert stats["draft_method"] == method and "mtp" in stats["draft"]
    bare = subprocess.run([*argv[:8], "--draft-method", "mtp", "--max-tokens", "4", PROMPT], capture_output=True, text=True,
                         timeout=300, check=False)  # fmt: skip
    assert bare.returncode == 0, bare.stderr  # without --draft: the target's own layer all the same
