"""The chat app's logic that needs no Textual: backends on offer, chat settings, stream merging, live stats,
the transcript and its Markdown export. Workers and widgets call into this; tests can too.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Generic, TypeVar

from localspec.backends.base import ChatMessage, Detokenizer
from localspec.errors import LocalspecError, UsageError
from localspec.spec.engine import GenerationConfig, Origin
from localspec.spec.sampling import SamplingParams
from localspec.spec.stats import RoundStats, SpecStats, StatsCollector

# -- backends ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendStatus:
    name: str  # "llama" | "mlx": the LoadOptions.backend value
    label: str  # what the picker shows
    usable: bool
    detail: str  # the device it runs on, or why it cannot run here


def probe_backends() -> list[BackendStatus]:
    """Both backends, usable or not (an unusable one carries the reason). Loads no model."""
    return [_probe_llama(), _probe_mlx()]


def _probe_llama() -> BackendStatus:
    try:
        from localspec.backends import llama_cpp
    except Exception as e:  # ImportError, or a shared library that fails to load
        return BackendStatus(
            "llama", "llama.cpp", False, f"llama-cpp-python does not load: {e}. Install: pip install llama-cpp-python"
        )
    try:
        kind = llama_cpp.gpu_kind()
    except Exception as e:
        return BackendStatus("llama", "llama.cpp", False, f"llama.cpp does not initialise: {e}")
    if kind:
        return BackendStatus("llama", "llama.cpp", True, f"{kind} build: layers offload to the GPU")
    return BackendStatus("llama", "llama.cpp", True, "CPU build (this llama-cpp-python has no GPU offload)")


def _probe_mlx() -> BackendStatus:
    from localspec.loader import mlx_available

    if not mlx_available():
        return BackendStatus("mlx", "MLX", False, "not installed: pip install 'localspec[mlx]'")
    try:
        import mlx.core as mx

        metal = bool(getattr(mx, "metal", None) and mx.metal.is_available())
        device = str(mx.default_device())
    except Exception as e:
        return BackendStatus("mlx", "MLX", False, f"installed but unusable here: {e}")
    if metal:
        return BackendStatus("mlx", "MLX", True, "installed, runs on Metal (Apple GPU)")
    where = "Linux" if sys.platform.startswith("linux") else sys.platform
    return BackendStatus("mlx", "MLX", True, f"installed, CPU only on {where} ({device}); slow, for testing")


def check_pair(backend: str, target: str, draft: str, method: str) -> tuple[bool, str]:
    """Whether a target/draft choice can run, from file metadata only (no weights load): (ok, why)."""
    from localspec.loader import _backend_module

    target, draft = target.strip(), draft.strip()
    if not target:
        return False, "choose a target model (a catalog pair, or a path)"
    if method == "model" and not draft:
        return False, "draft method 'model' needs a draft model (or pick n-gram / none)"
    uses_draft = bool(draft) and method in ("model", "auto")  # auto drafts with the model when given one
    try:
        module = _backend_module(backend)
        if backend == "llama":
            for role, path in (("target", target), ("draft", draft if uses_draft else "")):
                if path and not Path(path).expanduser().is_file():
                    return False, f"{role} file not found: {path}"
        tv = module.peek_vocab(target)
        if not uses_draft:
            return True, f"target readable ({tv.n_vocab:,} tokens); draft: {method}"
        dv = module.peek_vocab(draft)
        from localspec.vocab import check_compatible

        check_compatible(tv, dv, target_name=target, draft_name=draft)
    except LocalspecError as e:
        return False, error_text(e)
    except Exception as e:  # a file the metadata readers choke on
        return False, error_text(e)
    return True, f"compatible: same vocabulary ({tv.n_vocab:,} / {dv.n_vocab:,} tokens)"


# -- settings ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatSettings:
    """What the settings screen edits; turned into a GenerationConfig for each reply."""

    num_draft: int = 4
    rule: str = "exact"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 512
    system: str = ""

    def generation_config(self) -> GenerationConfig:
        """Raises UsageError for values the engine refuses."""
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top-p must be in (0, 1], got {self.top_p}", "1.0 turns it off")
        if self.temperature < 0:
            raise UsageError(f"temperature must be >= 0, got {self.temperature}", "0 is greedy")
        sampling = SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, seed=self.seed
        )
        return GenerationConfig(max_tokens=self.max_tokens, num_draft=self.num_draft, rule=self.rule, sampling=sampling)

    @classmethod
    def from_config(cls, config: GenerationConfig, system: str | None) -> ChatSettings:
        s = config.sampling
        return cls(
            num_draft=config.num_draft,
            rule=config.rule,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            seed=s.seed,
            max_tokens=config.max_tokens,
            system=system or "",
        )


# -- the stream from the engine thread to the UI ------------------------------------------------------

Segment = tuple[str, Origin]  # a run of text whose tokens share one origin


@dataclass(frozen=True)
class Chunk:
    """One engine Step as the UI needs it: text split by origin, and the engine clock when it arrived."""

    segments: tuple[Segment, ...]
    n_tokens: int
    round: RoundStats | None
    t: float

    @property
    def text(self) -> str:
        return "".join(s for s, _ in self.segments)


def split_by_origin(detok: Detokenizer, tokens: Sequence[int], origins: Sequence[Origin]) -> tuple[Segment, ...]:
    """Decode tokens run by run of equal origin, so the text can be coloured by who chose each token.

    `detok` is the UI's own incremental detokenizer, fed the same tokens as the engine's, so the
    segments concatenate to exactly the engine's text.
    """
    out: list[Segment] = []
    i = 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and origins[j] == origins[i]:
            j += 1
        text = detok.add(tokens[i:j])
        if text:
            out.append((text, origins[i]))
        i = j
    return tuple(out)


T = TypeVar("T")


class StreamBuffer(Generic[T]):
    """Items from a producer thread, drained in batches by the UI.

    `push` returns True only when the consumer has not been told about pending items yet, so the
    producer posts at most one wake-up message however fast it runs; `drain` takes everything.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._told = False

    def push(self, item: T) -> bool:
        with self._lock:
            self._items.append(item)
            if self._told:
                return False
            self._told = True
            return True

    def drain(self) -> list[T]:
        with self._lock:
            items, self._items = self._items, []
            self._told = False
            return items


# -- live stats -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    """The fixed facts of one reply's run, for live SpecStats snapshots."""

    backend: str
    device: str
    target: str
    draft: str
    draft_method: str
    rule: str
    num_draft: int
    temperature: float
    seed: int
    n_prompt: int


class LiveStats:
    """Accumulates the chunks of a reply in progress into SpecStats snapshots and sparkline series."""

    RATE_WINDOW = 8  # chunks in the rolling tokens/s behind the sparkline
    SERIES_MAX = 240

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        self.collector = StatsCollector()
        self.n_generated = 0
        self.t_first: float | None = None
        self.t_last: float | None = None
        self._marks: deque[tuple[float, int]] = deque(maxlen=self.RATE_WINDOW + 1)
        self.rate_series: list[float] = []
        self.length_series: list[int] = []
        self.note = ""  # the drafter's latest word on its choice (auto drafting explains itself)

    def add(self, chunk: Chunk) -> None:
        self.n_generated += chunk.n_tokens
        if self.t_first is None:
            self.t_first = chunk.t
        self.t_last = chunk.t
        if chunk.round is not None:
            self.collector.add(chunk.round)
            self.note = chunk.round.note or self.note
            self.length_series.append(chunk.round.accepted_length)
            del self.length_series[: -self.SERIES_MAX]
        if not chunk.n_tokens:
            return  # a detokenizer flush: text but no tokens, not a point on the speed curve
        self._marks.append((chunk.t, self.n_generated))
        t0, n0 = self._marks[0]
        if chunk.t > t0:
            self.rate_series.append((self.n_generated - n0) / (chunk.t - t0))
            del self.rate_series[: -self.SERIES_MAX]

    def snapshot(self) -> SpecStats:
        i = self.info
        decode_s = (self.t_last - self.t_first) if self.t_first is not None and self.t_last is not None else 0.0
        return SpecStats(
            backend=i.backend,
            device=i.device,
            target=i.target,
            draft=i.draft,
            draft_method=i.draft_method,
            rule=i.rule,
            num_draft=i.num_draft,
            temperature=i.temperature,
            seed=i.seed,
            n_prompt=i.n_prompt,
            n_prompt_cached=0,
            prompt_s=0.0,
            n_generated=self.n_generated,
            decode_s=decode_s,
            stop_reason="max_tokens",  # unknown until Done; not shown live
            **self.collector.totals(),
        )


# -- the transcript -------------------------------------------------------------------------------------


@dataclass
class Turn:
    """One user message and the reply to it (the reply may be partial, stopped or failed)."""

    user: str
    reply: str = ""
    segments: list[Segment] = field(default_factory=list)
    stats: SpecStats | None = None
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.stats is not None


@dataclass
class Transcript:
    system: str = ""
    turns: list[Turn] = field(default_factory=list)

    def messages(self, next_user: str | None = None) -> list[ChatMessage]:
        """The conversation as the model sees it: failed replies are left out, stopped ones kept."""
        out = [ChatMessage("system", self.system)] if self.system.strip() else []
        for turn in self.turns:
            if turn.error is not None:
                continue
            out.append(ChatMessage("user", turn.user))
            if turn.complete:
                out.append(ChatMessage("assistant", turn.reply))
        if next_user is not None:
            out.append(ChatMessage("user", next_user))
        return out

    def to_markdown(self, header: str = "") -> str:
        lines = [f"# localspec chat, {datetime.now():%Y-%m-%d %H:%M}", ""]
        if header:
            lines += [header, ""]
        if self.system.strip():
            lines += ["**System:** " + self.system, ""]
        for turn in self.turns:
            lines += ["## You", "", turn.user, "", "## Assistant", "", turn.reply or "_(no text)_", ""]
            if turn.stats is not None:
                lines += ["> " + reply_summary(turn.stats), ""]
            if turn.error is not None:
                lines += [f"> **error:** {turn.error}", ""]
        return "\n".join(lines)

    def save(self, directory: Path, header: str = "") -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"localspec-chat-{datetime.now():%Y%m%d-%H%M%S}.md"
        n = 1
        while path.exists():
            n += 1
            path = directory / f"localspec-chat-{datetime.now():%Y%m%d-%H%M%S}-{n}.md"
        path.write_text(self.to_markdown(header), encoding="utf-8")
        return path


# -- formatting shared by widgets, the saved transcript and tests ---------------------------------------


def fmt_tps(stats: SpecStats) -> str:
    return f"{stats.decode_tps:.1f} tok/s"


def fmt_acceptance(stats: SpecStats) -> str:
    if stats.draft_method == "none":
        return "n/a (no draft)"
    return f"{stats.acceptance_rate:.1%} ({stats.n_accepted}/{stats.n_drafted})"


def fmt_accepted_length(stats: SpecStats) -> str:
    return f"{stats.mean_accepted_length:.2f} tokens/round ({stats.n_rounds} rounds)"


def reply_summary(stats: SpecStats) -> str:
    parts = [f"{stats.n_generated} tokens", fmt_tps(stats)]
    if stats.draft_method != "none":
        parts += [f"acceptance {stats.acceptance_rate:.0%}", f"{stats.mean_accepted_length:.2f} tokens/round"]
    if stats.n_prompt_cached:
        parts.append(f"{stats.n_prompt_cached}/{stats.n_prompt} prompt tokens cached")
    if stats.stop_reason == "stopped":
        parts.append("stopped")
    elif stats.stop_reason in ("max_tokens", "context"):
        parts.append(f"cut at {stats.stop_reason.replace('_', ' ')}")
    return " · ".join(parts)


def error_text(e: BaseException) -> str:
    if isinstance(e, LocalspecError):
        return f"{e.message}" + (f" (hint: {e.hint})" if e.hint else "")
    return f"{type(e).__name__}: {e}"



# -- the catalog and pulls (localspec.catalog / localspec.hub) ------------------------------------------


@dataclass(frozen=True)
class PairEntry:
    name: str
    description: str
    downloaded: bool
    size_text: str
    target_path: str | None = None
    draft_path: str | None = None


def catalog_entries(backend: str) -> tuple[list[PairEntry], str | None]:
    """The catalog's pairs for a backend, each marked downloaded or not; or why there are none."""
    try:
        from localspec import catalog
    except ImportError:
        return [], "no catalog in this build: give model paths below"
    try:
        cat = catalog.load_catalog()
    except LocalspecError as e:
        return [], "catalog unreadable: " + error_text(e)
    entries = []
    for name, pair in cat.pairs.items():
        bp = pair.backends.get(backend)
        if bp is None:
            continue
        size = f"{bp.size_gb:.1f} GB" if bp.size_gb else "size unknown"
        try:
            target, draft = catalog.resolve_pair(name, backend)
        except LocalspecError:
            entries.append(PairEntry(name, pair.description, False, size))
        else:
            entries.append(PairEntry(name, pair.description, True, size, str(target), str(draft)))
    if not entries:
        return [], f"the catalog has no pairs for {backend}"
    return entries, None


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def pull_pair_with_progress(
    name: str, backend: str, report: Callable[[float | None, str], None], cancel: threading.Event | None = None
) -> None:
    """Download a catalog pair (localspec.hub), reporting (fraction of the current file or None, text)."""
    from localspec import hub

    def progress(ev: hub.ProgressEvent) -> None:
        role = f"{ev.role} " if ev.role else ""
        if ev.cached:
            report(1.0, f"{role}{ev.file}: already downloaded")
            return
        total = ev.bytes_total
        fraction = ev.bytes_done / total if total else None
        amount = f"{human_size(ev.bytes_done)} / {human_size(total)}" if total else human_size(ev.bytes_done)
        speed = f", {human_size(ev.speed)}/s" if ev.speed else ""
        report(fraction, f"pulling {role}{ev.file}: {amount}{speed}")

    hub.pull_pair(name, backend, progress=progress, cancel=cancel)
