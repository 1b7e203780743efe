"""A coding agent's long prompt, built deterministically: what agents send a local server (5-30k tokens).

A system prompt with the agent's rules, the JSON schemas of its tools, then one user turn carrying the
task, the transcript of the tool calls made so far with their results (a directory listing, two source
files and a test file read whole, a grep, a failing test run) and the edit request: change one function
and reply with the whole updated file. 8,659 tokens of text with the Qwen2.5 tokenizer (9,909 SmolLM2's,
10,323 Gemma 3's), plus the chat template's: the answer runs at a context where attention costs more per
token than in the short suites (tests/test_bench_suites.py keeps it over 8,000).

Nothing random: the same text every time (the module's files are generated from fixed tables).
"""

from __future__ import annotations

import json

from localspec.backends.base import ChatMessage

_RULES = """You are a coding agent working in a Python repository on the user's machine. You act through \
tools: read files before you change them, keep every change small and focused, run the tests after each \
edit, and never invent file contents you have not read. Follow the repository's style (type hints, short \
docstrings, dataclasses for values, no global state). When you are asked for a whole file, reply with the \
complete file in one fenced code block and nothing else: no explanation before or after, no elided parts, \
no "rest unchanged" comments. Keep names, order and comments of everything you were not asked to change \
exactly as they are: the user's tooling diffs your answer against the file on disk."""

_TOOLS = [
    (
        "read_file",
        "Read a text file of the repository, whole or a line range.",
        {
            "path": ("string", "path relative to the repository root"),
            "start_line": ("integer", "first line to read (1-based), optional"),
            "end_line": ("integer", "last line to read (inclusive), optional"),
        },
    ),
    (
        "write_file",
        "Create or overwrite a file with the given content.",
        {"path": ("string", "path relative to the repository root"), "content": ("string", "the complete new content")},
    ),
    (
        "edit_file",
        "Replace an exact, unique snippet of a file with new text.",
        {
            "path": ("string", "path relative to the repository root"),
            "old_text": ("string", "the exact text to replace; must occur once"),
            "new_text": ("string", "the replacement text"),
        },
    ),
    (
        "list_dir",
        "List a directory's entries with their sizes.",
        {
            "path": ("string", "directory relative to the repository root"),
            "recursive": ("boolean", "descend into subdirectories"),
        },
    ),
    (
        "grep",
        "Search the repository for a regular expression; returns matching lines with file and line number.",
        {
            "pattern": ("string", "a Python regular expression"),
            "path": ("string", "directory or file to search, optional"),
            "max_results": ("integer", "stop after this many matches"),
        },
    ),
    (
        "run_tests",
        "Run pytest on the given paths and return its output.",
        {
            "paths": ("array", "test files or directories"),
            "keyword": ("string", "only tests matching this -k expression"),
        },
    ),
    (
        "bash",
        "Run a shell command in the repository root (no network) and return stdout, stderr and the exit code.",
        {"command": ("string", "the command line"), "timeout_s": ("integer", "seconds before it is killed")},
    ),
    (
        "git_diff",
        "Show the working tree's changes against HEAD.",
        {"paths": ("array", "limit to these paths, optional")},
    ),
]

_ENTITIES = ["order", "customer", "invoice", "shipment", "product", "supplier", "payment", "refund", "warehouse",
             "discount", "review", "subscription", "carrier", "coupon", "ledger", "account"]  # fmt: skip
_FIELDS = ["id", "name", "created", "status", "amount", "currency", "region", "note"]


def _schema(name: str, description: str, params: dict[str, tuple[str, str]]) -> dict[str, object]:
    props: dict[str, object] = {}
    for p, (kind, desc) in params.items():
        props[p] = {"type": kind, "description": desc} | ({"items": {"type": "string"}} if kind == "array" else {})
    required = [p for p, (_, desc) in params.items() if "optional" not in desc]
    parameters = {"type": "object", "properties": props, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _entity_code(entity: str, i: int) -> str:
    cls = entity.capitalize()
    fields = _FIELDS[: 4 + i % 5]
    lines = [
        "@dataclass(frozen=True)",
        f"class {cls}:",
        f'    """One {entity} as stored in the {entity}s table."""',
        "",
        *[f"    {f}: {'float' if f == 'amount' else 'int' if f == 'id' else 'str'}" for f in fields],
        "",
        "",
        f"def parse_{entity}(row: dict[str, str]) -> {cls}:",
        f'    """A {entity} from one CSV row; raises ValueError on a missing or malformed field."""',
        "    try:",
        f"        return {cls}(",
        *[
            f'            {f}={"float" if f == "amount" else "int" if f == "id" else "str"}(row["{f}"]),'
            for f in fields
        ],  # fmt: skip
        "        )",
        "    except (KeyError, ValueError) as e:",
        f'        raise ValueError(f"bad {entity} row {{row!r}}: {{e}}") from None',
        "",
        "",
        f"def load_{entity}s(path: Path) -> list[{cls}]:",
        f'    """Every {entity} in a CSV file, in file order; rows that fail to parse are logged and skipped."""',
        f"    out: list[{cls}] = []",
        '    with path.open(newline="", encoding="utf-8") as f:',
        "        for n, row in enumerate(csv.DictReader(f), start=2):",
        "            try:",
        f"                out.append(parse_{entity}(row))",
        "            except ValueError as e:",
        '                log.warning("%s:%d: %s", path, n, e)',
        "    return out",
        "",
        "",
        f"def {entity}s_by_{fields[-1]}(items: list[{cls}]) -> dict[str, list[{cls}]]:",
        f'    """{cls}s grouped by {fields[-1]}, each group in input order."""',
        f"    groups: dict[str, list[{cls}]] = {{}}",
        "    for item in items:",
        f"        groups.setdefault(str(item.{fields[-1]}), []).append(item)",
        "    return groups",
        "",
        "",
    ]
    return "\n".join(lines)


def models_module() -> str:
    """records.py: a dataclass, a parser, a loader and a grouping per entity (about 4,000 tokens)."""
    head = ['"""The records the reporting jobs read: one dataclass per table, parsed from CSV exports."""', "",
            "from __future__ import annotations", "", "import csv", "import logging",
            "from dataclasses import dataclass", "from pathlib import Path", "",
            "log = logging.getLogger(__name__)", "", ""]  # fmt: skip
    return "\n".join(head) + "".join(_entity_code(e, i) for i, e in enumerate(_ENTITIES))


def report_module() -> str:
    """report.py: the file the agent is asked to edit (about 1,000 tokens)."""
    parts = ['"""Monthly totals for the finance team, from the records module."""', "",
             "from __future__ import annotations", "", "from collections import defaultdict",
             "from pathlib import Path", "",
             "from records import load_invoices, load_orders, load_payments, load_refunds", "", ""]  # fmt: skip
    for entity in ("order", "invoice", "payment", "refund"):
        parts += [
            f"def monthly_{entity}_totals(folder: Path) -> dict[str, float]:",
            f'    """Total {entity} amount per month (YYYY-MM), from {entity}s.csv in `folder`."""',
            "    totals: dict[str, float] = defaultdict(float)",
            f'    for item in load_{entity}s(folder / "{entity}s.csv"):',
            "        totals[item.created[:7]] += item.amount",
            "    return dict(sorted(totals.items()))",
            "",
            "",
        ]
    parts += [
        "def net_revenue(folder: Path) -> dict[str, float]:",
        '    """Payments minus refunds per month."""',
        "    paid = monthly_payment_totals(folder)",
        "    refunded = monthly_refund_totals(folder)",
        "    return {month: paid.get(month, 0.0) - refunded.get(month, 0.0) for month in sorted({*paid, *refunded})}",
        "",
        "",
        "def format_table(totals: dict[str, float]) -> str:",
        '    """Months and amounts as a two-column text table."""',
        "    width = max((len(m) for m in totals), default=5)",
        "    lines = [f\"{'month':<{width}}  amount\"]",
        "    for month, amount in totals.items():",
        '        lines.append(f"{month:<{width}}  {amount:>10.2f}")',
        '    return "\\n".join(lines)',
        "",
    ]
    return "\n".join(parts)


def _listing() -> str:
    files = ["README.md", "pyproject.toml", "records.py", "report.py", "jobs/nightly.py", "jobs/monthly.py",
             "tests/test_records.py", "tests/test_report.py", "data/orders.csv", "data/invoices.csv",
             "data/payments.csv", "data/refunds.csv"]  # fmt: skip
    return "\n".join(f"{(i * 7919) % 48000 + 120:>8}  {f}" for i, f in enumerate(files))


_TEST_RUN = """$ pytest -q tests/test_report.py
..F.                                                                   [100%]
=================================== FAILURES ===================================
_______________________ test_net_revenue_skips_empty_months ____________________

    def test_net_revenue_skips_empty_months(tmp_path):
        write_csv(tmp_path / "payments.csv", [("2024-01-03", 10.0), ("2024-02-09", 0.0)])
        write_csv(tmp_path / "refunds.csv", [("2024-02-11", 0.0)])
>       assert net_revenue(tmp_path) == {"2024-01": 10.0}
E       AssertionError: assert {'2024-01': 10.0, '2024-02': 0.0} == {'2024-01': 10.0}

tests/test_report.py:41: AssertionError
1 failed, 3 passed in 0.21s"""


_TESTS = '''"""Tests of report.py on small CSV files written per test."""

from pathlib import Path

from report import format_table, monthly_order_totals, net_revenue


def write_csv(path: Path, rows: list[tuple[str, float]]) -> None:
    lines = ["id,name,created,status,amount"]
    lines += [f"{i},item{i},{created},ok,{amount}" for i, (created, amount) in enumerate(rows, 1)]
    path.write_text("\\n".join(lines) + "\\n", encoding="utf-8")


def test_monthly_totals_add_up_per_month(tmp_path):
    write_csv(tmp_path / "orders.csv", [("2024-01-03", 5.0), ("2024-01-20", 2.5), ("2024-03-01", 1.0)])
    assert monthly_order_totals(tmp_path) == {"2024-01": 7.5, "2024-03": 1.0}


def test_net_revenue_subtracts_refunds(tmp_path):
    write_csv(tmp_path / "payments.csv", [("2024-01-03", 10.0), ("2024-02-09", 4.0)])
    write_csv(tmp_path / "refunds.csv", [("2024-02-11", 1.5)])
    assert net_revenue(tmp_path) == {"2024-01": 10.0, "2024-02": 2.5}


def test_net_revenue_skips_empty_months(tmp_path):
    write_csv(tmp_path / "payments.csv", [("2024-01-03", 10.0), ("2024-02-09", 0.0)])
    write_csv(tmp_path / "refunds.csv", [("2024-02-11", 0.0)])
    assert net_revenue(tmp_path) == {"2024-01": 10.0}


def test_format_table_aligns_the_amounts():
    text = format_table({"2024-01": 7.5, "2024-10": 120.0})
    assert text.splitlines() == ["month    amount", "2024-01        7.50", "2024-10      120.00"]
'''


def _call(name: str, **args: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def agent_messages() -> tuple[ChatMessage, ...]:
    """The system prompt (rules and tool schemas) and the user turn with the transcript and the edit request."""
    schemas = "\n".join(json.dumps(_schema(*t), indent=1) for t in _TOOLS)
    system = f"{_RULES}\n\n# Tools\n\nYou may call these functions:\n\n{schemas}"
    records, report = models_module(), report_module()
    grep = "\n".join(f"report.py:{i}: {line}" for i, line in enumerate(report.splitlines(), 1) if "refund" in line)
    steps = [
        ("Let me look at the repository first.", _call("list_dir", path=".", recursive=True), _listing()),
        ("I will read the records module the report depends on.", _call("read_file", path="records.py"), records),
        ("Now the report module.", _call("read_file", path="report.py"), report),
        ("Where are refunds used?", _call("grep", pattern="refund", path="report.py"), grep),
        ("And its tests.", _call("read_file", path="tests/test_report.py"), _TESTS),
        ("Running the report tests.", _call("run_tests", paths=["tests/test_report.py"]), _TEST_RUN),
    ]
    transcript = "\n\n".join(
        f"assistant: {say}\n{call}\n\ntool result:\n```\n{result}\n```" for say, call, result in steps
    )
    user = (
        "Task: make `net_revenue` in report.py leave out months where both payments and refunds are zero, so "
        "that the failing test passes, without changing any other function.\n\n"
        f"What you did so far:\n\n{transcript}\n\n"
        "Now reply with the complete updated report.py only."
    )
    return (ChatMessage("system", system), ChatMessage("user", user))
