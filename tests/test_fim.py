"""Fill-in-the-middle on `/v1/completions` (`suffix`): a real server process on the real Qwen2.5-Coder 0.5B
fixture with the real `openai` client; the FIM tokens found by llama.cpp and by their known texts (what the
MLX backend reads) on the real fixture vocabularies; and FIM on the MLX backend (a tiny model with FIM tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from serve_process import ServeProcess, httpx

from localspec.fim import (
    FIM_END_TEXTS,
    MIDDLE_TEXTS,
    PREFIX_TEXTS,
    SUFFIX_TEXTS,
    FimTokens,
    fim_prompt,
    find_fim_tokens,
)
from localspec.gguf_meta import read_gguf_header

# (prefix, suffix, what the middle must hold): each middle follows from the suffix, not from the prefix
# alone (greedy plain completion of these prefixes writes `is_prime(n)`, `numpy as np`, `Hello`).
CASES = [
    ("def ", "(a, b):\n    return a * b\n\nprint(multiply(2, 3))\n", "multiply"),
    ("import ", "\n\nprint(json.dumps({'a': 1}))\n", "json"),
    ("def greet(name):\n    ", "\n\ngreet('Ada')  # prints: Bonjour, Ada!\n", "Bonjour"),
    ("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n", "return a + b"),
]
# A middle that copies from the suffix: lookup drafts (n-gram, suffix) find it in the prompt.
VECTOR_PREFIX = (
    "class Vector:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __add__(self, other):\n        return Vector(self.x + other.x, self.y + other.y)\n\n"
    "    def __sub__(self, other):\n        "
)
VECTOR_SUFFIX = (
    "\n\n    def __mul__(self, k):\n        return Vector(self.x * k, self.y * k)\n\n"
    "    def __neg__(self):\n        return Vector(-self.x, -self.y)\n"
)


@pytest.fixture(scope="module")
def qwen05() -> Path:
    from fixture_models import fetch

    return fetch("qwen-0.5b")


@pytest.fixture(scope="module")
def coder(qwen05: Path) -> Iterator[ServeProcess]:
    """Qwen2.5-Coder 0.5B alone, auto drafting (lookup: n-gram and suffix drafts)."""
    s = ServeProcess("--target", str(qwen05), "--draft-method", "auto", "--n-ctx", "1024", "--model-name", "coder",
                     "--no-suffix-memory")  # fmt: skip
    yield s
    s.close()


def fill(s: ServeProcess, prefix: str | list[int], suffix: str, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    kw.setdefault("stop", ["\n\n"])  # an instruct model does not always end a middle with <|fim_pad|>/<|endoftext|>
    return s.client().completions.create(model="coder", prompt=prefix, suffix=suffix, **kw)


def n_tokens(s: ServeProcess, text: str) -> int:
    return len(httpx.post(f"{s.url}/tokenize", json={"content": text}).json()["tokens"])


@pytest.mark.slow  # about a minute on a busy 2-core CPU
def test_the_middle_follows_from_the_suffix_streamed_and_not(coder: ServeProcess) -> None:
    for prefix, suffix, expected in CASES:
        r = fill(coder, prefix, suffix)
        text = r.choices[0].text
        assert expected in text, (prefix, text)
        assert r.choices[0].finish_reason == "stop"
        # The prompt is <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> (Qwen adds no BOS).
        assert r.usage.prompt_tokens == n_tokens(coder, prefix) + n_tokens(coder, suffix) + 3
        streamed = list(fill(coder, prefix, suffix, stream=True))
        assert "".join(c.choices[0].text for c in streamed if c.choices) == text
        assert streamed[-1].choices[0].finish_reason == "stop"
        assert streamed[-1].model_extra["timings"]["draft_method"] == "auto"
    # A prefix sent as token ids fills the same middle.
    prefix, suffix, _ = CASES[0]
    ids = httpx.post(f"{coder.url}/tokenize", json={"content": prefix}).json()["tokens"]
    assert fill(coder, ids, suffix).choices[0].text == fill(coder, prefix, suffix).choices[0].text


@pytest.mark.slow
def test_speculative_fim_equals_plain_fim_and_lookup_drafts_pay(coder: ServeProcess) -> None:
    """Greedy FIM with n-gram drafts (the suffix is in the prompt, so they find the middle's copies) writes what
    plain decoding writes, and some drafts are accepted."""
    plain = fill(coder, VECTOR_PREFIX, VECTOR_SUFFIX, extra_body={"speculative": {"method": "none"}})
    assert plain.choices[0].text.startswith("return Vector(self.x - other.x, self.y - other.y)")
    for method in ("ngram", "suffix"):
        spec = fill(coder, VECTOR_PREFIX, VECTOR_SUFFIX, extra_body={"speculative": {"method": method}})
        assert spec.choices[0].text == plain.choices[0].text, method
        t = spec.model_extra["timings"]
        assert t["draft_method"] == method and t["draft_n_accepted"] > 0, t


@pytest.mark.parametrize(("name", "has_fim"), [("qwen-0.5b", True), ("smollm2-135m", False), ("gemma3-270m", False)])
def test_fim_tokens_by_llama_cpp_and_by_their_texts_agree(name: str, has_fim: bool) -> None:
    """llama.cpp's FIM tokens (GGUF metadata, else its known texts) are the ones the known-text table finds in
    the same vocabulary (as the MLX backend reads a tokenizer); llama.cpp ends generation at the FIM end
    tokens the table names, so the MLX backend's end-of-generation set can follow it."""
    from fixture_models import fetch

    from localspec.backends.llama.backend import LlamaCppBackend

    path = fetch(name)
    tokens = read_gguf_header(path).get("tokenizer.ggml.tokens")
    by_text = find_fim_tokens({t: i for i, t in enumerate(tokens)})
    model = LlamaCppBackend(path, n_ctx=64, threads=1, n_gpu_layers=0)
    try:
        assert model.fim_tokens() == by_text
        assert (by_text is not None) == has_fim
        ends = {i for i, t in enumerate(tokens) if t in FIM_END_TEXTS}
        assert ends <= model.eog_ids
        if has_fim:
            assert by_text == FimTokens(prefix=151659, suffix=151661, middle=151660)
            assert ends == {151662, 151663, 151664}  # <|fim_pad|>, <|repo_name|>, <|file_sep|>
    finally:
        model.close()


@pytest.mark.parametrize("family", range(len(PREFIX_TEXTS)), ids=PREFIX_TEXTS)
def test_the_served_fim_prompt_is_prefix_suffix_middle_for_every_known_family(
    family: int, smollm2_path: Path, tmp_path: Path
) -> None:
    """Fast (a tiny GGUF per FIM token family the code knows, no generation): the tokens llama.cpp finds by their
    texts are the ones the known-text table (the MLX backend's) finds, and the prompt /v1/completions builds
    with `suffix` is [BOS] <prefix token> prefix <suffix token> suffix <middle token>. That order (PSM) is what
    llama-server's /infill sends by default and the only one localspec builds (no SPM variant anywhere)."""
    from gguf_factory import write_tiny_llama

    from localspec.backends.llama.backend import LlamaCppBackend
    from localspec.server.completion_prompt import middle_prompt, plain_tokens

    texts = (PREFIX_TEXTS[family], SUFFIX_TEXTS[family], MIDDLE_TEXTS[family])
    path = tmp_path / "fim.gguf"
    write_tiny_llama(path, smollm2_path, n_embd=16, n_layer=1, n_head=2, n_ff=32, added=texts)
    model = LlamaCppBackend(path, n_ctx=64, threads=1, n_gpu_layers=0)
    try:
        pre, suf, mid = (model.n_vocab - 3 + i for i in range(3))  # the added tokens, in the order written
        assert model.fim_tokens() == find_fim_tokens(dict(zip(texts, (pre, suf, mid)))) == FimTokens(pre, suf, mid)
        prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
        head, tail = plain_tokens(prefix, model), plain_tokens(suffix, model)
        assert head and tail and head != tail
        want = [pre, *head, suf, *tail, mid]  # SmolLM2's vocabulary adds no BOS
        assert middle_prompt(prefix, suffix, model, model.fim_tokens()) == want
        assert middle_prompt(head, suffix, model, model.fim_tokens()) == want  # a prefix sent as token ids
    finally:
        model.close()


def test_fim_prompt_order() -> None:
    fim = FimTokens(prefix=1, suffix=2, middle=3)
    assert fim_prompt(fim, [10, 11], [20], bos=[0]) == [0, 1, 10, 11, 2, 20, 3]
    assert fim_prompt(fim, [], [20]) == [1, 2, 20, 3]
    assert find_fim_tokens({"<PRE>": 5, "<SUF>": 6, "<MID>": 7}) == FimTokens(5, 6, 7)  # CodeLlama's
    assert find_fim_tokens({"<fim_prefix>": 1, "<fim_suffix>": 3}) is None  # no middle: no FIM


# -- MLX ---------------------------------------------------------------------------------------------------

FIM_SPECIALS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"]


@pytest.fixture(scope="module")
def mlx_fim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random mlx-lm model whose tokenizer has Qwen's FIM tokens (ids 259-262, inside its 272 rows)."""
    pytest.importorskip("mlx_lm")
    import mlx_tiny
    from transformers import PreTrainedTokenizerFast

    path = mlx_tiny.build(tmp_path_factory.mktemp("mlx-fim") / "model", seed=1)
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    tok.add_special_tokens({"additional_special_tokens": FIM_SPECIALS}, replace_extra_special_tokens=False)
    tok.save_pretrained(str(path))
    return path


def test_fim_on_mlx(mlx_fim_model: Path) -> None:
    """The MLX backend finds the FIM tokens in the tokenizer's vocabulary and ends at <|fim_pad|> as llama.cpp
    does; the server builds the same prompt on it."""
    from localspec.backends.mlx.backend import load

    model = load(str(mlx_fim_model), n_ctx=256, threads=None, n_gpu_layers=0)
    try:
        ids = [model.tokenize(t, add_special=False)[0] for t in FIM_SPECIALS]
        assert model.fim_tokens() == FimTokens(*ids[:3])
        assert ids[3] in model.eog_ids
    finally:
        model.close()
    s = ServeProcess("--target", str(mlx_fim_model), "--backend", "mlx", "--draft-method", "ngram", "--n-ctx", "256")
    try:
        body = {"prompt": "def f(x):\n    ", "suffix": "\n\nprint(f(2))\n", "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{s.url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len("def f(x):\n    ") + len("\n\nprint(f(2))\n") + 3  # bytes
    finally:
        s.close()
