"""A scripted coding-agent session through a real `localspec serve`, one server per draft method.

A small fake project is written to a temporary directory; the assistant gets three tools (list_files,
read_file, write_file) and a fixed script of user turns. Each turn forces a fixed number of tool calls
(tool_choice "required": the server holds the call to its grammar) and runs every call for real on the
project (file contents go back as `tool` messages); the session ends with a short free answer (tool_choice
"auto": the tools stay in the prompt, so the server reuses its cached prefix; "none" would drop them).
Two turns rewrite a file whole through write_file: text copied from a file read earlier, where lookup drafts
pay. Greedy decoding, so every method should hold the same conversation (the table says whether it did;
near ties in the target's logits can part them). Per method: generated tokens, wall time of the requests,
tokens/s over that wall time, decode tokens/s and acceptance from the responses' `timings`, the grammar's
time per generated token, and the ratios to `none`.

    python benchmarks/agent_session.py --target T.gguf [--draft D.gguf] [--methods none,suffix,auto]
        [--threads 2] [--max-tokens 200] [--llama-server PATH]

Each server runs with --no-suffix-memory: the on-disk memory would hand a later method the answers an earlier
one wrote. --llama-server adds llama.cpp's server as peers: plain, and n-gram drafting (--spec-type ngram-mod;
llama-server is not built by benchmarks/build_llama_tools.sh unless WITH_SERVER=1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from serve_process import ServeProcess, free_port  # noqa: E402

PROJECT: dict[str, str] = {
    "README.md": "# stockroom\n\nTracks what is on the shelves. `python -m pytest tests` runs the tests.\n",
    "stockroom/stock.py": """class Stock:
    def __init__(self):
        self.counts = {}

    def add(self, name, n):
        self.counts[name] = self.counts.get(name, 0) + n

    def take(self, name, n):
        self.counts[name] = self.counts.get(name, 0) - n
""",
    "stockroom/report.py": """def report(stock):
    lines = []
    for name in sorted(stock.counts):
        count = stock.counts[name]
        lines.append(f"{name}: {count}")
    return "\\n".join(lines)


def total(stock):
    return sum(stock.counts.values())
""",
    "tests/test_report.py": """from stockroom.report import report
from stockroom.stock import Stock


def test_report_skips_empty_shelves():
    s = Stock()
    s.add("bolts", 3)
    s.add("nuts", 2)
    s.take("nuts", 2)
    assert report(s) == "bolts: 3"
""",
}

SYSTEM = (
    "You are a coding agent working in a small Python project. Use the tools to look at files and to change "
    "them; write_file replaces a file's whole content. Keep answers short."
)


@dataclass(frozen=True)
class Turn:
    """One user message and the tool calls it forces (tool_choice "required")."""

    user: str
    calls: int


SCRIPT: tuple[Turn, ...] = (
    Turn("The test in tests/test_report.py fails. First list the project's files.", 1),
    Turn("Read stockroom/report.py and tests/test_report.py.", 2),
    Turn("Fix report() so that it skips names whose count is zero: write the whole new stockroom/report.py.", 1),
    Turn("Add a one-line docstring to both functions in stockroom/report.py and write the whole file again.", 1),
)
CLOSING = "Summarize what you changed in one or two sentences."


def tool_schemas() -> list[dict[str, Any]]:
    def fn(name: str, description: str, params: dict[str, Any]) -> dict[str, Any]:
        schema = {"type": "object", "properties": params, "required": list(params)}
        return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}

    text = {"type": "string"}
    return [
        fn("list_files", "List the files under a directory of the project ('.' for all).", {"directory": text}),
        fn("read_file", "Return a file's content.", {"path": text}),
        fn("write_file", "Replace a file's whole content.", {"path": text, "content": text}),
    ]


class Project:
    """The fake project on disk and the tools that act on it (paths confined to its root)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for rel, content in PROJECT.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(content, encoding="utf-8")

    def call(self, name: str, arguments: str) -> str:
        try:
            args = json.loads(arguments)
            tools: dict[str, Callable[..., str]] = {
                "list_files": self.list_files, "read_file": self.read_file, "write_file": self.write_file,
            }  # fmt: skip
            return tools[name](**args)
        except (ValueError, TypeError, KeyError, OSError) as e:
            return f"error: {type(e).__name__}: {e}"

    def _path(self, rel: str) -> Path:
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError(f"{rel} is outside the project")
        return path

    def list_files(self, directory: str = ".") -> str:
        base = self._path(directory)
        return "\n".join(sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file()))

    def read_file(self, path: str) -> str:
        return self._path(path).read_text(encoding="utf-8")

    def write_file(self, path: str, content: str) -> str:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content.encode())} bytes to {path}"


@dataclass
class Tally:
    """One method's session: what the requests generated and how long they took."""

    label: str
    tokens: int = 0
    wall_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    grammar_s: float = 0.0
    requests: int = 0
    transcript: list[str] = field(default_factory=list)  # every call and answer, to compare methods

    def add(self, usage_tokens: int, wall: float, timings: dict[str, Any]) -> None:
        self.requests += 1
        self.tokens += usage_tokens
        self.wall_s += wall
        n = int(timings.get("predicted_n", usage_tokens))
        self.decode_tokens += max(n - 1, 0)
        self.decode_s += float(timings.get("predicted_ms", 0.0)) / 1000
        self.drafted += int(timings.get("draft_n", 0) or 0)
        self.accepted += int(timings.get("draft_n_accepted", 0) or 0)
        self.grammar_s += float(timings.get("grammar_ms", 0.0) or 0.0) / 1000


def run_session(client: Any, model: str, max_tokens: int, label: str, progress: Callable[[str], None]) -> Tally:
    """The whole script against one server; the project is written afresh so every method starts alike."""
    tally = Tally(label)
    with tempfile.TemporaryDirectory(prefix="agent-session-") as tmp:
        project = Project(Path(tmp))
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        for ti, turn in enumerate(SCRIPT):
            messages.append({"role": "user", "content": turn.user})
            for _ in range(turn.calls):
                msg = _request(client, model, messages, max_tokens, "required", tally)
                calls = [c for c in msg.tool_calls or [] if _complete(c.function.arguments)]  # max_tokens may cut one
                reply: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
                if calls:
                    reply["tool_calls"] = [c.model_dump(exclude_none=True) for c in calls]
                else:
                    tally.transcript.append(f"no call: {msg.content!r}")
                messages.append(reply)
                for c in calls:
                    result = project.call(c.function.name, c.function.arguments)
                    tally.transcript.append(f"{c.function.name}({c.function.arguments})")
                    messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
            progress(f"{label}: turn {ti + 1}/{len(SCRIPT)}, {tally.tokens} tokens in {tally.wall_s:.0f} s")
        messages.append({"role": "user", "content": CLOSING})
        msg = _request(client, model, messages, max(max_tokens // 2, 16), "auto", tally)
        tally.transcript.append(f"{msg.content!r} {[c.function.name for c in msg.tool_calls or []]}")
    return tally


def _complete(arguments: str) -> bool:
    """Whether a call's arguments are a whole JSON object (max_tokens can end the answer inside one)."""
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def _request(
    client: Any, model: str, messages: list[dict[str, Any]], max_tokens: int, choice: str, tally: Tally
) -> Any:
    t0 = time.perf_counter()
    resp = client.chat.completions.create(model=model, messages=messages, tools=tool_schemas(), tool_choice=choice,
                                          max_tokens=max_tokens, temperature=0, seed=0)  # fmt: skip
    wall = time.perf_counter() - t0
    tally.add(resp.usage.completion_tokens, wall, (resp.model_extra or {}).get("timings") or {})
    return resp.choices[0].message


class LlamaServer(ServeProcess):
    """llama.cpp's llama-server with `argv` on a free port, ready once /health answers (also parallel_serve.py's)."""

    name = "llama-server"

    def __init__(self, binary: str, argv: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = None
        self._log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [binary, *argv, "--port", str(self.port)], stdout=self._log, stderr=subprocess.STDOUT
        )
        self._wait_ready(300)


@dataclass(frozen=True)
class Peer:
    label: str
    start: Callable[[], Any]  # a server with .client() and .close()


def peers(args: argparse.Namespace) -> list[Peer]:
    common = ["--target", args.target, "--n-ctx", str(args.n_ctx), "--threads", str(args.threads),
              "--model-name", "agent", "--no-suffix-memory"]  # fmt: skip
    out = []
    for method in args.methods.split(","):
        extra = ["--draft", args.draft] if method == "model" or (method == "auto" and args.draft) else []
        out.append(Peer(method, lambda m=method, e=extra: ServeProcess(*common, "--draft-method", m, *e)))
    if args.llama_server:
        spec = {"llama plain": [], "llama ngram-mod": ["--spec-type", "ngram-mod", "--spec-draft-n-max", "16"]}
        for label, flags in spec.items():
            argv = [
                "-m",
                args.target,
                "-t",
                str(args.threads),
                "-tb",
                str(args.threads),
                "-c",
                str(args.n_ctx),
                "--jinja",
                "-np",
                "1",
                *flags,
            ]  # fmt: skip (OpenAI routes, tools through --jinja)
            out.append(Peer(label, lambda a=argv: LlamaServer(args.llama_server, a)))
    return out


def table(tallies: list[Tally]) -> list[str]:
    base = {t.label: t for t in tallies}
    plain = base.get("none")
    llama_plain = base.get("llama plain")
    head = (f"{'method':<16}{'tokens':>7}{'wall s':>8}{'tok/s':>7}{'decode tok/s':>13}{'accept':>8}"
            f"{'grammar/tok':>12}{'vs none':>9}{'same talk':>10}")  # fmt: skip
    lines = [head]
    for t in tallies:
        ref = llama_plain if t.label.startswith("llama") else plain
        tps = t.tokens / t.wall_s if t.wall_s else 0.0
        ratio = (tps / (ref.tokens / ref.wall_s)) if ref and ref.wall_s and ref.tokens else float("nan")
        acc = f"{t.accepted / t.drafted:.0%}" if t.drafted else "-"
        gram = f"{1e3 * t.grammar_s / t.tokens:.2f}ms" if t.grammar_s and t.tokens else "-"
        same = "-" if ref is None or ref is t else ("yes" if t.transcript == ref.transcript else "no")
        dec = t.decode_tokens / t.decode_s if t.decode_s else 0.0
        lines.append(f"{t.label:<16}{t.tokens:>7}{t.wall_s:>8.1f}{tps:>7.2f}{dec:>13.2f}{acc:>8}{gram:>12}"
                     f"{ratio:>8.2f}x{same:>10}")  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", help="a draft model: adds it to auto and enables the `model` method")
    ap.add_argument(
        "--methods", default="none,suffix,auto", help="localspec --draft-method values (default: %(default)s)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=200, help="per forced tool call; the closing answer gets half")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary: adds it plain and with n-gram drafts")
    ap.add_argument("--json-out", help="also write the tallies as JSON here")
    args = ap.parse_args()
    progress = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    tallies: list[Tally] = []
    t0 = time.perf_counter()
    for peer in peers(args):
        progress(f"starting {peer.label}")
        server = peer.start()
        try:
            tallies.append(run_session(server.client(timeout=900), "agent", args.max_tokens, peer.label, progress))
        finally:
            server.close()
    print(f"agent session: {len(SCRIPT) + 1} user turns, {sum(t.calls for t in SCRIPT)} forced tool calls, greedy, "
          f"max {args.max_tokens} tokens per call, {args.threads} threads, {os.path.basename(args.target)}; "
          f"{time.perf_counter() - t0:.0f} s in all")  # fmt: skip
    print("\n".join(table(tallies)))
    print("tok/s: generated tokens over the requests' wall time (prompt passes included); decode tok/s, accept and "
          "grammar/tok from the servers' timings; vs none: tok/s ratio (llama rows: vs llama plain); same talk: the "
          "same calls and answers as that baseline")  # fmt: skip
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([t.__dict__ for t in tallies], indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
