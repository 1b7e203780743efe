"""From options to a running generation: resolve the backend, check the pair, load the models, build
the drafter, stream. `run`, `chat` (and its picker's check), `bench`, `doctor` and `serve` all go
through here.

    check_pair(opts) -> PairCheck                           from metadata only; raises on a bad pair
    load_pipeline(opts) -> Pipeline                         the target loaded, the drafter built (a draft
                                                            model with it, or for auto when first needed)
    Pipeline.generate(prompt, config, stop=...) -> events   the engine's Step/Done stream
    Pipeline.new_drafter(method) -> Drafter                 another drafter on the loaded models (bench, serve)
    make_drafter(method, target, draft, ...) -> Drafter     a family's drafter over loaded models
    cost_store(opts, target) -> CostStore                   where auto's measured costs are remembered

Backends come from one table (localspec.backends.registry), drafter families from another
(localspec.families.registry): nothing here names either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from localspec.backends.base import Backend, BackendModule, ChatMessage, chat_prompt_tokens
from localspec.backends.chat_template import ChatFormat, choose_chat_format
from localspec.backends.registry import backend_spec, resolve_backend
from localspec.context_size import choose_n_ctx
from localspec.decoding.cost_cache import CostStore
from localspec.decoding.drafters import Drafter, holding
from localspec.decoding.engine import Done, Event, GenerationConfig, generate
from localspec.decoding.suffix_memory import SuffixMemory
from localspec.errors import UsageError
from localspec.families import registry
from localspec.families.base import BuildContext
from localspec.options import ModelOptions
from localspec.recurrent import describe_path
from localspec.vocab import VocabInfo, check_compatible

Prompt = str | Sequence[ChatMessage] | Sequence[int]  # raw text, a conversation, or token ids


# -- checking a pair before anything loads ----------------------------------------------------------


@dataclass(frozen=True)
class PairCheck:
    backend: str
    backend_note: str
    target_vocab: VocabInfo
    draft_vocab: VocabInfo | None  # None when no draft model is used
    target_recurrent: str = ""  # localspec.recurrent.describe: "" for attention-only models
    draft_recurrent: str = ""

    def describe(self, method: str) -> str:
        t = self.target_vocab.n_vocab
        if self.draft_vocab is None:
            text = f"target readable ({t:,} tokens); draft: {method}"
        else:
            text = f"compatible: same vocabulary ({t:,} / {self.draft_vocab.n_vocab:,} tokens)"
        notes = [f"{role} {n}" for role, n in (("target", self.target_recurrent), ("draft", self.draft_recurrent)) if n]
        return "; ".join([text, *notes])


def check_pair(opts: ModelOptions) -> PairCheck:
    """Everything that can be checked without loading weights: the backend, the files, the vocabularies.

    Raises UsageError, ModelFileError, IncompatiblePairError or BackendUnavailableError.
    """
    backend, note, tv = _check_target(opts)
    dv, draft_note = _check_draft(opts, backend, tv)
    backend_spec(backend).module().check_path(opts.target)  # the vocabularies first (headers alone), then whole files
    return PairCheck(backend, note, tv, dv, describe_path(opts.target), draft_note)


def _check_target(opts: ModelOptions, *, auto_head: bool = True) -> tuple[str, str, VocabInfo]:
    """The backend, a head method's fit and the target's vocabulary: (backend, why, vocabulary). Whether the
    target's file is whole comes after the draft's vocabulary check (check_pair; the loader checks it).
    `auto_head`: check the head auto was given too (False: it will not be used, the costs say so)."""
    backend, note = resolve_backend(opts.backend, opts.target)
    module = backend_spec(backend).module()
    methods = [opts.draft_method] + ([opts.auto_head] if opts.auto_head is not None and auto_head else [])
    for method in methods:
        registry.check_family(method, target=opts.target, draft=opts.draft, backend=backend, module=module)
    return backend, note, module.peek_vocab(opts.target)


def _check_draft(opts: ModelOptions, backend: str, tv: VocabInfo) -> tuple[VocabInfo | None, str]:
    """A draft model's vocabulary against the target's, then whether its file is whole (none used: None)."""
    if not opts.uses_draft_model:
        return None, ""
    assert opts.draft is not None
    module = backend_spec(backend).module()
    dv = module.peek_vocab(opts.draft)
    check_compatible(tv, dv, target_name=opts.target, draft_name=opts.draft)
    module.check_path(opts.draft)
    return dv, describe_path(opts.draft)


# -- the loaded pipeline ---------------------------------------------------------------------------


@dataclass
class DraftSlot:
    """The pipeline's draft model: loaded with the target (method model), or when first needed (auto asks
    for it only in a round that wants a model draft, or to time one: a run that decodes plainly, or on a
    machine where the measured costs say a draft model cannot pay, never loads it)."""

    factory: Callable[[threading.Event], Backend] | None = None  # None: no draft model to load
    backend: Backend | None = None
    load_s: float = 0.0  # what loading it took (auto's late load runs beside the answer: LazyModelDrafter.start)
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)  # set: a load in progress stops
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def holding(cls, backend: Backend | None) -> DraftSlot:
        return cls(backend=backend)

    @property
    def available(self) -> bool:
        return self.backend is not None or self.factory is not None

    def get(self, cancel: threading.Event | None = None) -> Backend:
        """The draft model, loaded now if it is not yet; `cancel` (default: the slot's own, which
        Pipeline.abort sets) stops a load in progress with Interrupted."""
        with self._lock:
            if self.backend is None:
                if self.factory is None:
                    raise UsageError("no draft model was given", "pass --draft PATH")
                t0 = time.perf_counter()
                self.backend = self.factory(cancel or self.cancel)
                self.load_s = time.perf_counter() - t0
            return self.backend

    def close(self) -> None:
        with self._lock:
            if self.backend is not None:
                with holding(self.backend):  # a drafter reading into it in the background finishes first
                    self.backend.close()
                self.backend = None


@dataclass
class Pipeline:
    """A loaded target (and draft model, if one is used) with the drafter for the chosen method.

    The pipeline owns both models; drafters only borrow them. close() frees everything.
    """

    options: ModelOptions
    backend: str
    target: Backend
    draft_slot: DraftSlot
    drafter: Drafter
    backend_note: str = ""  # e.g. why `auto` picked this backend
    clock: Callable[[], float] = field(default=time.perf_counter)
    chat_format: ChatFormat | None = None  # how conversations become prompts (None: chosen per call)
    draft_note: str = ""  # why a draft model that was given is not loaded (auto, measured costs)
    memory: SuffixMemory | None = None  # earlier sessions' texts for the suffix drafter (None: off)
    context_note: str = ""  # where an automatic context length came from (context_size.ContextChoice.note)

    @property
    def notes(self) -> list[str]:
        """What the user should hear once after loading: the backend choice, a skipped draft, a chat-format
        fallback, a hybrid model's rollback, an automatic context's length and bound."""
        hybrid = f"target {self.target.info.recurrent}" if self.target.info.recurrent else ""
        fmt = self.chat_format.note if self.chat_format else ""
        return [n for n in (self.backend_note, self.draft_note, fmt, hybrid, self.context_note) if n]

    @property
    def draft(self) -> Backend | None:
        """The draft model if it is loaded (auto may not have needed it yet)."""
        return self.draft_slot.backend

    @property
    def has_draft_model(self) -> bool:
        """A draft model is loaded or can be (method model or auto with --draft)."""
        return self.draft_slot.available

    @property
    def cost_store(self) -> CostStore:
        return cost_store(self.options, self.target)

    def new_drafter(
        self,
        method: str,
        *,
        lookup_only: bool = False,
        draft: Backend | None = None,
        store: CostStore | None = None,
        memory: SuffixMemory | None = None,
    ) -> Drafter:
        """A fresh drafter of `method` over the loaded models (bench runs each method this way).
        `lookup_only`: auto without the draft model or head (serve --parallel's sequences while another holds it).
        `draft`: the draft model's backend to draft with instead of the pipeline's (serve --parallel: the draft
        model's own parallel sequence for each request). `store`, `memory`: auto's remembered costs and the suffix
        memory, instead of the pipeline's (bench's cold, warm and memory cases)."""
        models = not lookup_only
        auto_head = self.options.auto_head if method == "auto" and not self.draft_note and models else None
        head = self.options.draft if registry.family(method).is_head or auto_head else None
        lazy = self.draft_slot.get if self.draft_slot.available and not self.draft_note and models else None
        if draft is not None and method == "auto" and models:
            # A parallel sequence's draft, loaded: auto reads the prompt into it only when it wants model drafts, on
            # this thread (the sequences share one context, so never in the background, as a lazy draft model would).
            lazy = None
        elif draft is None:
            draft = self.draft_slot.get() if method == "model" and self.draft_slot.available else self.draft
        draft = draft if models else None
        return make_drafter(
            method,
            self.target,
            draft,
            clock=self.clock,
            store=store or self.cost_store,
            head=head,
            n_gpu_layers=self.options.n_gpu_layers,
            load_draft=lazy,
            draft_name=_model_name(self.options.draft),
            draft_size=_model_size(self.options.draft) if lazy is not None else None,
            auto_head=auto_head,
            memory=memory or self.memory,
        )

    def prompt_tokens(self, prompt: Prompt, *, raw: bool = False) -> list[int]:
        """Token ids for a prompt: a conversation goes through the chat template; raw text does not."""
        if isinstance(prompt, str):
            if raw:
                return self.target.tokenize(prompt, add_special=True, parse_special=False)
            return chat_prompt_tokens(self.target, [ChatMessage("user", prompt)], self.chat_format)
        items = list(prompt)
        if items and isinstance(items[0], ChatMessage):
            return chat_prompt_tokens(self.target, items, self.chat_format)  # type: ignore[arg-type]
        return [int(t) for t in items]  # type: ignore[arg-type]

    def generate(
        self,
        prompt: Prompt,
        config: GenerationConfig,
        *,
        raw: bool = False,
        stop: threading.Event | None = None,
        on_phase: Callable[[str], None] | None = None,
        drafter: Drafter | None = None,
    ) -> Iterator[Event]:
        """Stream a generation: the engine's events for this prompt through the pipeline's drafter (or
        `drafter`, one from new_drafter: the server's per-request method). `stop` ends it after the
        current round; abort() (from another thread) at once."""
        tokens = self.prompt_tokens(prompt, raw=raw)
        events = generate(
            self.target, drafter or self.drafter, tokens, config, stop=stop, clock=self.clock, on_phase=on_phase
        )
        return events if self.memory is None else _remembered(events, tokens, self.memory)

    def abort(self, on: bool = True) -> None:
        """Make the forward pass in flight (on the generating thread) stop now; abort(False) re-arms."""
        for backend in (self.target, self.draft):
            if backend is not None:
                backend.abort(on)
        if on:
            self.draft_slot.cancel.set()  # a draft model loading late, inside a round, stops too
        else:
            self.draft_slot.cancel.clear()

    def close(self) -> None:
        self.abort()  # a draft model auto is loading, or reading into, in the background stops now
        self.drafter.close()
        self.draft_slot.close()
        self.target.close()


def load_pipeline(
    opts: ModelOptions, *, clock: Callable[[], float] = time.perf_counter, cancel: threading.Event | None = None
) -> Pipeline:
    """Check the pair from metadata, then load the target and (when used) the draft, and build the drafter.
    Setting `cancel` (from another thread) stops a load in progress with Interrupted."""
    opts, context_note = with_context(opts)
    backend, backend_note = resolve_backend(opts.backend, opts.target)
    module = backend_spec(backend).module()
    # auto where the remembered costs say a draft model (or head) cannot pay: never touched, not even its
    # header (a 150k-token vocabulary is a tenth of a second to parse). Found by the device the target
    # will load on, which the header tells; checked again against the loaded target below.
    early = _early_store(opts, module)
    skip_note = _draft_cannot_pay(opts, early) if early is not None else ""
    backend, backend_note, tv = _check_target(opts, auto_head=not skip_note)
    # Otherwise auto may still never load the draft model: its header check runs beside the target's load
    # (llama.cpp's load releases the GIL) instead of before it.
    draft_check = None
    if opts.draft_method == "auto" and not skip_note:
        draft_check = _Background(_check_draft, opts, backend, tv)
    elif opts.draft_method != "auto":
        _check_draft(opts, backend, tv)
    load = dict(n_ctx=opts.n_ctx, threads=opts.threads, n_gpu_layers=opts.n_gpu_layers, cancel=cancel)
    # Only the target verifies drafts in one batch; a draft model drafts token by token (checkpoints serve it).
    head_family = opts.draft_method if opts.family.is_head else None if skip_note else opts.auto_head
    own_head = registry.family(head_family).target_load if head_family is not None else {}
    try:
        target = module.load(opts.target, **load, max_draft=opts.max_draft, **own_head)
    except BaseException:
        if draft_check is not None:
            draft_check.join()  # a bad pair's error wins over the load's
        raise
    if draft_check is not None:
        try:
            draft_check.join()
        except BaseException:
            target.close()
            raise
    slot = DraftSlot()
    try:
        store = cost_store(opts, target)
        if early is None or early.key != store.key:
            late = _draft_cannot_pay(opts, store) if opts.uses_draft_model or opts.auto_head else ""
            if skip_note and not late:  # the device was foreseen wrongly: the checks skipped above are due
                late = _late_checks(opts, backend, tv)
            skip_note = late
        if opts.uses_draft_model:
            draft_path = opts.draft
            assert draft_path is not None
            slot.factory = lambda stop: module.load(draft_path, **{**load, "cancel": stop})
            if opts.draft_method == "model":
                slot.get(cancel)  # with the target, stopped by the same cancel
        head = opts.draft if head_family is not None else None
        memory = SuffixMemory.open(target.vocab_info, label=target.info.name) if opts.suffix_memory else None
        # auto gets the draft model only where it could pay; it loads it the first time a round needs it.
        lazy = slot.get if opts.draft_method == "auto" and slot.available and not skip_note else None
        drafter = make_drafter(
            opts.draft_method, target, slot.backend, clock=clock, store=store, head=head, n_gpu_layers=opts.n_gpu_layers,
            load_draft=lazy, draft_name=_model_name(opts.draft), auto_head=None if skip_note else opts.auto_head,
            memory=memory, draft_size=_model_size(opts.draft) if lazy is not None else None,
        )  # fmt: skip
        chat_format = choose_chat_format(target, opts.chat_template)
    except BaseException:
        slot.close()
        target.close()
        raise
    return Pipeline(opts, backend, target, slot, drafter, backend_note, clock, chat_format, skip_note, memory,
                    context_note)  # fmt: skip


def with_context(opts: ModelOptions) -> tuple[ModelOptions, str]:
    """`opts` with its context length chosen when none was given (context_size.choose_n_ctx: the trained context,
    bounded by memory), and the note that says so (empty when --n-ctx was given)."""
    if opts.n_ctx is not None:
        return opts, ""
    choice = choose_n_ctx(opts.target, opts.draft if opts.uses_draft_model else None, opts.kv_copies)
    return replace(opts, n_ctx=choice.n_ctx), choice.note


def _remembered(events: Iterator[Event], prompt: list[int], memory: SuffixMemory) -> Iterator[Event]:
    """The engine's events; when the answer ends, its prompt and answer go to the memory, if the drafter
    read it in this generation (SuffixMemory.claim). Once per answer, never per token."""
    memory.release()
    for event in events:
        if isinstance(event, Done):
            memory.end_of_answer([*prompt, *event.tokens])
        yield event


class _Background:
    """A call run on a daemon thread; join() waits for it and raises what it raised."""

    def __init__(self, fn: Callable[..., object], *args: object) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except BaseException as e:  # handed to join()'s caller
            self._error = e

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def _model_name(path: str | None) -> str:
    return Path(path).stem if path else ""


def _model_size(path: str | None) -> int | None:
    """A model's weights in bytes from its files (a GGUF, or a directory's safetensors); None when unknown."""
    p = Path(path) if path else None
    if p is None or not p.exists():
        return None
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.glob("*.safetensors")) or None


def cost_store(opts: ModelOptions, target: Backend) -> CostStore:
    """Where auto's measured costs for this pair on this machine are remembered."""
    return CostStore.for_models(
        target=opts.target,
        draft=opts.draft,
        backend=target.info.backend,
        device=target.info.device,
        threads=opts.threads,
    )


def _late_checks(opts: ModelOptions, backend: str, tv: VocabInfo) -> str:
    """The draft's (or head's) checks skipped before the load on a wrong guess of the device; a note when
    the head still cannot run (the target was loaded without its MTP layers)."""
    if opts.auto_head is None:
        _check_draft(opts, backend, tv)
        return ""
    module = backend_spec(backend).module()
    registry.check_family(opts.auto_head, target=opts.target, draft=opts.draft, backend=backend, module=module)
    if registry.family(opts.auto_head).target_load:
        return f"auto: the {opts.auto_head} head not loaded: the target was loaded without its layers"
    return ""


def _early_store(opts: ModelOptions, module: BackendModule) -> CostStore | None:
    """For auto with a draft model or head: where its costs are remembered, found before the target loads
    (None for other methods, or where the backend cannot name the device before loading)."""
    if opts.draft_method != "auto" or not (opts.uses_draft_model or opts.auto_head):
        return None
    device = module.device_for(opts.target, threads=opts.threads, n_gpu_layers=opts.n_gpu_layers)
    if device is None:
        return None
    return CostStore.for_models(
        target=opts.target, draft=opts.draft, backend=module.NAME, device=device, threads=opts.threads
    )


def _draft_cannot_pay(opts: ModelOptions, store: CostStore) -> str:
    """For auto: a note when the remembered costs say a model draft cannot pay here (the draft is then
    not loaded at all); empty when it might, or when it has not been measured yet."""
    if opts.draft_method != "auto":
        return ""
    from localspec.decoding.policy import Controller

    costs = store.load()
    if costs is None or costs.draft_token is None:
        return ""
    top = max(costs.target)
    if Controller(costs).model_can_pay(max(top - 1, 1)):
        return ""
    ratio = costs.draft_token / costs.target[1]
    what, kind = (f"the {opts.auto_head} head", "its drafts") if opts.auto_head else ("draft model", "model drafts")
    return (
        f"auto: {what} not loaded: a draft token costs {ratio:.2f} of a target token here, so {kind} "
        "cannot pay on this machine (measured earlier; lookup drafts stay on)"
    )


def make_drafter(
    method: str,
    target: Backend,
    draft: Backend | None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    store: CostStore | None = None,
    head: str | None = None,
    n_gpu_layers: int = -1,
    load_draft: Callable[[], Backend] | None = None,
    draft_name: str = "",
    auto_head: str | None = None,
    memory: SuffixMemory | None = None,
    draft_size: int | None = None,
) -> Drafter:
    """The drafter for a method over loaded models (the family registry builds it).
    `store`: where auto finds and keeps its measured costs (None: measure afresh, keep nothing).
    `head`: the file of a head that reads the target's hidden states (the drafter loads and owns it).
    `load_draft`: for auto without a loaded `draft`, how to load the draft model when a round first needs it.
    `auto_head`: for auto, a head family (`head`'s, or one inside the target) that drafts in the draft model's place.
    `memory`: earlier sessions' texts for a drafter that copies from them (suffix, auto's lookup).
    `draft_size`: for auto's draft model not loaded yet, its weights in bytes (the prior cost of a draft token)."""
    ctx = BuildContext(
        target=target, backend=target.info.backend, draft=draft, head=head, n_gpu_layers=n_gpu_layers, clock=clock,
        store=store, load_draft=load_draft, draft_name=draft_name, auto_head=auto_head, memory=memory,
        draft_size=draft_size,
    )  # fmt: skip
    return registry.build_drafter(method, ctx)
