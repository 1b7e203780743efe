"""A chat request's tools, read and checked: the tool definitions and tool_choice (strictly, as OpenAI
does), the assistant turns' tool_calls and the tool turns, how the prompt is rendered (the model's own
template with `tools`, or its family's tool format) and what the answer is read for (tools.ToolPlan).

tool_choice "none" renders no tools and reads no calls: the model is not told it could call, so no call
syntax can end up in the answer's text, and a conversation with earlier calls still renders them.
"auto" offers the tools and reads calls from free output, held to the offered functions and their schemas
once a call opens where the format allows it (tools.lazy_call_grammar: a call marker that is one token); "required" and a named function also put a
grammar into the generation config, so the answer is a call (one or more) with arguments valid against
the function's schema. parallel_tool_calls false allows one call: the reading stops after it.
A schema keyword the grammar cannot enforce is left out of it and checked after generation (function_spec).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from localspec.backends.base import ChatMessage, ChatToolCall
from localspec.backends.chat_template import ChatFormat
from localspec.decoding import schema_fit
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.grammar import GrammarSpec
from localspec.server.errors import APIError
from localspec.server.schemas import ChatCompletionRequest, Message, NamedToolChoice
from localspec.server.tools import (
    MISTRAL,
    FunctionSpec,
    ToolFormat,
    ToolPlan,
    ToolTemplate,
    call_grammar,
    lazy_call_grammar,
    mistral_id,
)

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


@dataclass(frozen=True)
class ToolUse:
    """What a request's tools change: the chat format and tool list to render with (None: as without
    tools), the plan for reading the answer (None: plain text) and the grammar that forces a call."""

    chat_format: ChatFormat | None = None
    definitions: list[dict[str, Any]] | None = None
    plan: ToolPlan | None = None
    grammar_text: str = ""
    fmt: ToolFormat | None = None  # the call format the conversation's earlier calls are written in

    def messages(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """The conversation as the call format wants it (Mistral's templates take only 9-character call ids)."""
        if self.fmt is not MISTRAL:
            return messages
        out = []
        for m in messages:
            calls = tuple(replace(c, id=mistral_id(c.id)) for c in m.tool_calls)
            out.append(replace(m, tool_call_id=mistral_id(m.tool_call_id) if m.tool_call_id else "", tool_calls=calls))
        return out


def message_tool_fields(i: int, m: Message, names: dict[str, str]) -> dict[str, Any]:
    """The ChatMessage fields of an assistant turn's tool_calls or a tool turn (`names`: call id -> function,
    filled from earlier turns)."""
    if m.tool_calls and m.role != "assistant":
        raise APIError(400, f"messages[{i}] has tool_calls, which only an assistant message may have",
                       f"messages[{i}].tool_calls", "invalid_value")  # fmt: skip
    if m.role == "tool":
        if not m.tool_call_id:
            raise APIError(400, f"messages[{i}] (role tool) needs the tool_call_id of the call it answers",
                           f"messages[{i}].tool_call_id", "invalid_value")  # fmt: skip
        return {"tool_call_id": m.tool_call_id, "name": m.name or names.get(m.tool_call_id, "")}
    if not m.tool_calls:
        return {}
    calls = []
    for j, c in enumerate(m.tool_calls):
        try:
            args = json.loads(c.function.arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise APIError(400, f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON object (as text)",
                           f"messages[{i}].tool_calls[{j}].function.arguments", "invalid_value")  # fmt: skip
        names[c.id] = c.function.name
        calls.append(ChatToolCall(c.id, c.function.name, args))
    return {"tool_calls": tuple(calls)}


def read_tools(body: ChatCompletionRequest, support: ToolTemplate | str) -> ToolUse:
    """The request's tools checked against each other and against what the served model can do."""
    functions = check_definitions(body)
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if functions else "none")
    if choice != "none" and choice != "auto" and not functions:
        raise APIError(400, "tool_choice requires tools: give the functions it may call in `tools`", "tool_choice",
                       "invalid_value")  # fmt: skip
    if isinstance(choice, NamedToolChoice) and choice.function.name not in {f.name for f in functions}:
        raise APIError(400, f"tool_choice names the function {choice.function.name!r}, which is not among the tools "
                       f"offered ({', '.join(f.name for f in functions)})", "tool_choice", "invalid_value")  # fmt: skip
    active = bool(functions) and choice != "none"
    history = any(m.role == "tool" or m.tool_calls for m in body.messages)
    if not active and not history:
        return ToolUse()
    if isinstance(support, str):
        raise APIError(400, f"this model's chat template does not support tools: {support}; use a model whose "
                       "template renders tools (Qwen2.5, Qwen3, Llama 3.1+, Mistral), or leave tools out",
                       "tools" if active else "messages", "unsupported_parameter")  # fmt: skip
    if not active:
        return ToolUse(support.chat_format, fmt=support.fmt)
    definitions = [t.model_dump(exclude_none=True) for t in body.tools or []]
    max_calls = 1 if body.parallel_tool_calls is False else None
    plan = ToolPlan(support.fmt, max_calls, frozenset(f.name for f in functions), tuple(functions))
    if choice == "auto":
        lazy = lazy_call_grammar(support, functions, parallel=max_calls is None)
        return ToolUse(support.chat_format, definitions, plan, lazy or "", fmt=support.fmt)
    only = [f for f in functions if isinstance(choice, NamedToolChoice) and f.name == choice.function.name]
    grammar = call_grammar(support, only or functions, parallel=max_calls is None and not only)
    return ToolUse(support.chat_format, definitions, plan, grammar, support.fmt)


def check_definitions(body: ChatCompletionRequest) -> list[FunctionSpec]:
    out: list[FunctionSpec] = []
    for i, tool in enumerate(body.tools or []):
        fn = tool.function
        where = f"tools[{i}].function"
        if not NAME.match(fn.name):
            raise APIError(400, f"{where}.name {fn.name!r} must be 1 to 64 letters, digits, underscores or dashes",
                           f"{where}.name", "invalid_value")  # fmt: skip
        if any(f.name == fn.name for f in out):
            raise APIError(400, f"{where}.name {fn.name!r} is offered twice", f"{where}.name", "invalid_value")
        schema = fn.parameters if fn.parameters is not None else {"type": "object", "properties": {}}
        if schema.get("type", "object") != "object":
            raise APIError(400, f"{where}.parameters must be a JSON schema of an object (\"type\": \"object\")",
                           f"{where}.parameters", "invalid_value")  # fmt: skip
        out.append(function_spec(where, fn.name, schema, strict=bool(fn.strict)))
    return out


def function_spec(where: str, name: str, schema: dict[str, Any], *, strict: bool) -> FunctionSpec:
    """A function as the grammar takes it (schema_fit.fit: keywords that constrain nothing dropped). A keyword
    that constrains and that the grammar cannot enforce (uniqueItems, propertyNames with a pattern, ...) is left
    out of the grammar (llguidance's lenient mode) and the calls are checked against the whole schema after
    generation, with the result in the response's `warnings`; with `strict` (arguments that always match) it is
    a 400 naming the keyword. A schema that cannot compile at all is refused when its grammar is made."""
    fit = schema_fit.fit(schema)
    if fit.error:
        return FunctionSpec(name, schema)
    if fit.unenforced and strict:
        keywords = ", ".join(fit.unenforced)
        raise APIError(400, f"{where}.parameters: the tool {name!r} is strict, and the grammar cannot enforce its "
                       f"schema's {keywords}; leave strict out (its calls are then checked after generation, the "
                       "result in the response's `warnings`), or drop the keyword", f"{where}.parameters",
                       "unsupported_parameter")  # fmt: skip
    return FunctionSpec(name, fit.schema, fit.unenforced, schema)


def with_tools(config: GenerationConfig, use: ToolUse) -> GenerationConfig:
    """The generation config with the call grammar in it: a forced call, or auto's lazily constrained calls."""
    if not use.grammar_text:
        return config
    return replace(config, grammar=GrammarSpec("lark", use.grammar_text))
