"""llama.cpp's staging API (src/llama-ext.h) for drafters that read the target's hidden states.

llama-cpp-python 0.3.36 wraps some of these calls (llama_cpp/llama_cpp_ext.py: the nextn embeddings)
and exports the rest only as C++ symbols with mangled names, which differ by platform (Itanium on
Linux and macOS, MSVC on Windows) and may change between releases. This module looks each one up in
the loaded libllama, and says per drafter family whether it can run here and, if not, why; nothing
else in localspec touches these symbols.

It also knows which target architectures have the hook that captures a layer's input: enabling the
capture on any other one aborts the whole process (SIGABRT in llama-graph.cpp), so
`check_capture_architecture` must pass before `set_layer_capture` is called.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import llama_cpp.llama_cpp

from localspec.errors import BackendUnavailableError, UnsupportedModelError

_ctx = llama_cpp.llama_context_p_ctypes
_model = llama_cpp.llama_model_p_ctypes
_f32p = ctypes.POINTER(ctypes.c_float)


@dataclass(frozen=True)
class _Symbol:
    names: tuple[str, ...]  # plain C name first, then the Itanium and MSVC manglings
    argtypes: tuple[object, ...]
    restype: object


_SYMBOLS: dict[str, _Symbol] = {
    "set_embeddings_nextn": _Symbol(
        ("llama_set_embeddings_nextn", "_Z26llama_set_embeddings_nextnP13llama_contextbb",
         "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z"),
        (_ctx, ctypes.c_bool, ctypes.c_bool), None),
    "get_embeddings_nextn_ith": _Symbol(
        ("llama_get_embeddings_nextn_ith", "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
         "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z"),
        (_ctx, ctypes.c_int32), _f32p),
    "get_embeddings_nextn": _Symbol(
        ("llama_get_embeddings_nextn", "_Z26llama_get_embeddings_nextnP13llama_context",
         "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z"),
        (_ctx,), _f32p),
    "set_nextn_layer_offset": _Symbol(
        ("llama_set_nextn_layer_offset", "_Z28llama_set_nextn_layer_offsetP13llama_contexti",
         "?llama_set_nextn_layer_offset@@YAXPEAUllama_context@@H@Z"),
        (_ctx, ctypes.c_int32), None),
    "set_embeddings_layer_inp": _Symbol(
        ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
         "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z"),
        (_ctx, ctypes.c_uint32, ctypes.c_bool), None),
    "get_embeddings_layer_inp": _Symbol(
        ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
         "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z"),
        (_ctx, ctypes.c_uint32), _f32p),
    "model_target_layer_ids": _Symbol(
        ("llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model",
         "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z"),
        (_model,), ctypes.POINTER(ctypes.c_int32)),
    "model_target_layer_ids_n": _Symbol(
        ("llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model",
         "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z"),
        (_model,), ctypes.c_uint32),
    "model_dflash_selector_top_k": _Symbol(
        ("llama_model_dflash_selector_top_k", "_Z33llama_model_dflash_selector_top_kPK11llama_model",
         "?llama_model_dflash_selector_top_k@@YAHPEBUllama_model@@@Z"),
        (_model,), ctypes.c_int32),
}  # fmt: skip

# What each family needs from the library, and whether localspec drives it yet (and if not, why).
_FAMILY_SYMBOLS: dict[str, tuple[str, ...]] = {
    "eagle3": ("set_embeddings_nextn", "get_embeddings_nextn", "get_embeddings_nextn_ith",
               "set_embeddings_layer_inp", "get_embeddings_layer_inp",
               "model_target_layer_ids", "model_target_layer_ids_n"),
    "mtp": ("set_embeddings_nextn", "get_embeddings_nextn", "get_embeddings_nextn_ith", "set_nextn_layer_offset"),
    "dflash": ("set_embeddings_layer_inp", "get_embeddings_layer_inp", "model_target_layer_ids",
               "model_target_layer_ids_n", "model_dflash_selector_top_k"),
    "dspark": ("set_embeddings_layer_inp", "get_embeddings_layer_inp", "model_target_layer_ids",
               "model_target_layer_ids_n", "model_dflash_selector_top_k"),
}  # fmt: skip
NOT_DRIVEN: dict[str, str] = {}  # family -> why localspec does not drive it (all four are driven now)

# Architectures whose graph sets the layer-input hook (res->t_layer_inp) in the llama.cpp vendored by
# llama-cpp-python 0.3.36 (src/models/*.cpp). Capture on any other architecture aborts the process.
CAPTURE_ARCHITECTURES = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "qwen4exp", "gpt-oss", "gemma4",
    "lfm2", "deepseek4", "bailingmoe3", "hunyuan_vl", "mimo2", "minimax-01", "minimax-m2", "muse-glimmer",
    "nanbeige", "nemotron_h",
})  # fmt: skip


@dataclass(frozen=True)
class FamilyStatus:
    family: str
    available: bool
    reason: str  # "available", or why not


@functools.cache
def _lookup(key: str):  # type: ignore[no-untyped-def]
    """The ctypes function for a staging symbol, or None when this libllama does not export it."""
    sym = _SYMBOLS[key]
    for name in sym.names:
        try:
            fn = getattr(llama_cpp.llama_cpp._lib, name)
        except AttributeError:
            continue
        fn.argtypes = list(sym.argtypes)
        fn.restype = sym.restype
        return fn
    return None


def missing_symbols(family: str) -> list[str]:
    return [_SYMBOLS[k].names[0] for k in _FAMILY_SYMBOLS[family] if _lookup(k) is None]


def family_status(family: str) -> FamilyStatus:
    missing = missing_symbols(family)
    if missing:
        reason = (
            f"this llama-cpp-python ({llama_cpp.__version__}) does not export {', '.join(missing)} "
            "(names differ by platform and release)"
        )
        return FamilyStatus(family, False, reason)
    if family in NOT_DRIVEN:
        return FamilyStatus(family, False, NOT_DRIVEN[family])
    return FamilyStatus(family, True, "available")


def all_family_status() -> dict[str, FamilyStatus]:
    return {f: family_status(f) for f in _FAMILY_SYMBOLS}


def require_family(family: str) -> None:
    """BackendUnavailableError unless this build and localspec can run `family`."""
    status = family_status(family)
    if not status.available:
        upgrade = "" if family in NOT_DRIVEN else "; `pip install -U llama-cpp-python` may bring the missing calls"
        raise BackendUnavailableError(
            f"--draft-method {family} cannot run here: {status.reason}",
            "use --draft-method model (a small draft model), ngram or auto" + upgrade,
        )


def _fn(key: str):  # type: ignore[no-untyped-def]
    fn = _lookup(key)
    if fn is None:
        raise BackendUnavailableError(f"libllama does not export {_SYMBOLS[key].names[0]}", "upgrade llama-cpp-python")
    return fn


# -- the calls, each checked before use ---------------------------------------------------------------


def check_capture_architecture(architecture: str, *, model_name: str, layer_ids: Sequence[int], n_layer: int) -> None:
    """UnsupportedModelError unless capturing the inputs of `layer_ids` is safe on this target:
    enabling it on an architecture without the hook, or past the last layer, aborts the process."""
    if architecture not in CAPTURE_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{model_name} is a {architecture!r} model, whose llama.cpp graph cannot hand its hidden states to "
            "a head that reads them (EAGLE-3, DFlash, DSpark; llama.cpp would abort the whole process)",
            "use a target of an architecture with the hook (e.g. llama, qwen3, qwen3moe, gpt-oss, gemma4), "
            "or --draft-method model / ngram with this one",
        )
    bad = [i for i in layer_ids if not 0 <= i < n_layer]
    if bad:
        raise UnsupportedModelError(
            f"the head reads layers {list(layer_ids)} of the target, but {model_name} has {n_layer} layers",
            "this head was trained for a different (deeper) target; pick the head made for this model",
        )


def set_layer_capture(ctx, layer: int, on: bool) -> None:  # type: ignore[no-untyped-def]
    """Make `ctx` keep the input of `layer` for every token of each decode (check the architecture first)."""
    _fn("set_embeddings_layer_inp")(ctx, layer, on)


def layer_inputs(ctx, layer: int):  # type: ignore[no-untyped-def]
    """Pointer to [n_tokens of the last decode, n_embd] floats: the captured input of `layer`."""
    return _fn("get_embeddings_layer_inp")(ctx, layer)


def set_nextn_output(ctx, on: bool, *, masked: bool) -> None:  # type: ignore[no-untyped-def]
    """Output the pre-norm ("nextn") hidden state: of rows with an output flag (masked) or of every row."""
    _fn("set_embeddings_nextn")(ctx, on, masked)


def nextn_rows(ctx):  # type: ignore[no-untyped-def]
    return _fn("get_embeddings_nextn")(ctx)


def nextn_row(ctx, i: int):  # type: ignore[no-untyped-def]
    return _fn("get_embeddings_nextn_ith")(ctx, i)


def set_nextn_layer_offset(ctx, offset: int) -> None:  # type: ignore[no-untyped-def]
    """Which of a model's MTP heads (0 = the first) the next passes of an MTP context run."""
    _fn("set_nextn_layer_offset")(ctx, offset)


def target_layer_ids(model) -> list[int]:  # type: ignore[no-untyped-def]
    """The target layers a head (EAGLE-3, DFlash) reads, from its metadata as llama.cpp loaded it."""
    n = int(_fn("model_target_layer_ids_n")(model))
    ptr = _fn("model_target_layer_ids")(model)
    return [int(ptr[i]) for i in range(n)] if n and ptr else []


def dflash_selector_top_k(model) -> int:  # type: ignore[no-untyped-def]
    """A DFlash2 drafter's candidates per block position (its selector lattice); 0 for DFlash and DSpark."""
    return int(_fn("model_dflash_selector_top_k")(model))
