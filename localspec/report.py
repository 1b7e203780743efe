"""Human-readable summaries of a run's stats, and the advice users need when speculation loses."""

from __future__ import annotations

from localspec.backends.registry import backend_label
from localspec.decoding.stats import SpecStats
from localspec.families import registry
from localspec.formatting import plural

POOR_MATCH_LENGTH = (
    2.0  # below ~2 tokens per round the draft is a poor match: a round costs more than it returns on CPUs
)


def advice(stats: SpecStats) -> str | None:
    """What the user should change, when the numbers say speculation is not paying."""
    if stats.draft_method == "none" or stats.n_rounds < 4:
        return None
    if stats.draft_method == "auto":  # it adapts by itself; say plainly when speculation did not pay here
        plain = 1 - stats.drafting_share
        # Long copies write many tokens in few rounds: a run can be mostly plain rounds and still mostly drafts.
        from_drafts = stats.n_accepted / stats.n_generated if stats.n_generated else 0.0
        if plain < 0.5 or from_drafts >= 0.5:
            return None
        wrote = f" (drafts wrote {from_drafts:.0%} of the text)" if stats.n_accepted else ""
        return (
            f"auto decoded {plain:.0%} of rounds without drafts{wrote}: there, on this machine and text, speculation "
            "was measured not to pay. `localspec bench` shows why; `localspec doctor` checks the setup."
        )
    if stats.mean_accepted_length < POOR_MATCH_LENGTH:
        if not is_lookup(stats.draft_method):  # a draft model or a head
            return (
                f"the draft is a poor match for this target: {stats.mean_accepted_length:.2f} tokens per round "
                f"(below {POOR_MATCH_LENGTH:.0f}). A better-matched draft helps; a larger k does not. "
                "Compare with --draft-method none."
            )
        if stats.draft_method == "suffix" and stats.n_drafted == 0:
            return (
                "no suffix draft was worth proposing: the text did not repeat earlier text of this session at "
                "length. Suffix drafts pay on text that repeats (code edits, files re-emitted, quoting)."
            )
        kind = "suffix" if stats.draft_method == "suffix" else "n-gram"
        return (
            f"{kind} drafts rarely matched ({stats.acceptance_rate:.0%} accepted, "
            f"{stats.mean_accepted_length:.2f} tokens per round): lookup drafts pay on text that repeats its "
            "input (code edits, quoting). Compare with --draft-method none."
        )
    return None


def summary_lines(stats: SpecStats) -> list[str]:
    method = stats.draft_method if stats.draft_method != "model" else f"model ({stats.draft})"
    k = f"k={stats.num_draft}" if stats.draft_method != "auto" else f"k<={stats.num_draft}"
    decode = (
        f"decode {stats.decode_tps:.2f} tok/s ({plural(stats.n_generated, 'token')}, {stats.decode_s:.2f} s)"
        if stats.decode_tokens
        else f"{plural(stats.n_generated, 'token')} (no decode speed: only the prompt pass ran)"
    )
    lines = [
        f"{backend_label(stats.backend)} on {stats.device} | target {stats.target} | draft {method} | "
        f"rule {stats.rule} | {k} | seed {stats.seed}",
        f"{decode} | prompt {stats.prompt_tps:.1f} tok/s ({plural(stats.n_prompt, 'token')}, "
        f"{stats.n_prompt_cached} cached) | stop: {(stats.stop_reason or 'running').replace('_', ' ')}",
    ]
    if stats.draft_method != "none" and stats.n_rounds:
        parts = [
            f"acceptance {stats.acceptance_rate:.1%}",
            f"mean accepted length {stats.mean_accepted_length:.2f} tokens/round over {plural(stats.n_rounds, 'round')}",
        ]
        if stats.acceptance_by_position:
            parts.append("by position " + " ".join(f"{a:.0%}" for a in stats.acceptance_by_position))
        busy = stats.draft_s + stats.verify_s
        if busy > 0:
            parts.append(f"draft {stats.draft_s / busy:.0%} / verify {stats.verify_s / busy:.0%}")
        if stats.draft_method == "auto":
            parts.append(f"auto chose {stats.choices()}")
        lines.append(" | ".join(parts))
    tip = advice(stats)
    if tip:
        lines.append(f"note: {tip}")
    return lines


def is_lookup(method: str) -> bool:
    """Whether a draft method's drafts are lookups (the family's word; a method no family has is not one)."""
    return any(f.name == method and f.lookup for f in registry.families())
