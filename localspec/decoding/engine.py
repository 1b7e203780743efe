"""The speculative decoding loop: prefill, then rounds of draft, verify, accept, roll back, emit.

`generate` yields events: one `Step` per round (new text split by who chose it, its tokens and their
origins, the round's stats and a running SpecStats snapshot) and a final `Done` with the run's
SpecStats. Consumers (CLI, TUI, bench, server) render these and recompute nothing. Plain decoding is
the same loop with a drafter that proposes nothing, so every comparison runs through identical code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Literal, cast

import numpy as np

from localspec.backends.base import Backend, Detokenizer, DrawsInPass, TopTwo, sync_cache, sync_cache_top2
from localspec.backends.registry import draws_in_pass, picks_top2
from localspec.decoding import verify
from localspec.decoding.drafters import Drafter
from localspec.decoding.grammar import Constraint, GrammarSpec, apply_mask, mask_q
from localspec.decoding.stats import NEAR_TIE_GAP, NearTie, RoundStats, SpecStats, StatsCollector, StopReason
from localspec.draft import Draft
from localspec.errors import ContextOverflowError, Interrupted, UsageError
from localspec.sampling import SamplingParams, greedy_rows
from localspec.softmax_rows import DrawnRow, SoftmaxRows

Origin = Literal["draft", "target"]  # accepted draft token, or a token the target chose itself
Segment = tuple[str, Origin]  # a run of text whose tokens share one origin


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 256
    num_draft: int = 4
    rule: str = "exact"
    sampling: SamplingParams = field(default_factory=SamplingParams)
    grammar: GrammarSpec | None = None  # keep the output inside it (the target masked, renormalised)

    def __post_init__(self) -> None:
        if self.rule not in verify.RULES:
            raise UsageError(f"unknown verification rule {self.rule!r}", f"choose one of: {', '.join(verify.RULES)}")
        if self.num_draft < 0:
            raise UsageError(f"number of draft tokens must be >= 0, got {self.num_draft}", "try -k 4")
        if self.max_tokens < 1:
            raise UsageError(f"max tokens must be >= 1, got {self.max_tokens}", "try --max-tokens 256")


@dataclass(frozen=True)
class Step:
    segments: tuple[Segment, ...]  # the new text, split into runs of one origin (empty runs left out)
    tokens: tuple[int, ...]
    origins: tuple[Origin, ...]
    round: RoundStats | None  # None for the first token (from the prompt pass) and the final UTF-8 flush
    stats: SpecStats  # the run so far (stop_reason None until Done)

    @property
    def text(self) -> str:
        """Newly decoded text (may be empty while a UTF-8 character is incomplete)."""
        return "".join(s for s, _ in self.segments)


@dataclass(frozen=True)
class Done:
    text: str  # the whole generated text
    tokens: tuple[int, ...]
    stats: SpecStats


Event = Step | Done


@dataclass(frozen=True)
class Draws:
    """A verify pass's rows as one token each, drawn where the model runs (DrawsInPass.forward_draws; the rows'
    softmax stays with the backend, DrawsInPass.drawn_probs)."""

    tokens: list[int]


@dataclass(frozen=True)
class _Pending:
    """A round between its draft and the target's verdict."""

    draft: Draft
    masks: np.ndarray | None
    k: int
    t0: float  # drafting began
    t1: float  # drafting ended
    n_before: int  # tokens the target's cache held before the verify batch
    batch: list[int]  # [last, d1..dk] (see _verify_batch)
    ends: bool = False  # the draft completes the grammar: accepted whole, the answer ends after it


def generate(
    target: Backend,
    drafter: Drafter,
    prompt: Sequence[int],
    config: GenerationConfig,
    *,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.perf_counter,
    on_phase: Callable[[str], None] | None = None,
) -> Iterator[Event]:
    """Generate from `prompt` (token ids). The output is distributed as the target's own sampling.

    `stop` ends the run after the current round. A backend abort (Backend.abort, from another thread)
    ends it at once: the round in flight is dropped, and Done says "stopped". `on_phase` hears what the
    run does before its first token: "prompt" (reading the prompt), then "drafter" (preparing the drafter).
    """
    return Run(target, drafter, prompt, config, stop, clock, on_phase).events()


class Run:
    """One sequence's generation: `events()` is the whole loop; its parts (begin, next_round, draft, settle,
    emit, finish) let a shared pass (decoding/parallel_decoder.py) drive several runs at once."""

    def __init__(
        self,
        target: Backend,
        drafter: Drafter,
        prompt: Sequence[int],
        config: GenerationConfig,
        stop: threading.Event | None,
        clock: Callable[[], float],
        on_phase: Callable[[str], None] | None = None,
    ) -> None:
        if not prompt:
            raise UsageError("the prompt is empty", "give the model some text to continue")
        if len(prompt) >= target.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(prompt):,} tokens but the context holds {target.n_ctx:,}",
                "raise --n-ctx (memory permitting) or shorten the prompt",
            )
        self.target = target
        self.recurrent = target.info.is_recurrent
        self.drafter = drafter
        self.prompt = list(prompt)
        self.config = config
        self.sampling = config.sampling
        self.stop = stop
        self.clock = clock
        self.on_phase = on_phase or (lambda phase: None)
        self.seed = config.sampling.seed if config.sampling.seed is not None else _fresh_seed()
        self.rng = np.random.default_rng(self.seed)
        self.context: list[int] = list(prompt)  # every committed token: prompt + generated
        self.near_ties: list[NearTie] = []
        self._ties: tuple[NearTie, ...] = ()  # near_ties as the stats hand it out
        self.pending_ties: list[tuple[int, int, int, float]] = []  # (offset, token, runner-up, gap) of the next emit
        self.generated: list[int] = []
        self.detok: Detokenizer = target.detokenizer()
        self.text_parts: list[str] = []
        self.collector = StatsCollector()
        self.eog = target.eog_ids
        self.prompt_s = 0.0
        self.n_cached = 0
        self.t_decode: float | None = 0.0  # clock when decoding started (after the prompt pass; None: it never did)
        self.constraint = Constraint(target, config.grammar) if config.grammar is not None else None
        # A greedy round reads only each row's best two tokens, where the backend picks them on its device: no
        # whole row reaches the host. A grammar masks whole rows, so it reads them.
        self.top2 = config.sampling.greedy and self.constraint is None and picks_top2(target)
        # A sampled round reads one token a row, drawn where the model runs, and the few numbers of each row's
        # softmax the rule needs, which the backend hands over beside the draw (no pass over a row on the host). A
        # one-hot draft (a lookup's, or none) needs only the draws: accepting while the draw equals the draft token
        # is the exact rule for it (p(d) to keep it; else the draw, which is p without d, the residual). A model's
        # draft is graded by p(d) / q(d), and the row's draw is the residual's first proposal (verify._recover).
        # Plain temperature only (filters and grammars shape whole rows).
        self.draws = config.sampling.plain_temperature and self.constraint is None and draws_in_pass(target)

    # -- the loop ---------------------------------------------------------------------------------

    def events(self) -> Iterator[Event]:
        reason = yield from self.begin()
        while reason is None:
            reason, k = self.next_round()
            if reason is not None:
                break
            try:
                pending = self.draft(k)
                step = self.settle(pending, self._target_pass(pending), pending.t1)
            except Interrupted:
                self.drop_round()
                reason = "stopped"
                break
            reason = yield from self._emit(*step)
        yield from self.finish(reason)

    # -- the loop's parts (decoding/parallel_decoder.py drives several runs through them in one pass) ------

    def begin(self) -> Iterator[Event]:
        """Read the prompt and emit the first token; return why the run already ends (None: it goes on)."""
        t0 = self.clock()
        try:
            n_cached, first = self._prefill()
        except Interrupted:
            self.prompt_s = self.clock() - t0
            self.t_decode = None
            return "stopped"
        self.t_decode = self.clock()
        self.prompt_s, self.n_cached = self.t_decode - t0, n_cached
        return (yield from self._emit([first], ["target"], None))

    def next_round(self) -> tuple[StopReason | None, int]:
        """(why the run ends now, or None; the longest draft the next round may have)."""
        if self.stop is not None and self.stop.is_set():
            return "stopped", 0
        k = self._draft_budget()
        return ("context", 0) if k < 0 else (None, k)

    def drop_round(self) -> None:
        """The round in flight is dropped whole (an abort). A recurrent model may need a forward pass for that,
        which the abort stops too: its cache then holds a shorter prefix, which is as good."""
        with suppress(Interrupted):
            self.target.rollback(len(self.context) - 1)

    def emit(self, step: tuple[list[int], list[Origin], RoundStats]) -> Iterator[Event]:
        return self._emit(*step)

    def finish(self, reason: StopReason | None) -> Iterator[Event]:
        if self.t_decode is None:  # stopped while reading the prompt
            yield Done("", (), self._stats("stopped", 0.0))
            return
        decode_s = self.clock() - self.t_decode
        tail = self.detok.flush()
        if tail:
            self.text_parts.append(tail)
            yield Step(((tail, "target"),), (), (), None, self._stats(None, decode_s))
        yield Done("".join(self.text_parts), tuple(self.generated), self._stats(reason, decode_s))

    def _prefill(self) -> tuple[int, int]:
        """Fill both caches with the prompt (reusing any cached prefix); return (reused, first token)."""
        self.on_phase("prompt")
        synced = sync_cache_top2(self.target, self.prompt, logits=True) if self.top2 else None  # type: ignore[arg-type]
        if synced is not None:  # the first token from the picks too: the backend stays on them
            keep, picks = synced
            assert picks is not None
            first = int(picks.best[-1])
            self.pending_ties = picks.near_ties(1, NEAR_TIE_GAP)
        else:
            self.top2 = False
            keep, logits = sync_cache(self.target, self.prompt, logits=True)
            assert logits is not None
            if self.constraint is not None:
                logits = apply_mask(logits, self.constraint.mask())
            first = self._sample_one(logits)
            if self.constraint is not None:
                self.constraint.advance(first)
        self.on_phase("drafter")
        self.drafter.prepare(self.prompt, self.config.num_draft)
        return keep, first

    def draft(self, k: int) -> _Pending:
        """Draft up to k tokens (the grammar cuts them); the batch the target must verify."""
        t0 = self.clock()
        draft = self.drafter.propose(self.context, k, self.sampling, self.rng) if k > 0 else Draft([], None)
        masks = None
        if self.constraint is not None:
            draft, masks = self._constrain(draft)
        ends = self.constraint is not None and self.constraint.finished  # the walk stopped after the kept draft
        t1 = self.clock()
        n_before = len(self.target.cached_tokens)
        return _Pending(draft, masks, k, t0, t1, n_before, self._verify_batch(draft.tokens), ends)

    def settle(
        self, pending: _Pending, logits: np.ndarray | TopTwo | Draws, t_verify: float
    ) -> tuple[list[int], list[Origin], RoundStats]:
        """Grade the draft against the target's rows (`logits`, [k+1, V] or fewer; or only their best two tokens,
        TopTwo, in a greedy round without a grammar; or one token drawn a row, Draws, in a sampled round with a
        one-hot draft) with the rule, roll the cache back to the accepted prefix; the round's tokens. `t_verify`:
        when the target's pass began."""
        draft, masks = pending.draft, pending.masks
        if masks is not None:
            assert isinstance(logits, np.ndarray)
            logits = apply_mask(logits, masks)
        if pending.ends and len(logits) > len(draft.tokens):
            assert isinstance(logits, np.ndarray)
            logits[len(draft.tokens)] = self._end_row(logits.shape[1])
        verdict = self._verify(draft, logits, masks)  # greedy: notes the emitted rows' near-ties too
        if self.constraint is not None:
            self.constraint.commit(verdict.n_accepted, verdict.token)
        # Only a recurrent state costs anything to cut back (a KV cache drops positions in microseconds).
        t_rollback = self.clock() if self.recurrent else 0.0
        self.target.rollback(pending.n_before + 1 + verdict.n_accepted)
        t2 = self.clock()
        tokens = [*draft.tokens[: verdict.n_accepted], verdict.token]
        origins: list[Origin] = ["draft"] * verdict.n_accepted + ["target"]
        stats = RoundStats(
            index=self.collector.n_rounds,
            n_drafted=len(draft.tokens),
            n_accepted=verdict.n_accepted,
            n_emitted=len(tokens),
            draft_s=pending.t1 - pending.t0,
            verify_s=t2 - t_verify,
            kind=verdict.kind,
            k=pending.k,
            note=draft.note,
            source=draft.source if draft.tokens else "none",
            rollback_s=t2 - t_rollback if self.recurrent else 0.0,
        )
        return tokens, origins, stats

    def _target_pass(self, pending: _Pending) -> np.ndarray | TopTwo | Draws:
        """The target's verify pass: its picks where it makes them (self.top2), its draws where a sampled round
        can use them (self.draws), else its rows."""
        batch = pending.batch
        if self.top2:
            picks = self.target.forward_top2(batch)  # type: ignore[attr-defined]
            if picks is not None:
                return picks
            self.top2 = False  # this build cannot: rows from now on
        q = pending.draft.q
        if self.draws and (q is None or q.shape[1] == self.target.n_vocab):
            probs = q is not None and self.config.rule != "match"  # (_verify_draws: else the draws alone are read)
            target = cast(DrawsInPass, self.target)
            draws = target.forward_draws(batch, self.sampling.temperature, self.rng, probs=probs)
            if draws is not None:
                return Draws(draws)
        self.draws = False  # a build that cannot (or a draft vocabulary of another width): rows from now on
        return self.target.forward(batch)

    def _verify_batch(self, draft: list[int]) -> list[int]:
        """[last, d1..dk], cut before the first draft token outside the target's vocabulary.

        Such a token has p = 0, so it is surely rejected: the rows up to it suffice to grade it and
        draw the recovered token from max(0, p - q), and the target never sees an id it cannot embed.
        """
        batch = [self.context[-1], *draft]
        for i, t in enumerate(draft):
            if t >= self.target.n_vocab:
                return batch[: i + 1]
        return batch

    def _constrain(self, draft: Draft) -> tuple[Draft, np.ndarray]:
        """The grammar's masks for the rows to verify; the draft cut before its first forbidden token (the
        matcher is left after the kept draft)."""
        assert self.constraint is not None
        masks, m = self.constraint.walk(draft.tokens)
        if m < len(draft.tokens):
            q = draft.q[:m] if draft.q is not None and m > 0 else None
            note = draft.note or f"grammar cut the draft at position {m + 1}"
            draft = replace(draft, tokens=draft.tokens[:m], q=q, note=note)
        return draft, masks

    def _end_row(self, width: int) -> np.ndarray:
        """The row after drafts that complete the grammar: an end token, surely. Plain decoding draws nothing after
        the token that completes it; here the rule's bonus (all accepted) is that end, which _emit cuts, never a
        draw from the masked row, which holds no possible token when the target gives its end tokens none."""
        row = np.full(width, -np.inf, dtype=np.float32)
        row[min(self.eog)] = 0.0
        return row

    def _verify(
        self, draft: Draft, logits: np.ndarray | TopTwo | Draws, masks: np.ndarray | None = None
    ) -> verify.Verdict:
        if isinstance(logits, Draws):  # sampled: the draws, and for a model's draft the rows' few numbers it needs
            verdict = self._verify_draws(draft, logits.tokens)
            # The draws of the rows up to the verdict's may have shaped it: their randomness is used up.
            cast(DrawsInPass, self.target).commit_draws([*draft.tokens[: verdict.n_accepted], verdict.token])
            return verdict
        if isinstance(logits, TopTwo):  # greedy: the picks hold the verdict and the near-ties
            verdict = verify.verify_greedy(draft.tokens, logits.best)
            self.pending_ties = logits.near_ties(verdict.n_accepted + 1, NEAR_TIE_GAP)
            return verdict
        if self.sampling.greedy:  # the rows up to the first rejection, each while it is in the cache
            best, self.pending_ties = greedy_rows(logits, draft.tokens, NEAR_TIE_GAP)
            return verify.verify_greedy(draft.tokens, best)
        self.pending_ties = []
        p: verify.Probs = SoftmaxRows.of_logits(logits, self.sampling, draft.tokens)  # read as far as the rule needs
        q = draft.q
        if q is not None and masks is not None:
            q = mask_q(np.asarray(q), masks)  # the kept draft tokens are drawn from q restricted to the grammar
        if q is not None and q.shape[1] != p.shape[1]:
            p, q = _same_width(np.asarray(p), np.asarray(q))
        return verify.RULES[self.config.rule](draft.tokens, q, p, self.rng)

    def _verify_draws(self, draft: Draft, draws: list[int]) -> verify.Verdict:
        """A sampled round's verdict from the target's draws: a one-hot draft's (or the match rule's) by the draws
        alone; a model draft's by the exact rule over rows that read p(d) from the backend's softmax and whose
        first draw is the backend's."""
        if draft.q is None or self.config.rule == "match":
            return verify.verify_samples(draft.tokens, draws)
        target = cast(DrawsInPass, self.target)
        p = SoftmaxRows(len(draws), self.target.n_vocab, lambda i: DrawnRow(target.drawn_probs(i), draws[i]))
        return verify.verify_exact(draft.tokens, draft.q, p, self.rng)

    def _emit(self, tokens: list[int], origins: list[Origin], stats: RoundStats | None) -> Iterator[Event]:
        """Commit tokens up to the first end-of-generation token or the token limit; yield them."""
        reason: StopReason | None = None
        cut = len(tokens)
        for i, t in enumerate(tokens):
            if t in self.eog:
                cut, reason = i, "eog"
                break
        if reason is None and self.constraint is not None and self.constraint.finished:
            reason = "eog"  # the grammar is complete and can take nothing more
        room = self.config.max_tokens - len(self.generated)
        if cut > room or (cut == room and reason is None):
            cut, reason = room, "max_tokens"
        tokens, origins = tokens[:cut], origins[:cut]
        if stats is not None:
            if cut != stats.n_emitted:
                stats = replace(stats, n_emitted=cut)
            self.collector.add(stats)
            self.drafter.observe(stats)
        start = len(self.generated)
        if self.pending_ties:
            self.near_ties += [NearTie(start + i, t, r, g) for i, t, r, g in self.pending_ties if i < cut]
            self._ties = tuple(self.near_ties)  # the snapshots' copy, made when it grows (not every round)
        self.pending_ties = []
        self.generated += tokens
        self.context += tokens
        segments = self._segments(tokens, origins)
        self.text_parts += [s for s, _ in segments]
        yield Step(
            segments, tuple(tokens), tuple(origins), stats, self._stats(None, self.clock() - (self.t_decode or 0.0))
        )
        return reason

    def _segments(self, tokens: list[int], origins: list[Origin]) -> tuple[Segment, ...]:
        """Decode tokens run by run of equal origin, so the text can be coloured by who chose each token."""
        out: list[Segment] = []
        i = 0
        while i < len(tokens):
            j = i
            while j < len(tokens) and origins[j] == origins[i]:
                j += 1
            text = self.detok.add(tokens[i:j])
            if text:
                out.append((text, origins[i]))
            i = j
        return tuple(out)

    # -- helpers ----------------------------------------------------------------------------------

    def _draft_budget(self) -> int:
        """Draft length for this round: k, less near the token limit or the end of the context."""
        room_ctx = self.target.n_ctx - len(self.target.cached_tokens) - 1  # the verify pass adds k+1
        room_out = self.config.max_tokens - len(self.generated) - 1
        if room_ctx < 0:
            return -1
        return max(0, min(self.config.num_draft, room_ctx, room_out))

    def _sample_one(self, logits: np.ndarray) -> int:
        if self.sampling.greedy:
            best, self.pending_ties = greedy_rows(logits, (), NEAR_TIE_GAP)
            return best[0]
        return SoftmaxRows.of_logits(logits, self.sampling).row(0).sample(self.rng)

    def _stats(self, reason: StopReason | None, decode_s: float) -> SpecStats:
        info = self.target.info
        return SpecStats(
            backend=info.backend,
            device=info.device,
            target=info.name,
            draft=self.drafter.name,
            draft_method=self.drafter.method,
            rule="greedy" if self.sampling.greedy else self.config.rule,
            num_draft=self.config.num_draft if self.drafter.method != "none" else 0,
            temperature=self.sampling.temperature,
            seed=self.seed,
            n_prompt=len(self.prompt),
            n_prompt_cached=self.n_cached,
            prompt_s=self.prompt_s,
            n_generated=len(self.generated),
            decode_s=decode_s,
            stop_reason=reason,
            near_ties=self._ties,
            grammar_s=self.constraint.busy_s if self.constraint is not None else 0.0,
            grammar_masks=self.constraint.n_masks if self.constraint is not None else 0,
            **self.collector.totals(),
        )


def _same_width(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pad p [k+1, Vp] and q [k, Vq] with zeros to one width (vocabularies may differ by padding)."""
    width = max(p.shape[1], q.shape[1])
    return (np.pad(p, ((0, 0), (0, width - p.shape[1]))), np.pad(q, ((0, 0), (0, width - q.shape[1]))))


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().entropy % (2**31))
