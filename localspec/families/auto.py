"""auto: measure costs and acceptance, and pick each round's draft (lookup, a draft model or a head, or
none) and its length. Its model slot is the draft model, or a head family that says auto may drive it."""

from __future__ import annotations

from localspec.decoding.drafters import Drafter, LazyModelDrafter, ModelDrafter
from localspec.families.base import BuildContext, DrafterFamily

AUTO_MAX_K = 32  # the longest draft auto may choose (long exact copies pay even on a CPU)


def _build(ctx: BuildContext) -> Drafter:
    from localspec.decoding.auto import AutoDrafter, auto_lookup

    model: Drafter | None = None
    if ctx.head_drafter is not None:
        model = ctx.head_drafter()  # a head captures from the first token on: not lazy
    elif ctx.draft is not None:
        model = ModelDrafter(ctx.draft)
    elif ctx.load_draft is not None:
        model = LazyModelDrafter(ctx.load_draft, ctx.draft_name or "draft", size_bytes=ctx.draft_size)
    return AutoDrafter(
        ngram=auto_lookup(ctx.memory, ctx.target), model=model, target=ctx.target, clock=ctx.clock, store=ctx.store
    )


AUTO = DrafterFamily(
    name="auto",
    summary="measure costs and acceptance, pick the draft (suffix lookup, model, head or none) and its length each round",
    build=_build,
    accepts_draft=True,
    default_k=AUTO_MAX_K,
)
