"""`localspec chat`: the terminal app. With --target/--draft or --pair it skips the pickers."""

from __future__ import annotations

import argparse
from pathlib import Path

from localspec.options import (
    ModelOptions,
    add_generation_options,
    add_model_options,
    generation_config_from_args,
    model_options_from_args,
    models_given,
)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "chat",
        help="chat in a terminal app and watch speculative decoding live",
        description="A terminal chat app: pick a backend and a target/draft pair (or pass them here to skip "
        "the pickers), chat, and watch tokens/s, acceptance rate and accepted length live.",
    )
    add_model_options(p)
    add_generation_options(p)
    p.add_argument("--save-dir", default=None, help="where Ctrl+S saves transcripts (default: current directory)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from localspec.tui.app import ChatApp
    from localspec.tui.settings import ChatSettings

    config = generation_config_from_args(args)  # bad values fail here, before the screen takes over
    settings = ChatSettings.from_config(config, args.system)
    options = model_options_from_args(args) if models_given(args) else None
    defaults = ModelOptions(  # for models picked in the app
        target="",
        backend=args.backend,
        draft_method=args.draft_method,
        n_ctx=args.n_ctx,
        threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
    )
    app = ChatApp(
        options=options,
        settings=settings,
        load_defaults=defaults,
        save_dir=Path(args.save_dir) if args.save_dir else None,
    )
    app.run()
    return 0
