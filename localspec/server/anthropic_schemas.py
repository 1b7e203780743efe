"""Request bodies of Anthropic's Messages API, as typed models, read the way schemas.py reads OpenAI's:
strict types (a wrong type is a 400), unknown fields ignored (clients send many that a local server has
no use for), and the known fields localspec cannot honour typed here so that anthropic.py can refuse
them with a 400 instead of answering as if they were not there.

Content blocks are told apart by their `type`; a block of any other type (image, document, redacted thinking,
a server tool's) parses as OtherBlock so that the refusal can name it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from localspec.server.schemas import Speculative


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextBlock(_Body):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ThinkingBlock(_Body):
    """An earlier answer's thinking, sent back (its signature is not checked: nothing here signs thinking)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class OtherBlock(_Body):
    """A block of a type localspec serve does not take (refused by anthropic.py, naming its type)."""

    type: str


KNOWN_BLOCKS = ("text", "tool_use", "tool_result", "thinking")


def block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"block:{kind}" if kind in KNOWN_BLOCKS else "block:other"  # (a tag never reads as a field name)


def result_block_kind(value: Any) -> str:
    return "block:text" if block_kind(value) == "block:text" else "block:other"


ResultBlock = Annotated[  # inside a tool_result: text (images and the rest are refused)
    Annotated[TextBlock, Tag("block:text")] | Annotated[OtherBlock, Tag("block:other")],
    Discriminator(result_block_kind),
]


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultBlock] | None = None
    is_error: bool | None = None


Block = Annotated[
    Annotated[TextBlock, Tag("block:text")]
    | Annotated[ToolUseBlock, Tag("block:tool_use")]
    | Annotated[ToolResultBlock, Tag("block:tool_result")]
    | Annotated[ThinkingBlock, Tag("block:thinking")]
    | Annotated[OtherBlock, Tag("block:other")],
    Discriminator(block_kind),
]


class MessageParam(_Body):
    role: Literal["user", "assistant", "system"]  # a system entry is folded into the system text (anthropic.py)
    content: str | list[Block]


class ToolParam(_Body):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None  # required for the client's own tools (anthropic.py says so)
    type: str | None = None  # "custom" (or absent) for the client's own tools; Anthropic's server tools otherwise
    strict: bool | None = None  # the input must always match input_schema (tool_requests.py says what cannot)


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Body):
    type: str
    budget_tokens: int | None = None


class OutputFormat(_Body):
    """Structured outputs: the answer is JSON valid against `schema` (enforced with a grammar)."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")  # `schema` is taken on BaseModel


class OutputConfig(_Body):
    effort: str | None = None  # how hard a thinking model should think: a hint with nothing to act on here
    format: OutputFormat | None = None


class Conversation(_Body):
    """What /v1/messages/count_tokens reads: everything that goes into the rendered prompt."""

    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's name for output_config.format
    mcp_servers: list[Any] | None = None  # Anthropic's MCP connector (refused by anthropic.py)
    # Server-side clearing of old tool results / thinking as the context grows: not done here (a warning says so).
    context_management: dict[str, Any] | None = None


class MessagesRequest(Conversation):
    max_tokens: int  # required, as Anthropic requires it
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    # Anthropic's end-user id for its abuse tracking: accepted and ignored, it has no effect on the output.
    metadata: dict[str, Any] | None = None
    speculative: Speculative | None = None  # localspec's extension, as on the OpenAI routes


BODIES: tuple[type[BaseModel], ...] = (
    TextBlock, ToolUseBlock, ThinkingBlock, OtherBlock, ToolResultBlock, MessageParam, ToolParam, ToolChoice, Thinking,
    OutputFormat, OutputConfig, Conversation, MessagesRequest, Speculative,
)  # fmt: skip
# To name a bad field in errors, as the client wrote it.
FIELD_NAMES = frozenset(f.alias or name for body in BODIES for name, f in body.model_fields.items())
