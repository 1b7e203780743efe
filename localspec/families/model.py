"""A separate draft model with the target's tokenizer (--draft): the classic speculative pair."""

from __future__ import annotations

from localspec.decoding.drafters import Drafter, ModelDrafter
from localspec.errors import UsageError
from localspec.families.base import BuildContext, DrafterFamily


def _build(ctx: BuildContext) -> Drafter:
    if ctx.draft is None:
        raise UsageError("--draft-method model needs a draft model", "pass --draft PATH, or use --draft-method ngram")
    return ModelDrafter(ctx.draft)


MODEL = DrafterFamily(name="model", summary="a draft model", build=_build, needs="draft_model")
