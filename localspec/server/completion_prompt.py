"""The prompt of a /v1/completions request: text or token ids as they are, or, with `suffix`, the
fill-in-the-middle prompt around it (localspec/fim.py); and the text `echo` repeats before the answer.

A `suffix` of "" asks for nothing (plain completion, as before), so clients that send it by default still work
on models without FIM tokens. `echo` with a suffix is refused, as OpenAI refuses it: the answer would have to
repeat a prompt the model never saw as written (the FIM tokens sit between prefix and suffix).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localspec.backends.base import Backend
from localspec.errors import LocalspecError
from localspec.fim import FimTokens, fim_prompt
from localspec.pipeline import Pipeline
from localspec.server.errors import APIError, from_localspec
from localspec.server.schemas import CompletionRequest


@dataclass(frozen=True)
class CompletionPrompt:
    tokens: list[int]
    echo: str  # what the answer starts with: the prompt, when the request asks for echo ("" otherwise)


def completion_prompt(
    body: CompletionRequest, pipeline: Pipeline, fim: Callable[[], FimTokens | None]
) -> CompletionPrompt:
    """The request's prompt tokens (400s for what cannot be a prompt); `fim` finds the model's FIM tokens."""
    prompt = one_prompt(body.prompt)
    if body.suffix and body.echo:
        raise APIError(400, "echo cannot be combined with suffix (fill-in-the-middle): send one or the other",
                       "echo", "invalid_value")  # fmt: skip
    if not prompt and not body.suffix:
        raise APIError(400, "the prompt is empty", "prompt", "invalid_value")
    try:
        if body.suffix:
            tokens = middle_prompt(prompt, body.suffix, pipeline.target, fim())
        else:
            tokens = pipeline.prompt_tokens(prompt, raw=True)  # str, or token ids as they are
    except LocalspecError as e:
        raise from_localspec(e, param="prompt") from None
    if any(t < 0 or t >= pipeline.target.n_vocab for t in tokens):
        raise APIError(400, "the prompt has token ids outside the model's vocabulary", "prompt", "invalid_value")
    return CompletionPrompt(tokens, echo_text(prompt, pipeline.target) if body.echo else "")


def one_prompt(prompt: str | list[str] | list[int] | None) -> str | list[int]:
    """The one prompt of a request: text, or token ids (a batch of texts is refused)."""
    if prompt is None or isinstance(prompt, str):
        return prompt or ""
    if prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "only one prompt per request is supported (got a batch)", "prompt", "invalid_value")
        return str(prompt[0])
    return [int(t) for t in prompt]  # token ids (the schema took only ints here)


def middle_prompt(prefix: str | Sequence[int], suffix: str, target: Backend, fim: FimTokens | None) -> list[int]:
    """The fill-in-the-middle prompt: the model's BOS if its vocabulary adds one, then prefix, suffix, middle
    (each part tokenized on its own without specials, as llama-server's /infill does)."""
    if fim is None:
        raise APIError(400, f"suffix: fill-in-the-middle needs the model's FIM tokens (such as <|fim_prefix|>, "
                       f"<|fim_suffix|>, <|fim_middle|>), and {target.info.name} has none; leave suffix out, or serve "
                       "a code model that has them (Qwen2.5-Coder, CodeLlama, StarCoder2, ...)", "suffix",
                       "unsupported_parameter")  # fmt: skip
    bos = [t for t in target.tokenize("", add_special=True, parse_special=False) if t not in target.eog_ids]
    head = plain_tokens(prefix, target) if isinstance(prefix, str) else list(prefix)  # token ids: as they are
    return fim_prompt(fim, head, plain_tokens(suffix, target), bos)


def plain_tokens(text: str, target: Backend) -> list[int]:
    """Text as tokens, no BOS, special-token texts as plain text (a file may contain `<|fim_prefix|>`)."""
    return target.tokenize(text, add_special=False, parse_special=False)


def echo_text(prompt: str | Sequence[int], target: Backend) -> str:
    """The prompt as the answer repeats it: the text as sent, or the token ids' text."""
    if isinstance(prompt, str):
        return prompt
    detok = target.detokenizer()
    return detok.add(list(prompt)) + detok.flush()
