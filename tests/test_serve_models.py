"""`localspec serve` against what a user compares it with: the model id its README snippets name (a
catalog pair served under another --model-name still answers to the pair's name), and `run --json`'s
stats on a reply that a draft token ended (one the target accepted, an end-of-generation token)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

from serve_process import ServeProcess, httpx

README = Path(__file__).resolve().parents[1] / "README.md"
HELLO = [{"role": "user", "content": "Hi"}]


# -- model ids --------------------------------------------------------------------------------------------


def _hub_file(hub: Path, repo: str, file: str, source: Path) -> None:
    """`source` as `repo`'s `file` in a Hugging Face cache (refs/main -> snapshots/<sha>/file)."""
    root = hub / ("models--" + repo.replace("/", "--"))
    sha = "0" * 40
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    snap = root / "snapshots" / sha
    snap.mkdir(parents=True)
    (snap / file).symlink_to(source)


@pytest.fixture
def tiny_pair(tmp_path: Path, tiny_ggufs: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> str:
    """A catalog pair `tiny-pair` (the user's catalog file) whose files are downloaded already."""
    catalog = tmp_path / "models.toml"
    catalog.write_text('[[pair]]\nname = "tiny-pair"\nnum_draft = 3\n[pair.llama]\n'
                       'target = "test/tiny-target-GGUF:tiny-target.gguf"\ndraft = "test/tiny-draft-GGUF:tiny-draft.gguf"\n')  # fmt: skip
    hub = tmp_path / "hub"
    _hub_file(hub, "test/tiny-target-GGUF", "tiny-target.gguf", tiny_ggufs[0])
    _hub_file(hub, "test/tiny-draft-GGUF", "tiny-draft.gguf", tiny_ggufs[1])
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(catalog))  # the server process inherits these
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return "tiny-pair"


def test_a_pair_served_under_another_name_answers_to_both(tiny_pair: str) -> None:
    """README's snippets name the pair; a server started from it with --model-name answers to either id
    (responses and /v1/models carry the served one), and to nothing else."""
    s = ServeProcess("--pair", tiny_pair, "--no-pull", "--n-ctx", "256", "--draft-method", "model",
                     "--model-name", "coder")  # fmt: skip
    try:
        client = s.client()
        assert [m.id for m in client.models.list().data] == ["coder"]
        for model in ("coder", tiny_pair):
            r = client.chat.completions.create(model=model, messages=HELLO, max_tokens=2, temperature=0)
            assert r.model == "coder"
        other = httpx.post(f"{s.url}/v1/chat/completions", json={"model": "tiny-target", "messages": HELLO})
        assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
        assert "`coder` or `tiny-pair`" in other.json()["error"]["message"]
        # the openai client's models.retrieve(): either id gives the served model's card; another is a 404
        assert client.models.retrieve("coder").id == client.models.retrieve(tiny_pair).id == "coder"
        missing = httpx.get(f"{s.url}/v1/models/tiny-target")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    finally:
        s.close()
    plain = ServeProcess("--pair", tiny_pair, "--no-pull", "--n-ctx", "256", "--draft-method", "ngram")
    try:
        assert [m.id for m in plain.client().models.list().data] == [tiny_pair]  # the pair's name by default
    finally:
        plain.close()


def _serve_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Serve an OpenAI-compatible API")
    return text[start : text.index("\n## ", start + 1)]


def test_readme_client_snippets_name_the_id_its_serve_command_serves() -> None:
    section = _serve_section()
    pair = re.search(r"^localspec serve --pair (\S+)", section, re.MULTILINE)
    assert pair is not None, "README's serve section starts its examples from a catalog pair"
    named = re.findall(r'model="([^"]+)"', section) + re.findall(r'"model": "([^"]+)"', section)
    named += re.findall(r"--model openai/([\w.-]+)", section) + re.findall(r"^\s+model: (\S+)", section, re.MULTILINE)
    assert len(named) >= 4 and set(named) == {pair.group(1)}, named


# -- stats of a reply a draft token ended ----------------------------------------------------------------------


def _greedy_tokens(target: Path, prompt: str, n: int) -> list[int]:
    from localspec.decoding.engine import Done
    from localspec.options import GenerationSettings, ModelOptions
    from localspec.pipeline import load_pipeline

    pipeline = load_pipeline(ModelOptions(target=str(target), draft_method="none", n_ctx=256, threads=1))
    try:
        events = pipeline.generate(prompt, GenerationSettings(method="none", max_tokens=n).config())
        return list(next(e for e in events if isinstance(e, Done)).tokens)
    finally:
        pipeline.close()


def _set_eos(path: Path, token: int) -> None:
    from gguf import GGUFReader

    reader = GGUFReader(path, "r+")
    field = reader.fields["tokenizer.ggml.eos_token_id"]
    field.parts[field.data[0]][0] = token
    reader.data.flush()


@pytest.fixture(scope="module")
def eog_pair(tmp_path_factory: pytest.TempPathFactory, tiny_ggufs: tuple[Path, Path, Path]) -> tuple[Path, Path, str]:
    """(target, draft, prompt): the tiny target with its second greedy answer token to `prompt` made its
    end-of-generation token, and the same model as the draft, which drafts that token for the target
    to accept: the answer is one token, and the round that ends it accepted a draft token."""
    d = tmp_path_factory.mktemp("eog-pair")
    for prompt in ("Say hello", "Hi", "Tell me a joke", "What is 2 + 2?", "Name a colour"):
        first, second = _greedy_tokens(tiny_ggufs[0], prompt, 2)
        if first != second:
            break
    else:
        pytest.fail("no prompt whose first two greedy tokens differ")
    target, draft = d / "eog-target.gguf", d / "eog-draft.gguf"
    shutil.copyfile(tiny_ggufs[0], target)
    _set_eos(target, second)
    shutil.copyfile(target, draft)
    assert _greedy_tokens(target, prompt, 8) == [first]  # the second token now ends the answer
    return target, draft, prompt


def test_a_reply_ended_by_an_accepted_draft_token_counts_only_what_it_kept(eog_pair: tuple[Path, Path, str]) -> None:
    """One answer token (the prompt pass's), then one round whose single draft, the end-of-generation
    token, the target accepted: that round added nothing to the answer. mean_accepted_length counts what
    the rounds added (0.0 here, not 2.0 for an accepted draft plus a bonus token after the end), and the
    server reports what `run --json` reports."""
    target, draft, prompt = eog_pair
    flags = ["--target", str(target), "--draft", str(draft), "--draft-method", "model", "-k", "1", "--n-ctx", "256",
             "--threads", "1"]  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "localspec.cli", "run", prompt, *flags, "--max-tokens", "8", "--json"],
                         capture_output=True, text=True, check=False, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    stats, rounds = out["stats"], out["rounds"]
    assert len(out["tokens"]) == 1 and stats["stop_reason"] == "eog"
    assert [(r["n_drafted"], r["n_accepted"], r["n_emitted"]) for r in rounds] == [(1, 1, 0)]  # the setup
    assert stats["mean_accepted_length"] == sum(r["n_emitted"] for r in rounds) / len(rounds) == 0.0
    s = ServeProcess(*flags)
    try:
        r = s.client().chat.completions.create(model="eog-target", messages=[{"role": "user", "content": prompt}],
                                               max_tokens=8, temperature=0)  # fmt: skip
        t = r.model_extra["timings"]
        assert r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop"
        assert (t["rounds"], t["draft_n"], t["draft_n_accepted"]) == (1, 1, 1)
        assert t["mean_accepted_length"] == stats["mean_accepted_length"] == (t["predicted_n"] - 1) / t["rounds"]
    finally:
        s.close()
