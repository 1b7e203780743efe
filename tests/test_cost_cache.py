"""Auto's costs remembered on disk: keys, round trips, damage, and what a warm cache saves a run
(no calibration at all; no draft model loaded where it cannot pay)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from fakes import CostedBackend, FakeClock, scripted_tokens

from localspec.decoding.auto import AutoDrafter, auto_lookup
from localspec.decoding.cost_cache import CostStore, cache_dir
from localspec.decoding.engine import Done, GenerationConfig, generate
from localspec.decoding.policy import CostModel
from localspec.decoding.stats import RoundStats
from localspec.pipeline import Pipeline
from localspec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def cpu_like(n: int) -> float:
    return 0.030 * (1 + 0.6 * (n - 1))


def _store(tmp_path: Path, **kw: object) -> CostStore:
    model = tmp_path / "m.gguf"
    if not model.exists():
        model.write_bytes(b"x" * 10)
    args = dict(target=str(model), draft=None, backend="llama", device="CPU (2 threads)", threads=2) | kw
    return CostStore.for_models(**args)  # type: ignore[arg-type]


def test_round_trip_in_the_user_cache_dir(tmp_path: Path, _private_cost_cache: Path) -> None:
    store = _store(tmp_path)
    assert store.load() is None
    costs = CostModel(target={1: 0.03, 2: 0.05, 33: 0.45}, draft_token=0.02, scale=2.0)
    store.save(costs)
    assert store.path.parent.parent == cache_dir() == _private_cost_cache
    got = store.load()
    assert got is not None
    assert got.target == pytest.approx({1: 0.06, 2: 0.10, 33: 0.90})  # today's pace folded in
    assert got.draft_token == pytest.approx(0.04) and got.scale == 1.0


def test_key_follows_the_file_build_device_and_threads(tmp_path: Path) -> None:
    base = _store(tmp_path)
    assert _store(tmp_path).key == base.key
    assert _store(tmp_path, threads=4).key != base.key
    assert _store(tmp_path, device="CUDA (all 29 layers offloaded)").key != base.key
    assert _store(tmp_path, draft=str(tmp_path / "d.gguf")).key != base.key
    assert _store(tmp_path, backend="mlx").key != base.key
    model = tmp_path / "m.gguf"
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new download of the same path
    assert _store(tmp_path).key != base.key


@pytest.mark.parametrize(
    "content", ["{not json", '{"version": 999, "target_s": {"1": 0.1}}', '{"version": 1, "target_s": {"2": 0.1}}', "[]"]
)
def test_damaged_or_foreign_files_count_as_absent(tmp_path: Path, content: str) -> None:
    store = _store(tmp_path)
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_text(content)
    assert store.load() is None


def test_an_unwritable_cache_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(blocker))  # a file where the directory should be
    store = _store(tmp_path)
    store.save(CostModel(target={1: 0.03}))
    assert store.load() is None


# -- what it saves a run ----------------------------------------------------------------------------------


def _auto_run(store: CostStore, script: list[int], prompt: list[int], n: int = 40):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    target = CostedBackend(scripted_tokens(script), clock, cpu_like, name="target")
    drafter = AutoDrafter(ngram=auto_lookup(), target=target, clock=clock, store=store)
    *_, done = generate(
        target, drafter, prompt, GenerationConfig(max_tokens=n, num_draft=32, sampling=GREEDY), clock=clock
    )
    drafter.close()
    assert isinstance(done, Done)
    return target, done


REPEATS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 10


def _verify_passes(target: CostedBackend, done: Done, rounds: list[RoundStats]) -> None:
    """The target ran the prompt pass and one verify pass per round, nothing else: no calibration stall."""
    assert target.forward_calls[1:] == [r.n_drafted + 1 for r in rounds]
    assert done.stats.decode_s == pytest.approx(sum(r.draft_s + r.verify_s for r in rounds))


def test_a_first_answer_learns_the_curve_from_its_own_rounds_then_it_is_remembered(tmp_path: Path) -> None:
    store = _store(tmp_path)
    clock = FakeClock()
    target = CostedBackend(scripted_tokens(REPEATS * 2), clock, cpu_like, name="target")
    drafter = AutoDrafter(ngram=auto_lookup(), target=target, clock=clock, store=store)
    config = GenerationConfig(max_tokens=200, num_draft=32, sampling=GREEDY)
    events = list(generate(target, drafter, REPEATS[:20], config, clock=clock))
    done = events[-1]
    assert isinstance(done, Done)
    rounds = [e.round for e in events[:-1] if e.round is not None]  # type: ignore[union-attr]
    assert done.stats.prompt_s == pytest.approx(cpu_like(20))  # nothing before the first token
    _verify_passes(target, done, rounds)
    assert rounds[0].n_drafted == 0 and done.stats.n_drafted > 0  # T(1) first, then suffix drafts
    # Drafts grow by doubling past the largest batch timed (the prior's slope is a guess): 2, 4, 8, ...
    largest = 1
    for r in rounds:
        assert r.n_drafted <= max(2, 2 * (largest - 1))
        largest = max(largest, r.n_drafted + 1)
    assert largest == 33  # and reach the longest draft where they pay
    drafter.close()
    saved = json.loads(store.path.read_text())["target_s"]  # consistent: remembered, as the rounds timed it
    assert {int(n): t for n, t in saved.items()} == pytest.approx({int(n): cpu_like(int(n)) for n in saved})
    assert len(saved) >= 3
    # A later run finds the curve: the same tokens, no faster to learn but no slower either.
    target2, done2 = _auto_run(store, REPEATS * 2, REPEATS[:20], n=200)
    assert done2.tokens == done.tokens
    assert done2.stats.decode_s <= done.stats.decode_s * 1.02


def test_a_run_with_nothing_to_draft_never_calibrates(tmp_path: Path) -> None:
    unique = list(range(100, 200))
    target, done = _auto_run(_store(tmp_path), unique, unique[:10])
    assert set(target.forward_calls[1:]) == {1}  # the prompt pass, then single tokens: plain decoding
    assert done.stats.n_drafted == 0


# -- the pipeline: a draft model that cannot pay is not loaded -------------------------------------------


def _generate_waiting(pipe: Pipeline, prompt: str, config: GenerationConfig) -> Done:
    """A generation that waits, between rounds, for a draft model auto is loading in the background (so the
    round after the one that started the load has it; a real answer goes on without waiting)."""
    from localspec.decoding.drafters import LazyModelDrafter

    done = None
    for event in pipe.generate(prompt, config):
        done = event if isinstance(event, Done) else done
        model = getattr(pipe.drafter, "model", None)
        if isinstance(model, LazyModelDrafter):
            assert model.wait(60)
    assert done is not None
    return done


def test_auto_loads_the_draft_model_only_when_a_round_wants_it(tiny_ggufs, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from localspec import gguf_meta
    from localspec.options import ModelOptions
    from localspec.pipeline import load_pipeline

    opts = ModelOptions(target=str(tiny_ggufs[0]), draft=str(tiny_ggufs[1]), draft_method="auto", n_ctx=512, threads=1)
    config = GenerationConfig(max_tokens=8, num_draft=32, sampling=GREEDY)
    cold = load_pipeline(opts)
    try:
        # Nothing measured yet: not loaded with the target; and the draft's file is as big as the target's, so
        # the prior (a draft token costs the share of the weights it streams) says a model draft cannot pay.
        assert cold.draft is None and cold.has_draft_model and not cold.draft_note
        done = _generate_waiting(cold, "Say hi", config)
        assert isinstance(done, Done) and cold.draft is None
        store = cold.cost_store
    finally:
        cold.close()
    assert cold.draft is None  # closed with the pipeline
    store.save(CostModel(target={1: 0.030, 2: 0.054, 5: 0.1, 9: 0.2, 33: 0.45}, draft_token=0.019))
    parsed: list[str] = []
    real_parse = gguf_meta._parsed

    def spy(path: str, *args: object):  # type: ignore[no-untyped-def]
        parsed.append(path)
        return real_parse(path, *args)

    with monkeypatch.context() as patched:  # undoing only the spy: monkeypatch.undo() would also undo conftest's
        patched.setattr(gguf_meta, "_parsed", spy)  # private cost cache, and the rest would write the user's
        warm = load_pipeline(opts)
    try:
        # Decided before the target loads: the draft's file is not even opened (its header is a tenth of
        # a second of Python for a 150k-token vocabulary).
        assert str(tiny_ggufs[0]) in parsed and str(tiny_ggufs[1]) not in parsed
        assert warm.draft is None
        assert "not loaded" in warm.draft_note and warm.draft_note in warm.notes
        *_, done = warm.generate("Say hi", config)
        assert isinstance(done, Done) and done.stats.draft_method == "auto"
        assert warm.draft is None  # never: the measured costs say it cannot pay
    finally:
        warm.close()
    store.save(CostModel(target={1: 0.030, 2: 0.031, 5: 0.032, 9: 0.033, 33: 0.04}, draft_token=0.002))  # GPU-like
    fast = load_pipeline(opts)
    try:
        assert fast.draft is None and not fast.draft_note  # it can pay, but no round has asked yet
        done = _generate_waiting(fast, "Say hi", config)
        assert isinstance(done, Done) and fast.draft is not None and fast.draft_slot.load_s > 0
        assert fast.drafter.model.loaded_by == "localspec-draft-load"  # type: ignore[attr-defined]  # beside the answer
        assert any(s.source == "model" and s.drafted > 0 for s in done.stats.sources)
    finally:
        fast.close()


def _native_threads() -> int:
    """This process's threads, llama.cpp's own included (Linux)."""
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_on_a_target_that_takes_every_core_the_answer_starts_no_thread_and_idle_time_loads_the_draft(
    tiny_ggufs,
) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp's default threads (every core): the costs say a model draft pays, but the answer neither loads the
    draft model nor starts a thread (a load beside the decode takes a core from the target's threads); idle time
    loads it on the idle thread itself and reads the conversation into it; the next answer, which may draft with
    it, starts no thread either (a second llama.cpp context's included)."""
    from localspec.decoding.auto import AutoDrafter, idle_work
    from localspec.decoding.drafters import LazyModelDrafter
    from localspec.options import ModelOptions
    from localspec.pipeline import load_pipeline

    opts = ModelOptions(target=str(tiny_ggufs[0]), draft=str(tiny_ggufs[1]), draft_method="auto", n_ctx=512)
    config = GenerationConfig(max_tokens=24, num_draft=8, sampling=GREEDY)
    first = load_pipeline(opts)
    first.cost_store.save(CostModel(target={1: 0.030, 2: 0.031, 5: 0.032, 9: 0.033, 33: 0.04}, draft_token=0.002))
    first.close()
    pipe = load_pipeline(opts)
    try:
        drafter = pipe.drafter
        assert isinstance(drafter, AutoDrafter) and isinstance(drafter.model, LazyModelDrafter)
        counts = [_native_threads() for _ in pipe.generate("Say hi", config)]
        assert not drafter.model.loading and not drafter.model.loaded and pipe.draft is None
        assert max(counts) == counts[0]  # no thread started in the answer (the first event: after the prompt)
        step = idle_work(drafter)
        assert step is not None
        while step():
            pass
        assert pipe.draft is not None and drafter.model.loaded_by == threading.current_thread().name
        assert drafter.model.lag(pipe.target.cached_tokens) == 0  # the conversation so far, read where nobody waits
        counts = []
        done = None
        for event in pipe.generate("Say hi again", config):
            counts.append(_native_threads())
            done = event if isinstance(event, Done) else done
        assert isinstance(done, Done) and max(counts) == counts[0]
    finally:
        pipe.close()


def test_the_device_foreseen_from_the_header_is_the_loaded_one(tiny_ggufs) -> None:  # type: ignore[no-untyped-def]
    """auto finds its remembered costs by the device before the target loads: the header must tell it right."""
    from localspec.backends.llama import backend as llama_cpp

    for threads, layers in ((1, -1), (2, 0), (None, 3)):
        backend = llama_cpp.load(str(tiny_ggufs[0]), n_ctx=128, threads=threads, n_gpu_layers=layers)
        try:
            assert llama_cpp.device_for(str(tiny_ggufs[0]), threads=threads, n_gpu_layers=layers) == backend.info.device
        finally:
            backend.close()


def test_a_draft_model_loaded_late_costs_the_round_nothing_in_auto_s_estimates(tmp_path: Path) -> None:
    """Loading (5 s here) starts in the first round that wants the model and runs beside the answer: it falls in
    no round (nor in the draft's per-token cost, or auto would give up on a draft that pays), and the rounds
    after it draft with the model."""
    from fakes import scripted_draft

    from localspec.decoding.drafters import LazyModelDrafter

    clock = FakeClock()
    target_fn = scripted_tokens(list(range(100, 200)))
    target = CostedBackend(target_fn, clock, lambda n: 0.030 + 0.001 * n, name="target", device="CUDA (fake)")
    loads: list[int] = []

    go = threading.Event()

    def load():  # type: ignore[no-untyped-def]
        loads.append(1)
        go.wait(10)  # let run between rounds, where the fake clock is the answer's alone
        clock.advance(5.0)
        return CostedBackend(scripted_draft(target_fn, lambda n: True), clock, lambda n: 0.003, name="draft")

    costs = CostModel(target={1: 0.031, 2: 0.032, 5: 0.035, 9: 0.039, 33: 0.063}, draft_token=0.003)
    lazy = LazyModelDrafter(load, "draft")
    drafter = AutoDrafter(model=lazy, target=target, clock=clock, costs=costs)
    events = []
    config = GenerationConfig(max_tokens=40, num_draft=8, sampling=GREEDY)
    for event in generate(target, drafter, list(range(100, 110)), config, clock=clock):
        events.append(event)
        if lazy.loading:
            go.set()
        assert lazy.wait(30)  # between rounds: the round after the one that started the load has the model
    *events, done = events
    assert isinstance(done, Done) and loads == [1]
    assert done.stats.n_drafted > 0 and done.stats.n_accepted == done.stats.n_drafted
    assert drafter.controller.costs.draft_s() == pytest.approx(0.003, rel=0.5)  # not 5 s / k
    rounds = [e.round for e in events if e.round is not None]
    assert all(r.draft_s + r.verify_s < 1.0 for r in rounds)  # the 5 s in none of them
    assert rounds[0].source == "none"  # started the load, and went on plainly
    assert len(rounds) > 3 and all(r.source == "model" for r in rounds[1:-1])  # (the last: one token left)


def test_a_draft_model_that_fails_to_load_late_is_dropped_and_said(tmp_path: Path) -> None:
    from localspec.decoding.drafters import LazyModelDrafter
    from localspec.errors import ModelFileError

    clock = FakeClock()
    gpu = "CUDA (fake)"  # an answer may load it (beside the decode)
    target = CostedBackend(
        scripted_tokens(list(range(100, 200))), clock, lambda n: 0.030 + 0.001 * n, name="target", device=gpu
    )

    def load():  # type: ignore[no-untyped-def]
        raise ModelFileError("could not load draft.gguf: out of memory", "use a smaller draft")

    costs = CostModel(target={1: 0.031, 2: 0.032, 5: 0.035, 9: 0.039, 33: 0.063}, draft_token=0.003)
    drafter = AutoDrafter(
        ngram=auto_lookup(), model=LazyModelDrafter(load, "draft"), target=target, clock=clock, costs=costs
    )
    *events, done = generate(
        target, drafter, list(range(100, 110)), GenerationConfig(max_tokens=20, sampling=GREEDY), clock=clock
    )
    assert isinstance(done, Done) and list(done.tokens) == list(range(110, 130))
    notes = [e.round.note for e in events if e.round is not None]
    assert sum("draft model dropped" in n and "out of memory" in n for n in notes) == 1
    assert drafter.model is None


def test_an_implausible_curve_is_neither_kept_nor_used(tmp_path: Path) -> None:
    """A calibration timed in a busy spell (a batch of 2 'cheaper' than one token) must not poison later runs."""
    store = _store(tmp_path)
    store.save(CostModel(target={1: 0.030, 2: 0.007, 5: 0.1}, draft_token=0.002))
    assert store.load() is None and not store.path.exists()
    # A preempted small batch: T(3) far above T(16) (seen on a loaded machine).
    store.save(CostModel(target={1: 0.31, 2: 0.53, 3: 5.59, 4: 3.26, 16: 1.03, 33: 1.41}, draft_token=0.3))
    assert store.load() is None and not store.path.exists()
    store.save(CostModel(target={1: 0.030, 2: 0.054, 3: 0.07, 4: 0.069, 5: 0.1}, draft_token=0.019))  # noise: kept
    assert store.load() is not None
    store.save(CostModel(target={1: 0.030, 2: 0.054, 5: 0.1}, draft_token=0.019))
    data = json.loads(store.path.read_text(encoding="utf-8"))
    data["target_s"]["2"] = 0.007  # a file written by an older build, or by hand
    store.path.write_text(json.dumps(data), encoding="utf-8")
    assert store.load() is None
