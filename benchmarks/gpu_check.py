"""The GPU check: what speculation can win on a CUDA machine, in one short offline command.

On a machine with CUDA, CMake, ninja and a Python with numpy, and no network, from the payload that
`benchmarks/gpu_prepare.py` wrote (llama.cpp sources, the llama-cpp-python bindings, gguf, localspec,
the Qwen2.5 tokenizer):

1. builds llama.cpp's shared library with CUDA for the GPU present (sm_90 on Hopper) and
   `llama-speculative-simple`, and points the carried bindings at the library it built;
2. writes random-weight GGUF models with the shapes of Qwen2.5 0.5B (draft), 1.5B and 7B (targets)
   and the real tokenizer, and quantizes them to Q4_K_M (speed does not depend on the weights' values);
3. measures with that build: the target's cost for batches of 1..64 tokens, the draft's cost per
   token, localspec's per-round overhead (Python, sampling, verification) at k=4 and k=8 with
   draft = target (every draft accepted), plain decoding through the engine against
   llama-cpp-python's own loop, and the speculative run with draft = target against llama.cpp's own
   `llama-speculative-simple` on the same files;
4. writes gpu_check.json and gpu_check.txt (a readable table) to the output folder and prints the
   speedup the measured costs allow at acceptance 0.6, 0.8 and 0.95.

`--cpu` runs every step but the CUDA build: it builds the CPU library (or reuses one, `--lib-dir`),
so the whole path is tested on machines without a GPU; `--shapes tiny` makes it take seconds.

    python benchmarks/gpu_check.py --out OUT                     # on the GPU machine
    # from a session with the device tool: run(command="PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py
    #     --out $OUT", carry=["benchmarks/gpu_payload"], timeout_s=580)
    python benchmarks/gpu_check.py --cpu --shapes 1.5b --lib-dir DIR --tools-dir DIR --out OUT
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_PAYLOAD = HERE / "gpu_payload"
ACCEPTANCES = (0.6, 0.8, 0.95)
OVERHEAD_KS = (4, 8)
Q4_K_M = 15  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_K_M
EMBED_STD, OUTPUT_STD, LAYER_STD = 1.0, 0.02, 0.002  # random weights' scales (see write_model)
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # some VMs report AMX but trap it (README, Install)


@dataclass(frozen=True)
class Shape:
    """A Qwen2 architecture's sizes (the vocabulary comes from the carried tokenizer)."""

    name: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    tied: bool  # output projection shares the token embedding


SHAPES = {
    "0.5b": Shape("qwen2.5-0.5b-shape", 896, 24, 14, 2, 4864, True),
    "1.5b": Shape("qwen2.5-1.5b-shape", 1536, 28, 12, 2, 8960, True),
    "7b": Shape("qwen2.5-7b-shape", 3584, 28, 28, 4, 18944, False),
    "tiny-draft": Shape("tiny-draft", 64, 2, 4, 2, 128, True),
    "tiny": Shape("tiny-target", 128, 3, 4, 2, 256, False),
}
SHAPE_SETS = {"real": ("1.5b", "7b"), "tiny": ("tiny",)}


@dataclass
class Settings:
    cpu: bool
    targets: tuple[str, ...]
    draft: str
    payload: Path
    out: Path
    work: Path
    lib_dir: Path | None
    tools_dir: Path | None
    tools: bool
    threads: int
    tokens: int
    reps: int
    sizes: tuple[int, ...]
    budget_s: float
    build_jobs: int
    reuse_models: bool


@dataclass
class Report:
    """Everything the check found; gpu_check.json is this, gpu_check.txt its table."""

    mode: str
    settings: dict[str, Any]
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase
    build: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)  # CPUs and load: what a CPU figure is worth


def main() -> None:
    s = parse_args()
    t0 = time.perf_counter()
    report = Report(mode="cpu" if s.cpu else "cuda", settings={k: str(v) for k, v in asdict(s).items()})
    s.out.mkdir(parents=True, exist_ok=True)
    s.work.mkdir(parents=True, exist_ok=True)
    site = stage_site(s)
    report.machine = {"cpus": os.cpu_count(), "load_start": os.getloadavg()[0]}
    try:
        run_all(s, report, site, t0)
    finally:
        report.phases["total"] = time.perf_counter() - t0
        report.machine["load_end"] = os.getloadavg()[0]
        write_outputs(s, report)


def parse_args() -> Settings:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="every step but the CUDA build (CPU library, no offload)")
    ap.add_argument("--shapes", default="real", help="real (1.5b,7b), tiny, or targets from: 1.5b,7b,0.5b")
    ap.add_argument("--draft", default=None, help="draft shape (default: 0.5b; tiny-draft for --shapes tiny)")
    ap.add_argument("--payload", type=Path, default=DEFAULT_PAYLOAD)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check_out"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/localspec-gpu-check"), help="build tree and models")
    ap.add_argument(
        "--lib-dir", type=Path, help="reuse this folder's libllama.so (and its ggml libraries): no library build"
    )
    ap.add_argument("--tools-dir", type=Path, help="reuse this folder's llama-speculative-simple: no tools build")
    ap.add_argument("--no-tools", action="store_true", help="skip llama-speculative-simple (build and comparison)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per generation run")
    ap.add_argument("--reps", type=int, default=3, help="timed passes per batch size; repetitions of each comparison")
    ap.add_argument("--sizes", default=None, help="batch sizes to time (default 1..64; --cpu: a sparse 1..64)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip later targets once this much time has passed (default: 450 s on a GPU, none with --cpu)",
    )
    ap.add_argument("--reuse-models", action="store_true", help="keep Q4_K_M models already in --work (a second run)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel build jobs")
    a = ap.parse_args()
    targets = SHAPE_SETS.get(a.shapes) or tuple(x.strip() for x in a.shapes.split(",") if x.strip())
    draft = a.draft or ("tiny-draft" if a.shapes == "tiny" else "0.5b")
    for name in (*targets, draft):
        if name not in SHAPES:
            ap.error(f"unknown shape {name!r}: use real, tiny or a list from {', '.join(SHAPES)}")
    if not (a.payload / "site").is_dir():
        ap.error(f"no payload at {a.payload}: run `python benchmarks/gpu_prepare.py` first (it prints where it wrote)")
    if a.lib_dir is None and not (a.payload / "llama.cpp").is_dir():
        ap.error(f"{a.payload} has no llama.cpp sources to build: prepare it with an sdist, or pass --lib-dir")
    if a.sizes:
        sizes = tuple(sorted({int(x) for x in a.sizes.split(",")}))
    else:
        sizes = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32, 48, 64) if a.cpu else tuple(range(1, 65))
    return Settings(
        cpu=a.cpu, targets=targets, draft=draft, payload=a.payload.resolve(), out=a.out.resolve(),
        work=a.work.resolve(), lib_dir=a.lib_dir, tools_dir=a.tools_dir, tools=not a.no_tools,
        threads=a.threads, tokens=a.tokens, reps=a.reps, sizes=sizes, build_jobs=a.jobs, reuse_models=a.reuse_models,
        budget_s=a.budget_s if a.budget_s is not None else (float("inf") if a.cpu else 450.0),
    )  # fmt: skip


def log(msg: str) -> None:
    print(f"[gpu_check] {msg}", flush=True)


# -- build --------------------------------------------------------------------------------------


def stage_site(s: Settings) -> Path:
    """A fresh copy of the carried packages; the built library goes into its llama_cpp/lib."""
    site = s.work / "site"
    if site.exists():
        shutil.rmtree(site)
    shutil.copytree(s.payload / "site", site)
    return site


def build_command(s: Settings) -> tuple[list[list[str]], dict[str, str]]:
    """CMake configure and build commands for the library (and llama-speculative-simple)."""
    src, build = s.payload / "llama.cpp", s.work / "build"
    env = dict(os.environ)
    cfg = [
        "cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
        f"-DLLAMA_BUILD_COMMON={'ON' if s.tools else 'OFF'}", f"-DLLAMA_BUILD_EXAMPLES={'ON' if s.tools else 'OFF'}",
    ]  # fmt: skip
    if s.cpu:
        cfg.append("-DGGML_CUDA=OFF")
    else:
        cfg += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch()}"]
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        env.setdefault("CUDACXX", nvcc)
    if platform.machine() in ("x86_64", "AMD64"):  # AMX only speeds up CPU matmuls; a trap kills the run
        env["CFLAGS"] = f"{env.get('CFLAGS', '')} {NO_AMX}".strip()
        env["CXXFLAGS"] = f"{env.get('CXXFLAGS', '')} {NO_AMX}".strip()
    targets = ["llama"] + (["llama-speculative-simple"] if s.tools and s.tools_dir is None else [])
    return [cfg, ["cmake", "--build", str(build), "-j", str(s.build_jobs), "--target", *targets]], env


def cuda_arch() -> str:
    """The present GPU's compute capability as CMake wants it (90 for Hopper); 90 when it cannot tell."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        return out[0].replace(".", "") if out else "90"
    except (OSError, subprocess.SubprocessError):
        return "90"


def start_build(s: Settings) -> subprocess.Popen[bytes] | None:
    """Start configure + build in the background (models are written meanwhile); None if nothing to build."""
    if s.lib_dir is not None and (s.tools_dir is not None or not s.tools):
        return None
    cmds, env = build_command(s)
    script = " && ".join(" ".join(_quote(c) for c in cmd) for cmd in cmds)
    log_file = (s.work / "build.log").open("wb")
    log(f"building llama.cpp ({'CPU' if s.cpu else 'CUDA'}) in the background: {s.work / 'build.log'}")
    return subprocess.Popen(["bash", "-c", script], stdout=log_file, stderr=subprocess.STDOUT, env=env)


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def finish_build(s: Settings, proc: subprocess.Popen[bytes] | None, report: Report) -> None:
    if proc is not None:
        rc = proc.wait()
        tail = (s.work / "build.log").read_text(errors="replace").splitlines()[-30:]
        report.build = {"rc": rc, "log_tail": tail}
        if rc != 0:
            raise SystemExit("the llama.cpp build failed:\n" + "\n".join(tail))
    lib_dir = s.lib_dir or (s.work / "build" / "bin")
    libs = [p for p in Path(lib_dir).iterdir() if p.name.startswith("lib") and ".so" in p.name]
    if not any(p.name == "libllama.so" for p in libs):
        raise SystemExit(f"no libllama.so in {lib_dir}")
    dest = s.work / "site" / "llama_cpp" / "lib"
    dest.mkdir(parents=True, exist_ok=True)
    for p in libs:
        shutil.copy2(p, dest / p.name, follow_symlinks=True)
    report.build["libraries"] = sorted(p.name for p in libs)
    report.build["lib_dir"] = str(lib_dir)


def speculative_simple(s: Settings) -> Path | None:
    if not s.tools:
        return None
    exe = (s.tools_dir or (s.work / "build" / "bin")) / "llama-speculative-simple"
    return exe if exe.is_file() else None


# -- models -------------------------------------------------------------------------------------


def write_model(path: Path, shape: Shape, tokenizer: dict[str, Any], *, seed: int) -> None:
    """A random-weight Qwen2 GGUF in F16 (norms and biases F32), streamed tensor by tensor.

    What a forward pass costs does not depend on the values, so they come from one random pool read at
    shifting offsets (writing gigabytes of fresh random numbers would cost more than the check). The
    scales keep the model far from chaos: large embeddings and small layer weights make each output a
    stable function of the context, so batched and one-token passes agree on every greedy choice and a
    draft equal to the target is accepted throughout. (With weights of the usual 0.02, the greedy
    choices of 28 random layers flip on last-bit differences and such a draft lost 40% of its tokens.)
    """
    import gguf
    import numpy as np

    n_vocab = len(tokenizer["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    unit = rng.standard_normal(1 << 22 | 1)  # odd length: rows differ
    pools = {scale: (unit * scale).astype(np.float16) for scale in (EMBED_STD, OUTPUT_STD, LAYER_STD)}
    tensors = qwen2_tensors(shape, n_vocab)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(shape.name)
    w.add_context_length(32768)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value in tokenizer.items():
        _add_metadata(w, key, value)
    for name, dims in tensors.items():
        dtype = np.float32 if len(dims) == 1 else np.float16
        w.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    offset = 0
    for name, dims in tensors.items():
        n = int(np.prod(dims))
        if len(dims) == 1:
            t = np.ones(dims, np.float32) if name.endswith("norm.weight") else np.zeros(dims, np.float32)
        else:
            scale = EMBED_STD if name == "token_embd.weight" else OUTPUT_STD if name == "output.weight" else LAYER_STD
            t = np.resize(np.roll(pools[scale], offset), n).reshape(dims)
            offset += 7919
        w.write_tensor_data(t)
    w.close()


def qwen2_tensors(shape: Shape, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """numpy (row-major) shapes of a Qwen2 model's tensors, in file order."""
    e, hd = shape.n_embd, shape.n_embd // shape.n_head
    kv = shape.n_head_kv * hd
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, e)}
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        out |= {
            b + "attn_norm.weight": (e,), b + "attn_q.weight": (e, e), b + "attn_q.bias": (e,),
            b + "attn_k.weight": (kv, e), b + "attn_k.bias": (kv,), b + "attn_v.weight": (kv, e),
            b + "attn_v.bias": (kv,), b + "attn_output.weight": (e, e), b + "ffn_norm.weight": (e,),
            b + "ffn_gate.weight": (shape.n_ff, e), b + "ffn_up.weight": (shape.n_ff, e),
            b + "ffn_down.weight": (e, shape.n_ff),
        }  # fmt: skip
    out["output_norm.weight"] = (e,)
    if not shape.tied:
        out["output.weight"] = (n_vocab, e)
    return out


def _add_metadata(w: Any, key: str, value: object) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, list):
        w.add_array(key, value)
    else:
        raise TypeError(f"unsupported metadata {key}: {type(value)}")


def quantize(src: Path, dst: Path, threads: int) -> None:
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = Q4_K_M
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"quantizing {src.name} failed (llama_model_quantize returned {rc})")


def write_f16_models(s: Settings, names: list[str], report: Report) -> dict[str, Path]:
    tokenizer = json.loads(gzip.open(s.payload / "tokenizer.json.gz", "rt", encoding="utf-8").read())
    out = {}
    for i, name in enumerate(names):
        path = s.work / f"{name}-f16.gguf"
        t0 = time.perf_counter()
        write_model(path, SHAPES[name], tokenizer, seed=i)
        report.models[name] = {"f16_bytes": path.stat().st_size, "write_s": time.perf_counter() - t0}
        log(f"wrote {path.name}: {path.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")
        out[name] = path
    return out


def q4_path(s: Settings, name: str) -> Path:
    return s.work / f"{name}-q4_k_m.gguf"


def quantize_models(s: Settings, f16: dict[str, Path], report: Report) -> dict[str, Path]:
    out = {}
    for name, src in f16.items():
        dst = q4_path(s, name)
        t0 = time.perf_counter()
        quantize(src, dst, os.cpu_count() or 1)  # not a measurement: every core
        src.unlink()
        report.models[name] |= {"q4_k_m_bytes": dst.stat().st_size, "quantize_s": time.perf_counter() - t0}
        log(f"quantized {dst.name}: {dst.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")
        out[name] = dst
    return out


# -- measurements -------------------------------------------------------------------------------


def run_all(s: Settings, report: Report, site: Path, t0: float) -> None:
    proc = start_build(s)
    sys.path.insert(0, str(site))  # the carried packages first: gguf now, llama_cpp once the library is in
    sys.path.insert(1, str(HERE))  # engine_overhead's loops
    phase = time.perf_counter()
    names = [s.draft, *s.targets]
    ready = {n: q4_path(s, n) for n in names if s.reuse_models and q4_path(s, n).is_file()}
    for n, p in ready.items():
        report.models[n] = {"q4_k_m_bytes": p.stat().st_size, "reused": True}
    f16 = write_f16_models(s, [n for n in names if n not in ready], report)
    report.phases["write_models"] = time.perf_counter() - phase
    phase = time.perf_counter()
    finish_build(s, proc, report)
    report.phases["build_wait"] = time.perf_counter() - phase
    import llama_cpp

    import localspec
    from localspec.backends import llama_cpp as backend

    report.build["code"] = {m.__name__: m.__file__ for m in (llama_cpp, localspec, backend)}  # the payload's copies
    backend._init_llama()  # quiet llama.cpp's log before quantizing
    phase = time.perf_counter()
    models = ready | quantize_models(s, f16, report)
    report.phases["quantize"] = time.perf_counter() - phase
    for name in s.targets:
        if time.perf_counter() - t0 > s.budget_s:
            report.notes.append(f"{name}: skipped, the {s.budget_s:.0f} s budget was spent")
            log(report.notes[-1])
            continue
        phase = time.perf_counter()
        tool = speculative_simple(s)
        if s.tools and tool is None:
            report.notes.append(f"{name}: llama-speculative-simple was not found: no comparison with llama.cpp's loop")
        try:
            report.targets[name] = measure_target(s, models[name], models[s.draft], tool)
        except Exception as e:  # one chance on the machine: keep what the other targets measured
            report.notes.append(f"{name}: measurement failed: {type(e).__name__}: {e}")
            log(report.notes[-1])
            continue
        finally:
            report.phases[f"measure_{name}"] = time.perf_counter() - phase
        report.build.setdefault("device", report.targets[name].get("device"))


def measure_target(s: Settings, target_path: Path, draft_path: Path, tool: Path | None) -> dict[str, Any]:
    from engine_overhead import PROMPT  # type: ignore[import-not-found]

    from localspec.backends import llama_cpp as backend
    from localspec.decoding.calibrate import measure
    from localspec.decoding.drafters import ModelDrafter

    ngl = 0 if s.cpu else -1
    load = dict(n_ctx=4096, threads=s.threads, n_gpu_layers=ngl)
    result: dict[str, Any] = {"target": target_path.name, "draft": draft_path.name}
    target = backend.load(target_path, **load)
    draft = backend.load(draft_path, **load)
    try:
        prompt = target.tokenize(PROMPT, add_special=True, parse_special=True)
        result["device"] = target.info.device
        result["prompt_tokens"] = len(prompt)
        target.rollback(0)
        target.forward(prompt, all_logits=False)
        costs = measure(
            target,
            ModelDrafter(draft),
            prompt,
            max_batch=max(s.sizes),
            sizes=s.sizes,
            reps=s.reps,
            stat=statistics.median,
        ).costs
        result["target_s"] = {str(n): costs.target_s(n) for n in s.sizes}
        result["draft_token_s"] = costs.draft_token
        log(f"{target_path.name}: T(1) {costs.target_s(1) * 1e3:.2f} ms, T(8) {costs.target_s(8) * 1e3:.2f} ms, "
            f"T(64) {costs.target_s(64) * 1e3:.2f} ms; draft {costs.draft_token * 1e3 if costs.draft_token else 0:.2f} ms/token")  # fmt: skip
    finally:
        draft.close()
    try:
        result["plain"] = plain_vs_llama_cpp_python(s, target, target_path, prompt)
        self_draft = backend.load(target_path, **load)
        try:
            result["rounds"] = {str(k): spec_rounds(s, target, self_draft, prompt, k) for k in OVERHEAD_KS}
        finally:
            self_draft.close()
    finally:
        target.close()
    if tool is not None:
        result["llama_speculative_simple"] = {
            str(k): run_speculative_simple(s, tool, target_path, PROMPT, k) for k in OVERHEAD_KS
        }
    result["allowed_speedup"] = allowed_speedups(result)
    return result


def plain_vs_llama_cpp_python(s: Settings, target: Any, path: Path, prompt: list[int]) -> dict[str, Any]:
    """engine_overhead.py's comparison: plain decoding through the engine vs llama-cpp-python's loop."""
    import llama_cpp
    from engine_overhead import engine_tps, llama_tps  # type: ignore[import-not-found]

    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=4096, n_threads=s.threads, n_threads_batch=s.threads, n_batch=512,
        n_ubatch=512, n_gpu_layers=0 if s.cpu else -1, verbose=False,
    )  # fmt: skip
    try:
        _, n = engine_tps(target, prompt, s.tokens)
        llama_tps(llm, prompt, n)  # warm-up
        ours, theirs = [], []
        for rep in range(s.reps):  # alternate which goes first, as engine_overhead.py does
            if rep % 2 == 0:
                ours.append(engine_tps(target, prompt, n)[0])
                theirs.append(llama_tps(llm, prompt, n))
            else:
                theirs.append(llama_tps(llm, prompt, n))
                ours.append(engine_tps(target, prompt, n)[0])
    finally:
        llm.close()
    out = {"tokens": n, "engine_tps": ours, "llama_cpp_python_tps": theirs,
           "ratio": statistics.median(a / b for a, b in zip(ours, theirs))}  # fmt: skip
    log(
        f"plain decoding: engine {statistics.median(ours):.1f} tok/s, llama-cpp-python {statistics.median(theirs):.1f} tok/s"
    )
    return out


class TimedForward:
    """A backend whose forward passes are timed (everything else passes through): the time a run spends
    outside them is localspec's own (Python, sampling, verification, bookkeeping)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def forward(self, tokens: Any, *, all_logits: bool = True) -> Any:
        t0 = time.perf_counter()
        try:
            return self._backend.forward(tokens, all_logits=all_logits)
        finally:
            self.seconds += time.perf_counter() - t0


def spec_rounds(s: Settings, target: Any, self_draft: Any, prompt: list[int], k: int) -> dict[str, Any]:
    """Speculative decoding with draft = target at temperature 0 (every draft accepted but at near-ties):
    per round, the time inside both models' forward passes and the rest, localspec's overhead."""
    from localspec.decoding.drafters import ModelDrafter
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    runs = []
    for _ in range(s.reps):
        done = None
        n_rounds = 0
        tgt, dft = TimedForward(target), TimedForward(self_draft)
        config = GenerationConfig(max_tokens=s.tokens, num_draft=k, sampling=SamplingParams())
        for i, ev in enumerate(generate(tgt, ModelDrafter(dft), prompt, config)):  # type: ignore[arg-type]
            if i == 0:  # the first token: the prompt passes are over, decoding starts
                tgt.seconds = dft.seconds = 0.0
            if isinstance(ev, Done):
                done = ev
            elif ev.round is not None:
                n_rounds += 1
        assert done is not None and n_rounds
        st = done.stats
        runs.append({
            "decode_tps": st.decode_tps, "tokens": st.n_generated, "rounds": n_rounds,
            "acceptance": st.acceptance_rate, "round_s": st.decode_s / n_rounds,
            "target_forward_s": tgt.seconds / n_rounds, "draft_forward_s": dft.seconds / n_rounds,
            "overhead_s": (st.decode_s - tgt.seconds - dft.seconds) / n_rounds,
        })  # fmt: skip
    best = sorted(runs, key=lambda r: r["decode_tps"])[len(runs) // 2]  # the median run
    log(f"k={k} draft=target: {best['decode_tps']:.1f} tok/s, acceptance {best['acceptance']:.0%}, round "
        f"{best['round_s'] * 1e3:.2f} ms of which overhead {best['overhead_s'] * 1e3:.2f} ms")  # fmt: skip
    return {"median": best, "runs": runs}


_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")


def run_speculative_simple(s: Settings, tool: Path, model: Path, prompt: str, k: int) -> dict[str, Any]:
    """llama.cpp's own speculative loop, draft = target, greedy, the same draft length."""
    ngl = "0" if s.cpu else "99"
    cmd = [
        str(tool), "-m", str(model), "-md", str(model), "-ngl", ngl, "-ngld", ngl, "-c", "4096",
        "-t", str(s.threads), "-td", str(s.threads), "-n", str(s.tokens), "--temp", "0", "--top-k", "1",
        "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-p", prompt,
    ]  # fmt: skip
    runs = []
    for _ in range(s.reps):
        # A random-weight model prints arbitrary bytes: decode them leniently.
        proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=300)
        text = proc.stdout + proc.stderr
        m = _DECODED.search(text)
        if proc.returncode != 0 or m is None:
            return {"error": f"exit {proc.returncode}", "log_tail": text.splitlines()[-15:]}
        stats = {key: float(v) for key, v in re.findall(r"(n_drafted|n_accept|n_predict)\s*=\s*([\d.]+)", text)}
        runs.append(
            {"tokens": int(m.group(1)), "decode_s": float(m.group(2)), "decode_tps": float(m.group(3)), **stats}
        )
    best = sorted(runs, key=lambda r: r["decode_tps"])[len(runs) // 2]
    log(f"llama-speculative-simple k={k}: {best['decode_tps']:.1f} tok/s")
    return {"median": best, "runs": runs}


def allowed_speedups(result: dict[str, Any]) -> dict[str, Any]:
    """At each acceptance: the best draft length and the speedup the measured costs allow, from the
    model passes alone and with localspec's measured per-round overhead added (linear in k)."""
    from localspec.decoding.policy import CostModel, expected_tokens

    costs = CostModel(target={int(n): t for n, t in result["target_s"].items()}, draft_token=result["draft_token_s"])
    d, t1 = costs.draft_token or 0.0, costs.target_s(1)
    over = overhead_line(result)
    out: dict[str, Any] = {}
    for a in ACCEPTANCES:
        rows = []
        for k in range(1, max(int(n) for n in result["target_s"])):
            model_s = k * d + costs.target_s(k + 1)
            gain = expected_tokens(a, k) * t1
            rows.append({"k": k, "bound": gain / model_s, "with_overhead": gain / (model_s + max(over(k), 0.0))})
        best = max(rows, key=lambda r: r["bound"])
        best_real = max(rows, key=lambda r: r["with_overhead"])
        out[str(a)] = {"k": best["k"], "bound": best["bound"], "k_with_overhead": best_real["k"],
                       "with_overhead": best_real["with_overhead"]}  # fmt: skip
    return out


def overhead_line(result: dict[str, Any]):  # type: ignore[no-untyped-def]
    """Overhead seconds per round as a function of k, through the two measured points."""
    pts = sorted((int(k), v["median"]["overhead_s"]) for k, v in result.get("rounds", {}).items())
    if len(pts) < 2:
        return lambda k: pts[0][1] if pts else 0.0
    (k1, o1), (k2, o2) = pts[0], pts[-1]
    slope = (o2 - o1) / (k2 - k1)
    return lambda k: o1 + slope * (k - k1)


# -- output -------------------------------------------------------------------------------------


def write_outputs(s: Settings, report: Report) -> None:
    data = asdict(report)
    (s.out / "gpu_check.json").write_text(json.dumps(data, indent=1))
    text = "\n".join(table_lines(report))
    (s.out / "gpu_check.txt").write_text(text + "\n")
    if (s.work / "build.log").exists():
        shutil.copy2(s.work / "build.log", s.out / "build.log")
    print(text, flush=True)


def table_lines(r: Report) -> list[str]:
    ms = lambda x: f"{x * 1e3:8.2f}"  # noqa: E731
    lines = [f"localspec GPU check ({r.mode}); library: {r.build.get('device', '?')}"]
    lines.append("phases: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.phases.items()))
    if r.machine:
        lines.append(f"machine: {r.machine['cpus']} CPUs, load average {r.machine['load_start']:.1f} at the start, "
                     f"{r.machine.get('load_end', 0.0):.1f} at the end")  # fmt: skip
    for name, m in r.models.items():
        made = "reused" if m.get("reused") else f"from F16 {m.get('f16_bytes', 0) / 2**30:.2f} GiB"
        lines.append(f"model {name}: Q4_K_M {m.get('q4_k_m_bytes', 0) / 2**30:.2f} GiB ({made})")
    for name, t in r.targets.items():
        lines += ["", f"== target {name} ({t['target']}), draft {t['draft']}; {t.get('device', '')}"]
        if "target_s" not in t:
            continue
        t1 = t["target_s"]["1"]
        lines.append("batch n   T(n) ms   T(n)/T(1)")
        for n, v in t["target_s"].items():
            if int(n) in (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 48, 64):
                lines.append(f"{int(n):7d} {ms(v)}  {v / t1:9.2f}")
        d = t.get("draft_token_s")
        if d:
            lines.append(f"draft per token: {d * 1e3:.2f} ms = {d / t1:.2f} x T(1)")
        if "plain" in t:
            p = t["plain"]
            lines.append(
                f"plain decoding ({p['tokens']} tokens): engine {statistics.median(p['engine_tps']):.1f} tok/s, "
                f"llama-cpp-python {statistics.median(p['llama_cpp_python_tps']):.1f} tok/s, ratio {p['ratio']:.3f}"
            )
        for k, v in t.get("rounds", {}).items():
            m = v["median"]
            lines.append(
                f"draft=target k={k}: localspec {m['decode_tps']:.1f} tok/s (acceptance {m['acceptance']:.0%}); "
                f"round {m['round_s'] * 1e3:.2f} ms = forward passes {(m['target_forward_s'] + m['draft_forward_s']) * 1e3:.2f} ms"
                f" + localspec {m['overhead_s'] * 1e3:.2f} ms ({m['overhead_s'] / m['round_s']:.0%})"
            )
            sim = t.get("llama_speculative_simple", {}).get(k)
            if sim and "median" in sim:
                sm = sim["median"]
                acc = sm.get("n_accept", 0) / sm["n_drafted"] if sm.get("n_drafted") else 0.0
                lines.append(f"                 llama-speculative-simple {sm['decode_tps']:.1f} tok/s "
                             f"(acceptance {acc:.0%}); localspec / llama.cpp {m['decode_tps'] / sm['decode_tps']:.2f}")  # fmt: skip
            elif sim:
                lines.append(f"                 llama-speculative-simple failed: {sim.get('error')}")
        lines.append("acceptance  best k  speedup allowed (model passes)  best k  with localspec's overhead")
        for a, v in t.get("allowed_speedup", {}).items():
            lines.append(
                f"{float(a):10.2f}  {v['k']:6d}  {v['bound']:29.2f}x  {v['k_with_overhead']:6d}  {v['with_overhead']:24.2f}x"
            )
    lines += [f"note: {n}" for n in r.notes]
    return lines


if __name__ == "__main__":
    main()
