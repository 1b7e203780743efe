"""What copying logits to host memory costs per speculative round on MLX, against doing the work on
the device.

Every round the engine gets the target's logits for k+1 positions as a numpy array [k+1, V] and
either takes the argmax (temperature 0) or turns them into probabilities in float64 and runs the
exact rule. This script times, per round, with the backend's own model and cache:

  forward      the verify pass itself (k+1 tokens, evaluated on the device)
  to_host      np.asarray(logits): the transfer the engine pays now
  greedy_host  numpy argmax on the host copy           greedy_dev   mx.argmax + .tolist()
  sample_host  localspec.sampling.probabilities (float64, temperature + top-p) on p and q,
               then verify_exact
  sample_dev   the same processing in MLX on the device (float32), pulling only the k ratios
               p_i(d_i)/q_i(d_i) and one sampled id

    python benchmarks/mlx_host_transfer.py                      # a tiny random model (fast forward)
    python benchmarks/mlx_host_transfer.py --model DIR -k 4     # a real mlx-lm directory

The tiny model makes the forward cheap, like a GPU would, so the fixed per-round costs show.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


TEXT = (
    "def is_prime(n):\n    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n"
    "        if n % d == 0:\n            return False\n    return True\n\n"
    "The function above checks divisors up to the square root of n, which is enough because a larger "
    "factor would pair with a smaller one that was already tried. "
)


def device_probs(logits, temperature: float, top_p: float):  # type: ignore[no-untyped-def]
    """[n, V] logits -> [n, V] processed probabilities, on the device (mirrors spec.sampling)."""
    import mlx.core as mx

    p = mx.softmax(logits / temperature, axis=-1)
    if top_p < 1.0:
        order = mx.argsort(-p, axis=-1)
        sorted_p = mx.take_along_axis(p, order, axis=-1)
        cum = mx.cumsum(sorted_p, axis=-1)
        keep_sorted = (cum - sorted_p) < top_p  # keep until the mass before a token reaches top_p
        keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
        p = mx.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    return p


def device_verify(draft: list[int], q, p, rng: np.random.Generator, key):  # type: ignore[no-untyped-def]
    """verify_exact with p [k+1, V], q [k, V] on the device; only k ratios and one id come back."""
    import mlx.core as mx

    k = len(draft)
    idx = mx.array(draft)[:, None]
    ratios = (mx.take_along_axis(p[:k], idx, axis=-1) / mx.take_along_axis(q, idx, axis=-1))[:, 0].tolist()
    for i, r in enumerate(ratios):
        if r >= 1.0 or rng.random() < r:
            continue
        residual = mx.maximum(p[i] - q[i], 0.0)
        return i, int(mx.random.categorical(mx.log(residual), key=key).item())
    return k, int(mx.random.categorical(mx.log(p[k]), key=key).item())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="mlx-lm model directory (default: a tiny random model)")
    ap.add_argument("-k", type=int, default=4, help="draft tokens per round (the verify pass is k+1)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--context", type=int, default=64, help="tokens in the cache before timing")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    args = ap.parse_args()

    import mlx.core as mx

    from localspec.backends.mlx import backend
    from localspec.decoding.verify import verify_exact
    from localspec.sampling import SamplingParams, probabilities

    tmp = None
    if args.model is None:
        import mlx_tiny

        tmp = tempfile.TemporaryDirectory()
        cfg = dict(mlx_tiny.CONFIG, vocab_size=151936)  # a real vocabulary width: the logits are the cost
        model_dir = mlx_tiny.build(Path(tmp.name) / "tiny", seed=1, config=cfg)
    else:
        model_dir = Path(args.model)
    b = backend.load(str(model_dir), n_ctx=args.context + args.rounds + args.k + 8)
    rng = np.random.default_rng(0)
    key = mx.random.key(0)
    V = b.n_vocab
    # Real text, so a real model's distributions are as peaked as in use (top-p cost depends on it).
    text = b.tokenize(TEXT * (1 + 4 * (args.context + args.rounds * (args.k + 1)) // len(TEXT)))
    b.forward(text[: args.context], all_logits=False)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    q_logits = None  # the draft's logits: stand-in is the previous round's target logits [k, V]

    times: dict[str, list[float]] = {n: [] for n in ("forward", "to_host", "greedy_host", "greedy_dev",
                                                      "sample_host", "sample_dev")}  # fmt: skip
    clock = time.perf_counter
    for r in range(args.rounds + 2):
        n0 = len(b.cached_tokens)
        tokens = text[n0 : n0 + args.k + 1]
        t0 = clock()
        logits = b.forward_device(tokens)  # [k+1, V], evaluated
        t1 = clock()
        host = np.asarray(logits)
        t2 = clock()
        np.argmax(host, axis=-1)
        t3 = clock()
        mx.argmax(logits, axis=-1).tolist()
        t4 = clock()
        draft = tokens[1:]
        if q_logits is None:
            q_logits = logits[: args.k] + 0.0
            mx.eval(q_logits)
        q_host = probabilities(np.asarray(q_logits), params)  # the drafter's q, host side
        p_host = probabilities(host, params)
        verify_exact(draft, q_host, p_host, rng)
        t5 = clock()
        q_dev = device_probs(q_logits, args.temperature, args.top_p)
        p_dev = device_probs(logits, args.temperature, args.top_p)
        device_verify(draft, q_dev, p_dev, rng, key)
        t6 = clock()
        b.rollback(n0 + 1)  # keep one token, as a round that accepts nothing does
        if r >= 2:  # warm-up rounds compile and allocate
            for name, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
                times[name].append(dt * 1e3)

    fwd = statistics.median(times["forward"])
    print(f"model {model_dir.name}: V={V}, k={args.k} (verify batch {args.k + 1}), context {args.context}, "
          f"{args.rounds} rounds, device {b.info.device}, mlx {mx.__version__}")  # fmt: skip
    print(f"{'step':<12} {'median ms':>10} {'% of forward':>13}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:<12} {m:10.3f} {100 * m / fwd:12.1f}%")
    gh = statistics.median(times["to_host"]) + statistics.median(times["greedy_host"])
    sh = statistics.median(times["to_host"]) + statistics.median(times["sample_host"])
    print(f"greedy round overhead: host {gh:.3f} ms vs device {statistics.median(times['greedy_dev']):.3f} ms")
    print(f"sampling round overhead: host {sh:.3f} ms vs device {statistics.median(times['sample_dev']):.3f} ms")
    b.close()
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
