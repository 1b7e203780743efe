"""The model catalog: the shipped models.toml, user overrides, error positions, cache lookups."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest

from localspec.catalog import (
    BACKENDS,
    ModelRef,
    load_catalog,
    mlx_snapshot_complete,
    parse_catalog,
    parse_model_ref,
    resolve_pair,
    split_gguf_parts,
    user_catalog_path,
)
from localspec.errors import CatalogError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("LOCALSPEC_CATALOG", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)


def test_builtin_catalog_parses_and_every_pair_names_both_roles() -> None:
    cat = load_catalog(include_user=False)
    assert len(cat.pairs) >= 4
    assert "qwen2.5-coder-1.5b" in cat.pairs
    for pair in cat.pairs.values():
        assert pair.description and pair.hardware, pair.name
        assert 1 <= pair.num_draft <= 16
        assert pair.backends and set(pair.backends) <= set(BACKENDS)
        for backend, bp in pair.backends.items():
            assert bp.size_gb and bp.size_gb > 0
            for ref in (bp.target, bp.draft):
                assert "/" in ref.repo
                if backend == "llama":
                    assert ref.file and ref.file.endswith(".gguf"), (pair.name, ref)
                else:
                    assert ref.file is None, (pair.name, ref)
            # An MTP head lives in the target's own file ("-MTP-GGUF" releases); every other draft is a file of its own.
            assert (bp.target == bp.draft) == (pair.method == "mtp"), pair.name


def test_builtin_head_pairs_run_with_their_method_where_the_family_runs() -> None:
    from localspec.families import registry

    heads = {p.name: p for p in load_catalog(include_user=False).pairs.values() if p.method != "model"}
    assert {p.method for p in heads.values()} >= {"mtp", "dflash"}
    for pair in heads.values():
        assert pair.base is None  # vLLM's draft_model command would be wrong
        assert all(registry.family(pair.method).runs_on(b) for b in pair.backends), pair.name
    assert any("mlx" in p.backends and p.method == "dflash" for p in heads.values())  # a head pair for Macs
    assert any(p.backends["llama"].target.repo.endswith("-MTP-GGUF") for p in heads.values() if p.method == "mtp")
    # MTP on MLX needs the original checkpoint: mlx-community's conversions drop the mtp.* weights.
    for pair in heads.values():
        if pair.method == "mtp" and "mlx" in pair.backends:
            mlx = pair.backends["mlx"]
            assert mlx.target.repo == mlx.draft.repo and not mlx.target.repo.startswith("mlx-community/")


def test_every_builtin_pair_names_its_original_models_for_vllm() -> None:
    for pair in load_catalog(include_user=False).pairs.values():
        if pair.method != "model":
            continue  # drafters vLLM serves differently (speculative_config methods); not generated yet
        assert pair.base is not None and "/" in pair.base.target and "/" in pair.base.draft, pair.name
        assert "GGUF" not in pair.base.target + pair.base.draft  # vLLM loads the originals, not conversions


def test_models_toml_ships_in_the_package_and_matches_the_top_level_file() -> None:
    packaged = (importlib.resources.files("localspec") / "models.toml").read_text(encoding="utf-8")
    assert packaged == (ROOT / "models.toml").read_text(encoding="utf-8")


def test_every_builtin_pair_has_a_verification_comment() -> None:
    """Each [[pair]] is preceded by a comment block saying where its names were confirmed."""
    text = (ROOT / "models.toml").read_text(encoding="utf-8")
    blocks = text.split("[[pair]]")[:-1]
    for block in blocks:
        comment = [ln for ln in block.strip().splitlines()[-12:] if ln.startswith("#")]
        assert comment, "a pair without a comment"


def test_user_catalog_adds_and_overrides_pairs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "config" / "localspec" / "models.toml"
    user.parent.mkdir(parents=True)
    user.write_text(
        """
[[pair]]
name = "qwen2.5-coder-1.5b"
description = "mine"
num_draft = 7
hardware = "my laptop"
[pair.llama]
target = "me/target-GGUF:t.gguf"
draft = { repo = "me/draft-GGUF", file = "d.gguf", revision = "v1" }

[[pair]]
name = "my-mlx-pair"
description = "an MLX pair"
hardware = "Mac"
[pair.mlx]
target = { repo = "me/big-4bit" }
draft = { repo = "me/small-4bit" }
"""
    )
    assert user_catalog_path() == user
    cat = load_catalog()
    p = cat.get("qwen2.5-coder-1.5b")
    assert (p.num_draft, p.source) == (7, str(user))
    assert p.backends["llama"].target == ModelRef("me/target-GGUF", "t.gguf")
    assert p.backends["llama"].draft == ModelRef("me/draft-GGUF", "d.gguf", "v1")
    assert "mlx" not in p.backends  # an override replaces the whole pair
    assert cat.get("my-mlx-pair").num_draft == 4
    assert "qwen2.5-coder-7b" in cat.pairs  # the others stay
    # LOCALSPEC_CATALOG wins over XDG_CONFIG_HOME
    other = tmp_path / "other.toml"
    other.write_text("")
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(other))
    assert user_catalog_path() == other
    assert load_catalog().get("qwen2.5-coder-1.5b").source == "built-in"


def test_malformed_user_catalog_names_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[pair]]\nname = "x"\ndescription = "unterminated\n')
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(bad))
    with pytest.raises(CatalogError) as ei:
        load_catalog()
    assert str(bad) in ei.value.message
    assert "line 3" in ei.value.message
    assert ei.value.hint


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('[pair.llama]\ntarget = "a/b:t.gguf"\n', "missing draft"),
        ('[pair.llama]\ntarget = "a/b:t.gguf"\ndraft = "a/c"\n', "needs file"),
        ('[pair.mlx]\ntarget = "a/b:t.gguf"\ndraft = "a/c"\n', "whole repo"),
        ('num_drafts = 3\n[pair.mlx]\ntarget = "a/b"\ndraft = "a/c"\n', "unknown key 'num_drafts'"),
        ("", "needs a [pair.llama]"),
        ('base = { target = "a/b" }\n[pair.mlx]\ntarget = "a/b"\ndraft = "a/c"\n', "draft must be a Hub repo id"),
        (
            'base = { target = "a/b", draft = "c", x = 1 }\n[pair.mlx]\ntarget = "a/b"\ndraft = "a/c"\n',
            "unknown key 'x'",
        ),
        ('method = "medusa"\n[pair.llama]\ntarget = "a/b:t.gguf"\ndraft = "a/c:d.gguf"\n', "method must be one of"),
    ],
)
def test_semantic_errors_name_file_and_pair_line(body: str, needle: str) -> None:
    text = '# comment\n\n[[pair]]\nname = "p1"\n' + body
    with pytest.raises(CatalogError) as ei:
        parse_catalog(text, source="/x/models.toml")
    assert ei.value.message.startswith("/x/models.toml:4"), ei.value.message
    assert needle in ei.value.message


def test_unknown_pair_lists_the_known_ones() -> None:
    with pytest.raises(CatalogError) as ei:
        load_catalog().get("no-such-pair")
    assert "qwen2.5-coder-1.5b" in ei.value.hint and "llama-3.1-8b" in ei.value.hint


def test_resolve_pair_not_downloaded_hints_the_exact_pull_command() -> None:
    with pytest.raises(CatalogError) as ei:
        resolve_pair("qwen2.5-coder-1.5b", "llama")
    assert "`localspec pull qwen2.5-coder-1.5b --backend llama`" in ei.value.hint
    with pytest.raises(CatalogError) as ei:
        resolve_pair("qwen2.5-coder-7b", "mlx")
    assert "localspec pull qwen2.5-coder-7b --backend mlx" in ei.value.hint
    with pytest.raises(CatalogError) as ei:
        resolve_pair("nope", "llama")
    assert "qwen3-8b" in ei.value.hint


def test_resolve_pair_finds_files_in_the_hf_cache_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """resolve_pair reads only the standard cache layout (refs/main -> snapshots/<sha>/file)."""
    user = tmp_path / "cat.toml"
    user.write_text(
        '[[pair]]\nname = "t"\n[pair.llama]\ntarget = "o/t:t.gguf"\ndraft = "o/d:d.gguf"\n'
        '[pair.mlx]\ntarget = "o/tm"\ndraft = "o/dm"\n'
    )
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(user))
    hub = tmp_path / "hf" / "hub"
    sha = "a" * 40

    def put(repo: str, files: dict[str, str]) -> Path:
        root = hub / ("models--" + repo.replace("/", "--"))
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(sha)
        snap = root / "snapshots" / sha
        for name, content in files.items():
            (snap / name).parent.mkdir(parents=True, exist_ok=True)
            (snap / name).write_text(content)
        return snap

    t, d = put("o/t", {"t.gguf": "T"}), put("o/d", {"d.gguf": "D"})
    assert resolve_pair("t", "llama") == (str(t / "t.gguf"), str(d / "d.gguf"))
    tm = put("o/tm", {"config.json": "{}", "tokenizer.json": "{}", "model.safetensors": "w"})
    put("o/dm", {"config.json": "{}", "tokenizer.json": "{}"})  # no weights: incomplete
    with pytest.raises(CatalogError) as ei:
        resolve_pair("t", "mlx")
    assert "draft o/dm" in ei.value.message and "--backend mlx" in ei.value.hint
    (hub / "models--o--dm" / "snapshots" / sha / "model.safetensors").write_text("w")
    assert resolve_pair("t", "mlx")[0] == str(tm)


def test_model_refs_and_split_names() -> None:
    assert parse_model_ref("a/b") == ModelRef("a/b")
    assert parse_model_ref("a/b:x/y.gguf@v2") == ModelRef("a/b", "x/y.gguf", "v2")
    with pytest.raises(CatalogError):
        parse_model_ref("not-a-repo")
    assert split_gguf_parts("m-00001-of-00003.gguf") == [
        "m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"
    ]  # fmt: skip
    assert split_gguf_parts("m.gguf") == ["m.gguf"]


def test_mlx_snapshot_completeness(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert not mlx_snapshot_complete(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}'
    )
    (tmp_path / "model-00001-of-00002.safetensors").write_text("w")
    assert not mlx_snapshot_complete(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").write_text("w")
    assert mlx_snapshot_complete(tmp_path)


# -- the default pair -------------------------------------------------------------------------------


def test_builtin_catalog_marks_one_default_the_small_qwen_pair() -> None:
    cat = load_catalog(include_user=False)
    assert [p.name for p in cat.pairs.values() if p.default] == ["qwen2.5-coder-1.5b"] == [cat.default]
    bp = cat.default_pair().backends["llama"]  # the fixture files of tests/fixture_models.py
    assert (bp.target.file, bp.draft.file) == (
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    )  # fmt: skip


def test_two_defaults_in_one_file_are_refused_with_the_line() -> None:
    pair = '[[pair]]\nname = "{}"\ndefault = true\n[pair.mlx]\ntarget = "a/b"\ndraft = "a/c"\n'
    with pytest.raises(CatalogError) as ei:
        parse_catalog(pair.format("p1") + "\n" + pair.format("p2"), source="/x/models.toml")
    assert ei.value.message.startswith("/x/models.toml:9") and "'p1'" in ei.value.message
    with pytest.raises(CatalogError) as ei:
        parse_catalog('[[pair]]\nname = "p"\ndefault = "yes"\n[pair.mlx]\ntarget = "a/b"\ndraft = "a/c"\n', source="f")
    assert "default must be true or false" in ei.value.message


def test_user_catalog_default_wins_and_a_replaced_default_stays_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = tmp_path / "mine.toml"
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(user))
    mine = '[[pair]]\nname = "{}"\n{}[pair.mlx]\ntarget = "me/t"\ndraft = "me/d"\n'
    user.write_text(mine.format("mine", "default = true\n"))
    cat = load_catalog()
    assert cat.default == "mine" and cat.default_pair().name == "mine"
    user.write_text(mine.format("qwen2.5-coder-1.5b", ""))  # the default's models replaced, not its role
    cat = load_catalog()
    assert cat.default == "qwen2.5-coder-1.5b" and cat.default_pair().source == str(user)
