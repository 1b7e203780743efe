"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localspec.errors import ContextOverflowError, LocalspecError, UsageError

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
