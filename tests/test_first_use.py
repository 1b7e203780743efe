"""First use: with no model given, commands take the catalog's default pair and pull it when missing.

The local Hub mimic (tests/hub_server.py) serves tiny random GGUFs (tests/gguf_factory.py) under the
default pair's real repo ids and file names, so `localspec run` goes through the real catalog, the
real pull (huggingface_hub) and real llama.cpp, with no network.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_server import FakeHub

from localspec import cli
from localspec.catalog import BackendPair, load_catalog
from localspec.formatting import format_bytes

DEFAULT = "qwen2.5-coder-1.5b"
PROMPT = "Write a Python function that checks whether a number is prime."


def default_llama() -> BackendPair:
    return load_catalog(include_user=False).default_pair().backends["llama"]


@pytest.fixture(autouse=True)
def hf_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, empty Hugging Face cache and no user catalog; returns HF_HOME."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for var in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "HF_HUB_CACHE",
        "HF_ENDPOINT",
        "LOCALSPEC_CATALOG",
    ):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))  # no saved token reaches the mimic
    return home


@pytest.fixture
def hub(tiny_ggufs: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    """The Hub mimic serving the default pair's files (tiny models), pointed at by HF_ENDPOINT."""
    bp = default_llama()
    target, draft, _ = tiny_ggufs
    h = FakeHub()
    h.add_repo(bp.target.repo, {bp.target.file: target, "README.md": b"# target\n"})  # type: ignore[dict-item]
    h.add_repo(bp.draft.repo, {bp.draft.file: draft})  # type: ignore[dict-item]
    with h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        yield h


def full_gets(hub: FakeHub, file: str) -> list[int]:
    """Body bytes of each whole-file GET (not the header Range reads) of one file."""
    return [
        r.body_bytes for r in hub.requests if r.method == "GET" and r.range is None and (r.file or "").endswith(file)
    ]


# -- the default pair, pulled on first use --------------------------------------------------------


def test_run_with_no_model_pulls_the_default_pair_and_answers_then_transfers_nothing(
    hub: FakeHub, tiny_ggufs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bp = default_llama()
    t_size, d_size = tiny_ggufs[0].stat().st_size, tiny_ggufs[1].stat().st_size

    rc = cli.main(["run", PROMPT, "--yes", "--max-tokens", "8", "--json", "--draft-method", "model"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    answer = json.loads(out)
    assert answer["stats"]["n_generated"] > 0 and answer["tokens"]
    assert f"no model given: using the default pair {DEFAULT}" in err
    # said what and how much before the transfer ...
    said = err.index(f"localspec will download {format_bytes(t_size + d_size)} from {hub.url}")
    assert f"target {bp.target.repo}/{bp.target.file}  {format_bytes(t_size)}" in err
    assert f"draft  {bp.draft.repo}/{bp.draft.file}  {format_bytes(d_size)}" in err
    # ... then pulled with `localspec pull`'s display (plain lines: stderr is not a terminal here)
    assert said < err.index(f"target: downloading {bp.target.repo}/{bp.target.file}")
    assert f"draft: {bp.draft.file} done" in err and "vocabularies match" in err
    assert f"ready: {DEFAULT} (llama), {format_bytes(t_size + d_size)} downloaded" in err
    assert "Download it now?" not in err  # --yes: no question
    assert full_gets(hub, bp.target.file) == [t_size] and full_gets(hub, bp.draft.file) == [d_size]
    assert hub.content_bytes("README.md") == 0

    hub.reset_stats()
    rc = cli.main(["run", PROMPT, "--max-tokens", "8", "--json", "--draft-method", "model"])  # no --yes needed any more
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out)["stats"]["n_generated"] > 0
    assert hub.requests == []  # from the cache alone: not even a metadata request
    assert "download" not in err


def test_chat_and_bench_take_the_default_pair(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    from localspec.commands.chat import initial_options

    parser = cli.build_parser()
    options, notice = initial_options(parser.parse_args(["chat", "--no-pull"]))
    assert options is None and notice is not None  # not downloaded and may not be: the picker opens, saying why
    assert f"localspec pull {DEFAULT} --backend llama" in notice
    assert cli.main(["bench", "--no-pull"]) == 1
    assert f"pair {DEFAULT!r} (llama) is not downloaded" in capsys.readouterr().err
    assert hub.requests == []

    assert cli.main(["pull", DEFAULT]) == 0
    capsys.readouterr()
    options, notice = initial_options(parser.parse_args(["chat"]))
    assert notice is None and options is not None and options.pair == DEFAULT
    assert Path(options.target).name == default_llama().target.file
    assert Path(options.draft or "").name == default_llama().draft.file


# -- refusing to download, without a request and without hanging --------------------------------------


def localspec(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A subprocess as a script runs it: stdin is not a terminal (and has nothing to read)."""
    return subprocess.run(
        [sys.executable, "-m", "localspec.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("flags", "env", "message", "hint"),
    [
        (["--no-pull"], {}, f"pair {DEFAULT!r} (llama) is not downloaded", "leave out --no-pull"),
        (
            [],
            {"HF_HUB_OFFLINE": "1"},
            "HF_HUB_OFFLINE is set, so localspec will not download it",
            "unset HF_HUB_OFFLINE",
        ),
        ([], {}, "with no terminal to ask, localspec does not download", "add --yes to download it now"),
        (["--pair", DEFAULT], {}, f"{DEFAULT} (llama) is not downloaded yet (about 1.6 GB)", "add --yes"),
    ],
    ids=["no-pull", "offline", "no-tty", "named-pair-no-tty"],
)
def test_no_download_allowed_is_a_clear_error_with_no_request(
    hub: FakeHub, flags: list[str], env: dict[str, str], message: str, hint: str
) -> None:
    started = time.monotonic()
    r = localspec("run", PROMPT, *flags, env=env)
    assert r.returncode == 1, r.stderr
    assert message in r.stderr.split("\nhint: ")[0] and hint in r.stderr.split("\nhint: ")[1]
    assert f"`localspec pull {DEFAULT} --backend llama`" in r.stderr  # the command that would download it
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert hub.requests == []
    assert time.monotonic() - started < 60


def test_on_a_terminal_it_asks_and_no_means_no(hub: FakeHub, tiny_ggufs: tuple[Path, Path, Path]) -> None:
    """stdin and stderr on a pseudo-terminal: the question comes after the files and sizes; "n" downloads nothing."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec.cli", "run", PROMPT],
        stdin=secondary, stderr=secondary, stdout=subprocess.PIPE, env=dict(os.environ), close_fds=True,
    )  # fmt: skip
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"[Y/n]" not in seen and time.monotonic() < deadline:
            if select.select([primary], [], [], 1.0)[0]:
                seen += os.read(primary, 4096)
        assert b"[Y/n]" in seen, seen.decode(errors="replace")
        os.write(primary, b"n\n")
        assert proc.wait(timeout=60) == 1
        while select.select([primary], [], [], 0.2)[0]:
            try:
                seen += os.read(primary, 4096)
            except OSError:  # the child closed the terminal
                break
    finally:
        proc.kill() if proc.poll() is None else None
        os.close(primary)
    text = seen.decode(errors="replace")
    total = tiny_ggufs[0].stat().st_size + tiny_ggufs[1].stat().st_size
    assert text.index(f"localspec will download {format_bytes(total)}") < text.index("Download it now? [Y/n]")
    assert "not downloaded (you said no)" in text and f"localspec pull {DEFAULT} --backend llama" in text
    assert hub.content_bytes() == 0 and hub.count(None, "/resolve/") == hub.count(None, "/cdn/") == 0
    assert hub.count("GET", "/api/models/") == 4  # each model's revision and file listing: metadata only


# -- marked as the default ------------------------------------------------------------------------------


def test_models_and_doctor_mark_the_default_pair(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows if r["default"]} == {DEFAULT}
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{DEFAULT}  (num_draft 4)  [default: used when no model is given]")
    assert sum("[default" in line for line in out.splitlines()) == 1
    cli.main(["doctor"])  # exit status depends on this machine's findings
    out = capsys.readouterr().out
    assert f"pair       {DEFAULT} (the default pair, not downloaded" in out
    assert f"`localspec pull {DEFAULT}`" in out


@pytest.mark.asyncio
async def test_chat_picker_marks_and_offers_the_default_pair(tmp_path: Path) -> None:
    from test_tui import SIZE, text_of, until
    from textual.widgets import OptionList, Static

    from localspec.tui.app import ChatApp
    from localspec.tui.models import BackendStatus

    probe = lambda: [BackendStatus("llama", "llama.cpp", True, "CPU build")]  # noqa: E731
    app = ChatApp(probe=probe, save_dir=tmp_path, notice="the default pair is not downloaded")
    async with app.run_test(size=SIZE) as pilot:
        pairs = app.screen.query_one("#pairs", OptionList)
        await until(pilot, lambda: pairs.option_count > 0 and pairs.highlighted is not None)
        assert pairs.get_option_at_index(pairs.highlighted).id == DEFAULT  # offered first
        assert "(default)" in str(pairs.get_option(DEFAULT).prompt)
        assert sum("(default)" in str(pairs.get_option_at_index(i).prompt) for i in range(pairs.option_count)) == 1
        bp = default_llama()
        status = app.screen.query_one("#pair-status", Static)
        await until(pilot, lambda: "Ctrl+D downloads about 1.6 GB" in text_of(status))
        assert f"target {bp.target}, draft {bp.draft}" in text_of(status)


def test_the_progress_bar_keeps_its_end_on_a_100_column_terminal() -> None:
    """The first run's bar (the pull's display) lost its end ("45.6 MB/s  do") on 80- and 100-column terminals."""
    import io

    from localspec.commands.pull import ProgressPrinter
    from localspec.hub import ProgressEvent

    bp = default_llama()
    for width in (80, 100, 120):
        buf = io.StringIO()
        bar = ProgressPrinter(buf, tty=True, width=width)
        bar(ProgressEvent(bp.target.file, bp.target.repo, "target", 1_117_320_768, 1_117_320_768, 45.6e6, 0.0, True))
        line = buf.getvalue().strip("\r\n")
        assert line.rstrip().endswith("45.6 MB/s  done") and len(line) <= width - 1, (width, line)
