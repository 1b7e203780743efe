"""Cross-check against llama.cpp's own drafters, greedy: per round, localspec's drafter proposes the same
draft tokens as the vendored `llama-speculative-simple --spec-type draft-...` did on the same tiny models.

The goldens (tests/golden/*.json) were written by tests/golden/make_goldens.py from the compiled tool;
here the models are written again with the same seeds (their SHA-256 must match the golden's) and each
round is replayed as llama.cpp ran it: the target holds every committed token but the last, the drafter
proposes, then the target verifies [last, llama.cpp's draft] in one batch and keeps what was accepted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from golden_cases import CASES, PENDING, GoldenCase, load_golden, write_case

from localspec.backends.llama import backend as lb
from localspec.backends.llama import ext as llama_ext
from localspec.pipeline import make_drafter
from localspec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def _case_or_skip(name: str) -> tuple[GoldenCase, dict]:  # type: ignore[type-arg]
    if name in PENDING:
        pytest.skip(f"{name}: {PENDING[name]}")
    case = CASES[name]
    golden = load_golden(case)
    if golden is None:
        pytest.skip(
            f"no {case.golden_path.name}: run tests/golden/make_goldens.py --case {name} (needs llama.cpp's tools)"
        )
    status = llama_ext.family_status(case.family)
    if not status.available:
        pytest.skip(f"localspec's {case.family} drafter cannot run here: {status.reason}")
    return case, golden


def _greedy_verdict(logits: np.ndarray, draft: list[int]) -> tuple[int, int]:
    """(drafts accepted, the target's next token) from the verify batch's logits, greedy."""
    for i, tok in enumerate(draft):
        best = int(np.argmax(logits[i]))
        if best != tok:
            return i, best
    return len(draft), int(np.argmax(logits[len(draft)]))


def replay_rounds(target, drafter, golden: dict, n_draft: int) -> list[list[int]]:  # type: ignore[no-untyped-def, type-arg]
    """The golden's rounds as llama.cpp ran them, with `drafter` proposing in each (its drafts, per round)."""
    prompt = golden["prompt_tokens"]
    target.forward(prompt[:-1], all_logits=False)
    drafter.prepare(prompt, n_draft)
    context = list(prompt)
    ours: list[list[int]] = []
    for r in golden["rounds"]:
        assert len(context) - 1 == r["n_past"] and context[-1] == r["last"]
        ours.append(drafter.propose(context, n_draft, GREEDY, np.random.default_rng(0)).tokens)
        verified = r["draft"][: r["n_verified"]]  # llama.cpp's draft: a mismatch here does not cascade
        logits = target.forward([r["last"], *verified], all_logits=True)
        assert _greedy_verdict(logits, verified) == (r["n_accepted"], r["next"])  # the target agrees too
        target.rollback(r["n_past"] + 1 + r["n_accepted"])
        context += [*verified[: r["n_accepted"]], r["next"]]
    assert len(ours) == len(golden["rounds"]) and context[len(prompt) :] == golden["output"]
    return ours


@pytest.mark.parametrize("name", [*CASES, *PENDING])
def test_drafts_per_round_equal_llama_cpp(name: str, smollm2_path: Path, tmp_path: Path) -> None:
    case, golden = _case_or_skip(name)
    files, hashes = write_case(case, tmp_path, smollm2_path)
    assert hashes == golden["sha256"], (
        "the tiny models differ from those the golden was made with (tests/gguf_factory.py or its seeds "
        "changed): rerun tests/golden/make_goldens.py"
    )
    target = lb.load(files["target"], n_ctx=case.n_ctx, threads=1, load_mtp=case.family == "mtp")
    head = str(files["draft"]) if "draft" in files else None
    drafter = make_drafter(case.family, target, None, head=head)
    try:
        assert target.tokenize(case.prompt, add_special=True, parse_special=True) == golden["prompt_tokens"]
        ours = replay_rounds(target, drafter, golden, case.n_draft)
    finally:
        drafter.close()
        target.close()
    theirs = [r["draft"] for r in golden["rounds"]]
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert not differ, f"rounds {differ} differ; first: localspec {ours[differ[0]]}, llama.cpp {theirs[differ[0]]}"


def test_the_log_parser_reads_rounds_as_speculative_simple_writes_them() -> None:
    """make_goldens.py's reading of the tool's -v log, on lines in the C++ format strings' shape."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "golden"))
    from make_goldens import Round, output_tokens, parse_rounds

    def cand(c: int, pos: int, tok: int) -> str:
        return f"spec        draft: - seq_id 0, draft candidate {c:3d}, pos {pos:3d}: {tok:6d} (   0.500) 'x'"

    log = "\n".join([
        "llama_context: n_ctx = 512",
        cand(0, 0, 11), cand(1, 0, 99), cand(0, 1, 12), cand(0, 2, 13),
        "accepted 1/2 draft tokens, the last target token is: (40)",
        cand(0, 0, 21), cand(2, 0, 98), cand(0, 1, 22), cand(0, 2, 23),
        "accepted 3/3 draft tokens, the last target token is: (50)",
    ])  # fmt: skip
    rounds = parse_rounds(log, [1, 2, 3])
    assert rounds == [Round(2, 3, [11, 12, 13], 2, 1, 40), Round(4, 40, [21, 22, 23], 3, 3, 50)]
    assert output_tokens(rounds) == [11, 40, 21, 22, 23, 50]
    with pytest.raises(ValueError, match="ends inside a round"):
        parse_rounds(log + "\n" + cand(0, 0, 5), [1, 2, 3])
    # DSpark with a bonus anchor logs its draft steps from block slot 1
    bonus = "\n".join([cand(0, 1, 11), cand(0, 2, 12), "accepted 0/2 draft tokens, the last target token is: (40)"])
    assert parse_rounds(bonus, [1, 2, 3]) == [Round(2, 3, [11, 12], 2, 0, 40)]
    with pytest.raises(ValueError, match="draft step 2 logged after 0 steps"):
        parse_rounds(cand(0, 2, 11), [1, 2, 3])
