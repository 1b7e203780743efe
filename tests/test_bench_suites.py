"""bench's long agent suite (deterministic, over 8,000 tokens through a real chat template, real code in it) and its
structured suite (answers held to JSON schemas, the grammar's cost reported)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from localspec.bench.agent_transcript import agent_messages, models_module, report_module
from localspec.bench.suites import OPT_IN, suites


def test_the_agent_prompt_is_the_same_every_time_and_carries_real_files() -> None:
    assert agent_messages() == agent_messages()
    system, user = agent_messages()
    assert system.role == "system" and user.role == "user"
    ast.parse(models_module())  # the files the agent read are Python that parses
    ast.parse(report_module())
    assert report_module() in user.content and models_module() in user.content
    text, names, at = system.content.split("You may call these functions:\n\n")[1], [], 0
    while at < len(text):  # the tool schemas: JSON objects one after the other
        schema, at = json.JSONDecoder().raw_decode(text, at)
        names.append(schema["function"]["name"])
        at += 1
    assert len(names) == 8 and {"read_file", "edit_file", "run_tests"} <= set(names)
    assert user.content.rstrip().endswith("reply with the complete updated report.py only.")
    assert suites()["agent-long"].prompts == (agent_messages(),) and "agent-long" in OPT_IN


def test_the_agent_prompt_is_over_8k_tokens_through_the_chat_template(smollm2_path: Path) -> None:
    from localspec.options import ModelOptions
    from localspec.pipeline import load_pipeline

    pipe = load_pipeline(ModelOptions(target=str(smollm2_path), draft_method="none", n_ctx=512, threads=1))
    try:
        tokens = pipe.prompt_tokens(list(agent_messages()))
    finally:
        pipe.close()
    assert 8_000 < len(tokens) < 12_000


# -- the structured suite: answers held to a JSON schema --------------------------------------------------


def test_the_structured_schemas_compile_and_show_in_their_prompts() -> None:
    from localspec.bench.structured import structured_prompts
    from localspec.decoding import grammar

    prompts = structured_prompts()
    assert [p.name for p in prompts] == ["api-response", "records", "tool-arguments"]
    for p in prompts:
        grammar.check(p.grammar)  # llguidance takes every keyword they use
        assert json.dumps(p.schema) in "\n".join(m.content for m in p.messages)  # the model is shown the schema
    s = suites()["structured"]
    assert s.prompts == tuple(p.messages for p in prompts) and s.grammars == tuple(p.grammar for p in prompts)


def test_structured_suite_answers_match_their_schemas_and_report_the_grammar_cost(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jsonschema

    from localspec.bench import measure
    from localspec.bench.report import bench_lines
    from localspec.bench.structured import structured_prompts
    from localspec.options import ModelOptions
    from localspec.pipeline import load_pipeline
    from localspec.sampling import SamplingParams

    answers: list[tuple[str, str]] = []  # (method, text) in run order
    one_run = measure._one_run

    def keep_text(pipeline, drafter, prompt, config):  # type: ignore[no-untyped-def]
        run, text = one_run(pipeline, drafter, prompt, config)
        answers.append((run.stats.draft_method, text))
        return run, text

    monkeypatch.setattr(measure, "_one_run", keep_text)
    pipe = load_pipeline(ModelOptions(target=str(smollm2_path), draft_method="none", n_ctx=2048, threads=2))
    try:
        # Every string, array and number in the schemas is bounded: the grammar closes the answer well within 1024.
        result = measure.run_bench(pipe, [suites()["structured"]], measure.parse_methods("none,ngram:4", has_draft=False),
                                   reps=1, max_tokens=1024, sampling=SamplingParams(), cost_reps=1)  # fmt: skip
    finally:
        pipe.close()
    schemas = [p.schema for p in structured_prompts()]
    assert [r.prompt for r in result.runs] == [0, 0, 1, 1, 2, 2] and len(answers) == 6
    for run, (_, text) in zip(result.runs, answers):
        assert run.stats.stop_reason == "eog", text
        jsonschema.validate(json.loads(text), schemas[run.prompt])
        # One mask per verified row, plus the prompt pass's: at least one per generated token.
        assert run.stats.grammar_masks >= run.stats.n_generated and run.stats.grammar_s > 0
    rows = {r.method: r for r in measure.summarize(result)}
    assert rows["ngram k=4"].acceptance and rows["ngram k=4"].acceptance > 0  # JSON's repeated keys are found
    assert all(r.grammar_ms is not None and r.grammar_ms > 0 for r in rows.values())
    text = "\n".join(bench_lines(result))
    assert "grammar/tok" in text and f"{rows['none'].grammar_ms:.2f}ms" in text
