"""The backends localspec runs on: one descriptor each, in one table. Nothing outside the backends' own
folder names a backend; it asks this table (by the name a user gives with --backend, or by a model path).

    BACKENDS: name -> BackendSpec          llama (GGUF files through llama.cpp), mlx (model directories, mlx-lm)
    backend_spec(name) -> BackendSpec      UsageError for an unknown name
    spec_for_path(path) -> BackendSpec     the backend whose model format a path has (a .gguf file or not)
    resolve_backend(name, target)          "auto" made concrete, and why

A descriptor names its module by import path: importing this table loads no backend library.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast

from localspec.errors import BackendUnavailableError, UsageError

if TYPE_CHECKING:
    from localspec.backends.base import Backend, BackendModule
    from localspec.backends.heads import HeadDrafter


class ParallelModule(Protocol):
    """What a backend's module for several sequences in one pass offers (BackendSpec.parallel_module)."""

    def open_parallel(self, model: Backend, n_sequences: int, n_ctx: int) -> Any: ...

    def unbatchable(self, model: Backend) -> str: ...

    def batches_pay(self, model: Backend, n_gpu_layers: int) -> bool: ...


class HeadsModule(Protocol):
    """What a backend's module for head families offers (BackendSpec.heads_module)."""

    def require(self, family: str) -> None: ...

    def check(self, family: str, target: str, draft: str | None) -> None: ...

    def build(self, family: str, target: Backend, head: str | None, n_gpu_layers: int) -> HeadDrafter: ...


P = ParamSpec("P")
R = TypeVar("R")

AUTO = "auto"  # --backend auto: pick by the target's format and the machine


@dataclass(frozen=True)
class BackendSpec:
    name: str  # the --backend value, the catalog's table name ([pair.NAME]) and the remembered costs' key
    label: str  # for people: "llama.cpp", "MLX"
    module_path: str  # its BackendModule
    imports: tuple[str, ...]  # the libraries it needs, by import name
    distributions: tuple[str, ...]  # their pip distributions (their versions date remembered costs)
    install_hint: str
    model_format: str  # "GGUF file", "mlx-lm directory": what a model path is, for people
    single_file: bool  # a model is one file (GGUF, maybe split in parts); else a directory / Hub repo snapshot
    # Its module for several sequences in one pass (serve --parallel): open_parallel(model, n, n_ctx),
    # unbatchable(model) -> why not or "", batches_pay(model, n_gpu_layers) -> bool. None: one at a time.
    parallel_module: str | None = None
    preferred_on_apple: bool = False  # auto picks it on Apple silicon when installed
    # The head families (drafters reading the target's hidden states: eagle3, mtp, dflash, dspark) it runs, and
    # its module that runs them: require(family), check(family, target, draft), build(family, target, head,
    # n_gpu_layers) -> a HeadDrafter. No families: it hands out no hidden states, and every head is refused on it.
    head_families: tuple[str, ...] = ()
    heads_module: str | None = None
    # Its models' forward_top2(tokens) can hand back each row's two best tokens and their logits, picked where the
    # model runs (base.TopTwo), instead of whole rows: what a greedy round reads. It may still return None (a
    # build without it, or where it does not pay): the caller then reads rows.
    top2_on_device: bool = False
    # Its models' forward_draws(tokens, temperature, rng) can hand back one token a row, drawn from softmax(logits /
    # temperature) where the model runs, commit_draws(tokens) marks the draws emitted, and drawn_probs(i) is row i's
    # whole distribution in host memory: what a sampled round reads (a one-hot draft: accept while the draw equals
    # the draft; a model's: p(d) is one read, the draw starts the residual's). It may return None, as forward_top2.
    draws_on_device: bool = False

    def installed(self) -> bool:
        return all(importlib.util.find_spec(name) is not None for name in self.imports)

    def module(self) -> BackendModule:
        """The backend module, or BackendUnavailableError saying how to install what is missing."""
        if not self.installed():
            raise BackendUnavailableError(
                f"the {self.label} backend needs {' and '.join(self.distributions)}, which {'is' if len(self.distributions) == 1 else 'are'} not installed",
                self.install_hint,
            )
        try:
            return cast("BackendModule", importlib.import_module(self.module_path))
        except ImportError as e:
            raise BackendUnavailableError(f"the {self.label} backend cannot load: {e}", self.install_hint) from None

    def probe(self) -> tuple[bool, str]:
        """Whether it can run here, and its device or why not (never raises; loads no model)."""
        if not self.installed():
            return False, f"not installed: {self.install_hint}"
        try:
            module = importlib.import_module(self.module_path)
        except Exception as e:  # ImportError, or a shared library that fails to load
            return False, f"{' and '.join(self.distributions)} does not load: {e}. {self.install_hint}"
        return cast("BackendModule", module).probe()

    def parallel(self) -> ParallelModule | None:
        """Its module for decoding several sequences together, or None where it decodes one at a time."""
        if self.parallel_module is None:
            return None
        return cast("ParallelModule", importlib.import_module(self.parallel_module))

    def heads(self) -> HeadsModule:
        """Its module that runs head families (only asked for a family in head_families)."""
        assert self.heads_module is not None, f"the {self.label} backend runs no head family"
        return cast("HeadsModule", importlib.import_module(self.heads_module))

    def owns_path(self, path: str) -> bool:
        """Whether a model path has this backend's format (from its name alone)."""
        return str(path).lower().endswith(".gguf") == self.single_file


LLAMA = BackendSpec(
    name="llama",
    label="llama.cpp",
    module_path="localspec.backends.llama.backend",
    imports=("llama_cpp",),
    distributions=("llama-cpp-python",),
    install_hint="install it with `pip install llama-cpp-python` "
    '(CUDA: CMAKE_ARGS="-DGGML_CUDA=on", Metal: CMAKE_ARGS="-DGGML_METAL=on")',
    model_format="GGUF file",
    single_file=True,
    head_families=("eagle3", "mtp", "dflash", "dspark"),
    heads_module="localspec.backends.llama.heads_port",
    parallel_module="localspec.backends.llama.multi",
    top2_on_device=True,  # llama.cpp's backend sampling: a top-2 sampler in the graph (output layer on a GPU)
    draws_on_device=True,  # the same, with a temperature and a seeded dist sampler
)
MLX = BackendSpec(
    name="mlx",
    label="MLX",
    module_path="localspec.backends.mlx.backend",
    imports=("mlx", "mlx_lm"),
    distributions=("mlx", "mlx-lm"),
    install_hint="install them with `pip install 'localspec[mlx]'` (on Linux this brings mlx[cpu])",
    model_format="mlx-lm directory or Hub repo",
    single_file=False,
    head_families=("eagle3", "mtp", "dflash", "dspark"),  # hidden states captured by mlx/capture.py
    heads_module="localspec.backends.mlx.heads_port",
    parallel_module="localspec.backends.mlx.multi",
    preferred_on_apple=True,
    top2_on_device=True,  # MLX's arg-max over the lazy rows, on an Apple GPU (on the CPU forward_top2 says None)
    draws_on_device=True,  # mx.random.categorical over the lazy rows, the same way
)
BACKENDS: dict[str, BackendSpec] = {spec.name: spec for spec in (LLAMA, MLX)}


def picks_top2(model: Backend) -> bool:
    """Whether `model`'s backend picks each row's best two tokens where the model runs (BackendSpec.top2_on_device):
    greedy rounds then read those instead of whole rows."""
    return _offers(model, "top2_on_device", "forward_top2")


def draws_in_pass(model: Backend) -> bool:
    """Whether `model`'s backend draws each row's token where the model runs (BackendSpec.draws_on_device)."""
    return _offers(model, "draws_on_device", "forward_draws")


def _offers(model: Backend, flag: str, method: str) -> bool:
    """Whether `model`'s backend table sets `flag` and the model has `method`."""
    spec = BACKENDS.get(model.info.backend)
    return spec is not None and bool(getattr(spec, flag)) and callable(getattr(model, method, None))


def head_backends(family: str) -> tuple[str, ...]:
    """The backends that run a head family (their table lists it)."""
    return tuple(name for name, spec in BACKENDS.items() if family in spec.head_families)


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def backend_choices() -> tuple[str, ...]:
    """What --backend accepts: auto, then every backend."""
    return (AUTO, *BACKENDS)


def backend_spec(name: str) -> BackendSpec:
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}", f"choose one of: {', '.join(backend_choices())}")
    return BACKENDS[name]


def spec_for_path(path: str) -> BackendSpec:
    """The backend whose model format `path` has: a GGUF file, or a model directory / repo id."""
    return next(spec for spec in BACKENDS.values() if spec.owns_path(path))


def on_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def resolve_backend(name: str, target: str | None = None) -> tuple[str, str]:
    """Map "auto" to a concrete backend: the one whose format a single-file target has (GGUF: llama.cpp);
    otherwise one preferred on Apple silicon when installed there, else the first in the table.
    Returns (backend, a note saying why; empty when not auto)."""
    if name != AUTO:
        return backend_spec(name).name, ""
    if target is not None:
        spec = spec_for_path(target)
        if spec.single_file:
            return spec.name, f"auto picked {spec.label} (the target is a {spec.model_format})"
    apple = on_apple_silicon()
    for spec in BACKENDS.values():
        if spec.preferred_on_apple and apple and spec.installed():
            return spec.name, f"auto picked {spec.label} (Apple silicon, {spec.label} installed)"
    first = next(iter(BACKENDS.values()))
    others = [s.label for s in BACKENDS.values() if s.preferred_on_apple]
    why = f"{', '.join(others)} not installed" if apple else "not Apple silicon"
    return first.name, f"auto picked {first.label} ({why})"


def release_thread() -> None:
    """What the calling thread holds in the backends loaded so far is freed (a thread that ran a model calls
    it before it ends: MLX's streams must be destroyed by the thread that made them, else the process may
    abort at exit). Backends never imported are left alone."""
    for spec in BACKENDS.values():
        module = sys.modules.get(spec.module_path)
        release = getattr(module, "release_thread", None)
        if release is not None:
            release()


def releasing(fn: Callable[P, R]) -> Callable[P, R]:
    """A thread's body that calls release_thread() when it returns or raises (engine and worker threads)."""

    @functools.wraps(fn)
    def body(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        finally:
            release_thread()

    return body


def backend_label(name: str) -> str:
    """How to call a backend to people ("llama.cpp"); an unknown name as it is (a test's fake)."""
    spec = BACKENDS.get(name)
    return spec.label if spec is not None else name
