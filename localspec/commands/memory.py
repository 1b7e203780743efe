"""`localspec memory`: where the suffix memory lives and how much it holds; `localspec memory clear` deletes it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localspec.decoding.suffix_memory import TokenizerSummary


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "memory",
        help="show or clear the suffix memory (earlier prompts and answers kept for suffix drafts)",
        description="The suffix memory keeps the prompts and answers of earlier runs, chats and server requests "
        "(as token ids, which decode back to the text) so that a repeated task drafts from its first round. "
        "`localspec memory` shows where it is and how much it holds, per tokenizer; `localspec memory clear` "
        "deletes it. Turn it off with --no-suffix-memory (run, chat, serve) or LOCALSPEC_SUFFIX_MEMORY=0.",
    )
    p.add_argument("action", nargs="?", choices=("show", "clear"), default="show", help="show (default) or clear")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from localspec.decoding import suffix_memory as sm

    root = sm.memory_root()
    if args.action == "clear":
        before = sm.summaries(root)
        n = sm.clear_all(root)
        tokens = sum(s.n_tokens for s in before)
        if args.json:
            json.dump({"path": str(root), "cleared_documents": n, "cleared_tokens": tokens}, sys.stdout)
            sys.stdout.write("\n")
        else:
            print(f"cleared the suffix memory: {n:,} documents, {tokens:,} tokens ({root})")
        return 0
    rows = sm.summaries(root)
    if args.json:
        out = {
            "path": str(root),
            "enabled": sm.enabled(),
            "limit_tokens": sm.token_limit(),
            "tokenizers": [
                {"path": str(s.path), "about": s.about, "documents": s.n_docs, "tokens": s.n_tokens,
                 "bytes": s.n_bytes, "last_used": _when(s.last_used_ns)}
                for s in rows
            ],
        }  # fmt: skip
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
        return 0
    for line in _lines(root, rows, enabled=sm.enabled(), limit=sm.token_limit()):
        print(line)
    return 0


def _lines(root: Path, rows: list[TokenizerSummary], *, enabled: bool, limit: int) -> list[str]:
    from localspec.formatting import format_bytes

    state = "on" if enabled else "off (LOCALSPEC_SUFFIX_MEMORY)"
    lines = [f"suffix memory: {root} ({state}; at most {limit:,} tokens per tokenizer)"]
    if not rows:
        lines.append("  empty")
    for s in rows:
        about = "; ".join(x for x in s.about.splitlines() if x) or "tokenizer unknown"
        lines.append(f"  {s.path.name}: {s.n_docs:,} documents, {s.n_tokens:,} tokens, {format_bytes(s.n_bytes)}, "
                     f"last used {_when(s.last_used_ns) or '-'} ({about})")  # fmt: skip
    lines.append(
        "clear it with `localspec memory clear`; turn it off with --no-suffix-memory or LOCALSPEC_SUFFIX_MEMORY=0"
    )
    return lines


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ns / 1e9)) if ns else ""
