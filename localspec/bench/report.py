"""Tables for `localspec bench`: the hardware's cost curve, then one table per suite."""

from __future__ import annotations

from localspec.bench.costs import MAX_SPREAD, Spread
from localspec.bench.measure import BenchResult, Row, SuiteCosts, summarize
from localspec.decoding.cost_cache import MAX_INVERSION, MIN_BATCH_RATIO
from localspec.decoding.policy import CostModel


def cost_lines(result: BenchResult) -> list[str]:
    head = (
        "cost of one forward pass: each batch size timed --cost-reps times per repetition, each right after a "
        "1-token pass; median, min-max and IQR/median over all timings; sizes not listed are interpolated:"
    )
    lines = [head]
    for sc in result.costs.values():
        if sc.costs.target.get(1):
            lines += _suite_cost_lines(sc)
    return lines


def _suite_cost_lines(sc: SuiteCosts) -> list[str]:
    c: CostModel = sc.costs
    t1 = c.target[1]
    spreads = sc.samples.spreads()
    head = ("n", "T(n)", "min-max", "IQR/med", "timings", "x T(1)")
    body = [_cost_row(n, c.target[n], spreads.get(n), t1) for n in sorted(c.target)]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = [f"  {sc.suite} ({sc.n_context} ctx):", *(_right(cells, widths) for cells in (head, *body))]
    extra = _draft_and_rollback(sc, t1)
    if extra:
        lines.append("    " + " | ".join(extra))
    if sc.loads:
        averages = ", ".join("?" if x.average is None else f"{x.average:.1f}" for x in sc.loads)
        lines.append(f"    load average (1 min) at measurement: {averages} on {sc.loads[0].cpus} CPUs")
    verdict = sc.verdict
    lines += [f"    WARNING: timings unreliable: {r}" for r in verdict.reasons]
    lines += [f"    note: {x}" for x in verdict.notes]
    return lines


def _right(cells: tuple[str, ...], widths: list[int]) -> str:
    return "    " + "  ".join(x.rjust(w) for x, w in zip(cells, widths))


def _cost_row(n: int, median: float, s: Spread | None, t1: float) -> tuple[str, ...]:
    rng = "-" if s is None else f"{s.low * 1e3:.1f}-{s.high * 1e3:.1f}ms"
    spread = "-" if s is None or s.count < 2 else f"{s.iqr_ratio:.0%}"
    return (str(n), f"{median * 1e3:.1f}ms", rng, spread, str(s.count if s else 0), f"{median / t1:.2f}x")


def _draft_and_rollback(sc: SuiteCosts, t1: float) -> list[str]:
    c, out = sc.costs, []
    if c.draft_token:
        d = sc.samples.draft_spread()
        rng = "" if d is None else f", {d.low * 1e3:.1f}-{d.high * 1e3:.1f}ms, IQR/med {d.iqr_ratio:.0%}"
        out.append(f"draft {c.draft_token * 1e3:.1f} ms/token ({c.draft_token / t1:.2f}x of target{rng})")
    if c.rollback_round:
        k = max(c.target) - 1
        out.append(f"rollback after a rejection (k={k}) {c.rollback_round * 1e3:.2f}ms ({c.rollback_round / t1:.2f}x)")
    return out


def bound_line(sc: SuiteCosts | None) -> str | None:
    """Why a suite's table shows no bound, or None when it shows one."""
    if sc is None or sc.verdict.reliable:
        return None
    return f"bound: not shown, timings unreliable ({'; '.join(sc.verdict.reasons)})"


def _fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def suite_table(result: BenchResult, suite: str, rows: list[Row]) -> list[str]:
    rows = [r for r in rows if r.suite == suite]
    grammar = any(r.grammar_ms is not None for r in rows)  # a structured suite: the matcher's cost per token too
    head = (
        "method",
        "tok/s",
        "spread",
        "speedup",
        "accept",
        "len",
        "bound",
        "of bound",
        "verify/round",
        "rollback",
        *(("grammar/tok",) if grammar else ()),
        "accept by position / auto chose",
    )
    body = []
    for r in rows:
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
                *((_grammar_cell(r),) if grammar else ()),
                tail or "-",
            )
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    last = len(head) - 1
    fmt = lambda cells: "  ".join(
        c.ljust(w) if i in (0, last) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )
    sc = result.costs.get(suite)
    title = f"suite {suite}" + (f" ({sc.n_context} tokens of context in its first prompt)" if sc else "")
    why = bound_line(sc)
    case = result.cases.get(suite)
    if case:
        title += f": {case}"
    gains = [
        f"the memory's own gain: {r.method} {r.memory_gain:.2f}x the same without it (median per repetition)"
        for r in rows
        if r.memory_gain is not None
    ]
    note = gains + (
        [
            "grammar/tok: the grammar matcher's time per generated token (masks of every verified row, consumes, "
            "rollbacks), and its share of decode time"
        ]
        if grammar
        else []
    )
    return [title, fmt(head), *(fmt(b) for b in body), *([why] if why else []), *note]


def _grammar_cell(r: Row) -> str:
    if r.grammar_ms is None:
        return "-"
    return f"{r.grammar_ms:.2f}ms" + ("" if r.grammar_share is None else f" {r.grammar_share:.0%}")


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
        f"The bound is not shown where the cost timings spread over {MAX_SPREAD:.0%} (IQR/median) or the curve",
        f"is implausible (T(n) under {MIN_BATCH_RATIO:g}x T(1), or a batch over {MAX_INVERSION:g}x a larger one):",
        "a busy machine; rerun on an idle one, or with more --cost-reps.",
    ]
    return lines
