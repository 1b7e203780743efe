"""`localspec bench`: measure speculation on this machine, for a pair and a backend, and tell the truth."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from localspec.errors import UsageError
from localspec.families.lookup import NONE
from localspec.families.model import MODEL
from localspec.options import ModelOptions, add_model_options

DEFAULT_METHODS = "none,ngram:4,ngram:8,suffix:32,model:2,model:4,model:6,auto:32"
HEAD_DEFAULT_METHODS = "none,ngram:4,suffix:32,{m}:2,{m}:4,{m}:6,auto:32"  # --draft is a head of family m


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="measure plain vs speculative decoding on this machine",
        description="Run built-in prompt suites (code generation, code editing, chat, long-context summary) with "
        "plain decoding, n-gram and model drafting at several k, and auto; print decode tokens/s, speedup, "
        "acceptance, and the speedup the measured costs allow (the analytic bound; withheld, with the reason, when "
        "the cost timings spread too widely or form an implausible curve, as on a busy machine).",
    )
    add_model_options(p, method=False, suffix_memory=False)  # bench runs every method itself (--methods)
    g = p.add_argument_group("benchmark")
    g.add_argument(
        "--suites",
        default="all",
        help="comma-separated: code-gen, code-edit, agentic, chat, long-summary, "
        "structured (answers held to a JSON schema; the grammar's time per token is shown), "
        "agent-long (a coding agent's 8.7k-token prompt; needs --n-ctx 10240), and the cases that keep auto's "
        "own cost and the suffix memory's gain apart: code-gen-cold, code-gen-warm, code-edit-cold, code-edit-warm "
        "(auto with no remembered costs, or with the curve bench measured; never a suffix memory) and memory (a "
        "question asked again in a new session: auto with the memory of its first answer, and without), all five "
        "as `cases` (default: all but agent-long and the cases)",
    )
    g.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated METHOD[:K] (default: {DEFAULT_METHODS}; model ones are skipped without a draft). "
        "With a head as --draft (an EAGLE-3, DFlash, DSpark or MTP GGUF made for the target) the model methods "
        f"give way to the head's: e.g. eagle3:2,eagle3:4 (default then: {HEAD_DEFAULT_METHODS.format(m='HEAD')})",
    )
    g.add_argument("--reps", type=int, default=2, help="repetitions of every run, interleaved (default: 2)")
    g.add_argument(
        "--cost-reps",
        type=int,
        default=5,
        help="timings per batch size for the cost curve in each repetition, each right after a 1-token pass "
        "(default: 5)",
    )
    g.add_argument("--prompts", type=int, default=None, help="prompts per suite (default: all, 2 each)")
    g.add_argument("--max-tokens", type=int, default=96, help="tokens generated per run (default: 96)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed when temperature > 0 (default: 0)")
    g.add_argument("--json", action="store_true", help="print the raw numbers as JSON instead of tables")
    g.add_argument("--json-out", metavar="FILE", help="also write the raw numbers as JSON to FILE")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from localspec.bench.measure import parse_methods, run_bench
    from localspec.bench.report import bench_lines
    from localspec.bench.suites import CASES, OPT_IN, suites
    from localspec.commands.first_use import model_options_from_args
    from localspec.pipeline import load_pipeline
    from localspec.sampling import SamplingParams

    if args.reps < 1 or args.max_tokens < 2:
        raise UsageError("--reps must be >= 1 and --max-tokens >= 2", "try --reps 2 --max-tokens 96")
    available = suites()
    if args.suites == "all":
        names = [n for n in available if n not in OPT_IN]
    else:
        names = [s.strip() for s in args.suites.split(",") if s.strip()]
        names = list(dict.fromkeys(n for name in names for n in (CASES if name == "cases" else (name,))))
    unknown = [n for n in names if n not in available]
    if unknown:
        raise UsageError(f"unknown suite(s): {', '.join(unknown)}", f"choose from: {', '.join(available)}")
    # The draft model (if given) is loaded once; every method then runs over the same loaded models. A head
    # (--draft HEAD.gguf) is no draft model: the head methods' drafters load it themselves.
    opts = model_options_from_args(args)  # no model given: the default pair (pulled on first use)
    family, heads = _heads(opts)
    # The pipeline loads the draft model, or none: a head's methods are built per run from --draft.
    opts = opts.with_method((MODEL if opts.draft and not family else NONE).name)
    default = HEAD_DEFAULT_METHODS.format(m=family) if family else DEFAULT_METHODS
    methods = parse_methods(
        args.methods or default, has_draft=opts.uses_draft_model, explicit=bool(args.methods), heads=heads
    )
    opts = replace(opts, max_draft=max([m.k for m in methods] + [0]))  # a recurrent target's snapshot window
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    _sigterm_interrupts()
    pipeline = load_pipeline(opts)
    for note in pipeline.notes:
        log(note)
    try:
        sampling = SamplingParams(temperature=args.temperature, seed=args.seed if args.temperature > 0 else None)
        result = run_bench(
            pipeline,
            [available[n] for n in names],
            methods,
            reps=args.reps,
            max_tokens=args.max_tokens,
            sampling=sampling,
            n_prompts=args.prompts,
            threads=opts.threads,
            progress=log,
            cost_reps=max(args.cost_reps, 1),
        )
    finally:
        pipeline.close()
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(result.to_json(), fh, indent=1)
    if args.json:
        json.dump(result.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print("\n".join(bench_lines(result)))
    return 0


def _heads(opts: ModelOptions) -> tuple[str | None, dict[str, str]]:
    """(the head family --draft is made for, or None for a draft model; for each head family "" when it can
    run on these files, else why not)."""
    from localspec.backends.registry import resolve_backend
    from localspec.families import registry

    backend = resolve_backend(opts.backend, opts.target)[0]
    if not any(f.runs_on(backend) for f in registry.head_families()):
        return None, {}
    return registry.head_for_draft(opts.draft, opts.target), registry.head_fits(opts.target, opts.draft, backend)


def _sigterm_interrupts() -> None:
    """`timeout` and job control send SIGTERM: end like Ctrl-C, printing the runs that finished."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():

        def handler(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, handler)
