"""From a request body to what the engine runs: prompt tokens, a GenerationConfig, the draft method
and the stop strings. Every value goes through localspec.options, so the server refuses what `run`
refuses, with the same words (as a 400)."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.backends.base import ChatMessage
from localspec.decoding.engine import GenerationConfig
from localspec.errors import LocalspecError
from localspec.families import registry
from localspec.options import generation_config
from localspec.pipeline import Pipeline
from localspec.server.errors import APIError, from_localspec
from localspec.server.schemas import ChatCompletionRequest, CompletionRequest, Endpoint, _Sampling

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class Defaults:
    """The server's flags: what a request gets for each field it leaves out."""

    method: str
    k: int | None
    pair_k: int | None
    rule: str
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    max_tokens: int | None  # None: until the context is full
    system: str | None


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: Endpoint
    prompt: list[int]
    config: GenerationConfig
    method: str
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool


def check_model(body: _Sampling, served: str) -> None:
    if body.model and body.model != served:
        raise APIError(404, f"The model `{body.model}` does not exist; this server serves `{served}`.",
                       "model", "model_not_found")  # fmt: skip


def chat_request(body: ChatCompletionRequest, pipeline: Pipeline, defaults: Defaults, served: str) -> GenerationRequest:
    check_model(body, served)
    if body.top_logprobs:
        raise APIError(400, "logprobs are not supported by localspec serve", "top_logprobs", "unsupported_parameter")
    messages = chat_messages(body, defaults.system)
    try:
        tokens = pipeline.prompt_tokens(messages)
    except LocalspecError as e:
        raise from_localspec(e, param="messages") from None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    return _request("chat", body, tokens, max_tokens, param, pipeline, defaults)


def completion_request(body: CompletionRequest, pipeline: Pipeline, defaults: Defaults, served: str) -> GenerationRequest:
    check_model(body, served)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "only one prompt per request is supported (got a batch)", "prompt", "invalid_value")
        prompt = prompt[0]
    if not prompt:
        raise APIError(400, "the prompt is empty", "prompt", "invalid_value")
    try:
        tokens = pipeline.prompt_tokens(prompt, raw=True)  # str, or token ids as they are
    except LocalspecError as e:
        raise from_localspec(e, param="prompt") from None
    if any(t < 0 or t >= pipeline.target.n_vocab for t in tokens):
        raise APIError(400, "the prompt has token ids outside the model's vocabulary", "prompt", "invalid_value")
    return _request("completion", body, tokens, body.max_tokens, "max_tokens", pipeline, defaults)


def chat_messages(body: ChatCompletionRequest, system: str | None) -> list[ChatMessage]:
    if not body.messages:
        raise APIError(400, "messages must be a non-empty list", "messages", "invalid_value")
    out: list[ChatMessage] = []
    for i, m in enumerate(body.messages):
        role = ROLES.get(m.role)
        if role is None:
            raise APIError(400, f"messages[{i}].role {m.role!r} is not supported (use system, user or assistant)",
                           f"messages[{i}].role", "invalid_value")  # fmt: skip
        if m.non_text_parts():
            raise APIError(400, f"messages[{i}] has {', '.join(m.non_text_parts())} content; only text is supported",
                           f"messages[{i}].content", "invalid_value")  # fmt: skip
        out.append(ChatMessage(role, m.text()))
    if system and not any(m.role == "system" for m in out):
        out.insert(0, ChatMessage("system", system))
    return out


def _request(
    endpoint: Endpoint,
    body: _Sampling,
    tokens: list[int],
    max_tokens: int | None,
    max_param: str,
    pipeline: Pipeline,
    defaults: Defaults,
) -> GenerationRequest:
    if body.n not in (None, 1):
        raise APIError(400, f"n={body.n}: localspec serve returns one choice per request (n=1)", "n", "invalid_value")
    if body.logprobs:
        raise APIError(400, "logprobs are not supported by localspec serve", "logprobs", "unsupported_parameter")
    n_ctx = pipeline.target.n_ctx
    if len(tokens) >= n_ctx:
        raise APIError(
            400,
            f"This model's maximum context length is {n_ctx} tokens, but the prompt is {len(tokens)} tokens "
            "(no room to generate). Shorten the prompt, or restart the server with a larger --n-ctx.",
            "messages" if endpoint == "chat" else "prompt",
            "context_length_exceeded",
        )
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"{max_param} must be at least 1, got {max_tokens}", max_param, "invalid_value")
    if body.seed is not None and body.seed < 0:
        raise APIError(400, f"seed must be 0 or more, got {body.seed}", "seed", "invalid_value")
    room = n_ctx - len(tokens)
    wanted = max_tokens if max_tokens is not None else defaults.max_tokens
    spec = body.speculative
    method = (spec.method if spec and spec.method else None) or defaults.method
    if method not in registry.names():
        raise APIError(400, f"unknown speculative.method {method!r} (choose one of: {', '.join(registry.names())})",
                       "speculative.method", "invalid_value")  # fmt: skip
    if method == "model" and not pipeline.has_draft_model:
        raise APIError(400, "speculative.method model needs a draft model, and this server has none loaded",
                       "speculative.method", "invalid_value")  # fmt: skip
    k = spec.k if spec and spec.k is not None else (defaults.k if method == defaults.method else None)
    try:
        config = generation_config(
            method=method,
            k=k,
            pair_k=defaults.pair_k,
            rule=(spec.rule if spec and spec.rule else None) or defaults.rule,
            temperature=_pick(body.temperature, defaults.temperature),
            top_k=_pick(body.top_k, defaults.top_k),
            top_p=_pick(body.top_p, defaults.top_p),
            min_p=_pick(body.min_p, defaults.min_p),
            seed=_pick(body.seed, defaults.seed),
            max_tokens=min(wanted, room) if wanted is not None else room,
        )
    except LocalspecError as e:
        raise from_localspec(e) from None
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    return GenerationRequest(endpoint, tokens, config, method, tuple(body.stop_strings()), body.stream, include_usage)


def _pick(value, default):  # type: ignore[no-untyped-def]
    return default if value is None else value
