"""What one sequence of a parallel batch (serve --parallel) is on any backend (llama.multi.LlamaSequence,
mlx.multi.MLXSequence): a Backend of its own over one loaded target, whose text, templates and facts it borrows,
with its own tokens; each backend's sequence adds how it reads tokens (`forward`) and cuts them back (`rollback`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from localspec.backends.base import (
    ByteDetokenizer,
    CachedModel,
    ChatMessage,
    Detokenizer,
    RollbackRoute,
    TokenTable,
    rollback_route,
)
from localspec.vocab import VocabInfo

ROOM_HINT = "raise --n-ctx (memory permitting), or lower --max-tokens"


class ParallelSequence(CachedModel):
    """One sequence of a loaded `target`'s batch, holding up to n_ctx positions."""

    def __init__(self, target: Any, index: int, n_ctx: int) -> None:
        self._target = target
        self.index = index
        self._info = replace(target.info, n_ctx=n_ctx)
        self._n_vocab = target.n_vocab
        self._eog = target.eog_ids
        self._tokens: list[int] = []
        self.rollback_routes: Counter[str] = Counter()

    def vocab_info(self) -> VocabInfo:
        return self._target.vocab_info()  # type: ignore[no-any-return]

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._target.tokenize(text, add_special=add_special, parse_special=parse_special)  # type: ignore[no-any-return]

    def detokenizer(self) -> Detokenizer | ByteDetokenizer:
        return self._target.detokenizer()  # type: ignore[no-any-return]

    def token_table(self) -> TokenTable:
        return self._target.token_table()  # type: ignore[no-any-return]

    def chat_template(self) -> str | None:
        return self._target.chat_template()  # type: ignore[no-any-return]

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True, template: str | None = None,
        tools: Sequence[dict[str, Any]] | None = None, variables: Mapping[str, Any] | None = None,
    ) -> str:  # fmt: skip
        return self._target.apply_chat_template(  # type: ignore[no-any-return]
            messages, add_generation_prompt=add_generation_prompt, template=template, tools=tools, variables=variables
        )

    def check_room(self, n: int) -> None:
        self._check_room(n, ROOM_HINT)

    def appended(self, tokens: Sequence[int]) -> None:
        self._tokens.extend(int(t) for t in tokens)

    def replaced(self, tokens: Sequence[int]) -> None:
        """The sequence now holds `tokens` (its owner's `share`)."""
        self._tokens = [int(t) for t in tokens]

    def _route(self, n_keep: int) -> RollbackRoute:
        return rollback_route(len(self._tokens), n_keep, recurrent=False)

    def _refused_state(self) -> str:
        return "it keeps no recurrent state"

    def checkpoint(self) -> None:
        return None  # an attention cache is cut back by position

    def abort(self, on: bool = True) -> None:
        self._target.abort(on)

    def close(self) -> None:
        return None  # the owner frees what its sequences share
