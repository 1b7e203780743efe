"""Which drafters that read the target's hidden states (EAGLE-3, MTP, DFlash, DSpark) a pair of files can
run, from the GGUF headers alone: what `bench --methods` and the TUI picker offer.

    head_family(path) -> str | None       the head family a --draft file is made for, or None (a draft model)
    head_method_fit(target, draft, method) -> str
                                          "" when `method` can run on these files here, else why not
    head_methods_fitting(target, draft) -> dict[str, str]
                                          every head method and "" or the reason it cannot run

A head file is recognised as llama.cpp's `-hf` recognises a sidecar (its name holds `mtp-`, `eagle3-`,
`dflash-` or `dspark-`) or by its architecture (`eagle3`, `dflash`). Whether it fits the target is the
pipeline's own check (localspec.pipeline.check_pair), so a family whose checks grow there is offered
here by the same rule.
"""

from __future__ import annotations

from pathlib import Path

from localspec.errors import LocalspecError, error_text
from localspec.options import HEAD_METHODS, ModelOptions

SIDECAR_PREFIXES = {"mtp-": "mtp", "eagle3-": "eagle3", "dflash-": "dflash", "dspark-": "dspark"}  # llama.cpp -hf
_ARCHITECTURES = {"eagle3": "eagle3", "dflash": "dflash"}  # a DSpark file is a `dflash` one with a markov_w1 tensor


def head_family(path: str | Path | None) -> str | None:
    """The head family a GGUF file is made for (by llama.cpp's sidecar name, else its architecture), or
    None: a draft model, a directory (MLX), or a file that cannot be read (its loader will say why)."""
    if not path or not str(path).lower().endswith(".gguf"):
        return None
    name = Path(path).name.lower()
    for prefix, family in SIDECAR_PREFIXES.items():
        if prefix in name:
            return family
    from localspec.gguf_meta import peek_architecture, read_gguf_header

    family = _ARCHITECTURES.get(peek_architecture(path) or "")  # a draft model's vocabulary is not parsed here
    if family != "dflash":
        return family
    try:
        header = read_gguf_header(path, check_size=False)
    except LocalspecError:
        return None
    return "dspark" if any(t.name.startswith("markov_w1") for t in header.tensors) else family


def head_method_fit(target: str, draft: str | None, method: str) -> str:
    """"" when `method` (a head method) can run on this target and head here, else the reason: the family
    not runnable by this build or by localspec (llama_ext.family_status), a head of another architecture,
    one made for another target. From headers only; nothing loads."""
    if method not in HEAD_METHODS:
        raise ValueError(f"{method!r} is not a head method")
    from localspec.pipeline import check_pair

    try:
        check_pair(ModelOptions(target=target, draft=draft or None, backend="llama", draft_method=method))
    except LocalspecError as e:
        return error_text(e)
    except Exception as e:  # a header the readers choke on
        return error_text(e)
    return ""


def head_methods_fitting(target: str, draft: str | None) -> dict[str, str]:
    return {m: head_method_fit(target, draft, m) for m in HEAD_METHODS}
