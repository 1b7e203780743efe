"""Response bodies and stream chunks as OpenAI sends them, plus the run's speculative `timings`
(llama-server's names, and what only localspec measures)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localspec import __version__
from localspec.decoding.stats import SpecStats
from localspec.server.schemas import Endpoint
from localspec.server.tools import ArgumentsDelta, CallStart, ContentDelta, ToolCall, ToolEvent

FINGERPRINT = f"localspec-{__version__}"
FINISH_REASONS = {"eog": "stop", "max_tokens": "length", "context": "length", "stopped": "stop"}


def timings(stats: SpecStats) -> dict[str, Any]:
    """llama-server's `timings` (prompt_n counts the prompt tokens evaluated, cache_n those reused;
    predicted_per_second excludes the first token, which the prompt pass produces, as `run` does)
    and the speculative statistics."""
    return {
        "prompt_n": stats.n_prompt - stats.n_prompt_cached,
        "prompt_ms": stats.prompt_s * 1000,
        "prompt_per_second": stats.prompt_tps,
        "cache_n": stats.n_prompt_cached,
        "predicted_n": stats.n_generated,
        "predicted_ms": stats.decode_s * 1000,
        "predicted_per_second": stats.decode_tps,
        "draft_n": stats.n_drafted,
        "draft_n_accepted": stats.n_accepted,
        "acceptance_rate": stats.acceptance_rate,
        "mean_accepted_length": stats.mean_accepted_length,
        "acceptance_by_position": list(stats.acceptance_by_position),
        "drafted_by_position": list(stats.drafted_by_position),
        "accepted_by_position": list(stats.accepted_by_position),
        "rounds": stats.n_rounds,
        "grammar_ms": stats.grammar_s * 1000,  # the grammar matcher's time (response_format, forced tool calls)
        "draft_method": stats.draft_method,
        "draft": stats.draft,
        "k": stats.num_draft,
        "rule": stats.rule,
        "seed": stats.seed,
        # What each round's draft came from: auto's choices (a fixed method has one source).
        "draft_sources": {("plain" if s.source == "none" else s.source): s.rounds for s in stats.sources},
        "auto_choice": stats.choices(),
    }


def usage(stats: SpecStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.n_prompt,
        "completion_tokens": stats.n_generated,
        "total_tokens": stats.n_prompt + stats.n_generated,
        "prompt_tokens_details": {"cached_tokens": stats.n_prompt_cached},
    }


@dataclass
class ResponseIds:
    """The id, creation time and model name every body and chunk of one response repeats."""

    endpoint: Endpoint
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.endpoint == "chat" else "cmpl"
        self.id = self.id or f"{prefix}-{secrets.token_hex(12)}"

    def head(self, *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.endpoint == "chat" else "text_completion") + (
            ".chunk" if chunk and self.endpoint == "chat" else ""
        )
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}  # fmt: skip


def full_response(
    ids: ResponseIds,
    text: str,
    finish_reason: str,
    stats: SpecStats,
    calls: Sequence[ToolCall] = (),
    reasoning: str = "",
) -> dict[str, Any]:
    if ids.endpoint == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if reasoning:  # a reasoning model's thinking, split from the content (reasoning.py)
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                                      "arguments": c.arguments}} for c in calls]  # fmt: skip
        choice = {"index": 0, "message": message, "logprobs": None,
                  "finish_reason": calls_finish_reason(finish_reason, calls)}  # fmt: skip
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**ids.head(chunk=False), "choices": [choice], "usage": usage(stats), "timings": timings(stats)}


def chunk(ids: ResponseIds, *, text: str | None = None, role: bool = False, finish_reason: str | None = None,
          stats: SpecStats | None = None, include_usage: bool = False,
          reasoning: str | None = None) -> dict[str, Any]:  # fmt: skip
    """One stream chunk: the role (first), a text or reasoning delta, or the finish reason with the timings (last)."""
    if ids.endpoint == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta = {"role": "assistant", "content": ""}
        elif reasoning is not None:
            delta = {"reasoning_content": reasoning}
        elif text is not None:
            delta = {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    out = {**ids.head(chunk=True), "choices": [choice]}
    if include_usage:
        out["usage"] = None  # OpenAI: null on every chunk but the usage one
    if stats is not None:
        out["timings"] = timings(stats)
    return out


def calls_finish_reason(finish_reason: str, calls: Sequence[ToolCall]) -> str:
    """OpenAI's "tool_calls" when the answer ended with calls (a cut-short one keeps "length")."""
    return "tool_calls" if calls and finish_reason == "stop" else finish_reason


def tool_chunks(ids: ResponseIds, events: Sequence[ToolEvent], include_usage: bool = False) -> list[dict[str, Any]]:
    """Stream chunks for a tool-reading answer's events: content deltas, then each call as OpenAI streams it
    (its id, type and name with empty arguments first, then the arguments in pieces)."""
    out = []
    for e in events:
        if isinstance(e, ContentDelta):
            out.append(chunk(ids, text=e.text, include_usage=include_usage))
            continue
        if isinstance(e, CallStart):
            call = {"index": e.index, "id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}}
        elif isinstance(e, ArgumentsDelta):
            call = {"index": e.index, "function": {"arguments": e.text}}
        else:
            continue  # a call's end: OpenAI's chunks do not mark it
        body = chunk(ids, include_usage=include_usage)
        body["choices"][0]["delta"] = {"tool_calls": [call]}
        out.append(body)
    return out


def usage_chunk(ids: ResponseIds, stats: SpecStats) -> dict[str, Any]:
    return {**ids.head(chunk=True), "choices": [], "usage": usage(stats), "timings": timings(stats)}


def sse(data: dict[str, Any] | str) -> bytes:
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {body}\n\n".encode()
