"""/api/pull as `localspec pull`: a catalog pair's name downloads the pair into the Hugging Face cache, with
Ollama's status lines (`pulling manifest`, one `pulling FILE` line per progress report with `digest`,
`total` and `completed`, then `success`). The served model's own name answers `success` at once (it is here
already: clients such as `codex --oss` pull a model /api/tags does not list under the exact name they use).

A pulled pair is not served until the server is started with it (`localspec serve --pair NAME`): the last
status before `success` says so. Any other name is a 404 in Ollama's shape (`{"error": ...}`) naming the
catalog's pairs, before anything streams; a failed download ends the stream with an `{"error": ...}` line
(as Ollama's does), or is a 502 when not streamed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from localspec.errors import CatalogError, LocalspecError
from localspec.server.errors import APIError
from localspec.server.ollama_requests import LATEST, matches
from localspec.server.requests import Served

PULL_HINT = "localspec pulls the pairs of its catalog (`localspec models` lists them), not Ollama's library"


@dataclass(frozen=True)
class PullPlan:
    """What /api/pull of a name does: nothing (`pair` None: the served model) or pull a catalog pair."""

    name: str
    pair: str | None
    backend: str = "auto"


def plan_pull(name: str, served: Served) -> PullPlan:
    """The pull a name asks for; a 404 for a name neither served nor in the catalog."""
    if not name:
        raise APIError(400, "model is required", "model")
    if matches(name, served):
        return PullPlan(name, None)
    from localspec.catalog import load_catalog

    try:
        catalog = load_catalog()
    except CatalogError as e:  # a user catalog that does not parse
        raise APIError(500, f"{e.message} ({e.hint})", None, "catalog_error") from None
    pair = catalog.pairs.get(name.removesuffix(LATEST))
    if pair is None:
        raise APIError(404, f"model '{name}' not found: it is neither the model this server serves nor a pair of "
                       f"localspec's catalog ({', '.join(catalog.names())}); {PULL_HINT}", "model",
                       "model_not_found")  # fmt: skip
    served_backend = served.pipeline.target.info.backend  # the files this server's backend runs, where it can
    return PullPlan(name, pair.name, served_backend if served_backend in pair.backends else "auto")


async def pull_lines(plan: PullPlan) -> AsyncIterator[dict[str, Any]]:
    """Ollama's status lines for the pull, the last `success` or `{"error": ...}`. Leaving the iteration early
    (the client went away) cancels the download."""
    yield {"status": "pulling manifest"}
    if plan.pair is None:
        yield {"status": "success"}
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    cancel = threading.Event()

    def put(item: dict[str, Any] | None) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    worker = threading.Thread(target=run_pull, args=(plan, put, cancel), name="localspec-ollama-pull", daemon=True)
    worker.start()
    try:
        while (item := await queue.get()) is not None:
            yield item
    finally:
        cancel.set()  # (a no-op once the pull has finished)


def run_pull(plan: PullPlan, put: Any, cancel: threading.Event) -> None:
    """The pull itself, on its own thread: progress and the end go to `put` as status lines, then None."""
    from localspec.hub import ProgressEvent, pull_pair

    def progress(ev: ProgressEvent) -> None:
        total = ev.bytes_total or ev.bytes_done
        put({"status": f"pulling {ev.file}", "digest": f"{ev.repo}/{ev.file}", "total": total,
             "completed": total if ev.cached else ev.bytes_done})  # fmt: skip

    try:
        assert plan.pair is not None
        result = pull_pair(plan.pair, plan.backend, progress=progress, cancel=cancel)
        put({"status": f"pulled {plan.pair} ({result.backend}); this server still serves its model: serve the pair "
             f"with `localspec serve --pair {plan.pair}`"})  # fmt: skip
        put({"status": "success"})
    except LocalspecError as e:
        put({"error": e.message + (f" ({e.hint})" if e.hint else "")})
    except Exception as e:  # noqa: BLE001 - a failed download must end the stream with its reason, never hang it
        put({"error": f"the pull failed: {type(e).__name__}: {e}"})
    finally:
        put(None)


async def pull_result(plan: PullPlan) -> dict[str, Any]:
    """The pull, not streamed: `{"status": "success"}`, or the error as a 502 (the Hub failed, not the request)."""
    last: dict[str, Any] = {}
    async for line in pull_lines(plan):
        last = line
    if "error" in last:
        raise APIError(502, str(last["error"]), "model", "pull_failed")
    return {"status": "success"}
