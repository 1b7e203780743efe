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
from typing import TYPE_CHECKING

from localspec.backends.registry import AUTO as AUTO_BACKEND
from localspec.backends.registry import backend_choices, resolve_backend
from localspec.catalog import LocalPair, load_catalog
from localspec.context_size import AUTO_MAX_N_CTX, FALLBACK_N_CTX
from localspec.decoding.engine import GenerationConfig
from localspec.decoding.verify import RULES
from localspec.errors import UsageError
from localspec.families import registry
from localspec.families.auto import AUTO_MAX_K
from localspec.sampling import SamplingParams

if TYPE_CHECKING:
    from localspec.families.base import DrafterFamily

DEFAULT_BACKEND = AUTO_BACKEND  # the target's format decides; on Apple silicon MLX when installed
DEFAULT_DRAFT_METHOD = registry.DEFAULT
FIXED_K = 4  # k for fixed draft methods, unless a catalog pair says otherwise
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
    n_ctx: int | None = DEFAULT_N_CTX  # None: the target's trained context, bounded by memory (load_pipeline)
    threads: int | None = None
    n_gpu_layers: int = -1  # -1: offload everything the build can
    pair: str | None = None
    chat_template: str | None = None  # a format name, "raw" or a Jinja file; None: the model's own (or its family's)
    # The longest draft the engine will verify: a recurrent/hybrid target keeps rollback snapshots for this
    # many tokens (longer drafts still run, restoring a saved state instead; see localspec.backends.base).
    max_draft: int = AUTO_MAX_K
    # The suffix drafter reads and writes earlier sessions' texts (localspec.decoding.suffix_memory). Off
    # unless a front end turns it on: run, chat and serve do (--no-suffix-memory), bench only when asked.
    suffix_memory: bool = False
    # Contexts of n_ctx tokens opened per model (serve --parallel N: the model's own and N parallel sequences),
    # which the memory bound of an automatic n_ctx counts.
    kv_copies: int = 1

    def __post_init__(self) -> None:
        check_choice("backend", self.backend, backend_choices())
        registry.family(self.draft_method)  # UsageError naming the choices
        check_n_ctx(self.n_ctx)
        check_threads(self.threads)
        if not 0 <= self.max_draft <= MAX_K:
            raise UsageError(f"the longest draft must be 0..{MAX_K}, got {self.max_draft}", f"use -k {FIXED_K}")

    @property
    def family(self) -> DrafterFamily:
        return registry.family(self.draft_method)

    @property
    def uses_draft_model(self) -> bool:
        """Whether the draft model gets loaded: a family that drafts with one (model), or takes one (auto)
        and was given a draft model rather than a head."""
        fam = self.family
        return bool(self.draft) and (fam.needs == "draft_model" or fam.accepts_draft) and self.auto_head is None

    @property
    def auto_head(self) -> str | None:
        """The head family auto drafts with in place of a draft model (its costs measured, picked per round
        like one): --draft is a head file, or the target file itself for layers it carries (a catalog MTP
        pair). None otherwise, or for a family that takes no such draft."""
        if not self.family.accepts_draft or not self.draft:
            return None
        return registry.auto_head(self.draft, self.target)

    def with_method(self, method: str) -> ModelOptions:
        return replace(self, draft_method=method)


# -- checks shared by every front end ----------------------------------------------------------------


def check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"unknown {what} {value!r}", f"choose one of: {', '.join(choices)}")


def check_n_ctx(n_ctx: int | None) -> None:
    if n_ctx is not None and n_ctx < MIN_N_CTX:
        raise UsageError(
            f"--n-ctx {n_ctx} is below the smallest context llama.cpp builds ({MIN_N_CTX} tokens)",
            f"use at least {MIN_N_CTX}, e.g. --n-ctx {DEFAULT_N_CTX}",
        )


def check_threads(threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}", "leave it out to use every core")


def check_k(k: int, method: str) -> None:
    """The draft length a user asked for: 1..MAX_K (plain decoding is a method, not k=0)."""
    if registry.family(method).plain:
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
    """k when none is given: the family's own (auto's longest draft, suffix's), or a fixed method's length;
    a catalog pair's k replaces the fixed one, and raises the family's own when the family drafts with the
    pair's draft (auto)."""
    fam = registry.family(method)
    if fam.default_k is None:
        return pair_k or FIXED_K
    return max(fam.default_k, pair_k or 0) if fam.accepts_draft else fam.default_k


@dataclass(frozen=True)
class GenerationSettings:
    """How to generate, as every front end states it: the CLI's flags, the chat app's settings dialog, a
    server request over serve's defaults. Update with dataclasses.replace; config() checks the values and
    makes the engine's GenerationConfig."""

    method: str = DEFAULT_DRAFT_METHOD
    k: int | None = None  # draft tokens per round; None: the method's default (default_k)
    pair_k: int | None = None  # the catalog pair's k, when a pair was chosen
    rule: str = DEFAULT_RULE
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # None: until the context is full (serve's default)
    system: str | None = None  # a system prompt for conversations

    @property
    def num_draft(self) -> int:
        """k as the engine will use it."""
        return default_k(self.method, self.pair_k) if self.k is None else self.k

    def config(self, *, room: int | None = None) -> GenerationConfig:
        """The GenerationConfig; UsageError for any value the engine refuses. `room`: tokens the context
        has left, a bound on max_tokens (and its value when max_tokens is None)."""
        num_draft = self.num_draft
        check_k(num_draft, self.method)
        check_choice("verification rule", self.rule, tuple(RULES))
        sampling = SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, seed=self.seed
        )
        max_tokens = self.max_tokens if self.max_tokens is not None else room
        if max_tokens is None:
            raise UsageError("no bound on the answer's length", "give --max-tokens")
        if room is not None:
            max_tokens = min(max_tokens, room)
        plain = registry.family(self.method).plain
        return GenerationConfig(
            max_tokens=max_tokens, num_draft=0 if plain else num_draft, rule=self.rule, sampling=sampling
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GenerationSettings:
        """The generation flags (add_generation_options); unchecked until config()."""
        pair = chosen_pair(args)
        return cls(
            method=getattr(args, "draft_method", None) or DEFAULT_DRAFT_METHOD,
            k=args.num_draft,
            pair_k=pair_num_draft(pair) if pair else None,
            rule=args.rule,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            seed=args.seed,
            max_tokens=args.max_tokens,
            system=getattr(args, "system", None),
        )


def generation_config_from_args(args: argparse.Namespace) -> GenerationConfig:
    return GenerationSettings.from_args(args).config()


# -- command-line flags ------------------------------------------------------------------------------


def add_model_options(
    p: argparse.ArgumentParser, *, method: bool = True, first_use: bool = True, suffix_memory: bool | None = True
) -> None:
    """The model flags; `first_use`: also -y/--yes and --no-pull (for commands that may pull a pair);
    `suffix_memory`: the memory on by default with --no-suffix-memory (True), off with --suffix-memory to
    turn it on (False: bench, whose numbers must not depend on earlier runs), or off and no flag (None)."""
    g = p.add_argument_group("models")
    g.add_argument(
        "--backend", default=DEFAULT_BACKEND, choices=backend_choices(),
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
            choices=registry.names(),
            default=DEFAULT_DRAFT_METHOD,
            help=f"{registry.help_text()} (default: {DEFAULT_DRAFT_METHOD})",
        )
    g.add_argument(
        "--n-ctx", type=int, default=None,
        help=f"context window in tokens (default: the target's trained context, at most {AUTO_MAX_N_CTX:,}, and no "
        f"more than the free memory holds for the KV caches; {FALLBACK_N_CTX} when the model names none)",
    )  # fmt: skip
    g.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    g.add_argument("--n-gpu-layers", type=int, default=-1, help="layers to offload to the GPU; -1 all (default)")
    g.add_argument(
        "--chat-template",
        metavar="NAME|FILE",
        help="chat format when the model ships none (or to override it): chatml, gemma, llama3, phi3, mistral, "
        "raw (plain completion), or a Jinja template file (default: the model's own, else its family's)",
    )
    if suffix_memory is True:
        g.add_argument(
            "--no-suffix-memory", dest="suffix_memory", action="store_false",
            help="do not read or write the suffix memory (earlier sessions' prompts and answers kept on disk for "
            "suffix drafts; also LOCALSPEC_SUFFIX_MEMORY=0; `localspec memory` shows it)",
        )  # fmt: skip
    elif suffix_memory is False:
        g.add_argument(
            "--suffix-memory", dest="suffix_memory", action="store_true",
            help="let suffix drafts read and write the suffix memory (earlier sessions' texts on disk): the "
            "numbers then depend on earlier runs (default: off)",
        )  # fmt: skip


def add_generation_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation")
    g.add_argument(
        "-k",
        "--num-draft",
        type=int,
        default=None,
        help=f"draft tokens per round, 1..{MAX_K}; with auto the most it may choose "
        f"(default: {FIXED_K}, or the catalog pair's; {_own_defaults()})",
    )
    g.add_argument(
        "--rule", choices=tuple(RULES), default=DEFAULT_RULE, help=f"verification rule (default: {DEFAULT_RULE})"
    )
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    g.add_argument("--top-k", type=int, default=0, help="0: off")
    g.add_argument("--top-p", type=float, default=1.0, help="1.0: off")
    g.add_argument("--min-p", type=float, default=0.0, help="0: off")
    g.add_argument("--seed", type=int, default=None, help="random seed (default: fresh, reported in the stats)")
    g.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"most tokens to generate (default: {DEFAULT_MAX_TOKENS})",
    )
    g.add_argument("--system", default=None, help="system prompt")


def _own_defaults() -> str:
    return "; ".join(f"{f.name} {f.default_k}" for f in registry.families() if f.default_k)


def models_given(args: argparse.Namespace) -> bool:
    return bool(args.target or args.draft or args.pair)


def chosen_pair(args: argparse.Namespace) -> str | None:
    """The catalog pair the flags name: --pair, or the catalog's default when no model is given at all."""
    if args.pair:
        return str(args.pair)
    if args.target or args.draft:
        return None
    return load_catalog().default_pair().name


def model_options(args: argparse.Namespace, local: LocalPair | None = None) -> ModelOptions:
    """ModelOptions from the flags; `local`: the catalog pair they name (chosen_pair), already on disk.
    Downloading it first is the command layer's (localspec.commands.first_use); nothing here does."""
    method = getattr(args, "draft_method", None) or DEFAULT_DRAFT_METHOD
    target, draft, backend = args.target, args.draft, args.backend
    if args.pair and (target or draft):
        raise UsageError("--pair cannot be combined with --target/--draft", "use one or the other")
    if local is not None:
        target, draft = local.target, local.draft
        if backend == DEFAULT_BACKEND and resolve_backend(backend, target)[0] != local.backend:
            backend = local.backend  # e.g. a pair with MLX models only, off Apple silicon
    if not target:
        raise UsageError("no target model given", "pass --pair NAME (see `localspec models`) or --target PATH")
    pair = local.name if local is not None else None
    head = pair_method(pair) if pair else None
    if head is not None and registry.family(head).is_head and registry.family(method).accepts_draft:
        method = head  # a catalog pair whose draft is a head: its own method (auto drives heads given by file)
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
        suffix_memory=bool(getattr(args, "suffix_memory", False)),
        kv_copies=1 + parallel if (parallel := getattr(args, "parallel", None) or 1) > 1 else 1,
    )


def pair_method(name: str) -> str:
    """How a catalog pair's draft file drafts (models.toml `method`): "model", or a head family."""
    pair = load_catalog().pairs.get(name)
    return pair.method if pair is not None else "model"


def pair_num_draft(name: str) -> int | None:
    """A catalog pair's k for fixed draft methods (models.toml `num_draft`); None for unknown names."""
    pair = load_catalog().pairs.get(name)
    return pair.num_draft if pair is not None else None
