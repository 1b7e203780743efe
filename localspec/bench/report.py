"""Tables for `localspec bench`: the hardware's cost curve, then one table per suite."""

from __future__ import annotations

from localspec.bench.measure import BenchResult, Row, summarize
from localspec.decoding.policy import CostModel


def cost_lines(result: BenchResult) -> list[str]:
    lines = ["cost of one forward pass (median of --cost-reps timings in each repetition, then over repetitions; sizes not listed are interpolated):"]
    for name, sc in result.costs.items():
        c: CostModel = sc.costs
        t1 = c.target.get(1)
        if not t1:
            continue
        curve = "  ".join(f"{n}:{c.target[n] * 1e3:.1f}ms ({c.target[n] / t1:.2f}x)" for n in sorted(c.target))
        draft = (
            f" | draft {c.draft_token * 1e3:.1f} ms/token ({c.draft_token / t1:.2f}x of target)" if c.draft_token else ""
        )
        k = max(c.target) - 1
        rollback = f" | rollback after a rejection (k={k}) {c.rollback_round * 1e3:.2f}ms ({c.rollback_round / t1:.2f}x)"
        lines.append(f"  {name} ({sc.n_context} ctx) target batch {curve}{draft}{rollback}")
    return lines


def _fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def suite_table(result: BenchResult, suite: str, rows: list[Row]) -> list[str]:
    head = ("method", "tok/s", "spread", "speedup", "accept", "len", "bound", "of bound", "verify/round", "rollback",
            "accept by position / auto chose")
    body = []
    for r in rows:
        if r.suite != suite:
            continue
        tail = r.decisions if r.method.startswith("auto") else " ".join(f"{a:.0%}" for a in r.acceptance_by_position)
        body.append(
            (
                r.method,
                f"{r.tps_median:.2f}",
                f"{r.tps_min:.1f}-{r.tps_max:.1f}",
                f"{r.speedup:.2f}x",
                _fmt_pct(r.acceptance),
                f"{r.mean_accepted_length:.2f}",
                "-" if r.bound_speedup is None else f"{r.bound_speedup:.2f}x",
                _fmt_pct(r.of_bound),
                f"{r.verify_ms:.2f}ms",
                f"{r.rollback_ms:.2f}ms",
                tail or "-",
            )
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i in (0, 10) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    sc = result.costs.get(suite)
    title = f"suite {suite}" + (f" ({sc.n_context} tokens of context in its first prompt)" if sc else "")
    return [title, fmt(head), *(fmt(b) for b in body)]


def bench_lines(result: BenchResult) -> list[str]:
    rows = summarize(result)
    lines = [
        f"{result.backend} on {result.device} | target {result.target} | draft {result.draft or '-'} | "
        f"{'greedy' if result.temperature == 0 else f'temperature {result.temperature}'} | "
        f"max {result.max_tokens} tokens | {result.reps} repetitions, interleaved | {result.wall_s:.0f} s"
        + (" | INTERRUPTED: partial results" if result.interrupted else ""),
        *cost_lines(result),
        "",
    ]
    for suite in result.suites:
        if any(r.suite == suite for r in rows):
            lines += suite_table(result, suite, rows) + [""]
    lines += [
        "tok/s: decode tokens/s, median over repetitions (spread: min-max); speedup: median of per-repetition",
        "ratios to plain decoding (none); len: tokens per target pass; bound: the speedup the measured costs",
        "allow for the acceptance reached (expected tokens per round / cost of a round, x T(1)); verify/round:",
        "the target's time per round, of which rollback cut its cache back (a hybrid model restores a state).",
    ]
    return lines
