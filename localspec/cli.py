"""Command-line entry point: `localspec run|chat|serve|pull|models|bench|doctor|memory`.

Only argparse and the command modules' parser definitions load here; each command imports its
heavy dependencies when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from localspec import __version__
from localspec.errors import Interrupted, LocalspecError

COMMANDS: tuple[str, ...] = ("run", "chat", "serve", "pull", "models", "bench", "doctor", "memory")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localspec",
        description="Local speculative decoding: a small draft model writes ahead, the target grades it.",
    )
    parser.add_argument("--version", action="version", version=f"localspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"localspec.commands.{name}")
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except Interrupted as e:
        print(f"\ninterrupted: {e.message}", file=sys.stderr)
        return e.exit_code
    except LocalspecError as e:
        print_error(e)
        return e.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def print_error(e: LocalspecError) -> None:
    print(f"error: {e.message}", file=sys.stderr)
    if e.hint:
        print(f"hint: {e.hint}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
