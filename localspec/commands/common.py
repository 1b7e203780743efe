"""Options shared by the commands that load models (run, chat, bench), and their conversion."""

from __future__ import annotations

import argparse

from localspec.errors import UsageError
from localspec.loader import DRAFT_METHODS, LoadOptions
from localspec.spec.engine import GenerationConfig
from localspec.spec.sampling import SamplingParams

AUTO_BY_DEFAULT = True  # auto met the bar of issue 6 (bench on the 2-core CPU reference machine)
DEFAULT_METHOD_HELP = "auto" if AUTO_BY_DEFAULT else "model when a draft is given, else ngram"
FIXED_K = 4  # -k default for fixed draft lengths
AUTO_MAX_K = 8  # -k default for auto: the longest draft it may choose


def add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--backend", default="llama", choices=("auto", "llama", "mlx"), help="inference backend (default: llama)")
    g.add_argument("--target", help="target model: GGUF file (llama) or mlx-lm directory / repo id (mlx)")
    g.add_argument("--draft", help="draft model, same tokenizer as the target")
    g.add_argument("--pair", help="a catalog pair name (see `localspec models`) instead of --target/--draft")
    g.add_argument(
        "--draft-method",
        choices=DRAFT_METHODS,
        default=None,
        help="auto: measure costs and acceptance, pick the draft (n-gram, model or none) and its length each "
        "round; model: a draft model; ngram: prompt lookup, no model; none: plain decoding "
        f"(default: {DEFAULT_METHOD_HELP})",
    )
    g.add_argument("--n-ctx", type=int, default=4096, help="context window in tokens (default: 4096)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    g.add_argument("--n-gpu-layers", type=int, default=-1, help="layers to offload to the GPU; -1 all (default)")


def add_generation_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation")
    g.add_argument(
        "-k",
        "--num-draft",
        type=int,
        default=None,
        help=f"draft tokens per round; with auto the most it may choose (default: {FIXED_K}; auto {AUTO_MAX_K})",
    )
    g.add_argument("--rule", choices=("exact", "match"), default="exact", help="verification rule (default: exact)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    g.add_argument("--top-k", type=int, default=0, help="0: off")
    g.add_argument("--top-p", type=float, default=1.0, help="1.0: off")
    g.add_argument("--min-p", type=float, default=0.0, help="0: off")
    g.add_argument("--seed", type=int, default=None, help="random seed (default: fresh, reported in the stats)")
    g.add_argument("--max-tokens", type=int, default=512, help="most tokens to generate (default: 512)")
    g.add_argument("--system", default=None, help="system prompt")


def load_options(args: argparse.Namespace) -> LoadOptions:
    target, draft = args.target, args.draft
    if args.pair:
        if target or draft:
            raise UsageError("--pair cannot be combined with --target/--draft", "use one or the other")
        from localspec.catalog import resolve_pair
        from localspec.loader import resolve_backend

        target, draft = resolve_pair(args.pair, resolve_backend(args.backend)[0])
    if not target:
        raise UsageError("no target model given", "pass --target PATH, or --pair NAME (see `localspec models`)")
    method = draft_method(args, draft)
    if args.n_ctx < 16:
        raise UsageError(f"--n-ctx {args.n_ctx} is too small", "use at least a few hundred tokens, e.g. --n-ctx 4096")
    return LoadOptions(
        target=target,
        draft=draft if method in ("model", "auto") else None,
        backend=args.backend,
        draft_method=method,
        max_draft=num_draft(args, method),
        n_ctx=args.n_ctx,
        threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
    )


def draft_method(args: argparse.Namespace, draft: str | None) -> str:
    if args.draft_method:
        return str(args.draft_method)
    if AUTO_BY_DEFAULT:
        return "auto"
    return "model" if draft else "ngram"


def num_draft(args: argparse.Namespace, method: str) -> int:
    if args.num_draft is not None:
        return int(args.num_draft)
    return AUTO_MAX_K if method == "auto" else FIXED_K


def generation_config(args: argparse.Namespace) -> GenerationConfig:
    sampling = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed
    )
    k = num_draft(args, draft_method(args, args.draft))
    return GenerationConfig(max_tokens=args.max_tokens, num_draft=k, rule=args.rule, sampling=sampling)
