"""Request bodies of Ollama's API (/api/chat, /api/generate, /api/show, /api/pull), as typed models.

Read as Ollama's server reads them: unknown top-level fields are ignored (Go's JSON decoder drops them), a
wrong type is a 400, `stream` is true when left out. `options` is a map in Ollama; it is typed here so that
ollama_requests.py can honour the sampling options, refuse the ones localspec cannot honour and apply one
documented rule to the load-time ones. Numbers are read as Ollama reads them (an integer option may come
as 100.0), strings are never numbers."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class CallFunction(_Body):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)  # a JSON object, not text as OpenAI sends it
    index: int | None = None


class ToolCall(_Body):
    id: str | None = None
    function: CallFunction


class Message(_Body):
    role: str
    content: str | None = None
    thinking: str | None = None  # an earlier answer's thinking, as /api/chat returns it
    images: list[str] | None = None  # base64 images: refused (the served model reads text)
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # a tool result: the function it answers
    tool_call_id: str | None = None  # ... or the call's id (newer clients send both)


def whole(value: Any) -> Any:
    """A whole float as the integer it is (100.0 -> 100); anything else as it came, for the type check."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(whole)]


class Options(BaseModel):
    """Ollama's `options` map. Integers may come as whole floats (JSON numbers, as Ollama takes them); other
    keys are kept (extra="allow") so that an option unknown to Ollama and localspec alike can be named."""

    model_config = ConfigDict(extra="allow", strict=True)

    # sampling: honoured
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int | None = None
    min_p: float | None = None
    seed: Int | None = None
    num_predict: Int | None = None
    stop: list[StrictStr] | None = None
    num_ctx: Int | None = None
    # sampling localspec cannot honour (the exact rule needs the model's own distribution): their neutral
    # values only
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    mirostat: Int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    repeat_last_n: Int | None = None
    penalize_newline: bool | None = None
    # context shifting (localspec never shifts) and how the model is loaded (fixed by serve's flags)
    num_keep: Int | None = None
    numa: bool | None = None
    num_batch: Int | None = None
    num_gpu: Int | None = None
    main_gpu: Int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: Int | None = None


class FunctionDef(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Body):
    type: str = "function"
    function: FunctionDef


class GenerationFields(_Body):
    model: str = ""
    stream: bool | None = None  # Ollama streams unless told not to
    format: str | dict[str, Any] | None = None  # "json", or a JSON schema
    options: Options | None = None
    keep_alive: float | int | str | None = None
    think: StrictBool | str | None = None  # true/false, or a level ("low", "medium", "high") for gpt-oss
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @property
    def streams(self) -> bool:
        return self.stream is not False


class ChatRequest(GenerationFields):
    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolDef] | None = None


class GenerateRequest(GenerationFields):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list[str] | None = None


class ModelRequest(_Body):
    """/api/show and /api/pull: `model`, or the deprecated `name`."""

    model: str = ""
    name: str = ""
    verbose: bool | None = None
    stream: bool | None = None
    insecure: bool | None = None

    @property
    def model_name(self) -> str:
        return self.model or self.name


BODIES: tuple[type[BaseModel], ...] = (
    CallFunction, ToolCall, Message, Options, FunctionDef, ToolDef, ChatRequest, GenerateRequest, ModelRequest,
)  # fmt: skip
FIELD_NAMES = frozenset(name for body in BODIES for name in body.model_fields)  # to name a bad field
