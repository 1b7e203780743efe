"""What of a JSON schema the grammar can enforce (llguidance's JSON Schema subset, docs/json_schema.md of
llguidance), found before anything is generated.

Three kinds of keyword, as llguidance treats them:

- enforced: everything llguidance compiles (types, properties, required, enums, ranges, lengths, patterns
  without look-arounds, `additionalProperties`, `$ref`, the formats it knows...), and the annotations it
  skips because they constrain nothing (`$schema`, `$id`, `$comment`, `title`, `description`, `examples`,
  `default`, `deprecated`, `readOnly`, `writeOnly`, unknown `x-...` keys);
- constraining nothing, though llguidance refuses them: `propertyNames` that every string satisfies
  (`{}`, `true`, `{"type": "string"}`: object keys are strings), `uniqueItems: false`, and a `format`
  llguidance does not know (`uri-reference`, `regex`, ...: JSON Schema 2020-12 makes `format` an annotation
  unless a validator opts in). `fit` removes them: the schema means what it meant;
- constraining, and not enforceable by the grammar: `uniqueItems: true`, `propertyNames` with a pattern,
  `contains`, `not`, `if`/`then`/`else`, `dependentRequired`/`dependentSchemas`, `unevaluated...`,
  `minProperties`/`maxProperties` beside optional properties, `oneOf` (approximated as `anyOf`).
  llguidance's lenient mode (`x-guidance: {"lenient": true}`) compiles the rest and leaves these out;
  `fit` names them (`unenforced`), and the caller decides: tool_requests.py lets a call's grammar go
  lenient and checks its arguments after generation (`argument_errors`, with jsonschema), or refuses.

    fit(schema) -> SchemaFit          cached per schema
    argument_errors(schema, value)    what of `schema` a value breaks (jsonschema), [] when it is valid
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ANNOTATIONS = frozenset({"title", "description", "$comment", "examples", "default", "deprecated", "readOnly",
                         "writeOnly"})  # fmt: skip
# Keywords whose value is one subschema, a list of them, or a map of names to them (walked by _walk).
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
        "unevaluatedProperties", "unevaluatedItems", "additionalItems")  # fmt: skip
_MANY = ("prefixItems", "anyOf", "allOf", "oneOf", "items")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_UNKNOWN_FORMAT = "Unknown format: "
_UNIMPLEMENTED = "Unimplemented keys: "


@dataclass(frozen=True)
class SchemaFit:
    """A schema as the grammar takes it: `schema` without the keywords that constrain nothing; `unenforced`
    names the constraining keywords llguidance leaves out in lenient mode (compile with `lenient` then);
    `error`: why it cannot compile even so (a look-around in a pattern, a bad type), else ""."""

    schema: dict[str, Any]
    unenforced: tuple[str, ...] = ()
    error: str = ""

    @property
    def lenient(self) -> bool:
        return bool(self.unenforced)

    def for_grammar(self) -> dict[str, Any]:
        """The schema to embed, with llguidance's lenient mode on where something is left out."""
        if not self.lenient:
            return self.schema
        options = self.schema.get("x-guidance") or {}
        return {**self.schema, "x-guidance": {**options, "lenient": True}}


def fit(schema: dict[str, Any]) -> SchemaFit:
    return _fit(json.dumps(schema))  # (key order kept: llguidance writes properties in it)


@functools.lru_cache(maxsize=256)
def _fit(text: str) -> SchemaFit:
    schema = _walk(json.loads(text), _without_noops)
    failed, warnings = _compile(schema)
    if failed:
        return SchemaFit(schema, error=warnings[0] if warnings else "no reason given")
    formats = {w.removeprefix(_UNKNOWN_FORMAT).strip() for w in warnings if w.startswith(_UNKNOWN_FORMAT)}
    if formats:
        schema = _walk(schema, lambda node: _without_formats(node, formats))
    unenforced: list[str] = []
    for w in warnings:
        for keyword in _keywords(w):
            if keyword not in unenforced:
                unenforced.append(keyword)
    return SchemaFit(schema, tuple(unenforced))


def _compile(schema: dict[str, Any]) -> tuple[bool, list[str]]:
    """(failed, llguidance's messages) of the schema compiled in lenient mode."""
    import llguidance

    options = schema.get("x-guidance") if isinstance(schema.get("x-guidance"), dict) else {}
    lenient = {**schema, "x-guidance": {**options, "lenient": True}}
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(lenient)
    except (ValueError, TypeError, RuntimeError) as e:
        return True, [_one_line(str(e))]
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return bool(failed), [_one_line(m) for m in messages if m.strip()]


def _one_line(message: str) -> str:
    """A message on one line (llguidance's regex errors span several: the pattern, a caret, the reason)."""
    return " ".join(message.split())[:500]


def _keywords(warning: str) -> list[str]:
    """The keywords a lenient-mode warning says were left out (an unknown format is not one: it is dropped)."""
    if warning.startswith(_UNKNOWN_FORMAT):
        return []
    if warning.startswith(_UNIMPLEMENTED):
        try:
            return [str(k) for k in json.loads(warning.removeprefix(_UNIMPLEMENTED))]
        except ValueError:
            return [warning]
    if warning.startswith("min/maxProperties"):
        return ["minProperties/maxProperties"]
    if warning.startswith("oneOf"):
        return ["oneOf"]
    return [warning]


def _walk(node: Any, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """`fn` applied to every subschema of `node`, innermost first (property names, enum and const values and
    other data are left alone)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _walk(out[key], fn)
    for key in _MANY:
        if isinstance(out.get(key), list):
            out[key] = [_walk(item, fn) for item in out[key]]
    for key in _NAMED:
        if isinstance(out.get(key), dict):
            out[key] = {name: _walk(sub, fn) for name, sub in out[key].items()}
    return fn(out)


def _without_noops(node: dict[str, Any]) -> dict[str, Any]:
    out = dict(node)
    if "propertyNames" in out and _any_string(out["propertyNames"]):
        del out["propertyNames"]  # object keys are strings: it allows every key
    if out.get("uniqueItems") is False:
        del out["uniqueItems"]
    return out


def _any_string(schema: Any) -> bool:
    """The schema accepts every string (as a property name)."""
    if schema is True:
        return True
    if not isinstance(schema, dict):
        return False
    rest = {k: v for k, v in schema.items() if k not in ANNOTATIONS and not k.startswith("$")}
    return rest == {} or rest == {"type": "string"}


def _without_formats(node: dict[str, Any], formats: set[str]) -> dict[str, Any]:
    if node.get("format") in formats:
        return {k: v for k, v in node.items() if k != "format"}
    return node


# -- after generation ------------------------------------------------------------------------------------


def argument_errors(schema: dict[str, Any], value: Any, *, most: int = 3) -> list[str]:
    """What `value` breaks of `schema` (JSON Schema's own rules, formats as annotations), as short texts
    naming where (`todos[1].status: 'x' is not one of ...`); [] when it is valid."""
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        errors = sorted(cls(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    except jsonschema.SchemaError as e:
        return [f"the schema itself is not valid: {e.message}"]
    out = []
    for e in errors[:most]:
        where = _path(e.absolute_path)
        out.append(f"{where + ': ' if where else ''}{e.message}"[:300])
    if len(errors) > most:
        out.append(f"and {len(errors) - most} more")
    return out


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
