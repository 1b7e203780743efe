"""`localspec bench` and `localspec doctor` on fakes: the matrix, the aggregation, the analytic bound,
the tables, and doctor's rules on scripted facts. No timing assertions: costs come from a fake clock
or are scripted."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from fakes import CostedBackend, FakeBackend, FakeClock, hashed_logits, without

from localspec.backends.base import Backend, ChatMessage
from localspec.bench.measure import (
    BenchResult,
    Method,
    RunResult,
    SuiteCosts,
    parse_methods,
    run_bench,
    summarize,
)
from localspec.bench.report import bench_lines
from localspec.bench.suites import Suite, suites
from localspec.commands.doctor import Facts, findings
from localspec.decoding.policy import CostModel
from localspec.decoding.stats import SpecStats
from localspec.errors import UsageError
from localspec.options import ModelOptions
from localspec.pipeline import DraftSlot, Pipeline, make_drafter
from localspec.sampling import SamplingParams

TARGET = without(hashed_logits(1))


@pytest.fixture(autouse=True)
def _own_cost_dir(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """auto keeps what it measures: in this test's folder, not the user's cache."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Bench on fakes times a fake clock: the real machine's load (shared cores) must not decide the verdicts
    tested here (tests/test_measurement_load.py tests what a high load does)."""
    from localspec.bench import measure
    from localspec.bench.costs import Load

    monkeypatch.setattr(measure, "current_load", lambda: Load(0.0, 2))


def _over(target: Backend, draft: Backend | None = None, clock: Callable[[], float] = time.perf_counter) -> Pipeline:
    """A pipeline over loaded fakes, as load_pipeline makes one over real models (bench runs through it)."""
    method = "model" if draft is not None else "none"
    opts = ModelOptions(
        target=f"/fake/{target.info.name}", draft=draft and f"/fake/{draft.info.name}", draft_method=method
    )
    drafter = make_drafter(method, target, draft, clock=clock)
    return Pipeline(opts, "fake", target, DraftSlot.holding(draft), drafter, clock=clock)


def test_parse_methods() -> None:
    ms = parse_methods("ngram:4, model:2,auto:6", has_draft=True)
    assert ms == [Method("none", 0), Method("ngram", 4), Method("model", 2), Method("auto", 6)]
    assert [m.label for m in ms] == ["none", "ngram k=4", "model k=2", "auto k<=6"]
    # Without a draft model the default list leaves model methods out; naming one is refused, not skipped.
    assert Method("model", 4) not in parse_methods("none,model:4,ngram", has_draft=False, explicit=False)
    with pytest.raises(UsageError, match="no draft model"):
        parse_methods("none,model:4,ngram", has_draft=False)
    with pytest.raises(UsageError):
        parse_methods("magic:3", has_draft=True)
    with pytest.raises(UsageError, match="outside 1..64"):
        parse_methods("ngram:1000", has_draft=True)
    assert parse_methods("suffix,auto", has_draft=False) == [
        Method("none", 0),
        Method("suffix", 32),
        Method("auto", 32),
    ]


def test_parse_methods_with_heads() -> None:
    heads = {"eagle3": "", "mtp": "this target has no MTP layers", "dflash": "not driven", "dspark": "not driven"}
    ms = parse_methods("eagle3:3,ngram:2", has_draft=False, heads=heads)
    assert ms == [Method("none", 0), Method("eagle3", 3), Method("ngram", 2)] and ms[1].label == "eagle3 k=3"
    # A head method that cannot run is refused with its reason when named, and left out of a default list.
    with pytest.raises(UsageError, match="mtp:2, which cannot run here: this target has no MTP layers") as info:
        parse_methods("none,mtp:2", has_draft=False, heads=heads)
    assert "--draft HEAD.gguf" in info.value.hint
    assert parse_methods("none,mtp:2,eagle3", has_draft=False, explicit=False, heads=heads) == [
        Method("none", 0), Method("eagle3", 4)]  # fmt: skip
    with pytest.raises(UsageError, match="no head was given"):
        parse_methods("eagle3:2", has_draft=True)


def test_builtin_suites() -> None:
    s = suites()
    base = ["code-gen", "code-edit", "chat", "agentic", "structured", "agent-long", "long-summary"]
    assert list(s) == [*base, "code-gen-cold", "code-gen-warm", "code-edit-cold", "code-edit-warm", "memory"]
    assert [s[n].costs for n in list(s)[7:11]] == ["cold", "warm", "cold", "warm"] and s["memory"].again
    assert s["code-gen-cold"].prompts == s["code-gen"].prompts and s["memory"].prompts == s["chat"].prompts
    assert len(s["structured"].grammars) == len(s["structured"].prompts) == 3 and s["chat"].grammar(0) is None
    assert s["agentic"].session and all(len(conv) == 3 for conv in s["agentic"].prompts)
    assert all("whole file" in m.content for conv in s["agentic"].prompts for m in conv)
    assert all(len(x.prompts) >= 1 for x in s.values())
    assert len(s["long-summary"].prompts[0][0].content.split()) > 800  # a long context, really
    assert (
        "def load_orders" in s["code-edit"].prompts[0][0].content
        and "complete updated" in s["code-edit"].prompts[1][0].content
    )


def test_run_bench_on_fakes_interleaves_and_aggregates() -> None:
    # Scripted costs: on the real clock a fake's microsecond passes spread widely, and bench withholds the bound.
    clock = FakeClock()
    target = CostedBackend(TARGET, clock, lambda n: 0.010 + 0.001 * (n - 1), n_ctx=8192)
    draft = CostedBackend(TARGET, clock, lambda n: 0.002, n_ctx=8192, name="draft")  # = target: all accepted
    suite = Suite("tiny", "a tiny suite", ((ChatMessage("user", "hello there"),), (ChatMessage("user", "bye now"),)))
    methods = parse_methods("none,ngram:3,model:2,auto:4", has_draft=True)
    seen: list[str] = []
    result = run_bench(_over(target, draft, clock), [suite], methods, reps=2, max_tokens=20, sampling=SamplingParams(),
                       progress=seen.append)  # fmt: skip
    assert len(result.runs) == 2 * 2 * len(methods)
    # Interleaved: the method that runs first changes between repetitions.
    firsts = [r.method for i, r in enumerate(result.runs) if i % len(methods) == 0]
    assert len(set(firsts)) > 1
    assert any("measuring costs" in s for s in seen)
    rows = {r.method: r for r in summarize(result)}
    assert set(rows) == {m.label for m in methods}
    assert rows["model k=2"].acceptance == 1.0
    assert rows["model k=2"].mean_accepted_length == pytest.approx(3.0, abs=0.3)  # short final rounds
    assert rows["model k=2"].acceptance_by_position == (1.0, 1.0)
    assert rows["none"].acceptance is None and rows["none"].bound_speedup is None
    assert rows["model k=2"].bound_speedup is not None and rows["auto k<=4"].bound_speedup is None
    text = "\n".join(bench_lines(result))
    assert "suite tiny" in text and "model k=2" in text and "auto k<=4" in text
    payload = json.loads(json.dumps(result.to_json()))
    assert payload["summary"] and payload["runs"][0]["stats"]["decode_tps"] >= 0
    assert payload["costs"]["tiny"]["target_s"]["1"] >= 0


def test_session_suite_runs_turns_with_one_drafter_per_conversation(monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec import pipeline

    built: list[object] = []
    make = pipeline.make_drafter

    def spy(*a, **kw):  # type: ignore[no-untyped-def]
        built.append(make(*a, **kw))
        return built[-1]

    monkeypatch.setattr(pipeline, "make_drafter", spy)
    target = FakeBackend(TARGET, n_ctx=8192)
    conv = (ChatMessage("user", "hello there"), ChatMessage("user", "again please"), ChatMessage("user", "once more"))
    suite = Suite("chat-session", "", (conv,), session=True)
    result = run_bench(
        _over(target),
        [suite],
        parse_methods("none,suffix", has_draft=False),
        reps=1,
        max_tokens=12,
        sampling=SamplingParams(),
    )
    assert [(r.method, r.turn) for r in result.runs] == [(m, t) for m in ("none", "suffix k=32") for t in range(3)]
    assert len(built) == 2  # one drafter per (conversation, method), not per turn
    # Each turn's prompt holds the earlier turns and answers: it grows.
    prompts = [r.stats.n_prompt for r in result.runs[:3]]
    assert prompts == sorted(prompts) and prompts[0] < prompts[-1]
    suffix = built[1]
    assert len(suffix.index.docs) == 1 and suffix.index.n_tokens >= prompts[-1]  # type: ignore[attr-defined]
    rows = {r.method: r for r in summarize(result)}
    assert rows["suffix k=32"].tps_median > 0


def _run(method: str, rep: int, tokens: int, seconds: float, **kw) -> RunResult:  # type: ignore[no-untyped-def]
    per_round = kw.pop("drafted_per_round", {0: tokens})
    stats = SpecStats(
        backend="fake", device="CPU", target="t", draft="d", draft_method=method.split()[0], rule="greedy",
        num_draft=4, temperature=0.0, seed=0, n_prompt=10, n_prompt_cached=0, n_generated=tokens + 1,
        decode_s=seconds, prompt_s=0.1, n_rounds=tokens, n_drafted=0, n_accepted=0, draft_s=0.0, verify_s=seconds,
        drafted_by_position=(), accepted_by_position=(), stop_reason="max_tokens",
    )  # fmt: skip
    return RunResult("s", 0, method, rep, replace(stats, **kw), per_round)


def test_speedup_is_paired_per_repetition_and_bound_uses_measured_costs() -> None:
    costs = CostModel(target={1: 0.010, 2: 0.012, 3: 0.014, 4: 0.016, 5: 0.018}, draft_token=0.004)
    result = BenchResult("t", "d", "fake", "CPU", 2, 100, 2, 0.0, [Method("none", 0), Method("model", 4)], ["s"])
    result.costs["s"] = SuiteCosts("s", 10, costs)
    # Repetition 1 ran on a slow spell for everyone: the paired ratio stays 1.5x in both.
    result.runs = [
        _run("none", 0, 100, 1.0),
        _run("none", 1, 100, 2.0),
        # 25 rounds of 4 drafts, 3 accepted each: 100 tokens
        _run(
            "model k=4",
            0,
            100,
            1 / 1.5,
            n_rounds=25,
            n_drafted=100,
            n_accepted=75,
            drafted_per_round={4: 25},
            drafted_by_position=(25, 25, 25, 25),
            accepted_by_position=(25, 25, 25, 0),
        ),
        _run(
            "model k=4",
            1,
            100,
            2 / 1.5,
            n_rounds=25,
            n_drafted=100,
            n_accepted=75,
            drafted_per_round={4: 25},
            drafted_by_position=(25, 25, 25, 25),
            accepted_by_position=(25, 25, 25, 0),
        ),
    ]
    rows = {r.method: r for r in summarize(result)}
    m = rows["model k=4"]
    assert m.speedup == pytest.approx(1.5)
    assert m.tps_min == pytest.approx(75.0) and m.tps_max == pytest.approx(150.0)
    assert m.mean_accepted_length == pytest.approx(4.0)
    assert m.acceptance_by_position == (1.0, 1.0, 1.0, 0.0)
    # bound: 4 tokens per round / (4 * 4 ms + T(5) = 18 ms) = 117.6 tok/s, x T(1) = 1.176x
    assert m.bound_speedup == pytest.approx(4 / 0.034 * 0.010)
    assert m.of_bound == pytest.approx(1.5 / (4 / 0.034 * 0.010))


def test_bench_with_scripted_costs_reports_what_the_clock_says() -> None:
    clock = FakeClock()
    target = CostedBackend(TARGET, clock, lambda n: 0.010 + 0.001 * (n - 1), n_ctx=8192)
    draft = CostedBackend(TARGET, clock, lambda n: 0.002, n_ctx=8192, name="draft")
    suite = Suite("tiny", "", ((ChatMessage("user", "hello there"),),))
    result = run_bench(
        _over(target, draft, clock),
        [suite],
        parse_methods("none,model:4", has_draft=True),
        reps=1,
        max_tokens=41,
        sampling=SamplingParams(),
    )
    costs = result.costs["tiny"].costs
    assert costs.target[1] == pytest.approx(0.010) and costs.draft_token == pytest.approx(0.002)
    rows = {r.method: r for r in summarize(result)}
    # Plain: 40 decode tokens at 10 ms each. Model k=4 (draft = target, all accepted): 8 rounds of
    # 4 drafts (8 ms) + a batch of 5 (14 ms) = 22 ms per 5 tokens. The engine adds no time of its own
    # under this clock, so the achieved speedup equals the analytic bound exactly.
    assert rows["none"].tps_median == pytest.approx(100.0)
    assert rows["model k=4"].tps_median == pytest.approx(5 / 0.022)
    assert rows["model k=4"].of_bound == pytest.approx(1.0)


# -- the cost curve's timings, and whether they can carry the bound -------------------------------------

USERS_MS = {1: 2015.7, 2: 74.6, 3: 79.9, 4: 84.1, 5: 90.3}  # `localspec bench` on a busy machine (a user's report)


def _model_k4_result(costs: SuiteCosts) -> BenchResult:
    """A bench result over `costs`: plain decoding, and model k=4 with 3 of 4 drafts accepted."""
    result = BenchResult("t", "d", "fake", "CPU", 2, 100, 1, 0.0, [Method("none", 0), Method("model", 4)], ["s"])
    result.costs["s"] = costs
    result.runs = [
        _run("none", 0, 100, 1.0),
        _run("model k=4", 0, 100, 1 / 1.5, n_rounds=25, n_drafted=100, n_accepted=75, drafted_per_round={4: 25},
             drafted_by_position=(25, 25, 25, 25), accepted_by_position=(25, 25, 25, 0)),
    ]  # fmt: skip
    return result


def test_users_busy_machine_curve_is_unreliable_and_no_bound_is_shown() -> None:
    costs = CostModel(target={n: t / 1e3 for n, t in USERS_MS.items()}, draft_token=0.004)
    result = _model_k4_result(SuiteCosts("s", 10, costs))
    row = {r.method: r for r in summarize(result)}["model k=4"]
    assert row.bound_speedup is None and row.of_bound is None
    lines = bench_lines(result)
    why = [x for x in lines if x.startswith("bound: not shown, timings unreliable")]
    assert len(why) == 1 and "T(2) = 74.6 ms is 0.04x T(1) = 2015.7 ms" in why[0]
    assert any("WARNING: timings unreliable" in x for x in lines)
    assert json.loads(json.dumps(result.to_json()))["costs"]["s"]["reliable"] is False


def test_users_timings_judged_one_by_one_are_unreliable() -> None:
    from localspec.bench.costs import CostSamples, judge

    timings = {1: [2015.7, 1890.2, 2210.4, 31.0, 2040.0], 2: [74.6, 70.1, 80.3, 75.0, 2100.0]}
    samples = CostSamples(target={n: [t / 1e3 for t in ts] for n, ts in timings.items()})
    verdict = judge(samples.model().target, samples)
    # Steady within each size (IQR/median 7-8%), but no machine runs 2 tokens 27x faster than one.
    assert verdict.reasons == ("T(2) = 75.0 ms is 0.04x T(1) = 2015.7 ms: no batch costs under 0.5x one token's pass",)
    assert not verdict.notes


def _steady(base_s: float, jitter: tuple[float, ...] = (0.98, 1.0, 1.01, 1.03, 0.99)) -> list[float]:
    return [base_s * j for j in jitter]


def test_consistent_timings_show_the_bound_with_their_spread() -> None:
    from localspec.bench.costs import CostSamples

    target = {n: 0.010 + 0.002 * (n - 1) for n in range(1, 6)}
    samples = CostSamples(target={n: _steady(t) for n, t in target.items()}, draft_token=_steady(0.004))
    sc = SuiteCosts("s", 10, samples.model())
    sc.add(samples)
    assert sc.verdict.reliable and not sc.verdict.notes
    result = _model_k4_result(sc)
    row = {r.method: r for r in summarize(result)}["model k=4"]
    # 4 tokens per round / (4 drafts x 4 ms + T(5) = 18 ms), x T(1) = 10 ms
    assert row.bound_speedup == pytest.approx(4 / 0.034 * 0.010)
    text = "\n".join(bench_lines(result))
    assert "bound: not shown" not in text and "WARNING" not in text
    assert f"{row.bound_speedup:.2f}x" in text
    t1_row = next(x.split() for x in text.splitlines() if x.strip().startswith("1 ") and "ms" in x)
    assert t1_row == ["1", "10.0ms", "9.8-10.3ms", "2%", "5", "1.00x"]  # n, median, min-max, IQR/median, count
    payload = json.loads(json.dumps(result.to_json()))["costs"]["s"]
    assert payload["reliable"] is True and payload["reasons"] == []
    t1 = payload["timings"]["target_s"]["1"]
    assert t1["count"] == 5 and t1["min"] == pytest.approx(0.0098) and t1["max"] == pytest.approx(0.0103)
    assert t1["iqr_over_median"] == pytest.approx(0.02)


def test_a_wide_spread_alone_withholds_the_bound() -> None:
    from localspec.bench.costs import CostSamples

    target = {n: _steady(0.010 + 0.002 * (n - 1)) for n in range(1, 6)}
    target[1] = [0.010, 0.010, 0.010, 0.025, 0.026]  # a plausible median, but half the timings ran slow
    samples = CostSamples(target=target, draft_token=_steady(0.004))
    sc = SuiteCosts("s", 10, samples.model())
    sc.add(samples)
    assert sc.verdict.reasons == ("timings spread over 25% (IQR/median): T(1) 150%",)
    result = _model_k4_result(sc)
    assert {r.method: r for r in summarize(result)}["model k=4"].bound_speedup is None
    assert "bound: not shown, timings unreliable (timings spread over 25%" in "\n".join(bench_lines(result))


def test_a_curve_that_falls_beyond_noise_is_unreliable() -> None:
    from localspec.bench.costs import CostSamples, judge

    samples = CostSamples(target={1: _steady(0.010), 2: _steady(0.012), 3: _steady(0.030), 4: _steady(0.013)})
    verdict = judge(samples.model().target, samples)
    assert verdict.reasons == ("T(3) = 30.0 ms is 2.3x T(4) = 13.0 ms: no batch costs over 2x a larger one",)


def test_one_timing_per_size_is_noted_as_too_few_to_judge() -> None:
    from localspec.bench.costs import CostSamples, judge

    samples = CostSamples(target={1: [0.010], 2: [0.012]})
    verdict = judge(samples.model().target, samples)
    assert verdict.reliable and "too few to judge their spread" in verdict.notes[0]


class _Recorded(CostedBackend):
    """A costed fake that remembers the size of every forward pass."""

    def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **kw)
        self.passes: list[int] = []

    def forward(self, tokens, *, all_logits: bool = True):  # type: ignore[no-untyped-def]
        self.passes.append(len(tokens))
        return super().forward(tokens, all_logits=all_logits)


def test_cost_timings_pair_every_batch_with_a_one_token_pass() -> None:
    from localspec.bench.measure import measure_costs

    clock = FakeClock()
    target = _Recorded(TARGET, clock, lambda n: 0.010 + 0.001 * (n - 1), n_ctx=8192)
    samples = measure_costs(target, None, list(range(5, 25)), max_batch=5, reps=3, clock=clock)
    assert {n: len(ts) for n, ts in samples.target.items()} == {
        1: 1 + 12,
        2: 3,
        3: 3,
        4: 3,
        5: 3,
    }  # a first T(1), then pairs
    batches = target.passes[1:]  # after the prompt
    assert all(batches[i - 1] == 1 for i, n in enumerate(batches) if n > 1)
    assert samples.model().target == pytest.approx({n: 0.010 + 0.001 * (n - 1) for n in range(1, 6)})


def test_a_busy_spell_while_timing_slows_both_sides_and_leaves_the_curve_right() -> None:
    from localspec.bench.measure import measure_costs

    clock, calls = FakeClock(), [0]

    def cost(n: int) -> float:  # the prompt, then 10 passes 40x slower (a busy spell: the warm-up, the first
        calls[0] += 1  # T(1) and four whole pairs), then quiet
        return (0.010 + 0.001 * (n - 1)) * (40 if 2 <= calls[0] <= 11 else 1)

    target = CostedBackend(TARGET, clock, cost, n_ctx=8192)
    samples = measure_costs(target, None, list(range(5, 25)), max_batch=5, reps=5, clock=clock)
    sc = SuiteCosts("s", 20, samples.model())
    sc.add(samples)
    assert sc.verdict.reliable
    assert sc.costs.target == pytest.approx({n: 0.010 + 0.001 * (n - 1) for n in range(1, 6)})


# -- doctor's rules ------------------------------------------------------------------------------------


def _severities(f: Facts) -> dict[str, str]:
    return {x.message.split(":")[0][:40]: x.severity for x in findings(f)}


def test_doctor_flags_cpu_only_build_on_gpu_machine() -> None:
    f = Facts(
        gpu_hardware=["NVIDIA GPU (CUDA)"],
        llama_gpu=None,
        llama_version="0.3",
        threads=8,
        logical_cpus=8,
        physical_cores=8,
        usable_cpus=8,
    )
    fixes = [x for x in findings(f) if x.severity == "fix"]
    assert any("built for the CPU only" in x.message and "GGML_CUDA" in x.hint for x in fixes)


def test_doctor_flags_partial_offload_threads_and_memory() -> None:
    gb = 1024**3
    f = Facts(
        llama_gpu="CUDA",
        llama_version="0.3",
        n_gpu_layers=10,
        threads=4,
        usable_cpus=4,
        mem_available=1 * gb,
        models=[
            {
                "role": "target",
                "path": "t.gguf",
                "size": 2 * gb,
                "layers": 28,
                "ctx_train": 2048,
                "kv_bytes_per_token": 1000,
            }
        ],
        n_ctx=4096,
    )
    found = findings(f)
    msgs = " | ".join(x.message for x in found if x.severity == "fix")
    assert "--n-gpu-layers 10" in msgs
    assert "free memory" in msgs
    assert any("trained context" in x.message and x.severity == "warn" for x in found)

    cpu = Facts(
        llama_gpu=None,
        llama_version="0.3",
        threads=16,
        threads_explicit=False,
        logical_cpus=16,
        usable_cpus=2.0,
        physical_cores=8,
    )
    fix = [x for x in findings(cpu) if x.severity == "fix"]
    assert len(fix) == 1 and "--threads 2" in fix[0].hint

    smt = Facts(llama_gpu=None, llama_version="0.3", threads=16, logical_cpus=16, usable_cpus=16, physical_cores=8)
    assert any(x.severity == "warn" and "--threads 8" in x.hint for x in findings(smt))


def test_doctor_is_quiet_on_a_good_setup() -> None:
    f = Facts(
        llama_gpu="Metal",
        llama_version="0.3",
        gpu_hardware=["Apple GPU (Metal)"],
        threads=8,
        usable_cpus=8,
        physical_cores=8,
        mem_available=64 * 1024**3,
        n_gpu_layers=-1,
        mlx_version="0.25",
        models=[{"role": "target", "path": "t.gguf", "size": 10**9, "layers": 28, "ctx_train": 32768}],
    )
    assert [x for x in findings(f) if x.severity != "info"] == []


def test_doctor_measured_ceiling() -> None:
    slow = Facts(
        llama_gpu=None,
        llama_version="0.3",
        measured={"target_s": {str(n): 0.03 * (1 + 0.2 * (n - 1)) for n in range(1, 10)}, "draft_token_s": 0.025},
    )
    assert any("at most" in x.message and x.severity == "warn" for x in findings(slow))


# -- the engine's per-round work at a 150k vocabulary (benchmarks/sampling_cost.py times it) ------------

V_BIG = 151_936


def _reference(z: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Full-sort reference, step by step as HF/vLLM apply the filters."""
    x = np.asarray(z, dtype=np.float64) / params.temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    if params.top_k:
        keep = np.zeros(p.shape, bool)
        keep[np.argsort(-p, kind="stable")[: params.top_k]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        n_keep = int(np.searchsorted(np.cumsum(p[order]), params.top_p)) + 1
        keep = np.zeros(p.shape, bool)
        keep[order[:n_keep]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if params.min_p:
        p = np.where(p >= params.min_p * p.max(), p, 0.0)
        p /= p.sum()
    return p


def _llm_like_logits(seed: int) -> np.ndarray:
    """A few likely tokens and a long tail, like a language model's row (no ties)."""
    rng = np.random.default_rng(seed)
    ranks = rng.permutation(V_BIG) + 1
    return (-2.5 * np.log(ranks) + rng.normal(0, 0.3, V_BIG)).astype(np.float32)


PARAMS = [
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=0.8, top_k=40),
    SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.9),
    SamplingParams(temperature=1.5, top_p=0.99),  # a wide nucleus: the candidate threshold must widen
]


@pytest.mark.parametrize("params", PARAMS)
def test_fast_probabilities_equal_the_full_sort_reference_at_150k(params: SamplingParams) -> None:
    from localspec.sampling import probabilities

    z = _llm_like_logits(3)
    p, ref = probabilities(z, params), _reference(z, params)
    np.testing.assert_array_equal(p > 0, ref > 0)
    np.testing.assert_allclose(p, ref, rtol=1e-12, atol=1e-300)


def test_no_full_vocabulary_sort_where_a_partial_one_suffices(monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec import sampling

    sizes: list[int] = []
    real_argsort, real_sort = np.argsort, np.sort

    def argsort(a, *args, **kw):  # type: ignore[no-untyped-def]
        sizes.append(np.asarray(a).size)
        return real_argsort(a, *args, **kw)

    def sort(a, *args, **kw):  # type: ignore[no-untyped-def]
        sizes.append(np.asarray(a).size)
        return real_sort(a, *args, **kw)

    monkeypatch.setattr(sampling.np, "argsort", argsort)
    monkeypatch.setattr(sampling.np, "sort", sort)
    z = _llm_like_logits(4)
    for params in PARAMS[:5]:
        sampling.probabilities(z, params)
    assert sizes and max(sizes) < V_BIG // 10


def test_two_level_sampling_follows_the_distribution_at_150k() -> None:
    from localspec.sampling import sample

    p = np.zeros(V_BIG)
    hot = [0, 1023, 1024, 77_777, V_BIG - 1]  # block edges and the very end
    p[hot] = [0.1, 0.2, 0.3, 0.25, 0.15]
    rng = np.random.default_rng(5)
    draws = np.array([sample(p, rng) for _ in range(20_000)])
    assert set(np.unique(draws)) <= set(hot)
    counts = np.array([(draws == h).sum() for h in hot]) / draws.size
    np.testing.assert_allclose(counts, p[hot], atol=0.015)

    class TopRng:
        def random(self) -> float:
            return np.nextafter(1.0, 0.0)

    q = np.zeros(V_BIG)
    q[[5, 2000]] = 0.5
    assert sample(q, TopRng()) == 2000  # type: ignore[arg-type]  # never a trailing zero-weight token


def test_doctor_flags_a_busy_cpu() -> None:
    busy = Facts(llama_gpu=None, llama_version="0.3", threads=2, usable_cpus=2, physical_cores=2, load_avg=5.0)
    assert any("busy" in x.message and x.severity == "warn" for x in findings(busy))
    calm = Facts(llama_gpu=None, llama_version="0.3", threads=2, usable_cpus=2, physical_cores=2, load_avg=0.3)
    assert not any("busy" in x.message for x in findings(calm))


# -- the commands, as a user runs them (tiny generated GGUFs) --------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "localspec.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


def test_bench_command_json_on_tiny_models(tiny_ggufs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out_file = tmp_path / "bench.json"
    r = _cli(
        "bench",
        "--target",
        str(tiny_ggufs[0]),
        "--draft",
        str(tiny_ggufs[1]),
        "--suites",
        "chat,code-edit",
        "--prompts",
        "1",
        "--reps",
        "1",
        "--max-tokens",
        "8",
        "--methods",
        "none,ngram:2,model:2,auto:3",
        "--threads",
        "1",
        "--cost-reps",
        "2",
        "--json-out",
        str(out_file),
    )
    assert r.returncode == 0, r.stderr
    assert "suite chat" in r.stdout and "suite code-edit" in r.stdout and "auto k<=3" in r.stdout
    assert "cost of one forward pass" in r.stdout
    data = json.loads(out_file.read_text())
    assert {row["method"] for row in data["summary"]} == {"none", "ngram k=2", "model k=2", "auto k<=3"}
    assert len(data["runs"]) == 2 * 4 and set(data["costs"]) == {"chat", "code-edit"}


def test_bench_cases_report_auto_cold_and_warm_and_the_memory_s_gain_apart(tiny_ggufs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`--suites cases`: code-gen and code-edit with auto's costs cold and warm (in a cache of bench's own: the
    user's is neither read nor written), and `memory`, where auto runs with the suffix memory of each prompt's
    first answer and without it, its own gain said apart."""
    import os
    from pathlib import Path

    out_file = tmp_path / "bench.json"
    cache = Path(os.environ["LOCALSPEC_CACHE_DIR"])  # each test's own (conftest), which the command inherits
    r = _cli(
        "bench", "--target", str(tiny_ggufs[0]), "--draft", str(tiny_ggufs[1]), "--suites", "cases", "--prompts", "1",
        "--reps", "1", "--max-tokens", "12", "--methods", "none,auto:3", "--threads", "1", "--cost-reps", "1",
        "--json-out", str(out_file),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(out_file.read_text())
    cases = ["code-gen-cold", "code-gen-warm", "code-edit-cold", "code-edit-warm", "memory"]
    assert data["suites"] == cases and set(data["cases"]) == set(cases)
    rows = {(row["suite"], row["method"]): row for row in data["summary"]}
    for suite in cases[:4]:
        assert {m for s, m in rows if s == suite} == {"none", "auto k<=3"}
        assert f"suite {suite}" in r.stdout
    assert {m for s, m in rows if s == "memory"} == {"none", "auto k<=3", "auto k<=3 +memory"}
    assert rows[("memory", "auto k<=3 +memory")]["memory_gain"] is not None
    assert rows[("memory", "auto k<=3")]["memory_gain"] is None
    assert "the memory's own gain: auto k<=3 +memory" in r.stdout
    copied = [x for x in data["runs"] if x["suite"] == "memory" and x["method"] == "auto k<=3 +memory"]
    assert any(s["source"] == "suffix" and s["accepted"] > 0 for x in copied for s in x["stats"]["sources"])
    assert not (cache / "costs").exists()  # the cases' costs lived in bench's own directory


def test_bench_command_runs_eagle3_rows_with_the_head_as_draft(eagle3_pair, tmp_path) -> None:  # type: ignore[no-untyped-def]
    target, head = eagle3_pair
    out_file = tmp_path / "bench.json"
    r = _cli("bench", "--target", str(target), "--draft", str(head), "--suites", "chat", "--prompts", "1", "--reps", "1",
             "--max-tokens", "8", "--methods", "none,eagle3:3,ngram:2", "--threads", "1", "--cost-reps", "1",
             "--n-ctx", "1024", "--json-out", str(out_file))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "eagle3 k=3" in r.stdout
    data = json.loads(out_file.read_text())
    assert data["draft"] == head.name and data["methods"] == ["none", "eagle3 k=3", "ngram k=2"]
    run = next(x for x in data["runs"] if x["method"] == "eagle3 k=3")
    assert run["stats"]["draft_method"] == "eagle3" and run["stats"]["n_drafted"] > 0
    assert max(int(n) for n in run["drafted_per_round"]) == 3


def test_bench_command_refuses_head_methods_that_do_not_fit(eagle3_pair, tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    target, head = eagle3_pair
    common = ("--suites", "chat", "--prompts", "1", "--reps", "1", "--max-tokens", "4", "--threads", "1")
    # A draft model is no EAGLE-3 head; a head of one family does not run another.
    for draft, method, words in ((tiny_ggufs[1], "eagle3:2", "not an EAGLE-3 head"), (head, "dflash:2", "dflash")):
        r = _cli("bench", "--target", str(target), "--draft", str(draft), "--methods", f"none,{method}", *common)
        assert r.returncode == 2 and words in r.stderr and "cannot run here" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_bench_command_rejects_unknown_suite(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    r = _cli("bench", "--target", str(tiny_ggufs[0]), "--suites", "poetry")
    assert r.returncode != 0 and "unknown suite" in r.stderr and "Traceback" not in r.stderr


def test_doctor_command_json(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    r = _cli("doctor", "--target", str(tiny_ggufs[0]), "--draft", str(tiny_ggufs[1]), "--threads", "1", "--json")
    assert r.returncode in (0, 1), r.stderr  # 1: a "fix first" finding on this machine
    data = json.loads(r.stdout)
    assert data["facts"]["threads"] == 1 and len(data["facts"]["models"]) == 2
    assert all(f["severity"] in ("fix", "warn", "info") for f in data["findings"])
    if data["facts"]["mlx_version"]:  # the head families that run on MLX, from the registry
        assert set(data["facts"]["mlx_heads"]) == {"eagle3", "mtp", "dflash", "dspark"}


def test_interrupted_bench_reports_what_finished() -> None:
    target = FakeBackend(TARGET, n_ctx=8192)
    suite = Suite("tiny", "", ((ChatMessage("user", "hello there"),),))
    calls = {"n": 0}
    seen: list[str] = []

    def progress(line: str) -> None:
        seen.append(line)
        if line.startswith("[") and (calls.__setitem__("n", calls["n"] + 1) or calls["n"]) == 4:
            raise KeyboardInterrupt

    result = run_bench(
        _over(target),
        [suite],
        parse_methods("none,ngram:3", has_draft=False),
        reps=3,
        max_tokens=10,
        sampling=SamplingParams(),
        progress=progress,
    )
    assert result.interrupted and len(result.runs) == 3
    text = "\n".join(bench_lines(result))
    assert "INTERRUPTED" in text and "suite tiny" in text


def test_run_summary_tells_when_auto_found_speculation_does_not_pay() -> None:
    from dataclasses import replace as dc_replace

    from localspec.decoding.stats import SpecStats
    from localspec.report import advice

    base = SpecStats(
        backend="llama.cpp",
        device="CPU",
        target="t",
        draft="auto(ngram)",
        draft_method="auto",
        rule="greedy",
        num_draft=8,
        temperature=0.0,
        seed=0,
        n_prompt=10,
        n_prompt_cached=0,
        prompt_s=0.1,
        n_generated=40,
        decode_s=1.0,
        n_rounds=30,
        n_drafted=10,
        n_accepted=9,
        draft_s=0.0,
        verify_s=1.0,
        drafted_by_position=(5, 3, 2),
        accepted_by_position=(5, 3, 1),
        stop_reason="max_tokens",
    )
    tip = advice(base)
    assert tip is not None and "83% of rounds without drafts" in tip and "drafts wrote 22% of the text" in tip
    assert advice(dc_replace(base, drafted_by_position=(20, 10), accepted_by_position=(18, 9))) is None
    # A code edit: most rounds plain, but a few long copies wrote most of the text. Speculation paid.
    copies = dc_replace(
        base,
        n_generated=92,
        n_rounds=24,
        n_drafted=70,
        n_accepted=68,
        drafted_by_position=(7,) * 15,
        accepted_by_position=(7,) * 15,
    )
    assert 1 - copies.drafting_share > 0.5 and advice(copies) is None
    none_used = dc_replace(base, n_drafted=0, n_accepted=0, drafted_by_position=(), accepted_by_position=())
    tip = advice(none_used)
    assert tip is not None and tip.startswith("auto decoded 100% of rounds without drafts:")
    # A suffix run that found nothing worth drafting says so, and does not blame n-gram lookup.
    quiet = dc_replace(
        base,
        draft="suffix",
        draft_method="suffix",
        n_drafted=0,
        n_accepted=0,
        drafted_by_position=(),
        accepted_by_position=(),
    )
    tip = advice(quiet)
    assert tip is not None and "no suffix draft" in tip and "n-gram" not in tip
    # A head that rarely matches is a poor match, not a lookup (whatever the family).
    head = dc_replace(base, draft="eagle3:h", draft_method="eagle3", n_accepted=0, accepted_by_position=(0, 0, 0))
    tip = advice(head)
    assert tip is not None and "poor match" in tip and "n-gram" not in tip


def test_bench_honours_the_chat_template(tiny_ggufs, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """bench renders its prompts as `run` does: --chat-template raw sends the text as it is."""
    from localspec.cli import main

    target = str(tiny_ggufs[0])
    text = suites()["chat"].prompts[0][0].content

    def n_prompt(*argv: str) -> int:
        assert main([*argv, "--target", target, "--threads", "1", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        stats = out["runs"][0]["stats"] if "runs" in out else out["stats"]
        return int(stats["n_prompt"])

    bench = ("bench", "--methods", "none", "--suites", "chat", "--prompts", "1", "--reps", "1", "--max-tokens", "2",
             "--cost-reps", "1")  # fmt: skip
    raw = n_prompt(*bench, "--chat-template", "raw")
    assert raw == n_prompt("run", text, "--chat-template", "raw", "--max-tokens", "2", "--draft-method", "none")
    assert raw < n_prompt(*bench, "--chat-template", "chatml")
