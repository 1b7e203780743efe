"""Request bodies of OpenAI's Responses API (POST /v1/responses), as typed models, read the way schemas.py reads
Chat Completions: strict types (a wrong type is a 400), unknown fields ignored, and the known fields localspec
cannot honour typed here so that responses_api.py can refuse them with a 400 instead of answering as if they
were not there.

Input items are told apart by their `type` (a message may leave it out); an item of any other type (a built-in
tool's call, an item reference) parses as OtherItem so that the refusal can name it. Content parts are read
loosely (`type` and their text) for the same reason."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from localspec.server.schemas import Speculative


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class ContentPart(_Body):
    """input_text / output_text (and refusal) parts are read; images, files and audio are refused by type."""

    type: str
    text: str | None = None
    refusal: str | None = None


class MessageItem(_Body):
    type: Literal["message"] | None = None
    role: str
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text
    namespace: str | None = None  # the namespace tool the function was offered in
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class CustomToolCallItem(_Body):
    """A call of a custom (freeform) tool: its input is plain text, not JSON."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    namespace: str | None = None
    id: str | None = None
    status: str | None = None


class CustomToolCallOutputItem(_Body):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class LocalShellAction(_Body):
    type: Literal["exec"] = "exec"
    command: list[str]
    env: dict[str, str] | None = None
    timeout_ms: int | None = None
    user: str | None = None
    working_directory: str | None = None


class LocalShellCallItem(_Body):
    """A call of the local_shell tool: the command, as the model wrote it, for the client to run."""

    type: Literal["local_shell_call"]
    call_id: str
    action: LocalShellAction
    id: str | None = None
    status: str | None = None


class LocalShellCallOutputItem(_Body):
    type: Literal["local_shell_call_output"]
    id: str  # the call_id of the call it answers (as OpenAI names it)
    output: str
    status: str | None = None


class SummaryPart(_Body):
    type: str = "summary_text"
    text: str


class ReasoningItem(_Body):
    """An earlier answer's thinking, sent back: its text (summary, content or encrypted_content, which this
    server fills with the thinking itself) goes to the chat template as that turn's reasoning."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryPart] = Field(default_factory=list)
    content: list[ContentPart] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class OtherItem(_Body):
    """An item of a type localspec serve does not take (refused by responses_api.py, naming its type)."""

    type: str


KNOWN_ITEMS = ("message", "function_call", "function_call_output", "reasoning", "custom_tool_call",
               "custom_tool_call_output", "local_shell_call", "local_shell_call_output")  # fmt: skip


def item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None) or "message"
    return f"item:{kind}" if kind in KNOWN_ITEMS else "item:other"  # (a tag never reads as a field name)


Item = Annotated[
    Annotated[MessageItem, Tag("item:message")]
    | Annotated[FunctionCallItem, Tag("item:function_call")]
    | Annotated[FunctionCallOutputItem, Tag("item:function_call_output")]
    | Annotated[ReasoningItem, Tag("item:reasoning")]
    | Annotated[CustomToolCallItem, Tag("item:custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("item:custom_tool_call_output")]
    | Annotated[LocalShellCallItem, Tag("item:local_shell_call")]
    | Annotated[LocalShellCallOutputItem, Tag("item:local_shell_call_output")]
    | Annotated[OtherItem, Tag("item:other")],
    Discriminator(item_kind),
]


class ToolParam(_Body):
    type: str  # "function" or "namespace" (function tools under a shared name); built-in tools' types are refused
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    tools: list[ToolParam] | None = None  # a namespace's tools
    format: dict[str, Any] | None = None  # a custom tool's input format: text (a grammar is refused)


class ToolChoiceParam(_Body):
    type: str  # "function" (with its name); allowed_tools and built-in tools are refused
    name: str | None = None


class TextFormat(_Body):
    type: str  # text | json_object | json_schema
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # `schema` is taken on BaseModel
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningParam(_Body):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None  # the older name of `summary`


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[Item] | None = None
    instructions: str | None = None
    tools: list[ToolParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceParam | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    reasoning: ReasoningParam | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None  # an end-user id: echoed, no effect on the output (as safety_identifier)
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # a hint for OpenAI's cache: echoed (localspec reuses any common prefix)
    client_metadata: dict[str, Any] | None = None  # a client's tags (Codex sends its session ids): no effect
    stream: bool | None = False
    max_tool_calls: int | None = None  # bounds built-in tools' calls, of which there are none here: echoed
    speculative: Speculative | None = None  # localspec's extension, as on the other routes
    # Accepted by OpenAI, not honoured here: refused unless left at what asks for nothing (responses_api.py).
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    top_logprobs: int | None = None
    truncation: str | None = None
    context_management: list[Any] | None = None


BODIES: tuple[type[BaseModel], ...] = (
    ContentPart, MessageItem, FunctionCallItem, FunctionCallOutputItem, SummaryPart, ReasoningItem, OtherItem,
    CustomToolCallItem, CustomToolCallOutputItem, LocalShellAction, LocalShellCallItem, LocalShellCallOutputItem,
    ToolParam, ToolChoiceParam, TextFormat, TextConfig, ReasoningParam, ResponsesRequest, Speculative,
)  # fmt: skip
# To name a bad field in errors, as the client wrote it.
FIELD_NAMES = frozenset(f.alias or name for body in BODIES for name, f in body.model_fields.items())
