"""A conversation's messages as the backends' chat templates read them (a module of its own: both the
backend protocol and the template code use them, and neither may import the other for it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatToolCall:
    """A function call an assistant turn made (OpenAI's tool_calls entry)."""

    id: str
    name: str
    arguments: dict[str, Any]  # templates write them with `tojson`, so an object, as Hugging Face passes them


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: tuple[ChatToolCall, ...] = ()  # an assistant turn's calls
    tool_call_id: str = ""  # a tool turn: the call it answers
    name: str = ""  # a tool turn: the function that answered (some templates write it)
    reasoning_content: str = ""  # an assistant turn's thinking (templates that use it write it, others drop it)

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (Hugging Face's and llama.cpp's shape)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        return out
