"""The strong drafters on MLX, in one command (made for Apple silicon; on Linux mlx[cpu] runs it slowly):
per head family given, `localspec bench` on the same prompts with none, the family at a fixed length, and
auto driving it; then one table of tokens/s, speedup, acceptance by position and auto's choices, and the
target's measured cost curve T(n) (what decides whether verifying k tokens is nearly free here).

    python benchmarks/mlx_heads.py --target MODEL_DIR [--eagle3 DIR] [--dflash DIR] [--dspark DIR] [--mtp]
        [--suites code-edit,agentic] [--prompts 2] [--max-tokens 128] [-k 4] [--json-out FILE]

--mtp drafts with the target's own MTP layer (a Qwen3.5 / Qwen3-Next checkpoint that keeps its mtp.* weights).
Each family runs in its own bench (one --draft each); the none rows repeat, so read each family's speedup
against the none row of its own run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def bench(args: argparse.Namespace, family: str, draft: str) -> dict:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "bench.json"
        argv = [sys.executable, "-m", "localspec.cli", "bench", "--backend", "mlx", "--target", args.target,
                "--draft", draft, "--methods", f"none,{family}:{args.k},auto", "--suites", args.suites,
                "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens), "--json-out", str(out)]  # fmt: skip
        print(f"\n== {family}: {' '.join(argv[3:])}", flush=True)
        done = subprocess.run(argv, check=False)
        if done.returncode != 0:
            return {"family": family, "error": f"bench exited with {done.returncode}"}
        return {"family": family, **json.loads(out.read_text())}


def table(results: list[dict]) -> None:  # type: ignore[type-arg]
    print(
        f"\n{'family':<8} {'suite':<10} {'method':<12} {'tok/s':>8} {'speedup':>8} {'accept':>7}  by position / auto chose"
    )
    for r in results:
        if "error" in r:
            print(f"{r['family']:<8} {r['error']}")
            continue
        for row in r["summary"]:
            acc = "-" if row["acceptance"] is None else f"{row['acceptance']:.0%}"
            pos = " ".join(f"{a:.0%}" for a in row["acceptance_by_position"][:8])
            print(f"{r['family']:<8} {row['suite']:<10} {row['method']:<12} {row['tps_median']:>8.2f} "
                  f"{row['speedup']:>7.2f}x {acc:>7}  {pos or row['decisions']}")  # fmt: skip
    first = next((r for r in results if "costs" in r), None)
    if first is not None:
        for suite, c in first["costs"].items():
            t = {int(n): s for n, s in c["target_s"].items()}
            curve = ", ".join(f"T({n}) {t[n] * 1000:.1f} ms ({t[n] / t[1]:.2f}x)" for n in sorted(t))
            print(f"\nT(n) at {c['n_context']} tokens of context ({suite}): {curve}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="an mlx-lm model directory")
    ap.add_argument("--eagle3", help="an EAGLE-3 head directory made for the target")
    ap.add_argument("--dflash", help="a DFlash drafter directory made for the target")
    ap.add_argument("--dspark", help="a DSpark drafter directory made for the target")
    ap.add_argument("--mtp", action="store_true", help="the target's own MTP layer")
    ap.add_argument("--suites", default="code-edit,agentic")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("-k", type=int, default=4, help="the fixed draft length of each family's row")
    ap.add_argument("--json-out", help="write every bench's JSON here")
    args = ap.parse_args()
    heads = [(f, getattr(args, f)) for f in ("eagle3", "dflash", "dspark") if getattr(args, f)]
    if args.mtp:
        heads.append(("mtp", args.target))
    if not heads:
        ap.error("give at least one of --eagle3, --dflash, --dspark, --mtp")
    results = [bench(args, family, draft) for family, draft in heads]
    table(results)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
