"""The contract every head drafter keeps, for each family on each backend it runs on (llama.cpp: EAGLE-3, MTP,
DFlash, DSpark, DFlash2; MLX: EAGLE-3, MTP in the Qwen3.5, GLM nextn and MiMo layouts, DFlash, DSpark), on tiny
random models:

- rollback: after a generation with rejected rounds, its next proposal equals a fresh drafter's prepared on the
  same context (its own cache came back right), and asking twice drafts the same;
- greedy speculative output equals plain greedy output;
- the exact rule through it matches the target's joint distribution at temperature 1 (chi-square), with drafts
  both kept and rejected (slow);
- the same drafts with a misreported q (uniform over their support) fail that check: the check has the power to
  see a wrong q (slow). DFlash2 drafts deterministically (q one-hot) and MiMo's layout has no model whose drafts
  are kept often enough, so these two run the first two checks only.

What is one family's own (a head's layouts and refusals, which token a pair holds, llama.cpp's goldens) stays in
its tests: test_eagle3.py, test_mtp.py, test_dflash.py, test_mlx_eagle3.py, test_mlx_mtp.py, test_mlx_nextn.py,
test_mlx_dflash.py. The checks themselves are tests/head_chi.py's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from head_chi import (
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
from test_verify import joint_check

from localspec.decoding.drafters import NoDrafter
from localspec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
EAGLE3_LAYERS = (0, 2, 3)  # on the 4-layer llama target
DFLASH_LAYERS = (1, 2, 3)
MLX_EAGLE3_LAYERS = (0, 2, 4)  # 4: the last layer's output
BLOCK = 8


@dataclass
class Head:
    """A family on a backend: its drafter class, built over `target` with `args`, and how to drive it."""

    target: Any
    cls: type
    args: tuple[Any, ...]
    prompt: list[int]
    k: int = 4  # the draft length of the rollback run
    atol: float = 1e-4  # q's difference from a fresh drafter's (batched vs single-row passes differ in the last bits)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def make(self, *, misreport: bool = False) -> Any:
        return (misreported(self.cls) if misreport else self.cls)(self.target, *self.args, **self.kwargs)


@dataclass
class Chi:
    """A head whose drafts the target keeps often enough for the chi-square to see both branches of the rule."""

    head: Head
    sampling: SamplingParams
    expected: dict[tuple[int, ...], float]


@dataclass
class World:
    """The models the cases build, each once per module, and the targets to close at the end."""

    tmp: pytest.TempPathFactory
    smollm2: Path
    made: dict[str, Any] = field(default_factory=dict)
    targets: list[Any] = field(default_factory=list)

    def once(self, key: str, build: Callable[[], Any]) -> Any:
        if key not in self.made:
            self.made[key] = build()
        return self.made[key]

    def target(self, key: str, load: Callable[[], Any]) -> Any:
        def loaded() -> Any:
            t = load()
            self.targets.append(t)
            return t

        return self.once(key, loaded)

    def dir(self, name: str) -> Path:
        return self.tmp.mktemp(name)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[World]:
    w = World(tmp_path_factory, smollm2_path)
    yield w
    for t in w.targets:
        t.close()


# -- llama.cpp ----------------------------------------------------------------------------------------------


def _llama(world: World, key: str, path: Callable[[], Path], **load: Any) -> Any:
    from localspec.backends.llama import backend as lb

    return world.target(key, lambda: lb.load(path(), n_ctx=512, threads=1, **load))


def _llama_target_file(world: World) -> Path:
    """The 4-layer llama target the EAGLE-3 and block drafters read (golden_cases' target)."""
    from gguf_factory import write_tiny_llama

    def write() -> Path:
        path = world.dir("llama-target") / "target.gguf"
        write_tiny_llama(path, world.smollm2, seed=0, n_layer=4)
        return path

    return world.once("llama-target.gguf", write)


def _block_file(world: World, name: str, **kw: Any) -> Path:
    from gguf_factory import write_tiny_dflash

    def write() -> Path:
        path = world.dir(name) / f"{name}.gguf"
        write_tiny_dflash(path, world.smollm2, target_layers=DFLASH_LAYERS, block_size=BLOCK, **kw)
        return path

    return world.once(f"{name}.gguf", write)


def llama_eagle3(world: World) -> Head:
    from gguf_factory import write_tiny_eagle3

    from localspec.backends.llama.eagle3 import Eagle3Drafter

    target = _llama(world, "llama-target", lambda: _llama_target_file(world))
    head = world.dir("eagle3") / "eagle3-head.gguf"
    write_tiny_eagle3(head, world.smollm2, target_layers=EAGLE3_LAYERS)
    return Head(target, Eagle3Drafter, (head,), target.tokenize("def fibonacci(n):"), atol=2e-3)


def llama_eagle3_chi(world: World) -> Chi:
    """A head whose reduced vocabulary is what the target may emit at the first two steps."""
    from gguf_factory import write_tiny_eagle3

    from localspec.backends.llama.eagle3 import Eagle3Drafter

    target = _llama(world, "llama-target", lambda: _llama_target_file(world))
    sampling, prompt = SamplingParams(temperature=1.0, top_k=TOP_K), target.tokenize(CHI_PROMPT)
    expected = expected_joint(target, prompt, sampling)
    head = world.dir("eagle3-chi") / "eagle3-head-near.gguf"
    ids = sorted({t for seq in expected for t in seq[:2]})
    write_tiny_eagle3(head, world.smollm2, target_layers=EAGLE3_LAYERS, d2t_ids=ids, seed=12)
    return Chi(Head(target, Eagle3Drafter, (head,), prompt), sampling, expected)


def _glm_file(world: World, name: str, **kw: Any) -> Path:
    from gguf_factory import write_tiny_glm4moe

    def write() -> Path:
        path = world.dir(name) / f"{name}.gguf"
        write_tiny_glm4moe(path, world.smollm2, **kw)
        return path

    return world.once(f"{name}.gguf", write)


def llama_mtp(world: World) -> Head:
    from localspec.backends.llama.mtp import MtpDrafter

    path = lambda: _glm_file(world, "glm4moe-mtp", seed=0)  # noqa: E731
    target = _llama(world, "llama-glm", path, load_mtp=True)
    return Head(target, MtpDrafter, (), target.tokenize("def fibonacci(n):"), atol=2e-3)


def llama_mtp_chi(world: World) -> Chi:
    """golden_cases' "mtp-near" model: its favoured tokens lead both the trunk's and the MTP layer's top-k."""
    from golden_cases import MTP_FAVOURED

    from localspec.backends.llama.mtp import MtpDrafter

    path = lambda: _glm_file(world, "glm4moe-mtp-near", seed=4, favoured=MTP_FAVOURED)  # noqa: E731
    target = _llama(world, "llama-glm-near", path, load_mtp=True)
    sampling, prompt = SamplingParams(temperature=1.0, top_k=TOP_K), target.tokenize(CHI_PROMPT)
    return Chi(Head(target, MtpDrafter, (), prompt), sampling, expected_joint(target, prompt, sampling))


BLOCK_FILES: dict[str, dict[str, Any]] = {
    "dflash": {"seed": 20},
    "dspark": {"seed": 21, "dspark": True, "confidence": True},
    "dflash2": {"seed": 23, "selector_top_k": 4},
}


def llama_block(method: str, kind: str) -> Callable[[World], Head]:
    def build(world: World) -> Head:
        from localspec.backends.llama.dflash import BlockDrafter

        target = _llama(world, "llama-target", lambda: _llama_target_file(world))
        head = _block_file(world, kind, **BLOCK_FILES[kind])
        return Head(
            target, BlockDrafter, (head,), target.tokenize("def fibonacci(n):"), atol=2e-3, kwargs={"method": method}
        )

    return build


def _near_block_files(world: World, expected: dict[tuple[int, ...], float]) -> dict[str, Path]:
    """DFlash and DSpark drafters whose reduced vocabulary is what the target may emit in the first round (the
    same files for both backends: the MLX ones are converted from them)."""
    ids = sorted({t for seq in expected for t in seq[:3]})
    return {
        "dflash": _block_file(world, "dflash-near", d2t_ids=ids, seed=12),
        "dspark": _block_file(world, "dspark-near", d2t_ids=ids, seed=15, dspark=True),
    }


def llama_block_chi(method: str) -> Callable[[World], Chi]:
    def build(world: World) -> Chi:
        from localspec.backends.llama.dflash import BlockDrafter

        target = _llama(world, "llama-target", lambda: _llama_target_file(world))
        sampling, prompt = SamplingParams(temperature=1.0, top_k=TOP_K), target.tokenize(CHI_PROMPT)
        expected = expected_joint(target, prompt, sampling)
        head = _near_block_files(world, expected)[method]
        return Chi(Head(target, BlockDrafter, (head,), prompt, kwargs={"method": method}), sampling, expected)

    return build


# -- MLX ------------------------------------------------------------------------------------------------------

MLX_PROMPT = "Once upon a time, there was a"


def _mlx(world: World, key: str, path: Callable[[], Path]) -> Any:
    from localspec.backends.mlx import backend as mb

    return world.target(key, lambda: mb.load(str(path()), n_ctx=512))


def _chi_prompt(target: Any, sampling: SamplingParams, texts: tuple[str, ...]) -> tuple[list[int], dict]:  # type: ignore[type-arg]
    """The first prompt whose top-k tree holds no end-of-generation token (a run stops at one without showing it)."""
    for text in texts:
        prompt = target.tokenize(text)
        expected = expected_joint(target, prompt, sampling)
        if not any(set(seq) & target.eog_ids for seq in expected):
            return prompt, expected
    pytest.fail("every candidate prompt can end within the window")


def _mlx_llama_config() -> dict[str, Any]:
    import mlx_tiny

    return {**mlx_tiny.CONFIG, "num_hidden_layers": 4}


def _mlx_eagle3_target(world: World) -> Any:
    import mlx_tiny

    build = lambda: mlx_tiny.build(world.dir("mlx-llama") / "m", seed=1, config=_mlx_llama_config())  # noqa: E731
    return _mlx(world, "mlx-llama", build)


def mlx_eagle3(world: World) -> Head:
    import mlx_heads

    from localspec.backends.mlx.eagle3 import Eagle3Drafter

    target = _mlx_eagle3_target(world)
    head = mlx_heads.write_eagle3(world.dir("mlx-eagle3") / "head", _mlx_llama_config(), seed=3,
                                  layer_ids=MLX_EAGLE3_LAYERS)  # fmt: skip
    return Head(target, Eagle3Drafter, (head,), target.tokenize(MLX_PROMPT))


def mlx_eagle3_chi(world: World) -> Chi:
    """A head whose reduced vocabulary is what the target may emit at the first two steps."""
    import mlx_heads
    import mlx_tiny

    from localspec.backends.mlx.eagle3 import Eagle3Drafter

    target = _mlx_eagle3_target(world)
    sampling = SamplingParams(temperature=1.0, top_k=TOP_K)
    prompt, expected = _chi_prompt(target, sampling, (CHI_PROMPT, MLX_PROMPT, "def main():", "Hello, world"))
    ids = sorted({t for seq in expected for t in seq[:2]})
    tensors = mlx_heads.eagle3_tensors(np.random.default_rng(6), hidden=64, target_hidden=64, heads=4, kv_heads=2,
                                       ff=128, n_out=len(ids), scale=1.0)  # fmt: skip
    config = mlx_heads._llama_config(64, 4, 2, 128, mlx_tiny.N_VOCAB, 1e-6, 10000.0)
    head = mlx_heads.save_eagle3(world.dir("mlx-eagle3-chi") / "head", tensors, config, layout=mlx_heads.ORIGINAL,
                                 layer_ids=MLX_EAGLE3_LAYERS, d2t=np.array(ids))  # fmt: skip
    return Chi(Head(target, Eagle3Drafter, (head,), prompt), sampling, expected)


def _mlx_with_layer(world: World, key: str, config: str, seed: int, add: Callable[[Path], Path]) -> Any:
    """A tiny mlx-lm model (mlx_tiny's `config`) whose checkpoint keeps its MTP layer as `add` writes it."""
    import mlx_tiny

    def build() -> Path:
        d = world.dir(key)
        mlx_tiny.build(d / "plain", seed=seed, config=getattr(mlx_tiny, config))
        shutil.copytree(d / "plain", d / "model")
        return add(d / "model")

    return _mlx(world, key, lambda: world.once(f"{key}.dir", build))


def _mlx_mtp_target(world: World) -> Any:
    """A tiny hybrid Qwen3.5 whose MTP layer echoes its hidden state: its drafts overlap the target's enough that
    the exact rule both keeps and rejects them."""
    import mlx_heads

    return _mlx_with_layer(world, "mlx-qwen35", "QWEN35_CONFIG", 2, lambda d: mlx_heads.add_mtp(d, seed=3, echo=True))


def mlx_mtp(world: World) -> Head:
    from localspec.backends.mlx.mtp import MtpDrafter

    target = _mlx_mtp_target(world)
    return Head(target, MtpDrafter, (), target.tokenize(MLX_PROMPT), k=3)


def mlx_mtp_chi(world: World) -> Chi:
    from localspec.backends.mlx.mtp import MtpDrafter

    target = _mlx_mtp_target(world)
    sampling = SamplingParams(temperature=1.0, top_k=TOP_K)
    prompt, expected = _chi_prompt(target, sampling, (CHI_PROMPT, MLX_PROMPT, "def main():", "Hello, world"))
    return Chi(Head(target, MtpDrafter, (), prompt), sampling, expected)


def mlx_nextn(world: World) -> Head:
    """A tiny GLM-4.5-style MoE whose nextn layer echoes its hidden state (llama.cpp's pairs)."""
    import mlx_heads

    from localspec.backends.mlx.mtp import LlamaPairsDrafter

    add = lambda d: mlx_heads.add_nextn(d, seed=3, echo=True)  # noqa: E731
    target = _mlx_with_layer(world, "mlx-glm", "GLM4_MOE_CONFIG", 2, add)
    return Head(target, LlamaPairsDrafter, (), target.tokenize(MLX_PROMPT), k=3)


def mlx_nextn_chi(world: World) -> Chi:
    """golden_cases' "mtp-near" GLM converted to MLX (localspec.convert_gguf keeps its MTP layer)."""
    from golden_cases import MTP_FAVOURED

    from localspec.backends.mlx.mtp import LlamaPairsDrafter
    from localspec.convert_gguf import convert

    gguf = _glm_file(world, "glm4moe-mtp-near", seed=4, favoured=MTP_FAVOURED)
    target = _mlx(world, "mlx-glm-near", lambda: convert(gguf, world.dir("mlx-glm-near") / "m", dtype="float32"))
    sampling, prompt = SamplingParams(temperature=1.0, top_k=TOP_K), target.tokenize(CHI_PROMPT)
    return Chi(Head(target, LlamaPairsDrafter, (), prompt), sampling, expected_joint(target, prompt, sampling))


def mlx_mimo(world: World) -> Head:
    import mlx_heads

    from localspec.backends.mlx.mtp import MtpDrafter

    add = lambda d: mlx_heads.add_nextn(d, seed=3, mimo=True)  # noqa: E731
    target = _mlx_with_layer(world, "mlx-mimo", "MIMO_CONFIG", 4, add)
    return Head(target, MtpDrafter, (), target.tokenize(MLX_PROMPT), k=3)


def _mlx_block_target(world: World) -> Any:
    """The llama.cpp block drafters' target, converted to MLX."""
    from localspec.convert_gguf import convert

    gguf = _llama_target_file(world)
    return _mlx(world, "mlx-block", lambda: convert(gguf, world.dir("mlx-block") / "m", dtype="float32"))


def _converted(world: World, gguf: Path) -> Path:
    import mlx_heads

    return world.once(f"{gguf}.mlx", lambda: mlx_heads.from_gguf_dflash(gguf, world.dir(gguf.stem) / "head"))


def mlx_block(method: str, kind: str) -> Callable[[World], Head]:
    def build(world: World) -> Head:
        from localspec.backends.mlx.dflash import BlockDrafter

        target = _mlx_block_target(world)
        head = _converted(world, _block_file(world, kind, **BLOCK_FILES[kind]))
        return Head(target, BlockDrafter, (head,), target.tokenize("def fibonacci(n):"), kwargs={"method": method})

    return build


def mlx_block_chi(method: str) -> Callable[[World], Chi]:
    def build(world: World) -> Chi:
        from localspec.backends.mlx.dflash import BlockDrafter

        target = _mlx_block_target(world)
        sampling, prompt = SamplingParams(temperature=1.0, top_k=TOP_K), target.tokenize(CHI_PROMPT)
        expected = expected_joint(target, prompt, sampling)
        head = _converted(world, _near_block_files(world, expected)[method])
        return Chi(Head(target, BlockDrafter, (head,), prompt, kwargs={"method": method}), sampling, expected)

    return build


# -- the cases ------------------------------------------------------------------------------------------------

HEADS: dict[str, Callable[[World], Head]] = {
    "llama-eagle3": llama_eagle3,
    "llama-mtp": llama_mtp,
    "llama-dflash": llama_block("dflash", "dflash"),
    "llama-dspark": llama_block("dspark", "dspark"),
    "llama-dflash2": llama_block("dflash", "dflash2"),
    "mlx-eagle3": mlx_eagle3,
    "mlx-mtp": mlx_mtp,
    "mlx-mtp-nextn": mlx_nextn,
    "mlx-mtp-mimo": mlx_mimo,
    "mlx-dflash": mlx_block("dflash", "dflash"),
    "mlx-dspark": mlx_block("dspark", "dspark"),
    "mlx-dflash2": mlx_block("dflash", "dflash2"),
}
CHI: dict[str, Callable[[World], Chi]] = {
    "llama-eagle3": llama_eagle3_chi,
    "llama-mtp": llama_mtp_chi,
    "llama-dflash": llama_block_chi("dflash"),
    "llama-dspark": llama_block_chi("dspark"),
    "mlx-eagle3": mlx_eagle3_chi,
    "mlx-mtp": mlx_mtp_chi,
    "mlx-mtp-nextn": mlx_nextn_chi,
    "mlx-dflash": mlx_block_chi("dflash"),
    "mlx-dspark": mlx_block_chi("dspark"),
}


def _head(world: World, case: str) -> Head:
    _skip_without_backend(case)
    return world.once(f"case:{case}", lambda: HEADS[case](world))


def _chi(world: World, case: str) -> Chi:
    _skip_without_backend(case)
    return world.once(f"chi:{case}", lambda: CHI[case](world))


def _skip_without_backend(case: str) -> None:
    if case.startswith("mlx-"):
        pytest.importorskip("mlx.core")
        pytest.importorskip("mlx_lm")


def test_every_head_family_on_every_backend_has_its_cases() -> None:
    """A family added to the table (or a backend added to a family) without its contract cases fails here."""
    from localspec.families.registry import head_families

    want = {(backend, fam.name) for fam in head_families() for backend in fam.backend_names() or ()}
    for cases in (HEADS, CHI):
        have = {tuple(name.split("-")[:2]) for name in cases}
        assert want <= have, f"no contract cases for {sorted(want - have)}"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("case", list(HEADS))
def test_after_rejected_rounds_the_next_proposal_equals_a_fresh_drafters(
    world: World, case: str, temperature: float
) -> None:
    head = _head(world, case)
    check_fresh_after_rejections(head.target, head.make, head.prompt, temperature, k=head.k, atol=head.atol)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("case", list(HEADS))
def test_greedy_speculative_equals_plain_greedy(world: World, case: str, k: int) -> None:
    head = _head(world, case)
    plain = run(head.target, NoDrafter(), head.prompt, max_tokens=24, sampling=GREEDY)
    drafter = head.make()
    try:
        spec = run(head.target, drafter, head.prompt, max_tokens=24, num_draft=k, sampling=GREEDY)
    finally:
        drafter.close()
    assert spec.tokens == plain.tokens
    assert spec.stats.n_drafted > 0 and spec.stats.draft_method == drafter.method


@pytest.mark.slow  # about a minute or two per case on a busy 2-core CPU
@pytest.mark.parametrize("case", list(CHI))
def test_exact_rule_matches_the_target_distribution_through_the_head(world: World, case: str) -> None:
    chi = _chi(world, case)
    drafter = chi.head.make()
    try:
        check_exact_rule(chi.head.target, drafter, chi.head.prompt, chi.sampling, chi.expected)
    finally:
        drafter.close()


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CHI))
def test_a_head_whose_q_is_misreported_fails_the_same_check(world: World, case: str) -> None:
    """The check's own test: the same drafts, but q reported as uniform over its support, must fail."""
    chi = _chi(world, case)
    drafter = chi.head.make(misreport=True)
    try:
        draw = draws(chi.head.target, drafter, chi.head.prompt, chi.sampling)
        assert joint_check(draw, chi.expected, N_SAMPLES) is not None
    finally:
        drafter.close()
