"""Tool calls: which call format a served model writes (formats.py), reading calls out of its answer whole or
as it streams (stream.py), and the grammars that make an answer a call for tool_choice "required" or a named
function, or hold auto's calls to the offered functions (grammar.py). The names below are the package's
public face; tool_requests.py reads a request's tools onto them."""

from localspec.server.tools.formats import (
    ARGS_KEYS,
    FORMATS,
    HERMES,
    LLAMA3,
    MISTRAL,
    Lead,
    ToolCall,
    ToolFormat,
    ToolTemplate,
    format_of_template,
    mistral_id,
    new_call_id,
    template_has_tools,
    tool_template,
)
from localspec.server.tools.grammar import COMPACT_JSON, OPEN_CALL, FunctionSpec, call_grammar, lazy_call_grammar
from localspec.server.tools.stream import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    ContentDelta,
    ToolEvent,
    ToolPlan,
    ToolStreamParser,
    parse_answer,
)

__all__ = [
    "ARGS_KEYS", "COMPACT_JSON", "FORMATS", "HERMES", "LLAMA3", "MISTRAL", "OPEN_CALL", "ArgumentsDelta", "CallEnd",
    "CallStart", "ContentDelta", "FunctionSpec", "Lead", "ToolCall", "ToolEvent", "ToolFormat", "ToolPlan",
    "ToolStreamParser", "ToolTemplate", "call_grammar", "format_of_template", "lazy_call_grammar", "mistral_id",
    "new_call_id", "parse_answer", "template_has_tools", "tool_template",
]  # fmt: skip
