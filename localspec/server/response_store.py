"""The Responses API's stored responses (`store`, `previous_response_id`): the most recent ones in memory, the
oldest forgotten first. A stored response keeps its body (GET /v1/responses/{id}) and the conversation it
ended, as chat messages, so that a follow-up naming it reads that conversation before its own input.
Nothing is written to disk: a restart forgets them all, and a follow-up naming one is then a 400."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

STORE_SIZE = 64  # responses kept; an agent's conversation names only its last one


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as it was returned
    messages: tuple[dict[str, Any], ...]  # the conversation up to and with its answer (instructions left out)


class ResponseStore:
    def __init__(self, size: int = STORE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        with self._lock:
            self._items[response_id] = stored
            self._items.move_to_end(response_id)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            stored = self._items.get(response_id)
            if stored is not None:
                self._items.move_to_end(response_id)  # a conversation still going on is kept
            return stored

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None
