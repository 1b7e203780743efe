"""Plain decoding through localspec's engine vs llama-cpp-python's own greedy generation loop.

Same GGUF, same prompt tokens, same threads, context and batch size; greedy; the two loops alternate
repetitions (and which goes first) so that a slow spell on a shared machine hits both. Both rates
count the tokens after the first one (the prompt pass) over the time from the first token to the
last. Bar: the engine runs at >= 95% of llama-cpp-python's loop.

    python benchmarks/engine_overhead.py MODEL.gguf [--threads 2] [--tokens 96] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

PROMPT = (
    "<|im_start|>user\nWrite a Python module with a class `Matrix` that supports addition, multiplication, "
    "transpose and a readable __repr__, with docstrings and a few examples.<|im_end|>\n<|im_start|>assistant\n"
)


def engine_tps(target, tokens: list[int], n: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    from localspec.decoding.drafters import NoDrafter
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    done = None
    for ev in generate(
        target, NoDrafter(), tokens, GenerationConfig(max_tokens=n, num_draft=0, sampling=SamplingParams())
    ):
        if isinstance(ev, Done):
            done = ev
    assert done is not None
    return done.stats.decode_tps, done.stats.n_generated


def llama_tps(llm, tokens: list[int], n: int) -> float:  # type: ignore[no-untyped-def]
    t0 = t_end = 0.0
    count = 0
    for _tok in llm.generate(tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        count += 1
        t_end = time.perf_counter()
        if count == 1:
            t0 = t_end
        if count >= n:
            break
    return (count - 1) / (t_end - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=None, help="default: localspec's default (all logical CPUs)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-ctx", type=int, default=4096)
    args = ap.parse_args()

    import os

    import llama_cpp

    from localspec.backends.llama import backend

    threads = args.threads or os.cpu_count() or 1
    target = backend.load(args.model, n_ctx=args.n_ctx, threads=threads, n_gpu_layers=-1)
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=args.n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        n_ubatch=512,
        n_gpu_layers=-1,
        verbose=False,
    )
    tokens = target.tokenize(PROMPT, add_special=True, parse_special=True)
    # Warm-up both (and fix n to what the engine generates before an end-of-generation token).
    _, n = engine_tps(target, tokens, args.tokens)
    llama_tps(llm, tokens, n)
    ours, theirs, ratios = [], [], []
    for rep in range(args.reps):
        if rep % 2 == 0:
            a, _ = engine_tps(target, tokens, n)
            b = llama_tps(llm, tokens, n)
        else:
            b = llama_tps(llm, tokens, n)
            a, _ = engine_tps(target, tokens, n)
        ours.append(a)
        theirs.append(b)
        ratios.append(a / b)
        print(f"rep {rep + 1}: engine {a:.2f} tok/s, llama-cpp-python {b:.2f} tok/s, ratio {a / b:.3f}", flush=True)
    r = statistics.median(ratios)
    print(
        f"{args.model.rsplit('/', 1)[-1]} | {threads} threads | {n} tokens | {args.reps} reps: engine median "
        f"{statistics.median(ours):.2f} tok/s, llama-cpp-python {statistics.median(theirs):.2f} tok/s, "
        f"median paired ratio {r:.3f} ({'meets' if r >= 0.95 else 'BELOW'} the 0.95 bar)"
    )
    target.close()
    llm.close()


if __name__ == "__main__":
    main()
