"""MTP on MLX (localspec/backends/mlx/mtp.py) in Qwen3.5's layout: a tiny hybrid Qwen3.5 target (Gated DeltaNet
beside attention) whose checkpoint keeps one MTP layer (tests/mlx_heads.add_mtp). Greedy speculative output
equals plain greedy output (ours and mlx-lm's generate_step); checkpoints without the weights, and other
architectures, are refused with the reason; run finds the layer when --draft is the target itself. What every
head keeps (the exact rule's chi-square, rollback equals a fresh drafter) is tests/test_head_contract.py's.

Its drafts are checked round by round against mlx-vlm's Qwen3_5MTPDraftModel in tests/test_mlx_reference.py;
the DeepSeek-V3 / GLM-4.5 nextn and MiMo layouts are tests/test_mlx_nextn.py's."""

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
from head_chi import run  # noqa: E402

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


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("which", ["mtp"])  # the echoing layer: test_head_contract
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
