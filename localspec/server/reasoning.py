"""Reasoning models' thinking, split from the answer as it streams: the text inside `<think>...</think>` at
the answer's start becomes `reasoning_content` (llama-server's and DeepSeek's API convention), the rest
the content. Pure text in, text out: no model, no server.

As llama-server reads it: the block opens the answer (whitespace before `<think>` aside), or the prompt
opened it already ("forced open": DeepSeek-R1's and Qwen3's thinking templates end the generation
prompt with `<think>\\n`, so the answer starts inside the block with no opening tag). The reasoning is
stripped of the whitespace around it, as is the content's start after `</think>`; a block never closed
(cut by max_tokens) is all reasoning. A `<think>` later in the answer is content.

Formats (llama-server's `reasoning_format` names): "deepseek" (and "auto", llama-server's default, which
is the same here) split; "none" keeps the block inline in the content, with the prompt's opening tag
written back in front when the prompt opened it, so the content reads as the whole turn.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN = "<think>"
CLOSE = "</think>"
FORMATS = ("deepseek", "auto", "none")
DEFAULT_FORMAT = "deepseek"


@dataclass(frozen=True)
class Split:
    """What one piece of the answer's text adds to the reasoning and to the content."""

    reasoning: str = ""
    content: str = ""


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of reasoning on its way to the client (plain `str` pieces are content)."""

    text: str


@dataclass(frozen=True)
class ReasoningPlan:
    """How a request's answer is split: its format, and the prompt's opening tag when the prompt opened it."""

    fmt: str = DEFAULT_FORMAT
    opened: str = ""

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.fmt, opened=self.opened)


def opened_in_prompt(prompt_tail: str) -> str:
    """The opening tag and what follows it when the prompt ends inside a think block ("<think>\\n"), else ""."""
    at = prompt_tail.rfind(OPEN)
    if at < 0 or prompt_tail[at + len(OPEN) :].strip():
        return ""
    return prompt_tail[at:]


def template_thinks(template: str) -> bool:
    """A chat template that writes think blocks (Qwen3's, DeepSeek-R1's): its model may think."""
    return OPEN in template or CLOSE in template


class ReasoningSplitter:
    """Feed the answer's text as it comes; get back the reasoning and content each piece adds. A tag split
    across pieces is held until it is known; so is whitespace that may end the reasoning."""

    def __init__(self, fmt: str = DEFAULT_FORMAT, *, opened: str = "") -> None:
        self.split = fmt != "none"
        self._prefix = "" if self.split else opened  # "none": the prompt's opening tag, given back inline
        self._state = "thinking" if self.split and opened else "start"
        self._buf = ""
        self._ws = ""  # whitespace inside the reasoning, held until more reasoning follows it
        self._reasoned = False  # some reasoning went out (its leading whitespace is dropped before that)
        self.reasoning: list[str] = []
        self.content: list[str] = []

    def feed(self, text: str) -> Split:
        if not self.split:
            text, self._prefix = self._prefix + text, ""
            return self._out("", text)
        self._buf += text
        return getattr(self, f"_on_{self._state}")()

    def finish(self) -> Split:
        """The answer ended: held text goes where it belongs (an unclosed block is reasoning)."""
        buf, self._buf = self._buf, ""
        if not self.split:
            out, self._prefix = self._prefix, ""
            return self._out("", out)
        if self._state == "start":
            return self._out("", buf)
        if self._state == "thinking":
            return self._out(self._reason(buf.rstrip()), "")
        return Split()

    # -- states ---------------------------------------------------------------------------------------

    def _on_start(self) -> Split:
        """Nothing but whitespace yet: the answer may still open a block."""
        head = self._buf.lstrip()
        if head.startswith(OPEN):
            self._buf, self._state = head[len(OPEN) :], "thinking"
            return self._on_thinking()
        if OPEN.startswith(head):
            return Split()  # "", "  <thi": wait for more
        buf, self._buf, self._state = self._buf, "", "content"
        return self._out("", buf)

    def _on_thinking(self) -> Split:
        at = self._buf.find(CLOSE)
        if at >= 0:
            reasoning = self._reason(self._buf[:at].rstrip())
            self._buf, self._state, self._ws = self._buf[at + len(CLOSE) :], "after", ""
            return self._out(reasoning, self._content_start())
        keep = _partial_tail(self._buf, CLOSE)
        text, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return self._out(self._reason(text), "")

    def _on_after(self) -> Split:
        return self._out("", self._content_start())

    def _content_start(self) -> str:
        """After `</think>`: the content, without its leading whitespace."""
        rest, self._buf = self._buf.lstrip(), ""
        if rest:
            self._state = "content"
        return rest

    def _on_content(self) -> Split:
        buf, self._buf = self._buf, ""
        return self._out("", buf)

    # -- output ---------------------------------------------------------------------------------------

    def _reason(self, text: str) -> str:
        """Reasoning text to send: without its leading whitespace, and with trailing whitespace held back."""
        if not self._reasoned:
            text = text.lstrip()
        if not text.strip():
            self._ws += text if self._reasoned else ""
            return ""
        body = text.rstrip()
        out, self._ws = self._ws + body, text[len(body) :]
        self._reasoned = True
        return out

    def _out(self, reasoning: str, content: str) -> Split:
        if reasoning:
            self.reasoning.append(reasoning)
        if content:
            self.content.append(content)
        return Split(reasoning, content)


def split_answer(text: str, fmt: str = DEFAULT_FORMAT, *, opened: str = "") -> Split:
    """(reasoning, content) of a whole answer: what the stream splitter gives, put together."""
    splitter = ReasoningSplitter(fmt, opened=opened)
    splitter.feed(text)
    splitter.finish()
    return Split("".join(splitter.reasoning), "".join(splitter.content))


def _partial_tail(buf: str, tag: str) -> int:
    """Length of the longest tail of buf that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            return n
    return 0
