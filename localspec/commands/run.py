"""`localspec run PROMPT`: one prompt, the answer streamed to stdout, stats to stderr (or --json).

The models load and the engine runs on a worker thread, so that the main thread is always free to
take Ctrl-C: the first stops after the current round (at once while loading, reading the prompt or
preparing the drafter) and still prints the stats; the second aborts at once.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.commands.first_use import model_options_from_args
from localspec.errors import UsageError
from localspec.families import registry
from localspec.options import (
    ModelOptions,
    add_generation_options,
    add_model_options,
    generation_config_from_args,
)

ABORT_GRACE_S = 2.0  # after a second Ctrl-C, wait this long at most for the worker to free the models


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


def ignored_options(args: argparse.Namespace, opts: ModelOptions) -> list[str]:
    """Options given that the chosen draft method does not use (said, not silently dropped)."""
    if args.draft and not opts.family.reads_draft_file:
        readers = [f.name for f in registry.families() if f.reads_draft_file]
        return [
            f"--draft is not used by --draft-method {opts.draft_method} (only {', '.join(readers)} read a --draft file)"
        ]
    return []


def run(args: argparse.Namespace) -> int:
    prompt_text = read_prompt(args.prompt)
    config = generation_config_from_args(args)
    opts = model_options_from_args(args)
    for note in ignored_options(args, opts):
        print(f"note: {note}", file=sys.stderr)
    job = _RunJob(opts, config, prompt_text, args)
    return job.run()


@dataclass
class _RunJob:
    opts: ModelOptions
    config: Any  # GenerationConfig
    prompt_text: str
    args: argparse.Namespace
    stop: threading.Event = field(default_factory=threading.Event)  # after the current round
    cancel: threading.Event = field(default_factory=threading.Event)  # now
    pipeline: Any = None
    decoding: bool = False  # a first token is out: the first Ctrl-C may wait for the round
    interrupts: int = 0
    done: Any = None
    rounds: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None

    # -- main thread ---------------------------------------------------------------------------------

    def run(self) -> int:
        worker = threading.Thread(target=self._work, name="localspec-run", daemon=True)
        previous = signal.signal(signal.SIGINT, self._on_sigint) if _main_thread() else None
        try:
            worker.start()
            while worker.is_alive():
                worker.join(0.1)  # short waits: Python runs signal handlers only between them
                if self.interrupts >= 2:
                    worker.join(ABORT_GRACE_S)
                    print("\naborted", file=sys.stderr)
                    return 130
            if self.error is not None:
                raise self.error
            return self._report()  # a late Ctrl-C (the run already over) must not cut the stats short
        finally:
            if previous is not None:
                # After a Ctrl-C the process is ending: a further one must not turn the exit into a crash.
                signal.signal(signal.SIGINT, signal.SIG_IGN if self.interrupts else previous)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupts += 1
        self.stop.set()
        if self.interrupts == 1 and self.decoding:
            print("\n[stopping after this round; Ctrl-C again to abort]", file=sys.stderr, flush=True)
            return
        self._interrupt_now()

    def _interrupt_now(self) -> None:
        self.cancel.set()
        if self.pipeline is not None:
            self.pipeline.abort()

    def _report(self) -> int:
        from localspec.report import summary_lines

        done = self.done
        if self.args.json:
            out = {"text": done.text, "tokens": list(done.tokens), "stats": done.stats.to_dict(), "rounds": self.rounds}
            if self.pipeline is not None and self.pipeline.backend_note:
                out["backend_note"] = self.pipeline.backend_note
            if self.pipeline is not None and self.pipeline.notes:
                out["notes"] = self.pipeline.notes
            json.dump(out, sys.stdout)
            sys.stdout.write("\n")
        else:
            sys.stdout.write("\n")
            for line in summary_lines(done.stats):
                print(line, file=sys.stderr)
        return 130 if done.stats.stop_reason == "stopped" else 0

    # -- worker thread ------------------------------------------------------------------------------

    def _work(self) -> None:
        from localspec.pipeline import load_pipeline

        try:
            self._say(f"loading {self.opts.target}" + (f" and {self.opts.draft}" if self.opts.uses_draft_model else ""))
            pipeline = load_pipeline(self.opts, cancel=self.cancel)
            self.pipeline = pipeline
            if self.cancel.is_set():  # Ctrl-C while the load finished
                pipeline.abort()
            try:
                for note in pipeline.notes:
                    if not self.args.json:
                        print(f"note: {note}", file=sys.stderr, flush=True)
                self._generate(pipeline)
            finally:
                pipeline.close()
        except BaseException as e:  # re-raised on the main thread, where the CLI reports it
            self.error = e
        finally:
            from localspec.backends.registry import release_thread

            release_thread()

    def _generate(self, pipeline: Any) -> None:
        from localspec.backends.base import ChatMessage
        from localspec.decoding.engine import Done

        args = self.args
        if args.raw:
            prompt: Any = self.prompt_text
        else:
            prompt = ([ChatMessage("system", args.system)] if args.system else []) + [
                ChatMessage("user", self.prompt_text)
            ]
        tokens = pipeline.prompt_tokens(prompt, raw=args.raw)
        phases = {"prompt": f"reading the prompt ({len(tokens):,} tokens)", "drafter": "preparing the drafter"}
        events = pipeline.generate(tokens, self.config, stop=self.stop, on_phase=lambda p: self._say(phases[p]))
        for event in events:
            if isinstance(event, Done):
                self.done = event
                break
            self.decoding = True
            if event.round is not None:
                self.rounds.append(asdict(event.round))
            if not args.json and event.text:
                sys.stdout.write(event.text)
                sys.stdout.flush()

    def _say(self, text: str) -> None:
        """What is happening before the first token (stderr, and never in --json mode)."""
        if not self.args.json:
            print(f"{text} …", file=sys.stderr, flush=True)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
