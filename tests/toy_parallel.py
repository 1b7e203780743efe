"""A backend's module for several sequences in one pass (registry.BackendSpec.parallel_module), as a new backend
would write one: the toy's parallel sequences record what they were opened on, and what the module says is set by
the test."""

from __future__ import annotations

from dataclasses import dataclass, field

from localspec.backends.base import Backend

SAYS = {"unbatchable": "", "batches_pay": True}


@dataclass
class ToyParallel:
    model: Backend
    n_sequences: int
    n_ctx: int
    closed: list[bool] = field(default_factory=list)


def open_parallel(model: Backend, n_sequences: int, n_ctx: int) -> ToyParallel:
    return ToyParallel(model, n_sequences, n_ctx)


def unbatchable(model: Backend) -> str:
    return str(SAYS["unbatchable"])


def batches_pay(model: Backend, n_gpu_layers: int) -> bool:
    return bool(SAYS["batches_pay"]) and n_gpu_layers != 0
