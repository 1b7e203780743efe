"""A real `localspec serve` process on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import httpx
except ImportError:  # newer openai releases ship the same client as httpx2
    import httpx2 as httpx  # type: ignore[no-redef]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """`python -m localspec.cli serve ARGS --port P`, its stderr in a file; ready once /health answers."""

    name = "localspec serve"  # in its errors (benchmarks/agent_session.py's LlamaServer starts llama-server)

    def __init__(self, *args: str, api_key: str | None = None, ready_timeout: float = 300.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self._log = tempfile.NamedTemporaryFile("w+", prefix="localspec-serve-", suffix=".log", delete=False)
        argv = [sys.executable, "-m", "localspec.cli", "serve", *args, "--port", str(self.port)]
        if api_key:
            argv += ["--api-key", api_key]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"{self.name} did not answer within {timeout} s:\n{self.log()}")

    def client(self, **kw):  # type: ignore[no-untyped-def]
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0, **kw)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
