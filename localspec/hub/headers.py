"""GGUF headers of files on the Hub by HTTP Range reads, so a pair is checked before gigabytes move."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from localspec.catalog import ModelRef, cached_model_path
from localspec.errors import ModelFileError, PullError
from localspec.formatting import format_bytes
from localspec.gguf_meta import (
    GGUFHeader,
    NeedMoreBytes,
    parse_header,
    read_gguf_header,
)
from localspec.hub.errors import hub_errors
from localspec.hub.files import FILE_BACKEND

if TYPE_CHECKING:
    from localspec.hub.client import Hub

HEADER_FIRST_READ = 2 << 20  # most GGUF headers (tokenizer included) fit in 2-8 MiB
HEADER_MAX_READ = 256 << 20


def gguf_header(hub: Hub, ref: ModelRef, local: str | None = None) -> tuple[GGUFHeader, int, int | None]:
    """The GGUF header of ref: from the local file if given, else by HTTP Range reads."""
    if local is None:
        local = cached_model_path(ref, FILE_BACKEND, cache_dir=hub.cache_dir) if ref.file else None
    if local:
        return read_gguf_header(local, check_size=False), 0, os.path.getsize(local)
    assert ref.file
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(ref.repo, ref.file, revision=ref.revision, endpoint=hub.endpoint)
    with hub_errors(hub, ref, ref.file):
        meta = get_hf_file_metadata(url, token=hub.token, endpoint=hub.endpoint)
    location = meta.location or url
    # Like huggingface_hub: the token goes to the Hub only, never to the CDN a large file lives on.
    same_host = urlparse(location).netloc == urlparse(url).netloc
    headers = build_hf_headers(token=hub.token if same_host else False)
    headers["Accept-Encoding"] = "identity"
    size = meta.size
    buf = bytearray()
    want = HEADER_FIRST_READ
    while True:
        if size is not None:
            want = min(want, size)
        if want > len(buf):
            with hub_errors(hub, ref, ref.file):
                buf += _range_get(location, headers, len(buf), want - 1)
        try:
            return parse_header(buf), len(buf), size
        except NeedMoreBytes as e:
            if size is not None and len(buf) >= size:
                raise ModelFileError(f"{ref} is truncated: it ends inside its GGUF header", "") from None
            want = max(e.needed, 2 * len(buf))
            if want > HEADER_MAX_READ:
                raise PullError(
                    f"{ref}: GGUF header larger than {format_bytes(HEADER_MAX_READ)}; not checking it remotely",
                    "pull with --no-check, then run the pair: the loader checks the local files",
                ) from None
        except ValueError as e:
            raise PullError(f"{ref} is not a GGUF model file: {e}", "check the file name") from None


def _range_get(url: str, headers: dict[str, str], start: int, end: int) -> bytes:
    """Bytes [start, end] of url; reads only that much even if the server ignores Range."""
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

    n = end - start + 1
    out = bytearray()
    with http_stream_backoff(
        "GET", url, headers={**headers, "Range": f"bytes={start}-{end}"}, follow_redirects=True
    ) as r:
        hf_raise_for_status(r)
        skip = start if r.status_code == 200 else 0  # a server that ignored Range sends from byte 0
        for chunk in r.iter_bytes():
            if skip:
                drop = min(skip, len(chunk))
                chunk, skip = chunk[drop:], skip - drop
            out += chunk
            if len(out) >= n:
                break
    return bytes(out[:n])
