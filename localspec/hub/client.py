"""The pull itself: plan the files, check the pair, download into the Hugging Face cache, or serve offline."""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localspec.backends.registry import backend_spec
from localspec.catalog import (
    ModelRef,
    cached_model_path,
    hub_cache_dir,
    split_gguf_parts,
)
from localspec.errors import BackendUnavailableError, IncompatiblePairError, PullError
from localspec.families import registry
from localspec.formatting import format_bytes
from localspec.hub.errors import hub_errors, map_error
from localspec.hub.files import (
    FILE_BACKEND,
    REPO_BACKEND,
    FilePlan,
    ModelPlan,
    pinned,
    select_files,
    sidecars,
)
from localspec.hub.progress import Tracker
from localspec.hub.timeouts import hub_timeout, install_timeouts
from localspec.hub.types import (
    CompatReport,
    LogFn,
    ProgressEvent,
    ProgressFn,
    PullCancelled,
    PulledModel,
    PullResult,
)
from localspec.vocab import VocabInfo, check_compatible

_DISK_MARGIN = 64 << 20
# huggingface_hub downloads a blob to `<etag>.<8 hex>.incomplete` (older releases: `<etag>.incomplete`)
# and renames it once complete.
_PARTIAL_RE = re.compile(r"^(?P<etag>[^.]+)(?:\.[0-9a-f]{8})?\.incomplete$")


class Hub:
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
        install_timeouts(hub_timeout())

    @property
    def api(self) -> Any:
        if self._api is None:
            from huggingface_hub import HfApi

            self._api = HfApi(endpoint=self.endpoint, token=self.token)
        return self._api

    # -- the whole pull ----------------------------------------------------------------------

    def pull(self, refs: list[tuple[str, ModelRef]], backend: str | None, *, check: bool) -> PullResult:
        if backend is not None and backend not in (FILE_BACKEND, REPO_BACKEND):
            raise PullError(f"unknown backend {backend!r}", f"choose {FILE_BACKEND} or {REPO_BACKEND}")
        if offline():
            return self._from_cache_offline(refs, backend)
        return self.pull_planned([self.plan(ref, role, backend) for role, ref in refs], check=check)

    def pull_planned(self, plans: list[ModelPlan], *, check: bool) -> PullResult:
        """Check (a pair), then download what the plans list and the cache lacks."""
        header_bytes, checked = 0, False
        if check and len(plans) == 2 and all(p.backend == FILE_BACKEND for p in plans):
            t, d = plans
            self.log("checking that the draft's vocabulary matches the target's (GGUF headers only)")
            report = self.check_pair(pinned(t), pinned(d), t.files[0].cached_path, d.files[0].cached_path)
            header_bytes, checked = report.bytes_read, True
            where = f"read {format_bytes(report.bytes_read)} of headers" if report.bytes_read else "local headers"
            self.log(f"vocabularies match ({report.target_vocab:,} / {report.draft_vocab:,} tokens; {where})")
        for p in plans:
            self._drop_partials(p.ref.repo)
        self._check_disk(plans)
        if check and len(plans) == 2 and all(p.backend == REPO_BACKEND for p in plans):
            self.log("checking that the draft's tokenizer matches the target's (tokenizer files first)")
            checked = self._check_mlx_pair(*plans)
        models = tuple(self._download(p) for p in plans)
        return PullResult(models, plans[0].backend, header_bytes, checked)

    # -- planning: what to download ----------------------------------------------------------

    def plan(self, ref: ModelRef, role: str, backend: str | None) -> ModelPlan:
        self.log(
            f"asking {self.endpoint} for the files of {ref.repo} (waiting up to {hub_timeout():g} s for an answer)"
        )
        with hub_errors(self, ref):
            info = self.api.model_info(ref.repo, revision=ref.revision)
            commit = info.sha
            entries = list(self.api.list_repo_tree(ref.repo, revision=commit or ref.revision, recursive=True))
        sizes: dict[str, int | None] = {
            e.path: getattr(e, "size", None) for e in entries if type(e).__name__ == "RepoFile"
        }
        backend, files = select_files(ref, backend, sizes)
        plan = ModelPlan(role, ref, backend, commit)
        if backend == FILE_BACKEND:  # the drafter files llama.cpp's -hf would fetch with this model
            plan.sidecars = sidecars(list(sizes), files[0])
            files = files + [p for p in plan.sidecars.values() if p not in files]
        for f in files:
            plan.files.append(FilePlan(f, sizes.get(f), self._cached(ref.repo, f, commit)))
        return plan

    def _cached(self, repo: str, file: str, commit: str | None) -> str | None:
        if not commit:
            return None
        from huggingface_hub import try_to_load_from_cache

        p = try_to_load_from_cache(repo, file, cache_dir=self.cache_dir, revision=commit)
        return p if isinstance(p, str) else None

    def _drop_partials(self, repo: str) -> None:
        dropped = drop_stale_partials(self.cache_dir, repo)
        if dropped:
            freed = format_bytes(sum(size for _, size in dropped))
            self.log(f"removed {len(dropped)} unfinished download(s) of {repo} left by an interrupted pull ({freed})")

    def _check_disk(self, plans: list[ModelPlan]) -> None:
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

    def _download(self, plan: ModelPlan, only: Callable[[str], bool] | None = None) -> PulledModel:
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
            tracker = Tracker(f.path, plan.ref.repo, plan.role, f.size, self.progress, self.cancel)
            with hub_errors(self, plan.ref, f.path, size=plan.bytes_to_download):
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
            {family: plan.local[p] for family, p in plan.sidecars.items() if p in plan.local},
        )

    def _model_path(self, plan: ModelPlan) -> str:
        if plan.backend == REPO_BACKEND:
            from huggingface_hub.file_download import repo_folder_name

            folder = repo_folder_name(repo_id=plan.ref.repo, repo_type="model")
            return str(Path(self.cache_dir) / folder / "snapshots" / (plan.commit or ""))
        return plan.local.get(plan.files[0].path, "")

    def _check_mlx_pair(self, target: ModelPlan, draft: ModelPlan) -> bool:
        """Fetch both repos' small files first and compare tokenizers before any weights move.

        Needs mlx-lm (its tokenizer loader); without it the check is skipped and False returned.
        """
        small = lambda path: not path.endswith(".safetensors")
        for plan in (target, draft):
            self._download(plan, only=small)
        head = registry.head_for_draft(self._model_path(draft))
        if head is not None:
            return self._check_head(head, target, draft)
        try:
            module = backend_spec(target.backend).module()
            tv, dv = module.peek_vocab(self._model_path(target)), module.peek_vocab(self._model_path(draft))
            check_compatible(tv, dv, target_name=str(target.ref), draft_name=str(draft.ref))
        except BackendUnavailableError:
            self.log(f"{target.backend} is not installed here: skipping the tokenizer check of the pair")
            return False
        except IncompatiblePairError:
            raise
        except Exception as e:  # a tokenizer mlx-lm cannot read: the loader will say more; do not block
            self.log(f"could not compare the tokenizers ({type(e).__name__}: {e}); skipping the check")
            return False
        self.log(f"tokenizers match ({tv.n_vocab:,} / {dv.n_vocab:,} tokens)")
        return True

    def _check_head(self, family: str, target: ModelPlan, draft: ModelPlan) -> bool:
        """A drafter head has no tokenizer of its own: check instead that it fits the target (its family's
        check on both configs and the target's tokenizer), before any weights move."""
        t, d = self._model_path(target), self._model_path(draft)
        try:
            backend_spec(target.backend).module()
        except BackendUnavailableError:
            self.log(f"{target.backend} is not installed here: skipping the check of the {family} head")
            return False
        why = registry.fit(family, t, d, target.backend)
        if why:
            raise IncompatiblePairError(
                f"{draft.ref} is a {family} drafter that does not fit {target.ref}: {why}",
                "pick the head made for this target (its model card names it)",
            )
        self.log(f"the draft is a {family} head made for this target (configs checked)")
        return True

    def _write_ref(self, ref: ModelRef, commit: str) -> None:
        """Record revision -> commit (the cache's refs/ file) so later offline lookups of `main` work.

        Files are fetched by commit (consistent with the listing, and a second pull then costs no
        request per file); huggingface_hub writes refs only for the revision it was called with.
        """
        from huggingface_hub.file_download import (
            _cache_commit_hash_for_specific_revision,
            repo_folder_name,
        )

        folder = Path(self.cache_dir) / repo_folder_name(repo_id=ref.repo, repo_type="model")
        try:
            _cache_commit_hash_for_specific_revision(str(folder), ref.revision, commit)
        except OSError as e:
            raise map_error(e, self, ref, None) from e

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
            b = backend or (FILE_BACKEND if ref.file and ref.file.endswith(".gguf") else REPO_BACKEND)
            path = cached_model_path(ref, b, cache_dir=self.cache_dir) if (b == REPO_BACKEND or ref.file) else None
            if path is None:
                raise PullError(
                    f"HF_HUB_OFFLINE is set and {ref} is not in the cache ({self.cache_dir})",
                    "unset HF_HUB_OFFLINE (or set it to 0) to download it",
                )
            files = tuple(split_gguf_parts(ref.file)) if b == FILE_BACKEND and ref.file else ()
            size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) if b == REPO_BACKEND else 0
            if b == FILE_BACKEND:
                size = sum(os.path.getsize(os.path.join(os.path.dirname(path), os.path.basename(p))) for p in files)
            for f in files or (ref.repo,):
                self._emit(ProgressEvent(f, ref.repo, role, size, size, None, None, True, True))
            models.append(PulledModel(role, ref.repo, ref.revision, None, files, path, 0, size))
        kind = backend or (FILE_BACKEND if refs[0][1].file else REPO_BACKEND)
        return PullResult(tuple(models), kind)

    # -- headers -----------------------------------------------------------------------------

    def check_pair(
        self, target: ModelRef, draft: ModelRef, target_local: str | None = None, draft_local: str | None = None
    ) -> CompatReport:
        """llama.cpp's vocabulary rule from the two GGUF headers (local files, else HTTP Range reads)."""
        from localspec.hub.headers import gguf_header

        t_hdr, t_read, t_size = gguf_header(self, target, target_local)
        d_hdr, d_read, d_size = gguf_header(self, draft, draft_local)
        tv, dv = VocabInfo.from_gguf_metadata(t_hdr.metadata), VocabInfo.from_gguf_metadata(d_hdr.metadata)
        check_compatible(tv, dv, target_name=str(target), draft_name=str(draft))
        return CompatReport(target, draft, t_read + d_read, (t_size, d_size), tv.n_vocab, dv.n_vocab)


def drop_stale_partials(cache_dir: str, repo: str) -> list[tuple[Path, int]]:
    """Delete the partial blobs of `repo` that no running download owns; return (path, size) of each.

    A pull killed hard (SIGKILL, power loss) leaves its temporary blob behind. huggingface_hub never
    renames it into place and the next download writes a fresh one, so the leftover is dead weight that
    counts against the disk check: remove it. A partial whose file lock is held belongs to a download in
    progress (another process, or another pull in this one) and is left alone.
    """
    from filelock import FileLock, Timeout
    from huggingface_hub.file_download import repo_folder_name

    folder = repo_folder_name(repo_id=repo, repo_type="model")
    blobs = Path(cache_dir) / folder / "blobs"
    try:
        names = sorted(os.listdir(blobs))
    except OSError:
        return []
    dropped = []
    for name in names:
        m = _PARTIAL_RE.match(name)
        if m is None:
            continue
        lock_path = Path(cache_dir) / ".locks" / folder / f"{m['etag']}.lock"  # huggingface_hub's own lock
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(lock_path), timeout=0, mode=0o664):
                path = blobs / name
                size = path.stat().st_size
                path.unlink()
                dropped.append((path, size))
        except (Timeout, OSError, NotImplementedError):  # held (a live download), gone, or no flock here
            continue
    return dropped


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, re-read now: it reads the variable once, at import."""
    from huggingface_hub import constants, is_offline_mode

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return is_offline_mode() or value.strip().upper() in constants.ENV_VARS_TRUE_VALUES
