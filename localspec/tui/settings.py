"""What the chat's settings dialog (F2) edits, mapped onto the same GenerationConfig as every front end."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.decoding.engine import GenerationConfig
from localspec.options import DEFAULT_DRAFT_METHOD, DEFAULT_MAX_TOKENS, DEFAULT_RULE, default_k, generation_config


@dataclass(frozen=True)
class ChatSettings:
    """Turned into a GenerationConfig for each reply; k is the one the engine (and auto) uses."""

    num_draft: int = default_k(DEFAULT_DRAFT_METHOD)
    rule: str = DEFAULT_RULE
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    system: str = ""

    def generation_config(self, method: str = DEFAULT_DRAFT_METHOD) -> GenerationConfig:
        """Raises UsageError for values the engine refuses, in the CLI's words."""
        return generation_config(
            method=method,
            k=self.num_draft,
            rule=self.rule,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            seed=self.seed,
            max_tokens=self.max_tokens,
        )

    @classmethod
    def from_config(cls, config: GenerationConfig, system: str | None) -> ChatSettings:
        s = config.sampling
        return cls(
            num_draft=config.num_draft or default_k(DEFAULT_DRAFT_METHOD),
            rule=config.rule,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            seed=s.seed,
            max_tokens=config.max_tokens,
            system=system or "",
        )
