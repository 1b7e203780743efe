"""The GPU check: what speculation can win on a CUDA machine, in one short offline command.

On a machine with CUDA, CMake, ninja and a Python with numpy, and no network, from the payload that
`benchmarks/gpu_prepare.py` wrote (llama.cpp sources, the llama-cpp-python bindings, gguf, localspec,
the Qwen2.5 tokenizer), within one deadline (`--deadline-s`, default 530 s: a 9-minute command):

1. starts building llama.cpp's shared library with CUDA for the GPU present (sm_90 on Hopper),
   `llama-speculative-simple` and `llama-simple` in the background, and points the carried bindings at it;
2. meanwhile writes random-weight GGUF models with the shapes of Qwen2.5 0.5B (draft), 1.5B and 7B
   (targets) and the real tokenizer, directly in Q4_K (Q5_0 for rows Q4_K cannot hold, llama.cpp's own
   fallback): no F16 file and no quantizing pass (speed does not depend on the weights' values);
3. measures each target, smallest first, as soon as the library exists, if the time left covers it: the
   target's cost for batches of 1..64 tokens, the draft's cost per token, plain decoding through the
   engine against llama-cpp-python's loop and llama.cpp's own (`llama-simple`), localspec's per-round
   cost (Python, sampling, verification) at k=4 and k=8 with draft = target, the same against
   `llama-speculative-simple`, suffix and auto drafts on a continuation that repeats (random-weight
   models repeat themselves: acceptance, tokens per pass, the round's own cost; plain and suffix also
   sampled at T = 0.3, where a GPU draws each row's token in the graph), --parallel
   (4 sequences in one pass, plain and with drafts, against one at a time), and a sampled pass of 1 and
   9 rows with llama.cpp's own copies of the draws chain against the softmax alone and the ids alone
   (benchmarks/draw_copies.py: what the copies cost across PCIe);
4. writes gpu_check.json and gpu_check.txt (a readable table) to the output folder after every target
   (a run killed at its limit still returns what it measured) and prints the speedup the measured
   costs allow at acceptance 0.6, 0.8 and 0.95.

Expected phase times on an H200 (16 cores): build 270-280 s (the models are written meanwhile, about
10 s for all three), target 1.5B about 60 s, 7B about 75 s; about 420 s in all. Each phase is skipped
with a note when the deadline would not leave room for it.

`--cpu` runs every step but the CUDA build: it builds the CPU library (or reuses one, `--lib-dir`),
so the whole path is tested on machines without a GPU; `--shapes tiny` makes it take seconds.

    python benchmarks/gpu_check.py --out OUT                     # on the GPU machine
    # from a session with the device tool: run(command="PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py
    #     --out $OUT", carry=["benchmarks/gpu_payload"], timeout_s=560)
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
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_PAYLOAD = HERE / "gpu_payload"
ACCEPTANCES = (0.6, 0.8, 0.95)
OVERHEAD_KS = (4, 8)
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
    "tiny-draft": Shape("tiny-draft", 256, 2, 4, 2, 256, True),  # rows of 256: Q4_K's block
    "tiny": Shape("tiny-target", 256, 3, 4, 2, 512, False),
}
SHAPE_SETS = {"real": ("1.5b", "7b"), "tiny": ("tiny",)}
# Seconds a target's measurements take on an H200 (the deadline skips a target that would not fit).
EXPECTED_TARGET_S = {"1.5b": 60.0, "7b": 75.0, "tiny": 5.0}
PARALLEL = 4  # sequences decoded together in the parallel phase


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
    deadline_s: float  # seconds from the start within which everything must be written
    build_jobs: int
    reuse_models: bool
    only_target: str | None = None  # a child process measuring one target (see measure_in_child)


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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM still writes what was measured
    report = Report(mode="cpu" if s.cpu else "cuda", settings={k: str(v) for k, v in asdict(s).items()})
    s.out.mkdir(parents=True, exist_ok=True)
    s.work.mkdir(parents=True, exist_ok=True)
    if s.only_target is not None:
        child_main(s, report, t0)
        return
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
        "--deadline-s",
        type=float,
        default=None,
        help="finish within this many seconds of the start: each target and phase runs only if the time left "
        "covers it (default: 530 s on a GPU, for one 9-minute command; none with --cpu)",
    )
    ap.add_argument("--reuse-models", action="store_true", help="keep models already in --work (a second run)")
    ap.add_argument("--only-target", default=None, help=argparse.SUPPRESS)  # the child process of one target
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
        threads=a.threads, tokens=a.tokens, reps=a.reps, sizes=sizes, build_jobs=a.jobs, reuse_models=a.reuse_models, only_target=a.only_target,
        deadline_s=a.deadline_s if a.deadline_s is not None else (float("inf") if a.cpu else 530.0),
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
    targets = ["llama"] + (["llama-speculative-simple", "llama-simple"] if s.tools and s.tools_dir is None else [])
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


def tool_path(s: Settings, name: str) -> Path | None:
    """A built llama.cpp program (llama-speculative-simple, llama-simple), or None."""
    if not s.tools:
        return None
    exe = (s.tools_dir or (s.work / "build" / "bin")) / name
    return exe if exe.is_file() else None


# -- models -------------------------------------------------------------------------------------


def write_model(path: Path, shape: Shape, tokenizer: dict[str, Any], *, seed: int) -> None:
    """A random-weight Qwen2 GGUF written directly in Q4_K (Q5_0 where a row is not a multiple of Q4_K's 256
    weights, as llama.cpp's quantizer falls back; norms and biases F32), streamed tensor by tensor.

    Writing quantized blocks takes seconds where an F16 file and a quantizing pass took minutes for a 7B
    (and needed the library still being built). What a forward pass costs does not depend on the values:
    each tensor's blocks are one random pool of quantized bytes read at a shifting offset, with block
    scales set for the tensor's weight scale. The scales keep the model far from chaos: large embeddings
    and small layer weights make each output a stable function of the context, so batched and one-token
    passes agree on every greedy choice and a draft equal to the target is accepted throughout.
    """
    import gguf
    import numpy as np

    n_vocab = len(tokenizer["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, (1 << 22) | 1, dtype=np.uint8)  # odd length: rows differ
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
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    for key, value in tokenizer.items():
        _add_metadata(w, key, value)
    for name, dims in tensors.items():
        if len(dims) == 1:
            w.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
        else:
            qtype = _qtype(dims[-1])
            rows = _quantized_bytes(dims, qtype)
            w.add_tensor_info(name, rows, np.dtype(np.uint8), int(np.prod(rows)), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    offset = 0
    for name, dims in tensors.items():
        if len(dims) == 1:
            t = np.ones(dims, np.float32) if name.endswith("norm.weight") else np.zeros(dims, np.float32)
        else:
            scale = EMBED_STD if name == "token_embd.weight" else OUTPUT_STD if name == "output.weight" else LAYER_STD
            t = _random_blocks(np.roll(pool, offset), dims, _qtype(dims[-1]), scale)
            offset += 7919
        w.write_tensor_data(t)
    w.close()


def _qtype(row: int) -> Any:
    import gguf

    Q = gguf.GGMLQuantizationType
    return Q.Q4_K if row % 256 == 0 else Q.Q5_0


def _quantized_bytes(dims: tuple[int, ...], qtype: Any) -> tuple[int, ...]:
    """A tensor's byte shape: its rows, each of row/block_size blocks."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return (*dims[:-1], dims[-1] // block * size)


def _random_blocks(pool: Any, dims: tuple[int, ...], qtype: Any, std: float) -> Any:
    """Quantized blocks whose weights have mean about 0 and standard deviation `std`: the pool's bytes as the
    4- or 5-bit values, with the block scales written over them."""
    import gguf
    import numpy as np

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = int(np.prod(dims)) // block
    b = np.resize(pool, n_blocks * size).reshape(n_blocks, size)
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        # w = d*sc*q - dmin*m with every sub-block's sc = m = 32 (the 12 scale bytes below) and q uniform in
        # 0..15 (mean 7.5, sd 4.61): dmin = 7.5 d centres it, d = std / (32 * 4.61) scales it.
        d = std / (32 * 4.61)
        b[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        b[:, 2:4] = np.frombuffer(np.float16(7.5 * d).tobytes(), np.uint8)
        b[:, 4:16] = np.array([0xA0] * 8 + [0] * 4, np.uint8)
    else:  # Q5_0: w = d * (q - 16), q uniform in 0..31 (sd 9.23)
        b[:, 0:2] = np.frombuffer(np.float16(std / 9.23).tobytes(), np.uint8)
    return b.reshape(_quantized_bytes(dims, qtype))


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


def model_path(s: Settings, name: str) -> Path:
    return s.work / f"{name}-q4_k.gguf"


def write_models(s: Settings, names: list[str], report: Report) -> dict[str, Path]:
    """Every model the check needs, written (or, with --reuse-models, kept from an earlier run)."""
    tokenizer = json.loads(gzip.open(s.payload / "tokenizer.json.gz", "rt", encoding="utf-8").read())
    out = {}
    for i, name in enumerate(names):
        path = model_path(s, name)
        if s.reuse_models and path.is_file():
            report.models[name] = {"bytes": path.stat().st_size, "reused": True}
        else:
            t0 = time.perf_counter()
            write_model(path, SHAPES[name], tokenizer, seed=i)
            report.models[name] = {"bytes": path.stat().st_size, "write_s": time.perf_counter() - t0}
            log(f"wrote {path.name}: {path.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")
        out[name] = path
    return out


# -- measurements -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deadline:
    """The time the whole check has: each target and phase runs only if what is left covers it."""

    t0: float
    seconds: float

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)

    def allows(self, need: float) -> bool:
        return self.left() >= need


# Each phase's share of a target's expected time (EXPECTED_TARGET_S), in the order they run (the copies' two sampled
# runs, added since, make the shares sum to a little over 1).
PHASE_SHARE = {
    "costs": 0.25, "plain": 0.12, "llama_simple": 0.04, "rounds": 0.14, "copies": 0.22, "parallel": 0.17,
    "draw_copies": 0.03, "llama_speculative_simple": 0.10,
}  # fmt: skip


def run_all(s: Settings, report: Report, site: Path, t0: float) -> None:
    proc = start_build(s)
    sys.path.insert(0, str(site))  # the carried packages first: gguf now, llama_cpp once the library is in
    sys.path.insert(1, str(HERE))  # engine_overhead's loops
    phase = time.perf_counter()
    write_models(s, [s.draft, *s.targets], report)
    report.phases["write_models"] = time.perf_counter() - phase
    phase = time.perf_counter()
    finish_build(s, proc, report)
    report.phases["build_wait"] = time.perf_counter() - phase
    deadline = Deadline(t0, s.deadline_s)
    for name in sorted(s.targets, key=lambda n: SHAPES[n].n_embd * SHAPES[n].n_layer):  # smallest first
        need = 0.0 if s.cpu else EXPECTED_TARGET_S.get(name, 60.0) * PHASE_SHARE["costs"]
        if not deadline.allows(need):
            report.notes.append(f"{name}: skipped, {deadline.left():.0f} s were left of the deadline")
            log(report.notes[-1])
            continue
        phase = time.perf_counter()
        try:
            measure_in_child(s, name, deadline, report)
        finally:
            report.phases[f"measure_{name}"] = time.perf_counter() - phase
            write_outputs(s, report, quiet=True)  # a run killed later still returns this target
        report.build.setdefault("device", report.targets.get(name, {}).get("device"))


CHILD_TRIES = 2  # a target whose process dies (a crash in the library) is measured again once


def measure_in_child(s: Settings, name: str, deadline: Deadline, report: Report) -> None:
    """One target measured in a process of its own, so that a crash inside llama.cpp (seen once: a segfault in
    libggml-cuda on the first load after the build) costs that process, not the figures already written. The
    child writes its report after every phase; a child that dies before measuring anything is started again."""
    part = s.work / f"part-{name}"
    for attempt in range(1, CHILD_TRIES + 1):
        shutil.rmtree(part, ignore_errors=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--only-target", name, "--out", str(part),
               "--deadline-s", f"{max(deadline.left(), 1.0):.1f}"]  # fmt: skip
        try:
            rc = subprocess.run(cmd).returncode
        finally:  # also when this process is stopped (a timeout's TERM): keep what the child wrote
            got = _merge_part(part, name, report)
        if rc == 0:
            return
        report.notes.append(f"{name}: its measuring process {_exit_text(rc)} (attempt {attempt})")
        log(report.notes[-1])
        if got or not deadline.allows(0.0 if s.cpu else EXPECTED_TARGET_S.get(name, 60.0) * PHASE_SHARE["costs"]):
            return


def _merge_part(part: Path, name: str, report: Report) -> bool:
    """A child's report merged into the parent's; whether it measured anything."""
    try:
        data = json.loads((part / "gpu_check.json").read_text())
    except (OSError, ValueError):
        return False
    target = data.get("targets", {}).get(name)
    if target:
        report.targets[name] = target
    report.phases |= {k: v for k, v in data.get("phases", {}).items() if k.startswith(f"{name}_")}
    report.notes += [n for n in data.get("notes", []) if n not in report.notes]
    report.build.setdefault("code", data.get("build", {}).get("code"))
    return bool(target and "target_s" in target)


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"died of {signal.Signals(-rc).name}"
        except ValueError:
            return f"died of signal {-rc}"
    return f"exited with {rc}"


def child_main(s: Settings, report: Report, t0: float) -> None:
    """The child of measure_in_child: the staged packages (with the built library) first on the path, one target."""
    sys.path.insert(0, str(s.work / "site"))
    sys.path.insert(1, str(HERE))
    import llama_cpp

    import localspec
    from localspec.backends.llama import backend

    report.build["code"] = {m.__name__: m.__file__ for m in (llama_cpp, localspec, backend)}  # the payload's copies
    backend._init_llama()  # quiet llama.cpp's log
    name = s.only_target
    assert name is not None
    crash = os.environ.get("GPU_CHECK_CRASH_ONCE")  # tests: the first child dies as a crashing library would
    if crash and not Path(crash).exists():
        Path(crash).touch()
        os.kill(os.getpid(), signal.SIGSEGV)
    try:
        measure_target(s, name, model_path(s, name), model_path(s, s.draft), Deadline(t0, s.deadline_s), report)
    finally:
        write_outputs(s, report, quiet=True)


def measure_target(
    s: Settings, name: str, target_path: Path, draft_path: Path, deadline: Deadline, report: Report
) -> None:
    """Every phase for one target, each if the deadline leaves room for it; the report is written after each."""
    from engine_overhead import PROMPT  # type: ignore[import-not-found]

    from localspec.backends.llama import backend

    ngl = 0 if s.cpu else -1
    load = dict(n_ctx=4096, threads=s.threads, n_gpu_layers=ngl)
    result: dict[str, Any] = {"target": target_path.name, "draft": draft_path.name}
    report.targets[name] = result
    expected = 0.0 if s.cpu else EXPECTED_TARGET_S.get(name, 60.0)

    def run_phase(key: str, fn: Callable[[], Any]) -> None:
        if not deadline.allows(expected * PHASE_SHARE[key]):
            report.notes.append(f"{name}: {key} skipped, {deadline.left():.0f} s were left of the deadline")
            log(report.notes[-1])
            return
        t = time.perf_counter()
        try:
            value = fn()
            if value is not None:
                result[key] = value
        except Exception as e:  # keep the other phases' figures
            report.notes.append(f"{name}: {key} failed: {type(e).__name__}: {e}")
            log(report.notes[-1])
        finally:
            report.phases[f"{name}_{key}"] = time.perf_counter() - t
            write_outputs(s, report, quiet=True)

    target = backend.load(target_path, **load)
    draft = backend.load(draft_path, **load)
    try:
        prompt = target.tokenize(PROMPT, add_special=True, parse_special=True)
        result["device"] = target.info.device
        result["prompt_tokens"] = len(prompt)
        run_phase("costs", lambda: measure_costs(s, target, draft, prompt, result))
        run_phase("plain", lambda: plain_vs_llama_cpp_python(s, target, target_path, prompt))
        run_phase("llama_simple", lambda: run_llama_simple(s, target_path, PROMPT, result))
        run_phase("rounds", lambda: self_draft_rounds(s, target, target_path, load, prompt))
        run_phase("copies", lambda: copy_runs(s, target, draft, prompt))
        run_phase("parallel", lambda: parallel_runs(s, target, result))
        run_phase("draw_copies", lambda: draw_copy_runs(s, target, prompt))
    finally:
        draft.close()
        target.close()
    run_phase("llama_speculative_simple", lambda: speculative_simple_runs(s, target_path, PROMPT))
    if "target_s" in result:
        result["allowed_speedup"] = allowed_speedups(result)


def measure_costs(s: Settings, target: Any, draft: Any, prompt: list[int], result: dict[str, Any]) -> None:
    """T(n) for the batch sizes and the draft's cost per token (into `result`)."""
    from localspec.decoding.calibrate import measure
    from localspec.decoding.drafters import ModelDrafter

    target.rollback(0)
    target.forward(prompt, all_logits=False)
    costs = measure(
        target, ModelDrafter(draft), prompt, max_batch=max(s.sizes), sizes=s.sizes, reps=s.reps, stat=statistics.median
    ).costs
    result["target_s"] = {str(n): costs.target_s(n) for n in s.sizes}
    result["draft_token_s"] = costs.draft_token
    d = costs.draft_token * 1e3 if costs.draft_token else 0.0
    log(f"T(1) {costs.target_s(1) * 1e3:.2f} ms, T(8) {costs.target_s(8) * 1e3:.2f} ms, "
        f"T({max(s.sizes)}) {costs.target_s(max(s.sizes)) * 1e3:.2f} ms; draft {d:.2f} ms/token")  # fmt: skip


def draw_copy_runs(s: Settings, target: Any, prompt: list[int]) -> dict[str, Any]:
    """A sampled pass (1 row, 9 rows) with llama.cpp's own copies of the draws chain (softmax and scaled logits a
    row), the softmax alone and the ids alone (benchmarks/draw_copies.py): on a GPU those copies cross PCIe. On
    the CPU check the draws are forced on (a CPU build leaves them off) and timed briefly."""
    from draw_copies import measure  # type: ignore[import-not-found]

    from localspec.backends.llama import backend

    forced, backend.PICK_ON_CPU = backend.PICK_ON_CPU, backend.PICK_ON_CPU or s.cpu
    try:
        target.rollback(0)
        target.forward(prompt, all_logits=False)
        passes, reps = (5, 2) if s.cpu else (30, 3)
        return measure(target, prompt, passes=passes, reps=reps)
    finally:
        backend.PICK_ON_CPU = forced


def self_draft_rounds(s: Settings, target: Any, path: Path, load: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
    """Per-round cost at each k with draft = target (every draft accepted but at near-ties)."""
    from localspec.backends.llama import backend

    self_draft = backend.load(path, **load)
    try:
        return {str(k): spec_rounds(s, target, self_draft, prompt, k) for k in OVERHEAD_KS}
    finally:
        self_draft.close()


def speculative_simple_runs(s: Settings, path: Path, prompt: str) -> dict[str, Any] | None:
    tool = tool_path(s, "llama-speculative-simple")
    if tool is None:
        return None
    return {str(k): run_speculative_simple(s, tool, path, prompt, k) for k in OVERHEAD_KS}


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

    def forward_top2(self, tokens: Any, *, all_rows: bool = True) -> Any:
        """A pass whose rows' best two tokens are picked in the model's graph (greedy rounds): timed the same."""
        t0 = time.perf_counter()
        try:
            return self._backend.forward_top2(tokens, all_rows=all_rows)
        finally:
            self.seconds += time.perf_counter() - t0

    def forward_draws(self, tokens: Any, temperature: float, rng: Any, *, top_k: int = 0, probs: bool = True) -> Any:
        """A pass whose rows' tokens are drawn in the model's graph (sampled rounds; a draft model's steps, with a
        top_k): timed the same."""
        t0 = time.perf_counter()
        try:
            return self._backend.forward_draws(tokens, temperature, rng, top_k=top_k, probs=probs)
        finally:
            self.seconds += time.perf_counter() - t0


def timed_generate(
    target: Any, drafter: Any, prompt: list[int], tokens: int, k: int, draft: Any = None, temperature: float = 0.0
) -> dict[str, Any]:
    """One generation (greedy unless `temperature`), its decoding split per round into the target's forward passes,
    the draft model's (when `draft`, a TimedForward the drafter runs on, is given) and the rest: localspec's own
    cost."""
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    done = None
    n_rounds = 0
    sources: dict[str, int] = {}  # rounds by where their draft came from ("none": no draft)
    config = GenerationConfig(max_tokens=tokens, num_draft=k, sampling=SamplingParams(temperature, seed=1))
    for i, ev in enumerate(generate(target, drafter, prompt, config)):
        if i == 0:  # the first token: the prompt passes are over, decoding starts
            target.seconds = 0.0
            if draft is not None:
                draft.seconds = 0.0
        if isinstance(ev, Done):
            done = ev
        elif ev.round is not None:
            n_rounds += 1
            sources[ev.round.source] = sources.get(ev.round.source, 0) + 1
    assert done is not None and n_rounds
    st = done.stats
    draft_s = draft.seconds if draft is not None else 0.0
    return {
        "decode_tps": st.decode_tps, "tokens": st.n_generated, "rounds": n_rounds,
        "acceptance": st.acceptance_rate, "drafted": st.n_drafted, "accepted": st.n_accepted,
        "tokens_per_pass": st.n_generated / n_rounds, "round_s": st.decode_s / n_rounds,
        "target_forward_s": target.seconds / n_rounds, "draft_forward_s": draft_s / n_rounds,
        "overhead_s": (st.decode_s - target.seconds - draft_s) / n_rounds, "sources": sources,
    }  # fmt: skip


def spec_rounds(s: Settings, target: Any, self_draft: Any, prompt: list[int], k: int) -> dict[str, Any]:
    """Speculative decoding with draft = target at temperature 0 (every draft accepted but at near-ties):
    per round, the time inside both models' forward passes and the rest, localspec's overhead."""
    from localspec.decoding.drafters import ModelDrafter

    runs = []
    for _ in range(s.reps):
        tgt, dft = TimedForward(target), TimedForward(self_draft)
        runs.append(timed_generate(tgt, ModelDrafter(dft), prompt, s.tokens, k, draft=dft))
    best = _median_run(runs)
    log(f"k={k} draft=target: {best['decode_tps']:.1f} tok/s, acceptance {best['acceptance']:.0%}, round "
        f"{best['round_s'] * 1e3:.2f} ms of which overhead {best['overhead_s'] * 1e3:.2f} ms")  # fmt: skip
    return {"median": best, "runs": runs}


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["decode_tps"])[len(runs) // 2]


COPY_TOKENS = 128
# The copies' sampled runs: low enough that a random-weight model's sampled answer still retraces some of its
# greedy one; their own cost a round shows what a sampled round reads (one draw a row in the graph on a GPU).
COPY_T = 0.3


def copy_prompt(target: Any, prompt: list[int]) -> tuple[list[int], list[int]]:
    """A prompt whose continuation repeats text it holds: the prompt, the target's own greedy answer to it, and the
    prompt again (a random-weight model's next token depends mostly on the last few, so its answer after the second
    copy retraces the first, as an answer asked again does). Returns (that prompt, the earlier answer)."""
    from localspec.decoding.drafters import NoDrafter
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.sampling import SamplingParams

    config = GenerationConfig(max_tokens=COPY_TOKENS, num_draft=0, sampling=SamplingParams())
    done = [ev for ev in generate(target, NoDrafter(), prompt, config) if isinstance(ev, Done)][-1]
    answer = list(done.tokens)
    return [*prompt, *answer, *prompt[1:]], answer  # the BOS only once


def copy_runs(s: Settings, target: Any, draft: Any, prompt: list[int]) -> dict[str, Any]:
    """Plain, suffix and auto (with the draft model) decoding of a continuation that repeats (copy_prompt): what
    lookups win where the text copies itself, at each method's default k, the draft model's passes timed apart,
    the methods alternating `reps` times. `repeats`: the share of the plain answer that retraces the earlier one."""
    from localspec.decoding.drafters import NoDrafter
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.options import default_k
    from localspec.pipeline import make_drafter
    from localspec.sampling import SamplingParams

    again, answer = copy_prompt(target, prompt)
    config = GenerationConfig(max_tokens=COPY_TOKENS, num_draft=0, sampling=SamplingParams())
    plain = [ev for ev in generate(target, NoDrafter(), again, config) if isinstance(ev, Done)][-1].tokens
    repeats = sum(a == b for a, b in zip(plain, answer)) / max(len(answer), 1)
    cases = {"none": ("none", 0.0), "suffix": ("suffix", 0.0), "auto": ("auto", 0.0),
             f"none T={COPY_T}": ("none", COPY_T), f"suffix T={COPY_T}": ("suffix", COPY_T)}  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in cases}
    for _ in range(s.reps):
        for label, (method, t) in cases.items():
            tgt = TimedForward(target)
            dft = TimedForward(draft) if method == "auto" else None
            drafter = make_drafter(method, tgt, dft)  # type: ignore[arg-type]
            try:
                runs[label].append(timed_generate(tgt, drafter, again, COPY_TOKENS, default_k(method), dft, t))
            finally:
                drafter.close()
    out: dict[str, Any] = {"prompt_tokens": len(again), "repeats": repeats}
    for label, rs in runs.items():
        method, t = cases[label]
        base = _median_run(runs[f"none T={COPY_T}" if t else "none"])["decode_tps"]  # plain at the same temperature
        best = _median_run(rs)
        out[label] = {"median": best, "runs": rs, "k": default_k(method), "vs_plain": best["decode_tps"] / base,
                      "temperature": t}  # fmt: skip
        log(f"copies, {label}: {best['decode_tps']:.1f} tok/s ({best['decode_tps'] / base:.2f}x plain), "
            f"acceptance {best['acceptance']:.0%}, {best['tokens_per_pass']:.2f} tokens per pass, "
            f"round's own cost {best['overhead_s'] * 1e3:.2f} ms")  # fmt: skip
    return out


PARALLEL_PROMPTS = (
    "Write a Python class for a bank account with deposits, withdrawals and a statement.",
    "Explain how a hash map resolves collisions, with a short example in C.",
    "Write a shell script that backs up a folder every night and keeps seven copies.",
    "Describe the steps of a TCP handshake and what each flag means.",
)


def parallel_runs(s: Settings, target: Any, result: dict[str, Any]) -> dict[str, Any]:
    """PARALLEL sequences decoded together in one pass (plain, then with suffix drafts planned by the parallel policy
    on this target's measured T(n)) against the same sequences decoded one at a time: total tokens/s."""
    from localspec.backends.llama.multi import LlamaParallel
    from localspec.decoding.engine import Done, GenerationConfig, generate
    from localspec.decoding.parallel_decoder import Job, ParallelDecoder
    from localspec.decoding.policy import CostModel
    from localspec.pipeline import make_drafter
    from localspec.sampling import SamplingParams

    template = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    prompts = [target.tokenize(template.format(q), add_special=True, parse_special=True) for q in PARALLEL_PROMPTS]
    curve = {int(n): t for n, t in result.get("target_s", {}).items()}
    config = GenerationConfig(max_tokens=s.tokens, num_draft=8, sampling=SamplingParams())
    batch = LlamaParallel(target, PARALLEL, 1024)
    out: dict[str, Any] = {}
    try:

        def alone(method: str) -> float:
            n, t = 0, 0.0
            for i, prompt in enumerate(prompts):
                seq = batch.sequences[i]
                drafter = make_drafter(method, seq, None)
                t0 = time.perf_counter()
                done = [ev for ev in generate(seq, drafter, prompt, config) if isinstance(ev, Done)][-1]
                t += time.perf_counter() - t0
                n += done.stats.n_generated
                seq.rollback(0)
            return n / t

        def together(method: str) -> dict[str, Any]:
            decoder = ParallelDecoder(batch, costs=CostModel(target=dict(curve)) if curve else None)
            t0 = time.perf_counter()
            dones: list[Any] = []
            passes, sizes = 0, []
            for i, prompt in enumerate(prompts):
                job = Job(i, batch.sequences[i], make_drafter(method, batch.sequences[i], None), prompt, config)
                dones += [ev for ev in decoder.add(i, job) if isinstance(ev, Done)]
            while decoder.members:
                dones += [ev for _, ev in decoder.step() if isinstance(ev, Done)]
                passes += 1
                if decoder.last_pass is not None:
                    sizes.append(decoder.last_pass.n_tokens)
            seconds = time.perf_counter() - t0
            for seq in batch.sequences:
                seq.rollback(0)
            n = sum(d.stats.n_generated for d in dones)
            drafted = sum(d.stats.n_drafted for d in dones)
            accepted = sum(d.stats.n_accepted for d in dones)
            return {"tps": n / seconds, "tokens": n, "passes": passes, "mean_pass_tokens": statistics.mean(sizes),
                    "acceptance": accepted / drafted if drafted else 0.0, "drafted": drafted}  # fmt: skip

        out["alone_plain_tps"] = statistics.median(alone("none") for _ in range(s.reps))
        out["together_plain"] = together("none")
        out["alone_suffix_tps"] = statistics.median(alone("suffix") for _ in range(s.reps))
        out["together_suffix"] = together("suffix")
    finally:
        batch.close()
    log(f"{PARALLEL} sequences in parallel: plain {out['alone_plain_tps']:.1f} tok/s one at a time, "
        f"{out['together_plain']['tps']:.1f} together; suffix {out['alone_suffix_tps']:.1f} one at a time, "
        f"{out['together_suffix']['tps']:.1f} together (acceptance {out['together_suffix']['acceptance']:.0%})")  # fmt: skip
    return out


_PERF_EVAL = re.compile(r"^\S+:\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs", re.MULTILINE)


def run_llama_simple(s: Settings, model: Path, prompt: str, result: dict[str, Any]) -> dict[str, Any] | None:
    """llama.cpp's own greedy decode loop (`llama-simple`): its decode rate from llama.cpp's perf counters
    (prompt pass excluded), against the engine's plain rate measured in the plain phase."""
    tool = tool_path(s, "llama-simple")
    if tool is None:
        return None
    ngl = "0" if s.cpu else "99"
    runs = []
    for _ in range(s.reps):
        proc = subprocess.run([str(tool), "-m", str(model), "-n", str(s.tokens), "-ngl", ngl, prompt],
                              capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=300)  # fmt: skip
        text = proc.stdout + proc.stderr
        m = _PERF_EVAL.search(text)
        if proc.returncode != 0 or m is None:
            return {"error": f"exit {proc.returncode}", "log_tail": text.splitlines()[-15:]}
        ms, n = float(m.group(1)), int(m.group(2))
        runs.append({"tokens": n, "decode_tps": n / (ms / 1e3)})
    out: dict[str, Any] = {"runs": runs, "decode_tps": statistics.median(r["decode_tps"] for r in runs)}
    plain = result.get("plain")
    if plain:
        out["engine_ratio"] = statistics.median(plain["engine_tps"]) / out["decode_tps"]
    log(
        f"llama-simple: {out['decode_tps']:.1f} tok/s"
        + (f"; engine / llama.cpp {out['engine_ratio']:.3f}" if plain else "")
    )
    return out


LLAMA_SIMPLE_THREADS = 4  # llama.cpp's default (GGML_DEFAULT_N_THREADS): llama-simple takes no thread count

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


def write_outputs(s: Settings, report: Report, *, quiet: bool = False) -> None:
    """gpu_check.json and gpu_check.txt as they stand (written after every phase); the table printed unless quiet."""
    data = asdict(report)
    _write_atomic(s.out / "gpu_check.json", json.dumps(data, indent=1))
    text = "\n".join(table_lines(report))
    _write_atomic(s.out / "gpu_check.txt", text + "\n")
    if (s.work / "build.log").exists():
        shutil.copy2(s.work / "build.log", s.out / "build.log")
    if not quiet:
        print(text, flush=True)


def _write_atomic(path: Path, text: str) -> None:
    """A kill between two writes leaves the previous whole file, never half of one."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def table_lines(r: Report) -> list[str]:
    ms = lambda x: f"{x * 1e3:8.2f}"  # noqa: E731
    lines = [f"localspec GPU check ({r.mode}); library: {r.build.get('device', '?')}"]
    lines.append("phases: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.phases.items()))
    if r.machine:
        lines.append(f"machine: {r.machine['cpus']} CPUs, load average {r.machine['load_start']:.1f} at the start, "
                     f"{r.machine.get('load_end', 0.0):.1f} at the end")  # fmt: skip
    for name, m in r.models.items():
        made = "reused" if m.get("reused") else f"written in {m.get('write_s', 0.0):.1f} s"
        lines.append(f"model {name}: Q4_K {m.get('bytes', 0) / 2**30:.2f} GiB ({made})")
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
        ls = t.get("llama_simple")
        if ls and "decode_tps" in ls:
            ratio = f"; engine / llama.cpp {ls['engine_ratio']:.3f}" if "engine_ratio" in ls else ""
            lines.append(f"plain decoding, llama.cpp's own loop (llama-simple): {ls['decode_tps']:.1f} tok/s{ratio}")
            cpus = r.machine.get("cpus") or 0
            if r.mode == "cpu" and cpus < LLAMA_SIMPLE_THREADS:  # the tool has no thread option
                lines.append(f"  (llama-simple runs llama.cpp's default {LLAMA_SIMPLE_THREADS} threads on {cpus} CPUs: "
                             "not a fair reference on this machine)")  # fmt: skip
        elif ls:
            lines.append(f"llama-simple failed: {ls.get('error')}")
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
        lines += copy_lines(t.get("copies", {})) + parallel_lines(t.get("parallel", t.get("crowd")))
        if "draw_copies" in t:
            lines.append(
                "a sampled pass (T = 0.7) with llama.cpp's copies of the draws chain, the softmax alone, the ids alone:"
            )
            lines += ["  " + line for line in draw_copy_lines(t["draw_copies"])]
        if "allowed_speedup" in t:
            lines.append("acceptance  best k  speedup allowed (model passes)  best k  with localspec's overhead")
        for a, v in t.get("allowed_speedup", {}).items():
            lines.append(
                f"{float(a):10.2f}  {v['k']:6d}  {v['bound']:29.2f}x  {v['k_with_overhead']:6d}  {v['with_overhead']:24.2f}x"
            )
    lines += [f"note: {n}" for n in r.notes]
    return lines


def draw_copy_lines(result: dict[str, Any]) -> list[str]:
    from draw_copies import lines  # type: ignore[import-not-found]

    return list(lines(result))


def copy_lines(copies: dict[str, Any]) -> list[str]:
    if not copies:
        return []
    methods = {m: v for m, v in copies.items() if isinstance(v, dict)}
    lines = [f"a continuation that repeats ({COPY_TOKENS} tokens after a {copies['prompt_tokens']}-token prompt that "
             f"holds an earlier answer; plain retraces {copies['repeats']:.0%} of it):"]  # fmt: skip
    lines.append("method        k   tok/s  vs plain  acceptance  tokens/pass  round ms  own ms")
    for method, v in methods.items():
        m = v["median"]
        lines.append(f"{method:12s} {v['k']:2d} {m['decode_tps']:7.1f} {v['vs_plain']:8.2f}x {m['acceptance']:10.0%} "
                     f"{m['tokens_per_pass']:12.2f} {m['round_s'] * 1e3:9.2f} {m['overhead_s'] * 1e3:7.2f}")  # fmt: skip
    return lines


def parallel_lines(parallel: dict[str, Any] | None) -> list[str]:
    """The parallel phase's lines (results recorded before the phase was renamed keep it under "crowd")."""
    if not parallel:
        return []
    tp, ts = parallel["together_plain"], parallel["together_suffix"]
    return [
        f"{PARALLEL} sequences in parallel: plain {parallel['alone_plain_tps']:.1f} tok/s one at a time, "
        f"{tp['tps']:.1f} together ({tp['tps'] / parallel['alone_plain_tps']:.2f}x)",
        f"                          suffix {parallel['alone_suffix_tps']:.1f} tok/s one at a time, {ts['tps']:.1f} "
        f"together ({ts['tps'] / parallel['alone_plain_tps']:.2f}x plain alone; acceptance {ts['acceptance']:.0%}, "
        f"{ts['mean_pass_tokens']:.1f} tokens a pass)",
    ]


if __name__ == "__main__":
    main()
