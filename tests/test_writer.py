"""Writer rules of SPEC.md Appendix A that vectors cannot check: one pass, canonical deltas, limits."""
from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest

import arcfmt
from arcfmt import layout as L


class AppendOnly(io.RawIOBase):
    """A sink that refuses seek and tell: what a pipe or an object-store upload offers."""

    def __init__(self):
        self.data = bytearray()

    def writable(self):
        return True

    def write(self, b):
        self.data += bytes(b)
        return len(b)

    def seek(self, *a):
        raise AssertionError("the writer seeked")

    def tell(self):
        raise AssertionError("the writer asked for its position")


def test_writer_never_seeks():  # R-ONE-PASS
    rng = np.random.default_rng(0)
    base = {"w": rng.standard_normal((300, 50)).astype(ml_dtypes.bfloat16)}
    target = {"w": (base["w"].astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16)}
    sink = AppendOnly()
    with arcfmt.DeltaWriter(sink, block_elems=1000, note="one pass") as w:
        w.write_tensors((k, base[k], target[k]) for k in target)
    out = arcfmt.decode(base, bytes(sink.data))
    assert out["w"].tobytes() == target["w"].tobytes()


def test_delta_is_canonical():  # R-CANONICAL-DELTA: exactly the changed elements, exactly the non-kept
    rng = np.random.default_rng(1)
    b = rng.integers(0, 1 << 16, 5000, dtype=np.uint16)
    t = b.copy()
    idx = rng.choice(5000, 400, replace=False)
    t[idx[:300]] ^= 1          # kept: mantissa only
    t[idx[300:]] ^= 0x8000     # exceptions: sign
    base, target = {"x": b.view(ml_dtypes.bfloat16)}, {"x": t.view(ml_dtypes.bfloat16)}
    buf = io.BytesIO()
    with arcfmt.DeltaWriter(buf, effort="fast", force_encoding="bf16-delta") as w:
        w.write_tensors([("x", base["x"], target["x"])])
    info = arcfmt.DeltaReader(buf.getvalue()).describe()["tensors"][0]
    assert info["changed"] == 400
    blk = info["blocks"][0]
    assert blk["encoding"] == "bf16-delta"
    # decoded stream lengths follow from c and e: steps for 300 kept, values for 100 exceptions
    assert blk["streams"][1]["decoded"] == 300 and blk["streams"][3]["decoded"] == 200
    # the same input always gives the same bytes
    assert arcfmt.encode(base, target, effort="fast") == arcfmt.encode(base, target, effort="fast")


def test_writer_respects_limits():  # R-WRITER-LIMITS
    with pytest.raises(arcfmt.InputError):
        arcfmt.DeltaWriter(io.BytesIO(), block_elems=L.MAX_BLOCK_ELEMS + 1)
    with pytest.raises(arcfmt.ArcError):
        arcfmt.encode(None, {"n" * (L.MAX_NAME_BYTES + 1): np.zeros(2, np.float32)})
    with pytest.raises(arcfmt.ArcError):
        arcfmt.encode(None, {"bad\nname": np.zeros(2, np.float32)})


@pytest.mark.parametrize("kw", [dict(effort=None), dict(effort=3), dict(effort=((9, 1),)), dict(note=b"bytes"),
                                dict(note="\ud800")])
def test_bad_arguments_are_refused_before_anything_is_written(kw):
    """Found by review: these passed the constructor and failed later with TypeError, KeyError or
    UnicodeEncodeError, after the header was written."""
    buf = io.BytesIO()
    with pytest.raises(arcfmt.InputError):
        arcfmt.DeltaWriter(buf, **kw)
    assert buf.getvalue() == b""


def test_writer_respects_the_file_wide_limits(monkeypatch):  # R-WRITER-LIMITS, §14 (found by review)
    """Tensors, blocks and ancillary records per file, and the index's body: refused (InputError) where a
    reader would refuse the file (lowered here: the real ones take a million tensors to reach)."""
    z = np.zeros(3, np.float32)
    monkeypatch.setattr(L, "MAX_TENSORS", 2)
    w = arcfmt.DeltaWriter(io.BytesIO(), workers=1)
    w.write_tensors([("a", None, z), ("b", None, z)])
    with pytest.raises(arcfmt.InputError, match="MAX_TENSORS"):
        w.write_tensor("c", z)
    w.close()   # the two it took make a whole file
    monkeypatch.setattr(L, "MAX_BLOCKS", 4)
    w = arcfmt.DeltaWriter(io.BytesIO(), workers=1, block_elems=1)
    with pytest.raises(arcfmt.InputError, match="MAX_BLOCKS"):
        w.write_tensor("a", np.zeros(5, np.float32))
    monkeypatch.setattr(L, "MAX_OTHER_RECORDS", 1)
    w = arcfmt.DeltaWriter(io.BytesIO(), workers=1, note="one")
    with pytest.raises(arcfmt.InputError, match="MAX_OTHER_RECORDS"):
        w.write_record(b"note", b"two")
    monkeypatch.undo()
    monkeypatch.setattr(L, "MAX_INDEX_BYTES", 200)
    buf = io.BytesIO()
    w = arcfmt.DeltaWriter(buf, workers=1)
    w.write_tensors((f"{i:04d}" + "x" * 60, None, z) for i in range(4))
    with pytest.raises(arcfmt.InputError, match="MAX_INDEX_BYTES"):
        w.close()
    with pytest.raises(arcfmt.InputError, match="MAX_INDEX_BYTES"):
        w.close()   # still refused: no index is ever written


def test_a_call_that_fails_part_way_leaves_no_file_to_finish(monkeypatch):
    """Found by review: a write_tensors call that raised after some of its blocks were written left a
    TENS record whose blocks the index would list short; close() wrote that file. Now close() refuses;
    a call that raised having written nothing leaves the writer as it was (its names free again)."""
    import arcfmt.writer as W

    monkeypatch.setattr(W, "BATCH_BYTES", 0)   # write every 4 blocks, as for memory-mapped inputs
    base = np.zeros(70, np.float32)
    target = base.copy()
    target[60] = 1.0   # block 8 of 10 changed: the forced "unchanged" refuses it
    buf = io.BytesIO()
    w = arcfmt.DeltaWriter(buf, workers=1, block_elems=7, force_encoding="unchanged")
    with pytest.raises(arcfmt.InputError):
        w.write_tensor("w", target, base)
    for attempt in (w.close, lambda: w.write_tensor("v", base, base), lambda: w.write_record(b"note", b"")):
        with pytest.raises(arcfmt.InputError, match="cannot be finished"):
            attempt()
    # nothing written yet when it raised: the writer goes on, and the name can be written after all
    buf = io.BytesIO()
    w = arcfmt.DeltaWriter(buf, workers=1)
    with pytest.raises(arcfmt.InputError, match="complex64"):
        w.write_tensors([("a", None, base), ("b", None, np.zeros(2, np.complex64))])
    w.write_tensors([("a", None, base), ("b", None, base)])
    w.close()
    assert arcfmt.decode(None, buf.getvalue()).keys() == {"a", "b"}
