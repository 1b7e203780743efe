"""`localspec serve --parallel N`: a real server process on SmolLM2-135M decoding several requests together
(server/parallel_scheduler.py). Greedy answers decoded together equal each answered alone (near-ties aside), a
prompt shares the prefix another sequence holds, the last of four clients hears its first token before the first
client is done (the streams interleave), a client that goes away frees its sequence, the queue bound still answers 503, /metrics shows batches of several sequences,
and targets that cannot decode together are refused with the reason. The same on MLX (a tiny random model).
A head method, whose hidden states the sequences do not capture, is a 400."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("prometheus_client")

from serve_process import ServeProcess, httpx
from test_serve import metrics

PROMPTS = [
    "One, two, three, four, five, six,",  # first: it runs to the token limit, so the others arrive while it decodes
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The capital of France is",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]
N_TOKENS = 64


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[ServeProcess]:
    s = ServeProcess("--target", str(smollm2_path), "--draft-method", "ngram", "-k", "3", "--n-ctx", "512",
                     "--parallel", "4", "--max-queue", "0", "--model-name", "smol")  # fmt: skip
    yield s
    s.close()


def _complete(s: ServeProcess, prompt: str | list[int], **kw: Any) -> str:
    body = {"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0, **kw}
    r = httpx.post(f"{s.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def _stream(s: ServeProcess, prompt: str, times: dict[str, float], t0: float) -> str:
    """A streamed completion; `times` gets when its first text and its end arrived (seconds after t0)."""
    body = {"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0, "stream": True}
    parts = []
    with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            text = json.loads(line[6:])["choices"][0]["text"]
            if text and "first" not in times:
                times["first"] = time.perf_counter() - t0
            parts.append(text)
    times["end"] = time.perf_counter() - t0
    return "".join(parts)


def _alone_prefix(smollm2_path: Path, prompt: str) -> tuple[str, str]:
    """(the greedy answer decoded alone in this process, its text before its first near-tie)."""
    from localspec.backends.llama import backend as lb
    from localspec.decoding.drafters import NgramDrafter
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    t = lb.load(str(smollm2_path), n_ctx=512, threads=1)
    try:
        tokens = t.tokenize(prompt, add_special=True, parse_special=False)
        cfg = GenerationConfig(max_tokens=N_TOKENS, num_draft=0, sampling=SamplingParams(temperature=0.0))
        done = list(generate(t, NgramDrafter(), tokens, cfg))[-1]
        assert isinstance(done, Done)
        cut = min([tie.position for tie in done.stats.near_ties] or [len(done.tokens)])
        d = t.detokenizer()
        return done.text, d.add(list(done.tokens[:cut])) + d.flush()
    finally:
        t.close()


def test_four_clients_together_get_each_ones_greedy_text_and_interleave(
    server: ServeProcess, smollm2_path: Path
) -> None:
    alone = [_complete(server, p) for p in PROMPTS]
    t0 = time.perf_counter()
    times: list[dict[str, float]] = [{} for _ in PROMPTS]
    texts: dict[int, str] = {}
    errors: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            time.sleep(0.03 * i)  # in order: the fourth arrives while the first decodes
            texts[i] = _stream(server, PROMPTS[i], times[i], t0)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(180)
    assert not errors, errors
    assert times[3]["first"] < times[0]["end"], times  # the fourth client did not wait for the first to finish
    for i, prompt in enumerate(PROMPTS):
        if texts[i] != alone[i]:  # batched arithmetic may flip a near-tie: equal up to the first one
            _, before_tie = _alone_prefix(smollm2_path, prompt)
            assert texts[i].startswith(before_tie) and alone[i].startswith(before_tie), (i, texts[i], alone[i])
    m = metrics(server)
    assert m["localspec:batch_sequences_per_pass_count"] > m["localspec:batch_sequences_per_pass_bucket{le=1.0}"]
    assert m["localspec:batch_tokens_total"] >= m["localspec:batch_sequences_per_pass_count"]


def _wait_running(s: ServeProcess, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while metrics(s)["localspec:num_requests_running"] != n:
        assert time.monotonic() < deadline, metrics(s)
        time.sleep(0.05)


def test_when_every_sequence_is_busy_503_and_a_client_that_leaves_frees_its_sequence(server: ServeProcess) -> None:
    body = {"max_tokens": 400, "temperature": 0.8, "seed": 3, "stream": True}
    with contextlib.ExitStack() as stack:
        streams, readers = [], []  # a line iterator dropped unread closes its connection: keep them
        for _ in range(4):
            r = stack.enter_context(httpx.stream("POST", f"{server.url}/v1/completions", timeout=120,
                                                 json={**body, "prompt": "Count: 1 2 3"}))  # fmt: skip
            lines = r.iter_lines()
            assert any('"text"' in next(lines) for _ in range(6))  # it runs
            streams.append(r)
            readers.append(lines)
        _wait_running(server, 4)
        busy = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "queue_full"
        streams[0].close()  # the first client goes away: its sequence is free within a round
        _wait_running(server, 3)
        t0 = time.perf_counter()
        ok = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "temperature": 0},
                        timeout=60)  # fmt: skip
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
        assert time.perf_counter() - t0 < 30
    deadline = time.monotonic() + 30
    while metrics(server)["localspec:num_requests_running"] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_conversations_next_turn_reuses_its_sequences_cache(server: ServeProcess) -> None:
    first = "Tell me about the moon and its phases in detail, please. The moon"
    answer = _complete(server, first, max_tokens=8)
    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                   json={"prompt": first + answer + " And the sun?", "max_tokens": 4, "temperature": 0})  # fmt: skip
    t = r.json()["timings"]
    assert t["cache_n"] >= 10  # the first turn's prompt came from its sequence's cache


def test_a_prefix_another_sequence_holds_is_shared_not_read_again(server: ServeProcess) -> None:
    """Two agents with one system prompt: the second request, arriving while the first decodes, takes the
    shared prefix from the first's busy sequence (LlamaParallel.share) and reads only its own end."""
    system = "You are a careful assistant. Answer in full sentences and check each step twice. " * 3
    body = {"max_tokens": 200, "temperature": 0.8, "seed": 5, "stream": True, "prompt": system + "Tell a story:"}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as first:
        lines = first.iter_lines()
        assert any('"text"' in next(lines) for _ in range(6))  # the first decodes in its sequence
        r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                       json={"prompt": system + "Name a colour:", "max_tokens": 4, "temperature": 0})  # fmt: skip
        assert r.status_code == 200, r.text
        t, usage = r.json()["timings"], r.json()["usage"]
        assert t["cache_n"] >= 40 and t["prompt_n"] <= usage["prompt_tokens"] - 40
        first.close()


def _refusal(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localspec.cli", "serve", *argv, "--port", "0"],
                          capture_output=True, text=True, check=False, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def mlx_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("mlx_lm")
    import mlx_tiny

    root = tmp_path_factory.mktemp("mlx-serve")
    return {"qwen2": mlx_tiny.build(root / "qwen2", seed=5),
            "hybrid": mlx_tiny.build(root / "hybrid", seed=5, config=mlx_tiny.QWEN35_CONFIG)}  # fmt: skip


@pytest.mark.mlx
def test_mlx_serves_clients_together_each_as_alone(mlx_dirs: dict[str, Path]) -> None:
    """--parallel on MLX (localspec/backends/mlx/multi.py): three streamed clients at once get the texts each got alone,
    and /metrics shows passes of several sequences."""
    s = ServeProcess("--backend", "mlx", "--target", str(mlx_dirs["qwen2"]), "--draft-method", "ngram", "-k", "3",
                     "--n-ctx", "512", "--parallel", "3")  # fmt: skip
    try:
        alone = [_complete(s, p) for p in PROMPTS[:3]]
        t0 = time.perf_counter()
        times: list[dict[str, float]] = [{} for _ in range(3)]
        texts: dict[int, str] = {}
        threads = [threading.Thread(target=lambda i=i: texts.__setitem__(i, _stream(s, PROMPTS[i], times[i], t0)))
                   for i in range(3)]  # fmt: skip
        for th in threads:
            th.start()
        for th in threads:
            th.join(180)
        assert [texts.get(i) for i in range(3)] == alone
        m = metrics(s)
        assert m["localspec:batch_sequences_per_pass_count"] > m["localspec:batch_sequences_per_pass_bucket{le=1.0}"]
    finally:
        s.close()


@pytest.mark.mlx
def test_parallel_on_a_hybrid_mlx_target_is_refused_with_the_reason(mlx_dirs: dict[str, Path]) -> None:
    r = _refusal("--backend", "mlx", "--target", str(mlx_dirs["hybrid"]), "--draft-method", "none", "--parallel", "2")
    assert r.returncode != 0 and "recurrent" in r.stderr and "--parallel 1" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_a_head_method_is_a_400_under_parallel(server: ServeProcess, method: str) -> None:
    """A head reads the target's hidden states, which the parallel sequences do not capture: refused, never drafted
    badly."""
    body = {"prompt": PROMPTS[2], "max_tokens": 4, "speculative": {"method": method}}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and "--parallel 1" in r.text, r.text


def test_parallel_on_a_hybrid_target_is_refused_with_the_reason(hybrid_ggufs) -> None:  # type: ignore[no-untyped-def]
    r = _refusal(
        "--target", str(hybrid_ggufs["lfm2"][0]), "--draft-method", "none", "--n-ctx", "256", "--parallel", "2"
    )
    assert r.returncode != 0 and "recurrent" in r.stderr and "--parallel 1" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_prompt_longer_than_a_sequence_is_a_400_and_the_server_serves_on(server: ServeProcess) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "word " * 700, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400, r.text
    assert _complete(server, PROMPTS[0], max_tokens=3)


def _remember_gpu_like_costs(path: Path) -> None:
    """Costs as a GPU measures them (a batch of 16 about one token's pass, a draft step a tenth of one), remembered
    for the pair (path, path) where serve looks for them. On this CPU a draft as large as its target cannot pay, and
    the requests plan it away after a round or two, sooner or later by the timings: with these costs every request
    drafts its first rounds with the model, whatever the timings."""
    from localspec.backends.llama.backend import device_for
    from localspec.decoding.cost_cache import CostStore
    from localspec.decoding.policy import CostModel

    device = device_for(path, threads=None, n_gpu_layers=-1)
    assert device is not None
    store = CostStore.for_models(target=str(path), draft=str(path), backend="llama", device=device, threads=None)
    t1 = 0.007
    store.save(CostModel(target={1: t1, 2: 1.02 * t1, 4: 1.05 * t1, 8: 1.1 * t1, 16: 1.3 * t1}, draft_token=0.1 * t1))


@pytest.mark.parametrize("method", ["model", "auto"])
def test_every_request_drafts_with_the_draft_model_in_its_own_sequence(smollm2_path: Path, method: str) -> None:
    """The draft model has a sequence of its own per request (serve.open_draft_parallel): a request that arrives
    while another is decoding drafts with the model too, from its own cache, and answers as it would alone."""
    if method == "model":
        _remember_gpu_like_costs(smollm2_path)
    s = ServeProcess("--target", str(smollm2_path), "--draft", str(smollm2_path), "--draft-method", method,
                     "-k", "3", "--n-ctx", "512", "--parallel", "2")  # fmt: skip
    try:
        alone = httpx.post(f"{s.url}/v1/completions", timeout=60,
                           json={"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0}).json()  # fmt: skip
        body = {"prompt": "Count: 1 2 3", "max_tokens": 300, "temperature": 0.7, "seed": 1, "stream": True}
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            assert any('"text"' in next(lines) for _ in range(6))  # the first is drafting with the model
            second = httpx.post(f"{s.url}/v1/completions", timeout=60,
                                json={"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0})  # fmt: skip
            assert second.status_code == 200, second.text
            timings = second.json()["timings"]
            assert timings["draft_method"] == method
            if method == "model":
                assert timings["draft_sources"].get("model", 0) > 0  # rounds it drafted with the model
            finals = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert finals[-1]["timings"]["draft_method"] == method
        if method == "model":
            assert finals[-1]["timings"]["draft_sources"].get("model", 0) > 0  # the first drafted with it as well
        assert second.json()["choices"][0]["text"] == alone["choices"][0]["text"]
    finally:
        s.close()


def test_each_sequence_that_read_the_suffix_memory_writes_its_answer_there(
    smollm2_path: Path, _private_cost_cache: Path
) -> None:
    """Two suffix-drafting requests decoded together: both are remembered (each keeps its own claim), each
    document its request's prompt followed by its answer (a document without its prompt would teach the next
    request nothing about where the answer came from)."""
    from localspec.decoding.suffix_memory import decode, list_docs

    s = ServeProcess("--target", str(smollm2_path), "--draft-method", "suffix", "--n-ctx", "512", "--parallel", "2")
    try:
        prompts = [httpx.post(f"{s.url}/tokenize", json={"content": PROMPTS[i], "add_special": True}).json()["tokens"]
                   for i in range(2)]  # fmt: skip
        texts: dict[int, str] = {}
        threads = [threading.Thread(target=lambda i=i: texts.__setitem__(i, _complete(s, prompts[i], max_tokens=40)))
                   for i in range(2)]  # fmt: skip
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert len(texts) == 2
        dirs = [sub for sub in (_private_cost_cache / "suffix").iterdir() if sub.is_dir()]
        docs = [decode((d / doc.name).read_bytes()) for d in dirs for doc in list_docs(d)]  # written before the reply
        assert len(docs) == 2 and all(doc is not None for doc in docs), docs
        for i, prompt in enumerate(prompts):
            mine = [doc for doc in docs if doc is not None and doc[: len(prompt)].tolist() == prompt]
            assert len(mine) == 1, f"no stored document starts with request {i}'s prompt"
            answer = mine[0][len(prompt) :].tolist()
            said = httpx.post(f"{s.url}/detokenize", json={"tokens": answer}).json()["content"]
            assert said == texts[i], (said, texts[i])
    finally:
        s.close()


def test_a_draft_model_that_cannot_decode_in_parallel_is_lent_to_one_sequence_at_a_time(smollm2_path: Path) -> None:
    """Where the draft model cannot decode in parallel (serve.open_draft_parallel gave a reason), the first sequence
    that asks for it holds it; the next looks up: n-gram lookup for `model`, auto without its model for `auto`."""
    from localspec.backends.llama.multi import LlamaParallel
    from localspec.options import ModelOptions
    from localspec.pipeline import load_pipeline
    from localspec.server.metrics import Metrics
    from localspec.server.parallel_scheduler import ParallelScheduler

    pipe = load_pipeline(ModelOptions(target=str(smollm2_path), draft=str(smollm2_path), draft_method="model",
                                      n_ctx=256, threads=1))  # fmt: skip
    logged: list[str] = []
    scheduler = ParallelScheduler(pipe, LlamaParallel(pipe.target, 2, 128), max_queue=0, metrics=Metrics(),  # type: ignore[arg-type]
                                  log=logged.append, draft_batch="its layers are recurrent")  # fmt: skip
    try:
        assert any("one request at a time" in line for line in logged)
        first, lent, models = scheduler._seat_drafter("model", 0)
        assert (first.method, lent, models) == ("model", "model", True)
        second, lent, models = scheduler._seat_drafter("model", 1)
        assert (second.method, lent, models) == ("ngram", None, False)
        busy_auto, lent, _ = scheduler._seat_drafter("auto", 1)
        assert busy_auto.method == "auto" and lent == "auto"  # auto's own drafter was free: lent
        again, lent, models = scheduler._seat_drafter("auto", 0)
        assert again.method == "auto" and lent is None and not models  # auto without its model
    finally:
        scheduler.close()
        pipe.close()


def test_while_no_request_runs_autos_calibration_times_the_parallel_curve(smollm2_path: Path) -> None:
    """Idle-time calibration runs under --parallel too (on the target's own context, between requests), and the
    sizes it timed become the decoder's T(n) before any pass has measured them."""
    from localspec.backends.llama.multi import LlamaParallel
    from localspec.options import ModelOptions
    from localspec.pipeline import load_pipeline
    from localspec.server.metrics import Metrics
    from localspec.server.parallel_scheduler import ParallelScheduler

    pipe = load_pipeline(ModelOptions(target=str(smollm2_path), draft_method="auto", n_ctx=512, threads=1))
    logged: list[str] = []
    scheduler = ParallelScheduler(pipe, LlamaParallel(pipe.target, 2, 256), max_queue=0, metrics=Metrics(),  # type: ignore[arg-type]
                                  log=logged.append)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while scheduler._idle is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scheduler._idle is None and scheduler.idle_pieces > 0, logged
        assert any("cost curve timed" in line for line in logged), logged
        sizes = sorted(scheduler.decoder.costs.target)
        assert len(sizes) >= 3 and sizes[-1] > 2, sizes  # sizes no parallel pass has run (it has run none)
    finally:
        scheduler.close()
        pipe.close()
