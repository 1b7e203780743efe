"""An in-process fake of the Hugging Face Hub on 127.0.0.1, for pull tests without a network.

It speaks the part of the protocol huggingface_hub 2.x uses to download:
    GET  /api/models/{repo}/revision/{rev}          -> {"id", "sha", "siblings"}
    GET  /api/models/{repo}/tree/{rev}?recursive=.. -> [{"type", "path", "size", "oid", "lfs"?}]
    HEAD/GET /{repo}/resolve/{rev}/{path}           -> small files: 200 + ETag + X-Repo-Commit;
                                                       LFS files: 302 to a second origin (the "CDN")
                                                       with X-Linked-Etag / X-Linked-Size
    GET  {cdn}/cdn/{key}                            -> the bytes, honouring Range (206)
    errors: 404 + X-Error-Code RepoNotFound | RevisionNotFound | EntryNotFound; 401 + GatedRepo;
            401 "Invalid credentials in Authorization header" for a wrong token.
Every request is recorded (method, path, Range, status, body bytes sent), and faults can be armed:
drop the connection after N body bytes, or answer the next GETs of a file with given statuses.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")
CHUNK = 64 << 10


@dataclass
class FakeFile:
    path: str
    data: bytes | Path

    @property
    def size(self) -> int:
        return len(self.data) if isinstance(self.data, bytes) else self.data.stat().st_size

    @property
    def is_lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(f"blob {self.size}\0{self.path}".encode() + self._sample()).hexdigest()

    @property
    def sha256(self) -> str:
        if isinstance(self.data, bytes):
            return hashlib.sha256(self.data).hexdigest()
        # hashing a GB fixture per test is slow; a stable stand-in is enough for an ETag
        return hashlib.sha256(f"{self.data}:{self.size}".encode()).hexdigest()

    def _sample(self) -> bytes:
        return self.data[:4096] if isinstance(self.data, bytes) else str(self.data).encode()

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end)."""
        if isinstance(self.data, bytes):
            return self.data[start:end]
        with self.data.open("rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, FakeFile]
    sha: str
    gated: bool = False
    private: bool = False


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int
    origin: str  # "hub" or "cdn"
    auth: str | None
    file: str | None = None  # "repo/path" when the body was file content


@dataclass
class FakeHub:
    token: str = "hf_fake_token_for_tests"
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    drop_after: dict[tuple[str, str], int] = field(default_factory=dict)  # one-shot
    fail_with: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # next GETs' statuses; 0 = serve
    lock: threading.Lock = field(default_factory=threading.Lock)
    cdn_keys: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._hub = _Server(("127.0.0.1", 0), _Handler, self, "hub")
        self._cdn = _Server(("127.0.0.1", 0), _Handler, self, "cdn")
        self._threads: list[threading.Thread] = []

    # -- setup --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | Path],
        *,
        gated: bool = False,
        private: bool = False,
        sha: str | None = None,
    ) -> FakeRepo:
        sha = sha or hashlib.sha1(repo_id.encode() + str(sorted(files)).encode()).hexdigest()
        repo = FakeRepo(repo_id, {p: FakeFile(p, d) for p, d in files.items()}, sha, gated, private)
        for p in files:
            self.cdn_keys[hashlib.sha1(f"{repo_id}/{p}".encode()).hexdigest()] = (repo_id, p)
        self.repos[repo_id] = repo
        return repo

    def start(self) -> FakeHub:
        for srv in (self._hub, self._cdn):
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        for srv in (self._hub, self._cdn):
            srv.shutdown()
            srv.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- accounting ---------------------------------------------------------------------------

    def content_bytes(self, file: str | None = None) -> int:
        """Body bytes of file content served (CDN and resolve GETs), optionally for one file (path in repo)."""
        with self.lock:
            return sum(
                r.body_bytes
                for r in self.requests
                if r.file is not None and (file is None or r.file.endswith("/" + file))
            )

    def count(self, method: str | None = None, contains: str = "") -> int:
        with self.lock:
            return sum(1 for r in self.requests if (method is None or r.method == method) and contains in r.path)

    def reset_stats(self) -> None:
        with self.lock:
            self.requests.clear()

    def record(self, r: Request) -> None:
        with self.lock:
            self.requests.append(r)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], handler: type, hub: FakeHub, origin: str) -> None:
        super().__init__(addr, handler)
        self.hub = hub
        self.origin = origin


_API_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_API_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/cdn/(?P<key>[0-9a-f]{40})$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return None

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def hub(self) -> FakeHub:
        return self.server.hub

    def _record(self, status: int, body: int, file: str | None = None) -> None:
        self.hub.record(
            Request(
                self.command,
                unquote(urlparse(self.path).path),
                self.headers.get("Range"),
                status,
                body,
                self.server.origin,
                self.headers.get("Authorization"),
                file,
            )
        )

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        sent = 0
        if self.command != "HEAD" and body:
            self.wfile.write(body)
            sent = len(body)
        self._record(status, sent)

    def _json(self, obj: object, headers: dict[str, str] | None = None) -> None:
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None) -> None:
        h = {"X-Error-Message": message, "Content-Type": "application/json", **(extra or {})}
        if code:
            h["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), h)

    def _auth_ok(self, repo: FakeRepo | None) -> bool:
        """False after sending the error response."""
        auth = self.headers.get("Authorization")
        if auth and auth != f"Bearer {self.hub.token}":
            self._error(401, None, "Invalid credentials in Authorization header")
            return False
        if repo is not None and repo.private and not auth:
            self._error(401, "RepoNotFound", "Repository not found")
            return False
        return True

    def _repo(self, repo_id: str) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            if self._auth_ok(None):
                self._error(404, "RepoNotFound", "Repository not found")
            return None
        return repo if self._auth_ok(repo) else None

    def _rev_ok(self, repo: FakeRepo, rev: str) -> bool:
        if unquote(rev) in ("main", repo.sha):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return False

    # -- verbs --------------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        path = urlparse(self.path).path
        try:
            if self.server.origin == "cdn":
                m = _CDN.match(path)
                if m and m["key"] in self.hub.cdn_keys:
                    return self._cdn(*self.hub.cdn_keys[m["key"]])
                return self._error(404, None, "not found")
            if m := _API_INFO.match(path):
                return self._api_info(m["repo"], m["rev"])
            if m := _API_TREE.match(path):
                return self._api_tree(m["repo"], m["rev"])
            if m := _RESOLVE.match(path):
                return self._resolve(m["repo"], m["rev"], unquote(m["path"]))
            self._error(404, None, "not found")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _api_info(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._rev_ok(repo, rev):
            return
        self._json(
            {
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.sha,
                "private": repo.private,
                "gated": "auto" if repo.gated else False,
                "siblings": [{"rfilename": p} for p in repo.files],
            }
        )

    def _api_tree(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._rev_ok(repo, rev):
            return
        out = []
        for f in repo.files.values():
            e = {"type": "file", "path": f.path, "size": f.size, "oid": f.git_oid}
            if f.is_lfs:
                e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            out.append(e)
        self._json(out)

    def _resolve(self, repo_id: str, rev: str, file: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._rev_ok(repo, rev):
            return
        f = repo.files.get(file)
        if f is None:
            return self._error(404, "EntryNotFound", f"{file} does not exist", {"X-Repo-Commit": repo.sha})
        if repo.gated and self.headers.get("Authorization") != f"Bearer {self.hub.token}":
            return self._error(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted.")
        if f.is_lfs:
            key = hashlib.sha1(f"{repo.repo_id}/{file}".encode()).hexdigest()
            self._send(
                302,
                b"",
                {
                    "Location": f"{self.hub.cdn_url}/cdn/{key}",
                    "X-Repo-Commit": repo.sha,
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(f.size),
                    "ETag": f'"{f.git_oid}"',
                },
            )
            return
        self._content(repo, f, {"ETag": f'"{f.git_oid}"', "X-Repo-Commit": repo.sha})

    def _cdn(self, repo_id: str, file: str) -> None:
        repo = self.hub.repos.get(repo_id)
        f = repo.files.get(file) if repo else None
        if repo is None or f is None:
            return self._error(404, None, "no such object")
        self._content(repo, f, {"ETag": f'"{f.sha256}"'})

    def _content(self, repo: FakeRepo, f: FakeFile, headers: dict[str, str]) -> None:
        key = (repo.repo_id, f.path)
        if self.command == "GET":
            statuses = self.hub.fail_with.get(key)
            status = statuses.pop(0) if statuses else 0
            if status:
                return self._error(status, None, "injected failure")
        size = f.size
        start, end, status = 0, size, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.match(r"bytes=(\d+)-(\d*)$", rng.strip())
            if not m or int(m[1]) >= size:
                return self._error(416, None, "range not satisfiable", {"Content-Range": f"bytes */{size}"})
            start = int(m[1])
            end = min(size, int(m[2]) + 1) if m[2] else size
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
        self.send_response(status)
        for k, v in {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        name = f"{repo.repo_id}/{f.path}"
        if self.command == "HEAD":
            return self._record(status, 0, name)
        limit = self.hub.drop_after.pop(key, None) if self.command == "GET" else None
        sent, pos = 0, start
        try:
            while pos < end:
                n = min(CHUNK, end - pos)
                if limit is not None:
                    n = min(n, limit - sent)
                    if n <= 0:
                        break
                self.wfile.write(f.read(pos, pos + n))
                pos += n
                sent += n
        finally:
            self._record(status, sent, name)
        if limit is not None and pos < end:
            # the "network" drops: close without sending the rest of the promised body
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main(argv: list[str] | None = None) -> None:
    """Serve local files as Hub repos until stopped, e.g. to try `localspec` as a new user would:

        python tests/hub_server.py Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:FILE=PATH ... --log requests.json

    prints the endpoint (use it as HF_ENDPOINT) and keeps --log up to date with every request (JSON).
    """
    import argparse
    import signal
    import sys

    p = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="REPO:FILE=PATH")
    p.add_argument("--log", help="write the requests as JSON here on exit")
    args = p.parse_args(argv)
    repos: dict[str, dict[str, bytes | Path]] = {}
    for spec in args.files:
        ref, _, path = spec.partition("=")
        repo, _, file = ref.partition(":")
        repos.setdefault(repo, {})[file] = Path(path)
    hub = FakeHub()
    for repo, files in repos.items():
        hub.add_repo(repo, files)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from dataclasses import asdict

    def write_log() -> None:
        if args.log:
            with hub.lock:
                rows = [asdict(r) for r in hub.requests]
            Path(args.log).write_text(json.dumps(rows, indent=1))

    with hub:
        print(hub.url, flush=True)
        written = -1
        try:
            while not stop.wait(0.5):
                if len(hub.requests) != written:
                    written = len(hub.requests)
                    write_log()
        except KeyboardInterrupt:
            pass
    write_log()
    print(f"{len(hub.requests)} requests, {hub.content_bytes():,} bytes of file content", file=sys.stderr)


if __name__ == "__main__":
    main()
