"""Connect/read timeouts on every request huggingface_hub makes for us.

Some of its calls (model_info, list_repo_tree) pass no timeout, and its default HTTP client has none:
an endpoint that accepts the connection and never answers would hang a pull forever. A request hook
fills in our limit wherever a request carries none.
"""

from __future__ import annotations

import os
from typing import Any

TIMEOUT_ENV = "LOCALSPEC_HUB_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
_installed: float | None = None


def hub_timeout() -> float:
    """Seconds to wait for a connection or for the next bytes of an answer ($LOCALSPEC_HUB_TIMEOUT)."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        value = DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def install_timeouts(seconds: float) -> None:
    """Make huggingface_hub's shared HTTP client apply `seconds` to any request without a timeout."""
    global _installed
    if _installed == seconds:
        return
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http

    def with_limit(request: Any) -> None:
        given = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {
            phase: given.get(phase) if given.get(phase) is not None else seconds
            for phase in ("connect", "read", "write", "pool")
        }

    def factory() -> Any:
        client = _http.default_client_factory()
        hooks = client.event_hooks
        hooks["request"] = [*hooks.get("request", []), with_limit]
        client.event_hooks = hooks
        return client

    set_client_factory(factory)
    _installed = seconds
