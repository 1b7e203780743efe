"""The suffix memory: bounded, least recently used out, deduplicated, safe with damaged files and two writers,
off when asked, cleared by its command; and a repeated task drafting from its first round in a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from localspec.cli import build_parser, main
from localspec.decoding.suffix import SuffixDrafter
from localspec.decoding.suffix_memory import SuffixMemory, SuffixMemoryWarning, decode, list_docs, memory_root
from localspec.options import model_options
from localspec.vocab import VocabInfo

VOCAB = VocabInfo("gpt2", 1000, None, 0, False, False, [f"t{i}" for i in range(1000)])
OTHER_VOCAB = VocabInfo("gpt2", 1000, None, 0, False, False, [f"u{i}" for i in range(1000)])


def memory(root: Path, max_tokens: int = 10_000, vocab: VocabInfo = VOCAB) -> SuffixMemory:
    return SuffixMemory(lambda: vocab, root=root, max_tokens=max_tokens)


def text(rng: np.random.Generator, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, 1000, n)]


def stored(mem: SuffixMemory) -> list[list[int]]:
    return [t.tolist() for _, t in mem.documents(fresh=True)]


def test_store_stays_under_its_bound_after_100_sessions(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    files = [text(rng, 150) for _ in range(5)]
    mem = memory(tmp_path, max_tokens=3_000)
    chat: list[int] = []
    for i in range(100):
        if i % 3 == 0:  # a chat that goes on: each turn extends the last
            chat = [*chat, *text(rng, 40)]
            mem.remember(chat)
        else:
            mem.remember([*files[i % 5], *text(rng, 60)])
        docs = list_docs(mem.path)
        assert sum(d.n_tokens for d in docs) <= 3_000
    for d in list_docs(mem.path):  # every file reads back whole
        assert decode((mem.path / d.name).read_bytes()) is not None
    chats = [t for t in stored(mem) if t[:40] == chat[:40]]
    assert chats == [chat]  # the chat's turns replaced each other: one copy, the longest


def test_least_recently_used_goes_first_and_a_document_seen_again_stays(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a, b, c, d = (text(rng, 100) for _ in range(4))
    mem = memory(tmp_path, max_tokens=300)
    for doc in (a, b, c):
        mem.remember(doc)
    mem.remember(a[:60])  # a beginning of `a` seen again: not stored twice, `a` refreshed
    assert len(list_docs(mem.path)) == 3
    mem.remember(d)
    assert sorted(stored(mem)) == sorted([a, c, d])  # b was the least recently used
    mem.remember(c)
    mem.remember(b)
    assert sorted(stored(mem)) == sorted([b, c, d])  # a: refreshed before d was added, c after


def test_a_damaged_file_is_skipped_with_a_warning_and_removed(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    good, bad = text(rng, 80), text(rng, 80)
    mem = memory(tmp_path)
    mem.remember(good)
    bad_name = mem.remember(bad)
    assert bad_name is not None
    path = mem.path / bad_name
    path.write_bytes(path.read_bytes()[:50])  # cut short, as a full disk would leave it
    (mem.path / "garbage-77.tok").write_bytes(b"not a document at all")
    fresh = memory(tmp_path)
    with pytest.warns(SuffixMemoryWarning, match="damaged"):
        docs = fresh.documents()
    assert [t.tolist() for _, t in docs] == [good]
    drafter = SuffixDrafter(memory=memory(tmp_path))
    with pytest.warns(SuffixMemoryWarning):
        drafter.prepare([*good[:40], 1, 2, 3], 8)  # a drafter survives it too
    fresh.remember(text(rng, 50))  # the next change removes what did not read back
    assert not path.exists() and not (mem.path / "garbage-77.tok").exists()


def test_another_tokenizer_never_sees_the_documents(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    memory(tmp_path).remember(text(rng, 50))
    other = memory(tmp_path, vocab=OTHER_VOCAB)
    assert other.path != memory(tmp_path).path and other.documents() == []


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from pathlib import Path
    from localspec.decoding.suffix_memory import SuffixMemory
    from localspec.vocab import VocabInfo
    vocab = VocabInfo("gpt2", 1000, None, 0, False, False, [f"t{i}" for i in range(1000)])
    mem = SuffixMemory(lambda: vocab, root=Path(sys.argv[1]), max_tokens=2000)
    rng = np.random.default_rng(int(sys.argv[2]))
    shared = rng.integers(0, 1000, 100)
    for i in range(40):
        assert mem.remember(np.concatenate([shared, rng.integers(0, 1000, 60)])) is not None
""")


def test_two_processes_writing_keep_the_store_whole_and_bounded(tmp_path: Path) -> None:
    command = [sys.executable, "-c", WRITER, str(tmp_path)]
    procs = [subprocess.Popen([*command, str(seed)], stderr=subprocess.PIPE, text=True) for seed in (10, 11)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    mem = memory(tmp_path)
    docs = list_docs(mem.path)
    assert docs and sum(d.n_tokens for d in docs) <= 2000
    for d in docs:
        assert decode((mem.path / d.name).read_bytes()) is not None
    assert not list(mem.path.glob("*.tmp"))


def test_a_drafter_drafts_a_repeated_task_from_its_first_round(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    prompt, answer = text(rng, 200), text(rng, 100)
    first = memory(tmp_path)
    d1 = SuffixDrafter(memory=first)
    d1.prepare(prompt, 16)
    assert d1.lookup([*prompt, answer[0]], 16).tokens == []  # nothing to copy yet
    first.end_of_answer([*prompt, *answer])  # what the pipeline does when the answer ends
    d2 = SuffixDrafter(memory=memory(tmp_path))  # a new process
    d2.prepare(prompt, 16)
    assert d2.lookup([*prompt, answer[0]], 16).tokens == answer[1:17]


def test_only_a_generation_a_drafter_claimed_is_remembered(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    mem = memory(tmp_path)
    mem.release()
    mem.end_of_answer(text(rng, 100))  # e.g. a request drafted by a model: not the memory's
    assert list_docs(mem.path) == []


def _args(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(list(argv))


def test_run_chat_serve_remember_by_default_bench_and_doctor_do_not() -> None:
    for cmd in ("run", "chat", "serve"):
        extra = ["hi"] if cmd == "run" else []
        assert model_options(_args(cmd, *extra, "--target", "t.gguf")).suffix_memory
        assert not model_options(_args(cmd, *extra, "--target", "t.gguf", "--no-suffix-memory")).suffix_memory
    assert not model_options(_args("bench", "--target", "t.gguf")).suffix_memory
    assert model_options(_args("bench", "--target", "t.gguf", "--suffix-memory")).suffix_memory
    assert not model_options(_args("doctor", "--target", "t.gguf")).suffix_memory


def test_environment_variable_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_SUFFIX_MEMORY", "0")
    assert SuffixMemory.open(lambda: VOCAB) is None
    monkeypatch.setenv("LOCALSPEC_SUFFIX_MEMORY", "1")
    assert SuffixMemory.open(lambda: VOCAB) is not None


def _run(target: Path, prompt: str, *flags: str, env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    r = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", prompt, "--target", str(target), "--draft-method", "suffix",
         "--max-tokens", "48", "--json", *flags],
        capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_opt_out_flag_and_variable_write_nothing_and_clear_empties_it(  # type: ignore[no-untyped-def]
    tiny_ggufs, capsys
) -> None:
    target = tiny_ggufs[0]
    root = memory_root()
    _run(target, "Say hello", "--no-suffix-memory")
    _run(target, "Say hello", env={"LOCALSPEC_SUFFIX_MEMORY": "0"})
    assert not root.exists() or not any(root.rglob("*.tok"))
    _run(target, "Say hello")
    assert len(list(root.rglob("*.tok"))) == 1
    assert main(["memory", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["path"] == str(root) and shown["tokenizers"][0]["documents"] == 1
    assert main(["memory", "clear"]) == 0
    assert "1 documents" in capsys.readouterr().out
    assert not any(root.rglob("*.tok"))


def test_a_second_process_drafts_a_repeated_code_edit_from_its_first_rounds(qwen_pair: tuple[Path, Path]) -> None:
    prompt = (
        "Rename the function `area` to `compute_area` and return the whole file.\n\n```python\nimport math\n\n\n"
        "def area(r):\n    return math.pi * r * r\n\n\ndef total(rs):\n    return sum(area(r) for r in rs)\n```"
    )
    first = _run(qwen_pair[1], prompt)
    second = _run(qwen_pair[1], prompt)
    assert first["text"] == second["text"]  # greedy: the same answer, drafted or not
    early = 3
    first_early = sum(r["n_accepted"] for r in first["rounds"][:early])  # copies of the prompt's code, at best
    second_early = sum(r["n_accepted"] for r in second["rounds"][:early])
    assert second_early >= 10 and second_early > first_early  # yesterday's answer, edit and all, from round one
    assert second["stats"]["n_rounds"] < first["stats"]["n_rounds"]
