"""Codex CLI (`codex exec`, npm's @openai/codex) against a real `localspec serve` on the Qwen2.5-Coder 0.5B fixture,
through the Responses API (`wire_api = "responses"`, the only wire Codex speaks): Codex is asked to run a shell
command in a scratch folder and runs until it has executed a tool call through the server. Prints every request
Codex sent (path, status, seconds), the tools it offered, the commands it ran and its last message; exits 1 when
no command ran.

    npm install --prefix /tmp/codexcli @openai/codex
    python benchmarks/codex_exec.py [--codex /tmp/codexcli/node_modules/.bin/codex] [--dump DIR]

Codex's home (config.toml, sessions) is a temporary folder: the user's ~/.codex is never read nor written.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixture_models import fetch  # noqa: E402
from request_log import RequestLog  # noqa: E402
from serve_process import ServeProcess  # noqa: E402

PROMPT = "Run the shell command `ls` in the current folder and tell me how many files there are."
CONFIG = """model = "{model}"
model_provider = "localspec"
model_context_window = {n_ctx}
web_search = "disabled"
model_reasoning_summary = "none"

[model_providers.localspec]
name = "localspec"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "LOCALSPEC_API_KEY"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 3600000
"""


def write_home(home: Path, url: str, model: str, n_ctx: int) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(CONFIG.format(model=model, url=url, n_ctx=n_ctx))


def run_codex(codex: str, home: Path, work: Path, timeout: float) -> tuple[int | None, list[dict[str, Any]], str]:
    """`codex exec` with the prompt: its exit status (None: stopped at the timeout), its JSONL events and stderr."""
    env = {**os.environ, "CODEX_HOME": str(home), "HOME": str(home.parent), "LOCALSPEC_API_KEY": "local"}
    argv = [codex, "exec", "--skip-git-repo-check", "--json", "--ephemeral", "-s", "workspace-write",
            "-C", str(work), PROMPT]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:  # what it did until then is still reported
        proc.kill()
        out, err = proc.communicate()
        rc = None
    events = []
    for line in out.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return rc, events, err


def commands_run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for event in events:
        item = event.get("item") or {}
        if event.get("type") == "item.completed" and item.get("type") == "command_execution":
            out.append(item)
    return out


def offered_tools(log: RequestLog) -> list[str]:
    for entry in log.entries:
        if isinstance(entry.body, dict) and entry.body.get("tools"):
            return [f"{t.get('type')}:{t.get('name', '')}" for t in entry.body["tools"]]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codex", default="/tmp/codexcli/node_modules/.bin/codex")
    parser.add_argument("--model", default="qwen-0.5b")
    parser.add_argument("--n-ctx", type=int, default=16384)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for codex exec (a CPU is slow)")
    parser.add_argument("--dump", type=Path, help="write each request's body and answer here")
    args = parser.parse_args()
    target = str(fetch(args.model))
    server = ServeProcess("--target", target, "--draft-method", "ngram", "--n-ctx", str(args.n_ctx),
                          "--max-tokens", str(args.max_tokens), "--model-name", "m", "--temperature", "0",
                          ready_timeout=600)  # fmt: skip
    try:
        with RequestLog(server.url) as log, tempfile.TemporaryDirectory(prefix="codex-") as tmp:
            home, work = Path(tmp) / "home" / ".codex", Path(tmp) / "work"
            work.mkdir()
            for name in ("a.txt", "b.txt", "c.py"):
                (work / name).write_text(name + "\n")
            write_home(home, log.url, "m", args.n_ctx)
            start = time.monotonic()
            rc, events, stderr = run_codex(args.codex, home, work, args.timeout)
            print(f"codex exec exited {rc} after {time.monotonic() - start:.0f} s")
            if args.dump:
                dump(log, events, stderr, args.dump)
            report(log, events, stderr)
            return 0 if commands_run(events) else 1
    finally:
        server.close()


def report(log: RequestLog, events: list[dict[str, Any]], stderr: str) -> None:
    print("requests:\n" + log.table())
    print("tools offered:", ", ".join(offered_tools(log)))
    for item in commands_run(events):
        print(f"ran: {item.get('command')!r} -> exit {item.get('exit_code')}; output {item.get('aggregated_output')!r}")
    last = [e["item"].get("text") for e in events if e.get("type") == "item.completed"
            and (e.get("item") or {}).get("type") == "agent_message"]  # fmt: skip
    print("last message:", last[-1] if last else None)
    if not commands_run(events):
        print("no command ran; codex's stderr (tail):\n" + stderr[-3000:])


def dump(log: RequestLog, events: list[dict[str, Any]], stderr: str, folder: Path) -> None:
    log.dump(folder)
    (folder / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events))
    (folder / "stderr.txt").write_text(stderr)


if __name__ == "__main__":
    sys.exit(main())
