"""Load a target and a drafter for a backend, checking the pair before any draft weights load."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass

from localspec.backends.base import Backend
from localspec.errors import BackendUnavailableError, UsageError
from localspec.spec.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter
from localspec.vocab import check_compatible

BACKENDS = ("llama", "mlx")
DRAFT_METHODS = ("auto", "model", "ngram", "none")


@dataclass(frozen=True)
class LoadOptions:
    target: str  # GGUF path (llama) or mlx-lm directory / Hub repo id (mlx)
    draft: str | None = None
    backend: str = "llama"  # "llama" | "mlx" | "auto"
    draft_method: str = "model"
    max_draft: int = 8  # auto: the longest draft it may choose
    n_ctx: int = 4096
    threads: int | None = None
    n_gpu_layers: int = -1  # -1: offload everything the build can


@dataclass
class Pipeline:
    """A loaded target with its drafter; close() frees both."""

    target: Backend
    drafter: Drafter
    backend: str
    backend_note: str = ""  # e.g. why `auto` picked this backend

    def close(self) -> None:
        self.drafter.close()
        self.target.close()


def resolve_backend(name: str, target: str | None = None) -> tuple[str, str]:
    """Map "auto" to a concrete backend: llama.cpp for GGUF files; otherwise MLX on Apple silicon
    when installed, else llama.cpp."""
    if name in BACKENDS:
        return name, ""
    if name != "auto":
        raise UsageError(f"unknown backend {name!r}", "choose one of: auto, llama, mlx")
    if target is not None and target.lower().endswith(".gguf"):
        return "llama", "auto picked llama.cpp (the target is a GGUF file)"
    if sys.platform == "darwin" and platform.machine() == "arm64" and mlx_available():
        return "mlx", "auto picked MLX (Apple silicon, mlx-lm installed)"
    why = "not Apple silicon" if not (sys.platform == "darwin" and platform.machine() == "arm64") else "MLX not installed"
    return "llama", f"auto picked llama.cpp ({why})"


def mlx_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def load_pipeline(opts: LoadOptions) -> Pipeline:
    if opts.draft_method not in DRAFT_METHODS:
        raise UsageError(f"unknown draft method {opts.draft_method!r}", f"choose one of: {', '.join(DRAFT_METHODS)}")
    if opts.draft_method == "model" and not opts.draft:
        raise UsageError(
            "--draft-method model needs a draft model",
            "pass --draft PATH (a small model with the target's tokenizer), or use --draft-method ngram",
        )
    backend, note = resolve_backend(opts.backend, opts.target)
    module = _backend_module(backend)
    if opts.draft_method == "model" or (opts.draft_method == "auto" and opts.draft):
        assert opts.draft is not None
        # Compare vocabularies from metadata first, so a bad pair fails before gigabytes load.
        check_compatible(
            module.peek_vocab(opts.target), module.peek_vocab(opts.draft), target_name=opts.target, draft_name=opts.draft
        )
    target = module.load(opts.target, n_ctx=opts.n_ctx, threads=opts.threads, n_gpu_layers=opts.n_gpu_layers)
    try:
        drafter = _make_drafter(module, opts, target)
    except BaseException:
        target.close()
        raise
    return Pipeline(target, drafter, backend, note)


def _make_drafter(module, opts: LoadOptions, target: Backend) -> Drafter:  # type: ignore[no-untyped-def]
    if opts.draft_method == "ngram":
        return NgramDrafter()
    if opts.draft_method == "none":
        return NoDrafter()
    if opts.draft_method == "auto":
        from localspec.spec.adaptive import AutoDrafter, auto_ngram

        model = None
        if opts.draft:
            model = ModelDrafter(
                module.load(opts.draft, n_ctx=opts.n_ctx, threads=opts.threads, n_gpu_layers=opts.n_gpu_layers)
            )
        return AutoDrafter(ngram=auto_ngram(), model=model, target=target, max_k=opts.max_draft)
    draft = module.load(opts.draft, n_ctx=opts.n_ctx, threads=opts.threads, n_gpu_layers=opts.n_gpu_layers)
    return ModelDrafter(draft)


def _backend_module(backend: str):  # type: ignore[no-untyped-def]
    """The backend module: `load(path, n_ctx=, threads=, n_gpu_layers=) -> Backend`, `peek_vocab(path)`."""
    if backend == "llama":
        try:
            from localspec.backends import llama_cpp as module
        except ImportError as e:
            raise BackendUnavailableError(
                f"the llama.cpp backend cannot load: {e}",
                "install it with `pip install llama-cpp-python` "
                '(CUDA: CMAKE_ARGS="-DGGML_CUDA=on", Metal: CMAKE_ARGS="-DGGML_METAL=on")',
            ) from None
        return module
    if not mlx_available():
        raise BackendUnavailableError(
            "the MLX backend needs mlx and mlx-lm, which are not installed",
            "install them with `pip install 'localspec[mlx]'` (on Linux this brings mlx[cpu])",
        )
    from localspec.backends import mlx as module

    return module
