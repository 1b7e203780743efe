"""The `vllm serve` command equivalent to a `localspec serve` of a catalog pair (for users who outgrow
one machine): vLLM loads the original Hub models, which the catalog names as each pair's `base`."""

from __future__ import annotations

import json
import shlex

from localspec.catalog import load_catalog
from localspec.errors import UsageError
from localspec.options import FIXED_K, MAX_K

NGRAM_LOOKUP_MAX = 3  # localspec's n-gram drafter matches up to 3 tokens


def vllm_command(
    pair_name: str | None,
    *,
    method: str,
    k: int | None,
    port: int | None = None,
    model_name: str | None = None,
) -> str:
    """The shell command. `auto` (which vLLM has no equivalent of) maps to the pair's draft model."""
    if not pair_name:
        raise UsageError(
            "--print-vllm needs a catalog pair (--pair NAME, or none for the default), not model files: vLLM loads the original Hub models, which the catalog names",
            "use a catalog pair (see `localspec models`), or add `base = { target = ..., draft = ... }` to "
            "your own pair in models.toml",
        )
    pair = load_catalog().get(pair_name)
    if pair.base is None:
        raise UsageError(
            f"pair {pair_name!r} names no original models for vLLM",
            'add `base = { target = "OWNER/REPO", draft = "OWNER/REPO" }` to the pair in your models.toml',
        )
    n = min(k if k is not None else (pair.num_draft or FIXED_K), MAX_K)
    args = ["vllm", "serve", pair.base.target]
    if method in ("auto", "model"):
        config = {"method": "draft_model", "model": pair.base.draft, "num_speculative_tokens": n}
        args += ["--speculative-config", json.dumps(config)]
    elif method == "ngram":
        config = {"method": "ngram", "num_speculative_tokens": n, "prompt_lookup_max": NGRAM_LOOKUP_MAX}
        args += ["--speculative-config", json.dumps(config)]
    args += ["--served-model-name", model_name or pair.name]
    if port is not None:
        args += ["--port", str(port)]
    return " ".join(shlex.quote(a) for a in args)
