"""MTP on MLX for the DeepSeek-V3 / GLM-4.5 "nextn" layout and MiMo's (localspec/backends/mlx/mtp.py): a tiny
GLM-4.5-style MoE target whose checkpoint keeps its nextn layer as `model.layers.{num_hidden_layers}.*`, and a
tiny MiMo whose checkpoint keeps `model.mtp_layers.0.*` (tests/mlx_heads.add_nextn).
Greedy speculative output equals plain greedy output; a checkpoint without the layer is refused with the reason;
run picks the layout by architecture. What every head keeps (the exact rule's chi-square and its power against a
misreported q, on llama.cpp's "mtp-near" model converted; rollback equals a fresh drafter) is
tests/test_head_contract.py's.

Cross-backend: llama.cpp's MTP goldens (tests/golden/mtp*.json, glm4moe) converted to MLX with
localspec.convert_gguf, which keeps the MTP layer: the nextn drafter's drafts equal llama.cpp's round by round,
one case with norm weights spread so that which hidden state feeds the layer shows. No reference runs here for
MiMo's layout (mlx-vlm has no MiMo drafter; localspec's GGUF converter does not read MiMo)."""

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
from localspec.backends.mlx.mtp import drafter as mtp_drafter  # noqa: E402
from localspec.decoding.drafters import NoDrafter  # noqa: E402
from localspec.errors import ModelFileError  # noqa: E402
from localspec.sampling import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "Once upon a time, there was a"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mlx-nextn")
    plain = mlx_tiny.build(root / "plain", seed=2, config=mlx_tiny.GLM4_MOE_CONFIG)
    mimo = mlx_tiny.build(root / "mimo-plain", seed=4, config=mlx_tiny.MIMO_CONFIG)
    out = {"plain": plain, "mimo-plain": mimo}
    for name, base, echo in (
        ("nextn", plain, False),
        ("echo", plain, True),
        ("mimo", mimo, False),
        ("mimo-echo", mimo, True),
    ):
        shutil.copytree(base, root / name)
        out[name] = mlx_heads.add_nextn(root / name, seed=3, echo=echo, mimo=name.startswith("mimo"))
    return out


@pytest.mark.parametrize("which", ["nextn", "mimo-echo"])  # the others: test_head_contract
def test_greedy_speculative_equals_plain_greedy(dirs: dict[str, Path], which: str) -> None:
    t = mb.load(str(dirs[which]), n_ctx=512)
    try:
        prompt = t.tokenize(PROMPT)
        plain = run(t, NoDrafter(), prompt, max_tokens=30, num_draft=0, sampling=GREEDY)
        drafter = mtp_drafter(t)
        try:
            spec = run(t, drafter, prompt, max_tokens=30, num_draft=3, sampling=GREEDY)
        finally:
            drafter.close()
        assert spec.tokens == plain.tokens and spec.stats.n_drafted > 0
    finally:
        t.close()


@pytest.mark.parametrize(("which", "says"), [("plain", "holds no model.layers.2.eh_proj"),
                                             ("mimo-plain", "holds no model.mtp_layers.0.input_proj")])  # fmt: skip
def test_a_checkpoint_without_its_mtp_layer_is_refused(dirs: dict[str, Path], which: str, says: str) -> None:
    t = mb.load(str(dirs[which]), n_ctx=128)
    try:
        with pytest.raises(ModelFileError, match=says) as e:
            mtp_drafter(t)
        assert "original Hugging Face checkpoint" in e.value.hint
    finally:
        t.close()


def test_mimo_reads_the_hidden_state_first() -> None:
    """The one difference between the layouts' projections, as each checkpoint's modeling code has it (all read
    the hidden state after the target's final norm: for nextn as llama.cpp does, checked against its goldens
    below; the "mtp-norms" case fails when nextn reads it before the norm)."""
    from localspec.backends.mlx.mtp import LAYOUTS

    assert LAYOUTS["mimo"].hidden_first and not LAYOUTS["glm4_moe"].hidden_first
    assert not LAYOUTS["qwen3_5"].hidden_first


def test_run_picks_the_nextn_layout_by_architecture(dirs: dict[str, Path]) -> None:
    argv = [sys.executable, "-m", "localspec.cli", "run", "--backend", "mlx", "--target", str(dirs["echo"]),
            "--draft-method", "mtp", "--max-tokens", "12", "--temperature", "0", "--json", PROMPT]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert stats["draft_method"] == "mtp" and stats["n_drafted"] > 0


# -- the cross-backend check: llama.cpp's golden MTP drafts, the same glm4moe GGUF converted to MLX ----------


@pytest.mark.parametrize("name", ["mtp", "mtp-near", "mtp-norms"])
def test_drafts_per_round_equal_llama_cpps_on_the_converted_model(
    name: str, smollm2_path: Path, tmp_path: Path
) -> None:
    """localspec.convert_gguf keeps the MTP layer (Hugging Face names); the nextn drafter on the converted
    model proposes what llama.cpp's MTP drafted, round by round. "mtp-norms" spreads the norm weights, so a
    hidden state taken before instead of after a norm drafts differently."""
    from golden_cases import CASES, load_golden, write_case
    from test_golden_drafters import replay_rounds

    from localspec.convert_gguf import convert

    case = CASES[name]
    golden = load_golden(case)
    if golden is None:
        pytest.skip(f"no {case.golden_path.name}")
    files, hashes = write_case(case, tmp_path, smollm2_path)
    assert hashes == golden["sha256"]
    target = mb.load(str(convert(files["target"], tmp_path / "target-mlx", dtype="float32")), n_ctx=case.n_ctx)
    drafter = mtp_drafter(target)
    try:
        ours = replay_rounds(target, drafter, golden, case.n_draft)
    finally:
        drafter.close()
        target.close()
    assert ours == [r["draft"] for r in golden["rounds"]]
