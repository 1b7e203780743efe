"""What a drafter family declares about itself: the one value the registry lists.

A family is one way of writing drafts: a draft model, prompt lookup, a head that reads the target's hidden
states. Every front end (CLI choices, the chat app's picker, bench methods, doctor, the server's
per-request method, auto's candidates, error texts) reads these fields instead of naming families.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from localspec.backends.base import Backend, BackendModule
    from localspec.decoding.cost_cache import CostStore
    from localspec.decoding.drafters import Drafter
    from localspec.decoding.suffix_memory import SuffixMemory

# What a family drafts from, besides the target: nothing (lookup, plain decoding), a separate draft model
# (--draft), a head file made for the target (--draft HEAD.gguf), or layers inside the target's own file.
Needs = Literal["nothing", "draft_model", "head_file", "own_head"]


@dataclass(frozen=True)
class BuildContext:
    """Everything a family may build its drafter from; the pipeline fills it, the drafter borrows the models."""

    target: Backend
    backend: str  # the target's backend name (backends.registry)
    draft: Backend | None = None  # a loaded draft model
    head: str | None = None  # a head's file (head_file families) or the target's (own_head)
    n_gpu_layers: int = -1
    clock: Callable[[], float] = time.perf_counter
    store: CostStore | None = None  # where auto keeps its measured costs (None: nowhere)
    load_draft: Callable[[], Backend] | None = None  # auto: load the draft model when a round first wants it
    draft_name: str = ""
    draft_size: int | None = None  # auto: the draft model's weights in bytes, before it loads (its prior cost)
    auto_head: str | None = None  # auto: the head family drafting in the draft model's place
    head_drafter: Callable[[], Drafter] | None = None  # auto: builds that head's drafter (the registry sets it)
    memory: SuffixMemory | None = None  # earlier sessions' texts, for drafters that copy from them


@dataclass(frozen=True)
class CheckContext:
    """A pair of files before anything loads: the family's own checks read headers only."""

    target: str
    draft: str | None  # the --draft file: a draft model or a head (None when none was given)
    backend: str
    module: BackendModule


@dataclass(frozen=True)
class DrafterFamily:
    name: str  # the --draft-method value
    summary: str  # one clause for --help and the picker: what drafts
    build: Callable[[BuildContext], Drafter]
    needs: Needs = "nothing"
    backends: tuple[str, ...] | None = None  # None: every backend (a head family: every one whose table lists it)
    head_architectures: tuple[str, ...] = ()  # a head file's GGUF architectures this family reads
    sidecar_prefix: str = ""  # how llama.cpp's -hf names this family's head file next to a model
    # A head file whose architecture several families share: whether it is this family's (e.g. a Markov head).
    claims: Callable[[str], bool] | None = None
    require: Callable[[str], None] | None = None  # (backend) BackendUnavailableError where this build cannot run it
    # A head given as a Hugging Face directory (MLX): whether its config.json is this family's.
    claims_config: Callable[[Mapping[str, object]], bool] | None = None
    check: Callable[[CheckContext], None] | None = None  # raises LocalspecError when it cannot run on these files
    target_load: Mapping[str, object] = field(default_factory=dict)  # extra load() options for the target
    default_k: int | None = None  # draft length when none is given (None: the fixed methods' default)
    auto_drives: bool = False  # auto may draft with it in the draft model's place
    accepts_draft: bool = False  # takes a --draft file without needing one (auto: a draft model or a head)
    lookup: bool = False  # its drafts are copies found by lookup: they cost about nothing per token to make

    @property
    def is_head(self) -> bool:
        """Reads the target's hidden states (a head file, or layers of the target itself)."""
        return self.needs in ("head_file", "own_head")

    @property
    def plain(self) -> bool:
        """Drafts nothing: plain decoding through the same engine (k is 0)."""
        return self.default_k == 0

    @property
    def reads_draft_file(self) -> bool:
        return self.accepts_draft or self.needs in ("draft_model", "head_file")

    def backend_names(self) -> tuple[str, ...] | None:
        """The backends it runs on, None for every one. A head family's are asked of the backends' table when it
        names none (BackendSpec.head_families): a backend added to the table brings its heads with it."""
        if self.backends is None and self.is_head:
            from localspec.backends.registry import head_backends

            return head_backends(self.name)
        return self.backends

    def runs_on(self, backend: str) -> bool:
        names = self.backend_names()
        return names is None or backend in names
