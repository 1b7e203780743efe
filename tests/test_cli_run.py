"""`localspec run` as a user runs it: a subprocess, real models, exit codes and messages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

README_PROMPT = "Write a Python function that checks whether a number is prime."


def localspec(*args: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_does_not_import_heavy_backends() -> None:
    code = (
        "import sys; from localspec.cli import build_parser; build_parser().format_help(); "
        "print(sorted(m for m in ('textual', 'mlx', 'mlx_lm', 'llama_cpp', 'huggingface_hub') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert localspec("--help").returncode == 0


def test_run_json_on_tiny_model(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    r = localspec("run", "Say hello", "--target", str(tiny_ggufs[0]), "--draft", str(tiny_ggufs[1]), "--draft-method", "model",
                  "--max-tokens", "24", "--json", "-k", "3")  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    s = out["stats"]
    assert s["draft_method"] == "model" and s["rule"] == "greedy" and s["num_draft"] == 3
    assert s["n_generated"] == len(out["tokens"]) <= 24
    rounds = out["rounds"]
    assert rounds and s["n_rounds"] == len(rounds)
    assert s["n_drafted"] == sum(r["n_drafted"] for r in rounds)
    assert s["n_accepted"] == sum(r["n_accepted"] for r in rounds)
    # recomputed from the rounds: tokens per target pass, and accepted over drafted
    assert s["mean_accepted_length"] == pytest.approx(sum(r["n_accepted"] + 1 for r in rounds) / len(rounds))
    assert s["acceptance_rate"] == pytest.approx(
        sum(r["n_accepted"] for r in rounds) / sum(r["n_drafted"] for r in rounds)
    )
    for key in ("decode_tps", "prompt_tps", "acceptance_rate", "acceptance_by_position", "draft_s", "verify_s"):
        assert key in s


def test_run_streams_text_and_stats_from_stdin(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    r = localspec("run", "-", "--target", str(tiny_ggufs[0]), "--draft-method", "ngram", "--max-tokens", "12",
                  "--temperature", "0.8", "--seed", "7", stdin="Tell me a story")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "decode" in r.stderr and "tok/s" in r.stderr and "acceptance" in r.stderr
    again = localspec("run", "-", "--target", str(tiny_ggufs[0]), "--draft-method", "ngram", "--max-tokens", "12",
                      "--temperature", "0.8", "--seed", "7", stdin="Tell me a story")  # fmt: skip
    assert r.stdout.strip() and again.stdout == r.stdout  # same seed, same text (and some text)


def test_model_and_ngram_drafting_print_the_plain_text(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    """At temperature 0 drafting changes the speed, never the text: `run` prints what plain decoding prints."""
    target, draft = str(tiny_ggufs[0]), str(tiny_ggufs[1])

    def run(prompt: str, *args: str) -> subprocess.CompletedProcess[str]:
        r = localspec("run", prompt, "--target", target, "--max-tokens", "40", "--temperature", "0", "--threads", "1",
                      "-k", "3", *args)  # fmt: skip
        assert r.returncode == 0, r.stderr
        return r

    # A random model's reply rarely repeats itself: put one of its replies in the prompt, twice (the
    # `ngram` method drafts a single token's continuation only after two sightings, as llama-lookup),
    # so that prompt lookup finds the pieces the model writes again.
    first = run("Tell me about the sea.", "--draft-method", "none").stdout
    assert first.strip()
    prompt = f"Tell me about the sea. {first.strip()} {first.strip()}"
    plain = run(prompt, "--draft-method", "none").stdout
    assert plain.strip()
    assert run(prompt, "--draft", draft, "--draft-method", "model").stdout == plain
    assert run(prompt, "--draft-method", "ngram").stdout == plain
    ngram = json.loads(run(prompt, "--draft-method", "ngram", "--json").stdout)
    assert ngram["stats"]["draft_method"] == "ngram" and ngram["stats"]["n_drafted"] > 0, ngram["stats"]
    assert ngram["text"] and plain.startswith(ngram["text"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "/nonexistent/model.gguf"], "model file not found"),
        (["--draft-method", "model", "--target", "{t}"], "needs a draft model"),
        (["--target", "{t}", "--temperature", "-1"], "temperature must be >= 0"),
        (["--target", "{t}", "--top-p", "0"], "top-p must be in"),
        (["--target", "{t}", "--rule", "fast"], "invalid choice"),
        (["--target", "{t}", "--draft", "{bad}"], "not a GGUF model file"),
        (["--target", "{t}", "--n-ctx", "256", "--prompt-file-hack"], "unrecognized arguments"),
    ],
)
def test_errors_are_messages_not_tracebacks(args: list[str], message: str, tiny_ggufs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.gguf"
    bad.write_text("not a model")
    argv = [a.format(t=tiny_ggufs[0], bad=bad) for a in args]
    r = localspec("run", "hello", *argv)
    assert r.returncode != 0
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_context_overflow_message(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    r = localspec("run", "word " * 600, "--target", str(tiny_ggufs[0]), "--n-ctx", "256")
    assert r.returncode == 1
    assert "context holds" in r.stderr and "--n-ctx" in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_stops_cleanly_with_stats(smollm2_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec.cli", "run", "Write a very long story about a dragon.",
         "--target", str(smollm2_path), "--draft-method", "none", "--max-tokens", "4000", "--n-ctx", "8192"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.read(20)  # generation has started
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert "stop: stopped" in err  # the run ended through the engine, with its stats


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


@pytest.mark.slow
def test_qwen_pair_speculative_text_equals_plain(qwen_pair: tuple[Path, Path]) -> None:
    """The README's example: with the 1.5B/0.5B pair at temperature 0, the same text as plain decoding."""
    target, draft = qwen_pair
    common = ["run", README_PROMPT, "--target", str(target), "--draft", str(draft), "--json", "--max-tokens", "96"]
    results = {}
    for method in ("none", "model", "ngram"):
        r = localspec(*common, "--draft-method", method)
        assert r.returncode == 0, r.stderr
        results[method] = json.loads(r.stdout)
    plain = results["none"]["tokens"]
    assert results["model"]["stats"]["acceptance_rate"] > 0.5  # a matched pair accepts most drafts
    for method in ("model", "ngram"):
        tokens = results[method]["tokens"]
        div = _first_divergence(plain, tokens)
        if div is None:
            assert tokens == plain
            assert results[method]["text"] == results["none"]["text"]
            continue
        # Batched verification and single-token decoding differ in the last bits: allow a parting
        # only where the target's top two logits are nearly tied.
        gap = _top2_gap(target, plain[:div])
        assert gap < 0.25, f"{method} parted from plain decoding at token {div} with top-2 gap {gap:.3f}"


def _top2_gap(target: Path, prefix: list[int]) -> float:
    from localspec.backends.base import ChatMessage, chat_prompt_tokens
    from localspec.backends.llama import backend as lb

    b = lb.load(target, n_ctx=1024)
    try:
        prompt = chat_prompt_tokens(b, [ChatMessage("user", README_PROMPT)])
        logits = b.forward([*prompt, *prefix], all_logits=False)[-1]
        top = np.sort(logits)[-2:]
        return float(top[1] - top[0])
    finally:
        b.close()
