"""How much does the chat app cost the generation? Decode tokens/s inside `localspec chat` versus
`localspec run --json`, same prompt, pair and settings, measured side by side.

Each repetition runs both, in alternating order, each in a fresh process (model load excluded: both
report the engine's own decode tokens/s). The app runs headless under Textual's Pilot: the full app
(workers, message merging, Markdown, stats panel, compositor) does its work; only the bytes to a real
terminal are skipped. Medians are reported because shared machines are noisy.

    python benchmarks/tui_overhead.py --target T.gguf --draft D.gguf [--max-tokens 64] [--reps 5]

--inproc measures inside one process instead: the models load once in the app, and each repetition
runs the same engine call once on a plain thread with the UI idle (what `localspec run` does) and
once as a chat reply streamed through the UI, in alternating order. Same memory, same threads, same
cache state: the cleaner A/B on a machine whose other load swings run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome, with a short docstring."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", default=None)
    p.add_argument("--draft-method", default=None)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("-k", "--num-draft", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print the raw measurements as JSON too")
    p.add_argument("--inproc", action="store_true", help="one process: plain engine thread vs the app, alternating")
    p.add_argument("--child-app", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def method(args: argparse.Namespace) -> str:
    return args.draft_method or ("model" if args.draft else "ngram")


def run_cli(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "localspec.cli", "run", args.prompt, "--json", "--target", args.target]
    cmd += ["--draft-method", method(args), "--max-tokens", str(args.max_tokens), "-k", str(args.num_draft)]
    cmd += ["--n-ctx", str(args.n_ctx), "--seed", "0"]
    if args.draft and method(args) == "model":
        cmd += ["--draft", args.draft]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    data = json.loads(out.strip().splitlines()[-1])
    return {
        "decode_tps": data["stats"]["decode_tps"],
        "n_generated": data["stats"]["n_generated"],
        "text": data["text"],
    }


def run_app(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child-app", "--target", args.target, "--prompt", args.prompt]
    cmd += ["--draft-method", method(args), "--max-tokens", str(args.max_tokens), "-k", str(args.num_draft)]
    cmd += ["--n-ctx", str(args.n_ctx)]
    if args.draft:
        cmd += ["--draft", args.draft]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


async def child_app(args: argparse.Namespace) -> dict:
    from textual.widgets import Input

    from localspec.options import GenerationSettings, ModelOptions
    from localspec.tui.app import ChatApp

    m = method(args)
    options = ModelOptions(
        target=args.target,
        draft=args.draft if m == "model" else None,
        draft_method=m,
        n_ctx=args.n_ctx,
        threads=args.threads,
    )
    app = ChatApp(options=options, settings=GenerationSettings(k=args.num_draft, max_tokens=args.max_tokens, seed=0))
    async with app.run_test(size=(140, 44)) as pilot:
        while app.pipeline is None:
            if not app.loading and app.pipeline is None:
                raise SystemExit("the app could not load the models")
            await pilot.pause(0.05)
        prompt = app.chat.query_one("#prompt", Input)
        prompt.value = args.prompt
        prompt.focus()
        await pilot.press("enter")
        await pilot.pause(0.05)
        # Poll with a bare sleep: Pilot.pause() forces a screen refresh on every call, which would bill
        # the harness's own redraws to the app.
        while app.chat.generating:
            await asyncio.sleep(0.05)
        turn = app.chat.transcript.turns[0]
        if turn.stats is None:
            raise SystemExit(f"generation failed in the app: {turn.error}")
        return {
            "decode_tps": turn.stats.decode_tps,
            "n_generated": turn.stats.n_generated,
            "text": turn.reply,
            "renders": app.chat.renders,
        }


async def inproc(args: argparse.Namespace) -> dict[str, list[dict]]:
    from textual.widgets import Input

    from localspec.backends.base import ChatMessage
    from localspec.decoding.engine import Done
    from localspec.options import GenerationSettings, ModelOptions
    from localspec.tui.app import ChatApp

    m = method(args)
    options = ModelOptions(
        target=args.target,
        draft=args.draft if m == "model" else None,
        draft_method=m,
        n_ctx=args.n_ctx,
        threads=args.threads,
    )
    settings = GenerationSettings(k=args.num_draft, max_tokens=args.max_tokens, seed=0)
    app = ChatApp(options=options, settings=settings)
    runs: dict[str, list[dict]] = {"run": [], "app": []}

    def plain() -> dict:  # the `localspec run` loop, on a thread while the app sits idle
        p = app.pipeline
        assert p is not None
        config = replace(settings, method=p.options.draft_method).config()
        for event in p.generate([ChatMessage("user", args.prompt)], config):
            if isinstance(event, Done):
                s = event.stats
                return {"decode_tps": s.decode_tps, "n_generated": s.n_generated, "text": event.text}
        raise RuntimeError("no Done event")

    async with app.run_test(size=(140, 44)) as pilot:
        while app.pipeline is None:
            if not app.loading:
                raise SystemExit("the app could not load the models")
            await pilot.pause(0.05)
        prompt = app.chat.query_one("#prompt", Input)
        for rep in range(args.reps):
            for kind in ("run", "app") if rep % 2 == 0 else ("app", "run"):
                if kind == "run":
                    result = await asyncio.to_thread(plain)
                else:
                    await app.chat.action_new_chat()
                    prompt.value = args.prompt
                    prompt.focus()
                    await pilot.press("enter")
                    await pilot.pause(0.05)
                    while app.chat.generating:
                        await asyncio.sleep(0.05)
                    turn = app.chat.transcript.turns[-1]
                    assert turn.stats is not None, turn.error
                    result = {
                        "decode_tps": turn.stats.decode_tps,
                        "n_generated": turn.stats.n_generated,
                        "text": turn.reply,
                        "renders": app.chat.renders,
                    }
                runs[kind].append(result)
                print(
                    f"rep {rep + 1}/{args.reps} {kind:>3}: {result['decode_tps']:7.2f} tok/s "
                    f"({result['n_generated']} tokens)",
                    flush=True,
                )
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_app:
        print(json.dumps(asyncio.run(child_app(args))))
        return 0
    runs: dict[str, list[dict]] = {"run": [], "app": []}
    if args.inproc:
        runs = asyncio.run(inproc(args))
    for rep in range(0 if args.inproc else args.reps):
        order = ("run", "app") if rep % 2 == 0 else ("app", "run")
        for kind in order:
            t0 = time.perf_counter()
            result = run_cli(args) if kind == "run" else run_app(args)
            result["wall_s"] = time.perf_counter() - t0
            runs[kind].append(result)
            print(
                f"rep {rep + 1}/{args.reps} {kind:>3}: {result['decode_tps']:7.2f} tok/s "
                f"({result['n_generated']} tokens, {result['wall_s']:.1f} s with load)",
                flush=True,
            )
    med = {k: statistics.median(r["decode_tps"] for r in v) for k, v in runs.items()}
    same_text = all(a["text"] == runs["run"][0]["text"] for a in runs["app"] + runs["run"])
    ratio = med["app"] / med["run"] if med["run"] else float("nan")
    print(
        f"\n{Path(args.target).name} + {method(args)} ({Path(args.draft).name if args.draft else '-'}), "
        f"{args.max_tokens} tokens, k={args.num_draft}, {args.reps} reps"
    )
    label = "plain engine thread" if args.inproc else "localspec run"
    print(f"median decode tok/s: {label} {med['run']:.2f} | localspec chat (app) {med['app']:.2f}")
    pairs = [a["decode_tps"] / r["decode_tps"] for a, r in zip(runs["app"], runs["run"]) if r["decode_tps"]]
    if pairs:
        print(f"median of per-repetition ratios app/run: {statistics.median(pairs):.3f}")
    print(f"app / run = {ratio:.3f} ({(ratio - 1) * 100:+.1f}%); same text in every run: {same_text}")
    if args.json:
        print(json.dumps({"median": med, "ratio": ratio, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
