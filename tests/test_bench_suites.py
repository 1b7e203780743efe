"""bench's long agent suite: deterministic, over 8,000 tokens through a real chat template, and real code in it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

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
