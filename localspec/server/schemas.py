"""Request bodies of the OpenAI API, as typed models. Unknown fields are ignored (clients send many
that a local server has no use for); the known fields localspec cannot honour yet (legacy functions,
penalties, best_of, ...) are typed here so that requests.refuse_unhonoured can refuse
them with a 400 instead of answering as if they were not there. Wrong types fail validation: a 400.

Every field is strict, as OpenAI's API is: `"max_tokens": true` or `"10"` and `"stream": "yes"` are
refused instead of read as 1, 10 and true. Only an integer is also taken where a number is expected
(`"temperature": 1`), and JSON null wherever the field is optional."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Body):
    type: str = "text"
    text: str | None = None


class CallFunction(_Body):
    name: str
    arguments: str  # JSON text


class MessageToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: CallFunction


class Message(_Body):
    role: str
    content: str | list[TextPart] | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers
    name: str | None = None
    # An earlier answer's thinking, as this server returns it: given to the chat template, which writes it only
    # if it uses it (Qwen3's drops it before the last user turn and keeps it within a tool-calling turn).
    reasoning_content: str | None = None

    def text(self) -> str:
        """The content as one string; only text parts are understood (others are refused upstream)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)

    def non_text_parts(self) -> list[str]:
        if isinstance(self.content, list):
            return [p.type for p in self.content if p.type != "text"]
        return []


class StreamOptions(_Body):
    include_usage: bool = False


class Speculative(_Body):
    """localspec's extension: how this request drafts (the server's flags are the defaults)."""

    method: str | None = None
    k: int | None = None
    rule: str | None = None


class FunctionDef(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class JSONSchemaFormat(_Body):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # `schema` is taken on BaseModel
    strict: bool | None = None


class ResponseFormat(_Body):
    """{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}; enforced
    with a grammar (requests.response_grammar), strict or not."""

    type: str
    json_schema: JSONSchemaFormat | None = None


class SamplingFields(_Body):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = False  # OpenAI's spec allows null (= false)
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    speculative: Speculative | None = None
    response_format: ResponseFormat | None = None
    # Accepted by OpenAI, not honoured here: refused unless left at their defaults (requests.refuse_unhonoured).
    logit_bias: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        items = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in items if s]


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(default_factory=list)
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_format: str | None = None  # llama-server's: "deepseek" splits the think block out, "none" keeps it
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's and llama-server's: more variables for the template
    reasoning_effort: str | None = None  # a hint: accepted, not acted on, said in `warnings` (notes.py)
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


Endpoint = Literal["chat", "completion"]


BODIES: tuple[type[_Body], ...] = (
    TextPart, Message, StreamOptions, Speculative, ChatCompletionRequest, CompletionRequest, TokenizeRequest,
    DetokenizeRequest, CallFunction, MessageToolCall, FunctionDef, ToolDef, FunctionName, NamedToolChoice,
    JSONSchemaFormat, ResponseFormat,
)  # fmt: skip
FIELD_NAMES = frozenset(name for body in BODIES for name in body.model_fields)  # to name a bad field (param)
