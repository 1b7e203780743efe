"""Constrained decoding: keep every token inside a grammar (a JSON schema, any JSON object, or a Lark grammar).

A `GrammarSpec` says what the answer must match. The engine (decoding/engine.py) compiles it against the
target's vocabulary with llguidance and masks the target's logits with it: the distribution kept exact by
speculative decoding is then the target's *masked and renormalised* one. Kinds:

- `json_object`: any JSON object (`text` unused);
- `json_schema`: `text` is the schema as JSON text (llguidance's JSON Schema subset; an unknown keyword or
  a type it cannot compile is refused with the reason);
- `lark`: `text` is an llguidance Lark grammar. A rule may embed a JSON schema inline with `%json{...}`,
  which is how a tool call is written between literal tags (this example compiles; tests check it):

      start: "<tool_call>\\n" %json{"type": "object", "properties": {"name": {"const": "get_weather"},
          "arguments": {"type": "object", "properties": {"city": {"type": "string"}},
          "required": ["city"]}}, "required": ["name", "arguments"]} "\\n</tool_call>"

  In Python: `GrammarSpec("lark", 'start: "<tool_call>\\\\n" %json ' + json.dumps(schema) + ' "\\\\n</tool_call>"')`:
  the braces after `%json` are the schema object's own (do not add another pair), and the Lark text holds
  the two characters backslash-n inside its string literals; `json_between(before, schema, after)` builds
  exactly this, with the schema passed through `bounded` (whitespace between JSON tokens bounded, as the
  json kinds have it by default: unbounded, a model can pad with whitespace forever). Alternatives are
  `a | b`, repetition `x*`, `x+`, `x?`, regexes `/[0-9]+/`; the full syntax is llguidance's Lark dialect.

How the engine uses a `Constraint` (one per generation, a copy of a cached compiled matcher):
`walk(draft)` computes the mask of every verified row (row i after draft[:i]) and consumes the draft up to
its first forbidden token, which ends the draft there (as does a token that completes the grammar); after
verification `commit(n_back, token)` rolls the matcher back to the accepted prefix and consumes the emitted token.
End-of-generation tokens are allowed exactly when the grammar accepts; once the grammar can take nothing more, only
they are (`finished`), and the answer ends there: plain decoding draws nothing after the token that completed it,
and the engine draws nothing after accepted drafts that completed it (the row after them may hold no possible
token, when the target gives its end tokens no probability there).

Compiled tokenizers are cached per backend object (one per loaded vocabulary), compiled grammars per
(vocabulary, spec). Backends describe their vocabulary with `token_table()` (localspec/backends/base.TokenTable).
"""

from __future__ import annotations

import json
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from localspec.backends.base import TokenTable
from localspec.errors import UsageError

Kind = Literal["json_schema", "json_object", "lark"]
KINDS: tuple[str, ...] = ("json_schema", "json_object", "lark")
_MAX_COMPILED = 32  # compiled grammars kept (per process), most recently used first
# Whitespace between JSON tokens: one space, or up to two newlines and an indentation (llama.cpp's json
# grammars bound it the same way). Unbounded whitespace lets a model that wants to stop early (a required key
# still missing) pad forever instead of writing the key. A schema's own "x-guidance" options win.
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,40})?"
_JSON_DEFAULTS = {"whitespace_pattern": JSON_WHITESPACE}
_HINT = "fix the schema or grammar (llguidance takes most of JSON Schema, and its own Lark dialect)"


@dataclass(frozen=True)
class GrammarSpec:
    kind: Kind
    text: str = ""  # the JSON schema (as JSON text) for json_schema; a llguidance Lark grammar for lark

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"unknown grammar kind {self.kind!r}", f"choose one of: {', '.join(KINDS)}")


def json_object() -> GrammarSpec:
    return GrammarSpec("json_object")


def json_schema(schema: Any) -> GrammarSpec:
    """A spec from a schema given as a dict (or JSON text)."""
    return GrammarSpec("json_schema", schema if isinstance(schema, str) else json.dumps(schema))


def json_between(before: str, schema: Any, after: str) -> GrammarSpec:
    """A Lark spec: the literal `before`, a JSON value matching `schema` (a dict), the literal `after`; e.g.
    json_between("<tool_call>\\n", call_schema, "\\n</tool_call>")."""
    return GrammarSpec("lark", f"start: {json.dumps(before)} %json {json.dumps(bounded(schema))} {json.dumps(after)}")


def bounded(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with JSON_WHITESPACE as its whitespace unless it sets its own ("x-guidance"), for a schema
    embedded in a Lark grammar with %json (json_schema specs get it by default)."""
    options = schema.get("x-guidance") or {}
    return {**schema, "x-guidance": {**_JSON_DEFAULTS, **options}}


# -- compiling ----------------------------------------------------------------------------------------


def llguidance_grammar(spec: GrammarSpec) -> str:
    """The llguidance grammar text for a spec (not yet checked: see check)."""
    import llguidance

    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_DEFAULTS)
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.text)
        except ValueError as e:
            raise UsageError(f"the JSON schema is not valid JSON: {e}", "send the schema as a JSON object") from None
        if not isinstance(schema, dict):
            raise UsageError("the JSON schema must be a JSON object", 'e.g. {"type": "object", "properties": {...}}')
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_DEFAULTS)
    return llguidance.LLMatcher.grammar_from_lark(spec.text)


def check(spec: GrammarSpec) -> None:
    """UsageError with llguidance's reason when the spec cannot compile (no vocabulary needed)."""
    import llguidance

    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(llguidance_grammar(spec))
    if failed:
        raise UsageError(f"the {_what(spec)} cannot be compiled: {_first_line(messages)}", _HINT)


def _what(spec: GrammarSpec) -> str:
    return {"json_schema": "JSON schema", "json_object": "JSON object grammar", "lark": "Lark grammar"}[spec.kind]


def _first_line(messages: Sequence[str]) -> str:
    text = " ".join(m.strip() for m in messages if m.strip()) or "no reason given"
    return text.splitlines()[0][:500]


class _Tokenize:
    """llguidance's callback for tokenizing text; holds the backend weakly (the cache must not keep it alive)."""

    def __init__(self, table: TokenTable) -> None:
        self._fn = weakref.WeakMethod(table.tokenize) if hasattr(table.tokenize, "__self__") else None
        self._plain = None if self._fn is not None else table.tokenize

    def __call__(self, text: str) -> list[int]:
        if isinstance(text, bytes):
            raise TypeError("text only")  # llguidance probes with bytes first; it then sends str
        fn = self._fn() if self._fn is not None else self._plain
        return [] if fn is None else list(fn(text))


class _Wrapper:
    """What llguidance.TokenizerWrapper reads (tokens as bytes, specials marked with a leading 0xff)."""

    def __init__(self, table: TokenTable) -> None:
        assert table.pieces is not None
        self.tokens = list(table.pieces)
        self.eos_token_id = min(table.eog)
        self.bos_token_id = None
        self.special_token_ids = [i for i, p in enumerate(self.tokens) if p.startswith(b"\xff")]
        self._tokenize = _Tokenize(table)

    def __call__(self, text: str) -> list[int]:
        return self._tokenize(text)


_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_COMPILED: OrderedDict[tuple[Any, GrammarSpec], Any] = OrderedDict()


def tokenizer_for(backend: Any) -> Any:
    """The llguidance tokenizer of a backend's vocabulary (built once per backend: about a second)."""
    cached = _TOKENIZERS.get(backend)
    if cached is None:
        cached = _TOKENIZERS[backend] = _build_tokenizer(_table(backend))
    return cached


def _table(backend: Any) -> TokenTable:
    table_fn = getattr(backend, "token_table", None)
    if table_fn is None:
        raise UsageError(
            f"the {backend.info.backend} backend cannot constrain output to a grammar",
            "drop response_format (or the grammar), or use a llama.cpp or MLX model",
        )
    table: TokenTable = table_fn()
    if not table.eog:
        raise UsageError(f"{backend.info.name} has no end-of-generation token, which a grammar needs", _HINT)
    return table


def _build_tokenizer(table: TokenTable) -> Any:
    import llguidance

    eos = sorted(table.eog)
    if table.hf_json is not None:
        return llguidance.LLTokenizer(table.hf_json, n_vocab=table.n_vocab, eos_token=eos)
    wrapper = llguidance.TokenizerWrapper(_Wrapper(table))
    return llguidance.LLTokenizer(wrapper, n_vocab=table.n_vocab, eos_token=eos)


def prepare(backend: Any, spec: GrammarSpec) -> None:
    """Compile `spec` for the backend's vocabulary now (cached), so a generation starts at once; UsageError
    when it cannot compile."""
    _template(backend, spec)


def _template(backend: Any, spec: GrammarSpec) -> Any:
    """The cached compiled matcher at the grammar's start (never advanced: generations use copies)."""
    import llguidance

    tok = tokenizer_for(backend)
    key = (tok, spec)  # the tokenizer itself, not its id: an id can be reused once it is freed
    template = _COMPILED.get(key)
    if template is None:
        template = llguidance.LLMatcher(tok, llguidance_grammar(spec), log_level=0)
        if template.is_error():
            raise UsageError(f"the {_what(spec)} cannot be compiled: {_first_line([template.get_error()])}", _HINT)
        _COMPILED[key] = template
        while len(_COMPILED) > _MAX_COMPILED:
            _COMPILED.popitem(last=False)
    _COMPILED.move_to_end(key)
    return template


# -- one generation -----------------------------------------------------------------------------------


class Constraint:
    """The grammar's state over one generation: masks for the target's rows, advanced and rolled back."""

    def __init__(self, backend: Any, spec: GrammarSpec) -> None:
        self.spec = spec
        self._matcher = _template(backend, spec).deep_copy()
        self.n_vocab = int(backend.n_vocab)
        self._eog = frozenset(backend.eog_ids)
        self._eog_only = np.zeros(self.n_vocab, dtype=bool)
        self._eog_only[[t for t in self._eog if t < self.n_vocab]] = True
        self._walked = 0  # tokens the last walk consumed (an end token ends a draft and is never consumed)
        # The matcher's own time (masks, consumes, rollbacks) and masks computed: what the grammar costs a
        # run, read into SpecStats.grammar_s (a clock read is ~50 ns against a mask's ~0.1 ms).
        self.busy_s = 0.0
        self.n_masks = 0

    def mask(self) -> np.ndarray:
        """Allowed tokens [n_vocab] (bool) in the current state."""
        if self._matcher.is_stopped():
            return self._eog_only.copy()
        t0 = time.perf_counter()
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self.n_vocab].view(bool)
        if allowed.shape[0] < self.n_vocab:
            allowed = np.pad(allowed, (0, self.n_vocab - allowed.shape[0]))
        self.busy_s += time.perf_counter() - t0
        self.n_masks += 1
        self._raise_on_error()
        return allowed

    def walk(self, draft: Sequence[int]) -> tuple[np.ndarray, int]:
        """Masks [m+1, n_vocab] for the rows grading draft[:m] and the one after, where m is the length of the
        draft's allowed prefix, which ends at a token that completes the grammar (nothing may follow it: then
        `finished`); the matcher is left after draft[:m] (commit rolls it back)."""
        rows = [self.mask()]
        self._walked = 0
        for d in draft:
            if not (0 <= d < self.n_vocab and rows[-1][d]):
                break
            if d in self._eog:  # the answer would end here: its next row is never used
                rows.append(self._eog_only.copy())
                break
            self._consume(d)
            self._walked += 1
            rows.append(self.mask())
            if self.finished:
                break
        return np.stack(rows), len(rows) - 1

    def commit(self, n_accepted: int, token: int) -> None:
        """After a walk: back to the accepted draft prefix (the rejected rest undone), then the emitted token."""
        n_back = self._walked - min(n_accepted, self._walked)
        self._walked = 0
        t0 = time.perf_counter()
        rolled = n_back <= 0 or self._matcher.rollback(n_back)
        self.busy_s += time.perf_counter() - t0
        if not rolled:
            self._raise_on_error()
        self.advance(token)

    def advance(self, token: int) -> None:
        """Take one emitted token (an end token is not fed: the answer ends with it)."""
        if token not in self._eog:
            self._consume(token)

    @property
    def finished(self) -> bool:
        """The grammar can take no further token (only end-of-generation)."""
        return bool(self._matcher.is_stopped())

    def _consume(self, token: int) -> None:
        t0 = time.perf_counter()
        ok = self._matcher.consume_token(int(token))
        self.busy_s += time.perf_counter() - t0
        if not ok:
            self._raise_on_error()

    def _raise_on_error(self) -> None:
        if self._matcher.is_error():
            raise UsageError(
                f"the {_what(self.spec)} failed during generation: {_first_line([self._matcher.get_error()])}",
                "simplify the schema or grammar",
            )


def apply_mask(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Logits [n, V] with the forbidden tokens at -inf (a new array: the backend may reuse its own)."""
    out = np.full(logits.shape, -np.inf, dtype=np.float32)
    np.copyto(out, logits, where=_fit(allowed, logits.shape[-1]))  # 3x faster than np.where on a 150k row
    return out


def mask_q(q: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A model draft's rows [m, Vq] restricted to the allowed tokens of the same rows and renormalised:
    the draft tokens kept are distributed so (the forbidden ones cut the draft), which keeps the rule exact."""
    kept = np.where(_fit(allowed[: q.shape[0]], q.shape[1]), q, 0.0)
    total = kept.sum(axis=1, keepdims=True)
    return np.divide(kept, total, out=np.zeros_like(kept), where=total > 0)


def _fit(allowed: np.ndarray, width: int) -> np.ndarray:
    """A mask [..., V] cut or padded (with False) to `width` columns."""
    v = allowed.shape[-1]
    if v == width:
        return allowed
    if v > width:
        return allowed[..., :width]
    pad = [(0, 0)] * (allowed.ndim - 1) + [(0, width - v)]
    return np.pad(allowed, pad)
