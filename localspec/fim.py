"""Fill-in-the-middle: a vocabulary's FIM tokens and the prompt they make.

    FimTokens(prefix, suffix, middle)         the three ids (a backend's optional `fim_tokens()` finds them)
    find_fim_tokens(added)                    the ids by their known texts, in a {text: id} of added tokens
    fim_prompt(fim, prefix, suffix, bos)      [bos] <PRE> prefix <SUF> suffix <MID>: the model writes the middle

The order is prefix-suffix-middle, as llama-server's /infill and the Qwen2.5-Coder docs build it (without
/infill's repository header: a request has one file). The texts are llama.cpp's (llama-vocab.cpp), so a
vocabulary that llama.cpp finds FIM tokens in finds the same ones on MLX. FIM_END_TEXTS are the tokens
llama.cpp ends every generation at besides EOS/EOT (FIM pad, repository and file separators): a model
filling a middle writes one of them when it is done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PREFIX_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>")  # fmt: skip
SUFFIX_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>")  # fmt: skip
MIDDLE_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>")  # fmt: skip
FIM_END_TEXTS = frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                           "<reponame>", "<|file_sep|>"})  # fmt: skip


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int


def find_fim_tokens(added: Mapping[str, int]) -> FimTokens | None:
    """The FIM tokens among a vocabulary's added (special) tokens, by text; None unless all three are there."""
    found = [next((added[t] for t in texts if t in added), None) for texts in (PREFIX_TEXTS, SUFFIX_TEXTS,
                                                                                MIDDLE_TEXTS)]  # fmt: skip
    if any(i is None for i in found):
        return None
    prefix, suffix, middle = (int(i) for i in found if i is not None)
    return FimTokens(prefix, suffix, middle)


def fim_prompt(fim: FimTokens, prefix: Sequence[int], suffix: Sequence[int], bos: Sequence[int] = ()) -> list[int]:
    """The prompt that asks for the text between `prefix` and `suffix` (each tokenized on its own, no specials)."""
    return [*bos, fim.prefix, *prefix, fim.suffix, *suffix, fim.middle]
