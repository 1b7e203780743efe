"""llama.cpp's own tools side by side with localspec: same prompts, threads and token counts.

    python benchmarks/llama_lookup.py --target T.gguf [--draft D.gguf] [--bin-dir DIR] [--threads 2]
        [--max-tokens 96] [--draft-max 8] [--suites code-edit,agentic,code-gen,chat] [--reps 1]

For every prompt (every turn of a session suite) it runs, interleaved, with the order rotated per prompt:
llama.cpp plain decoding (`llama-lookup --spec-draft-n-max 0`), `llama-lookup` (n-gram lookup, --spec-draft-n-max N),
and localspec `none` and `auto` in this process (models loaded once; auto with the pipeline's
remembered costs, one drafter per session as `localspec chat` has). The prompt text is rendered with
localspec's chat template and handed to llama.cpp with special tokens parsed, so both read the same
tokens. Session suites: each turn's history holds localspec `none`'s answers (the same for all four at
temperature 0), and llama-lookup keeps a dynamic n-gram cache file per conversation (`-lcd`), its own
way to remember earlier turns. Decode tokens/s: llama.cpp's "decoded N tokens in S seconds" line;
localspec's SpecStats.decode_tps. Build the tools first: `benchmarks/build_llama_tools.sh` (llama.cpp's
source vendored in the llama-cpp-python sdist, for the same ggml; binaries in /work/tools/llama.cpp/build/bin).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from localspec.backends.base import ChatMessage
from localspec.backends.chat_template import choose_chat_format, conversation_text
from localspec.bench.suites import suites
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.grammar import GrammarSpec
from localspec.options import AUTO_MAX_K, ModelOptions
from localspec.pipeline import load_pipeline
from localspec.sampling import SamplingParams

DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
ACCEPT = re.compile(r"n_drafted\s*=\s*(\d+).*?n_accept\s*=\s*(\d+)", re.S)


def llama_lookup(
    binary: Path, args: argparse.Namespace, prompt: str, draft_max: int, cache: Path | None, grammar: GrammarSpec | None
) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as fh:
        fh.write(prompt)
    cmd = [
        str(binary),
        "-m",
        args.target,
        "-f",
        fh.name,
        "-n",
        str(args.max_tokens),
        "-t",
        str(args.threads),
        "-tb",
        str(args.threads),
        "--temp",
        "0",
        "--spec-draft-n-max",
        str(draft_max),
        "-c",
        str(args.n_ctx),
        "-b",
        str(args.n_ctx),
    ]  # fmt: skip (the tool reads the prompt in one batch: it must hold it whole)
    if cache is not None:
        cmd += ["-lcd", str(cache)]
    if grammar is not None:  # llama.cpp's own JSON-schema grammar (its sampler masks every sampled token)
        if grammar.kind != "json_schema":
            raise SystemExit(f"llama-lookup takes JSON schemas only, not {grammar.kind}")
        cmd += ["--json-schema", grammar.text]
    out = subprocess.run(cmd, capture_output=True, text=True)
    Path(fh.name).unlink()
    log = out.stdout + out.stderr
    m = DECODED.search(log)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{log[-2000:]}")
    a = ACCEPT.search(log)
    drafted, accepted = (int(a.group(1)), int(a.group(2))) if a else (0, 0)
    return {"tps": int(m.group(1)) / float(m.group(2)), "drafted": drafted, "accepted": accepted}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--bin-dir", default="/work/tools/llama.cpp/build/bin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096, help="context for both (agent-long needs 10240)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft-max", type=int, default=8, help="llama-lookup's draft length")
    ap.add_argument(
        "--suites",
        default="code-edit,agentic,code-gen,chat",
        help="also: structured (JSON schemas: llama-lookup gets --json-schema), agent-long (--n-ctx 10240)",
    )
    ap.add_argument("--prompts", type=int, default=2, help="prompts (conversations) per suite")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    binary = Path(args.bin_dir) / "llama-lookup"
    if not binary.exists():
        raise SystemExit(f"{binary} not found: build llama.cpp's llama-lookup first (see this file's docstring)")
    opts = ModelOptions(
        target=args.target, draft=args.draft, draft_method="auto", threads=args.threads, n_ctx=args.n_ctx
    )
    pipe = load_pipeline(opts)
    for note in pipe.notes:
        print(note, file=sys.stderr)
    greedy = SamplingParams(temperature=0.0)
    results: dict[tuple[str, str], list[dict]] = defaultdict(list)  # (suite, runner) -> per prompt/turn
    available = suites()
    try:
        for rep in range(args.reps):
            for name in args.suites.split(","):
                suite = available[name]
                for pi, conv in enumerate(suite.prompts[: args.prompts]):
                    turns = [[m] for m in conv] if suite.session else [list(conv)]
                    history: list[ChatMessage] = []
                    drafter = pipe.new_drafter("auto")
                    cache = Path(tempfile.mkdtemp()) / "lookup.bin" if suite.session else None
                    grammar = suite.grammar(pi)
                    for ti, turn in enumerate(turns):
                        history += turn
                        tokens = pipe.prompt_tokens(history)
                        text = conversation_text(
                            pipe.target, history, pipe.chat_format or choose_chat_format(pipe.target)
                        )
                        runners = ["llama plain", "llama-lookup", "localspec none", "localspec auto"]
                        shift = (rep + pi + ti) % len(runners)
                        reply = ""
                        for runner in runners[shift:] + runners[:shift]:
                            if runner.startswith("llama"):
                                dm = 0 if runner == "llama plain" else args.draft_max
                                r = llama_lookup(binary, args, text, dm, cache if dm else None, grammar)
                            else:
                                method = runner.split()[1]
                                d = drafter if method == "auto" else pipe.new_drafter("none")
                                k = AUTO_MAX_K if method == "auto" else 0
                                cfg = GenerationConfig(
                                    max_tokens=args.max_tokens, num_draft=k, sampling=greedy, grammar=grammar
                                )
                                *_, done = generate(pipe.target, d, tokens, cfg)
                                assert isinstance(done, Done)
                                s = done.stats
                                r = {"tps": s.decode_tps, "drafted": s.n_drafted, "accepted": s.n_accepted}
                                if method == "none":
                                    reply = done.text
                            results[(name, runner)].append(r)
                            print(f"rep {rep + 1} {name} #{pi + 1}.{ti + 1} {runner}: {r['tps']:.1f} tok/s "
                                  f"({r['accepted']}/{r['drafted']} accepted)", file=sys.stderr, flush=True)  # fmt: skip
                        history.append(ChatMessage("assistant", reply))
                    drafter.close()
    finally:
        pipe.close()
    print(
        f"\n{args.max_tokens} tokens, greedy, {args.threads} threads; llama-lookup --spec-draft-n-max {args.draft_max}"
    )
    print(f"{'suite':<11}{'llama plain':>12}{'llama-lookup':>14}{'ls none':>9}{'ls auto':>9}{'auto/lookup':>13}")
    for name in args.suites.split(","):
        med = {}
        for runner in ("llama plain", "llama-lookup", "localspec none", "localspec auto"):
            rs = results[(name, runner)]
            med[runner] = statistics.median(r["tps"] for r in rs) if rs else float("nan")
        lk = results[(name, "llama-lookup")]
        acc = sum(r["accepted"] for r in lk) / max(sum(r["drafted"] for r in lk), 1)
        print(f"{name:<11}{med['llama plain']:>12.1f}{med['llama-lookup'] / med['llama plain']:>10.2f}x {acc:>3.0%}"
              f"{med['localspec none']:>9.1f}{med['localspec auto'] / med['localspec none']:>8.2f}x"
              f"{(med['localspec auto'] / med['localspec none']) / (med['llama-lookup'] / med['llama plain']):>12.2f}x")  # fmt: skip
    print(
        "(llama-lookup: speedup over llama plain and acceptance; ls auto: speedup over ls none; auto/lookup: the two speedups' ratio)"
    )


if __name__ == "__main__":
    main()
