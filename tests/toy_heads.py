"""A backend's module for head families (registry.BackendSpec.heads_module), as a new backend would write one: the
toy records what the families' table asked of it, and refuses what the test sets."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.backends.base import Backend
from localspec.errors import ModelFileError

ASKED: list[tuple[str, ...]] = []
REFUSE = {"check": ""}  # a reason makes check() refuse the files


@dataclass
class ToyHead:
    family: str
    target: Backend
    head: str | None
    n_gpu_layers: int


def require(family: str) -> None:
    ASKED.append(("require", family))


def check(family: str, target: str, draft: str | None) -> None:
    ASKED.append(("check", family, target, str(draft)))
    if REFUSE["check"]:
        raise ModelFileError(REFUSE["check"], "use the toy's own heads")


def build(family: str, target: Backend, head: str | None, n_gpu_layers: int) -> ToyHead:
    ASKED.append(("build", family))
    return ToyHead(family, target, head, n_gpu_layers)
