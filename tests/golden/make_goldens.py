"""Write the golden files of llama.cpp's own drafters: per round, the draft tokens that the vendored
`llama-speculative-simple` proposes on the tiny models of tests/golden_cases.py, greedy.

    benchmarks/build_llama_tools.sh            # once: builds the CPU tools from the sdist (30-60 min)
    python tests/golden/make_goldens.py [--case NAME ...] [--bin DIR]

tests/test_golden_drafters.py replays each round through localspec's drafter and asserts the same draft
tokens; CI needs only the JSON files written here, never a compiled llama.cpp.

How the drafts come out: with -v, common/speculative.cpp logs the top candidates of every draft step
(" - seq_id S, draft candidate C, pos I: TOKEN (P) 'piece'"; candidate 0 is the one drafted, since
--spec-draft-p-min 0 never stops a draft early), and speculative-simple logs every round's result
("accepted A/B draft tokens, the last target token is: (T)", B the tokens verified after the draft was
cut to what the budget allows). Each round's context is rebuilt from those: prompt, then per round the
A accepted drafts and T.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from golden_cases import CASES, GoldenCase, write_case  # noqa: E402

DEFAULT_BIN = Path("/work/tools/llama.cpp/build/bin")
_CANDIDATE = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(-?\d+) \(")
_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((-?\d+)\)")


@dataclass(frozen=True)
class Round:
    n_past: int  # tokens in the target's cache when the round drafted (all committed but the last)
    last: int  # the last committed token, fed first in the verify batch (llama.cpp's id_last)
    draft: list[int]  # what the head proposed, n_draft tokens
    n_verified: int  # the draft tokens verified (the draft cut to the round's budget)
    n_accepted: int
    next: int  # the target's token after the accepted drafts (the new id_last)


def parse_rounds(log: str, prompt: list[int]) -> list[Round]:
    """The rounds of a `llama-speculative-simple -v` log (its stderr)."""
    rounds: list[Round] = []
    steps: list[int] = []
    first = 0  # the position the round's first draft step is logged at
    n_past, last = len(prompt) - 1, prompt[-1]
    for line in log.splitlines():
        if m := _CANDIDATE.search(line):
            cand, pos, tok = int(m[1]), int(m[2]), int(m[3])
            if cand == 0:
                first = pos if not steps else first  # DSpark with a bonus anchor numbers its steps from 1
                if pos != first + len(steps) or first > 1:
                    raise ValueError(f"draft step {pos} logged after {len(steps)} steps: {line!r}")
                steps.append(tok)
        elif m := _ACCEPTED.search(line):
            accepted, verified, nxt = int(m[1]), int(m[2]), int(m[3])
            if verified > len(steps) or accepted > verified:
                raise ValueError(f"round with {len(steps)} draft steps logged as {line!r}")
            rounds.append(Round(n_past, last, steps, verified, accepted, nxt))
            n_past, last, steps = n_past + 1 + accepted, nxt, []
    if steps:
        raise ValueError("the log ends inside a round (the run was cut short?)")
    return rounds


def output_tokens(rounds: list[Round]) -> list[int]:
    out: list[int] = []
    for r in rounds:
        out += [*r.draft[: r.n_accepted], r.next]
    return out


def command(binary: Path, case: GoldenCase, files: dict[str, Path]) -> list[str]:
    cmd = [str(binary), "-m", str(files["target"])]
    if "draft" in files:
        cmd += ["-md", str(files["draft"])]
    return cmd + [
        "--spec-type", case.spec_type, "-p", case.prompt, "-n", str(case.n_predict),
        "--spec-draft-n-max", str(case.n_draft), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
        "--temp", "0", "--top-k", "1", "--seed", "0", "-c", str(case.n_ctx), "-t", "1", "-ngl", "0", "-v",
    ]  # fmt: skip


def prompt_tokens(target: Path, prompt: str) -> list[int]:
    """As speculative-simple tokenizes it: specials added and parsed (the same llama.cpp vocabulary code)."""
    from localspec.backends.llama import backend as lb

    backend = lb.load(target, n_ctx=64, threads=1)
    try:
        return backend.tokenize(prompt, add_special=True, parse_special=True)
    finally:
        backend.close()


def tool_version(binary: Path) -> str:
    run = subprocess.run([str(binary), "--version"], capture_output=True, text=True, errors="replace", timeout=60)
    return " ".join((run.stdout + run.stderr).split()[:8])


def make_golden(case: GoldenCase, binary: Path, tokenizer: Path) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        files, hashes = write_case(case, Path(tmp), tokenizer)
        prompt = prompt_tokens(files["target"], case.prompt)
        cmd = command(binary, case, files)
        run = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
        if run.returncode != 0:
            raise SystemExit(f"{case.name}: {binary.name} exited {run.returncode}:\n{run.stderr[-3000:]}")
        rounds = parse_rounds(run.stderr, prompt)
    if not rounds:
        raise SystemExit(f"{case.name}: no rounds in the log (no -v output?):\n{run.stderr[-3000:]}")
    short = [i for i, r in enumerate(rounds) if len(r.draft) != case.n_draft]
    if short:
        raise SystemExit(f"{case.name}: rounds {short} drafted fewer than {case.n_draft} tokens (p_min not 0?)")
    return {
        "case": case.name,
        "family": case.family,
        "spec_type": case.spec_type,
        "tool": tool_version(binary),
        "command": [Path(c).name if c in map(str, files.values()) else c for c in cmd[1:]],
        "sha256": hashes,
        "prompt": case.prompt,
        "prompt_tokens": prompt,
        "n_draft": case.n_draft,
        "n_predict": case.n_predict,
        "rounds": [asdict(r) for r in rounds],
        "output": output_tokens(rounds),
    }


def dump(golden: dict[str, object]) -> str:
    """JSON with one round per line: small diffs when a golden changes."""
    rounds = golden["rounds"]
    head = json.dumps({k: v for k, v in golden.items() if k not in ("rounds", "output")}, indent=1)[:-2]
    lines = ",\n  ".join(json.dumps(r) for r in rounds)  # type: ignore[attr-defined]
    return f'{head},\n "rounds": [\n  {lines}\n ],\n "output": {json.dumps(golden["output"])}\n}}\n'


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", action="append", choices=sorted(CASES), help="only these cases (default: all)")
    p.add_argument("--bin", type=Path, default=DEFAULT_BIN, help=f"llama.cpp's build/bin (default: {DEFAULT_BIN})")
    args = p.parse_args(argv)
    binary = args.bin / "llama-speculative-simple"
    if not binary.is_file():
        raise SystemExit(f"{binary} not found: build it with benchmarks/build_llama_tools.sh")
    from fixture_models import fetch

    tokenizer = fetch("smollm2-135m")
    for name in args.case or sorted(CASES):
        case = CASES[name]
        golden = make_golden(case, binary, tokenizer)
        case.golden_path.write_text(dump(golden), encoding="utf-8")
        rounds = golden["rounds"]
        accepted = sum(r["n_accepted"] for r in rounds)  # type: ignore[index, union-attr]
        print(f"{case.golden_path.name}: {len(rounds)} rounds, {accepted} drafts accepted")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
