"""Download models from the Hugging Face Hub into the standard HF cache, and check pairs from headers.

API (safe to call from a UI worker thread; `progress` and `log` run on the downloading thread, so a
Textual app should forward them with `call_from_thread` / `post_message`):

    pull_pair(name, backend="auto", *, progress=None, endpoint=None, token=None, cache_dir=None,
              check=True, cancel=None, log=None) -> PullResult
        A catalog pair. backend "auto" picks MLX on Apple silicon with mlx-lm, else llama.cpp.
    pull_model(spec, *, backend=None, progress=None, endpoint=None, token=None, cache_dir=None,
               cancel=None, log=None) -> PullResult
        One model: "REPO:FILE" (a GGUF, with all parts of a split GGUF), "REPO" (its only GGUF,
        else an mlx-lm snapshot; a repo with several GGUFs is refused with the list), "...@REV".
    pull_custom_pair(target, draft, *, backend=None, ...same keywords as pull_pair...) -> PullResult
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
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from localspec.catalog import (
    ModelRef,
    cached_model_path,
    hub_cache_dir,
    load_catalog,
    parse_model_ref,
    split_gguf_parts,
)
from localspec.errors import BackendUnavailableError, LocalspecError, ModelFileError, PullError
from localspec.gguf_meta import GGUFHeader, NeedMoreBytes, parse_header, read_gguf_header
from localspec.vocab import VocabInfo, check_compatible

# What mlx-lm downloads for a model (mlx_lm.utils.DEFAULT_ALLOW_PATTERNS), copied to avoid importing it.
MLX_ALLOW_PATTERNS = (
    "*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model", "*.txt", "*.jsonl",
    "*.jinja",
)  # fmt: skip
HEADER_FIRST_READ = 2 << 20  # most GGUF headers (tokenizer included) fit in 2-8 MiB
HEADER_MAX_READ = 256 << 20
_DISK_MARGIN = 64 << 20


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


class PullCancelled(PullError):
    """The caller set the cancel event."""

    exit_code = 130


ProgressFn = Callable[[ProgressEvent], None]
LogFn = Callable[[str], None]


# -- public entry points ------------------------------------------------------------------------


def pull_pair(
    name: str,
    backend: str = "auto",
    *,
    progress: ProgressFn | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | None = None,
    check: bool = True,
    cancel: threading.Event | None = None,
    log: LogFn | None = None,
) -> PullResult:
    """Download a catalog pair's target and draft for one backend (checking llama pairs first)."""
    pair = load_catalog().get(name)
    if backend == "auto":
        from localspec.loader import resolve_backend

        backend = resolve_backend("auto")[0]
        if backend not in pair.backends:
            backend = next(iter(pair.backends))
    bp = pair.backend(backend)
    hub = _Hub(endpoint, token, cache_dir, progress, cancel, log)
    return hub.pull([("target", bp.target), ("draft", bp.draft)], backend, check=check)


def pull_custom_pair(
    target: str | ModelRef,
    draft: str | ModelRef,
    *,
    backend: str | None = None,
    progress: ProgressFn | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | None = None,
    check: bool = True,
    cancel: threading.Event | None = None,
    log: LogFn | None = None,
) -> PullResult:
    """Download a target and a draft not in the catalog; GGUF pairs are checked from headers first."""
    t, d = _as_ref(target), _as_ref(draft)
    backend = backend or _pair_backend(t, d)
    hub = _Hub(endpoint, token, cache_dir, progress, cancel, log)
    return hub.pull([("target", t), ("draft", d)], backend, check=check)


def pull_model(
    spec: str | ModelRef,
    *,
    backend: str | None = None,
    progress: ProgressFn | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | None = None,
    cancel: threading.Event | None = None,
    log: LogFn | None = None,
) -> PullResult:
    """Download one model given as REPO[:FILE][@REV]."""
    ref = _as_ref(spec)
    hub = _Hub(endpoint, token, cache_dir, progress, cancel, log)
    return hub.pull([("", ref)], backend, check=False)


def check_remote_pair(
    target: str | ModelRef,
    draft: str | ModelRef,
    *,
    endpoint: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | None = None,
) -> CompatReport:
    """Check a GGUF pair with llama.cpp's vocabulary rule from the headers alone."""
    t, d = _as_ref(target), _as_ref(draft)
    for r in (t, d):
        if not (r.file and r.file.endswith(".gguf")):
            raise PullError(f"{r} is not a GGUF file reference", "use REPO:FILE.gguf for both models")
    hub = _Hub(endpoint, token, cache_dir, None, None, None)
    return hub.check_pair(t, d)


# -- implementation -----------------------------------------------------------------------------


@dataclass
class _FilePlan:
    path: str
    size: int | None
    cached_path: str | None  # local path if already complete in the cache


@dataclass
class _ModelPlan:
    role: str
    ref: ModelRef
    backend: str  # "llama" | "mlx"
    commit: str | None
    files: list[_FilePlan] = field(default_factory=list)
    local: dict[str, str] = field(default_factory=dict)  # fetched so far: repo path -> local path
    downloaded: int = 0

    @property
    def main_file(self) -> str | None:
        return self.files[0].path if self.backend == "llama" and self.files else None

    @property
    def bytes_to_download(self) -> int:
        return sum(f.size or 0 for f in self.files if not f.cached_path)

    @property
    def bytes_total(self) -> int:
        return sum(f.size or 0 for f in self.files)


class _Hub:
    def __init__(
        self,
        endpoint: str | None,
        token: str | bool | None,
        cache_dir: str | None,
        progress: ProgressFn | None,
        cancel: threading.Event | None,
        log: LogFn | None,
    ) -> None:
        from huggingface_hub import constants

        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self.token = token
        self.cache_dir = cache_dir or hub_cache_dir()
        self.progress = progress
        self.cancel = cancel
        self.log = log or (lambda _msg: None)
        self._api: Any = None

    @property
    def api(self) -> Any:
        if self._api is None:
            from huggingface_hub import HfApi

            self._api = HfApi(endpoint=self.endpoint, token=self.token)
        return self._api

    # -- the whole pull ----------------------------------------------------------------------

    def pull(self, refs: list[tuple[str, ModelRef]], backend: str | None, *, check: bool) -> PullResult:
        if backend is not None and backend not in ("llama", "mlx"):
            raise PullError(f"unknown backend {backend!r}", "choose llama or mlx")
        if _offline():
            return self._from_cache_offline(refs, backend)
        plans = [self.plan(ref, role, backend) for role, ref in refs]
        header_bytes, checked = 0, False
        if check and len(plans) == 2 and all(p.backend == "llama" for p in plans):
            t, d = plans
            self.log("checking that the draft's vocabulary matches the target's (GGUF headers only)")
            report = self.check_pair(_pinned(t), _pinned(d), t.files[0].cached_path, d.files[0].cached_path)
            header_bytes, checked = report.bytes_read, True
            where = f"read {format_bytes(report.bytes_read)} of headers" if report.bytes_read else "local headers"
            self.log(f"vocabularies match ({report.target_vocab:,} / {report.draft_vocab:,} tokens; {where})")
        self._check_disk(plans)
        if check and len(plans) == 2 and all(p.backend == "mlx" for p in plans):
            self.log("checking that the draft's tokenizer matches the target's (tokenizer files first)")
            checked = self._check_mlx_pair(*plans)
        models = tuple(self._download(p) for p in plans)
        return PullResult(models, plans[0].backend, header_bytes, checked)

    # -- planning: what to download ----------------------------------------------------------

    def plan(self, ref: ModelRef, role: str, backend: str | None) -> _ModelPlan:
        with _hub_errors(self, ref):
            info = self.api.model_info(ref.repo, revision=ref.revision)
            commit = info.sha
            entries = list(self.api.list_repo_tree(ref.repo, revision=commit or ref.revision, recursive=True))
        sizes: dict[str, int | None] = {
            e.path: getattr(e, "size", None) for e in entries if type(e).__name__ == "RepoFile"
        }
        backend, files = _select_files(ref, backend, sizes)
        plan = _ModelPlan(role, ref, backend, commit)
        for f in files:
            plan.files.append(_FilePlan(f, sizes.get(f), self._cached(ref.repo, f, commit)))
        return plan

    def _cached(self, repo: str, file: str, commit: str | None) -> str | None:
        if not commit:
            return None
        from huggingface_hub import try_to_load_from_cache

        p = try_to_load_from_cache(repo, file, cache_dir=self.cache_dir, revision=commit)
        return p if isinstance(p, str) else None

    def _check_disk(self, plans: list[_ModelPlan]) -> None:
        need = sum(p.bytes_to_download for p in plans)
        if need == 0:
            return
        where = Path(self.cache_dir)
        while not where.exists() and where != where.parent:
            where = where.parent
        try:
            free = shutil.disk_usage(where).free
        except OSError:
            return
        if need + _DISK_MARGIN > free:
            raise PullError(
                f"not enough disk space: the download needs {format_bytes(need)}, "
                f"{format_bytes(free)} is free at {self.cache_dir}",
                "free some space, or point HF_HOME (or HF_HUB_CACHE) at a larger disk",
            )

    # -- downloading -------------------------------------------------------------------------

    def _download(self, plan: _ModelPlan, only: Callable[[str], bool] | None = None) -> PulledModel:
        """Fetch the plan's files not fetched yet (those `only` accepts, if given)."""
        from huggingface_hub import hf_hub_download

        for f in plan.files:
            if f.path in plan.local or (only is not None and not only(f.path)):
                continue
            self._check_cancel()
            if f.cached_path:
                plan.local[f.path] = f.cached_path
                self._emit(ProgressEvent(f.path, plan.ref.repo, plan.role, f.size or 0, f.size, None, None, True, True))
                continue
            tracker = _Tracker(f.path, plan.ref.repo, plan.role, f.size, self.progress, self.cancel)
            with _hub_errors(self, plan.ref, f.path, size=plan.bytes_to_download):
                plan.local[f.path] = hf_hub_download(
                    plan.ref.repo,
                    f.path,
                    revision=plan.commit or plan.ref.revision,
                    cache_dir=self.cache_dir,
                    endpoint=self.endpoint,
                    token=self.token,
                    tqdm_class=tracker.bar_class(),  # type: ignore[arg-type]
                )
            plan.downloaded += tracker.transferred
            tracker.finish(os.path.getsize(plan.local[f.path]))
        if only is None and plan.commit:
            self._write_ref(plan.ref, plan.commit)
        return PulledModel(
            plan.role,
            plan.ref.repo,
            plan.ref.revision,
            plan.commit,
            tuple(f.path for f in plan.files),
            self._model_path(plan),
            plan.downloaded,
            plan.bytes_total,
        )

    def _model_path(self, plan: _ModelPlan) -> str:
        if plan.backend == "mlx":
            return str(Path(self.cache_dir) / _repo_folder(plan.ref.repo) / "snapshots" / (plan.commit or ""))
        return plan.local.get(plan.files[0].path, "")

    def _check_mlx_pair(self, target: _ModelPlan, draft: _ModelPlan) -> bool:
        """Fetch both repos' small files first and compare tokenizers before any weights move.

        Needs mlx-lm (its tokenizer loader); without it the check is skipped and False returned.
        """
        small = lambda path: not path.endswith(".safetensors")  # noqa: E731
        for plan in (target, draft):
            self._download(plan, only=small)
        try:
            from localspec.backends import mlx as mlx_backend

            tv = mlx_backend.peek_vocab(self._model_path(target))
            dv = mlx_backend.peek_vocab(self._model_path(draft))
        except BackendUnavailableError:
            self.log("mlx-lm is not installed here: skipping the tokenizer check of the MLX pair")
            return False
        except Exception as e:  # a tokenizer mlx-lm cannot read: the loader will say more; do not block
            self.log(f"could not compare the tokenizers ({type(e).__name__}: {e}); skipping the check")
            return False
        check_compatible(tv, dv, target_name=str(target.ref), draft_name=str(draft.ref))
        self.log(f"tokenizers match ({tv.n_vocab:,} / {dv.n_vocab:,} tokens)")
        return True

    def _write_ref(self, ref: ModelRef, commit: str) -> None:
        """Record revision -> commit (the cache's refs/ file) so later offline lookups of `main` work.

        Files are fetched by commit (consistent with the listing, and a second pull then costs no
        request per file); huggingface_hub writes refs only for the revision it was called with.
        """
        if ref.revision == commit:
            return
        path = Path(self.cache_dir) / _repo_folder(ref.repo) / "refs" / ref.revision
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_file() and path.read_text() == commit:
                return
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(commit)
            os.replace(tmp, path)
        except OSError as e:
            raise _map_error(e, self, ref, None) from e

    def _emit(self, ev: ProgressEvent) -> None:
        if self.progress:
            self.progress(ev)

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise PullCancelled("download cancelled", "run the same pull again to continue; finished files are kept")

    # -- offline -----------------------------------------------------------------------------

    def _from_cache_offline(self, refs: list[tuple[str, ModelRef]], backend: str | None) -> PullResult:
        models = []
        for role, ref in refs:
            b = backend or ("llama" if ref.file and ref.file.endswith(".gguf") else "mlx")
            path = cached_model_path(ref, b, cache_dir=self.cache_dir) if (b == "mlx" or ref.file) else None
            if path is None:
                raise PullError(
                    f"HF_HUB_OFFLINE is set and {ref} is not in the cache ({self.cache_dir})",
                    "unset HF_HUB_OFFLINE (or set it to 0) to download it",
                )
            files = tuple(split_gguf_parts(ref.file)) if b == "llama" and ref.file else ()
            size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) if b == "mlx" else 0
            if b == "llama":
                size = sum(
                    os.path.getsize(os.path.join(os.path.dirname(path), os.path.basename(p))) for p in files
                )
            for f in files or (ref.repo,):
                self._emit(ProgressEvent(f, ref.repo, role, size, size, None, None, True, True))
            models.append(PulledModel(role, ref.repo, ref.revision, None, files, path, 0, size))
        kind = backend or ("llama" if refs[0][1].file else "mlx")
        return PullResult(tuple(models), kind)

    # -- headers -----------------------------------------------------------------------------

    def check_pair(
        self, target: ModelRef, draft: ModelRef, target_local: str | None = None, draft_local: str | None = None
    ) -> CompatReport:
        t_hdr, t_read, t_size = self.header(target, target_local)
        d_hdr, d_read, d_size = self.header(draft, draft_local)
        tv, dv = VocabInfo.from_gguf_metadata(t_hdr.metadata), VocabInfo.from_gguf_metadata(d_hdr.metadata)
        check_compatible(tv, dv, target_name=str(target), draft_name=str(draft))
        return CompatReport(target, draft, t_read + d_read, (t_size, d_size), tv.n_vocab, dv.n_vocab)

    def header(self, ref: ModelRef, local: str | None = None) -> tuple[GGUFHeader, int, int | None]:
        """The GGUF header of ref: from the local file if given, else by HTTP Range reads."""
        if local is None:
            from localspec.catalog import cached_model_path as _cached_path

            local = _cached_path(ref, "llama", cache_dir=self.cache_dir) if ref.file else None
        if local:
            return read_gguf_header(local, check_size=False), 0, os.path.getsize(local)
        assert ref.file
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(ref.repo, ref.file, revision=ref.revision, endpoint=self.endpoint)
        with _hub_errors(self, ref, ref.file):
            meta = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint)
        location = meta.location or url
        # Like huggingface_hub: the token goes to the Hub only, never to the CDN a large file lives on.
        same_host = urlparse(location).netloc == urlparse(url).netloc
        headers = build_hf_headers(token=self.token if same_host else False)
        headers["Accept-Encoding"] = "identity"
        size = meta.size
        buf = bytearray()
        want = HEADER_FIRST_READ
        while True:
            if size is not None:
                want = min(want, size)
            if want > len(buf):
                with _hub_errors(self, ref, ref.file):
                    buf += _range_get(location, headers, len(buf), want - 1)
            try:
                return parse_header(buf), len(buf), size
            except NeedMoreBytes as e:
                if size is not None and len(buf) >= size:
                    raise ModelFileError(f"{ref} is truncated: it ends inside its GGUF header", "") from None
                want = max(e.needed, 2 * len(buf))
                if want > HEADER_MAX_READ:
                    raise PullError(
                        f"{ref}: GGUF header larger than {format_bytes(HEADER_MAX_READ)}; not checking it remotely",
                        "pull with --no-check, then run the pair: the loader checks the local files",
                    ) from None
            except ValueError as e:
                raise PullError(f"{ref} is not a GGUF model file: {e}", "check the file name") from None


def _range_get(url: str, headers: dict[str, str], start: int, end: int) -> bytes:
    """Bytes [start, end] of url; reads only that much even if the server ignores Range."""
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

    n = end - start + 1
    out = bytearray()
    with http_stream_backoff(
        "GET", url, headers={**headers, "Range": f"bytes={start}-{end}"}, follow_redirects=True
    ) as r:
        hf_raise_for_status(r)
        skip = start if r.status_code == 200 else 0  # a server that ignored Range sends from byte 0
        for chunk in r.iter_bytes():
            if skip:
                drop = min(skip, len(chunk))
                chunk, skip = chunk[drop:], skip - drop
            out += chunk
            if len(out) >= n:
                break
    return bytes(out[:n])


# -- choosing files -----------------------------------------------------------------------------


def _select_files(ref: ModelRef, backend: str | None, sizes: dict[str, int | None]) -> tuple[str, list[str]]:
    ggufs = sorted(p for p in sizes if p.endswith(".gguf"))
    if ref.file:
        if backend == "mlx":
            raise PullError(f"{ref}: an MLX model is a whole repo, not one file", f"pull {ref.repo} without :FILE")
        parts = split_gguf_parts(ref.file)
        missing = [p for p in parts if p not in sizes]
        if missing:
            raise PullError(
                f"file {missing[0]} not found in {ref.repo} (revision {ref.revision})",
                _gguf_choice_hint(ref.repo, ggufs, sizes) if ggufs else f"files there: {', '.join(sorted(sizes)[:20])}",
            )
        return "llama" if ref.file.endswith(".gguf") else "file", parts
    models = _gguf_models(ggufs)
    has_weights = any(fnmatch.fnmatch(p, "model*.safetensors") for p in sizes)
    if backend == "llama" or (backend is None and models):
        if not models:
            raise PullError(
                f"{ref.repo} has no GGUF model files",
                "it looks like an MLX/safetensors repo: use --backend mlx" if has_weights else "check the repo id",
            )
        if len(models) > 1:
            raise PullError(
                f"{ref.repo} has {len(models)} GGUF models; say which one to pull",
                _gguf_choice_hint(ref.repo, ggufs, sizes),
            )
        return "llama", split_gguf_parts(models[0])
    if not has_weights:
        raise PullError(
            f"{ref.repo} has no safetensors weights, so it is not an mlx-lm model repo",
            "for a GGUF repo use --backend llama and REPO:FILE" if ggufs else "check the repo id",
        )
    files = [p for p in sorted(sizes) if any(fnmatch.fnmatch(p, pat) for pat in MLX_ALLOW_PATTERNS)]
    return "mlx", files


def _gguf_models(ggufs: list[str]) -> list[str]:
    """GGUF models in a listing: split sets count once (by their first part); projector files are not models."""
    out = []
    for p in ggufs:
        name = p.rsplit("/", 1)[-1]
        if name.startswith("mmproj") or "imatrix" in name.lower():
            continue
        m = re.match(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", p)
        if m and m.group(2) != "00001":
            continue
        out.append(p)
    return out


def _gguf_choice_hint(repo: str, ggufs: list[str], sizes: dict[str, int | None]) -> str:
    models = _gguf_models(ggufs)
    lines = []
    for p in models:
        parts = split_gguf_parts(p)
        total = sum(sizes.get(q) or 0 for q in parts)
        extra = f", {len(parts)} parts" if len(parts) > 1 else ""
        lines.append(f"  localspec pull {repo}:{p}   ({format_bytes(total)}{extra})")
    return "pick one:\n" + "\n".join(lines)


def _pair_backend(t: ModelRef, d: ModelRef) -> str:
    kinds = {"llama" if (r.file or "").endswith(".gguf") else ("mlx" if not r.file else "?") for r in (t, d)}
    if kinds == {"llama"}:
        return "llama"
    if kinds == {"mlx"}:
        return "mlx"
    raise PullError(
        f"target {t} and draft {d} are not the same kind of model",
        "give two GGUF files (REPO:FILE.gguf, llama.cpp) or two mlx-lm repos (REPO, MLX)",
    )


def _as_ref(spec: str | ModelRef) -> ModelRef:
    if isinstance(spec, ModelRef):
        return spec
    from localspec.errors import CatalogError

    try:
        return parse_model_ref(spec)
    except CatalogError as e:
        raise PullError(e.message, e.hint) from None


def _pinned(plan: _ModelPlan) -> ModelRef:
    return ModelRef(plan.ref.repo, plan.main_file, plan.commit or plan.ref.revision)


def _repo_folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def _offline() -> bool:
    from huggingface_hub import constants

    v = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return constants.HF_HUB_OFFLINE or v.strip().upper() in {"1", "ON", "YES", "TRUE"}


# -- progress -----------------------------------------------------------------------------------


class _Tracker:
    """Turns huggingface_hub's tqdm-style updates for one file into ProgressEvents."""

    MIN_INTERVAL = 0.1  # seconds between events (the final one always goes out)
    WINDOW = 5.0  # seconds of history for the speed

    def __init__(
        self,
        file: str,
        repo: str,
        role: str,
        total: int | None,
        emit: ProgressFn | None,
        cancel: threading.Event | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.file, self.repo, self.role = file, repo, role
        self.total = total
        self.done = 0
        self.transferred = 0  # bytes received from the network by this pull
        self.emit = emit
        self.cancel = cancel
        self.clock = clock
        self.start = clock()
        self.samples: deque[tuple[float, int]] = deque([(self.start, 0)])
        self.last_emit = 0.0
        self.lock = threading.Lock()  # hf_xet reports from its own threads

    def bar_class(self) -> type:
        tracker = self

        class _Bar:
            """The tqdm subset huggingface_hub uses (http_get and the hf_xet reporter)."""

            def __init__(self, *args: Any, total: int | None = None, initial: int = 0, **kwargs: Any) -> None:
                self.n = initial
                if total:
                    tracker.total = total
                if initial:
                    tracker.update(initial, network=False)

            @property
            def total(self) -> int | None:
                return tracker.total

            @total.setter
            def total(self, value: int | None) -> None:
                if value:
                    tracker.total = value

            def update(self, n: int | float | None = 1) -> None:
                self.n += int(n or 0)
                tracker.update(int(n or 0), network=False)

            def update_transfer(self, n: int | float | None = 1) -> None:
                tracker.transferred += int(n or 0)

            def __enter__(self) -> _Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def close(self) -> None:
                return None

            def __getattr__(self, name: str) -> Callable[..., None]:
                if name.startswith("__"):
                    raise AttributeError(name)
                return lambda *a, **k: None  # set_postfix_str, refresh, set_description, ...

        return _Bar

    def update(self, n: int, *, network: bool) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise PullCancelled("download cancelled", "run the same pull again to continue; finished files are kept")
        with self.lock:
            self.done = max(0, self.done + n)
            now = self.clock()
            self.samples.append((now, self.done))
            while len(self.samples) > 2 and now - self.samples[0][0] > self.WINDOW:
                self.samples.popleft()
            if now - self.last_emit < self.MIN_INTERVAL:
                return
            self.last_emit = now
            ev = self._event(done=False)
        if self.emit:
            self.emit(ev)

    def finish(self, size: int) -> None:
        self.total = size
        self.done = size
        if self.transferred == 0:
            self.transferred = size  # a tqdm_class without update_transfer calls (older huggingface_hub)
        if self.emit:
            self.emit(self._event(done=True))

    def speed(self) -> float | None:
        t0, b0 = self.samples[0]
        t1, b1 = self.samples[-1]
        if t1 - t0 <= 0:
            return None
        return max(0.0, (b1 - b0) / (t1 - t0))

    def _event(self, *, done: bool) -> ProgressEvent:
        speed = self.speed() if not done else _avg(self.done, self.clock() - self.start)
        eta = None
        if not done and speed and self.total:
            eta = max(0.0, (self.total - self.done) / speed)
        return ProgressEvent(
            self.file,
            self.repo,
            self.role,
            self.done,
            self.total,
            speed,
            0.0 if done else eta,
            done,
            elapsed=self.clock() - self.start,
        )


def _avg(n: int, seconds: float) -> float | None:
    return n / seconds if seconds > 0 else None


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


# -- errors -------------------------------------------------------------------------------------


@contextmanager
def _hub_errors(hub: _Hub, ref: ModelRef, file: str | None = None, *, size: int | None = None) -> Iterator[None]:
    try:
        yield
    except LocalspecError:
        raise
    except Exception as e:
        raise _map_error(e, hub, ref, file, size=size) from e


def _map_error(e: BaseException, hub: _Hub, ref: ModelRef, file: str | None, *, size: int | None = None) -> PullError:
    """One place that turns huggingface_hub / HTTP / OS errors into a message and a hint."""
    names = {c.__name__ for c in type(e).__mro__}
    what = f"{ref.repo}/{file}" if file else ref.repo
    endpoint = hub.endpoint
    status = getattr(getattr(e, "response", None), "status_code", None)
    if "GatedRepoError" in names:
        return PullError(
            f"{ref.repo} is a gated repository: its files need an accepted license and a token",
            f"open {endpoint}/{ref.repo}, accept the terms, then set HF_TOKEN to a read token of that account "
            "(or run `hf auth login`)",
        )
    if "RevisionNotFoundError" in names:
        return PullError(
            f"revision {ref.revision!r} not found in {ref.repo}",
            "use a branch, tag or commit that exists (default: main)",
        )
    if "RepositoryNotFoundError" in names:
        return PullError(
            f"repository {ref.repo} not found on {endpoint} (or it is private)",
            "check the id (owner/name; case matters); for a private repo set HF_TOKEN to a token that can read it",
        )
    if "EntryNotFoundError" in names and "LocalEntryNotFoundError" not in names:
        return PullError(f"file {file} not found in {ref.repo} (revision {ref.revision})", "check the file name")
    if "OfflineModeIsEnabled" in names:
        return PullError(
            f"HF_HUB_OFFLINE is set and {what} is not in the cache", "unset HF_HUB_OFFLINE (or set it to 0) to download"
        )
    if status == 401:
        return PullError(
            f"{endpoint} refused the request for {what} (HTTP 401 unauthorized)",
            "HF_TOKEN is missing, invalid or expired: create a read token at https://huggingface.co/settings/tokens",
        )
    if status == 403:
        return PullError(
            f"{endpoint} forbids access to {what} (HTTP 403)",
            "your token lacks permission for this repo (fine-grained tokens need read access to it)",
        )
    if status == 404:
        return PullError(f"{what} not found on {endpoint} (HTTP 404)", "check the repo id, file name and revision")
    if status == 429:
        return PullError(
            f"{endpoint} is rate-limiting requests (HTTP 429)", "wait a minute and run again; HF_TOKEN raises the limit"
        )
    if isinstance(status, int) and status >= 500:
        return PullError(
            f"{endpoint} failed with HTTP {status} while fetching {what}",
            "the Hub or mirror is having trouble: run the same command again later; finished files are kept",
        )
    if names & {"RemoteProtocolError", "ReadError", "ReadTimeout", "ChunkedEncodingError", "IncompleteRead"} or (
        isinstance(e, OSError) and "Consistency check failed" in str(e)
    ):
        return PullError(
            f"the download of {what} was interrupted ({type(e).__name__})",
            "run the same command again: finished files are kept and not downloaded twice",
        )
    unreachable = {"ConnectError", "ConnectTimeout", "TimeoutException", "NetworkError", "ProxyError", "ConnectionError"}
    if names & unreachable or "LocalEntryNotFoundError" in names:
        return PullError(
            f"cannot reach {endpoint} to fetch {what}",
            "check your network or proxy; HF_ENDPOINT selects a mirror; HF_HUB_OFFLINE=1 uses only the local cache",
        )
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        need = f" (about {format_bytes(size)} to download)" if size else ""
        return PullError(
            f"disk full while downloading {what} into {hub.cache_dir}{need}",
            "free some space, or point HF_HOME (or HF_HUB_CACHE) at a larger disk, then run again",
        )
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PullError(
            f"cannot write to the model cache {hub.cache_dir}: {e.strerror}",
            "check its permissions, or point HF_HOME (or HF_HUB_CACHE) at a writable directory",
        )
    return PullError(f"download of {what} failed: {type(e).__name__}: {e}", "run the same command again")


__all__ = [
    "CompatReport",
    "ProgressEvent",
    "PullCancelled",
    "PullResult",
    "PulledModel",
    "check_remote_pair",
    "pull_custom_pair",
    "pull_model",
    "pull_pair",
]
