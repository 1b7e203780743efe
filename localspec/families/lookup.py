"""Drafts without a model: plain decoding (the baseline), n-gram prompt lookup, suffix copies."""

from __future__ import annotations

from localspec.decoding.drafters import Drafter, NgramDrafter, NoDrafter
from localspec.decoding.suffix import SuffixDrafter
from localspec.decoding.text_resync import text_codec
from localspec.families.base import BuildContext, DrafterFamily

SUFFIX_K = 32  # suffix drafts' longest; each draft is also limited by its match length


def _none(ctx: BuildContext) -> Drafter:
    return NoDrafter()


def _ngram(ctx: BuildContext) -> Drafter:
    return NgramDrafter(max_ngram=4, gate=True)  # llama-lookup's n-gram lengths and thresholds


def _suffix(ctx: BuildContext) -> Drafter:
    return SuffixDrafter(memory=ctx.memory, codec=text_codec(ctx.target))


NONE = DrafterFamily(name="none", summary="plain decoding", build=_none, default_k=0)
NGRAM = DrafterFamily(name="ngram", summary="prompt lookup, no model", build=_ngram, lookup=True)
SUFFIX = DrafterFamily(
    name="suffix",
    summary="copy what followed the longest earlier match in this session's text, no model",
    build=_suffix,
    default_k=SUFFIX_K,
    lookup=True,
)
