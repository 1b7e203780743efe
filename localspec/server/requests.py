"""From a request body to what the engine runs: prompt tokens, a GenerationConfig, the draft method
and the stop strings. A request is serve's GenerationSettings with the fields it sets replaced, checked
by GenerationSettings.config, so the server refuses what `run` refuses, with the same words (as a 400).
A draft method is checked against what the loaded models can draft with before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from localspec.backends.base import ChatMessage, chat_prompt_tokens
from localspec.decoding import grammar, schema_fit
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.grammar import GrammarSpec
from localspec.errors import LocalspecError
from localspec.families import registry
from localspec.fim import FimTokens
from localspec.options import GenerationSettings
from localspec.pipeline import Pipeline
from localspec.server.completion_prompt import completion_prompt
from localspec.server.errors import APIError, from_localspec
from localspec.server.notes import not_acted_on
from localspec.server.reasoning import CLOSE, DEFAULT_FORMAT, FORMATS, ReasoningPlan, opened_in_prompt, template_thinks
from localspec.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Endpoint,
    SamplingFields,
    Speculative,
)
from localspec.server.tool_requests import message_tool_fields, read_tools, with_tools
from localspec.server.tools import ToolPlan, ToolTemplate, tool_template

HEAD_IN_PARALLEL = (
    "a head reads the target's hidden states, which the sequences of --parallel do not capture "
    "(start the server with --parallel 1)"
)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


@dataclass(frozen=True)
class Served:
    """What every request is read against: the loaded models, serve's flags (the defaults of the fields a
    request leaves out) and the model ids it answers to (the served id first)."""

    pipeline: Pipeline
    defaults: GenerationSettings
    model_ids: tuple[str, ...]
    _unfit: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    _tools: list[ToolTemplate | str] = field(default_factory=list, compare=False, repr=False)
    _fim: list[FimTokens | None] = field(default_factory=list, compare=False, repr=False)
    reasoning_format: str = DEFAULT_FORMAT  # serve --reasoning-format: for requests that send none
    _thinks: list[bool] = field(default_factory=list, compare=False, repr=False)
    parallel: bool = False  # serve --parallel N > 1: requests decode together in the target's parallel sequences

    def tool_template(self) -> ToolTemplate | str:
        """How the served model takes tools, or why it cannot; found once."""
        if not self._tools:
            self._tools.append(tool_template(self.pipeline.target, self.pipeline.chat_format))
        return self._tools[0]

    def fim_tokens(self) -> FimTokens | None:
        """The served model's fill-in-the-middle tokens (None: it has none, or its backend cannot say); found once."""
        if not self._fim:
            find = getattr(self.pipeline.target, "fim_tokens", None)  # an optional backend method, as token_table
            self._fim.append(find() if find is not None else None)
        return self._fim[0]

    def thinks(self) -> bool:
        """The served model may write think blocks: its chat template writes them, or `</think>` is one token of
        its vocabulary (Qwen3, DeepSeek-R1). Other models' answers are never split. Found once."""
        if not self._thinks:
            fmt, target = self.pipeline.chat_format, self.pipeline.target
            template = (target.chat_template() if fmt is None or fmt.source == "model" else fmt.template) or ""
            one_token = len(target.tokenize(CLOSE, add_special=False, parse_special=True)) == 1
            self._thinks.append(template_thinks(template) or one_token)
        return self._thinks[0]

    def opened(self, prompt: list[int]) -> str:
        """The think block's opening the rendered prompt ends with ("<think>\n"), else ""."""
        detok = self.pipeline.target.detokenizer()
        return opened_in_prompt(detok.add(prompt[-8:]) + detok.flush())

    def method_unfit(self, method: str) -> str:
        """Why a request may not draft with `method` here ("" when it may); found once per method."""
        if method not in self._unfit:
            self._unfit[method] = method_unfit(self.pipeline, method, parallel=self.parallel)
        return self._unfit[method]


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: Endpoint
    prompt: list[int]
    config: GenerationConfig
    method: str
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    tools: ToolPlan | None = None  # the answer is read for tool calls
    path: str = ""  # the route asked, for the log line, when it is not the endpoint's own (/v1/messages)
    echo: str = ""  # /v1/completions' echo: the prompt's text, sent before the answer
    reasoning: ReasoningPlan | None = None  # a chat answer's think block is split from it (reasoning.py)
    notes: tuple[str, ...] = ()  # fields accepted and not acted on, for the response's `warnings` (notes.py)


def check_model(body: SamplingFields, served: Served) -> None:
    if body.model:
        check_model_id(body.model, served)


def check_model_id(model_id: str, served: Served) -> None:
    """A 404 for an id the server does not serve (under its name or an alias)."""
    if model_id not in served.model_ids:
        raise APIError(404, f"The model `{model_id}` does not exist; this server serves "
                       f"{' or '.join(f'`{m}`' for m in served.model_ids)}.", "model", "model_not_found")  # fmt: skip


def chat_request(body: ChatCompletionRequest, served: Served) -> GenerationRequest:
    check_model(body, served)
    refuse_unhonoured(body)
    if body.top_logprobs:
        raise APIError(400, "logprobs are not supported by localspec serve", "top_logprobs", "unsupported_parameter")
    messages = chat_messages(body, served.defaults.system)
    asks_tools = body.tools or body.tool_choice is not None or has_tool_turns(body)
    tools = read_tools(body, served.tool_template()) if asks_tools else None
    variables = body.chat_template_kwargs or None
    try:
        if tools is None or tools.chat_format is None:
            tokens = (chat_prompt_tokens(served.pipeline.target, messages, served.pipeline.chat_format, None, variables)
                      if variables else served.pipeline.prompt_tokens(messages))  # fmt: skip
        else:
            tokens = chat_prompt_tokens(served.pipeline.target, tools.messages(messages), tools.chat_format,
                                        tools.definitions, variables)  # fmt: skip
    except LocalspecError as e:
        raise from_localspec(e, param="chat_template_kwargs" if variables else "messages") from None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    req = _request("chat", body, tokens, max_tokens, param, served)
    forced = bool(body.tools) and body.tool_choice not in (None, "auto", "none")
    req = replace(req, reasoning=reasoning_plan(body, tokens, served, free=req.config.grammar is None and not forced),
                  notes=chat_notes(body))  # fmt: skip
    if tools is None:
        return req
    if req.config.grammar is not None and (body.tools and body.tool_choice != "none"):
        raise APIError(400, "response_format json_object / json_schema cannot be combined with tools yet (a tool "
                       "call would not fit the format); send one or the other, or tool_choice none",
                       "response_format", "unsupported_parameter")  # fmt: skip
    config = with_tools(req.config, tools)
    if config.grammar is not None and config.grammar != req.config.grammar:
        compiled(config.grammar, served, "tools")  # a tool's parameters schema llguidance cannot compile: a 400
    return replace(req, config=config, tools=tools.plan)


def chat_notes(body: ChatCompletionRequest) -> tuple[str, ...]:
    """The hints this request gives that nothing here acts on (the rule: notes.py)."""
    if body.reasoning_effort is None:
        return ()
    why = "localspec serve has no effort setting; a model that thinks thinks as its chat template makes it"
    return (not_acted_on(f"reasoning_effort {body.reasoning_effort!r}", why),)


def reasoning_plan(
    body: ChatCompletionRequest, tokens: list[int], served: Served, *, free: bool
) -> ReasoningPlan | None:
    """How the answer's think block is returned (None: the model does not think, or it stays inline as it is).
    A grammar that shapes the answer from its first token (response_format, a forced call) leaves the model no
    room to think: its answer is all content, even after a prompt that opened the block."""
    fmt = body.reasoning_format if body.reasoning_format is not None else served.reasoning_format
    if fmt not in FORMATS:
        raise APIError(400, f"reasoning_format {fmt!r} is unknown to localspec serve (one of: {', '.join(FORMATS)})",
                       "reasoning_format", "invalid_value")  # fmt: skip
    opened = served.opened(tokens) if free else ""
    if not (opened or served.thinks()) or (fmt == "none" and not opened):
        return None
    return ReasoningPlan(fmt, opened)


def has_tool_turns(body: ChatCompletionRequest) -> bool:
    return any(m.role == "tool" or m.tool_calls for m in body.messages)


def completion_request(body: CompletionRequest, served: Served) -> GenerationRequest:
    check_model(body, served)
    refuse_unhonoured(body)
    prompt = completion_prompt(body, served.pipeline, served.fim_tokens)  # with a suffix: fill-in-the-middle
    req = _request("completion", body, prompt.tokens, body.max_tokens, "max_tokens", served)
    return replace(req, echo=prompt.echo)


# Fields OpenAI accepts that localspec serve cannot honour yet, with the value that asks for nothing and
# what a client would get if the field were dropped silently (an agent that sends tools must never get
# an invented prose answer instead of a call).
UNHONOURED: dict[str, tuple[tuple[object, ...], str]] = {
    "functions": ((None, []), "the legacy functions field is not supported (send `tools` instead)"),
    "function_call": ((None, "none"), "the legacy function_call field is not supported (send `tool_choice` instead)"),
    "logit_bias": ((None, {}), "logit_bias is not supported: the exact rule would need the biased distribution"),
    "frequency_penalty": ((None, 0, 0.0), "repetition penalties are not supported"),
    "presence_penalty": ((None, 0, 0.0), "repetition penalties are not supported"),
    "best_of": ((None, 1), "best_of is not supported: one completion per request"),
}
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def refuse_unhonoured(body: SamplingFields) -> None:
    """A 400 for every field set to something localspec serve would otherwise ignore."""
    for name, (idle, why) in UNHONOURED.items():
        value = getattr(body, name, None)
        if value not in idle:
            raise APIError(400, f"{name}: {why} by localspec serve; leave it out", name, "unsupported_parameter")
    fmt = body.response_format
    if fmt is not None and fmt.type not in RESPONSE_FORMATS:
        raise APIError(400, f"response_format.type {fmt.type!r} is unknown to localspec serve (one of: "
                       f"{', '.join(RESPONSE_FORMATS)})", "response_format.type", "invalid_value")  # fmt: skip


def response_grammar(body: SamplingFields, served: Served) -> GrammarSpec | None:
    """The grammar that enforces response_format (json_object, or json_schema strict or not), compiled for
    the served model now so that a schema llguidance cannot compile is a 400 with its reason."""
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        spec = grammar.json_object()
    elif fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError(400, 'response_format json_schema needs json_schema.schema (e.g. {"type": "json_schema", '
                       '"json_schema": {"name": "answer", "schema": {"type": "object"}}})',
                       "response_format.json_schema", "invalid_value")  # fmt: skip
    else:
        spec = grammar.json_schema(answer_schema(fmt.json_schema.schema_))
    param = "response_format" if fmt.type == "json_object" else "response_format.json_schema.schema"
    return compiled(spec, served, param)


def answer_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The answer's schema as the grammar takes it (schema_fit: keywords that constrain nothing dropped); a
    keyword that constrains and that the grammar cannot enforce is a 400: the answer is to match the schema."""
    fit = schema_fit.fit(schema)
    if fit.error:
        return schema  # compiled() refuses it with llguidance's reason
    if fit.unenforced:
        raise APIError(400, f"response_format.json_schema.schema: the grammar cannot enforce the schema's "
                       f"{', '.join(fit.unenforced)}, and the answer is to match the schema; drop the keyword",
                       "response_format.json_schema.schema", "unsupported_parameter")  # fmt: skip
    return fit.schema


def compiled(spec: GrammarSpec, served: Served, param: str) -> GrammarSpec:
    """`spec`, compiled for the served model now (cached), or a 400 with llguidance's reason."""
    try:
        grammar.check(spec)
        grammar.prepare(served.pipeline.target, spec)
    except LocalspecError as e:
        raise APIError(400, e.message + (f" ({e.hint})" if e.hint else ""), param, "invalid_value") from None
    return spec


def chat_messages(body: ChatCompletionRequest, system: str | None) -> list[ChatMessage]:
    if not body.messages:
        raise APIError(400, "messages must be a non-empty list", "messages", "invalid_value")
    out: list[ChatMessage] = []
    call_names: dict[str, str] = {}  # tool call id -> function, for the tool turns that answer them
    for i, m in enumerate(body.messages):
        role = ROLES.get(m.role)
        if role is None:
            raise APIError(400, f"messages[{i}].role {m.role!r} is not supported (use system, user, assistant or "
                           "tool)", f"messages[{i}].role", "invalid_value")  # fmt: skip
        if m.non_text_parts():
            raise APIError(400, f"messages[{i}] has {', '.join(m.non_text_parts())} content; only text is supported",
                           f"messages[{i}].content", "invalid_value")  # fmt: skip
        thought = {"reasoning_content": m.reasoning_content} if m.reasoning_content and role == "assistant" else {}
        out.append(ChatMessage(role, m.text(), **message_tool_fields(i, m, call_names), **thought))
    if system and not any(m.role == "system" for m in out):
        out.insert(0, ChatMessage("system", system))
    return out


def _request(
    endpoint: Endpoint,
    body: SamplingFields,
    tokens: list[int],
    max_tokens: int | None,
    max_param: str,
    served: Served,
) -> GenerationRequest:
    if body.n not in (None, 1):
        raise APIError(400, f"n={body.n}: localspec serve returns one choice per request (n=1)", "n", "invalid_value")
    if body.logprobs:
        raise APIError(400, "logprobs are not supported by localspec serve", "logprobs", "unsupported_parameter")
    n_ctx = served.pipeline.target.n_ctx
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
    settings = replace(served.defaults, **request_fields(body, max_tokens, served.defaults))
    check_method(settings.method, served)
    try:
        config = settings.config(room=n_ctx - len(tokens))
    except LocalspecError as e:
        raise from_localspec(e) from None
    spec = response_grammar(body, served)
    if spec is not None:
        config = replace(config, grammar=spec)
    stream = bool(body.stream)
    include_usage = bool(stream and body.stream_options and body.stream_options.include_usage)
    stops = tuple(body.stop_strings())
    return GenerationRequest(endpoint, tokens, config, settings.method, stops, stream, include_usage)


def request_fields(body: SamplingFields, max_tokens: int | None, defaults: GenerationSettings) -> dict[str, Any]:
    """The GenerationSettings fields this request sets (the rest stay serve's)."""
    spec = body.speculative or Speculative()
    sampling = {"temperature": body.temperature, "top_k": body.top_k, "top_p": body.top_p, "min_p": body.min_p,
                "seed": body.seed, "max_tokens": max_tokens}  # fmt: skip
    fields = {name: value for name, value in sampling.items() if value is not None}
    if spec.method:
        fields["method"] = spec.method
    if spec.k is not None:
        fields["k"] = spec.k
    elif spec.method and spec.method != defaults.method:
        fields["k"] = None  # serve's -k is for its own method; another one drafts its own default length
    if spec.rule:
        fields["rule"] = spec.rule
    return fields


def check_method(method: str, served: Served) -> None:
    """A 400 saying why, for a method unknown or one the loaded models cannot draft with (never a 500)."""
    if method not in registry.names():
        raise APIError(400, f"unknown speculative.method {method!r} (choose one of: {', '.join(registry.names())})",
                       "speculative.method", "invalid_value")  # fmt: skip
    why = served.method_unfit(method)
    if why:
        raise APIError(400, f"speculative.method {method} cannot draft on this server: {why}", "speculative.method",
                       "invalid_value")  # fmt: skip


def method_unfit(pipeline: Pipeline, method: str, *, parallel: bool = False) -> str:
    """Why `pipeline` cannot build a drafter of `method` (Pipeline.new_drafter), "" when it can: from the
    family's table entry and the files' headers only, nothing loaded. `parallel`: the server decodes several
    requests together."""
    opts = pipeline.options
    if parallel and registry.family(method).is_head:
        return HEAD_IN_PARALLEL
    if method == opts.draft_method:
        return ""  # its drafter was built with the models
    fam = registry.family(method)
    if fam.needs == "draft_model" and not pipeline.has_draft_model:
        return "it needs a draft model, and none is loaded (start the server with --draft PATH)"
    if fam.needs == "draft_model":
        return ""  # the draft model loaded is the one it drafts with (its vocabulary was checked at load)
    why = registry.fit(method, opts.target, opts.draft, pipeline.backend)
    if not why and fam.target_load and method != loaded_head(pipeline):
        why = (f"the target was loaded without what {method} drafts with "
               f"(start the server with --draft-method {method})")  # fmt: skip
    return why


def loaded_head(pipeline: Pipeline) -> str | None:
    """The head family the target was loaded for (its target_load options applied), as load_pipeline
    decides it: the method's own head, or auto's unless auto was told its head cannot pay here."""
    opts = pipeline.options
    if opts.family.is_head:
        return opts.draft_method
    return None if pipeline.draft_note else opts.auto_head
