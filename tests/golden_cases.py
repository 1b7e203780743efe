"""The cross-check cases shared by tests/golden/make_goldens.py (which runs llama.cpp's own
`llama-speculative-simple` on them) and tests/test_golden_drafters.py (which runs localspec's drafter
on the same files): each case writes its tiny random GGUFs with fixed seeds through tests/gguf_factory.py,
so both sides hold byte-identical models (the golden file keeps their SHA-256 to catch a writer change).

A family joins by adding a case here with its llama.cpp `--spec-type`; families whose tiny writer is not
written yet are listed in PENDING with the reason, and the test reports them as skipped.
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
        kw = {"random": {"seed": 10}, "d2t": {"draft_vocab": 2048, "seed": 11}, "near": {"d2t_ids": list(NEAR_IDS), "seed": 12}}
        write_tiny_eagle3(files["draft"], tokenizer, target_layers=EAGLE3_LAYERS, **kw[head])  # type: ignore[arg-type]
        return files

    return write


CASES: dict[str, GoldenCase] = {
    c.name: c
    for c in (
        GoldenCase("eagle3", "eagle3", "draft-eagle3", _eagle3("random"), NEAR_PROMPT),
        GoldenCase("eagle3-d2t", "eagle3", "draft-eagle3", _eagle3("d2t"), "def fibonacci(n):"),
        GoldenCase("eagle3-near", "eagle3", "draft-eagle3", _eagle3("near"), NEAR_PROMPT, n_predict=16),
    )
}

# Families with no case yet, and why (the test reports each as a skip with this reason).
PENDING: dict[str, str] = {
    "mtp": "no tiny MTP writer in tests/gguf_factory.py yet (a target with nextn layers); add a case "
    "with spec_type 'draft-mtp' here and run tests/golden/make_goldens.py --case NAME",
    "dflash": "no tiny DFlash writer in tests/gguf_factory.py yet; add a case with spec_type 'draft-dflash' "
    "here and run tests/golden/make_goldens.py --case NAME",
    "dspark": "no tiny DSpark writer in tests/gguf_factory.py yet; add a case with spec_type 'draft-dspark' "
    "here and run tests/golden/make_goldens.py --case NAME",
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
