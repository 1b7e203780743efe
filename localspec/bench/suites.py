"""Built-in prompt suites: the kinds of work where speculation wins or loses differently.

- code-gen: write new code (model drafts can match, n-gram rarely has anything to copy)
- code-edit: change given code and repeat it whole (n-gram lookup copies long runs)
- chat: prose answers (varied wording: the hardest case for any draft)
- long-summary: summarize a ~1,100-token document (long context: attention costs more per token)
- agentic: multi-turn sessions that edit and re-emit files shown earlier (docstrings, renames, a fix
  from a failing test's output); each conversation runs as one session, so a drafter that keeps a
  session index (suffix) sees the earlier turns
- structured: answers held to a JSON schema by the grammar (an API response, records from CSV, a tool
  call's arguments: localspec.bench.structured); bench adds the grammar's time per token
- agent-long: a coding agent's 8.7k-token prompt (system prompt, tool schemas, files read through tools,
  a failing test, an edit request: localspec.bench.agent_transcript), answered with a whole file

The cases (opt-in, `--suites cases`) keep auto's tax and the suffix memory's gain apart, so that neither
hides in a repeated run: code-gen and code-edit with auto's costs cold (no remembered curve: every run
learns from its own rounds, as the first run of an install) and warm (the curve bench measured on the
suite, remembered), never with a suffix memory (every prompt is new to every run); and `memory`, the chat
questions asked again in a new session: each answered once into a fresh suffix memory (not measured), then
auto with that memory against auto without it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from typing import Literal

from localspec.backends.base import ChatMessage
from localspec.bench.agent_transcript import agent_messages
from localspec.bench.structured import structured_prompts
from localspec.decoding.grammar import GrammarSpec

_EDIT_SOURCE = """def load_orders(path):
    data = []
    with open(path) as f:
        header = f.readline().strip().split(",")
        for line in f:
            fields = line.strip().split(",")
            if len(fields) != len(header):
                continue
            row = dict(zip(header, fields))
            row["quantity"] = int(row["quantity"])
            row["price"] = float(row["price"])
            data.append(row)
    return data


def total_by_customer(data):
    totals = {}
    for row in data:
        customer = row["customer"]
        totals[customer] = totals.get(customer, 0.0) + row["quantity"] * row["price"]
    return totals


def top_customers(data, n=3):
    totals = total_by_customer(data)
    ranked = sorted(totals.items(), key=lambda item: item[1], reverse=True)
    return ranked[:n]
"""

_EDIT_SOURCE_2 = """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        have = self.items.get(name, 0)
        if count > have:
            raise ValueError(f"only {have} of {name} in stock")
        self.items[name] = have - count
        if self.items[name] == 0:
            del self.items[name]

    def report(self):
        lines = []
        for name in sorted(self.items):
            lines.append(f"{name}: {self.items[name]}")
        return "\\n".join(lines)
"""


_TEST_OUTPUT = """$ pytest -q test_orders.py
F.                                                                  [100%]
=================================== FAILURES ===================================
_________________________ test_top_customers_skips_zero ________________________

    def test_top_customers_skips_zero():
        rows = [{"customer": "ann", "quantity": 0, "price": 2.0}]
>       assert top_customers(rows) == []
E       AssertionError: assert [('ann', 0.0)] == []

test_orders.py:12: AssertionError
1 failed, 1 passed in 0.03s
"""


@dataclass(frozen=True)
class Suite:
    """Prompts of one kind. A session suite's prompts are conversation scripts: each message is one user
    turn, answered by the model before the next (the answers join the history), all with one drafter."""

    name: str
    description: str
    prompts: tuple[tuple[ChatMessage, ...], ...]
    session: bool = False
    grammars: tuple[GrammarSpec, ...] = ()  # one per prompt: the answer held to it (empty: unconstrained)
    # auto's remembered costs: this machine's cache ("user"), none (a fresh cache for every run: "cold"), or a
    # fresh cache holding the curve bench measured on the suite ("warm")
    costs: Literal["user", "cold", "warm"] = "user"
    again: bool = False  # each prompt answered once into a fresh suffix memory first; auto runs with it and without

    def grammar(self, prompt: int) -> GrammarSpec | None:
        return self.grammars[prompt] if self.grammars else None


def _user(text: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage("user", text),)


def long_document() -> str:
    return resources.files("localspec.bench").joinpath("long_context.txt").read_text(encoding="utf-8")


CASES = ("code-gen-cold", "code-gen-warm", "code-edit-cold", "code-edit-warm", "memory")  # `--suites cases`
# Not in `--suites all`: agent-long's prompt needs --n-ctx 10240 or more, and minutes on a CPU; the cases repeat
# suites of `all` under other conditions.
OPT_IN = ("agent-long", *CASES)


def suites() -> dict[str, Suite]:
    doc = long_document()
    all_suites = [
        Suite(
            "code-gen",
            "write new code from a description",
            (
                _user(
                    "Write a Python function `parse_duration(text: str) -> int` that converts strings like "
                    "'1h30m', '45s' or '2h 5m 10s' into seconds, raising ValueError on bad input. "
                    "Include a docstring and type hints, then a few example calls."
                ),
                _user(
                    "Write a Python class `LRUCache` with `get(key)` and `put(key, value)` methods and a fixed "
                    "capacity, using collections.OrderedDict. Add docstrings and a short usage example."
                ),
            ),
        ),
        Suite(
            "code-edit",
            "edit given code and repeat it whole (text that repeats its input)",
            (
                _user(
                    "Change `top_customers` so that it skips customers whose total is zero. Reply with the "
                    "complete updated code only, no explanation.\n\n"
                    f"```python\n{_EDIT_SOURCE}```"
                ),
                _user(
                    "Add a method `count(self, name)` that returns how many of `name` are in stock (0 if none) "
                    "to this class. Reply with the complete updated class only, no explanation.\n\n"
                    f"```python\n{_EDIT_SOURCE_2}```"
                ),
            ),
        ),
        Suite(
            "chat",
            "prose answers to open questions",
            (
                _user("Explain to someone new to programming why version control matters, in three short paragraphs."),
                _user("What are good habits for staying focused while working from home? Answer in a few paragraphs."),
            ),
        ),
        Suite(
            "agentic",
            "multi-turn sessions that edit and re-emit files shown earlier",
            (
                (
                    ChatMessage(
                        "user",
                        "Here is orders.py:\n\n"
                        f"```python\n{_EDIT_SOURCE}```\n\n"
                        "Add a one-line docstring to every function. Reply with the whole file only.",
                    ),
                    ChatMessage(
                        "user",
                        "Rename the variable `data` to `rows` everywhere in orders.py. Reply with the whole file only.",
                    ),
                    ChatMessage(
                        "user",
                        f"The tests fail:\n\n```\n{_TEST_OUTPUT}```\n\nFix orders.py so they pass. Reply with the whole file only.",
                    ),
                ),
                (
                    ChatMessage(
                        "user",
                        "Here is inventory.py:\n\n"
                        f"```python\n{_EDIT_SOURCE_2}```\n\n"
                        "Make `remove` raise KeyError for a name that is not in stock. Reply with the whole file only.",
                    ),
                    ChatMessage(
                        "user",
                        "Rename the class to `Stock` and the attribute `items` to `counts`. Reply with the whole file only.",
                    ),
                    ChatMessage("user", "Add type hints to every method. Reply with the whole file only."),
                ),
            ),
            session=True,
        ),
        Suite(
            "structured",
            "answers held to a JSON schema (API response, records from CSV, tool-call arguments)",
            tuple(p.messages for p in structured_prompts()),
            grammars=tuple(p.grammar for p in structured_prompts()),
        ),
        Suite(
            "agent-long",
            "a coding agent's 8.7k-token prompt (tools, files, test output) and a whole-file edit",
            (agent_messages(),),
        ),
        Suite(
            "long-summary",
            "summarize a ~1,100-token document (long context)",
            (
                _user(f"{doc}\n\nSummarize the report above in five bullet points, with the key numbers."),
                _user(f"{doc}\n\nWhat did the committee recommend, and why? Answer in one paragraph."),
            ),
        ),
    ]
    by_name = {s.name: s for s in all_suites}
    return by_name | {s.name: s for s in _cases(by_name)}


def _cases(by_name: dict[str, Suite]) -> list[Suite]:
    """The suites of CASES, from the suites they repeat."""
    out = []
    for base in ("code-gen", "code-edit"):
        suite = by_name[base]
        kinds: tuple[Literal["cold", "warm"], ...] = ("cold", "warm")
        for costs in kinds:
            what = "no remembered costs: each run learns them" if costs == "cold" else "the measured costs remembered"
            out.append(replace(suite, name=f"{base}-{costs}", description=f"{suite.description}; {what}", costs=costs))
    chat = by_name["chat"]
    again = "a question asked again in a new session: auto with the suffix memory of its first answer, and without"
    out.append(replace(chat, name="memory", description=again, again=True))
    return out
