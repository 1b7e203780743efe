"""`localspec pull` / localspec.hub against a fake Hub on 127.0.0.1 (tests/hub_server.py).

Small GGUF files are generated with the SmolLM2 fixture's tokenizer; huggingface_hub is used as is,
pointed at the fake Hub with an explicit endpoint (and through the environment in a subprocess).
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hub_server import FakeHub

from localspec import cli
from localspec.catalog import load_catalog, resolve_pair
from localspec.errors import CatalogError, IncompatiblePairError, PullError
from localspec.gguf_meta import read_gguf_header

MiB = 1 << 20
T_REPO, T_FILE = "test-org/tiny-target-GGUF", "tiny-target-q8_0.gguf"
D_REPO, D_FILE = "test-org/tiny-draft-GGUF", "tiny-draft-q8_0.gguf"
BAD_REPO, BAD_FILE = "test-org/other-vocab-GGUF", "other-vocab.gguf"
BIG_REPO, BIG_FILE = "test-org/big-target-GGUF", "big-target.gguf"

USER_CATALOG = f"""
[[pair]]
name = "tiny"
description = "generated test pair"
num_draft = 3
hardware = "tests"
[pair.llama]
target = {{ repo = "{T_REPO}", file = "{T_FILE}" }}
draft = {{ repo = "{D_REPO}", file = "{D_FILE}" }}
size_gb = 0.01
[pair.mlx]
target = {{ repo = "test-org/tiny-target-mlx" }}
draft = {{ repo = "test-org/tiny-draft-mlx" }}
size_gb = 0.01
"""


# -- fixtures -----------------------------------------------------------------------------------


def _write_gguf(path: Path, meta: dict, n_floats: int, *, alter_tokens: bool = False) -> Path:
    import gguf
    from gguf_factory import add_metadata

    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in meta.items():
        if not key.startswith("tokenizer.ggml.") or key == "tokenizer.ggml.merges":
            continue
        if key == "tokenizer.ggml.tokens" and alter_tokens:
            value = [f"<other-{i}>" if 100 <= i < 400 else t for i, t in enumerate(value)]
        add_metadata(w, key, value)
    rng = np.random.default_rng(n_floats)
    w.add_tensor("weights", rng.standard_normal(n_floats).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def ggufs(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, bytes]:
    meta = read_gguf_header(smollm2_path).metadata
    d = tmp_path_factory.mktemp("ggufs")
    return {
        "target": _write_gguf(d / "t.gguf", meta, 3 * MiB // 4).read_bytes(),  # ~4.8 MB with the header
        "draft": _write_gguf(d / "d.gguf", meta, MiB // 4).read_bytes(),
        "bad": _write_gguf(d / "bad.gguf", meta, 8 * MiB, alter_tokens=True).read_bytes(),  # ~34 MB
        "big": _write_gguf(d / "big.gguf", meta, 8 * MiB).read_bytes(),
    }


@pytest.fixture(autouse=True)
def hf_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HF_HOME and catalog per test; returns the hub cache directory."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants

    # a token saved on this machine (hf auth login) must not reach the fake Hub
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    cat = tmp_path / "catalog.toml"
    cat.write_text(USER_CATALOG)
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(cat))
    return tmp_path / "hf" / "hub"


@pytest.fixture(scope="session")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """Real (tiny, byte-level) tokenizer files for the fake MLX repos; "other" has two ids swapped."""
    import json

    from mlx_tiny import CONFIG, write_tokenizer

    out = {}
    for name, swap in (("same", None), ("other", (65, 66))):
        d = tmp_path_factory.mktemp(f"tok-{name}")
        try:
            write_tokenizer(d, swap=swap)
        except ImportError:  # no transformers/tokenizers (no mlx extra): the MLX check is skipped anyway
            (d / "tokenizer.json").write_text(json.dumps({"swap": swap}))
            (d / "tokenizer_config.json").write_text("{}")
            (d / "chat_template.jinja").write_text("{{ messages }}")
        files = {p.name: p.read_bytes() for p in d.iterdir()}
        files["config.json"] = json.dumps(CONFIG).encode()
        out[name] = files
    return out


@pytest.fixture
def hub(ggufs: dict[str, bytes], tokenizers: dict[str, dict[str, bytes]]) -> FakeHub:
    h = FakeHub()
    h.add_repo(T_REPO, {T_FILE: ggufs["target"], "README.md": b"# tiny target\n"})
    h.add_repo(D_REPO, {D_FILE: ggufs["draft"]})
    h.add_repo(BAD_REPO, {BAD_FILE: ggufs["bad"]})
    h.add_repo(BIG_REPO, {BIG_FILE: ggufs["big"]})
    h.add_repo(
        "test-org/multi-GGUF",
        {
            "m-Q4_K_M.gguf": ggufs["draft"],
            "m-Q8_0.gguf": ggufs["draft"],
            "big/m-F16-00001-of-00002.gguf": ggufs["draft"][: len(ggufs["draft"]) // 2],
            "big/m-F16-00002-of-00002.gguf": ggufs["draft"][len(ggufs["draft"]) // 2 :],
            "mmproj-m-f16.gguf": b"GGUF",
        },
    )
    h.add_repo("test-org/gated-GGUF", {"g.gguf": ggufs["draft"]}, gated=True)
    mlx_files = {
        **tokenizers["same"],
        "model.safetensors": os.urandom(MiB),
        "README.md": b"# not downloaded for MLX\n",
        "original/consolidated.pth": b"not wanted",
    }
    h.add_repo("test-org/tiny-target-mlx", mlx_files)
    h.add_repo("test-org/tiny-draft-mlx", {**mlx_files, "model.safetensors": os.urandom(MiB // 2)})
    h.add_repo("test-org/other-tokenizer-mlx", {**tokenizers["other"], "model.safetensors": os.urandom(MiB)})
    with h:
        yield h


def _files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


# -- pulling ------------------------------------------------------------------------------------


def test_pull_pair_with_progress_then_second_pull_transfers_nothing(
    hub: FakeHub, ggufs: dict[str, bytes], hf_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    from localspec import hub as hubmod

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256 << 10)
    monkeypatch.setattr(hubmod.Tracker, "MIN_INTERVAL", 0.0)
    events: list[hubmod.ProgressEvent] = []
    result = hubmod.pull_pair("tiny", "llama", endpoint=hub.url, progress=events.append)

    assert Path(result.target).read_bytes() == ggufs["target"]
    assert Path(result.draft).read_bytes() == ggufs["draft"]
    assert result.compat_checked and result.bytes_downloaded == len(ggufs["target"]) + len(ggufs["draft"])
    assert resolve_pair("tiny", "llama") == (result.target, result.draft)
    for role, data in (("target", ggufs["target"]), ("draft", ggufs["draft"])):
        evs = [e for e in events if e.role == role]
        assert len(evs) > 3, "one event per chunk at least"
        done = [e.bytes_done for e in evs]
        assert done == sorted(done) and evs[-1].done and evs[-1].bytes_done == len(data)
        assert all(e.bytes_total == len(data) for e in evs)
        assert any(e.speed for e in evs[:-1]) and any(e.eta is not None for e in evs[:-1])
    # README.md is not part of a GGUF pull
    assert not any(p.name == "README.md" for p in _files_under(hf_env))

    hub.reset_stats()
    events.clear()
    again = hubmod.pull_pair("tiny", "llama", endpoint=hub.url, progress=events.append)
    assert (again.target, again.draft) == (result.target, result.draft)
    assert again.bytes_downloaded == 0
    assert hub.content_bytes() == 0 and hub.count("GET", "/resolve/") == 0 and hub.count(None, "/cdn/") == 0
    assert [e.cached for e in events] == [True, True]


def test_pull_mlx_pair_downloads_only_what_mlx_lm_loads(hub: FakeHub, hf_env: Path) -> None:
    from localspec.hub import pull_pair

    result = pull_pair("tiny", "mlx", endpoint=hub.url)
    target = Path(result.target)
    assert target.is_dir() and (target / "model.safetensors").stat().st_size == MiB
    assert sorted(p.name for p in target.iterdir()) == [
        "chat_template.jinja", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"
    ]  # fmt: skip
    assert result.compat_checked == _has_mlx()
    assert resolve_pair("tiny", "mlx") == (result.target, result.draft)
    hub.reset_stats()
    assert pull_pair("tiny", "mlx", endpoint=hub.url).bytes_downloaded == 0
    assert hub.content_bytes() == 0


def _has_mlx() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def test_mlx_pair_with_another_tokenizer_is_refused_before_the_weights(hub: FakeHub) -> None:
    from localspec.hub import pull_custom_pair

    if not _has_mlx():
        pytest.skip("needs mlx-lm for the tokenizer check")
    with pytest.raises(IncompatiblePairError) as ei:
        pull_custom_pair("test-org/tiny-target-mlx", "test-org/other-tokenizer-mlx", endpoint=hub.url)
    assert "token text differs for 2 ids" in ei.value.message
    assert hub.content_bytes("model.safetensors") == 0 and hub.content_bytes("tokenizer.json") > 0


def test_resume_after_the_server_drops_mid_file(
    hub: FakeHub, ggufs: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    from localspec.hub import pull_model

    chunk = 64 << 10
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", chunk)  # resume counts whole chunks
    size = len(ggufs["target"])
    hub.drop_after[(T_REPO, T_FILE)] = MiB + 1000
    result = pull_model(f"{T_REPO}:{T_FILE}", endpoint=hub.url)
    assert Path(result.path("")).read_bytes() == ggufs["target"]
    gets = [r for r in hub.requests if r.method == "GET" and r.file == f"{T_REPO}/{T_FILE}"]
    assert len(gets) == 2
    assert gets[0].body_bytes == MiB + 1000 and gets[1].range == f"bytes={MiB}-" and gets[1].status == 206
    assert hub.content_bytes() < size + chunk  # resumed, not restarted


def test_failed_transfer_leaves_no_complete_looking_file(
    hub: FakeHub, ggufs: dict[str, bytes], hf_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    from localspec.hub import pull_model

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 << 10)
    hub.drop_after[(T_REPO, T_FILE)] = MiB
    hub.fail_with[(T_REPO, T_FILE)] = [0, 500]  # the first GET goes through (and drops), the resume fails
    with pytest.raises(PullError) as ei:
        pull_model(f"{T_REPO}:{T_FILE}", endpoint=hub.url)
    assert "HTTP 500" in ei.value.message and "again" in ei.value.hint
    leftovers = _files_under(hf_env)
    assert not any(p.stat().st_size == len(ggufs["target"]) for p in leftovers)
    assert not any("snapshots" in p.parts for p in leftovers)
    assert not any(p.name.endswith(".gguf") for p in leftovers)
    with pytest.raises(CatalogError):
        resolve_pair("tiny", "llama")
    # the next pull completes
    assert Path(pull_model(f"{T_REPO}:{T_FILE}", endpoint=hub.url).path("")).read_bytes() == ggufs["target"]


def _blobs(hf_env: Path, repo: str) -> Path:
    return hf_env / ("models--" + repo.replace("/", "--")) / "blobs"


def _leave_partials(hub: FakeHub, hf_env: Path, data: bytes) -> list[Path]:
    """What a pull killed hard (SIGKILL) leaves of T_FILE: partial blobs (huggingface_hub's current
    `<etag>.<8hex>.incomplete` and the older `<etag>.incomplete`), the lock file, and a refs/main from an
    earlier pull of the repo, so no lookup can fail merely for a missing ref."""
    import hashlib

    etag = hashlib.sha256(data).hexdigest()  # the fake Hub's X-Linked-Etag: huggingface_hub names blobs by it
    blobs = _blobs(hf_env, T_REPO)
    blobs.mkdir(parents=True)
    partials = [blobs / f"{etag}.1a2b3c4d.incomplete", blobs / f"{etag}.incomplete"]
    for p in partials:
        p.write_bytes(data[:MiB])
    (blobs.parent / "refs").mkdir()
    (blobs.parent / "refs" / "main").write_text(hub.repos[T_REPO].sha)
    lock = hf_env / ".locks" / blobs.parent.name / f"{etag}.lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    return partials


def test_a_partial_blob_left_by_a_killed_pull_is_never_taken_for_the_model(
    hub: FakeHub, ggufs: dict[str, bytes], hf_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localspec.commands.models import model_states
    from localspec.hub import pull_model, pull_pair

    data = ggufs["target"]
    partials = _leave_partials(hub, hf_env, data)
    # Every cache lookup sees the model as absent: --pair, `models`, and an offline pull.
    with pytest.raises(CatalogError, match="missing target"):
        resolve_pair("tiny", "llama")
    tiny = next(r for r in model_states("llama") if r["name"] == "tiny")
    assert tiny["status"] == "not pulled" and tiny["target"]["path"] is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PullError, match="not in the cache"):
        pull_model(f"{T_REPO}:{T_FILE}", endpoint=hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert hub.requests == []

    # The next pull downloads the whole file and removes the dead partials (nobody holds their lock).
    logs: list[str] = []
    result = pull_pair("tiny", "llama", endpoint=hub.url, log=logs.append)
    assert Path(result.target).read_bytes() == data
    assert result.models[0].bytes_downloaded == len(data)
    full_gets = [
        r.body_bytes for r in hub.requests if r.method == "GET" and r.range is None and r.file == f"{T_REPO}/{T_FILE}"
    ]
    assert full_gets == [len(data)]  # one whole transfer (the header check before it reads ranges)
    assert not any(p.exists() for p in partials)
    assert not any(p.name.endswith(".incomplete") for p in _files_under(hf_env))
    assert any(f"removed 2 unfinished download(s) of {T_REPO}" in m and "(2.1 MB)" in m for m in logs), logs
    assert resolve_pair("tiny", "llama") == (result.target, result.draft)


def test_a_partial_blob_of_a_running_download_is_left_alone(
    hub: FakeHub, ggufs: dict[str, bytes], hf_env: Path
) -> None:
    """A partial whose lock another process holds is a download in progress, not a leftover."""
    from localspec.hub.client import drop_stale_partials

    partials = _leave_partials(hub, hf_env, ggufs["target"])
    lock = next((hf_env / ".locks").rglob("*.lock"))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from filelock import FileLock; l = FileLock(sys.argv[1]); l.acquire(); "
         "print('held', flush=True); sys.stdin.read()", str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert drop_stale_partials(str(hf_env), T_REPO) == []
        assert all(p.stat().st_size == MiB for p in partials)
    finally:
        holder.communicate("", timeout=30)
    dropped = drop_stale_partials(str(hf_env), T_REPO)  # the download is gone: its partials are leftovers
    assert sorted(p for p, _ in dropped) == sorted(partials) and all(n == MiB for _, n in dropped)
    assert not any(p.exists() for p in partials)


SPLIT_REPO, SPLIT_FILE = "test-org/multi-GGUF", "big/m-F16-00001-of-00002.gguf"


def test_a_split_gguf_with_a_part_missing_is_not_downloaded(
    hub: FakeHub, ggufs: dict[str, bytes], hf_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All parts or nothing: --pair, `models` and an offline pull refuse a split GGUF with a part gone,
    and the next pull fetches only the missing part."""
    from localspec.commands.models import model_states
    from localspec.hub import pull_pair

    catalog = Path(os.environ["LOCALSPEC_CATALOG"])
    catalog.write_text(
        catalog.read_text()
        + f"""
[[pair]]
name = "split"
description = "a split target"
num_draft = 3
[pair.llama]
target = {{ repo = "{SPLIT_REPO}", file = "{SPLIT_FILE}" }}
draft = {{ repo = "{D_REPO}", file = "{D_FILE}" }}
"""
    )
    # (the parts are halves of a small GGUF: the first does not hold the whole header, so no header check)
    first = pull_pair("split", "llama", endpoint=hub.url, check=False)
    assert resolve_pair("split", "llama") == (first.target, first.draft)
    second = Path(first.target).parent / "m-F16-00002-of-00002.gguf"
    blob = second.resolve()
    second.unlink()
    blob.unlink()

    with pytest.raises(CatalogError, match="missing target"):
        resolve_pair("split", "llama")
    row = next(r for r in model_states("llama") if r["name"] == "split")
    assert row["status"] == "partial: draft only" and row["target"]["path"] is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PullError, match="not in the cache"):
        pull_pair("split", "llama", endpoint=hub.url, check=False)
    monkeypatch.delenv("HF_HUB_OFFLINE")

    hub.reset_stats()
    again = pull_pair("split", "llama", endpoint=hub.url, check=False)
    half = len(ggufs["draft"]) // 2
    assert hub.content_bytes() == len(ggufs["draft"]) - half == again.bytes_downloaded  # only the lost part
    assert Path(again.target).read_bytes() + second.read_bytes() == ggufs["draft"]
    assert resolve_pair("split", "llama") == (again.target, again.draft)


def test_cancel_from_the_progress_callback(hub: FakeHub, hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from localspec import hub as hubmod

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 << 10)
    monkeypatch.setattr(hubmod.Tracker, "MIN_INTERVAL", 0.0)
    cancel = threading.Event()
    with pytest.raises(hubmod.PullCancelled):
        hubmod.pull_model(f"{T_REPO}:{T_FILE}", endpoint=hub.url, cancel=cancel, progress=lambda ev: cancel.set())
    assert not any("snapshots" in p.parts for p in _files_under(hf_env))


def test_split_gguf_pulls_every_part(hub: FakeHub, ggufs: dict[str, bytes]) -> None:
    from localspec.hub import pull_model

    r = pull_model("test-org/multi-GGUF:big/m-F16-00001-of-00002.gguf", endpoint=hub.url)
    first = Path(r.path(""))
    assert first.name == "m-F16-00001-of-00002.gguf"
    assert first.read_bytes() + (first.parent / "m-F16-00002-of-00002.gguf").read_bytes() == ggufs["draft"]


def test_ambiguous_gguf_repo_is_refused_with_the_list(hub: FakeHub) -> None:
    from localspec.hub import pull_model

    with pytest.raises(PullError) as ei:
        pull_model("test-org/multi-GGUF", endpoint=hub.url)
    assert "3 GGUF models" in ei.value.message
    hint = ei.value.hint
    assert "localspec pull test-org/multi-GGUF:m-Q4_K_M.gguf" in hint and "m-Q8_0.gguf" in hint
    assert "big/m-F16-00001-of-00002.gguf" in hint and "2 parts" in hint
    assert "mmproj" not in hint and "00002-of" not in hint
    assert hub.content_bytes() == 0
    # a repo with exactly one GGUF needs no file name
    assert Path(pull_model(D_REPO, endpoint=hub.url).path("")).name == D_FILE


SIDECAR_REPO = "test-org/with-drafters-GGUF"


def _sidecar_repo(hub: FakeHub, gguf: bytes) -> None:
    """A repo laid out like unsloth's: two quantizations of a model, and beside them MTP, EAGLE-3 and
    DFlash drafter files in several quantizations (one in a subfolder, which llama.cpp does not take)."""
    small = gguf[:4096]  # sidecars are fetched as files; their content is not read here
    hub.add_repo(SIDECAR_REPO, {
        "Model-Q4_K_M.gguf": gguf, "Model-Q8_0.gguf": gguf,
        "mtp-Model-Q8_0.gguf": small + b"8", "mtp-Model-Q4_K_M.gguf": small + b"4", "extra/mtp-Model-Q4_0.gguf": small,
        "eagle3-Model-F16.gguf": small + b"e", "dflash-Model-Q8_0.gguf": small + b"d", "dflash-Model-Q4_0.gguf": small,
        "README.md": b"# with drafters\n",
    })  # fmt: skip


def test_pull_fetches_the_drafter_sidecars_llama_cpp_would(
    hub: FakeHub, ggufs: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    from localspec.hub import pull_model

    _sidecar_repo(hub, ggufs["draft"])
    r = pull_model(f"{SIDECAR_REPO}:Model-Q4_K_M.gguf", endpoint=hub.url)
    m = r.models[0]
    # Per family the one in the model's folder whose quantization is closest to the model's (4 bits).
    assert {f: Path(p).name for f, p in m.sidecars.items()} == {
        "mtp": "mtp-Model-Q4_K_M.gguf", "eagle3": "eagle3-Model-F16.gguf", "dflash": "dflash-Model-Q4_0.gguf"}  # fmt: skip
    assert Path(m.sidecars["mtp"]).read_bytes().endswith(b"4") and Path(m.path).name == "Model-Q4_K_M.gguf"
    got = {p.name for p in Path(m.path).parent.rglob("*.gguf")}
    assert got == {"Model-Q4_K_M.gguf", "mtp-Model-Q4_K_M.gguf", "eagle3-Model-F16.gguf", "dflash-Model-Q4_0.gguf"}
    assert {f: Path(p).name for f, p in pull_model(f"{SIDECAR_REPO}:Model-Q8_0.gguf", endpoint=hub.url)
            .models[0].sidecars.items()}["mtp"] == "mtp-Model-Q8_0.gguf"  # fmt: skip
    # A drafter pulled itself brings no second file of its own family.
    assert set(pull_model(f"{SIDECAR_REPO}:dflash-Model-Q8_0.gguf", endpoint=hub.url).models[0].sidecars) == {
        "mtp",
        "eagle3",
    }
    # Sidecars are no models: the repo holds two, and the list offers only those.
    with pytest.raises(PullError, match="2 GGUF models") as ei:
        pull_model(SIDECAR_REPO, endpoint=hub.url)
    assert "mtp-" not in ei.value.hint and "Model-Q8_0.gguf" in ei.value.hint
    # The CLI names each sidecar and how to run it.
    assert _main(["pull", f"{SIDECAR_REPO}:Model-Q4_K_M.gguf", "--endpoint", hub.url]) == 0
    out = capsys.readouterr().out
    assert "  mtp " in out and "--draft-method mtp" in out and "eagle3-Model-F16.gguf --draft-method eagle3" in out


def test_a_head_pair_pulls_its_head_and_runs_its_method(
    hub: FakeHub, eagle3_pair: tuple[Path, Path], hf_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog pair whose draft is an EAGLE-3 head: pulled like any pair (the head carries the target's
    tokenizer, so the header check passes), and `--pair` runs eagle3 where auto was left as the default."""
    from localspec.cli import build_parser
    from localspec.commands.first_use import model_options_from_args
    from localspec.hub import pull_pair

    target, head = eagle3_pair
    hub.add_repo("test-org/tiny-llama-GGUF", {"tiny-llama-F32.gguf": target.read_bytes()})
    hub.add_repo("test-org/tiny-llama-eagle3-GGUF", {head.name: head.read_bytes()})
    cat = tmp_path / "catalog.toml"
    cat.write_text(
        USER_CATALOG
        + """
[[pair]]
name = "tiny-eagle3"
method = "eagle3"
description = "generated EAGLE-3 pair"
num_draft = 3
hardware = "tests"
[pair.llama]
target = { repo = "test-org/tiny-llama-GGUF", file = "tiny-llama-F32.gguf" }
draft = { repo = "test-org/tiny-llama-eagle3-GGUF", file = "HEAD" }
size_gb = 0.01
""".replace("HEAD", head.name)
    )
    r = pull_pair("tiny-eagle3", "llama", endpoint=hub.url)
    assert r.compat_checked and Path(r.draft).read_bytes() == head.read_bytes()
    opts = model_options_from_args(build_parser().parse_args(["run", "--pair", "tiny-eagle3", "hi"]))
    assert (opts.draft_method, opts.draft) == ("eagle3", r.draft)
    explicit = model_options_from_args(
        build_parser().parse_args(["run", "--pair", "tiny-eagle3", "--draft-method", "ngram", "hi"])
    )
    assert explicit.draft_method == "ngram"
    from localspec.pipeline import check_pair

    assert check_pair(opts).backend == "llama"  # the head fits its target, from the headers


def _dir_files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def test_an_mlx_head_pair_pulls_the_head_checked_against_its_target(hub: FakeHub, hf_env: Path, tmp_path: Path) -> None:
    """An MLX pair whose draft is a head directory (an EAGLE-3 head: config and weights, no tokenizer): its fit
    to the target is checked from the configs before any weights move, the snapshot counts as complete without
    a tokenizer, and `--pair` runs its method; a head made for another target is refused before its weights."""
    if not _has_mlx():
        pytest.skip("needs mlx-lm")
    import mlx_heads
    import mlx_tiny

    from localspec.cli import build_parser
    from localspec.commands.first_use import model_options_from_args
    from localspec.hub import pull_pair

    target = mlx_tiny.build(tmp_path / "target", seed=1)
    config = mlx_tiny.CONFIG
    head = mlx_heads.write_eagle3(tmp_path / "head", config, seed=2, layer_ids=(0, 1, 2))
    wide = mlx_heads.write_eagle3(tmp_path / "wide", {**config, "hidden_size": 96}, seed=3, layer_ids=(0, 1, 2))
    hub.add_repo("test-org/tiny-qwen-mlx", _dir_files(target))
    hub.add_repo("test-org/tiny-qwen-eagle3", _dir_files(head))
    hub.add_repo("test-org/wide-eagle3", _dir_files(wide))
    cat = tmp_path / "catalog.toml"
    cat.write_text(
        USER_CATALOG
        + """
[[pair]]
name = "tiny-mlx-eagle3"
method = "eagle3"
description = "generated EAGLE-3 head on MLX"
num_draft = 3
hardware = "tests"
[pair.mlx]
target = { repo = "test-org/tiny-qwen-mlx" }
draft = { repo = "test-org/tiny-qwen-eagle3" }
size_gb = 0.01

[[pair]]
name = "tiny-mlx-wide"
method = "eagle3"
description = "a head made for a wider target"
num_draft = 3
hardware = "tests"
[pair.mlx]
target = { repo = "test-org/tiny-qwen-mlx" }
draft = { repo = "test-org/wide-eagle3" }
size_gb = 0.01
"""
    )
    r = pull_pair("tiny-mlx-eagle3", "mlx", endpoint=hub.url)
    assert r.compat_checked and (Path(r.draft) / "config.json").is_file()
    assert resolve_pair("tiny-mlx-eagle3", "mlx") == (r.target, r.draft)  # complete without a tokenizer
    opts = model_options_from_args(
        build_parser().parse_args(["run", "--pair", "tiny-mlx-eagle3", "--backend", "mlx", "hi"])
    )
    assert (opts.draft_method, opts.draft) == ("eagle3", r.draft)
    hub.reset_stats()
    with pytest.raises(IncompatiblePairError, match="does not fit") as e:
        pull_pair("tiny-mlx-wide", "mlx", endpoint=hub.url)
    assert "test-org/wide-eagle3" in e.value.message
    assert hub.content_bytes("model.safetensors") == 0  # refused before the head's weights


def test_incompatible_pair_is_refused_from_the_headers_alone(
    hub: FakeHub, ggufs: dict[str, bytes], hf_env: Path
) -> None:
    from localspec.hub import pull_custom_pair

    with pytest.raises(IncompatiblePairError) as ei:
        pull_custom_pair(f"{BIG_REPO}:{BIG_FILE}", f"{BAD_REPO}:{BAD_FILE}", endpoint=hub.url)
    assert "token text differs for 300 ids" in ei.value.message
    served = hub.content_bytes()
    assert served <= 2 * 4 * MiB and served < (len(ggufs["big"]) + len(ggufs["bad"])) / 8
    assert not any("snapshots" in p.parts for p in _files_under(hf_env))
    # --no-check downloads anyway
    r = pull_custom_pair(f"{T_REPO}:{T_FILE}", f"{BAD_REPO}:{BAD_FILE}", endpoint=hub.url, check=False)
    assert not r.compat_checked and Path(r.draft).is_file()


def test_hub_errors_are_mapped_to_messages_and_hints(hub: FakeHub) -> None:
    from localspec.hub import pull_model

    def err(spec: str, **kw: object) -> PullError:
        with pytest.raises(PullError) as ei:
            pull_model(spec, endpoint=hub.url, **kw)  # type: ignore[arg-type]
        return ei.value

    e = err("test-org/no-such-repo:x.gguf")
    assert "repository test-org/no-such-repo not found" in e.message and "HF_TOKEN" in e.hint
    e = err(f"{T_REPO}:missing.gguf")
    assert "file missing.gguf not found" in e.message and f"{T_REPO}:{T_FILE}" in e.hint
    e = err(f"{T_REPO}:{T_FILE}@no-such-branch")
    assert "revision 'no-such-branch' not found" in e.message
    e = err("test-org/gated-GGUF:g.gguf")
    assert "gated" in e.message and "HF_TOKEN" in e.hint and "accept" in e.hint
    e = err("test-org/gated-GGUF:g.gguf", token="hf_wrong")
    assert "HTTP 401" in e.message and "invalid or expired" in e.hint
    assert Path(pull_model("test-org/gated-GGUF:g.gguf", endpoint=hub.url, token=hub.token).path("")).is_file()
    e = err("test-org/tiny-target-mlx", backend="llama")
    assert "no GGUF" in e.message and "--backend mlx" in e.hint
    e = err(T_REPO, backend="mlx")
    assert "not an mlx-lm model repo" in e.message and "--backend llama" in e.hint


def test_connection_and_disk_errors_are_mapped(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec import hub as hubmod

    with pytest.raises(PullError) as ei:
        hubmod.pull_model(f"{T_REPO}:{T_FILE}", endpoint="http://127.0.0.1:9")  # nothing listens there
    assert "cannot reach http://127.0.0.1:9" in ei.value.message and "HF_HUB_OFFLINE" in ei.value.hint

    from localspec.hub.client import Hub
    from localspec.hub.errors import map_error

    h = Hub("http://x", None, "/tmp/cache", None, None, None)
    ref = hubmod.ModelRef("a/b")
    e = map_error(OSError(errno.ENOSPC, "No space left on device"), h, ref, "f.gguf", size=5 * 10**9)
    assert "disk full" in e.message and "5.0 GB" in e.message and "HF_HOME" in e.hint
    e = map_error(OSError("Consistency check failed: file should be of size 10"), h, ref, "f")
    assert "interrupted" in e.message and "again" in e.hint

    class _Usage:
        free = 1000

    monkeypatch.setattr(shutil, "disk_usage", lambda p: _Usage())
    with pytest.raises(PullError) as ei:
        hubmod.pull_model(f"{T_REPO}:{T_FILE}", endpoint=hub.url)
    assert "not enough disk space" in ei.value.message and hub.content_bytes() == 0


def test_hf_token_and_offline_mode_from_the_environment(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.hub import pull_model

    monkeypatch.setenv("HF_TOKEN", hub.token)
    first = pull_model("test-org/gated-GGUF:g.gguf", endpoint=hub.url)
    monkeypatch.delenv("HF_TOKEN")
    hub.reset_stats()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = pull_model("test-org/gated-GGUF:g.gguf", endpoint=hub.url)
    assert again.path("") == first.path("") and hub.requests == []
    with pytest.raises(PullError) as ei:
        pull_model(f"{T_REPO}:{T_FILE}", endpoint=hub.url)
    assert "HF_HUB_OFFLINE" in ei.value.message and "unset" in ei.value.hint
    assert hub.requests == []


def test_catalog_qwen_pair_is_compatible_from_real_fixture_headers(
    hub: FakeHub, qwen_pair: tuple[Path, Path], gemma_path: Path
) -> None:
    """The catalog's Qwen2.5-Coder llama pair, served from the real fixture GGUFs, checked by Range reads."""
    from localspec.hub import check_remote_pair

    (t_path, d_path), g_path = qwen_pair, gemma_path
    bp = load_catalog(include_user=False).get("qwen2.5-coder-1.5b").backends["llama"]
    assert (bp.target.file, bp.draft.file) == (t_path.name, d_path.name)
    hub.add_repo(bp.target.repo, {bp.target.file: t_path})
    hub.add_repo(bp.draft.repo, {bp.draft.file: d_path})
    report = check_remote_pair(bp.target, bp.draft, endpoint=hub.url)
    total = t_path.stat().st_size + d_path.stat().st_size
    assert report.target_vocab == report.draft_vocab == 151_936
    assert report.bytes_read == hub.content_bytes() <= 16 * MiB < total / 50
    # and a real mismatch, from real headers
    hub.add_repo("test-org/gemma", {g_path.name: g_path})
    with pytest.raises(IncompatiblePairError) as ei:
        check_remote_pair(bp.target, f"test-org/gemma:{g_path.name}", endpoint=hub.url)
    assert "vocabulary type differs" in ei.value.message


# -- the CLI ------------------------------------------------------------------------------------


def _main(argv: list[str]) -> int:
    """cli.main with only this file's commands registered (others may be mid-edit in the tree)."""
    import argparse

    from localspec.commands import models, pull
    from localspec.errors import LocalspecError

    parser = argparse.ArgumentParser(prog="localspec")
    sub = parser.add_subparsers(dest="command")
    pull.add_parser(sub)
    models.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except LocalspecError as e:
        cli.print_error(e)
        return e.exit_code


def test_pull_and_models_are_cli_commands() -> None:
    assert {"pull", "models"} <= set(cli.COMMANDS)


def test_cli_pull_piped_prints_plain_lines(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["pull", "tiny", "--backend", "llama", "--endpoint", hub.url]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert any(ln.startswith(f"target: downloading {T_REPO}/{T_FILE}") for ln in lines)
    assert any(ln.startswith(f"draft: {D_FILE} done") for ln in lines)
    assert "vocabularies match" in err
    assert out.splitlines()[0].startswith("ready: tiny (llama), ")
    assert "run it: localspec run --pair tiny --backend llama" in out

    assert _main(["pull", "tiny", "--backend", "llama", "--endpoint", hub.url]) == 0
    out, err = capsys.readouterr()
    assert "already downloaded" in err and "nothing to download" in out

    assert _main(["models", "--backend", "llama"]) == 0
    out, _ = capsys.readouterr()
    tiny = out[out.index("tiny  (num_draft 3)") :]
    assert tiny.splitlines()[3].split()[:2] == ["llama", "ready"] and "MB on disk" in tiny
    assert "download" not in tiny.splitlines()[3]  # a ready pair has nothing left to download
    assert "not pulled" in out  # the built-in pairs
    assert any("not pulled" in ln and "GB download" in ln for ln in out.splitlines())


def test_cli_errors_and_usage(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["pull", "test-org/multi-GGUF", "--endpoint", hub.url]) == 1
    err = capsys.readouterr().err
    assert "\nerror: test-org/multi-GGUF has 3 GGUF models" in err and "hint: pick one:" in err
    assert _main(["pull", "--target", f"{T_REPO}:{T_FILE}"]) == 2
    assert "both --target and --draft" in capsys.readouterr().err
    assert _main(["pull", "no-such-pair"]) == 1
    assert "known pairs:" in capsys.readouterr().err
    pair = ["--target", f"{T_REPO}:{T_FILE}", "--draft", f"{D_REPO}:{D_FILE}"]
    assert _main(["pull", "--check-only", *pair, "--endpoint", hub.url]) == 0
    assert "compatible:" in capsys.readouterr().out and hub.count("GET", "/cdn/") == 2


def test_check_only_checks_a_pair_of_local_files_from_their_headers(
    tiny_ggufs: tuple[Path, Path, Path], gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same header check on files already here as on Hub files (the one `run` makes before loading)."""
    from localspec.options import ModelOptions
    from localspec.pipeline import check_pair

    target, draft = str(tiny_ggufs[0]), str(tiny_ggufs[1])
    assert _main(["pull", "--check-only", "--target", target, "--draft", draft]) == 0
    out, err = capsys.readouterr()
    expected = check_pair(ModelOptions(target=target, draft=draft, draft_method="model")).describe("model")
    assert out.splitlines()[0] == expected and expected.startswith("compatible: same vocabulary (")
    assert f"target  {target}" in out and f"draft   {draft}" in out
    assert f"run it: localspec run --backend llama --target {target} --draft {draft}" in out
    assert "error" not in err

    # A pair whose vocabularies differ is refused from the headers, as on the Hub, with the reason.
    assert _main(["pull", "--check-only", "--target", target, "--draft", str(gemma_path)]) == 1
    out, err = capsys.readouterr()
    assert not out and "error: " in err and "vocabulary" in err and "hint: " in err and "Traceback" not in err


def test_check_only_in_a_fresh_process_on_local_files(tiny_ggufs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The installed CLI: a local pair is checked (exit 0), a local file that is not whole fails (exit 1)."""
    target, draft = tiny_ggufs[0], tiny_ggufs[1]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(draft.read_bytes()[: draft.stat().st_size // 2])  # a download that broke off
    base = [sys.executable, "-m", "localspec.cli", "pull", "--check-only", "--target", str(target)]
    ok = subprocess.run([*base, "--draft", str(draft)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("compatible: same vocabulary") and "not a Hub model reference" not in ok.stderr
    bad = subprocess.run([*base, "--draft", str(cut)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "error: " in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_local_paths_are_not_pulled_and_say_what_to_use(
    hub: FakeHub, tiny_ggufs: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = str(tiny_ggufs[0]), str(tiny_ggufs[1])
    # a pair of local files without --check-only: nothing to download, and the commands that use them
    assert _main(["pull", "--target", target, "--draft", draft, "--endpoint", hub.url]) == 2
    err = capsys.readouterr().err
    assert f"error: {target} is a local file: there is nothing to pull" in err
    assert "localspec pull --check-only --target" in err and "localspec doctor --target" in err
    assert f"localspec run --target {target} --draft {draft}" in err
    # one local file named as the model to pull
    assert _main(["pull", target, "--endpoint", hub.url]) == 2
    err = capsys.readouterr().err
    assert "is a local file" in err and f"localspec run --target {target}" in err and "localspec doctor" in err
    # one local file and one Hub file: --check-only says it compares like with like
    mixed = ["--target", target, "--draft", f"{D_REPO}:{D_FILE}"]
    assert _main(["pull", "--check-only", *mixed, "--endpoint", hub.url]) == 2
    assert "two local files or two Hub files" in capsys.readouterr().err
    # a path that is not there: said plainly, not "not a Hub model reference"
    missing = str(tmp_path / "nowhere.gguf")
    assert _main(["pull", "--check-only", "--target", missing, "--draft", draft]) == 1
    err = capsys.readouterr().err
    assert f"no such file or directory: {missing}" in err and "not a Hub model reference" not in err
    assert not hub.requests  # none of these asked the Hub anything


def test_tty_progress_draws_one_bar_per_file_with_speed_and_eta() -> None:
    from localspec.commands.pull import ProgressPrinter
    from localspec.hub import ProgressEvent

    buf = io.StringIO()
    p = ProgressPrinter(buf, tty=True, width=110)
    p(ProgressEvent("a.gguf", "o/r", "target", 0, 4_000_000_000, None, None, False))
    p(ProgressEvent("a.gguf", "o/r", "target", 1_000_000_000, 4_000_000_000, 50e6, 60.0, False))
    p(ProgressEvent("a.gguf", "o/r", "target", 4_000_000_000, 4_000_000_000, 50e6, 0.0, True))
    p(ProgressEvent("b.gguf", "o/d", "draft", 500, 500, None, None, True, True))
    text = buf.getvalue()
    assert text.count("\r") == 3 and text.count("\n") == 2
    assert "25% 1.0 GB/4.0 GB  50.0 MB/s  ETA 1:00" in text and "100% 4.0 GB/4.0 GB" in text
    assert "draft: o/d/b.gguf already downloaded (500 B)" in text
    assert all(len(line) < 110 for line in text.replace("\r", "\n").splitlines())


def test_environment_variables_reach_huggingface_hub_in_a_subprocess(hub: FakeHub, tmp_path: Path) -> None:
    """HF_ENDPOINT and HF_TOKEN are read by huggingface_hub at import: check them in a fresh process."""
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": hub.token,
        "HF_HOME": str(tmp_path / "sub-hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "pull", "test-org/gated-GGUF:g.gguf"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "sub-hf" / "hub") in proc.stdout
    assert all(r.auth == f"Bearer {hub.token}" for r in hub.requests if r.origin == "hub")


def test_progress_class_fits_huggingface_hubs_xet_reporter() -> None:
    """Real Hub repos are Xet-backed: hf_xet reports through this reporter, not http_get."""
    from types import SimpleNamespace

    # A plain import: an upgrade that moves or renames the reporter must fail here, not skip silently.
    from huggingface_hub.utils._xet_progress_reporting import (
        XetDownloadProgressReporter,
    )

    from localspec.hub import Tracker as _Tracker

    events = []
    tracker = _Tracker("w.safetensors", "o/r", "draft", None, events.append, None)
    tracker.MIN_INTERVAL = 0.0
    with XetDownloadProgressReporter(
        reconstruction_desc="w.safetensors", total=300, log_level=30, tqdm_class=tracker.bar_class()
    ) as reporter:
        for done in (100, 250, 300):
            report = SimpleNamespace(
                total_bytes=300, total_bytes_completed=done, total_transfer_bytes_completed=done - 10,
                total_bytes_completion_rate=1e6, total_transfer_bytes_completion_rate=1e6,
            )  # fmt: skip
            reporter.update_progress(report, {})
    tracker.finish(300)
    assert [e.bytes_done for e in events] == [100, 250, 300, 300] and events[-1].done
    assert tracker.total == 300 and tracker.transferred == 290
