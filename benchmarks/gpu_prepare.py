"""Prepare what `benchmarks/gpu_check.py` carries to a GPU machine with no network.

Writes an ignored folder of the repository (default `benchmarks/gpu_payload/`) holding:

- `llama.cpp/`: the llama.cpp sources vendored in llama-cpp-python's sdist, trimmed to what the
  shared library (CPU and CUDA backends) and `llama-speculative-simple` and `llama-simple` need to build;
- `site/`: pure-Python packages put first on PYTHONPATH there: the llama_cpp bindings of the same
  sdist (the check copies the library it builds into `llama_cpp/lib`), `gguf` from the same
  llama.cpp, localspec itself (with `localspec.backends`), and the few pure-Python packages those
  import that a bare Python with numpy may lack;
- `tokenizer.json.gz`: the tokenizer metadata of a real Qwen2.5 GGUF (the fixture model), for the
  random-weight models the check writes.

It prints the payload's size, which with the rest of the working tree must stay under 64 MiB.

    python benchmarks/gpu_prepare.py [--sdist llama_cpp_python-0.3.36.tar.gz|DIR] [--no-sources]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "gpu_payload"
LIMIT_BYTES = 64 * 1024 * 1024
SDIST_VERSION = "0.3.36"  # the llama-cpp-python release whose bindings and llama.cpp travel together

# llama.cpp paths the library and llama-speculative-simple need (the rest is docs, models, tests, tools).
KEEP_TOP = (
    "CMakeLists.txt",
    "LICENSE",
    "cmake",
    "include",
    "src",
    "common",
    "vendor",
    "examples/speculative-simple",
    "examples/simple",
)
KEEP_GGML = ("CMakeLists.txt", "cmake", "include", "src")
GGML_BACKENDS = ("ggml-cpu", "ggml-cuda")  # every other backend directory under ggml/src is left out
# Replacements for CMake files that would otherwise pull in every example and proof of concept.
GENERATED = {
    "examples/CMakeLists.txt": "# trimmed by benchmarks/gpu_prepare.py\nadd_subdirectory(speculative-simple)\nadd_subdirectory(simple)\n",
    "pocs/CMakeLists.txt": "# trimmed by benchmarks/gpu_prepare.py\n",
}
# Pure-Python packages the carried code imports that a bare Python with numpy may lack.
EXTRA_PACKAGES = ("typing_extensions", "diskcache", "jinja2", "markupsafe", "yaml")
TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, help="llama-cpp-python sdist (.tar.gz or unpacked); default: pip download it")
    ap.add_argument(
        "--no-sources", action="store_true", help="no llama.cpp sources (a run that reuses a built library)"
    )
    ap.add_argument(
        "--tokenizer-from", type=Path, help="GGUF to take the tokenizer from (default: the qwen-0.5b fixture)"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    size = prepare(args.out, sdist=args.sdist, sources=not args.no_sources, tokenizer_from=args.tokenizer_from)
    print(f"payload {args.out}: {size / 2**20:.1f} MiB (limit for everything carried: {LIMIT_BYTES / 2**20:.0f} MiB)")
    if size > LIMIT_BYTES:
        sys.exit("the payload alone is over the limit")


def prepare(out: Path, *, sdist: Path | None, sources: bool, tokenizer_from: Path | None) -> int:
    """Write the payload into `out` (replacing it); return its size in bytes."""
    if out.exists():
        shutil.rmtree(out)
    site = out / "site"
    site.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = unpacked_sdist(sdist, Path(tmp)) if (sources or sdist) else None
        if src is not None:
            copy_tree(src / "llama_cpp", site / "llama_cpp", skip=("server", "lib", "__pycache__"))
            copy_tree(src / "vendor/llama.cpp/gguf-py/gguf", site / "gguf", skip=("__pycache__",))
        else:
            copy_installed_bindings(site)
        if sources:
            assert src is not None
            trim_llama_cpp(src / "vendor/llama.cpp", out / "llama.cpp")
    copy_localspec(site / "localspec")
    for name in EXTRA_PACKAGES:
        copy_pure_package(name, site)
    write_tokenizer(tokenizer_from or default_tokenizer_source(), out / "tokenizer.json.gz")
    return tree_size(out)


def unpacked_sdist(sdist: Path | None, tmp: Path) -> Path:
    if sdist is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={SDIST_VERSION}", "-d", str(tmp)],
            check=True,
        )  # fmt: skip
        sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"))
    if sdist.is_dir():
        return sdist
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp, filter="data")
    return next(p for p in tmp.iterdir() if p.is_dir() and p.name.startswith("llama_cpp_python"))


def trim_llama_cpp(src: Path, dst: Path) -> None:
    for rel in KEEP_TOP:
        copy_any(src / rel, dst / rel)
    for rel in KEEP_GGML:
        copy_any(src / "ggml" / rel, dst / "ggml" / rel, skip=tuple(_other_backends(src)) if rel == "src" else ())
    for rel, text in GENERATED.items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_text(text)


def _other_backends(src: Path) -> list[str]:
    return [
        p.name
        for p in (src / "ggml/src").iterdir()
        if p.is_dir() and p.name.startswith("ggml-") and p.name not in GGML_BACKENDS
    ]


def copy_any(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> None:
    if src.is_dir():
        copy_tree(src, dst, skip=skip)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def copy_tree(src: Path, dst: Path, *, skip: tuple[str, ...] = ()) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*skip, "*.pyc"), dirs_exist_ok=True)


def copy_installed_bindings(site: Path) -> None:
    """Without an sdist: the installed llama_cpp and gguf packages (their Python files only)."""
    for name in ("llama_cpp", "gguf"):
        copy_tree(package_dir(name), site / name, skip=("server", "lib", "__pycache__", "*.so", "*.so.*"))


def copy_localspec(dst: Path) -> None:
    copy_tree(ROOT / "localspec", dst, skip=("__pycache__",))


def copy_pure_package(name: str, site: Path) -> None:
    """A package's Python files; compiled speedups are left out (these packages fall back without them)."""
    src = package_dir(name)
    if src.is_file():  # a single-module package (typing_extensions)
        shutil.copy2(src, site / src.name)
        return
    copy_tree(src, site / name, skip=("__pycache__", "*.so", "*.pyd", "*.c"))


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{name} is not installed here; install it (pip install {name}) and run again")
    origin = Path(spec.origin)
    return origin.parent if origin.name == "__init__.py" else origin


def default_tokenizer_source() -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from fixture_models import fetch  # type: ignore[import-not-found]

    return fetch("qwen-0.5b")


def write_tokenizer(gguf_path: Path, dst: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from localspec.gguf_meta import read_gguf_header

    meta = read_gguf_header(gguf_path, full=True).metadata  # the merges too: the check writes a whole tokenizer
    keep = {k: meta[k] for k in TOKENIZER_KEYS if k in meta}
    with gzip.open(dst, "wt", encoding="utf-8") as f:
        json.dump(keep, f)


def tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


if __name__ == "__main__":
    main()
