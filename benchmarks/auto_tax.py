"""auto against none, side by side, on the cases where auto's default must not cost: new text cold and
warm, new copy edits, and a question asked again (the suffix memory's copy).

    python benchmarks/auto_tax.py --target T.gguf --draft D.gguf [--pairs 3] [--cases prose,gen,...]

Every run is its own `localspec run --json` process, so model loading and the draft's background load
are what a user gets. Each case runs `none` and `auto` alternately (the order swapped every pair), on
the same prompt, greedy, 2 threads:

- prose-cold, gen-cold: new text, a fresh HOME per run (no stored costs: the very first run of an
  install), `--no-suffix-memory`.
- prose-warm, gen-warm: new text, one HOME whose costs an earlier unmeasured auto run stored.
- rename, hints: edits of code the suite never showed (held out), warm HOME, `--no-suffix-memory`.
- again: a question answered once into the suffix memory of a fresh HOME (unmeasured), then asked again
  in new processes: auto reads the memory, none has nothing to read.

The runs import localspec as `python -m` does, from the current directory first: to measure another tree, run
this from that tree's root (PYTHONPATH alone is not enough).

Prints, per case, each pair's decode tokens/s, the ratio auto/none, and the median over pairs; the
median time of a target pass per plain round (rounds that drafted nothing) for each method from the
per-round records; and what auto did (rounds, drafted, accepted, its draft time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PROSE = "Explain to someone new to programming why unit tests are worth writing, in three short paragraphs."
GEN = "Write a Python function that parses an ISO 8601 duration like P3DT4H5M into seconds, with a docstring."

_SOURCE = """def merge_intervals(intervals):
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def total_covered(intervals):
    covered = 0
    for start, end in merge_intervals(intervals):
        covered += end - start
    return covered


def gaps_between(intervals, lower, upper):
    gaps = []
    cursor = lower
    for start, end in merge_intervals(intervals):
        if start > cursor:
            gaps.append((cursor, min(start, upper)))
        cursor = max(cursor, end)
    if cursor < upper:
        gaps.append((cursor, upper))
    return gaps
"""
RENAME = f"Rename `intervals` to `spans` everywhere in this code. Reply with the whole code only.\n\n{_SOURCE}"
HINTS = f"Add type hints to every function signature in this code. Reply with the whole code only.\n\n{_SOURCE}"
AGAIN = "What does a Python context manager do? Give a short example with a file."


@dataclass(frozen=True)
class Case:
    name: str
    prompt: str
    home: str  # "fresh": a new HOME per run; "warm": one prefilled HOME; "memory": warm HOME + memory
    tokens: int


CASES = {
    "prose-cold": Case("prose-cold", PROSE, "fresh", 96),
    "gen-cold": Case("gen-cold", GEN, "fresh", 96),
    "prose-warm": Case("prose-warm", PROSE, "warm", 96),
    "gen-warm": Case("gen-warm", GEN, "warm", 96),
    "rename": Case("rename", RENAME, "warm", 160),
    "hints": Case("hints", HINTS, "warm", 160),
    "again": Case("again", AGAIN, "memory", 128),
}


@dataclass
class Side:
    tps: list[float] = field(default_factory=list)
    plain_verify_ms: list[float] = field(default_factory=list)  # median per run
    did: list[str] = field(default_factory=list)


def run_once(args: argparse.Namespace, method: str, case: Case, home: str, memory: bool) -> dict:
    cmd = [sys.executable, "-m", "localspec.cli", "run", case.prompt, "--json", "--target", args.target,
           "--draft-method", method, "--max-tokens", str(case.tokens), "--threads", str(args.threads)]  # fmt: skip
    if args.draft:
        cmd += ["--draft", args.draft]
    if not memory:
        cmd.append("--no-suffix-memory")
    env = dict(os.environ, HOME=home, XDG_CACHE_HOME=f"{home}/.cache")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{method} on {case.name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def record(side: Side, out: dict) -> None:
    s = out["stats"]
    side.tps.append(s["decode_tps"])
    plain = [r["verify_s"] * 1000 for r in out["rounds"] if r["n_drafted"] == 0]
    if plain:
        side.plain_verify_ms.append(statistics.median(plain))
    side.did.append(f"{s['n_rounds']} rounds, {s['n_drafted']} drafted, {s['n_accepted']} accepted, "
                    f"draft_s {s['draft_s']:.2f}{check_cost(out, plain)}")  # fmt: skip


def check_cost(out: dict, plain_ms: list[float]) -> str:
    """What the rounds that checked or timed the cost curve (source "check") cost over the plain rounds they
    replaced (a plain round's median time for each token they gave), as a share of the answer's decode time."""
    checks = [r for r in out["rounds"] if r["source"] == "check"]
    if not checks or not plain_ms:
        return ""
    t1 = statistics.median(plain_ms) / 1000
    extra = sum(max(r["verify_s"] - t1 * (1 + r["n_accepted"]), 0.0) for r in checks)
    return f", {len(checks)} check rounds costing {100 * extra / out['stats']['decode_s']:.2f}%"


def prepared_home(args: argparse.Namespace, case: Case, root: Path) -> str:
    home = tempfile.mkdtemp(prefix=f"{case.name}-", dir=root)
    if case.home == "warm":
        run_once(args, "auto", Case("fill", PROSE, "warm", 48), home, memory=False)  # stores the costs
    if case.home == "memory":
        run_once(args, "auto", Case("fill", PROSE, "warm", 48), home, memory=False)
        run_once(args, "auto", case, home, memory=True)  # the first answer, into the memory
    return home


def measure(args: argparse.Namespace, case: Case, root: Path) -> dict[str, Side]:
    sides = {"none": Side(), "auto": Side()}
    home = "" if case.home == "fresh" else prepared_home(args, case, root)
    for pair in range(args.pairs):
        order = ("none", "auto") if pair % 2 == 0 else ("auto", "none")
        for method in order:
            run_home = tempfile.mkdtemp(prefix="fresh-", dir=root) if case.home == "fresh" else home
            record(sides[method], run_once(args, method, case, run_home, memory=case.home == "memory"))
            if case.home == "fresh":
                shutil.rmtree(run_home, ignore_errors=True)
        n, a = sides["none"], sides["auto"]
        print(f"  {case.name} pair {pair + 1}: none {n.tps[-1]:.1f} tok/s, auto {a.tps[-1]:.1f} tok/s "
              f"({a.tps[-1] / n.tps[-1]:.3f}x); auto: {a.did[-1]}", flush=True)  # fmt: skip
    return sides


def summary(case: Case, sides: dict[str, Side]) -> dict:
    n, a = sides["none"], sides["auto"]
    ratios = [x / y for x, y in zip(a.tps, n.tps)]
    row = {
        "case": case.name,
        "none_tps": n.tps,
        "auto_tps": a.tps,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
        "none_plain_round_ms": statistics.median(n.plain_verify_ms) if n.plain_verify_ms else None,
        "auto_plain_round_ms": statistics.median(a.plain_verify_ms) if a.plain_verify_ms else None,
        "auto_did": a.did,
    }
    pr = ""
    if row["none_plain_round_ms"] and row["auto_plain_round_ms"]:
        pr = f"; plain round median none {row['none_plain_round_ms']:.1f} ms, auto {row['auto_plain_round_ms']:.1f} ms"
    print(f"{case.name}: auto/none median {row['median_ratio']:.3f}x "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}){pr}", flush=True)  # fmt: skip
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json-out")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="auto-tax-") as tmp:
        for name in args.cases.split(","):
            case = CASES[name]
            rows.append(summary(case, measure(args, case, Path(tmp))))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
