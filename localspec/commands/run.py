"""`localspec run PROMPT`: one prompt, the answer streamed to stdout, stats to stderr (or --json)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from dataclasses import asdict
from typing import Any

from localspec.errors import UsageError
from localspec.options import (
    add_generation_options,
    add_model_options,
    generation_config_from_args,
    model_options_from_args,
)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run",
        help="generate an answer to one prompt",
        description="Generate an answer to one prompt with speculative decoding. "
        "The answer streams to stdout, a stats summary goes to stderr.",
    )
    p.add_argument("prompt", help="the prompt text, or - to read it from stdin")
    add_model_options(p)
    add_generation_options(p)
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object with the text and every stat")
    p.set_defaults(handler=run)


def read_prompt(arg: str) -> str:
    text = sys.stdin.read() if arg == "-" else arg
    if not text.strip():
        raise UsageError("the prompt is empty", "pass the prompt as an argument, or pipe it in with `-`")
    return text


def run(args: argparse.Namespace) -> int:
    from localspec.backends.base import ChatMessage
    from localspec.decoding.engine import Done
    from localspec.pipeline import load_pipeline
    from localspec.report import summary_lines

    prompt_text = read_prompt(args.prompt)
    config = generation_config_from_args(args)
    opts = model_options_from_args(args)
    pipeline = load_pipeline(opts)
    if pipeline.backend_note and not args.json:
        print(pipeline.backend_note, file=sys.stderr)
    try:
        if args.raw:
            prompt: Any = prompt_text
        else:
            prompt = ([ChatMessage("system", args.system)] if args.system else []) + [ChatMessage("user", prompt_text)]
        stop = threading.Event()
        rounds: list[dict[str, Any]] = []
        with _first_interrupt_stops(stop):
            for event in pipeline.generate(prompt, config, raw=args.raw, stop=stop):
                if isinstance(event, Done):
                    done = event
                    break
                if event.round is not None:
                    rounds.append(asdict(event.round))
                if not args.json and event.text:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
        if args.json:
            out = {"text": done.text, "tokens": list(done.tokens), "stats": done.stats.to_dict(), "rounds": rounds}
            if pipeline.backend_note:
                out["backend_note"] = pipeline.backend_note
            json.dump(out, sys.stdout)
            sys.stdout.write("\n")
        else:
            sys.stdout.write("\n")
            for line in summary_lines(done.stats):
                print(line, file=sys.stderr)
        return 130 if done.stats.stop_reason == "stopped" else 0
    finally:
        pipeline.close()


class _first_interrupt_stops:
    """First Ctrl-C finishes the current round and ends cleanly (stats still printed); a second aborts."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.previous: Any = None

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.stop.set()
        print("\n[stopping after this round; Ctrl-C again to abort]", file=sys.stderr)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
