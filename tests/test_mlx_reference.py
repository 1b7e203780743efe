"""Goldens against the reference implementations (the `reference` extra: z-lab's `dflash`, `mlx-vlm`), on
tiny random fp32 models: each reference runs its own greedy speculative loop on an mlx-lm target while a
wrapper records every draft it makes; localspec's drafter, given the same weights and the same committed
context each round, must propose the same tokens. Skipped where the reference package is not installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx_tiny  # noqa: E402

from localspec.backends.mlx import backend as mb  # noqa: E402
from localspec.sampling import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
TARGET_CONFIG = {**mlx_tiny.CONFIG, "num_hidden_layers": 4}
PROMPT = "Once upon a time, there was a"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mlx_tiny.build(tmp_path_factory.mktemp("ref") / "target", seed=1, config=TARGET_CONFIG)


def _save(out: Path, module: Any, config: dict[str, Any]) -> Path:
    """A reference module's random weights and its Hugging Face config, as a head directory."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v for k, v in tree_flatten(module.parameters()) if isinstance(v, mx.array)}
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def _to_eog(draft: list[int], eog: frozenset[int]) -> list[int]:
    """A reference draft up to its first end-of-generation token: localspec stops drafting there (drafts past
    the end of the answer are wasted verify work), the references draft on."""
    at = next((i for i, t in enumerate(draft) if t in eog), None)
    return draft if at is None else draft[: at + 1]


def _assert_same_drafts(
    target_dir: Path, make: Any, contexts: list[list[int]], theirs: list[list[int]], k: int
) -> None:
    """localspec's drafter (`make(target)`) on each reference round's committed context, the target holding all
    of it but the last token: the reference's drafts, up to their first end-of-generation token."""
    from localspec.backends.base import sync_cache

    target = mb.load(str(target_dir), n_ctx=512)
    drafter = make(target)
    try:
        sync_cache(target, contexts[0][:-1], logits=False)
        drafter.prepare(contexts[0][:-1], k)
        ours = []
        for context in contexts:
            sync_cache(target, context[:-1], logits=False)
            ours.append(drafter.propose(context, k, GREEDY, np.random.default_rng(0)).tokens)
        eog = target.eog_ids
    finally:
        drafter.close()
        target.close()
    assert ours == [_to_eog(t, eog) for t in theirs]


def _replay(target: Any, drafter: Any, prompt: list[int], first: int, rounds: list[tuple[int, list[int]]],
            final: list[int], k: int) -> list[tuple[list[int], list[int]]]:  # fmt: skip
    """Each reference round again with localspec's drafter: (theirs, ours) per round whose draft was k long.
    The target holds the committed context but its last token, as after the reference's own verify pass."""
    from localspec.backends.base import sync_cache

    context = [*prompt, first]
    done = 1
    sync_cache(target, context[:-1], logits=False)
    drafter.prepare(context[:-1], k)
    pairs = []
    for anchor, theirs in rounds:
        assert anchor == context[-1]
        if len(theirs) == k:
            pairs.append(
                (_to_eog(theirs, target.eog_ids), drafter.propose(context, k, GREEDY, np.random.default_rng(0)).tokens)
            )
        accepted = 0
        while accepted < len(theirs) and done + accepted < len(final) and theirs[accepted] == final[done + accepted]:
            accepted += 1
        new = final[done : done + accepted + 1]
        n_past = len(context) - 1
        target.forward([context[-1], *theirs], all_logits=True)  # the reference's verify batch, then its cut
        target.rollback(n_past + 1 + accepted)
        context += new
        done += len(new)
    return pairs


# -- DFlash: z-lab's dflash.model_mlx ------------------------------------------------------------------


def _check_against_zlab(ref: Any, draft: Any, rounds: list[tuple[int, list[int]]], target_dir: Path, head: Path,
                        block: int, max_tokens: int) -> None:  # fmt: skip
    """z-lab's own greedy loop with `draft` (which records its rounds), then localspec's DFlash drafter on the
    same committed contexts: the same drafts in every full-block round."""
    from mlx_lm.utils import load_model, load_tokenizer

    from localspec.backends.mlx.dflash import BlockDrafter

    model, _ = load_model(target_dir)
    tokenizer = load_tokenizer(target_dir)
    prompt = tokenizer.encode(PROMPT)
    final: list[int] = []
    for response in ref.stream_generate(model, draft, tokenizer, prompt, block_size=block, max_tokens=max_tokens):
        final += list(response.tokens)
    assert len(rounds) > 3
    target = mb.load(str(target_dir), n_ctx=512)
    drafter = BlockDrafter(target, head, method="dflash")
    try:
        pairs = _replay(target, drafter, list(prompt), final[0], rounds, final, block - 1)
    finally:
        drafter.close()
        target.close()
    assert len(pairs) >= 3
    assert [ours for _, ours in pairs] == [theirs for theirs, _ in pairs]


def test_dflash_drafts_equal_z_labs_reference(target_dir: Path, tmp_path: Path) -> None:
    ref = pytest.importorskip("dflash.model_mlx")
    import mlx.core as mx

    block = 8
    config = ref.DFlashConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, vocab_size=mlx_tiny.N_VOCAB, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=4096, block_size=block, target_layer_ids=(0, 2, 3), num_target_layers=4,
        mask_token_id=mlx_tiny.N_VOCAB - 1,
    )  # fmt: skip
    mx.random.seed(5)
    rounds: list[tuple[int, list[int]]] = []

    class Recorded(ref.DFlashDraftModel):  # type: ignore[misc, name-defined]
        def __call__(self, inputs, target_hidden, cache, logits_start=0):  # type: ignore[no-untyped-def]
            logits = super().__call__(inputs, target_hidden, cache, logits_start)
            rounds.append((int(inputs[0, 0].item()), mx.argmax(logits, axis=-1)[0].tolist()))
            return logits

    draft = Recorded(config)
    head = _save(tmp_path / "dflash", draft, {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "vocab_size": mlx_tiny.N_VOCAB, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "num_target_layers": 4,
        "dflash_config": {"block_size": block, "mask_token_id": mlx_tiny.N_VOCAB - 1, "target_layer_ids": [0, 2, 3]},
    })  # fmt: skip
    _check_against_zlab(ref, draft, rounds, target_dir, head, block, max_tokens=60)


# -- EAGLE-3: mlx-vlm's Eagle3DraftModel ------------------------------------------------------------------


def _layer_outputs(model: Any, tokens: list[int], cache: list[Any], ids: list[int]) -> tuple[Any, Any]:
    """The target's logits and the outputs of layers `ids` side by side, computed layer by layer here (the
    reference's own capture convention, independent of localspec's)."""
    import mlx.core as mx
    from mlx_lm.models.base import create_attention_mask

    h = model.model.embed_tokens(mx.array(tokens)[None])
    mask = create_attention_mask(h, cache[0])
    outs = {}
    for i, (layer, c) in enumerate(zip(model.model.layers, cache)):
        h = layer(h, mask, c)
        outs[i] = h
    logits = model.lm_head(model.model.norm(h))
    return logits[0], mx.concatenate([outs[i] for i in ids], axis=-1)


@pytest.mark.parametrize("draft_vocab", [None, 64])
def test_eagle3_drafts_equal_mlx_vlms_reference(target_dir: Path, tmp_path: Path, draft_vocab: int | None) -> None:
    pytest.importorskip("mlx_vlm.speculative.drafters.eagle3.eagle3")
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model, load_tokenizer
    from mlx_vlm.speculative.drafters.eagle3.config import Eagle3Config as RefConfig
    from mlx_vlm.speculative.drafters.eagle3.eagle3 import Eagle3DraftModel

    from localspec.backends.mlx.eagle3 import Eagle3Drafter

    k, n_rounds = 4, 8
    layer = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
             "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
             "vocab_size": mlx_tiny.N_VOCAB, "rope_theta": 10000.0, "max_position_embeddings": 4096}  # fmt: skip
    raw = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "transformer_layer_config": layer,
           "draft_vocab_size": draft_vocab or mlx_tiny.N_VOCAB, "target_hidden_size": 64,
           "eagle_aux_hidden_state_layer_ids": [1, 2, 4], "norm_before_residual": True}  # fmt: skip
    mx.random.seed(7)
    ref = Eagle3DraftModel(RefConfig.from_dict(raw))
    params = {n: v for n, v in tree_flatten(ref.parameters()) if not n.startswith("embed_tokens")}
    params["lm_head.weight"] = params["lm_head.weight"] * 8.0  # peaked, like a trained head
    if draft_vocab:
        ids = np.sort(np.random.default_rng(3).choice(mlx_tiny.N_VOCAB, size=draft_vocab, replace=False))
        params["d2t"] = mx.array((ids - np.arange(draft_vocab)).astype(np.int32))
    ref.load_weights(list(params.items()), strict=False)
    out = tmp_path / "head"
    out.mkdir()
    mx.save_safetensors(str(out / "model.safetensors"), params)
    (out / "config.json").write_text(json.dumps(raw))

    model, _ = load_model(target_dir)
    cache = make_prompt_cache(model)
    capture = list(ref.config.capture_layer_ids)
    prompt = load_tokenizer(target_dir).encode(PROMPT)
    logits, hidden = _layer_outputs(model, prompt, cache, capture)
    committed = [int(mx.argmax(logits[-1]).item())]
    ref.reset(model)
    ref.prefill_from_target_hidden(mx.array(prompt)[None], hidden, committed[0], None, greedy=True)
    theirs: list[list[int]] = []
    contexts: list[list[int]] = []
    for _ in range(n_rounds):
        contexts.append([*prompt, *committed])
        drafts = ref.draft_block(committed[-1], None, None, k + 1, None, greedy=True)
        d = drafts[0].tolist()
        theirs.append(d)
        n_past = len(prompt) + len(committed) - 1
        logits, verify_hidden = _layer_outputs(model, [committed[-1], *d], cache, capture)
        best = mx.argmax(logits, axis=-1).tolist()
        accepted = next((i for i in range(k) if d[i] != best[i]), k)
        new = [*d[:accepted], best[accepted]]
        for c in cache:
            c.trim(c.offset - (n_past + 1 + accepted))
        ref.accept_verified_tokens(verify_hidden, drafts, accepted, new, None, greedy=True)
        committed += new

    _assert_same_drafts(target_dir, lambda t: Eagle3Drafter(t, out), contexts, theirs, k)


# -- Qwen3.5 MTP: mlx-vlm's Qwen3_5MTPDraftModel ---------------------------------------------------------


def test_qwen35_mtp_drafts_equal_mlx_vlms_reference(tmp_path: Path) -> None:
    pytest.importorskip("mlx_vlm.speculative.drafters.qwen3_5_mtp.qwen3_5_mtp")
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model, load_tokenizer
    from mlx_vlm.speculative.drafters.qwen3_5_mtp.config import Qwen3_5MTPConfig
    from mlx_vlm.speculative.drafters.qwen3_5_mtp.qwen3_5_mtp import Qwen3_5MTPDraftModel

    from localspec.backends.mlx.mtp import MtpDrafter

    k, n_rounds = 3, 8
    config = {**mlx_tiny.QWEN35_CONFIG, "mtp_num_hidden_layers": 1}
    target_dir = mlx_tiny.build(tmp_path / "qwen35", seed=2, config=mlx_tiny.QWEN35_CONFIG)
    mx.random.seed(11)
    ref = Qwen3_5MTPDraftModel(Qwen3_5MTPConfig.from_dict({"text_config": config}))
    params = dict(tree_flatten(ref.parameters()))
    # The checkpoint keeps them as an original one does (mtp.*); this one's other weights are converted
    # already, so neither side shifts the norms, and both read the same numbers.
    mx.save_safetensors(str(target_dir / "model-mtp.safetensors"), {f"mtp.{n}": v for n, v in params.items()})
    (target_dir / "config.json").write_text(json.dumps(config))

    model, _ = load_model(target_dir)
    text = model.language_model
    prompt = load_tokenizer(target_dir).encode(PROMPT)

    def hidden_of(tokens: list[int]) -> Any:
        return text.model(mx.array(tokens)[None], cache=make_prompt_cache(model))  # post-norm, from scratch

    h = hidden_of(prompt)
    committed = [int(mx.argmax(text.lm_head(h)[0, -1]).item())]
    ref.reset(model)
    ref.prefill_from_target_hidden(mx.array(prompt)[None], h, committed[0], None, greedy=True)
    theirs: list[list[int]] = []
    contexts: list[list[int]] = []
    for _ in range(n_rounds):
        contexts.append([*prompt, *committed])
        drafts = ref.draft_block(committed[-1], None, None, k + 1, None, greedy=True)
        d = drafts[0].tolist()
        theirs.append(d)
        full = hidden_of([*prompt, *committed, *d])
        verify = full[:, len(prompt) + len(committed) - 1 :]
        best = mx.argmax(text.lm_head(verify)[0], axis=-1).tolist()
        accepted = next((i for i in range(k) if d[i] != best[i]), k)
        new = [*d[:accepted], best[accepted]]
        ref.accept_verified_tokens(verify, drafts, accepted, new, None, greedy=True)
        committed += new

    _assert_same_drafts(target_dir, MtpDrafter, contexts, theirs, k)


# -- DSpark: mlx-vlm's DSparkDraftModel ------------------------------------------------------------------


@pytest.mark.parametrize("from_anchor", [True, False])
def test_dspark_drafts_equal_mlx_vlms_reference(target_dir: Path, tmp_path: Path, from_anchor: bool) -> None:
    pytest.importorskip("mlx_vlm.speculative.drafters.dspark.dspark")
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model, load_tokenizer
    from mlx_vlm.speculative.drafters.dspark.config import DSparkConfig
    from mlx_vlm.speculative.drafters.dspark.dspark import DSparkDraftModel

    from localspec.backends.mlx.dflash import BlockDrafter

    k, n_rounds, layers = 4, 8, [0, 2, 3]
    raw = {
        "architectures": ["DSparkDraftModel"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "vocab_size": mlx_tiny.N_VOCAB, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "dflash_config": {"block_size": 8, "mask_token_id": mlx_tiny.N_VOCAB - 1, "target_layer_ids": layers,
                          "num_target_layers": 4, "markov_rank": 16, "sample_from_anchor": from_anchor,
                          "block_size_policy": "fixed"},
    }  # fmt: skip
    mx.random.seed(13)
    ref = DSparkDraftModel(DSparkConfig.from_dict(raw))
    params = {n: v for n, v in tree_flatten(ref.parameters()) if isinstance(v, mx.array)}
    params["markov_head.markov_w2.weight"] = params["markov_head.markov_w2.weight"] * 4.0  # a bias that matters
    ref.load_weights(list(params.items()), strict=False)
    out = tmp_path / "dspark"
    out.mkdir()
    mx.save_safetensors(str(out / "model.safetensors"), params)
    (out / "config.json").write_text(json.dumps(raw))

    model, _ = load_model(target_dir)
    cache = make_prompt_cache(model)
    capture = list(layers)  # DFlash ids name layer outputs
    prompt = load_tokenizer(target_dir).encode(PROMPT)
    logits, hidden = _layer_outputs(model, prompt, cache, capture)
    committed = [int(mx.argmax(logits[-1]).item())]
    # Its target check asks for mlx-vlm's own model classes (their cache rollback); the drafts do not use them.
    ref.validate_target_compatibility = lambda target_model: None
    draft_cache = ref.reset(model)
    theirs: list[list[int]] = []
    contexts: list[list[int]] = []
    for _ in range(n_rounds):
        contexts.append([*prompt, *committed])
        drafts = ref.draft_block(committed[-1], hidden, draft_cache, k + 1, lambda x: mx.argmax(x, axis=-1))
        d = drafts[0].tolist()
        theirs.append(d)
        n_past = len(prompt) + len(committed) - 1
        logits, verify_hidden = _layer_outputs(model, [committed[-1], *d], cache, capture)
        best = mx.argmax(logits, axis=-1).tolist()
        accepted = next((i for i in range(k) if d[i] != best[i]), k)
        for c in cache:
            c.trim(c.offset - (n_past + 1 + accepted))
        hidden = verify_hidden[:, : accepted + 1]
        committed += [*d[:accepted], best[accepted]]

    _assert_same_drafts(target_dir, lambda t: BlockDrafter(t, out, method="dspark"), contexts, theirs, k)


def test_dflash2_drafts_equal_z_labs_reference(target_dir: Path, tmp_path: Path) -> None:
    ref = pytest.importorskip("dflash.model_mlx")
    import mlx.core as mx
    from mlx.utils import tree_flatten

    block = 6
    conv = {"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
    config = ref.DFlashConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, vocab_size=mlx_tiny.N_VOCAB, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=4096, block_size=block, target_layer_ids=(0, 2, 3), num_target_layers=4,
        mask_token_id=mlx_tiny.N_VOCAB - 1, **conv,
    )  # fmt: skip
    mx.random.seed(17)
    rounds: list[tuple[int, list[int]]] = []

    class Recorded(ref.DFlash2DraftModel):  # type: ignore[misc, name-defined]
        def propose(self, inputs, target_hidden, cache, temperature, logits_start=0):  # type: ignore[no-untyped-def]
            out = super().propose(inputs, target_hidden, cache, temperature, logits_start)
            rounds.append((int(inputs[0, 0].item()), out[0][0].tolist()))
            return out

    draft = Recorded(config)
    params = dict(tree_flatten(draft.parameters()))
    for name in [n for n in params if n.endswith("base_kernel")]:  # zeros at init: make the convolution matter
        params[name] = 0.5 * mx.random.normal(params[name].shape)
    for name in [n for n in params if "codebook" in n]:
        params[name] = 4.0 * mx.random.normal(params[name].shape)
    draft.load_weights(list(params.items()))
    published = {(n[: -len(".weight")] if n.endswith("_codebook.weight") else n): v for n, v in params.items()}
    head = tmp_path / "dflash2"
    head.mkdir()
    mx.save_safetensors(str(head / "model.safetensors"), published)
    (head / "config.json").write_text(json.dumps({
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "vocab_size": mlx_tiny.N_VOCAB, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "dflash_config": {"block_size": block, "mask_token_id": mlx_tiny.N_VOCAB - 1, "target_layer_ids": [0, 2, 3], **conv},
    }))  # fmt: skip
    _check_against_zlab(ref, draft, rounds, target_dir, head, block, max_tokens=50)
