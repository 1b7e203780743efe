"""Anthropic's Messages API over the chat path: /v1/messages (plain and streamed) and
/v1/messages/count_tokens, for clients that speak only this API (agents pointed at a local base URL, the
`anthropic` SDK).

A Messages request becomes a ChatCompletionRequest and goes through requests.chat_request and the
generation core (core.py) like any chat request, so it is checked, rendered and generated exactly as
/v1/chat/completions would; this module only translates the request in and the core's events out, and gives
errors Anthropic's shape on every /v1/messages* path (ERRORS). Tools map onto OpenAI's (tool_use ->
tool_calls, tool_result -> `tool` messages, tool_choice any -> "required"), read out of the answer by the core;
output_config.format is response_format json_schema (strict). A reasoning model's think block
(reasoning.py) comes back as a `thinking` content block before the text, streamed with thinking_delta
events; its `signature` is an empty string (nothing here signs thinking, and nothing checks it when it is
sent back: earlier turns' thinking blocks are left out of the prompt, as Anthropic leaves them out of the
context). `thinking`, `output_config.effort` and `context_management` follow notes.py's rule: what the served
model cannot follow (thinking enabled on a model that does not think, a budget, an effort, server-side context
edits) is accepted and named in the answer's `warnings`. `role: "system"` entries inside `messages` are folded
into the system text, and Claude Code's billing line is dropped from it (system_parts). Content other than
text, tool_use and tool_result (images, documents) is refused with a 400.

    messages_router(core) -> APIRouter          the two routes, mounted by app.create_app
    ERRORS                                       its error shape: {"type": "error", "error": {"type", "message"}}
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from localspec.server.anthropic_schemas import (
    FIELD_NAMES,
    Block,
    Conversation,
    MessageParam,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolParam,
    ToolResultBlock,
    ToolUseBlock,
)
from localspec.server.core import Core, Failed, Finished, Run
from localspec.server.errors import APIError, ErrorShape
from localspec.server.notes import not_acted_on, with_warnings
from localspec.server.reasoning import ReasoningDelta
from localspec.server.requests import GenerationRequest, Served, chat_request
from localspec.server.responses import timings
from localspec.server.schemas import ChatCompletionRequest
from localspec.server.tools import ArgumentsDelta, CallStart, ContentDelta, ToolEvent

PATH = "/v1/messages"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",  # the queue is full (with Retry-After), or the server is shutting down
    529: "overloaded_error",
}
KEY_HINT = "send it as `x-api-key: KEY` or `Authorization: Bearer KEY`"


def error_body(e: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


# Of several validation errors the deepest is reported: a bad block fails both the string and the list reading
# of `content`, and only the list's error says what is wrong.
ERRORS = ErrorShape(PATH, error_body, KEY_HINT, FIELD_NAMES, deepest=True)


# -- the request: Anthropic's body -> OpenAI's chat body -------------------------------------------------


def chat_body(body: Conversation) -> ChatCompletionRequest:
    """The chat request that asks for what `body` asks for; a 400 for what localspec serve cannot honour."""
    refuse_unhonoured(body)
    fields: dict[str, Any] = {"model": body.model, "messages": chat_messages(body), **tool_fields(body)}
    if isinstance(body, MessagesRequest):  # (count_tokens renders the prompt only)
        fields.update(generation_fields(body))
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as e:  # what the chat body cannot take, though Anthropic's did (never a 500)
        raise ERRORS.invalid(e.errors()) from None


def generation_fields(body: MessagesRequest) -> dict[str, Any]:
    """Sampling, stop strings, streaming, localspec's `speculative` and the output format."""
    sampling = {"max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
                "top_k": body.top_k, "stop": body.stop_sequences, "stream": bool(body.stream)}  # fmt: skip
    out = {name: value for name, value in sampling.items() if value is not None}
    if body.speculative is not None:
        out["speculative"] = body.speculative.model_dump(exclude_none=True)
    fmt = body.output_config.format if body.output_config and body.output_config.format else body.output_format
    if fmt is not None:  # enforced by the chat path's grammar, as response_format json_schema strict
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "output", "schema": fmt.schema_, "strict": True}}  # fmt: skip
    return out


# `adaptive` lets the model decide whether to think; `enabled` on a model that does not think, and `disabled` on one
# whose template opens a think block, are accepted and said back in `warnings` (hint_notes).
THINKING_ACCEPTED = ("disabled", "adaptive", "enabled")


def refuse_unhonoured(body: Conversation) -> None:
    if body.thinking is not None and body.thinking.type not in THINKING_ACCEPTED:
        raise APIError(400, f"thinking {body.thinking.type}: unknown to localspec serve (one of: "
                       f"{', '.join(THINKING_ACCEPTED)})", "thinking")  # fmt: skip
    if body.mcp_servers:
        raise APIError(400, "mcp_servers: the MCP connector is not supported by localspec serve (the model would "
                       "answer without the servers' tools); give their tools in `tools` instead",
                       "mcp_servers")  # fmt: skip


def tool_fields(body: Conversation) -> dict[str, Any]:
    """tools and tool_choice as the chat body's: any is OpenAI's "required", tool a named function, and
    disable_parallel_tool_use is parallel_tool_calls false. The chat path checks them against each other."""
    out: dict[str, Any] = {}
    if body.tools:
        out["tools"] = [function_tool(i, tool) for i, tool in enumerate(body.tools)]
    choice = body.tool_choice
    if choice is None:
        return out
    if choice.type == "tool":
        if not choice.name:
            raise APIError(400, "tool_choice.name: tool_choice {\"type\": \"tool\"} needs the name of the tool to "
                           "call", "tool_choice.name")  # fmt: skip
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out


def function_tool(i: int, tool: ToolParam) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise APIError(400, f"tools[{i}]: {tool.type} is one of Anthropic's own tools, which localspec serve does "
                       "not have; define the tool yourself (name, description, input_schema)",
                       f"tools[{i}].type")  # fmt: skip
    if tool.input_schema is None:
        raise APIError(400, f"tools[{i}].input_schema: Field required (the JSON schema of the tool's input)",
                       f"tools[{i}].input_schema")  # fmt: skip
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def chat_messages(body: Conversation) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = system_parts(body)
    if system:
        out.append({"role": "system", "content": system})
    turns = [(i, message) for i, message in enumerate(body.messages) if message.role != "system"]
    for i, message in turns:
        out.extend(turn(i, message))
    if turns and turns[-1][1].role == "assistant":
        raise APIError(400, f"messages[{turns[-1][0]}]: the conversation ends with an assistant message, "
                       "and continuing it (prefill) is not supported by localspec serve; end with a user message",
                       "messages")  # fmt: skip
    return out


# Claude Code opens its system prompt with a line for Anthropic's billing (`x-anthropic-billing-header: cc_version=...;
# cch=...;`) that may change on every request. Addressed to Anthropic's servers, not to the model, it is dropped: left
# in, it would sit before the system prompt and the tools and change the prompt's first tokens every turn, so no
# request could reuse the cached prefix of the one before.
BILLING_HEADER = "x-anthropic-billing-header:"


def system_parts(body: Conversation) -> list[dict[str, str]]:
    """The system text as text parts: the top-level `system` without the billing line, then the text of each
    `role: "system"` entry inside `messages` (Claude Code sends one), in order, a blank line apart. Chat templates
    take one system message, at the start; llama-server and Ollama accept such entries too."""
    if isinstance(body.system, str):
        first, _, rest = body.system.partition("\n")
        text = rest if first.lstrip().startswith(BILLING_HEADER) else body.system
        parts = [{"type": "text", "text": text}] if text else []
    else:
        parts = [text_part(b) for b in body.system or () if not b.text.lstrip().startswith(BILLING_HEADER)]
    for i, message in enumerate(body.messages):
        if message.role != "system":
            continue
        text = system_entry_text(i, message)
        if text:
            parts += [{"type": "text", "text": "\n\n"}] if parts else []
            parts.append({"type": "text", "text": text})
    return parts


def system_entry_text(i: int, message: MessageParam) -> str:
    if isinstance(message.content, str):
        return message.content
    for j, block in enumerate(message.content):
        if not isinstance(block, TextBlock):
            refuse_block(f"messages[{i}].content[{j}]", block, "system")
    return "".join(block.text for block in message.content if isinstance(block, TextBlock))


def turn(i: int, message: MessageParam) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI chat messages: an assistant's tool_use blocks become its tool_calls,
    a user's tool_result blocks `tool` messages (before the user's text, in the blocks' order)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        return [assistant_turn(i, message.content)]
    return user_turn(i, message.content)


# An earlier turn's thinking goes to the chat template as the turn's reasoning_content, which writes it only if it
# uses it (Qwen3's keeps it within a tool-calling turn, as Anthropic wants thinking sent back there, and drops it
# before the last user message, as Anthropic leaves it out of the context); redacted thinking is left out.
PAST_THINKING = ("redacted_thinking",)


def assistant_turn(i: int, blocks: Sequence[Block]) -> dict[str, Any]:
    text: list[dict[str, str]] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            text.append(text_part(block))
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
        elif block.type not in PAST_THINKING:
            refuse_block(f"messages[{i}].content[{j}]", block, "assistant")
    reasoning = {"reasoning_content": "\n\n".join(thoughts)} if thoughts else {}
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {}), **reasoning}


def user_turn(i: int, blocks: Sequence[Block]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    text: list[dict[str, str]] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, TextBlock):
            text.append(text_part(block))
        elif isinstance(block, ToolResultBlock):
            if text:
                out.append({"role": "user", "content": text})
                text = []
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": result_text(where, block)})
        else:
            refuse_block(where, block, "user")
    if text or not out:
        out.append({"role": "user", "content": text})
    return out


def result_text(where: str, block: ToolResultBlock) -> str:
    """A tool_result's content as the tool message's text; OpenAI's tool messages have no error flag, so
    an error says so in its text."""
    if block.content is None or isinstance(block.content, str):
        text = block.content or ""
    else:
        for k, part in enumerate(block.content):
            if not isinstance(part, TextBlock):
                refuse_block(f"{where}.content[{k}]", part, "tool_result")
        text = "\n".join(part.text for part in block.content if isinstance(part, TextBlock))
    return f"Error: {text}" if block.is_error else text


def refuse_block(where: str, block: Block, role: str) -> None:
    """A 400 for a block this server cannot read (image, document, thinking, ...) or one out of place."""
    if isinstance(block, ToolUseBlock | ToolResultBlock):
        belongs = "assistant" if isinstance(block, ToolUseBlock) else "user"
        raise APIError(400, f"{where}: {block.type} blocks belong in {belongs} messages, not in {role} ones", where)
    hint = "the served model reads text only" if block.type in ("image", "document") else "send text blocks"
    inside = "text" if role == "tool_result" else "text, tool_use and tool_result"
    raise APIError(400, f"{where}: {block.type} blocks are not supported by localspec serve ({hint}); it reads "
                   f"{inside} blocks here", where)  # fmt: skip


def text_part(block: TextBlock) -> dict[str, str]:
    return {"type": "text", "text": block.text}


def generation_request(body: MessagesRequest, served: Served) -> GenerationRequest:
    req = replace(chat_request(chat_body(body), served), path=PATH)
    return replace(req, notes=(*req.notes, *hint_notes(body, req, served)))


def hint_notes(body: MessagesRequest, req: GenerationRequest, served: Served) -> list[str]:
    """The request's hints that nothing here acts on, for the answer's `warnings` (the rule: notes.py)."""
    out = []
    thinks = req.reasoning is not None or served.thinks()
    thinking = body.thinking.type if body.thinking is not None else None
    if thinking == "enabled" and not thinks:
        out.append(not_acted_on("thinking enabled", "the served model does not think: its chat template opens no "
                                "think block and its vocabulary has no </think>; the answer has no thinking blocks"))  # fmt: skip
    if thinking == "enabled" and thinks and body.thinking and body.thinking.budget_tokens is not None:
        out.append(not_acted_on(f"thinking.budget_tokens {body.thinking.budget_tokens}",
                                "max_tokens bounds thinking and text together"))  # fmt: skip
    if thinking == "disabled" and req.reasoning is not None and req.reasoning.opened:
        out.append(not_acted_on("thinking disabled", "the served model's chat template opens a think block by "
                                "itself; its thinking comes back as a thinking block"))  # fmt: skip
    if body.output_config is not None and body.output_config.effort is not None:
        out.append(not_acted_on(f"output_config.effort {body.output_config.effort!r}",
                                "localspec serve has no effort setting"))  # fmt: skip
    if body.context_management and any(body.context_management.values()):
        out.append(not_acted_on("context_management", "localspec serve does not edit the conversation: it reads it "
                                "whole, and one beyond the context is a 400"))  # fmt: skip
    return out


def count_request(body: Conversation, served: Served) -> GenerationRequest:
    """The prompt /v1/messages would render for `body` (the same path, one token to generate)."""
    chat = chat_body(body)
    chat.max_tokens = 1
    return chat_request(chat, served)


# -- the answer: the core's events -> a message, or the stream's events -----------------------------------


def new_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def tool_use_id(call_id: str) -> str:
    """Anthropic's id style for a call the tool reader named (the client sends it back in its tool_result)."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(done: Finished) -> str:
    outcome, calls = done.outcome, done.calls
    if outcome.stop_string is not None:
        return "stop_sequence"
    if calls and outcome.finish_reason == "stop":  # (a call cut short by max_tokens keeps max_tokens)
        return "tool_use"
    if outcome.stats.stop_reason == "context":
        return "model_context_window_exceeded"
    if outcome.finish_reason == "length":
        return "max_tokens"
    return "end_turn"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the tool_use block's input; {} for arguments cut short (stop_reason max_tokens)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def full_message(msg_id: str, model: str, done: Finished) -> dict[str, Any]:
    outcome, text, calls = done.outcome, done.text, done.calls
    content: list[dict[str, Any]] = [thinking_block(outcome.reasoning)] if outcome.reasoning else []
    content += [{"type": "text", "text": text}] if text or not calls else []
    content += [{"type": "tool_use", "id": tool_use_id(c.id), "name": c.name, "input": tool_input(c.arguments)}
                for c in calls]  # fmt: skip
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(done),
        "stop_sequence": outcome.stop_string,
        "usage": {"input_tokens": outcome.stats.n_prompt, "output_tokens": outcome.stats.n_generated},
        "timings": timings(outcome.stats),  # localspec's speculative statistics, as on the OpenAI routes
        **({"warnings": done.warnings} if done.warnings else {}),  # what was accepted and not done (notes.py)
    }


def thinking_block(text: str) -> dict[str, Any]:
    """A reasoning model's thinking; the signature is empty: nothing here signs it (or checks it when sent back)."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@dataclass
class Blocks:
    """The content blocks of a streamed answer: a block opens with its first piece (text, or a call's
    name) and closes when the next one opens; an answer with no content still gets one (empty) text
    block, as the plain answer does."""

    index: int = -1
    open_kind: str | None = None
    out: list[bytes] = field(default_factory=list)

    def events(self, pieces: Sequence[ToolEvent]) -> list[bytes]:
        for piece in pieces:
            if isinstance(piece, ContentDelta):
                self.text(piece.text)
            elif isinstance(piece, CallStart):
                self.start({"type": "tool_use", "id": tool_use_id(piece.id), "name": piece.name, "input": {}}, "tool")
            elif isinstance(piece, ArgumentsDelta) and piece.text:
                self.delta({"type": "input_json_delta", "partial_json": piece.text})
        return self.take()

    def thinking(self, text: str) -> list[bytes]:
        if self.open_kind != "thinking":
            self.start(thinking_block(""), "thinking")
        self.delta({"type": "thinking_delta", "thinking": text})
        return self.take()

    def text(self, text: str) -> None:
        if self.open_kind != "text":
            self.start({"type": "text", "text": ""}, "text")
        self.delta({"type": "text_delta", "text": text})

    def delta(self, delta: dict[str, Any]) -> None:
        self.out.append(event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                      "delta": delta}))  # fmt: skip

    def start(self, block: dict[str, Any], kind: str) -> None:
        self.close()
        self.index += 1
        self.open_kind = kind
        self.out.append(event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                      "content_block": block}))  # fmt: skip

    def close(self) -> None:
        if self.open_kind == "thinking":  # Anthropic ends a thinking block with its signature (empty here)
            self.delta({"type": "signature_delta", "signature": ""})
        if self.open_kind is not None:
            self.out.append(event("content_block_stop", {"type": "content_block_stop", "index": self.index}))
            self.open_kind = None

    def finish(self) -> list[bytes]:
        if self.index < 0:
            self.start({"type": "text", "text": ""}, "text")
        self.close()
        return self.take()

    def take(self) -> list[bytes]:
        out, self.out = self.out, []
        return out


def message_start(msg_id: str, model: str, req: GenerationRequest) -> bytes:
    message = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": len(req.prompt), "output_tokens": 0}}  # fmt: skip
    return event("message_start", {"type": "message_start", "message": message})


def message_end(done: Finished) -> list[bytes]:
    delta = {"type": "message_delta",
             "delta": {"stop_reason": stop_reason(done), "stop_sequence": done.outcome.stop_string},
             "usage": {"output_tokens": done.stats.n_generated}, "timings": timings(done.stats)}  # fmt: skip
    with_warnings(delta, done.warnings)  # what was accepted and not done (notes.py)
    return [event("message_delta", delta), event("message_stop", {"type": "message_stop"})]


# -- the routes ------------------------------------------------------------------------------------------


def messages_router(core: Core) -> APIRouter:
    router = APIRouter()

    @router.post(PATH)
    async def messages(body: MessagesRequest, request: Request) -> Response:
        req = await run_in_threadpool(generation_request, body, core.served)
        run = core.start(request, req)
        msg_id = new_id()
        if req.stream:
            return StreamingResponse(stream(run, msg_id, core.model_name), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        try:
            done = await run.result()
        finally:
            run.close()
        return JSONResponse(full_message(msg_id, core.model_name, done))

    @router.post(f"{PATH}/count_tokens")
    async def count_tokens(body: Conversation) -> dict[str, Any]:
        req = await run_in_threadpool(count_request, body, core.served)
        return {"input_tokens": len(req.prompt)}

    return router


async def stream(run: Run, msg_id: str, model: str) -> AsyncIterator[bytes]:
    blocks = Blocks()
    try:
        yield message_start(msg_id, model, run.request)
        yield event("ping", {"type": "ping"})  # early, while the prompt pass runs
        async for piece in run.events():
            if isinstance(piece, ReasoningDelta):  # a reasoning model's thinking, before the text
                chunks = blocks.thinking(piece.text)
            elif isinstance(piece, Failed):
                chunks = [event("error", error_body(piece.error))]  # the stream ends with it; the server serves on
            elif isinstance(piece, Finished):
                chunks = [*blocks.finish(), *message_end(piece)]
            else:
                chunks = blocks.events([piece])
            for chunk in chunks:
                yield chunk
    finally:
        run.close()  # the client went away mid-stream: stop now (a no-op once finished)
