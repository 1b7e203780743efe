"""A drafter family defined outside localspec, as a plugin would: one module, one registration call.

It drafts the last token again, k times: a poor draft, but a real one that the engine verifies."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.decoding.drafters import Drafter, Stateless
from localspec.draft import Draft
from localspec.families.base import BuildContext, DrafterFamily
from localspec.sampling import SamplingParams


class RepeatDrafter(Stateless):
    method = "toy"
    name = "toy"

    def prepare(self, context: Sequence[int], max_k: int) -> None:
        pass

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        *,
        min_confidence: float = 0.0,
    ) -> Draft:
        return Draft([int(context[-1])] * k, None, source="toy")


def _build(ctx: BuildContext) -> Drafter:
    return RepeatDrafter()


TOY = DrafterFamily(name="toy", summary="the last token again (a test family)", build=_build, default_k=3)
