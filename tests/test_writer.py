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
