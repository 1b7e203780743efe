"""Reading tool calls out of an answer, whole or streamed as it is generated: content deltas, then each call
as its start (id and name), its arguments in pieces and its end (ToolStreamParser), in one of the call
formats of formats.py."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.server.tools.formats import ARGS_KEYS, Lead, ToolCall, ToolFormat, new_call_id
from localspec.server.tools.grammar import FunctionSpec


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    """A call is whole: its arguments have all been sent (a call cut short by the answer's end ends too)."""

    index: int
    call: ToolCall


ToolEvent = ContentDelta | CallStart | ArgumentsDelta | CallEnd

_HEAD = re.compile(
    r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,'
    r'\s*"(?:arguments|parameters)"\s*:\s*(?=\S)'
)
_HEAD_WITHIN = 240  # a call whose name and arguments key do not open it is read whole, once it ends


class ToolStreamParser:
    """Feed an answer's text as it comes; get content deltas and calls (its name first, then chunks of its
    arguments, then its end). Text that could still become a call's marker is held back until it is known. With
    `max_calls`, everything after that many calls is dropped (`done` says so: the generation may stop). With
    `names`, a call to a function not among them is not a call: the model wrote text that looks like one, and
    it goes out as content (an agent must never receive a call to a function it did not offer).

    Whitespace between content and a call is dropped, and so is whitespace after the last call."""

    def __init__(self, fmt: ToolFormat, max_calls: int | None = None, names: frozenset[str] | None = None) -> None:
        self.fmt = fmt
        self.max_calls = max_calls
        self.names = names
        self.calls: list[ToolCall] = []
        self.content: list[str] = []
        self._buf = ""
        self._state = "content"
        self._at_start = True  # nothing but whitespace has come yet: a lead may open a block
        self._close = fmt.close  # what ends the block open now
        self._marker = ""  # the marker that opened it, given back as content if no call follows
        self._ws = ""  # whitespace after the content sent, held until more content comes
        self._ws_before = ""  # ... as it was when a call began (given back with it if it is not a call)
        self._out: list[ToolEvent] = []
        self._call = _CallScan()

    @property
    def done(self) -> bool:
        return self.max_calls is not None and len(self.calls) >= self.max_calls and self._state == "done"

    def feed(self, text: str) -> list[ToolEvent]:
        self._buf += text
        while self._buf and self._step():
            pass
        return self._take()

    def finish(self) -> list[ToolEvent]:
        """The answer ended: held text goes out as content; a call cut short keeps what it had."""
        if self._state == "content":
            self._content(self._buf)
        elif self._state == "object":
            self._end_call(complete=False)
        elif self._state == "block":
            self._content(self._marker)  # a marker and nothing after it
        self._buf = ""
        if not self.calls and self._ws:
            self._emit(ContentDelta(self._ws))
        self._ws = ""
        self._state = "done"
        return self._take()

    # -- states ---------------------------------------------------------------------------------------

    def _step(self) -> bool:
        """Consume what the current state can from the buffer; False when it must wait for more text."""
        return getattr(self, f"_on_{self._state}")()

    def _on_content(self) -> bool:
        buf = self._buf
        if self._at_start and self.fmt.leads:
            lead = _lead_state(buf, self.fmt.leads)
            if lead == "maybe":
                return False
            if isinstance(lead, Lead):
                self._buf = _skip(buf, lead.fence)
                self._state, self._close = "block", lead.close
                return True
        hit = min(((i, m) for m in self.fmt.opens if (i := buf.find(m)) >= 0), default=None)
        if hit is not None:
            i, marker = hit
            self._content(buf[:i])
            self._buf = buf[i + len(marker) :]
            self._state, self._close, self._marker = "block", self.fmt.close, marker
            return True
        keep = _partial_tail(buf, self.fmt.opens)
        self._content(buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep :]
        return False

    def _on_block(self) -> bool:
        """After a marker (or at a lead): the block's JSON opens."""
        rest = self._buf.lstrip()
        if not rest:
            return False
        if self.fmt.array:
            if rest[0] != "[":
                return self._not_a_call(self._buf)
            self._buf = rest[1:]
            self._state = "item"
            return True
        if rest[0] != "{":
            return self._not_a_call(self._buf)
        self._marker += self._buf[: len(self._buf) - len(rest)]  # given back whole if no call follows
        self._buf = rest
        self._begin_call()
        return True

    def _on_item(self) -> bool:
        """Inside an array block: the next call, or the array's end."""
        rest = self._buf.lstrip()
        if not rest:
            self._buf = ""
            return False
        if rest[0] == "{":
            self._buf = rest
            self._begin_call()
        elif rest[0] == "]":
            self._buf = rest[1:]
            self._state = "content"
        else:
            self._buf = rest
            self._state = "content"
        return True

    def _on_object(self) -> bool:
        used, finished = self._call.feed(self._buf)
        self._buf = self._buf[used:]
        self._stream_call()
        if self._state != "object":  # a call to a function not offered: given back as content
            return True
        if finished:
            self._end_call(complete=True)
            return True
        return False

    def _on_after(self) -> bool:
        """After a call: what ends the block, or the next call in it."""
        rest = self._buf.lstrip()
        if not rest:
            self._buf = ""
            return False
        fmt = self.fmt
        if fmt.array:
            if rest[0] == ",":
                self._buf, self._state = rest[1:], "item"
            else:
                self._buf, self._state = (rest[1:] if rest[0] == "]" else rest), "content"
            return True
        if self._close:
            if rest.startswith(self._close):
                self._buf, self._state = rest[len(self._close) :], "content"
                return True
            if self._close.startswith(rest):
                self._buf = rest
                return False
        if not self._close and rest[0] in fmt.chain + "{":  # the next call of a block without a closing marker
            self._buf = rest[1:] if rest[0] in fmt.chain else rest
            self._state = "block"
            return True
        self._buf, self._state = rest, "content"
        return True

    def _on_done(self) -> bool:
        self._buf = ""
        return False

    # -- one call -------------------------------------------------------------------------------------

    def _begin_call(self) -> None:
        self._call = _CallScan()
        self._state = "object"
        self._at_start = False
        self._ws_before, self._ws = self._ws, ""

    def _stream_call(self) -> None:
        scan = self._call
        if not scan.started and scan.name is not None:
            if not self._offered(scan.name):
                self._give_back(scan.text)
                return
            scan.started = True
            scan.id = new_call_id()
            self._emit(CallStart(len(self.calls), scan.id, scan.name))
        if scan.started:
            text = scan.take_arguments()
            if text:
                self._emit(ArgumentsDelta(len(self.calls), text))

    def _end_call(self, *, complete: bool) -> None:
        scan = self._call
        if not scan.started:
            whole = _read_call(scan.text) if complete else None
            if whole is None or not self._offered(whole[0]):  # not a call after all: the text stays content
                self._give_back(scan.text)
                return
            scan.started, scan.id, scan.name = True, new_call_id(), whole[0]
            self._emit(CallStart(len(self.calls), scan.id, whole[0]))
            self._emit(ArgumentsDelta(len(self.calls), whole[1]))
            scan.args_sent = whole[1]
        else:
            self._stream_call()
            scan.finish_arguments()
            tail = scan.take_arguments()
            if tail:
                self._emit(ArgumentsDelta(len(self.calls), tail))
        assert scan.name is not None
        self._marker = ""
        self.calls.append(ToolCall(scan.id, scan.name, scan.args_sent))
        self._emit(CallEnd(len(self.calls) - 1, self.calls[-1]))
        full = self.max_calls is not None and len(self.calls) >= self.max_calls
        self._state = "done" if full else "after"

    def _offered(self, name: str) -> bool:
        return self.names is None or name in self.names

    def _give_back(self, text: str) -> None:
        """What looked like a call (its marker and `text`) is content after all."""
        self._state = "content"
        self._ws = self._ws_before
        self._content(self._marker + text)
        self._marker = ""

    def _not_a_call(self, rest: str) -> bool:
        self._content(self._marker)
        self._buf, self._state, self._marker = rest, "content", ""
        return True

    # -- output ---------------------------------------------------------------------------------------

    def _content(self, text: str) -> None:
        if not text:
            return
        if self._at_start and not text.strip():
            self._ws += text
            return
        self._at_start = False
        body = (self._ws + text).rstrip()
        self._ws = (self._ws + text)[len(body) :]
        if body:
            self._emit(ContentDelta(body))

    def _emit(self, event: ToolEvent) -> None:
        if isinstance(event, ContentDelta):
            self.content.append(event.text)
        self._out.append(event)

    def _take(self) -> list[ToolEvent]:
        out, self._out = self._out, []
        return out


@dataclass
class _CallScan:
    """One call's JSON object as it arrives: where it ends, its name once known, its arguments' text."""

    text: str = ""
    depth: int = 0
    in_str: bool = False
    esc: bool = False
    name: str | None = None
    started: bool = False
    id: str = ""
    args_at: int = -1  # where the arguments' value starts in `text`
    args_end: int = -1  # where it ends (exclusive), once known
    args_kind: str = ""  # "{" / "[" (streamed as written), '"' (a JSON string holding JSON), "=" (other)
    args_sent: str = ""
    string_sent: bool = False

    def feed(self, buf: str) -> tuple[int, bool]:
        """Take characters from buf up to the object's end; (how many were taken, whether it ended)."""
        for i, ch in enumerate(buf):
            self.text += ch
            self._scan(ch)
            if self.name is None and self.args_at < 0 and len(self.text) <= _HEAD_WITHIN and not ch.isspace():
                self._find_head()
            if self.depth == 0 and self.text.strip():
                return i + 1, True
        return len(buf), False

    def _scan(self, ch: str) -> None:
        pos = len(self.text) - 1
        in_args = self.args_at >= 0 and self.args_end < 0 and pos >= self.args_at
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
                if in_args and self.args_kind == '"' and self.depth == 1:
                    self.args_end = pos + 1
            return
        if ch == '"':
            self.in_str = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            if in_args and self.args_kind in "{[" and self.depth == 1:
                self.args_end = pos + 1
        if in_args and self.args_kind == "=" and self.depth <= 1 and ch in ",}":
            self.args_end = pos

    def _find_head(self) -> None:
        m = _HEAD.match(self.text.lstrip())
        if m is None:
            return
        try:
            name = json.loads(m.group(1))
        except ValueError:
            return
        offset = len(self.text) - len(self.text.lstrip())
        self.name = name
        self.args_at = offset + m.end()
        first = self.text[self.args_at : self.args_at + 1]
        self.args_kind = first if first in '{["' else "="

    def take_arguments(self) -> str:
        """The arguments' text not yet handed out (a string value only once it is whole, decoded)."""
        if self.args_at < 0:
            return ""
        if self.args_kind == '"':
            if self.args_end < 0 or self.string_sent:
                return ""
            try:
                value = json.loads(self.text[self.args_at : self.args_end])
            except ValueError:
                value = self.text[self.args_at : self.args_end]
            self.args_sent = value if isinstance(value, str) else json.dumps(value)
            self.string_sent = True
            return self.args_sent
        end = self.args_end if self.args_end >= 0 else len(self.text)
        text = self.text[self.args_at : end]
        if self.args_kind == "=":
            text = text.rstrip()
        new = text[len(self.args_sent) :] if text.startswith(self.args_sent) else ""
        self.args_sent += new
        return new

    def finish_arguments(self) -> None:
        if self.args_at >= 0 and self.args_end < 0:
            self.args_end = len(self.text)


def _read_call(text: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of a whole call object written in another key order, or None."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    args = next((obj[k] for k in ARGS_KEYS if k in obj), {})
    if not isinstance(name, str):
        return None
    return name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _lead_state(buf: str, leads: Sequence[Lead]) -> Lead | str:
    """The lead buf (whitespace aside) starts with, "maybe" while it could still, else "no"."""
    text = "".join(buf.split())
    maybe = False
    for lead in leads:
        whole = lead.fence + lead.start
        if text.startswith(whole):
            return lead
        maybe = maybe or whole.startswith(text)
    return "maybe" if maybe else "no"


def _skip(buf: str, fence: str) -> str:
    """buf after `fence`, whitespace anywhere in between not counting."""
    i = 0
    for ch in fence:
        while buf[i].isspace():
            i += 1
        i += buf[i] == ch
    return buf[i:]


def _partial_tail(buf: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of buf that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(buf)), best, -1):
            if buf.endswith(m[:n]):
                best = n
                break
    return best


@dataclass(frozen=True)
class ToolPlan:
    """How a request's answer is read: the served model's call format, and at most how many calls."""

    fmt: ToolFormat
    max_calls: int | None = None  # 1 for parallel_tool_calls false
    names: frozenset[str] | None = None  # the functions offered: a "call" to another one is content
    functions: tuple[FunctionSpec, ...] = field(default=(), compare=False)  # their schemas, to check calls against

    def parser(self) -> ToolStreamParser:
        return ToolStreamParser(self.fmt, self.max_calls, self.names)


def parse_answer(
    text: str, fmt: ToolFormat, max_calls: int | None = None, names: frozenset[str] | None = None
) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole answer: what the stream parser gives, put together."""
    parser = ToolStreamParser(fmt, max_calls, names)
    parser.feed(text)
    parser.finish()
    return "".join(parser.content), parser.calls
