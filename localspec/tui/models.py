"""What the picker offers: backends that can run here, catalog pairs and their download state, a pair
check from metadata alone, and catalog pulls with progress. No Textual here: workers call these."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from localspec.backends.registry import BACKENDS
from localspec.errors import IncompatiblePairError, LocalspecError, error_text
from localspec.families import registry
from localspec.formatting import format_bytes
from localspec.options import ModelOptions


def plain_methods() -> tuple[str, ...]:
    """The draft methods that need no head: offered for any target."""
    return tuple(f.name for f in registry.families() if not f.is_head)


@dataclass(frozen=True)
class BackendStatus:
    name: str  # the backend's name in the table: the LoadOptions.backend value
    label: str  # what the picker shows
    usable: bool
    detail: str  # the device it runs on, or why it cannot run here


def probe_backends() -> list[BackendStatus]:
    """Every backend in the table, usable or not (an unusable one carries the reason). Loads no model."""
    return [BackendStatus(spec.name, spec.label, *spec.probe()) for spec in BACKENDS.values()]


def check_pair(backend: str, target: str, draft: str, method: str) -> tuple[bool, str]:
    """Whether a target/draft choice can run, from file metadata only (no weights load): (ok, why)."""
    from localspec.pipeline import check_pair as pipeline_check

    target, draft = target.strip(), draft.strip()
    if not target:
        return False, "choose a target model (a catalog pair, or a path)"
    if method == "model" and not draft:
        return False, "draft method 'model' needs a draft model (or pick ngram / none)"
    try:
        opts = ModelOptions(target=target, draft=draft or None, backend=backend, draft_method=method)
        return True, pipeline_check(opts).describe(method)
    except IncompatiblePairError as e:
        return False, f"{e.message} (pick a draft of the same family, or set the draft method below to ngram)"
    except LocalspecError as e:
        return False, error_text(e)
    except Exception as e:  # a file the metadata readers choke on
        return False, error_text(e)


def method_choices(backend: str, target: str, draft: str) -> tuple[tuple[str, ...], str]:
    """The draft methods to offer for these files: the plain ones, then each head family only when it can
    run here on them (its backend, runnable by this build, a head of its architecture made for this
    target). Also a note on why a head given as draft is held back ("" when none is). From file headers
    only."""
    target, draft = target.strip(), draft.strip()
    plain = plain_methods()
    if not target or not any(f.runs_on(backend) for f in registry.head_families()):
        return plain, ""
    fits = registry.head_fits(target, draft or None, backend)
    offered = plain + tuple(m for m, why in fits.items() if not why)
    family = registry.head_for_draft(draft or None, target)
    note = f"{family} not offered: {fits[family]}" if family in fits and fits[family] else ""
    return offered, note


@dataclass(frozen=True)
class PairEntry:
    name: str
    description: str
    downloaded: bool
    size_text: str
    target_path: str | None = None
    draft_path: str | None = None
    default: bool = False  # the catalog's default pair (used when no model is given)
    models: str = ""  # what a pull fetches: "target REPO:FILE, draft REPO:FILE"

    @property
    def pull_offer(self) -> str:
        """What the picker says before a pull: what and how much."""
        what = f": {self.models}" if self.models else ""
        return f"{self.name} is not downloaded. Ctrl+D downloads {self.size_text}{what}"


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
        size = "about " + format_bytes(bp.size_gb * 1e9) if bp.size_gb else "size unknown"
        extra = dict(default=name == cat.default, models=f"target {bp.target}, draft {bp.draft}")
        try:
            target, draft = catalog.resolve_pair(name, backend)
        except LocalspecError:
            entries.append(PairEntry(name, pair.description, False, size, **extra))  # type: ignore[arg-type]
        else:
            entries.append(PairEntry(name, pair.description, True, size, str(target), str(draft), **extra))  # type: ignore[arg-type]
    if not entries:
        return [], f"the catalog has no pairs for {backend}"
    return entries, None


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
        amount = f"{format_bytes(ev.bytes_done)} / {format_bytes(total)}" if total else format_bytes(ev.bytes_done)
        speed = f", {format_bytes(ev.speed)}/s" if ev.speed else ""
        report(fraction, f"pulling {role}{ev.file}: {amount}{speed}")

    hub.pull_pair(name, backend, progress=progress, cancel=cancel)
