"""One home for the options that decide a run, their defaults and limits.

Everything that starts a generation maps onto the same two value objects: ModelOptions (what to load:
models, backend, draft method, context) and GenerationConfig (how to generate; the draft length k lives
only there). The CLI flags of `run`, `chat`, `bench`, `doctor` and `serve`, a catalog pair's defaults
(models.toml), the chat app's settings and the server's request fields all go through the functions
below, so they share defaults and refuse the same bad values with the same words.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from localspec.decoding.engine import GenerationConfig
from localspec.sampling import SamplingParams
from localspec.decoding.verify import RULES
from localspec.errors import UsageError

BACKENDS = ("auto", "llama", "mlx")
DEFAULT_BACKEND = "auto"  # llama.cpp for GGUF files; MLX on Apple silicon when installed
DRAFT_METHODS = ("auto", "model", "ngram", "suffix", "none", "eagle3", "mtp", "dflash", "dspark")
HEAD_METHODS = ("eagle3", "mtp", "dflash", "dspark")  # drafters that read the target's hidden states (llama.cpp)
OWN_HEAD_METHODS = ("mtp",)  # heads inside the target's own GGUF: no --draft file
DEFAULT_DRAFT_METHOD = "auto"  # met the bar of issue 6 (bench on the 2-core CPU reference machine)
FIXED_K = 4  # k for fixed draft methods, unless a catalog pair says otherwise
AUTO_MAX_K = 32  # k for auto: the longest draft it may choose (long exact copies pay on a CPU, see DESIGN.md)
SUFFIX_K = 32  # k for suffix drafts: the longest; each draft is also limited by its match length
MAX_K = 64  # the longest draft any method may verify in one pass (and the recurrent snapshots kept)
DEFAULT_N_CTX = 4096
MIN_N_CTX = 256  # llama.cpp rounds smaller contexts up to 256; say so instead of doing it silently
DEFAULT_MAX_TOKENS = 512
DEFAULT_RULE = "exact"


@dataclass(frozen=True)
class ModelOptions:
    """What to load. `target`/`draft` are paths (GGUF files, mlx-lm directories or repo ids); `pair`
    names the catalog pair they came from, if any."""

    target: str
    draft: str | None = None
    backend: str = DEFAULT_BACKEND
    draft_method: str = DEFAULT_DRAFT_METHOD
    n_ctx: int = DEFAULT_N_CTX
    threads: int | None = None
    n_gpu_layers: int = -1  # -1: offload everything the build can
    pair: str | None = None
    chat_template: str | None = None  # a format name, "raw" or a Jinja file; None: the model's own (or its family's)
    # The longest draft the engine will verify: a recurrent/hybrid target keeps rollback snapshots for this
    # many tokens (longer drafts still run, restoring a saved state instead; see localspec.backends.base).
    max_draft: int = AUTO_MAX_K

    def __post_init__(self) -> None:
        check_choice("backend", self.backend, BACKENDS)
        check_choice("draft method", self.draft_method, DRAFT_METHODS)
        check_n_ctx(self.n_ctx)
        check_threads(self.threads)
        if not 0 <= self.max_draft <= MAX_K:
            raise UsageError(f"the longest draft must be 0..{MAX_K}, got {self.max_draft}", f"use -k {FIXED_K}")

    @property
    def uses_draft_model(self) -> bool:
        """Whether the draft model gets loaded: model drafting, or auto with a draft model given."""
        return bool(self.draft) and self.draft_method in ("model", "auto") and self.auto_head is None

    @property
    def auto_head(self) -> str | None:
        """The head family auto drafts with in place of a draft model (its costs measured, picked per round
        like one): --draft is an EAGLE-3, DFlash or DSpark head, or the target file itself for its own
        MTP layers (a catalog MTP pair). None otherwise, or for any other method."""
        if self.draft_method != "auto" or not self.draft:
            return None
        from pathlib import Path

        from localspec.heads import head_family

        family = head_family(self.draft)
        if family is None and str(self.draft).lower().endswith(".gguf"):
            try:
                same = Path(self.draft).expanduser().resolve() == Path(self.target).expanduser().resolve()
            except OSError:
                same = False
            family = "mtp" if same and has_mtp_layers(self.target) else None  # else a self-draft
        return family

    def with_method(self, method: str) -> ModelOptions:
        return replace(self, draft_method=method)


def has_mtp_layers(path: str) -> bool:
    """Whether a GGUF declares MTP (nextn) layers (False when it cannot be read: its loader says why)."""
    from localspec.errors import LocalspecError
    from localspec.gguf_meta import read_gguf_header

    try:
        header = read_gguf_header(path, check_size=False)
    except LocalspecError:
        return False
    return int(header.metadata.get(f"{header.architecture}.nextn_predict_layers", 0) or 0) > 0


# -- checks shared by every front end ----------------------------------------------------------------


def check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"unknown {what} {value!r}", f"choose one of: {', '.join(choices)}")


def check_n_ctx(n_ctx: int) -> None:
    if n_ctx < MIN_N_CTX:
        raise UsageError(
            f"--n-ctx {n_ctx} is below the smallest context llama.cpp builds ({MIN_N_CTX} tokens)",
            f"use at least {MIN_N_CTX}, e.g. --n-ctx {DEFAULT_N_CTX}",
        )


def check_threads(threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}", "leave it out to use every core")


def check_k(k: int, method: str) -> None:
    """The draft length a user asked for: 1..MAX_K (plain decoding is a method, not k=0)."""
    if method == "none":
        return
    if k < 1:
        raise UsageError(
            f"-k {k}: a draft method needs at least one draft token per round",
            "for plain decoding use --draft-method none; otherwise try -k 4",
        )
    if k > MAX_K:
        raise UsageError(
            f"-k {k} is above the longest draft localspec verifies ({MAX_K})",
            f"use -k {MAX_K} or less; auto picks shorter drafts by itself when they pay better",
        )


def default_k(method: str, pair_k: int | None = None) -> int:
    """k when none is given: auto's longest draft, or a fixed method's length (a catalog pair may set it)."""
    if method == "none":
        return 0
    if method == "auto":
        return max(AUTO_MAX_K, pair_k or 0)
    if method == "suffix":
        return SUFFIX_K
    return pair_k or FIXED_K


def generation_config(
    *,
    method: str,
    k: int | None = None,
    pair_k: int | None = None,
    rule: str = DEFAULT_RULE,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> GenerationConfig:
    """The GenerationConfig for these values; UsageError for any the engine refuses."""
    num_draft = default_k(method, pair_k) if k is None else k
    check_k(num_draft, method)
    check_choice("verification rule", rule, tuple(RULES))
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    return GenerationConfig(
        max_tokens=max_tokens, num_draft=0 if method == "none" else num_draft, rule=rule, sampling=sampling
    )


# -- command-line flags ------------------------------------------------------------------------------


def add_model_options(p: argparse.ArgumentParser, *, method: bool = True, first_use: bool = True) -> None:
    """The model flags; `first_use`: also -y/--yes and --no-pull (for commands that may pull a pair)."""
    g = p.add_argument_group("models")
    g.add_argument(
        "--backend", default=DEFAULT_BACKEND, choices=BACKENDS,
        help=f"inference backend; auto: llama.cpp for GGUF files, MLX on Apple silicon (default: {DEFAULT_BACKEND})",
    )  # fmt: skip
    g.add_argument("--target", help="target model: GGUF file (llama) or mlx-lm directory / repo id (mlx)")
    g.add_argument("--draft", help="draft model, same tokenizer as the target")
    g.add_argument(
        "--pair",
        help="a catalog pair name (see `localspec models`) instead of --target/--draft; "
        "with neither, the catalog's default pair",
    )
    if first_use:
        g.add_argument(
            "-y", "--yes", action="store_true",
            help="download a catalog pair that is not downloaded yet without asking (needed without a terminal)",
        )  # fmt: skip
        g.add_argument(
            "--no-pull", action="store_true", help="never download: fail if the catalog pair is not downloaded"
        )
    if method:
        g.add_argument(
            "--draft-method",
            choices=DRAFT_METHODS,
            default=DEFAULT_DRAFT_METHOD,
            help="auto: measure costs and acceptance, pick the draft (suffix lookup, model or none) and its length "
            "each round; model: a draft model; ngram: prompt lookup, no model; suffix: copy what followed the longest "
            "earlier match in this session's text, no model; none: plain decoding; eagle3: an "
            "EAGLE-3 head given with --draft (llama.cpp); mtp: the target's own MTP layers, for GGUFs that keep "
            "them (llama.cpp); dflash, dspark: a DFlash / DSpark block drafter given with --draft (llama.cpp) "
            f"(default: {DEFAULT_DRAFT_METHOD})",
        )
    g.add_argument("--n-ctx", type=int, default=DEFAULT_N_CTX, help=f"context window in tokens (default: {DEFAULT_N_CTX})")
    g.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    g.add_argument("--n-gpu-layers", type=int, default=-1, help="layers to offload to the GPU; -1 all (default)")
    g.add_argument(
        "--chat-template",
        metavar="NAME|FILE",
        help="chat format when the model ships none (or to override it): chatml, gemma, llama3, phi3, mistral, "
        "raw (plain completion), or a Jinja template file (default: the model's own, else its family's)",
    )


def add_generation_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation")
    g.add_argument(
        "-k",
        "--num-draft",
        type=int,
        default=None,
        help=f"draft tokens per round, 1..{MAX_K}; with auto the most it may choose "
        f"(default: {FIXED_K}, or the catalog pair's; auto {AUTO_MAX_K}; suffix {SUFFIX_K})",
    )
    g.add_argument("--rule", choices=tuple(RULES), default=DEFAULT_RULE, help=f"verification rule (default: {DEFAULT_RULE})")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    g.add_argument("--top-k", type=int, default=0, help="0: off")
    g.add_argument("--top-p", type=float, default=1.0, help="1.0: off")
    g.add_argument("--min-p", type=float, default=0.0, help="0: off")
    g.add_argument("--seed", type=int, default=None, help="random seed (default: fresh, reported in the stats)")
    g.add_argument(
        "--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help=f"most tokens to generate (default: {DEFAULT_MAX_TOKENS})"
    )
    g.add_argument("--system", default=None, help="system prompt")


def models_given(args: argparse.Namespace) -> bool:
    return bool(args.target or args.draft or args.pair)


def chosen_pair(args: argparse.Namespace) -> str | None:
    """The catalog pair the flags name: --pair, or the catalog's default when no model is given at all."""
    if args.pair:
        return str(args.pair)
    if args.target or args.draft:
        return None
    from localspec.catalog import load_catalog

    return load_catalog().default_pair().name


def model_options_from_args(args: argparse.Namespace) -> ModelOptions:
    """ModelOptions from the flags. A catalog pair (--pair, or the default one when no model is given)
    becomes local paths, pulled first if it is not downloaded yet and the flags allow it
    (localspec.first_use)."""
    method = getattr(args, "draft_method", None) or DEFAULT_DRAFT_METHOD
    target, draft, backend = args.target, args.draft, args.backend
    if args.pair and (target or draft):
        raise UsageError("--pair cannot be combined with --target/--draft", "use one or the other")
    pair = chosen_pair(args)
    if pair:
        from localspec.first_use import FirstUse, ensure_pair
        from localspec.pipeline import resolve_backend

        local = ensure_pair(pair, args.backend, FirstUse.from_args(args), default=not args.pair)
        target, draft = local.target, local.draft
        if backend == "auto" and resolve_backend("auto", target)[0] != local.backend:
            backend = local.backend  # e.g. a pair with MLX models only, off Apple silicon
    if not target:
        raise UsageError("no target model given", "pass --pair NAME (see `localspec models`) or --target PATH")
    head = pair_method(pair) if pair else "model"
    if head != "model" and method == "auto":
        method = head  # a catalog pair whose draft is a head (EAGLE-3, MTP, DFlash): auto does not drive heads
    k = getattr(args, "num_draft", None)
    if k is None or not 0 <= k <= MAX_K:  # a bad -k is refused with the generation options
        k = default_k(method, pair_num_draft(args.pair) if args.pair else None)
    return ModelOptions(
        target=target,
        draft=draft,
        backend=backend,
        draft_method=method,
        n_ctx=args.n_ctx,
        threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        pair=pair,
        chat_template=getattr(args, "chat_template", None),
        max_draft=k,
    )


def generation_config_from_args(args: argparse.Namespace) -> GenerationConfig:
    method = getattr(args, "draft_method", None) or DEFAULT_DRAFT_METHOD
    return generation_config(
        method=method,
        k=args.num_draft,
        pair_k=pair_num_draft(pair) if (pair := chosen_pair(args)) else None,
        rule=args.rule,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
    )


def pair_method(name: str) -> str:
    """How a catalog pair's draft file drafts (models.toml `method`): "model", or a head method."""
    from localspec.catalog import load_catalog

    pair = load_catalog().pairs.get(name)
    return pair.method if pair is not None else "model"


def pair_num_draft(name: str) -> int | None:
    """A catalog pair's k for fixed draft methods (models.toml `num_draft`); None for unknown names."""
    from localspec.catalog import load_catalog

    pair = load_catalog().pairs.get(name)
    return pair.num_draft if pair is not None else None
