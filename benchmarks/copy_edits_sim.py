"""Copy edits simulated: auto's lookup against plain decoding where the target writes a known edit of a file.

    python benchmarks/copy_edits_sim.py --tokenizer MODEL.gguf [--show hints|rename]

The file and its edited versions (type hints at every signature; two renames) are tokenized with the real
model's tokenizer (its merges decide where an edit's tokens begin and end); a scripted fake target writes
the edited file after a chat prompt that holds the original, at a CPU-like cost T(n) = T(1) (1 + 0.15 (n - 1))
on a fake clock, and auto (lookup only, that curve remembered) runs against `none`. Deterministic, so it
shows what a change to the suffix drafter or resync does to the rounds; a real target does not copy exactly,
so real speedups are lower (run `localspec bench` on a real pair for those).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fakes import CostedBackend, FakeClock, scripted_tokens  # noqa: E402

from localspec.backends.base import Backend  # noqa: E402
from localspec.backends.llama import backend as llama_cpp  # noqa: E402
from localspec.decoding.auto import AutoDrafter, auto_lookup  # noqa: E402
from localspec.decoding.drafters import Drafter, NoDrafter  # noqa: E402
from localspec.decoding.engine import Done, GenerationConfig, generate  # noqa: E402
from localspec.decoding.policy import CostModel  # noqa: E402
from localspec.decoding.stats import RoundStats  # noqa: E402
from localspec.decoding.suffix_memory import SuffixMemory  # noqa: E402
from localspec.sampling import SamplingParams  # noqa: E402

SOURCE = """import csv
from pathlib import Path


def read_rows(path, delimiter):
    with open(path, newline="") as handle:
        return list(csv.reader(handle, delimiter=delimiter))


def column(rows, index):
    return [row[index] for row in rows if len(row) > index]


def parse_amounts(values, default):
    out = []
    for value in values:
        try:
            out.append(float(value))
        except ValueError:
            out.append(default)
    return out


def total(amounts, limit):
    kept = [a for a in amounts if a <= limit]
    return sum(kept), len(kept)


def write_summary(path, name, count, amount):
    Path(path).write_text(f"{name}: {count} rows, {amount:.2f} total\\n")


def main(source, target, limit):
    rows = read_rows(source, ",")
    amounts = parse_amounts(column(rows, 2), 0.0)
    amount, count = total(amounts, limit)
    write_summary(target, "orders", count, amount)
"""
HINTS = {
    "read_rows(path, delimiter):": "read_rows(path: str, delimiter: str) -> list[list[str]]:",
    "column(rows, index):": "column(rows: list[list[str]], index: int) -> list[str]:",
    "parse_amounts(values, default):": "parse_amounts(values: list[str], default: float) -> list[float]:",
    "total(amounts, limit):": "total(amounts: list[float], limit: float) -> tuple[float, int]:",
    "write_summary(path, name, count, amount):": "write_summary(path: str, name: str, count: int, amount: float) -> None:",
    "main(source, target, limit):": "main(source: str, target: str, limit: float) -> None:",
}
RENAMES = {"amount": "value_sum", "rows": "records"}
EDITS = {
    "hints": ("Add type hints to every function.", lambda s: _replace_all(s, HINTS)),
    "rename": ("Rename `amount` to `value_sum` and `rows` to `records`.", lambda s: _rename(s, RENAMES)),
}


def _replace_all(text: str, pairs: dict[str, str]) -> str:
    for old, new in pairs.items():
        text = text.replace("def " + old, "def " + new)
    return text


def _rename(text: str, pairs: dict[str, str]) -> str:
    for old, new in pairs.items():
        text = re.sub(rf"\b{old}\b", new, text)
    return text


def cost(n: int) -> float:
    return 0.033 * (1 + 0.15 * (n - 1))


def replay(
    prompt: list[int],
    answer: list[int],
    cost: Callable[[int], float],
    costs: CostModel | None,
    method: str,
    tok: llama_cpp.LlamaCppBackend,
    text: bool = True,
    memory: SuffixMemory | None = None,
) -> tuple[float, list[RoundStats]]:
    """A scripted target writes `answer` after `prompt` at `cost`(n) a pass on a fake clock; `none`, or auto's
    lookup from `costs` (with the tokenizer's byte resync where `text`, and `memory`'s earlier answers):
    (decode seconds, the rounds)."""
    clock = FakeClock()
    vocab = tok.n_vocab
    fn = scripted_tokens(prompt + answer, n_vocab=vocab)
    target = CostedBackend(fn, clock, cost, name="target", n_vocab=vocab, eog=frozenset({vocab - 1}))
    drafter: Drafter = (
        NoDrafter()
        if method == "none"
        else AutoDrafter(
            ngram=auto_lookup(memory, target=tok if text else None), target=target, clock=clock, costs=costs
        )
    )
    config = GenerationConfig(
        max_tokens=len(answer), num_draft=0 if method == "none" else 32, sampling=SamplingParams()
    )
    rounds: list[RoundStats] = []
    done = None
    for event in generate(target, drafter, prompt, config, clock=clock):
        if isinstance(event, Done):
            done = event
        elif event.round is not None:
            rounds.append(event.round)
    assert done is not None and list(done.tokens) == answer
    return done.stats.decode_s, rounds


def report(
    name: str, answer: list[int], plain: float, auto: float, rounds: list[RoundStats], show: bool, tok: Backend
) -> None:
    """auto's speed against plain, what it drafted, and with `show` each round's text."""
    drafted, accepted = sum(r.n_drafted for r in rounds), sum(r.n_accepted for r in rounds)
    print(f"{name}: {len(answer)} tokens, auto {plain / auto:.3f}x plain; {len(rounds)} rounds, "
          f"{drafted} drafted, {accepted} accepted")  # fmt: skip
    at = 0
    for r in rounds if show else ():
        text = tok.detokenizer().add(answer[at : at + r.n_emitted])
        print(f"  {at:4d} drafted {r.n_drafted:2d} accepted {r.n_accepted:2d} {r.note[:70]:70} | {text!r}")
        at += r.n_emitted


def simulate(
    tok: llama_cpp.LlamaCppBackend, kind: str, method: str, text: bool = True
) -> tuple[float, list[RoundStats], list[int]]:
    """(decode seconds on the fake clock, the rounds, the answer's tokens)."""
    ask, edit = EDITS[kind]
    chat = f"<|im_start|>user\nHere is report.py:\n```python\n{SOURCE}```\n{ask} Reply with the whole file only."
    prompt = tok.tokenize(chat + "<|im_end|>\n<|im_start|>assistant\n```python\n", add_special=False)
    answer = tok.tokenize(edit(SOURCE) + "```", add_special=False, parse_special=False)
    curve = CostModel(target={n: cost(n) for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 33)})
    seconds, rounds = replay(prompt, answer, cost, curve, method, tok, text)
    return seconds, rounds, answer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="a GGUF whose tokenizer to use (its weights are not run)")
    ap.add_argument("--show", choices=sorted(EDITS), help="print that edit's rounds")
    ap.add_argument("--tokens", action="store_true", help="resync token by token (no tokenizer), as before bytes")
    args = ap.parse_args()
    tok = llama_cpp.load(args.tokenizer, n_ctx=256, threads=1)
    try:
        for kind in EDITS:
            plain, _, answer = simulate(tok, kind, "none")
            auto, rounds, _ = simulate(tok, kind, "auto", not args.tokens)
            report(kind, answer, plain, auto, rounds, args.show == kind, tok)
    finally:
        tok.close()


if __name__ == "__main__":
    main()
