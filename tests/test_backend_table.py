"""serve --parallel reaches a backend's several-sequences support through the backend table alone: a backend
registered with a parallel module gets parallel sequences, its default and its refusals, without a word of serve
changed."""

from __future__ import annotations

import dataclasses

import pytest
import toy_parallel
from fakes import FakeBackend, hashed_logits

from localspec.backends import registry
from localspec.commands.serve import GPU_PARALLEL, open_parallel, resolve_parallel
from localspec.errors import LocalspecError, UsageError
from localspec.options import ModelOptions
from localspec.pipeline import DraftSlot, Pipeline, make_drafter

TOY = dataclasses.replace(registry.LLAMA, name="fake", label="Toy", parallel_module="toy_parallel")


def pipeline(n_gpu_layers: int = -1) -> Pipeline:
    target = FakeBackend(hashed_logits(1))  # its ModelInfo names the backend "fake"
    options = ModelOptions(target="/fake/target", draft_method="ngram", n_gpu_layers=n_gpu_layers)
    return Pipeline(options, "fake", target, DraftSlot(), make_drafter("ngram", target, None))


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.BACKENDS, "fake", TOY)
    monkeypatch.setitem(toy_parallel.SAYS, "unbatchable", "")
    monkeypatch.setitem(toy_parallel.SAYS, "batches_pay", True)


def test_a_registered_backends_parallel_sequences_are_opened_through_the_table(toy: None) -> None:
    p = pipeline()
    assert resolve_parallel(None, p) == GPU_PARALLEL  # the toy says batches pay here
    batch = open_parallel(p, 3)
    assert isinstance(batch, toy_parallel.ToyParallel)
    assert (batch.model, batch.n_sequences, batch.n_ctx) == (p.target, 3, p.target.n_ctx)
    assert open_parallel(p, 1) is None


def test_the_default_and_the_refusals_are_the_backends_word(toy: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_parallel(None, pipeline(n_gpu_layers=0)) == 1  # batches do not pay on its CPU
    monkeypatch.setitem(toy_parallel.SAYS, "unbatchable", "the toy's layers keep one sequence")
    assert resolve_parallel(None, pipeline()) == 1
    with pytest.raises(UsageError, match="the toy's layers keep one sequence"):
        resolve_parallel(2, pipeline())


def test_a_backend_without_a_parallel_module_decodes_one_sequence_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.BACKENDS, "fake", dataclasses.replace(TOY, parallel_module=None))
    assert resolve_parallel(None, pipeline()) == 1
    with pytest.raises(UsageError, match="the Toy backend decodes one sequence at a time"):
        resolve_parallel(2, pipeline())


def test_every_field_of_the_table_is_read() -> None:
    """A field nobody reads is a promise nobody keeps (hidden_states once said False for MLX, which runs heads)."""
    from pathlib import Path

    root = Path(registry.__file__).resolve().parents[1]
    code = "\n".join(p.read_text() for p in root.rglob("*.py"))
    for f in dataclasses.fields(registry.BackendSpec):
        assert f".{f.name}" in code, f"BackendSpec.{f.name} is read nowhere"


def test_a_backend_whose_table_lists_no_head_family_runs_no_head(monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.families import registry as families

    monkeypatch.setitem(registry.BACKENDS, "llama", dataclasses.replace(registry.LLAMA, head_families=()))
    ctx = dataclasses.replace(families.BuildContext(target=FakeBackend(hashed_logits(1)), backend="llama"), head="h")
    with pytest.raises(UsageError, match="runs on MLX only"):
        families.build_drafter("eagle3", ctx)


@pytest.fixture
def toy_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    import toy_heads

    spec = dataclasses.replace(TOY, head_families=("eagle3", "dflash"), heads_module="toy_heads")
    monkeypatch.setitem(registry.BACKENDS, "fake", spec)
    monkeypatch.setattr(toy_heads, "ASKED", [])
    monkeypatch.setitem(toy_heads.REFUSE, "check", "")


def test_a_registered_backends_heads_are_built_and_checked_through_the_table(toy_heads: None) -> None:
    """The families name no backend: a backend that lists head families in the table gets them, built and checked
    by its own heads module, without a word of the families changed."""
    import toy_heads

    from localspec.families import registry as families

    assert families.family("eagle3").runs_on("fake") and not families.family("mtp").runs_on("fake")
    target = FakeBackend(hashed_logits(1))
    ctx = dataclasses.replace(families.BuildContext(target=target, backend="fake", n_gpu_layers=7), head="h.bin")
    drafter = families.build_drafter("dflash", ctx)
    assert isinstance(drafter, toy_heads.ToyHead)
    assert (drafter.family, drafter.target, drafter.head, drafter.n_gpu_layers) == ("dflash", target, "h.bin", 7)
    eagle3 = families.family("eagle3")
    assert eagle3.check is not None
    check = families.CheckContext(target="/t", draft="/h", backend="fake", module=registry.LLAMA.module())
    eagle3.check(check)
    assert ("require", "dflash") in toy_heads.ASKED and ("check", "eagle3", "/t", "/h") in toy_heads.ASKED
    with pytest.raises(UsageError, match="runs on"):
        families.build_drafter("mtp", ctx)  # not in the toy's table
    toy_heads.REFUSE["check"] = "the toy reads no such head"
    with pytest.raises(LocalspecError, match="the toy reads no such head"):
        eagle3.check(check)
