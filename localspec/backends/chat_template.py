"""Chat formats: render a conversation with a model's Jinja chat template (as Hugging Face and
llama.cpp do), or, for a model that ships none, with its family's template (recognised by the special
tokens the template needs), or not at all (plain completion), always saying which."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.backends.messages import ChatMessage
from localspec.errors import GenerationError, UsageError

if TYPE_CHECKING:
    from localspec.backends.base import Backend


@dataclass(frozen=True)
class Family:
    name: str
    markers: tuple[str, ...]  # special tokens the template writes; all must be single tokens of the vocabulary
    template: str
    merge_system: bool = False  # the format has no system role: the system text opens the first user turn
    tool_template: str = ""  # the family's own tool-call format, for a model whose template has none ("": no tools)


# Tool-capable templates for families whose models often ship a template without tools: the formats their
# tool-trained members use (Qwen2.5/Hermes for ChatML, Llama 3.1's JSON calls for Llama 3). Every piece of
# text goes through an expression, so trim_blocks/lstrip_blocks cannot eat a newline.
CHATML_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}{{- '<|im_start|>assistant' }}"
    "{%- if m.content %}{{- '\\n' + m.content }}{%- endif %}"
    '{%- for c in m.tool_calls %}{{- \'\\n<tool_call>\\n{"name": "\' + c.function.name + \'", "arguments": \' }}'
    "{{- (c.function.arguments | tojson) + '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3_TOOLS = (
    "{{- bos_token }}"
    "{%- if tools or messages[0].role == 'system' %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- if tools %}{{- '\\n\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- if tools %}{{- 'Given the following functions, respond with a JSON for a function call with its proper "
    'arguments that best answers the given prompt.\\n\\nRespond in the format {"name": function name, '
    '"parameters": dictionary of argument name and its value}. Do not use variables.\\n\\n\' }}'
    "{%- for tool in tools %}{{- (tool | tojson(indent=4)) + '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'tool' %}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for c in m.tool_calls %}{%- if not loop.first %}{{- '; ' }}{%- endif %}"
    "{{- '{\"name\": \"' + c.function.name + '\", \"parameters\": ' + (c.function.arguments | tojson) + '}' }}"
    "{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


FAMILIES: tuple[Family, ...] = (
    Family(
        "gemma",
        ("<start_of_turn>", "<end_of_turn>"),
        "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
        "{{ m.content }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
        merge_system=True,
    ),
    Family(
        "llama3",
        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}"
        "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
        tool_template=LLAMA3_TOOLS,
    ),
    Family(
        "chatml",
        ("<|im_start|>", "<|im_end|>"),
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        tool_template=CHATML_TOOLS,
    ),
    Family(
        "phi3",
        ("<|user|>", "<|assistant|>", "<|end|>"),
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    ),
    Family(
        "mistral",
        ("[INST]", "[/INST]"),
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
        "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}",
        merge_system=True,
    ),
)
FAMILY_NAMES = tuple(f.name for f in FAMILIES)
RAW = "raw"  # --chat-template raw: plain completion


@dataclass(frozen=True)
class ChatFormat:
    """How conversations become prompt text. `source`: "model" (its own template), "family" (the
    model ships none; its special tokens match a known format), "option" (--chat-template) or "raw"."""

    source: str
    name: str = ""
    template: str | None = None
    merge_system: bool = False
    note: str = ""  # one line for the user when the format is not the model's own

    @property
    def raw(self) -> bool:
        return self.source == "raw"


def choose_chat_format(backend: Backend, requested: str | None = None) -> ChatFormat:
    """The format for `backend`: `requested` (a family name, "raw" or a Jinja file) if given, else the
    model's own template, else its family's, else plain completion."""
    model = backend.info.name if hasattr(backend, "info") else "the model"
    if requested:
        return _requested_format(requested)
    if backend.chat_template():
        return ChatFormat("model")
    family = detect_family(backend)
    if family is not None:
        return ChatFormat(
            "family", family.name, family.template, family.merge_system,
            f"{model} ships no chat template; using the {family.name} format its special tokens match "
            "(--chat-template to choose another)",
        )  # fmt: skip
    return ChatFormat(
        "raw", RAW,
        note=f"{model} ships no chat template and its format is not recognised: prompts go in as plain text "
        f"(a completion, not a chat); give one with --chat-template {{{','.join(FAMILY_NAMES)}}} or a Jinja file",
    )  # fmt: skip


def _requested_format(requested: str) -> ChatFormat:
    if requested == RAW:
        return ChatFormat("raw", RAW)
    for family in FAMILIES:
        if family.name == requested:
            return ChatFormat("option", family.name, family.template, family.merge_system)
    path = Path(requested).expanduser()
    if not path.is_file():
        raise UsageError(
            f"--chat-template {requested!r} is neither a known format nor a file",
            f"use one of: {', '.join(FAMILY_NAMES + (RAW,))}, or the path of a Jinja template file",
        )
    return ChatFormat("option", path.name, path.read_text(encoding="utf-8"))


def detect_family(backend: Backend) -> Family | None:
    for family in FAMILIES:
        if all(_is_special_token(backend, marker) for marker in family.markers):
            return family
    return None


def _is_special_token(backend: Backend, text: str) -> bool:
    ids = backend.tokenize(text, add_special=False, parse_special=True)
    return len(ids) == 1 and backend.tokenize(text, add_special=False, parse_special=False) != ids


def conversation_text(
    backend: Backend,
    messages: Sequence[ChatMessage],
    fmt: ChatFormat,
    tools: Sequence[dict[str, Any]] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for a conversation in format `fmt`, with `tools` offered when given and `variables` handed
    to the template (a format without one cannot take them: an error, never dropped)."""
    if variables and fmt.raw:
        raise UsageError("chat template variables need a chat template, and this prompt is raw text",
                         "leave chat_template_kwargs out, or serve with a chat template")  # fmt: skip
    if fmt.raw:
        return "\n\n".join(m.content for m in messages)
    if fmt.merge_system:
        messages = merge_system(messages)
    extra: dict[str, Any] = {"tools": list(tools)} if tools else {}
    if variables:
        extra["variables"] = variables
    if fmt.source == "model":
        return backend.apply_chat_template(messages, **extra)
    return backend.apply_chat_template(messages, template=fmt.template, **extra)


def merge_system(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    rest = [m for m in messages if m.role != "system"]
    if system and rest and rest[0].role == "user":
        rest[0] = ChatMessage("user", f"{system}\n\n{rest[0].content}")
    elif system:
        rest.insert(0, ChatMessage("user", system))
    return rest


def render_chat(
    template: str,
    messages: Sequence[ChatMessage],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: Sequence[dict[str, Any]] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> str:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson  # Jinja's own escapes <, > and & for HTML; templates expect plain JSON
    try:
        return env.from_string(template).render(
            messages=[m.template_dict() for m in messages],
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **check_variables(variables),
        )
    except jinja2.TemplateError as e:
        raise GenerationError(f"the chat template failed: {e}", "try without --system, or use --raw") from None


RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


def check_variables(variables: Mapping[str, Any] | None) -> dict[str, Any]:
    """A request's template variables, refused where they would replace what localspec itself hands the template."""
    taken = sorted(RESERVED & set(variables or {}))
    if taken:
        raise UsageError(f"chat template variables cannot set {', '.join(taken)}: localspec sets them from the request",
                         "send messages and tools as request fields")  # fmt: skip
    return dict(variables or {})


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:  # fmt: skip
    """Hugging Face's `tojson` (what chat templates are written against)."""
    import json

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)
