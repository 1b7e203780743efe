"""The GPU check (benchmarks/gpu_check.py) end to end in its --cpu mode, and its payload (gpu_prepare.py).

The check runs as a subprocess on the payload's own copies of llama_cpp, gguf and localspec (first on
its path), with the installed llama-cpp-python's library instead of a build, on tiny shapes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_prepare  # noqa: E402


def installed_lib_dir() -> Path:
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "lib"


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fixture_models import fetch

    out = tmp_path_factory.mktemp("payload") / "gpu_payload"
    gpu_prepare.prepare(out, sdist=None, sources=False, tokenizer_from=fetch("qwen-0.5b"))
    return out


def test_payload_without_sources_carries_the_bindings_localspec_and_the_tokenizer(payload: Path) -> None:
    site = payload / "site"
    for rel in ("llama_cpp/llama_cpp.py", "gguf/gguf_writer.py", "localspec/decoding/engine.py",
                "localspec/backends/llama/backend.py", "diskcache/__init__.py"):  # fmt: skip
        assert (site / rel).is_file(), rel
    assert not list(site.rglob("*.so")), "the payload must be pure Python (the library is built there)"
    import gzip

    tok = json.loads(gzip.open(payload / "tokenizer.json.gz", "rt").read())
    assert len(tok["tokenizer.ggml.tokens"]) > 150_000 and tok["tokenizer.ggml.pre"] == "qwen2"
    assert gpu_prepare.tree_size(payload) < gpu_prepare.LIMIT_BYTES


def run_check(
    payload: Path, tmp: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    out = tmp / "out"
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu", "--shapes", "tiny",
        "--payload", str(payload), "--out", str(out), "--work", str(tmp / "work"),
        "--lib-dir", str(installed_lib_dir()), "--threads", "1", "--tokens", "24", "--reps", "1",
        "--sizes", "1,2,3,4,5,6,8,9", *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "gpu_check.json").read_text())


def test_cpu_mode_runs_every_measurement_on_tiny_shapes(payload: Path, tmp_path: Path) -> None:
    # The first process measuring the target dies as a crash inside the library would: it is measured again.
    proc, report = run_check(payload, tmp_path, "--no-tools", env={"GPU_CHECK_CRASH_ONCE": str(tmp_path / "crashed")})
    assert report["mode"] == "cpu"
    assert "tiny: its measuring process died of SIGSEGV (attempt 1)" in report["notes"]
    # Everything ran on the payload's copies of the code, with the library copied in beside the bindings.
    site = (tmp_path / "work" / "site").resolve()
    for module, path in report["build"]["code"].items():
        assert Path(path).resolve().is_relative_to(site), (module, path)
    assert (site / "llama_cpp" / "lib" / "libllama.so").is_file()
    # (one thread: on a busy shared machine, two threads of a tiny model wait on each other at every op)
    # The models were written, quantized to Q4_K_M (smaller than F16) and loaded from the payload's code.
    for name in ("tiny", "tiny-draft"):
        m = report["models"][name]
        assert m["bytes"] > 0 and m["write_s"] >= 0
    t = report["targets"]["tiny"]
    assert t["device"].startswith("CPU")
    costs = {int(n): s for n, s in t["target_s"].items()}
    assert sorted(costs) == [1, 2, 3, 4, 5, 6, 8, 9] and all(s > 0 for s in costs.values())
    assert t["draft_token_s"] > 0
    assert t["plain"]["tokens"] > 1 and t["plain"]["ratio"] > 0
    for k in ("4", "8"):
        r = t["rounds"][k]["median"]
        assert r["acceptance"] >= 0.8, r  # draft = target, greedy: all accepted but at near-ties
        # The round splits into the two models' forward passes and localspec's own time, all measured.
        assert r["target_forward_s"] > 0 and r["draft_forward_s"] > 0 and r["overhead_s"] >= 0
        assert r["target_forward_s"] + r["draft_forward_s"] + r["overhead_s"] == pytest.approx(r["round_s"])
    allowed = t["allowed_speedup"]
    assert set(allowed) == {"0.6", "0.8", "0.95"}
    assert allowed["0.95"]["bound"] >= allowed["0.6"]["bound"] > 0
    assert allowed["0.95"]["with_overhead"] <= allowed["0.95"]["bound"] + 1e-9
    # A continuation that repeats an earlier answer: plain retraces it, the suffix drafter copies it.
    copies = t["copies"]
    assert copies["repeats"] > 0.5
    assert copies["suffix"]["median"]["acceptance"] > 0.9 and copies["suffix"]["median"]["tokens_per_pass"] > 4
    assert copies["none"]["median"]["drafted"] == 0 and copies["auto"]["median"]["rounds"] > 0
    sampled = copies["suffix T=0.3"]  # sampled: against plain at the same temperature
    assert sampled["temperature"] == 0.3 and copies["none T=0.3"]["median"]["drafted"] == 0
    assert sampled["median"]["rounds"] > 0 and sampled["vs_plain"] > 0
    # Four sequences in one pass, plain and with suffix drafts, against one at a time.
    parallel = t["parallel"]
    assert parallel["together_plain"]["tokens"] > 0 and parallel["alone_plain_tps"] > 0
    assert parallel["together_plain"]["mean_pass_tokens"] >= 2  # several sequences shared passes
    assert "llama_simple" not in t  # --no-tools
    # A sampled pass with llama.cpp's copies of the draws chain, the softmax alone, the ids alone (forced on here).
    draws = t["draw_copies"]
    assert set(draws) == {"1", "9"} and all(len(v) == 3 and min(v.values()) > 0 for v in draws.values())
    phases = ("costs", "plain", "rounds", "copies", "parallel", "draw_copies")
    assert {f"tiny_{k}" for k in phases} <= set(report["phases"])
    table = (tmp_path / "out" / "gpu_check.txt").read_text()
    assert "== target tiny" in table and "speedup allowed" in table and "draft=target k=8" in table
    assert "a continuation that repeats" in table and "4 sequences in parallel" in table
    assert "9 row(s): llama.cpp's copies" in table
    assert table.strip() in proc.stdout  # the table is also printed
    assert "llama-speculative-simple" not in json.dumps(t)


def test_the_table_reads_results_recorded_before_the_parallel_phase_had_its_name() -> None:
    """benchmarks/gpu_results/ keep the parallel phase under its old key, "crowd": the table still shows it."""
    import gpu_check

    recorded = json.loads((ROOT / "benchmarks" / "gpu_results" / "h200-2026-12-04-second.json").read_text())
    assert all("crowd" in t and "parallel" not in t for t in recorded["targets"].values())
    table = "\n".join(gpu_check.table_lines(gpu_check.Report(**recorded)))
    assert table.count("4 sequences in parallel: plain") == len(recorded["targets"]) == 2


def test_bad_arguments_say_what_to_do(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "gpu_check.py")
    proc = subprocess.run([sys.executable, script, "--payload", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "gpu_prepare.py" in proc.stderr
    (tmp_path / "site").mkdir()
    proc = subprocess.run(
        [sys.executable, script, "--payload", str(tmp_path), "--shapes", "13b"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "unknown shape '13b'" in proc.stderr
    proc = subprocess.run([sys.executable, script, "--payload", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "--lib-dir" in proc.stderr


@pytest.mark.slow
def test_trimmed_sources_configure_for_the_library_and_speculative_simple(tmp_path: Path) -> None:
    """The sdist's llama.cpp, trimmed, still configures with CMake and has the two targets the check builds."""
    if not (shutil.which("cmake") and shutil.which("ninja")):
        pytest.skip("needs cmake and ninja")
    sdist = Path(os.environ.get("LOCALSPEC_LLAMA_SDIST", "")) if os.environ.get("LOCALSPEC_LLAMA_SDIST") else None
    out = tmp_path / "payload"
    size = gpu_prepare.prepare(out, sdist=sdist, sources=True, tokenizer_from=None)
    assert size < gpu_prepare.LIMIT_BYTES
    src = out / "llama.cpp"
    assert (src / "ggml/src/ggml-cuda").is_dir() and not (src / "ggml/src/ggml-vulkan").exists()
    assert not (src / "docs").exists() and not (src / "models").exists()
    import gpu_check

    settings = gpu_check.Settings(
        cpu=True, targets=("tiny",), draft="tiny-draft", payload=out, out=tmp_path / "out", work=tmp_path / "work",
        lib_dir=None, tools_dir=None, tools=True, threads=1, tokens=8, reps=1, sizes=(1,), deadline_s=60.0,
        build_jobs=1, reuse_models=False,
    )  # fmt: skip
    (configure, build_cmd), env = gpu_check.build_command(settings)  # the check's own commands
    assert build_cmd[-3:] == ["llama", "llama-speculative-simple", "llama-simple"]
    subprocess.run(configure, check=True, capture_output=True, env=env)
    build = tmp_path / "work" / "build"
    targets = subprocess.run(["ninja", "-C", str(build), "-t", "targets", "all"], capture_output=True, text=True).stdout
    assert "llama-speculative-simple" in targets and "libllama.so" in targets
