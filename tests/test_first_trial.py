"""What a first trial found: Ctrl-C in every phase, pull that never hangs, chat formats for
models without a template, near-ties marked in --json. Real processes, real models, a real socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _env() -> dict[str, str]:
    """This test's environment, read when a process starts (conftest's private cache directory included: a copy
    taken at import would send the processes' remembered costs and suffix memory to the user's cache)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "localspec.cli", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or _env(),
    )  # fmt: skip


def _wait_for_line(proc: subprocess.Popen[str], needle: str, limit_s: float = 300) -> list[str]:
    """Read stderr lines until one contains `needle`; return the lines read."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"never saw {needle!r}; stderr so far: {''.join(lines)}")


def _interrupt_and_time(proc: subprocess.Popen[str], signals: int = 1, gap_s: float = 0.3) -> tuple[float, str, str]:
    t0 = time.monotonic()
    for i in range(signals):
        if i:
            time.sleep(gap_s)
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return time.monotonic() - t0, out, err


# -- Ctrl-C in each phase ---------------------------------------------------------------------------
# Bounds are generous (a loaded 2-core machine): the bug they catch took a minute or more.

LONG_PROMPT = "Summarise the following notes.\n" + "\n".join(
    f"Note {i}: the fox crossed field {i} at dawn and met a heron by pond {i % 17}." for i in range(160)
)


@pytest.mark.slow
def test_ctrl_c_while_reading_a_long_prompt_stops_at_once(qwen_pair: tuple[Path, Path]) -> None:
    target, _ = qwen_pair
    proc = _start("run", LONG_PROMPT, "--target", str(target), "--draft-method", "none", "--n-ctx", "8192")
    _wait_for_line(proc, "reading the prompt")
    time.sleep(0.5)  # inside the prompt pass (several seconds for ~3,500 tokens on the CPU)
    elapsed, out, err = _interrupt_and_time(proc)
    assert elapsed < 10, err
    assert proc.returncode == 130 and "Traceback" not in err
    assert out.strip() == ""  # no token was produced
    assert "stop: stopped" in err


@pytest.mark.slow
def test_ctrl_c_while_loading_stops_at_once(qwen_pair: tuple[Path, Path]) -> None:
    target, draft = qwen_pair
    proc = _start("run", "Say hi.", "--target", str(target), "--draft", str(draft), "--draft-method", "model")
    _wait_for_line(proc, "loading ")
    elapsed, out, err = _interrupt_and_time(proc)
    assert elapsed < 10, err
    assert proc.returncode == 130 and "Traceback" not in err
    assert out.strip() == ""  # it never got to a token


def test_ctrl_c_while_auto_prepares_stops_at_once(smollm2_path: Path) -> None:
    # Self-draft with auto at the longest k: the drafter is timed over batches up to 65 tokens.
    proc = _start("run", "Say hi.", "--target", str(smollm2_path), "--draft", str(smollm2_path), "-k", "64",
                  "--n-ctx", "2048")  # fmt: skip
    _wait_for_line(proc, "preparing the drafter")
    elapsed, out, err = _interrupt_and_time(proc)
    assert elapsed < 10, err
    assert proc.returncode == 130 and "Traceback" not in err


def test_second_ctrl_c_aborts_at_once_while_decoding(smollm2_path: Path) -> None:
    # Long rounds (64 drafted tokens each), so the second Ctrl-C lands inside one and must not wait for it.
    m = str(smollm2_path)
    proc = _start("run", "Write a very long story about a dragon.", "--target", m, "--draft", m, "--draft-method",
                  "model", "-k", "64", "--max-tokens", "4000", "--n-ctx", "8192")  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.read(20)  # tokens flow
    elapsed, out, err = _interrupt_and_time(proc, signals=2, gap_s=0.05)
    assert elapsed < 10, err
    assert proc.returncode == 130 and "Traceback" not in err
    assert "Ctrl-C again to abort" in err
    assert "aborted" in err or "stop: stopped" in err


# -- pull against an endpoint that accepts and never answers ------------------------------------------


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A loopback server that accepts connections and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    done.set()
    t.join(2)
    for conn in held:
        conn.close()
    server.close()


def test_pull_from_a_silent_endpoint_times_out_with_a_hint(silent_endpoint: str, tmp_path: Path) -> None:
    env = {**_env(), "HF_ENDPOINT": silent_endpoint, "LOCALSPEC_HUB_TIMEOUT": "1", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_DISABLE_XET": "1"}  # fmt: skip
    env.pop("HF_HUB_OFFLINE", None)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "pull", "someone/model-GGUF:model.gguf"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "waiting up to 1 s" in r.stderr  # it says what it waits for
    assert "did not answer within 1 s" in r.stderr and "LOCALSPEC_HUB_TIMEOUT" in r.stderr
    assert elapsed < 60  # huggingface_hub retries a few times; never the 180 s hang


# -- chat formats ----------------------------------------------------------------------------------


def test_gemma_without_a_template_gets_its_family_format(gemma_path: Path) -> None:
    from localspec.backends.base import ChatMessage, chat_prompt_tokens
    from localspec.backends.chat_template import choose_chat_format, conversation_text
    from localspec.backends.llama.backend import load

    b = load(str(gemma_path), n_ctx=512, threads=2)
    try:
        assert b.chat_template() is None  # this GGUF ships none
        fmt = choose_chat_format(b)
        assert fmt.source == "family" and fmt.name == "gemma" and "gemma" in fmt.note
        msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
        text = conversation_text(b, msgs, fmt)
        assert "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n" in text
        assert "<|im_start|>" not in text
        start = b.tokenize("<start_of_turn>", add_special=False, parse_special=True)
        assert start[0] in chat_prompt_tokens(b, msgs, fmt)  # a special token, not its spelling
        end = b.tokenize("<end_of_turn>", add_special=False, parse_special=True)[0]
        assert end in b.eog_ids  # the reply ends where the format says
        assert choose_chat_format(b, "chatml").name == "chatml"
        assert choose_chat_format(b, "raw").raw
    finally:
        b.close()


def test_run_on_gemma_says_which_format_and_writes_no_chatml(gemma_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", "Say hello in French.", "--target", str(gemma_path),
         "--draft-method", "none", "--max-tokens", "16"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "using the gemma format" in r.stderr
    assert "<|im_end|>" not in r.stdout and "<|im_start" not in r.stdout


def test_unrecognised_model_falls_back_to_plain_text_and_says_so(tmp_path: Path, smollm2_path: Path) -> None:
    from gguf_factory import write_tiny_llama

    from localspec.backends.base import ChatMessage, chat_prompt_tokens
    from localspec.backends.chat_template import choose_chat_format
    from localspec.backends.llama.backend import load

    plain = tmp_path / "chatless.gguf"
    write_tiny_llama(plain, smollm2_path, chatless=True)
    r = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", "Once upon a time", "--target", str(plain),
         "--draft-method", "none", "--max-tokens", "4"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "plain text" in r.stderr and "--chat-template" in r.stderr
    b = load(str(plain), n_ctx=256, threads=1)
    try:
        fmt = choose_chat_format(b)
        assert fmt.raw and "plain text" in fmt.note and "--chat-template" in fmt.note
        assert chat_prompt_tokens(b, [ChatMessage("user", "abc")], fmt) == b.tokenize("abc", parse_special=False)
    finally:
        b.close()


def test_chat_template_option_errors_and_files(tmp_path: Path, smollm2_path: Path) -> None:
    from localspec.backends.base import ChatMessage
    from localspec.backends.chat_template import choose_chat_format, conversation_text
    from localspec.backends.llama.backend import load
    from localspec.errors import UsageError

    with pytest.raises(UsageError, match="neither a known format nor a file"):
        choose_chat_format(None, "vicuna")  # type: ignore[arg-type]
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}>")
    b = load(str(smollm2_path), n_ctx=256, threads=1)
    try:
        fmt = choose_chat_format(b, str(f))
        assert conversation_text(b, [ChatMessage("user", "hi")], fmt) == "[user] hi\n>"
        assert choose_chat_format(b).source == "model"  # SmolLM2 ships its own
    finally:
        b.close()


# -- near-ties in --json ---------------------------------------------------------------------------


def test_json_marks_greedy_near_ties(smollm2_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", "Write a long story about a fox.", "--target",
         str(smollm2_path), "--draft-method", "ngram", "--max-tokens", "200", "--json"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=_env(), timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    ties = out["stats"]["near_ties"]
    assert isinstance(ties, list)
    for tie in ties:
        assert 0 <= tie["position"] < len(out["tokens"]) and out["tokens"][tie["position"]] == tie["token"]
        assert 0 <= tie["gap"] < 0.1 and tie["runner_up"] != tie["token"]


# -- limits, ignored options, the small things -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-k", "1000"], "above the longest draft localspec verifies (64)"),
        (["-k", "0", "--draft-method", "model"], "at least one draft token per round"),
        (["--threads", "-1"], "--threads must be at least 1"),
        (["--n-ctx", "64"], "below the smallest context"),
    ],
)
def test_bad_numbers_are_refused_before_any_model_loads(args: list[str], message: str, tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    t, d, _ = tiny_ggufs
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", "Say hi", "--target", str(t), "--draft", str(d), *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert "loading" not in r.stderr  # refused up front: no work that grows with k
    assert time.monotonic() - t0 < 30


def test_draft_given_to_a_method_that_ignores_it_is_said(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    t, _, other = tiny_ggufs
    r = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", "Say hi", "--target", str(t), "--draft", str(other),
         "--draft-method", "ngram", "--max-tokens", "4"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "--draft is not used by --draft-method ngram" in r.stderr


def test_stats_after_an_immediate_stop_read_well() -> None:
    from localspec.decoding.stats import SpecStats
    from localspec.report import summary_lines

    stats = SpecStats(
        "llama.cpp", "CPU", "t", "none", "none", "greedy", 0, 0.0, 1, 10, 0, 0.1, 1, 0.0, 0, 0, 0, 0.0, 0.0, (), (),
        "stopped",
    )  # fmt: skip
    text = "\n".join(summary_lines(stats))
    assert "1 token " in text or "1 token (" in text
    assert "1 tokens" not in text and "0.00 tok/s" not in text and "| -" not in text and "by position" not in text


def test_saved_transcript_closes_a_cut_code_fence() -> None:
    from localspec.tui.transcript import close_fences

    cut = "Here:\n\n```python\nprint('hi')"
    closed = close_fences(cut)
    assert closed.endswith("\n```") and closed.count("```") == 2
    assert close_fences("~~~~\ncode\n```\nstill code").endswith("~~~~")
    done = "```\nx\n```\n"
    assert close_fences(done) == done
