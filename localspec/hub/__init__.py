"""Download models from the Hugging Face Hub into the standard HF cache, and check pairs from headers.

API (safe to call from a UI worker thread; `progress` and `log` run on the downloading thread, so a
Textual app should forward them with `call_from_thread` / `post_message`):

    Connection: endpoint, token, cache_dir, progress, cancel, log (keywords, each None by default)
    pull_pair(name, backend="auto", *, check=True, plan=None, **Connection) -> PullResult
        A catalog pair. backend "auto" picks MLX on Apple silicon with mlx-lm, else llama.cpp
        (pair_backend_for). `plan`: a PairPlan from plan_pair, so its listing is not asked for twice.
    plan_pair(name, backend="auto", *, endpoint=None, token=None, cache_dir=None, log=None) -> PairPlan
        What pull_pair would fetch (files, sizes, what is cached), from the Hub's file listing only:
        metadata requests, no file content. PullError under HF_HUB_OFFLINE.
    pair_backend_for(pair, backend) -> a backend name (backends.registry)
        The backend a pair is pulled and run with ("auto": MLX on Apple silicon, else llama.cpp;
        the pair's first backend when it lacks that one).
    pull_model(spec, *, backend=None, **Connection) -> PullResult
        One model: "REPO:FILE" (a GGUF, with all parts of a split GGUF), "REPO" (its only GGUF,
        else an mlx-lm snapshot; a repo with several GGUFs is refused with the list), "...@REV".
    pull_custom_pair(target, draft, *, backend=None, check=True, **Connection) -> PullResult
        Two models given as "REPO:FILE" (llama) or "REPO" (mlx).
    With check=True (the default) a GGUF pair is checked from its headers before any large
    transfer, and an MLX pair from its tokenizer files (fetched first; needs mlx-lm) before the
    weights.
    check_remote_pair(target, draft, *, endpoint=None, token=None, cache_dir=None) -> CompatReport
        llama.cpp's vocabulary rule from the two GGUF headers only (HTTP Range reads of a few MB,
        or the local file when cached). Raises IncompatiblePairError.

    ProgressEvent(file, repo, role, bytes_done, bytes_total, speed, eta, done, cached, elapsed)
        one per file at most every 0.1 s, plus a final done=True event (cached=True: nothing moved)
    PullResult.models (PulledModel: role, repo, files, path, bytes_downloaded), .target, .draft,
        .path(role), .bytes_downloaded, .header_bytes_read
    cancel: a threading.Event; setting it aborts the transfer with PullCancelled.

Errors are PullError (message + hint; PullCancelled is one), IncompatiblePairError, CatalogError.
Downloads go through hf_hub_download, so HF_TOKEN, HF_ENDPOINT, HF_HOME/HF_HUB_CACHE and
HF_HUB_OFFLINE mean what they mean to huggingface_hub; a second pull of the same files transfers
nothing. A dropped connection is resumed inside the same pull with HTTP Range (huggingface_hub's
retry); a file never appears in the cache until it is complete (huggingface_hub writes a
temporary file and renames it), so an interrupted pull leaves no complete-looking partial file.

The package: files.py (which files make a model), client.py (plan, check, download, offline),
headers.py (remote GGUF headers), progress.py (events), errors.py (messages and hints), types.py.
"""

from __future__ import annotations

import threading
from typing import TypedDict, Unpack

from localspec.backends.registry import resolve_backend
from localspec.catalog import ModelRef, Pair, load_catalog
from localspec.errors import PullError
from localspec.hub.client import Hub, offline
from localspec.hub.files import as_ref, pair_backend
from localspec.hub.progress import Tracker
from localspec.hub.types import (
    CompatReport,
    LogFn,
    PairPlan,
    ProgressEvent,
    ProgressFn,
    PullCancelled,
    PulledModel,
    PullResult,
)

# -- public entry points ------------------------------------------------------------------------


def pair_backend_for(pair: Pair, backend: str) -> str:
    """The concrete backend a catalog pair is pulled and run with."""
    if backend != "auto":
        pair.backend(backend)  # CatalogError when the pair has no such models
        return backend
    chosen = resolve_backend("auto")[0]
    return chosen if chosen in pair.backends else next(iter(pair.backends))


def plan_pair(
    name: str,
    backend: str = "auto",
    *,
    endpoint: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | None = None,
    log: LogFn | None = None,
) -> PairPlan:
    """The files a pull of a catalog pair would fetch, their sizes and what the cache has already."""
    pair = load_catalog().get(name)
    backend = pair_backend_for(pair, backend)
    if offline():
        raise PullError(
            f"HF_HUB_OFFLINE is set: cannot ask the Hub which files {name} ({backend}) needs",
            "unset HF_HUB_OFFLINE (or set it to 0) to download it",
        )
    bp = pair.backend(backend)
    hub = Hub(endpoint, token, cache_dir, None, None, log)
    models = tuple(hub.plan(ref, role, backend) for role, ref in (("target", bp.target), ("draft", bp.draft)))
    return PairPlan(name, backend, hub.endpoint, hub.cache_dir, models)


class Connection(TypedDict, total=False):
    """How a pull reaches the Hub and reports: the keywords pull_pair, pull_custom_pair and pull_model share
    (each None by default: HF_ENDPOINT or huggingface.co, the saved token, the HF cache, no reports)."""

    endpoint: str | None
    token: str | bool | None
    cache_dir: str | None
    progress: ProgressFn | None
    cancel: threading.Event | None
    log: LogFn | None


def _hub(conn: Connection) -> Hub:
    get = conn.get
    return Hub(get("endpoint"), get("token"), get("cache_dir"), get("progress"), get("cancel"), get("log"))


def pull_pair(
    name: str, backend: str = "auto", *, check: bool = True, plan: PairPlan | None = None, **conn: Unpack[Connection]
) -> PullResult:
    """Download a catalog pair's target and draft for one backend (checking llama pairs first)."""
    hub = _hub(conn)
    if plan is not None and not offline():
        return hub.pull_planned(list(plan.models), check=check)
    pair = load_catalog().get(name)
    backend = pair_backend_for(pair, backend)
    bp = pair.backend(backend)
    return hub.pull([("target", bp.target), ("draft", bp.draft)], backend, check=check)


def pull_custom_pair(
    target: str | ModelRef,
    draft: str | ModelRef,
    *,
    backend: str | None = None,
    check: bool = True,
    **conn: Unpack[Connection],
) -> PullResult:
    """Download a target and a draft not in the catalog; GGUF pairs are checked from headers first."""
    t, d = as_ref(target), as_ref(draft)
    backend = backend or pair_backend(t, d)
    return _hub(conn).pull([("target", t), ("draft", d)], backend, check=check)


def pull_model(spec: str | ModelRef, *, backend: str | None = None, **conn: Unpack[Connection]) -> PullResult:
    """Download one model given as REPO[:FILE][@REV]."""
    return _hub(conn).pull([("", as_ref(spec))], backend, check=False)


def check_remote_pair(
    target: str | ModelRef,
    draft: str | ModelRef,
    *,
    endpoint: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | None = None,
) -> CompatReport:
    """Check a GGUF pair with llama.cpp's vocabulary rule from the headers alone."""
    t, d = as_ref(target), as_ref(draft)
    for r in (t, d):
        if not (r.file and r.file.endswith(".gguf")):
            raise PullError(f"{r} is not a GGUF file reference", "use REPO:FILE.gguf for both models")
    hub = Hub(endpoint, token, cache_dir, None, None, None)
    return hub.check_pair(t, d)


__all__ = [
    "CompatReport",
    "Connection",
    "PairPlan",
    "ProgressEvent",
    "PullCancelled",
    "PullResult",
    "PulledModel",
    "Tracker",
    "check_remote_pair",
    "pair_backend_for",
    "plan_pair",
    "pull_custom_pair",
    "pull_model",
    "pull_pair",
]
