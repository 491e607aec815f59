"""The safetensors header frame (u64 little-endian length, then the JSON header) is read and written by
one function pair in arcfmt/safetensors_io.py, used by write_file, read_file and the checkpoint writer."""
from __future__ import annotations

import io

import numpy as np
import pytest

from arcfmt import dtypes
from arcfmt import safetensors_io as S
from arcfmt.checkpoint_writer import ShardLayout
from arcfmt.errors import SafetensorsError


def test_frame_round_trip():
    header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    framed = S.frame_header(header)
    assert framed == len(header).to_bytes(8, "little") + header
    assert S.HEADER_LENGTH_SIZE == 8 and S.data_start(header) == len(framed)
    f = io.BytesIO(framed + bytes(8))
    assert S.read_header(f, len(framed) + 8, "x") == header and f.tell() == S.data_start(header)


def test_write_file_and_read_file_agree(tmp_path):
    path = str(tmp_path / "m.safetensors")
    arrays = {"b": np.arange(3, dtype=np.float32), "a": np.ones((2, 2), np.uint8)}
    S.write_file(path, arrays, {"k": "v"})
    with open(path, "rb") as fh:
        data = fh.read()
    items = [(n, dtypes.from_name({"float32": "F32", "uint8": "U8"}[str(a.dtype)]), a.shape) for n, a in arrays.items()]
    header = S.build_header(S.layout_specs(items), {"k": "v"})
    assert data.startswith(S.frame_header(header))
    f = S.read_file(path)
    assert f.header_bytes == header and f.data_start == S.data_start(header) == len(S.frame_header(header))
    assert np.array_equal(f.array(f.tensors[0]), arrays["b"])


def test_shard_layout_uses_the_frame():
    lay = ShardLayout(None, [("w", dtypes.from_name("BF16"), (4,))], None)
    assert lay.data_start == S.data_start(lay.header) == len(S.frame_header(lay.header))
    assert lay.size == lay.data_start + 8


@pytest.mark.parametrize("data, size, message", [
    (b"\x01\x00\x00", 3, "shorter than the 8-byte header length"),
    ((100).to_bytes(8, "little") + b"{}", 10, "beyond the file"),
    ((S.MAX_HEADER_BYTES + 1).to_bytes(8, "little"), 1 << 40, "limit"),
    ((10).to_bytes(8, "little") + b"{}", 18, "ends inside its 10-byte header"),  # the file shrank under us
])
def test_read_header_refuses(data, size, message):
    with pytest.raises(SafetensorsError, match=message):
        S.read_header(io.BytesIO(data), size, "x")
