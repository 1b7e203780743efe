"""Human-readable summaries of a run's stats, and the advice users need when speculation loses."""

from __future__ import annotations

from localspec.spec.stats import SpecStats

POOR_MATCH_LENGTH = 2.0  # below ~2 tokens per round the draft is a poor match (DESIGN.md)


def advice(stats: SpecStats) -> str | None:
    """What the user should change, when the numbers say speculation is not paying."""
    if stats.draft_method == "none" or stats.n_rounds < 4:
        return None
    if stats.draft_method == "auto":  # it adapts by itself; say plainly when speculation did not pay here
        spec_rounds = stats.drafted_by_position[0] if stats.drafted_by_position else 0
        plain = 1 - spec_rounds / stats.n_rounds
        if plain < 0.5:
            return None
        return (
            f"auto decoded {plain:.0%} of rounds without drafts: on this machine and text speculation was "
            "measured not to pay. `localspec bench` shows why; `localspec doctor` checks the setup."
        )
    if stats.mean_accepted_length < POOR_MATCH_LENGTH:
        if stats.draft_method == "model":
            return (
                f"the draft is a poor match for this target: {stats.mean_accepted_length:.2f} tokens per round "
                f"(below {POOR_MATCH_LENGTH:.0f}). A better-matched draft helps; a larger k does not. "
                "Compare with --draft-method none."
            )
        return (
            f"n-gram drafts rarely matched ({stats.acceptance_rate:.0%} accepted, "
            f"{stats.mean_accepted_length:.2f} tokens per round): prompt lookup pays on text that repeats its "
            "input (code edits, quoting). Compare with --draft-method none."
        )
    return None


def summary_lines(stats: SpecStats) -> list[str]:
    method = stats.draft_method if stats.draft_method != "model" else f"model ({stats.draft})"
    lines = [
        f"{stats.backend} on {stats.device} | target {stats.target} | draft {method} | "
        f"rule {stats.rule} | k={stats.num_draft} | seed {stats.seed}",
        f"decode {stats.decode_tps:.2f} tok/s ({stats.n_generated} tokens, {stats.decode_s:.2f} s) | "
        f"prompt {stats.prompt_tps:.1f} tok/s ({stats.n_prompt} tokens, {stats.n_prompt_cached} cached) | "
        f"stop: {stats.stop_reason}",
    ]
    if stats.draft_method != "none":
        by_pos = " ".join(f"{a:.0%}" for a in stats.acceptance_by_position) or "-"
        busy = stats.draft_s + stats.verify_s
        share = f"draft {stats.draft_s / busy:.0%} / verify {stats.verify_s / busy:.0%}" if busy > 0 else ""
        lines.append(
            f"acceptance {stats.acceptance_rate:.1%} | mean accepted length {stats.mean_accepted_length:.2f} "
            f"tokens/round over {stats.n_rounds} rounds | by position {by_pos} | {share}"
        )
    tip = advice(stats)
    if tip:
        lines.append(f"note: {tip}")
    return lines
