"""Tool-call formats: the call formats of the model families localspec recognises and which one a served
model writes (its chat template's markers, or its family's tool template).

Formats (what the model writes; text before a call stays the answer's content):

- hermes (Qwen2.5, Qwen3, Hermes and ChatML models):  <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
  once per call;
- llama3 (Llama 3.1-3.3):  {"name": ..., "parameters": {...}} at the start of the answer (after an
  optional <|python_tag|>), several separated by ";";
- mistral:  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...].

Markers that are control tokens (<|python_tag|>, [TOOL_CALLS]) render as nothing on llama.cpp, so an
answer that *starts* with the call's JSON is read as calls in those two formats (stream.py).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localspec.backends.chat_template import FAMILIES, ChatFormat, detect_family

if TYPE_CHECKING:
    from localspec.backends.base import Backend


@dataclass(frozen=True)
class ToolCall:
    id: str  # "call_..."
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(frozen=True)
class Lead:
    """What opens a block of calls only at the answer's start (compared without whitespace): a fence to skip,
    then the call's JSON; `close` ends the block."""

    fence: str
    start: str
    close: str = ""


@dataclass(frozen=True)
class ToolFormat:
    name: str
    opens: tuple[str, ...]  # markers that open a block of calls anywhere in the answer
    leads: tuple[Lead, ...]  # what opens a block at the answer's start only
    close: str  # what ends a block opened by a marker, after its call ("" when the JSON's end ends it)
    array: bool  # a block is a JSON array of calls
    args_key: str  # how the format names the arguments (both names are read)
    chain: str = ""  # what separates calls in one block, besides whitespace (llama3: ";")


# Small models often leave out Hermes' tags and write the call's JSON alone or in a ```json fence, as
# llama.cpp also accepts; only at the answer's start.
_BARE = (Lead("", '{"name"'), Lead("```json", '{"name"', "```"), Lead("```", '{"name"', "```"))
HERMES = ToolFormat("hermes", ("<tool_call>",), _BARE, "</tool_call>", False, "arguments")
LLAMA3 = ToolFormat("llama3", ("<|python_tag|>",), (Lead("", '{"name"'), Lead("", '{"type"')), "", False, "parameters",
                    ";")  # fmt: skip
MISTRAL = ToolFormat("mistral", ("[TOOL_CALLS]",), (Lead("", '[{"name"'), Lead("", '[{"type"')), "", True, "arguments")
FORMATS: tuple[ToolFormat, ...] = (HERMES, LLAMA3, MISTRAL)

ARGS_KEYS = ("arguments", "parameters")


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def mistral_id(call_id: str) -> str:
    """A call id as Mistral's templates require it (9 letters or digits), the same for the same id."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


# -- which format a model writes ----------------------------------------------------------------------


def template_has_tools(template: str) -> bool:
    """The template renders a `tools` list (Hugging Face's and llama.cpp's convention)."""
    return re.search(r"\btools\b", template) is not None


def format_of_template(template: str) -> ToolFormat | None:
    """The call format a tool-capable chat template teaches, from the markers it writes."""
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|start_header_id|>" in template and ("<|python_tag|>" in template or "parameters" in template):
        return LLAMA3
    return None


@dataclass(frozen=True)
class ToolTemplate:
    """How a served model gets tools: the chat format that renders them and the call format it answers in."""

    chat_format: ChatFormat
    fmt: ToolFormat
    markers: tuple[tuple[str, int, bool], ...] = ()  # (marker, its single token id, whether it renders as text)


def tool_template(backend: Backend, chat_format: ChatFormat | None) -> ToolTemplate | str:
    """The served model's way with tools, or why it has none (for the 400)."""
    fmt_in = chat_format or ChatFormat("model")
    if fmt_in.raw:
        return "the server renders prompts as plain text (--chat-template raw)"
    own = backend.chat_template() if fmt_in.source == "model" else fmt_in.template
    if own and template_has_tools(own):
        fmt = format_of_template(own)
        if fmt is None:
            return "it renders tools, but in a call format localspec does not recognise"
        return ToolTemplate(fmt_in, fmt, _markers(backend, fmt))
    family = next((f for f in FAMILIES if f.name == fmt_in.name), None) if fmt_in.source != "model" else None
    family = family or detect_family(backend)
    if family is None or not family.tool_template:
        return "it renders no tools, and localspec knows no tool format for the model's family"
    fmt = format_of_template(family.tool_template)
    assert fmt is not None  # the families' own tool templates use known formats
    chat = ChatFormat("family", f"{family.name}-tools", family.tool_template)
    return ToolTemplate(chat, fmt, _markers(backend, fmt))


def _markers(backend: Backend, fmt: ToolFormat) -> tuple[tuple[str, int, bool], ...]:
    """The format's markers that are single tokens of the vocabulary, and whether each renders as its text."""
    out = []
    for marker in (*fmt.opens, fmt.close):
        if not marker:
            continue
        ids = backend.tokenize(marker, add_special=False, parse_special=True)
        if len(ids) == 1:
            detok = backend.detokenizer()
            out.append((marker, ids[0], (detok.add(ids) + detok.flush()) == marker))
    return tuple(out)
