"""Prometheus metrics of one server, named like vLLM's (`vllm:` becomes `localspec:`), so dashboards
built for vLLM's speculative decoding read them with a prefix change."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from localspec.decoding.parallel_decoder import PassStats
from localspec.decoding.stats import SpecStats

PREFIX = "localspec:"


class Metrics:
    """The counters and gauges, in their own registry (several servers may share a process in tests)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.running = Gauge(f"{PREFIX}num_requests_running", "Generations running now (up to --parallel).", registry=r)
        self.waiting = Gauge(f"{PREFIX}num_requests_waiting", "Requests waiting in the queue.", registry=r)
        self.success = Counter(f"{PREFIX}request_success", "Finished generations by finish reason.",
                               ["finished_reason"], registry=r)  # fmt: skip
        self.errors = Counter(f"{PREFIX}request_errors", "Requests answered with an error, by HTTP status.",
                              ["status"], registry=r)  # fmt: skip
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens", "Prompt tokens of finished generations.", registry=r)
        self.cached_tokens = Counter(f"{PREFIX}prompt_tokens_cached", "Prompt tokens reused from the KV cache.",
                                     registry=r)  # fmt: skip
        self.generation_tokens = Counter(f"{PREFIX}generation_tokens", "Generated tokens.", registry=r)
        self.drafts = Counter(f"{PREFIX}spec_decode_num_drafts", "Rounds that verified a draft.", registry=r)
        self.draft_tokens = Counter(f"{PREFIX}spec_decode_num_draft_tokens", "Drafted tokens.", registry=r)
        self.accepted_tokens = Counter(f"{PREFIX}spec_decode_num_accepted_tokens", "Accepted draft tokens.",
                                       registry=r)  # fmt: skip
        self.accepted_per_pos = Counter(f"{PREFIX}spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens by position in the draft (0 first).",
                                        ["position"], registry=r)  # fmt: skip
        self.drafted_per_pos = Counter(f"{PREFIX}spec_decode_num_draft_tokens_per_pos",
                                       "Drafted tokens by position in the draft (0 first).",
                                       ["position"], registry=r)  # fmt: skip

        # serve --parallel: what each shared target pass held
        self.batch_size = Gauge(f"{PREFIX}batch_sequences", "Sequences in the last shared target pass.", registry=r)
        self.pass_sequences = Histogram(f"{PREFIX}batch_sequences_per_pass", "Sequences per shared target pass.",
                                        buckets=(1, 2, 3, 4, 6, 8, 12, 16), registry=r)  # fmt: skip
        self.pass_tokens = Counter(f"{PREFIX}batch_tokens", "Tokens in shared target passes (next tokens and drafts).",
                                   registry=r)  # fmt: skip
        self.pass_draft_tokens = Counter(f"{PREFIX}batch_draft_tokens",
                                         "Draft tokens in shared target passes (their share of batch_tokens is the "
                                         "share of the passes spent on drafts).", registry=r)  # fmt: skip

    def passed(self, p: PassStats) -> None:
        """One shared target pass of the parallel scheduler."""
        self.batch_size.set(p.n_sequences)
        self.pass_sequences.observe(p.n_sequences)
        self.pass_tokens.inc(p.n_tokens)
        self.pass_draft_tokens.inc(p.n_drafted)

    def finished(self, stats: SpecStats, finish_reason: str) -> None:
        self.success.labels("abort" if finish_reason == "cancelled" else finish_reason).inc()  # vLLM's label
        self.prompt_tokens.inc(stats.n_prompt)
        self.cached_tokens.inc(stats.n_prompt_cached)
        self.generation_tokens.inc(stats.n_generated)
        self.drafts.inc(stats.drafted_by_position[0] if stats.drafted_by_position else 0)
        self.draft_tokens.inc(stats.n_drafted)
        self.accepted_tokens.inc(stats.n_accepted)
        for pos, (d, a) in enumerate(zip(stats.drafted_by_position, stats.accepted_by_position)):
            self.drafted_per_pos.labels(str(pos)).inc(d)
            self.accepted_per_pos.labels(str(pos)).inc(a)

    def error(self, status: int) -> None:
        self.errors.labels(str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
