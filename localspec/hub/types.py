"""What a pull reports: progress events, the pulled models, the pair check, the cancel error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from localspec.catalog import ModelRef
from localspec.errors import PullError
from localspec.formatting import format_bytes
from localspec.hub.files import ModelPlan


@dataclass(frozen=True)
class ProgressEvent:
    file: str  # path inside the repo
    repo: str
    role: str  # "target", "draft", or "" for a single model
    bytes_done: int
    bytes_total: int | None
    speed: float | None  # bytes per second, over the last few seconds
    eta: float | None  # seconds left
    done: bool
    cached: bool = False  # already in the cache; nothing was transferred
    elapsed: float = 0.0  # seconds since this file's transfer started


@dataclass(frozen=True)
class PulledModel:
    role: str
    repo: str
    revision: str
    commit: str | None
    files: tuple[str, ...]
    path: str  # llama: the GGUF file (first part if split); mlx: the snapshot directory
    bytes_downloaded: int
    bytes_total: int
    sidecars: dict[str, str] = field(default_factory=dict)  # drafter family -> local path (mtp-, eagle3-, ... files)


@dataclass(frozen=True)
class PullResult:
    models: tuple[PulledModel, ...]
    backend: str
    header_bytes_read: int = 0  # bytes read to check the pair's headers (0 if not checked)
    compat_checked: bool = False

    @property
    def bytes_downloaded(self) -> int:
        return sum(m.bytes_downloaded for m in self.models)

    def path(self, role: str) -> str:
        for m in self.models:
            if m.role == role:
                return m.path
        raise KeyError(role)

    @property
    def target(self) -> str:
        return self.path("target")

    @property
    def draft(self) -> str:
        return self.path("draft")


@dataclass(frozen=True)
class CompatReport:
    target: ModelRef
    draft: ModelRef
    bytes_read: int  # over the network (0 when both headers were local)
    file_sizes: tuple[int | None, int | None]
    target_vocab: int
    draft_vocab: int


@dataclass(frozen=True)
class PairPlan:
    """What pulling a catalog pair will fetch: each model's files, their sizes, what is cached already."""

    pair: str
    backend: str
    endpoint: str
    cache_dir: str
    models: tuple[ModelPlan, ...]

    @property
    def bytes_to_download(self) -> int:
        return sum(m.bytes_to_download for m in self.models)

    def lines(self) -> list[str]:
        """One line per file: role, repo/file, size, and whether it is cached already."""
        out = []
        for m in self.models:
            for f in m.files:
                size = format_bytes(f.size) if f.size is not None else "size unknown"
                state = "  (already downloaded)" if f.cached_path else ""
                out.append(f"{m.role:<6} {m.ref.repo}/{f.path}  {size}{state}")
        return out


class PullCancelled(PullError):
    """The caller set the cancel event."""

    exit_code = 130


ProgressFn = Callable[[ProgressEvent], None]
LogFn = Callable[[str], None]
