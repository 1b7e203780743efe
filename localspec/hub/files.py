"""Which files make a model on the Hub: a GGUF (all parts of a split one) or an mlx-lm snapshot."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from localspec.backends.registry import BACKENDS
from localspec.catalog import ModelRef, parse_model_ref, split_gguf_parts
from localspec.errors import CatalogError, PullError
from localspec.families import registry
from localspec.formatting import format_bytes

MLX_ALLOW_PATTERNS = (
    "*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model", "*.txt", "*.jsonl",
    "*.jinja",
)  # fmt: skip


@dataclass
class FilePlan:
    path: str
    size: int | None
    cached_path: str | None  # local path if already complete in the cache


# The hub fetches two kinds of model: one GGUF file (maybe split in parts), or a whole repo snapshot; the
# backends' table says which backend reads each.
FILE_BACKEND = next(spec.name for spec in BACKENDS.values() if spec.single_file)
REPO_BACKEND = next(spec.name for spec in BACKENDS.values() if not spec.single_file)


@dataclass
class ModelPlan:
    role: str
    ref: ModelRef
    backend: str  # FILE_BACKEND | REPO_BACKEND
    commit: str | None
    files: list[FilePlan] = field(default_factory=list)
    local: dict[str, str] = field(default_factory=dict)  # fetched so far: repo path -> local path
    sidecars: dict[str, str] = field(default_factory=dict)  # drafter family -> its sidecar's repo path (in files)
    downloaded: int = 0

    @property
    def main_file(self) -> str | None:
        return self.files[0].path if self.backend == FILE_BACKEND and self.files else None

    @property
    def bytes_to_download(self) -> int:
        return sum(f.size or 0 for f in self.files if not f.cached_path)

    @property
    def bytes_total(self) -> int:
        return sum(f.size or 0 for f in self.files)


def select_files(ref: ModelRef, backend: str | None, sizes: dict[str, int | None]) -> tuple[str, list[str]]:
    ggufs = sorted(p for p in sizes if p.endswith(".gguf"))
    if ref.file:
        if backend == REPO_BACKEND:
            raise PullError(
                f"{ref}: a {REPO_BACKEND} model is a whole repo, not one file", f"pull {ref.repo} without :FILE"
            )
        parts = split_gguf_parts(ref.file)
        missing = [p for p in parts if p not in sizes]
        if missing:
            raise PullError(
                f"file {missing[0]} not found in {ref.repo} (revision {ref.revision})",
                gguf_choice_hint(ref.repo, ggufs, sizes) if ggufs else f"files there: {', '.join(sorted(sizes)[:20])}",
            )
        return FILE_BACKEND if ref.file.endswith(".gguf") else "file", parts
    models = gguf_models(ggufs)
    has_weights = any(fnmatch.fnmatch(p, "model*.safetensors") for p in sizes)
    if backend == FILE_BACKEND or (backend is None and models):
        if not models:
            raise PullError(
                f"{ref.repo} has no GGUF model files",
                f"it looks like a safetensors repo: use --backend {REPO_BACKEND}"
                if has_weights
                else "check the repo id",
            )
        if len(models) > 1:
            raise PullError(
                f"{ref.repo} has {len(models)} GGUF models; say which one to pull",
                gguf_choice_hint(ref.repo, ggufs, sizes),
            )
        return FILE_BACKEND, split_gguf_parts(models[0])
    if not has_weights:
        raise PullError(
            f"{ref.repo} has no safetensors weights, so it is not an mlx-lm model repo",
            f"for a GGUF repo use --backend {FILE_BACKEND} and REPO:FILE" if ggufs else "check the repo id",
        )
    files = [p for p in sorted(sizes) if any(fnmatch.fnmatch(p, pat) for pat in MLX_ALLOW_PATTERNS)]
    return REPO_BACKEND, files


def gguf_models(ggufs: list[str]) -> list[str]:
    """GGUF models in a listing: split sets count once (by their first part); projector files and drafter
    sidecars (mtp-, eagle3-, dflash-, dspark-) are not models, as llama.cpp's -hf sees them."""
    out = []
    for p in ggufs:
        name = p.rsplit("/", 1)[-1]
        if name.startswith("mmproj") or "imatrix" in name.lower() or any(k in name for k in SIDECAR_KEYWORDS.values()):
            continue
        m = re.match(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", p)
        if m and m.group(2) != "00001":
            continue
        out.append(p)
    return out


# -- drafter sidecars -----------------------------------------------------------------------------------
# llama.cpp's -hf (common/download.cpp, find_best_sibling) fetches, next to a GGUF model, the files of the
# drafters that read its hidden states: a .gguf whose path holds the family's keyword, in the model's own
# folder or one above it; the deepest such folder wins, then the quantization closest to the model's.

SIDECAR_KEYWORDS = {f.name: f.sidecar_prefix for f in registry.head_families() if f.sidecar_prefix}
_SPLIT_SUFFIX = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_QUANT_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


def quant_bits(path: str) -> int:
    """The bits of a GGUF name's quantization tag (Q4_K_M -> 4, F16 -> 16, Q8_0 -> 8), 0 without one."""
    stem = path.removesuffix(".gguf")
    if m := _SPLIT_SUFFIX.match(stem):
        stem = m[1]
    tag = m[1] if (m := _QUANT_TAG.search(stem)) else ""
    digits = re.match(r"\D*(\d+)", tag)
    return int(digits[1]) if digits else 0


def best_sidecar(paths: list[str], model: str, keyword: str) -> str | None:
    """llama.cpp's choice of the sidecar holding `keyword` for the GGUF `model`, among a repo's `paths`."""
    model_dir = model.split("/")[:-1]
    bits = quant_bits(model)
    best: tuple[int, int] | None = None  # (depth, -bit difference): larger is better
    chosen = None
    for p in paths:
        if not p.endswith(".gguf") or keyword not in p:
            continue
        sib_dir = p.split("/")[:-1]
        if sib_dir != model_dir[: len(sib_dir)]:
            continue  # not in the model's folder or one above it
        score = (len(sib_dir), -abs(quant_bits(p) - bits))
        if best is None or score > best:
            best, chosen = score, p
    return chosen


def sidecars(paths: list[str], model: str) -> dict[str, str]:
    """Family -> the sidecar llama.cpp would fetch with `model`. A family the model file itself belongs
    to (a drafter pulled as the draft) brings no second file of its own kind."""
    name = model.rsplit("/", 1)[-1]
    own = split_gguf_parts(model)
    out = {}
    for family, keyword in SIDECAR_KEYWORDS.items():
        if keyword in name:
            continue
        found = best_sidecar([p for p in sorted(paths) if p not in own], model, keyword)
        if found:
            out[family] = found
    return out


def gguf_choice_hint(repo: str, ggufs: list[str], sizes: dict[str, int | None]) -> str:
    models = gguf_models(ggufs)
    lines = []
    for p in models:
        parts = split_gguf_parts(p)
        total = sum(sizes.get(q) or 0 for q in parts)
        extra = f", {len(parts)} parts" if len(parts) > 1 else ""
        lines.append(f"  localspec pull {repo}:{p}   ({format_bytes(total)}{extra})")
    return "pick one:\n" + "\n".join(lines)


def pair_backend(t: ModelRef, d: ModelRef) -> str:
    kinds = {
        FILE_BACKEND if (r.file or "").endswith(".gguf") else (REPO_BACKEND if not r.file else "?") for r in (t, d)
    }
    if len(kinds) == 1 and "?" not in kinds:
        return kinds.pop()
    raise PullError(
        f"target {t} and draft {d} are not the same kind of model",
        f"give two GGUF files (REPO:FILE.gguf, {FILE_BACKEND}) or two model repos (REPO, {REPO_BACKEND})",
    )


def as_ref(spec: str | ModelRef) -> ModelRef:
    if isinstance(spec, ModelRef):
        return spec

    try:
        return parse_model_ref(spec)
    except CatalogError as e:
        raise PullError(e.message, e.hint) from None


def pinned(plan: ModelPlan) -> ModelRef:
    return ModelRef(plan.ref.repo, plan.main_file, plan.commit or plan.ref.revision)
