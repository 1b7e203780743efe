"""The grammars of tool calls: for tool_choice "required" or a named function, an answer that is a call (or
several) in the served model's format with arguments valid against the function's schema; for "auto", free
text whose calls, once one opens, are held to the offered functions (llguidance Lark grammars)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from localspec.server.tools.formats import HERMES, MISTRAL, ToolTemplate


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    parameters: dict[str, Any]  # its JSON schema, as the grammar takes it (schema_fit.fit: no-op keywords out)
    unenforced: tuple[str, ...] = ()  # keywords the grammar leaves out (lenient): calls are checked after generation
    schema: dict[str, Any] | None = field(default=None, compare=False)  # as the request gave it (None: parameters)

    @property
    def given(self) -> dict[str, Any]:
        return self.schema if self.schema is not None else self.parameters


def call_grammar(tmpl: ToolTemplate, functions: Sequence[FunctionSpec], *, parallel: bool) -> str:
    """An llguidance Lark grammar whose sentences are calls, in the model's format, to one of `functions`
    with arguments valid against its schema: one call, or one or more when `parallel`."""
    fmt = tmpl.fmt
    key = json.dumps(fmt.args_key)
    lines = [f"fn_{i}: {_lit(json.dumps(f.name) + ', ' + key + ': ')} %json{json.dumps(_compact(f))}"
             for i, f in enumerate(functions)]  # fmt: skip
    lines.append("fn: " + " | ".join(f"fn_{i}" for i in range(len(functions))))
    obj = f"{_lit(OPEN_CALL)} fn {_lit('}')}"
    if fmt is HERMES:
        lines.append(f"call: {_marker(tmpl, '<tool_call>')} {_lit(chr(10))} {obj} {_lit(chr(10))} "
                     f"{_marker(tmpl, '</tool_call>')}")  # fmt: skip
        start = f"call ({_lit(chr(10))} call)*" if parallel else "call"
    elif fmt is MISTRAL:
        lines.append(f"call: {obj}")
        opener = _marker(tmpl, "[TOOL_CALLS]", optional_text=True)
        calls = f"call ({_lit(', ')} call)*" if parallel else "call"
        start = f"{opener} {_lit('[')} {calls} {_lit(']')}".strip()
    else:
        lines.append(f"call: {obj}")
        start = f"call ({_lit('; ')} call)*" if parallel else "call"
    return "\n".join([f"start: {start}", *lines]) + "\n"


def lazy_call_grammar(tmpl: ToolTemplate, functions: Sequence[FunctionSpec], *, parallel: bool) -> str | None:
    """tool_choice "auto": free text, then optionally calls held to the offered functions and their schemas
    (the grammar constrains only once a call opens). Only where a call opens with a single token that text
    cannot spell (Hermes' `<tool_call>` in Qwen's vocabulary); elsewhere free text and the start of a call
    cannot be told apart by a grammar, and auto stays unconstrained (None)."""
    tokens = {text for text, _, _ in tmpl.markers}
    if tmpl.fmt is not HERMES or not {"<tool_call>", "</tool_call>"} <= tokens:
        return None
    as_tokens = replace(tmpl, markers=tuple((text, token, False) for text, token, _ in tmpl.markers))
    head, rest = call_grammar(as_tokens, functions, parallel=parallel).split("\n", 1)
    calls = head.removeprefix("start: ")
    return f"start: TEXT? calls?\nTEXT: /(?s:.+)/\ncalls: {calls}\n{rest}"


# The arguments as templates' `tojson` writes them (", " and ": "), never free whitespace: a model may
# otherwise spend its tokens on blanks the grammar cannot refuse.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _compact(f: FunctionSpec) -> dict[str, Any]:
    out = {"x-guidance": COMPACT_JSON, **(f.parameters or {"type": "object"})}
    if f.unenforced:  # llguidance's lenient mode: what it cannot enforce is left out (and checked afterwards)
        out["x-guidance"] = {**out["x-guidance"], "lenient": True}
    return out


OPEN_CALL = '{"name": '


def _lit(text: str) -> str:
    return json.dumps(text)


def _marker(tmpl: ToolTemplate, marker: str, *, optional_text: bool = False) -> str:
    """A marker as the grammar writes it: its token (when it is one) or its text. A control token that renders
    as nothing is the token alone (the reader finds the call without it)."""
    for text, token, renders in tmpl.markers:
        if text == marker:
            return f"(<[{token}]> | {_lit(marker)})" if renders else f"<[{token}]>"
    return "" if optional_text else _lit(marker)
