"""What one round and one run of speculative decoding did, in the numbers users read.

One stats type, SpecStats, serves every consumer: the engine yields a running snapshot with every
step (stop_reason None while it runs) and the final one with Done; the CLI, the TUI, bench and the
server render it and recompute nothing.
"""

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
    source: str = "none"  # who wrote the draft: "none" (plain round), "ngram", "model", ...
    rollback_s: float = 0.0  # part of verify_s spent cutting the caches back (hybrid models restore state)

    @property
    def accepted_length(self) -> int:
        """Tokens this round's single target pass produced: accepted drafts plus the target's own."""
        return self.n_accepted + 1


@dataclass(frozen=True)
class SourceStats:
    """Rounds of one draft source within a run (auto mixes several; a fixed method has one)."""

    source: str
    rounds: int
    drafted: int
    accepted: int


@dataclass(frozen=True)
class NearTie:
    """A greedy choice whose runner-up was within NEAR_TIE_GAP logits: where batched and one-token
    arithmetic (last-bit differences) may pick differently, so speculative and plain streams can part."""

    position: int  # index in the generated tokens
    token: int
    runner_up: int
    gap: float  # logit of token minus logit of runner_up


NEAR_TIE_GAP = 0.1


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
    stop_reason: StopReason | None  # None in a running snapshot
    sources: tuple[SourceStats, ...] = ()
    rollback_s: float = 0.0
    near_ties: tuple[NearTie, ...] = ()  # greedy runs only
    grammar_s: float = 0.0  # the grammar matcher's time (masks, consumes, rollbacks; decoding/grammar.py)
    grammar_masks: int = 0  # masks it computed: one per verified row

    @property
    def prompt_tps(self) -> float:
        n = self.n_prompt - self.n_prompt_cached
        return n / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def decode_tokens(self) -> int:
        """Tokens counted by decode speed: the first token comes from the prompt pass."""
        return max(self.n_generated - 1, 0)

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target pass: what each round added to the answer (its accepted drafts and the target's
        own token; RoundStats.n_emitted), averaged over every round, drafted or not: 1.0 for plain decoding.
        A round that ends the answer counts only what came before the end-of-generation token (drafts it
        accepted past that token are no part of the answer). 0.0 when no round ran: the prompt pass
        alone wrote the answer (one token at most). Equal to (n_generated - 1) / n_rounds."""
        return self.decode_tokens / self.n_rounds if self.n_rounds else 0.0

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        return tuple(a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position))

    @property
    def drafting_share(self) -> float:
        """Share of rounds that drafted anything (auto decodes plainly in the others)."""
        return (self.drafted_by_position[0] / self.n_rounds) if self.n_rounds and self.drafted_by_position else 0.0

    def choices(self) -> str:
        """What the rounds' drafts came from, e.g. `ngram 67%, plain 33%` (auto's decisions)."""
        return format_choices({s.source: s.rounds for s in self.sources})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("prompt_tps", "decode_tps", "acceptance_rate", "mean_accepted_length", "acceptance_by_position"):
            d[name] = getattr(self, name)
        return d


def format_choices(rounds_by_source: dict[str, int]) -> str:
    """`ngram 67%, plain 33%`: shares of rounds by draft source, largest first ("none" reads "plain")."""
    total = sum(rounds_by_source.values())
    if not total:
        return ""
    parts = sorted(rounds_by_source.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{'plain' if src == 'none' else src} {n / total:.0%}" for src, n in parts)


class StatsCollector:
    """Accumulates rounds into the totals of a SpecStats."""

    def __init__(self) -> None:
        self.n_rounds = 0
        self.n_drafted = 0
        self.n_accepted = 0
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.rollback_s = 0.0
        self.drafted_by_position: list[int] = []
        self.accepted_by_position: list[int] = []
        self._sources: dict[str, list[int]] = {}  # source -> [rounds, drafted, accepted]

    def add(self, r: RoundStats) -> None:
        self.n_rounds += 1
        self.n_drafted += r.n_drafted
        self.n_accepted += r.n_accepted
        self.draft_s += r.draft_s
        self.verify_s += r.verify_s
        self.rollback_s += r.rollback_s
        grow = r.n_drafted - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position += [0] * grow
            self.accepted_by_position += [0] * grow
        for i in range(r.n_drafted):
            self.drafted_by_position[i] += 1
            if i < r.n_accepted:
                self.accepted_by_position[i] += 1
        counts = self._sources.setdefault(r.source if r.n_drafted else "none", [0, 0, 0])
        counts[0] += 1
        counts[1] += r.n_drafted
        counts[2] += r.n_accepted

    def totals(self) -> dict[str, Any]:
        return {
            "n_rounds": self.n_rounds,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "rollback_s": self.rollback_s,
            "drafted_by_position": tuple(self.drafted_by_position),
            "accepted_by_position": tuple(self.accepted_by_position),
            "sources": tuple(SourceStats(s, *c) for s, c in self._sources.items()),
        }
