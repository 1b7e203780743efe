"""The drafter family registry: a family added from outside localspec (tests/toy_family.py, one
registration call) is offered by run, bench, the chat app's picker and the server, and the built-in
families answer the questions the front ends ask."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from toy_family import TOY

from localspec.cli import build_parser, main
from localspec.families import registry


@pytest.fixture
def toy() -> Iterator[str]:
    registry.register(TOY)
    try:
        yield TOY.name
    finally:
        registry.unregister(TOY.name)


def test_builtin_families_and_their_questions(tiny_ggufs: tuple[Path, Path, Path]) -> None:
    names = registry.names()
    assert names[0] == registry.DEFAULT == "auto"
    assert {"model", "ngram", "suffix", "none"} <= set(names)
    assert [f.name for f in registry.families() if f.plain] == ["none"]
    heads = registry.head_families()
    assert heads and all(f.is_head and f.backend_names() for f in heads)
    target, draft, _ = tiny_ggufs
    assert registry.head_for_draft(str(draft), str(target)) is None  # a draft model, not a head
    fits = registry.head_fits(str(target), str(draft), "llama")
    assert set(fits) == {f.name for f in heads} and all(fits.values())  # no head fits a draft model
    with pytest.raises(ValueError):
        registry.unregister("auto")
    with pytest.raises(ValueError):
        registry.register(registry.family("model"))


def test_unknown_method_is_refused_with_the_choices() -> None:
    from localspec.errors import UsageError

    with pytest.raises(UsageError) as e:
        registry.family("toy")
    assert "auto" in (e.value.hint or "")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--draft-method", "toy", "hi"])


def test_a_registered_family_runs_in_run(
    toy: str, tiny_ggufs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target = str(tiny_ggufs[0])
    rc = main(
        ["run", "--target", target, "--draft-method", toy, "--max-tokens", "12", "--threads", "1", "--json", "Hi"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    plain = _plain_text(target)
    assert out["stats"]["draft_method"] == toy and out["stats"]["n_drafted"] > 0
    assert out["text"] == plain  # greedy: verified drafts leave the answer as plain decoding wrote it


def _plain_text(target: str) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert (
            main(
                [
                    "run",
                    "--target",
                    target,
                    "--draft-method",
                    "none",
                    "--max-tokens",
                    "12",
                    "--threads",
                    "1",
                    "--json",
                    "Hi",
                ]
            )
            == 0
        )
    return str(json.loads(buf.getvalue())["text"])


def test_a_registered_family_runs_in_bench(
    toy: str, tiny_ggufs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([
        "bench", "--target", str(tiny_ggufs[0]), "--methods", f"none,{toy}:2", "--suites", "chat", "--prompts", "1",
        "--reps", "1", "--max-tokens", "8", "--cost-reps", "1", "--threads", "1", "--json",
    ])  # fmt: skip
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert result["methods"] == ["none", f"{toy} k=2"]
    toy_runs = [r for r in result["runs"] if r["method"] == f"{toy} k=2"]
    assert toy_runs and toy_runs[0]["stats"]["n_drafted"] > 0


def test_a_registered_family_is_offered_by_the_picker(toy: str, tiny_ggufs: tuple[Path, Path, Path]) -> None:
    from localspec.tui import models as tui_models

    offered, note = tui_models.method_choices("llama", str(tiny_ggufs[0]), str(tiny_ggufs[1]))
    assert toy in offered and note == ""
    ok, why = tui_models.check_pair("llama", str(tiny_ggufs[0]), "", toy)
    assert ok, why


def test_a_registered_family_is_served(toy: str, tiny_ggufs: tuple[Path, Path, Path]) -> None:
    import uvicorn

    from localspec.commands.first_use import model_options_from_args
    from localspec.commands.serve import build_server

    args = build_parser().parse_args(
        ["serve", "--target", str(tiny_ggufs[0]), "--threads", "1", "--draft-method", "none"]
    )
    app, pipeline, name = build_server(args, model_options_from_args(args))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _wait_for(port)
        body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0,
                "speculative": {"method": toy, "k": 2}}  # fmt: skip
        reply = _post(port, "/v1/chat/completions", body)
        assert reply["choices"][0]["message"]["content"]
        timings = json.dumps(reply)
        assert f'"{toy}"' in timings  # the per-request method shows in the response's speculative stats
        unknown = _post(port, "/v1/chat/completions", {**body, "speculative": {"method": "nope"}}, status=400)
        assert toy in unknown["error"]["message"]  # the choices listed include the registered family
    finally:
        server.should_exit = True
        thread.join(10)
        pipeline.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the server did not start")


def _post(port: int, path: str, body: dict[str, object], status: int = 200) -> dict[str, object]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == status
            return dict(json.loads(r.read()))
    except urllib.error.HTTPError as e:
        assert e.code == status, e.read()
        return dict(json.loads(e.read()))
