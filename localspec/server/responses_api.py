"""OpenAI's Responses API (POST /v1/responses, what Codex CLI and the OpenAI Agents SDK send) over the generation
core: a Responses body becomes a ChatCompletionRequest and goes through requests.chat_request like any chat
request (tools, strict schemas and text.format through the grammar, a thinking model's think block split),
and the core's events become the response's output items, whole or as the stream's events.

Input: a string, or items: messages (roles user, assistant, system, developer; input_text / output_text
parts), function_call and function_call_output items (custom_tool_call, local_shell_call and their outputs the
same), and reasoning items sent back (their text goes to the chat template as that turn's reasoning). Tools:
functions; custom (freeform) tools, offered to the model as a function of one string, `input`, whose call comes
back as a custom_tool_call with that text; local_shell, offered as a function taking the command (an array of
strings), whose call comes back as a local_shell_call with it as the action; namespaces (Codex CLI's), whose
functions the model calls as namespace__name and whose calls come back with their own name and namespace.
`instructions` and the system/developer messages that open the conversation become one system message. Output: a
`reasoning` item where the model thought (its summary is the whole thinking, not a summary of it: nothing here
summarises), a `message` with one output_text part, and a call item per call. `store` (the default, as on OpenAI)
keeps the response in memory (response_store.py) for a follow-up's `previous_response_id`, which reads the stored
conversation before its own input (its instructions are not carried over, as on OpenAI). Everything else a client
may set that localspec cannot do is refused with a 400 naming the field (built-in tools, background, conversations,
stored prompts, logprobs, truncation auto, verbosity other than medium, `include` values other than
reasoning.encrypted_content, `reasoning` on a model that does not think). `reasoning.effort` is not enforced where
the model thinks (it thinks as its template makes it, and max_output_tokens bounds thinking and text together):
accepted and said in `warnings`, by the rule of notes.py.
reasoning.encrypted_content is the thinking text itself (nothing here encrypts it).

    responses_router(core, store) -> APIRouter     POST /v1/responses, GET and DELETE /v1/responses/{id}
    ERRORS                                         OpenAI's error shape, with this API's field names
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from localspec.server.core import Core, Event, Failed, Finished, Run
from localspec.server.errors import APIError, ErrorShape
from localspec.server.notes import not_acted_on, with_warnings
from localspec.server.openai_routes import KEY_HINT, SSE_HEADERS
from localspec.server.reasoning import ReasoningDelta
from localspec.server.requests import GenerationRequest, Served, chat_request
from localspec.server.response_store import STORE_SIZE, ResponseStore, StoredResponse
from localspec.server.responses import timings
from localspec.server.responses_schemas import (
    FIELD_NAMES,
    ContentPart,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    LocalShellCallItem,
    LocalShellCallOutputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    ToolParam,
)
from localspec.server.schemas import ChatCompletionRequest
from localspec.server.tools import ArgumentsDelta, CallEnd, CallStart, ContentDelta, ToolCall

PATH = "/v1/responses"
ERRORS = ErrorShape(PATH, APIError.body, KEY_HINT, FIELD_NAMES, deepest=True)  # (input: a string, or items)
ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SUMMARIES = ("auto", "concise", "detailed")
CALLS = ("function_call", "custom_tool_call", "local_shell_call")
NAMESPACE_JOIN = "__"  # a namespace's function is offered to the model as namespace__name
# A custom tool's text, as the one argument of the function the model is offered in its place.
CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
                     "additionalProperties": False}  # fmt: skip
CUSTOM_NOTE = "Pass the tool's whole input, as plain text, in the argument `input`."
# The local_shell tool, as the function the model is offered in its place; its arguments are the call's action.
LOCAL_SHELL = {"name": "local_shell", "description": "Run a command on the user's machine: the program and its "
               "arguments as an array of strings (e.g. [\"ls\", \"-la\"]).", "parameters": {
                   "type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"},
                                                                "minItems": 1},
                                                    "working_directory": {"type": "string"},
                                                    "timeout_ms": {"type": "integer", "minimum": 1}},
                   "required": ["command"], "additionalProperties": False}}  # fmt: skip
ENCRYPTED = "reasoning.encrypted_content"  # the one `include` value there is something to include for
Keep = Callable[[dict[str, Any], Finished], None]  # stores a finished response (unless store false)

# Fields OpenAI accepts that localspec serve cannot honour, with the values that ask for nothing.
UNHONOURED: dict[str, tuple[tuple[object, ...], str]] = {
    "background": ((None, False), "background responses are not supported (the answer comes back on this request)"),
    "conversation": (
        (None,),
        "conversation objects are not supported (continue a conversation with "
        "previous_response_id, or send it whole in input)",
    ),  # fmt: skip
    "prompt": ((None,), "stored prompt templates are not supported (send instructions and input)"),
    "top_logprobs": ((None, 0), "logprobs are not supported"),
    "truncation": (
        (None, "disabled"),
        "truncation auto is not supported (a conversation longer than the context is "
        "a 400: nothing is dropped from it)",
    ),  # fmt: skip
    "context_management": ((None, []), "context management (compaction) is not supported"),
}


# -- the request: a Responses body -> the chat request ----------------------------------------------------


def read_request(body: ResponsesRequest, store: ResponseStore, served: Served) -> tuple[GenerationRequest, list[Any]]:
    """The generation request `body` asks for, and the conversation it continues (without instructions), which
    a stored response keeps; a 400 for what localspec serve cannot honour."""
    refuse_unhonoured(body)
    context = previous_messages(body, store) + input_messages(body)
    if not context:
        raise APIError(400, "input: give the conversation, as a string or a list of items", "input", "invalid_value")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise APIError(400, f"max_output_tokens must be at least 1, got {body.max_output_tokens}",
                       "max_output_tokens", "invalid_value")  # fmt: skip
    fields = {"model": body.model, "messages": with_instructions(body.instructions, context), **tool_fields(body),
              **generation_fields(body)}  # fmt: skip
    try:
        chat = ChatCompletionRequest.model_validate(fields)
    except ValidationError as e:  # what the chat body cannot take, though this one did (never a 500)
        raise ERRORS.invalid(e.errors()) from None
    req = replace(chat_request(chat, served), path=PATH)
    reasoning_check(body, req, served)
    return replace(req, notes=(*req.notes, *reasoning_notes(body))), context


def reasoning_notes(body: ResponsesRequest) -> tuple[str, ...]:
    """reasoning.effort is a hint (the rule: notes.py): accepted where the model thinks, not acted on, said."""
    effort = body.reasoning.effort if body.reasoning is not None else None
    if effort in (None, "none"):
        return ()
    why = "localspec serve has no effort setting; a model that thinks thinks as its chat template makes it"
    return (not_acted_on(f"reasoning.effort {effort!r}", why),)


def refuse_unhonoured(body: ResponsesRequest) -> None:
    for name, (idle, why) in UNHONOURED.items():
        if getattr(body, name) not in idle:
            raise APIError(400, f"{name}: {why} by localspec serve; leave it out", name, "unsupported_parameter")
    for value in body.include or []:
        if value == "message.output_text.logprobs":
            raise APIError(400, "include message.output_text.logprobs: logprobs are not supported by localspec "
                           "serve", "include", "unsupported_parameter")  # fmt: skip
        if value != ENCRYPTED:
            raise APIError(400, f"include {value!r}: localspec serve has none of OpenAI's built-in tools whose "
                           f"results it could include (it includes {ENCRYPTED})", "include",
                           "unsupported_parameter")  # fmt: skip
    if body.text is not None and body.text.verbosity not in (None, "medium"):
        raise APIError(400, f"text.verbosity {body.text.verbosity!r}: localspec serve cannot make the model more or "
                       "less verbose; leave it out (or medium)", "text.verbosity", "unsupported_parameter")  # fmt: skip


def reasoning_check(body: ResponsesRequest, req: GenerationRequest, served: Served) -> None:
    """`reasoning` asks for thinking: known values, and a 400 where the served model never writes a think block."""
    asked = body.reasoning
    if asked is None:
        return
    if asked.effort is not None and asked.effort not in EFFORTS:
        raise APIError(400, f"reasoning.effort {asked.effort!r} is unknown (one of: {', '.join(EFFORTS)})",
                       "reasoning.effort", "invalid_value")  # fmt: skip
    summary = asked.summary or asked.generate_summary
    if summary is not None and summary not in SUMMARIES:
        raise APIError(400, f"reasoning.summary {summary!r} is unknown (one of: {', '.join(SUMMARIES)})",
                       "reasoning.summary", "invalid_value")  # fmt: skip
    wants = asked.effort not in (None, "none") or summary is not None
    if wants and req.reasoning is None and not served.thinks():
        raise APIError(400, "reasoning: the served model does not think (its chat template opens no think block "
                       "and its vocabulary has no </think>); leave reasoning out", "reasoning",
                       "unsupported_parameter")  # fmt: skip


def previous_messages(body: ResponsesRequest, store: ResponseStore) -> list[Any]:
    if body.previous_response_id is None:
        return []
    stored = store.get(body.previous_response_id)
    if stored is None:
        raise APIError(400, f"previous_response_id {body.previous_response_id!r}: no stored response has this id "
                       f"(localspec serve keeps the last {STORE_SIZE} responses sent with store true, in memory: "
                       "a restart forgets them); send the conversation in input instead", "previous_response_id",
                       "previous_response_not_found")  # fmt: skip
    return list(stored.messages)


def with_instructions(instructions: str | None, context: list[Any]) -> list[Any]:
    """The instructions and the system/developer messages that open the conversation, as one system message."""
    lead = [instructions] if instructions else []
    rest = list(context)
    while rest and rest[0]["role"] in ("system", "developer"):
        lead.append(rest.pop(0)["content"])
    return ([{"role": "system", "content": "\n\n".join(lead)}] if lead else []) + rest


def input_messages(body: ResponsesRequest) -> list[Any]:
    """The input items as chat messages: an assistant turn gathers its reasoning, text and function calls (as
    the output lists them); a function_call_output is a `tool` message."""
    if body.input is None:
        return []
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    turns = Turns()
    for i, item in enumerate(body.input):
        turns.add(f"input[{i}]", item)
    return turns.done()


@dataclass
class Turns:
    out: list[dict[str, Any]] = field(default_factory=list)
    assistant: dict[str, Any] | None = None  # the assistant turn being gathered

    def add(self, where: str, item: Item) -> None:
        if isinstance(item, MessageItem):
            self.message(where, item)
        elif isinstance(item, FunctionCallItem):
            turn = self.turn()
            name = joined(item.namespace, item.name) if item.namespace else item.name
            turn.setdefault("tool_calls", []).append({"id": item.call_id, "type": "function", "function": {
                "name": name, "arguments": call_arguments(where, item.arguments)}})  # fmt: skip
        elif isinstance(item, CustomToolCallItem):
            name = joined(item.namespace, item.name) if item.namespace else item.name
            turn = self.turn()
            turn.setdefault("tool_calls", []).append({"id": item.call_id, "type": "function", "function": {
                "name": name, "arguments": json.dumps({"input": item.input})}})  # fmt: skip
        elif isinstance(item, LocalShellCallItem):
            action = item.action.model_dump(exclude_none=True, exclude={"type"})
            if not action.get("env"):
                action.pop("env", None)
            self.turn().setdefault("tool_calls", []).append({"id": item.call_id, "type": "function", "function": {
                "name": LOCAL_SHELL["name"], "arguments": json.dumps(action)}})  # fmt: skip
        elif isinstance(item, LocalShellCallOutputItem):
            self.flush()
            self.out.append({"role": "tool", "tool_call_id": item.id, "content": item.output})
        elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
            self.flush()
            output = parts_text(f"{where}.output", item.output)
            self.out.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        elif isinstance(item, ReasoningItem):
            self.flush()
            self.assistant = {"role": "assistant", "content": "", "reasoning_content": reasoning_text(item)}
        else:
            raise APIError(400, f"{where}: {item.type} items are not supported by localspec serve (it reads message, "
                           "function_call, function_call_output, custom_tool_call, custom_tool_call_output, "
                           "local_shell_call, local_shell_call_output and reasoning items)", f"{where}.type",
                           "invalid_value")  # fmt: skip

    def message(self, where: str, item: MessageItem) -> None:
        if item.role not in ROLES:
            raise APIError(400, f"{where}.role {item.role!r} is not supported (use {', '.join(ROLES)})",
                           f"{where}.role", "invalid_value")  # fmt: skip
        text = parts_text(f"{where}.content", item.content)
        if item.role != "assistant":
            self.flush()
            self.out.append({"role": item.role, "content": text})
        elif self.assistant is not None and not self.assistant["content"] and "tool_calls" not in self.assistant:
            self.assistant["content"] = text  # the text after this turn's reasoning
        else:
            self.flush()
            self.assistant = {"role": "assistant", "content": text}

    def turn(self) -> dict[str, Any]:
        if self.assistant is None:
            self.assistant = {"role": "assistant", "content": ""}
        return self.assistant

    def flush(self) -> None:
        if self.assistant is not None:
            self.out.append(self.assistant)
            self.assistant = None

    def done(self) -> list[dict[str, Any]]:
        self.flush()
        return self.out


def parts_text(where: str, content: str | list[ContentPart]) -> str:
    if isinstance(content, str):
        return content
    out = []
    for j, part in enumerate(content):
        if part.type == "refusal":
            out.append(part.refusal or "")
        elif part.type in TEXT_PARTS and part.text is not None:
            out.append(part.text)
        else:
            hint = "the served model reads text only" if part.type.startswith("input_") else "send input_text parts"
            raise APIError(400, f"{where}[{j}]: {part.type} parts are not supported by localspec serve ({hint})",
                           f"{where}[{j}].type", "invalid_value")  # fmt: skip
    return "".join(out)


def call_arguments(where: str, arguments: str) -> str:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise APIError(400, f"{where}.arguments must be a JSON object (as text)", f"{where}.arguments",
                       "invalid_value")  # fmt: skip
    return arguments or "{}"


def reasoning_text(item: ReasoningItem) -> str:
    if item.encrypted_content:  # this server's own: the thinking itself
        return item.encrypted_content
    if item.content:
        return "\n\n".join(part.text or "" for part in item.content)
    return "\n\n".join(part.text for part in item.summary)


def tool_fields(body: ResponsesRequest) -> dict[str, Any]:
    """tools and tool_choice as the chat body's; the chat path checks them against each other."""
    out: dict[str, Any] = {}
    if body.tools:
        out["tools"] = [function for i, tool in enumerate(body.tools) for function in function_tools(i, tool)]
    choice = body.tool_choice
    if isinstance(choice, str):
        out["tool_choice"] = choice
    elif choice is not None:
        if choice.type not in ("function", "custom"):
            raise APIError(400, f"tool_choice {choice.type!r}: localspec serve chooses among function and custom "
                           'tools only (use "auto", "required", "none" or {"type": "function", "name": ...})',
                           "tool_choice.type", "invalid_value")  # fmt: skip
        if not choice.name:
            raise APIError(400, f'tool_choice.name: {{"type": "{choice.type}"}} needs the name of the tool to call',
                           "tool_choice.name", "invalid_value")  # fmt: skip
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    if body.parallel_tool_calls is not None:
        out["parallel_tool_calls"] = body.parallel_tool_calls
    return out


def function_tools(i: int, tool: ToolParam) -> list[dict[str, Any]]:
    """A tool as the chat body's function tools: a function is one, a namespace's functions are offered under
    their joined names (namespace__name), and the model's call of one is answered with its own name and
    namespace (namespaces())."""
    if tool.type != "namespace":
        return [function_tool(f"tools[{i}]", tool)]
    if not tool.name or tool.tools is None:
        raise APIError(400, f"tools[{i}]: a namespace tool needs its name and its tools", f"tools[{i}]",
                       "invalid_value")  # fmt: skip
    out = []
    for j, inner in enumerate(tool.tools):
        where = f"tools[{i}].tools[{j}]"
        if inner.type not in ("function", "custom"):
            raise APIError(400, f"{where}.type {inner.type!r}: localspec serve takes function and custom tools "
                           "inside a namespace", f"{where}.type", "unsupported_parameter")  # fmt: skip
        function = function_tool(where, inner)
        function["function"]["name"] = joined(tool.name, function["function"]["name"])
        out.append(function)
    return out


def joined(namespace: str, name: str) -> str:
    return f"{namespace}{NAMESPACE_JOIN}{name}"


@dataclass(frozen=True)
class Offered:
    """A tool the model calls by another name or in another shape than a plain function's: one inside a namespace
    (called by its joined name), or a custom tool (called with its text as the argument `input`)."""

    name: str
    namespace: str | None = None
    custom: bool = False
    shell: bool = False  # the local_shell tool: its call is a local_shell_call with the command as its action


def offered(body: ResponsesRequest) -> dict[str, Offered]:
    """The name the model calls each such tool by -> what the call's item says."""
    out = {}
    for tool in body.tools or []:
        if tool.type == "custom" and tool.name:
            out[tool.name] = Offered(tool.name, custom=True)
        if tool.type == "local_shell":
            out[LOCAL_SHELL["name"]] = Offered(LOCAL_SHELL["name"], shell=True)
        for inner in tool.tools or [] if tool.type == "namespace" and tool.name else []:
            if inner.name:
                out[joined(str(tool.name), inner.name)] = Offered(inner.name, tool.name, inner.type == "custom")
    return out


def custom_tool(where: str, tool: ToolParam) -> dict[str, Any]:
    """A custom (freeform) tool as a function of one string argument, `input`: the text the tool takes."""
    if not tool.name:
        raise APIError(400, f"{where}.name: a custom tool needs its name", f"{where}.name", "invalid_value")
    kind = (tool.format or {}).get("type", "text")
    if kind != "text":
        raise APIError(400, f"{where}.format {kind!r}: localspec serve takes custom tools whose input is free text "
                       "(format text); a grammar-constrained input is not supported (offer the tool as a function)",
                       f"{where}.format", "unsupported_parameter")  # fmt: skip
    about = (tool.description + "\n\n" if tool.description else "") + CUSTOM_NOTE
    return {"type": "function", "function": {"name": tool.name, "description": about,
                                             "parameters": CUSTOM_PARAMETERS}}  # fmt: skip


def function_tool(where: str, tool: ToolParam) -> dict[str, Any]:
    if tool.type == "custom":
        return custom_tool(where, tool)
    if tool.type == "local_shell":
        return {"type": "function", "function": LOCAL_SHELL}
    if tool.type == "web_search":  # Codex offers it unless told not to
        raise APIError(400, f"{where}.type 'web_search': localspec serve cannot search the web (there is no search "
                       "behind it); leave the tool out (Codex CLI: web_search = \"disabled\" in config.toml)",
                       f"{where}.type", "unsupported_parameter")  # fmt: skip
    if tool.type != "function":
        raise APIError(400, f"{where}.type {tool.type!r}: OpenAI's built-in tools (web search, file search, "
                       "computer use, code interpreter, MCP, shell, ...) are not supported by localspec serve; "
                       "define the tool as a function (type function, name, parameters)", f"{where}.type",
                       "unsupported_parameter")  # fmt: skip
    if not tool.name:
        raise APIError(400, f"{where}.name: a function tool needs its name", f"{where}.name", "invalid_value")
    function: dict[str, Any] = {"name": tool.name}
    for key in ("description", "parameters", "strict"):
        if getattr(tool, key) is not None:
            function[key] = getattr(tool, key)
    return {"type": "function", "function": function}


def generation_fields(body: ResponsesRequest) -> dict[str, Any]:
    """Sampling, streaming, localspec's `speculative` and text.format as the chat body's response_format."""
    sampling = {"max_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
                "stream": bool(body.stream)}  # fmt: skip
    out = {name: value for name, value in sampling.items() if value is not None}
    if body.speculative is not None:
        out["speculative"] = body.speculative.model_dump(exclude_none=True)
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return out
    if fmt.type == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise APIError(400, 'text.format json_schema needs its schema (e.g. {"type": "json_schema", "name": '
                           '"answer", "schema": {"type": "object"}})', "text.format.schema",
                           "invalid_value")  # fmt: skip
        schema = {"name": fmt.name or "output", "schema": fmt.schema_, "strict": fmt.strict}
        out["response_format"] = {"type": "json_schema", "json_schema": {k: v for k, v in schema.items()
                                                                         if v is not None}}  # fmt: skip
    else:
        raise APIError(400, f"text.format.type {fmt.type!r} is unknown to localspec serve (one of: text, "
                       "json_object, json_schema)", "text.format.type", "invalid_value")  # fmt: skip
    return out


# -- the answer: the core's events -> output items and the stream's events ----------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def custom_input(arguments: str) -> str:
    """A custom tool's text from the arguments of the function it was offered as: what there is of it where
    max_output_tokens cut it short (closed as a string), else nothing."""
    for end in ("", '"}', "}"):
        try:
            value = json.loads(arguments + end)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("input"), str):
            return value["input"]
    return ""


def shell_action(arguments: str) -> dict[str, Any]:
    """A local_shell call's action from the arguments the model wrote (an empty command where cut short)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = {}
    action: dict[str, Any] = {"type": "exec", "command": value.get("command", []) if isinstance(value, dict) else [],
                              "env": {}}  # fmt: skip
    for key in ("working_directory", "timeout_ms"):
        if isinstance(value, dict) and key in value:
            action[key] = value[key]
    return action


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@dataclass
class Output:
    """The response's output items as the core's events build them, and the stream events that say so: an item
    is added when its first piece comes and done when it ends (a call at its end, the others when the next item
    begins or the answer ends)."""

    encrypted: bool = False  # include reasoning.encrypted_content
    offered: dict[str, Offered] = field(default_factory=dict)  # tools called by another name or shape
    arguments: str = ""  # the open call's arguments so far (a custom tool's item shows its input only at its end)
    items: list[dict[str, Any]] = field(default_factory=list)
    open: dict[str, Any] | None = None
    text: str = ""  # the open item's text (a message's, or a reasoning item's)

    def feed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, ReasoningDelta):
            return [*self.ensure("reasoning"), self.delta("response.reasoning_summary_text.delta", event.text,
                                                          summary_index=0)]  # fmt: skip
        if isinstance(event, ContentDelta):
            return [*self.ensure("message"), self.delta("response.output_text.delta", event.text, content_index=0,
                                                        logprobs=[])]  # fmt: skip
        if isinstance(event, CallStart):
            return [*self.close(), *self.add(self.call_item(event))]
        if isinstance(event, ArgumentsDelta) and event.text and self.open is not None:
            self.arguments += event.text
            if self.open["type"] != "function_call":  # custom and local_shell calls show their input at the end
                return []
            self.open["arguments"] = self.arguments
            return [self.about("response.function_call_arguments.delta", delta=event.text)]
        if isinstance(event, CallEnd) and self.open is not None:
            return self.end_call(event.call)
        return []

    def finish(self, incomplete: bool) -> list[dict[str, Any]]:
        out = self.close(incomplete=incomplete)
        if not any(item["type"] in ("message", *CALLS) for item in self.items):
            out += [*self.ensure("message"), *self.close(incomplete=incomplete)]  # an empty answer: one empty message
        return out

    # -- items --------------------------------------------------------------------------------------------

    def call_item(self, event: CallStart) -> dict[str, Any]:
        tool = self.offered.get(event.name, Offered(event.name))
        if tool.custom:
            item = {"id": "ctc_" + event.id.removeprefix("call_"), "type": "custom_tool_call", "call_id": event.id,
                    "name": tool.name, "input": ""}  # fmt: skip
        elif tool.shell:
            item = {"id": "lsh_" + event.id.removeprefix("call_"), "type": "local_shell_call", "call_id": event.id,
                    "status": "in_progress", "action": {"type": "exec", "command": [], "env": {}}}  # fmt: skip
        else:
            item = {"id": "fc_" + event.id.removeprefix("call_"), "type": "function_call", "status": "in_progress",
                    "call_id": event.id, "name": tool.name, "arguments": ""}  # fmt: skip
        if tool.namespace is not None:
            item["namespace"] = tool.namespace
        return item

    def ensure(self, kind: str) -> list[dict[str, Any]]:
        """The open item is a `kind` one (a message, a reasoning item): the one open, or a new one."""
        if self.open is not None and self.open["type"] == kind:
            return []
        out = self.close()
        if kind == "message":
            out += self.add({"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                             "content": []})  # fmt: skip
            out.append(self.about("response.content_part.added", content_index=0, part=output_text("")))
        else:
            out += self.add({"id": new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": []})
            out.append(self.about("response.reasoning_summary_part.added", summary_index=0,
                                  part={"type": "summary_text", "text": ""}))  # fmt: skip
        return out

    def add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.items.append(item)
        self.open, self.text, self.arguments = item, "", ""
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": dict(item)}]

    def close(self, *, incomplete: bool = False) -> list[dict[str, Any]]:
        item = self.open
        if item is None:
            return []
        status = "incomplete" if incomplete else "completed"
        if item["type"] in CALLS:  # (a call always ends with its CallEnd; this is for safety)
            return self.end_call(ToolCall(item["call_id"], item["name"], self.arguments))  # (the name unused)
        if item["type"] == "message":
            part = output_text(self.text)
            out = [self.about("response.output_text.done", content_index=0, text=self.text, logprobs=[]),
                   self.about("response.content_part.done", content_index=0, part=part)]  # fmt: skip
            item.update(content=[part], status=status)
        else:
            part = {"type": "summary_text", "text": self.text}
            out = [self.about("response.reasoning_summary_text.done", summary_index=0, text=self.text),
                   self.about("response.reasoning_summary_part.done", summary_index=0, part=part)]  # fmt: skip
            item.update(summary=[part], status=status)
            if self.encrypted:
                item["encrypted_content"] = self.text
        return [*out, self.item_done()]

    def end_call(self, call: ToolCall) -> list[dict[str, Any]]:
        assert self.open is not None
        if self.open["type"] == "custom_tool_call":
            text = custom_input(call.arguments)
            self.open["input"] = text
            return [self.about("response.custom_tool_call_input.delta", delta=text),
                    self.about("response.custom_tool_call_input.done", input=text), self.item_done()]  # fmt: skip
        status = "completed" if is_json_object(call.arguments) else "incomplete"  # cut short by max_output_tokens
        if self.open["type"] == "local_shell_call":
            self.open.update(action=shell_action(call.arguments), status=status)
            return [self.item_done()]
        self.open.update(arguments=call.arguments, status=status)
        return [self.about("response.function_call_arguments.done", arguments=call.arguments), self.item_done()]

    def item_done(self) -> dict[str, Any]:
        done = {"type": "response.output_item.done", "output_index": len(self.items) - 1, "item": dict(self.open or {})}
        self.open, self.text, self.arguments = None, "", ""
        return done

    def delta(self, kind: str, text: str, **fields: Any) -> dict[str, Any]:
        self.text += text
        return self.about(kind, delta=text, **fields)

    def about(self, kind: str, **fields: Any) -> dict[str, Any]:
        """An event about the open item."""
        assert self.open is not None
        return {"type": kind, "item_id": self.open["id"], "output_index": len(self.items) - 1, **fields}


@dataclass
class Head:
    """What every body of one response repeats: its id, when it was made, and what the request asked for."""

    body: ResponsesRequest
    model: str
    served: Served
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, status: str, output: list[dict[str, Any]], done: Finished | None = None,
                 error: APIError | None = None) -> dict[str, Any]:  # fmt: skip
        body, defaults = self.body, self.served.defaults
        out = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "error": None, "incomplete_details": None, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "max_tool_calls": body.max_tool_calls, "model": self.model,
            "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "reasoning": self.reasoning(),
            "store": body.store is not False,
            "temperature": body.temperature if body.temperature is not None else defaults.temperature,
            "top_p": body.top_p if body.top_p is not None else defaults.top_p, "text": self.text(),
            "tool_choice": self.tool_choice(), "tools": self.tools(), "truncation": "disabled", "usage": None,
            "user": body.user, "safety_identifier": body.safety_identifier, "prompt_cache_key": body.prompt_cache_key,
            "metadata": body.metadata or {},
        }  # fmt: skip
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        if error is not None:  # ResponseError's codes: the request's fault, or the server's
            out["error"] = {
                "code": "invalid_prompt" if error.status < 500 else "server_error",
                "message": error.message,
            }
        if done is not None:
            out["completed_at"] = int(time.time())
            out["usage"] = usage(done, self.served)
            out["timings"] = timings(done.stats)  # localspec's speculative statistics, as on the other routes
            with_warnings(out, done.warnings)  # what was accepted and not done (notes.py), as on the other routes
        return out

    def reasoning(self) -> dict[str, Any]:
        asked = self.body.reasoning
        if asked is None:
            return {"effort": None, "summary": None}
        return {"effort": asked.effort, "summary": asked.summary or asked.generate_summary}

    def text(self) -> dict[str, Any]:
        fmt = self.body.text.format if self.body.text is not None else None
        if fmt is None or fmt.type != "json_schema":
            return {"format": {"type": fmt.type if fmt is not None else "text"}}
        echo = {"type": "json_schema", "name": fmt.name or "output", "schema": fmt.schema_, "strict": fmt.strict,
                "description": fmt.description}  # fmt: skip
        return {"format": {k: v for k, v in echo.items() if v is not None}}

    def tool_choice(self) -> str | dict[str, Any]:
        choice = self.body.tool_choice
        if choice is None:
            return "auto"
        return choice if isinstance(choice, str) else {"type": choice.type, "name": choice.name}

    def tools(self) -> list[dict[str, Any]]:
        return [echo_tool(t) for t in self.body.tools or []]


def echo_tool(tool: ToolParam) -> dict[str, Any]:
    if tool.type == "namespace":
        return {"type": "namespace", "name": tool.name, "description": tool.description or "",
                "tools": [echo_tool(t) for t in tool.tools or []]}  # fmt: skip
    if tool.type == "custom":
        return {"type": "custom", "name": tool.name, "description": tool.description,
                "format": tool.format or {"type": "text"}}  # fmt: skip
    if tool.type == "local_shell":
        return {"type": "local_shell"}
    return {"type": "function", "name": tool.name, "description": tool.description, "parameters": tool.parameters,
            "strict": tool.strict}  # fmt: skip


def usage(done: Finished, served: Served) -> dict[str, Any]:
    """Token counts as the Responses API reports them; the reasoning's by tokenizing the thinking's text."""
    s = done.stats
    thought = len(served.pipeline.target.tokenize(done.reasoning, add_special=False)) if done.reasoning else 0
    return {"input_tokens": s.n_prompt,
            "input_tokens_details": {"cached_tokens": s.n_prompt_cached,
                                     "cache_write_tokens": s.n_prompt - s.n_prompt_cached},
            "output_tokens": s.n_generated, "output_tokens_details": {"reasoning_tokens": min(thought, s.n_generated)},
            "total_tokens": s.n_prompt + s.n_generated}  # fmt: skip


def final_status(done: Finished) -> str:
    return "incomplete" if done.finish_reason == "length" else "completed"


def answer_message(done: Finished) -> dict[str, Any]:
    """The answer as the stored conversation's assistant turn (calls cut short, not JSON, left out)."""
    message: dict[str, Any] = {"role": "assistant", "content": done.text}
    calls = [c for c in done.calls if is_json_object(c.arguments)]
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                                  "arguments": c.arguments}} for c in calls]  # fmt: skip
    if done.reasoning:
        message["reasoning_content"] = done.reasoning
    return message


@dataclass
class SSE:
    """The stream's events, numbered in order (`sequence_number`)."""

    n: int = 0

    def __call__(self, data: dict[str, Any]) -> bytes:
        data = {**data, "sequence_number": self.n}
        self.n += 1
        return f"event: {data['type']}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


# -- the routes ------------------------------------------------------------------------------------------


def responses_router(core: Core, store: ResponseStore) -> APIRouter:
    router = APIRouter()

    def keep(head: Head, body: dict[str, Any], context: list[Any], done: Finished) -> None:
        if head.body.store is not False:
            store.put(head.id, StoredResponse(body, (*context, answer_message(done))))

    @router.post(PATH)
    async def create(body: ResponsesRequest, request: Request) -> Response:
        req, context = await run_in_threadpool(read_request, body, store, core.served)
        run = core.start(request, req)
        head = Head(body, core.model_name, core.served)
        output = Output(encrypted=ENCRYPTED in (body.include or []), offered=offered(body))
        if req.stream:
            return StreamingResponse(stream(run, head, output, lambda b, d: keep(head, b, context, d)),
                                     media_type="text/event-stream", headers=SSE_HEADERS)  # fmt: skip
        try:
            async for event in run.events():
                if isinstance(event, Failed):
                    raise event.error
                if isinstance(event, Finished):
                    output.finish(final_status(event) == "incomplete")
                    answer = head.response(final_status(event), output.items, event)
                    keep(head, answer, context, event)
                    return JSONResponse(answer)
                output.feed(event)
        finally:
            run.close()
        raise AssertionError("a job ended without an outcome")

    @router.get(PATH + "/{response_id}")
    async def retrieve(response_id: str) -> dict[str, Any]:
        stored = store.get(response_id)
        if stored is None:
            raise APIError(404, f"no stored response has the id {response_id!r}", "response_id", "not_found")
        return stored.body

    @router.delete(PATH + "/{response_id}")
    async def delete(response_id: str) -> dict[str, Any]:
        if not store.delete(response_id):
            raise APIError(404, f"no stored response has the id {response_id!r}", "response_id", "not_found")
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    return router


async def stream(run: Run, head: Head, output: Output, keep: Keep) -> AsyncIterator[bytes]:
    sse = SSE()
    try:
        start = head.response("in_progress", [])
        yield sse({"type": "response.created", "response": start})
        yield sse({"type": "response.in_progress", "response": start})
        async for event in run.events():
            if isinstance(event, Failed):
                e = event.error
                yield sse({"type": "error", "code": e.code, "message": e.message, "param": e.param})
                yield sse({"type": "response.failed", "response": head.response("failed", output.items, error=e)})
                return
            if isinstance(event, Finished):
                status = final_status(event)
                for data in output.finish(status == "incomplete"):
                    yield sse(data)
                answer = head.response(status, output.items, event)
                keep(answer, event)
                yield sse({"type": f"response.{status}", "response": answer})
                return
            for data in output.feed(event):
                yield sse(data)
    finally:
        run.close()  # the client went away mid-stream: stop now (a no-op once finished)
