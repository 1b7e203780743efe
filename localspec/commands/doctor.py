"""`localspec doctor`: check the base configuration before any speculation.

A CPU-only build on a GPU machine, layers left on the CPU, more threads than cores, or a pair that
does not fit in free memory each cost more than speculative decoding can ever win back (2x-6x at
best, often less). Those are fixed first; `doctor` finds them and says how.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from localspec.backends.registry import LLAMA
from localspec.context_size import choose_n_ctx, memory, model_shape
from localspec.formatting import format_bytes
from localspec.options import DEFAULT_N_CTX, add_model_options

Severity = Literal["fix", "warn", "info"]


@dataclass(frozen=True)
class Finding:
    severity: Severity  # fix: costs more than speculation can win back; warn: worth a look; info
    message: str
    hint: str = ""


@dataclass
class Facts:
    """What doctor looked at. Plain data, so the rules below are testable without the machine."""

    os: str = ""
    machine: str = ""
    python_arch: str = ""
    rosetta: bool = False
    logical_cpus: int | None = None
    physical_cores: int | None = None
    performance_cores: int | None = None  # Apple silicon P-cores
    usable_cpus: float | None = None  # affinity and cgroup quota: what this process may really use
    load_avg: float | None = None  # 1-minute load average: other work competing for the cores
    mem_total: int | None = None
    mem_available: int | None = None
    gpu_hardware: list[str] = field(default_factory=list)  # what the machine has (nvidia-smi, Apple GPU)
    llama_version: str | None = None
    llama_gpu: str | None = None  # GPU backend compiled into llama-cpp-python (None: CPU only)
    llama_system_info: str = ""
    llama_error: str | None = None
    llama_drafters: dict[str, str] = field(default_factory=dict)  # hidden-state family -> "available" or why not
    mlx_version: str | None = None
    mlx_heads: list[str] = field(default_factory=list)  # hidden-state families that run on MLX (head directories)
    mlx_device: str | None = None
    threads: int | None = None  # what localspec will use (explicit --threads, else its default)
    threads_explicit: bool = False
    n_ctx: int = DEFAULT_N_CTX
    n_batch: int = 512
    n_gpu_layers: int = -1
    backend: str = LLAMA.name
    models: list[dict[str, Any]] = field(default_factory=list)  # path, size, layers, ctx_train, kv bytes/token
    pair: str | None = None  # the catalog pair checked, if any
    pair_note: str = ""  # e.g. "the default pair", or why it was not checked
    measured: dict[str, Any] | None = None


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "doctor",
        help="check backend builds, devices, threads and memory before speculating",
        description="Report backend builds and devices (CUDA, Metal, CPU; MLX), offloading, threads, context and "
        "batch settings, and free memory against the pair's size. Flags base settings that cost more than "
        "speculative decoding can win back: fix those first.",
    )
    add_model_options(p, method=False, first_use=False, suffix_memory=None)  # doctor never downloads
    p.add_argument(
        "--measure",
        action="store_true",
        help="also load the models and time the target's batch curve and the draft (a few seconds)",
    )
    p.add_argument("--json", action="store_true", help="print facts and findings as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    facts = gather(args)
    found = findings(facts)
    if args.json:
        json.dump({"facts": asdict(facts), "findings": [asdict(f) for f in found]}, sys.stdout)
        sys.stdout.write("\n")
    else:
        print("\n".join(report_lines(facts, found)))
    return 1 if any(f.severity == "fix" for f in found) else 0


# -- gathering ----------------------------------------------------------------------------------------


def gather(args: argparse.Namespace) -> Facts:
    f = Facts(
        os=f"{platform.system()} {platform.release()}", machine=platform.machine(), python_arch=platform.machine()
    )
    f.rosetta = _sysctl("sysctl.proc_translated") == "1"
    f.logical_cpus = os.cpu_count()
    f.physical_cores = _physical_cores()
    f.performance_cores = _int(_sysctl("hw.perflevel0.physicalcpu"))
    f.usable_cpus = _usable_cpus()
    f.load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    f.mem_total, f.mem_available = memory()
    f.gpu_hardware = _gpu_hardware()
    f.n_gpu_layers = args.n_gpu_layers
    f.backend = args.backend
    _llama_facts(f)
    _mlx_facts(f)
    f.threads_explicit = args.threads is not None
    f.threads = args.threads or f.logical_cpus  # localspec/backends/llama/backend.py: threads or os.cpu_count()
    paths = _model_paths(args, f)
    for role, path in paths:
        f.models.append(_model_facts(role, path))
    f.n_ctx = args.n_ctx if args.n_ctx is not None else _auto_n_ctx(dict(paths))
    if getattr(args, "measure", False) and paths:
        f.measured = _measure(args, dict(paths))
    return f


def _auto_n_ctx(paths: dict[str, str]) -> int:
    """The context run, chat and serve choose without --n-ctx (context_size.choose_n_ctx)."""
    if "target" not in paths:
        return DEFAULT_N_CTX
    return choose_n_ctx(paths["target"], paths.get("draft")).n_ctx


def _int(s: str | None) -> int | None:
    try:
        return int(s) if s is not None else None
    except ValueError:
        return None


def _sysctl(name: str) -> str | None:
    if sys.platform != "darwin":
        return None
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _physical_cores() -> int | None:
    if sys.platform == "darwin":
        return _int(_sysctl("hw.physicalcpu"))
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    cores, phys = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = value.strip()
        elif key == "core id":
            cores.add((phys, value.strip()))
    return len(cores) or None


def _usable_cpus() -> float | None:
    n: float | None = None
    if hasattr(os, "sched_getaffinity"):
        n = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            q = int(quota) / int(period)
            n = q if n is None else min(n, q)
    except (OSError, ValueError):
        pass
    return n


def _gpu_hardware() -> list[str]:
    found = []
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists():
        found.append("NVIDIA GPU (CUDA)")
    if Path("/dev/kfd").exists():
        found.append("AMD GPU (ROCm)")
    if sys.platform == "darwin" and (platform.machine() == "arm64" or _sysctl("sysctl.proc_translated") == "1"):
        found.append("Apple GPU (Metal)")
    return found


def _llama_facts(f: Facts) -> None:
    try:
        import llama_cpp

        from localspec.backends.llama.backend import gpu_kind
    except Exception as e:  # a broken build is exactly what doctor is for
        f.llama_error = f"{type(e).__name__}: {e}"
        return
    f.llama_version = getattr(llama_cpp, "__version__", "?")
    f.llama_gpu = gpu_kind()
    try:
        f.llama_system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    except Exception:
        pass
    try:
        from localspec.backends.llama import ext as llama_ext

        f.llama_drafters = {name: s.reason for name, s in llama_ext.all_family_status().items()}
    except Exception as e:  # the staging symbols are exactly what may break between releases
        f.llama_drafters = {"all": f"{type(e).__name__}: {e}"}


def _mlx_facts(f: Facts) -> None:
    from localspec.backends.registry import MLX
    from localspec.families import registry

    if not MLX.installed():
        return
    try:
        from importlib.metadata import version

        import mlx.core as mx

        f.mlx_version = version("mlx")
        f.mlx_device = str(mx.default_device())
        f.mlx_heads = [fam.name for fam in registry.head_families() if fam.runs_on(MLX.name)]
    except Exception as e:
        f.mlx_device = f"unavailable ({type(e).__name__}: {e})"


def _model_paths(args: argparse.Namespace, f: Facts) -> list[tuple[str, str]]:
    """The models to check: --target/--draft, --pair, or the default pair when none is given and it is
    downloaded (doctor does not download; a missing --pair is an error, a missing default a note)."""
    from localspec.errors import NotDownloadedError
    from localspec.options import chosen_pair

    target, draft = args.target, args.draft
    pair = chosen_pair(args)
    if pair and not (target or draft):
        from localspec.backends.registry import resolve_backend
        from localspec.catalog import resolve_pair

        f.pair, f.pair_note = pair, "" if args.pair else "the default pair"
        try:
            target, draft = resolve_pair(pair, resolve_backend(args.backend)[0])
        except NotDownloadedError:
            if args.pair:
                raise
            f.pair_note = "the default pair, not downloaded: its memory needs are not checked"
    return [(role, p) for role, p in (("target", target), ("draft", draft)) if p]


def _model_facts(role: str, path: str) -> dict[str, Any]:
    from localspec import recurrent

    p = Path(path).expanduser()
    out: dict[str, Any] = {"role": role, "path": str(p)}
    if p.is_dir():
        out["size"] = sum(x.stat().st_size for x in p.rglob("*") if x.is_file())
        try:
            model_type = json.loads((p / "config.json").read_text()).get("model_type")
            out["recurrent"] = recurrent.describe(model_type, recurrent.HF)
        except (OSError, ValueError):
            pass
        return out
    try:
        out["size"] = p.stat().st_size
        from localspec.gguf_meta import read_gguf_header

        h = read_gguf_header(p)
        m, a = h.metadata, h.architecture
        out["recurrent"] = recurrent.describe(a, recurrent.GGUF)
        out["layers"] = m.get(f"{a}.block_count")
        out["ctx_train"] = m.get(f"{a}.context_length")
        # f16 K and V for every layer: the KV cache's bytes per context token
        out["kv_bytes_per_token"] = model_shape(str(p)).kv_bytes_per_token
    except Exception as e:
        out["error"] = str(getattr(e, "message", e))
    return out


def _measure(args: argparse.Namespace, paths: dict[str, str]) -> dict[str, Any]:
    from localspec.bench.costs import CostSamples, current_load, judge
    from localspec.decoding.calibrate import measure
    from localspec.options import ModelOptions
    from localspec.pipeline import load_pipeline

    opts = ModelOptions(
        target=paths["target"],
        draft=paths.get("draft"),
        backend=args.backend,
        draft_method="model" if "draft" in paths else "none",
        n_ctx=min(args.n_ctx or 2048, 2048),
        threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
    )
    pipeline = load_pipeline(opts)
    try:
        target = pipeline.target
        prompt = target.tokenize("def fibonacci(n):\n    " * 16, add_special=True, parse_special=False)
        target.forward(prompt, all_logits=False)
        drafter = pipeline.drafter if pipeline.draft is not None else None
        load = current_load()  # before the timing passes add this process's own threads to it
        calibration = measure(target, drafter, prompt, max_batch=9, reps=3)
        costs = calibration.costs
        verdict = judge(costs.target, CostSamples.of_pairs(calibration.timings), [load])
        spread = calibration.timings.spread
        return {"device": target.info.device, **costs.as_dict(), "load": load.to_json(), "spread": spread,
                "reliable": verdict.reliable, "reasons": list(verdict.reasons)}  # fmt: skip
    finally:
        pipeline.close()


# -- the rules -----------------------------------------------------------------------------------------


def findings(f: Facts) -> list[Finding]:
    out: list[Finding] = []
    if f.rosetta:
        out.append(
            Finding(
                "fix",
                "Python runs under Rosetta (x86_64 on Apple silicon): no Metal, slow CPU code",
                "install an arm64 Python (e.g. from python.org or `brew install python`) and reinstall localspec",
            )
        )
    if f.llama_error:
        out.append(
            Finding(
                "fix" if f.backend == LLAMA.name else "warn",
                f"llama-cpp-python does not load: {f.llama_error}",
                "pip install -U llama-cpp-python",
            )
        )
    elif f.llama_gpu is None and f.gpu_hardware and f.backend == LLAMA.name:
        hw = ", ".join(f.gpu_hardware)
        flag = "-DGGML_METAL=on" if "Metal" in hw else "-DGGML_HIPBLAS=on" if "ROCm" in hw else "-DGGML_CUDA=on"
        out.append(
            Finding(
                "fix",
                f"this machine has {hw} but llama-cpp-python was built for the CPU only",
                f'reinstall it with the GPU backend: CMAKE_ARGS="{flag}" pip install --force-reinstall '
                "--no-cache-dir llama-cpp-python",
            )
        )
    if f.llama_gpu is not None and f.n_gpu_layers >= 0 and f.backend == LLAMA.name:
        for m in f.models:
            layers = m.get("layers")
            if layers and f.n_gpu_layers < int(layers) + 1:
                out.append(
                    Finding(
                        "fix",
                        f"--n-gpu-layers {f.n_gpu_layers} leaves layers of the {m['role']} "
                        f"({layers} + output) on the CPU: every token waits for the slowest device",
                        "use --n-gpu-layers -1 (all) if it fits in GPU memory; otherwise a smaller quant or model",
                    )
                )
    usable = f.usable_cpus
    if f.threads and usable and f.threads > usable + 1e-9 and f.llama_gpu is None:
        why = "an explicit --threads" if f.threads_explicit else "localspec's default (all logical CPUs)"
        out.append(
            Finding(
                "fix",
                f"{f.threads} threads ({why}) but this process may use only {usable:g} CPUs "
                "(affinity or container quota): threads wait on each other",
                f"pass --threads {max(1, int(usable))}",
            )
        )
    elif f.threads and f.physical_cores and f.threads > f.physical_cores and f.llama_gpu is None:
        out.append(
            Finding(
                "warn",
                f"{f.threads} threads on {f.physical_cores} physical cores: SMT siblings "
                "rarely help llama.cpp and often slow it",
                f"try --threads {f.physical_cores}",
            )
        )
    cpus = usable or f.logical_cpus
    if f.load_avg is not None and cpus and f.load_avg > 0.75 * cpus and f.llama_gpu is None:
        out.append(
            Finding(
                "warn",
                f"the CPUs are busy (load average {f.load_avg:.1f} on {cpus:g} CPUs): llama.cpp's "
                "threads wait for each other when one is descheduled, and every timing is noisy",
                "close other CPU-heavy programs before measuring or decoding; or try fewer --threads",
            )
        )
    if f.performance_cores and f.threads and f.threads > f.performance_cores and f.llama_gpu is None:
        out.append(
            Finding(
                "warn",
                f"{f.threads} threads but {f.performance_cores} performance cores: "
                "efficiency cores hold the others back",
                f"try --threads {f.performance_cores}",
            )
        )
    total_size = sum(int(m.get("size") or 0) for m in f.models)
    kv = sum(int(m.get("kv_bytes_per_token") or 0) for m in f.models) * f.n_ctx
    need = total_size + kv
    if f.models and f.mem_available:
        if need > f.mem_available:
            out.append(
                Finding(
                    "fix",
                    f"the models ({format_bytes(total_size)}) and their KV caches at --n-ctx {f.n_ctx} "
                    f"({format_bytes(kv)}) need more than the {format_bytes(f.mem_available)} of free memory: "
                    "the system will page, far slower than any speculation gains",
                    "close other programs, lower --n-ctx, or pick a smaller quantization",
                )
            )
        elif need > 0.8 * f.mem_available:
            out.append(
                Finding(
                    "warn",
                    f"the pair needs {format_bytes(need)} of the {format_bytes(f.mem_available)} free",
                    "little headroom: other programs may push it into paging",
                )
            )
    for m in f.models:
        ctx = m.get("ctx_train")
        if ctx and f.n_ctx > int(ctx):
            out.append(
                Finding(
                    "warn",
                    f"--n-ctx {f.n_ctx} exceeds the {m['role']}'s trained context ({ctx})",
                    f"use --n-ctx {ctx} or less",
                )
            )
        if m.get("error"):
            out.append(Finding("fix", f"cannot read the {m['role']} model: {m['error']}", "check the path"))
        if m.get("recurrent"):
            out.append(
                Finding(
                    "info",
                    f"the {m['role']} is {m['recurrent']}",
                    "`localspec bench` shows the rollback cost per round next to the verify cost",
                )
            )
    if f.pair and not f.models:
        out.append(
            Finding(
                "info",
                f"no model given, and the default pair {f.pair} is not downloaded",
                f'`localspec pull {f.pair}` (or `localspec run --yes "..."`) downloads it; '
                "then doctor checks its memory needs",
            )
        )
    if sys.platform == "darwin" and f.machine == "arm64" and f.mlx_version is None:
        out.append(
            Finding(
                "info",
                "MLX is not installed: on Apple silicon it is often the fastest backend",
                "pip install 'localspec[mlx]'",
            )
        )
    if f.measured:
        out.extend(_measured_findings(f.measured))
    elif f.llama_gpu is None and f.backend == LLAMA.name and not f.llama_error:
        out.append(
            Finding(
                "info",
                "CPU decoding: a batch of k+1 tokens costs much more than one, so a model draft "
                "roughly breaks even; n-gram drafts (free) win on text that repeats its input",
                "`--draft-method auto` measures this and falls back to plain decoding; "
                "`localspec doctor --measure` shows the numbers",
            )
        )
    return out


def _measured_findings(m: dict[str, Any]) -> list[Finding]:
    t = {int(k): v for k, v in m.get("target_s", {}).items()}
    if 1 not in t:
        return []
    t1 = t[1]
    d = m.get("draft_token_s")
    out = []
    if not m.get("reliable", True):  # no bound from timings that cannot be trusted
        why = "; ".join(m.get("reasons") or ["unknown"])
        return [Finding("warn", f"the measured costs look unreliable ({why}): no bound derived from them",
                        "measure again when the machine is quiet (close other CPU-heavy programs)")]  # fmt: skip
    if d is not None:
        best = max(((j + 1) / (j * d + t.get(j + 1, t[max(t)])), j) for j in range(1, max(t)))
        ceiling = best[0] * t1
        sev: Severity = "warn" if ceiling < 1.2 else "info"
        out.append(
            Finding(
                sev,
                f"with every draft token accepted, a model draft could reach at most {ceiling:.2f}x "
                f"here (k={best[1]}; draft {d / t1:.2f}x of a target token, target batch of "
                f"{best[1] + 1} {t.get(best[1] + 1, 0) / t1:.2f}x of one)",
                "below ~1.2x a model draft is not worth it on this device: use ngram or auto" if ceiling < 1.2 else "",
            )
        )
    if 5 in t:
        out.append(Finding("info", f"target: {t1 * 1e3:.1f} ms per token; a batch of 5 costs {t[5] / t1:.2f}x one"))
    return out


def report_lines(f: Facts, found: list[Finding]) -> list[str]:
    lines = [
        f"system     {f.os} {f.machine}" + (" (under Rosetta)" if f.rosetta else ""),
        f"cpu        {f.logical_cpus} logical, {f.physical_cores or '?'} physical cores"
        + (f", {f.performance_cores} performance" if f.performance_cores else "")
        + (f", {f.usable_cpus:g} usable by this process" if f.usable_cpus else "")
        + (f", load average {f.load_avg:.1f}" if f.load_avg is not None else ""),
        f"memory     {format_bytes(f.mem_available)} free of {format_bytes(f.mem_total)}"
        if f.mem_available and f.mem_total
        else "memory     unknown",
        f"gpu        {', '.join(f.gpu_hardware) or 'none found'}",
        "llama.cpp  "
        + (
            f"not loadable: {f.llama_error}"
            if f.llama_error
            else f"llama-cpp-python {f.llama_version}, {'GPU: ' + f.llama_gpu if f.llama_gpu else 'CPU-only build'}"
        ),
    ]
    if f.llama_system_info:
        feats = [p.split("=")[0].strip() for p in f.llama_system_info.replace("CPU :", "").split("|") if "= 1" in p]
        lines.append(f"           features: {' '.join(feats)}")
    for family, reason in f.llama_drafters.items():
        lines.append(f"           --draft-method {family}: {reason}")
    lines.append(
        f"mlx        {('mlx ' + f.mlx_version + ', device ' + str(f.mlx_device)) if f.mlx_version else 'not installed'}"
    )
    if f.mlx_heads:
        lines.append(f"           head drafters: {', '.join(f.mlx_heads)} (their Hugging Face directories as --draft)")
    lines.append(
        f"settings   backend {f.backend}, threads {f.threads}{' (default)' if not f.threads_explicit else ''}, "
        f"n_ctx {f.n_ctx}, n_batch {f.n_batch}, n_gpu_layers {f.n_gpu_layers}"
    )
    if f.pair:
        lines.append(f"pair       {f.pair}" + (f" ({f.pair_note})" if f.pair_note else ""))
    for m in f.models:
        extra = ", ".join(f"{k} {m[k]}" for k in ("layers", "ctx_train") if m.get(k) is not None)
        size = format_bytes(m["size"]) if m.get("size") else "?"
        lines.append(f"{m['role']:<10} {m['path']} ({size}{', ' + extra if extra else ''})")
    if f.measured:
        t = f.measured.get("target_s", {})
        t1 = t.get("1")
        if t1:
            curve = " ".join(f"{n}:{v / t1:.2f}x" for n, v in t.items())
            lines.append(f"measured   {f.measured.get('device')}: target {t1 * 1e3:.1f} ms/token, batch {curve}")
            load = f.measured.get("load") or {}
            avg = load.get("load_avg_1m")
            lines.append(f"           load average {'?' if avg is None else f'{avg:.1f}'} on {load.get('cpus', '?')} CPUs "
                         f"at measurement, timings spread {f.measured.get('spread', 0.0):.0%} IQR/median"
                         + ("" if f.measured.get("reliable", True) else " (unreliable)"))  # fmt: skip
        if f.measured.get("draft_token_s") and t1:
            d = f.measured["draft_token_s"]
            lines.append(f"           draft {d * 1e3:.1f} ms/token ({d / t1:.2f}x of the target)")
        if f.measured.get("rollback_round_s") and t1:
            r = f.measured["rollback_round_s"]
            lines.append(f"           rollback after a rejection {r * 1e3:.2f} ms ({r / t1:.2f}x of a target token)")
    lines.append("")
    if not found:
        lines.append("ok: nothing in the base configuration costs more than speculation could win back")
    for x in found:
        tag = {"fix": "FIX FIRST", "warn": "warning", "info": "note"}[x.severity]
        lines.append(f"{tag}: {x.message}")
        if x.hint:
            lines.append(f"    -> {x.hint}")
    return lines
