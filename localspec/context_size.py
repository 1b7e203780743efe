"""The context window when `--n-ctx` is not given: the model's trained context (a GGUF's
`<arch>.context_length`, an mlx-lm config's `max_position_embeddings`), at most AUTO_MAX_N_CTX, and no
more than the free memory holds for the KV caches it needs (every model's, once per context the command
opens: serve --parallel N opens the target's own and N parallel sequences, for the draft model too).

The KV bytes per token come from the headers (layers x KV heads x (key + value) dimensions x 2 bytes, the
f16 cache llama.cpp and mlx-lm keep); the memory is what the system calls available, less the model files,
of which the KV caches may take KV_SHARE (the rest is headroom for compute buffers and everything else).
Nothing here loads a model or downloads anything: an mlx-lm repo id is read from the Hugging Face cache
when it is there, else its trained context is unknown.

    choose_n_ctx(target, draft, copies) -> ContextChoice   the choice and the note that says why
    memory() -> (total, available)                         bytes, None where the system does not say
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FALLBACK_N_CTX = 4096  # a model whose header names no trained context
AUTO_MAX_N_CTX = 32768  # beyond this, --n-ctx says so: a long context costs memory whether used or not
MIN_AUTO_N_CTX = 256  # llama.cpp's smallest context
KV_SHARE = 0.5  # of the memory left after the model files, what the KV caches may take
USABLE = 0.8  # of the available memory, what one command may count on (doctor warns beyond it)
F16 = 2


@dataclass(frozen=True)
class ModelShape:
    """What a model's header says about its context: trained length and KV bytes per token (None: unknown)."""

    trained: int | None
    kv_bytes_per_token: int | None
    file_bytes: int


@dataclass(frozen=True)
class ContextChoice:
    n_ctx: int
    trained: int | None  # the target's trained context
    bound: int | None  # what the memory allows (None: not known)

    @property
    def note(self) -> str:
        """The startup line that says where the context came from."""
        source = (f"the target's trained context ({self.trained:,} tokens)" if self.trained else
                  f"localspec's default ({FALLBACK_N_CTX:,} tokens; the target names no trained context)")  # fmt: skip
        if self.trained and self.trained > AUTO_MAX_N_CTX:
            source += f", at most {AUTO_MAX_N_CTX:,}"
        memory = f"the free memory holds the KV caches of about {self.bound:,}" if self.bound is not None else \
            "the free memory is unknown"  # fmt: skip
        return f"context {self.n_ctx:,} tokens: {source}; {memory} (--n-ctx sets it)"


def choose_n_ctx(target: str, draft: str | None = None, copies: int = 1) -> ContextChoice:
    """The context for `target` (and `draft`, sharing it) when none is given; `copies`: contexts of that
    length opened for each model."""
    shapes = [model_shape(p) for p in (target, draft) if p]
    trained = shapes[0].trained
    wanted = min(trained, AUTO_MAX_N_CTX) if trained else FALLBACK_N_CTX
    bound = memory_bound(shapes, copies, memory()[1])
    n_ctx = wanted if bound is None else max(MIN_AUTO_N_CTX, min(wanted, bound))
    return ContextChoice(n_ctx, trained, bound)


def memory_bound(shapes: list[ModelShape], copies: int, available: int | None) -> int | None:
    """The most tokens whose KV caches (every model's, `copies` times) fit in the memory left (None: unknown),
    rounded down to 256."""
    per_token = sum(s.kv_bytes_per_token or 0 for s in shapes) * max(1, copies)
    if available is None or per_token <= 0:
        return None
    left = USABLE * available - sum(s.file_bytes for s in shapes)
    return max(0, int(KV_SHARE * left / per_token)) // 256 * 256


def model_shape(path: str) -> ModelShape:
    p = Path(path).expanduser()
    if p.is_file():
        return _gguf_shape(p)
    config = _mlx_config(path)
    size = sum(f.stat().st_size for f in p.glob("*.safetensors")) if p.is_dir() else 0
    return _config_shape(config, size) if config is not None else ModelShape(None, None, size)


def _gguf_shape(path: Path) -> ModelShape:
    from localspec.errors import ModelFileError
    from localspec.gguf_meta import read_gguf_header

    size = path.stat().st_size
    try:
        h = read_gguf_header(path, check_size=False)
    except ModelFileError:
        return ModelShape(None, None, size)  # the loader says what is wrong with it
    m, a = h.metadata, h.architecture
    trained = _positive(m.get(f"{a}.context_length"))
    layers, n_embd, n_head = (
        m.get(f"{a}.block_count"),
        m.get(f"{a}.embedding_length"),
        m.get(f"{a}.attention.head_count"),
    )
    n_kv = m.get(f"{a}.attention.head_count_kv", n_head)
    if not (layers and n_embd and n_head and n_kv):
        return ModelShape(trained, None, size)
    head = int(n_embd) // int(_largest(n_head))
    width = int(m.get(f"{a}.attention.key_length", head)) + int(m.get(f"{a}.attention.value_length", head))
    heads = sum(int(n) for n in n_kv) if isinstance(n_kv, list) else int(n_kv) * int(layers)
    return ModelShape(trained, heads * width * F16, size)


def _config_shape(config: dict[str, Any], size: int) -> ModelShape:
    c = {**config, **(config.get("text_config") or {})}
    trained = _positive(c.get("max_position_embeddings"))
    layers, hidden, n_head = c.get("num_hidden_layers"), c.get("hidden_size"), c.get("num_attention_heads")
    if not (layers and hidden and n_head):
        return ModelShape(trained, None, size)
    n_kv = c.get("num_key_value_heads") or n_head
    head = c.get("head_dim") or int(hidden) // int(n_head)
    return ModelShape(trained, int(layers) * int(n_kv) * 2 * int(head) * F16, size)


def _mlx_config(path: str) -> dict[str, Any] | None:
    """An mlx-lm model's config.json: in its directory, or in the Hugging Face cache for a repo id."""
    p = Path(path).expanduser()
    file: Path | None = p / "config.json" if p.is_dir() else None
    if file is None and path.count("/") == 1:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(path, "config.json")
            file = Path(found) if isinstance(found, str) else None
        except (ImportError, ValueError):
            file = None
    try:
        return json.loads(file.read_text()) if file is not None else None
    except (OSError, ValueError):
        return None


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value > 0 else None


def _largest(value: Any) -> int:
    return max(int(v) for v in value) if isinstance(value, list) else int(value)


def memory() -> tuple[int | None, int | None]:
    """(total, available) memory in bytes; None where the system does not say."""
    if sys.platform == "darwin":
        total = _sysctl_int("hw.memsize")
        try:
            out = subprocess.run(["vm_stat"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return total, None
        page = 16384 if "16384" in out.splitlines()[0] else 4096
        free = 0
        for line in out.splitlines():
            if line.startswith(("Pages free", "Pages inactive", "Pages speculative", "Pages purgeable")):
                free += int(line.split(":")[1].strip().rstrip("."))
        return total, free * page
    info: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None, None
    return info.get("MemTotal"), info.get("MemAvailable")


def _sysctl_int(name: str) -> int | None:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
        return int(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
