"""`localspec pull`: download a catalog pair, a custom pair, or one model into the Hugging Face cache.

localspec pull NAME [--backend auto|llama|mlx]         a pair from `localspec models`
localspec pull REPO[:FILE][@REV]                       one model (a GGUF file, or an mlx-lm repo)
localspec pull --target REPO:FILE --draft REPO:FILE    your own pair, checked from headers first
localspec pull --check-only --target T --draft D       the header check alone (Hub files or local paths)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from localspec.backends.registry import BACKENDS, LLAMA, backend_choices
from localspec.formatting import format_bytes

if TYPE_CHECKING:
    from localspec.hub import ProgressEvent, PullResult


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pull",
        help="download a model pair (or one model) from the Hugging Face Hub",
        description="Download into the standard Hugging Face cache (HF_HOME). A second pull transfers nothing; "
        "GGUF pairs are checked for a matching vocabulary from their headers before the large transfer. "
        "Honours HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  localspec pull qwen2.5-coder-1.5b\n"
        "  localspec pull qwen2.5-coder-1.5b --backend mlx\n"
        "  localspec pull Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:qwen2.5-coder-0.5b-instruct-q4_k_m.gguf\n"
        "  localspec pull --target bartowski/Qwen2.5-Coder-7B-Instruct-GGUF:Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf \\\n"
        "                 --draft Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    )
    p.add_argument("what", nargs="?", metavar="NAME|REPO[:FILE]", help="a catalog pair name, or a Hub repo")
    p.add_argument(
        "--backend",
        choices=backend_choices(),
        default=None,
        help="which files of a pair: "
        + ", ".join(f"{spec.name} ({spec.model_format})" for spec in BACKENDS.values())
        + "; default auto (as --backend auto of run)",
    )
    p.add_argument("--target", metavar="REPO[:FILE]", help="custom pair: the target model")
    p.add_argument("--draft", metavar="REPO[:FILE]", help="custom pair: the draft model")
    p.add_argument("--no-check", action="store_true", help="skip the vocabulary check from the GGUF headers")
    p.add_argument(
        "--check-only",
        action="store_true",
        help="check a pair's vocabularies from the headers alone (Hub GGUF files, or local files); download nothing",
    )
    p.add_argument("--endpoint", default=None, help="Hub URL (default: $HF_ENDPOINT or https://huggingface.co)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from localspec.errors import UsageError

    custom = bool(args.target or args.draft)
    if custom and not (args.target and args.draft):
        raise UsageError("a custom pair needs both --target and --draft", "pass --target REPO:FILE --draft REPO:FILE")
    if custom and args.what:
        raise UsageError(f"give either {args.what!r} or --target/--draft, not both", "")
    if not custom and not args.what:
        raise UsageError(
            "nothing to pull", "name a pair (see `localspec models`), a repo REPO[:FILE], or --target/--draft"
        )
    _refuse_missing_paths(args.what, args.target, args.draft)
    if not args.check_only:
        _refuse_local_paths(args)  # before any request: a file on disk has nothing to download
    with progress_display(sys.stderr) as printer:
        common = dict(progress=printer, endpoint=args.endpoint, log=printer.log)
        if args.check_only:
            return _check_only(args, custom)
        if custom:
            from localspec.hub import pull_custom_pair

            backend = None if args.backend in (None, "auto") else args.backend
            result = pull_custom_pair(args.target, args.draft, backend=backend, check=not args.no_check, **common)
            _print_result(result, None)
        elif "/" in args.what:
            from localspec.hub import pull_model

            backend = None if args.backend in (None, "auto") else args.backend
            result = pull_model(args.what, backend=backend, **common)
            _print_result(result, None)
        else:
            from localspec.hub import pull_pair

            result = pull_pair(args.what, args.backend or "auto", check=not args.no_check, **common)
            _print_result(result, args.what)
    return 0


@contextmanager
def progress_display(stream: TextIO) -> Iterator[ProgressPrinter]:
    """The pull's display (bars on a terminal, plain lines otherwise) for `pull` and first-use pulls.
    Ctrl-C ends it with Interrupted (exit 130), saying what is kept."""
    from localspec.errors import Interrupted

    printer = ProgressPrinter(stream)
    try:
        yield printer
    except KeyboardInterrupt:
        raise Interrupted(
            "finished files are kept; run the same command to fetch the rest (the file in progress starts over)"
        ) from None
    finally:
        printer.end_line()


def _check_only(args: argparse.Namespace, custom: bool) -> int:
    from localspec.errors import UsageError
    from localspec.hub import check_remote_pair

    if custom:
        target, draft = args.target, args.draft
        if is_local_path(target) and is_local_path(draft):
            return _check_local(target, draft, args.backend or "auto")
        _refuse_mixed_pair(target, draft)
    else:
        from localspec.catalog import load_catalog

        if "/" in (args.what or "") or is_local_path(args.what):
            raise UsageError(
                "--check-only checks a pair", "pass a pair name, or --target and --draft (Hub files or local paths)"
            )
        bp = load_catalog().get(args.what).backend(LLAMA.name)  # the header check reads GGUF files
        target, draft = bp.target, bp.draft
    report = check_remote_pair(target, draft, endpoint=args.endpoint)
    print(
        f"compatible: {report.target} and {report.draft} share a vocabulary "
        f"({report.target_vocab:,} / {report.draft_vocab:,} tokens); read {format_bytes(report.bytes_read)} of headers"
    )
    return 0


def _check_local(target: str, draft: str, backend: str) -> int:
    """The header check of a pair on disk: the one `run` makes before loading (vocabularies, whole files)."""
    from localspec.options import ModelOptions
    from localspec.pipeline import check_pair

    check = check_pair(ModelOptions(target=target, draft=draft, backend=backend, draft_method="model"))
    print(check.describe("model"))
    print(f"  {'target':<7} {target}\n  {'draft':<7} {draft}")
    print(f"checked from the models' metadata alone ({check.backend}); no weights loaded")
    print(f"run it: localspec run --backend {check.backend} --target {target} --draft {draft}")
    return 0


# -- local paths where Hub references are expected ----------------------------------------------


def is_local_path(spec: str | None) -> bool:
    """An existing file, or a directory named as a path (an mlx-lm model): what `run --target` loads from
    disk. A bare name that happens to be a directory here stays a catalog pair name."""
    if not spec:
        return False
    path = Path(spec).expanduser()
    return path.is_file() or (path.is_dir() and "/" in spec)


def _looks_like_path(spec: str) -> bool:
    # a Hub GGUF reference is REPO:FILE.gguf, so a colon-free name ending in .gguf is meant as a file
    return spec.startswith(("/", "./", "../", "~")) or (":" not in spec and spec.endswith(".gguf"))


def _refuse_missing_paths(*specs: str | None) -> None:
    from localspec.errors import ModelFileError

    for spec in specs:
        if spec and _looks_like_path(spec) and not Path(spec).expanduser().exists():
            raise ModelFileError(
                f"no such file or directory: {spec}",
                "give an existing model file (or mlx-lm directory), or a Hub reference REPO[:FILE]",
            )


def _refuse_local_paths(args: argparse.Namespace) -> None:
    """A clear UsageError for a local path given to pull (there is nothing to download), naming what to use."""
    from localspec.errors import UsageError

    local = [spec for spec in (args.what, args.target, args.draft) if is_local_path(spec)]
    if not local:
        return
    if len(local) == 2:  # a pair on disk
        pair = f"--target {args.target} --draft {args.draft}"
        hint = (
            f"to check the pair from its headers: `localspec pull --check-only {pair}`; to use it: "
            f'`localspec run {pair} "PROMPT"`; `localspec doctor {pair}` checks the setup'
        )
    else:
        hint = (
            f'to use it: `localspec run --target {local[0]} "PROMPT"`; `localspec doctor --target {local[0]}` checks it'
        )
    kind = "directory" if Path(local[0]).expanduser().is_dir() else "file"
    raise UsageError(f"{local[0]} is a local {kind}: there is nothing to pull (pull downloads from the Hub)", hint)


def _refuse_mixed_pair(target: str, draft: str) -> None:
    from localspec.errors import UsageError

    local = [spec for spec in (target, draft) if is_local_path(spec)]
    if local:
        raise UsageError(
            f"--check-only compares two local files or two Hub files; {local[0]} is local and the other is not",
            "pull the Hub model first (`localspec pull REPO:FILE` prints its path), then check the two paths",
        )


def ready_line(result: PullResult, pair: str | None) -> str:
    got = format_bytes(result.bytes_downloaded) + " downloaded" if result.bytes_downloaded else "nothing to download"
    label = f"{pair} ({result.backend})" if pair else result.backend
    return f"ready: {label}, {got}"


def _print_result(result: PullResult, pair: str | None) -> None:
    print(ready_line(result, pair))
    for m in result.models:
        print(f"  {m.role or 'model':<7} {m.path}")
        for family, path in m.sidecars.items():  # drafter files shipped beside the model (llama.cpp's -hf rule)
            print(f"  {family:<7} {path}  (a drafter beside it: --draft {path} --draft-method {family})")
    if pair:
        print(f"run it: localspec run --pair {pair} --backend {result.backend}")
    elif len(result.models) == 2 and result.backend in BACKENDS:
        print(f"run it: localspec run --backend {result.backend} --target {result.target} --draft {result.draft}")


# -- progress display ---------------------------------------------------------------------------


class ProgressPrinter:
    """One bar per file on a terminal (bytes, speed, ETA); plain lines when the stream is not a TTY."""

    PLAIN_STEP = 0.1  # print a plain line each 10% ...
    PLAIN_MIN_INTERVAL = 2.0  # ... but not more often than this (the final line always)

    def __init__(self, stream: TextIO, *, tty: bool | None = None, width: int | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.width = width
        self.open_line = False
        self.started: dict[tuple[str, str], float] = {}
        self.plain_state: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (fraction, time)

    def log(self, msg: str) -> None:
        self.end_line()
        self._write(msg + "\n")

    def end_line(self) -> None:
        if self.open_line:
            self._write("\n")
            self.open_line = False

    def __call__(self, ev: ProgressEvent) -> None:
        key = (ev.repo, ev.file)
        label = f"{ev.role or 'model'}"
        if ev.cached:
            self.end_line()
            self._write(f"{label}: {ev.repo}/{ev.file} already downloaded ({format_bytes(ev.bytes_total)})\n")
            return
        now = time.monotonic()
        if key not in self.started:
            self.started[key] = now
            if not self.tty:
                self._write(f"{label}: downloading {ev.repo}/{ev.file} ({format_bytes(ev.bytes_total)})\n")
        if self.tty:
            self._bar(label, ev)
        else:
            self._plain(label, ev, now)

    def _bar(self, label: str, ev: ProgressEvent) -> None:
        width = self.width or shutil.get_terminal_size((100, 20)).columns
        total = ev.bytes_total or 0
        frac = min(1.0, ev.bytes_done / total) if total else 0.0
        stats = f" {format_bytes(ev.bytes_done)}/{format_bytes(ev.bytes_total)}"
        if ev.done:
            stats += f"  {format_bytes(ev.speed)}/s  done"
        else:
            stats += f"  {format_bytes(ev.speed)}/s  ETA {_eta(ev.eta)}"
        name = ev.file.rsplit("/", 1)[-1]
        bar_w = max(10, min(30, width - len(stats) - len(label) - 30))
        fill = int(frac * bar_w)
        # the line is label (6+), name, " [" bar "] ", "100%", stats: fit it in width - 1 columns
        room = max(8, width - 1 - max(6, len(label)) - 1 - 2 - bar_w - 2 - 4 - len(stats))
        if len(name) > room:
            name = "…" + name[-(room - 1) :]
        line = f"{label:<6} {name} [{'#' * fill}{'-' * (bar_w - fill)}] {frac * 100:3.0f}%{stats}"
        self._write("\r" + line[: width - 1].ljust(width - 1))
        self.open_line = True
        if ev.done:
            self.end_line()

    def _plain(self, label: str, ev: ProgressEvent, now: float) -> None:
        key = (ev.repo, ev.file)
        if ev.done:
            took = ev.elapsed or now - self.started.get(key, now)
            self._write(
                f"{label}: {ev.file} done, {format_bytes(ev.bytes_done)} in {took:.1f} s ({format_bytes(ev.speed)}/s)\n"
            )
            return
        if not ev.bytes_total:
            return
        frac = ev.bytes_done / ev.bytes_total
        last_frac, last_t = self.plain_state.get(key, (0.0, self.started[key]))
        if frac - last_frac >= self.PLAIN_STEP and now - last_t >= self.PLAIN_MIN_INTERVAL:
            self.plain_state[key] = (frac, now)
            self._write(
                f"{label}: {ev.file} {frac * 100:.0f}% {format_bytes(ev.bytes_done)}/{format_bytes(ev.bytes_total)} "
                f"{format_bytes(ev.speed)}/s ETA {_eta(ev.eta)}\n"
            )

    def _write(self, s: str) -> None:
        self.stream.write(s)
        self.stream.flush()


def _eta(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
