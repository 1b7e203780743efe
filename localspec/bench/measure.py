"""Measure: the hardware's cost curve, then every method on every suite, repeated and interleaved.

Each repetition runs every (prompt, method) pair once, in an order rotated from one repetition to the
next, so that slow spells on a shared machine hit all methods alike. Speedups are taken per
repetition (method / plain decoding, both from the same repetition) and their median reported.

The analytic bound for a method with fixed k is what the hardware allows for the acceptance that
method actually reached: expected tokens per round over the cost of a round,

    bound tokens/s = (accepted + rounds) / sum over rounds of (drafted_r * d + T(drafted_r + 1))

with T(n) the target's measured time for a batch of n tokens and d the draft's time per token
(zero for n-gram lookup), and the bound speedup is that times T(1). Achieved / bound shows how much
the engine leaves on the table around the two models. Where the cost timings spread widely or form a
curve no machine has (localspec.bench.costs), no bound is given.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from localspec.backends.base import Backend, ChatMessage
from localspec.bench.costs import CostSamples, Load, Verdict, current_load, judge, keeping
from localspec.bench.suites import Suite
from localspec.decoding.calibrate import time_drafter, time_rollback, time_target_paired
from localspec.decoding.cost_cache import CostStore
from localspec.decoding.drafters import Drafter, ModelDrafter
from localspec.decoding.engine import Done, GenerationConfig
from localspec.decoding.policy import CostModel
from localspec.decoding.stats import SpecStats, format_choices
from localspec.decoding.suffix_memory import SuffixMemory
from localspec.errors import UsageError
from localspec.families import registry
from localspec.families.base import DrafterFamily
from localspec.options import MAX_K, default_k
from localspec.pipeline import Pipeline
from localspec.sampling import SamplingParams


@dataclass(frozen=True)
class Method:
    method: str  # a drafter family's name (localspec.families.registry)
    k: int  # draft length (auto: the most it may choose)
    memory: bool = False  # with the suffix memory of the prompt's first answer (the `memory` case)

    @property
    def label(self) -> str:
        fam = registry.family(self.method)
        if fam.plain:
            return self.method
        label = f"{self.method} k<={self.k}" if fam.accepts_draft else f"{self.method} k={self.k}"
        return label + (" +memory" if self.memory else "")

    @property
    def reads_memory(self) -> bool:
        """Whether its drafter can read a suffix memory (auto's and the suffix lookup's)."""
        return self.method in MEMORY_METHODS


def parse_methods(
    spec: str, *, has_draft: bool, explicit: bool = True, heads: dict[str, str] | None = None
) -> list[Method]:
    """`none,ngram:4,suffix:32,model:2,model:4,auto:32,eagle3:4` -> methods; plain decoding is always
    included (the baseline).

    Methods that need a draft model are refused without one when the user named them (explicit), and left
    out of the default list. `heads`: for each head family, "" when it can run on the given files, else why
    not (registry.head_fits); a head family that cannot run is refused with that reason when named, and
    left out of the default list."""
    heads = heads or {}
    baseline = next(f.name for f in registry.families() if f.plain)
    out: list[Method] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, k = part.partition(":")
        if name not in registry.names():
            raise UsageError(
                f"unknown method {name!r} in --methods",
                "use " + ", ".join(n if registry.family(n).plain else f"{n}:K" for n in registry.names()),
            )
        fam = registry.family(name)
        try:
            kk = int(k) if k else default_k(name)
        except ValueError:
            raise UsageError(f"bad draft length in {part!r}", "write e.g. model:4") from None
        if not fam.plain and not 1 <= kk <= MAX_K:
            raise UsageError(f"draft length {kk} in {part!r} is outside 1..{MAX_K}", "write e.g. model:4")
        why = _cannot_run(fam, has_draft, heads)
        if why and not explicit:
            continue
        if why:
            raise UsageError(f"--methods asks for {part}, which cannot run here: {why}", _leave_out_hint(fam))
        out.append(Method(name, 0 if fam.plain else kk))
    if Method(baseline, 0) not in out:
        out.insert(0, Method(baseline, 0))
    return list(dict.fromkeys(out))


def _cannot_run(fam: DrafterFamily, has_draft: bool, heads: dict[str, str]) -> str:
    if fam.needs == "draft_model" and not has_draft:
        return "no draft model was given"
    if fam.is_head:
        return heads.get(fam.name, "no head was given")
    return ""


def _leave_out_hint(fam: DrafterFamily) -> str:
    if fam.is_head:
        return f"pass the {fam.name} head as --draft HEAD.gguf (made for this target), or leave {fam.name} out of --methods"
    return f"pass --draft PATH (or --pair NAME), or leave the {fam.name} methods out of --methods"


MEMORY_METHODS = ("auto", "suffix")  # the families whose drafters read a suffix memory (families/auto.py, lookup.py)


def with_memory(methods: Sequence[Method]) -> list[Method]:
    """The methods, each one that reads a suffix memory followed by itself with the memory."""
    out = []
    for m in methods:
        out += [m, replace(m, memory=True)] if m.reads_memory and not m.memory else [m]
    return out


@dataclass
class RunResult:
    suite: str
    prompt: int
    method: str
    rep: int
    stats: SpecStats
    drafted_per_round: dict[int, int]  # n_drafted -> rounds
    turn: int = 0  # session suites: the turn of the conversation


@dataclass
class SuiteCosts:
    suite: str
    n_context: int
    costs: CostModel  # the median of each cost over all its timings (every repetition's)
    per_rep: list[CostModel] = field(default_factory=list)  # each repetition's medians
    samples: CostSamples = field(default_factory=CostSamples)  # every timing, pooled over repetitions
    loads: list[Load] = field(default_factory=list)  # the machine's load at each repetition's measurement

    def add(self, measured: CostSamples, load: Load | None = None) -> None:
        if load is not None:
            self.loads.append(load)
        self.per_rep.append(measured.model())
        self.samples.extend(measured)
        self.costs = self.samples.model()

    @property
    def verdict(self) -> Verdict:
        """Whether these timings can carry the analytic bound (localspec.bench.costs)."""
        return judge(self.costs.target, self.samples, self.loads)

    def to_json(self) -> dict[str, Any]:
        return {
            "n_context": self.n_context,
            **self.costs.as_dict(),
            "per_rep": [x.as_dict() for x in self.per_rep],
            "timings": self.samples.to_json(),
            "load": [x.to_json() for x in self.loads],
            **self.verdict.to_json(),
        }


@dataclass
class BenchResult:
    target: str
    draft: str | None
    backend: str
    device: str
    threads: int | None
    max_tokens: int
    reps: int
    temperature: float
    methods: list[Method]
    suites: list[str]
    cases: dict[str, str] = field(default_factory=dict)  # suite -> what its case holds fixed (bench's cases)
    costs: dict[str, SuiteCosts] = field(default_factory=dict)
    runs: list[RunResult] = field(default_factory=list)
    wall_s: float = 0.0
    interrupted: bool = False  # stopped early (Ctrl-C): the tables cover the runs that finished

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "draft": self.draft,
            "backend": self.backend,
            "device": self.device,
            "threads": self.threads,
            "max_tokens": self.max_tokens,
            "reps": self.reps,
            "temperature": self.temperature,
            "methods": [m.label for m in self.methods],
            "suites": self.suites,
            "cases": self.cases,
            "wall_s": self.wall_s,
            "interrupted": self.interrupted,
            "costs": {s: c.to_json() for s, c in self.costs.items()},
            "runs": [{**asdict(r), "stats": r.stats.to_dict()} for r in self.runs],
            "summary": [asdict(row) for row in summarize(self)],
        }


def measure_costs(
    target: Backend,
    draft: Backend | None,
    prompt: Sequence[int],
    *,
    max_batch: int,
    reps: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> CostSamples:
    """Timings of T(n) and of the draft's seconds per token, on a cache holding `prompt` (realistic
    attention): every n up to 9, then the sizes long drafts use (12, 16, 24, 32 and the top), the rest
    interpolated. Each size is timed `reps` times, each time right after a 1-token pass (kept as a T(1)
    timing), cycling through the sizes, so that a busy spell slows T(1) and T(n) alike."""
    target.rollback(0)
    target.forward(list(prompt), all_logits=False)
    sizes = [n for n in (*range(2, 10), 12, 16, 24, 32) if n < max_batch] + [max(max_batch, 1)]
    out = CostSamples.of_pairs(time_target_paired(target, sizes, reps=reps, clock=clock))
    if target.info.is_recurrent:  # a KV cache is cut in microseconds: not worth the passes
        time_rollback(target, max_batch - 1, reps=reps, clock=clock, stat=keeping(out.rollback))
    if draft is not None:
        tokens = max(2, min(max_batch, 4))
        time_drafter(
            ModelDrafter(draft), prompt, tokens_per_draft=tokens, reps=reps, clock=clock, stat=keeping(out.draft_token)
        )
    return out


def run_bench(
    pipeline: Pipeline,
    suites: Sequence[Suite],
    methods: Sequence[Method],
    *,
    reps: int,
    max_tokens: int,
    sampling: SamplingParams,
    n_prompts: int | None = None,
    threads: int | None = None,
    progress: Callable[[str], None] = lambda s: None,
    cost_reps: int = 5,
) -> BenchResult:
    """Every method on every suite over the pipeline's loaded models, each run as `localspec run` makes it:
    the pipeline's chat format, a fresh drafter from Pipeline.new_drafter (auto with the pipeline's
    remembered costs; a head family loading the --draft head afresh), the pipeline's generate."""
    t_start = time.perf_counter()
    target, head = pipeline.target, pipeline.options.draft if pipeline.draft is None else None
    result = BenchResult(
        target=target.info.name,
        draft=pipeline.draft.info.name if pipeline.draft else (Path(head).name if head else None),
        backend=target.info.backend,
        device=target.info.device,
        threads=threads,
        max_tokens=max_tokens,
        reps=reps,
        temperature=sampling.temperature,
        methods=with_memory(methods) if any(s.again for s in suites) else list(methods),
        suites=[s.name for s in suites],
        cases={s.name: s.description for s in suites if s.costs != "user" or s.again},
    )
    try:
        with tempfile.TemporaryDirectory(prefix="localspec-bench-") as tmp:
            cases = _Cases(pipeline, Path(tmp))
            _measure_all(
                pipeline, suites, methods, result, reps, max_tokens, sampling, n_prompts, progress, cost_reps, cases
            )
    except KeyboardInterrupt:
        result.interrupted = True
        progress("interrupted: reporting the runs that finished")
    result.wall_s = time.perf_counter() - t_start
    return result


def _measure_all(
    pipeline: Pipeline,
    suites: Sequence[Suite],
    methods: Sequence[Method],
    result: BenchResult,
    reps: int,
    max_tokens: int,
    sampling: SamplingParams,
    n_prompts: int | None,
    progress: Callable[[str], None],
    cost_reps: int,
    cases: _Cases,
) -> None:
    k_top = max([m.k for m in methods] + [1])
    prompts: dict[str, list[list[int]]] = {}
    for suite in suites:
        chosen = suite.prompts[: n_prompts or len(suite.prompts)]
        # A session's first turn stands for it where one prompt is needed (the cost curve's context).
        prompts[suite.name] = [pipeline.prompt_tokens(list(msgs[:1] if suite.session else msgs)) for msgs in chosen]
    n_total = reps * sum(len(prompts[s.name]) * len(_methods(methods, s)) for s in suites)
    done_n = 0
    t0 = time.perf_counter()
    for rep in range(reps):
        for suite in suites:
            # The cost curve is measured in every repetition too (all timings pooled, localspec.bench.costs), so
            # that a busy spell during one measurement does not decide the bound, or shows in its spread.
            first = prompts[suite.name][0]
            progress(f"measuring costs on {suite.name} ({len(first)} tokens of context)")
            load = current_load()  # before the timing passes add this process's own threads to it
            measured = measure_costs(
                pipeline.target, pipeline.draft, first, max_batch=k_top + 1, reps=cost_reps, clock=pipeline.clock
            )
            if suite.name not in result.costs:
                result.costs[suite.name] = SuiteCosts(suite.name, len(first), measured.model())
            result.costs[suite.name].add(measured, load)
            cases.measured(suite, result.costs[suite.name].costs)
            if suite.again and rep == 0:
                progress(f"answering {suite.name}'s prompts once into a fresh suffix memory (not measured)")
                cases.remember(suite, prompts[suite.name], max_tokens, sampling)
            for pi, prompt in enumerate(prompts[suite.name]):
                order = _methods(methods, suite)
                shift = (rep + pi) % len(order)
                order = order[shift:] + order[:shift]  # rotate: no method always runs first or last
                for m in order:
                    done_n += 1
                    progress(
                        f"[{done_n}/{n_total}] rep {rep + 1} {suite.name} #{pi + 1} {m.label} "
                        f"({time.perf_counter() - t0:.0f} s)"
                    )
                    # A fresh drafter per run (a session: per conversation), as `localspec run` (`chat`) builds one.
                    drafter = cases.drafter(suite, m)
                    config = GenerationConfig(
                        max_tokens=max_tokens, num_draft=m.k, sampling=sampling, grammar=suite.grammar(pi)
                    )
                    try:
                        if suite.session:
                            history: list[ChatMessage] = []
                            for turn, message in enumerate(suite.prompts[pi]):
                                history.append(message)
                                run, text = _one_run(pipeline, drafter, pipeline.prompt_tokens(history), config)
                                result.runs.append(
                                    replace(run, suite=suite.name, prompt=pi, method=m.label, rep=rep, turn=turn)
                                )
                                history.append(ChatMessage("assistant", text))
                        else:
                            run, _ = _one_run(pipeline, drafter, prompt, config)
                            result.runs.append(replace(run, suite=suite.name, prompt=pi, method=m.label, rep=rep))
                    finally:
                        drafter.close()


def _methods(methods: Sequence[Method], suite: Suite) -> list[Method]:
    return with_memory(methods) if suite.again else list(methods)


class _Cases:
    """auto's remembered costs and the suffix memory for bench's cases (suites.CASES), in a directory of their own:
    the user's cache and memory are neither read nor written."""

    def __init__(self, pipeline: Pipeline, root: Path) -> None:
        self.pipeline = pipeline
        self.root = root
        self._memories: dict[str, SuffixMemory] = {}

    def store(self, suite: Suite) -> CostStore | None:
        """Where auto's costs live in this suite's runs (None: the user's cache, as `localspec run` reads it)."""
        return None if suite.costs == "user" else replace(self.pipeline.cost_store, root=self.root / suite.name)

    def measured(self, suite: Suite, costs: CostModel) -> None:
        """A warm case remembers the curve bench measured on its suite (as a returning user's runs would)."""
        store = self.store(suite)
        if suite.costs == "warm" and store is not None:
            store.save(costs)

    def memory(self, suite: Suite) -> SuffixMemory:
        if suite.name not in self._memories:
            vocab = self.pipeline.target.vocab_info
            self._memories[suite.name] = SuffixMemory(vocab, root=self.root / f"{suite.name}-memory")
        return self._memories[suite.name]

    def remember(self, suite: Suite, prompts: Sequence[list[int]], max_tokens: int, sampling: SamplingParams) -> None:
        """Each prompt answered once (plain decoding: the target's own answer), prompt and answer remembered."""
        memory = self.memory(suite)
        plain = next(f.name for f in registry.families() if f.plain)
        config = GenerationConfig(max_tokens=max_tokens, num_draft=0, sampling=sampling)
        for prompt in prompts:
            drafter = self.pipeline.new_drafter(plain)
            try:
                *_, done = self.pipeline.generate(prompt, config, drafter=drafter)
            finally:
                drafter.close()
            assert isinstance(done, Done)
            memory.remember([*prompt, *done.tokens])

    def drafter(self, suite: Suite, m: Method) -> Drafter:
        """A fresh drafter for one run: a cold case's auto finds nothing remembered (it learns, as a first run);
        `m.memory`: the suite's memory, read as a new session reads it."""
        store = self.store(suite)
        if store is not None and suite.costs == "cold":
            store.drop()
        memory = self.memory(suite) if m.memory else None
        return self.pipeline.new_drafter(m.method, store=store, memory=memory)


def _one_run(
    pipeline: Pipeline, drafter: Drafter, prompt: list[int], config: GenerationConfig
) -> tuple[RunResult, str]:
    """One generation; the RunResult's labels are filled in by the caller."""
    per_round: Counter[int] = Counter()
    done: Done | None = None
    for ev in pipeline.generate(prompt, config, drafter=drafter):
        if isinstance(ev, Done):
            done = ev
        elif ev.round is not None:
            per_round[ev.round.n_drafted] += 1
    assert done is not None
    run = RunResult(suite="", prompt=0, method="", rep=0, stats=done.stats, drafted_per_round=dict(per_round))
    return run, done.text


# -- aggregation -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    suite: str
    method: str
    tps_median: float
    tps_min: float
    tps_max: float
    speedup: float  # median over repetitions of (method tok/s / plain tok/s) from the same repetition
    acceptance: float | None
    mean_accepted_length: float
    acceptance_by_position: tuple[float, ...]
    bound_speedup: float | None  # what the measured costs allow for the measured acceptance (None: unreliable)
    of_bound: float | None  # speedup / bound_speedup
    decisions: str = ""
    verify_ms: float = 0.0  # target time per round (verify pass and rollback)
    rollback_ms: float = 0.0  # ... of which cutting the target back (a recurrent model restores its state)
    grammar_ms: float | None = None  # the grammar matcher's time per generated token (None: no grammar)
    grammar_share: float | None = None  # ... as a share of decode time
    memory_gain: float | None = None  # a +memory method: median per repetition of its tok/s over the same without


def summarize(result: BenchResult) -> list[Row]:
    rows: list[Row] = []
    for suite in result.suites:
        if suite not in result.costs:
            continue
        costs, reliable = result.costs[suite].costs, result.costs[suite].verdict.reliable
        plain = _per_rep_tps(result, suite, "none")
        for m in result.methods:
            runs = [r for r in result.runs if r.suite == suite and r.method == m.label]
            if not runs:
                continue
            tps = _per_rep_tps(result, suite, m.label)
            vals = list(tps.values())
            speed = [tps[rep] / plain[rep] for rep in tps if plain.get(rep)]
            n_drafted = sum(r.stats.n_drafted for r in runs)
            n_accepted = sum(r.stats.n_accepted for r in runs)
            n_rounds = sum(r.stats.n_rounds for r in runs)
            by_d = _sum_tuples([r.stats.drafted_by_position for r in runs])
            by_a = _sum_tuples([r.stats.accepted_by_position for r in runs])
            # No bound from timings that cannot be trusted (bench prints why instead).
            bound = _bound_speedup(runs, costs, m) if reliable and _fixed_drafts(m.method) else None
            speedup = statistics.median(speed) if speed else 0.0
            gain = _memory_gain(result, suite, m, tps) if m.memory else None
            decisions = Counter[str]()
            for r in runs:
                for src in r.stats.sources:
                    decisions[src.source] += src.rounds
            rows.append(
                Row(
                    suite=suite,
                    method=m.label,
                    tps_median=statistics.median(vals) if vals else 0.0,
                    tps_min=min(vals, default=0.0),
                    tps_max=max(vals, default=0.0),
                    speedup=speedup,
                    acceptance=n_accepted / n_drafted if n_drafted else None,
                    mean_accepted_length=sum(r.stats.decode_tokens for r in runs) / n_rounds
                    if n_rounds
                    else 0.0,  # as SpecStats
                    acceptance_by_position=tuple(a / d if d else 0.0 for a, d in zip(by_a, by_d)),
                    bound_speedup=bound,
                    of_bound=speedup / bound if bound else None,
                    decisions=format_choices(dict(decisions)),
                    verify_ms=1e3 * sum(r.stats.verify_s for r in runs) / n_rounds if n_rounds else 0.0,
                    rollback_ms=1e3 * sum(r.stats.rollback_s for r in runs) / n_rounds if n_rounds else 0.0,
                    **_grammar_cost(runs),
                    memory_gain=gain,
                )
            )
    return rows


def _memory_gain(result: BenchResult, suite: str, m: Method, tps: dict[int, float]) -> float | None:
    """The memory's own gain: per repetition, the method with the memory over the same without it; the median."""
    without = _per_rep_tps(result, suite, replace(m, memory=False).label)
    ratios = [tps[rep] / without[rep] for rep in tps if without.get(rep)]
    return statistics.median(ratios) if ratios else None


def _grammar_cost(runs: Sequence[RunResult]) -> dict[str, float | None]:
    """The grammar matcher's time per generated token and its share of decode time (None without a grammar)."""
    if not any(r.stats.grammar_masks for r in runs):
        return {}
    spent = sum(r.stats.grammar_s for r in runs)
    tokens = sum(r.stats.n_generated for r in runs)
    decode = sum(r.stats.decode_s for r in runs)
    return {"grammar_ms": 1e3 * spent / tokens if tokens else 0.0, "grammar_share": spent / decode if decode else None}


def _fixed_drafts(method: str) -> bool:
    """A method whose drafts the bound can cost: a draft model's or lookup's (not auto's choice, not a head's)."""
    fam = registry.family(method)
    return not fam.plain and not fam.is_head and not fam.accepts_draft


def _per_rep_tps(result: BenchResult, suite: str, label: str) -> dict[int, float]:
    """Suite-level tokens/s per repetition: all the suite's prompts' decode tokens over their decode time."""
    out: dict[int, float] = {}
    for rep in range(result.reps):
        runs = [r for r in result.runs if r.suite == suite and r.method == label and r.rep == rep]
        t = sum(r.stats.decode_s for r in runs)
        if runs and t > 0:
            out[rep] = sum(r.stats.decode_tokens for r in runs) / t
    return out


def _bound_speedup(runs: Sequence[RunResult], costs: CostModel, m: Method) -> float | None:
    t1 = costs.target_s(1)
    d = (costs.draft_token or 0.0) if registry.family(m.method).needs == "draft_model" else 0.0
    round_s = 0.0
    n_rounds = n_accepted = 0
    for r in runs:
        for n_drafted, count in r.drafted_per_round.items():
            round_s += count * (n_drafted * d + costs.target_s(n_drafted + 1))
        round_s += r.stats.rollback_s  # cutting the target back (a hybrid model restores its state)
        n_rounds += r.stats.n_rounds
        n_accepted += r.stats.n_accepted
    if not round_s or not t1:
        return None
    return (n_accepted + n_rounds) / round_s * t1


def _sum_tuples(rows: Sequence[Sequence[int]]) -> tuple[int, ...]:
    width = max((len(r) for r in rows), default=0)
    return tuple(sum(r[i] for r in rows if i < len(r)) for i in range(width))
