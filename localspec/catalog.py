"""The catalog of known target/draft pairs: models.toml shipped in the package, plus the user's file.

API (used by `localspec run --pair`, `localspec models`, `localspec pull` and the TUI):

    load_catalog(*, user_path=None, include_user=True) -> Catalog
        Catalog.pairs: dict[str, Pair]; Catalog.get(name) -> Pair (CatalogError listing the known names)
        Catalog.default: the name of the pair used when no model is given (`default = true` in a file)
        Pair.name, .description, .num_draft, .hardware, .method, .backends: dict[str, BackendPair]
        BackendPair.target / .draft: ModelRef(repo, file, revision); .size_gb (approximate download)
    resolve_pair(name: str, backend: str, *, cache_dir=None) -> tuple[str, str]
        Local paths of (target, draft) from the Hugging Face cache only, no network: llama -> the GGUF
        files, mlx -> the snapshot directories. CatalogError (hint: the exact `localspec pull` command)
        when a model is not downloaded or the pair/backend is unknown.
    parse_model_ref("REPO[:FILE][@REVISION]") -> ModelRef
    hub_cache_dir() -> str   the HF cache the pulls write to (HF_HUB_CACHE, HF_HOME/hub, default)

The user's file is $LOCALSPEC_CATALOG, else $XDG_CONFIG_HOME/localspec/models.toml (~/.config/...).
It uses the same format; a pair with a known name replaces the built-in one, and a pair marked
`default = true` there becomes the default (each file marks at most one).
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.backends.registry import backend_names, backend_spec
from localspec.errors import CatalogError, NotDownloadedError
from localspec.families import registry

BACKENDS = backend_names()  # each may have its [pair.NAME] table
_PAIR_KEYS = {"name", "default", "description", "num_draft", "hardware", "notes", "base", "method", *BACKENDS}


def pair_methods() -> tuple[str, ...]:
    """What a pair's draft file can be: a draft model, or a drafter that reads the target's hidden states
    (a head file; for layers inside the target, the file holding them, often the target itself)."""
    return tuple(f.name for f in registry.families() if f.needs != "nothing")


_BACKEND_KEYS = {"target", "draft", "size_gb"}
_REF_KEYS = {"repo", "file", "revision"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class ModelRef:
    """One model on the Hub: a GGUF file in a repo (llama) or a whole repo snapshot (mlx)."""

    repo: str
    file: str | None = None
    revision: str = "main"

    def __str__(self) -> str:
        s = self.repo + (f":{self.file}" if self.file else "")
        return s + (f"@{self.revision}" if self.revision != "main" else "")


@dataclass(frozen=True)
class BackendPair:
    target: ModelRef
    draft: ModelRef
    size_gb: float | None = None  # approximate download, target + draft

    def role(self, role: str) -> ModelRef:
        return self.target if role == "target" else self.draft


@dataclass(frozen=True)
class LocalPair:
    """A catalog pair ready to load: its concrete backend and local (target, draft) paths."""

    name: str
    backend: str
    target: str
    draft: str


@dataclass(frozen=True)
class BaseModels:
    """The original (safetensors) Hub repos a pair's files were converted from: what vLLM loads."""

    target: str
    draft: str


@dataclass(frozen=True)
class Pair:
    name: str
    description: str
    num_draft: int
    hardware: str
    backends: dict[str, BackendPair]
    notes: str = ""
    source: str = "built-in"  # "built-in" or the user file's path
    default: bool = False  # marked `default = true` in its file (Catalog.default says which one wins)
    base: BaseModels | None = None  # the original Hub models (for vLLM, which serves those)
    method: str = "model"  # pair_methods(): how the draft file drafts (--draft-method when auto is asked for)

    def backend(self, backend: str) -> BackendPair:
        if backend not in self.backends:
            have = ", ".join(self.backends) or "none"
            raise CatalogError(
                f"pair {self.name!r} has no {backend} models (it has: {have})",
                f"use --backend {next(iter(self.backends))}" if self.backends else "pick another pair",
            )
        return self.backends[backend]


@dataclass(frozen=True)
class Catalog:
    pairs: dict[str, Pair]
    sources: tuple[str, ...] = field(default=())
    default: str | None = None  # the pair used when no model is given

    def names(self) -> list[str]:
        return list(self.pairs)

    def default_pair(self) -> Pair:
        if self.default is None or self.default not in self.pairs:
            raise CatalogError(
                "the catalog marks no default pair",
                "pass --pair NAME (see `localspec models`), or mark one pair `default = true` in "
                + str(user_catalog_path()),
            )
        return self.pairs[self.default]

    def get(self, name: str) -> Pair:
        if name in self.pairs:
            return self.pairs[name]
        raise CatalogError(
            f"unknown pair {name!r}",
            "known pairs: " + ", ".join(self.pairs) + " (see `localspec models`; "
            "add your own in " + str(user_catalog_path()) + ")",
        )


# -- loading ------------------------------------------------------------------------------------


def builtin_catalog_text() -> str:
    from importlib.resources import files

    return (files("localspec") / "models.toml").read_text(encoding="utf-8")


def user_catalog_path() -> Path:
    env = os.environ.get("LOCALSPEC_CATALOG")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "localspec" / "models.toml"


def load_catalog(*, user_path: str | Path | None = None, include_user: bool = True) -> Catalog:
    """The built-in pairs, then the user's file (if it exists) adding or replacing pairs by name."""
    pairs = parse_catalog(builtin_catalog_text(), source="built-in")
    sources = ["built-in"]
    default = _marked_default(pairs)
    if include_user:
        path = Path(user_path).expanduser() if user_path else user_catalog_path()
        explicit = user_path is not None or bool(os.environ.get("LOCALSPEC_CATALOG"))
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise CatalogError(
                    f"cannot read catalog file {path}: {e}", "check the file's permissions and encoding"
                ) from e
            user_pairs = parse_catalog(text, source=str(path))
            pairs.update(user_pairs)
            sources.append(str(path))
            default = _marked_default(user_pairs) or default  # a pair replaced by name stays the default
        elif explicit:
            raise CatalogError(f"catalog file not found: {path}", "fix LOCALSPEC_CATALOG or create the file")
    return Catalog(pairs, tuple(sources), default)


def _marked_default(pairs: dict[str, Pair]) -> str | None:
    """The one pair of a file marked `default = true` (parse_catalog refuses two)."""
    return next((p.name for p in pairs.values() if p.default), None)


def parse_catalog(text: str, *, source: str) -> dict[str, Pair]:
    """Parse and validate catalog TOML; every error names the file and a line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib's message ends with "(at line L, column C)"; keep it, it is the useful part.
        raise CatalogError(f"{source}: invalid TOML: {e}", _FORMAT_HINT) from None
    unknown = set(data) - {"pair"}
    if unknown:
        key = sorted(unknown)[0]
        raise CatalogError(f"{source}:{_line_of(text, key)}: unknown top-level key {key!r}", _FORMAT_HINT)
    raw_pairs = data.get("pair", [])
    if not isinstance(raw_pairs, list):
        raise CatalogError(f"{source}: `pair` must be an array of tables ([[pair]])", _FORMAT_HINT)
    pairs: dict[str, Pair] = {}
    for i, raw in enumerate(raw_pairs):
        name = raw.get("name") if isinstance(raw, dict) else None
        where = f"{source}:{_pair_line(text, name, i)}"
        pair = _parse_pair(raw, where=where, source=source)
        if pair.name in pairs:
            raise CatalogError(f"{where}: pair {pair.name!r} is defined twice in this file", "rename or remove one")
        other = _marked_default(pairs)
        if pair.default and other:
            raise CatalogError(
                f"{where}: pair {pair.name!r} is marked default = true, and so is {other!r}",
                "mark one pair of a file as the default",
            )
        pairs[pair.name] = pair
    return pairs


def _parse_pair(raw: Any, *, where: str, source: str) -> Pair:
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: each [[pair]] must be a table", _FORMAT_HINT)
    _no_unknown(raw, _PAIR_KEYS, where, "pair")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise CatalogError(f"{where}: pair needs a `name` (letters, digits, . _ -), got {name!r}", _FORMAT_HINT)
    where = f"{where} (pair {name!r})"
    default = raw.get("default", False)
    if not isinstance(default, bool):
        raise CatalogError(f"{where}: default must be true or false, got {default!r}", _FORMAT_HINT)
    num_draft = raw.get("num_draft", 4)
    if not isinstance(num_draft, int) or isinstance(num_draft, bool) or not 1 <= num_draft <= 64:
        raise CatalogError(f"{where}: num_draft must be an integer from 1 to 64, got {num_draft!r}", _FORMAT_HINT)
    method = raw.get("method", "model")
    if method not in pair_methods():
        raise CatalogError(f"{where}: method must be one of {', '.join(pair_methods())}, got {method!r}", _FORMAT_HINT)
    backends: dict[str, BackendPair] = {}
    for backend in BACKENDS:
        if backend in raw:
            backends[backend] = _parse_backend(raw[backend], backend=backend, where=f"{where} [{backend}]")
    if not backends:
        tables = " and/or ".join(f"[pair.{b}]" for b in BACKENDS)
        raise CatalogError(f"{where}: a pair needs a {tables} table", _FORMAT_HINT)
    runs_on = registry.family(method).backend_names()
    extra = [b for b in backends if runs_on is not None and b not in runs_on]
    if extra:
        where_it_runs = " and ".join(backend_spec(b).label for b in runs_on or ())
        tables = ", ".join(f"[pair.{b}]" for b in extra)
        raise CatalogError(f"{where}: a {method} drafter runs on {where_it_runs} only: remove {tables}", _FORMAT_HINT)
    return Pair(
        name=name,
        description=_str(raw, "description", where),
        num_draft=num_draft,
        hardware=_str(raw, "hardware", where),
        backends=backends,
        notes=_str(raw, "notes", where),
        source=source,
        default=default,
        base=_parse_base(raw.get("base"), where=f"{where} base"),
        method=method,
    )


def _parse_base(raw: Any, *, where: str) -> BaseModels | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: must be a table {{ target = REPO, draft = REPO }}", _FORMAT_HINT)
    _no_unknown(raw, {"target", "draft"}, where, "base table")
    repos = [raw.get(role) for role in ("target", "draft")]
    for role, repo in zip(("target", "draft"), repos):
        if not isinstance(repo, str) or not _REPO_RE.match(repo):
            raise CatalogError(f"{where}: {role} must be a Hub repo id like owner/name, got {repo!r}", _FORMAT_HINT)
    return BaseModels(*repos)


def _parse_backend(raw: Any, *, backend: str, where: str) -> BackendPair:
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: must be a table with target and draft", _FORMAT_HINT)
    _no_unknown(raw, _BACKEND_KEYS, where, "backend table")
    refs = {}
    for role in ("target", "draft"):
        if role not in raw:
            raise CatalogError(f"{where}: missing {role} = {{ repo = ..., ... }}", _FORMAT_HINT)
        refs[role] = _parse_ref(raw[role], backend=backend, where=f"{where} {role}")
    size = raw.get("size_gb")
    if size is not None and (not isinstance(size, (int, float)) or isinstance(size, bool) or size <= 0):
        raise CatalogError(f"{where}: size_gb must be a positive number, got {size!r}", _FORMAT_HINT)
    return BackendPair(refs["target"], refs["draft"], float(size) if size is not None else None)


def _parse_ref(raw: Any, *, backend: str, where: str) -> ModelRef:
    if isinstance(raw, str):
        ref = parse_model_ref(raw)
    elif isinstance(raw, dict):
        _no_unknown(raw, _REF_KEYS, where, "model")
        repo, file, rev = raw.get("repo"), raw.get("file"), raw.get("revision", "main")
        if not isinstance(repo, str) or not _REPO_RE.match(repo):
            raise CatalogError(f"{where}: repo must be 'owner/name', got {repo!r}", _FORMAT_HINT)
        if file is not None and not isinstance(file, str):
            raise CatalogError(f"{where}: file must be a string", _FORMAT_HINT)
        if not isinstance(rev, str) or not rev:
            raise CatalogError(f"{where}: revision must be a non-empty string", _FORMAT_HINT)
        ref = ModelRef(repo, file or None, rev)
    else:
        raise CatalogError(f"{where}: expected {{ repo = ..., file = ... }} or 'REPO:FILE'", _FORMAT_HINT)
    spec = backend_spec(backend)
    if spec.single_file and not (ref.file and ref.file.endswith(".gguf")):
        raise CatalogError(f"{where}: a {backend} model needs file = '....gguf' (got {ref.file!r})", _FORMAT_HINT)
    if not spec.single_file and ref.file:
        raise CatalogError(f"{where}: a {backend} model is a whole repo; remove file = {ref.file!r}", _FORMAT_HINT)
    return ref


def parse_model_ref(spec: str) -> ModelRef:
    """'owner/name', 'owner/name:file.gguf', with an optional '@revision' at the end."""
    s = spec.strip()
    rev = "main"
    if "@" in s:
        s, rev = s.rsplit("@", 1)
    repo, _, file = s.partition(":")
    if not _REPO_RE.match(repo) or not rev:
        raise CatalogError(
            f"not a Hub model reference: {spec!r}",
            "use REPO or REPO:FILE, e.g. Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        )
    return ModelRef(repo, file or None, rev)


def _no_unknown(raw: dict, allowed: set[str], where: str, what: str) -> None:
    extra = sorted(set(raw) - allowed)
    if extra:
        raise CatalogError(
            f"{where}: unknown key {extra[0]!r} in {what}", f"allowed keys: {', '.join(sorted(allowed))}"
        )


def _str(raw: dict, key: str, where: str) -> str:
    v = raw.get(key, "")
    if not isinstance(v, str):
        raise CatalogError(f"{where}: {key} must be a string", _FORMAT_HINT)
    return v


def _line_of(text: str, key: str) -> int:
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith(key):
            return n
    return 1


def _pair_line(text: str, name: object, index: int) -> int:
    """Line of the pair's `name = ...` (or of its [[pair]] header): tomllib gives no positions for values."""
    lines = text.splitlines()
    if isinstance(name, str):
        pat = re.compile(r"^\s*name\s*=\s*[\"']" + re.escape(name) + r"[\"']")
        for n, line in enumerate(lines, 1):
            if pat.match(line):
                return n
    headers = [n for n, line in enumerate(lines, 1) if line.strip().startswith("[[pair]]")]
    return headers[index] if index < len(headers) else 1


_FORMAT_HINT = (
    "each pair is a [[pair]] table with name, description, num_draft, hardware, optionally default = true and "
    f"method = {'|'.join(pair_methods())}, and a {' and/or '.join(f'[pair.{b}]' for b in BACKENDS)} "
    "table holding target = { repo = ..., file = ... } and draft = { ... }; "
    "see the built-in models.toml for examples"
)


# -- the local cache ----------------------------------------------------------------------------


def hub_cache_dir() -> str:
    """The Hugging Face hub cache, read from the environment now (huggingface_hub reads it at import)."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return os.path.expanduser(env)
    home = os.environ.get("HF_HOME")
    if home:
        return os.path.join(os.path.expanduser(home), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def cached_model_path(ref: ModelRef, backend: str, *, cache_dir: str | None = None) -> str | None:
    """Local path of a fully downloaded model, from the cache alone (no network); None if absent."""
    cache = cache_dir or hub_cache_dir()
    if backend_spec(backend).single_file:
        if not ref.file:
            return None
        from huggingface_hub import try_to_load_from_cache

        parts = split_gguf_parts(ref.file)
        paths = [try_to_load_from_cache(ref.repo, f, cache_dir=cache, revision=ref.revision) for f in parts]
        if all(isinstance(p, str) for p in paths):
            return str(paths[0])
        return None
    snapshot = _cached_snapshot(ref, cache)
    return snapshot if snapshot and mlx_snapshot_complete(snapshot) else None


def _cached_snapshot(ref: ModelRef, cache: str) -> str | None:
    from huggingface_hub import snapshot_download

    try:
        return str(snapshot_download(ref.repo, revision=ref.revision, cache_dir=cache, local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError and kin); resolve_pair explains
        return None


def mlx_snapshot_complete(path: str | Path) -> bool:
    """Whether a snapshot looks loadable by mlx-lm: config, tokenizer, and every weight shard present (a
    drafter head's directory, recognised by its config, has no tokenizer: it reads the target's).

    huggingface_hub cannot always tell a partial snapshot from a full one, so check what mlx-lm needs.
    """
    import json

    p = Path(path)
    if not (p / "config.json").is_file():
        return False
    tokenizer = any((p / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"))
    if not tokenizer and registry.head_for_draft(p) is None:
        return False
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return all((p / s).is_file() for s in shards)
    return any(p.glob("model*.safetensors"))


_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


def split_gguf_parts(file: str) -> list[str]:
    """All parts of a split GGUF ('x-00001-of-00003.gguf' -> the three names); [file] otherwise."""
    m = _SPLIT_RE.match(file)
    if not m:
        return [file]
    n = int(m["n"])
    return [f"{m['stem']}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]


def disk_size(path: str | None, backend: str) -> int:
    """Bytes on disk of a cached model (all GGUF parts, or every file of an MLX snapshot)."""
    if not path:
        return 0
    p = Path(path)
    if backend_spec(backend).single_file:
        parent, name = p.parent, p.name
        return sum((parent / f).stat().st_size for f in split_gguf_parts(name) if (parent / f).exists())
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def pull_command(name: str, backend: str) -> str:
    return f"localspec pull {name} --backend {backend}"


def resolve_pair(name: str, backend: str, *, cache_dir: str | None = None) -> tuple[str, str]:
    """Local (target, draft) paths of a catalog pair, from the HF cache only (never the network)."""
    if backend not in BACKENDS:
        raise CatalogError(f"unknown backend {backend!r}", f"choose {' or '.join(BACKENDS)}")
    pair = load_catalog().get(name)
    bp = pair.backend(backend)
    paths, missing = [], []
    for role in ("target", "draft"):
        ref = bp.role(role)
        path = cached_model_path(ref, backend, cache_dir=cache_dir)
        if path is None:
            missing.append(f"{role} {ref}")
        paths.append(path)
    if missing:
        raise NotDownloadedError(
            f"pair {name!r} ({backend}) is not downloaded: missing " + " and ".join(missing),
            f"run `{pull_command(name, backend)}`" + (f" (about {bp.size_gb:g} GB)" if bp.size_gb else ""),
        )
    return str(paths[0]), str(paths[1])
