"""`localspec serve`: an OpenAI-compatible HTTP server (chat, completions, models, health, metrics)
over one loaded pair, speculation on, its statistics in every response. See localspec/server/."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from localspec.backends.registry import BACKENDS, backend_label
from localspec.commands.first_use import model_options_from_args
from localspec.errors import UsageError
from localspec.options import (
    DEFAULT_MAX_TOKENS,
    GenerationSettings,
    ModelOptions,
    add_generation_options,
    add_model_options,
)
from localspec.server.reasoning import DEFAULT_FORMAT as DEFAULT_REASONING_FORMAT
from localspec.server.reasoning import FORMATS as REASONING_FORMATS

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
OLLAMA_PORT = 11434  # where Ollama clients look when told nothing (OLLAMA_HOST unset)
DEFAULT_MAX_QUEUE = 16
# A GPU verifies a few sequences' tokens in about the time of one (its T(n) is flat at first), so several
# requests share its passes nearly for free; a CPU's T(n) grows with every token, so one at a time is the default.
GPU_PARALLEL = 4
DEFAULT_MAX_BODY = (
    8 * 1024 * 1024
)  # the same as localspec.server.app.DEFAULT_MAX_BODY (not imported: no fastapi at parse time)
API_KEY_ENV = "LOCALSPEC_API_KEY"

if TYPE_CHECKING:
    from fastapi import FastAPI

    from localspec.backends.base import Backend
    from localspec.backends.registry import ParallelModule
    from localspec.pipeline import Pipeline
    from localspec.server.parallel_scheduler import ParallelTarget


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="serve the pair over an OpenAI-compatible HTTP API",
        description="Serve one target/draft pair over the OpenAI-compatible HTTP API (/v1/chat/completions, "
        "/v1/completions, /v1/models, /health, /metrics), Anthropic's Messages API (/v1/messages) and Ollama's "
        "API (/api/chat, /api/generate, /api/tags, ...) with "
        "speculative decoding; every response carries "
        "the run's speculative stats in `timings`. The generation flags are the defaults for requests "
        "that leave a field out.",
    )
    add_model_options(p)
    add_generation_options(p)
    for action in p._actions:  # a server's answers run to the end of the context unless asked otherwise
        if action.dest == "max_tokens":
            action.default = None
            action.help = (
                "most tokens per answer when a request gives no max_tokens (default: until the context is full)"
            )
        if action.dest == "system":
            action.help = "system prompt for chat requests that bring none"
    g = p.add_argument_group("server")
    g.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default: {DEFAULT_HOST}, this machine only)")
    g.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    g.add_argument("--ollama-port", type=int, default=None, metavar="PORT",
                   help="also listen on PORT, the same server (Ollama's API under /api, and every other route): "
                        f"{OLLAMA_PORT} is where Ollama clients look when OLLAMA_HOST is unset (default: --port only; "
                        "Ollama clients reach it with OLLAMA_HOST=HOST:PORT)")  # fmt: skip
    g.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"require `Authorization: Bearer KEY` or `x-api-key: KEY` "
                        f"(default: ${API_KEY_ENV}, else none)")  # fmt: skip
    g.add_argument("--model-name", help="the model id served (default: the pair's name, else the target's file name)")
    g.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help=f"requests that may wait while one generates; more get 503 (default: {DEFAULT_MAX_QUEUE})")  # fmt: skip
    g.add_argument("--parallel", type=int, default=None, metavar="N",
                   help="generations decoded together, one shared target pass per step, drafts sized for the "
                        "whole pass (targets without recurrent layers; default: 1 on a CPU, "
                        f"{GPU_PARALLEL} when llama.cpp offloads to a GPU or MLX runs on Metal)")  # fmt: skip
    g.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from this origin (repeatable; '*' for any); default: CORS off")  # fmt: skip
    g.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY,
                   help=f"largest request body accepted; larger get 413 (default: {DEFAULT_MAX_BODY:,})")  # fmt: skip
    g.add_argument("--reasoning-format", choices=REASONING_FORMATS, default=DEFAULT_REASONING_FORMAT,
                   help="a reasoning model's <think> block: deepseek returns it as reasoning_content (Anthropic: "
                        "thinking blocks), none keeps it inline in the content; a request's reasoning_format "
                        f"overrides it (default: {DEFAULT_REASONING_FORMAT})")  # fmt: skip
    g.add_argument("--print-vllm", action="store_true",
                   help="print the equivalent `vllm serve` command for the --pair and exit")  # fmt: skip
    p.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    check_server_args(args)
    if args.print_vllm:
        from localspec.catalog import load_catalog
        from localspec.server.vllm import vllm_command

        pair = args.pair or (None if args.target else load_catalog().default)  # no model given: the default pair
        print(vllm_command(pair, method=args.draft_method, k=args.num_draft, port=args.port,
                           model_name=args.model_name))  # fmt: skip
        return 0
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UsageError(
            f"--max-tokens must be at least 1, got {args.max_tokens}", "leave it out: answers end with the context"
        )
    GenerationSettings.from_args(args).config(room=DEFAULT_MAX_TOKENS)  # refuse bad flags before any model loads
    opts = model_options_from_args(args)
    if not is_loopback(args.host) and not args.api_key:
        print(f"warning: serving on {args.host} without --api-key: anyone who can reach this port can use the model",
              file=sys.stderr)  # fmt: skip

    import uvicorn

    sockets = listening_sockets(args.host, args.port, args.ollama_port)  # a port in use fails before the models load
    print(
        f"loading {opts.target}" + (f" and {opts.draft}" if opts.uses_draft_model else "") + " …",
        file=sys.stderr,
        flush=True,
    )
    app, pipeline, name = build_server(args, opts)
    try:
        for note in pipeline.notes:
            print(f"note: {note}", file=sys.stderr)
        host = _url_host(args.host)
        print(f"serving {name!r} ({opts.draft_method} drafting, {_parallel_text(args.parallel)}) on "
              f"http://{host}:{args.port}/v1", file=sys.stderr, flush=True)  # fmt: skip
        print(ollama_line(args.host, args.ollama_port or args.port), file=sys.stderr, flush=True)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=3)  # fmt: skip
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        pipeline.close()
        for sock in sockets:
            sock.close()
    return 0


def ollama_line(host: str, port: int) -> str:
    """Where Ollama's clients find the server, and what they need to be told."""
    where = f"{_url_host(host)}:{port}"
    told = ("Ollama clients find it as they are" if port == OLLAMA_PORT and is_loopback(host)
            else f"Ollama clients: OLLAMA_HOST={where}")  # fmt: skip
    return f"Ollama's API on http://{where}/api ({told})"


def listening_sockets(host: str, port: int, ollama_port: int | None = None) -> list[socket.socket]:
    """Sockets bound to `port` and, with --ollama-port, to that port too (one server answers on both), on every
    address `host` names; a UsageError naming the port when one is taken."""
    out: list[socket.socket] = []
    try:
        for p in dict.fromkeys(q for q in (port, ollama_port) if q is not None):
            out += bind(host, p, ollama=p == ollama_port)
    except BaseException:
        for sock in out:
            sock.close()
        raise
    return out


def bind(host: str, port: int, *, ollama: bool = False) -> list[socket.socket]:
    """Sockets on every address of `host` (both of localhost's, as asyncio's create_server binds them)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: {e.strerror}", "give an address of this machine, e.g. 127.0.0.1") from None
    out: list[socket.socket] = []
    for family, kind, proto, _, address in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # its IPv4 twin has a socket of its own
        try:
            sock.bind(address)
        except OSError as e:
            sock.close()
            for other in out:
                other.close()
            flag = "--ollama-port" if ollama else "--port"
            busy = " (is Ollama itself running? quit it, or pick another --ollama-port)" if ollama else ""
            raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}{busy}",
                             f"choose a free port with {flag}") from None  # fmt: skip
        out.append(sock)
    return out


def build_server(args: argparse.Namespace, opts: ModelOptions) -> tuple[FastAPI, Pipeline, str]:
    """The models loaded and the app over them: (app, pipeline, the model id it serves). The caller closes
    the pipeline."""
    from localspec.pipeline import load_pipeline
    from localspec.server.app import ServerSettings, create_app

    pipeline = load_pipeline(opts)
    try:
        args.parallel = resolve_parallel(args.parallel, pipeline)
        parallel = open_parallel(pipeline, args.parallel)
        draft_parallel = open_draft_parallel(pipeline, args.parallel) if parallel is not None else None
        name = args.model_name or opts.pair or Path(opts.target).name.removesuffix(".gguf")
        settings = ServerSettings(
            model_name=name,
            # the method the models were loaded for (a catalog pair whose draft is a head has its own)
            defaults=replace(GenerationSettings.from_args(args), method=opts.draft_method),
            model_aliases=(opts.pair,) if opts.pair and opts.pair != name else (),
            api_key=args.api_key or None,
            max_queue=args.max_queue,
            cors_origins=tuple(args.cors_origin),
            max_body_bytes=args.max_body_bytes,
            reasoning_format=args.reasoning_format,
        )
        return create_app(pipeline, settings, parallel, draft_parallel), pipeline, name
    except BaseException:
        pipeline.close()
        raise


def resolve_parallel(asked: int | None, pipeline: Pipeline) -> int:
    """--parallel as given, else its default for this target (see GPU_PARALLEL); refused where it cannot run."""
    info = pipeline.target.info
    head = pipeline.options.family.is_head
    module = _parallel_module(pipeline.target)
    if asked is None:
        if module is None or info.is_recurrent or head or _unbatchable(pipeline):
            return 1
        return GPU_PARALLEL if module.batches_pay(pipeline.target, pipeline.options.n_gpu_layers) else 1
    if asked > 1 and module is None:
        raise UsageError(f"--parallel {asked}: the {backend_label(info.backend)} backend decodes one sequence at a "
                         "time here", "serve it with --parallel 1")  # fmt: skip
    if asked > 1 and info.is_recurrent:
        raise UsageError(f"--parallel {asked}: {info.name} has recurrent layers ({info.recurrent}), whose per-sequence "
                         "state snapshots localspec does not keep", "serve it with --parallel 1")  # fmt: skip
    if asked > 1 and head:
        from localspec.server.requests import HEAD_IN_PARALLEL

        raise UsageError(f"--parallel {asked} with --draft-method {pipeline.options.draft_method}: {HEAD_IN_PARALLEL}",
                         "serve it with --parallel 1, or draft with auto, model or a lookup")  # fmt: skip
    if asked > 1 and (why := _unbatchable(pipeline)):
        raise UsageError(f"--parallel {asked}: {why}", "serve it with --parallel 1")
    return asked


def _parallel_module(model: Backend) -> ParallelModule | None:
    """The model's backend's module for several sequences in one pass (the backend table), or None."""
    spec = BACKENDS.get(model.info.backend)
    return spec.parallel() if spec is not None else None


def _unbatchable(pipeline: Pipeline) -> str:
    """Why the target cannot decode in parallel (its backend says: MLX, a layer cache other than a KVCache), else ""."""
    module = _parallel_module(pipeline.target)
    return "" if module is None else module.unbatchable(pipeline.target)


def open_parallel(pipeline: Pipeline, parallel: int) -> ParallelTarget | None:
    """The target's parallel sequences, one per generation, each as long as --n-ctx: on llama.cpp a second context
    on the target's weights, on MLX a batched cache for the target's own model."""
    if parallel <= 1:
        return None
    return _parallel_of(pipeline.target, parallel)


def open_draft_parallel(pipeline: Pipeline, parallel: int) -> ParallelTarget | str | None:
    """A sequence of the draft model per generation, so that every sequence can draft with it: the draft's
    parallel sequences (as open_parallel makes them), or why they cannot be opened (each request then waits its
    turn for the one draft model), or None when no draft model is in use."""
    if not pipeline.has_draft_model or pipeline.draft_note:
        return None
    from localspec.errors import UnsupportedModelError

    try:
        return _parallel_of(pipeline.draft_slot.get(), parallel)
    except UnsupportedModelError as e:
        return e.message


def _parallel_of(model: Backend, parallel: int) -> ParallelTarget:
    """`parallel` sequences on a loaded model, each as long as its context, through its backend's table entry."""
    module = _parallel_module(model)
    if module is None:
        from localspec.errors import UnsupportedModelError

        raise UnsupportedModelError(f"the {backend_label(model.info.backend)} backend decodes one sequence at a time",
                                    "serve it with --parallel 1")  # fmt: skip
    return cast("ParallelTarget", module.open_parallel(model, parallel, model.n_ctx))


def _parallel_text(n: int) -> str:
    if n <= 1:
        return "one generation at a time (--parallel 1)"
    return f"up to {n} generations together (--parallel {n})"


def check_server_args(args: argparse.Namespace) -> None:
    if args.parallel is not None and args.parallel < 1:
        raise UsageError(f"--parallel must be 1 or more, got {args.parallel}", "e.g. --parallel 4")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a port number", "use 1..65535, e.g. --port 8080")
    if args.ollama_port is not None and not 1 <= args.ollama_port <= 65535:
        raise UsageError(f"--ollama-port {args.ollama_port} is not a port number",
                         f"use 1..65535, e.g. --ollama-port {OLLAMA_PORT}")  # fmt: skip
    if args.max_queue < 0:
        raise UsageError(
            f"--max-queue must be 0 or more, got {args.max_queue}", f"e.g. --max-queue {DEFAULT_MAX_QUEUE}"
        )
    if args.max_body_bytes < 1024:
        raise UsageError(f"--max-body-bytes {args.max_body_bytes} is too small for any request", "use at least 1024")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
