"""bench and doctor say when a cost measurement ran on a busy machine (the load average at measurement
time over the CPU count, or timings spread like a busy machine's), and derive no bound from it."""

from __future__ import annotations

import json

from test_bench import _model_k4_result, _steady

from localspec.bench.costs import CostSamples, Load, current_load, judge
from localspec.bench.measure import SuiteCosts, summarize
from localspec.bench.report import bench_lines
from localspec.commands.doctor import Facts, findings, report_lines

CURVE = {n: 0.010 + 0.002 * (n - 1) for n in range(1, 6)}


def _steady_samples() -> CostSamples:
    return CostSamples(target={n: _steady(t) for n, t in CURVE.items()}, draft_token=_steady(0.004))


def test_the_load_is_read_from_the_os() -> None:
    load = current_load()
    assert load.cpus >= 1 and (load.average is None or load.average >= 0)
    assert Load(None, 4).describe() == "load average unknown on this OS (4 CPUs)" and not Load(None, 4).high
    assert Load(2.0, 2).describe() == "load average 2.0 on 2 CPUs" and not Load(2.0, 2).high
    assert Load(2.5, 2).high


def test_bench_shows_the_load_and_withholds_the_bound_when_it_exceeds_the_cpus() -> None:
    samples = _steady_samples()
    quiet = SuiteCosts("s", 10, samples.model())
    quiet.add(samples, Load(0.4, 2))
    quiet.add(samples, Load(1.6, 2))
    assert quiet.verdict.reliable
    text = "\n".join(bench_lines(_model_k4_result(quiet)))
    assert "load average (1 min) at measurement: 0.4, 1.6 on 2 CPUs" in text and "WARNING" not in text

    busy = SuiteCosts("s", 10, samples.model())
    busy.add(samples, Load(0.4, 2))
    busy.add(samples, Load(3.1, 2))  # the same steady timings, but one repetition ran with the cores oversubscribed
    why = "machine busy while timing: load average 3.1 on 2 CPUs (over 1 runnable thread per CPU)"
    assert busy.verdict.reasons == (why,)
    result = _model_k4_result(busy)
    assert {r.method: r for r in summarize(result)}["model k=4"].bound_speedup is None
    text = "\n".join(bench_lines(result))
    assert "WARNING: timings unreliable: machine busy while timing: load average 3.1 on 2 CPUs" in text
    assert "bound: not shown, timings unreliable (machine busy while timing" in text
    payload = json.loads(json.dumps(result.to_json()))["costs"]["s"]
    assert payload["load"][1] == {"load_avg_1m": 3.1, "cpus": 2, "high": True} and payload["reliable"] is False


def test_judge_without_loads_is_as_before() -> None:
    samples = _steady_samples()
    assert judge(samples.model().target, samples).reliable


def _measured(**extra: object) -> dict[str, object]:
    slow_draft = {"target_s": {str(n): 0.03 * (1 + 0.2 * (n - 1)) for n in range(1, 10)}, "draft_token_s": 0.025}
    return {**slow_draft, "device": "CPU", **extra}


def test_doctor_derives_no_bound_from_an_unreliable_measurement_and_says_why() -> None:
    reason = "machine busy while timing: load average 3.4 on 2 CPUs (over 1 runnable thread per CPU)"
    load = {"load_avg_1m": 3.4, "cpus": 2, "high": True}
    busy = Facts(llama_gpu=None, llama_version="0.3",
                 measured=_measured(load=load, spread=0.4, reliable=False, reasons=[reason]))  # fmt: skip
    found = findings(busy)
    assert not any("at most" in x.message for x in found)  # no ceiling from these timings
    warn = [x for x in found if "unreliable" in x.message]
    assert len(warn) == 1 and warn[0].severity == "warn" and reason in warn[0].message
    lines = report_lines(busy, found)
    said = "load average 3.4 on 2 CPUs at measurement, timings spread 40% IQR/median (unreliable)"
    assert any(said in x for x in lines)
    quiet = Facts(llama_gpu=None, llama_version="0.3",
                  measured=_measured(load={"load_avg_1m": 0.3, "cpus": 2, "high": False}, spread=0.03, reliable=True,
                                     reasons=[]))  # fmt: skip
    found = findings(quiet)
    assert any("at most" in x.message for x in found) and not any("unreliable" in x.message for x in found)
    said = "load average 0.3 on 2 CPUs at measurement, timings spread 3% IQR/median"
    assert any(said in x for x in report_lines(quiet, found))
