"""DFlash and DSpark on MLX (localspec/backends/mlx/dflash.py), on the llama.cpp golden cases' tiny random models
converted to MLX (the target with localspec.convert_gguf, the drafters to their Hugging Face layout with
tests/mlx_heads.py): every round's drafts equal llama.cpp's own; greedy speculative output equals plain greedy
output with drafts kept and with a bonus anchor; refusals. What every head keeps (the exact rule's chi-square,
rollback equals a fresh drafter) is tests/test_head_contract.py's.
DFlash2's drafts are checked against z-lab's reference in tests/test_mlx_reference.py, and llama.cpp's DFlash2
drafter, which has no llama.cpp golden, against the MLX one here, every round.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx_heads  # noqa: E402
from golden_cases import CASES, DFLASH_LAYERS, load_golden, write_case  # noqa: E402
from head_chi import run  # noqa: E402
from test_golden_drafters import replay_rounds  # noqa: E402

from localspec.backends.mlx import backend as mb  # noqa: E402
from localspec.backends.mlx.dflash import BlockDrafter  # noqa: E402
from localspec.decoding.drafters import NoDrafter  # noqa: E402
from localspec.errors import UnsupportedModelError, UsageError  # noqa: E402
from localspec.sampling import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
BLOCK_CASES = ("dflash", "dflash-near", "dspark", "dspark-bonus", "dspark-near")


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    """The golden cases' GGUFs (one target for all of them) and their MLX conversions."""
    from localspec.convert_gguf import convert

    root = tmp_path_factory.mktemp("mlx-dflash")
    out: dict[str, Path] = {}
    for name in BLOCK_CASES:
        (root / name).mkdir()
        files, _ = write_case(CASES[name], root / name, smollm2_path)
        out[f"{name}.gguf"] = files["draft"]
        out[name] = mlx_heads.from_gguf_dflash(files["draft"], root / name / "head-mlx")
        out["target.gguf"] = files["target"]
    out["target"] = convert(out["target.gguf"], root / "target-mlx", dtype="float32")
    return out


@pytest.fixture(scope="module")
def target(converted: dict[str, Path]):  # type: ignore[no-untyped-def]
    t = mb.load(str(converted["target"]), n_ctx=512)
    yield t
    t.close()


@pytest.mark.parametrize("name", BLOCK_CASES)
def test_drafts_per_round_equal_llama_cpps_on_the_converted_models(name: str, converted: dict[str, Path], smollm2_path: Path,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    case = CASES[name]
    golden = load_golden(case)
    if golden is None:
        pytest.skip(f"no {case.golden_path.name}")
    _, hashes = write_case(case, tmp_path, smollm2_path)
    assert hashes == golden["sha256"]  # the converted files are the golden's models
    target = mb.load(str(converted["target"]), n_ctx=case.n_ctx)
    drafter = BlockDrafter(target, converted[name], method=case.family)
    try:
        ours = replay_rounds(target, drafter, golden, case.n_draft)
    finally:
        drafter.close()
        target.close()
    assert ours == [r["draft"] for r in golden["rounds"]]


def test_dflash2_on_llama_cpp_drafts_what_the_mlx_drafter_drafts_every_round(
    converted: dict[str, Path], target, smollm2_path: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """DFlash2 has no llama.cpp golden (llama.cpp logs no lattice drafts), so its llama.cpp drafter is checked here
    against the MLX one, which tests/test_mlx_reference.py checks against z-lab's reference: in every round of a
    greedy run on llama.cpp, the MLX drafter on the converted files drafts the same tokens from the same context.
    An anchor one token off on llama.cpp (its position, its token, its slot in the block) fails at the first round."""
    from gguf_factory import write_tiny_dflash

    from localspec.backends.base import sync_cache
    from localspec.backends.llama import backend as lb
    from localspec.backends.llama.dflash import BlockDrafter as LlamaBlockDrafter

    gguf = tmp_path / "dflash2.gguf"  # seed 25: drafts that change with the context (some seeds draft one token)
    write_tiny_dflash(gguf, smollm2_path, target_layers=DFLASH_LAYERS, block_size=8, selector_top_k=4, seed=25)
    rounds: list[tuple[list[int], int, list[int]]] = []  # (context, k, draft)

    class Recorded(LlamaBlockDrafter):
        def propose(self, context, k, sampling, rng, **kw):  # type: ignore[no-untyped-def]
            draft = super().propose(context, k, sampling, rng, **kw)
            rounds.append((list(context), k, list(draft.tokens)))
            return draft

    llama_target = lb.load(converted["target.gguf"], n_ctx=512, threads=1)
    drafter = Recorded(llama_target, gguf, method="dflash")
    try:
        for text in ("def fibonacci(n):", "Once upon a time, in a small village"):
            run(llama_target, drafter, llama_target.tokenize(text), max_tokens=16, num_draft=7, sampling=GREEDY)
    finally:
        drafter.close()
        llama_target.close()
    assert len(rounds) > 10 and len({tuple(d) for *_, d in rounds}) > 3  # drafts that tell contexts apart
    mlx_drafter = BlockDrafter(target, mlx_heads.from_gguf_dflash(gguf, tmp_path / "dflash2"), method="dflash")
    try:
        ours = []
        for context, k, _ in rounds:
            sync_cache(target, context[:-1], logits=False)
            mlx_drafter.prepare(context, 7)  # the block holds 7 drafts as on llama.cpp; k (less near the end) cuts it
            ours.append(mlx_drafter.propose(context, k, GREEDY, np.random.default_rng(0)).tokens)
    finally:
        mlx_drafter.close()
    differ = [i for i, (mine, (*_, theirs)) in enumerate(zip(ours, rounds)) if mine != theirs]
    assert not differ, f"rounds {differ} differ; first: llama.cpp {rounds[differ[0]][2]}, MLX {ours[differ[0]]}"


@pytest.mark.parametrize("name", ["dflash-near", "dspark-near", "dspark-bonus"])  # random drafters: test_head_contract
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_plain_greedy(converted: dict[str, Path], target, name: str, k: int) -> None:  # type: ignore[no-untyped-def]
    prompt = target.tokenize("Once upon a time, in a small village")
    plain = run(target, NoDrafter(), prompt, max_tokens=24, num_draft=0, sampling=GREEDY)
    drafter = BlockDrafter(target, converted[name], method=CASES[name].family)
    try:
        spec = run(target, drafter, prompt, max_tokens=24, num_draft=k, sampling=GREEDY)
    finally:
        drafter.close()
    assert spec.tokens == plain.tokens
    assert spec.stats.n_drafted > 0
    if name.endswith("near") and k == 4:
        assert 0 < spec.stats.n_accepted < spec.stats.n_drafted


def test_the_wrong_method_and_unbuildable_drafters_are_refused(
    converted: dict[str, Path], target, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from localspec.errors import ModelFileError

    with pytest.raises(UsageError, match="use --draft-method dspark"):
        BlockDrafter(target, converted["dspark"], method="dflash")

    def variant(name: str, **changes: object) -> Path:
        d = tmp_path / name
        d.mkdir()
        for f in ("config.json", "model.safetensors"):
            (d / f).write_bytes((converted["dflash"] / f).read_bytes())
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, **changes}))
        return d

    dc = json.loads((converted["dflash"] / "config.json").read_text())["dflash_config"]
    bad = {**dc, "conv_kernel_size": 3, "conv_group_size": 48, "selector_rank": 8, "selector_top_k": 2}  # 64 % 48
    with pytest.raises(ModelFileError, match="DFlash2"):
        BlockDrafter(target, variant("dflash2-bad", dflash_config=bad), method="dflash")
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        BlockDrafter(target, variant("swa", layer_types=["sliding_attention"], sliding_window=64), method="dflash")


@pytest.mark.parametrize("method", ["dspark", "auto"])
def test_run_reads_the_drafter_directory_and_auto_drives_it(converted: dict[str, Path], method: str) -> None:
    argv = [sys.executable, "-m", "localspec.cli", "run", "--backend", "mlx", "--target", str(converted["target"]),
            "--draft", str(converted["dspark-near"]), "--draft-method", method, "--max-tokens", "12",
            "--temperature", "0", "--json", "Once upon a time"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert stats["draft_method"] == method and "dspark:" in stats["draft"]
