"""What one round and one run of speculative decoding did, in the numbers users read."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

RoundKind = Literal["recovered", "bonus"]
StopReason = Literal["eog", "max_tokens", "context", "stopped"]


@dataclass(frozen=True)
class RoundStats:
    index: int
    n_drafted: int
    n_accepted: int
    n_emitted: int  # tokens this round added to the output (accepted + 1, fewer when a stop cut it)
    draft_s: float
    verify_s: float
    kind: RoundKind
    k: int = 0  # draft length asked for this round (the drafter may propose fewer)
    note: str = ""  # why the round looked like this (adaptive drafting explains itself here)

    @property
    def accepted_length(self) -> int:
        """Tokens this round's single target pass produced: accepted drafts plus the target's own."""
        return self.n_accepted + 1


@dataclass(frozen=True)
class SpecStats:
    backend: str
    device: str
    target: str
    draft: str
    draft_method: str
    rule: str
    num_draft: int
    temperature: float
    seed: int
    n_prompt: int
    n_prompt_cached: int  # prompt tokens reused from the KV cache (multi-turn chat)
    prompt_s: float
    n_generated: int
    decode_s: float  # from the first generated token to the last
    n_rounds: int
    n_drafted: int
    n_accepted: int
    draft_s: float
    verify_s: float
    drafted_by_position: tuple[int, ...]
    accepted_by_position: tuple[int, ...]
    stop_reason: StopReason

    @property
    def prompt_tps(self) -> float:
        n = self.n_prompt - self.n_prompt_cached
        return n / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        # The first token comes from the prompt pass; decode speed counts the tokens after it.
        n = max(self.n_generated - 1, 0)
        return n / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target pass: accepted drafts + 1, averaged over rounds (1.0 for plain decoding)."""
        return (self.n_accepted + self.n_rounds) / self.n_rounds if self.n_rounds else 0.0

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        return tuple(a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("prompt_tps", "decode_tps", "acceptance_rate", "mean_accepted_length", "acceptance_by_position"):
            d[name] = getattr(self, name)
        return d


class StatsCollector:
    """Accumulates rounds into a SpecStats."""

    def __init__(self) -> None:
        self.rounds: list[RoundStats] = []
        self.drafted_by_position: list[int] = []
        self.accepted_by_position: list[int] = []

    def add(self, r: RoundStats) -> None:
        self.rounds.append(r)
        grow = r.n_drafted - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position += [0] * grow
            self.accepted_by_position += [0] * grow
        for i in range(r.n_drafted):
            self.drafted_by_position[i] += 1
            if i < r.n_accepted:
                self.accepted_by_position[i] += 1

    def totals(self) -> dict[str, Any]:
        return {
            "n_rounds": len(self.rounds),
            "n_drafted": sum(r.n_drafted for r in self.rounds),
            "n_accepted": sum(r.n_accepted for r in self.rounds),
            "draft_s": sum(r.draft_s for r in self.rounds),
            "verify_s": sum(r.verify_s for r in self.rounds),
            "drafted_by_position": tuple(self.drafted_by_position),
            "accepted_by_position": tuple(self.accepted_by_position),
        }
