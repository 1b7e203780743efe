"""A recording reverse proxy in front of a real `localspec serve`, for the agent benchmarks: every request an agent
sends passes through it unchanged (streams too) and is written down: method, path, status, seconds until the
response ended, and the JSON body (so that what an agent really sends can be read afterwards). The server is
left as it is: nothing in localspec learns it is being watched.

    with RequestLog(server.url) as log: ...      agents talk to log.url; log.entries, log.table()
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from serve_process import free_port, httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

HOP = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


@dataclass
class Entry:
    method: str
    path: str
    status: int = 0
    seconds: float = 0.0
    body: Any = None  # the request's JSON body (None without one)
    answer: bytes = b""  # the response's body (a stream's events, whole)

    def line(self) -> str:
        return f"{self.method} {self.path} -> {self.status} ({self.seconds:.1f} s)"


@dataclass
class RequestLog:
    upstream: str  # the server's base URL (http://127.0.0.1:PORT)
    port: int = field(default_factory=free_port)
    entries: list[Entry] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RequestLog:
        app = Starlette(routes=[Route("/{path:path}", self.forward, methods=["GET", "POST", "DELETE", "HEAD"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    async def forward(self, request: Request) -> StreamingResponse:
        raw = await request.body()
        entry = Entry(request.method, request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        try:
            entry.body = json.loads(raw) if raw else None
        except ValueError:
            entry.body = raw.decode(errors="replace")
        self.entries.append(entry)
        start = time.monotonic()
        client = httpx.AsyncClient(timeout=httpx.Timeout(3600.0))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        upstream = client.build_request(request.method, self.upstream + entry.path, headers=headers, content=raw)
        answer = await client.send(upstream, stream=True)
        entry.status = answer.status_code

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.aiter_raw():
                    entry.answer += chunk
                    yield chunk
            except asyncio.CancelledError:  # the agent went away mid-stream
                raise
            finally:
                entry.seconds = time.monotonic() - start
                await answer.aclose()
                await client.aclose()

        out = {k: v for k, v in answer.headers.items() if k.lower() not in HOP | {"content-encoding"}}
        return StreamingResponse(body(), status_code=answer.status_code, headers=out)

    def table(self) -> str:
        return "\n".join(e.line() for e in self.entries)

    def dump(self, folder: Path) -> None:
        """Each request's body and the answer as sent, numbered in order."""
        folder.mkdir(parents=True, exist_ok=True)
        for i, entry in enumerate(self.entries):
            (folder / f"{i:02d}-request.json").write_text(json.dumps(entry.body, indent=1))
            (folder / f"{i:02d}-answer.txt").write_bytes(entry.answer)
