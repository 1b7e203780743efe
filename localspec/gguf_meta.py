"""Read a GGUF file's header (metadata and tensor table) without loading the model.

Works on a local file or on the first bytes of a remote one: `parse_header` raises `NeedMoreBytes`
when the buffer ends early, so a caller holding a prefix can fetch more and try again. Used to
refuse non-GGUF and truncated files before llama.cpp sees them, and to check pair compatibility
from headers alone.
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


class NeedMoreBytes(Exception):
    """The buffer ended inside the header; `needed` is a lower bound on the bytes required."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the data section


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_start: int  # absolute offset of the tensor data section
    header_bytes: int = field(default=0)  # bytes of the header before alignment padding

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def required_size(self) -> int:
        """File size that the tensor table says the file must have."""
        end = self.data_start
        for t in self.tensors:
            end = max(end, self.data_start + t.offset + _tensor_nbytes(t))
        return end


class _Reader:
    def __init__(self, buf: bytes | memoryview | mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0
        self.size = len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        end = start + n
        if end > self.size:
            raise NeedMoreBytes(end)
        self.pos = end
        return start

    def scalar(self, vtype: int) -> Any:
        fmt, n = _SCALARS[vtype]
        return struct.unpack_from(fmt, self.buf, self.take(n))[0]

    def u32(self) -> int:
        return self.scalar(4)

    def u64(self) -> int:
        return self.scalar(10)

    def string(self) -> str:
        n = self.u64()
        start = self.take(n)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="surrogateescape")

    def strings(self, count: int) -> list[str]:
        """`count` strings in a row (a vocabulary: 150k of them), in one tight loop."""
        buf, pos, size = self.buf, self.pos, self.size
        length = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                raise NeedMoreBytes(pos + 8)
            n = length(buf, pos)[0]
            pos += 8
            if pos + n > size:
                raise NeedMoreBytes(pos + n)
            append(str(buf[pos : pos + n], "utf-8", "surrogateescape"))
            pos += n
        self.pos = pos
        return out

    def skip_strings(self, count: int) -> None:
        """Step over `count` strings without decoding them."""
        buf, pos, size = self.buf, self.pos, self.size
        length = _U64.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                raise NeedMoreBytes(pos + 8)
            pos += 8 + length(buf, pos)[0]
        if pos > size:
            raise NeedMoreBytes(pos)
        self.pos = pos

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.u32()
            count = self.u64()
            if item_type == _STRING:
                return self.strings(count)
            if item_type in _SCALARS:
                fmt, n = _SCALARS[item_type]
                start = self.take(n * count)
                return list(struct.unpack_from(f"<{count}{fmt[1]}", self.buf, start))
            return [self.value(item_type) for _ in range(count)]
        if vtype not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.scalar(vtype)


UNREAD = frozenset({"tokenizer.ggml.merges"})


@dataclass(frozen=True)
class UnreadArray:
    """An array parse_header stepped over (see UNREAD): only its length is known."""

    item_type: int
    count: int


def _skip_array(r: _Reader) -> Any:
    item_type, count = r.u32(), r.u64()
    if item_type == _STRING:
        r.skip_strings(count)
        return UnreadArray(item_type, count)
    if item_type in _SCALARS:
        r.take(_SCALARS[item_type][1] * count)
        return UnreadArray(item_type, count)
    return [r.value(item_type) for _ in range(count)]


def parse_header(buf: bytes | memoryview | mmap.mmap, *, full: bool = False) -> GGUFHeader:
    """Parse magic, metadata and tensor table. Raises ValueError if not GGUF, NeedMoreBytes if short.
    Arrays in UNREAD (BPE merges: nothing here needs them, and decoding 150k strings takes a tenth of a
    second) are stepped over as UnreadArray unless `full` (a tokenizer rebuilt from the header)."""
    r = _Reader(buf)
    magic_at = r.take(4)
    if bytes(buf[magic_at : magic_at + 4]) != GGUF_MAGIC:
        raise ValueError("not a GGUF file (bad magic)")
    version = r.u32()
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    n_tensors, n_kv = r.u64(), r.u64()
    if n_tensors > 1 << 20 or n_kv > 1 << 20:
        raise ValueError("implausible GGUF header counts")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.u32()
        metadata[key] = _skip_array(r) if key in UNREAD and vtype == _ARRAY and not full else r.value(vtype)
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.u32()
        shape = tuple(r.u64() for _ in range(n_dims))
        tensors.append(TensorInfo(name, shape, r.u32(), r.u64()))
    align = int(metadata.get("general.alignment", 32))
    data_start = (r.pos + align - 1) // align * align
    return GGUFHeader(version, metadata, tuple(tensors), data_start, r.pos)


def peek_architecture(path: str | Path) -> str | None:
    """`general.architecture` of a local GGUF, reading only the metadata before it (writers put it first),
    without parsing a whole vocabulary; None when the file cannot be read or does not say."""
    try:
        with open(Path(path).expanduser(), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            r = _Reader(mm)
            if bytes(mm[r.take(4) : 4]) != GGUF_MAGIC or r.u32() not in (2, 3):
                return None
            _, n_kv = r.u64(), r.u64()
            for _ in range(min(n_kv, 1 << 20)):
                key, vtype = r.string(), r.u32()
                value = r.value(vtype)
                if key == "general.architecture":
                    return str(value)
    except (OSError, ValueError, NeedMoreBytes, struct.error):
        return None
    return None


def _tensor_nbytes(t: TensorInfo) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
    n = 1
    for d in t.shape:
        n *= d
    return n // block * type_size


def read_gguf_header(path: str | Path, *, check_size: bool = True, full: bool = False) -> GGUFHeader:
    """Read and validate a local GGUF file's header, with errors a user can act on. Parsed once per
    file version (path, size, mtime): the pair check, the hybrid note and the loader all read it, and a
    150k-token vocabulary takes a tenth of a second to parse in Python. `full`: see parse_header."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(
            f"model file not found: {p}", "check the path, or use `localspec pull` to download a model"
        )
    if p.is_dir():
        raise ModelFileError(f"{p} is a directory, not a GGUF file", "pass the .gguf file inside it")
    try:
        st = p.stat()
    except OSError as e:
        raise ModelFileError(f"cannot read {p}: {e.strerror or e}", "check the file's permissions") from None
    header = _parsed(str(p), st.st_size, st.st_mtime_ns, full)
    if check_size:
        try:
            need = header.required_size()
        except (KeyError, ValueError):
            need = 0  # unknown tensor type: let llama.cpp decide
        if st.st_size < need:
            raise ModelFileError(
                f"{p} is truncated: {st.st_size:,} bytes, but its tensor table needs {need:,}", _TRUNCATED_HINT
            )
    return header


@functools.lru_cache(maxsize=16)
def _parsed(path: str, size: int, mtime_ns: int, full: bool) -> GGUFHeader:
    p = Path(path)
    if size < 24:
        raise ModelFileError(f"{p} is not a GGUF model file ({size} bytes)", _NOT_GGUF_HINT)
    try:
        with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return parse_header(mm, full=full)
    except NeedMoreBytes:
        raise ModelFileError(f"{p} is truncated: it ends inside the GGUF header", _TRUNCATED_HINT) from None
    except ValueError as e:
        raise ModelFileError(f"{p} is not a GGUF model file: {e}", _NOT_GGUF_HINT) from None
    except OSError as e:
        raise ModelFileError(f"cannot read {p}: {e.strerror or e}", "check the file's permissions") from None


_NOT_GGUF_HINT = "llama.cpp reads GGUF files (*.gguf); convert other formats with llama.cpp's convert_hf_to_gguf.py"
_TRUNCATED_HINT = (
    "the download was probably cut short: delete the file, then download it again "
    "(for a catalog pair, `localspec pull NAME` then fetches it anew)"
)
