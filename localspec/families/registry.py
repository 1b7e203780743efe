"""Every drafter family in one table, and the questions the rest of localspec asks about them.

    families() / names() / family(name)      the table, in the order help texts and pickers show it
    register(family) / unregister(name)       add one (a plugin, a test); one call, nothing else to touch
    head_for_draft(draft, target)             which head family a --draft file is made for (None: a model)
    check_family(name, ...)                   the checks before loading, from headers only (raises)
    fit(name, target, draft, backend)         "" when the family can run on these files, else why not
    build_drafter(name, ctx)                  the drafter, over loaded models

Adding a family: write its module (a DrafterFamily value, see localspec.families.base) and add it to
_BUILT_IN below.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.backends.registry import BACKENDS, backend_spec
from localspec.errors import LocalspecError, UsageError, error_text
from localspec.families.auto import AUTO
from localspec.families.base import BuildContext, CheckContext, DrafterFamily
from localspec.families.block import DFLASH_FAMILY, DSPARK_FAMILY
from localspec.families.eagle3 import EAGLE3
from localspec.families.lookup import NGRAM, NONE, SUFFIX
from localspec.families.model import MODEL
from localspec.families.mtp import MTP
from localspec.vocab import check_compatible

if TYPE_CHECKING:
    from localspec.backends.base import BackendModule
    from localspec.decoding.drafters import Drafter

_BUILT_IN = (AUTO, MODEL, NGRAM, SUFFIX, NONE, EAGLE3, MTP, DFLASH_FAMILY, DSPARK_FAMILY)
_TABLE: dict[str, DrafterFamily] = {f.name: f for f in _BUILT_IN}
DEFAULT = AUTO.name  # measured to beat every fixed method on the reference CPU (see README's bench figures)


def register(fam: DrafterFamily) -> None:
    """Add a family: offered from then on by run, chat, bench, doctor and serve."""
    if fam.name in _TABLE:
        raise ValueError(f"a drafter family named {fam.name!r} is registered already")
    _TABLE[fam.name] = fam


def unregister(name: str) -> None:
    if any(f.name == name for f in _BUILT_IN):
        raise ValueError(f"{name!r} is a built-in family")
    _TABLE.pop(name, None)


def families() -> tuple[DrafterFamily, ...]:
    return tuple(_TABLE.values())


def names() -> tuple[str, ...]:
    return tuple(_TABLE)


def head_families() -> tuple[DrafterFamily, ...]:
    return tuple(f for f in _TABLE.values() if f.is_head)


def family(name: str) -> DrafterFamily:
    if name not in _TABLE:
        raise UsageError(f"unknown draft method {name!r}", f"choose one of: {', '.join(_TABLE)}")
    return _TABLE[name]


def help_text() -> str:
    """--draft-method's help: each family's summary, and where it runs when not everywhere."""
    parts = []
    for f in _TABLE.values():
        names = f.backend_names()
        where = f" ({', '.join(backend_spec(b).label for b in names)})" if names is not None else ""
        parts.append(f"{f.name}: {f.summary}{where}")
    return "; ".join(parts)


# -- which family a file is for ------------------------------------------------------------------------


def head_for_draft(draft: str | Path | None, target: str | Path | None = None) -> str | None:
    """The head family a --draft file is made for: by llama.cpp's sidecar name (`eagle3-...gguf`), else by
    its architecture (where several families share one, the one that claims the file); or, when --draft
    is the target file itself, a family whose layers the target carries (MTP). None: a draft model, a
    directory, or a file that cannot be read (its loader will say why)."""
    if draft and Path(draft).expanduser().is_dir():
        found = _by_config(Path(draft).expanduser())
        return found if found is not None or target is None else _own_head(draft, target)
    if not draft or not str(draft).lower().endswith(".gguf"):
        return None
    heads = head_families()
    name = Path(draft).name.lower()
    for f in heads:
        if f.sidecar_prefix and f.sidecar_prefix in name:
            return f.name
    by_arch = _by_architecture(str(draft), heads)
    if by_arch is not None:
        return by_arch
    return _own_head(draft, target) if target is not None else None


def _own_head(draft: str | Path, target: str | Path) -> str | None:
    """When --draft is the target itself: a family whose layers the target carries (MTP), else None."""
    if not _same_file(draft, target):
        return None
    return next((f.name for f in head_families() if f.needs == "own_head" and f.claims and f.claims(str(target))), None)


def _by_architecture(path: str, heads: tuple[DrafterFamily, ...]) -> str | None:
    from localspec.gguf_meta import peek_architecture

    arch = peek_architecture(path) or ""  # a draft model's vocabulary is not parsed here
    matching = [f for f in heads if arch in f.head_architectures]
    if len(matching) > 1:
        return next((f.name for f in matching if f.claims is None or f.claims(path)), matching[0].name)
    return matching[0].name if matching else None


def _by_config(directory: Path) -> str | None:
    """The head family whose config.json this directory holds (None: a model directory, or unreadable)."""
    import json

    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    return next((f.name for f in head_families() if f.claims_config and f.claims_config(config)), None)


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


def auto_head(draft: str | None, target: str) -> str | None:
    """For auto: the head family that drafts in the draft model's place (one auto may drive), or None."""
    name = head_for_draft(draft, target)
    return name if name is not None and family(name).auto_drives else None


# -- checks before loading, and building ----------------------------------------------------------------


def check_family(name: str, *, target: str, draft: str | None, backend: str, module: BackendModule) -> None:
    """What can be checked of a family on these files without loading weights: the backend, this build,
    the files a head needs, the family's own header checks and a head's vocabulary. Raises LocalspecError."""
    fam = family(name)
    _check_runnable(fam, backend)
    if fam.needs == "head_file" and not draft:
        arch = f" (architecture {fam.head_architectures[0]})" if fam.head_architectures else ""
        raise UsageError(f"--draft-method {name} needs the head's file", f"pass --draft HEAD.gguf{arch}")
    if fam.needs == "draft_model" and not draft:
        raise UsageError(
            f"--draft-method {name} needs a draft model",
            "pass --draft PATH (a small model with the target's tokenizer), or use --draft-method ngram",
        )
    if not fam.is_head:
        return
    files = (target, draft) if fam.needs == "head_file" else (target,)
    for path in files:
        assert path is not None
        module.check_path(path)
    if fam.check is not None:
        fam.check(CheckContext(target=target, draft=draft, backend=backend, module=module))
    if fam.needs == "head_file" and draft and not Path(draft).expanduser().is_dir():
        # The head's logits are over its own tokenizer's ids (the target's, when converted with it). A head
        # directory has no tokenizer: its family's check compares its vocabulary size with the target's.
        check_compatible(module.peek_vocab(target), module.peek_vocab(draft), target_name=target, draft_name=draft)


def _check_runnable(fam: DrafterFamily, backend: str) -> None:
    """The family runs on this backend, and this build of it can run the family."""
    if not fam.runs_on(backend):
        names = fam.backend_names()
        assert names is not None
        specs = [backend_spec(b) for b in names]
        raise UsageError(
            f"--draft-method {fam.name} runs on {' and '.join(s.label for s in specs)} only",
            f"use --backend {specs[0].name} with a {specs[0].model_format}, or another method",
        )
    spec = BACKENDS.get(backend)
    if fam.is_head and spec is not None and fam.name not in spec.head_families:
        raise UsageError(
            f"--draft-method {fam.name} reads the target's hidden states, which the {spec.label} backend does not "
            "hand out",
            "use a draft model or a lookup (--draft-method auto, model, suffix)",
        )
    if fam.require is not None:
        fam.require(backend)  # the reason, where this build cannot run the family


def fit(name: str, target: str, draft: str | None, backend: str) -> str:
    """ "" when family `name` can run on these files here, else the reason. From headers only."""
    try:
        module = backend_spec(backend).module()
        check_family(name, target=target, draft=draft or None, backend=backend, module=module)
        module.peek_vocab(target)
    except LocalspecError as e:
        return error_text(e)
    except Exception as e:  # a header the readers choke on
        return error_text(e)
    return ""


def head_fits(target: str, draft: str | None, backend: str) -> dict[str, str]:
    """For every head family: "" when it can run on these files, else why not (bench, the picker)."""
    return {f.name: fit(f.name, target, draft, backend) for f in head_families()}


def build_drafter(name: str, ctx: BuildContext) -> Drafter:
    """The drafter of family `name` over the loaded models (the only place drafters are built)."""
    fam = family(name)
    _check_runnable(fam, ctx.backend)
    if fam.needs == "head_file" and not ctx.head:
        raise UsageError(f"--draft-method {name} needs the head's file", "pass --draft HEAD.gguf")
    if ctx.auto_head is not None and ctx.head_drafter is None and fam.accepts_draft:
        head, plain = ctx.auto_head, replace(ctx, auto_head=None)
        ctx = replace(ctx, head_drafter=lambda: build_drafter(head, plain))
    return fam.build(ctx)
