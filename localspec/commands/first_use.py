"""First use of a catalog pair: pulled when it is not downloaded yet, after saying what and how much.

FirstUse(yes=False, no_pull=False, interactive=None)    what the user allowed (-y/--yes, --no-pull)
ensure_pair(name, backend, policy, *, default=False, out=sys.stderr, answer=None) -> LocalPair
    The pair's concrete backend and local paths. When it is not in the Hugging Face cache: with --no-pull, under
    HF_HUB_OFFLINE, or with no terminal to ask and no --yes, NotDownloadedError (no request is
    made); otherwise the pair's file listing is fetched (metadata only), the files and sizes are
    shown, the user is asked (unless --yes), and the pair is pulled with `localspec pull`'s display,
    resume and errors.

model_options_from_args(args) -> ModelOptions
    The flags' models: the catalog pair they name (--pair, or the default when no model is given)
    made local by ensure_pair, then localspec.options.model_options. Every command that turns flags
    into models (run, chat, bench, serve) goes through it: parsing options never downloads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from localspec.backends.registry import backend_spec
from localspec.catalog import BackendPair, LocalPair, load_catalog, pull_command, resolve_pair
from localspec.commands.pull import progress_display, ready_line
from localspec.errors import NotDownloadedError, UsageError
from localspec.formatting import format_bytes
from localspec.hub import pair_backend_for, plan_pair, pull_pair
from localspec.hub.client import offline
from localspec.options import ModelOptions, chosen_pair, model_options


def model_options_from_args(args: argparse.Namespace) -> ModelOptions:
    """ModelOptions from the flags, a catalog pair pulled first if it is not downloaded yet and the flags
    allow it."""
    pair = chosen_pair(args)
    local = ensure_pair(pair, args.backend, FirstUse.from_args(args), default=not args.pair) if pair else None
    return model_options(args, local)


@dataclass(frozen=True)
class FirstUse:
    """Whether a missing catalog pair may be downloaded, and whether to ask first."""

    yes: bool = False  # download without asking
    no_pull: bool = False  # never download
    interactive: bool | None = None  # None: ask only when stdin and stderr are terminals

    def __post_init__(self) -> None:
        if self.yes and self.no_pull:
            raise UsageError("--yes and --no-pull contradict each other", "give one of them")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FirstUse:
        return cls(yes=bool(getattr(args, "yes", False)), no_pull=bool(getattr(args, "no_pull", False)))

    def can_ask(self) -> bool:
        if self.interactive is not None:
            return self.interactive
        # stderr too: a question nobody sees (stderr redirected) would wait for ever
        return _isatty(sys.stdin) and _isatty(sys.stderr)


def ensure_pair(
    name: str,
    backend: str,
    policy: FirstUse,
    *,
    default: bool = False,
    out: TextIO | None = None,
    answer: Callable[[str], str] | None = None,
) -> LocalPair:
    """A catalog pair's backend and local paths, pulling it first when allowed (see the module doc).
    `default`: the pair was chosen because no model was given (said so). `answer`: reads the user's
    reply to a question (default: a line from stdin; end of input is "no")."""
    out = out or sys.stderr
    pair = load_catalog().get(name)
    backend = pair_backend_for(pair, backend)
    label = f"{name} ({backend}{', the default pair' if default else ''})"
    if default:
        _say(out, f"no model given: using the default pair {name} (see `localspec models`; --pair NAME picks another)")
    try:
        return LocalPair(name, backend, *resolve_pair(name, backend))
    except NotDownloadedError as e:
        missing = e
    _refuse_download(label, name, backend, pair.backend(backend), policy, missing)
    backend_spec(backend).module()  # a backend that cannot run here fails now, not after the download
    _pull_first(name, backend, label, policy, out, answer or _read_answer(out))
    return LocalPair(name, backend, *resolve_pair(name, backend))


def _refuse_download(
    label: str, name: str, backend: str, bp: BackendPair, policy: FirstUse, missing: NotDownloadedError
) -> None:
    """Raise NotDownloadedError when this pair may not be downloaded now; before any network request."""
    about = f" (about {bp.size_gb:g} GB)" if bp.size_gb else ""
    pull = f"`{pull_command(name, backend)}`"
    if policy.no_pull:
        raise NotDownloadedError(
            missing.message, f"run {pull}{about}, or leave out --no-pull to download it on first use"
        )
    if offline():
        raise NotDownloadedError(
            f"{label} is not downloaded, and HF_HUB_OFFLINE is set, so localspec will not download it",
            f"unset HF_HUB_OFFLINE to download it{about}, or run {pull} on a machine that reaches the Hub "
            "and copy its Hugging Face cache here",
        )
    if not policy.yes and not policy.can_ask():
        raise NotDownloadedError(
            f"{label} is not downloaded yet{about}, and with no terminal to ask, localspec does not download "
            "without being told to",
            f"add --yes to download it now, or run {pull} first",
        )


def _pull_first(
    name: str, backend: str, label: str, policy: FirstUse, out: TextIO, answer: Callable[[str], str]
) -> None:
    with progress_display(out) as printer:
        plan = plan_pair(name, backend, log=printer.log)  # the file listing: metadata only
    need = plan.bytes_to_download
    if need:
        lines = [f"{label} is not downloaded yet: localspec will download {format_bytes(need)} "
                 f"from {plan.endpoint} into {plan.cache_dir}:"] + ["  " + line for line in plan.lines()]  # fmt: skip
        out.write("\n".join(lines) + "\n")
        out.flush()
        if not policy.yes and not _is_yes(answer("Download it now? [Y/n] ")):
            raise NotDownloadedError(
                f"{name} not downloaded (you said no)", f"run `{pull_command(name, backend)}` when you want it"
            )
    with progress_display(out) as printer:
        result = pull_pair(name, backend, progress=printer, log=printer.log, plan=plan)
        printer.log(ready_line(result, name))


def _is_yes(reply: str) -> bool:
    return reply.strip().lower() in ("", "y", "yes")


def _read_answer(out: TextIO) -> Callable[[str], str]:
    """Ask on `out` (stderr: stdout may be the answer stream) and read one line from stdin."""

    def ask(question: str) -> str:
        out.write(question)
        out.flush()
        line = sys.stdin.readline()
        return line if line else "n"  # end of input: nobody said yes

    return ask


def _say(out: TextIO, text: str) -> None:
    out.write(f"note: {text}\n")
    out.flush()


def _isatty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, AttributeError):  # closed or replaced streams
        return False
