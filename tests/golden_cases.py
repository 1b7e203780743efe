"""The cross-check cases shared by tests/golden/make_goldens.py (which runs llama.cpp's own
`llama-speculative-simple` on them) and tests/test_golden_drafters.py (which runs localspec's drafter
on the same files): each case writes its tiny random GGUFs with fixed seeds through tests/gguf_factory.py,
so both sides hold byte-identical models (the golden file keeps their SHA-256 to catch a writer change).

A family joins by adding a case here with its llama.cpp `--spec-type`; drafters that cannot be
cross-checked this way are listed in PENDING with the reason, and the test reports them as skipped.

All cases draft with p_min 0, greedy: llama.cpp's head drafters take candidate 0 of a top-10 sampler,
which is the argmax, as localspec's greedy drafts are. With p_min > 0 they would part: llama.cpp compares
p_min with that candidate's probability renormalized over the top 10, localspec's min_confidence with its
full-softmax probability (e.g. 0.372 against 0.321 on the "mtp" case's first draft). localspec passes
min_confidence to the model drafter only (auto's plans), never to these heads, so no case covers it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).parent / "golden"
FAMILIES = ("eagle3", "mtp", "dflash", "dspark")

Writer = Callable[[Path, Path], dict[str, Path]]  # (directory, tokenizer source) -> {"target": .., "draft": ..}


@dataclass(frozen=True)
class GoldenCase:
    name: str  # the golden file is GOLDEN_DIR / f"{name}.json"
    family: str  # localspec's --draft-method
    spec_type: str  # llama.cpp's --spec-type
    write: Writer  # "draft" is absent when the drafter lives inside the target (MTP)
    prompt: str
    n_predict: int = 32
    n_draft: int = 4
    n_ctx: int = 512

    @property
    def golden_path(self) -> Path:
        return GOLDEN_DIR / f"{self.name}.json"


EAGLE3_LAYERS = (0, 2, 3)


# The target's first greedy tokens after NEAR_PROMPT: a head whose vocabulary is only these gets some
# drafts accepted, so the replay also covers rounds that keep drafts (a random head never does).
NEAR_PROMPT = "Once upon a time, in a small village"
NEAR_IDS = (15221, 14205, 7122, 25527, 8234, 41339, 46253, 29109)


def _eagle3(head: str) -> Writer:
    """head: "random" (the full vocabulary), "d2t" (2,048 random ids mapped back to target ids by d2t
    inside llama.cpp's graph) or "near" (NEAR_IDS only)."""

    def write(d: Path, tokenizer: Path) -> dict[str, Path]:
        from gguf_factory import write_tiny_eagle3, write_tiny_llama

        files = {"target": d / "target.gguf", "draft": d / f"eagle3-head-{head}.gguf"}
        write_tiny_llama(files["target"], tokenizer, seed=0, n_layer=4)
        kw = {
            "random": {"seed": 10},
            "d2t": {"draft_vocab": 2048, "seed": 11},
            "near": {"d2t_ids": list(NEAR_IDS), "seed": 12},
        }
        write_tiny_eagle3(files["draft"], tokenizer, target_layers=EAGLE3_LAYERS, **kw[head])  # type: ignore[arg-type]
        return files

    return write


def _mtp(near: bool, norms: bool = False) -> Writer:
    """A glm4moe target with one MTP layer, drafting for itself (no separate head file). near: the
    `favoured` tokens' output rows scaled up (tests/test_mtp.py's near-greedy model), so greedy drafts
    are sometimes accepted. norms: norm weights spread around one (gguf_factory's norm_spread), so a hidden
    state fed before instead of after a norm drafts differently (the cross-backend check's sharp case)."""

    def write(d: Path, tokenizer: Path) -> dict[str, Path]:
        from gguf_factory import write_tiny_glm4moe

        tag = "-norms" if norms else "-near" if near else ""
        files = {"target": d / f"glm4moe-mtp{tag}.gguf"}
        kw: dict[str, object] = {"seed": 4, "favoured": MTP_FAVOURED} if near else {"seed": 0}
        if norms:
            kw |= {"seed": 9, "norm_spread": 0.5}  # seed picked among 5..9 for the most accepted drafts
        write_tiny_glm4moe(files["target"], tokenizer, **kw)  # type: ignore[arg-type]
        return files

    return write


MTP_FAVOURED = (100, 101, 102, 103)
DFLASH_LAYERS = (1, 2, 3)


def _block(kind: str, near: bool = False) -> Writer:
    """A DFlash-family drafter over the EAGLE-3 cases' target. kind: "dflash", "dspark" (Markov and
    confidence heads, slot 0 drafts) or "dspark-bonus" (slot 0 is a bonus anchor, as DFlash). near: a
    draft vocabulary of NEAR_IDS only (d2t), so some drafts are accepted."""

    def write(d: Path, tokenizer: Path) -> dict[str, Path]:
        from gguf_factory import write_tiny_dflash, write_tiny_llama

        files = {"target": d / "target.gguf", "draft": d / f"{kind}{'-near' if near else ''}.gguf"}
        write_tiny_llama(files["target"], tokenizer, seed=0, n_layer=4)
        kw = {
            "dflash": {"seed": 20},
            "dspark": {"seed": 21, "dspark": True, "confidence": True},
            "dspark-bonus": {"seed": 22, "dspark": True, "sample_from_anchor": False},
        }[kind]
        if near:  # seeds picked among 30..41 for the most accepted drafts (a random block rarely hits twice)
            kw |= {"d2t_ids": list(NEAR_IDS), "seed": {"dflash": 30, "dspark": 33}[kind]}
        write_tiny_dflash(files["draft"], tokenizer, target_layers=DFLASH_LAYERS, block_size=8, **kw)  # type: ignore[arg-type]
        return files

    return write


CASES: dict[str, GoldenCase] = {
    c.name: c
    for c in (
        GoldenCase("eagle3", "eagle3", "draft-eagle3", _eagle3("random"), NEAR_PROMPT),
        GoldenCase("eagle3-d2t", "eagle3", "draft-eagle3", _eagle3("d2t"), "def fibonacci(n):"),
        GoldenCase("eagle3-near", "eagle3", "draft-eagle3", _eagle3("near"), NEAR_PROMPT, n_predict=16),
        GoldenCase("mtp", "mtp", "draft-mtp", _mtp(near=False), NEAR_PROMPT),
        GoldenCase("mtp-near", "mtp", "draft-mtp", _mtp(near=True), NEAR_PROMPT),
        GoldenCase("mtp-norms", "mtp", "draft-mtp", _mtp(near=True, norms=True), NEAR_PROMPT, n_predict=16),
        GoldenCase("dflash", "dflash", "draft-dflash", _block("dflash"), "def fibonacci(n):"),
        GoldenCase("dflash-near", "dflash", "draft-dflash", _block("dflash", near=True), NEAR_PROMPT, n_predict=16),
        GoldenCase("dspark", "dspark", "draft-dspark", _block("dspark"), "def fibonacci(n):"),
        GoldenCase("dspark-bonus", "dspark", "draft-dspark", _block("dspark-bonus"), NEAR_PROMPT),
        GoldenCase("dspark-near", "dspark", "draft-dspark", _block("dspark", near=True), NEAR_PROMPT, n_predict=16),
    )
}

# Families with no case yet, and why (the test reports each as a skip with this reason).
PENDING: dict[str, str] = {
    "dflash2": "llama.cpp logs no draft candidates for a DFlash2 (selector lattice) drafter, so its drafts "
    "cannot be read from llama-speculative-simple -v (tests/test_mlx_dflash.py checks localspec's llama.cpp drafts "
    "against the MLX drafter's, which tests/test_mlx_reference.py checks against z-lab's reference)",
}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_case(case: GoldenCase, d: Path, tokenizer: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The case's files in `d`, and their SHA-256 by role."""
    files = case.write(d, tokenizer)
    return files, {role: sha256_of(p) for role, p in files.items()}


def load_golden(case: GoldenCase) -> dict[str, Any] | None:
    if not case.golden_path.is_file():
        return None
    return json.loads(case.golden_path.read_text(encoding="utf-8"))
