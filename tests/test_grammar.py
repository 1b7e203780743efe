"""Constrained decoding (decoding/grammar.py) inside exact speculative decoding.

The exactness test runs the engine on a toy pair whose draft proposes tokens the grammar forbids, and
compares the joint distribution of the output with the target's conditionals masked by the grammar and
renormalised (the masks from a hand-written state machine, not from llguidance). A draft distribution left
unmasked in the acceptance ratio must fail the same check.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeBackend, hashed_logits, scripted_tokens, without
from test_verify import joint_check

from localspec.backends.base import TokenTable
from localspec.decoding import grammar
from localspec.decoding.drafters import ModelDrafter, NgramDrafter, NoDrafter
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.grammar import GrammarSpec
from localspec.errors import UsageError
from localspec.sampling import SamplingParams

# -- the toy pair: letters a b c d and an end token the target never picks ---------------------------------

LETTERS = b"abcd"
EOG = 4
V = 5
K = 2
WINDOW = K + 2  # the prefill's token, then one full round
N_SAMPLES = 5000
# Items "ab", "ac", "c", "d", repeated: "b" only right after "a", and after "a" only "b" or "c".
TOY_LARK = 'start: item*\nitem: "ab" | "ac" | "c" | "d"'
TOY = GrammarSpec("lark", TOY_LARK)


def _allowed(state: int) -> list[int]:
    """The reference grammar: state 0 between items, 1 after an "a"."""
    return [0, 2, 3, EOG] if state == 0 else [1, 2]


def _next_state(state: int, token: int) -> int:
    return 1 if state == 0 and token == 0 else 0


class ToyBackend(FakeBackend):
    def token_table(self) -> TokenTable:
        pieces = [bytes([c]) for c in LETTERS] + [b"\xff<eog>"]
        return TokenTable(n_vocab=V, eog=frozenset({EOG}), pieces=pieces, tokenize=self._letters)

    def _letters(self, text: str) -> list[int]:
        return [LETTERS.index(c) for c in text.encode()]


def _normalize(rows: np.ndarray) -> np.ndarray:
    return rows / rows.sum(axis=-1, keepdims=True)


def _target_table() -> np.ndarray:
    """p(x | a, b) over the last two tokens: every letter possible, the end token never."""
    p = np.random.default_rng(20261203).dirichlet(np.full(4, 0.9), size=(4, 4))
    return np.concatenate([p, np.zeros((4, 4, 1))], axis=-1)


P_TABLE = _target_table()
# q(x | b): much of its mass on what the grammar forbids ("b" first, "a"/"d" after an "a").
Q_TABLE = _normalize(
    np.array(
        [
            [0.40, 0.05, 0.15, 0.40, 0.0],
            [0.30, 0.50, 0.10, 0.10, 0.0],
            [0.20, 0.40, 0.20, 0.20, 0.0],
            [0.25, 0.30, 0.15, 0.30, 0.0],
        ]
    )
)


def _log(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(p).astype(np.float32)


def _target_fn(ctx: Sequence[int]) -> np.ndarray:
    return _log(P_TABLE[ctx[-2] if len(ctx) > 1 else 0, ctx[-1]])


def _draft_fn(ctx: Sequence[int]) -> np.ndarray:
    return _log(Q_TABLE[ctx[-1]])


PROMPT = [2, 3]  # "cd": the grammar starts fresh after it


def _expected_joint(n: int) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(V), repeat=n):
        ctx, state, prob = list(PROMPT), 0, 1.0
        for x in seq:
            allowed = _allowed(state)
            row = P_TABLE[ctx[-2], ctx[-1]]
            prob *= row[x] / row[allowed].sum() if x in allowed else 0.0
            if prob == 0.0:
                break
            ctx.append(x)
            state = _next_state(state, x)
        out[seq] = prob
    return out


def _draw(drafter_kind: str, rule: str):  # type: ignore[no-untyped-def]
    target = ToyBackend(_target_fn, n_vocab=V, eog=frozenset({EOG}), name="toy-target")
    if drafter_kind == "model":
        drafter = ModelDrafter(ToyBackend(_draft_fn, n_vocab=V, eog=frozenset({EOG}), name="toy-draft"))
    else:
        drafter = NgramDrafter(max_ngram=2)

    def draw(seed: int) -> tuple[int, ...]:
        sampling = SamplingParams(temperature=1.0, seed=seed)
        config = GenerationConfig(max_tokens=WINDOW, num_draft=K, rule=rule, sampling=sampling, grammar=TOY)
        done = [e for e in generate(target, drafter, PROMPT, config) if isinstance(e, Done)][0]
        return done.tokens

    return draw


def test_reference_grammar_agrees_with_llguidance() -> None:
    """The hand-written state machine is the grammar llguidance compiles (so the expected joint is right)."""
    target = ToyBackend(_target_fn, n_vocab=V, eog=frozenset({EOG}))
    c = grammar.Constraint(target, TOY)
    state = 0
    for token in [0, 1, 2, 3, 0, 2, 3]:
        assert sorted(np.flatnonzero(c.mask())) == _allowed(state)
        c.advance(token)
        state = _next_state(state, token)


@pytest.mark.parametrize(("drafter_kind", "rule"), [("model", "exact"), ("model", "match"), ("ngram", "exact")])
def test_constrained_output_is_the_masked_target(drafter_kind: str, rule: str) -> None:
    failure = joint_check(_draw(drafter_kind, rule), _expected_joint(WINDOW), N_SAMPLES)
    assert failure is None, failure


def test_an_unmasked_draft_distribution_breaks_exactness(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same check with q left unmasked in the acceptance ratio (a misreported q) fails: the test can fail."""
    from localspec.decoding import engine

    monkeypatch.setattr(engine, "mask_q", lambda q, allowed: q)
    assert joint_check(_draw("model", "exact"), _expected_joint(WINDOW), N_SAMPLES) is not None


def test_forbidden_draft_tokens_cut_the_draft_before_verification() -> None:
    target = ToyBackend(_target_fn, n_vocab=V, eog=frozenset({EOG}))
    drafter = ModelDrafter(ToyBackend(_draft_fn, n_vocab=V, eog=frozenset({EOG})))
    config = GenerationConfig(max_tokens=40, num_draft=4, sampling=SamplingParams(1.0, seed=3), grammar=TOY)
    events = list(generate(target, drafter, PROMPT, config))
    rounds = [e.round for e in events if getattr(e, "round", None) is not None]
    assert any("grammar cut the draft" in r.note for r in rounds)
    assert max(target.forward_calls[1:]) <= 5
    done = events[-1]
    assert isinstance(done, Done)
    text = bytes(LETTERS[t] for t in done.tokens).decode()
    assert _matches_toy(text.rstrip("a"))


def _matches_toy(text: str) -> bool:
    import re

    return re.fullmatch(r"(ab|ac|c|d)*", text) is not None


def test_greedy_constrained_speculation_on_the_toy_equals_plain() -> None:
    target = ToyBackend(_target_fn, n_vocab=V, eog=frozenset({EOG}))
    runs = {}
    for kind in ("none", "model", "ngram"):
        drafter = {
            "none": NoDrafter(),
            "model": ModelDrafter(ToyBackend(_draft_fn, n_vocab=V, eog=frozenset({EOG}))),
            "ngram": NgramDrafter(max_ngram=2),
        }[kind]
        config = GenerationConfig(max_tokens=40, num_draft=3, sampling=SamplingParams(0.0), grammar=TOY)
        runs[kind] = [e for e in generate(target, drafter, PROMPT, config) if isinstance(e, Done)][0].tokens
    assert runs["model"] == runs["none"] == runs["ngram"]


# -- specs, compile errors, the end of the grammar ---------------------------------------------------------


def test_the_documented_tool_call_lark_example_compiles() -> None:
    """The Lark example in grammar.py's docstring (helper code copies it) compiles, and a real call passes."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
        "required": ["name", "arguments"],
    }
    spec = GrammarSpec("lark", 'start: "<tool_call>\\n" %json ' + json.dumps(schema) + ' "\\n</tool_call>"')
    assert "%json{" in (grammar.__doc__ or "")
    grammar.check(spec)
    target = FakeBackend(without(hashed_logits(1)))
    c = grammar.Constraint(target, spec)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for t in call.encode():
        assert c.mask()[t], call
        c.advance(t)
    assert c.finished
    bounded = GrammarSpec("lark", spec.text.replace(json.dumps(schema), json.dumps(grammar.bounded(schema))))
    assert grammar.json_between("<tool_call>\n", schema, "\n</tool_call>") == bounded


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (GrammarSpec("json_schema", '{"type": "objectx"}'), "objectx"),
        (GrammarSpec("json_schema", '{"type": '), "not valid JSON"),
        (GrammarSpec("json_schema", "[1, 2]"), "must be a JSON object"),
        (GrammarSpec("lark", "start: undefined_rule"), "undefined_rule"),
    ],
)
def test_a_spec_that_does_not_compile_is_a_usage_error_with_the_reason(spec: GrammarSpec, reason: str) -> None:
    with pytest.raises(UsageError) as e:
        grammar.check(spec)
    assert reason in str(e.value)
    with pytest.raises(UsageError):
        generate(FakeBackend(hashed_logits(1)), NoDrafter(), [1, 2], GenerationConfig(grammar=spec))


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(UsageError, match="unknown grammar kind"):
        GrammarSpec("yaml")  # type: ignore[arg-type]


def test_end_of_generation_only_where_the_grammar_accepts_and_a_complete_grammar_ends_the_answer() -> None:
    """A model that prefers ending keeps writing until the object is complete, then the answer ends ("eog")."""

    def eager_to_end(ctx: Sequence[int]) -> np.ndarray:
        out = hashed_logits(7)(ctx)
        out[256] = 50.0
        return out

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}  # fmt: skip
    spec = grammar.json_schema({**schema, "x-guidance": {"whitespace_flexible": False}})
    for kind in ("none", "ngram"):
        drafter = NoDrafter() if kind == "none" else NgramDrafter()
        config = GenerationConfig(max_tokens=200, num_draft=3, sampling=SamplingParams(0.8, seed=1), grammar=spec)
        done = [e for e in generate(FakeBackend(eager_to_end), drafter, [1, 2], config) if isinstance(e, Done)][0]
        assert done.stats.stop_reason == "eog"
        assert isinstance(json.loads(done.text)["a"], int)


def test_a_grammar_that_completes_stops_without_an_end_token() -> None:
    spec = GrammarSpec("lark", 'start: "yes" | "no"')
    config = GenerationConfig(max_tokens=50, num_draft=2, sampling=SamplingParams(0.0), grammar=spec)
    events = generate(FakeBackend(without(hashed_logits(3))), NoDrafter(), [1], config)
    done = [e for e in events if isinstance(e, Done)]
    assert done[0].text in ("yes", "no")
    assert done[0].stats.stop_reason == "eog"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_accepted_drafts_that_complete_the_grammar_end_the_answer_as_plain_decoding_does(
    drafter_kind: str, temperature: float
) -> None:
    """A target that never ends (its end token impossible, also where the grammar completes): plain decoding stops
    after the token that completes the grammar. Drafts that complete it and are accepted end the answer there too,
    with no token drawn from the row after them (masked to end tokens only, it holds no possible token)."""
    prompt = list(b"Answer: yes. Answer: ")
    target_fn = without(scripted_tokens([*prompt, *b"yes!!!!"]))  # after "yes" only "!" (the grammar forbids it)
    spec = GrammarSpec("lark", 'start: "yes" | "no"')
    sampling = SamplingParams(temperature, seed=5)
    config = GenerationConfig(max_tokens=20, num_draft=4, sampling=sampling, grammar=spec)
    plain = [e for e in generate(FakeBackend(target_fn), NoDrafter(), prompt, config) if isinstance(e, Done)][0]
    assert (plain.text, plain.stats.stop_reason) == ("yes", "eog")
    drafter = ModelDrafter(FakeBackend(target_fn)) if drafter_kind == "model" else NgramDrafter(max_ngram=2)
    with np.errstate(invalid="raise"):  # sampling from a row with no possible token divides 0 by 0
        done = [e for e in generate(FakeBackend(target_fn), drafter, prompt, config) if isinstance(e, Done)][0]
    assert (done.text, done.tokens, done.stats.stop_reason) == (plain.text, plain.tokens, "eog")
    assert done.stats.n_accepted == 2  # "es" drafted after the first token, accepted: they completed the grammar


# -- real models: greedy constrained speculation equals greedy constrained plain decoding ------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
ASK = 'Give a person as JSON, e.g. {"name": "Ann", "age": 30, "city": "Paris"}. Another one: '


def _greedy(target, drafter, prompt: list[int], spec: GrammarSpec, n: int = 40) -> Done:  # type: ignore[no-untyped-def]
    config = GenerationConfig(max_tokens=n, num_draft=4, sampling=SamplingParams(0.0), grammar=spec)
    return [e for e in generate(target, drafter, prompt, config) if isinstance(e, Done)][0]


def _check_answer(done: Done) -> None:
    import jsonschema

    if done.stats.stop_reason == "eog":
        jsonschema.validate(json.loads(done.text), PERSON)
    else:
        assert done.stats.stop_reason == "max_tokens"


def test_gguf_greedy_constrained_speculation_equals_plain(smollm2_path: Path, tiny_ggufs: tuple[Path, ...]) -> None:
    """A real model (SmolLM2 135M) under a schema: plain, lookup, suffix, a random draft model (mostly cut by
    the grammar) and itself as draft (mostly accepted) write the same tokens."""
    from localspec.backends.base import ChatMessage, chat_prompt_tokens
    from localspec.backends.llama import backend as llama_cpp
    from localspec.decoding.suffix import SuffixDrafter

    target = llama_cpp.load(str(smollm2_path), n_ctx=512)
    prompt = chat_prompt_tokens(target, [ChatMessage("user", ASK)])
    spec = grammar.json_schema(PERSON)
    plain = _greedy(target, NoDrafter(), prompt, spec)
    _check_answer(plain)
    assert "{" in plain.text
    drafters = {
        "ngram": NgramDrafter(),
        "suffix": SuffixDrafter(gate=False),
        "random model": ModelDrafter(llama_cpp.load(str(tiny_ggufs[1]), n_ctx=512)),
        "self": ModelDrafter(llama_cpp.load(str(smollm2_path), n_ctx=512)),
    }
    for name, drafter in drafters.items():
        spec_run = _greedy(target, drafter, prompt, spec)
        assert spec_run.tokens == plain.tokens, name
        if name in ("suffix", "self"):
            assert spec_run.stats.n_accepted > 0, name
    # Every emitted token stays inside the grammar, the end token included.
    c = grammar.Constraint(target, spec)
    for t in plain.tokens:
        assert c.mask()[t]
        c.advance(t)


@pytest.mark.mlx
def test_mlx_greedy_constrained_speculation_equals_plain(tmp_path: Path) -> None:
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    import mlx_tiny

    from localspec.backends.mlx import backend
    from localspec.decoding.suffix import SuffixDrafter

    target_dir = mlx_tiny.build(tmp_path / "target", seed=1)
    noisy_dir = mlx_tiny.build(tmp_path / "noisy", seed=2, base=target_dir, noise=0.1)
    target = backend.load(str(target_dir), n_ctx=512)
    prompt = target.tokenize("<|im_start|>user\n" + ASK + "<|im_end|>\n<|im_start|>assistant\n")
    spec = grammar.json_schema(PERSON)
    plain = _greedy(target, NoDrafter(), prompt, spec, n=48)
    _check_answer(plain)
    assert plain.text.startswith("{")
    for drafter in (ModelDrafter(backend.load(str(noisy_dir), n_ctx=512)), SuffixDrafter(gate=False)):
        assert _greedy(target, drafter, prompt, spec, n=48).tokens == plain.tokens


def test_end_tokens_are_allowed_exactly_where_the_grammar_accepts() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}  # fmt: skip
    c = grammar.Constraint(FakeBackend(hashed_logits(1)), grammar.json_schema(schema))
    text = b'{"a": 12}'
    for i, t in enumerate(text):
        assert not c.mask()[EOG_FAKE], text[:i]
        c.advance(t)
    assert c.finished and c.mask()[EOG_FAKE] and c.mask().sum() == 1
    # A walk stops at an end token (never fed to the matcher) and commit rolls back to the accepted prefix.
    lark = grammar.Constraint(FakeBackend(hashed_logits(1)), GrammarSpec("lark", 'start: ("a" | "b")*'))
    masks, m = lark.walk([97, 98, EOG_FAKE, 97])
    assert m == 3 and masks.shape == (4, 257)
    lark.commit(1, 97)
    assert lark.mask()[98] and lark.mask()[EOG_FAKE]


EOG_FAKE = 256


@pytest.mark.parametrize("kind", ["json_schema", "json_object", "lark"])
def test_json_whitespace_is_bounded_but_pretty_printing_fits(kind: str) -> None:
    """A model that wants to stop before a required key cannot pad with whitespace forever (a real 1.5B
    model did, unbounded); compact and indented JSON both still fit."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}  # fmt: skip
    spec = {"json_schema": grammar.json_schema(schema), "json_object": grammar.json_object(),
            "lark": grammar.json_between("<x>", schema, "</x>")}[kind]  # fmt: skip
    before, after = (b"<x>", b"</x>") if kind == "lark" else (b"", b"")
    backend = FakeBackend(hashed_logits(1))
    for text in (json.dumps({"a": 7, "b": 8}), json.dumps({"a": 7, "b": 8}, indent=4), '{"a":7,"b":8}'):
        c = grammar.Constraint(backend, spec)
        for t in before + text.encode() + after:
            assert c.mask()[t], text
            c.advance(t)
        assert c.mask()[EOG_FAKE]
    c = grammar.Constraint(backend, spec)
    for t in before + b'{"a": 7':
        c.advance(t)
    n = 0
    while c.mask()[ord(" ")] and n < 100:
        c.advance(ord(" "))
        n += 1
    assert n == 1
