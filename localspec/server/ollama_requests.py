"""From an Ollama request to what the engine runs: /api/chat and /api/generate bodies become the chat or
completion request they ask for and go through requests.chat_request / completion_request, so they are
checked, rendered and generated exactly as /v1/chat/completions and /v1/completions would be. This module
only translates, and refuses what localspec cannot honour, with Ollama's words where Ollama has them.

The rules (README's "Ollama clients" says the same):
- model names: the served name and its aliases, with or without `:latest` (/api/tags lists `NAME:latest`),
  case aside; any other name is Ollama's 404 `model 'x' not found`.
- options: temperature, top_p, top_k, min_p, seed (negative: a fresh one), num_predict (0 or negative: until
  the context is full, as Ollama's -1 and -2), stop are honoured; options left out take serve's flags.
  num_ctx smaller than serve's --n-ctx bounds the request (the prompt must fit, the answer stops at it); a
  larger one is capped at --n-ctx, as Ollama caps it at the model's trained context. Penalties, mirostat,
  typical_p and tfs_z are refused unless neutral (the exact rule verifies against the model's own
  distribution). The load-time options (num_gpu, num_thread, num_batch, use_mmap, ...), num_keep and the
  parameters of refused samplers are accepted and change nothing: serve loaded the model once, with its
  flags, and never shifts the context. An option Ollama does not know either is refused.
- keep_alive, truncate, shift: accepted; the model stays loaded while the server runs, a prompt is never
  truncated (one that does not fit is a 400) and the context never shifts (the answer ends, done_reason
  length). Unloading (keep_alive 0 with nothing to generate) is refused.
- think: true (or a level) splits the thinking into `thinking`, and is a 400 where the model does not think;
  false asks the template not to think (`enable_thinking`, which Qwen3's reads); a model that thinks anyway
  still has its thinking in `thinking`, never in the content. A level is given to the template as
  `reasoning_effort` (gpt-oss reads it).
- images are refused (the served model reads text); /api/generate's `template` and `context` are refused
  (send the prompt formatted with raw, or the conversation to /api/chat); logprobs are refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pydantic import ValidationError

from localspec.server.errors import APIError, validation_error
from localspec.server.ollama_schemas import FIELD_NAMES as OLLAMA_FIELD_NAMES
from localspec.server.ollama_schemas import ChatRequest, GenerateRequest, GenerationFields, Message
from localspec.server.ollama_schemas import Options as OllamaOptions
from localspec.server.requests import GenerationRequest, Served, chat_request, completion_request
from localspec.server.schemas import FIELD_NAMES as OPENAI_FIELD_NAMES
from localspec.server.schemas import ChatCompletionRequest, CompletionRequest

FIELD_NAMES = OLLAMA_FIELD_NAMES | OPENAI_FIELD_NAMES  # a bad field named as the client wrote it
Body = TypeVar("Body", ChatCompletionRequest, CompletionRequest)
LATEST = ":latest"
THINK_LEVELS = ("low", "medium", "high", "max")
# Options refused unless they ask for nothing: the value that does.
NEUTRAL: dict[str, float] = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                             "typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}  # fmt: skip
# Accepted, changing nothing: how the model is loaded (serve's flags), context shifting (never done here), and
# the parameters of the samplers above (they tune nothing while those are neutral).
FIXED = ("numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap",
         "use_mlock", "embedding_only", "num_thread", "num_keep", "mirostat_tau", "mirostat_eta", "repeat_last_n",
         "penalize_newline")  # fmt: skip
DURATION = re.compile(r"^-?(\d+(\.\d*)?(ns|us|µs|ms|s|m|h))+$|^-?\d+(\.\d*)?$")  # Go's durations, or seconds


@dataclass(frozen=True)
class OllamaRequest:
    """A generation as the engine runs it, and the model name the client gave (the answer's chunks repeat it).
    `generation` None: nothing to generate (Ollama's "load the model" request: no messages, or no prompt),
    answered at once."""

    model: str
    generation: GenerationRequest | None  # None: a load request
    num_ctx_note: str = ""  # why num_ctx was not applied as given ("" when it was)


# -- model names --------------------------------------------------------------------------------------------


def tagged(name: str) -> str:
    """A name as Ollama lists it: with a tag (`:latest` when it has none)."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def matches(name: str, served: Served) -> bool:
    """`name` is the served model's name or an alias, with or without `:latest`, case aside."""
    asked = name.lower().removesuffix(LATEST)
    return any(asked == m.lower().removesuffix(LATEST) for m in served.model_ids)


def check_model(name: str, served: Served) -> None:
    if not name:
        raise APIError(400, "model is required", "model")
    if not matches(name, served):
        raise APIError(404, f"model '{name}' not found: this server serves "
                       f"{' or '.join(repr(tagged(m)) for m in served.model_ids)} (localspec serve runs one model; "
                       "ask for it by that name)", "model", "model_not_found")  # fmt: skip


# -- /api/chat ----------------------------------------------------------------------------------------------


def chat_generation(body: ChatRequest, served: Served) -> OllamaRequest:
    check_model(body.model, served)
    refuse_unhonoured(body)
    if not body.messages:
        return load_request(body)
    fields = {"messages": chat_messages(body.messages), **common_fields(body, served)}
    if body.tools:
        if fields.get("response_format"):
            raise APIError(400, "format cannot be combined with tools yet (a tool call would not fit the format); "
                           "send one or the other", "format")  # fmt: skip
        fields["tools"] = [tool.model_dump(exclude_none=True) for tool in body.tools]
    req = chat_request(openai_body(ChatCompletionRequest, fields), served)
    return bounded(body, replace(req, path="/api/chat"), served)


def chat_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as OpenAI chat messages. Ollama's calls may come without ids and its tool results
    name a function rather than a call: each result answers the call it names by id, else the oldest
    unanswered call of its function, else the oldest unanswered call."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, function) of calls not answered yet, oldest first
    for i, m in enumerate(messages):
        if m.images:
            raise APIError(400, f"messages[{i}].images: the served model reads text only; send text",
                           f"messages[{i}].images")  # fmt: skip
        role = m.role.lower()  # as Ollama reads roles
        message: dict[str, Any] = {"role": role, "content": m.content or ""}
        if m.tool_calls and role == "assistant":
            message["tool_calls"] = [call_body(i, j, c.id, c.function.name, c.function.arguments, pending)
                                     for j, c in enumerate(m.tool_calls)]  # fmt: skip
        elif m.tool_calls:
            raise APIError(400, f"messages[{i}] has tool_calls, which only an assistant message may have",
                           f"messages[{i}].tool_calls")  # fmt: skip
        if m.thinking and role == "assistant":
            message["reasoning_content"] = m.thinking
        if role == "tool":
            message["tool_call_id"] = answered(pending, m.tool_call_id, m.tool_name, i)
            if m.tool_name:
                message["name"] = m.tool_name
        out.append(message)
    return out


def call_body(
    i: int, j: int, call_id: str | None, name: str, arguments: dict[str, Any], pending: list[tuple[str, str]]
) -> dict[str, Any]:
    call_id = call_id or f"call_{i}_{j}"
    pending.append((call_id, name))
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}  # fmt: skip


def answered(pending: list[tuple[str, str]], call_id: str | None, name: str | None, i: int) -> str:
    """The id of the call a tool result answers (taken off `pending`); a result with no call before it keeps
    an id of its own (the template renders its content all the same)."""
    found = next((c for c in pending if c[0] == call_id), None) if call_id else None
    found = found or (next((c for c in pending if c[1] == name), None) if name else None)
    found = found or (pending[0] if pending else None)
    if found is None:
        return call_id or f"call_result_{i}"
    pending.remove(found)
    return found[0]


# -- /api/generate ------------------------------------------------------------------------------------------


def generate_generation(body: GenerateRequest, served: Served) -> OllamaRequest:
    check_model(body.model, served)
    refuse_unhonoured(body)
    refuse_generate_fields(body)
    if not body.prompt and not body.suffix:
        return load_request(body)
    fields = common_fields(body, served)
    if body.raw or body.suffix:  # the prompt as it is, or the fill-in-the-middle prompt around the suffix
        if body.think:
            raise APIError(400, "think needs the chat template, and a raw or suffix (fill-in-the-middle) prompt is "
                           "sent as it is; leave think out", "think")  # fmt: skip
        fields.pop("chat_template_kwargs", None)
        fields.pop("reasoning_format", None)
        prompt = {"prompt": body.prompt or "", **({"suffix": body.suffix} if body.suffix else {})}
        req = completion_request(openai_body(CompletionRequest, {**fields, **prompt}), served)
    else:  # the prompt as the user's turn of a conversation, rendered with the model's chat template
        messages = [{"role": "system", "content": body.system}] if body.system else []
        messages.append({"role": "user", "content": body.prompt})
        req = chat_request(openai_body(ChatCompletionRequest, {**fields, "messages": messages}), served)
    return bounded(body, replace(req, path="/api/generate"), served)


def refuse_generate_fields(body: GenerateRequest) -> None:
    if body.images:
        raise APIError(400, "images: the served model reads text only; leave images out", "images")
    if body.template:
        raise APIError(400, "template: localspec renders prompts with the model's own chat template; send the prompt "
                       "already formatted with raw: true instead", "template")  # fmt: skip
    if body.context:
        raise APIError(400, "context: localspec does not continue from earlier /api/generate context; send the "
                       "conversation to /api/chat (a repeated prefix is read from the cache, not again)",
                       "context")  # fmt: skip
    if body.raw and body.system:
        raise APIError(400, "raw mode does not support system: the prompt is sent as it is; put the system text "
                       "into the prompt", "system")  # fmt: skip
    if body.suffix and body.system:
        raise APIError(400, "system cannot be combined with suffix: a fill-in-the-middle prompt has no system text",
                       "system")  # fmt: skip


# -- what both take -----------------------------------------------------------------------------------------


def load_request(body: GenerationFields) -> OllamaRequest:
    """Ollama's "load the model" request (nothing to generate); unloading is refused."""
    if unloads(body.keep_alive):
        raise APIError(400, "keep_alive 0: localspec serve keeps its model loaded while it runs (it serves this one "
                       "model); stop the server to free the memory", "keep_alive")  # fmt: skip
    return OllamaRequest(body.model, None)


def unloads(keep_alive: float | int | str | None) -> bool:
    """keep_alive asks to unload at once: 0, "0", "0s", ... (every digit a zero)."""
    if isinstance(keep_alive, str):
        digits = re.sub(r"\D", "", keep_alive)
        return digits != "" and set(digits) == {"0"}
    return keep_alive is not None and keep_alive == 0


def refuse_unhonoured(body: GenerationFields) -> None:
    if body.logprobs or body.top_logprobs:
        raise APIError(400, "logprobs are not supported by localspec serve; leave logprobs out", "logprobs")
    if isinstance(body.keep_alive, str) and body.keep_alive.strip() and not DURATION.match(body.keep_alive.strip()):
        raise APIError(400, f'keep_alive {body.keep_alive!r} is not a duration (e.g. "5m", "1h", -1)', "keep_alive")
    if isinstance(body.think, str) and body.think not in THINK_LEVELS:
        raise APIError(400, f"think {body.think!r}: use true, false or a level ({', '.join(THINK_LEVELS[:3])})",
                       "think")  # fmt: skip
    if isinstance(body.format, str) and body.format not in ("", "json"):
        raise APIError(400, f'format {body.format!r}: use "json", or a JSON schema (an object)', "format")
    refuse_options(body.options)


def refuse_options(options: OllamaOptions | None) -> None:
    if options is None:
        return
    unknown = sorted(options.model_extra or {})
    if unknown:
        raise APIError(400, f"options.{unknown[0]} is not an option Ollama or localspec knows (sampling: "
                       "temperature, top_p, top_k, min_p, seed, num_predict, stop, num_ctx)",
                       f"options.{unknown[0]}")  # fmt: skip
    for name, neutral in NEUTRAL.items():
        value = getattr(options, name)
        if value is not None and value != neutral:
            raise APIError(400, f"options.{name} {value}: not supported by localspec serve (speculative decoding "
                           f"verifies against the model's own distribution); leave it out or set it to {neutral:g}",
                           f"options.{name}")  # fmt: skip
    if options.num_ctx is not None and options.num_ctx < 1:
        raise APIError(400, f"options.num_ctx must be at least 1, got {options.num_ctx}", "options.num_ctx")


def common_fields(body: GenerationFields, served: Served) -> dict[str, Any]:
    """The chat/completion fields for sampling, streaming, the output format and thinking."""
    fields: dict[str, Any] = {"stream": body.streams, **sampling_fields(body.options, served)}
    fmt = body.format
    if fmt == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        fields["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "format", "schema": fmt, "strict": True}}  # fmt: skip
    fields.update(think_fields(body, served))
    return fields


def sampling_fields(options: OllamaOptions | None, served: Served) -> dict[str, Any]:
    if options is None:
        return {}
    out: dict[str, Any] = {name: getattr(options, name) for name in ("temperature", "top_p", "top_k", "min_p")}
    if options.seed is not None and options.seed >= 0:
        out["seed"] = options.seed  # (a negative seed is Ollama's "random": a fresh one, as left out)
    if options.num_predict is not None:  # 0 or negative: until the context is full (bounded by the room left)
        out["max_tokens"] = options.num_predict if options.num_predict > 0 else served.pipeline.target.n_ctx
    if options.stop:
        out["stop"] = list(options.stop)
    return {name: value for name, value in out.items() if value is not None}


def think_fields(body: GenerationFields, served: Served) -> dict[str, Any]:
    think = body.think
    if think is None:
        return {}
    if think and not served.thinks():
        raise APIError(400, f'"{body.model}" does not support thinking (its chat template opens no think block and '
                       "its vocabulary has no </think>); leave think out", "think")  # fmt: skip
    if not served.thinks():
        return {}  # think false on a model that never thinks: nothing to ask
    variables: dict[str, Any] = {"enable_thinking": bool(think)}
    if isinstance(think, str):
        variables["reasoning_effort"] = "high" if think == "max" else think
    return {"chat_template_kwargs": variables, "reasoning_format": "deepseek"}


def bounded(body: GenerationFields, req: GenerationRequest, served: Served) -> OllamaRequest:
    """options.num_ctx applied: a smaller context than serve's bounds the prompt and the answer; a larger one is
    capped at serve's (noted for the log)."""
    num_ctx = body.options.num_ctx if body.options else None
    n_ctx = served.pipeline.target.n_ctx
    if num_ctx is None or num_ctx == n_ctx:
        return OllamaRequest(body.model, req)
    if num_ctx > n_ctx:
        return OllamaRequest(body.model, req, f"options.num_ctx {num_ctx} capped at the loaded context ({n_ctx}, "
                             "serve's --n-ctx)")  # fmt: skip
    if len(req.prompt) >= num_ctx:
        raise APIError(400, f"the prompt is {len(req.prompt)} tokens, and options.num_ctx {num_ctx} leaves no room to "
                       "generate; raise num_ctx (this server's context holds "
                       f"{n_ctx} tokens) or shorten the prompt", "options.num_ctx", "context_length_exceeded")  # fmt: skip
    config = replace(req.config, max_tokens=min(req.config.max_tokens, num_ctx - len(req.prompt)))
    return OllamaRequest(body.model, replace(req, config=config))


# -- validation ---------------------------------------------------------------------------------------------


def openai_body(kind: type[Body], fields: dict[str, Any]) -> Body:
    """The chat or completion body that asks for `fields`; what it cannot take is a 400 (never a 500)."""
    try:
        return kind.model_validate(fields)
    except ValidationError as e:
        raise validation_error(e.errors(), FIELD_NAMES) from None
