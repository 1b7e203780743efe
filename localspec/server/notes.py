"""What a response says it did not do: the `warnings` list in its body (in a stream: the last chunk, or
Anthropic's message_delta), present only when there is something to say.

One rule for every request field localspec serve cannot honour (README, "Fields it cannot honour"):

- a field whose only effect is a hint about effort or quality (`reasoning_effort`, `output_config.effort`,
  `thinking` where the model cannot follow it, `thinking.budget_tokens`), or that asks for a server-side
  feature localspec does not have and whose absence leaves what the answer must contain as it was
  (`context_management`: the whole conversation is read instead, and one that does not fit is the usual
  400), is accepted, not acted on, and named in `warnings` (`not_acted_on`);
- a field that would change what the answer must contain or its form (`logit_bias`, penalties, `n` > 1,
  `logprobs`, legacy `functions`, `mcp_servers`, Anthropic's own tools, a strict tool whose schema the
  grammar cannot enforce, ...) is refused with a 400 naming it (requests.refuse_unhonoured and its
  neighbours, anthropic.refuse_unhonoured, tool_requests.function_spec).

A call to a tool whose schema has keywords the grammar left out (schema_fit) is checked against the whole
schema after generation, and so is any call whose arguments break its schema (auto's calls are free text
where no lazy grammar holds them): `call_warnings` says which and why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from localspec.decoding.schema_fit import argument_errors
from localspec.server.tools import ToolCall, ToolPlan


def not_acted_on(field: str, why: str) -> str:
    return f"{field}: accepted, not acted on ({why})"


def call_warnings(calls: Sequence[ToolCall], plan: ToolPlan | None) -> list[str]:
    """What the calls' arguments break of their tools' schemas, and for the tools whose schemas the grammar
    did not wholly enforce, that they were checked (valid or not)."""
    if plan is None or not plan.functions:
        return []
    specs = {f.name: f for f in plan.functions}
    out = []
    for i, call in enumerate(calls):
        spec = specs.get(call.name)
        if spec is None:
            continue
        label = f"call {i + 1} ({call.name})"
        try:
            args: Any = json.loads(call.arguments or "{}")
        except ValueError:
            out.append(f"{label}: the arguments are not complete JSON (cut short by max_tokens?)")
            continue
        errors = argument_errors(spec.given, args)
        if spec.unenforced:
            verdict = "valid" if not errors else "invalid: " + "; ".join(errors)
            out.append(f"{label}: the grammar does not enforce the schema's {', '.join(spec.unenforced)}; the "
                       f"arguments were checked after generation: {verdict}")  # fmt: skip
        elif errors:
            out.append(f"{label}: the arguments do not match the tool's schema: {'; '.join(errors)}")
    return out


def warnings_of(notes: Sequence[str], calls: Sequence[ToolCall], plan: ToolPlan | None) -> list[str]:
    """A response's warnings: the request's notes, then what its calls' checks found."""
    return [*notes, *call_warnings(calls, plan)]


def with_warnings(body: dict[str, Any], warnings: Sequence[str]) -> dict[str, Any]:
    """`body` with its `warnings` (none: the body as it was)."""
    if warnings:
        body["warnings"] = list(warnings)
    return body
