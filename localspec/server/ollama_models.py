"""The served model as Ollama describes a model: /api/tags' entry, /api/show's details and /api/ps' entry.

Found once per server from the loaded target and its file's header (nothing is loaded or read twice):
- name: the served name with Ollama's tag (`NAME:latest`), so that clients that compare names with what
  /api/tags lists find it; requests may name it with or without the tag (ollama_requests.matches).
- size and modified_at: the model's files on disk; digest: the file's SHA-256 where the Hugging Face cache
  names its blob by it (a pulled GGUF), else the SHA-256 of its path, size and modification time (reading a
  multi-GB file at start to hash it would cost a minute; the digest only has to change when the file does).
- details: format (gguf, or safetensors for an MLX directory), family (the architecture), parameter_size and
  quantization_level as Ollama writes them ("494.03M", "Q4_K_M").
- model_info: the GGUF's metadata (arrays as null unless verbose, as Ollama sends them), with
  `<arch>.context_length` the context this server loaded (serve's --n-ctx): what a request can use, which
  clients read to size their prompts; the trained one is `localspec.trained_context_length`.
- capabilities: completion; tools where the model's template (or its family's) renders tools; insert where
  the vocabulary has fill-in-the-middle tokens; thinking where the model writes think blocks.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from localspec.backends.registry import backend_spec
from localspec.catalog import disk_size
from localspec.gguf_meta import UnreadArray, read_gguf_header
from localspec.options import GenerationSettings
from localspec.server.ollama_requests import tagged
from localspec.server.requests import Served
from localspec.server.tools import ToolTemplate

SHA256 = re.compile(r"^[0-9a-f]{64}$")
FOREVER = timedelta(days=100 * 365)  # /api/ps' expires_at: the model stays loaded while the server runs


@dataclass(frozen=True)
class ModelCard:
    name: str  # as /api/tags lists it (`NAME:latest`)
    size: int
    digest: str
    modified_at: str
    details: dict[str, Any]
    metadata: dict[str, Any] = field(repr=False)  # the GGUF header's (model_info before the overrides)
    context_length: int = 0  # the loaded context
    size_vram: int = 0

    def tags_entry(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details}  # fmt: skip

    def ps_entry(self, now: datetime) -> dict[str, Any]:
        return {"name": self.name, "model": self.name, "size": self.size, "digest": self.digest,
                "details": self.details, "expires_at": rfc3339(now + FOREVER), "size_vram": self.size_vram,
                "context_length": self.context_length}  # fmt: skip

    def model_info(self, *, verbose: bool = False) -> dict[str, Any]:
        info = {key: (value if verbose and isinstance(value, list) else None) if is_array(value) else value
                for key, value in self.metadata.items()}  # fmt: skip
        arch = self.details["family"]
        trained = info.get(f"{arch}.context_length")
        info[f"{arch}.context_length"] = self.context_length
        if trained is not None:
            info["localspec.trained_context_length"] = trained
        return info


def model_card(served: Served, name: str) -> ModelCard:
    """The served model's card (reads the GGUF header, stats the files: call it off the event loop)."""
    target = served.pipeline.target
    info = target.info
    single_file = backend_spec(info.backend).single_file
    metadata = gguf_metadata(info.path) if single_file else mlx_metadata(info.path, info.architecture)
    metadata.setdefault("general.architecture", info.architecture)
    if info.n_params:
        metadata.setdefault("general.parameter_count", info.n_params)
    size = disk_size(info.path, info.backend) or info.size_bytes or 0
    details = {
        "parent_model": "",
        "format": "gguf" if single_file else "safetensors",
        "family": metadata["general.architecture"],
        "families": [metadata["general.architecture"]],
        "parameter_size": human_number(int(metadata.get("general.parameter_count") or 0)),
        "quantization_level": quantization(metadata, info.path, single_file),
    }
    on_gpu = not info.device.upper().startswith("CPU")
    return ModelCard(tagged(name), size, digest(info.path, single_file), modified(info.path), details, metadata,
                     target.n_ctx, size if on_gpu else 0)  # fmt: skip


def capabilities(served: Served) -> list[str]:
    out = ["completion"]
    if isinstance(served.tool_template(), ToolTemplate):
        out.append("tools")
    if served.fim_tokens() is not None:
        out.append("insert")
    if served.thinks():
        out.append("thinking")
    return out


def chat_template(served: Served) -> str:
    """The template the server renders conversations with (the model's own, or the format chosen for it)."""
    fmt, target = served.pipeline.chat_format, served.pipeline.target
    return (target.chat_template() if fmt is None or fmt.source == "model" else fmt.template) or ""


def parameters(defaults: GenerationSettings, n_ctx: int) -> str:
    """serve's defaults as Ollama's `parameters` text (what a request gets for each option it leaves out)."""
    values: dict[str, Any] = {"num_ctx": n_ctx, "temperature": defaults.temperature, "top_k": defaults.top_k,
                              "top_p": defaults.top_p, "min_p": defaults.min_p}  # fmt: skip
    if defaults.seed is not None:
        values["seed"] = defaults.seed
    if defaults.max_tokens is not None:
        values["num_predict"] = defaults.max_tokens
    return "\n".join(f"{key:<30} {json.dumps(value)}" for key, value in values.items())


def modelfile(path: str, params: str) -> str:
    lines = ["# Modelfile generated by localspec serve (a description: localspec does not build models)",
             f"FROM {path}"]  # fmt: skip
    lines += [f"PARAMETER {line.split(maxsplit=1)[0]} {line.split(maxsplit=1)[1]}" for line in params.splitlines()]
    return "\n".join(lines) + "\n"


# -- from the files ---------------------------------------------------------------------------------------


def gguf_metadata(path: str) -> dict[str, Any]:
    return dict(read_gguf_header(path, check_size=False).metadata)


def mlx_metadata(path: str, arch: str) -> dict[str, Any]:
    """What an MLX model's config.json says that a GGUF header would (its context length)."""
    config = read_config(path)
    out: dict[str, Any] = {"general.architecture": config.get("model_type") or arch}
    if isinstance(config.get("max_position_embeddings"), int):
        out[f"{out['general.architecture']}.context_length"] = config["max_position_embeddings"]
    return out


def read_config(path: str) -> dict[str, Any]:
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def safetensors_dtype(path: str) -> str:
    """The type of the first tensor of an MLX directory's weights ("F32"), from the file's JSON header; ""."""
    try:
        with next(iter(sorted(Path(path).glob("*.safetensors")))).open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    except (StopIteration, OSError, ValueError):
        return ""
    return next((str(t.get("dtype", "")) for key, t in header.items() if key != "__metadata__"), "")


def is_array(value: Any) -> bool:
    return isinstance(value, list | UnreadArray)


def quantization(metadata: dict[str, Any], path: str, single_file: bool) -> str:
    """Ollama's quantization_level: the GGUF's file type ("Q4_K_M", "F16"), an MLX model's bits ("Q4") or its
    weights' type ("BF16", "F32")."""
    if not single_file:
        config = read_config(path)
        bits = (config.get("quantization") or {}).get("bits") if isinstance(config.get("quantization"), dict) else None
        return f"Q{bits}" if bits else str(config.get("torch_dtype") or safetensors_dtype(path)).upper()
    file_type = metadata.get("general.file_type")
    if not isinstance(file_type, int):
        return ""
    from gguf import LlamaFileType

    try:
        return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return str(file_type)


def human_number(n: int) -> str:
    """Ollama's parameter_size: 8B, 1.5B, 494.03M, 135M."""
    for scale, unit, places in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{places}f}{unit}"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


def digest(path: str, single_file: bool) -> str:
    p = Path(path)
    resolved = p.resolve()
    if single_file and SHA256.match(resolved.name):  # the Hugging Face cache names a GGUF's blob by its SHA-256
        return resolved.name
    files = [p] if single_file else sorted(f for f in p.rglob("*") if f.is_file())
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def modified(path: str) -> str:
    return rfc3339(datetime.fromtimestamp(Path(path).stat().st_mtime, UTC))


def rfc3339(t: datetime) -> str:
    """Ollama's timestamps: RFC 3339 in UTC with a Z."""
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")
