"""A backend's module for several sequences in one pass (registry.BackendSpec.slots_module), as a new backend would
write one: the toy's slots record what they were opened on, and what the module says is set by the test."""

from __future__ import annotations

from dataclasses import dataclass, field

from localspec.backends.base import Backend

SAYS = {"unbatchable": "", "batches_pay": True}


@dataclass
class ToySlots:
    model: Backend
    n_slots: int
    n_ctx: int
    closed: list[bool] = field(default_factory=list)


def open_slots(model: Backend, n_slots: int, n_ctx: int) -> ToySlots:
    return ToySlots(model, n_slots, n_ctx)


def unbatchable(model: Backend) -> str:
    return str(SAYS["unbatchable"])


def batches_pay(model: Backend, n_gpu_layers: int) -> bool:
    return bool(SAYS["batches_pay"]) and n_gpu_layers != 0
