"""GGUF header parsing: the real SmolLM2 fixture, byte prefixes, and the files users get wrong."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from fixture_models import fetch

from localspec.errors import ModelFileError
from localspec.gguf_meta import GGUF_MAGIC, NeedMoreBytes, UnreadArray, parse_header, read_gguf_header
from localspec.vocab import VocabInfo

HEAD = 4 << 20  # the SmolLM2 header (with its 49k-token vocabulary) ends at about 1.8 MB


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return fetch("smollm2-135m")  # cached after the first fetch (tests/fixture_models.py)


@pytest.fixture(scope="module")
def head(smollm2: Path) -> bytes:
    with smollm2.open("rb") as f:
        return f.read(HEAD)


def test_reads_the_smollm2_header(smollm2: Path) -> None:
    h = read_gguf_header(smollm2)
    assert h.version == 3 and h.architecture == "llama"
    assert h.get("llama.context_length") == 8192 and h.get("llama.block_count") == 30
    assert h.get("llama.rope.freq_base") == pytest.approx(100000.0)
    assert h.get("tokenizer.ggml.add_bos_token") is False
    assert h.get("missing", "dflt") == "dflt"
    tokens = h.get("tokenizer.ggml.tokens")
    assert len(tokens) == 49152 and tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert len(h.tensors) == 272
    assert h.data_start % 32 == 0 and h.data_start >= h.header_bytes
    assert h.required_size() == smollm2.stat().st_size
    vocab = VocabInfo.from_gguf_metadata(h.metadata)
    assert (vocab.vocab_type, vocab.n_vocab, vocab.bos_id, vocab.eos_id, vocab.add_bos) == ("gpt2", 49152, 1, 2, False)


def test_agrees_with_the_gguf_package(smollm2: Path) -> None:
    """Every metadata value and tensor entry matches gguf-py's own reader."""
    gguf = pytest.importorskip("gguf")
    ref = gguf.GGUFReader(str(smollm2))
    h = read_gguf_header(smollm2, full=True)
    assert h.data_start == ref.data_offset
    assert set(h.metadata) == {k for k in ref.fields if not k.startswith("GGUF.")}
    for key in ("general.name", "llama.embedding_length", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"):
        assert h.metadata[key] == ref.fields[key].contents()
    assert h.metadata["tokenizer.ggml.merges"] == ref.fields["tokenizer.ggml.merges"].contents()
    assert h.metadata["tokenizer.ggml.token_type"] == ref.fields["tokenizer.ggml.token_type"].contents()
    # By default the merges are stepped over (only their count kept); everything after them still reads right.
    light = read_gguf_header(smollm2)
    assert light.metadata["tokenizer.ggml.merges"] == UnreadArray(
        8, len(ref.fields["tokenizer.ggml.merges"].contents())
    )
    assert {k: v for k, v in light.metadata.items() if k != "tokenizer.ggml.merges"} == {
        k: v for k, v in h.metadata.items() if k != "tokenizer.ggml.merges"
    }
    assert light.tensors == h.tensors and light.data_start == h.data_start
    for mine, theirs in zip(h.tensors, ref.tensors, strict=True):
        assert mine.name == theirs.name
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.ggml_type == int(theirs.tensor_type)
        assert h.data_start + mine.offset == theirs.data_offset


def test_parse_header_on_the_whole_prefix(head: bytes, smollm2: Path) -> None:
    assert parse_header(head) == read_gguf_header(smollm2)
    assert parse_header(memoryview(head)).header_bytes == read_gguf_header(smollm2).header_bytes


@pytest.mark.parametrize("cut", [0, 3, 4, 8, 23, 24, 100, 5000, 1_000_000])
def test_a_prefix_raises_need_more_bytes(head: bytes, cut: int) -> None:
    with pytest.raises(NeedMoreBytes) as err:
        parse_header(head[:cut])
    assert err.value.needed > cut


def test_need_more_bytes_converges(head: bytes) -> None:
    """A caller that fetches what `needed` asks for (doubling) reaches a full parse."""
    size = 4096
    for _ in range(30):
        try:
            h = parse_header(head[:size])
            break
        except NeedMoreBytes as e:
            assert e.needed > size
            size = max(e.needed, size * 2)
    else:
        pytest.fail("never finished")
    assert len(h.tensors) == 272 and size <= 2 * h.header_bytes + 4096


def test_the_last_header_byte_is_needed(head: bytes) -> None:
    n = parse_header(head).header_bytes
    parse_header(head[:n])
    with pytest.raises(NeedMoreBytes):
        parse_header(head[: n - 1])


@pytest.mark.parametrize(
    "data",
    [
        b"PK\x03\x04" + bytes(100),  # a zip (safetensors, .bin downloads...)
        b'{"architectures": ["LlamaForCausalLM"]}' + b" " * 100,
        GGUF_MAGIC + struct.pack("<I", 1) + bytes(100),  # GGUF v1: unsupported
        GGUF_MAGIC + struct.pack("<IQQ", 3, 1 << 40, 0) + bytes(100),  # absurd counts
    ],
)
def test_non_gguf_buffers_are_value_errors(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_header(data)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError) as err:
        read_gguf_header(tmp_path / "nope.gguf")
    assert "not found" in err.value.message and "pull" in err.value.hint


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError) as err:
        read_gguf_header(tmp_path)
    assert "directory" in err.value.message


@pytest.mark.parametrize("content", [b"", b"hello", b"not a model at all, just some text\n" * 20])
def test_non_gguf_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelFileError) as err:
        read_gguf_header(path)
    assert "not a GGUF model file" in err.value.message and "convert" in err.value.hint


def _truncated_copy(src: Path, dst: Path, size: int) -> Path:
    with src.open("rb") as f, dst.open("wb") as out:
        out.write(f.read(size))
    return dst


@pytest.mark.parametrize("size", [30, 1000, 1_000_000])
def test_file_truncated_inside_the_header(tmp_path: Path, smollm2: Path, size: int) -> None:
    path = _truncated_copy(smollm2, tmp_path / "cut.gguf", size)
    with pytest.raises(ModelFileError) as err:
        read_gguf_header(path)
    assert "truncated" in err.value.message and "inside the GGUF header" in err.value.message
    assert "download" in err.value.hint


def test_file_truncated_inside_the_tensor_data(tmp_path: Path, smollm2: Path) -> None:
    full = smollm2.stat().st_size
    path = _truncated_copy(smollm2, tmp_path / "cut.gguf", full - 12345)
    with pytest.raises(ModelFileError) as err:
        read_gguf_header(path)
    assert "truncated" in err.value.message and f"{full:,}" in err.value.message
    h = read_gguf_header(path, check_size=False)  # the header itself is whole
    assert len(h.tensors) == 272


def test_a_whole_copy_reads(tmp_path: Path, smollm2: Path) -> None:
    path = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2, path)
    assert read_gguf_header(path).required_size() == path.stat().st_size
