"""A sampler of our own at the end of a draws chain, so that llama.cpp copies to the host only what is read.

llama.cpp's backend sampling copies every tensor a chain leaves in its llama_sampler_data after the graph runs,
one row of each per output: a temperature + dist chain leaves the scaled logits (n_vocab floats) beside the
softmax (n_vocab floats) and the drawn token. The draws are read as the token and the softmax (its p(d) and
p(x)); the logits never are. `KeepOnly` is a sampler whose backend_apply clears what is not wanted, added last
to the chain: it adds no operation to the graph (the softmax and the draw are still computed), it only leaves
the copies out. At Qwen2.5's 151,936 tokens that is 0.6 MB a row less to bring over (PCIe on a GPU) in every
verified row of a sampled round, and 1.2 MB where the round reads the draws alone (plain and one-hot rounds).
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp

_Ptr = ctypes.c_void_p


_Name = ctypes.CFUNCTYPE(_Ptr, _Ptr)
_Apply = ctypes.CFUNCTYPE(None, _Ptr, _Ptr)
_BackendInit = ctypes.CFUNCTYPE(ctypes.c_bool, _Ptr, _Ptr, ctypes.c_uint32)
_BackendApply = ctypes.CFUNCTYPE(None, _Ptr, _Ptr, _Ptr, ctypes.POINTER(llama_cpp.llama_sampler_data))


class _SamplerInterface(ctypes.Structure):
    """llama_sampler_i as llama.h lays it out, with `name` returning an address (a Python callback cannot safely
    return a char * made on the spot; this one returns a buffer the sampler holds)."""

    _fields_ = [
        ("name", _Name),
        ("accept", ctypes.CFUNCTYPE(None, _Ptr, ctypes.c_int32)),
        ("apply", _Apply),
        ("reset", ctypes.CFUNCTYPE(None, _Ptr)),
        ("clone", ctypes.CFUNCTYPE(_Ptr, _Ptr)),
        ("free", ctypes.CFUNCTYPE(None, _Ptr)),
        ("backend_init", _BackendInit),
        ("backend_accept", ctypes.CFUNCTYPE(None, _Ptr, _Ptr, _Ptr, _Ptr)),
        ("backend_apply", _BackendApply),
        ("backend_set_input", ctypes.CFUNCTYPE(None, _Ptr)),
        ("backend_reset", ctypes.CFUNCTYPE(None, _Ptr)),
        ("copy_state", ctypes.CFUNCTYPE(None, _Ptr, _Ptr)),
    ]


def available() -> bool:
    """Whether this llama-cpp-python can make a sampler with a backend_apply (older builds cannot)."""
    return hasattr(llama_cpp, "llama_sampler_data") and hasattr(llama_cpp, "llama_sampler_init")


class KeepOnly:
    """A sampler that leaves only the drawn token and (with `probs`) the softmax for llama.cpp to copy.

    The chain it is added to owns the llama_sampler (llama_sampler_free frees it with the chain); this object owns
    the interface and the callbacks it points to, so it must live as long as the chain (the caller keeps it).
    A sampler on the host (apply) has nothing to do: it only ever runs in the graph.
    """

    def __init__(self, *, probs: bool) -> None:
        self.probs = probs
        self._label = ctypes.create_string_buffer(b"localspec-keep-draws" if probs else b"localspec-keep-token")
        # Zeroed room past the fields llama.h has now: a later llama.cpp that appends a callback reads NULL there.
        self._room = (ctypes.c_void_p * (2 * len(_SamplerInterface._fields_)))()
        iface = _SamplerInterface.from_buffer(self._room)
        # The C callbacks, held here as long as the sampler lives (llama.cpp calls them while building graphs).
        self._callbacks = (
            _Name(self._name),
            _Apply(self._apply),
            _BackendInit(self._backend_init),
            _BackendApply(self._backend_apply),
        )
        iface.name, iface.apply, iface.backend_init, iface.backend_apply = self._callbacks
        self._iface = iface
        init = llama_cpp.llama_sampler_init
        self.sampler: Any = init(ctypes.cast(ctypes.pointer(iface), ctypes.POINTER(llama_cpp.llama_sampler_i)), None)

    def _name(self, smpl: int | None) -> int:
        return ctypes.addressof(self._label)

    def _apply(self, smpl: int | None, cur_p: int | None) -> None:
        pass

    def _backend_init(self, smpl: int | None, buft: int | None, n_outputs: int) -> bool:
        return True  # it adds no operation: any device runs it

    def _backend_apply(self, smpl: int | None, ctx: int | None, gf: int | None, data: Any) -> None:
        data.contents.logits = None
        if not self.probs:
            data.contents.probs = None
