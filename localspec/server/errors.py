"""Errors: one APIError (an HTTP status, a message, the parameter at fault, a code) for every protocol, made in
one place from a body that does not parse (validation_error) and from localspec's own errors (from_localspec,
from_exception); each protocol writes it in its own wire shape (ErrorShape: OpenAI's
`{"error": {"message", "type", "param", "code"}}` is APIError.body, Anthropic's is anthropic.error_body).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.errors import ContextOverflowError, LocalspecError, UsageError, error_text

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",  # a route asked with the wrong method: the request's mistake, as OpenAI says
    413: "invalid_request_error",
    499: "request_cancelled",
    503: "server_overloaded",
}


@dataclass
class APIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "server_error")

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def from_localspec(e: LocalspecError, *, param: str | None = None) -> APIError:
    """Our own errors, as the client should see them: bad values are the client's (400), the rest ours."""
    text = e.message + (f" ({e.hint})" if e.hint else "")
    if isinstance(e, ContextOverflowError):
        return APIError(400, text, "messages", "context_length_exceeded")
    if isinstance(e, UsageError):
        return APIError(400, text, param, "invalid_value")
    return APIError(500, text, None, type(e).__name__)


def from_exception(e: Exception) -> APIError:
    """What went wrong while a job ran, for its client: a refusal as it is, our own errors by from_localspec,
    anything else a 500 (an engine bug must not take the server down)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, LocalspecError):
        return from_localspec(e)
    return APIError(500, f"generation failed: {error_text(e)}", None, "engine_error")


def validation_error(errors: Sequence[Any], names: frozenset[str], *, deepest: bool = False) -> APIError:
    """A body that does not parse (pydantic's errors), as a 400 naming the field as the client wrote it
    (`messages[0].content`; `names`: the protocol's field names). Of several errors the first is reported, or
    with `deepest` the deepest: a bad block fails both the string and the list reading of a content, and only
    the list's error says what is wrong."""
    if not errors:
        return APIError(400, "the request body is not valid", None, "invalid_value")
    first = max(errors, key=lambda err: len(err.get("loc", ()))) if deepest else errors[0]
    param = field_path(first.get("loc", ()), names)
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(": "),
                        None, "invalid_json")  # fmt: skip
    if first.get("type") == "missing" and not param:
        return APIError(400, "the request needs a JSON body", None, "invalid_value")
    got = f", got {json.dumps(first['input'])[:40]}" if "input" in first and first.get("type") != "missing" else ""
    return APIError(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}{got}", param, "invalid_type")


def field_path(loc: Sequence[Any], names: frozenset[str]) -> str | None:
    """A validation error's location as the client names a parameter (`messages[0].content`): field names and
    list indexes, without pydantic's `body` prefix and the union members' tags (`str`, `list[int]`)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in names:
            out += f".{part}" if out else part
    return out or None


@dataclass(frozen=True)
class ErrorShape:
    """How one protocol writes errors: the paths it owns, its error body, how it asks for the API key, and its
    field names (to name a bad field as its clients write it)."""

    prefix: str
    body: Callable[[APIError], dict[str, Any]]
    key_hint: str
    names: frozenset[str]
    deepest: bool = False  # which of several validation errors is reported (validation_error)

    def owns(self, path: str) -> bool:
        return path == self.prefix or path.startswith(self.prefix + "/")

    def invalid(self, errors: Sequence[Any]) -> APIError:
        return validation_error(errors, self.names, deepest=self.deepest)
