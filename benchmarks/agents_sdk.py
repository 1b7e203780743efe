"""The OpenAI Agents SDK (`openai-agents`) against a real `localspec serve` on a Qwen2.5-Coder fixture (1.5B by
default), with its default model, OpenAIResponsesModel (POST /v1/responses): an Agent with one @function_tool
runs until the tool has been called and a final answer comes back. Prints every request the SDK sent (path,
status, seconds, through benchmarks/request_log.py), the tool's calls and the final answer; exits 1 when the
tool was never called or no answer came.

    pip install openai-agents
    python benchmarks/agents_sdk.py [--model qwen-1.5b|qwen-0.5b] [--tool-choice required|auto] [--dump DIR]

The first turn's tool_choice is `required` by default (the grammar makes the call; the SDK drops it to the
default after the call). Seen on this CPU: 1.5B with `auto` wrote its call as text ({{"name": ...}}), no call;
0.5B with `auto` calls, then answers with its call again as text.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled  # noqa: E402
from fixture_models import fetch  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from request_log import RequestLog  # noqa: E402
from serve_process import ServeProcess  # noqa: E402

CALLS: list[str] = []
PROMPT = "How many copies of 'Dune' does the shop have?"


def not_called_yet(context: Any, agent: Any) -> bool:
    """The tool is offered until it has answered once: Qwen2.5-Coder 0.5B, offered it again after its answer,
    calls it again and again (turn after turn, to max_turns) instead of replying; 1.5B wrote its call as text."""
    return not CALLS


@function_tool(is_enabled=not_called_yet)
def books_in_stock(title: str) -> str:
    """How many copies of a book the shop has in stock.

    Args:
        title: the book's title.
    """
    CALLS.append(title)
    return f"The shop has 7 copies of {title} in stock."


async def run_agent(base_url: str, tool_choice: str, stream: bool, max_tokens: int) -> str:
    set_tracing_disabled(True)  # the SDK would otherwise send traces to OpenAI
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="local", max_retries=0, timeout=1800)
    agent = Agent(
        name="shop assistant",
        instructions="You are a helpful shop assistant. Look titles up with books_in_stock, then tell the user the "
        "answer in plain words.",
        tools=[books_in_stock],
        model=OpenAIResponsesModel(model="m", openai_client=client),
        # one call per turn: the 0.5B model, free to call in parallel, repeats the same call until max_tokens
        model_settings=ModelSettings(
            tool_choice=tool_choice, parallel_tool_calls=False, max_tokens=max_tokens, temperature=0
        ),
    )
    if not stream:
        result = await Runner.run(agent, PROMPT, max_turns=4)
        return str(result.final_output)
    streamed = Runner.run_streamed(agent, PROMPT, max_turns=4)
    async for _ in streamed.stream_events():
        pass
    return str(streamed.final_output)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-1.5b")
    parser.add_argument("--tool-choice", default="required", choices=("required", "auto"), help="the first turn's")
    parser.add_argument("--stream", action="store_true", help="Runner.run_streamed (the SSE events) instead of run")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--dump", type=Path, help="write each request's body and answer here")
    args = parser.parse_args()
    server = ServeProcess("--target", str(fetch(args.model)), "--draft-method", "ngram", "--n-ctx", "4096",
                          "--model-name", "m", ready_timeout=600)  # fmt: skip
    try:
        with RequestLog(server.url) as log:
            start = time.monotonic()
            try:
                answer = asyncio.run(run_agent(log.url, args.tool_choice, args.stream, args.max_tokens))
            finally:
                print(f"agent ran for {time.monotonic() - start:.0f} s")
                print("requests:\n" + log.table())
                print("tool calls:", CALLS)
                if args.dump:
                    log.dump(args.dump)
            print("final answer:", answer)
            return 0 if CALLS and answer.strip() else 1
    finally:
        server.close()


if __name__ == "__main__":
    sys.exit(main())
