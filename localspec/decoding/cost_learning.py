"""auto's cost curve: where T(n) comes from, how the rounds refine and test it, and when it is stored.

No fixed cost, and no stall: the cost curve comes from the on-disk cache (localspec.decoding.cost_cache)
when this pair was measured on this machine before. Without one, an answer never stops to calibrate: it
learns the curve from its own rounds (localspec.decoding.live_costs: every verify pass times T(n) at the
size it verified, a plain round times T(1), per context length), starting from a prior slope that lets
lookup drafts and short model probes pay where a flat (GPU-like) curve makes them pay. Timing passes that
need filler run only where nobody waits (idle_step: serve between requests, chat between turns), in
pieces of one pair each, and feed the same curve. A learnt curve is stored once it is consistent (enough
timings, plausible, not spread like a busy machine's); a busy machine's is used for the answer and said.

A curve from the cache is a hypothesis: pairs of neighbouring rounds (one a 1-token pass, one a batch)
test it (cost_cache.CurveCheck), and where the rounds do not form such pairs by themselves (a run that
decodes plainly throughout, or drafts throughout) a check round makes one now and then: a draft of one
token in a plain run (the lookup's next one where it has one), paid for from CHECK_SHARE (1%) of the plain
rounds' time, and a plain round in a drafting one, from EXPLORE of the drafting rounds' time. Checks back off
while the curve holds: the store keeps how many pairs in a row held, over the runs, and a curve that held is
checked only on credit saved up first (twice as much for each pair that held), so a trusted curve costs a short
plain answer nothing. A curve the rounds contradict is dropped from the cache and learnt afresh from the rounds.

CostLearner holds all of that for one AutoDrafter, which keeps the choice of drafter and length: it asks the
learner for the curve at this context length (`at_context`), how long a draft may be while learning
(`draft_cap`), whether this round is a check round (`steer`, `check_draft`), and tells it each round's timings
(`pace` before the policy sees them, `observe` after). The learner writes into the policy's CostModel.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from localspec.backends.base import Backend
from localspec.decoding.calibrate import PairedRun
from localspec.decoding.cost_cache import CHECK_PAIRS, CONTRADICTION, CostStore, CurveCheck
from localspec.decoding.live_costs import MIN_RATIOS, LiveCurve, context_bucket
from localspec.decoding.policy import EXPLORE, MAX_BACKOFF, Controller, CostModel, Plan
from localspec.decoding.stats import RoundStats
from localspec.draft import Draft

CALIBRATION_SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32)  # batch sizes timed in idle time (plus the top one)
CALIBRATION_REPS = 3  # pairs per batch size: their median outlasts one pair that a busy spell split
IDLE_TOP = 33  # the top size timed in idle time before any answer said its k (auto's default k + 1)
IDLE_TRIES = 3  # idle calibrations per drafter at most (a machine too busy to measure stays so for a while)
SAVE_EVERY = 16  # rounds between writes of a learnt curve
CHECK_SHARE = 0.01  # checks of a remembered curve may cost at most this share of plain rounds' time
FILLER = "The quick brown fox jumps over the lazy dog. " * 2  # idle timing on an empty cache needs a context


class CostLearner:
    """The cost curve of one auto drafter: remembered (and checked) or learnt from its rounds and idle time.

    `initial` is the curve the policy starts from: `costs` as given, else the store's, else None (learn it).
    """

    def __init__(
        self,
        *,
        target: Backend | None = None,
        costs: CostModel | None = None,
        store: CostStore | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target = target
        self.store = store
        self.clock = clock
        from_store = costs is None and store is not None
        if costs is None and store is not None:
            costs = store.load()
        self.initial = costs
        # Only a remembered curve is checked (a learnt one is the rounds' own medians).
        self.check = CurveCheck(dict(costs.target)) if from_store and costs is not None else None
        self.live = LiveCurve()  # the curve as this process's rounds (and idle pairs) time it
        # No remembered curve: learn it from the rounds (never a calibration inside an answer).
        self.learning = costs is None and target is not None
        self.max_k = 0  # the longest draft the current generation may ask for
        self.checking = False  # this round is a check round
        self._since_save = SAVE_EVERY  # rounds since a learnt curve was last written (the first is written at once)
        self._prev_plain: float | None = None  # the last round's seconds if it was a 1-token pass at this length
        self._lookup_probes = 0  # lookup probes in a row while learning (each costs twice the last, up to 2**5)
        self._busy_said = False  # a busy machine's curve, not stored, said once an answer
        self._idle_run: PairedRun | None = None
        self._idle_tries = 0
        self._idle_later = False  # the last idle calibration found the machine busy: again after the next answer
        self._context = 0  # this round's context length (the cost curve depends on it)
        self._live_due = False  # while learning: the policy's costs are to become the live curve at _context
        # A remembered curve's pace per context bucket (attention grows with the context): restored when an
        # answer comes back to a length seen before; a length not seen yet takes its pace from its first round.
        self._bucket: int | None = None
        self._bucket_scale: dict[int, float] = {}
        self._fresh_bucket = False
        self._check_credit = 0.0  # seconds check rounds may still cost (a share of the rounds' time)
        # Pairs in a row that agreed with the curve, this run's and (from the store) the runs' before: checks back off.
        self._checks_agreed = min(store.held(), MAX_BACKOFF) if self.check is not None and store is not None else 0
        self._note = ""  # what became of the costs, said once in the next round's note

    # -- a generation's rounds ----------------------------------------------------------------------

    def new_generation(self, max_k: int) -> None:
        self.max_k = max_k
        if self.check is not None:
            self.check.new_generation()
        self._busy_said = False
        self._idle_later = False
        self._prev_plain = None

    def at_context(self, n: int, costs: CostModel) -> None:
        """This round's context length: `costs` (the policy's) become the curve at that length (while learning, when
        the policy next reads them: `for_policy`; a plain round with nothing to weigh never does)."""
        self._context = n
        if self.learning:
            self._live_due = True
        else:
            self._enter_bucket(context_bucket(n), costs)

    def for_policy(self, costs: CostModel) -> None:
        """Before the policy reads `costs` this round: while learning, the live curve at this round's length."""
        if self.learning and self._live_due:
            self._use_live(self._context, costs)
            self._live_due = False

    def draft_cap(self, k: int) -> int:
        """The longest draft the policy may plan this round: k, less while learning (see _explore_k)."""
        return min(k, self._explore_k()) if self.learning else k

    def steer(self, plan: Plan, k: int, lookup: int) -> Plan:
        """The policy's plan, or the check round that replaces it (see _check_due); `lookup`: the lookup draft's
        length this round."""
        if self.learning and plan.method != "none":
            self._lookup_probes = 0
        self.checking = self._check_due(plan, k, lookup)
        if self.checking and self.learning and plan.method == "none":
            # Plain decoding wins on a learnt curve: a short lookup draft right after a plain round times a batch
            # in a pair, so a curve that a busy spell made steep is corrected (paid from EXPLORE, backing off).
            self._lookup_probes += 1
            return Plan("ngram", min(lookup, 2), plan.rate, plan.plain_rate, plan.alpha, probe=True)
        if self.checking:
            return Plan("none", 0, plan.plain_rate, plan.plain_rate)
        return plan

    def slope_is_prior(self) -> bool:
        """Whether the curve's growth is still mostly the prior's (learning, fewer than MIN_RATIOS batches timed)."""
        return self.learning and sum(len(rs) for rs in self.live.ratios.values()) < MIN_RATIOS

    def check_draft(self, context: Sequence[int], lookup: Draft) -> Draft:
        """A check round's draft (steer said this round checks and the plan drafts nothing)."""
        if self.learning:
            return Draft([], None, "auto: plain, to time T(1) for the cost curve")
        assert self.check is not None and self.check.last is not None
        if self.check.last[0] > 1:
            return Draft([], None, "auto: plain, to check T(1) against the remembered costs")
        # The cheapest batch: one token drafted, the lookup's next one where it has one (the check then pays for
        # itself when it holds), else the last one again (verified like any draft, so harmless).
        guess = lookup.tokens[:1] or [int(context[-1])]
        return Draft(list(guess), None, "auto: check T(2) against the remembered costs", "check")

    def take_note(self) -> str:
        """What became of the costs since the last round (said once), or ""."""
        note, self._note = self._note, ""
        return note

    def pace(self, stats: RoundStats, costs: CostModel) -> None:
        """Before the policy sees the round: the first round at a context length not seen yet sets its pace."""
        if self._fresh_bucket and not self.learning:
            self._first_at_length(stats.n_drafted + 1, stats.verify_s - stats.rollback_s, costs)

    def observe(self, stats: RoundStats, controller: Controller) -> None:
        """After the policy saw the round: its verify pass into the curve, and the remembered curve tested."""
        self._learn(stats.n_drafted + 1, stats.verify_s - stats.rollback_s, controller)
        self._check_curve(stats)
        self.checking = False

    def save(self, controller: Controller) -> None:
        """Remember the costs: a learnt curve once it is consistent, a remembered one as the rounds refined it."""
        if self.store is None:
            return
        costs = controller.costs
        draft = costs.draft_s() if controller.draft_settled else None
        if self.learning:
            if self.live.storable():
                return
            self._since_save = 0
            self.store.save(CostModel(target=self.live.stored_curve(), draft_token=draft))
            return
        held = self._checks_agreed if self.check is not None else 0
        self.store.save(replace(costs.copy(), draft_token=None if draft is None else costs.draft_token), held=held)

    # -- idle time (serve between requests, chat between turns) -------------------------------------

    def timing_due(self) -> bool:
        """Whether timing passes are still wanted where nobody waits (no trusted curve yet)."""
        if not self.learning or self.target is None:
            return False
        return self._idle_run is not None or (self._idle_tries < IDLE_TRIES and not self._idle_later)

    def idle_step(self, controller: Controller) -> bool:
        """One piece of calibration (one pair of forward passes) on the target's cache, which it leaves as it
        found it; run only where nobody waits. True while more pieces are wanted."""
        if not self.timing_due():
            return False
        target = self.target
        assert target is not None
        if not target.cached_tokens:  # a server just started: time on a short filler context
            target.forward(target.tokenize(FILLER, add_special=True, parse_special=False), all_logits=False)
        if self._idle_run is None:
            self._idle_tries += 1
            top = max(self.max_k + 1, IDLE_TOP)
            sizes = [n for n in CALIBRATION_SIZES if n < top] + [top]
            self._idle_run = PairedRun(target, sizes, reps=CALIBRATION_REPS, clock=self.clock)
        run = self._idle_run
        if run.step() and run.last is not None:
            n, t1, tn = run.last
            self.live.add_pair(len(target.cached_tokens), t1, n, tn)
            return True
        self._idle_run = None
        if self.live.storable():
            self._idle_later = True
        else:
            self._idle_tries = IDLE_TRIES  # measured: nothing more to do where nobody waits
            self.save(controller)
        return False

    # -- learning ---------------------------------------------------------------------------------

    def _learn(self, n: int, seconds: float, controller: Controller) -> None:
        """One round's verify pass into the live curve; a learnt curve written now and then, when consistent."""
        if n == 1:
            self.live.add_plain(self._context, seconds)
        else:
            self.live.add_batch(self._context, n, seconds, paired=self._prev_plain)
        self._prev_plain = seconds if n == 1 else None
        if not self.learning:
            return
        self._since_save += 1
        why = self.live.storable()
        if not why and self._since_save >= SAVE_EVERY:
            self.save(controller)
        elif why.startswith("machine too busy") and not self._busy_said:
            self._busy_said = True
            self._note = _join(self._note, f"auto: costs not stored: {why}; the rounds go on measuring")

    def _explore_k(self) -> int:
        """While learning, drafts grow by doubling past the largest batch timed: the prior's slope is a guess,
        and at a long context on a CPU a batch of 33 can cost 29 single-token passes (seen at 8.7k tokens)."""
        timed = max(self.live.ratios, default=1)
        return max(2, 2 * (timed - 1))

    def _use_live(self, context: int, costs: CostModel) -> None:
        """While learning: the costs at this context length as the rounds (and idle pairs) timed them."""
        curve = self.live.curve(context, max(self.max_k, 1) + 1)
        costs.target = {n: t / costs.scale for n, t in curve.items()}

    # -- checking a remembered curve --------------------------------------------------------------

    def _check_due(self, plan: Plan, k: int, lookup: int = 0) -> bool:
        """Whether this round should check the remembered curve: make the round the other kind (a batch
        after a 1-token pass, or a 1-token pass after a batch) than the last, while the allowance lasts. While
        learning, whether a drafting round should be a plain one instead, to time T(1) at this length, or a
        plain one a short lookup draft (when there is one), to time a batch in a pair with the round before."""
        if k <= 0 or self._check_credit < 0:
            return False
        if self.learning:  # a run that drafts throughout times T(1) now and then: every ratio rests on it
            paid = plan.plain_rate > 0 and self._check_credit * plan.plain_rate >= 1.0  # a whole T(1) saved up
            if plan.method == "none":
                return paid and lookup > 0 and self._prev_plain is not None
            return paid and not plan.probe and self.live.wants_t1(self._context)
        last = self.check.last if self.check is not None else None
        return last is not None and (plan.method == "none") == (last[0] == 1) and self._check_paid(plan, lookup)

    def _check_paid(self, plan: Plan, lookup: int) -> bool:
        """Whether the allowance covers a check now. A curve that has held is checked only on credit saved up (its
        price, backed off); one not yet held may overdraw once where the check can pay for itself (the lookup's
        next token) or the run drafts (a wrong curve costs most there), so a wrong curve is caught early while a
        plain answer with nothing to copy never pays more than CHECK_SHARE for checks."""
        if self._checks_agreed == 0 and (lookup > 0 or plan.method != "none"):
            return True
        return self._check_credit >= self._check_price() * 2 ** min(self._checks_agreed, MAX_BACKOFF)

    def _check_price(self) -> float:
        """What a check round costs over the round it replaces, in seconds, by the curve's shape and the last
        round's time: a batch of 2 for a 1-token pass in a plain run, a whole plain round where the run drafts."""
        assert self.check is not None and self.check.last is not None
        n, seconds = self.check.last
        t1 = seconds / self.check.ratio(n)  # this round's T(1), by the curve
        return max(self.check.ratio(2) - 1.0, 0.0) * t1 if n == 1 else t1

    def _check_curve(self, stats: RoundStats) -> None:
        """Test the remembered curve against this round, pay for a check round; drop a contradicted curve."""
        seconds = stats.verify_s - stats.rollback_s
        if self.check is None:
            # Learning: a round timed for the curve costs at most itself, from EXPLORE of the rounds' time; lookup
            # probes that keep finding plain decoding ahead cost twice as much each time.
            backoff = 2 ** min(self._lookup_probes, MAX_BACKOFF) if stats.n_drafted else 1
            self._check_credit += -seconds * backoff if self.checking else EXPLORE * seconds
            return
        before = self.check.last
        deviation = self.check.observe(stats.n_drafted + 1, seconds)
        if self.checking and before is not None:
            # What the check cost over the round it replaced: the batch's extra seconds in a plain run, less a
            # plain round for a token it drafted and got accepted; a whole plain round (at most) where the run
            # drafts. It backs off while the curve holds.
            cost = seconds - before[1] * (1 + stats.n_accepted) if stats.n_drafted else seconds
            self._check_credit -= max(cost, 0.0) * 2 ** min(self._checks_agreed, MAX_BACKOFF)
        else:  # a plain answer (auto cannot help there) pays CHECK_SHARE for its checks; a drafting one EXPLORE
            self._check_credit += (EXPLORE if stats.n_drafted else CHECK_SHARE) * seconds
        if deviation is not None:
            held = 1 / CONTRADICTION <= deviation <= CONTRADICTION
            self._checks_agreed = self._checks_agreed + 1 if held else 0
        if self.check.contradicted:
            self._drop_curve(self.check.deviation or 0.0)

    def _drop_curve(self, deviation: float) -> None:
        why = f"T(n)/T(1) {deviation:.2g}x its own over {CHECK_PAIRS} pairs of rounds"
        self._note = f"auto: remembered costs contradicted by live rounds ({why}): dropped, learning afresh"
        self.check = None
        if self.store is not None:
            self.store.drop()
        self.learning = self.target is not None  # learnt afresh from the rounds (and idle pairs)
        self._since_save = SAVE_EVERY

    # -- a remembered curve's pace per context length ----------------------------------------------

    def _enter_bucket(self, bucket: int, costs: CostModel) -> None:
        if bucket == self._bucket:
            return
        if self._bucket is not None:
            self._bucket_scale[self._bucket] = costs.scale
        self._bucket = bucket
        known = self._bucket_scale.get(bucket)
        if known is not None:
            costs.scale = known
        self._fresh_bucket = known is None

    def _first_at_length(self, n: int, seconds: float, costs: CostModel) -> None:
        """The first round at a context length not seen yet sets the pace outright (the common factor's slow
        average would take some twenty rounds to follow an 8k prompt's doubled T(1)), within 4x either way."""
        self._fresh_bucket = False
        predicted = costs.target_s(n)
        if seconds > 0 and predicted > 0 and not np.isnan(predicted):
            costs.scale *= min(max(seconds / predicted, 0.25), 4.0)


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)
