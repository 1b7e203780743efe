"""`localspec chat`: the terminal app on the given models, or the default pair (pulled on first use);
the picker opens when that pair is not downloaded and may not be now (F3 opens it any time)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from localspec.commands.first_use import model_options_from_args
from localspec.errors import UsageError
from localspec.options import GenerationSettings, ModelOptions, add_generation_options, add_model_options, models_given


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "chat",
        help="chat in a terminal app and watch speculative decoding live",
        description="A terminal chat app: chat with the given models, or with the catalog's default pair (pulled on "
        "first use; the picker, F3, chooses others), and watch tokens/s, acceptance rate and accepted length live.",
    )
    add_model_options(p)
    add_generation_options(p)
    p.add_argument("--save-dir", default=None, help="where Ctrl+S saves transcripts (default: current directory)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    require_terminal()  # first: no download, no model and no screen for a chat nobody can type into
    from localspec.tui.app import ChatApp

    settings = GenerationSettings.from_args(args)
    settings.config()  # bad values fail here, before the screen takes over
    options, notice = initial_options(args)
    defaults = ModelOptions(  # for models picked in the app
        target="",
        backend=args.backend,
        draft_method=args.draft_method,
        n_ctx=args.n_ctx,
        threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        suffix_memory=args.suffix_memory,
    )
    app = ChatApp(
        options=options,
        settings=settings,
        load_defaults=defaults,
        save_dir=Path(args.save_dir) if args.save_dir else None,
        notice=notice,
    )
    app.run()
    return 0


def initial_options(args: argparse.Namespace) -> tuple[ModelOptions | None, str | None]:
    """The models to load at start, or (None, why) to open the picker: the default pair may be declined
    or unavailable (not downloaded with --no-pull, offline, no terminal), and the picker can pull it."""
    from localspec.errors import NotDownloadedError, error_text

    try:
        return model_options_from_args(args), None
    except NotDownloadedError as e:
        if models_given(args):
            raise
        return None, error_text(e)


def require_terminal() -> None:
    """UsageError unless stdin and stderr are terminals: the app reads keys from stdin and draws on stderr
    (Textual's driver), so without them it would draw into a pipe and wait for keys that never come."""
    missing = [name for name, stream in (("stdin", sys.stdin), ("stderr", sys.stderr)) if not is_terminal(stream)]
    if missing:
        raise UsageError(
            f"`localspec chat` is a terminal app, and no terminal is attached to its {' and '.join(missing)}",
            'for a prompt without a terminal (a script, a pipe, CI) use `localspec run "PROMPT"` '
            "(`localspec run -` reads the prompt from stdin)",
        )


def is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, AttributeError):  # a closed or replaced stream
        return False
