"""One place that turns huggingface_hub, HTTP and OS errors into a message and a hint."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from localspec.catalog import ModelRef
from localspec.errors import LocalspecError, PullError
from localspec.formatting import format_bytes

if TYPE_CHECKING:
    from localspec.hub.client import Hub


@contextmanager
def hub_errors(hub: Hub, ref: ModelRef, file: str | None = None, *, size: int | None = None) -> Iterator[None]:
    try:
        yield
    except LocalspecError:
        raise
    except Exception as e:
        raise map_error(e, hub, ref, file, size=size) from e


def map_error(e: BaseException, hub: Hub, ref: ModelRef, file: str | None, *, size: int | None = None) -> PullError:
    """One place that turns huggingface_hub / HTTP / OS errors into a message and a hint."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{ref.repo}/{file}" if file else ref.repo
    endpoint = hub.endpoint
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, GatedRepoError):  # a RepositoryNotFoundError too: check it first
        return PullError(
            f"{ref.repo} is a gated repository: its files need an accepted license and a token",
            f"open {endpoint}/{ref.repo}, accept the terms, then set HF_TOKEN to a read token of that account "
            "(or run `hf auth login`)",
        )
    if isinstance(e, RevisionNotFoundError):
        return PullError(
            f"revision {ref.revision!r} not found in {ref.repo}",
            "use a branch, tag or commit that exists (default: main)",
        )
    if isinstance(e, RepositoryNotFoundError):
        return PullError(
            f"repository {ref.repo} not found on {endpoint} (or it is private)",
            "check the id (owner/name; case matters); for a private repo set HF_TOKEN to a token that can read it",
        )
    if isinstance(e, EntryNotFoundError) and not isinstance(e, LocalEntryNotFoundError):
        return PullError(f"file {file} not found in {ref.repo} (revision {ref.revision})", "check the file name")
    if isinstance(e, OfflineModeIsEnabled):
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
    # Transport errors come from huggingface_hub's HTTP client, whose package changes between releases
    # (httpx, httpx2): match them by class name, which every release shares.
    names = {c.__name__ for c in type(e).__mro__}
    if names & {"ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout", "TimeoutException"}:
        from localspec.hub.timeouts import TIMEOUT_ENV, hub_timeout

        return PullError(
            f"{endpoint} did not answer within {hub_timeout():g} s while fetching {what} ({type(e).__name__})",
            f"check your network, proxy or HF_ENDPOINT, then run again (finished files are kept); "
            f"{TIMEOUT_ENV}=SECONDS waits longer",
        )
    if names & {"RemoteProtocolError", "ReadError", "ReadTimeout", "ChunkedEncodingError", "IncompleteRead"} or (
        isinstance(e, OSError) and "Consistency check failed" in str(e)
    ):
        return PullError(
            f"the download of {what} was interrupted ({type(e).__name__})",
            "run the same command again: finished files are kept and not downloaded twice",
        )
    unreachable = {
        "ConnectError",
        "ConnectTimeout",
        "TimeoutException",
        "NetworkError",
        "ProxyError",
        "ConnectionError",
    }
    if names & unreachable or isinstance(e, LocalEntryNotFoundError):
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
