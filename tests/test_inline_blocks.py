"""Format 1.6 inline blocks (SPEC.md §4 INLINE_BLOCKS, §7 INLINE_BLOCK): which blocks the writer inlines,
and that every reader, the writer's stats and ``describe()`` see the same file."""
from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest

import arcfmt
from arcfmt import layout as L
from arcfmt import records
from arcfmt.reader import DeltaReader
from arcfmt.writer import INLINE_MAX_BYTES
from support.data import assert_bit_exact, stream_decode, write_delta
from support.records import split


def _model():
    rng = np.random.default_rng(16)
    small_b = (rng.standard_normal((6, 10)) * 0.02).astype(ml_dtypes.bfloat16)
    small_t = small_b.copy()
    small_t.view(np.uint16).reshape(-1)[::7] += 1
    big = rng.standard_normal(40_000).astype(np.float32)   # a keyframe block of ~160 KB: too big to inline
    multi_b = rng.standard_normal(100_000).astype(np.float32)
    multi_t = multi_b.copy()
    multi_t.view(np.uint32)[::5] += 1
    base = {"small": small_b, "multi": multi_b}
    target = {"small": small_t, "big": big, "multi": multi_t, "empty": np.zeros((0, 2), np.float32)}
    return base, target


def _records(data: bytes) -> dict:
    """Per tensor name: (whether its TENS carries its block, its BLCK records)."""
    p = split(data)
    out: dict = {}
    for r in p.recs:
        if r.type == L.TENS:
            name = r.name
            out[name] = [r.encoding is not None, 0]
        elif r.type == L.BLCK:
            out[name][1] += 1
    return out


def test_writer_inlines_small_one_block_tensors_only():
    base, target = _model()
    data = write_delta(base, target, block_elems=50_000)
    head = records.check_header(data[:L.HEADER_SIZE])
    assert head.compact_index and head.inline_blocks and head.version == (L.MAJOR, L.MINOR)
    assert _records(data) == {"small": [True, 0], "big": [False, 1], "multi": [False, 2], "empty": [False, 0]}
    assert_bit_exact(DeltaReader(data).decode_all(base), target)
    assert_bit_exact(stream_decode(data, base), target)
    plain = write_delta(base, target, block_elems=50_000, inline_blocks=False)
    assert not records.check_header(plain[:L.HEADER_SIZE]).inline_blocks
    assert _records(plain)["small"] == [False, 1]
    assert len(plain) > len(data)
    assert_bit_exact(DeltaReader(plain).decode_all(base), target)
    full = write_delta(base, target, block_elems=50_000, compact_index=False)   # a 1.4 file: neither flag
    assert int.from_bytes(full[12:16], "little") == 0 and int.from_bytes(full[-20:-16], "little") == 0
    assert_bit_exact(stream_decode(full, base), target)


def test_inline_threshold_is_the_block_payload():
    """A one-block tensor is inlined exactly when its block's fields and streams take at most 64 KiB."""
    rng = np.random.default_rng(3)
    for n, inline in ((INLINE_MAX_BYTES // 4 - 64, True), (INLINE_MAX_BYTES // 4 + 64, False)):
        t = {"x": rng.integers(0, 2**32, n, dtype=np.uint32).view(np.float32)}   # incompressible: raw keyframe
        data = write_delta(None, t)
        assert _records(data)["x"] == [inline, 0 if inline else 1]
        assert_bit_exact(stream_decode(data), t)


def test_stats_and_describe_count_inline_blocks():
    base, target = _model()
    buf = io.BytesIO()
    with arcfmt.DeltaWriter(buf, block_elems=50_000, workers=1) as w:
        w.write_tensors((n, base.get(n), t) for n, t in target.items())
    data = buf.getvalue()
    r = DeltaReader(data)
    d = r.describe()
    assert d["inline_blocks"] is True
    by_name = {t["name"]: t for t in d["tensors"]}
    assert [b["inline"] for b in by_name["small"]["blocks"]] == [True]
    assert [b["inline"] for b in by_name["multi"]["blocks"]] == [False, False]
    for st in w.stats:
        t = by_name[st.name]
        assert st.size == t["bytes"], st.name   # TENS record (with its inline block) + BLCK records
        assert [b.size for b in st.blocks] == [b["record_bytes"] for b in t["blocks"]], st.name
    index_entry = r.entries["small"]
    assert [(b.size, b.offset) for b in index_entry.blocks] == [(0, index_entry.tens_offset)]


def test_random_access_reads_an_inline_block_again_after_use():
    """The reader holds an inline block read with its header only until it is first used."""
    base, target = _model()
    data = write_delta(base, target, block_elems=50_000)
    r = DeltaReader(data)
    for _ in range(2):
        assert_bit_exact({"small": r.decode("small", base)}, {"small": target["small"]})
        assert not r._inline
    lb = r.load_block("small", 0)
    assert lb.info.encoding == r.entries["small"].blocks[0].encoding


@pytest.mark.parametrize("flags", [L.INLINE_BLOCKS, L.INLINE_BLOCKS | 4])
def test_inline_blocks_needs_compact_index(flags):
    """§4: INLINE_BLOCKS without COMPACT_INDEX is `corrupt` (reserved bits are checked first)."""
    base, target = _model()
    data = bytearray(write_delta(base, target, block_elems=50_000))
    data[12:16] = flags.to_bytes(4, "little")
    expected = arcfmt.ReservedBitsError if flags & 4 else arcfmt.CorruptError
    with pytest.raises(expected):
        DeltaReader(bytes(data))
    with pytest.raises(expected):
        stream_decode(bytes(data), base)


def test_a_trailer_read_alone_refuses_inline_blocks_without_compact_index():
    """§11: no header agrees with INLINE_BLOCKS without COMPACT_INDEX; a reader of the tail alone (a
    follower, S9.3) has no header to compare with, so it refuses the trailer itself."""
    t = records.build_trailer(52, 30, L.INLINE_BLOCKS)
    size = 52 + 30 + L.TRAILER_SIZE
    assert records.check_trailer(t, size).flags == L.INLINE_BLOCKS   # the header comparison refuses it later
    with pytest.raises(arcfmt.CorruptError):
        records.check_trailer(t, size, alone=True)


@pytest.mark.parametrize("b", [1, -1, 7, "0", 0.0])
def test_load_block_refuses_a_block_the_tensor_does_not_have(b):
    """A caller's block number out of range (or not an integer) is the caller's error, also for a tensor
    whose only block is inline; numpy integers are integers."""
    base, target = _model()
    r = DeltaReader(write_delta(base, target, block_elems=50_000))
    with pytest.raises(arcfmt.InputError):
        r.load_block("small", b)
    assert r.load_block("small", np.int64(0)).info.encoding == r.load_block("small", 0).info.encoding
    with pytest.raises(arcfmt.InputError):
        r.load_block("multi", 2)
    assert r.load_block("multi", np.int32(1)).payload
