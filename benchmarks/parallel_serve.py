"""Four clients at once through a real server: `localspec serve --parallel 1` (one generation at a time, the
others queue) against `--parallel 4` (one shared target pass per step, drafts planned for the pass), and optionally
llama.cpp's llama-server with `--parallel 4` and the same pair.

Every client sends its request at the same moment and streams a greedy answer (--max-tokens, default 64).
Per configuration: aggregate tokens/s (all completion tokens over the wall time from the sends to the last
end), each client's time to first text, and the wall time. Configurations:
    (a) localspec --parallel 1, method none, plain prompts
    (b) localspec --parallel 4, method none, plain prompts
    (c) localspec --parallel 4, none and auto, copy-heavy prompts (each asks to repeat code it was given)
    (b-auto, only when named in --configs) localspec --parallel 4, auto, plain prompts
    (d) llama-server --parallel 4 with the draft model (--llama-server PATH), plain prompts
Before the servers start it times the target's T(n) (a forward pass of n tokens) in this process and prints it:
the parallel policy decides from the same curve, measured again inside the server as it runs.

    python benchmarks/parallel_serve.py --target T.gguf --draft D.gguf [--max-tokens 64] [--threads 2]
        [--llama-server /work/tools/llama.cpp/build/bin/llama-server] [--configs a,b,c,c-auto,d]
    python benchmarks/parallel_serve.py --backend mlx --target MLX_DIR [--draft MLX_DIR] --configs a,b,c,c-auto

On MLX the pass is right-padded (localspec/backends/mlx/multi.py): the replay plans with rows x the longest draft.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from agent_session import LlamaServer  # noqa: E402  (beside this file)
from serve_process import ServeProcess, httpx  # noqa: E402

PLAIN = (
    "Write a Python function that checks whether a number is prime.",
    "Explain in a few sentences how a hash map works.",
    "Write a haiku about autumn leaves, then explain it.",
    "List five tips for writing readable code.",
)
CODE = """def load(path):
    with open(path) as f:
        rows = [line.strip().split(",") for line in f]
    header, body = rows[0], rows[1:]
    return [dict(zip(header, row)) for row in body]


def total(rows, key):
    return sum(float(row[key]) for row in rows if row.get(key))
"""
COPY = tuple(
    f"Here is a file:\n\n{CODE}\nRepeat the file exactly, {change}. Output only the code."
    for change in ("renaming `rows` to `records`", "adding a docstring to each function",
                   "renaming `total` to `sum_column`", "with type hints added")
)  # fmt: skip


@dataclass(frozen=True)
class ClientResult:
    ttft_s: float
    end_s: float
    tokens: int
    acceptance: float = 0.0  # timings.acceptance_rate of its answer


@dataclass(frozen=True)
class RunResult:
    label: str
    clients: list[ClientResult]

    @property
    def wall_s(self) -> float:
        return max(c.end_s for c in self.clients)

    @property
    def tps(self) -> float:
        return sum(c.tokens for c in self.clients) / self.wall_s


def ask(url: str, prompt: str, max_tokens: int, t0: float) -> ClientResult:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    ttft, tokens, acceptance = None, 0, 0.0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                tokens = int(data["usage"]["completion_tokens"])
            acceptance = float((data.get("timings") or {}).get("acceptance_rate") or acceptance)
            choices = data.get("choices") or []
            if ttft is None and choices and (choices[0].get("delta") or {}).get("content"):
                ttft = time.perf_counter() - t0
    end = time.perf_counter() - t0
    return ClientResult(ttft if ttft is not None else end, end, tokens, acceptance)


def all_at_once(url: str, prompts: tuple[str, ...], max_tokens: int) -> list[ClientResult]:
    """Every prompt sent at once, each from its own client thread."""
    out: list[ClientResult | None] = [None] * len(prompts)
    t0 = time.perf_counter()

    def one(i: int) -> None:
        out[i] = ask(url, prompts[i], max_tokens, t0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(r is not None for r in out), "a client failed"
    return [r for r in out if r is not None]


def measure_t(
    target: str, threads: int, backend: str = "llama", sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
) -> dict[int, float]:
    """T(n): the median time of a forward pass of n tokens on a 256-token prefix, in this process."""
    if backend == "mlx":
        from localspec.backends.mlx import backend as mb

        t = mb.load(target, n_ctx=1024)
    else:
        from localspec.backends.llama import backend as lb

        t = lb.load(target, n_ctx=1024, threads=threads)
    try:
        prefix = t.tokenize(CODE * 3)[:256]
        t.forward(prefix, all_logits=False)
        out = {}
        for n in sizes:
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                t.forward(prefix[:n], all_logits=True)
                times.append(time.perf_counter() - t0)
                t.rollback(len(prefix))
            out[n] = statistics.median(times)
        return out
    finally:
        t.close()


def run_localspec(
    args: argparse.Namespace, label: str, parallel: int, method: str, prompts: tuple[str, ...]
) -> RunResult:
    extra = ["--draft", args.draft] if method in ("auto", "model") and args.draft else []
    s = ServeProcess("--backend", args.backend, "--target", args.target, *extra, "--draft-method", method,
                     "--parallel", str(parallel),
                     "--threads", str(args.threads), "--n-ctx", str(args.n_ctx), "--model-name", "m")  # fmt: skip
    try:
        all_at_once(s.url, prompts[:1], 4)  # warm-up: the template prefix cached, the first pass's allocations done
        return RunResult(label, all_at_once(s.url, prompts, args.max_tokens))
    finally:
        s.close()


def run_llama_server(args: argparse.Namespace, prompts: tuple[str, ...]) -> RunResult:
    argv = ["-m", args.target, "-t", str(args.threads), "-tb", str(args.threads), "-c", str(4 * args.n_ctx),
            "-np", "4", "--jinja"]  # fmt: skip
    if args.draft:
        argv += ["-md", args.draft, "--spec-draft-n-max", "8", "-td", str(args.threads)]
    s = LlamaServer(args.llama_server, argv)
    try:
        all_at_once(s.url, prompts[:1], 4)
        return RunResult(
            f"llama-server -np 4{' + draft' if args.draft else ''}", all_at_once(s.url, prompts, args.max_tokens)
        )
    finally:
        s.close()


def replay(curve: dict[int, float], r: RunResult, padded: bool = False) -> None:
    """The parallel policy's plan for the run's four acceptances (lookup drafts, up to 8 tokens each) on the
    measured T(n) and on a GPU-like one (flat to 8 tokens, then linear): draft lengths, and the expected
    rate against plain batched decoding."""
    from localspec.decoding.parallel import Candidate, plan_parallel, summed
    from localspec.decoding.policy import CostModel

    measured = CostModel(dict(curve))
    t1 = curve[1]
    curves = {"measured": measured.target_s, "GPU-like": lambda n: t1 * max(1.0, n / 8)}
    candidates = [Candidate((min(max(c.acceptance, 0.05), 0.95),) * 8) for c in r.clients]
    print(f"\nreplay of {r.label.strip()} (acceptance " + ", ".join(f"{c.acceptance:.0%}" for c in r.clients) + "):")
    for name, t in curves.items():
        plan = plan_parallel(candidates, t, (lambda ls: len(ls) * max(ls)) if padded else summed)
        print(f"  {name:<9} T(n): draft lengths {plan.lengths}, expected {plan.rate / plan.plain_rate:.2f}x "
              "plain batched decoding")  # fmt: skip


def row(r: RunResult) -> str:
    ttfts = " ".join(f"{c.ttft_s:5.2f}" for c in r.clients)
    tokens = sum(c.tokens for c in r.clients)
    return f"{r.label:<34} {tokens:>6} {r.wall_s:>7.2f} {r.tps:>7.2f}   {ttfts}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("llama", "mlx"), default="llama")
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", help="a draft model for auto and llama-server")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=1024, help="context per sequence (default: %(default)s)")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary: adds it with --parallel 4")
    ap.add_argument("--configs", default="a,b,c,c-auto,d", help="which to run (default: %(default)s)")
    args = ap.parse_args()

    curve = measure_t(args.target, args.threads, args.backend)
    print("T(n) measured here: " + ", ".join(f"T({n}) {s * 1000:.1f} ms" for n, s in curve.items()), flush=True)
    print("  relative to T(1): " + ", ".join(f"{n}: {s / curve[1]:.2f}" for n, s in curve.items()), flush=True)
    plan = {
        "a": lambda: run_localspec(args, "(a) localspec -np 1, none", 1, "none", PLAIN),
        "b": lambda: run_localspec(args, "(b) localspec -np 4, none", 4, "none", PLAIN),
        "b-auto": lambda: run_localspec(args, "(b) localspec -np 4, auto", 4, "auto", PLAIN),
        "c": lambda: run_localspec(args, "(c) localspec -np 4, none, copy", 4, "none", COPY),
        "c-auto": lambda: run_localspec(args, "(c) localspec -np 4, auto, copy", 4, "auto", COPY),
        "d": lambda: run_llama_server(args, PLAIN),
    }
    chosen = [c for c in args.configs.split(",") if c != "d" or (args.llama_server and args.backend == "llama")]
    runs = {c: plan[c]() for c in chosen}
    print(f"\n{'configuration':<34} {'tokens':>6} {'wall s':>7} {'tok/s':>7}   time to first text per client (s)")
    for r in runs.values():
        print(row(r))
    if "c-auto" in runs:
        replay(curve, runs["c-auto"], padded=args.backend == "mlx")
    if "a" in runs and "b" in runs:
        a, b = runs["a"], runs["b"]
        print(f"\n--parallel 4 / --parallel 1 aggregate: {b.tps / a.tps:.2f}x; "
              f"4th client's first text at {b.clients[3].ttft_s:.2f} s of {b.wall_s:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
