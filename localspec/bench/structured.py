"""bench's structured suite: answers held to a JSON schema by the grammar (decoding/grammar.py), as the server's
response_format and forced tool calls hold them.

Three kinds of structured answer an application asks for: an API response object filled from a record shown
in the prompt, a list of records converted from CSV (keys repeated row after row), and a tool call's
arguments (an edit that quotes the text it replaces). JSON repeats its keys and these answers copy from
the prompt, so lookup drafts (ngram, suffix) have something to find; the grammar's mask is paid on every
verified row, which bench reports per token. Every string, array and number is bounded, so any model's
answer ends within a known length: the grammar closes the object once the bounds are reached.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localspec.backends.base import ChatMessage
from localspec.decoding.grammar import GrammarSpec, json_schema


@dataclass(frozen=True)
class StructuredPrompt:
    """One request: the conversation and the schema its answer must match."""

    name: str
    messages: tuple[ChatMessage, ...]
    schema: dict[str, Any]

    @property
    def grammar(self) -> GrammarSpec:
        return json_schema(self.schema)


def _text(max_length: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


USER_SCHEMA = _object(
    {
        "id": {"type": "integer", "minimum": 1, "maximum": 999999},
        "username": _text(32),
        "email": _text(64),
        "full_name": _text(64),
        "roles": {
            "type": "array",
            "items": {"type": "string", "enum": ["admin", "editor", "viewer", "billing"]},
            "maxItems": 4,
        },
        "created_at": _text(32),
        "settings": _object(
            {
                "theme": {"type": "string", "enum": ["light", "dark", "system"]},
                "language": _text(8),
                "email_notifications": {"type": "boolean"},
            }
        ),
        "active": {"type": "boolean"},
    }
)

ORDERS_SCHEMA = _object(
    {
        "orders": {
            "type": "array",
            "maxItems": 8,
            "items": _object(
                {
                    "order_id": _text(16),
                    "customer": _text(32),
                    "sku": _text(16),
                    "quantity": {"type": "integer", "minimum": 0, "maximum": 9999},
                    "unit_price_cents": {"type": "integer", "minimum": 0, "maximum": 9999999},
                    "status": {"type": "string", "enum": ["pending", "shipped", "delivered", "cancelled"]},
                }
            ),
        }
    }
)

EDIT_SCHEMA = _object({"path": _text(96), "old_text": _text(400), "new_text": _text(400)})

_USER_RECORD = """users row 4821:
  username   = mkowalski
  email      = m.kowalski@example.com
  first_name = Marta
  last_name  = Kowalski
  created    = 2024-03-18T09:41:07Z
  disabled   = false
user_roles rows for 4821: editor, billing
user_settings rows for 4821: theme=dark, language=pl, email_notifications=true"""

_ORDERS_CSV = """order_id,customer,sku,quantity,unit_price,status
A-1001,Northwind Traders,KB-204,3,49.90,shipped
A-1002,Contoso Ltd,MS-118,12,19.50,pending
A-1003,Northwind Traders,MN-27Q,1,329.00,delivered
A-1004,Fabrikam Inc,KB-204,5,49.90,cancelled
A-1005,Contoso Ltd,HD-USB3,2,89.99,shipped
A-1006,Adventure Works,MS-118,7,19.50,pending"""

_CONFIG_SOURCE = '''import os


def http_settings(env=os.environ):
    """Settings for the HTTP client, read from the environment."""
    timeout = float(env.get("APP_TIMEOUT", "30"))
    retries = int(env.get("APP_RETRIES", "3"))
    return {"timeout": timeout, "retries": retries}
'''

_EDIT_TOOL = {
    "name": "edit_file",
    "description": "Replace old_text (quoted exactly from the file) with new_text in the file at path.",
    "parameters": EDIT_SCHEMA,
}


def structured_prompts() -> tuple[StructuredPrompt, ...]:
    return (
        StructuredPrompt(
            "api-response",
            (
                ChatMessage(
                    "user",
                    "A client called GET /api/users/4821. The database holds:\n\n"
                    f"{_USER_RECORD}\n\n"
                    "Reply with the API's JSON response body only, matching this schema "
                    "(full_name is first and last name; active is the opposite of disabled):\n"
                    f"{json.dumps(USER_SCHEMA)}",
                ),
            ),
            USER_SCHEMA,
        ),
        StructuredPrompt(
            "records",
            (
                ChatMessage(
                    "user",
                    "Convert this CSV export to JSON, one record per row in the same order, prices in cents:\n\n"
                    f"{_ORDERS_CSV}\n\n"
                    f"Reply with JSON only, matching this schema:\n{json.dumps(ORDERS_SCHEMA)}",
                ),
            ),
            ORDERS_SCHEMA,
        ),
        StructuredPrompt(
            "tool-arguments",
            (
                ChatMessage(
                    "system",
                    "You are a coding agent. You change files only by calling this tool:\n"
                    f"{json.dumps(_EDIT_TOOL)}\nReply with the tool's arguments as one JSON object.",
                ),
                ChatMessage(
                    "user",
                    f"Here is app/config.py:\n\n```python\n{_CONFIG_SOURCE}```\n\n"
                    "Raise the default timeout to 60 seconds and rename `retries` to `max_retries` (the "
                    "variable and the dictionary key). Edit the three lines inside the function.",
                ),
            ),
            EDIT_SCHEMA,
        ),
    )
