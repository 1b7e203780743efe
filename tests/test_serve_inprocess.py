"""`localspec serve`'s app run in this process (build_server, uvicorn on a thread, real HTTP, real
llama.cpp on the tiny GGUFs), for what a test must reach inside the server: a drafter family registered
here, and the target's forward pass held until the server aborts it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from serve_process import free_port, httpx

from localspec.decoding.drafters import Drafter
from localspec.errors import LocalspecError, ModelFileError, UsageError
from localspec.families import registry
from localspec.families.base import BuildContext, DrafterFamily
from localspec.pipeline import Pipeline

if TYPE_CHECKING:
    from localspec.backends.base import Backend

TinyGGUFs = tuple[Path, Path, Path]  # conftest's tiny_ggufs: target, similar draft, unrelated model
HELLO = [{"role": "user", "content": "Hi"}]
HOLD_S = 30.0  # how long a held forward waits for an abort before going on by itself (a test that fails)


@dataclass(frozen=True)
class InProcess:
    url: str
    pipeline: Pipeline
    name: str

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=60)

    def queue(self) -> int:
        """Requests generating or waiting (/health's `queue`)."""
        return int(httpx.get(f"{self.url}/health", timeout=5).json()["queue"])


@contextmanager
def served(*argv: str) -> Iterator[InProcess]:
    """`localspec serve ARGV` in this process, on a free loopback port, until the block ends."""
    from localspec.cli import build_parser
    from localspec.commands.first_use import model_options_from_args
    from localspec.commands.serve import build_server

    args = build_parser().parse_args(["serve", *argv])
    app, pipeline, name = build_server(args, model_options_from_args(args))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield InProcess(f"http://127.0.0.1:{port}", pipeline, name)
    finally:
        server.should_exit = True
        thread.join(30)
        pipeline.close()


def _wait_idle(s: InProcess, within: float) -> float:
    """Seconds until the server has nothing generating or waiting; fails after `within`."""
    t0 = time.monotonic()
    while s.queue():
        assert time.monotonic() - t0 < within, f"still generating {within} s after the client went away"
        time.sleep(0.01)
    return time.monotonic() - t0


# -- a per-request drafter that cannot be built ---------------------------------------------------------


def _failing_family(error: LocalspecError) -> DrafterFamily:
    """A family that passes every check from the headers and fails when built, as a head file that turns
    out unloadable does: only building finds out."""

    def build(ctx: BuildContext) -> Drafter:
        raise error

    return DrafterFamily(name="unbuildable", summary="fails when built (a test family)", build=build)


@pytest.mark.parametrize(
    "error",
    [ModelFileError("unbuildable.gguf is truncated", "download it again"), UsageError("no head for it", "pass one")],
    ids=["ModelFileError", "UsageError"],
)
def test_a_per_request_drafter_that_fails_to_build_is_a_400(error: LocalspecError, tiny_ggufs: TinyGGUFs) -> None:
    fam = _failing_family(error)
    registry.register(fam)
    try:
        with served("--target", str(tiny_ggufs[0]), "--draft-method", "none", "--n-ctx", "256", "--threads", "1") as s:
            body = {"messages": HELLO, "max_tokens": 4, "speculative": {"method": fam.name}}
            for _ in range(2):  # the failure is not remembered as a drafter: the second request is refused alike
                r = s.post("/v1/chat/completions", body)
                assert r.status_code == 400, r.text
                err = r.json()["error"]
                assert err["type"] == "invalid_request_error" and err["param"] == "speculative.method", err
                assert error.message in err["message"] and "cannot draft on this server" in err["message"]
            streamed = s.post("/v1/chat/completions", {**body, "stream": True})
            assert '"param":"speculative.method"' in streamed.text  # a stream ends with the same error
            ok = s.post("/v1/chat/completions", {**body, "speculative": {"method": "ngram"}})
            assert ok.status_code == 200, ok.text  # still serving
    finally:
        registry.unregister(fam.name)


# -- a disconnect aborts the forward pass in flight ---------------------------------------------------------


class ForwardGate:
    """Holds the target's `hold_call`-th forward until the server aborts the target: abort(True) releases
    it, and the real forward then raises Interrupted, as a pass in flight does. Without an abort it goes
    on by itself after HOLD_S (or open())."""

    def __init__(self, target: Backend, *, hold_call: int) -> None:
        self.target = target
        self.hold_call = hold_call
        self.calls = 0
        self.entered = threading.Event()  # the engine is inside the held forward
        self.released = threading.Event()
        self.aborted = threading.Event()
        self._forward = target.forward
        self._abort = target.abort
        target.forward = self.forward  # type: ignore[method-assign]
        target.abort = self.abort  # type: ignore[method-assign]

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> np.ndarray:
        self.calls += 1
        if self.calls == self.hold_call:
            self.entered.set()
            self.released.wait(HOLD_S)
        return self._forward(tokens, all_logits=all_logits)

    def abort(self, on: bool = True) -> None:
        self._abort(on)
        if on:
            self.aborted.set()
            self.released.set()

    def open(self) -> None:
        self.released.set()


def test_a_client_that_disconnects_aborts_the_forward_in_flight(tiny_ggufs: TinyGGUFs) -> None:
    """Setting the job's stop event only ends the engine after the round in flight; a forward that takes
    long (a big model, a long prompt) must be aborted, so the server is free within a second."""
    with served("--target", str(tiny_ggufs[0]), "--draft-method", "none", "--n-ctx", "2048", "--threads", "1") as s:
        gate = ForwardGate(s.pipeline.target, hold_call=4)  # the prompt pass, two tokens, then held
        try:
            body = {"prompt": "Count: 1 2 3", "max_tokens": 1500, "stream": True, "temperature": 0.7, "seed": 1}
            with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=30) as r:
                lines = r.iter_lines()
                assert '"text"' in next(line for line in lines if '"text"' in line)  # it streams
                assert gate.entered.wait(10), "the generation never reached the held forward"
            # The client has gone, the engine still inside the forward.
            assert _wait_idle(s, within=1.0) < 1.0
            assert gate.aborted.is_set()
            ok = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 3, "temperature": 0})
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1, ok.text  # re-armed
        finally:
            gate.open()
