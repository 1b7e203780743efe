"""Chat formats: render a conversation with a model's Jinja chat template (as Hugging Face and
llama.cpp do), or, for a model that ships none, with its family's template (recognised by the special
tokens the template needs), or not at all (plain completion), always saying which."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.backends.base import ChatMessage
from localspec.errors import GenerationError, UsageError

if TYPE_CHECKING:
    from localspec.backends.base import Backend


@dataclass(frozen=True)
class Family:
    name: str
    markers: tuple[str, ...]  # special tokens the template writes; all must be single tokens of the vocabulary
    template: str
    merge_system: bool = False  # the format has no system role: the system text opens the first user turn


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
    ),
    Family(
        "chatml",
        ("<|im_start|>", "<|im_end|>"),
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
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


def conversation_text(backend: Backend, messages: Sequence[ChatMessage], fmt: ChatFormat) -> str:
    """The prompt text for a conversation in format `fmt`."""
    if fmt.raw:
        return "\n\n".join(m.content for m in messages)
    if fmt.merge_system:
        messages = merge_system(messages)
    if fmt.source == "model":
        return backend.apply_chat_template(messages)
    return backend.apply_chat_template(messages, template=fmt.template)


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
) -> str:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.TemplateError as e:
        raise GenerationError(f"the chat template failed: {e}", "try without --system, or use --raw") from None


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)
