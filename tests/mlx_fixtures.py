"""The real GGUF fixture models turned into mlx-lm directories, cached next to the GGUF files.

    python tests/mlx_fixtures.py [NAME ...]     # convert (qwen-0.5b when no name), print the paths

The conversion dequantizes every tensor (localspec.convert_gguf), so a float32 directory takes
4 bytes per weight: about 2.5 GB for the 0.5B, 6.2 GB for the 1.5B. Written atomically (a
`.partial` directory renamed when complete), so an interrupted run never looks finished.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import fixture_models  # noqa: E402


def mlx_dir(name: str, dtype: str = "float32") -> Path:
    return fixture_models.cache_dir() / "mlx" / f"{name}-{'f32' if dtype == 'float32' else 'f16'}"


def converted(name: str, dtype: str = "float32") -> Path:
    from localspec.convert_gguf import convert

    out = mlx_dir(name, dtype)
    if (out / "config.json").is_file():
        return out
    return convert(fixture_models.fetch(name), out, dtype=dtype)


if __name__ == "__main__":
    for n in sys.argv[1:] or ["qwen-0.5b"]:
        print(converted(n))
