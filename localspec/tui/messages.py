"""Messages that worker threads post to the UI. Values only; the handlers live on the screens and the app."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from localspec.decoding.engine import Done
from localspec.options import ModelOptions
from localspec.pipeline import Pipeline
from localspec.tui.models import BackendStatus


@dataclass
class BackendsProbed(Message):
    backends: list[BackendStatus]


@dataclass
class PairChecked(Message):
    key: tuple[str, str, str, str]  # (backend, target, draft, method) that was checked
    ok: bool
    text: str


@dataclass
class MethodsOffered(Message):
    key: tuple[str, str, str]  # (backend, target, draft) the offer is for
    methods: tuple[str, ...]  # what the draft-method list holds: the plain methods, then the head methods that fit
    note: str  # why a head given as draft is not offered ("" when none is held back)


@dataclass
class PipelineLoaded(Message):
    pipeline: Pipeline
    options: ModelOptions


@dataclass
class PipelineFailed(Message):
    options: ModelOptions
    error: str


@dataclass
class ReplyStarted(Message):
    n_prompt: int  # prompt tokens the engine is about to read


class ChunksReady(Message):
    """Engine steps wait in the chat screen's StreamBuffer. Posted once per drain, so a fast model cannot flood
    the queue; a second one still queued merges into the first."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ChunksReady)


@dataclass
class ReplyDone(Message):
    done: Done


@dataclass
class ReplyFailed(Message):
    error: str


@dataclass
class PullProgress(Message):
    pair: str
    fraction: float | None  # None while the total size is unknown
    text: str

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PullProgress) and message.pair == self.pair


@dataclass
class PullFinished(Message):
    pair: str
    error: str | None
